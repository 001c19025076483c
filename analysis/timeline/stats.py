"""The `nsys stats` reports engineers know, from the store: `traceq stats --report NAME`.

Each report has the rows and numbers of NVIDIA's report script of the same name (Nsight
Systems 2025.3's `reports/*.py`), in traceq's column vocabulary (`total_ns`, `median_ns`, ...)
and in nsys's column order. Statistics as nsys computes them: the median interpolated between
the two middle values, the sample standard deviation (0 for one value), averages unrounded
(nsys rounds to 0.1 ns). docs/stats.md lists each report's columns beside nsys's and where ours
could differ.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import polars as pl

from traceq.analysis.timeline.summaries import api_name, statistics
from traceq.errors import MissingDataError

REPORTS = ("cuda_api_sum", "cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum", "nvtx_sum",
           "nvtx_gpu_proj_sum", "cuda_kern_exec_sum")
"""The reports `stats_report` knows, by their nsys names."""


def _share(total: str = "total_ns") -> str:
    return f"100.0 * {total} / sum({total}) OVER ()"


def cuda_api_sum(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """Every CUDA runtime and driver API function by total time: pct, total_ns, calls, avg_ns,
    median_ns, min_ns, max_ns, stddev_ns, name."""
    return con.sql(f"""
        SELECT {_share()} AS pct, total_ns, calls, avg_ns, median_ns, min_ns, max_ns, stddev_ns,
               {api_name('name')} AS name
        FROM (SELECT n.name, sum(e.end_ns - e.start_ns)::BIGINT AS total_ns, count(*)::BIGINT AS calls,
                     {statistics('e.end_ns - e.start_ns')}
              FROM api_events e JOIN api_names n ON n.trace_id = e.trace_id AND n.name_id = e.name_id
              WHERE e.trace_id = {int(trace_id)} GROUP BY e.name_id, n.name)
        ORDER BY total_ns DESC, name""").pl()


def cuda_gpu_kern_sum(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """Every kernel name by total time (`traceq top --no-context` without its rank): pct,
    total_ns, instances, avg_ns, median_ns, min_ns, max_ns, stddev_ns, name."""
    from traceq.analysis.kernels.top import top_kernels_relation

    return (top_kernels_relation(con, trace_id, 1 << 62).pl()
            .select("pct", "total_ns", "instances", "avg_ns", "median_ns", "min_ns", "max_ns", "stddev_ns", "name"))


_MEMOP_NAME = "CASE op WHEN 'memcpy' THEN '[CUDA memcpy ' || coalesce(copy_kind, 'Unknown') || ']' ELSE '[CUDA memset]' END"


def cuda_gpu_mem_time_sum(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """GPU memory operations by kind and time: pct, total_ns, count, avg_ns, median_ns, min_ns,
    max_ns, stddev_ns, operation ('[CUDA memcpy Host-to-Device]', '[CUDA memset]')."""
    return con.sql(f"""
        SELECT {_share()} AS pct, total_ns, count, avg_ns, median_ns, min_ns, max_ns, stddev_ns, operation
        FROM (SELECT {_MEMOP_NAME} AS operation, sum(dur_ns)::BIGINT AS total_ns, count(*)::BIGINT AS count,
                     {statistics('dur_ns')}
              FROM memops WHERE trace_id = {int(trace_id)} GROUP BY 1)
        ORDER BY total_ns DESC, operation""").pl()


def cuda_gpu_mem_size_sum(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """GPU memory operations by kind and bytes: total_bytes, count, avg_bytes, median_bytes,
    min_bytes, max_bytes, stddev_bytes, operation (nsys prints MB, 10^6 bytes)."""
    return con.sql(f"""
        SELECT total_bytes, count, avg_bytes, median_bytes, min_bytes, max_bytes, stddev_bytes, operation
        FROM (SELECT {_MEMOP_NAME} AS operation, sum(bytes)::BIGINT AS total_bytes, count(*)::BIGINT AS count,
                     {statistics('bytes', 'bytes')}
              FROM memops WHERE trace_id = {int(trace_id)} GROUP BY 1)
        ORDER BY total_bytes DESC, operation""").pl()


_RANGE_NAME = "coalesce(domain, '') || ':' || coalesce(name, '')"
_STYLE = "CASE kind WHEN 'pushpop' THEN 'PushPop' ELSE 'StartEnd' END"


def nvtx_sum(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """NVTX push/pop and start/end ranges by name (domain:name, as nsys) and total time: pct,
    total_ns, instances, avg_ns, median_ns, min_ns, max_ns, stddev_ns, style, range."""
    return con.sql(f"""
        SELECT {_share()} AS pct, total_ns, instances, avg_ns, median_ns, min_ns, max_ns, stddev_ns, style, range
        FROM (SELECT {_RANGE_NAME} AS range, {_STYLE} AS style, sum(dur_ns)::BIGINT AS total_ns,
                     count(*)::BIGINT AS instances, {statistics('dur_ns')}
              FROM nvtx WHERE trace_id = {int(trace_id)} AND kind IN ('pushpop', 'startend') AND end_ns IS NOT NULL
              GROUP BY 1, 2)
        ORDER BY total_ns DESC, range, style""").pl()


def nvtx_gpu_proj_sum(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """NVTX ranges projected onto the GPU work launched inside them (`analysis.timeline.projection`)."""
    from traceq.analysis.timeline.projection import projection_summary

    return projection_summary(con, trace_id)


def cuda_kern_exec_sum(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """Kernel launch and execution times per launching thread, device, API and kernel
    (`analysis.timeline.launches`)."""
    from traceq.analysis.timeline.launches import kern_exec_sum

    return kern_exec_sum(con, trace_id)


_BUILDERS: dict[str, Callable[[duckdb.DuckDBPyConnection, int], pl.DataFrame]] = {
    "cuda_api_sum": cuda_api_sum, "cuda_gpu_kern_sum": cuda_gpu_kern_sum,
    "cuda_gpu_mem_time_sum": cuda_gpu_mem_time_sum, "cuda_gpu_mem_size_sum": cuda_gpu_mem_size_sum,
    "nvtx_sum": nvtx_sum, "nvtx_gpu_proj_sum": nvtx_gpu_proj_sum, "cuda_kern_exec_sum": cuda_kern_exec_sum,
}


def stats_report(con: duckdb.DuckDBPyConnection, trace_id: int, report: str) -> pl.DataFrame:
    """The rows of the `nsys stats` report named `report` (one of REPORTS)."""
    if report not in _BUILDERS:
        raise MissingDataError(f"no report {report!r}: traceq has {', '.join(REPORTS)}")
    return _BUILDERS[report](con, trace_id)
