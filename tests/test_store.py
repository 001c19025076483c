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
    table = runner.invoke(app, ["traces", "--db", str(db)], env={"COLUMNS": "240"}).stdout  # wide: every column
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
    assert err == ""  # off a terminal the wait is not announced (tests/test_lock_notice.py: on one)
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
    assert err.strip().splitlines() == [
        f"traceq: {db} is in use by another traceq process (waited 1 s); try again when it finishes"]
    assert _counts(db) == before


def test_on_a_terminal_the_wait_notice_is_erased_before_the_refusal(tmp_path: Path) -> None:
    """Refusing after the wait is one line on screen: the notice shown while waiting is erased."""
    import pty

    db = tmp_path / "s.duckdb"
    assert _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)).exit_code == 0
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db), "3"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    master, slave = pty.openpty()
    loader = subprocess.Popen([sys.executable, "-m", "traceq", "traces", "--db", str(db)], stdout=subprocess.PIPE,
                              stderr=slave, env={**os.environ, "TRACEQ_LOCK_TIMEOUT": "1"})
    os.close(slave)
    raw = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the loader closed its end
            break
        if not chunk:
            break
        raw += chunk
    os.close(master)
    loader.wait(timeout=20)
    holder.wait(timeout=20)
    text = raw.decode()
    assert loader.returncode == 1 and f"traceq: waiting for {db}" in text
    on_screen = [line.split("\r\x1b[2K")[-1] for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    assert on_screen == [f"traceq: {db} is in use by another traceq process (waited 1 s); try again when it finishes"]


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
    from traceq.api.loading import load_trace

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


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """alexnet_b256_nocudnn with its events copied three more times (112K kernels, 159K API
    calls): enough rows that DuckDB writes some into the store before the load commits."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import scale

    out = tmp_path_factory.mktemp("big") / "alexnet_x4.sqlite"
    scale.scale(sample("alexnet_b256_nocudnn.sqlite"), out, copies=3)
    return out


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_load_refused_after_writing_leaves_the_store_byte_for_byte(
        tmp_path: Path, big_trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused only once every row is in (durations too long to add up): DuckDB had already written
    row groups past the store's end (it does under memory pressure: a 50 MB limit here, as 400 MB
    with a million kernels); they are cut off again."""
    import shutil
    import sqlite3

    import traceq.api.store
    import traceq.ingest

    monkeypatch.setitem(traceq.ingest.LOAD_SETTINGS, "memory_limit", "50MB")

    db = tmp_path / "s.duckdb"
    assert _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)).exit_code == 0
    damaged = tmp_path / "long.sqlite"
    shutil.copy(big_trace, damaged)
    con = sqlite3.connect(damaged)
    con.execute(f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start + {2**50}')
    con.commit()
    con.close()
    before, size = _digest(db), db.stat().st_size
    grew: list[int] = []
    real_restore = traceq.api.store.restore_size
    monkeypatch.setattr(traceq.api.store, "restore_size", lambda path, n: (grew.append(path.stat().st_size - n),
                                                                    real_restore(path, n)))
    result = _invoke("load", str(damaged), "--db", str(db))
    assert result.exit_code == 1 and "durations add up to" in result.stderr
    assert grew and grew[0] > 0, "DuckDB wrote nothing before the refusal: the test tests nothing"
    assert db.stat().st_size == size and _digest(db) == before


def test_a_killed_load_leaves_the_contents_and_the_next_write_gives_the_space_back(
        tmp_path: Path, big_trace: Path) -> None:
    """kill -9 once the load has written past the store's end: the store keeps its one trace; the
    space stays until a command writes the store (here a load of a trace it holds already),
    whole blocks or part of one (the next test: where the kill lands decides which)."""
    db = tmp_path / "s.duckdb"
    assert _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)).exit_code == 0
    before, size = _counts(db), db.stat().st_size
    loader = _traceq("load", str(big_trace), "--db", str(db))
    while db.stat().st_size <= size and loader.poll() is None:
        time.sleep(0.01)
    loader.kill()
    loader.wait(timeout=20)
    assert loader.returncode == -9, "the load ended before it wrote past the store's end"
    assert db.stat().st_size > size and not Path(f"{db}.wal").exists()
    assert _counts(db) == before
    assert _invoke("traces", "--db", str(db)).exit_code == 0  # a reader cannot give it back
    again = _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db))
    assert "already loaded" in again.stdout
    assert db.stat().st_size == size and _counts(db) == before


def test_a_killed_load_s_part_of_a_block_is_given_back_too(tmp_path: Path) -> None:
    """The kill above lands wherever it lands: in the middle of writing a block it leaves less
    than a block past the store's end (once, under xdist: 249,856 bytes, never given back).
    Those bytes, put there on purpose, go at the next write as whole blocks do."""
    db = tmp_path / "s.duckdb"
    assert _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)).exit_code == 0
    before, size = _counts(db), db.stat().st_size
    for tail in (249_856, 1):
        with db.open("ab") as f:
            f.write(b"\x07" * tail)
        again = _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db))
        assert "already loaded" in again.stdout
        assert db.stat().st_size == size and _counts(db) == before, tail


def test_ctrl_c_inside_a_query_is_one_line_and_the_store_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while DuckDB runs a query of the load (it raises RuntimeError('Query interrupted'),
    not KeyboardInterrupt): `traceq: interrupted`, exit 130, the store byte for byte as before."""
    import signal
    import threading

    import traceq.api.loading

    db = tmp_path / "s.duckdb"
    assert _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)).exit_code == 0
    before = _digest(db)

    done = threading.Event()

    def interrupt() -> None:  # Ctrl-C every 0.3 s until the query stops (one could land before it runs)
        while not done.wait(0.3):
            os.kill(os.getpid(), signal.SIGINT)

    def slow_summary(con, trace_id: int) -> None:  # a query long enough to be interrupted inside
        threading.Thread(target=interrupt, daemon=True).start()
        try:
            con.execute("SELECT count(*) FROM range(100000000000)").fetchall()
        finally:
            done.set()

    monkeypatch.setattr(traceq.api.loading, "build_kernel_summary", slow_summary)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as in a shell
    try:
        result = _invoke("load", str(sample("alexnet_b128_cudnn.sqlite")), "--db", str(db))
    finally:
        done.set()
        signal.signal(signal.SIGINT, previous)
    assert (result.exit_code, result.stderr) == (130, "traceq: interrupted\n"), result.output
    assert _digest(db) == before


def test_trace_ids_are_never_reused(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db))
    _invoke("rm", "lenet_b256_cudnn", "--db", str(db))
    result = _invoke("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db))
    assert "(trace 2)" in result.stdout


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_duckdb_threads_stay_within_the_cpus_allowed() -> None:
    """A process held to one CPU (as `taskset -c 0` holds it) gets one DuckDB thread, not one per
    core of the machine; threads given as a setting are left as given."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from traceq.store import connect; "
            "print(connect().execute(\"SELECT current_setting('threads')\").fetchall()[0][0], "
            "connect(threads=3).execute(\"SELECT current_setting('threads')\").fetchall()[0][0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "3"]
