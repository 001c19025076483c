"""`traceq export --format perfetto`: the file is read here as the Trace Event Format spec
describes it (Python's json, not our writer), and what it holds is compared with `nsys stats`
(kernel time per name, memory operations, NVTX ranges) and with the store's rows.

Perfetto's own trace processor is not run here: the `perfetto` wheel downloads its binary at
first use, which CI cannot do; tools/perfetto_check.py runs it where it is installed."""

from __future__ import annotations

import csv
import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from conftest import SAMPLES, sample
from typer.testing import CliRunner

import traceq
from traceq.cli import app

runner = CliRunner()
PHASES = {"X", "B", "E", "b", "e", "i", "s", "f", "M"}


def _events(path: Path) -> list[dict]:
    """The events of a Chrome trace file, each checked against the spec: a JSON object with a
    traceEvents array; every event a phase, integer pid and tid, numeric ts (but metadata),
    complete events a duration >= 0, async and flow events an id."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        document = json.load(f)
    assert isinstance(document, dict) and isinstance(document["traceEvents"], list)
    assert document["displayTimeUnit"] in ("ms", "ns")
    for e in document["traceEvents"]:
        assert e["ph"] in PHASES and isinstance(e["name"], str), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] in "bsef":
            assert isinstance(e["id"], int) and isinstance(e["cat"], str), e
    return document["traceEvents"]


def _export(db: Path, trace: str, out: Path) -> list[dict]:
    result = runner.invoke(app, ["export", trace, "-o", str(out), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {out}: ")
    return _events(out)


def _us(ns: int) -> float:
    return ns / 1000


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("export") / "s.duckdb"
    names = ["alexnet_b256_cudnn.sqlite", "ddp_resnet18_2gpu.sqlite", "alexnet_b256_kineto.json"]
    result = runner.invoke(app, ["load", *(str(sample(n)) for n in names), "--db", str(db)])
    assert result.exit_code == 0, result.output
    return db


def test_export_agrees_with_nsys_stats(store: Path, tmp_path: Path) -> None:
    """AlexNet: each kernel name's summed `X` durations are nsys stats' total time and
    instances; memcpys and memsets its counts; push/pop NVTX ranges per name its instances."""
    events = _export(store, "alexnet_b256_cudnn", tmp_path / "a.json.gz")
    kernels: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e["cat"] == "kernel":
            kernels[e["args"]["name"]].append(e["dur"])
    with open(SAMPLES / "alexnet_b256_cudnn.nsys_stats_kern_sum.csv", newline="") as f:
        stats = {row["Name"]: row for row in csv.DictReader(f)}
    assert set(kernels) == set(stats)
    for name, row in stats.items():
        assert len(kernels[name]) == int(row["Instances"]), name
        assert sum(kernels[name]) == pytest.approx(_us(int(row["Total Time (ns)"])), abs=1e-3), name
    with open(SAMPLES / "alexnet_b256_cudnn.nsys_stats_mem_time_sum.csv", newline="") as f:
        memops = {row["Operation"]: int(row["Count"]) for row in csv.DictReader(f)}
    counted = Counter(e["cat"] for e in events if e["ph"] == "X" and e["cat"] in ("memcpy", "memset"))
    assert counted == {"memcpy": memops["[CUDA memcpy Host-to-Device]"], "memset": memops["[CUDA memset]"]}
    with open(SAMPLES / "alexnet_b256_cudnn.nsys_stats_nvtx_sum.csv", newline="") as f:
        ranges = {row["Range"].removeprefix(":"): int(row["Instances"]) for row in csv.DictReader(f)
                  if row["Style"] == "PushPop"}
    assert Counter(e["name"] for e in events if e.get("cat") == "nvtx" and e["ph"] == "X") == ranges
    layers = Counter(e["args"]["layer"] for e in events if e.get("cat") == "kernel")
    assert layers["conv1"] > 0 and layers["fc8"] > 0


@pytest.mark.parametrize("trace", ["alexnet_b256_cudnn", "ddp_resnet18_2gpu", "alexnet_b256_kineto"])
def test_export_holds_every_event_of_the_store(store: Path, tmp_path: Path, trace: str) -> None:
    """Every kernel, memory operation, API call and NVTX range of the store is one event, on
    its device and stream or process and thread; every launch's flow starts inside its API
    call's slice and ends at its kernel's start; every track is named."""
    events = _export(store, trace, tmp_path / "t.json.gz")
    with traceq.open(store) as s:
        t = s.trace(trace)
        count = {q: t.con.execute(f"SELECT count(*) FROM {q} WHERE trace_id = ?", [t.id]).fetchone()[0]
                 for q in ("kernel_events", "memops", "api_events")}
        ranges, marks = t.con.execute("SELECT count(end_ns), count(*) - count(end_ns) FROM nvtx_events "
                                      "WHERE trace_id = ?", [t.id]).fetchone()
        launched = t.con.execute("SELECT count(*) FROM kernel_launches WHERE trace_id = ? "
                                 "AND launch_start_ns IS NOT NULL", [t.id]).fetchone()[0]
        devices = {d for (d,) in t.con.execute("SELECT DISTINCT device_id FROM kernels WHERE trace_id = ?",
                                               [t.id]).fetchall()}
    kinds = Counter((e["ph"], e.get("cat")) for e in events)
    assert kinds["X", "kernel"] == count["kernel_events"] > 0
    assert kinds["X", "memcpy"] + kinds["X", "memset"] == count["memops"]
    assert kinds["X", "cuda_api"] == count["api_events"]
    assert kinds["X", "nvtx"] + kinds["b", "nvtx"] == ranges and kinds["b", "nvtx"] == kinds["e", "nvtx"]
    assert kinds["i", "nvtx"] == marks
    assert kinds["s", "launch"] == kinds["f", "launch"] == launched > 0
    assert {e["pid"] for e in events if e.get("cat") == "kernel"} == devices
    api = defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e["cat"] == "cuda_api":
            api[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    kernel_at = {e["args"]["kernel_id"]: e for e in events if e.get("cat") == "kernel"}
    for f in (e for e in events if e["ph"] == "f"):
        s, k = starts[f["id"]], kernel_at[f["id"]]
        assert f["bp"] == "e" and (f["pid"], f["tid"], f["ts"]) == (k["pid"], k["tid"], k["ts"])
        assert any(a <= s["ts"] <= b for a, b in api[s["pid"], s["tid"]]), s
    named = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events if e["ph"] in "Xi"} <= named


def test_export_refuses_in_one_line_and_leaves_no_file(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.json.gz"
    result = runner.invoke(app, ["export", "nope", "-o", str(out), "--db", str(store)])
    assert result.exit_code == 1 and result.stderr.startswith("traceq: no trace 'nope'")
    assert not out.exists() and not list(tmp_path.iterdir())
    with traceq.open(store) as s, pytest.raises(traceq.TraceqError, match="unknown format"):
        s.trace("alexnet_b256_cudnn").export(out, format="json")


def test_export_format_is_to_and_f_means_one_thing(store: Path, tmp_path: Path) -> None:
    """`-f` is the output format of tables in every command (issue 34): export's timeline format
    is `--to`; its old spelling `--format`/`-f perfetto` still writes the same file, with one note
    on stderr, for one release; `-f json` there is a usage error."""
    new, old = tmp_path / "new.json.gz", tmp_path / "old.json.gz"
    result = runner.invoke(app, ["export", "alexnet_b256_cudnn", "--to", "perfetto", "-o", str(new), "--db", str(store)])
    assert result.exit_code == 0 and not result.stderr, result.output
    result = runner.invoke(app, ["export", "alexnet_b256_cudnn", "-f", "perfetto", "-o", str(old), "--db", str(store)])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("\n") == 1 and "deprecated" in result.stderr and "--to perfetto" in result.stderr
    def same(path: Path) -> list[str]:  # the metadata events' order is the export's own
        return sorted(json.dumps(e, sort_keys=True) for e in _events(path))

    assert same(new) == same(old)
    assert runner.invoke(app, ["export", "alexnet_b256_cudnn", "-f", "json", "--db", str(store)]).exit_code == 2
    assert "--format" not in runner.invoke(app, ["export", "--help"], env={"COLUMNS": "200"}).stdout
