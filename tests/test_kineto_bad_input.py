"""Bad Kineto input: one `traceq:` line on stderr, exit 1, no traceback, the store exactly as before."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import assert_load_refused, sample
from typer.testing import CliRunner

from traceq.cli import app

KERNEL = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2.25,
          "args": {"device": 0, "stream": 7, "correlation": 1}}


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    db = tmp_path / "store.duckdb"
    result = CliRunner().invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)])
    assert result.exit_code == 0, result.output
    return db


def write(path: Path, trace: object) -> Path:
    path.write_text(json.dumps(trace))
    return path


def test_truncated_gzip(store: Path, tmp_path: Path) -> None:
    whole = gzip.compress(sample("alexnet_b256_kineto.json").read_bytes())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    assert_load_refused(store, cut, "truncated", "gzip")


def test_truncated_json(store: Path, tmp_path: Path) -> None:
    text = sample("alexnet_b256_kineto.json").read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: len(text) // 2])
    assert_load_refused(store, cut, "truncated")


def test_json_that_is_not_a_trace(store: Path, tmp_path: Path) -> None:
    assert_load_refused(store, write(tmp_path / "config.json", {"model": "alexnet", "batch": 256}),
                        "not a PyTorch profiler")


def test_trace_without_gpu_events(store: Path, tmp_path: Path) -> None:
    cpu = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1, "dur": 2}
    assert_load_refused(store, write(tmp_path / "cpu.json", {"traceEvents": [cpu, cpu]}), "no GPU events")


@pytest.mark.parametrize("missing", ["ts", "dur", "name"])
def test_kernel_missing_a_field(store: Path, tmp_path: Path, missing: str) -> None:
    kernel = {k: v for k, v in KERNEL.items() if k != missing}
    trace = write(tmp_path / "k.json", {"traceEvents": [KERNEL, kernel, KERNEL]})
    assert_load_refused(store, trace, "traceEvents[1]", f'"{missing}"')


def test_events_that_are_not_objects(store: Path, tmp_path: Path) -> None:
    assert_load_refused(store, write(tmp_path / "n.json", {"traceEvents": [KERNEL, 3, KERNEL]}), "event objects")


def test_gzip_of_something_else(store: Path, tmp_path: Path) -> None:
    other = tmp_path / "x.json.gz"
    other.write_bytes(gzip.compress(b"hello, world\n" * 10))
    assert_load_refused(store, other, "not a trace traceq can read")


def test_an_error_far_into_the_file_names_its_event(store: Path, tmp_path: Path, monkeypatch) -> None:
    """With small blocks the trace is read in many batches; the message still names the event's
    index in traceEvents, counted again from the file."""
    from traceq.ingest import json_events

    monkeypatch.setattr(json_events, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(json_events, "BATCH_BYTES", 8192)
    events = [dict(KERNEL, ts=10.5 + i, args=dict(KERNEL["args"], correlation=i)) for i in range(2000)]
    del events[1234]["dur"]
    path = tmp_path / "far.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=1))
    assert_load_refused(store, path, "traceEvents[1234]", '"dur"')
