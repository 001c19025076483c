"""Commands that change or list what the store holds: load, traces, rm, attribute, sql."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Annotated

import typer

from traceq.api import Run, Store
from traceq.cli.base import (
    DatasetOpt,
    DbOpt,
    FormatOpt,
    OutOpt,
    _emit,
    _err,
    _LazyProgress,
    _say,
    _store,
    _terminal_width,
    app,
    example,
    user_errors,
)
from traceq.errors import TraceqError
from traceq.render import Format, format_for, render


@app.command(epilog=example('traceq load sample_traces/*.sqlite', 'traceq load sample_traces/alexnet_b256_kineto.json --name alexnet_kineto',
                            'traceq load sample_traces/ncu/alexnet_b256_fp32.sqlite --ncu sample_traces/ncu/alexnet_b256_fp32_ncu.csv.gz'))
def load(
    paths: Annotated[list[Path] | None, typer.Argument(help="Nsight Systems SQLite exports, nvprof databases or "
                                                      "PyTorch profiler (Kineto) JSON traces",
                                                      metavar="[PATH]...", show_default=False)] = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    name: Annotated[str | None, typer.Option(help="Name in the store [default: the file's name "
                                                     "without its suffix]")] = None,
    replace: Annotated[bool, typer.Option(help="Replace a trace with the same content or name")] = False,
    export: Annotated[bool, typer.Option(help="Run `nsys export` first on .nsys-rep/.qdrep files")] = False,
    python_functions: Annotated[bool, typer.Option(
        "--python-functions", help="Kineto traces: keep the python_function events (with_stack=True) as ranges")] = False,
    attribute: Annotated[bool | None, typer.Option(
        "--attribute/--no-attribute", show_default=False,
        help="Keep each launch's layer, pass, library, ... in the store [default: for traces of up to 100M kernels; "
             "above, `traceq attribute` does]")] = None,
    run: Annotated[str | None, typer.Option(
        help="Load the files as the ranks of one run (one file per rank or node), in one transaction",
        show_default=False)] = None,
    scheduler: Annotated[str | None, typer.Option(
        help="With --dataset: the Dask scheduler's address (tcp://host:8786) or scheduler file "
             "[default: a local cluster]", show_default=False)] = None,
    workers: Annotated[int | None, typer.Option(
        min=1, help="With --dataset and no --scheduler: local Dask workers [default: one per core]",
        show_default=False)] = None,
    ncu: Annotated[Path | None, typer.Option(
        help="Nsight Compute report (`--csv --page raw` output, or .ncu-rep with ncu at hand) to join to the "
             "kernels of --into TRACE (or of the one PATH loaded)", show_default=False)] = None,
    into: Annotated[str | None, typer.Option(help="With --ncu: the trace (name or id) the report measured",
                                             metavar="TRACE", show_default=False)] = None,
    ncu_extend: Annotated[bool, typer.Option(
        "--ncu-extend", help="With --ncu: kernels ncu did not profile take the measured values of the same "
                             "name and launch configuration (other iterations)")] = False,
    ncu_bin: Annotated[str | None, typer.Option(
        help="With --ncu REPORT.ncu-rep: the ncu to run [default: $TRACEQ_NCU, else ncu on PATH]",
        metavar="PATH", show_default=False)] = None,
) -> None:
    """Load trace files into the store (one transaction each, or one for all with --run), or with
    --dataset into a Parquet dataset, one Dask task per file; with --ncu, join an Nsight Compute
    report's measured metrics to a loaded trace's kernels."""

    with user_errors():
        paths = paths or []
        if ncu is None and (into is not None or ncu_extend or ncu_bin is not None):
            raise typer.BadParameter("--into, --ncu-extend and --ncu-bin go with --ncu REPORT", param_hint="--ncu")
        if ncu is not None:
            if dataset is not None or run is not None:
                raise typer.BadParameter("--ncu joins a report to a trace in the store: not with --dataset or --run",
                                         param_hint="--ncu")
            if len(paths) > 1 or (paths and into is not None):
                raise typer.BadParameter("--ncu joins one report to one trace: give --into TRACE, or one PATH "
                                         "to load first", param_hint="--ncu")
            if not paths and into is None:
                raise typer.BadParameter("--ncu needs --into TRACE (the loaded trace it measured)", param_hint="--into")
        elif not paths:
            raise typer.BadParameter("give the trace files to load (or --ncu REPORT --into TRACE)",
                                     param_hint="PATH...")
        if name is not None and len(paths) > 1:
            raise typer.BadParameter("--name needs exactly one file", param_hint="--name")
        if dataset is not None or scheduler is not None or workers is not None:
            _load_dataset(paths, dataset, run, scheduler, workers, python_functions, attribute,
                          {"--db": db, "--name": name, "--replace": replace, "--export": export})
            return
        store = _store(db, lazy=True)
        if export:
            paths = [_exported(path) for path in paths]
        if run is not None:
            _load_run(store, paths, run, replace, python_functions)
            return
        for path in paths:
            progress = _LazyProgress(f"loading {path.name}")
            try:
                result = store.load(path, name=name, replace=replace, progress=progress,
                                    python_functions=python_functions, attribute=attribute).load_result
            finally:
                progress.close()
            if result.status == "already_loaded":
                _say(f"{path} is already loaded as {result.name!r} (trace {result.trace_id}); "
                           "nothing changed (use --replace to load it again)")
                continue
            rows = result.rows
            _say(
                f"{result.status} {result.name!r} (trace {result.trace_id}) from {path}: "
                f"{result.kernel_count:,} kernels, {rows.get('api_events', 0):,} API calls, "
                f"{rows.get('memops', 0):,} memcpy/memset, {rows.get('nvtx_events', 0):,} NVTX events "
                f"in {result.seconds:.2f} s" + "".join(f"; {note}" for note in result.notes)
            )
        if ncu is not None:
            trace = into if into is not None else (name or _loaded_name(store, paths[0]))
            _load_ncu(store, ncu, trace, ncu_extend, ncu_bin)


def _loaded_name(store: Store, path: Path) -> str:
    """The name in the store of the trace file just loaded from `path`."""
    from traceq.ingest import sha256_of

    frame = store.traces()
    same = frame.filter(frame["sha256"] == sha256_of(path))
    return str(same["name"][0]) if len(same) else path.stem


def _load_ncu(store: Store, report: Path, into: str, extend: bool, ncu_bin: str | None) -> None:
    """`traceq load --ncu`: join the report, then say how many launches matched and what it covers."""
    done = store.load_ncu(report, into, extend=extend, ncu_bin=ncu_bin)
    trace = store.trace(done.trace_id).name
    nvtx = f" ({done.with_nvtx:,} within their NVTX range)" if done.with_nvtx else ""
    unmatched = (f"; {done.unmatched:,} unmatched (no kernel of that name, grid and block left in the trace)"
                 if done.unmatched else "")
    covered = done.matched + done.extended
    if extend:
        rest = (f"; --ncu-extend: {done.extended:,} more kernels of the same name and launch configuration take "
                f"the measured values (means), {covered:,} of the trace's {done.kernels:,} kernels in all")
    else:
        rest = (f"; {done.kernels - covered:,} of the trace's {done.kernels:,} kernels were not profiled "
                "(--ncu-extend lets the measured launches stand for the same name and configuration)")
    _say(f"{'replaced the Nsight Compute metrics of' if done.replaced else 'joined'} {trace!r} "
         f"(trace {done.trace_id}) {'with' if done.replaced else 'to'} {report}: {done.matched:,} of "
         f"{done.launches:,} profiled launches matched{nvtx}{unmatched}{rest}")


def _exported(path: Path) -> Path:
    """`path`, or the SQLite export `nsys export` makes of it when it is an .nsys-rep/.qdrep."""
    from traceq.ingest import export_report
    from traceq.ingest.detect import NSYS_REPORT_MAGIC, check_file

    check_file(path)
    with path.open("rb") as f:
        magic = f.read(len(NSYS_REPORT_MAGIC))
    return export_report(path) if magic == NSYS_REPORT_MAGIC else path


def _load_run(store: Store, paths: list[Path], run: str, replace: bool, python_functions: bool) -> None:
    """`traceq load --run`: every file in one transaction, then one line per file and one for the run."""
    progress = _LazyProgress(f"loading {len(paths)} files as run {run}")
    try:
        r = store.load_run(paths, run, replace=replace, progress=progress, python_functions=python_functions)
    finally:
        progress.close()
    if all(result.status == "already_loaded" for result in r.load_results):
        _say(f"run {run!r} is already loaded from these {len(paths)} files; nothing changed "
                   "(use --replace to load it again)")
        return
    for path, result in zip(paths, r.load_results):
        _say(f"{result.status} {result.name!r} (trace {result.trace_id}) from {path}: "
                   f"{result.kernel_count:,} kernels in {result.seconds:.2f} s")
    _said_run(r, len(paths))


def _said_run(r: Run, files: int, where: str = "") -> None:
    """The line `traceq load --run` ends with: the run's ranks and the largest clock shift."""
    from traceq.units import format_duration

    shift = f"; clocks aligned on collectives, largest shift {format_duration(r.max_shift_ns)}" if files > 1 else ""
    _say(f"run {r.name!r}: {r.world_size} ranks{shift} (`traceq ranks {r.name}{where}`)")


def _load_dataset(paths: list[Path], dataset: Path | None, run: str | None, scheduler: str | None,
                  workers: int | None, python_functions: bool, attribute: bool | None,
                  store_only: dict[str, object]) -> None:
    """`traceq load --dataset`: check the options, load, and say what was done."""
    from traceq.api import load_dataset

    if dataset is None:
        raise typer.BadParameter("--scheduler and --workers load into a dataset: add --dataset PATH",
                                 param_hint="--dataset")
    for option, value in store_only.items():
        if value:
            raise typer.BadParameter(f"{option} is for the store, not --dataset", param_hint=option)
    if scheduler is not None and workers is not None:
        raise typer.BadParameter("--workers starts a local cluster: not with --scheduler", param_hint="--workers")
    progress = _LazyProgress(f"loading {len(paths)} files")
    try:
        done = load_dataset(paths, dataset, run=run, scheduler=scheduler, workers=workers, progress=progress,
                            python_functions=python_functions, attribute=attribute)
    finally:
        progress.close()
    if not done.workers and not done.seconds:
        _say(f"all {len(paths)} file(s) are already in {dataset}; nothing changed")
        return
    if done.workers:
        kernels = sum(e.kernels or 0 for e in done.loaded)
        there = f"; {len(done.skipped)} already there" if done.skipped else ""
        _say(f"loaded {len(done.loaded)} trace(s) into {dataset} ({kernels:,} kernels{there}) "
                   f"on {done.workers} Dask worker(s) in {done.seconds:.2f} s")
    for entry in done.loaded:  # a damaged file's repairs, as `traceq load` says them
        if entry.notes:
            _say(f"{entry.name!r} (trace {entry.trace_id}) from {entry.source_path}: {'; '.join(entry.notes)}")
    for entry in done.failed:
        _err(f"{entry.source_path} (trace {entry.trace_id}) failed: {entry.error}")
    if done.run is not None and done.run.status == "loaded":
        _said_run(Store(dataset=dataset).run(done.run.name), len(paths), f" --dataset {dataset}")
    if done.failed:
        later = f"; run {run!r} is made when all its ranks are in" if run is not None else ""
        raise TraceqError(f"{len(done.failed)} of {len(paths)} file(s) not loaded: run the same command again "
                          f"to load only those{later}")
    if done.run is not None and done.run.status == "failed":
        raise TraceqError(f"run {run!r} not made (each file stays a trace of its own): {done.run.error}")


@app.command(epilog=example('traceq traces'))
def traces(db: DbOpt = None, dataset: DatasetOpt = None, fmt: FormatOpt = None, out: OutOpt = None) -> None:
    """List the traces in the store."""
    with user_errors():
        store = _store(db, dataset)
        frame = store.traces()
        fmt = format_for(fmt, out)
        if fmt is Format.table:
            frame = frame.drop("sha256", "source_path", "loaded_at")
        _emit(render(frame, fmt, title=f"{len(frame)} trace(s) in {store.path}", width=_terminal_width()), out)


@app.command(epilog=example('traceq rm lenet_b256_cudnn'))
def rm(
    trace: Annotated[str, typer.Argument(help="Trace name or id, or a run's name (all its traces)",
                                         metavar="TRACE", show_default=False)],
    db: DbOpt = None,
) -> None:
    """Remove a trace, or a run and all its traces, from the store."""
    with user_errors():
        removed = _store(db, lazy=True).remove(trace)
        if len(removed) > 1:
            _say(f"removed run {trace!r} and its {len(removed)} traces")
        else:
            _say(f"removed {removed[0][1]!r} (trace {removed[0][0]})")


@app.command(epilog=example('traceq sql "SELECT name, kernel_count FROM traces ORDER BY kernel_count DESC"'))
def sql(
    query: Annotated[str | None, typer.Argument(
        help="One read-only SQL statement [default: open DuckDB's own shell on the store, read-only]",
        metavar="[QUERY]", show_default=False)] = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Run a read-only SQL query on the store and print its rows like every other table (docs/schema.md)."""
    with user_errors():
        store = _store(db, dataset)
        if query is None:
            if fmt is not None or out is not None:
                raise typer.BadParameter("--format and --output need a QUERY", param_hint="QUERY")
            if dataset is not None:
                raise typer.BadParameter("DuckDB's shell opens a store, not a dataset: give a QUERY",
                                         param_hint="QUERY")
            store.close()
            raise typer.Exit(_duckdb_shell(store.path))
        frame = store.sql(query)
        _emit(render(frame, format_for(fmt, out), title=f"{len(frame):,} row(s)", width=_terminal_width()), out)


def _duckdb_shell(path: Path) -> int:
    """Run DuckDB's own shell on the store, read-only; its exit status."""
    import subprocess

    import duckdb

    shell = shutil.which("duckdb")
    if shell is None:
        raise TraceqError(f"DuckDB's shell (`duckdb`) is not on PATH: install DuckDB's command-line client, "
                          f"version {duckdb.__version__} as the duckdb Python package traceq uses (an older one "
                          f"may not read the store), and run `duckdb -readonly {path}`; or give a query: "
                          "traceq sql \"SELECT ...\"")
    return subprocess.run([shell, "-readonly", str(path)]).returncode


@app.command(epilog=example('traceq attribute lenet_b256_cudnn'))
def attribute(
    trace: Annotated[str | None, typer.Argument(help="Trace name or id [default: the latest loaded]",
                                                   metavar="[TRACE]", show_default=False)] = None,
    db: DbOpt = None,
) -> None:
    """Keep each kernel launch's layer, pass, iteration, stage, library and precision in the store (view kernels_attributed)."""
    with user_errors():
        started = time.monotonic()
        trace_id, trace_name = _store(db, lazy=True).attribute(trace)
        _say(f"attributed {trace_name!r} (trace {trace_id}) in {time.monotonic() - started:.2f} s")
