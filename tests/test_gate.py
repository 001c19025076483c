"""`traceq compare A B --gate 5%`: iteration times equal nsys's projection of the iteration
ranges, the rank test equals a brute-force count of orderings, and the exit status says when B
is slower."""

from __future__ import annotations

import csv
import itertools
import random

import pytest
from conftest import SAMPLES, sample, trace_id
from typer.testing import CliRunner

from traceq.analysis.compare.gate import iteration_times, mann_whitney_greater
from traceq.cli import app


def _brute_force(a: list[float], b: list[float]) -> float:
    """P(U >= observed) over every way of splitting the pooled values into groups of len(a) and
    len(b): the definition, by enumeration."""
    pooled = a + b

    def u(xs: list[float], ys: list[float]) -> float:
        return sum((y > x) + 0.5 * (y == x) for x in xs for y in ys)

    observed = u(a, b)
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    hits = 0
    for chosen in splits:
        xs = [pooled[i] for i in chosen]
        ys = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        hits += u(xs, ys) >= observed
    return hits / len(splits)


def test_exact_p_values_equal_the_enumeration() -> None:
    assert mann_whitney_greater([1, 2, 3, 4], [5, 6, 7, 8]) == pytest.approx(1 / 70)
    assert mann_whitney_greater([5, 6, 7, 8], [1, 2, 3, 4]) == pytest.approx(1.0)
    rng = random.Random(7)
    for _ in range(30):
        n, m = rng.randint(1, 6), rng.randint(1, 6)
        a = [rng.random() for _ in range(n)]
        b = [rng.random() + rng.choice([0, 0.3]) for _ in range(m)]
        assert mann_whitney_greater(a, b) == pytest.approx(_brute_force(a, b))


def test_normal_approximation_is_close_to_exact() -> None:
    rng = random.Random(3)
    a = [rng.gauss(10, 1) for _ in range(21)]
    b = [rng.gauss(10.6, 1) for _ in range(21)]  # 441 pairs: past the exact limit
    from traceq.analysis.compare import gate

    approximate = mann_whitney_greater(a, b)
    limit = gate.EXACT_MAX
    try:
        gate.EXACT_MAX = 10_000
        exact = mann_whitney_greater(a, b)
    finally:
        gate.EXACT_MAX = limit
    assert approximate == pytest.approx(exact, abs=0.01)


@pytest.mark.parametrize("name", ["alexnet_b256_cudnn", "alexnet_b128_cudnn"])
def test_iteration_times_equal_nsys_projection(sample_store, name: str) -> None:
    """nsys's nvtx_gpu_proj_sum projects each `iteration N` range onto the GPU work launched in
    it; the first and last of that work come from the main thread, so the projection is the
    iteration's GPU span."""
    path = SAMPLES / "nsys_stats" / f"{name}.nvtx_gpu_proj_sum.csv"
    with path.open(newline="") as f:
        projected = {r["Range"]: int(r["Total Proj Time (ns)"]) for r in csv.DictReader(f)
                     if r["Range"].startswith(":iteration ")}
    times = iteration_times(sample_store, trace_id(sample_store, name)).to_list()
    assert times == [projected[f":iteration {i}"] for i in range(len(projected))]


def test_gate_exit_status(tmp_path) -> None:
    db = tmp_path / "s.duckdb"
    runner = CliRunner()
    for name in ("alexnet_b128_cudnn", "alexnet_b256_cudnn"):
        assert runner.invoke(app, ["load", str(sample(f"{name}.sqlite")), "--db", str(db)]).exit_code == 0
    slower = runner.invoke(app, ["compare", "alexnet_b128_cudnn", "alexnet_b256_cudnn", "--by", "stage",
                                 "--gate", "5%", "--db", str(db), "-f", "csv"])
    assert slower.exit_code == 3
    assert slower.stderr.startswith("traceq: gate failed: b is slower") and "p = 0.0143" in slower.stderr
    assert slower.stdout.startswith("stage,")  # the comparison is printed before the verdict
    faster = runner.invoke(app, ["compare", "alexnet_b256_cudnn", "alexnet_b128_cudnn", "--gate", "5",
                                 "--db", str(db), "-f", "csv"])
    assert faster.exit_code == 0 and "gate passed" in faster.stderr
    same = runner.invoke(app, ["compare", "1", "1", "--gate", "5%", "--db", str(db), "-f", "csv"])
    assert same.exit_code == 0
    none = runner.invoke(app, ["compare", "1", "2", "--gate", "5%", "--iteration-regex", "^no such range$",
                               "--db", str(db), "-f", "csv"])
    assert none.exit_code == 1 and "need iteration ranges" in none.stderr
    bad = runner.invoke(app, ["compare", "1", "2", "--gate", "five", "--db", str(db)])
    assert bad.exit_code == 2


@pytest.mark.parametrize("name", ["alexnet_b256_cudnn", "ddp_resnet18_2gpu", "alexnet_b64_graph", "badloop_mlp",
                                  "resnet50_b32_amp_ops"])
def test_iteration_spans_alone_equal_the_stages(sample_store, name: str) -> None:
    """Without the stages, the gate finds each operation's iteration alone (as the gaps do) and
    takes its spans: the same times as `stage_times`' full attribution, on one and two GPUs and
    CUDA graph replays."""
    from traceq.analysis.structure.layers import stage_times

    t = trace_id(sample_store, name)
    alone = iteration_times(sample_store, t)
    assert alone.to_list() == iteration_times(sample_store, t, stages=stage_times(sample_store, t)).to_list()
    assert len(alone) >= 3
