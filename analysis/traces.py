"""What the store holds: the `traceq traces` analysis."""

from __future__ import annotations

import duckdb
import polars as pl


def list_traces(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per loaded trace, oldest first.

    Columns: trace_id, name, format, tool, source_schema_version, gpus, kernel_count,
    span_ns, loaded_at, load_seconds, source_path, sha256.
    """
    return con.sql(
        """
        SELECT trace_id, name, format, tool, source_schema_version, gpus, kernel_count,
               span_ns, loaded_at, load_seconds, source_path, sha256
        FROM traces ORDER BY trace_id
        """
    ).pl()
