"""The critical path of each iteration as segments, and its composition (`traceq critical`).

An iteration ends when the last node it holds ends (host calls by their start in its range,
GPU work by the call that issued it); its time is that end minus the previous iteration's (the
first: minus its first node's start), as a training loop's step time is. The path walks back
from the iteration's last node along what bound each node in the replay (`replay.walk`), and its
segments cover the iteration's time exactly, so the composition adds up to it to the ns.

Categories: `compute` (kernels, by library), `communication` (collective kernels), `copy`
(memcpy, memset), `host` (API calls and the host's time between them), `launch` (from a call's
start to its work's start on the GPU), `sync wait` (a synchronising call's return after the work
it waited for), `idle` (a stream's gap, a wait for another stream, time before anything bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceq.analysis.critical.graph import KINDS, Graph
from traceq.analysis.critical.replay import EDGES, Replayed, iteration_ends, measured, replay, segment_bounds, walk

CATEGORIES = ("compute", "communication", "copy", "host", "launch", "sync wait", "idle")
"""What a path segment is, in the order tables list them."""


@dataclass(frozen=True)
class Critical:
    """Critical paths of every iteration of one replay."""

    iterations: pl.DataFrame
    """iteration (name; 'all' for a trace without iterations), begin_ns, end_ns, iteration_ns,
    then one `<category>_ns` column per CATEGORIES (they add up to iteration_ns)."""
    segments: pl.DataFrame
    """iteration, from_ns, to_ns, dur_ns, category, edge ('node', 'prog', 'launch', 'wait',
    'wake', 'before', 'arrive'), kind (KINDS), name, library, layer (where the store keeps the
    attribution); latest first within an iteration."""


def critical_paths(graph: Graph, dur_ns: pl.Series | None = None, nodes: pl.DataFrame | None = None) -> Critical:
    """Replay `graph` (with durations `dur_ns` and edge table `nodes` where given: a what-if's) and
    give each iteration's critical path."""
    run = measured(graph.nodes) if dur_ns is None and nodes is None else replay(
        graph.nodes if nodes is None else nodes, dur_ns)
    return paths_of(graph, graph.nodes if nodes is None else nodes, run)


def paths_of(graph: Graph, nodes: pl.DataFrame, run: Replayed) -> Critical:
    """The critical paths of a replay `run` of `nodes`."""
    ends = iteration_ends(nodes, *reversed(run.times))
    preds = run.preds
    index: list[int] = []
    node, edge = out = ([], [])
    for i, (last, begin) in enumerate(zip(ends["last"].to_list(), ends["begin_ns"].to_list())):
        index.extend([i] * walk(preds, run, last, begin, out))
    node = pl.Series(node, dtype=pl.Int64)
    edge = pl.Series(edge, dtype=pl.UInt8)
    index = pl.Series(index, dtype=pl.UInt32)
    lo, hi = segment_bounds(nodes, run, node, edge, index, ends["begin_ns"], ends["last"].cast(pl.Int64))
    kind = nodes["kind"].gather(node)
    library = nodes["library"].gather(node)
    # category codes into CATEGORIES: compute 0, communication 1 (a collective's wait for the last
    # rank included), copy 2, host 3, launch 4, sync wait 5, idle 6
    code = pl.select(
        pl.when(edge == 0).then(pl.when(kind == 0).then(3).when(kind == 1).then(
            pl.when(library == "NCCL").then(1).otherwise(0)).otherwise(2))
        .when(edge == 1).then(pl.when(kind == 0).then(3).otherwise(6))
        .when(edge == 2).then(4).when(edge == 4).then(5).when(edge == 6).then(1).otherwise(6).cast(pl.UInt32)
    ).to_series()
    names = graph.iterations
    labels = (names.gather(ends["iteration"]) if len(names) else pl.repeat("all", ends.height, eager=True))
    dur = hi - lo
    segments = pl.DataFrame({
        "iteration": labels.gather(index), "from_ns": lo, "to_ns": hi, "dur_ns": dur,
        "category": pl.Series(CATEGORIES).gather(code), "edge": pl.Series(EDGES).gather(edge),
        "kind": pl.Series(KINDS).gather(kind), "name": nodes["name"].gather(node), "library": library,
        "layer": nodes["layer"].gather(node)})
    sums = (pl.DataFrame({"index": index, "code": code, "dur_ns": dur}).group_by("index", "code")
            .agg(pl.col("dur_ns").sum()))
    columns = [pl.col("dur_ns").filter(pl.col("code") == i).sum().alias(f"{c.replace(' ', '_')}_ns")
               for i, c in enumerate(CATEGORIES)]
    per = sums.group_by("index").agg(columns)
    table = (ends.with_row_index("index").with_columns(iteration=labels).join(per, on="index", how="left")
             .sort("index").select("iteration", "begin_ns", "end_ns", "iteration_ns",
                                   *[pl.col(f"{c.replace(' ', '_')}_ns").fill_null(0) for c in CATEGORIES]))
    return Critical(iterations=table, segments=segments)


def composition(critical: Critical) -> pl.DataFrame:
    """The path's time over every iteration by category and, for compute and communication, the
    library: category, library, total_ns, per_iteration_ns, pct (of the iterations' time)."""
    seg = critical.segments
    total = max(int(critical.iterations["iteration_ns"].sum()), 1)
    count = max(critical.iterations.height, 1)
    library = pl.when(pl.col("category").is_in(["compute", "communication"])).then(pl.col("library").fill_null("other"))
    order = pl.col("category").replace_strict(list(CATEGORIES), list(range(len(CATEGORIES))), return_dtype=pl.Int64)
    return (seg.with_columns(library=library).group_by("category", "library").agg(total_ns=pl.col("dur_ns").sum())
            .with_columns(per_iteration_ns=pl.col("total_ns") // count, pct=100.0 * pl.col("total_ns") / total)
            .sort(order, pl.col("total_ns"), descending=[False, True]))


def longest(critical: Critical, k: int = 10) -> pl.DataFrame:
    """The k longest path segments: iteration, category, edge, kind, name, library, layer, dur_ns."""
    return (critical.segments.sort("dur_ns", descending=True).head(k)
            .select("iteration", "category", "edge", "kind", "name", "library", "layer", "dur_ns"))


def layer_composition(critical: Critical) -> pl.DataFrame:
    """The path's kernel time (compute and communication) by layer, most first: layer, total_ns,
    per_iteration_ns, pct (of the iterations' time); layer null where none is kept."""
    total = max(int(critical.iterations["iteration_ns"].sum()), 1)
    count = max(critical.iterations.height, 1)
    kernels = critical.segments.filter(pl.col("category").is_in(["compute", "communication"]))
    return (kernels.group_by("layer").agg(total_ns=pl.col("dur_ns").sum())
            .with_columns(per_iteration_ns=pl.col("total_ns") // count, pct=100.0 * pl.col("total_ns") / total)
            .sort("total_ns", "layer", descending=[True, False], nulls_last=True))
