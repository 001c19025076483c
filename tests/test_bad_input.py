"""Bad input: one `traceq:` line on stderr, exit 1, no traceback, the store exactly as before."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import assert_load_refused, sample, shared
from typer.testing import CliRunner

from traceq.cli import app

runner = CliRunner()


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    db = tmp_path / "store.duckdb"
    result = runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)])
    assert result.exit_code == 0, result.output
    return db


def test_missing_path(store: Path, tmp_path: Path) -> None:
    assert_load_refused(store, tmp_path / "nope.sqlite", "no such file")


def test_directory(store: Path, tmp_path: Path) -> None:
    assert_load_refused(store, tmp_path, "is a directory")


def test_empty_file(store: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    assert_load_refused(store, empty, "empty")


def test_not_sqlite(store: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.sqlite"
    text.write_text("hello, this is not a database\n" * 10)
    assert_load_refused(store, text, "not a trace traceq can read", "nsys export --type sqlite")


def test_truncated_sqlite(store: Path, tmp_path: Path) -> None:
    whole = sample("alexnet_b256_cudnn.sqlite").read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(whole[: len(whole) // 2])
    assert_load_refused(store, cut, "truncated")


def test_damaged_sqlite_fails_mid_load_and_rolls_back(store: Path, tmp_path: Path) -> None:
    """Pages overwritten with junk: detection passes, reading fails half-way, nothing is kept."""
    data = bytearray(sample("alexnet_b256_cudnn.sqlite").read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for start in range(len(data) // 2, len(data) - page, page * 3):
        data[start : start + page] = b"\xa5" * page
    bad = tmp_path / "damaged.sqlite"
    bad.write_bytes(bytes(data))
    line = assert_load_refused(store, bad)
    assert "damaged" in line or "malformed" in line


def test_sqlite_but_not_a_profiler_export(store: Path, tmp_path: Path) -> None:
    other = tmp_path / "shop.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO customers VALUES (1, 'Ada')")
    con.commit()
    con.close()
    assert_load_refused(store, other, "not a profiler export")


def test_nsys_report_says_how_to_export(store: Path, tmp_path: Path) -> None:
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"NVIDIA Tegra Profiler Report 2025.3\n" + b"\0" * 200)
    assert_load_refused(store, rep, "Nsight Systems report", "nsys export --type sqlite")


def test_real_qdrep_says_how_to_export(store: Path) -> None:
    rep = shared("realtraces", "nsys_rep", "skycs97__darknet__report2.qdrep")
    assert_load_refused(store, rep, "Nsight Systems report", "nsys export --type sqlite")


def test_failed_first_load_leaves_no_store(tmp_path: Path) -> None:
    db = tmp_path / "new.duckdb"
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not a trace")
    result = runner.invoke(app, ["load", str(bad), "--db", str(db)])
    assert result.exit_code == 1
    data = bytearray(sample("lenet_b256_cudnn.sqlite").read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for start in range(page * 2, len(data) - page, page * 2):
        data[start : start + page] = b"\x5a" * page
    damaged = tmp_path / "damaged.sqlite"
    damaged.write_bytes(bytes(data))
    result = runner.invoke(app, ["load", str(damaged), "--db", str(db)])
    assert result.exit_code == 1, result.output
    assert not db.exists() and not Path(str(db) + ".wal").exists()


def test_usage_errors_exit_2(store: Path) -> None:
    result = runner.invoke(app, ["top", "--db", str(store), "--format", "xml"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["top", "--db", str(store), "--k", "0"])
    assert result.exit_code == 2


def test_unknown_trace_lists_what_is_there(store: Path) -> None:
    result = runner.invoke(app, ["top", "--db", str(store), "--trace", "resnet"])
    assert result.exit_code == 1
    assert result.stderr.strip() == "traceq: no trace 'resnet' in the store (it holds: lenet_b256_cudnn)"


def test_no_store_yet(tmp_path: Path) -> None:
    result = runner.invoke(app, ["top", "--db", str(tmp_path / "none.duckdb")])
    assert result.exit_code == 1
    assert result.stderr.startswith("traceq: no store at ") and "traceq load" in result.stderr
    assert not (tmp_path / "none.duckdb").exists()


def test_store_that_is_not_a_store(tmp_path: Path) -> None:
    junk = tmp_path / "junk.duckdb"
    junk.write_text("junk")
    result = runner.invoke(app, ["traces", "--db", str(junk)])
    assert result.exit_code == 1 and result.stderr.startswith("traceq: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert junk.read_text() == "junk"
    shutil.copy(sample("lenet_b256_cudnn.sqlite"), tmp_path / "x.sqlite")
