"""Datasets: many traces as Parquet files in a folder, read through DuckDB views with the store's
table names, so every analysis runs on them unchanged.

A dataset is written by `traceq load --dataset` (traceq.api.datasets), one trace (a rank
file) per Dask task. Its layout:

    DATASET/catalog.json                 the traces it holds: id, name, source, sha256, status;
                                         and its runs of several files: id, name, traces, status
    DATASET/trace=<id>/<table>.parquet   one file per store table (traceq_meta aside)
    DATASET/run=<id>/{runs,ranks}.parquet  a run of several files: its ranks and their clocks
    DATASET/.partial/...                 a trace or run being written (never read)

A trace's files are written into `.partial/trace=<id>/` and the folder is renamed into place
when all are whole, so a trace appears complete or not at all; readers list only the traces the
catalog marks `loaded`, and the catalog is replaced by rename too. Each trace is a run of its
own (run id = trace id) in its runs and ranks files, until a run of several files the catalog
marks `loaded` takes it as a rank: then that run's files stand for it instead (the run's id is
its first trace's). The store's own views (schema.sql: kernels,
api_calls, nvtx, kernel_launches, kernels_attributed) are created over the Parquet views.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import duckdb

from traceq.errors import StoreError
from traceq.store import SCHEMA_VERSION, connect, first_row, schema_sql

CATALOG = "catalog.json"
DATASET_FORMAT = 1
"""The layout's version, in catalog.json beside the store schema version of its files."""


@dataclass(frozen=True)
class CatalogEntry:
    """One trace of a dataset. `status` is 'loaded' or 'failed' (then `error` says why); `notes`
    say what a damaged file's rows lacked and what was done (`LoadResult.notes`)."""

    trace_id: int
    name: str
    source_path: str
    source_bytes: int
    status: str
    sha256: str | None = None
    kernels: int | None = None
    seconds: float | None = None
    error: str | None = None
    notes: list[str] | None = None


@dataclass(frozen=True)
class RunEntry:
    """A run of several trace files of a dataset (`traceq load FILE... --run NAME --dataset`):
    its traces (by trace id), and `status`: 'pending' while some are not loaded, 'loaded' when
    its ranks and clocks are in run=<id>/, 'failed' when its files are not one job's ranks
    (`error` says why)."""

    run_id: int
    name: str
    trace_ids: list[int]
    status: str
    error: str | None = None


RUN_TABLES = ("runs", "ranks")
"""The tables a run of several files writes (its traces' own stand for each as a run of its own)."""


def is_dataset(path: Path) -> bool:
    return (Path(path) / CATALOG).is_file()


def trace_dir(dataset: Path, trace_id: int) -> Path:
    """Where a loaded trace's Parquet files are."""
    return Path(dataset) / f"trace={trace_id}"


def partial_dir(dataset: Path, trace_id: int) -> Path:
    """Where a trace's Parquet files are written before they are renamed into place."""
    return Path(dataset) / ".partial" / f"trace={trace_id}"


def run_dir(dataset: Path, run_id: int) -> Path:
    """Where a loaded run's runs and ranks files are."""
    return Path(dataset) / f"run={run_id}"


def read_catalog(dataset: Path) -> list[CatalogEntry]:
    """The traces of the dataset at `dataset`, in trace_id order.

    Raises:
        StoreError: no dataset there, or one of another store schema.
    """
    return _read(dataset)[0]


def read_runs(dataset: Path) -> list[RunEntry]:
    """The runs of several files of the dataset at `dataset`, in run_id order (StoreError as
    `read_catalog`'s)."""
    return _read(dataset)[1]


def catalog_of(dataset: Path) -> tuple[list[CatalogEntry], list[RunEntry]]:
    """The traces and runs of the dataset at `dataset`, ([], []) where there is none yet
    (StoreError as `read_catalog`'s)."""
    return _read(dataset) if is_dataset(dataset) else ([], [])


def _read(dataset: Path) -> tuple[list[CatalogEntry], list[RunEntry]]:
    path = Path(dataset) / CATALOG
    if not path.is_file():
        raise StoreError(f"no dataset at {dataset} (no {CATALOG}): make one with "
                         "`traceq load FILE... --dataset PATH`")
    try:
        catalog = json.loads(path.read_text(encoding="utf-8"))
        found = catalog["schema_version"]
        entries = [CatalogEntry(**t) for t in catalog["traces"]]
        runs = [RunEntry(**r) for r in catalog.get("runs", [])]
    except (ValueError, KeyError, TypeError) as e:
        raise StoreError(f"{path} is not a traceq dataset catalog ({e})") from None
    if found != SCHEMA_VERSION:
        raise StoreError(f"{dataset} holds store schema {found}, this traceq uses {SCHEMA_VERSION}: "
                         "load its traces again into a new dataset")
    return sorted(entries, key=lambda e: e.trace_id), sorted(runs, key=lambda r: r.run_id)


def write_catalog(dataset: Path, entries: list[CatalogEntry], runs: list[RunEntry]) -> None:
    """Replace the catalog in one rename (readers see the old one or the new one)."""
    path = Path(dataset) / CATALOG
    text = json.dumps({"traceq_dataset": DATASET_FORMAT, "schema_version": SCHEMA_VERSION,
                       "traces": [asdict(e) for e in sorted(entries, key=lambda e: e.trace_id)],
                       "runs": [asdict(r) for r in sorted(runs, key=lambda r: r.run_id)]}, indent=1)
    tmp = path.with_name(CATALOG + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_trace(con: duckdb.DuckDBPyConnection, trace_id: int, dataset: Path) -> None:
    """Write every table of the one trace in the store `con` (a private store) as the trace
    `trace_id` of the dataset: into its partial folder first, renamed into place when whole."""
    staging, final = partial_dir(dataset, trace_id), trace_dir(dataset, trace_id)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for table, keys in _table_keys().items():
        ids = ", ".join(f"{int(trace_id)}::INTEGER AS {key}" for key in keys)
        con.execute(f"COPY (SELECT * {f'REPLACE ({ids})' if ids else ''} FROM {table}) "
                    f"TO {_literal(staging / f'{table}.parquet')} (FORMAT parquet)")
    _publish(staging, final)


def write_run(dataset: Path, run: RunEntry,
              register: Callable[[duckdb.DuckDBPyConnection, str, list[int]], int]) -> None:
    """Register `run`'s traces as the ranks of one run with `register` (the API passes
    `analysis.multigpu.runs.register_run`, which aligns their clocks, one trace's files read at a
    time), and write its runs and ranks tables as run=<id>/: into its partial folder first,
    renamed into place when whole.

    Raises:
        RunError: the traces are not one job's ranks.
    """
    con = open_dataset(dataset, [])  # the schema's tables, empty: the run's rows are inserted here
    register(con, run.name, run.trace_ids)  # each trace read through views over its own files
    staging = Path(dataset) / ".partial" / f"run={run.run_id}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for table in RUN_TABLES:
        con.execute(f"COPY (SELECT * REPLACE ({int(run.run_id)}::INTEGER AS run_id) FROM {table}) "
                    f"TO {_literal(staging / f'{table}.parquet')} (FORMAT parquet)")
    _publish(staging, run_dir(dataset, run.run_id))


def _trace_tables(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """The tables a dataset keeps per trace (every table of the store but traceq_meta and the
    ncu_* tables, which `traceq load --ncu` fills in a store only: a dataset's stay empty), each
    with its id columns that must be unique across the dataset's traces: trace_id, and run_id
    (each trace of a dataset is a run of its own, with the trace's id)."""
    rows = con.execute("SELECT table_name, list(column_name ORDER BY column_index) FILTER "
                       "(column_name IN ('trace_id', 'run_id')) FROM duckdb_columns() WHERE NOT internal "
                       "AND table_name IN (SELECT table_name FROM duckdb_tables()) AND table_name != 'traceq_meta' "
                       "AND NOT starts_with(table_name, 'ncu_') "
                       "GROUP BY table_name ORDER BY table_name").fetchall()
    return {table: keys or [] for table, keys in rows}


def _publish(staging: Path, final: Path) -> None:
    """Move a trace's whole folder into place (one rename; a stale copy of it goes first)."""
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)


def open_dataset(dataset: Path, trace_ids: list[int] | None = None,
                 tables: list[str] | None = None, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection whose tables are views over the dataset's loaded traces
    (the store's table names and views), for the analyses to read as they read a store; over
    those of `trace_ids` only when given (a query then opens none of the other traces' files);
    only `tables` made views when given (the others stay empty tables: finding a trace needs
    `traces` alone). `threads`: DuckDB's (default: one per core). The connection knows its
    dataset (`trace_reader`).

    Raises:
        StoreError: no dataset at `dataset`, or one of another store schema.
    """
    con = connect(**({"threads": str(int(threads))} if threads else {}))
    con.execute(schema_sql())  # every table, empty, and the schema's views over them
    con.execute("INSERT INTO traceq_meta VALUES ('schema_version', ?)", [SCHEMA_VERSION])
    con.execute(f"SET VARIABLE {DATASET_VARIABLE} = ?", [str(dataset)])
    _point(con, dataset, trace_ids, tables)
    return con


DATASET_VARIABLE = "traceq_dataset"
"""A DuckDB variable of a dataset's connection: the dataset's folder."""


def _point(con: duckdb.DuckDBPyConnection, dataset: Path, trace_ids: list[int] | None,
           tables: list[str] | None = None) -> None:
    """Make `con`'s views (`open_dataset`'s) over the files of the traces `trace_ids` (None: every
    loaded trace), a made run's runs and ranks files standing in for its traces' own."""
    entries, runs = _read(dataset)
    loaded = [e.trace_id for e in entries if e.status == "loaded" and (trace_ids is None or e.trace_id in trace_ids)]
    runs = [r for r in runs if r.status == "loaded" and not set(r.trace_ids).isdisjoint(loaded)]
    ranks = {t for r in runs for t in r.trace_ids}  # a rank of a run: not a run of its own
    base = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall()}
    for table in tables or _store_tables():
        files = [trace_dir(dataset, t) / f"{table}.parquet" for t in loaded
                 if table not in RUN_TABLES or t not in ranks]
        files += [run_dir(dataset, r.run_id) / f"{table}.parquet" for r in runs if table in RUN_TABLES]
        if files:  # else the empty table stands: an empty dataset reads as an empty store
            if table in base:
                con.execute(f"DROP TABLE {table}")
            listed = ", ".join(map(_literal, files))
            con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM read_parquet([{listed}])")


def _store_tables() -> tuple[str, ...]:
    """The tables a dataset keeps per trace."""
    return tuple(_table_keys())


@lru_cache(maxsize=1)
def _table_keys() -> dict[str, list[str]]:
    """`_trace_tables` of an empty store: every store of this schema version has these (asked
    once per process, not of each store written from)."""
    con = connect()
    con.execute(schema_sql())
    return _trace_tables(con)


def trace_reader(con: duckdb.DuckDBPyConnection) -> Callable[[int], duckdb.DuckDBPyConnection]:
    """trace id -> a connection to read that trace's rows through, for going over a run's traces
    one at a time: a store's connection `con` itself; for a dataset's, one other connection, the
    same each time, whose views are made over that trace's files alone (and its run's), so that
    a query opens no other trace's files (over all of a run's, a query of one trace reads every
    rank's files: quadratic in the ranks). A trace's rows must be read before the next is asked
    for."""
    dataset = first_row(con, f"SELECT getvariable('{DATASET_VARIABLE}')")[0]
    if dataset is None:
        return lambda _: con
    own = open_dataset(Path(dataset), [], threads=first_row(con, "SELECT current_setting('threads')")[0])

    def over(trace_id: int) -> duckdb.DuckDBPyConnection:
        _point(own, Path(dataset), [trace_id])
        return own

    return over


def _literal(path: Path) -> str:
    """`path` as an SQL string literal."""
    return "'" + str(path).replace("'", "''") + "'"
