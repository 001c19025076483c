"""`traceq export`: a trace of the store as Chrome trace events, the JSON that Perfetto
(ui.perfetto.dev) and chrome://tracing open.

What is written (the Trace Event Format; times in microseconds from the trace's first event,
with nanosecond decimals):

- per GPU a process (pid: the device id, as PyTorch's profiler writes them) and per stream a
  thread: kernels (`X`, cat 'kernel', named by their short name; args: the full name, launch
  shape, and the launch's layer, pass, iteration, stage and library) and memcpys and memsets
  (`X`, cat 'memcpy' or 'memset');
- per host process and thread: CUDA runtime and driver calls (`X`, cat 'cuda_api'), NVTX
  push/pop ranges (`X`, cat 'nvtx'), start/end ranges, which may overlap and cross threads,
  as async slices (`b`/`e`, cat 'nvtx', on the opening thread) and marks (`i`);
- a flow from each launching call to its kernel (`s` on the call, `f` with `bp: 'e'` on the
  kernel; id: the kernel_id);
- `M` events naming the processes and threads.

Events are made by DuckDB (to_json) and written as they come, a batch at a time: memory stays
flat however many kernels the trace has (docs/performance.md).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from traceq.store import first_row

if TYPE_CHECKING:
    import duckdb
    import polars as pl

BATCH_ROWS = 50_000

_US = "((({col}) - {origin})::DECIMAL(20, 0) / 1000)::DECIMAL(20, 3)"
"""ns since the trace's first event -> microseconds with ns decimals (exact as text)."""


def _us(column: str, origin: int) -> str:
    return _US.format(col=column, origin=origin)


def _event_queries(t: int, origin: int, kept: bool) -> dict[str, str]:
    """Per kind of event, a query whose one column `e` is each event's JSON text; kernels'
    attribution from the store where it is `kept`, else from the registered frame."""
    kernels = (f"(SELECT * FROM kernels_attributed WHERE trace_id = {t}) k" if kept else
               "kernels k LEFT JOIN _traceq_export_attribution a ON a.kernel_id = k.kernel_id")
    a = "k" if kept else "a"
    ts, end = _us("start_ns", origin), _us("end_ns", origin)
    dur = "((end_ns - start_ns)::DECIMAL(20, 0) / 1000)::DECIMAL(20, 3)"
    return {
        "kernel": f"""
            SELECT to_json({{name: k.short_name, cat: 'kernel', ph: 'X', ts: {_us('k.start_ns', origin)},
                    dur: {dur.replace('end_ns', 'k.end_ns').replace('start_ns', 'k.start_ns')},
                    pid: coalesce(k.device_id, 0), tid: coalesce(k.stream_id, 0),
                    args: {{name: k.name, kernel_id: k.kernel_id, correlation_id: k.correlation_id,
                           grid: [k.grid_x, k.grid_y, k.grid_z], block: [k.block_x, k.block_y, k.block_z],
                           registers_per_thread: k.registers_per_thread,
                           smem_bytes: coalesce(k.smem_static_bytes, 0) + coalesce(k.smem_dynamic_bytes, 0),
                           layer: {a}.layer, pass: {a}.pass, iteration: {a}.iteration, stage: {a}.stage,
                           library: {a}.library}}}}) AS e
            FROM {kernels} WHERE k.trace_id = {t}""",
        "memop": f"""
            SELECT to_json({{name: coalesce(copy_kind, dst_kind, op), cat: op, ph: 'X', ts: {ts}, dur: {dur},
                    pid: coalesce(device_id, 0), tid: coalesce(stream_id, 0),
                    args: {{bytes: bytes, src_kind: src_kind, dst_kind: dst_kind,
                           correlation_id: correlation_id}}}}) AS e
            FROM memops WHERE trace_id = {t}""",
        "cuda_api": f"""
            SELECT to_json({{name: name, cat: 'cuda_api', ph: 'X', ts: {ts}, dur: {dur},
                    pid: coalesce(pid, 0), tid: coalesce(tid, 0),
                    args: {{api: api, correlation_id: correlation_id}}}}) AS e
            FROM api_calls WHERE trace_id = {t}""",
        "nvtx_range": f"""
            SELECT to_json({{name: coalesce(name, ''), cat: 'nvtx', ph: 'X', ts: {ts}, dur: {dur},
                    pid: coalesce(pid, 0), tid: coalesce(tid, 0), args: {{domain: domain}}}}) AS e
            FROM nvtx WHERE trace_id = {t} AND kind <> 'startend' AND end_ns IS NOT NULL""",
        "nvtx_async": f"""
            SELECT to_json({{name: coalesce(name, ''), cat: 'nvtx', ph: p.ph, id: n.id,
                    ts: CASE p.ph WHEN 'b' THEN {ts} ELSE {end} END,
                    pid: coalesce(pid, 0), tid: coalesce(tid, 0), args: {{domain: domain}}}}) AS e
            FROM (SELECT *, row_number() OVER () AS id FROM nvtx
                  WHERE trace_id = {t} AND kind = 'startend' AND end_ns IS NOT NULL) n,
                 (VALUES ('b'), ('e')) p(ph)""",
        "nvtx_mark": f"""
            SELECT to_json({{name: coalesce(name, ''), cat: 'nvtx', ph: 'i', s: 't', ts: {ts},
                    pid: coalesce(pid, 0), tid: coalesce(tid, 0), args: {{domain: domain}}}}) AS e
            FROM nvtx WHERE trace_id = {t} AND end_ns IS NULL""",
        "flow": f"""
            SELECT to_json({{name: 'launch', cat: 'launch', ph: 's', id: kernel_id,
                            ts: {_us('launch_start_ns', origin)}, pid: coalesce(pid, 0), tid: launch_tid}}) AS e
            FROM kernel_launches WHERE trace_id = {t} AND launch_start_ns IS NOT NULL
            UNION ALL
            SELECT to_json({{name: 'launch', cat: 'launch', ph: 'f', bp: 'e', id: kernel_id, ts: {ts},
                            pid: coalesce(device_id, 0), tid: coalesce(stream_id, 0)}})
            FROM kernel_launches WHERE trace_id = {t} AND launch_start_ns IS NOT NULL""",
        "metadata": f"""
            WITH gpu AS (SELECT DISTINCT coalesce(device_id, 0) AS pid FROM kernels WHERE trace_id = {t}
                         UNION SELECT DISTINCT coalesce(device_id, 0) FROM memops WHERE trace_id = {t}),
                 stream AS (SELECT DISTINCT coalesce(device_id, 0) AS pid, coalesce(stream_id, 0) AS tid
                            FROM kernels WHERE trace_id = {t}
                            UNION SELECT DISTINCT coalesce(device_id, 0), coalesce(stream_id, 0)
                            FROM memops WHERE trace_id = {t}),
                 host AS (SELECT DISTINCT coalesce(pid, 0) AS pid, coalesce(tid, 0) AS tid
                          FROM api_calls WHERE trace_id = {t}
                          UNION SELECT DISTINCT coalesce(pid, 0), coalesce(tid, 0) FROM nvtx WHERE trace_id = {t})
            SELECT to_json({{name: 'process_name', ph: 'M', pid: gpu.pid, tid: 0,
                            args: {{name: 'GPU ' || gpu.pid || coalesce(': ' || any_value(g.name), '')}}}})
            FROM gpu LEFT JOIN gpus g ON g.trace_id = {t} AND g.device_id = gpu.pid GROUP BY gpu.pid
            UNION ALL
            SELECT to_json({{name: 'process_sort_index', ph: 'M', pid: pid, tid: 0, args: {{sort_index: pid}}}})
            FROM gpu
            UNION ALL
            SELECT to_json({{name: 'thread_name', ph: 'M', pid: pid, tid: tid, args: {{name: 'stream ' || tid}}}})
            FROM stream
            UNION ALL
            SELECT to_json({{name: 'process_name', ph: 'M', pid: h.pid, tid: 0,
                            args: {{name: coalesce(any_value(p.name), 'process') || ' ' || h.pid}}}})
            FROM (SELECT DISTINCT pid FROM host) h
            LEFT JOIN processes p ON p.trace_id = {t} AND p.pid = h.pid GROUP BY h.pid
            UNION ALL
            SELECT to_json({{name: 'thread_name', ph: 'M', pid: h.pid, tid: h.tid,
                            args: {{name: coalesce(any_value(th.name), 'thread') || ' ' || h.tid}}}})
            FROM host h LEFT JOIN threads th ON th.trace_id = {t} AND th.pid = h.pid AND th.tid = h.tid
            GROUP BY h.pid, h.tid""",
    }


def _event_count(con: duckdb.DuckDBPyConnection, t: int) -> int:
    """About how many events the file gets (for the progress bar): kernels twice (their flows),
    the rest once."""
    return sum(first_row(con, f"SELECT count(*) * {n} FROM {table} WHERE trace_id = {t}")[0]
               for table, n in (("kernel_events", 2), ("memops", 1), ("api_events", 1), ("nvtx_events", 1)))


def _origin(con: duckdb.DuckDBPyConnection, t: int) -> int:
    """The first event's time, ns: where the exported timeline starts."""
    row = first_row(con, f"""
        SELECT min(s) FROM (SELECT min(start_ns) AS s FROM kernel_events WHERE trace_id = {t}
                            UNION ALL SELECT min(start_ns) FROM memops WHERE trace_id = {t}
                            UNION ALL SELECT min(start_ns) FROM api_events WHERE trace_id = {t}
                            UNION ALL SELECT min(start_ns) FROM nvtx_events WHERE trace_id = {t})""")
    return int(row[0] or 0) if row else 0


def write_chrome_trace(
    con: duckdb.DuckDBPyConnection, trace_id: int, path: Path, attribution: pl.DataFrame | None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, int]:
    """Write the trace's events to `path` (gzip-compressed when it ends in .gz) as a Chrome
    trace JSON object; `attribution` gives each kernel_id its layer, pass, iteration, stage and
    library (None: read them from `kernels_attributed`, where the store keeps them). Returns how many events of each kind were written (a flow is two events)."""
    t = int(trace_id)
    queries = _event_queries(t, _origin(con, t), kept=attribution is None)
    if attribution is not None:
        con.register("_traceq_export_attribution",
                     attribution.select("kernel_id", "layer", "pass", "iteration", "stage", "library"))
    partial = path.with_name(path.name + ".part")  # a failed export leaves no half-written file
    ordered = first_row(con, "SELECT current_setting('preserve_insertion_order')")[0]
    con.execute("SET preserve_insertion_order = false")  # events in any order: DuckDB need not buffer them
    try:
        total = _event_count(con, t)
        with _open(partial, gzipped=path.suffix == ".gz") as out:
            written = _write_events(con, queries, out, lambda done: progress and progress(done, total))
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        con.execute(f"SET preserve_insertion_order = {bool(ordered)}")
        if attribution is not None:
            con.unregister("_traceq_export_attribution")
    return written


def _write_events(con: duckdb.DuckDBPyConnection, queries: dict[str, str], out: IO[str],
                  progress: Callable[[int], object]) -> dict[str, int]:
    """The JSON object, its events a batch at a time; the count of each kind."""
    out.write('{"displayTimeUnit": "ns", "otherData": {"producer": "traceq"}, "traceEvents": [\n')
    written: dict[str, int] = {}
    separator = ""
    for kind, query in queries.items():
        written[kind] = 0
        relation = con.sql(query)
        reader = getattr(relation, "to_arrow_reader", None) or relation.fetch_record_batch  # duckdb < 1.4
        for batch in reader(BATCH_ROWS):
            lines = batch.column(0).to_pylist()
            if lines:
                out.write(separator + ",\n".join(lines))
                separator = ",\n"
                written[kind] += len(lines)
                progress(sum(written.values()))
    out.write("\n]}\n")
    return written


def _open(path: Path, *, gzipped: bool) -> IO[str]:
    if gzipped:
        return gzip.open(path, "wt", encoding="utf-8", compresslevel=6)
    return path.open("w", encoding="utf-8")
