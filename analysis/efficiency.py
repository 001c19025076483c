"""Resource utilization (the method's equations 9 to 11) and compute efficiency (equation 8)
of every kernel launch in a trace, and their kernel-time-weighted means per kernel name, layer
and library: the `traceq ru` and `traceq ce` analyses.

RU needs only the launch records: occupancy is computed once per distinct launch shape
(block size, registers, shared memory, carveout, device) with `occupancy.launch_occupancy`, the
calculator that agrees with Nsight Compute, then joined back to the launches. The GPU's limits
come from the trace's own device record (`gpus`), over the compute-capability table.

CE needs FLOPs, which a trace has only when PyTorch recorded the op shapes
(`emit_nvtx(record_shapes=True)`) or the user describes the model in a spec file
(`analysis.modelspec`, `analysis.flops`). Each kernel is measured against the peak of the
precision it ran at (`analysis.peaks`): TF32 tensor cores against the TF32 peak, FP32 FMAs
against the paper's 2 x clock x FP32 lanes, fp16 against the fp16 peak, so CE never exceeds 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import duckdb
import polars as pl

from traceq.analysis.attribution import ITERATION_REGEX, SUFFIX_REGEX
from traceq.analysis.choices import PRECISIONS, GroupBy
from traceq.analysis.gpu_specs import GpuLimits, limits_for_cc
from traceq.analysis.layers import attributed_kernels, launch_groups
from traceq.analysis.occupancy import launch_occupancy
from traceq.analysis.peaks import DTYPES, dtype_precision
from traceq.errors import MissingDataError


_SHAPE = ["device_id", "block_threads", "registers_per_thread", "smem_static_bytes",
          "smem_dynamic_bytes", "smem_carveout_bytes"]


def device_limits(con: duckdb.DuckDBPyConnection, trace_id: int, cc: str | None = None,
                  sms: int | None = None) -> dict[int, tuple[GpuLimits, int]]:
    """Per device id of the trace: its GpuLimits (the CC table overridden by the trace's own
    device record) and SM count. `cc` ('9.0') and `sms` stand in for what the trace lacks and
    override it. Raises MissingDataError when neither the trace nor the caller gives them."""
    rows = con.execute(
        "SELECT device_id, cc_major, cc_minor, sm_count, max_warps_per_sm, threads_per_warp, "
        "max_blocks_per_sm, max_registers_per_sm, max_registers_per_block, max_smem_per_sm_bytes, "
        "max_smem_per_block_bytes, max_smem_per_block_optin_bytes FROM gpus WHERE trace_id = ?",
        [trace_id]).fetchall()
    devices = {r[0] for r in con.execute(
        "SELECT DISTINCT device_id FROM kernel_queues WHERE trace_id = ?", [trace_id]).fetchall()}
    records = {r[0]: r for r in rows}
    _refuse_other_vendors(con, trace_id)
    out: dict[int, tuple[GpuLimits, int]] = {}
    for device in sorted(devices, key=lambda d: (d is None, d)):
        rec = records.get(device) or (rows[0] if len(rows) == 1 else None)
        major, minor = _cc(cc) if cc else ((rec[1], rec[2]) if rec and rec[1] is not None else (None, None))
        count = sms or (rec[3] if rec else None)
        if major is None or not count:
            raise MissingDataError(
                f"the trace has no GPU description for device {device}: pass --cc MAJOR.MINOR and --sms N")
        overrides = {}
        if rec and not cc:
            fields = ("max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm", "regs_per_block",
                      "smem_per_sm", "smem_per_block", "smem_per_block_optin")
            values = ((rec[4] or 0) * (rec[5] or 32) or None, rec[6], rec[7], rec[8], rec[9], rec[10], rec[11])
            overrides = {f: v for f, v in zip(fields, values) if v}
        out[device] = (limits_for_cc(major, minor, **overrides), int(count))
    return out


def _refuse_other_vendors(con: duckdb.DuckDBPyConnection, trace_id: int) -> None:
    """Occupancy follows CUDA's rules: a trace whose GPUs are not NVIDIA's gets none (never a wrong one)."""
    other = con.execute("SELECT DISTINCT vendor, name FROM gpus WHERE trace_id = ? AND vendor <> 'NVIDIA'",
                        [trace_id]).fetchall()
    if other:
        name = con.execute("SELECT name FROM traces WHERE trace_id = ?", [trace_id]).fetchall()[0][0]
        raise MissingDataError(f"{name} ran on {other[0][1]} ({other[0][0]}): occupancy and RU follow CUDA's "
                               "rules and are computed for NVIDIA GPUs only")


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise MissingDataError(f"{text!r} is not a compute capability like 9.0")
    return int(major), int(minor)


def launch_ru(con: duckdb.DuckDBPyConnection, trace_id: int, *, cc: str | None = None,
              sms: int | None = None, iteration_regex: str = ITERATION_REGEX,
              kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every kernel launch with its occupancy and resource utilization.

    Columns: kernel_id, name, short_name, library, layer, pass, device_id, dur_ns, grid_blocks,
    block_threads, registers_per_thread, smem_static_bytes, smem_dynamic_bytes,
    smem_carveout_bytes, blocks_per_sm (active blocks per SM), limiter (the binding limit(s):
    warps, registers, shared_mem, blocks, barriers, joined with '+'), occupancy (theoretical,
    fraction), max_blocks (SMs x blocks_per_sm), waves, ru (eq. 11, fraction), paper_max_blocks
    (eq. 10: registers only), paper_ru (eq. 11 with eq. 10's maxBlocks), kineto_occupancy
    (Kineto's estimate: as a Kineto trace recorded it, `est. achieved occupancy %`; for other
    traces kineto_emulated), kineto_emulated (ours of Kineto's estimate from the launch shape: no
    opt-in, so 0 for launches over 48 KB of shared memory). Launches with no
    launch-shape record (null block size) have null RU columns. `kernels`: the trace's
    `layers.attributed_kernels` frame when the caller has it already (attribution is the cost).
    """
    limits = device_limits(con, trace_id, cc, sms)
    if kernels is None:
        kernels = attributed_kernels(con, trace_id, iteration_regex)
    k = kernels.select("kernel_id", "name", "short_name", "library", "layer", "pass")
    shapes = con.sql(
        f"SELECT kernel_id, dur_ns, grid_blocks, {', '.join(_SHAPE)}, kineto_occupancy_pct FROM kernels "
        f"WHERE trace_id = {int(trace_id)}").pl()
    return (_with_ru(k.join(shapes, on="kernel_id", how="left"), limits)
            .select("kernel_id", "name", "short_name", "library", "layer", "pass", "device_id", "dur_ns",
                    "grid_blocks", "block_threads", "registers_per_thread", "smem_static_bytes",
                    "smem_dynamic_bytes", "smem_carveout_bytes", "blocks_per_sm", "limiter", "occupancy",
                    "max_blocks", "waves", "ru", "paper_max_blocks", "paper_ru", "kineto_occupancy",
                    "kineto_emulated")
            .sort("kernel_id"))


def _shape_occupancy(shapes: pl.DataFrame, limits: dict[int, tuple[GpuLimits, int]]) -> pl.DataFrame:
    """Occupancy per distinct launch shape (a few hundred in a real trace, not one per launch)."""
    rows = []
    for shape in shapes.iter_rows(named=True):
        gpu, sms = limits[shape["device_id"]] if shape["device_id"] in limits else next(iter(limits.values()))
        threads, regs = shape["block_threads"], shape["registers_per_thread"]
        row = dict(shape, sms=sms, max_threads_per_sm=gpu.max_threads_per_sm, blocks_per_sm=None, limiter=None,
                   occupancy=None, max_blocks=None, paper_max_blocks=None, kineto_blocks=None)
        if threads and regs is not None:
            static, dynamic = shape["smem_static_bytes"] or 0, shape["smem_dynamic_bytes"] or 0
            # A launch that ran had the shared memory it asked for: it opted in where it needed to.
            occ = launch_occupancy(threads, regs, gpu, static_smem=static, dynamic_smem=dynamic,
                                   carveout=shape["smem_carveout_bytes"], opt_in=True)
            # Kineto's inputs (notes §5.3): no opt-in, the default carveout, no barrier limit.
            kineto = launch_occupancy(threads, regs, gpu, static_smem=static, dynamic_smem=dynamic,
                                      opt_in=False, barriers=0).active_blocks_per_sm
            row.update(blocks_per_sm=occ.active_blocks_per_sm, limiter="+".join(occ.limiting),
                       occupancy=occ.theoretical_occupancy,
                       max_blocks=sms * occ.active_blocks_per_sm or None,
                       paper_max_blocks=sms * (gpu.regs_per_sm // (threads * regs)) if regs else None,
                       kineto_blocks=kineto)
        rows.append(row)
    schema = {**{c: shapes.schema[c] for c in _SHAPE}, "sms": pl.Int64, "max_threads_per_sm": pl.Int64,
              "blocks_per_sm": pl.Int64, "limiter": pl.String, "occupancy": pl.Float64,
              "max_blocks": pl.Int64, "paper_max_blocks": pl.Int64, "kineto_blocks": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def _weighted(column: str) -> pl.Expr:
    """Kernel-time-weighted mean of `column` over the launches where it is known."""
    known = pl.col(column).is_not_null()
    weight = pl.when(known).then(pl.col("dur_ns"))
    return ((pl.col(column) * weight).sum() / weight.sum()).alias(column)


def _dominant(column: str, label: str | None = None) -> pl.Expr:
    """The value of `column` at the group's longest launch (the first of them, in kernel order)."""
    return pl.col(column).sort_by("longest_ns", "first_kernel", descending=[True, False]).first().alias(label or column)


_KEYS = {GroupBy.kernel: ["name"], GroupBy.layer: ["layer", "pass"], GroupBy.library: ["library"]}


def ru_table(con: duckdb.DuckDBPyConnection, trace_id: int, by: GroupBy | str = GroupBy.kernel, *,
             cc: str | None = None, sms: int | None = None,
             iteration_regex: str = ITERATION_REGEX, groups: pl.DataFrame | None = None) -> pl.DataFrame:
    """RU and occupancy per kernel name, layer or library, heaviest first (`groups`: the trace's
    `layers.launch_groups`, when the caller has them).

    Columns: the keys (name | layer, pass | library), kernels, total_ns, then for `kernel`: the
    launch shape of the group's longest launch (grid_blocks, block_threads, registers_per_thread,
    smem_bytes = static + dynamic), limiter and blocks_per_sm of that shape; for `layer` and
    `library`: library (the dominant one; layer only) and limiter (the dominant one). Then for all:
    occupancy, waves, ru, paper_ru, kineto_occupancy (kernel-time-weighted means; fractions).

    By kernel, and by library where no range of the trace is an operation that decides a
    kernel's library (`classify` [[launcher]] rules), no launch needs its NVTX context, and every
    launch of one name, shape and grid has the same RU: those are aggregated in the store first
    (a few thousand groups for ten million launches) and weighted by their time, which gives
    `launch_ru`'s means. Otherwise the attributed launches come grouped the same way, with
    their library, layer and pass (`layers.launch_groups`, `_attributed_groups`).
    """
    by = GroupBy(by)
    if groups is None and (by is GroupBy.kernel or by is GroupBy.library and not _has_launchers(con, trace_id)):
        launches = _launch_groups(con, trace_id, cc=cc, sms=sms, library=by is GroupBy.library)
    else:
        if groups is None:
            groups = launch_groups(con, trace_id, iteration_regex)
        launches = _attributed_groups(con, trace_id, groups, cc=cc, sms=sms)
    launches = launches.sort("first_kernel").with_columns(  # in a fixed order: float sums the same every run
        smem_bytes=pl.col("smem_static_bytes").fill_null(0) + pl.col("smem_dynamic_bytes").fill_null(0))
    keys = _KEYS[by]
    if by is GroupBy.kernel:
        described = [_dominant(c) for c in ("grid_blocks", "block_threads", "registers_per_thread",
                                            "smem_bytes", "limiter", "blocks_per_sm")]
    elif by is GroupBy.layer:
        described = [_dominant("library"), _dominant("limiter")]
    else:
        described = [_dominant("limiter")]
    means = ["occupancy", "waves", "ru", "paper_ru", "kineto_occupancy"]
    return (launches.group_by(keys)
            .agg(pl.col("instances").sum().cast(pl.Int64).alias("kernels"),
                 pl.col("dur_ns").sum().cast(pl.Int64).alias("total_ns"),
                 *described, *[_weighted(c) for c in means])
            .sort(["total_ns", *keys], descending=[True] + [False] * len(keys), nulls_last=True))


def _has_launchers(con: duckdb.DuckDBPyConnection, trace_id: int) -> bool:
    """Whether some push/pop range of the trace is named by a [[launcher]] rule (RE2 in DuckDB
    takes the rules' plain regexes; the scan stops at the first)."""
    from traceq.analysis.classify import default_rules

    patterns = [rule.pattern.pattern for rule in default_rules().launchers]
    if not patterns:
        return False
    regex = "|".join(f"(?:{p})" for p in patterns)
    return bool(con.execute(
        "SELECT count(*) FROM (SELECT 1 FROM nvtx WHERE trace_id = ? AND kind = 'pushpop' "
        "AND regexp_matches(regexp_replace(name, ?, ''), ?) LIMIT 1)",
        [int(trace_id), SUFFIX_REGEX, regex]).fetchone()[0])


_SHAPE_SQL = ("c.grid_x::BIGINT * c.grid_y * c.grid_z AS grid_blocks, q.device_id, "
              "c.block_x * c.block_y * c.block_z AS block_threads, c.registers_per_thread, c.smem_static_bytes, "
              "c.smem_dynamic_bytes, c.smem_carveout_bytes, c.kineto_occupancy_pct")
"""A launch's grid, shape and Kineto occupancy from its configuration c and queue q, as `_with_ru` takes them."""


def _launch_groups(con: duckdb.DuckDBPyConnection, trace_id: int, *, cc: str | None, sms: int | None,
                   library: bool) -> pl.DataFrame:
    """`launch_ru`'s columns (but layer, pass) for groups of launches with one name, shape and grid:
    instances, dur_ns (their total), longest_ns and first_kernel (the first of the longest)."""
    limits = device_limits(con, trace_id, cc, sms)
    t = int(trace_id)
    # by the launches' ids first (name, configuration, queue: ten million rows, no join), then the
    # few groups named and merged by what the columns say
    groups = con.sql(f"""
        SELECT n.name, {_SHAPE_SQL}, sum(g.instances)::BIGINT AS instances, sum(g.dur_ns) AS dur_ns,
               max(g.longest_ns) AS longest_ns, arg_min(g.first_kernel, (-g.longest_ns, g.first_kernel)) AS first_kernel
        FROM (SELECT name_id, config_id, queue_id, count(*) AS instances, sum(end_ns - start_ns) AS dur_ns,
                     max(end_ns - start_ns) AS longest_ns,
                     arg_min(kernel_id, (start_ns - end_ns, kernel_id)) AS first_kernel
              FROM kernel_events WHERE trace_id = {t} GROUP BY ALL) g
        JOIN kernel_names n ON n.trace_id = {t} AND n.name_id = g.name_id
        JOIN kernel_configs c ON c.trace_id = {t} AND c.config_id = g.config_id
        JOIN kernel_queues q ON q.trace_id = {t} AND q.queue_id = g.queue_id
        GROUP BY ALL""").pl()
    if library:
        from traceq.analysis.classify import classify_names

        classes = classify_names(groups["name"].unique(maintain_order=True)).select("name", "library")
        groups = groups.join(classes, on="name", how="left")
    return _with_ru(groups, limits)


def _attributed_groups(con: duckdb.DuckDBPyConnection, trace_id: int, groups: pl.DataFrame, *,
                       cc: str | None, sms: int | None) -> pl.DataFrame:
    """`_launch_groups` for attributed launches (`groups`: `layers.launch_groups`): one row per
    name, library, layer, pass, configuration and queue, with its shape, grid and RU computed
    once."""
    limits = device_limits(con, trace_id, cc, sms)
    t = int(trace_id)
    groups = (groups.sort("longest_ns", "first_kernel", descending=[True, False])  # each group's first: its longest
              .group_by("name", "library", "layer", "pass", "config_id", "queue_id")
              .agg(pl.col("instances").sum(), pl.col("dur_ns").sum(), pl.col("longest_ns", "first_kernel").first()))
    shapes = con.sql(f"""
        SELECT c.config_id, q.queue_id, {_SHAPE_SQL}
        FROM kernel_configs c JOIN kernel_queues q ON q.trace_id = c.trace_id WHERE c.trace_id = {t}""").pl()
    groups = groups.join(shapes.cast({"config_id": groups.schema["config_id"], "queue_id": groups.schema["queue_id"]}),
                         on=["config_id", "queue_id"], how="left")
    return _with_ru(groups.drop("config_id", "queue_id"), limits)


def _with_ru(frame: pl.DataFrame, limits: dict[int, tuple[GpuLimits, int]]) -> pl.DataFrame:
    """`frame` (grid_blocks, the `_SHAPE` columns and kineto_occupancy_pct) with `_shape_occupancy`'s
    columns, computed once per distinct shape, and waves, ru, paper_ru, kineto_emulated and
    kineto_occupancy (the recorded estimate where there is one)."""
    occupancy = _shape_occupancy(frame.select(_SHAPE).unique(), limits)
    frame = frame.join(occupancy, on=_SHAPE, how="left", nulls_equal=True)
    grid = pl.col("grid_blocks")
    waves_needed = (grid / pl.col("max_blocks")).ceil()
    paper_waves = (grid / pl.col("paper_max_blocks")).ceil()
    kineto_blocks = pl.min_horizontal(pl.col("kineto_blocks"), grid / pl.col("sms"))
    return frame.with_columns(
        waves=grid / pl.col("max_blocks"),
        ru=grid / (waves_needed * pl.col("max_blocks")),
        paper_ru=pl.when(pl.col("paper_max_blocks") > 0).then(grid / (paper_waves * pl.col("paper_max_blocks"))),
        kineto_emulated=kineto_blocks * pl.col("block_threads") / pl.col("max_threads_per_sm"),
    ).with_columns(kineto_occupancy=pl.coalesce(pl.col("kineto_occupancy_pct") / 100, pl.col("kineto_emulated")))


# --- compute efficiency ----------------------------------------------------------------------

NO_FLOPS = ("no FLOPs: the trace has no op shapes; record it under "
            "torch.autograd.profiler.emit_nvtx(record_shapes=True), or pass --spec model.toml (docs/flops.md)")

_FLOP_OPERATIONS = ("convolution", "gemm")
"""Kernels that do a layer's arithmetic; layout transforms, im2col and the like get no FLOPs."""

_DTYPE_PRECISION = {dtype: dtype_precision(dtype) for dtype in DTYPES}


def distribute_flops(kernels: pl.DataFrame, flops: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Spread each group's FLOPs over its kernels: kernel_id, flops (Float64).

    `kernels` has kernel_id, dur_ns, operation, `keys` and optionally capacity (FLOP the kernel
    could have done at its precision's peak: dur_ns x peak); `flops` has `keys` and flops.
    Within a group the convolution and GEMM kernels share the FLOPs in proportion to their
    capacity (to their time without it), so each has the group's compute efficiency; a group
    with none of them shares over all its kernels. Kernels of groups without FLOPs get 0.
    """
    doers = pl.col("operation").is_in(_FLOP_OPERATIONS)
    size = pl.col("capacity") if "capacity" in kernels.columns else pl.col("dur_ns")
    k = kernels.with_columns(
        has_doer=doers.any().over(keys)).with_columns(
        weight=pl.when(doers | ~pl.col("has_doer")).then(size).otherwise(0))
    k = k.with_columns(share=pl.col("weight") / pl.col("weight").sum().over(keys))
    return (k.join(flops.select(*keys, pl.col("flops").alias("group_flops")), on=keys, how="left",
                   nulls_equal=True)
            .select("kernel_id", flops=(pl.col("share").fill_nan(0) * pl.col("group_flops")).fill_null(0.0)))


def busiest_gpu(con: duckdb.DuckDBPyConnection, trace_id: int) -> dict[str, object]:
    """The device record (`peaks.trace_peaks` row: name, sm_count, clock_hz, peak_<precision>)
    of the GPU that ran the most kernel time, with `description` ('NVIDIA H200 (132 SMs at
    1.98 GHz)'). Raises MissingDataError when the trace describes no GPU."""
    devices = _device_peaks(con, trace_id)
    if devices.is_empty():
        raise MissingDataError("the trace has no GPU description (compute capability, SMs, clock), "
                               "so its peak FLOP/s is unknown")
    gpu = devices.row(0, named=True)
    return {**gpu, "description": f"{gpu['name']} ({gpu['sm_count']} SMs at {gpu['clock_hz'] / 1e9:.2f} GHz)"}


def _device_peaks(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """`peaks.trace_peaks`, busiest device first."""
    from traceq.analysis.peaks import trace_peaks

    busy = con.sql(f"SELECT device_id, sum(dur_ns) AS busy_ns FROM kernels WHERE trace_id = {int(trace_id)} "
                   "GROUP BY 1").pl()
    return (trace_peaks(con, trace_id).join(busy, on="device_id", how="left")
            .sort("busy_ns", descending=True, nulls_last=True).drop("busy_ns"))


def _kernel_peaks(con: duckdb.DuckDBPyConnection, trace_id: int, kernels: pl.DataFrame) -> pl.Series:
    """Peak FLOP/s of each kernel's precision on its device (the busiest GPU for kernels on a
    device the trace does not describe); null where that GPU has no peak for the precision."""
    devices = _device_peaks(con, trace_id)
    if devices.is_empty():
        raise MissingDataError("the trace has no GPU description (compute capability, SMs, clock), "
                               "so its peak FLOP/s is unknown")
    long = devices.unpivot([f"peak_{p}" for p in PRECISIONS], index="device_id", variable_name="precision",
                           value_name="peak_flops").with_columns(pl.col("precision").str.strip_prefix("peak_"))
    busiest = long.filter(pl.col("device_id") == devices["device_id"][0]).select("precision", busiest="peak_flops")
    known = pl.col("device_id").is_in(devices["device_id"].implode())
    return (kernels.select(pl.when(known).then(pl.col("device_id")).alias("device_id"), "precision")
            .join(long, on=["device_id", "precision"], how="left", nulls_equal=True, maintain_order="left")
            .join(busiest, on="precision", how="left", maintain_order="left")
            .select(pl.when(known).then(pl.col("peak_flops")).otherwise(pl.col("busiest")))
            .to_series().alias("peak_flops"))


def infer_batch(con: duckdb.DuckDBPyConnection, trace_id: int, kernels: pl.DataFrame,
                sample_bytes: int) -> int | None:
    """The batch size a training trace copied to the GPU each iteration, or None.

    Host-to-device bytes per iteration (iterations from `kernels`' iteration column) divided by
    one fp32 sample plus an int64 label, or by the sample alone: only when it divides exactly
    (AlexNet b256: 158,299,136 B = 256 x (3 x 227 x 227 x 4 + 8)), so a guess is never made.
    """
    iterations = kernels["iteration"].drop_nulls().n_unique()
    rows = con.execute("SELECT coalesce(sum(bytes), 0) FROM memops WHERE trace_id = ? AND op = 'memcpy' "
                       "AND copy_kind = 'Host-to-Device'", [trace_id]).fetchall()
    total = int(rows[0][0])
    if not iterations or not total or total % iterations or sample_bytes <= 0:
        return None
    per_iteration = total // iterations
    for unit in (sample_bytes + 8, sample_bytes):
        if per_iteration % unit == 0:
            return per_iteration // unit
    return None


_KERNEL_CE = ("kernel_id", "name", "library", "operation", "tensor_cores", "layer", "pass", "device_id",
              "dur_ns", "precision", "precision_from", "peak_flops", "flops")


def kernel_ce(con: duckdb.DuckDBPyConnection, trace_id: int, *, spec: Path | None = None,
              batch: int | None = None, precision: str | None = None, iteration_regex: str = ITERATION_REGEX,
              kernels: pl.DataFrame | None = None, ops: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every kernel with its FLOPs and the peak they are measured against (`ops`: the trace's
    `flops.op_flops` with op_row, when the caller has them).

    Columns: kernel_id, name, library, operation, tensor_cores, layer, pass, device_id, dur_ns,
    precision (fp64 ... int8), precision_from ('--precision', 'kernel name', 'operator dtype' or
    'assumed float32'), peak_flops (FLOP/s of that precision on the kernel's GPU; null where the
    GPU has none), flops.

    A kernel's precision is `precision` when given, else what its name says
    (`[[precision]]` rules), else its operator's data type (the spec layer's dtype, or the
    recorded input type of the Kineto operator that launched it), else float32; float32 means
    TF32 on a kernel whose name shows tensor cores.

    FLOPs come from the model spec when given (a layer's FLOPs per step times the times its
    range occurs, spread over its convolution and GEMM kernels by `distribute_flops`; the batch
    is `batch`, else what `infer_batch` finds in the trace, else the spec's), else from the op
    shapes PyTorch recorded in the trace (`flops.kernel_flops`). Within a layer or op the FLOPs
    are shared in proportion to each kernel's capacity (time x peak). A spec layer whose FLOPs
    find no kernel in the trace gets a row of its own with a null kernel_id and no time, so the
    FLOPs add up to the spec's (`ce_notes` says which). Raises MissingDataError when the trace
    has neither shapes nor spec.
    """
    from traceq.analysis.classify import classify_names
    from traceq.analysis.flops import kernel_op_rows
    from traceq.analysis.modelspec import load_spec, spec_layer_flops

    k = attributed_kernels(con, trace_id, iteration_regex) if kernels is None else kernels
    names = classify_names(k["name"].unique()).select("name", "tensor_cores", name_precision="precision")
    k = k.join(names, on="name", how="left")
    if spec is not None:
        if batch is None:
            batch = infer_batch(con, trace_id, k, math.prod(load_spec(spec).input_shape) * 4)
        layers = _spec_flops(con, trace_id, spec_layer_flops(spec, batch), k)
        k = k.join(layers.select("layer", "pass", "dtype"), on=["layer", "pass"], how="left", nulls_equal=True)
    else:  # each op's FLOPs over its kernels, and the op's recorded dtype (Kineto) where there is one
        shares = kernel_op_rows(con, trace_id, ops).select("kernel_id", "op_row", "dtype", op_flops="flops")
        k = k.join(shares, on="kernel_id", how="left")
    k = _with_precision(k, precision)
    k = k.with_columns(peak_flops=_kernel_peaks(con, trace_id, k))
    # a kernel's share of its group's FLOPs follows what it could have done: time x peak
    typical = k["peak_flops"].mean() or 1.0
    k = k.with_columns(capacity=pl.col("dur_ns") * pl.col("peak_flops").fill_null(typical))
    if spec is not None:
        k = k.join(distribute_flops(k, layers, ["layer", "pass"]), on="kernel_id", how="left")
    else:  # the kernels that share an op's FLOPs by time share them by capacity
        size = pl.when(pl.col("op_flops") > 0).then(pl.col("capacity")).otherwise(0.0)
        k = k.with_columns(flops=(pl.col("op_flops").sum().over("op_row") * size / size.sum().over("op_row"))
                           .fill_nan(0.0))
    k = k.with_columns(pl.col("flops").fill_null(0.0))
    k = k.select(*_KERNEL_CE)
    if spec is not None:
        k = pl.concat([k, _unplaced_rows(k, layers, precision)], how="vertical_relaxed")
    return k


def kernel_precisions(con: duckdb.DuckDBPyConnection, trace_id: int, kernels: pl.DataFrame) -> pl.DataFrame:
    """The precision of each of `kernels` (kernel_id, name) as `kernel_ce` reads it without a
    spec or `precision`: kernel_id, tensor_cores, precision, precision_from."""
    from traceq.analysis.classify import classify_names
    from traceq.analysis.flops import kernel_op_rows

    names = (classify_names(kernels["name"].unique().cast(pl.String))  # names may come categorical
             .select(pl.col("name").cast(kernels.schema["name"]), "tensor_cores", name_precision="precision"))
    dtypes = kernel_op_rows(con, trace_id).select("kernel_id", "dtype")
    k = kernels.select("kernel_id", "name").join(names, on="name", how="left").join(dtypes, on="kernel_id", how="left")
    return _with_precision(k, None).select("kernel_id", "tensor_cores", "precision", "precision_from")


def kernel_launch_table(con: duckdb.DuckDBPyConnection, trace_id: int, kernels: pl.DataFrame,
                        note: Callable[[str], None] | None = None) -> pl.DataFrame:
    """Every launch of `kernels` (the trace's `layers.attributed_kernels`) with its stream, its
    precision (`kernel_precisions`) and its occupancy and RU (`launch_ru`).

    Columns: kernel_id, device_id, stream_id, start_ns, dur_ns, name, short_name, layer, pass,
    iteration, stage, attribution, library, implementation, operation, precision,
    precision_from, tensor_cores, grid_blocks, block_threads, registers_per_thread,
    smem_static_bytes, smem_dynamic_bytes, blocks_per_sm, limiter, occupancy, waves, ru; in
    kernel_id order. Where the trace's GPUs give no occupancy (no device record, not NVIDIA's)
    the RU columns are null and `note` is told why.
    """
    shape = ["grid_blocks", "block_threads", "registers_per_thread", "smem_static_bytes", "smem_dynamic_bytes"]
    occupancy = ["blocks_per_sm", "limiter", "occupancy", "waves", "ru"]
    try:
        ru = launch_ru(con, trace_id, kernels=kernels).select("kernel_id", *occupancy)
    except MissingDataError as e:
        if note is not None:
            note(f"{e}: the occupancy and RU columns are empty")
        ru = pl.DataFrame(schema={"kernel_id": pl.Int64, "blocks_per_sm": pl.Int64, "limiter": pl.String,
                                  "occupancy": pl.Float64, "waves": pl.Float64, "ru": pl.Float64})
    config = con.sql(f"SELECT kernel_id, stream_id, {', '.join(shape)} FROM kernels "
                     f"WHERE trace_id = {int(trace_id)}").pl()
    return (kernels.join(kernel_precisions(con, trace_id, kernels), on="kernel_id", how="left", maintain_order="left")
            .join(config, on="kernel_id", how="left", maintain_order="left")
            .join(ru.cast({"kernel_id": kernels.schema["kernel_id"]}), on="kernel_id", how="left",
                  maintain_order="left")
            .select("kernel_id", "device_id", "stream_id", "start_ns", "dur_ns", "name", "short_name", "layer",
                    "pass", "iteration", "stage", "attribution", "library", "implementation", "operation",
                    "precision", "precision_from", "tensor_cores", *shape, *occupancy))


def _spec_flops(con: duckdb.DuckDBPyConnection, trace_id: int, layers: pl.DataFrame,
                kernels: pl.DataFrame) -> pl.DataFrame:
    """The spec's per-step FLOPs (layer, pass, op, flops, dtype) for the whole trace: a layer's
    range occurs once per step the trace recorded; a layer with no range, once per iteration."""
    occurrences = con.sql(
        f"SELECT name AS layer, count(*) AS n FROM nvtx WHERE trace_id = {int(trace_id)} "
        f"AND kind = 'pushpop' GROUP BY name").pl()
    steps = max(kernels["iteration"].drop_nulls().n_unique(), 1)
    return (layers.join(occurrences, on="layer", how="left")
            .with_columns(flops=pl.col("flops") * pl.col("n").fill_null(steps)).drop("n"))


def _with_precision(k: pl.DataFrame, precision: str | None) -> pl.DataFrame:
    """`k` (name_precision, dtype, tensor_cores) with precision and precision_from."""
    if precision is not None:
        return k.with_columns(precision=pl.lit(precision), precision_from=pl.lit("--precision"))
    dtype = pl.col("dtype").replace_strict(_DTYPE_PRECISION, default=None)
    by_dtype = pl.when(dtype.eq("fp32") & pl.col("tensor_cores").fill_null(False)).then(pl.lit("tf32")).otherwise(dtype)
    assumed = pl.when(pl.col("tensor_cores").fill_null(False)).then(pl.lit("tf32")).otherwise(pl.lit("fp32"))
    return k.with_columns(
        precision=pl.coalesce("name_precision", by_dtype, assumed),
        precision_from=pl.when(pl.col("name_precision").is_not_null()).then(pl.lit("kernel name"))
        .when(dtype.is_not_null()).then(pl.lit("operator dtype")).otherwise(pl.lit("assumed float32")))


def _unplaced_rows(k: pl.DataFrame, layers: pl.DataFrame, precision: str | None) -> pl.DataFrame:
    """One row per spec (layer, pass) whose FLOPs reached no kernel: null kernel_id, no time."""
    placed = k.group_by("layer", "pass").agg(placed=pl.col("flops").sum())
    missing = (layers.join(placed, on=["layer", "pass"], how="left", nulls_equal=True)
               .filter(pl.col("placed").fill_null(0) <= 0))
    rows = missing.select(
        kernel_id=pl.lit(None, pl.Int64), name=pl.lit(None, pl.String), library=pl.lit(None, pl.String),
        operation=pl.lit(None, pl.String), tensor_cores=pl.lit(None, pl.Boolean), layer="layer", pass_="pass",
        device_id=pl.lit(None, pl.Int32), dur_ns=pl.lit(0, pl.Int64),
        precision=pl.lit(precision) if precision else pl.col("dtype").replace_strict(_DTYPE_PRECISION, default=None),
        precision_from=pl.lit("--precision" if precision else "operator dtype"),
        peak_flops=pl.lit(None, pl.Float64), flops=pl.col("flops").cast(pl.Float64))
    return rows.rename({"pass_": "pass"}).cast({c: k.schema[c] for c in _KERNEL_CE}, strict=False)


def ce_notes(kernels: pl.DataFrame) -> list[str]:
    """What a reader of `ce_table` over `kernels` (a `kernel_ce` frame) should be told: spec
    layers whose FLOPs reached no kernel, and FLOP-carrying time whose precision was assumed."""
    notes = [f"{layer} ({pass_}): the spec's {flops / 1e9:,.1f} GFLOP found no kernel in the trace "
             "(their own row, no CE)"
             for layer, pass_, flops in kernels.filter(pl.col("kernel_id").is_null())
             .select("layer", "pass", "flops").iter_rows()]
    carriers = kernels.filter(pl.col("kernel_id").is_not_null() & (pl.col("flops") > 0))
    assumed = carriers.filter(pl.col("precision_from") == "assumed float32")["dur_ns"].sum()
    if carriers.height and assumed:
        notes.append(f"{100 * assumed / carriers['dur_ns'].sum():.0f} % of the FLOP-carrying time ran kernels whose "
                     "names and operators do not say their precision: float32 assumed (TF32 on tensor cores); "
                     "--precision sets it")
    return notes


def ce_table(con: duckdb.DuckDBPyConnection, trace_id: int, by: GroupBy | str = GroupBy.layer, *,
             spec: Path | None = None, batch: int | None = None, precision: str | None = None,
             iteration_regex: str = ITERATION_REGEX, kernels: pl.DataFrame | None = None,
             per_kernel: pl.DataFrame | None = None) -> pl.DataFrame:
    """Compute efficiency per layer and pass, kernel name or library, most FLOPs first
    (`kernels` as for `launch_ru`; `per_kernel`: this trace's `kernel_ce` when the caller has it).

    CE is achieved FLOP/s over the peak of the precision the kernels ran at (`kernel_ce`), a
    fraction that cannot exceed 1: a group's peak is its FLOP-carrying kernels' peaks, weighted
    by their time.

    Columns: the keys (layer, pass | name | library), precision (the FLOP-carrying kernels'
    precisions by their share of time: 'tf32 82%, fp32 18%'), kernels, total_ns, [no_flops_ns,]
    flops, tflops (achieved TFLOP/s), peak_tflops, ce (fraction), tensor_core_pct (share of
    total_ns in kernels whose names show tensor cores).

    By layer, total_ns is all of the layer's kernels (the paper's layer time: layout transforms
    and the like count against the layer) and groups without FLOPs are left out. By kernel
    name and by library only FLOP-carrying kernels count in kernels and total_ns, so libraries
    compare like with like; no_flops_ns is the time of the group's kernels that carry no FLOPs
    (normalization, elementwise, layout); by library every library has a row, by kernel only
    names with FLOPs. Spec layers whose FLOPs found no kernel have rows with no time and a
    null CE (null library and name). Raises MissingDataError without shapes or spec (with how
    to get them).
    """
    from traceq.analysis.layers import time_split

    by = GroupBy(by)
    ops = None
    if per_kernel is None and spec is None:  # no op with FLOPs: none for any kernel, so no kernel is read
        from traceq.analysis.flops import op_flops

        ops = op_flops(con, trace_id).with_row_index("op_row")
        if not (ops["flops"] > 0).any():
            raise MissingDataError(NO_FLOPS)
    k = per_kernel if per_kernel is not None else kernel_ce(
        con, trace_id, spec=spec, batch=batch, precision=precision, iteration_regex=iteration_regex, kernels=kernels,
        ops=ops)
    if not k.filter(pl.col("kernel_id").is_not_null())["flops"].sum() > 0:
        raise MissingDataError(NO_FLOPS if spec is None else f"{spec}: no layer of the spec matches an NVTX "
                               "range of the trace (names must be the ranges' names: conv1, fc6, ...)")
    keys = _KEYS[by]
    carries = pl.col("flops") > 0
    counted = pl.lit(True) if by is GroupBy.layer else carries
    real = pl.col("kernel_id").is_not_null()
    time = pl.col("dur_ns").filter(counted).sum()
    frame = k.group_by(keys).agg(
        (counted & real).sum().cast(pl.Int64).alias("kernels"),
        time.cast(pl.Int64).alias("total_ns"),
        pl.col("dur_ns").filter(~carries).sum().cast(pl.Int64).alias("no_flops_ns"),
        pl.col("flops").sum(),
        (pl.col("dur_ns") * pl.col("peak_flops")).filter(carries & real).sum().alias("capacity"),
        pl.col("dur_ns").filter(carries & real).sum().alias("carrier_ns"),
        pl.col("peak_flops").filter(carries & real).is_null().any().alias("peak_unknown"),
        pl.when(time > 0).then(pl.col("dur_ns").filter(counted & pl.col("tensor_cores").fill_null(False)).sum()
                               * 100 / time).alias("tensor_core_pct"))
    if by is not GroupBy.library:
        frame = frame.filter(pl.col("flops") > 0)
    precisions = (time_split(k.filter(carries & real), keys, "precision", "precision")
                  .with_columns(pl.col("precision").str.replace(r" 100%$", "")))
    seconds = pl.col("total_ns") * 1e-9
    peak = pl.when(~pl.col("peak_unknown") & (pl.col("carrier_ns") > 0)).then(pl.col("capacity") / pl.col("carrier_ns"))
    frame = (frame.join(precisions, on=keys, how="left", nulls_equal=True)
             .with_columns(tflops=pl.when(pl.col("total_ns") > 0).then(pl.col("flops") / seconds / 1e12),
                           peak_tflops=peak / 1e12)
             .with_columns(ce=pl.col("tflops") / pl.col("peak_tflops")))
    columns = [*keys, "precision", "kernels", "total_ns", *(["no_flops_ns"] if by is not GroupBy.layer else []),
               "flops", "tflops", "peak_tflops", "ce", "tensor_core_pct"]
    return frame.select(columns).sort(["flops", "total_ns", *keys], descending=[True, True] + [False] * len(keys),
                                      nulls_last=True)
