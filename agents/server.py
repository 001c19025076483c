"""The MCP server over stdio (`traceq mcp`): lists `tools.TOOLS`, calls one per request, and
serves the docs pages as resources. A call never crashes the server: arguments that do not fit
the tool's schema, an unknown tool or trace, and traceq's own errors come back as error results
with the one line the CLI would print; anything else as an error result naming the exception."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traceq import __version__
from traceq.agents.tools import DEFAULT_LIMIT, TOOLS, bounded
from traceq.errors import TraceqError
from traceq.text import visible

DOCS = Path(__file__).resolve().parent.parent / "docs"
DOCS_URI = "traceq://docs/"


def call(store: Path | None, name: str, arguments: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str | None]:
    """(result, None) or (None, one-line error) of tool `name` on `arguments`: the server's work
    without the protocol, which the tests call directly too."""
    import jsonschema

    tool = TOOLS.get(name)
    if tool is None:
        return None, f"unknown tool {name!r}: the tools are {', '.join(TOOLS)}"
    args = dict(arguments or {})
    try:
        jsonschema.validate(args, tool.schema)
    except jsonschema.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path) or "arguments"
        return None, f"{name}: {where}: {visible(e.message)}"
    limit = args.pop("limit", DEFAULT_LIMIT)
    args = {k: v for k, v in args.items() if v is not None}
    try:
        return bounded(tool.call(store, args), limit), None
    except TraceqError as e:
        return None, visible(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except Exception as e:  # noqa: BLE001 (a tool call never takes the server down)
        return None, f"{name} failed: {type(e).__name__}: {visible(str(e).splitlines()[0] if str(e) else '')}"


def docs_pages() -> dict[str, Path]:
    """The docs pages served as resources (uri -> file)."""
    return {DOCS_URI + p.name: p for p in sorted(DOCS.glob("*.md"))} if DOCS.is_dir() else {}


def build(store: Path | None):  # -> mcp.server.lowlevel.Server
    import mcp_types as types
    from mcp.server.lowlevel import Server

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name=t.name, description=t.description, input_schema=t.schema) for t in TOOLS.values()])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        import anyio

        result, error = await anyio.to_thread.run_sync(call, store, params.name, params.arguments)
        if error is not None:
            return types.CallToolResult(content=[types.TextContent(text=error)], is_error=True)
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(result, default=str))],
                                    structured_content=json.loads(json.dumps(result, default=str)))

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=uri, name=path.stem, mime_type="text/markdown") for uri, path in docs_pages().items()])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        path = docs_pages().get(str(params.uri))
        if path is None:
            raise ValueError(f"no such resource: {params.uri!r} (list_resources gives them)")
        return types.ReadResourceResult(contents=[
            types.TextResourceContents(uri=str(params.uri), mime_type="text/markdown", text=path.read_text())])

    return Server("traceq", version=__version__, instructions=(
        "traceq answers where a GPU trace's time went. Load a trace file with `load`, then ask `top`, "
        "`layers`, `stages`, `advise`; `sql` runs a read-only query (tables: traceq://docs/schema.md)."),
        on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
        on_read_resource=read_resource)


def serve(store: Path | None) -> None:
    """Run the server on stdin/stdout until the client closes them."""
    import anyio
    from mcp.server.stdio import stdio_server

    server = build(store)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
