"""A trace's dependency graph: host API calls and GPU operations as nodes, with the edges that
order them, built with vectorised Polars (no loop over events).

Nodes: every runtime or driver API call (a call nested in another call of its thread, such as
the driver call inside a runtime call, is part of the outer one) and every kernel, memcpy and
memset. Edges (docs/critical.md):

- `prog`: program order. A host call follows the previous call of its thread; a GPU operation
  the previous operation of its stream (device, stream).
- `launch`: the call that issued a GPU operation (its correlation id, `operations.gpu_work`),
  kernels replayed from a CUDA graph included (they carry the graph launch's id): the operation
  starts no earlier than the call's start plus the device's least launch latency.
- `wait`: a GPU operation that started within `WAIT_WINDOW_NS` of the end of an operation on
  another stream of its device, later than its own stream and its launch allow, waited for it
  (an event wait, a stream wait, NCCL's stream coupling: the traces record no event ids, so the
  edge is read from the times).
- `sync`: a synchronising call (`gaps.SYNC_CALL`, or a memcpy without `Async`) ends no earlier
  than the last GPU operation of its process that ended before it did and was issued before
  it began.

Each edge carries a gap: the measured one on the edge that bound its node (the latest of its
constraints), a nominal one (0; a launch: the least latency) on the others, so that replaying
the graph unchanged gives back the measured times, and a change moves what depends on it.
Nodes are in an order every edge runs forward in (`order`): host calls by start, synchronising
calls by end, GPU operations by start; ties: host calls, then GPU work, then synchronisations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb
import polars as pl

from traceq.analysis.intervals import last_at_or_before, last_open
from traceq.analysis.operations import api_calls, gpu_work
from traceq.analysis.structure.conventions import ITERATION_REGEX
from traceq.analysis.structure.phases import either, split_warm
from traceq.analysis.timeline.gaps import COPY_CALL, SYNC_CALL
from traceq.errors import MissingDataError

WAIT_WINDOW_NS = 5_000
"""A GPU operation that started this close after another stream's operation ended, and later
than its own stream and launch explain, is taken to have waited for it."""

KINDS = ("call", "kernel", "memcpy", "memset")
"""Node kinds: 0 a host API call, then `operations.KINDS` + 1."""


@dataclass(frozen=True)
class Graph:
    """The graph of one trace. `nodes` is in replay order (row = node id); a pred column holds
    the row of the predecessor (-1: none), its `_gap` the gap in ns."""

    nodes: pl.DataFrame
    """kind (KINDS), lane (a thread or stream number), name (API call, kernel short name, copy
    kind), library (kernels: `classify`'s, 'NCCL' for collectives), operation, precision, layer
    (a kernel's, where the store keeps the trace's attribution),
    iteration (code into `iterations`, null outside every range), start_ns, end_ns, dur_ns,
    fixed (bool: no predecessor, starts at its measured time), prog, prog_gap, launch,
    launch_gap, wait, wait_gap, awaited (sync: the GPU node), wake_gap, sync_floor_ns (a sync
    call's least duration; a collective's own), bind and woke (what bound it as measured,
    `replay.Replayed`), peer, peer_gap, arrived (a collective kernel of a run: the same collective
    on the rank that arrived last, `ranks.run_graph`; -1, 0, false elsewhere)."""
    iterations: pl.Series
    """The iteration range names, by code."""
    dropped: int
    """Edges left out because they ran backward in the replay order (ties in the times)."""


def build_graph(con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX) -> Graph:
    """The dependency graph of the trace (see the module docstring)."""
    t = int(trace_id)
    # each part read by its own function, so that what was read to make it is freed on its return
    return _assemble(con, t, _host(con, t), _gpu(con, t, iteration_regex), iteration_regex)


def _host(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """The host nodes: the outermost API call of each thread (kind, pid, thread, start_ns, end_ns,
    name, sync)."""
    t = int(trace_id)
    api_names = dict(con.execute("SELECT name_id, name FROM api_names WHERE trace_id = ?", [t]).fetchall())
    calls = api_calls(con, t, None).with_columns(
        thread=(pl.struct("pid", "tid").hash() // 4).cast(pl.Int64)).sort("thread", "start_ns", "end_ns")
    reach = pl.col("end_ns").cum_max().shift(1).over("thread")
    calls = calls.filter(reach.is_null() | (pl.col("start_ns") >= reach))
    names = pl.Series([api_names.get(i) or "" for i in range(max(api_names, default=-1) + 1)], dtype=pl.String)
    call_name = names.gather(calls["name_id"]) if calls.height else pl.Series([], dtype=pl.String)
    # which names synchronise: decided once per name, not per call
    syncing = names.str.contains(SYNC_CALL.pattern) | (names.str.contains(COPY_CALL.pattern)
                                                        & ~names.str.contains("Async"))
    sync = syncing.gather(calls["name_id"]) if calls.height else pl.Series([], dtype=pl.Boolean)
    return calls.select(
        kind=pl.lit(0, pl.UInt8), pid="pid", thread="thread", start_ns="start_ns", end_ns="end_ns",
        name=call_name, sync=sync)


def _gpu(con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str) -> pl.DataFrame:
    """The GPU nodes: kernels, copies, sets (kind, pid, device, stream, start_ns, end_ns, name,
    library, operation, precision, call_thread, call_start_ns, layer)."""
    from traceq.analysis.kernels.classify import classify

    t = int(trace_id)
    work = gpu_work(con, t)
    ops = work.ops
    pid = work.of("pid")
    device = work.of("device_id")
    stream = work.of("stream_id")
    tid = work.of("tid")
    op_thread = pl.DataFrame({"pid": pid, "tid": tid}).select((pl.struct("pid", "tid").hash() // 4).cast(pl.Int64)).to_series()
    kernel_names = dict(con.execute("SELECT name_id, short_name FROM kernel_names WHERE trace_id = ?", [t]).fetchall())
    full_names = dict(con.execute("SELECT name_id, name FROM kernel_names WHERE trace_id = ?", [t]).fetchall())
    classes = {i: classify(n) for i, n in full_names.items()}
    item = ops["item"]
    is_kernel = ops["kind"] == 0
    memop_name = (work.memops["op"] + ":" + work.memops["copy_kind"].fill_null("")) if work.memops.height else None

    def per_kernel(values: dict) -> pl.Series:
        keys = pl.Series(list(values), dtype=pl.Int64)
        return item.cast(pl.Int64).replace_strict(keys, pl.Series(list(values.values())), default=None)

    kname = per_kernel(kernel_names) if kernel_names else pl.repeat("", ops.height, eager=True)
    lib = per_kernel({i: ("NCCL" if c.collective else c.library) for i, c in classes.items()}) if classes else kname
    operation = per_kernel({i: c.operation for i, c in classes.items()}) if classes else kname
    precision = per_kernel({i: c.precision or "" for i, c in classes.items()}) if classes else kname
    if memop_name is not None:
        mname = memop_name.gather(item.cast(pl.Int64).clip(0, max(memop_name.len() - 1, 0)))
        kname = pl.select(pl.when(is_kernel).then(kname).otherwise(mname)).to_series()
    gpu = pl.DataFrame({
        "kind": (ops["kind"] + 1).cast(pl.UInt8), "pid": pid, "device": device, "stream": stream,
        "start_ns": ops["start_ns"], "end_ns": ops["end_ns"], "name": kname.cast(pl.String),
        "library": _kernels_only(is_kernel, lib), "operation": _kernels_only(is_kernel, operation),
        "precision": _kernels_only(is_kernel, precision), "call_thread": op_thread, "call_start_ns": ops["call_start_ns"]})
    if gpu.is_empty():
        raise MissingDataError("the trace has no GPU work (kernels, copies, sets): no critical path to find")
    return gpu.with_columns(layer=_layers(con, t, iteration_regex, gpu))


def _layers(con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str, gpu: pl.DataFrame) -> pl.Series:
    """Each kernel's layer where the store keeps the trace's attribution (`traceq layers`), else null."""
    from traceq.analysis.structure.stored import is_kept

    try:
        kept = is_kept(con, trace_id, iteration_regex)
    except duckdb.Error:  # a dataset without the kept attribution's tables
        kept = False
    if not kept:
        return pl.repeat(None, gpu.height, dtype=pl.String, eager=True)
    t = int(trace_id)
    layers = con.sql(f"""
        SELECT q.device_id::BIGINT AS device, q.stream_id::BIGINT AS stream, e.start_ns, any_value(c.layer) AS layer
        FROM kernel_events e JOIN kernel_queues q ON q.trace_id = {t} AND q.queue_id = e.queue_id
        JOIN kernel_attribution a ON a.trace_id = {t} AND a.kernel_id = e.kernel_id
        JOIN kernel_contexts c ON c.trace_id = {t} AND c.context_id = a.context_id
        WHERE e.trace_id = {t} GROUP BY ALL""").pl()
    keys = gpu.select(device=pl.col("device").cast(pl.Int64), stream=pl.col("stream").cast(pl.Int64),
                      start_ns="start_ns", kernel=pl.col("kind") == 1)
    found = keys.join(layers, on=["device", "stream", "start_ns"], how="left", maintain_order="left")
    return pl.select(pl.when(found["kernel"]).then(found["layer"])).to_series()


def _kernels_only(is_kernel: pl.Series, values: pl.Series) -> pl.Series:
    return pl.select(pl.when(is_kernel).then(values.cast(pl.String))).to_series()


def _assemble(con: duckdb.DuckDBPyConnection, trace_id: int, host: pl.DataFrame, gpu: pl.DataFrame,
              iteration_regex: str) -> Graph:
    """Both kinds of nodes into one table in replay order, with their edges and gaps. The labels
    (name, library, operation, precision, layer) wait aside, in the parts' order, while the
    edges are found, and are put into replay order last: the sort and the edges' frames carry
    only the numbers they need (a million kernels and their calls: 3 M rows)."""
    lanes = pl.concat([host.select(a=pl.lit(0, pl.Int64), b=pl.col("thread").cast(pl.Int64)),
                       gpu.select(a=pl.col("device").cast(pl.Int64).fill_null(-1) + 1,
                                  b=pl.col("stream").cast(pl.Int64).fill_null(-1))])
    lane = lanes.select(pl.struct("a", "b").rank("dense").cast(pl.Int64)).to_series()
    del lanes
    nones = {c: pl.lit(None, pl.String) for c in ("library", "operation", "precision", "layer")}
    labels = pl.concat([host.select("name", **nones), gpu.select("name", *nones)], how="vertical_relaxed")
    nodes = pl.concat([
        host.select("kind", "pid", "start_ns", "end_ns", "sync", device=pl.lit(None, pl.Int64),
                    call_thread=pl.lit(None, pl.Int64), call_start_ns=pl.lit(None, pl.Int64), thread=pl.col("thread")),
        gpu.select("kind", pl.col("pid"), "start_ns", "end_ns", sync=pl.lit(False),
                   device=pl.col("device").cast(pl.Int64), call_thread="call_thread", call_start_ns="call_start_ns",
                   thread=pl.lit(None, pl.Int64)),
    ], how="vertical_relaxed").with_columns(lane=lane, dur_ns=pl.col("end_ns") - pl.col("start_ns"))
    del host, gpu, lane
    # replay order (`label`: each node's row in `labels`)
    tie = pl.when(pl.col("kind") > 0).then(1).when(pl.col("sync")).then(2).otherwise(0)
    nodes = (nodes.with_row_index("label")
             .with_columns(key=pl.when(pl.col("sync")).then(pl.col("end_ns")).otherwise(pl.col("start_ns")), tie=tie)
             .sort("key", "tie", "lane", "start_ns", "end_ns").drop("key", "tie").with_row_index("node")
             .with_columns(pl.col("node").cast(pl.Int64)))
    # prog: the previous node of the lane (within a lane the replay order is nearly always time
    # order already: a stable sort by lane, checked, spares sorting by four keys)
    in_lane = nodes.select("node", "lane", "start_ns", "end_ns").sort("lane", maintain_order=True)
    same = pl.col("lane").shift(1) == pl.col("lane")
    behind = (pl.col("start_ns") < pl.col("start_ns").shift(1)) | (
        (pl.col("start_ns") == pl.col("start_ns").shift(1)) & (pl.col("end_ns") < pl.col("end_ns").shift(1)))
    if in_lane.select((same & behind).any()).item():
        in_lane = in_lane.sort("lane", "start_ns", "end_ns", "node")
    previous = in_lane.select(pl.when(pl.col("lane").shift(1) == pl.col("lane")).then(pl.col("node").shift(1))
                              ).to_series()
    nodes = nodes.with_columns(prog=pl.repeat(None, nodes.height, dtype=pl.Int64, eager=True)
                               .scatter(in_lane["node"], previous))
    del in_lane, previous
    host_rows = nodes.select("node", "thread", "start_ns").filter(nodes["kind"] == 0)
    gpu_rows = nodes.select("node", "pid", "device", "start_ns", "end_ns", "call_thread", "call_start_ns"
                            ).filter(nodes["kind"] > 0)

    def none() -> pl.Series:  # a fresh column of nulls for each (scatter writes in place)
        return pl.repeat(None, nodes.height, dtype=pl.Int64, eager=True)

    # launch: the host call of the issuing thread that began last at or before the call's start
    at = last_at_or_before(host_rows["thread"].cast(pl.Int64), host_rows["start_ns"],
                           gpu_rows["call_thread"].cast(pl.Int64), gpu_rows["call_start_ns"])
    launch = none().scatter(gpu_rows["node"], host_rows["node"].gather(at))
    del at, host_rows
    # sync: the last GPU node of the process ended at or before the call's end, issued before it began
    syncs = nodes.select("node", "pid", "start_ns", "end_ns").filter(nodes["sync"])
    before = last_at_or_before(gpu_rows["pid"].cast(pl.Int64), gpu_rows["end_ns"], syncs["pid"].cast(pl.Int64),
                               syncs["end_ns"])
    waited = gpu_rows["node"].gather(before)
    issued = gpu_rows["call_start_ns"].gather(before)
    awaited = none().scatter(syncs["node"], pl.select(pl.when(issued.is_null() | (issued <= syncs["start_ns"]))
                                                    .then(waited)).to_series())
    del syncs, before, waited, issued
    # wait: another stream's operation of the device that ended last at or before the start
    ended = last_at_or_before(gpu_rows["device"].fill_null(-1), gpu_rows["end_ns"], gpu_rows["device"].fill_null(-1),
                              gpu_rows["start_ns"])
    wait = none().scatter(gpu_rows["node"], gpu_rows["node"].gather(ended))
    del ended, gpu_rows
    nodes = nodes.drop("thread", "call_thread", "call_start_ns", "sync").with_columns(
        launch=launch, awaited=awaited, wait=wait)
    del launch, awaited, wait
    nodes = _gaps(nodes).with_columns(peer=pl.lit(-1, pl.Int64), peer_gap=pl.lit(0, pl.Int64), arrived=pl.lit(False))
    nodes, dropped = _forward_only(nodes)
    iterations, codes = _iterations(con, trace_id, nodes, iteration_regex)
    nodes = nodes.with_columns(iteration=codes)
    del codes
    labels = labels.gather(nodes["label"])
    return Graph(nodes=pl.concat([nodes, labels], how="horizontal").select(
        "kind", "lane", "name", "library", "operation", "precision", "layer", "iteration", "start_ns", "end_ns", "dur_ns",
        "fixed", "prog", "prog_gap", "launch", "launch_gap", "wait", "wait_gap", "awaited", "wake_gap",
        "sync_floor_ns", "bind", "woke", "peer", "peer_gap", "arrived", "pid", "device"), iterations=iterations, dropped=dropped)


def _gaps(nodes: pl.DataFrame) -> pl.DataFrame:
    """Each edge's gap: measured on the edge that bound the node, nominal on the others."""
    end, start = nodes["end_ns"], nodes["start_ns"]
    gpu = nodes["kind"] > 0

    def at(rows: pl.Series, values: pl.Series) -> pl.Series:
        return pl.select(pl.when(rows.is_not_null()).then(values.gather(rows.fill_null(0)))).to_series()

    prog_end, launch_start, wait_end = at(nodes["prog"], end), at(nodes["launch"], start), at(nodes["wait"], end)
    # the device's least launch latency
    latency = (start - launch_start).alias("lat")
    least = (pl.DataFrame({"device": nodes["device"], "lat": latency}).filter(pl.col("lat").is_not_null())
             .group_by("device").agg(pl.col("lat").min()))
    floor = nodes.select("device").join(least, on="device", how="left", maintain_order="left")["lat"].fill_null(0)
    frame = pl.DataFrame({"p": prog_end, "l": launch_start + floor, "w": wait_end, "s": start})
    # a wait edge only where another stream ended last, later than stream and launch, close before
    wait_ok = (gpu & nodes["wait"].is_not_null() & (at(nodes["wait"], nodes["lane"]) != nodes["lane"])
               & (wait_end > frame.select(pl.max_horizontal("p", "l")).to_series().fill_null(-(1 << 62)))
               & (start - wait_end <= WAIT_WINDOW_NS)).fill_null(False)
    frame = frame.with_columns(w=pl.when(wait_ok).then("w"))
    best = frame.select(pl.max_horizontal("p", "l", "w")).to_series()
    bind_p = frame["p"].is_not_null() & (frame["p"] == best)
    bind_l = ~bind_p & frame["l"].is_not_null() & (frame["l"] == best)
    bind_w = ~bind_p & ~bind_l & frame["w"].is_not_null()
    gap = start - best
    zero = pl.lit(0, pl.Int64)
    out = nodes.with_columns(
        wait=pl.when(wait_ok).then(nodes["wait"]),
        prog_gap=pl.when(bind_p).then(gap).otherwise(zero),
        launch_gap=pl.when(bind_l).then(gap + floor).otherwise(floor),
        wait_gap=pl.when(bind_w).then(gap).otherwise(zero),
        fixed=best.is_null(),
        bind=pl.when(bind_p).then(1).when(bind_l).then(2).when(bind_w).then(3).otherwise(0).cast(pl.Int8))
    # a synchronising call: ends at the awaited work's end + the wake-up where it waited
    a_end = at(nodes["awaited"], end)
    waited = a_end.is_not_null() & (a_end > start)
    wake = (end - a_end)
    return out.with_columns(
        awaited=pl.when(a_end.is_not_null()).then(nodes["awaited"]),
        wake_gap=pl.when(waited).then(wake).otherwise(zero), woke=waited.fill_null(False),
        sync_floor_ns=pl.when(waited).then(pl.min_horizontal(wake, nodes["dur_ns"]).clip(0)).otherwise(
            nodes["dur_ns"]))


def _forward_only(nodes: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Edges that run backward in the node order (ties of equal times) left out, and counted."""
    row = nodes["node"]
    dropped = 0
    columns = {}
    for pred in ("prog", "launch", "wait", "awaited", "peer"):
        back = nodes[pred].is_not_null() & (nodes[pred] >= row)
        dropped += int(back.sum())
        columns[pred] = pl.when(back).then(None).otherwise(nodes[pred]).fill_null(-1)
    out = nodes.with_columns(**columns).with_columns(
        fixed=(pl.col("prog") < 0) & (pl.col("launch") < 0) & (pl.col("wait") < 0),
        woke=pl.col("woke") & (pl.col("awaited") >= 0), arrived=pl.col("arrived") & (pl.col("peer") >= 0))
    return out, dropped


def _iterations(con: duckdb.DuckDBPyConnection, trace_id: int, nodes: pl.DataFrame,
                iteration_regex: str) -> tuple[pl.Series, pl.Series]:
    """Each node's iteration: the range (`iteration_regex`, of its process) open when it, or the
    call that issued it, began; none in an iteration that compiled (the warm-up)."""
    ranges = con.sql(f"""
        SELECT pid, name, start_ns, coalesce(end_ns, (SELECT max(end_ns) + 1 FROM kernel_events
                                                      WHERE trace_id = {int(trace_id)})) AS end_ns,
               regexp_matches(coalesce(name, ''), ?) AS is_iter
        FROM nvtx WHERE trace_id = {int(trace_id)} AND kind IN ('pushpop', 'startend') AND pid IS NOT NULL
          AND regexp_matches(coalesce(name, ''), ?) ORDER BY start_ns""",
                     params=[iteration_regex, either(iteration_regex)]).pl()
    ranges = ranges.filter(pl.col("end_ns").is_not_null())
    # an iteration during which its process compiled is the warm-up, on no critical path (`structure.phases`)
    ranges, warm = split_warm(ranges)
    ranges = ranges.filter(~warm)
    if ranges.height == 0:
        return pl.Series([], dtype=pl.String), pl.repeat(None, nodes.height, dtype=pl.UInt32, eager=True)
    order = ranges.select(pl.col("name").unique(maintain_order=True))["name"]
    code = ranges["name"].replace_strict(order, pl.int_range(0, len(order), eager=True), return_dtype=pl.UInt32)
    launch = nodes["launch"]
    when = nodes["start_ns"].clone().scatter((launch >= 0).arg_true(),
                                     nodes["start_ns"].gather(launch.filter(launch >= 0)))
    when = pl.select(pl.when(nodes["kind"] == 0).then(nodes["start_ns"]).otherwise(when)).to_series()
    if ranges["pid"].n_unique() > 1:
        row = last_at_or_before(ranges["pid"], ranges["start_ns"], nodes["pid"], when)
        inside = pl.select(pl.when(when < ranges["end_ns"].gather(row)).then(row)).to_series()
        return order, code.gather(inside)
    return order, last_open(ranges["start_ns"], ranges["end_ns"], code, when)


NAME_VERSION = re.compile(r"_v\d+$")
"""A call name's version suffix, dropped where one is shown."""
