"""The store: one transaction per load, duplicates, names, removal, versions and locking."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from conftest import sample
from typer.testing import CliRunner

from traceq.cli import app
from traceq.store import SCHEMA_VERSION, open_store

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, [*args])


def _counts(db: Path) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                for t in ("traces", "kernels", "api_calls", "memops", "nvtx", "memory_events", "gpus")}
    finally:
        con.close()


def test_loading_the_same_file_twice_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    path = sample("lenet_b256_cudnn.sqlite")
    assert _invoke("load", str(path), "--db", str(db)).exit_code == 0
    before = _counts(db)
    again = _invoke("load", str(path), "--db", str(db))
    assert again.exit_code == 0
    assert "already loaded as 'lenet_b256_cudnn'" in again.stdout and "nothing changed" in again.stdout
    # a copy under another file name has the same sha256: still the same trace
    copy = tmp_path / "copy.sqlite"
    copy.write_bytes(path.read_bytes())
    assert "already loaded" in _invoke("load", str(copy), "--db", str(db)).stdout
    assert _counts(db) == before


def test_replace_reloads(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    path = sample("lenet_b256_cudnn.sqlite")
    _invoke("load", str(path), "--db", str(db))
    before = _counts(db)
    result = _invoke("load", str(path), "--db", str(db), "--replace")
    assert result.exit_code == 0 and result.stdout.startswith("replaced 'lenet_b256_cudnn' (trace 2)")
    assert _counts(db) == before


def test_name_taken_by_another_trace(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db), "--name", "run")
    before = _counts(db)
    result = _invoke("load", str(sample("alexnet_b128_cudnn.sqlite")), "--db", str(db), "--name", "run")
    assert result.exit_code == 1
    assert result.stderr.startswith("traceq: a different trace named 'run' is already loaded")
    assert _counts(db) == before
    assert _invoke("load", str(sample("alexnet_b128_cudnn.sqlite")), "--db", str(db),
                   "--name", "run", "--replace").exit_code == 0
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT name, kernel_count FROM traces").fetchall() == [("run", 668)]
    con.close()


def test_rm_by_name_and_id_removes_every_row(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), str(sample("alexnet_b128_cudnn.sqlite")),
            "--db", str(db))
    lenet_only = tmp_path / "lenet.duckdb"
    _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(lenet_only))
    result = _invoke("rm", "alexnet_b128_cudnn", "--db", str(db))
    assert result.exit_code == 0 and result.stdout.strip() == "removed 'alexnet_b128_cudnn' (trace 2)"
    assert _counts(db) == _counts(lenet_only)
    assert _invoke("rm", "1", "--db", str(db)).exit_code == 0
    assert set(_counts(db).values()) == {0}
    assert _invoke("rm", "1", "--db", str(db)).exit_code == 1


def test_traces_lists_what_was_loaded(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    _invoke("load", str(sample("ddp_resnet18_2gpu.sqlite")), "--db", str(db))
    result = _invoke("traces", "--db", str(db), "--format", "csv")
    header, row = result.stdout.strip().splitlines()
    assert header.startswith("trace_id,name,format,tool,source_schema_version,gpus,kernel_count,span_ns")
    fields = row.split(",")
    assert fields[:7] == ["1", "ddp_resnet18_2gpu", "nsys", "NVIDIA Nsight Systems 2025.3.2.0", "3.20.3",
                          "2x NVIDIA H200", "4460"]
    table = _invoke("traces", "--db", str(db)).stdout
    assert "ddp_resnet18_2gpu" in table and "2x NVIDIA H200" in table and "4,460" in table


def test_incompatible_store_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db))
    con = duckdb.connect(str(db))
    con.execute("UPDATE traceq_meta SET value = '0' WHERE key = 'schema_version'")
    con.close()
    result = _invoke("top", "--db", str(db))
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"traceq: {db} has store schema 0, this traceq uses {SCHEMA_VERSION}: "
        "delete it (or pass another --db) and re-run `traceq load`")


def test_a_duckdb_file_that_is_not_a_store(tmp_path: Path) -> None:
    db = tmp_path / "other.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    result = _invoke("traces", "--db", str(db))
    assert result.exit_code == 1 and "not a traceq store" in result.stderr


def _traceq(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "traceq", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


HOLD_LOCK = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
con.execute("SELECT 1").fetchall()
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.close()
"""


def test_a_second_writer_waits_then_loads(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    assert _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)).exit_code == 0
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db), "3"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    started = time.monotonic()
    loader = _traceq("load", str(sample("alexnet_b128_cudnn.sqlite")), "--db", str(db))
    out, err = loader.communicate(timeout=60)
    holder.wait(timeout=10)
    assert loader.returncode == 0, err
    assert f"traceq: waiting for {db}: another traceq process is using it" in err
    assert time.monotonic() - started > 1.0
    assert _counts(db)["traces"] == 2


def test_a_second_writer_gives_up_after_the_timeout(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    assert _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)).exit_code == 0
    before = _counts(db)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db), "6"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    loader = _traceq("load", str(sample("alexnet_b128_cudnn.sqlite")), "--db", str(db),
                     env={"TRACEQ_LOCK_TIMEOUT": "1"})
    out, err = loader.communicate(timeout=60)
    holder.wait(timeout=20)
    assert loader.returncode == 1
    assert err.strip().splitlines()[-1] == (
        f"traceq: {db} is in use by another traceq process (waited 1 s); try again when it finishes")
    assert _counts(db) == before


def test_two_loads_at_once_both_land(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    a = _traceq("load", str(sample("alexnet_b256_nocudnn.sqlite")), "--db", str(db))
    b = _traceq("load", str(sample("ddp_resnet18_2gpu.sqlite")), "--db", str(db))
    (_, err_a), (_, err_b) = a.communicate(timeout=120), b.communicate(timeout=120)
    assert a.returncode == 0, err_a
    assert b.returncode == 0, err_b
    con = open_store(db, read_only=True)
    rows = con.execute("SELECT name, kernel_count FROM traces ORDER BY name").fetchall()
    kernels = con.execute("SELECT count(*) FROM kernels").fetchall()[0][0]
    con.close()
    assert rows == [("alexnet_b256_nocudnn", 37284), ("ddp_resnet18_2gpu", 4460)]
    assert kernels == 37284 + 4460


def test_interrupted_load_keeps_the_store(tmp_path: Path) -> None:
    """Ctrl-C half-way through a load: the transaction is rolled back, the store is as before."""
    from traceq.ingest import load_trace

    db = tmp_path / "s.duckdb"
    assert _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)).exit_code == 0
    before = _counts(db)
    seen: list[int] = []

    def interrupt(done: int, total: int) -> None:
        seen.append(done)
        if done > 40_000:
            raise KeyboardInterrupt

    con = open_store(db)
    with pytest.raises(KeyboardInterrupt):
        load_trace(con, sample("alexnet_b256_nocudnn.sqlite"), progress=interrupt)
    con.close()
    assert seen[-1] > 40_000, "the load had written rows before it was interrupted"
    assert _counts(db) == before
    assert _invoke("load", str(sample("alexnet_b256_nocudnn.sqlite")), "--db", str(db)).exit_code == 0
    assert _counts(db)["traces"] == 2


def test_trace_ids_are_never_reused(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db))
    _invoke("rm", "lenet_b256_cudnn", "--db", str(db))
    result = _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db))
    assert "(trace 2)" in result.stdout
