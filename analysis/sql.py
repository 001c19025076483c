"""`traceq sql`: one read-only SQL query on the store, its result as a DataFrame.

Only queries run (SELECT and what DuckDB parses as one: WITH, FROM-first, VALUES, DESCRIBE,
SHOW, SUMMARIZE; and EXPLAIN); a statement that changes the store, the session or files
(INSERT, CREATE, SET, COPY, ATTACH, ...) is refused before it runs, so the same call is safe on
a store opened for writing. The CLI opens the store read-only besides.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.errors import TraceqError

READ_STATEMENTS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


def read_only_query(con: duckdb.DuckDBPyConnection, query: str) -> pl.DataFrame:
    """The rows of `query`, one read-only statement. Raises TraceqError, in one line, for a
    statement that is not a query, for several statements, and for what DuckDB refuses."""
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as e:
        raise TraceqError(f"sql: {_first_line(e)}") from None
    if len(statements) != 1:
        raise TraceqError(f"sql: give one statement ({len(statements)} given)")
    kind = statements[0].type
    if kind not in READ_STATEMENTS:
        raise TraceqError(f"sql: {kind.name} statements are refused: `traceq sql` only reads the store "
                          "(SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN)")
    try:
        return con.sql(query).pl()
    except duckdb.Error as e:
        raise TraceqError(f"sql: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines and lines[0].rstrip().endswith(":") else (lines[0] if lines else type(e).__name__)
