"""GPU memory from the CUDA memory usage events (`nsys profile --cuda-memory-usage=true`):
bytes in use over time, the peak, and allocations per layer (the paper's section 5.4).

An allocation or free belongs to the NVTX ranges enclosing the API call that made it (the
event's correlation id names the call; the call's thread and start time place it, as for a
kernel launch, through `attribution.attribute_points`); a Kineto event, which records its thread,
is placed by its own thread and time. Device memory is every memory kind but
host memory ('Pageable', 'Pinned'); host pinned bytes are reported apart.

These are driver-level allocations: PyTorch's caching allocator asks the driver for a few large
segments and reuses them, so a layer shows only the segments it made the allocator grow.
Traces captured from a `cudaProfilerStart` (`--capture-range=cudaProfilerApi`) list the memory
already allocated at the start of the capture as allocations at time 0 whose API call is not
in the trace: they count towards the bytes in use and the peak, and per layer as 'before
capture'. `PYTORCH_NO_CUDA_MEMORY_CACHING=1` during capture makes each tensor a driver
allocation, which is what the paper's per-layer figures show.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.structure.attribution import attribute_points
from traceq.analysis.structure.attribution_sql import real_asof_joins
from traceq.analysis.structure.conventions import ITERATION_REGEX
from traceq.errors import MissingDataError

HOST_KINDS = ("Pageable", "Pinned")
"""Memory kinds that live in host memory; every other kind counts as device memory."""



CAPTURE_HINT = "capture with `nsys profile --cuda-memory-usage=true ...`"


def _require_events(con: duckdb.DuckDBPyConnection, trace_id: int) -> None:
    count = con.execute("SELECT count(*) FROM memory_events WHERE trace_id = ?", [trace_id]).fetchall()[0][0]
    if not count:
        name = con.execute("SELECT name FROM traces WHERE trace_id = ?", [trace_id]).fetchall()
        label = name[0][0] if name else f"trace {trace_id}"
        raise MissingDataError(f"{label} has no CUDA memory usage events: {CAPTURE_HINT}")


def memory_events(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """Every allocation and free, in time order per device, with its layer and the bytes in use.

    Columns: event_id (0-based, the order used for running sums: device, time, frees before
    allocations at the same ns), ts_ns, device_id, op ('alloc' or 'free'), mem_kind, bytes (a
    free without a size gets its allocation's size), address, on_device (false for host kinds),
    delta_bytes (+bytes for an on-device alloc, -bytes for a free, 0 on the host), bytes_in_use
    (device memory in use on the device after the event), layer, pass, iteration, stage
    (attribution of the API call), api_call (the call's name; null when the trace lacks it),
    before_capture (no API call in the trace and not after the first one: allocated before the
    capture began). Raises MissingDataError when the trace has none.
    """
    _require_events(con, trace_id)
    t = int(trace_id)
    host = ", ".join(f"'{k}'" for k in HOST_KINDS)
    numbered = f"""
        SELECT CAST(row_number() OVER (ORDER BY device_id, ts_ns, op = 'alloc', address, correlation_id, bytes)
                    - 1 AS BIGINT) AS id,
               ts_ns, op, bytes, address, mem_kind, device_id, correlation_id, pid, tid,
               coalesce(mem_kind NOT IN ({host}), true) AS on_device
        FROM memory_events WHERE trace_id = {t}"""
    calls = f"""
        SELECT e.id, e.pid, a.tid, a.start_ns AS t, a.name AS api_call
        FROM ({numbered}) e JOIN api_calls a
          ON a.trace_id = {t} AND a.pid = e.pid AND a.correlation_id = e.correlation_id
         AND a.api IN ('runtime', 'driver')
        WHERE e.tid IS NULL
        QUALIFY row_number() OVER (PARTITION BY e.id ORDER BY a.api = 'runtime' DESC, a.start_ns) = 1
        UNION ALL
        SELECT id, pid, tid, ts_ns, NULL FROM ({numbered}) WHERE tid IS NOT NULL"""
    points = con.sql(f"SELECT id, pid, tid, t FROM ({calls})").pl()
    attribution = attribute_points(con, trace_id, points, iteration_regex, paths=False).select(
        pl.col("id").alias("event_id"), "layer", "pass", "iteration", "stage")
    with real_asof_joins(con):
        frame = con.sql(f"""
            WITH ev AS MATERIALIZED ({numbered}),
            sized AS (
                SELECT e.*, CASE WHEN e.op = 'free' AND coalesce(e.bytes, 0) = 0 THEN a.bytes
                                 ELSE e.bytes END AS size
                FROM ev e ASOF LEFT JOIN (SELECT id, device_id, address, bytes FROM ev WHERE op = 'alloc') a
                  ON e.device_id = a.device_id AND e.address = a.address AND e.id >= a.id
            ),
            first_call AS (SELECT min(start_ns) AS t0 FROM api_calls WHERE trace_id = {t})
            SELECT s.id AS event_id, s.ts_ns, s.device_id, s.op, s.mem_kind, s.size AS bytes, s.address,
                   s.on_device,
                   CASE WHEN NOT s.on_device THEN 0 WHEN s.op = 'alloc' THEN coalesce(s.size, 0)
                        ELSE -coalesce(s.size, 0) END::BIGINT AS delta_bytes,
                   c.api_call,
                   c.id IS NULL AND s.ts_ns <= coalesce((SELECT t0 FROM first_call), s.ts_ns) AS before_capture
            FROM sized s
            LEFT JOIN ({calls}) c ON c.id = s.id
            ORDER BY s.id
        """).pl()
    frame = frame.join(attribution, on="event_id", how="left", maintain_order="left").with_columns(
        bytes_in_use=pl.col("delta_bytes").cum_sum().over("device_id").cast(pl.Int64))
    return frame.select("event_id", "ts_ns", "device_id", "op", "mem_kind", "bytes", "address", "on_device",
                        "delta_bytes", "bytes_in_use", "layer", "pass", "iteration", "stage", "api_call",
                        "before_capture")


def memory_timeline(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """Device memory in use over time: one row per on-device allocation or free.

    Columns: event_id (the events' order, as in `memory_events`), ts_ns, device_id, op, mem_kind,
    bytes, bytes_in_use (after the event), layer, pass, before_capture. Host (pageable, pinned)
    events are left out.
    """
    return (memory_events(con, trace_id, iteration_regex).filter(pl.col("on_device"))
            .select("event_id", "ts_ns", "device_id", "op", "mem_kind", "bytes", "bytes_in_use", "layer", "pass",
                    "before_capture"))


def _device_memory(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    return con.sql(f"SELECT device_id, name AS gpu, memory_bytes FROM gpus WHERE trace_id = {int(trace_id)}").pl()


def memory_by_layer(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """Device memory allocated and freed per (device, layer, pass), most bytes first.

    Columns: device_id, layer (null: outside every layer, see `where`), pass, allocs,
    alloc_bytes, frees, freed_bytes, net_bytes (alloc_bytes - freed_bytes),
    share_of_device_pct (alloc_bytes over the device's memory, %), where ('layer', 'outside
    layers', or 'before capture': already allocated when the capture began).
    """
    events = memory_events(con, trace_id, iteration_regex).filter(pl.col("on_device"))
    where = (pl.when(pl.col("layer").is_not_null()).then(pl.lit("layer"))
             .when(pl.col("before_capture")).then(pl.lit("before capture"))
             .otherwise(pl.lit("outside layers")))
    alloc, free = pl.col("op") == "alloc", pl.col("op") == "free"
    keys = ["device_id", "layer", "pass", "where"]
    frame = (events.with_columns(where=where)
             .group_by(keys)
             .agg(allocs=alloc.sum().cast(pl.Int64),
                  alloc_bytes=pl.col("bytes").filter(alloc).sum().cast(pl.Int64),
                  frees=free.sum().cast(pl.Int64),
                  freed_bytes=pl.col("bytes").filter(free).sum().cast(pl.Int64),
                  first=pl.col("event_id").min()))
    return (frame.join(_device_memory(con, trace_id).select("device_id", "memory_bytes"),
                       on="device_id", how="left", nulls_equal=True)
            .with_columns(net_bytes=pl.col("alloc_bytes") - pl.col("freed_bytes"),
                          share_of_device_pct=100.0 * pl.col("alloc_bytes") / pl.col("memory_bytes"))
            .sort(["alloc_bytes", "first"], descending=[True, False])
            .select("device_id", "layer", "pass", "allocs", "alloc_bytes", "frees", "freed_bytes", "net_bytes",
                    "share_of_device_pct", "where"))


def memory_summary(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """Per device: its memory, the peak of device memory in use and when it was reached.

    Columns: device_id, gpu, memory_bytes (device memory), peak_bytes, peak_ts_ns (first time
    the peak was reached), peak_pct (of memory_bytes), final_bytes (in use after the last
    event), allocs, frees, alloc_bytes, before_capture_bytes (already in use when the capture
    began), host_pinned_bytes (pinned host memory allocated, not counted above).
    """
    events = memory_events(con, trace_id, iteration_regex)
    device = events.filter(pl.col("on_device"))
    alloc = pl.col("op") == "alloc"
    per_device = (device.sort("event_id").group_by("device_id", maintain_order=True).agg(
        peak_bytes=pl.col("bytes_in_use").max(),
        peak_ts_ns=pl.col("ts_ns").filter(pl.col("bytes_in_use") == pl.col("bytes_in_use").max()).first(),
        final_bytes=pl.col("bytes_in_use").last(),
        allocs=alloc.sum().cast(pl.Int64),
        frees=(~alloc).sum().cast(pl.Int64),
        alloc_bytes=pl.col("bytes").filter(alloc).sum().cast(pl.Int64),
        before_capture_bytes=pl.col("delta_bytes").filter(pl.col("before_capture")).sum().cast(pl.Int64)))
    pinned = (events.filter((pl.col("mem_kind") == "Pinned") & alloc).group_by("device_id")
              .agg(host_pinned_bytes=pl.col("bytes").sum().cast(pl.Int64)))
    return (per_device.join(_device_memory(con, trace_id), on="device_id", how="left", nulls_equal=True)
            .join(pinned, on="device_id", how="left", nulls_equal=True)
            .with_columns(peak_pct=100.0 * pl.col("peak_bytes") / pl.col("memory_bytes"),
                          host_pinned_bytes=pl.col("host_pinned_bytes").fill_null(0))
            .sort("device_id")
            .select("device_id", "gpu", "memory_bytes", "peak_bytes", "peak_ts_ns", "peak_pct", "final_bytes",
                    "allocs", "frees", "alloc_bytes", "before_capture_bytes", "host_pinned_bytes"))
