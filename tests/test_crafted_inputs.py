"""Crafted and damaged inputs that used to print tracebacks or take minutes (issue 34): each is
now one line (or a load with a note), and a refused load leaves the store byte for byte as it
was. The files are written here; the expectations are written out by hand."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import sample
from typer.testing import CliRunner

from traceq.cli import app

runner = CliRunner()


def _kernel(name: str, ts: int, correlation: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": 20, "pid": 0, "tid": 7,
            "args": {"device": 0, "stream": 7, "correlation": correlation}}


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    path = tmp_path / "s.duckdb"
    assert runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(path)]).exit_code == 0
    return path


def _refused(args: list[str], store: Path) -> str:
    before = store.read_bytes()
    result = runner.invoke(app, [*args, "--db", str(store)])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("traceq: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.output
    assert store.read_bytes() == before
    return result.stderr


def test_json_nested_a_thousand_deep_is_one_line(store: Path, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, '
                    '"tid": 7, "args": ' + '{"a":' * 1000 + "1" + "}" * 1000 + "}]}")
    assert "nested too deeply" in _refused(["load", str(deep)], store)


def test_a_base_time_past_int64_is_ignored_with_a_note(store: Path, tmp_path: Path) -> None:
    trace = tmp_path / "base.json"
    trace.write_text('{"baseTimeNanoseconds": 9223372036854775808, "traceEvents": [' +
                     json.dumps(_kernel("k", 1, 1)) + "]}")
    result = runner.invoke(app, ["load", str(trace), "--db", str(store)])
    assert result.exit_code == 0, result.output
    assert "baseTimeNanoseconds out of range ignored" in result.stdout


@pytest.mark.parametrize("size", [12_000, 300_000, 2_000_000])
def test_a_truncated_store_is_one_line(store: Path, tmp_path: Path, size: int) -> None:
    cut = tmp_path / "cut.duckdb"
    shutil.copy(store, cut)
    os.truncate(cut, size)
    for command in (["top"], ["traces"], ["layers"]):
        result = runner.invoke(app, [*command, "--db", str(cut)])
        assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
        assert str(cut) in result.stderr and "Traceback" not in result.output


def test_a_twenty_megabyte_kernel_name_is_cut_at_load(store: Path, tmp_path: Path) -> None:
    from traceq.ingest.texts import TEXT_CAP

    name = "void huge<" + "A" * (20 << 20) + ">()"
    trace = tmp_path / "huge.json"
    trace.write_text(json.dumps({"traceEvents": [_kernel(name, 10, 1), _kernel("small", 40, 2)]}))
    result = runner.invoke(app, ["load", str(trace), "--db", str(store)])
    assert result.exit_code == 0, result.output
    assert f"longer than {TEXT_CAP:,} characters cut" in result.stdout
    import hashlib

    import duckdb

    con = duckdb.connect(str(store), read_only=True)
    (kept,) = con.execute("SELECT n.name FROM kernel_names n JOIN traces t USING (trace_id) "
                          "WHERE t.name = 'huge' AND n.name LIKE 'void huge%'").fetchone()
    con.close()
    assert len(kept) < TEXT_CAP + 100 and kept.startswith("void huge<AAA") and kept.endswith("AAA>()")
    assert hashlib.sha1(name.encode()).hexdigest()[:12] in kept and f"{len(name):,} characters" in kept
    report = runner.invoke(app, ["report", "huge", "--db", str(store), "-o", str(tmp_path / "r.html")])
    assert report.exit_code == 0 and (tmp_path / "r.html").stat().st_size < 8 << 20


def test_a_killed_kineto_load_leaves_no_staging_after_the_next(tmp_path: Path) -> None:
    """A load killed mid-way leaves its scratch folder; the next load removes it (its process is
    gone), and leaves running loads' folders alone."""
    from traceq.ingest.scratch import OWNER_FILE, SCRATCH_PREFIX, new_scratch, sweep_stale_scratch

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = tmp_path / f"{SCRATCH_PREFIX}dead"
    stale.mkdir()
    (stale / OWNER_FILE).write_text(dead + "\n")
    (stale / "stage.duckdb").write_bytes(b"x" * 1000)
    alive = tmp_path / f"{SCRATCH_PREFIX}alive"
    alive.mkdir()
    (alive / OWNER_FILE).write_text(f"{os.getpid()}\n")
    assert sweep_stale_scratch(tmp_path) == [stale]
    assert not stale.exists() and alive.exists()
    ours = new_scratch()
    assert (ours / OWNER_FILE).read_text().strip() == str(os.getpid())
    shutil.rmtree(ours)
