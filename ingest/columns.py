"""A trace's rows gathered as Arrow columns a batch of rows at a time, for the readers of AMD's
row formats (RPD, rocprof v1's database and CSV, rocprofv3's kernel-trace CSV: docs/amd.md,
"Memory and speed") and of XPlane (docs/xplane.md). A dispatch keeps its start, end,
correlation id and the number of its configuration (name, device, queue, grid, workgroup,
registers, LDS, scratch: few distinct ones), 28 bytes, where the readers that read a file whole
kept a Python dict a row.

The stores are the ones those readers made (`tools/store_tables.py` compared them, table by
table): the same rows dropped and counted (`Rows.write`), kernels in (start, device, stream)
order with ties in the order read, names, configurations and queues numbered in that order.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from traceq.errors import TraceFormatError
from traceq.ingest.base import (
    AMD_CONFIG_COLUMNS,
    KERNEL_CONFIG_COLUMNS,
    KERNEL_QUEUE_COLUMNS,
    Names,
    Sink,
    api_names,
    api_threads,
    kernel_batch,
    kernel_configs,
    kernel_names,
    kernel_queues,
    numbered,
    nvtx_attributes,
    row_numbers,
)
from traceq.ingest.validate import TIME_LIMIT_NS
from traceq.ingest.xplane_tables import PID, _api, _short, _write_ranges

BATCH_ROWS = 16_384
"""Source rows read per batch (a batch's rows are Python values until they become columns:
more rows a batch was slower to turn into columns, 65,536 by a third)."""


@contextmanager
def no_collection() -> Iterator[None]:
    """Python's cyclic garbage collector off while a reader makes Python values by the million:
    they hold no cycles, and the collector's passes over a batch's rows cost more than the
    reading (reading a 100 MB CSV's rows: 3.1 CPU s with it, 1.4 without)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()

WRITE_ROWS = 1 << 18
"""Kernels sent to the store per Arrow table."""

CONFIG_COLUMNS = ("name", "device_id", "stream_id", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                  "registers_per_thread", "smem_static_bytes", "local_memory_per_thread_bytes", "accum_vgprs", "sgprs")
"""What an AMD dispatch shares with others of its kind, kept once per distinct tuple (its registers
AMD's: arch VGPRs as registers_per_thread, accumulation VGPRs, SGPRs)."""

_INT64 = 1 << 63
_PLAIN = r"^-?(0|[1-9][0-9]*)$"
KD = re.compile(r"(\s*\[clone \.kd\]|\.kd)$")
"""The code object's suffix rocprof leaves on a kernel's name."""


def number(value: Any) -> int | None:
    """An integer the store's BIGINT holds, from a number or its text; else None."""
    if isinstance(value, bool):
        return None
    if not isinstance(value, int):
        try:
            value = int(str(value).strip(), 0) if value not in (None, "") else None
        except ValueError:
            return None
    return value if value is not None and -_INT64 <= value < _INT64 else None


def ints(values: Sequence[Any] | None, n: int, *, quoted: bool = False) -> pa.Array:
    """`amd._int` of each value as int64 (`quoted`: of its text with double quotes stripped, as
    rocprof v1's database was read); None: n nulls. Integers, and texts of plain decimal
    integers, are converted by Arrow; any other value goes through `number`."""
    if values is None:
        return pa.nulls(n, pa.int64())
    kinds = set(map(type, values))
    if kinds <= {int, type(None)}:
        try:
            return pa.array(values, pa.int64())
        except OverflowError:
            pass
    elif kinds <= {str, type(None)} and not quoted:
        text = pa.array(values, pa.string())
        text = pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text)
        if pc.all(pc.match_substring_regex(text, _PLAIN)).as_py() is not False:
            try:
                return pc.cast(text, pa.int64())
            except (pa.ArrowInvalid, OverflowError):
                pass
    if quoted:
        return pa.array([number("" if v is None else str(v).strip('"')) for v in values], pa.int64())
    return pa.array([number(v) for v in values], pa.int64())


def texts(values: Sequence[Any] | None, n: int, *, quoted: bool = False) -> pa.Array:
    """Each value as text (`quoted`: str() of it, double quotes stripped, None as '')."""
    if values is None:
        return pa.nulls(n, pa.string())
    if quoted:
        return pa.array(["" if v is None else str(v).strip('"') for v in values], pa.string())
    return pa.array(values, pa.string())


def either(first: Sequence[Any] | None, second: Sequence[Any] | None) -> Sequence[Any] | None:
    """`a or b` of each pair of values (a column's value, else another's where it is empty)."""
    if first is None or second is None:
        return first if second is None else second
    return [a or b for a, b in zip(first, second)]


def grid_workgroups(items: pa.Array, size: pa.Array) -> pa.Array:
    """`amd.workgroups` of each pair: the grid in workgroups, NULL unless items >= 0 and size > 0."""
    good = pc.fill_null(pc.and_(pc.greater_equal(items, 0), pc.greater(size, 0)), False)
    safe_items = pc.if_else(good, items, 0)
    safe_size = pc.if_else(good, size, 1)
    whole = pc.divide(safe_items, safe_size)
    rest = pc.subtract(safe_items, pc.multiply(whole, safe_size))
    ceiling = pc.add(whole, pc.cast(pc.greater(rest, 0), pa.int64()))
    return pc.if_else(good, ceiling, pa.scalar(None, pa.int64()))


class Devices:
    """Device numbers 0, 1, ... in the order the source's agents first come (None as -1)."""

    def __init__(self, none: Any = -1) -> None:
        self.numbers: dict[Any, int] = {}
        self.none = none

    def number(self, agents: pa.Array) -> pa.Array:
        agents = pc.fill_null(agents, self.none) if self.none is not None else agents
        distinct = pc.unique(agents)
        for agent in distinct.to_pylist():
            self.numbers.setdefault(agent, len(self.numbers))
        values = pa.array([self.numbers[a] for a in distinct.to_pylist()], pa.int64())
        return values.take(pc.index_in(agents, value_set=distinct, skip_nulls=False))


class Kernels:
    """Dispatches as columns: start, end, correlation id and their configuration's number (the
    distinct tuples of `columns`, texts in `TEXT_COLUMNS`, `rename` applied to their names)."""

    TEXT_COLUMNS = frozenset({"name", "hlo_op", "hlo_module"})

    def __init__(self, columns: Sequence[str] = CONFIG_COLUMNS, rename: Callable[[str], str] | None = None) -> None:
        self.columns = tuple(columns)
        self.rename = rename
        self.configs = Names()
        self.parts: list[pa.Table] = []
        self.skipped = 0  # dispatches without a name or a start and end time

    def add(self, start: pa.Array, end: pa.Array, correlation: pa.Array, config: dict[str, pa.Array]) -> None:
        ids = self.configs.number(*[config[c] for c in self.columns])
        self.parts.append(pa.table({"start_ns": start, "end_ns": end, "correlation_id": correlation, "config": ids}))

    def table(self) -> pa.Table:
        schema = pa.schema([("start_ns", pa.int64()), ("end_ns", pa.int64()), ("correlation_id", pa.int64()),
                            ("config", pa.int32())])
        table = pa.concat_tables([p.cast(schema) for p in self.parts]) if self.parts else schema.empty_table()
        self.parts = []
        return table.combine_chunks()

    def config_table(self) -> pa.Table:
        """A row per configuration, in the order of their numbers."""
        keys = self.configs.keys
        columns = dict(zip(self.columns, list(zip(*keys)) or [() for _ in self.columns]))
        if self.rename is not None:
            columns["name"] = tuple(self.rename(n) if isinstance(n, str) else n for n in columns["name"])
        return pa.table({c: pa.array(v, pa.string() if c in self.TEXT_COLUMNS else pa.int64())
                         for c, v in columns.items()})


def _rename_kd(name: str) -> str:
    return KD.sub("", name)


def gpus_table(rows: list[dict[str, Any]]) -> pa.Table:
    columns = list(rows[0])
    types = {"name": pa.string(), "vendor": pa.string(), "arch": pa.string()}
    return pa.table({c: pa.array([g[c] for g in rows], types.get(c, pa.int64())) for c in columns})


class Rows:
    """What a reader gathered, dropped as `amd._Rows.write` dropped it and written in its order:
    GPUs, API calls, kernels, copies, ranges. `memops` may be compact columns that
    `memop_columns` turns into the store's, a slice at a time; `call_batches` (API calls read
    as they are written, after the kernels' times are known) stands for `calls`."""

    def __init__(self) -> None:
        self.kernels = Kernels(rename=_rename_kd)
        self.gpus: list[dict[str, Any]] = []
        self.calls: pa.Table | None = None  # start_ns, end_ns, name, tid, correlation_id
        self.call_batches: Callable[[], Iterator[pa.Table]] | None = None
        self.memops: pa.Table | None = None
        self.memop_columns: Callable[[pa.Table], pa.Table] | None = None
        self.ranges: list[tuple[int, int | None, str, str, str, int | None, int | None]] = []

    def write(self, sink: Sink) -> None:
        kernels = self.kernels.table()
        memops = self.memops if self.memops is not None and self.memops.num_rows else None
        self.memops = None
        if not kernels.num_rows and memops is None:
            skipped = self.kernels.skipped
            raise TraceFormatError("the profile records no kernel dispatch" + (
                f" ({skipped:,} rows without a kernel name or a start and end time)" if skipped else ""))
        starts = kernels["start_ns"] if kernels.num_rows else memops["start_ns"]  # type: ignore[index]
        middle = starts.take(pc.array_sort_indices(starts))[len(starts) // 2].as_py()
        del starts
        kept = keep(kernels, middle, sink, "kernel", "kernel_events")
        if memops is not None:
            memops = memops.take(keep(memops, middle, sink, "memcpy/memset", "memops"))
        if not len(kept) and (memops is None or not memops.num_rows):
            raise TraceFormatError("the profile's dispatches all have damaged times")
        calls = self.calls
        if self.call_batches is not None:
            _stream_calls(self.call_batches(), middle, sink)
        elif calls is not None:
            calls = calls.take(keep(calls, middle, sink, "API call", "api_events"))
        ranges = keep_rows(self.ranges, middle, sink, "NVTX event", "nvtx_events")
        if self.gpus:
            sink.append("gpus", gpus_table(self.gpus), source_rows=0)
        if calls is not None and calls.num_rows:
            write_calls(calls, sink)
        del calls
        write_kernels(kernels, self.kernels.config_table(), kept, sink)
        del kernels, kept
        if memops is not None and memops.num_rows:
            expand = self.memop_columns or (lambda t: t)
            sink.append_all("memops", (expand(memops.slice(first, WRITE_ROWS))
                                       for first in range(0, memops.num_rows, WRITE_ROWS)))
        _write_ranges(ranges, sink)


def _stream_calls(batches: Iterator[pa.Table], middle: int, sink: Sink) -> None:
    """API calls (start_ns, end_ns, name, tid, correlation_id) written a batch at a time, less
    those `keep` drops (counted once, for all of them), names and threads numbered as they come."""
    functions, threads = Names(), Names()
    late = reverse = 0
    total = 0.0
    for batch in batches:
        kept, dropped_late, dropped_reverse, time = kept_rows(batch, middle)
        late, reverse, total = late + dropped_late, reverse + dropped_reverse, total + time
        calls = batch.take(kept)
        if calls.num_rows:
            sink.append("api_events", pa.table({
                "start_ns": calls["start_ns"], "end_ns": calls["end_ns"], "name_id": functions.number(calls["name"]),
                "thread_id": threads.number(calls["tid"]), "correlation_id": calls["correlation_id"]}), source_rows=0)
    sink.damage.add("API call", "with times out of range dropped", late)
    sink.damage.add("API call", "with end < start dropped", reverse)
    sink.damage.add_total("api_events", total)
    if functions.keys:
        labels = [key[0] for key in functions.keys]
        sink.append("api_names", api_names([_api(n) for n in labels], labels), source_rows=0)
        tids = [key[0] for key in threads.keys]
        sink.append("api_threads", api_threads([PID] * len(tids), tids, [None] * len(tids)), source_rows=0)


class RangeWriter:
    """Ranges (start_ns, end_ns, name, kind, domain, pid, tid) into `nvtx_events` as they come, a
    table at a time, their attributes numbered in that order; `close` writes the attributes."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.attributes = Names()

    def add(self, ranges: pa.Table) -> None:
        if not ranges.num_rows:
            return
        nulls = pa.nulls(ranges.num_rows, pa.int64())
        tid = ranges["tid"]
        ids = self.attributes.number(ranges["kind"], ranges["domain"], nulls, nulls, ranges["pid"], tid, nulls, tid)
        self.sink.append("nvtx_events", pa.table({"start_ns": ranges["start_ns"], "end_ns": ranges["end_ns"],
                                                  "name": ranges["name"], "attributes_id": ids}), source_rows=0)

    def close(self) -> None:
        if self.attributes.keys:
            self.sink.append("nvtx_attributes", nvtx_attributes(self.attributes.keys), source_rows=0)


RANGE_SCHEMA = pa.schema([("start_ns", pa.int64()), ("end_ns", pa.int64()), ("name", pa.string()),
                          ("kind", pa.string()), ("domain", pa.string()), ("pid", pa.int64()), ("tid", pa.int64())])
"""The columns `RangeWriter.add` takes."""


def kept_rows(table: pa.Table, middle: int) -> tuple[pa.Array, int, int, float]:
    """The indices of `table`'s rows kept: not those with a time TIME_LIMIT_NS or more from
    `middle` or an end before the start; how many of each were dropped; the kept rows' time."""
    low, high = middle - TIME_LIMIT_NS, middle + TIME_LIMIT_NS
    start, end = table["start_ns"], table["end_ns"]

    def far(t: Any) -> Any:
        never = pc.not_equal(t, t)
        return pc.or_(pc.less_equal(t, pa.scalar(low, pa.int64())) if low >= -_INT64 else never,
                      pc.greater_equal(t, pa.scalar(high, pa.int64())) if high < _INT64 else never)

    late = pc.fill_null(pc.or_(far(start), far(end)), False)
    reverse = pc.and_(pc.invert(late), pc.fill_null(pc.less(end, start), False))
    kept = pc.indices_nonzero(pc.invert(pc.or_(late, reverse)))
    durations = pc.subtract(end.take(kept), start.take(kept))
    return (kept, int(pc.sum(pc.cast(late, pa.int64())).as_py() or 0),
            int(pc.sum(pc.cast(reverse, pa.int64())).as_py() or 0),
            float(pc.sum(pc.cast(durations, pa.float64())).as_py() or 0.0))


def keep(table: pa.Table, middle: int, sink: Sink, noun: str, store_table: str) -> pa.Array:
    """`kept_rows`, what was dropped counted as damage."""
    kept, late, reverse, total = kept_rows(table, middle)
    sink.damage.add(noun, "with times out of range dropped", late)
    sink.damage.add(noun, "with end < start dropped", reverse)
    sink.damage.add_total(store_table, total)
    return kept


def keep_rows(rows: list[Any], middle: int, sink: Sink, noun: str, store_table: str,
              times: Callable[[Any], tuple[int, Any]] = lambda row: (row[0], row[1])) -> list[Any]:
    """As `keep`, for rows kept as Python values: `times(row)` is (start, end or None), by
    default a tuple's first two values."""
    kept, late, reverse, total = [], 0, 0, 0
    for row in rows:
        start, end = times(row)
        if abs(start - middle) >= TIME_LIMIT_NS or (end is not None and abs(end - middle) >= TIME_LIMIT_NS):
            late += 1
        elif end is not None and end < start:
            reverse += 1
        else:
            kept.append(row)
            total += 0 if end is None else end - start
    sink.damage.add(noun, "with times out of range dropped", late)
    sink.damage.add(noun, "with end < start dropped", reverse)
    sink.damage.add_total(store_table, float(total))
    return kept


def write_calls(calls: pa.Table, sink: Sink) -> None:
    """API calls (start_ns, end_ns, name, tid, correlation_id), their names and threads numbered
    in the order they come."""
    functions, threads = Names(), Names()
    name_ids = functions.number(calls["name"])
    thread_ids = threads.number(calls["tid"])
    sink.append("api_events", pa.table({"start_ns": calls["start_ns"], "end_ns": calls["end_ns"],
                                        "name_id": name_ids, "thread_id": thread_ids,
                                        "correlation_id": calls["correlation_id"]}), source_rows=0)
    labels = [key[0] for key in functions.keys]
    sink.append("api_names", api_names([_api(n) for n in labels], labels), source_rows=0)
    tids = [key[0] for key in threads.keys]
    sink.append("api_threads", api_threads([PID] * len(tids), tids, [None] * len(tids)), source_rows=0)


def write_kernels(kernels: pa.Table, configs: pa.Table, kept: pa.Array, sink: Sink) -> None:
    """The `kept` kernels in (start, device, stream) order (a stable sort: ties in the order read),
    numbered in that order, with their configuration's columns, WRITE_ROWS at a time in one INSERT."""
    if not len(kept):
        return
    config = kernels["config"].take(kept)
    keys = pa.table({"start_ns": kernels["start_ns"].take(kept), "device_id": configs["device_id"].take(config),
                     "stream_id": configs["stream_id"].take(config)})
    del config
    order = kept.take(pc.sort_indices(keys, sort_keys=[("start_ns", "ascending"), ("device_id", "ascending"),
                                                       ("stream_id", "ascending")]))
    del keys
    names, numbers, queues = Names(), Names(), Names()
    config_columns = AMD_CONFIG_COLUMNS if "sgprs" in configs.column_names else KERNEL_CONFIG_COLUMNS  # AMD's readers'
    numeric = configs.drop_columns([c for c in configs.column_names if c in Kernels.TEXT_COLUMNS])

    def column(part: pa.Table, c: str) -> pa.Array:
        return part[c].combine_chunks() if c in part.column_names else pa.nulls(part.num_rows, pa.int64())

    def chunks() -> Any:
        for first in range(0, len(order), WRITE_ROWS):
            part = kernels.take(order.slice(first, WRITE_ROWS))
            config = part["config"].combine_chunks()
            seen = pc.unique(config)  # the chunk's configurations in the order of their first row
            name_ids = pc.take(names.number(configs["name"].take(seen)), pc.index_in(config, value_set=seen))
            shared = numeric.take(config)  # not the texts: a name per row took 213 MiB for 235K kernels
            part = pa.table({**{c: part[c] for c in ("start_ns", "end_ns", "correlation_id")},
                             **{c: shared[c] for c in shared.column_names}})
            batch = pa.table({c: column(part, c) for c in ("start_ns", "end_ns", "correlation_id", "graph_node_id",
                                                            *config_columns, *KERNEL_QUEUE_COLUMNS)})
            batch = batch.set_column(batch.column_names.index("pid"), "pid", pa.array([PID] * part.num_rows, pa.int64()))
            yield numbered(kernel_batch(
                batch, name_id=name_ids,
                config_id=numbers.number(*[batch[c] for c in config_columns]),
                queue_id=queues.number(*[batch[c] for c in KERNEL_QUEUE_COLUMNS])), first)

    progress, sink.progress = sink.progress, None  # the reading reported the source's rows
    try:
        sink.append_all("kernel_events", chunks())
    finally:
        sink.progress = progress
    sink.append("kernel_configs", kernel_configs(numbers.keys, optin_code=1, launch_types={}, names=config_columns),
                source_rows=0)
    sink.append("kernel_queues", kernel_queues(queues.keys), source_rows=0)
    demangled = [key[0] for key in names.keys]
    sink.append("kernel_names", kernel_names(demangled, [_short(n) for n in demangled], [None] * len(demangled)),
                source_rows=0)


def last_index(keys: pa.Array, at: pa.Array) -> pa.Array:
    """For each of `at`, the position in `keys` of the last key equal to it (as a dict built from
    the keys keeps the last), NULL where none is (or `at` is NULL)."""
    n = len(keys)
    if not n:
        return pa.nulls(len(at), pa.int64())
    backwards = pc.subtract(pa.scalar(n - 1, pa.int64()), row_numbers(n))
    position = pc.index_in(at, value_set=keys.take(backwards))  # the first from the end
    return pc.subtract(pa.scalar(n - 1, pa.int64()), pc.cast(position, pa.int64()))


def lookup(keys: pa.Array, values: pa.Table, at: pa.Array) -> pa.Table:
    """The row of `values` (a row per key of `keys`) for each of `at` (`last_index`); all NULL
    where the key is absent."""
    if not len(keys):
        return pa.table({c: pa.nulls(len(at), values.schema.field(c).type) for c in values.column_names})
    return values.take(last_index(keys, at))


def progress_of(sink: Sink) -> Callable[[int], None]:
    return sink.progress if sink.progress is not None else (lambda n: None)
