"""Ranks against each other: `traceq ranks` (iteration time per rank, the slowest rank) and
`traceq ranks --by collective` (the collectives that started late, and what delayed them).

A collective cannot finish before its last rank starts it, so a rank that reaches it early
waits inside its kernel: wait_ns sums, per rank and iteration, the time between a collective's
start on the rank and its start on the last rank (clipped to the kernel). What a rank did in an
iteration without waiting for others is work_ns = span_ns - wait_ns; the slowest rank of an
iteration (the straggler) is the one the others waited for longest: the sum of the start skews
of the collectives it was the last to start (what `ranks --by collective` lists, so the two
agree); a rank with a longer span but no late start is not one (its span may begin earlier).
Where no collective started late, the rank with the most work_ns.

What delayed a late collective: on each rank, the window from the end of its previous
collective (or its iteration's first GPU work) to its start of this one. The late rank's window
is longer; the layer (or, outside layers, the kernel) whose GPU time in the window exceeds the
other ranks' mean by the most is named, or GPU idle time when the late rank's GPU sat idle
longer than theirs did (its host launched late).
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.multigpu.collectives import Progress, Rank, on_run_clock, rank_expr, run_ranks
from traceq.analysis.multigpu.comm import collective_kernels, with_skew
from traceq.analysis.multigpu.fanout import map_traces
from traceq.analysis.multigpu.overlap import interval_sums, overlap_table
from traceq.analysis.structure.attribution import kernel_launches, point_contexts
from traceq.analysis.structure.conventions import ITERATION_REGEX, steady
from traceq.errors import MissingDataError

IDLE = "(GPU idle)"
"""What `late_collectives` names when the late rank's GPU waited for its host."""


def rank_iterations(
    con: duckdb.DuckDBPyConnection, run_id: int, iteration_regex: str = ITERATION_REGEX,
    progress: Progress | None = None, busy: bool = False,
) -> pl.DataFrame:
    """Per iteration and rank: span_ns (first start to last end of its GPU work), comm_ns,
    wait_ns (in collectives, for later ranks), work_ns (span_ns - wait_ns), slowest (the
    straggler: the rank the others waited for longest, summing each collective's start skew over
    the collectives it started last; with no collective started late, the rank with the most
    work_ns), last_starts (collectives it was the last to start), held_ns (the start skews of
    those collectives summed: how long the others waited for it),
    shift_ns and drift_ppm (what puts the rank's times on the run's clock: `ranks` table). By iteration,
    then rank; work outside iteration ranges left out. With `busy`, also busy_ns: the time its
    computation kernels ran (`overlap`'s compute_ns, the union of their intervals; communication
    left out, its time includes waiting): the rank's load, free of clock skew and waits."""
    halves = [None, None] if progress is None else [lambda d, n: progress(d, 2 * n), lambda d, n: progress(n + d, 2 * n)]
    spans = overlap_table(con, run_id, iteration_regex, halves[0]).filter(steady())
    try:
        kernels = with_skew(collective_kernels(con, run_id, iteration_regex, halves[1]))
    except MissingDataError:  # no collectives: nobody waits
        kernels = None
    if kernels is not None:
        waits = (kernels.filter(pl.col("instance").is_not_null())
                 .group_by("rank", "iteration")
                 .agg(wait_ns=(pl.min_horizontal("end_ns", "last_start_ns") - pl.col("start_ns")).clip(0).sum(),
                      last_starts=(pl.col("start_ns") == pl.col("last_start_ns")).sum().cast(pl.Int64),
                      held_ns=pl.col("start_skew_ns").filter(pl.col("start_ns") == pl.col("last_start_ns")).sum()))
        spans = spans.join(waits, on=["rank", "iteration"], how="left")
    else:
        spans = spans.with_columns(wait_ns=pl.lit(0, pl.Int64), last_starts=pl.lit(0, pl.Int64),
                                   held_ns=pl.lit(0, pl.Int64))
    shifts = pl.DataFrame([(r.rank, r.shift_ns, r.drift_ppm) for r in run_ranks(con, run_id)],
                          schema={"rank": pl.Int32, "shift_ns": pl.Int64, "drift_ppm": pl.Float64}, orient="row")
    held = pl.col("held_ns").max().over("iteration") > 0  # someone was waited for: the one waited for longest
    frame = (spans.with_columns(pl.col("wait_ns", "last_starts", "held_ns").fill_null(0))
             .with_columns(work_ns=pl.col("span_ns") - pl.col("wait_ns"))
             .with_columns(slowest=pl.when(held).then(pl.col("held_ns") == pl.col("held_ns").max().over("iteration"))
                           .otherwise(pl.col("work_ns") == pl.col("work_ns").max().over("iteration")))
             .join(shifts, on="rank", how="left", maintain_order="left"))
    return frame.select("iteration", "rank", "span_ns", "comm_ns", "wait_ns", "work_ns", "slowest", "last_starts",
                        "held_ns", "shift_ns", "drift_ppm", *([pl.col("compute_ns").alias("busy_ns")] if busy else []))


def late_collectives(
    con: duckdb.DuckDBPyConnection, run_id: int, k: int = 10, iteration_regex: str = ITERATION_REGEX,
    progress: Progress | None = None,
) -> pl.DataFrame:
    """The `k` collectives with the largest start skew, and what delayed each (see the module
    docstring). Columns: collective, group, instance, iteration, start_skew_ns, last_rank, delayed_by
    (a layer, a kernel's short name, or IDLE), delayed_ns (its time on the last rank minus the
    other ranks' mean, in the window before the collective; both null when nothing took longer
    on the last rank: the delay began before the window), window_ns (the last rank's window)."""
    kernels = with_skew(collective_kernels(con, run_id, iteration_regex)).filter(pl.col("instance").is_not_null())
    late = (kernels.filter(pl.col("start_ns") == pl.col("last_start_ns"))
            .unique(["collective", "group", "instance"], keep="first")
            .filter(pl.col("start_skew_ns") > 0)
            .sort("start_skew_ns", descending=True).head(k)
            .select("collective", "group", "instance", "iteration", "start_skew_ns", last_rank="rank"))
    if late.is_empty():
        return late.with_columns(delayed_by=pl.lit(None, pl.String), delayed_ns=pl.lit(None, pl.Int64),
                                 window_ns=pl.lit(None, pl.Int64))
    windows = _windows(kernels, late)
    parts = map_traces(con, run_ranks(con, run_id), _window_kernels, windows, iteration_regex, progress=progress)
    inside, firsts = pl.concat([p[0] for p in parts]), pl.concat([p[1] for p in parts])
    common = firsts.group_by("iteration").agg(common_ns=pl.col("first_ns").min())
    windows = (windows.join(common, on="iteration", how="left", nulls_equal=True)
               .with_columns(w_start=pl.coalesce("w_start", "common_ns")).drop("common_ns").drop_nulls("w_start"))
    key = ["collective", "group", "instance"]
    keys = [*key, "rank"]
    by_what = inside.group_by(*keys, "what").agg(ns=(pl.col("end_ns") - pl.col("start_ns")).sum())
    busy = interval_sums(inside.select(*keys, work=pl.lit("compute"), start_ns="start_ns", end_ns="end_ns"), keys)
    idle = (windows.join(busy, on=keys, how="left", nulls_equal=True)
            .select(*keys, what=pl.lit(IDLE), ns=pl.col("w_end") - pl.col("w_start") - pl.col("busy_ns").fill_null(0)))
    work = pl.concat([by_what, idle], how="vertical_relaxed").join(late.select(*key, "last_rank"), on=key,
                                                                    nulls_equal=True)
    ranks_per = windows.group_by(key).agg(n=pl.col("rank").n_unique())
    on_last = pl.col("rank") == pl.col("last_rank")
    diff = (work.group_by(*key, "what")
            .agg(last=pl.col("ns").filter(on_last).sum(), rest=pl.col("ns").filter(~on_last).sum())
            .join(ranks_per, on=key, nulls_equal=True)
            .with_columns(delayed_ns=(pl.col("last") - pl.col("rest") / (pl.col("n") - 1).clip(1)).round().cast(pl.Int64))
            .sort(*key, "delayed_ns", "what", descending=[False] * len(key) + [True, False])
            .group_by(key, maintain_order=True).first()
            .select(*key, delayed_by=pl.when(pl.col("delayed_ns") > 0).then("what"),  # else nothing ran longer
                    delayed_ns=pl.when(pl.col("delayed_ns") > 0).then("delayed_ns")))
    window = (windows.join(late.select(*key, "last_rank"), on=key, nulls_equal=True).filter(on_last)
              .select(*key, window_ns=pl.col("w_end") - pl.col("w_start")))
    return (late.join(diff, on=key, how="left", nulls_equal=True).join(window, on=key, how="left", nulls_equal=True)
            .sort("start_skew_ns", descending=True))


def _windows(kernels: pl.DataFrame, late: pl.DataFrame) -> pl.DataFrame:
    """collective, group, instance, rank, iteration, w_start, w_end (run clock): each rank's window
    before each late collective (w_start null for the first of an iteration)."""
    ordered = kernels.sort("rank", "start_ns").with_columns(
        previous_end=pl.col("end_ns").shift(1).over("rank"), previous_iteration=pl.col("iteration").shift(1).over("rank"))
    same = pl.col("previous_iteration").eq_missing(pl.col("iteration"))
    return (ordered.join(late.select("collective", "group", "instance"), on=["collective", "group", "instance"],
                         nulls_equal=True)
            .select("collective", "group", "instance", "rank", "iteration",
                    w_start=pl.when(same).then(pl.col("previous_end")), w_end="start_ns"))


def _window_kernels(con: duckdb.DuckDBPyConnection, trace_id: int, ranks: list[Rank], windows: pl.DataFrame,
                    iteration_regex: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(inside, firsts) for this trace's ranks. inside: collective, group, instance, rank, what (layer,
    else kernel short name), start_ns, end_ns: the kernels in each window, cut at its end (a
    first collective's window, its start not known yet, takes the iteration's kernels before
    it). firsts: rank, iteration, first_ns (the first GPU start of the iteration). Run clock."""
    t = int(trace_id)
    kernels, names = kernel_launches(con, t, ("device_id", "start_ns", "end_ns"), ordered=False)
    index, contexts = point_contexts(con, t, kernels, iteration_regex, paths=False)
    mine = (kernels.select(rank=rank_expr(ranks), iteration=contexts["iteration"].gather(index),
                           what=pl.coalesce(contexts["layer"].gather(index), names["short_name"].gather(kernels["name_row"])),
                           start_ns="start_ns", end_ns="end_ns")
            .drop_nulls("rank").with_columns(*on_run_clock(ranks, "start_ns", "end_ns")))
    del kernels, index
    firsts = mine.group_by("rank", "iteration").agg(first_ns=pl.col("start_ns").min())
    here = windows.filter(pl.col("rank").is_in([r.rank for r in ranks]))
    inside = []
    for (collective, group, instance), window in here.group_by("collective", "group", "instance"):  # k, not kernels
        within = pl.when(pl.col("w_start").is_null()).then(pl.col("iteration").eq_missing(pl.col("iteration_right")))
        within = within.otherwise(pl.col("start_ns") >= pl.col("w_start")) & (pl.col("start_ns") < pl.col("w_end"))
        inside.append(mine.join(window, on="rank").filter(within).select(
            pl.lit(collective).alias("collective"), pl.lit(group, pl.String).alias("group"),
            pl.lit(instance, pl.Int64).alias("instance"), "rank", "what",
            "start_ns", end_ns=pl.min_horizontal("end_ns", "w_end")))
    schema = {"collective": pl.String, "group": pl.String, "instance": pl.Int64, "rank": pl.Int32, "what": pl.String,
              "start_ns": pl.Int64, "end_ns": pl.Int64}
    return pl.concat([pl.DataFrame(schema=schema), *inside], how="vertical_relaxed"), firsts
