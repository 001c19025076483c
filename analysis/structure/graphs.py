"""CUDA graphs: where the work a graph replays was defined.

A kernel replayed from a CUDA graph is launched by `cudaGraphLaunch`, so the call that its
correlation id names is the replay, inside whatever NVTX range is open around the replay
(`iteration N`), not the layer that defined the work. With `nsys profile
--cuda-graph-trace=node` the kernel also names its graph node, and the export records every
node as it is made (CUDA_GRAPH_NODE_EVENTS, the store's `graph_nodes`): captured nodes are
created inside the captured launch call, on the capturing thread, while that layer's ranges are
open; `cudaGraphInstantiate` then clones each into the executable graph, recording the node it
was cloned from. The node a kernel names is such a clone, so following the clones back to the
node first created gives where and when the kernel was defined: its *capture point* (process,
thread, time), which attribution uses in place of the replay's launch call: the layer, pass and
stage are those open at the capture. The iteration is the one open at the replay, when the work
ran (`replay_iterations`).

Per trace, one recursive query over the graph nodes (thousands, not the kernels); kernels join
the result by (process, node). Traces without graph nodes skip it.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import polars as pl

from traceq.analysis.intervals import last_at_or_before
from traceq.analysis.structure.operators import recontext

MAX_CLONES = 64
"""Clone chains are followed this deep at most (a graph cloned from a clone, ...)."""


def has_graph_nodes(con: duckdb.DuckDBPyConnection, trace_id: int) -> bool:
    """Whether the trace recorded CUDA graph nodes (nsys --cuda-graph-trace=node)."""
    return bool(con.execute("SELECT EXISTS (SELECT 1 FROM graph_nodes WHERE trace_id = ?)", [trace_id]).fetchall()[0][0])


def node_origins_sql(trace_id: int) -> str:
    """SQL of one row per graph node of the trace: pid, graph_node_id, origin_tid, origin_ns (the
    thread and time at which the node it was cloned from, back to the first, was created)."""
    t = int(trace_id)
    return f"""
        WITH RECURSIVE nodes AS (
            SELECT pid, graph_node_id, max(original_graph_node_id) AS original,
                   arg_min(tid, created_ns) FILTER (WHERE original_graph_node_id IS NULL) AS tid,
                   min(created_ns) FILTER (WHERE original_graph_node_id IS NULL) AS created_ns
            FROM graph_nodes WHERE trace_id = {t} GROUP BY pid, graph_node_id
        ),
        back (pid, graph_node_id, node, depth) AS (
            SELECT pid, graph_node_id, graph_node_id, 0 FROM nodes
            UNION ALL
            SELECT b.pid, b.graph_node_id, n.original, b.depth + 1
            FROM back b JOIN nodes n ON n.pid = b.pid AND n.graph_node_id = b.node
            WHERE n.original IS NOT NULL AND b.depth < {MAX_CLONES}
        )
        SELECT b.pid, b.graph_node_id, arg_max(n.tid, b.depth) AS origin_tid, arg_max(n.created_ns, b.depth) AS origin_ns
        FROM back b JOIN nodes n ON n.pid = b.pid AND n.graph_node_id = b.node
        GROUP BY b.pid, b.graph_node_id"""


def child_origins_sql(trace_id: int) -> str:
    """`node_origins_sql` with the kernels of child graphs too. A graph node that holds a graph
    (XLA's command buffers put each cuBLAS call, captured from a stream, in one) is recorded as
    it is made and cloned, but the kernels inside it get node ids of their own when the
    executable graph is instantiated, after the parent's nodes, and nsys records nothing for
    them. In an executable graph (the node id's upper 32 bits) whose orphan kernel nodes are
    exactly as many as its recorded nodes that never ran as kernels (the child-graph holders),
    each orphan, in id order, takes the origin of the holder in the same place of theirs: one
    kernel per child graph, laid out in order. Otherwise the orphans keep none."""
    t = int(trace_id)
    return f"""
        WITH origins AS ({node_origins_sql(t)}),
        kernel_nodes AS (SELECT DISTINCT pid, graph_node_id FROM kernels
                         WHERE trace_id = {t} AND graph_node_id IS NOT NULL),
        orphans AS (
            SELECT k.pid, k.graph_node_id, k.graph_node_id >> 32 AS g FROM kernel_nodes k
            ANTI JOIN origins o ON o.pid = k.pid AND o.graph_node_id = k.graph_node_id
        ),
        holders AS (
            SELECT DISTINCT n.pid, n.graph_node_id, n.graph_node_id >> 32 AS g FROM graph_nodes n
            ANTI JOIN kernel_nodes k ON k.pid = n.pid AND k.graph_node_id = n.graph_node_id
            WHERE n.trace_id = {t} AND n.original_graph_node_id IS NOT NULL
              AND (n.pid, n.graph_node_id >> 32) IN (SELECT pid, g FROM orphans)
        ),
        o AS (SELECT *, row_number() OVER (PARTITION BY pid, g ORDER BY graph_node_id) AS i,
                     count(*) OVER (PARTITION BY pid, g) AS n FROM orphans),
        h AS (SELECT *, row_number() OVER (PARTITION BY pid, g ORDER BY graph_node_id) AS i,
                     count(*) OVER (PARTITION BY pid, g) AS n FROM holders)
        SELECT * FROM origins
        UNION ALL
        SELECT o.pid, o.graph_node_id, r.origin_tid, r.origin_ns
        FROM o JOIN h ON h.pid = o.pid AND h.g = o.g AND h.i = o.i AND h.n = o.n
        JOIN origins r ON r.pid = h.pid AND r.graph_node_id = h.graph_node_id"""


def kernel_points_sql(con: duckdb.DuckDBPyConnection, trace_id: int, columns: str = "k.*") -> str:
    """SQL of the trace's `kernel_launches` rows (`columns` of them, the view aliased `k`) with
    the point attribution places each at: point_tid and point_ns, the capture point for a kernel
    replayed from a graph, else the launch call's thread and start; and time_ns, the launch
    call's start (for ranges found by time)."""
    t = int(trace_id)
    if not has_graph_nodes(con, t):
        return (f"SELECT {columns}, k.launch_tid AS point_tid, k.launch_start_ns AS point_ns, "
                f"k.launch_start_ns AS time_ns FROM kernel_launches k WHERE k.trace_id = {t}")
    return f"""
        SELECT {columns}, coalesce(o.origin_tid, k.launch_tid) AS point_tid,
               CASE WHEN o.origin_tid IS NULL THEN k.launch_start_ns ELSE o.origin_ns END AS point_ns,
               k.launch_start_ns AS time_ns
        FROM kernel_launches k
        LEFT JOIN ({child_origins_sql(t)}) o ON o.pid = k.pid AND o.graph_node_id = k.graph_node_id
        WHERE k.trace_id = {t}"""


def replay_iterations(
    by_time_ranges: pl.DataFrame, points: pl.DataFrame, replay: pl.Series, index: pl.Series, contexts: pl.DataFrame
) -> tuple[pl.Series, pl.DataFrame]:
    """`attribution.point_contexts`' (index, contexts) with, for the points whose `replay` time
    differs from their t (kernels replayed from a graph, placed where they were captured), the
    iteration range open at the replay instead: the capture gives the layer, pass and stage, the
    replay the iteration it ran in. `by_time_ranges` and `points` as `point_contexts` has them
    (points: pos, pid, tid, t), the iteration ranges being the `is_iter` rows; an iteration is
    the one of the process begun last at or before the time, if still open (as attribution finds
    it)."""
    moved = points["t"].is_not_null() & replay.is_not_null() & (points["t"] != replay)
    if not moved.any():
        return index, contexts
    iterations = by_time_ranges.filter(pl.col("is_iter")).drop_nulls("pid").sort("start_ns")
    names = pl.concat([contexts["iteration"].drop_nulls(), iterations["nm"]]).unique().sort()
    row = last_at_or_before(iterations["pid"], iterations["start_ns"], points["pid"], replay)
    open_at = pl.select(pl.when(replay < iterations["end_ns"].gather(row)).then(row)).to_series()
    code = (names.search_sorted(iterations["nm"]).cast(pl.Int64) + 1).gather(open_at).fill_null(0)
    current = names.search_sorted(contexts["iteration"]).cast(pl.Int64) + 1
    current = pl.select(pl.when(contexts["iteration"].is_null()).then(0).otherwise(current)).to_series()
    code = pl.select(pl.when(moved).then(code).otherwise(current.gather(index))).to_series()
    key = index.cast(pl.Int64) * (len(names) + 1) + code
    keys = key.unique().sort()
    table = contexts.gather(keys // (len(names) + 1)).with_columns(
        iteration=pl.concat([pl.Series([None], dtype=pl.String), names]).gather(keys % (len(names) + 1)))
    return keys.search_sorted(key).cast(pl.UInt32), table


GRAPH_LAUNCH = "graph launch"
GRAPH_LAYER = "CUDA graph"
"""The layer of replayed work that no range names, at its capture or around its replay."""


def replay_layers(
    index: pl.Series, contexts: pl.DataFrame, points: pl.DataFrame, replay: pl.Series, replay_tid: pl.Series,
    contexts_at: Callable[[pl.DataFrame], tuple[pl.Series, pl.DataFrame]],
) -> tuple[pl.Series, pl.DataFrame]:
    """Replayed work captured outside every layer and training stage (an inference step captured
    once, then replayed inside `decode N`): it takes the layer, pass and stage of the ranges
    around its replay's launch call (`contexts_at` attributes points: pos, pid, tid, t), or the
    layer GRAPH_LAYER where none names one, and the pass and stage forward where those ranges
    give none; attribution GRAPH_LAUNCH either way. Work captured inside a layer or a stage keeps
    what its capture says."""
    moved = points["t"].is_not_null() & replay.is_not_null() & (points["t"] != replay)
    if not moved.any():
        return index, contexts
    current = contexts.gather(index)
    loose = moved & current["layer"].is_null() & (current["stage"] == "other")
    if not loose.any():
        return index, contexts
    at = pl.DataFrame({"pos": points["pos"], "pid": points["pid"], "tid": replay_tid, "t": replay}).filter(loose)
    there_index, there = contexts_at(at.with_row_index("row").select(pos="row", pid="pid", tid="tid", t="t"))
    found = there.gather(there_index)
    if "attribution" not in contexts.columns:
        contexts = contexts.with_columns(attribution=pl.lit(None, pl.String))
    # like any work in a layer outside the stage ranges (`attribution_sql.result_sql`), forward
    # where nothing around the replay says otherwise
    changed = current.filter(loose).with_columns(
        pos=at["pos"], layer=found["layer"].fill_null(GRAPH_LAYER), attribution=pl.lit(GRAPH_LAUNCH),
        **{"pass": found["pass"].fill_null(current.filter(loose)["pass"]).fill_null("forward")},
        stage=pl.when(found["stage"] != "other").then(found["stage"]).otherwise(pl.lit("forward")))
    if "launcher" in contexts.columns and "launcher" not in changed.columns:
        changed = changed.with_columns(launcher=pl.lit(None, pl.String))
    return recontext(index, contexts, changed.select("pos", *contexts.columns))
