"""Keeping a trace's attribution in the store (`traceq attribute`, and `traceq load` up to
LOAD_MAX_KERNELS kernels): each launch's layer, pass, iteration, stage, library and precision,
written once so that later commands read it (`stored`) instead of attributing again.

A launch's attribution depends on the ranges around its launch call, not on the other launches,
so a big trace is attributed in windows of CHUNK_KERNELS kernel ids, each written before the next
is read: memory is one window's whatever the trace's size (issue 38: ten million kernels within
the load's 1 GB). Two kinds of trace look at their launches together and are attributed whole:
JAX programs (`xla.module_iterations` places programs by their launches) and optimizer steps
standing for iterations where a process launched work before its first range
(`steps.step_iterations`: the first step begins at the process's first launch or range)."""

from __future__ import annotations

import time

import duckdb
import polars as pl

from traceq.analysis.efficiency.ce import kernel_precisions
from traceq.analysis.structure.conventions import ITERATION_REGEX
from traceq.analysis.structure.layers import kernel_contexts
from traceq.analysis.structure.stored import KEPT_TABLES, fingerprint
from traceq.errors import TraceqError
from traceq.store import first_row, registered

CHUNK_KERNELS = 1_000_000
"""Kernels attributed at a time (about 350 MiB of working memory at a million)."""

_VALUES = ("layer", "pass", "iteration", "stage", "library", "precision", "precision_from", "attribution")
"""A kept context's columns (`kernel_contexts` but its ids)."""


def attribute_trace(con: duckdb.DuckDBPyConnection, trace_id: int, chunk: int = CHUNK_KERNELS) -> float:
    """Compute the trace's attribution with the default options and keep it, replacing what
    was kept (the caller owns the transaction), `chunk` kernels at a time; returns the seconds it
    took. Raises TraceqError while user rules are in force: only the default attribution is kept."""
    started = time.perf_counter()
    wanted = fingerprint()
    if wanted is None:
        raise TraceqError("the attribution kept in the store is made with traceq's own kernel rules: "
                          "run `traceq attribute` without --rules (and without $TRACEQ_RULES)")
    t = int(trace_id)
    for name in KEPT_TABLES:
        con.execute(f"DELETE FROM {name} WHERE trace_id = ?", [t])
    kept = pl.DataFrame(schema={"context_id": pl.UInt32, **dict.fromkeys(_VALUES, pl.String)})
    classes = []
    count = 0
    for between in windows(con, t, chunk):
        ids, table, names = _attribute(con, t, between)
        # contexts are numbered in kernel order: a window's new ones after those of the windows before
        known = kept.unique(_VALUES, keep="first", maintain_order=True).rename({"context_id": "known"})
        table = table.join(known, on=_VALUES, how="left", nulls_equal=True, maintain_order="left")
        new = table["known"].is_null()
        table = table.with_columns(context_id=pl.when(new).then(
            new.cast(pl.UInt32).cum_sum() - 1 + kept.height).otherwise(pl.col("known")).cast(pl.UInt32))
        kept = pl.concat([kept, table.filter(new).select(kept.columns)])
        ids = ids.with_columns(context_id=table["context_id"].gather(ids["context_id"]) if table.height
                               else pl.lit(None, pl.UInt32))
        with registered(con, ids=ids) as rel:
            con.execute(f"INSERT INTO kernel_attribution SELECT {t}, kernel_id, context_id FROM {rel['ids']} "
                        "ORDER BY kernel_id")
        classes.append(names)
        count += ids.height
        del ids, table, names  # before the next window is read
    classes_frame = pl.concat(classes).unique("name", keep="first", maintain_order=True)
    with registered(con, contexts=kept, classes=classes_frame) as rel:
        con.execute(f"INSERT INTO kernel_classes SELECT {t}, name, library, operation FROM {rel['classes']} "
                    "ORDER BY name")
        con.execute(f"INSERT INTO kernel_contexts SELECT {t}, context_id, layer, pass, iteration, stage, library, "
                    f"precision, precision_from, attribution FROM {rel['contexts']} ORDER BY context_id")
    seconds = time.perf_counter() - started
    con.execute("INSERT INTO attributions VALUES (?, ?, ?, ?, ?)", [t, ITERATION_REGEX, wanted, seconds, count])
    return seconds


def windows(con: duckdb.DuckDBPyConnection, trace_id: int, chunk: int = CHUNK_KERNELS) -> list[tuple[int, int] | None]:
    """The kernel_id windows (lo, hi) of about `chunk` kernels each that `attribute_trace` takes in
    turn (a trace's kernel ids are numbered from 0 at load), or [None]: the trace whole, when it
    has at most `chunk` kernels or is one of the traces attributed whole (the module's docstring)."""
    t = int(trace_id)
    lo, hi, n = first_row(con, "SELECT min(kernel_id), max(kernel_id), count(*) FROM kernel_events "
                               "WHERE trace_id = ?", [t])
    if n <= chunk or _whole(con, t):
        return [None]
    step = -(-(hi - lo + 1) // -(-n // chunk))
    return [(start, min(start + step - 1, hi)) for start in range(lo, hi + 1, step)]


def _whole(con: duckdb.DuckDBPyConnection, t: int) -> bool:
    """Whether the trace's launches decide its attribution together: JAX programs, or optimizer
    steps where a process launched work before its first range (`step_iterations` begins the
    first step at the earlier of the two; otherwise at the range, the same in every window)."""
    from traceq.analysis.structure.graphs import kernel_points_sql
    from traceq.analysis.structure.steps import STEP_RANGE
    from traceq.analysis.structure.xla import MODULE_PREFIX

    def named(prefix: str) -> bool:
        return bool(first_row(con, "SELECT EXISTS (SELECT 1 FROM nvtx WHERE trace_id = ? AND kind IN "
                                   "('pushpop', 'startend') AND starts_with(name, ?))", [t, prefix])[0])

    if named(MODULE_PREFIX):
        return True
    return named(STEP_RANGE) and bool(first_row(con, f"""
        SELECT EXISTS (SELECT 1 FROM (SELECT pid, min(point_ns) AS first_ns FROM ({kernel_points_sql(con, t)})
                                      GROUP BY pid) k
                       JOIN (SELECT pid, min(start_ns) AS first_ns FROM nvtx WHERE trace_id = {t}
                             AND pid IS NOT NULL GROUP BY pid) r USING (pid)
                       WHERE k.first_ns < r.first_ns)""")[0])


def _attribute(con: duckdb.DuckDBPyConnection, t: int,
               between: tuple[int, int] | None) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The attribution of the trace's kernels `between` (all: None): (ids: kernel_id,
    context_id, in kernel_id order; table: context_id and _VALUES, one row per distinct context,
    numbered in kernel order; names: name, library, operation of their kernel names)."""
    kernels, names, contexts = kernel_contexts(con, t, ("dur_ns",), ordered=False, stored=False, between=between)
    # the names as categories: a million launches' names gathered as text took 300 MB
    precisions = kernel_precisions(con, t, kernels.select(
        kernel_id="id", name=names["name"].cast(pl.Categorical).gather(kernels["name_row"])))
    # a kept context is a computed one with the kernel's precision: still a few thousand
    per_kernel = (kernels.select("id", "context").sort("id")  # context ids numbered in kernel order: the same every load
                  .join(precisions.rename({"kernel_id": "id"}), on="id", how="left", maintain_order="left")
                  .with_columns(key=pl.struct("context", "precision", "precision_from")))
    del kernels, precisions
    distinct = per_kernel.select(pl.col("key").unique(maintain_order=True)).unnest("key")
    table = (distinct.with_columns(context_id=pl.int_range(0, distinct.height, dtype=pl.UInt32))
             .join(contexts.with_row_index("context"), on="context", how="left", maintain_order="left"))
    ids = per_kernel.select(kernel_id="id", context_id=pl.col("key").replace_strict(
        table.select(pl.struct("context", "precision", "precision_from")).to_series(), table["context_id"])
        if table.height else pl.lit(None, pl.UInt32))
    classes = names.unique("name", keep="first", maintain_order=True).select("name", "library", "operation")
    return ids, table.select("context_id", *(pl.col(c).cast(pl.String) for c in _VALUES)), classes
