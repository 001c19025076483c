"""Peak throughput against NVIDIA's published figures (datasheets and architecture whitepapers),
at the SM count and clock each figure was computed for."""

from __future__ import annotations

import pytest
from conftest import trace_id

from traceq.analysis.choices import PRECISIONS
from traceq.analysis.efficiency.peaks import (
    DTYPES,
    dtype_precision,
    fp32_peak_flops,
    peak_flops,
    tensor_peak_flops,
    trace_peaks,
)
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


@pytest.mark.parametrize("gpu, cc, sms, clock_ghz, precision, published_tflops", [
    # FP64: the CUDA cores' rate, or the tensor cores' where they are faster (A100, H100)
    ("Tesla K40 (base clock)", (3, 5), 15, 0.745, "fp64", 1.43),
    ("Tesla P100 SXM2", (6, 0), 56, 1.480, "fp64", 5.3),
    ("GTX 1080", (6, 1), 20, 1.733, "fp64", 0.277),
    ("Tesla V100 SXM2", (7, 0), 80, 1.530, "fp64", 7.8),
    ("Tesla T4", (7, 5), 40, 1.590, "fp64", 0.254),
    ("A100 SXM4 (FP64 tensor core)", (8, 0), 108, 1.410, "fp64", 19.5),
    ("RTX 3090", (8, 6), 82, 1.695, "fp64", 0.556),
    ("H100 SXM5 (FP64 tensor core)", (9, 0), 132, 1.980, "fp64", 67.0),
    # FP16 before tensor cores: the CUDA cores (2x FP32 on P100 and Tegra, 1/64 on GP104)
    ("Tesla P100 SXM2", (6, 0), 56, 1.480, "fp16", 21.2),
    ("Jetson Nano", (5, 3), 1, 0.9216, "fp16", 0.472),
    ("GTX 1080", (6, 1), 20, 1.733, "fp16", 0.139),
    # tensor-core formats: the tensor cores
    ("Jetson AGX Xavier", (7, 2), 8, 1.377, "fp16", 11.3),
    ("Jetson AGX Orin 64GB (85 dense INT8 TOPS)", (8, 7), 16, 1.300, "int8", 85.2),
    ("Tesla V100 SXM2", (7, 0), 80, 1.530, "fp16", 125),
    ("A100 SXM4", (8, 0), 108, 1.410, "tf32", 156),
    ("H100 SXM5 / H200", (9, 0), 132, 1.830, "bf16", 989.4),
    ("H100 SXM5 / H200", (9, 0), 132, 1.830, "fp8", 1979),
    ("HGX B200", (10, 0), 148, 1.860, "int8", 4500),
    # FP32: the paper's peak, on every GPU
    ("A100 SXM4", (8, 0), 108, 1.410, "fp32", 19.5),
    ("H100 SXM5 / H200", (9, 0), 132, 1.980, "fp32", 67.0),
])
def test_peak_per_precision(gpu: str, cc: tuple[int, int], sms: int, clock_ghz: float, precision: str,
                            published_tflops: float) -> None:
    assert close(peak_flops(*cc, sms, clock_ghz * 1e9, precision), published_tflops * T, 0.03), gpu


@pytest.mark.parametrize("cc, precision", [((8, 0), "fp8"), ((7, 0), "tf32"), ((7, 5), "bf16"), ((10, 0), "fp64"),
                                           ((10, 3), "fp16"), ((12, 0), "tf32")])
def test_no_peak_for_the_precision(cc: tuple[int, int], precision: str) -> None:
    assert peak_flops(*cc, 100, 1e9, precision) is None


def test_every_precision_of_a_tensor_core_gpu_is_at_least_its_fp32_peak() -> None:
    """Tensor-core formats never fall below the CUDA cores' FP32 (a TF32 kernel measured against
    less than what FP32 FMAs give would read above 100 %)."""
    for cc in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0)):
        fp32 = peak_flops(*cc, 1, 1e9, "fp32")
        assert all(peak_flops(*cc, 1, 1e9, p) > fp32 for p in ("tf32", "fp16", "bf16", "int8"))


@pytest.mark.parametrize("cc, dtype", [((7, 0), "float32"), ((7, 0), "bfloat16"), ((7, 5), "tf32"),
                                       ((8, 0), "fp8"), ((8, 6), "fp8"), ((6, 1), "float16"),
                                       ((12, 0), "float16")])
def test_no_tensor_cores_for_the_type(cc: tuple[int, int], dtype: str) -> None:
    assert tensor_peak_flops(*cc, 100, 1e9, dtype) is None


def test_float32_means_tf32_and_bad_names_are_refused() -> None:
    assert tensor_peak_flops(9, 0, 132, 1.98e9, "float32") == tensor_peak_flops(9, 0, 132, 1.98e9, "tf32")
    assert tensor_peak_flops(9, 0, 132, 1.98e9, "float16") == tensor_peak_flops(9, 0, 132, 1.98e9, "bfloat16")
    assert set(DTYPES) >= {"float32", "tf32", "float16", "bfloat16", "fp8"}
    assert [dtype_precision(d) for d in DTYPES] == ["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8"]
    assert dtype_precision("float32", tensor_cores=True) == "tf32"
    with pytest.raises(TraceqError, match="unknown data type 'double'"):
        tensor_peak_flops(9, 0, 132, 1.98e9, "double")
    with pytest.raises(TraceqError, match="unknown precision 'fp4'"):
        peak_flops(9, 0, 132, 1.98e9, "fp4")
    with pytest.raises(TraceqError, match="1.0 is not in"):
        fp32_peak_flops(1, 0, 1, 1e9)


def test_the_sample_traces_h200(sample_store) -> None:
    """The reference H200: CC 9.0, 132 SMs, the trace records the 1.98 GHz maximum SM clock."""
    peaks = trace_peaks(sample_store, trace_id(sample_store, "alexnet_b256_cudnn"))
    assert peaks.select("device_id", "name", "cc", "sm_count", "clock_hz").rows() == [
        (0, "NVIDIA H200", "9.0", 132, 1_980_000_000)]
    assert close(peaks["peak_fp32"][0], 66.9 * T, 0.001)  # datasheet: 67 TFLOPS
    assert peaks["peak_tf32"][0] == 2048 * 132 * 1.98e9  # TF32 at 1.98 GHz: 535 TF
    assert close(peaks["peak_tf32"][0] * 1.83 / 1.98, 494.7 * T)  # the datasheet's clock
    assert peaks.columns[5:] == [f"peak_{p}" for p in PRECISIONS] and peaks.row(0)[5:] == tuple(
        peak_flops(9, 0, 132, 1.98e9, p) for p in PRECISIONS)
