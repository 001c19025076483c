"""FLOPs of a training step, the numerator of compute efficiency (CE), from one of two sources:

- **a model-spec file** (`analysis.efficiency.modelspec.spec_layer_flops`): a TOML file describing the
  network layer by layer, the method's own approach (format in docs/flops.md);
- **the op shapes PyTorch writes into NVTX** under
  `torch.autograd.profiler.emit_nvtx(record_shapes=True)` (`op_flops`, `kernel_flops`):
  `aten::conv2d, seq = 356, op_id = 9, sizes = [[32, 3, 224, 224], [64, 3, 7, 7], ...],
  input_op_ids = [(1,0), ...]`.

FLOP counts (bias and the like aside; a multiply-add is 2 FLOP): a convolution does
2 x N x (output positions) x (weight elements) = 2 N Co Ho Wo (Ci/groups) KH KW, a linear layer
2 x (rows) x in x out, a matrix product 2 m k n per batch entry. A backward pass does the same
count once for the data gradient and once for the weight gradient, and skips the data gradient
where nothing needs it: the first layer, whose input does not require grad.
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import polars as pl

from traceq.analysis.efficiency.modelspec import load_spec, spec_layer_flops
from traceq.analysis.efficiency.transformer_flops import TRANSFORMER_FLOP_OPS, transformer_op_flops
from traceq.analysis.kernels.classify import classify_names
from traceq.analysis.structure.attribution import kernel_attribution
from traceq.errors import MissingDataError
from traceq.store import first_row, registered, sql_frame

__all__ = ["FLOP_OPS", "kernel_flops", "kernel_op_rows", "layer_flops", "load_spec", "op_flops", "op_shapes",
           "spec_layer_flops"]

_CONV = ("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
         "aten::cudnn_convolution", "aten::miopen_convolution", "aten::mkldnn_convolution",
         "aten::_convolution_mode", "aten::conv_transpose1d", "aten::conv_transpose2d",
         "aten::conv_transpose3d", "aten::cudnn_convolution_transpose")
_GEMM = ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::_addmm_activation",
         "aten::bmm", "aten::baddbmm")
_CONV_BACKWARD = "aten::convolution_backward"
FLOP_OPS = (*_CONV, *_GEMM, _CONV_BACKWARD, *TRANSFORMER_FLOP_OPS)
"""ATen ops (and flash_attn's) whose ranges carry FLOPs; nested ones count once, at the outermost.
Attention, `_scaled_mm` and grouped GEMMs: `transformer_flops`."""

_NO_SHAPES = ("no layer shapes in this trace: record it under torch.autograd.profiler."
              "emit_nvtx(record_shapes=True), or pass --spec model.toml (see docs/flops.md)")
_SIZES = "TRY_CAST(split_part(split_part(name, ', sizes = ', 2), ', input_op_ids = ', 1) AS BIGINT[][])"


def op_flops(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """FLOPs of every FLOP-bearing ATen op range that emit_nvtx(record_shapes=True) recorded.

    Columns: pid, tid, start_ns, end_ns (the range in the `nvtx` table), op ('aten::conv2d'),
    pass ('forward', or 'backward' inside an autograd `...Backward...` range), flops (Int64),
    dtype (null: NVTX ranges do not record it; a Kineto operator's first tensor input type, as
    `peaks.DTYPES` names it). One row per outermost range of FLOP_OPS.

    A forward convolution's output size comes from the op that consumes it (`input_op_ids`);
    one whose output no op consumed is left out. `aten::convolution_backward` records
    grad_output, input and weight shapes; it counts the data gradient when an op consumes its
    output 0 and the weight gradient when one consumes output 1 (both when the trace has no
    input_op_ids). Backward matrix products are their own `aten::mm` ranges. Empty when the
    trace has no shapes.
    """
    if first_row(con, "SELECT 1 FROM operators WHERE trace_id = ? LIMIT 1", [int(trace_id)]):
        return _kineto_op_flops(con, trace_id)
    return op_shapes(con, trace_id).select("pid", "tid", "start_ns", "end_ns", "op", "pass", "flops", "dtype")


def op_shapes(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """`op_flops`' rows (same order) with the shapes they were counted from: op_row (0, 1, ...),
    pid, tid, start_ns, end_ns, op, pass, sizes (the recorded input shapes), out_shapes (shapes
    of output 0 where ops consumed it), data_used, weight_used (`aten::convolution_backward`'s
    outputs 0 and 1 consumed), has_ids, flops, dtype."""
    ops = _op_ranges(con, trace_id)
    columns = ["pid", "tid", "start_ns", "end_ns", "op", "pass", "sizes", "out_shapes", "data_used", "weight_used",
               "has_ids", "flops", "dtype"]
    if ops.is_empty():
        shapes = pl.List(pl.List(pl.Int64))
        return (_empty_op_flops().with_columns(sizes=pl.lit(None, shapes), out_shapes=pl.lit(None, shapes),
                                               data_used=pl.lit(None, pl.Boolean),
                                               weight_used=pl.lit(None, pl.Boolean),
                                               has_ids=pl.lit(None, pl.Boolean))
                .select(columns).with_row_index("op_row"))
    uses = _consumers(con, trace_id, ops.filter(pl.col("needs_uses"))["op_id"].to_list())
    shaped = ops.join(uses, on="op_id", how="left").with_columns(
        pl.col("data_used", "weight_used").fill_null(False))
    keys = ["op", "sizes", "out_shapes", "data_used", "weight_used", "has_ids"]
    counts = shaped.select(keys).unique()
    counts = counts.with_columns(flops=pl.Series(
        [_range_flops(*row) for row in counts.iter_rows()], dtype=pl.Int64))
    return (shaped.join(counts, on=keys, how="left", nulls_equal=True)
            .filter(pl.col("flops").is_not_null())
            .with_columns(dtype=pl.lit(None, pl.String))
            .select(columns)
            .sort("pid", "tid", "start_ns")
            .with_row_index("op_row"))


def kernel_flops(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """Each op's FLOPs (op_flops) spread over the kernels launched inside its range.

    A kernel belongs to the op range open on its launching thread (same pid and tid) at the
    launch call. Within one op, kernels that `classify_names` calls convolution or gemm share
    the FLOPs pro rata by duration, helpers (layout transforms, fills) get 0; an op that
    launched no convolution or gemm kernel spreads them over all its kernels. Integer shares
    sum exactly to each op's FLOPs (the remainder goes to the longest kernel).

    Columns: kernel_id, flops (Int64), op, pass, dtype (the op's, as `op_flops` gives it),
    source ('nvtx shapes'); only kernels inside FLOP-bearing ranges, ordered by kernel_id.
    """
    return _kernel_shares(con, trace_id).drop("op_row")


def kernel_op_rows(con: duckdb.DuckDBPyConnection, trace_id: int, ops: pl.DataFrame | None = None) -> pl.DataFrame:
    """`kernel_flops` with op_row, the row of `op_shapes` (pass it when you have it) that each
    kernel belongs to (for spreading an op's FLOPs otherwise: `efficiency.kernel_ce` spreads
    them by time x peak)."""
    return _kernel_shares(con, trace_id, ops)


def _kernel_shares(con: duckdb.DuckDBPyConnection, trace_id: int, ops: pl.DataFrame | None = None) -> pl.DataFrame:
    """kernel_flops with op_row, the number of the op range each kernel belongs to (the row of
    `op_shapes` for emit_nvtx ranges, of `op_flops` for Kineto operators)."""
    ops = (op_flops(con, trace_id).with_row_index("op_row") if ops is None else ops).select(
        "op_row", "pid", "tid", "start_ns", "end_ns", "op", "pass", "flops", "dtype")
    t = int(trace_id)
    launches = sql_frame(  # no op ranges: no launch is read (the frame keeps its columns)
        con,
        f"SELECT kernel_id, pid, launch_tid AS tid, launch_start_ns, dur_ns FROM kernel_launches "
        f"WHERE trace_id = {t} AND launch_start_ns IS NOT NULL{' AND false' if ops.is_empty() else ''}"
    ).sort("launch_start_ns")
    inside = (launches.join_asof(ops.sort("start_ns"), left_on="launch_start_ns", right_on="start_ns",
                                 by=["pid", "tid"], strategy="backward", check_sortedness=False)
              .filter(pl.col("launch_start_ns") <= pl.col("end_ns")))
    # names by their ids: a million launches would otherwise each carry their kernel's name
    name_ids = sql_frame(con, f"SELECT kernel_id, name_id FROM kernel_events WHERE trace_id = {t}"
                              f"{' AND false' if inside.is_empty() else ''}")
    names = sql_frame(con, f"SELECT name_id, name FROM kernel_names WHERE trace_id = {t}")
    inside = (inside.join(name_ids, on="kernel_id", how="left", maintain_order="left")
              .join(names, on="name_id", how="left", maintain_order="left").drop("name_id"))
    classes = classify_names(inside["name"].unique()).select(
        "name", compute=pl.col("operation").is_in(["convolution", "gemm", "attention"]))
    k = inside.join(classes, on="name", how="left").with_columns(pl.col("compute").fill_null(False))
    by_op = pl.col("op_row")
    k = k.with_columns(weight=pl.when(pl.col("compute").any().over(by_op))
                       .then(pl.when(pl.col("compute")).then(pl.col("dur_ns")).otherwise(0))
                       .otherwise(pl.col("dur_ns")).cast(pl.Float64))
    k = k.with_columns(weight=pl.when(pl.col("weight").sum().over(by_op) > 0).then(pl.col("weight"))
                       .otherwise(1.0))
    k = k.with_columns(share=(pl.col("flops") * pl.col("weight") / pl.col("weight").sum().over(by_op))
                       .floor().cast(pl.Int64))
    longest = pl.struct(-pl.col("weight"), pl.col("kernel_id")).rank("ordinal").over(by_op) == 1
    k = k.with_columns(share=pl.col("share") + pl.when(longest).then(
        pl.col("flops") - pl.col("share").sum().over(by_op)).otherwise(0))
    return (k.select("kernel_id", pl.col("share").alias("flops"), "op", "pass", "dtype",
                     source=pl.lit("nvtx shapes"), op_row=pl.col("op_row")).sort("kernel_id"))


def layer_flops(con: duckdb.DuckDBPyConnection, trace_id: int, spec_path: str | Path | None = None,
                batch: int | None = None) -> pl.DataFrame:
    """FLOPs per layer and pass over the whole trace, keyed like `layers.layer_times`.

    With `spec_path`: the spec's per-step FLOPs times the number of times the layer's NVTX
    range ran in the trace. Without: kernel_flops summed over the `layer` and `pass` that
    `attribution.kernel_attribution` gives each kernel (for a trace with only emit_nvtx ranges,
    the innermost op range, e.g. 'aten::cudnn_convolution'). Columns: layer, pass, calls (range
    runs, or op ranges), flops (Int64), source ('spec' | 'nvtx shapes'). Raises MissingDataError
    when the trace has no shapes and no spec is given.
    """
    t = int(trace_id)
    if spec_path is not None:
        runs = sql_frame(con, f"SELECT name AS layer, count(*)::BIGINT AS calls FROM nvtx "
                              f"WHERE trace_id = {t} AND kind = 'pushpop' GROUP BY name")
        return (spec_layer_flops(spec_path, batch).join(runs, on="layer", how="left")
                .with_columns(pl.col("calls").fill_null(0))
                .select("layer", "pass", "calls", flops=pl.col("flops") * pl.col("calls"),
                        source=pl.lit("spec")))
    per_kernel = _kernel_shares(con, trace_id)
    if per_kernel.is_empty():
        raise MissingDataError(_NO_SHAPES)
    context = kernel_attribution(con, trace_id, paths=False).select("kernel_id", "layer", "pass")
    return (per_kernel.drop("pass").join(context, on="kernel_id", how="left")
            .group_by("layer", "pass", maintain_order=True)
            .agg(calls=pl.col("op_row").n_unique().cast(pl.Int64), flops=pl.col("flops").sum().cast(pl.Int64))
            .filter(pl.col("flops") > 0)
            .select("layer", "pass", "calls", "flops", source=pl.lit("nvtx shapes"))
            .sort("flops", "layer", descending=[True, False], nulls_last=True))


def _op_ranges(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """The outermost FLOP_OPS ranges with pass, op_id and sizes (BIGINT[][], null if unparsable).

    A running max of end times over the ranges that began earlier on the same thread tells
    whether an earlier FLOP range (or an autograd Backward range) still encloses this one.
    """
    flop_ops = ", ".join(f"'{op}'" for op in FLOP_OPS)
    return sql_frame(
        con,
        rf"""
        WITH r AS (
            SELECT pid, tid, start_ns, end_ns, name, regexp_extract(name, '^([^,]+)', 1) AS op
            FROM nvtx
            WHERE trace_id = {int(trace_id)} AND kind = 'pushpop' AND end_ns IS NOT NULL
              AND (name LIKE '%, sizes = %' OR name LIKE '%Backward%')
        ),
        m AS (
            SELECT *, op IN ({flop_ops}) AND name LIKE '%, sizes = %' AS is_flop,
                   max(CASE WHEN op IN ({flop_ops}) THEN end_ns END) OVER w AS flop_cover,
                   max(CASE WHEN name LIKE '%Backward%' THEN end_ns END) OVER w AS backward_cover
            FROM r
            WINDOW w AS (PARTITION BY pid, tid ORDER BY start_ns, end_ns DESC
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
        )
        SELECT pid, tid, start_ns, end_ns, op,
               CASE WHEN op = '{_CONV_BACKWARD}' OR backward_cover >= end_ns THEN 'backward'
                    ELSE 'forward' END AS pass,
               TRY_CAST(regexp_extract(name, ', op_id = (\d+)', 1) AS BIGINT) AS op_id,
               {_SIZES} AS sizes,
               name LIKE '%, input_op_ids = %' AS has_ids,
               op IN ({", ".join(f"'{op}'" for op in (*_CONV, _CONV_BACKWARD))})
                   AND name LIKE '%, input_op_ids = %' AS needs_uses
        FROM m
        WHERE is_flop AND (flop_cover IS NULL OR flop_cover < end_ns)
        """
    )


def _consumers(con: duckdb.DuckDBPyConnection, trace_id: int, op_ids: list[int]) -> pl.DataFrame:
    """For each op id: out_shapes (distinct shapes of its output 0 where other ops take it as
    input), data_used (output 0 consumed), weight_used (output 1 consumed)."""
    empty = pl.DataFrame(schema={"op_id": pl.Int64, "out_shapes": pl.List(pl.List(pl.Int64)),
                                 "data_used": pl.Boolean, "weight_used": pl.Boolean})
    if not op_ids:
        return empty
    pair = r"'\((\d+),(-?\d+)\)'"
    uses = sql_frame(
        con,
        rf"""
        WITH ids AS MATERIALIZED (  -- once: row numbers the ranges for the join below
            SELECT row_number() OVER () AS row, name, split_part(name, ', input_op_ids = ', 2) AS ids
            FROM nvtx
            WHERE trace_id = {int(trace_id)} AND kind = 'pushpop' AND name LIKE '%, input_op_ids = %'
        ),
        wanted AS (SELECT unnest($ids::BIGINT[]) AS op_id),
        hits AS (  -- cheap first pass: the ranges that take output 0 or 1 of a wanted op
            SELECT DISTINCT row FROM (
                SELECT row, unnest(regexp_extract_all(ids, '\((\d+),[01]\)', 1))::BIGINT AS op_id FROM ids)
            JOIN wanted USING (op_id)
        ),
        c AS (
            SELECT name, regexp_extract_all(ids, {pair}, 1) AS srcs, regexp_extract_all(ids, {pair}, 2) AS outs
            FROM hits JOIN ids USING (row)
        ),
        u AS (
            SELECT name, unnest(srcs)::BIGINT AS op_id, unnest(outs)::BIGINT AS output,
                   generate_subscripts(srcs, 1) AS position
            FROM c
        )
        SELECT u.op_id,
               list(DISTINCT ({_SIZES})[u.position]) FILTER (WHERE u.output = 0) AS out_shapes,
               bool_or(u.output = 0) AS data_used, bool_or(u.output = 1) AS weight_used
        FROM u JOIN wanted USING (op_id)
        WHERE u.output IN (0, 1)
        GROUP BY u.op_id
        """,
        params={"ids": op_ids},
    )
    return uses.cast(empty.schema) if not uses.is_empty() else empty


def _range_flops(op: str, sizes: list[list[int]] | None, out_shapes: list[list[int]] | None,
                 data_used: bool, weight_used: bool, has_ids: bool) -> int | None:
    """FLOPs of one op range from its recorded shapes; None when they do not determine it."""
    if not sizes or len(sizes) < 2:
        return None
    if op == _CONV_BACKWARD:  # sizes: grad_output [N, Co, *out], input, weight [Co, Ci/g, *k]
        grad_out, weight = sizes[0], sizes[2] if len(sizes) > 2 else []
        if len(grad_out) < 3 or len(weight) != len(grad_out):
            return None
        grads = (data_used or not has_ids) + (weight_used or not has_ids)
        return grads * 2 * grad_out[0] * math.prod(grad_out[2:]) * math.prod(weight)
    if op in _CONV:  # sizes: input [N, C, *in], weight
        x, weight = sizes[0], sizes[1]
        if len(x) < 3 or len(weight) != len(x):
            return None
        if "transpose" in op:  # weight [Ci, Co/g, *k]: each input position meets the kernel
            return 2 * x[0] * math.prod(x[2:]) * math.prod(weight)
        fits = [s for s in out_shapes or [] if s and len(s) == len(x) and s[0] == x[0] and s[1] == weight[0]]
        return 2 * x[0] * math.prod(fits[0][2:]) * math.prod(weight) if fits else None
    if op in TRANSFORMER_FLOP_OPS:  # NVTX ranges record no is_causal: attention counts as not causal
        return transformer_op_flops(op, sizes, None)
    return _gemm_flops(op, sizes)


def _gemm_flops(op: str, sizes: list[list[int]]) -> int | None:
    if op == "aten::linear":  # input [..., in], weight [out, in]
        x, w = sizes[0], sizes[1]
        return 2 * math.prod(x[:-1]) * x[-1] * w[0] if x and len(w) == 2 and w[1] == x[-1] else None
    first = 1 if op in ("aten::addmm", "aten::_addmm_activation", "aten::baddbmm") else 0
    if len(sizes) < first + 2:
        return None
    a, b = sizes[first], sizes[first + 1]
    if not a or not b:
        return None
    a, b = (a if len(a) > 1 else [1, *a]), (b if len(b) > 1 else [*b, 1])
    if a[-1] != b[-2]:
        return None
    batch_a, batch_b = a[:-2], b[:-2]
    width = max(len(batch_a), len(batch_b))
    batch = [max(x, y) for x, y in zip([1] * (width - len(batch_a)) + batch_a,
                                       [1] * (width - len(batch_b)) + batch_b)]
    return 2 * math.prod(batch) * a[-2] * a[-1] * b[-1]


def _kineto_op_flops(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """`op_flops` from a Kineto trace's operators (record_shapes=True): shapes from Input Dims,
    stride, padding, dilation, groups and output_mask from Concrete Inputs, so a forward
    convolution's output size is computed, not looked up. Outermost FLOP_OPS only, as for NVTX.

    The operators' text columns stay in DuckDB: Python counts the FLOPs of each distinct
    (op, Input Dims, Concrete Inputs) and the dtype of each distinct Input type, a few thousand
    where a trace has hundreds of thousands of operators."""
    flop_ops = ", ".join(f"'{op}'" for op in FLOP_OPS)
    t = int(trace_id)
    ops_cte = f"""
        WITH o AS (
            SELECT pid, tid, start_ns, end_ns, name AS op, input_dims, concrete_inputs, input_types,
                   max(end_ns) OVER w AS cover
            FROM operators WHERE trace_id = {t} AND name IN ({flop_ops})
            WINDOW w AS (PARTITION BY pid, tid ORDER BY start_ns, end_ns DESC
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
        ),
        outermost AS (SELECT * EXCLUDE (cover) FROM o WHERE cover IS NULL OR cover < end_ns)"""
    distinct = sql_frame(con, f"{ops_cte} SELECT DISTINCT op, input_dims, concrete_inputs, input_types FROM outermost")
    if distinct.is_empty():
        return _empty_op_flops()
    shapes = distinct.select("op", "input_dims", "concrete_inputs").unique()
    shapes = shapes.with_columns(flops=pl.Series([_operator_flops(*row) for row in shapes.iter_rows()],
                                                 dtype=pl.Int64)).filter(pl.col("flops").is_not_null())
    types = distinct.select("input_types").unique()
    types = types.with_columns(dtype=pl.Series([_operator_dtype(t) for t in types["input_types"]], dtype=pl.String))
    with registered(con, shapes=shapes, types=types) as rel:
        return sql_frame(con, f"""{ops_cte},
            counted AS (
                SELECT o.pid, o.tid, o.start_ns, o.end_ns, o.op, s.flops, ty.dtype
                FROM outermost o
                JOIN {rel['shapes']} s ON s.op = o.op AND s.input_dims IS NOT DISTINCT FROM o.input_dims
                     AND s.concrete_inputs IS NOT DISTINCT FROM o.concrete_inputs
                LEFT JOIN {rel['types']} ty ON ty.input_types IS NOT DISTINCT FROM o.input_types
            ),
            -- an op is inside a backward range when one starting at or before it ends at or after
            -- it: the running maximum of those ranges' ends in start order (a backward range first
            -- at equal starts), not a search of every range per op
            timeline AS (
                SELECT pid, tid, start_ns, end_ns AS backward_end, NULL AS end_ns, NULL AS op, NULL AS flops,
                       NULL AS dtype, 0 AS place
                FROM nvtx WHERE trace_id = {t} AND domain = 'cpu_op' AND name LIKE '%Backward%'
                UNION ALL
                SELECT pid, tid, start_ns, NULL, end_ns, op, flops, dtype, 1 FROM counted
            ),
            covered AS (
                SELECT *, max(backward_end) OVER (PARTITION BY pid, tid ORDER BY start_ns, place
                                                  ROWS UNBOUNDED PRECEDING) AS backward_cover
                FROM timeline
            )
            SELECT pid, tid, start_ns, end_ns::BIGINT AS end_ns, op::VARCHAR AS op,
                   CASE WHEN op = '{_CONV_BACKWARD}' OR backward_cover >= end_ns
                        THEN 'backward' ELSE 'forward' END AS pass,
                   flops::BIGINT AS flops, dtype::VARCHAR AS dtype
            FROM covered WHERE place = 1
            ORDER BY pid, tid, start_ns, end_ns, op
        """)


_CONV_ARGS = {  # positions of stride, padding, dilation, groups among an op's inputs (ATen signatures)
    "aten::conv1d": (3, 4, 5, 6), "aten::conv2d": (3, 4, 5, 6), "aten::conv3d": (3, 4, 5, 6),
    "aten::convolution": (3, 4, 5, 8), "aten::_convolution": (3, 4, 5, 8),
}


def _operator_flops(op: str, input_dims: str | None, concrete_inputs: str | None) -> int | None:
    """FLOPs of one Kineto operator from its Input Dims and Concrete Inputs (JSON text)."""
    import json

    try:
        sizes = json.loads(input_dims) if input_dims else None
        scalars = json.loads(concrete_inputs) if concrete_inputs else []
    except ValueError:
        return None
    if not sizes or len(sizes) < 2 or not all(isinstance(s, list) for s in sizes):
        return None
    if op == _CONV_BACKWARD:
        mask = _parsed(scalars[-1]) if scalars else None
        used = isinstance(mask, list) and len(mask) >= 2
        return _range_flops(op, sizes, None, bool(mask[0]) if used else True, bool(mask[1]) if used else True,
                            used)
    if op in _CONV_ARGS:
        x, w = sizes[0], sizes[1]
        where = _CONV_ARGS[op]
        values = [_parsed(scalars[i]) if i < len(scalars) else None for i in where]
        if len(x) < 3 or len(w) != len(x) or any(v is None for v in values) or "transposed" in op:
            return None
        dims = len(x) - 2
        stride, padding, dilation = ([v] * dims if isinstance(v, int) else v for v in values[:3])
        out = [(i + 2 * p - d * (k - 1) - 1) // s + 1
               for i, p, d, k, s in zip(x[2:], padding, dilation, w[2:], stride)]
        return 2 * x[0] * math.prod(out) * math.prod(w)
    if op in _CONV:
        return None
    if op in TRANSFORMER_FLOP_OPS:
        return transformer_op_flops(op, sizes, [_parsed(v) for v in scalars])
    return _gemm_flops(op, sizes)


_TYPE_DTYPE = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
               "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
               "c10::Float8_e5m2fnuz": "fp8", "signed char": "int8"}


def _operator_dtype(input_types: str | None) -> str | None:
    """The data type (`peaks.DTYPES`) of an operator's first tensor input, from Kineto's Input
    type list ('["c10::Half", "c10::Half"]' -> 'float16'); None when no input names one."""
    import json

    try:
        types = json.loads(input_types) if input_types else []
    except ValueError:
        return None
    return next((_TYPE_DTYPE[t] for t in types if isinstance(t, str) and t in _TYPE_DTYPE), None)


def _parsed(text: object) -> object:
    """A Concrete Inputs value ('[4, 4]', '1', 'False') as a Python value; None when empty."""
    if not isinstance(text, str) or not text:
        return None
    text = text.replace("True", "true").replace("False", "false")
    try:
        import json

        return json.loads(text)
    except ValueError:
        return None


def _empty_op_flops() -> pl.DataFrame:
    return pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                "op": pl.String, "pass": pl.String, "flops": pl.Int64, "dtype": pl.String})
