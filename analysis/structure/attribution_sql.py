"""The SQL pieces of attribution (`attribution`) that the all-SQL reference form in
tests/test_attribution_speed.py shares: range names classified, paths, the by-time contexts and
the result columns."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from traceq.analysis.structure.conventions import SUFFIX_REGEX, stage_of


def sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def name_flags(name: str, iteration_regex: str) -> str:
    """SQL select-list items classifying the range name expression `name`."""
    return (f"regexp_replace({name}, '{SUFFIX_REGEX}', '') AS nm, "
            f"regexp_matches({name}, {sql_string(iteration_regex)}) AS is_iter, "
            f"{stage_of(name)} IS NOT NULL AS is_stage, "
            f"{name} LIKE '%Backward%' AS is_backward, "
            f"({name} LIKE 'Optimizer.step%' OR {name} LIKE 'Optimizer.zero_grad%') AS is_optimizer")


def paths_cte(paths: bool) -> str:
    """`paths`: for every row of `rp` (rid, parent, nm, is_iter, is_stage, is_backward,
    is_optimizer; parent null at the roots), its path from the root, the rid of its layer (the
    nearest range up from it that is not an iteration, stage or optimizer range) and whether it lies in an
    autograd backward op or an optimizer step."""
    return f"""
    paths AS (
        SELECT rid, {"nm" if paths else "NULL::VARCHAR"} AS path,
               CASE WHEN is_iter OR is_stage OR is_optimizer THEN NULL ELSE rid END AS layer_rid,
               is_backward AS autograd_backward,
               is_optimizer AS optimizer
        FROM rp WHERE parent IS NULL
        UNION ALL
        SELECT c.rid, {"p.path || '/' || c.nm" if paths else "NULL::VARCHAR"},
               CASE WHEN c.is_iter OR c.is_stage OR c.is_optimizer THEN p.layer_rid ELSE c.rid END,
               p.autograd_backward OR c.is_backward,
               p.optimizer OR c.is_optimizer
        FROM rp c JOIN paths p ON c.parent = p.rid
    )"""


BY_TIME_CTES = """
    -- Iteration ranges do not overlap one another, nor do stage ranges: the one that began last
    -- before a point is the only candidate (an ASOF join, not a range join of every point with
    -- every range). Other start/end ranges may overlap freely and are range-joined; they are few.
    iter_hits AS (
        SELECT p.id, n.* FROM pts p ASOF JOIN (SELECT * FROM by_time_ranges WHERE is_iter) n
          ON n.pid = p.pid AND p.t >= n.start_ns
        WHERE p.t < n.end_ns
    ),
    stage_hits AS (
        SELECT p.id, n.* FROM pts p ASOF JOIN (SELECT * FROM by_time_ranges WHERE is_stage AND NOT is_iter) n
          ON n.pid = p.pid AND p.t >= n.start_ns
        WHERE p.t < n.end_ns
    ),
    other_hits AS (
        SELECT p.id, n.* FROM pts p JOIN (SELECT * FROM by_time_ranges WHERE NOT is_iter AND NOT is_stage) n
          ON n.pid = p.pid AND n.start_ns <= p.t AND p.t < n.end_ns
    ),
    other_agg AS (
        SELECT id, arg_max(nm, start_ns) AS nm, arg_max(name, start_ns) AS name, max(start_ns) AS start_ns,
               string_agg(nm, '/' ORDER BY start_ns, end_ns DESC) AS prefix
        FROM other_hits GROUP BY id
    ),
    -- At most one iteration and one stage range per point: plain joins, no aggregation. The path
    -- prefix is the by-time ranges in start order that the thread's own push/pop path lacks:
    -- those of other threads and every start/end range. Sorting a list of them is kept for the
    -- few points inside other start/end ranges; the rest order two names by a comparison.
    by_time AS (
        SELECT id, iteration, stage, startend_layer,
               CASE WHEN has_other THEN ranges[-1].name
                    WHEN sh_start >= ih_start OR ih_start IS NULL THEN coalesce(sh_name, ih_name)
                    ELSE ih_name END AS time_innermost,
               CASE WHEN has_other THEN nullif(array_to_string([x.nm FOR x IN ranges IF x.keep], '/'), '')
                    WHEN sh_start < ih_start THEN nullif(concat_ws('/', sh_part, ih_part), '')
                    ELSE nullif(concat_ws('/', ih_part, sh_part), '') END AS prefix
        FROM (
            SELECT p.id, ih.nm AS iteration, __STAGE_OF_SH_NM__ AS stage, oa.nm AS startend_layer,
                   ih.start_ns AS ih_start, sh.start_ns AS sh_start, ih.name AS ih_name, sh.name AS sh_name,
                   CASE WHEN ih.kind = 'startend' OR ih.tid IS DISTINCT FROM p.tid THEN ih.nm END AS ih_part,
                   CASE WHEN sh.kind = 'startend' OR sh.tid IS DISTINCT FROM p.tid THEN sh.nm END AS sh_part,
                   oa.id IS NOT NULL AS has_other,
                   CASE WHEN oa.id IS NOT NULL THEN list_sort([x FOR x IN [
                       {'start': ih.start_ns, 'neg_end': -ih.end_ns, 'nm': ih.nm, 'name': ih.name,
                         'keep': ih.kind = 'startend' OR ih.tid IS DISTINCT FROM p.tid},
                       {'start': sh.start_ns, 'neg_end': -sh.end_ns, 'nm': sh.nm, 'name': sh.name,
                         'keep': sh.kind = 'startend' OR sh.tid IS DISTINCT FROM p.tid},
                       {'start': oa.start_ns, 'neg_end': NULL, 'nm': oa.prefix, 'name': oa.name, 'keep': true}
                   ] IF x.start IS NOT NULL]) END AS ranges
            FROM pts p
            LEFT JOIN iter_hits ih USING (id)
            LEFT JOIN stage_hits sh USING (id)
            LEFT JOIN other_agg oa USING (id)
        )
    )""".replace("__STAGE_OF_SH_NM__", stage_of("sh.nm"))


def result_sql(paths: bool) -> str:
    """From `joined` (id, innermost, path, autograd_backward, optimizer, layer, iteration,
    stage, prefix) and `forward_names` (nm): the result columns. The pass of a layer named
    'b' + the name of a forward layer ('bconv1') is backward."""
    full_path = ("CASE WHEN prefix IS NULL THEN path WHEN path IS NULL THEN prefix "
                 "ELSE prefix || '/' || path END") if paths else "NULL::VARCHAR"
    return f"""
    passes AS (
        SELECT j.*,
               CASE WHEN j.autograd_backward OR j.stage = 'backward' OR f.nm IS NOT NULL THEN 'backward'
                    WHEN j.stage = 'forward' OR (j.stage IS NULL AND j.layer IS NOT NULL) THEN 'forward'
               END AS pass
        FROM joined j
        LEFT JOIN forward_names f ON j.layer LIKE 'b_%' AND f.nm = substr(j.layer, 2)
    )
    SELECT id, layer, pass, iteration,
           coalesce(stage, CASE WHEN optimizer THEN 'weight_update' END, pass, 'other') AS stage,
           {full_path} AS nvtx_path,
           innermost AS nvtx_innermost
    FROM passes"""


@contextmanager
def real_asof_joins(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """DuckDB runs an ASOF join with a small estimated left side as a nested loop
    (asof_loop_join_threshold, default 64); its estimates on a filtered view can be that small,
    which made ResNet-50's attribution take 13 s instead of 0.3 s. Force the sort-merge plan."""
    try:  # current_setting: a third of the cost of asking duckdb_settings()
        (value,), = con.execute("SELECT current_setting('asof_loop_join_threshold')").fetchall()
    except duckdb.Error:  # a DuckDB without the setting
        yield
        return
    con.execute("SET asof_loop_join_threshold = 0")
    try:
        yield
    finally:
        con.execute(f"SET asof_loop_join_threshold = {int(value)}")
