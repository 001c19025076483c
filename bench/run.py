"""Load time, peak RSS and query latency of traceq at scale, beside baselines (run on demand).

    python bench/scale.py ../shared/reference/alexnet_b256_nocudnn.sqlite --kernels 1000000 \\
        -o /tmp/traceq-bench/alexnet_1M.sqlite          # and 10000000 -> alexnet_10M.sqlite
    python bench/scale.py ../shared/reference/resnet50_b32_autograd_40it.sqlite \\
        --nvtx-ranges 10000000 -o /tmp/traceq-bench/resnet50_10Mnvtx.sqlite
    python bench/run.py [--make] [-o results.md]

--make runs those scale.py commands for any file missing. Every measurement is a child process
(`python -m traceq ...` or `python -c ...`), timed by wall clock, with its CPU time and peak RSS
from the kernel's rusage for that child; the figure is the median of --repeat runs (--big-repeat
for traces over 500 MB). In the same run, on the same files:

- `traceq load --db STORE` with the ADBC reader and with the stdlib sqlite3 reader
  (`TRACEQ_SQLITE_READER`), the latter only up to --stdlib-max-mb;
- `traceq top --k 15`, `traceq layers` and `traceq ru` on the loaded store (a command this
  traceq lacks is reported as such);
- kernel attribution (`traceq.analysis.structure.attribution.kernel_attribution`) on the loaded store;
- baselines: SQLite decoding the columns the reader reads (max() over each, in SQLite, one
  thread: the floor of any SQLite reader), SQLite's GROUP BY top-15 (what `nsys stats`'s
  cuda_gpu_kern_sum does), and `nsys-ai skill run top_kernels` when `nsys-ai` is on PATH (or
  --nsys-ai), twice, on a copy of the trace: nsys-ai adds indexes to the file it is given.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT.parent / "shared" / "reference"
BENCH = Path("/tmp/traceq-bench")
SCALED = {  # file under BENCH -> (source under REFERENCE, scale.py size option)
    "alexnet_1M.sqlite": ("alexnet_b256_nocudnn.sqlite", ["--kernels", "1000000"]),
    "alexnet_10M.sqlite": ("alexnet_b256_nocudnn.sqlite", ["--kernels", "10000000"]),
    "resnet50_10Mnvtx.sqlite": ("resnet50_b32_autograd_40it.sqlite", ["--nvtx-ranges", "10000000"]),
}
DEFAULT_TRACES = [REFERENCE / "alexnet_b256_nocudnn.sqlite", BENCH / "alexnet_1M.sqlite",
                  BENCH / "alexnet_10M.sqlite", REFERENCE / "resnet50_b32_autograd_40it.sqlite",
                  BENCH / "resnet50_10Mnvtx.sqlite"]
BIG_BYTES = 500_000_000

# The columns ingest/nsys.py reads, per table: the floor decodes exactly these.
READ_COLUMNS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": "start end deviceId contextId streamId correlationId globalPid "
    "demangledName shortName mangledName gridX gridY gridZ blockX blockY blockZ registersPerThread "
    "staticSharedMemory dynamicSharedMemory sharedMemoryExecuted sharedMemoryLimitConfig "
    "localMemoryPerThread localMemoryTotal launchType graphNodeId",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start end eventClass nameId correlationId globalTid returnValue",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "start end copyKind srcKind dstKind bytes deviceId contextId "
    "streamId correlationId globalPid",
    "CUPTI_ACTIVITY_KIND_MEMSET": "start end value bytes memKind deviceId contextId streamId "
    "correlationId globalPid",
    "NVTX_EVENTS": "start end eventType text textId domainId category color globalTid endGlobalTid",
    "CUDA_GPU_MEMORY_USAGE_EVENTS": "start memoryOperationType bytes address memKind deviceId "
    "contextId streamId correlationId globalPid",
}

FLOOR = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], uri=True)
tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
for table, cols in %r.items():
    if table in tables:
        have = {r[1] for r in con.execute('PRAGMA table_info("' + table + '")')}
        use = ", ".join('max("' + c + '")' for c in cols.split() if c in have)
        con.execute("SELECT " + use + ' FROM "' + table + '"').fetchall()
""" % READ_COLUMNS

GROUP_BY = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], uri=True)
con.execute('''SELECT s.value, sum(k."end" - k.start) AS total, count(*), avg(k."end" - k.start),
                      min(k."end" - k.start), max(k."end" - k.start)
               FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName
               GROUP BY k.demangledName ORDER BY total DESC LIMIT 15''').fetchall()
"""

ATTRIBUTION = """
import sys
import duckdb
from traceq.analysis.structure.attribution import kernel_attribution
con = duckdb.connect(sys.argv[1], read_only=True)
tid = con.execute("SELECT max(trace_id) FROM traces").fetchall()[0][0]
print(kernel_attribution(con, tid).height)
"""


IN_PROCESS = """
import json, statistics, sys, time
t = time.perf_counter()
import duckdb
from traceq.analysis.kernels.top import kernel_statistics, top_kernels
from traceq.analysis.structure.layers import layer_times
from traceq.analysis.structure.attribution import kernel_attribution
imported = time.perf_counter() - t
con = duckdb.connect(sys.argv[1], read_only=True)
tid = con.execute("SELECT max(trace_id) FROM traces").fetchall()[0][0]
def best(f, n):
    times = []
    for _ in range(n):
        t = time.perf_counter(); f(); times.append(time.perf_counter() - t)
    return statistics.median(times)
n = int(sys.argv[2])
print()
print(json.dumps({"imports": imported, "top": best(lambda: top_kernels(con, tid, 15), max(n, 5)),
                  "aggregation": best(lambda: kernel_statistics(con, tid, live=True), max(n, 3)),
                  "layers": best(lambda: layer_times(con, tid), n),
                  "attribution": best(lambda: kernel_attribution(con, tid), n)}))
"""


def in_process(store: Path, n: int) -> dict[str, float] | str:
    """Median seconds of top_kernels, layer_times and kernel_attribution called in one process
    on an open store (no interpreter start, no imports), and the imports' time."""
    import json

    done = subprocess.run([sys.executable, "-c", IN_PROCESS, str(store), str(n)], capture_output=True,
                          text=True, cwd=ROOT.parent, timeout=TIMEOUT_S)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["failed"])[-1][:120]
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class Run:
    wall: float
    cpu: float
    rss_mib: float


TIMEOUT_S = 900


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = TIMEOUT_S) -> Run | str:
    """One child process: its wall time, CPU time and peak RSS, or its error's last line."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT.parent,
                            env={**os.environ, **(env or {})})
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    timer.cancel()
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        if wall >= timeout:
            return f"stopped after {timeout:g} s"
        return (err.splitlines() or ["failed"])[-1][:120]
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def median(runs: list[Run | str]) -> Run | str:
    ok = [r for r in runs if isinstance(r, Run)]
    if not ok:
        return runs[0]
    return Run(statistics.median(r.wall for r in ok), statistics.median(r.cpu for r in ok),
               max(r.rss_mib for r in ok))


def repeat(n: int, argv: list[str], env: dict[str, str] | None = None, before=None) -> Run | str:
    results = []
    for _ in range(n):
        if before is not None:
            before()
        results.append(run(argv, env))
    return median(results)


def has_command(name: str) -> bool:
    done = subprocess.run([sys.executable, "-m", "traceq", name, "--help"], capture_output=True, cwd=ROOT.parent)
    return done.returncode == 0


def machine() -> list[str]:
    import duckdb
    import pyarrow

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal"))
    try:
        from importlib.metadata import version

        adbc = version("adbc-driver-sqlite")
    except Exception:
        adbc = "not installed"
    return [
        f"- CPU: {cpu}, {os.cpu_count()} cores; memory {mem / 2**20:.1f} GiB; {platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}, DuckDB {duckdb.__version__}, pyarrow {pyarrow.__version__}, "
        f"adbc-driver-sqlite {adbc}",
        f"- load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
        "(the machine is shared; CPU seconds are steadier than wall seconds)",
    ]


def fmt(r: Run | str | None, rss: bool = True) -> str:
    if r is None:
        return "–"
    if isinstance(r, str):
        return r if r.startswith("first ") else f"n/a ({r})"
    text = f"{r.wall:.2f} s (cpu {r.cpu:.1f} s"
    return text + (f", {r.rss_mib:.0f} MiB)" if rss else ")")


def rows_of(store: Path) -> tuple[int, int]:
    import duckdb

    con = duckdb.connect(str(store), read_only=True)
    k = con.execute("SELECT kernel_count FROM traces").fetchall()[0][0]
    n = con.execute("SELECT count(*) FROM nvtx").fetchall()[0][0]
    con.close()
    return int(k), int(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--big-repeat", type=int, default=1, help="runs for traces over 500 MB")
    parser.add_argument("--stdlib-max-mb", type=float, default=200, help="stdlib reader only up to this size")
    parser.add_argument("--make", action="store_true", help="make missing scaled traces with scale.py")
    parser.add_argument("--nsys-ai", default=shutil.which("nsys-ai"), help="the nsys-ai command, if any")
    parser.add_argument("--nsys-ai-timeout", type=float, default=300)
    parser.add_argument("-o", "--output", type=Path, help="also write the markdown here")
    args = parser.parse_args()
    traces = args.traces or DEFAULT_TRACES
    py = sys.executable
    for t in traces:
        if not t.exists() and t.name in SCALED and args.make:
            src, size = SCALED[t.name]
            subprocess.run([py, str(ROOT / "bench" / "scale.py"), str(REFERENCE / src), *size, "-o", str(t)], check=True)
    traces = [t for t in traces if t.exists()]
    commands = {c: has_command(c) for c in ("top", "layers", "ru")}
    nsys_ai = args.nsys_ai

    out = ["## Machine", "", *machine(), ""]
    load_rows, query_rows, base_rows = [], [], []
    work = Path(tempfile.mkdtemp(prefix="traceq-run-", dir=BENCH if BENCH.exists() else None))
    for trace in traces:
        n = args.big_repeat if trace.stat().st_size > BIG_BYTES else args.repeat
        store = work / f"{trace.stem}.duckdb"

        def fresh(path: Path = store) -> None:
            for p in (path, path.with_name(path.name + ".wal")):
                p.unlink(missing_ok=True)

        load = [py, "-m", "traceq", "load", str(trace), "--db", str(store)]
        print(f"{trace.name}: loading ({n} runs) ...", file=sys.stderr, flush=True)
        stdlib = None
        if trace.stat().st_size <= args.stdlib_max_mb * 1e6:
            stdlib = repeat(n, load, {"TRACEQ_SQLITE_READER": "stdlib"}, before=fresh)
        adbc = repeat(n, load, {"TRACEQ_SQLITE_READER": "adbc"}, before=fresh)
        kernels, nvtx = rows_of(store)
        floor = repeat(n, [py, "-c", FLOOR, trace.resolve().as_uri() + "?mode=ro"])
        group = repeat(n, [py, "-c", GROUP_BY, trace.resolve().as_uri() + "?mode=ro"])
        ratio = f"{adbc.wall / floor.wall:.2f}" if isinstance(adbc, Run) and isinstance(floor, Run) else "–"
        load_rows.append(f"| {trace.stem} | {trace.stat().st_size / 1e6:,.0f} | {kernels:,} | {nvtx:,} | {n} | "
                         f"{fmt(adbc)} | {fmt(stdlib)} | {fmt(floor, False)} | {ratio} |")
        print(load_rows[-1], file=sys.stderr, flush=True)

        q = {}
        for label, argv in (("top", ["top", "--k", "15"]), ("top-bare", ["top", "--k", "15", "--no-context"]),
                            ("layers", ["layers"]), ("ru", ["ru"])):
            q[label] = (repeat(n, [py, "-m", "traceq", *argv, "--db", str(store)])
                        if commands[argv[0]] else "no such command in this traceq")
        attribution = repeat(n, [py, "-c", ATTRIBUTION, str(store)]) if nvtx else None
        inside = in_process(store, n)
        lat = ("n/a (" + inside + ")" if isinstance(inside, str) else
               f"top {inside['top']:.3f} s (aggregating the launches again: {inside['aggregation']:.3f} s), "
               f"layers {inside['layers']:.2f} s, "
               f"attribution {inside['attribution']:.2f} s (imports {inside['imports']:.2f} s)")
        nsys: Run | str = "not installed"
        if nsys_ai:  # on a copy: nsys-ai writes its indexes into the profile it is given
            copy = work / trace.name
            shutil.copyfile(trace, copy)
            first = run([nsys_ai, "skill", "run", "top_kernels", str(copy)], timeout=args.nsys_ai_timeout)
            again = (run([nsys_ai, "skill", "run", "top_kernels", str(copy)], timeout=args.nsys_ai_timeout)
                     if isinstance(first, Run) else first)
            nsys = (f"first {fmt(first, False)}, again {fmt(again, False)}"
                    if isinstance(first, Run) and isinstance(again, Run) else first)
            copy.unlink()
            for extra in work.glob(f"{trace.stem}.nsys-cache*"):
                shutil.rmtree(extra, ignore_errors=True) if extra.is_dir() else extra.unlink()
        top_ratio = (f"{group.wall / q['top-bare'].wall:.1f}x"
                     if isinstance(group, Run) and isinstance(q["top-bare"], Run)
                     else "–")
        query_rows.append(f"| {trace.stem} | {fmt(q['top'], False)} | {fmt(q['top-bare'], False)} | "
                          f"{fmt(q['layers'], False)} | "
                          f"{fmt(q['ru'], False)} | {fmt(attribution)} | {lat} |")
        base_rows.append(f"| {trace.stem} | {fmt(q['top-bare'], False)} | {fmt(group, False)} | {top_ratio} | "
                         f"{fmt(nsys, False)} |")
        print(query_rows[-1], file=sys.stderr, flush=True)
        fresh()
    shutil.rmtree(work, ignore_errors=True)

    out += [
        "## Loading (`traceq load`)", "",
        "Median wall time (CPU seconds, peak RSS of the process). Floor: SQLite alone decoding the "
        "columns traceq reads, one thread, no Python objects. Ratio: ADBC load / floor.", "",
        "| trace | MB | kernels | NVTX events | runs | ADBC reader (default) | stdlib sqlite3 reader | SQLite decode floor | ratio |",
        "|---|---:|---:|---:|---:|---|---|---|---:|",
        *load_rows, "",
        "## Queries on the loaded store", "",
        "Median wall time of the whole command (process start and imports included); attribution "
        "is `kernel_attribution` in a child process (with its peak RSS). In process: the same "
        "analyses called on an open store, median of repeated calls (what a notebook or a "
        "long-lived process pays); `top` reads the per-name statistics the load wrote, the figure "
        "in brackets is the same statistics aggregated from every launch.", "",
        "| trace | `top --k 15` | `top --k 15 --no-context` | `layers` | `ru` | attribution | in process |",
        "|---|---|---|---|---|---|---|",
        *query_rows, "",
        "## Top-15 kernels against other tools", "",
        "SQLite GROUP BY: the query `nsys stats --report cuda_gpu_kern_sum` amounts to, run by "
        "sqlite3 on the trace file. Speed-up: GROUP BY time / `traceq top` time.", "",
        "| trace | `traceq top --k 15 --no-context` | SQLite GROUP BY | speed-up | `nsys-ai skill run top_kernels` |",
        "|---|---|---|---:|---|",
        *base_rows, "",
    ]
    text = "\n".join(out)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
