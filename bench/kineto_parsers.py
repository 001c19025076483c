"""Compare ways of parsing a Kineto trace's events, against the reader's own pass 1 (on demand).

    python bench/kineto_parsers.py /tmp/traceq-bench/k300k.json --reps 3

Each way runs in its own process, interleaved with the others, `--reps` times; each reports
the CPU seconds (both cores) and wall seconds of its parse alone (the file cut into batches by
`json_events.TraceEvents` as the reader does, imports and start-up excluded), and the medians
are printed. On a shared machine compare CPU seconds. The ways:

- `duckdb`: the reader's pass 1 as it is (`kineto._stage`: each 16 MiB chunk a JSON array
  file, `read_json(format = 'array', columns = ...)` into the staging table, 4 chunks a call;
  in memory and two calls at once up to 256 MiB of JSON, else on disk and one at a time).
- `duckdb-ndjson`: the same query with `format = 'newline_delimited'`, on chunks made one event
  per line (two `bytes.replace`: newlines to spaces, as Kineto writes an event over several
  lines, then the event separator to `}\\n{`).
- `duckdb-batch256`: the reader's pass 1 with 16 chunks (256 MiB) per call instead of 4.
- `pyarrow`: `pyarrow.json.read_json` with an explicit schema of the top-level keys and five
  args, `unexpected_field_behavior="ignore"`, on the same newline-delimited chunks: the parse
  alone, no staging table.
- `pyarrow-insert`: the same with every staged key that has one JSON type in HTA's traces
  (pid and tid do not: `"Spans"`, `"PyTorch Profiler"`; `Input Dims` nests to any depth),
  inserted into a DuckDB table with times as integer ns: a lower bound for a pyarrow path.
- `polars`: `polars.read_ndjson` with a schema of the top-level keys (times as strings, which
  Polars writes from the numbers' text) and an `args` struct of the keys the GPU events and
  operators need (`Input Dims`/`Input type` as strings), on the same one-event-per-line chunks:
  the parse alone, nothing stored.
- `msgspec`: `msgspec.json.Decoder(list[Event])` with typed structs of the same keys (times and
  arrays kept as raw JSON text, `msgspec.Raw`, so not parsed twice) on the JSON array chunks,
  then one Python list per column: the parse alone, nothing stored. msgspec is not a traceq
  dependency; the way is skipped where it is not installed (`pip install msgspec`, bench only).
- `msgspec-stage`: issue 38's msgspec pass 1 (`kineto_msgspec_stage.py`): typed structs of only
  the keys traceq reads, split by kind, each kind's columns into the staging table `ev` as Arrow
  (the rows equal `duckdb`'s: `kineto_msgspec_stage.py --check`), staged as `duckdb` stages.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj

from traceq.ingest import json_events, kineto
from traceq.ingest.base import LoadOptions
from traceq.store import connect

WAYS = ("duckdb", "duckdb-ndjson", "duckdb-batch256", "pyarrow", "pyarrow-insert", "polars", "msgspec",
        "msgspec-stage")


def parse(path: Path, way: str, folder: Path) -> str:
    """Runs one way over the file, its scratch files in `folder`; returns its figures as one line."""
    small = json_events.uncompressed_size(path) <= kineto.MEMORY_STAGING_BYTES  # staged as the reader stages it
    scratch = connect(":memory:" if small else folder / "stage.duckdb", **kineto.SCRATCH_SETTINGS)
    scratch.execute(f"SET temp_directory = '{folder / 'spill'}'")
    scratch.execute("SET enable_progress_bar = false")
    if way == "duckdb-batch256":
        json_events.BATCH_BYTES = 256 << 20
    events = json_events.TraceEvents(path)

    def ndjson(batch: json_events.Batch) -> list[bytes]:
        """One event per line (Kineto writes an event over several): newlines become spaces,
        then separators `}\\n{`. A separator inside a string would break the parse (bench only)."""
        assert events._separator is not None
        sep = events._separator.replace(b"\n", b" ")
        return [b"".join(chunk).replace(b"\n", b" ").replace(sep, b"}\n{") for chunk in batch.chunks]

    def arrow(text: bytes, schema: pa.Schema) -> pa.Table:
        options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        return pj.read_json(io.BytesIO(text), parse_options=options)

    wall, cpu = time.perf_counter(), time.process_time()
    if way in ("duckdb", "duckdb-batch256"):
        kineto._stage(scratch, events, folder, LoadOptions(), _NoSink(), parallel=small)
    elif way == "duckdb-ndjson":
        (folder / "empty.json").write_bytes(b"[]")
        scratch.execute(f"CREATE TABLE ev AS {kineto._stage_sql([folder / 'empty.json'], 0, True)}")
        for batch in events:
            files = [folder / f"chunk{i}.json" for i in range(len(batch.chunks))]
            for file, text in zip(files, ndjson(batch)):
                file.write_bytes(text)
            sql = kineto._stage_sql(files, batch.number << kineto._ROW_BITS, False)
            scratch.execute("INSERT INTO ev " + sql.replace("format = 'array'", "format = 'newline_delimited'"))
    elif way == "msgspec-stage":
        import kineto_msgspec_stage  # beside this file

        kineto_msgspec_stage.stage(scratch, events, folder)
    elif way == "polars":
        import polars as pl

        for batch in events:
            for text in ndjson(batch):
                pl.read_ndjson(io.BytesIO(text), schema=_polars_schema())
    elif way == "msgspec":
        decode = _msgspec_decoder()
        for batch in events:
            for chunk in batch.chunks:
                rows = decode(b"[" + b"".join(chunk) + b"]")
                columns = {key: [getattr(row, key) for row in rows] for key in rows[0].__struct_fields__}  # noqa: F841
    else:
        schema = _ARROW_FULL if way == "pyarrow-insert" else _ARROW_SMALL
        for batch in events:
            for text in ndjson(batch):
                table = arrow(text, schema)  # noqa: F841 (read by the SQL below)
                if way == "pyarrow-insert":
                    scratch.execute("CREATE TABLE IF NOT EXISTS ev AS " + _ARROW_ROWS + " LIMIT 0")
                    scratch.execute("INSERT INTO ev " + _ARROW_ROWS)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rows = scratch.execute("SELECT count(*) FROM ev").fetchone()[0] if way not in ("pyarrow", "polars", "msgspec") else 0
    return f"{way} {cpu:.2f} {wall:.2f} {rows}"


class _NoSink:
    progress = None


def _arrow_schemas() -> tuple[pa.Schema, pa.Schema]:
    top = [("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()),
           ("ts", pa.decimal128(38, 9)), ("dur", pa.decimal128(38, 9))]
    few = [(k, pa.int64()) for k in ("correlation", "External id", "device", "registers per thread")]
    every = [(k, pa.int64()) for k in (
        "correlation", "device", "context", "stream", "registers per thread", "shared memory", "bytes",
        "External id", "flops", "Sequence number", "Bytes", "Total Allocated", "Device Id", "Device Type")]
    lists = [("grid", pa.list_(pa.int64())), ("block", pa.list_(pa.int64())),
             ("est. achieved occupancy %", pa.float64()), ("name", pa.string())]
    return (pa.schema(top + [("args", pa.struct(few + lists[:1]))]),
            pa.schema(top + [("args", pa.struct(every + lists))]))


_ARGS = {"correlation": int, "External id": int, "device": int, "stream": int, "registers per thread": int,
         "shared memory": int, "est. achieved occupancy %": float, "bytes": int, "flops": int,
         "Sequence number": int}
_ARG_ARRAYS = ("grid", "block", "Input Dims", "Input type")


def _polars_schema() -> dict:
    import polars as pl

    kinds = {int: pl.Int64, float: pl.Float64}
    args = {key: kinds[kind] for key, kind in _ARGS.items()} | {"grid": pl.List(pl.Int64), "block": pl.List(pl.Int64),
                                                             "Input Dims": pl.String, "Input type": pl.String}
    return {key: pl.String for key in ("ph", "cat", "name", "pid", "tid", "ts", "dur")} | {"args": pl.Struct(args)}


def _msgspec_decoder():
    import msgspec

    def attribute(key: str) -> str:
        return "a_" + "".join(c if c.isalnum() else "_" for c in key)

    raw = msgspec.Raw()
    args = msgspec.defstruct("Args", [(attribute(k), kind | None, msgspec.field(default=None, name=k))
                                      for k, kind in _ARGS.items()]
                             + [(attribute(k), msgspec.Raw, msgspec.field(default=raw, name=k)) for k in _ARG_ARRAYS])
    event = msgspec.defstruct("Event", [(k, str | None, None) for k in ("ph", "cat", "name")]
                              + [(k, msgspec.Raw, raw) for k in ("pid", "tid", "ts", "dur")]
                              + [("args", args | None, None)])
    return msgspec.json.Decoder(list[event]).decode


_ARROW_ROWS = ("SELECT ph, cat, name, CAST(ts * 1000 AS BIGINT) AS ts_ns, CAST(dur * 1000 AS BIGINT) AS dur_ns, "
               "args.* FROM \"table\"")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one run, in a child process
    args = parser.parse_args()
    if args.way:
        folder = Path(tempfile.mkdtemp(prefix="traceq-parsers-"))
        try:
            print(parse(args.path, args.way, folder), flush=True)
        finally:
            shutil.rmtree(folder)
        return
    if importlib.util.find_spec("msgspec") is None:
        for way in {"msgspec", "msgspec-stage"} & set(args.ways):
            print(f"msgspec is not installed: {way} is skipped", flush=True)
            args.ways.remove(way)
    results: dict[str, list[tuple[float, float]]] = {way: [] for way in args.ways}
    for _ in range(args.reps):
        for way in args.ways:
            line = subprocess.run([sys.executable, __file__, str(args.path), "--way", way],
                                  check=True, capture_output=True, text=True).stdout.split()
            results[way].append((float(line[1]), float(line[2])))
            print(f"  {way}: {line[1]} CPU s, {line[2]} s, {int(line[3]):,} rows", flush=True)
    print(f"{args.path} ({args.path.stat().st_size / 1e9:.2f} GB), medians of {args.reps}:")
    base = statistics.median(r[0] for r in results[args.ways[0]])
    for way, rows in results.items():
        cpu, wall = (statistics.median(r[i] for r in rows) for i in range(2))
        print(f"{way:16s} {cpu:7.2f} CPU s (x{cpu / base:.2f} {args.ways[0]}'s) {wall:7.1f} s")


_ARROW_SMALL, _ARROW_FULL = _arrow_schemas()

if __name__ == "__main__":
    main()
