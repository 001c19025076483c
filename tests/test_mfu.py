"""`traceq mfu` (analysis/efficiency/mfu.py) on the GPT recorded with the plain profiler
(sample_traces/conventions/gpt_kineto_plain.json.gz, one H200: 132 SMs at 1.98 GHz, bf16
autocast): each step's MFU is the given model FLOPs over the step's GPU span, read from the raw
JSON here, times the H200's dense bf16 peak computed here from its SMs and clock."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from conftest import sample
from typer.testing import CliRunner

PLAIN = "conventions/gpt_kineto_plain.json.gz"
H200_BF16 = 132 * 1.98e9 * 4096  # SMs x clock x dense bf16 FLOPs per SM per clock (Hopper: 1024 FMA x 2 x 2)


def _raw_spans() -> dict[str, int]:
    """Each ProfilerStep's GPU span (ns): from the first start to the last end of the kernels and
    copies whose runtime call lies in the step (by correlation id)."""
    events = json.load(gzip.open(sample(PLAIN)))["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
             if e.get("cat") == "user_annotation" and re.fullmatch(r"ProfilerStep#\d+", e.get("name", ""))]
    calls = {e["args"]["correlation"]: e["ts"] for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    spans: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        at = calls.get(e["args"].get("correlation"))
        for a, b, name in steps:
            if at is not None and a <= at < b:
                lo, hi = spans.get(name, [e["ts"], e["ts"] + e["dur"]])
                spans[name] = [min(lo, e["ts"]), max(hi, e["ts"] + e["dur"])]
    return {name: round((hi - lo) * 1000) for name, (lo, hi) in spans.items()}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory):
    import traceq

    return traceq.load(sample(PLAIN), tmp_path_factory.mktemp("mfu") / "s.duckdb")


def test_mfu_is_model_flops_over_span_times_peak(trace) -> None:
    spans = _raw_spans()
    flops = 3.0e11
    frame = trace.mfu(model_flops=flops)
    steps = frame.filter(frame["iteration"] != "all")
    assert sorted(steps["iteration"]) == sorted(spans) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert set(frame["precision"]) == {"bf16"}
    assert frame["peak_flops"][0] == pytest.approx(H200_BF16, rel=1e-6)
    for name, time_ns, mfu in steps.select("iteration", "time_ns", "mfu_pct").iter_rows():
        assert abs(time_ns - spans[name]) <= 2  # Kineto's microseconds, rounded to ns
        assert mfu == pytest.approx(100 * flops / (spans[name] / 1e9 * H200_BF16), rel=1e-4)
    total = frame.filter(frame["iteration"] == "all").row(0, named=True)
    assert total["mfu_pct"] == pytest.approx(100 * 3 * flops / (sum(spans.values()) / 1e9 * H200_BF16), rel=1e-4)


def test_six_p_t_and_hfu(trace) -> None:
    """--params/--tokens give 6 P T a training step (2 P T with --inference); HFU counts the FLOPs
    `traceq ce` gives the step's kernels, the same each step of the same model."""
    train = trace.mfu(params=25e6, tokens=2048)
    infer = trace.mfu(params=25e6, tokens=2048, inference=True)
    assert set(train["model_flops"].head(3)) == {6 * 25e6 * 2048}
    assert set(infer["model_flops"].head(3)) == {2 * 25e6 * 2048}
    counted = train["counted_flops"].head(3)
    assert counted.min() > 0 and counted.max() == pytest.approx(counted.min(), rel=1e-9)
    assert train["hfu_pct"].head(3).to_list() == pytest.approx(
        (100 * counted / (train["time_ns"].head(3) / 1e9 * H200_BF16)).to_list())
    bare = trace.mfu()
    assert bare["mfu_pct"].null_count() == bare.height  # no model FLOPs: HFU only


def test_cli_mfu_reads_at_80_columns(tmp_path) -> None:
    from traceq.cli import app

    db = tmp_path / "s.duckdb"
    runner = CliRunner()
    assert runner.invoke(app, ["load", str(sample(PLAIN)), "--db", str(db)]).exit_code == 0
    result = runner.invoke(app, ["mfu", "--params", "25e6", "--tokens", "2048", "--db", str(db)],
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "MFU %" in result.output.replace("\n", " ") or "MFU" in result.output
    assert all(len(line) <= 80 for line in result.output.splitlines())
