"""Load time and peak RSS of `traceq load` on each reference trace (run on demand).

    python bench/load_reference.py [TRACE ...]   # default: ../shared/reference/*.sqlite

Each load runs in its own process (`python -m traceq load`) into a fresh store; the wall time
is the median of --repeat runs and the peak RSS comes from the kernel's rusage for that child.
A baseline in the same run: a process that only imports traceq's dependencies, so the figure
that grows with the trace is the difference.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]


def run(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one child process."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(argv)}: {proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    traces = args.traces or sorted((ROOT.parent / "shared" / "reference").glob("*.sqlite"))
    baseline = [sys.executable, "-c", "import duckdb, polars, pyarrow, typer, rich, traceq.cli"]
    walls, rss = zip(*(run(baseline) for _ in range(args.repeat)))
    print(f"{'trace':32} {'MB':>7} {'kernels':>8} {'median s':>9} {'peak RSS MiB':>13}")
    print(f"{'(baseline: imports only)':32} {'':>7} {'':>8} {statistics.median(walls):9.2f} {max(rss):13.0f}")
    for trace in traces:
        results = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                db = Path(tmp) / "s.duckdb"
                results.append(run([sys.executable, "-m", "traceq", "load", str(trace), "--db", str(db)]))
                con = duckdb.connect(str(db), read_only=True)
                kernels = con.execute("SELECT kernel_count FROM traces").fetchall()[0][0]
                con.close()
        walls, rss = zip(*results)
        print(f"{trace.stem:32} {trace.stat().st_size / 1e6:7.1f} {kernels:8,} "
              f"{statistics.median(walls):9.2f} {max(rss):13.0f}")


if __name__ == "__main__":
    main()
