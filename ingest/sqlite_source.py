"""SQLite sources: an export opened read-only (`open_sqlite`), what it holds (tables, columns,
row estimates), and its tables streamed as Arrow batches of the store's columns (`scan_table`),
through the ADBC driver's parallel scanner (`arrow_sqlite`) where it loads."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from traceq.errors import TraceqError
from traceq.ingest.arrow_sqlite import as_select
from traceq.ingest.validate import Damage, decode_text, to_arrow

BATCH_ROWS = 50_000
"""Rows fetched from a source per batch: bounds the memory a load uses whatever the trace size."""


def table_names(src: sqlite3.Connection) -> set[str]:
    return {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def column_names(src: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in src.execute(f'PRAGMA table_info("{table}")')}


def row_estimate(src: sqlite3.Connection, tables: Iterable[str]) -> int:
    """Sum of max(rowid) over the tables that exist: O(log n) each, unlike count(*)."""
    present = table_names(src)
    total = 0
    for t in tables:
        if t in present:
            try:
                total += src.execute(f'SELECT coalesce(max(rowid), 0) FROM "{t}"').fetchone()[0]
            except sqlite3.OperationalError:  # WITHOUT ROWID tables
                total += src.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
    return total


def select_columns(
    available: set[str], wanted: Sequence[tuple[str, str, Sequence[str]]]
) -> list[tuple[str, str]]:
    """(store column, SQL expression) for each of `wanted`: its source expression, or NULL.

    `wanted` holds (store column, SQL expression over source columns, source columns the
    expression needs). When any needed column is missing from `available`, NULL stands in.
    """
    return [(alias, expr if all(c in available for c in needs) else "NULL") for alias, expr, needs in wanted]


def select_list(available: set[str], wanted: Sequence[tuple[str, str, Sequence[str]]]) -> str:
    """`select_columns` as a SELECT list naming each store column once."""
    return as_select(select_columns(available, wanted))


def fetch_batches(
    src: sqlite3.Connection, sql: str, schema: pa.Schema, params: Sequence[object] = (), source: str | None = None,
) -> Iterator[pa.Table]:
    """Run `sql` and yield its rows as Arrow tables of at most BATCH_ROWS rows with `schema`.

    A value of another type than its field's becomes NULL, counted in the source's damage
    (`validate.to_arrow`; `source`, the table read, names where in the count).
    """
    damage = source_damage(src)
    cur = src.execute(sql, params)
    while rows := cur.fetchmany(BATCH_ROWS):
        columns = list(zip(*rows))
        yield pa.Table.from_arrays(
            [to_arrow(col, field, damage, source) for col, field in zip(columns, schema)], schema=schema
        )


def source_damage(src: sqlite3.Connection) -> Damage:
    """The `Damage` of a source opened by `open_sqlite` (a new one for any other connection)."""
    return getattr(src, "damage", None) or Damage()


def scan_table(
    src: sqlite3.Connection, table: str, columns: Sequence[tuple[str, str]], schema: pa.Schema,
    where: str = "1", transform: Callable[[pa.Table], pa.Table] | None = None,
) -> Iterator[pa.Table]:
    """`SELECT expression AS column, ... FROM table WHERE {where}` as Arrow tables of `schema`, in rowid order.

    `columns` holds (column, SQL expression) pairs, the columns being those of `schema` (see
    `select_columns`). A source opened with the ADBC engine (see `open_sqlite`) reads the table
    in parallel rowid ranges; otherwise, or for a table without rowids, this is `fetch_batches`
    over the plain query. Both give the same rows in the same order. `transform`, applied to
    every table before it is yielded, runs on the reading threads when there are some.
    """
    sql = f'SELECT {as_select(columns)} FROM "{table}" WHERE ({where})'
    scanner = getattr(src, "scanner", None)
    if scanner is not None:
        try:
            src.execute(f'SELECT rowid FROM "{table}" LIMIT 0')
        except sqlite3.OperationalError:  # WITHOUT ROWID
            scanner = None
    if scanner is None:
        batches = fetch_batches(src, sql, schema, source=table)
        yield from (batches if transform is None else map(transform, batches))
        return
    yield from scanner.scan(src, table, columns, schema, where,
                            lambda chunk_sql: fetch_batches(src, chunk_sql, schema, source=table), transform)


class SourceConnection(sqlite3.Connection):
    """A read-only SQLite source; `scanner` (an ArrowScanner or None) streams big tables fast,
    `damage` counts what was repaired while reading it (text that is not UTF-8 among others)."""

    scanner: Any = None
    damage: Damage | None = None

    def close(self) -> None:
        if self.scanner is not None:
            self.scanner.close()
            self.scanner = None
        super().close()


def open_sqlite(path: Path, engine: str = "stdlib") -> sqlite3.Connection:
    """Open an SQLite file read-only, never creating or locking it for writing.

    `engine` says how `scan_table` reads big tables: 'stdlib' (the sqlite3 module, always
    there), 'adbc' (the ADBC SQLite driver on several threads; TraceFormatError when it is not
    installed) or 'auto' (adbc when it imports, else stdlib). What is repaired while reading is
    counted in the connection's `damage`.
    """
    from traceq.ingest import arrow_sqlite

    if engine not in arrow_sqlite.ENGINES:
        raise TraceqError(f"the SQLite reader (TRACEQ_SQLITE_READER) must be one of "
                          f"{', '.join(arrow_sqlite.ENGINES)}, not {engine!r}")
    uri = path.resolve().as_uri() + "?mode=ro"
    # DuckDB pulls `Sink.append_all`'s stream, and so runs these queries, on its own threads;
    # only one of them at a time, while the loading thread waits in DuckDB.
    con = sqlite3.connect(uri, uri=True, factory=SourceConnection, check_same_thread=False)
    con.damage = Damage()
    con.text_factory = decode_text(con.damage)
    con.execute("PRAGMA query_only = 1")
    if engine != "stdlib":
        try:
            con.scanner = arrow_sqlite.ArrowScanner(path)
        except Exception as e:  # not installed, or its library does not load here
            if engine == "adbc":
                con.close()
                raise TraceqError(
                    f"the ADBC SQLite reader cannot be used ({e}): `pip install adbc-driver-sqlite`, "
                    "or read with the standard library (TRACEQ_SQLITE_READER=stdlib)"
                ) from None
    return con
