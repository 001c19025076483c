"""Communication against computation, per rank and iteration: `traceq overlap`.

On each rank's GPU, three kinds of work: communication kernels (`collectives`), computation
(every other kernel) and memory operations (memcpy, memset). Per rank and iteration (the
iteration of the launching call, as `traceq stages` finds it):

- compute_ns, comm_ns: the time at least one kernel of the kind ran (the union of their intervals);
- overlap_ns: the time both ran; hidden_pct = overlap_ns / comm_ns, the share of the
  communication hidden under computation (HTA's `get_comm_comp_overlap`, which counts the same
  way); exposed_ns = comm_ns - overlap_ns, the communication the step waits for;
- span_ns: first start to last end of the iteration's GPU work; idle_ns: the span's time with
  nothing running (memory operations count as running).

The arithmetic is a sweep over interval ends in polars: each interval becomes +1 at its start
and -1 at its end in a count of its kind, the counts are summed in time order per rank and
iteration, and each stretch between two consecutive ends is measured where the counts say what
ran. One trace at a time, so memory depends on the largest trace, not on how many ranks there are.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.multigpu.collectives import Progress, communication_names, on_run_clock, rank_expr, run_ranks
from traceq.analysis.multigpu.fanout import map_traces
from traceq.analysis.structure.attribution import gpu_operations
from traceq.analysis.structure.conventions import ITERATION_REGEX

COLUMNS = ("rank", "iteration", "span_ns", "compute_ns", "comm_ns", "overlap_ns", "hidden_pct", "exposed_ns",
           "idle_ns")


def rank_work(con: duckdb.DuckDBPyConnection, trace_id: int, ranks: list, iteration_regex: str) -> pl.DataFrame:
    """The GPU work of the ranks one trace holds: rank, iteration, work ('comm', 'compute' or
    'memory'), start_ns, end_ns (the trace's clock); by start."""
    ops, kinds, names, contexts = gpu_operations(con, trace_id, iteration_regex)
    comm = names.is_in(communication_names(con, trace_id)["name"].implode())
    is_kernel = kinds == "kernel"
    work = (pl.when(pl.lit(is_kernel).gather(pl.col("kind")))
            .then(pl.when(pl.lit(comm).gather(pl.col("name"))).then(pl.lit("comm")).otherwise(pl.lit("compute")))
            .otherwise(pl.lit("memory")))
    return (ops.select(rank=rank_expr(ranks), iteration=contexts["iteration"].gather(ops["context"]), work=work,
                       start_ns="start_ns", end_ns="end_ns")
            .drop_nulls("rank"))


def interval_sums(work: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per group of `keys` of `work` (keys, work, start_ns, end_ns): span_ns, compute_ns,
    comm_ns, overlap_ns and busy_ns (any work), by the sweep of the module docstring."""
    def delta(kind: str | None, sign: int) -> pl.Expr:
        hit = pl.lit(True) if kind is None else pl.col("work") == kind
        return pl.when(hit).then(pl.lit(sign, pl.Int32)).otherwise(pl.lit(0, pl.Int32))

    events = pl.concat([
        work.select(*keys, t="start_ns", comp=delta("compute", 1), comm=delta("comm", 1), any=delta(None, 1)),
        work.select(*keys, t="end_ns", comp=delta("compute", -1), comm=delta("comm", -1), any=delta(None, -1)),
    ]).sort(*keys, "t")
    running = events.with_columns(pl.col("comp", "comm", "any").cum_sum().over(keys),
                                  seg=(pl.col("t").shift(-1).over(keys) - pl.col("t")).fill_null(0))
    covered = (running.group_by(keys)
               .agg(compute_ns=pl.col("seg").filter(pl.col("comp") > 0).sum(),
                    comm_ns=pl.col("seg").filter(pl.col("comm") > 0).sum(),
                    overlap_ns=pl.col("seg").filter((pl.col("comp") > 0) & (pl.col("comm") > 0)).sum(),
                    busy_ns=pl.col("seg").filter(pl.col("any") > 0).sum()))
    spans = work.group_by(keys).agg(span_ns=pl.col("end_ns").max() - pl.col("start_ns").min(),
                                    first_ns=pl.col("start_ns").min())
    return spans.join(covered, on=keys, how="left", nulls_equal=True)


def trace_sums(con: duckdb.DuckDBPyConnection, trace_id: int, ranks: list, iteration_regex: str) -> pl.DataFrame:
    """`interval_sums` per rank and iteration of the ranks one trace holds, first_ns on the run's clock."""
    sums = interval_sums(rank_work(con, trace_id, ranks, iteration_regex), ["rank", "iteration"])
    return sums.with_columns(*on_run_clock(ranks, "first_ns"))


def overlap_table(
    con: duckdb.DuckDBPyConnection, run_id: int, iteration_regex: str = ITERATION_REGEX,
    progress: Progress | None = None,
) -> pl.DataFrame:
    """Per rank and iteration: span_ns, compute_ns, comm_ns, overlap_ns, hidden_pct (% of
    comm_ns), exposed_ns, idle_ns, as the module docstring defines them. Work launched outside
    every iteration range is one row per rank with a null iteration; by iteration (first start)
    then rank."""
    parts = map_traces(con, run_ranks(con, run_id), trace_sums, iteration_regex, progress=progress)
    frame = pl.concat(parts)
    schema = {"rank": pl.Int32, "iteration": pl.String, **{c: pl.Int64 for c in COLUMNS[2:] if c != "hidden_pct"},
              "hidden_pct": pl.Float64}
    return (frame.with_columns(hidden_pct=pl.when(pl.col("comm_ns") > 0)
                               .then(100.0 * pl.col("overlap_ns") / pl.col("comm_ns")),
                               exposed_ns=pl.col("comm_ns") - pl.col("overlap_ns"),
                               idle_ns=pl.col("span_ns") - pl.col("busy_ns"),
                               order=pl.col("first_ns").min().over("iteration"))
            .sort(pl.col("iteration").is_null(), "order", "rank")
            .select(COLUMNS).cast(schema))
