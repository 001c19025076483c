"""Two runs side by side: `traceq compare A B` (cuDNN vs cuBLAS, batch 128 vs 256, before and
after a change). Rows are layers, kernels, libraries or stages present in either run; times are
per iteration when both traces mark iterations (runs of different lengths compare fairly), else
totals. RU (kernel-time-weighted) comes with every grouping but stages; CE comes where FLOPs are
known (shapes in the trace or a model spec).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from traceq.analysis.choices import CompareBy
from traceq.analysis.efficiency.ce import GroupBy
from traceq.analysis.efficiency.ru import ru_table
from traceq.analysis.structure.conventions import ITERATION_REGEX, steady
from traceq.analysis.structure.layers import launch_groups, stage_times
from traceq.errors import MissingDataError

_KEYS = {CompareBy.layer: ["layer", "pass"], CompareBy.kernel: ["name"], CompareBy.library: ["library"],
         CompareBy.stage: ["stage"]}


def iteration_count(kernels: pl.DataFrame) -> int:
    """Distinct steady-state iterations the kernels ran in (0 when the trace marks none); `kernels`: a
    trace's `attributed_kernels` or its `launch_groups`."""
    return kernels.filter(steady())["iteration"].n_unique()


def _stage_times(stages: pl.DataFrame, per_iteration: bool) -> pl.DataFrame:
    """stage, kernels (null), time_ns from one trace's `stage_times` (per iteration when asked)."""
    if per_iteration:
        stages = stages.filter(steady())
    columns = ["data_copy_ns", "forward_ns", "backward_ns", "weight_update_ns", "other_ns", "idle_ns", "span_ns"]
    sums = stages.select(pl.col(columns).sum())
    divisor = stages["iteration"].n_unique() if per_iteration else 1
    return pl.DataFrame({"stage": [c.removesuffix("_ns") for c in columns],
                         "kernels": [None] * len(columns),
                         "time_ns": [int(sums[c][0]) // divisor for c in columns]},
                        schema={"stage": pl.String, "kernels": pl.Int64, "time_ns": pl.Int64})


def _group_times(groups: pl.DataFrame, keys: list[str], per_iteration: bool) -> pl.DataFrame:
    """keys, kernels, time_ns from one trace's launch groups (per iteration when asked)."""
    divisor = iteration_count(groups) if per_iteration else 1
    if per_iteration:
        groups = groups.filter(steady())
    frame = groups.group_by(keys).agg(kernels=pl.col("instances").sum().cast(pl.Int64),
                                      time_ns=pl.col("dur_ns").sum())
    return frame.with_columns(kernels=pl.col("kernels") // divisor, time_ns=pl.col("time_ns") // divisor)


def compare_runs(
    con: duckdb.DuckDBPyConnection, a: int, b: int, by: CompareBy | str = CompareBy.layer, *,
    iteration_regex: str = ITERATION_REGEX, spec: Path | None = None,
    groups: tuple[pl.DataFrame, pl.DataFrame] | None = None, stages: tuple[pl.DataFrame, pl.DataFrame] | None = None,
    kernels: tuple[pl.DataFrame | None, pl.DataFrame | None] = (None, None),
) -> tuple[pl.DataFrame, bool]:
    """Runs `a` and `b` side by side, heaviest (in either) first (`groups`: their
    `layers.launch_groups`, `stages`: their `stage_times`, `kernels`: their `attributed_kernels`
    for CE, when the caller has them; CE reads them only for traces with FLOPs).

    Returns (frame, per_iteration). Columns: the keys (layer, pass | name | library | stage),
    a_kernels, b_kernels (not for stages), a_ns, b_ns (GPU time: per iteration when per_iteration, else total),
    diff_ns (b - a), ratio (b / a), and except for stages: a_ru, b_ru (fractions); with FLOPs
    for both runs (layer and library): a_tflops, b_tflops (achieved TFLOP/s) and a_ce, b_ce
    (fractions of the peak of the precision the kernels ran at, `efficiency.ce_table`). A row
    missing from one run has nulls there.
    """
    by = CompareBy(by)
    keys = _KEYS[by]
    if by is CompareBy.stage:  # stage_times attributes kernels and copies itself
        sa, sb = stages or tuple(stage_times(con, t, iteration_regex) for t in (a, b))
        per_iteration = all(s["iteration"].drop_nulls().len() > 0 for s in (sa, sb))
        ta, tb = (_stage_times(s, per_iteration) for s in (sa, sb))
    else:
        ga, gb = groups or tuple(launch_groups(con, t, iteration_regex) for t in (a, b))
        per_iteration = iteration_count(ga) > 0 and iteration_count(gb) > 0
        ta, tb = (_group_times(g, keys, per_iteration) for g in (ga, gb))
    frame = ta.join(tb, on=keys, how="full", coalesce=True, suffix="_b", nulls_equal=True).rename(
        {"kernels": "a_kernels", "time_ns": "a_ns", "kernels_b": "b_kernels", "time_ns_b": "b_ns"})
    frame = frame.with_columns(
        diff_ns=pl.col("b_ns").fill_null(0) - pl.col("a_ns").fill_null(0),
        ratio=pl.when(pl.col("a_ns") > 0).then(pl.col("b_ns") / pl.col("a_ns")))
    if by is not CompareBy.stage:
        group = GroupBy(by.value)
        for side, trace, g in (("a", a, ga), ("b", b, gb)):
            ru = ru_table(con, trace, group, iteration_regex=iteration_regex, groups=g)
            frame = frame.join(ru.select(*keys, pl.col("ru").alias(f"{side}_ru")), on=keys, how="left",
                               nulls_equal=True)
        if by in (CompareBy.layer, CompareBy.library):
            frame = _with_ce(con, frame, (("a", a, kernels[0]), ("b", b, kernels[1])), keys, group, spec,
                             iteration_regex)
    order = pl.max_horizontal(pl.col("a_ns").fill_null(0), pl.col("b_ns").fill_null(0))
    if by is CompareBy.stage:  # in the stages' own order; kernel counts mean nothing here
        return frame.drop("a_kernels", "b_kernels"), per_iteration
    return frame.sort(order, *keys, descending=[True] + [False] * len(keys), nulls_last=True), per_iteration


def _with_ce(con, frame: pl.DataFrame, sides: tuple[tuple[str, int, pl.DataFrame | None], ...], keys: list[str],
             group: GroupBy, spec: Path | None, iteration_regex: str) -> pl.DataFrame:
    """Adds a_tflops, b_tflops, a_ce and b_ce when both runs have FLOPs; leaves the frame as it is otherwise.
    `sides`: (letter, trace id, attributed kernels or None) of each run."""
    from traceq.analysis.efficiency.ce import ce_table

    columns = []
    for side, trace, k in sides:
        try:
            ce = ce_table(con, trace, group, spec=spec, iteration_regex=iteration_regex, kernels=k)
        except MissingDataError:
            return frame
        columns.append(ce.select(*keys, pl.col("tflops").alias(f"{side}_tflops"), pl.col("ce").alias(f"{side}_ce")))
    for ce in columns:
        frame = frame.join(ce, on=keys, how="left", nulls_equal=True)
    return frame
