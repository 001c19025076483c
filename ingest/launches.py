"""Each kernel's launching call, found once at load (`kernel_events.launch_*`).

A kernel names the runtime or driver call that launched it by correlation id, unique within a
process. The analyses that read every kernel's call (`idle`, `launches`, the NVTX projection,
attribution) joined ten million kernels to fourteen million calls each time they ran; a reader
that reads the calls first keeps them in a `CallIndex` instead, and each batch of kernels read
after them stores its calls' start, end, name and thread.

The index holds each call's key, (process << 32) | correlation id, sorted: CUPTI numbers calls
in the order they are made, so the keys nearly always arrive sorted already, and a kernel finds
its call by one binary search (no hash table, no join). A key two calls share gives the later
one, as `analysis.operations.issuing_calls` does (a key three or more share is a damaged file's:
`ingest.validate.unlink_shared_correlations` unlinks those calls and their kernels). Only the
calls whose names say they launch kernels are kept (`LAUNCHING`): the others, such as
cuKernelGetName (4.2M of the 14.2M calls at ten million kernels), never do. A kernel without such
a call in the trace (launched before the capture began, or by a call named otherwise) stores
NULL, as do the kernels of readers that keep no index: analyses look those up at query time
(`analysis.operations.with_calls`, the `kernel_launches` view). Kept, the calls of ten million
kernels take about 240 MB (a duration instead of the end, 16-bit name and thread ids where they
fit).
"""

from __future__ import annotations

import re

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

LAUNCH_COLUMNS = ("launch_start_ns", "launch_end_ns", "launch_name_id", "launch_thread_id")
"""The kernel_events columns a kernel's launching call fills (api_events' start_ns, end_ns,
name_id and thread_id of that call)."""

LAUNCHING = re.compile(r"(?i)launch")
"""API calls that launch kernels (cudaLaunchKernel, cuLaunchKernelEx, cudaGraphLaunch, ...)."""

_KEY_BITS = 32  # CUPTI correlation ids are 32-bit; a process id decoded from nsys fits 24 bits


def call_keys(pid: pa.Array | pa.ChunkedArray, correlation_id: pa.Array | pa.ChunkedArray) -> pa.Array:
    """(pid << 32) | correlation id, NULL where either is NULL or does not fit its bits."""
    key = pc.add(pc.shift_left(pc.cast(pid, pa.int64()), _KEY_BITS), pc.cast(correlation_id, pa.int64()))
    if _within(correlation_id, 1 << _KEY_BITS) and _within(pid, 1 << (63 - _KEY_BITS)):
        return key  # every value fits (NULLs stay NULL): one pass over each column to check
    fits = pc.and_(pc.and_(pc.greater_equal(correlation_id, 0), pc.less(correlation_id, 1 << _KEY_BITS)),
                   pc.and_(pc.greater_equal(pid, 0), pc.less(pid, 1 << (63 - _KEY_BITS))))
    return pc.if_else(fits, key, pa.scalar(None, pa.int64()))


def _within(values: pa.Array | pa.ChunkedArray, end: int) -> bool:
    """Whether every non-NULL value is in [0, end)."""
    low, high = pc.min_max(values).values()
    return not low.is_valid or (low.as_py() >= 0 and high.as_py() < end)


class CallIndex:
    """A trace's runtime and driver calls that launch kernels, by key, kept as they stream into
    the store.

    `add` each batch of calls as it is written (on the writing thread, with the ids the store
    gives them), `finish` once they are all in, then `launches` (thread-safe: the reading threads
    call it) finds the calls of any batch of kernels, and `close` lets them go.
    """

    def __init__(self) -> None:
        self._keys: list[pa.Array] = []
        self._columns: dict[str, list[pa.Array]] = {c: [] for c in LAUNCH_COLUMNS}
        self._sorted = pl.Series(dtype=pl.Int64)
        self._rows: pl.Series | None = None  # row of each sorted key; None: the keys came sorted
        self._values: dict[str, pl.Series] = {}

    def add(self, keys: pa.Array | pa.ChunkedArray, start_ns: pa.Array | pa.ChunkedArray,
            end_ns: pa.Array | pa.ChunkedArray, name_id: pa.Array, thread_id: pa.Array) -> None:
        """Keep a batch of calls: their `call_keys` (NULL for a call that launches no kernel, which
        is not kept) and store columns."""
        keep = pc.is_valid(keys)
        self._keys.append(pc.filter(keys, keep))
        duration = pc.subtract(end_ns, start_ns)  # kept instead of the end: it fits fewer bytes
        for column, values in zip(LAUNCH_COLUMNS, (start_ns, duration, name_id, thread_id)):
            kept = pc.filter(values, keep)
            # ten million calls are held while the kernels load: each column in the fewest bytes
            narrow = _NARROW.get(column)
            if narrow is not None and len(kept) and _within(kept, narrow[1] + 1):
                kept = pc.cast(kept, narrow[0])
            self._columns[column].append(kept)

    def finish(self) -> None:
        """Sort the keys where they did not come sorted; of calls sharing a key, keep the last."""
        keys = _series("key", self._keys, pa.int64())
        for column, parts in self._columns.items():
            self._values[column] = _series(column, parts, _arrow_type(column))
        steps = keys.diff().drop_nulls()
        if steps.is_empty() or steps.min() > 0:  # type: ignore[operator]
            self._sorted = keys  # strictly rising, as CUPTI numbers one process's calls
            return
        frame = (pl.DataFrame({"key": keys}).with_row_index("row").sort("key", "row")
                 .unique("key", keep="last", maintain_order=True))
        self._sorted, self._rows = frame["key"], frame["row"]

    def launches(self, keys: pa.Array | pa.ChunkedArray) -> dict[str, pa.Array]:
        """The LAUNCH_COLUMNS of the call each key names (`call_keys` of kernels), NULL where none."""
        wanted = pl.Series("key", keys, dtype=pl.Int64)
        if self._sorted.is_empty() or wanted.null_count() == len(wanted):
            return {c: pa.nulls(len(wanted), _arrow_type(c)) for c in LAUNCH_COLUMNS}
        # a batch of kernels launched close together: its calls lie in a short stretch of the
        # keys, which the searches and gathers then stay within (in cache)
        lo = min(self._sorted.search_sorted(wanted.min(), "left"), len(self._sorted) - 1)  # type: ignore[arg-type]
        hi = max(self._sorted.search_sorted(wanted.max(), "right"), lo + 1)  # type: ignore[arg-type]
        keys_in = self._sorted.slice(lo, hi - lo)
        at = keys_in.search_sorted(wanted.fill_null(-1)).clip(upper_bound=len(keys_in) - 1)
        found = keys_in.gather(at) == wanted
        if self._rows is None:
            values = {c: v.slice(lo, hi - lo) for c, v in self._values.items()}
            rows = at
        else:
            values, rows = self._values, self._rows.slice(lo, hi - lo).gather(at)
        rows = pl.select(pl.when(found).then(rows)).to_series()
        found_values = {c: v.gather(rows).cast(pl.Int64 if c.endswith("_ns") else pl.Int32)
                        for c, v in values.items()}
        found_values["launch_end_ns"] = found_values["launch_start_ns"] + found_values["launch_end_ns"]
        return {c: found_values[c].to_arrow() for c in LAUNCH_COLUMNS}

    def close(self) -> None:
        """Let the calls go (the kernels are in) and give their memory back."""
        self._sorted, self._rows, self._values = pl.Series(dtype=pl.Int64), None, {}
        pa.default_memory_pool().release_unused()


_NARROW = {"launch_end_ns": (pa.uint32(), 2**32 - 1), "launch_name_id": (pa.uint16(), 2**16 - 1),
           "launch_thread_id": (pa.uint16(), 2**16 - 1)}
"""The narrower type `CallIndex` keeps a column in where a batch's values fit it (launch_end_ns
holds the call's duration while kept)."""


def _arrow_type(column: str) -> pa.DataType:
    return pa.int64() if column.endswith("_ns") else pa.int32()


def _series(name: str, parts: list[pa.Array | pa.ChunkedArray], dtype: pa.DataType | None = None) -> pl.Series:
    """The arrays of `parts` as one Polars series (combined in Arrow: a series of thousands of small
    chunks is slow to make); `parts` is emptied as it goes."""
    chunks = [c for part in parts for c in (part.chunks if isinstance(part, pa.ChunkedArray) else [part])]
    parts.clear()
    if chunks and len({c.type for c in chunks}) == 1:  # all narrowed alike: kept narrow
        dtype = chunks[0].type
    chunks = [c.cast(dtype) if dtype is not None and c.type != dtype else c for c in chunks]
    whole = pa.chunked_array(chunks, dtype).combine_chunks()
    del chunks
    pa.default_memory_pool().release_unused()  # the small arrays just copied: before the next column's copy
    return pl.Series(name, whole)
