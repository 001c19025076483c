"""Structure from PyTorch's operators, for traces whose only ranges are the framework's own: a
plain `torch.profiler` trace (Kineto's `cpu_op` events), or an Nsight Systems trace recorded
under `torch.autograd.profiler.emit_nvtx` (an NVTX range per op, `aten::conv2d, seq = 12, ...`).

Operators nest on their thread; the outermost one around a launch (its *top op*) is the call
the model made: `aten::conv2d`, `aten::linear`, `aten::layer_norm`, or on autograd's thread
`autograd::engine::evaluate_function: ConvolutionBackward0`. From those:

- **pass**: a launch under an autograd engine op (`autograd::engine::evaluate_function: ...`,
  an op named `...Backward0`, `AccumulateGrad`) is backward, whatever the ranges around it say;
  under any other op, forward.
- **layer** (only for traces with no layer ranges of their own): a forward top op is named by
  its op and its place among the ops of that name in its iteration: `conv2d #3` is the third
  `aten::conv2d` the iteration called (`op sequence`). A backward op carries its forward op's
  autograd *sequence number* (Kineto's `Sequence number`, emit_nvtx's `seq = N`), and so does
  the forward op (or one inside it) that made the autograd node: the backward op takes that
  forward op's layer (`autograd link`). A backward op whose forward op the trace lacks keeps its
  own name (`AccumulateGrad`, `autograd op`).

Ops inside an optimizer's range (`Optimizer.step#...`, `Optimizer.zero_grad#...`) are the weight
update's, not layers. Everything is a sort and a few as-of joins over the operators (a few per
launch at most), never a loop over launches.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import polars as pl

from traceq.analysis.intervals import last_at_or_before
from traceq.analysis.structure.attribution_sql import sql_string
from traceq.analysis.structure.conventions import ITERATION_REGEX, SUFFIX_REGEX, stage_of
from traceq.analysis.structure.nesting import range_tree
from traceq.store import sql_frame

OP_SEQUENCE = "op sequence"
AUTOGRAD_LINK = "autograd link"
AUTOGRAD_OP = "autograd op"

OP_NAME_REGEX = (r"^(aten|autograd|torch|prim|c10d|inductor|triton)::|Backward\d*(,|$)|^AccumulateGrad|, (seq|op_id) = "
                 r"|^nn\.Module: ")
"""Range names that are PyTorch operators: ATen and autograd ops as Kineto and emit_nvtx name them
(emit_nvtx gives the optimizer's ranges an `op_id` too: `is_operator` leaves them out); and the
module frames Kineto records with `with_modules=True` (`nn.Module: Linear_0`), which name the
ops inside them (`module_ranges`), never layer ranges of their own."""
MODULE_PREFIX = "nn.Module: "
MODULE = "module"

_SEQ_REGEX = r",\s*seq\s*=\s*(\d+)"


def is_operator(name: str) -> str:
    """SQL: whether the range name expression `name` is a PyTorch operator's (OP_NAME_REGEX, and
    not an optimizer's range)."""
    return f"(regexp_matches({name}, {sql_string(OP_NAME_REGEX)}) AND NOT starts_with({name}, 'Optimizer.'))"
_BACKWARD = r"^autograd::engine::evaluate_function|Backward\d*$|AccumulateGrad"


def operator_ranges(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """The trace's operators as ranges: pid, tid, start_ns, end_ns, name (without emit_nvtx's
    suffix), seq (the autograd sequence number, null where none). Kineto's operator ranges (their
    sequence numbers from the `operators` table, which holds those of traces recorded with
    `record_shapes=True`), else the NVTX push/pop ranges of the default domain named like
    operators (emit_nvtx's, which carry `seq = N` in their names)."""
    t = int(trace_id)
    ops = sql_frame(con, f"""
        SELECT n.pid, n.tid, n.start_ns, n.end_ns, n.name, o.seq
        FROM nvtx n LEFT JOIN (
            SELECT pid, tid, start_ns, name, any_value(sequence_number) AS seq FROM operators
            WHERE trace_id = {t} AND sequence_number IS NOT NULL GROUP BY ALL
        ) o ON o.pid = n.pid AND o.tid = n.tid AND o.start_ns = n.start_ns AND o.name = n.name
        WHERE n.trace_id = {t} AND n.domain = 'cpu_op' AND n.kind = 'pushpop' AND n.end_ns IS NOT NULL
          AND n.pid IS NOT NULL AND n.tid IS NOT NULL AND NOT starts_with(n.name, 'Optimizer.')
          AND NOT regexp_matches(n.name, {sql_string(ITERATION_REGEX)}) AND {stage_of("n.name")} IS NULL""")
    if ops.is_empty():
        ops = sql_frame(con, f"""
            SELECT pid, tid, start_ns, end_ns, regexp_replace(name, '{SUFFIX_REGEX}', '') AS name,
                   TRY_CAST(regexp_extract(name, '{_SEQ_REGEX}', 1) AS BIGINT) AS seq
            FROM nvtx WHERE trace_id = {t} AND kind = 'pushpop' AND domain IS NULL AND end_ns IS NOT NULL
              AND pid IS NOT NULL AND tid IS NOT NULL AND {is_operator("name")}""")
    return ops.with_columns(pl.col("seq").cast(pl.Int64))


def module_ranges(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame | None:
    """The nn.Module frames Kineto records with `with_modules=True`: pid, tid, start_ns, end_ns,
    name (`Linear_0`: the class and its instance number); None when the trace has none."""
    frame = sql_frame(con, f"""
        SELECT pid, tid, start_ns, end_ns, substr(name, {len(MODULE_PREFIX) + 1}) AS name FROM nvtx
        WHERE trace_id = {int(trace_id)} AND domain = 'python_function' AND kind = 'pushpop'
          AND starts_with(name, '{MODULE_PREFIX}') AND end_ns IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL
    """)
    return None if frame.is_empty() else frame


def _innermost_module(tops: pl.DataFrame, modules: pl.DataFrame) -> pl.Series:
    """For each top op (pid, tid, start_ns), the innermost module frame of its thread open at its
    start (null outside all): modules nest on their thread (`nesting.range_tree`)."""
    found = pl.repeat(None, tops.height, dtype=pl.String, eager=True)
    tops = tops.with_row_index("row")
    for (pid, tid), part in modules.sort("start_ns", pl.col("end_ns"), descending=[False, True]).partition_by(
            "pid", "tid", as_dict=True, maintain_order=True).items():
        at = tops.filter((pl.col("pid") == pid) & (pl.col("tid") == tid))
        if at.is_empty():
            continue
        _, _, row = range_tree(part["start_ns"], part["end_ns"], at["start_ns"])
        names = pl.select(pl.when(row.is_not_null()).then(part["name"].gather(row.fill_null(0)))).to_series()
        found = found.scatter(at["row"], names)
    return found


def top_ops(ops: pl.DataFrame, optimizer_ranges: pl.DataFrame, iteration_ranges: pl.DataFrame,
            modules: pl.DataFrame | None = None) -> pl.DataFrame:
    """The outermost operator of every nest on each thread, with what it says: pid, tid,
    start_ns, end_ns, label (the layer it names), pass, how (OP_SEQUENCE, AUTOGRAD_LINK,
    AUTOGRAD_OP; null inside an optimizer's range), backward, sorted by (pid, tid, start_ns).

    optimizer_ranges: pid, start_ns, end_ns of the optimizers' ranges; iteration_ranges: pid,
    start_ns, end_ns, nm of the iteration ranges (forward ops are numbered per iteration);
    modules (`module_ranges`): a forward top op inside a module frame is named by the innermost
    one (`Linear_3`, how MODULE) instead of its op sequence."""
    ops = (ops.sort("pid", "tid", "start_ns", pl.col("end_ns"), descending=[False, False, False, True])
           .with_columns(prev_end=pl.col("end_ns").cum_max().shift(1).over("pid", "tid")))
    ops = ops.with_columns(top=pl.col("prev_end").is_null() | (pl.col("start_ns") >= pl.col("prev_end")))
    ops = ops.with_columns(top_id=pl.col("top").cum_sum())
    tops = ops.filter("top").select("top_id", "pid", "tid", "start_ns", "end_ns", "name",
                                    backward=pl.col("name").str.contains(_BACKWARD))
    tops = _within(tops, optimizer_ranges, "in_optimizer")
    tops = _iteration_of(tops, iteration_ranges)
    # the autograd sequence number each backward top op carries: its first op named ...Backward with one
    link = (ops.filter(pl.col("seq").is_not_null() & pl.col("name").str.contains(r"Backward\d*$")
                       & ~pl.col("name").str.starts_with("autograd::"))
            .group_by("top_id").agg(link_seq=pl.col("seq").sort_by("start_ns").first()))
    forward = tops.filter(~pl.col("backward") & ~pl.col("in_optimizer"))
    forward = forward.with_columns(
        op=_short(pl.col("name")),
    ).with_columns(label=pl.col("op") + " #" + (pl.col("start_ns").rank("ordinal").over("iteration", "op"))
                   .cast(pl.String), how=pl.lit(OP_SEQUENCE))
    if modules is not None and not forward.is_empty():
        module = _innermost_module(forward, modules)
        forward = forward.with_columns(label=pl.coalesce(module, "label"),
                                       how=pl.when(module.is_not_null()).then(pl.lit(MODULE)).otherwise("how"))
    # every sequence number recorded inside a forward top op names that op's layer
    # ... the last to record it: ops before the one that makes the node record the number it will
    # get too (BatchNorm's `num_batches_tracked.add_(1)`, the input's `.to(device)`)
    made = (ops.filter(pl.col("seq").is_not_null()).join(forward.select("top_id", "label"), on="top_id")
            .group_by("pid", "seq").agg(pl.col("label").sort_by("start_ns").last()))
    backward = (tops.filter(pl.col("backward")).join(link, on="top_id", how="left")
                .join(made.rename({"seq": "link_seq", "label": "linked"}), on=["pid", "link_seq"], how="left"))
    labels = pl.concat([
        forward.select("top_id", "label", pass_=pl.lit("forward"), how=pl.col("how")),
        backward.select("top_id", label=pl.coalesce("linked", _short(pl.col("name"))), pass_=pl.lit("backward"),
                        how=pl.when(pl.col("linked").is_not_null()).then(pl.lit(AUTOGRAD_LINK))
                        .otherwise(pl.lit(AUTOGRAD_OP))),
    ])
    return (tops.join(labels, on="top_id", how="left")
            .select("pid", "tid", "start_ns", "end_ns", "label", pl.col("pass_").alias("pass"), "how",
                    "backward")
            .sort("pid", "tid", "start_ns"))


def _short(name: pl.Expr) -> pl.Expr:
    """An op's name as a layer reads it: `aten::conv2d` -> `conv2d`; autograd's evaluate_function
    prefix off (`ConvolutionBackward0`)."""
    return (name.str.replace(r"^autograd::engine::evaluate_function:\s*", "").str.replace(r"^aten::", "")
            .str.replace(r"^torch::autograd::", ""))


def _open_at(ranges: pl.DataFrame, by: list[str], points: pl.DataFrame, time: pl.Series,
             columns: list[str]) -> pl.DataFrame:
    """For each point (row of `points`, at `time`), `columns` of the range of `ranges` (start_ns,
    end_ns, `by`, `columns`; none nest within one group) with the same `by` values begun last
    at or before the time, if the time is before its end; nulls elsewhere. One binary search per
    point (`intervals.last_at_or_before`)."""
    def group(frame: pl.DataFrame) -> pl.Series:
        return frame[by[0]] if len(by) == 1 else frame.select(pl.struct(by).hash()).to_series()

    ranges = ranges.drop_nulls(by)  # a range of no process or thread encloses nothing
    row = last_at_or_before(group(ranges), ranges["start_ns"], group(points), time)
    inside = ranges["end_ns"].gather(row) > time
    return pl.DataFrame([pl.select(pl.when(inside).then(ranges[c].gather(row))).to_series().alias(c)
                         for c in columns])


def _within(tops: pl.DataFrame, ranges: pl.DataFrame, column: str) -> pl.DataFrame:
    """tops with `column`: whether a range of `ranges` (pid, start_ns, end_ns; none nest) of its
    process encloses its start."""
    found = _open_at(ranges.with_columns(inside=pl.lit(True)), ["pid"], tops, tops["start_ns"], ["inside"])
    return tops.with_columns(found["inside"].fill_null(False).alias(column))


def _iteration_of(tops: pl.DataFrame, iterations: pl.DataFrame) -> pl.DataFrame:
    """tops with `iteration`: the name of the iteration range of its process open at its start
    (null outside all)."""
    found = _open_at(iterations.cast({"nm": pl.String}), ["pid"], tops, tops["start_ns"], ["nm"])
    return tops.with_columns(iteration=found["nm"])


def point_tops(points: pl.DataFrame, tops: pl.DataFrame) -> pl.DataFrame:
    """For each point (pos, pid, tid, t), the top op around it: pos, label, pass, how, backward
    (null columns where no top op of its thread encloses t)."""
    found = _open_at(tops, ["pid", "tid"], points, points["t"], ["label", "pass", "how", "backward"])
    return pl.concat([points.select("pos"), found], how="horizontal")


def launcher_ops(ops: pl.DataFrame, launches: Callable[[str], bool]) -> pl.DataFrame:
    """The operators whose name a [[launcher]] rule names (`launches`: `RuleSet.launches`):
    pid, tid, start_ns, end_ns, name. The rules are tried once per distinct name."""
    names = ops.select(pl.col("name").unique())["name"]
    wanted = [name for name in names.to_list() if name and launches(name)]
    return ops.filter(pl.col("name").is_in(wanted)).select("pid", "tid", "start_ns", "end_ns", "name")


def point_launchers(points: pl.DataFrame, launchers: pl.DataFrame) -> pl.DataFrame:
    """For each point (pos, pid, tid, t), the launcher op around it (the last of its thread to
    begin at or before t, if still open): pos, launcher."""
    found = _open_at(launchers, ["pid", "tid"], points, points["t"], ["name"])
    return pl.concat([points.select("pos"), found.rename({"name": "launcher"})], how="horizontal")


def with_operators(
    index: pl.Series, contexts: pl.DataFrame, points: pl.DataFrame, tops: pl.DataFrame, *,
    layers: bool, stage_ranges: bool, launchers: pl.DataFrame | None = None,
) -> tuple[pl.Series, pl.DataFrame]:
    """`attribution.point_contexts`' (index, contexts) with what the top ops say: a point under
    an autograd op is backward; with `layers` (the trace has no layer ranges of its own), a point
    of no layer (and not in the weight update) takes its top op's label, pass and `how` as its
    attribution. A point whose stage no stage range gave (`other`, or any without `stage_ranges`)
    takes the pass as its stage (a copy to the device an op placed is the data copy stage all the
    same: `attribution._with_copy_stages`). The few distinct
    results become new contexts (as `inference.infer_layers` does), so no string is built per point.
    `launchers` (`launcher_ops`): contexts gain a `launcher` column, the launcher op around the
    point, for the [[launcher]] rules that decide a kernel's library by the op that launched it."""
    found = point_tops(points, tops)
    if launchers is not None and not launchers.is_empty():
        found = found.join(point_launchers(points, launchers), on="pos", how="left")
    else:
        found = found.with_columns(launcher=pl.lit(None, pl.String))
    found = found.filter(pl.col("label").is_not_null() | pl.col("backward").fill_null(False)
                         | pl.col("launcher").is_not_null())
    if found.is_empty():
        return index, contexts
    for column in ("attribution", "launcher"):
        if column not in contexts.columns:
            contexts = contexts.with_columns(pl.lit(None, pl.String).alias(column))
    old = contexts.with_row_index("context").join(
        found.with_columns(context=index.gather(found["pos"])), on="context")
    old = old.with_columns(takes=pl.lit(layers) & pl.col("layer").is_null() & (pl.col("stage") != "weight_update")
                           & pl.col("label").is_not_null())
    takes = pl.col("takes")
    new_pass = (pl.when(pl.col("backward").fill_null(False)).then(pl.lit("backward"))
                .when(takes & pl.col("pass").is_null()).then(pl.col("pass_right")).otherwise(pl.col("pass")))
    changed = old.with_columns(
        launcher=pl.coalesce("launcher_right", "launcher"),
        layer=pl.when(takes).then(pl.col("label")).otherwise(pl.col("layer")),
        attribution=pl.when(takes).then(pl.col("how")).otherwise(pl.col("attribution")),
        new_pass=new_pass,
    ).with_columns(
        # a stage no range gave ('other', or with no stage ranges one read from the pass) follows the ops
        stage=pl.when((pl.col("stage") != "other") & (pl.lit(stage_ranges) | pl.col("stage").is_in(
            ["weight_update", "data_copy"]))).then(pl.col("stage"))
        .otherwise(pl.coalesce("new_pass", "stage")),
    ).with_columns(pl.col("new_pass").alias("pass")).select("pos", "context", *contexts.columns)
    return recontext(index, contexts, changed)


def recontext(index: pl.Series, contexts: pl.DataFrame, changed: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """(index, contexts) with the points of `changed` (pos and the columns of contexts) given
    the contexts it says: a known row where one is equal, else a new row, one per distinct
    context (a handful), so no string is built per point."""
    keys = contexts.columns
    known = contexts.with_row_index("row").unique(subset=keys, keep="first", maintain_order=True)
    rows = changed.select(keys).unique(maintain_order=True).join(known, on=keys, how="left", nulls_equal=True,
                                                                  maintain_order="left")
    table = pl.concat([contexts, rows.filter(pl.col("row").is_null()).drop("row").cast(contexts.schema)],
                      rechunk=True)
    numbered = table.with_row_index("row").unique(subset=keys, keep="first", maintain_order=True)
    moved = changed.select("pos", *keys).join(numbered, on=keys, how="left", nulls_equal=True, maintain_order="left")
    return index.scatter(moved["pos"], moved["row"].cast(index.dtype)), table
