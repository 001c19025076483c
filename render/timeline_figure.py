"""The report's GPU timeline of one iteration: kernels per stream, with the NVTX ranges above
them (`timeline_chart`)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import polars as pl
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from traceq.render.figures import MS, NO_LAYER, Chart, Frames, _base_layer, _forward_layers, hover_name


class _Range(NamedTuple):
    start_ns: int
    end_ns: int
    name: str


MAX_NVTX_DEPTH = 6
"""NVTX rows drawn per thread: deeper ranges are left out of the timeline."""
MAX_NVTX_ROWS = 16


def _nvtx_rows(nvtx: pl.DataFrame, min_ns: float = 0.0) -> list[tuple[str, list[_Range]]]:
    """NVTX ranges split into rows per thread and nesting depth, outermost first; ranges shorter
    than `min_ns` (under a pixel) and deeper than MAX_NVTX_DEPTH are left out."""
    rows: list[tuple[str, list[_Range]]] = []
    processes = nvtx["pid"].n_unique() if "pid" in nvtx.columns else 1
    threads = ["pid", "tid"] if "pid" in nvtx.columns else ["tid"]
    ordered = nvtx.sort(*threads, "start_ns", pl.col("end_ns"), descending=[False] * len(threads) + [False, True])
    for keys, part in ordered.group_by(threads, maintain_order=True):
        tid = keys[-1]
        levels: list[list[_Range]] = []
        open_ends: list[int] = []
        for r in part.iter_rows(named=True):
            while open_ends and open_ends[-1] <= r["start_ns"]:
                open_ends.pop()
            depth = len(open_ends)
            open_ends.append(r["end_ns"])
            if depth >= MAX_NVTX_DEPTH or r["end_ns"] - r["start_ns"] < min_ns:
                continue
            while len(levels) <= depth:
                levels.append([])
            levels[depth].append(_Range(r["start_ns"], r["end_ns"], r["name"] or ""))
        label = part["thread"][0] if "thread" in part.columns and part["thread"][0] else f"tid {tid}"
        label += f" (pid {keys[0]})" if processes > 1 else ""  # two ranks' threads have the same names
        rows += [(f"{label} · NVTX depth {d}", level) for d, level in enumerate(levels) if level]
    return rows[:MAX_NVTX_ROWS]


def _segments(starts: Sequence[float], ends: Sequence[float], rows: Sequence[int], texts: Sequence[str]) \
        -> tuple[list[float | None], list[int | None], list[str | None]]:
    """Bars drawn as line segments separated by gaps: one SVG path for many bars."""
    x: list[float | None] = []
    y: list[int | None] = []
    t: list[str | None] = []
    for s, e, row, text in zip(starts, ends, rows, texts):
        x += [round(s, 5), round(e, 5), None]  # 10 ns resolution keeps the JSON small
        y += [row, row, None]
        t += [text, None, None]  # hover names the bar at its start point
    return x, y, t


def _fit(text: str, fraction: float) -> str:
    """`text` cut to what a bar `fraction` of the plot wide holds (about 150 characters in all)."""
    room = int(fraction * 150)
    return text if len(text) <= room else (text[: room - 1] + "…" if room > 3 else "")


def _merge_runs(frame: pl.DataFrame, tolerance_ns: float) -> pl.DataFrame:
    """Consecutive kernels of one row and colour closer than `tolerance_ns` become one bar
    (row, key, start_ns, end_ns, kernels, busy_ns, name, layer, dur_ns): bars thinner than
    a pixel would not show, and the file stays small."""
    prev_end = pl.col("end_ns").cum_max().shift(1).over("row")
    new = ((pl.col("key") != pl.col("key").shift(1).over("row")).fill_null(True)
           | ((pl.col("start_ns") - prev_end) > tolerance_ns).fill_null(True))
    return (frame.sort("row", "start_ns").with_columns(new=new)
            .with_columns(run=pl.col("new").cast(pl.Int64).cum_sum().over("row"))
            .group_by("row", "run", maintain_order=True)
            .agg(pl.col("key").first(), pl.col("start_ns").min(), pl.col("end_ns").max(),
                 kernels=pl.len(), busy_ns=pl.col("dur_ns").sum(), name=pl.col("name").first(),
                 layer=pl.col("layer").first(), dur_ns=pl.col("dur_ns").first()))


def _bar_text(r: dict[str, object]) -> str:
    """A timeline bar's hover: one kernel's full name, layer and time, or what a merged bar holds."""
    layer = html.escape(str(r["layer"] or "no layer"))
    if r["kernels"] == 1:
        return f"{hover_name(r['name'])}<br>{layer}: {r['dur_ns'] / 1e3:.1f} µs"  # type: ignore[arg-type, operator]
    span_ms = (r["end_ns"] - r["start_ns"]) / MS  # type: ignore[operator]
    return (f"{layer}: {r['kernels']} kernels, {r['busy_ns'] / MS:.3f} ms busy in "  # type: ignore[operator]
            f"{span_ms:.3f} ms; the first:<br>{hover_name(r['name'])}")  # type: ignore[arg-type]


MIN_BAR = 600
"""The narrowest bar drawn is the window's span over this (about two pixels on a 1280 px page)."""
PLOT_PX = 220
"""The least height of one trace's panel."""
LEGEND_ROW_PX = 1000


def _legend_px(names: list[str]) -> int:
    """About how high a horizontal legend of `names` is on the narrowest page, in rows of at
    most LEGEND_ROW_PX (an entry: its 40 px swatch and gaps, and 7 px a character)."""
    rows, used = 1, 0
    for name in names:
        width = 50 + 7 * len(name)
        if used and used + width > LEGEND_ROW_PX:
            rows, used = rows + 1, 0
        used += width
    return 24 * rows + 30


def timeline_chart(kernels: Frames, nvtx: Frames, notes: Mapping[str, str]) -> Chart:
    """A GPU timeline: kernels per device and stream coloured by layer, NVTX ranges above.

    Frames: kernels (start_ns, end_ns, dur_ns, device_id, stream_id, layer, pass, name) and
    NVTX ranges (start_ns, end_ns[, pid], tid, name[, thread]) of the window to draw, one panel
    per trace, stacked; `notes` says which window that is ('iteration 0, 162 of 648 kernels').
    Kernels of one layer closer than about a pixel are drawn as one bar (the hover says how many).
    """
    names = [n for n in kernels if kernels[n] is not None and not kernels[n].is_empty()]  # type: ignore[union-attr]
    palette = qualitative.Dark24
    colour_of: dict[str, str] = {}
    panels = []
    for name in names:
        frame, ranges = kernels[name], nvtx.get(name)
        assert frame is not None
        t0 = int(frame["start_ns"].min())  # type: ignore[arg-type]
        if ranges is not None and ranges.height:
            t0 = min(t0, int(ranges["start_ns"].min()))  # type: ignore[arg-type]
        t1 = int(frame["end_ns"].max())  # type: ignore[arg-type]
        forward = _forward_layers(frame)
        frame = frame.with_columns(key=pl.struct("layer", "pass").map_elements(
            lambda r: _base_layer(r["layer"], r["pass"], forward) if r["layer"] else "(no layer)",
            return_dtype=pl.String))
        for key in frame.sort("start_ns")["key"].unique(maintain_order=True):
            if key not in colour_of:
                colour_of[key] = NO_LAYER if key == "(no layer)" else palette[len(colour_of) % len(palette)]
        nvtx_rows = _nvtx_rows(ranges, (t1 - t0) / 2500) if ranges is not None and ranges.height else []
        gpu_rows = [f"GPU {d} · stream {s}" for d, s in
                    frame.select("device_id", "stream_id").unique().sort("device_id", "stream_id").iter_rows()]
        row_of = {label: len(nvtx_rows) + j for j, label in enumerate(gpu_rows)}
        frame = frame.with_columns(row=pl.format("GPU {} · stream {}", "device_id", "stream_id")
                                   .replace_strict(row_of, return_dtype=pl.Int64))
        bars = _merge_runs(frame, (t1 - t0) / 2500)
        # a bar under about two pixels wide would not show (a stream of short kernels looked empty)
        bars = bars.with_columns(end_ns=pl.max_horizontal("end_ns", pl.col("start_ns") + (t1 - t0) // MIN_BAR))
        panels.append((name, t0, t1, forward, nvtx_rows, [lb for lb, _ in nvtx_rows] + gpu_rows, bars))

    row_px = [max(PLOT_PX, 28 * len(p[5]) + 30) for p in panels] or [60]
    gap_px, top_px = 110, 100
    plot_px = sum(row_px) + gap_px * (len(row_px) - 1)
    fig = make_subplots(rows=max(len(panels), 1), cols=1, row_heights=row_px,
                        vertical_spacing=gap_px / plot_px if len(panels) > 1 else 0.0,
                        subplot_titles=[f"{p[0]}: {notes.get(p[0], '')}" for p in panels] or None)
    shown: set[str] = set()
    for i, (name, t0, t1, forward, nvtx_rows, labels, bars) in enumerate(panels, start=1):
        width = max(float(t1 - t0), 1.0)
        for r, (_, level) in enumerate(nvtx_rows):
            by_key: dict[str, list[_Range]] = {}
            for rng in level:
                key = rng.name[1:] if rng.name.startswith("b") and rng.name[1:] in forward else rng.name
                by_key.setdefault(key if key in colour_of else "", []).append(rng)
            for key, items in by_key.items():
                texts = [f"{html.escape(it.name)}: {(it.end_ns - it.start_ns) / MS:.3f} ms" for it in items]
                x, y, t = _segments([(it.start_ns - t0) / MS for it in items], [(it.end_ns - t0) / MS for it in items],
                                    [r] * len(items), texts)
                fig.add_scatter(x=x, y=y, text=t, mode="lines", opacity=0.75, showlegend=False,
                                line=dict(width=9, color=colour_of.get(key, "#9e9e9e")),
                                legendgroup=key or "nvtx", hoverinfo="text", row=i, col=1)
            shown_part = [(it, (min(it.end_ns, t1) - it.start_ns) / width) for it in level]
            wide = [(it, fraction) for it, fraction in shown_part if fraction > 0.035]
            if wide:
                fig.add_scatter(x=[((it.start_ns + min(it.end_ns, t1)) / 2 - t0) / MS for it, _ in wide],
                                y=[r] * len(wide), text=[_fit(it.name, fraction) for it, fraction in wide],
                                mode="text", textfont=dict(size=9, color="black"), showlegend=False,
                                hoverinfo="skip", row=i, col=1)
        for (key,), part in bars.group_by("key", maintain_order=True):
            x, y, t = _segments(((part["start_ns"] - t0) / MS).to_list(), ((part["end_ns"] - t0) / MS).to_list(),
                                part["row"].to_list(), [_bar_text(r) for r in part.iter_rows(named=True)])
            fig.add_scatter(x=x, y=y, text=t, mode="lines", line=dict(width=14, color=colour_of[key]), name=key,
                            legendgroup=key, showlegend=key not in shown, hoverinfo="text", row=i, col=1)
            shown.add(key)
        fig.update_yaxes(tickvals=list(range(len(labels))), ticktext=labels, range=[len(labels) - 0.5, -0.5],
                         row=i, col=1, showgrid=False)
        fig.update_xaxes(title_text="time since the window began (ms)", range=[0, width / MS * 1.01],
                         row=i, col=1)
    # the layers' legend in rows under the plot, which keeps the rows of bars together however many
    # layers there are (beside it, a tall legend stretched the figure: mostly empty space)
    legend_px = _legend_px(list(shown))
    bottom_px = 70 + legend_px
    fig.update_layout(title=dict(text="GPU timeline: kernels per device and stream, NVTX ranges above", x=0.0,
                                 xanchor="left"),
                      height=top_px + plot_px + bottom_px, template="plotly_white",
                      margin=dict(l=min(340, 30 + 7 * max((len(lb) for p in panels for lb in p[5]), default=20)),
                                  r=30, t=top_px, b=bottom_px), hovermode="closest",
                      legend=dict(title="layer", orientation="h", x=0.0, xanchor="left", y=-70 / plot_px,
                                  yanchor="top"))
    caption = ("Kernels as bars on their device and stream, coloured by layer (backward ranges share their "
               "forward layer's colour), under the NVTX ranges of each CPU thread (CPU time, so launches lead "
               "the GPU); look for gaps between kernels and for layers whose kernels crowd one stream. Only one "
               "iteration is drawn, kernels closer than a pixel are merged into one bar and NVTX ranges shorter than "
               "a pixel are left out, to keep the file small.")
    return Chart("timeline", fig, caption)


# --------------------------------------------------------------------------------------------
# multi-GPU runs: one panel per run (its name the trace's), ranks inside it
