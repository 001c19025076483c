"""`traceq traffic`: DeLTA's memory-traffic model (`traffic_model`) set beside the measured time
of every convolution and GEMM launch of a trace, per launch group or per layer.

For each launch the analysis needs four things, all from the store or its inputs:

- the GEMM it computes: the layer's shapes from a model spec or from the op shapes PyTorch
  recorded (`traffic_shapes` lists the candidates: forward, data gradient, weight gradient,
  implicit or explicit), chosen by the direction the kernel's name gives (`classify`) and by
  the grid: the candidate and orientation whose tile count the launch's CTAs equal (or divide,
  split-K; or undercut, a persistent kernel) wins;
- its CTA tile, math, schedule and load path, from its name (`tiles`, rules in
  `tile_rules.toml`);
- CTAs per SM, from its registers and shared memory (`occupancy`, as `traceq ru` computes it);
- the GPU (`gpu_products`): the trace's own, or another one for a what-if (`gpu`).

Kernels the rules mark not modelled (split-K reductions, Winograd, FFT, GEMV, helpers) and
launches without shapes keep a row with the reason and no numbers.
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import polars as pl

from traceq.analysis.choices import TrafficBy
from traceq.analysis.efficiency.gpu_products import GpuProduct, gpu_product, trace_gpu
from traceq.analysis.efficiency.gpu_specs import GpuLimits, limits_for_cc
from traceq.analysis.efficiency.ncu_columns import ncu_traffic_columns
from traceq.analysis.efficiency.occupancy import launch_occupancy
from traceq.analysis.efficiency.tiles import KernelTile, kernel_tile
from traceq.analysis.efficiency.traffic_model import Prediction, Problem, padded_channels, predict
from traceq.analysis.efficiency.traffic_shapes import Candidate, op_candidates, recorded_candidates, spec_candidates
from traceq.analysis.structure.conventions import ITERATION_REGEX
from traceq.errors import MissingDataError, TraceFormatError

NO_SHAPES = ("no layer shapes: pass --spec model.toml (docs/flops.md), or record the trace under "
             "torch.autograd.profiler.emit_nvtx(record_shapes=True)")

DEFAULT_CLUSTER = 2
"""CTAs per cluster assumed for a TMA kernel when the trace does not record it (nsys does not):
the value that fits best the L2 bytes Nsight Compute measured on our H200 recordings
(docs/traffic.md: median L2 error 22 % with it, 32 % with none, 16 % with the recorded sizes)."""

_DIRECTION = {"forward": "fprop", "data_gradient": "dgrad", "weight_gradient": "wgrad"}
_CONFIG = ["device_id", "grid_blocks", "block_threads", "registers_per_thread", "smem_static_bytes",
           "smem_dynamic_bytes", "smem_carveout_bytes"]
_NUMBERS = {"m": pl.Int64, "n": pl.Int64, "k": pl.Int64, "tile": pl.String, "math": pl.String, "ctas": pl.Int64,
            "waves": pl.Float64, "l1_bytes": pl.Float64, "shared_bytes": pl.Float64, "l2_bytes": pl.Float64,
            "dram_bytes": pl.Float64, "flops": pl.Float64, "bound": pl.String, "predicted_ns": pl.Float64,
            "here_ns": pl.Float64, "note": pl.String}


def launch_traffic(con: duckdb.DuckDBPyConnection, trace_id: int, *, spec: Path | None = None,
                   batch: int | None = None, gpu: str | None = None, iteration_regex: str = ITERATION_REGEX,
                   kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every convolution and GEMM launch with the model's numbers.

    Columns: kernel_id, name, short_name, library, layer, pass, direction ('fprop', 'dgrad',
    'wgrad', or 'gemm' for a recorded matrix product), m, n, k (the GEMM), tile ('128x64x32'),
    math (the peak that bounds it: 'ffma', 'tf32', 'fp16', ...), ctas, waves, l1_bytes,
    shared_bytes, l2_bytes, dram_bytes, flops, bound ('compute', 'L1', 'shared', 'L2', 'DRAM',
    or 'latency'), predicted_ns (on `gpu`, else the trace's GPU), here_ns (predicted
    on the trace's GPU; null without its description), measured_ns, note (what the model
    assumed or why it gave no numbers). `kernels`: the trace's `layers.attributed_kernels`.
    Raises MissingDataError when neither `spec` nor recorded shapes give any layer a shape.
    """
    from traceq.analysis.kernels.classify import classify_names
    from traceq.analysis.structure.layers import attributed_kernels

    k = attributed_kernels(con, trace_id, iteration_regex) if kernels is None else kernels
    k = k.filter(pl.col("operation").is_in(["convolution", "gemm"]))
    k = k.join(classify_names(k["name"].unique()).select("name", "direction"), on="name", how="left")
    config = con.sql(f"SELECT kernel_id, {', '.join(_CONFIG)} FROM kernels WHERE trace_id = {int(trace_id)}").pl()
    k = k.drop("device_id").join(config, on="kernel_id", how="left")
    k, candidates = _with_shapes(con, trace_id, k, spec, batch)
    here = _trace_gpu_or_none(con, trace_id)
    target = gpu_product(gpu) if gpu else here
    if target is None:
        raise MissingDataError("the trace has no GPU description: pass --gpu NAME")
    limits = _trace_limits(con, trace_id) if here is not None else {}
    keys = ["name", "operation", "shape_key", "direction", *_CONFIG]
    groups = k.select(keys).unique(maintain_order=True)
    rows = [_group_numbers(g, candidates.get(g["shape_key"], []), target, here, limits)
            for g in groups.iter_rows(named=True)]
    numbers = pl.DataFrame(rows, schema={**{c: groups.schema[c] for c in keys}, "dir": pl.String, **_NUMBERS},
                           orient="row")
    return (k.join(numbers, on=keys, how="left", nulls_equal=True)
            .select("kernel_id", "name", "short_name", "library", "layer", "pass", pl.col("dir").alias("direction"),
                    *[c for c in _NUMBERS if c != "note"], pl.col("dur_ns").alias("measured_ns"), "note")
            .sort("kernel_id"))


def traffic_table(con: duckdb.DuckDBPyConnection, trace_id: int, by: TrafficBy | str = TrafficBy.layer, *,
                  spec: Path | None = None, batch: int | None = None, gpu: str | None = None,
                  iteration_regex: str = ITERATION_REGEX, kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """The model beside the measured time, per layer and pass or per kernel, heaviest first.

    By kernel, one row per kernel name, layer, pass and GEMM (its launches are identical to
    the model): launches, then `launch_traffic`'s columns for one launch, measured_ns their mean.
    By layer, one row per layer, pass and GEMM shape, summed over the modelled launches:
    launches, direction, m, n, k, tile, math and bound of the longest-predicted kernel, the byte,
    FLOP and time columns as totals. Both end with achieved_pct (100 x predicted on the trace's
    GPU / measured: how close the kernels came to what their binding resource allows) and,
    when `gpu` names another GPU, expected_ns (measured x predicted there / predicted here:
    the same share of the bound on that GPU). Kernels without numbers are left out by layer.
    """
    launches = launch_traffic(con, trace_id, spec=spec, batch=batch, gpu=gpu, iteration_regex=iteration_regex,
                              kernels=kernels)
    by = TrafficBy(by)
    what = ["direction", "m", "n", "k", "tile", "math", "ctas", "waves", "l1_bytes", "shared_bytes", "l2_bytes",
            "dram_bytes", "flops", "bound", "predicted_ns", "here_ns"]
    if by is TrafficBy.kernel:
        frame = (launches.group_by("name", "layer", "pass", "m", "n", "k", maintain_order=True)
                 .agg(pl.len().cast(pl.Int64).alias("launches"), pl.col("measured_ns").mean(),
                      pl.col("measured_ns").sum().alias("total_ns"),
                      *[pl.col(c).first() for c in what if c not in ("m", "n", "k")], pl.col("note").first()))
    else:
        modelled = launches.filter(pl.col("predicted_ns").is_not_null())
        longest = pl.col("predicted_ns").arg_max()
        frame = (modelled.with_columns(shape=pl.format("{}x{}x{}", "m", "n", "k"))
                 .group_by("layer", "pass", "shape", maintain_order=True)
                 .agg(pl.len().cast(pl.Int64).alias("launches"),
                      *[pl.col(c).get(longest) for c in ("direction", "m", "n", "k", "tile", "math", "bound")],
                      *[pl.col(c).sum() for c in ("l1_bytes", "shared_bytes", "l2_bytes", "dram_bytes", "flops",
                                                  "predicted_ns", "here_ns", "measured_ns")],
                      pl.col("measured_ns").sum().alias("total_ns"),
                      pl.col("note").drop_nulls().unique(maintain_order=True).str.join("; ").alias("note"))
                 .drop("shape"))
    frame = frame.with_columns(achieved_pct=100 * pl.col("here_ns") / pl.col("measured_ns"))
    frame = ncu_traffic_columns(con, trace_id, frame, launches, by is TrafficBy.kernel)  # when measured
    if gpu is not None and not frame.is_empty() and frame["here_ns"].is_not_null().any():
        frame = frame.with_columns(expected_ns=pl.col("measured_ns") * pl.col("predicted_ns") / pl.col("here_ns"))
    keys = ["name"] if by is TrafficBy.kernel else []
    first = [*keys, "layer", "pass", "launches", "direction", "m", "n", "k", "tile", "math"]
    rest = [c for c in frame.columns if c not in first and c not in ("total_ns", "note")]
    return frame.sort("total_ns", descending=True, nulls_last=True).select(*first, *rest, "note")


def _with_shapes(con: duckdb.DuckDBPyConnection, trace_id: int, k: pl.DataFrame, spec: Path | None,
                 batch: int | None) -> tuple[pl.DataFrame, dict[str, list[Candidate]]]:
    """The kernels with shape_key (a key into the returned candidates; null without shapes)."""
    candidates: dict[str, list[Candidate]] = {}
    if spec is not None and Path(spec).suffix.lower() == ".json":
        for name, layer in _layer_shapes(Path(spec)).items():
            for key, backward in ((name, False), ("b" + name, True)):
                try:
                    found = recorded_candidates(layer, backward)
                except (TypeError, ValueError, IndexError):
                    raise TraceFormatError(f"{spec}: layer {name!r} has shapes traceq cannot read (lists of "
                                           "integers expected)") from None
                if found:
                    candidates[key] = found
        if not candidates:
            raise MissingDataError(f"{spec}: no Conv2d or Linear layer with input, output and weight shapes")
    elif spec is not None:
        from traceq.analysis.efficiency.ce import infer_batch
        from traceq.analysis.efficiency.modelspec import load_spec

        model = load_spec(spec)
        if batch is None:
            batch = infer_batch(con, trace_id, k, 4 * math.prod(model.input_shape)) if k.height else None
            batch = batch or model.batch
        if not batch:
            raise MissingDataError(f"{spec}: no batch size: pass --batch N or set batch = N under [model]")
        for layer in model.layers:
            if layer.weight_shape:
                candidates[layer.name] = spec_candidates(layer, batch, backward=False)
                candidates["b" + layer.name] = spec_candidates(layer, batch, backward=True)
    if spec is not None:
        return k.with_columns(shape_key=pl.when(pl.col("layer").is_in(list(candidates))).then(pl.col("layer"))), \
            candidates
    from traceq.analysis.efficiency.flops import kernel_op_rows, op_shapes

    ops = op_shapes(con, trace_id)
    if ops.is_empty():
        raise MissingDataError(NO_SHAPES)
    for row in ops.iter_rows(named=True):
        found = op_candidates(row["op"], row["sizes"], row["out_shapes"], row["data_used"], row["weight_used"],
                              row["has_ids"])
        if found:
            candidates[str(row["op_row"])] = found
    rows = kernel_op_rows(con, trace_id, ops).select("kernel_id", shape_key=pl.col("op_row").cast(pl.String))
    return k.join(rows, on="kernel_id", how="left"), candidates


def _layer_shapes(path: Path) -> dict[str, dict]:
    """A layer-shapes file: {layer name: {type, input, output, weight, stride, padding, ...}}."""
    import json

    try:
        document = json.loads(path.read_text("utf-8"))
    except OSError as e:
        raise TraceFormatError(f"cannot read layer shapes {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"{path}: not a JSON layer-shapes file ({e})") from None
    if not isinstance(document, dict) or not all(isinstance(v, dict) for v in document.values()):
        raise TraceFormatError(f"{path}: expected {{layer name: {{type, input, output, weight, ...}}}}, "
                               "as tools/record_training.py --shapes writes it")
    return document


def _trace_gpu_or_none(con: duckdb.DuckDBPyConnection, trace_id: int) -> GpuProduct | None:
    try:
        return trace_gpu(con, trace_id)
    except MissingDataError:
        return None


def _trace_limits(con: duckdb.DuckDBPyConnection, trace_id: int) -> dict[int, GpuLimits]:
    from traceq.analysis.efficiency.ru import device_limits

    try:
        return {device: limits for device, (limits, _) in device_limits(con, trace_id).items()}
    except MissingDataError:
        return {}


def _ctas_per_sm(g: dict, limits: GpuLimits, carveout: int | None) -> int:
    """Active CTAs per SM of the launch shape on a GPU with `limits` (as `traceq ru` computes them)."""
    if not g["block_threads"] or g["registers_per_thread"] is None:
        return 1
    occupancy = launch_occupancy(g["block_threads"], g["registers_per_thread"], limits,
                                 static_smem=g["smem_static_bytes"] or 0, dynamic_smem=g["smem_dynamic_bytes"] or 0,
                                 carveout=carveout, opt_in=True)
    return max(1, occupancy.active_blocks_per_sm)


def _choose(candidates: list[Candidate], tile: KernelTile, direction: str | None, implicit: bool,
            grid: int | None) -> tuple[str, Problem, str | None]:
    """The candidate and orientation the launch computes: direction and kind (implicit GEMM for
    a convolution kernel, explicit for a GEMM kernel) first, then the grid: equal to the tile
    count, a multiple of it (split-K), below it (persistent), in that order of preference."""
    pool = [c for c in candidates if (c[1].op != "gemm") == implicit] or candidates
    wanted = _DIRECTION.get(direction or "")
    pool = [c for c in pool if c[0] == wanted] or pool
    if tile.schedule in ("segment_k", "stream_k"):
        grid = None  # a balanced schedule's grid is the GPU's size, not the problem's
    best: tuple[tuple[int, float, int], str, Problem] | None = None
    for order, (label, problem) in enumerate(pool):
        shapes = [problem]
        if problem.op == "gemm" and problem.m != problem.n:
            shapes.append(problem.transposed())
        padded = padded_channels(problem, 16 // tile.element_bytes) if tile.layout == "nhwc" else None
        if padded is not None:
            shapes.append(padded)
        for shape in shapes:
            tiles = -(-shape.m // tile.m) * -(-shape.n // tile.n) * shape.batch
            score = 3 if not grid else (0 if grid == tiles else 1 if grid % tiles == 0 else 2 if grid < tiles else 3)
            distance = abs(math.log(grid / tiles)) if grid and score == 3 else 0.0  # padded dims: nearest
            # an exact fit keeps the candidates' order; a split or persistent fit prefers the
            # larger product (a split of one image's GEMM over 132 CTAs is no real choice)
            rank = (score, distance, order if score == 0 else -shape.m * shape.n * shape.k * shape.batch)
            if best is None or rank < best[0]:
                best = (rank, label, shape)
    assert best is not None
    (score, _, _), label, shape = best
    note = None
    if grid and score == 3:
        note = "no candidate GEMM fits the grid"
    elif len({(p.m, p.n, p.k) for _, p in pool}) > 1 and wanted is None and score > 0:
        note = "GEMM chosen among several"
    return label, shape, note


def predict_launch(name: str, candidates: list[Candidate], gpu: GpuProduct, *, direction: str | None = None,
                   convolution: bool = True, grid_blocks: int | None = None, block_threads: int | None = None,
                   ctas_per_sm: int = 1, cluster: int | None = None) -> tuple[str, Problem, Prediction, str | None]:
    """The model for one launch of kernel `name` in a layer whose GEMMs are `candidates`:
    (direction, the GEMM chosen, the prediction, a note on the choice or None). `direction`:
    what `classify` reads from the name; `convolution`: the kernel is an implicit-GEMM one
    (else an explicit GEMM); the rest as for `traffic_model.predict`. The kernel must be one
    the tile rules model (`tiles.kernel_tile(name).modelled`). `cluster`: CTAs per thread-block
    cluster; None (nsys records none) assumes `DEFAULT_CLUSTER` for TMA kernels, 1 for others."""
    tile = kernel_tile(name)
    label, problem, note = _choose(candidates, tile, direction, convolution, grid_blocks)
    if cluster is None:
        cluster = DEFAULT_CLUSTER if tile.operand_path == "tma" else 1
        if tile.operand_path == "tma":
            note = "; ".join(filter(None, (note, f"cluster size not recorded: {DEFAULT_CLUSTER} assumed")))
    prediction = predict(problem, tile, gpu, ctas_per_sm=ctas_per_sm, grid_blocks=grid_blocks,
                         block_threads=block_threads, cluster=cluster)
    return label, problem, prediction, note


def _group_numbers(g: dict, candidates: list[Candidate], target: GpuProduct, here: GpuProduct | None,
                   limits: dict[int, GpuLimits]) -> tuple:
    """One row of `launch_traffic`'s numbers for a group of identical launches."""
    keys = (g["name"], g["operation"], g["shape_key"], g["direction"], *[g[c] for c in _CONFIG])
    tile = kernel_tile(g["name"])
    empty = (None,) * (len(_NUMBERS) - 1)
    if not tile.modelled:
        return (*keys, None, *empty, f"not modelled: {tile.reason}")
    if not candidates:
        return (*keys, None, *empty, "no shape for this layer")
    here_limits = limits.get(g["device_id"]) or next(iter(limits.values()), None)

    def run(gpu: GpuProduct, limits_: GpuLimits, carveout: int | None):
        return predict_launch(g["name"], candidates, gpu, direction=g["direction"],
                              convolution=g["operation"] == "convolution", grid_blocks=g["grid_blocks"],
                              block_threads=g["block_threads"], ctas_per_sm=_ctas_per_sm(g, limits_, carveout))

    if target is here and here_limits is not None:
        label, problem, p, note = run(target, here_limits, g["smem_carveout_bytes"])
        on_here = p
    else:
        label, problem, p, note = run(target, limits_for_cc(*target.cc), None)
        on_here = run(here, here_limits or limits_for_cc(*here.cc), g["smem_carveout_bytes"])[2] if here else None
    notes = [n for n in (note, *p.flags) if n]
    return (*keys, label, problem.m, problem.n, problem.k, tile.label, tile.math, p.ctas, p.waves, p.l1_bytes,
            p.shared_bytes, p.l2_bytes, p.dram_bytes, p.flops, p.bound, p.time_s * 1e9,
            on_here.time_s * 1e9 if on_here else None, "; ".join(notes) or None)
