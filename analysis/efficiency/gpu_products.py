"""GPU products for the memory-traffic model (`traceq traffic --gpu NAME`): the per-product
numbers a compute capability does not fix (SMs, clock, L1 size, L2 size and bandwidth, DRAM
bandwidth), each with its source.

Per-SM limits come from `gpu_specs` (by compute capability) and peak FLOP/s from `peaks`
(FP32 lanes and tensor-core rates per CC, times SMs and clock), so this module adds no second
table of either. A trace's own GPU is described by its device record where it has one
(`trace_gpu`: SMs, clock, L2 size, DRAM bandwidth), completed from the product row its name
matches (L1 size, L2 bandwidth).

Sources, marked on each row:
  D  NVIDIA datasheets: SMs, boost clock, memory bandwidth, L2 size (V100 SXM2 2020, A100
     2021, H100 2023, H200 2024 product briefs).
  W  NVIDIA architecture whitepapers: unified L1/shared-memory size per SM (Volta 128 KB,
     A100 192 KB, H100 256 KB); the A100 whitepaper's "2.3x the L2 read bandwidth of V100".
  L  L2 read bandwidth in bytes per clock: 2048 (V100) and 5120 (A100), the figures NVIDIA
     gave for the 2.3x above (2048 x 1.53 GHz = 3133 GB/s, 5120 x 1.41 GHz = 7219 GB/s, as
     tabulated with H100's 8986 GB/s = 5120 x 1.755 GHz in Ultrasonics Sonochemistry 99 (2023)
     106546, table 3). NVIDIA publishes no Hopper L2 bandwidth; 5120 B/clk is that table's.
  T  our H200 trace's device record (nsys TARGET_INFO_GPU, sample_traces/alexnet_b256_cudnn):
     60 MiB of L2, 4.814 TB/s, 1.98 GHz.
  S  L1 and shared-memory bandwidth: 32 banks x 4 bytes = 128 bytes per clock per SM on every
     architecture here (CUDA C++ Programming Guide, shared memory; the L1 data path is the same
     128 B/clk wide).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb

from traceq.analysis.efficiency.gpu_specs import limits_for_cc
from traceq.analysis.efficiency.peaks import fp32_peak_flops, tensor_peak_flops
from traceq.errors import MissingDataError, TraceqError

KIB = 1024
MIB = 1024 * 1024

SM_BYTES_PER_CLOCK = 128
"""L1 and shared-memory bandwidth per SM per clock (source S)."""


@dataclass(frozen=True)
class GpuProduct:
    """One GPU as the traffic model sees it. Bandwidths in bytes/s, sizes in bytes."""

    name: str
    cc: tuple[int, int]
    sm_count: int
    clock_hz: float
    l1_bytes_per_sm: int           # unified L1 / shared memory per SM
    l2_bytes: int
    l2_bytes_per_clock: int        # L2 read bandwidth of the whole GPU per SM clock
    dram_bytes_per_s: float
    source: str                    # which of the sources above each number comes from

    @property
    def smem_bytes_per_sm(self) -> int:
        """The most shared memory an SM can carve out (gpu_specs, by compute capability)."""
        return limits_for_cc(*self.cc).smem_per_sm

    @property
    def l2_effective_bytes(self) -> int:
        """The L2 a kernel's data can use: half the L2 from Ampere on, whose L2 is two partitions,
        each able to hold a copy of a line the other's SMs read (the A100 and H100 whitepapers);
        fitted in docs/traffic.md against the output bytes Nsight Compute saw stay in the L2."""
        return self.l2_bytes // 2 if self.cc >= (8, 0) else self.l2_bytes

    @property
    def l2_bytes_per_s(self) -> float:
        return self.l2_bytes_per_clock * self.clock_hz

    def sm_bytes_per_s(self, sms: int | None = None) -> float:
        """L1 (or shared-memory) bandwidth of `sms` SMs (all by default)."""
        return SM_BYTES_PER_CLOCK * self.clock_hz * (self.sm_count if sms is None else sms)

    def peak_flops(self, math: str) -> float:
        """Peak FLOP/s for a kernel's math: 'ffma' (FP32 CUDA cores, 2 x clock x lanes x SMs),
        'fp16x2' (packed half on the CUDA cores: twice that), or a tensor-core type 'tf32',
        'fp16', 'bf16', 'fp8', 'int8' (peaks.tensor_peak_flops). Raises TraceqError where the
        GPU has no such units."""
        fp32 = fp32_peak_flops(*self.cc, self.sm_count, self.clock_hz)
        if math == "ffma":
            return fp32
        if math == "fp16x2":
            return 2 * fp32
        dtype = {"tf32": "tf32", "fp16": "float16", "bf16": "bfloat16", "fp8": "fp8", "int8": "int8"}.get(math)
        peak = tensor_peak_flops(*self.cc, self.sm_count, self.clock_hz, dtype) if dtype else None
        if peak is None:
            raise TraceqError(f"{self.name} (CC {self.cc[0]}.{self.cc[1]}) has no {math} tensor cores in "
                              "traceq's peak table")
        return peak


def _row(name: str, aliases: str, cc: tuple[int, int], sms: int, mhz: int, l1_kib: int, l2_mib: float,
         l2_bytes_per_clock: int, dram_gb_s: float, source: str) -> tuple[GpuProduct, re.Pattern[str]]:
    product = GpuProduct(name, cc, sms, mhz * 1e6, l1_kib * KIB, int(l2_mib * MIB), l2_bytes_per_clock,
                         dram_gb_s * 1e9, source)
    return product, re.compile(aliases, re.IGNORECASE)


_DWL = "D: SMs, clock, L2, DRAM; W: L1; L: L2 bandwidth"
_HOPPER = _DWL + " (no NVIDIA figure for Hopper)"

# Columns: name, how trace device names and --gpu spell it, CC, SMs, boost clock MHz, L1/shared KiB
# per SM, L2 MiB, L2 bytes per clock, DRAM GB/s; source letters per column group.
_PRODUCTS = (
    _row("V100-SXM2", r"v100(?!.*pcie)", (7, 0), 80, 1530, 128, 6, 2048, 900, _DWL),
    _row("V100-PCIe", r"v100.*pcie", (7, 0), 80, 1380, 128, 6, 2048, 900, _DWL),
    _row("A100-SXM4-40GB", r"a100.*sxm.*40|^a100$|a100-40", (8, 0), 108, 1410, 192, 40, 5120, 1555, _DWL),
    _row("A100-SXM4-80GB", r"a100.*sxm.*80|a100-80", (8, 0), 108, 1410, 192, 40, 5120, 2039, _DWL),
    _row("A100-PCIe-40GB", r"a100.*pcie.*40|a100.*40.*pcie", (8, 0), 108, 1410, 192, 40, 5120, 1555, _DWL),
    _row("A100-PCIe-80GB", r"a100.*(80.*pcie|pcie.*80)", (8, 0), 108, 1410, 192, 40, 5120, 1935, _DWL),
    _row("H100-SXM5", r"h100(?!.*(pcie|nvl))|h100.*hbm3", (9, 0), 132, 1980, 256, 50, 5120, 3352, _HOPPER),
    _row("H100-PCIe", r"h100.*pcie", (9, 0), 114, 1755, 256, 50, 5120, 2039, _HOPPER),
    _row("H200", r"h200", (9, 0), 132, 1980, 256, 60, 5120, 4814,
         "D: SMs; T: clock, L2 size, DRAM bandwidth as the device recorded them; W: L1; L: L2 bandwidth"),
)


def known_gpus() -> list[str]:
    """The product names `--gpu` accepts."""
    return [product.name for product, _ in _PRODUCTS]


def gpu_product(name: str) -> GpuProduct:
    """The product row for `name`: a row name ('H100-SXM5', case-insensitive) or a device name a
    trace records ('NVIDIA H100 80GB HBM3', 'Tesla V100-SXM2-16GB'). Raises TraceqError naming
    the known GPUs when none matches."""
    wanted = name.strip()
    for product, _ in _PRODUCTS:
        if product.name.lower() == wanted.lower():
            return product
    for product, pattern in _PRODUCTS:
        if pattern.search(wanted):
            return product
    raise TraceqError(f"GPU {name!r} is not in traceq's product table (known: {', '.join(known_gpus())}); "
                      "add a row with its sources to analysis/efficiency/gpu_products.py")


def trace_gpu(con: duckdb.DuckDBPyConnection, trace_id: int) -> GpuProduct:
    """The GPU of the device that ran the most kernel time, as its device record describes it
    (CC, SMs, clock, L2 size, DRAM bandwidth), with L1 size and L2 bytes per clock from the
    product row its name matches. Raises MissingDataError without a device record, TraceqError
    when the name matches no product row."""
    rows = con.execute(
        "SELECT g.name, g.cc_major, g.cc_minor, g.sm_count, g.clock_hz, g.l2_cache_bytes, "
        "g.memory_bandwidth_bytes_per_s, coalesce(sum(k.dur_ns), 0) AS busy "
        "FROM gpus g LEFT JOIN kernels k ON k.trace_id = g.trace_id AND k.device_id = g.device_id "
        "WHERE g.trace_id = ? GROUP BY ALL ORDER BY busy DESC, g.name", [int(trace_id)]).fetchall()
    if not rows or rows[0][1] is None or not rows[0][3]:
        raise MissingDataError("the trace has no GPU description (compute capability, SMs): "
                               "pass --gpu NAME to model its kernels on a GPU of traceq's table")
    name, major, minor, sms, clock, l2, dram, _ = rows[0]
    try:
        row = gpu_product(name or "")
    except TraceqError:
        raise TraceqError(f"the trace's GPU {name!r} is not in traceq's product table (known: "
                          f"{', '.join(known_gpus())}): pass --gpu NAME") from None
    return GpuProduct(
        name=name, cc=(int(major), int(minor)), sm_count=int(sms), clock_hz=float(clock or row.clock_hz),
        l1_bytes_per_sm=row.l1_bytes_per_sm, l2_bytes=int(l2 or row.l2_bytes),
        l2_bytes_per_clock=row.l2_bytes_per_clock, dram_bytes_per_s=float(dram or row.dram_bytes_per_s),
        source=f"the trace's device record; L1 and L2 bandwidth from traceq's {row.name} row")
