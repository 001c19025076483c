"""A roofline position for every kernel that has FLOPs or bytes: the `traceq roofline` analysis.

FLOPs are `ce.kernel_ce`'s (recorded shapes or a model spec). Bytes (DRAM traffic, the
roofline's denominator) come from

- **the DeLTA traffic model** (`traffic.launch_traffic`) for convolution kernels where it has
  their shapes (NVTX shapes or a model spec), and for GEMM kernels the recorded Kineto shapes
  below do not cover;
- **the recorded shapes** of the PyTorch operator that launched the kernel (Kineto
  `record_shapes=True`: Input Dims and Input type) for everything else: each tensor input
  read once plus the output written once, the output being the matrix product's (rows x
  columns, from the FLOPs and the reduced dimension) for GEMMs and convolutions (FLOPs over
  twice the weight's elements per output channel; a convolution's backward writes its input's
  and weight's gradients), the query's shape for
  attention forward and the inputs q, k, v for its backward, and the largest input for
  normalisation, softmax, elementwise and reduction ops; `copy_` writes its first input
  (counted among the inputs), `fill_` and `zero_` only write theirs. An op's bytes are
  spread over its kernels by time.

These are the op's traffic in isolation: every input read once, the output written once. Against
Nsight Compute's dram__bytes on an H200 (tests/test_roofline.py) they are within 5 % for
GEMMs and over by a median 15-34 % for AlexNet's convolutions (54-71 % for ResNet-50's): an
output that fits the L2 is still there when the kernel ends (ResNet-50's layer3.1.conv3 wrote
1.9 MB of its 25.7 MB output to DRAM), written back later. The roof at an arithmetic intensity
I (FLOP/byte) is min(peak FLOP/s of the kernels' precision, I x DRAM bandwidth); the DRAM bandwidth is the
GPU product table's (`gpu_products`, with its sources), the peaks `peaks`'.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import polars as pl

from traceq.analysis.choices import GroupBy
from traceq.analysis.efficiency.flops import FLOP_OPS
from traceq.analysis.structure.conventions import ITERATION_REGEX
from traceq.errors import MissingDataError

_GEMM_K = {"aten::mm": (0, -1), "aten::matmul": (0, -1), "aten::bmm": (0, -1), "aten::linear": (0, -1),
           "aten::addmm": (1, -1), "aten::_addmm_activation": (1, -1), "aten::baddbmm": (1, -1),
           "aten::_scaled_mm": (0, -1)}
"""Where a GEMM op's reduced dimension k is among its input shapes: (input, axis)."""

_NORMS = ("aten::layer_norm", "aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::batch_norm",
          "aten::native_batch_norm", "aten::native_batch_norm_backward", "aten::cudnn_batch_norm",
          "aten::cudnn_batch_norm_backward", "aten::group_norm", "aten::native_group_norm", "aten::rms_norm",
          "aten::_fused_rms_norm", "aten::softmax", "aten::_softmax", "aten::_softmax_backward_data",
          "aten::log_softmax", "aten::_log_softmax", "aten::_log_softmax_backward_data")
_ELEMENTWISE = ("aten::add", "aten::add_", "aten::sub", "aten::mul", "aten::mul_", "aten::div", "aten::div_",
                "aten::relu", "aten::relu_", "aten::threshold_backward", "aten::gelu", "aten::gelu_backward",
                "aten::silu", "aten::silu_backward", "aten::sigmoid", "aten::tanh", "aten::dropout",
                "aten::native_dropout", "aten::native_dropout_backward", "aten::copy_", "aten::fill_",
                "aten::zero_", "aten::sum", "aten::mean", "aten::cat", "aten::addcmul_", "aten::addcdiv_",
                "aten::lerp_", "aten::sqrt", "aten::rsqrt", "aten::pow", "aten::exp", "aten::clamp",
                "aten::max_pool2d_with_indices", "aten::max_pool2d_with_indices_backward")
BYTE_OPS = (*FLOP_OPS, *_NORMS, *_ELEMENTWISE)
"""Operators whose recorded shapes give their kernels bytes (`kernel_bytes` says which one). Gathers
(embedding, nll_loss) are not among them: they read a few rows of their inputs, not all."""

_ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1,
                  "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "signed char": 1,
                  "unsigned char": 1, "bool": 1, "int": 4, "long int": 8, "short int": 2}

_KEYS = {GroupBy.layer: ["layer", "pass", "operation"], GroupBy.kernel: ["name"], GroupBy.library: ["library"]}

NO_POINTS = ("no kernel has FLOPs or bytes: the roofline needs recorded shapes (Kineto record_shapes=True, or "
             "emit_nvtx(record_shapes=True) for FLOPs) or --spec model.toml (docs/flops.md)")


def operator_bytes(op: str, input_dims: str | None, input_types: str | None, flops: int | None = None) -> int | None:
    """The bytes one operator moves (module docstring), from Kineto's Input Dims and
    Input type (JSON text); `flops`: a GEMM's FLOPs, which give its output's size. None when the
    shapes say nothing."""
    try:
        dims = json.loads(input_dims) if input_dims else None
        types = json.loads(input_types) if input_types else None
    except ValueError:
        return None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    tensors = [(math.prod(d), _ELEMENT_BYTES[t]) for d, t in zip(dims, types)
               if isinstance(d, list) and d and all(isinstance(x, int) and x >= 0 for x in d)
               and isinstance(t, str) and t in _ELEMENT_BYTES]
    if not tensors:
        return None
    read = sum(n * b for n, b in tensors)
    element = tensors[0][1]
    if op in _GEMM_K:
        where, axis = _GEMM_K[op]
        shape = dims[where] if where < len(dims) and isinstance(dims[where], list) and dims[where] else None
        k = shape[axis] if shape else 0
        out = (flops or 0) // (2 * k) if k else 0
        return read + out * (2 if op == "aten::_scaled_mm" else element)
    if "attention" in op:
        if "backward" in op:  # dq, dk, dv: the sizes of q, k, v (inputs 1 to 3 after the output's gradient)
            return read + sum(n * b for n, b in tensors[1:4])
        return read + tensors[0][0] * element  # the output has the query's shape (head dims equal)
    if op == "aten::copy_":
        return read
    if op in ("aten::fill_", "aten::zero_"):  # written, never read
        return max(n * b for n, b in tensors)
    if op == "aten::convolution_backward":  # the input's and the weight's gradients
        return read + sum(n * b for n, b in tensors[1:3])
    if "conv" in op:  # output elements: FLOPs / (2 x weight elements per output channel)
        w = dims[1] if len(dims) > 1 and isinstance(dims[1], list) and dims[1] else None
        if not flops or not w or "transpose" in op:
            return None
        return read + flops * w[0] // (2 * math.prod(w)) * element
    if op in FLOP_OPS:
        return None
    largest = max(tensors)
    return read + largest[0] * largest[1]


def kernel_bytes(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """kernel_id, bytes (Float64): each kernel's share, by time, of the bytes of the BYTE_OPS
    operator that launched it: the innermost one open on its launching thread at the launch
    (an `aten::addmm` inside `aten::linear`: under autocast only the inner op records the types
    it ran in), else the outermost one (Kineto traces with recorded shapes; empty otherwise)."""
    t = int(trace_id)
    names = ", ".join(f"'{op}'" for op in BYTE_OPS)
    ops = con.sql(f"""
        SELECT pid, tid, start_ns, end_ns, name AS op, input_dims, input_types, concrete_inputs,
               coalesce(max(end_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns, end_ns DESC
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) < end_ns, true) AS outer
        FROM operators WHERE trace_id = {t} AND name IN ({names})""").pl()
    empty = pl.DataFrame(schema={"kernel_id": pl.Int64, "bytes": pl.Float64})
    if ops.is_empty():
        return empty
    from traceq.analysis.efficiency.flops import _operator_flops

    shapes = ops.select("op", "input_dims", "input_types", "concrete_inputs").unique()
    counted = FLOP_OPS  # a GEMM's or convolution's output size comes from its FLOPs
    shapes = shapes.with_columns(op_bytes=pl.Series(
        [operator_bytes(op, d, ty, _operator_flops(op, d, c) if op in counted else None)
         for op, d, ty, c in shapes.iter_rows()], dtype=pl.Int64))
    ops = (ops.join(shapes, on=["op", "input_dims", "input_types", "concrete_inputs"], how="left", nulls_equal=True)
           .sort("start_ns").with_row_index("op_row"))
    launches = con.sql(f"SELECT kernel_id, pid, launch_tid AS tid, launch_start_ns, dur_ns FROM kernel_launches "
                       f"WHERE trace_id = {t} AND launch_start_ns IS NOT NULL").pl().sort("launch_start_ns")
    if launches.is_empty():
        return empty
    columns = ["op_row", "pid", "tid", "start_ns", "end_ns", "op_bytes"]

    def within(candidates: pl.DataFrame, suffix: str) -> pl.DataFrame:
        found = launches.join_asof(candidates.select(columns), left_on="launch_start_ns", right_on="start_ns",
                                   by=["pid", "tid"], strategy="backward", check_sortedness=False)
        inside = pl.col("launch_start_ns") <= pl.col("end_ns")
        return found.select("kernel_id", pl.when(inside).then(pl.col("op_row")).alias(f"row{suffix}"),
                            pl.when(inside).then(pl.col("op_bytes")).alias(f"bytes{suffix}"))

    k = (launches.select("kernel_id", "dur_ns")
         .join(within(ops, "_inner"), on="kernel_id").join(within(ops.filter(pl.col("outer")), "_outer"), on="kernel_id")
         .with_columns(op_row=pl.coalesce("row_inner", "row_outer"),
                       op_bytes=pl.when(pl.col("row_inner").is_not_null()).then(pl.col("bytes_inner"))
                       .otherwise(pl.col("bytes_outer")))
         .filter(pl.col("op_bytes") > 0))
    weight = pl.col("dur_ns").cast(pl.Float64) + 1.0  # a 0 ns kernel still gets a share
    return (k.with_columns(bytes=pl.col("op_bytes") * weight / weight.sum().over("op_row"))
            .select(pl.col("kernel_id").cast(pl.Int64), "bytes").sort("kernel_id"))


def kernel_roofline(per_kernel: pl.DataFrame, model_bytes: pl.DataFrame, shape_bytes: pl.DataFrame) -> pl.DataFrame:
    """`per_kernel` (`kernel_ce`'s frame) with bytes: the DeLTA model's DRAM bytes for
    convolution kernels (`model_bytes`: kernel_id, dram_bytes), else the recorded shapes'
    (`shape_bytes`: kernel_id, bytes), else the model's (a GEMM of a spec layer);
    bytes_from says which ('traffic model', 'shapes')."""
    k = per_kernel.filter(pl.col("kernel_id").is_not_null())
    model = model_bytes.select("kernel_id", model_bytes=pl.col("dram_bytes").cast(pl.Float64))
    k = k.join(model, on="kernel_id", how="left").join(shape_bytes, on="kernel_id", how="left")
    conv = (pl.col("operation") == "convolution") & pl.col("model_bytes").is_not_null()
    shapes = pl.col("bytes").is_not_null()
    return k.with_columns(
        bytes=pl.when(conv).then(pl.col("model_bytes")).when(shapes).then(pl.col("bytes"))
        .otherwise(pl.col("model_bytes")),
        bytes_from=pl.when(conv).then(pl.lit("traffic model")).when(shapes).then(pl.lit("shapes"))
        .when(pl.col("model_bytes").is_not_null()).then(pl.lit("traffic model"))).drop("model_bytes")


def roofline_table(kernels: pl.DataFrame, dram_bytes_per_s: float, by: GroupBy | str = GroupBy.layer) -> pl.DataFrame:
    """The roofline position of each group of `kernels` (`kernel_roofline`'s frame) that has
    FLOPs or bytes, on a GPU of `dram_bytes_per_s` DRAM bandwidth; most time first.

    Columns: the keys (layer, pass, operation | name | library), precision (of the group's
    longest FLOP-carrying kernel), kernels, total_ns, flops, bytes, intensity (FLOP/byte;
    null without both), tflops and tbps (achieved TFLOP/s, TB/s), peak_tflops (time-weighted
    peak of the FLOP-carrying kernels' precisions), bound_tflops (the roof at that intensity:
    min(peak, intensity x bandwidth)), roof ('memory' or 'compute'; 'memory' for a group with
    bytes and no FLOPs), achieved_pct (of the roof: FLOP/s over it where there are FLOPs,
    bytes/s over the bandwidth where there are none).
    """
    by = GroupBy(by)
    keys = _KEYS[by]
    k = kernels.filter((pl.col("flops") > 0) | (pl.col("bytes") > 0))
    if k.is_empty():
        raise MissingDataError(NO_POINTS)
    carries = pl.col("flops") > 0
    frame = k.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("kernels"),
        pl.col("dur_ns").sum().cast(pl.Int64).alias("total_ns"),
        pl.col("flops").sum(),
        pl.col("bytes").sum(),
        pl.col("bytes").is_null().any().alias("bytes_unknown"),
        pl.col("precision").filter(carries).sort_by(pl.col("dur_ns").filter(carries), descending=True).first(),
        (pl.col("dur_ns") * pl.col("peak_flops")).filter(carries).sum().alias("capacity"),
        pl.col("dur_ns").filter(carries & pl.col("peak_flops").is_not_null()).sum().alias("carrier_ns"))
    frame = frame.with_columns(peak=pl.when(pl.col("carrier_ns") > 0).then(pl.col("capacity") / pl.col("carrier_ns")))
    seconds = pl.col("total_ns") * 1e-9
    has_flops, has_bytes = pl.col("flops") > 0, (pl.col("bytes") > 0) & ~pl.col("bytes_unknown")
    intensity = pl.when(has_flops & has_bytes).then(pl.col("flops") / pl.col("bytes"))
    frame = frame.with_columns(
        intensity=intensity,
        tflops=pl.when(has_flops & (pl.col("total_ns") > 0)).then(pl.col("flops") / seconds / 1e12),
        tbps=pl.when(has_bytes & (pl.col("total_ns") > 0)).then(pl.col("bytes") / seconds / 1e12),
        peak_tflops=pl.col("peak") / 1e12,
        bytes=pl.when(has_bytes).then(pl.col("bytes")))
    memory_roof = pl.col("intensity") * dram_bytes_per_s / 1e12
    frame = frame.with_columns(
        bound_tflops=pl.min_horizontal(pl.col("peak_tflops"), memory_roof),
        roof=pl.when(pl.col("intensity").is_not_null() & (memory_roof < pl.col("peak_tflops"))).then(pl.lit("memory"))
        .when(pl.col("intensity").is_not_null()).then(pl.lit("compute"))
        .when(has_bytes & ~has_flops).then(pl.lit("memory")))
    frame = frame.with_columns(achieved_pct=pl.when(pl.col("intensity").is_not_null())
                               .then(100 * pl.col("tflops") / pl.col("bound_tflops"))
                               .when(pl.col("roof") == "memory")
                               .then(100 * pl.col("tbps") * 1e12 / dram_bytes_per_s))
    columns = [*keys, "precision", "kernels", "total_ns", "flops", "bytes", "intensity", "tflops", "tbps",
               "peak_tflops", "bound_tflops", "roof", "achieved_pct"]
    return frame.select(columns).sort(["total_ns", *keys], descending=[True] + [False] * len(keys), nulls_last=True)


def trace_roofline(con: duckdb.DuckDBPyConnection, trace_id: int, per_kernel: pl.DataFrame,
                   by: GroupBy | str = GroupBy.layer, *, spec: Path | None = None, batch: int | None = None,
                   iteration_regex: str = ITERATION_REGEX, kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """`roofline_table` of a trace: `per_kernel` (its `ce.kernel_ce`) with bytes from the DeLTA
    model (`traffic.launch_traffic`, where it has shapes) and from the recorded shapes
    (`kernel_bytes`), on the trace's GPU's DRAM bandwidth; `kernels`: its attributed kernels,
    when the caller has them. Raises MissingDataError when no kernel has FLOPs or bytes."""
    from traceq.analysis.efficiency.gpu_products import trace_gpu
    from traceq.analysis.efficiency.traffic import launch_traffic

    try:
        model = launch_traffic(con, trace_id, spec=spec, batch=batch, iteration_regex=iteration_regex,
                               kernels=kernels).select("kernel_id", "dram_bytes")
    except MissingDataError:
        model = pl.DataFrame(schema={"kernel_id": pl.Int64, "dram_bytes": pl.Float64})
    roofline = kernel_roofline(per_kernel, model, kernel_bytes(con, trace_id))
    return roofline_table(roofline, trace_gpu(con, trace_id).dram_bytes_per_s, GroupBy(by))
