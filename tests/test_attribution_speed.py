"""The fast attribution (`attribute_points`: names once, the range tree in polars, by-time ranges
per interval) against the all-SQL form (`_attribution_sql`: a sweep over push/pop events, ASOF
joins, a recursive CTE), on random traces full of edge cases: ranges starting together,
identical ranges, zero-length and never-closed ranges, ranges that overlap without nesting,
null pids, tids and names, launches on range boundaries, start/end ranges, several processes."""

from __future__ import annotations

import random

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from traceq.analysis.structure.attribution import _FOREVER, attribute_points, kernel_attribution
from traceq.analysis.structure.attribution_sql import (
    BY_TIME_CTES,
    name_flags,
    paths_cte,
    real_asof_joins,
    result_sql,
    sql_string,
)
from traceq.analysis.structure.conventions import ITERATION_REGEX, stage_of
from traceq.analysis.structure.operators import OP_NAME_REGEX
from traceq.ingest.base import Names, nvtx_attributes, nvtx_batch
from traceq.store import schema_sql


def _attribution_sql(trace_id: int, points_sql: str, iteration_regex: str, paths: bool = True) -> str:
    """One row per point (id, pid, tid, t) of `points_sql` with its attribution, all in SQL: a
    sweep over push and pop events gives every range and point its depth; the innermost range
    enclosing a point at depth D is the latest range of depth D that began before it (an ASOF
    join), a range's parent is found the same way at depth D - 1, and paths come from a
    recursive CTE over ranges. Without `paths`, nvtx_path and nvtx_innermost are null.
    `attribute_points` gives the same, faster on big traces; this is the reference it is checked against."""
    t = int(trace_id)
    return f"""
    WITH RECURSIVE
    pts AS MATERIALIZED ({points_sql}),
    r AS MATERIALIZED (
        -- hash(name), not name, breaks ties: sorting millions of long op names is the costly part
        SELECT CAST(row_number() OVER (ORDER BY pid, tid, start_ns, end_ns DESC, hash(name)) AS BIGINT) AS rid,
               pid, tid, {"name" if paths else "NULL::VARCHAR AS name"}, start_ns, end_ns,
               {name_flags("name", iteration_regex)}
        FROM (SELECT pid, tid, coalesce(name, '') AS name, start_ns,
                     coalesce(end_ns, {_FOREVER}) AS end_ns
              FROM nvtx WHERE trace_id = {t} AND kind = 'pushpop')
        WHERE end_ns > start_ns AND NOT regexp_matches(name, {sql_string(OP_NAME_REGEX)})  -- operators are no layers
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
    {paths_cte(paths)},
    pd AS MATERIALIZED (SELECT pts.*, depth.depth FROM pts JOIN depth USING (id)),
    inner_range AS (
        SELECT pd.id, rd.rid
        FROM pd ASOF LEFT JOIN rd
          ON pd.pid = rd.pid AND pd.tid = rd.tid AND rd.depth = pd.depth AND pd.t >= rd.start_ns
    ),
    by_time_ranges AS MATERIALIZED (
        SELECT pid, tid, kind, name, start_ns, end_ns, {name_flags("name", iteration_regex)}
        FROM (SELECT pid, tid, kind, coalesce(name, '') AS name, start_ns, coalesce(end_ns, {_FOREVER}) AS end_ns
              FROM nvtx WHERE trace_id = {t} AND kind IN ('pushpop', 'startend'))
        WHERE kind = 'startend' OR regexp_matches(name, {sql_string(iteration_regex)})
           OR {stage_of("name")} IS NOT NULL
    ),
    {BY_TIME_CTES},
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
    {result_sql(paths)}
    """

NAMES = ["conv1", "bconv1", "relu", "brelu", "fc6", "aten::add_, seq = 5, op_id = 3",
         "aten::add_, seq = 6, op_id = 4", "MulBackward0", "Optimizer.step#SGD.step", "", None,
         "forward", "backward", "weight_update", "Data_Copy", "step 7", "b", "layer/with/slash"]


def _random_trace(rng: random.Random) -> tuple[list[tuple], list[tuple]]:
    """(nvtx rows, points): ranges as (pid, tid, kind, name, start, end), points as (id, pid, tid, t)."""
    rows: list[tuple] = []
    times: set[int] = set()
    threads = [(1, 10), (1, 11), (2, 20), (None, 10), (1, None)]
    if rng.random() < 0.3:  # many threads: split by a group-by, not a filter per thread
        threads += [(3, 30 + i) for i in range(8)]
    for pid, tid in threads:
        stack_end = [rng.randrange(1000, 1300)]  # a stack of open ranges: mostly proper nesting
        t = rng.randrange(0, 20)
        for _ in range(rng.randrange(0, 40)):
            t += rng.choice([0, 0, 1, 3, 7])  # often several ranges start together
            while len(stack_end) > 1 and stack_end[-1] <= t:
                stack_end.pop()
            end = rng.choice([t + rng.randrange(0, 60), min(stack_end[-1], t + rng.randrange(1, 200)),
                              min(stack_end[-1], t + rng.randrange(1, 200)), None,
                              t + rng.randrange(50, 400)])  # the last one may cross its parent's end
            name = rng.choice(NAMES)
            rows.append((pid, tid, "pushpop", name, t, end))
            if rng.random() < 0.05:
                rows.append((pid, tid, "pushpop", name, t, end))  # an identical twin
            if end is not None and end > t:
                stack_end.append(end)
                times.update((t, end))
    for pid in (1, 2):  # iterations and stages on one thread, by time for the others
        t = rng.randrange(0, 30)
        for i in range(rng.randrange(0, 4)):
            length = rng.randrange(20, 200)
            rows.append((pid, 10 if pid == 1 else 20, "pushpop", f"iteration {i}", t, t + length))
            s = t + 1
            for stage in rng.sample(["data_copy", "forward", "backward", "weight_update"], rng.randrange(0, 4)):
                e = s + rng.randrange(1, 40)
                rows.append((pid, 10 if pid == 1 else 20, "pushpop", stage, s, e))
                times.update((s, e))
                s = e + rng.randrange(1, 5)
            times.update((t, t + length))
            t += length + rng.randrange(1, 20)
        for _ in range(rng.randrange(0, 3)):  # start/end ranges overlap freely
            s = rng.randrange(0, 600)
            rows.append((pid, rng.choice([10, 11, 20]), "startend", rng.choice(["epoch", "step 3", "forward", None]),
                         s, rng.choice([s + rng.randrange(0, 300), None])))
    points = []
    for i in range(rng.randrange(0, 120)):
        pid, tid = rng.choice(threads + [(2, 21)])
        t = rng.choice(sorted(times)) if times and rng.random() < 0.4 else rng.randrange(0, 1400)
        points.append((i, pid, tid, None if rng.random() < 0.05 else t))
    return rows, points


def _store(rows: list[tuple]) -> duckdb.DuckDBPyConnection:
    """A store whose trace 1 has the NVTX events `rows` (pid, tid, kind, name, start_ns, end_ns),
    written as a reader writes them."""
    con = duckdb.connect()
    con.execute(schema_sql())
    if rows:
        columns = ["pid", "tid", "kind", "name", "start_ns", "end_ns"]
        types = [pa.int64(), pa.int64(), pa.string(), pa.string(), pa.int64(), pa.int64()]
        table = pa.table({c: pa.array(v, t) for c, v, t in zip(columns, zip(*rows), types)})
        attributes = Names()
        events = nvtx_batch(table, attributes)  # numbers the attributes
        for name, rows in (("nvtx_events", events), ("nvtx_attributes", nvtx_attributes(attributes.keys))):
            con.register("rows", rows)
            con.execute(f"INSERT INTO {name} BY NAME SELECT 1 AS trace_id, * FROM rows")
            con.unregister("rows")
    return con


def _all_sql(con: duckdb.DuckDBPyConnection, points: pl.DataFrame, paths: bool) -> pl.DataFrame:
    con.register("pts_table", points)
    sql = _attribution_sql(1, "SELECT id, pid, tid, t FROM pts_table WHERE t IS NOT NULL", ITERATION_REGEX, paths)
    with real_asof_joins(con):
        return con.sql(f"""
            SELECT p.id, a.layer, a.pass, a.iteration, coalesce(a.stage, 'other') AS stage, a.nvtx_path,
                   a.nvtx_innermost
            FROM pts_table p LEFT JOIN ({sql}) a ON a.id = p.id ORDER BY p.id""").pl()


@pytest.mark.parametrize("seed", range(30))
def test_same_as_the_all_sql_form_on_random_traces(seed: int) -> None:
    rng = random.Random(seed)
    rows, points = _random_trace(rng)
    con = _store(rows)
    frame = pl.DataFrame(points, schema={"id": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "t": pl.Int64},
                         orient="row")
    for paths in (True, False):
        got = attribute_points(con, 1, frame, paths=paths, infer=False, operators=False).drop("attribution")
        assert_frame_equal(got, _all_sql(con, frame, paths), check_dtypes=False)


def test_kernels_without_ranges_or_launches() -> None:
    con = _store([])
    con.execute("INSERT INTO kernel_names (trace_id, name_id, name, short_name) VALUES (1, 0, 'k', 'k')")
    con.execute("INSERT INTO kernel_configs (trace_id, config_id) VALUES (1, 0)")
    con.execute("INSERT INTO kernel_queues (trace_id, queue_id, pid) VALUES (1, 0, 1)")
    con.execute("INSERT INTO kernel_events (trace_id, kernel_id, start_ns, end_ns, correlation_id, name_id, "
                "config_id, queue_id) VALUES (1, 0, 5, 6, 7, 0, 0, 0), (1, 1, 8, 9, 8, 0, 0, 0)")
    con.execute("INSERT INTO api_names (trace_id, name_id, api) VALUES (1, 0, 'runtime')")
    con.execute("INSERT INTO api_threads (trace_id, thread_id, pid, tid) VALUES (1, 0, 1, 10)")
    con.execute("INSERT INTO api_events (trace_id, start_ns, end_ns, name_id, thread_id, correlation_id) "
                "VALUES (1, 1, 2, 0, 0, 7)")
    frame = kernel_attribution(con, 1)
    assert frame["kernel_id"].to_list() == [0, 1]
    assert frame["stage"].to_list() == ["other", "other"]
    assert frame.drop("kernel_id", "stage").null_count().sum_horizontal().item() == 2 * 5
