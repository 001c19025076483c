"""rocprofv3's JSON read as a stream (ingest/json_walk.py, ingest/amd_json.py): the walk gives the
values `json.loads` gives, whatever its window; a cut or damaged document raises where `json.loads`
raises; a profile loads the same with a window of a few kilobytes and its tables in any order, the
reference read here with `json` alone."""

from __future__ import annotations

import gzip
import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import shared

from traceq import TraceFormatError
from traceq.ingest import json_walk
from traceq.ingest.json_walk import Walk

KD = re.compile(r"(\s*\[clone \.kd\]|\.kd)$")
DOC = {"a": [1, -2.5e-3, True, None, "x\"y\\z\u00e9\U0001f600", {"b": []}, {}], "long": "w" * 300,
       "n": 12345678901234567890, "nested": {"k": [[1, 2], [3, {"d": "\n"}]]}, "e": [],
       "records": [{"i": i, "s": "},{" * (i % 3), "l": [{"x": i}, {"y": []}][:i % 3], "f": i / 7} for i in range(40)]}


def _read(walk: Walk, depth: int, slabs: bool = False) -> object:
    """The next value, walked member by member `depth` levels down, parsed below that (arrays in
    slabs where asked)."""
    char = walk.peek()
    if depth and char == "{":
        return {key: _read(walk, depth - 1, slabs) for key in walk.members()}
    if depth and char == "[":
        if slabs:
            return [item for slab in walk.slabs() for item in slab]
        return [_read(walk, depth - 1) for _ in walk.items()]
    return walk.value()


@pytest.mark.parametrize("block", [1, 7, 64, 300, 1 << 20])
@pytest.mark.parametrize("gz", [False, True])
def test_the_walk_gives_what_json_loads_gives_whatever_its_window(block, gz, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(json_walk, "BLOCK_CHARS", block)
    monkeypatch.setattr(json_walk, "_MARGIN", 64)
    text = json.dumps(DOC, indent=1 if block % 2 else None).encode()
    path = tmp_path / "d.json"
    path.write_bytes(gzip.compress(text) if gz else text)
    for depth, slabs in ((0, False), (1, False), (2, False), (5, False), (1, True), (2, True)):
        walk = Walk(path)
        assert _read(walk, depth, slabs) == json.loads(text)
        walk.end()
        walk.close()


def test_a_cut_or_damaged_document_raises_where_json_loads_raises(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(json_walk, "BLOCK_CHARS", 16)
    monkeypatch.setattr(json_walk, "_MARGIN", 64)
    text = json.dumps(DOC)
    rng = random.Random(35)
    cases = [text[:n] for n in range(0, len(text), 7)]
    cases += [text[:i] + c + text[i + 1:] for i, c in ((rng.randrange(len(text)), rng.choice('{}[],:"x0 '))
                                                       for _ in range(150))]
    cases.append(text + " \n")
    cases.append(text + " 1")
    path = tmp_path / "d.json"
    for case in cases:
        path.write_text(case)
        try:
            json.loads(case)
            expected = None
        except ValueError:
            expected = ValueError
        for slabs in (False, True):
            walk = Walk(path)
            try:
                _read(walk, 2, slabs)
                walk.end()
                got = None
            except ValueError:
                got = ValueError
            finally:
                walk.close()
            assert got == expected, case


def _profile(tmp_path: Path) -> tuple[dict, Counter, Counter]:
    """The real rocprofv3 JSON cut to 300 dispatches, with HIP calls added; its kernels' per-name
    totals and its calls' per-name counts, read with json here."""
    tool = json.loads(gzip.decompress(shared("realtraces", "rocpd",
                                             "AMD-AGI__TraceLens__rocprof__908_results.json.gz").read_bytes()))
    tool = tool["rocprofiler-sdk-tool"][0]
    records = tool["buffer_records"]
    records["kernel_dispatch"] = records["kernel_dispatch"][:300]
    kinds = [entry["kind"] for entry in tool["strings"]["buffer_records"]]
    hip = kinds.index("HIP_RUNTIME_API") if "HIP_RUNTIME_API" in kinds else 0
    operations = tool["strings"]["buffer_records"][hip]["operations"]
    t0 = records["kernel_dispatch"][0]["start_timestamp"]
    records["hip_api"] = [{"size": 72, "kind": hip, "operation": (7 * i) % len(operations), "thread_id": 908 + i % 2,
                           "correlation_id": {"internal": r["correlation_id"]["internal"], "external": 0},
                           "start_timestamp": r["start_timestamp"] - 500, "end_timestamp": r["start_timestamp"] - 100}
                          for i, r in enumerate(records["kernel_dispatch"][:120])]
    names = {s["kernel_id"]: s["demangled_kernel_name"] for s in tool["kernel_symbols"]}
    kernels = Counter()
    for r in records["kernel_dispatch"]:
        kernels[KD.sub("", names[r["dispatch_info"]["kernel_id"]])] += r["end_timestamp"] - r["start_timestamp"]
    calls = Counter(operations[c["operation"]] for c in records["hip_api"])
    assert t0 and len(calls) > 5
    return {"rocprofiler-sdk-tool": [tool]}, kernels, calls


def _load(path: Path, store: Path) -> tuple[Counter, Counter, list]:
    import traceq

    t = traceq.load(path, store)
    kernels = Counter(dict(t.con.execute("SELECT name, sum(dur_ns) FROM kernels WHERE trace_id = ? GROUP BY 1",
                                         [t.id]).fetchall()))
    calls = Counter(dict(t.con.execute("SELECT name, count(*) FROM api_calls WHERE trace_id = ? GROUP BY 1",
                                       [t.id]).fetchall()))
    linked = t.con.execute("SELECT count(*) FROM kernels k JOIN api_calls a USING (trace_id, correlation_id) "
                           "WHERE trace_id = ?", [t.id]).fetchall()
    t.con.close()
    return kernels, calls, linked


def test_a_profile_loads_alike_with_a_small_window_and_its_tables_in_any_order(tmp_path, monkeypatch) -> None:
    doc, kernels, calls = _profile(tmp_path)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(doc))
    tool = doc["rocprofiler-sdk-tool"][0]
    reordered = {"buffer_records": tool["buffer_records"], **{k: v for k, v in tool.items() if k != "buffer_records"}}
    turned = tmp_path / "turned.json.gz"
    turned.write_bytes(gzip.compress(json.dumps({"rocprofiler-sdk-tool": [reordered], "after": [1, 2]}).encode()))
    first = _load(plain, tmp_path / "a.duckdb")
    assert first[0] == kernels and first[1] == calls and first[2] == [(120,)]
    monkeypatch.setattr(json_walk, "BLOCK_CHARS", 4096)
    monkeypatch.setattr(json_walk, "_MARGIN", 1024)
    assert _load(turned, tmp_path / "b.duckdb") == first


@pytest.mark.parametrize("cut", [100, 900_000, -5])
def test_a_cut_profile_is_refused_in_one_line_with_a_small_window(cut, tmp_path, monkeypatch) -> None:
    import traceq

    doc, _, _ = _profile(tmp_path)
    text = json.dumps(doc)
    path = tmp_path / "cut.json"
    path.write_text(text[:cut])
    monkeypatch.setattr(json_walk, "BLOCK_CHARS", 4096)
    monkeypatch.setattr(json_walk, "_MARGIN", 1024)
    with pytest.raises(TraceFormatError, match="damaged rocprofv3 JSON"):
        traceq.load(path, tmp_path / "s.duckdb")


def test_a_bool_or_float_where_an_int_belongs_reads_as_absent_even_after_the_same_numbers(tmp_path) -> None:
    """True hashes as 1 and 512.0 as 512: the dispatches read fast (every field an int) must not
    lend their configuration to one that differs only so (read as absent, as json's types say)."""
    import traceq

    def dispatch(i: int, x: object, handle: object) -> dict:
        return {"correlation_id": {"internal": i}, "start_timestamp": 1000 * i, "end_timestamp": 1000 * i + 10,
                "dispatch_info": {"agent_id": {"handle": handle}, "queue_id": {"handle": 1}, "kernel_id": 1,
                                  "group_segment_size": 0, "private_segment_size": 0,
                                  "workgroup_size": {"x": 256, "y": 1, "z": 1}, "grid_size": {"x": x, "y": 1, "z": 1}}}

    tool = {"agents": [{"type": 2, "id": {"handle": 1}, "node_id": 1, "name": "gfx950"}],
            "kernel_symbols": [{"kernel_id": 1, "kernel_name": "k"}],
            "buffer_records": {"kernel_dispatch": [dispatch(1, 512, 1), dispatch(2, 512.0, 1), dispatch(3, 512, True),
                                                   dispatch(4, 512, 1)]}}
    path = tmp_path / "types.json"
    path.write_text(json.dumps({"rocprofiler-sdk-tool": [tool]}))
    t = traceq.load(path, tmp_path / "s.duckdb")
    rows = t.con.execute("SELECT correlation_id, grid_x, block_x FROM kernels WHERE trace_id = ? ORDER BY 1",
                         [t.id]).fetchall()
    assert rows == [(1, 2, 256), (2, None, 256), (3, 2, 256), (4, 2, 256)]
