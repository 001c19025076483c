"""Every command's `-f json` output on every bundled sample equals the recorded one
(tests/golden/outputs.json.gz, written by tools/golden_outputs.py): a regrouping of modules or a
speed-up that is meant to leave behaviour alone is checked command by command."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.xdist_group("golden")


def _tool():
    spec = importlib.util.spec_from_file_location("golden_outputs", ROOT / "tools" / "golden_outputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def golden_store(tmp_path_factory: pytest.TempPathFactory):
    tool = _tool()
    db = tmp_path_factory.mktemp("golden") / "golden.duckdb"
    tool.load(db)
    return tool, db


def test_the_recorded_outputs_cover_every_command():
    recorded = json.load(gzip.open(ROOT / "tests" / "golden" / "outputs.json.gz", "rt"))
    assert sorted(recorded) == sorted(" ".join(c) for c in _tool().commands())
    assert sum(r["exit"] == 0 for r in recorded.values()) > 500  # most are answers, not refusals


def test_every_command_prints_what_it_printed(golden_store):
    tool, db = golden_store
    recorded = json.load(gzip.open(ROOT / "tests" / "golden" / "outputs.json.gz", "rt"))
    changed = []
    for command in tool.commands():
        key = " ".join(command)
        now = tool.digest(tool._stable(key, tool.run(db, command)))
        if now != recorded[key]:
            changed.append(f"{key}: {recorded[key]['head']!r} -> {now['head']!r}")
    assert not changed, f"{len(changed)} outputs changed:\n" + "\n".join(changed[:20])
