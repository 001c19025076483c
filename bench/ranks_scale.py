"""An N-rank run made from a real one, and `traceq overlap`, `comm` and `ranks` measured on it as
N grows (run on demand).

    python bench/ranks_scale.py ../shared/realtraces/kineto_json/facebookresearch__param__dlrm_kineto__worker*.json.gz \
        --ranks 8 16 32 64 -o /tmp/traceq-bench/ranks

The source files are loaded once as a run (`traceq load --run`); `scale_run` then copies the
run's traces inside the store, every row of every table (in SQL, a statement per table and
trace), until the run has N ranks: rank r is a copy of source rank r mod S, its events the same
rows, so rank r's numbers must equal rank (r mod S)'s (tests/test_multigpu.py checks that at 64
ranks). Each command runs in its own process on each N, with wall time and peak RSS (ru_maxrss
of the child): memory flat in N is the claim.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb


def scale_run(con: duckdb.DuckDBPyConnection, run: str, ranks: int, name: str) -> int:
    """Make run `name` of `ranks` ranks from run `run` (S ranks, one trace each), in one
    transaction; returns its run_id. Rank r's trace is a copy of the source's rank r mod S."""
    from traceq.store import event_tables

    sources = con.execute("SELECT k.rank, k.trace_id FROM ranks k JOIN runs r USING (run_id) WHERE r.name = ? "
                          "ORDER BY k.rank", [run]).fetchall()
    if [r for r, _ in sources] != list(range(len(sources))) or len({t for _, t in sources}) != len(sources):
        raise SystemExit(f"run {run!r} is not one trace per rank 0..S-1")
    tables = [t for t in event_tables(con) if t not in ("traces", "ranks")]
    con.execute("BEGIN TRANSACTION")
    run_id = con.execute("SELECT nextval('run_ids')").fetchone()[0]
    con.execute("INSERT INTO runs SELECT ?, ?, ?, clock FROM runs WHERE name = ?", [run_id, name, ranks, run])
    for rank in range(ranks):
        source = sources[rank % len(sources)][1]
        trace = con.execute("SELECT nextval('trace_ids')").fetchone()[0]
        con.execute("INSERT INTO traces SELECT * REPLACE (? AS trace_id, ? AS name, ? AS rank, ? AS world_size) "
                    "FROM traces WHERE trace_id = ?", [trace, f"{name} rank {rank}", rank, ranks, source])
        for table in tables:
            con.execute(f'INSERT INTO "{table}" SELECT * REPLACE (? AS trace_id) FROM "{table}" WHERE trace_id = ?',
                        [trace, source])
        con.execute("INSERT INTO ranks SELECT * REPLACE (? AS run_id, ? AS rank, ? AS trace_id) FROM ranks "
                    "WHERE trace_id = ?", [run_id, rank, trace, source])
    con.execute("COMMIT")
    return int(run_id)


_CHILD = """
import atexit, resource, sys
atexit.register(lambda: sys.stderr.write(f"maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n"))
from traceq.cli import main
sys.argv = ["traceq", *sys.argv[1:]]
main()
"""


def _child(args: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of `traceq ARGS` in a process of its own."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], check=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    rss = next(int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("maxrss "))
    return wall, rss / 1024


def measure(sources: list[Path], counts: list[int], folder: Path) -> None:
    from traceq.api.loading import load_run
    from traceq.store import open_store

    folder.mkdir(parents=True, exist_ok=True)
    base = folder / "source.duckdb"
    base.unlink(missing_ok=True)
    con = open_store(base, create=True)
    load_run(con, sources, "source")
    con.close()
    print("| ranks | overlap s | overlap MiB | comm s | comm MiB | ranks s | ranks MiB |")
    print("|---|---|---|---|---|---|---|")
    for n in counts:
        store = folder / f"ranks{n}.duckdb"
        shutil.copyfile(base, store)
        con = open_store(store)
        scale_run(con, "source", n, "job")
        con.close()
        cells = []
        for command in ("overlap", "comm", "ranks"):
            wall, rss = _child([command, "job", "--db", str(store), "-f", "csv"])
            cells += [f"{wall:.2f}", f"{rss:.0f}"]
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", type=Path, help="one trace file per rank of a real job")
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("-o", "--out", type=Path, required=True, help="folder for the stores")
    args = parser.parse_args()
    measure(args.sources, args.ranks, args.out)


if __name__ == "__main__":
    main()
