"""Issue 38's msgspec pass 1, built and measured, not kept (run on demand; msgspec is no traceq
dependency: `pip install msgspec`).

    python bench/kineto_msgspec_stage.py --check sample_traces/*kineto*.json* ../shared/realtraces/kineto_json/*
    python bench/kineto_parsers.py /tmp/traceq-bench/k100k.json --ways duckdb msgspec-stage --reps 3

A batch's events decoded by msgspec into typed structs (only the keys traceq reads; `ts`/`dur`
and the JSON-valued args kept as their raw text), split by kind in one Python loop, and each
kind's columns handed to DuckDB as Arrow, into the reader's staging table `ev`
(`kineto._stage_sql`'s rows, row for row), without DuckDB parsing any JSON but those raw texts.

Typing is strict: a value of a type other than the one declared (a float where an integer is
expected, a string `bytes` or `stream` as ROCm traces write them, an integer past 64 bits, a time
written as a string) makes the batch `Unfit`, and `stage` parses that batch with DuckDB's JSON
reader as the reader does, whose rules (a mistyped arg NULL, a refused file) then hold. Where a
batch fits, the values are those DuckDB's reader gives: integers as they are, the raw texts
through the same casts (`CAST(text AS DECIMAL(38,9))` for the times, `json_transform(text,
'"BIGINT[]"')`, `'"VARCHAR"'` and `'"JSON"'` for the args read as lists, text or JSON), pid and
tid strings through the same `TRY_CAST`.

`--check FILE...` stages each file both ways in one process (in memory, one batch at a time)
and compares the staging rows, ordered by `seq`, printing each way's CPU seconds and the
batches msgspec's types did not take. On 29 November the rows were equal on all 45 files of
that command (the 5 Kineto samples, their 3 FLOP files and the 37 Kineto realtraces; 3 files
with one batch left to DuckDB: ROCm's `bytes` and `stream` written as strings), and the pass
took 2 to 2.5 times DuckDB's CPU: see
docs/performance.md, "Issue 38: msgspec's typed parse into the staging table".
"""

from __future__ import annotations

import gc
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from traceq.ingest import json_stage, kineto
from traceq.ingest.base import LoadOptions
from traceq.ingest.json_events import TraceEvents
from traceq.store import connect

try:
    import msgspec
    from msgspec import Raw, Struct, field
except ImportError:  # a bench dependency only
    msgspec = None  # type: ignore[assignment]

AVAILABLE = msgspec is not None
"""msgspec is installed: `insert_batch` can parse batches."""


class Unfit(Exception):
    """The batch holds something the typed parse does not take: DuckDB's reader parses it."""



if AVAILABLE:
    _EMPTY = Raw()

    class _Args(Struct, gc=False):
        """The args traceq reads, of every kind of event (each kind takes its own below)."""

        correlation: int | None = None
        device: int | None = None
        context: int | None = None
        stream: int | None = None
        registers: int | None = field(default=None, name="registers per thread")
        smem: int | None = field(default=None, name="shared memory")
        grid: Raw = _EMPTY
        block: Raw = _EMPTY
        occupancy: float | None = field(default=None, name="est. achieved occupancy %")
        bytes: int | None = None
        external_id: int | None = field(default=None, name="External id")
        external_id_2021: Raw = field(default=_EMPTY, name="external id")
        input_dims: Raw = field(default=_EMPTY, name="Input Dims")
        input_types: Raw = field(default=_EMPTY, name="Input type")
        concrete_inputs: Raw = field(default=_EMPTY, name="Concrete Inputs")
        flops: int | None = None
        sequence_number: int | None = field(default=None, name="Sequence number")
        mem_bytes: int | None = field(default=None, name="Bytes")
        total_allocated: int | None = field(default=None, name="Total Allocated")
        address: int | None = field(default=None, name="Addr")
        mem_device: int | None = field(default=None, name="Device Id")
        mem_device_type: int | None = field(default=None, name="Device Type")
        label: Raw = field(default=_EMPTY, name="name")
        # collective args (NCCL/RCCL kernels, record_param_comms ops)
        collective: Raw = field(default=_EMPTY, name="Collective name")
        in_msg_nelems: Raw = field(default=_EMPTY, name="In msg nelems")
        out_msg_nelems: Raw = field(default=_EMPTY, name="Out msg nelems")
        in_split_size: Raw = field(default=_EMPTY, name="In split size")
        out_split_size: Raw = field(default=_EMPTY, name="Out split size")
        group_size: Raw = field(default=_EMPTY, name="Group size")
        dtype: Raw = field(default=_EMPTY, name="dtype")
        pg_desc: Raw = field(default=_EMPTY, name="Process Group Description")
        pg_ranks: Raw = field(default=_EMPTY, name="Process Group Ranks")
        pg_name: Raw = field(default=_EMPTY, name="Process Group Name")
        pg_id: Raw = field(default=_EMPTY, name="Process Group ID")

    class _Event(Struct, gc=False):
        ph: str | None = None
        cat: str | None = None
        name: str | None = None
        pid: int | str | None = None
        tid: int | str | None = None
        ts: Raw = _EMPTY
        dur: Raw = _EMPTY
        args: _Args | None = None

    _DECODER = msgspec.json.Decoder(list[_Event])
    _NO_ARGS = _Args()

_X_KINDS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
            "gpu_memset": "memset", "Memset": "memset", "cuda_runtime": "runtime", "Runtime": "runtime",
            "cuda_driver": "driver", "cpu_op": "cpu_op", "Operator": "cpu_op", "user_annotation": "user_annotation",
            "gpu_user_annotation": "gpu_user_annotation", "python_function": "python_function",
            "cuda_profiler_range": "gpu_range"}
"""`kineto._KIND` for complete ('X') events, by category (any other casing of "kernel" too)."""

_GPU_ARGS = ("correlation", "device", "context", "stream", "registers", "smem", "occupancy", "bytes")
_GPU_LISTS = ("grid", "block")
_OPERATOR_ARGS = ("external_id", "flops", "sequence_number")
_OPERATOR_JSON = ("input_dims", "input_types", "concrete_inputs")
_MEMORY_ARGS = ("mem_bytes", "total_allocated", "address", "mem_device", "mem_device_type")
_COLLECTIVE_TEXT = ("collective", "in_split_size", "out_split_size", "dtype", "pg_desc", "pg_ranks", "pg_name", "pg_id")
_COLLECTIVE_INT = ("in_msg_nelems", "out_msg_nelems", "group_size")
_TYPES: dict[str, Any] = {"occupancy": pa.float64(), "address": pa.uint64()}
_STAGED = {"registers": "registers", "smem": "smem", "occupancy": "kineto_occupancy_pct"}
"""Staging columns named otherwise than the struct's fields."""


def insert_batch(con: duckdb.DuckDBPyConnection, chunks: list[list[bytes | memoryview]], first: int,
                 python_functions: bool) -> None:
    """The staging rows of a batch's events (`chunks`, as `json_events.Batch` holds them) into
    `ev`, numbered from `first` on, in one transaction; Unfit (and nothing inserted) where the
    typed parse does not take them."""
    collecting = gc.isenabled()
    gc.disable()  # the structs hold no cycles: collecting while they are made costs a third more
    try:
        events: list[Any] = []
        for chunk in chunks:
            events += _DECODER.decode(b"".join([b"[", *chunk, b"]"]))
        groups = _split(events, python_functions)
        del events
        tables = [(kind, _table(kind, rows, first)) for kind, rows in groups.items()]
        del groups
    except (msgspec.ValidationError, msgspec.DecodeError, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError,
            TypeError, UnicodeDecodeError) as e:
        raise Unfit(str(e)) from None
    finally:
        if collecting:
            gc.enable()
    con.execute("BEGIN TRANSACTION")
    try:
        for kind, table in tables:
            con.register("fast_rows", table)
            try:
                con.execute(_insert_sql(kind, table.column_names))
            finally:
                con.unregister("fast_rows")
        con.execute("COMMIT")
    except (duckdb.ConversionException, duckdb.InvalidInputException) as e:
        con.execute("ROLLBACK")
        raise Unfit(str(e)) from None
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _split(events: list[Any], python_functions: bool) -> dict[str, tuple[list[int], list[Any]]]:
    """The kept events by kind (`kineto._KIND`), each with its place in the batch; events without
    a `ph` go to `bad`."""
    groups: dict[str, tuple[list[int], list[Any]]] = {}
    kinds = _X_KINDS
    for i, e in enumerate(events):
        ph = e.ph
        if ph == "X":
            kind = kinds.get(e.cat)
            if kind is None:
                cat = e.cat
                if cat is None or cat.lower() != "kernel":
                    continue
                kind = "kernel"
            elif kind == "python_function" and not python_functions:
                name = e.name
                if name is None or not name.startswith("nn.Module: "):
                    continue
            elif kind == "user_annotation" and e.name is not None and e.name.startswith("nccl:"):
                kind = "nccl_annotation"  # staged as a user_annotation, with an operator's args
        elif ph == "i":
            if e.name != "[memory]":
                continue
            kind = "memory"
        elif ph == "M":
            kind = e.name
            if kind != "process_name" and kind != "thread_name":
                continue
        elif ph is None:
            kind = "bad"
        else:
            continue
        group = groups.get(kind)
        if group is None:
            group = groups[kind] = ([], [])
        group[0].append(i)
        group[1].append(e)
    return groups


def _table(kind: str, group: tuple[list[int], list[Any]], first: int) -> pa.Table:
    """The Arrow columns of one kind's events (their staging rows' inputs)."""
    places, events = group
    columns: dict[str, Any] = {"seq": pc.add(pa.array(places, pa.int64()), first)}
    columns["name"] = pa.array([e.name for e in events], pa.string())
    for key in ("pid", "tid"):
        values = [getattr(e, key) for e in events]
        if str in set(map(type, values)):
            columns[key + "_text"] = pa.array([v if type(v) is str else None for v in values], pa.string())
            values = [v if type(v) is int else None for v in values]
        columns[key] = pa.array(values, pa.int64())
    columns["ts"] = _texts([e.ts for e in events])
    columns["dur"] = _texts([e.dur for e in events])
    args = [e.args or _NO_ARGS for e in events]
    keys: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()
    if kind in ("kernel", "memcpy", "memset", "gpu_user_annotation", "gpu_range"):
        keys, texts = _GPU_ARGS, _GPU_LISTS
    elif kind in ("runtime", "driver"):
        keys = ("correlation",)
    elif kind in ("cpu_op", "nccl_annotation"):
        keys, texts = _OPERATOR_ARGS, _OPERATOR_JSON
        if "Operator" in {e.cat for e in events}:  # traces of 2021 and before
            columns["external_id_2021"] = _texts([a.external_id_2021 if e.cat == "Operator" else _EMPTY
                                                  for e, a in zip(events, args)])
    elif kind == "memory":
        keys = _MEMORY_ARGS
    elif kind in ("process_name", "thread_name"):
        texts = ("label",)
    if kind in ("kernel", "memcpy", "memset", "gpu_user_annotation", "gpu_range", "cpu_op",
                               "nccl_annotation"):
        texts += _COLLECTIVE_TEXT + _COLLECTIVE_INT
    for key in keys:
        columns[key] = pa.array([getattr(a, key) for a in args], _TYPES.get(key, pa.int64()))
    for key in texts:
        columns[key] = _texts([getattr(a, key) for a in args])
    return pa.table(columns)


def _texts(raws: list[Any]) -> pa.Array:
    """Raw JSON texts as one string array (an absent key: the empty string): joined by NUL,
    which JSON text never holds (a NUL in a string is written `\\u0000`), decoded as UTF-8 and
    split again."""
    text = b"\0".join(raws).decode()
    return pc.split_pattern(pa.array([text], pa.large_string()), "\0")[0].values


def _insert_sql(kind: str, columns: list[str]) -> str:
    """`kineto._stage_sql`'s SELECT, from the typed `columns` of `kind`'s events (an Arrow table
    registered as `fast_rows`)."""
    staged = {"nccl_annotation": "'user_annotation'", "bad": "NULL"}.get(kind, f"'{kind}'")
    have = set(columns)
    select = [f"seq, {kind == 'bad'} AS bad, {staged} AS kind, name"]
    select.append("coalesce(pid, TRY_CAST(pid_text AS BIGINT)) AS pid" if "pid_text" in have else "pid")
    select.append("coalesce(tid, TRY_CAST(tid_text AS BIGINT), TRY_CAST(regexp_extract(tid_text, "
                  "'^stream (\\d+)', 1) AS BIGINT)) AS tid" if "tid_text" in have else "tid")
    for time, column in (("ts", "ts_ns"), ("dur", "dur_ns")):
        if time in have:
            decimal = f"CAST(nullif(nullif({time}, ''), 'null') AS DECIMAL(38,9))"
            select.append(_NS.format(decimal) + f" AS {column}")
    for key in _GPU_ARGS + _OPERATOR_ARGS + _MEMORY_ARGS:
        if key == "external_id" and "external_id_2021" in have:  # traces of 2021 and before
            select.append("coalesce(external_id, TRY_CAST(json_extract(nullif(external_id_2021, ''), '$') "
                          "AS BIGINT)) AS external_id")
        elif key in have:
            select.append(f"{key} AS {_STAGED.get(key, key)}")
    for key in _GPU_LISTS:
        if key in have:
            select.append(f"""json_transform(nullif({key}, ''), '"BIGINT[]"') AS {key}""")
    for key in _OPERATOR_JSON:
        if key in have:
            select.append(f"""json_transform(nullif({key}, ''), '"JSON"') AS {key}""")
    if "label" in have:
        select.append("json_extract_string(nullif(label, ''), '$') AS label")
    if "collective" in have:
        for key in _COLLECTIVE_TEXT[:-2]:
            select.append(f"""json_transform(nullif({key}, ''), '"VARCHAR"') AS {key}""")
        for key in _COLLECTIVE_INT:
            select.append(f"""json_transform(nullif({key}, ''), '"BIGINT"') AS {key}""")
        select.append("""coalesce(json_transform(nullif(pg_name, ''), '"VARCHAR"'),
                                  json_transform(nullif(pg_id, ''), '"VARCHAR"')) AS pg_name""")
    return f"INSERT INTO ev BY NAME SELECT {', '.join(select)} FROM fast_rows"


_NS = "CAST(CASE WHEN abs({0}) < 9000000000000000 THEN {0} ELSE sign({0}) * 9000000000000000 END * 1000 AS BIGINT)"
"""`kineto._NS`: a decimal time as integer ns (rounded half away from zero), held at +-9e18 ns."""


def stage(scratch: duckdb.DuckDBPyConnection, events: TraceEvents, folder: Path, python_functions: bool = False) -> int:
    """Pass 1 with msgspec: every batch into `ev` (made here, as `kineto._stage` makes it), one at a
    time; a batch msgspec's types do not take through DuckDB's reader (`json_stage`, its exact
    re-read included). Returns the number of such batches."""
    (folder / "empty.json").write_bytes(b"[]")
    scratch.execute(f"CREATE TABLE ev AS {kineto._stage_sql([folder / 'empty.json'], 0, True)}")
    unfit = 0

    def insert(paths: list[Path], number: int) -> str:
        return f"INSERT INTO ev {kineto._stage_sql(paths, number << kineto._ROW_BITS, python_functions)}"

    for batch in events:
        try:
            insert_batch(scratch, batch.chunks, batch.number << kineto._ROW_BITS, python_functions)
            continue
        except Unfit:
            unfit += 1
        try:
            json_stage._insert(scratch, folder, batch, insert)
        except json_stage._UNREADABLE:
            json_stage._insert(scratch, folder, events.exact(batch), insert)
    return unfit


class _NoSink:
    progress = None


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _staged(path: Path, fast: bool) -> tuple[list[tuple], float, int]:
    """The staging rows of `path` by seq, the CPU seconds of the pass, the unfit batches."""
    scratch = connect(":memory:", **kineto.SCRATCH_SETTINGS)
    scratch.execute("SET enable_progress_bar = false")
    with tempfile.TemporaryDirectory(prefix="traceq-msgspec-") as folder:
        cpu, unfit = _cpu(), 0
        if fast:
            unfit = stage(scratch, TraceEvents(path), Path(folder))
        else:
            kineto._stage(scratch, TraceEvents(path), Path(folder), LoadOptions(), _NoSink(), parallel=False)
        cpu = _cpu() - cpu
    return scratch.execute("SELECT * FROM ev ORDER BY seq").fetchall(), cpu, unfit


def main() -> None:
    if sys.argv[1:2] != ["--check"] or not AVAILABLE:
        sys.exit(__doc__.split("\n\n")[1] if AVAILABLE else "pip install msgspec first (bench only)")
    differing = 0
    for name in sys.argv[2:]:
        duck, duck_cpu, _ = _staged(Path(name), fast=False)
        fast, fast_cpu, unfit = _staged(Path(name), fast=True)
        differing += duck != fast
        print(f"{'equal' if duck == fast else 'DIFFERENT'} {len(duck):>9,} rows  DuckDB {duck_cpu:6.2f} CPU s  "
              f"msgspec {fast_cpu:6.2f} ({unfit} batches unfit)  {Path(name).name}", flush=True)
    print(f"{differing} of {len(sys.argv) - 2} files staged differently")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
