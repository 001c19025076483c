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


def replay(nodes: pl.DataFrame, dur_ns: pl.Series | None = None) -> Replayed:
    """Replay `nodes` (`graph.Graph.nodes`, perhaps with changed columns) with durations `dur_ns`
    (default: the measured ones)."""
    dur = (nodes["dur_ns"] if dur_ns is None else dur_ns).cast(pl.Int64).to_list()
    measured = nodes["start_ns"].to_list()
    prog, pg = nodes["prog"].to_list(), nodes["prog_gap"].to_list()
    launch, lg = nodes["launch"].to_list(), nodes["launch_gap"].to_list()
    wait, wg = nodes["wait"].to_list(), nodes["wait_gap"].to_list()
    awaited, wk = nodes["awaited"].fill_null(-1).to_list(), nodes["wake_gap"].to_list()
    floor = nodes["sync_floor_ns"].to_list()
    peer, peer_gap = nodes["peer"].to_list(), nodes["peer_gap"].to_list()
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
    return Replayed(starts, ends, bind, woke, arrived)


def measured(nodes: pl.DataFrame) -> Replayed:
    """The trace's own times as a replay: what the unchanged graph replays to (each binding edge
    carries its measured gap), without the loop."""
    bind = nodes["bind"].to_list()
    fixed = nodes["fixed"].to_list()
    return Replayed(nodes["start_ns"].to_list(), nodes["end_ns"].to_list(),
                    [0 if f else b for b, f in zip(bind, fixed)], nodes["woke"].to_list(), nodes["arrived"].to_list())


def iteration_ends(nodes: pl.DataFrame, ends: list[int], starts: list[int]) -> pl.DataFrame:
    """Per iteration (in order of their first node), the node that ended last and when: iteration
    (code, null: the whole trace when it has no iterations), first_ns (its first node's start),
    end_ns, last (row), then iteration_ns (end - the previous iteration's end; the first: end -
    its first start)."""
    frame = pl.DataFrame({"iteration": nodes["iteration"], "start": starts, "end": ends}).with_row_index("row")
    if frame["iteration"].null_count() < frame.height:
        frame = frame.filter(pl.col("iteration").is_not_null())
    else:
        frame = frame.with_columns(pl.lit(0, pl.UInt32).alias("iteration"))
    per = (frame.sort("end", "row").group_by("iteration")
           .agg(first_ns=pl.col("start").min(), end_ns=pl.col("end").last(), last=pl.col("row").last())
           .sort("first_ns"))
    previous = pl.col("end_ns").shift(1)
    return per.with_columns(begin_ns=pl.when(previous.is_null()).then(pl.col("first_ns")).otherwise(previous)
                            ).with_columns(iteration_ns=pl.col("end_ns") - pl.col("begin_ns"))


def predecessors(nodes: pl.DataFrame) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """prog, launch, wait, awaited and peer of every node as lists, for `walk`."""
    return (nodes["prog"].to_list(), nodes["launch"].to_list(), nodes["wait"].to_list(),
            nodes["awaited"].fill_null(-1).to_list(), nodes["peer"].to_list())


def walk(preds: tuple[list[int], list[int], list[int], list[int], list[int]], run: Replayed, last: int,
         begin_ns: int, out: tuple[list[int], list[int], list[int], list[int]]) -> int:
    """The critical path ending at node `last`'s end (`preds`: `predecessors`), back to
    `begin_ns`, appended to `out` (node, from_ns, to_ns, what), latest first; returns how many
    segments. What (an index into EDGES) is 'node' (its own time), 'prog' (the gap after the
    previous node of its thread or stream), 'launch' (issue to start), 'wait' (another stream),
    'wake' (a synchronising call's return after the work it waited for), 'arrive' (a collective
    from the last rank's arrival to its end) or 'before' (from begin_ns to a node that nothing
    earlier bound). The segments cover [begin_ns, end of last]
    exactly."""
    prog, launch, wait, awaited, peer = preds
    nodes, los, his, whats = out
    first = len(nodes)
    node, at_end = last, True
    t = run.end_ns[last]
    while t > begin_ns:
        if at_end:
            if run.awaited[node]:
                a = awaited[node]
                lo = run.end_ns[a]
                nodes.append(node)
                los.append(lo)
                his.append(t)
                whats.append(4)
                node, t = a, lo
                continue
            if run.arrived[node]:
                a = peer[node]
                lo = run.start_ns[a]
                nodes.append(node)
                los.append(lo)
                his.append(t)
                whats.append(6)
                node, t, at_end = a, lo, False
                continue
            lo = run.start_ns[node]
            nodes.append(node)
            los.append(lo)
            his.append(t)
            whats.append(0)
            t, at_end = lo, False
            continue
        b = run.bind[node]
        if b and (prog if b == 1 else launch if b == 2 else wait)[node] < 0:
            b = 0  # the measured binding edge was left out (`graph._forward_only`)
        if b == 0:
            nodes.append(node)
            los.append(begin_ns)
            his.append(t)
            whats.append(5)
            t = begin_ns
            break
        pred = (prog if b == 1 else launch if b == 2 else wait)[node]
        lo = run.start_ns[pred] if b == 2 else run.end_ns[pred]
        nodes.append(node)
        los.append(lo)
        his.append(t)
        whats.append(b)
        node, t, at_end = pred, lo, b != 2
    if len(nodes) > first and los[-1] < begin_ns:  # clipped at the iteration's beginning
        los[-1] = begin_ns
    return len(nodes) - first
