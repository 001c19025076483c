"""traceq from Python: a store of traces, and one method per `traceq` command.

    import traceq

    store = traceq.open("traceq.duckdb")          # read-only unless it loads
    t = store.trace("alexnet_b256_cudnn")         # a name, an id, or None for the latest loaded
    t.layers()                                    # a polars DataFrame: what `traceq layers` prints

Every `Trace` method is one command's analysis with the command's options as keywords, and
returns what the command prints as a `polars.DataFrame` (its columns are csv and json's: times
in ns, sizes in bytes, shares as fractions); `traceq.cli` calls these methods and renders what
they return, so the numbers are the same. Errors are `traceq.TraceqError`s with a one-line
message; notes a command prints on stderr (`traceq: note: ...`) are `traceq.TraceqWarning`s.

Nothing here imports polars until an analysis needs it: `traceq top` runs on this module in a
fraction of a second.
"""

from __future__ import annotations

import shlex
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceq.analysis.choices import (CommBy, CompareBy, GroupBy, IdleBy, MemoryBy, NameBy, RanksBy, StatsReport,
                                    TrafficBy)
from traceq.errors import NotFoundError, TraceqError, TraceqWarning
from traceq.store import (default_store_path, first_row, open_store, resolve_run, resolve_trace, resolve_trace_or_run,
                          restore_size, run_of_trace, side_by_side)

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from traceq.analysis.gate import GateResult
    from traceq.analysis.gpu_products import GpuProduct
    from traceq.analysis.idle import IdleTotals
    from traceq.ingest import LoadResult
    from traceq.ingest.parallel import DatasetLoad

AUTO_CONTEXT_MAX_KERNELS = 1_000_000
"""Above this many kernels `top` gives the library column alone unless asked for `context`."""

_ATTRIBUTION_ANALYSES = {"attributed": "attributed_kernels", "launch_groups": "launch_groups",
                         "stages": "stage_times"}
"""What `Trace` keeps of each launch's attribution: kind -> the function of `analysis.layers` (con,
trace id, iteration regex) that makes it."""


def open(path: str | Path | None = None, *, write: bool = False,  # noqa: A001 (traceq.open)
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
        sha256, run: the run it is a rank of)."""
        from traceq.analysis.traces import list_traces

        return list_traces(self.con)

    def trace(self, ref: str | int | None = None) -> Trace:
        """The trace named `ref` (a name or an id; None: the latest loaded; a run's name: its
        rank 0's trace). Raises NotFoundError, listing what the store holds, when there is none."""
        trace_id, name = resolve_trace_or_run(self._finder(), None if ref is None else str(ref))
        return Trace(self, trace_id, name, con=None if self.dataset is None else self._over([trace_id]))

    def _finder(self) -> duckdb.DuckDBPyConnection:
        """A connection to find traces and runs by: the store's; for a dataset, views over its
        traces, runs and ranks files alone (not every table of every trace)."""
        if self.dataset is None or self._con is not None:
            return self.con
        from traceq.dataset import open_dataset

        return open_dataset(self.dataset, tables=["traces", "runs", "ranks"])

    def sql(self, query: str) -> pl.DataFrame:
        """The result of one read-only SQL statement (SELECT, WITH, DESCRIBE, SHOW, EXPLAIN,
        SUMMARIZE, ...) on the store; a statement that would change it is refused with a
        TraceqError, as is one DuckDB cannot run (its message's first line)."""
        from traceq.analysis.sql import read_only_query

        return read_only_query(self.con, query)

    # --- changing the store

    def load(self, path: str | Path, *, name: str | None = None, replace: bool = False,
             progress: Callable[[int, int], None] | None = None, python_functions: bool = False,
             engine: str | None = None, attribute: bool | None = None) -> Trace:
        """`traceq load`: load one trace file (one transaction: on any error the store is as it
        was, and a store this load would have created is not left behind) and return it.

        A file whose content is loaded already is not read again: its trace is returned, with
        `status` 'already_loaded' in `Trace.load_result` ('loaded' or 'replaced' otherwise).
        `name`, `replace`, `progress`, `python_functions`, `engine`, `attribute` (keep each
        launch's attribution: default up to 1M kernels): see `traceq.ingest.load_trace`.
        Raises TraceFormatError for a file traceq cannot read, TraceqError for a name taken.
        """
        from traceq.ingest import READERS, load_trace, reader_for

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
        from traceq.ingest.runs import remove

        return self._change(lambda con: remove(con, str(ref)))

    def attribute(self, ref: str | int | None = None) -> tuple[int, str]:
        """`traceq attribute`: compute the trace's kernel attribution with the default options
        and keep it in the store (`analysis.stored`), so analyses read it instead of attributing
        on the fly; returns the trace's (trace_id, name)."""
        from traceq.analysis.stored import attribute_trace

        def attribute(con: duckdb.DuckDBPyConnection) -> tuple[int, str]:
            trace_id, name = resolve_trace(con, None if ref is None else str(ref))
            attribute_trace(con, trace_id)
            return trace_id, name

        return self._change(attribute)

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
        from traceq.render.report import build_report

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
        from traceq.ingest import READERS, load_run, reader_for

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
    before anything starts; TraceqError when Dask is not installed (`traceq[dask]`).
    """
    from traceq.ingest.parallel import DatasetLoad, dask_client, load_dataset as load_on, plan_load

    if scheduler is not None and workers is not None:
        raise TraceqError("workers start a local cluster: give a scheduler or workers, not both")
    plan = plan_load([Path(p) for p in paths], Path(dataset), run)  # bad input is refused before a cluster starts
    if not plan.todo:  # no cluster: at most the run to complete
        if plan.run is None or plan.run.status == "loaded":
            return DatasetLoad([], plan.skipped, [], 0.0, 0, plan.run)
        return load_on(None, plan)
    with dask_client(scheduler, workers) as client:
        return load_on(client, plan, progress=progress, python_functions=python_functions, attribute=attribute)


def _run_traces(con: duckdb.DuckDBPyConnection, run_id: int) -> list[int]:
    return [int(t) for (t,) in con.execute("SELECT DISTINCT trace_id FROM ranks WHERE run_id = ?", [run_id]).fetchall()]


def _remove_store(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".wal")):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def _regex(value: str | None) -> str:
    from traceq.analysis.attribution import ITERATION_REGEX

    return ITERATION_REGEX if value is None else value


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


def _note(message: str) -> None:
    warnings.warn(message, TraceqWarning, stacklevel=3)


class Trace:
    """One trace of a store, and one method per `traceq` command on it.

    Methods take the command's options as keywords (`by`, `k`, `spec`, `iteration_regex`, ...)
    and return a polars DataFrame with the columns csv and json give; `.to_pandas()` turns one
    into a pandas DataFrame where pandas is installed. Intermediate results (the NVTX attribution
    of every launch, the FLOPs of every kernel) are kept for the last options asked, so `layers()`
    then `libs()` attribute the launches once.
    """

    def __init__(self, store: Store, trace_id: int, name: str, con: duckdb.DuckDBPyConnection | None = None):
        """`con`: a connection of its own (a dataset's views over this trace's files), else the store's."""
        self.store = store
        self.id = trace_id
        self.name = name
        self.load_result: LoadResult | None = None
        self._con = con
        self._kept: dict[str, tuple[tuple, object]] = {}

    def __repr__(self) -> str:
        return f"<traceq.Trace {self.id} {self.name!r}>"

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self.store.con if self._con is None else self._con

    def _kept_value(self, kind: str, key: tuple) -> Any:
        """What `_keep` kept for `kind` under `key`, or None."""
        kept = self._kept.get(kind)
        return kept[1] if kept is not None and kept[0] == key else None

    def _keep(self, kind: str, key: tuple, make: Callable[[], Any]) -> Any:
        """make(), kept for the next call with the same `kind` and `key` (one per kind)."""
        kept = self._kept_value(kind, key)
        if kept is not None:
            return kept
        value = make()
        self._kept[kind] = (key, value)
        return value

    # --- facts about the trace

    def info(self) -> dict[str, object]:
        """The trace's row of `traces()`."""
        columns = [d[0] for d in self.con.execute("SELECT * FROM traces LIMIT 0").description]
        row = first_row(self.con, "SELECT * FROM traces WHERE trace_id = ?", [self.id])
        return dict(zip(columns, row or ()))

    def kernel_time_ns(self) -> int:
        """All kernel time of the trace, ns."""
        from traceq.analysis.kernels import kernel_time_total

        return kernel_time_total(self.con, self.id)

    def iterations(self, *, iteration_regex: str | None = None) -> int:
        """How many iterations the trace's kernels ran in (0: it marks none)."""
        from traceq.analysis.compare import iteration_count

        return iteration_count(self._launch_groups(iteration_regex))

    def per_iteration(self, other: Trace, by: CompareBy | str = CompareBy.layer, *,
                      iteration_regex: str | None = None) -> bool:
        """Whether `compare(other, by)` gives times per iteration (both traces mark iterations)
        rather than totals."""
        if CompareBy(by) is CompareBy.stage:
            return all(s["iteration"].drop_nulls().len() > 0
                       for s in (self._stages(iteration_regex), other._stages(iteration_regex)))
        return self.iterations(iteration_regex=iteration_regex) > 0 < other.iterations(iteration_regex=iteration_regex)

    def gpu(self) -> dict[str, object]:
        """The GPU that ran the most kernel time: name, sm_count, clock_hz, peak_<precision>
        (FLOP/s, for fp64 ... int8), description."""
        from traceq.analysis.efficiency import busiest_gpu

        return busiest_gpu(self.con, self.id)

    def _attributed(self, iteration_regex: str | None) -> pl.DataFrame:
        return self._attribution("attributed", iteration_regex)

    def _launch_groups(self, iteration_regex: str | None) -> pl.DataFrame:
        return self._attribution("launch_groups", iteration_regex)

    def _stages(self, iteration_regex: str | None) -> pl.DataFrame:
        return self._attribution("stages", iteration_regex)

    def _groups(self, iteration_regex: str | None) -> pl.DataFrame:
        from traceq.analysis.layers import kernel_groups_of

        key = (_regex(iteration_regex), _rules_key())  # summed from the launch groups `compare` and `ru` read too
        return self._keep("groups", key, lambda: kernel_groups_of(self._launch_groups(iteration_regex)))

    def _attribution(self, kind: str, iteration_regex: str | None,
                     con: duckdb.DuckDBPyConnection | None = None) -> Any:
        """`_keep` of an analysis of the launches' NVTX attribution (`_ATTRIBUTION_ANALYSES`:
        kind -> the function of `analysis.layers`), on `con` (a cursor of its own) or the trace's
        connection. Where a big trace's store keeps none that `traceq attribute` could keep, a
        note says so first."""
        regex = _regex(iteration_regex)

        def made() -> Any:
            from traceq.analysis import layers
            from traceq.analysis.attribution import ITERATION_REGEX
            from traceq.analysis.stored import LOAD_MAX_KERNELS, fingerprint, is_kept

            on = con or self.con
            kernels = first_row(on, "SELECT kernel_count FROM traces WHERE trace_id = ?", [self.id])[0] or 0
            if (kernels > LOAD_MAX_KERNELS and self._con is None and regex == ITERATION_REGEX
                    and fingerprint() is not None and not is_kept(on, self.id, regex)):
                _note(f"{self.name}: attributing {kernels:,} kernels to their NVTX ranges, about a second a "
                      f"million; `traceq attribute {shlex.quote(self.name)}` keeps the attribution for the next "
                      "commands")
            return getattr(layers, _ATTRIBUTION_ANALYSES[kind])(on, self.id, regex)

        return self._keep(kind, (regex, _rules_key()), made)

    def _both(self, other: Trace, kind: str, iteration_regex: str | None) -> tuple[Any, Any]:
        """`_attribution(kind)` of this trace and of `other`, at once where neither has it at
        hand (`store.side_by_side`)."""
        key = (_regex(iteration_regex), _rules_key())
        if other is self or self._kept_value(kind, key) is not None or other._kept_value(kind, key) is not None:
            return self._attribution(kind, iteration_regex), other._attribution(kind, iteration_regex)
        return side_by_side(other.con, lambda _: self._attribution(kind, iteration_regex),
                            lambda cursor: other._attribution(kind, iteration_regex, cursor))

    # --- one method per command

    def top(self, k: int = 15, by: NameBy | str = NameBy.demangled, *, instances: bool = False,
            context: bool | None = None) -> pl.DataFrame:
        """`traceq top`: the k heaviest kernels by total time, as `nsys stats`' cuda_gpu_kern_sum
        (rank, instances, total_ns, pct, avg_ns, median_ns, min_ns, max_ns, stddev_ns, name), with
        layer, pass and library (`context`; default: up to 1M kernels, the library alone above);
        with `instances`, the k longest launches."""
        relation = self.top_relation(k, by, instances=instances, context=context)
        return relation.pl()

    def top_relation(self, k: int = 15, by: NameBy | str = NameBy.demangled, *, instances: bool = False,
                     context: bool | None = None) -> duckdb.DuckDBPyRelation:
        """`top` as a DuckDB relation: where no layer context is joined, the rows come straight
        from the store and nothing imports polars (how `traceq top` stays fast)."""
        from traceq.analysis.kernels import top_instances_relation, top_kernels_relation

        by = NameBy(by)
        attribute = context
        if context is None:  # NVTX attribution costs about a second per million kernels; names cost nothing
            kernels = first_row(self.con, "SELECT kernel_count FROM traces WHERE trace_id = ?", [self.id])[0] or 0
            attribute = kernels <= AUTO_CONTEXT_MAX_KERNELS
            if not attribute:
                _note(f"{kernels:,} kernels: layer and pass columns left out "
                      "(NVTX attribution takes a while at this size); --context adds them")
        if instances:
            launches = top_instances_relation(self.con, self.id, k)
            if attribute:
                return self._relation(_with_instance_context(launches.pl(), self._attributed(None)))
            return launches if context is False else _with_library(self.con, launches)
        ranking = top_kernels_relation(self.con, self.id, k, by)
        if context is False:
            return ranking
        if attribute:
            return self._relation(_with_kernel_context(ranking.pl(), self._groups(None), by))
        return _with_library(self.con, ranking)

    def _relation(self, frame: pl.DataFrame) -> duckdb.DuckDBPyRelation:
        return self.con.from_arrow(frame.to_arrow())

    def layers(self, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq layers`: GPU time per layer and pass (layer, pass, kernels, total_ns, pct,
        heaviest, libraries, attribution), heaviest first."""
        from traceq.analysis.layers import layer_times

        return layer_times(self.con, self.id, groups=self._groups(iteration_regex))

    def attribution_shares(self, *, iteration_regex: str | None = None) -> dict[str, float]:
        """Share of all kernel time (%) inside a layer range ('range'), placed in a layer by a
        rule ('rule') and in no layer ('none'): the title of `traceq layers`."""
        from traceq.analysis.layers import attribution_shares

        return attribution_shares(self._groups(iteration_regex))

    def libs(self, *, by_layer: bool = False, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq libs`: GPU time per library ([layer, pass,] library, kernels, total_ns, pct,
        operations, implementations), heaviest first."""
        from traceq.analysis.layers import library_times

        return library_times(self.con, self.id, by_layer, groups=self._groups(iteration_regex))

    def stages(self, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq stages`: GPU time per iteration and device in each training stage, span, busy
        and idle time."""
        return self._stages(iteration_regex)

    def kernels(self, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """Every kernel launch, in kernel_id order, with its NVTX context, classification,
        precision and occupancy: kernel_id, device_id, stream_id, start_ns, dur_ns, name,
        short_name, layer, pass, iteration, stage, attribution, library, implementation,
        operation, precision, precision_from, tensor_cores, grid_blocks, block_threads,
        registers_per_thread, smem_static_bytes, smem_dynamic_bytes, blocks_per_sm, limiter,
        occupancy, waves, ru. RU columns are null (with a note) where the trace's GPU is not
        described or not NVIDIA's."""
        from traceq.analysis.efficiency import kernel_launch_table

        return kernel_launch_table(self.con, self.id, self._attributed(iteration_regex), note=_note)

    def ru(self, by: GroupBy | str = GroupBy.kernel, *, k: int | None = None, cc: str | None = None,
           sms: int | None = None, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq ru`: occupancy and resource utilization per kernel name, layer or library,
        heaviest first (`k`: only the first k rows)."""
        from traceq.analysis.efficiency import ru_table

        by = GroupBy(by)  # by layer the launches' attribution is needed (by kernel or library, rarely)
        groups = self._launch_groups(iteration_regex) if by is GroupBy.layer else None
        frame = ru_table(self.con, self.id, by, cc=cc, sms=sms, iteration_regex=_regex(iteration_regex),
                         groups=groups)
        return frame if k is None else frame.head(k)

    def _kernel_ce(self, spec: str | Path | None, batch: int | None, precision: str | None,
                   iteration_regex: str | None) -> pl.DataFrame:
        from traceq.analysis.efficiency import kernel_ce

        precision = None if precision is None else getattr(precision, "value", precision)
        return self._keep("ce", (str(spec), batch, precision, _regex(iteration_regex), _rules_key()),
                          lambda: kernel_ce(self.con, self.id, spec=_path(spec), batch=batch, precision=precision,
                                            iteration_regex=_regex(iteration_regex),
                                            kernels=self._attributed(iteration_regex)))

    def ce(self, by: GroupBy | str = GroupBy.layer, *, spec: str | Path | None = None, batch: int | None = None,
           precision: str | None = None, k: int | None = None, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq ce`: compute efficiency per layer and pass, kernel name or library, most FLOPs
        first; FLOPs from the trace's recorded shapes or a model spec (`spec`). Notes (spec
        layers without kernels, assumed precisions) come as TraceqWarnings."""
        from traceq.analysis.efficiency import ce_notes, ce_table

        per_kernel = self._kernel_ce(spec, batch, precision, iteration_regex)
        frame = ce_table(self.con, self.id, GroupBy(by), per_kernel=per_kernel)
        for note in ce_notes(per_kernel):
            _note(note)
        return frame if k is None else frame.head(k)

    def traffic(self, by: TrafficBy | str = TrafficBy.layer, *, gpu: str | None = None,
                spec: str | Path | None = None, batch: int | None = None, k: int | None = None,
                iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq traffic`: DeLTA's traffic model of every convolution and GEMM launch beside
        its measured time, per layer and pass or per kernel name (`gpu`: predict on another GPU)."""
        from traceq.analysis.traffic import traffic_table

        frame = traffic_table(self.con, self.id, TrafficBy(by), spec=_path(spec), batch=batch, gpu=gpu,
                              iteration_regex=_regex(iteration_regex), kernels=self._attributed(iteration_regex))
        return frame if k is None else frame.head(k)

    def traffic_gpu(self, gpu: str | None = None) -> GpuProduct:
        """The GPU `traffic` predicts on: the product `gpu` names, else the trace's own."""
        from traceq.analysis.gpu_products import gpu_product, trace_gpu

        return gpu_product(gpu) if gpu else trace_gpu(self.con, self.id)

    def memory(self, by: MemoryBy | str = MemoryBy.layer, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq memory`: device memory allocated per device, layer and pass (`by='layer'`), or
        in use after each allocation and free (`by='time'`)."""
        from traceq.analysis.memory import memory_by_layer, memory_timeline

        analysis = memory_by_layer if MemoryBy(by) is MemoryBy.layer else memory_timeline
        return analysis(self.con, self.id, _regex(iteration_regex))

    def memory_peaks(self, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """Per device: its memory, the peak in use and when, allocations, what was allocated
        before the capture (the title of `traceq memory`)."""
        from traceq.analysis.memory import memory_summary

        return memory_summary(self.con, self.id, _regex(iteration_regex))

    def compare(self, other: Trace | str | int, by: CompareBy | str = CompareBy.layer, *,
                spec: str | Path | None = None, k: int | None = None,
                iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq compare`: this trace (a) and `other` (b) side by side per layer, kernel name,
        library or stage: GPU time (per iteration when both mark iterations), b - a, b / a, RU
        and, with FLOPs for both, TFLOP/s and CE."""
        from traceq.analysis.compare import compare_runs

        b = other if isinstance(other, Trace) else self.store.trace(other)
        if CompareBy(by) is CompareBy.stage:
            done = {"stages": self._both(b, "stages", iteration_regex)}
        else:
            key = (_regex(iteration_regex), _rules_key())  # CE reads attributed kernels: those in hand, else its own
            done = {"groups": self._both(b, "launch_groups", iteration_regex),
                    "kernels": (self._kept_value("attributed", key), b._kept_value("attributed", key))}
        frame, _ = compare_runs(self.store._over([self.id, b.id]), self.id, b.id, CompareBy(by), spec=_path(spec),
                                iteration_regex=_regex(iteration_regex), **done)
        return frame if k is None else frame.head(k)

    def gate(self, other: Trace | str | int, threshold: float = 0.05, *,
             iteration_regex: str | None = None) -> GateResult:
        """`traceq compare A B --gate`: whether `other`'s (b's) iterations are slower than this
        trace's (a's) by more than `threshold` (a fraction: 0.05 for 5%) and beyond their noise
        (a one-sided Mann-Whitney test over iterations). The result's `failed` is the verdict
        (the CLI exits 3 when it holds), `verdict` its one line; it never raises for a slower b."""
        from traceq.analysis.gate import regression_gate

        b = other if isinstance(other, Trace) else self.store.trace(other)
        key = (_regex(iteration_regex), _rules_key())
        stages = [t._kept_value("stages", key) for t in (self, b)]  # else the spans alone (`gate.iteration_times`)
        return regression_gate(self.store._over([self.id, b.id]), self.id, b.id, threshold,
                               iteration_regex=_regex(iteration_regex),
                               stages=tuple(stages) if all(s is not None for s in stages) else None)

    def _gaps(self, iteration_regex: str | None) -> tuple[pl.DataFrame, dict[str, pl.Series]]:
        from traceq.analysis.gaps import gap_frame

        regex = _regex(iteration_regex)
        return self._keep("gaps", (regex,), lambda: gap_frame(self.con, self.id, regex))

    def _idle(self, iteration_regex: str | None) -> tuple[pl.DataFrame, IdleTotals]:
        from traceq.analysis.idle import idle_causes

        regex = _regex(iteration_regex)
        return self._keep("idle", (regex,), lambda: idle_causes(self.con, self.id, regex,
                                                                 self._gaps(iteration_regex)))

    def idle(self, by: IdleBy | str | None = None, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq idle`: GPU idle time per cause (cause, gaps, total_ns, pct, span_pct,
        per_iteration_ns, longest_ns, call_shares, work_shares); with `by` ('iteration', 'stream'
        or 'layer'), each cause's time split by that key of the work that waited."""
        if by is None:
            return self._idle(iteration_regex)[0]
        from traceq.analysis.idle import idle_split

        return idle_split(self.con, self.id, IdleBy(by), _regex(iteration_regex), self._gaps(iteration_regex))

    def idle_totals(self, *, iteration_regex: str | None = None) -> IdleTotals:
        """The devices' span, all idle time, iterations and devices (the title of `traceq idle`
        and `traceq advise`)."""
        regex = _regex(iteration_regex)
        if (idle := self._kept_value("idle", (regex,))) is not None:  # idle() or advise() had them
            return idle[1]
        from traceq.analysis.idle import idle_totals

        return self._keep("idle_totals", (regex,), lambda: idle_totals(self.con, self.id, regex,
                                                                        self._gaps(iteration_regex)))

    def _launches(self) -> tuple[pl.DataFrame, dict[str, float]]:
        from traceq.analysis.launches import launch_table

        return self._keep("launches", (), lambda: launch_table(self.con, self.id))

    def launches(self, *, k: int | None = None) -> pl.DataFrame:
        """`traceq launches`: launch cost per kernel name, most launch-call time first (launches,
        api_ns, api_avg_ns, queue_avg_ns, kernel_ns, kernel_avg_ns, tiny, tiny_pct, name)."""
        frame = self._launches()[0]
        return frame if k is None else frame.head(k)

    def launch_totals(self) -> dict[str, float]:
        """All launches, their call and kernel time, the tiny ones (the title of `traceq launches`):
        launches, api_ns, kernel_ns, tiny, tiny_pct, tiny_kernel_ns, graph."""
        return self._launches()[1]

    def stats(self, report: StatsReport | str) -> pl.DataFrame:
        """`traceq stats --report REPORT`: the rows of that `nsys stats` report (docs/stats.md)."""
        from traceq.analysis.stats import stats_report

        return stats_report(self.con, self.id, getattr(report, "value", report))

    def advise(self, *, iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq advise`: findings, most GPU time at stake first (rank, title, time_ns, pct,
        evidence, fix, rule); `idle_totals()` gives the span they are measured against."""
        from traceq.analysis.advise import advise

        return advise(self.con, self.id, _regex(iteration_regex), idle=lambda: self._idle(iteration_regex),
                      launches=self._kept_value("launches", ()))[0]  # else read beside the idle analysis

    def export(self, path: str | Path, *, format: str = "perfetto",  # noqa: A002 (the CLI's --format)
               progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
        """`traceq export`: write the trace as Chrome trace events (`format='perfetto'`: the JSON
        Perfetto and chrome://tracing open; gzip-compressed when `path` ends in .gz): kernels and
        memory operations per GPU and stream, CUDA API calls and NVTX ranges per thread, flows
        from each launch to its kernel, kernels' layer, pass, stage and library in their args.
        Written as it is read, a batch at a time. Returns the events written per kind."""
        from traceq.export import write_chrome_trace

        if format != "perfetto":
            raise TraceqError(f"export: unknown format {format!r} (perfetto)")
        from traceq.analysis.stored import is_kept

        attribution = None if is_kept(self.con, self.id) else self._attributed(None)  # kept: joined in DuckDB
        return write_chrome_trace(self.con, self.id, Path(path), attribution, progress=progress)


class Run:
    """One run of a store: the ranks of one job (one trace per rank or node, or one trace's
    processes and GPUs) on one clock, and one method per multi-GPU command on it (docs/multigpu.md).
    Use `Store.run` or `Store.load_run`.

    `world_size` is its number of ranks, `clock` how their times were put on one clock ('one
    trace', or 'collective ends': each rank file shifted so the collectives it shares with rank
    0's end when rank 0's do), `max_shift_ns` the largest shift applied. Methods take the
    command's options as keywords and return polars DataFrames with the columns csv and json
    give; `progress`, where taken, is called with (steps done, steps) over the run's traces.
    """

    def __init__(self, store: Store, run_id: int, name: str, *, con: duckdb.DuckDBPyConnection | None = None):
        """`con`: a connection of its own (a dataset's views over the run's traces' files), else the store's."""
        self.store = store
        self.id = run_id
        self.name = name
        self.load_results: list[LoadResult] | None = None
        self._con = con
        world, clock, shift = first_row(self.con, "SELECT world_size, clock, max(abs(k.shift_ns)) FROM runs "
                                        "JOIN ranks k USING (run_id) WHERE run_id = ? GROUP BY ALL", [run_id])
        self.world_size, self.clock, self.max_shift_ns = int(world), str(clock), int(shift)

    def __repr__(self) -> str:
        return f"<traceq.Run {self.id} {self.name!r} ({self.world_size} ranks)>"

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self.store.con if self._con is None else self._con

    def traces(self) -> list[Trace]:
        """The run's traces, by their first rank."""
        rows = self.con.execute("SELECT k.trace_id, any_value(t.name) FROM ranks k JOIN traces t USING (trace_id) "
                                "WHERE k.run_id = ? GROUP BY 1 ORDER BY min(k.rank)", [self.id]).fetchall()
        over = (lambda t: None) if self.store.dataset is None else (lambda t: self.store._over([t]))
        return [Trace(self.store, int(t), str(n), con=over(int(t))) for t, n in rows]

    def comm(self, by: CommBy | str = CommBy.rank, *, iteration_regex: str | None = None,
             progress: Callable[[int, int], None] | None = None) -> pl.DataFrame:
        """`traceq comm`: collective communication per collective, iteration and rank (`by='rank'`),
        or per collective instance across ranks (`by='instance'`): time, bytes, algorithm and
        bus bandwidth, skew (`analysis.comm.comm_table`)."""
        from traceq.analysis.comm import comm_table

        return comm_table(self.con, self.id, CommBy(by).value, _regex(iteration_regex), progress)

    def overlap(self, *, iteration_regex: str | None = None,
                progress: Callable[[int, int], None] | None = None) -> pl.DataFrame:
        """`traceq overlap`: per rank and iteration, computation, communication, the share of it
        hidden under computation, exposed communication and idle time (`analysis.overlap`)."""
        from traceq.analysis.overlap import overlap_table

        return overlap_table(self.con, self.id, _regex(iteration_regex), progress)

    def ranks(self, by: RanksBy | str = RanksBy.iteration, *, k: int = 10, iteration_regex: str | None = None,
              progress: Callable[[int, int], None] | None = None) -> pl.DataFrame:
        """`traceq ranks`: iteration time, wait, work and shift per iteration and rank
        (`by='iteration'`), or the `k` collectives that started latest on their last rank and
        what delayed them (`by='collective'`) (`analysis.ranks`)."""
        from traceq.analysis.ranks import late_collectives, rank_iterations

        if RanksBy(by) is RanksBy.collective:
            return late_collectives(self.con, self.id, k, _regex(iteration_regex), progress)
        return rank_iterations(self.con, self.id, _regex(iteration_regex), progress)

    def compare(self, other: Run | str | int, by: CompareBy | str = CompareBy.layer, *, k: int | None = None,
                iteration_regex: str | None = None) -> pl.DataFrame:
        """`traceq compare A B` on runs of different GPU counts: GPU time per GPU and iteration
        side by side, with weak-scaling efficiency (`analysis.scaling.compare_scaling`)."""
        from traceq.analysis.scaling import compare_scaling

        other = other if isinstance(other, Run) else self.store.run(other)
        both = self.store._over([t for r in (self, other) for t in _run_traces(r.con, r.id)])  # a dataset: their files
        frame = compare_scaling(both, self.id, other.id, by, _regex(iteration_regex))
        return frame if k is None else frame.head(k)


def _rules_key() -> object:
    """What the kernel rules in force depend on (analyses keep results per rules file)."""
    from traceq.analysis.classify import default_rules

    return id(default_rules())


def _with_library(con: duckdb.DuckDBPyConnection, ranking: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """The library column alone: the names in `ranking` (a few rows) classified, no attribution."""
    from traceq.analysis.classify import classify

    names = list(dict.fromkeys(name for (name,) in ranking.project("name").fetchall()))
    if not names:
        return ranking.project("*, NULL::VARCHAR AS library")
    values = ", ".join(["(?, ?)"] * len(names))  # joined in DuckDB: the ranking stays a relation
    libraries = con.sql(f"SELECT * FROM (VALUES {values}) AS l(name, library)",
                        params=[value for name in names for value in (name, classify(name).library)])
    return ranking.join(libraries, "name", how="left").order("rank")


def _with_kernel_context(frame: pl.DataFrame, groups: pl.DataFrame, by: NameBy) -> pl.DataFrame:
    from traceq.analysis.layers import names_context

    column = {NameBy.demangled: "name", NameBy.short: "short_name"}.get(by)
    if column is None:  # mangled names: no layer context
        return frame
    return frame.join(names_context(groups, column), on="name", how="left", maintain_order="left")


def _with_instance_context(frame: pl.DataFrame, attributed: pl.DataFrame) -> pl.DataFrame:
    context = attributed.select("kernel_id", "layer", "pass", library="implementation")
    joined = frame.join(context, on="kernel_id", how="left", maintain_order="left")
    first = ["rank", "layer", "pass", "name", "dur_ns"]  # the paper's Table 3: layer, function, time
    return joined.select(*first, *[c for c in joined.columns if c not in first])


def occupancy(cc: str, threads: int, regs: int, *, smem_static: int = 0, smem_dynamic: int = 0,
              carveout: int | None = None, opt_in: bool = False, grid: int | None = None,
              sms: int | None = None) -> dict[str, object]:
    """`traceq occupancy`: the offline occupancy calculator for one launch shape on compute
    capability `cc` ('9.0'): blocks_per_sm, limit_<resource>, limiter, occupancy, and with
    `grid` and `sms` waves and ru."""
    from traceq.analysis.gpu_specs import limits_for_cc
    from traceq.analysis.occupancy import occupancy_dict

    major, _, minor = cc.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise TraceqError(f"{cc!r} is not a compute capability like 9.0")
    return occupancy_dict(threads, regs, limits_for_cc(int(major), int(minor)), static_smem=smem_static,
                          dynamic_smem=smem_dynamic, carveout=carveout, opt_in=opt_in, grid_blocks=grid, sms=sms)


def use_rules(path: str | Path | None) -> None:
    """Put the kernel rules of a TOML file (the format of analysis/kernel_rules.toml) in front
    of the packaged ones for every analysis after this call, as `traceq --rules FILE` does
    (None: back to $TRACEQ_RULES or none). Raises TraceqError for a bad file."""
    from traceq.analysis.classify import use_rules as choose

    choose(path)


__all__ = ["AUTO_CONTEXT_MAX_KERNELS", "Store", "Trace", "load", "load_dataset", "occupancy", "open", "use_rules"]
