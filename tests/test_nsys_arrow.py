"""Nsight Systems' Arrow and Parquet exports (ingest/nsys_arrow.py): one report exported three
ways by nsys itself (sample_traces/exports, tools/record_nsys_exports.sh) loads alike, the row
counts equal a reading of the raw Arrow and Parquet tables written here with pyarrow, and damaged
or crafted inputs are refused in one line with the store unchanged."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import sample
from pyarrow import ipc

from traceq import TraceFormatError

EXPORTS = "exports/tiny_torch"
TABLES = {"CUPTI_ACTIVITY_KIND_KERNEL": "kernels", "CUPTI_ACTIVITY_KIND_RUNTIME": "api_events",
          "NVTX_EVENTS": None}


def _raw_counts(form: str) -> dict[str, int]:
    """Rows per nsys table, read straight from the export's files."""
    path = sample(f"{EXPORTS}.{form}")
    counts: dict[str, int] = {}
    if form == "parquetdir":
        for file in path.glob("*.parquet"):
            counts[file.stem] = pq.read_metadata(file).num_rows
        return counts
    source = pa.memory_map(str(path))
    while source.tell() < source.size():
        reader = ipc.open_stream(source)
        counts[reader.schema.metadata[b"table_name"].decode()] = reader.read_all().num_rows
    return counts


def _contents(con, trace_id: int) -> list[list]:
    return [con.execute(q, [trace_id]).fetchall() for q in (
        "SELECT name, start_ns, end_ns, grid_x, block_x, stream_id FROM kernels WHERE trace_id = ? ORDER BY ALL",
        "SELECT name, start_ns, end_ns, domain FROM nvtx WHERE trace_id = ? ORDER BY ALL",
        "SELECT op, start_ns, bytes FROM memops WHERE trace_id = ? ORDER BY ALL",
        "SELECT count(*), min(start_ns), max(end_ns) FROM api_events WHERE trace_id = ?")]


def test_three_exports_of_one_report_load_alike(tmp_path: Path) -> None:
    import traceq

    loaded = {form: traceq.load(sample(f"{EXPORTS}.{form}"), tmp_path / f"{form}.duckdb")
              for form in ("sqlite", "arrow", "parquetdir")}
    reference = _contents(loaded["sqlite"].con, loaded["sqlite"].id)
    assert len(reference[0]) == 123
    for form in ("arrow", "parquetdir"):
        t = loaded[form]
        raw = _raw_counts(form)
        assert raw["CUPTI_ACTIVITY_KIND_KERNEL"] == t.con.execute(
            "SELECT count(*) FROM kernels WHERE trace_id = ?", [t.id]).fetchone()[0]
        assert raw["NVTX_EVENTS"] >= t.con.execute("SELECT count(*) FROM nvtx WHERE trace_id = ?", [t.id]).fetchone()[0]
        assert _contents(t.con, t.id) == reference
        assert t.con.execute("SELECT format FROM traces WHERE trace_id = ?", [t.id]).fetchone()[0] == "nsys"
        assert sorted(t.stages()["iteration"].drop_nulls()) == [f"step {n}" for n in range(4)]


@pytest.mark.parametrize("cut", [100, 50_000])
def test_a_cut_arrow_export_is_refused_in_one_line(cut: int, tmp_path: Path) -> None:
    import traceq

    store = tmp_path / "s.duckdb"
    traceq.load(sample("lenet_b256_cudnn.sqlite"), store)
    before = store.read_bytes()
    broken = tmp_path / "cut.arrow"
    broken.write_bytes(sample(f"{EXPORTS}.arrow").read_bytes()[:cut])
    with pytest.raises(TraceFormatError) as e:
        traceq.load(broken, store)
    assert "\n" not in str(e.value) and "cut.arrow" in str(e.value)
    assert store.read_bytes() == before


def test_a_crafted_table_name_is_data_not_sql(tmp_path: Path) -> None:
    """An Arrow stream whose table name is SQL is staged under that name, quoted; the file has no
    nsys tables, so it is refused in one line."""
    import traceq

    crafted = tmp_path / "crafted.arrow"
    table = pa.table({"x": [1]}).replace_schema_metadata({"table_name": 'StringIds"; DROP TABLE x; --'})
    with pa.OSFile(str(crafted), "wb") as sink, ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(TraceFormatError) as e:
        traceq.load(crafted, tmp_path / "s.duckdb")
    assert "\n" not in str(e.value)


def test_a_folder_that_is_no_export_is_refused(tmp_path: Path) -> None:
    import traceq

    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(TraceFormatError) as e:
        traceq.load(tmp_path, tmp_path / "s.duckdb")
    assert "directory" in str(e.value)


def test_a_damaged_string_offset_is_refused_in_one_line(tmp_path: Path) -> None:
    """Bytes changed inside the export (the first of 300 fuzzed mutants that once escaped as a
    MemoryError: a string offset past its buffer, which an Arrow stream reads without checking)."""
    import random

    import traceq

    rng = random.Random(15)
    data = bytearray(sample(f"{EXPORTS}.arrow").read_bytes())
    rng.choice(["flip", "cut", "zero"])
    for _ in range(rng.randint(1, 20)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    damaged = tmp_path / "flipped.arrow"
    damaged.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError) as e:
        traceq.load(damaged, tmp_path / "s.duckdb")
    assert "\n" not in str(e.value) and "flipped.arrow" in str(e.value)


VARYING = {"trace_id", "run_id", "name", "source_path", "sha256", "source_bytes", "loaded_at", "load_seconds",
           "seconds"}
"""Columns that name or time the load, not the trace: left out when stores are compared."""


def test_three_exports_give_equal_stores_table_by_table(tmp_path: Path) -> None:
    """Every table of the store (every column but VARYING) holds the same rows whichever of the
    three exports of one report was loaded."""
    import traceq

    loaded = {form: traceq.load(sample(f"{EXPORTS}.{form}"), tmp_path / f"{form}.duckdb")
              for form in ("sqlite", "arrow", "parquetdir")}
    con = loaded["sqlite"].con
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.columns WHERE column_name = 'trace_id' ORDER BY 1").fetchall()]
    assert {"kernel_events", "api_events", "nvtx_events", "memops", "kernel_names", "threads"} <= set(tables)

    def rows(t, table: str) -> list[tuple]:
        columns = [r[0] for r in t.con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
            [table]).fetchall() if r[0] not in VARYING]
        listed = ", ".join(f'"{c}"' for c in columns)
        return t.con.execute(f'SELECT {listed} FROM "{table}" WHERE trace_id = ? ORDER BY ALL', [t.id]).fetchall()

    compared = 0
    for table in tables:
        reference = rows(loaded["sqlite"], table)
        for form in ("arrow", "parquetdir"):
            assert rows(loaded[form], table) == reference, (form, table)
        compared += bool(reference)
    assert compared >= 15


@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_a_damaged_parquet_event_table_is_refused_in_one_line(damage: str, tmp_path: Path) -> None:
    """The kernel table's file cut short (its footer gone) or with bytes changed inside its
    pages (found while the rows are read, after the load began): one line, the store unchanged."""
    import shutil

    import traceq

    store = tmp_path / "s.duckdb"
    traceq.load(sample("lenet_b256_cudnn.sqlite"), store)
    before = store.read_bytes()
    export = tmp_path / "damaged.parquetdir"
    shutil.copytree(sample(f"{EXPORTS}.parquetdir"), export)
    kernels = export / "CUPTI_ACTIVITY_KIND_KERNEL.parquet"
    data = bytearray(kernels.read_bytes())
    if damage == "cut":
        data = data[: len(data) // 2]
    else:
        data[4:len(data) // 2] = bytes(len(data) // 2 - 4)  # the first column chunks' pages zeroed
    kernels.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError) as e:
        traceq.load(export, store)
    assert "\n" not in str(e.value) and "damaged.parquetdir" in str(e.value)
    assert store.read_bytes() == before


def test_fuzzing_the_exports_a_small_budget() -> None:
    """3 mutants of the Parquet and Arrow exports (tools/fuzz.py --columnar: a column dropped,
    values NULL, times out of range), each loaded and the first commands run on
    it: refused in one line with the store as before, or loaded with every command working."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import fuzz

    files = fuzz.corpus(include_shared=False, samples=(), columnar=True)
    assert [fuzz.trace_format(f) for f in files] == ["parquetdir", "arrow"]
    with fuzz.scratch() as work:
        outcomes = fuzz.run(fuzz.Harness(files, "ci-exports", work, commands=fuzz.FIRST_COMMANDS), range(3))
    assert [o.problems for o in outcomes if o.problems] == []
    assert {o.source for o in outcomes} == {f.name for f in files}


def _rewritten(form: str, name: str, change, target: Path) -> Path:
    """The sample export with table `name` replaced by `change(table)`, written to `target` in the same form."""
    import shutil

    source = sample(f"{EXPORTS}.{form}")
    if form == "parquetdir":
        tables = [(p.stem, pq.read_table(p)) for p in sorted(source.glob("*.parquet"))]
    else:
        tables, stream = [], pa.BufferReader(source.read_bytes())
        while stream.tell() < stream.size():
            reader = ipc.open_stream(stream)
            tables.append((reader.schema.metadata[b"table_name"].decode(), reader.read_all()))
    i = next(i for i, (n, _) in enumerate(tables) if n == name)
    tables[i] = (name, change(tables[i][1]).replace_schema_metadata(tables[i][1].schema.metadata))
    if form == "parquetdir":
        shutil.copytree(source, target)
        pq.write_table(tables[i][1], target / f"{name}.parquet")
    else:
        with target.open("wb") as f:
            for _, t in tables:
                with ipc.new_stream(f, t.schema) as writer:
                    writer.write_table(t)
    return target


@pytest.mark.parametrize("form", ["parquetdir", "arrow"])
@pytest.mark.parametrize("value", [float("-inf"), 2.5, "12x"])
def test_a_column_of_another_type_is_refused_in_one_line(form: str, value: object, tmp_path: Path) -> None:
    """An event table's integer column holding floats or text (the fuzzer's seed fuzz35-col,
    mutants 19 and 29: CUPTI_ACTIVITY_KIND_MEMSET.correlationId = -inf escaped as ArrowInvalid):
    refused in one line naming the table and column, the store unchanged."""
    import traceq

    name = "CUPTI_ACTIVITY_KIND_MEMSET"

    def change(table: pa.Table) -> pa.Table:
        values = table["correlationId"].to_pylist()
        values[0] = value
        column = pa.array(values, pa.string() if isinstance(value, str) else pa.float64())
        return table.set_column(table.schema.get_field_index("correlationId"), "correlationId", column)

    damaged = _rewritten(form, name, change, tmp_path / f"damaged.{form}")
    store = tmp_path / "s.duckdb"
    traceq.load(sample(f"{EXPORTS}.sqlite"), store)
    before = store.read_bytes()
    with pytest.raises(TraceFormatError) as e:
        traceq.load(damaged, store)
    assert "\n" not in str(e.value) and f"{name}.correlationId holds a value of another type" in str(e.value)
    assert store.read_bytes() == before


@pytest.mark.parametrize("form", ["parquetdir", "arrow"])
def test_text_that_is_not_utf8_reads_with_replacement_characters(form: str, tmp_path: Path) -> None:
    """A text column of a table read through SQL (StringIds) made binary with bytes that are not
    UTF-8 (the fuzzer's seed fuzz35-col, mutants 13, 15, 16, 22 escaped as ArrowInvalid): read with
    U+FFFD for the bad bytes, as the SQLite export's reader reads them; every kernel's name has it."""
    import traceq

    def change(table: pa.Table) -> pa.Table:
        values = [None if v is None else v.encode() + b"\xcc\xff" for v in table["value"].to_pylist()]
        return table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.large_binary()))

    damaged = _rewritten(form, "StringIds", change, tmp_path / f"damaged.{form}")
    t = traceq.load(damaged, tmp_path / "s.duckdb")
    names = [r[0] for r in t.con.execute("SELECT DISTINCT name FROM kernels WHERE trace_id = ?", [t.id]).fetchall()]
    kernels = pq.read_metadata(sample(f"{EXPORTS}.parquetdir") / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").num_rows
    assert t.con.execute("SELECT count(*) FROM kernels WHERE trace_id = ?", [t.id]).fetchone()[0] == kernels
    assert names and all(n.endswith("\ufffd") for n in names), names
