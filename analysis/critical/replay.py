"""Replaying a dependency graph (`graph.Graph`) and walking back its critical paths.

The replay visits the nodes once in their order (every edge runs forward in it): a node starts
at the latest of its predecessors' times plus the edges' gaps (a node without one at its
measured start), and ends its duration later; a synchronising call ends no earlier than the
work it waits for plus its wake-up. Each node keeps which constraint bound it, and the walk back
from an iteration's last node along those gives the critical path. The loop runs over plain
Python lists: a million kernels and their calls replay in a few seconds (bench/critical_scale.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

BINDS = ("fixed", "prog", "launch", "wait")
"""What bound a node's start: nothing (its measured start), program order, launch, a wait."""

EDGES = ("node", "prog", "launch", "wait", "wake", "before", "arrive")
"""What a path segment is (`walk` gives the index)."""


@dataclass(frozen=True)
class Replayed:
    """Replayed times of every node, and what bound each."""

    start_ns: list[int]
    end_ns: list[int]
    bind: list[int]  # index into BINDS
    awaited: list[bool]  # a synchronising call's end bound by the work it waited for
    arrived: list[bool]  # a collective kernel's end bound by the last rank's arrival (its peer's start)
    preds: tuple[list[int], list[int], list[int], list[int], list[int]] | None = None
    """`predecessors` of the nodes replayed, where the replay had them as lists already."""
    times: tuple[pl.Series, pl.Series] | None = None
    """start_ns and end_ns as Series, where they are the nodes' own (`measured`)."""


def column(nodes: pl.DataFrame, name: str, lists: dict | None = None) -> list:
    """Column `name` of `nodes` as a Python list (null: -1), the one in `lists` (name -> (column,
    list), filled here) where the column holds the same values: a what-if changes a few columns
    and replays with the rest as they were."""
    values = nodes[name]
    if values.null_count():
        values = values.fill_null(-1)
    kept = lists.get(name) if lists is not None else None
    if kept is not None and kept[0].equals(values):
        return kept[1]
    out = values.to_list()
    if lists is not None:
        lists[name] = (values, out)
    return out


def replay(nodes: pl.DataFrame, dur_ns: pl.Series | None = None, lists: dict | None = None) -> Replayed:
    """Replay `nodes` (`graph.Graph.nodes`, perhaps with changed columns) with durations `dur_ns`
    (default: the measured ones); `lists`: `column`'s."""
    def col(name: str) -> list:
        return column(nodes, name, lists)

    dur = (nodes["dur_ns"] if dur_ns is None else dur_ns).cast(pl.Int64).to_list()
    measured = col("start_ns")
    prog, pg = col("prog"), col("prog_gap")
    launch, lg = col("launch"), col("launch_gap")
    wait, wg = col("wait"), col("wait_gap")
    awaited, wk = col("awaited"), col("wake_gap")
    floor = col("sync_floor_ns")
    peer, peer_gap = col("peer"), col("peer_gap")
    n = len(dur)
    starts, ends, bind, woke, arrived = [0] * n, [0] * n, [0] * n, [False] * n, [False] * n
    low = -(1 << 62)
    for i in range(n):
        s, b = low, 0
        p = prog[i]
        if p >= 0:
            s, b = ends[p] + pg[i], 1
        q = launch[i]
        if q >= 0:
            v = starts[q] + lg[i]
            if v > s:
                s, b = v, 2
        w = wait[i]
        if w >= 0:
            v = ends[w] + wg[i]
            if v > s:
                s, b = v, 3
        if b == 0:
            s = measured[i]
        starts[i] = s
        bind[i] = b
        a = awaited[i]
        if a >= 0:
            e = s + floor[i]
            v = ends[a] + wk[i]
            if v > e:
                e = v
                woke[i] = True
            ends[i] = e
        elif peer[i] >= 0:
            e = s + floor[i]
            v = starts[peer[i]] + peer_gap[i]
            if v > e:
                e = v
                arrived[i] = True
            ends[i] = e
        else:
            ends[i] = s + dur[i]
    return Replayed(starts, ends, bind, woke, arrived, preds=(prog, launch, wait, awaited, peer))


def measured(nodes: pl.DataFrame, lists: dict | None = None) -> Replayed:
    """The trace's own times as a replay: what the unchanged graph replays to (each binding edge
    carries its measured gap), without the loop; `lists`: `column`'s."""
    bind = nodes.select(pl.when(pl.col("fixed")).then(0).otherwise(pl.col("bind"))).to_series().to_list()
    return Replayed(column(nodes, "start_ns", lists), column(nodes, "end_ns", lists), bind, nodes["woke"].to_list(),
                    nodes["arrived"].to_list(), preds=predecessors(nodes, lists), times=(nodes["start_ns"], nodes["end_ns"]))


def iteration_ends(nodes: pl.DataFrame, ends: list[int] | pl.Series, starts: list[int] | pl.Series) -> pl.DataFrame:
    """Per iteration (in order of their first node), the node that ended last and when: iteration
    (code, null: the whole trace when it has no iterations), first_ns (its first node's start),
    end_ns, last (row; ties: the last such row), then iteration_ns (end - the previous
    iteration's end; the first: end - its first start)."""
    frame = pl.DataFrame({"iteration": nodes["iteration"], "start": starts, "end": ends},
                         schema_overrides={"start": pl.Int64, "end": pl.Int64}).with_row_index("row")
    if frame["iteration"].null_count() < frame.height:
        frame = frame.filter(pl.col("iteration").is_not_null())
    else:
        frame = frame.with_columns(pl.lit(0, pl.UInt32).alias("iteration"))
    end = pl.col("end")
    per = (frame.group_by("iteration", maintain_order=True)  # ties in first_ns: in order of their first row
           .agg(first_ns=pl.col("start").min(), end_ns=end.max(), last=pl.col("row").filter(end == end.max()).max())
           .sort("first_ns", maintain_order=True))
    previous = pl.col("end_ns").shift(1)
    return per.with_columns(begin_ns=pl.when(previous.is_null()).then(pl.col("first_ns")).otherwise(previous)
                            ).with_columns(iteration_ns=pl.col("end_ns") - pl.col("begin_ns"))


def predecessors(nodes: pl.DataFrame, lists: dict | None = None
                 ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """prog, launch, wait, awaited and peer of every node as lists (null: -1), for `walk`."""
    return tuple(column(nodes, name, lists) for name in ("prog", "launch", "wait", "awaited", "peer"))  # type: ignore[return-value]


def walk(preds: tuple[list[int], list[int], list[int], list[int], list[int]], run: Replayed, last: int,
         begin_ns: int, out: tuple[list[int], list[int]]) -> int:
    """The critical path ending at node `last`'s end (`preds`: `predecessors`), back to
    `begin_ns`, appended to `out` (node, what), latest first; returns how many segments. What
    (an index into EDGES) is 'node' (its own time), 'prog' (the gap after the previous node of
    its thread or stream), 'launch' (issue to start), 'wait' (another stream), 'wake' (a
    synchronising call's return after the work it waited for), 'arrive' (a collective from the
    last rank's arrival to its end) or 'before' (from begin_ns to a node that nothing earlier
    bound). Each segment ends where the one before it (in `out`) begins, the first at `last`'s
    end; where each begins follows from its node and what (`segment_bounds`): together they
    cover [begin_ns, end of last] exactly."""
    prog, launch, wait, awaited, peer = preds
    nodes, whats = out
    first = len(nodes)
    starts, ends, bind = run.start_ns, run.end_ns, run.bind
    woke, arrived = run.awaited, run.arrived
    add_node, add_what = nodes.append, whats.append
    node, at_end = last, True
    t = ends[last]
    while t > begin_ns:
        add_node(node)
        if at_end:
            if woke[node]:
                add_what(4)
                node = awaited[node]
                t = ends[node]
            elif arrived[node]:
                add_what(6)
                node = peer[node]
                t, at_end = starts[node], False
            else:
                add_what(0)
                t, at_end = starts[node], False
            continue
        b = bind[node]
        pred = -1 if b == 0 else (prog if b == 1 else launch if b == 2 else wait)[node]
        if pred < 0:  # nothing bound it, or its measured binding edge was left out (`graph._forward_only`)
            add_what(5)
            break
        add_what(b)
        if b == 2:
            t = starts[pred]
        else:
            t, at_end = ends[pred], True
        node = pred
    return len(nodes) - first


def segment_bounds(nodes: pl.DataFrame, run: Replayed, node: pl.Series, what: pl.Series, index: pl.Series,
                   begins: pl.Series, lasts: pl.Series) -> tuple[pl.Series, pl.Series]:
    """(from_ns, to_ns) of the segments `walk` gave (`node`, `what`; `index`: their iteration's
    row in `begins` and `lasts`, the begin_ns and last node each walk was given): a segment begins
    at its predecessor's time (a node's own start, a wait's work's end, ...) or, the last of its
    iteration, at begin_ns; it ends where the one before it began."""
    start, end = run.times or (pl.Series(run.start_ns, dtype=pl.Int64), pl.Series(run.end_ns, dtype=pl.Int64))
    columns = {"prog": 1, "launch": 2, "wait": 3, "awaited": 4, "peer": 6}
    frame = pl.DataFrame({"node": node, "what": what, "index": index})
    ref = pl.col("node")
    for column, code in columns.items():
        ref = pl.when(pl.col("what") == code).then(nodes[column].gather(node)).otherwise(ref)
    frame = frame.with_columns(ref=ref.clip(0))
    begin = begins.gather(index)
    lo = frame.select(pl.when(pl.col("what").is_in([1, 3, 4])).then(end.gather(frame["ref"]))
                      .otherwise(start.gather(frame["ref"]))).to_series()
    lo = pl.select(pl.when(what == 5).then(begin).otherwise(pl.max_horizontal(lo, begin))).to_series()
    first = index.cast(pl.Int64) != index.cast(pl.Int64).shift(1, fill_value=-1)
    hi = pl.select(pl.when(first).then(end.gather(lasts.gather(index))).otherwise(lo.shift(1))).to_series()
    return lo.alias("from_ns"), hi.alias("to_ns")
