"""`traceq report`: one self-contained HTML file of Plotly figures for one or more traces.

`build_report(con, trace_ids)` runs the analyses for each trace, hands their frames to the
figure functions in `render.figures`, and writes one HTML page: plotly.js embedded once (no
CDN, no network: it works offline), then each figure with its title, caption and anchor. A
figure whose data a trace lacks (no NVTX layers, no FLOPs, no memory events) says so in that
trace's panel; a figure no trace can draw becomes a one-line note. A small script records
uncaught script errors in the page (`data-script-errors` on <body>) so a browser test can
check them.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import plotly.offline
import polars as pl

from traceq import __version__
from traceq.analysis.advise import advise
from traceq.analysis.attribution import ITERATION_REGEX
from traceq.analysis.layers import attributed_kernels, layer_times, library_times, stage_times
from traceq.analysis.memory import CAPTURE_HINT, memory_by_layer, memory_summary, memory_timeline
from traceq.errors import MissingDataError, TraceqError
from traceq.render import figures
from traceq.render.roofline import Ceilings, roofline_chart
from traceq.render.columns import format_bytes, format_duration

TIMELINE_KERNELS = 10_000
"""At most this many kernels are drawn in the timeline (one iteration normally is fewer)."""

FIGURE_KEYS = ("stages", "layer-time", "ce", "ru", "roofline", "top", "memory-layers", "memory-timeline", "libraries",
               "timeline")
"""Every figure a report can hold, in page order (`fig-<key>` is its element id)."""

RUN_FIGURE_KEYS = ("rank-time", "overlap", "bandwidth", "skew")
"""The figures added after those when a trace is one rank of a run of several (`traceq comm`,
`overlap`, `ranks`), in page order."""

_CONFIG = {"displaylogo": False, "responsive": True,
           "toImageButtonOptions": {"format": "png", "scale": 2}}


@dataclass
class _Trace:
    """What the report knows about one trace: its name and the frames the figures take."""

    trace_id: int
    name: str
    frames: dict[str, pl.DataFrame | None] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    facts: dict[str, str] = field(default_factory=dict)
    iterations: int = 0
    span: tuple[int, int] = (0, 0)
    device_memory: int | None = None
    findings: pl.DataFrame | None = None
    link: tuple[str, float] | None = None  # the run's GPU link and its one-direction peak, GB/s


def _try(trace: _Trace, key: str, build: Callable[[], pl.DataFrame]) -> None:
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
            spec: Path | None, batch: int | None) -> _Trace:
    row = con.execute("SELECT name, gpus, kernel_count, start_ns, end_ns, span_ns, format, tool FROM traces "
                      "WHERE trace_id = ?", [trace_id]).fetchall()[0]
    trace = _Trace(trace_id, row[0], span=(row[3] or 0, row[4] or 0))
    attributed = attributed_kernels(con, trace_id, iteration_regex)
    order = _first_ns(attributed)
    stages = stage_times(con, trace_id, iteration_regex)
    trace.iterations = stages.filter(pl.col("iteration").is_not_null())["iteration"].n_unique()
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
    busy = stages.filter(pl.col("iteration").is_not_null())
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


def _efficiency(con: duckdb.DuckDBPyConnection, trace: _Trace, attributed: pl.DataFrame, order: pl.DataFrame,
                iteration_regex: str, spec: Path | None, batch: int | None) -> None:
    def ru() -> pl.DataFrame:
        from traceq.analysis.efficiency import ru_table

        # from the launches grouped by their attribution (`layers.launch_groups`: the kept one, or computed)
        return _with_order(ru_table(con, trace.trace_id, "layer", iteration_regex=iteration_regex), order)

    def ce() -> pl.DataFrame:
        from traceq.analysis.efficiency import ce_table

        frame = ce_table(con, trace.trace_id, "layer", spec=spec, batch=batch, iteration_regex=iteration_regex,
                         kernels=attributed)
        if frame.is_empty():
            raise MissingDataError("no layer has known FLOPs: the trace records no op shapes and no model "
                                   "spec was given (traceq report --spec MODEL.toml)")
        ru_frame = trace.frames.get("ru")
        if ru_frame is not None and "library" not in frame.columns:
            frame = frame.join(ru_frame.select("layer", "pass", "library"), on=["layer", "pass"], how="left",
                               nulls_equal=True)
        return _with_order(frame, order)

    _try(trace, "ru", ru)
    _try(trace, "ce", ce)
    _traffic(con, trace, attributed, iteration_regex, spec, batch)


def _traffic(con: duckdb.DuckDBPyConnection, trace: _Trace, attributed: pl.DataFrame, iteration_regex: str,
             spec: Path | None, batch: int | None) -> None:
    """The traffic model per layer and the roofs of the trace's GPU (the roofline figure)."""
    from traceq.analysis.gpu_products import trace_gpu
    from traceq.analysis.traffic import traffic_table
    from traceq.render.roofline import Ceilings

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
    iterations = attributed.filter(pl.col("iteration").is_not_null()).sort("start_ns")
    if iterations.is_empty():
        return attributed, "the whole trace"
    first = iterations["iteration"][0]
    return attributed.filter(pl.col("iteration") == first), str(first)


def _timeline(con: duckdb.DuckDBPyConnection, trace: _Trace, window: pl.DataFrame, total: int, where: str) -> None:
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


def _memory(con: duckdb.DuckDBPyConnection, trace: _Trace, iteration_regex: str, order: pl.DataFrame) -> None:
    for key, build in (("memory-layers", memory_by_layer), ("memory-timeline", memory_timeline),
                       ("memory-summary", memory_summary)):
        try:
            trace.frames[key] = build(con, trace.trace_id, iteration_regex)
        except MissingDataError:
            trace.frames[key] = None
            trace.notes[key] = f"no memory events: {CAPTURE_HINT}"
    layers = trace.frames["memory-layers"]
    if layers is not None:
        trace.frames["memory-layers"] = _with_order(layers, order)


def _activations(con: duckdb.DuckDBPyConnection, trace: _Trace, attributed: pl.DataFrame, spec: Path,
                 batch: int | None) -> None:
    """frames['memory-estimate']: each spec layer's output size at the trace's batch (`batch`, else
    the one its input copies show, else the spec's), with that batch as a column."""
    from traceq.analysis.efficiency import infer_batch
    from traceq.analysis.modelspec import load_spec, spec_activations

    try:
        model = load_spec(spec)
        if batch is None:
            batch = infer_batch(con, trace.trace_id, attributed, math.prod(model.input_shape) * 4) or model.batch
        frame = spec_activations(spec, batch)
    except TraceqError:
        return  # the CE figure already says what is wrong with the spec
    trace.frames["memory-estimate"] = frame.with_columns(batch=pl.lit(batch))


def _run(con: duckdb.DuckDBPyConnection, trace: _Trace, iteration_regex: str) -> None:
    """The frames of the run figures, when the trace is one rank of a run of several."""
    from traceq.analysis.comm import collective_kernels, comm_table, with_skew
    from traceq.analysis.links import run_link
    from traceq.analysis.overlap import overlap_table

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


def _charts(traces: list[_Trace]) -> tuple[list[figures.Chart], list[tuple[str, str]]]:
    """The figures, and (title, note) for those no trace could draw."""
    def frames(key: str) -> dict[str, pl.DataFrame | None]:
        return {t.name: t.frames.get(key) for t in traces}

    def notes(key: str) -> dict[str, str]:
        return {t.name: t.notes[key] for t in traces if key in t.notes}

    iterations = {t.name: t.iterations for t in traces}
    charts: list[figures.Chart] = []
    skipped: list[tuple[str, str]] = []

    def add(key: str, title: str, data_key: str, build: Callable[[], figures.Chart]) -> None:
        if all(f is None for f in frames(data_key).values()):
            reasons = sorted(set(notes(data_key).values())) or ["no data"]
            skipped.append((title, "; ".join(reasons)))
            return
        charts.append(build())

    add("stages", "Stage breakdown per iteration", "stages", lambda: figures.stage_chart(frames("stages")))
    add("layer-time", "Forward and backward time per layer", "layers",
        lambda: figures.layer_time_chart(frames("layers"), iterations))
    add("ce", "Compute efficiency per layer (paper figures 7 and 8)", "ce",
        lambda: figures.ce_chart(frames("ce"), notes("ce")))
    add("ru", "Resource utilization per layer (paper figures 9 to 12)", "ru",
        lambda: figures.ru_chart(frames("ru"), notes("ru")))
    add("roofline", "Roofline per layer (DeLTA traffic model)", "traffic", lambda: roofline_chart(
        frames("traffic"), {t.name: _ceilings(t) for t in traces}, notes("traffic")))
    add("top", "Longest kernel launches", "top", lambda: figures.top_launches_chart(frames("top"), notes("top")))
    add("memory-layers", "GPU memory allocated per layer (paper figures 13 to 16)", "memory-layers",
        lambda: figures.memory_layer_chart(frames("memory-layers"), notes("memory-layers"), iterations,
                                           frames("memory-summary"), frames("memory-estimate")))
    add("memory-timeline", "GPU memory in use over time", "memory-timeline",
        lambda: figures.memory_timeline_chart(frames("memory-timeline"), {t.name: t.span for t in traces},
                                              {t.name: t.device_memory for t in traces}, notes("memory-timeline")))
    add("libraries", "GPU time per library", "libraries",
        lambda: figures.library_chart(frames("libraries"), iterations))
    add("timeline", "GPU timeline", "timeline-kernels",
        lambda: figures.timeline_chart(frames("timeline-kernels"), frames("timeline-nvtx"), notes("timeline")))
    if any(f is not None for f in frames("run-overlap").values()):  # some trace is a rank of a run
        add("rank-time", "Time per rank and iteration", "run-overlap",
            lambda: figures.rank_time_chart(frames("run-overlap")))
        add("overlap", "Communication hidden under computation", "run-overlap",
            lambda: figures.overlap_chart(frames("run-overlap")))
        add("bandwidth", "Collective bus bandwidth", "run-bandwidth",
            lambda: figures.bandwidth_chart(frames("run-bandwidth"), {t.name: t.link for t in traces}))
        add("skew", "Start skew across ranks", "run-collectives", lambda: figures.skew_chart(frames("run-collectives")))
    return charts, skipped


def _ceilings(trace: _Trace) -> Ceilings | None:
    roofs = trace.frames.get("ceilings")
    if roofs is None:
        return None
    peak, dram, l2 = roofs.row(0)
    return Ceilings(peak, dram, l2, trace.notes.get("roofline-roofs", ""))


_STYLE = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; margin: 0 auto; max-width: 1400px;
       padding: 0 16px 40px; color: #222; }
h1 { font-size: 24px; margin: 20px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 4px; }
.meta { color: #666; font-size: 13px; margin: 0 0 12px; }
table.facts { border-collapse: collapse; font-size: 13px; margin: 8px 0 12px; }
table.facts th, table.facts td { border: 1px solid #ddd; padding: 4px 10px; text-align: left; }
table.facts th { background: #f3f3f3; }
nav { font-size: 13px; margin: 8px 0; } nav a { margin-right: 14px; }
p.caption { font-size: 14px; color: #333; margin: 2px 0 8px; max-width: 1100px; }
section.note p { font-size: 14px; color: #8a5a00; }
section.findings li, p.intro { font-size: 14px; margin: 0 0 8px; max-width: 1100px; }
h3 { font-size: 15px; margin: 14px 0 4px; }
#script-errors { display: none; background: #fee; color: #900; padding: 8px; font-family: monospace; }
"""

# Records uncaught errors and console.error calls so that a reader (and tests/test_report.py's
# browser) sees them.
_ERROR_HOOK = """<script>
window.traceqErrors = [];
window.addEventListener('error', function (e) { window.traceqErrors.push(String(e.message || e)); });
window.addEventListener('unhandledrejection', function (e) { window.traceqErrors.push(String(e.reason)); });
(function (error) {
  console.error = function () {
    window.traceqErrors.push(Array.prototype.join.call(arguments, ' '));
    return error.apply(console, arguments);
  };
})(console.error);
window.addEventListener('load', function () {
  document.body.setAttribute('data-script-errors', String(window.traceqErrors.length));
  if (window.traceqErrors.length) {
    var box = document.getElementById('script-errors');
    box.textContent = 'Script errors: ' + window.traceqErrors.join(' | ');
    box.style.display = 'block';
  }
});
</script>"""


def _facts_table(traces: list[_Trace]) -> str:
    keys = list(dict.fromkeys(k for t in traces for k in t.facts))
    head = "".join(f"<th>{html.escape(t.name)}</th>" for t in traces)
    rows = "".join(f"<tr><th>{html.escape(k)}</th>" + "".join(f"<td>{html.escape(t.facts.get(k, ''))}</td>"
                                                              for t in traces) + "</tr>" for k in keys)
    return f'<table class="facts"><tr><th>trace</th>{head}</tr>{rows}</table>'


_FINDINGS_TITLE = "What to change first"


def _findings_section(traces: list[_Trace]) -> str:
    """The report's first section: each trace's `traceq advise` findings, ranked."""
    parts = [f'<section id="sec-advise" class="findings"><h2>{_FINDINGS_TITLE}</h2>',
             '<p class="intro">Findings ranked by the GPU time at stake (an upper bound of what the fix could '
             'save; docs/advise.md has the rules and thresholds), with the evidence and the usual fix.</p>']
    for trace in traces:
        frame = trace.findings
        parts.append(f"<h3>{html.escape(trace.name)}</h3>")
        if frame is None or frame.is_empty():
            parts.append('<p class="panel-note">No finding reached its threshold.</p>')
            continue
        items = "".join(
            f"<li><b>{html.escape(r['title'])}</b>: {html.escape(format_duration(r['time_ns']))} at stake "
            f"({r['pct']:.1f} %)<br>Evidence: {html.escape(r['evidence'])}<br>Fix: {html.escape(r['fix'])}</li>"
            for r in frame.iter_rows(named=True))
        parts.append(f"<ol>{items}</ol>")
    parts.append("</section>")
    return "".join(parts)


def build_report(
    con: duckdb.DuckDBPyConnection, trace_ids: list[int], *, iteration_regex: str = ITERATION_REGEX,
    top_k: int = 15, title: str | None = None, spec: Path | None = None, batch: int | None = None,
) -> str:
    """The HTML text of a report on `trace_ids` (side by side, in the order given).

    First each trace's `traceq advise` findings (`analysis.advise`), then the figures: stage
    breakdown per iteration, forward/backward time per layer, CE and RU per
    layer, the longest launches with their layer, memory per layer and over time, time per
    library, and a GPU timeline of one iteration (see `FIGURE_KEYS`); for a trace that is a rank
    of a run of several, the run's time per rank, overlap, bus bandwidth and skew (`RUN_FIGURE_KEYS`). `spec` and `batch` give
    CE its FLOPs where the traces hold no shapes (see `efficiency.ce_table`).
    """
    if not trace_ids:
        raise TraceqError("no traces to report on: name one or more with their name or id")
    started = time.monotonic()
    traces = [_gather(con, trace_id, iteration_regex, top_k, spec, batch) for trace_id in trace_ids]
    charts, skipped = _charts(traces)
    names = [t.name for t in traces]
    heading = title or "traceq report: " + " vs ".join(names)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(heading)}</title>",
        f"<style>{_STYLE}</style>", _ERROR_HOOK,
        # plotly.js once, inline: the file works offline and with no CDN.
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>',
        "</head><body>", '<div id="script-errors"></div>',
        f"<h1>{html.escape(heading)}</h1>",
        f'<p class="meta">traceq {__version__}; {len(charts)} figures</p>',
        _facts_table(traces),
        "<nav>" + f'<a href="#sec-advise">{_FINDINGS_TITLE}</a>'
        + "".join(f'<a href="#sec-{c.key}">{html.escape(c.title)}</a>' for c in charts) + "</nav>",
        _findings_section(traces),
    ]
    for chart in charts:
        height = int(chart.figure.layout.height or 450)
        div = chart.figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{chart.key}",
                                   config=_CONFIG, default_width="100%", default_height=f"{height}px")
        parts += [f'<section id="sec-{chart.key}" class="figure">', div,
                  f'<p class="caption">{html.escape(chart.caption)}</p>', "</section>"]
    for heading_text, note in skipped:
        parts.append(f'<section class="note"><h2>{html.escape(heading_text)}</h2>'
                     f"<p>Not drawn: {html.escape(note)}</p></section>")
    parts.append(f'<p class="meta">built in {time.monotonic() - started:.1f} s</p></body></html>')
    return "\n".join(parts)
