"""A layer for the kernels that no layer range encloses, by rule, and a reason for the others.

`attribution.point_contexts` gives a launch the innermost layer range open on its thread. Some
launches have none, in ways a training step's structure explains: with module hooks (how the
samples were recorded) a layer's backward range closes before autograd launches its weight
gradient, so in `alexnet_b256_cudnn` every `bconv1` kernel runs after `bconv1` closed; the loss
runs between the last forward layer and the first backward one; the optimizer in the weight
update stage. Each launch outside every layer range gets, in this order:

1. weight update stage: the layer `optimizer` (rule "weight update").
2. forward or backward stage, after a layer range closed in the same stage (on any thread of the
   process: backward layer ranges live on autograd's thread, loss kernels on the main one), and
   in the forward stage with another layer range still to open: the layer whose range closed
   last (rule "after its range").
3. forward stage after the stage's last layer range; backward stage before its first: the layer
   `loss` (rule "loss").
4. otherwise no layer, and why: "none: no layer ranges" (none in the trace, or none in the
   launch's stage), "none: outside the training stages" (data copy, no stage range, no launch
   call), "none: before the first layer" (forward, before the stage's first layer range).

The stage instance is the stage range enclosing the launch (by time, any thread of the
process), or the iteration range where the trace has no stage ranges. Layer ranges here are the
push/pop ranges of NVTX's default domain (the application's) that are not iteration or stage
ranges: a library's own ranges (NCCL's `ncclAllReduce`) say nothing about layers. Only the launches outside
every layer range are looked at (two binary searches each); the few distinct results become new
contexts, so no string is built per launch.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

RANGE = "range"
AFTER = "rule: after its range"
LOSS = "rule: loss"
UPDATE = "rule: weight update"
NO_LAYERS = "none: no layer ranges"
NO_STAGE = "none: outside the training stages"
BEFORE_FIRST = "none: before the first layer"

INFERRED = (AFTER, LOSS, UPDATE)
"""The attribution values of launches placed by rule rather than by an enclosing range."""


def infer_layers(
    points: pl.DataFrame, index: pl.Series, contexts: pl.DataFrame, by_time_ranges: pl.DataFrame,
    layer_ranges: Callable[[], pl.DataFrame],
) -> tuple[pl.Series, pl.DataFrame]:
    """`point_contexts`' (index, contexts) with the rules above applied: contexts gains an
    `attribution` column ('range', a rule, or 'none: ...') and rows for the inferred layers;
    index points the launches placed by rule at them.

    points: pos, pid, tid, t (t null without a launch call), one per index entry;
    by_time_ranges: the iteration and stage ranges (pid, start_ns, end_ns, is_iter, is_stage);
    layer_ranges: reads the push/pop ranges that can be layers (pid, start_ns, end_ns, nm), only
    called when some launch needs them.
    """
    stage = pl.col("stage")
    if "attribution" not in contexts.columns:  # else some were placed already (`operators`)
        contexts = contexts.with_columns(attribution=pl.lit(None, pl.String))
    contexts = contexts.with_columns(attribution=pl.when(pl.col("attribution").is_not_null())
                                     .then(pl.col("attribution"))
                                     .when(pl.col("layer").is_not_null()).then(pl.lit(RANGE))
                                     .when(stage == "weight_update").then(pl.lit(UPDATE))
                                     .when(stage.is_in(["forward", "backward"])).then(pl.lit(None, pl.String))
                                     .otherwise(pl.lit(NO_STAGE)))
    contexts = contexts.with_columns(layer=pl.when(pl.col("attribution") == UPDATE).then(pl.lit("optimizer"))
                                     .otherwise(pl.col("layer")))
    open_ = contexts.with_row_index("context").filter(pl.col("attribution").is_null())
    if open_.is_empty():
        return index, contexts
    at = points.with_columns(context=index).filter(pl.col("context").is_in(open_["context"].implode()))
    ranges = layer_ranges()
    if ranges.is_empty():
        return index, contexts.with_columns(pl.col("attribution").fill_null(pl.lit(NO_LAYERS)))
    placed = _place(at.join(open_.select("context", "stage"), on="context"), ranges, by_time_ranges)
    # one new context per (old context, layer, rule): a handful
    found = placed.select("context", "new_layer", "rule").unique(maintain_order=True).with_row_index(
        "new", offset=contexts.height)
    extra = (found.join(contexts.with_row_index("context"), on="context", how="left", maintain_order="left")
             .with_columns(layer=pl.col("new_layer"), attribution=pl.col("rule"))
             .select(contexts.columns))
    moved = placed.join(found, on=["context", "new_layer", "rule"], how="left", nulls_equal=True)
    index = index.scatter(moved["pos"], moved["new"].cast(index.dtype))
    contexts = pl.concat([contexts.with_columns(pl.col("attribution").fill_null(pl.lit(NO_STAGE))),
                          extra.cast(contexts.schema)], rechunk=True)  # one chunk: gathers stay fast
    return index, contexts


def _place(at: pl.DataFrame, ranges: pl.DataFrame, by_time_ranges: pl.DataFrame) -> pl.DataFrame:
    """For launches outside every layer range (pos, pid, t, context, stage): new_layer and rule.
    Every lookup is an as-of join on the launches in time order: the stage (else iteration)
    range around each, the layer range that ended last before it, the next one to start."""
    at = at.sort("t")
    for kind, wanted in (("stage", pl.col("is_stage") & ~pl.col("is_iter")), ("iter", pl.col("is_iter"))):
        bounds = (by_time_ranges.filter(wanted).drop_nulls("pid")
                  .select("pid", pl.col("start_ns").alias(f"{kind}_start"), pl.col("end_ns").alias(f"{kind}_end"))
                  .sort(f"{kind}_start"))
        at = at.join_asof(bounds, left_on="t", right_on=f"{kind}_start", by="pid", strategy="backward",
                          check_sortedness=False)
    inside = {kind: pl.col("t") < pl.col(f"{kind}_end") for kind in ("stage", "iter")}
    at = at.with_columns(  # stage ranges first: they are the narrower
        bound_start=pl.when(inside["stage"]).then(pl.col("stage_start")).when(inside["iter"]).then(pl.col("iter_start")),
        bound_end=pl.when(inside["stage"]).then(pl.col("stage_end")).when(inside["iter"]).then(pl.col("iter_end")))
    ended = ranges.select("pid", end="end_ns", prev="nm").drop_nulls("pid").sort("end")
    started = ranges.select("pid", start="start_ns").drop_nulls("pid").sort("start")
    at = (at.join_asof(ended, left_on="t", right_on="end", by="pid", strategy="backward", check_sortedness=False)
          .join_asof(started, left_on="t", right_on="start", by="pid", strategy="forward", check_sortedness=False))
    in_stage = pl.col("bound_start").is_not_null()
    prev = in_stage & (pl.col("end") >= pl.col("bound_start"))
    next_ = in_stage & (pl.col("start") < pl.col("bound_end"))
    backward = pl.col("stage") == "backward"
    after, loss = prev & (backward | next_), (backward & next_) | (~backward & prev)
    return at.select(
        "pos", "context",
        new_layer=pl.when(after).then(pl.col("prev")).when(loss).then(pl.lit("loss")),
        rule=pl.when(after).then(pl.lit(AFTER)).when(loss).then(pl.lit(LOSS))
        .when(~in_stage).then(pl.lit(NO_STAGE)).when(next_).then(pl.lit(BEFORE_FIRST))
        .otherwise(pl.lit(NO_LAYERS)))
