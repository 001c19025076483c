"""`traceq compare A B`: two traces or runs side by side, and the regression gate."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from traceq.analysis.choices import CompareBy
from traceq.cli.base import (
    DatasetOpt,
    DbOpt,
    FormatOpt,
    IterOpt,
    OutOpt,
    SpecOpt,
    _emit,
    _err,
    _gpus,
    _store,
    _terminal_width,
    _working,
    app,
    example,
    user_errors,
)
from traceq.errors import RegressionError
from traceq.render import format_for, render


@app.command(epilog=example('traceq compare alexnet_b256_cudnn alexnet_b64_nocache --by stage'))
def compare(
    a: Annotated[str, typer.Argument(help="First trace or run (name or id)", metavar="A", show_default=False)],
    b: Annotated[str, typer.Argument(help="Second trace or run (name or id)", metavar="B", show_default=False)],
    by: Annotated[CompareBy, typer.Option(help="Rows: layer and pass, kernel name, library or stage")] = CompareBy.layer,
    spec: SpecOpt = None,
    k: Annotated[Optional[int], typer.Option("--k", "-k", min=1, help="Show only the k heaviest rows")] = None,
    gate: Annotated[Optional[str], typer.Option(
        "--gate", help="Fail (exit 3) when b's iterations are slower than a's by more than this (5%) and "
                       "beyond their noise (a rank test over iterations)", show_default=False)] = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Two runs side by side: GPU time (per iteration), difference, ratio, RU and CE; runs of different GPU counts per GPU, with scaling efficiency; --gate for CI."""
    with user_errors():
        threshold = _percentage(gate) if gate is not None else None
        store = _store(db, dataset)
        ta, tb = store.trace(a), store.trace(b)
        ra, rb = store.run(ta), store.run(tb)
        label = f"{ta.name} vs {tb.name}"
        if (ra.world_size > 1 or rb.world_size > 1) and threshold is None:  # --gate compares the traces as they are
            with _working(label):
                frame = ra.compare(rb, by, k=k, iteration_regex=iteration_regex)
            title = (f"a = {ra.name} ({_gpus(ra)}) vs b = {rb.name} ({_gpus(rb)}) by {by.value}: GPU time per GPU and "
                     "iteration, b - a, b / a, scaling (fewer GPUs' time / more GPUs' time, 100 % = perfect weak scaling)")
            _emit(render(frame, format_for(fmt, out), title=title, width=_terminal_width()), out)
            return
        with _working(label):
            frame = ta.compare(tb, by, spec=spec, k=k, iteration_regex=iteration_regex)
            per_iteration = ta.per_iteration(tb, by, iteration_regex=iteration_regex)
        unit = "GPU time per iteration" if per_iteration else "total GPU time"
        title = f"a = {ta.name} vs b = {tb.name} by {by.value}: {unit}, b - a, b / a"
        _emit(render(frame, format_for(fmt, out), title=title, width=_terminal_width()), out)
        if threshold is not None:
            with _working(label):
                result = ta.gate(tb, threshold, iteration_regex=iteration_regex)
            if result.failed:
                raise RegressionError(result.verdict)
            _err(result.verdict)


def _percentage(text: str) -> float:
    """'5%' or '5' -> 0.05."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a percentage like 5%", param_hint="--gate") from None
    if not 0 <= value < 1000:
        raise typer.BadParameter(f"{text!r}: give a percentage from 0 to 1000", param_hint="--gate")
    return value / 100


