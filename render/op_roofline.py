"""The report's roofline of `traceq roofline`: every layer, pass and operation that has FLOPs or
bytes (`analysis.efficiency.roofline.roofline_table`), on two rows of panels, one column per trace.

Top: the groups with FLOPs and bytes at their arithmetic intensity (FLOP per DRAM byte) and
achieved TFLOP/s, under the GPU's DRAM bandwidth line and one compute roof per precision its
kernels ran at (the ridge where the two meet). Bottom: the groups with bytes and no FLOPs
(normalisation, softmax, elementwise, copies), which have no intensity, at the bytes they move
and the bandwidth they achieve, under the DRAM bandwidth. The longest groups are named on the
figure; hover names every point. Like every figure it takes frames, never the store.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping

import polars as pl
from plotly.subplots import make_subplots

from traceq.render.figures import Chart, Frames, finish, panel_note
from traceq.render.roofline import _label_places
from traceq.render.table import cut_middle

LABELLED = 5
"""Points named in the top panel (the longest groups); hover names every point."""
LABELLED_BYTES = 3
"""Points named in the bottom panel."""

OPERATION_COLOURS = {"gemm": "#d62728", "convolution": "#1f77b4", "attention": "#9467bd", "grouped gemm": "#8c564b",
                     "normalization": "#2ca02c", "softmax": "#17becf", "elementwise": "#ff7f0e",
                     "activation": "#bcbd22", "reduction": "#e377c2", "copy": "#7f7f7f", "memset": "#c7c7c7"}
"""A colour per operation class; others get grey-brown."""
PRECISION_LINES = {"fp64": ("#bbbbbb", "solid"), "fp32": ("#999999", "solid"), "tf32": ("#666666", "solid"),
                   "fp16": ("#222222", "solid"), "bf16": ("#222222", "solid"), "fp8": ("#000000", "dot"),
                   "int8": ("#000000", "dot")}
"""Each precision's compute roof: greyer the slower (the DRAM line alone is dashed)."""

TITLE = "Roofline per layer and operation (traceq roofline)"


def _names(frame: pl.DataFrame) -> list[str]:
    """'linear #17 bwd': the layer and its pass (the colour says the operation, hover all of it)."""
    short = {"forward": "fwd", "backward": "bwd"}
    layers = frame["layer"].cast(pl.String).fill_null("no layer").to_list()
    return [html.escape(f"{cut_middle(layer, 16)} {short.get(p or '', p or '')}".strip())
            for layer, p in zip(layers, frame["pass"].to_list())]


def _hover(frame: pl.DataFrame) -> list[tuple]:
    return [(html.escape(f"{layer or 'no layer'} ({p or 'no pass'}), {op}"), precision or "no FLOPs", kernels, ns / 1e3,
             pct if pct is not None else float("nan"))
            for layer, p, op, precision, kernels, ns, pct in frame.select(
                "layer", "pass", "operation", "precision", "kernels", "total_ns", "achieved_pct").iter_rows()]


def _label(fig, frame: pl.DataFrame, xs: list[float], ys: list[float], x_range: tuple[float, float],
           y_range: tuple[float, float], row: int, col: int) -> None:
    names = _names(frame)
    placed = _label_places(xs, ys, x_range, y_range)
    if placed:
        fig.add_scatter(x=[xs[i] for i, _ in placed], y=[ys[i] for i, _ in placed], mode="text",
                        text=[names[i] for i, _ in placed], textposition=[p for _, p in placed],
                        showlegend=False, hoverinfo="skip", cliponaxis=False,
                        textfont=dict(size=11, color="#333"), row=row, col=col)


def op_roofline_chart(tables: Frames, peaks: Frames, notes: Mapping[str, str] | None = None,
                      gpus: Mapping[str, str] | None = None) -> Chart:
    """`tables`: each trace's `roofline_table(by='layer')`; `peaks`: its precision, peak_flops
    (FLOP/s) and dram_bytes_per_s; `notes`: why a trace has no table; `gpus`: its GPU's name."""
    names = list(tables)
    n = max(len(names), 1)
    titles = [*(map(html.escape, names) if n > 1 else [""] * n), *([""] * n)]
    fig = make_subplots(rows=2, cols=n, row_heights=[0.62, 0.38], vertical_spacing=0.14, horizontal_spacing=0.06,
                        subplot_titles=titles)
    fig.update_layout(height=860)
    legend: set[str] = set()
    for col, name in enumerate(names, start=1):
        frame, roofs = tables[name], peaks.get(name)
        if frame is None or roofs is None or frame.is_empty() or roofs.is_empty():
            panel_note(fig, col, (notes or {}).get(name) or "no kernel with FLOPs or bytes")
            panel_note(fig, n + col, "no kernel with bytes")
            continue
        dram = float(roofs["dram_bytes_per_s"][0])
        _flop_panel(fig, frame, roofs, dram, col, n, legend)
        _byte_panel(fig, frame, dram, col, n, legend)
        if gpus and gpus.get(name):
            fig.add_annotation(text=html.escape(gpus[name]), xref=f"x{'' if col == 1 else col} domain",
                               yref=f"y{'' if col == 1 else col} domain", x=0.02, y=1.0, yanchor="bottom",
                               showarrow=False, font=dict(size=11, color="#555"), xanchor="left")
    finish(fig, TITLE, "arithmetic intensity (FLOP per DRAM byte)", "achieved TFLOP/s", n)
    for col in range(1, n + 1):
        fig.update_xaxes(title_text="bytes moved (MB)", row=2, col=col)
    fig.update_yaxes(title_text="achieved TB/s", row=2, col=1)
    fig.update_layout(legend=dict(font=dict(size=11)))
    caption = ("Top: each layer's kernels of one operation (GEMM, attention, convolution ...) at the FLOP/s they "
               "achieved, placed by FLOPs per DRAM byte (bytes from the recorded shapes, or DeLTA's traffic model "
               "for convolutions), under the DRAM bandwidth line and the dense peak of each precision the kernels "
               "ran at (a line's knee is its ridge point); a point near a roof is bound by it. Bottom: the groups "
               "that move bytes and do no FLOPs (normalisation, softmax, elementwise, copies), by the bytes they "
               "move and the bandwidth they reach, under DRAM's. The longest groups are named; hover names every "
               "point. `traceq roofline` has the same rows.")
    return Chart("op-roofline", fig, caption)


def _flop_panel(fig, frame: pl.DataFrame, roofs: pl.DataFrame, dram: float, col: int, n: int,
                legend: set[str]) -> None:
    points = frame.filter(pl.col("intensity").is_not_null() & (pl.col("tflops") > 0))
    if points.is_empty():
        panel_note(fig, col, "no group has both FLOPs and bytes (FLOPs need recorded shapes or --spec)")
        return
    _scatter(fig, points, "intensity", "tflops", 1, col, legend,
             "%{customdata[0]}<br>%{x:.1f} FLOP/byte, %{y:.1f} TFLOP/s (%{customdata[1]})<br>%{customdata[2]} "
             "kernels, %{customdata[3]:,.1f} µs, %{customdata[4]:.0f} % of its roof")
    xs, ys = points["intensity"].to_list(), points["tflops"].to_list()
    merged = (roofs.group_by((pl.col("peak_flops") / 1e9).round(0).alias("giga"))  # equal peaks, one line
              .agg(pl.col("precision").sort().str.join("/"), pl.col("peak_flops").max()).sort("peak_flops"))
    tops = [float(p) / 1e12 for p in merged["peak_flops"]]
    ridges = [top * 1e12 / dram for top in tops]
    low_x, high_x = min(min(xs), min(ridges)) / 3, max(max(xs), max(ridges)) * 3
    fig.add_scatter(x=[low_x, max(ridges)], y=[low_x * dram / 1e12, max(tops)], mode="lines",
                    name=f"DRAM {dram / 1e12:.1f} TB/s", legendgroup="dram", showlegend="dram" not in legend,
                    line=dict(color="#555", dash="dash"), row=1, col=col,
                    hovertemplate=f"DRAM roof ({dram / 1e12:.2f} TB/s): %{{y:.1f}} TFLOP/s<extra></extra>")
    legend.add("dram")
    for precision, top, ridge in zip(merged["precision"].to_list(), tops, ridges):
        key = f"peak {precision}"
        fig.add_scatter(x=[ridge, high_x], y=[top, top], mode="lines", name=f"{precision} peak {top:,.0f} TFLOP/s",
                        legendgroup=key, showlegend=key not in legend, row=1, col=col,
                        line=dict(color=PRECISION_LINES.get(precision.split("/")[0], ("#333333", "solid"))[0],
                                  dash=PRECISION_LINES.get(precision.split("/")[0], ("#333333", "solid"))[1],
                                  width=1.5),
                        hovertemplate=(f"{precision} peak {top:,.1f} TFLOP/s; ridge at {ridge:.0f} FLOP/byte"
                                       "<extra></extra>"))
        legend.add(key)
    low_y = min(min(ys), low_x * dram / 1e12)
    top = points.sort("total_ns", descending=True).head(LABELLED)
    _label(fig, top, top["intensity"].to_list(), top["tflops"].to_list(), (low_x, high_x),
           (low_y, max(*tops, *ys)), 1, col)
    fig.update_xaxes(type="log", dtick=1 if math.log10(high_x / low_x) >= 2 else "D2", row=1, col=col)
    fig.update_yaxes(type="log", dtick=1 if max(tops) / max(low_y, 1e-12) >= 100 else "D2", row=1, col=col)


def _byte_panel(fig, frame: pl.DataFrame, dram: float, col: int, n: int, legend: set[str]) -> None:
    points = frame.filter((pl.col("flops") <= 0) & (pl.col("tbps") > 0)).with_columns(mb=pl.col("bytes") / 1e6)
    if points.is_empty():
        panel_note(fig, n + col, "no group moves bytes without FLOPs: the bytes of normalisation, elementwise "
                                 "and copy kernels come from recorded shapes (Kineto record_shapes=True)")
        return
    _scatter(fig, points, "mb", "tbps", 2, col, legend,
             "%{customdata[0]}<br>%{x:,.2f} MB at %{y:.2f} TB/s<br>%{customdata[2]} kernels, "
             "%{customdata[3]:,.1f} µs, %{customdata[4]:.0f} % of DRAM bandwidth")
    xs, ys = points["mb"].to_list(), points["tbps"].to_list()
    low_x, high_x = min(xs) / 3, max(xs) * 3
    fig.add_scatter(x=[low_x, high_x], y=[dram / 1e12] * 2, mode="lines", name=f"DRAM {dram / 1e12:.1f} TB/s",
                    legendgroup="dram", showlegend="dram" not in legend, line=dict(color="#555", dash="dash"),
                    row=2, col=col, hovertemplate=f"DRAM bandwidth {dram / 1e12:.2f} TB/s<extra></extra>")
    legend.add("dram")
    top = points.sort("total_ns", descending=True).head(LABELLED_BYTES)
    low_y = min(ys)
    _label(fig, top, top["mb"].to_list(), top["tbps"].to_list(), (low_x, high_x), (low_y, max(*ys, dram / 1e12)),
           2, col)
    fig.update_xaxes(type="log", dtick=1 if math.log10(high_x / low_x) >= 2 else "D2", row=2, col=col)
    fig.update_yaxes(type="log", dtick=1 if dram / 1e12 / max(low_y, 1e-12) >= 100 else "D2", row=2, col=col)


def _scatter(fig, points: pl.DataFrame, x: str, y: str, row: int, col: int, legend: set[str], hover: str) -> None:
    for (operation,), part in points.group_by("operation", maintain_order=True):
        key = f"op {operation}"
        fig.add_scatter(x=part[x].to_list(), y=part[y].to_list(), mode="markers", name=str(operation),
                        legendgroup=key, showlegend=key not in legend, row=row, col=col,
                        marker=dict(size=9, color=OPERATION_COLOURS.get(str(operation), "#a6761d"), opacity=0.85),
                        customdata=_hover(part), hovertemplate=hover + "<extra></extra>")
        legend.add(key)
