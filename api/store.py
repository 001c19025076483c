"""`Store`: a store (or a dataset) of traces; `open`, `load` and `load_dataset`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceq.errors import NotFoundError, StoreError, TraceqError
from traceq.store import (
    DEFAULT_STORE,
    NotAStoreError,
    default_store_path,
    first_row,
    open_store,
    resolve_run,
    resolve_trace,
    resolve_trace_or_run,
    restore_size,
    run_of_trace,
)

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from traceq.analysis.efficiency.ncu import NcuJoin
    from traceq.api.datasets import DatasetLoad

from traceq.api.options import _path, _regex, _remove_store, _run_traces
from traceq.api.run import Run
from traceq.api.trace import Trace


def open(path: str | Path | None = None, *, write: bool = False,
         dataset: str | Path | None = None) -> Store:
    """The store at `path` (default: $TRACEQ_DB, else ./traceq.duckdb), read-only unless `write`;
    or, given `dataset`, the Parquet dataset in that folder (`load_dataset` writes one), read-only.

    Raises StoreError when there is no store (or dataset) there, it is not a traceq store, or it
    is locked by a process writing it for longer than $TRACEQ_LOCK_TIMEOUT seconds.
    """
    return Store(path, write=write, dataset=dataset)


def load(path: str | Path, store: str | Path | Store | None = None, **options: Any) -> Trace:
    """Load the trace file at `path` into `store` (a Store, or the path of one, created when
    missing; default as for `open`) and return it as a Trace. `options` are `Store.load`'s."""
    if isinstance(store, Store):
        return store.load(path, **options)
    return Store(store, lazy=True).load(path, **options)


class Store:
    """A traceq store: one DuckDB file holding many traces, or a dataset: a folder of Parquet
    files per trace (`traceq load --dataset`; docs/scale-out.md) read through DuckDB views with
    the store's table names. Use `traceq.open` or `traceq.load`.

    `con` is the DuckDB connection, for SQL of your own (`docs/schema.md` lists the tables);
    `sql(query)` runs a read-only query as `traceq sql` does. A Store is a context manager that
    closes the connection on exit.
    """

    def __init__(self, path: str | Path | None = None, *, write: bool = False, lazy: bool = False,
                 on_wait: Callable[[str], None] | None = None, dataset: str | Path | None = None):
        """`lazy`: open the connection at its first use (`load` creates a missing store);
        `on_wait`: called with a message when the store is locked and the open waits;
        `dataset`: the dataset in this folder instead of a store (read-only: `path` and `write`
        are refused with it)."""
        if dataset is not None and (path is not None or write):
            raise TraceqError("a dataset is read here, not written, and is not a store: give it alone "
                              "(traceq.open(dataset=...))")
        self.dataset = Path(dataset) if dataset is not None else None
        self.path = self.dataset or (Path(path) if path is not None else default_store_path())
        self.write = write
        self._on_wait = on_wait
        self._con: duckdb.DuckDBPyConnection | None = None
        if self.dataset is not None:  # its views are made at their first use: check it is a dataset now
            from traceq.dataset import read_catalog

            read_catalog(self.dataset)
        elif not lazy:
            self._con = self._open(read_only=not write)

    def _open(self, *, read_only: bool, create: bool = False) -> duckdb.DuckDBPyConnection:
        if self.dataset is not None:  # read-only: `_writable` refuses what would write
            from traceq.dataset import open_dataset

            return open_dataset(self.dataset)
        try:
            return open_store(self.path, read_only=read_only, create=create, on_wait=self._on_wait)
        except NotAStoreError as e:
            raise _what_it_is(e) from None
        finally:  # an on_wait that showed a notice may take it back (the CLI's erases its line)
            getattr(self._on_wait, "clear", lambda: None)()

    def _over(self, trace_ids: list[int]) -> duckdb.DuckDBPyConnection:
        """A connection that reads these traces: the store's own; for a dataset, views over their
        files alone (as quick among 1,000 traces as alone)."""
        if self.dataset is None:
            return self.con
        from traceq.dataset import open_dataset

        return open_dataset(self.dataset, trace_ids)

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection (read-only unless the store was opened with write=True)."""
        if self._con is None:
            self._con = self._open(read_only=not self.write)
        return self._con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "dataset" if self.dataset is not None else "Store"
        return f"<traceq.{kind} {str(self.path)!r}{' (writable)' if self.write else ''}>"

    # --- what the store holds

    def traces(self) -> pl.DataFrame:
        """`traceq traces`: one row per loaded trace, oldest first (trace_id, name, format, tool,
        source_schema_version, gpus, kernel_count, span_ns, loaded_at, load_seconds, source_path,
        sha256, run: the run it is a rank of, structure: the conventions its structure was
        recorded with)."""
        from traceq.analysis.traces import list_traces

        return list_traces(self.con)

    def trace(self, ref: str | int | None = None) -> Trace:
        """The trace named `ref` (a name or an id; None: the latest loaded; a run's name: its
        rank 0's trace). Raises NotFoundError, listing what the store holds, when there is none."""
        trace_id, name = resolve_trace_or_run(self._finder(), None if ref is None else str(ref))
        return Trace(self, trace_id, name, con=None if self.dataset is None else self._over([trace_id]))

    def exported(self, ref: str | int | None = None) -> Trace | Run:
        """What `traceq export REF` writes: the trace `ref` names (a name or id; None: the latest
        loaded), else the run it names (every rank in one file). Raises NotFoundError as `trace`."""
        con = self._finder()
        try:
            return self.trace(resolve_trace(con, None if ref is None else str(ref))[0])
        except NotFoundError:
            if ref is None or first_row(con, "SELECT 1 FROM runs WHERE name = ?", [str(ref)]) is None:
                raise
        return self.run(ref)

    def _finder(self) -> duckdb.DuckDBPyConnection:
        """A connection to find traces and runs by: the store's; for a dataset, views over its
        traces, runs and ranks files alone (not every table of every trace)."""
        if self.dataset is None or self._con is not None:
            return self.con
        from traceq.dataset import open_dataset

        return open_dataset(self.dataset, tables=["traces", "runs", "ranks"])

    def sql(self, query: str) -> pl.DataFrame:
        """The result of one read-only SQL statement (SELECT, WITH, DESCRIBE, SHOW, EXPLAIN,
        SUMMARIZE, ...) on the store, run in a sandbox that reaches no file, URL or extension
        but the store (analysis/sql.py; docs/security.md); a statement that would change
        anything is refused with a TraceqError, as is one DuckDB cannot run (its message's
        first line)."""
        from traceq.analysis.sql import lock_down, read_only_query, sandboxed_store

        if self.dataset is not None:
            from traceq.dataset import open_dataset

            con = open_dataset(self.dataset)
            lock_down(con, allowed_directories=[self.dataset.resolve()])
        else:
            self.con  # noqa: B018 (opened first: waits for a writer's lock, says what a non-store is)
            if self.write:  # one process may not attach a file it holds open for writing
                self.close()
            con = sandboxed_store(self.path)
        try:
            return read_only_query(con, query)
        finally:
            con.close()

    # --- changing the store

    def load(self, path: str | Path, *, name: str | None = None, replace: bool = False,
             progress: Callable[[int, int], None] | None = None, python_functions: bool = False,
             engine: str | None = None, attribute: bool | None = None) -> Trace:
        """`traceq load`: load one trace file (one transaction: on any error the store is as it
        was, and a store this load would have created is not left behind) and return it.

        A file whose content is loaded already is not read again: its trace is returned, with
        `status` 'already_loaded' in `Trace.load_result` ('loaded' or 'replaced' otherwise).
        `name`, `replace`, `progress`, `python_functions`, `engine`, `attribute` (keep each
        launch's attribution: default up to 100M kernels): see `traceq.api.loading.load_trace`.
        Raises TraceFormatError for a file traceq cannot read, TraceqError for a name taken.
        """
        from traceq.api.loading import load_trace
        from traceq.ingest import READERS, reader_for

        path = Path(path)
        reader_for(path, READERS)  # reject bad input before the store is touched
        with self._loading() as con:
            result = load_trace(con, path, name=name, replace=replace, progress=progress, engine=engine,
                                python_functions=python_functions, attribute=attribute)
        trace = Trace(self, result.trace_id, result.name)
        trace.load_result = result
        return trace

    @contextmanager
    def _loading(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection that may write, for a load: the store is created when missing, and
        removed again when the load fails; read-only again at the next use unless `write`."""
        self._writable()
        existed = self.path.exists()
        self.close()  # a read-only connection cannot write: open one that can for the load
        con = self._open(read_only=False, create=True)
        size = self.path.stat().st_size
        try:
            yield con
        except BaseException:
            con.close()
            if not existed:
                _remove_store(self.path)
            else:  # what the rolled-back load wrote past the old end
                restore_size(self.path, size)
            raise
        if self.write:
            self._con = con
        else:
            con.close()

    def remove(self, ref: str | int) -> list[tuple[int, str]]:
        """`traceq rm`: delete the trace `ref` names and all its rows, or, where `ref` is the name
        of a run of several traces, the run and all its traces (one transaction; a rank of such
        a run goes with its run only: RunError). Returns the (trace_id, name) of each trace
        removed."""
        from traceq.analysis.multigpu.runs import remove

        return self._change(lambda con: remove(con, str(ref)))

    def attribute(self, ref: str | int | None = None) -> tuple[int, str]:
        """`traceq attribute`: compute the trace's kernel attribution with the default options
        and keep it in the store (`analysis.structure.stored`), so analyses read it instead of attributing
        on the fly; returns the trace's (trace_id, name)."""
        from traceq.analysis.structure.keep import attribute_trace

        def attribute(con: duckdb.DuckDBPyConnection) -> tuple[int, str]:
            trace_id, name = resolve_trace(con, None if ref is None else str(ref))
            attribute_trace(con, trace_id)
            return trace_id, name

        return self._change(attribute)

    def load_ncu(self, path: str | Path, into: str | int | None = None, *, extend: bool = False,
                 ncu_bin: str | None = None) -> NcuJoin:
        """`traceq load --ncu REPORT --into TRACE`: Nsight Compute's measured metrics of the
        launches it profiled, joined to the kernels of trace `into` (default: the latest loaded)
        and kept in `ncu_metrics` (one transaction; replaces the trace's earlier report).

        `path`: ncu's `--csv --page raw` output (plain or gzipped), or an `.ncu-rep` report,
        read through `ncu --import` (`ncu_bin`, $TRACEQ_NCU or `ncu` on PATH) into a cache
        folder beside the store. `extend`: the launches ncu did not profile take the measured
        values of their name and configuration (`analysis.efficiency.ncu`). The report is read
        whole before the store is touched: a damaged one raises TraceFormatError, the store
        unchanged; a trace that is not there raises NotFoundError."""
        from traceq.analysis.efficiency.ncu import join_ncu
        from traceq.ingest.ncu import read_ncu

        self._writable()
        if not self.path.exists():
            raise NotFoundError(f"{self.path}: no such store: load the trace first (`traceq load TRACE_FILE`), "
                                "then its Nsight Compute report with --ncu REPORT --into TRACE")
        report = read_ncu(Path(path), ncu_bin=ncu_bin, cache=self.path.with_name(self.path.name + ".ncu-cache"))

        def join(con: duckdb.DuckDBPyConnection) -> NcuJoin:
            trace_id, _ = resolve_trace(con, None if into is None else str(into))
            return join_ncu(con, trace_id, report, extend=extend)

        return self._change(join)

    def _change(self, change: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        """What change(con) returns, run in one transaction on a connection that may write."""
        self._writable()
        con = self.con if self.write else None
        if con is None:
            self.close()
            con = self._open(read_only=False)
        try:
            con.execute("BEGIN TRANSACTION")
            try:
                done = change(con)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("CHECKPOINT")
        finally:
            if not self.write:
                con.close()
        return done

    def report(self, traces: list[str | int | Trace] | None = None, *, k: int = 15, title: str | None = None,
               spec: str | Path | None = None, batch: int | None = None, iteration_regex: str | None = None) -> str:
        """`traceq report`: the HTML text of one self-contained report on `traces` (names, ids or
        Traces, side by side; default: the latest loaded; a run's name: its rank 0's trace, with
        the run's figures)."""
        from traceq.api.report import build_report

        ids = [t.id if isinstance(t, Trace) else self.trace(t).id for t in (traces or [None])]
        return build_report(self._over(self._with_ranks(ids)), ids, iteration_regex=_regex(iteration_regex), top_k=k,
                            title=title, spec=_path(spec), batch=batch)

    # --- runs: several traces as the ranks of one job (docs/multigpu.md)

    def run(self, ref: str | int | Trace | None = None) -> Run:
        """The run `ref` names: a run's name or id, a trace's name or id or a Trace (the run it
        is a rank of: a trace loaded alone is a run of its own), or None for the latest loaded.
        Raises NotFoundError, listing the runs, when there is none."""
        con = self._finder()
        if isinstance(ref, Trace):
            run_id, name = run_of_trace(con, ref.id, ref.name)
        else:
            try:
                run_id, name = resolve_run(con, None if ref is None else str(ref))
            except NotFoundError as e:
                raise NotFoundError(self._unmade(str(ref)) or str(e)) from None
        if self.dataset is None:
            return Run(self, run_id, name)
        return Run(self, run_id, name, con=self._over(_run_traces(con, run_id)))  # views over its traces' files alone

    def _with_ranks(self, ids: list[int]) -> list[int]:
        """`ids` and the traces of the other ranks of their runs (a report shows its run's
        figures): what a dataset's views are made over."""
        con = self._finder()
        return sorted({t for i in ids for t in _run_traces(con, run_of_trace(con, i)[0])} | set(ids))

    def _unmade(self, name: str) -> str | None:
        """Why a dataset's run `name` cannot be read yet, where it is one not made (None: it is
        no run of a dataset)."""
        if self.dataset is None:
            return None
        from traceq.dataset import read_catalog, read_runs

        run = next((r for r in read_runs(self.dataset) if r.name == name), None)
        if run is None:
            return None
        if run.status == "failed":
            return f"run {name!r} of {self.dataset} was not made: {run.error}"
        loaded = {e.trace_id for e in read_catalog(self.dataset) if e.status == "loaded"}
        return (f"run {name!r} of {self.dataset} has {len(loaded & set(run.trace_ids))} of its {len(run.trace_ids)} "
                "files loaded: load them again (`traceq load FILE... --run NAME --dataset PATH`) to complete it")

    def load_run(self, paths: list[str | Path], name: str, *, replace: bool = False,
                 progress: Callable[[int, int], None] | None = None, python_functions: bool = False,
                 engine: str | None = None) -> Run:
        """`traceq load --run NAME`: load the files (one per rank, or per node) as the ranks of
        the run `name`, in one transaction, their clocks aligned on collectives; return it, with
        `Run.load_results` one LoadResult per file (every one 'already_loaded' when these files
        are that run already). `replace` replaces a run of that name with all its traces;
        `progress` is called with (rows read, rows expected) over all files. Raises
        TraceFormatError for a file traceq cannot read, RunError for files that are not one
        job's ranks, TraceqError for a file loaded already outside the run (without `replace`).
        """
        from traceq.api.loading import load_run
        from traceq.ingest import READERS, reader_for

        paths = [Path(p) for p in paths]
        for path in paths:
            reader_for(path, READERS)  # reject bad input before the store is touched
        step = None if progress is None else (lambda i, done, total: progress(i * total + done, len(paths) * total))
        with self._loading() as con:
            results = load_run(con, paths, name, replace=replace, progress=step, engine=engine,
                               python_functions=python_functions)
            run_id, run_name = resolve_run(con, name)
        run = Run(self, run_id, run_name)
        run.load_results = results
        return run

    def _writable(self) -> None:
        """Raise TraceqError for a dataset: nothing but `load_dataset` changes one."""
        if self.dataset is not None:
            raise TraceqError(f"{self.dataset} is a dataset: it is read, not changed (`traceq load --dataset` "
                              "adds traces to it)")


def load_dataset(paths: list[str | Path], dataset: str | Path, *, run: str | None = None, scheduler: str | None = None,
                 workers: int | None = None, progress: Callable[[int, int], None] | None = None,
                 python_functions: bool = False, attribute: bool | None = None) -> DatasetLoad:
    """`traceq load --dataset`: load trace files into the Parquet dataset in the folder `dataset`
    (made when absent), one Dask task per file, on the Dask cluster at `scheduler` (an address,
    tcp://host:8786, or a scheduler file) or else on a local cluster of `workers` processes
    (default: one per core). Files already loaded are not read again, and none starts a cluster.
    `progress`, `python_functions`, `attribute`: as `Store.load`'s. `run`: the files are the
    ranks of the run of that name (`Store.load_run`'s), made once all of them are loaded, their
    clocks aligned (docs/scale-out.md).
    Returns what was loaded, skipped and failed (a failed file leaves nothing; loading the same
    files again loads only those, and completes the run), and the run as the catalog has it
    ('loaded', 'pending' while a rank is missing, 'failed' for files that are not one job's
    ranks); `open(dataset=...)` reads the dataset.

    Raises TraceFormatError for a file traceq cannot read and TraceqError for a name taken,
    before anything starts; TraceqError when Dask is not installed (`traceq-gpu[dask]`).
    """
    from traceq.api.datasets import DatasetLoad, dask_client, ensure_free, plan_load
    from traceq.api.datasets import load_dataset as load_on

    if scheduler is not None and workers is not None:
        raise TraceqError("workers start a local cluster: give a scheduler or workers, not both")
    plan = plan_load([Path(p) for p in paths], Path(dataset), run)  # bad input is refused before a cluster starts
    if not plan.todo:  # no cluster: at most the run to complete
        if plan.run is None or plan.run.status == "loaded":
            return DatasetLoad([], plan.skipped, [], 0.0, 0, plan.run)
        return load_on(None, plan)
    ensure_free(Path(dataset))
    with dask_client(scheduler, workers) as client:
        return load_on(client, plan, progress=progress, python_functions=python_functions, attribute=attribute)


def _what_it_is(error: NotAStoreError) -> StoreError:
    """The error for a file that is no store: when it is a trace, say so and how to load it."""
    from traceq.ingest import READERS, reader_for

    try:
        reader = reader_for(error.path, READERS)
    except TraceqError:
        return error
    return StoreError(f"{error.path} is a trace ({reader.name}), not a traceq store: load it with "
                      f"`traceq load {error.path}`, then query the store it goes into "
                      f"({DEFAULT_STORE}, or the one --db names)")
