"""Kernel time rankings: the `traceq top` analyses.

Pure functions from the store to Polars DataFrames; times in integer nanoseconds (averages,
medians and standard deviations as floats), the way `nsys stats --report cuda_gpu_kern_sum`
computes them: median interpolated between the two middle values, sample standard deviation.
"""

from __future__ import annotations

from enum import Enum

import duckdb
import polars as pl


class NameBy(str, Enum):
    """Which kernel name to group by."""

    demangled = "demangled"
    short = "short"
    mangled = "mangled"


_NAME_COLUMN = {
    NameBy.demangled: "name",
    NameBy.short: "short_name",
    NameBy.mangled: "coalesce(mangled_name, name)",
}


def top_kernels(
    con: duckdb.DuckDBPyConnection, trace_id: int, k: int = 15, by: NameBy = NameBy.demangled
) -> pl.DataFrame:
    """Kernels grouped by name, heaviest total GPU time first.

    Columns: rank, instances, total_ns, pct (share of all kernel time in the trace, %),
    avg_ns, median_ns, min_ns, max_ns, stddev_ns (sample; 0 for one instance), name.
    Ties in total time are broken by name so the order is stable.
    """
    name = _NAME_COLUMN[NameBy(by)]
    return con.sql(
        f"""
        SELECT CAST(row_number() OVER (ORDER BY total_ns DESC, name) AS INTEGER) AS rank,
               instances, total_ns, pct, avg_ns, median_ns, min_ns, max_ns, stddev_ns, name
        FROM (
            SELECT {name} AS name,
                   count(*)::BIGINT AS instances,
                   sum(dur_ns)::BIGINT AS total_ns,
                   100.0 * sum(dur_ns) / sum(sum(dur_ns)) OVER () AS pct,
                   avg(dur_ns)::DOUBLE AS avg_ns,
                   quantile_cont(dur_ns, 0.5)::DOUBLE AS median_ns,
                   min(dur_ns)::BIGINT AS min_ns,
                   max(dur_ns)::BIGINT AS max_ns,
                   coalesce(stddev_samp(dur_ns), 0)::DOUBLE AS stddev_ns
            FROM kernels WHERE trace_id = {int(trace_id)}
            GROUP BY 1
        )
        ORDER BY rank
        LIMIT {int(k)}
        """
    ).pl()


def top_instances(con: duckdb.DuckDBPyConnection, trace_id: int, k: int = 15) -> pl.DataFrame:
    """The k longest individual kernel launches (the shape of the paper's Table 3).

    Columns: rank, start_ns (on the trace's timeline), dur_ns, device_id, stream_id,
    grid_blocks, block_threads, kernel_id, name.
    """
    return con.sql(
        f"""
        SELECT CAST(row_number() OVER (ORDER BY dur_ns DESC, start_ns) AS INTEGER) AS rank,
               start_ns, dur_ns, device_id, stream_id, grid_blocks, block_threads, kernel_id, name
        FROM kernels WHERE trace_id = {int(trace_id)}
        ORDER BY rank
        LIMIT {int(k)}
        """
    ).pl()


def kernel_time_total(con: duckdb.DuckDBPyConnection, trace_id: int) -> int:
    """Sum of all kernel durations in the trace, ns."""
    rows = con.execute("SELECT coalesce(sum(dur_ns), 0)::BIGINT FROM kernels WHERE trace_id = ?",
                       [trace_id]).fetchall()
    return int(rows[0][0])
