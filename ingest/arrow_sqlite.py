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

docs/performance.md has the measurements behind these choices.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

CHUNK_ROWS = 65_536
"""Rowids per chunk: big enough that a query's start-up cost is lost, small enough to bound memory."""

WORKERS = max(1, min(2, os.cpu_count() or 1))
"""Reader threads. Two: on a 2-core machine DuckDB's writer needs the rest."""

READ_AHEAD = 8
"""Chunks read ahead of the writer beyond one per worker, at most. Chunks come back in rowid order,
so with one spare (as before) a slow chunk stalled both the writer and the idle worker: on the
10M-kernel trace the cores were 80 % busy while reading API calls, and the load took 20.3 s; with
8 spare, 18.8 s for 15 MiB more peak memory (16 gave nothing more)."""

TEXT_READ_AHEAD = 1
"""...but for tables that read text (NVTX messages, names): 8 chunks of those ahead put the
10M-range ResNet-50 load at 966 MiB of peak memory, one at 769 MiB (the 10M-kernel load, all
integers, gains 15 MiB with 8)."""

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
        self, src: sqlite3.Connection, table: str, select: str, schema: pa.Schema, where: str,
        fallback: Callable[[str], Iterator[pa.Table]],
        transform: Callable[[pa.Table], pa.Table] | None = None,
    ) -> Iterator[pa.Table]:
        """The rows of `SELECT {select} FROM table WHERE {where}` in rowid order, as tables of `schema`.

        `select` names each column `AS` its field in `schema`; `fallback(sql)` reads one chunk's
        SQL with sqlite3 when the driver refuses it. `transform`, when given, is applied to each
        chunk on the reading thread (Arrow compute releases the GIL), so the thread that inserts
        into the store does nothing else.
        """
        # Two queries: SQLite answers min() or max() of the rowid alone from the b-tree's ends,
        # but both in one query by scanning the whole table.
        lo = src.execute(f'SELECT min(rowid) FROM "{table}"').fetchone()[0]
        hi = src.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0]
        if lo is None:
            return
        body = f'SELECT {select} FROM "{table}" WHERE ({where}) AND rowid BETWEEN {{lo}} AND {{hi}}'
        # A first row of the right types, dropped after reading: the driver types each column
        # from the first row it sees, and a column that starts with NULLs would become int64.
        typed = ", ".join(f"{_typed_value(f.type)} AS {f.name}" for f in schema)
        ranges = iter(range(lo, hi + 1, CHUNK_ROWS))
        pending: deque[tuple[str, Future[pa.Table | None]]] = deque()
        with ThreadPoolExecutor(self.workers, thread_name_prefix="traceq-sqlite", initializer=_yield_to_writer) as pool:
            try:
                def submit() -> bool:
                    start = next(ranges, None)
                    if start is None:
                        return False
                    sql = body.format(lo=start, hi=min(start + CHUNK_ROWS - 1, hi))
                    pending.append((sql, pool.submit(self._read, f"SELECT {typed} UNION ALL {sql}", schema, transform)))
                    return True

                text = any(_is_text(f.type) for f in schema)
                for _ in range(self.workers + (TEXT_READ_AHEAD if text else READ_AHEAD)):
                    submit()
                while pending:
                    sql, future = pending.popleft()
                    submit()
                    chunk = future.result()
                    if chunk is None:
                        yield from (t if transform is None else transform(t) for t in fallback(sql))
                    elif chunk.num_rows:
                        yield chunk
            finally:
                for _, future in pending:
                    future.cancel()

    def _read(
        self, sql: str, schema: pa.Schema, transform: Callable[[pa.Table], pa.Table] | None,
    ) -> pa.Table | None:
        con = self._idle.get()
        try:
            statement = self._statement(con)
            try:
                statement.set_options(**{"adbc.sqlite.query.batch_rows": str(CHUNK_ROWS + 1)})
                statement.set_sql_query(sql)
                stream, _ = statement.execute_query()
                table = pa.RecordBatchReader.from_stream(stream).read_all()
            finally:
                statement.close()
        except Exception:  # typically a value of another type than the first row's: sqlite3
            return None     # reads the chunk again, and names the problem if it is damage
        finally:
            self._idle.put(con)
        table = table.slice(1).rename_columns(schema.names).cast(schema)
        return table if transform is None else transform(table)


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
