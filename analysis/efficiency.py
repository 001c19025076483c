"""Resource utilization (the method's equations 9 to 11) and compute efficiency (equation 8)
of every kernel launch in a trace, and their kernel-time-weighted means per kernel name, layer
and library: the `traceq ru` and `traceq ce` analyses.

RU needs only the launch records: occupancy is computed once per distinct launch shape
(block size, registers, shared memory, carveout, device) with `occupancy.launch_occupancy`, the
calculator that agrees with Nsight Compute, then joined back to the launches. The GPU's limits
come from the trace's own device record (`gpus`), over the compute-capability table.

CE needs FLOPs, which a trace has only when PyTorch recorded the op shapes
(`emit_nvtx(record_shapes=True)`) or the user describes the model in a spec file
(`analysis.modelspec`, `analysis.flops`). Peaks come from `analysis.peaks`: the paper's 2 x clock x FP32 lanes, and
separately the dense tensor-core peak for the data type; CE is reported against each, labelled.
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import polars as pl

from traceq.analysis.attribution import ITERATION_REGEX
from traceq.analysis.choices import GroupBy
from traceq.analysis.gpu_specs import GpuLimits, limits_for_cc
from traceq.analysis.layers import attributed_kernels
from traceq.analysis.occupancy import launch_occupancy
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
    (Kineto's estimate, 0 for launches over 48 KB of shared memory). Launches with no
    launch-shape record (null block size) have null RU columns. `kernels`: the trace's
    `layers.attributed_kernels` frame when the caller has it already (attribution is the cost).
    """
    limits = device_limits(con, trace_id, cc, sms)
    if kernels is None:
        kernels = attributed_kernels(con, trace_id, iteration_regex)
    k = kernels.select("kernel_id", "name", "short_name", "library", "layer", "pass")
    shapes = con.sql(
        f"SELECT kernel_id, dur_ns, grid_blocks, {', '.join(_SHAPE)} FROM kernels "
        f"WHERE trace_id = {int(trace_id)}").pl()
    return (_with_ru(k.join(shapes, on="kernel_id", how="left"), limits)
            .select("kernel_id", "name", "short_name", "library", "layer", "pass", "device_id", "dur_ns",
                    "grid_blocks", "block_threads", "registers_per_thread", "smem_static_bytes",
                    "smem_dynamic_bytes", "smem_carveout_bytes", "blocks_per_sm", "limiter", "occupancy",
                    "max_blocks", "waves", "ru", "paper_max_blocks", "paper_ru", "kineto_occupancy")
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
             iteration_regex: str = ITERATION_REGEX, kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """RU and occupancy per kernel name, layer or library, heaviest first (`kernels` as for
    `launch_ru`).

    Columns: the keys (name | layer, pass | library), kernels, total_ns, then for `kernel`: the
    launch shape of the group's longest launch (grid_blocks, block_threads, registers_per_thread,
    smem_bytes = static + dynamic), limiter and blocks_per_sm of that shape; for `layer` and
    `library`: library (the dominant one; layer only) and limiter (the dominant one). Then for all:
    occupancy, waves, ru, paper_ru, kineto_occupancy (kernel-time-weighted means; fractions).

    By kernel or library no launch needs its NVTX context, and every launch of one name, shape and
    grid has the same RU: those are aggregated in the store first (a few thousand groups for ten
    million launches) and weighted by their time, which gives `launch_ru`'s means.
    """
    by = GroupBy(by)
    if kernels is None and by is not GroupBy.layer:
        launches = _launch_groups(con, trace_id, cc=cc, sms=sms, library=by is GroupBy.library)
    else:
        launches = launch_ru(con, trace_id, cc=cc, sms=sms, iteration_regex=iteration_regex,
                             kernels=kernels).with_columns(instances=pl.lit(1, pl.Int64),
                                                           longest_ns=pl.col("dur_ns"),
                                                           first_kernel=pl.col("kernel_id"))
    launches = launches.with_columns(
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


def _launch_groups(con: duckdb.DuckDBPyConnection, trace_id: int, *, cc: str | None, sms: int | None,
                   library: bool) -> pl.DataFrame:
    """`launch_ru`'s columns (but layer, pass) for groups of launches with one name, shape and grid:
    instances, dur_ns (their total), longest_ns and first_kernel (the first of the longest)."""
    limits = device_limits(con, trace_id, cc, sms)
    groups = con.sql(f"""
        SELECT name, grid_blocks, {', '.join(_SHAPE)}, count(*) AS instances, sum(dur_ns) AS dur_ns,
               max(dur_ns) AS longest_ns, arg_min(kernel_id, (-dur_ns, kernel_id)) AS first_kernel
        FROM kernels WHERE trace_id = {int(trace_id)}
        GROUP BY ALL""").pl()
    if library:
        from traceq.analysis.classify import classify_names

        classes = classify_names(groups["name"].unique(maintain_order=True)).select("name", "library")
        groups = groups.join(classes, on="name", how="left")
    return _with_ru(groups, limits)


def _with_ru(frame: pl.DataFrame, limits: dict[int, tuple[GpuLimits, int]]) -> pl.DataFrame:
    """`frame` (grid_blocks and the `_SHAPE` columns) with `_shape_occupancy`'s columns, computed
    once per distinct shape, and waves, ru, paper_ru and kineto_occupancy."""
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
        kineto_occupancy=kineto_blocks * pl.col("block_threads") / pl.col("max_threads_per_sm"))


# --- compute efficiency ----------------------------------------------------------------------

NO_FLOPS = ("no FLOPs: the trace has no op shapes; record it under "
            "torch.autograd.profiler.emit_nvtx(record_shapes=True), or pass --spec model.toml (docs/flops.md)")

_FLOP_OPERATIONS = ("convolution", "gemm")
"""Kernels that do a layer's arithmetic; layout transforms, im2col and the like get no FLOPs."""


def distribute_flops(kernels: pl.DataFrame, flops: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Spread each group's FLOPs over its kernels: kernel_id, flops (Float64).

    `kernels` has kernel_id, dur_ns, operation and `keys`; `flops` has `keys` and flops. Within
    a group the convolution and GEMM kernels share the FLOPs in proportion to their time; a
    group with none of them shares over all its kernels. Kernels of groups without FLOPs get 0.
    """
    doers = pl.col("operation").is_in(_FLOP_OPERATIONS)
    k = kernels.with_columns(
        has_doer=doers.any().over(keys)).with_columns(
        weight=pl.when(doers | ~pl.col("has_doer")).then(pl.col("dur_ns")).otherwise(0))
    k = k.with_columns(share=pl.col("weight") / pl.col("weight").sum().over(keys))
    return (k.join(flops.select(*keys, pl.col("flops").alias("group_flops")), on=keys, how="left",
                   nulls_equal=True)
            .select("kernel_id", flops=(pl.col("share").fill_nan(0) * pl.col("group_flops")).fill_null(0.0)))


def trace_peaks(con: duckdb.DuckDBPyConnection, trace_id: int, dtype: str) -> tuple[float, float | None, str]:
    """(FP32 peak FLOP/s, tensor-core peak FLOP/s for `dtype` or None, GPU description) of the
    device that ran the most kernel time (`peaks.trace_peaks` has every device). Raises
    MissingDataError without a device record."""
    from traceq.analysis.peaks import trace_peaks as device_peaks

    devices = device_peaks(con, trace_id, dtype)
    busy = con.sql(f"SELECT device_id, sum(dur_ns) AS busy_ns FROM kernels WHERE trace_id = {int(trace_id)} "
                   "GROUP BY 1").pl()
    devices = devices.join(busy, on="device_id", how="left").sort("busy_ns", descending=True, nulls_last=True)
    if devices.is_empty():
        raise MissingDataError("the trace has no GPU description (compute capability, SMs, clock), "
                               "so its peak FLOP/s is unknown")
    gpu = devices.row(0, named=True)
    return (gpu["fp32_peak_flops"], gpu["tensor_peak_flops"],
            f"{gpu['name']} ({gpu['sm_count']} SMs at {gpu['clock_hz'] / 1e9:.2f} GHz)")


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


def kernel_ce(con: duckdb.DuckDBPyConnection, trace_id: int, *, spec: Path | None = None,
              batch: int | None = None, iteration_regex: str = ITERATION_REGEX,
              kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every kernel with its FLOPs: kernel_id, name, library, operation, tensor_cores, layer,
    pass, dur_ns, flops, dtype.

    FLOPs come from the model spec when given (a layer's FLOPs per step times the times its
    range occurs, spread over its convolution and GEMM kernels by `distribute_flops`; the batch
    is `batch`, else what `infer_batch` finds in the trace, else the spec's), else from the op shapes PyTorch recorded in the trace
    (`flops.kernel_flops`). Raises MissingDataError when the trace has neither.
    """
    from traceq.analysis.classify import classify_names
    from traceq.analysis.flops import kernel_flops
    from traceq.analysis.modelspec import load_spec, spec_layer_flops

    k = attributed_kernels(con, trace_id, iteration_regex) if kernels is None else kernels
    tensor = classify_names(k["name"].unique()).select("name", "tensor_cores")
    k = k.join(tensor, on="name", how="left")
    if spec is not None:
        if batch is None:
            batch = infer_batch(con, trace_id, k, math.prod(load_spec(spec).input_shape) * 4)
        layers = spec_layer_flops(spec, batch)
        # The spec counts one step; a layer's range occurs once per step the trace recorded.
        occurrences = con.sql(
            f"SELECT name AS layer, count(*) AS n FROM nvtx WHERE trace_id = {int(trace_id)} "
            f"AND kind = 'pushpop' GROUP BY name").pl()
        layers = (layers.join(occurrences, on="layer", how="left")
                  .with_columns(flops=pl.col("flops") * pl.col("n").fill_null(1)))
        flops = distribute_flops(k, layers, ["layer", "pass"])
        dtype = layers["dtype"][0] if layers.height else "float32"
    else:
        per_kernel = kernel_flops(con, trace_id)
        flops = per_kernel.select("kernel_id", pl.col("flops").cast(pl.Float64))
        dtype = per_kernel["dtype"][0] if "dtype" in per_kernel.columns and per_kernel.height else "float32"
    return (k.join(flops, on="kernel_id", how="left")
            .with_columns(pl.col("flops").fill_null(0.0), dtype=pl.lit(dtype))
            .select("kernel_id", "name", "library", "operation", "tensor_cores", "layer", "pass",
                    "dur_ns", "flops", "dtype"))


def ce_table(con: duckdb.DuckDBPyConnection, trace_id: int, by: GroupBy | str = GroupBy.layer, *,
             spec: Path | None = None, batch: int | None = None,
             iteration_regex: str = ITERATION_REGEX, kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """Compute efficiency per layer and pass, kernel name or library, most FLOPs first
    (`kernels` as for `launch_ru`).

    Columns: the keys (layer, pass | name | library), kernels, total_ns (GPU time of all the
    group's kernels), flops, tflops (achieved TFLOP/s), ce_fp32 (achieved / the paper's peak,
    2 x clock x FP32 lanes x SMs), ce_tensor (achieved / the dense tensor-core peak for the data
    type; null where the GPU has none), tensor_core_pct (share of the group's time in kernels
    whose names show tensor cores: which of the two peaks applies). Groups without FLOPs are
    left out. Raises MissingDataError without shapes or spec (with how to get them).
    """
    by = GroupBy(by)
    k = kernel_ce(con, trace_id, spec=spec, batch=batch, iteration_regex=iteration_regex, kernels=kernels)
    if not k["flops"].sum() > 0:
        raise MissingDataError(NO_FLOPS if spec is None else f"{spec}: no layer of the spec matches an NVTX "
                               "range of the trace (names must be the ranges' names: conv1, fc6, ...)")
    dtype = k["dtype"][0] if k.height else "float32"
    fp32_peak, tensor_peak, _gpu = trace_peaks(con, trace_id, dtype)
    keys = _KEYS[by]
    seconds = pl.col("total_ns") * 1e-9
    return (k.group_by(keys)
            .agg(pl.len().cast(pl.Int64).alias("kernels"), pl.col("dur_ns").sum().cast(pl.Int64).alias("total_ns"),
                 pl.col("flops").sum(),
                 (100 * pl.col("dur_ns").filter(pl.col("tensor_cores").fill_null(False)).sum()
                  / pl.col("dur_ns").sum()).alias("tensor_core_pct"))
            .filter(pl.col("flops") > 0)
            .with_columns(tflops=pl.col("flops") / seconds / 1e12,
                          ce_fp32=pl.col("flops") / seconds / fp32_peak,
                          ce_tensor=(pl.col("flops") / seconds / tensor_peak) if tensor_peak else pl.lit(None, pl.Float64))
            .select(*keys, "kernels", "total_ns", "flops", "tflops", "ce_fp32", "ce_tensor", "tensor_core_pct")
            .sort(["flops", *keys], descending=[True] + [False] * len(keys), nulls_last=True))
