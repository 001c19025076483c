"""Per-SM resource limits by compute capability: the fallback when a trace lacks them.

`limits_for_cc(major, minor)` returns a `GpuLimits`; pass the trace's own device-record values
as keyword overrides (nsys `TARGET_INFO_GPU`, nvprof `CUPTI_ACTIVITY_KIND_DEVICE`, Kineto
`deviceProperties`), since a real device record beats this table.

Sources, marked on each row:
  H  CUDA 13.0 `include/cuda_occupancy.h` (`__CUDA_OCC_MAJOR__ 12`): blocks/SM, carveouts,
     register/shared-memory granularity, sub-partitions, max registers/thread.
  G  CUDA C++ Programming Guide, "Technical Specifications per Compute Capability" and the
     arithmetic-throughput table (FP32 lanes); not checked against a real device here.
  V  verified against a real device record (notes/trace-formats.md §5.2, and the H200 in
     reference/alexnet_ncu_raw.csv: 233472 B/SM, opt-in 232448, 1024 reserved, 64 warps, 32 blocks).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from traceq.errors import TraceqError

KB = 1024


@dataclass(frozen=True)
class GpuLimits:
    """Per-SM limits of one compute capability. Memory sizes are bytes; registers are 32-bit.

    `carveouts` lists the per-SM shared-memory sizes the driver can configure (Volta+), in
    ascending order; an empty tuple means a fixed split (`smem_per_sm`).
    """

    cc_major: int
    cc_minor: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    regs_per_block: int
    max_regs_per_thread: int
    smem_per_sm: int
    smem_per_block: int            # the default per-block cap (48 KB)
    smem_per_block_optin: int      # the cap for functions that opted in (cudaFuncSetAttribute)
    reserved_smem_per_block: int   # the driver's own per-block allocation (1 KB from CC 8.0)
    carveouts: tuple[int, ...]
    smem_alloc_granularity: int
    sub_partitions: int            # warp schedulers; registers are split between them
    fp32_lanes_per_sm: int         # FP32 FMA results per clock per SM ("CUDA cores")
    reg_alloc_unit: int = 256      # registers per warp are rounded up to this
    warp_size: int = 32
    max_threads_per_block: int = 1024

    @property
    def max_warps_per_sm(self) -> int:
        """Resident warps per SM (threads per SM / warp size, as cuda_occupancy.h derives it)."""
        return self.max_threads_per_sm // self.warp_size


def _kb(*sizes: int) -> tuple[int, ...]:
    return tuple(size * KB for size in sizes)


_VOLTA = _kb(0, 8, 16, 32, 64, 96)
_TURING = _kb(32, 64)
_GA100 = _kb(0, 8, 16, 32, 64, 100, 132, 164)          # CC 8.0 and 8.7
_GA10X = _kb(0, 8, 16, 32, 64, 100)                    # other 8.x, and 12.0/12.1
_HOPPER = _kb(0, 8, 16, 32, 64, 100, 132, 164, 196, 228)  # 9.x, 10.0/10.1/10.3, 11.0


def _row(cc: tuple[int, int], threads: int, blocks: int, regs_sm: int, regs_block: int,
         smem_sm_kb: int, smem_block_kb: int, optin_kb: int, carveouts: tuple[int, ...],
         fp32: int) -> GpuLimits:
    """One table row; the rest follows from the CC as cuda_occupancy.h decides it."""
    major, minor = cc
    return GpuLimits(
        cc_major=major, cc_minor=minor, max_threads_per_sm=threads, max_blocks_per_sm=blocks,
        regs_per_sm=regs_sm, regs_per_block=regs_block,
        max_regs_per_thread=255 if major <= 6 else 256,  # H (the ISA limit is 255 on all)
        smem_per_sm=smem_sm_kb * KB, smem_per_block=smem_block_kb * KB,
        smem_per_block_optin=optin_kb * KB,
        reserved_smem_per_block=KB if major >= 8 else 0,  # V: sm - optin = 1024 on CC >= 8
        carveouts=carveouts,
        smem_alloc_granularity=256 if major <= 7 else 128,  # H
        sub_partitions=2 if cc == (6, 0) else 4,  # H
        fp32_lanes_per_sm=fp32,
    )


_K64 = 65536
# Columns: cc, threads/SM, blocks/SM, regs/SM, regs/block, smem KB per SM / per block default /
# per block opt-in, carveouts, FP32 lanes/SM.
_ROWS = (
    _row((3, 0), 2048, 16, _K64, _K64, 48, 48, 48, (), 192),         # G, H (GK104)
    _row((3, 2), 2048, 16, _K64, 32768, 48, 48, 48, (), 192),        # G, H (Tegra K1)
    _row((3, 5), 2048, 16, _K64, _K64, 48, 48, 48, (), 192),         # G, H (GK110)
    _row((3, 7), 2048, 16, 131072, _K64, 112, 48, 48, (), 192),      # G, H (GK210, K80)
    _row((5, 0), 2048, 32, _K64, _K64, 64, 48, 48, (), 128),         # G, H (GM107)
    _row((5, 2), 2048, 32, _K64, _K64, 96, 48, 48, (), 128),         # G, H (GM20x)
    _row((5, 3), 2048, 32, _K64, 32768, 64, 48, 48, (), 128),        # G, H (Tegra X1)
    _row((6, 0), 2048, 32, _K64, _K64, 64, 48, 48, (), 64),          # V (Kineto GP100), H
    _row((6, 1), 2048, 32, _K64, _K64, 96, 48, 48, (), 128),         # V (nvprof GP10x), H
    _row((6, 2), 2048, 32, _K64, 32768, 64, 48, 48, (), 128),        # G, H (Tegra X2)
    _row((7, 0), 2048, 32, _K64, _K64, 96, 48, 96, _VOLTA, 64),      # V (nvprof, Kineto V100), H
    _row((7, 2), 2048, 32, _K64, _K64, 96, 48, 96, _VOLTA, 64),      # G, H (Xavier)
    _row((7, 5), 1024, 16, _K64, _K64, 64, 48, 64, _TURING, 64),     # G, H (T4, RTX 20xx)
    _row((8, 0), 2048, 32, _K64, _K64, 164, 48, 163, _GA100, 64),    # V (nsys, Kineto A100), H
    _row((8, 6), 1536, 16, _K64, _K64, 100, 48, 99, _GA10X, 128),    # V (nsys RTX 3090), H
    _row((8, 7), 1536, 16, _K64, _K64, 164, 48, 163, _GA100, 128),   # G, H (Orin)
    _row((8, 9), 1536, 24, _K64, _K64, 100, 48, 99, _GA10X, 128),    # G, H (L4, L40, RTX 40xx)
    _row((9, 0), 2048, 32, _K64, _K64, 228, 48, 227, _HOPPER, 128),  # V (nsys, ncu H200), H
    _row((10, 0), 2048, 32, _K64, _K64, 228, 48, 227, _HOPPER, 128),  # V (Kineto B200), H
    _row((10, 1), 1536, 24, _K64, _K64, 228, 48, 227, _HOPPER, 128),  # G, H (Thor, CUDA 12)
    _row((10, 3), 2048, 32, _K64, _K64, 228, 48, 227, _HOPPER, 128),  # G, H (B300)
    _row((11, 0), 1536, 24, _K64, _K64, 228, 48, 227, _HOPPER, 128),  # G, H (Thor, CUDA 13)
    _row((12, 0), 1536, 24, _K64, _K64, 100, 48, 99, _GA10X, 128),   # G, H (RTX 50xx)
    _row((12, 1), 1536, 24, _K64, _K64, 100, 48, 99, _GA10X, 128),   # G, H (GB10)
)
_TABLE: dict[tuple[int, int], GpuLimits] = {(r.cc_major, r.cc_minor): r for r in _ROWS}


def known_ccs() -> list[str]:
    """The compute capabilities in the table, as "major.minor" strings in ascending order."""
    return [f"{major}.{minor}" for major, minor in sorted(_TABLE)]


def limits_for_cc(major: int, minor: int, **overrides: Any) -> GpuLimits:
    """Per-SM limits for compute capability `major.minor`.

    Keyword overrides replace table fields with a trace's own device-record values, e.g.
    `limits_for_cc(9, 0, smem_per_sm=233472, max_threads_per_sm=2048)`.
    Raises TraceqError for a CC not in the table or an unknown field name.
    """
    limits = _TABLE.get((major, minor))
    if limits is None:
        raise TraceqError(
            f"compute capability {major}.{minor} is not in traceq's GPU table "
            f"(known: {', '.join(known_ccs())})")
    fields = {f.name for f in dataclasses.fields(GpuLimits)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TraceqError(f"unknown GpuLimits field(s): {', '.join(unknown)}; "
                          f"expected some of: {', '.join(sorted(fields))}.")
    return dataclasses.replace(limits, **overrides) if overrides else limits
