"""Loading many trace files in parallel on Dask into a dataset (traceq.dataset).

The coordinator (`load_dataset`) gives each file its trace id before anything runs, records the
plan in the catalog, and submits one task per file; a task (`load_rank`, on a Dask worker) reads
the file with the usual readers into a private temporary store, exactly as `traceq load` would,
and writes its tables as that trace's Parquet files. The coordinator alone writes the catalog, as
each task ends. A task that fails, or whose worker dies, leaves its trace 'failed' in the catalog
and no Parquet file; loading the same files again into the dataset does only those not loaded.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from traceq.dataset import CatalogEntry, is_dataset, partial_dir, read_catalog, write_catalog, write_trace
from traceq.errors import StoreError, TraceqError
from traceq.store import first_row, open_store

RANK_SETTINGS = {"threads": "1", "memory_limit": "500MB"}
"""DuckDB settings of a task's private store: one Dask worker is one core's work (the load itself
runs under ingest.LOAD_SETTINGS), and its memory stays well under a worker's share."""

CATALOG_EVERY_S = 1.0
"""The catalog is rewritten as tasks end, at most this often (and once at the end)."""


@dataclass(frozen=True)
class DatasetLoad:
    """What `load_dataset` did: the traces it loaded, those already there, those that failed,
    in how many seconds on how many Dask workers (0: nothing to load, no cluster started)."""

    loaded: list[CatalogEntry]
    skipped: list[CatalogEntry]
    failed: list[CatalogEntry]
    seconds: float
    workers: int


def load_rank(path: str, trace_id: int, name: str, dataset: str, python_functions: bool = False,
              attribute: bool | None = None) -> CatalogEntry:
    """Load one trace file as trace `trace_id` of `dataset` (run as a Dask task); `python_functions`
    and `attribute` as `load_trace`'s."""
    from traceq.ingest import load_trace

    with tempfile.TemporaryDirectory(prefix="traceq-rank-") as tmp:
        con = open_store(Path(tmp) / "rank.duckdb", create=True)
        try:
            for key, value in RANK_SETTINGS.items():
                con.execute(f"SET {key} = '{value}'")
            result = load_trace(con, Path(path), name=name, python_functions=python_functions, attribute=attribute)
            write_trace(con, trace_id, Path(dataset))
            sha, size = first_row(con, "SELECT sha256, source_bytes FROM traces")
        finally:
            con.close()
    return CatalogEntry(trace_id, name, path, int(size), "loaded", sha, result.kernel_count,
                        round(result.seconds, 3), notes=result.notes or None)


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
                          "pip install 'traceq[dask]'") from None
    if scheduler is None:
        import logging

        with LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1, processes=True,
                          dashboard_address=None, silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
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
    """What `load_dataset` will do: the catalog as it was read, the catalog with every file in it
    (new ones 'pending' under new trace ids), the files to load with their ids, and the entries
    of files already loaded."""

    dataset: Path
    before: list[CatalogEntry]
    entries: dict[int, CatalogEntry]
    todo: list[tuple[Path, int]]
    skipped: list[CatalogEntry]


def plan_load(paths: list[Path], dataset: Path) -> LoadPlan:
    """Check `paths` and give each a trace id of the dataset at `dataset`; writes nothing.

    Raises:
        TraceFormatError: a file is not a trace traceq reads.
        TraceqError: two files have one name, or a name is taken by a different file.
        StoreError: `dataset` is not a dataset of this traceq.
    """
    from traceq.ingest import READERS, default_name, reader_for

    dataset = Path(dataset).resolve()
    before = read_catalog(dataset) if is_dataset(dataset) else []
    entries = {e.trace_id: e for e in before}
    by_name = {e.name: e for e in before}
    next_id = max(entries, default=0) + 1
    todo, skipped, names = [], [], {}
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
            continue
        tid = known.trace_id if known is not None else next_id
        next_id += known is None
        entries[tid] = CatalogEntry(tid, name, str(path), size, "pending")
        todo.append((path, tid))
    return LoadPlan(dataset, before, entries, todo, skipped)


def load_dataset(
    client: object,
    plan: LoadPlan,
    *,
    progress: Callable[[int, int], None] | None = None,
    python_functions: bool = False,
    attribute: bool | None = None,
) -> DatasetLoad:
    """Carry out `plan` (`plan_load`): one Dask task per file on `client`'s workers, which must
    see the files and the dataset at the same paths as this process. The dataset's folder is
    made when absent. `python_functions`, `attribute`: as `load_trace`'s.

    Raises:
        StoreError: another load is writing the dataset, or wrote it since `plan` was made.
    """
    from distributed import as_completed

    started = time.perf_counter()
    dataset, entries = plan.dataset, dict(plan.entries)
    dataset.mkdir(parents=True, exist_ok=True)
    with _locked(dataset):
        if (read_catalog(dataset) if is_dataset(dataset) else []) != plan.before:
            raise StoreError(f"{dataset} changed while this load was starting: run it again")
        write_catalog(dataset, list(entries.values()))
        futures = {client.submit(load_rank, str(path), tid, entries[tid].name, str(dataset),  # type: ignore[attr-defined]
                                 python_functions, attribute, key=f"traceq-load-{tid}-{uuid.uuid4().hex}", pure=False): tid
                   for path, tid in plan.todo}
        written = time.monotonic()
        for done, future in enumerate(as_completed(futures), 1):
            tid = futures[future]
            if future.status == "finished":
                entries[tid] = future.result()
            else:
                shutil.rmtree(partial_dir(dataset, tid), ignore_errors=True)
                entries[tid] = replace(entries[tid], status="failed", error=_why(future.exception()))
            if progress is not None:
                progress(done, len(futures))
            if time.monotonic() - written >= CATALOG_EVERY_S:
                write_catalog(dataset, list(entries.values()))
                written = time.monotonic()
        write_catalog(dataset, list(entries.values()))
    ran = [entries[tid] for _, tid in plan.todo]
    return DatasetLoad([e for e in ran if e.status == "loaded"], plan.skipped,
                       [e for e in ran if e.status != "loaded"], time.perf_counter() - started,
                       len(client.nthreads()))  # type: ignore[attr-defined]


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
