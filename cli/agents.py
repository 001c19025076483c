"""`traceq mcp`: traceq's commands as the tools of an MCP server, for coding agents (docs/agents.md)."""

from __future__ import annotations

from pathlib import Path

from traceq.cli.base import DbOpt, app, user_errors
from traceq.errors import TraceqError
from traceq.store import default_store_path


@app.command()
def mcp(db: DbOpt = None) -> None:
    """Serve traceq's commands to a coding agent (MCP server on stdio).

    The tools are load, traces, top, layers, libs, stages, ce, ru, idle, launches, memory, advise,
    critical, whatif, compare, comm, overlap, ranks, sql (read-only) and report; the resources are
    the docs pages.
    Needs the `mcp` extra (docs/agents.md).

    Example, in an agent's MCP settings: {"command": "traceq", "args": ["mcp", "--db", "/path/traceq.duckdb"]}
    """
    with user_errors():
        try:
            import mcp  # noqa: F401
        except ImportError:
            raise TraceqError("mcp: the MCP server needs the Python MCP SDK: pip install 'traceq-gpu[mcp]'") from None
        from traceq.agents.server import serve

        serve(Path(db) if db is not None else default_store_path())


