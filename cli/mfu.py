"""`traceq mfu`: model and hardware FLOPs utilization per iteration."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceq.analysis.choices import Precision
from traceq.api import Trace
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


@app.command(epilog=example("traceq mfu -t resnet50_b32_amp_ops --model-flops 3.9e11"))
def mfu(
    model_flops: Annotated[float | None, typer.Option(
        "--model-flops", min=0, show_default=False,
        help="The model's FLOPs per iteration (forward, backward and update)")] = None,
    params: Annotated[float | None, typer.Option(
        "--params", min=0, show_default=False, help="Parameters of the model: with --tokens, 6 x P x T a training "
                                                    "step (2 x P x T with --inference)")] = None,
    tokens: Annotated[float | None, typer.Option(
        "--tokens", min=0, show_default=False, help="Tokens per iteration (batch x sequence length)")] = None,
    inference: Annotated[bool, typer.Option("--inference", help="2 x P x T per iteration, not 6 x P x T")] = False,
    layers: Annotated[int | None, typer.Option(
        "--layers", min=1, show_default=False,
        help="Transformer layers: with --d-model and --seq, attention's products are added to 6 x P x T")] = None,
    d_model: Annotated[int | None, typer.Option("--d-model", min=1, show_default=False,
                                                help="The model's width (heads x head size)")] = None,
    seq: Annotated[int | None, typer.Option("--seq", min=1, show_default=False,
                                            help="Sequence length (keys each query attends to)")] = None,
    full_attention: Annotated[bool, typer.Option(
        "--full-attention", help="Attention is not causal (count the whole score matrix, not half)")] = False,
    precision: Annotated[Precision | None, typer.Option(
        "--precision", show_default=False,
        help="The peak to measure against [default: the precision that ran the most FLOPs]")] = None,
    spec: Annotated[Path | None, typer.Option(
        "--spec", show_default=False,
        help="A transformer spec (TOML with a [transformer] table, docs/mfu.md): layers, sizes, batch, "
             "sequence, training or inference; the model FLOPs from them (instead of --params ...)")] = None,
    run: Annotated[str | None, typer.Option(
        "--run", show_default=False,
        help="A run: each rank's table (model FLOPs and tokens per GPU), then the ranks together")] = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Model FLOPs utilization (MFU) and hardware FLOPs utilization (HFU) per iteration."""
    options = {"model_flops": model_flops, "params": params, "tokens": tokens, "inference": inference,
               "layers": layers, "d_model": d_model, "seq": seq, "full_attention": full_attention,
               "precision": precision, "spec": spec, "iteration_regex": iteration_regex}

    def given(frame) -> str:
        if spec is not None:
            from traceq.analysis.efficiency.transformer_spec import load_transformer_spec  # only with --spec

            model = load_transformer_spec(spec)
            return (f"model FLOPs from {model.name!r}: {model.params:,} parameters, N = {model.matmul_params:,} "
                    f"in matrix products, {model.tokens:,} tokens, {model.model_flops:,.0f} FLOP a step")
        return ("model FLOPs given" if frame["model_flops"].drop_nulls().len() else
                "no model FLOPs given (--params/--tokens or --model-flops): HFU only")

    def build(t: Trace):
        frame = t.mfu(**options)
        peak = frame["peak_flops"][0]
        title = (f"{t.name}: MFU and HFU per iteration on {t.gpu()['description']} against the dense "
                 f"{frame['precision'][0]} peak ({peak / 1e12:,.1f} TFLOP/s); {given(frame)}")
        return frame, title

    def build_run(r, progress):
        frame = r.mfu(**options)
        title = (f"{r.name}: MFU and HFU per iteration of each of {r.world_size} ranks and of all together "
                 f"(the slowest rank's time, the GPUs' {frame['precision'][0]} peaks added); {given(frame)}")
        return frame, title

    if run is None:
        _show_trace_table(trace, db, dataset, fmt, out, build)
    else:
        _show_run_table(run, db, dataset, fmt, out, build_run)
