"""Loading many trace files in parallel on Dask into a dataset (traceq.dataset).

The coordinator (`load_dataset`) gives each file its trace id before anything runs, records the
plan in the catalog, and submits one task per file; a task (`load_rank`, on a Dask worker) reads
the file with the usual readers into a private temporary store, exactly as `traceq load` would,
and writes its tables as that trace's Parquet files. The coordinator alone writes the catalog, as
each task ends. A task that fails, or whose worker dies, leaves its trace 'failed' in the catalog
and no Parquet file; loading the same files again into the dataset does only those not loaded.

Files loaded as the ranks of one run (`run=`): the run is recorded 'pending' with its trace ids
at the start, and once every one of its traces is loaded the coordinator aligns their clocks and
writes the run's ranks (`dataset.write_run`); until then each loaded rank reads as a trace of its
own, and loading the same files again completes it. What the run needs of each rank (its rank
facts and communication kernels: `runs.RankSummary`) is computed by the task that loaded it and
written beside its tables (SUMMARY_FILES), so the coordinator reads a few small files per rank
instead of each rank's tables; a trace without them (loaded by an older traceq) is read as before.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from traceq.dataset import (
    CatalogEntry,
    RunEntry,
    catalog_of,
    partial_dir,
    trace_dir,
    write_catalog,
    write_run,
    write_trace,
)
from traceq.errors import StoreError, TraceqError
from traceq.store import SCHEMA_VERSION, connect, few_rows, first_row, schema_sql

if TYPE_CHECKING:
    from traceq.analysis.multigpu.runs import RankSummary

RANK_SETTINGS = {"threads": "1", "memory_limit": "500MB"}
"""DuckDB settings of a worker's private store (`worker_store`): one Dask worker is one core's work
(the load itself runs under ingest.LOAD_SETTINGS), and its memory stays well under a worker's
share. Given when the database is made, so that DuckDB starts no threads of its own."""

SUMMARY_FILES = ("run_summary.json", "run_comm.parquet")
"""A loaded rank's RankSummary, beside its tables (no store table has these names)."""

WORKER_ENV = {"POLARS_MAX_THREADS": "1"}
"""A Dask worker's environment for its tasks: one thread, as a task is one core's work. Polars
otherwise starts a thread per core in each worker process, and on a machine of many cores the
workers' threads compete for them: a rank file's hundreds of small Polars operations then cost
more CPU time (docs/scale-out.md, "Per-file cost"). Set in a local cluster's workers, and by
`load_rank` before it first imports Polars in a worker process of a cluster started elsewhere
(where the worker's own setting wins)."""

CATALOG_EVERY_S = 1.0
"""The catalog is rewritten as tasks end, at most this often (and once at the end)."""


@dataclass(frozen=True)
class DatasetLoad:
    """What `load_dataset` did: the traces it loaded, those already there, those that failed,
    in how many seconds on how many Dask workers (0: nothing to load, no cluster started; and
    0 s too: nothing done), and
    the run the files are the ranks of, as the catalog now has it (None: no run asked for)."""

    loaded: list[CatalogEntry]
    skipped: list[CatalogEntry]
    failed: list[CatalogEntry]
    seconds: float
    workers: int
    run: RunEntry | None = None


def load_rank(path: str, trace_id: int, name: str, dataset: str, python_functions: bool = False,
              attribute: bool | None = None) -> CatalogEntry:
    """Load one trace file as trace `trace_id` of `dataset` (run as a Dask task); `python_functions`
    and `attribute` as `load_trace`'s. The file is read into this worker's private store
    (`worker_store`), emptied again when its Parquet files are written."""
    if "polars" not in sys.modules:  # a worker's first task: one thread, as DuckDB's (WORKER_ENV)
        for key, value in WORKER_ENV.items():
            os.environ.setdefault(key, value)
    from traceq.analysis.multigpu.runs import rank_summary
    from traceq.api.loading import FEW_ROWS_KERNELS, load_trace

    con = worker_store()
    try:
        result = load_trace(con, Path(path), name=name, python_functions=python_functions, attribute=attribute)
        with few_rows(result.kernel_count <= FEW_ROWS_KERNELS):
            summary = rank_summary(con, result.trace_id, as_trace_id=trace_id)
        write_trace(con, trace_id, Path(dataset))
        _write_summary(summary, trace_dir(Path(dataset), trace_id))
        sha, size = first_row(con, "SELECT sha256, source_bytes FROM traces")
    finally:
        _empty(con)
    return CatalogEntry(trace_id, name, path, int(size), "loaded", sha, result.kernel_count,
                        round(result.seconds, 3), notes=result.notes or None)


_worker = threading.local()


def worker_store() -> duckdb.DuckDBPyConnection:
    """This thread's private store for `load_rank`: an in-memory DuckDB database (RANK_SETTINGS,
    spilling to a temporary folder beyond its memory limit) with the store's schema, made at
    the thread's first task and kept for the next ones, which find it empty, its ids starting
    at 1 again (`_empty`): a worker pays for a connection and a schema once, not per file."""
    con = getattr(_worker, "con", None)
    if con is None:
        spill = tempfile.mkdtemp(prefix="traceq-rank-")
        atexit.register(shutil.rmtree, spill, ignore_errors=True)
        con = connect(**RANK_SETTINGS, temp_directory=spill)
        con.execute(schema_sql())
        con.execute("INSERT INTO traceq_meta VALUES ('schema_version', ?)", [SCHEMA_VERSION])
        tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal "
                                            "AND table_name != 'traceq_meta' ORDER BY 1").fetchall()]
        _worker.con, _worker.emptying = con, "BEGIN; " + "".join(f"DELETE FROM {t}; " for t in tables) + "".join(
            f"DROP SEQUENCE {q}; CREATE SEQUENCE {q} START 1; " for q in ("trace_ids", "run_ids")) + "COMMIT"
    return con


def _empty(con: duckdb.DuckDBPyConnection) -> None:
    """Delete every row `load_rank` left in the worker's store; a store that cannot be emptied
    (a transaction left open by a failure) is closed, and the next task makes a new one."""
    try:
        con.execute(_worker.emptying)
    except duckdb.Error:
        con.close()
        _worker.con = None


@contextmanager
def dask_client(scheduler: str | None = None, workers: int | None = None) -> Iterator[object]:
    """A Dask `distributed.Client`: to the scheduler at `scheduler` (an address such as
    tcp://host:8786, or a scheduler file), else to a new local cluster of `workers` processes
    (default: one per core) of one thread each.

    Raises:
        TraceqError: Dask is not installed, or the scheduler cannot be reached.
    """
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise TraceqError("loading into a dataset runs on Dask, which is not installed here: "
                          "pip install 'traceq-gpu[dask]'") from None
    if scheduler is None:
        import logging

        with LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1, processes=True,
                          dashboard_address=None, silence_logs=logging.CRITICAL,
                          env=WORKER_ENV) as cluster, Client(cluster) as client:
            yield client
        return
    where = {"scheduler_file": scheduler} if Path(scheduler).is_file() else {"address": scheduler}
    try:
        client = Client(**where, timeout="20s")
    except (OSError, TimeoutError, ValueError) as e:
        raise TraceqError(f"cannot reach the Dask scheduler {scheduler}: {str(e).splitlines()[0]}") from None
    with client:
        yield client


@dataclass(frozen=True)
class LoadPlan:
    """What `load_dataset` will do: the catalog as it was read (traces, runs), the catalog with
    every file in it (new ones 'pending' under new trace ids), the files to load with their ids,
    the entries of files already loaded, and the run they are the ranks of (None: no run; 'loaded'
    already: nothing to do for it)."""

    dataset: Path
    before: tuple[list[CatalogEntry], list[RunEntry]]
    entries: dict[int, CatalogEntry]
    todo: list[tuple[Path, int]]
    skipped: list[CatalogEntry]
    run: RunEntry | None = None


def plan_load(paths: list[Path], dataset: Path, run: str | None = None) -> LoadPlan:
    """Check `paths` and give each a trace id of the dataset at `dataset` (and the run `run`
    they are the ranks of, an id); writes nothing.

    Raises:
        TraceFormatError: a file is not a trace traceq reads.
        TraceqError: two files have one name, a name is taken by a different file, or `run`'s
            name by another run or trace, or a file is there already outside the run.
        StoreError: `dataset` is not a dataset of this traceq.
    """
    from traceq.ingest import READERS, default_name, reader_for

    dataset = Path(dataset).resolve()
    before = catalog_of(dataset)
    entries = {e.trace_id: e for e in before[0]}
    by_name = {e.name: e for e in before[0]}
    next_id = max(entries, default=0) + 1
    todo, skipped, names, ranks = [], [], {}, []
    for path in map(Path, paths):
        reader_for(path, READERS)  # reject bad input before anything is written
        name = default_name(path)
        if name in names:
            raise TraceqError(f"{path} and {names[name]} would both be trace {name!r}: rename one")
        names[name] = path
        path, size = path.resolve(), path.stat().st_size
        known = by_name.get(name)
        if known is not None and known.status == "loaded":
            if known.source_bytes != size:
                raise TraceqError(f"a different trace named {name!r} is already in {dataset} "
                                  f"(from {known.source_path}): rename the file, or load into another dataset")
            skipped.append(known)
            ranks.append(known.trace_id)
            continue
        tid = known.trace_id if known is not None else next_id
        next_id += known is None
        entries[tid] = CatalogEntry(tid, name, str(path), size, "pending")
        todo.append((path, tid))
        ranks.append(tid)
    return LoadPlan(dataset, before, entries, todo, skipped, None if run is None else
                    _plan_run(run, ranks, before, dataset))


def _plan_run(name: str, ranks: list[int], before: tuple[list[CatalogEntry], list[RunEntry]],
              dataset: Path) -> RunEntry:
    """The run `name` of the traces `ranks`: as the catalog has it when these are its traces
    (a retry), else a new one, 'pending', under its first trace's id (which no other run has:
    that trace's own run gives way to it, and a trace is a rank of one run at most)."""
    traces, runs = before
    known = next((r for r in runs if r.name == name), None)
    if known is not None and sorted(known.trace_ids) == sorted(ranks):
        return known
    if known is not None:
        raise TraceqError(f"a run named {name!r} of other files is already in {dataset}: choose another name, "
                          "or load into another dataset")
    taken = [e for e in traces if e.trace_id in ranks and (e.status == "loaded" or any(
        e.trace_id in r.trace_ids for r in runs))]
    if taken:
        raise TraceqError(f"{taken[0].source_path} is already in {dataset} as trace {taken[0].name!r}, outside "
                          f"run {name!r}: load the run into another dataset")
    if any(e.name == name and e.status == "loaded" for e in traces):
        raise TraceqError(f"{name!r} is already a trace of {dataset}: choose another run name")
    return RunEntry(min(ranks), name, sorted(ranks), "pending")


def load_dataset(
    client: object | None,
    plan: LoadPlan,
    *,
    progress: Callable[[int, int], None] | None = None,
    python_functions: bool = False,
    attribute: bool | None = None,
) -> DatasetLoad:
    """Carry out `plan` (`plan_load`): one Dask task per file on `client`'s workers, which must
    see the files and the dataset at the same paths as this process (None: the plan loads no
    file, and at most completes its run). The dataset's folder is made when absent; then the
    plan's run, when all its traces are loaded. `python_functions`, `attribute`: as `load_trace`'s.

    Raises:
        StoreError: another load is writing the dataset, or wrote it since `plan` was made.
    """
    started = time.perf_counter()
    dataset, entries = plan.dataset, dict(plan.entries)
    runs = {r.run_id: r for r in plan.before[1]}
    if plan.run is not None:
        runs[plan.run.run_id] = plan.run
    dataset.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        write_catalog(dataset, list(entries.values()), list(runs.values()))

    with _locked(dataset):
        if catalog_of(dataset) != plan.before:
            raise StoreError(f"{dataset} changed while this load was starting: run it again")
        save()
        if plan.todo:
            _run_tasks(client, plan, entries, save, progress, python_functions, attribute)
        save()  # write_run reads the traces by it
        run = plan.run
        if run is not None and run.status != "loaded" and all(entries[t].status == "loaded" for t in run.trace_ids):
            try:
                write_run(dataset, run, _registrar(dataset, run.trace_ids))
                runs[run.run_id] = run = replace(run, status="loaded", error=None)
            except TraceqError as e:  # not one job's ranks: each stays a trace of its own
                runs[run.run_id] = run = replace(run, status="failed", error=str(e))
            save()
    ran = [entries[tid] for _, tid in plan.todo]
    return DatasetLoad([e for e in ran if e.status == "loaded"], plan.skipped,
                       [e for e in ran if e.status != "loaded"], time.perf_counter() - started,
                       len(client.nthreads()) if plan.todo else 0, run)  # type: ignore[attr-defined]


def _run_tasks(client: object, plan: LoadPlan, entries: dict[int, CatalogEntry], save: Callable[[], None],
               progress: Callable[[int, int], None] | None, python_functions: bool, attribute: bool | None) -> None:
    """One task per file of `plan.todo` on `client`, each trace's entry updated as its task ends
    (and `save()`d at most every CATALOG_EVERY_S)."""
    from distributed import as_completed

    futures = {client.submit(load_rank, str(path), tid, entries[tid].name, str(plan.dataset),  # type: ignore[attr-defined]
                             python_functions, attribute, key=f"traceq-load-{tid}-{uuid.uuid4().hex}", pure=False): tid
               for path, tid in plan.todo}
    written = time.monotonic()
    for done, future in enumerate(as_completed(futures), 1):
        tid = futures[future]
        if future.status == "finished":
            entries[tid] = future.result()
        else:
            shutil.rmtree(partial_dir(plan.dataset, tid), ignore_errors=True)
            entries[tid] = replace(entries[tid], status="failed", error=_why(future.exception()))
        if progress is not None:
            progress(done, len(futures))
        if time.monotonic() - written >= CATALOG_EVERY_S:
            save()
            written = time.monotonic()


def _write_summary(summary: RankSummary, folder: Path) -> None:
    import json

    json_name, comm_name = SUMMARY_FILES
    summary.comm.write_parquet(folder / comm_name)
    tmp = folder / (json_name + ".tmp")  # the JSON last, whole: its presence says the summary is
    tmp.write_text(json.dumps(summary.to_json()), encoding="utf-8")
    os.replace(tmp, folder / json_name)


def _registrar(dataset: Path, trace_ids: list[int]) -> Callable[..., int]:
    """How `write_run` registers the run: from the ranks' summaries where every rank has one,
    else by reading the ranks' tables (`register_run`)."""
    import json

    import polars as pl

    from traceq.analysis.multigpu.runs import RankSummary, register_run, register_summaries

    json_name, comm_name = SUMMARY_FILES
    folders = [trace_dir(dataset, t) for t in trace_ids]
    if not all((f / json_name).is_file() and (f / comm_name).is_file() for f in folders):
        return register_run
    summaries = [RankSummary.from_json(json.loads((f / json_name).read_text(encoding="utf-8")),
                                       pl.read_parquet(f / comm_name)) for f in folders]
    return lambda con, name, _ids: register_summaries(con, name, summaries)


def ensure_free(dataset: Path) -> None:
    """Raise StoreError now, before a cluster starts (whose shutdown would print Dask's warnings
    around the one line), when another load is writing `dataset`; `load_dataset` checks again."""
    if (dataset / ".lock").exists():
        with _locked(dataset):
            pass


@contextmanager
def _locked(dataset: Path) -> Iterator[None]:
    with (dataset / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(f"{dataset} is being written by another traceq load; try again when it finishes") from None
        yield


def _why(error: BaseException | None) -> str:
    if type(error).__name__ == "KilledWorker":
        return "its Dask worker died while loading it (killed, or out of memory)"
    if isinstance(error, TraceqError):
        return str(error)
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
