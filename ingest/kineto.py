"""PyTorch profiler (Kineto) JSON traces: `torch.profiler` / `export_chrome_trace`, plain or gzip,
CUDA (CUPTI) and ROCm (roctracer) alike, schema versions of 2021 to 2026.

Two passes, neither holding the trace in Python objects:

1. **Stage.** `json_events.TraceEvents` cuts the traceEvents array into chunks of event texts;
   DuckDB's JSON reader (C++, in a scratch in-memory database of its own) parses each chunk
   into typed columns (`_STAGE_SQL`) and the rows traceq uses go to a temporary Parquet file,
   compressed, with each event's position in the file.
2. **Store.** SQL over that file (`_TABLES`) numbers names, launch configurations, queues and
   threads, and streams each store table to the sink.

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
  `user_annotation` (ProfilerStep#N, Optimizer.step...) and, opt-in, `python_function`, as
  push/pop ranges of their thread; `gpu_user_annotation` as start/end ranges of no process.
  Shapes and PyTorch's own FLOPs of operators go to `operators`.
- `[memory]` instant events into memory_events (the bytes already allocated before the first
  one, `Total Allocated - Bytes`, as one allocation at that time, as nsys does for a capture).
- collective arguments of NCCL/RCCL kernels and `record_param_comms` ops into `collectives`;
  `distributedInfo` into traces (rank, world size, backend) and `process_groups`.
- `deviceProperties` into gpus; Kineto records no clock, so the clock is taken from
  `KNOWN_CLOCKS_HZ` by the GPU's name where traceq knows it.

Times: `ts` and `dur` are microseconds written as decimals (some versions with three digits
after the point, some as integers); they are read as exact decimals and stored as integer ns,
never through a float. Events with required fields missing are refused.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from traceq.errors import TraceFormatError
from traceq.ingest.base import LoadOptions, Sink, SourceInfo
from traceq.ingest.json_events import TraceEvents, uncompressed_size
from traceq.ingest.nvprof import base_name, demangle
from traceq.store import connect

SCRATCH_SETTINGS = {"memory_limit": "300MB", "threads": "2", "preserve_insertion_order": "true"}
"""The scratch database's settings: a bounded memory (it spills to the temporary folder)."""

KNOWN_CLOCKS_HZ = {
    "NVIDIA H200": 1_980_000_000,
    "NVIDIA H100 80GB HBM3": 1_980_000_000,
    "NVIDIA A100-SXM4-80GB": 1_410_000_000,
    "NVIDIA A100-PG509-200": 1_410_000_000,
    "Tesla V100-SXM2-32GB": 1_530_000_000,
    "Tesla V100-SXM2-16GB": 1_530_000_000,
    "Tesla V100-DGXS-32GB": 1_530_000_000,
}
"""Maximum SM clock by device name, for the peaks of `traceq ce`: Kineto's deviceProperties
lack it. Each value is the clockRate of a device record of the same name (nsys TARGET_INFO_GPU,
nvprof CUPTI_ACTIVITY_KIND_DEVICE) in our reference traces or realtraces; tests check them."""

_ARGS = {
    "correlation": "BIGINT", "External id": "BIGINT",
    "device": "BIGINT", "context": "BIGINT", "stream": "VARCHAR",
    "registers per thread": "BIGINT", "shared memory": "BIGINT", "grid": "BIGINT[]", "block": "BIGINT[]",
    "est. achieved occupancy %": "DOUBLE", "bytes": "BIGINT",
    "Total Allocated": "BIGINT", "Addr": "UBIGINT", "Device Id": "BIGINT",
    "Device Type": "BIGINT",
    "Input Dims": "JSON", "Input type": "JSON", "Concrete Inputs": "JSON", "flops": "BIGINT",
    "Sequence number": "BIGINT",
    "Collective name": "VARCHAR", "In msg nelems": "BIGINT", "Out msg nelems": "BIGINT",
    "In split size": "VARCHAR", "Out split size": "VARCHAR", "Group size": "BIGINT", "dtype": "VARCHAR",
    "Process Group Name": "VARCHAR", "Process Group Description": "VARCHAR",
    "Process Group Ranks": "VARCHAR", "Process Group ID": "VARCHAR",
    "name": "VARCHAR",
}
_EVENT = {"ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "VARCHAR", "tid": "VARCHAR",
          "ts": "DECIMAL(38,9)", "dur": "DECIMAL(38,9)", "args": _ARGS}


def _structure(spec: dict[str, Any]) -> str:
    items = (f'"{k}": ' + (_structure(v) if isinstance(v, dict) else f'"{v}"') for k, v in spec.items())
    return "{" + ", ".join(items) + "}"


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

_NS = "CAST(j.{0} * 1000 AS BIGINT)"  # a decimal cast to an integer rounds half away from zero, exactly


def _stage_sql(python_functions: bool) -> str:
    """One chunk's events (table `chunk`: seq, the event's position in the file, and e, its
    text) as the staging rows."""
    a = "j.args"
    keep = "" if python_functions else " AND kind <> 'python_function'"
    return f"""
    WITH flat AS MATERIALIZED (
        SELECT seq, e, j, j.ph AS ph, j.cat AS cat, j.name AS name
        FROM (SELECT seq, e, json_transform(e, '{_structure(_EVENT)}') AS j FROM chunk)
    ),
    typed AS (
        SELECT seq, j IS NULL OR ph IS NULL AS bad, {_KIND} AS kind, name, TRY_CAST(j.pid AS BIGINT) AS pid,
               coalesce(TRY_CAST(j.tid AS BIGINT), TRY_CAST(regexp_extract(j.tid, '^stream (\\d+)', 1) AS BIGINT)) AS tid,
               {_NS.format("ts")} AS ts_ns, {_NS.format("dur")} AS dur_ns,
               {a}.correlation, coalesce({a}."External id", CASE WHEN {a}."External id" IS NULL AND cat = 'Operator'
                   THEN TRY_CAST(json_extract_string(e, '$.args."external id"') AS BIGINT) END) AS external_id,
               {a}.device, {a}.context, TRY_CAST({a}.stream AS BIGINT) AS stream,
               {a}."registers per thread" AS registers, {a}."shared memory" AS smem,
               {a}.grid, {a}.block, {a}."est. achieved occupancy %" AS kineto_occupancy_pct, {a}.bytes,
               CASE WHEN name = '[memory]' THEN TRY_CAST(json_extract_string(e, '$.args.Bytes') AS BIGINT) END AS mem_bytes, {a}."Total Allocated" AS total_allocated, {a}.Addr AS address,
               {a}."Device Id" AS mem_device, {a}."Device Type" AS mem_device_type,
               {a}."Input Dims" AS input_dims, {a}."Input type" AS input_types,
               {a}."Concrete Inputs" AS concrete_inputs, {a}.flops, {a}."Sequence number" AS sequence_number,
               {a}."Collective name" AS collective, {a}."In msg nelems" AS in_msg_nelems,
               {a}."Out msg nelems" AS out_msg_nelems, {a}."In split size" AS in_split_size,
               {a}."Out split size" AS out_split_size, {a}."Group size" AS group_size, {a}.dtype,
               coalesce({a}."Process Group Name", {a}."Process Group ID") AS pg_name,
               {a}."Process Group Description" AS pg_desc, {a}."Process Group Ranks" AS pg_ranks,
               {a}.name AS label
        FROM flat
    )
    SELECT * FROM typed WHERE bad OR (kind IS NOT NULL{keep})
    """


@dataclass
class KinetoSource:
    """An opened Kineto trace: the file, the load's options, and what the reader learned."""

    path: Path
    options: LoadOptions
    scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="traceq-kineto-")))

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
        scratch = connect(**SCRATCH_SETTINGS)  # offline, as every traceq connection
        scratch.execute(f"SET temp_directory = '{src.scratch / 'spill'}'")
        try:
            events = TraceEvents(src.path)
            stage = src.scratch / "events.parquet"
            counts = _stage(scratch, events, stage, src.options, sink)
            meta = events.metadata
            scratch.execute(f"CREATE VIEW ev AS SELECT * FROM read_parquet('{stage}')")
            _check(scratch, src.path, counts)
            _write_tables(scratch, sink, meta)
            return _source_info(meta)
        finally:
            scratch.close()


def _stage(scratch: duckdb.DuckDBPyConnection, events: TraceEvents, stage: Path, options: LoadOptions,
           sink: Sink) -> dict[str, int]:
    """Pass 1: every chunk of events parsed into staging rows in `stage`; returns rows per kind."""
    sql = _stage_sql(options.python_functions)
    writer: pq.ParquetWriter | None = None
    offset, reported = 0, 0
    counts: dict[str, int] = {}
    try:
        for chunk in events:
            rows = _parse(scratch, sql, chunk, offset, events)
            offset += len(chunk)
            if writer is None:
                writer = pq.ParquetWriter(stage, rows.schema, compression="lz4")
            writer.write_table(rows)
            for kind, n in zip(*_kind_counts(rows)):
                counts[kind] = counts.get(kind, 0) + n
            if sink.progress is not None:
                sink.progress(events.bytes_read - reported)
                reported = events.bytes_read
    finally:
        if writer is not None:
            writer.close()
    if writer is None:  # not one event: an empty staging file of the right columns
        pq.write_table(_parse(scratch, sql, pa.array([], pa.large_string()), 0, events), stage)
    return counts


def _parse(scratch: duckdb.DuckDBPyConnection, sql: str, chunk: pa.Array, offset: int,
           events: TraceEvents) -> pa.Table:
    scratch.register("chunk", _numbered(chunk, offset))
    try:
        try:
            rows = scratch.sql(sql).to_arrow_table()
        except duckdb.InvalidInputException:  # a piece that is not one event: re-read exactly
            scratch.register("chunk", _numbered(events.exact(chunk), offset))
            try:
                rows = scratch.sql(sql).to_arrow_table()
            except duckdb.InvalidInputException as e:
                raise TraceFormatError(f"{events.path} has an event DuckDB cannot read ({_first_line(e)})") from None
    finally:
        scratch.unregister("chunk")
    return rows


def _numbered(chunk: pa.Array, offset: int) -> pa.Table:
    return pa.table({"seq": pa.array(range(offset, offset + len(chunk)), pa.int64()), "e": chunk})


def _kind_counts(rows: pa.Table) -> tuple[list[str], list[int]]:
    import pyarrow.compute as pc

    counts = pc.value_counts(rows["kind"].combine_chunks()).to_pylist()
    return [c["values"] if c["values"] is not None else "" for c in counts], [c["counts"] for c in counts]


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


_REQUIRED = {
    "kernel": ("ts_ns", "dur_ns", "name"), "memcpy": ("ts_ns", "dur_ns"), "memset": ("ts_ns", "dur_ns"),
    "runtime": ("ts_ns", "dur_ns", "name", "pid", "tid"), "driver": ("ts_ns", "dur_ns", "name", "pid", "tid"),
    "cpu_op": ("ts_ns", "dur_ns", "name", "pid", "tid"), "user_annotation": ("ts_ns", "dur_ns", "name", "pid", "tid"),
    "gpu_user_annotation": ("ts_ns", "dur_ns", "name"), "python_function": ("ts_ns", "dur_ns", "pid", "tid"),
    "memory": ("ts_ns", "mem_bytes"),
}
_GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_user_annotation", "gpu_range")


def _check(scratch: duckdb.DuckDBPyConnection, path: Path, counts: dict[str, int]) -> None:
    """Refuse a trace with unreadable events, events lacking what traceq needs, or no GPU event."""
    bad = scratch.execute("SELECT min(seq) FROM ev WHERE bad").fetchall()[0][0]
    if bad is not None:
        raise TraceFormatError(f"{path}: traceEvents[{bad}] is not an event object (no \"ph\")")
    tests = " UNION ALL ".join(
        f"SELECT '{kind}' AS kind, '{column}' AS field, min(seq) AS seq FROM ev "
        f"WHERE kind = '{kind}' AND {column} IS NULL"
        for kind, columns in _REQUIRED.items() if counts.get(kind) for column in columns)
    if tests:
        missing = scratch.execute(f"SELECT * FROM ({tests}) WHERE seq IS NOT NULL ORDER BY seq LIMIT 1").fetchall()
        if missing:
            kind, column, seq = missing[0]
            label = {"ts_ns": "ts", "dur_ns": "dur", "mem_bytes": "args.Bytes"}.get(column, column)
            raise TraceFormatError(f"{path}: traceEvents[{seq}], a {kind} event, has no valid \"{label}\"; "
                                   "the trace is damaged or not from the PyTorch profiler")
        negative = scratch.execute("SELECT min(seq) FROM ev WHERE dur_ns < 0 AND kind IN "
                                   "('kernel', 'memcpy', 'memset', 'runtime', 'driver')").fetchall()[0][0]
        if negative is not None:
            raise TraceFormatError(f"{path}: traceEvents[{negative}] has a negative \"dur\"")
    if not any(counts.get(k) for k in _GPU_KINDS):
        raise TraceFormatError(
            f"{path} has no GPU events (no kernel, memcpy or memset): profile with "
            "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")


# --- pass 2: the store's tables ------------------------------------------------------------

_LAUNCH_PID = """(SELECT correlation, min(pid) AS pid FROM ev WHERE kind IN ('runtime', 'driver')
                  AND correlation IS NOT NULL GROUP BY correlation)"""
_MAIN_PID = "(SELECT pid FROM ev WHERE kind IN ('runtime', 'driver', 'cpu_op') GROUP BY pid ORDER BY count(*) DESC, pid LIMIT 1)"

_CONFIG = ("grid[1]", "grid[2]", "grid[3]", "block[1]", "block[2]", "block[3]", "registers", "smem",
           "kineto_occupancy_pct")
_QUEUE = ("device", "context", "stream", "pid")

_GPU_ROWS = f"""
    SELECT e.*, coalesce(l.pid, {_MAIN_PID}) AS launch_pid
    FROM ev e LEFT JOIN {_LAUNCH_PID} l USING (correlation)
    WHERE e.kind IN ({{kinds}})"""

_KERNELS = f"""
    WITH k AS ({_GPU_ROWS.format(kinds="'kernel'")}),
    q AS (SELECT *, launch_pid AS qpid FROM k)
    SELECT row_number() OVER (ORDER BY seq) - 1 AS kernel_id, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns,
           correlation AS correlation_id,
           CAST(dense_rank() OVER (ORDER BY name) - 1 AS INTEGER) AS name_id,
           CAST(dense_rank() OVER (ORDER BY {", ".join(_CONFIG)}) - 1 AS INTEGER) AS config_id,
           CAST(dense_rank() OVER (ORDER BY device, context, stream, qpid) - 1 AS INTEGER) AS queue_id
    FROM q ORDER BY seq"""

_KERNEL_CONFIGS = f"""
    SELECT DISTINCT CAST(dense_rank() OVER (ORDER BY {", ".join(_CONFIG)}) - 1 AS INTEGER) AS config_id,
           grid[1] AS grid_x, grid[2] AS grid_y, grid[3] AS grid_z,
           block[1] AS block_x, block[2] AS block_y, block[3] AS block_z,
           registers AS registers_per_thread, smem AS smem_static_bytes, kineto_occupancy_pct
    FROM ev WHERE kind = 'kernel' ORDER BY config_id"""

_KERNEL_QUEUES = f"""
    SELECT DISTINCT CAST(dense_rank() OVER (ORDER BY device, context, stream, launch_pid) - 1 AS INTEGER) AS queue_id,
           device AS device_id, context AS context_id, stream AS stream_id, launch_pid AS pid
    FROM ({_GPU_ROWS.format(kinds="'kernel'")}) ORDER BY queue_id"""

_KERNEL_NAMES = """
    SELECT CAST(dense_rank() OVER (ORDER BY name) - 1 AS INTEGER) AS name_id, name
    FROM (SELECT DISTINCT name FROM ev WHERE kind = 'kernel') ORDER BY name_id"""

_API_KEY = "CASE kind WHEN 'runtime' THEN 'runtime' ELSE 'driver' END, name"
_API_EVENTS = f"""
    SELECT ts_ns AS start_ns, ts_ns + dur_ns AS end_ns,
           CAST(dense_rank() OVER (ORDER BY {_API_KEY}) - 1 AS INTEGER) AS name_id,
           CAST(dense_rank() OVER (ORDER BY pid, tid) - 1 AS INTEGER) AS thread_id,
           correlation AS correlation_id
    FROM ev WHERE kind IN ('runtime', 'driver') ORDER BY seq"""
_API_NAMES = f"""
    SELECT DISTINCT CAST(dense_rank() OVER (ORDER BY {_API_KEY}) - 1 AS INTEGER) AS name_id,
           CASE kind WHEN 'runtime' THEN 'runtime' ELSE 'driver' END AS api, name
    FROM ev WHERE kind IN ('runtime', 'driver') ORDER BY name_id"""
_API_THREADS = """
    SELECT DISTINCT CAST(dense_rank() OVER (ORDER BY pid, tid) - 1 AS INTEGER) AS thread_id, pid, tid
    FROM ev WHERE kind IN ('runtime', 'driver') ORDER BY thread_id"""

_COPY_KIND = {"HtoD": "Host-to-Device", "DtoH": "Device-to-Host", "HtoA": "Host-to-Array",
              "AtoH": "Array-to-Host", "AtoA": "Array-to-Array", "AtoD": "Array-to-Device",
              "DtoA": "Device-to-Array", "DtoD": "Device-to-Device", "HtoH": "Host-to-Host",
              "PtoP": "Peer-to-Peer"}
"""Kineto's memcpy kinds (CUPTI's getMemcpyKindString) in the words `nsys stats` uses."""

_MEMOPS = f"""
    WITH m AS ({_GPU_ROWS.format(kinds="'memcpy', 'memset'")}),
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

_RANGE_KINDS = "'cpu_op', 'user_annotation', 'gpu_user_annotation', 'python_function'"
_RANGE_ATTRS = """CASE kind WHEN 'gpu_user_annotation' THEN 'startend' ELSE 'pushpop' END,
                  kind, CASE WHEN kind = 'gpu_user_annotation' THEN NULL ELSE pid END,
                  CASE WHEN kind = 'gpu_user_annotation' THEN coalesce(stream, tid) ELSE tid END"""
_NVTX_EVENTS = f"""
    SELECT ts_ns AS start_ns, ts_ns + dur_ns AS end_ns, name,
           CAST(dense_rank() OVER (ORDER BY {_RANGE_ATTRS}) - 1 AS INTEGER) AS attributes_id
    FROM ev WHERE kind IN ({_RANGE_KINDS}) ORDER BY seq"""
_NVTX_ATTRIBUTES = f"""
    SELECT DISTINCT CAST(dense_rank() OVER (ORDER BY {_RANGE_ATTRS}) - 1 AS INTEGER) AS attributes_id,
           CASE kind WHEN 'gpu_user_annotation' THEN 'startend' ELSE 'pushpop' END AS kind, kind AS domain,
           CASE WHEN kind = 'gpu_user_annotation' THEN NULL ELSE pid END AS pid,
           CASE WHEN kind = 'gpu_user_annotation' THEN coalesce(stream, tid) ELSE tid END AS tid
    FROM ev WHERE kind IN ({_RANGE_KINDS}) ORDER BY attributes_id"""

_OPERATORS = """
    SELECT pid, tid, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns, name, sequence_number, external_id,
           CAST(input_dims AS VARCHAR) AS input_dims, CAST(input_types AS VARCHAR) AS input_types,
           CAST(concrete_inputs AS VARCHAR) AS concrete_inputs, flops
    FROM ev WHERE kind = 'cpu_op' AND (input_dims IS NOT NULL OR flops IS NOT NULL) ORDER BY seq"""

_MEMORY_EVENTS = f"""
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

_COLLECTIVES = f"""
    WITH kernel_ids AS (SELECT seq, row_number() OVER (ORDER BY seq) - 1 AS kernel_id FROM ev WHERE kind = 'kernel')
    SELECT k.kernel_id, kind AS event, CASE WHEN kind = 'kernel' THEN NULL ELSE pid END AS pid,
           CASE WHEN kind = 'kernel' THEN NULL ELSE tid END AS tid, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns,
           collective, in_msg_nelems, out_msg_nelems, in_split_size, out_split_size, group_size, dtype,
           pg_name, pg_desc, pg_ranks
    FROM ev LEFT JOIN kernel_ids k USING (seq)
    WHERE collective IS NOT NULL AND kind IN ('kernel', 'cpu_op') ORDER BY seq"""

_PROCESSES = """SELECT DISTINCT pid, label AS name FROM ev WHERE kind = 'process_name' AND pid IS NOT NULL"""
_THREADS = """SELECT DISTINCT pid, tid, label AS name FROM ev WHERE kind = 'thread_name' AND pid IS NOT NULL"""

_TABLES = (("kernel_events", _KERNELS), ("kernel_configs", _KERNEL_CONFIGS), ("kernel_queues", _KERNEL_QUEUES),
           ("api_events", _API_EVENTS), ("api_names", _API_NAMES), ("api_threads", _API_THREADS),
           ("memops", _MEMOPS), ("nvtx_events", _NVTX_EVENTS), ("nvtx_attributes", _NVTX_ATTRIBUTES),
           ("operators", _OPERATORS), ("memory_events", _MEMORY_EVENTS), ("collectives", _COLLECTIVES),
           ("processes", _PROCESSES), ("threads", _THREADS))


def _write_tables(scratch: duckdb.DuckDBPyConnection, sink: Sink, meta: dict[str, Any]) -> None:
    """Pass 2: each store table from the staging rows, streamed to the sink."""
    for table, sql in _TABLES:
        sink.append_all(table, _batches(scratch, sql))
    names = [r[1] for r in scratch.execute(_KERNEL_NAMES).fetchall()]
    shorts = [base_name(demangle(n)[0]) or n for n in names]
    sink.append("kernel_names", pa.table({
        "name_id": pa.array(range(len(names)), pa.int32()), "name": pa.array(names, pa.string()),
        "short_name": pa.array(shorts, pa.string()),
        "mangled_name": pa.array([n if n.startswith("_Z") else None for n in names], pa.string())}), source_rows=0)
    sink.append("gpus", _gpus(meta), source_rows=0)
    sink.append("process_groups", _process_groups(meta), source_rows=0)


def _batches(scratch: duckdb.DuckDBPyConnection, sql: str):  # -> Iterator[pa.Table]
    reader = scratch.sql(sql).to_arrow_reader(1 << 17)
    for batch in reader:
        yield pa.Table.from_batches([batch])


def _gpus(meta: dict[str, Any]) -> pa.Table:
    rows = []
    amd = any(k.startswith(("roctracer", "hip_")) for k in meta)
    for d in meta.get("deviceProperties") or []:
        if not isinstance(d, dict):
            continue
        name = d.get("name")
        vendor = "AMD" if amd or str(name or "").startswith("AMD") or d.get("warpSize") == 64 else "NVIDIA"
        nvidia = vendor == "NVIDIA"
        threads, warp = _int(d.get("maxThreadsPerMultiprocessor")), _int(d.get("warpSize"))
        rows.append({
            "device_id": _int(d.get("id")), "name": name, "vendor": vendor,
            # AMD's computeMajor/Minor are a gfx version (9.4: MI300X), not a CUDA compute capability
            "cc_major": _int(d.get("computeMajor")) if nvidia else None,
            "cc_minor": _int(d.get("computeMinor")) if nvidia else None,
            "sm_count": _int(d.get("numSms")), "clock_hz": KNOWN_CLOCKS_HZ.get(name) if nvidia else None,
            "memory_bytes": _int(d.get("totalGlobalMem")), "threads_per_warp": warp,
            "max_threads_per_block": _int(d.get("maxThreadsPerBlock")),
            "max_warps_per_sm": threads // warp if threads and warp else None,
            "max_registers_per_sm": _int(d.get("regsPerMultiprocessor")),
            "max_registers_per_block": _int(d.get("regsPerBlock")),
            "max_smem_per_sm_bytes": _int(d.get("sharedMemPerMultiprocessor")
                                          or d.get("maxSharedMemoryPerMultiProcessor")),
            "max_smem_per_block_bytes": _int(d.get("sharedMemPerBlock")),
            "max_smem_per_block_optin_bytes": _int(d.get("sharedMemPerBlockOptin")),
        })
    types = {"name": pa.string(), "vendor": pa.string()}
    columns = ["device_id", "name", "vendor", "cc_major", "cc_minor", "sm_count", "clock_hz", "memory_bytes",
               "threads_per_warp", "max_threads_per_block", "max_warps_per_sm", "max_registers_per_sm",
               "max_registers_per_block", "max_smem_per_sm_bytes", "max_smem_per_block_bytes",
               "max_smem_per_block_optin_bytes"]
    return pa.table({c: pa.array([r[c] for r in rows], types.get(c, pa.int64())) for c in columns})


def _process_groups(meta: dict[str, Any]) -> pa.Table:
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    groups = [g for g in info.get("pg_config") or [] if isinstance(g, dict)]
    return pa.table({
        "pg_name": pa.array([_text(g.get("pg_name")) for g in groups], pa.string()),
        "pg_desc": pa.array([_text(g.get("pg_desc")) for g in groups], pa.string()),
        "backend_config": pa.array([_text(g.get("backend_config")) for g in groups], pa.string()),
        "pg_size": pa.array([_int(g.get("pg_size")) for g in groups], pa.int64()),
        "ranks": pa.array([[r for r in g.get("ranks") or [] if isinstance(r, int)] for g in groups],
                          pa.list_(pa.int64())),
    })


def _source_info(meta: dict[str, Any]) -> SourceInfo:
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    versions = [f"{key} {meta[key]}" for key in ("cupti_version", "roctracer_version") if key in meta]
    tool = "PyTorch profiler (Kineto)" + (f", {', '.join(versions)}" if versions else "")
    base = _int(meta.get("baseTimeNanoseconds"))
    return SourceInfo(format="kineto", tool=tool, schema_version=_text(meta.get("schemaVersion")),
                      session_start_utc_ns=base, rank=_int(info.get("rank")),
                      world_size=_int(info.get("world_size")), backend=_text(info.get("backend")))


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
