"""Make a large Kineto (PyTorch profiler) JSON trace from a real one, and time loading it (on demand).

    python bench/kineto_scale.py SRC.json[.gz] --kernels 1000000 -o /tmp/traceq-bench/k1m.json
    python bench/kineto_scale.py --measure /tmp/traceq-bench/k1m.json

Making: OUT has SRC's keys and SRC's events repeated, copy k shifted by k x (SRC's span + 1 us)
with correlation ids, External ids and flow ids offset by k x (their max + 1), until N kernels
(the last copy cut after its N-th kernel). Events are written as they are read: the copy is a
text substitution of ts and ids per event, so memory stays flat.

Measuring, each in its own process, one after the other: `traceq load` into a new store, and
Python's `json.load` of the file, with wall time and peak RSS (ru_maxrss of the child).
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import subprocess
import sys
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


def child(code: str) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of `python -c code` in a new process."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    seconds = time.perf_counter() - started
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def measure(path: Path) -> None:
    store = path.with_suffix(".duckdb")
    store.unlink(missing_ok=True)
    load = child(f"from pathlib import Path; from traceq.ingest import load_trace; from traceq.store import open_store; "
                 f"load_trace(open_store(Path('{store}'), create=True), Path('{path}'))")
    print(f"traceq load: {load[0]:.1f} s, peak RSS {load[1]:.0f} MiB")
    plain = child(f"import json; json.load(open('{path}'))")
    print(f"json.load:   {plain[0]:.1f} s, peak RSS so far {plain[1]:.0f} MiB (the larger of the two children)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", type=Path)
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("-o", "--output", type=Path, default=Path("/tmp/traceq-bench/kineto.json"))
    parser.add_argument("--measure", type=Path)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
    else:
        make(args.src, args.kernels, args.output)


if __name__ == "__main__":
    main()
