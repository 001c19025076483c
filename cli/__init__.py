"""The `traceq` command: a thin layer over the Python API (traceq.api) and the renderers
(traceq.render). Each command opens the store, calls one API method, and renders its frame.

`base.py` holds the typer application, its global options and how a command reports an error;
each module beside it holds one family of commands (loading, tables, timeline, comparing,
multigpu, output, agents), registered on the application when this package is imported.

Errors the user can fix (TraceqError) become one line `traceq: ...` on stderr and exit status 1
(3 for a regression `compare --gate` found); usage errors exit 2 (typer's convention). Anything
else is a bug and shows a traceback.
"""

from __future__ import annotations

from traceq.cli import agents, comparing, critical, loading, mfu, multigpu, output, tables, timeline  # noqa: F401 (registers the commands)
from traceq.cli.base import app

_ORDER = ("load", "traces", "top", "layers", "libs", "stages", "idle", "launches", "critical", "whatif", "stats",
          "advise", "rm", "sql", "attribute", "occupancy", "ru", "ce", "gpumetrics", "mfu", "roofline", "traffic", "compare", "comm", "overlap", "ranks",
          "memory", "report", "export", "mcp")
"""The commands in the order `traceq --help` lists them."""

app.registered_commands.sort(key=lambda c: _ORDER.index(c.callback.__name__))


def main() -> None:
    """Console-script entry point."""
    _warn_of_namesake()
    app(prog_name="traceq")


def _warn_of_namesake() -> None:
    """One line on stderr when the unrelated `traceq` distribution (a profiler of that name on the
    package index) is installed beside ours: both write the `traceq` package, and whichever was
    installed last has overwritten files of the other. Its metadata folder sits beside the
    package (a directory listing: importlib.metadata would cost 30 ms on every command)."""
    import os
    import sys
    from pathlib import Path

    site = Path(__file__).resolve().parent.parent.parent
    try:
        names = os.listdir(site)
    except OSError:
        return
    if any(n.startswith("traceq-") and n.endswith((".dist-info", ".egg-info")) for n in names):
        print("traceq: note: an unrelated package named 'traceq' is installed in this environment and shares "
              "`import traceq`: `pip uninstall traceq`, then `pip install --force-reinstall traceq-gpu`",
              file=sys.stderr)
