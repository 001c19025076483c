"""Peak arithmetic throughput of a GPU: the denominators of compute efficiency (CE).

A GPU has one honest peak per number format: a kernel that multiplies TF32 on tensor cores is
measured against the TF32 tensor-core peak, one that runs FP32 FMAs on the CUDA cores against
2 x clock x FP32 lanes x SMs (the paper's equation 8). `peak_flops(cc, sms, clock, precision)`
gives the dense (no 2:4 sparsity) peak for each of `choices.PRECISIONS`: the faster of what the
CUDA cores and the tensor cores can do in that format, so no kernel can honestly exceed it.
None where the GPU has neither for the format, or its CC is not in the table.

Per-SM-per-clock rates are per compute capability; multiply by SMs and the clock the trace
records (`gpus.clock_hz`, the maximum SM clock). NVIDIA's datasheets quote tensor peaks at a
lower "tensor boost" clock than the SM boost clock (H100 SXM: 1.83 vs 1.98 GHz), so a peak at the
trace's clock is somewhat above the datasheet figure.

Sources (tests/test_peaks.py checks each row against the published figures):
  FP32 lanes: `gpu_specs.py`'s table (CUDA C++ Programming Guide, arithmetic instruction
  throughput), plus Fermi: GF100 32 and GF104 48 cores per SM (Fermi whitepaper; GF104 brief).
  FP64 and FP16 on CUDA cores: the same Programming Guide table (64-bit and 16-bit
  floating-point add, multiply, multiply-add results per clock per SM); FP16 only where it
  beats the tensor cores' (before Volta). P100 SXM2 56 SMs x 1.48 GHz: 5.3 TF FP64, 21.2 TF FP16.
  Tensor cores, dense FLOP per clock per SM (an FMA is 2 FLOP):
  V  Volta whitepaper: 8 tensor cores/SM x 64 FP16 FMA/clk = 1024; V100 SXM2 80 SMs x 1.53 GHz
     = 125 TF. Xavier (7.2): the same per SM, 8 SMs x 1.377 GHz = 11 TF FP16, 22 TOPS INT8.
  T  Turing whitepaper: 8 x 64 FP16 FMA (1024), INT8 twice that; T4 40 SMs x 1.59 GHz = 65 TF.
  A  A100 whitepaper: 4 x 256 FP16 FMA/clk = 2048, TF32 half, INT8 double, FP64 (DMMA) 128;
     108 SMs x 1.41 GHz = 312 TF FP16, 156 TF TF32, 624 TOPS, 19.5 TF FP64. Orin (8.7): the
     same tensor cores, 16 SMs x 1.3 GHz = 85 dense INT8 TOPS (Jetson AGX Orin brief).
  G  GA102 whitepaper / RTX A6000 datasheet: half of GA100 per SM (1024 FP16); 84 SMs x 1.80 GHz
     = 154.8 TF FP16, 77.4 TF TF32. GeForce cards run FP16 with FP32 accumulate at half this.
  L  Ada whitepaper / L40S datasheet: 1024 FP16, 512 TF32, 2048 FP8 and INT8; 142 SMs x 2.52 GHz
     = 362 TF FP16, 183 TF TF32, 733 TF FP8.
  H  Hopper whitepaper ("2x the A100 SM's MMA rate clock for clock, 4x with FP8"): 4096 FP16;
     H100 SXM5 132 SMs x 1.83 GHz = 989.4 TF FP16, 494.7 TF TF32, 1979 TF FP8; FP64 tensor 256
     (H100 SXM datasheet: 67 TF at 1.98 GHz, twice the 34 TF of the FP64 CUDA cores).
  B  HGX B200 datasheet: 2.25 PF FP16, 1.1 PF TF32, 4.5 PF FP8 and INT8 dense at 148 SMs, which
     with the 1.86 GHz tensor clock is 8192 FP16 FLOP/clk/SM (2x Hopper). Its FP64 (40 TF, on
     both units) fits no per-SM rate at a published clock, and B300 (10.3) figures disagree
     between sources: FP64 on CC 10.x and every format on 10.3 are left out (None).
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.choices import PRECISIONS
from traceq.analysis.efficiency.gpu_specs import limits_for_cc
from traceq.errors import TraceqError

DTYPES = ("float64", "float32", "tf32", "float16", "bfloat16", "fp8", "int8")
"""Data type names of model-spec files and `dtype_precision`."""

_DTYPE_PRECISION = {"float64": "fp64", "float32": "fp32", "tf32": "tf32", "float16": "fp16",
                    "bfloat16": "bf16", "fp8": "fp8", "int8": "int8"}

_FERMI_LANES = {(2, 0): 32, (2, 1): 48}

# Dense tensor-core FLOP (or integer op) per clock per SM; a missing key: no tensor cores for it.
# BF16 runs at the FP16 rate from Ampere on; Volta and Turing have neither BF16 nor TF32.
_TENSOR_PER_SM_CLOCK: dict[tuple[int, int], dict[str, int]] = {
    (7, 0): {"fp16": 1024},                                                        # V
    (7, 2): {"fp16": 1024, "int8": 2048},                                          # V (Xavier)
    (7, 5): {"fp16": 1024, "int8": 2048},                                          # T
    (8, 0): {"fp64": 128, "tf32": 1024, "fp16": 2048, "bf16": 2048, "int8": 4096},  # A
    (8, 6): {"tf32": 512, "fp16": 1024, "bf16": 1024, "int8": 2048},               # G
    (8, 7): {"tf32": 1024, "fp16": 2048, "bf16": 2048, "int8": 4096},              # A (Orin)
    (8, 9): {"tf32": 512, "fp16": 1024, "bf16": 1024, "fp8": 2048, "int8": 2048},  # L
    (9, 0): {"fp64": 256, "tf32": 2048, "fp16": 4096, "bf16": 4096, "fp8": 8192, "int8": 8192},  # H
    (10, 0): {"tf32": 4096, "fp16": 8192, "bf16": 8192, "fp8": 16384, "int8": 16384},  # B
}

# FLOP per clock per SM on the CUDA cores (2 x the guide's results per clock), beyond FP32.
_CUDA_CORE_PER_SM_CLOCK: dict[tuple[int, int], dict[str, int]] = {
    (3, 0): {"fp64": 16}, (3, 2): {"fp64": 16}, (3, 5): {"fp64": 128}, (3, 7): {"fp64": 128},
    (5, 0): {"fp64": 8}, (5, 2): {"fp64": 8}, (5, 3): {"fp64": 8, "fp16": 512},
    (6, 0): {"fp64": 64, "fp16": 256}, (6, 1): {"fp64": 8, "fp16": 4}, (6, 2): {"fp64": 8, "fp16": 512},
    (7, 0): {"fp64": 64}, (7, 5): {"fp64": 4}, (8, 0): {"fp64": 64}, (8, 6): {"fp64": 4},
    (8, 9): {"fp64": 4}, (9, 0): {"fp64": 128},
}


def dtype_precision(dtype: str, tensor_cores: bool = False) -> str:
    """The precision an operator's data type computes in: float32 on tensor cores is TF32
    (PyTorch's default for cuDNN convolutions), on the CUDA cores fp32."""
    if dtype not in _DTYPE_PRECISION:
        raise TraceqError(f"unknown data type {dtype!r}; expected one of {', '.join(DTYPES)}")
    precision = _DTYPE_PRECISION[dtype]
    return "tf32" if precision == "fp32" and tensor_cores else precision


def fp32_lanes_per_sm(cc_major: int, cc_minor: int) -> int:
    """FP32 FMA results per clock per SM ("CUDA cores" per SM). Raises TraceqError for an
    unknown compute capability."""
    if (cc_major, cc_minor) in _FERMI_LANES:
        return _FERMI_LANES[(cc_major, cc_minor)]
    return limits_for_cc(cc_major, cc_minor).fp32_lanes_per_sm


def fp32_peak_flops(cc_major: int, cc_minor: int, sm_count: int, clock_hz: float) -> float:
    """The paper's peak in FLOP/s: 2 x clock x FP32 lanes per SM x SMs."""
    return 2.0 * clock_hz * fp32_lanes_per_sm(cc_major, cc_minor) * sm_count


def flops_per_sm_clock(cc_major: int, cc_minor: int, precision: str) -> int | None:
    """Dense FLOP (or integer op) per clock per SM in `precision` (one of PRECISIONS): the
    faster of the CUDA cores and the tensor cores. None where the GPU has neither for it, or
    its CC is not in the table."""
    if precision not in PRECISIONS:
        raise TraceqError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    cc = (cc_major, cc_minor)
    rates = [_TENSOR_PER_SM_CLOCK.get(cc, {}).get(precision), _CUDA_CORE_PER_SM_CLOCK.get(cc, {}).get(precision)]
    if precision == "fp32":
        rates.append(2 * fp32_lanes_per_sm(*cc))
    return max((rate for rate in rates if rate), default=None)


def peak_flops(cc_major: int, cc_minor: int, sm_count: int, clock_hz: float, precision: str) -> float | None:
    """Dense peak in FLOP/s in `precision` at `clock_hz`, or None (see `flops_per_sm_clock`)."""
    per_clock = flops_per_sm_clock(cc_major, cc_minor, precision)
    return None if per_clock is None else float(per_clock) * sm_count * clock_hz


def tensor_peak_flops(cc_major: int, cc_minor: int, sm_count: int, clock_hz: float,
                      dtype: str = "float32") -> float | None:
    """Dense tensor-core peak in FLOP/s for a data type ('float32' means TF32), or None where
    the GPU has no tensor cores for it."""
    per_clock = _TENSOR_PER_SM_CLOCK.get((cc_major, cc_minor), {}).get(dtype_precision(dtype, tensor_cores=True))
    return None if per_clock is None else float(per_clock) * sm_count * clock_hz


def trace_peaks(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """The peak in every precision of every GPU the trace describes, at the clock it records.

    Columns: device_id, name, cc ('9.0'), sm_count, clock_hz, then one column per precision,
    peak_fp64 ... peak_int8 (FLOP/s; null where the GPU has none). GPUs the trace describes
    without CC, SM count or clock are left out.
    """
    rows = con.execute(
        "SELECT device_id, name, cc_major, cc_minor, sm_count, clock_hz FROM gpus "
        "WHERE trace_id = ? AND cc_major IS NOT NULL AND sm_count IS NOT NULL AND clock_hz IS NOT NULL "
        "ORDER BY device_id", [int(trace_id)]).fetchall()
    out = [(device, name, f"{major}.{minor}", sms, clock,
            *(peak_flops(major, minor, sms, clock, p) for p in PRECISIONS))
           for device, name, major, minor, sms, clock in rows]
    schema = {"device_id": pl.Int32, "name": pl.String, "cc": pl.String, "sm_count": pl.Int32,
              "clock_hz": pl.Int64, **{f"peak_{p}": pl.Float64 for p in PRECISIONS}}
    return pl.DataFrame(out, schema=schema, orient="row")
