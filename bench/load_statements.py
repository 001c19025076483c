"""Where a warm Dask worker's load of a small rank file goes, statement by statement: the
worker's store wrapped so that every statement (`execute`, `sql`, and the relation's fetch) is
timed in CPU seconds and counted under the traceq line that ran it (run on demand).

    python bench/load_statements.py [FILES_DIR] [--files 8] [--top 40]
    python bench/load_statements.py [FILES_DIR] --few-rows-ab 40

FILES_DIR: rank files as `bench/dataset_scale.py` makes them (default
/tmp/traceq-bench/ranks/files32); the first three are loaded to warm up (imports, the worker's
store, caches), the next `--files` counted, each as a task runs it (`load_rank`). Prints the CPU
seconds a file, the statements a file and the CPU seconds in them, then the costliest statements
(ms a file, statements a file, the line that ran them and the SQL's start). The wrapper adds a
little CPU of its own to each statement; compare the statements, not the totals, with a run
without it (docs/scale-out.md, "Per-file cost").

--few-rows-ab N: no wrapper; N pairs of files loaded in one warm process, one file with the load's
queries planned once (`api.loading.FEW_ROWS_KERNELS` as it is) and one as before (0), in turn
(ABBA), each file's CPU seconds: the medians and their ratio, which a shared machine's load
changes far less than either median.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # as a worker (api.datasets.WORKER_ENV)

_cpu: dict[str, float] = collections.defaultdict(float)
_count: collections.Counter[str] = collections.Counter()
_STATEMENTS = ("execute", "sql", "query", "executemany")


def _site(sql: object) -> str:
    """The traceq line that ran a statement, and the statement's start."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        if "traceq" in frame.filename and not frame.filename.endswith("store.py"):
            text = " ".join(str(sql).split())[:90]
            return f"{frame.filename.split('traceq/')[-1]}:{frame.lineno} | {text}"
    return "?"


class _Timed:
    """A connection or relation whose calls are timed under the statement they belong to."""

    def __init__(self, inner: object, site: list[str]):
        self._inner, self._site = inner, site

    def __getattr__(self, name: str) -> object:
        member = getattr(self._inner, name)
        if not callable(member):
            return member

        def call(*args: object, **kwargs: object) -> object:
            if name in _STATEMENTS and args:
                self._site[0] = _site(args[0])
                _count[self._site[0]] += 1
            started = time.process_time()
            try:
                out = member(*args, **kwargs)
            finally:
                _cpu[self._site[0]] += time.process_time() - started
            if out is self._inner:
                return self
            return _Timed(out, [self._site[0]]) if type(out).__name__ == "DuckDBPyRelation" else out

        return call

    def cursor(self) -> _Timed:
        return _Timed(self._inner.cursor(), ["?"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files_dir", nargs="?", type=Path, default=Path("/tmp/traceq-bench/ranks/files32"))
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--few-rows-ab", type=int, metavar="N", help="N pairs: few_rows on and off, in turn")
    args = parser.parse_args()
    from traceq.api import datasets
    from traceq.ingest import default_name

    files = sorted(args.files_dir.glob("rank*.json*"))
    if len(files) < 3 + args.files:
        sys.exit(f"{args.files_dir} holds {len(files)} rank files; make them with bench/dataset_scale.py")
    if args.few_rows_ab:
        few_rows_ab(files, args.few_rows_ab)
        return
    store = datasets.worker_store
    datasets.worker_store = lambda: _Timed(store(), ["?"])
    with tempfile.TemporaryDirectory(prefix="traceq-bench-") as dataset:
        for i, f in enumerate(files[:3], 1):
            datasets.load_rank(str(f), i, default_name(f), dataset)
        _cpu.clear()
        _count.clear()
        started = time.process_time()
        for i, f in enumerate(files[3:3 + args.files], 4):
            datasets.load_rank(str(f), i, default_name(f), dataset)
        total = (time.process_time() - started) / args.files
    n = args.files
    print(f"{total:.4f} CPU s a file; {sum(_count.values()) / n:.0f} statements a file, "
          f"{sum(_cpu.values()) / n:.4f} CPU s in them (load average {os.getloadavg()[0]:.1f})")
    for site, cpu in sorted(_cpu.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{1000 * cpu / n:7.2f} ms {_count[site] / n:5.1f}  {site}")


def few_rows_ab(files: list[Path], pairs: int) -> None:
    """See --few-rows-ab in the module's docstring."""
    import itertools
    import statistics

    from traceq.api import datasets, loading
    from traceq.ingest import default_name

    kernels, ids = loading.FEW_ROWS_KERNELS, itertools.count(1)
    cpu: dict[str, list[float]] = {"before": [], "now": []}
    with tempfile.TemporaryDirectory(prefix="traceq-bench-") as dataset:
        for i in range(pairs + 2):
            for which in ("now", "before") if i % 2 else ("before", "now"):
                loading.FEW_ROWS_KERNELS = kernels if which == "now" else 0
                f = files[(7 * i) % len(files)]
                started = time.process_time()
                datasets.load_rank(str(f), next(ids), default_name(f), dataset)
                if i >= 2:  # the first two pairs warm up
                    cpu[which].append(time.process_time() - started)
    before, now = statistics.median(cpu["before"]), statistics.median(cpu["now"])
    print(f"CPU s a file, medians of {pairs}: before {before:.4f}, now {now:.4f} ({now / before:.3f}x; "
          f"load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
