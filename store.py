"""The DuckDB store: open or create it, check its schema version, wait for its lock.

One store file holds many traces; `schema.sql` defines its tables. Opening for writing takes
DuckDB's file lock, so a second writer (or a reader while a load runs) waits here, up to
`lock_timeout` seconds, and then gives up with a one-line StoreError. Nothing is written until a
caller commits: loads run in one transaction (see traceq.ingest).
"""

from __future__ import annotations

import contextvars
import itertools
import os
import re
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import duckdb

from traceq.errors import NotFoundError, StoreError

if TYPE_CHECKING:
    import polars as pl

A = TypeVar("A")
B = TypeVar("B")

SCHEMA_VERSION = "11"
DEFAULT_STORE = "traceq.duckdb"
DEFAULT_LOCK_TIMEOUT_S = 60.0

OFFLINE = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
"""DuckDB settings of every connection traceq opens: never download or load an extension on
demand: users are offline, and DuckDB would otherwise fetch its SQLite extension, for seconds
and then a network error, when handed an SQLite file as a database. (`connect` also switches
off DuckDB's progress bar, a setting of each connection.)"""

_DUCKDB_MAGIC = b"DUCK"  # bytes 8 to 12 of a DuckDB database file

_LOCK_MESSAGE = re.compile(r"lock", re.IGNORECASE)
_READ_ONLY_MESSAGE = re.compile(r"Permission denied|Read-only file system", re.IGNORECASE)


def default_store_path() -> Path:
    """`$TRACEQ_DB` when set, else ./traceq.duckdb."""
    return Path(os.environ.get("TRACEQ_DB") or DEFAULT_STORE)


def connect(database: str | Path = ":memory:", *, read_only: bool = False,
            **settings: str) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with traceq's settings (`OFFLINE`) and `settings`; every connection
    traceq opens is opened here. DuckDB's own progress bar is off: it would draw into traceq's
    output (traceq says its progress itself). Unless `settings` name them, DuckDB's threads are
    at most the CPUs the process may run on (`taskset`, a container's cpuset): DuckDB counts the
    machine's cores, so on two of sixteen it ran sixteen threads (Polars counts the allowed ones)."""
    con = duckdb.connect(str(database), read_only=read_only, config={**settings, **OFFLINE})
    con.execute("SET enable_progress_bar = false")
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    if "threads" not in settings and allowed:
        (threads,) = con.execute("SELECT current_setting('threads')").fetchall()[0]
        if int(threads) > allowed:
            con.execute(f"SET threads = {allowed}")
    return con


def schema_sql() -> str:
    """The text of schema.sql as shipped with the package."""
    return resources.files("traceq").joinpath("schema.sql").read_text(encoding="utf-8")


_COLUMN = re.compile(r"^    ([a-z_]\w*) ([A-Z]+)\b", re.MULTILINE)
"""A column line of a schema.sql table: four spaces, the name (lower case: not a constraint), the type."""


def ensure_tables(con: duckdb.DuckDBPyConnection, *names: str) -> None:
    """Create schema.sql's tables `names` where the store lacks them, and add the columns they
    gained since (nullable, so the rows a store has keep NULL there): tables added or widened since
    a store was made (the ncu_* ones) without a new schema version, as nothing else reads them
    unasked."""
    sql = schema_sql()
    for name in names:
        found = re.search(rf"^CREATE TABLE {re.escape(name)} \(.*?^\);", sql, re.MULTILINE | re.DOTALL)
        if found is None:
            raise ValueError(f"schema.sql has no table {name}")
        con.execute(found.group(0).replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
        have = {c for (c,) in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = ?",
                                          [name]).fetchall()}
        for column, kind in _COLUMN.findall(found.group(0)):  # columns added to the table since
            if column not in have:
                con.execute(f'ALTER TABLE {name} ADD COLUMN "{column}" {kind}')


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the store (or dataset) has a table or view `name`."""
    return first_row(con, "SELECT 1 FROM duckdb_tables() WHERE table_name = ? UNION ALL "
                          "SELECT 1 FROM duckdb_views() WHERE view_name = ? LIMIT 1", [name, name]) is not None


def open_store(
    path: Path,
    *,
    read_only: bool = False,
    create: bool = False,
    lock_timeout: float | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> duckdb.DuckDBPyConnection:
    """Open the store at `path`.

    Args:
        read_only: open without taking the write lock (several readers may share it).
        create: create the file and its schema when it does not exist.
        lock_timeout: seconds to wait while another process holds the lock
            (default `$TRACEQ_LOCK_TIMEOUT` or 60).
        on_wait: called once with a message when we start waiting for the lock.

    Raises:
        StoreError: no store there (and not `create`), not a traceq store, an incompatible schema
            version, or still locked after `lock_timeout`.
    """
    path = Path(path)
    if not path.exists() and not create:
        raise StoreError(f"no store at {path}: load a trace first with `traceq load TRACE`")
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a traceq store file")
    if path.exists():
        _check_duckdb_file(path)
        if not read_only and not os.access(path, os.W_OK):
            raise StoreError(_read_only_message(path))
    if lock_timeout is None:
        lock_timeout = float(os.environ.get("TRACEQ_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT_S))
    con = _connect_waiting(path, read_only and path.exists(), lock_timeout, on_wait)
    try:
        _ensure_schema(con, path, create=create and not read_only)
        if not read_only:
            reclaim_space(con, path)
    except duckdb.Error as e:  # a damaged file DuckDB opened but cannot read
        con.close()
        raise StoreError(f"{path} is damaged: {_first_line(e)}; load the traces into a new store") from None
    except BaseException:
        con.close()
        raise
    return con



HEADER_BYTES = 3 * 4096
"""What precedes a DuckDB file's first block: its file header and two database headers."""


def reclaim_space(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    """Give back the space a killed load left at the end of the store file; returns the bytes.

    DuckDB writes a big append's row groups into the file before its transaction commits
    (optimistic writes). A load killed before its commit leaves them past the last block the
    file's header counts: there is no WAL (nothing was committed) and they are not in the free
    list, so the store's contents are intact, but a plain open or CHECKPOINT keeps the space;
    DuckDB truncates the file only at a checkpoint that writes something. This makes one (a
    scratch table created and dropped) when such a tail is there, and no WAL is: of any length
    (a kill in the middle of writing a block leaves less than a block; the checkpoint cuts the
    file back to its counted blocks all the same).
    """
    total, block = first_row(con, "SELECT total_blocks, block_size FROM pragma_database_size() "
                                  "WHERE database_name = current_database()")
    tail = path.stat().st_size - HEADER_BYTES - total * block
    if tail <= 0 or Path(f"{path}.wal").exists():
        return 0
    con.execute("CREATE TABLE traceq_reclaim (x INTEGER)")
    con.execute("DROP TABLE traceq_reclaim")
    con.execute("CHECKPOINT")
    return tail


def restore_size(path: Path, size: int) -> None:
    """Cut the store file back to `size` bytes after a load that failed (its connection closed).

    The rolled-back load's optimistic writes (see `reclaim_space`) lie past the file's old end
    and nothing references them: without them the file is byte for byte what it was.
    """
    if path.exists() and path.stat().st_size > size and not Path(f"{path}.wal").exists():
        os.truncate(path, size)


def _connect_waiting(
    path: Path, read_only: bool, timeout: float, on_wait: Callable[[str], None] | None
) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + timeout
    announced = False
    while True:
        try:
            return connect(path, read_only=read_only)
        except duckdb.IOException as e:
            if _READ_ONLY_MESSAGE.search(str(e)):
                raise StoreError(_read_only_message(path)) from None
            if not _LOCK_MESSAGE.search(str(e)):
                raise StoreError(f"{path} cannot be opened as a traceq store: {_first_line(e)}") from None
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"{path} is in use by another traceq process (waited {timeout:g} s); "
                    "try again when it finishes"
                ) from None
            if not announced and on_wait is not None:
                on_wait(f"waiting for {path}: another traceq process is using it")
                announced = True
            time.sleep(0.2)
        except duckdb.Error as e:
            raise StoreError(f"{path} cannot be opened as a traceq store: {_first_line(e)}") from None


def _read_only_message(path: Path) -> str:
    where = path if path.exists() else f"{path} (its folder)"
    return (f"{where} is read-only here (no permission to write it): `traceq load` and `traceq rm` "
            "change the store, the other commands only read it; pass --db with a writable path")


class NotAStoreError(StoreError):
    """The file at `path` is not a DuckDB file. Whoever knows the trace formats (the API, through
    `traceq.ingest`) may say what it is instead; the store does not."""

    def __init__(self, path: Path):
        super().__init__(f"{path} is not a traceq store (the DuckDB file `traceq load` writes)")
        self.path = path


def _check_duckdb_file(path: Path) -> None:
    """Raise NotAStoreError when `path` is not a DuckDB file (a trace passed as the store, most
    often); an empty file passes (DuckDB makes it a database)."""
    with path.open("rb") as f:
        head = f.read(12)
    if not head or head[8:12] == _DUCKDB_MAGIC:
        return
    raise NotAStoreError(path)


def _ensure_schema(con: duckdb.DuckDBPyConnection, path: Path, *, create: bool) -> None:
    try:  # the usual case, asked directly: listing the catalog first costs more than this query
        row = first_row(con, "SELECT value FROM traceq_meta WHERE key = 'schema_version'")
    except duckdb.CatalogException:  # no traceq_meta: a new file, or not a traceq store
        if con.execute("SELECT table_name FROM duckdb_tables()").fetchall():
            raise StoreError(f"{path} is a DuckDB database but not a traceq store (no traceq_meta table)") from None
        if not create:
            raise StoreError(f"{path} is an empty DuckDB file, not a traceq store") from None
        con.execute("BEGIN")
        con.execute(schema_sql())
        con.execute(
            "INSERT INTO traceq_meta VALUES ('schema_version', ?), ('created_by', ?)",
            [SCHEMA_VERSION, _traceq_version()],
        )
        con.execute("COMMIT")
        return
    found = row[0] if row else "unknown"
    if found != SCHEMA_VERSION:
        raise StoreError(
            f"{path} has store schema {found}, this traceq uses {SCHEMA_VERSION}: "
            f"delete it (or pass another --db) and re-run `traceq load`"
        )


def first_row(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> tuple | None:
    """The first row of a query, or None; fetches everything so the connection is free again."""
    rows = con.execute(sql, params).fetchall() if params is not None else con.execute(sql).fetchall()
    return rows[0] if rows else None


_few_rows: contextvars.ContextVar[bool] = contextvars.ContextVar("traceq_few_rows", default=False)


@contextmanager
def few_rows(few: bool = True) -> Iterator[None]:
    """`sql_frame`'s queries in the block return few rows (a small trace's: its load's summary,
    attribution and rank summary), where `few`: each is then planned once, not twice."""
    token = _few_rows.set(few)
    try:
        yield
    finally:
        _few_rows.reset(token)


def sql_frame(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> pl.DataFrame:
    """The rows of a query (with `params`) as a Polars frame: `con.sql(sql).pl()`, whose
    relation DuckDB binds (plans) when it is made and again when it runs. Inside `few_rows` the
    statement runs once (`execute`) and its rows, held by DuckDB, are copied into Arrow: one plan
    fewer, which on a 250-kernel trace costs more than the rows (docs/scale-out.md, "Per-file
    cost"), for a copy of the rows, which on millions would double the memory they take."""

    import polars as pl

    if not _few_rows.get():
        return con.sql(sql, params=params).pl()
    con.execute(sql, params)
    with warnings.catch_warnings():  # the copy is the point: the rows are few
        warnings.simplefilter("ignore", UserWarning)
        table = con.to_arrow_table()
    return pl.from_arrow(table, rechunk=False)


_unique = itertools.count()


@contextmanager
def registered(con: duckdb.DuckDBPyConnection, **frames: object) -> Iterator[dict[str, str]]:
    """Polars frames or Arrow tables as DuckDB views for the queries of a `with` block, under
    names no one else uses (key -> view name); unregistered when it ends, whatever happens."""
    names = {key: f"_traceq_{key}_{next(_unique)}" for key in frames}
    for key, frame in frames.items():
        con.register(names[key], frame)
    try:
        yield names
    finally:
        for name in names.values():
            con.unregister(name)


def side_by_side(con: duckdb.DuckDBPyConnection, first: Callable[[duckdb.DuckDBPyConnection], A],
                 second: Callable[[duckdb.DuckDBPyConnection], B]) -> tuple[A, B]:
    """(first(con), second(a cursor of con's)), the second in a thread while the first runs:
    DuckDB and Polars let go of the GIL, so two traces' analyses of ten million launches take
    about a quarter less time on two cores than one after the other. Where the first raises,
    the second's query is interrupted and the first's error is the caller's."""
    from concurrent.futures import ThreadPoolExecutor

    cursor = con.cursor()
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            later = pool.submit(second, cursor)
            try:
                done = first(con)
            except BaseException:
                cursor.interrupt()
                raise
            return done, later.result()
    finally:
        cursor.close()


def _by_name_or_id(con: duckdb.DuckDBPyConnection, table: str, key: str, ref: str | None, empty: str) -> tuple | None:
    """(key, name) of the row of `table` named `ref`, or whose `key` is `ref` as a number, or
    for None the latest (the highest key).

    Raises:
        NotFoundError: `empty`, when `ref` is None and the table is empty.
    """
    if ref is None:
        row = first_row(con, f"SELECT {key}, name FROM {table} ORDER BY {key} DESC LIMIT 1")
        if row is None:
            raise NotFoundError(empty)
        return row
    row = first_row(con, f"SELECT {key}, name FROM {table} WHERE name = ?", [ref])
    if row is None and ref.isdigit():
        row = first_row(con, f"SELECT {key}, name FROM {table} WHERE {key} = ?", [int(ref)])
    return row


def _held(con: duckdb.DuckDBPyConnection, table: str, key: str) -> str:
    names = [r[0] for r in con.execute(f"SELECT name FROM {table} ORDER BY {key}").fetchall()]
    return ", ".join(names[:10]) + (" ..." if len(names) > 10 else "") if names else "nothing"


def resolve_trace(con: duckdb.DuckDBPyConnection, ref: str | None) -> tuple[int, str]:
    """The (trace_id, name) that `ref` names: a name, an id, or None for the latest loaded.

    Raises:
        NotFoundError: the store holds no such trace (the message lists what it holds).
    """
    row = _by_name_or_id(con, "traces", "trace_id", ref, "the store holds no traces: load one with `traceq load TRACE`")
    if row is None:
        raise NotFoundError(f"no trace {ref!r} in the store (it holds: {_held(con, 'traces', 'trace_id')})")
    return int(row[0]), str(row[1])


def resolve_run(con: duckdb.DuckDBPyConnection, ref: str | None) -> tuple[int, str]:
    """The (run_id, name) that `ref` names: a run's name or id, or a trace's name or id (the run
    it belongs to), or None for the latest loaded.

    Raises:
        NotFoundError: the store holds no such run or trace (the message lists the runs).
    """
    row = _by_name_or_id(con, "runs", "run_id", ref, "the store holds no runs: load one with `traceq load TRACE...`")
    if row is None:
        try:
            trace_id, _ = resolve_trace(con, ref)
        except NotFoundError:
            raise NotFoundError(f"no run or trace {ref!r} in the store (runs: {_held(con, 'runs', 'run_id')})") from None
        return run_of_trace(con, trace_id, ref)
    return int(row[0]), str(row[1])


def run_of_trace(con: duckdb.DuckDBPyConnection, trace_id: int, ref: str | None = None) -> tuple[int, str]:
    """The (run_id, name) of the run the trace `trace_id` is a rank of (a trace loaded alone is
    a run of its own).

    Raises:
        NotFoundError: the trace belongs to no run (`ref`: how the message names it).
    """
    row = first_row(con, "SELECT r.run_id, r.name FROM runs r JOIN ranks k USING (run_id) "
                         "WHERE k.trace_id = ? LIMIT 1", [trace_id])
    if row is None:
        raise NotFoundError(f"trace {ref or trace_id!r} belongs to no run: load it again with `traceq load --replace`")
    return int(row[0]), str(row[1])


def resolve_trace_or_run(con: duckdb.DuckDBPyConnection, ref: str | None) -> tuple[int, str]:
    """`resolve_trace`, where a run's name also names a trace: its rank 0's.

    Raises:
        NotFoundError: no trace and no run has that name (the message is `resolve_trace`'s).
    """
    try:
        return resolve_trace(con, ref)
    except NotFoundError:
        row = None if ref is None else first_row(
            con, "SELECT k.trace_id, t.name FROM runs r JOIN ranks k USING (run_id) JOIN traces t USING (trace_id) "
                 "WHERE r.name = ? ORDER BY k.rank LIMIT 1", [ref])
        if row is None:
            raise
        return int(row[0]), str(row[1])


def event_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every table that carries a trace_id column, the traces table included."""
    rows = con.execute(
        "SELECT DISTINCT table_name FROM duckdb_columns() "
        "WHERE column_name = 'trace_id' AND NOT internal AND table_name IN "
        "(SELECT table_name FROM duckdb_tables())"
    ).fetchall()
    return sorted(r[0] for r in rows)


def delete_trace(con: duckdb.DuckDBPyConnection, trace_id: int) -> None:
    """Delete every row of one trace (the caller owns the transaction)."""
    for table in event_tables(con):
        if table != "traces":
            con.execute(f'DELETE FROM "{table}" WHERE trace_id = ?', [trace_id])
    con.execute("DELETE FROM traces WHERE trace_id = ?", [trace_id])
    con.execute("DELETE FROM runs WHERE run_id NOT IN (SELECT run_id FROM ranks)")


def _traceq_version() -> str:
    from traceq import __version__

    return __version__


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def schema_markdown() -> str:
    """docs/schema.md, generated from the comments in schema.sql."""
    out = [
        "# The traceq store schema",
        "",
        "Generated from `schema.sql` by `python -m traceq.store --markdown`; do not edit by hand.",
        f"Store schema version: {SCHEMA_VERSION}.",
        "",
    ]
    intro: list[str] = []
    lines = schema_sql().splitlines()
    i = 0
    while i < len(lines) and lines[i].startswith("--"):
        intro.append(lines[i][2:].strip())
        i += 1
    for paragraph in "\n".join(intro).split("\n\n"):
        if paragraph.strip():
            out += [" ".join(paragraph.split()), ""]
    columns = re.compile(r"^\s+(\w+) ([A-Z]+)(?:(?!--)[^,])*,?\s*(?:--\s*(.*))?$")
    multi = re.compile(r"^\s+(\w+ [A-Z]+, ?)+\w+ [A-Z]+,?\s*$")
    for line in lines[i:]:
        if line.startswith("-- table ") or line.startswith("-- view "):
            kind, rest = line[3:].split(" ", 1)
            name, _, what = rest.partition(":")
            out += ["", f"## {kind} `{name}`", "", what.strip(), ""]
            if kind == "table":
                out += ["| column | type | meaning |", "|---|---|---|"]
        elif multi.match(line):
            for part in line.strip().rstrip(",").split(","):
                col, typ = part.split()
                out.append(f"| `{col}` | {typ} | |")
        elif m := columns.match(line):
            if m.group(1) not in {"SELECT", "FROM", "LEFT", "ON", "AND"}:
                out.append(f"| `{m.group(1)}` | {m.group(2)} | {m.group(3) or ''} |")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--markdown"]:
        sys.stdout.write(schema_markdown())
    else:
        sys.exit("usage: python -m traceq.store --markdown")
