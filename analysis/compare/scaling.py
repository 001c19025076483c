"""Runs of different GPU counts side by side: `traceq compare A B` when either is a run of several
ranks (1 GPU against N, or N against M).

Each run's time is per GPU and per iteration: a layer's (kernel's, library's, stage's) GPU time
summed over the run's ranks, divided by its ranks and by its iterations. In data-parallel
training each GPU does the same work whatever their number (weak scaling), so with perfect
scaling a layer's time per GPU and iteration stays the same, and what the larger run adds is
communication. scaling_pct = 100 x (time on the run with fewer GPUs) / (time on the one with
more): 100 % scales perfectly, lower is time lost. Two rows beyond the groups: '(communication)',
the collectives' kernel time, and '(exposed communication)', the part no computation hid (as
`traceq overlap` counts them), per GPU and iteration; and '(iteration)', the mean span of an
iteration on a GPU, whose scaling_pct is the run's weak-scaling efficiency.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.choices import CompareBy
from traceq.analysis.multigpu.collectives import by_trace, run_ranks
from traceq.analysis.multigpu.overlap import overlap_table
from traceq.analysis.structure.conventions import ITERATION_REGEX, steady
from traceq.analysis.structure.layers import STAGE_COLUMNS, attributed_kernels, stage_times

_KEYS = {CompareBy.layer: ["layer", "pass"], CompareBy.kernel: ["name"], CompareBy.library: ["library"],
         CompareBy.stage: ["stage"]}


def run_gpus(con: duckdb.DuckDBPyConnection, run_id: int) -> int:
    return int(con.execute("SELECT world_size FROM runs WHERE run_id = ?", [run_id]).fetchone()[0])


def per_gpu_times(con: duckdb.DuckDBPyConnection, run_id: int, by: CompareBy,
                  iteration_regex: str = ITERATION_REGEX) -> pl.DataFrame:
    """The keys of `by`, time_ns: GPU time per GPU and iteration of one run, and the rows
    '(communication)', '(exposed communication)' and '(iteration)' (in the first key column)."""
    keys = _KEYS[by]
    ranks = run_ranks(con, run_id)
    gpus = len(ranks)
    parts = []
    for trace_id in by_trace(ranks):
        if by is CompareBy.stage:
            stages = stage_times(con, trace_id, iteration_regex).filter(steady())
            per = max(stages["iteration"].n_unique(), 1)
            parts.append(pl.DataFrame({"stage": list(STAGE_COLUMNS),
                                       "time_ns": [stages[f"{s}_ns"].sum() / per for s in STAGE_COLUMNS]}))
        else:
            kernels = attributed_kernels(con, trace_id, iteration_regex).filter(steady())
            per = max(kernels["iteration"].n_unique(), 1)
            parts.append(kernels.group_by(keys).agg(time_ns=pl.col("dur_ns").sum() / per))
    frame = pl.concat(parts).group_by(keys).agg(pl.col("time_ns").sum() / gpus)
    overlap = overlap_table(con, run_id, iteration_regex).filter(steady())
    extra = {"(communication)": overlap["comm_ns"].mean(), "(exposed communication)": overlap["exposed_ns"].mean(),
             "(iteration)": overlap["span_ns"].mean()}
    rows = pl.DataFrame({keys[0]: list(extra), "time_ns": [float(v or 0.0) for v in extra.values()]})
    return pl.concat([frame.with_columns(pl.col("time_ns").cast(pl.Float64)), rows], how="diagonal_relaxed")


def compare_scaling(con: duckdb.DuckDBPyConnection, run_a: int, run_b: int, by: CompareBy | str = CompareBy.layer,
                    iteration_regex: str = ITERATION_REGEX) -> pl.DataFrame:
    """Runs `a` and `b` per GPU and iteration, heaviest first, the module's three rows last.

    Columns: the keys (layer, pass | name | library | stage), a_ns, b_ns (GPU time per GPU and
    iteration; null where the run has no such row), diff_ns (b - a), ratio (b / a), a_gpus,
    b_gpus, scaling_pct (100 x the time on the run with fewer GPUs / on the one with more;
    null for equal counts, or where either time is 0 or missing).
    """
    by = CompareBy(by)
    keys = _KEYS[by]
    ga, gb = run_gpus(con, run_a), run_gpus(con, run_b)
    ta, tb = (per_gpu_times(con, r, by, iteration_regex) for r in (run_a, run_b))
    frame = (ta.join(tb, on=keys, how="full", coalesce=True, suffix="_b", nulls_equal=True)
             .rename({"time_ns": "a_ns", "time_ns_b": "b_ns"}))
    few, many = (pl.col("a_ns"), pl.col("b_ns")) if ga < gb else (pl.col("b_ns"), pl.col("a_ns"))
    frame = frame.with_columns(
        pl.col("a_ns", "b_ns").round().cast(pl.Int64),
        diff_ns=(pl.col("b_ns").fill_null(0) - pl.col("a_ns").fill_null(0)).round().cast(pl.Int64),
        ratio=pl.when(pl.col("a_ns") > 0).then(pl.col("b_ns") / pl.col("a_ns")),
        a_gpus=pl.lit(ga, pl.Int64), b_gpus=pl.lit(gb, pl.Int64),
        scaling_pct=pl.when((pl.lit(ga) != pl.lit(gb)) & (many > 0) & (few > 0)).then(100.0 * few / many))
    extra = pl.col(keys[0]).is_in(["(communication)", "(exposed communication)", "(iteration)"])
    order = pl.max_horizontal(pl.col("a_ns").fill_null(0), pl.col("b_ns").fill_null(0))
    body = frame.filter(~extra | pl.col(keys[0]).is_null()).sort(order, *keys, descending=[True] + [False] * len(keys),
                                                                  nulls_last=True)
    if by is CompareBy.stage:
        body = frame.filter(~extra).sort(pl.col("stage").replace_strict(list(STAGE_COLUMNS), range(5), default=9))
    tail = frame.filter(extra).sort(pl.col(keys[0]).replace_strict(
        ["(communication)", "(exposed communication)", "(iteration)"], [0, 1, 2]))
    return pl.concat([body, tail]).select(*keys, "a_ns", "b_ns", "diff_ns", "ratio", "a_gpus", "b_gpus", "scaling_pct")
