"""rocprofv3's JSON (`--output-format json`), read as a stream (docs/amd.md): the file is walked
(`json_walk`), never parsed whole. The small tables of the tool's entry (`metadata`, `agents`,
`kernel_symbols`, `strings`) are parsed as they come; each record of `buffer_records` is parsed
alone, and a kernel dispatch's or an API call's numbers go into Arrow columns a batch at a time,
so the memory a load takes grows with the file's dispatches by the bytes of their stored columns,
not by Python objects (about 10 times the file's text when it was parsed whole). Kernel names,
registers and devices are looked up once per distinct kernel and agent at the end, so the tables
may come in any order. Entries the reader does not use (`callback_records`, `code_objects`, ...)
are stepped over one element at a time.

The rows are those the reader made when it parsed the whole document (before 29 Nov 2026),
written in the same order with the same ids: kernels in (start, device, stream) order, names, configurations and
queues numbered in that order, calls in the file's order of kinds (HIP, HSA, RCCL) then records.
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from traceq.errors import TraceFormatError
from traceq.ingest import amd
from traceq.ingest.amd import _copy_row, _int, _l, _marker_ranges, _o, _operation_names, _text, gpu_row, workgroups
from traceq.ingest.base import (
    AMD_CONFIG_COLUMNS,
    KERNEL_QUEUE_COLUMNS,
    LoadOptions,
    Names,
    Sink,
    SourceInfo,
    kernel_batch,
    kernel_configs,
    kernel_names,
    kernel_queues,
    key_rows,
    numbered,
)
from traceq.ingest.columns import keep, keep_rows, write_calls
from traceq.ingest.json_walk import Walk
from traceq.ingest.xplane import _Tables
from traceq.ingest.xplane_tables import PID, _short

BATCH_ROWS = 65_536
"""Records gathered as Python tuples before they become Arrow columns."""

WRITE_ROWS = 1 << 18
"""Kernels sent to the store per Arrow table."""

_SMALL = ("metadata", "agents", "kernel_symbols", "strings")
_CALL_KINDS = ("hip_api", "hsa_api", "rccl_api")
_KERNEL_COLUMNS = ("start_ns", "end_ns", "correlation_id", "config")
_CONFIG_COLUMNS = ("kernel", "agent", "stream_id", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                   "smem_static_bytes", "local_memory_per_thread_bytes")
"""What a dispatch shares with others of its kind: kept once per distinct tuple, a dispatch's
`config` its number (28 bytes a dispatch in the columns, not 112)."""
_CALL_COLUMNS = ("start_ns", "end_ns", "source", "kind", "operation", "tid", "correlation_id")
_INT64 = 1 << 63
_INTS = {int}


class _Batches:
    """Rows of int64 columns, gathered as tuples and turned into Arrow arrays a batch at a time."""

    def __init__(self, columns: tuple[str, ...]):
        self.columns = columns
        self.rows: list[tuple[Any, ...]] = []
        self.arrays: dict[str, list[pa.Array]] = {c: [] for c in columns}

    def add(self, row: tuple[Any, ...]) -> None:
        self.rows.append(row)
        if len(self.rows) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            for column, values in zip(self.columns, zip(*self.rows)):
                self.arrays[column].append(pa.array(values, pa.int64()))
            self.rows = []

    def table(self) -> pa.Table:
        """Every row, one contiguous array a column (each column's batches freed as it is joined)."""
        self.flush()
        columns = {}
        for column in self.columns:
            columns[column] = pa.concat_arrays(self.arrays[column]) if self.arrays[column] else pa.array([], pa.int64())
            self.arrays[column] = []
        return pa.table(columns)


class _KernelColumns:
    """The dispatches' start, end, correlation id and configuration number (_KERNEL_COLUMNS),
    appended to typed arrays: 8 bytes a value, no Python object or tuple kept per row, and a value
    past 64 bits refused by the array (OverflowError). Every BATCH_ROWS rows the arrays become
    Arrow chunks and new ones start (arrays grown to millions of rows by reallocation left the
    heap fragmented: 90 MB more at the peak of a 439K-dispatch load). A correlation id the record
    lacks is kept as 0 and its row noted, to be null in the table."""

    def __init__(self) -> None:
        self.columns = {c: array("q") for c in _KERNEL_COLUMNS}
        self.chunks: dict[str, list[pa.Array]] = {c: [] for c in _KERNEL_COLUMNS}
        self.rows = 0  # in the chunks
        self.no_correlation: list[int] = []

    def add(self, row: tuple[Any, ...]) -> None:
        """One row of any values the store's BIGINT holds (the correlation id may be None)."""
        if row[2] is None:
            self.no_correlation.append(len(self))
            row = (row[0], row[1], 0, row[3])
        for values, value in zip(self.columns.values(), row):
            values.append(value)

    def __len__(self) -> int:
        return self.rows + len(self.columns["start_ns"])

    def flush(self) -> None:
        """The arrays' rows as Arrow chunks (their buffers, not copied), new arrays started."""
        count = len(self.columns["start_ns"])
        if count:
            for name, values in self.columns.items():
                self.chunks[name].append(pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(values)]))
            self.columns = {c: array("q") for c in _KERNEL_COLUMNS}
            self.rows += count

    def table(self) -> pa.Table:
        """Every row, one contiguous int64 array a column (each column's chunks freed as it is joined)."""
        self.flush()
        out = {}
        for name in _KERNEL_COLUMNS:
            chunks, self.chunks[name] = self.chunks[name], []
            column = pa.concat_arrays(chunks) if chunks else pa.array([], pa.int64())
            del chunks
            if name == "correlation_id" and self.no_correlation:
                mask = bytearray(b"\x01") * len(column)
                for row in self.no_correlation:
                    mask[row] = 0
                valid = pa.Array.from_buffers(pa.uint8(), len(mask), [None, pa.py_buffer(bytes(mask))])
                column = pc.if_else(valid.cast(pa.bool_()), column, pa.scalar(None, pa.int64()))
            out[name] = column
        self.rows, self.no_correlation = 0, []
        return pa.table(out)


class _Records:
    """What the walk gathers: the small tables and the records' columns."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.restart()

    def restart(self) -> None:
        """No records yet (a `buffer_records` that comes again replaces the first, as in json.loads)."""
        self.kernels = _KernelColumns()
        self.configs: dict[tuple[Any, ...], int] = {}
        self.seen: dict[tuple[int, ...], int] = {}  # a dispatch's fields as written -> its configuration's number
        self.calls = _Batches(_CALL_COLUMNS)
        self.copies: list[Any] = []
        self.markers: list[Any] = []
        self.skipped = 0

    def _add(self, start: int, end: int, correlation: int | None, config: tuple[Any, ...]) -> None:
        self.kernels.add((start, end, correlation, self._number(config)))

    def _number(self, config: tuple[Any, ...]) -> int:
        number = self.configs.get(config)
        if number is None:
            number = self.configs[config] = len(self.configs)
        return number

    def dispatches(self, records: list[Any]) -> None:
        """The dispatch records of a slab, the common case read fast: every field there and an int
        (no bool, no float: they would hash as ints; 64 bits, which the typed arrays check); the
        fields a dispatch shares with others checked and converted once per distinct tuple of them
        (a grid of work-items, a workgroup size above 0). Any other record goes to `_dispatch`."""
        if len(self.kernels.columns["start_ns"]) >= BATCH_ROWS:
            self.kernels.flush()
        starts, ends, correlations, configs = self.kernels.columns.values()
        seen, first, slow, ints = self.seen, self._first, self._dispatch, _INTS
        for record in records:
            try:
                info = record["dispatch_info"]
                size, grid = info["workgroup_size"], info["grid_size"]
                start, end, correlation = (record["start_timestamp"], record["end_timestamp"],
                                           record["correlation_id"]["internal"])
                raw = (info["kernel_id"], info["agent_id"]["handle"], info["queue_id"]["handle"], grid["x"], grid["y"],
                       grid["z"], size["x"], size["y"], size["z"], info["group_segment_size"],
                       info["private_segment_size"])
            except (KeyError, TypeError, IndexError):
                slow(record)
                continue
            if not (type(start) is type(end) is type(correlation) is int and set(map(type, raw)) == ints):
                slow(record)
                continue
            number = seen.get(raw)
            if number is None:
                number = first(raw)
                if number is None:
                    slow(record)
                    continue
            rows = len(starts)
            try:
                starts.append(start)
                ends.append(end)
                correlations.append(correlation)
            except OverflowError:  # past 64 bits: read as missing, as `_int` does
                del starts[rows:], ends[rows:], correlations[rows:]
                slow(record)
                continue
            configs.append(number)

    def _first(self, raw: tuple[int, ...]) -> int | None:
        """The configuration's number of fields seen for the first time, or None where they need
        `_dispatch`'s checks."""
        gx, gy, gz, sx, sy, sz = raw[3:9]
        if min(raw) < -_INT64 or max(raw) >= _INT64 or min(sx, sy, sz) <= 0 or min(gx, gy, gz) < 0:
            return None
        number = self.seen[raw] = self._number((*raw[:3], -(-gx // sx), -(-gy // sy), -(-gz // sz), *raw[6:]))
        return number

    def _dispatch(self, record: Any) -> None:
        """A dispatch record of any shape: what is sound read, a field of the wrong type as absent."""
        record = _o(record)
        info = _o(record.get("dispatch_info"))
        start, end = _int(record.get("start_timestamp")), _int(record.get("end_timestamp"))
        if start is None or end is None:
            self.skipped += 1
            return
        size, grid = _o(info.get("workgroup_size")), _o(info.get("grid_size"))
        block = [_int(size.get(k)) for k in "xyz"]
        self._add(start, end, _int(_o(record.get("correlation_id")).get("internal")),
                  (_int(info.get("kernel_id")), _int(_o(info.get("agent_id")).get("handle")),
                   _int(_o(info.get("queue_id")).get("handle")),
                   *(workgroups(_int(grid.get(k)), b) for k, b in zip("xyz", block)), *block,
                   _int(info.get("group_segment_size")), _int(info.get("private_segment_size"))))

    def call(self, source: int, record: Any) -> None:
        record = _o(record)
        start, end = _int(record.get("start_timestamp")), _int(record.get("end_timestamp"))
        if start is None or end is None:
            return
        self.calls.add((start, end, source, _int(record.get("kind")), _int(record.get("operation")),
                        _int(record.get("thread_id")) or 0, _int(_o(record.get("correlation_id")).get("internal"))))


def walk(path: Path, progress: Callable[[int], None] | None = None) -> _Records:
    """The tool's entry of a rocprofv3 JSON file, walked; raises TraceFormatError for a damaged file."""
    records = _Records()
    walker = Walk(path)
    collecting = gc.isenabled()
    gc.disable()  # parsed JSON holds no cycles: the collector would only rescan the records held (-20 % CPU)
    try:
        found = False
        for key in walker.members():
            if key != "rocprofiler-sdk-tool":
                walker.skip()
                continue
            found = False
            if walker.peek() == "[":  # a list of tool entries: the first one is read
                first = True
                for _ in walker.items():
                    if first and walker.peek() == "{":
                        records = _Records()
                        _tool(walker, records, progress)
                        found = True
                    else:
                        walker.skip()
                    first = False
            elif walker.peek() == "{":
                records = _Records()
                _tool(walker, records, progress)
                found = True
            else:
                walker.skip()
        walker.end()
    except (OSError, EOFError, ValueError, RecursionError) as e:
        raise TraceFormatError(f"{path} is a damaged rocprofv3 JSON file ({type(e).__name__})") from None
    finally:
        walker.close()
        if collecting:
            gc.enable()
    if not found:
        raise TraceFormatError(f"{path}: its rocprofiler-sdk-tool entry is not an object")
    return records


def _tool(walker: Walk, records: _Records, progress: Callable[[int], None] | None) -> None:
    reported = 0
    for key in walker.members():
        if key in _SMALL:
            records.data[key] = walker.value()
        elif key == "buffer_records" and walker.peek() == "{":
            records.restart()
            for kind in walker.members():
                if walker.peek() != "[":
                    walker.skip()
                    continue
                read = _reader(records, kind)
                if read is None:
                    walker.skip()
                    continue
                for slab in walker.slabs():
                    if kind == "kernel_dispatch":
                        records.dispatches(slab)
                    else:
                        for record in slab:
                            read(record)
                    if progress is not None and walker.bytes_read - reported >= 1 << 20:
                        progress(walker.bytes_read - reported)
                        reported = walker.bytes_read
        else:
            if key == "buffer_records":
                records.restart()
            walker.skip()
    if progress is not None:
        progress(walker.bytes_read - reported)


def _reader(records: _Records, kind: str) -> Callable[[Any], None] | None:
    if kind == "kernel_dispatch":
        return records.dispatches  # a slab at a time
    if kind in _CALL_KINDS:
        source = _CALL_KINDS.index(kind)
        return lambda record: records.call(source, record)
    if kind == "memory_copy":
        return records.copies.append
    if kind == "marker_api":
        return records.markers.append
    return None


class _WalkSource:
    def __init__(self, path: Path):
        self.path = path

    def close(self) -> None:
        pass


class RocprofJsonReader:
    """rocprofv3's JSON output (`rocprofv3 --kernel-trace --output-format json`), streamed."""

    name: ClassVar[str] = "rocprofv3-json"
    container: ClassVar[str] = "json"

    def sniff(self, text: bytes) -> bool:
        return b'"rocprofiler-sdk-tool"' in text

    def open(self, path: Path, options: LoadOptions) -> _WalkSource:
        return _WalkSource(Path(path))

    def estimate_rows(self, src: _WalkSource) -> int:
        """The file's bytes: the walk reports those it has read."""
        return src.path.stat().st_size

    def read(self, src: _WalkSource, sink: Sink) -> SourceInfo:
        records = walk(src.path, sink.progress)
        data = records.data
        tables = _Tables()
        gpus = sorted((a for a in _l(data.get("agents")) if isinstance(a, dict) and a.get("type") == 2),
                      key=lambda a: (_int(a.get("node_id")) or 0))
        device_of = {}
        for index, agent in enumerate(gpus):
            device_of[_int(_o(agent.get("id")).get("handle"))] = index
            tables.gpus.append(gpu_row(index, _text(agent.get("product_name")) or _text(agent.get("name")),
                                       agent.get("cu_count"), agent.get("max_engine_clk_fcompute"),
                                       agent.get("wave_front_size"), agent.get("name"), agent.get("max_waves_per_cu"),
                                       agent.get("lds_size_in_kb")))
        metadata, strings = _o(data.get("metadata")), _o(data.get("strings"))
        pid = _int(metadata.get("pid")) or PID
        names = _operation_names(strings)
        kernels, configs = records.kernels.table(), _configs(records.configs, data, device_of)
        data.pop("kernel_symbols", None)
        calls = _calls(records.calls.table(), names)
        tables.memops = [row for row in (_copy_row(r, names, device_of) for r in records.copies) if row is not None]
        tables.ranges = _marker_ranges(records.markers, strings, PID)
        records.copies = records.markers = []
        if not kernels.num_rows and not tables.memops:
            raise TraceFormatError("the profile records no kernel dispatch" + (
                f" ({records.skipped:,} rows without a kernel name or a start and end time)"
                if records.skipped else ""))
        starts = kernels["start_ns"] if kernels.num_rows else pa.array([m["start_ns"] for m in tables.memops], pa.int64())
        middle = starts.take(pc.array_sort_indices(starts))[len(starts) // 2].as_py()
        del starts
        kept = keep(kernels, middle, sink, "kernel", "kernel_events")
        tables.memops = keep_rows(tables.memops, middle, sink, "memcpy/memset", "memops",
                                  times=lambda m: (m["start_ns"], m["end_ns"]))
        calls = calls.take(keep(calls, middle, sink, "API call", "api_events"))
        tables.ranges = keep_rows(tables.ranges, middle, sink, "NVTX event", "nvtx_events")
        if not len(kept) and not tables.memops:
            raise TraceFormatError("the profile's dispatches all have damaged times")
        tables.write(sink)  # GPUs, copies and ranges (XLA's derived ranges: none, without hlo ops)
        write_calls(calls, sink)
        del calls
        _write_kernels(kernels, configs, kept, sink)
        host = _text(_o(metadata.get("node")).get("hostname"))
        return SourceInfo(format="rocprofv3", tool="rocprofv3 (rocprofiler-sdk) JSON"
                          + (f", host {host}" if host else "") + f", pid {pid}")


def _lookup(keys: pa.Array, value: Callable[[Any], Any], kind: pa.DataType) -> pa.Array:
    """`value(key)` for each key, called once per distinct key (a null key included); texts
    dictionary-encoded (a kernel's name is not copied for each of its dispatches)."""
    distinct = pc.unique(keys)
    values = pa.array([value(k) for k in distinct.to_pylist()], kind)
    indices = pc.index_in(keys, value_set=distinct, skip_nulls=False)
    return pa.DictionaryArray.from_arrays(indices, values) if kind == pa.string() else values.take(indices)


def _configs(configs: dict[tuple[Any, ...], int], data: dict[str, Any], device_of: dict[int | None, int]) -> pa.Table:
    """A row per distinct dispatch configuration, in the order of their numbers, with the kernel's
    name (dictionary-encoded), registers (arch and accumulation VGPRs, SGPRs: the kernel symbol's)
    and the device."""
    keys = list(configs)
    table = pa.table({c: pa.array(list(v), pa.int64()) for c, v in zip(_CONFIG_COLUMNS, zip(*keys))} if keys
                     else {c: pa.array([], pa.int64()) for c in _CONFIG_COLUMNS})
    symbols = {_int(s.get("kernel_id")): s for s in _l(data.get("kernel_symbols")) if isinstance(s, dict)}

    def name(kernel_id: int | None) -> str:
        symbol = _o(symbols.get(kernel_id))
        text = (_text(symbol.get("demangled_kernel_name")) or _text(symbol.get("kernel_name"))
                or f"kernel {kernel_id}")
        return amd._KD.sub("", text)

    kernel, agent = table["kernel"].combine_chunks(), table["agent"].combine_chunks()
    table = table.drop_columns(["kernel", "agent"])
    table = table.append_column("name", _lookup(kernel, name, pa.string()))
    for column, field in (("registers_per_thread", "arch_vgpr_count"), ("accum_vgprs", "accum_vgpr_count"),
                          ("sgprs", "sgpr_count")):
        table = table.append_column(column, _lookup(kernel, lambda k, f=field: _int(_o(symbols.get(k)).get(f)), pa.int64()))
    return table.append_column("device_id", _lookup(agent, lambda a: device_of.get(a, 0), pa.int64()))


def _calls(raw: pa.Table, names: dict[tuple[int | None, int], str]) -> pa.Table:
    """The API calls' columns with the function's name, from the kind of record and its operation."""
    if not raw.num_rows:
        return raw.append_column("name", pa.array([], pa.string()))
    keys = key_rows(raw["source"], raw["kind"], raw["operation"])
    labels = [names.get((k["k1"], k["k2"]), f"{_CALL_KINDS[k['k0']]} call") for k in keys.dictionary.to_pylist()]
    return raw.append_column("name", pa.array(labels, pa.string()).take(keys.indices))








def _write_kernels(kernels: pa.Table, shared_rows: pa.Table, kept: pa.Array, sink: Sink) -> None:
    """As `xplane_tables._write_kernels`, from columns: the `kept` rows in (start, device, stream)
    order, numbered in that order, taken with their configuration's columns and sent WRITE_ROWS
    at a time in one INSERT (a sorted copy of the whole table is never made)."""
    if not len(kept):
        return
    config = kernels["config"].take(kept)
    keys = pa.table({"start_ns": kernels["start_ns"].take(kept), "device_id": shared_rows["device_id"].take(config),
                     "stream_id": shared_rows["stream_id"].take(config)})
    del config
    order = kept.take(pc.sort_indices(keys, sort_keys=[("start_ns", "ascending"), ("device_id", "ascending"),
                                                       ("stream_id", "ascending")]))  # nulls last
    del keys
    names, configs, queues = Names(), Names(), Names()

    def column(part: pa.Table, c: str) -> pa.Array:
        if c in part.column_names:
            return part[c].combine_chunks()
        return pa.nulls(part.num_rows, pa.int64())

    def chunks() -> Any:
        for first in range(0, len(order), WRITE_ROWS):
            part = kernels.take(order.slice(first, WRITE_ROWS))
            shared = shared_rows.take(part["config"])
            part = pa.table({**{c: part[c] for c in ("start_ns", "end_ns", "correlation_id")},
                             **{c: shared[c] for c in shared.column_names}})
            batch = pa.table({c: column(part, c) for c in ("start_ns", "end_ns", "correlation_id", "graph_node_id",
                                                            *AMD_CONFIG_COLUMNS, *KERNEL_QUEUE_COLUMNS)})
            batch = batch.set_column(batch.column_names.index("pid"), "pid", pa.array([PID] * part.num_rows, pa.int64()))
            yield numbered(kernel_batch(
                batch, name_id=names.number(part["name"]),
                config_id=configs.number(*[batch[c] for c in AMD_CONFIG_COLUMNS]),
                queue_id=queues.number(*[batch[c] for c in KERNEL_QUEUE_COLUMNS])), first)

    progress, sink.progress = sink.progress, None  # the walk reported the file's bytes
    try:
        sink.append_all("kernel_events", chunks())
    finally:
        sink.progress = progress
    sink.append("kernel_configs", kernel_configs(configs.keys, optin_code=1, launch_types={}, names=AMD_CONFIG_COLUMNS),
                source_rows=0)
    sink.append("kernel_queues", kernel_queues(queues.keys), source_rows=0)
    demangled = [key[0] for key in names.keys]
    sink.append("kernel_names", kernel_names(demangled, [_short(n) for n in demangled], [None] * len(demangled)),
                source_rows=0)
