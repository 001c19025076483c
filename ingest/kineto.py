"""PyTorch profiler (Kineto) JSON traces: `torch.profiler` / `export_chrome_trace`, plain or gzip,
CUDA (CUPTI) and ROCm (roctracer) alike, schema versions of 2021 to 2026.

Two passes, neither holding the trace in Python objects:

1. **Stage.** `json_events.TraceEvents` cuts the traceEvents array into batches of chunks of
   whole events; each chunk goes to a scratch file as a JSON array, and DuckDB's JSON reader
   (C++) parses a batch's files in one query (`_stage_sql`) into the staging table `ev` of a
   scratch database (in memory for a trace of up to `MEMORY_STAGING_BYTES` of JSON, else on
   disk, compressed), the rows traceq uses only, each with its position (`seq`). In memory, two
   batches are parsed at once, on two connections and threads (`json_stage`).
2. **Store.** SQL over `ev` numbers names, launch configurations, queues, threads and range
   attributes once (`_PREPARE`), then builds each store table (`_TABLES`) and streams it to
   the sink.

What comes from where (old traces' categories in brackets):

- kernels: `kernel` [`Kernel`]: name as given (a `_Z` name is also the mangled name), device,
  context, stream, correlation, grid, block, registers; `shared memory` (Kineto writes static +
  dynamic as one number) goes to smem_static_bytes; `est. achieved occupancy %` to
  kernel_configs.kineto_occupancy_pct. A kernel's pid is that of the API call with its
  correlation id (GPU events carry the device as pid).
- memcpy/memset: `gpu_memcpy`/`gpu_memset` [`Memcpy`/`Memset`]: kind and memory kinds from the
  name ("Memcpy HtoD (Pinned -> Device)"), bytes from args.
- API calls: `cuda_runtime` [`Runtime`] (HIP's calls too, on ROCm) and `cuda_driver`.
- ranges (the nvtx tables, domain = the Kineto category): `cpu_op` [`Operator`],
  `user_annotation` (ProfilerStep#N, Optimizer.step...) and, opt-in, `python_function` (the
  modules' frames, `nn.Module: Linear_0`, always: `with_modules=True` records them), as
  push/pop ranges of their thread; `gpu_user_annotation` as start/end ranges of no process.
  Shapes and PyTorch's own FLOPs of operators go to `operators`.
- `[memory]` instant events into memory_events (the bytes already allocated before the first
  one, `Total Allocated - Bytes`, as one allocation at that time, as nsys does for a capture).
- collective arguments of NCCL/RCCL kernels and `record_param_comms` ops into `collectives`;
  `distributedInfo` into traces (rank, world size, backend) and `process_groups`.
- `deviceProperties` into gpus; Kineto records no clock, so the clock is taken from
  `kineto_meta.KNOWN_CLOCKS_HZ` by the GPU's name where traceq knows it.

Times: `ts` and `dur` are microseconds written as decimals (some versions with three digits
after the point, some as integers); they are read as exact decimals and stored as integer ns,
never through a float. Events lacking a name, pid or tid traceq needs are refused; events whose
times are missing, not numbers, out of range or reversed are dropped and counted (`_valid_times`,
docs/damaged-traces.md), as in the other readers.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import duckdb
import pyarrow as pa

from traceq.errors import TraceFormatError
from traceq.ingest.base import LoadOptions, Sink, SourceInfo
from traceq.ingest.json_events import TraceEvents, uncompressed_size
from traceq.ingest.json_stage import stage
from traceq.ingest.kineto_meta import gpu_table, int_or_none, process_group_table, source_info
from traceq.ingest.nvprof import base_name, demangle
from traceq.ingest.scratch import forget_memory_scratch, memory_scratch, new_scratch
from traceq.ingest.validate import TIME_LIMIT_NS, Damage
from traceq.store import connect

SCRATCH_SETTINGS = {"memory_limit": "300MB", "threads": "2", "preserve_insertion_order": "true"}
"""The scratch database's settings: a bounded memory (it spills to the temporary folder)."""

MEMORY_STAGING_BYTES = 256 << 20
"""JSON text up to which the staging database is in memory: its uncompressed rows (about one byte
per byte of JSON) stay within SCRATCH_SETTINGS' memory_limit."""

_COLLECTIVE = {
    "Collective name": ("VARCHAR", "collective"), "In msg nelems": ("BIGINT", "in_msg_nelems"),
    "Out msg nelems": ("BIGINT", "out_msg_nelems"), "In split size": ("VARCHAR", "in_split_size"),
    "Out split size": ("VARCHAR", "out_split_size"), "Group size": ("BIGINT", "group_size"),
    "dtype": ("VARCHAR", "dtype"), "Process Group Description": ("VARCHAR", "pg_desc"),
    "Process Group Ranks": ("VARCHAR", "pg_ranks"), "Process Group Name": ("VARCHAR", None),
    "Process Group ID": ("VARCHAR", None),
}
"""Collective args (NCCL/RCCL kernels, record_param_comms ops): type and staging column (the
process group's name or else its id make pg_name)."""
_GPU_ARGS = {
    "correlation": "BIGINT", "device": "BIGINT", "context": "BIGINT", "stream": "VARCHAR",
    "registers per thread": "BIGINT", "shared memory": "BIGINT", "grid": "BIGINT[]", "block": "BIGINT[]",
    "est. achieved occupancy %": "DOUBLE", "bytes": "BIGINT", **{k: t for k, (t, _) in _COLLECTIVE.items()},
}
_OPERATOR_ARGS = {
    "External id": "BIGINT", "Input Dims": "JSON", "Input type": "JSON", "Concrete Inputs": "JSON",
    "flops": "BIGINT", "Sequence number": "BIGINT", **{k: t for k, (t, _) in _COLLECTIVE.items()},
}
_MEMORY_ARGS = {"Bytes": "BIGINT", "Total Allocated": "BIGINT", "Addr": "UBIGINT", "Device Id": "BIGINT",
                "Device Type": "BIGINT"}
"""The args traceq reads, per kind of event. They are parsed per kind with `json_transform`, which
makes a value of another type NULL (Triton kernels write `"grid": "grid(100,)"`)."""

_EVENT = {"ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "VARCHAR", "tid": "VARCHAR",
          "ts": "DECIMAL(38,9)", "dur": "DECIMAL(38,9)", "args": "JSON"}
"""The keys of an event as DuckDB's JSON reader types them (refusing a file where one does not
fit: times are read as exact decimals)."""


_KIND = """CASE
    WHEN ph = 'X' AND lower(cat) = 'kernel' THEN 'kernel'
    WHEN ph = 'X' AND cat IN ('gpu_memcpy', 'Memcpy') THEN 'memcpy'
    WHEN ph = 'X' AND cat IN ('gpu_memset', 'Memset') THEN 'memset'
    WHEN ph = 'X' AND cat IN ('cuda_runtime', 'Runtime') THEN 'runtime'
    WHEN ph = 'X' AND cat = 'cuda_driver' THEN 'driver'
    WHEN ph = 'X' AND cat IN ('cpu_op', 'Operator') THEN 'cpu_op'
    WHEN ph = 'X' AND cat IN ('user_annotation', 'gpu_user_annotation', 'python_function') THEN cat
    WHEN ph = 'X' AND cat = 'cuda_profiler_range' THEN 'gpu_range'
    WHEN ph = 'i' AND name = '[memory]' THEN 'memory'
    WHEN ph = 'M' AND name IN ('process_name', 'thread_name') THEN name
END"""
"""What traceq makes of an event; NULL: nothing (flows, overhead, the profiler's own spans)."""

# A decimal cast to an integer rounds half away from zero, exactly; a time past 64 bits of ns is held
# at +-9e18 ns, which `_valid_times` drops as out of range.
_NS = "CAST(CASE WHEN abs({0}) < 9000000000000000 THEN {0} ELSE sign({0}) * 9000000000000000 END * 1000 AS BIGINT)"


def _structure(spec: dict[str, str]) -> str:
    return "'{" + ", ".join(f'"{k}": "{v}"' for k, v in spec.items()) + "}'"


_COLUMNS = "{" + ", ".join(f"'{k}': '{v}'" for k, v in _EVENT.items()) + "}"
_GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_user_annotation", "gpu_range")


def _collective_columns() -> str:
    """The collective staging columns, from a kernel's args (g) or an operator's (o)."""
    return ", ".join(f'coalesce(g."{key}", o."{key}") AS {column}'
                     for key, (_, column) in _COLLECTIVE.items() if column)


def _stage_sql(files: list[Path], first: int, python_functions: bool) -> str:
    """The staging rows of the events in `files` (JSON arrays of consecutive events), numbered
    (`seq`) from `first` on."""
    # without the opt-in, of the Python frames only the modules' (`with_modules`: `nn.Module: Linear_0`)
    keep = "" if python_functions else " AND (kind <> 'python_function' OR starts_with(name, 'nn.Module: '))"
    paths = ", ".join(f"'{p}'" for p in files)
    gpu = ", ".join(f"'{k}'" for k in _GPU_KINDS)
    return f"""
    WITH raw AS (
        SELECT *, {first} + row_number() OVER () - 1 AS seq
        FROM read_json([{paths}], format = 'array', columns = {_COLUMNS}, maximum_object_size = {_MAX_EVENT_BYTES})
    ),
    kept AS (
        SELECT *, {_KIND} AS kind FROM raw
    ),
    parsed AS (
        SELECT *,
            CASE WHEN kind IN ({gpu}) THEN json_transform(args, {_structure(_GPU_ARGS)}) END AS g,
            CASE WHEN kind IN ('runtime', 'driver') THEN TRY_CAST(json_extract(args, '$.correlation') AS BIGINT) END AS api_correlation,
            CASE WHEN kind = 'cpu_op' OR (kind = 'user_annotation' AND starts_with(name, 'nccl:'))  -- their tensor
                THEN json_transform(args, {_structure(_OPERATOR_ARGS)}) END AS o,
            CASE WHEN kind = 'memory' THEN json_transform(args, {_structure(_MEMORY_ARGS)}) END AS m
        FROM kept WHERE ph IS NULL OR (kind IS NOT NULL{keep})
    )
    SELECT seq, ph IS NULL AS bad, kind, name, TRY_CAST(pid AS BIGINT) AS pid,
           coalesce(TRY_CAST(tid AS BIGINT), TRY_CAST(regexp_extract(tid, '^stream (\\d+)', 1) AS BIGINT)) AS tid,
           {_NS.format("ts")} AS ts_ns, {_NS.format("dur")} AS dur_ns,
           coalesce(g.correlation, api_correlation) AS correlation,
           coalesce(o."External id", CASE WHEN cat = 'Operator'  -- traces of 2021 and before
               THEN TRY_CAST(json_extract(args, '$."external id"') AS BIGINT) END) AS external_id,
           g.device, g.context, TRY_CAST(g.stream AS BIGINT) AS stream,
           g."registers per thread" AS registers, g."shared memory" AS smem,
           g.grid, g.block, g."est. achieved occupancy %" AS kineto_occupancy_pct, g.bytes,
           m.Bytes AS mem_bytes, m."Total Allocated" AS total_allocated, m.Addr AS address,
           m."Device Id" AS mem_device, m."Device Type" AS mem_device_type,
           o."Input Dims" AS input_dims, o."Input type" AS input_types,
           o."Concrete Inputs" AS concrete_inputs, o.flops, o."Sequence number" AS sequence_number,
           {_collective_columns()},
           coalesce(g."Process Group Name", o."Process Group Name", g."Process Group ID", o."Process Group ID") AS pg_name,
           CASE WHEN kind IN ('process_name', 'thread_name') THEN json_extract_string(args, '$.name') END AS label
    FROM parsed
    """


_MAX_EVENT_BYTES = 16 << 20


@dataclass
class KinetoSource:
    """An opened Kineto trace: the file, the load's options, and what the reader learned."""

    path: Path
    options: LoadOptions
    scratch: Path = field(default_factory=lambda: new_scratch())

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


class KinetoReader:
    """Reads a PyTorch profiler (Kineto) JSON trace."""

    name: ClassVar[str] = "kineto"
    container: ClassVar[str] = "json"

    def sniff(self, head: bytes) -> bool:
        """True when the start of the JSON text looks like a Chrome trace of the PyTorch profiler."""
        text = head.lstrip()
        return text[:1] in (b"{", b"[") and (b'"traceEvents"' in head or b'"ph"' in head)

    def open(self, path: Path, options: LoadOptions) -> KinetoSource:
        return KinetoSource(Path(path), options)

    def estimate_rows(self, src: KinetoSource) -> int:
        """Bytes of JSON text: the reader reports its progress in bytes read."""
        return uncompressed_size(src.path)

    def read(self, src: KinetoSource, sink: Sink) -> SourceInfo:
        # a small trace's staging in memory (uncompressed: cheaper to write), a large one's on disk
        # (compressed: spilling 1.6 GB of uncompressed staging at 1M kernels tripled pass 2)
        small = uncompressed_size(src.path) <= MEMORY_STAGING_BYTES
        scratch = (memory_scratch(SCRATCH_SETTINGS).cursor() if small else  # offline, as `connect`'s
                   connect(src.scratch / "stage.duckdb", **SCRATCH_SETTINGS, temp_directory=str(src.scratch / "spill")))
        scratch.execute("SET enable_progress_bar = false")
        try:
            events = TraceEvents(src.path)
            _stage(scratch, events, src.scratch, src.options, sink, parallel=small)
            meta = events.metadata
            counts = _counts(scratch)
            _check(scratch, events, counts)
            _valid_times(scratch, sink.damage)
            _write_tables(scratch, sink, meta, counts, in_order=not small)
            base = int_or_none(meta.get("baseTimeNanoseconds"))
            if base is not None and not 0 <= base < 2**63:
                sink.damage.add("baseTimeNanoseconds", "out of range ignored (times kept as the trace has them)")
            return source_info(meta)
        finally:
            if small:  # the temporary tables go with the cursor, the staging tables here
                try:
                    scratch.execute("DROP TABLE IF EXISTS ev; DROP TABLE IF EXISTS kernel_rows")
                except duckdb.Error:  # the next read makes a new database
                    forget_memory_scratch()
            scratch.close()


def _stage(scratch: duckdb.DuckDBPyConnection, events: TraceEvents, folder: Path, options: LoadOptions,
           sink: Sink, parallel: bool = False) -> None:
    """Pass 1: every batch of events parsed into the staging table `ev` (`json_stage.stage`), two
    at a time where `parallel` (in memory: the same CPU, on two cores; appending to the compressed
    table on disk from two connections cost 6 to 10 % more CPU, so large traces stay serial)."""
    if _EV_TABLE:  # binding the staging SQL to an empty file costs about a third of a rank's parse
        scratch.execute(_EV_TABLE[0])
    else:  # the staging rows' columns, as DuckDB types them, learnt once
        (folder / "empty.json").write_bytes(b"[]")
        scratch.execute(f"CREATE TABLE ev AS {_stage_sql([folder / 'empty.json'], 0, True)}")
        columns = scratch.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'ev' "
                                  "ORDER BY column_index").fetchall()
        _EV_TABLE.append("CREATE TABLE ev (" + ", ".join(f'"{name}" {kind}' for name, kind in columns) + ")")

    def insert(paths: list[Path], number: int) -> str:
        return f"INSERT INTO ev {_stage_sql(paths, number << _ROW_BITS, options.python_functions)}"

    stage(scratch, "ev", events, folder, insert, sink.progress, parallel)


def _counts(scratch: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """The staged events of each kind; under "collective" the rows `_COLLECTIVES` reads (most
    traces have none) and under "kernel collective" the kernels among them."""
    rows = scratch.execute("SELECT kind, count(*), count(collective) FROM ev GROUP BY kind").fetchall()
    counts = {kind: n for kind, n, _ in rows}
    with_args = {kind: c for kind, _, c in rows}
    nccl = scratch.execute("SELECT count(*) FROM ev WHERE kind = 'user_annotation' AND starts_with(name, 'nccl:')"
                           ).fetchall()[0][0] if counts.get("user_annotation") else 0
    return {**counts, "collective": with_args.get("kernel", 0) + with_args.get("cpu_op", 0) + nccl,
            "kernel collective": with_args.get("kernel", 0)}


_EV_TABLE: list[str] = []  # the staging table's CREATE TABLE, once a read has made it
_ROW_BITS = 32
"""A staged event's seq is its batch's number, shifted by this, plus its place in the batch."""


_REQUIRED = {
    "kernel": ("name",), "runtime": ("name", "pid", "tid"), "driver": ("name", "pid", "tid"),
    "cpu_op": ("name", "pid", "tid"), "user_annotation": ("name", "pid", "tid"), "gpu_user_annotation": ("name",),
    "python_function": ("pid", "tid"), "memory": ("mem_bytes",),
}
"""Fields without which an event cannot be stored: the file is refused. (Times: `_valid_times`.)"""
_TIMED = {"kernel": "kernel", "memcpy": "memcpy/memset", "memset": "memcpy/memset", "runtime": "API call",
          "driver": "API call", "cpu_op": "NVTX event", "user_annotation": "NVTX event",
          "gpu_user_annotation": "NVTX event", "python_function": "NVTX event", "memory": "memory event"}
"""The kinds of events with times (`ts`, and `dur` but for memory events), named as in the load's summary."""


def _check(scratch: duckdb.DuckDBPyConnection, events: TraceEvents, counts: dict[str, int]) -> None:
    """Refuse a trace with unreadable events, events lacking what traceq needs, or no GPU event."""
    path = events.path

    def at(seq: int) -> str:
        return f"traceEvents[{events.index(seq >> _ROW_BITS, seq & ((1 << _ROW_BITS) - 1))}]"

    bad = scratch.execute("SELECT min(seq) FROM ev WHERE bad").fetchall()[0][0]
    if bad is not None:
        raise TraceFormatError(f"{path}: {at(bad)} is not an event object (no \"ph\")")
    tests = " UNION ALL ".join(
        f"SELECT '{kind}' AS kind, '{column}' AS field, min(seq) AS seq FROM ev "
        f"WHERE kind = '{kind}' AND {column} IS NULL"
        for kind, columns in _REQUIRED.items() if counts.get(kind) for column in columns)
    if tests:
        missing = scratch.execute(f"SELECT * FROM ({tests}) WHERE seq IS NOT NULL ORDER BY seq LIMIT 1").fetchall()
        if missing:
            kind, column, seq = missing[0]
            label = {"mem_bytes": "args.Bytes"}.get(column, column)
            raise TraceFormatError(f"{path}: {at(seq)}, a {kind} event, has no valid \"{label}\"; "
                                   "the trace is damaged or not from the PyTorch profiler")
    if not any(counts.get(k) for k in _GPU_KINDS):
        raise TraceFormatError(
            f"{path} has no GPU events (no kernel, memcpy or memset): profile with "
            "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")


def _valid_times(scratch: duckdb.DuckDBPyConnection, damage: Damage) -> None:
    """Delete from `ev` the events whose times an analysis cannot use, counted in `damage` as the
    other readers count them (ingest/validate.py): `ts` (or `dur`) missing or not a number; a time
    more than TIME_LIMIT_NS from the trace's time zero (the median start, which a few damaged
    events cannot move); a negative `dur`."""
    timed = ", ".join(f"'{k}'" for k in _TIMED)
    zero = scratch.execute(f"SELECT quantile_disc(ts_ns, 0.5) FROM ev WHERE kind IN ({timed})").fetchall()[0][0] or 0
    end = "CAST(ts_ns AS HUGEINT) + CASE WHEN kind = 'memory' THEN 0 ELSE dur_ns END"
    missing = "ts_ns IS NULL OR (dur_ns IS NULL AND kind <> 'memory')"
    out = f"abs(CAST(ts_ns AS HUGEINT) - {zero}) >= {TIME_LIMIT_NS} OR abs({end} - {zero}) >= {TIME_LIMIT_NS}"
    reversed_ = "dur_ns < 0 AND kind <> 'memory'"
    counts = scratch.execute(f"""
        SELECT kind, count(*) FILTER ({missing}), count(*) FILTER (NOT ({missing}) AND ({out})),
               count(*) FILTER (NOT ({missing}) AND NOT ({out}) AND {reversed_})
        FROM ev WHERE kind IN ({timed}) GROUP BY kind""").fetchall()
    for kind, without, out_of_range, reversed_count in counts:
        damage.add(_TIMED[kind], "without a start or end time dropped", without)
        damage.add(_TIMED[kind], "with times out of range dropped", out_of_range)
        damage.add(_TIMED[kind], "with end < start dropped", reversed_count)
    if any(sum(row[1:]) for row in counts):  # a clean trace deletes nothing
        scratch.execute(f"DELETE FROM ev WHERE kind IN ({timed}) AND ({missing} OR {out} OR {reversed_})")


# --- pass 2: the store's tables ------------------------------------------------------------

def _numbering(table: str, keys: dict[str, str], rows: str) -> str:
    """A temporary `table` of the distinct values of `keys` (column: expression) among `rows`,
    each with an `id` (INTEGER, 0, 1, ... in their sort order)."""
    columns = ", ".join(f"{expr} AS {column}" for column, expr in keys.items())
    return (f"CREATE TEMP TABLE {table} AS SELECT CAST(row_number() OVER (ORDER BY {', '.join(keys)}) - 1 "
            f"AS INTEGER) AS id, * FROM (SELECT DISTINCT {columns} FROM {rows})")


def _id_of(table: str, keys: dict[str, str], row: str) -> str:
    """A join of `table` (made by `_numbering`) to the rows aliased `row`: its `id` for their keys."""
    match = " AND ".join(f"{table}.{column} IS NOT DISTINCT FROM {expr}" for column, expr in _keys(keys, row).items())
    return f"JOIN {table} ON {match}"


_KERNEL_CONFIG = {"grid_x": "{row}.grid[1]", "grid_y": "{row}.grid[2]", "grid_z": "{row}.grid[3]",
                  "block_x": "{row}.block[1]", "block_y": "{row}.block[2]", "block_z": "{row}.block[3]",
                  "registers_per_thread": "{row}.registers", "smem_static_bytes": "{row}.smem",
                  "kineto_occupancy_pct": "{row}.kineto_occupancy_pct"}
_KERNEL_QUEUE = {"device_id": "{row}.device", "context_id": "{row}.context", "stream_id": "{row}.stream",
                 "pid": "{row}.launch_pid"}
_KERNEL_NAME = {"name": "{row}.name"}
_API_NAME = {"api": "CASE {row}.kind WHEN 'runtime' THEN 'runtime' ELSE 'driver' END", "name": "{row}.name"}
_API_THREAD = {"pid": "{row}.pid", "tid": "{row}.tid"}
_RANGE_ATTRIBUTES = {
    "kind": "CASE {row}.kind WHEN 'gpu_user_annotation' THEN 'startend' ELSE 'pushpop' END", "domain": "{row}.kind",
    "pid": "CASE WHEN {row}.kind = 'gpu_user_annotation' THEN NULL ELSE {row}.pid END",
    "tid": "CASE WHEN {row}.kind = 'gpu_user_annotation' THEN coalesce({row}.stream, {row}.tid) ELSE {row}.tid END"}
_RANGE_KINDS = "'cpu_op', 'user_annotation', 'gpu_user_annotation', 'python_function'"


def _keys(keys: dict[str, str], row: str = "ev") -> dict[str, str]:
    return {column: expr.replace("{row}", row) for column, expr in keys.items()}


_PREPARE = (
    # a GPU event's process is that of the API call with its correlation id (GPU events carry the
    # device as pid), else the trace's main process: the one with the most calls and operators
    """CREATE TEMP TABLE main_pid AS SELECT pid FROM ev WHERE kind IN ('runtime', 'driver', 'cpu_op')
       GROUP BY pid ORDER BY count(*) DESC, pid LIMIT 1""",
    """CREATE TEMP TABLE launch AS SELECT correlation, min(pid) AS pid FROM ev
       WHERE kind IN ('runtime', 'driver') AND correlation IS NOT NULL
         AND EXISTS (SELECT 1 FROM ev WHERE kind IN ('runtime', 'driver') AND pid <> (SELECT pid FROM main_pid))
       GROUP BY correlation""",  # empty where every call is the main process's, as in most traces
    """CREATE TEMP VIEW gpu AS SELECT ev.*, coalesce(launch.pid, (SELECT pid FROM main_pid)) AS launch_pid
       FROM ev LEFT JOIN launch USING (correlation) WHERE ev.kind IN ('kernel', 'memcpy', 'memset')""",
    _numbering("kernel_name_ids", _keys(_KERNEL_NAME), "ev WHERE kind = 'kernel'"),
    _numbering("kernel_config_ids", _keys(_KERNEL_CONFIG), "ev WHERE kind = 'kernel'"),
    _numbering("kernel_queue_ids", _keys(_KERNEL_QUEUE, "gpu"), "gpu WHERE kind = 'kernel'"),
    _numbering("api_name_ids", _keys(_API_NAME), "ev WHERE kind IN ('runtime', 'driver')"),
    _numbering("api_thread_ids", _keys(_API_THREAD), "ev WHERE kind IN ('runtime', 'driver')"),
    _numbering("range_attribute_ids", _keys(_RANGE_ATTRIBUTES), f"ev WHERE kind IN ({_RANGE_KINDS})"),
    # the kernels with their ids, on disk: joined and sorted in one query, the join's hash
    # tables and the sort outgrew the scratch memory at 10M kernels
    f"""CREATE TABLE kernel_rows AS
        SELECT k.seq, k.ts_ns, k.dur_ns, k.correlation, kernel_name_ids.id AS name_id,
               kernel_config_ids.id AS config_id, kernel_queue_ids.id AS queue_id
        FROM gpu k {_id_of("kernel_name_ids", _KERNEL_NAME, "k")} {_id_of("kernel_config_ids", _KERNEL_CONFIG, "k")}
             {_id_of("kernel_queue_ids", _KERNEL_QUEUE, "k")}
        WHERE k.kind = 'kernel'""",
)
"""Pass 2's first step: the ids of names, configurations, queues, threads and range attributes."""

_KERNELS = """
    SELECT row_number() OVER (ORDER BY seq) - 1 AS kernel_id, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns,
           correlation AS correlation_id, name_id, config_id, queue_id
    FROM kernel_rows ORDER BY seq"""
_KERNEL_CONFIGS = f"SELECT id AS config_id, {', '.join(_KERNEL_CONFIG)} FROM kernel_config_ids ORDER BY id"
_KERNEL_QUEUES = f"SELECT id AS queue_id, {', '.join(_KERNEL_QUEUE)} FROM kernel_queue_ids ORDER BY id"
_KERNEL_NAMES = "SELECT id AS name_id, name FROM kernel_name_ids ORDER BY id"

_API_EVENTS = f"""
    SELECT a.ts_ns AS start_ns, a.ts_ns + a.dur_ns AS end_ns, api_name_ids.id AS name_id,
           api_thread_ids.id AS thread_id, a.correlation AS correlation_id
    FROM ev a {_id_of("api_name_ids", _API_NAME, "a")} {_id_of("api_thread_ids", _API_THREAD, "a")}
    WHERE a.kind IN ('runtime', 'driver') ORDER BY a.seq"""
_API_NAMES = "SELECT id AS name_id, api, name FROM api_name_ids ORDER BY id"
_API_THREADS = "SELECT id AS thread_id, pid, tid FROM api_thread_ids ORDER BY id"

_COPY_KIND = {"HtoD": "Host-to-Device", "DtoH": "Device-to-Host", "HtoA": "Host-to-Array",
              "AtoH": "Array-to-Host", "AtoA": "Array-to-Array", "AtoD": "Array-to-Device",
              "DtoA": "Device-to-Array", "DtoD": "Device-to-Device", "HtoH": "Host-to-Host",
              "PtoP": "Peer-to-Peer"}
"""Kineto's memcpy kinds (CUPTI's getMemcpyKindString) in the words `nsys stats` uses."""

_MEMOPS = f"""
    WITH m AS (SELECT * FROM gpu WHERE kind IN ('memcpy', 'memset')),
    kinds(code, word) AS (VALUES {", ".join(f"('{k}', '{v}')" for k, v in _COPY_KIND.items())})
    SELECT ts_ns AS start_ns, ts_ns + dur_ns AS end_ns, dur_ns, kind AS op,
           CASE WHEN kind = 'memcpy' THEN coalesce(
               (SELECT word FROM kinds WHERE code = regexp_extract(name, '^Memcpy (\\w+)', 1)),
               nullif(regexp_extract(name, '^Memcpy (\\w+)', 1), '')) END AS copy_kind,
           CASE WHEN kind = 'memcpy' THEN nullif(regexp_extract(name, '\\((\\w+) -> ', 1), '') END AS src_kind,
           nullif(CASE WHEN kind = 'memcpy' THEN regexp_extract(name, ' -> (\\w+)\\)', 1)
                       ELSE regexp_extract(name, '^Memset \\((\\w+)\\)', 1) END, '') AS dst_kind,
           bytes, device AS device_id, context AS context_id, stream AS stream_id,
           correlation AS correlation_id, launch_pid AS pid
    FROM m ORDER BY seq"""

_NVTX_EVENTS = f"""
    SELECT r.ts_ns AS start_ns, r.ts_ns + r.dur_ns AS end_ns, r.name, range_attribute_ids.id AS attributes_id
    FROM ev r {_id_of("range_attribute_ids", _RANGE_ATTRIBUTES, "r")}
    WHERE r.kind IN ({_RANGE_KINDS}) ORDER BY r.seq"""
_NVTX_ATTRIBUTES = f"SELECT id AS attributes_id, {', '.join(_RANGE_ATTRIBUTES)} FROM range_attribute_ids ORDER BY id"

_OPERATORS = """
    SELECT pid, tid, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns, name, sequence_number, external_id,
           CAST(input_dims AS VARCHAR) AS input_dims, CAST(input_types AS VARCHAR) AS input_types,
           CAST(concrete_inputs AS VARCHAR) AS concrete_inputs, flops
    FROM ev WHERE kind = 'cpu_op' AND (input_dims IS NOT NULL OR flops IS NOT NULL)"""
"""Wide rows (a name, three JSON texts), in `seq` order as `ev` holds them when it was staged one
batch after the other: a filtered scan keeps that order (`_IN_ORDER`)."""

_MEMORY_EVENTS = """
    WITH m AS (SELECT * FROM ev WHERE kind = 'memory'),
    before AS (  -- what was allocated before the first event, per device
        SELECT arg_min(ts_ns, seq) AS ts_ns, arg_min(total_allocated - mem_bytes, seq) AS bytes, mem_device,
               arg_min(pid, seq) AS pid, min(seq) - 0.5 AS seq
        FROM m WHERE mem_device_type <> 0 AND total_allocated IS NOT NULL GROUP BY mem_device
    )
    SELECT ts_ns, op, bytes, address, mem_kind, device_id, pid, tid FROM (
        SELECT seq, ts_ns, CASE WHEN mem_bytes >= 0 THEN 'alloc' ELSE 'free' END AS op, abs(mem_bytes) AS bytes,
               address, CASE WHEN mem_device_type = 0 THEN 'Pageable' ELSE 'Device' END AS mem_kind,
               CASE WHEN mem_device >= 0 THEN mem_device END AS device_id, pid, tid
        FROM m
        UNION ALL
        SELECT seq, ts_ns, 'alloc', bytes, NULL, 'Device', mem_device, pid, NULL FROM before WHERE bytes > 0
    ) ORDER BY seq"""

_KERNEL_IDS = "SELECT seq, row_number() OVER (ORDER BY seq) - 1 AS kernel_id FROM ev WHERE kind = 'kernel'"
_NO_KERNEL_IDS = "SELECT NULL::BIGINT AS seq, NULL::BIGINT AS kernel_id WHERE false"
"""Each kernel's id, for the collectives of kernels: numbering every kernel only where some are
(`_counts`: "kernel collective")."""

_COLLECTIVES = """
    WITH kernel_ids AS ({kernel_ids})
    SELECT * EXCLUDE (seq) FROM (
        SELECT seq, k.kernel_id, kind AS event, CASE WHEN kind = 'kernel' THEN NULL ELSE pid END AS pid,
               CASE WHEN kind = 'kernel' THEN NULL ELSE tid END AS tid, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns,
               collective, in_msg_nelems, out_msg_nelems, in_split_size, out_split_size, group_size, dtype,
               pg_name, pg_desc, pg_ranks
        FROM ev LEFT JOIN kernel_ids k USING (seq)
        WHERE collective IS NOT NULL AND kind IN ('kernel', 'cpu_op')
        UNION ALL  -- PyTorch's `nccl:all_reduce` ranges: the collective in the name, its tensor in Input Dims
        SELECT seq, NULL, kind, pid, tid, ts_ns, ts_ns + dur_ns, substr(name, 6),
               CAST(list_product(TRY_CAST(json_extract(input_dims, '$[0]') AS BIGINT[])) AS BIGINT), NULL, NULL,
               NULL, NULL, json_extract_string(input_types, '$[0]'), NULL, NULL, NULL
        FROM ev WHERE kind = 'user_annotation' AND starts_with(name, 'nccl:')
    ) ORDER BY seq"""

_PROCESSES = """SELECT DISTINCT pid, label AS name FROM ev WHERE kind = 'process_name' AND pid IS NOT NULL"""
_THREADS = """SELECT DISTINCT pid, tid, label AS name FROM ev WHERE kind = 'thread_name' AND pid IS NOT NULL"""

_TABLES = (("kernel_events", _KERNELS), ("kernel_configs", _KERNEL_CONFIGS), ("kernel_queues", _KERNEL_QUEUES),
           ("api_events", _API_EVENTS), ("api_names", _API_NAMES), ("api_threads", _API_THREADS),
           ("memops", _MEMOPS), ("nvtx_events", _NVTX_EVENTS), ("nvtx_attributes", _NVTX_ATTRIBUTES),
           ("operators", _OPERATORS), ("memory_events", _MEMORY_EVENTS), ("collectives", _COLLECTIVES),
           ("processes", _PROCESSES), ("threads", _THREADS))


_SOURCE_KINDS = {"memops": ("memcpy", "memset"), "operators": ("cpu_op",), "memory_events": ("memory",),
                 "collectives": ("collective",), "processes": ("process_name",), "threads": ("thread_name",)}
"""Tables made of these kinds of staged events alone (`_counts`): not queried when the trace has none."""
_IN_ORDER = {"operators"}
"""Tables whose query scans `ev` alone (no join, no aggregate): in `seq` order, without a sort, where
`ev` was staged one batch after the other (DuckDB keeps a table's insertion order through a
filtered scan, `preserve_insertion_order`); else sorted by `seq`."""


def _write_tables(scratch: duckdb.DuckDBPyConnection, sink: Sink, meta: dict[str, Any], counts: dict[str, int],
                  in_order: bool = False) -> None:
    """Pass 2: each store table from the staging rows (`counts` of each kind), streamed to the
    sink; `in_order`: `ev` holds its rows in `seq` order (staged one batch after the other)."""
    for sql in _PREPARE:
        scratch.execute(sql)
    for table, sql in _TABLES:
        if table not in _SOURCE_KINDS or any(counts.get(kind) for kind in _SOURCE_KINDS[table]):
            sort = "" if in_order or table not in _IN_ORDER else " ORDER BY seq"
            if table == "collectives":
                sql = sql.format(kernel_ids=_KERNEL_IDS if counts.get("kernel collective") else _NO_KERNEL_IDS)
            sink.append_all(table, _batches(scratch, sql + sort))
    names = [r[1] for r in scratch.execute(_KERNEL_NAMES).fetchall()]
    shorts = [_short_name(n) for n in names]
    sink.append("kernel_names", pa.table({
        "name_id": pa.array(range(len(names)), pa.int32()), "name": pa.array(names, pa.string()),
        "short_name": pa.array(shorts, pa.string()),
        "mangled_name": pa.array([n if n.startswith("_Z") else None for n in names], pa.string())}), source_rows=0)
    sink.append("gpus", gpu_table(meta), source_rows=0)
    sink.append("process_groups", process_group_table(meta), source_rows=0)


@lru_cache(maxsize=1 << 16)
def _short_name(name: str) -> str:
    """A kernel name's base name, demangled, remembered: a worker demangles a job's names once."""
    return base_name(demangle(name)[0]) or name


def _batches(scratch: duckdb.DuckDBPyConnection, sql: str):  # -> Iterator[pa.Table]
    reader = scratch.sql(sql).to_arrow_reader(1 << 17)
    for batch in reader:
        yield pa.Table.from_batches([batch])
