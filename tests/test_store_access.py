"""Opening the store: offline always (no DuckDB extension is fetched), a trace passed as the store
is named as such, and a store the user may not write is called read-only, not damaged."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, sample
from typer.testing import CliRunner

from traceq.cli import app
from traceq.store import connect, open_store

runner = CliRunner()


@pytest.mark.parametrize(("name", "kind"), [("lenet_b256_cudnn.sqlite", "nsys"),
                                            ("alexnet_b256_kineto.json", "kineto")])
def test_a_trace_given_as_the_store_says_to_load_it(name: str, kind: str) -> None:
    """DuckDB opens an SQLite file through its sqlite extension, which it would download (seconds,
    then a network error here); traceq must recognise the trace and say what to do instead."""
    trace = sample(name)
    before = hashlib.sha256(trace.read_bytes()).hexdigest()
    result = runner.invoke(app, ["top", "--db", str(trace)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == (f"traceq: {trace} is a trace ({kind}), not a traceq store: load it with "
                        f"`traceq load {trace}`, then query the store it goes into (traceq.duckdb, "
                        "or the one --db names)")
    assert not re.search(r"download|extension|http", result.stderr, re.IGNORECASE)
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == before


def test_every_connection_is_offline(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.duckdb", create=True)
    for con in (store, connect()):
        settings = con.sql("SELECT current_setting('autoinstall_known_extensions'), "
                           "current_setting('autoload_known_extensions')").fetchall()
        assert settings == [(False, False)]
    store.close()
    # and no module of the package opens a DuckDB connection any other way
    others = [path.relative_to(ROOT) for path in ROOT.rglob("*.py")
              if path.parts[len(ROOT.parts)] not in {"tests", "bench", "build", ".venv", "tools"}
              and path.name != "store.py" and "duckdb.connect(" in path.read_text(encoding="utf-8")]
    assert others == []


@pytest.fixture()
def shared_dir() -> Iterator[Path]:
    """A folder another user can enter (pytest's tmp_path is private to its owner)."""
    folder = Path(tempfile.mkdtemp(prefix="traceq-ro-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _as_unprivileged(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`traceq args` as a user without write permission where the files say so: as root (who may
    write anything) the command runs as `nobody` through setpriv, else as ourselves."""
    command = [str(Path(sys.executable).parent / "traceq"), *args]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: a read-only file cannot be made here")
        command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={**os.environ, "COLUMNS": "120"})


def test_a_read_only_store_is_called_read_only(shared_dir: Path) -> None:
    store = shared_dir / "s.duckdb"
    assert runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(store)]).exit_code == 0
    store.chmod(0o444)
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    for command in (["rm", "1"], ["load", str(sample("alexnet_b128_cudnn.sqlite"))]):
        done = _as_unprivileged(*command, "--db", str(store), cwd=shared_dir)
        assert done.returncode == 1, done.stderr
        assert done.stderr == (f"traceq: {store} is read-only here (no permission to write it): `traceq load` "
                               "and `traceq rm` change the store, the other commands only read it; pass --db "
                               "with a writable path\n")
    reading = _as_unprivileged("top", "-k", "1", "--db", str(store), cwd=shared_dir)
    assert reading.returncode == 0 and "lenet_b256_cudnn: top 1 kernels" in reading.stdout, reading.stderr
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before
    # a new store in a folder the user cannot write
    locked = shared_dir / "locked"
    locked.mkdir(mode=0o555)
    done = _as_unprivileged("load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(locked / "new.duckdb"),
                            cwd=shared_dir)
    assert done.returncode == 1 and "(its folder) is read-only here" in done.stderr, done.stderr
    assert not any(locked.iterdir())
