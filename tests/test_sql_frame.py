"""store.sql_frame: the same frame inside `few_rows` (the query run once) as outside (a relation),
every column type the analyses read; few_rows restored after its block, and not seen by other
threads."""

from __future__ import annotations

import threading

import polars as pl

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
