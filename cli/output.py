"""Commands that write a file to open elsewhere: report (HTML) and export (Perfetto)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from traceq.analysis.choices import ExportFormat
from traceq.cli.base import (
    BatchOpt,
    DatasetOpt,
    DbOpt,
    IterOpt,
    SpecOpt,
    _emit,
    _err,
    _global,
    _LazyProgress,
    _say,
    _store,
    _working,
    app,
    example,
    user_errors,
)
from traceq.text import file_name


@app.command(epilog=example('traceq report lenet_b256_cudnn -o lenet.html'))
def report(
    traces: Annotated[list[str] | None, typer.Argument(
        help="Traces or runs (names or ids), side by side [default: the latest loaded]", metavar="[TRACE]...",
        show_default=False)] = None,
    out: Annotated[Path | None, typer.Option("--output", "-o", callback=_global, show_default=False,
                                                help="The HTML file to write [default: report.html]")] = None,
    top_k: Annotated[int, typer.Option("--k", "-k", min=1, help="Rows of the longest-launches table")] = 15,
    title: Annotated[str | None, typer.Option("--title", help="Page title [default: the trace names]")] = None,
    spec: SpecOpt = None,
    batch: BatchOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
) -> None:
    """One self-contained HTML report (Plotly, works offline): stages, layers, CE/RU, memory, timeline."""
    out = out or Path("report.html")
    with user_errors():
        started = time.monotonic()
        with _working(", ".join(traces or []) or "the latest trace"):
            page = _store(db, dataset).report(traces, k=top_k, title=title, spec=spec, batch=batch,
                                              iteration_regex=iteration_regex)
        _emit(page, out)
        figures = page.count('class="figure"')
        _err(f"{len(page) / 1e6:.1f} MB, {figures} figures, "
             f"in {time.monotonic() - started:.1f} s; open it in a browser (no network needed)")


@app.command(epilog=example('traceq export lenet_b256_cudnn --to perfetto -o lenet.json.gz'))
def export(
    trace: Annotated[str | None, typer.Argument(help="Trace name or id, or a run: every rank [default: the latest loaded]",
                                                   metavar="[TRACE]", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option(
        "--output", "-o", callback=_global, show_default=False,
        help="The file to write; .gz compresses it [default: TRACE.json.gz]")] = None,
    export_format: Annotated[ExportFormat, typer.Option(
        "--to", help="perfetto: Chrome trace events (Perfetto, chrome://tracing)")] = ExportFormat.perfetto,
    old_format: Annotated[ExportFormat | None, typer.Option(
        "--format", "-f", hidden=True, show_default=False,
        help="Deprecated spelling of --to (-f is the output format of tables everywhere else)")] = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
) -> None:
    """Write a trace's (or every rank of a run's) kernels, memcpys, API calls and NVTX ranges as a timeline Perfetto opens."""
    with user_errors():
        if old_format is not None:  # kept for one release: -f means table, csv or json in every other command
            _err(f"note: `export --format {old_format.value}` is deprecated and will be removed in the next "
                 f"release: use `--to {old_format.value}` (-f/--format is the output format of tables)")
            export_format = old_format
        started = time.monotonic()
        t = _store(db, dataset).exported(trace)  # a trace, or every rank of a run
        out = out or Path(file_name(t.name, ".json.gz"))  # a trace named ../../x writes ./x.json.gz
        progress = _LazyProgress(f"exporting {t.name}")
        try:
            written = t.export(out, format=export_format.value, progress=progress)
        finally:
            progress.close()
        _say(f"wrote {out}: {written['kernel']:,} kernels, {written['memop']:,} memory operations, "
                   f"{written['cuda_api']:,} API calls, {written['nvtx_range'] + written['nvtx_async'] // 2:,} NVTX "
                   f"ranges, {written['flow'] // 2:,} launch flows in {time.monotonic() - started:.1f} s")
