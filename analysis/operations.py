"""GPU work and the host calls that issued it: every kernel, memcpy and memset of a trace with
its device, stream and times, and the CUDA API call (thread, start, end, name) that launched it.

A GPU operation names its call by correlation id, unique within a process. The load stores each
kernel's call with the kernel (`kernel_events.launch_*`, `ingest.launches`), so ten million
kernels need no lookup at all; the rest (copies and sets, and kernels the load found no call for,
or whose reader does not look) are looked up among the calls of their correlation ids only
(`with_calls`). CUPTI numbers calls in the order they are made, so the calls are (nearly always)
stored in key order already, and each operation finds its call by one binary search over the
calls' (process, correlation id) keys (`issuing_calls`). Both kinds are one DuckDB relation
(`gpu_work_sql`): reports that aggregate the work (launch times per name, `nsys stats`'
cuda_kern_exec_sum) do so where the kernels lie. `gpu_work` reads the work into Polars for the
gaps, the stored kernels without a join: each operation's queue (device, stream, process) and
calling thread are row numbers into two small tables (`Work`). Times are integer ns on the
trace's timeline.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import duckdb
import polars as pl

from traceq.ingest.launches import LAUNCH_COLUMNS
from traceq.store import registered

KINDS = ("kernel", "memcpy", "memset")
"""`kind` codes of `gpu_work`: 0 kernel, 1 memcpy, 2 memset."""

BATCH_ROWS = 1 << 26
"""Rows per Arrow batch when reading every kernel: DuckDB's default (131,072) made reading ten
million kernels take half as long again."""

SEMI_JOIN_MAX = 1_000_000
"""Up to this many operations, `calls_of` reads only the calls with their ids (the copies of a
trace whose kernels have their calls stored: thousands); past it, every call (a Kineto or nvprof
trace's kernels: restricting the read would cost more than it saves)."""

_KEY_BITS = 32  # CUPTI correlation ids are 32-bit: (process number << 32) | correlation id is unique


@dataclass(frozen=True)
class Work:
    """A trace's GPU work as `gpu_work` reads it: each operation's queue (device, stream, process)
    and calling thread as row numbers into two small tables, not as four 64-bit columns."""

    ops: pl.DataFrame
    """kind (UInt8, index into KINDS), item (kernel_events.name_id for a kernel, the row of
    `memops` for a copy or set), queue (UInt32, row of `queues`), start_ns, end_ns,
    graph_node_id (a kernel's CUDA graph node; only in a trace with graph nodes), thread
    (UInt32, row of `threads`; null without an issuing call), call_start_ns, call_end_ns,
    call_name_id (of the issuing call, `with_calls`); in no particular order."""
    queues: pl.DataFrame
    """device_id, stream_id, pid, by `ops.queue`."""
    threads: pl.Series
    """tid (of the issuing call), by `ops.thread`."""
    memops: pl.DataFrame
    """op, copy_kind, src_kind, dst_kind, bytes, pid, correlation_id: one row per memcpy/memset."""

    def of(self, column: str, rows: pl.Series | None = None) -> pl.Series:
        """device_id, stream_id, pid or tid of each operation (of `rows` of ops, if given)."""
        codes = self.ops["thread" if column == "tid" else "queue"]
        codes = codes if rows is None else codes.gather(rows)
        return (self.threads if column == "tid" else self.queues[column]).gather(codes)


def gpu_work(con: duckdb.DuckDBPyConnection, trace_id: int) -> Work:
    """Every kernel, memcpy and memset of the trace with the call that issued it, and the copies'
    details apart (`Work`). The kernels whose calls the load stored are read as they lie (no
    join); the rest are looked up by `with_calls` and given a row each in `queues` and
    `threads`."""
    from traceq.analysis.structure.graphs import has_graph_nodes

    t = int(trace_id)
    graph = has_graph_nodes(con, t)
    lacking = _kernels(con, t, "e.launch_start_ns IS NULL", graph)
    copies, memops = _copies(con, t, lacking.schema)
    looked_up = pl.concat([with_calls(con, t, lacking), with_calls(con, t, copies)])
    queues = con.sql(f"SELECT queue_id, device_id, stream_id, pid FROM kernel_queues WHERE trace_id = {t} "
                     f"ORDER BY queue_id").pl()
    threads = con.sql(f"SELECT thread_id, tid FROM api_threads WHERE trace_id = {t} ORDER BY thread_id").pl()
    stored = con.sql(f"""
        SELECT 0::UTINYINT AS kind, name_id::UINTEGER AS item, queue_id::UINTEGER AS queue_id, start_ns, end_ns,
               {'graph_node_id, ' if graph else ''}launch_thread_id::UINTEGER AS launch_thread_id,
               launch_start_ns AS call_start_ns, launch_end_ns AS call_end_ns, launch_name_id AS call_name_id
        FROM kernel_events WHERE trace_id = {t} AND launch_start_ns IS NOT NULL""").pl(BATCH_ROWS)
    queue_rows = pl.int_range(queues.height, queues.height + looked_up.height, dtype=pl.UInt32, eager=True)
    thread_rows = pl.int_range(threads.height, threads.height + looked_up.height, dtype=pl.UInt32, eager=True)
    ops = pl.concat([
        stored.select("kind", "item", queue=_row_of(queues, "queue_id", stored["queue_id"]), start_ns="start_ns",
                      end_ns="end_ns", *(["graph_node_id"] if graph else []),
                      thread=_row_of(threads, "thread_id", stored["launch_thread_id"]),
                      call_start_ns="call_start_ns", call_end_ns="call_end_ns", call_name_id="call_name_id"),
        looked_up.select("kind", "item", queue=queue_rows, start_ns="start_ns", end_ns="end_ns",
                         *(["graph_node_id"] if graph else []), thread=thread_rows, call_start_ns="call_start_ns",
                         call_end_ns="call_end_ns", call_name_id="call_name_id")], rechunk=False)
    queues = queues.drop("queue_id")
    queues = pl.concat([queues, looked_up.select(queues.columns).cast(queues.schema)])
    return Work(ops, queues, pl.concat([threads["tid"], looked_up["tid"].cast(threads["tid"].dtype)]), memops)


def _row_of(table: pl.DataFrame, key: str, ids: pl.Series) -> pl.Series:
    """The rows of `table` whose `key` column holds `ids` (UInt32; null for null ids and ids no
    row has): the ids themselves when the keys are 0, 1, ... (the store numbers queues, threads
    and names so) and all of them are below the table's height."""
    top, bottom = ids.max(), ids.min()
    if (table[key].equals(pl.int_range(0, table.height, dtype=table[key].dtype, eager=True))
            and (top is None or (top < table.height and bottom >= 0))):  # type: ignore[operator]
        return ids.cast(pl.UInt32)
    return ids.replace_strict(table[key], pl.int_range(0, table.height, dtype=pl.UInt32, eager=True), default=None)


@contextmanager
def gpu_work_sql(con: duckdb.DuckDBPyConnection, trace_id: int) -> Iterator[str]:
    """`gpu_work`'s ops as a DuckDB relation (SQL text, for a `with` block), for queries that
    aggregate them where they lie instead of reading millions of rows into Polars. Its columns
    are `gpu_work`'s ops' with correlation_id after pid, graph_node_id as stored, graph nodes
    described or not."""
    with _work(con, trace_id, graph=True) as (work, _):
        yield work


@contextmanager
def _work(con: duckdb.DuckDBPyConnection, trace_id: int, graph: bool) -> Iterator[tuple[str, pl.DataFrame]]:
    """(`gpu_work`'s ops as SQL, its memops): the kernels whose calls the load stored are read
    from the store; the rest (copies and sets, kernels without a stored call) are looked up by
    `with_calls` and registered as a view. graph_node_id as `_kernels` gives it."""
    from traceq.analysis.structure.graphs import has_graph_nodes

    t = int(trace_id)
    graph = graph or has_graph_nodes(con, t)
    lacking = _kernels(con, t, "e.launch_start_ns IS NULL", graph)
    copies, memops = _copies(con, t, lacking.schema)
    looked_up = pl.concat([with_calls(con, t, lacking), with_calls(con, t, copies)])
    with registered(con, looked_up=looked_up) as view:
        yield f"""(
            SELECT 0::UTINYINT AS kind, e.name_id::UINTEGER AS item, q.device_id, q.stream_id, q.pid,
                   e.correlation_id, e.start_ns, e.end_ns,
                   {'e.graph_node_id' if graph else 'NULL::BIGINT'} AS graph_node_id, a.tid,
                   e.launch_start_ns AS call_start_ns, e.launch_end_ns AS call_end_ns, e.launch_name_id AS call_name_id
            FROM kernel_events e JOIN kernel_queues q ON q.trace_id = {t} AND q.queue_id = e.queue_id
            LEFT JOIN api_threads a ON a.trace_id = {t} AND a.thread_id = e.launch_thread_id
            WHERE e.trace_id = {t} AND e.launch_start_ns IS NOT NULL
            UNION ALL SELECT * FROM {view['looked_up']})""", memops


def _kernels(con: duckdb.DuckDBPyConnection, trace_id: int, where: str, graph: bool) -> pl.DataFrame:
    """The trace's kernels that meet `where` (SQL over kernel_events e), `with_calls`' input:
    kind, item, device_id, stream_id, pid, correlation_id, start_ns, end_ns, graph_node_id (null
    unless `graph`) and the LAUNCH_COLUMNS."""
    t = int(trace_id)
    node = "graph_node_id" if graph else "NULL::BIGINT"
    # the queue (device, stream, process) of each kernel by row number into the few queues, not a join
    queues = con.sql(f"SELECT queue_id, device_id, stream_id, pid FROM kernel_queues WHERE trace_id = {t} "
                     f"ORDER BY queue_id").pl()
    kernels = con.sql(f"""
        SELECT name_id::UINTEGER AS item, queue_id, correlation_id, start_ns, end_ns,
               {node} AS graph_node_id, {', '.join(LAUNCH_COLUMNS)}
        FROM kernel_events e WHERE trace_id = {t} AND {where}""").pl(BATCH_ROWS)
    device_id, stream_id, pid = by_row(queues, "queue_id", kernels["queue_id"], ("device_id", "stream_id", "pid"))
    return kernels.select(pl.lit(0, pl.UInt8).alias("kind"), "item", device_id, stream_id, pid,
                          *kernels.columns[2:])


def _copies(con: duckdb.DuckDBPyConnection, trace_id: int, schema: pl.Schema) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the trace's memcpys and memsets as `_kernels` gives kernels, in `schema`, item their row
    in table order; their details: op, copy_kind, src_kind, dst_kind, bytes, pid, correlation_id)."""
    memops = con.sql(f"""
        SELECT CASE op WHEN 'memcpy' THEN 1 ELSE 2 END::UTINYINT AS kind, device_id, stream_id, pid,
               correlation_id, start_ns, end_ns, NULL::BIGINT AS graph_node_id, op, copy_kind, src_kind, dst_kind,
               bytes
        FROM memops WHERE trace_id = {int(trace_id)}""").pl().with_row_index("item")
    copies = (memops.with_columns(pl.lit(None).alias(c) for c in LAUNCH_COLUMNS).select(schema.names())
              .cast(schema))  # kept apart until their calls are found: a lookup each
    return copies, memops.select("op", "copy_kind", "src_kind", "dst_kind", "bytes", "pid", "correlation_id")


def by_row(table: pl.DataFrame, key: str, ids: pl.Series, columns: tuple[str, ...]) -> list[pl.Series]:
    """`columns` of the rows of `table` whose `key` column holds `ids`: a gather by row number
    when the keys are 0, 1, ... (the store numbers queues, threads and names so), else a lookup."""
    at = _row_of(table, key, ids)
    return [table[c].gather(at) for c in columns]


def with_calls(con: duckdb.DuckDBPyConnection, trace_id: int, work: pl.DataFrame) -> pl.DataFrame:
    """`work` (pid, correlation_id and the LAUNCH_COLUMNS, null where the load stored no call) with
    its issuing calls' tid, call_start_ns, call_end_ns and call_name_id in place of LAUNCH_COLUMNS:
    the stored call, else the one `calls_of` finds among the calls with the missing ids."""
    t = int(trace_id)
    threads = con.sql(f"SELECT thread_id, tid FROM api_threads WHERE trace_id = {t} ORDER BY thread_id").pl()
    stored = work.select(
        tid=by_row(threads, "thread_id", work["launch_thread_id"], ("tid",))[0] if threads.height
        else pl.lit(None, pl.Int64),
        call_start_ns="launch_start_ns", call_end_ns="launch_end_ns",
        call_name_id=pl.col("launch_name_id").cast(pl.Int32))
    work = work.drop(LAUNCH_COLUMNS)
    lacking = stored["call_start_ns"].is_null() & work["correlation_id"].is_not_null()
    missing = lacking.arg_true()
    if missing.len():
        found = calls_of(con, t, work["pid"].gather(missing), work["correlation_id"].gather(missing))
        at = lacking.cast(pl.Int64).cum_sum() - 1  # each row's place among the missing ones
        stored = stored.select(pl.when(lacking).then(found[c].cast(stored[c].dtype).gather(at)).otherwise(pl.col(c))
                               .alias(c) for c in stored.columns)
    return pl.concat([work, stored], how="horizontal")


ISSUING_CALLS = re.compile(r"(?i)launch|memcpy|memset|prefetch|synchroni|free")
"""API calls that can issue GPU work, or wait for it (the rest, such as cuKernelGetName, never
does): `api_calls` reads only these unless asked for all."""


def api_calls(con: duckdb.DuckDBPyConnection, trace_id: int, pattern: re.Pattern[str] | None = ISSUING_CALLS,
              among: pl.Series | None = None) -> pl.DataFrame:
    """The trace's runtime and driver API calls whose names match `pattern` (None: all), and whose
    correlation ids are `among` these (None: any): pid, tid, correlation_id, start_ns, end_ns,
    name_id; in table order."""
    t = int(trace_id)
    wanted = [i for i, name in con.execute(
        "SELECT name_id, name FROM api_names WHERE trace_id = ? AND api IN ('runtime', 'driver')", [t]).fetchall()
        if pattern is None or pattern.search(name or "")]
    threads = con.sql(f"SELECT thread_id, pid, tid FROM api_threads WHERE trace_id = {t} ORDER BY thread_id").pl()
    query = f"""
        SELECT thread_id, correlation_id, start_ns, end_ns, name_id FROM api_events
        WHERE trace_id = {t} AND name_id IN ({', '.join(str(int(n)) for n in wanted) or 'NULL'})"""
    if among is None:
        calls = con.sql(query).pl()
    else:  # a semi-join: DuckDB reads only the calls with these ids
        with registered(con, among=among.drop_nulls().unique().to_frame("correlation_id")) as rel:
            calls = con.sql(f"{query} AND correlation_id IN (SELECT correlation_id FROM {rel['among']})").pl()
    return calls.select(*by_row(threads, "thread_id", calls["thread_id"], ("pid", "tid")), "correlation_id",
                        "start_ns", "end_ns", "name_id")


def calls_of(con: duckdb.DuckDBPyConnection, trace_id: int, pid: pl.Series, correlation_id: pl.Series,
             columns: tuple[str, ...] = ("tid", "start_ns", "end_ns", "name_id")) -> pl.DataFrame:
    """`issuing_calls` of the work (pid, correlation_id) among the trace's ISSUING_CALLS with
    those ids, or among all its calls with them should some work's call be named otherwise."""
    among = correlation_id if len(correlation_id) <= SEMI_JOIN_MAX else None
    found = issuing_calls(api_calls(con, trace_id, among=among), pid, correlation_id, columns)
    key = found.columns[-1]
    if found[key].null_count() > correlation_id.null_count():
        everything = issuing_calls(api_calls(con, trace_id, None, among), pid, correlation_id, columns)
        if everything[key].null_count() < found[key].null_count():
            return everything
    return found


def issuing_calls(calls: pl.DataFrame, pid: pl.Series, correlation_id: pl.Series,
                  columns: tuple[str, ...] = ("tid", "start_ns", "end_ns", "name_id")) -> pl.DataFrame:
    """For each (pid, correlation_id) pair, the call of `calls` (`api_calls`' columns) with that
    key: `columns` of it, named tid, call_start_ns, call_end_ns, call_name_id, in the order of
    the pairs (nulls where no call has the key, as for work launched before the capture began)."""
    top = max(calls["correlation_id"].max() or 0, correlation_id.max() or 0)  # type: ignore[type-var]
    if top >= 1 << _KEY_BITS:
        return _joined(calls, pid, correlation_id).select(_renamed(columns))
    pids = pl.concat([calls["pid"].unique(), pid.unique()]).drop_nulls().unique().sort()
    if len(pids) <= 1:
        call_keys, wanted = calls["correlation_id"], correlation_id
    else:
        call_keys = pids.search_sorted(calls["pid"]).cast(pl.Int64) * (1 << _KEY_BITS) + calls["correlation_id"]
        wanted = pids.search_sorted(pid.fill_null(pids[0])).cast(pl.Int64) * (1 << _KEY_BITS) + correlation_id
    # a merge of the two key lists (sorted: nearly always already), then back to the pairs' order
    known = pl.DataFrame({"key": call_keys}).with_row_index("call")
    if not call_keys.is_sorted():
        known = known.sort("key")
    wanted_rows = pl.DataFrame({"key": wanted.fill_null(-1)}).with_row_index("pair")
    in_order = wanted_rows["key"].is_sorted()
    if not in_order:
        wanted_rows = wanted_rows.sort("key")
    found = wanted_rows.join_asof(known.rename({"key": "call_key"}), left_on="key", right_on="call_key",
                                  strategy="backward", check_sortedness=False)
    matched = found["call_key"] == found["key"]
    if pid.null_count():
        matched = matched & pid.gather(found["pair"]).is_not_null()
    rows = pl.select(pl.when(matched).then(found["call"])).to_series()
    if not in_order:
        rows = pl.repeat(None, len(rows), dtype=rows.dtype, eager=True).scatter(found["pair"], rows)
    return calls.select(pl.col(columns).gather(rows)).select(_renamed(columns))


def _renamed(columns: tuple[str, ...]) -> list[pl.Expr]:
    return [pl.col(c).alias(c if c == "tid" else f"call_{c}") for c in columns]


def _joined(calls: pl.DataFrame, pid: pl.Series, correlation_id: pl.Series) -> pl.DataFrame:
    """`issuing_calls` by a join, for ids that do not fit the packed key."""
    wanted = pl.DataFrame({"pid": pid, "correlation_id": correlation_id})
    calls = calls.unique(["pid", "correlation_id"], keep="first", maintain_order=True)  # one call a key, as above
    return (wanted.join(calls, on=["pid", "correlation_id"], how="left", maintain_order="left")
            .select("tid", "start_ns", "end_ns", "name_id"))
