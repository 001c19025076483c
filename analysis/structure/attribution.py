"""Which NVTX ranges each kernel (and memcpy/memset) belongs to: layer, pass, iteration, stage.

A GPU operation belongs to the ranges that enclose the CPU call that launched it
(`kernel_launches.launch_start_ns`); a kernel replayed from a CUDA graph, to its thread's ranges
as they were when the graph was captured (`analysis.structure.graphs`). Two kinds of enclosing are used,
because of how our traces are recorded (see the reference traces' README):

- **by thread**: the `pushpop` ranges open on the launching thread (same pid and tid) at the
  launch time. These give the layer (the innermost range that is not an iteration or stage
  range) and the thread's part of the path.
- **by time**: iteration and stage ranges (`iteration N`, `data_copy`, `forward`, `backward`,
  `weight_update`) on any thread of the same process, and every `startend` range of the process.
  PyTorch pushes backward layer ranges on its autograd thread while iteration and stage ranges
  live on the main thread only, so an autograd kernel finds its iteration and stage this way.

How (`point_contexts`). A trace can hold ten million ranges and millions of launches, so there
is no loop over either, no long string is sorted or joined per range, and no string is built
per launch:

1. **Names** (`_range_names`). Each distinct range name is read and classified once (suffix
   removed; iteration, stage, backward, optimizer); ranges carry a name id.
2. **Nesting, per thread** (`analysis.structure.nesting`, polars). Push/pop ranges nest on
   their thread. With the thread's ranges in start order (ties: longer first), a range's depth
   is the ranges started up to it less the ranges ended by its start, and its parent is the last
   range before it one level up; at a launch time t, the depth D is the ranges started by t less
   the ranges ended by t, and the innermost open range is the last range of depth D started by
   t. Counting and "last before" are merges or binary searches over sorted columns.
3. **Chains.** What the thread gives a launch (layer, path, backward and optimizer flags,
   innermost name) depends only on the names from the root range down to its innermost range.
   Each range's chain of names is numbered by value, depth by depth, from its parent's chain and
   its name: millions of ranges share a few thousand chains.
4. **By time** (`_by_time`, SQL). The iteration, stage and start/end ranges around a time
   change only where one starts or ends, so they are resolved once per interval between two
   such boundaries (per thread, which the path prefix depends on), and a launch takes its
   interval's by a binary search. Intervals are numbered by what they give, too.
5. **Contexts** (SQL). Layer, pass, stage, path and innermost name are computed once per
   distinct (chain, by-time context) pair; a launch gets the index of its pair.
   `attribute_points` turns indexes into columns (polars shares the strings, no copies);
   `layers` groups launches by index instead.

The rules are those of the earlier, all-SQL form (a sweep over every push and pop event, ASOF
joins by depth, a recursive CTE over every range: 37 s and 20 GB for ten million ranges where
this takes 5 s and 1.7 GB); tests/test_attribution_speed.py keeps that form as its reference
and checks the two agree on random traces. The SQL pieces are in `attribution_sql`, shared with it.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.kernels.classify import default_rules
from traceq.analysis.structure import xla
from traceq.analysis.structure.attribution_sql import (
    BY_TIME_CTES,
    name_flags,
    paths_cte,
    real_asof_joins,
    result_sql,
    sql_string,
)
from traceq.analysis.structure.conventions import (
    APPLICATION_DOMAINS,
    COMMUNICATION,
    COMMUNICATION_DOMAINS,
    COMMUNICATION_REGEX,
    ITERATION_REGEX,
)
from traceq.analysis.structure.graphs import kernel_points_sql, replay_iterations, replay_layers
from traceq.analysis.structure.inference import infer_layers
from traceq.analysis.structure.nesting import in_start_order, null_if_negative, thread_chains
from traceq.analysis.structure.operators import (
    OP_SEQUENCE,
    is_operator,
    launcher_ops,
    module_ranges,
    operator_ranges,
    top_ops,
    with_operators,
)
from traceq.analysis.structure.phases import compile_intervals, inside, warm_up
from traceq.analysis.structure.steps import step_iterations
from traceq.store import registered, sql_frame

_FOREVER = 9_223_372_036_854_775_807

COLUMNS = ("kernel_id", "layer", "pass", "iteration", "stage", "nvtx_path", "nvtx_innermost", "attribution")
_RESULT = COLUMNS[1:]


def kernel_attribution(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX, *,
    paths: bool = True, infer: bool = True,
) -> pl.DataFrame:
    """Every kernel of the trace with the NVTX context of its launch, ordered by kernel_id.

    Columns: kernel_id; layer (innermost range on the launching thread that is not an
    iteration or stage range, with PyTorch's ', seq = ...' suffix removed; a `b` prefix, as in
    'bconv1', marks the backward pass); pass ('forward', 'backward' or null); iteration (the
    name of the enclosing range matching `iteration_regex`, found by time on any thread of the
    process); stage (data_copy, forward, backward, weight_update or other); nvtx_path (the
    enclosing ranges outermost first, e.g. 'iteration 0/backward/bconv1'); nvtx_innermost (the
    innermost range's full name); attribution ('range' inside a layer range, else the rule that
    gave the layer or why there is none: `analysis.structure.inference`). With `infer` (the default),
    kernels outside every layer range get a layer by those rules; without, they keep nulls, as
    do kernels without a launch call or outside all ranges (stage 'other'). With `paths=False`
    nvtx_path and nvtx_innermost are null and the work lighter (analyses that group by layer,
    pass, iteration or stage do not need them).
    """
    points = sql_frame(con, f"SELECT kernel_id AS id, pid, point_tid AS tid, point_ns AS t, time_ns AS time, "
                            f"launch_tid AS time_tid "
                            f"FROM ({kernel_points_sql(con, trace_id)}) ORDER BY kernel_id")
    return attribute_points(con, trace_id, points, iteration_regex, paths=paths, infer=infer).rename(
        {"id": "kernel_id"})


def gpu_activity(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> pl.DataFrame:
    """Kernels, memcpys and memsets with their attribution, for stage and idle-time analyses.

    Columns: kind ('kernel', 'memcpy', 'memset'), pid, device_id, start_ns, end_ns, dur_ns, name
    (kernel name, or the copy kind), layer, pass, iteration, stage; by start_ns. A memcpy or
    memset is attributed like a kernel, from the API call that issued it; one issued outside a
    stage range counts as data_copy when it copies host to device, else as 'other'.
    """
    ops, kinds, names, contexts = gpu_operations(con, trace_id, iteration_regex)
    return ops.select(kinds.gather(ops["kind"]).alias("kind"), "pid", "device_id", "start_ns", "end_ns", "dur_ns",
                      names.gather(ops["name"]).alias("name"),
                      *[contexts[c].gather(ops["context"]) for c in contexts.columns])


def gpu_operations(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> tuple[pl.DataFrame, pl.Series, pl.Series, pl.DataFrame]:
    """`gpu_activity` with its strings as row numbers into small tables (millions of kernels,
    few distinct values): (ops, kinds, names, contexts). ops: pid, device_id, start_ns, end_ns,
    dur_ns, and kind, name, context, row numbers in kinds, names and contexts (layer, pass,
    iteration, stage); by start_ns."""
    t = int(trace_id)
    kernels, kernel_names = kernel_launches(con, t, ("device_id", "start_ns", "end_ns", "dur_ns"), ordered=False)
    memops = _memops(con, t)
    points = pl.concat([kernels.select("pid", "tid", "t", "time", "time_tid"),
                        memops.select("pid", "tid", "t", time="t", time_tid="tid")])
    index, contexts = point_contexts(con, t, points, iteration_regex, paths=False)
    contexts = _with_copy_stages(contexts)
    kinds = pl.concat([pl.Series(["kernel"]), memops["kind"].unique(maintain_order=True)])
    names = pl.concat([kernel_names["name"], memops["name"].unique(maintain_order=True)])
    columns = ["pid", "device_id", "start_ns", "end_ns", "dur_ns"]

    def code(column: str, values: pl.Series, offset: int) -> pl.Expr:
        if values.is_empty():  # no memops: replace_strict would keep the column's own dtype
            return pl.lit(None, pl.UInt32)
        return pl.col(column).replace_strict(values, pl.int_range(offset, offset + len(values), eager=True),
                                             return_dtype=pl.UInt32)

    ops = pl.concat([
        kernels.select(*columns, kind=pl.lit(0, dtype=pl.UInt32), name="name_row",
                       context=index.head(kernels.height)),
        memops.select(*columns, kind=code("kind", kinds.slice(1), 1),
                      name=code("name", names.slice(kernel_names.height), kernel_names.height),
                      context=_copy_context(index.tail(memops.height), contexts.height)),
    ])
    return ops.sort("start_ns", maintain_order=True), kinds, names, contexts


def copy_operations(
    con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The memcpys and memsets of `gpu_operations` alone, for analyses that have the kernels'
    iteration and stage from the kept attribution: (ops: device_id, start_ns, end_ns, dur_ns,
    context; contexts: iteration, stage). A point's iteration and stage are those of the ranges
    open at its call, whatever the other points, so they are `gpu_operations`' own."""
    t = int(trace_id)
    memops = _memops(con, t)
    index, contexts = point_contexts(con, t, memops.select("pid", "tid", "t"), iteration_regex, paths=False,
                                     infer=False)
    contexts = _with_copy_stages(contexts)
    ops = memops.select("device_id", "start_ns", "end_ns", "dur_ns", context=_copy_context(index, contexts.height))
    return ops, contexts.select("iteration", "stage")


def _memops(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """The trace's memcpys and memsets with their issuing call's thread and start (the points
    `point_contexts` takes): kind, pid, tid, t, device_id, start_ns, end_ns, dur_ns, name (the
    copy kind, or the op), to_device."""
    t = int(trace_id)
    # the calls of the copies' correlation ids first: a few thousand of millions, not a join of all
    return sql_frame(con, f"""
        SELECT m.op AS kind, m.pid, a.tid, a.start_ns AS t, m.device_id, m.start_ns, m.end_ns, m.dur_ns,
               coalesce(m.copy_kind, m.op) AS name, coalesce(m.copy_kind = 'Host-to-Device', false) AS to_device
        FROM memops m LEFT JOIN (
            SELECT h.pid, h.tid, e.start_ns, e.correlation_id
            FROM api_events e
            JOIN api_names n ON n.trace_id = e.trace_id AND n.name_id = e.name_id AND n.api IN ('runtime', 'driver')
            JOIN api_threads h ON h.trace_id = e.trace_id AND h.thread_id = e.thread_id
            WHERE e.trace_id = {t} AND e.correlation_id IN (SELECT correlation_id FROM memops WHERE trace_id = {t})
        ) a ON a.pid = m.pid AND a.correlation_id = m.correlation_id
        WHERE m.trace_id = {t}""")


def _with_copy_stages(contexts: pl.DataFrame) -> pl.DataFrame:
    """`contexts` (layer, pass, iteration, stage, attribution) twice, as layer, pass, iteration,
    stage: the second time for copies to the device, which are data_copy outside every stage
    range and wherever an operator placed them (`x.to(device)` in the forward pass: `operators`);
    `_copy_context` picks the half."""
    columns = ["layer", "pass", "iteration", "stage"]
    by_op = pl.col("attribution").is_in([OP_SEQUENCE]).fill_null(False)
    return pl.concat([contexts.select(columns), contexts.with_columns(
        stage=pl.when((pl.col("stage") != "other") & ~by_op).then(pl.col("stage")).otherwise(pl.lit("data_copy")))
        .select(columns)])


def _copy_context(index: pl.Series, doubled: int) -> pl.Expr:
    """A copy's row in `_with_copy_stages`' contexts (`doubled` rows) from its context `index`."""
    return pl.lit(index) + pl.col("to_device").cast(pl.UInt32) * (doubled // 2)


def kernel_launches(
    con: duckdb.DuckDBPyConnection, trace_id: int, columns: tuple[str, ...] = (), *, ordered: bool = True,
    between: tuple[int, int] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every kernel with the call that launched it (`between`: of kernel_id lo to hi), and its names apart.

    Returns (kernels, names). kernels: id (kernel_id), pid, tid, t (the launching call's thread
    and start, null without one: the points `point_contexts` takes), `columns` of the kernels
    table, and name_row, the kernel's row in names (name, short_name: each distinct pair once);
    in kernel_id order if `ordered`. Kernel names are long and few, so they travel once, as
    hashes per kernel (or as themselves, should two share a hash); `names[...].gather(name_row)`
    gives columns that share the strings.
    """
    t, only = int(trace_id), "" if between is None else f" AND kernel_id BETWEEN {int(between[0])} AND {int(between[1])}"
    names = sql_frame(con, f"SELECT DISTINCT hash(name) AS name_h, hash(short_name) AS short_h, name, short_name "
                           f"FROM kernels WHERE trace_id = {t}{only}")
    if names.select("name_h", "short_h").is_duplicated().any():
        names = names.with_columns(name_h=pl.col("name"), short_h=pl.col("short_name"))
        hashes = "name AS name_h, short_name AS short_h"
    else:
        hashes = "hash(name) AS name_h, hash(short_name) AS short_h"
    kernels = sql_frame(con, f"SELECT kernel_id AS id, pid, point_tid AS tid, point_ns AS t, time_ns AS time, "
                             f"launch_tid AS time_tid"
                             f"{''.join(', ' + c for c in columns)}, {hashes} FROM ({kernel_points_sql(con, t)}) "
                             f"WHERE true{only}{' ORDER BY kernel_id' if ordered else ''}")
    key = pl.struct("name_h", "short_h")  # a lookup, not a join: joins copy every column
    rows = pl.int_range(0, names.height, dtype=pl.UInt32, eager=True)
    # (polars gives an empty lookup the key's type, so a trace without kernels gets its own)
    kernels = kernels.with_columns(name_row=key.replace_strict(names.select(key).to_series(), rows)
                                   if names.height else pl.lit(None, pl.UInt32))
    return kernels.drop("name_h", "short_h"), names.drop("name_h", "short_h")


def attribute_points(
    con: duckdb.DuckDBPyConnection, trace_id: int, points: pl.DataFrame,
    iteration_regex: str = ITERATION_REGEX, *, paths: bool = True, infer: bool = True, operators: bool = True,
) -> pl.DataFrame:
    """The NVTX context of each point of `points` (columns id, pid, tid, t: the launching
    call's process, thread and start in ns, t null when there is none; optionally time: where
    it differs from t, the iteration is the one open at time, not at t, as for a kernel replayed
    from a CUDA graph, whose t is where it was captured: see `analysis.structure.graphs`), in the same
    order.

    Columns: id and those of `kernel_attribution` after kernel_id (stage 'other' where no range
    says otherwise). With `paths=False`, nvtx_path and nvtx_innermost are null; `infer` as for
    `kernel_attribution`.
    """
    index, contexts = point_contexts(con, trace_id, points, iteration_regex, paths=paths, infer=infer,
                                     operators=operators)
    return pl.DataFrame({"id": points["id"], **{c: contexts[c].gather(index) for c in _RESULT}})


def point_contexts(
    con: duckdb.DuckDBPyConnection, trace_id: int, points: pl.DataFrame,
    iteration_regex: str = ITERATION_REGEX, *, paths: bool = True, infer: bool = True, operators: bool = True,
) -> tuple[pl.Series, pl.DataFrame]:
    """`attribute_points` before it is spread over the points: (index, contexts). contexts has
    one row per distinct context (columns layer, pass, iteration, stage, nvtx_path,
    nvtx_innermost, attribution), a few thousand at most on real traces; index (one per point)
    is the row of the point's context. Grouping points by index costs no string per point.
    With `operators` (the default), PyTorch's operators give the pass of the points under an
    autograd op and, in a trace with no layer ranges, a layer (`operators`). With `infer`,
    `inference.infer_layers` gives layers to the points outside every layer range; without,
    their attribution is null (but for the operators')."""
    t = int(trace_id)
    names = _range_names(con, t, iteration_regex)
    ranges = _ranges(con, t, names)
    compiling = compile_intervals(con, t, names["name"])
    optimizers = ranges.filter(pl.col("name_id").is_in(names.filter("is_optimizer")["name_id"].implode()))
    threads, by_time_ranges, forward_names = _split_ranges(ranges, names)
    if not optimizers.is_empty():  # a trace without iteration ranges: its optimizer steps
        first = pl.concat([sql_frame(con, f"SELECT pid, min(start_ns) AS first_ns FROM nvtx WHERE trace_id = {t} "
                                          "AND pid IS NOT NULL GROUP BY pid"), points.select("pid", first_ns="t")])
        by_time_ranges = step_iterations(by_time_ranges, optimizers, names,
                                         first.group_by("pid").agg(pl.col("first_ns").min()))
    xla_ops = None
    if names["name"].str.starts_with(xla.MODULE_PREFIX).any():  # JAX: programs as iterations, thunks as ops
        launches = points.select("pid", "tid", t=pl.coalesce("time", "t") if "time" in points.columns else "t")
        by_time_ranges = xla.module_iterations(by_time_ranges, ranges, names,
                                               inside(compiling, ranges["pid"], ranges["start_ns"]), launches)
        xla_ops = xla.op_labels(ranges, names)
    del ranges
    replay = points["time"] if "time" in points.columns else None
    replay_tid = points["time_tid"] if "time_tid" in points.columns else None
    points = points.select("pid", "tid", "t").with_row_index("pos")
    chains, located, segments = _locate(threads, points.drop_nulls("t"), by_time_ranges, names)
    by_time, by_time_of_segment = _by_time(con, segments, by_time_ranges)

    # number the distinct (chain, by-time context) pairs; "nothing" is the pair (null, null)
    n_by_time = by_time.height + 1
    pair = ((located["chain"].fill_null(-1) + 1) * n_by_time
            + by_time_of_segment.gather(located["segment"]).cast(pl.Int64).fill_null(-1) + 1)
    pairs = pl.concat([pl.Series([0], dtype=pl.Int64), pair]).unique().sort()
    combos = pl.DataFrame({"chain": null_if_negative(pairs // n_by_time - 1),
                           "context": null_if_negative(pairs % n_by_time - 1)}).with_row_index("combo")
    index = (pl.repeat(0, points.height, dtype=pl.UInt32, eager=True)
             .scatter(located["pos"], pairs.search_sorted(pair)))
    contexts = _contexts(con, names, chains, by_time, combos, forward_names, paths)
    if replay is not None:  # kernels replayed from CUDA graphs: the iteration of the replay
        index, contexts = replay_iterations(by_time_ranges, points, replay, index, contexts)
    index, contexts = _structured(con, t, points, index, contexts, by_time_ranges, names, optimizers, iteration_regex,
                                  paths=paths, infer=infer, operators=operators, replay=replay, replay_tid=replay_tid)
    if xla_ops is not None:
        index, contexts = xla.with_xla_ops(index, contexts, xla_ops)
    index, contexts = with_communication(index, contexts)
    iterations = by_time_ranges.filter(pl.col("is_iter")).select("pid", "start_ns", "end_ns", "nm")
    time = points["t"] if replay is None else pl.select(pl.coalesce(replay, points["t"])).to_series()
    return warm_up(index, contexts, points["pid"], time, compiling, iterations)


def _structured(
    con: duckdb.DuckDBPyConnection, t: int, points: pl.DataFrame, index: pl.Series, contexts: pl.DataFrame,
    by_time_ranges: pl.DataFrame, names: pl.DataFrame, optimizers: pl.DataFrame, iteration_regex: str, *,
    paths: bool, infer: bool, operators: bool, replay: pl.Series | None, replay_tid: pl.Series | None,
) -> tuple[pl.Series, pl.DataFrame]:
    """`point_contexts`' (index, contexts) from the ranges alone, with what operators, CUDA-graph
    replays and the inference rules add."""
    # a collective's range names its own kernels, not the trace's layers (`with_communication`)
    candidates = names.filter(~pl.col("is_iter") & ~pl.col("is_stage") & ~pl.col("is_optimizer") & ~pl.col("is_op")
                              & ~pl.col("name").str.contains(COMMUNICATION_REGEX))
    ops = operator_ranges(con, t) if operators and _may_have_operators(con, t, names) else None
    tops = None
    stage_ranges = by_time_ranges.filter(pl.col("is_stage") & ~pl.col("is_iter")).height > 0
    if ops is not None and not ops.is_empty():
        tops = top_ops(ops, optimizers.select("pid", "start_ns", "end_ns"),
                       by_time_ranges.filter(pl.col("is_iter")).select("pid", "start_ns", "end_ns", "nm"),
                       module_ranges(con, t))
        layers = not _has_layer_ranges(con, t, candidates)
        index, contexts = with_operators(index, contexts, points, tops, layers=layers, stage_ranges=stage_ranges,
                                         launchers=launcher_ops(ops, default_rules().launches))
        if layers:
            tops = None  # every point an op could name has its op's layer already
    if replay is not None and replay_tid is not None:  # replayed work its capture placed nowhere

        def contexts_at(at: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
            return point_contexts(con, t, at.select("pid", "tid", "t"), iteration_regex, paths=paths, infer=False,
                                  operators=operators)

        index, contexts = replay_layers(index, contexts, points, replay, replay_tid, contexts_at)
    if not infer:
        if "attribution" in contexts.columns:
            return index, contexts
        return index, contexts.with_columns(attribution=pl.lit(None, pl.String))

    def layer_ranges() -> pl.DataFrame:  # read again only when a launch needs them
        return (_ranges(con, t, names, application=True)
                .filter(~pl.col("startend") & (pl.col("end_ns") > pl.col("start_ns")))
                .join(candidates.select("name_id", "nm"), on="name_id").select("pid", "start_ns", "end_ns", "nm"))

    index, contexts = infer_layers(points, index, contexts, by_time_ranges, layer_ranges)
    if tops is not None:  # layer ranges, but outside them no rule placed some work: its op names it
        placed = contexts["attribution"].str.starts_with("none").fill_null(True)
        open_ = contexts.with_columns(layer=pl.when(placed).then(pl.lit(None, pl.String)).otherwise(pl.col("layer")))
        return with_operators(index, open_, points, tops, layers=True, stage_ranges=stage_ranges)
    return index, contexts


def with_communication(index: pl.Series, contexts: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """(index, contexts) with the pass COMMUNICATION where the layer is a communication
    library's range (COMMUNICATION_REGEX: `ncclAllReduce`, `nccl:all_reduce`): the collective
    runs in its stage, but it is neither forward nor backward computation."""
    comm = contexts["layer"].str.contains(COMMUNICATION_REGEX).fill_null(False)
    if not comm.any():
        return index, contexts
    return xla.deduplicated(index, contexts.with_columns(
        **{"pass": pl.when(comm).then(pl.lit(COMMUNICATION)).otherwise(pl.col("pass"))}))


# --------------------------------------------------------------------------------------------
# the fast form, step by step


def _range_names(con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str) -> pl.DataFrame:
    """Every distinct name of the trace's push/pop and start/end ranges, classified: name_id
    (its row number), h (hash of the name), name, nm (without the emit_nvtx suffix), is_iter,
    is_stage, is_backward, is_optimizer, is_op (a PyTorch operator: `operators`)."""
    return sql_frame(con, f"""
        SELECT hash(name) AS h, name, {name_flags("name", iteration_regex)},
               {is_operator("name")} AS is_op
        FROM (SELECT DISTINCT coalesce(name, '') AS name FROM nvtx
              WHERE trace_id = {trace_id} AND kind IN ('pushpop', 'startend'))
    """).with_row_index("name_id")


def _ranges(con: duckdb.DuckDBPyConnection, trace_id: int, names: pl.DataFrame, *,
            application: bool = False) -> pl.DataFrame:
    """The trace's push/pop and start/end ranges: pid, tid, start_ns, end_ns (open ones end at
    the end of time), startend, name_id, in table order: nesting needs it where two ranges of a
    thread start at once, so they are read from nvtx_events (a scan keeps the order; the `nvtx`
    view's join, run in parallel, does not) and their attributes looked up here. Names travel as
    their hash, turned into the id here; should two names share a hash, the names themselves
    are looked up instead (slower). `application`: only the application's ranges (`APPLICATION_DOMAINS`),
    not a library's such as NCCL's."""
    domains = ", ".join(sql_string(d) for d in APPLICATION_DOMAINS)
    nesting = ", ".join(sql_string(d) for d in (*APPLICATION_DOMAINS, *xla.XLA_DOMAINS, *COMMUNICATION_DOMAINS))
    attributes = sql_frame(con, f"SELECT attributes_id, pid, tid, kind = 'startend' AS startend, domain, "
                                f"coalesce(domain IN ({nesting}), true) AS nests FROM nvtx_attributes "
                                f"WHERE trace_id = {trace_id} AND kind IN ('pushpop', 'startend')"
                                f"{f' AND (domain IS NULL OR domain IN ({domains}))' if application else ''}")
    by_hash = names["h"].is_unique().all()
    frame = sql_frame(con, f"""
        SELECT attributes_id, start_ns, coalesce(end_ns, {_FOREVER}) AS end_ns,
               {"hash(coalesce(name, ''))" if by_hash else "coalesce(name, '')"} AS key
        FROM nvtx_events
        WHERE trace_id = {trace_id} AND attributes_id IN ({", ".join(map(str, attributes["attributes_id"])) or "NULL"})
    """)
    ids = attributes["attributes_id"]
    if frame.is_empty():  # polars gives an empty lookup the key's type whatever return_dtype says
        return pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                    "startend": pl.Boolean, "name_id": names["name_id"].dtype, "nests": pl.Boolean})

    def look_up(key: str, keys: pl.Series, values: pl.Series) -> pl.Expr:
        return pl.col(key).replace_strict(keys, values, return_dtype=values.dtype).alias(values.name)

    # operators (Kineto's cpu_op ranges, emit_nvtx's op ranges) are not layers: `operators` reads
    # them; but an old Kineto trace records its ProfilerStep#N (and optimizer) ranges as operators
    key = "h" if by_hash else "name"
    ops = names.filter(pl.col("is_op"))[key]
    marks = names.filter(pl.col("is_iter") | pl.col("is_stage") | pl.col("is_optimizer"))[key]
    cpu_op = attributes.filter(pl.col("domain") == "cpu_op")["attributes_id"]
    if not ops.is_empty() or not cpu_op.is_empty():
        frame = frame.filter(~pl.col("key").is_in(ops.implode())
                             & ~(pl.col("attributes_id").is_in(cpu_op.implode()) & ~pl.col("key").is_in(marks.implode())))
    return frame.select(look_up("attributes_id", ids, attributes["pid"]), look_up("attributes_id", ids, attributes["tid"]),
                        "start_ns", "end_ns", look_up("attributes_id", ids, attributes["startend"]),
                        look_up("attributes_id", ids, attributes["nests"]),
                        look_up("key", names["h" if by_hash else "name"], names["name_id"]))


def _may_have_operators(con: duckdb.DuckDBPyConnection, trace_id: int, names: pl.DataFrame) -> bool:
    """Whether the trace records PyTorch's operators: Kineto's (the operators table) or
    emit_nvtx's ranges (a range named like an operator)."""
    if names["is_op"].any():
        return True
    return bool(con.execute("SELECT EXISTS (SELECT 1 FROM nvtx_attributes WHERE trace_id = ? AND domain = 'cpu_op')",
                            [trace_id]).fetchall()[0][0])


def _has_layer_ranges(con: duckdb.DuckDBPyConnection, trace_id: int, candidates: pl.DataFrame) -> bool:
    """Whether the application opened ranges of its own that can be layers (module hooks,
    record_function layers): push/pop or start/end ranges of its domains named neither as an
    iteration, a stage, an optimizer nor an operator."""
    if candidates.is_empty():
        return False
    domains = ", ".join(sql_string(d) for d in APPLICATION_DOMAINS if d != "cpu_op")
    used = sql_frame(con, f"SELECT DISTINCT hash(coalesce(name, '')) AS h FROM nvtx WHERE trace_id = {int(trace_id)} "
                          f"AND kind IN ('pushpop', 'startend') AND (domain IS NULL OR domain IN ({domains}))")
    return not candidates.join(used, on="h").is_empty()


def _split_ranges(
    ranges: pl.DataFrame, names: pl.DataFrame
) -> tuple[dict[tuple[int, int], pl.DataFrame], pl.DataFrame, pl.DataFrame]:
    """`_ranges` in three: the push/pop ranges of each thread (start_ns, end_ns, name_id, in
    table order; empty ones left out), the by-time ranges (pid, tid, kind, name, start_ns,
    end_ns, nm, is_iter, is_stage: iteration, stage and start/end ranges), and the names of
    push/pop ranges that are neither iteration nor stage ranges (nm), for backward layers."""
    flagged = names.filter(pl.col("is_iter") | pl.col("is_stage"))["name_id"]
    by_time_ranges = (ranges.filter(pl.col("startend") | pl.col("name_id").is_in(flagged.implode()))
                      .join(names, on="name_id", how="left")
                      .select("pid", "tid", pl.when(pl.col("startend")).then(pl.lit("startend"))
                              .otherwise(pl.lit("pushpop")).alias("kind"),
                              "name", "start_ns", "end_ns", "nm", "is_iter", "is_stage"))
    # a layer is the application's (or XLA's, or a collective's) range: a tool's or library's own
    # (nsys's GpuMetrics, the TraceMe lines of an XPlane's runtime and Python tracer) encloses no layer
    nested = ranges.lazy().filter(~pl.col("startend") & pl.col("nests")
                                  & (pl.col("end_ns") > pl.col("start_ns")))  # no copy
    used = nested.select(pl.col("name_id").unique()).collect()["name_id"]
    forward_names = (names.filter(~pl.col("is_iter") & ~pl.col("is_stage") & pl.col("name_id").is_in(used.implode()))
                     .select("nm").unique())
    return _by_thread(nested.drop_nulls(["pid", "tid"])), by_time_ranges, forward_names


def _by_thread(ranges: pl.LazyFrame) -> dict[tuple[int, int], pl.DataFrame]:
    """start_ns, end_ns, name_id of `ranges` split by (pid, tid), each in table order. A filter
    per thread when there are few (the least memory), else one group-by."""
    columns = ["start_ns", "end_ns", "name_id"]
    threads = ranges.select("pid", "tid").unique(maintain_order=True).collect()
    if threads.height <= 8:
        return {(pid, tid): ranges.filter((pl.col("pid") == pid) & (pl.col("tid") == tid)).select(columns).collect()
                for pid, tid in threads.iter_rows()}
    groups = ranges.group_by("pid", "tid", maintain_order=True).agg(columns).collect()
    return {(pid, tid): pl.DataFrame({c: groups[c][i] for c in columns})
            for i, (pid, tid) in enumerate(groups.select("pid", "tid").iter_rows())}


def _locate(
    threads: dict[tuple[int, int], pl.DataFrame], points: pl.DataFrame, by_time_ranges: pl.DataFrame,
    names: pl.DataFrame,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Thread by thread: each point's chain (see `nesting.thread_chains`) and its segment.

    A segment is an interval between two consecutive boundaries (starts and ends) of a process's
    by-time ranges, for one thread of it: the same by-time ranges enclose every time of it, and
    the thread decides which of them go into the path prefix. `threads` is consumed.

    Returns (chains, located, segments): chains as from `nesting.thread_chains`, numbered across
    threads; located one row per point (pos, chain of its innermost range or null, segment or
    null); segments one row per segment of a thread with points (id, pid, tid, t = its start).
    """
    bounds = {pid: pl.concat([g["start_ns"], g["end_ns"]]).unique().sort()
              for (pid,), g in by_time_ranges.drop_nulls("pid").partition_by("pid", as_dict=True).items()}
    point_groups = points.partition_by("pid", "tid", as_dict=True, maintain_order=True)

    chains, located, segments = [], [], []
    n_chains = n_segments = 0
    for (pid, tid), pts in point_groups.items():
        chain = segment = pl.repeat(None, pts.height, dtype=pl.Int64, eager=True)
        if (pid, tid) in threads:  # one at a time: in parallel, 15 % faster but 15 % more memory
            part = in_start_order(threads.pop((pid, tid)), names)
            tree, chain = thread_chains(part["start_ns"], part["end_ns"], part["name_id"], pts["t"], names.height)
            del part
            chains.append(tree.with_columns(pl.col("chain", "parent") + n_chains))
            chain = chain + n_chains
            n_chains += tree.height
        if pid in bounds:
            b = bounds[pid]
            segments.append(pl.DataFrame({"id": pl.int_range(n_segments, n_segments + len(b), eager=True),
                                          "pid": pl.repeat(pid, len(b), dtype=pl.Int64, eager=True),
                                          "tid": pl.repeat(tid, len(b), dtype=pl.Int64, eager=True), "t": b}))
            j = b.search_sorted(pts["t"], side="right").cast(pl.Int64) - 1
            segment = null_if_negative(j) + n_segments
            n_segments += len(b)
        located.append(pl.DataFrame({"pos": pts["pos"], "chain": chain, "segment": segment}))
    return (pl.concat(chains) if chains else
            pl.DataFrame(schema={"chain": pl.Int64, "parent": pl.Int64, "name_id": pl.UInt32}),
            pl.concat(located) if located else
            pl.DataFrame(schema={"pos": pl.UInt32, "chain": pl.Int64, "segment": pl.Int64}),
            pl.concat(segments) if segments else
            pl.DataFrame(schema={"id": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "t": pl.Int64}))


def _by_time(
    con: duckdb.DuckDBPyConnection, segments: pl.DataFrame, by_time_ranges: pl.DataFrame
) -> tuple[pl.DataFrame, pl.Series]:
    """What the by-time ranges give each segment (see `_locate`), in the all-SQL form's rules
    with the segment's start as the point, numbered by value. Returns (by_time: context,
    iteration, stage, startend_layer, time_innermost, prefix, one row per distinct context; the
    context of each segment, by segment id)."""
    with registered(con, segments=segments, by_time_ranges=by_time_ranges) as rel, real_asof_joins(con):
        by_time = sql_frame(con, f"""
            WITH pts AS (SELECT * FROM {rel['segments']}),
            by_time_ranges AS (SELECT * FROM {rel['by_time_ranges']}),
            {BY_TIME_CTES}
            SELECT * EXCLUDE (id) FROM by_time ORDER BY id
        """)
    contexts = by_time.unique(maintain_order=True).with_row_index("context")
    context = by_time.join(contexts, on=by_time.columns, how="left", nulls_equal=True, maintain_order="left")
    return contexts, context["context"]


def _contexts(
    con: duckdb.DuckDBPyConnection, names: pl.DataFrame, chains: pl.DataFrame, by_time: pl.DataFrame,
    combos: pl.DataFrame, forward_names: pl.DataFrame, paths: bool,
) -> pl.DataFrame:
    """The result columns for each (chain, by-time context) pair of `combos`, in combo order:
    the all-SQL form's rules, applied to chains (as ranges) instead of ranges."""
    with registered(con, names=names, chains=chains, by_time=by_time, combos=combos,
                     forward_names=forward_names) as rel:
        return sql_frame(con, f"""
            WITH RECURSIVE
            rp AS (SELECT c.chain AS rid, c.parent, n.name, n.nm, n.is_iter, n.is_stage, n.is_backward, n.is_optimizer
                   FROM {rel['chains']} c JOIN {rel['names']} n USING (name_id)),
            {paths_cte(paths)},
            forward_names AS (SELECT nm FROM {rel['forward_names']}),
            joined AS (
                SELECT c.combo AS id,
                       {"coalesce(rp.name, bt.time_innermost)" if paths else "NULL::VARCHAR"} AS innermost,
                       paths.path, paths.autograd_backward, paths.optimizer,
                       coalesce(layer_range.nm, bt.startend_layer) AS layer,
                       bt.iteration, bt.stage, bt.prefix
                FROM {rel['combos']} c
                LEFT JOIN rp ON rp.rid = c.chain
                LEFT JOIN paths ON paths.rid = c.chain
                LEFT JOIN rp layer_range ON layer_range.rid = paths.layer_rid
                LEFT JOIN {rel['by_time']} bt ON bt.context = c.context
            ),
            {result_sql(paths)}
            ORDER BY id
        """).drop("id")
