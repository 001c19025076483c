"""Nsight Systems exports as Arrow: `nsys export --type arrow` (one file: an Arrow IPC stream per
table, one after another, each schema naming its table in the metadata key `table_name`) and
`nsys export --type parquetdir` (a folder of `TABLE.parquet` files, the same metadata). Both hold
the tables and columns of the SQLite export, so they are staged, table by table, into an SQLite
file in a scratch folder and read there by the SQLite export's reader (`nsys.NsysReader`): the
three forms load alike, checked on one report exported all three ways (tests/test_nsys_arrow.py).

Staging costs what writing the rows into SQLite costs (about a second per million rows here);
the SQLite export is the fast way in for large reports. Table and column names come from the
file: they are quoted, never run as SQL of their own.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from traceq.errors import TraceFormatError
from traceq.ingest.base import LoadOptions, Sink, SourceInfo
from traceq.ingest.nsys import NsysReader
from traceq.ingest.scratch import new_scratch
from traceq.ingest.sqlite_source import open_sqlite

ARROW_MAGIC = b"\xff\xff\xff\xff"
"""An Arrow IPC stream's first bytes (the continuation marker of its schema message)."""
TABLE_KEY = b"table_name"
_BATCH_ROWS = 50_000


def looks_like_arrow_export(head: bytes) -> bool:
    """Whether a file's first bytes are an Arrow stream whose schema names an nsys table."""
    return head.startswith(ARROW_MAGIC) and TABLE_KEY in head


def looks_like_parquet_export(path: Path) -> bool:
    """Whether a folder holds an nsys parquetdir export (its string table and an event table)."""
    return path.is_dir() and (path / "StringIds.parquet").is_file() and any(path.glob("CUPTI_ACTIVITY_KIND_*.parquet"))


def arrow_tables(path: Path) -> Iterator[tuple[str, pa.Table]]:
    """(table name, table) of each stream of an Arrow export, in file order."""
    from pyarrow import ipc

    source = pa.memory_map(str(path))
    try:
        while source.tell() < source.size():
            reader = ipc.open_stream(source)
            table = reader.read_all()
            table.validate(full=True)  # offsets and lengths inside their buffers: a stream reads without checking
            name = (reader.schema.metadata or {}).get(TABLE_KEY)
            if name is None:
                raise TraceFormatError(f"{path}: an Arrow stream without a table name is not an nsys export")
            yield name.decode("utf-8", "replace"), table
    except (pa.ArrowException, OSError, MemoryError) as e:  # a damaged length can ask for any size
        raise TraceFormatError(f"{path} is a damaged Arrow export ({_first_line(e)})") from None
    finally:
        source.close()


def parquet_tables(path: Path) -> Iterator[tuple[str, pa.Table]]:
    """(table name, table) of each file of a parquetdir export."""
    import pyarrow.parquet as pq

    for file in sorted(path.glob("*.parquet")):
        try:
            table = pq.read_table(file)
            table.validate(full=True)
        except (pa.ArrowException, OSError, MemoryError) as e:
            raise TraceFormatError(f"{file} is a damaged Parquet file ({_first_line(e)})") from None
        name = (table.schema.metadata or {}).get(TABLE_KEY)
        yield (name.decode("utf-8", "replace") if name else file.stem), table


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def stage(tables: Iterator[tuple[str, pa.Table]], target: Path) -> None:
    """Write `tables` into a new SQLite file `target` (INTEGER, REAL and TEXT columns; an unsigned
    64-bit value beyond the signed range is stored as NULL: nsys writes none)."""
    con = sqlite3.connect(target)
    try:
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        for name, table in tables:
            table = pa.table({f.name: _storable(table[f.name], f.type) for f in table.schema})
            columns = ", ".join(f"{_quoted(f.name)} {_sqlite_type(f.type)}" for f in table.schema)
            con.execute(f"CREATE TABLE IF NOT EXISTS {_quoted(name)} ({columns})")
            insert = f"INSERT INTO {_quoted(name)} VALUES ({', '.join('?' * table.num_columns)})"
            for batch in table.to_batches(_BATCH_ROWS):
                con.executemany(insert, zip(*(column.to_pylist() for column in batch.columns)))
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
    """A column as SQLite can hold it: unsigned 64-bit as signed (NULL where it does not fit),
    anything not a number or a string as its text."""
    if pa.types.is_uint64(kind):
        fits = pc.less_equal(column, pa.scalar(2**63 - 1, pa.uint64()))
        return pc.cast(pc.if_else(fits, column, pa.scalar(None, pa.uint64())), pa.int64())
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return column
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column
    return column.cast(pa.string())


class _Staged:
    """The staged SQLite source of an Arrow or Parquet export: the reader's connection and the
    scratch folder it lives in, removed on close."""

    def __init__(self, folder: Path, con: sqlite3.Connection):
        self.folder, self.con = folder, con
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
        folder = new_scratch()
        try:
            target = folder / "staged.sqlite"
            stage(parquet_tables(path) if path.is_dir() else arrow_tables(path), target)
            return _Staged(folder, open_sqlite(target, "stdlib"))
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def estimate_rows(self, src: _Staged) -> int:  # type: ignore[override]
        return super().estimate_rows(src.con)

    def read(self, src: _Staged, sink: Sink) -> SourceInfo:  # type: ignore[override]
        from traceq.ingest.sqlite_source import table_names

        if not super().sniff(table_names(src.con)):
            raise TraceFormatError("an Arrow or Parquet export without Nsight Systems' tables")
        info = super().read(src.con, sink)
        return SourceInfo(format="nsys", tool=info.tool, schema_version=info.schema_version,
                          session_start_utc_ns=info.session_start_utc_ns, rank=info.rank,
                          world_size=info.world_size, backend=info.backend)
