"""Theoretical occupancy, waves and resource utilization (RU) of one kernel launch.

`launch_occupancy` follows `cudaOccMaxActiveBlocksPerMultiprocessor` in CUDA 13.0's
`cuda_occupancy.h` (notes/trace-formats.md §5.1) and reproduces Nsight Compute's
`launch__occupancy_limit_*` values. Left out, as traces never record them: partitioned global
caching (off by default in the header) and Blackwell's virtual-resource limit (0 used by default).

Units: sizes in bytes, registers per thread, limits in blocks per SM, occupancy as a fraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from traceq.analysis.efficiency.gpu_specs import GpuLimits
from traceq.errors import TraceqError

UNLIMITED = 2**31 - 1  # cuda_occupancy.h's INT_MAX: this resource puts no bound on residency
LIMITERS = ("warps", "registers", "shared_mem", "blocks", "barriers")


@dataclass(frozen=True)
class Occupancy:
    """Blocks per SM and what bounds them, for one launch configuration.

    limit_* are blocks per SM allowed by each resource alone, unclamped (a 1-thread block may
    show limit_registers 128), UNLIMITED where a resource is unused (0 registers; no shared
    memory before CC 8.0). limit_barriers is clamped to limit_blocks, as Nsight Compute prints
    it (32 on a CC 9.0 GPU whenever barriers do not bind). `limiting` names the limits equal to
    active_blocks_per_sm, in LIMITERS order (the header's bit field can also keep a flag set
    after barriers lower the minimum; this does not). theoretical_occupancy = active warps /
    max warps per SM.
    """

    active_blocks_per_sm: int
    limit_warps: int
    limit_registers: int
    limit_shared_mem: int
    limit_blocks: int
    limit_barriers: int
    limiting: tuple[str, ...]
    theoretical_occupancy: float
    warps_per_block: int
    allocated_registers_per_block: int
    allocated_smem_per_block: int  # bytes, with the driver's reserved share and granularity
    smem_per_sm: int  # bytes: the shared-memory carveout the shared_mem limit was computed on


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _register_limit(threads: int, regs: int, gpu: GpuLimits, sub_partitions: int) -> int:
    warps = -(-threads // gpu.warp_size)
    per_warp = _round_up(regs * gpu.warp_size, gpu.reg_alloc_unit)
    # The hardware check assumes a CTA's warps span all sub-partitions, hence the rounding.
    if (gpu.regs_per_block < per_warp * _round_up(warps, sub_partitions)
            or gpu.regs_per_block < per_warp * warps or regs > gpu.max_regs_per_thread):
        return 0
    if per_warp == 0:
        return UNLIMITED
    warps_per_sub_partition = gpu.regs_per_sm // sub_partitions // per_warp
    return warps_per_sub_partition * sub_partitions // warps


def _align_carveout(size: int, gpu: GpuLimits) -> int:
    """The smallest configurable carveout of at least `size` bytes (Volta and later)."""
    if not gpu.carveouts:
        return size
    for carveout in gpu.carveouts:
        if carveout >= size:
            return carveout
    raise TraceqError(
        f"{size} bytes of shared memory per SM is more than CC {gpu.cc_major}.{gpu.cc_minor} "
        f"can configure (at most {gpu.carveouts[-1]}); check the carveout or the GPU.")


def _smem_limit(smem_alloc: int, carveout: int | None, opt_in: bool,
                gpu: GpuLimits) -> tuple[int, int]:
    """(blocks per SM allowed by shared memory, per-SM carveout used) for one CTA's bytes."""
    per_block_cap = gpu.smem_per_block_optin if opt_in and gpu.cc_major >= 7 else gpu.smem_per_block
    if gpu.cc_major >= 8:
        per_block_cap += gpu.reserved_smem_per_block
    preference = gpu.smem_per_sm if carveout is None else carveout
    if gpu.cc_major >= 7:
        preference = _align_carveout(preference, gpu)
    if smem_alloc > per_block_cap:
        return 0, preference
    if preference >= smem_alloc:
        per_sm = preference
    else:  # the preference cannot hold one CTA: Volta+ takes the next carveout that can
        per_sm = _align_carveout(smem_alloc, gpu) if gpu.cc_major >= 7 else gpu.smem_per_sm
    return (per_sm // smem_alloc if smem_alloc > 0 else UNLIMITED), per_sm


def _barrier_limit(barriers: int, limit_blocks: int, gpu: GpuLimits) -> int:
    """Hopper+ limit from named barriers per CTA; UNLIMITED before CC 9.0 or with none."""
    if gpu.cc_major < 9 or barriers <= 0:
        return UNLIMITED
    one_per_block = (gpu.cc_major == 12 or (gpu.cc_major, gpu.cc_minor) in {(10, 1), (11, 0)})
    return limit_blocks * (1 if one_per_block else 2) // barriers


def launch_occupancy(threads_per_block: int, registers_per_thread: int, gpu: GpuLimits, *,
                     static_smem: int = 0, dynamic_smem: int = 0, carveout: int | None = None,
                     opt_in: bool = True, barriers: int = 1) -> Occupancy:
    """Theoretical occupancy of a launch, as cuda_occupancy.h and Nsight Compute compute it.

    static_smem / dynamic_smem: shared memory per block in bytes (the driver's reserved 1 KB
    is added here). carveout: the per-SM shared memory in bytes the driver ran the kernel with
    (nsys `sharedMemoryExecuted`, ncu `launch__shared_mem_config_size`); None means the
    header's default, the largest size (which overstates the limit for kernels the driver gave
    less); before Volta a given value is used as is (Kepler's L1/shared split). opt_in: the function may exceed the 48 KB per-block default up to the opt-in limit
    (true of every launch that ran with more; Kineto assumes False). barriers: named barriers
    per block (ncu `launch__barrier_count`); 1, the header's default, never binds.
    Raises TraceqError for an impossible input (no threads, negative sizes).
    """
    if threads_per_block <= 0 or registers_per_thread < 0 or min(static_smem, dynamic_smem) < 0:
        raise TraceqError(
            f"invalid launch: {threads_per_block} threads/block, {registers_per_thread} "
            f"registers/thread, {static_smem}+{dynamic_smem} B shared memory; threads must be "
            "positive and the rest non-negative.")
    warps = -(-threads_per_block // gpu.warp_size)
    too_big = threads_per_block > gpu.max_threads_per_block
    limit_warps = 0 if too_big else gpu.max_warps_per_sm // warps
    limit_regs = _register_limit(threads_per_block, registers_per_thread, gpu, gpu.sub_partitions)
    if (gpu.cc_major, gpu.cc_minor) == (6, 0) and limit_regs:
        # The header refuses on GP100 what cannot run on GP10x (4 sub-partitions).
        limit_regs = limit_regs if _register_limit(threads_per_block, registers_per_thread,
                                                   gpu, 4) else 0
    smem_alloc = _round_up(static_smem + gpu.reserved_smem_per_block + dynamic_smem,
                           gpu.smem_alloc_granularity)
    limit_smem, smem_per_sm = _smem_limit(smem_alloc, carveout, opt_in, gpu)
    limit_blocks = gpu.max_blocks_per_sm
    limit_bars = _barrier_limit(barriers, limit_blocks, gpu)
    limits = (limit_warps, limit_regs, limit_smem, limit_blocks, limit_bars)
    active = min(limits)
    return Occupancy(
        active_blocks_per_sm=active,
        limit_warps=limit_warps, limit_registers=limit_regs, limit_shared_mem=limit_smem,
        limit_blocks=limit_blocks, limit_barriers=min(limit_bars, limit_blocks),
        limiting=tuple(name for name, limit in zip(LIMITERS, limits) if limit == active),
        theoretical_occupancy=active * warps / gpu.max_warps_per_sm,
        warps_per_block=warps,
        allocated_registers_per_block=(
            _round_up(registers_per_thread * gpu.warp_size, gpu.reg_alloc_unit) * warps),
        allocated_smem_per_block=smem_alloc,
        smem_per_sm=smem_per_sm,
    )


def _check_grid(grid_blocks: int, active_blocks_per_sm: int, sms: int) -> int:
    if grid_blocks <= 0 or sms <= 0:
        raise TraceqError(f"grid of {grid_blocks} blocks on {sms} SMs: both must be positive.")
    if active_blocks_per_sm <= 0:
        raise TraceqError("no block of this launch fits on an SM (0 active blocks per SM), "
                          "so waves and RU are undefined; check the GPU and the launch.")
    return sms * active_blocks_per_sm


def waves(grid_blocks: int, active_blocks_per_sm: int, sms: int) -> float:
    """Waves per SM: grid blocks / (SMs x active blocks per SM), as ncu's
    launch__waves_per_multiprocessor. Raises TraceqError when no block fits."""
    return grid_blocks / _check_grid(grid_blocks, active_blocks_per_sm, sms)


def resource_utilization(grid_blocks: int, active_blocks_per_sm: int, sms: int) -> float:
    """RU (method README §4, eq. 11): Gridsize / (ceil(Gridsize / maxBlocks) x maxBlocks).

    maxBlocks = SMs x active blocks per SM; the result is the fraction of block slots used
    over the waves the launch needs, in (0, 1]. Raises TraceqError when no block fits.
    """
    max_blocks = _check_grid(grid_blocks, active_blocks_per_sm, sms)
    return grid_blocks / (math.ceil(grid_blocks / max_blocks) * max_blocks)


def paper_max_blocks(sms: int, threads_per_block: int, registers_per_thread: int,
                     regs_per_sm: int) -> int:
    """The paper's register-only maxBlocks (eq. 10): SMs x floor(R_sm / (blocksize x r)).

    Ignores allocation granularity, warps, shared memory and the block cap; pass
    maxBlocks / SMs to resource_utilization for the paper's RU.
    """
    if threads_per_block <= 0 or registers_per_thread <= 0:
        raise TraceqError("the paper's maxBlocks needs positive threads and registers per thread.")
    return sms * (regs_per_sm // (threads_per_block * registers_per_thread))


def kineto_occupancy(threads_per_block: int, registers_per_thread: int, gpu: GpuLimits, *,
                     grid_blocks: int, sms: int, static_smem: int = 0,
                     dynamic_smem: int = 0) -> float:
    """Kineto's "est. achieved occupancy" as a fraction (notes/trace-formats.md §5.3).

    min(active blocks, grid / SMs) x threads / max threads per SM, with Kineto's inputs: no
    opt-in (a kernel needing more than 48 KB + 1 KB of shared memory gets 0), the default
    carveout and no barrier limit. For comparison with Kineto traces, not a better estimate.
    """
    if grid_blocks <= 0 or sms <= 0:
        raise TraceqError(f"grid of {grid_blocks} blocks on {sms} SMs: both must be positive.")
    occ = launch_occupancy(threads_per_block, registers_per_thread, gpu, static_smem=static_smem,
                           dynamic_smem=dynamic_smem, opt_in=False, barriers=0)
    blocks_per_sm = min(float(occ.active_blocks_per_sm), grid_blocks / sms)
    return blocks_per_sm * threads_per_block / gpu.max_threads_per_sm


def occupancy_dict(threads_per_block: int, registers_per_thread: int, gpu: GpuLimits, *,
                   static_smem: int = 0, dynamic_smem: int = 0, carveout: int | None = None,
                   opt_in: bool = True, barriers: int = 1, grid_blocks: int | None = None,
                   sms: int | None = None) -> dict[str, object]:
    """JSON-ready occupancy of one launch (arguments as for launch_occupancy).

    Keys, named as `traceq ru`'s columns: blocks_per_sm (active blocks per SM), limit_warps,
    limit_registers, limit_shared_mem, limit_blocks, limit_barriers (the blocks per SM each limit
    allows), limiter (the binding limits joined with '+'), occupancy (theoretical, fraction);
    with grid_blocks, also waves and ru (fraction; None when no block fits). sms is required
    with grid_blocks.
    """
    occ = launch_occupancy(threads_per_block, registers_per_thread, gpu,
                           static_smem=static_smem, dynamic_smem=dynamic_smem,
                           carveout=carveout, opt_in=opt_in, barriers=barriers)
    out: dict[str, object] = {
        "blocks_per_sm": occ.active_blocks_per_sm,
        "limit_warps": occ.limit_warps,
        "limit_registers": occ.limit_registers,
        "limit_shared_mem": occ.limit_shared_mem,
        "limit_blocks": occ.limit_blocks,
        "limit_barriers": occ.limit_barriers,
        "limiter": "+".join(occ.limiting),
        "occupancy": occ.theoretical_occupancy,
    }
    if grid_blocks is not None:
        if sms is None:
            raise TraceqError("waves and RU need the GPU's SM count as well as the grid size.")
        fits = occ.active_blocks_per_sm > 0
        out["waves"] = waves(grid_blocks, occ.active_blocks_per_sm, sms) if fits else None
        out["ru"] = (resource_utilization(grid_blocks, occ.active_blocks_per_sm, sms)
                     if fits else None)
    return out
