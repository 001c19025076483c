"""A crafted trace cannot drive the terminal (issue 34): terminal sequences in a kernel name, an
NVTX text, the GPU's name, the trace's name and the file's path reach stdout and stderr only as
visible escapes (`\\x1b`), in tables, the load line, errors and notes, piped or not."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import sample
from traceq.cli import app

runner = CliRunner()
CLEAR, TITLE, LINK = "\x1b[2J", "\x1b]0;owned\x07", "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


@pytest.fixture(scope="module")
def crafted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp(f"dir{CLEAR}x")
    path = folder / f"trace{TITLE}.sqlite"
    shutil.copy(sample("lenet_b256_cudnn.sqlite"), path)
    con = sqlite3.connect(path)
    heaviest = con.execute("SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1 "
                           "ORDER BY sum(end - start) DESC LIMIT 1").fetchone()[0]
    con.execute("UPDATE StringIds SET value = ? WHERE id = ?", (f"{CLEAR}evil_kernel{LINK}\u202eesrever", heaviest))
    text = con.execute("SELECT textId FROM NVTX_EVENTS WHERE textId IS NOT NULL LIMIT 1").fetchone()
    if text:
        con.execute("UPDATE StringIds SET value = ? WHERE id = ?", (f"conv1{TITLE}", text[0]))
    con.execute("UPDATE TARGET_INFO_GPU SET name = ?", (f"NVIDIA H200{CLEAR}",))
    con.commit()
    con.close()
    db = tmp_path_factory.mktemp("store") / "s.duckdb"
    loaded = runner.invoke(app, ["load", str(path), "--db", str(db), "--name", f"run{CLEAR}"])
    assert loaded.exit_code == 0, loaded.output
    assert "\\x1b[2J" in loaded.stdout and "\x1b" not in loaded.stdout
    return path, db


def _clean(result) -> str:
    text = result.stdout + result.stderr
    for raw in RAW:
        assert raw not in text, (raw, text[:300])
    return text


def test_the_load_line_and_every_table_show_escapes(crafted: tuple[Path, Path]) -> None:
    path, db = crafted
    top = runner.invoke(app, ["top", "--db", str(db), "--k", "3"], env={"COLUMNS": "200"})
    assert top.exit_code == 0
    assert "\\x1b[2Jevil_kernel" in _clean(top)
    for args in (["layers"], ["traces"], ["libs"], ["launches"], ["ru"], ["stats", "-r", "nvtx_sum"],
                 ["top", "--k", "3", "-f", "csv"], ["advise"], ["stages"]):
        result = runner.invoke(app, [*args, "--db", str(db)], env={"COLUMNS": "80"})
        assert result.exit_code == 0, (args, result.output)
        _clean(result)


def test_errors_quote_names_and_paths_as_escapes(crafted: tuple[Path, Path], tmp_path: Path) -> None:
    path, db = crafted
    missing = runner.invoke(app, ["top", "--trace", f"no{TITLE}such", "--db", str(db)])
    assert missing.exit_code == 1 and "no\\x1b]0;owned\\x07such" in _clean(missing)
    bad = tmp_path / f"bad{CLEAR}.sqlite"
    bad.write_bytes(b"not a trace at all")
    refused = runner.invoke(app, ["load", str(bad), "--db", str(db)])
    assert refused.exit_code == 1 and refused.stderr.count("\n") == 1 and "\\x1b[2J" in _clean(refused)
    other = tmp_path / "again.duckdb"
    assert runner.invoke(app, ["load", str(path), "--db", str(other)]).exit_code == 0
    again = runner.invoke(app, ["load", str(path), "--db", str(other)])
    assert again.exit_code == 0 and "already loaded" in _clean(again), again.output
