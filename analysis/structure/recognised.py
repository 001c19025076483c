"""Which conventions a trace's structure was recorded with, as `traceq traces` shows them: the
recognisers that attribution (`attribution`, `operators`, `steps`, `graphs`) applies to it, each
decided from what the trace holds, never from its file's name."""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.structure.attribution_sql import sql_string
from traceq.analysis.structure.conventions import (
    APPLICATION_DOMAINS,
    COMMUNICATION_DOMAINS,
    COMMUNICATION_REGEX,
    ITERATION_REGEX,
    stage_of,
)
from traceq.analysis.structure.operators import is_operator
from traceq.analysis.structure.xla import XLA_DOMAINS

LABELS = {
    "layers": "layer ranges",
    "kineto_ops": "PyTorch ops",
    "modules": "module names",
    "nvtx_ops": "emit_nvtx ops",
    "iterations": "iteration ranges",
    "steps": "optimizer steps",
    "stages": "stage ranges",
    "compiled": "torch.compile",
    "graphs": "CUDA graphs",
    "communication": "communication ranges",
    "xla": "XLA modules",
}
"""What each recogniser is called, in the order they are listed."""


def recognised(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """trace_id, structure: for every trace, the conventions found in it (LABELS' values joined
    by ', '; 'none' for a trace with no ranges at all)."""
    # XLA's own domains too (nsys: TSL; the XPlane reader's): their names are read only for the XLA flag
    domains = ", ".join(sql_string(d) for d in (*[d for d in APPLICATION_DOMAINS if d != "cpu_op"], *XLA_DOMAINS,
                                                *COMMUNICATION_DOMAINS))
    op = is_operator("name")
    xla = ", ".join(sql_string(d) for d in XLA_DOMAINS)
    frame = con.sql(f"""
        WITH names AS (
            SELECT DISTINCT trace_id, coalesce(name, '') AS name, domain FROM nvtx
            WHERE kind IN ('pushpop', 'startend') AND (domain IS NULL OR domain IN ({domains}))
        ),
        flags AS (
            SELECT trace_id,
                   bool_or(regexp_matches(name, {sql_string(ITERATION_REGEX)})) AS iterations,
                   count(*) FILTER (WHERE starts_with(name, 'Optimizer.step')) > 0 AS steps,
                   bool_or({stage_of("name")} IS NOT NULL) AS stages,
                   bool_or(domain IS NULL AND {op}) AS nvtx_ops,
                   bool_or(name LIKE '%CompiledFxGraph%' OR name LIKE '%CompiledFunction%') AS compiled,
                   bool_or(starts_with(name, 'XlaModule:')) AS xla,
                   bool_or(regexp_matches(name, {sql_string(COMMUNICATION_REGEX)})) AS communication,
                   bool_or((domain IS NULL OR domain NOT IN ({xla})) AND NOT regexp_matches(name, {sql_string(ITERATION_REGEX)})
                           AND {stage_of("name")} IS NULL
                           AND NOT starts_with(name, 'Optimizer.') AND NOT ({op}) AND name <> ''
                           AND NOT starts_with(name, 'XlaModule:') AND NOT starts_with(name, 'Thunk:')
                           AND NOT regexp_matches(name, {sql_string(COMMUNICATION_REGEX)})
                           AND NOT starts_with(name, 'ProfilerStep')) AS layers
            FROM names GROUP BY trace_id
        )
        SELECT t.trace_id, coalesce(f.layers, false) AS layers,
               EXISTS (SELECT 1 FROM nvtx_attributes a WHERE a.trace_id = t.trace_id AND a.domain = 'cpu_op') AS kineto_ops,
               EXISTS (SELECT 1 FROM nvtx_attributes a WHERE a.trace_id = t.trace_id
                       AND a.domain = 'python_function') AS modules,
               coalesce(f.nvtx_ops, false) AS nvtx_ops, coalesce(f.iterations, false) AS iterations,
               coalesce(f.steps AND NOT f.iterations, false) AS steps, coalesce(f.stages, false) AS stages,
               coalesce(f.compiled, false) AS compiled,
               EXISTS (SELECT 1 FROM graph_nodes g WHERE g.trace_id = t.trace_id) AS graphs,
               coalesce(f.communication, false) AS communication, coalesce(f.xla, false) AS xla
        FROM traces t LEFT JOIN flags f USING (trace_id) ORDER BY t.trace_id""").pl()
    labels = pl.concat_list([pl.when(pl.col(key)).then(pl.lit(label)) for key, label in LABELS.items()])
    return frame.select("trace_id", structure=labels.list.drop_nulls().list.join(", ").replace("", "none"))
