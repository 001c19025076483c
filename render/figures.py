"""Plotly figures for `traceq report`, one function per figure, built from analysis frames.

Every function takes a mapping {trace name: frame} in display order (None where the trace
lacks the data: that trace's panel then says so) and returns a `Chart`: the figure, with a
title and axis labels carrying units, and a one-sentence caption saying what to look for.
With two or more traces the panels sit side by side (one column per trace, shared y axis) or
the trace is a dimension of the plot (colour). Figures never read the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import plotly.graph_objects as go
import polars as pl
from plotly.colors import qualitative
from plotly.subplots import make_subplots

MS = 1e6
MIB = float(1 << 20)
GIB = float(1 << 30)

STAGE_COLOURS = {"data_copy": "#8c6d31", "forward": "#1f77b4", "backward": "#ff7f0e",
                 "weight_update": "#2ca02c", "other": "#7f7f7f", "idle": "#d9d9d9"}
LIBRARY_COLOURS = {"cuDNN": "#1f77b4", "cuBLAS": "#d62728", "PyTorch ATen": "#ff7f0e", "NCCL": "#9467bd",
                   "CUTLASS": "#8c564b", "CUB/Thrust": "#e377c2", "TensorRT": "#17becf", "Apex": "#bcbd22",
                   "custom": "#2ca02c", "other": "#7f7f7f"}
PASS_COLOURS = {"forward": "#1f77b4", "backward": "#ff7f0e"}
NO_LAYER = "#c7c7c7"
OUTSIDE = "(outside layers)"

Frames = Mapping[str, "pl.DataFrame | None"]


@dataclass(frozen=True)
class Chart:
    """One report figure: `key` names its HTML element (`fig-<key>`)."""

    key: str
    figure: go.Figure
    caption: str

    @property
    def title(self) -> str:
        return str(self.figure.layout.title.text)


def _library_colour(library: str | None, extra: dict[str, str]) -> str:
    name = library or "other"
    if name not in LIBRARY_COLOURS and name not in extra:
        extra[name] = qualitative.Dark24[len(extra) % len(qualitative.Dark24)]
    return LIBRARY_COLOURS.get(name) or extra[name]


def _panels(frames: Frames, *, shared_y: bool = True, height: int = 460) -> go.Figure:
    """One column per trace, titled with the trace name."""
    names = list(frames)
    fig = make_subplots(rows=1, cols=max(len(names), 1), shared_yaxes=shared_y,
                        subplot_titles=names if len(names) > 1 else None, horizontal_spacing=0.05)
    fig.update_layout(height=height)
    return fig


def _finish(fig: go.Figure, title: str, x_title: str, y_title: str, columns: int, **layout: object) -> go.Figure:
    for col in range(1, columns + 1):
        fig.update_xaxes(title_text=x_title, row=1, col=col)
    fig.update_yaxes(title_text=y_title, row=1, col=1)
    fig.update_layout(title=dict(text=title, x=0.0, xanchor="left"), template="plotly_white",
                      margin=dict(l=80, r=30, t=90, b=80), font=dict(size=12), **layout)
    return fig


def _missing(fig: go.Figure, col: int, text: str) -> None:
    """Write `text` in the middle of panel `col` (a trace that lacks the data)."""
    suffix = "" if col == 1 else str(col)
    fig.add_annotation(text=text, xref=f"x{suffix} domain", yref=f"y{suffix} domain", x=0.5, y=0.5,
                       showarrow=False, font=dict(size=13, color="#555"))


def _iteration_label(iteration: str | None, device: int | None, devices: int) -> str:
    label = iteration if iteration is not None else "outside iterations"
    return f"{label} · GPU {device}" if devices > 1 else label


def stage_chart(stages: Frames) -> Chart:
    """The paper's figure 4: GPU time per iteration in each training stage, and idle time.

    Frames: `layers.stage_times`.
    """
    fig = _panels(stages)
    for col, (name, frame) in enumerate(stages.items(), start=1):
        if frame is None or frame.is_empty():
            _missing(fig, col, "no GPU activity")
            continue
        devices = frame["device_id"].n_unique()
        x = [_iteration_label(i, d, devices) for i, d in frame.select("iteration", "device_id").iter_rows()]
        for stage, colour in STAGE_COLOURS.items():
            y = (frame[f"{stage}_ns"] / MS).to_list()
            if stage != "idle" and sum(y) == 0.0:
                continue
            fig.add_bar(x=x, y=y, name=stage.replace("_", " "), marker_color=colour, legendgroup=stage,
                        showlegend=col == 1, row=1, col=col,
                        hovertemplate=f"{stage.replace('_', ' ')}: %{{y:.3f}} ms<extra>%{{x}}</extra>")
    _finish(fig, "Stage breakdown per iteration (paper figure 4)", "iteration", "GPU time (ms)", len(stages),
            barmode="stack")
    caption = ("Each bar is one training iteration split into data copy, forward, backward and weight "
               "update GPU time plus idle time: look for backward being about 1.5x forward, for weight update "
               "staying a few percent, and for idle gaps that mean the GPU waited on the CPU.")
    return Chart("stages", fig, caption)


def _base_layer(layer: str, pass_: str | None, forward: set[str]) -> str:
    """'bconv1' (backward) -> 'conv1' when conv1 is a forward layer; else the name itself."""
    if pass_ == "backward" and layer.startswith("b") and layer[1:] in forward:
        return layer[1:]
    return layer


def _forward_layers(frame: pl.DataFrame) -> set[str]:
    return set(frame.filter((pl.col("pass") == "forward") & pl.col("layer").is_not_null())["layer"].to_list())


def _ordered(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows in execution order when the frame has `first_ns`, else as given."""
    return frame.sort("first_ns", nulls_last=True) if "first_ns" in frame.columns else frame


def layer_time_chart(layers: Frames, iterations: Mapping[str, int]) -> Chart:
    """The paper's figure 6: forward and backward GPU time of each layer, per iteration.

    Frames: `layers.layer_times`, optionally with `first_ns` (the layer's first kernel) for
    network order; `iterations` divides the totals (0 or 1: totals over the trace).
    """
    fig = _panels(layers)
    for col, (name, frame) in enumerate(layers.items(), start=1):
        if frame is None or frame.filter(pl.col("layer").is_not_null()).is_empty():
            _missing(fig, col, "no NVTX layer ranges")
            continue
        frame = _ordered(frame)
        forward = _forward_layers(frame)
        frame = frame.with_columns(
            base=pl.struct("layer", "pass").map_elements(
                lambda r: _base_layer(r["layer"], r["pass"], forward) if r["layer"] else OUTSIDE,
                return_dtype=pl.String))
        named = frame.filter(pl.col("layer").is_not_null())
        order = list(dict.fromkeys(named.filter(pl.col("pass") != "backward")["base"].to_list()
                                   + named["base"].to_list()))
        order += [OUTSIDE] if frame["layer"].is_null().any() else []
        per = max(iterations.get(name, 1), 1)
        for pass_, colour in PASS_COLOURS.items():
            part = frame.filter(pl.col("pass") == pass_).group_by("base").agg(pl.col("total_ns").sum())
            values = dict(part.iter_rows())
            fig.add_bar(x=order, y=[values.get(b, 0) / per / MS for b in order], name=pass_, marker_color=colour,
                        legendgroup=pass_, showlegend=col == 1, row=1, col=col,
                        hovertemplate=f"{pass_}: %{{y:.3f}} ms<extra>%{{x}}</extra>")
        fig.update_xaxes(tickangle=-60, row=1, col=col)
    _finish(fig, "Forward and backward time per layer (paper figure 6)", "layer (network order)",
            "GPU time per iteration (ms)", len(layers), barmode="group")
    caption = ("Forward and backward GPU time of each NVTX layer (a backward range 'bconv1' is drawn at conv1; "
               "kernels launched outside every layer range are the last group), averaged over the iterations; "
               "look for the convolution layers dominating and for layers whose backward pass costs far more "
               "than twice their forward pass.")
    return Chart("layer-time", fig, caption)


def _efficiency_chart(frames: Frames, key: str, title: str, y_title: str, column: str, marker: str | None,
                      marker_name: str, caption: str, missing: str) -> Chart:
    fig = _panels(frames)
    extra: dict[str, str] = {}
    shown: set[str] = set()
    marker_shown = False
    for col, (name, frame) in enumerate(frames.items(), start=1):
        if frame is None or frame.filter(pl.col("layer").is_not_null()).is_empty():
            _missing(fig, col, missing)
            continue
        frame = _ordered(frame.filter(pl.col("layer").is_not_null() & pl.col(column).is_not_null()))
        # a name seen in both passes (autograd op ranges) gets the pass, so bars do not overlap
        twice = pl.col("layer").count().over("layer") > 1
        frame = frame.with_columns(label=pl.when(twice).then(pl.format("{} ({})", "layer", pl.col("pass")
                                                                          .fill_null("no pass")))
                                   .otherwise(pl.col("layer")))
        order = frame["label"].to_list()
        for library, part in frame.group_by("library", maintain_order=True):
            lib = library[0] or "other"
            fig.add_bar(x=part["label"].to_list(), y=(part[column] * 100).to_list(), name=lib, legendgroup=lib,
                        marker_color=_library_colour(lib, extra), showlegend=lib not in shown, row=1, col=col,
                        customdata=part.select("pass", "total_ns").with_columns(pl.col("total_ns") / MS).rows(),
                        hovertemplate="%{x} (%{customdata[0]}, %{customdata[1]:.3f} ms): %{y:.1f} %"
                                      f"<extra>{lib}</extra>")
            shown.add(lib)
        if marker and marker in frame.columns and frame[marker].is_not_null().any():
            fig.add_scatter(x=frame["label"].to_list(), y=(frame[marker] * 100).to_list(), mode="markers",
                            name=marker_name,
                            legendgroup=marker, showlegend=not marker_shown, row=1, col=col,
                            marker=dict(symbol="diamond", size=7, color="black"),
                            hovertemplate=f"%{{x}}: {marker_name} %{{y:.1f}} %<extra></extra>")
            marker_shown = True
        fig.update_xaxes(categoryorder="array", categoryarray=order, tickangle=-60, row=1, col=col)
    _finish(fig, title, "layer (execution order)", y_title, len(frames), barmode="overlay")
    return Chart(key, fig, caption)


def ru_chart(ru: Frames) -> Chart:
    """The paper's figures 9 to 12: resource utilization per layer, coloured by library.

    Frames: `efficiency.ru_table(by='layer')` (ru, paper_ru fractions; library: the dominant
    one), optionally with `first_ns` for execution order.
    """
    caption = ("Resource utilization (launched blocks over the block slots of the waves the launch needed, "
               "kernel-time-weighted) per layer, bars coloured by the layer's dominant library and diamonds "
               "for the paper's registers-only estimate; look for layers well below 100 %, whose grids leave SMs "
               "idle (the paper found cuBLAS convolutions near 47 %).")
    return _efficiency_chart(ru, "ru", "Resource utilization per layer (paper figures 9 to 12)",
                             "RU (% of block slots)", "ru", "paper_ru", "paper RU (eq. 10, registers only)",
                             caption, "no launch shapes")


def ce_chart(ce: Frames) -> Chart:
    """The paper's figures 7 and 8: compute efficiency per layer, coloured by library.

    Frames: `efficiency.ce_table(by='layer')` (ce_fp32, ce_tensor fractions), with `library`
    (dominant, joined from the RU frame) and optionally `first_ns`.
    """
    caption = ("Compute efficiency (achieved FLOP/s over the paper's FP32 peak of 2 x clock x cores; diamonds: "
               "over the tensor-core peak) per layer with known FLOPs; look for convolutions well above fully "
               "connected layers (the paper: 1.94x) and for one library beating another on the same layer.")
    frames = {n: (f.with_columns(pl.lit(None, pl.String).alias("library")) if f is not None and "library" not in
                  f.columns else f) for n, f in ce.items()}
    return _efficiency_chart(frames, "ce", "Compute efficiency per layer (paper figures 7 and 8)",
                             "CE (% of FP32 peak)", "ce_fp32", "ce_tensor", "CE vs tensor-core peak",
                             caption, "no FLOPs: the trace has no shapes")


def _short(text: str | None, width: int = 52) -> str:
    if text is None:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"


def top_table_chart(tops: Frames, where: Mapping[str, str]) -> Chart:
    """The paper's table 3: the longest kernel launches with their layer.

    Frames: rank, layer, pass, short_name, library, dur_ns (the longest launches of one
    iteration, from `layers.attributed_kernels`); `where` says what each covers ('iteration 0').
    """
    names = list(tops)
    fig = make_subplots(rows=1, cols=max(len(names), 1), horizontal_spacing=0.02,
                        specs=[[{"type": "table"}] * max(len(names), 1)],
                        subplot_titles=[f"{n}: {where.get(n, '')}" for n in names])
    rows = 0
    for col, (name, frame) in enumerate(tops.items(), start=1):
        frame = frame if frame is not None else pl.DataFrame()
        rows = max(rows, frame.height)
        longest = max((len(x) for x in frame["layer"].drop_nulls()), default=5) if frame.height else 5
        layer_width = min(max(50, 7 * longest), 110 if len(names) > 1 else 220)
        function_width = (440 if len(names) > 1 else 880) - layer_width
        cells = [frame["rank"].to_list() if frame.height else [],
                 [("" if layer is None else layer) for layer in frame["layer"]] if frame.height else [],
                 [_short(n, int(function_width / 6.8)) for n in frame["short_name"]] if frame.height else [],
                 [lib or "" for lib in frame["library"]] if frame.height else [],
                 [f"{v / MS:.3f}" for v in frame["dur_ns"]] if frame.height else []]
        fig.add_trace(go.Table(
            columnwidth=[28, layer_width, function_width, 90, 60],
            header=dict(values=["#", "layer", "function (kernel)", "library", "time (ms)"],
                        fill_color="#e8e8e8", align="left", font=dict(size=12)),
            cells=dict(values=cells, align=["right", "left", "left", "left", "right"], height=24,
                       font=dict(size=11))), row=1, col=col)
    title = "Longest kernel launches with their layer (paper table 3)"
    fig.update_layout(title=dict(text=title, x=0.0, xanchor="left"), height=140 + 25 * (rows + 1),
                      margin=dict(l=20, r=20, t=90, b=20), template="plotly_white")
    caption = ("The longest single kernel launches of one iteration with the layer that launched them (a 'b' "
               "prefix is the backward pass), times in ms; look for which layers and which kinds of kernel "
               "(convolution, GEMM, pooling) hold the top of the list.")
    return Chart("top", fig, caption)


def _memory_label(layer: str | None, pass_: str | None, where: str) -> str:
    if layer is None:
        return f"({where})"
    return layer if pass_ in (None, "forward") or layer.startswith("b") else f"{layer} ({pass_})"


def memory_layer_chart(memory: Frames, hints: Mapping[str, str]) -> Chart:
    """The paper's figures 13 to 16: device memory allocated in each layer, with its share.

    Frames: `memory.memory_by_layer`, optionally with `first_ns` for network order (layers
    first, then memory outside them); None where the trace has no memory events (`hints`
    gives the text shown instead).
    """
    fig = _panels(memory)
    for col, (name, frame) in enumerate(memory.items(), start=1):
        if frame is None or frame.is_empty():
            _missing(fig, col, hints.get(name, "no memory events"))
            continue
        if "first_ns" in frame.columns:
            frame = frame.sort(pl.col("layer").is_null(), "first_ns", "where", nulls_last=True)
        labels = [_memory_label(r["layer"], r["pass"], r["where"]) + (f" · GPU {r['device_id']}"
                  if frame["device_id"].n_unique() > 1 else "") for r in frame.iter_rows(named=True)]
        colours = [PASS_COLOURS.get(p or "", NO_LAYER) if layer is not None else NO_LAYER
                   for layer, p in frame.select("layer", "pass").iter_rows()]
        fig.add_bar(x=labels, y=(frame["alloc_bytes"] / MIB).to_list(), marker_color=colours, showlegend=False,
                    row=1, col=col,
                    text=[f"{v:.2f} %" for v in frame["share_of_device_pct"].fill_null(0)], textposition="outside",
                    customdata=frame.select("allocs", "frees").rows(),
                    hovertemplate="%{x}: %{y:.1f} MiB in %{customdata[0]} allocations, %{customdata[1]} frees, "
                                  "%{text} of device memory<extra></extra>")
        fig.update_xaxes(tickangle=-45, row=1, col=col)
    _finish(fig, "GPU memory allocated per layer (paper figures 13 to 16)", "layer (network order)",
            "allocated device memory (MiB)", len(memory))
    caption = ("Device memory allocated by the CUDA calls made inside each layer range, labelled with its share "
               "of the GPU's memory; look for the layers that hold the most (the paper: the first convolutions and "
               "fc6, each under 20 %), and note that memory already allocated when the capture began, or kept by a "
               "caching allocator, shows as '(before capture)'.")
    return Chart("memory-layers", fig, caption)


def memory_timeline_chart(timelines: Frames, spans: Mapping[str, tuple[int, int]],
                          device_memory: Mapping[str, int | None], hints: Mapping[str, str]) -> Chart:
    """Device memory in use over time, one line per trace and device.

    Frames: `memory.memory_timeline`; `spans` gives each trace's (start_ns, end_ns) so the
    line runs to the end of the trace.
    """
    fig = go.Figure()
    notes = []
    for i, (name, frame) in enumerate(timelines.items()):
        if frame is None or frame.is_empty():
            notes.append(f"{name}: {hints.get(name, 'no memory events')}")
            continue
        colour = qualitative.Plotly[i % len(qualitative.Plotly)]
        devices = frame["device_id"].unique(maintain_order=True).to_list()
        for device in devices:
            part = frame.filter(pl.col("device_id").eq_missing(device))
            x = (part["ts_ns"] / MS).to_list()
            y = (part["bytes_in_use"] / GIB).to_list()
            end = spans.get(name, (0, 0))[1]
            if end and end / MS > x[-1]:
                x.append(end / MS)
                y.append(y[-1])
            label = name + (f" · GPU {device}" if len(devices) > 1 else "")
            fig.add_scatter(x=x, y=y, mode="lines", line_shape="hv", name=label, line=dict(color=colour, width=2),
                            hovertemplate="%{x:.3f} ms: %{y:.3f} GiB<extra>" + label + "</extra>")
            peak = part["bytes_in_use"].arg_max()
            if peak is not None:
                device_bytes = device_memory.get(name)
                share = f" ({100 * part['bytes_in_use'][peak] / device_bytes:.1f} % of the GPU)" if device_bytes else ""
                fig.add_scatter(x=[part["ts_ns"][peak] / MS], y=[part["bytes_in_use"][peak] / GIB], mode="markers+text",
                                marker=dict(color=colour, size=9, symbol="triangle-down"), showlegend=False,
                                text=[f"peak {part['bytes_in_use'][peak] / GIB:.2f} GiB{share}"],
                                textposition="top right", hoverinfo="skip")
    for j, note in enumerate(notes):
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0.5, y=0.5 - 0.08 * j, showarrow=False,
                           font=dict(size=13, color="#555"))
    fig.update_layout(title=dict(text="GPU memory in use over time", x=0.0, xanchor="left"), height=380,
                      template="plotly_white", margin=dict(l=80, r=30, t=70, b=60),
                      xaxis_title="time since the profiling session began (ms)",
                      yaxis_title="device memory in use (GiB)", yaxis_rangemode="tozero")
    caption = ("Bytes of device memory allocated through the CUDA driver over time, with the peak marked; look "
               "for steady growth across iterations (a leak) and for how close the peak comes to the GPU's memory.")
    return Chart("memory-timeline", fig, caption)


def library_chart(libraries: Frames, iterations: Mapping[str, int]) -> Chart:
    """GPU time per library, the traces side by side as coloured bars.

    Frames: `layers.library_times`; `iterations` divides the totals.
    """
    fig = go.Figure()
    order: list[str] = []
    for frame in libraries.values():
        if frame is not None:
            order += [lib or "other" for lib in frame["library"] if (lib or "other") not in order]
    for i, (name, frame) in enumerate(libraries.items()):
        if frame is None:
            continue
        per = max(iterations.get(name, 1), 1)
        values = {(lib or "other"): ns for lib, ns in frame.select("library", "total_ns").iter_rows()}
        pct = {(lib or "other"): p for lib, p in frame.select("library", "pct").iter_rows()}
        fig.add_bar(y=order, x=[values.get(lib, 0) / per / MS for lib in order], orientation="h", name=name,
                    marker_color=qualitative.Plotly[i % len(qualitative.Plotly)],
                    text=[f"{pct[lib]:.1f} %" if lib in pct else "" for lib in order], textposition="outside",
                    hovertemplate="%{y}: %{x:.3f} ms per iteration (%{text} of kernel time)<extra>" + name + "</extra>")
    fig.update_layout(title=dict(text="GPU time per library", x=0.0, xanchor="left"), barmode="group",
                      height=max(260, 110 + 38 * len(order) * max(len(libraries), 1) // 2 + 40 * len(order) // 2),
                      template="plotly_white", margin=dict(l=120, r=60, t=70, b=60),
                      xaxis_title="kernel time per iteration (ms)", yaxis_title="library",
                      yaxis=dict(autorange="reversed"), showlegend=True)
    caption = ("Kernel time of each library per iteration, with its share of all kernel time; look for the library "
               "that dominates and, between traces, for work moving from one library to another (cuDNN "
               "convolutions becoming cuBLAS GEMMs plus ATen im2col when cuDNN is off).")
    return Chart("libraries", fig, caption)


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
    for (tid,), part in nvtx.sort("tid", "start_ns", pl.col("end_ns"), descending=[False, False, True]) \
            .group_by("tid", maintain_order=True):
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
    (row, key, start_ns, end_ns, kernels, busy_ns, short_name, layer, dur_ns): bars thinner than
    a pixel would not show, and the file stays small."""
    prev_end = pl.col("end_ns").cum_max().shift(1).over("row")
    new = ((pl.col("key") != pl.col("key").shift(1).over("row")).fill_null(True)
           | ((pl.col("start_ns") - prev_end) > tolerance_ns).fill_null(True))
    return (frame.sort("row", "start_ns").with_columns(new=new)
            .with_columns(run=pl.col("new").cast(pl.Int64).cum_sum().over("row"))
            .group_by("row", "run", maintain_order=True)
            .agg(pl.col("key").first(), pl.col("start_ns").min(), pl.col("end_ns").max(),
                 kernels=pl.len(), busy_ns=pl.col("dur_ns").sum(), short_name=pl.col("short_name").first(),
                 layer=pl.col("layer").first(), dur_ns=pl.col("dur_ns").first()))


def _bar_text(r: dict[str, object]) -> str:
    layer = r["layer"] or "no layer"
    if r["kernels"] == 1:
        return f"{r['short_name']} ({layer}): {r['dur_ns'] / 1e3:.1f} µs"  # type: ignore[operator]
    return (f"{layer}: {r['kernels']} kernels, {r['busy_ns'] / MS:.3f} ms busy in "  # type: ignore[operator]
            f"{(r['end_ns'] - r['start_ns']) / MS:.3f} ms")  # type: ignore[operator]


def timeline_chart(kernels: Frames, nvtx: Frames, notes: Mapping[str, str]) -> Chart:
    """A GPU timeline: kernels per device and stream coloured by layer, NVTX ranges above.

    Frames: kernels (start_ns, end_ns, dur_ns, device_id, stream_id, layer, pass, short_name)
    and NVTX ranges (start_ns, end_ns, tid, name[, thread]) of the window to draw, one panel
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
        panels.append((name, t0, t1, forward, nvtx_rows, [lb for lb, _ in nvtx_rows] + gpu_rows, bars))

    row_px = [28 * len(p[5]) + 30 for p in panels] or [60]
    gap_px, top_px, bottom_px = 110, 100, 60
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
                x, y, t = _segments([(it.start_ns - t0) / MS for it in items], [(it.end_ns - t0) / MS for it in items],
                                    [r] * len(items), [f"{it.name}: {(it.end_ns - it.start_ns) / MS:.3f} ms" for it in items])
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
    fig.update_layout(title=dict(text="GPU timeline: kernels per device and stream, NVTX ranges above", x=0.0,
                                 xanchor="left"),
                      height=top_px + plot_px + bottom_px, template="plotly_white",
                      margin=dict(l=190, r=30, t=top_px, b=bottom_px), hovermode="closest",
                      legend=dict(title="layer"))
    caption = ("Kernels as bars on their device and stream, coloured by layer (backward ranges share their "
               "forward layer's colour), under the NVTX ranges of each CPU thread (CPU time, so launches lead "
               "the GPU); look for gaps between kernels and for layers whose kernels crowd one stream. Only one "
               "iteration is drawn, kernels closer than a pixel are merged into one bar and NVTX ranges shorter than "
               "a pixel are left out, to keep the file small.")
    return Chart("timeline", fig, caption)
