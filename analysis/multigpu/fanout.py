"""A run's traces analysed side by side: on a dataset of many ranks, the per-trace part of `comm`,
`overlap` and `ranks` runs in worker processes, one trace per task, each process reading its
trace through views over that trace's files alone (`dataset.open_dataset`); the coordinator only
concatenates the small frames they return. A store (one DuckDB file, one writer), a run of few
traces, or TRACEQ_WORKERS=1 keeps the work in this process, in trace order: the same frames.

Workers: TRACEQ_WORKERS, else the machine's cores (at most MAX_WORKERS). Processes are spawned
(DuckDB and polars keep threads a fork would copy half-way); each costs an import of traceq, so
a run needs MIN_TRACES traces before a pool pays."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from traceq.analysis.multigpu.collectives import Progress, Rank, by_trace, each_trace

MIN_TRACES = 16
MAX_WORKERS = 64

PerTrace = Callable[..., pl.DataFrame]
"""fn(con, trace_id, ranks_in_trace, *args) -> a frame, a module-level function (it is pickled)."""


def workers() -> int:
    setting = os.environ.get("TRACEQ_WORKERS", "")
    if setting.strip().isdigit() and int(setting) > 0:
        return int(setting)
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def map_traces(con: duckdb.DuckDBPyConnection, ranks: list[Rank], fn: PerTrace, *args: Any,
               progress: Progress | None = None) -> list[pl.DataFrame]:
    """[fn(con_of_trace, trace_id, its ranks, *args) for each of the run's traces], in trace order
    (`by_trace`'s), in worker processes where the module docstring says, else here."""
    from traceq.store import first_row

    traces = by_trace(ranks)
    dataset = _dataset_of(con, first_row)
    pool = min(workers(), len(traces))
    if dataset is None or pool < 2 or len(traces) < MIN_TRACES:
        return [fn(on, trace_id, in_trace, *args) for trace_id, in_trace, on in each_trace(con, ranks, progress)]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    items = list(traces.items())
    out: list[pl.DataFrame | None] = [None] * len(items)
    with _one_thread_each(), ProcessPoolExecutor(pool, mp_context=multiprocessing.get_context("spawn")) as executor:
        futures = {executor.submit(_one, str(dataset), trace_id, in_trace, fn, args): i
                   for i, (trace_id, in_trace) in enumerate(items)}
        from concurrent.futures import as_completed

        for done, future in enumerate(as_completed(futures), start=1):
            out[futures[future]] = future.result()
            if progress is not None:
                progress(done, len(items))
    return [frame for frame in out if frame is not None]


@contextmanager
def _one_thread_each() -> Iterator[None]:
    """The environment the worker processes are spawned with: Polars on one thread each (unless
    POLARS_MAX_THREADS says otherwise), as each is one core's work; by default each would start
    a thread per core, a process per core."""
    if "POLARS_MAX_THREADS" in os.environ:
        yield
        return
    os.environ["POLARS_MAX_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("POLARS_MAX_THREADS", None)


def _dataset_of(con: duckdb.DuckDBPyConnection, first_row: Callable[..., Any]) -> Path | None:
    from traceq.dataset import DATASET_VARIABLE

    try:
        value = first_row(con, f"SELECT getvariable('{DATASET_VARIABLE}')")[0]
    except duckdb.Error:
        return None
    return Path(value) if value else None


_READERS: dict[str, Callable[[int], duckdb.DuckDBPyConnection]] = {}
"""A worker process's reader of each dataset (`dataset.trace_reader`): one connection, its views
pointed at the task's trace, kept for the process's next task."""


def _one(dataset: str, trace_id: int, in_trace: list[Rank], fn: PerTrace, args: tuple[Any, ...]) -> pl.DataFrame:
    """One task: the trace's frame, read through views over its own files (and its run's)."""
    from traceq.dataset import open_dataset, trace_reader

    read = _READERS.get(dataset)
    if read is None:  # DuckDB on one thread too (`_one_thread_each`)
        read = _READERS[dataset] = trace_reader(open_dataset(Path(dataset), [], threads=1))
    return fn(read(trace_id), trace_id, in_trace, *args)
