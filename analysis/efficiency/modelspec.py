"""Model-spec files: the network described layer by layer in TOML (the method's own way of
counting FLOPs), with shapes propagated from the input; format and formulas in docs/flops.md.

A convolution does 2 x N x (output positions) x (weight elements) = 2 N Co Ho Wo (Ci/groups) KH KW
FLOPs (bias aside; a multiply-add is 2 FLOP), a linear layer 2 x N x in x out. The backward pass
does that once for the data gradient and once for the weight gradient, and skips the data
gradient where nothing needs it: the first layer, whose input does not require grad.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from traceq.analysis.efficiency.peaks import DTYPES
from traceq.errors import MissingDataError, TraceFormatError

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
    # conv only: (stride, padding, dilation) per spatial dimension, and groups
    window: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] = ((), (), ())
    groups: int = 1

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
    n = _batch(spec, spec_path, batch)
    weighted = [layer for layer in spec.layers if layer.weight_shape]
    rows = [(layer.name, "forward", layer.type, 2 * n * layer.macs_per_sample, layer.dtype)
            for layer in weighted]
    rows += [("b" + layer.name, "backward", layer.type,
              2 * n * layer.macs_per_sample * (2 if layer.data_grad else 1), layer.dtype)
             for layer in reversed(weighted)]
    schema = {"layer": pl.String, "pass": pl.String, "op": pl.String, "flops": pl.Int64,
              "dtype": pl.String}
    return pl.DataFrame(rows, schema=schema, orient="row")


BYTES_PER_VALUE = {"float32": 4, "tf32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1}
"""Bytes one value of each spec data type takes in memory (TF32 is computed on, stored as fp32)."""


def spec_activations(spec_path: str | Path, batch: int | None = None) -> pl.DataFrame:
    """Bytes of each layer's output in one forward pass, from a model-spec file: batch x the
    output's values x the bytes of its data type. An estimate of the activation memory a layer
    allocates; what a framework keeps beside the output (max pooling's indices, dropout's mask,
    convolution workspaces) is not in it.

    `batch` overrides the spec's. Columns: layer, activation_bytes (Int64), in spec order.
    Raises MissingDataError without a batch size.
    """
    spec = load_spec(spec_path)
    n = _batch(spec, spec_path, batch)
    return pl.DataFrame([(layer.name, n * math.prod(layer.out_shape) * BYTES_PER_VALUE[layer.dtype])
                         for layer in spec.layers],
                        schema={"layer": pl.String, "activation_bytes": pl.Int64}, orient="row")


def _batch(spec: ModelSpec, spec_path: str | Path, batch: int | None) -> int:
    """`batch`, else the spec's; MissingDataError when neither says."""
    n = batch if batch is not None else spec.batch
    if n is None or n < 1:
        raise MissingDataError(f"{spec_path}: no batch size: pass --batch N or set batch = N under [model]")
    return n


class _SpecProblem(Exception):
    """What is wrong with a spec; load_spec adds the file name and raises TraceFormatError."""


def _parse_spec(doc: dict, default_name: str) -> ModelSpec:
    model, tables = doc.get("model"), doc.get("layer")
    if "transformer" in doc:
        raise _SpecProblem("is a transformer spec, which `traceq mfu --spec` reads (docs/mfu.md); this command "
                           "needs the layers one by one")
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
    layer = SpecLayer(name, kind, shape, out, weight, _dtype(table.get("dtype", dtype), where), data_grad)
    if kind != "conv":
        return layer
    dims = len(shape) - 1  # _propagate has checked these keys
    window = tuple(tuple(_ints(table.get(key, default), where, dims, minimum=minimum))
                   for key, default, minimum in (("stride", 1, 1), ("padding", 0, 0), ("dilation", 1, 1)))
    return dataclasses.replace(layer, window=window, groups=_ints(table.get("groups", 1), where, 1)[0])


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
