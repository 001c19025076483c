"""JAX and XLA: the structure XLA's own ranges give a trace.

XLA's GPU runtime names what it runs. Under Nsight Systems it opens NVTX ranges in its own
domain (TSL), and the XPlane reader writes the same names from a `jax.profiler` trace:

- `XlaModule:#hlo_module=jit_train_step,program_id=7#` around each execution of a compiled
  program (a `jax.jit` function);
- `Thunk:#name=jit(train_step)/transpose(jvp())/dot_general,hlo_op=custom-call.3,...#` around
  each HLO op it runs: the op (`custom-call.3`, `loop_add_fusion`) and, where JAX recorded it,
  the source op's *name stack*;
- `XlaCompile:`, `XlaPass:`, `XlaEmitLlvmIr:`, ... while it compiles and autotunes
  (`phases` keeps that work out of the iterations).

From those, for a trace with no iteration or layer ranges of its own:

- **iterations** (`module_iterations`): in a process with no iteration range, the executions of
  the program whose executions launched the most kernels, among those executed two or more
  times outside compilation, are the iterations: `jit_train_step 0`, `jit_train_step 1`, ..., each from its
  execution's start to the next one's (the last to its own end). A training loop calls its step
  function once per step, so this is the step; data preparation and initialisation programs run
  once or briefly.
- **layer**: the HLO op of the thunk around the launch (attribution `XLA op`); a launch inside
  an execution but no thunk takes the program's name (`XLA module`).
- **pass** (`op_labels`): JAX writes a differentiated program's structure into the name stack:
  `transpose(jvp(...))` is the backward pass, `jvp(...)` the forward one. In a program with a
  backward pass, an op named in neither is the weight update (optax's); in one without, it is
  forward (inference). An op with no name takes the pass of the op before it on its thread.
  A command buffer (`command_buffer_1`: XLA runs several ops as one CUDA graph) has none: the
  graph's kernels are replayed, and where nsys recorded the graph nodes' creation
  (`--cuda-graph-trace=node`) each kernel takes the op it was captured in (`graphs`, which also
  places the GEMMs cuBLAS captured into child graphs).
"""

from __future__ import annotations

import polars as pl

from traceq.analysis.intervals import last_at_or_before

XLA_DOMAINS = ("TSL", "XLA Ops", "XLA Modules")
"""The range domains XLA's names come in: its own under nsys, the XPlane reader's."""
MODULE_PREFIX = "XlaModule:"
THUNK_PREFIX = "Thunk:"
XLA_OP = "XLA op"
XLA_MODULE = "XLA module"

_MODULE_NAME = r"hlo_module=([^,#]+)"
_HLO_OP = r"hlo_op=([^,#]+)"
_NAME_STACK = r"^Thunk:#name=(.*?),hlo_op="


def module_name(name: pl.Expr) -> pl.Expr:
    """The program an `XlaModule:` range name executes (`jit_train_step`), null for other names."""
    return pl.when(name.str.starts_with(MODULE_PREFIX)).then(name.str.extract(_MODULE_NAME, 1))


def module_iterations(by_time_ranges: pl.DataFrame, ranges: pl.DataFrame, names: pl.DataFrame,
                      in_compile: pl.Series | None, points: pl.DataFrame) -> pl.DataFrame:
    """`by_time_ranges` (as `attribution._split_ranges` gives them) with iteration rows made from
    the executions of each process's main program (see the module's docstring), for the
    processes that have no iteration range. `ranges`: pid, tid, start_ns, end_ns, name_id (every
    domain's); `names`: name_id, name; `in_compile`: per row of `ranges`, whether it began while
    the process compiled (`phases.inside`), or None; `points`: pid, tid, t of the launches
    (a replayed kernel's at its replay), which the main program's executions hold the most of."""
    modules = names.select("name_id", module=module_name(pl.col("name"))).drop_nulls("module")
    if modules.is_empty():
        return by_time_ranges
    have = by_time_ranges.filter(pl.col("is_iter"))["pid"].unique()
    runs = ranges if in_compile is None else ranges.filter(~in_compile)
    runs = (runs.join(modules, on="name_id").filter(~pl.col("pid").is_in(have.implode()) & pl.col("pid").is_not_null())
            .filter(pl.col("end_ns") > pl.col("start_ns")).sort("start_ns"))
    if runs.is_empty():
        return by_time_ranges
    # the launches each execution holds (executions of one thread do not overlap)
    thread = pl.struct("pid", "tid")
    row = last_at_or_before(runs.select(thread.hash()).to_series(), runs["start_ns"],
                            points.select(thread.hash()).to_series(), points["t"])
    held = pl.select(pl.when(points["t"] < runs["end_ns"].gather(row)).then(row)).to_series().drop_nulls()
    runs = runs.with_row_index("row").join(pl.DataFrame({"row": held.cast(pl.UInt32)}).group_by("row").len(),
                                           on="row", how="left").with_columns(pl.col("len").fill_null(0))
    totals = (runs.group_by("pid", "module").agg(n=pl.len(), launches=pl.col("len").sum(),
                                                  total=(pl.col("end_ns") - pl.col("start_ns")).sum())
              .filter(pl.col("n") >= 2)
              .sort("pid", "launches", "total", "module", descending=[False, True, True, False])
              .unique("pid", keep="first"))
    if totals.is_empty():
        return by_time_ranges
    made = (runs.join(totals.select("pid", "module"), on=["pid", "module"]).sort("pid", "start_ns")
            .with_columns(n=pl.int_range(pl.len()).over("pid"), next_start=pl.col("start_ns").shift(-1).over("pid"))
            .select("pid", "tid", kind=pl.lit("pushpop"),
                    name=pl.col("module") + " " + pl.col("n").cast(pl.String),
                    start_ns="start_ns", end_ns=pl.coalesce("next_start", "end_ns"),
                    nm=pl.col("module") + " " + pl.col("n").cast(pl.String),
                    is_iter=pl.lit(True), is_stage=pl.lit(False)))
    return pl.concat([by_time_ranges, made.cast(by_time_ranges.schema)])


def op_labels(ranges: pl.DataFrame, names: pl.DataFrame) -> pl.DataFrame:
    """nm, layer, pass, stage for every thunk name of the trace (empty without thunks): the HLO
    op, and the pass its name stack gives (see the module's docstring), as the stage too (the
    weight update: pass null, stage weight_update)."""
    thunks = names.filter(pl.col("name").str.starts_with(THUNK_PREFIX)).select(
        "name_id", "nm", layer=pl.col("name").str.extract(_HLO_OP, 1), stack=pl.col("name").str.extract(_NAME_STACK, 1))
    if thunks.is_empty():
        return pl.DataFrame(schema={"nm": pl.String, "layer": pl.String, "pass": pl.String, "stage": pl.String})
    stack = pl.col("stack")
    thunks = thunks.with_columns(own=pl.when(stack.str.contains(r"transpose\(")).then(pl.lit("backward"))
                                 .when(stack.str.contains(r"jvp\(")).then(pl.lit("forward"))
                                 .when(stack.is_not_null()).then(pl.lit("neither")))
    training = thunks["own"].eq("backward").any()
    runs = (ranges.join(thunks.select("name_id", "own"), on="name_id").sort("pid", "tid", "start_ns")
            .with_columns(pl.col("own").forward_fill().over("pid", "tid")))
    # an op's pass: the one it has most often where it ran (the same each execution of a program)
    passes = (runs.drop_nulls("own").group_by("name_id", "own").len().sort("len", "own", descending=[True, False])
              .unique("name_id", keep="first").select("name_id", seen="own"))
    # a command buffer (a CUDA graph of several ops) has no pass of its own
    buffer = pl.col("layer").str.starts_with("command_buffer").fill_null(False)
    labelled = thunks.join(passes, on="name_id", how="left").with_columns(
        p=pl.when(~buffer).then(pl.coalesce("own", "seen").replace({"neither": "weight_update" if training
                                                                    else "forward"})))
    return labelled.select(
        "nm", layer=pl.coalesce("layer", pl.col("nm")),
        **{"pass": pl.when(pl.col("p").is_in(["forward", "backward"])).then(pl.col("p"))},
        stage=pl.col("p").fill_null("other"))


def with_xla_ops(index: pl.Series, contexts: pl.DataFrame, labels: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """`attribution.point_contexts`' (index, contexts) with XLA's names read: a context whose
    layer is a thunk's range takes `labels`' layer, pass and stage (attribution XLA_OP); one
    whose layer is a program's execution takes the program's name (XLA_MODULE), no pass."""
    layer = contexts["layer"]
    is_module = layer.str.starts_with(MODULE_PREFIX).fill_null(False)
    is_thunk = layer.str.starts_with(THUNK_PREFIX).fill_null(False)
    if not (is_module.any() or is_thunk.any()):
        return index, contexts
    if "attribution" not in contexts.columns:
        contexts = contexts.with_columns(attribution=pl.lit(None, pl.String))
    found = contexts.with_row_index("row").join(labels.rename({"layer": "op", "pass": "op_pass", "stage": "op_stage"}),
                                                left_on="layer", right_on="nm", how="left", maintain_order="left")
    thunk = pl.col("op").is_not_null()
    module = pl.col("layer").str.starts_with(MODULE_PREFIX).fill_null(False)
    table = found.with_columns(
        layer=pl.when(thunk).then(pl.col("op")).when(module).then(module_name(pl.col("layer")))
        .otherwise(pl.col("layer")),
        **{"pass": pl.when(thunk).then(pl.col("op_pass")).when(module).then(pl.lit(None, pl.String))
           .otherwise(pl.col("pass"))},
        stage=pl.when(thunk & pl.col("stage").is_in(["forward", "other"])).then(pl.col("op_stage"))
        .when(module & (pl.col("stage") == "forward")).then(pl.lit("other")).otherwise(pl.col("stage")),
        attribution=pl.when(thunk).then(pl.lit(XLA_OP)).when(module).then(pl.lit(XLA_MODULE))
        .otherwise(pl.col("attribution")),
    ).select(contexts.columns)
    return deduplicated(index, table)


def deduplicated(index: pl.Series, contexts: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """(index, contexts) with equal context rows merged into their first."""
    keys = contexts.columns
    first = contexts.with_row_index("row").with_columns(
        first=pl.col("row").min().over(pl.struct(keys)))  # nulls group together in a struct
    if (first["first"] == first["row"]).all():
        return index, contexts
    keep = first.filter(pl.col("first") == pl.col("row"))
    renumber = pl.Series(pl.int_range(0, keep.height, eager=True, dtype=index.dtype))
    position = first["first"].replace_strict(keep["row"], renumber, return_dtype=index.dtype)
    return position.gather(index), keep.select(keys)

