"""The report's data (`traceq report`): for each trace the frames its figures take, gathered from
the analyses; `traceq.render.report` draws them into one HTML page."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import polars as pl

from traceq.analysis.advise import advise
from traceq.analysis.memory import CAPTURE_HINT, memory_by_layer, memory_summary, memory_timeline
from traceq.analysis.structure.conventions import ITERATION_REGEX, steady
from traceq.analysis.structure.layers import attributed_kernels, layer_times, library_times, stage_times
from traceq.errors import MissingDataError, TraceqError
from traceq.render.report import ReportTrace, render_report
from traceq.units import format_bytes, format_duration

TIMELINE_KERNELS = 10_000
"""At most this many kernels are drawn in the timeline (one iteration normally is fewer)."""

CRITICAL_MAX_KERNELS = 2_000_000
"""Above this many kernels the report leaves the critical path to `traceq critical`: its graph
holds every launch (a million kernels: 14 CPU s and 2.2 GB of the report's 35 and 2.2), past the
report's 20 s and 3 GB at ten million (issue 38)."""

def build_report(
    con: duckdb.DuckDBPyConnection, trace_ids: list[int], *, iteration_regex: str = ITERATION_REGEX,
    top_k: int = 15, title: str | None = None, spec: Path | None = None, batch: int | None = None,
) -> str:
    """The HTML text of a report on `trace_ids` (side by side, in the order given).

    First each trace's `traceq advise` findings (`analysis.advise`), then the figures: stage
    breakdown per iteration, forward/backward time per layer, CE and RU per
    layer, the longest launches with their layer, memory per layer and over time, time per
    library, and a GPU timeline of one iteration (see `render.report.FIGURE_KEYS`); for a trace
    that is a rank of a run of several, the run's time per rank, overlap, bus bandwidth and skew
    (`RUN_FIGURE_KEYS`). `spec` and `batch` give CE its FLOPs where the traces hold no shapes
    (see `efficiency.ce.ce_table`).
    """
    if not trace_ids:
        raise TraceqError("no traces to report on: name one or more with their name or id")
    started = time.monotonic()
    traces = [_gather(con, trace_id, iteration_regex, top_k, spec, batch) for trace_id in trace_ids]
    return render_report(traces, title=title, started=started)


def _try(trace: ReportTrace, key: str, build: Callable[[], pl.DataFrame]) -> None:
    """frames[key] = build(), or None with the reason in notes[key]."""
    try:
        trace.frames[key] = build()
    except (TraceqError, ImportError) as e:  # e.g. no shapes, or a GPU the tables do not know
        trace.frames[key] = None
        trace.notes[key] = str(e) if isinstance(e, TraceqError) else "not available in this traceq"


def _first_ns(attributed: pl.DataFrame) -> pl.DataFrame:
    """layer, pass, first_ns: when each layer's first kernel started (for execution order)."""
    return attributed.group_by("layer", "pass").agg(first_ns=pl.col("start_ns").min())


def _with_order(frame: pl.DataFrame, order: pl.DataFrame) -> pl.DataFrame:
    return frame.join(order, on=["layer", "pass"], how="left", nulls_equal=True)


def _gather(con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str, top_k: int,
            spec: Path | None, batch: int | None) -> ReportTrace:
    row = con.execute("SELECT name, gpus, kernel_count, start_ns, end_ns, span_ns, format, tool FROM traces "
                      "WHERE trace_id = ?", [trace_id]).fetchall()[0]
    trace = ReportTrace(trace_id, row[0], span=(row[3] or 0, row[4] or 0))
    attributed = attributed_kernels(con, trace_id, iteration_regex)
    order = _first_ns(attributed)
    stages = stage_times(con, trace_id, iteration_regex)
    trace.iterations = stages.filter(steady())["iteration"].n_unique()
    trace.frames["stages"] = stages
    trace.frames["layers"] = _with_order(layer_times(con, trace_id, iteration_regex), order)
    trace.frames["libraries"] = library_times(con, trace_id, iteration_regex=iteration_regex)
    _efficiency(con, trace, attributed, order, iteration_regex, spec, batch)
    window, where = _window(attributed)
    trace.notes["top"] = where
    trace.frames["top"] = (window.sort(["dur_ns", "start_ns"], descending=[True, False]).head(top_k)
                           .with_row_index("rank", offset=1)
                           .select("rank", "layer", "pass", "short_name", "name", "library", "dur_ns"))
    _timeline(con, trace, window, attributed.height, where)
    _memory(con, trace, iteration_regex, order)
    if spec is not None:
        _activations(con, trace, attributed, spec, batch)
    trace.findings = advise(con, trace_id, iteration_regex)[0]
    busy = stages.filter(steady())
    spans = busy["span_ns"].cast(pl.Float64)
    trace.facts = {
        "GPUs": row[1] or "",
        "format": f"{row[6]} ({row[7]})" if row[7] else str(row[6]),
        "kernels": f"{row[2]:,}",
        "span": format_duration(row[5]),
        "iterations": str(trace.iterations),
        "iteration (mean span)": format_duration(spans.sum() / busy.height) if busy.height else "",
        "GPU idle in iterations": f"{100 * busy['idle_ns'].sum() / spans.sum():.1f} %" if spans.sum() else "",
    }
    trace.facts["critical path (per iteration)"] = (
        _critical_fact(con, trace_id, iteration_regex) if (row[2] or 0) <= CRITICAL_MAX_KERNELS else
        f"not worked out in the report above {CRITICAL_MAX_KERNELS:,} kernels: `traceq critical` does")
    summary = trace.frames.get("memory-summary")
    if summary is not None and summary.height:
        peak = summary.sort("peak_bytes", descending=True).row(0, named=True)
        share = f" ({peak['peak_pct']:.1f} % of {format_bytes(peak['memory_bytes'])})" if peak["memory_bytes"] else ""
        trace.facts["peak device memory"] = format_bytes(peak["peak_bytes"]) + share
        trace.device_memory = peak["memory_bytes"]
    else:
        trace.facts["peak device memory"] = "no memory events"
    _run(con, trace, iteration_regex)
    return trace


def _critical_fact(con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str) -> str:
    """The critical path's composition over the iterations, largest share first
    ('17.9 ms: compute 82 %, copy 17 %, idle 1 %'; `analysis.critical`)."""
    from traceq.analysis.critical.graph import build_graph
    from traceq.analysis.critical.path import CATEGORIES, critical_paths

    try:
        table = critical_paths(build_graph(con, trace_id, iteration_regex)).iterations
    except TraceqError as e:
        return str(e)
    total = int(table["iteration_ns"].sum())
    if not total:
        return ""
    shares = sorted(((int(table[f"{c.replace(' ', '_')}_ns"].sum()) / total, c) for c in CATEGORIES), reverse=True)
    parts = ", ".join(f"{c} {100 * share:.0f} %" for share, c in shares if share >= 0.005)
    return f"{format_duration(total / table.height)}: {parts}"


def _efficiency(con: duckdb.DuckDBPyConnection, trace: ReportTrace, attributed: pl.DataFrame, order: pl.DataFrame,
                iteration_regex: str, spec: Path | None, batch: int | None) -> None:
    def ru() -> pl.DataFrame:
        from traceq.analysis.efficiency.ru import ru_table

        # from the launches grouped by their attribution (`layers.launch_groups`: the kept one, or computed)
        return _with_order(ru_table(con, trace.trace_id, "layer", iteration_regex=iteration_regex), order)

    per_kernel: list[pl.DataFrame] = []  # kernel_ce, once for CE and the roofline

    def kernel_flops() -> pl.DataFrame:
        from traceq.analysis.efficiency.ce import kernel_ce

        if not per_kernel:
            per_kernel.append(kernel_ce(con, trace.trace_id, spec=spec, batch=batch, iteration_regex=iteration_regex,
                                        kernels=attributed))
        return per_kernel[0]

    def ce() -> pl.DataFrame:
        from traceq.analysis.efficiency.ce import ce_table

        frame = ce_table(con, trace.trace_id, "layer", spec=spec, batch=batch, iteration_regex=iteration_regex,
                         kernels=attributed, per_kernel=kernel_flops())
        if frame.is_empty():
            raise MissingDataError("no layer has known FLOPs: the trace records no op shapes and no model "
                                   "spec was given (traceq report --spec MODEL.toml)")
        ru_frame = trace.frames.get("ru")
        if ru_frame is not None and "library" not in frame.columns:
            frame = frame.join(ru_frame.select("layer", "pass", "library"), on=["layer", "pass"], how="left",
                               nulls_equal=True)
        return _with_order(frame, order)

    def roofline() -> pl.DataFrame:
        from traceq.analysis.efficiency.gpu_products import trace_gpu
        from traceq.analysis.efficiency.roofline import trace_roofline

        frame = trace_roofline(con, trace.trace_id, kernel_flops(), "layer", spec=spec, batch=batch,
                               iteration_regex=iteration_regex, kernels=attributed)
        gpu = trace_gpu(con, trace.trace_id)
        peaks = (kernel_flops().filter((pl.col("flops") > 0) & pl.col("peak_flops").is_not_null())
                 .group_by("precision").agg(pl.col("peak_flops").max()).sort("peak_flops"))
        trace.frames["roofline-peaks"] = peaks.with_columns(dram_bytes_per_s=pl.lit(gpu.dram_bytes_per_s))
        trace.notes["roofline-gpu"] = gpu.name
        return frame

    _try(trace, "ru", ru)
    _try(trace, "ce", ce)
    _try(trace, "roofline-ops", roofline)
    _traffic(con, trace, attributed, iteration_regex, spec, batch)


def _traffic(con: duckdb.DuckDBPyConnection, trace: ReportTrace, attributed: pl.DataFrame, iteration_regex: str,
             spec: Path | None, batch: int | None) -> None:
    """The traffic model per layer and the roofs of the trace's GPU (the roofline figure)."""
    from traceq.analysis.efficiency.gpu_products import trace_gpu
    from traceq.analysis.efficiency.traffic import traffic_table

    def frame() -> pl.DataFrame:
        result = traffic_table(con, trace.trace_id, "layer", spec=spec, batch=batch, iteration_regex=iteration_regex,
                               kernels=attributed)
        if result.is_empty():
            raise MissingDataError("no convolution or GEMM layer with known shapes")
        return result

    _try(trace, "traffic", frame)
    layers = trace.frames.get("traffic")
    if layers is not None:
        gpu = trace_gpu(con, trace.trace_id)
        math = layers.group_by("math").agg(pl.col("measured_ns").sum()).sort("measured_ns")["math"][-1]
        names = {"ffma": "FP32 cores", "fp16x2": "FP16x2 cores"}
        trace.notes["roofline-roofs"] = f"{gpu.name}, {names.get(math, f'{math.upper()} tensor cores')}"
        trace.frames["ceilings"] = pl.DataFrame([(gpu.peak_flops(math), gpu.dram_bytes_per_s, gpu.l2_bytes_per_s)],
                                                schema=["peak_flops", "dram", "l2"], orient="row")


def _window(attributed: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """The kernels of the first iteration (all kernels when there are no iteration ranges)."""
    iterations = attributed.filter(steady()).sort("start_ns")
    if iterations.is_empty():
        return attributed, "the whole trace"
    first = iterations["iteration"][0]
    return attributed.filter(pl.col("iteration") == first), str(first)


def _timeline(con: duckdb.DuckDBPyConnection, trace: ReportTrace, window: pl.DataFrame, total: int, where: str) -> None:
    window = window.sort("start_ns").head(TIMELINE_KERNELS)
    if window.is_empty():
        trace.frames["timeline-kernels"] = None
        trace.notes["timeline"] = "no kernels"
        return
    streams = con.sql(f"SELECT kernel_id, stream_id FROM kernels WHERE trace_id = {int(trace.trace_id)}").pl()
    kernels = (window.join(streams, on="kernel_id", how="left")
               .with_columns(end_ns=pl.col("start_ns") + pl.col("dur_ns"))
               .select("start_ns", "end_ns", "dur_ns", "device_id", "stream_id", "layer", "pass", "name"))
    lo, hi = int(kernels["start_ns"].min()), int(kernels["end_ns"].max())  # type: ignore[arg-type]
    # NVTX ranges are CPU time and run ahead of the GPU: take those overlapping the window
    # from the first range enclosing its first launch.
    nvtx = con.sql(f"""
        SELECT n.start_ns, n.end_ns, n.pid, n.tid, n.name, t.name AS thread
        FROM nvtx n LEFT JOIN threads t ON t.trace_id = n.trace_id AND t.pid = n.pid AND t.tid = n.tid
        WHERE n.trace_id = {int(trace.trace_id)} AND n.kind IN ('pushpop', 'startend') AND n.end_ns IS NOT NULL
          AND n.end_ns > {lo} - ({hi} - {lo}) / 2 AND n.start_ns < {hi}
        ORDER BY n.start_ns""").pl()
    if where != "the whole trace":  # the chosen iteration's ranges, not its neighbours'
        it = nvtx.filter(pl.col("name") == where).sort("start_ns")
        if it.height:
            begin, end = it["start_ns"][0], it["end_ns"][0]
            nvtx = nvtx.filter((pl.col("start_ns") >= begin) & (pl.col("start_ns") < end))
    trace.frames["timeline-kernels"] = kernels
    trace.frames["timeline-nvtx"] = nvtx
    drawn = f"{kernels.height:,} of {total:,} kernels"
    trace.notes["timeline"] = f"{where}, {drawn}" if kernels.height == window.height else f"{where}, first {drawn}"


def _memory(con: duckdb.DuckDBPyConnection, trace: ReportTrace, iteration_regex: str, order: pl.DataFrame) -> None:
    for key, build in (("memory-layers", memory_by_layer), ("memory-timeline", memory_timeline),
                       ("memory-summary", memory_summary)):
        try:
            trace.frames[key] = build(con, trace.trace_id, iteration_regex)
        except MissingDataError:
            trace.frames[key] = None
            trace.notes[key] = f"no memory events: {CAPTURE_HINT}"
    timeline = trace.frames["memory-timeline"]
    if timeline is not None and not int(timeline["bytes_in_use"].max() or 0):  # type: ignore[arg-type]
        # events that never held a byte: a chart of them is a flat line on an axis of nothing
        trace.frames["memory-timeline"] = None
        trace.notes["memory-timeline"] = "the memory events never hold a byte of device memory"
    layers = trace.frames["memory-layers"]
    if layers is not None and not int(layers["alloc_bytes"].sum() or 0):
        trace.frames["memory-layers"] = None
        trace.notes["memory-layers"] = "the memory events allocate no device memory"
    elif layers is not None:
        trace.frames["memory-layers"] = _with_order(layers, order)


def _activations(con: duckdb.DuckDBPyConnection, trace: ReportTrace, attributed: pl.DataFrame, spec: Path,
                 batch: int | None) -> None:
    """frames['memory-estimate']: each spec layer's output size at the trace's batch (`batch`, else
    the one its input copies show, else the spec's), with that batch as a column."""
    from traceq.analysis.efficiency.ce import infer_batch
    from traceq.analysis.efficiency.modelspec import load_spec, spec_activations

    try:
        model = load_spec(spec)
        if batch is None:
            batch = infer_batch(con, trace.trace_id, attributed, math.prod(model.input_shape) * 4) or model.batch
        frame = spec_activations(spec, batch)
    except TraceqError:
        return  # the CE figure already says what is wrong with the spec
    trace.frames["memory-estimate"] = frame.with_columns(batch=pl.lit(batch))


def _run(con: duckdb.DuckDBPyConnection, trace: ReportTrace, iteration_regex: str) -> None:
    """The frames of the run figures, when the trace is one rank of a run of several."""
    from traceq.analysis.multigpu.comm import collective_kernels, comm_table, with_skew
    from traceq.analysis.multigpu.links import run_link
    from traceq.analysis.multigpu.overlap import overlap_table

    row = con.execute("SELECT r.run_id, r.name, r.world_size FROM runs r JOIN ranks k USING (run_id) "
                      "WHERE k.trace_id = ? LIMIT 1", [trace.trace_id]).fetchall()
    if not row or row[0][2] < 2:
        for key in ("run-overlap", "run-collectives", "run-bandwidth"):
            trace.frames[key] = None
        return
    run_id, name, world = row[0]
    trace.facts["run"] = f"{name}: {world} ranks"
    trace.frames["run-overlap"] = overlap_table(con, run_id, iteration_regex)
    _try(trace, "run-collectives", lambda: with_skew(collective_kernels(con, run_id, iteration_regex)))
    _try(trace, "run-bandwidth", lambda: comm_table(con, run_id, "instance", iteration_regex))
    gpu, link = run_link(con, run_id)
    if link is not None:
        trace.link = (f"{link.link} ({gpu})", link.gbps)
