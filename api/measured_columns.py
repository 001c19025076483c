"""The measured columns `Trace.ru` and `Trace.ce` add beside traceq's theory: Nsight Compute's,
where a report is joined to the trace (`traceq load --ncu`), and nsys's GPU metrics, where the
trace recorded them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from traceq.analysis.choices import GroupBy

if TYPE_CHECKING:
    import polars as pl

    from traceq.api.trace import Trace


def with_ncu_ru(trace: Trace, frame: pl.DataFrame, by: GroupBy, iteration_regex: str | None) -> pl.DataFrame:
    """`ru`'s frame with Nsight Compute's achieved occupancy beside it, when the trace has a
    report joined."""
    from traceq.analysis.efficiency.ncu import has_ncu

    if not has_ncu(trace.con, trace.id):
        return frame
    from traceq.analysis.efficiency.ncu_columns import ncu_ru_columns
    from traceq.analysis.efficiency.ru import _KEYS

    kernels = (trace.con.sql(f"SELECT kernel_id, name FROM kernels WHERE trace_id = {int(trace.id)}").pl()
               if by is GroupBy.kernel else trace._attributed(iteration_regex))
    return ncu_ru_columns(trace.con, trace.id, frame, _KEYS[by], kernels)


def with_ncu_ce(trace: Trace, frame: pl.DataFrame, by: GroupBy, per_kernel: pl.DataFrame) -> pl.DataFrame:
    """`ce`'s frame with Nsight Compute's SM and tensor-pipe throughput beside it, when the trace
    has a report joined."""
    from traceq.analysis.efficiency.ncu import has_ncu

    if not has_ncu(trace.con, trace.id):
        return frame
    from traceq.analysis.efficiency.ncu_columns import ncu_ce_columns
    from traceq.analysis.efficiency.ru import _KEYS

    return ncu_ce_columns(trace.con, trace.id, frame, _KEYS[by], per_kernel)


def with_measured(trace: Trace, frame: pl.DataFrame, by: GroupBy, kernels: Callable[[], pl.DataFrame]
                  ) -> pl.DataFrame:
    """`frame` (one row per `by` group) with the GPU metrics measured over its kernels
    (`analysis.efficiency.measured`: sm_active_pct, tensor_active_pct, dram_gbps, dram_pct)
    where the trace has them (without them the frame is as it was: `traceq gpumetrics` says in one
    line how to record them; a note on every `ru` and `ce` of every other trace would be noise)."""
    from traceq.analysis.efficiency.measured import has_metrics, kernel_integrals
    from traceq.analysis.efficiency.measured import with_measured as joined
    from traceq.analysis.efficiency.ru import _KEYS

    if not has_metrics(trace.con, trace.id):
        return frame
    integrals = trace._keep("measured", (), lambda: kernel_integrals(trace.con, trace.id))
    return joined(frame, kernels(), integrals, _KEYS[GroupBy(by)])
