"""Make a large Kineto (PyTorch profiler) JSON trace from a real one, and time loading it (on demand).

    python bench/kineto_scale.py SRC.json[.gz] --kernels 1000000 -o /tmp/traceq-bench/k1m.json
    python bench/kineto_scale.py --measure /tmp/traceq-bench/k1m.json

Making: OUT has SRC's keys and SRC's events repeated, copy k shifted by k x (SRC's span + 1 us)
with correlation ids, External ids and flow ids offset by k x (their max + 1), until N kernels
(the last copy cut after its N-th kernel). Events are written as they are read: the copy is a
text substitution of ts and ids per event, so memory stays flat.

    python bench/kineto_scale.py --measure FILE --hta /tmp/hta-venv/bin/python --before OLD/.venv/bin/python

Measuring, each in its own process, interleaved, `--reps` times: `traceq load` into a new store,
the same with another checkout's Python (`--before`), Python's `json.load` of the file, the
floor of issue 38 where msgspec is installed (`_MSGSPEC`: a typed parse, args kept raw), and
HolisticTraceAnalysis' loader (`TraceAnalysis(trace_dir=...)`, its default parser, with
`--hta`: a Python of a scratch virtualenv where it is installed, never a traceq dependency).
Each run's wall time, CPU seconds (user + system) and peak RSS come from `wait4`; the medians
are printed with each CPU time as a multiple of traceq's. On a shared machine compare CPU
seconds: wall time depends on what else runs.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path


def make(src: Path, kernels: int, out: Path) -> None:
    opener = gzip.open if src.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(src, "rb") as f:
        trace = json.load(f, parse_float=Decimal)
    events = trace.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, Decimal))]
    start = min(Decimal(e["ts"]) for e in timed)
    end = max(Decimal(e["ts"]) + Decimal(e.get("dur", 0)) for e in timed)
    span = end - start + 1
    ids = [e.get("args", {}).get(k) for e in events for k in ("correlation", "External id")] + [e.get("id") for e in events]
    step = max(int(i) for i in ids if isinstance(i, int)) + 1
    per_copy = sum(str(e.get("cat", "")).lower() == "kernel" for e in events)
    copies = -(-kernels // per_copy)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with out.open("w") as f:
        head = json.dumps({k: v for k, v in trace.items()}, default=str)[:-1]
        f.write(head + (", " if len(head) > 1 else "") + '"traceEvents": [\n')
        first = True
        for k in range(copies):
            for e in events:
                if str(e.get("cat", "")).lower() == "kernel":
                    if written == kernels:
                        continue
                    written += 1
                e2 = dict(e)
                if isinstance(e.get("ts"), (int, Decimal)):
                    e2["ts"] = Decimal(e["ts"]) + k * span
                if isinstance(e.get("id"), int):
                    e2["id"] = e["id"] + k * step
                if isinstance(e.get("args"), dict):
                    e2["args"] = dict(e["args"])
                    for key in ("correlation", "External id"):
                        if isinstance(e2["args"].get(key), int):
                            e2["args"][key] += k * step
                f.write(("" if first else ",\n") + "  " + json.dumps(e2, default=_number))
                first = False
        f.write("\n]}\n")
    print(f"wrote {out}: {written:,} kernels, {out.stat().st_size / 1e9:.2f} GB")


def _number(value: object) -> object:
    if isinstance(value, Decimal):
        return float(value) if value != value.to_integral() else int(value)
    raise TypeError(type(value))


def child(argv: list[str]) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MiB) of a command run in a new process."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv)
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(f"{argv[:3]} failed ({status})")
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


_HTA = """
import shutil, sys, tempfile
from pathlib import Path
from hta.trace_analysis import TraceAnalysis
folder = Path(tempfile.mkdtemp())
(folder / ("rank0" + ''.join(Path(sys.argv[1]).suffixes))).symlink_to(Path(sys.argv[1]).resolve())
try:
    TraceAnalysis(trace_dir=str(folder))
finally:
    shutil.rmtree(folder)
"""


_MSGSPEC = """
import sys
from pathlib import Path
import msgspec
from traceq.ingest.json_events import TraceEvents
class Event(msgspec.Struct):
    ph: msgspec.Raw = msgspec.Raw(); cat: msgspec.Raw = msgspec.Raw(); name: msgspec.Raw = msgspec.Raw()
    pid: msgspec.Raw = msgspec.Raw(); tid: msgspec.Raw = msgspec.Raw(); ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw(); args: msgspec.Raw = msgspec.Raw()
decode = msgspec.json.Decoder(list[Event]).decode
for batch in TraceEvents(Path(sys.argv[1])):
    for chunk in batch.chunks:
        decode(b"[" + b"".join(chunk) + b"]")
"""
"""The reference floor of issue 38: a typed streaming parse of the same bytes, each event's keys
as raw JSON text (`msgspec.Raw`, `args` too), the file cut into chunks as the reader cuts it.
Runs where msgspec is installed (bench only, not a traceq dependency)."""


def measure(path: Path, reps: int, before: str | None, hta: str | None, plain: bool) -> None:
    """Each loader `reps` times, interleaved, each in its own process; the medians."""
    store = Path(tempfile.mkdtemp(prefix="traceq-bench-")) / "store.duckdb"
    load = ("import sys; from pathlib import Path; from traceq.api.loading import load_trace; "
            "from traceq.store import open_store; Path(sys.argv[2]).unlink(missing_ok=True); "
            "load_trace(open_store(Path(sys.argv[2]), create=True), Path(sys.argv[1]))")
    runs = {"traceq load": [sys.executable, "-c", load, str(path), str(store)]}
    if before:
        runs["traceq load (before)"] = [before, "-c", load, str(path), str(store)]
    if plain:
        runs["json.load"] = [sys.executable, "-c", ("import gzip, json, sys; "
                             "op = gzip.open if open(sys.argv[1], 'rb').read(2) == b'\\x1f\\x8b' else open; "
                             "json.load(op(sys.argv[1], 'rb'))"), str(path)]
    if importlib.util.find_spec("msgspec") is not None:
        runs["msgspec parse (floor)"] = [sys.executable, "-c", _MSGSPEC, str(path)]
    if hta:
        runs["HTA TraceAnalysis"] = [hta, "-c", _HTA, str(path)]
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runs}
    for _ in range(reps):
        for name, argv in runs.items():
            results[name].append(child(argv))
            print(f"  {name}: {results[name][-1][0]:.1f} s, {results[name][-1][1]:.1f} CPU s, "
                  f"{results[name][-1][2]:.0f} MiB", flush=True)
    store.unlink(missing_ok=True)
    print(f"{path} ({path.stat().st_size / 1e9:.2f} GB), medians of {reps}:")
    mine = statistics.median(r[1] for r in results["traceq load"])
    for name, rows in results.items():
        wall, cpu, rss = (statistics.median(r[i] for r in rows) for i in range(3))
        print(f"{name:22s} {wall:7.1f} s {cpu:7.1f} CPU s (x{cpu / mine:.2f} traceq's) peak RSS {rss:6.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", type=Path)
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("-o", "--output", type=Path, default=Path("/tmp/traceq-bench/kineto.json"))
    parser.add_argument("--measure", type=Path)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--before", help="a Python whose traceq is the version to compare with")
    parser.add_argument("--hta", help="a Python with HolisticTraceAnalysis installed (pip install HolisticTraceAnalysis)")
    parser.add_argument("--no-json", action="store_true", help="skip json.load (it needs about 5 x the file in RAM)")
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.reps, args.before, args.hta, not args.no_json)
    else:
        make(args.src, args.kernels, args.output)


if __name__ == "__main__":
    main()
