"""`traceq ru` over the store: per-launch occupancy and RU from the trace's own launch records
and device record, checked against Nsight Compute, the paper's equations and by hand."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from conftest import SAMPLES, sample, trace_id
from traceq.analysis.efficiency import GroupBy, device_limits, launch_ru, ru_table
from traceq.cli import app
from traceq.errors import MissingDataError

runner = CliRunner()


def _ncu_launches() -> pl.DataFrame:
    """One row per kernel Nsight Compute profiled (the same AlexNet b256 step, another run)."""
    with (SAMPLES / "alexnet_ncu_raw.csv").open(newline="") as f:
        names, _units, *rows = csv.reader(f)
    num = lambda text: float(text.replace(",", ""))  # noqa: E731
    records = [dict(zip(names, r)) for r in rows]
    return pl.DataFrame({
        "name": [r["Kernel Name"] for r in records],
        "grid_blocks": [int(num(r["launch__grid_size"])) for r in records],
        "block_threads": [int(num(r["launch__block_size"])) for r in records],
        "registers_per_thread": [int(num(r["launch__registers_per_thread"])) for r in records],
        "smem_carveout_bytes": [round(num(r["launch__shared_mem_config_size"]) * 1000) for r in records],
        "smem_static_bytes": [round(num(r["launch__shared_mem_per_block_static"]) * 1000) for r in records],
        "smem_dynamic_bytes": [round(num(r["launch__shared_mem_per_block_dynamic"]) * 1000) for r in records],
        "ncu_blocks_per_sm": [int(min(num(r[f"launch__occupancy_limit_{x}"]) for x in
                                      ("blocks", "registers", "shared_mem", "warps", "barriers")))
                              for r in records],
        "ncu_occupancy": [num(r["sm__maximum_warps_per_active_cycle_pct"]) / 100 for r in records],
        "ncu_waves": [num(r["launch__waves_per_multiprocessor"]) for r in records],
    })


def test_store_launches_agree_with_nsight_compute(sample_store) -> None:
    """The trace's launches whose shape (grid, block, registers, shared memory, carveout) Nsight
    Compute also profiled get ncu's active blocks per SM, occupancy and waves, from the trace's
    own H200 record. (ncu prints template names, nsys argument lists: the shape is the key.)"""
    launches = launch_ru(sample_store, trace_id(sample_store, "alexnet_b256_cudnn"))
    keys = ["grid_blocks", "block_threads", "registers_per_thread", "smem_static_bytes",
            "smem_dynamic_bytes", "smem_carveout_bytes"]
    ncu = _ncu_launches().drop("name").unique(keys)
    both = launches.with_columns(pl.col(keys).cast(pl.Int64)).join(ncu, on=keys, how="inner")
    assert both.height == launches.height == 648  # every launch of the trace has an ncu twin
    assert (both["blocks_per_sm"] == both["ncu_blocks_per_sm"]).all()
    assert ((both["occupancy"] - both["ncu_occupancy"]).abs() < 5e-5).all()
    # ncu prints waves to 2 decimals
    assert ((both["waves"] - both["ncu_waves"]).abs() <= 0.005 + 1e-9).all()


def test_ru_is_equation_11_by_hand(sample_store) -> None:
    launches = launch_ru(sample_store, trace_id(sample_store, "alexnet_b256_nocudnn"))
    assert launches["ru"].null_count() == 0
    for row in launches.sample(200, seed=1).iter_rows(named=True):
        max_blocks = 132 * row["blocks_per_sm"]
        assert row["max_blocks"] == max_blocks
        grid = row["grid_blocks"]
        assert row["ru"] == pytest.approx(grid / (math.ceil(grid / max_blocks) * max_blocks))
        paper = 132 * (65536 // (row["block_threads"] * row["registers_per_thread"]))
        assert row["paper_max_blocks"] == paper
        assert row["paper_ru"] == pytest.approx(grid / (math.ceil(grid / paper) * paper))
        assert 0 < row["ru"] <= 1 and 0 < row["occupancy"] <= 1


def test_kineto_estimate_is_zero_over_48_kib(sample_store) -> None:
    """notes §5.3: Kineto's estimate is 0 for kernels over 48 KiB + 1 KiB of shared memory;
    the calculator's occupancy is not."""
    launches = launch_ru(sample_store, trace_id(sample_store, "alexnet_b256_cudnn"))
    big = launches.filter(pl.col("smem_static_bytes") + pl.col("smem_dynamic_bytes") > 48 * 1024)
    assert big.height > 0
    assert (big["kineto_occupancy"] == 0).all() and (big["occupancy"] > 0).all()


def test_grouped_means_are_time_weighted(sample_store) -> None:
    t = trace_id(sample_store, "alexnet_b256_cudnn")
    launches = launch_ru(sample_store, t)
    by_layer = ru_table(sample_store, t, GroupBy.layer)
    conv1 = launches.filter((pl.col("layer") == "conv1") & (pl.col("pass") == "forward"))
    row = by_layer.filter((pl.col("layer") == "conv1") & (pl.col("pass") == "forward")).row(0, named=True)
    expected = (conv1["ru"] * conv1["dur_ns"]).sum() / conv1["dur_ns"].sum()
    assert row["ru"] == pytest.approx(expected) and row["kernels"] == conv1.height
    assert row["library"] == "cuDNN"
    by_lib = ru_table(sample_store, t, "library")
    assert by_lib["total_ns"].sum() == launches["dur_ns"].sum()
    by_kernel = ru_table(sample_store, t)
    assert by_kernel["kernels"].sum() == launches.height


def test_paper_finding_cublas_grids_are_small(sample_store) -> None:
    """The paper's §5: cuBLAS runs convolutions one image at a time, so its conv layers' RU is
    far below cuDNN's (RU about 47 % there; above 95 % with cuDNN)."""
    def conv_ru(name: str) -> float:
        frame = ru_table(sample_store, trace_id(sample_store, name), GroupBy.layer)
        conv = frame.filter(pl.col("layer").str.contains(r"^b?conv\d$"))
        return float((conv["ru"] * conv["total_ns"]).sum() / conv["total_ns"].sum())

    assert conv_ru("alexnet_b256_cudnn") > 0.9
    assert conv_ru("alexnet_b256_nocudnn") < 0.5


def test_device_limits_from_the_trace(sample_store) -> None:
    limits = device_limits(sample_store, trace_id(sample_store, "ddp_resnet18_2gpu"))
    assert sorted(limits) == [0, 1]
    gpu, sms = limits[0]
    assert sms == 132 and gpu.smem_per_sm == 233472 and gpu.smem_per_block_optin == 232448
    gpu, sms = device_limits(sample_store, trace_id(sample_store, "lenet_b256_cudnn"), cc="8.0", sms=108)[0]
    assert (gpu.cc_major, sms) == (8, 0) or (gpu.cc_major, gpu.cc_minor, sms) == (8, 0, 108)
    with pytest.raises(MissingDataError):
        device_limits(sample_store, trace_id(sample_store, "lenet_b256_cudnn"), cc="nine")


def test_ru_cli(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    assert runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    rows = json.loads(runner.invoke(app, ["ru", "--by", "layer", "--db", str(db), "-f", "json"]).stdout)
    assert {"layer", "pass", "library", "limiter", "kernels", "total_ns", "occupancy", "waves", "ru",
            "paper_ru", "kineto_occupancy"} <= set(rows[0])
    assert all(r["ru"] is None or 0 < r["ru"] <= 1 for r in rows)
    table = runner.invoke(app, ["ru", "-k", "5", "--db", str(db)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "RU %" in table.stdout and "Limiter" in table.stdout
    assert len([line for line in table.stdout.splitlines() if line.startswith("│")]) == 5
    bad = runner.invoke(app, ["ru", "--cc", "x", "--db", str(db)])
    assert bad.exit_code == 1 and bad.stderr.startswith("traceq: ")
