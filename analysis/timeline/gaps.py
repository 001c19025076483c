"""Why the GPU waited: every gap in a device's work, classified by what the host was doing
(what `traceq idle` sums, in `analysis.timeline.idle`).

A device is busy while any kernel, memcpy or memset runs on it, on any stream; a gap is an
interval between two busy islands (from the end of the last work to the start of the next).
Each gap belongs to the work that ends it (the *next* operation: its iteration, stream and
layer; of operations starting at the same time, the first in the order `operations.gpu_work`
reads them: kernels, then copies and sets, each in the store's order) and gets one cause. When
the call that issued the next operation had ended before the device went idle, the work was
queued and the GPU waited on something else (another stream, an event, its own launch
latency), not on the host: `other`, as is a gap whose next operation has no issuing call in
the trace. Otherwise the host was late, and the cause is the first of these
that holds:

0. `compile`: a compile range of the next operation's process (`structure.phases.COMPILE_REGEX`:
   torch.compile's Dynamo and Inductor, XLA's compiler, the same ranges the `recompilation`
   finding reads) covers at least H2D_SHARE of the gap: the host was compiling (its syncs and
   copies meanwhile, autotuning's among them, are the compiler's).
1. `sync`: a thread of the next operation's process was inside a blocking call when the device
   ran out of work: a synchronize (cudaDeviceSynchronize, cudaStreamSynchronize,
   cudaEventSynchronize and their driver forms), a free (cudaFree), or a memcpy that blocks the
   host (one without `Async`, or an `Async` one to or from pageable memory) other than host to
   device. Such a call drains the queue: the host cannot run ahead while it waits. A
   synchronize that is the process's very next call after a host-to-device copy from pageable
   memory waits for that copy (PyTorch synchronizes after each such copy): that gap is
   `h2d_pageable`. A gap before its iteration's first work that the host left the blocking
   call early in (before H2D_SHARE of it) is not `sync`: the host was between iterations. The
   launch-bound gaps that follow a `sync` gap directly (no operation between found its work
   queued, same iteration) are the sync's echo: `sync` (`_sync_echoes`).
2. `h2d_pageable` / `h2d_pinned`: the thread that issued the next operation spent at least half
   of the gap (`H2D_SHARE`) inside a host-to-device copy call (the last one it began before the
   gap ended); pageable or pinned by the copy's source memory.
3. `iteration_start`: the next operation is the device's first of its iteration: the host was
   between iterations (data loading, the Python loop).
4. `launch_bound`: none of the above: the host issued work slower than the GPU ran it.

An operation's iteration is the iteration range (`iteration_regex`, on any thread of its
process) open when its issuing call began, as in `analysis.structure.attribution` (the load stores each
kernel's call with it: `operations.gpu_work` reads no call for a kernel).

Everything is interval arithmetic over sorted columns (a running maximum of end times, binary
searches, as-of joins): no loop over operations. Times are integer ns.
"""

from __future__ import annotations

import re

import duckdb
import polars as pl

from traceq.analysis.intervals import last_at_or_before, last_open
from traceq.analysis.operations import KINDS, Work, api_calls, gpu_work
from traceq.analysis.structure.conventions import ITERATION_REGEX, WARM_UP
from traceq.analysis.structure.phases import either, merged, split_warm

CAUSES = ("sync", "h2d_pageable", "h2d_pinned", "iteration_start", "launch_bound", "compile", "other")
"""Gap causes, as identifiers: the names of `traceq idle --by`'s `<cause>_ns` columns. The
host-caused ones are tested in this order after `compile` (listed after them: the warm-up's)."""

CAUSE_LABELS = {"sync": "Sync", "h2d_pageable": "H2D pageable", "h2d_pinned": "H2D pinned",
                "iteration_start": "Iteration start", "launch_bound": "Launch-bound", "compile": "Compile",
                "other": "Other"}
"""Each cause as traceq writes it everywhere: the `cause` values of `traceq idle` and of the
gaps (tables, csv and json alike), the headers of the `<cause>_ns` columns (render/columns.py
says the same words), the docs and the report."""

H2D_SHARE = 0.5
"""A gap is `h2d_*` when the host spent at least this share of it in a host-to-device copy call."""

SYNC_CALL = re.compile(r"^(cuda|cu)(Device|Stream|Event|Thread|Ctx)Synchronize|^(cudaFree|cuMemFree)")
"""API calls that block the host until the GPU has done (some of) its queued work."""

COPY_CALL = re.compile(r"^(cuda|cu)Memcpy")
"""API calls that copy memory; those without `Async` block the host."""

WAITING_CALL = re.compile(f"{SYNC_CALL.pattern}|{COPY_CALL.pattern}")
"""The calls the host can wait in (`_waiting_calls` reads only these)."""


def idle_gaps(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """Every gap of every device, in the order the work ending them started.

    Columns: device_id, start_ns (the device ran out of work), end_ns (the next operation
    began), dur_ns, cause (one of CAUSES), iteration (of the next operation; null outside
    every iteration range), stream_id, pid and tid (of the next operation and the thread that
    issued it), next_kind ('kernel', 'memcpy', 'memset'), next_name (kernel name, or
    '[CUDA memcpy Host-to-Device]' as `nsys stats` names copies), call (for `sync` and `h2d_*`
    gaps the blocking or copy call, else the call that issued the next operation; without its
    version suffix).
    """
    gaps, names = gap_frame(con, trace_id, iteration_regex)
    return _named(gaps.collect(), names)


def gap_frame(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> tuple[pl.LazyFrame, dict[str, pl.Series]]:
    """`idle_gaps` with its strings as codes: (gaps, names). gaps, a LazyFrame (collect the
    columns you need: the next operation's are gathered only when asked for), has device_id,
    start_ns, end_ns, dur_ns, cause (UInt8 into CAUSES), iteration (UInt32 into
    names['iteration']), stream_id, pid, tid, call_start_ns (when the next operation's issuing
    call began), next_kind (UInt8 into KINDS), next_item (kernel name id or memop row),
    graph_node_id (of a kernel replayed from a CUDA graph), call (api name id); in the next
    operations' start order. names: 'iteration', 'api' (by api name id), 'kernel' and
    'kernel_short' (by name id), 'memop' (by memop row): the strings."""
    t = int(trace_id)
    work = gpu_work(con, t)
    ops, memops = work.ops, work.memops
    api_names = _api_names(con, t)
    scan = _range_scan(con, t, iteration_regex)
    iterations, iteration = operation_iterations(con, t, work, iteration_regex, scan)
    compiling = merged(scan.filter(~pl.col("is_iter") & pl.col("end_ns").is_not_null()))
    del scan
    blocking, h2d = _waiting_calls(api_calls(con, t, WAITING_CALL), memops, api_names)
    # the gaps: a running maximum of end times over each device's work in start order
    device = work.of("device_id")
    devices = device.n_unique() > 1
    timeline = (ops.select(*([device] if devices else []), "start_ns", "end_ns").with_row_index("op_row")
                .sort("start_ns", maintain_order=True))  # ties: the first in the trace's order
    reach = pl.col("end_ns").cum_max().shift(1)
    timeline = timeline.select("op_row", "start_ns", gap_start=reach.over("device_id") if devices else reach,
                               pos=pl.int_range(pl.len()).over("device_id") if devices else pl.int_range(pl.len()))
    if iterations.len():  # whether each operation is its device's first of its iteration
        code = iteration
        if devices:
            code = (device.cast(pl.Int64) - (device.min() or 0)) * (len(iterations) + 1) + code
        timeline = timeline.with_columns(first=_firsts(code.gather(timeline["op_row"])))
        del code
    else:
        timeline = timeline.with_columns(first=pl.lit(False))
    gaps = timeline.filter(pl.col("start_ns") > pl.col("gap_start"))
    del timeline, device
    rows = gaps["op_row"]
    # only where the host was late (only the columns that tell): what it was doing
    late_rows = (ops["call_end_ns"].gather(rows) > gaps["gap_start"]).fill_null(False).arg_true()
    late_ops = rows.gather(late_rows)
    late = pl.DataFrame([work.of("pid", late_ops), work.of("tid", late_ops),
                         *gaps.select("start_ns", "gap_start", "first").gather(late_rows),
                         ops["call_name_id"].gather(late_ops)])
    sync_call, sync_end, h2d_call, h2d_pageable = _host_waits(late, blocking, h2d)
    # a wait the host left early in a gap before its iteration's first work: between iterations
    left_early = late["first"] & ((sync_end - late["gap_start"]) < H2D_SHARE * (late["start_ns"] - late["gap_start"]))
    cause = (pl.when(_compiling(late, compiling)).then(CAUSES.index("compile"))
             .when(sync_call.is_not_null() & ~left_early).then(0)
             .when(h2d_call.is_not_null() & h2d_pageable).then(1)
             .when(h2d_call.is_not_null()).then(2)
             .when(late["first"]).then(3)
             .otherwise(4))
    late_cause = late.select(cause=cause.cast(pl.UInt8)).with_columns(  # the call that kept the GPU waiting
        call=pl.when(pl.col("cause") == 0).then(sync_call).when(pl.col("cause") <= 2).then(h2d_call)
        .otherwise(late["call_name_id"]))
    del late
    # late gaps get their cause and call in place; the rest are `other`, their call the issuing one
    own = gaps.select("op_row", start_ns="gap_start", end_ns="start_ns").with_columns(
        cause=pl.repeat(CAUSES.index("other"), gaps.height, dtype=pl.UInt8, eager=True).scatter(late_rows, late_cause["cause"]),
        call=ops["call_name_id"].gather(rows).scatter(late_rows, late_cause["call"].cast(ops["call_name_id"].dtype)))
    own = _sync_echoes(own, gaps["pos"], work.of("device_id", rows) if devices else None, iteration.gather(rows))
    del gaps, late_cause, late_rows

    def of_next(values: pl.Series, codes: pl.Series | None = None) -> pl.Expr:
        """The next operation's value (by its code, if given), gathered when collected."""
        at = pl.col("op_row") if codes is None else pl.lit(codes).gather(pl.col("op_row"))
        return pl.lit(values).gather(at)

    queue = ops["queue"]
    frame = own.lazy().select(
        device_id=of_next(work.queues["device_id"], queue), start_ns="start_ns", end_ns="end_ns",
        dur_ns=pl.col("end_ns") - pl.col("start_ns"),
        cause="cause", iteration=of_next(iteration), stream_id=of_next(work.queues["stream_id"], queue),
        pid=of_next(work.queues["pid"], queue), tid=of_next(work.threads, ops["thread"]),
        call_start_ns=of_next(ops["call_start_ns"]), next_kind=of_next(ops["kind"]), next_item=of_next(ops["item"]),
        graph_node_id=of_next(ops["graph_node_id"]) if "graph_node_id" in ops.columns else pl.lit(None, pl.Int64),
        call="call")
    kernel_names = con.sql(f"SELECT name_id, name, short_name FROM kernel_names WHERE trace_id = {t}").pl()
    names = {
        "iteration": iterations,
        "api": api_names,
        "kernel": _by_id(kernel_names["name_id"], kernel_names["name"]),
        "kernel_short": _by_id(kernel_names["name_id"], kernel_names["short_name"]),
        "memop": memops.select(pl.when(pl.col("op") == "memcpy").then("[CUDA memcpy " + pl.col("copy_kind") + "]")
                               .otherwise(pl.lit("[CUDA memset]"))).to_series(),
    }
    return frame, names


def _sync_echoes(own: pl.DataFrame, pos: pl.Series, device: pl.Series | None, iteration: pl.Series) -> pl.DataFrame:
    """A synchronize drains the device's queue; until the host is ahead again, the GPU waits
    for each launch. Launch-bound gaps that follow a `sync` gap directly (each next operation
    the device's next, with no operation between that found work queued, in the same
    iteration) are the sync's too: they take its cause and call."""
    # each device's gaps in its own order (with several devices the gaps interleave; with one,
    # `pos` already rises with the gaps)
    frame = own.select("cause", "call").with_columns(
        row=pl.int_range(pl.len()), pos=pos, iteration=iteration,
        device=device if device is not None else pl.lit(0))
    if device is not None:
        frame = frame.sort("device", "pos", maintain_order=True)
    breaks = ((pl.col("pos").diff() != 1).fill_null(True) | (pl.col("device") != pl.col("device").shift(1)).fill_null(True)
              | (pl.col("iteration") != pl.col("iteration").shift(1)).fill_null(True)
              | pl.col("iteration").is_null() | pl.col("iteration").shift(1).is_null()
              | ~pl.col("cause").is_in([0, 4]))  # another cause between ends the echo
    # runs are contiguous: a gap echoes when the last sync gap up to it lies in its run (no
    # window per run: at ten million gaps, millions of runs made `over` the command's cost)
    at = pl.int_range(pl.len(), dtype=pl.UInt32)
    run_start = pl.when(breaks).then(at).forward_fill()
    last_sync = pl.when(pl.col("cause") == 0).then(at).forward_fill()
    frame = frame.with_columns(last_sync=last_sync, echo=(pl.col("cause") == 4) & (last_sync >= run_start).fill_null(False))
    frame = frame.select("row", cause=pl.when("echo").then(pl.lit(0, pl.UInt8)).otherwise(pl.col("cause")),
                         call=pl.when("echo").then(pl.col("call").gather(pl.col("last_sync").fill_null(0)))
                         .otherwise(pl.col("call")))
    if device is not None:
        frame = frame.sort("row")
    return own.with_columns(frame["cause"], frame["call"])


def _firsts(code: pl.Series) -> pl.Series:
    """Whether each value of `code` (nulls never) is its value's first: only where the value
    changes from the row before can it be, so the (few) changes are searched, not every row."""
    changes = (code != code.shift(1)).fill_null(True) & code.is_not_null()
    rows = changes.arg_true()
    first = code.gather(rows).is_first_distinct()
    return pl.repeat(False, len(code), eager=True).scatter(rows.filter(first), True)


def _by_id(ids: pl.Series, values: pl.Series) -> pl.Series:
    """values placed at their ids (ids 0..n, a few gaps), for gathering by id."""
    size = int(ids.max() or 0) + 1 if len(ids) else 0
    return pl.Series(values.name, [None] * size, dtype=values.dtype).scatter(ids, values) if size else values


def _api_names(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.Series:
    """Every API name of the trace without its version suffix, by name id."""
    frame = con.sql(f"SELECT name_id, regexp_replace(coalesce(name, ''), '_v[0-9]+$', '') AS name "
                    f"FROM api_names WHERE trace_id = {int(trace_id)}").pl()
    return _by_id(frame["name_id"], frame["name"])


def _range_scan(con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str) -> pl.DataFrame:
    """pid, name, start_ns, end_ns, is_iter: the trace's iteration ranges and its compile ranges in
    one scan (an iteration during which its process compiled is the warm-up, `structure.phases`, as
    attribution has it); a range of no process (Kineto's GPU-track annotations) holds no call."""
    return con.sql(f"""
        SELECT pid, name, start_ns, end_ns, regexp_matches(coalesce(name, ''), ?) AS is_iter FROM nvtx
        WHERE trace_id = {int(trace_id)} AND kind IN ('pushpop', 'startend') AND pid IS NOT NULL
          AND regexp_matches(coalesce(name, ''), ?)
        ORDER BY pid, start_ns""", params=[iteration_regex, either(iteration_regex)]).pl()


def _compiling(late: pl.DataFrame, compiling: pl.DataFrame) -> pl.Series:
    """Per late gap (pid, gap_start, start_ns: its end): whether the compile intervals of its
    process (`compiling`, `phases.merged`: disjoint) cover at least H2D_SHARE of it, by the
    compile time each process had before the gap's start and before its end."""
    if compiling.is_empty() or late.is_empty():
        return pl.repeat(False, late.height, eager=True)
    length = pl.col("end_ns") - pl.col("start_ns")
    before = compiling.select(length.cum_sum().over("pid") - length).to_series()  # compile time before each

    def compiled_by(time: pl.Series) -> pl.Series:
        row = last_at_or_before(compiling["pid"], compiling["start_ns"], late["pid"], time)
        into = (pl.min_horizontal(compiling["end_ns"].gather(row), time) - compiling["start_ns"].gather(row)).clip(0)
        return pl.select((before.gather(row) + into).fill_null(0)).to_series()

    covered = compiled_by(late["start_ns"]) - compiled_by(late["gap_start"])
    return pl.select(covered >= H2D_SHARE * (late["start_ns"] - late["gap_start"])).to_series().fill_null(False)


def operation_iterations(
    con: duckdb.DuckDBPyConnection, trace_id: int, work: Work, iteration_regex: str,
    ranges: pl.DataFrame | None = None,
) -> tuple[pl.Series, pl.Series]:
    """The iteration of each operation of `work` (see the module docstring): (names, codes), the
    codes (UInt32, null outside every iteration) index `names`, one per iteration range name.
    `ranges`: the trace's `_range_scan`, when the caller has it already."""
    ops = work.ops
    ranges = _range_scan(con, trace_id, iteration_regex) if ranges is None else ranges
    ranges, warm = split_warm(ranges)
    ranges = ranges.with_columns(name=pl.when(warm).then(pl.lit(WARM_UP)).otherwise(pl.col("name")))
    # a range that never ended lasts to the trace's end (not to the end of time: times are packed
    # into keys with the process, so they must span what the trace spans)
    horizon = max((v for v in (ops["end_ns"].max(), ops["call_end_ns"].max(), ranges["start_ns"].max())
                   if v is not None), default=0)
    ranges = ranges.with_columns(pl.col("end_ns").fill_null(horizon + 1))
    names = ranges["name"].unique().sort()
    ranges = ranges.with_columns(code=pl.col("name").replace_strict(
        names, pl.int_range(0, len(names), eager=True), return_dtype=pl.UInt32))
    if ranges.height == 0:
        return names, pl.repeat(None, ops.height, dtype=pl.UInt32, eager=True)
    start = ops["call_start_ns"]
    pids = work.queues["pid"]
    if pids.null_count() or pl.concat([pids, ranges["pid"]]).drop_nulls().n_unique() > 1:
        row = last_at_or_before(ranges["pid"], ranges["start_ns"], work.of("pid"), start)
        inside = pl.select(pl.when(start < ranges["end_ns"].gather(row)).then(row)).to_series()
        return names, ranges["code"].gather(inside)
    return names, last_open(ranges["start_ns"], ranges["end_ns"], ranges["code"], start)  # one process


def _waiting_calls(calls: pl.DataFrame, memops: pl.DataFrame, api_names: pl.Series
                   ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The calls the host can wait in, `calls` (`operations.api_calls` of WAITING_CALL), split:
    (blocking: synchronizes, frees and host-blocking copies other than to the device, with
    copy_name, the name id of the pageable host-to-device copy a synchronize directly follows;
    h2d: host-to-device copy calls, with h2d_pageable), in `calls`' columns."""
    copies = (memops.filter(pl.col("op") == "memcpy").select("pid", "correlation_id", "copy_kind", "src_kind", "dst_kind")
              .unique(["pid", "correlation_id"]))
    candidates = calls.join(copies, on=["pid", "correlation_id"], how="left", maintain_order="left")
    name = api_names.gather(candidates["name_id"])
    copying = name.str.contains(COPY_CALL.pattern)
    candidates = candidates.with_columns(
        to_device=(pl.col("copy_kind") == "Host-to-Device").fill_null(False),
        pageable=((pl.col("src_kind") == "Pageable") | (pl.col("dst_kind") == "Pageable")).fill_null(False))
    blocks_host = ~copying | ~name.str.contains("Async") | candidates["pageable"]
    # a synchronize that is the very next call after a pageable host-to-device copy waits for that
    # copy (PyTorch synchronizes after each one): it counts as the copy
    pageable_h2d = candidates.filter(pl.col("to_device") & pl.col("pageable"))
    blocking = (candidates.filter(blocks_host & ~candidates["to_device"])
                .join(pageable_h2d.select("pid", correlation_id=pl.col("correlation_id") + 1,
                                          copy_name="name_id"), on=["pid", "correlation_id"], how="left"))
    h2d = candidates.filter("to_device").with_columns(h2d_pageable=pl.col("src_kind") == "Pageable")
    return blocking, h2d


def _host_waits(gaps: pl.DataFrame, blocking: pl.DataFrame, h2d: pl.DataFrame
                ) -> tuple[pl.Series, pl.Series, pl.Series, pl.Series]:
    """Per gap: the name id of a blocking call of the process that covered the gap's start
    (sync_call) and when that call ended (sync_end), the name id of a host-to-device copy call of the issuing thread that took
    H2D_SHARE of the gap, or that the covering blocking call waited for (h2d_call), and
    whether that copy was from pageable memory (`_waiting_calls` gives the calls)."""
    holder = _covering(gaps, blocking)
    waited_copy = blocking["copy_name"].gather(holder)
    sync_call = pl.select(pl.when(waited_copy.is_null()).then(blocking["name_id"].gather(holder))).to_series()
    sync_end = blocking["end_ns"].gather(holder)
    row = last_at_or_before(h2d["pid"] * (1 << 32) + h2d["tid"], h2d["start_ns"],
                            gaps["pid"] * (1 << 32) + gaps["tid"], gaps["start_ns"] - 1)
    inside = (pl.min_horizontal(h2d["end_ns"].gather(row), gaps["start_ns"])
              - pl.max_horizontal(h2d["start_ns"].gather(row), gaps["gap_start"]))
    took = pl.select(inside >= H2D_SHARE * (gaps["start_ns"] - gaps["gap_start"])).to_series().fill_null(False)
    h2d_call = pl.select(pl.when(took).then(h2d["name_id"].gather(row))).to_series()
    h2d_pageable = h2d["h2d_pageable"].gather(row).fill_null(False)
    # the copy a covering synchronize waited for comes first
    h2d_pageable = pl.select(pl.when(waited_copy.is_not_null()).then(True).otherwise(h2d_pageable)).to_series()
    return sync_call, sync_end, pl.select(pl.coalesce(waited_copy, h2d_call)).to_series(), h2d_pageable


def _covering(gaps: pl.DataFrame, blocking: pl.DataFrame) -> pl.Series:
    """Per gap: the row of `blocking` (pid, start_ns, end_ns) of a call of the gap's process that
    had begun by the gap's start and had not ended by then, or null. Of the calls begun by then,
    the one reaching furthest is the one."""
    order = blocking.select("pid", "start_ns", "end_ns").with_row_index("row").sort("pid", "start_ns")
    reach = pl.col("end_ns").cum_max().over("pid")
    order = order.with_columns(reach=reach).with_columns(
        holder=pl.when(pl.col("end_ns") == pl.col("reach")).then(pl.col("row")).forward_fill().over("pid"))
    at = last_at_or_before(order["pid"], order["start_ns"], gaps["pid"], gaps["gap_start"])
    covered = order["reach"].gather(at) >= gaps["gap_start"]
    return pl.select(pl.when(covered).then(order["holder"].gather(at))).to_series().cast(pl.Int64)


def work_names(gaps: pl.DataFrame, names: dict[str, pl.Series], kernels: str = "kernel") -> pl.Series:
    """The name of each gap's next operation (`gap_frame`'s codes): the kernel's name
    (`kernels`: 'kernel' or 'kernel_short'), or the copy's as `nsys stats` names it."""
    kernel_names = names[kernels]
    every = pl.concat([kernel_names, names["memop"].alias(kernel_names.name)])
    work = pl.when(pl.col("next_kind") == 0).then(pl.col("next_item")).otherwise(pl.col("next_item") + len(kernel_names))
    return every.gather(gaps.select(work.cast(pl.Int64)).to_series()).alias("next_name")


def _named(gaps: pl.DataFrame, names: dict[str, pl.Series]) -> pl.DataFrame:
    """The codes of `gap_frame` as strings."""
    return gaps.select(
        "device_id", "start_ns", "end_ns", "dur_ns",
        cause=pl.Series([CAUSE_LABELS[c] for c in CAUSES]).gather(gaps["cause"]),
        iteration=names["iteration"].gather(gaps["iteration"]),
        stream_id="stream_id", pid="pid", tid="tid",
        next_kind=pl.Series(KINDS).gather(gaps["next_kind"]),
        next_name=work_names(gaps, names),
        call=names["api"].gather(gaps["call"]))
