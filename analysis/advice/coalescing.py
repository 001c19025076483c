"""The uncoalesced-access finding: kernels whose global loads and stores touched many more L2
sectors than the same accesses would need coalesced, as Nsight Compute measured them (its
SourceCounters metrics, joined with `traceq load --ncu REPORT --into TRACE`).

A warp's 32 loads of 4 bytes at consecutive addresses need 4 sectors of 32 bytes; the same loads
at a stride touch up to 32. ncu counts per kernel the sectors its global accesses asked for
(`memory_l2_theoretical_sectors_global`) and the ideal of the same accesses
(`..._ideal`). The time at stake is ncu's own estimate (its UncoalescedGlobalAccess rule): the
kernel's time times the share of its sectors that were excess, times the share of its time the
L2 was active; for a kernel name, the mean over its measured launches (weighted by the trace's
durations) applied to all of its time in the trace. Communication kernels are left out.
"""

from __future__ import annotations

import polars as pl

from traceq.analysis.advice import Finding
from traceq.analysis.advice.catalogue import is_communication
from traceq.units import format_count, format_duration

EXCESS_SHARE = 0.25
"""A kernel name is named when at least this share of its measured global sectors were excess."""

_NEEDED = ("global_sectors", "global_sectors_ideal", "l2_cycles_active", "l2_cycles_elapsed")


def uncoalesced_access(facts: object) -> list[Finding]:
    """Kernels with uncoalesced global accesses (see the module's docstring): one finding, its time
    at stake the sum over the kernel names at or above EXCESS_SHARE."""
    from traceq.analysis.efficiency.ncu_columns import ncu_launches

    measured = ncu_launches(facts.con, facts.trace_id)
    if measured is None or any(c not in measured.columns for c in _NEEDED):
        return []
    measured = measured.filter(pl.col("global_sectors") > 0, pl.col("global_sectors_ideal").is_not_null(),
                               pl.col("l2_cycles_elapsed") > 0, pl.col("dur_ns") > 0)
    if measured.is_empty():
        return []
    names = facts.con.sql(f"SELECT kernel_id, name FROM kernel_rows WHERE trace_id = {int(facts.trace_id)}").pl()
    excess = ((pl.col("global_sectors") - pl.col("global_sectors_ideal")).clip(lower_bound=0)
              / pl.col("global_sectors"))
    active = (pl.col("l2_cycles_active") / pl.col("l2_cycles_elapsed")).clip(upper_bound=1.0)
    weight = pl.col("dur_ns")
    per_name = (measured.join(names, on="kernel_id").with_columns(excess=excess, active=active)
                .group_by("name").agg(
                    measured=pl.len(), sectors=pl.col("global_sectors").sum(),
                    ideal=pl.col("global_sectors_ideal").sum(),
                    excess=(pl.col("excess") * weight).sum() / weight.sum(),
                    share=(pl.col("excess") * pl.col("active") * weight).sum() / weight.sum()))
    kernels = (facts.classified.join(per_name, on="name").filter(~is_communication(facts))
               .filter(pl.col("excess") >= EXCESS_SHARE)
               .with_columns(stake=pl.col("share") * pl.col("total_ns")).sort("stake", descending=True))
    if kernels.is_empty():
        return []
    stake = float(kernels["stake"].sum())
    top = "; ".join(_evidence(row) for row in kernels.head(3).iter_rows(named=True))
    more = f"; +{kernels.height - 3} more" if kernels.height > 3 else ""
    evidence = (f"{top}{more} (Nsight Compute's global sectors against the ideal of the same accesses, "
                f"{int(kernels['measured'].sum()):,} measured launches; at stake: the excess sectors' share of "
                "each kernel's time while the L2 was active)")
    fix = ("Make consecutive threads touch consecutive addresses: give element-wise and reduction kernels "
           "contiguous inputs (.contiguous() once, outside the loop, or the layout the consumer reads) instead "
           "of transposed or strided views; gather and scatter in sorted index order; in a custom kernel, "
           "transpose through shared memory and use 16-byte vector loads")
    return [Finding("uncoalesced_access", "Uncoalesced global memory access", stake, evidence, fix)]


def _evidence(row: dict[str, object]) -> str:
    label = str(row.get("label") or row["name"])
    label = label if len(label) <= 64 else label[:63] + "…"
    return (f"{label}: {100 * row['excess']:.0f} % of its global-memory sectors were excess "
            f"({format_count(row['sectors'])} asked for, {format_count(row['ideal'])} coalesced), "
            f"{format_duration(row['total_ns'])} in {row['launches']:,} launches")


__all__ = ["EXCESS_SHARE", "uncoalesced_access"]
