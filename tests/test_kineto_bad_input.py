"""Bad Kineto input: one `traceq:` line on stderr, exit 1, no traceback, the store exactly as before."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
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
    message = assert_load_refused(store, cut, "truncated")
    assert message.count(str(cut)) == 1, message  # the file named once


def test_json_that_is_not_a_trace(store: Path, tmp_path: Path) -> None:
    assert_load_refused(store, write(tmp_path / "config.json", {"model": "alexnet", "batch": 256}),
                        "not a PyTorch profiler")


def test_trace_without_gpu_events(store: Path, tmp_path: Path) -> None:
    cpu = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1, "dur": 2}
    assert_load_refused(store, write(tmp_path / "cpu.json", {"traceEvents": [cpu, cpu]}), "no GPU events")


def test_kernel_missing_a_name(store: Path, tmp_path: Path) -> None:
    kernel = {k: v for k, v in KERNEL.items() if k != "name"}
    trace = write(tmp_path / "k.json", {"traceEvents": [KERNEL, kernel, KERNEL]})
    assert_load_refused(store, trace, "traceEvents[1]", '"name"')


def load_damaged(store: Path, path: Path, text: bytes) -> tuple[str, list[tuple]]:
    """Load `text` (written to `path`) into `store`: its summary's notes and the kernels stored."""
    path.write_bytes(text)
    result = CliRunner().invoke(app, ["load", str(path), "--db", str(store)])
    assert result.exit_code == 0, result.output
    con = duckdb.connect(str(store), read_only=True)
    try:
        kernels = con.execute("SELECT start_ns, end_ns, name FROM kernel_events JOIN kernel_names USING "
                              "(trace_id, name_id) WHERE trace_id = 2 ORDER BY start_ns").fetchall()
    finally:
        con.close()
    return result.stdout.strip().partition("; ")[2], kernels


MARK = "DAMAGED"


@pytest.mark.parametrize("field, value, note", [
    ("ts", None, "1 kernel without a start or end time dropped"),
    ("dur", None, "1 kernel without a start or end time dropped"),
    ("ts", "10000000000000", "1 kernel with times out of range dropped"),  # 1e13 us: 116 days from the others
    ("ts", "9223372036854775808", "1 kernel with times out of range dropped"),  # past 64 bits of ns
    ("dur", "1e20", "1 kernel with times out of range dropped"),
    ("dur", "-0.001", "1 kernel with end < start dropped"),
])
def test_kernels_with_unusable_times_are_dropped_and_counted(store: Path, tmp_path: Path, field: str,
                                                             value: str | None, note: str) -> None:
    """As in the SQLite readers (docs/damaged-traces.md): the damaged kernel goes, the others stay."""
    kernel = {k: (MARK if k == field else v) for k, v in KERNEL.items() if k != field or value is not None}
    later = {**KERNEL, "ts": 20.5}
    text = json.dumps({"traceEvents": [KERNEL, kernel, later]}).replace(f'"{MARK}"', value or "")
    notes, kernels = load_damaged(store, tmp_path / "t.json", text.encode())
    assert notes == note
    assert kernels == [(10_500, 12_750, "k"), (20_500, 22_750, "k")]


@pytest.mark.parametrize("field, value", [("ts", '"abc"'), ("ts", "NaN"), ("dur", "Infinity"), ("ts", "1e30")])
def test_times_that_are_not_numbers_refuse_the_file(store: Path, tmp_path: Path, field: str, value: str) -> None:
    """DuckDB's JSON reader refuses a value its DECIMAL column cannot hold: one line naming it."""
    kernel = {**KERNEL, field: MARK}
    text = json.dumps({"traceEvents": [KERNEL, kernel, KERNEL]}).replace(f'"{MARK}"', value)
    path = tmp_path / "t.json"
    path.write_text(text)
    assert_load_refused(store, path, "cannot read", value.strip('"'))


def test_text_that_is_not_utf8_refuses_the_file(store: Path, tmp_path: Path) -> None:
    events = [KERNEL, {**KERNEL, "name": MARK, "ts": 15.5}, {**KERNEL, "ts": 20.5}]
    path = tmp_path / "u.json"
    path.write_bytes(json.dumps({"traceEvents": events}).encode().replace(MARK.encode(), b"conv\xff"))
    assert_load_refused(store, path, "not UTF-8")
