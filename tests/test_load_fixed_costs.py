"""The load's fixed costs cut (docs/scale-out.md, "Per-file cost"): store.sql_frame gives the same
frame inside `few_rows` (the query run once) as outside (a relation), in every column type the
analyses read; few_rows is restored after its block and not seen by other threads; the load's
settings are in force in its block and restored after it, whether or not they were already."""

from __future__ import annotations

import threading

import polars as pl
import pytest

from traceq.ingest import LOAD_SETTINGS, load_settings
from traceq.store import _few_rows, connect, few_rows, sql_frame

QUERY = """
    SELECT range AS i, range::TINYINT AS tiny, range::UINTEGER AS u, range::HUGEINT AS huge,
           (range / 4)::DECIMAL(10, 2) AS dec, 'k' || range AS s, NULL::VARCHAR AS nothing,
           [range, range + 1] AS ints, ['x', NULL] AS strs, {'a': range, 'b': 'y'} AS st,
           TIMESTAMP '2026-01-01' + INTERVAL (range) SECOND AS ts, hash(range) AS h, range % 2 = 0 AS even,
           range::FLOAT / 3 AS f
    FROM range(5) WHERE range >= $low ORDER BY range
"""


def test_the_frame_is_the_same_in_and_out_of_few_rows():
    con = connect()
    rows = con.execute(QUERY, {"low": 1}).fetchall()
    plain = sql_frame(con, QUERY, {"low": 1})
    with few_rows():
        once = sql_frame(con, QUERY, {"low": 1})
        empty = sql_frame(con, QUERY, {"low": 9})
    assert plain.rows() == rows and once.rows() == rows
    assert once.schema == plain.schema and once.equals(plain)
    assert empty.is_empty() and empty.schema == plain.schema
    assert con.execute("SELECT 42").fetchall() == [(42,)]  # the connection is free again


def test_few_rows_is_restored_and_stays_in_its_thread():
    seen = []
    with few_rows():
        assert _few_rows.get()
        with few_rows(False):
            assert not _few_rows.get()
        assert _few_rows.get()
        worker = threading.Thread(target=lambda: seen.append(_few_rows.get()))
        worker.start()
        worker.join()
    assert not _few_rows.get() and seen == [False]
    assert isinstance(sql_frame(connect(), "SELECT 1 AS one"), pl.DataFrame)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_the_load_settings_are_in_force_and_restored(threads):
    con = connect(threads=threads, memory_limit="1GB")

    def now():
        return con.execute("SELECT current_setting('threads')::VARCHAR, "
                           "current_setting('memory_limit')").fetchall()[0]

    assert now() == (threads, "953.6 MiB")
    with load_settings(con) as saved:
        inside = now()
    after = now()
    assert inside[0] == LOAD_SETTINGS["threads"] and inside[1] == "381.4 MiB"  # DuckDB's 400MB
    assert str(saved["threads"]) == threads and after[0] == threads
    assert after[1].startswith("953.")  # 1GB as DuckDB prints it (a restore may round it by 0.1 MiB)
