"""Replaying a dependency graph (`graph.Graph`) and walking back its critical paths.

The replay visits the nodes once in their order (every edge runs forward in it): a node starts
at the latest of its predecessors' times plus the edges' gaps (a node without one at its
measured start), and ends its duration later; a synchronising call ends no earlier than the
work it waits for plus its wake-up. Each node keeps which constraint bound it, and the walk back
from an iteration's last node along those gives the critical path. The loop reads the nodes'
columns a slice at a time as Python lists and writes the times into packed arrays, so that a
million kernels and their calls (3 M nodes) replay in a few seconds and a few hundred MB
(bench/critical_scale.py); what the walk reads at random it reads from those arrays, or from the
columns' own buffers, not from a Python object per value.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

BINDS = ("fixed", "prog", "launch", "wait")
"""What bound a node's start: nothing (its measured start), program order, launch, a wait."""

EDGES = ("node", "prog", "launch", "wait", "wake", "before", "arrive")
"""What a path segment is (`walk` gives the index)."""

PREDS = ("prog", "launch", "wait", "awaited", "peer")
"""The predecessor columns `walk` follows."""

SLICE = 1 << 16
"""Nodes the replay loop reads as lists at a time: the lists of 3 M nodes' columns would take
more than the graph."""


@dataclass(frozen=True)
class Replayed:
    """Replayed times of every node, and what bound each (sequences indexed by node: packed
    arrays or views of the graph's columns, read one value at a time)."""

    start_ns: Sequence[int]
    end_ns: Sequence[int]
    bind: Sequence[int]  # index into BINDS
    awaited: Sequence[int]  # 1: a synchronising call's end bound by the work it waited for
    arrived: Sequence[int]  # 1: a collective kernel's end bound by the last rank's arrival (its peer's start)
    preds: tuple[Sequence[int], ...]
    """`predecessors` of the nodes replayed."""
    times: tuple[pl.Series, pl.Series]
    """start_ns and end_ns as Series (over the same memory)."""


def values(series: pl.Series, code: str = "q") -> memoryview:
    """The values of `series` (an integer or boolean column, nulls as -1) as a memoryview of
    `code` ('q' int64, 'b' int8, 'B' uint8) over its own buffer where it has one: no copy, no
    Python object per value until one is read."""
    dtype = {"q": pl.Int64, "b": pl.Int8, "B": pl.UInt8}[code]
    if series.null_count():
        series = series.fill_null(-1)
    arrow = series.cast(dtype).rechunk().to_arrow()
    return memoryview(arrow.buffers()[1]).cast(code)[arrow.offset:arrow.offset + len(arrow)]


def as_series(packed: array) -> pl.Series:
    """An array('q') as an Int64 Series over the same memory (the array can no longer grow)."""
    return pl.from_arrow(pa.Array.from_buffers(pa.int64(), len(packed), [None, pa.py_buffer(packed)]))  # type: ignore[return-value]


def replay(nodes: pl.DataFrame, dur_ns: pl.Series | None = None) -> Replayed:
    """Replay `nodes` (`graph.Graph.nodes`, perhaps with changed columns) with durations `dur_ns`
    (default: the measured ones)."""
    n = nodes.height
    dur = (nodes["dur_ns"] if dur_ns is None else dur_ns).cast(pl.Int64)
    columns = [nodes[c].fill_null(-1) if nodes[c].null_count() else nodes[c] for c in (
        "start_ns", "prog", "prog_gap", "launch", "launch_gap", "wait", "wait_gap", "awaited", "wake_gap",
        "sync_floor_ns", "peer", "peer_gap")] + [dur]
    starts, ends = array("q"), array("q")
    add_start, add_end = starts.append, ends.append
    bind, woke, arrived = bytearray(n), bytearray(n), bytearray(n)
    low = -(1 << 62)
    i = 0
    for first in range(0, n, SLICE):
        for measured, p, pg, q, lg, w, wg, a, wk, floor, peer, peer_gap, d in zip(
                *(c.slice(first, SLICE).to_list() for c in columns)):
            s, b = low, 0
            if p >= 0:
                s, b = ends[p] + pg, 1
            if q >= 0:
                v = starts[q] + lg
                if v > s:
                    s, b = v, 2
            if w >= 0:
                v = ends[w] + wg
                if v > s:
                    s, b = v, 3
            if b == 0:
                s = measured
            else:
                bind[i] = b
            add_start(s)
            if a >= 0:
                e = s + floor
                v = ends[a] + wk
                if v > e:
                    e = v
                    woke[i] = 1
            elif peer >= 0:
                e = s + floor
                v = starts[peer] + peer_gap
                if v > e:
                    e = v
                    arrived[i] = 1
            else:
                e = s + d
            add_end(e)
            i += 1
    return Replayed(starts, ends, bind, woke, arrived, preds=predecessors(nodes),
                    times=(as_series(starts), as_series(ends)))


def measured(nodes: pl.DataFrame) -> Replayed:
    """The trace's own times as a replay: what the unchanged graph replays to (each binding edge
    carries its measured gap), without the loop."""
    bind = nodes.select(pl.when(pl.col("fixed")).then(0).otherwise(pl.col("bind"))).to_series()
    return Replayed(values(nodes["start_ns"]), values(nodes["end_ns"]), values(bind, "b"),
                    values(nodes["woke"], "B"), values(nodes["arrived"], "B"), preds=predecessors(nodes),
                    times=(nodes["start_ns"], nodes["end_ns"]))


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


def predecessors(nodes: pl.DataFrame) -> tuple[memoryview, ...]:
    """prog, launch, wait, awaited and peer of every node (null: -1), for `walk`."""
    return tuple(values(nodes[name]) for name in PREDS)


def walk(preds: tuple[Sequence[int], ...], run: Replayed, last: int, begin_ns: int,
         out: tuple[list[int], list[int]]) -> int:
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
    start, end = run.times
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
