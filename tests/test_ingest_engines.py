"""The two SQLite readers (ADBC, stdlib sqlite3) give the same store, row for row and in order."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import SAMPLES, sample

from traceq.errors import TraceqError
from traceq.ingest import arrow_sqlite, load_trace
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


def test_a_value_the_driver_cannot_type_is_read_by_sqlite3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adbc: None
) -> None:
    """Text in an INTEGER column after integers: ADBC refuses the chunk and sqlite3 reads it, so
    the outcome is the stdlib reader's."""
    src = tmp_path / "mixed.sqlite"
    con = _copy_of_lenet(src)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = 'x' WHERE rowid = 40")
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
