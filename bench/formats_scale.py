"""Grow the real samples of the AMD and XPlane formats to a given size, and time loading them beside
the nsys SQLite reader (run on demand, not a test; issue 35 requirement 2).

    python bench/formats_scale.py make --mb 100 -o /tmp/traceq-bench/formats
    python bench/formats_scale.py measure /tmp/traceq-bench/formats --reps 3

Making, from `../shared/realtraces` (each file's records repeated, copy k with every time shifted
by k x (the source's span + 1 us) and its ids offset by k x (their max + 1), so launches still
pair with their kernels; the copies for about `--mb` MB from the sizes of 1 and a few copies):
- rocprofv3 JSON (`rocpd/...908_results.json.gz`): `buffer_records.kernel_dispatch` repeated
  (timestamps, correlation and dispatch ids), the rest of the tool's entry as it is; plain JSON.
- RPD (`rocpd/...matmul_result.rpd`): `rocpd_op` and `rocpd_api` rows (ids, start, end), their
  links `rocpd_api_ops`, `rocpd_kernelapi` and `rocpd_copyapi`, by INSERT ... SELECT in SQLite.
- rocprof v1 database and CSV (`rocpd/...finite-difference__results.db|csv`): `KERN`'s rows
  (the four times, `Index`).
- XPlane (`xplane/...jax_conv_minimal_08...`, 8 GPUs): every line's events (offset_ps; the
  `correlation_id` stats), re-encoded with `ingest/protobuf.py`'s reader and a varint writer.
- Perfetto (`.pftrace`): the rocprofv3 JSON grown as above, written in rocprofv3's Perfetto
  layout by `tools/make_pftrace.py` with a made-up launching call per kernel (`--synthetic-api`:
  four packets a kernel, as a trace with its HIP calls has).
- nsys SQLite, made while measuring (`bench/scale.py`): the alexnet reference with as many kernels
  as each file above, for the same-run comparison per kernel.

Measuring: `load_trace` of each file into a new store, each in its own process, the formats
interleaved, `--reps` times (the first load of each file, made to count its kernels, is its
first round): wall, CPU seconds (user + system) and peak RSS (`ru_maxrss`) of the
child from `wait4`, kernels per CPU second, and that rate as a multiple of the nsys reader's on
its file of the same kernel count. Medians. On a shared machine compare CPU seconds.
`--against DIR` loads each file with the traceq in DIR/traceq too, in the same rounds (the code
before a change; DIR/traceq a link to its checkout).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared"
SOURCES = {
    "rocprofv3.json": SHARED / "realtraces/rocpd/AMD-AGI__TraceLens__rocprof__908_results.json.gz",
    "rpd.rpd": SHARED / "realtraces/rocpd/ROCm__rocmProfileData__matmul_result.rpd",
    "rocprof1.db": SHARED / "realtraces/rocpd/amd__HPCTrainingExamples__finite-difference__results.db",
    "rocprof1.csv": SHARED / "realtraces/rocpd/amd__HPCTrainingExamples__finite-difference__results.csv",
    "xplane.xplane.pb": SHARED / "realtraces/xplane/AMD-AGI__TraceLens__mi300__jax_conv_minimal_08__tw003.xplane.pb",
    "perfetto.pftrace": SHARED / "realtraces/rocpd/AMD-AGI__TraceLens__rocprof__908_results.json.gz",
}
NSYS_SOURCE = SHARED / "reference/alexnet_b256_nocudnn.sqlite"


# ----------------------------------------------------------------------------------------------
# rocprofv3 JSON


def make_rocprofv3(src: Path, out: Path, copies: int) -> None:
    tool = json.loads(gzip.decompress(src.read_bytes()))["rocprofiler-sdk-tool"][0]
    dispatches = tool["buffer_records"]["kernel_dispatch"]
    times = [t for r in dispatches for t in (r["start_timestamp"], r["end_timestamp"])]
    span = max(times) - min(times) + 1000
    step = max(max(r["correlation_id"]["internal"], r["dispatch_info"]["dispatch_id"]) for r in dispatches) + 1
    rest = {k: v for k, v in tool.items() if k != "buffer_records"}
    with out.open("w") as f:
        f.write('{"rocprofiler-sdk-tool":[{')
        for key, value in rest.items():
            f.write(json.dumps(key) + ":" + json.dumps(value, separators=(",", ":")) + ",")
        f.write('"buffer_records":{"kernel_dispatch":[')
        first = True
        for k in range(copies):
            for r in dispatches:
                r2 = dict(r, start_timestamp=r["start_timestamp"] + k * span, end_timestamp=r["end_timestamp"] + k * span,
                          correlation_id=dict(r["correlation_id"], internal=r["correlation_id"]["internal"] + k * step),
                          dispatch_info=dict(r["dispatch_info"], dispatch_id=r["dispatch_info"]["dispatch_id"] + k * step))
                f.write(("" if first else ",") + json.dumps(r2, separators=(",", ":")))
                first = False
        others = [k for k in tool["buffer_records"] if k != "kernel_dispatch"]
        f.write("]" + "".join(f',"{k}":[]' for k in others) + "}}]}\n")


# ----------------------------------------------------------------------------------------------
# SQLite: RPD and rocprof v1's KERN


def _copy_sqlite(src: Path, out: Path) -> sqlite3.Connection:
    shutil.copyfile(src, out)
    out.chmod(0o644)
    con = sqlite3.connect(str(out), isolation_level=None)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    return con


def _replicate(con: sqlite3.Connection, table: str, copies: int, shifts: dict[str, str]) -> None:
    """Copies 1..copies-1 of `table`'s rows, each column in `shifts` given an expression of k."""
    cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
    exprs = ", ".join(shifts.get(c, f'"{c}"') for c in cols)
    names = ", ".join(f'"{c}"' for c in cols)
    con.execute(f"""INSERT INTO "{table}" ({names})
        WITH RECURSIVE c(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM c WHERE k < {copies - 1}),
        t AS MATERIALIZED (SELECT * FROM "{table}")
        SELECT {exprs} FROM c CROSS JOIN t ORDER BY c.k""")


def make_rpd(src: Path, out: Path, copies: int) -> None:
    con = _copy_sqlite(src, out)
    lo, hi = con.execute('SELECT min(start), max("end") FROM (SELECT start, "end" FROM rocpd_op '
                         'UNION ALL SELECT start, "end" FROM rocpd_api)').fetchone()
    span = hi - lo + 1000
    ops, apis, links = (con.execute(f"SELECT max(id) + 1 FROM {t}").fetchone()[0]
                        for t in ("rocpd_op", "rocpd_api", "rocpd_api_ops"))
    con.execute("BEGIN")
    time_shift = {"start": f"start + c.k * {span}", "end": f'"end" + c.k * {span}'}
    _replicate(con, "rocpd_op", copies, {"id": f"id + c.k * {ops}", **time_shift})
    _replicate(con, "rocpd_api", copies, {"id": f"id + c.k * {apis}", **time_shift})
    _replicate(con, "rocpd_api_ops", copies, {"id": f"id + c.k * {links}", "api_id": f"api_id + c.k * {apis}",
                                              "op_id": f"op_id + c.k * {ops}"})
    for table in ("rocpd_kernelapi", "rocpd_copyapi"):
        _replicate(con, table, copies, {"api_ptr_id": f"api_ptr_id + c.k * {apis}"})
    con.execute("COMMIT")
    con.close()


_KERN_TIMES = ("DispatchNs", "BeginNs", "EndNs", "CompleteNs")


def make_rocprof_db(src: Path, out: Path, copies: int) -> None:
    con = _copy_sqlite(src, out)
    lo, hi, n = con.execute('SELECT min(DispatchNs), max(CompleteNs), max("Index") + 1 FROM KERN').fetchone()
    span = hi - lo + 1000
    con.execute("BEGIN")
    _replicate(con, "KERN", copies, {"Index": f'"Index" + c.k * {n}',
                                     **{c: f'"{c}" + c.k * {span}' for c in _KERN_TIMES}})
    con.execute("COMMIT")
    con.close()


def make_rocprof_csv(src: Path, out: Path, copies: int) -> None:
    rows = list(csv.DictReader(io.StringIO(src.read_text())))
    span = max(int(r["CompleteNs"]) for r in rows) - min(int(r["DispatchNs"]) for r in rows) + 1000
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), quoting=csv.QUOTE_NONNUMERIC)
        writer.writeheader()
        for k in range(copies):
            for r in rows:
                writer.writerow({c: (int(v) + k * span if c in _KERN_TIMES else int(v) + k * len(rows) if c == "Index"
                                     else int(v) if v.lstrip("-").isdigit() else v) for c, v in r.items()})


# ----------------------------------------------------------------------------------------------
# XPlane


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    key = _varint(number << 3 | wire)
    return key + (_varint(len(payload)) + payload if wire == 2 else payload)


def make_xplane(src: Path, out: Path, copies: int) -> None:
    from traceq.ingest import protobuf as pb

    buf = src.read_bytes()
    lines, step = [], 1  # every line: (timestamp_ns, [(offset_ps, duration_ps)])
    for number, wire, value in pb.fields(buf):
        if number != 1 or wire != 2:
            continue
        correlation = _correlation_stat(buf, value)
        for n2, w2, line in pb.fields(buf, *value):
            if n2 == 3 and w2 == 2:
                stamp, events = 0, []
                for n3, w3, v3 in pb.fields(buf, *line):
                    if n3 == 3 and w3 == 0:
                        stamp = pb.signed(v3)
                    elif n3 == 4 and w3 == 2:
                        offset, duration, ids = _event_times(buf, v3, correlation)
                        events.append((offset, duration))
                        step = max([step, *(i + 1 for i in ids)])
                if events:
                    lines.append((stamp, events))
    low = min(s * 1000 + min(o for o, _ in e) for s, e in lines)
    high = max(s * 1000 + max(o + d for o, d in e) for s, e in lines)
    span_ps = (high - low) // 1000 * 1000 + 1_000_000
    with out.open("wb") as f:
        for number, wire, value in pb.fields(buf):
            if number == 1 and wire == 2:
                f.write(_field(1, 2, _plane(buf, value, copies, span_ps, step)))
            else:
                f.write(_raw_field(buf, number, wire, value))


def _raw_field(buf: bytes, number: int, wire: int, value: object) -> bytes:
    if wire == 2:
        start, end = value  # type: ignore[misc]
        return _field(number, 2, buf[start:end])
    return _field(number, wire, _varint(value) if wire == 0 else value)  # type: ignore[arg-type]


def _correlation_stat(buf: bytes, plane: tuple[int, int]) -> int | None:
    from traceq.ingest import protobuf as pb

    for number, wire, value in pb.fields(buf, *plane):
        if number == 5 and wire == 2:
            key, name = None, None
            for n2, w2, v2 in pb.fields(buf, *value):  # type: ignore[misc]
                if n2 == 1 and w2 == 0:
                    key = v2
                elif n2 == 2 and w2 == 2:
                    for n3, w3, v3 in pb.fields(buf, *v2):  # type: ignore[misc]
                        if n3 == 2 and w3 == 2:
                            name = pb.text(buf, v3)
            if name == "correlation_id":
                return key  # type: ignore[return-value]
    return None


def _event_times(buf: bytes, event: tuple[int, int], correlation: int | None) -> tuple[int, int, list[int]]:
    from traceq.ingest import protobuf as pb

    offset = duration = 0
    ids = []
    for number, wire, value in pb.fields(buf, *event):
        if number == 2 and wire == 0:
            offset = pb.signed(value)  # type: ignore[arg-type]
        elif number == 3 and wire == 0:
            duration = pb.signed(value)  # type: ignore[arg-type]
        elif number == 4 and wire == 2 and correlation is not None:
            fields = list(pb.fields(buf, *value))  # type: ignore[misc]
            if any(n == 1 and v == correlation for n, _, v in fields):
                ids += [v for n, w, v in fields if n in (3, 4) and w == 0]  # type: ignore[misc]
    return offset, duration, ids


def _plane(buf: bytes, plane: tuple[int, int], copies: int, span_ps: int, step: int) -> bytes:
    from traceq.ingest import protobuf as pb

    correlation = _correlation_stat(buf, plane)
    parts = []
    for number, wire, value in pb.fields(buf, *plane):
        if number == 3 and wire == 2:
            parts.append(_field(3, 2, _line(buf, value, copies, span_ps, step, correlation)))  # type: ignore[arg-type]
        else:
            parts.append(_raw_field(buf, number, wire, value))
    return b"".join(parts)


def _line(buf: bytes, line: tuple[int, int], copies: int, span_ps: int, step: int, correlation: int | None) -> bytes:
    from traceq.ingest import protobuf as pb

    head, events = [], []
    for number, wire, value in pb.fields(buf, *line):
        if number == 4 and wire == 2:
            events.append(_template(buf, value, correlation))  # type: ignore[arg-type]
        else:
            head.append(_raw_field(buf, number, wire, value))
    body = [_field(4, 2, b"".join(p if isinstance(p, bytes) else _shifted(p, k, span_ps, step) for p in t))
            for k in range(copies) for t in events]
    return b"".join(head) + b"".join(body)


def _template(buf: bytes, event: tuple[int, int], correlation: int | None) -> list[object]:
    """An event's fields as bytes, with ('offset', ps) and ('stat', metadata id, wire, value) where a copy changes them."""
    from traceq.ingest import protobuf as pb

    parts: list[object] = []
    has_offset = False
    for number, wire, value in pb.fields(buf, *event):
        if number == 2 and wire == 0:
            parts.append(("offset", pb.signed(value)))  # type: ignore[arg-type]
            has_offset = True
        elif number == 4 and wire == 2 and correlation is not None:
            fields = list(pb.fields(buf, *value))  # type: ignore[misc]
            if any(n == 1 and v == correlation for n, _, v in fields):
                parts.append(("stat", [(n, w, v if w != 2 else buf[v[0]:v[1]]) for n, w, v in fields]))
            else:
                parts.append(_raw_field(buf, number, wire, value))
        else:
            parts.append(_raw_field(buf, number, wire, value))
    if not has_offset:
        parts.append(("offset", 0))
    return parts


def _shifted(part: tuple, k: int, span_ps: int, step: int) -> bytes:  # type: ignore[type-arg]
    if part[0] == "offset":
        return _field(2, 0, _varint(part[1] + k * span_ps))
    payload = b"".join(_field(n, w, _varint(v + k * step if n in (3, 4) else v)) if w == 0 else
                       _field(n, w, v) for n, w, v in part[1])
    return _field(4, 2, payload)


# ----------------------------------------------------------------------------------------------
# Perfetto


def make_pftrace(src: Path, out: Path, copies: int) -> None:
    sys.path.insert(0, str(HERE.parent / "tools"))
    import make_pftrace as maker  # tools/make_pftrace.py (needs the perfetto package)

    grown = out.with_suffix(".json")
    make_rocprofv3(src, grown, copies)
    try:
        maker.build(grown, out, synthetic_api=True)
    finally:
        grown.unlink()


# ----------------------------------------------------------------------------------------------
# making and measuring

MAKERS = {"rocprofv3.json": make_rocprofv3, "rpd.rpd": make_rpd, "rocprof1.db": make_rocprof_db,
          "rocprof1.csv": make_rocprof_csv, "xplane.xplane.pb": make_xplane, "perfetto.pftrace": make_pftrace}

_LOAD = ("import sys; from pathlib import Path; from traceq.api.loading import load_trace; "
         "from traceq.store import open_store; Path(sys.argv[2]).unlink(missing_ok=True); "
         "print(load_trace(open_store(Path(sys.argv[2]), create=True), Path(sys.argv[1])).kernel_count)")


def make(folder: Path, mb: float, only: list[str] | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, maker in MAKERS.items():
        if only and name not in only:
            continue
        out = folder / name
        started = time.perf_counter()
        maker(SOURCES[name], out, 1)
        one = out.stat().st_size
        few = 3 if name.endswith((".json", ".pftrace")) else 11  # SQLite files grow by pages: a few more copies
        maker(SOURCES[name], out, few)
        per_copy = (out.stat().st_size - one) / (few - 1)
        maker(SOURCES[name], out, max(1, round((mb * 1e6 - one) / per_copy) + 1))
        print(f"wrote {out} ({out.stat().st_size / 1e6:,.0f} MB) in {time.perf_counter() - started:.1f} s", flush=True)


def child(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds, peak RSS in MiB, kernels loaded) of a load in a new process."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    out = proc.stdout.read() if proc.stdout else b""
    if status:
        raise SystemExit(f"{argv[3:]} failed ({status})")
    return (time.perf_counter() - started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
            int(out.split()[-1]))


def _first_load(path: Path) -> tuple[float, float, float, int]:
    """A load of the file in a new process: its kernel count makes the nsys file of the same count,
    and its figures count as the file's first round."""
    store = Path(tempfile.mkdtemp(prefix="traceq-bench-")) / "store.duckdb"
    try:
        return child([sys.executable, "-c", _LOAD, str(path), str(store)])
    finally:
        shutil.rmtree(store.parent)


def measure(folder: Path, reps: int, only: list[str] | None, against: Path | None = None) -> None:
    """`against`: a folder holding another traceq as `traceq/` (a checkout of main, say): each
    file is loaded by it too, in the same rounds, its rate shown as a multiple of this one's."""
    sys.path.insert(0, str(HERE))
    from scale import scale  # bench/scale.py

    files = [folder / n for n in MAKERS if (folder / n).exists() and (not only or n in only)]
    runs: dict[str, list[str]] = {}
    envs: dict[str, dict[str, str]] = {}
    store = Path(tempfile.mkdtemp(prefix="traceq-bench-")) / "store.duckdb"
    first: dict[str, tuple[float, float, float, int]] = {}
    for path in files:
        first[path.name] = _first_load(path)
        n = first[path.name][3]
        nsys = folder / f"nsys_{n}.sqlite"
        if not nsys.exists():
            scale(NSYS_SOURCE, nsys, kernels=max(n, 37_284))
        runs[path.name] = [sys.executable, "-c", _LOAD, str(path), str(store)]
        if against is not None:
            runs[f"{path.name} (against)"] = runs[path.name]
            envs[f"{path.name} (against)"] = {**os.environ, "PYTHONPATH": str(against)}
        runs[nsys.name] = [sys.executable, "-c", _LOAD, str(nsys), str(store)]
    results: dict[str, list[tuple[float, float, float, int]]] = {name: [first[name]] if name in first else []
                                                                 for name in runs}
    for rep in range(reps):
        for name, argv in runs.items():
            if rep == 0 and name in first:
                continue
            results[name].append(child(argv, envs.get(name)))
            wall, cpu, rss, n = results[name][-1]
            print(f"  {name}: {wall:.1f} s, {cpu:.1f} CPU s, {rss:.0f} MiB, {n:,} kernels", flush=True)
    shutil.rmtree(store.parent)
    print(f"medians of {reps}; rate = kernels per CPU second; x nsys = nsys's rate / this one's"
          + ("; (against): the other code's load, its x nsys beside" if against is not None else ""))
    print(f"{'file':26s} {'MB':>6s} {'kernels':>10s} {'wall s':>7s} {'CPU s':>7s} {'MiB':>6s} {'rate':>9s} {'x nsys':>6s}")
    rates = {}
    for name, rows in results.items():
        wall, cpu, rss = (statistics.median(r[i] for r in rows) for i in range(3))
        n = rows[0][3]
        rates[name] = n / cpu
    for name, rows in results.items():
        wall, cpu, rss = (statistics.median(r[i] for r in rows) for i in range(3))
        n = rows[0][3]
        ratio = ""
        if not name.startswith("nsys_"):
            ratio = f"{rates[f'nsys_{n}.sqlite'] / rates[name]:.2f}"
        print(f"{name:26s} {(folder / name.removesuffix(' (against)')).stat().st_size / 1e6:6.0f} {n:10,} {wall:7.1f} {cpu:7.1f} {rss:6.0f} "
              f"{rates[name]:9,.0f} {ratio:>6s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("--mb", type=float, default=100)
    mk.add_argument("-o", "--output", type=Path, default=Path("/tmp/traceq-bench/formats"))
    mk.add_argument("--only", nargs="*", choices=list(MAKERS))
    me = sub.add_parser("measure")
    me.add_argument("folder", type=Path)
    me.add_argument("--reps", type=int, default=3)
    me.add_argument("--only", nargs="*", choices=list(MAKERS))
    me.add_argument("--against", type=Path, help="a folder holding another traceq as traceq/, loaded beside")
    args = parser.parse_args()
    if args.command == "make":
        make(args.output, args.mb, args.only)
    else:
        measure(args.folder, args.reps, args.only, args.against)


if __name__ == "__main__":
    main()
