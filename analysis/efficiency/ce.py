"""Compute efficiency (the method's equation 8) of every kernel launch in a trace, and its
kernel-time-weighted means per kernel name, layer and library: the `traceq ce` analysis.

CE needs FLOPs, which a trace has only when PyTorch recorded the op shapes
(`emit_nvtx(record_shapes=True)`) or the user describes the model in a spec file
(`analysis.efficiency.modelspec`, `analysis.efficiency.flops`). Each kernel is measured against the peak of the
precision it ran at (`analysis.efficiency.peaks`): TF32 tensor cores against the TF32 peak, FP32 FMAs
against the paper's 2 x clock x FP32 lanes, fp16 against the fp16 peak, so CE never exceeds 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import duckdb
import polars as pl

from traceq.analysis.choices import PRECISIONS, GroupBy
from traceq.analysis.efficiency.peaks import DTYPES, dtype_precision
from traceq.analysis.efficiency.ru import _KEYS, launch_ru
from traceq.analysis.structure.conventions import ITERATION_REGEX
from traceq.analysis.structure.layers import attributed_kernels
from traceq.errors import MissingDataError
from traceq.store import sql_frame

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
    from traceq.analysis.efficiency.peaks import trace_peaks

    busy = sql_frame(con, f"SELECT device_id, sum(dur_ns) AS busy_ns FROM kernels WHERE trace_id = {int(trace_id)} "
                          "GROUP BY 1")
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
    precision (fp64 ... int8), precision_from ('--precision', 'kernel name', 'operator dtype',
    'assumed float32' or 'unknown'), peak_flops (FLOP/s of that precision on the kernel's GPU; null where the
    GPU has none), flops.

    A kernel's precision is `precision` when given, else what its name says
    (`[[precision]]` rules), else its operator's data type (the spec layer's dtype, or the
    recorded input type of the Kineto operator that launched it), else float32; float32 means
    TF32 on a kernel whose name shows tensor cores. An attention kernel is never assumed
    float32: where neither its name nor its operator says, its precision is null ('unknown').

    FLOPs come from the model spec when given (a layer's FLOPs per step times the times its
    range occurs, spread over its convolution and GEMM kernels by `distribute_flops`; the batch
    is `batch`, else what `infer_batch` finds in the trace, else the spec's), else from the op
    shapes PyTorch recorded in the trace (`flops.kernel_flops`). Within a layer or op the FLOPs
    are shared in proportion to each kernel's capacity (time x peak). A spec layer whose FLOPs
    find no kernel in the trace gets a row of its own with a null kernel_id and no time, so the
    FLOPs add up to the spec's (`ce_notes` says which). Raises MissingDataError when the trace
    has neither shapes nor spec.
    """
    from traceq.analysis.efficiency.flops import kernel_op_rows
    from traceq.analysis.efficiency.modelspec import load_spec, spec_layer_flops
    from traceq.analysis.kernels.classify import classify_names

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
    from traceq.analysis.efficiency.flops import kernel_op_rows
    from traceq.analysis.kernels.classify import classify_names

    names = (classify_names(kernels["name"].unique().cast(pl.String))  # names may come categorical
             .select(pl.col("name").cast(kernels.schema["name"]), "operation", "tensor_cores",
                     name_precision="precision"))
    dtypes = kernel_op_rows(con, trace_id).select("kernel_id", "dtype")
    k = kernels.select("kernel_id", "name").join(dtypes, on="kernel_id", how="left", maintain_order="left")
    # a precision depends on the name and the dtype alone: worked out once per pair, a few hundred
    pairs = _with_precision(k.select("name", "dtype").unique().join(names, on="name", how="left"), None)
    return k.join(pairs.select("name", "dtype", "tensor_cores", "precision", "precision_from"), on=["name", "dtype"],
                  how="left", nulls_equal=True, maintain_order="left").select(
        "kernel_id", "tensor_cores", "precision", "precision_from")


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
    config = sql_frame(con, f"SELECT kernel_id, stream_id, {', '.join(shape)} FROM kernels "
                            f"WHERE trace_id = {int(trace_id)}")
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
    occurrences = sql_frame(
        con,
        f"SELECT name AS layer, count(*) AS n FROM nvtx WHERE trace_id = {int(trace_id)} "
        f"AND kind = 'pushpop' GROUP BY name")
    steps = max(kernels["iteration"].drop_nulls().n_unique(), 1)
    return (layers.join(occurrences, on="layer", how="left")
            .with_columns(flops=pl.col("flops") * pl.col("n").fill_null(steps)).drop("n"))


def _with_precision(k: pl.DataFrame, precision: str | None) -> pl.DataFrame:
    """`k` (name_precision, dtype, tensor_cores, operation) with precision and precision_from.
    Attention kernels (FlashAttention, cuDNN's SDPA, fused MHA) run fp16, bf16 or fp8 on tensor
    cores: one whose name and operator say nothing is left unknown, not assumed float32."""
    if precision is not None:
        return k.with_columns(precision=pl.lit(precision), precision_from=pl.lit("--precision"))
    dtype = pl.col("dtype").replace_strict(_DTYPE_PRECISION, default=None)
    by_dtype = pl.when(dtype.eq("fp32") & pl.col("tensor_cores").fill_null(False)).then(pl.lit("tf32")).otherwise(dtype)
    attention = pl.col("operation").eq("attention").fill_null(False) if "operation" in k.columns else pl.lit(False)
    assumed = (pl.when(attention).then(pl.lit(None, pl.String))
               .when(pl.col("tensor_cores").fill_null(False)).then(pl.lit("tf32")).otherwise(pl.lit("fp32")))
    # cuDNN's generated SDPA kernels say `f16` for either 16-bit type: the operator's bf16 decides
    half = pl.col("name_precision").eq("fp16").fill_null(False) & by_dtype.eq("bf16").fill_null(False)
    name_precision = pl.when(half).then(pl.lit(None, pl.String)).otherwise(pl.col("name_precision"))
    return k.with_columns(
        precision=pl.coalesce(name_precision, by_dtype, assumed),
        precision_from=pl.when(name_precision.is_not_null()).then(pl.lit("kernel name"))
        .when(dtype.is_not_null()).then(pl.lit("operator dtype"))
        .when(attention).then(pl.lit("unknown")).otherwise(pl.lit("assumed float32")))


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
    from traceq.analysis.structure.layers import time_split

    by = GroupBy(by)
    ops = None
    if per_kernel is None and spec is None:  # no op with FLOPs: none for any kernel, so no kernel is read
        from traceq.analysis.efficiency.flops import op_flops

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
