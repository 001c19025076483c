"""The `traceq` typer application: its global options, how a command opens the store, prints a
table and reports an error; the commands themselves are in the modules beside this one."""

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
from typing import Annotated

import duckdb
import typer
from typer.core import TyperCommand

from traceq import __version__
from traceq.api import Run, Store, Trace
from traceq.errors import TraceqError, TraceqWarning
from traceq.render import Format, format_for, render
from traceq.store import default_store_path
from traceq.text import visible

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


LOAD_SAMPLES = "traceq load sample_traces/*.sqlite"
"""How the samples bundled with traceq's source are loaded, which every command's example reads."""


def example(*lines: str) -> str:
    """A command's `--help` epilog: command lines that run on the bundled samples once loaded
    (tests/test_help_examples.py runs every one of them)."""
    return (f"Example, on the samples in sample_traces/ of a source checkout, loaded with `{LOAD_SAMPLES}`:\n\n"
            + "\n\n".join(lines))


app = _Typer(
    name="traceq",
    help="Which kernels, libraries and layers a GPU trace spent its time in.",
    epilog=("Example, on the samples in sample_traces/ of a source checkout (every command's --help has "
            f"one):\n\n{LOAD_SAMPLES}\n\ntraceq top -t alexnet_b256_cudnn -k 5\n\ntraceq advise -t badloop_mlp"),
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
    Path | None,
    typer.Option("--db", callback=_global, show_default=False,
                 help="Store file [default: $TRACEQ_DB, else ./traceq.duckdb]"),
]
FormatOpt = Annotated[
    Format | None,
    typer.Option("--format", "-f", callback=_global, show_default=False,
                 help="table, csv or json [default: from -o's suffix, else table]"),
]
DatasetOpt = Annotated[
    Path | None,
    typer.Option("--dataset", callback=_global, show_default=False,
                 help="Read (or with load, write) this Parquet dataset folder instead of the store"),
]
OutOpt = Annotated[Path | None, typer.Option("--output", "-o", callback=_global, show_default=False,
                                                help="Write to this file instead of stdout")]
GLOBAL_OPTIONS = {"db": "--db", "dataset": "--dataset", "fmt": "--format", "out": "--output"}
"""Parameter name -> option, for the options above."""
TraceOpt = Annotated[
    str | None, typer.Option("--trace", "-t", help="Trace name or id [default: the latest loaded]")
]


IterOpt = Annotated[
    str | None, typer.Option("--iteration-regex", help="Regex naming iteration ranges [default: 'iteration N' or 'step N']")
]
SpecOpt = Annotated[Path | None, typer.Option("--spec", help="Model spec (TOML) giving each layer's shapes "
                                                 "(see docs/flops.md) [default: shapes recorded in the trace]")]
BatchOpt = Annotated[int | None, typer.Option("--batch", min=1, help="Batch size for --spec [default: read "
                                                 "from the trace's input copies, else the spec's]")]
CcOpt = Annotated[str | None, typer.Option("--cc", help="Compute capability, e.g. 9.0 [default: from the trace]",
                                               show_default=False)]
SmsOpt = Annotated[int | None, typer.Option("--sms", min=1, help="SM count [default: from the trace]",
                                                show_default=False)]
RunArg = Annotated[str | None, typer.Argument(
    help="Run (or one of its traces) by name or id [default: the latest loaded]", metavar="[RUN]",
    show_default=False)]


def _err(message: str) -> None:
    """One line on stderr, whatever the message holds (a quoted file's newlines), its control
    characters shown as escapes (`text.visible`: a trace's names can hold terminal sequences)."""
    typer.echo("traceq: " + visible(" ".join(message.splitlines())), err=True)


def _say(message: str) -> None:
    """A line of traceq's own on stdout that quotes names from a trace or paths (the load line):
    control characters shown as escapes."""
    typer.echo(visible(message, keep_newlines=True))


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
    except duckdb.IOException as e:  # a store cut short (a copy, a full disk) fails where a query reads past its end
        if "Could not read enough bytes" not in str(e):
            raise
        _err(f"the store is damaged (cut short?): {str(e).splitlines()[0]}; copy it again, or load the traces "
             "into a new store")
        raise typer.Exit(code=1) from None
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
    """`text` on stdout (control characters shown as escapes: tables, csv and json alike, json
    having none left) or into `out` as it is."""
    if out is None:
        typer.echo(visible(text, keep_newlines=True), nl=not text.endswith("\n"))
    else:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as e:
            raise TraceqError(f"cannot write {out}: {e.strerror}") from None
        _err(f"wrote {out}")


def _show_trace_table(
    trace: str | None, db: Path | None, dataset: Path | None, fmt: Format | None, out: Path | None,
    build: Callable[[Trace], tuple[object, str]], **layout: object,
) -> None:
    """The body every per-trace command shares: open the store (or dataset) read-only, find the
    trace, `build(trace) -> (frame, title)`, render and write it (`layout`: a table's `keys` and
    `priorities`, when they are not the vocabulary's)."""
    with user_errors():
        t = _store(db, dataset).trace(trace)
        with _working(t.name):
            frame, title = build(t)
        _emit(render(frame, format_for(fmt, out), title=title, width=_terminal_width(), **layout), out)


def _show_run_table(
    run: str | None, db: Path | None, dataset: Path | None, fmt: Format | None, out: Path | None,
    build: Callable[[Run, Callable[[int, int], None]], tuple[object, str]], **layout: object,
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
        _emit(render(frame, format_for(fmt, out), title=title, width=_terminal_width(), **layout), out)


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
    rules: Annotated[Path | None, typer.Option(
        "--rules", envvar="TRACEQ_RULES", show_default=False,
        help="Kernel classification rules (TOML, the format of analysis/kernels/kernel_rules.toml) "
             "tried before the packaged ones")] = None,
    db: DbOpt = None,
    dataset: DatasetOpt = None,
    fmt: FormatOpt = None,
    out: OutOpt = None,
) -> None:
    """Which kernels, libraries and layers a GPU trace spent its time in."""
    from traceq.analysis.kernels.classify import use_rules

    sub = ctx.invoked_subcommand
    command = ctx.command.get_command(ctx, sub) if sub else None  # type: ignore[attr-defined]
    takes = {p.name for p in command.params} if command is not None else set()
    for name, option in GLOBAL_OPTIONS.items():
        if ctx.params.get(name) is not None and name not in takes:
            raise typer.BadParameter(f"`traceq {sub}` takes no {option}", param_hint=option)
    with user_errors():
        use_rules(rules)  # a bad rules file fails here, in one line, before any work


def _gpus(r: Run) -> str:
    return f"{r.world_size} GPU{'s' if r.world_size > 1 else ''}"
