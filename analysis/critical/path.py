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
from traceq.analysis.critical.replay import Replayed, iteration_ends, measured, predecessors, replay, walk

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
    'wake', 'before'), kind (KINDS), name, library; latest first within an iteration."""


def critical_paths(graph: Graph, dur_ns: pl.Series | None = None, nodes: pl.DataFrame | None = None) -> Critical:
    """Replay `graph` (with durations `dur_ns` and edge table `nodes` where given: a what-if's) and
    give each iteration's critical path."""
    run = measured(graph.nodes) if dur_ns is None and nodes is None else replay(
        graph.nodes if nodes is None else nodes, dur_ns)
    return paths_of(graph, graph.nodes if nodes is None else nodes, run)


def paths_of(graph: Graph, nodes: pl.DataFrame, run: Replayed) -> Critical:
    """The critical paths of a replay `run` of `nodes`."""
    ends = iteration_ends(nodes, run.end_ns, run.start_ns)
    preds = predecessors(nodes)
    index: list[int] = []
    rows: list[tuple[int, int, int, str]] = []
    for i, (last, begin) in enumerate(zip(ends["last"].to_list(), ends["begin_ns"].to_list())):
        path = walk(preds, run, last, begin)
        rows.extend(path)
        index.extend([i] * len(path))
    node, lo, hi, edge = zip(*rows) if rows else ((), (), (), ())
    segments = pl.DataFrame({"index": pl.Series(index, dtype=pl.Int64), "node": pl.Series(node, dtype=pl.Int64),
                             "from_ns": pl.Series(lo, dtype=pl.Int64), "to_ns": pl.Series(hi, dtype=pl.Int64),
                             "edge": pl.Series(edge, dtype=pl.String)})
    info = nodes.select("kind", "name", "library", "lane").with_row_index("node").with_columns(pl.col("node").cast(pl.Int64))
    segments = segments.join(info, on="node", how="left", maintain_order="left")
    kind = pl.col("kind")
    category = (pl.when(pl.col("edge") == "node").then(
        pl.when(kind == 0).then(pl.lit("host")).when(kind == 1).then(
            pl.when(pl.col("library") == "NCCL").then(pl.lit("communication")).otherwise(pl.lit("compute")))
        .otherwise(pl.lit("copy")))
        .when(pl.col("edge") == "prog").then(pl.when(kind == 0).then(pl.lit("host")).otherwise(pl.lit("idle")))
        .when(pl.col("edge") == "launch").then(pl.lit("launch"))
        .when(pl.col("edge") == "wake").then(pl.lit("sync wait"))
        .otherwise(pl.lit("idle")))
    names = graph.iterations
    ends = ends.with_row_index("index").with_columns(pl.col("index").cast(pl.Int64))
    label = (pl.col("iteration").map_elements(lambda c: names[c], return_dtype=pl.String) if len(names)
             else pl.lit("all"))
    ends = ends.with_columns(label.alias("name"))
    segments = (segments.with_columns(category=category, dur_ns=pl.col("to_ns") - pl.col("from_ns"),
                                      kind=pl.col("kind").replace_strict(list(range(len(KINDS))), list(KINDS),
                                                                         return_dtype=pl.String))
                .join(ends.select("index", "name").rename({"name": "iteration"}), on="index", how="left",
                      maintain_order="left"))
    sums = segments.group_by("index").agg(
        [pl.col("dur_ns").filter(pl.col("category") == c).sum().alias(f"{c.replace(' ', '_')}_ns")
         for c in CATEGORIES])
    table = (ends.join(sums, on="index", how="left").sort("index")
             .select(pl.col("name").alias("iteration"), "begin_ns", "end_ns", "iteration_ns",
                     *[pl.col(f"{c.replace(' ', '_')}_ns").fill_null(0) for c in CATEGORIES]))
    return Critical(iterations=table, segments=segments.select(
        "iteration", "from_ns", "to_ns", "dur_ns", "category", "edge", "kind", "name", "library"))


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
    """The k longest path segments: iteration, category, kind, name, library, dur_ns."""
    return (critical.segments.sort("dur_ns", descending=True).head(k)
            .select("iteration", "category", "edge", "kind", "name", "library", "dur_ns"))
