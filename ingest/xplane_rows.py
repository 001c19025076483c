"""The rows of an XPlane profile gathered as the reader walks it (ingest/xplane.py decodes the
events; `xplane_tables` makes each row): kernels as `columns.Kernels` (start, end, correlation
id and a configuration's number), copies, calls and memory events as Arrow columns a batch at a
time, host ranges written to the store a batch at a time as they come. What is written, and in
which order the ids are given, is what the reader that kept every row as a Python value wrote
(`xplane_tables.write_tables`; `tools/store_tables.py` compared the stores)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from traceq.ingest.base import Sink, row_numbers
from traceq.ingest.columns import BATCH_ROWS, RANGE_SCHEMA, Kernels, RangeWriter, gpus_table, write_calls, write_kernels
from traceq.ingest.xla_ranges import xla_range_tables
from traceq.ingest.xplane_tables import PID

KERNEL_CONFIG = ("name", "device_id", "stream_id", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                 "registers_per_thread", "smem_static_bytes", "smem_dynamic_bytes", "local_memory_per_thread_bytes",
                 "hlo_op", "hlo_module", "program_id")
"""A kernel's columns kept once per distinct tuple (with XLA's op, module and program, which the
op and module ranges are made from)."""

_KERNEL = pa.schema([("start_ns", pa.int64()), ("end_ns", pa.int64()), ("correlation_id", pa.int64()),
                     *((c, pa.string() if c in Kernels.TEXT_COLUMNS else pa.int64()) for c in KERNEL_CONFIG)])
_MEMOP = pa.schema([("start_ns", pa.int64()), ("end_ns", pa.int64()), ("dur_ns", pa.int64()), ("op", pa.string()),
                    ("copy_kind", pa.string()), ("bytes", pa.int64()), ("device_id", pa.int64()),
                    ("stream_id", pa.int64()), ("correlation_id", pa.int64()), ("pid", pa.int64())])
_CALL = pa.schema([("start_ns", pa.int64()), ("end_ns", pa.int64()), ("name", pa.string()), ("tid", pa.int64()),
                   ("correlation_id", pa.int64())])
_MEMORY = pa.schema([("ts_ns", pa.int64()), ("op", pa.string()), ("bytes", pa.int64()), ("address", pa.uint64()),
                     ("mem_kind", pa.string()), ("device_id", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64())])


class _Batches:
    """Rows of `schema` as tuples, made an Arrow table every BATCH_ROWS and handed to `emit`."""

    def __init__(self, schema: pa.Schema, emit: Callable[[pa.Table], None]):
        self.schema = schema
        self.emit = emit
        self.rows: list[tuple[Any, ...]] = []

    def add(self, row: tuple[Any, ...]) -> None:
        self.rows.append(row)
        if len(self.rows) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            columns = zip(*self.rows)
            self.rows = []
            self.emit(pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(columns, self.schema)],
                                           schema=self.schema))


class Gathered:
    """What the XPlane reader has read so far, and the writing of it."""

    def __init__(self, sink: Sink):
        self.sink = sink
        self.gpus: list[dict[str, Any]] = []
        self.op_names: dict[tuple[str, str], str] = {}
        self.kernels = Kernels(KERNEL_CONFIG)
        self.ranges = RangeWriter(sink)
        self.parts: dict[str, list[pa.Table]] = {"memops": [], "calls": [], "memory": []}
        self._kernels = _Batches(_KERNEL, self._add_kernels)
        self._memops = _Batches(_MEMOP, self.parts["memops"].append)
        self._calls = _Batches(_CALL, self.parts["calls"].append)
        self._memory = _Batches(_MEMORY, self.parts["memory"].append)
        self._ranges = _Batches(RANGE_SCHEMA, self.ranges.add)

    def kernel(self, row: dict[str, Any]) -> None:
        self._kernels.add((row["start_ns"], row["end_ns"], row["correlation_id"], *(row[c] for c in KERNEL_CONFIG)))

    def _add_kernels(self, table: pa.Table) -> None:
        self.kernels.add(table["start_ns"], table["end_ns"], table["correlation_id"],
                         {c: table[c] for c in KERNEL_CONFIG})

    def memop(self, row: dict[str, Any]) -> None:
        self._memops.add(tuple(row[f.name] for f in _MEMOP))

    def memory(self, row: dict[str, Any]) -> None:
        address = row["address"]  # an unsigned column: a negative one is NULL
        address = address if address is None or address >= 0 else None
        self._memory.add(tuple(row[f.name] if f.name != "address" else address for f in _MEMORY))

    def call(self, start: int, end: int, name: str, tid: int, correlation: int | None) -> None:
        self._calls.add((start, end, name, tid, correlation))

    def range(self, start: int, end: int, name: str, domain: str, tid: int) -> None:
        self._ranges.add((start, end, name, "pushpop", domain, PID, tid))

    def _table(self, name: str, schema: pa.Schema) -> pa.Table:
        parts, self.parts[name] = self.parts[name], []
        return pa.concat_tables(parts).combine_chunks() if parts else schema.empty_table()

    def write(self) -> None:
        """GPUs, calls, kernels, copies, the XLA ranges (after the host ranges, written as they
        came), memory events: as `xplane_tables.write_tables` wrote them."""
        for batches in (self._kernels, self._memops, self._calls, self._memory, self._ranges):
            batches.flush()
        sink = self.sink
        if self.gpus:
            sink.append("gpus", gpus_table(self.gpus), source_rows=0)
        calls = self._table("calls", _CALL)
        if calls.num_rows:
            write_calls(calls, sink)
        kernels, configs = self.kernels.table(), self.kernels.config_table()
        write_kernels(kernels, configs, row_numbers(kernels.num_rows), sink)
        memops = self._table("memops", _MEMOP)
        if memops.num_rows:
            sink.append("memops", memops, source_rows=0)
        if kernels.num_rows:
            shared = configs.select(["device_id", "hlo_op", "hlo_module", "program_id"]).take(kernels["config"])
            for ranges in xla_range_tables(pa.table({**{c: kernels[c] for c in ("start_ns", "end_ns", "correlation_id")},
                                                     **{c: shared[c] for c in shared.column_names}}),
                                           calls.select(["start_ns", "end_ns", "tid", "correlation_id"]), self.op_names):
                self.ranges.add(ranges)
        self.ranges.close()
        memory = self._table("memory", _MEMORY)
        if memory.num_rows:
            sink.append("memory_events", memory, source_rows=0)
