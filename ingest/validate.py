"""What a damaged trace may and may not bring into the store, decided here for every reader.

A real export never holds text in an integer column or an end before its start; a disk, a copy or
an editor can. Rather than letting such rows break an analysis later, each reader passes its rows
through these checks as it reads them (on the reading threads, vectorised: a clean batch costs a
few Arrow passes). A damaged row or value is dropped or repaired, counted in the load's `Damage`,
and named in the load's one-line summary (`... 12 kernels with end < start dropped`). What cannot
be repaired refuses the file. docs/damaged-traces.md lists each case and what is done about it.

- A time missing, out of range (more than TIME_LIMIT_NS from the session's time zero) or an end
  before its start: the row is dropped (`valid_times`).
- Durations whose sum passes what 64 bits hold: the file is refused (`Damage.check_totals`).
- A value of the wrong type (text or a float in an integer column, a number in a text column): set
  to NULL (`to_arrow`); a NULL where the store needs a value drops the row (`Sink`, ingest/base.py).
- An integer too large for its store column (a 32-bit one): set to NULL (`Sink`).
- Text that is not UTF-8: decoded with U+FFFD for the bad bytes (`decode_text`).
- A string id that resolves to nothing: the name is left empty (`Strings`, ingest/base.py).
- A table lacking a column a reader needs (a start time, a string table's ids): the file is
  refused (`check_columns`); a missing optional column reads as NULL, as in older exports.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from traceq.errors import TraceFormatError

TIME_LIMIT_NS = 2**53
"""How far from the session's time zero a time may lie: about 104 days, and the largest span in
which every nanosecond is exact as a double (plotly and JSON carry times as doubles). Real
exports stay within seconds of it (nsys NVTX ranges opened before the capture start at minus a
few seconds)."""

TOTAL_LIMIT_NS = 2**62
"""The most a table's durations may add up to (146 years): sums stay within 64 bits with room."""

EVENT_NOUNS = {
    "kernel_events": "kernel", "api_events": "API call", "memops": "memcpy/memset",
    "nvtx_events": "NVTX event", "memory_events": "memory event",
    "gpu_metrics": "GPU metric sample",
}
"""What one row of each store event table is called in the load's summary."""


class Damage:
    """What a load dropped or repaired, counted by (thing, what was done), and each event table's
    summed durations. Reading threads add to it, so it locks (only when there is something to add)."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        self._totals: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, noun: str, done: str, n: int = 1) -> None:
        """Count `n` `noun`s (singular, e.g. 'kernel') to which `done` happened ('with end < start dropped')."""
        if n:
            with self._lock:
                self._counts[(noun, done)] = self._counts.get((noun, done), 0) + n

    def add_total(self, table: str, ns: float) -> None:
        with self._lock:
            self._totals[table] = self._totals.get(table, 0.0) + ns

    def notes(self) -> list[str]:
        """One phrase per kind of damage, events first in the store's order: '12 kernels with end <
        start dropped'. (Sorted: reading threads add in whichever order their chunks finish.)"""
        rank = {noun: i for i, noun in enumerate(EVENT_NOUNS.values())}
        return [f"{n:,} {_plural(noun, n)} {done}" for (noun, done), n in
                sorted(self._counts.items(), key=lambda item: (rank.get(item[0][0], len(rank)), item[0]))]

    def check_totals(self) -> None:
        """Raise TraceFormatError when some table's durations add up past TOTAL_LIMIT_NS."""
        for table, total in self._totals.items():
            if total > TOTAL_LIMIT_NS:
                raise TraceFormatError(
                    f"the {EVENT_NOUNS.get(table, table)} durations add up to {total / 3.15576e16:,.0f} years: "
                    "the file's timestamps are damaged; export or copy it again")


def unlink_shared_correlations(con, trace_id: int, damage: Damage) -> None:
    """Unlink API calls whose correlation id more than one other call of their process has (the
    id is set to NULL on those calls, counted in `damage`), and the kernels the load linked to
    one of them (`kernel_events.launch_*`).

    A correlation id names one call: a kernel or copy finds the call that launched it by (process,
    id), and a CUDA graph's kernels share their launch's id. Real exports have at most pairs of
    calls with one id (an nsys export of an MPI job records 38 calls twice, `cudaMalloc` and
    `cudaMalloc_v3020`): a join of work to calls at most doubles. A damaged file can have hundreds
    (every `correlation` of a Kineto trace set to 0), and each such join then multiplies: 934 calls
    sharing one id made the load's attribution ask for 20 GB. Where the ids rise in the calls'
    order no id repeats, and a window over them settles it (0.09 CPU s for 14M calls); otherwise a
    GROUP BY does (about 0.15 CPU s a million calls).
    """
    t = int(trace_id)
    increasing = con.execute(f"""
        SELECT coalesce(bool_and(step > 0), true) FROM (
            SELECT correlation_id - lag(correlation_id) OVER () AS step FROM api_events
            WHERE trace_id = {t} AND correlation_id IS NOT NULL)""").fetchone()[0]
    if increasing:  # ids rising in the calls' order (an nsys export of one process): none repeats
        return
    shared = f"""
        SELECT t.pid, e.correlation_id FROM api_events e
        JOIN api_threads t ON t.trace_id = e.trace_id AND t.thread_id = e.thread_id
        WHERE e.trace_id = {t} AND e.correlation_id IS NOT NULL
        GROUP BY ALL HAVING count(*) > 2"""
    if con.execute(f"SELECT count(*) FROM ({shared})").fetchone()[0] == 0:
        return
    con.execute(f"""
        UPDATE kernel_events SET launch_start_ns = NULL, launch_end_ns = NULL, launch_name_id = NULL,
                                 launch_thread_id = NULL
        FROM kernel_queues q, ({shared}) d
        WHERE kernel_events.trace_id = {t} AND q.trace_id = {t} AND q.queue_id = kernel_events.queue_id
          AND q.pid IS NOT DISTINCT FROM d.pid AND kernel_events.correlation_id = d.correlation_id""")
    n = con.execute(f"""
        UPDATE api_events SET correlation_id = NULL
        FROM api_threads t, ({shared}) d
        WHERE api_events.trace_id = {t} AND t.trace_id = {t} AND t.thread_id = api_events.thread_id
          AND t.pid IS NOT DISTINCT FROM d.pid AND api_events.correlation_id = d.correlation_id""").fetchone()[0]
    damage.add("API call", "sharing a correlation id unlinked from their work", int(n))


def _plural(noun: str, n: int) -> str:
    return noun if n == 1 or noun.endswith("/memset") else noun + "s"


def valid_times(batch: pa.Table, table: str, damage: Damage, offset: int = 0, end_required: bool = True) -> pa.Table:
    """`batch` less the rows whose times an analysis cannot use, with its times made relative to
    `offset` (nvprof's time zero; nsys times are relative already). Dropped and counted: a start
    (`start_ns`, or `ts_ns`) or, where `end_required`, an end (`end_ns`) missing; a time more than
    TIME_LIMIT_NS from `offset`; an end before its start. Adds the batch's durations to `damage`.
    """
    names = batch.column_names
    start_name = "start_ns" if "start_ns" in names else "ts_ns"
    start = batch[start_name]
    end = batch["end_ns"] if "end_ns" in names else None
    lo, hi = pa.scalar(offset - TIME_LIMIT_NS, pa.int64()), pa.scalar(offset + TIME_LIMIT_NS, pa.int64())
    start_in = pc.and_(pc.greater(start, lo), pc.less(start, hi))  # null where start is
    keep = pc.fill_null(start_in, False)
    if end is not None:
        end_in = pc.and_(pc.greater(end, lo), pc.less(end, hi))
        ordered = pc.greater_equal(end, start)
        keep = pc.and_(keep, pc.fill_null(pc.and_(end_in, ordered), not end_required))
    if not pc.all(keep).as_py() and batch.num_rows:
        noun = EVENT_NOUNS.get(table, table)
        missing = pc.is_null(start) if end is None or not end_required else pc.or_(pc.is_null(start), pc.is_null(end))
        out = pc.invert(pc.fill_null(start_in if end is None else pc.and_kleene(start_in, end_in), True))
        damage.add(noun, "without a start or end time dropped", _count(missing))
        damage.add(noun, "with times out of range dropped", _count(pc.and_(out, pc.invert(missing))))
        if end is not None:
            reversed_ = pc.and_(pc.fill_null(pc.less(end, start), False), pc.fill_null(pc.invert(out), True))
            damage.add(noun, "with end < start dropped", _count(reversed_))
        batch = batch.filter(keep)
        start = batch[start_name]
        end = batch["end_ns"] if end is not None else None
    if end is not None and batch.num_rows:
        damage.add_total(table, pc.sum(pc.cast(pc.subtract(end, start), pa.float64())).as_py() or 0.0)
    if offset:
        shift = pa.scalar(offset, pa.int64())
        batch = batch.set_column(names.index(start_name), start_name, pc.subtract(start, shift))
        if end is not None:
            batch = batch.set_column(names.index("end_ns"), "end_ns", pc.subtract(end, shift))
    return batch


def _count(mask: pa.Array | pa.ChunkedArray) -> int:
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


_PYTHON_TYPES = {pa.int64(): int, pa.int32(): int, pa.string(): str, pa.binary(): bytes}

def to_arrow(values: Sequence[object], field: pa.Field, damage: Damage, source: str | None = None) -> pa.Array:
    """`values` (one column of SQLite rows) as an array of `field`'s type; a value of another type
    (text or a float in an integer column, say) becomes NULL and is counted."""
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass
    kind = _PYTHON_TYPES.get(field.type)
    if kind is None:
        raise TraceFormatError(f"{source or field.name}: values of unexpected types") from None
    kept = [v if type(v) is kind else None for v in values]  # bool is not int here: SQLite has none
    noun = "non-integer value" if kind is int else f"value not {'text' if kind is str else 'a blob'}"
    damage.add(noun, f"set to NULL ({source or field.name})", sum(v is not None for v in values) - sum(
        v is not None for v in kept))
    return pa.array(kept, type=field.type)


def scaled(batch: pa.Table, factors: Mapping[str, int], damage: Damage, source: str) -> pa.Table:
    """`batch` (a few rows: a device table) with columns multiplied by their `factors` (units to
    bytes or hertz); a product past 64 bits becomes NULL and is counted."""
    for name, factor in factors.items():
        values = [None if v is None else v * factor for v in batch[name].to_pylist()]
        kept = [v if v is None or -(2**63) <= v < 2**63 else None for v in values]
        damage.add("value", f"too large set to NULL ({source})", sum(a != b for a, b in zip(values, kept)))
        batch = batch.set_column(batch.column_names.index(name), name, pa.array(kept, pa.int64()))
    return batch


def decode_text(damage: Damage):
    """An sqlite3 `text_factory`: UTF-8 text as str, and text that is not UTF-8 decoded with
    U+FFFD for its bad bytes, and counted."""
    def decode(raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            damage.add("text", "not UTF-8 read with U+FFFD for the bad bytes")
            return raw.decode("utf-8", "replace")

    return decode


def check_columns(src: sqlite3.Connection, tables: set[str], required: Mapping[str, Sequence[str]]) -> None:
    """Raise TraceFormatError when a table of `tables` lacks one of its `required` columns."""
    for table, needed in required.items():
        if table in tables:
            have = {r[1] for r in src.execute(f'PRAGMA table_info("{table}")')}
            missing = [c for c in needed if c not in have]
            if missing:
                raise TraceFormatError(f"{table} lacks column {', '.join(missing)}: the file is damaged, "
                                       "or from a profiler version traceq does not know")
