"""Each kernel launch's attribution, kept in the store: `traceq attribute` writes it (and
`traceq load` for traces of up to `LOAD_MAX_KERNELS` kernels), analyses read it.

What is kept is what `layers.kernel_contexts` computes with the default options (the packaged
kernel rules, `attribution.ITERATION_REGEX`), plus each kernel's precision as `traceq ce` reads
it without a spec: per kernel a context id (`kernel_attribution`), and per distinct context its
layer, pass, iteration, stage, attribution, library (by the launching operation), precision
and precision_from (`kernel_contexts`), and per kernel name what it says (`kernel_classes`). A few thousand contexts stand for millions of launches,
so the kept form is a column of integers; the `kernels_attributed` view joins it to `kernels`.

The attribution depends on the iteration regex, the kernel rules (`--rules`) and traceq's own
code, so `attributions` records the regex and a fingerprint of the rules files and the modules
that attribute (`fingerprint`). An analysis reads what is kept only when the regex it was asked
for and the fingerprint in force are those recorded; otherwise it attributes on the fly, as it
would without anything kept (the numbers are the same: tests/test_stored.py). `rm` and
`load --replace` delete a trace's rows with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import lru_cache
from importlib import resources

import duckdb
import polars as pl

from traceq.analysis.kernels.classify import RULES_ENV, default_rules
from traceq.analysis.structure.conventions import ITERATION_REGEX

LOAD_MAX_KERNELS = 100_000_000
"""`traceq load` keeps the attribution of traces up to this many kernels; above, `traceq
attribute TRACE` does. Its memory is a window of a million kernels' whatever the trace's size
(`keep`); the limit bounds the time it adds to a load, about 2 CPU seconds a million kernels
(docs/performance.md)."""

_CODE = ("structure/attribution.py", "structure/inference.py", "structure/nesting.py", "kernels/classify.py",
         "kernels/kernel_rules.toml", "structure/layers.py", "structure/stored.py", "efficiency/flops.py",
         "efficiency/ce.py", "efficiency/peaks.py", "structure/graphs.py", "structure/keep.py")
"""The files of traceq.analysis whose content decides the kept attribution."""


KEPT_TABLES = ("kernel_attribution", "kernel_contexts", "kernel_classes", "attributions")
"""The tables that keep a trace's attribution."""


@lru_cache(maxsize=1)
def _code_digest() -> str:
    digest = hashlib.sha256()
    folder = resources.files("traceq.analysis")
    for name in _CODE:
        path = folder.joinpath(name)
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def fingerprint() -> str | None:
    """What the attribution in force depends on besides the trace and the regex: traceq's
    attributing code and packaged rules. None while a user rules file is in force (`--rules`,
    $TRACEQ_RULES): its attribution is never kept."""
    import os

    from traceq.analysis.kernels.classify import _chosen_rules

    if _chosen_rules[0] or os.environ.get(RULES_ENV):
        return None
    default_rules()  # a bad packaged rules file fails here, not in the digest
    return _code_digest()


def is_kept(con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX) -> bool:
    """Whether the store keeps this trace's attribution for `iteration_regex` and the code and
    rules in force."""
    wanted = fingerprint()
    if wanted is None:
        return False
    rows = con.execute("SELECT 1 FROM attributions WHERE trace_id = ? AND iteration_regex = ? AND fingerprint = ?",
                       [int(trace_id), iteration_regex, wanted]).fetchall()
    return bool(rows)


def read_attribution(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str, columns: tuple[str, ...], *,
    ordered: bool,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame] | None:
    """`layers.kernel_contexts`' (kernels, names unclassified, contexts) from the store, or None
    when it keeps none for these options."""
    if not is_kept(con, trace_id, iteration_regex):
        return None
    t = int(trace_id)
    known = {"device_id": "q.device_id", "start_ns": "e.start_ns", "dur_ns": "e.end_ns - e.start_ns"}
    names = con.sql(f"SELECT name_id, name, short_name FROM kernel_names WHERE trace_id = {t} ORDER BY name_id").pl()
    kernels = con.sql(f"""
        SELECT e.kernel_id AS id, e.name_id, a.context_id::UINTEGER AS context
               {''.join(f', {known[c]} AS {c}' for c in columns)}
        FROM kernel_events e
        JOIN kernel_attribution a ON a.trace_id = e.trace_id AND a.kernel_id = e.kernel_id
        {'JOIN kernel_queues q ON q.trace_id = e.trace_id AND q.queue_id = e.queue_id' if 'device_id' in columns else ''}
        WHERE e.trace_id = {t} {'ORDER BY e.kernel_id' if ordered else ''}""").pl()
    rows = pl.int_range(0, names.height, dtype=pl.UInt32, eager=True)
    kernels = kernels.select("id", name_row=pl.col("name_id").replace_strict(names["name_id"], rows)
                             if names.height else pl.lit(None, pl.UInt32), context="context", *columns)
    contexts = con.sql(f"SELECT layer, pass, iteration, stage, attribution, library FROM kernel_contexts "
                       f"WHERE trace_id = {t} ORDER BY context_id").pl()
    return kernels, names.drop("name_id"), contexts


def read_kept_launches(con: duckdb.DuckDBPyConnection, trace_id: int,
                       query: Callable[[str], str]) -> pl.DataFrame:
    """query(launches) read into Polars, `launches` a subquery of a kept trace's launches:
    kernel_events' columns, context (the launch's kernel_contexts.context_id) and misplaced. The
    store writes both tables in kernel_id order, so their rows are paired by position first
    (half a join's time at ten million launches), misplaced true for a pair of two different
    kernels; the query keeps a column `misplaced` (as it is, or counted per group), and where
    any is, it is asked again over a join by kernel_id. The result has no `misplaced`."""
    t = int(trace_id)
    by_position = f"""(
        SELECT e.*, a.context_id AS context, a.kernel_id IS DISTINCT FROM e.kernel_id AS misplaced
        FROM (SELECT * FROM kernel_events WHERE trace_id = {t}) e
        POSITIONAL JOIN (SELECT kernel_id, context_id FROM kernel_attribution WHERE trace_id = {t}) a)"""
    frame = con.sql(query(by_position)).pl()
    if frame["misplaced"].cast(pl.Int64).sum():  # the store holds them in other orders
        frame = con.sql(query(f"""(
            SELECT e.*, a.context_id AS context, false AS misplaced
            FROM kernel_events e JOIN kernel_attribution a ON a.trace_id = e.trace_id AND a.kernel_id = e.kernel_id
            WHERE e.trace_id = {t})""")).pl()
    return frame.drop("misplaced")
