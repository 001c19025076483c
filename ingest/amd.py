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
import io
import re
import sqlite3
from pathlib import Path
from typing import Any, ClassVar

from traceq.errors import TraceFormatError
from traceq.ingest.base import LoadOptions, Sink, SourceInfo, SqliteReader
from traceq.ingest.validate import TIME_LIMIT_NS
from traceq.ingest.xplane import _Tables
from traceq.ingest.xplane_tables import PID

_KD = re.compile(r"(\s*\[clone \.kd\]|\.kd)$")
_ARCH = re.compile(r"gfx[0-9a-f]{2,5}")
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


def _int(value: Any) -> int | None:
    """An integer the store's BIGINT holds, from a number or its text; else None."""
    if isinstance(value, bool):
        return None
    if not isinstance(value, int):
        try:
            value = int(str(value).strip(), 0) if value not in (None, "") else None
        except ValueError:
            return None
    return value if value is not None and -(1 << 63) <= value < (1 << 63) else None


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


class RocprofCsvReader:
    """rocprof v1's `results.csv` and rocprofv3's `kernel_trace.csv`, told by their header."""

    name: ClassVar[str] = "rocprof-csv"
    container: ClassVar[str] = "csv"

    def sniff(self, header: str) -> bool:
        return all(k in header for k in _V1_CSV) or all(k in header for k in _V3_CSV)

    def open(self, path: Path, options: LoadOptions) -> _CsvSource:
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise TraceFormatError(f"{path} is not UTF-8 text") from None
        return _CsvSource(list(csv.DictReader(io.StringIO(text))))

    def estimate_rows(self, src: _CsvSource) -> int:
        return len(src.rows)

    def read(self, src: _CsvSource, sink: Sink) -> SourceInfo:
        rows, v3 = _Rows(), bool(src.rows) and "Kernel_Name" in src.rows[0]
        devices: dict[int, int] = {}
        for r in src.rows:
            if v3:
                name, start, end = r.get("Kernel_Name"), _int(r.get("Start_Timestamp")), _int(r.get("End_Timestamp"))
                agent, stream = _int(r.get("Agent_Id")), _int(r.get("Queue_Id"))
                size = tuple(_int(r.get(f"Workgroup_Size_{k}")) for k in "XYZ")
                grid = tuple(workgroups(_int(r.get(f"Grid_Size_{k}")), s) for k, s in zip("XYZ", size))
                extra = {"correlation": _int(r.get("Correlation_Id")), "lds": _int(r.get("Group_Segment_Size")),
                         "scratch": _int(r.get("Private_Segment_Size")),
                         "registers": _int(r.get("Arch_VGPR_Count") or r.get("VGPR_Count")),
                         "accum_vgprs": _int(r.get("Accum_VGPR_Count")), "sgprs": _int(r.get("SGPR_Count"))}
            else:
                name, start, end = r.get("KernelName"), _int(r.get("BeginNs")), _int(r.get("EndNs"))
                agent, stream = _int(r.get("gpu-id")), _int(r.get("queue-id"))
                size = (_int(r.get("wgr")), 1, 1)
                grid = (workgroups(_int(r.get("grd")), size[0]), 1, 1)
                extra = {"lds": _int(r.get("lds")), "scratch": _int(r.get("scr")), "registers": _int(r.get("arch_vgpr")),
                         "accum_vgprs": _int(r.get("accum_vgpr")), "sgprs": _int(r.get("sgpr"))}
            if not name or start is None or end is None:
                rows.skipped += 1
                continue
            device = devices.setdefault(agent if agent is not None else -1, len(devices))
            rows.tables.kernels.append(kernel_row(name, start, end, device, stream, grid=grid, block=size, **extra))
        rows.tables.gpus.extend(gpu_row(index, None) for index in range(len(devices)))
        rows.write(sink)
        return SourceInfo(format="rocprof-csv", tool="rocprofv3 kernel trace (CSV)" if v3 else "rocprof v1 (CSV)")


class _CsvSource:
    def __init__(self, rows: list[dict[str, str]]):
        self.rows = rows

    def close(self) -> None:
        self.rows = []


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
        cursor = src.execute('SELECT * FROM KERN')
        columns = [c[0] for c in cursor.description]
        rows = [dict(zip(columns, values)) for values in cursor]
        RocprofCsvReader().read(_CsvSource([{k: "" if v is None else str(v).strip('"') for k, v in r.items()}
                                            for r in rows]), sink)
        return SourceInfo(format="rocprof-db", tool="rocprof v1 (results.db)")


class RpdReader(SqliteReader):
    """rocmProfileData's RPD: `rocpd_op` (GPU operations: KernelExecution, Copy*, FillBuffer),
    `rocpd_api` (host calls, linked to their operations by `rocpd_api_ops`), `rocpd_kernelapi`
    (a launch's grid and workgroup), `rocpd_string`."""

    name: ClassVar[str] = "rpd"

    def sniff(self, tables: set[str]) -> bool:
        return {"rocpd_op", "rocpd_string"} <= tables

    def estimate_rows(self, src: sqlite3.Connection) -> int:
        return int(src.execute("SELECT count(*) FROM rocpd_op").fetchone()[0])

    def read(self, src: sqlite3.Connection, sink: Sink) -> SourceInfo:
        tables = {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        strings = {i: v for i, v in src.execute("SELECT id, string FROM rocpd_string") if isinstance(v, str)}
        links = ({op: _int(api) for op, api in src.execute("SELECT op_id, api_id FROM rocpd_api_ops")}
                 if "rocpd_api_ops" in tables else {})
        sizes = (dict(src.execute("SELECT api_ptr_id, size FROM rocpd_copyapi"))
                 if "rocpd_copyapi" in tables else {})
        launches = ({r[0]: [_int(v) for v in r[1:]] for r in src.execute(
            "SELECT api_ptr_id, gridX, gridY, gridZ, workgroupX, workgroupY, workgroupZ, groupSegmentSize, "
            "privateSegmentSize FROM rocpd_kernelapi")} if "rocpd_kernelapi" in tables else {})
        rows, devices = _Rows(), {}
        for op_id, gpu, queue, start, end, description, kind in src.execute(
                "SELECT id, gpuId, queueId, start, \"end\", description_id, opType_id FROM rocpd_op ORDER BY start"):
            kind_name, start, end = strings.get(kind, ""), _int(start), _int(end)
            if start is None or end is None:
                rows.skipped += 1
                continue
            device = devices.setdefault(_int(gpu), len(devices))
            api = links.get(op_id)
            if kind_name == "KernelExecution":
                launch = launches.get(api) or [None] * 8
                rows.tables.kernels.append(kernel_row(
                    strings.get(description) or "kernel", start, end, device, _int(queue), correlation=api,
                    grid=launch[0:3], block=launch[3:6], lds=launch[6], scratch=launch[7]))  # type: ignore[arg-type]
            elif kind_name.startswith("Copy") or kind_name == "FillBuffer":
                memset = kind_name == "FillBuffer"
                copy = {"CopyHostToDevice": "Host-to-Device", "CopyDeviceToHost": "Device-to-Host",
                        "CopyDeviceToDevice": "Device-to-Device"}.get(kind_name, "Other")
                rows.tables.memops.append({"start_ns": start, "end_ns": end, "dur_ns": end - start,
                                           "op": "memset" if memset else "memcpy",
                                           "copy_kind": None if memset else copy,
                                           "bytes": None if memset else _int(sizes.get(api)),
                                           "device_id": device, "stream_id": _int(queue), "correlation_id": api,
                                           "pid": PID})
        if "rocpd_api" in tables:
            for api_id, tid, start, end, name, args in src.execute(
                    "SELECT id, tid, start, \"end\", apiName_id, args_id FROM rocpd_api"):
                name, start, end = strings.get(name) or "call", _int(start), _int(end)
                if start is None or end is None:
                    continue
                if name == "UserMarker":  # a roctx range (its message the args) or mark (end = start)
                    mark = end <= start
                    rows.tables.ranges.append((start, None if mark else end, strings.get(args) or "roctx",
                                               "mark" if mark else "pushpop", "roctx", PID, _int(tid)))
                else:
                    rows.tables.calls.append((start, end, name, _int(tid) or 0, _int(api_id)))
        rows.tables.gpus.extend(gpu_row(index, None) for index in range(len(devices)))
        rows.write(sink)
        version = dict(src.execute("SELECT tag, value FROM rocpd_metadata")).get("schema_version") \
            if "rocpd_metadata" in tables else None
        version = str(version) if isinstance(version, (str, int)) else None
        return SourceInfo(format="rpd", tool="rocmProfileData (RPD)", schema_version=version)
