"""The tools an agent calls: one per traceq command, each a call of the Python API with its
arguments checked against a schema made from the API's signature, its result bounded JSON.

Every table is returned as records (`rows`, at most `limit`, default 50) with its `columns`,
`row_count` and `truncated`; a text field longer than TEXT_CAP characters is cut with its length
said; the whole result stays under RESULT_CAP characters (rows are dropped until it does). Field
names are the API's, which carry their unit (`total_ns`, `pct`, `bytes`). The store is opened
read-only for every tool but `load` (and `report`, which only writes its HTML file)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from traceq.agents.schema import parameters_schema
from traceq.api.run import Run
from traceq.api.store import Store
from traceq.api.trace import Trace
from traceq.errors import TraceqError
from traceq.text import visible

TEXT_CAP = 500
"""Longest text field returned (characters); kernel names past it are cut in the middle."""
RESULT_CAP = 60_000
"""Longest result (characters of JSON): an agent's context is not flooded by one call."""
DEFAULT_LIMIT, MAX_LIMIT = 50, 1000

_TRACE = {"type": ["string", "integer", "null"], "default": None,
          "description": "a trace's name or id (default: the latest loaded)"}
_RUN = {"type": ["string", "integer", "null"], "default": None,
        "description": "a run's name or id, or a trace of it (default: the latest loaded)"}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT,
          "description": f"most rows returned (the result says row_count and truncated; at most {MAX_LIMIT})"}
_SKIP = ("progress", "context", "on_wait", "note")


@dataclass(frozen=True)
class Tool:
    """One tool: its name and description as an agent sees them, the JSON schema of its
    arguments, and `call(store_path, arguments)` returning what becomes its JSON result."""

    name: str
    description: str
    schema: dict[str, Any]
    call: Callable[[Path | None, dict[str, Any]], Any]


def _doc(function: Callable[..., Any]) -> str:
    """A method's docstring as one paragraph: what the tool answers and which fields it gives."""
    text = (function.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(text.split())


def _trace_tool(name: str, *, description: str | None = None) -> Tool:
    method = getattr(Trace, name)

    def call(store: Path | None, args: dict[str, Any]) -> Any:
        ref = args.pop("trace", None)
        with Store(store) as s:
            return method(s.trace(ref), **args)

    schema = parameters_schema(method, skip=_SKIP, extra={"trace": dict(_TRACE)})
    return Tool(name, description or _doc(method), schema, call)


def _run_tool(name: str) -> Tool:
    method = getattr(Run, name)

    def call(store: Path | None, args: dict[str, Any]) -> Any:
        ref = args.pop("run", None)
        with Store(store) as s:
            return method(s.run(ref), **args)

    return Tool(name, _doc(method), parameters_schema(method, skip=_SKIP, extra={"run": dict(_RUN)}), call)


def _whatif(store: Path | None, args: dict[str, Any]) -> Any:
    """`whatif` returns (frame, assumptions): the frame bounded, the assumptions beside it."""
    ref = args.pop("trace", None)
    with Store(store) as s:
        frame, assumptions = s.trace(ref).whatif(**args)
    return {"frame": frame, "assumptions": assumptions}


def _load(store: Path | None, args: dict[str, Any]) -> Any:
    path = args.pop("path")
    with Store(store, lazy=True) as s:
        trace = s.load(path, **args)
        return {"trace_id": trace.id, "name": trace.name, **{k: v for k, v in trace.info().items() if k != "name"}}


def _traces(store: Path | None, args: dict[str, Any]) -> Any:
    with Store(store) as s:
        return s.traces()


def _sql(store: Path | None, args: dict[str, Any]) -> Any:
    with Store(store) as s:
        return s.sql(args["query"])


def _compare(store: Path | None, args: dict[str, Any]) -> Any:
    ref = args.pop("trace", None)
    with Store(store) as s:
        return s.trace(ref).compare(s.trace(args.pop("other")), **args)


def _report(store: Path | None, args: dict[str, Any]) -> Any:
    path = Path(args.pop("path"))
    if path.suffix.lower() not in (".html", ".htm"):
        raise TraceqError(f"report: the path must end in .html ({str(path)!r} given)")
    if path.exists() and not args.pop("overwrite", False):
        raise TraceqError(f"report: {str(path)!r} exists (overwrite: true replaces it)")
    args.pop("overwrite", None)
    with Store(store) as s:
        html = s.report(args.pop("traces", None), **args)
    path.write_text(html, encoding="utf-8")
    return {"path": str(path), "bytes": len(html.encode())}


def _tools() -> dict[str, Tool]:
    tools = [
        Tool("load", _doc(Store.load), parameters_schema(Store.load, skip=_SKIP, extra={
            "path": {"type": "string", "description": "the trace file to load (nsys SQLite, nvprof, Kineto JSON)"}}),
            _load),
        Tool("traces", _doc(Store.traces), parameters_schema(Store.traces), _traces),
        *(_trace_tool(n) for n in ("top", "layers", "libs", "stages", "ce", "ru", "idle", "launches", "memory",
                                   "advise", "critical")),
        Tool("whatif", _doc(Trace.whatif) + " Returns the frame and the assumptions each change makes.",
             parameters_schema(Trace.whatif, skip=_SKIP, extra={"trace": dict(_TRACE)}), _whatif),
        Tool("compare", _doc(Trace.compare), parameters_schema(Trace.compare, skip=(*_SKIP, "other"), extra={
            "trace": dict(_TRACE), "other": {"type": ["string", "integer"], "description": "the trace to compare with"}}),
            _compare),
        *(_run_tool(n) for n in ("comm", "overlap", "ranks")),
        Tool("sql", _doc(Store.sql) + " Tables: docs/schema.md (resource traceq://docs/schema.md).",
             parameters_schema(Store.sql), _sql),
        Tool("report", _doc(Store.report) + " Written to `path` (.html); the result gives its size.",
             parameters_schema(Store.report, extra={
                 "path": {"type": "string", "description": "where to write the HTML report (.html)"},
                 "overwrite": {"type": "boolean", "default": False},
                 "traces": {"type": ["array", "null"], "items": {"type": ["string", "integer"]}, "default": None,
                            "description": "traces side by side (names or ids; default: the latest loaded)"}}),
             _report),
    ]
    for tool in tools:  # every table a tool returns is bounded by `limit`
        tool.schema["properties"].setdefault("limit", dict(_LIMIT))
    return {t.name: t for t in tools}


TOOLS = _tools()


def _cap(value: Any) -> Any:
    """`value` as JSON data: text escaped (`visible`) and cut at TEXT_CAP, decimals (SQL sums)
    as numbers, times as ISO text."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (datetime, date, timedelta)):
        return str(value) if isinstance(value, timedelta) else value.isoformat()
    if isinstance(value, str):
        value = visible(value, keep_newlines=True)
        if len(value) > TEXT_CAP:
            half = TEXT_CAP // 2
            return f"{value[:half]}…[{len(value):,} characters]…{value[-half:]}"
        return value
    if isinstance(value, list):
        return [_cap(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _cap(v) for k, v in value.items()}
    return value


def bounded(result: Any, limit: int) -> dict[str, Any]:
    """A tool's result as JSON-ready data: a DataFrame as at most `limit` records, the whole under
    RESULT_CAP characters of JSON."""
    import polars as pl

    if isinstance(result, dict) and isinstance(result.get("frame"), pl.DataFrame):  # whatif: a frame and notes
        return {**bounded(result["frame"], limit), "assumptions": _cap(result["assumptions"])}
    if not isinstance(result, pl.DataFrame):
        return {"result": _cap(result)}
    rows = [_cap(r) for r in result.head(limit).to_dicts()]
    out = {"columns": result.columns, "row_count": result.height, "rows": rows,
           "truncated": result.height > len(rows)}
    while rows and len(json.dumps(out, default=str)) > RESULT_CAP:
        del rows[max(1, len(rows) * 3 // 4):]
        out["truncated"] = True
    return out
