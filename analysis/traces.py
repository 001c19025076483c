"""What the store holds: the `traceq traces` analysis."""

from __future__ import annotations

import duckdb
import polars as pl


def list_traces(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per loaded trace, oldest first.

    Columns: trace_id, name, format, tool, source_schema_version, gpus, kernel_count,
    span_ns, loaded_at, load_seconds, source_path, sha256, run (the run it is a rank of:
    docs/multigpu.md), structure (the conventions its structure was recorded with:
    `structure.recognised`).
    """
    from traceq.analysis.structure.recognised import recognised

    frame = con.sql(
        """
        SELECT trace_id, t.name, format, tool, source_schema_version, gpus, kernel_count,
               span_ns, loaded_at, load_seconds, source_path, sha256,
               (SELECT min(r.name) FROM ranks k JOIN runs r USING (run_id) WHERE k.trace_id = t.trace_id) AS run
        FROM traces t ORDER BY trace_id
        """
    ).pl()
    return frame.join(recognised(con), on="trace_id", how="left", maintain_order="left")
