"""FLOPs of attention, FP8 and grouped GEMMs (analysis/efficiency/transformer_flops.py), against
formulas written out here as PyTorch's torch/utils/flop_counter.py states them (chains of bmm
counts), and against PyTorch's own FlopCounterMode on the tiny GPT of the gpt_kineto samples
(sample_traces/conventions/gpt_flops.json, recorded by tools/record_flops.py on the same H200:
per call, its op, shapes and flops; per step, FLOPs per ATen op).

PyTorch does not halve causal attention; traceq does when the op's is_causal is true (the GPT's
is), so traceq's attention FLOPs are PyTorch's / 2 there and equal elsewhere."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import polars as pl
import pytest
from conftest import sample, shared

from traceq.analysis.efficiency.transformer_flops import grouped_mm_flops, scaled_mm_flops, sdpa_flops

PLAIN = "conventions/gpt_kineto_plain.json.gz"


def bmm(b: int, m: int, k: int, n: int) -> int:
    return 2 * b * m * k * n


def torch_sdpa(q, k, v) -> int:
    (b, h, sq, dq), sk, dv = q, k[2], v[3]
    return bmm(b * h, sq, dq, sk) + bmm(b * h, sq, sk, dv)


def torch_sdpa_backward(q, k, v) -> int:
    (b, h, sq, dq), sk, dv = q, k[2], v[3]
    return (bmm(b * h, sq, dq, sk) + bmm(b * h, sq, dv, sk) + bmm(b * h, sk, sq, dv)
            + bmm(b * h, sq, sk, dq) + bmm(b * h, dq, sq, sk))


@pytest.mark.parametrize(("q", "k", "v"), [([8, 8, 256, 64], [8, 8, 256, 64], [8, 8, 256, 64]),
                                           ([2, 32, 128, 128], [2, 8, 512, 128], [2, 8, 512, 96])])
def test_attention_follows_pytorchs_formulas(q, k, v) -> None:
    fwd, bwd = torch_sdpa(q, k, v), torch_sdpa_backward(q, k, v)
    # not causal: PyTorch's count, whichever back end; backward ops take grad_out first
    none = ["", "", "", "", "0.", "False"]
    assert sdpa_flops("aten::scaled_dot_product_attention", [q, k, v, []], [None] * 8) == fwd
    assert sdpa_flops("aten::_scaled_dot_product_flash_attention", [q, k, v], [None, None, None, 0.0, False]) == fwd
    assert sdpa_flops("aten::_scaled_dot_product_efficient_attention_backward", [q, q, k, v, [], q], none) == bwd
    # causal: half, read from the flag at the op's own position
    causal = [None] * 20
    causal[6] = True
    assert sdpa_flops("aten::_scaled_dot_product_cudnn_attention", [q, k, v], causal) == fwd // 2
    assert sdpa_flops("aten::_scaled_dot_product_flash_attention", [q, k, v], causal) == fwd  # its flag is at 4
    causal[14] = True
    assert sdpa_flops("aten::_scaled_dot_product_cudnn_attention_backward", [q, q, k, v], causal) == bwd // 2
    # (B, S, H, D) ops, and a causal mask type
    bshd = [[s[0], s[2], s[1], s[3]] for s in (q, k, v)]
    assert sdpa_flops("flash_attn::_flash_attn_forward", bshd, [None] * 5 + [True]) == fwd // 2
    mask = [None] * 9 + [1]
    assert sdpa_flops("aten::_efficient_attention_forward", bshd, mask) == fwd // 2
    assert sdpa_flops("aten::_efficient_attention_forward", bshd, [None] * 9 + [0]) == fwd
    assert sdpa_flops("aten::scaled_dot_product_attention", [q[:3], k, v], None) is None


def test_fp8_and_grouped_gemms() -> None:
    assert scaled_mm_flops([[4096, 1024], [1024, 512], [], []]) == 2 * 4096 * 1024 * 512
    assert scaled_mm_flops([[4096, 1024], [512, 1024]]) is None
    # MoE: 8 experts, 4096 routed token rows cut among them, each expert 1024 -> 2816
    assert grouped_mm_flops([[4096, 1024], [8, 1024, 2816], [8]]) == sum(2 * 512 * 1024 * 2816 for _ in range(8))
    assert grouped_mm_flops([[8, 512, 1024], [8, 1024, 2816]]) == 8 * 2 * 512 * 1024 * 2816
    assert grouped_mm_flops([[1024, 4096], [4096, 2816], [8]]) == 2 * 1024 * 4096 * 2816  # K cut (weight grad)
    assert grouped_mm_flops([[8, 512, 1024], [4, 1024, 2816]]) is None


def reference() -> dict:
    return json.loads(sample("conventions/gpt_flops.json").read_text())


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory):
    import traceq

    return traceq.load(sample(PLAIN), tmp_path_factory.mktemp("tflops") / "s.duckdb")


def test_each_op_equals_pytorchs_flop_counter(trace) -> None:
    """Per call, on the same model: traceq's attention ops (forward: the aten::scaled_dot_product_attention
    around cuDNN's, backward: cuDNN's) count PyTorch's FLOPs halved (causal, as the raw JSON's
    Concrete Inputs say); its linear layers the addmm PyTorch counts them as, its backward mm
    the same mm; 3 profiled steps, each the one step PyTorch counted."""
    from traceq.analysis.efficiency.flops import op_flops

    with gzip.open(sample(PLAIN)) as raw:
        events = json.load(raw)["traceEvents"]
    flags = {e["args"]["Concrete Inputs"][6] for e in events
             if e.get("name") == "aten::_scaled_dot_product_cudnn_attention"}
    assert flags == {"True"}
    ref = reference()
    pytorch = Counter()
    for call in ref["calls"]:
        op = {"aten::_scaled_dot_product_cudnn_attention": "attention",
              "aten::_scaled_dot_product_cudnn_attention_backward": "attention backward",
              "aten::addmm": "linear", "aten::mm": "mm"}[call["op"]]
        pytorch[op, call["flops"] // 2 if op.startswith("attention") else call["flops"]] += 3
    ops = op_flops(trace.con, trace.id)
    names = {"aten::scaled_dot_product_attention": "attention",
             "aten::_scaled_dot_product_cudnn_attention_backward": "attention backward",
             "aten::linear": "linear", "aten::mm": "mm"}
    ours = Counter((names[op], flops) for op, flops in ops.select("op", "flops").iter_rows())
    assert ours == pytorch
    assert sum(ref["flop_counter"].values()) == ref["total"]
    assert sum(n * f for (_, f), n in ours.items()) == 3 * (ref["total"] - (
        ref["flop_counter"]["aten._scaled_dot_product_cudnn_attention"]
        + ref["flop_counter"]["aten._scaled_dot_product_cudnn_attention_backward"]) // 2)
    passes = {(op, p) for op, p in ops.select("op", "pass").iter_rows() if "attention" in op}
    assert passes == {("aten::_scaled_dot_product_cudnn_attention_backward", "backward"),
                      ("aten::scaled_dot_product_attention", "forward")}


@pytest.mark.parametrize("name", ["gpt_kineto_plain", "gpt_kineto_compile", "gpt_kineto_fsdp_rank0",
                                  "gpt_kineto_fsdp_rank1"])
def test_hfu_counts_attention(name, tmp_path) -> None:
    """traceq mfu's counted FLOPs per step are PyTorch's step total with causal attention halved,
    all of it placed on the step's kernels (the attention kernels get the attention ops'): eager,
    under torch.compile (Inductor calls the cuDNN attention op itself) and on each FSDP rank (each
    runs the whole model on its own batch of 8). MFU from the hand formula (6 P T + 12 L S d T / 2)
    is within 2 % of that HFU: only the backward's recomputed scores differ."""
    import traceq

    ref = reference()
    attention = (ref["flop_counter"]["aten._scaled_dot_product_cudnn_attention"]
                 + ref["flop_counter"]["aten._scaled_dot_product_cudnn_attention_backward"])
    t = traceq.load(sample(f"conventions/{name}.json.gz"), tmp_path / "s.duckdb")
    frame = t.mfu(params=ref["matmul_params"], tokens=ref["batch"] * ref["seq"], layers=4, d_model=512,
                  seq=ref["seq"])
    steps = frame.filter(frame["iteration"] != "all")
    assert steps.height == 3
    assert steps["counted_flops"].to_list() == pytest.approx([ref["total"] - attention / 2] * 3, rel=1e-9)
    assert steps["model_flops"][0] == 6 * 16_777_216 * 2048 + 12 * 4 * 256 * 512 * 2048 / 2
    for mfu, hfu in steps.select("mfu_pct", "hfu_pct").iter_rows():
        assert hfu == pytest.approx(mfu, rel=0.02) and hfu > mfu


BERT = ("realtraces", "kineto_json", "AMD-AGI__TraceLens__h100__gaunernst_bert-small-uncased__1016001.json.gz")


def test_bidirectional_attention_counts_whole(tmp_path) -> None:
    """BERT's SDPA says is_causal False (TraceLens' H100 trace): each op counts 4 B H Sq Sk D, read
    here from the raw JSON's shapes, not halved."""
    import traceq
    from traceq.analysis.efficiency.flops import op_flops

    path = shared(*BERT)
    with gzip.open(path) as raw:
        events = json.load(raw)["traceEvents"]
    expected = []
    for e in events:
        if e.get("name") == "aten::scaled_dot_product_attention":
            (b, h, sq, d), k = e["args"]["Input Dims"][:2]
            assert e["args"]["Concrete Inputs"][5] == "False"
            expected.append(4 * b * h * sq * k[2] * d)
    t = traceq.load(path, tmp_path / "b.duckdb")
    ops = op_flops(t.con, t.id).filter(op="aten::scaled_dot_product_attention")
    assert len(expected) == 4 and sorted(ops["flops"].to_list()) == sorted(expected)


def test_traffic_model_leaves_attention_out() -> None:
    """DeLTA's traffic model covers convolutions and GEMMs: an attention op whose S equals its D
    (so Q and K would chain like a matrix product) gets no GEMM candidate; FP8 _scaled_mm does."""
    from traceq.analysis.efficiency.traffic_shapes import op_candidates

    qkv = [[8, 8, 64, 64]] * 3
    assert op_candidates("aten::_scaled_dot_product_cudnn_attention", qkv, None, False, False, False) == []
    assert op_candidates("aten::_grouped_mm", [[512, 64], [8, 64, 32]], None, False, False, False) == []
    (kind, problem), = op_candidates("aten::_scaled_mm", [[64, 128], [128, 32]], None, False, False, False)
    assert (kind, problem.m, problem.n, problem.k) == ("gemm", 64, 32, 128)


def test_fp8_grouped_and_causal_attention_in_a_recorded_trace(tmp_path) -> None:
    """tools/record_fp8.py on an H200 (3 repetitions): an FP8 `_scaled_mm`, a bf16 `_grouped_mm`
    of 8 experts and SDPA causal and not, forward and backward. Per op, traceq's FLOPs equal
    PyTorch's FlopCounterMode for one repetition times 3, attention halved where the raw JSON's
    Concrete Inputs say causal (PyTorch does not halve); the grouped GEMM, which FlopCounterMode
    of PyTorch 2.11 does not count, equals 2 x rows x K x N from the recorded shapes."""
    import traceq
    from traceq.analysis.efficiency.flops import op_flops

    path = sample("conventions/fp8_grouped_kineto.json.gz")
    ref = json.loads(sample("conventions/fp8_grouped_flops.json").read_text())
    assert set(ref["ran"].values()) == {"ok"}
    reps = ref["repetitions"]
    with gzip.open(path) as raw:
        events = [e for e in json.load(raw)["traceEvents"] if e.get("cat") == "cpu_op"]
    sdpa = [e for e in events if e["name"] == "aten::scaled_dot_product_attention"]
    causal = [e["args"]["Concrete Inputs"][5] == "True" for e in sdpa]
    assert sorted(causal) == [False] * reps + [True] * reps
    share = sum(0.5 if c else 1.0 for c in causal) / len(causal)  # of PyTorch's (unhalved) count
    grouped = [e["args"]["Input Dims"] for e in events if e["name"] == "aten::_grouped_mm"]
    assert len(grouped) == reps
    expected = {
        "aten::_scaled_mm": reps * ref["flop_counter"]["aten._scaled_mm"],
        "aten::scaled_dot_product_attention": round(
            reps * share * ref["flop_counter"]["aten._scaled_dot_product_cudnn_attention"]),
        "aten::_scaled_dot_product_cudnn_attention_backward": round(
            reps * share * ref["flop_counter"]["aten._scaled_dot_product_cudnn_attention_backward"]),
        "aten::_grouped_mm": sum(2 * a[0] * a[1] * b[2] for a, b, *_ in grouped),
    }
    t = traceq.load(path, tmp_path / "s.duckdb")
    ours = {op: int(f) for op, f in op_flops(t.con, t.id).group_by("op").agg(pl.col("flops").sum()).iter_rows()}
    assert ours == expected
