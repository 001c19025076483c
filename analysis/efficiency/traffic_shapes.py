"""The GEMMs a layer's kernels may compute, from its shapes: the candidates `traffic` matches
each convolution or GEMM launch against (by its name's direction and its grid).

Shapes come from a model spec (`modelspec`: layer by layer, with stride and padding) or from
the op shapes PyTorch records under `emit_nvtx(record_shapes=True)` (`flops.op_shapes`). A
recorded convolution gives input, weight and (from the op consuming it) output shapes but no
stride or padding; `conv_window` infers them from the sizes.

A candidate is (direction, Problem): direction 'fprop', 'dgrad' or 'wgrad' for the implicit
GEMMs of a convolution (D1 in `traffic_model`) and for the three GEMMs of a linear layer,
'gemm' for a recorded matrix product. A convolution also offers its GEMMs as explicit ones (im2col + GEMM, one image
at a time and the whole batch), for layers that ran that way (cuDNN off).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from traceq.analysis.efficiency.modelspec import SpecLayer
from traceq.analysis.efficiency.traffic_model import Conv, Problem, conv_problem
from traceq.analysis.efficiency.transformer_flops import GROUPED_MM_OPS, SDPA_OPS

Candidate = tuple[str, Problem]


def conv_window(size: int, out: int, kernel: int) -> tuple[int, int]:
    """(stride, padding) that take `size` input positions to `out` outputs with `kernel` taps
    (dilation 1): the smallest stride, and the padding nearest 'same' ((kernel - 1) / 2), for
    which PyTorch's floor((size + 2 pad - kernel) / stride) + 1 equals `out`."""
    if out <= 1:
        return 1, 0
    pads = sorted(range(kernel), key=lambda p: (abs(p - (kernel - 1) // 2), p))
    for stride in range(1, max(size, 1) + 1):
        for pad in pads:
            if (size + 2 * pad - kernel) // stride + 1 == out and size + 2 * pad >= kernel:
                return stride, pad
    return max(1, size // out), 0


def conv_candidates(conv: Conv, passes: Sequence[str]) -> list[Candidate]:
    """The implicit GEMMs of `passes` ('fprop', 'dgrad', 'wgrad'), then the same products as
    explicit GEMMs: one image, every image in one batched launch, the whole batch as one (D1)."""
    out: list[Candidate] = [(p, conv_problem(conv, p)) for p in passes]
    per_image = {"fprop": (conv.k, conv.p * conv.q, conv.c * conv.r * conv.s),
                 "dgrad": (conv.c * conv.r * conv.s, conv.p * conv.q, conv.k),
                 "wgrad": (conv.k, conv.c * conv.r * conv.s, conv.p * conv.q)}
    for p in passes:
        m, n, k = per_image[p]
        out.append((p, Problem("gemm", m, n, k)))
        if p == "wgrad":
            out.append((p, Problem("gemm", m, n, k * conv.n)))
        else:  # the filter is A, shared by every image of a batched launch
            out.append((p, Problem("gemm", m, n, k, conv.n, shared="A")))
            out.append((p, Problem("gemm", m, n * conv.n, k)))
    return out


def gemm_candidates(rows: int, inputs: int, outputs: int, passes: Sequence[str]) -> list[Candidate]:
    """A linear layer y[rows x outputs] = x[rows x inputs] W^T: forward ('fprop') M x N x K =
    outputs x rows x inputs, data gradient rows x inputs x outputs, weight gradient outputs x
    inputs x rows. Which of M and N the kernel tiles first is decided later, by the grid."""
    dims = {"fprop": (outputs, rows, inputs), "dgrad": (inputs, rows, outputs), "wgrad": (outputs, inputs, rows)}
    return [(p, Problem("gemm", *dims[p])) for p in passes]


def spec_candidates(layer: SpecLayer, batch: int, backward: bool) -> list[Candidate]:
    """The candidates of one spec layer's forward or backward range."""
    passes = ((["dgrad"] if layer.data_grad else []) + ["wgrad"]) if backward else ["fprop"]
    if layer.type == "linear":
        outputs, inputs = layer.weight_shape
        return gemm_candidates(batch, inputs, outputs, passes)
    (c, h, w), (k, p, q) = layer.in_shape, layer.out_shape
    _, _, r, s = layer.weight_shape
    stride, pad, dilation = layer.window
    conv = Conv(batch, c, h, w, k, r, s, p, q, tuple(stride), tuple(pad), tuple(dilation),  # type: ignore[arg-type]
                layer.groups)
    return conv_candidates(conv, passes)


def recorded_candidates(layer: dict, backward: bool) -> list[Candidate]:
    """The candidates of one layer of a layer-shapes file (the JSON `tools/record_training.py
    --shapes` writes: type 'Conv2d' or 'Linear', input, output, weight, stride, padding,
    dilation, groups); empty for other layer types."""
    kind, x, y, weight = layer.get("type"), layer.get("input"), layer.get("output"), layer.get("weight")
    if not (x and y and weight):
        return []
    if kind == "Linear" and len(weight) == 2:
        passes = ["dgrad", "wgrad"] if backward else ["fprop"]
        return gemm_candidates(math.prod(x[:-1]), weight[1], weight[0], passes)
    if kind != "Conv2d" or len(x) != 4 or len(y) != 4 or len(weight) != 4:
        return []
    n, c, h, w = x
    _, k, p, q = y
    conv = Conv(n, c, h, w, k, weight[2], weight[3], p, q, tuple(layer.get("stride", (1, 1))),  # type: ignore[arg-type]
                tuple(layer.get("padding", (0, 0))), tuple(layer.get("dilation", (1, 1))),  # type: ignore[arg-type]
                int(layer.get("groups", 1)))
    return conv_candidates(conv, ["dgrad", "wgrad"] if backward else ["fprop"])


def op_candidates(op: str, sizes: list[list[int]] | None, out_shapes: list[list[int]] | None,
                  data_used: bool, weight_used: bool, has_ids: bool) -> list[Candidate]:
    """The candidates of one recorded op range (`flops.op_shapes` row); empty where the shapes
    are not those of a 2-D convolution or a matrix product (attention and grouped GEMMs are not
    modelled)."""
    if not sizes or len(sizes) < 2 or op in SDPA_OPS or op in GROUPED_MM_OPS:
        return []
    if op == "aten::convolution_backward":  # grad_output, input, weight
        if len(sizes) < 3 or len(sizes[0]) != 4 or len(sizes[1]) != 4 or len(sizes[2]) != 4:
            return []
        conv = _conv(sizes[1], sizes[2], sizes[0])
        passes = [p for p, used in (("dgrad", data_used or not has_ids), ("wgrad", weight_used or not has_ids))
                  if used]
        return conv_candidates(conv, passes) if conv else []
    if "conv" in op and "transpose" not in op:
        x, weight = sizes[0], sizes[1]
        fits = [s for s in out_shapes or [] if len(s) == 4 and len(x) == 4 and s[0] == x[0] and s[1] == weight[0]]
        conv = _conv(x, weight, fits[0]) if fits and len(weight) == 4 else None
        return conv_candidates(conv, ["fprop"]) if conv else []
    if op == "aten::linear":
        x, weight = sizes[0], sizes[1]
        if len(weight) != 2 or not x or x[-1] != weight[1]:
            return []
        return gemm_candidates(math.prod(x[:-1]), weight[1], weight[0], ["fprop"])
    return _matmul(op, sizes)


def _conv(x: list[int], weight: list[int], y: list[int]) -> Conv | None:
    n, c, h, w = x
    k, cg, r, s = weight
    _, _, p, q = y
    if not cg or c % cg or k % (c // cg):
        return None
    (sh, ph), (sw, pw) = conv_window(h, p, r), conv_window(w, q, s)
    return Conv(n, c, h, w, k, r, s, p, q, (sh, sw), (ph, pw), (1, 1), c // cg)


def _matmul(op: str, sizes: list[list[int]]) -> list[Candidate]:
    """mm, addmm, bmm, baddbmm, matmul: C = A B per (broadcast) batch entry, M x N x K =
    rows of A x columns of B x columns of A."""
    first = 1 if op in ("aten::addmm", "aten::_addmm_activation", "aten::baddbmm") else 0
    if len(sizes) < first + 2 or not sizes[first] or not sizes[first + 1]:
        return []
    a, b = sizes[first], sizes[first + 1]
    a, b = (a if len(a) > 1 else [1, *a]), (b if len(b) > 1 else [*b, 1])
    if a[-1] != b[-2]:
        return []
    batch = max(math.prod(a[:-2]), math.prod(b[:-2]))
    return [("gemm", Problem("gemm", a[-2], b[-1], a[-1], batch))]
