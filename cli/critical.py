"""Commands about the critical path and what would change it: critical, whatif."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from traceq.analysis.choices import CriticalView
from traceq.cli.base import (
    DatasetOpt,
    DbOpt,
    FormatOpt,
    IterOpt,
    OutOpt,
    TraceOpt,
    _show_run_table,
    _show_trace_table,
    app,
    example,
)
from traceq.render import Format, format_for

ViewOpt = Annotated[CriticalView, typer.Option(
    help="Per iteration its time and the path's composition, the composition over all iterations "
         "(by library), the path's kernel time by layer, the longest segments, or every segment")]
RunOpt = Annotated[Optional[str], typer.Option(
    "--run", help="A run (its ranks on one clock, coupled by their collectives) instead of one trace",
    show_default=False)]


def _show(run: str | None, trace, db, dataset, fmt, out, build, view: CriticalView) -> None:
    """One trace's table, or (`run` given) the run's."""
    # a segment is its iteration, category and name; its library and layer are context, which a
    # narrow table leaves out before its duration
    layout = ({"keys": ("iteration", "category", "name"), "priorities": {"library": 3, "layer": 3, "dur_ns": 1}}
              if view in (CriticalView.longest, CriticalView.segments) else {})
    if run is None:
        _show_trace_table(trace, db, dataset, fmt, out, build, **layout)
    else:
        _show_run_table(run, db, dataset, fmt, out, lambda r, progress: build(r), **layout)


@app.command(epilog=example('traceq critical -t ddp_resnet18_2gpu'))
def critical(
    view: ViewOpt = CriticalView.iterations,
    run: RunOpt = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """The critical path of each iteration: what set its time (compute, communication, copies, host, launch, sync, idle)."""
    from traceq.units import format_duration

    def build(t):
        frame = t.critical(view.value, iteration_regex=iteration_regex)
        times = t.critical("iterations", iteration_regex=iteration_regex)["iteration_ns"]
        title = (f"{t.name}: critical path of {times.len()} iteration(s), median "
                 f"{format_duration(float(times.median() or 0))}; {view.value}")
        return frame, title

    _show(run, trace, db, dataset, fmt, out, build, view)


@app.command(epilog=example('traceq whatif --no-launch-overhead -t badloop_mlp'))
def whatif(
    scale: Annotated[Optional[list[str]], typer.Option(
        help="Kernels whose library or name matches take FACTOR x as long: 'library=cuBLAS:0.5', "
             "'kernel=gemm:0.8' (repeatable)", show_default=False)] = None,
    no_launch_overhead: Annotated[bool, typer.Option(
        "--no-launch-overhead", help="The GPU no longer waits for launches (as with CUDA graphs)")] = False,
    overlap_comm: Annotated[bool, typer.Option(
        "--overlap-comm", help="Collective kernels fully hidden behind compute")] = False,
    precision: Annotated[Optional[str], typer.Option(
        help="GEMM/convolution kernels in this precision (bf16, fp16, tf32, fp8, ...): scaled by the GPU's peak ratio",
        show_default=False)] = None,
    gpu: Annotated[Optional[str], typer.Option(
        help="On this GPU (V100, A100, H100, H200): each kernel's time at its roofline bound moves with the bound "
             "(peak FLOP/s or DRAM bandwidth), the rest with the SM clock",
        show_default=False)] = None,
    view: ViewOpt = CriticalView.iterations,
    run: RunOpt = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """What the iteration would take with a change: the dependency graph replayed (predicted time, gain, new path)."""
    from traceq.units import format_duration

    def build(t):
        frame, notes = t.whatif(scale or (), no_launch_overhead=no_launch_overhead, overlap_comm=overlap_comm,
                                precision=precision, gpu=gpu, view=view.value, iteration_regex=iteration_regex)
        table, _ = t.whatif(scale or (), no_launch_overhead=no_launch_overhead, overlap_comm=overlap_comm,
                            precision=precision, gpu=gpu, iteration_regex=iteration_regex) \
            if view is not CriticalView.iterations else (frame, notes)
        measured, predicted = table["measured_ns"].median() or 0, table["predicted_ns"].median() or 0
        title = (f"{t.name}: what if, median iteration {format_duration(float(measured))} measured, "
                 f"{format_duration(float(predicted))} predicted; {view.value}")
        if format_for(fmt, out) is not Format.table:  # csv and json carry no title: the assumptions on stderr
            for note in notes:
                typer.echo(f"traceq whatif: assuming {note}", err=True)
        return frame, title + "".join(f"\n  assuming {note}" for note in notes)

    _show(run, trace, db, dataset, fmt, out, build, view)
