"""Nsight Systems SQLite exports (`nsys export --type sqlite`), 2021 to 2026 schemas.

Tables are created lazily by nsys, columns come and go between versions (see
notes/trace-formats.md §4), so every column is looked up before it is selected and a missing
optional one becomes NULL. Rows stream through `scan_table`; names stay integer ids in
SQLite and are resolved in Arrow against StringIds.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from traceq.ingest import cupti
from traceq.ingest.base import (
    CUPTI_DEVICE_LIMITS,
    KERNEL_CONFIG_COLUMNS,
    KERNEL_QUEUE_COLUMNS,
    Names,
    Sink,
    SourceInfo,
    SqliteReader,
    Strings,
    api_names,
    api_threads,
    coalesce_text,
    enum_lookup,
    kernel_batch,
    kernel_configs,
    kernel_names,
    kernel_queues,
    key_rows,
    numbered,
    nvtx_attributes,
    nvtx_attributes_key,
    nvtx_batch,
    whole,
)
from traceq.ingest.launches import LAUNCHING, CallIndex, call_keys
from traceq.ingest.nsys_metrics import read_gpu_metrics
from traceq.ingest.sqlite_source import (
    column_names,
    fetch_batches,
    row_estimate,
    scan_table,
    select_columns,
    select_list,
    table_names,
)
from traceq.ingest.validate import check_columns, scaled, valid_times

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX = "NVTX_EVENTS"
MEMORY = "CUDA_GPU_MEMORY_USAGE_EVENTS"
GRAPH_NODES = "CUDA_GRAPH_NODE_EVENTS"
GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
"""A CUDA graph's replay as one activity: what nsys records by default (`--cuda-graph-trace=graph`)
instead of the graph's kernels. Each row is kept as one GPU operation, a kernel named
`[CUDA graph N]` (N: the graph's id), so that the GPU counts as busy and the replay as launched
by its cudaGraphLaunch; its kernels are not in the trace (`--cuda-graph-trace=node` records them)."""
EVENT_TABLES = (KERNEL, RUNTIME, MEMCPY, MEMSET, NVTX, MEMORY, GRAPH_NODES, GRAPH_TRACE)

REQUIRED = {
    KERNEL: ("start", "end"), GRAPH_TRACE: ("start", "end", "graphId"), RUNTIME: ("start", "end"), MEMCPY: ("start", "end"), MEMSET: ("start", "end"),
    NVTX: ("start", "eventType"), MEMORY: ("start", "memoryOperationType"), "StringIds": ("id", "value"),
}
"""Columns without which a table's rows mean nothing: a file lacking one is refused (others read as NULL)."""

NVTX_KIND = {34: "mark", 59: "pushpop", 60: "startend"}
NVTX_DOMAIN_CREATE = 75
API_KIND = {0: "runtime", 1: "driver"}

I64, I32, STR = pa.int64(), pa.int32(), pa.string()


def _schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema(list(fields))


class NsysReader(SqliteReader):
    """Reads an Nsight Systems SQLite export."""

    name: ClassVar[str] = "nsys"

    def sniff(self, tables: set[str]) -> bool:
        return "StringIds" in tables and (
            bool(tables & set(EVENT_TABLES))
            or bool(tables & {"TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU", "META_DATA_EXPORT",
                              "EXPORT_META_DATA", "TARGET_INFO_SESSION_START_TIME"})
        )

    def estimate_rows(self, src: sqlite3.Connection) -> int:
        return row_estimate(src, EVENT_TABLES)

    def read(self, src: sqlite3.Connection, sink: Sink) -> SourceInfo:
        tables = table_names(src)
        check_columns(src, tables, REQUIRED)
        strings = Strings.from_query(src, "SELECT id, value FROM StringIds", "StringIds")
        _read_gpus(src, tables, sink)
        _read_processes(src, tables, strings, sink)
        calls = CallIndex()  # the calls first, so that each kernel stores the one that launched it
        if RUNTIME in tables:
            names, threads, texts = Names(), Names(), []
            sink.append_all("api_events", _api_calls(src, names, threads, sink, strings, texts, calls))
            calls.finish()
            sink.append("api_names", api_names([API_KIND.get(c, "other") for c, _ in names.keys], texts),
                        source_rows=0)
            global_tids = pa.array([key[0] for key in threads.keys], I64)
            sink.append("api_threads", api_threads(_pid(global_tids).to_pylist(), _tid(global_tids).to_pylist(),
                                                   global_tids.to_pylist()), source_rows=0)
        if KERNEL in tables or GRAPH_TRACE in tables:
            names, graphs, configs, queues = Names(), Names(), Names(), Names()
            first_id = [0]
            if KERNEL in tables:
                sink.append_all("kernel_events", _kernels(src, names, configs, queues, sink, calls, KERNEL, first_id))
            if GRAPH_TRACE in tables:  # their names numbered after the kernels' (a graph's key is its id)
                sink.append_all("kernel_events", _kernels(src, graphs, configs, queues, sink, calls, GRAPH_TRACE,
                                                          first_id, name_offset=len(names.keys)))
            calls.close()
            demangled, short, mangled = (list(c) for c in (zip(*names.keys) if names.keys else ((), (), ())))
            graph_names = [f"[CUDA graph {key[0]}]" for key in graphs.keys]
            sink.append("kernel_names", kernel_names(_texts(strings, demangled) + graph_names,
                                                     _texts(strings, short) + graph_names,
                                                     _texts(strings, mangled) + [None] * len(graph_names)),
                        source_rows=0)
            sink.append("kernel_configs", kernel_configs(configs.keys, optin_code=cupti.SHMEM_LIMIT_OPTIN,
                                                         launch_types=cupti.LAUNCH_TYPE), source_rows=0)
            sink.append("kernel_queues", kernel_queues(queues.keys), source_rows=0)
        if MEMCPY in tables:
            sink.append_all("memops", _memcpy(src, sink))
        if MEMSET in tables:
            sink.append_all("memops", _memset(src, sink))
        if NVTX in tables:
            attributes = Names()
            sink.append_all("nvtx_events", _nvtx(src, strings, attributes, sink))
            sink.append("nvtx_attributes", nvtx_attributes(attributes.keys), source_rows=0)
        if MEMORY in tables:
            sink.append_all("memory_events", _memory_events(src, sink))
        if GRAPH_NODES in tables:
            sink.append_all("graph_nodes", _graph_nodes(src))
        read_gpu_metrics(src, tables, sink)
        return _source_info(src, tables)


def _texts(strings: Strings, ids: Sequence[int | None]) -> list[str | None]:
    """The strings that StringIds ids stand for (None for a NULL or unknown id)."""
    return strings.lookup(pa.array(ids, I64)).to_pylist()


def _kernels(src: sqlite3.Connection, names: Names, configs: Names, queues: Names, sink: Sink,
             calls: CallIndex, table: str = KERNEL, first_id: list[int] | None = None,
             name_offset: int = 0) -> Iterator[pa.Table]:
    """kernel_events rows of `table` (KERNEL, or GRAPH_TRACE: graph replays as kernels whose
    name key is the graph's id alone); `names` numbers the (demangled, short, mangled)
    StringIds ids of each (its name ids start at `name_offset`), `configs` its launch
    configuration (KERNEL_CONFIG_COLUMNS), `queues` its KERNEL_QUEUE_COLUMNS, `calls` gives its
    launching call; rows with unusable times are dropped (into `sink.damage`). Kernel ids
    continue from first_id[0], which is advanced."""
    first_id = [0] if first_id is None else first_id
    have = column_names(src, table)
    wanted = [
        ("start_ns", "start", ["start"]),
        ("end_ns", '"end"', ["end"]),
        ("device_id", "deviceId", ["deviceId"]),
        ("context_id", "contextId", ["contextId"]),
        ("stream_id", "streamId", ["streamId"]),
        ("correlation_id", "correlationId", ["correlationId"]),
        ("pid", "globalPid", ["globalPid"]),  # decoded below: Arrow does it faster than SQLite
        ("demangled_id", "demangledName", ["demangledName"]),
        ("short_id", "shortName", ["shortName"]),
        ("mangled_id", "mangledName", ["mangledName"]),
        ("grid_x", "gridX", ["gridX"]), ("grid_y", "gridY", ["gridY"]), ("grid_z", "gridZ", ["gridZ"]),
        ("block_x", "blockX", ["blockX"]), ("block_y", "blockY", ["blockY"]),
        ("block_z", "blockZ", ["blockZ"]),
        ("registers_per_thread", "registersPerThread", ["registersPerThread"]),
        ("smem_static_bytes", "staticSharedMemory", ["staticSharedMemory"]),
        ("smem_dynamic_bytes", "dynamicSharedMemory", ["dynamicSharedMemory"]),
        ("smem_carveout_bytes", "sharedMemoryExecuted", ["sharedMemoryExecuted"]),
        ("smem_optin", "sharedMemoryLimitConfig", ["sharedMemoryLimitConfig"]),  # codes: kernel_configs
        ("local_memory_per_thread_bytes", "localMemoryPerThread", ["localMemoryPerThread"]),
        ("local_memory_total_bytes", "localMemoryTotal", ["localMemoryTotal"]),
        ("launch_type", "launchType", ["launchType"]),
        ("graph_node_id", "graphNodeId", ["graphNodeId"]),  # 0: not from a graph
    ]
    if table == GRAPH_TRACE:
        override = {"demangled_id": ("graphId", ["graphId"]), "short_id": ("NULL", []), "mangled_id": ("NULL", [])}
        wanted = [(alias, *override.get(alias, (expr, needs))) for alias, expr, needs in wanted]
    schema = _schema(*[(w[0], I64) for w in wanted])

    def columns(batch: pa.Table) -> pa.Table:  # on the reading threads
        batch = valid_times(batch, "kernel_events", sink.damage)
        node = batch["graph_node_id"]
        batch = (batch
                 .set_column(batch.schema.get_field_index("pid"), "pid", _pid(batch["pid"]))
                 .set_column(batch.schema.get_field_index("graph_node_id"), "graph_node_id",
                             pc.if_else(pc.equal(node, 0), pa.scalar(None, I64), node)))
        for column, values in calls.launches(call_keys(batch["pid"], batch["correlation_id"])).items():
            batch = batch.append_column(column, values)
        return (batch  # the keys of the decoded columns
                .append_column("name_key", key_rows(batch["demangled_id"], batch["short_id"], batch["mangled_id"]))
                .append_column("config_key", key_rows(*[batch[c] for c in KERNEL_CONFIG_COLUMNS]))
                .append_column("queue_key", key_rows(*[batch[c] for c in KERNEL_QUEUE_COLUMNS])))

    for batch in scan_table(src, table, select_columns(have, wanted), schema, transform=columns):
        name_id = names.number_keys(batch["name_key"])
        if name_offset:
            name_id = pc.add(name_id, pa.scalar(name_offset, pa.int32()))
        yield numbered(kernel_batch(batch, name_id=name_id,
                                    config_id=configs.number_keys(batch["config_key"]),
                                    queue_id=queues.number_keys(batch["queue_key"])), first_id[0])
        first_id[0] += batch.num_rows


def _api_calls(src: sqlite3.Connection, names: Names, threads: Names, sink: Sink, strings: Strings,
               texts: list[str | None], calls: CallIndex) -> Iterator[pa.Table]:
    """api_events rows; `names` numbers the (event class, StringIds id) of each call, and `texts`
    gets each name's text as it is numbered; `threads` numbers its globalTid (the decoded pid and
    tid go once per thread into api_threads); `calls` keeps the runtime and driver calls that
    launch kernels."""
    have = column_names(src, RUNTIME)
    wanted = [
        ("start_ns", "start", ["start"]),
        ("end_ns", '"end"', ["end"]),
        ("event_class", "eventClass", ["eventClass"]),
        ("name_id", "nameId", ["nameId"]),
        ("correlation_id", "correlationId", ["correlationId"]),
        ("global_tid", "globalTid", ["globalTid"]),
        ("return_value", "returnValue", ["returnValue"]),
    ]
    schema = _schema(*[(w[0], I64) for w in wanted])

    def columns(batch: pa.Table) -> pa.Table:  # on the reading threads
        batch = valid_times(batch, "api_events", sink.damage)
        return (batch.append_column("name_key", key_rows(batch["event_class"], batch["name_id"]))
                .append_column("thread_key", key_rows(batch["global_tid"]))
                .append_column("launch_key", call_keys(_pid(batch["global_tid"]), batch["correlation_id"])))

    launching: list[bool] = []  # per name id: a runtime or driver call that launches kernels
    for batch in scan_table(src, RUNTIME, select_columns(have, wanted), schema, transform=columns):
        name_id = names.number_keys(batch["name_key"])
        if len(texts) < len(names.keys):
            new = names.keys[len(texts):]
            texts += _texts(strings, [sid for _, sid in new])
            launching += [c in API_KIND and bool(LAUNCHING.search(t or ""))
                          for (c, _), t in zip(new, texts[-len(new):])]
        keys = pc.if_else(pc.take(pa.array(launching), name_id), batch["launch_key"], pa.scalar(None, I64))
        rows = pa.table({
            "start_ns": batch["start_ns"],
            "end_ns": batch["end_ns"],
            "name_id": name_id,
            "thread_id": threads.number_keys(batch["thread_key"]),
            "correlation_id": batch["correlation_id"],
            "return_value": batch["return_value"],
        })
        calls.add(keys, rows["start_ns"], rows["end_ns"], name_id, rows["thread_id"])
        yield rows


def _memcpy(src: sqlite3.Connection, sink: Sink) -> Iterator[pa.Table]:
    have = column_names(src, MEMCPY)
    wanted = [
        ("start_ns", "start", ["start"]), ("end_ns", '"end"', ["end"]),
        ("copy_kind", "copyKind", ["copyKind"]), ("src_kind", "srcKind", ["srcKind"]),
        ("dst_kind", "dstKind", ["dstKind"]), ("bytes", "bytes", ["bytes"]),
        ("device_id", "deviceId", ["deviceId"]), ("context_id", "contextId", ["contextId"]),
        ("stream_id", "streamId", ["streamId"]), ("correlation_id", "correlationId", ["correlationId"]),
        ("pid", "globalPid", ["globalPid"]),
    ]
    schema = _schema(*[(w[0], I64) for w in wanted])

    def columns(batch: pa.Table) -> pa.Table:
        batch = valid_times(batch, "memops", sink.damage)
        cols = {c: batch[c] for c in batch.column_names}
        cols["pid"] = _pid(cols["pid"])
        cols["dur_ns"] = pc.subtract(cols["end_ns"], cols["start_ns"])
        cols["op"] = pa.array(["memcpy"] * batch.num_rows, type=STR)
        cols["copy_kind"] = enum_lookup(whole(cols["copy_kind"]), cupti.MEMCPY_KIND)
        cols["src_kind"] = enum_lookup(whole(cols["src_kind"]), cupti.MEMORY_KIND)
        cols["dst_kind"] = enum_lookup(whole(cols["dst_kind"]), cupti.MEMORY_KIND)
        return pa.table(cols)

    yield from scan_table(src, MEMCPY, select_columns(have, wanted), schema, transform=columns)


def _memset(src: sqlite3.Connection, sink: Sink) -> Iterator[pa.Table]:
    have = column_names(src, MEMSET)
    wanted = [
        ("start_ns", "start", ["start"]), ("end_ns", '"end"', ["end"]),
        ("value", "value", ["value"]), ("bytes", "bytes", ["bytes"]),
        ("dst_kind", "memKind", ["memKind"]),
        ("device_id", "deviceId", ["deviceId"]), ("context_id", "contextId", ["contextId"]),
        ("stream_id", "streamId", ["streamId"]), ("correlation_id", "correlationId", ["correlationId"]),
        ("pid", "globalPid", ["globalPid"]),
    ]
    schema = _schema(*[(w[0], I64) for w in wanted])

    def columns(batch: pa.Table) -> pa.Table:
        batch = valid_times(batch, "memops", sink.damage)
        cols = {c: batch[c] for c in batch.column_names}
        cols["pid"] = _pid(cols["pid"])
        cols["dur_ns"] = pc.subtract(cols["end_ns"], cols["start_ns"])
        cols["op"] = pa.array(["memset"] * batch.num_rows, type=STR)
        cols["dst_kind"] = enum_lookup(whole(cols["dst_kind"]), cupti.MEMORY_KIND)
        return pa.table(cols)

    yield from scan_table(src, MEMSET, select_columns(have, wanted), schema, transform=columns)


def _nvtx(src: sqlite3.Connection, strings: Strings, attributes: Names, sink: Sink) -> Iterator[pa.Table]:
    """nvtx_events rows; `attributes` numbers the NVTX_ATTRIBUTE_COLUMNS of each."""
    have = column_names(src, NVTX)
    domains = {}
    if "domainId" in have:  # a scan of the whole table: on the reading threads, like the rows
        created = _schema(("domain_id", I64), ("global_tid", I64), ("text", STR))
        for batch in scan_table(src, NVTX, [("domain_id", "domainId"), ("global_tid", "globalTid"), ("text", "text")],
                                created, f"eventType = {NVTX_DOMAIN_CREATE}"):
            for domain_id, gtid, text in zip(*(batch[c].to_pylist() for c in created.names)):
                domains[(domain_id, (gtid or 0) // 16777216 % 16777216)] = text
    wanted = [
        ("start_ns", "start", ["start"]),
        ("end_ns", '"end"', ["end"]),
        ("event_type", "eventType", ["eventType"]),
        ("text", "text", ["text"]),
        ("text_id", "textId", ["textId"]),
        ("domain_id", "domainId", ["domainId"]),
        ("category", "category", ["category"]),
        ("color", "color", ["color"]),
        ("global_tid", "globalTid", ["globalTid"]),
        ("end_global_tid", "endGlobalTid", ["endGlobalTid"]),
    ]
    types = {"text": STR}
    schema = _schema(*[(w[0], types.get(w[0], I64)) for w in wanted])
    kinds = ", ".join(str(k) for k in NVTX_KIND)
    known = [(d * 16777216 + p, text) for (d, p), text in domains.items()
             if d is not None and 0 <= d < 2**38]  # a larger id is damage: its key would pass 64 bits
    domain_keys = pa.array([k for k, _ in known], type=I64)
    domain_names = pa.array([t for _, t in known], type=STR)

    def columns(batch: pa.Table) -> pa.Table:
        batch = valid_times(batch, "nvtx_events", sink.damage, end_required=False)  # marks have no end
        gtid = batch["global_tid"]
        pid = _pid(gtid)
        if domains:
            key = pc.add(pc.multiply(batch["domain_id"], 16777216), pid)
            domain = pc.take(domain_names, pc.index_in(key, value_set=domain_keys))
        else:
            domain = pa.nulls(batch.num_rows, STR)
        rows = pa.table({
            "start_ns": batch["start_ns"],
            "end_ns": batch["end_ns"],
            "kind": enum_lookup(whole(batch["event_type"]), NVTX_KIND),
            "name": coalesce_text(whole(batch["text"]),
                                  strings.dictionary(whole(batch["text_id"]))),
            "domain": domain,
            "category": batch["category"],
            "color": batch["color"],
            "pid": pid,
            "tid": _tid(gtid),
            "global_tid": gtid,
            "end_tid": _tid(batch["end_global_tid"]),
        })
        return rows.append_column("attributes_key", nvtx_attributes_key(rows))

    for batch in scan_table(src, NVTX, select_columns(have, wanted), schema, f"eventType IN ({kinds})", columns):
        yield nvtx_batch(batch, attributes)


def _memory_events(src: sqlite3.Connection, sink: Sink) -> Iterator[pa.Table]:
    have = column_names(src, MEMORY)
    wanted = [
        ("ts_ns", "start", ["start"]),
        ("op", "memoryOperationType", ["memoryOperationType"]),
        ("bytes", "bytes", ["bytes"]),
        ("address", "address", ["address"]),
        ("mem_kind", "memKind", ["memKind"]),
        ("device_id", "deviceId", ["deviceId"]), ("context_id", "contextId", ["contextId"]),
        ("stream_id", "streamId", ["streamId"]), ("correlation_id", "correlationId", ["correlationId"]),
        ("pid", "globalPid", ["globalPid"]),
    ]
    schema = _schema(*[(w[0], I64) for w in wanted])

    def columns(batch: pa.Table) -> pa.Table:
        batch = valid_times(batch, "memory_events", sink.damage)
        cols = {c: batch[c] for c in batch.column_names}
        cols["pid"] = _pid(cols["pid"])
        cols["op"] = enum_lookup(whole(cols["op"]), cupti.MEMORY_OPERATION)
        cols["mem_kind"] = enum_lookup(whole(cols["mem_kind"]), cupti.MEMORY_KIND)
        cols["address"] = pc.cast(cols["address"], pa.uint64(), safe=False)
        return pa.table(cols)

    yield from scan_table(src, MEMORY, select_columns(have, wanted), schema, transform=columns)


def _graph_nodes(src: sqlite3.Connection) -> Iterator[pa.Table]:
    have = column_names(src, GRAPH_NODES)
    wanted = [
        ("graph_node_id", "graphNodeId", ["graphNodeId"]),
        ("original_graph_node_id", "originalGraphNodeId", ["originalGraphNodeId"]),
        ("created_ns", "start", ["start"]),
        ("global_tid", "globalTid", ["globalTid"]),
    ]
    schema = _schema(*[(w[0], I64) for w in wanted])

    def columns(batch: pa.Table) -> pa.Table:
        gtid = batch["global_tid"]
        return batch.drop_columns(["global_tid"]).append_column("pid", _pid(gtid)).append_column("tid", _tid(gtid))

    yield from scan_table(src, GRAPH_NODES, select_columns(have, wanted), schema, transform=columns)


def _read_gpus(src: sqlite3.Connection, tables: set[str], sink: Sink) -> None:
    if "TARGET_INFO_GPU" in tables:
        have = column_names(src, "TARGET_INFO_GPU")
        wanted = [
            ("device_id", "id", ["id"]), ("name", "name", ["name"]),
            ("cc_major", "computeMajor", ["computeMajor"]), ("cc_minor", "computeMinor", ["computeMinor"]),
            ("sm_count", "smCount", ["smCount"]), ("clock_hz", "clockRate", ["clockRate"]),
            ("memory_bytes", "totalMemory", ["totalMemory"]),
            ("memory_bandwidth_bytes_per_s", "memoryBandwidth", ["memoryBandwidth"]),
            ("l2_cache_bytes", "l2CacheSize", ["l2CacheSize"]),
            ("threads_per_warp", "threadsPerWarp", ["threadsPerWarp"]),
            ("max_threads_per_block", "maxThreadsPerBlock", ["maxThreadsPerBlock"]),
            ("max_warps_per_sm", "maxWarpsPerSm", ["maxWarpsPerSm"]),
            ("max_blocks_per_sm", "maxBlocksPerSm", ["maxBlocksPerSm"]),
            ("max_registers_per_sm", "maxRegistersPerSm", ["maxRegistersPerSm"]),
            ("max_registers_per_block", "maxRegistersPerBlock", ["maxRegistersPerBlock"]),
            ("max_smem_per_sm_bytes", "maxShmemPerSm", ["maxShmemPerSm"]),
            ("max_smem_per_block_bytes", "maxShmemPerBlock", ["maxShmemPerBlock"]),
            ("max_smem_per_block_optin_bytes", "maxShmemPerBlockOptin", ["maxShmemPerBlockOptin"]),
        ]
        sql = f"SELECT DISTINCT {select_list(have, wanted)} FROM TARGET_INFO_GPU ORDER BY 1"
    elif "TARGET_INFO_CUDA_GPU" in tables:
        have = column_names(src, "TARGET_INFO_CUDA_GPU")
        # The pre-2021.3 table: CUPTI device-record columns, clock in kHz, memory in MiB and
        # bandwidth in MB/s (a V100 row reads 1380000, 32510, 947802).
        wanted = [
            ("device_id", "deviceId", ["deviceId"]), ("name", "name", ["name"]),
            ("clock_hz", "coreClockRate", ["coreClockRate"]),  # scaled below
            ("memory_bytes", "globalMemorySize", ["globalMemorySize"]),
            ("memory_bandwidth_bytes_per_s", "globalMemoryBandwidth", ["globalMemoryBandwidth"]),
            *CUPTI_DEVICE_LIMITS,
            ("max_smem_per_block_optin_bytes", "NULL", []),
        ]
        units = {"clock_hz": 1000, "memory_bytes": 1048576, "memory_bandwidth_bytes_per_s": 1000000}
        sql = f"SELECT DISTINCT {select_list(have, wanted)} FROM TARGET_INFO_CUDA_GPU ORDER BY 1"
    else:
        return
    types = {"name": STR}
    schema = _schema(*[(w[0], types.get(w[0], I64)) for w in wanted])
    table = "TARGET_INFO_GPU" if "TARGET_INFO_GPU" in tables else "TARGET_INFO_CUDA_GPU"
    for batch in fetch_batches(src, sql, schema, source=table):
        if table == "TARGET_INFO_CUDA_GPU":
            batch = scaled(batch, units, sink.damage, table)
        sink.append("gpus", batch)


def _read_processes(src: sqlite3.Connection, tables: set[str], strings: Strings, sink: Sink) -> None:
    if "PROCESSES" in tables:
        schema = _schema(("pid", I64), ("name", STR))
        columns = select_list(column_names(src, "PROCESSES"), [("pid", "pid", ["pid"]), ("name", "name", ["name"])])
        for batch in fetch_batches(src, f"SELECT DISTINCT {columns} FROM PROCESSES", schema, source="PROCESSES"):
            sink.append("processes", batch)
    if "ThreadNames" in tables:
        schema = _schema(("global_tid", I64), ("name_id", I64))
        columns = select_list(column_names(src, "ThreadNames"), [("global_tid", "globalTid", ["globalTid"]),
                                                                  ("name_id", "nameId", ["nameId"])])
        for batch in fetch_batches(src, f"SELECT {columns} FROM ThreadNames", schema, source="ThreadNames"):
            gtid = batch["global_tid"]
            sink.append("threads", pa.table({
                "pid": _pid(gtid), "tid": _tid(gtid),
                "name": strings.lookup(whole(batch["name_id"])),
            }))


def _source_info(src: sqlite3.Connection, tables: set[str]) -> SourceInfo:
    """Producer, schema version and session start: descriptive, so a table or column missing
    (or a damaged value) leaves them unknown rather than refusing the file."""
    meta: dict[str, str] = {}
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in tables and {"name", "value"} <= column_names(src, table):
            meta.update({str(k): str(v) for k, v in src.execute(f"SELECT name, value FROM {table}")})
    tool = None
    if "EXPORT_PRODUCT_VERSION" in meta:
        tool = f"{meta.get('EXPORT_PRODUCT_NAME', 'NVIDIA Nsight Systems')} {meta['EXPORT_PRODUCT_VERSION']}"
    start = None
    session = "TARGET_INFO_SESSION_START_TIME"
    if session in tables and "utcEpochNs" in column_names(src, session):
        for batch in fetch_batches(src, f"SELECT utcEpochNs FROM {session} LIMIT 1", _schema(("t", I64)),
                                   source=session):
            start = batch["t"][0].as_py()
    return SourceInfo(format="nsys", tool=tool, schema_version=meta.get("EXPORT_SCHEMA_VERSION"),
                      session_start_utc_ns=start)


def _pid(global_id: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pc.bit_wise_and(pc.shift_right(global_id, 24), 0xFFFFFF)


def _tid(global_id: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pc.bit_wise_and(global_id, 0xFFFFFF)
