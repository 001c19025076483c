"""An nsys SQLite export against its parquetdir and arrow forms: convert, then time the loads (run on demand).

    python bench/nsys_columnar.py convert /tmp/traceq-bench/alexnet_1M.sqlite
    python bench/nsys_columnar.py measure /tmp/traceq-bench/alexnet_1M.sqlite --runs 3

`convert` writes SRC.parquetdir/ and SRC.arrow beside SRC in the layout `nsys export --type
parquetdir|arrow` writes (Nsight Systems 2025.3, compared on sample_traces/exports/tiny_torch.*):
one `TABLE.parquet` per table (Snappy, dictionary encoding, Parquet format 2.6, row groups of
1,048,576 rows: Arrow C++ 17's defaults, which nsys's files name as their writer) or one Arrow IPC
stream per table, one after another; each schema carries the table's name in the metadata key
`table_name`, and each column has nsys's own Arrow type, nullability and field metadata
(uint64 ids, int32 grid sizes, large_string text...), taken from the tiny_torch export. A table
or column the tiny_torch export lacks gets its SQLite type (int64, double, large_string). The
big files are converted, not written by nsys: nsys's own batch and row-group sizes at 10M rows
are not known here (the tiny export has one of each per table).

`measure` loads the three forms in turn (SQLite, parquetdir, arrow, SQLite, ...), each a child
process `traceq load` into a fresh store, and prints each run's CPU seconds (user + system, from
the kernel's rusage), wall seconds and peak RSS, then the medians and the same-run ratios of CPU
seconds. `--no-attribute` leaves out what the load keeps beyond the tables (up to 1M kernels).
The form `floor` is SQLite decoding the columns the reader reads (`bench/run.py`'s floor: the
`SELECT max(col), ...` of each table, one thread); `--against DIR` also loads the forms of
`--against-forms` with the `traceq` package in DIR (another revision's tree, `git archive REV`
unpacked into DIR/traceq), in the same turns:

    python bench/nsys_columnar.py measure big.sqlite --forms floor,sqlite,parquetdir,arrow --against /tmp/main
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import ipc

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "sample_traces" / "exports" / "tiny_torch.arrow"
ROW_GROUP_ROWS = 1 << 20
SQLITE_TYPES = {"INTEGER": pa.int64(), "REAL": pa.float64(), "TEXT": pa.large_string()}


def template() -> tuple[list[str], dict[str, pa.Schema]]:
    """The tables of nsys's own Arrow export, in its order, and each one's schema."""
    order, schemas = [], {}
    source = pa.memory_map(str(TEMPLATE))
    while source.tell() < source.size():
        reader = ipc.open_stream(source)
        reader.read_all()
        name = reader.schema.metadata[b"table_name"].decode()
        order.append(name)
        schemas[name] = reader.schema
    return order, schemas


def target_schema(con, table: str, known: pa.Schema | None) -> pa.Schema:
    """nsys's schema for `table`'s SQLite columns: the template's field where it has one."""
    fields = []
    for _, column, declared, notnull, _, _ in con.execute(f'PRAGMA table_info("{table}")'):
        if known is not None and column in known.names:
            fields.append(known.field(column))
        else:
            fields.append(pa.field(column, SQLITE_TYPES.get(declared.upper(), pa.large_string()), not notnull))
    metadata = dict(known.metadata) if known is not None else {}
    metadata[b"table_name"] = table.encode()
    return pa.schema(fields, metadata=metadata)


def batches(con, table: str, schema: pa.Schema):
    """The table's rows in rowid order as record batches of `schema`, read by traceq's own scanner."""
    from traceq.ingest.sqlite_source import scan_table

    read = pa.schema([pa.field(f"c{i}", pa.string() if pa.types.is_large_string(f.type) else
                               pa.float64() if pa.types.is_floating(f.type) else pa.int64())
                      for i, f in enumerate(schema)])
    columns = [(f"c{i}", '"' + f.name.replace('"', '""') + '"') for i, f in enumerate(schema)]
    for chunk in scan_table(con, table, columns, read):
        arrays = [chunk.column(i).cast(f.type, safe=False) for i, f in enumerate(schema)]  # nsys keeps uint64 bits in SQLite as int64
        yield from pa.Table.from_arrays(arrays, schema=schema).to_batches()


def convert(src: Path, parquetdir: Path, arrow: Path) -> None:
    from traceq.ingest.sqlite_source import open_sqlite

    order, known = template()
    con = open_sqlite(src, "adbc")
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                            "AND name NOT LIKE 'sqlite_%'")]
        tables.sort(key=lambda t: (order.index(t) if t in order else len(order), t))
        parquetdir.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(arrow), "wb") as out:
            for table in tables:
                schema = target_schema(con, table, known.get(table))
                started, rows = time.perf_counter(), 0
                with ipc.new_stream(out, schema) as stream, \
                        pq.ParquetWriter(parquetdir / f"{table}.parquet", schema, compression="snappy") as parquet:
                    pending: list[pa.RecordBatch] = []
                    for batch in batches(con, table, schema):
                        stream.write_batch(batch)
                        pending.append(batch)
                        rows += batch.num_rows
                        if sum(b.num_rows for b in pending) >= ROW_GROUP_ROWS:
                            whole = pa.Table.from_batches(pending, schema)
                            parquet.write_table(whole.slice(0, ROW_GROUP_ROWS), row_group_size=ROW_GROUP_ROWS)
                            pending = whole.slice(ROW_GROUP_ROWS).to_batches()
                    if pending or rows == 0:
                        parquet.write_table(pa.Table.from_batches(pending, schema), row_group_size=ROW_GROUP_ROWS)
                if rows > 10_000:
                    print(f"  {table}: {rows:,} rows in {time.perf_counter() - started:.1f} s", flush=True)
    finally:
        con.close()


def forms(src: Path) -> dict[str, Path]:
    return {"sqlite": src, "parquetdir": src.with_suffix(".parquetdir"), "arrow": src.with_suffix(".arrow")}


def load(trace: Path, attribute: bool, against: Path | None = None,
         floor: bool = False) -> tuple[float, float, float]:
    """(CPU s, wall s, peak RSS MiB) of one `traceq load` into a fresh store (with the package in
    `against`), or with `floor` of SQLite decoding the columns the reader reads."""
    env = dict(os.environ, PYTHONPATH=str(against)) if against is not None else None
    with tempfile.TemporaryDirectory(prefix="traceq-columnar-") as tmp:
        argv = [sys.executable, "-m", "traceq", "load", str(trace), "--db", f"{tmp}/s.duckdb"]
        argv += [] if attribute else ["--no-attribute"]
        if floor:
            sys.path.insert(0, str(ROOT / "bench"))
            from run import FLOOR

            argv = [sys.executable, "-c", FLOOR, trace.resolve().as_uri() + "?mode=ro"]
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        if status != 0:
            raise SystemExit(f"loading {trace} failed: {proc.stderr.read().decode()[-500:]}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def measure(src: Path, runs: int, attribute: bool, only: list[str], against: Path | None = None,
            against_forms: tuple[str, ...] = ()) -> None:
    turn = only + [f"against {f}" for f in against_forms if against is not None]
    results: dict[str, list[tuple[float, float, float]]] = {f: [] for f in turn}
    paths = forms(src)
    for i in range(runs):
        for form in turn:
            other = form.startswith("against ")
            base = form.removeprefix("against ")
            cpu, wall, rss = load(paths.get(base, src), attribute, against if other else None, base == "floor")
            results[form].append((cpu, wall, rss))
            print(f"run {i + 1} {form}: {cpu:.2f} CPU s, {wall:.2f} s, {rss:.0f} MiB "
                  f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    medians = {f: [statistics.median(r[k] for r in rows) for k in range(3)] for f, rows in results.items()}
    for form, (cpu, wall, rss) in medians.items():
        print(f"{form}: median {cpu:.2f} CPU s, {wall:.2f} s, {rss:.0f} MiB")
    if "sqlite" in medians:
        for form in medians:
            if form not in ("sqlite", "floor"):
                print(f"sqlite / {form}: CPU {medians['sqlite'][0] / medians[form][0]:.2f} x")
    if "floor" in medians:
        for form in medians:
            if form != "floor":
                print(f"{form} / floor: CPU {medians[form][0] / medians['floor'][0]:.2f} x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["convert", "measure"])
    parser.add_argument("sqlite", type=Path, help="an nsys SQLite export (bench/scale.py makes big ones)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-attribute", dest="attribute", action="store_false")
    parser.add_argument("--forms", default="sqlite,parquetdir,arrow", help="of floor,sqlite,parquetdir,arrow")
    parser.add_argument("--against", type=Path, help="a folder holding another revision's traceq package")
    parser.add_argument("--against-forms", default="sqlite,parquetdir,arrow")
    args = parser.parse_args()
    if args.action == "convert":
        paths = forms(args.sqlite)
        convert(args.sqlite, paths["parquetdir"], paths["arrow"])
        for form, path in paths.items():
            size = sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size
            print(f"{form}: {path} ({size / 2**20:,.0f} MiB)")
    else:
        measure(args.sqlite, args.runs, args.attribute, args.forms.split(","), args.against,
                tuple(args.against_forms.split(",")))


if __name__ == "__main__":
    main()
