"""The memory-traffic and time model of one GEMM or implicit-GEMM launch, after DeLTA (Lym, Lee,
O'Connor, Chatterjee, Erez, "DeLTA: GPU Performance Model for Deep Learning Applications with
In-depth Memory System Traffic Analysis", ISPASS 2019): the bytes each level of the memory
hierarchy moves for a convolution lowered to a GEMM and computed tile by tile, and the time the
busiest resource needs. Pure arithmetic, no store; `traffic` maps it over a trace's launches.

The equations carry labels D1 to D9, used in the docstrings below and in docs/traffic.md,
which gives their derivation, where they follow the paper and where they depart from it:

  D1  implicit GEMM dimensions of a convolution (forward, data gradient, weight gradient)
  D2  CTA tiles, splits and waves
  D3  operand footprints: the bytes each tensor occupies (what DRAM must deliver at least once)
  D4  L1 requests: every CTA loads its A row panel and B column panel once per K pass, in
      32-byte sectors (the paper's memory-load-instruction analysis: a gathered convolution
      operand with a short contiguous run wastes part of each sector)
  D5  L2 requests: L1 misses; an L1 that caches gathered loads serves the overlap of a CTA's
      filter taps (the paper's intra-CTA reuse), loads that bypass L1 reach L2 in full
  D6  DRAM traffic: L2 misses; operands re-read when the CTAs' raster order brings a panel
      back after the L2 has lost it (the paper's inter-CTA reuse under a finite L2)
  D7  shared-memory traffic: tile stores plus the warps' fragment reads (an addition of ours:
      Nsight Compute counts shared wavefronts)
  D8  compute time with tile and wave quantization
  D9  predicted time = the slowest resource at its achievable rate, plus a launch overhead; the
      bound is the resource that sets it ('latency' where the overhead outweighs every resource)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from traceq.analysis.efficiency.gpu_products import GpuProduct
from traceq.analysis.efficiency.tiles import KernelTile
from traceq.errors import TraceqError

SECTOR = 32
"""Bytes per L1/L2 sector: the granularity at which both caches move data."""

LEVELS = ("compute", "L1", "shared", "L2", "DRAM")
"""The resources D9 compares, in the order a tie is resolved."""

ACHIEVABLE = {"tensor": 0.8, "ffma": 0.7, "L1": 0.6, "shared": 0.6, "L2": 0.8, "DRAM": 0.9}
"""The share of each peak a GEMM main loop sustains (D9): tensor-core and FP32 FMA math, L1 and
shared-memory, L2 and DRAM bandwidth. Not in DeLTA, which divides by the peaks: fitted on the
H200 recordings of AlexNet and VGG-16 (FP32 and AMP) and checked on ResNet-50, which the fit
did not see (docs/traffic.md, 'Accuracy')."""

LAUNCH_OVERHEAD_S = 6e-6
"""Seconds a launch costs beyond its busiest resource (launch, pipeline fill and drain, the
epilogue's last writes): fitted with ACHIEVABLE. A launch whose busiest resource needs less
is called latency-bound."""


@dataclass(frozen=True)
class Conv:
    """A 2-D convolution: input N x C x H x W, filter K x (C / groups) x R x S, output N x K x P x Q."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    p: int
    q: int
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1

    @property
    def flops(self) -> int:
        """2 N K P Q (C / groups) R S: the count every direction shares (flops.py's formula)."""
        return 2 * self.n * self.k * self.p * self.q * (self.c // self.groups) * self.r * self.s


@dataclass(frozen=True)
class Problem:
    """One launch's GEMM: C[M x N] = A[M x K] B[K x N], `batch` times; `conv` when it is an
    implicit GEMM ('fprop', 'dgrad', 'wgrad'), None for a plain 'gemm'."""

    op: str
    m: int
    n: int
    k: int
    batch: int = 1
    conv: Conv | None = None
    shared: str | None = None  # 'A' or 'B': the operand every batch entry reads (a batched GEMM)
    useful_flops: int | None = None  # the layer's FLOPs where the GEMM pads it (channels to a vector)

    @property
    def flops(self) -> int:
        """Useful FLOPs: the layer's count (flops.py's formula), not the padded GEMM's."""
        if self.useful_flops is not None:
            return self.useful_flops
        return self.conv.flops if self.conv is not None else 2 * self.m * self.n * self.k * self.batch

    def transposed(self) -> "Problem":
        """The same product with M and N (and A and B) exchanged: C^T = B^T A^T."""
        swap = {"A": "B", "B": "A"}.get(self.shared or "")
        return dataclasses.replace(self, m=self.n, n=self.m, shared=swap)

    @property
    def label(self) -> str:
        return f"{self.m}x{self.n}x{self.k}" + (f" x{self.batch}" if self.batch > 1 else "")


def padded_channels(problem: Problem, multiple: int) -> Problem | None:
    """The implicit GEMM with the input channels padded to a multiple of `multiple`, as NHWC
    tensor-core kernels need for vector loads (cuDNN pads a 3-channel image to 4 in FP32, 8 in
    FP16); None where they already are a multiple. Useful FLOPs stay the layer's."""
    conv = problem.conv
    if conv is None or conv.groups != 1 or conv.c % multiple == 0:
        return None
    padded = dataclasses.replace(conv, c=-(-conv.c // multiple) * multiple)
    return dataclasses.replace(conv_problem(padded, problem.op), useful_flops=conv.flops)


def conv_problem(conv: Conv, op: str) -> Problem:
    """D1: the implicit GEMM of a convolution pass, as CUTLASS and cuDNN lower it (per group):
    fprop M = N P Q, N = K, K = C R S; dgrad M = N H W, N = C, K = K R S; wgrad M = K,
    N = C R S, K = N P Q."""
    c, k = conv.c // conv.groups, conv.k // conv.groups
    dims = {"fprop": (conv.n * conv.p * conv.q, k, c * conv.r * conv.s),
            "dgrad": (conv.n * conv.h * conv.w, c, k * conv.r * conv.s),
            "wgrad": (k, c * conv.r * conv.s, conv.n * conv.p * conv.q)}
    if op not in dims:
        raise ValueError(f"unknown convolution pass {op!r}")
    m, n, kk = dims[op]
    return Problem(op, m, n, kk, conv.groups, conv)


@dataclass(frozen=True)
class Prediction:
    """The model's numbers for one launch. Bytes and FLOPs are totals for the launch; times in s."""

    tiles: int            # CTA tiles of the output (D2)
    splits: int           # K slices per tile (split-K), 1 otherwise
    ctas: int             # CTAs launched (tiles x splits, or the persistent grid)
    waves: float          # tile rounds on the GPU (D2)
    flops: float          # useful FLOPs (flops.py's count)
    executed_flops: float  # what the tiles compute, padding included (D8)
    l1_bytes: float       # D4 (0 where operands bypass L1 by TMA)
    shared_bytes: float   # D7
    l2_bytes: float       # D5
    dram_read_bytes: float  # D6
    dram_write_bytes: float
    times: dict[str, float]       # seconds per resource at its achievable rate (D9), keys LEVELS
    peak_times: dict[str, float]  # the same at the theoretical peaks: DeLTA as published
    flags: tuple[str, ...]

    @property
    def dram_bytes(self) -> float:
        return self.dram_read_bytes + self.dram_write_bytes

    @property
    def time_s(self) -> float:
        """D9: the launch overhead plus the slowest resource at its achievable rate."""
        return LAUNCH_OVERHEAD_S + max(self.times.values())

    @property
    def peak_time_s(self) -> float:
        """D9 as the paper states it: the slowest resource at its peak, no overhead."""
        return max(self.peak_times.values())

    @property
    def bound(self) -> str:
        """The resource that sets the time, or 'latency' where the launch overhead outweighs it."""
        level = max(LEVELS, key=lambda level: self.times[level])
        return level if self.times[level] >= LAUNCH_OVERHEAD_S else "latency"


def _valid_fraction(out: int, size: int, taps: int, stride: int, pad: int, dil: int, gather_output: bool) -> float:
    """Share of (position, tap) pairs that fall inside the tensor along one axis. Forward gathers
    input row o*stride - pad + t*dil for output row o; the data gradient gathers output row
    (i + pad - t*dil) / stride for input row i, valid only where that divides exactly."""
    valid = 0
    if not gather_output:
        for o in range(out):
            valid += sum(1 for t in range(taps) if 0 <= o * stride - pad + t * dil < size)
        return valid / (out * taps)
    for i in range(size):
        for t in range(taps):
            x = i + pad - t * dil
            valid += x % stride == 0 and 0 <= x // stride < out
    return valid / (size * taps)


def _run_bytes(run: float, spacing: float, element: int) -> float:
    """D4's sector rounding: bytes the caches move per contiguous run of `run` bytes when
    consecutive lanes' runs start `spacing` bytes apart. Aligned runs (spacing a multiple of
    the sector) take whole sectors; others straddle a boundary in proportion to their length;
    runs closer than a sector share sectors, so no run costs more than its spacing."""
    if spacing % SECTOR == 0 and run % SECTOR == 0:
        sectors = run / SECTOR
    elif spacing % SECTOR == 0:
        sectors = math.ceil(run / SECTOR)
    else:
        sectors = (run - element) / SECTOR + 1
    return min(spacing, SECTOR * sectors) if spacing >= run else run


def _gather(problem: Problem, tile: KernelTile, e: int) -> tuple[str | None, float, float]:
    """(which operand is gathered from a convolution tensor, the share of its lowered elements
    that are loaded, the bytes moved per element loaded) for D4."""
    conv = problem.conv
    if conv is None:
        return None, 1.0, 1.0
    sh, sw = conv.stride
    ph, pw = conv.pad
    dh, dw = conv.dilation
    if problem.op == "dgrad":
        valid = (_valid_fraction(conv.p, conv.h, conv.r, sh, ph, dh, True)
                 * _valid_fraction(conv.q, conv.w, conv.s, sw, pw, dw, True))
        channels, spacing_pixels = conv.k // conv.groups, 1
    else:
        valid = (_valid_fraction(conv.p, conv.h, conv.r, sh, ph, dh, False)
                 * _valid_fraction(conv.q, conv.w, conv.s, sw, pw, dw, False))
        channels, spacing_pixels = conv.c // conv.groups, sw
    operand = "B" if problem.op == "wgrad" else "A"
    if tile.layout == "nhwc":  # a lane loads channels of one pixel; neighbours are a pixel apart
        run = min(channels, max(tile.k, 1)) * e
        per_run = _run_bytes(run, spacing_pixels * channels * e, e)
        return operand, valid, per_run / run
    # NCHW: lanes take consecutive output positions, one element each, `stride` elements apart
    return operand, valid, _run_bytes(e, spacing_pixels * e, e) / e


def _window_bytes(problem: Problem, tile: KernelTile, e: int) -> float:
    """D5: the input a forward or data-gradient CTA touches over its whole K loop: the rows and
    columns its bm consecutive output positions need, filter halo included, for all channels."""
    conv = problem.conv
    assert conv is not None
    if problem.op == "dgrad":  # gathers dY (P x Q) for bm positions of dX (H x W)
        rows_out, cols_out, rows_in, cols_in, channels = conv.h, conv.w, conv.p, conv.q, conv.k
        span_r, span_s, sh, sw = math.ceil(conv.r / conv.stride[0]), math.ceil(conv.s / conv.stride[1]), 1, 1
    else:
        rows_out, cols_out, rows_in, cols_in, channels = conv.p, conv.q, conv.h, conv.w, conv.c
        span_r = (conv.r - 1) * conv.dilation[0] + 1
        span_s = (conv.s - 1) * conv.dilation[1] + 1
        sh, sw = conv.stride
    bm = min(tile.m, problem.m)
    rows = min(1 + (bm - 1) / cols_out, rows_out)  # expected output rows bm positions span
    in_rows = min((rows - 1) * sh + span_r, rows_in)
    in_cols = cols_in if bm >= cols_out else min((bm - 1) * sw + span_s, cols_in)
    row_bytes = in_cols * e * (channels // conv.groups if tile.layout == "nhwc" else 1)
    planes = 1 if tile.layout == "nhwc" else channels // conv.groups
    return planes * in_rows * SECTOR * math.ceil(row_bytes / SECTOR)


def _used(size: int, out: int, taps: int, stride: int, pad: int, dil: int) -> int:
    """Input rows (or columns) that some output position's filter taps read: fewer than the
    tensor's when the stride exceeds the filter's reach (1x1 stride-2 shortcuts read a quarter)."""
    return len({o * stride - pad + t * dil for o in range(out) for t in range(taps)} & set(range(size)))


def _footprints(problem: Problem, e: int) -> tuple[float, float, float]:
    """D3: bytes of A, B and C as tensors in memory (per launch, all groups and batches): for a
    convolution the input rows and columns its taps reach; for a batched GEMM an operand all
    entries share (`Problem.shared`) counts once."""
    conv, b = problem.conv, problem.batch
    if conv is None:
        a, bb, c = problem.m * problem.k * e, problem.k * problem.n * e, problem.m * problem.n * e
        return a * (1 if problem.shared == "A" else b), bb * (1 if problem.shared == "B" else b), c * b
    used = (_used(conv.h, conv.p, conv.r, conv.stride[0], conv.pad[0], conv.dilation[0])
            * _used(conv.w, conv.q, conv.s, conv.stride[1], conv.pad[1], conv.dilation[1]))
    x = conv.n * conv.c * used * e
    y = conv.n * conv.k * conv.p * conv.q * e
    wt = conv.k * (conv.c // conv.groups) * conv.r * conv.s * e
    dx = conv.n * conv.c * conv.h * conv.w * e
    return {"fprop": (x, wt, y), "dgrad": (y, wt, dx), "wgrad": (y, x, wt)}[problem.op]


def _warps(tile: KernelTile, block_threads: int | None) -> tuple[int, int]:
    """Warps (or warp groups) along M and N: from the name; for a Hopper warp-group kernel that
    does not name them, one (its consumer warp groups work on tiles of their own); else from the
    block size, as square as a power-of-two split allows (the longer side on M)."""
    if tile.warps_m and tile.warps_n:
        return tile.warps_m, tile.warps_n
    if tile.operand_path == "tma":  # warp-group MMA: each consumer warp group reads whole tiles
        return 1, 1
    warps = max(1, (block_threads or 128) // 32)
    wm = 2 ** math.ceil(math.log2(warps) / 2)
    return wm, max(1, warps // wm)


def predict(problem: Problem, tile: KernelTile, gpu: GpuProduct, *, ctas_per_sm: int = 1,
            grid_blocks: int | None = None, block_threads: int | None = None, cluster: int = 1) -> Prediction:
    """The model for one launch of `tile`'s kernel computing `problem` on `gpu`.

    `ctas_per_sm`: CTAs an SM holds at once (the launch's occupancy on `gpu`); `grid_blocks`:
    the CTAs launched, when known: more CTAs than tiles means split-K (the quotient), fewer a
    persistent kernel looping over tiles. `block_threads` places warps when the name does not.
    `cluster`: CTAs per thread-block cluster (Hopper); TMA multicast loads one B panel for all of
    them (D5), so B requests are divided by it.
    """
    flags: list[str] = list(tile.flags)
    e = tile.element_bytes
    bm, bn = tile.m, tile.n
    tm, tn = math.ceil(problem.m / bm), math.ceil(problem.n / bn)
    tiles = tm * tn * problem.batch  # D2
    splits, ctas, persistent = 1, tiles, False
    # a guessed tile says nothing of how the grid covers the work: spread it evenly, as the
    # balanced schedules do
    balanced = tile.schedule in ("segment_k", "stream_k") or "default tile" in tile.flags
    if grid_blocks and balanced:
        ctas = grid_blocks
    elif grid_blocks:
        if grid_blocks > tiles and grid_blocks % tiles == 0:
            splits, ctas = grid_blocks // tiles, grid_blocks
        elif grid_blocks < tiles:
            ctas, persistent = grid_blocks, True
        elif grid_blocks != tiles:
            flags.append(f"grid {grid_blocks} is not a multiple of the {tiles} tiles")
    if tile.schedule in ("segment_k", "stream_k"):
        flags.append(f"{tile.schedule.replace('_', '-')}: K spread over persistent CTAs, balanced")
    elif splits > 1:
        flags.append(f"split-K x{splits}")
    slots = max(1, gpu.sm_count * max(1, ctas_per_sm))
    resident = min(ctas, slots)
    sms = min(gpu.sm_count, resident)

    # D3, D4: footprints; L1 requests, every CTA streaming its panels once per K pass
    a_u, b_u, c_u = _footprints(problem, e)
    gathered, valid, inflation = _gather(problem, tile, e)
    lowered_a = problem.m * problem.k * e * problem.batch
    lowered_b = problem.k * problem.n * e * problem.batch
    a_req = tn * lowered_a * (valid * inflation if gathered == "A" else 1.0)
    b_req = tm * lowered_b * (valid * inflation if gathered == "B" else 1.0)
    if cluster > 1 and tile.operand_path == "tma":  # multicast: one load feeds the cluster
        if a_req > b_req:
            a_req /= cluster
        else:
            b_req /= cluster
        flags.append(f"cluster of {cluster}: multicast")
    partial = 4 if splits > 1 else e  # split-K writes FP32 partial sums
    c_req = c_u / e * partial * splits
    # D5: L2 requests
    a_l2, b_l2 = a_req, b_req
    if tile.operand_path == "l1" and gathered == "A":
        a_l2 = min(a_req, tm * tn * problem.batch * _window_bytes(problem, tile, e))
    if tile.operand_path == "tma":
        flags.append("TMA: operands bypass L1")
    l1 = 0.0 if tile.operand_path == "tma" else a_req + b_req + c_req
    l2_requests = a_l2 + b_l2 + c_req
    # D6: DRAM. Tiles run in raster order, M fastest: a wave's CTAs share one B column panel,
    # read once; the A rows come back for the next column of tiles and are read again when A
    # does not fit in the L2 (a cluster covers `cluster` columns at once). Of the output, what
    # the L2 still holds dirty when the kernel ends is not written back during it: the L2's
    # share of recent lines that are output lines.
    l2 = gpu.l2_effective_bytes
    columns_per_wave = max(1, resident // tm, cluster)
    a_reads = 1 if a_u <= l2 else math.ceil(tn / columns_per_wave)
    dram_read = min(a_u * a_reads, a_l2) + min(b_u, b_l2)
    c_out = c_u / e * partial * splits
    dram_write = max(0.0, c_out - l2 * c_out / (c_out + dram_read)) if c_out else 0.0
    if a_reads > 1:
        flags.append(f"A does not fit in the L2: read {a_reads}x")
    # D7: shared memory, tile stores plus fragment reads by wm x wn warps
    wm, wn = _warps(tile, block_threads)
    shared = tiles * problem.k * e * (bm + bn + bm * wn + bn * wm)
    if tile.operand_path == "tma":
        shared = tiles * problem.k * e * (bm * wn + bn * wm)  # TMA fills shared memory itself
    # D8: compute, tile and wave quantized
    executed = 2.0 * tiles * bm * bn * problem.k
    if problem.op == "dgrad" and problem.conv is not None:
        executed /= problem.conv.stride[0] * problem.conv.stride[1]  # strided dgrad skips zero taps
    useful = float(problem.flops)
    math_ = tile.math
    try:
        peak_sm = gpu.peak_flops(math_) / gpu.sm_count
    except TraceqError:  # a what-if on a GPU without these units: the FP32 cores would do it
        math_ = "ffma"
        peak_sm = gpu.peak_flops(math_) / gpu.sm_count
        flags.append(f"no {tile.math} units on {gpu.name}: FP32 peak")
    tile_time = executed / tiles / peak_sm  # one tile on one SM alone
    per_sm = max(1, math.ceil(resident / gpu.sm_count))
    if balanced:
        waves = tiles / resident
        compute = executed / (sms * peak_sm)
    elif persistent:  # the resident CTAs take the tiles in rounds
        waves = math.ceil(tiles / resident)
        compute = waves * per_sm * tile_time
    else:
        full, rest = divmod(ctas, slots)
        waves = ctas / slots
        compute = (full * max(1, ctas_per_sm) + math.ceil(rest / gpu.sm_count)) * tile_time / splits
    peak_times = {"compute": compute, "L1": l1 / gpu.sm_bytes_per_s(sms), "shared": shared / gpu.sm_bytes_per_s(sms),
                  "L2": l2_requests / gpu.l2_bytes_per_s, "DRAM": (dram_read + dram_write) / gpu.dram_bytes_per_s}
    rate = ACHIEVABLE["ffma" if math_ in ("ffma", "fp16x2") else "tensor"]
    times = {level: t / (rate if level == "compute" else ACHIEVABLE[level]) for level, t in peak_times.items()}
    return Prediction(tiles=tiles, splits=splits, ctas=ctas, waves=waves, flops=useful, executed_flops=executed,
                      l1_bytes=l1, shared_bytes=shared, l2_bytes=l2_requests, dram_read_bytes=dram_read,
                      dram_write_bytes=dram_write, times=times, peak_times=peak_times, flags=tuple(flags))
