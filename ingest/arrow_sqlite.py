"""The fast way to stream a big SQLite table: Arrow batches from Apache Arrow's ADBC SQLite driver.

The stdlib `sqlite3` module turns every value into a Python object; at tens of millions of rows
that, not SQLite, is the cost of a load. The ADBC driver (`adbc-driver-sqlite`, a compiled
SQLite and driver inside the wheel: nothing is downloaded at run time) fills Arrow arrays in C
without the GIL, so several threads can read one table at once.

`ArrowScanner.scan` cuts a table into rowid ranges of CHUNK_ROWS, reads them on WORKERS threads,
each with its own read-only connection, and yields the chunks in rowid order: the rows and their
order are exactly those of the stdlib path (`SELECT ... FROM table`, a rowid-order scan), with at
most a few chunks in memory. A chunk the driver cannot type (it infers each column's type from
the first row, and refuses a later value of another type) is read again with `sqlite3`.
Columns that hold one value all through the first chunk are checked, not read, in the next ones
(see `scan`): the driver's cost is per value it passes.

docs/performance.md has the measurements behind these choices.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def as_select(columns: Sequence[tuple[str, str]]) -> str:
    """A SELECT list from (column, SQL expression) pairs."""
    return ", ".join(f"{expr} AS {alias}" for alias, expr in columns)


CHUNK_ROWS = 65_536
"""Rowids per chunk: big enough that a query's start-up cost is lost, small enough to bound memory."""

WORKERS = max(1, min(2, os.cpu_count() or 1))
"""Reader threads. Two: on a 2-core machine DuckDB's writer needs the rest."""

READ_AHEAD = 8
"""Chunks read ahead of the writer beyond one per worker, at most. Chunks come back in rowid order,
so with one spare (as before) a slow chunk stalled both the writer and the idle worker: on the
10M-kernel trace the cores were 80 % busy while reading API calls, and the load took 20.3 s; with
8 spare, 18.8 s for 15 MiB more peak memory (16 gave nothing more)."""

TEXT_READ_AHEAD = 4
"""...but for tables that read text (NVTX messages, names): 8 chunks of those ahead put the
10M-range ResNet-50 load at 966 MiB of peak memory, one at 769 MiB (the 10M-kernel load, all
integers, gains 15 MiB with 8). Since the store keeps NVTX attributes as an id (schema 5), 4
ahead keep the writer busy (1 ahead left it waiting a fifth of the time) for 60 to 75 MiB
more: 774 MiB, against 864 with 8."""

ENGINES = ("auto", "adbc", "stdlib")
"""How `open_sqlite` reads big tables: ADBC when it imports (auto), ADBC or fail, or sqlite3."""


class ArrowScanner:
    """Reads rowid ranges of one SQLite file through ADBC on a few threads."""

    def __init__(self, path: Path, workers: int = WORKERS):
        # ADBC's own API, not its DB-API module: that one imports polars and more (0.2 s a load)
        import adbc_driver_manager
        import adbc_driver_sqlite

        self.path = path
        self.workers = workers
        self._statement = adbc_driver_manager.AdbcStatement
        uri = path.resolve().as_uri() + "?mode=ro"
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._all: list[Any] = []  # (database, connection) pairs, one per worker
        for _ in range(workers):
            database = adbc_driver_sqlite.connect(uri)
            self._all.append((database, adbc_driver_manager.AdbcConnection(database)))
            self._idle.put(self._all[-1][1])

    def close(self) -> None:
        for database, con in self._all:
            for handle in (con, database):
                try:
                    handle.close()
                except Exception:  # closed already or broken: nothing left to release
                    pass
        self._all = []

    def scan(
        self, src: sqlite3.Connection, table: str, columns: Sequence[tuple[str, str]], schema: pa.Schema,
        where: str, fallback: Callable[[str], Iterator[pa.Table]],
        transform: Callable[[pa.Table], pa.Table] | None = None,
    ) -> Iterator[pa.Table]:
        """The rows of `SELECT expression AS column, ... FROM table WHERE {where}` in rowid order, as tables of `schema`.

        `columns` holds (column, SQL expression) pairs for the fields of `schema`; `fallback(sql)`
        reads one chunk's SQL with sqlite3 when the driver refuses it. `transform`, when given,
        is applied to each chunk on the reading thread (Arrow compute releases the GIL), so the
        thread that inserts into the store does nothing else.

        Integer columns that hold one value throughout the first chunk (MIN_PRESUMED of them at
        least) are presumed to hold it in the next ones: a chunk then reads, instead of them, one
        column saying row by row whether every one of them still does (`(expression) IS value
        AND ...`), and they are filled in when all rows do. A chunk where some row does not is
        read again in full, and the columns that changed in it are read from then on. SQLite
        still decodes every value; the driver, which costs more per value, passes one instead
        of several (docs/performance.md, "The fifth round").
        """
        # Two queries: SQLite answers min() or max() of the rowid alone from the b-tree's ends,
        # but both in one query by scanning the whole table.
        lo = src.execute(f'SELECT min(rowid) FROM "{table}"').fetchone()[0]
        hi = src.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0]
        if lo is None:
            return
        span = f'FROM "{table}" WHERE ({where}) AND rowid BETWEEN {{lo}} AND {{hi}}'
        ranges = iter(range(lo, hi + 1, CHUNK_ROWS))
        presumed: dict[str, int | None] = {}
        pending: deque[tuple[str, Future[tuple[pa.Table | None, dict[str, int | None] | None]]]] = deque()
        with ThreadPoolExecutor(self.workers, thread_name_prefix="traceq-sqlite", initializer=_yield_to_writer) as pool:
            try:
                def submit(learn: bool = False) -> bool:
                    start = next(ranges, None)
                    if start is None:
                        return False
                    chunk = span.format(lo=start, hi=min(start + CHUNK_ROWS - 1, hi))
                    pending.append((f"SELECT {as_select(columns)} {chunk}", pool.submit(
                        self._read, chunk, columns, schema, dict(presumed), learn, transform)))
                    return True

                # the first chunk alone: what it holds decides what the others presume
                submit(learn=True)
                text = any(_is_text(f.type) for f in schema)
                ahead = self.workers + (TEXT_READ_AHEAD if text else READ_AHEAD)
                first = True
                while pending:
                    sql, future = pending.popleft()
                    chunk, held = future.result()
                    if held is not None:  # read in full: presume from then on what it held throughout
                        if not first:
                            held = {c: v for c, v in presumed.items() if c in held and held[c] == v}
                        presumed = held if len(held) >= MIN_PRESUMED else {}
                    first = False
                    while len(pending) < ahead and submit():
                        pass
                    if chunk is None:
                        yield from (t if transform is None else transform(t) for t in fallback(sql))
                    elif chunk.num_rows:
                        yield chunk
            finally:
                for _, future in pending:
                    future.cancel()

    def _read(
        self, chunk: str, columns: Sequence[tuple[str, str]], schema: pa.Schema,
        presumed: dict[str, int | None], learn: bool, transform: Callable[[pa.Table], pa.Table] | None,
    ) -> tuple[pa.Table | None, dict[str, int | None] | None]:
        """One chunk (`chunk`: the FROM clause of its rowid range), and, when it was read in full
        because `learn` or because a presumed value did not hold, its one-valued columns.
        None for the table when the driver refuses the chunk."""
        con = self._idle.get()
        try:
            table = None
            if presumed:
                rest = [(c, e) for c, e in columns if c not in presumed]
                check = " AND ".join(f"({e}) IS {_literal(presumed[c])}" for c, e in columns if c in presumed)
                fields = [schema.field(c) for c, _ in rest] + [pa.field(HELD, pa.int64())]
                table = self._query(con, rest + [(HELD, f"({check})")], chunk, pa.schema(fields))
                if table is not None:
                    held = table[HELD]
                    if held.null_count == 0 and pc.min(held).as_py() in (None, 1):
                        table = _filled(table, presumed, schema)
                        return (table if transform is None else transform(table)), None
            table = self._query(con, columns, chunk, schema)
        finally:
            self._idle.put(con)
        if table is None:
            return None, None
        held_values = _one_valued(table) if learn or presumed else None
        return (table if transform is None else transform(table)), held_values

    def _query(
        self, con: Any, columns: Sequence[tuple[str, str]], chunk: str, schema: pa.Schema,
    ) -> pa.Table | None:
        # A first row of the right types, dropped after reading: the driver types each column
        # from the first row it sees, and a column that starts with NULLs would become int64.
        typed = ", ".join(f"{_typed_value(f.type)} AS {f.name}" for f in schema)
        try:
            statement = self._statement(con)
            try:
                statement.set_options(**{"adbc.sqlite.query.batch_rows": str(CHUNK_ROWS + 1)})
                statement.set_sql_query(f"SELECT {typed} UNION ALL SELECT {as_select(columns)} {chunk}")
                stream, _ = statement.execute_query()
                table = pa.RecordBatchReader.from_stream(stream).read_all()
            finally:
                statement.close()
            table = table.slice(1).rename_columns(schema.names).cast(schema)
            for field, column in zip(schema, table.columns):
                if _is_text(field.type):
                    column.validate(full=True)  # the driver passes text that is not UTF-8 as it is
        except Exception:  # a value of another type than the first row's, text that is not UTF-8:
            return None     # sqlite3 reads the chunk again, and repairs and counts what is damaged
        return table


MIN_PRESUMED = 2
"""Presuming one column saves nothing: the column that checks it replaces it."""

HELD = "traceq_presumed_held"
"""The column that says whether a row holds every presumed value (1) or not (0)."""


def _literal(value: int | None) -> str:
    return "NULL" if value is None else str(int(value))


def _one_valued(table: pa.Table) -> dict[str, int | None]:
    """The integer columns of `table` that hold one value (or only NULL) in every row."""
    found: dict[str, int | None] = {}
    if not table.num_rows:
        return found
    for field, column in zip(table.schema, table.columns):
        if not pa.types.is_integer(field.type):
            continue
        if column.null_count == table.num_rows:
            found[field.name] = None
        elif column.null_count == 0:
            low, high = pc.min_max(column).values()
            if low == high:
                found[field.name] = low.as_py()
    return found


def _filled(table: pa.Table, presumed: dict[str, int | None], schema: pa.Schema) -> pa.Table:
    """`table` with the presumed columns put back, each its one value in every row."""
    n = table.num_rows
    return pa.Table.from_arrays([
        (pa.nulls(n, f.type) if presumed[f.name] is None else pa.repeat(pa.scalar(presumed[f.name], f.type), n))
        if f.name in presumed else table[f.name]
        for f in schema
    ], schema=schema)


READER_NICENESS = 5
"""How much lower the reading threads run than the thread inserting into the store. On two cores
the two readers and the writer want three: the writer is the critical path, the readers are
ahead by several chunks, so they give way."""


def _yield_to_writer() -> None:
    if not sys.platform.startswith("linux"):  # elsewhere the id would name a process, not a thread
        return
    try:  # Linux applies a thread id's priority to that thread alone
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + READER_NICENESS)
    except (AttributeError, OSError):  # not Linux, or not allowed: same priority as before
        pass


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _typed_value(t: pa.DataType) -> str:
    if _is_text(t):
        return "''"
    if pa.types.is_floating(t):
        return "0.0"
    return "0"
