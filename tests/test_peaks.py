"""Peak throughput against NVIDIA's published figures (datasheets and architecture whitepapers),
at the SM count and clock each figure was computed for."""

from __future__ import annotations

import pytest
from conftest import trace_id

from traceq.analysis.peaks import DTYPES, fp32_peak_flops, tensor_peak_flops, trace_peaks
from traceq.errors import TraceqError

T = 1e12


def close(value: float | None, published: float, within: float = 0.01) -> bool:
    return value is not None and abs(value / published - 1) < within


@pytest.mark.parametrize("gpu, cc, sms, clock_ghz, published_tflops", [
    ("GTX 580", (2, 0), 16, 1.544, 1.581),
    ("GTX 460", (2, 1), 7, 1.350, 0.907),
    ("Tesla K40 (base clock)", (3, 5), 15, 0.745, 4.29),
    ("GTX 980", (5, 2), 16, 1.216, 4.98),
    ("Tesla P100 SXM2", (6, 0), 56, 1.480, 10.6),
    ("GTX 1080", (6, 1), 20, 1.733, 8.87),
    ("Tesla V100 SXM2", (7, 0), 80, 1.530, 15.7),
    ("Tesla T4", (7, 5), 40, 1.590, 8.1),
    ("A100 SXM4", (8, 0), 108, 1.410, 19.5),
    ("RTX 3090", (8, 6), 82, 1.695, 35.6),
    ("RTX 4090", (8, 9), 128, 2.520, 82.6),
    ("L40S", (8, 9), 142, 2.520, 91.6),
    ("H100 SXM5 / H200", (9, 0), 132, 1.980, 67.0),
    ("B200", (10, 0), 148, 1.980, 75.0),
    ("RTX 5090", (12, 0), 170, 2.407, 104.8),
])
def test_fp32_peak(gpu: str, cc: tuple[int, int], sms: int, clock_ghz: float, published_tflops: float) -> None:
    assert close(fp32_peak_flops(*cc, sms, clock_ghz * 1e9), published_tflops * T), gpu


@pytest.mark.parametrize("gpu, cc, sms, clock_ghz, dtype, published_tflops", [
    ("Tesla V100 SXM2", (7, 0), 80, 1.530, "float16", 125),
    ("Tesla T4", (7, 5), 40, 1.590, "float16", 65),
    ("Tesla T4", (7, 5), 40, 1.590, "int8", 130),
    ("A100 SXM4", (8, 0), 108, 1.410, "float32", 156),
    ("A100 SXM4", (8, 0), 108, 1.410, "bfloat16", 312),
    ("A100 SXM4", (8, 0), 108, 1.410, "int8", 624),
    ("RTX A6000", (8, 6), 84, 1.800, "float16", 154.8),
    ("RTX A6000", (8, 6), 84, 1.800, "tf32", 77.4),
    ("L40S", (8, 9), 142, 2.520, "tf32", 183),
    ("L40S", (8, 9), 142, 2.520, "bfloat16", 362),
    ("L40S", (8, 9), 142, 2.520, "fp8", 733),
    # H100 SXM5 whitepaper and H200 datasheet (sparse figures halved), at the 1.83 GHz tensor clock
    ("H100 SXM5 / H200", (9, 0), 132, 1.830, "float32", 494.7),
    ("H100 SXM5 / H200", (9, 0), 132, 1.830, "bfloat16", 989.4),
    ("H100 SXM5 / H200", (9, 0), 132, 1.830, "fp8", 1979),
    ("H100 SXM5 / H200", (9, 0), 132, 1.830, "int8", 1979),
    ("HGX B200", (10, 0), 148, 1.860, "float16", 2250),
    ("HGX B200", (10, 0), 148, 1.860, "fp8", 4500),
    ("HGX B200", (10, 0), 148, 1.860, "tf32", 1100),
])
def test_tensor_peak(gpu: str, cc: tuple[int, int], sms: int, clock_ghz: float, dtype: str,
                     published_tflops: float) -> None:
    assert close(tensor_peak_flops(*cc, sms, clock_ghz * 1e9, dtype), published_tflops * T, 0.03), gpu


@pytest.mark.parametrize("cc, dtype", [((7, 0), "float32"), ((7, 0), "bfloat16"), ((7, 5), "tf32"),
                                       ((8, 0), "fp8"), ((8, 6), "fp8"), ((6, 1), "float16"),
                                       ((12, 0), "float16")])
def test_no_tensor_cores_for_the_type(cc: tuple[int, int], dtype: str) -> None:
    assert tensor_peak_flops(*cc, 100, 1e9, dtype) is None


def test_float32_means_tf32_and_bad_names_are_refused() -> None:
    assert tensor_peak_flops(9, 0, 132, 1.98e9, "float32") == tensor_peak_flops(9, 0, 132, 1.98e9, "tf32")
    assert tensor_peak_flops(9, 0, 132, 1.98e9, "float16") == tensor_peak_flops(9, 0, 132, 1.98e9, "bfloat16")
    assert set(DTYPES) >= {"float32", "tf32", "float16", "bfloat16", "fp8"}
    with pytest.raises(TraceqError, match="unknown data type 'double'"):
        tensor_peak_flops(9, 0, 132, 1.98e9, "double")
    with pytest.raises(TraceqError, match="1.0 is not in"):
        fp32_peak_flops(1, 0, 1, 1e9)


def test_the_sample_traces_h200(sample_store) -> None:
    """The reference H200: CC 9.0, 132 SMs, the trace records the 1.98 GHz maximum SM clock."""
    peaks = trace_peaks(sample_store, trace_id(sample_store, "alexnet_b256_cudnn"))
    assert peaks.select("device_id", "name", "cc", "sm_count", "clock_hz").rows() == [
        (0, "NVIDIA H200", "9.0", 132, 1_980_000_000)]
    assert close(peaks["fp32_peak_flops"][0], 66.9 * T, 0.001)  # datasheet: 67 TFLOPS
    assert peaks["tensor_peak_flops"][0] == 2048 * 132 * 1.98e9  # TF32 at 1.98 GHz: 535 TF
    assert close(peaks["tensor_peak_flops"][0] * 1.83 / 1.98, 494.7 * T)  # the datasheet's clock
