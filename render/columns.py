"""The one vocabulary of traceq's output: what each frame column is called in a table, its unit,
how its values read, and how much a narrow table needs it.

Frames name their columns in snake_case with the unit in the name (`total_ns`, `alloc_bytes`,
`idle_pct`; `ru`, `occupancy`, `ce` are fractions); csv and json keep those names and raw
values (ns, bytes, fractions). A table shows `COLUMNS[name].header` and the value in readable
units (`format_cell`). A column not listed here still reads well: its kind and header follow
from its suffix and type (`column_spec`). Add a new column here when its header, its kind or its
priority should be something else.

Priority (1 to 5) says which columns a narrow table leaves out first: 5 goes first, 1 last.
A key column (one that says what a row is: a name, a layer, an iteration, a rank) is never left
out, nor is a column without which two rows would look the same: their text is cut instead
(render/table.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from traceq.units import format_bytes, format_count, format_duration

KINDS = ("duration", "bytes", "count", "fraction", "percent", "number", "integer", "id",
         "name", "list", "label")
"""duration: ns, shown in ns/µs/ms/s; bytes: B/KiB/MiB/GiB; count: large counts with SI prefixes
(FLOP); fraction: 0..1, shown as % (the header says %); percent: already %; number: a float;
integer: thousands separated; id: an integer as is; name: text cut in the middle when narrow;
list: 'a, b, c' cut between items ('a, b +1'); label: short text never cut."""

NUMERIC_KINDS = frozenset({"duration", "bytes", "count", "fraction", "percent", "number", "integer", "id"})


@dataclass(frozen=True)
class Column:
    header: str
    kind: str
    priority: int = 3
    key: bool = False
    """The column says what a row is (a kernel's name, a layer, an iteration, a rank): a table never
    leaves it out, it cuts its text instead (a command may name its own keys: render/table.py)."""


COLUMNS: dict[str, Column] = {
    # identity: what a row is
    "rank": Column("Rank", "id", 1, key=True),
    "position": Column("#", "id", 1, key=True),
    "run": Column("Run", "name", 2),
    "structure": Column("Structure", "label", 3),
    "trace_id": Column("ID", "id", 1, key=True),
    "name": Column("Name", "name", 1, key=True),
    "short_name": Column("Name", "name", 1, key=True),
    "layer": Column("Layer", "list", 2, key=True),
    "pass": Column("Pass", "label", 2, key=True),
    "library": Column("Library", "label", 2, key=True),
    "iteration": Column("Iteration", "label", 1, key=True),
    "stage": Column("Stage", "label", 1, key=True),
    "device_id": Column("Device", "id", 2, key=True),
    "stream_id": Column("Stream", "id", 4, key=True),
    "kernel_id": Column("Kernel #", "id", 5),
    "event_id": Column("Event #", "id", 1, key=True),
    "where": Column("Where", "label", 1),
    "op": Column("Op", "label", 2, key=True),
    # times (ns)
    "total_ns": Column("Total", "duration", 2),
    "pct": Column("Time %", "percent", 2),
    "avg_ns": Column("Avg", "duration", 3),
    "median_ns": Column("Median", "duration", 3),
    "min_ns": Column("Min", "duration", 5),
    "max_ns": Column("Max", "duration", 5),
    "stddev_ns": Column("StdDev", "duration", 5),
    "dur_ns": Column("Duration", "duration", 2),
    "start_ns": Column("Start", "duration", 4),
    "ts_ns": Column("Time", "duration", 1),
    "span_ns": Column("Span", "duration", 3),
    "busy_ns": Column("Busy", "duration", 3),
    "idle_ns": Column("Idle", "duration", 2),
    "idle_pct": Column("Idle %", "percent", 2),
    "data_copy_ns": Column("Data copy", "duration", 2),
    "forward_ns": Column("Forward", "duration", 2),
    "backward_ns": Column("Backward", "duration", 2),
    "weight_update_ns": Column("Weight update", "duration", 2),
    "other_ns": Column("Other", "duration", 3),
    "no_flops_ns": Column("Time without FLOPs", "duration", 3),
    "diff_ns": Column("B - A", "duration", 2),
    "ratio": Column("B / A", "number", 2),
    # counts
    "instances": Column("Instances", "integer", 3),
    "kernels": Column("Kernels", "integer", 3),
    "kernel_count": Column("Kernels", "integer", 2),
    "allocs": Column("Allocs", "integer", 3),
    "frees": Column("Frees", "integer", 3),
    # kernel launch shape and occupancy
    "grid_blocks": Column("Grid", "integer", 4),
    "block_threads": Column("Block", "integer", 4),
    "registers_per_thread": Column("Regs", "integer", 4),
    "smem_bytes": Column("Smem", "bytes", 4),
    "limiter": Column("Limiter", "label", 2),
    "blocks_per_sm": Column("Blocks/SM", "integer", 4),
    "limit_warps": Column("Blocks/SM by warps", "integer", 4),
    "limit_registers": Column("Blocks/SM by registers", "integer", 4),
    "limit_shared_mem": Column("Blocks/SM by shared memory", "integer", 4),
    "limit_blocks": Column("Blocks/SM by block limit", "integer", 4),
    "limit_barriers": Column("Blocks/SM by barriers", "integer", 4),
    "occupancy": Column("Occupancy %", "fraction", 3),
    "waves": Column("Waves", "number", 4),
    "ru": Column("RU %", "fraction", 2),
    "paper_ru": Column("Paper RU %", "fraction", 4),
    "kineto_occupancy": Column("Kineto occupancy %", "fraction", 5),
    # compute efficiency
    "flops": Column("FLOP", "count", 3),
    "tflops": Column("TFLOP/s", "number", 2),
    "precision": Column("Precision", "list", 2),
    "peak_tflops": Column("Peak TFLOP/s", "number", 3),
    "ce": Column("CE %", "fraction", 2),
    "tensor_core_pct": Column("Tensor core %", "percent", 3),
    # measured by nsys GPU metrics (analysis.efficiency.measured)
    "sm_active_pct": Column("SM active %", "percent", 3),
    "sm_issue_pct": Column("SM issue %", "percent", 4),
    "tensor_active_pct": Column("Tensor active %", "percent", 3),
    "dram_gbps": Column("DRAM GB/s", "number", 4),
    "dram_pct": Column("DRAM %", "percent", 4),
    "sampled_pct": Column("Sampled %", "percent", 4),
    # roofline (traceq roofline)
    "intensity": Column("FLOP/B", "number", 2),
    "tbps": Column("TB/s", "number", 2),
    "bound_tflops": Column("Roof TFLOP/s", "number", 3),
    "roof": Column("Roof", "label", 2),
    # model and hardware FLOPs utilization (traceq mfu)
    "model_flops": Column("Model FLOP", "count", 2),
    "counted_flops": Column("Counted FLOP", "count", 3),
    "peak_flops": Column("Peak FLOP/s", "count", 4),
    "mfu_pct": Column("MFU %", "percent", 1),
    "hfu_pct": Column("HFU %", "percent", 2),
    # memory traffic model (traceq traffic)
    "launches": Column("Launches", "integer", 2),
    "direction": Column("Direction", "label", 2, key=True),
    "m": Column("M", "integer", 3),
    "n": Column("N", "integer", 3),
    "k": Column("K", "integer", 3),
    "tile": Column("Tile", "label", 3),
    "math": Column("Math", "label", 3),
    "ctas": Column("CTAs", "integer", 5),
    "l1_bytes": Column("L1", "bytes", 4),
    "shared_bytes": Column("Shared", "bytes", 4),
    "l2_bytes": Column("L2", "bytes", 3),
    "dram_bytes": Column("DRAM", "bytes", 3),
    "bound": Column("Bound", "label", 2),
    "predicted_ns": Column("Predicted", "duration", 2),
    "here_ns": Column("Predicted here", "duration", 4),
    "measured_ns": Column("Measured", "duration", 2),
    "expected_ns": Column("Expected there", "duration", 2),
    "achieved_pct": Column("Of bound %", "percent", 2),
    "note": Column("Note", "name", 5),
    # why the GPU waited (traceq idle, launches, advise)
    "cause": Column("Cause", "label", 1, key=True),
    "gaps": Column("Gaps", "integer", 2),
    "span_pct": Column("Span %", "percent", 3),
    "per_iteration_ns": Column("Per iteration", "duration", 2),
    "longest_ns": Column("Longest", "duration", 4),
    "call_shares": Column("Calls", "list", 3),
    "work_shares": Column("Waiting work", "list", 4),
    "sync_ns": Column("Sync", "duration", 2),
    "h2d_pageable_ns": Column("H2D pageable", "duration", 2),
    "h2d_pinned_ns": Column("H2D pinned", "duration", 3),
    "iteration_start_ns": Column("Iteration start", "duration", 2),
    "launch_bound_ns": Column("Launch-bound", "duration", 2),
    "compile_ns": Column("Compile", "duration", 3),
    "api_ns": Column("API time", "duration", 2),
    "api_avg_ns": Column("API avg", "duration", 3),
    "api_median_ns": Column("API median", "duration", 4),
    "api_min_ns": Column("API min", "duration", 5),
    "api_max_ns": Column("API max", "duration", 5),
    "api_stddev_ns": Column("API StdDev", "duration", 5),
    "queue_avg_ns": Column("Queue avg", "duration", 3),
    "queue_median_ns": Column("Queue median", "duration", 4),
    "queue_min_ns": Column("Queue min", "duration", 5),
    "queue_max_ns": Column("Queue max", "duration", 5),
    "queue_stddev_ns": Column("Queue StdDev", "duration", 5),
    "kernel_ns": Column("Kernel time", "duration", 2),
    "kernel_avg_ns": Column("Kernel avg", "duration", 2),
    "kernel_median_ns": Column("Kernel median", "duration", 4),
    "kernel_min_ns": Column("Kernel min", "duration", 5),
    "kernel_max_ns": Column("Kernel max", "duration", 5),
    "kernel_stddev_ns": Column("Kernel StdDev", "duration", 5),
    "total_avg_ns": Column("Total avg", "duration", 2),
    "total_median_ns": Column("Total median", "duration", 4),
    "total_min_ns": Column("Total min", "duration", 5),
    "total_max_ns": Column("Total max", "duration", 5),
    "total_stddev_ns": Column("Total StdDev", "duration", 5),
    "tiny": Column("Tiny", "integer", 2),
    "tiny_pct": Column("Tiny %", "percent", 2),
    "queued": Column("Queued", "integer", 3),
    "pid": Column("PID", "id", 2, key=True),
    "tid": Column("TID", "id", 2, key=True),
    "api_name": Column("API", "label", 2, key=True),
    "kernel_name": Column("Kernel", "name", 1, key=True),
    "title": Column("Finding", "name", 1, key=True),
    "time_ns": Column("At stake", "duration", 1),
    "evidence": Column("Evidence", "name", 4),
    "fix": Column("Fix", "name", 4),
    "rule": Column("Rule", "label", 3),
    "category": Column("Category", "name", 1, key=True),
    # the critical path and what-if (traceq critical, whatif)
    "iteration_ns": Column("Iteration time", "duration", 1),
    "begin_ns": Column("Begin", "duration", 4),
    "end_ns": Column("End", "duration", 4),
    "communication_ns": Column("Communication", "duration", 2),
    "copy_ns": Column("Copy", "duration", 3),
    "host_ns": Column("Host", "duration", 3),
    "launch_ns": Column("Launch", "duration", 3),
    "sync_wait_ns": Column("Sync wait", "duration", 3),
    "replayed_ns": Column("Replayed", "duration", 3),
    "gain_ns": Column("Gain", "duration", 2),
    "gain_pct": Column("Gain %", "percent", 2),
    "edge": Column("Edge", "label", 4),
    "kind": Column("Kind", "label", 4),
    # nsys stats reports (traceq stats)
    "calls": Column("Calls", "integer", 2),
    "count": Column("Count", "integer", 2),
    "operation": Column("Operation", "label", 1, key=True),
    "total_bytes": Column("Total", "bytes", 2),
    "avg_bytes": Column("Avg", "bytes", 3),
    "median_bytes": Column("Median", "bytes", 3),
    "min_bytes": Column("Min", "bytes", 5),
    "max_bytes": Column("Max", "bytes", 5),
    "stddev_bytes": Column("StdDev", "bytes", 5),
    "style": Column("Style", "label", 3),
    "range": Column("Range", "name", 1, key=True),
    "total_proj_ns": Column("Projected", "duration", 2),
    "total_range_ns": Column("Range time", "duration", 2),
    "proj_avg_ns": Column("Proj avg", "duration", 3),
    "proj_median_ns": Column("Proj median", "duration", 3),
    "proj_min_ns": Column("Proj min", "duration", 5),
    "proj_max_ns": Column("Proj max", "duration", 5),
    "proj_stddev_ns": Column("Proj StdDev", "duration", 5),
    "gpu_ops": Column("GPU ops", "integer", 3),
    "avg_gpu_ops": Column("Avg GPU ops", "number", 4),
    "avg_level": Column("Avg level", "number", 4),
    "avg_children": Column("Avg children", "number", 4),
    # what a row holds
    "heaviest": Column("Heaviest kernel", "name", 4),
    "libraries": Column("Libraries", "list", 4),
    "operations": Column("Operations", "list", 4),
    "implementations": Column("Implementations", "list", 4),
    "attribution": Column("Attribution", "list", 3),
    # memory
    "alloc_bytes": Column("Allocated", "bytes", 2),
    "freed_bytes": Column("Freed", "bytes", 3),
    "net_bytes": Column("Net", "bytes", 2),
    "bytes": Column("Bytes", "bytes", 2),
    "bytes_in_use": Column("In use", "bytes", 2),
    "share_of_device_pct": Column("Device %", "percent", 2),
    "mem_kind": Column("Memory kind", "label", 3),
    "before_capture": Column("Before capture", "label", 4),
    # multi-GPU runs (traceq comm, overlap, ranks; compare across GPU counts)
    "collective": Column("Collective", "label", 1, key=True),
    "group": Column("Group", "label", 4, key=True),
    "instance": Column("#", "id", 1, key=True),
    "calls": Column("Calls", "integer", 3),
    "algbw_gbps": Column("Algbw GB/s", "number", 3),
    "busbw_gbps": Column("Busbw GB/s", "number", 2),
    "late_ns": Column("Late", "duration", 2),
    "start_skew_ns": Column("Start skew", "duration", 2),
    "end_skew_ns": Column("End skew", "duration", 3),
    "ranks_seen": Column("Ranks", "integer", 4),
    "last_rank": Column("Last rank", "id", 2),
    "time_ns": Column("Time", "duration", 2),
    "compute_ns": Column("Compute", "duration", 2),
    "comm_ns": Column("Comm", "duration", 2),
    "overlap_ns": Column("Overlap", "duration", 3),
    "hidden_pct": Column("Hidden %", "percent", 2),
    "exposed_ns": Column("Exposed", "duration", 2),
    "wait_ns": Column("Wait", "duration", 2),
    "work_ns": Column("Work", "duration", 2),
    "slowest": Column("Slowest", "label", 2),
    "last_starts": Column("Last to start", "integer", 3),
    "held_ns": Column("Waited for", "duration", 3),
    "shift_ns": Column("Clock shift", "duration", 4),
    "drift_ppm": Column("Drift ppm", "number", 5),
    "delayed_by": Column("Delayed by", "name", 2),
    "delayed_ns": Column("Delay", "duration", 2),
    "window_ns": Column("Window", "duration", 4),
    "scaling_pct": Column("Scaling %", "percent", 2),
    # traces
    "format": Column("Format", "label", 3),
    "tool": Column("Tool", "name", 4),
    "source_schema_version": Column("Schema", "label", 5),
    "gpus": Column("GPUs", "label", 2),
    "loaded_at": Column("Loaded", "label", 5),
    "load_seconds": Column("Load s", "number", 5),
    "source_path": Column("Source", "name", 5),
    "sha256": Column("SHA-256", "name", 5),
}

SIDES = {"a_": "A", "b_": "B"}
"""`traceq compare` gives each run's value of a column as a_<column> and b_<column>."""

_SIDE_BASES = {"ns": "total_ns"}
"""a_ns is a run's GPU time (a total)."""

VALUE_LABELS = {"data_copy": "data copy", "weight_update": "weight update"}
"""Stage names as every table and figure writes them (csv and json keep the snake_case key)."""


def column_spec(column: str, numeric: bool = False) -> Column:
    """The vocabulary entry of `column`; a column not in COLUMNS gets one from its suffix and
    type (`numeric`: the frame's dtype is a number)."""
    if column in COLUMNS:
        return COLUMNS[column]
    side = SIDES.get(column[:2])
    if side is not None:
        base = column_spec(_SIDE_BASES.get(column[2:], column[2:]), numeric)
        word = "time" if column[2:] == "ns" else base.header
        word = word if word[:2].isupper() else word[0].lower() + word[1:]  # 'A kernels', 'A RU %'
        return Column(f"{side} {word}", base.kind, base.priority)
    stem = column.removesuffix("_ns").removesuffix("_bytes").removesuffix("_pct").removesuffix("_flops")
    header = stem.replace("_", " ").capitalize()
    if column.endswith("_ns"):
        return Column(header, "duration")
    if column.endswith("_bytes"):
        return Column(header, "bytes")
    if column.endswith("_pct"):
        return Column(f"{header} %", "percent")
    if column.endswith("_flops"):
        return Column(f"{header} FLOP", "count")
    if column.endswith("_id"):
        return Column(header, "id")
    return Column(header, "number" if numeric else "name")


def header(column: str) -> str:
    """What a table calls `column`."""
    return column_spec(column).header


def format_value(kind: str, value: object) -> str:
    """`value` as a table shows a column of `kind`."""
    if value is None:
        return ""
    if kind == "duration":
        return format_duration(value)  # type: ignore[arg-type]
    if kind == "bytes":
        return format_bytes(value)  # type: ignore[arg-type]
    if kind == "count":
        return format_count(value)  # type: ignore[arg-type]
    if kind == "fraction":
        return f"{100 * float(value):.1f}"  # type: ignore[arg-type]
    if kind == "percent":
        return f"{float(value):.1f}"  # type: ignore[arg-type]
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return str(value) if kind == "id" else f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return VALUE_LABELS.get(str(value), str(value))


def format_cell(column: str, value: object) -> str:
    """`value` of `column` as a table shows it."""
    return format_value(column_spec(column).kind, value)
