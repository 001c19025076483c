"""Kernel time rankings: the `traceq top` analyses.

Pure functions from the store to Polars DataFrames; times in integer nanoseconds (averages,
medians and standard deviations as floats), the way `nsys stats --report cuda_gpu_kern_sum`
computes them: median interpolated between the two middle values, sample standard deviation.

The per-name statistics are computed once, when a trace is loaded (`build_kernel_summary` writes
the kernel_summary table), so ranking a trace of ten million launches reads a few hundred rows.
Each ranking also comes as a DuckDB relation (`*_relation`, the same rows before `.pl()`): the
CLI renders those directly, so that `traceq top` starts without importing polars.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb

from traceq.analysis.choices import NameBy
from traceq.store import first_row

if TYPE_CHECKING:
    import polars as pl


_NAME_COLUMN = {
    NameBy.demangled: "name",
    NameBy.short: "short_name",
    NameBy.mangled: "coalesce(mangled_name, name)",
}


def _statistics(pct: str) -> str:
    """The per-name statistics over launches with a `dur_ns` column; `pct` is the share's SQL."""
    return f"""
               count(*)::BIGINT AS instances,
               sum(dur_ns)::BIGINT AS total_ns,
               {pct} AS pct,
               avg(dur_ns)::DOUBLE AS avg_ns,
               quantile_cont(dur_ns, 0.5)::DOUBLE AS median_ns,
               min(dur_ns)::BIGINT AS min_ns,
               max(dur_ns)::BIGINT AS max_ns,
               coalesce(stddev_samp(dur_ns), 0)::DOUBLE AS stddev_ns"""


_STATISTICS = _statistics("100.0 * sum(dur_ns) / sum(sum(dur_ns)) OVER ()")


def _aggregate_sql(trace_id: int, by: NameBy) -> str:
    """The statistics aggregated from every launch of the trace (the expensive part: the median)."""
    return f"""
        SELECT {_NAME_COLUMN[NameBy(by)]} AS name, {_STATISTICS}
        FROM kernels WHERE trace_id = {int(trace_id)}
        GROUP BY 1
    """


def _statistics_sql(trace_id: int, by: NameBy, live: bool) -> str:
    """The rows the load wrote to kernel_summary, or with `live` the same aggregated again.
    (Every store traceq opens has kernel_summary: older stores are refused by their schema version.)"""
    if live:
        return _aggregate_sql(trace_id, by)
    return (f"SELECT * EXCLUDE (trace_id, name_by) FROM kernel_summary "
            f"WHERE trace_id = {int(trace_id)} AND name_by = '{NameBy(by).value}'")


def build_kernel_summary(con: duckdb.DuckDBPyConnection, trace_id: int) -> None:
    """Write the trace's kernel_summary rows: `kernel_statistics` for every NameBy. The load calls
    this once, in its transaction, after the kernels are in; `rm` deletes the rows with the trace.

    The launches are aggregated once per name id. Under each NameBy, a name that only one id has
    (every demangled and mangled name, nearly always) takes that id's row as it is; only the
    launches of names that several ids share (some short names) are aggregated again: the median
    cannot be merged from parts. On the 10M-kernel AlexNet, 4 % of the launches.
    """
    t = int(trace_id)
    con.execute(f"""
        CREATE TEMP TABLE _traceq_by_name_id AS
        SELECT name_id, {_STATISTICS}
        FROM (SELECT name_id, end_ns - start_ns AS dur_ns FROM kernel_events WHERE trace_id = {t})
        GROUP BY name_id""")
    try:
        for by in NameBy:
            con.execute(f"""
                INSERT INTO kernel_summary BY NAME
                WITH named AS (
                    SELECT name_id, {_NAME_COLUMN[by]} AS name, count(*) OVER (PARTITION BY {_NAME_COLUMN[by]}) AS ids
                    FROM kernel_names WHERE trace_id = {t}
                )
                SELECT {t} AS trace_id, '{by.value}' AS name_by, n.name, s.* EXCLUDE (name_id)
                FROM _traceq_by_name_id s JOIN named n USING (name_id) WHERE n.ids = 1
                UNION ALL BY NAME
                SELECT {t} AS trace_id, '{by.value}' AS name_by, name,
                       {_statistics("100.0 * sum(dur_ns) / (SELECT sum(total_ns) FROM _traceq_by_name_id)")}
                FROM (SELECT n.name, e.end_ns - e.start_ns AS dur_ns
                      FROM kernel_events e JOIN named n USING (name_id)
                      WHERE e.trace_id = {t} AND n.ids > 1)
                GROUP BY name
                ORDER BY name""")  # rows in one order whichever thread finishes first
    finally:
        con.execute("DROP TABLE _traceq_by_name_id")


def kernel_statistics(
    con: duckdb.DuckDBPyConnection, trace_id: int, by: NameBy = NameBy.demangled, *, live: bool = False
) -> pl.DataFrame:
    """Every kernel name of the trace with its statistics, by name.

    Columns: name, instances, total_ns, pct (share of all kernel time in the trace, %), avg_ns,
    median_ns, min_ns, max_ns, stddev_ns (sample; 0 for one instance). Read from kernel_summary,
    or with `live` aggregated from the launches in the kernels view (the same numbers, computed again).
    """
    return con.sql(f"SELECT * FROM ({_statistics_sql(trace_id, by, live)}) ORDER BY name").pl()


def top_kernels_relation(
    con: duckdb.DuckDBPyConnection, trace_id: int, k: int = 15, by: NameBy = NameBy.demangled
) -> duckdb.DuckDBPyRelation:
    """`top_kernels` as a DuckDB relation."""
    return con.sql(
        f"""
        SELECT CAST(row_number() OVER (ORDER BY total_ns DESC, name) AS INTEGER) AS rank,
               instances, total_ns, pct, avg_ns, median_ns, min_ns, max_ns, stddev_ns, name
        FROM ({_statistics_sql(trace_id, by, live=False)})
        ORDER BY rank
        LIMIT {int(k)}
        """
    )


def top_kernels(
    con: duckdb.DuckDBPyConnection, trace_id: int, k: int = 15, by: NameBy = NameBy.demangled
) -> pl.DataFrame:
    """Kernels grouped by name, heaviest total GPU time first.

    Columns: rank, instances, total_ns, pct (share of all kernel time in the trace, %),
    avg_ns, median_ns, min_ns, max_ns, stddev_ns (sample; 0 for one instance), name.
    Ties in total time are broken by name so the order is stable.
    """
    return top_kernels_relation(con, trace_id, k, by).pl()


def top_instances_relation(con: duckdb.DuckDBPyConnection, trace_id: int, k: int = 15) -> duckdb.DuckDBPyRelation:
    """`top_instances` as a DuckDB relation."""
    return con.sql(
        f"""
        SELECT CAST(row_number() OVER (ORDER BY dur_ns DESC, start_ns) AS INTEGER) AS rank, *
        FROM (  -- the k longest first: numbering every launch would sort them all
            SELECT start_ns, dur_ns, device_id, stream_id, grid_blocks, block_threads, kernel_id, name
            FROM kernels WHERE trace_id = {int(trace_id)}
            ORDER BY dur_ns DESC, start_ns
            LIMIT {int(k)}
        )
        ORDER BY rank
        """
    )


def top_instances(con: duckdb.DuckDBPyConnection, trace_id: int, k: int = 15) -> pl.DataFrame:
    """The k longest individual kernel launches (the shape of the paper's Table 3).

    Columns: rank, start_ns (on the trace's timeline), dur_ns, device_id, stream_id,
    grid_blocks, block_threads, kernel_id, name.
    """
    return top_instances_relation(con, trace_id, k).pl()


def kernel_time_total(con: duckdb.DuckDBPyConnection, trace_id: int) -> int:
    """Sum of all kernel durations in the trace, ns (from the load's per-name totals)."""
    total = "SELECT sum(total_ns) FROM kernel_summary WHERE trace_id = $t AND name_by = 'demangled'"
    return int(first_row(con, f"SELECT coalesce(({total}), 0)::BIGINT", {"t": trace_id})[0])
