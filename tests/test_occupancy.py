"""Occupancy calculator: Nsight Compute ground truth, worked examples, and properties."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traceq.analysis.efficiency.gpu_specs import GpuLimits, known_ccs, limits_for_cc
from traceq.analysis.efficiency.occupancy import (
    UNLIMITED,
    kineto_occupancy,
    launch_occupancy,
    occupancy_dict,
    paper_max_blocks,
    resource_utilization,
    waves,
)
from traceq.errors import TraceqError

# Our own capture, bundled in sample_traces/ (MANIFEST.md), so this ground truth always runs.
NCU_CSV = Path(__file__).resolve().parents[1] / "sample_traces" / "alexnet_ncu_raw.csv"
NCU_ROWS = 302  # kernels in the AlexNet iteration Nsight Compute profiled
H200 = limits_for_cc(9, 0)


# --- Nsight Compute ground truth -------------------------------------------------------------

def _ncu_rows() -> list[dict[str, str]]:
    """Kernel rows of the ncu `--page raw` CSV (row 1: metric names, row 2: units)."""
    with NCU_CSV.open(newline="") as f:
        names, units, *rows = csv.reader(f)
    assert units[names.index("launch__shared_mem_config_size")] == "Kbyte"
    return [dict(zip(names, row)) for row in rows]


def _params() -> list[object]:
    if not NCU_CSV.exists():
        return [pytest.param(None, id="ncu-csv-absent")]
    return [pytest.param(row, id=f"{i}-{row['Kernel Name'][:40]}")
            for i, row in enumerate(_ncu_rows())]


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _bytes(kbyte_text: str) -> int:
    """ncu prints shared memory in Kbyte = 1000 bytes, to the byte (6 decimals)."""
    value = _num(kbyte_text) * 1000
    assert value == pytest.approx(round(value), abs=1e-6)
    return round(value)


def _ncu_waves(value: float) -> str:
    """ncu's format for launch__waves_per_multiprocessor: 2 decimals, or none when integral."""
    return str(int(value)) if value == int(value) else f"{value:.2f}"


def _skip_without_shared() -> None:
    if not NCU_CSV.exists():
        pytest.fail(f"{NCU_CSV} is missing from sample_traces/")


def test_ncu_csv_has_every_kernel() -> None:
    _skip_without_shared()
    rows = _ncu_rows()
    assert len(rows) == NCU_ROWS
    assert {(r["CC"], r["launch__sm_count"]) for r in rows} == {("9.0", "132")}


@pytest.mark.parametrize("row", _params())
def test_matches_nsight_compute(row: dict[str, str] | None) -> None:
    _skip_without_shared()
    assert row is not None
    threads = int(_num(row["launch__block_size"]))
    occ = launch_occupancy(
        threads, int(_num(row["launch__registers_per_thread"])), H200,
        static_smem=_bytes(row["launch__shared_mem_per_block_static"]),
        dynamic_smem=_bytes(row["launch__shared_mem_per_block_dynamic"]),
        carveout=_bytes(row["launch__shared_mem_config_size"]),
        barriers=int(_num(row["launch__barrier_count"])))
    expected = {name: _num(row[f"launch__occupancy_limit_{name}"])
                for name in ("blocks", "registers", "shared_mem", "warps", "barriers")}
    got = {name: getattr(occ, f"limit_{name}") for name in expected}
    assert got == expected
    assert f"{occ.theoretical_occupancy * 100:.6f}" == row["sm__maximum_warps_per_active_cycle_pct"]
    grid = int(_num(row["launch__grid_size"]))
    assert _ncu_waves(waves(grid, occ.active_blocks_per_sm, 132)) == \
        row["launch__waves_per_multiprocessor"]
    assert occ.allocated_smem_per_block == _bytes(row["launch__shared_mem_per_block_allocated"])
    assert f"{occ.allocated_registers_per_block / threads:.6f}" == \
        row["launch__registers_per_thread_allocated"]


# --- Worked examples (notes/trace-formats.md §5.4, method README §4) ------------------------

def test_h200_nvjet_opt_in_gemm() -> None:
    occ = launch_occupancy(384, 168, H200, dynamic_smem=213204, carveout=233472)
    assert (occ.active_blocks_per_sm, occ.limiting) == (1, ("registers", "shared_mem"))
    assert occ.theoretical_occupancy == 0.1875
    assert (occ.limit_warps, occ.limit_blocks, occ.limit_barriers) == (5, 32, 32)
    assert occ.allocated_smem_per_block == 214272  # 213204 + 1024 reserved, to 128 B
    assert waves(132, 1, 132) == 1.0 and resource_utilization(132, 1, 132) == 1.0
    # Kineto never opts in, so the same kernel reads as 0 blocks / 0 % there.
    assert kineto_occupancy(384, 168, H200, grid_blocks=132, sms=132, dynamic_smem=213204) == 0.0
    assert launch_occupancy(384, 168, H200, dynamic_smem=213204, opt_in=False).limiting == (
        "shared_mem",)


def test_h200_nvfuser_pointwise() -> None:
    occ = launch_occupancy(128, 18, H200, static_smem=4, carveout=32768)
    assert (occ.active_blocks_per_sm, occ.limiting) == (16, ("warps",))
    assert (occ.limit_registers, occ.limit_shared_mem) == (21, 28)
    assert occ.theoretical_occupancy == 1.0
    assert round(waves(256512, 16, 132), 2) == 121.45
    assert resource_utilization(256512, 16, 132) == 256512 / (122 * 16 * 132)


def test_rtx3090_cudnn_conv() -> None:
    occ = launch_occupancy(128, 186, limits_for_cc(8, 6), static_smem=61440, carveout=102400)
    assert (occ.active_blocks_per_sm, occ.limiting) == (1, ("shared_mem",))
    assert (occ.limit_registers, occ.limit_warps, occ.limit_blocks) == (2, 12, 16)
    assert occ.theoretical_occupancy == 4 / 48
    assert round(waves(1568, 1, 82), 2) == 19.12


def test_a100_reduction() -> None:
    occ = launch_occupancy(256, 56, limits_for_cc(8, 0), static_smem=10240, carveout=102400)
    assert (occ.active_blocks_per_sm, occ.limiting) == (4, ("registers",))
    assert (occ.limit_shared_mem, occ.theoretical_occupancy) == (9, 0.5)
    assert round(waves(256, 4, 108), 2) == 0.59
    assert resource_utilization(256, 4, 108) == 256 / 432


def test_paper_gtx1080_ru() -> None:
    """AlexNet on a GTX 1080 (CC 6.1, 20 SMs), method README §4 table 4."""
    gtx1080 = limits_for_cc(6, 1)
    assert paper_max_blocks(20, 256, 116, gtx1080.regs_per_sm) == 40  # fc6
    assert resource_utilization(64, 40 // 20, 20) == 0.8
    # conv1 (cuDNN): eq. 10 allows 6 blocks/SM; register granularity allows only 5.
    assert paper_max_blocks(20, 128, 81, gtx1080.regs_per_sm) == 120
    assert launch_occupancy(128, 81, gtx1080).active_blocks_per_sm == 5
    assert resource_utilization(18150, 6, 20) == 18150 / (152 * 120)
    assert resource_utilization(18150, 5, 20) == 18150 / (182 * 100)


def test_kineto_estimate_at_the_48_kb_edge() -> None:
    a100 = limits_for_cc(8, 0)
    at_edge = kineto_occupancy(128, 32, a100, grid_blocks=64, sms=108, static_smem=49152)
    assert at_edge == pytest.approx(64 / 108 * 128 / 2048)  # grid-bound, "4 %"
    assert kineto_occupancy(128, 32, a100, grid_blocks=64, sms=108, static_smem=49153) == 0.0


def test_limits_at_the_edges() -> None:
    assert launch_occupancy(384, 168, H200, dynamic_smem=100_000, barriers=16).limit_barriers == 4
    tiny = launch_occupancy(32, 8, H200, barriers=1)
    assert tiny.limit_barriers == 32 and "barriers" not in tiny.limiting
    assert launch_occupancy(1024, 0, H200).limit_registers == UNLIMITED
    assert launch_occupancy(256, 32, limits_for_cc(7, 0)).limit_shared_mem == UNLIMITED
    assert launch_occupancy(1025, 32, H200).active_blocks_per_sm == 0
    assert launch_occupancy(1024, 65, H200).limit_registers == 0  # over 64K regs per block
    # Tegra X1 (32K regs/block): 21 warps x 1536 regs fit, but the hardware check rounds the
    # warps up to 24 (4 sub-partitions) and refuses the launch.
    assert launch_occupancy(672, 48, limits_for_cc(5, 3)).limit_registers == 0
    assert launch_occupancy(640, 48, limits_for_cc(5, 3)).limit_registers == 2
    # GP100 (2 sub-partitions) could hold this block, but the header refuses what GP10x can't.
    assert launch_occupancy(288, 192, limits_for_cc(6, 0)).limit_registers == 0
    assert launch_occupancy(256, 192, limits_for_cc(6, 0)).limit_registers == 1


def test_occupancy_dict_keys() -> None:
    out = occupancy_dict(128, 18, H200, static_smem=4, carveout=32768, grid_blocks=256512, sms=132)
    assert list(out) == ["blocks_per_sm", "limit_warps", "limit_registers",
                         "limit_shared_mem", "limit_blocks", "limit_barriers", "limiter",
                         "occupancy", "waves", "ru"]
    assert out["limiter"] == "warps" and out["blocks_per_sm"] == 16
    assert "waves" not in occupancy_dict(128, 18, H200)
    assert occupancy_dict(2048, 18, H200, grid_blocks=1, sms=1)["ru"] is None


def test_gpu_table() -> None:
    with pytest.raises(TraceqError, match="4.0"):
        limits_for_cc(4, 0)
    with pytest.raises(TraceqError, match="bogus"):
        limits_for_cc(9, 0, bogus=1)
    assert limits_for_cc(9, 0, smem_per_sm=102400).smem_per_sm == 102400
    assert (H200.max_warps_per_sm, H200.smem_per_block_optin, H200.carveouts[-1]) == (
        64, 232448, 233472)
    assert limits_for_cc(6, 1).fp32_lanes_per_sm * 20 == 2560  # GTX 1080's CUDA cores


# --- Properties -------------------------------------------------------------------------------

GPUS = st.sampled_from([limits_for_cc(*map(int, cc.split("."))) for cc in known_ccs()])


@st.composite
def launches(draw: st.DrawFn) -> tuple[GpuLimits, int, int, int, int | None]:
    """A launch every GPU in the table can run: (gpu, threads, regs, smem bytes, carveout)."""
    gpu = draw(GPUS)
    threads = draw(st.integers(1, gpu.max_threads_per_block))
    warps = -(-threads // 32)
    # Registers per warp round up to 256, and the hardware check assumes 4 sub-partitions.
    max_regs = min(255, (gpu.regs_per_block // (-(-warps // 4) * 4) - 224) // 32)
    regs = draw(st.integers(0, max_regs))
    smem = draw(st.integers(0, gpu.smem_per_block_optin))
    carveout = draw(st.sampled_from((None, *gpu.carveouts)))
    return gpu, threads, regs, smem, carveout


@given(launches(), st.integers(1, 64), st.integers(1, 64 * 1024))
def test_more_resources_never_raise_occupancy(launch: tuple, more_regs: int,
                                              more_smem: int) -> None:
    gpu, threads, regs, smem, carveout = launch
    base = launch_occupancy(threads, regs, gpu, dynamic_smem=smem, carveout=carveout)
    more_r = launch_occupancy(threads, regs + more_regs, gpu, dynamic_smem=smem, carveout=carveout)
    more_s = launch_occupancy(threads, regs, gpu, dynamic_smem=smem + more_smem, carveout=carveout)
    assert more_r.theoretical_occupancy <= base.theoretical_occupancy
    assert more_s.theoretical_occupancy <= base.theoretical_occupancy


@given(launches())
def test_valid_launches_have_occupancy_in_range(launch: tuple) -> None:
    gpu, threads, regs, smem, carveout = launch
    occ = launch_occupancy(threads, regs, gpu, dynamic_smem=smem, carveout=carveout)
    assert 0 < occ.theoretical_occupancy <= 1
    assert occ.active_blocks_per_sm * occ.warps_per_block <= gpu.max_warps_per_sm
    assert occ.limiting and all(getattr(occ, f"limit_{name}") == occ.active_blocks_per_sm
                                for name in occ.limiting)


@given(st.integers(1, 10**8), st.integers(1, 64), st.integers(1, 200))
def test_ru_in_unit_interval(grid: int, active: int, sms: int) -> None:
    ru = resource_utilization(grid, active, sms)
    assert 0 < ru <= 1
    w = waves(grid, active, sms)
    assert ru == pytest.approx(w / math.ceil(w))
