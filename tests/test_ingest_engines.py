"""The two SQLite readers (ADBC, stdlib sqlite3) give the same store, row for row and in order."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import SAMPLES, sample

from traceq.api.loading import load_trace
from traceq.errors import TraceqError
from traceq.ingest import arrow_sqlite
from traceq.store import event_tables, open_store


@pytest.fixture
def adbc() -> None:
    """The ADBC reader is a declared dependency; where its wheel is missing, these tests skip."""
    pytest.importorskip("adbc_driver_sqlite.dbapi")


def _contents(db: Path) -> dict[str, list[tuple]]:
    con = open_store(db, read_only=True)
    try:
        tables = {t: con.execute(f'SELECT * EXCLUDE (trace_id) FROM "{t}"').fetchall()
                  for t in event_tables(con) if t != "traces"}
        tables["traces"] = con.execute(
            "SELECT * EXCLUDE (trace_id, loaded_at, load_seconds) FROM traces").fetchall()
        tables["attributions"] = con.execute("SELECT * EXCLUDE (trace_id, seconds) FROM attributions").fetchall()
        return tables
    finally:
        con.close()


def _load(path: Path, db: Path, engine: str) -> dict[str, list[tuple]]:
    con = open_store(db, create=True)
    load_trace(con, path, engine=engine)
    con.close()
    return _contents(db)


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.sqlite")), ids=lambda p: p.stem)
def test_adbc_and_stdlib_readers_store_the_same_rows(path: Path, tmp_path: Path, adbc: None) -> None:
    stdlib = _load(path, tmp_path / "stdlib.duckdb", "stdlib")
    adbc = _load(path, tmp_path / "adbc.duckdb", "adbc")
    assert stdlib.keys() == adbc.keys()
    for table in stdlib:
        assert adbc[table] == stdlib[table], table


def test_chunks_keep_rowid_order_and_typing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adbc: None) -> None:
    """Small chunks across a table whose NVTX text starts NULL and rowids have gaps."""
    src = tmp_path / "gappy.sqlite"
    con = _copy_of_lenet(src)
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 7 = 3")
    con.execute("UPDATE NVTX_EVENTS SET text = NULL WHERE rowid < 20")
    con.commit()
    con.close()
    monkeypatch.setattr(arrow_sqlite, "CHUNK_ROWS", 16)
    stdlib = _load(src, tmp_path / "stdlib.duckdb", "stdlib")
    adbc = _load(src, tmp_path / "adbc.duckdb", "adbc")
    assert adbc == stdlib
    kernel_ids = [row[0] for row in adbc["kernel_events"]]
    assert kernel_ids == list(range(len(kernel_ids)))


def test_presumed_values_that_stop_holding_are_read_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adbc: None
) -> None:
    """Columns that hold one value in the first chunk are presumed in the next ones. Where a later
    row has another value, or a value where all were NULL, that chunk is read again in full, and
    the column that changed is read from then on: the store is the stdlib reader's all the same."""
    src = tmp_path / "changing.sqlite"
    con = _copy_of_lenet(src)
    # rowids 1 to 260 in chunks of 16: these rows are in chunks 5, 7 and 9
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET blockZ = 2 WHERE rowid = 70")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET graphNodeId = 5 WHERE rowid = 100")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET streamId = 8 WHERE rowid = 132")
    con.commit()
    con.close()
    monkeypatch.setattr(arrow_sqlite, "CHUNK_ROWS", 16)
    monkeypatch.setattr(arrow_sqlite, "READ_AHEAD", 0)  # so that a change is known before the last chunks
    reads: list[tuple[int, set[str]]] = []  # (chunk, columns read) of each kernel query
    query = arrow_sqlite.ArrowScanner._query

    def spy(self: object, con: object, columns: list[tuple[str, str]], chunk: str, schema: object) -> object:
        if "CUPTI_ACTIVITY_KIND_KERNEL" in chunk:
            reads.append((int(chunk.split("BETWEEN ")[1].split()[0]) // 16 + 1, {c for c, _ in columns}))
        return query(self, con, columns, chunk, schema)

    monkeypatch.setattr(arrow_sqlite.ArrowScanner, "_query", spy)
    assert _load(src, tmp_path / "adbc.duckdb", "adbc") == _load(src, tmp_path / "stdlib.duckdb", "stdlib")
    reads.sort(key=lambda r: (r[0], arrow_sqlite.HELD not in r[1]))
    assert [chunk for chunk, columns in reads if arrow_sqlite.HELD not in columns] == [1, 5, 7, 9]
    presumed = [(chunk, columns) for chunk, columns in reads if arrow_sqlite.HELD in columns]
    assert [chunk for chunk, _ in presumed] == list(range(2, 18))
    assert {"block_z", "graph_node_id", "stream_id", "device_id"}.isdisjoint(presumed[0][1])
    assert {"block_z", "graph_node_id", "stream_id"} <= presumed[-1][1]
    assert "device_id" not in presumed[-1][1]  # still presumed


@pytest.mark.parametrize("column", ["gridX", "streamId"])  # one that varies, one presumed
def test_a_value_the_driver_cannot_type_is_read_by_sqlite3(
    column: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adbc: None
) -> None:
    """Text in an INTEGER column after integers: ADBC refuses the chunk and sqlite3 reads it, so
    the outcome is the stdlib reader's."""
    src = tmp_path / "mixed.sqlite"
    con = _copy_of_lenet(src)
    con.execute(f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET {column} = 'x' WHERE rowid = 40")
    con.commit()
    con.close()
    monkeypatch.setattr(arrow_sqlite, "CHUNK_ROWS", 32)
    assert _outcome(src, tmp_path / "adbc.duckdb", "adbc") == _outcome(src, tmp_path / "stdlib.duckdb", "stdlib")


def _copy_of_lenet(path: Path) -> sqlite3.Connection:
    """A writable copy of the LeNet sample at `path` (every table, rowids kept), open."""
    con = sqlite3.connect(path)
    con.execute("ATTACH ? AS s", [sample("lenet_b256_cudnn.sqlite").resolve().as_uri() + "?mode=ro"])
    for (sql,) in con.execute("SELECT sql FROM s.sqlite_master WHERE type = 'table'").fetchall():
        con.execute(sql)
    for (name,) in con.execute("SELECT name FROM s.sqlite_master WHERE type = 'table'").fetchall():
        con.execute(f'INSERT INTO main."{name}" SELECT * FROM s."{name}"')
    return con


def _outcome(path: Path, db: Path, engine: str) -> object:
    try:
        return _load(path, db, engine)
    except Exception as e:  # the same failure either way is what matters
        return type(e)


def test_the_environment_chooses_the_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEQ_SQLITE_READER", "nonsense")
    con = open_store(tmp_path / "s.duckdb", create=True)
    with pytest.raises(TraceqError, match="must be one of auto, adbc, stdlib"):
        load_trace(con, sample("lenet_b256_cudnn.sqlite"))
    con.close()
