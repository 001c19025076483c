"""Loading, as the API runs it: a file read into the store (`traceq.ingest`), then what the
analyses keep of it (the kernel summary `top` reads, each launch's attribution), then the run it
belongs to (`analysis.multigpu.runs`), all in one transaction: on any error the store is exactly
as it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb

from traceq.analysis.kernels.top import build_kernel_summary
from traceq.analysis.multigpu.runs import check_runs_whole, register_run
from traceq.analysis.structure import stored
from traceq.analysis.structure.keep import attribute_trace
from traceq.errors import TraceqError
from traceq.ingest import LOAD_SETTINGS, LoadResult, apply_settings, load_settings, read_trace
from traceq.store import delete_trace, few_rows, first_row

FEW_ROWS_KERNELS = 100_000
"""Up to this many kernels, what a load keeps of a trace is computed with queries planned once
(`store.few_rows`): their results are small, and planning a query costs more than its rows."""


def load_trace(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    *,
    name: str | None = None,
    replace: bool = False,
    progress: Callable[[int, int], None] | None = None,
    engine: str | None = None,
    python_functions: bool = False,
    attribute: bool | None = None,
    transaction: bool = True,
) -> LoadResult:
    """Load the trace file at `path` into the store `con`, as a run of its own named as the
    trace (`runs`) unless `transaction` is False.

    Args:
        attribute: keep each kernel's attribution in the store (`analysis.structure.stored`);
            default: for traces of up to `stored.LOAD_MAX_KERNELS` kernels.
        transaction: False: the caller owns the transaction and registers the run (`load_run`).
        Others: `traceq.ingest.read_trace`'s.

    Raises:
        TraceFormatError: the file is not a trace traceq reads, or is damaged.
        TraceqError: the name is taken by a different trace (and not `replace`).
    """
    with load_settings(con) as saved:  # restored after the commit or the rollback
        if transaction:
            con.execute("BEGIN TRANSACTION")
        try:
            result = read_trace(con, path, name=name, replace=replace, progress=progress, engine=engine,
                                python_functions=python_functions)
            if result.status == "already_loaded":
                if transaction:
                    con.execute("ROLLBACK")
                return result
            # the inserts are done: the summary may use every thread
            if str(saved["threads"]) != LOAD_SETTINGS["threads"]:
                apply_settings(con, {"threads": saved["threads"]})
            keep(con, result.trace_id, result.kernel_count, attribute)
            if transaction:
                register_run(con, result.name, [result.trace_id])
                check_runs_whole(con)
                con.execute("COMMIT")
        except BaseException:
            if transaction:
                _rollback(con)
            raise
    return result


def keep(con: duckdb.DuckDBPyConnection, trace_id: int, kernels: int, attribute: bool | None) -> None:
    """What the analyses keep of a trace just read: its kernel summary, and its attribution when
    `attribute` says so or (None) it has at most LOAD_MAX_KERNELS kernels and no user rules
    are in force."""
    with few_rows(kernels <= FEW_ROWS_KERNELS):
        build_kernel_summary(con, trace_id)
        if attribute or (attribute is None and kernels <= stored.LOAD_MAX_KERNELS and stored.fingerprint() is not None):
            attribute_trace(con, trace_id)


def load_run(
    con: duckdb.DuckDBPyConnection,
    paths: list[Path],
    run: str,
    *,
    replace: bool = False,
    progress: Callable[[int, int, int], None] | None = None,
    engine: str | None = None,
    python_functions: bool = False,
) -> list[LoadResult]:
    """Load several trace files, one per rank (or per node), as the run `run`, in one transaction:
    on any error, a bad file or files that are not one job's ranks (`analysis.multigpu.runs`), the
    store is exactly as it was.

    Args:
        replace: replace traces with the same content or name, and a run of the same name
            (with all its traces), instead of refusing.
        progress: called with (file index, rows read so far, rows expected) while reading.
        Others: as `load_trace`.

    Raises:
        TraceFormatError: a file is not a trace traceq reads.
        RunError: the files are not the ranks of one job.
        TraceqError: a file is already loaded (and not `replace`).
    """
    con.execute("BEGIN TRANSACTION")
    try:
        if replace:
            for (trace_id,) in con.execute("SELECT DISTINCT trace_id FROM ranks JOIN runs USING (run_id) "
                                           "WHERE runs.name = ?", [run]).fetchall():
                delete_trace(con, trace_id)
        results = []
        for i, path in enumerate(paths):
            step = None if progress is None else (lambda done, total, i=i: progress(i, done, total))
            results.append(load_trace(con, path, replace=replace, progress=step, engine=engine,
                                      python_functions=python_functions, transaction=False))
        loaded = [r for r in results if r.status == "already_loaded"]
        if loaded:
            ids = {r.trace_id for r in results}
            same = first_row(con, "SELECT list(DISTINCT trace_id) FROM ranks JOIN runs USING (run_id) "
                                  "WHERE runs.name = ?", [run])
            if len(loaded) < len(results) or set(same[0] or []) != ids:
                path = paths[results.index(loaded[0])]
                raise TraceqError(f"{path} is already loaded as trace {loaded[0].name!r}: pass --replace to load "
                                  f"it again as a rank of run {run!r}")
            con.execute("ROLLBACK")
            return results
        register_run(con, run, [r.trace_id for r in results])
        check_runs_whole(con)
        con.execute("COMMIT")
    except BaseException:
        _rollback(con)
        raise
    return results


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:  # the failure closed the transaction already: keep its error
        pass


__all__ = ["keep", "load_run", "load_trace"]
