"""Keeping a trace's attribution in the store (`traceq attribute`, and `traceq load` up to
LOAD_MAX_KERNELS kernels): each launch's layer, pass, iteration, stage, library and precision,
written once so that later commands read it (`stored`) instead of attributing again."""

from __future__ import annotations

import time

import duckdb
import polars as pl

from traceq.analysis.efficiency.ce import kernel_precisions
from traceq.analysis.structure.conventions import ITERATION_REGEX
from traceq.analysis.structure.layers import kernel_contexts
from traceq.analysis.structure.stored import KEPT_TABLES, fingerprint
from traceq.errors import TraceqError
from traceq.store import registered


def attribute_trace(con: duckdb.DuckDBPyConnection, trace_id: int) -> float:
    """Compute the trace's attribution with the default options and keep it, replacing what
    was kept (the caller owns the transaction); returns the seconds it took. Raises TraceqError
    while user rules are in force: only the default attribution is kept."""
    started = time.perf_counter()
    wanted = fingerprint()
    if wanted is None:
        raise TraceqError("the attribution kept in the store is made with traceq's own kernel rules: "
                          "run `traceq attribute` without --rules (and without $TRACEQ_RULES)")
    t = int(trace_id)
    kernels, names, contexts = kernel_contexts(con, t, ("dur_ns",), ordered=False, stored=False)
    # the names as categories: a million launches' names gathered as text took 300 MB
    precisions = kernel_precisions(con, t, kernels.select(
        kernel_id="id", name=names["name"].cast(pl.Categorical).gather(kernels["name_row"])))
    # a kept context is a computed one with the kernel's precision: still a few thousand
    per_kernel = (kernels.select("id", "context").sort("id")  # context ids numbered in kernel order: the same every load
                  .join(precisions.rename({"kernel_id": "id"}), on="id", how="left", maintain_order="left")
                  .with_columns(key=pl.struct("context", "precision", "precision_from")))
    distinct = per_kernel.select(pl.col("key").unique(maintain_order=True)).unnest("key")
    table = (distinct.with_columns(context_id=pl.int_range(0, distinct.height, dtype=pl.UInt32))
             .join(contexts.with_row_index("context"), on="context", how="left", maintain_order="left"))
    ids = per_kernel.select(kernel_id="id", context_id=pl.col("key").replace_strict(
        table.select(pl.struct("context", "precision", "precision_from")).to_series(), table["context_id"])
        if table.height else pl.lit(None, pl.UInt32))
    classes = names.unique("name", keep="first", maintain_order=True).select("name", "library", "operation")
    for name in KEPT_TABLES:
        con.execute(f"DELETE FROM {name} WHERE trace_id = ?", [t])
    with registered(con, ids=ids, contexts=table, classes=classes) as rel:
        con.execute(f"INSERT INTO kernel_classes SELECT {t}, name, library, operation FROM {rel['classes']} "
                    "ORDER BY name")
        con.execute(f"INSERT INTO kernel_attribution SELECT {t}, kernel_id, context_id FROM {rel['ids']} "
                    "ORDER BY kernel_id")
        con.execute(f"INSERT INTO kernel_contexts SELECT {t}, context_id, layer, pass, iteration, stage, library, "
                    f"precision, precision_from, attribution FROM {rel['contexts']} ORDER BY context_id")
    seconds = time.perf_counter() - started
    con.execute("INSERT INTO attributions VALUES (?, ?, ?, ?, ?)", [t, ITERATION_REGEX, wanted, seconds, len(ids)])
    return seconds
