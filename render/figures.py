"""Plotly figures for `traceq report`, one function per figure, built from analysis frames.

Every function takes a mapping {trace name: frame} in display order (None where the trace
lacks the data: that trace's panel then says so) and returns a `Chart`: the figure, with a
title and axis labels carrying units, and a one-sentence caption saying what to look for.
With two or more traces the panels sit side by side (one column per trace, shared y axis) or
the trace is a dimension of the plot (colour). Figures never read the store.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass

import plotly.graph_objects as go
import polars as pl
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from traceq.render.columns import VALUE_LABELS
from traceq.render.table import cut_middle
from traceq.units import format_bytes

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


def library_colour(library: str | None, extra: dict[str, str]) -> str:
    name = library or "other"
    if name not in LIBRARY_COLOURS and name not in extra:
        extra[name] = qualitative.Dark24[len(extra) % len(qualitative.Dark24)]
    return LIBRARY_COLOURS.get(name) or extra[name]


def panels(frames: Frames, *, shared_y: bool = True, height: int = 460) -> go.Figure:
    """One column per trace, titled with the trace name."""
    names = list(frames)
    fig = make_subplots(rows=1, cols=max(len(names), 1), shared_yaxes=shared_y,
                        subplot_titles=names if len(names) > 1 else None, horizontal_spacing=0.05)
    fig.update_layout(height=height)
    return fig


def finish(fig: go.Figure, title: str, x_title: str, y_title: str, columns: int, **layout: object) -> go.Figure:
    """Axis titles, the figure's title, template and margins (a bottom margin that
    `label_every_category` widened for its labels is kept)."""
    for col in range(1, columns + 1):
        fig.update_xaxes(title_text=x_title, row=1, col=col)
    fig.update_yaxes(title_text=y_title, row=1, col=1)
    bottom = max(80, int(fig.layout.margin.b or 0))
    fig.update_layout(title=dict(text=title, x=0.0, xanchor="left"), template="plotly_white",
                      margin=dict(l=80, r=30, t=90, b=bottom), font=dict(size=12), **layout)
    return fig


REPORT_WIDTH_PX = 1300
"""About how wide a report figure's plotting area is (the page is at most 1400 pixels)."""
REPORT_CHARACTERS = REPORT_WIDTH_PX // 9
"""About how many characters of 12-pixel text that holds."""


def panel_note(fig: go.Figure, panel: int, text: str, *, middle: bool = True) -> None:
    """Write `text` inside subplot `panel` (1, 2, ...), wrapped to its width: in its middle (a
    trace that lacks the data) or at its top left. Placed on the page by the panel's domain,
    which exists whether or not the panel has data (axes of an empty panel are not drawn)."""
    suffix = "" if panel == 1 else str(panel)
    left, right = fig.layout[f"xaxis{suffix}"].domain or (0.0, 1.0)
    bottom, top = fig.layout[f"yaxis{suffix}"].domain or (0.0, 1.0)
    lines = textwrap.wrap(text, max(24, int((right - left) * REPORT_CHARACTERS)))
    fig.add_annotation(text="<br>".join(html.escape(line) for line in lines), xref="paper", yref="paper",
                       x=(left + right) / 2 if middle else left + 0.01, y=(bottom + top) / 2 if middle else top,
                       xanchor="center" if middle else "left", yanchor="middle" if middle else "top",
                       align="center" if middle else "left", showarrow=False,
                       font=dict(size=12, color="#555"), bgcolor="rgba(255, 255, 255, 0.85)")


NARROW_PLOT_PX = 940
"""About how wide the plot areas of a figure with a legend are, all panels together, on the
narrowest page a report is read on (a 1280 px window)."""
PLOT_PX = 300
"""How high a figure's plot area is meant to be, whatever its labels take below it."""
TICK_CHARACTERS = 28
"""Category labels longer than this are shortened in the middle (in full on hover)."""


def label_every_category(fig: go.Figure, categories: list[str], col: int, columns: int) -> None:
    """Write every category under panel `col`'s x axis (plotly skips some when they crowd, and a
    bar without its name means nothing), the font as large as the panel's width allows, names
    longer than TICK_CHARACTERS shortened in the middle. The figure grows by the depth of its
    labels, so that its plot area keeps PLOT_PX however long they are."""
    room = NARROW_PLOT_PX * (1 - 0.05 * (columns - 1)) / max(columns, 1) / max(len(categories), 1)  # px each
    size = max(7, min(12, int(room * 0.7)))
    angle = -60 if room >= 22 else -90
    text = [cut_middle(c, TICK_CHARACTERS) for c in categories]
    fig.update_xaxes(tickmode="array", tickvals=categories, ticktext=text, tickfont=dict(size=size),
                     tickangle=angle, row=1, col=col)
    longest = max((len(t) for t in text), default=0)
    depth = int(longest * size * 0.62 * (0.87 if angle == -60 else 1.0)) + 60  # the labels and the axis title
    bottom = max(depth, int(fig.layout.margin.b or 0))
    fig.update_layout(margin=dict(b=bottom), height=max(int(fig.layout.height or 0), PLOT_PX + 90 + bottom))


def share_y_if_comparable(fig: go.Figure, maxima: list[float]) -> None:
    """Side-by-side panels keep one y axis, which compares them at a glance, while their largest
    values are within 10x of each other (the smaller's bars keep a tenth of the height); beyond,
    each gets its own, or a small trace's bars would vanish beside a large one's."""
    known = [m for m in maxima if m > 0]
    if len(known) > 1 and max(known) > 10 * min(known):
        for col in range(2, len(maxima) + 1):
            fig.update_yaxes(matches=None, showticklabels=True, row=1, col=col)


def iteration_label(iteration: str | None, device: int | None, devices: int) -> str:
    label = iteration if iteration is not None else "outside iterations"
    return f"{label} · GPU {device}" if devices > 1 else label


def stage_chart(stages: Frames) -> Chart:
    """The paper's figure 4: GPU time per iteration in each training stage, and idle time.

    Frames: `layers.stage_times`.
    """
    fig = panels(stages)
    tallest = []
    for col, (name, frame) in enumerate(stages.items(), start=1):
        tallest.append(0.0)
        if frame is None or frame.is_empty():
            panel_note(fig, col, "no GPU activity")
            continue
        devices = frame["device_id"].n_unique()
        x = [iteration_label(i, d, devices) for i, d in frame.select("iteration", "device_id").iter_rows()]
        tallest[-1] = float(frame.select(pl.sum_horizontal(f"{s}_ns" for s in STAGE_COLOURS)).max().item()) / MS
        for stage, colour in STAGE_COLOURS.items():
            y = (frame[f"{stage}_ns"] / MS).to_list()
            if stage != "idle" and sum(y) == 0.0:
                continue
            label = VALUE_LABELS.get(stage, stage)
            fig.add_bar(x=x, y=y, name=label, marker_color=colour, legendgroup=stage,
                        showlegend=col == 1, row=1, col=col,
                        hovertemplate=f"{label}: %{{y:.3f}} ms<extra>%{{x}}</extra>")
    share_y_if_comparable(fig, tallest)
    finish(fig, "Stage breakdown per iteration (paper figure 4)", "iteration", "GPU time (ms)", len(stages),
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
    fig = panels(layers)
    tallest = []
    for col, (name, frame) in enumerate(layers.items(), start=1):
        tallest.append(0.0)
        if frame is None or frame.filter(pl.col("layer").is_not_null()).is_empty():
            panel_note(fig, col, "no NVTX layer ranges")
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
            y = [values.get(b, 0) / per / MS for b in order]
            tallest[-1] = max([tallest[-1], *y])
            fig.add_bar(x=order, y=y, name=pass_, marker_color=colour,
                        legendgroup=pass_, showlegend=col == 1, row=1, col=col,
                        hovertemplate=f"{pass_}: %{{y:.3f}} ms<extra>%{{x}}</extra>")
        label_every_category(fig, order, col, len(layers))
    share_y_if_comparable(fig, tallest)
    finish(fig, "Forward and backward time per layer (paper figure 6)", "layer (network order)",
            "GPU time per iteration (ms)", len(layers), barmode="group")
    caption = ("Forward and backward GPU time of each NVTX layer (a backward range 'bconv1' is drawn at conv1; "
               "kernels launched outside every layer range are the last group), averaged over the iterations; "
               "look for the convolution layers dominating and for layers whose backward pass costs far more "
               "than twice their forward pass.")
    return Chart("layer-time", fig, caption)


def _efficiency_chart(frames: Frames, key: str, title: str, y_title: str, column: str, marker: str | None,
                      marker_name: str, caption: str, missing: str, notes: Mapping[str, str] | None,
                      detail: str | None = None) -> Chart:
    """Bars of `column` (fractions, drawn as %) per layer, coloured by library; `marker` as
    diamonds; `detail`, a text column shown on hover."""
    fig = panels(frames)
    extra: dict[str, str] = {}
    shown: set[str] = set()
    marker_shown = False
    for col, (name, frame) in enumerate(frames.items(), start=1):
        if frame is None or frame.filter(pl.col("layer").is_not_null()).is_empty():
            panel_note(fig, col, (notes or {}).get(name, missing))
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
            shown_detail = pl.col(detail).fill_null("") if detail else pl.lit("")
            fig.add_bar(x=part["label"].to_list(), y=(part[column] * 100).to_list(), name=lib, legendgroup=lib,
                        marker_color=library_colour(lib, extra), showlegend=lib not in shown, row=1, col=col,
                        customdata=part.select("pass", pl.col("total_ns") / MS, shown_detail).rows(),
                        hovertemplate="%{x} (%{customdata[0]}, %{customdata[1]:.3f} ms): %{y:.1f} %"
                                      + (f" {detail}: %{{customdata[2]}}" if detail else "") + f"<extra>{lib}</extra>")
            shown.add(lib)
        if marker and marker in frame.columns and frame[marker].is_not_null().any():
            fig.add_scatter(x=frame["label"].to_list(), y=(frame[marker] * 100).to_list(), mode="markers",
                            name=marker_name,
                            legendgroup=marker, showlegend=not marker_shown, row=1, col=col,
                            marker=dict(symbol="diamond", size=7, color="black"),
                            hovertemplate=f"%{{x}}: {marker_name} %{{y:.1f}} %<extra></extra>")
            marker_shown = True
        fig.update_xaxes(categoryorder="array", categoryarray=order, row=1, col=col)
        label_every_category(fig, order, col, len(frames))
    finish(fig, title, "layer (execution order)", y_title, len(frames), barmode="overlay")
    return Chart(key, fig, caption)


def ru_chart(ru: Frames, notes: Mapping[str, str] | None = None) -> Chart:
    """The paper's figures 9 to 12: resource utilization per layer, coloured by library.

    Frames: `efficiency.ru_table(by='layer')` (ru, paper_ru fractions; library: the dominant
    one), optionally with `first_ns` for execution order; `notes`: why a trace has no frame.
    """
    caption = ("Resource utilization (launched blocks over the block slots of the waves the launch needed, "
               "kernel-time-weighted) per layer, bars coloured by the layer's dominant library and diamonds "
               "for the paper's registers-only estimate; look for layers well below 100 %, whose grids leave SMs "
               "idle (the paper found cuBLAS convolutions near 47 %).")
    return _efficiency_chart(ru, "ru", "Resource utilization per layer (paper figures 9 to 12)",
                             "RU (% of block slots)", "ru", "paper_ru", "paper RU (eq. 10, registers only)",
                             caption, "no launch shapes", notes)


def ce_chart(ce: Frames, notes: Mapping[str, str] | None = None) -> Chart:
    """The paper's figures 7 and 8: compute efficiency per layer, coloured by library.

    Frames: `efficiency.ce_table(by='layer')` (ce: fractions of the peak of each layer's
    precision, precision), with `library` (dominant, joined from the RU frame) and optionally
    `first_ns`. Every CE is against its own precision's peak, so one 0-100 % axis reads both
    TF32 tensor-core and FP32 layers.
    """
    caption = ("Compute efficiency (achieved FLOP/s over the dense peak of the precision the layer's kernels ran "
               "at: TF32 or FP16 tensor cores, or the paper's FP32 peak of 2 x clock x cores; hover for the "
               "precision) per layer with known FLOPs; look for convolutions well above fully connected layers "
               "(the paper: 1.94x) and for one library beating another on the same layer.")
    frames = {n: (f.with_columns(pl.lit(None, pl.String).alias("library")) if f is not None and "library" not in
                  f.columns else f) for n, f in ce.items()}
    chart = _efficiency_chart(frames, "ce", "Compute efficiency per layer (paper figures 7 and 8)",
                              "CE (% of the precision's peak)", "ce", None, "", caption,
                              "no FLOPs: the trace has no shapes", notes, detail="precision")
    highest = max((100 * float(f["ce"].max() or 0) for f in frames.values() if f is not None and f.height),
                  default=0.0)
    if highest >= CE_ZOOM_BELOW:
        chart.figure.update_yaxes(range=[0, 100])
    else:  # on 0-100 % the bars would be a pixel high: an empty-looking chart
        top = max(1.0, 1.25 * highest)
        chart.figure.update_yaxes(range=[0, top])
        chart.figure.update_yaxes(title_text=f"CE (% of the precision's peak; axis to {top:.2g} %)", row=1, col=1)
    return chart


CE_ZOOM_BELOW = 20.0
"""A CE figure whose every layer is under this many % of its peak gets an axis to its highest
bar (with a quarter more room), said in the axis title, instead of 0-100 %."""


def hover_name(name: str | None) -> str:
    """A kernel's full name for a hover box: HTML-escaped, in lines of at most 100 characters."""
    lines = textwrap.wrap(name or "", 100, break_on_hyphens=False, drop_whitespace=False)
    return "<br>".join(html.escape(line) for line in lines)


def stacked(count: int, row_px: list[int], gap_px: int) -> dict[str, object]:
    """make_subplots arguments for `count` panels stacked, each `row_px` high, `gap_px` apart."""
    plot_px = sum(row_px) + gap_px * (count - 1)
    return dict(rows=max(count, 1), cols=1, row_heights=row_px or None,
                vertical_spacing=gap_px / plot_px if count > 1 else 0.0)


def top_launches_chart(tops: Frames, where: Mapping[str, str]) -> Chart:
    """The paper's table 3: the longest kernel launches with their layer, as bars of their time.

    Frames: rank, layer, pass, short_name, name (demangled, shown on hover), library, dur_ns
    (the longest launches of one iteration, from `layers.attributed_kernels`); `where` says what
    each covers ('iteration 0'). One panel per trace, stacked.
    """
    names = list(tops)
    row_px = [22 * max(f.height if f is not None else 0, 3) + 30 for f in tops.values()]
    gap_px = 80
    fig = make_subplots(**stacked(len(names), row_px, gap_px),
                        subplot_titles=[f"{n}: {where.get(n, '')}" for n in names] or None)
    extra: dict[str, str] = {}
    shown: set[str] = set()
    for row, (name, frame) in enumerate(tops.items(), start=1):
        if frame is None or frame.is_empty():
            panel_note(fig, row, "no kernels")
            continue
        frame = frame.with_columns(label=pl.struct("rank", "layer", "short_name").map_elements(
            lambda r: f"{r['rank']}. {r['layer'] or 'no layer'} · {cut_middle(r['short_name'] or '', 44)}",
            return_dtype=pl.String))
        for (library,), part in frame.group_by("library", maintain_order=True):
            lib = library or "other"
            fig.add_bar(y=part["label"].to_list(), x=(part["dur_ns"] / MS).to_list(), orientation="h", name=lib,
                        legendgroup=lib, showlegend=lib not in shown, marker_color=library_colour(lib, extra),
                        customdata=[(hover_name(r["name"]), r["layer"] or "no layer", r["pass"] or "no pass")
                                    for r in part.iter_rows(named=True)],
                        hovertemplate="%{customdata[0]}<br>%{customdata[1]} (%{customdata[2]}): %{x:.3f} ms"
                                      f"<extra>{html.escape(lib)}</extra>", row=row, col=1)
            shown.add(lib)
        fig.update_yaxes(categoryorder="array", categoryarray=frame["label"].to_list(), autorange="reversed",
                         row=row, col=1)
        fig.update_xaxes(title_text="launch time (ms)", row=row, col=1)
    title = "Longest kernel launches with their layer (paper table 3)"
    fig.update_layout(title=dict(text=title, x=0.0, xanchor="left"), height=sum(row_px) + gap_px * (len(names) - 1)
                      + 160, margin=dict(l=360, r=30, t=90, b=70), template="plotly_white", barmode="overlay",
                      font=dict(size=12), legend=dict(title="library"))
    caption = ("The longest single kernel launches of one iteration, ranked, with the layer that launched them (a "
               "'b' prefix is the backward pass) and the kernel's name (in full on hover), coloured by library; "
               "look for which layers and which kinds of kernel (convolution, GEMM, pooling) hold the top of the "
               "list.")
    return Chart("top", fig, caption)


def _memory_label(layer: str | None, pass_: str | None, where: str) -> str:
    if layer is None:
        return f"({where})"
    return layer if pass_ in (None, "forward") or layer.startswith("b") else f"{layer} ({pass_})"


def _memory_note(summary: pl.DataFrame | None, before: int, measured: bool, estimated: bool) -> str:
    """What a memory-per-layer panel says beside its bars: memory allocated before the capture
    (not drawn), the peak in use, and why a panel has no bars."""
    peak = ""
    if summary is not None and summary.height:
        row = summary.sort("peak_bytes", descending=True).row(0, named=True)
        share = f" ({row['peak_pct']:.1f} % of the GPU)" if row["memory_bytes"] else ""
        peak = f" Peak in use: {format_bytes(row['peak_bytes'])}{share}."
    if measured:
        return f"Not drawn: {format_bytes(before)} allocated before the capture began.{peak}" if before else peak
    text = (f"No layer allocated device memory during the capture: the {format_bytes(before)} in use were "
            f"allocated before it began (a caching allocator such as PyTorch's was warm).{peak}")
    if not estimated:
        text += (" To see each layer's share, pass --spec MODEL.toml (estimates from the layer shapes), or capture "
                 "the first iteration or with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (measured).")
    return text


def memory_layer_chart(memory: Frames, hints: Mapping[str, str], iterations: Mapping[str, int],
                       summaries: Frames | None = None, estimates: Frames | None = None) -> Chart:
    """The paper's figures 13 to 16: device memory allocated in each layer.

    Frames: `memory.memory_by_layer`, optionally with `first_ns` for network order (layers
    first, then memory outside them); None where the trace has no memory events (`hints`
    gives the text shown instead); `iterations` divides the totals, so that a layer's bar and its
    estimate are one pass's. `summaries` (`memory.memory_summary`) give the peak in use;
    `estimates` (`modelspec.spec_activations` with a `batch` column) each layer's output size,
    drawn as markers. Memory allocated before the capture is said in the panel, not drawn: it
    would dwarf the layers, and when a caching allocator was warm it is all there is.
    """
    summaries, estimates = summaries or {}, estimates or {}
    fig = panels(memory, shared_y=False)
    estimate_shown = False
    for col, (name, frame) in enumerate(memory.items(), start=1):
        if frame is None or frame.is_empty():
            panel_note(fig, col, hints.get(name, "no memory events"))
            continue
        if "first_ns" in frame.columns:
            frame = frame.sort(pl.col("layer").is_null(), "first_ns", "where", nulls_last=True)
        before = int(frame.filter(pl.col("where") == "before capture")["alloc_bytes"].sum())
        frame = frame.filter(pl.col("where") != "before capture")
        labels = [_memory_label(r["layer"], r["pass"], r["where"]) + (f" · GPU {r['device_id']}"
                  if frame["device_id"].n_unique() > 1 else "") for r in frame.iter_rows(named=True)]
        colours = [PASS_COLOURS.get(p or "", NO_LAYER) if layer is not None else NO_LAYER
                   for layer, p in frame.select("layer", "pass").iter_rows()]
        per = max(iterations.get(name, 1), 1)
        tallest = [float(frame["alloc_bytes"].max() or 0) / per / MIB]
        if frame.height:
            fig.add_bar(x=labels, y=(frame["alloc_bytes"] / per / MIB).to_list(), marker_color=colours,
                        showlegend=False, row=1, col=col,
                        customdata=frame.select("allocs", "frees", "share_of_device_pct").rows(),
                        hovertemplate="%{x}: %{y:.1f} MiB in %{customdata[0]} allocations, %{customdata[1]} "
                                      "frees (%{customdata[2]:.2f} % of device memory)<extra></extra>")
        estimate = estimates.get(name)
        if estimate is not None and estimate.height:
            batch = estimate["batch"][0]
            fig.add_scatter(x=estimate["layer"].to_list(), y=(estimate["activation_bytes"] / MIB).to_list(),
                            mode="markers", marker=dict(symbol="diamond", size=8, color="black"),
                            name="estimated output activations (model spec)", legendgroup="estimate",
                            showlegend=not estimate_shown, row=1, col=col,
                            hovertemplate=f"%{{x}}: output of %{{y:.1f}} MiB at batch {batch} (estimate)"
                                          "<extra></extra>")
            estimate_shown = True
            labels += [x for x in estimate["layer"].to_list() if x not in labels]
            tallest.append(float(estimate["activation_bytes"].max() or 0) / MIB)
        note = _memory_note(summaries.get(name), before, frame.height > 0, estimate is not None)
        if not frame.height and estimate is None:
            panel_note(fig, col, note)
        else:
            if note:
                panel_note(fig, col, note, middle=False)
            fig.update_yaxes(range=[0, 1.35 * max(tallest)], row=1, col=col)  # room for the note
        fig.update_xaxes(categoryorder="array", categoryarray=labels, row=1, col=col)
        label_every_category(fig, labels, col, len(memory))
    finish(fig, "GPU memory allocated per layer (paper figures 13 to 16)", "layer (network order)",
            "device memory allocated per iteration (MiB)", len(memory))
    caption = ("Device memory allocated per iteration by the CUDA calls made inside each layer range (hover for its "
               "share of the GPU's memory), and with a model spec each layer's output size as diamonds; look for the "
               "layers that hold the most (the paper: the first convolutions and fc6, each under 20 %). Memory "
               "allocated before the capture began, all of it when a caching allocator was warm, is said in the "
               "panel, not drawn.")
    return Chart("memory-layers", fig, caption)


def memory_timeline_chart(timelines: Frames, spans: Mapping[str, tuple[int, int]],
                          device_memory: Mapping[str, int | None], hints: Mapping[str, str]) -> Chart:
    """Device memory in use over time, one line per trace and device.

    Frames: `memory.memory_timeline`; `spans` gives each trace's (start_ns, end_ns) so the
    line runs to the end of the trace.
    """
    fig = go.Figure()
    notes = []
    top, end_ms = 0.0, max((end for _, end in spans.values()), default=0) / MS
    for i, (name, frame) in enumerate(timelines.items()):
        if frame is None or frame.is_empty():
            notes.append(f"{name}: {hints.get(name, 'no memory events')}")
            continue
        colour = qualitative.Plotly[i % len(qualitative.Plotly)]
        devices = frame["device_id"].unique(maintain_order=True).to_list()
        for device in devices:
            part = frame.filter(pl.col("device_id").eq_missing(device))
            # the level after each instant: events at one timestamp (the allocations nsys lists at
            # time 0 for a capture that began late) happened in one moment
            level = part.group_by("ts_ns", maintain_order=True).agg(pl.col("bytes_in_use").last())
            x = (level["ts_ns"] / MS).to_list()
            y = (level["bytes_in_use"] / GIB).to_list()
            end = spans.get(name, (0, 0))[1]
            if end and end / MS > x[-1]:
                x.append(end / MS)
                y.append(y[-1])
            label = name + (f" · GPU {device}" if len(devices) > 1 else "")
            fig.add_scatter(x=x, y=y, mode="lines", line_shape="hv", name=label, line=dict(color=colour, width=2),
                            hovertemplate="%{x:.3f} ms: %{y:.3f} GiB<extra>" + html.escape(label) + "</extra>")
            peak = part["bytes_in_use"].arg_max()
            if peak is not None:
                peak_x, peak_gib = part["ts_ns"][peak] / MS, part["bytes_in_use"][peak] / GIB
                top = max(top, peak_gib)
                device_bytes = device_memory.get(name)
                share = f" ({100 * part['bytes_in_use'][peak] / device_bytes:.1f} % of the GPU)" if device_bytes else ""
                right_half = end_ms and peak_x > 0.6 * end_ms
                fig.add_scatter(x=[peak_x], y=[peak_gib], mode="markers+text",
                                marker=dict(color=colour, size=9, symbol="triangle-down"), showlegend=False,
                                text=[f"peak {peak_gib:.2f} GiB{share}"], hoverinfo="skip",
                                textposition="top left" if right_half else "top right")
    if notes:  # at the top, inside the plot, above the lines
        fig.add_annotation(text="<br>".join(html.escape(n) for n in notes), xref="paper", yref="paper", x=0.01,
                           y=1.0, xanchor="left", yanchor="top", align="left", showarrow=False,
                           font=dict(size=12, color="#555"), bgcolor="rgba(255, 255, 255, 0.85)")
    fig.update_layout(title=dict(text="GPU memory in use over time", x=0.0, xanchor="left"), height=380,
                      template="plotly_white", margin=dict(l=80, r=30, t=70, b=60),
                      xaxis_title="time since the profiling session began (ms)",
                      yaxis_title="device memory in use (GiB)", yaxis_rangemode="tozero")
    if top:
        fig.update_yaxes(range=[0, top * (1.25 + 0.1 * len(notes))])  # room for the peak labels and notes
    caption = ("Bytes of device memory allocated through the CUDA driver over time, with the peak marked; look "
               "for steady growth across iterations (a leak) and for how close the peak comes to the GPU's memory.")
    return Chart("memory-timeline", fig, caption)


def library_chart(libraries: Frames, iterations: Mapping[str, int]) -> Chart:
    """GPU time per library, the traces side by side as coloured bars.

    Frames: `layers.library_times`; `iterations` divides the totals.
    """
    fig = go.Figure()
    order: list[str] = []
    longest = 0.0
    for frame in libraries.values():
        if frame is not None:
            order += [lib or "other" for lib in frame["library"] if (lib or "other") not in order]
    for i, (name, frame) in enumerate(libraries.items()):
        if frame is None:
            continue
        per = max(iterations.get(name, 1), 1)
        values = {(lib or "other"): ns for lib, ns in frame.select("library", "total_ns").iter_rows()}
        pct = {(lib or "other"): p for lib, p in frame.select("library", "pct").iter_rows()}
        x = [values.get(lib, 0) / per / MS for lib in order]
        longest = max([longest, *x])
        fig.add_bar(y=order, x=x, orientation="h", name=html.escape(name),
                    marker_color=qualitative.Plotly[i % len(qualitative.Plotly)],
                    text=[f"{pct[lib]:.1f} %" if lib in pct else "" for lib in order], textposition="outside",
                    cliponaxis=False,
                    hovertemplate="%{y}: %{x:.3f} ms per iteration (%{text} of kernel time)<extra>"
                                  + html.escape(name) + "</extra>")
    bars = len(order) * max(sum(f is not None for f in libraries.values()), 1)
    fig.update_layout(title=dict(text="GPU time per library", x=0.0, xanchor="left"), barmode="group",
                      height=130 + max(PLOT_PX - 60, 22 * bars + 8 * len(order)),
                      template="plotly_white", margin=dict(l=120, r=60, t=70, b=60),
                      xaxis_title="kernel time per iteration (ms)", yaxis_title="library",
                      yaxis=dict(autorange="reversed"), showlegend=len(libraries) > 1,
                      legend=dict(orientation="h", x=0, y=1.0, xanchor="left", yanchor="bottom"))
    fig.update_xaxes(range=[0, 1.15 * longest if longest else 1])  # room for the share beside the longest bar
    caption = ("Kernel time of each library per iteration, with its share of all kernel time; look for the library "
               "that dominates and, between traces, for work moving from one library to another (cuDNN "
               "convolutions becoming cuBLAS GEMMs plus ATen im2col when cuDNN is off).")
    return Chart("libraries", fig, caption)
