"""The groupings analyses offer, as enums light enough for the CLI to import at start-up.

The CLI builds its option types from these before it knows which command runs; the analyses
that use them import polars, which would cost `traceq top` more than its whole query.
"""

from __future__ import annotations

from enum import Enum


class NameBy(str, Enum):
    """Which kernel name to group by."""

    demangled = "demangled"
    short = "short"
    mangled = "mangled"


class GroupBy(str, Enum):
    """What `traceq ru` and `traceq ce` group launches by."""

    kernel = "kernel"
    layer = "layer"
    library = "library"


class Precision(str, Enum):
    """The number format a kernel's arithmetic runs in: what `traceq ce` measures it against
    (`analysis.efficiency.peaks`), and the `[[precision]]` answers of the kernel rules."""

    fp64 = "fp64"
    fp32 = "fp32"
    tf32 = "tf32"
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"
    int8 = "int8"


PRECISIONS = tuple(p.value for p in Precision)


class CompareBy(str, Enum):
    """What `traceq compare` lines two traces up by."""

    layer = "layer"
    kernel = "kernel"
    library = "library"
    stage = "stage"


class MemoryBy(str, Enum):
    """What `traceq memory` lists: allocations per layer, or bytes in use after each event."""

    layer = "layer"
    time = "time"


class TrafficBy(str, Enum):
    """What `traceq traffic` lists: one row per layer and pass, or per kernel name."""

    layer = "layer"
    kernel = "kernel"


class IdleBy(str, Enum):
    """What `traceq idle` splits the GPU's idle time by, beside its cause."""

    iteration = "iteration"
    stream = "stream"
    layer = "layer"


class CriticalView(str, Enum):
    """What `traceq critical` and `traceq whatif` show of the critical path."""

    iterations = "iterations"
    composition = "composition"
    layers = "layers"
    longest = "longest"
    segments = "segments"


class StatsReport(str, Enum):
    """The `nsys stats` reports `traceq stats` reproduces."""

    cuda_api_sum = "cuda_api_sum"
    cuda_gpu_kern_sum = "cuda_gpu_kern_sum"
    cuda_gpu_mem_time_sum = "cuda_gpu_mem_time_sum"
    cuda_gpu_mem_size_sum = "cuda_gpu_mem_size_sum"
    nvtx_sum = "nvtx_sum"
    nvtx_gpu_proj_sum = "nvtx_gpu_proj_sum"
    cuda_kern_exec_sum = "cuda_kern_exec_sum"


class ExportFormat(str, Enum):
    """What `traceq export` writes: Chrome trace events, which Perfetto opens."""

    perfetto = "perfetto"


class CommBy(str, Enum):
    """What `traceq comm` lists: per collective, iteration and rank, or per collective instance."""

    rank = "rank"
    instance = "instance"


class RanksBy(str, Enum):
    """What `traceq ranks` lists: per iteration and rank, or the collectives that started late."""

    iteration = "iteration"
    collective = "collective"
