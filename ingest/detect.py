"""Which reader a file needs, decided from its content in one place.

Every way a file can fail to be a trace we read ends here in one TraceFormatError line that
names the file, says what it is, and what to do.
"""

from __future__ import annotations

import gzip
import shutil
import sqlite3
import zlib
from pathlib import Path

from traceq.errors import TraceFormatError
from traceq.ingest.base import Reader
from traceq.ingest.json_events import GZIP_MAGIC
from traceq.ingest.nsys_arrow import looks_like_arrow_export, looks_like_parquet_export
from traceq.ingest.sqlite_source import open_sqlite, table_names

SQLITE_MAGIC = b"SQLite format 3\x00"
PERFETTO_SUFFIXES = (".pftrace", ".perfetto-trace", ".perfetto")
NSYS_REPORT_MAGIC = b"NVIDIA Tegra Profiler Re"  # .nsys-rep and .qdrep files


def check_file(path: Path) -> None:
    """Raise unless `path` is a non-empty regular file (or an nsys parquetdir export's folder)."""
    if not path.exists():
        raise TraceFormatError(f"{path}: no such file")
    if path.is_dir() and looks_like_parquet_export(path):
        return
    if path.is_dir():
        raise TraceFormatError(f"{path} is a directory: give a trace file (an nsys SQLite export, an nvprof database "
                               "or a Kineto JSON trace) or an nsys parquetdir export's folder")
    if path.stat().st_size == 0:
        raise TraceFormatError(f"{path} is empty (0 bytes), not a trace")


def reader_for(path: Path, readers: tuple[Reader, ...]) -> Reader:
    """The reader for `path`, judged by content, not by name."""
    check_file(path)
    if path.is_dir():  # check_file let only an nsys parquetdir export's folder through
        return next(r for r in readers if r.container == "arrow")
    with path.open("rb") as f:
        head = f.read(4096)
    if looks_like_arrow_export(head):
        return next(r for r in readers if r.container == "arrow")
    if head.startswith(SQLITE_MAGIC):
        _check_sqlite_size(path, head)
        tables = _sqlite_tables(path)
        for reader in readers:
            if reader.container == "sqlite" and reader.sniff(tables):
                return reader
        raise TraceFormatError(
            f"{path} is an SQLite database but not a profiler export (no Nsight Systems or nvprof tables)"
        )
    if head.startswith(NSYS_REPORT_MAGIC):
        hint = "pass --export to let traceq run it" if shutil.which("nsys") else "nsys is not on PATH here"
        raise TraceFormatError(
            f"{path} is an Nsight Systems report: export it first with "
            f"`nsys export --type sqlite {path}` and load the .sqlite ({hint})"
        )
    text = _json_head(path, head)
    if text is None:
        with path.open("rb") as f:
            probe = f.read(1 << 16)
        for reader in readers:
            if reader.container == "protobuf" and reader.sniff(probe):
                return reader
        if path.name.lower().endswith(PERFETTO_SUFFIXES):  # damaged from its first packet: the reader says where
            return next(r for r in readers if r.name == "pftrace")
    if text is not None:
        for reader in readers:
            if reader.container == "json" and reader.sniff(text):
                return reader
        raise TraceFormatError(f"{path} is JSON but not a PyTorch profiler (Kineto) trace: it has no traceEvents "
                               "(nor a rocprofv3 JSON output: no rocprofiler-sdk-tool)")
    header = head.split(b"\n", 1)[0].decode("utf-8", "replace")
    for reader in readers:
        if reader.container == "csv" and reader.sniff(header):
            return reader
    raise TraceFormatError(
        f"{path} is not a trace traceq can read: expected an Nsight Systems SQLite export "
        "(`nsys export --type sqlite`), an nvprof database, a PyTorch profiler (Kineto) JSON trace, "
        "a JAX/TensorFlow profile (*.xplane.pb), a Perfetto protobuf trace (*.pftrace) "
        "or an AMD profile (rocprofv3 JSON or CSV, rocprof, RPD)"
    )


def _check_sqlite_size(path: Path, head: bytes) -> None:
    """A file shorter than its header's page count is truncated (SQLite file format §1.3)."""
    if len(head) < 100:
        raise TraceFormatError(f"{path} is truncated: shorter than an SQLite header")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    counter_ok = head[24:28] == head[92:96]  # the in-header size is valid only when these match
    size = path.stat().st_size
    if counter_ok and pages and size < pages * page_size:
        raise TraceFormatError(
            f"{path} is truncated: its header says {pages * page_size:,} bytes but the file has "
            f"{size:,}; copy or export it again"
        )


def _sqlite_tables(path: Path) -> set[str]:
    try:
        con = open_sqlite(path)
        try:
            tables = table_names(con)
            con.execute("PRAGMA schema_version").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:  # its message may quote the damaged schema, newlines and all
        cause = " ".join(str(e).split())
        raise TraceFormatError(f"{path} is a damaged SQLite file ({cause[:200]})") from None
    except UnicodeDecodeError:  # SQLite's own message quotes the damaged schema, not UTF-8 either
        raise TraceFormatError(f"{path} is a damaged SQLite file (its schema is not UTF-8 text)") from None
    return tables


def _json_head(path: Path, head: bytes) -> bytes | None:
    """The first 64 KiB of the file's text, decompressed when it is gzip, when it starts like JSON
    (an object or an array); None otherwise. A gzip file that ends before 64 KiB of text is
    truncated (or damaged) unless it ends cleanly."""
    if head[:2] == GZIP_MAGIC:
        try:
            with gzip.open(path, "rb") as f:
                text = f.read(1 << 16)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceFormatError(f"{path} is a truncated or damaged gzip file ({e}); copy it again") from None
    else:
        with path.open("rb") as f:
            text = f.read(1 << 16)
    return text if text.lstrip()[:1] in (b"{", b"[") else None
