"""Where one Kineto load's CPU goes, phase by phase (run on demand).

    python bench/kineto_phases.py /tmp/traceq-bench/k100k.json [--reps 3]

Each rep is a new process loading the file into a new store (`api.loading.load_trace`, as
`traceq load` does), with the process's CPU seconds (user + system, both cores, from
`getrusage`) taken around each phase: pass 1 (`kineto._stage`: the parse into the staging
table), the checks, pass 2 (the store's tables), the kernel summary and the attribution; "rest"
is the remainder (the file's hash, the run, the commit). The medians are printed, with the wall
time and peak RSS. On a shared machine compare the CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

PHASES = (("ingest.kineto", "_stage", "pass 1 (parse into staging)"), ("ingest.kineto", "_check", "checks"),
          ("ingest.kineto", "_valid_times", "checks"), ("ingest.kineto", "_write_tables", "pass 2 (store tables)"),
          ("api.loading", "build_kernel_summary", "kernel summary"), ("api.loading", "attribute_trace", "attribution"))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one(path: Path) -> dict[str, float]:
    """One load in this process: CPU seconds per phase, total, wall and peak RSS (MiB)."""
    import importlib

    from traceq.api import loading
    from traceq.store import open_store

    spent: dict[str, float] = defaultdict(float)

    def timer(f, label: str):
        def timed(*args, **kwargs):
            start = _cpu()
            try:
                return f(*args, **kwargs)
            finally:
                spent[label] += _cpu() - start
        return timed

    for module, name, label in PHASES:
        owner = importlib.import_module(f"traceq.{module}")
        setattr(owner, name, timer(getattr(owner, name), label))
    with tempfile.TemporaryDirectory(prefix="traceq-phases-") as folder:
        cpu, wall = _cpu(), time.perf_counter()
        loading.load_trace(open_store(Path(folder) / "s.duckdb", create=True), path)
        cpu, wall = _cpu() - cpu, time.perf_counter() - wall
    spent["rest"] = cpu - sum(spent.values())
    return {**spent, "total": cpu, "wall s": wall, "peak RSS MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a rep, in a child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.path)))
        return
    runs = []
    for _ in range(args.reps):
        out = subprocess.run([sys.executable, __file__, str(args.path), "--one"], check=True, capture_output=True,
                             text=True).stdout
        runs.append(json.loads(out.splitlines()[-1]))
        print("  " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()), flush=True)
    print(f"{args.path} ({args.path.stat().st_size / 1e9:.2f} GB), medians of {args.reps} (CPU s unless said):")
    for key in runs[0]:
        print(f"  {key:28s} {statistics.median(r.get(key, 0.0) for r in runs):8.2f}")


if __name__ == "__main__":
    main()
