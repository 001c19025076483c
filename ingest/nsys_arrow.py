"""Nsight Systems exports as Arrow: `nsys export --type arrow` (one file: an Arrow IPC stream per
table, one after another, each schema naming its table in the metadata key `table_name`) and
`nsys export --type parquetdir` (a folder of `TABLE.parquet` files, the same metadata). Both hold
the tables and columns of the SQLite export, with nsys's own Arrow types (uint64 ids, int32 grid
sizes, large_string text): the SQLite export's reader (`nsys.NsysReader`) reads them, the three
forms loading alike (tests/test_nsys_arrow.py compares their stores table by table).

The event tables (EVENT_TABLES: kernels, API calls, copies, NVTX...) are read straight from
the files, only the columns the store keeps, in batches of BATCH_ROWS: an Arrow stream's
batches one at a time, a Parquet file's decoded by pyarrow (its footer says where each column is). The
reader's per-batch work then runs on WORKERS threads (`ColumnarScanner`), as it does on the
SQLite export's rows. The few small tables it reads with SQL (STAGED: strings, GPUs, processes,
metadata, GPU metrics) are staged into an SQLite file in a scratch folder; every other table is
created there empty, so the reader sees the export's tables and columns. An unsigned 64-bit
value is kept as the signed one of the same bits, as nsys writes it into its SQLite export.

Table and column names come from the file: they are quoted, never run as SQL of their own.
docs/performance.md ("Nsight's Arrow and Parquet exports") has the measurements.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from traceq.errors import TraceFormatError
from traceq.ingest.arrow_sqlite import READ_AHEAD, WORKERS, _yield_to_writer
from traceq.ingest.base import LoadOptions, Sink, SourceInfo
from traceq.ingest.nsys import EVENT_TABLES, NsysReader
from traceq.ingest.nsys_metrics import NAMES as METRIC_NAMES
from traceq.ingest.nsys_metrics import SAMPLES as METRIC_SAMPLES
from traceq.ingest.scratch import new_scratch
from traceq.ingest.sqlite_source import open_sqlite

ARROW_MAGIC = b"\xff\xff\xff\xff"
"""An Arrow IPC stream's first bytes (the continuation marker of its schema message)."""
TABLE_KEY = b"table_name"
BATCH_ROWS = 65_536
"""Rows per batch read from an event table: as many as the SQLite reader's chunks."""
STAGE_ROWS = 50_000
STAGED = frozenset({
    "StringIds", "TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU", "PROCESSES", "ThreadNames", "META_DATA_EXPORT",
    "EXPORT_META_DATA", "TARGET_INFO_SESSION_START_TIME", METRIC_SAMPLES, METRIC_NAMES,
})
"""The tables `NsysReader` reads with SQL of its own (joins, DISTINCT): copied into the staged SQLite file."""


def looks_like_arrow_export(head: bytes) -> bool:
    """Whether a file's first bytes are an Arrow stream whose schema names an nsys table."""
    return head.startswith(ARROW_MAGIC) and TABLE_KEY in head


def looks_like_parquet_export(path: Path) -> bool:
    """Whether a folder holds an nsys parquetdir export (its string table and an event table)."""
    return path.is_dir() and (path / "StringIds.parquet").is_file() and any(path.glob("CUPTI_ACTIVITY_KIND_*.parquet"))


class ExportTable:
    """One table of an export: its schema, rows, and its batches of chosen columns."""

    def __init__(self, name: str, schema: pa.Schema, rows: int, read: Callable[[list[str]], Iterator[pa.Table]]):
        self.name, self.schema, self.rows, self._read = name, schema, rows, read

    def batches(self, columns: list[str]) -> Iterator[pa.Table]:
        """Tables of at most BATCH_ROWS rows holding `columns`, in the table's order."""
        return self._read(columns)


def arrow_export(path: Path) -> dict[str, ExportTable]:
    """The tables of an Arrow export: each stream's place in the file, schema and rows, found by
    walking its messages through a memory map. The event tables' batches are read, and checked,
    when they are scanned (`_stream_batches`); the other tables' are checked here (offsets and
    lengths inside their buffers, text valid UTF-8), so that a damaged export is refused."""
    from pyarrow import ipc

    tables: dict[str, ExportTable] = {}
    try:
        with pa.memory_map(str(path)) as source:
            while source.tell() < source.size():
                offset = source.tell()
                reader = ipc.open_stream(source)
                raw = (reader.schema.metadata or {}).get(TABLE_KEY)
                if raw is None:
                    raise TraceFormatError(f"{path}: an Arrow stream without a table name is not an nsys export")
                name = raw.decode("utf-8", "replace")
                rows = 0
                for batch in reader:
                    if name not in EVENT_TABLES:  # those are checked batch by batch as they are read
                        batch.validate(full=True)
                    rows += batch.num_rows
                tables[name] = ExportTable(name, reader.schema, rows, _stream_batches(path, offset))
    except (pa.ArrowException, OSError, MemoryError) as e:  # a damaged length can ask for any size
        raise TraceFormatError(f"{path} is a damaged Arrow export ({_first_line(e)})") from None
    return tables


def _stream_batches(path: Path, offset: int) -> Callable[[list[str]], Iterator[pa.Table]]:
    """The batches of the stream at `offset`, read one at a time from the file (not mapped: the
    pages of a mapped 2 GB export stay in the process's resident memory), checked, sliced."""
    def read(columns: list[str]) -> Iterator[pa.Table]:
        from pyarrow import ipc

        try:
            with pa.OSFile(str(path)) as file:
                file.seek(offset)
                for batch in ipc.open_stream(file):
                    batch.validate(full=True)  # a stream reads without checking: a damaged length can point anywhere
                    chosen = pa.Table.from_batches([batch]).select(columns)
                    for start in range(0, chosen.num_rows, BATCH_ROWS):
                        yield chosen.slice(start, BATCH_ROWS)
        except (pa.ArrowException, OSError, MemoryError) as e:
            raise TraceFormatError(f"{path} is a damaged Arrow export ({_first_line(e)})") from None
    return read


def parquet_export(path: Path) -> dict[str, ExportTable]:
    """The tables of a parquetdir export, from each file's footer; the rows are decoded when read."""
    import pyarrow.parquet as pq

    tables: dict[str, ExportTable] = {}
    for file in sorted(path.glob("*.parquet")):
        try:
            parquet = pq.ParquetFile(file, pre_buffer=False)
            schema = parquet.schema_arrow
            rows = parquet.metadata.num_rows
        except (pa.ArrowException, OSError, MemoryError) as e:
            raise TraceFormatError(f"{file} is a damaged Parquet file ({_first_line(e)})") from None
        raw = (schema.metadata or {}).get(TABLE_KEY)
        name = raw.decode("utf-8", "replace") if raw else file.stem
        tables[name] = ExportTable(name, schema, rows, _row_groups(file, parquet))
    return tables


def _row_groups(file: Path, parquet: Any) -> Callable[[list[str]], Iterator[pa.Table]]:
    def read(columns: list[str]) -> Iterator[pa.Table]:
        try:
            for batch in parquet.iter_batches(BATCH_ROWS, columns=columns, use_threads=False):
                batch.validate(full=True)
                yield pa.Table.from_batches([batch])
        except (pa.ArrowException, OSError, MemoryError) as e:
            raise TraceFormatError(f"{file} is a damaged Parquet file ({_first_line(e)})") from None
    return read


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def stage(tables: dict[str, ExportTable], target: Path) -> None:
    """Write the STAGED tables into a new SQLite file `target` (INTEGER, REAL and TEXT columns),
    and every other table without its rows."""
    con = sqlite3.connect(target)
    try:
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        for name, table in tables.items():
            columns = ", ".join(f"{_quoted(f.name)} {_sqlite_type(f.type)}" for f in table.schema)
            con.execute(f"CREATE TABLE IF NOT EXISTS {_quoted(name)} ({columns})")
            if name not in STAGED:
                continue
            insert = f"INSERT INTO {_quoted(name)} VALUES ({', '.join('?' * len(table.schema))})"
            for batch in table.batches(table.schema.names):
                batch = pa.table({f.name: _storable(batch[f.name], f.type) for f in table.schema})
                for rows in batch.to_batches(STAGE_ROWS):
                    con.executemany(insert, zip(*(column.to_pylist() for column in rows.columns)))
        con.commit()
    finally:
        con.close()


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sqlite_type(kind: pa.DataType) -> str:
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return "INTEGER"
    if pa.types.is_floating(kind):
        return "REAL"
    return "TEXT"


def _storable(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    """A column as SQLite holds it: unsigned 64-bit as the signed value of the same bits (as nsys
    writes its SQLite export), anything not a number or a string as its text; bytes that are not
    UTF-8 (a binary column where nsys writes text) with U+FFFD for the bad bytes, as the SQLite
    export's reader reads them."""
    if pa.types.is_uint64(kind):
        return pc.cast(column, pa.int64(), safe=False)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return column
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column
    try:
        return column.cast(pa.string())
    except pa.ArrowInvalid:
        if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
            raise
        return pa.chunked_array([pa.array([None if v is None else v.decode("utf-8", "replace")
                                           for v in column.to_pylist()], pa.string())])


_NAME = re.compile(r'^(?:"((?:[^"]|"")+)"|([A-Za-z_][A-Za-z0-9_]*))$')
_EQUALS = re.compile(r"^\(?([A-Za-z_][A-Za-z0-9_]*) = (-?\d+)\)?$")
_IN = re.compile(r"^\(?([A-Za-z_][A-Za-z0-9_]*) IN \(([-\d, ]+)\)\)?$")


def _column_of(expression: str) -> str | None:
    """The source column an nsys reader's select expression names (None for NULL)."""
    if expression == "NULL":
        return None
    found = _NAME.match(expression)
    if found is None:
        raise ValueError(f"the Arrow reader evaluates column names and NULL only, not {expression!r}")
    return found.group(1).replace('""', '"') if found.group(1) else found.group(2)


def _condition(where: str) -> tuple[str, list[int]] | None:
    """(column, values it must hold) of an nsys reader's WHERE clause; None for every row."""
    if where.strip("() ") == "1":
        return None
    for pattern in (_EQUALS, _IN):
        found = pattern.match(where.strip())
        if found:
            return found.group(1), [int(v) for v in found.group(2).split(",")]
    raise ValueError(f"the Arrow reader evaluates `column = n` and `column IN (...)` only, not {where!r}")


def _as(column: pa.ChunkedArray | pa.Array, kind: pa.DataType) -> pa.ChunkedArray | pa.Array:
    """`column` as the store's type: integers as int64 (unsigned 64-bit ones by their bits, as in
    the SQLite export), text as string."""
    if column.type == kind:
        return column
    if pa.types.is_uint64(column.type) and pa.types.is_int64(kind):  # the same bits: a view, no copy
        if isinstance(column, pa.ChunkedArray):
            return pa.chunked_array([chunk.view(kind) for chunk in column.chunks], kind)
        return column.view(kind)
    return pc.cast(column, kind)


def _column_as(batch: pa.Table, table: str, name: str, kind: pa.DataType) -> pa.ChunkedArray | pa.Array:
    """`_as` of a batch's column; a column of another type than nsys writes, whose values the
    store's type cannot hold (a float column with -inf or 2.5, text), refuses the file."""
    try:
        return _as(batch[name], kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise TraceFormatError(f"the export's {table}.{name} holds a value of another type than nsys writes "
                               f"({_first_line(e)})") from None


class ColumnarScanner:
    """`scan_table` for the event tables of an Arrow or Parquet export (see sqlite_source.scan_table);
    the staged tables are read from the SQLite file."""

    def __init__(self, tables: dict[str, ExportTable], workers: int = WORKERS):
        self.tables, self.workers = tables, workers

    def close(self) -> None:
        pass

    def scan(
        self, src: sqlite3.Connection, table: str, columns: Sequence[tuple[str, str]], schema: pa.Schema,
        where: str, fallback: Callable[[str], Iterator[pa.Table]],
        transform: Callable[[pa.Table], pa.Table] | None = None,
    ) -> Iterator[pa.Table]:
        if table in STAGED or table not in EVENT_TABLES or table not in self.tables:
            from traceq.ingest.arrow_sqlite import as_select

            batches = fallback(f'SELECT {as_select(columns)} FROM {_quoted(table)} WHERE ({where})')
            yield from (batches if transform is None else map(transform, batches))
            return
        source = self.tables[table]
        sources = [_column_of(expression) for _, expression in columns]
        condition = _condition(where)
        needed = list(dict.fromkeys([c for c in sources if c is not None] + ([condition[0]] if condition else [])))
        missing = [c for c in needed if c not in source.schema.names]
        if missing:
            raise TraceFormatError(f"the export's table {table} has no column {missing[0]}")

        def convert(batch: pa.Table) -> pa.Table:  # on the pool's threads
            if condition is not None:
                batch = batch.filter(pc.fill_null(pc.is_in(batch[condition[0]], pa.array(condition[1], batch[
                    condition[0]].type)), False))
            rows = pa.Table.from_arrays([
                pa.nulls(batch.num_rows, field.type) if name is None else _column_as(batch, table, name, field.type)
                for name, field in zip(sources, schema)], schema=schema)
            return rows if transform is None else transform(rows)

        pending: deque[Future[pa.Table]] = deque()
        ahead = self.workers + READ_AHEAD
        with ThreadPoolExecutor(self.workers, thread_name_prefix="traceq-arrow", initializer=_yield_to_writer) as pool:
            try:
                for batch in source.batches(needed):
                    pending.append(pool.submit(convert, batch))
                    while len(pending) > ahead or (pending and pending[0].done()):
                        done = pending.popleft().result()
                        if done.num_rows:
                            yield done
                while pending:
                    done = pending.popleft().result()
                    if done.num_rows:
                        yield done
            finally:
                for future in pending:
                    future.cancel()


class _Staged:
    """The source of an Arrow or Parquet export: the staged SQLite file's connection (its scanner
    reading the event tables from the export) and the scratch folder it lives in, removed on close."""

    def __init__(self, folder: Path, con: sqlite3.Connection, tables: dict[str, ExportTable]):
        self.folder, self.con, self.tables = folder, con, tables
        self.damage = getattr(con, "damage", None)

    def close(self) -> None:
        self.con.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class NsysArrowReader(NsysReader):
    """`nsys export --type arrow` files and `--type parquetdir` folders, through the SQLite reader."""

    name: ClassVar[str] = "nsys-arrow"
    container: ClassVar[str] = "arrow"

    def sniff(self, probe: Any) -> bool:
        if isinstance(probe, Path):
            return looks_like_parquet_export(probe)
        return looks_like_arrow_export(probe)

    def open(self, path: Path, options: LoadOptions) -> _Staged:  # type: ignore[override]
        tables = parquet_export(path) if path.is_dir() else arrow_export(path)
        folder = new_scratch()
        try:
            target = folder / "staged.sqlite"
            stage(tables, target)
            con = open_sqlite(target, "stdlib")
            con.scanner = ColumnarScanner(tables)  # type: ignore[attr-defined]
            return _Staged(folder, con, tables)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def estimate_rows(self, src: _Staged) -> int:  # type: ignore[override]
        return sum(src.tables[t].rows for t in EVENT_TABLES if t in src.tables)

    def read(self, src: _Staged, sink: Sink) -> SourceInfo:  # type: ignore[override]
        from traceq.ingest.sqlite_source import table_names

        if not super().sniff(table_names(src.con)):
            raise TraceFormatError("an Arrow or Parquet export without Nsight Systems' tables")
        info = super().read(src.con, sink)
        return SourceInfo(format="nsys", tool=info.tool, schema_version=info.schema_version,
                          session_start_utc_ns=info.session_start_utc_ns, rank=info.rank,
                          world_size=info.world_size, backend=info.backend)
