"""Model FLOPs utilization (MFU) and hardware FLOPs utilization (HFU) per iteration.

MFU is the FLOPs the model needs per step over what the GPU could have done in the step's time:
model FLOPs / (iteration time x peak FLOP/s). HFU counts the FLOPs the kernels actually ran
(recomputation included): traceq's FLOPs from the trace's recorded shapes (`ce.kernel_ce`, the
same FLOPs `traceq ce` shows) over the same time and peak. The model FLOPs are the user's
(`model_flops` per iteration, or 6 x parameters x tokens for a training step and 2 x parameters
x tokens for inference, the usual transformer estimate, plus with a transformer's layers, width
and sequence length the attention term of `attention_flops_per_iteration`; or from a transformer
spec file, `transformer_spec`); without them MFU is not stated and HFU is the one measure.

Iteration time is the iteration's GPU span on its busiest device (`layers.stage_times`), the
steady-state iterations only (`conventions.steady`); the peak is the busiest GPU's dense peak at
`precision`, or at the precision that ran the most FLOPs. One row per iteration and a last row,
`all`, over the steady iterations together (FLOPs over time summed).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from traceq.analysis.efficiency.ce import busiest_gpu, kernel_ce
from traceq.analysis.efficiency.transformer_spec import load_transformer_spec
from traceq.analysis.structure.conventions import ITERATION_REGEX, steady
from traceq.analysis.structure.layers import attributed_kernels, stage_times
from traceq.errors import MissingDataError, OptionError

ALL = "all"
"""The iteration label of the row over every steady iteration."""


def model_flops_per_iteration(model_flops: float | None, params: float | None, tokens: float | None,
                              training: bool, *, layers: int | None = None, d_model: int | None = None,
                              seq: int | None = None, causal: bool = True,
                              spec: str | Path | None = None) -> float | None:
    """The model FLOPs of one iteration: given, else (6 or 2) x parameters x tokens per iteration,
    plus the attention term when `layers`, `d_model` and `seq` are given; or a transformer spec's
    (`transformer_spec`), which says all of that itself. Raises OptionError for an incomplete or
    contradictory description."""
    if spec is not None:
        others = (model_flops, params, tokens, layers, d_model, seq)
        if any(v is not None for v in others) or not training or not causal:
            raise OptionError("--spec describes the whole model (mode, sizes, attention): give it alone, "
                              "without --model-flops, --params, --tokens, --layers, --d-model, --seq, "
                              "--inference or --full-attention")
        return load_transformer_spec(spec).model_flops
    described = [v is not None for v in (layers, d_model, seq)]
    if any(described) and not all(described):
        raise OptionError("the attention term needs --layers, --d-model and --seq together")
    if model_flops is not None:
        if any(described) or params is not None:
            raise OptionError("--model-flops is the whole model's count: give it alone, or --params/--tokens")
        return float(model_flops)
    if (params is None) != (tokens is None):
        raise OptionError("--params and --tokens go together (6 x P x T a training step, 2 x P x T inference)")
    if params is None or tokens is None:
        if any(described):
            raise OptionError("the attention term is added to 6 x P x T: give --params and --tokens too")
        return None
    flops = (6.0 if training else 2.0) * float(params) * float(tokens)
    if all(described):
        flops += attention_flops_per_iteration(int(layers), int(d_model), int(seq), float(tokens),  # type: ignore[arg-type]
                                               training, causal)
    return flops


def attention_flops_per_iteration(layers: int, d_model: int, seq: int, tokens: float, training: bool,
                                  causal: bool = True) -> float:
    """The FLOPs of attention's two matrix products (Q K^T and P V), which 6 P T leaves out: per
    token and layer 2 x 2 x seq x d_model forward (each query meets `seq` keys, over all heads'
    d_model columns), 3 times that for a training step (PaLM, Chowdhery et al. 2022, appendix B:
    12 L H Q T per token), halved for causal attention (half the score matrix is masked, as
    traceq counts a causal attention op)."""
    per_token = (12.0 if training else 4.0) * layers * seq * d_model
    return per_token * float(tokens) / (2.0 if causal else 1.0)


def mfu_table(con: duckdb.DuckDBPyConnection, trace_id: int, *, model_flops: float | None = None,
              precision: str | None = None, iteration_regex: str = ITERATION_REGEX,
              per_kernel: pl.DataFrame | None = None) -> pl.DataFrame:
    """iteration, time_ns, model_flops, counted_flops, precision, peak_flops, mfu_pct, hfu_pct
    (see the module's docstring); `model_flops` per iteration; `per_kernel`: the trace's
    `kernel_ce`, when the caller has it. Raises MissingDataError without steady iterations."""
    spans = (stage_times(con, trace_id, iteration_regex).filter(steady())
             .group_by("iteration", maintain_order=True).agg(time_ns=pl.col("span_ns").max()))
    if spans.is_empty():
        raise MissingDataError("the trace marks no iteration, so MFU per iteration is undefined: "
                               "record step ranges or a profiler schedule (docs/structure.md)")
    kernels = attributed_kernels(con, trace_id, iteration_regex)
    if per_kernel is None:
        try:
            per_kernel = kernel_ce(con, trace_id, precision=precision, iteration_regex=iteration_regex, kernels=kernels)
        except MissingDataError:
            per_kernel = None
    gpu = busiest_gpu(con, trace_id)
    if per_kernel is not None and per_kernel.height:
        counted = (per_kernel.drop_nulls("kernel_id")
                   .join(kernels.select("kernel_id", "iteration"), on="kernel_id", how="left"))
        chosen = precision or _dominant_precision(counted)
        counted = counted.group_by("iteration").agg(counted_flops=pl.col("flops").sum())
    else:
        chosen, counted = precision or "fp32", pl.DataFrame(schema={"iteration": pl.String, "counted_flops": pl.Float64})
    peak = gpu.get(f"peak_{chosen}")
    if not peak:
        raise MissingDataError(f"the peak FLOP/s of {chosen} on {gpu['description']} is unknown: "
                               "pass --precision with one it has")
    frame = spans.join(counted, on="iteration", how="left").with_columns(
        pl.col("counted_flops").fill_null(0.0), model_flops=pl.lit(model_flops, pl.Float64))
    total = frame.select(pl.lit(ALL).alias("iteration"), pl.col("time_ns").sum(), pl.col("counted_flops").sum(),
                         pl.when(pl.col("model_flops").is_not_null().all()).then(pl.col("model_flops").sum()))
    frame = pl.concat([frame, total.cast(frame.schema)], how="vertical_relaxed")
    capacity = pl.col("time_ns") / 1e9 * peak
    return frame.select(
        "iteration", "time_ns", "model_flops", "counted_flops",
        precision=pl.lit(chosen), peak_flops=pl.lit(float(peak)),
        mfu_pct=100.0 * pl.col("model_flops") / capacity, hfu_pct=100.0 * pl.col("counted_flops") / capacity)


def _dominant_precision(kernels: pl.DataFrame) -> str:
    """The precision that ran the most FLOPs (fp32 where none is known)."""
    ranked = (kernels.drop_nulls("precision").group_by("precision").agg(pl.col("flops").sum())
              .sort("flops", "precision", descending=[True, False]))
    return ranked["precision"][0] if ranked.height and ranked["flops"][0] > 0 else "fp32"


ALL_RANKS = "all ranks"
"""The rank label of a run's rows over every rank together."""


def run_mfu_table(per_rank: list[tuple[int, pl.DataFrame]]) -> pl.DataFrame:
    """MFU and HFU of a run: each rank's `mfu_table` (its first rank number beside it) and, per
    iteration that every rank has, the ranks together: the iteration lasts as long as its slowest
    rank (the longest of their times), the FLOPs add up (model FLOPs are per GPU, as each rank's
    table has them) and so do the GPUs' peaks, so a run whose ranks did equal work at equal speed
    has each rank's MFU; `all` sums those iterations. Columns: rank (the number, or `ALL_RANKS`),
    then `mfu_table`'s."""
    frames = [frame.with_columns(rank=pl.lit(str(rank))) for rank, frame in per_rank]
    columns = ["rank", *frames[0].columns[:-1]]
    ranks = pl.concat(frames, how="vertical_relaxed").select(columns)
    steps = ranks.filter(pl.col("iteration") != ALL)
    order = frames[0].select("iteration").with_row_index("position")
    together = (steps.group_by("iteration")
                .agg(pl.col("time_ns").max(), pl.col("model_flops").sum(),
                     pl.col("model_flops").is_not_null().all().alias("given"), pl.col("counted_flops").sum(),
                     pl.col("precision").first(), pl.col("peak_flops").sum(), pl.len().alias("n"))
                .filter(pl.col("n") == len(frames))
                .join(order, on="iteration").sort("position")
                .with_columns(model_flops=pl.when(pl.col("given")).then(pl.col("model_flops"))))
    total = together.select(pl.lit(ALL).alias("iteration"), pl.col("time_ns").sum(),
                            pl.when(pl.col("given").all()).then(pl.col("model_flops").sum()).alias("model_flops"),
                            pl.col("counted_flops").sum(), pl.col("precision").first(), pl.col("peak_flops").first())
    together = pl.concat([together.select(total.columns), total], how="vertical_relaxed")
    capacity = pl.col("time_ns") / 1e9 * pl.col("peak_flops")
    together = together.with_columns(rank=pl.lit(ALL_RANKS), mfu_pct=100.0 * pl.col("model_flops") / capacity,
                                     hfu_pct=100.0 * pl.col("counted_flops") / capacity)
    return pl.concat([ranks, together.select(columns)], how="vertical_relaxed")
