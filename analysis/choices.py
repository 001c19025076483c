"""The groupings analyses offer, as enums light enough for the CLI to import at start-up.

The CLI builds its option types from these before it knows which command runs; the analyses
that use them import polars, which would cost `traceq top` more than its whole query.
"""

from __future__ import annotations

from enum import Enum

from traceq.errors import OptionError


class Choice(str, Enum):
    """An option's choices: a value that is none of them raises OptionError (a TraceqError, one
    line naming the choices), as the API's docs promise, instead of the enum's bare ValueError."""

    @classmethod
    def _missing_(cls, value: object) -> Choice:
        choices = ", ".join(repr(m.value) for m in cls)
        raise OptionError(f"{value!r} is not a valid {_words(cls.__name__)}: choose one of {choices}")


def _words(name: str) -> str:
    """'CompareBy' -> 'compare by', 'StatsReport' -> 'stats report'."""
    import re

    return re.sub(r"(?<!^)(?=[A-Z])", " ", name).lower()


class NameBy(Choice):
    """Which kernel name to group by."""

    demangled = "demangled"
    short = "short"
    mangled = "mangled"


class GroupBy(Choice):
    """What `traceq ru` and `traceq ce` group launches by."""

    kernel = "kernel"
    layer = "layer"
    library = "library"


class Precision(Choice):
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


class CompareBy(Choice):
    """What `traceq compare` lines two traces up by."""

    layer = "layer"
    kernel = "kernel"
    library = "library"
    stage = "stage"


class MemoryBy(Choice):
    """What `traceq memory` lists: allocations per layer, or bytes in use after each event."""

    layer = "layer"
    time = "time"


class TrafficBy(Choice):
    """What `traceq traffic` lists: one row per layer and pass, or per kernel name."""

    layer = "layer"
    kernel = "kernel"


class MeasuredBy(Choice):
    """What a row of `traceq gpumetrics` is."""

    iteration = "iteration"
    layer = "layer"
    kernel = "kernel"
    library = "library"


class IdleBy(Choice):
    """What `traceq idle` splits the GPU's idle time by, beside its cause."""

    iteration = "iteration"
    stream = "stream"
    layer = "layer"


class CriticalView(Choice):
    """What `traceq critical` and `traceq whatif` show of the critical path."""

    iterations = "iterations"
    composition = "composition"
    layers = "layers"
    longest = "longest"
    segments = "segments"


class StatsReport(Choice):
    """The `nsys stats` reports `traceq stats` reproduces."""

    cuda_api_sum = "cuda_api_sum"
    cuda_gpu_kern_sum = "cuda_gpu_kern_sum"
    cuda_gpu_mem_time_sum = "cuda_gpu_mem_time_sum"
    cuda_gpu_mem_size_sum = "cuda_gpu_mem_size_sum"
    nvtx_sum = "nvtx_sum"
    nvtx_gpu_proj_sum = "nvtx_gpu_proj_sum"
    cuda_kern_exec_sum = "cuda_kern_exec_sum"


class ExportFormat(Choice):
    """What `traceq export` writes: Chrome trace events, which Perfetto opens."""

    perfetto = "perfetto"


class CommBy(Choice):
    """What `traceq comm` lists: per collective, iteration and rank, or per collective instance."""

    rank = "rank"
    instance = "instance"


class RanksBy(Choice):
    """What `traceq ranks` lists: per iteration and rank, or the collectives that started late."""

    iteration = "iteration"
    collective = "collective"
