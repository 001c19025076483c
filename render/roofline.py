"""The roofline figure of `traceq report`: each layer's convolution and GEMM kernels placed by
their arithmetic intensity against DRAM and L2 bytes (DeLTA's traffic model, `analysis.efficiency.traffic`)
and by the FLOP/s they achieved, under the GPU's compute peak and its DRAM and L2 bandwidth
lines. Like every figure it takes frames, never the store.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import NamedTuple

import polars as pl

from traceq.render.figures import PASS_COLOURS, Chart, Frames, finish, panel_note, panels
from traceq.render.table import cut_middle

LABELLED = 5
"""Points named on the figure (the layers that took the longest); hover names every point."""


class Ceilings(NamedTuple):
    """The roofs of one trace's GPU: peak FLOP/s of its kernels' main math, DRAM and L2 bytes/s."""

    peak_flops: float
    dram_bytes_per_s: float
    l2_bytes_per_s: float
    label: str  # 'NVIDIA H200, TF32 tensor cores'


def _label_places(xs: list[float], ys: list[float], x_range: tuple[float, float],
                  y_range: tuple[float, float]) -> list[tuple[int, str]]:
    """(point, text position) for the names of points (longest first) on log axes: above the
    point, else below, to its right (first to its left in the right quarter of the axis, so that
    it stays inside), else on the other side; a name that would cover one already placed there
    is left out (hover still names the point)."""
    def spot(value: float, low: float, high: float) -> float:
        return math.log10(max(value, 1e-12) / low) / max(math.log10(high / low), 1e-9) if low > 0 else 0.0

    taken: list[tuple[float, float]] = []  # each placed name's middle, in axis fractions
    placed = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        nx, ny = spot(x, *x_range), spot(y, *y_range)
        sides = ["left", "right"] if nx > 0.75 else ["right", "left"] if nx > LABEL_WIDTH else ["right"]
        for side, (vertical, dy) in ((s, v) for s in sides for v in (("top", LABEL_OFFSET), ("bottom", -LABEL_OFFSET))):
            mid_x = nx - LABEL_WIDTH / 2 if side == "left" else nx + LABEL_WIDTH / 2
            if all(abs(mid_x - tx) > LABEL_WIDTH or abs(ny + dy - ty) > LABEL_HEIGHT for tx, ty in taken):
                taken.append((mid_x, ny + dy))
                placed.append((i, f"{vertical} {side}"))
                break
    return placed


LABEL_WIDTH = 0.2
"""About how much of a narrow panel's width a point's name takes (12 characters of 11 px text)."""
LABEL_HEIGHT = 0.09
"""About how much of its height (and a gap)."""
LABEL_OFFSET = 0.025
"""How far above or below its point a name's middle is."""


def _point_names(top: pl.DataFrame) -> list[str]:
    """Each point's layer, with its direction ('bconv2 wgrad') where the layer has two points."""
    layers = top["layer"].cast(pl.String).fill_null("no layer").to_list()
    directions = top["direction"].to_list() if "direction" in top.columns else [None] * top.height
    return [html.escape(cut_middle(layer, 18) + (f" {direction}" if direction and layers.count(layer) > 1 else ""))
            for layer, direction in zip(layers, directions)]


def roofline_chart(traffic: Frames, ceilings: Mapping[str, Ceilings | None],
                   notes: Mapping[str, str] | None = None) -> Chart:
    """Achieved TFLOP/s against FLOP per byte, one point per layer, pass and GEMM shape.

    Frames: `traffic.traffic_table(by='layer')` (flops, dram_bytes, l2_bytes, measured_ns,
    predicted_ns, layer, pass, bound). Filled markers: FLOPs over DRAM bytes; open markers: over
    L2 bytes; both at the FLOP/s the kernels achieved (measured time). The diagonal lines are
    the bandwidth roofs, the horizontal one the compute peak. `notes`: why a trace's panel is
    empty, said inside it.
    """
    fig = panels(traffic, shared_y=True, height=520)
    legend: set[str] = set()
    for col, (name, frame) in enumerate(traffic.items(), start=1):
        roof = ceilings.get(name)
        if frame is None or roof is None or frame.filter(pl.col("flops") > 0).is_empty():
            panel_note(fig, col, (notes or {}).get(name) or "no modelled convolution or GEMM layers")
            continue
        frame = frame.filter((pl.col("flops") > 0) & (pl.col("measured_ns") > 0)).with_columns(
            achieved=pl.col("flops") / pl.col("measured_ns") * 1e9 / 1e12,
            label=pl.format("{} ({}, {})", "layer", "pass", "direction")
            .map_elements(html.escape, return_dtype=pl.String))
        for level, column, symbol in (("DRAM", "dram_bytes", "circle"), ("L2", "l2_bytes", "circle-open")):
            for pass_, part in frame.filter(pl.col(column) > 0).group_by("pass", maintain_order=True):
                key = f"{level}, {pass_[0]}"
                fig.add_scatter(
                    x=(part["flops"] / part[column]).to_list(), y=part["achieved"].to_list(), mode="markers",
                    name=f"FLOP per {level} byte ({pass_[0]})", legendgroup=key, showlegend=key not in legend,
                    marker=dict(symbol=symbol, size=9, color=PASS_COLOURS.get(str(pass_[0]), "#7f7f7f")),
                    customdata=part.select("label", "bound").rows(), row=1, col=col,
                    hovertemplate=(f"%{{customdata[0]}}: %{{x:.1f}} FLOP/{level} byte, %{{y:.1f}} TFLOP/s"
                                   "<br>model: %{customdata[1]}-bound<extra></extra>"))
                legend.add(key)
        intensity = [min(1.0, float((frame["flops"] / frame["l2_bytes"]).min() or 1.0)) / 2,
                     2 * float((frame["flops"] / frame["dram_bytes"].clip(1)).max() or 1e3)]
        top = frame.filter(pl.col("dram_bytes") > 0).sort("measured_ns", descending=True).head(LABELLED)
        xs, ys = (top["flops"] / top["dram_bytes"]).to_list(), top["achieved"].to_list()
        lowest = min(min(ys), intensity[0] * min(roof.dram_bytes_per_s, roof.l2_bytes_per_s) / 1e12)
        placed = _label_places(xs, ys, (intensity[0], intensity[1]), (lowest, max(roof.peak_flops / 1e12, *ys)))
        names = _point_names(top)
        if placed:
            fig.add_scatter(x=[xs[i] for i, _ in placed], y=[ys[i] for i, _ in placed], mode="text",
                            text=[names[i] for i, _ in placed], textposition=[p for _, p in placed],
                            showlegend=False, hoverinfo="skip", cliponaxis=False,
                            textfont=dict(size=11, color="#333"), row=1, col=col)
        peak = roof.peak_flops / 1e12
        for level, bandwidth, dash in (("DRAM", roof.dram_bytes_per_s, "dash"), ("L2", roof.l2_bytes_per_s, "dot")):
            knee = peak * 1e12 / bandwidth
            xs = [intensity[0], knee, intensity[1]] if intensity[0] < knee < intensity[1] else intensity
            ys = [min(peak, x * bandwidth / 1e12) for x in xs]
            fig.add_scatter(x=xs, y=ys, mode="lines", name=f"{level} roof", legendgroup=f"roof {level}",
                            showlegend=f"roof {level}" not in legend, line=dict(color="#555", dash=dash),
                            row=1, col=col, hovertemplate=f"{level} roof: %{{y:.1f}} TFLOP/s<extra></extra>")
            legend.add(f"roof {level}")
        fig.add_annotation(text=roof.label, xref=f"x{'' if col == 1 else col} domain", yref="paper", x=0.02,
                           y=1.0, showarrow=False, font=dict(size=11, color="#555"), xanchor="left")
        decades = math.log10(intensity[1] / intensity[0]) if intensity[0] > 0 else 0.0
        fig.update_xaxes(type="log", dtick=1 if decades >= 2 else "D2", row=1, col=col)  # 7, 8, 9 would crowd
        low = float(frame["achieved"].min() or peak)
        fig.update_yaxes(type="log", dtick=1 if peak / max(low, 1e-9) >= 100 else "D2", row=1, col=col)
    finish(fig, "Roofline per layer (DeLTA traffic model)", "arithmetic intensity (FLOP per byte)",
            "achieved TFLOP/s", len(traffic))
    caption = ("Each layer's convolution and GEMM kernels at the FLOP/s they achieved, placed by FLOPs per DRAM "
               "byte (filled) and per L2 byte (open) as the traffic model predicts them, the five longest named "
               "(hover names every point); a point near a roof is "
               "bound by that resource, one far below every roof is held back by something the model does not "
               "see (latency, launch gaps, poor tiling).")
    return Chart("roofline", fig, caption)
