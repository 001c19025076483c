"""FLOPs of a training step, the numerator of compute efficiency (CE), from one of two sources:

- **a model-spec file** (`spec_layer_flops`): a TOML file describing the network layer by layer,
  the method's own approach; shapes are propagated from the input (format in docs/flops.md);
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
import tomllib
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from traceq.analysis.attribution import kernel_attribution
from traceq.analysis.classify import classify_names
from traceq.analysis.peaks import DTYPES
from traceq.errors import MissingDataError, TraceFormatError

# ---------------------------------------------------------------------------- model specs

_LAYER_KEYS = {  # type -> (required keys, optional keys); every layer may have name and dtype
    "conv": (("out_channels", "kernel"), ("stride", "padding", "dilation", "groups", "in_channels")),
    "linear": (("out_features",), ("in_features",)),
    "pool": (("kernel",), ("stride", "padding", "dilation", "ceil_mode")),
    "adaptive_pool": (("output",), ()),
    "flatten": ((), ()),
    **{kind: ((), ()) for kind in ("relu", "dropout", "lrn", "batchnorm", "softmax")},
}


@dataclass(frozen=True)
class SpecLayer:
    """One layer after shape propagation. Shapes are per sample: (C, H, W) or (features,)."""

    name: str
    type: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]  # conv (Co, Ci/groups, KH, KW), linear (out, in); else ()
    dtype: str
    data_grad: bool  # the backward pass computes this layer's input gradient

    @property
    def macs_per_sample(self) -> int:
        """Multiply-adds of the forward pass for one sample (0 for layers without weights)."""
        if not self.weight_shape:
            return 0
        positions = math.prod(self.out_shape[1:]) if self.type == "conv" else 1
        return positions * math.prod(self.weight_shape)


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model-spec file."""

    name: str
    input_shape: tuple[int, ...]
    batch: int | None
    dtype: str
    layers: tuple[SpecLayer, ...]


def load_spec(path: str | Path) -> ModelSpec:
    """Read and check a model-spec TOML file and propagate shapes through its layers.

    Raises TraceFormatError (one line naming the file and the layer) when the file is missing,
    is not TOML, has an unknown layer type or key, lacks a required key, or a shape stops fitting.
    """
    path = Path(path)
    try:
        return _parse_spec(tomllib.loads(path.read_text("utf-8")), path.stem)
    except OSError as e:
        raise TraceFormatError(f"cannot read model spec {path}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"{path}: not a TOML model spec ({e}); see docs/flops.md") from None
    except _SpecProblem as e:
        raise TraceFormatError(f"{path}: {e}; see docs/flops.md") from None


def spec_layer_flops(spec_path: str | Path, batch: int | None = None) -> pl.DataFrame:
    """FLOPs of one training step per layer and pass, from a model-spec file.

    `batch` overrides the spec's `[model] batch`. Columns: layer (forward 'conv1', backward
    'bconv1', the traces' naming), pass ('forward' | 'backward'), op ('conv' | 'linear'),
    flops (Int64), dtype. Forward layers in spec order, then backward layers in reverse order;
    only layers with weights have rows. Raises MissingDataError without a batch size.
    """
    spec = load_spec(spec_path)
    n = batch if batch is not None else spec.batch
    if n is None or n < 1:
        raise MissingDataError(f"{spec_path}: no batch size: pass --batch N or set batch = N under [model]")
    weighted = [layer for layer in spec.layers if layer.weight_shape]
    rows = [(layer.name, "forward", layer.type, 2 * n * layer.macs_per_sample, layer.dtype)
            for layer in weighted]
    rows += [("b" + layer.name, "backward", layer.type,
              2 * n * layer.macs_per_sample * (2 if layer.data_grad else 1), layer.dtype)
             for layer in reversed(weighted)]
    schema = {"layer": pl.String, "pass": pl.String, "op": pl.String, "flops": pl.Int64,
              "dtype": pl.String}
    return pl.DataFrame(rows, schema=schema, orient="row")


class _SpecProblem(Exception):
    """What is wrong with a spec; load_spec adds the file name and raises TraceFormatError."""


def _parse_spec(doc: dict, default_name: str) -> ModelSpec:
    model, tables = doc.get("model"), doc.get("layer")
    if set(doc) - {"model", "layer"} or not isinstance(model, dict):
        raise _SpecProblem("needs a [model] table and [[layer]] tables, nothing else")
    _check_keys(model, ("input",), ("name", "batch", "dtype"), "[model]")
    shape = tuple(_ints(model["input"], "[model] input"))
    batch = model.get("batch")
    if batch is not None:
        batch = _ints(batch, "[model] batch", 1)[0]
    dtype = _dtype(model.get("dtype", "float32"), "[model]")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise _SpecProblem("has no [[layer]] tables")
    layers: list[SpecLayer] = []
    for index, table in enumerate(tables, start=1):
        # the input does not require grad, so layers up to the first one with weights need
        # no input gradient
        data_grad = any(layer.weight_shape or layer.type == "batchnorm" for layer in layers)
        layers.append(_spec_layer(table, index, layers[-1].out_shape if layers else shape, dtype, data_grad))
    names = [layer.name for layer in layers]
    if len(set(names)) != len(names):
        raise _SpecProblem(f"layer names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    return ModelSpec(str(model.get("name", default_name)), shape, batch, dtype, tuple(layers))


def _check_keys(table: dict, required: tuple[str, ...], optional: tuple[str, ...], where: str) -> None:
    missing = [key for key in required if key not in table]
    if missing:
        raise _SpecProblem(f"{where} needs {', '.join(missing)}")
    unknown = sorted(set(table) - set(required) - set(optional))
    if unknown:
        raise _SpecProblem(f"{where}: unknown key {unknown[0]!r}; "
                           f"expected some of {', '.join(required + optional)}")


def _ints(value: object, what: str, length: int | None = None, minimum: int = 1) -> list[int]:
    """A list of integers >= minimum; a single integer is repeated to `length`."""
    if isinstance(value, int) and not isinstance(value, bool) and length is not None:
        value = [value] * length
    ok = (isinstance(value, list) and len(value) > 0 and (length is None or len(value) == length)
          and all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value))
    if not ok:
        count = "" if length in (None, 1) else f"one or a list of {length} "
        raise _SpecProblem(f"{what} must be {count}integer(s) >= {minimum}, not {value!r}")
    return list(value)  # type: ignore[arg-type]


def _dtype(value: object, where: str) -> str:
    if value not in DTYPES:
        raise _SpecProblem(f"{where} dtype must be one of {', '.join(DTYPES)}, not {value!r}")
    return str(value)


def _spec_layer(table: dict, index: int, shape: tuple[int, ...], dtype: str, data_grad: bool) -> SpecLayer:
    kind = table.get("type")
    name = str(table.get("name", f"{kind}{index}"))
    where = f"layer {index} ({name})"
    if kind not in _LAYER_KEYS:
        raise _SpecProblem(f"{where}: unknown type {kind!r}; expected one of {', '.join(_LAYER_KEYS)}")
    if kind in ("conv", "linear") and "name" not in table:
        raise _SpecProblem(f"{where} needs a name: the layer's NVTX range name, e.g. 'conv1'")
    _check_keys({k: v for k, v in table.items() if k not in ("name", "type", "dtype")},
                *_LAYER_KEYS[kind], where)
    out, weight = _propagate(kind, table, shape, where)
    return SpecLayer(name, kind, shape, out, weight, _dtype(table.get("dtype", dtype), where), data_grad)


def _propagate(kind: str, t: dict, shape: tuple[int, ...], where: str
               ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Output shape and weight shape of one layer, from its input shape."""
    if kind == "linear":
        out = _ints(t["out_features"], f"{where} out_features", 1)[0]
        features = math.prod(shape)  # flattened implicitly, as Caffe's InnerProduct does
        if t.get("in_features", features) != features:
            raise _SpecProblem(f"{where}: in_features = {t['in_features']} but the input "
                               f"{list(shape)} has {features}")
        return (out,), (out, features)
    if kind == "flatten":
        return (math.prod(shape),), ()
    if kind not in ("conv", "pool", "adaptive_pool"):
        return shape, ()
    dims = len(shape) - 1
    if dims < 1:
        raise _SpecProblem(f"{where}: needs a (C, H, W) input, not {list(shape)}")
    if kind == "adaptive_pool":
        return (shape[0], *_ints(t["output"], f"{where} output", dims)), ()
    k = _ints(t["kernel"], f"{where} kernel", dims)
    s = _ints(t.get("stride", 1 if kind == "conv" else k), f"{where} stride", dims)
    p = _ints(t.get("padding", 0), f"{where} padding", dims, minimum=0)
    d = _ints(t.get("dilation", 1), f"{where} dilation", dims)
    ceil = t.get("ceil_mode", False)
    if not isinstance(ceil, bool):
        raise _SpecProblem(f"{where}: ceil_mode must be true or false")
    spatial = tuple(_window_out(*args, ceil) for args in zip(shape[1:], k, s, p, d))
    if any(size < 1 for size in spatial):
        raise _SpecProblem(f"{where}: the input {list(shape)} is smaller than the window")
    if kind == "pool":
        return (shape[0], *spatial), ()
    out = _ints(t["out_channels"], f"{where} out_channels", 1)[0]
    groups = _ints(t.get("groups", 1), f"{where} groups", 1)[0]
    if t.get("in_channels", shape[0]) != shape[0] or shape[0] % groups or out % groups:
        raise _SpecProblem(f"{where}: the input {list(shape)} has {shape[0]} channels, "
                           f"in_channels = {t.get('in_channels', shape[0])}, groups = {groups}")
    return (out, *spatial), (out, shape[0] // groups, *k)


def _window_out(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil: bool) -> int:
    """Output length of a sliding window, as PyTorch computes it for conv and pooling."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + padding:  # the last window must start inside
        out -= 1
    return out


# ------------------------------------------------------------------- op shapes from NVTX

_CONV = ("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
         "aten::cudnn_convolution", "aten::miopen_convolution", "aten::mkldnn_convolution",
         "aten::_convolution_mode", "aten::conv_transpose1d", "aten::conv_transpose2d",
         "aten::conv_transpose3d", "aten::cudnn_convolution_transpose")
_GEMM = ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::_addmm_activation",
         "aten::bmm", "aten::baddbmm")
_CONV_BACKWARD = "aten::convolution_backward"
FLOP_OPS = (*_CONV, *_GEMM, _CONV_BACKWARD)
"""ATen ops whose NVTX ranges carry FLOPs; nested ones count once, at the outermost."""

_NO_SHAPES = ("no layer shapes in this trace: record it under torch.autograd.profiler."
              "emit_nvtx(record_shapes=True), or pass --spec model.toml (see docs/flops.md)")
_SIZES = "TRY_CAST(split_part(split_part(name, ', sizes = ', 2), ', input_op_ids = ', 1) AS BIGINT[][])"


def op_flops(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """FLOPs of every FLOP-bearing ATen op range that emit_nvtx(record_shapes=True) recorded.

    Columns: pid, tid, start_ns, end_ns (the range in the `nvtx` table), op ('aten::conv2d'),
    pass ('forward', or 'backward' inside an autograd `...Backward...` range), flops (Int64),
    dtype ('float32': the ranges do not record it). One row per outermost range of FLOP_OPS.

    A forward convolution's output size comes from the op that consumes it (`input_op_ids`);
    one whose output no op consumed is left out. `aten::convolution_backward` records
    grad_output, input and weight shapes; it counts the data gradient when an op consumes its
    output 0 and the weight gradient when one consumes output 1 (both when the trace has no
    input_op_ids). Backward matrix products are their own `aten::mm` ranges. Empty when the
    trace has no shapes.
    """
    ops = _op_ranges(con, trace_id)
    if ops.is_empty():
        return _empty_op_flops()
    uses = _consumers(con, trace_id, ops.filter(pl.col("needs_uses"))["op_id"].to_list())
    shaped = ops.join(uses, on="op_id", how="left").with_columns(
        pl.col("data_used", "weight_used").fill_null(False))
    keys = ["op", "sizes", "out_shapes", "data_used", "weight_used", "has_ids"]
    counts = shaped.select(keys).unique()
    counts = counts.with_columns(flops=pl.Series(
        [_range_flops(*row) for row in counts.iter_rows()], dtype=pl.Int64))
    return (shaped.join(counts, on=keys, how="left", nulls_equal=True)
            .filter(pl.col("flops").is_not_null())
            .with_columns(dtype=pl.lit("float32"))
            .select("pid", "tid", "start_ns", "end_ns", "op", "pass", "flops", "dtype")
            .sort("pid", "tid", "start_ns"))


def kernel_flops(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """Each op's FLOPs (op_flops) spread over the kernels launched inside its range.

    A kernel belongs to the op range open on its launching thread (same pid and tid) at the
    launch call. Within one op, kernels that `classify_names` calls convolution or gemm share
    the FLOPs pro rata by duration, helpers (layout transforms, fills) get 0; an op that
    launched no convolution or gemm kernel spreads them over all its kernels. Integer shares
    sum exactly to each op's FLOPs (the remainder goes to the longest kernel).

    Columns: kernel_id, flops (Int64), op, pass, source ('nvtx shapes'); only kernels inside
    FLOP-bearing ranges, ordered by kernel_id.
    """
    return _kernel_shares(con, trace_id).drop("op_row")


def _kernel_shares(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """kernel_flops with op_row, the number of the op range each kernel belongs to."""
    ops = op_flops(con, trace_id).with_row_index("op_row")
    launches = con.sql(
        f"SELECT kernel_id, pid, launch_tid AS tid, launch_start_ns, dur_ns, name FROM kernel_launches "
        f"WHERE trace_id = {int(trace_id)} AND launch_start_ns IS NOT NULL").pl().sort("launch_start_ns")
    inside = (launches.join_asof(ops.sort("start_ns"), left_on="launch_start_ns", right_on="start_ns",
                                 by=["pid", "tid"], strategy="backward", check_sortedness=False)
              .filter(pl.col("launch_start_ns") <= pl.col("end_ns")))
    classes = classify_names(inside["name"].unique()).select(
        "name", compute=pl.col("operation").is_in(["convolution", "gemm"]))
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
    return (k.select("kernel_id", pl.col("share").alias("flops"), "op", "pass",
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
        runs = con.sql(f"SELECT name AS layer, count(*)::BIGINT AS calls FROM nvtx "
                       f"WHERE trace_id = {t} AND kind = 'pushpop' GROUP BY name").pl()
        return (spec_layer_flops(spec_path, batch).join(runs, on="layer", how="left")
                .with_columns(pl.col("calls").fill_null(0))
                .select("layer", "pass", "calls", flops=pl.col("flops") * pl.col("calls"),
                        source=pl.lit("spec")))
    per_kernel = _kernel_shares(con, trace_id)
    if per_kernel.is_empty():
        raise MissingDataError(_NO_SHAPES)
    context = kernel_attribution(con, trace_id).select("kernel_id", "layer", "pass")
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
    return con.sql(
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
    ).pl()


def _consumers(con: duckdb.DuckDBPyConnection, trace_id: int, op_ids: list[int]) -> pl.DataFrame:
    """For each op id: out_shapes (distinct shapes of its output 0 where other ops take it as
    input), data_used (output 0 consumed), weight_used (output 1 consumed)."""
    empty = pl.DataFrame(schema={"op_id": pl.Int64, "out_shapes": pl.List(pl.List(pl.Int64)),
                                 "data_used": pl.Boolean, "weight_used": pl.Boolean})
    if not op_ids:
        return empty
    pair = r"'\((\d+),(-?\d+)\)'"
    uses = con.sql(
        rf"""
        WITH ids AS (
            SELECT rowid AS row, name, split_part(name, ', input_op_ids = ', 2) AS ids
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
    ).pl()
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


def _empty_op_flops() -> pl.DataFrame:
    return pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                "op": pl.String, "pass": pl.String, "flops": pl.Int64, "dtype": pl.String})
