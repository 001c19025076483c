"""AMD's profilers (docs/amd.md): rocprofv3's JSON (`--output-format json`) and kernel-trace CSV,
rocprof v1's results database (table `KERN`) and CSV, and rocmProfileData's RPD SQLite
(`rocpd_op`, `rocpd_api`, `rocpd_kernelapi`, `rocpd_string`).

Each becomes the store's GPUs, kernels (name, times, agent as device, queue as stream, workgroup
as block, grid in workgroups, LDS as static shared memory, VGPRs as registers, scratch as local
memory per work-item) and, where the format has them, API calls linked by correlation id and
copies. The rows are written by the same writer as the XPlane reader's (`xplane_tables`).
Grids: rocprof counts a grid in work-items, traceq in workgroups (CUDA's blocks): a grid of
1,048,576 work-items in workgroups of 256 is stored as 4,096; RPD's `rocpd_kernelapi` records the
launch call's grid, already in workgroups.
"""

from __future__ import annotations

import csv
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from traceq.errors import TraceFormatError
from traceq.ingest.base import LoadOptions, Sink, SourceInfo, SqliteReader
from traceq.ingest.columns import BATCH_ROWS, Devices, Rows, either, grid_workgroups, ints, no_collection, texts
from traceq.ingest.columns import KD as _KD
from traceq.ingest.columns import number as _int
from traceq.ingest.validate import TIME_LIMIT_NS
from traceq.ingest.xplane import _Tables
from traceq.ingest.xplane_tables import PID

_ARCH = re.compile(r"gfx[0-9a-f]{2,5}")
"""An AMD ISA target's name, as an agent's `name` gives it ('gfx942')."""
_V1_CSV = ('"KernelName"', '"gpu-id"')
_V3_CSV = ('"Kernel_Name"', '"Agent_Id"')


def kernel_row(name: str, start: int, end: int, device: int, stream: int | None, *, correlation: int | None = None,
               pid: int = PID, grid: tuple[Any, Any, Any] = (None, None, None),
               block: tuple[Any, Any, Any] = (None, None, None), registers: Any = None, lds: Any = None,
               scratch: Any = None, accum_vgprs: Any = None, sgprs: Any = None) -> dict[str, Any]:
    """A kernel row in the XPlane writer's form, with AMD's registers (`registers` the arch VGPRs)."""
    return {"start_ns": int(start), "end_ns": int(end), "name": _KD.sub("", name), "correlation_id": correlation,
            "graph_node_id": None, "device_id": device, "context_id": None, "stream_id": stream, "pid": pid,
            "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2], "block_x": block[0], "block_y": block[1],
            "block_z": block[2], "registers_per_thread": registers, "smem_static_bytes": lds,
            "smem_dynamic_bytes": None, "smem_carveout_bytes": None, "smem_optin": None,
            "local_memory_per_thread_bytes": scratch, "local_memory_total_bytes": None, "launch_type": None,
            "hlo_op": None, "hlo_module": None, "program_id": None, "accum_vgprs": accum_vgprs, "sgprs": sgprs}


def workgroups(items: Any, size: Any) -> int | None:
    """A grid dimension in workgroups from rocprof's work-items."""
    if not isinstance(items, int) or not isinstance(size, int) or size <= 0 or items < 0:
        return None
    return -(-items // size)


def gpu_row(device: int, name: str | None, compute_units: Any = None, clock_mhz: Any = None,
            wave: Any = 64, arch: Any = None, waves_per_cu: Any = None, lds_kib: Any = None) -> dict[str, Any]:
    """An AMD GPU: `arch` its ISA target ('gfx942', kept where it is one), `waves_per_cu` and
    `lds_kib` the agent's wave slots and LDS per CU, as max_warps_per_sm and max_smem_per_sm_bytes."""
    def positive(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 31 else None

    lds = positive(lds_kib)
    return {"device_id": device, "name": name or f"AMD GPU {device}", "vendor": "AMD", "cc_major": None,
            "cc_minor": None, "sm_count": compute_units if isinstance(compute_units, int) else None,
            "clock_hz": int(clock_mhz) * 1_000_000 if isinstance(clock_mhz, int) and clock_mhz > 0 else None,
            "memory_bytes": None, "memory_bandwidth_bytes_per_s": None,
            "threads_per_warp": wave if isinstance(wave, int) and wave > 0 else 64,
            "max_warps_per_sm": positive(waves_per_cu), "max_smem_per_sm_bytes": lds * 1024 if lds else None,
            "arch": arch if isinstance(arch, str) and _ARCH.fullmatch(arch) else None}


class _Rows:
    """A reader's rows, written by the XPlane writer."""

    def __init__(self) -> None:
        self.tables = _Tables()
        self.skipped = 0  # dispatches without a name or a start and end time

    def write(self, sink: Sink) -> None:
        """The rows into the sink, less those with an end before the start or a time more than
        TIME_LIMIT_NS from the median dispatch (AMD's times are the host's monotonic clock, not
        relative to the session: a damaged time is told by its distance from the others)."""
        t = self.tables
        if not t.kernels and not t.memops:
            raise TraceFormatError("the profile records no kernel dispatch" + (
                f" ({self.skipped:,} rows without a kernel name or a start and end time)" if self.skipped else ""))
        starts = sorted(k["start_ns"] for k in t.kernels or t.memops)
        middle = starts[len(starts) // 2]

        def keep(rows: list[Any], noun: str, times: Any, table: str) -> list[Any]:
            kept, late, reversed_, total = [], 0, 0, 0
            for row in rows:
                start, end = times(row)
                if abs(start - middle) >= TIME_LIMIT_NS or (end is not None and abs(end - middle) >= TIME_LIMIT_NS):
                    late += 1
                elif end is not None and end < start:
                    reversed_ += 1
                else:
                    kept.append(row)
                    total += 0 if end is None else end - start
            sink.damage.add(noun, "with times out of range dropped", late)
            sink.damage.add(noun, "with end < start dropped", reversed_)
            sink.damage.add_total(table, float(total))
            return kept

        t.kernels = keep(t.kernels, "kernel", lambda k: (k["start_ns"], k["end_ns"]), "kernel_events")
        t.memops = keep(t.memops, "memcpy/memset", lambda m: (m["start_ns"], m["end_ns"]), "memops")
        t.calls = keep(t.calls, "API call", lambda c: (c[0], c[1]), "api_events")
        t.ranges = keep(t.ranges, "NVTX event", lambda r: (r[0], r[1]), "nvtx_events")
        if not t.kernels and not t.memops:
            raise TraceFormatError("the profile's dispatches all have damaged times")
        t.write(sink)


# --------------------------------------------------------------------------------------------
# rocprofv3 JSON


def _o(value: Any) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one (a damaged file's field)."""
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list[Any]:
    """`value` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


_COPY_KINDS = {"MEMORY_COPY_HOST_TO_DEVICE": "Host-to-Device", "MEMORY_COPY_DEVICE_TO_HOST": "Device-to-Host",
               "MEMORY_COPY_DEVICE_TO_DEVICE": "Device-to-Device", "MEMORY_COPY_HOST_TO_HOST": "Host-to-Host"}
_RANGE_KINDS = {"roctxThreadRangeA": "pushpop", "roctxProcessRangeA": "startend", "roctxMarkA": "mark"}


def _copy_row(record: Any, names: dict[tuple[int | None, int], str], device_of: dict[int | None, int]
              ) -> dict[str, Any] | None:
    """A rocprofv3 `memory_copy` record as a memops row: its direction from the operation's name,
    its device the GPU end of the copy (the destination of a host-to-device copy, else the source)."""
    if not isinstance(record, dict):
        return None
    start, end = _int(record.get("start_timestamp")), _int(record.get("end_timestamp"))
    if start is None or end is None:
        return None
    operation = names.get((_int(record.get("kind")), _int(record.get("operation"))), "")
    kind = _COPY_KINDS.get(operation, "Other")
    agent = _o(record.get("dst_agent_id" if kind == "Host-to-Device" else "src_agent_id"))
    device = device_of.get(_int(agent.get("handle")))
    return {"start_ns": start, "end_ns": end, "dur_ns": end - start, "op": "memcpy", "copy_kind": kind,
            "bytes": _int(record.get("bytes")), "device_id": device if device is not None else 0, "stream_id": None,
            "correlation_id": _int(_o(record.get("correlation_id")).get("internal")), "pid": PID}


def _marker_ranges(records: list[Any], strings: dict[str, Any], pid: int
                   ) -> list[tuple[int, int | None, str, str, str, int | None, int | None]]:
    """roctx ranges and marks: the `MARKER_CORE_RANGE_API` records of `marker_api` (a thread's
    push/pop range, a process's start/stop range, a mark), named by `strings.marker_api`, which maps
    a record's correlation id to its message. The `MARKER_CORE_API` records are the roctx calls
    themselves (the push, the pop), not ranges."""
    messages = {_int(m.get("key")): _text(m.get("value")) for m in _l(strings.get("marker_api"))
                if isinstance(m, dict)}
    kinds = _l(strings.get("buffer_records"))
    ranges = []
    for record in records:
        if not isinstance(record, dict):
            continue
        kind = _int(record.get("kind"))
        entry = kinds[kind] if kind is not None and 0 <= kind < len(kinds) and isinstance(kinds[kind], dict) else {}
        if entry.get("kind") != "MARKER_CORE_RANGE_API":
            continue
        operations, operation = _l(entry.get("operations")), _int(record.get("operation"))
        style = _RANGE_KINDS.get(operations[operation] if operation is not None and 0 <= operation < len(operations)
                                 else "", "pushpop")
        start, end = _int(record.get("start_timestamp")), _int(record.get("end_timestamp"))
        message = messages.get(_int(_o(record.get("correlation_id")).get("internal")))
        if start is None or (end is None and style != "mark"):
            continue
        ranges.append((start, None if style == "mark" else end, str(message) if message is not None else "roctx",
                       style, "roctx", pid, _int(record.get("thread_id"))))
    return ranges


def _operation_names(strings: dict[str, Any]) -> dict[tuple[int | None, int], str]:
    """(record kind, operation) -> the API function's name, from the `strings` table of kinds."""
    names = {}
    for kind, entry in enumerate(_l(strings.get("buffer_records"))):
        for operation, name in enumerate(_l(_o(entry).get("operations"))):
            if isinstance(name, str):
                names[(kind, operation)] = name
    return names


# --------------------------------------------------------------------------------------------
# rocprof v1's and rocprofv3's CSV


def _dispatches(r: dict[str, Sequence[Any]], n: int, v3: bool, rows: Rows, devices: Devices, *,
                quoted: bool = False) -> None:
    """A batch of n dispatch rows (`r`: a column's values by the column's name) into `rows`:
    rocprofv3's columns (`v3`) or rocprof v1's; `quoted`: values as rocprof v1's database holds
    them (numbers, or texts in double quotes)."""
    def column(key: str) -> pa.Array:
        return ints(r.get(key), n, quoted=quoted)

    ones = pa.repeat(pa.scalar(1, pa.int64()), n)
    if v3:
        name, start, end = texts(r.get("Kernel_Name"), n, quoted=quoted), column("Start_Timestamp"), column("End_Timestamp")
        agent, stream = column("Agent_Id"), column("Queue_Id")
        size = tuple(column(f"Workgroup_Size_{k}") for k in "XYZ")
        grid = tuple(grid_workgroups(column(f"Grid_Size_{k}"), s) for k, s in zip("XYZ", size))
        extra = {"correlation": column("Correlation_Id"), "lds": column("Group_Segment_Size"),
                 "scratch": column("Private_Segment_Size"),
                 "registers": ints(either(r.get("Arch_VGPR_Count"), r.get("VGPR_Count")), n, quoted=quoted),
                 "accum_vgprs": column("Accum_VGPR_Count"), "sgprs": column("SGPR_Count")}
    else:
        name, start, end = texts(r.get("KernelName"), n, quoted=quoted), column("BeginNs"), column("EndNs")
        agent, stream = column("gpu-id"), column("queue-id")
        size = (column("wgr"), ones, ones)
        grid = (grid_workgroups(column("grd"), size[0]), ones, ones)
        extra = {"lds": column("lds"), "scratch": column("scr"), "registers": column("arch_vgpr"),
                 "accum_vgprs": column("accum_vgpr"), "sgprs": column("sgpr")}
    named = pc.and_(pc.is_valid(name), pc.not_equal(pc.fill_null(name, ""), ""))
    good = pc.fill_null(pc.and_(named, pc.and_(pc.is_valid(start), pc.is_valid(end))), False)
    kept = int(pc.sum(pc.cast(good, pa.int64())).as_py() or 0)
    rows.kernels.skipped += n - kept
    if not kept:
        return
    pick = (lambda a: a) if kept == n else (lambda a: a.filter(good))
    correlation = extra.get("correlation")
    rows.kernels.add(pick(start), pick(end), pick(correlation) if correlation is not None else pa.nulls(kept, pa.int64()),
                     {"name": pick(name), "device_id": devices.number(pick(agent)), "stream_id": pick(stream),
                      **{f"grid_{k}": pick(g) for k, g in zip("xyz", grid)},
                      **{f"block_{k}": pick(b) for k, b in zip("xyz", size)},
                      "registers_per_thread": pick(extra["registers"]), "smem_static_bytes": pick(extra["lds"]),
                      "local_memory_per_thread_bytes": pick(extra["scratch"]),
                      "accum_vgprs": pick(extra["accum_vgprs"]), "sgprs": pick(extra["sgprs"])})


def _csv_batches(reader: Any, header: list[str]) -> Iterator[tuple[dict[str, Sequence[Any]], int]]:
    """The rows after the header BATCH_ROWS at a time, as columns by name (as `csv.DictReader`
    reads them: blank lines skipped, a short row's missing cells None, a long row's extra cells
    left out, a name given twice its last column)."""
    width = len(header)
    while rows := list(islice(reader, BATCH_ROWS)):
        if set(map(len, rows)) != {width}:
            rows = [row + [None] * (width - len(row)) if len(row) < width else row for row in rows if row]
            if not rows:
                continue
        columns = list(zip(*rows)) if width else []
        yield {name: columns[i] for i, name in enumerate(header)}, len(rows)


class RocprofCsvReader:
    """rocprof v1's `results.csv` and rocprofv3's `kernel_trace.csv`, told by their header."""

    name: ClassVar[str] = "rocprof-csv"
    container: ClassVar[str] = "csv"

    def sniff(self, header: str) -> bool:
        return all(k in header for k in _V1_CSV) or all(k in header for k in _V3_CSV)

    def open(self, path: Path, options: LoadOptions) -> _CsvSource:
        return _CsvSource(Path(path))

    def estimate_rows(self, src: _CsvSource) -> int:
        """The file's bytes: the reading reports those it has read."""
        return src.path.stat().st_size

    def read(self, src: _CsvSource, sink: Sink) -> SourceInfo:
        rows, devices, v3, reported = Rows(), Devices(), False, 0
        try:
            with no_collection(), src.path.open(encoding="utf-8", newline="") as f:
                reader = csv.reader(f)
                header = next(reader, None) or []
                for r, n in _csv_batches(reader, header):
                    v3 = "Kernel_Name" in r
                    _dispatches(r, n, v3, rows, devices)
                    if sink.progress is not None:
                        sink.progress(f.buffer.tell() - reported)
                        reported = f.buffer.tell()
        except UnicodeDecodeError:
            raise TraceFormatError(f"{src.path} is not UTF-8 text") from None
        except csv.Error as e:
            raise TraceFormatError(f"{src.path} is not a well-formed CSV file ({e})") from None
        rows.gpus.extend(gpu_row(index, None) for index in range(len(devices.numbers)))
        rows.write(sink)
        return SourceInfo(format="rocprof-csv", tool="rocprofv3 kernel trace (CSV)" if v3 else "rocprof v1 (CSV)")


class _CsvSource:
    def __init__(self, path: Path):
        self.path = path

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------------
# rocprof v1's results database and rocmProfileData's RPD


class RocprofDbReader(SqliteReader):
    """rocprof v1's `results.db` (`rocprof --stats`): one table, `KERN`, a row per dispatch."""

    name: ClassVar[str] = "rocprof-db"

    def sniff(self, tables: set[str]) -> bool:
        return "KERN" in tables and "rocpd_op" not in tables

    def estimate_rows(self, src: sqlite3.Connection) -> int:
        return int(src.execute("SELECT count(*) FROM KERN").fetchone()[0])

    def read(self, src: sqlite3.Connection, sink: Sink) -> SourceInfo:
        """`KERN`'s rows a batch at a time, read as its CSV is (every value's text, double quotes
        stripped)."""
        cursor = src.execute('SELECT * FROM KERN')
        columns = [c[0] for c in cursor.description]
        rows, devices, v3 = Rows(), Devices(), False
        with no_collection():
            while batch := cursor.fetchmany(BATCH_ROWS):
                r = dict(zip(columns, zip(*batch)))
                v3 = "Kernel_Name" in r
                _dispatches(r, len(batch), v3, rows, devices, quoted=True)
                if sink.progress is not None:
                    sink.progress(len(batch))
        rows.gpus.extend(gpu_row(index, None) for index in range(len(devices.numbers)))
        rows.write(sink)
        return SourceInfo(format="rocprof-db", tool="rocprof v1 (results.db)")


class _Strings:
    """`rocpd_string`'s texts, asked for by id as the reader needs them (not the whole table: an
    RPD keeps every call's arguments there)."""

    def __init__(self, src: sqlite3.Connection):
        self.src = src
        self.known: dict[Any, str | None] = {}

    def get(self, ids: Iterable[Any]) -> dict[Any, str | None]:
        missing = [i for i in dict.fromkeys(ids) if i is not None and i not in self.known]
        for first in range(0, len(missing), 500):
            part = missing[first:first + 500]
            self.known.update(dict.fromkeys(part))
            for i, text in self.src.execute(f"SELECT id, string FROM rocpd_string WHERE id IN ({', '.join('?' * len(part))})",
                                            part):
                if isinstance(text, str):
                    self.known[i] = text
        return self.known

    def labels(self, ids: pa.Array, default: str) -> pa.Array:
        """The text of each id (`default` for an unknown id or an empty text)."""
        distinct = pc.unique(ids)
        known = self.get(distinct.to_pylist())
        values = pa.array([known.get(i) or default for i in distinct.to_pylist()], pa.string())
        return values.take(pc.index_in(ids, value_set=distinct, skip_nulls=False))


class RpdReader(SqliteReader):
    """rocmProfileData's RPD: `rocpd_op` (GPU operations: KernelExecution, Copy*, FillBuffer),
    `rocpd_api` (host calls, linked to their operations by `rocpd_api_ops`), `rocpd_kernelapi`
    (a launch's grid and workgroup), `rocpd_string`. Read a batch of rows at a time into
    columns; the links, launches and copy sizes joined to the operations in SQLite, the strings
    read by id as they are needed."""

    name: ClassVar[str] = "rpd"

    def sniff(self, tables: set[str]) -> bool:
        return {"rocpd_op", "rocpd_string"} <= tables

    def estimate_rows(self, src: sqlite3.Connection) -> int:
        return int(src.execute("SELECT count(*) FROM rocpd_op").fetchone()[0])

    def read(self, src: sqlite3.Connection, sink: Sink) -> SourceInfo:
        with no_collection():
            return self._read(src, sink)

    def _read(self, src: sqlite3.Connection, sink: Sink) -> SourceInfo:
        tables = {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        strings, rows, devices = _Strings(src), Rows(), Devices(none=None)
        rows.memops = _operations(src, tables, strings, rows, devices, sink)
        rows.memop_columns = _memop_columns
        if "rocpd_api" in tables:
            rows.call_batches = lambda: _rpd_calls(src, strings, rows)
        rows.gpus.extend(gpu_row(index, None) for index in range(len(devices.numbers)))
        rows.write(sink)
        version = dict(src.execute("SELECT tag, value FROM rocpd_metadata")).get("schema_version") \
            if "rocpd_metadata" in tables else None
        version = str(version) if isinstance(version, (str, int)) else None
        return SourceInfo(format="rpd", tool="rocmProfileData (RPD)", schema_version=version)


_OP_KINDS = ("FillBuffer", "CopyHostToDevice", "CopyDeviceToHost", "CopyDeviceToDevice")
"""The copies' kinds by their code in `_operations`' copies; 4: another Copy*."""
_COPY_CODES = (None, "Host-to-Device", "Device-to-Host", "Device-to-Device", "Other")
_LAUNCH = ("gridX", "gridY", "gridZ", "workgroupX", "workgroupY", "workgroupZ", "groupSegmentSize", "privateSegmentSize")


def _operations(src: sqlite3.Connection, tables: set[str], strings: _Strings, rows: Rows, devices: Devices,
                sink: Sink) -> pa.Table:
    """`rocpd_op`'s rows with a start and an end, in start order, a batch at a time, joined in
    SQLite to the launching call (`rocpd_api_ops`), its launch (`rocpd_kernelapi`: grid,
    workgroup, LDS, scratch) or copy (`rocpd_copyapi`: bytes): KernelExecutions into
    `rows.kernels` (named by their description), copies and FillBuffers returned as compact
    columns (`_memop_columns` makes the store's). GPUs are numbered in that order (`devices`,
    every operation's); operations without a time are counted as skipped."""
    linked, launched, sized = ("rocpd_api_ops" in tables, "rocpd_kernelapi" in tables, "rocpd_copyapi" in tables)
    select = ", ".join(["o.id", "o.gpuId", "o.queueId", "o.start", 'o."end"', "o.description_id", "o.opType_id",
                        "l.api_id" if linked else "NULL", *(f"k.{c}" if launched and linked else "NULL" for c in _LAUNCH),
                        "c.size" if sized and linked else "NULL"])
    joins = (" LEFT JOIN rocpd_api_ops l ON l.op_id = o.id" if linked else "") + (
        " LEFT JOIN rocpd_kernelapi k ON k.api_ptr_id = l.api_id" if launched and linked else "") + (
        " LEFT JOIN rocpd_copyapi c ON c.api_ptr_id = l.api_id" if sized and linked else "")
    columns = ("id", "gpu", "queue", "start", "end", "description", "kind", "api", *_LAUNCH, "size")
    copies = []
    kinds = pa.array(_OP_KINDS, pa.string())
    cursor = src.execute(f"SELECT {select} FROM rocpd_op o{joins} ORDER BY o.start")
    while batch := cursor.fetchmany(BATCH_ROWS):
        n = len(batch)
        part = pa.table({c: ints(v, n) for c, v in zip(columns, zip(*batch))})
        part = part.filter(pc.and_(pc.is_valid(part["start"]), pc.is_valid(part["end"])))
        rows.kernels.skipped += n - part.num_rows
        part = part.append_column("device", devices.number(part["gpu"].combine_chunks()))
        kind = strings.labels(part["kind"].combine_chunks(), "")
        kernels = part.filter(pc.equal(kind, "KernelExecution"))
        rows.kernels.add(kernels["start"], kernels["end"], kernels["api"], {
            "name": strings.labels(kernels["description"].combine_chunks(), "kernel"),
            "device_id": kernels["device"], "stream_id": kernels["queue"],
            **{f"grid_{k}": kernels[f"grid{k.upper()}"] for k in "xyz"},
            **{f"block_{k}": kernels[f"workgroup{k.upper()}"] for k in "xyz"},
            "registers_per_thread": pa.nulls(kernels.num_rows, pa.int64()),
            "smem_static_bytes": kernels["groupSegmentSize"], "local_memory_per_thread_bytes": kernels["privateSegmentSize"],
            "accum_vgprs": pa.nulls(kernels.num_rows, pa.int64()), "sgprs": pa.nulls(kernels.num_rows, pa.int64())})
        copying = pc.or_(pc.starts_with(kind, "Copy"), pc.equal(kind, "FillBuffer"))
        code = pc.cast(pc.fill_null(pc.index_in(kind.filter(copying), value_set=kinds), 4), pa.int8())
        copy = part.filter(copying)
        copies.append(pa.table({"start_ns": copy["start"], "end_ns": copy["end"], "code": code, "bytes": copy["size"],
                                "device_id": copy["device"], "stream_id": copy["queue"], "correlation_id": copy["api"]}))
        if sink.progress is not None:
            sink.progress(n)
    schema = pa.schema([("start_ns", pa.int64()), ("end_ns", pa.int64()), ("code", pa.int8()), ("bytes", pa.int64()),
                        ("device_id", pa.int64()), ("stream_id", pa.int64()), ("correlation_id", pa.int64())])
    return pa.concat_tables([c.cast(schema) for c in copies]).combine_chunks() if copies else schema.empty_table()


def _memop_columns(copies: pa.Table) -> pa.Table:
    """`_rpd_copies`' columns as the store's memops (a FillBuffer a memset, without bytes)."""
    memset = pc.equal(copies["code"], 0)
    kind = pa.array(_COPY_CODES, pa.string()).take(copies["code"])
    start, end = copies["start_ns"], copies["end_ns"]
    return pa.table({"start_ns": start, "end_ns": end, "dur_ns": pc.subtract(end, start),
                     "op": pc.if_else(memset, "memset", "memcpy"), "copy_kind": kind,
                     "bytes": pc.if_else(memset, pa.scalar(None, pa.int64()), copies["bytes"]),
                     "device_id": copies["device_id"], "stream_id": copies["stream_id"],
                     "correlation_id": copies["correlation_id"],
                     "pid": pa.repeat(pa.scalar(PID, pa.int64()), copies.num_rows)})


def _rpd_calls(src: sqlite3.Connection, strings: _Strings, rows: Rows) -> Iterator[pa.Table]:
    """`rocpd_api`'s calls as API calls, a batch at a time; its `UserMarker` rows (rpd_tracer's
    roctx ranges, their message the args; a mark where end <= start) into `rows.ranges`."""
    columns = ("id", "tid", "start", "end", "name", "args")
    cursor = src.execute("SELECT id, tid, start, \"end\", apiName_id, args_id FROM rocpd_api")
    while batch := cursor.fetchmany(BATCH_ROWS):
        part = pa.table({c: ints(v, len(batch)) for c, v in zip(columns, zip(*batch))})
        part = part.filter(pc.and_(pc.is_valid(part["start"]), pc.is_valid(part["end"])))
        name = strings.labels(part["name"].combine_chunks(), "call")
        marker = pc.equal(name, "UserMarker")
        if pc.any(marker).as_py():
            marks = part.filter(marker)
            args = strings.labels(marks["args"].combine_chunks(), "roctx").to_pylist()
            for (start, end, tid), message in zip(zip(*(marks[c].to_pylist() for c in ("start", "end", "tid"))), args):
                mark = end <= start
                rows.ranges.append((start, None if mark else end, message, "mark" if mark else "pushpop", "roctx", PID,
                                    tid))
            part, name = part.filter(pc.invert(marker)), name.filter(pc.invert(marker))
        yield pa.table({"start_ns": part["start"], "end_ns": part["end"], "name": name,
                        "tid": pc.fill_null(part["tid"], 0), "correlation_id": part["id"]})
