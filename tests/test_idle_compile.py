"""GPU idle while the host compiles (torch.compile): `traceq idle`'s Compile cause and the
`recompilation` finding's stake, against docs/idle.md's rule applied naively to the raw Kineto
JSON: a plain loop over each device's work, the gaps between its busy spells, and a gap whose
issuing call had not returned when the device went idle is Compile when the compile ranges of
the call's process (names as docs/structure.md lists them) cover at least half of it."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl
from conftest import sample

from traceq.analysis.advise import advise
from traceq.analysis.timeline.idle import idle_causes

COMPILE = re.compile(r"\(dynamo_timed\)$|^(entire_frame_compile|backend_compile|inductor_compile)$")
GPU = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 1}


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def compile_gaps(events: list[dict]) -> list[tuple[float, float]]:
    """(start, end) µs of every gap docs/idle.md calls Compile, from the raw events."""
    calls = {e["args"]["correlation"]: (e["pid"], e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    compiling: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("ph") == "X" and COMPILE.search(e.get("name", "")) and e.get("dur", 0) > 0:
            compiling.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    compiling = {pid: _merged(spans) for pid, spans in compiling.items()}
    devices: dict[int, list[tuple]] = {}
    for i, e in enumerate(events):
        if e.get("cat") in GPU and e.get("ph") == "X":
            devices.setdefault(e["args"].get("device", 0), []).append(
                (e["ts"], GPU[e["cat"]], i, e["ts"] + e["dur"], e["args"].get("correlation")))
    gaps = []
    for work in devices.values():
        work.sort()
        reach = work[0][3]
        for start, _, _, end, corr in work[1:]:
            if start > reach and corr in calls and calls[corr][2] > reach:
                pid = calls[corr][0]
                covered = sum(max(0.0, min(e, start) - max(s, reach)) for s, e in compiling.get(pid, []))
                if covered >= 0.5 * (start - reach):
                    gaps.append((reach, start))
            reach = max(reach, end)
    return gaps


def _load(tmp_path: Path, *paths: Path):
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    con = open_store(tmp_path / "s.duckdb", create=True)
    return con, [load_trace(con, p).trace_id for p in paths]


def test_idle_compile_equals_the_raw_rule_on_a_cold_compile(tmp_path) -> None:
    """gpt_kineto_compile_cold compiles in its first step: 95 % of its idle time is the GPU
    waiting for torch.compile, which used to read as launch-bound."""
    path = sample("conventions/gpt_kineto_compile_cold.json.gz")
    want = compile_gaps(json.loads(gzip.decompress(path.read_bytes()))["traceEvents"])
    con, (trace,) = _load(tmp_path, path)
    frame, totals = idle_causes(con, trace)
    con.close()
    row = frame.filter(pl.col("cause") == "Compile").row(0, named=True)
    total = 1000 * sum(e - s for s, e in want)
    assert row["gaps"] == len(want) and abs(row["total_ns"] - total) <= len(want) + 1
    assert row["total_ns"] > 0.9 * totals.idle_ns


def test_a_recompile_is_at_stake_with_the_idle_it_caused(tmp_path) -> None:
    """The same trace with a 300 ms compile range added in ProfilerStep#2 (tests/test_advice_catalogue.py's
    crafted recompile): at stake, the range and the Compile gaps after the second step begins,
    their union, from the raw events."""
    source = sample("conventions/gpt_kineto_compile_cold.json.gz")
    trace = json.loads(gzip.decompress(source.read_bytes()))
    events = trace["traceEvents"]
    steps = sorted((e["ts"], e) for e in events if e.get("cat") == "user_annotation"
                   and re.fullmatch(r"ProfilerStep#\d+", e.get("name", "")))
    step = next(e for _, e in steps if e["name"] == "ProfilerStep#2")
    op = next(e for e in events if e.get("cat") == "cpu_op" and step["ts"] <= e["ts"] < step["ts"] + step["dur"])
    added = (step["ts"] + 10, step["ts"] + 10 + 300_000)
    events.append({"ph": "X", "cat": "cpu_op", "name": "compile_fx_inner (dynamo_timed)", "pid": op["pid"],
                   "tid": op["tid"], "ts": added[0], "dur": 300_000, "args": {}})
    crafted = tmp_path / "recompiled.json.gz"
    crafted.write_bytes(gzip.compress(json.dumps(trace).encode()))
    second = steps[1][0]
    later = [(s, e) for s, e in compile_gaps(events) if s >= second]
    want = 1000 * sum(e - s for s, e in _merged([*later, added]))  # the only compile range after step 2 begins
    assert want > 300_000_000
    con, (tid,) = _load(tmp_path, crafted)
    frame, _ = advise(con, tid)
    con.close()
    row = frame.filter(pl.col("rule") == "recompilation").row(0, named=True)
    assert abs(row["time_ns"] - want) <= 1000
