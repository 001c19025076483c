"""Launch overhead: how long each kernel's launch call took on the CPU, how long the kernel then
queued, and how long it ran (the `traceq launches` analysis and `nsys stats`'
cuda_kern_exec_sum).

As NVIDIA's report defines them, per kernel joined to the API call that launched it: API time =
the call's duration; queue time = kernel start - call end, counted only where positive (the
kernel may start before the call returns); kernel time = the kernel's duration; total = from
the call's start to the later of the call's and the kernel's ends. A kernel is *tiny* when it
ran shorter than its launch call took: the CPU cannot keep the GPU busy with such kernels.
Kernels replayed from a CUDA graph share the one `cudaGraphLaunch` call and are never tiny.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.operations import BATCH_ROWS, gpu_work_sql, with_calls
from traceq.store import first_row
from traceq.ingest.launches import LAUNCH_COLUMNS


def _launched(con: duckdb.DuckDBPyConnection, trace_id: int, work: pl.DataFrame | None = None
              ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(kernels, api_names): every kernel that has its launch call in the trace with pid, tid,
    device_id, name_id, graph (launched from a graph), api_ns, queue_ns (null unless > 0),
    kernel_ns, total_ns, call_name_id; the API names by name_id. `work`: the trace's
    `operations.gpu_work` ops, when the caller has them (its kernels are these)."""
    from traceq.analysis.graphs import has_graph_nodes

    t = int(trace_id)
    # gpu_work carries graph nodes only where the trace describes them: else ask the kernels
    if work is not None and (has_graph_nodes(con, t) or not first_row(
            con, f"SELECT 1 FROM kernel_events WHERE trace_id = {t} AND graph_node_id IS NOT NULL LIMIT 1")):
        kernels = work.filter(pl.col("kind") == 0).select(
            "pid", "device_id", name_id=pl.col("item").cast(pl.Int32), graph=pl.col("graph_node_id").is_not_null(),
            tid="tid", call_start_ns="call_start_ns", call_end_ns="call_end_ns", call_name_id="call_name_id",
            start_ns="start_ns", end_ns="end_ns").filter(pl.col("call_start_ns").is_not_null())
    else:
        kernels = con.sql(f"""
            SELECT q.pid, q.device_id, e.name_id, e.correlation_id, e.start_ns, e.end_ns,
                   e.graph_node_id IS NOT NULL AS graph, {', '.join('e.' + c for c in LAUNCH_COLUMNS)}
            FROM kernel_events e JOIN kernel_queues q ON q.trace_id = e.trace_id AND q.queue_id = e.queue_id
            WHERE e.trace_id = {t}""").pl(BATCH_ROWS)
        kernels = with_calls(con, t, kernels).filter(pl.col("call_start_ns").is_not_null())
    queue = pl.col("start_ns") - pl.col("call_end_ns")
    kernels = kernels.select(
        "pid", "tid", "device_id", "name_id", "graph", "call_name_id",
        api_ns=pl.col("call_end_ns") - pl.col("call_start_ns"),
        queue_ns=pl.when(queue >= 0).then(queue),
        kernel_ns=pl.col("end_ns") - pl.col("start_ns"),
        total_ns=pl.max_horizontal("call_end_ns", "end_ns") - pl.col("call_start_ns"))
    names = con.sql(f"SELECT name_id, name FROM api_names WHERE trace_id = {t}").pl()
    return kernels, names


def kern_exec_sum(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """`nsys stats --report cuda_kern_exec_sum`: one row per launching process and thread,
    device, API and kernel name, by mean total time.

    Columns: pid, tid, device_id, count, queued (launches with a positive queue time, those the
    queue statistics cover), then avg, median, min, max and stddev (sample) of total, API, queue
    and kernel time (`total_avg_ns` ... `kernel_stddev_ns`), api_name (nsys's spelling, see
    `stats.api_name`), kernel_name. Aggregated in DuckDB where the kernels lie
    (`operations.gpu_work_sql`): ten million launches never reach Polars.
    """
    from traceq.analysis.stats import api_name, statistics

    t = int(trace_id)
    with gpu_work_sql(con, t) as work:
        return con.sql(f"""
            SELECT s.* EXCLUDE (call_name_id, name_id), {api_name('a.name')} AS api_name, k.name AS kernel_name
            FROM (SELECT pid, tid, device_id, call_name_id, name_id, count(*) AS count, count(queue_ns) AS queued,
                         {statistics('total_ns', 'ns', 'total_')}, {statistics('api_ns', 'ns', 'api_')},
                         {statistics('queue_ns', 'ns', 'queue_')}, {statistics('kernel_ns', 'ns', 'kernel_')}
                  FROM (SELECT pid, tid, device_id, call_name_id, item AS name_id,
                               call_end_ns - call_start_ns AS api_ns,
                               CASE WHEN start_ns >= call_end_ns THEN start_ns - call_end_ns END AS queue_ns,
                               end_ns - start_ns AS kernel_ns,
                               greatest(call_end_ns, end_ns) - call_start_ns AS total_ns
                        FROM {work} WHERE kind = 0 AND call_start_ns IS NOT NULL)
                  GROUP BY pid, tid, device_id, call_name_id, name_id) s
            LEFT JOIN api_names a ON a.trace_id = {t} AND a.name_id = s.call_name_id
            LEFT JOIN kernel_names k ON k.trace_id = {t} AND k.name_id = s.name_id
            ORDER BY total_avg_ns DESC, kernel_name""").pl()


def launch_table(con: duckdb.DuckDBPyConnection, trace_id: int, work: pl.DataFrame | None = None
                 ) -> tuple[pl.DataFrame, dict[str, float]]:
    """Launch cost per kernel name, most API time first, and the trace's totals.

    Columns: launches, api_ns (total time in launch calls), api_avg_ns, queue_avg_ns (over
    launches that queued), kernel_ns (total kernel time), kernel_avg_ns, tiny (launches whose
    kernel ran shorter than its launch call), tiny_pct (% of the name's launches), name.
    Totals: launches, api_ns, kernel_ns, tiny (tiny launches), tiny_pct (% of launches),
    tiny_kernel_ns (their kernel time), graph (kernels replayed from CUDA graphs). `work`: the
    trace's `operations.gpu_work` ops, when the caller has them already.
    """
    kernels, _ = _launched(con, trace_id, work)
    kernels = kernels.with_columns(tiny=~pl.col("graph") & (pl.col("kernel_ns") < pl.col("api_ns")))
    table = (kernels.group_by("name_id")
             .agg(pl.len().cast(pl.Int64).alias("launches"), pl.col("api_ns").sum().alias("api_ns"),
                  pl.col("api_ns").mean().alias("api_avg_ns"), pl.col("queue_ns").mean().alias("queue_avg_ns"),
                  pl.col("kernel_ns").sum().alias("kernel_ns"), pl.col("kernel_ns").mean().alias("kernel_avg_ns"),
                  pl.col("tiny").sum().cast(pl.Int64).alias("tiny"))
             .with_columns(tiny_pct=100.0 * pl.col("tiny") / pl.col("launches")))
    names = con.sql(f"SELECT name_id, name FROM kernel_names WHERE trace_id = {int(trace_id)}").pl()
    table = (table.join(names, on="name_id", how="left")
             .sort(["api_ns", "name"], descending=[True, False]).drop("name_id"))
    n = kernels.height
    tiny = int(kernels["tiny"].sum())
    totals = {"launches": n, "api_ns": int(kernels["api_ns"].sum()), "kernel_ns": int(kernels["kernel_ns"].sum()),
              "tiny": tiny, "tiny_pct": 100.0 * tiny / n if n else 0.0,
              "tiny_kernel_ns": int(kernels.filter("tiny")["kernel_ns"].sum()), "graph": int(kernels["graph"].sum())}
    return table, totals
