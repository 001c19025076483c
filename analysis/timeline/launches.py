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

from traceq.analysis.operations import gpu_work_sql

_LAUNCHED = """
    SELECT pid, tid, device_id, call_name_id, item AS name_id, graph_node_id IS NOT NULL AS graph,
           call_end_ns - call_start_ns AS api_ns,
           CASE WHEN start_ns >= call_end_ns THEN start_ns - call_end_ns END AS queue_ns,
           end_ns - start_ns AS kernel_ns, greatest(call_end_ns, end_ns) - call_start_ns AS total_ns
    FROM {work} WHERE kind = 0 AND call_start_ns IS NOT NULL"""
"""Every kernel that has its launch call in the trace, with its times as the module docstring
defines them (queue_ns null where the kernel started before its call returned), over
`operations.gpu_work_sql`'s relation."""


def kern_exec_sum(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """`nsys stats --report cuda_kern_exec_sum`: one row per launching process and thread,
    device, API and kernel name, by mean total time.

    Columns: pid, tid, device_id, count, queued (launches with a positive queue time, those the
    queue statistics cover), then avg, median, min, max and stddev (sample) of total, API, queue
    and kernel time (`total_avg_ns` ... `kernel_stddev_ns`), api_name (nsys's spelling, see
    `stats.api_name`), kernel_name. Aggregated in DuckDB where the kernels lie
    (`operations.gpu_work_sql`): ten million launches never reach Polars.
    """
    from traceq.analysis.timeline.summaries import api_name, statistics

    t = int(trace_id)
    with gpu_work_sql(con, t) as work:
        return con.sql(f"""
            SELECT s.* EXCLUDE (call_name_id, name_id), {api_name('a.name')} AS api_name, k.name AS kernel_name
            FROM (SELECT pid, tid, device_id, call_name_id, name_id, count(*) AS count, count(queue_ns) AS queued,
                         {statistics('total_ns', 'ns', 'total_')}, {statistics('api_ns', 'ns', 'api_')},
                         {statistics('queue_ns', 'ns', 'queue_')}, {statistics('kernel_ns', 'ns', 'kernel_')}
                  FROM ({_LAUNCHED.format(work=work)})
                  GROUP BY pid, tid, device_id, call_name_id, name_id) s
            LEFT JOIN api_names a ON a.trace_id = {t} AND a.name_id = s.call_name_id
            LEFT JOIN kernel_names k ON k.trace_id = {t} AND k.name_id = s.name_id
            ORDER BY total_avg_ns DESC, kernel_name""").pl()


def launch_table(con: duckdb.DuckDBPyConnection, trace_id: int) -> tuple[pl.DataFrame, dict[str, float]]:
    """Launch cost per kernel name, most API time first, and the trace's totals.

    Columns: launches, api_ns (total time in launch calls), api_avg_ns, queue_avg_ns (over
    launches that queued), kernel_ns (total kernel time), kernel_avg_ns, tiny (launches whose
    kernel ran shorter than its launch call), tiny_pct (% of the name's launches), name.
    Totals: launches, api_ns, kernel_ns, tiny (tiny launches), tiny_pct (% of launches),
    tiny_kernel_ns (their kernel time), graph (kernels replayed from CUDA graphs). Aggregated in
    DuckDB where the kernels lie, as `kern_exec_sum`.
    """
    t = int(trace_id)
    with gpu_work_sql(con, t) as work:
        table = con.sql(f"""
            SELECT g.launches, g.api_ns, g.api_avg_ns, g.queue_avg_ns, g.kernel_ns, g.kernel_avg_ns, g.tiny,
                   100.0::DOUBLE * g.tiny / g.launches AS tiny_pct, n.name, g.tiny_kernel_ns, g.graph
            FROM (SELECT name_id, count(*) AS launches, sum(api_ns)::BIGINT AS api_ns, avg(api_ns) AS api_avg_ns,
                         avg(queue_ns) AS queue_avg_ns, sum(kernel_ns)::BIGINT AS kernel_ns,
                         avg(kernel_ns) AS kernel_avg_ns, count(*) FILTER (WHERE tiny) AS tiny,
                         coalesce(sum(kernel_ns) FILTER (WHERE tiny), 0)::BIGINT AS tiny_kernel_ns,
                         count(*) FILTER (WHERE graph) AS graph
                  FROM (SELECT *, NOT graph AND kernel_ns < api_ns AS tiny FROM ({_LAUNCHED.format(work=work)}))
                  GROUP BY name_id) g
            LEFT JOIN kernel_names n ON n.trace_id = {t} AND n.name_id = g.name_id
            ORDER BY g.api_ns DESC, n.name""").pl()
    n, tiny = int(table["launches"].sum()), int(table["tiny"].sum())
    totals = {"launches": n, "api_ns": int(table["api_ns"].sum()), "kernel_ns": int(table["kernel_ns"].sum()),
              "tiny": tiny, "tiny_pct": 100.0 * tiny / n if n else 0.0,
              "tiny_kernel_ns": int(table["tiny_kernel_ns"].sum()), "graph": int(table["graph"].sum())}
    return table.drop("tiny_kernel_ns", "graph"), totals


def repeated_launches(con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str) -> tuple[int, int, int]:
    """Whether the iterations launch the same kernels in the same order: (iterations, distinct
    sequences, fewest kernels) over the iteration ranges (`iteration_regex`, ended ones, any
    process) after the first to start, each holding the kernels whose launching call began
    inside it (several ranges where they overlap), in the calls' order (then kernel_id's); an
    iteration that launched nothing is not counted. A sequence is the kernels' name ids.

    The ranges are dealt into chains of disjoint ones (as many as overlap at once: one a
    process), and each launch finds its range in each chain by a binary search: at ten million
    launches and a thousand iterations a range join compared every launch with every range
    begun before it (37 CPU s on a busy machine, 2.5 CPU s this way)."""
    t = int(trace_id)
    ranges = con.sql(f"""
        SELECT start_ns, end_ns FROM nvtx
        WHERE trace_id = {t} AND kind IN ('pushpop', 'startend') AND end_ns IS NOT NULL
          AND regexp_matches(coalesce(name, ''), ?)
        ORDER BY start_ns""", params=[iteration_regex]).pl().slice(1)  # all but the first to start
    ranges = ranges.with_row_index("i").filter(pl.col("end_ns") > pl.col("start_ns"))  # an empty one holds none
    if ranges.is_empty():
        return 0, 0, 0
    chains: list[int] = []  # each chain's last end
    chain = []
    for start, end in ranges.select("start_ns", "end_ns").iter_rows():  # in start order: a few thousand
        free = next((c for c, last in enumerate(chains) if last <= start), None)
        if free is None:
            free = len(chains)
            chains.append(end)
        chains[free] = end
        chain.append(free)
    ranges = ranges.with_columns(chain=pl.Series(chain, dtype=pl.UInt32))
    lo, hi = int(ranges["start_ns"].min()), int(ranges["end_ns"].max())  # type: ignore[arg-type]
    launches = con.sql(f"""
        SELECT launch_start_ns AS at, kernel_id, name_id FROM kernel_events
        WHERE trace_id = {t} AND launch_start_ns >= {lo} AND launch_start_ns < {hi}""").pl()
    if not (launches["at"].is_sorted() and launches["kernel_id"].is_sorted()):  # as the store lies, mostly
        launches = launches.sort("at", "kernel_id")
    found = []
    for (_,), rows in ranges.group_by("chain", maintain_order=True):
        at = rows["start_ns"].search_sorted(launches["at"], side="right").cast(pl.Int64) - 1
        inside = (at >= 0) & (launches["at"] < rows["end_ns"].gather(at.clip(0)))
        found.append(pl.DataFrame({"i": rows["i"].gather(at.filter(inside)), "name_id": launches["name_id"].filter(inside)}))
    per = (pl.concat(found).group_by("i", maintain_order=True)
           .agg(n=pl.len(), sequence="name_id"))
    if per.is_empty():
        return 0, 0, 0
    return per.height, per["sequence"].n_unique(), int(per["n"].min())  # type: ignore[arg-type]
