"""`traceq launches`: launch call, queue and kernel times per kernel name, checked against the
export read with sqlite3, and the tiny-kernel storm of the badly written loop."""

from __future__ import annotations

import sqlite3

import polars as pl
from conftest import sample, trace_id
from typer.testing import CliRunner

from traceq.analysis.timeline.launches import launch_table
from traceq.cli import app


def _source_launches(name: str) -> dict[str, tuple[int, int, int, int]]:
    """Per demangled kernel name: launches, total launch call time, total kernel time, tiny
    launches (kernel shorter than its call), from the export's own tables."""
    con = sqlite3.connect(f"file:{sample(name)}?mode=ro", uri=True)
    rows = con.execute("""
        SELECT s.value, count(*), sum(r."end" - r.start), sum(k."end" - k.start),
               sum(CASE WHEN k."end" - k.start < r."end" - r.start AND coalesce(k.graphNodeId, 0) = 0 THEN 1 ELSE 0 END)
        FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
             AND (r.globalTid / 16777216) % 16777216 = (k.globalPid / 16777216) % 16777216
        JOIN StringIds s ON s.id = k.demangledName
        GROUP BY s.value""").fetchall()
    con.close()
    return {name: tuple(values) for name, *values in rows}


def test_launch_times_equal_the_source(sample_store) -> None:
    for name in ("badloop_mlp", "alexnet_b64_graph", "ddp_resnet18_2gpu"):
        table, totals = launch_table(sample_store, trace_id(sample_store, name))
        want = _source_launches(f"{name}.sqlite")
        got = {r["name"]: (r["launches"], r["api_ns"], r["kernel_ns"], r["tiny"]) for r in table.iter_rows(named=True)}
        assert got == want
        assert totals["launches"] == sum(v[0] for v in want.values())
        assert totals["tiny"] == sum(v[3] for v in want.values())


def test_the_tiny_kernel_storm_shows(sample_store) -> None:
    """badloop_mlp launches 400 tiny element-wise kernels per step, 8 steps: nearly all its
    launches are tiny; in AlexNet with cuDNN (big convolutions) a minority are."""
    _, storm = launch_table(sample_store, trace_id(sample_store, "badloop_mlp"))
    assert storm["tiny"] >= 8 * 400 and storm["tiny_pct"] > 90
    _, alexnet = launch_table(sample_store, trace_id(sample_store, "alexnet_b256_cudnn"))
    assert alexnet["tiny_pct"] < 50
    _, graph = launch_table(sample_store, trace_id(sample_store, "alexnet_b64_graph"))
    assert graph["graph"] == 676


def test_launches_cli(tmp_path) -> None:
    db = tmp_path / "s.duckdb"
    runner = CliRunner()
    assert runner.invoke(app, ["load", str(sample("badloop_mlp.sqlite")), "--db", str(db)]).exit_code == 0
    result = runner.invoke(app, ["launches", "-k", "3", "--db", str(db)], env={"COLUMNS": "100"})
    assert result.exit_code == 0 and "tiny" in result.stdout
    assert all(len(line) <= 100 for line in result.stdout.splitlines())
    frame = pl.read_csv(runner.invoke(app, ["launches", "--db", str(db), "-f", "csv"]).stdout.encode())
    assert {"launches", "api_ns", "queue_avg_ns", "kernel_ns", "tiny", "tiny_pct", "name"} <= set(frame.columns)


def test_repeated_launches_equal_a_range_join(sample_store) -> None:
    """`launches.repeated_launches` (ranges dealt into chains, binary searches) against the
    range join it replaced, in SQL over the store: iteration ranges after the first, each with
    the kernels launched inside it in launch order, their name ids compared as text. With a
    regex that also takes every forward and backward range, ranges nest and overlap."""
    import pytest

    from traceq.analysis.structure.conventions import ITERATION_REGEX
    from traceq.analysis.timeline.launches import repeated_launches

    reference = """
        WITH it AS (SELECT row_number() OVER (ORDER BY start_ns) AS i, start_ns, end_ns FROM nvtx
                    WHERE trace_id = $t AND kind IN ('pushpop', 'startend') AND end_ns IS NOT NULL
                      AND regexp_matches(coalesce(name, ''), $rx)),
             seq AS (SELECT it.i, count(*) AS n,
                            string_agg(k.name_id::VARCHAR, ',' ORDER BY k.launch_start_ns, k.kernel_id) AS s
                     FROM kernel_events k JOIN it ON k.launch_start_ns >= it.start_ns AND k.launch_start_ns < it.end_ns
                     WHERE k.trace_id = $t AND it.i > 1 GROUP BY it.i)
        SELECT count(*), count(DISTINCT s), coalesce(min(n), 0) FROM seq"""
    checked = set()
    for name in ("badloop_mlp", "resnet50_b32_amp_ops", "ddp_resnet18_2gpu"):
        t = trace_id(sample_store, name)
        for rx in (ITERATION_REGEX, r"(?i)^\s*(iteration|step)\s*\d+|forward|backward"):
            want = sample_store.execute(reference, {"t": t, "rx": rx}).fetchall()[0]
            assert repeated_launches(sample_store, t, rx) == tuple(want), (name, rx)
            checked.add((want[0] > 1, want[1] == 1))
    if len(checked) < 2:
        pytest.fail(f"the samples never tell both answers apart: {checked}")
