"""NVTX ranges projected onto the GPU (`nsys stats --report nvtx_gpu_proj_sum`).

A GPU operation (kernel, memcpy, memset) belongs to a range when the CUDA call that issued it
ran inside the range, on the range's thread; only ranges that start and end on one thread
count. A range's projection runs from the start of its first operation to the end of its last;
ranges without operations have none. Operations are counted by issuing call (a CUDA graph
launch is one operation however many kernels it runs), as NVIDIA's report counts them.

Per thread, each operation's call finds the innermost range open when it began (a call on a
thread cannot outlast a range of that thread, so the innermost range at its start encloses all
of it). Between one range start or end and the next the innermost range does not change, so
`nesting.range_tree` finds it for those segments only, and each call its segment by one binary
search (ten million calls, a few hundred thousand segments). The operations' first start, last
end and calls are summed per range and passed up the tree, one depth at a time. A range's level is the
number of projected ranges above it, its children the projected ranges right below it (skipping
ranges without operations). NVIDIA's report builds that hierarchy from the projected intervals
and drops ranges whose work ran on other streams; ours follows the CPU nesting, so the two can
differ where a child's work runs on another stream than its parent's (docs/stats.md).
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.intervals import last_at_or_before
from traceq.analysis.operations import BATCH_ROWS, gpu_work_sql
from traceq.analysis.structure.nesting import range_tree
from traceq.store import registered


def projected_ranges(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """Every NVTX range with GPU work, projected.

    Columns: range (domain:name, as nsys names it), style ('PushPop' or 'StartEnd'), pid, tid,
    start_ns, end_ns (the range on the CPU), proj_start_ns, proj_end_ns, ops (issuing calls),
    level, children.
    """
    t = int(trace_id)
    ranges = con.sql(f"""
        SELECT coalesce(domain, '') || ':' || coalesce(name, '') AS range,
               CASE kind WHEN 'pushpop' THEN 'PushPop' ELSE 'StartEnd' END AS style, pid, tid, start_ns, end_ns
        FROM nvtx WHERE trace_id = {t} AND kind IN ('pushpop', 'startend') AND end_ns IS NOT NULL
          AND (end_tid IS NULL OR end_tid = tid)""").pl()
    threads, trees, segments, offset = [], [], [], 0
    for mine in ranges.partition_by("pid", "tid", maintain_order=True):
        mine = mine.sort("start_ns", "end_ns", descending=[False, True], maintain_order=True)
        tree, segment = _thread_tree(mine, offset)
        offset += mine.height
        threads.append(mine)
        trees.append(tree)
        segments.append(segment)
    if not threads:
        return pl.DataFrame(schema={**ranges.schema, "proj_start_ns": pl.Int64, "proj_end_ns": pl.Int64,
                                    "ops": pl.Int64, "level": pl.Int64, "children": pl.Int64})
    own = _own_work(con, t, pl.concat(segments))
    return pl.concat([_thread_projection(mine, tree, own) for mine, tree in zip(threads, trees, strict=True)])


def _thread_tree(ranges: pl.DataFrame, offset: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One thread's ranges (in start order) as a tree: (row, parent and depth (0 at the roots), the
    rows numbered from `offset`; the thread's segments: pid, tid, at, row: from each time a range
    starts or ends to the next such time, the innermost range open (`nesting.range_tree`; the
    ranges started and ended, and so the innermost, stay the same all along a segment), null
    where none is)."""
    at = pl.concat([ranges["start_ns"], ranges["end_ns"]]).unique().sort()
    depth, parent, innermost = range_tree(ranges["start_ns"], ranges["end_ns"], at)
    tree = pl.DataFrame({"row": pl.int_range(offset, offset + ranges.height, eager=True),
                         "parent": parent + offset, "depth": depth - 1})
    thread = ranges.select("pid", "tid").head(1)
    segments = thread.select(pl.all().repeat_by(len(at)).explode()).with_columns(at=at, row=innermost + offset)
    return tree, segments


def _own_work(con: duckdb.DuckDBPyConnection, trace_id: int, segments: pl.DataFrame) -> pl.DataFrame:
    """Per range (a row of `segments`), the work of the calls made in it and in no range inside
    it: row, first (start), last (end), ops (calls). Each operation finds its segment by its
    call's thread and start (one binary search); only the columns needed are read, from where
    the operations lie (`operations.gpu_work_sql`), of the threads that have ranges."""
    threads = segments.select("pid", "tid").unique(maintain_order=True).with_row_index("thread")
    with gpu_work_sql(con, trace_id) as work, registered(con, threads=threads) as view:
        ops = con.sql(f"""
            SELECT t.thread, w.correlation_id, w.start_ns, w.end_ns, w.call_start_ns
            FROM {work} w JOIN {view['threads']} t
              ON w.pid IS NOT DISTINCT FROM t.pid AND w.tid IS NOT DISTINCT FROM t.tid
            WHERE w.call_start_ns IS NOT NULL""").pl(BATCH_ROWS)
    thread = segments.join(threads, on=["pid", "tid"], how="left", nulls_equal=True, maintain_order="left")["thread"]
    at = last_at_or_before(thread, segments["at"], ops["thread"], ops["call_start_ns"])
    return (ops.with_columns(row=segments["row"].gather(at)).drop_nulls("row")
            .group_by("row").agg(first=pl.col("start_ns").min(), last=pl.col("end_ns").max(),
                                 ops=pl.col("correlation_id").n_unique()))


def _thread_projection(ranges: pl.DataFrame, tree: pl.DataFrame, own: pl.DataFrame) -> pl.DataFrame:
    """`projected_ranges` for one thread's ranges, their tree (`_thread_tree`) and the work of
    every range's own calls (`_own_work`): the sums passed up the tree."""
    offset = tree["row"][0]
    tree = (tree.join(own, on="row", how="left", maintain_order="left")
            .with_columns(pl.col("row", "parent") - offset, ops=pl.col("ops").fill_null(0).cast(pl.Int64)))
    for depth in range(int(tree["depth"].max() or 0), 0, -1):  # pass each depth's sums up to its parents
        up = (tree.filter(pl.col("depth") == depth).group_by("parent")
              .agg(pl.col("first").min().alias("f"), pl.col("last").max().alias("l"), pl.col("ops").sum().alias("o")))
        tree = (tree.join(up, left_on="row", right_on="parent", how="left", maintain_order="left")
                .with_columns(first=pl.min_horizontal("first", "f"), last=pl.max_horizontal("last", "l"),
                              ops=pl.col("ops") + pl.col("o").fill_null(0))
                .drop("f", "l", "o"))
    level, nearest = _projected_ancestors(tree)
    tree = tree.with_columns(level=level, nearest=nearest)
    children = (tree.filter(pl.col("ops") > 0).drop_nulls("nearest").group_by("nearest").len()
                .rename({"nearest": "row", "len": "children"}))
    tree = tree.join(children, on="row", how="left", maintain_order="left")
    return (pl.concat([ranges, tree.select(proj_start_ns="first", proj_end_ns="last", ops="ops", level="level",
                                           children=pl.col("children").fill_null(0).cast(pl.Int64))],
                      how="horizontal")
            .filter(pl.col("ops") > 0))


def _projected_ancestors(tree: pl.DataFrame) -> tuple[pl.Series, pl.Series]:
    """Per row of `tree` (row, parent, depth, ops): how many of its ancestors have GPU work
    (level), and the nearest of them (nearest, null if none); top-down, one depth at a time."""
    n = tree.height
    level = pl.repeat(0, n, dtype=pl.Int64, eager=True)
    nearest = pl.repeat(None, n, dtype=pl.Int64, eager=True)
    projected = tree["ops"] > 0
    for depth in range(1, int(tree["depth"].max() or 0) + 1):
        rows = tree.filter(pl.col("depth") == depth)
        parents = rows["parent"]
        parent_projected = projected.gather(parents)
        level.scatter(rows["row"], level.gather(parents) + parent_projected.cast(pl.Int64))
        nearest.scatter(rows["row"], pl.select(pl.when(parent_projected).then(parents)
                                               .otherwise(nearest.gather(parents))).to_series())
    return level, nearest


def projection_summary(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """`nsys stats --report nvtx_gpu_proj_sum`: projected ranges by name and style, most
    projected time first.

    Columns: range, style, total_proj_ns, total_range_ns (the same ranges' CPU time), instances,
    proj_avg_ns, proj_median_ns, proj_min_ns, proj_max_ns, proj_stddev_ns, gpu_ops, avg_gpu_ops,
    avg_level, avg_children.
    """
    ranges = projected_ranges(con, trace_id).with_columns(
        proj=pl.col("proj_end_ns") - pl.col("proj_start_ns"), cpu=pl.col("end_ns") - pl.col("start_ns"))
    return (ranges.group_by("range", "style")
            .agg(total_proj_ns=pl.col("proj").sum(), total_range_ns=pl.col("cpu").sum(),
                 instances=pl.len().cast(pl.Int64), proj_avg_ns=pl.col("proj").mean(),
                 proj_median_ns=pl.col("proj").median(), proj_min_ns=pl.col("proj").min(),
                 proj_max_ns=pl.col("proj").max(), proj_stddev_ns=pl.col("proj").std().fill_null(0.0),
                 gpu_ops=pl.col("ops").sum(), avg_gpu_ops=pl.col("ops").mean(),
                 avg_level=pl.col("level").mean(), avg_children=pl.col("children").mean())
            .sort(["total_proj_ns", "range", "style"], descending=[True, False, False]))
