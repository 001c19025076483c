"""`traceq whatif --gpu`: each kernel on another GPU by its roofline position
(analysis/critical/gpu_model.py), and its validation on a real H100/H200 pair (docs/whatif.md)."""

from __future__ import annotations

import importlib.util

import polars as pl
import pytest
from conftest import SAMPLES, sample, shared

from traceq.analysis.critical.graph import build_graph
from traceq.analysis.critical.whatif import Changes, apply, predict
from traceq.errors import TraceqError

QWEN_H200 = "whatif/qwen1.5-0.5b_prefill_h200.json.gz"

# Datasheet numbers, written here apart from traceq's product table: SMs, SM boost clock, DRAM
# bandwidth, dense BF16 tensor FLOP per clock per SM (Hopper 4096, Ampere 2048), FP32 lanes.
H100 = {"sms": 132, "clock": 1.98e9, "dram": 3352e9, "bf16": 4096, "fp32": 128}
A100_80 = {"sms": 108, "clock": 1.41e9, "dram": 2039e9, "bf16": 2048, "fp32": 64}


def _validate():
    spec = importlib.util.spec_from_file_location("whatif_validate", SAMPLES.parent / "tools" / "whatif_validate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    con = open_store(tmp_path_factory.mktemp("qwen") / "q.duckdb", create=True)
    t = load_trace(con, sample(QWEN_H200)).trace_id
    yield con, t, build_graph(con, t)
    con.close()


def test_own_gpu_is_the_identity(qwen):
    """--gpu naming the trace's own GPU replays the measured times exactly."""
    con, t, graph = qwen
    table, _, notes = predict(con, t, Changes(gpu="H200"), graph)
    assert (table["predicted_ns"] == table["measured_ns"]).all()
    _, dur, _ = apply(con, t, graph, Changes(gpu="H200"))
    assert dur.equals(graph.nodes["dur_ns"].cast(pl.Int64), check_names=False)
    assert any(n.startswith("compute-bound:") for n in notes) and any(n.startswith("memory-bound:") for n in notes)


@pytest.mark.parametrize("target, gpu", [("H100", H100), ("A100-SXM4-80GB", A100_80)])
def test_each_kernel_between_its_clock_and_its_roof(qwen, target, gpu):
    """A kernel's new time is its time at the roof moved with the roof plus the rest moved with
    the clock: its ratio lies between the clock ratio and the roof ratios (DRAM, BF16 and FP32
    peaks). On an H100 (same SMs and clock as the H200) the GEMMs, compute-bound, keep their
    time and every other kernel grows by at most the DRAM ratio (the model's roof positions are
not recomputed here: the bounds hold whatever share of a kernel's time is at its roof)."""
    con, t, graph = qwen
    sms, clock, dram = con.execute("SELECT sm_count, clock_hz, memory_bandwidth_bytes_per_s FROM gpus "
                                   "WHERE trace_id = ?", [t]).fetchone()
    # Kineto records neither clock nor bandwidth: the H200's as our nsys H200 traces record them
    clock, dram = clock or 1.98e9, dram or 4814e9
    ratios = [clock / gpu["clock"], dram / gpu["dram"], 4096 * sms * clock / (gpu["bf16"] * gpu["sms"] * gpu["clock"]),
              128 * sms * clock / (gpu["fp32"] * gpu["sms"] * gpu["clock"])]
    _, dur, _ = apply(con, t, graph, Changes(gpu=target))
    nodes = graph.nodes.with_columns(new=dur)
    kernels = nodes.filter((pl.col("kind") == 1) & (pl.col("dur_ns") > 0))
    ratio = kernels["new"] / kernels["dur_ns"]
    slack = 1 / kernels["dur_ns"]  # the new time is rounded to the ns
    assert ((ratio >= min(ratios) - slack) & (ratio <= max(ratios) + slack)).all()
    if target == "H100":
        big = (pl.col("operation") == "gemm") & (pl.col("precision") == "bf16")  # the fp32 one is a tiny bmm
        gemm = kernels.filter(big)
        assert gemm.height == 168 and (gemm["new"] == gemm["dur_ns"]).all()
        rest = kernels.filter(~big)
        grown = rest["new"] / rest["dur_ns"]
        assert (grown >= 1 - 1 / rest["dur_ns"]).all() and (grown <= dram / H100["dram"] + 1 / rest["dur_ns"]).all()
        assert rest["new"].sum() > rest["dur_ns"].sum() * 1.1  # memory-bound kernels do slow down
    # host calls and host-device copies keep their time
    others = nodes.filter((pl.col("kind") == 0) | ((pl.col("kind") == 2) & ~pl.col("name").str.contains("Device-to-Dev")))
    assert (others["new"] == others["dur_ns"]).all()


def test_unknown_gpu(qwen):
    con, t, graph = qwen
    with pytest.raises(TraceqError, match="not in traceq's product table"):
        predict(con, t, Changes(gpu="Z80"), graph)


def test_cli_prints_the_assumption_per_class(tmp_path):
    from typer.testing import CliRunner

    from traceq.cli import app

    db = tmp_path / "q.duckdb"
    runner = CliRunner()
    assert runner.invoke(app, ["load", str(sample(QWEN_H200)), "--db", str(db)]).exit_code == 0
    result = runner.invoke(app, ["whatif", "--gpu", "H100", "--db", str(db)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    for words in ("compute-bound:", "memory-bound:", "of their time at the roof", "Predicted", "validated"):
        assert words in result.output
    result = runner.invoke(app, ["whatif", "--gpu", "Z80", "--db", str(db)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1


def test_h100_h200_pair():
    """Requirement 3's GPU pair (docs/whatif.md): a Qwen1.5-0.5B prefill on an H100 (AMD
    TraceLens' sample) and on an H200 (recorded with its settings, PyTorch 2.11 against 2.6).
    The step time both ways within the issue's 15 %; the GPU time of the step's own forward
    within 10 % both ways, its elementwise/norm/copy kernels too; the GEMMs within 20 % (cuBLAS's
    kernels differ between the two CUDA versions); attention misses (FlashAttention 2 on the
    H100, cuDNN's on the H200: 2.1x apart, no GPU model predicts that)."""
    module = _validate()
    h100 = shared(*module.QWEN_H100)
    results = {what: (predicted - truth) / truth for what, _, predicted, truth in module.gpu_pair(h100, sample(QWEN_H200))}
    for way in ("H100 -> H200", "H200 -> H100"):
        assert abs(results[f"{way}, step"]) <= module.GPU_BOUND, results
        assert abs(results[f"{way}, all kernels"]) <= 0.10, results
        assert abs(results[f"{way}, other kernels"]) <= 0.10, results
        assert abs(results[f"{way}, gemm kernels"]) <= 0.20, results
        assert abs(results[f"{way}, attention kernels"]) > 0.40, results
