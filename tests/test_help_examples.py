"""Every command's `--help` ends with an example that runs on the bundled samples (issue 34): the
example lines are read from the help text as a person sees it, the samples loaded with the load
line the help names, and each example run as written (globs expanded, as a shell would, from the
checkout's root; files it writes land in a temporary folder)."""

from __future__ import annotations

import glob
import re
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import ROOT
from typer.main import get_command
from typer.testing import CliRunner

from traceq.cli import app

runner = CliRunner()
COMMANDS = sorted(get_command(app).commands)  # type: ignore[attr-defined]
NOT_RUN = {"mcp": "serves on stdio until its client leaves"}
OWN_SAMPLE = {"gpumetrics": "traceq load sample_traces/conventions/cnn_nsys_gpu_metrics.sqlite"}
"""Commands whose example needs a sample none of sample_traces/*.sqlite is: the load line it names."""


def _help(*command: str) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


def _examples(text: str) -> tuple[str, list[str]]:
    """(the load line the example names, the example's command lines) of a help text."""
    lines = [line.strip(" │") for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("Example"))
    load = re.search(r"`(traceq load [^`]+)`", " ".join(lines[start:start + 2]))
    return (load.group(1) if load else ""), [line for line in lines[start + 1:] if line.startswith("traceq ")]


def _argv(line: str) -> list[str]:
    """A command line's arguments after `traceq`, globs expanded from the checkout's root and
    sample paths made absolute (the command runs elsewhere)."""
    argv = []
    for word in shlex.split(line)[1:]:
        if word.startswith("sample_traces/"):
            matches = sorted(glob.glob(str(ROOT / word)))
            assert matches, f"{word} matches no file"
            argv += matches
        else:
            argv.append(word)
    return argv


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with the samples, loaded by the load line the top-level help begins with."""
    load = _examples(_help())[1][0]
    db = tmp_path_factory.mktemp("examples") / "samples.duckdb"
    result = runner.invoke(app, _argv(load), env={"TRACEQ_DB": str(db)})
    assert result.exit_code == 0, result.output
    return db


def test_the_top_level_help_has_examples() -> None:
    _, lines = _examples(_help())
    assert len(lines) >= 2 and lines[0].startswith("traceq load sample_traces/")


@pytest.mark.parametrize("command", COMMANDS)
def test_each_help_has_an_example_that_runs(command: str, loaded: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    text = _help(command)
    if command in NOT_RUN:
        assert "Example" in text and f'"{command}"' in text
        return
    load, lines = _examples(text)
    assert lines and all(line.split()[1] == command for line in lines), lines
    assert load == OWN_SAMPLE.get(command, _examples(_help())[1][0]), \
        "every example names the load the top-level help begins with (or its own sample's)"
    monkeypatch.chdir(tmp_path)
    for line in lines:
        db = tmp_path / "store.duckdb"  # a copy: rm, attribute and load write the store
        shutil.copy(loaded, db)
        if command in OWN_SAMPLE:
            assert runner.invoke(app, _argv(load), env={"TRACEQ_DB": str(db)}).exit_code == 0
        result = runner.invoke(app, _argv(line), env={"COLUMNS": "100", "TRACEQ_DB": str(db)})
        assert result.exit_code == 0, f"{line}: {result.output}"
        assert result.stdout.strip() or result.stderr.strip(), f"{line} said nothing"
        assert "Traceback" not in result.output
