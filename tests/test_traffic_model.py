"""The traffic model's equations (analysis/efficiency/traffic_model.py, D1 to D9) on cases worked by hand
here, and the GPU product table (analysis/efficiency/gpu_products.py) against the datasheets."""

from __future__ import annotations

import math

import pytest

from traceq.analysis.efficiency.gpu_products import gpu_product, known_gpus
from traceq.analysis.efficiency.tiles import kernel_tile
from traceq.analysis.efficiency.traffic_model import (
    ACHIEVABLE,
    LAUNCH_OVERHEAD_S,
    Conv,
    Problem,
    _gather,
    _used,
    _valid_fraction,
    conv_problem,
    predict,
)
from traceq.errors import TraceqError

CONV2 = Conv(256, 64, 27, 27, 192, 5, 5, 27, 27, (1, 1), (2, 2))  # AlexNet conv2
H100 = gpu_product("NVIDIA H100 80GB HBM3")
F16_TILE = kernel_tile(
    "void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_f16_128x128_32x3_nn_align8>(T1::Params)")


def test_implicit_gemm_dimensions() -> None:
    """D1, CUTLASS's lowering: fprop NPQ x K x CRS, dgrad NHW x C x KRS, wgrad K x CRS x NPQ."""
    assert conv_problem(CONV2, "fprop").label == f"{256 * 27 * 27}x192x{64 * 25}"
    assert conv_problem(CONV2, "dgrad").label == f"{256 * 27 * 27}x64x{192 * 25}"
    assert conv_problem(CONV2, "wgrad").label == f"192x{64 * 25}x{256 * 27 * 27}"
    assert CONV2.flops == 2 * 256 * 192 * 27 * 27 * 64 * 25


def test_padding_and_stride_shares() -> None:
    # AlexNet conv1 rows: 56 outputs x 11 taps at stride 4, padding 2, over 227 input rows
    valid = sum(0 <= o * 4 - 2 + t < 227 for o in range(56) for t in range(11))
    assert _valid_fraction(56, 227, 11, 4, 2, 1, False) == valid / (56 * 11)
    # a stride-2 data gradient: half the taps of a 3-tap axis land between output rows
    assert _valid_fraction(28, 56, 3, 2, 1, 1, True) == pytest.approx(0.5, abs=0.02)
    assert _used(56, 28, 1, 2, 0, 1) == 28  # a 1x1 stride-2 shortcut reads every other row


def test_sector_rounding_of_a_three_channel_gather() -> None:
    """D4: AlexNet conv1 in NHWC, FP32: a pixel's 3 channels are 12 contiguous bytes, pixels 4
    apart (48 bytes): a run straddles a sector boundary with probability 8/32, so 1.25 sectors."""
    conv1 = conv_problem(Conv(256, 3, 227, 227, 64, 11, 11, 56, 56, (4, 4), (2, 2)), "fprop")
    tile = kernel_tile("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16"
                       "_stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn")
    operand, _, inflation = _gather(conv1, tile, 4)
    assert operand == "A" and inflation == pytest.approx(1.25 * 32 / 12)


def test_a_square_gemm_by_hand() -> None:
    """D3 to D9 on C[4096 x 4096] = A B, K = 4096, FP16, 128 x 128 tiles, on an H100 SXM5."""
    n = 4096
    p = predict(Problem("gemm", n, n, n), F16_TILE, H100, ctas_per_sm=1, grid_blocks=1024)
    tiles, operand = 32 * 32, n * n * 2
    assert (p.tiles, p.ctas, p.splits) == (tiles, tiles, 1)
    # every CTA reads its A row panel and B column panel once; C written once
    assert p.l2_bytes == 32 * operand + 32 * operand + operand
    # A (32 MiB) exceeds half the 50 MiB L2: re-read once per group of 4 tile columns a wave covers
    half_l2 = 25 * 2**20
    assert p.dram_read_bytes == 8 * operand + operand
    assert p.dram_write_bytes == pytest.approx(operand - half_l2 * operand / (operand + 9 * operand))
    # 1024 tiles on 132 SMs: 7 full waves and one of 100 CTAs
    tile_time = 2 * 128 * 128 * n / (4096 * 1.98e9)
    assert p.peak_times["compute"] == pytest.approx(8 * tile_time)
    assert p.times["compute"] == pytest.approx(8 * tile_time / ACHIEVABLE["tensor"])
    assert p.times["L2"] == pytest.approx(p.l2_bytes / (5120 * 1.98e9) / ACHIEVABLE["L2"])
    # tile stores plus fragment reads of 2 x 2 warps (128 threads by default): 768 elements per K step
    assert p.shared_bytes == tiles * n * 2 * (128 + 128 + 128 * 2 + 128 * 2)
    assert p.times["shared"] == pytest.approx(p.shared_bytes / (128 * 1.98e9 * 132) / ACHIEVABLE["shared"])
    assert p.bound == "shared" and p.time_s == pytest.approx(LAUNCH_OVERHEAD_S + p.times["shared"])


def test_wave_quantization_and_split_k() -> None:
    one = predict(Problem("gemm", 128 * 132, 128, 4096), F16_TILE, H100, grid_blocks=132)
    more = predict(Problem("gemm", 128 * 133, 128, 4096), F16_TILE, H100, grid_blocks=133)
    assert more.peak_times["compute"] == pytest.approx(2 * one.peak_times["compute"])  # one CTA more: a wave more
    split = predict(Problem("gemm", 128, 128, 4096), F16_TILE, H100, grid_blocks=8)
    assert split.splits == 8 and any("split-K x8" in f for f in split.flags)
    assert split.dram_write_bytes == pytest.approx(0.0)  # 8 FP32 partial tiles stay in the L2


def test_tiny_launch_is_latency_bound() -> None:
    assert predict(Problem("gemm", 64, 64, 64), F16_TILE, H100, grid_blocks=1).bound == "latency"


def test_what_if_without_the_units_falls_back_to_fp32() -> None:
    tf32 = kernel_tile("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32"
                       "_warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn")
    p = predict(conv_problem(CONV2, "fprop"), tf32, gpu_product("V100-SXM2"), grid_blocks=132)
    assert "no tf32 units on V100-SXM2: FP32 peak" in p.flags
    # a persistent grid of 132 CTAs, 80 resident at once: 2916 tiles in 37 rounds on the FP32 cores
    assert p.peak_times["compute"] == pytest.approx(37 * 2 * 128 * 128 * 1600 / (2 * 64 * 1.53e9))


@pytest.mark.parametrize("device, row", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM5"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H200", "H200"),
    ("Tesla V100-SXM2-16GB", "V100-SXM2"), ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"), ("a100-sxm4-40gb", "A100-SXM4-40GB"),
])
def test_device_names_find_their_rows(device: str, row: str) -> None:
    assert gpu_product(device).name == row


def test_rows_against_datasheets() -> None:
    """SMs x FP32 lanes x 2 x boost clock: the datasheets' FP32 TFLOP/s; DRAM TB/s as printed."""
    assert gpu_product("V100-SXM2").peak_flops("ffma") / 1e12 == pytest.approx(15.7, abs=0.05)
    assert gpu_product("A100-SXM4-80GB").peak_flops("ffma") / 1e12 == pytest.approx(19.5, abs=0.05)
    assert gpu_product("A100-SXM4-80GB").peak_flops("fp16") / 1e12 == pytest.approx(312, abs=0.5)
    assert gpu_product("H100-SXM5").dram_bytes_per_s == 3.352e12
    assert gpu_product("A100-SXM4-40GB").l2_bytes_per_s / 1e9 == pytest.approx(7219, abs=1)  # 5120 B/clk
    assert gpu_product("V100-SXM2").l2_bytes_per_s / 1e9 == pytest.approx(3133, abs=1)  # 2048 B/clk
    assert gpu_product("V100-SXM2").l2_effective_bytes == 6 * 2**20  # one partition before Ampere
    assert math.isclose(gpu_product("H200").l2_effective_bytes, 30 * 2**20)


def test_unknown_gpu_names_the_known_ones() -> None:
    with pytest.raises(TraceqError, match="not in traceq's product table .*H100-SXM5"):
        gpu_product("GeForce 256")
    assert len(known_gpus()) >= 8
