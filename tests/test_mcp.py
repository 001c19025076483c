"""`traceq mcp`, driven by the MCP SDK's own client over stdio as an agent would: initialise, list
the tools, call each on a bundled sample, and see bad calls come back as error results while the
server keeps answering. The store is written by `load` alone (its bytes are compared)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")
jsonschema = pytest.importorskip("jsonschema")

import anyio
from conftest import SAMPLES
from mcp import Client
from mcp.client.stdio import StdioServerParameters

EXPECTED_TOOLS = {"load", "traces", "top", "layers", "libs", "stages", "ce", "ru", "idle", "launches", "memory",
                  "advise", "critical", "whatif", "compare", "comm", "overlap", "ranks", "sql", "report"}


def _session(db: Path, work):
    params = StdioServerParameters(command=sys.executable, args=["-m", "traceq", "mcp", "--db", str(db)])

    async def main():
        async with Client(params) as client:
            return await work(client)

    return anyio.run(main)


def _json(result) -> dict:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_agent_loads_a_trace_and_asks_every_tool(tmp_path: Path) -> None:
    db = tmp_path / "agent.duckdb"
    sample = SAMPLES / "lenet_b256_cudnn.sqlite"

    seen: dict[str, object] = {}

    async def work(client):
        tools = (await client.list_tools()).tools
        seen["tools"] = {t.name: t for t in tools}
        seen["load"] = _json(await client.call_tool("load", {"path": str(sample)}))
        seen["digest"] = _digest(db)
        for name in sorted(EXPECTED_TOOLS - {"load", "report", "sql", "compare"}):
            extra = {"spec": str(SAMPLES / "lenet.model.toml")} if name == "ce" else {}
            seen[name] = await client.call_tool(name, {"limit": 3, **extra})
        seen["compare"] = await client.call_tool("compare", {"other": 1, "limit": 3})
        seen["sql"] = _json(await client.call_tool("sql", {"query": "SELECT count(*) AS n FROM kernel_events"}))
        seen["report"] = _json(await client.call_tool("report", {"path": str(tmp_path / "r.html")}))
        seen["digest_after"] = _digest(db)
        seen["resources"] = (await client.list_resources()).resources
        seen["schema_doc"] = await client.read_resource("traceq://docs/schema.md")

    _session(db, work)
    assert set(seen["tools"]) == EXPECTED_TOOLS
    for tool in seen["tools"].values():
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        assert tool.description and tool.input_schema["properties"]["limit"]["maximum"] == 1000
    assert seen["load"]["result"]["name"] == "lenet_b256_cudnn"
    assert seen["digest_after"] == seen["digest"], "a tool other than load wrote the store"
    # the sample's kernel count, read here with sqlite3 (not through traceq)
    import sqlite3

    with sqlite3.connect(f"file:{sample}?mode=ro", uri=True) as con:
        kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert seen["sql"]["rows"] == [{"n": kernels}]
    top = _json(seen["top"])
    assert top["row_count"] == 15 and len(top["rows"]) == 3 and top["truncated"] is True
    assert "total_ns" in top["columns"]
    for name in EXPECTED_TOOLS - {"load", "report", "sql", "comm"}:
        assert not seen[name].is_error, (name, seen[name].content[0].text)
    # a single-GPU trace has no communication: said in one line, as the CLI says it
    assert seen["comm"].is_error and "communication" in seen["comm"].content[0].text
    assert (tmp_path / "r.html").stat().st_size == seen["report"]["result"]["bytes"]
    assert any(r.uri == "traceq://docs/schema.md" for r in seen["resources"])
    assert "kernel_events" in seen["schema_doc"].contents[0].text



def test_bad_calls_are_error_results_and_the_server_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "agent.duckdb"
    calls = [
        ("top", {}),                                   # no store yet
        ("load", {"path": str(tmp_path / "missing.sqlite")}),
        ("load", {"path": str(SAMPLES / "lenet_b256_cudnn.sqlite")}),
        ("top", {"k": "ten"}),                         # wrong type
        ("top", {"trace": "no-such-trace"}),           # unknown trace
        ("top", {"limit": 0}),                         # out of range
        ("layers", {"nonsense": True}),                # unknown argument
        ("no_such_tool", {}),
        ("sql", {"query": "COPY (SELECT 1) TO 'x.csv'"}),
        ("sql", {"query": "DROP TABLE kernel_events"}),
        ("report", {"path": str(tmp_path / "r.txt")}),  # not .html
        ("top", {"k": 2}),                             # still answering
    ]

    async def work(client):
        return [await client.call_tool(name, args) for name, args in calls]

    results = _session(db, work)
    errors = [r.is_error for r in results]
    assert errors == [True, True, False, True, True, True, True, True, True, True, True, False]
    for r in results:
        if r.is_error:
            text = r.content[0].text
            assert "\n" not in text and "Traceback" not in text and text
    assert "no-such-trace" in results[4].content[0].text
    assert len(json.loads(results[-1].content[0].text)["rows"]) == 2
    assert not (tmp_path / "x.csv").exists()


def test_text_fields_are_capped_and_escaped() -> None:
    import polars as pl

    from traceq.agents.tools import RESULT_CAP, TEXT_CAP, bounded

    frame = pl.DataFrame({"name": ["\x1b[2J" + "k" * 5000] * 400, "total_ns": list(range(400))})
    out = bounded(frame, 1000)
    assert len(json.dumps(out)) <= RESULT_CAP and out["truncated"] and out["row_count"] == 400
    name = out["rows"][0]["name"]
    assert name.startswith("\\x1b[2J") and len(name) < TEXT_CAP + 40 and "5,007 characters" in name  # counted once escaped


def test_sql_sums_come_back_as_numbers() -> None:
    import datetime as dt
    from decimal import Decimal

    import polars as pl

    from traceq.agents.tools import bounded

    frame = pl.DataFrame({"gpu_ns": [Decimal(58457987)], "share": [Decimal("1.5")],
                          "at": [dt.datetime(2026, 11, 28, 20, 0)]})
    assert bounded(frame, 5)["rows"] == [{"gpu_ns": 58457987, "share": 1.5, "at": "2026-11-28T20:00:00"}]
