"""The store rows of an XPlane profile (ingest/xplane.py decodes the file): kernels with their
configurations from `kernel_details`, copies from `memcpy_details`, API calls, ranges (host
TraceMe events, and the XLA op and module ranges derived from the kernels' `hlo_op`,
`hlo_module` and `program_id`), memory events and GPUs."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pyarrow as pa

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
)

if TYPE_CHECKING:
    from traceq.ingest.xplane import Event, _Tables

PID = 0
_DETAIL = re.compile(r"(\w+):([^\s]+)")
_COPY_KINDS = {"htod": "Host-to-Device", "h2d": "Host-to-Device", "dtoh": "Device-to-Host",
               "d2h": "Device-to-Host", "dtod": "Device-to-Device", "d2d": "Device-to-Device",
               "ptop": "Peer-to-Peer", "p2p": "Peer-to-Peer"}
_XLA_OPS, _XLA_MODULES = "XLA Ops", "XLA Modules"


def _details(text: Any) -> dict[str, str]:
    """'grid:16,32,1 block:256,1,1 group_mem:33792' -> {'grid': '16,32,1', ...}."""
    return dict(_DETAIL.findall(text)) if isinstance(text, str) else {}


def _number(text: str | None) -> int | None:
    try:
        return int(float(text)) if text is not None else None
    except ValueError:
        return None


def _dims(text: str | None) -> list[int | None]:
    parts = (text or "").split(",")
    return [_number(p) for p in parts[:3]] + [None] * (3 - len(parts[:3])) if text else [None, None, None]


def kernel_row(event: Event, device: int, stream: int) -> dict[str, Any]:
    """A kernel: its times, correlation id, launch configuration (NVIDIA's `regs`,
    `static_shared`, `dynamic_shared`; AMD's `group_mem` (LDS per workgroup, stored as static
    shared memory) and `private_mem` (scratch per work-item)) and XLA's names for it."""
    d = _details(event.stats.get("kernel_details"))
    grid, block = _dims(d.get("grid")), _dims(d.get("block"))
    static = _number(d.get("static_shared")) if "static_shared" in d else _number(d.get("group_mem"))
    return {
        "start_ns": event.start_ns, "end_ns": event.end_ns, "name": event.name,
        "correlation_id": _int(event.stats.get("correlation_id")), "graph_node_id": None,
        "device_id": device, "context_id": None, "stream_id": stream, "pid": PID,
        "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2],
        "block_x": block[0], "block_y": block[1], "block_z": block[2],
        "registers_per_thread": _number(d.get("regs")), "smem_static_bytes": static,
        "smem_dynamic_bytes": _number(d.get("dynamic_shared")), "smem_carveout_bytes": None, "smem_optin": None,
        "local_memory_per_thread_bytes": _number(d.get("private_mem")), "local_memory_total_bytes": None,
        "launch_type": None,
        "hlo_op": _text(event.stats.get("hlo_op")), "hlo_module": _text(event.stats.get("hlo_module")),
        "program_id": _int(event.stats.get("program_id")),
    }


def memop_row(event: Event, device: int, stream: int) -> dict[str, Any]:
    d = _details(event.stats.get("memcpy_details"))
    memset = event.name.lower().startswith("memset")
    kind = (d.get("kind") or "").lower()
    if kind not in _COPY_KINDS:  # 'Unknown' on ROCm: the event's name says ('CopyDeviceToDevice', 'MemcpyH2D')
        words = re.sub(r"(?i)^(memcpy|copy)", "", event.name).lower()
        kind = {"hosttodevice": "htod", "devicetohost": "dtoh", "devicetodevice": "dtod",
                "peertopeer": "ptop"}.get(words, words)
    return {"start_ns": event.start_ns, "end_ns": event.end_ns, "dur_ns": event.end_ns - event.start_ns,
            "op": "memset" if memset else "memcpy",
            "copy_kind": None if memset else _COPY_KINDS.get(kind, "Other"),
            "bytes": _number(d.get("size")), "device_id": device, "stream_id": stream,
            "correlation_id": _int(event.stats.get("correlation_id")), "pid": PID}


def memory_row(event: Event, tid: int) -> dict[str, Any]:
    allocator = str(event.stats.get("allocator_name") or "")
    gpu = re.match(r"GPU_(\d+)_", allocator)
    return {"ts_ns": event.start_ns, "op": "alloc" if event.name == "MemoryAllocation" else "free",
            "bytes": _int(event.stats.get("allocation_bytes")), "address": _int(event.stats.get("addr")),
            "mem_kind": "Device" if gpu else "Pinned", "device_id": int(gpu.group(1)) if gpu else None,
            "pid": PID, "tid": tid}


_KNOWN_GPUS = {  # (vendor, cc/gfx major, minor, cores, clock kHz or None) -> the product's name
    ("AMD", 9, 4, 304, None): "AMD Instinct MI300X",
    ("AMD", 9, 5, 256, 2400000): "AMD Instinct MI355X",
    ("AMD", 9, 5, 256, 2200000): "AMD Instinct MI350X",
    ("NVIDIA", 9, 0, 132, None): "NVIDIA H100",
    ("NVIDIA", 8, 0, 108, None): "NVIDIA A100",
}


def gpu_row(device: int, stats: dict[str, Any]) -> dict[str, Any]:
    """The GPU of a device plane from its stats (clock_rate in kHz, memory in bytes, bandwidth in
    bytes/s); named where its vendor, version and cores name one product."""
    vendor = "AMD" if str(stats.get("device_vendor", "")).upper().startswith("AMD") else "NVIDIA"
    major, minor, cores = (_int(stats.get(k)) for k in ("compute_cap_major", "compute_cap_minor", "core_count"))
    clock = _int(stats.get("clock_rate"))
    memory = _int(stats.get("memory_size"))
    name = _KNOWN_GPUS.get((vendor, major, minor, cores, clock)) or _KNOWN_GPUS.get((vendor, major, minor, cores, None))
    if name == "NVIDIA H100" and memory and memory > 100 << 30:
        name = "NVIDIA H200"
    if name is None:
        version = f"gfx{major}{minor}" if vendor == "AMD" else f"compute capability {major}.{minor}"
        name = f"{vendor} GPU ({version}, {cores} {'CUs' if vendor == 'AMD' else 'SMs'})"
    nvidia = vendor == "NVIDIA"
    return {"device_id": device, "name": name, "vendor": vendor,
            "cc_major": major if nvidia else None, "cc_minor": minor if nvidia else None,
            "sm_count": cores, "clock_hz": clock * 1000 if clock else None, "memory_bytes": memory,
            "memory_bandwidth_bytes_per_s": _int(stats.get("memory_bandwidth")),
            "threads_per_warp": 32 if nvidia else 64}


def xla_ranges(kernels: list[dict[str, Any]], calls: list[tuple[int, int, str, int, int | None]],
               op_names: dict[tuple[str, str], str]) -> list[tuple[int, int | None, str, str, str, int | None, int | None]]:
    """XLA's op and module ranges, made from the kernels' `hlo_op`, `hlo_module` and
    `program_id` as XLA names them under nsys, so that attribution reads both alike
    (`analysis.structure.xla`): a `Thunk:#name=STACK,hlo_op=OP#` range around each launching
    call whose kernels ran one op (STACK: the op's name stack from the embedded HLO,
    `op_names`; left out where unknown), and a `XlaModule:#hlo_module=M,program_id=P#` range
    around each execution of a module (its calls in time order on their thread; a new
    execution starts where its first op comes again; it ends 1 ns past its last call), both
    push/pop ranges of the calling thread. Kernels without a launching call get the two as start/end ranges over their own
    times on the device's timeline, as xprof draws them."""
    call_of = {c[4]: c for c in calls if c[4] is not None}
    launched: dict[int, list[dict[str, Any]]] = {}
    loose: list[dict[str, Any]] = []
    for k in kernels:
        if k["correlation_id"] in call_of:
            launched.setdefault(k["correlation_id"], []).append(k)
        else:
            loose.append(k)
    out: list[tuple[int, int | None, str, str, str, int | None, int | None]] = []
    by_thread: dict[int, list[tuple[int, int, str | None, tuple[str, int | None] | None]]] = {}
    for correlation, ks in launched.items():
        start, end, _, tid, _ = call_of[correlation]
        ops = {k["hlo_op"] for k in ks if k["hlo_op"]}
        op = ops.pop() if len(ops) == 1 else None
        module = ks[0]["hlo_module"]
        if op is not None:
            out.append((start, end, _thunk_name(op, op_names.get((module or "", op))), "pushpop", _XLA_OPS, PID, tid))
        if module:
            by_thread.setdefault(tid, []).append((start, end, op, (module, ks[0]["program_id"])))
    # an execution's range ends a nanosecond past its last call, so that it holds the op range of a
    # one-call execution (a command buffer's graph launch) rather than tie with it
    out[:0] = [(run["start"], run["end"] + 1, name, "pushpop", _XLA_MODULES, PID, tid) for tid, rows in by_thread.items()
               for name, run in _executions(sorted(rows, key=lambda r: (r[0], r[1])))]
    by_device: dict[int, list[dict[str, Any]]] = {}
    for k in loose:
        by_device.setdefault(k["device_id"], []).append(k)
    for rows in by_device.values():
        rows.sort(key=lambda k: (k["start_ns"], k["end_ns"]))
        out.extend((k["start_ns"], k["end_ns"], _thunk_name(k["hlo_op"], op_names.get((k["hlo_module"] or "", k["hlo_op"]))),
                    "startend", _XLA_OPS, None, None) for k in rows if k["hlo_op"])
        out.extend((run["start"], run["end"], name, "startend", _XLA_MODULES, None, None) for name, run in _executions(
            [(k["start_ns"], k["end_ns"], k["hlo_op"], (k["hlo_module"], k["program_id"])) for k in rows
             if k["hlo_module"]]))
    return out


def _thunk_name(op: str, stack: str | None) -> str:
    return f"Thunk:#name={stack},hlo_op={op}#" if stack else f"Thunk:#hlo_op={op}#"


def _executions(rows: list[tuple[int, int, str | None, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(name, {start, end}) of each execution of a module in `rows` (start, end, op, (module,
    program)), in time order: a new one where the module changes or its first op comes again."""
    runs: list[tuple[str, dict[str, Any]]] = []
    run: dict[str, Any] | None = None
    for start, end, op, module in rows:
        if run is not None and (run["module"] != module or op == run["first_op"]):
            runs.append((_module_name(run["module"]), run))
            run = None
        if run is None:
            run = {"module": module, "first_op": op, "start": start, "end": end}
        run["end"] = max(run["end"], end)
    if run is not None:
        runs.append((_module_name(run["module"]), run))
    return runs


def _module_name(module: tuple[str, int | None]) -> str:
    name, program = module
    return f"XlaModule:#hlo_module={name}" + (f",program_id={program}" if program is not None else "") + "#"


def write_tables(tables: _Tables, sink: Sink) -> None:
    """Every table of the profile into the sink, in the order the store's loads do."""
    if tables.gpus:
        columns = list(tables.gpus[0])
        types = {"name": pa.string(), "vendor": pa.string(), "arch": pa.string()}
        sink.append("gpus", pa.table({c: pa.array([g[c] for g in tables.gpus], types.get(c, pa.int64()))
                                      for c in columns}), source_rows=0)
    _write_calls(tables, sink)
    _write_kernels(tables, sink)
    if tables.memops:
        columns = list(tables.memops[0])
        types = {"op": pa.string(), "copy_kind": pa.string()}
        sink.append("memops", pa.table({c: pa.array([m[c] for m in tables.memops], types.get(c, pa.int64()))
                                        for c in columns}), source_rows=0)
    _write_ranges(tables.ranges + xla_ranges(tables.kernels, tables.calls, tables.op_names), sink)
    if tables.memory:
        columns = list(tables.memory[0])
        types = {"op": pa.string(), "mem_kind": pa.string(), "address": pa.uint64()}
        sink.append("memory_events", pa.table({
            c: pa.array([m[c] if c != "address" or (m[c] or 0) >= 0 else None for m in tables.memory],
                        types.get(c, pa.int64())) for c in columns}), source_rows=0)


def _write_kernels(tables: _Tables, sink: Sink) -> None:
    rows = sorted(tables.kernels, key=lambda k: (k["start_ns"], k["device_id"], k["stream_id"]))
    if not rows:
        return
    names, configs, queues = Names(), Names(), Names()
    config_columns = AMD_CONFIG_COLUMNS if "sgprs" in rows[0] else KERNEL_CONFIG_COLUMNS  # AMD's readers' rows
    batch = pa.table({c: pa.array([k[c] for k in rows], pa.int64())
                      for c in ("start_ns", "end_ns", "correlation_id", "graph_node_id",
                                *config_columns, *KERNEL_QUEUE_COLUMNS) if c != "launch_type"})
    batch = batch.append_column("launch_type", pa.nulls(len(rows), pa.int64()))
    name_ids = names.number(pa.array([k["name"] for k in rows], pa.string()))
    sink.append("kernel_events", numbered(kernel_batch(
        batch, name_id=name_ids, config_id=configs.number(*[batch[c] for c in config_columns]),
        queue_id=queues.number(*[batch[c] for c in KERNEL_QUEUE_COLUMNS])), 0), source_rows=0)
    sink.append("kernel_configs", kernel_configs(configs.keys, optin_code=1, launch_types={}, names=config_columns),
                source_rows=0)
    sink.append("kernel_queues", kernel_queues(queues.keys), source_rows=0)
    demangled = [key[0] for key in names.keys]
    sink.append("kernel_names", kernel_names(demangled, [_short(n) for n in demangled], [None] * len(demangled)),
                source_rows=0)


def _short(name: str) -> str:
    """A kernel's base name: AMD code objects end in '.kd'; templates and arguments cut."""
    base = re.sub(r"\.kd$", "", name)
    return re.split(r"[<(]", base, maxsplit=1)[0].rsplit("::", 1)[-1] or base


def _write_calls(tables: _Tables, sink: Sink) -> None:
    if not tables.calls:
        return
    functions, threads = Names(), Names()
    name_ids = functions.number(pa.array([c[2] for c in tables.calls], pa.string()))
    thread_ids = threads.number(pa.array([c[3] for c in tables.calls], pa.int64()))
    sink.append("api_events", pa.table({
        "start_ns": pa.array([c[0] for c in tables.calls], pa.int64()),
        "end_ns": pa.array([c[1] for c in tables.calls], pa.int64()),
        "name_id": name_ids, "thread_id": thread_ids,
        "correlation_id": pa.array([c[4] for c in tables.calls], pa.int64())}), source_rows=0)
    labels = [key[0] for key in functions.keys]
    sink.append("api_names", api_names([_api(n) for n in labels], labels), source_rows=0)
    tids = [key[0] for key in threads.keys]
    sink.append("api_threads", api_threads([PID] * len(tids), tids, [None] * len(tids)), source_rows=0)


def _api(name: str) -> str:
    """'runtime' for cuda*/hip* calls, else 'driver': every host event with a correlation id is
    the tracer's record of a call into the GPU's driver, named by the call (`cuGraphLaunch`,
    `hsa_...`) or, for a launch, by the kernel it launched (`gemm_fusion_dot_2`, as XLA's
    profiler names them), or by the copy (`MemcpyD2H`)."""
    return "runtime" if name.startswith(("cuda", "hip")) else "driver"


def _write_ranges(ranges: list[tuple[int, int | None, str, str, str, int | None, int | None]], sink: Sink) -> None:
    if not ranges:
        return
    attributes = Names()
    kind = pa.array([r[3] for r in ranges], pa.string())
    domain = pa.array([r[4] for r in ranges], pa.string())
    pid = pa.array([r[5] for r in ranges], pa.int64())
    tid = pa.array([r[6] for r in ranges], pa.int64())
    nulls = pa.nulls(len(ranges), pa.int64())
    ids = attributes.number(kind, domain, nulls, nulls, pid, tid, nulls, tid)
    sink.append("nvtx_events", pa.table({
        "start_ns": pa.array([r[0] for r in ranges], pa.int64()),
        "end_ns": pa.array([r[1] for r in ranges], pa.int64()),
        "name": pa.array([r[2] for r in ranges], pa.string()), "attributes_id": ids}), source_rows=0)
    sink.append("nvtx_attributes", nvtx_attributes(attributes.keys), source_rows=0)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
