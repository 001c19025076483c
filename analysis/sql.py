"""`traceq sql`: one read-only SQL query on the store, its result as a DataFrame.

The query runs in a sandbox (docs/security.md), not on the store's own connection:
- a store: a new in-memory DuckDB database that attaches the store's file READ_ONLY, then turns
  off every access outside it (`enable_external_access = false`: no file read or written, no
  URL, no extension installed or loaded, no secret stored) and locks its configuration
  (`lock_configuration`: no SET, RESET or PRAGMA can undo that);
- a dataset: its views over the Parquet files, with external access off but for the dataset's
  folder (`allowed_directories`), configuration locked.
Besides, only queries run (SELECT and what DuckDB parses as one: WITH, FROM-first, VALUES,
DESCRIBE, SHOW, SUMMARIZE; and EXPLAIN of one of those): a statement that would change the store,
the session or files (INSERT, CREATE, SET, COPY, ATTACH, EXPLAIN ANALYZE COPY ...) is refused
before it runs. Either guard alone refuses what `tests/test_sql_sandbox.py` tries.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from traceq.errors import TraceqError
from traceq.store import connect

READ_STATEMENTS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}

SANDBOX_CONFIG = {"autoinstall_known_extensions": "false", "autoload_known_extensions": "false",
                  "allow_community_extensions": "false", "allow_unsigned_extensions": "false"}
"""Set when the sandbox's database is made (some may only be set then)."""


def sandboxed_store(path: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory database that reads the store at `path` (attached READ_ONLY, the default
    catalog) and can reach nothing else (`lock_down`)."""
    con = connect(":memory:", **SANDBOX_CONFIG)
    try:
        literal = "'" + str(path).replace("'", "''") + "'"
        con.execute(f"ATTACH {literal} AS store (READ_ONLY)")
        con.execute("USE store")
        lock_down(con)
    except BaseException:
        con.close()
        raise
    return con


def lock_down(con: duckdb.DuckDBPyConnection, allowed_directories: list[Path] | None = None) -> None:
    """No file, URL or extension reachable from `con` but under `allowed_directories` (read by
    its views), and its configuration locked: what the user's SQL runs on."""
    if allowed_directories:
        con.execute("SET allowed_directories = ?", [[str(d).rstrip("/") + "/" for d in allowed_directories]])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


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
    if kind == duckdb.StatementType.EXPLAIN:  # EXPLAIN [ANALYZE] runs what it explains: that must be a query
        kind = _explained(con, query)
    if kind not in READ_STATEMENTS:
        raise TraceqError(f"sql: {kind.name} statements are refused: `traceq sql` only reads the store "
                          "(SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN of a query)")
    try:
        return con.sql(query).pl()
    except duckdb.Error as e:
        raise TraceqError(f"sql: {_first_line(e)}") from None


def _explained(con: duckdb.DuckDBPyConnection, query: str) -> duckdb.StatementType:
    """The type of the statement an EXPLAIN [ANALYZE] (with its options) explains."""
    import re

    rest = re.sub(r"(?is)^\s*(?:/\*.*?\*/\s*|--[^\n]*\n\s*)*explain\s+(?:analy[sz]e\s+)?(?:\([^)]*\)\s*)?", "",
                  query, count=1)
    try:
        inner = con.extract_statements(rest)
    except duckdb.Error:
        return duckdb.StatementType.INVALID
    return inner[0].type if len(inner) == 1 and inner[0].type != duckdb.StatementType.EXPLAIN \
        else duckdb.StatementType.INVALID


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines and lines[0].rstrip().endswith(":") else (lines[0] if lines else type(e).__name__)
