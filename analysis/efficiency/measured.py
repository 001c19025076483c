"""GPU activity measured by Nsight Systems' GPU metrics (`gpu_metrics`), integrated over each
kernel's time on its GPU: the measured columns beside `traceq ru`'s and `traceq ce`'s theory.

A sample holds from its time until the next sample of the same metric on the same GPU (nsys
samples at a fixed frequency; on the recorded H200 trace the sample at t describes [t, next t):
GR Active follows the GPU's kernel-busy share of that interval, correlation 0.99, against 0.91
for the interval before it). A kernel's measured value is the time-weighted mean of the
samples over [start, end); a group's (kernel name, layer and pass, library, iteration) is the
sum of its kernels' integrals over the sum of their covered time. Kernels that overlap on one
GPU (several streams) each see the whole GPU's activity: a group's value is what the GPU did
while the group's kernels ran.

Columns: sm_active_pct ('SMs Active': share of SMs with a warp resident), sm_issue_pct
('SM Issue'), tensor_active_pct ('Tensor Active': share of cycles the tensor pipes were busy),
dram_pct ('DRAM Read' + 'DRAM Write Bandwidth', both in % of the peak) and dram_gbps (dram_pct
of the GPU's DRAM bandwidth from its device record, GB/s; null where the trace gives none).
"""

from __future__ import annotations

import re

import duckdb
import polars as pl

METRICS = {
    "sm_active_pct": "^SMs? Active",
    "sm_issue_pct": "^SM Issue",
    "tensor_active_pct": "^Tensor (Active|Pipe)",
    "dram_read_pct": "^DRAM Read",
    "dram_write_pct": "^DRAM Write",
}
"""Each measured column and the nsys metric names it is read from (regular expressions)."""

SHOWN = ["sm_active_pct", "tensor_active_pct", "dram_gbps", "dram_pct"]
"""The measured columns `ru` and `ce` add."""

NO_METRICS = ("no GPU metrics in this trace: measured SM, tensor and DRAM activity need an nsys trace recorded "
              "with --gpu-metrics-devices=all")


def has_metrics(con: duckdb.DuckDBPyConnection, trace_id: int) -> bool:
    """Whether the trace holds GPU metric samples (a dataset written before they were read has none)."""
    try:
        return bool(con.execute("SELECT 1 FROM gpu_metrics WHERE trace_id = ? LIMIT 1", [trace_id]).fetchall())
    except duckdb.CatalogException:
        return False


def metric_names(con: duckdb.DuckDBPyConnection, trace_id: int) -> dict[str, str]:
    """Per measured column (METRICS), the trace's metric it is read from (the first by name)."""
    names = [r[0] for r in con.execute(
        "SELECT DISTINCT metric FROM gpu_metrics WHERE trace_id = ? ORDER BY metric", [trace_id]).fetchall()]
    out = {}
    for column, pattern in METRICS.items():
        found = [n for n in names if re.search(pattern, n)]
        if found:
            out[column] = found[0]
    return out


def kernel_integrals(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """Every kernel's integral of each measured metric over its time (ASOF joins on a running
    sum of the samples: linear in kernels and samples).

    Columns: kernel_id, covered_ns (the kernel's time within the samples' span), then per
    METRICS column found in the trace, `<column>_ns` (percent x ns), and dram_bytes (null
    without the GPU's bandwidth or DRAM metrics). Empty when the trace has no samples.
    """
    names = metric_names(con, trace_id)
    if not names:
        return pl.DataFrame(schema={"kernel_id": pl.Int64, "covered_ns": pl.Float64})
    wanted = pl.DataFrame({"mcol": list(names), "metric": list(names.values())})
    con.register("_traceq_wanted_metrics", wanted.to_arrow())
    try:
        rows = con.sql(f"""
            WITH s AS (
                SELECT m.device_id, w.mcol, m.ts_ns, m.value,
                       lead(m.ts_ns) OVER (PARTITION BY m.device_id, w.mcol ORDER BY m.ts_ns) AS next_ns
                FROM gpu_metrics m JOIN _traceq_wanted_metrics w ON w.metric = m.metric
                WHERE m.trace_id = {int(trace_id)}),
            c AS (
                SELECT device_id, mcol, ts_ns, next_ns, value,
                       coalesce(sum(value * (next_ns - ts_ns)) OVER (
                           PARTITION BY device_id, mcol ORDER BY ts_ns
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before,
                       min(ts_ns) OVER (PARTITION BY device_id, mcol) AS first_ns
                FROM s WHERE next_ns IS NOT NULL),
            k AS (
                SELECT k.kernel_id, k.device_id, k.start_ns, k.end_ns, w.mcol
                FROM kernels k, (SELECT DISTINCT mcol FROM _traceq_wanted_metrics) w
                WHERE k.trace_id = {int(trace_id)}),
            at_start AS (
                SELECT k.*, coalesce(c.before + c.value * (least(k.start_ns, c.next_ns) - c.ts_ns), 0) AS f0,
                       coalesce(least(k.start_ns, c.next_ns) - c.first_ns, 0) AS g0
                FROM k ASOF LEFT JOIN c ON c.device_id = k.device_id AND c.mcol = k.mcol
                                          AND k.start_ns >= c.ts_ns),
            both_ends AS (
                SELECT a.kernel_id, a.mcol, a.f0, a.g0,
                       coalesce(c.before + c.value * (least(a.end_ns, c.next_ns) - c.ts_ns), 0) AS f1,
                       coalesce(least(a.end_ns, c.next_ns) - c.first_ns, 0) AS g1
                FROM at_start a ASOF LEFT JOIN c ON c.device_id = a.device_id AND c.mcol = a.mcol
                                                   AND a.end_ns >= c.ts_ns)
            SELECT kernel_id, mcol, (f1 - f0)::DOUBLE AS integral, (g1 - g0)::DOUBLE AS covered
            FROM both_ends
        """).pl()
    finally:
        con.unregister("_traceq_wanted_metrics")
    wide = rows.pivot(on="mcol", index="kernel_id", values="integral")
    # a metric no kernel met (no kernels at all, say) is still a column, of nulls
    wide = wide.with_columns(pl.lit(None, pl.Float64).alias(c) for c in names if c not in wide.columns)
    wide = wide.rename({c: f"{c}_ns" for c in names})
    covered = rows.group_by("kernel_id").agg(covered_ns=pl.col("covered").max())
    wide = covered.join(wide, on="kernel_id", how="left")
    bandwidth = _bandwidth(con, trace_id)
    if {"dram_read_pct", "dram_write_pct"} <= set(names) and bandwidth is not None:
        device = con.sql("SELECT kernel_id, device_id FROM kernels WHERE trace_id = $t", params={"t": trace_id}).pl()
        wide = (wide.join(device, on="kernel_id", how="left").join(bandwidth, on="device_id", how="left")
                .with_columns(dram_bytes=(pl.col("dram_read_pct_ns") + pl.col("dram_write_pct_ns")) / 100
                              * pl.col("bytes_per_s") * 1e-9)
                .drop("device_id", "bytes_per_s"))
    return wide.with_columns(pl.col("kernel_id").cast(pl.Int64)).sort("kernel_id")


def _bandwidth(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame | None:
    """device_id, bytes_per_s: each GPU's DRAM bandwidth from the trace's device records."""
    frame = con.sql(
        "SELECT device_id, max(memory_bandwidth_bytes_per_s)::DOUBLE AS bytes_per_s FROM gpus "
        "WHERE trace_id = $t AND memory_bandwidth_bytes_per_s > 0 GROUP BY device_id", params={"t": trace_id}).pl()
    return None if frame.is_empty() else frame


def grouped(kernels: pl.DataFrame, integrals: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """The measured columns (SHOWN, and sm_issue_pct) per group of `kernels` (kernel_id and
    `keys`): each metric's integral over the group's kernels over their covered time."""
    have = [c for c in METRICS if f"{c}_ns" in integrals.columns]
    k = kernels.select("kernel_id", *keys).join(integrals, on="kernel_id", how="inner")
    covered = pl.col("covered_ns").sum()
    aggs = [(pl.col(f"{c}_ns").sum() / covered).alias(c) for c in have]
    if "dram_bytes" in integrals.columns:
        aggs.append((pl.col("dram_bytes").sum() / covered).alias("dram_gbps"))  # bytes per ns = GB/s
    frame = (k.group_by(keys).agg(covered.alias("covered_ns"), *aggs)
             .filter(pl.col("covered_ns") > 0))
    if {"dram_read_pct", "dram_write_pct"} <= set(have):
        frame = frame.with_columns(dram_pct=pl.col("dram_read_pct") + pl.col("dram_write_pct"))
    for column in [*SHOWN, "sm_issue_pct"]:
        if column not in frame.columns:
            frame = frame.with_columns(pl.lit(None, pl.Float64).alias(column))
    return frame.select(*keys, *SHOWN, "sm_issue_pct")


def with_measured(frame: pl.DataFrame, kernels: pl.DataFrame, integrals: pl.DataFrame,
                  keys: list[str]) -> pl.DataFrame:
    """`frame` (one row per `keys`) with the SHOWN measured columns of its groups appended."""
    measured = grouped(kernels, integrals, keys).drop("sm_issue_pct")
    return frame.join(measured, on=keys, how="left", nulls_equal=True)


MEASURED_KEYS = {"iteration": ["iteration"], "layer": ["layer", "pass"], "kernel": ["name"], "library": ["library"]}


def measured_table(con: duckdb.DuckDBPyConnection, trace_id: int, kernels: pl.DataFrame,
                   by: str = "iteration") -> pl.DataFrame:
    """The GPU metrics measured over each iteration's, layer's, kernel name's or library's
    kernels (`kernels`: the trace's `layers.attributed_kernels`), most time first.

    Columns: the keys (iteration | layer, pass | name | library), kernels, total_ns,
    sampled_pct (share of total_ns the samples cover), sm_active_pct, sm_issue_pct,
    tensor_active_pct, dram_gbps, dram_pct; iterations in time order, other groups most time
    first. Raises MissingDataError without samples.
    """
    from traceq.errors import MissingDataError

    if not has_metrics(con, trace_id):
        raise MissingDataError(NO_METRICS)
    keys = MEASURED_KEYS[str(getattr(by, "value", by))]
    integrals = kernel_integrals(con, trace_id)
    sizes = kernels.join(integrals.select("kernel_id", "covered_ns"), on="kernel_id", how="left").group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("kernels"), pl.col("dur_ns").sum().cast(pl.Int64).alias("total_ns"),
        pl.col("covered_ns").sum().alias("covered_ns"), pl.col("start_ns").min().alias("first_ns"))
    frame = sizes.join(grouped(kernels, integrals, keys), on=keys, how="left", nulls_equal=True)
    return (frame.with_columns(sampled_pct=pl.when(pl.col("total_ns") > 0)
                               .then(100 * pl.col("covered_ns") / pl.col("total_ns")))
            .sort(["first_ns"] if keys == ["iteration"] else ["total_ns", *keys],
                  descending=[False] if keys == ["iteration"] else [True] + [False] * len(keys), nulls_last=True)
            .select(*keys, "kernels", "total_ns", "sampled_pct", "sm_active_pct", "sm_issue_pct",
                    "tensor_active_pct", "dram_gbps", "dram_pct"))
