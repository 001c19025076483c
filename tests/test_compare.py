"""`traceq compare A B`: two runs side by side, per iteration, checked against each run alone."""

from __future__ import annotations

import json

import polars as pl
import pytest
from conftest import sample, trace_id
from typer.testing import CliRunner

from traceq.analysis.compare.side_by_side import compare_runs
from traceq.analysis.structure.layers import layer_times, stage_times
from traceq.cli import app

runner = CliRunner()
ITERATIONS = 4  # both AlexNet captures record 4 iterations


def test_layers_per_iteration_match_each_run(sample_store) -> None:
    a, b = trace_id(sample_store, "alexnet_b256_cudnn"), trace_id(sample_store, "alexnet_b256_nocudnn")
    frame, per_iteration = compare_runs(sample_store, a, b, "layer")
    assert per_iteration
    for side, trace in (("a", a), ("b", b)):
        alone = layer_times(sample_store, trace).filter(pl.col("layer") == "conv2").row(0, named=True)
        row = frame.filter((pl.col("layer") == "conv2") & (pl.col("pass") == "forward")).row(0, named=True)
        assert row[f"{side}_ns"] == alone["total_ns"] // ITERATIONS
    conv = frame.filter(pl.col("layer").str.contains(r"^b?conv\d$"))
    # the paper: convolutions are several times slower under cuBLAS (im2col + GEMM per image)
    assert (conv["ratio"] > 2).all()
    assert ((conv["b_ns"] - conv["a_ns"]) == conv["diff_ns"]).all()
    assert (conv["a_ru"] > conv["b_ru"]).all()


def test_stages_match_stage_times(sample_store) -> None:
    a, b = trace_id(sample_store, "alexnet_b128_cudnn"), trace_id(sample_store, "alexnet_b256_cudnn")
    frame, _ = compare_runs(sample_store, a, b, "stage")
    assert frame["stage"].to_list() == ["data_copy", "forward", "backward", "weight_update", "other", "idle", "span"]
    for side, trace in (("a", a), ("b", b)):
        stages = stage_times(sample_store, trace)
        forward = frame.filter(pl.col("stage") == "forward")[f"{side}_ns"][0]
        assert forward == stages["forward_ns"].sum() // ITERATIONS
    copy = frame.filter(pl.col("stage") == "data_copy").row(0, named=True)
    assert copy["ratio"] == pytest.approx(2.0, rel=0.02)  # twice the batch, twice the bytes


def test_kernels_missing_from_one_run_have_nulls(sample_store) -> None:
    a, b = trace_id(sample_store, "alexnet_b256_cudnn"), trace_id(sample_store, "alexnet_b256_nocudnn")
    frame, _ = compare_runs(sample_store, a, b, "kernel")
    im2col = frame.filter(pl.col("name").str.contains("im2col_kernel"))
    assert im2col.height == 1 and im2col["a_ns"][0] is None and im2col["b_ns"][0] > 0
    assert im2col["diff_ns"][0] == im2col["b_ns"][0]
    libs, _ = compare_runs(sample_store, a, b, "library")
    assert set(libs["library"]) >= {"cuDNN", "cuBLAS", "PyTorch ATen"}


def test_compare_cli(tmp_path) -> None:
    db = tmp_path / "s.duckdb"
    for name in ("lenet_b256_cudnn", "alexnet_b128_cudnn"):
        assert runner.invoke(app, ["load", str(sample(f"{name}.sqlite")), "--db", str(db)]).exit_code == 0
    rows = json.loads(runner.invoke(app, ["compare", "lenet_b256_cudnn", "alexnet_b128_cudnn", "--by", "stage",
                                          "--db", str(db), "-f", "json"]).stdout)
    assert [r["stage"] for r in rows][:4] == ["data_copy", "forward", "backward", "weight_update"]
    table = runner.invoke(app, ["compare", "1", "2", "-k", "3", "--db", str(db)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "per iteration" in table.stdout and "B / A" in table.stdout
    missing = runner.invoke(app, ["compare", "1", "nope", "--db", str(db)])
    assert missing.exit_code == 1 and missing.stderr.startswith("traceq: ")
