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
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import plotly.offline
import polars as pl

from traceq import __version__
from traceq.render import figures
from traceq.render.op_roofline import TITLE as OP_ROOFLINE_TITLE
from traceq.render.op_roofline import op_roofline_chart
from traceq.render.rank_figures import bandwidth_chart, overlap_chart, rank_time_chart, skew_chart
from traceq.render.roofline import Ceilings, roofline_chart
from traceq.render.timeline_figure import timeline_chart
from traceq.units import format_duration

FIGURE_KEYS = ("stages", "layer-time", "ce", "ru", "roofline", "op-roofline", "top", "memory-layers",
               "memory-timeline", "libraries", "timeline")
"""Every figure a report can hold, in page order (`fig-<key>` is its element id)."""

RUN_FIGURE_KEYS = ("rank-time", "overlap", "bandwidth", "skew")
"""The figures added after those when a trace is one rank of a run of several (`traceq comm`,
`overlap`, `ranks`), in page order."""

_CONFIG = {"displaylogo": False, "responsive": True,
           "toImageButtonOptions": {"format": "png", "scale": 2}}


@dataclass
class ReportTrace:
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


def _charts(traces: list[ReportTrace]) -> tuple[list[figures.Chart], list[tuple[str, str]]]:
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
    add("op-roofline", OP_ROOFLINE_TITLE, "roofline-ops", lambda: op_roofline_chart(
        frames("roofline-ops"), frames("roofline-peaks"), notes("roofline-ops"),
        {t.name: t.notes.get("roofline-gpu", "") for t in traces}))
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
        lambda: timeline_chart(frames("timeline-kernels"), frames("timeline-nvtx"), notes("timeline")))
    if any(f is not None for f in frames("run-overlap").values()):  # some trace is a rank of a run
        add("rank-time", "Time per rank and iteration", "run-overlap",
            lambda: rank_time_chart(frames("run-overlap")))
        add("overlap", "Communication hidden under computation", "run-overlap",
            lambda: overlap_chart(frames("run-overlap")))
        add("bandwidth", "Collective bus bandwidth", "run-bandwidth",
            lambda: bandwidth_chart(frames("run-bandwidth"), {t.name: t.link for t in traces}))
        add("skew", "Start skew across ranks", "run-collectives", lambda: skew_chart(frames("run-collectives")))
    return charts, skipped


def _ceilings(trace: ReportTrace) -> Ceilings | None:
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


def _facts_table(traces: list[ReportTrace]) -> str:
    keys = list(dict.fromkeys(k for t in traces for k in t.facts))
    head = "".join(f"<th>{html.escape(t.name)}</th>" for t in traces)
    rows = "".join(f"<tr><th>{html.escape(k)}</th>" + "".join(f"<td>{html.escape(t.facts.get(k, ''))}</td>"
                                                              for t in traces) + "</tr>" for k in keys)
    return f'<table class="facts"><tr><th>trace</th>{head}</tr>{rows}</table>'


_FINDINGS_TITLE = "What to change first"


def _findings_section(traces: list[ReportTrace]) -> str:
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


def render_report(traces: list[ReportTrace], *, title: str | None = None, started: float | None = None) -> str:
    """The HTML text of a report on `traces` (side by side, in the order given; `traceq.api.report`
    gathers them): first each trace's `traceq advise` findings, then the figures (see
    `FIGURE_KEYS` and, for a rank of a run of several, `RUN_FIGURE_KEYS`). `started`: when the
    work began (`time.monotonic()`), for the page's "built in" line."""
    started = time.monotonic() if started is None else started
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
