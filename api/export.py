"""`traceq export`: a trace, or every rank of a run, as Chrome trace events: the JSON that
Perfetto (ui.perfetto.dev) and chrome://tracing open.

What is written (the Trace Event Format; times in microseconds from the first event, with
nanosecond decimals; a run's traces put on its clock by the shift and drift its load measured
on the collectives, `analysis.multigpu.runs`):

- per GPU a process and per stream a thread: kernels (`X`, cat 'kernel', named by their short
  name; args: the full name, launch shape, and the launch's layer, pass, iteration, stage and
  library) and memcpys and memsets (`X`, cat 'memcpy' or 'memset'); Kineto's GPU annotations
  (start/end ranges of no process) as async slices of the GPU whose work used their stream;
- per host process and thread: CUDA runtime and driver calls (`X`, cat 'cuda_api'), NVTX
  push/pop ranges (`X`, cat 'nvtx'), start/end ranges, which may overlap and cross threads,
  as async slices (`b`/`e`, cat 'nvtx', on the opening thread) and marks (`i`);
- work that overlaps on one stream, and calls or ranges that cross on one thread, on extra
  threads of it (`stream 7 · 2`), so that on every thread slices nest or follow each other, as
  Perfetto's importer requires (api/export_tracks.py);
- a flow from each launching call to its kernel (`s` on the call's thread, `f` with `bp: 'e'`
  on the kernel's; ids unique in the file);
- `M` events: exactly one name per process and per thread, and their order. A trace alone keeps
  its device ids and pids as pids (one unknown or equal to a device id gets a number of its own);
  a run's GPUs and processes are numbered in rank order, their names saying rank, device and pid.

Events are made by DuckDB (to_json) and written as they come, a batch at a time: memory stays
flat however many kernels the trace has (docs/performance.md).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from traceq.api.export_tracks import Layout, Part, layout
from traceq.store import first_row

if TYPE_CHECKING:
    import duckdb
    import polars as pl

BATCH_ROWS = 50_000
_ATTRIBUTION = "_traceq_export_attribution"
_MOVED = "_traceq_export_moved"


def _us(ns: str) -> str:
    """SQL: ns -> microseconds with ns decimals (exact as text)."""
    return f"(({ns})::DECIMAL(20, 0) / 1000)::DECIMAL(20, 3)"


def _event_queries(p: Part, origin: int, kept: bool, lay: Layout, ids: int) -> dict[str, str]:
    """Per kind of event, a query whose one column `e` is each event's JSON text, for the part
    `p` (kernels' attribution from the store where it is `kept`, else from the registered frame;
    `ids`: what this part's flow and async ids are offset by)."""
    t = p.trace_id
    kernels = (f"(SELECT * FROM kernels_attributed WHERE trace_id = {t}) k" if kept else
               f"kernels k LEFT JOIN {_ATTRIBUTION} a ON a.kernel_id = k.kernel_id")
    a = "k" if kept else "a"

    def ts(col: str) -> str:
        return _us(f"{p.clock(col)} - {origin}")

    def dur(start: str, end: str) -> str:
        return _us(f"{p.clock(end)} - {p.clock(start)}")

    moved = {src for src, tt, *_ in lay.moved if tt == t}

    def lane(src: str, native: str, keys: str) -> tuple[str, str]:
        """(the tid expression, the join) of rows of `src` that may be on an extra track, matched
        by their track (`keys`, over x.a and x.b), start and end (x.start_ns, x.end_ns)."""
        if src not in moved:
            return native, ""
        return f"coalesce(x.tid, {native})", (
            f"LEFT JOIN (SELECT a, b, start_ns, end_ns, min(tid) AS tid FROM {_MOVED} WHERE src = '{src}' AND "
            f"trace_id = {t} GROUP BY ALL) x ON {keys}")

    gpu = lay.gpu_case(t, "k.device_id")
    k_tid, k_join = "coalesce(k.stream_id, 0)", ""
    if "k" in moved:
        k_tid = "coalesce(x.tid, coalesce(k.stream_id, 0))"
        k_join = (f"LEFT JOIN (SELECT seq, tid FROM {_MOVED} WHERE src = 'k' AND trace_id = {t}) x "
                  "ON x.seq = k.kernel_id")
    m_tid, m_join = lane("m", "coalesce(m.stream_id, 0)", "x.a = coalesce(m.device_id, 0) AND "
                         "x.b = coalesce(m.stream_id, 0) AND x.start_ns = m.start_ns AND x.end_ns = m.end_ns")
    host_keys = ("x.a IS NOT DISTINCT FROM {0}.pid AND x.b = coalesce({0}.tid, 0) AND x.start_ns = {0}.start_ns "
                 "AND x.end_ns = {0}.end_ns")
    c_tid, c_join = lane("a", "coalesce(c.tid, 0)", host_keys.format("c"))
    n_tid, n_join = lane("n", "coalesce(n.tid, 0)", host_keys.format("n"))
    orphan = lay.annotation_pid(t, "n.tid")
    nvtx_pid = (lay.host_case(t, "n.pid") if orphan is None else
                f"(CASE WHEN n.pid IS NULL THEN {orphan} ELSE {lay.host_case(t, 'n.pid')} END)")
    s_tid, s_join = "coalesce(k.launch_tid, 0)", ""
    if "a" in moved:
        s_tid = "coalesce(x.tid, coalesce(k.launch_tid, 0))"
        s_join = (f"LEFT JOIN (SELECT a, b, start_ns, min(tid) AS tid FROM {_MOVED} WHERE src = 'a' AND "
                  f"trace_id = {t} GROUP BY ALL) x ON x.a IS NOT DISTINCT FROM k.pid AND x.b = coalesce(k.launch_tid, 0) "
                  "AND x.start_ns = k.launch_start_ns")
    f_tid, f_join = k_tid, k_join
    return {
        "kernel": f"""
            SELECT to_json({{name: k.short_name, cat: 'kernel', ph: 'X', ts: {ts('k.start_ns')},
                    dur: {dur('k.start_ns', 'k.end_ns')}, pid: {gpu}, tid: {k_tid},
                    args: {{name: k.name, kernel_id: k.kernel_id, correlation_id: k.correlation_id,
                           grid: [k.grid_x, k.grid_y, k.grid_z], block: [k.block_x, k.block_y, k.block_z],
                           registers_per_thread: k.registers_per_thread,
                           smem_bytes: coalesce(k.smem_static_bytes, 0) + coalesce(k.smem_dynamic_bytes, 0),
                           layer: {a}.layer, pass: {a}.pass, iteration: {a}.iteration, stage: {a}.stage,
                           library: {a}.library}}}}) AS e
            FROM {kernels} {k_join} WHERE k.trace_id = {t}""",
        "memop": f"""
            SELECT to_json({{name: coalesce(m.copy_kind, m.dst_kind, m.op), cat: m.op, ph: 'X',
                    ts: {ts('m.start_ns')}, dur: {dur('m.start_ns', 'm.end_ns')},
                    pid: {lay.gpu_case(t, 'm.device_id')}, tid: {m_tid},
                    args: {{bytes: m.bytes, src_kind: m.src_kind, dst_kind: m.dst_kind,
                           correlation_id: m.correlation_id}}}}) AS e
            FROM memops m {m_join} WHERE m.trace_id = {t}""",
        "cuda_api": f"""
            SELECT to_json({{name: c.name, cat: 'cuda_api', ph: 'X', ts: {ts('c.start_ns')},
                    dur: {dur('c.start_ns', 'c.end_ns')}, pid: {lay.host_case(t, 'c.pid')}, tid: {c_tid},
                    args: {{api: c.api, correlation_id: c.correlation_id}}}}) AS e
            FROM api_calls c {c_join} WHERE c.trace_id = {t}""",
        "nvtx_range": f"""
            SELECT to_json({{name: coalesce(n.name, ''), cat: 'nvtx', ph: 'X', ts: {ts('n.start_ns')},
                    dur: {dur('n.start_ns', 'n.end_ns')}, pid: {lay.host_case(t, 'n.pid')}, tid: {n_tid},
                    args: {{domain: n.domain}}}}) AS e
            FROM nvtx n {n_join} WHERE n.trace_id = {t} AND n.kind <> 'startend' AND n.end_ns IS NOT NULL""",
        "nvtx_async": f"""
            SELECT to_json({{name: coalesce(n.name, ''), cat: 'nvtx', ph: q.ph, id: n.id + {ids},
                    ts: CASE q.ph WHEN 'b' THEN {ts('n.start_ns')} ELSE {ts('n.end_ns')} END,
                    pid: {nvtx_pid}, tid: coalesce(n.tid, 0), args: {{domain: n.domain}}}}) AS e
            FROM (SELECT *, row_number() OVER () AS id FROM nvtx
                  WHERE trace_id = {t} AND kind = 'startend' AND end_ns IS NOT NULL) n,
                 (VALUES ('b'), ('e')) q(ph)""",
        "nvtx_mark": f"""
            SELECT to_json({{name: coalesce(n.name, ''), cat: 'nvtx', ph: 'i', s: 't', ts: {ts('n.start_ns')},
                    pid: {lay.host_case(t, 'n.pid')}, tid: coalesce(n.tid, 0), args: {{domain: n.domain}}}}) AS e
            FROM nvtx n WHERE n.trace_id = {t} AND n.end_ns IS NULL""",
        "flow": f"""
            SELECT to_json({{name: 'launch', cat: 'launch', ph: 's', id: k.kernel_id + {ids},
                            ts: {ts('k.launch_start_ns')}, pid: {lay.host_case(t, 'k.pid')}, tid: {s_tid}}}) AS e
            FROM kernel_launches k {s_join} WHERE k.trace_id = {t} AND k.launch_start_ns IS NOT NULL
            UNION ALL
            SELECT to_json({{name: 'launch', cat: 'launch', ph: 'f', bp: 'e', id: k.kernel_id + {ids},
                            ts: {ts('k.start_ns')}, pid: {gpu}, tid: {f_tid}}})
            FROM kernel_launches k {f_join} WHERE k.trace_id = {t} AND k.launch_start_ns IS NOT NULL""",
    }


def _metadata(lay: Layout) -> list[str]:
    """The `M` events: one name and sort index per process and per thread."""
    events = []
    for sort, (pid, name) in enumerate(lay.processes):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": sort}})
    for pid, tid, name, sort in lay.threads:
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": sort}})
    return [json.dumps(e, ensure_ascii=False) for e in events]


def _event_count(con: duckdb.DuckDBPyConnection, t: int) -> int:
    """About how many events the file gets (for the progress bar): kernels twice (their flows),
    the rest once."""
    return sum(first_row(con, f"SELECT count(*) * {n} FROM {table} WHERE trace_id = {t}")[0]
               for table, n in (("kernel_events", 2), ("memops", 1), ("api_events", 1), ("nvtx_events", 1)))


def _first(con: duckdb.DuckDBPyConnection, p: Part) -> int | None:
    """The part's first event's time on the export's clock, ns (None: it has no events)."""
    t = p.trace_id
    row = first_row(con, f"""
        SELECT {p.clock('min(s)')} FROM (SELECT min(start_ns) AS s FROM kernel_events WHERE trace_id = {t}
                            UNION ALL SELECT min(start_ns) FROM memops WHERE trace_id = {t}
                            UNION ALL SELECT min(start_ns) FROM api_events WHERE trace_id = {t}
                            UNION ALL SELECT min(start_ns) FROM nvtx_events WHERE trace_id = {t})""")
    return None if row is None or row[0] is None else int(row[0])


def _ids(con: duckdb.DuckDBPyConnection, t: int) -> int:
    """How many flow and async ids a trace may use: above its largest kernel id and range count."""
    row = first_row(con, f"SELECT greatest((SELECT max(kernel_id) FROM kernel_events WHERE trace_id = {t}), "
                         f"(SELECT count(*) FROM nvtx_events WHERE trace_id = {t}))")
    return int(row[0] or 0) + 1 if row else 1


def write_chrome_trace(
    con: duckdb.DuckDBPyConnection, parts: list[Part], path: Path,
    attribution: Callable[[int], pl.DataFrame | None], progress: Callable[[int, int], None] | None = None,
) -> dict[str, int]:
    """Write the events of `parts` (one trace, or a run's traces) to `path` (gzip-compressed
    when it ends in .gz) as a Chrome trace JSON object; `attribution(trace_id)` gives each
    kernel_id its layer, pass, iteration, stage and library (None: read them from
    `kernels_attributed`, where the store keeps them). Returns how many events of each kind were
    written (a flow is two events; the `M` events under 'metadata')."""
    import pyarrow as pa

    lay = layout(con, parts)
    firsts = [f for f in (_first(con, p) for p in parts) if f is not None]
    origin = min(firsts, default=0)
    moved = pa.table({name: pa.array([r[i] for r in lay.moved], type=kind) for i, (name, kind) in enumerate(
        (("src", pa.string()), ("trace_id", pa.int64()), ("a", pa.int64()), ("b", pa.int64()), ("seq", pa.int64()),
         ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("tid", pa.int64())))})
    con.register(_MOVED, moved)
    partial = path.with_name(path.name + ".part")  # a failed export leaves no half-written file
    ordered = first_row(con, "SELECT current_setting('preserve_insertion_order')")[0]
    con.execute("SET preserve_insertion_order = false")  # events in any order: DuckDB need not buffer them
    try:
        total = sum(_event_count(con, p.trace_id) for p in parts)
        written: dict[str, int] = {"metadata": 0}
        with _open(partial, gzipped=path.suffix == ".gz") as out:
            out.write('{"displayTimeUnit": "ns", "otherData": {"producer": "traceq"}, "traceEvents": [\n')
            metadata = _metadata(lay)
            out.write(",\n".join(metadata))
            written["metadata"] = len(metadata)
            separator = ",\n" if metadata else ""
            ids = 0
            for p in parts:
                frame = attribution(p.trace_id)
                if frame is not None:
                    con.register(_ATTRIBUTION, frame.select("kernel_id", "layer", "pass", "iteration", "stage",
                                                            "library"))
                try:
                    queries = _event_queries(p, origin, frame is None, lay, ids)
                    separator = _write_events(con, queries, out, written, separator,
                                              lambda done: progress and progress(done, total))
                finally:
                    if frame is not None:
                        con.unregister(_ATTRIBUTION)
                ids += _ids(con, p.trace_id)
            out.write("\n]}\n")
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        con.execute(f"SET preserve_insertion_order = {bool(ordered)}")
        con.unregister(_MOVED)
    return written


def _write_events(con: duckdb.DuckDBPyConnection, queries: dict[str, str], out: IO[str], written: dict[str, int],
                  separator: str, progress: Callable[[int], object]) -> str:
    """Each query's events, a batch at a time, counted into `written`; the separator to go on with."""
    for kind, query in queries.items():
        written.setdefault(kind, 0)
        relation = con.sql(query)
        reader = getattr(relation, "to_arrow_reader", None) or relation.fetch_record_batch  # duckdb < 1.4
        for batch in reader(BATCH_ROWS):
            lines = batch.column(0).to_pylist()
            if lines:
                out.write(separator + ",\n".join(lines))
                separator = ",\n"
                written[kind] += len(lines)
                progress(sum(written.values()))
    return separator


def _open(path: Path, *, gzipped: bool) -> IO[str]:
    if gzipped:
        return gzip.open(path, "wt", encoding="utf-8", compresslevel=6)
    return path.open("w", encoding="utf-8")
