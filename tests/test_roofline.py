"""`traceq roofline` (issue 36): bytes from recorded shapes, arithmetic intensity and the roof at
it, checked on the GPT Kineto sample against the raw trace read here: each GEMM kernel's op found
through Kineto's External id (the product goes by launch time instead), its bytes worked out by
hand from the op's shapes, the roof from the H200's published 4.8 TB/s."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import pytest
from conftest import sample
from typer.testing import CliRunner

from traceq.analysis.efficiency.roofline import operator_bytes
from traceq.api.loading import load_trace
from traceq.api.store import Store
from traceq.cli import app
from traceq.store import open_store

GPT = "conventions/gpt_kineto_plain.json.gz"
NO_SHAPES = "conventions/cnn_nsys_gpu_metrics.sqlite"
H200_DRAM = 4.8e12  # bytes/s, NVIDIA's H200 datasheet


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("roofline") / "s.duckdb"
    con = open_store(path, create=True)
    for name in (GPT, NO_SHAPES):
        load_trace(con, sample(name))
    con.close()
    return path


def test_operator_bytes_by_hand() -> None:
    mm = operator_bytes("aten::mm", "[[2048,8192],[8192,512]]", '["c10::BFloat16","c10::BFloat16"]',
                        flops=2 * 2048 * 8192 * 512)
    assert mm == (2048 * 8192 + 8192 * 512 + 2048 * 512) * 2
    add = operator_bytes("aten::add", "[[8,256,512],[8,256,512],[]]", '["float","float","Scalar"]')
    assert add == 3 * 8 * 256 * 512 * 4
    copy = operator_bytes("aten::copy_", "[[8,256],[8,256],[]]", '["c10::BFloat16","float",""]')
    assert copy == 8 * 256 * (2 + 4)
    sdpa = operator_bytes("aten::scaled_dot_product_attention", "[[8,8,256,64],[8,8,256,64],[8,8,256,64],[]]",
                          '["c10::BFloat16","c10::BFloat16","c10::BFloat16",""]')
    assert sdpa == 4 * 8 * 8 * 256 * 64 * 2
    assert operator_bytes("aten::mm", "not json", "[]") is None


def _gemm_reference() -> dict[str, float]:
    """Per kernel name: bytes of the GEMM ops (mm, addmm, bmm) that launched its kernels, found
    by External id, each op's bytes (inputs read, the m x n output written, all bf16 or fp32)
    shared among its kernels by duration."""
    with gzip.open(sample(GPT)) as f:
        events = json.load(f)["traceEvents"]
    sizes = {"c10::BFloat16": 2, "float": 4}
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and e["name"] in ("aten::mm", "aten::addmm", "aten::bmm")}
    kernels = defaultdict(list)
    for e in events:
        if e.get("cat") == "kernel" and e["args"].get("External id") in ops:
            kernels[e["args"]["External id"]].append(e)
    out: dict[str, float] = defaultdict(float)
    for ext, ks in kernels.items():
        op = ops[ext]
        dims, types = op["args"]["Input Dims"], op["args"]["Input type"]
        a, b = (dims[1], dims[2]) if op["name"] == "aten::addmm" else (dims[0], dims[1])
        outputs = a[0] * b[-1] if len(a) == 2 else a[0] * a[1] * b[-1]
        read = sum(sizes[t] * _prod(d) for d, t in zip(dims, types) if t in sizes and d)
        total = read + outputs * sizes[types[0]]
        weights = [round(k["dur"] * 1000) + 1 for k in ks]
        for k, w in zip(ks, weights):
            out[k["name"]] += total * w / sum(weights)
    return out


def _prod(d: list[int]) -> int:
    n = 1
    for x in d:
        n *= x
    return n


def test_gemm_kernels_bytes_and_roof(db) -> None:
    expected = {n: v for n, v in _gemm_reference().items() if n.startswith("nvjet")}
    assert len(expected) >= 3
    frame = Store(db).trace("gpt_kineto_plain").roofline("kernel")
    rows = {r["name"]: r for r in frame.iter_rows(named=True)}
    for name, value in expected.items():
        row = rows[name]
        assert row["bytes"] == pytest.approx(value, rel=2e-3), name
        intensity = row["flops"] / value
        assert row["intensity"] == pytest.approx(intensity, rel=2e-3)
        roof = min(row["peak_tflops"], intensity * H200_DRAM / 1e12)
        assert row["bound_tflops"] == pytest.approx(roof, rel=0.01)  # the table's bandwidth: 4.8 TB/s within 1 %
        achieved = row["flops"] / (row["total_ns"] * 1e-9) / 1e12
        assert row["achieved_pct"] == pytest.approx(100 * achieved / roof, rel=0.01)
        assert row["roof"] == ("compute" if intensity * H200_DRAM / 1e12 > row["peak_tflops"] else "memory")


def test_kernels_without_flops_are_placed_by_bandwidth(db) -> None:
    frame = Store(db).trace("gpt_kineto_plain").roofline("layer")
    memory = frame.filter(frame["flops"] == 0)
    assert memory.height and (memory["roof"] == "memory").all()
    got = memory["achieved_pct"].to_list()
    expected = (memory["bytes"] / (memory["total_ns"] * 1e-9) / H200_DRAM * 100).to_list()
    assert got == pytest.approx(expected, rel=0.01)
    assert (frame["achieved_pct"].drop_nulls() < 110).all()


def test_a_trace_without_shapes_is_refused_in_one_line(db) -> None:
    result = CliRunner().invoke(app, ["roofline", "-t", "cnn_nsys_gpu_metrics", "--db", str(db)])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "shapes" in result.stderr


def _ncu_layers(net: str):
    """(layer shapes, Nsight Compute's DRAM bytes per forward layer: read + write of its kernels)."""
    from conftest import ncu_layer, ncu_rows

    shapes = json.loads(sample(f"ncu/{net}_shapes.json").read_text())
    measured: dict[str, float] = defaultdict(float)
    for row in ncu_rows(sample(f"ncu/{net}_ncu.csv.gz")):
        measured[ncu_layer(row)] += sum(float(row[f"dram__bytes_{way}.sum"].replace(",", "")) for way in ("read", "write"))
    return shapes, measured


def _modelled(layer: dict) -> int | None:
    """operator_bytes of a hooked layer as the shapes Kineto would record give them."""
    kind = {"float16": "c10::Half", "float32": "float"}[layer["dtype"]]
    x, w, out = layer["input"], layer["weight"], layer["output"]
    if layer["type"] == "Linear":  # aten::mm of x and the transposed weight
        return operator_bytes("aten::mm", json.dumps([x, [w[1], w[0]]]), json.dumps([kind, kind]),
                              2 * _prod(x[:-1]) * w[0] * w[1])
    return operator_bytes("aten::conv2d", json.dumps([x, w]), json.dumps([kind, kind]), 2 * _prod(out) * _prod(w[1:]))


@pytest.mark.parametrize("net", ["alexnet_b256_amp", "alexnet_b256_fp32", "resnet50_b32_amp", "resnet50_b32_fp32"])
def test_gemm_bytes_against_nsight_compute(net: str) -> None:
    """The linear layers' bytes from their shapes against Nsight Compute's dram__bytes (H200):
    within 10 % each (measured: -1 % to +5 % on the 8 layers)."""
    shapes, measured = _ncu_layers(net)
    linear = [name for name, layer in shapes.items() if layer["type"] == "Linear" and name in measured]
    assert linear
    for name in linear:
        assert _modelled(shapes[name]) == pytest.approx(measured[name], rel=0.10), name


@pytest.mark.parametrize(("net", "bound"), [("alexnet_b256_fp32", 0.20), ("alexnet_b256_amp", 0.40)])
def test_convolution_bytes_against_nsight_compute(net: str, bound: float) -> None:
    """AlexNet's five convolutions from their shapes against Nsight Compute: median error 15 %
    (FP32) and 34 % (AMP), mostly over: an output that fits the 60 MB L2 is still there when the
    kernel ends (on ResNet-50, whose activations fit the L2, the median is 54-71 %). The traffic
    model, not these, gives convolutions their bytes where it has their shapes."""
    import statistics

    shapes, measured = _ncu_layers(net)
    errors = [abs(_modelled(layer) - measured[name]) / measured[name]
              for name, layer in shapes.items() if layer["type"] == "Conv2d" and name in measured]
    assert len(errors) == 5 and statistics.median(errors) < bound


def test_transformer_gemm_and_attention_bytes_against_nsight_compute(tmp_path) -> None:
    """The GPT's training step (sample_traces/conventions/gpt_ncu_step.json.gz and ncu/gpt_ncu_step_raw.csv.gz, one H200): the bytes
    `traceq roofline --by kernel` gives its GEMM (nvjet) and attention (cuDNN SDPA forward and
    backward) kernels from the recorded shapes, against Nsight Compute's DRAM bytes read +
    written of the same launches in a second run of the same step. The launches are paired here
    by launch order (the two runs launch the same 267 kernels in the same order: grid and block
    agree pair by pair), not by traceq's ncu join. Measured: median error 23 % over the 11 kernel
    names (-10 % to +33 % for 8 of them: attention's backward -10 %, its forward +33 %; +170 % to
    +198 % for three wide-tile GEMMs, whose outputs stay in the 60 MB L2 when the kernel ends)."""
    import statistics

    from conftest import ncu_rows

    events = json.loads(gzip.decompress(sample("conventions/gpt_ncu_step.json.gz").read_bytes()))["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    rows = sorted(ncu_rows(sample("ncu/gpt_ncu_step_raw.csv.gz")), key=lambda r: int(r["ID"]))
    assert len(rows) == len(kernels) == 267
    measured: dict[str, float] = defaultdict(float)
    for kernel, row in zip(kernels, rows, strict=True):
        assert tuple(kernel["args"]["grid"]) == tuple(int(v) for v in row["Grid Size"].strip("()").split(","))
        assert tuple(kernel["args"]["block"]) == tuple(int(v) for v in row["Block Size"].strip("()").split(","))
        measured[kernel["name"]] += sum(float(row[f"dram__bytes_{way}.sum"].replace(",", "")) for way in ("read", "write"))
    con = open_store(tmp_path / "g.duckdb", create=True)
    load_trace(con, sample("conventions/gpt_ncu_step.json.gz"))
    con.close()
    frame = Store(tmp_path / "g.duckdb").trace("gpt_ncu_step").roofline(by="kernel")
    picked = frame.filter(frame["name"].str.contains("nvjet|sdpa"))
    errors = {name: (modelled - measured[name]) / measured[name] for name, modelled in picked.select("name", "bytes").iter_rows()}
    assert len(errors) == 11 and sum("sdpa" in n for n in errors) == 2
    assert statistics.median(abs(e) for e in errors.values()) < 0.25
    assert all(abs(e) < 0.35 for n, e in errors.items() if "sdpa" in n)
