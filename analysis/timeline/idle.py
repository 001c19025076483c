"""GPU idle time by cause: the `traceq idle` tables, sums over the gaps of `analysis.timeline.gaps`.

`idle_causes` gives one row per cause (time, share, the calls and work behind it);
`idle_split` the time of each cause per iteration and device, per stream, or per layer (the
layer of the work the GPU waited for). Times are integer ns.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl

from traceq.analysis.choices import IdleBy
from traceq.analysis.structure.conventions import ITERATION_REGEX, WARM_UP
from traceq.analysis.timeline.gaps import CAUSE_LABELS, CAUSES, gap_frame, work_names
from traceq.store import registered


@dataclass(frozen=True)
class IdleTotals:
    """The totals `traceq idle` states in its title."""

    span_ns: int  # per device, first work start to last work end, summed over devices
    idle_ns: int  # all gaps
    iterations: int  # steady iteration ranges the gaps' work belongs to (the warm-up is none)
    devices: int
    steady_idle_ns: int | None = None  # the gaps of those iterations (None: as idle_ns)

    @property
    def per_iteration_ns(self) -> float:
        """Idle time per steady iteration: their gaps over their number."""
        idle = self.idle_ns if self.steady_idle_ns is None else self.steady_idle_ns
        return idle / max(self.iterations, 1)


def _shares(frame: pl.DataFrame, keys: list[str], column: str, label: str) -> pl.DataFrame:
    """Per group of `keys`: every value of `column`, by dur_ns, with its share:
    'cudaStreamSynchronize 92%, cudaFree 8%, cudaMemcpy <1%' (a table cuts the list: 'a, b +1')."""
    percent = (100 * pl.col("share")).round(0).cast(pl.Int64)
    parts = (frame.drop_nulls(column).group_by([*keys, column]).agg(pl.col("dur_ns").sum())
             .with_columns(share=pl.col("dur_ns") / pl.col("dur_ns").sum().over(keys))
             .sort([*keys, "dur_ns", column], descending=[False] * len(keys) + [True, False])
             .with_columns(text=pl.col(column) + " " + pl.when(percent < 1).then(pl.lit("<1"))
                           .otherwise(percent.cast(pl.String)) + "%"))
    return parts.group_by(keys, maintain_order=True).agg(pl.col("text").str.join(", ").alias(label))


def idle_causes(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX,
    gaps: tuple[pl.LazyFrame, dict[str, pl.Series]] | None = None,
) -> tuple[pl.DataFrame, IdleTotals]:
    """GPU idle time per cause (`gaps.CAUSES`, every one, in that order, named by `gaps.CAUSE_LABELS`),
    and the totals.

    Columns: cause, gaps, total_ns, pct (share of all idle time, %), span_pct (share of the
    devices' span, %), per_iteration_ns (the cause's idle time in the steady iterations over
    their number: the warm-up's gaps are in total_ns only; null without iteration ranges), longest_ns (the longest gap), call_shares (for sync and h2d gaps the blocking or
    copy calls, else the calls that issued the work, with their share of the cause's time),
    work_shares (the work the GPU waited for, by short kernel name or copy kind, with its share). `gaps`:
    the trace's `gaps.gap_frame`, when the caller has it already.
    """
    gaps, names = gap_frame(con, trace_id, iteration_regex) if gaps is None else gaps
    totals = idle_totals(con, trace_id, gaps=(gaps, names))
    grand = max(totals.idle_ns, 1)
    # the gaps grouped by their codes first (millions of gaps, a few thousand groups), named after
    groups = _code_groups(con, gaps, _steady(names))
    by_call = groups.group_by("cause", "call").agg(pl.col("dur_ns").sum())
    by_work = groups.group_by("cause", "next_kind", "next_item").agg(pl.col("dur_ns").sum())
    detail_calls = by_call.with_columns(call=names["api"].gather(by_call["call"]))
    detail_work = by_work.select("cause", "dur_ns", waiting=work_names(by_work, names, "kernel_short"))
    # per iteration: the steady iterations' gaps over their number (the warm-up's are not an iteration's)
    per_cause = (groups.group_by("cause").agg(gaps=pl.col("gaps").sum().cast(pl.Int64), total_ns=pl.col("dur_ns").sum(),
                                              longest_ns=pl.col("longest_ns").max(),
                                              steady_ns=pl.col("steady_ns").sum()))
    frame = (pl.DataFrame({"cause": pl.int_range(0, len(CAUSES), dtype=pl.UInt8, eager=True)})
             .join(per_cause, on="cause", how="left")
             .join(_shares(detail_calls, ["cause"], "call", "call_shares"), on="cause", how="left")
             .join(_shares(detail_work, ["cause"], "waiting", "work_shares"), on="cause", how="left")
             .with_columns(pl.col("gaps", "total_ns").fill_null(0))
             .with_columns(pct=100.0 * pl.col("total_ns") / grand,
                           span_pct=100.0 * pl.col("total_ns") / max(totals.span_ns, 1),
                           per_iteration_ns=(pl.col("steady_ns").fill_null(0) // totals.iterations)
                           if totals.iterations else pl.lit(None, pl.Int64))
             .sort("cause"))
    return (frame.select(pl.Series([CAUSE_LABELS[c] for c in CAUSES]).gather(frame["cause"]).alias("cause"), "gaps", "total_ns", "pct",
                         "span_pct", "per_iteration_ns", "longest_ns", "call_shares", "work_shares"), totals)


def _code_groups(con: duckdb.DuckDBPyConnection, gaps: pl.LazyFrame, steady: pl.Expr) -> pl.DataFrame:
    """The gaps per cause, call, next_kind and next_item (`gaps.gap_frame`'s codes): those four,
    dur_ns (their time), steady_ns (that of the gaps in steady iterations: `steady`), gaps and
    longest_ns (`_summed`)."""
    frame = gaps.select("cause", "call", "next_kind", "next_item", "dur_ns", steady=steady).collect()
    return _summed(con, frame, ["cause", "call", "next_kind", "next_item"],
                   "sum(dur_ns)::BIGINT AS dur_ns, coalesce(sum(dur_ns) FILTER (WHERE steady), 0)::BIGINT AS steady_ns, "
                   "count(*) AS gaps, max(dur_ns) AS longest_ns")


def _steady(names: dict[str, pl.Series]) -> pl.Expr:
    """Whether a gap (`gaps.gap_frame`'s) belongs to a steady iteration (one of `names`'
    iterations other than the warm-up)."""
    return pl.col("iteration").is_in([i for i, name in enumerate(names["iteration"].to_list()) if name != WARM_UP])


def _summed(con: duckdb.DuckDBPyConnection, frame: pl.DataFrame, keys: list[str], sums: str) -> pl.DataFrame:
    """`frame` grouped by `keys` with the SQL aggregates `sums`, in DuckDB: millions of gaps into
    a few thousand groups in a third of the time and memory Polars' group_by takes."""
    with registered(con, gaps=frame) as view:
        return con.sql(f"SELECT {', '.join(keys)}, {sums} FROM {view['gaps']} GROUP BY ALL").pl()


def idle_totals(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX,
    gaps: tuple[pl.LazyFrame, dict[str, pl.Series]] | None = None,
) -> IdleTotals:
    """The totals of `idle_causes` alone (what `traceq idle --by` states in its title). `gaps` as
    for `idle_causes`."""
    frame, lookups = gap_frame(con, trace_id, iteration_regex) if gaps is None else gaps
    t = int(trace_id)
    span = con.execute(f"""
        SELECT coalesce(sum(hi - lo), 0), count(*) FROM (
            SELECT device_id, min(lo) AS lo, max(hi) AS hi FROM (
                SELECT q.device_id, e.lo, e.hi FROM (  -- per queue first: a few rows to join, not every kernel
                    SELECT queue_id, min(start_ns) AS lo, max(end_ns) AS hi FROM kernel_events
                    WHERE trace_id = {t} GROUP BY queue_id) e
                JOIN kernel_queues q ON q.trace_id = {t} AND q.queue_id = e.queue_id
                UNION ALL SELECT device_id, start_ns, end_ns FROM memops WHERE trace_id = {t})
            GROUP BY device_id)""").fetchall()[0]
    steady = _steady(lookups)
    idle_ns, iterations, steady_ns = frame.select(pl.col("dur_ns").sum(), pl.col("iteration").filter(steady).n_unique(),
                                                  pl.col("dur_ns").filter(steady).sum().alias("steady_ns")).collect().row(0)
    return IdleTotals(span_ns=int(span[0]), idle_ns=int(idle_ns), iterations=iterations, devices=int(span[1]),
                      steady_idle_ns=int(steady_ns or 0))


def idle_split(
    con: duckdb.DuckDBPyConnection, trace_id: int, by: IdleBy | str, iteration_regex: str = ITERATION_REGEX,
    gaps: tuple[pl.LazyFrame, dict[str, pl.Series]] | None = None,
) -> pl.DataFrame:
    """GPU idle time per cause, split by iteration (and device), stream or layer.

    Columns: the keys (iteration, device_id | device_id, stream_id | layer, pass: those of the
    work that ended each gap), gaps, idle_ns, then one `<cause>_ns` column per cause. Iterations
    in time order (gaps outside every iteration last), streams by device and stream, layers
    most idle first. The layer needs each gap's work attributed to NVTX ranges
    (`attribution.point_contexts`), which costs about a second per million gaps. `gaps` as for
    `idle_causes`.
    """
    by = IdleBy(by)
    gaps, names = gap_frame(con, trace_id, iteration_regex) if gaps is None else gaps
    # per key and cause first (millions of gaps, a few groups), then the causes side by side
    if by is IdleBy.layer:
        keys = ["layer", "pass"]
        per_cause = _layer_sums(con, trace_id, gaps, iteration_regex)
    else:  # by iteration: grouped by the iterations' codes, named after
        keys = ["iteration", "device_id"] if by is IdleBy.iteration else ["device_id", "stream_id"]
        per_cause = _summed(con, gaps.select(*keys, "cause", "dur_ns", "start_ns").collect(), [*keys, "cause"], _SUMS)
    sums = [pl.col("idle_ns").filter(pl.col("cause") == i).sum().alias(f"{c}_ns") for i, c in enumerate(CAUSES)]
    table = per_cause.group_by(keys).agg(gaps=pl.col("gaps").sum().cast(pl.Int64), idle_ns=pl.col("idle_ns").sum(),
                                         first_ns=pl.col("first_ns").min(), *sums)
    if by is IdleBy.iteration:
        table = (table.with_columns(iteration=names["iteration"].gather(table["iteration"]))
                 .with_columns(order=pl.col("first_ns").min().over("iteration"))
                 .sort(pl.col("iteration").is_null(), "order", "device_id"))
    elif by is IdleBy.stream:
        table = table.sort(keys)
    else:
        table = table.sort(["idle_ns", *keys], descending=[True, False, False], nulls_last=True)
    return table.select(*keys, "gaps", "idle_ns", *[f"{c}_ns" for c in CAUSES])


_SUMS = "count(*) AS gaps, sum(dur_ns)::BIGINT AS idle_ns, min(start_ns) AS first_ns"
"""What `idle_split` sums per key and cause."""


def _layer_sums(con: duckdb.DuckDBPyConnection, trace_id: int, gaps: pl.LazyFrame,
                iteration_regex: str) -> pl.DataFrame:
    """`idle_split`'s sums per layer, pass and cause. A gap's layer and pass are the NVTX context
    of the call that issued its work (for a kernel replayed from a CUDA graph, of its capture:
    `analysis.structure.graphs`). The gaps are summed per thread, call time (`_time_classes`) and cause
    first, and the contexts found for those groups, not for each of millions of gaps."""
    from traceq.analysis.structure.attribution import point_contexts
    from traceq.analysis.structure.graphs import node_origins_sql

    gaps = gaps.select("pid", "tid", "call_start_ns", "graph_node_id", "cause", "dur_ns", "start_ns").collect()
    tid, t, replay = gaps["tid"], gaps["call_start_ns"], gaps["call_start_ns"]
    if gaps["graph_node_id"].null_count() < gaps.height:
        origins = con.sql(node_origins_sql(trace_id)).pl()
        found = (gaps.select("pid", "graph_node_id").with_row_index("row")
                 .join(origins, on=["pid", "graph_node_id"], how="inner"))
        tid, t = tid.scatter(found["row"], found["origin_tid"]), t.scatter(found["row"], found["origin_ns"])
    t, replay = _time_classes(_nvtx_bounds(con, trace_id), t, replay)
    points = _summed(con, gaps.select("pid", "cause", "dur_ns", "start_ns", tid=tid, t=t, time=replay),
                     ["pid", "tid", "t", "time", "cause"], _SUMS)
    index, contexts = point_contexts(con, trace_id, points, iteration_regex, paths=False)
    return (points.select(contexts["layer"].gather(index), contexts["pass"].gather(index), "cause", "gaps", "idle_ns",
                          "first_ns")
            .group_by("layer", "pass", "cause").agg(pl.col("gaps", "idle_ns").sum(), pl.col("first_ns").min()))


def _nvtx_bounds(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.Series:
    """Every distinct start and end time of the trace's NVTX events, ascending."""
    return con.sql(f"""
        SELECT DISTINCT v FROM (SELECT start_ns AS v FROM nvtx_events WHERE trace_id = {int(trace_id)}
                                UNION ALL SELECT end_ns FROM nvtx_events WHERE trace_id = {int(trace_id)})
        WHERE v IS NOT NULL ORDER BY v""").pl()["v"]


def _time_classes(bounds: pl.Series, t: pl.Series, replay: pl.Series) -> tuple[pl.Series, pl.Series]:
    """Points' times (t; replay: when a kernel replayed from a CUDA graph ran, else t) with each
    t replaced by a time that attribution cannot tell from it, so that millions of launches
    become a few points per NVTX range. Attribution only compares a time with the starts and
    ends of the trace's NVTX ranges (`_nvtx_bounds`, ascending; `attribution.point_contexts`:
    binary searches and as-of joins), so every time strictly between two consecutive
    boundaries compares alike, as does every time before the first: each class stands as its
    boundary + 1 (the first's as boundary - 1), a time equal to a boundary as itself. A
    replayed kernel's times are kept as they are (its replay time is compared too); with as
    many boundaries as points, all are."""
    if 2 * len(bounds) >= len(t):
        return t, replay
    moved = t.is_not_null() & replay.is_not_null() & (t != replay)
    if bounds.is_empty():
        rep = pl.repeat(0, len(t), dtype=t.dtype, eager=True)
    else:
        at = bounds.search_sorted(t.fill_null(0), side="right").cast(pl.Int64) - 1
        below = bounds.gather(at.clip(lower_bound=0))
        rep = pl.select(pl.when(at < 0).then(bounds[0] - 1).when(below == t).then(t).otherwise(below + 1)).to_series()
    keep = moved | t.is_null()
    t = pl.select(pl.when(keep).then(t).otherwise(rep)).to_series()
    return t, pl.select(pl.when(keep).then(replay).otherwise(t)).to_series()
