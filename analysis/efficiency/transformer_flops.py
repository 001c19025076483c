"""FLOPs of the ops transformers spend their time in, from recorded input shapes: scaled-dot-product
attention (ATen's SDPA front end, its flash, memory-efficient and cuDNN back ends and their
backward ops, the `flash_attn` package's ops), FP8 `_scaled_mm` and grouped (MoE) GEMMs.

The counts follow PyTorch's `torch.utils.flop_counter` (a multiply-add is 2 FLOP):

- attention forward: Q K^T and P V, `2 B Hq Sq Sk Dq + 2 B Hq Sq Sk Dv` (4 B H Sq Sk D when
  Dq = Dv); the heads are the query's (grouped-query attention shares K and V heads);
- attention backward: the recomputed scores, dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q,
  `2 B Hq Sq Sk (3 Dq + 2 Dv)` (2.5 x the forward when Dq = Dv);
- causal attention (the op's `is_causal`/`causal` argument true, or a causal `custom_mask_type`)
  counts half of that, the masked half of the score matrix that FlashAttention-style kernels
  skip. PyTorch's FlopCounterMode does not halve ("We aren't accounting for causal attention
  here"), so for a causal op traceq's count is half of PyTorch's; `sdpa_flops(..., causal_half=False)`
  gives PyTorch's count;
- `_scaled_mm` (FP8): `2 m k n` as `mm`; `_grouped_mm` / `_scaled_grouped_mm`: 2 x the sum of
  the groups' m k n, from the shapes of the two operands (a 2-D operand is ragged along the
  dimension the offsets cut).

Layouts: ATen's SDPA ops and their `_scaled_dot_product_*` back ends take (B, H, S, D); the
lower-level `_flash_attention_*`, `_efficient_attention_*` and `flash_attn::` ops take
(B, S, H, D). Variable-length (nested, cu_seqlens) calls count as padded to the longest sequence.
"""

from __future__ import annotations

_BHSD, _BSHD = "bhsd", "bshd"

# op: (layout, offset of the query among the inputs (1 for a backward op: grad_out comes first),
#      index of the causal flag among the inputs, whether that flag is a mask type (0 = none))
SDPA_OPS: dict[str, tuple[str, int, int, bool]] = {
    "aten::scaled_dot_product_attention": (_BHSD, 0, 5, False),
    "aten::_scaled_dot_product_flash_attention": (_BHSD, 0, 4, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (_BHSD, 0, 4, False),
    "aten::_scaled_dot_product_efficient_attention": (_BHSD, 0, 6, False),
    "aten::_scaled_dot_product_cudnn_attention": (_BHSD, 0, 6, False),
    "aten::_scaled_dot_product_fused_attention_overrideable": (_BHSD, 0, 5, False),
    "aten::_flash_attention_forward": (_BSHD, 0, 8, False),
    "aten::_efficient_attention_forward": (_BSHD, 0, 9, True),
    "flash_attn::_flash_attn_forward": (_BSHD, 0, 5, False),
    "aten::_scaled_dot_product_flash_attention_backward": (_BHSD, 1, 11, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (_BHSD, 1, 7, False),
    "aten::_scaled_dot_product_efficient_attention_backward": (_BHSD, 1, 11, False),
    "aten::_scaled_dot_product_cudnn_attention_backward": (_BHSD, 1, 14, False),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": (_BHSD, 1, 13, False),
    "aten::_flash_attention_backward": (_BSHD, 1, 11, False),
    "aten::_efficient_attention_backward": (_BSHD, 1, 14, True),
    "flash_attn::_flash_attn_backward": (_BSHD, 1, 11, False),
}
"""The attention ops counted, forward and backward (their internal callees, e.g.
`aten::_cudnn_attention_forward`, lie inside them and are not counted again)."""

SCALED_MM_OPS = ("aten::_scaled_mm",)
GROUPED_MM_OPS = ("aten::_grouped_mm", "aten::_scaled_grouped_mm")
TRANSFORMER_FLOP_OPS = (*SDPA_OPS, *SCALED_MM_OPS, *GROUPED_MM_OPS)


def sdpa_forward_flops(q: list[int], k: list[int], v: list[int]) -> int:
    """FlopCounterMode's `sdpa_flop_count` for (B, H, S, D) query, key and value shapes."""
    b, h, s_q, d_q = q
    s_k, d_v = k[-2], v[-1]
    return 2 * b * h * s_q * s_k * d_q + 2 * b * h * s_q * s_k * d_v


def sdpa_backward_flops(q: list[int], k: list[int], v: list[int]) -> int:
    """FlopCounterMode's `sdpa_backward_flop_count` for (B, H, S, D) shapes."""
    b, h, s_q, d_q = q
    s_k, d_v = k[-2], v[-1]
    return 2 * b * h * s_q * s_k * (3 * d_q + 2 * d_v)


def sdpa_flops(op: str, sizes: list[list[int]], scalars: list[object] | None, *,
               causal_half: bool = True) -> int | None:
    """FLOPs of one attention op (`SDPA_OPS`) from its input shapes and its concrete scalar
    inputs (Kineto's Concrete Inputs, parsed; None where the trace has none: then the op counts
    as not causal). None when the shapes are not those of attention."""
    layout, first, causal_at, mask_type = SDPA_OPS[op]
    if len(sizes) < first + 3:
        return None
    q, k, v = sizes[first:first + 3]
    if not (len(q) == len(k) == len(v) == 4):
        return None
    if layout == _BSHD:  # (B, S, H, D) -> (B, H, S, D)
        q, k, v = ([s[0], s[2], s[1], s[3]] for s in (q, k, v))
    if q[0] != k[0] or k[2] != v[2] or q[3] != k[3] or min(*q, *k, *v) < 0:
        return None
    backward = first == 1
    flops = sdpa_backward_flops(q, k, v) if backward else sdpa_forward_flops(q, k, v)
    flag = scalars[causal_at] if scalars is not None and causal_at < len(scalars) else None
    causal = (isinstance(flag, int) and not isinstance(flag, bool) and flag > 0) if mask_type else flag is True
    return flops // 2 if causal and causal_half else flops


def scaled_mm_flops(sizes: list[list[int]]) -> int | None:
    """`_scaled_mm(a [m, k], b [k, n], scales...)`: 2 m k n, as `mm`."""
    if len(sizes) < 2 or len(sizes[0]) != 2 or len(sizes[1]) != 2 or sizes[0][1] != sizes[1][0]:
        return None
    (m, k), (_, n) = sizes[0], sizes[1]
    return 2 * m * k * n


def grouped_mm_flops(sizes: list[list[int]]) -> int | None:
    """`_grouped_mm(a, b, offs)`: the groups' GEMMs together. a [M, K] with b [G, K, N]: the rows
    of a are cut into groups, 2 M K N; a [G, M, K] with b [G, K, N]: 2 G M K N; a [M, K] with
    b [K, N] (K cut into groups): 2 M K N; a [G, M, K] with b [K, N] (N cut): 2 M K N."""
    if len(sizes) < 2:
        return None
    a, b = sizes[0], sizes[1]
    if not (2 <= len(a) <= 3 and 2 <= len(b) <= 3) or a[-1] != b[-2]:
        return None
    if len(a) == 3 and len(b) == 3 and a[0] != b[0]:
        return None
    m = a[-2] * (a[0] if len(a) == 3 and len(b) == 3 else 1)
    return 2 * m * a[-1] * b[-1]


def transformer_op_flops(op: str, sizes: list[list[int]], scalars: list[object] | None) -> int | None:
    """FLOPs of one op of `TRANSFORMER_FLOP_OPS`; None when its shapes do not determine them."""
    if op in SDPA_OPS:
        return sdpa_flops(op, sizes, scalars)
    if op in SCALED_MM_OPS:
        return scaled_mm_flops(sizes)
    if op in GROUPED_MM_OPS:
        return grouped_mm_flops(sizes)
    return None


__all__ = ["GROUPED_MM_OPS", "SCALED_MM_OPS", "SDPA_OPS", "TRANSFORMER_FLOP_OPS", "grouped_mm_flops",
           "scaled_mm_flops", "sdpa_backward_flops", "sdpa_flops", "sdpa_forward_flops",
           "transformer_op_flops"]
