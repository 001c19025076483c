"""Pass 1 of the JSON trace readers: each batch of `json_events.TraceEvents` parsed by DuckDB's
JSON reader into a staging table, two batches at a time.

DuckDB's parse of one batch (`read_json` over its chunk files, numbered with a streaming
`row_number()` window) runs on one core whatever its thread setting, so `stage` gives each of
`STAGE_THREADS` Python threads its own connection (`cursor()` of the scratch database) and a
batch at a time; DuckDB releases the GIL while it parses, and its tables take concurrent
appends. The rows are numbered by their batch (the caller's SQL), not by the order of the
inserts. A batch DuckDB cannot read sends the pass back to its start, one batch after the other
(`_serial`): only then can `TraceEvents.exact` re-read that batch with Python's `json` (a cut
inside a string, in a compact layout) before the iteration goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import duckdb

from traceq.errors import TraceFormatError
from traceq.ingest.json_events import Batch, TraceEvents

STAGE_THREADS = 2
"""Batches parsed at once, each on its own DuckDB connection and Python thread."""

InsertSql = Callable[[list[Path], int], str]
"""The SQL inserting the events of chunk files (JSON arrays), given the files and the batch's number."""

_UNREADABLE = (duckdb.InvalidInputException, duckdb.ConversionException)


def stage(scratch: duckdb.DuckDBPyConnection, table: str, events: TraceEvents, folder: Path, insert: InsertSql,
          progress: Callable[[int], None] | None, parallel: bool = True) -> None:
    """Every batch of `events` through `insert`'s SQL on `scratch` into `table` (empty at the
    start), its chunk files in `folder`, `STAGE_THREADS` batches at a time where `parallel`, else
    one after the other; `progress` is given the bytes read since its last call.
    Raises TraceFormatError for a batch DuckDB cannot read even one event at a time; the table
    may then hold some batches' rows (the caller's scratch database is thrown away)."""
    report = _Progress(progress)
    if parallel and STAGE_THREADS > 1:
        try:
            _parallel(scratch, events, folder, insert, report)
            return
        except _UNREADABLE:
            scratch.execute(f"DELETE FROM {table}")  # the pass again, from the start
    _serial(scratch, events, folder, insert, report)


class _Progress:
    """The bytes read, reported once each (a pass started again reports from where the first stopped)."""

    def __init__(self, progress: Callable[[int], None] | None):
        self.progress, self.reported = progress, 0

    def __call__(self, bytes_read: int) -> None:
        if self.progress is not None and bytes_read > self.reported:
            self.progress(bytes_read - self.reported)
            self.reported = bytes_read


def _parallel(scratch: duckdb.DuckDBPyConnection, events: TraceEvents, folder: Path, insert: InsertSql,
              report: _Progress) -> None:
    local = threading.local()

    def run(batch: Batch) -> None:
        if not hasattr(local, "con"):
            local.con = scratch.cursor()
            local.con.execute("SET enable_progress_bar = false")
        _insert(local.con, folder, batch, insert)

    with ThreadPoolExecutor(STAGE_THREADS, thread_name_prefix="traceq-json-stage") as pool:
        running: set[Future[None]] = set()
        try:
            for batch in events:
                running.add(pool.submit(run, batch))
                if len(running) >= STAGE_THREADS:
                    done, running = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        future.result()
                report(events.bytes_read)
            for future in running:
                future.result()
        finally:
            for future in running:
                future.cancel()


def _serial(scratch: duckdb.DuckDBPyConnection, events: TraceEvents, folder: Path, insert: InsertSql,
            report: _Progress) -> None:
    for batch in events:
        try:
            _insert(scratch, folder, batch, insert)
        except _UNREADABLE as e:
            if batch.exact:
                raise TraceFormatError(f"{events.path} has an event DuckDB cannot read ({_first_line(e)})") from None
            try:  # a cut inside a string: read these events one by one
                _insert(scratch, folder, events.exact(batch), insert)
            except _UNREADABLE as e:
                raise TraceFormatError(f"{events.path} has an event DuckDB cannot read ({_first_line(e)})") from None
        report(events.bytes_read)


def _insert(con: duckdb.DuckDBPyConnection, folder: Path, batch: Batch, insert: InsertSql) -> None:
    """The batch's rows through `insert`; each chunk goes through a JSON array file in `folder`
    (DuckDB's reader reads files, several at once)."""
    paths = [folder / f"chunk{batch.number}_{i}.json" for i in range(len(batch.chunks))]
    try:
        for path, chunk in zip(paths, batch.chunks):
            with path.open("wb") as f:
                f.write(b"[")
                f.writelines(chunk)
                f.write(b"]")
        con.execute(insert(paths, batch.number))
    finally:
        for path in paths:
            path.unlink(missing_ok=True)


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
