"""The dependency graph of a run: each rank's graph (`graph.build_graph`) on the run's clock,
coupled by collectives (`traceq critical RUN`).

A collective ends when its last rank arrives: the same collective on every rank
(`multigpu.collectives.match_instances`, kernels numbered per kind in start order) gets an edge
from the rank that started it last (its `peer`) to each other rank's kernel, whose end is then
no earlier than the peer's start plus the measured time from there to its own end. A run's
iteration ends when its last rank's work for it ends.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.critical.graph import Graph, _forward_only, build_graph
from traceq.analysis.multigpu.collectives import collective_kind, each_trace, match_instances, on_run_clock, run_ranks
from traceq.analysis.structure.conventions import ITERATION_REGEX

PREDS = ("prog", "launch", "wait", "awaited", "peer")


def run_graph(con: duckdb.DuckDBPyConnection, run_id: int, iteration_regex: str = ITERATION_REGEX) -> Graph:
    """The run's graph (see the module docstring); node `rank` columns say whose node it is."""
    ranks = run_ranks(con, run_id)
    parts, names, lanes, dropped = [], [], 0, 0
    for trace_id, in_trace, on in each_trace(con, ranks):
        graph = build_graph(on, trace_id, iteration_regex)
        nodes = graph.nodes
        offset = sum(p.height for p in parts)
        first = in_trace[0]
        clock = on_run_clock([first], "start_ns", "end_ns")
        rank = pl.lit(first.rank, pl.Int32)
        for r in reversed(in_trace if len(in_trace) > 1 else []):  # several ranks in one file
            cond = pl.lit(True)
            if r.pid is not None:
                cond = cond & (pl.col("pid") == r.pid)
            if r.device_id is not None:
                cond = cond & (pl.col("device").is_null() | (pl.col("device") == r.device_id))
            rank = pl.when(cond).then(pl.lit(r.rank, pl.Int32)).otherwise(rank)
        iteration = (graph.iterations.gather(nodes["iteration"]) if len(graph.iterations)
                     else pl.repeat(None, nodes.height, dtype=pl.String, eager=True))
        nodes = (nodes.with_columns(rank=pl.lit(first.rank, pl.Int32)).with_columns(*clock)
                 .with_columns(rank=rank, iteration_name=iteration, lane=pl.col("lane") + lanes,
                               **{p: pl.when(pl.col(p) >= 0).then(pl.col(p) + offset).otherwise(-1) for p in PREDS}))
        lanes += int(nodes["lane"].max() or 0) + 1
        dropped += graph.dropped
        parts.append(nodes)
        names.extend(graph.iterations.to_list())
    nodes = pl.concat(parts, how="vertical_relaxed").with_row_index("old").with_columns(pl.col("old").cast(pl.Int64))
    nodes = _couple(nodes)
    order = sorted(set(names))
    iterations = pl.Series(order, dtype=pl.String)
    nodes = nodes.with_columns(iteration=pl.col("iteration_name").replace_strict(
        order, list(range(len(order))), default=None, return_dtype=pl.UInt32) if order else pl.lit(None, pl.UInt32))
    nodes, more = _forward_only(_reordered(nodes))
    return Graph(nodes=nodes.drop("old", "iteration_name", "node"), iterations=iterations, dropped=dropped + more)


def _couple(nodes: pl.DataFrame) -> pl.DataFrame:
    """Each collective kernel's peer: the same collective on the rank that started it last."""
    comm = nodes.filter((pl.col("kind") == 1) & (pl.col("library") == "NCCL").fill_null(False))
    if comm.is_empty() or comm["rank"].n_unique() < 2:
        return nodes
    kinds = {n: collective_kind(n) for n in comm["name"].unique().to_list()}
    comm = comm.with_columns(collective=pl.col("name").replace_strict(kinds, default=None, return_dtype=pl.String))
    matched = match_instances(comm.select("old", "rank", "collective", "start_ns", "end_ns")).drop_nulls("instance")
    last = (matched.sort("start_ns", "old").group_by("collective", "instance")
            .agg(peer=pl.col("old").last(), peer_start=pl.col("start_ns").last(), ranks=pl.col("rank").n_unique()))
    matched = (matched.join(last.filter(pl.col("ranks") > 1), on=["collective", "instance"], how="inner")
               .filter(pl.col("old") != pl.col("peer"))
               .select("old", "peer", peer_gap=pl.col("end_ns") - pl.col("peer_start")))
    nodes = nodes.join(matched, on="old", how="left", suffix="_new", maintain_order="left")
    coupled = pl.col("peer_new").is_not_null()
    dur = pl.col("end_ns") - pl.col("start_ns")
    return nodes.with_columns(
        peer=pl.when(coupled).then(pl.col("peer_new")).otherwise(pl.col("peer")),
        peer_gap=pl.when(coupled).then(pl.col("peer_gap_new")).otherwise(pl.col("peer_gap")),
        sync_floor_ns=pl.when(coupled).then(pl.min_horizontal(dur, pl.col("peer_gap_new")).clip(0))
        .otherwise(pl.col("sync_floor_ns")),
        arrived=coupled).drop("peer_new", "peer_gap_new")


def _reordered(nodes: pl.DataFrame) -> pl.DataFrame:
    """The nodes in replay order (`graph`'s, a waiting collective keyed by its end as a
    synchronising call is), every predecessor column renumbered."""
    waits_end = (pl.col("awaited") >= 0) | (pl.col("peer") >= 0)
    tie = pl.when(waits_end).then(2).when(pl.col("kind") > 0).then(1).otherwise(0)
    nodes = nodes.with_columns(key=pl.when(waits_end).then(pl.col("end_ns")).otherwise(pl.col("start_ns")), tie=tie)
    nodes = nodes.sort("key", "tie", "lane", "start_ns", "end_ns").drop("key", "tie")
    new = pl.repeat(0, nodes.height, dtype=pl.Int64, eager=True).scatter(
        nodes["old"], pl.int_range(0, nodes.height, eager=True, dtype=pl.Int64))
    renumbered = {p: pl.select(pl.when(nodes[p] >= 0).then(new.gather(nodes[p].clip(0))).otherwise(-1)).to_series()
                  for p in PREDS}
    return nodes.with_columns(**renumbered).with_columns(node=pl.int_range(0, pl.len(), dtype=pl.Int64))
