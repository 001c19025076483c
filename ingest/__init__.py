"""Reading trace files into the store: one reader per format (`READERS`, chosen by content in
`detect.reader_for`), all writing the tables of schema.sql.

`read_trace(con, path)` picks the reader, streams the file into the store inside the caller's
transaction, and records the trace in `traces`; `traceq.api.loading` wraps it in one transaction
with what the analyses keep at load, and rolls it back on any error, so the store is exactly as
it was. What a damaged file's rows lacked
is repaired or dropped on the way in (traceq.ingest.validate) and listed in `LoadResult.notes`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from traceq.errors import TraceFormatError, TraceqError
from traceq.ingest.amd import RocprofCsvReader, RocprofDbReader, RpdReader
from traceq.ingest.amd_json import RocprofJsonReader
from traceq.ingest.base import LoadOptions, Reader, Sink, Source, SourceInfo
from traceq.ingest.detect import reader_for
from traceq.ingest.kineto import KinetoReader
from traceq.ingest.nsys import NsysReader
from traceq.ingest.nsys_arrow import NsysArrowReader
from traceq.ingest.nvprof import NvprofReader
from traceq.ingest.pftrace import PftraceReader
from traceq.ingest.rocpd import RocpdReader
from traceq.ingest.sqlite_source import source_damage
from traceq.ingest.validate import unlink_shared_correlations
from traceq.ingest.xplane import XPlaneReader
from traceq.store import delete_trace, first_row

READERS: tuple[Reader, ...] = (NsysReader(), NvprofReader(), KinetoReader(), XPlaneReader(), NsysArrowReader(),
                               RocprofJsonReader(), RocprofCsvReader(), RocprofDbReader(), RpdReader(),
                               RocpdReader(), PftraceReader())

LOAD_SETTINGS = {"memory_limit": "400MB", "threads": "1"}
"""DuckDB settings while a load runs (the connection's own are restored afterwards). Rows a load
has written sit in DuckDB's buffer pool until evicted: without a limit (80 % of RAM by default)
a 10M-kernel load held 1.5 GiB, with it 0.6 GiB. One thread: inserting one ordered stream, a
second DuckDB thread only added CPU time, which the SQLite reader threads need
(docs/performance.md has the figures)."""


@dataclass(frozen=True)
class LoadResult:
    """What `load_trace` did. `status` is 'loaded', 'replaced' or 'already_loaded'; `notes` say
    what a damaged file's rows lacked and what was done ('12 kernels with end < start dropped')."""

    trace_id: int
    name: str
    status: str
    kernel_count: int
    seconds: float = 0.0
    rows: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file; of a folder (a parquetdir export), of its files' names and contents
    in name order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]:
        if path.is_dir():
            digest.update(file.name.encode() + b"\0")
        with file.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def source_bytes(path: Path) -> int:
    """A trace's size: a file's, or a folder's files' together."""
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file()) if path.is_dir() else path.stat().st_size


def _digest_in_background(path: Path) -> Callable[[], str]:
    """`sha256_of(path)` computed on a thread (hashlib and file reads release the GIL)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="traceq-sha256")
    future = pool.submit(sha256_of, path)
    pool.shutdown(wait=False)
    return future.result


def default_name(path: Path) -> str:
    """A trace's name when none is given: its file's name without its suffix (rank0.json.gz: rank0)."""
    return Path(Path(path).name.removesuffix(".gz")).stem


def read_trace(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    *,
    name: str | None = None,
    replace: bool = False,
    progress: Callable[[int, int], None] | None = None,
    engine: str | None = None,
    python_functions: bool = False,
) -> LoadResult:
    """Read the trace file at `path` into the store `con`, inside the caller's transaction: the
    reader's rows, then the trace's row in `traces`. What the analyses keep of a trace (its kernel
    summary, its attribution) and the run it belongs to are the caller's to add before it commits
    (`traceq.api.loading` does all of it); on an error the caller rolls back.

    Args:
        name: the trace's name in the store (default: the file's name without its suffix,
            and without `.json` before `.gz`).
        replace: replace a trace with the same content or the same name instead of refusing.
        progress: called with (rows read so far, rows expected) while reading.
        engine: how big tables are read from SQLite: 'auto' (the default, or
            `$TRACEQ_SQLITE_READER`), 'adbc' or 'stdlib'; see `traceq.ingest.base.open_sqlite`.
            Every engine gives the same store contents.
        python_functions: Kineto traces: keep their `python_function` events as ranges (they
            can be most of a trace's events; off by default).

    Returns the LoadResult; status 'already_loaded' (nothing read) when the same content is
    loaded already and not `replace`.

    Raises:
        TraceFormatError: the file is not a trace traceq reads, or is damaged.
        TraceqError: the name is taken by a different trace (and not `replace`).
    """
    started = time.perf_counter()
    path = Path(path)
    reader = reader_for(path, READERS)
    name = name or default_name(path)
    if first_row(con, "SELECT 1 FROM traces WHERE source_bytes = ? LIMIT 1", [source_bytes(path)]):
        sha = sha256_of(path)  # the same content may be loaded already: decide before reading
        digest: Callable[[], str] = lambda: sha
        same = con.execute("SELECT trace_id, name FROM traces WHERE sha256 = ?", [sha]).fetchall()
    else:  # no trace of this size, so none with this content: hash while the load runs
        digest, same = _digest_in_background(path), []
    if same and not replace:
        tid, existing = same[0]
        count = first_row(con, "SELECT kernel_count FROM traces WHERE trace_id = ?", [tid])[0]
        return LoadResult(int(tid), str(existing), "already_loaded", int(count or 0))
    named = first_row(con, "SELECT trace_id, source_path FROM traces WHERE name = ?", [name])
    if named and not replace:
        raise TraceqError(
            f"a different trace named {name!r} is already loaded (from {named[1]}): "
            "pass --name to choose another name, or --replace"
        )
    stale = {int(r[0]) for r in same} | ({int(named[0])} if named else set())

    src = reader.open(path, LoadOptions(engine=engine or os.environ.get("TRACEQ_SQLITE_READER") or "auto",
                                        python_functions=python_functions))
    damage = source_damage(src)  # an SQLite source counts what it repairs itself (its text factory)
    try:
        for tid in sorted(stale):
            delete_trace(con, tid)
        trace_id = int(first_row(con, "SELECT nextval('trace_ids')")[0])
        sink = Sink(con, trace_id, damage=damage)
        try:
            info = _read(reader, src, sink, progress)
            damage.check_totals()
            unlink_shared_correlations(con, trace_id, damage)
        except sqlite3.DatabaseError as e:  # wherever a reader meets it: a damaged page, say
            raise TraceFormatError(f"{path} is damaged: {e}") from None
        except UnicodeDecodeError:  # SQLite's message quoting damaged text, itself not UTF-8
            raise TraceFormatError(f"{path} is damaged: SQLite reports damage in text that is not UTF-8") from None
        except RecursionError:  # JSON nested deeper than Python's parser goes (a crafted file)
            raise TraceFormatError(f"{path} is not a trace traceq reads: its JSON is nested too deeply") from None
        except (duckdb.ConversionException, duckdb.OutOfRangeException) as e:  # a value no column holds
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TraceFormatError(f"{path} holds a value out of range: {first}") from None
        except TraceFormatError as e:  # the reader's or the checks' (ingest.validate): name the file once
            raise TraceFormatError(str(e) if str(e).startswith(str(path)) else f"{path}: {e}") from None
        _record_trace(con, trace_id, name, path, digest(), info, time.perf_counter() - started)
    finally:
        src.close()
    return LoadResult(trace_id, name, "replaced" if stale else "loaded", sink.rows.get("kernel_events", 0),
                      time.perf_counter() - started, dict(sink.rows), damage.notes())


@contextmanager
def load_settings(con: duckdb.DuckDBPyConnection) -> Iterator[dict[str, str]]:
    """LOAD_SETTINGS in force on `con` for the block, which gets the connection's own; they are
    restored after it. Enter it outside the load's transaction: a failed transaction refuses
    settings until it is rolled back."""
    saved = dict(zip(LOAD_SETTINGS, first_row(con, "SELECT " + ", ".join(
        f"current_setting('{k}')" for k in LOAD_SETTINGS)), strict=True))
    changed = {k: v for k, v in LOAD_SETTINGS.items() if str(saved[k]) != v}  # a warm worker's store: threads 1 already
    apply_settings(con, changed)
    try:
        yield saved
    finally:
        apply_settings(con, {k: saved[k] for k in changed})


def _read(reader: Reader, src: Source, sink: Sink,
          progress: Callable[[int, int], None] | None) -> SourceInfo:
    """`reader.read(src, sink)`, reporting progress against the reader's estimate of the rows."""
    total = max(reader.estimate_rows(src), 1)
    done = 0

    def advance(rows: int) -> None:
        nonlocal done
        done += rows
        if progress is not None:
            progress(min(done, total), total)

    sink.progress = advance
    return reader.read(src, sink)


def apply_settings(con: duckdb.DuckDBPyConnection, settings: dict[str, str]) -> None:
    for key, value in settings.items():
        con.execute(f"SET {key} = '{value}'")


def _record_trace(
    con: duckdb.DuckDBPyConnection, trace_id: int, name: str, path: Path, sha: str,
    info: SourceInfo, seconds: float,
) -> None:
    from traceq import __version__

    con.execute(
        """
        INSERT INTO traces
        WITH activity AS (
            SELECT start_ns, end_ns FROM kernel_events WHERE trace_id = $id
            UNION ALL SELECT start_ns, end_ns FROM memops WHERE trace_id = $id
        ),
        used AS (
            SELECT g.name, count(*) AS n FROM gpus g
            WHERE g.trace_id = $id AND (
                g.device_id IN (SELECT DISTINCT device_id FROM kernel_queues WHERE trace_id = $id)
                OR NOT EXISTS (SELECT 1 FROM kernel_events WHERE trace_id = $id))
            GROUP BY g.name
        )
        SELECT $id, $name, $path, $sha, $bytes, $format, $tool, $schema,
               (SELECT string_agg(CASE WHEN n > 1 THEN n || 'x ' || name ELSE name END, ', '
                                  ORDER BY name) FROM used),
               (SELECT count(*) FROM kernel_events WHERE trace_id = $id),
               (SELECT min(start_ns) FROM activity), (SELECT max(end_ns) FROM activity),
               (SELECT max(end_ns) - min(start_ns) FROM activity),
               $session_start, $loaded_at, $seconds, $version, $rank, $world_size, $backend
        """,
        {
            "id": trace_id, "name": name, "path": str(path.resolve()), "sha": sha,
            "bytes": source_bytes(path), "format": info.format, "tool": info.tool,
            "schema": info.schema_version, "session_start": info.session_start_utc_ns,
            "loaded_at": datetime.now(UTC).replace(tzinfo=None), "seconds": seconds,
            "version": __version__, "rank": info.rank, "world_size": info.world_size, "backend": info.backend,
        },
    )


def export_report(path: Path) -> Path:
    """Run `nsys export --type sqlite` on an .nsys-rep/.qdrep; returns the .sqlite it wrote.

    The export goes beside the report (as `nsys export` itself does), or to a temporary folder
    when that folder is not writable; an existing export there is loaded as it is.
    """
    out = path.with_suffix(".sqlite")
    if out.exists():
        return out
    if not os.access(path.parent, os.W_OK):
        out = Path(tempfile.mkdtemp(prefix="traceq-export-")) / out.name
    nsys = shutil.which("nsys")
    if nsys is None:
        raise TraceFormatError(f"{path}: --export needs `nsys` on PATH; export it elsewhere with "
                               f"`nsys export --type sqlite {path}`")
    done = subprocess.run([nsys, "export", "--type", "sqlite", "--output", str(out), str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise TraceFormatError(f"{path}: `nsys export` failed ({detail[-1] if detail else done.returncode})")
    return out


__all__ = ["LOAD_SETTINGS", "READERS", "LoadResult", "apply_settings", "default_name", "export_report", "load_settings", "read_trace",
           "reader_for", "sha256_of"]
