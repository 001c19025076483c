"""Commands that print where a trace's GPU time went and how well it used the GPU: top, layers, libs,
stages, ru, ce, traffic, memory, occupancy."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from traceq.analysis.choices import GroupBy, MeasuredBy, MemoryBy, NameBy, Precision, TrafficBy
from traceq.api import Trace
from traceq.cli.base import (
    BatchOpt,
    CcOpt,
    DatasetOpt,
    DbOpt,
    FormatOpt,
    IterOpt,
    OutOpt,
    SmsOpt,
    SpecOpt,
    TraceOpt,
    _emit,
    _show_trace_table,
    _terminal_width,
    app,
    example,
    user_errors,
)
from traceq.render import Format, format_for, render


@app.command(epilog=example('traceq top -t alexnet_b256_cudnn -k 5', 'traceq top -t alexnet_b256_cudnn --instances -f csv'))
def top(
    k: Annotated[int, typer.Option("--k", "-k", min=1, help="How many rows")] = 15,
    by: Annotated[NameBy, typer.Option(help="Group kernels by this name")] = NameBy.demangled,
    instances: Annotated[bool, typer.Option("--instances", help="The k longest single launches instead")] = False,
    context: Annotated[Optional[bool], typer.Option(
        "--context/--no-context", show_default=False,
        help="Add layer, pass and library columns [default: on up to 1M kernels; above, library only]")] = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """The heaviest kernels of a trace by total GPU time (like `nsys stats` cuda_gpu_kern_sum)."""
    from traceq.units import format_duration

    # a DuckDB relation: without polars, `traceq top` on a big trace (library column only) runs
    # in a fraction of a second
    def build(t: Trace):
        ranking = t.top_relation(k, by, instances=instances, context=context)
        if format_for(fmt, out) == Format.table:  # a row's position: '#', as 'Rank' is a process's rank elsewhere
            ranking = ranking.project('* RENAME (rank AS "position")')
        if instances:
            return ranking, f"{t.name}: the {len(ranking)} longest kernel launches"
        return ranking, (f"{t.name}: top {len(ranking)} kernels by total time "
                         f"(all kernels: {format_duration(t.kernel_time_ns())} of GPU time)")

    # a row is a kernel (a launch, with --instances: where it ran too); what it spent comes before
    # the context columns, which a narrow table leaves out first
    keys = ("position", "layer", "pass", "name") if instances else ("position", "name")
    _show_trace_table(trace, db, dataset, fmt, out, build, keys=keys,
                      priorities={} if instances else {"instances": 2, "avg_ns": 2, "median_ns": 4, "layer": 3, "pass": 3,
                                                       "library": 3})


@app.command(epilog=example('traceq layers -t alexnet_b256_cudnn'))
def layers(trace: TraceOpt = None, db: DbOpt = None, dataset: DatasetOpt = None, iteration_regex: IterOpt = None,
           fmt: FormatOpt = None, out: OutOpt = None) -> None:
    """GPU time per NVTX layer and pass, with its heaviest kernel, library split and how its kernels were placed."""
    def build(t: Trace):
        frame = t.layers(iteration_regex=iteration_regex)
        shares = t.attribution_shares(iteration_regex=iteration_regex)
        placed = [f"{kind} {share:.1f} %" for kind, share in shares.items() if kind != "none" and share >= 0.05]
        return frame, (f"{t.name}: GPU time per layer and pass (placed by {', '.join(placed) or 'nothing'}; "
                       f"{shares['none']:.1f} % in no layer: see Attribution)")

    _show_trace_table(trace, db, dataset, fmt, out, build)


@app.command(epilog=example('traceq libs --by-layer -t alexnet_b256_cudnn'))
def libs(by_layer: Annotated[bool, typer.Option("--by-layer", help="One row per layer, pass and library")] = False,
         trace: TraceOpt = None, db: DbOpt = None, dataset: DatasetOpt = None, iteration_regex: IterOpt = None,
         fmt: FormatOpt = None, out: OutOpt = None) -> None:
    """GPU time per library (cuDNN, cuBLAS, NCCL, PyTorch ATen, ...), optionally per layer."""
    _show_trace_table(trace, db, dataset, fmt, out, lambda t: (
        t.libs(by_layer=by_layer, iteration_regex=iteration_regex),
        f"{t.name}: GPU time per library" + (" and layer" if by_layer else "")))


@app.command(epilog=example('traceq stages -t ddp_resnet18_2gpu'))
def stages(trace: TraceOpt = None, db: DbOpt = None, dataset: DatasetOpt = None, iteration_regex: IterOpt = None,
           fmt: FormatOpt = None, out: OutOpt = None) -> None:
    """GPU time per iteration in data copy, forward, backward and weight update, and GPU idle time."""
    # the stages and the idle time are what the command is for: at 80 columns the totals go first;
    # a table of one device does without the Device column
    def build(t: Trace):
        frame = t.stages(iteration_regex=iteration_regex)
        if format_for(fmt, out) == Format.table and frame.height and frame["device_id"].n_unique() == 1:
            frame = frame.drop("device_id")
        return frame, f"{t.name}: GPU time per iteration and stage"

    _show_trace_table(trace, db, dataset, fmt, out, build, keys=("iteration", "device_id"),
                      priorities={"data_copy_ns": 1, "forward_ns": 1, "backward_ns": 1, "weight_update_ns": 2,
                                  "idle_ns": 1, "idle_pct": 4, "busy_ns": 4, "span_ns": 3, "other_ns": 2})


@app.command(epilog=example('traceq ru --by layer -t alexnet_b256_cudnn'))
def ru(
    by: Annotated[GroupBy, typer.Option(help="One row per kernel name, layer and pass, or library")] = GroupBy.kernel,
    k: Annotated[Optional[int], typer.Option("--k", "-k", min=1, help="Show only the k heaviest rows")] = None,
    cc: CcOpt = None,
    sms: SmsOpt = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Occupancy and resource utilization (RU) of the launches: limiter, blocks per SM, waves, RU."""
    _show_trace_table(trace, db, dataset, fmt, out, lambda t: (
        t.ru(by, k=k, cc=cc, sms=sms, iteration_regex=iteration_regex),
        f"{t.name}: occupancy and RU per {by.value} (kernel-time-weighted means; "
        "paper RU: registers-only maxBlocks, eq. 10; Kineto: its estimate)"))




@app.command(epilog=example('traceq ce --spec sample_traces/alexnet.model.toml -t alexnet_b256_cudnn'))
def ce(
    by: Annotated[GroupBy, typer.Option(help="One row per layer and pass, kernel name, or library")] = GroupBy.layer,
    spec: SpecOpt = None,
    batch: BatchOpt = None,
    precision: Annotated[Optional[Precision], typer.Option(
        "--precision", show_default=False,
        help="Measure every kernel against this precision's peak [default: each kernel's, from its name, "
             "else its operator's data type, else float32]")] = None,
    k: Annotated[Optional[int], typer.Option("--k", "-k", min=1, help="Show only the k rows with most FLOPs")] = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Compute efficiency (CE): FLOPs, achieved TFLOP/s, and their share of the peak of the precision each kernel ran at."""
    def build(t: Trace):
        frame = t.ce(by, spec=spec, batch=batch, precision=precision, k=k, iteration_regex=iteration_regex)
        gpu = t.gpu()
        shown = set(re.findall(r"[a-z0-9]+", " ".join(frame["precision"].drop_nulls())))
        used = [p for p in Precision if p.value in shown]
        peaks = ", ".join(f"{p.value} {gpu[f'peak_{p.value}'] / 1e12:,.1f}" for p in used if gpu[f"peak_{p.value}"])
        title = (f"{t.name}: compute efficiency per {by.value} on {gpu['description']}; CE against the dense "
                 f"peak of each kernel's precision (TFLOP/s: {peaks or 'unknown'})")
        return frame, title

    _show_trace_table(trace, db, dataset, fmt, out, build)


@app.command(epilog=("Example, on the sample recorded with GPU metrics in sample_traces/ of a source checkout, loaded "
                      "with `traceq load sample_traces/conventions/cnn_nsys_gpu_metrics.sqlite`:\n\n"
                      "traceq gpumetrics --by layer -t cnn_nsys_gpu_metrics"))
def gpumetrics(
    by: Annotated[MeasuredBy, typer.Option(
        help="One row per iteration, layer and pass, kernel name, or library")] = MeasuredBy.iteration,
    k: Annotated[Optional[int], typer.Option("--k", "-k", min=1, help="Show only the k longest rows")] = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Measured GPU activity (nsys --gpu-metrics-devices): SM active, tensor active, DRAM bandwidth over each group's kernels."""
    _show_trace_table(trace, db, dataset, fmt, out, lambda t: (
        t.gpu_metrics(by, k=k, iteration_regex=iteration_regex),
        f"{t.name}: GPU metrics measured over each {by.value}'s kernels (time-weighted; DRAM % of the peak)"))


@app.command(epilog=example('traceq roofline --spec sample_traces/alexnet.model.toml -t alexnet_b256_cudnn -k 5'))
def roofline(
    by: Annotated[GroupBy, typer.Option(
        help="One row per layer, pass and operation, kernel name, or library")] = GroupBy.layer,
    spec: SpecOpt = None,
    batch: BatchOpt = None,
    precision: Annotated[Optional[Precision], typer.Option(
        "--precision", show_default=False,
        help="Measure every kernel against this precision's peak [default: each kernel's]")] = None,
    k: Annotated[Optional[int], typer.Option("--k", "-k", min=1, help="Show only the k longest rows")] = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Roofline: FLOPs, bytes, FLOP per byte, achieved TFLOP/s and TB/s, and their share of the roof at that intensity."""
    def build(t: Trace):
        from traceq.analysis.efficiency.gpu_products import trace_gpu

        frame = t.roofline(by, spec=spec, batch=batch, precision=precision, k=k, iteration_regex=iteration_regex)
        gpu = trace_gpu(t.con, t.id)
        title = (f"{t.name}: roofline per {by.value} on {gpu.name} (DRAM {gpu.dram_bytes_per_s / 1e12:,.2f} TB/s; "
                 "bytes: each op's inputs read and output written once, DeLTA's model for convolutions)")
        return frame, title

    _show_trace_table(trace, db, dataset, fmt, out, build,
                      priorities={"achieved_pct": 1, "roof": 1, "intensity": 2, "tflops": 2, "total_ns": 3,
                                  "tbps": 3, "bytes": 4, "operation": 2})


@app.command(epilog=example('traceq traffic --spec sample_traces/alexnet.model.toml -t alexnet_b256_cudnn'))
def traffic(
    by: Annotated[TrafficBy, typer.Option(help="One row per layer and pass (and GEMM shape), or per kernel name")]
    = TrafficBy.layer,
    gpu: Annotated[Optional[str], typer.Option(
        "--gpu", help="Predict on this GPU of traceq's table (V100-SXM2, A100-SXM4-80GB, H100-SXM5, H200, ...) "
                      "[default: the trace's own]", show_default=False)] = None,
    spec: Annotated[Optional[Path], typer.Option(
        "--spec", help="Layer shapes: a model spec (TOML, docs/flops.md) or a layer-shapes JSON "
                       "(tools/record_training.py --shapes) [default: shapes recorded in the trace]")] = None,
    batch: BatchOpt = None,
    k: Annotated[Optional[int], typer.Option("--k", "-k", min=1,
                                              help="Show only the k rows with most GPU time")] = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """DeLTA's traffic model: L1, shared, L2 and DRAM bytes and time of conv/GEMM kernels, beside the measured time."""
    def build(t: Trace):
        frame = t.traffic(by, gpu=gpu, spec=spec, batch=batch, k=k, iteration_regex=iteration_regex)
        target = t.traffic_gpu(gpu)
        what = f"predicted on {target.name}" + (", expected = measured x predicted there / here" if gpu else "")
        title = (f"{t.name}: convolution and GEMM traffic per {by.value} (DeLTA model, docs/traffic.md), "
                 f"{what}; {target.sm_count} SMs at {target.clock_hz / 1e9:.2f} GHz, L2 {target.l2_bytes >> 20} MiB, "
                 f"DRAM {target.dram_bytes_per_s / 1e12:.2f} TB/s")
        return frame, title

    _show_trace_table(trace, db, dataset, fmt, out, build)


@app.command(epilog=example('traceq memory -t alexnet_b64_nocache'))
def memory(
    by: Annotated[MemoryBy, typer.Option(help="Allocations per layer and pass, or bytes in use after each event")]
    = MemoryBy.layer,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """GPU memory from the CUDA memory usage events: allocations per layer, bytes in use over time, peak."""
    from traceq.units import format_bytes

    def build(t: Trace):
        frame = t.memory(by, iteration_regex=iteration_regex)
        peaks = []
        for r in t.memory_peaks(iteration_regex=iteration_regex).iter_rows(named=True):
            share = f" = {r['peak_pct']:.1f} % of {format_bytes(r['memory_bytes'])}" if r["memory_bytes"] else ""
            peaks.append(f"GPU {r['device_id']} peak {format_bytes(r['peak_bytes'])}{share}"
                         + (f", {format_bytes(r['before_capture_bytes'])} allocated before the capture"
                            if r["before_capture_bytes"] else ""))
        what = "device memory allocated per layer and pass" if by is MemoryBy.layer else "device memory in use"
        return frame, f"{t.name}: {what} ({'; '.join(peaks)})"

    _show_trace_table(trace, db, dataset, fmt, out, build)


@app.command(epilog=example('traceq occupancy --cc 9.0 --threads 256 --regs 64 --grid 4096 --sms 132'))
def occupancy(
    cc: Annotated[str, typer.Option("--cc", help="Compute capability, e.g. 9.0", show_default=False)],
    threads: Annotated[int, typer.Option("--threads", min=1, help="Threads per block", show_default=False)],
    regs: Annotated[int, typer.Option("--regs", min=0, help="Registers per thread", show_default=False)],
    smem_static: Annotated[int, typer.Option("--smem-static", min=0, help="Static shared memory per block, bytes")] = 0,
    smem_dynamic: Annotated[int, typer.Option("--smem-dynamic", min=0, help="Dynamic shared memory per block, bytes")] = 0,
    carveout: Annotated[Optional[int], typer.Option("--carveout", min=0,
                        help="Shared memory per SM the driver configured, bytes [default: the maximum]")] = None,
    opt_in: Annotated[bool, typer.Option("--opt-in", help="The kernel opted in to more than 48 KiB per block")] = False,
    grid: Annotated[Optional[int], typer.Option("--grid", min=1, help="Blocks in the grid (gives waves and RU)")] = None,
    sms: Annotated[Optional[int], typer.Option("--sms", min=1, help="SMs on the GPU (needed with --grid)")] = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Offline occupancy calculator (like NVIDIA's spreadsheet): blocks per SM, limiter, waves, RU."""
    import json

    import polars as pl

    from traceq.api import occupancy as calculate
    from traceq.render.columns import format_cell, header

    with user_errors():
        major, _, minor = cc.partition(".")
        if not (major.isdigit() and minor.isdigit()):
            raise typer.BadParameter(f"{cc!r} is not a compute capability like 9.0", param_hint="--cc")
        result = calculate(cc, threads, regs, smem_static=smem_static, smem_dynamic=smem_dynamic,
                           carveout=carveout, opt_in=opt_in, grid=grid, sms=sms)
        fmt = format_for(fmt, out)
        if fmt is Format.json:  # one calculation: one object, named as `traceq ru`'s columns
            _emit(json.dumps(result, indent=1) + "\n", out)
        elif fmt is Format.csv:
            _emit(render(pl.DataFrame([result]), fmt), out)
        else:  # one row reads better as a list of quantities, in the words of every other table
            frame = pl.DataFrame([(header(k), format_cell(k, v)) for k, v in result.items()],
                                 schema=["quantity", "value"], orient="row")
            _emit(render(frame, fmt, title=f"Occupancy on CC {cc}: {threads} threads, {regs} registers",
                         width=_terminal_width()), out)


