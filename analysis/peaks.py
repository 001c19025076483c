"""Peak arithmetic throughput of a GPU: the denominators of compute efficiency (CE).

Two peaks, because a tensor-core GPU has two honest ones:

- `fp32_peak_flops`: the paper's peak, 2 x clock x FP32 lanes ("CUDA cores") x SMs; the 2
  counts a fused multiply-add as two operations. This is what the CUDA cores can do without
  tensor cores.
- `tensor_peak_flops`: the dense (no 2:4 sparsity) tensor-core peak for a data type. PyTorch's
  default for cuDNN convolutions on fp32 tensors is TF32 tensor cores, so dtype 'float32' means
  TF32 here.

Per-SM-per-clock rates are per compute capability; multiply by SMs and the clock the trace
records (`gpus.clock_hz`, the maximum SM clock). NVIDIA's datasheets quote tensor peaks at a
lower "tensor boost" clock than the SM boost clock (H100 SXM: 1.83 vs 1.98 GHz), so a peak at the
trace's clock is somewhat above the datasheet figure.

Sources:
  FP32 lanes: `gpu_specs.py`'s table (CUDA C++ Programming Guide, arithmetic instruction
  throughput), plus Fermi: GF100 32 and GF104 48 cores per SM (Fermi whitepaper; GF104 brief).
  Tensor cores, dense FLOP per clock per SM (an FMA is 2 FLOP):
  V  Volta whitepaper: 8 tensor cores/SM x 64 FP16 FMA/clk = 1024; V100 SXM2 80 SMs x 1.53 GHz
     = 125 TF.
  T  Turing whitepaper: 8 x 64 FP16 FMA (1024), INT8 twice that; T4 40 SMs x 1.59 GHz = 65 TF.
  A  A100 whitepaper: 4 x 256 FP16 FMA/clk = 2048, TF32 half, INT8 double; 108 SMs x 1.41 GHz
     = 312 TF FP16, 156 TF TF32, 624 TOPS.
  G  GA102 whitepaper / RTX A6000 datasheet: half of GA100 per SM (1024 FP16); 84 SMs x 1.80 GHz
     = 154.8 TF FP16, 77.4 TF TF32. GeForce cards run FP16 with FP32 accumulate at half this.
  L  Ada whitepaper / L40S datasheet: 1024 FP16, 512 TF32, 2048 FP8 and INT8; 142 SMs x 2.52 GHz
     = 362 TF FP16, 183 TF TF32, 733 TF FP8.
  H  Hopper whitepaper ("2x the A100 SM's MMA rate clock for clock, 4x with FP8"): 4096 FP16;
     H100 SXM5 132 SMs x 1.83 GHz = 989.4 TF FP16, 494.7 TF TF32, 1979 TF FP8.
  B  HGX B200 datasheet: 2.25 PF FP16, 1.1 PF TF32, 4.5 PF FP8 and INT8 dense at 148 SMs, which
     with the 1.86 GHz tensor clock is 8192 FP16 FLOP/clk/SM (2x Hopper).
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.gpu_specs import limits_for_cc
from traceq.errors import TraceqError

DTYPES = ("float32", "tf32", "float16", "bfloat16", "fp8", "int8")
"""Data type names accepted by `tensor_peak_flops` (and by model-spec files)."""

_TENSOR_KIND = {"float32": "tf32", "tf32": "tf32", "float16": "fp16", "bfloat16": "bf16",
                "fp8": "fp8", "int8": "int8"}

_FERMI_LANES = {(2, 0): 32, (2, 1): 48}

# Dense tensor-core FLOP (or integer op) per clock per SM; a missing key: no tensor cores for it.
# BF16 runs at the FP16 rate from Ampere on; Volta and Turing have neither BF16 nor TF32.
_TENSOR_PER_SM_CLOCK: dict[tuple[int, int], dict[str, int]] = {
    (7, 0): {"fp16": 1024},                                                        # V
    (7, 5): {"fp16": 1024, "int8": 2048},                                          # T
    (8, 0): {"tf32": 1024, "fp16": 2048, "bf16": 2048, "int8": 4096},              # A
    (8, 6): {"tf32": 512, "fp16": 1024, "bf16": 1024, "int8": 2048},               # G
    (8, 9): {"tf32": 512, "fp16": 1024, "bf16": 1024, "fp8": 2048, "int8": 2048},  # L
    (9, 0): {"tf32": 2048, "fp16": 4096, "bf16": 4096, "fp8": 8192, "int8": 8192},  # H
    (10, 0): {"tf32": 4096, "fp16": 8192, "bf16": 8192, "fp8": 16384, "int8": 16384},  # B
}


def fp32_lanes_per_sm(cc_major: int, cc_minor: int) -> int:
    """FP32 FMA results per clock per SM ("CUDA cores" per SM). Raises TraceqError for an
    unknown compute capability."""
    if (cc_major, cc_minor) in _FERMI_LANES:
        return _FERMI_LANES[(cc_major, cc_minor)]
    return limits_for_cc(cc_major, cc_minor).fp32_lanes_per_sm


def fp32_peak_flops(cc_major: int, cc_minor: int, sm_count: int, clock_hz: float) -> float:
    """The paper's peak in FLOP/s: 2 x clock x FP32 lanes per SM x SMs."""
    return 2.0 * clock_hz * fp32_lanes_per_sm(cc_major, cc_minor) * sm_count


def tensor_flops_per_sm_clock(cc_major: int, cc_minor: int, dtype: str) -> int | None:
    """Dense tensor-core FLOP per clock per SM for `dtype` (one of DTYPES; 'float32' means TF32).
    None where the GPU has no tensor cores for that type, or its CC is not in the table."""
    if dtype not in _TENSOR_KIND:
        raise TraceqError(f"unknown data type {dtype!r}; expected one of {', '.join(DTYPES)}")
    return _TENSOR_PER_SM_CLOCK.get((cc_major, cc_minor), {}).get(_TENSOR_KIND[dtype])


def tensor_peak_flops(cc_major: int, cc_minor: int, sm_count: int, clock_hz: float,
                      dtype: str = "float32") -> float | None:
    """Dense tensor-core peak in FLOP/s for `dtype` at `clock_hz`, or None (see
    `tensor_flops_per_sm_clock`)."""
    per_clock = tensor_flops_per_sm_clock(cc_major, cc_minor, dtype)
    return None if per_clock is None else float(per_clock) * sm_count * clock_hz


def trace_peaks(con: duckdb.DuckDBPyConnection, trace_id: int, dtype: str = "float32") -> pl.DataFrame:
    """Both peaks of every GPU the trace describes, at the clock the trace records.

    Columns: device_id, name, cc ('9.0'), sm_count, clock_hz, fp32_peak_flops (FLOP/s),
    tensor_peak_flops (FLOP/s for `dtype`; null without tensor cores for it), dtype. GPUs the
    trace describes without CC, SM count or clock are left out.
    """
    rows = con.execute(
        "SELECT device_id, name, cc_major, cc_minor, sm_count, clock_hz FROM gpus "
        "WHERE trace_id = ? AND cc_major IS NOT NULL AND sm_count IS NOT NULL AND clock_hz IS NOT NULL "
        "ORDER BY device_id", [int(trace_id)]).fetchall()
    out = [(device, name, f"{major}.{minor}", sms, clock, fp32_peak_flops(major, minor, sms, clock),
            tensor_peak_flops(major, minor, sms, clock, dtype), dtype)
           for device, name, major, minor, sms, clock in rows]
    schema = {"device_id": pl.Int32, "name": pl.String, "cc": pl.String, "sm_count": pl.Int32,
              "clock_hz": pl.Int64, "fp32_peak_flops": pl.Float64, "tensor_peak_flops": pl.Float64,
              "dtype": pl.String}
    return pl.DataFrame(out, schema=schema, orient="row")
