"""The report's figures for a rank of a run of several: time per rank, communication hidden per
iteration, collective bus bandwidth against the link's peak, and start skew across ranks."""

from __future__ import annotations

import html
from collections.abc import Mapping

import polars as pl

from traceq.render.figures import MS, Chart, Frames, finish, panel_note, panels

RANK_COLOURS = {"compute": "#1f77b4", "hidden comm": "#9467bd", "exposed comm": "#d62728",
                "memory only": "#8c6d31", "idle": "#d9d9d9"}
COLLECTIVE_COLOURS = {"all_reduce": "#1f77b4", "reduce_scatter": "#ff7f0e", "all_gather": "#2ca02c",
                      "broadcast": "#9467bd", "reduce": "#8c564b", "all_to_all": "#e377c2", "send_recv": "#7f7f7f"}
ONE_RANK = "one rank: nothing to compare"



def rank_time_chart(overlaps: Frames) -> Chart:
    """Per rank, the mean iteration split into computation alone, communication hidden under
    it, exposed communication, memory operations alone and idle time (stacked to the span).

    Frames: `overlap.overlap_table` (rows outside iterations left out), None for a one-rank run.
    """
    fig = panels(overlaps)
    for col, (name, frame) in enumerate(overlaps.items(), start=1):
        frame = None if frame is None else frame.filter(pl.col("iteration").is_not_null())
        if frame is None or frame.is_empty():
            panel_note(fig, col, ONE_RANK if frame is None else "no iteration ranges")
            continue
        mean = frame.group_by("rank").agg(pl.exclude("iteration", "hidden_pct").mean()).sort("rank")
        parts = {"compute": mean["compute_ns"] - mean["overlap_ns"], "hidden comm": mean["overlap_ns"],
                 "exposed comm": mean["exposed_ns"],
                 "memory only": mean["span_ns"] - mean["idle_ns"] - mean["compute_ns"] - mean["exposed_ns"],
                 "idle": mean["idle_ns"]}
        x = [f"rank {r}" for r in mean["rank"]]
        for part, values in parts.items():
            fig.add_bar(x=x, y=(values / MS).to_list(), name=part, marker_color=RANK_COLOURS[part], legendgroup=part,
                        showlegend=col == 1, row=1, col=col,
                        hovertemplate=f"{part}: %{{y:.3f}} ms per iteration<extra>%{{x}}</extra>")
    finish(fig, "Time per rank and iteration", "rank", "GPU time per iteration (ms)", len(overlaps), barmode="stack")
    caption = ("Each bar is one rank's mean iteration: computation, communication hidden under it, communication "
               "the rank waited for (exposed), memory copies alone and idle time. Look for exposed communication "
               "on every rank (the step waits on the network) and for one rank with less of it than the others: "
               "the others waited for that rank, the straggler.")
    return Chart("rank-time", fig, caption)


def overlap_chart(overlaps: Frames) -> Chart:
    """Per iteration, the share of each rank's communication hidden under computation.

    Frames: `overlap.overlap_table`, None for a one-rank run.
    """
    fig = panels(overlaps)
    for col, (name, frame) in enumerate(overlaps.items(), start=1):
        frame = None if frame is None else frame.filter(pl.col("iteration").is_not_null() & (pl.col("comm_ns") > 0))
        if frame is None or frame.is_empty():
            panel_note(fig, col, ONE_RANK if frame is None else "no communication in iterations")
            continue
        if frame["iteration"].n_unique() == 1:  # one iteration: a bar per rank, not a column of dots
            fig.add_bar(x=[f"rank {r}" for r in frame["rank"]], y=frame["hidden_pct"].to_list(),
                        name="hidden", marker_color="#9467bd", showlegend=False, row=1, col=col,
                        customdata=(frame["exposed_ns"] / MS).to_list(),
                        hovertemplate="%{x}: %{y:.1f} % hidden, %{customdata:.3f} ms exposed<extra>"
                                      + html.escape(str(frame["iteration"][0])) + "</extra>")
            fig.update_xaxes(title_text=f"rank ({frame['iteration'][0]}, the only iteration)", row=1, col=col)
            continue
        for rank, ranked in frame.partition_by("rank", as_dict=True, maintain_order=True).items():
            fig.add_scatter(x=ranked["iteration"].to_list(), y=ranked["hidden_pct"].to_list(), mode="lines+markers",
                            name=f"rank {rank[0]}", legendgroup=f"rank {rank[0]}", showlegend=col == 1,
                            line=dict(width=1), marker=dict(size=6), row=1, col=col,
                            customdata=(ranked["exposed_ns"] / MS).to_list(),
                            hovertemplate=f"rank {rank[0]}: %{{y:.1f}} % hidden, %{{customdata:.3f}} ms exposed"
                                          "<extra>%{x}</extra>")
    titles = [fig.layout[f"xaxis{'' if c == 1 else c}"].title.text for c in range(1, len(overlaps) + 1)]
    finish(fig, "Communication hidden under computation per iteration", "iteration", "hidden (% of communication)",
            len(overlaps))
    for col, text in enumerate(titles, start=1):
        if text:  # a one-iteration panel's own axis title
            fig.update_xaxes(title_text=text, row=1, col=col)
    fig.update_yaxes(range=[0, 105])
    caption = ("The share of each rank's communication time during which computation also ran (HTA's "
               "computation-communication overlap). Near 100 % the network costs no step time; low shares with "
               "much communication (hover: exposed time) point at buckets too large, communication issued too "
               "late in the backward pass, or one rank making the others wait.")
    return Chart("overlap", fig, caption)


def bandwidth_chart(collectives: Frames, links: Mapping[str, tuple[str, float] | None]) -> Chart:
    """Bus bandwidth of each collective against its message size, under the link's peak.

    Frames: `comm.comm_table(by='instance')`, None for a one-rank run; `links`: per panel,
    (link description, one-direction peak in GB/s) or None where traceq does not know the GPU.
    """
    fig = panels(collectives, shared_y=True)
    fig.update_xaxes(type="log")
    for col, (name, frame) in enumerate(collectives.items(), start=1):
        sized = None if frame is None else frame.filter(pl.col("busbw_gbps").is_not_null())
        if sized is None or sized.is_empty():
            panel_note(fig, col, ONE_RANK if frame is None else "the trace records no message sizes")
            continue
        for collective, part in sized.partition_by("collective", as_dict=True, maintain_order=True).items():
            fig.add_scatter(x=part["bytes"].to_list(), y=part["busbw_gbps"].to_list(), mode="markers",
                            name=collective[0].replace("_", "-"), legendgroup=collective[0], showlegend=col == 1,
                            marker=dict(size=8, color=COLLECTIVE_COLOURS.get(collective[0], "#333")), row=1, col=col,
                            customdata=(part["time_ns"] / 1e3).to_list(),
                            hovertemplate="%{x:,} bytes in %{customdata:.1f} us: %{y:.2f} GB/s<extra></extra>")
        link = links.get(name)
        if link is not None:
            fig.add_hline(y=link[1], line=dict(color="#d62728", dash="dash"), row=1, col=col,
                          annotation_text=f"{link[0]} peak {link[1]:g} GB/s", annotation_position="top left")
    finish(fig, "Collective bus bandwidth against the link's peak", "message size (bytes)",
            "bus bandwidth (GB/s)", len(collectives))
    caption = ("Each point is one collective: its bytes, and its bus bandwidth (nccl-tests' definition, comparable "
               "with one direction of the link) on the last rank to start it, so without waiting. Small messages "
               "sit far below the dashed peak (latency bound); large ones should approach it, and a run that "
               "stays far below on large messages did not use the fast link.")
    return Chart("bandwidth", fig, caption)


def skew_chart(kernels: Frames) -> Chart:
    """How late each rank started each collective after the first rank did (a heatmap).

    Frames: `comm.collective_kernels` with `comm.with_skew`'s columns, None for a one-rank run.
    """
    fig = panels(kernels, shared_y=False)
    for col, (name, frame) in enumerate(kernels.items(), start=1):
        known = None if frame is None else frame.filter(pl.col("instance").is_not_null())
        if known is None or known.is_empty():
            panel_note(fig, col, ONE_RANK if frame is None else "no collective matched across ranks")
            continue
        order = (known.group_by("collective", "group", "instance").agg(first=pl.col("first_start_ns").min())
                 .sort("first").with_row_index("column"))
        cells = known.join(order, on=["collective", "group", "instance"], nulls_equal=True)
        ranks = sorted(cells["rank"].unique().to_list())
        z = [[None] * order.height for _ in ranks]
        for rank, column, late in cells.select("rank", "column", "late_ns").iter_rows():
            z[ranks.index(rank)][column] = late / 1e3
        labels = [f"{c.replace('_', '-')} {i}" for c, i in order.select("collective", "instance").iter_rows()]
        fig.add_heatmap(z=z, x=labels, y=[f"rank {r}" for r in ranks], colorscale="Reds", row=1, col=col,
                        colorbar=dict(title="late (us)"), showscale=col == 1,
                        hovertemplate="%{y} started %{x} %{z:.1f} us after the first rank<extra></extra>")
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    finish(fig, "Start skew: how late each rank started each collective", "collective, in start order", "rank",
            len(kernels), height=170 + max(240, 24 * max((f["rank"].n_unique() for f in kernels.values()
                                                           if f is not None), default=1)))
    caption = ("Each cell is the time between the first rank starting a collective and this rank starting it: the "
               "others waited that long. A row dark across many collectives is a straggler (`traceq ranks --by "
               "collective` names what it was doing); a dark column is a collective every rank but one reached "
               "late.")
    return Chart("skew", fig, caption)
