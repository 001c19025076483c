"""Legacy nvprof databases (`nvprof -o run.nvvp`, also .sqlite/.prof/.nvprof), Version 8 to 22.

Each table holds CUPTI activity records of one kind, a column per field (notes/trace-formats.md
§4.11). What this reader decides, checked on the 13 real databases in realtraces/nvprof_sqlite:

- Time: nvprof stores nanoseconds since the Unix epoch. The earliest timestamp among kernels,
  memcpy/memset, API calls and markers is time zero and `session_start_utc_ns`, so times are
  session-relative as with nsys. A timestamp of 0 is CUPTI's "unknown": such records are dropped
  (and counted, as are those with end < start), like kernels still running when nvprof stopped
  (start = end = 0 in one qcu file). Time zero is taken among timestamps of the years 2000 to
  2100 only, so that one damaged record cannot move it (traceq.ingest.validate has the rest).
- Kernels: CONCURRENT_KERNEL, plus KERNEL (filled instead with --analysis-metrics or
  --concurrent-kernels off) less the rows whose (correlationId, deviceId) CONCURRENT_KERNEL also
  holds, which are the same launches. `name` is a StringTable id of the mangled symbol; cxxfilt
  demangles each distinct symbol once; unmangled names (cuBLAS's `volta_sgemm_128x64_nn`, PGI's
  `main_69_gpu`) stay as they are.
- Processes: GPU records carry no pid. A database holds one process, whose id the API calls and
  the NAME table give; if a database holds several, each GPU record takes the pid of the API call
  with its correlationId.
- API calls: RUNTIME and DRIVER name calls by callback id (`cupti_cbid`); `threadId` is stored
  signed, so it is masked to 32 bits. It is `pthread_self()` cut to 32 bits, not the OS tid.
- objectId (MARKER, NAME) is CUPTI's CUpti_ActivityObjectKindId union, 12 bytes: little-endian
  uint32 processId, uint32 threadId, then 4 bytes of the union's other member (zero in marker
  rows, left-over bytes in NAME rows). The threadId equals the API calls' masked threadId.
  PyProf's reading (int32 pid + int64 tid) agrees only while those last 4 bytes are zero.
- NVTX: a range is a start row (flag 2) and an end row (flag 4) with the same id; marks (flag 1)
  have no end. CUPTI records nvtxRangePush/Pop and nvtxRangeStart/End alike, so the kind comes
  from the shape: a range that ends on its own thread, nested inside the ranges still open in its
  (thread, domain), is 'pushpop'; one that ends on another thread, or ends after the range it
  opened in, is 'startend'. A start/end pair that happens to nest reads as 'pushpop', which
  behaves the same. Starts without an end are dropped. `domain` is a StringTable id, 0 for the
  default domain. MARKER_DATA gives color (ARGB, when its flags say so) and category.
- Devices: DEVICE clocks are kHz and bandwidth kB/s (cupti_activity.h), stored as Hz and B/s.
- Enumerations use CUPTI's numbering, which differs from nsys's ENUM tables for memory kinds
  (CUPTI 0 = unknown, nsys 0 = pageable) and launch types (CUPTI 0 = regular).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import ClassVar

import cxxfilt
import pyarrow as pa
import pyarrow.compute as pc

from traceq.ingest import cupti, cupti_cbid
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
    enum_lookup,
    kernel_batch,
    kernel_configs,
    kernel_names,
    kernel_queues,
    numbered,
    nvtx_attributes,
    nvtx_batch,
)
from traceq.ingest.sqlite_source import column_names, fetch_batches, row_estimate, select_list, table_names
from traceq.ingest.validate import check_columns, scaled, to_arrow, valid_times

_KIND = "CUPTI_ACTIVITY_KIND_"
CONCURRENT_KERNEL = _KIND + "CONCURRENT_KERNEL"
KERNEL = _KIND + "KERNEL"
RUNTIME = _KIND + "RUNTIME"
DRIVER = _KIND + "DRIVER"
MEMCPY = _KIND + "MEMCPY"
MEMCPY2 = _KIND + "MEMCPY2"  # peer-to-peer copies
MEMSET = _KIND + "MEMSET"
MARKER = _KIND + "MARKER"
MARKER_DATA = _KIND + "MARKER_DATA"
DEVICE = _KIND + "DEVICE"
NAME = _KIND + "NAME"
KERNEL_TABLES = (CONCURRENT_KERNEL, KERNEL)
API_TABLES = {RUNTIME: ("runtime", cupti_cbid.RUNTIME), DRIVER: ("driver", cupti_cbid.DRIVER)}
SPAN_TABLES = (*KERNEL_TABLES, RUNTIME, DRIVER, MEMCPY, MEMCPY2, MEMSET)
EVENT_TABLES = (*SPAN_TABLES, MARKER)
REQUIRED = ({t: ("start", "end") for t in SPAN_TABLES} | {MARKER: ("flags", "timestamp", "id")}
            | {"StringTable": ("_id_", "value")})
"""Columns without which a table's rows mean nothing: a file lacking one is refused."""
START, END = "NULLIF(start, 0)", 'NULLIF("end", 0)'  # 0: CUPTI's unknown timestamp
EPOCH_2000_NS, EPOCH_2100_NS = 946_684_800 * 10**9, 4_102_444_800 * 10**9
"""The timestamps time zero is chosen among (ns since the Unix epoch)."""

# cupti_activity.h enumerations.
MEMORY_KIND = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed",
               6: "Device Static", 7: "Managed Static"}
LAUNCH_TYPE = {0: "regular", 1: "cooperative", 2: "cooperative_multi_device"}
OBJECT_PROCESS, OBJECT_THREAD = 1, 2
MARKER_INSTANT, MARKER_START, MARKER_END = 1, 2, 4
MARKER_COLOR_ARGB = 2

I64, STR, BIN = pa.int64(), pa.string(), pa.binary()


class NvprofReader(SqliteReader):
    """Reads an nvprof database."""

    name: ClassVar[str] = "nvprof"

    def sniff(self, tables: set[str]) -> bool:
        return "StringTable" in tables and any(t.startswith(_KIND) for t in tables)

    def estimate_rows(self, src: sqlite3.Connection) -> int:
        return row_estimate(src, EVENT_TABLES)

    def read(self, src: sqlite3.Connection, sink: Sink) -> SourceInfo:
        tables = table_names(src)
        check_columns(src, tables, REQUIRED)
        t0 = _time_zero(src, tables)
        # _id_ 0 is the '-- null --' placeholder: no name, the default NVTX domain (looked up as NULL).
        strings = Strings.from_query(src, "SELECT _id_, value FROM StringTable WHERE _id_ > 0", "StringTable")
        return _read(src, tables, t0, strings, sink)


def _read(src: sqlite3.Connection, tables: set[str], t0: int, strings: Strings, sink: Sink) -> SourceInfo:
    pid = _pid_sql(src, tables)
    if DEVICE in tables:
        _read_gpus(src, strings, sink)
    if NAME in tables:
        _read_names(src, strings, sink)
    _read_kernels(src, tables, strings, t0, pid, sink)
    api, threads = Names(), Names()
    for table in API_TABLES:
        if table in tables:
            _read_api_calls(src, table, t0, api, threads, sink)
    if api.keys:
        sink.append("api_names", _api_names(api), source_rows=0)
        pids, tids = zip(*threads.keys)
        sink.append("api_threads", api_threads(pids, tids, [None] * len(pids)), source_rows=0)
    for table in (MEMCPY, MEMCPY2, MEMSET):
        if table in tables:
            _read_memops(src, table, t0, pid, sink)
    if MARKER in tables:
        _read_nvtx(src, tables, strings, t0, sink)
    version = None
    if "Version" in tables:
        row = src.execute("SELECT * FROM Version LIMIT 1").fetchone()
        version = str(row[0]) if row else None
    return SourceInfo(format="nvprof", schema_version=version,
                      session_start_utc_ns=t0 or None)


def _time_zero(src: sqlite3.Connection, tables: set[str]) -> int:
    """The earliest event timestamp (ns since the epoch) of the years 2000 to 2100 in a record
    whose end is not before its start, or 0 when there is none."""
    def plausible(column: str) -> str:
        return f"typeof({column}) = 'integer' AND {column} BETWEEN {EPOCH_2000_NS} AND {EPOCH_2100_NS}"

    end = plausible('"end"')
    parts = [f'SELECT min(start) AS t FROM "{t}" WHERE {plausible("start")} AND {end} AND "end" >= start'
             for t in SPAN_TABLES if t in tables]
    if MARKER in tables:
        parts.append(f"SELECT min(timestamp) AS t FROM {MARKER} WHERE {plausible('timestamp')}")
    if not parts:
        return 0
    row = src.execute(f"SELECT min(t) FROM ({' UNION ALL '.join(parts)})").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _pid_sql(src: sqlite3.Connection, tables: set[str]) -> str:
    """SQL for the pid of a GPU record `x`: the one process, or its API call's when several."""
    pids: set[int] = set()
    for table in API_TABLES:
        if table in tables:
            pids |= {r[0] for r in src.execute(f"SELECT DISTINCT processId FROM {table}") if type(r[0]) is int}
    if NAME in tables:
        for kind, obj in src.execute(f"SELECT objectKind, objectId FROM {NAME}"):
            if kind == OBJECT_PROCESS and isinstance(obj, bytes) and len(obj) >= 4:
                pids.add(int.from_bytes(obj[:4], "little"))
    if len(pids) <= 1:
        return str(pids.pop()) if pids else "NULL"
    lookups = [f"(SELECT processId FROM {t} a WHERE a.correlationId = x.correlationId LIMIT 1)"
               for t in API_TABLES if t in tables]
    return f"coalesce({', '.join(lookups)}, NULL)"


def _read_kernels(src: sqlite3.Connection, tables: set[str], strings: Strings, t0: int, pid: str,
                  sink: Sink) -> None:
    present = [t for t in KERNEL_TABLES if t in tables]
    if not present:
        return
    selects = []
    for table in present:
        have = column_names(src, table)
        total = "coalesce(localMemoryTotal_v2, localMemoryTotal)" if "localMemoryTotal_v2" in have \
            else "localMemoryTotal"
        wanted = [
            ("start_ns", START, ["start"]),  # made relative to t0 by valid_times
            ("end_ns", END, ["end"]),
            ("device_id", "deviceId", ["deviceId"]),
            ("context_id", "contextId", ["contextId"]),
            ("stream_id", "streamId", ["streamId"]),
            ("correlation_id", "correlationId", ["correlationId"]),
            ("pid", pid, ["correlationId"]),
            ("name_id", "name", ["name"]),
            ("grid_x", "gridX", ["gridX"]), ("grid_y", "gridY", ["gridY"]), ("grid_z", "gridZ", ["gridZ"]),
            ("block_x", "blockX", ["blockX"]), ("block_y", "blockY", ["blockY"]),
            ("block_z", "blockZ", ["blockZ"]),
            ("registers_per_thread", "registersPerThread", ["registersPerThread"]),
            ("smem_static_bytes", "staticSharedMemory", ["staticSharedMemory"]),
            ("smem_dynamic_bytes", "dynamicSharedMemory", ["dynamicSharedMemory"]),
            ("smem_carveout_bytes", "sharedMemoryExecuted", ["sharedMemoryExecuted"]),
            ("smem_optin", "shmemLimitConfig", ["shmemLimitConfig"]),
            ("local_memory_per_thread_bytes", "localMemoryPerThread", ["localMemoryPerThread"]),
            ("local_memory_total_bytes", total, ["localMemoryTotal"]),
            ("launch_type", "launchType", ["launchType"]),
            ("graph_node_id", "NULLIF(graphNodeId, 0)", ["graphNodeId"]),
        ]
        where = "1"
        if table == KERNEL and CONCURRENT_KERNEL in tables:
            where += (f" AND NOT EXISTS (SELECT 1 FROM {CONCURRENT_KERNEL} c "
                      "WHERE c.correlationId = x.correlationId AND c.deviceId = x.deviceId)")
        selects.append(f"SELECT {select_list(have, wanted)} FROM {table} x WHERE {where}")
    symbols = _kernel_names(src, present, strings)
    schema = pa.schema([(w[0], I64) for w in wanted])
    names, configs, queues = Names(), Names(), Names()

    def kernels() -> Iterator[pa.Table]:
        offset = 0
        for batch in fetch_batches(src, " UNION ALL ".join(selects), schema, source=" and ".join(present)):
            batch = valid_times(batch, "kernel_events", sink.damage, t0)
            yield numbered(kernel_batch(batch, name_id=names.number(batch["name_id"]),
                                        config_id=configs.number(*[batch[c] for c in KERNEL_CONFIG_COLUMNS]),
                                        queue_id=queues.number(*[batch[c] for c in KERNEL_QUEUE_COLUMNS])),
                           offset)
            offset += batch.num_rows

    sink.append_all("kernel_events", kernels())
    sink.append("kernel_configs", kernel_configs(configs.keys, optin_code=cupti.SHMEM_LIMIT_OPTIN,
                                                 launch_types=LAUNCH_TYPE), source_rows=0)
    sink.append("kernel_queues", kernel_queues(queues.keys), source_rows=0)
    ids = pa.array([key[0] for key in names.keys], I64)
    sink.append("kernel_names", kernel_names(symbols.demangled.lookup(ids).to_pylist(),
                                             symbols.short.lookup(ids).to_pylist(),
                                             symbols.mangled.lookup(ids).to_pylist()), source_rows=0)


class _KernelNames:
    """Mangled (as stored), demangled and short names for the StringTable ids kernels use."""

    def __init__(self, ids: list[int], symbols: list[str | None]):
        pairs = [demangle(s) if s is not None else (None, None) for s in symbols]
        self.mangled = Strings(ids, symbols)
        self.demangled = Strings(ids, [p[0] for p in pairs])
        self.short = Strings(ids, [p[1] for p in pairs])


def _kernel_names(src: sqlite3.Connection, tables: Iterable[str], strings: Strings) -> _KernelNames:
    ids: set[int] = set()
    for table in tables:
        ids |= {r[0] for r in src.execute(f"SELECT DISTINCT name FROM {table}") if type(r[0]) is int}
    ordered = sorted(ids)
    return _KernelNames(ordered, strings.lookup(pa.array(ordered, type=I64)).to_pylist())


@lru_cache(maxsize=1 << 16)
def demangle(symbol: str) -> tuple[str, str]:
    """(demangled name, short name) of a kernel symbol.

    The short name is the function's own name without namespaces, template arguments or
    parameters, like nsys's shortName. Names that are not mangled C++ come back unchanged.
    """
    if not symbol.startswith("_Z"):
        return symbol, symbol
    try:
        full = cxxfilt.demangle(symbol, external_only=False)
    except cxxfilt.InvalidName:
        return symbol, symbol
    return full, base_name(full) or full


_OPEN, _CLOSE = "<([{", ">)]}"


def base_name(demangled: str) -> str:
    """'void ns::kernel<int, 4>(float*, int) const' -> 'kernel', from cxxfilt's output.

    Brackets are masked out first, so '::', spaces and parentheses inside template arguments
    (lambdas, function types) are not mistaken for the name's own.
    """
    mask = _mask(demangled)
    head = len(demangled)
    args = mask.rfind("(")
    if args > 0 and "::" not in mask[args:]:  # the last top-level (...) is the parameter list
        head = args
    while head and mask[head - 1] == " ":
        head -= 1
    if head and mask[head - 1] == ">":  # template arguments of the function itself
        head = mask.rfind("<", 0, head)
    scope = mask.rfind("::", 0, head)
    start = max(scope + 2 if scope >= 0 else 0, mask.rfind(" ", 0, head) + 1)
    return demangled[start:head].strip()


def _mask(text: str) -> str:
    """`text` with everything inside brackets blanked, keeping the outermost brackets in place."""
    out, depth = list(text), 0
    for i, ch in enumerate(text):
        if ch in "<>" and text[:i].rstrip("<>=").endswith("operator"):
            bracket = False  # operator<, operator>>, ...
        else:
            bracket = ch in _OPEN or (ch in _CLOSE and depth > 0 and text[i - 1 : i] + ch != "->")
        if bracket and ch in _OPEN:
            depth += 1
            if depth > 1:
                out[i] = " "
        elif bracket:
            depth -= 1
            if depth:
                out[i] = " "
        elif depth:
            out[i] = " "
    return "".join(out)


def _read_api_calls(src: sqlite3.Connection, table: str, t0: int, names: Names, threads: Names,
                    sink: Sink) -> None:
    """api_events rows of one API table; `names` numbers the (api, cbid) of each call, `threads`
    its (process, thread)."""
    api = API_TABLES[table][0]
    wanted = [
        ("start_ns", START, ["start"]),  # made relative to t0 by valid_times
        ("end_ns", END, ["end"]),
        ("cbid", "cbid", ["cbid"]),
        ("correlation_id", "correlationId", ["correlationId"]),
        ("pid", "processId", ["processId"]),
        ("tid", "threadId", ["threadId"]),  # stored signed: masked to 32 bits below
        ("return_value", "returnValue", ["returnValue"]),
    ]
    sql = f"SELECT {select_list(column_names(src, table), wanted)} FROM {table}"

    def columns(batch: pa.Table) -> pa.Table:
        batch = valid_times(batch, "api_events", sink.damage, t0)
        return pa.table({
            "start_ns": batch["start_ns"],
            "end_ns": batch["end_ns"],
            "name_id": names.number(pa.repeat(pa.scalar(api), batch.num_rows), batch["cbid"]),
            "thread_id": threads.number(batch["pid"], pc.bit_wise_and(batch["tid"], 0xFFFFFFFF)),
            "correlation_id": batch["correlation_id"],
            "return_value": batch["return_value"],
        })

    schema = pa.schema([(w[0], I64) for w in wanted])
    sink.append_all("api_events", map(columns, fetch_batches(src, sql, schema, source=table)))


def _api_names(names: Names) -> pa.Table:
    """The api_names rows for the (api, cbid) keys of `names`: a cbid nvprof's tables do not name
    becomes 'cbid_N'."""
    labels = {api: known for api, known in API_TABLES.values()}
    return api_names(
        [api for api, _ in names.keys],
        [None if cbid is None else labels[api].get(cbid) or f"cbid_{cbid}" for api, cbid in names.keys],
    )


def _read_memops(src: sqlite3.Connection, table: str, t0: int, pid: str, sink: Sink) -> None:
    have = column_names(src, table)
    wanted = [
        ("start_ns", START, ["start"]),  # made relative to t0 by valid_times
        ("end_ns", END, ["end"]),
        ("bytes", "bytes", ["bytes"]),
        ("device_id", "deviceId", ["deviceId"]),
        ("context_id", "contextId", ["contextId"]),
        ("stream_id", "streamId", ["streamId"]),
        ("correlation_id", "correlationId", ["correlationId"]),
        ("pid", pid, ["correlationId"]),
    ]
    if table == MEMSET:
        op = "memset"
        wanted += [("value", "value", ["value"]), ("dst_kind", "memoryKind", ["memoryKind"])]
    else:
        op = "memcpy"
        wanted += [("copy_kind", "copyKind", ["copyKind"]), ("src_kind", "srcKind", ["srcKind"]),
                   ("dst_kind", "dstKind", ["dstKind"])]
    sql = f"SELECT {select_list(have, wanted)} FROM {table} x"

    def columns(batch: pa.Table) -> pa.Table:
        batch = valid_times(batch, "memops", sink.damage, t0)
        cols = {c: batch[c] for c in batch.column_names}
        cols["dur_ns"] = pc.subtract(cols["end_ns"], cols["start_ns"])
        cols["op"] = pa.array([op] * batch.num_rows, type=STR)
        for kind in ("src_kind", "dst_kind"):
            if kind in cols:
                cols[kind] = enum_lookup(cols[kind].combine_chunks(), MEMORY_KIND)
        if "copy_kind" in cols:
            cols["copy_kind"] = enum_lookup(cols["copy_kind"].combine_chunks(), cupti.MEMCPY_KIND)
        return pa.table(cols)

    schema = pa.schema([(w[0], I64) for w in wanted])
    sink.append_all("memops", map(columns, fetch_batches(src, sql, schema, source=table)))


def _read_nvtx(src: sqlite3.Connection, tables: set[str], strings: Strings, t0: int, sink: Sink) -> None:
    have = column_names(src, MARKER)
    domain = "NULLIF(s.domain, 0)" if "domain" in have else "NULL"  # 0: the default domain
    data_join, data_cols = "", "NULL, NULL, NULL"
    if MARKER_DATA in tables and {"id", "flags", "color", "category"} <= column_names(src, MARKER_DATA):
        data_join = (f"LEFT JOIN (SELECT id, flags, color, category FROM {MARKER_DATA} GROUP BY id) d "
                     "ON d.id = s.id")
        data_cols = "d.flags, d.color, d.category"
    schema = pa.schema([("start_ns", I64), ("end_ns", I64), ("name_id", I64), ("domain_id", I64),
                        ("kind", I64), ("object", BIN), ("end_kind", I64), ("end_object", BIN),
                        ("start_row", I64), ("end_row", I64),
                        ("data_flags", I64), ("color", I64), ("category", I64)])
    # Times are made relative to t0 by valid_times. The rowid is _id_ (its INTEGER PRIMARY KEY).
    ranges = f"""
        SELECT NULLIF(s.timestamp, 0), e.timestamp, NULLIF(s.name, 0), {domain}, s.objectKind, s.objectId,
               e.objectKind, e.objectId, s.rowid, e.rowid, {data_cols}
        FROM {MARKER} s
        JOIN {MARKER} e ON e.id = s.id AND (e.flags & {MARKER_END}) != 0 AND e.timestamp >= s.timestamp
        {data_join}
        WHERE (s.flags & {MARKER_START}) != 0
        ORDER BY substr(s.objectId, 1, 8), {domain}, s.timestamp, s.rowid"""
    nesting, attributes = _Nesting(), Names()
    for batch in fetch_batches(src, ranges, schema, source=MARKER):
        batch = valid_times(batch, "nvtx_events", sink.damage, t0)
        sink.append("nvtx_events", nvtx_batch(_nvtx_table(batch, strings, nesting), attributes),
                    source_rows=2 * batch.num_rows)
    marks = f"""
        SELECT NULLIF(s.timestamp, 0), NULL, NULLIF(s.name, 0), {domain}, s.objectKind, s.objectId,
               NULL, NULL, s.rowid, NULL, {data_cols}
        FROM {MARKER} s {data_join}
        WHERE (s.flags & {MARKER_INSTANT}) != 0"""
    for batch in fetch_batches(src, marks, schema, source=MARKER):
        batch = valid_times(batch, "nvtx_events", sink.damage, t0, end_required=False)
        sink.append("nvtx_events", nvtx_batch(_nvtx_table(batch, strings, None), attributes))
    sink.append("nvtx_attributes", nvtx_attributes(attributes.keys), source_rows=0)


class _Nesting:
    """Tells push/pop ranges from start/end ones, fed ranges by (thread, domain, start)."""

    def __init__(self) -> None:
        self.group: tuple[object, ...] | None = None
        self.open_ends: list[tuple[int, int]] = []  # (end time, end row) of enclosing push ranges

    def kind(self, group: tuple[object, ...], start: tuple[int, int], end: tuple[int, int],
             same_thread: bool) -> str:
        if group != self.group:
            self.group, self.open_ends = group, []
        while self.open_ends and self.open_ends[-1] <= start:
            self.open_ends.pop()
        if same_thread and (not self.open_ends or end <= self.open_ends[-1]):
            self.open_ends.append(end)
            return "pushpop"
        return "startend"


def _object_ids(objects: list[bytes | None], kinds: list[int | None]) -> tuple[list[int | None], list[int | None]]:
    """(pids, tids) from CUpti_ActivityObjectKindId blobs; see the module docstring."""
    pids: list[int | None] = []
    tids: list[int | None] = []
    for obj, kind in zip(objects, kinds):
        ok = isinstance(obj, bytes) and len(obj) >= 8
        pids.append(int.from_bytes(obj[:4], "little") if ok and kind in (OBJECT_PROCESS, OBJECT_THREAD) else None)
        tids.append(int.from_bytes(obj[4:8], "little") if ok and kind == OBJECT_THREAD else None)
    return pids, tids


def _nvtx_table(batch: pa.Table, strings: Strings, nesting: _Nesting | None) -> pa.Table:
    pids, tids = _object_ids(batch["object"].to_pylist(), batch["kind"].to_pylist())
    n = batch.num_rows
    if nesting is None:
        kinds = ["mark"] * n
        end_tids: list[int | None] = [None] * n
    else:
        _, ends = _object_ids(batch["end_object"].to_pylist(), batch["end_kind"].to_pylist())
        kinds, end_tids = [], []
        rows = zip(pids, tids, ends, batch["domain_id"].to_pylist(), batch["start_ns"].to_pylist(),
                   batch["start_row"].to_pylist(), batch["end_ns"].to_pylist(), batch["end_row"].to_pylist())
        for pid, tid, end_tid, dom, start, start_row, end, end_row in rows:
            kind = nesting.kind((pid, tid, dom), (start, start_row), (end, end_row),
                                tid is not None and tid == end_tid)
            kinds.append(kind)
            end_tids.append(end_tid if kind == "startend" else None)
    argb = pc.equal(pc.bit_wise_and(batch["data_flags"], MARKER_COLOR_ARGB), MARKER_COLOR_ARGB)
    color = pc.if_else(argb, pc.bit_wise_and(batch["color"], 0xFFFFFFFF), pa.scalar(None, type=I64))
    category = batch["category"]
    return pa.table({
        "start_ns": batch["start_ns"],
        "end_ns": batch["end_ns"],
        "kind": pa.array(kinds, type=STR),
        "name": strings.lookup(batch["name_id"].combine_chunks()),
        "domain": strings.lookup(batch["domain_id"].combine_chunks()),
        "category": pc.if_else(pc.equal(category, 0), pa.scalar(None, type=I64), category),
        "color": color,
        "pid": pa.array(pids, type=I64),
        "tid": pa.array(tids, type=I64),
        "end_tid": pa.array(end_tids, type=I64),
    })


def _read_gpus(src: sqlite3.Connection, strings: Strings, sink: Sink) -> None:
    wanted = [
        ("device_id", "id", ["id"]),
        ("name_id", "name", ["name"]),
        ("clock_hz", "coreClockRate", ["coreClockRate"]),  # kHz, scaled below
        ("memory_bytes", "globalMemorySize", ["globalMemorySize"]),
        ("memory_bandwidth_bytes_per_s", "globalMemoryBandwidth", ["globalMemoryBandwidth"]),  # kB/s
        *CUPTI_DEVICE_LIMITS,
    ]
    sql = f"SELECT DISTINCT {select_list(column_names(src, DEVICE), wanted)} FROM {DEVICE} ORDER BY 1"
    for batch in fetch_batches(src, sql, pa.schema([(w[0], I64) for w in wanted]), source=DEVICE):
        batch = scaled(batch, {"clock_hz": 1000, "memory_bandwidth_bytes_per_s": 1000}, sink.damage, DEVICE)
        cols = {c: batch[c] for c in batch.column_names if c != "name_id"}
        cols["name"] = strings.lookup(batch["name_id"].combine_chunks())
        sink.append("gpus", pa.table(cols))


def _read_names(src: sqlite3.Connection, strings: Strings, sink: Sink) -> None:
    """Process command lines and thread names from the NAME table (a handful of rows)."""
    rows = src.execute(f"SELECT objectKind, objectId, name FROM {NAME} WHERE objectKind IN (?, ?)",
                       [OBJECT_PROCESS, OBJECT_THREAD]).fetchall()
    kinds = [r[0] for r in rows]
    pids, tids = _object_ids([r[1] for r in rows], kinds)
    name_ids = to_arrow([r[2] for r in rows], pa.field("name", I64), sink.damage, NAME)
    names = strings.lookup(name_ids).to_pylist()
    procs = [(p, n) for k, p, n in zip(kinds, pids, names) if k == OBJECT_PROCESS]
    threads = [(p, t, n) for k, p, t, n in zip(kinds, pids, tids, names) if k == OBJECT_THREAD]
    if procs:
        sink.append("processes", pa.table({"pid": pa.array([p for p, _ in procs], type=I64),
                                           "name": pa.array([n for _, n in procs], type=STR)}))
    if threads:
        sink.append("threads", pa.table({"pid": pa.array([p for p, _, _ in threads], type=I64),
                                         "tid": pa.array([t for _, t, _ in threads], type=I64),
                                         "name": pa.array([n for _, _, n in threads], type=STR)}))
