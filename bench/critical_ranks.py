"""The critical path and a what-if replay of a many-rank run (requirement 4 of issue 37: a
64-rank run within 30 s; run on demand).

    python bench/critical_ranks.py [--ranks 64] [-o /tmp/traceq-bench/ranks]

The rank files are bench/dataset_scale.py's: rank i mod 8 of the DLRM set (8 real Kineto rank
files of about 250 kernels, ../shared/realtraces/kineto_json), each saying rank i of R, so the R
files are one job's ranks. They are loaded as one run into a fresh store (not timed); then, each
in this process: the run's critical paths (`Run.critical`: the ranks' graphs coupled by their
collectives, replayed, walked), and one what-if (`--overlap-comm`), wall and CPU seconds, and
the peak resident memory.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("-o", "--out", type=Path, default=Path("/tmp/traceq-bench/ranks"))
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from dataset_scale import make

    import traceq
    from traceq.api.loading import load_run

    files = make(args.out / f"files{args.ranks}", args.ranks, None)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "run.duckdb"
        from traceq.store import open_store

        con = open_store(store, create=True)
        began = time.perf_counter()
        load_run(con, files, "big")
        con.close()
        loaded = time.perf_counter() - began
        run = traceq.open(store).run("big")
        timings = {}
        for what, call in (("critical", lambda: run.critical("composition")),
                           ("whatif --overlap-comm", lambda: run.whatif(overlap_comm=True)[0])):
            wall, cpu = time.perf_counter(), time.process_time()
            frame = call()
            timings[what] = (time.perf_counter() - wall, time.process_time() - cpu, frame.height)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.ranks} ranks ({len(files)} files) loaded as one run in {loaded:.1f} s")
    for what, (wall, cpu, rows) in timings.items():
        print(f"  {what}: {wall:.2f} s wall, {cpu:.2f} CPU s, {rows} rows")
    print(f"  peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
