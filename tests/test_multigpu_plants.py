"""Planted problems on two GPUs (issues 34 and 37), on real recordings: a DDP MLP whose one
gradient all-reduce runs exposed after the backward pass (`mgplants_base_2gpu`), the same run
under `no_sync()` (no communication: `mgplants_nosync_2gpu`) and with rank 1 sleeping 10 ms
before each forward (`mgplants_straggler_2gpu`); sample_traces/MANIFEST.md, recorded by
tools/record_multigpu_plants.sh.

What each planted problem costs is measured by the run without it: the median iteration (the
start-to-start period of the `iteration N` NVTX ranges, read from the SQLite files in plain SQL)
of one run minus the other's. `advise` on the run must put the plant's rule first, with a time
at stake within 25 % of that cost.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceq.cli import app

ROOT = Path(__file__).resolve().parents[1] / "sample_traces" / "multigpu"
RUNS = ("base", "nosync", "straggler")
TOLERANCE = 0.25


def rank_file(run: str, rank: int) -> Path:
    path = ROOT / f"mgplants_{run}_2gpu_rank{rank}.sqlite"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return path


def periods(path: Path) -> list[float]:
    """Start-to-start periods (ns) of the `iteration N` ranges: the step's synchronize is outside
    the range, so a range's own length is only its host's launching."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        starts = [s for (s,) in con.execute(
            "SELECT n.start FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
            "WHERE coalesce(n.text, s.value) LIKE 'iteration %' ORDER BY n.start")]
    return [b - a for a, b in itertools.pairwise(starts)]


def median_iteration(run: str) -> float:
    return statistics.median(p for rank in (0, 1) for p in periods(rank_file(run, rank)))


def iterations(run: str) -> int:
    return len(periods(rank_file(run, 0))) + 1


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plants") / "s.duckdb"
    for run in RUNS:
        files = [str(rank_file(run, rank)) for rank in (0, 1)]
        result = CliRunner().invoke(app, ["load", *files, "--run", run, "--db", str(path)])
        assert result.exit_code == 0, result.output
    return path


def advise(db: Path, run: str) -> list[dict]:
    result = CliRunner().invoke(app, ["advise", "-t", run, "--db", str(db), "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    return rows["rows"] if isinstance(rows, dict) else rows


def test_exposed_communication_is_first_and_costs_what_no_sync_saves(db: Path) -> None:
    cost = median_iteration("base") - median_iteration("nosync")
    assert cost > 4e6  # the plant: the all-reduce of 1.6 GB of gradients, not hidden
    first = advise(db, "base")[0]
    assert first["rule"] == "exposed_comm", first
    per_iteration = first["time_ns"] / iterations("base")
    assert abs(per_iteration / cost - 1) <= TOLERANCE, (per_iteration, cost)


def test_straggler_is_first_and_costs_what_its_absence_saves(db: Path) -> None:
    cost = median_iteration("straggler") - median_iteration("base")
    assert cost > 8e6  # the plant: rank 1 sleeps 10 ms before each forward
    first = advise(db, "straggler")[0]
    assert first["rule"] == "straggler", first
    # the capture's first iteration is left out (its skews are when each rank's capture began)
    per_iteration = first["time_ns"] / (iterations("straggler") - 1)
    assert abs(per_iteration / cost - 1) <= TOLERANCE, (per_iteration, cost)


def gpu_ns(run: str, collectives: bool) -> int:
    """Rank 0's kernel time of one kind: the collectives (NCCL) or all the others."""
    with sqlite3.connect(f"file:{rank_file(run, 0)}?mode=ro", uri=True) as con:
        (ns,) = con.execute(
            "SELECT coalesce(sum(k.end - k.start), 0) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            f"JOIN StringIds s ON s.id = k.shortName WHERE (s.value LIKE 'nccl%') = {int(collectives)}").fetchone()
    return ns


def test_overlap_comm_predicts_the_no_sync_run(db: Path) -> None:
    """`whatif --overlap-comm` on the base run (collectives take no time) against the no_sync
    run: +10.6 %, 0.6 points past the issue's 10 % (docs/whatif.md). no_sync() also drops DDP's
    division of the gradients by the world size (12 element-wise kernels over 1.6 GB a step,
    0.78 ms), which is computation: with that work added back to the no_sync run's time, the
    prediction is within 10 %."""
    result = CliRunner().invoke(app, ["whatif", "-t", "base", "--overlap-comm", "--db", str(db), "-f", "json"])
    assert result.exit_code == 0, result.output
    predicted = statistics.median(row["predicted_ns"] for row in json.loads(result.stdout))
    truth = statistics.median(periods(rank_file("nosync", 0)))
    error = predicted / truth - 1
    assert 0.0 < error <= 0.12, error  # over, by the averaging kernels: below
    dropped = (gpu_ns("base", False) - gpu_ns("nosync", False)) / iterations("base")
    assert 5e5 < dropped < 1.5e6, dropped
    assert abs(predicted / (truth + dropped) - 1) <= 0.10, (predicted, truth, dropped)
