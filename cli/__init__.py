"""The `traceq` command: a thin layer over the Python API (traceq.api) and the renderers
(traceq.render). Each command opens the store, calls one API method, and renders its frame.

`base.py` holds the typer application, its global options and how a command reports an error;
each module beside it holds one family of commands (loading, tables, timeline, comparing,
multigpu, output), registered on the application when this package is imported.

Errors the user can fix (TraceqError) become one line `traceq: ...` on stderr and exit status 1
(3 for a regression `compare --gate` found); usage errors exit 2 (typer's convention). Anything
else is a bug and shows a traceback.
"""

from __future__ import annotations

from traceq.cli import comparing, critical, loading, multigpu, output, tables, timeline  # noqa: F401 (registers the commands)
from traceq.cli.base import app

_ORDER = ("load", "traces", "top", "layers", "libs", "stages", "idle", "launches", "critical", "whatif", "stats", "advise", "rm", "sql",
          "attribute", "occupancy", "ru", "ce", "traffic", "compare", "comm", "overlap", "ranks", "memory", "report",
          "export")
"""The commands in the order `traceq --help` lists them."""

app.registered_commands.sort(key=lambda c: _ORDER.index(c.callback.__name__))


def main() -> None:
    """Console-script entry point."""
    app(prog_name="traceq")


__all__ = ["app", "main"]
