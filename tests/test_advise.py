"""`traceq advise`: every rule fires on a trace recorded to show it and stays silent on one
that does not (sample_traces/MANIFEST.md says how each was recorded)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from conftest import sample, trace_id
from typer.testing import CliRunner

from traceq.analysis.advise import MIN_SHARE, RULES, _telling_name, advise
from traceq.cli import app

# rule -> (a trace where it must fire, one where it must not); h2d_pinned fires on none of the
# recorded traces (their pinned copies never held the host) and is only checked to stay silent
CASES = {
    "sync": ("badloop_mlp", "alexnet_b256_cudnn"),  # loss.item() and torch.cuda.synchronize() in each step
    "pageable_copies": ("badloop_mlp", "alexnet_b256_amp"),  # batches copied from pageable memory
    "launch_bound": ("badloop_mlp", "alexnet_b256_amp"),  # 400 tiny kernels per step
    "tiny_kernels": ("badloop_mlp", "alexnet_b256_amp"),
    "fp32_math": ("badloop_mlp", "alexnet_b256_amp"),  # TF32 off vs fp16 autocast
    "transposed_gemm": ("alexnet_b64_graph", "alexnet_b256_cudnn"),  # fc6's tn GEMMs 1.9x its nn ones (batch 64)
    "low_ru": ("alexnet_b256_cudnn", "alexnet_b256_amp"),  # FP32 FC GEMMs of 256 blocks on 528 slots
    "iteration_start": ("alexnet_b64_graph", "alexnet_b256_cudnn"),  # 10 ms between capture and first replay
    "h2d_pinned": (None, "alexnet_b256_amp"),
    # the catalogue's rules of analysis/advice (fired on the DLRM ranks and crafted traces: test_advice_catalogue.py)
    "exposed_comm": (None, "alexnet_b256_amp"),
    "straggler": (None, "alexnet_b256_amp"),  # fires only on a rank of a run (the DLRM job)
    "load_imbalance": (None, "alexnet_b256_amp"),  # a run's ranks: FSDP's 2 GPUs (test_advice_ranks.py)
    "layout_transforms": ("alexnet_b256_amp", "badloop_mlp"),  # cuDNN converts NCHW activations for fp16 convs
    "allocator_churn": (None, "alexnet_b256_amp"),
    "recompilation": (None, "alexnet_b256_cudnn"),  # fires: tests/test_advice_catalogue.py (a crafted recompile)
    # needs nsys GPU metrics: fires on crafted samples, silent on the recorded ones (tests/test_gpu_metrics.py)
    "idle_tensor_cores": (None, "alexnet_b256_amp"),
    # needs an ncu report with sector metrics: fires on the uncoalesced plant (tests/test_advice_ncu.py)
    "uncoalesced_access": (None, "alexnet_b256_amp"),
}


def test_every_rule_has_cases() -> None:
    assert set(CASES) == set(RULES)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fires_where_it_must(sample_store, rule: str) -> None:
    fires, silent = CASES[rule]
    if fires is not None:
        frame, totals = advise(sample_store, trace_id(sample_store, fires))
        row = frame.filter(frame["rule"] == rule)
        assert row.height == 1, f"{rule} silent on {fires}: {frame['rule'].to_list()}"
        assert row["time_ns"][0] >= MIN_SHARE * totals.span_ns and row["evidence"][0] and row["fix"][0]
    frame, _ = advise(sample_store, trace_id(sample_store, silent))
    assert rule not in frame["rule"].to_list(), f"{rule} fired on {silent}"


def test_findings_are_ranked_by_time_at_stake(sample_store) -> None:
    frame, totals = advise(sample_store, trace_id(sample_store, "badloop_mlp"))
    assert frame["rank"].to_list() == list(range(1, frame.height + 1))
    assert frame["time_ns"].to_list() == sorted(frame["time_ns"].to_list(), reverse=True)
    assert (frame["pct"] - 100 * frame["time_ns"] / totals.span_ns).abs().max() < 1e-9
    assert frame["rule"][0] == "launch_bound"  # the tiny-kernel storm dominates the step


def test_pageable_evidence_counts_the_copies(sample_store) -> None:
    """The finding's copies are the export's memcpy rows from or to pageable memory (kind 0)."""
    con = sqlite3.connect(f"file:{sample('badloop_mlp.sqlite')}?mode=ro", uri=True)
    count, size = con.execute("SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY "
                              "WHERE srcKind = 0 OR dstKind = 0").fetchone()
    con.close()
    assert count == 16 and size == 16 * 1050624  # 8 steps x (a 512x1024 fp32 batch + 512 int64 labels)
    frame, _ = advise(sample_store, trace_id(sample_store, "badloop_mlp"))
    evidence = frame.filter(frame["rule"] == "pageable_copies")["evidence"][0]
    assert evidence.startswith(f"{count} copies to or from pageable host memory (16.0 MiB")


def test_advise_cli(tmp_path) -> None:
    db = tmp_path / "s.duckdb"
    runner = CliRunner()
    assert runner.invoke(app, ["load", str(sample("badloop_mlp.sqlite")), "--db", str(db)]).exit_code == 0
    text = runner.invoke(app, ["advise", "--db", str(db)], env={"COLUMNS": "100"})
    assert text.exit_code == 0 and "1. Launch-bound" in text.stdout and "Fix: " in text.stdout
    assert all(len(line) <= 100 for line in text.stdout.splitlines())
    rows = json.loads(runner.invoke(app, ["advise", "--db", str(db), "-f", "json"]).stdout)
    assert rows[0]["rank"] == 1 and {"title", "time_ns", "pct", "evidence", "fix", "rule"} <= set(rows[0])


def test_evidence_tells_kernels_of_one_short_name_apart(sample_store) -> None:
    """badloop_mlp's storm is several elementwise kernels, all `vectorized_elementwise_kernel`
    by short name: the evidence names them by their functor (the export's demangled names)."""
    con = sqlite3.connect(f"file:{sample('badloop_mlp.sqlite')}?mode=ro", uri=True)
    names = [n for (n,) in con.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                       "JOIN StringIds s ON s.id = k.demangledName")]
    con.close()
    assert sum("vectorized_elementwise_kernel<" in n for n in names) >= 3
    assert {_telling_name(n) for n in names} >= {
        "vectorized_elementwise_kernel<FillFunctor<float>>",
        "vectorized_elementwise_kernel<CUDAFunctorOnSelf_add<float>>",
        "Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>"}
    frame, _ = advise(sample_store, trace_id(sample_store, "badloop_mlp"))
    storm = frame.filter(frame["rule"] == "tiny_kernels")["evidence"][0].split("most per iteration: ")[1]
    kernels = [part.rsplit(" x", 1)[0] for part in storm.split(", vectorized")]
    assert len(kernels) == 3 and len(set(kernels)) == 3, storm
    assert "FillFunctor<float>>" in storm


def test_a_failed_idle_analysis_stops_the_other_thread_s_query(sample_store, monkeypatch) -> None:
    """`advise` reads the other rules' facts on a second connection while the idle analysis runs:
    when the idle analysis fails (or Ctrl-C stops it) that connection's query is interrupted,
    and the failure comes out at once, not after the other query (minutes here) is done."""
    import time

    import traceq.analysis.advise as advise_module

    def slow_prefetch(facts, con) -> None:  # on the cursor `advise` gives the other thread
        con.execute("SELECT count(*) FROM range(100000000000) WHERE range % 7 = 3").fetchall()

    def failing_idle():
        time.sleep(0.3)  # the other query has begun
        raise ValueError("idle failed")

    monkeypatch.setattr(advise_module._Facts, "prefetch", slow_prefetch)
    started = time.monotonic()
    with pytest.raises(ValueError, match="idle failed"):
        advise(sample_store, trace_id(sample_store, "badloop_mlp"), idle=failing_idle)
    assert time.monotonic() - started < 5


def test_launch_bound_says_when_the_profiler_s_options_lengthen_the_host(tmp_path) -> None:
    """torch.profiler's with_stack and profile_memory add host work to every operator: on a trace
    whose header says it was recorded with them (the Qwen prefill, TraceLens' settings: 42.5 ms a
    step traced against 32.9 ms untraced), the launch-bound finding says part of its idle is the
    profiler's; on traces recorded without them (the plain GPT: record_shapes only; badloop_mlp
    under nsys) it does not. The options are read here from the raw JSON headers."""
    import gzip

    db = tmp_path / "s.duckdb"
    names = ["whatif/qwen1.5-0.5b_prefill_h200.json.gz", "conventions/gpt_kineto_plain.json.gz", "badloop_mlp.sqlite"]
    runner = CliRunner()
    assert runner.invoke(app, ["load", *(str(sample(n)) for n in names), "--db", str(db)]).exit_code == 0
    said = 0
    for name in names:
        header = json.loads(gzip.decompress(sample(name).read_bytes())) if name.endswith(".gz") else {}
        costly = [o for o in ("with_stack", "profile_memory") if header.get(o) == 1]
        trace = sample(name).name.split(".json")[0].removesuffix(".sqlite")
        rows = json.loads(runner.invoke(app, ["advise", "-t", trace, "--db", str(db), "-f", "json"]).stdout)
        for row in rows:
            if row["rule"] == "launch_bound":
                caveat = f"recorded with torch.profiler's {' and '.join(costly)}, which add host time"
                assert (caveat in row["evidence"]) == bool(costly), (name, row["evidence"])
                said += bool(costly)
    assert said == 1
