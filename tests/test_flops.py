"""FLOP counts against ground truth computed here, independently of analysis/efficiency/flops.py:

- AlexNet: the shapes PyTorch's profiler recorded (Kineto JSON `Input Dims`, `Concrete Inputs`);
- ResNet-50: the architecture's analytic count (torchvision's ResNet-50 v1.5);
- LeNet: the activation and weight sizes that the trace's own kernel grids reveal.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import polars as pl
import pytest
from conftest import sample, trace_id

from traceq.analysis.efficiency.flops import (
    _range_flops,
    kernel_flops,
    layer_flops,
    load_spec,
    op_flops,
    spec_layer_flops,
)
from traceq.analysis.kernels.classify import classify_names
from traceq.analysis.structure.layers import attributed_kernels
from traceq.errors import MissingDataError, TraceFormatError

ALEXNET = "alexnet.model.toml"
LENET = "lenet.model.toml"


# ------------------------------------------------------------------ AlexNet vs Kineto shapes

def _kineto_flops(path: Path) -> dict[str, int]:
    """Per layer of the first recorded training step: FLOPs from the profiler's op shapes.
    The convolutions and matrix products run in layer order (backward in reverse), so they are
    named by position: conv1..conv5, fc6..fc8 forward; bfc8..bfc6 (two aten::mm each: data and
    weight gradient), bconv5..bconv1 backward."""
    events = sorted((e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "cpu_op"),
                    key=lambda e: e["ts"])
    forward, backward = [], []
    for e in events:
        dims, concrete = e["args"].get("Input Dims"), e["args"].get("Concrete Inputs")
        if e["name"] == "aten::convolution":
            (n, _, *size), weight = dims[0], dims[1]
            stride, padding, dilation = (ast.literal_eval(concrete[i]) for i in (3, 4, 5))
            out = [(s + 2 * p - d * (k - 1) - 1) // st + 1
                   for s, k, st, p, d in zip(size, weight[2:], stride, padding, dilation)]
            forward.append(2 * n * math.prod(out) * math.prod(weight))
        elif e["name"] == "aten::addmm":  # bias, input [m, k], weight.t() [k, n]
            (m, k), (_, cols) = dims[1], dims[2]
            forward.append(2 * m * k * cols)
        elif e["name"] == "aten::mm":  # only backward uses mm here
            (m, k), (_, cols) = dims
            backward.append(2 * m * k * cols)
        elif e["name"] == "aten::convolution_backward":  # grad_output, input, weight; output_mask
            grad_out, weight = dims[0], dims[2]
            mask = [word == "True" for word in concrete[10].strip("[]").split(", ")]
            backward.append((mask[0] + mask[1]) * 2 * grad_out[0] * math.prod(grad_out[2:]) * math.prod(weight))
    forward, backward = forward[:8], backward[:11]  # the first of the recorded steps
    flops = dict(zip(["conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8"], forward))
    flops.update(zip(["bfc8", "bfc7", "bfc6"], [sum(backward[i:i + 2]) for i in (0, 2, 4)]))
    flops.update(zip(["bconv5", "bconv4", "bconv3", "bconv2", "bconv1"], backward[6:11]))
    return flops


def test_alexnet_spec_equals_the_kineto_shapes() -> None:
    truth = _kineto_flops(sample("alexnet_b256_kineto.json"))
    spec = spec_layer_flops(sample(ALEXNET), batch=256)
    got = dict(zip(spec["layer"], spec["flops"]))
    assert {name: got[name] for name in truth} == truth
    assert truth["conv2"] == 2 * 256 * 192 * 27 * 27 * 64 * 5 * 5  # 114.7 GFLOP, by hand


def test_alexnet_backward_skips_the_first_layers_data_gradient() -> None:
    spec = spec_layer_flops(sample(ALEXNET))
    got = dict(zip(spec["layer"], spec["flops"]))
    assert got["bconv1"] == got["conv1"]  # Kineto: output_mask [False, True, True]
    for name in ("conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8"):
        assert got["b" + name] == 2 * got[name]
    assert spec["pass"].to_list() == ["forward"] * 8 + ["backward"] * 8
    assert spec["layer"].to_list()[8:] == ["bfc8", "bfc7", "bfc6", "bconv5", "bconv4", "bconv3", "bconv2", "bconv1"]
    assert spec["flops"].dtype == pl.Int64 and set(spec["dtype"]) == {"float32"}


def test_alexnet_batch_argument_overrides_the_spec() -> None:
    full, half = spec_layer_flops(sample(ALEXNET)), spec_layer_flops(sample(ALEXNET), batch=128)
    assert (full["flops"] == 2 * half["flops"]).all()


@pytest.mark.parametrize("trace, spec", [("alexnet_b256_cudnn", ALEXNET), ("alexnet_b128_cudnn", ALEXNET),
                                         ("alexnet_b256_nocudnn", ALEXNET), ("lenet_b256_cudnn", LENET)])
def test_spec_layers_are_the_traces_ranges(sample_store, trace: str, spec: str) -> None:
    """Every spec layer (and its b-prefixed backward) is an NVTX range that ran once per iteration."""
    frame = layer_flops(sample_store, trace_id(sample_store, trace), sample(spec), batch=256)
    assert set(frame["calls"]) == {4}, frame
    assert (frame["flops"] == 4 * spec_layer_flops(sample(spec), batch=256)["flops"]).all()
    assert set(frame["source"]) == {"spec"}


# ------------------------------------------------------------------ LeNet vs its kernel grids

def test_lenet_spec_flops_by_hand() -> None:
    got = dict(spec_layer_flops(sample(LENET)).select("layer", "flops").iter_rows())
    assert got == {"conv1": 2 * 256 * 20 * 24 * 24 * 1 * 5 * 5, "conv2": 2 * 256 * 50 * 8 * 8 * 20 * 5 * 5,
                   "fc1": 2 * 256 * 800 * 500, "fc2": 2 * 256 * 500 * 10,
                   "bconv1": 2 * 256 * 20 * 24 * 24 * 25, "bconv2": 4 * 256 * 50 * 8 * 8 * 20 * 25,
                   "bfc1": 4 * 256 * 800 * 500, "bfc2": 4 * 256 * 500 * 10}
    macs_per_image = sum(layer.macs_per_sample for layer in load_spec(sample(LENET)).layers)
    assert macs_per_image == 2_293_000  # Caffe's LeNet: about 2.3 M multiply-adds per image


def test_lenet_spec_shapes_match_the_kernel_grids(sample_store) -> None:
    """PyTorch sizes these kernels' grids by element count: max_pool_forward_nchw 256 outputs a
    block, elementwise_kernel<128, 2> 256 elements, vectorized_elementwise_kernel 1024."""
    con, layers = sample_store, {layer.name: layer for layer in load_spec(sample(LENET)).layers}
    t = trace_id(con, "lenet_b256_cudnn")
    k = attributed_kernels(con, t).join(
        con.sql(f"SELECT kernel_id, grid_blocks FROM kernels WHERE trace_id = {t}").pl(), on="kernel_id")

    def grids(layer: str, kernel: str) -> set[int]:
        return set(k.filter(pl.col("layer") == layer, pl.col("short_name") == kernel)["grid_blocks"])

    def blocks(shape: tuple[int, ...], per_block: int, batch: int = 256) -> int:
        return -(-batch * math.prod(shape) // per_block)

    assert blocks(layers["conv1"].out_shape, 256) in grids("conv1", "elementwise_kernel")  # bias
    assert blocks(layers["pool1"].out_shape, 256) in grids("pool1", "max_pool_forward_nchw")
    assert blocks(layers["conv2"].out_shape, 256) in grids("conv2", "elementwise_kernel")
    assert blocks(layers["pool2"].out_shape, 256) in grids("pool2", "max_pool_forward_nchw")
    assert blocks(layers["fc1"].out_shape, 1024) in grids("relu1", "vectorized_elementwise_kernel")
    assert layers["fc1"].weight_shape == (500, 800)
    for name in ("conv2", "fc1", "fc2"):  # the weight gradient's accumulation: one element per weight
        assert blocks(layers[name].weight_shape, 1024, 1) in grids("b" + name, "vectorized_elementwise_kernel")


# ------------------------------------------------------------------ bad specs

@pytest.mark.parametrize("text, words", [
    ("[model\ninput = [3]", ["not a TOML model spec"]),
    ('[model]\ninput = [1, 28, 28]\n[[layer]]\nname = "c"\ntype = "convv"\n', ["unknown type 'convv'", "conv, linear"]),
    ('[model]\ninput = [1, 28, 28]\n[[layer]]\nname = "c"\ntype = "conv"\nkernel = 5\n', ["layer 1 (c) needs out_channels"]),
    ('[model]\ninput = [1, 28, 28]\n[[layer]]\nname = "c"\ntype = "conv"\nkernel = 5\nout_channels = 4\nstrides = 2\n',
     ["unknown key 'strides'"]),
    ('[model]\ninput = [1, 28, 28]\n[[layer]]\ntype = "conv"\nkernel = 5\nout_channels = 4\n', ["needs a name"]),
    ('[model]\ninput = [1, 4, 4]\n[[layer]]\nname = "c"\ntype = "conv"\nkernel = 5\nout_channels = 4\n',
     ["smaller than the window"]),
    ('[model]\ninput = [1, 28, 28]\ndtype = "double"\n[[layer]]\nname = "f"\ntype = "linear"\nout_features = 2\n',
     ["dtype must be one of"]),
    ('[model]\nbatch = 2\n', ["[model] needs input"]),
    ('[model]\ninput = [1, 28, 28]\n', ["no [[layer]] tables"]),
])
def test_bad_spec_is_one_line(tmp_path: Path, text: str, words: list[str]) -> None:
    path = tmp_path / "bad.model.toml"
    path.write_text(text)
    with pytest.raises(TraceFormatError) as caught:
        spec_layer_flops(path, batch=2)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message, message
    for word in words:
        assert word in message


def test_missing_spec_and_missing_batch(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot read model spec"):
        spec_layer_flops(tmp_path / "absent.toml", batch=1)
    path = tmp_path / "nobatch.toml"
    path.write_text('[model]\ninput = [4]\n[[layer]]\nname = "fc"\ntype = "linear"\nout_features = 2\n')
    with pytest.raises(MissingDataError, match="--batch"):
        spec_layer_flops(path)
    assert spec_layer_flops(path, batch=3)["flops"].to_list() == [2 * 3 * 4 * 2, 2 * 3 * 4 * 2]


def test_no_shapes_and_no_spec(sample_store) -> None:
    con = sample_store
    t = trace_id(con, "alexnet_b256_cudnn")
    assert op_flops(con, t).is_empty() and kernel_flops(con, t).is_empty()
    with pytest.raises(MissingDataError, match="emit_nvtx"):
        layer_flops(con, t)


# ------------------------------------------------------------------ op formulas

@pytest.mark.parametrize("op, sizes, flops", [
    ("aten::linear", [[32, 2048], [1000, 2048], [1000]], 2 * 32 * 2048 * 1000),
    ("aten::linear", [[4, 7, 16], [8, 16], []], 2 * 28 * 16 * 8),
    ("aten::addmm", [[1000], [32, 2048], [2048, 1000], [], []], 2 * 32 * 2048 * 1000),
    ("aten::mm", [[1000, 32], [32, 2048]], 2 * 1000 * 32 * 2048),
    ("aten::bmm", [[12, 64, 32], [12, 32, 64]], 2 * 12 * 64 * 32 * 64),
    ("aten::baddbmm", [[12, 64, 64], [12, 64, 32], [12, 32, 64], [], []], 2 * 12 * 64 * 32 * 64),
    ("aten::matmul", [[2, 1, 5, 3], [4, 3, 6]], 2 * 8 * 5 * 3 * 6),  # broadcast batch 2 x 4
    ("aten::matmul", [[3], [3, 6]], 2 * 3 * 6),
    ("aten::conv_transpose2d", [[2, 8, 5, 5], [8, 4, 3, 3], [], [], [], [], [], []], 2 * 2 * 25 * 8 * 4 * 9),
    ("aten::mm", [[3, 4], [5, 6]], None),
])
def test_op_formulas(op: str, sizes: list[list[int]], flops: int | None) -> None:
    assert _range_flops(op, sizes, None, False, False, True) == flops


# ------------------------------------------------------------------ ResNet-50 from emit_nvtx shapes

ITERATIONS, BATCH = 40, 32


def _resnet50_conv_macs() -> list[int]:
    """Multiply-adds per image of each convolution of torchvision's ResNet-50 (v1.5: the stride
    is on the 3x3 convolution), 224x224 input, in forward order."""
    macs: list[int] = []

    def conv(cin: int, cout: int, k: int, stride: int, size: int) -> int:
        out = (size + 2 * (k // 2) - k) // stride + 1
        macs.append(cin * cout * k * k * out * out)
        return out

    size = conv(3, 64, 7, 2, 224)
    size = (size + 2 - 3) // 2 + 1  # max pool 3x3, stride 2, padding 1
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            s = stride if block == 0 else 1
            mid = conv(cin, width, 1, 1, size)
            mid = conv(width, width, 3, s, mid)
            conv(width, 4 * width, 1, 1, mid)
            if block == 0:
                conv(cin, 4 * width, 1, s, size)  # the projection shortcut
            cin, size = 4 * width, mid
    return macs


def test_resnet50_forward_conv_flops_are_analytic(resnet50_store) -> None:
    con, t = resnet50_store
    ops = op_flops(con, t)
    conv = ops.filter(pl.col("op") == "aten::conv2d", pl.col("pass") == "forward")
    macs = _resnet50_conv_macs()
    assert len(macs) == 53 and conv.height == 53 * ITERATIONS
    analytic = sum(macs)  # 4.087 G; with the fc layer's 2.05 M, the usual "4.09 GMAC"
    measured = conv["flops"].sum() / 2 / ITERATIONS / BATCH
    assert abs(measured / analytic - 1) < 0.01
    assert measured == analytic  # the shapes are exact, so the count is too
    fc = ops.filter(pl.col("op") == "aten::linear")
    assert fc["flops"].to_list() == [2 * BATCH * 2048 * 1000] * ITERATIONS


def test_resnet50_backward_is_twice_forward_but_the_first_conv(resnet50_store) -> None:
    con, t = resnet50_store
    ops = op_flops(con, t)
    total = dict(ops.group_by("op", "pass").agg(pl.col("flops").sum()).select(
        pl.col("op") + "/" + pl.col("pass"), "flops").iter_rows())
    first_conv = 2 * BATCH * _resnet50_conv_macs()[0]
    assert total["aten::convolution_backward/backward"] == (
        2 * total["aten::conv2d/forward"] - ITERATIONS * first_conv)
    assert total["aten::mm/backward"] == 2 * total["aten::linear/forward"]
    assert set(ops["dtype"]) == {None}  # NVTX ranges record no dtype (Kineto operators do)


def test_resnet50_kernel_flops_add_up_and_cover_the_compute_kernels(resnet50_store) -> None:
    con, t = resnet50_store
    ops, kernels = op_flops(con, t), kernel_flops(con, t)
    by_op = lambda frame: dict(frame.group_by("op", "pass").agg(pl.col("flops").sum())  # noqa: E731
                               .select(pl.col("op") + "/" + pl.col("pass"), "flops").iter_rows())
    assert by_op(kernels) == by_op(ops)
    assert kernels["kernel_id"].is_unique().all() and set(kernels["source"]) == {"nvtx shapes"}
    names = con.sql(f"SELECT kernel_id, name FROM kernels WHERE trace_id = {t}").pl()
    classes = classify_names(names["name"].unique()).select("name", "operation")
    k = kernels.join(names, on="kernel_id").join(classes, on="name")
    compute = pl.col("operation").is_in(["convolution", "gemm"])
    assert (k.filter(compute)["flops"] > 0).all()
    assert (k.filter(~compute)["flops"] == 0).all()  # layout transforms and the like
    # every forward convolution or GEMM kernel of the trace lies in some op range
    attributed = attributed_kernels(con, t).filter(pl.col("pass") == "forward", compute)
    assert set(attributed["kernel_id"]) <= set(k.filter(pl.col("flops") > 0)["kernel_id"])


def test_resnet50_layer_flops_follow_the_attribution(resnet50_store) -> None:
    con, t = resnet50_store
    frame = layer_flops(con, t)
    assert frame["flops"].sum() == op_flops(con, t)["flops"].sum()
    convs = frame.filter(pl.col("layer").str.starts_with("conv2d #"))  # emit_nvtx: layers by op sequence
    for p in ("forward", "backward"):  # each of the 53 convolutions once an iteration, its backward too
        calls = convs.filter(pl.col("pass") == p)["calls"]
        assert calls.len() == 53 and (calls == ITERATIONS).all()
    assert set(frame["source"]) == {"nvtx shapes"}
