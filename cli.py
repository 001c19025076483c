"""The `traceq` command: a thin layer over traceq.store, traceq.ingest, traceq.analysis and
traceq.render. Each command opens the store, calls one analysis, and renders its frame.

Errors the user can fix (TraceqError) become one line `traceq: ...` on stderr and exit status 1
(3 for a regression `compare --gate` found); usage errors exit 2 (typer's convention). Anything
else is a bug and shows a traceback.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand

from traceq import __version__
from traceq.analysis.choices import (CommBy, CompareBy, ExportFormat, GroupBy, IdleBy, MemoryBy, NameBy, Precision,
                                    RanksBy, StatsReport, TrafficBy)
from traceq.api import Run, Store, Trace
from traceq.errors import RegressionError, TraceqError, TraceqWarning
from traceq.render import Format, format_for, render
from traceq.store import default_store_path

# Each command calls one method of traceq.api (a Store's or a Trace's) and renders what it
# returns; the API imports the analyses (and polars with them) only when a method runs, so a
# quick `traceq top` never imports them. Option types come from the light analysis.choices.


class _Command(TyperCommand):
    """A command whose usage line names its arguments as a person writes them
    (`traceq compare [OPTIONS] A B`; typer writes required ones as `{A} {B}`)."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:  # type: ignore[override]
        return [re.sub(r"\{([^{}]*)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]


class _Typer(typer.Typer):
    """typer.Typer whose commands are `_Command`s."""

    def command(self, *args, cls: type[TyperCommand] = _Command, **kwargs):  # type: ignore[override]
        return super().command(*args, cls=cls, **kwargs)


app = _Typer(
    name="traceq",
    help="Which kernels, libraries and layers a GPU trace spent its time in.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def _global(ctx: typer.Context, param: typer.CallbackParam, value: object) -> object:
    """A global option's value: given after the command it wins, else the one given before it
    (`traceq --db X top` and `traceq top --db X` are the same)."""
    if value is None and ctx.parent is not None:
        return ctx.parent.params.get(param.name)
    return value.value if isinstance(value, Enum) else value  # typer converts what this returns again


# The global options: accepted before the command (by `_main`) and after it (by each command
# that declares them, with these same aliases). A new command takes them by declaring
# `db: DbOpt = None`, `fmt: FormatOpt = None`, `out: OutOpt = None`, and a reading command
# `dataset: DatasetOpt = None` too; `_store(db, dataset)` opens what they name.
DbOpt = Annotated[
    Optional[Path],
    typer.Option("--db", callback=_global, show_default=False,
                 help="Store file [default: $TRACEQ_DB, else ./traceq.duckdb]"),
]
FormatOpt = Annotated[
    Optional[Format],
    typer.Option("--format", "-f", callback=_global, show_default=False,
                 help="table, csv or json [default: from -o's suffix, else table]"),
]
DatasetOpt = Annotated[
    Optional[Path],
    typer.Option("--dataset", callback=_global, show_default=False,
                 help="Read (or with load, write) this Parquet dataset folder instead of the store"),
]
OutOpt = Annotated[Optional[Path], typer.Option("--output", "-o", callback=_global, show_default=False,
                                                help="Write to this file instead of stdout")]
GLOBAL_OPTIONS = {"db": "--db", "dataset": "--dataset", "fmt": "--format", "out": "--output"}
"""Parameter name -> option, for the options above."""
TraceOpt = Annotated[
    Optional[str], typer.Option("--trace", "-t", help="Trace name or id [default: the latest loaded]")
]


def _err(message: str) -> None:
    """One line on stderr, whatever the message holds (a quoted file's newlines)."""
    typer.echo("traceq: " + " ".join(message.splitlines()), err=True)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a TraceqError into one line on stderr and its exit status (1; 3 for a failed gate), and
    each TraceqWarning the API gives into a `traceq: note: ...` line."""
    notes: list[warnings.WarningMessage] = []
    try:
        try:
            with warnings.catch_warnings(record=True) as notes:
                warnings.simplefilter("always", TraceqWarning)
                yield
        finally:  # outside catch_warnings: showing a warning there would record it again
            said = set()
            for note in notes:
                if issubclass(note.category, TraceqWarning):
                    if str(note.message) not in said:  # the same trace twice (compare A A) says it once
                        _err(f"note: {note.message}")
                        said.add(str(note.message))
                else:
                    warnings.showwarning(note.message, note.category, note.filename, note.lineno)
    except TraceqError as e:
        _err(str(e))
        raise typer.Exit(code=e.exit_code) from None
    except KeyboardInterrupt:
        _err("interrupted")
        raise typer.Exit(code=130) from None
    except RuntimeError as e:  # DuckDB's form of Ctrl-C when it arrives inside a query
        if str(e) != "Query interrupted":
            raise
        _err("interrupted")
        raise typer.Exit(code=130) from None


def _store(db: Path | None, dataset: Path | None = None, **kwargs: bool) -> Store:
    """The store `db` names (or the default one), or the dataset `dataset` names (read-only)."""
    if dataset is None:
        return Store(db or default_store_path(), on_wait=_WaitNotice(), **kwargs)
    if db is not None:
        raise typer.BadParameter("give --db or --dataset, not both", param_hint="--dataset")
    return Store(dataset=dataset, **kwargs)


class _WaitNotice:
    """Says on a terminal that the store is busy, on a line erased when the wait ends: a refusal
    after the wait is then the only line, as every refusal is. Off a terminal it says nothing
    (the refusal says how long it waited)."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, message: str) -> None:
        if sys.stderr.isatty():
            sys.stderr.write(f"traceq: {message}")
            sys.stderr.flush()
            self.shown = True

    def clear(self) -> None:  # called by Store when its open ends, waited or not
        if self.shown:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self.shown = False


def _emit(text: str, out: Path | None) -> None:
    if out is None:
        typer.echo(text, nl=not text.endswith("\n"))
    else:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as e:
            raise TraceqError(f"cannot write {out}: {e.strerror}") from None
        _err(f"wrote {out}")


def _show_trace_table(
    trace: str | None, db: Path | None, dataset: Path | None, fmt: Format | None, out: Path | None,
    build: Callable[[Trace], tuple[object, str]],
) -> None:
    """The body every per-trace command shares: open the store (or dataset) read-only, find the
    trace, `build(trace) -> (frame, title)`, render and write it."""
    with user_errors():
        t = _store(db, dataset).trace(trace)
        with _working(t.name):
            frame, title = build(t)
        _emit(render(frame, format_for(fmt, out), title=title, width=_terminal_width()), out)


def _show_run_table(
    run: str | None, db: Path | None, dataset: Path | None, fmt: Format | None, out: Path | None,
    build: Callable[[Run, Callable[[int, int], None]], tuple[object, str]],
) -> None:
    """`_show_trace_table` for the commands over a run: `build(run, progress) -> (frame, title)`,
    progress a bar (after a second, on a terminal) over the run's traces."""
    with user_errors():
        r = _store(db, dataset).run(run)
        progress = _LazyProgress(f"reading {r.name}")
        try:
            frame, title = build(r, progress)
        finally:
            progress.close()
        _emit(render(frame, format_for(fmt, out), title=title, width=_terminal_width()), out)


def _terminal_width() -> int:
    """The terminal's width ($COLUMNS first); 160 when output is not a terminal."""
    return shutil.get_terminal_size(fallback=(160, 24)).columns


class _LazyProgress:
    """A progress bar on stderr, shown only on a terminal and only after the first second."""

    def __init__(self, label: str, delay_s: float = 1.0):
        self.label = label
        self.started = time.monotonic()
        self.delay_s = delay_s
        self.enabled = sys.stderr.isatty()
        self.bar = None
        self.task = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            if time.monotonic() - self.started < self.delay_s:
                return
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@contextmanager
def _working(label: str, delay_s: float = 1.0) -> Iterator[None]:
    """A spinner on stderr with the seconds spent, while a command computes something it has no
    steps of to count: on a terminal only, from its first second on, erased before the output."""
    if not sys.stderr.isatty():
        yield
        return
    import threading

    lock = threading.Lock()
    shown: list = []
    finished = threading.Event()

    def show() -> None:
        if finished.wait(delay_s):
            return
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with lock:
            if not finished.is_set():
                bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                               console=Console(stderr=True), transient=True)
                bar.add_task(label, total=None)
                bar.start()
                shown.append(bar)

    timer = threading.Thread(target=show, daemon=True)
    timer.start()
    try:
        yield
    finally:
        with lock:
            finished.set()
            for bar in shown:
                bar.stop()


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"traceq {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit")] = False,
    rules: Annotated[Optional[Path], typer.Option(
        "--rules", envvar="TRACEQ_RULES", show_default=False,
        help="Kernel classification rules (TOML, the format of analysis/kernel_rules.toml) "
             "tried before the packaged ones")] = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Which kernels, libraries and layers a GPU trace spent its time in."""
    from traceq.analysis.classify import use_rules

    sub = ctx.invoked_subcommand
    command = ctx.command.get_command(ctx, sub) if sub else None  # type: ignore[attr-defined]
    takes = {p.name for p in command.params} if command is not None else set()
    for name, option in GLOBAL_OPTIONS.items():
        if ctx.params.get(name) is not None and name not in takes:
            raise typer.BadParameter(f"`traceq {sub}` takes no {option}", param_hint=option)
    with user_errors():
        use_rules(rules)  # a bad rules file fails here, in one line, before any work


@app.command()
def load(
    paths: Annotated[list[Path], typer.Argument(help="Nsight Systems SQLite exports, nvprof databases or "
                                               "PyTorch profiler (Kineto) JSON traces",
                                               metavar="PATH...", show_default=False)],
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    name: Annotated[Optional[str], typer.Option(help="Name in the store [default: the file's name "
                                                     "without its suffix]")] = None,
    replace: Annotated[bool, typer.Option(help="Replace a trace with the same content or name")] = False,
    export: Annotated[bool, typer.Option(help="Run `nsys export` first on .nsys-rep/.qdrep files")] = False,
    python_functions: Annotated[bool, typer.Option(
        "--python-functions", help="Kineto traces: keep the python_function events (with_stack=True) as ranges")] = False,
    attribute: Annotated[Optional[bool], typer.Option(
        "--attribute/--no-attribute", show_default=False,
        help="Keep each launch's layer, pass, library, ... in the store [default: for traces of up to 1M kernels; "
             "above, `traceq attribute` does]")] = None,
    run: Annotated[Optional[str], typer.Option(
        help="Load the files as the ranks of one run (one file per rank or node), in one transaction",
        show_default=False)] = None,
    scheduler: Annotated[Optional[str], typer.Option(
        help="With --dataset: the Dask scheduler's address (tcp://host:8786) or scheduler file "
             "[default: a local cluster]", show_default=False)] = None,
    workers: Annotated[Optional[int], typer.Option(
        min=1, help="With --dataset and no --scheduler: local Dask workers [default: one per core]",
        show_default=False)] = None,
) -> None:
    """Load trace files into the store (one transaction each, or one for all with --run), or with
    --dataset into a Parquet dataset, one Dask task per file."""

    with user_errors():
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
                typer.echo(f"{path} is already loaded as {result.name!r} (trace {result.trace_id}); "
                           "nothing changed (use --replace to load it again)")
                continue
            rows = result.rows
            typer.echo(
                f"{result.status} {result.name!r} (trace {result.trace_id}) from {path}: "
                f"{result.kernel_count:,} kernels, {rows.get('api_events', 0):,} API calls, "
                f"{rows.get('memops', 0):,} memcpy/memset, {rows.get('nvtx_events', 0):,} NVTX events "
                f"in {result.seconds:.2f} s" + "".join(f"; {note}" for note in result.notes)
            )


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
        typer.echo(f"run {run!r} is already loaded from these {len(paths)} files; nothing changed "
                   "(use --replace to load it again)")
        return
    for path, result in zip(paths, r.load_results):
        typer.echo(f"{result.status} {result.name!r} (trace {result.trace_id}) from {path}: "
                   f"{result.kernel_count:,} kernels in {result.seconds:.2f} s")
    _said_run(r, len(paths))


def _said_run(r: Run, files: int, where: str = "") -> None:
    """The line `traceq load --run` ends with: the run's ranks and the largest clock shift."""
    from traceq.render.columns import format_duration

    shift = f"; clocks aligned on collectives, largest shift {format_duration(r.max_shift_ns)}" if files > 1 else ""
    typer.echo(f"run {r.name!r}: {r.world_size} ranks{shift} (`traceq ranks {r.name}{where}`)")


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
        typer.echo(f"all {len(paths)} file(s) are already in {dataset}; nothing changed")
        return
    if done.workers:
        kernels = sum(e.kernels or 0 for e in done.loaded)
        there = f"; {len(done.skipped)} already there" if done.skipped else ""
        typer.echo(f"loaded {len(done.loaded)} trace(s) into {dataset} ({kernels:,} kernels{there}) "
                   f"on {done.workers} Dask worker(s) in {done.seconds:.2f} s")
    for entry in done.loaded:  # a damaged file's repairs, as `traceq load` says them
        if entry.notes:
            typer.echo(f"{entry.name!r} (trace {entry.trace_id}) from {entry.source_path}: {'; '.join(entry.notes)}")
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


@app.command()
def traces(db: DbOpt = None, dataset: DatasetOpt = None, fmt: FormatOpt = None, out: OutOpt = None) -> None:
    """List the traces in the store."""
    with user_errors():
        store = _store(db, dataset)
        frame = store.traces()
        fmt = format_for(fmt, out)
        if fmt is Format.table:
            frame = frame.drop("sha256", "source_path", "loaded_at")
        _emit(render(frame, fmt, title=f"{len(frame)} trace(s) in {store.path}", width=_terminal_width()), out)


@app.command()
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
    from traceq.render.columns import format_duration

    # a DuckDB relation: without polars, `traceq top` on a big trace (library column only) runs
    # in a fraction of a second
    def build(t: Trace):
        ranking = t.top_relation(k, by, instances=instances, context=context)
        if instances:
            return ranking, f"{t.name}: the {len(ranking)} longest kernel launches"
        return ranking, (f"{t.name}: top {len(ranking)} kernels by total time "
                         f"(all kernels: {format_duration(t.kernel_time_ns())} of GPU time)")

    _show_trace_table(trace, db, dataset, fmt, out, build)


IterOpt = Annotated[
    Optional[str], typer.Option("--iteration-regex", help="Regex naming iteration ranges [default: 'iteration N' or 'step N']")
]


@app.command()
def layers(trace: TraceOpt = None, db: DbOpt = None, dataset: DatasetOpt = None, iteration_regex: IterOpt = None,
           fmt: FormatOpt = None, out: OutOpt = None) -> None:
    """GPU time per NVTX layer and pass, with its heaviest kernel, library split and how its kernels were placed."""
    def build(t: Trace):
        frame = t.layers(iteration_regex=iteration_regex)
        shares = t.attribution_shares(iteration_regex=iteration_regex)
        return frame, (f"{t.name}: GPU time per layer and pass ({shares['range']:.1f} % of kernel time inside "
                       f"a layer range, {shares['rule']:.1f} % placed by rule, {shares['none']:.1f} % in no layer: "
                       "see Attribution)")

    _show_trace_table(trace, db, dataset, fmt, out, build)


@app.command()
def libs(by_layer: Annotated[bool, typer.Option("--by-layer", help="One row per layer, pass and library")] = False,
         trace: TraceOpt = None, db: DbOpt = None, dataset: DatasetOpt = None, iteration_regex: IterOpt = None,
         fmt: FormatOpt = None, out: OutOpt = None) -> None:
    """GPU time per library (cuDNN, cuBLAS, NCCL, PyTorch ATen, ...), optionally per layer."""
    _show_trace_table(trace, db, dataset, fmt, out, lambda t: (
        t.libs(by_layer=by_layer, iteration_regex=iteration_regex),
        f"{t.name}: GPU time per library" + (" and layer" if by_layer else "")))


@app.command()
def stages(trace: TraceOpt = None, db: DbOpt = None, dataset: DatasetOpt = None, iteration_regex: IterOpt = None,
           fmt: FormatOpt = None, out: OutOpt = None) -> None:
    """GPU time per iteration in data copy, forward, backward and weight update, and GPU idle time."""
    _show_trace_table(trace, db, dataset, fmt, out, lambda t: (
        t.stages(iteration_regex=iteration_regex), f"{t.name}: GPU time per iteration and stage"))


@app.command()
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
    from traceq.render.columns import format_duration

    def build(t: Trace):
        frame = t.idle(by, iteration_regex=iteration_regex)
        totals = t.idle_totals(iteration_regex=iteration_regex)
        share = f" ({100 * totals.idle_ns / totals.span_ns:.1f} %)" if totals.span_ns else ""
        title = (f"{t.name}: GPU idle {format_duration(totals.idle_ns)} of {format_duration(totals.span_ns)}"
                 f"{share} on {totals.devices} device(s)")
        if totals.iterations:
            title += f", {format_duration(totals.idle_ns / totals.iterations)} per iteration ({totals.iterations})"
        return frame, f"{title}; by cause" + (f" and {by.value}" if by is not None else "")

    _show_trace_table(trace, db, dataset, fmt, out, build)


@app.command()
def launches(
    k: Annotated[Optional[int], typer.Option("--k", "-k", min=1, help="Show only the k rows with most launch time")] = None,
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Launch overhead per kernel: launch call time, queue delay and kernel time, and the tiny kernels."""
    from traceq.render.columns import format_duration

    def build(t: Trace):
        totals = t.launch_totals()
        title = (f"{t.name}: {totals['launches']:,} launches, {format_duration(totals['api_ns'])} in launch calls "
                 f"for {format_duration(totals['kernel_ns'])} of kernels; {totals['tiny']:,} tiny "
                 f"({totals['tiny_pct']:.1f} %: the kernel ran shorter than its launch call)")
        return t.launches(k=k), title

    _show_trace_table(trace, db, dataset, fmt, out, build)


@app.command()
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
    _show_trace_table(trace, db, dataset, fmt, out, lambda t: (
        t.stats(report), f"{t.name}: {report.value} (as `nsys stats --report {report.value}`)"))


@app.command()
def advise(
    trace: TraceOpt = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """What to change first: findings ranked by GPU time at stake, with evidence and the usual fix."""
    from traceq.render.columns import format_duration
    from traceq.render.findings import render_findings

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


@app.command()
def rm(
    trace: Annotated[str, typer.Argument(help="Trace name or id, or a run's name (all its traces)",
                                         metavar="TRACE", show_default=False)],
    db: DbOpt = None,
) -> None:
    """Remove a trace, or a run and all its traces, from the store."""
    with user_errors():
        removed = _store(db, lazy=True).remove(trace)
        if len(removed) > 1:
            typer.echo(f"removed run {trace!r} and its {len(removed)} traces")
        else:
            typer.echo(f"removed {removed[0][1]!r} (trace {removed[0][0]})")


@app.command()
def sql(
    query: Annotated[Optional[str], typer.Argument(
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


@app.command()
def attribute(
    trace: Annotated[Optional[str], typer.Argument(help="Trace name or id [default: the latest loaded]",
                                                   metavar="[TRACE]", show_default=False)] = None,
    db: DbOpt = None,
) -> None:
    """Keep each kernel launch's layer, pass, iteration, stage, library and precision in the store (view kernels_attributed)."""
    with user_errors():
        started = time.monotonic()
        trace_id, trace_name = _store(db, lazy=True).attribute(trace)
        typer.echo(f"attributed {trace_name!r} (trace {trace_id}) in {time.monotonic() - started:.2f} s")


@app.command()
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


CcOpt = Annotated[Optional[str], typer.Option("--cc", help="Compute capability, e.g. 9.0 [default: from the trace]",
                                               show_default=False)]
SmsOpt = Annotated[Optional[int], typer.Option("--sms", min=1, help="SM count [default: from the trace]",
                                                show_default=False)]


@app.command()
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


SpecOpt = Annotated[Optional[Path], typer.Option("--spec", help="Model spec (TOML) giving each layer's shapes "
                                                 "(see docs/flops.md) [default: shapes recorded in the trace]")]
BatchOpt = Annotated[Optional[int], typer.Option("--batch", min=1, help="Batch size for --spec [default: read "
                                                 "from the trace's input copies, else the spec's]")]


@app.command()
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


@app.command()
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


@app.command()
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


RunArg = Annotated[Optional[str], typer.Argument(
    help="Run (or one of its traces) by name or id [default: the latest loaded]", metavar="[RUN]",
    show_default=False)]


def _gpus(r: Run) -> str:
    return f"{r.world_size} GPU{'s' if r.world_size > 1 else ''}"


def _ranks_said(r: Run) -> str:
    return (f"{r.world_size} rank{'s' if r.world_size != 1 else ''}"
            + (", clocks aligned on collective ends" if r.clock != "one trace" else ""))


@app.command()
def comm(
    run: RunArg = None,
    by: Annotated[CommBy, typer.Option(help="One row per collective, iteration and rank, or per collective "
                                            "across ranks")] = CommBy.rank,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Collective communication (NCCL, RCCL) per collective, iteration and rank: time, bytes, algorithm and bus bandwidth, start and end skew."""
    def build(r: Run, progress):
        frame = r.comm(by, iteration_regex=iteration_regex, progress=progress)
        what = ("per collective, iteration and rank" if by is CommBy.rank
                else "per collective across ranks (time, bandwidth: on the last rank to start)")
        return frame, (f"{r.name}: collective communication {what} ({_ranks_said(r)}; "
                       "bus bandwidth = bytes / time x nccl-tests' factor)")

    _show_run_table(run, db, dataset, fmt, out, build)


@app.command()
def overlap(
    run: RunArg = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Per rank and iteration: computation, communication, the share of communication hidden under computation, exposed communication, idle time."""
    def build(r: Run, progress):
        frame = r.overlap(iteration_regex=iteration_regex, progress=progress)
        return frame, (f"{r.name}: communication against computation per rank and iteration "
                       f"({_ranks_said(r)}; hidden = communication while computation ran)")

    _show_run_table(run, db, dataset, fmt, out, build)


@app.command()
def ranks(
    run: RunArg = None,
    by: Annotated[RanksBy, typer.Option(help="One row per iteration and rank, or per late collective with "
                                             "what delayed it")] = RanksBy.iteration,
    k: Annotated[int, typer.Option("--k", "-k", min=1, help="With --by collective: how many collectives, "
                                                           "latest start first")] = 10,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    iteration_regex: IterOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Ranks side by side: iteration time, time waiting for other ranks, the slowest rank, and what delayed late collectives."""
    def build(r: Run, progress):
        frame = r.ranks(by, k=k, iteration_regex=iteration_regex, progress=progress)
        if by is RanksBy.collective:
            return frame, (f"{r.name}: the {k} collectives that started latest on their last rank, and the layer or "
                           f"kernel that ran longer there than on the others before it ({_ranks_said(r)})")
        return frame, (
            f"{r.name}: iteration time per rank ({_ranks_said(r)}; wait: in collectives for later "
            "ranks; slowest: the most time not waiting; shift: added to the rank's clock)")

    _show_run_table(run, db, dataset, fmt, out, build)


@app.command()
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
    from traceq.render.columns import format_bytes

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


@app.command()
def report(
    traces: Annotated[Optional[list[str]], typer.Argument(
        help="Traces or runs (names or ids), side by side [default: the latest loaded]", metavar="[TRACE]...",
        show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option("--output", "-o", callback=_global, show_default=False,
                                                help="The HTML file to write [default: report.html]")] = None,
    top_k: Annotated[int, typer.Option("--k", "-k", min=1, help="Rows of the longest-launches table")] = 15,
    title: Annotated[Optional[str], typer.Option("--title", help="Page title [default: the trace names]")] = None,
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


@app.command()
def export(
    trace: Annotated[Optional[str], typer.Argument(help="Trace name or id [default: the latest loaded]",
                                                   metavar="[TRACE]", show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option(
        "--output", "-o", callback=_global, show_default=False,
        help="The file to write; .gz compresses it [default: TRACE.json.gz]")] = None,
    export_format: Annotated[ExportFormat, typer.Option(
        "--format", "-f", help="perfetto: Chrome trace events (Perfetto, chrome://tracing)")] = ExportFormat.perfetto,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
) -> None:
    """Write a trace's kernels, memcpys, API calls and NVTX ranges as a timeline Perfetto opens."""
    with user_errors():
        started = time.monotonic()
        t = _store(db, dataset).trace(trace)
        out = out or Path(f"{t.name}.json.gz")
        progress = _LazyProgress(f"exporting {t.name}")
        try:
            written = t.export(out, format=export_format.value, progress=progress)
        finally:
            progress.close()
        typer.echo(f"wrote {out}: {written['kernel']:,} kernels, {written['memop']:,} memory operations, "
                   f"{written['cuda_api']:,} API calls, {written['nvtx_range'] + written['nvtx_async'] // 2:,} NVTX "
                   f"ranges, {written['flow'] // 2:,} launch flows in {time.monotonic() - started:.1f} s")


def main() -> None:
    """Console-script entry point."""
    app(prog_name="traceq")


__all__: list[Callable[..., object] | str] = ["app", "main"]
