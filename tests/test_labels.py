"""Labels that were wrong (issue 33, requirement 3), each checked against what the raw trace files
say, read here with sqlite3, json and gzip rather than through traceq:

- attention kernels (cuDNN's SDPA, FlashAttention, ATen's memory-efficient attention) are the
  operation 'attention', on tensor cores, in the precision their names say: never FP32 math;
- the math libraries' helpers (workspace initialisation, offset tables, split-K reductions,
  epilogues, layout transforms) are not GEMMs or convolutions: no FLOPs, no precision;
- on Kineto traces a GEMM that a convolution launched is cuDNN's and its FLOPs the convolution's;
- `advise` describes a kernel that ran with several launch configurations by all of them.
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from conftest import sample, shared

from traceq.analysis.kernels.classify import classify

pytestmark = pytest.mark.xdist_group("labels")


def nsys_names(path: Path, like: str) -> list[str]:
    """Distinct demangled kernel names of an nsys export matching the SQL LIKE pattern."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return sorted(r[0] for r in con.execute(
            "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
            "WHERE s.value LIKE ?", [like]))
    finally:
        con.close()


def kineto_events(path: Path) -> list[dict]:
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
        return json.load(f)["traceEvents"]


def kineto_names(path: Path, pattern: str) -> list[str]:
    return sorted({e["name"] for e in kineto_events(path) if e.get("cat") == "kernel" and re.search(pattern, e["name"])})


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    """A store with the traces these tests read, by name."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    con = open_store(tmp_path_factory.mktemp("labels") / "labels.duckdb", create=True)
    ids = {}
    for name in ("conventions/gpt_nsys_graph_infer.sqlite", "multigpu/fsdp_transformer_2gpu_rank0.sqlite",
                 "multigpu/fsdp_transformer_2gpu_kineto_rank0.json.gz", "resnet50_b32_amp_layers_kineto.json.gz"):
        ids[name] = load_trace(con, sample(name)).trace_id
    return con, ids


# --- 1. attention ----------------------------------------------------------------------------

# (file, how to read its names, pattern): the attention kernels of our samples and of public traces
ATTENTION = [
    ("conventions/gpt_nsys_graph_infer.sqlite", "%sdpa%"),  # cuDNN's SDPA forward (ours, H200)
    ("conventions/gpt_nsys_train_step.sqlite", "%sdpa%"),  # training: forward and backward
    ("multigpu/fsdp_transformer_2gpu_rank0.sqlite", "fmha%"),  # ATen's memory-efficient attention, float
]


def dtype_token(name: str) -> str:
    """The number format an attention kernel's name states, read here by hand-written patterns:
    cuDNN's '_wgmma_f16_', CUTLASS template types, ATen's 'fmha_cutlassF_f32_..._sm80' (float on
    sm80+ tensor cores is 3xTF32), TensorRT-LLM's 'QkvE4m3'."""
    if re.search(r"_f16_knob|cutlass::half_t", name):
        return "fp16"
    if "cutlass::bfloat16_t" in name:
        return "bf16"
    if re.match(r"fmha_cutlass[FB]_f32_\w+_sm80\(", name):
        return "tf32"
    if "QkvE4m3" in name:
        return "fp8"
    raise AssertionError(f"no dtype in {name}")


def attention_names() -> list[str]:
    names = [n for path, like in ATTENTION for n in nsys_names(sample(path), like)]
    assert len(names) == 5  # SDPA forward (twice) and backward, fmha_cutlassF and fmha_cutlassB
    return names


def test_attention_kernels_are_attention_on_tensor_cores_in_their_names_precision() -> None:
    """cuDNN's SDPA kernels say fprop and bprop (a convolution's words, before the fix) and
    wgmma_f16; ATen's fmha_cutlass kernels on float run 3xTF32 on tensor cores from sm80."""
    for name in attention_names():
        c = classify(name)
        assert (c.operation, c.tensor_cores, c.precision) == ("attention", True, dtype_token(name)), name


def test_attention_kernels_of_public_traces() -> None:
    """FlashAttention in PyTorch (TraceLens h100 bert, Kineto) and in the flash-attn package
    (nsys-ai fixture, nsys), TensorRT-LLM's FP8 fused MHA (TraceLens b200)."""
    names = (kineto_names(shared("realtraces", "kineto_json",
                                 "AMD-AGI__TraceLens__h100__gaunernst_bert-small-uncased__1016001.json.gz"),
                          r"flash_fwd")
             + nsys_names(shared("realtraces", "nsys_more", "GindaChen__nsys-ai__fixtures__mfu_2gpu_before.sqlite"),
                          "%flash::flash_fwd%")
             + kineto_names(shared("realtraces", "kineto_json", "AMD-AGI__TraceLens__b200__eager_trace.json.gz"),
                            r"^fmha"))
    assert len(names) >= 4
    for name in names:
        c = classify(name)
        assert (c.operation, c.tensor_cores, c.precision) == ("attention", True, dtype_token(name)), name
    assert classify(names[0]).library == "PyTorch ATen"  # pytorch_flash::
    assert {classify(n).library for n in names if "void flash::" in n} == {"FlashAttention"}


def test_attention_never_counts_as_fp32_math(store) -> None:
    """The precision every launch is measured at (`kernel_precisions`, what `traceq attribute`
    keeps and `ce` uses): the SDPA kernels of an nsys trace (no operator dtypes) fp16, not TF32
    'assumed float32'; ATen's float attention TF32 on nsys and on Kineto, whose operator says
    float, not FP32."""
    from traceq.analysis.efficiency.ce import kernel_precisions

    con, ids = store
    for trace, count in (("conventions/gpt_nsys_graph_infer.sqlite", 1),
                         ("multigpu/fsdp_transformer_2gpu_rank0.sqlite", 2),
                         ("multigpu/fsdp_transformer_2gpu_kineto_rank0.json.gz", 2)):
        names = con.sql(f"SELECT kernel_id, name FROM kernels WHERE trace_id = {ids[trace]} "
                        "AND regexp_matches(name, '_sdpa_|^fmha')").pl()
        assert names["name"].n_unique() == count, trace
        got = names.join(kernel_precisions(con, ids[trace], names), on="kernel_id")
        expected = [dtype_token(n) for n in got["name"]]
        assert got["precision"].to_list() == expected, trace
        assert set(got["precision_from"]) == {"kernel name"} and got["tensor_cores"].all()


def test_an_attention_kernel_whose_name_and_operator_say_nothing_is_not_assumed_float32() -> None:
    from traceq.analysis.efficiency.ce import _with_precision

    frame = pl.DataFrame({"name_precision": [None, None], "dtype": [None, None], "tensor_cores": [True, False],
                          "operation": ["attention", "gemm"]}, schema_overrides={"name_precision": pl.String,
                                                                                "dtype": pl.String})
    got = _with_precision(frame, None)
    assert got["precision"].to_list() == [None, "fp32"]
    assert got["precision_from"].to_list() == ["unknown", "assumed float32"]


def test_the_fp32_rule_reads_no_attention_kernel(store) -> None:
    """`advise`'s FP32-math rule looks at convolution and GEMM kernels only: cuDNN's SDPA forward
    was one of them (its name says fprop)."""
    from traceq.analysis.advise import ITERATION_REGEX, _Facts

    con, ids = store
    facts = _Facts(con, ids["conventions/gpt_nsys_graph_infer.sqlite"], ITERATION_REGEX, None)
    math = facts.classified.filter(pl.col("operation").is_in(["gemm", "convolution"]))
    assert math.height and not math["name"].str.contains("(?i)sdpa|flash|fmha|attention").any()
    attention = facts.classified.filter(pl.col("name").str.contains("_sdpa_"))
    assert attention.select("operation", "tensor_cores", "precision").rows() == [("attention", True, "fp16")]


# --- 2. helpers of the math libraries --------------------------------------------------------

HELPER = re.compile(r"init_device_workspace|compute\w*Offsets|compute_gemm_pointers|splitKreduce|ReduceSplitK"
                    r"|reduce_1Block|reduce_wgrad|epilogue::impl::globalKernel|nchwToNhwc|nhwcToNchw|flip_filter")
"""Helpers by their names, written here: cuDNN's workspace initialisation and offset tables,
split-K reductions (cuBLAS, cuBLASLt, cuDNN's CUTLASS, cuDNN's wgrad helper), cuBLASLt's
epilogue kernel, layout transforms."""


def test_helper_kernels_are_neither_gemms_nor_convolutions() -> None:
    """Every helper name of the bundled nsys samples and of the public DLProf trace (FFT
    convolution helpers): no GEMM, convolution or attention, no precision, no tensor cores."""
    names = [n for path in sorted(Path(sample("alexnet_b256_cudnn.sqlite")).parent.glob("*.sqlite"))
             for n in nsys_names(path, "%") if HELPER.search(n)]
    names += [n for n in nsys_names(shared("realtraces", "nsys_sqlite", "MohanadOdema__DLProf__nsys_profile.sqlite"),
                                    "%") if HELPER.search(n)]
    kinds = {re.search(HELPER, n).group(0) for n in names}
    assert {"init_device_workspace", "splitKreduce", "ReduceSplitK", "reduce_wgrad", "epilogue::impl::globalKernel",
            "nchwToNhwc", "computeOffsets", "compute_gemm_pointers", "flip_filter"} <= kinds
    for name in names:
        c = classify(name)
        assert c.operation not in ("gemm", "convolution", "attention"), name
        assert c.precision is None and not c.tensor_cores, name


def test_helpers_carry_no_flops_and_the_convolutions_keep_theirs(store) -> None:
    """Kineto ResNet-50 AMP sample: cuDNN's wgrad reduction helper, layout transforms and the
    like get none of their operator's FLOPs; the operators' FLOPs all reach their convolution and
    GEMM kernels (an operator's FLOPs are the sum over its kernels)."""
    from traceq.analysis.efficiency.ce import kernel_ce
    from traceq.analysis.efficiency.flops import op_flops

    con, ids = store
    t = ids["resnet50_b32_amp_layers_kineto.json.gz"]
    k = kernel_ce(con, t)
    helpers = k.filter(pl.col("name").str.contains(HELPER.pattern))
    assert helpers["name"].str.contains("reduce_wgrad").any() and helpers["name"].str.contains("nchwToNhwc").any()
    assert helpers["flops"].sum() == 0
    assert k["flops"].sum() == pytest.approx(float(op_flops(con, t)["flops"].sum()), rel=1e-12)
    assert set(k.filter(pl.col("flops") > 0)["operation"]) == {"convolution", "gemm"}


# --- 3. a convolution's GEMMs are cuDNN's ------------------------------------------------------

def pytorch_flops(path: Path) -> dict[str, float]:
    """PyTorch's own FLOP count per op name (`FunctionEvent.flops`, written beside the sample),
    each op once: a row nested in another row of the same name and thread is the same op."""
    with gzip.open(path, "rt") as f:
        rows = json.load(f)
    outer = [r for r in rows if not any(o is not r and o["name"] == r["name"] and o["thread"] == r["thread"]
                                        and o["start_us"] <= r["start_us"] and r["end_us"] <= o["end_us"]
                                        for o in rows)]
    totals: dict[str, float] = {}
    for r in outer:
        totals[r["name"]] = totals.get(r["name"], 0.0) + r["flops"]
    totals["conv1"] = sum(r["flops"] for r in outer  # the convolution of the RGB input
                          if r["name"] == "aten::conv2d" and r["input_shapes"][0][1] == 3)
    return totals


def test_gemms_launched_by_convolutions_are_cudnns_with_the_convolutions_flops(store) -> None:
    """Kineto ResNet-50 AMP sample (PyTorch 2.11, cuDNN 9.19, H200): cuDNN ran some convolutions
    as cuBLAS GEMMs (nvjet, cutlass_80_tensorop). Their launching operator, read here from the
    JSON (a kernel's External id is its operator's), is aten::cudnn_convolution or
    aten::convolution_backward for 144 of them; the other 6 GEMMs are the fc layer's addmm and
    mm. cuBLAS is then the fc layer's: its 6 kernels and PyTorch's count of addmm and mm FLOPs
    (0.79 GFLOP), not 12 % of the time and 534 GFLOP; cuDNN has all the convolutions' FLOPs:
    forward, weight gradient and data gradient (3x PyTorch's forward count) but conv1's data
    gradient, which nothing needs."""
    from traceq.analysis.efficiency.ce import ce_table, kernel_ce

    con, ids = store
    t = ids["resnet50_b32_amp_layers_kineto.json.gz"]
    events = kineto_events(sample("resnet50_b32_amp_layers_kineto.json.gz"))
    op_of = {e["args"]["External id"]: e["name"] for e in events
             if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    gemm = re.compile(r"^nvjet_|cutlass::Kernel2<cutlass_80_")
    launched = [op_of.get(e["args"].get("External id")) for e in events
                if e.get("cat") == "kernel" and gemm.search(e["name"])]
    by_conv = sum(op in ("aten::cudnn_convolution", "aten::convolution_backward") for op in launched)
    by_linear = sum(op in ("aten::addmm", "aten::mm") for op in launched)
    assert (by_conv, by_linear, len(launched)) == (144, 6, 150)

    counted = pytorch_flops(sample("resnet50_b32_amp_layers_kineto.flops.json.gz"))
    per_library = {r["library"]: r for r in ce_table(con, t, "library").iter_rows(named=True)}
    assert per_library["cuBLAS"]["kernels"] == by_linear
    assert per_library["cuBLAS"]["flops"] == pytest.approx(counted["aten::addmm"] + counted["aten::mm"], rel=1e-9)
    assert per_library["cuDNN"]["flops"] == pytest.approx(3 * counted["aten::conv2d"] - counted["conv1"], rel=1e-9)

    k = kernel_ce(con, t).filter(pl.col("name").str.contains(gemm.pattern))
    from_conv = k.filter(pl.col("library") == "cuDNN")
    assert from_conv.height == by_conv and (from_conv["flops"] > 0).all()
    assert set(k.filter(pl.col("library") == "cuBLAS")["flops"].round(0)) == {131_072_000.0}  # 2 x 32 x 2048 x 1000


# --- 4. several launch configurations ---------------------------------------------------------

def test_low_ru_describes_every_configuration_of_a_kernel(store) -> None:
    """The GPT inference sample: the layer norm ran 144 times with 8 blocks (decode) and 9 times
    with 2,048 (prefill); its longest launch has 2,048 blocks, most of its time 8. The finding
    gives the range and the configuration that took most of the time, with its share, read here
    from the raw export."""
    from traceq.analysis.advise import ITERATION_REGEX, RULES, _Facts

    con, ids = store
    path = sample("conventions/gpt_nsys_graph_infer.sqlite")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = db.execute("SELECT k.gridX * k.gridY * k.gridZ, count(*), sum(k.\"end\" - k.start) "
                      "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                      "WHERE s.value = 'vectorized_layer_norm_kernel' GROUP BY 1 ORDER BY 3 DESC").fetchall()
    db.close()
    assert [(grid, n) for grid, n, _ in rows] == [(8, 144), (2048, 9)]
    share = 100 * rows[0][2] / sum(ns for *_, ns in rows)

    facts = _Facts(con, ids["conventions/gpt_nsys_graph_infer.sqlite"], ITERATION_REGEX, None)
    (finding,) = RULES["low_ru"](facts)
    line = next(part for part in finding.evidence.split("; ") if part.startswith("vectorized_layer_norm_kernel"))
    assert "153 launches in 2 configurations, 8 to 2,048 blocks of 128 threads" in line
    rest = finding.evidence.split(line, 1)[1]
    assert rest.startswith(f"; {share:.0f} % of its time with 8 blocks, under one wave")
    assert "(2,048 blocks of" not in finding.evidence.split("unrolled_elementwise_kernel")[0]


def test_cudnn_sdpa_named_f16_under_a_bf16_operator_is_bf16(tmp_path) -> None:
    """cuDNN's generated SDPA kernels say `f16` for either 16-bit type: under bf16 autocast (the
    GPT's step, sample_traces/conventions/gpt_ncu_step.json.gz, whose SDPA operators record
    `c10::BFloat16` inputs, read here from the raw JSON) they are bf16, from the operator."""
    import gzip
    import json

    from traceq.analysis.efficiency.ce import kernel_precisions
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    path = sample("conventions/gpt_ncu_step.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    sdpa = {tuple(e["args"]["Input type"][:3]) for e in events
            if e.get("cat") == "cpu_op" and "scaled_dot_product" in e["name"] and "Input type" in e.get("args", {})}
    assert sdpa == {("c10::BFloat16",) * 3}
    con = open_store(tmp_path / "s.duckdb", create=True)
    trace_id = load_trace(con, path).trace_id
    names = con.sql(f"SELECT kernel_id, name FROM kernels WHERE trace_id = {trace_id} AND name LIKE '%_sdpa_%'").pl()
    assert names.height == 8 and all("_f16_" in n for n in names["name"])
    got = names.join(kernel_precisions(con, trace_id, names), on="kernel_id")
    assert set(got["precision"]) == {"bf16"} and set(got["precision_from"]) == {"operator dtype"}
    con.close()
