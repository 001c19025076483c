"""GPU time per layer, pass, library and training stage: the `traceq layers`, `libs` and `stages`
analyses, and the NVTX context columns of `traceq top`.

Built on `attribution.kernel_attribution` (which NVTX ranges enclose each launch) and
`classify.classify_names` (which library each kernel name belongs to). Times are integer ns.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.attribution import ITERATION_REGEX, gpu_activity, kernel_attribution
from traceq.analysis.classify import classify_names

STAGE_COLUMNS = ("data_copy", "forward", "backward", "weight_update", "other")


def attributed_kernels(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """Every kernel with its duration, name, classification (library, operation) and attribution."""
    kernels = con.sql(
        f"SELECT kernel_id, device_id, start_ns, dur_ns, name, short_name FROM kernels "
        f"WHERE trace_id = {int(trace_id)} ORDER BY kernel_id").pl()
    classes = classify_names(kernels["name"].unique(maintain_order=True)).select("name", "library", "operation")
    return (kernels.join(classes, on="name", how="left")
            .join(kernel_attribution(con, trace_id, iteration_regex, paths=False).drop("nvtx_path", "nvtx_innermost"),
                  on="kernel_id", how="left"))


def _first_three(texts: pl.Expr) -> pl.Expr:
    """The first three values joined with ', ', then '…' when there were more."""
    return (pl.when(pl.len() > 3).then(texts.head(3).str.join(", ") + ", …")
            .otherwise(texts.str.join(", ")))


def _split(frame: pl.DataFrame, keys: list[str], column: str, label: str) -> pl.DataFrame:
    """Per group of `keys`: 'cuDNN 80%, PyTorch ATen 20%' over the values of `column`."""
    parts = (frame.group_by([*keys, column]).agg(pl.col("dur_ns").sum())
             .with_columns(share=pl.col("dur_ns") / pl.col("dur_ns").sum().over(keys))
             .sort([*keys, "dur_ns", column], descending=[False] * len(keys) + [True, False], nulls_last=True)
             .with_columns(text=pl.col(column).fill_null("none") + " "
                           + (pl.col("share") * 100).round(0).cast(pl.Int64).cast(pl.String) + "%"))
    return parts.group_by(keys, maintain_order=True).agg(_first_three(pl.col("text")).alias(label))


def layer_times(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """GPU time per (layer, pass), heaviest first.

    Columns: layer (null: launched outside every layer range), pass, kernels, total_ns, pct
    (share of all kernel time, %), heaviest (short name of the kernel with most time in the group),
    libraries ('cuDNN 80%, PyTorch ATen 20%'; the three largest, then '…').
    """
    k = attributed_kernels(con, trace_id, iteration_regex)
    keys = ["layer", "pass"]
    totals = k.group_by(keys).agg(kernels=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum().cast(pl.Int64))
    heaviest = (k.group_by([*keys, "short_name"]).agg(pl.col("dur_ns").sum())
                .sort([*keys, "dur_ns", "short_name"], descending=[False, False, True, False], nulls_last=True)
                .group_by(keys, maintain_order=True).agg(heaviest=pl.col("short_name").first()))
    grand = max(int(k["dur_ns"].sum()), 1)
    return (totals.join(heaviest, on=keys, how="left", nulls_equal=True)
            .join(_split(k, keys, "library", "libraries"), on=keys, how="left", nulls_equal=True)
            .with_columns(pct=100.0 * pl.col("total_ns") / grand)
            .sort(["total_ns", "layer", "pass"], descending=[True, False, False], nulls_last=True)
            .select("layer", "pass", "kernels", "total_ns", "pct", "heaviest", "libraries"))


def library_times(
    con: duckdb.DuckDBPyConnection, trace_id: int, by_layer: bool = False,
    iteration_regex: str = ITERATION_REGEX,
) -> pl.DataFrame:
    """GPU time per library (per layer, pass and library with `by_layer`), heaviest first.

    Columns: [layer, pass,] library, kernels, total_ns, pct (share of all kernel time, %),
    operations ('convolution 90%, gemm 10%').
    """
    k = attributed_kernels(con, trace_id, iteration_regex)
    keys = ["layer", "pass", "library"] if by_layer else ["library"]
    grand = max(int(k["dur_ns"].sum()), 1)
    frame = (k.group_by(keys).agg(kernels=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum().cast(pl.Int64))
             .join(_split(k, keys, "operation", "operations"), on=keys, how="left", nulls_equal=True)
             .with_columns(pct=100.0 * pl.col("total_ns") / grand))
    order = (["total_ns", "library"], [True, False])
    if by_layer:  # layers heaviest first, libraries heaviest first within each
        layer_total = frame.group_by("layer", "pass").agg(layer_ns=pl.col("total_ns").sum())
        frame = frame.join(layer_total, on=["layer", "pass"], how="left", nulls_equal=True)
        order = (["layer_ns", "layer", "pass", "total_ns", "library"], [True, False, False, True, False])
    return (frame.sort(order[0], descending=order[1], nulls_last=True)
            .select(*keys, "kernels", "total_ns", "pct", "operations"))


def _busy_ns(starts: pl.Series, ends: pl.Series) -> int:
    """Length of the union of intervals [start, end)."""
    frame = pl.DataFrame({"s": starts, "e": ends}).sort("s")
    frame = frame.with_columns(prev_end=pl.col("e").cum_max().shift(1))
    frame = frame.with_columns(island=(pl.col("prev_end").is_null() | (pl.col("s") > pl.col("prev_end"))).cum_sum())
    islands = frame.group_by("island").agg(pl.col("s").min(), pl.col("e").max())
    return int((islands["e"] - islands["s"]).sum())


def stage_times(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """GPU time per iteration and device in each training stage (the paper's figure 4).

    Columns: iteration, device_id, data_copy_ns, forward_ns, backward_ns, weight_update_ns,
    other_ns (GPU time of kernels, memcpys and memsets launched in each stage; copies count
    where they were issued), span_ns (first GPU start to last GPU end of the iteration's work),
    busy_ns (time any of it ran), idle_ns (span_ns - busy_ns), idle_pct (% of the span).
    Work launched outside every iteration range is one row with a null iteration.
    """
    act = gpu_activity(con, trace_id, iteration_regex)
    keys = ["iteration", "device_id"]
    rows = []
    for (iteration, device), group in act.group_by(keys, maintain_order=True):
        row: dict[str, object] = {"iteration": iteration, "device_id": device}
        for stage in STAGE_COLUMNS:
            row[f"{stage}_ns"] = int(group.filter(pl.col("stage") == stage)["dur_ns"].sum())
        span = int(group["end_ns"].max() - group["start_ns"].min())
        busy = _busy_ns(group["start_ns"], group["end_ns"])
        row.update(span_ns=span, busy_ns=busy, idle_ns=span - busy,
                   idle_pct=100.0 * (span - busy) / span if span else 0.0, first_ns=int(group["start_ns"].min()))
        rows.append(row)
    schema = {"iteration": pl.String, "device_id": pl.Int32, **{f"{s}_ns": pl.Int64 for s in STAGE_COLUMNS},
              "span_ns": pl.Int64, "busy_ns": pl.Int64, "idle_ns": pl.Int64, "idle_pct": pl.Float64,
              "first_ns": pl.Int64}
    frame = pl.DataFrame(rows, schema=schema, orient="row")
    return (frame.with_columns(order=pl.col("first_ns").min().over("iteration"))
            .sort(pl.col("iteration").is_null(), "order", "device_id").drop("first_ns", "order"))


def kernel_context(
    con: duckdb.DuckDBPyConnection, trace_id: int, name_column: str = "name",
    iteration_regex: str = ITERATION_REGEX,
) -> pl.DataFrame:
    """Per kernel name (as grouped by `name_column`): layer, pass and library, for `traceq top`.

    layer: the layers the name ran in, most time first, joined with ', ' (at most three, then
    '…'); pass: 'forward', 'backward' or 'both'.
    """
    k = attributed_kernels(con, trace_id, iteration_regex)
    if name_column != "name":
        k = k.drop("name").rename({name_column: "name"}) if name_column in k.columns else k
    per_layer = (k.group_by("name", "layer").agg(pl.col("dur_ns").sum())
                 .sort(["name", "dur_ns", "layer"], descending=[False, True, False], nulls_last=True)
                 .drop_nulls("layer")
                 .group_by("name", maintain_order=True)
                 .agg(layer=_first_three(pl.col("layer"))))
    passes = (k.group_by("name").agg(
        pl.when(pl.col("pass").drop_nulls().n_unique() > 1).then(pl.lit("both"))
        .otherwise(pl.col("pass").drop_nulls().first()).alias("pass"),
        pl.col("library").first()))
    return passes.join(per_layer, on="name", how="left").select("name", "layer", "pass", "library")


def instance_context(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """kernel_id, layer, pass, library of every kernel (for `traceq top --instances`)."""
    return attributed_kernels(con, trace_id, iteration_regex).select("kernel_id", "layer", "pass", "library")
