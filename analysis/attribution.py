"""Which NVTX ranges each kernel (and memcpy/memset) belongs to: layer, pass, iteration, stage.

A GPU operation belongs to the ranges that enclose the CPU call that launched it
(`kernel_launches.launch_start_ns`). Two kinds of enclosing are used, because of how our traces
are recorded (see the reference traces' README):

- **by thread**: the `pushpop` ranges open on the launching thread (same pid and tid) at the
  launch time. These give the layer (the innermost range that is not an iteration or stage
  range) and the thread's part of the path.
- **by time**: iteration and stage ranges (`iteration N`, `data_copy`, `forward`, `backward`,
  `weight_update`) on any thread of the same process, and every `startend` range of the process.
  PyTorch pushes backward layer ranges on its autograd thread while iteration and stage ranges
  live on the main thread only, so an autograd kernel finds its iteration and stage this way.

Everything is set-based SQL, no loop over kernels. Push/pop ranges nest on their thread, so a
sweep over push and pop events gives every range its depth; the innermost range enclosing a
launch at depth D is then the latest range of depth D that began before it (an ASOF join), and a
range's parent is found the same way at depth D - 1. Paths come from a recursive CTE over ranges.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import polars as pl

ITERATION_REGEX = r"(?i)^\s*(iteration|iter|step)[\s_#]*\d+\s*$"
"""Range names that mark one training step: 'iteration 0', 'step 12'."""

STAGES = ("data_copy", "forward", "backward", "weight_update")
"""Stage range names (the paper's stages 3 to 5); anything else is 'other'."""

# ', seq = 470, op_id = 1, sizes = [...]' and the like after an autograd op name (emit_nvtx)
_SUFFIX_REGEX = r",\s*(seq|op_id|sizes|input_op_ids)\s*=.*$"
_FOREVER = 9_223_372_036_854_775_807

COLUMNS = ("kernel_id", "layer", "pass", "iteration", "stage", "nvtx_path", "nvtx_innermost")


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _attribution_sql(trace_id: int, points_sql: str, iteration_regex: str, paths: bool = True) -> str:
    """One row per point (id, pid, tid, t) of `points_sql` with its attribution. Without
    `paths`, nvtx_path and nvtx_innermost are null: the strings are most of the cost in memory
    on traces with millions of ranges, and no analysis needs them."""
    t = int(trace_id)
    path_base = "nm" if paths else "NULL::VARCHAR"
    path_step = "p.path || '/' || c.nm" if paths else "NULL::VARCHAR"
    full_path = ("CASE WHEN prefix IS NULL THEN path WHEN path IS NULL THEN prefix "
                 "ELSE prefix || '/' || path END") if paths else "NULL::VARCHAR"
    it = _sql_string(iteration_regex)
    stages = ", ".join(_sql_string(s) for s in STAGES)
    return f"""
    WITH RECURSIVE
    pts AS MATERIALIZED ({points_sql}),
    r AS MATERIALIZED (
        -- hash(name), not name, breaks ties: sorting millions of long op names is the costly part
        SELECT CAST(row_number() OVER (ORDER BY pid, tid, start_ns, end_ns DESC, hash(name)) AS BIGINT) AS rid,
               pid, tid, {"name" if paths else "NULL::VARCHAR AS name"}, start_ns, end_ns,
               regexp_replace(name, '{_SUFFIX_REGEX}', '') AS nm,
               regexp_matches(name, {it}) AS is_iter,
               lower(name) IN ({stages}) AS is_stage,
               name LIKE '%Backward%' AS is_backward,
               name LIKE 'Optimizer.step%' AS is_optimizer
        FROM (SELECT pid, tid, coalesce(name, '') AS name, start_ns,
                     coalesce(end_ns, {_FOREVER}) AS end_ns
              FROM nvtx WHERE trace_id = {t} AND kind = 'pushpop')
        WHERE end_ns > start_ns
    ),
    ev AS (
        SELECT pid, tid, start_ns AS ts, 1 AS o, 1 AS d, rid, NULL::BIGINT AS point_id FROM r
        UNION ALL SELECT pid, tid, end_ns, 0, -1, NULL, NULL FROM r
        UNION ALL SELECT pid, tid, t, 2, 0, NULL, id FROM pts
    ),
    depth AS MATERIALIZED (
        SELECT rid, id, depth FROM (
            SELECT rid, point_id AS id, o,
                   sum(d) OVER (PARTITION BY pid, tid ORDER BY ts, o, rid ROWS UNBOUNDED PRECEDING) AS depth
            FROM ev)
        WHERE o > 0
    ),
    -- the ranges without their full names (long for emit_nvtx ops): only the result needs them
    rd AS MATERIALIZED (
        SELECT r.rid, r.pid, r.tid, r.start_ns, r.nm, r.is_iter, r.is_stage, r.is_backward, r.is_optimizer,
               depth.depth
        FROM r JOIN depth USING (rid)
    ),
    rp AS MATERIALIZED (
        SELECT c.*, p.rid AS parent
        FROM rd c ASOF LEFT JOIN rd p
          ON c.pid = p.pid AND c.tid = p.tid AND p.depth = c.depth - 1 AND c.start_ns >= p.start_ns
    ),
    paths AS (
        SELECT rid, {path_base} AS path,
               CASE WHEN is_iter OR is_stage THEN NULL ELSE rid END AS layer_rid,
               is_backward AS autograd_backward,
               is_optimizer AS optimizer
        FROM rp WHERE parent IS NULL
        UNION ALL
        SELECT c.rid, {path_step},
               CASE WHEN c.is_iter OR c.is_stage THEN p.layer_rid ELSE c.rid END,
               p.autograd_backward OR c.is_backward,
               p.optimizer OR c.is_optimizer
        FROM rp c JOIN paths p ON c.parent = p.rid
    ),
    pd AS MATERIALIZED (SELECT pts.*, depth.depth FROM pts JOIN depth USING (id)),
    inner_range AS (
        SELECT pd.id, rd.rid
        FROM pd ASOF LEFT JOIN rd
          ON pd.pid = rd.pid AND pd.tid = rd.tid AND rd.depth = pd.depth AND pd.t >= rd.start_ns
    ),
    by_time_ranges AS MATERIALIZED (
        SELECT pid, tid, kind, coalesce(name, '') AS name, start_ns, coalesce(end_ns, {_FOREVER}) AS end_ns,
               regexp_replace(coalesce(name, ''), '{_SUFFIX_REGEX}', '') AS nm,
               regexp_matches(coalesce(name, ''), {it}) AS is_iter,
               lower(coalesce(name, '')) IN ({stages}) AS is_stage
        FROM nvtx
        WHERE trace_id = {t} AND kind IN ('pushpop', 'startend')
          AND (kind = 'startend' OR regexp_matches(coalesce(name, ''), {it})
               OR lower(coalesce(name, '')) IN ({stages}))
    ),
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
            SELECT p.id, ih.nm AS iteration, lower(sh.nm) AS stage, oa.nm AS startend_layer,
                   ih.start_ns AS ih_start, sh.start_ns AS sh_start, ih.name AS ih_name, sh.name AS sh_name,
                   CASE WHEN ih.kind = 'startend' OR ih.tid IS DISTINCT FROM p.tid THEN ih.nm END AS ih_part,
                   CASE WHEN sh.kind = 'startend' OR sh.tid IS DISTINCT FROM p.tid THEN sh.nm END AS sh_part,
                   oa.id IS NOT NULL AS has_other,
                   CASE WHEN oa.id IS NOT NULL THEN list_sort([x FOR x IN [
                       {{'start': ih.start_ns, 'neg_end': -ih.end_ns, 'nm': ih.nm, 'name': ih.name,
                         'keep': ih.kind = 'startend' OR ih.tid IS DISTINCT FROM p.tid}},
                       {{'start': sh.start_ns, 'neg_end': -sh.end_ns, 'nm': sh.nm, 'name': sh.name,
                         'keep': sh.kind = 'startend' OR sh.tid IS DISTINCT FROM p.tid}},
                       {{'start': oa.start_ns, 'neg_end': NULL, 'nm': oa.prefix, 'name': oa.name, 'keep': true}}
                   ] IF x.start IS NOT NULL]) END AS ranges
            FROM pts p
            LEFT JOIN iter_hits ih USING (id)
            LEFT JOIN stage_hits sh USING (id)
            LEFT JOIN other_agg oa USING (id)
        )
    ),
    forward_names AS (SELECT DISTINCT nm FROM r WHERE NOT is_iter AND NOT is_stage),
    joined AS (
        SELECT pts.id, {"coalesce(inner_name.name, bt.time_innermost)" if paths else "NULL::VARCHAR"} AS innermost,
               paths.path, paths.autograd_backward, paths.optimizer,
               coalesce(layer_range.nm, bt.startend_layer) AS layer,
               bt.iteration, bt.stage, bt.prefix
        FROM pts
        LEFT JOIN inner_range i USING (id)
        {"LEFT JOIN r inner_name ON inner_name.rid = i.rid" if paths else ""}
        LEFT JOIN paths ON paths.rid = i.rid
        LEFT JOIN r layer_range ON layer_range.rid = paths.layer_rid
        LEFT JOIN by_time bt USING (id)
    ),
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
    FROM passes
    """


@contextmanager
def _real_asof_joins(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """DuckDB runs an ASOF join with a small estimated left side as a nested loop
    (asof_loop_join_threshold, default 64); its estimates on a filtered view can be that small,
    which made ResNet-50's attribution take 13 s instead of 0.3 s. Force the sort-merge plan."""
    rows = con.execute("SELECT value FROM duckdb_settings() WHERE name = 'asof_loop_join_threshold'").fetchall()
    if not rows:
        yield
        return
    con.execute("SET asof_loop_join_threshold = 0")
    try:
        yield
    finally:
        con.execute(f"SET asof_loop_join_threshold = {int(rows[0][0])}")


def _kernel_points(trace_id: int) -> str:
    return (f"SELECT kernel_id AS id, pid, launch_tid AS tid, launch_start_ns AS t "
            f"FROM kernel_launches WHERE trace_id = {int(trace_id)} AND launch_start_ns IS NOT NULL")


def kernel_attribution(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX, *,
    paths: bool = True,
) -> pl.DataFrame:
    """Every kernel of the trace with the NVTX context of its launch, ordered by kernel_id.

    Columns: kernel_id; layer (innermost range on the launching thread that is not an
    iteration or stage range, with PyTorch's ', seq = ...' suffix removed; a `b` prefix, as in
    'bconv1', marks the backward pass); pass ('forward', 'backward' or null); iteration (the
    name of the enclosing range matching `iteration_regex`, found by time on any thread of the
    process); stage (data_copy, forward, backward, weight_update or other); nvtx_path (the
    enclosing ranges outermost first, e.g. 'iteration 0/backward/bconv1'); nvtx_innermost (the
    innermost range's full name). Kernels without a launch call or outside all ranges get nulls
    (stage 'other'). With `paths=False` the last two are null and the work much lighter
    (analyses that group by layer, pass, iteration or stage do not need them).
    """
    sql = _attribution_sql(trace_id, _kernel_points(trace_id), iteration_regex, paths)
    with _real_asof_joins(con):
        return con.sql(
        f"""
        SELECT k.kernel_id, a.layer, a.pass, a.iteration, coalesce(a.stage, 'other') AS stage,
               a.nvtx_path, a.nvtx_innermost
        FROM kernels k LEFT JOIN ({sql}) a ON a.id = k.kernel_id
        WHERE k.trace_id = {int(trace_id)}
        ORDER BY k.kernel_id
        """
        ).pl()


def gpu_activity(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """Kernels, memcpys and memsets with their attribution, for stage and idle-time analyses.

    Columns: kind ('kernel', 'memcpy', 'memset'), pid, device_id, start_ns, end_ns, dur_ns, name
    (kernel name, or the copy kind), layer, pass, iteration, stage. A memcpy or memset is
    attributed like a kernel, from the API call that issued it; one issued outside a stage
    range counts as data_copy when it copies host to device, else as 'other'.
    """
    t = int(trace_id)
    kernels = con.sql(
        f"SELECT 'kernel' AS kind, pid, device_id, start_ns, end_ns, dur_ns, name, kernel_id "
        f"FROM kernels WHERE trace_id = {t}").pl()
    attribution = kernel_attribution(con, trace_id, iteration_regex, paths=False)
    kernels = kernels.join(attribution.select("kernel_id", "layer", "pass", "iteration", "stage"),
                           on="kernel_id", how="left").drop("kernel_id")
    numbered = (f"SELECT CAST(row_number() OVER (ORDER BY m.start_ns, m.end_ns, m.correlation_id) AS BIGINT) AS id, "
                f"m.*, a.tid AS launch_tid, a.start_ns AS launch_start_ns "
                f"FROM memops m LEFT JOIN api_calls a ON a.trace_id = m.trace_id AND a.pid = m.pid "
                f"AND a.correlation_id = m.correlation_id AND a.api IN ('runtime', 'driver') "
                f"WHERE m.trace_id = {t}")
    points = f"SELECT id, pid, launch_tid AS tid, launch_start_ns AS t FROM ({numbered}) WHERE launch_start_ns IS NOT NULL"
    with _real_asof_joins(con):
        memops = _memop_frame(con, numbered, _attribution_sql(trace_id, points, iteration_regex, paths=False))
    return pl.concat([kernels, memops.cast(kernels.schema)], how="vertical").sort("start_ns")


def _memop_frame(con: duckdb.DuckDBPyConnection, numbered: str, attribution_sql: str) -> pl.DataFrame:
    return con.sql(
        f"""
        SELECT m.op AS kind, m.pid, m.device_id, m.start_ns, m.end_ns, m.dur_ns,
               coalesce(m.copy_kind, m.op) AS name, a.layer, a.pass, a.iteration,
               CASE WHEN a.stage IS NULL OR a.stage = 'other'
                    THEN CASE WHEN m.copy_kind = 'Host-to-Device' THEN 'data_copy' ELSE 'other' END
                    ELSE a.stage END AS stage
        FROM ({numbered}) m LEFT JOIN ({attribution_sql}) a ON a.id = m.id
        """
    ).pl()
