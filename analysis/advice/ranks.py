"""Rules of the findings catalogue that read a run's ranks against each other (`load --run`):
`straggler` (the rank the others wait for, as `traceq ranks` names it) and `load_imbalance`
(ranks given uneven work: their busy GPU time per iteration differs).

The two are different problems with different fixes: a straggler can have no more work than the
others (its host launches late, its node is shared), and uneven work makes every rank wait at the
next collective whoever starts it last. Both read the run's `rank_iterations` once per run
(`report RUN` advises every rank).
"""

from __future__ import annotations

import polars as pl

from traceq.analysis.advice import Finding
from traceq.units import format_duration as _ms

IMBALANCE_PCT = 5.0
"""Load imbalance: the busiest rank's busy GPU time at least this % above the ranks' mean
(summed over the steady iterations). A few % is what GPUs of one model differ by (clocks,
temperature) running the same work."""

_RUN_RANKS: dict[tuple, pl.DataFrame] = {}
"""The last run's `rank_iterations` (with busy_ns), keyed by connection, run, iteration regex,
the store's file and its traces (a load or removal makes a new key)."""


def run_ranks(facts: object) -> tuple[int, pl.DataFrame] | None:
    """(this trace's rank, its run's `rank_iterations` with busy_ns) when the trace is a rank of a
    run of several; None otherwise or when the run has no iterations to compare."""
    t = int(facts.trace_id)
    runs = facts.con.execute("SELECT r.run_id, min(k.rank) FROM runs r JOIN ranks k USING (run_id) "
                             "WHERE r.world_size > 1 AND k.trace_id = ? GROUP BY r.run_id ORDER BY r.run_id",
                             [t]).fetchall()
    if not runs:
        return None
    from traceq.analysis.multigpu.ranks import rank_iterations
    from traceq.errors import TraceqError

    run_id, mine = runs[0]
    state = facts.con.execute("SELECT count(*), max(trace_id), (SELECT any_value(path) FROM duckdb_databases() "
                              "WHERE database_name = current_database()) FROM traces").fetchone()
    key = (id(facts.con), run_id, facts.iteration_regex, state)
    if key not in _RUN_RANKS:
        try:
            frame = rank_iterations(facts.con, run_id, facts.iteration_regex, busy=True)
        except TraceqError:
            return None
        _RUN_RANKS.clear()
        _RUN_RANKS[key] = frame
    ranks = _RUN_RANKS[key]
    return (int(mine), ranks) if not ranks.is_empty() else None


def busy_per_iteration(ranks: pl.DataFrame) -> pl.DataFrame:
    """Per steady iteration that two or more ranks ran: mean_ns (the ranks' mean busy time),
    max_ns, busiest (the rank of max_ns; the lowest rank on a tie), extra_ns = max_ns - mean_ns
    (how much sooner the step could end with the same work split evenly), held_ns (how long the
    others waited for the busiest rank: the start skews of the collectives it started last) and
    stake_ns = min(extra_ns, held_ns): extra work that made nobody wait cost nothing (the
    busiest rank then waits for another, and its kernels beside communication run slower)."""
    return (ranks.sort("busy_ns", "rank", descending=[True, False])
            .group_by("iteration", maintain_order=True)
            .agg(n=pl.len(), mean_ns=pl.col("busy_ns").mean(), max_ns=pl.col("busy_ns").max(),
                 busiest=pl.col("rank").first(), held_ns=pl.col("held_ns").first())
            .filter(pl.col("n") > 1)
            .with_columns(extra_ns=pl.col("max_ns") - pl.col("mean_ns"))
            .with_columns(stake_ns=pl.min_horizontal("extra_ns", pl.col("held_ns").cast(pl.Float64))))


def busy_spread(ranks: pl.DataFrame) -> str:
    """The ranks' busy GPU time per iteration, least and most (means over the iterations)."""
    busy = ranks.group_by("rank").agg(pl.col("busy_ns").mean()).sort("busy_ns", "rank")
    if busy.height < 2 or not busy["busy_ns"].max():
        return ""
    low, high = busy.row(0, named=True), busy.row(-1, named=True)
    spread = 100 * (high["busy_ns"] / low["busy_ns"] - 1) if low["busy_ns"] else 0.0
    return (f"busy GPU time per iteration (computation kernels) {_ms(low['busy_ns'])} on rank {low['rank']} to "
            f"{_ms(high['busy_ns'])} on rank {high['rank']} (+{spread:.0f} %)")


def _even(ranks: pl.DataFrame, straggler: int) -> str:
    """The straggler's own busy time, and whether the load is even (no `load_imbalance`): then
    the straggler is late for another reason than more work."""
    busy = ranks.filter(pl.col("rank") == straggler)["busy_ns"].mean()
    if busy is None:
        return ""
    per = busy_per_iteration(ranks)
    mean = float(per["mean_ns"].sum()) if not per.is_empty() else 0.0
    even = mean > 0 and 100 * float(per["extra_ns"].sum()) / mean < IMBALANCE_PCT
    return (f", rank {straggler}'s {_ms(busy)}"
            + ("; an even load: it starts late for another reason than more work" if even else ""))


def load_imbalance(facts: object) -> list[Finding]:
    """Ranks given uneven work: per steady iteration, the busiest rank's busy GPU time (its
    computation kernels' union: free of clock skew and of waits) beyond the ranks' mean, as far as
    the others waited for that rank (`busy_per_iteration`'s stake_ns). Fires when the busiest
    rank's excess is at least IMBALANCE_PCT of the ranks' mean busy time; at stake, stake_ns
    summed over the iterations."""
    found = run_ranks(facts)
    if found is None:
        return []
    mine, ranks = found
    per = busy_per_iteration(ranks)
    if per.is_empty():
        return []
    mean, extra, stake = (float(per[c].sum()) for c in ("mean_ns", "extra_ns", "stake_ns"))
    if mean <= 0 or 100 * extra / mean < IMBALANCE_PCT or stake <= 0:
        return []
    counts = per.group_by("busiest").agg(k=pl.len()).sort("k", "busiest", descending=[True, False])
    top, k = counts.row(0)
    me = ranks.filter(pl.col("rank") == mine)["busy_ns"].mean()
    waited = (f"the others waited for it {_ms(float(per['held_ns'].sum()))}, so at stake "
              f"{_ms(stake)}" if stake < extra else "the others waiting that long for it at the next collectives")
    evidence = (f"{busy_spread(ranks)}; the busiest rank's excess over the ranks' mean {_ms(extra)} over "
                f"{per.height:,} iteration(s) ({_ms(extra / per.height)} per iteration, {100 * extra / mean:.0f} %), "
                f"{waited}; rank {top} the busiest in {k:,} of {per.height:,}; this rank ({mine}) {_ms(me or 0)} "
                f"per iteration. Busy time counts the computation kernels' time, so clock skew and waits in "
                f"collectives do not (`traceq overlap RUN`)")
    fix = ("Split the work evenly: shard embedding tables and data by cost (rows looked up, sequence lengths), "
           "not by count; the same batch shape on every rank; balance pipeline stages by measured time. Ranks "
           "with equal work but unequal time point at the GPUs (clocks, throttling: nvidia-smi -q -d PERFORMANCE)")
    return [Finding("load_imbalance", f"Load imbalance across ranks: rank {top} has the most work", stake,
                    evidence, fix)]


def without_capture_start(ranks: pl.DataFrame) -> pl.DataFrame:
    """`rank_iterations` less its first iteration (in time order) when it has three or more: each
    rank's profiler starts capturing on its own (nsys --capture-range=cudaProfilerApi, a Kineto
    schedule), so the first captured collectives' start skews measure when each capture began
    (44 ms on the DDP MLP pair `mgplants_base_2gpu`, 0.1 ms in the iterations after), not a
    straggler."""
    order = ranks["iteration"].unique(maintain_order=True)
    return ranks.filter(pl.col("iteration") != order[0]) if order.len() >= 3 else ranks


def straggler(facts: object) -> list[Finding]:
    """On a rank of a run (`load --run`): the straggler, as `traceq ranks` names it (the rank the
    others waited for longest: the start skews of the collectives it started last). On the
    straggler, at stake is that wait it caused (the step could be that much shorter); on another
    rank, the time it waited inside collectives for later ranks. The evidence gives the ranks'
    busy time too: whether the straggler had more work (`load_imbalance`) or is late for another
    reason. The capture's first iteration is left out (`without_capture_start`)."""
    found = run_ranks(facts)
    if found is None:
        return []
    mine, ranks = found
    ranks = without_capture_start(ranks)
    if not int(ranks["last_starts"].sum()):
        return []
    late = ranks.group_by("rank").agg(last=pl.col("last_starts").sum(), held=pl.col("held_ns").sum(),
                                      slowest=pl.col("slowest").sum(), wait=pl.col("wait_ns").sum())
    top = late.sort("held", "rank", descending=[True, False]).row(0, named=True)
    me = late.filter(pl.col("rank") == mine)
    if me.is_empty() or not top["held"]:
        return []
    me_row = me.row(0, named=True)
    iterations = ranks["iteration"].n_unique()
    spread = busy_spread(ranks)
    said = (f"rank {top['rank']} was the last to start {top['last']:,} collectives, the other ranks waiting "
            f"{_ms(top['held'])} for it (start skews summed); the straggler in {top['slowest']:,} of {iterations:,} "
            f"iteration(s) (`traceq ranks`; what delayed it: `traceq ranks RUN --by collective`)"
            + (f"; {spread}" if spread else "") + _even(ranks, int(top["rank"])))
    fix = ("Even the load across ranks (shard embedding tables and data by cost, not count; the same batch "
           "shape on every rank), and remove what delays the slow rank before its collectives: its host "
           "(data loading, Python), other jobs on its node, a slower GPU or link")
    if top["rank"] == mine:
        return [Finding("straggler", f"This rank ({mine}) is the straggler: the others wait for it", float(top["held"]),
                        said, fix)]
    if not me_row["wait"]:
        return []
    evidence = (f"this rank ({mine}) waited {_ms(me_row['wait'])} inside collectives for ranks that started them "
                f"later; " + said)
    return [Finding("straggler", f"Waiting for a slower rank (rank {top['rank']})", float(me_row["wait"]),
                    evidence, fix)]
