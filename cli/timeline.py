"""Commands about when the GPU worked and why it waited: idle, launches, stats, advise."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from traceq.analysis.choices import IdleBy, StatsReport
from traceq.api import Trace
from traceq.cli.base import (
    DatasetOpt,
    DbOpt,
    FormatOpt,
    IterOpt,
    OutOpt,
    TraceOpt,
    _emit,
    _show_trace_table,
    _store,
    _terminal_width,
    _working,
    app,
    example,
    user_errors,
)
from traceq.render import Format, format_for, render


@app.command(epilog=example('traceq idle -t badloop_mlp', 'traceq idle --by iteration -t badloop_mlp'))
def idle(
    by: Annotated[Optional[IdleBy], typer.Option(
        help="Split each cause's time by iteration (and device), stream, or layer of the work that waited "
             "[default: one row per cause]", show_default=False)] = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Why the GPU was idle: every gap classified by what the host was doing (sync, copy, launch-bound, ...)."""
    from traceq.units import format_duration

    def build(t: Trace):
        frame = t.idle(by, iteration_regex=iteration_regex)
        totals = t.idle_totals(iteration_regex=iteration_regex)
        share = f" ({100 * totals.idle_ns / totals.span_ns:.1f} %)" if totals.span_ns else ""
        title = (f"{t.name}: GPU idle {format_duration(totals.idle_ns)} of {format_duration(totals.span_ns)}"
                 f"{share} on {totals.devices} device(s)")
        if totals.iterations:
            title += f", {format_duration(totals.per_iteration_ns)} per iteration ({totals.iterations})"
        return frame, f"{title}; by cause" + (f" and {by.value}" if by is not None else "")

    _show_trace_table(trace, db, dataset, fmt, out, build)


@app.command(epilog=example('traceq launches -t badloop_mlp -k 5'))
def launches(
    k: Annotated[Optional[int], typer.Option("--k", "-k", min=1, help="Show only the k rows with most launch time")] = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Launch overhead per kernel: launch call time, queue delay and kernel time, and the tiny kernels."""
    from traceq.units import format_duration

    def build(t: Trace):
        totals = t.launch_totals()
        title = (f"{t.name}: {totals['launches']:,} launches, {format_duration(totals['api_ns'])} in launch calls "
                 f"for {format_duration(totals['kernel_ns'])} of kernels; {totals['tiny']:,} tiny "
                 f"({totals['tiny_pct']:.1f} %: the kernel ran shorter than its launch call)")
        return t.launches(k=k), title

    _show_trace_table(trace, db, dataset, fmt, out, build)


@app.command(epilog=example('traceq stats --report cuda_gpu_kern_sum -t lenet_b256_cudnn'))
def stats(
    report: Annotated[StatsReport, typer.Option("--report", "-r", help="Which `nsys stats` report",
                                                show_default=False)],
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """An `nsys stats` report from the store: the same rows and numbers (docs/stats.md)."""
    # cuda_kern_exec_sum's rows are five columns wide before its first number: a narrow table cuts
    # their text to keep the launch count and mean total time
    _show_trace_table(trace, db, dataset, fmt, out, lambda t: (
        t.stats(report), f"{t.name}: {report.value} (as `nsys stats --report {report.value}`)"),
        priorities={"count": 1, "total_avg_ns": 1} if report is StatsReport.cuda_kern_exec_sum else None)


@app.command(epilog=example('traceq advise -t badloop_mlp'))
def advise(
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """What to change first: findings ranked by GPU time at stake, with evidence and the usual fix."""
    from traceq.render.findings import render_findings
    from traceq.units import format_duration

    with user_errors():
        t = _store(db, dataset).trace(trace)
        with _working(t.name):
            frame = t.advise(iteration_regex=iteration_regex)
            totals = t.idle_totals(iteration_regex=iteration_regex)
        title = (f"{t.name}: {len(frame)} finding(s), by GPU time at stake (of "
                 f"{format_duration(totals.span_ns)} on {totals.devices} device(s))")
        fmt = format_for(fmt, out)
        text = (render_findings(frame, title=title, width=_terminal_width()) if fmt is Format.table
                else render(frame, fmt, title=title))
        _emit(text, out)
