"""`traceq mfu` (analysis/efficiency/mfu.py) on the GPT recorded with the plain profiler
(sample_traces/conventions/gpt_kineto_plain.json.gz, one H200: 132 SMs at 1.98 GHz, bf16
autocast): each step's MFU is the given model FLOPs over the step's GPU span, read from the raw
JSON here, times the H200's dense bf16 peak computed here from its SMs and clock."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from conftest import sample, shared
from typer.testing import CliRunner

PLAIN = "conventions/gpt_kineto_plain.json.gz"
H200_BF16 = 132 * 1.98e9 * 4096  # SMs x clock x dense bf16 FLOPs per SM per clock (Hopper: 1024 FMA x 2 x 2)


def _raw_spans(path=None) -> dict[str, int]:
    """Each ProfilerStep's GPU span (ns): from the first start to the last end of the kernels and
    copies whose runtime call lies in the step (by correlation id)."""
    with gzip.open(path or sample(PLAIN)) as raw:
        events = json.load(raw)["traceEvents"]
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


def test_attention_term_and_hfu_beside_mfu(trace) -> None:
    """--layers/--d-model/--seq add attention's two products to 6 P T: 12 L S d a token for a
    training step, halved for causal attention. On the GPT (P = its 16,777,216 matrix weights,
    4 layers, d 512, sequence 256, 2,048 tokens a step) the counted FLOPs exceed that by the
    scores the attention backward recomputes: half (causal) of Q K^T for 4 layers, 2 x 8 x 8 x
    256 x 256 x 64 x 4 / 2 FLOP a step, so HFU > MFU by exactly that."""
    params, tokens = 16_777_216, 2048
    frame = trace.mfu(params=params, tokens=tokens, layers=4, d_model=512, seq=256)
    model = 6 * params * tokens + 12 * 4 * 256 * 512 * tokens / 2
    steps = frame.filter(frame["iteration"] != "all")
    assert set(steps["model_flops"]) == {model}
    recompute = 2 * 8 * 8 * 256 * 256 * 64 * 4 / 2
    assert (steps["counted_flops"] - steps["model_flops"]).to_list() == pytest.approx([recompute] * 3, rel=1e-9)
    full = trace.mfu(params=params, tokens=tokens, layers=4, d_model=512, seq=256, full_attention=True)
    assert full["model_flops"][0] == 6 * params * tokens + 12 * 4 * 256 * 512 * tokens


@pytest.mark.parametrize("bad", [{"params": 1e6}, {"params": 1e6, "tokens": 10, "layers": 2},
                                 {"model_flops": 1e9, "params": 1e6, "tokens": 10}, {"layers": 2, "d_model": 8, "seq": 4}])
def test_incomplete_descriptions_are_refused(trace, bad) -> None:
    from traceq.errors import OptionError

    with pytest.raises(OptionError):
        trace.mfu(**bad)


QWEN = ("realtraces", "kineto_json", "AMD-AGI__TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")


def test_qwen_prefill_mfu_by_hand(tmp_path) -> None:
    """HF Qwen1.5-0.5B, one prefill step of 16 x 559 tokens on an H100 (TraceLens' sample): its 24
    layers' linear weights (4 x 1024^2 + 3 x 1024 x 2816 each, 308,281,344; the trace has no LM
    head), d 1024, causal. 2 P T + 4 L S d T / 2 is exactly what traceq counts from the shapes
    (linear layers and causal SDPA), so MFU = HFU but for the rotary embedding's tiny matmul; MFU
    equals the hand value over the step's span
    read from the raw JSON at the H100 SXM's dense BF16 peak (132 SMs x 1.98 GHz x 4,096: the
    trace records no clock, traceq takes the product's maximum)."""
    import traceq

    path = shared(*QWEN)
    t = traceq.load(path, tmp_path / "q.duckdb")
    params, tokens, seq = 24 * (4 * 1024**2 + 3 * 1024 * 2816), 16 * 559, 559
    frame = t.mfu(params=params, tokens=tokens, inference=True, layers=24, d_model=1024, seq=seq)
    (name, span), = _raw_spans(path).items()
    row = frame.filter(frame["iteration"] == name).row(0, named=True)
    model = 2 * params * tokens + 4 * 24 * seq * 1024 * tokens / 2
    peak = 132 * 1.98e9 * 4096
    assert row["model_flops"] == model and row["precision"] == "bf16"
    assert row["peak_flops"] == pytest.approx(peak, rel=1e-6)
    assert abs(row["time_ns"] - span) <= 2
    assert row["mfu_pct"] == pytest.approx(100 * model / (span / 1e9 * peak), rel=1e-4)
    rotary = 2 * 32 * 1 * 559  # the rotary embedding's frequencies x positions, an aten::matmul
    assert row["counted_flops"] == pytest.approx(model + rotary, rel=1e-12)
    assert row["hfu_pct"] == pytest.approx(row["mfu_pct"] * (model + rotary) / model, rel=1e-9)


def test_run_mfu_per_rank_and_together(tmp_path) -> None:
    """traceq mfu --run on the GPT under FSDP on 2 H200s: each rank's rows are its trace's; the
    ranks together last, per step, as long as the slower rank's span read from its raw JSON, with
    both ranks' model FLOPs over both GPUs' peaks."""
    import traceq
    from traceq.cli import app

    files = [sample(f"conventions/gpt_kineto_fsdp_rank{r}.json.gz") for r in (0, 1)]
    db = tmp_path / "r.duckdb"
    loaded = CliRunner().invoke(app, ["load", *map(str, files), "--run", "fsdp", "--db", str(db)])
    assert loaded.exit_code == 0, loaded.output
    store = traceq.open(db)
    flops = 2.0e11
    frame = store.run("fsdp").mfu(model_flops=flops)
    spans = [_raw_spans(f) for f in files]
    for r in (0, 1):
        rank = frame.filter(frame["rank"] == str(r), frame["iteration"] != "all")
        for name, time_ns in rank.select("iteration", "time_ns").iter_rows():
            assert abs(time_ns - spans[r][name]) <= 2
    together = frame.filter(frame["rank"] == "all ranks")
    assert together["iteration"].to_list() == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4", "all"]
    for name, time_ns, mfu in together.select("iteration", "time_ns", "mfu_pct").head(3).iter_rows():
        slowest = max(spans[0][name], spans[1][name])
        assert abs(time_ns - slowest) <= 2
        assert mfu == pytest.approx(100 * 2 * flops / (slowest / 1e9 * 2 * H200_BF16), rel=1e-4)
    total = together.row(3, named=True)
    slowest = sum(max(spans[0][n], spans[1][n]) for n in spans[0])
    assert total["mfu_pct"] == pytest.approx(100 * 6 * flops / (slowest / 1e9 * 2 * H200_BF16), rel=1e-4)


def test_mfu_of_an_nsys_trace_without_shapes_by_hand(tmp_path) -> None:
    """The GPT under nsys (no shapes recorded: traceq counts no FLOPs) with the model described:
    each step's MFU equals (6 P T + 12 L S d T / 2) over the step's GPU span times the H200's
    bf16 peak, all computed here from the raw export: the span from the kernels, copies and
    sets whose launching call starts inside `train_step N`."""
    import sqlite3

    import traceq

    path = sample("conventions/gpt_nsys_train_step.sqlite")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    text = "coalesce(text, (SELECT value FROM StringIds WHERE id = textId))"
    steps = con.execute(f"SELECT {text}, start, \"end\" FROM NVTX_EVENTS WHERE {text} LIKE 'train_step %'").fetchall()
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    work = []
    for table in sorted(tables & {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                                  "CUPTI_ACTIVITY_KIND_MEMSET"}):
        work += con.execute(f'SELECT w.start, w."end", r.start FROM {table} w JOIN CUPTI_ACTIVITY_KIND_RUNTIME r '
                            "ON r.correlationId = w.correlationId AND r.globalTid >> 24 = w.globalPid >> 24").fetchall()
    con.close()
    params, tokens, layers, d, seq = 16_777_216, 2_048, 4, 512, 256
    model = 6 * params * tokens + 12 * layers * seq * d * tokens // 2
    peak = 132 * 1.98e9 * 4096  # H200: SMs x boost clock x dense bf16 FLOP per SM per clock
    want = {}
    for name, lo, hi in steps:
        inside = [(s, e) for s, e, call in work if lo <= call < hi]
        want[name] = 100 * model / ((max(e for _, e in inside) - min(s for s, _ in inside)) * 1e-9 * peak)
    frame = traceq.load(path, tmp_path / "s.duckdb").mfu(params=params, tokens=tokens, layers=layers, d_model=d,
                                                         seq=seq, precision="bf16")
    got = {r["iteration"]: r["mfu_pct"] for r in frame.iter_rows(named=True) if r["iteration"] in want}
    assert got.keys() == want.keys() and len(want) == 3
    assert all(abs(got[k] - want[k]) <= 0.02 * want[k] for k in want), (got, want)
    assert frame["counted_flops"].sum() == 0


def test_mfu_of_a_compiled_run_by_hand(tmp_path) -> None:
    """The GPT under torch.compile (Kineto, its compiled forward and backward graphs, Triton
    kernels): each step's MFU from the description equals the model's FLOPs over the step's GPU
    span times the bf16 peak, the span read from the raw JSON (the GPU work whose launching
    runtime or driver call begins inside `ProfilerStep#N`), within 2 %."""
    import traceq

    path = sample("conventions/gpt_kineto_compile.json.gz")
    with gzip.open(path) as raw:
        events = json.load(raw)["traceEvents"]
    steps = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")}
    calls = {e["args"]["correlation"]: e["ts"] for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    work = [(e["ts"], e["ts"] + e["dur"], calls.get(e["args"].get("correlation"))) for e in events
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    params, tokens, layers, d, seq = 16_777_216, 2_048, 4, 512, 256
    model = 6 * params * tokens + 12 * layers * seq * d * tokens // 2
    peak = 132 * 1.98e9 * 4096
    want = {}
    for name, (lo, hi) in steps.items():
        inside = [(s, e) for s, e, call in work if call is not None and lo <= call < hi]
        want[name] = 100 * model / ((max(e for _, e in inside) - min(s for s, _ in inside)) * 1e-6 * peak)
    frame = traceq.load(path, tmp_path / "s.duckdb").mfu(params=params, tokens=tokens, layers=layers, d_model=d,
                                                         seq=seq)
    got = {r["iteration"]: r["mfu_pct"] for r in frame.iter_rows(named=True) if r["iteration"] in want}
    assert got.keys() == want.keys() and len(want) == 3
    assert all(abs(got[k] - want[k]) <= 0.02 * want[k] for k in want), (got, want)


def test_mfu_of_cuda_graph_decode_steps_by_hand(tmp_path) -> None:
    """The GPT's inference under nsys (`--cuda-graph-trace=node`): each `decode N` replays a CUDA
    graph of one forward of 8 sequences x 1 new token, with no KV cache (tools/record_conventions.py,
    `cudagraph_infer`: `model(token)`, token (8, 1)), so each query meets one key. Each step's MFU
    from `gpt_decode.model.toml` equals 2 N T + 4 L d K T over the step's span read from the raw
    export (the replayed nodes, the argmax kernel and the token copy whose launching call starts
    inside the range) at the H200's bf16 peak, within 2 %."""
    import sqlite3

    import traceq

    path = sample("conventions/gpt_nsys_graph_infer.sqlite")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    text = "coalesce(text, (SELECT value FROM StringIds WHERE id = textId))"
    steps = con.execute(f"SELECT {text}, start, \"end\" FROM NVTX_EVENTS WHERE {text} LIKE 'decode %'").fetchall()
    work = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        work += con.execute(f'SELECT w.start, w."end", r.start FROM {table} w JOIN CUPTI_ACTIVITY_KIND_RUNTIME r '
                            "ON r.correlationId = w.correlationId AND r.globalTid >> 24 = w.globalPid >> 24").fetchall()
    graph_nodes = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL").fetchone()
    con.close()
    assert graph_nodes[0] > 16 * 40  # the steps' kernels are replayed graph nodes
    layers, d, vocab, tokens, keys = 4, 512, 8192, 8 * 1, 1
    params = layers * (3 * d * d + d * d + 2 * d * 4 * d) + d * vocab  # q, k, v, proj, fc1, fc2; the head
    model = 2 * params * tokens + 4 * layers * d * keys * tokens
    want = {}
    for name, lo, hi in steps:
        inside = [(s, e) for s, e, call in work if lo <= call < hi]
        want[name] = 100 * model / ((max(e for _, e in inside) - min(s for s, _ in inside)) * 1e-9 * H200_BF16)
    frame = traceq.load(path, tmp_path / "g.duckdb").mfu(spec=sample("conventions/gpt_decode.model.toml"))
    got = {r["iteration"]: r["mfu_pct"] for r in frame.iter_rows(named=True) if r["iteration"] != "all"}
    assert got.keys() == want.keys() and len(want) == 16
    assert all(abs(got[k] - want[k]) <= 0.02 * want[k] for k in want), (got, want)
    assert set(frame["precision"]) == {"bf16"}
