"""Collective communication of a run: `traceq comm`.

Built on `collectives` (which kernels are communication, their collective and bytes, the same
collective across ranks) and the run's ranks (`runs`, `ranks`: where each rank's events are,
and the shift onto the run's clock). Times are integer ns on the run's clock; bandwidths GB/s
(1e9 bytes per second).

Per kernel: time = its duration on that rank (a rank that arrives early waits inside the
kernel, so its time includes the wait); algorithm bandwidth = bytes / time; bus bandwidth =
algorithm bandwidth x nccl-tests' factor of the ranks in the collective (`collectives.BUS_FACTORS`).
Across ranks, per collective: start skew = last start - first start (how long the first rank
waited for the last), end skew = last end - first end (near zero once all have arrived).
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.multigpu.collectives import (
    BUS_FACTORS,
    Progress,
    comm_kernels,
    match_instances,
    on_run_clock,
    rank_expr,
    run_ranks,
)
from traceq.analysis.multigpu.fanout import map_traces
from traceq.analysis.structure.attribution import attribute_points
from traceq.analysis.structure.conventions import ITERATION_REGEX
from traceq.errors import MissingDataError

GB = 1e9


def collective_kernels(
    con: duckdb.DuckDBPyConnection, run_id: int, iteration_regex: str = ITERATION_REGEX,
    progress: Progress | None = None,
) -> pl.DataFrame:
    """Every communication kernel of every rank of the run, on the run's clock.

    Columns: rank, collective (null when nothing names it), group (its process group, where the
    trace says), instance (the same on every rank for one collective of one group; null with
    the collective), iteration (of the launching call, by name,
    as `traceq stages` finds it), layer (the innermost layer range around its launch), kernel_id,
    start_ns, end_ns, dur_ns, bytes (null where the trace does not say), ranks (in the
    collective: its process group's size where the trace says, else the job's world size, else
    the run's rank count); by rank and start.

    Raises:
        MissingDataError: the run has no communication kernel.
    """
    ranks = run_ranks(con, run_id)
    world = _world_sizes(con, run_id)
    frames = [f for f in map_traces(con, ranks, trace_comm, iteration_regex, world, progress=progress)
              if not f.is_empty()]
    if not frames:
        raise MissingDataError("no communication (NCCL/RCCL) kernels in this run")
    kernels = match_instances(pl.concat(frames))
    return kernels.select("rank", "collective", "group", "instance", "iteration", "layer", "kernel_id", "start_ns",
                          "end_ns", "dur_ns", "bytes", "ranks").sort("rank", "start_ns")


def trace_comm(con: duckdb.DuckDBPyConnection, trace_id: int, in_trace: list, iteration_regex: str,
               world: dict[int, int]) -> pl.DataFrame:
    """The communication kernels of the ranks one trace holds, with iteration and layer, on the run's clock."""
    k = comm_kernels(con, trace_id).with_columns(rank=rank_expr(in_trace)).drop_nulls("rank")
    if k.is_empty():
        return pl.DataFrame()
    points = k.select(id="kernel_id", pid="pid", tid="launch_tid", t="launch_ns")
    context = attribute_points(con, trace_id, points, iteration_regex, paths=False)
    return k.with_columns(context["iteration"], context["layer"]).select(
        "rank", "collective", "group", "iteration", "layer", "kernel_id", *on_run_clock(in_trace, "start_ns", "end_ns"),
        dur_ns=pl.col("end_ns") - pl.col("start_ns"), bytes="bytes",
        ranks=pl.coalesce("group_size", pl.lit(world[trace_id], pl.Int64)))


def _world_sizes(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, int]:
    """trace_id -> the ranks its collectives span where nothing else says: the job's world size
    (Kineto), else the run's rank count."""
    rows = con.execute("SELECT DISTINCT k.trace_id, coalesce(t.world_size, r.world_size) FROM ranks k "
                       "JOIN runs r USING (run_id) JOIN traces t USING (trace_id) WHERE k.run_id = ?",
                       [run_id]).fetchall()
    return {int(t): int(n) for t, n in rows}


def with_skew(kernels: pl.DataFrame) -> pl.DataFrame:
    """`collective_kernels` with, per collective instance across ranks: first_start_ns,
    last_start_ns, start_skew_ns, end_skew_ns, and late_ns (this rank's start - the first start);
    all null for kernels without an instance."""
    key = ["collective", "group", "instance"]
    first, last = pl.col("start_ns").min().over(key), pl.col("start_ns").max().over(key)
    known = pl.col("instance").is_not_null()
    return kernels.with_columns(
        first_start_ns=pl.when(known).then(first), last_start_ns=pl.when(known).then(last),
        start_skew_ns=pl.when(known).then(last - first),
        end_skew_ns=pl.when(known).then(pl.col("end_ns").max().over(key) - pl.col("end_ns").min().over(key)),
        late_ns=pl.when(known).then(pl.col("start_ns") - first))


def _bandwidths(bytes_: pl.Expr, time_ns: pl.Expr, collective: pl.Expr, ranks: pl.Expr) -> list[pl.Expr]:
    """algbw_gbps and busbw_gbps of `bytes_` moved in `time_ns` (null without bytes)."""
    algbw = pl.when(time_ns > 0).then(bytes_ / time_ns)  # bytes per ns = GB/s
    factor = pl.lit(None, pl.Float64)
    for kind, f in BUS_FACTORS.items():  # each factor is arithmetic, so it takes the column itself
        value = f(ranks)
        factor = pl.when(collective == kind).then(value if isinstance(value, pl.Expr) else pl.lit(value)) \
            .otherwise(factor)
    return [algbw.alias("algbw_gbps"), (algbw * factor).alias("busbw_gbps")]


def comm_table(
    con: duckdb.DuckDBPyConnection, run_id: int, by: str = "rank", iteration_regex: str = ITERATION_REGEX,
    progress: Progress | None = None,
) -> pl.DataFrame:
    """Collective communication per collective, iteration and rank (`by='rank'`), or per
    collective instance across ranks (`by='instance'`).

    by='rank' columns: collective, iteration, rank, calls, total_ns (kernel time), bytes (null
    unless every call's size is known), algbw_gbps, busbw_gbps (bytes / total_ns, times the bus
    factor), late_ns (mean of this rank's start after the first rank's), start_skew_ns and
    end_skew_ns (means over the row's collectives of their skew across ranks).

    by='instance' columns: collective, group (process group, where the trace says), instance, iteration, ranks_seen (ranks it was found on),
    bytes, start_ns (the first rank's start, after the run's first GPU activity), start_skew_ns, end_skew_ns, last_rank (the last to start), time_ns
    (its kernel time on the last rank: the transfer, without waiting), algbw_gbps, busbw_gbps
    (of that time), max_ns (the longest kernel time: the first rank's wait included).
    """
    kernels = with_skew(collective_kernels(con, run_id, iteration_regex, progress))
    if by == "instance":
        return _by_instance(kernels, run_start_ns(con, run_id))
    order = kernels.group_by("iteration").agg(first=pl.col("start_ns").min())
    frame = (kernels.group_by("collective", "iteration", "rank")
             .agg(calls=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum(),
                  bytes=pl.when(pl.col("bytes").null_count() == 0).then(pl.col("bytes").sum()),
                  ranks=pl.col("ranks").max(), late_ns=pl.col("late_ns").mean(),
                  start_skew_ns=pl.col("start_skew_ns").mean(), end_skew_ns=pl.col("end_skew_ns").mean())
             .join(order, on="iteration", how="left", nulls_equal=True))
    frame = frame.with_columns(*_bandwidths(pl.col("bytes"), pl.col("total_ns"), pl.col("collective"), pl.col("ranks")))
    return (frame.sort(pl.col("iteration").is_null(), "first", "collective", "rank", nulls_last=True)
            .select("collective", "iteration", "rank", "calls", "total_ns", "bytes", "algbw_gbps", "busbw_gbps",
                    pl.col("late_ns", "start_skew_ns", "end_skew_ns").round().cast(pl.Int64)))


def run_start_ns(con: duckdb.DuckDBPyConnection, run_id: int) -> int:
    """When the run's first GPU activity began, on the run's clock."""
    return int(con.execute("SELECT min(t.start_ns + k.shift_ns + round((t.start_ns - k.shift_at_ns) * k.drift_ppm * 1e-6)) "
                           "FROM ranks k JOIN traces t USING (trace_id) WHERE k.run_id = ?", [run_id]).fetchall()[0][0] or 0)


def _by_instance(kernels: pl.DataFrame, start_ns: int) -> pl.DataFrame:
    known = kernels.filter(pl.col("instance").is_not_null())
    last = pl.col("start_ns") == pl.col("last_start_ns")
    frame = (known.sort("start_ns").group_by("collective", "group", "instance")
             .agg(iteration=pl.col("iteration").drop_nulls().first(), ranks_seen=pl.len().cast(pl.Int64),
                  bytes=pl.col("bytes").max(), ranks=pl.col("ranks").max(),
                  start_ns=pl.col("first_start_ns").first() - start_ns, start_skew_ns=pl.col("start_skew_ns").first(),
                  end_skew_ns=pl.col("end_skew_ns").first(), last_rank=pl.col("rank").filter(last).first(),
                  time_ns=pl.col("dur_ns").filter(last).first(), max_ns=pl.col("dur_ns").max()))
    frame = frame.with_columns(*_bandwidths(pl.col("bytes"), pl.col("time_ns"), pl.col("collective"), pl.col("ranks")))
    return (frame.sort("start_ns")
            .select("collective", "group", "instance", "iteration", "ranks_seen", "bytes", "start_ns", "start_skew_ns",
                    "end_skew_ns", "last_rank", "time_ns", "algbw_gbps", "busbw_gbps", "max_ns"))
