"""Damaged traces: what each kind of damage does (traceq.ingest.validate), counted against SQLite.

Each test damages a copy of a real trace with SQL, loads it, and checks the load's one-line
summary and the store against counts SQLite gives on the damaged file itself. The reproducers in
../shared/fuzz-repro and the fuzzer (tools/fuzz.py) check the general promise on many more.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import sys
from pathlib import Path

import duckdb
import pytest
from conftest import ROOT, assert_load_refused, sample, shared, shared_files
from typer.testing import CliRunner

from traceq.cli import app

sys.path.insert(0, str(ROOT / "tools"))
import fuzz  # noqa: E402  (tools/ is not a package)

runner = CliRunner()
K = "CUPTI_ACTIVITY_KIND_"


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> fuzz.Harness:
    return fuzz.Harness([], "repro", tmp_path_factory.mktemp("repro"))


@pytest.mark.parametrize("name", ["nsys_sqlite/CO18326__uvmTorch__report1.sqlite",  # no kernels
                                  "nsys_sqlite/D-W-Chiang__JACC.jl__cg_trace.sqlite",  # nor API calls
                                  "nvprof_sqlite/esarmstrong__ece408__forward1_analysis.nvprof"])  # no copies
def test_every_command_works_on_real_traces_without_kernels_or_copies(harness: fuzz.Harness, name: str) -> None:
    """Undamaged real traces, and what a damaged one becomes once its bad rows are dropped."""
    path = shared("realtraces", *name.split("/"))
    outcome = harness.check_file(path)
    assert outcome.result == "loaded" and outcome.problems == [], outcome
