"""Warm-up: the work a trace records before its steady state, kept out of the iterations.

A trace often begins with what happens once: JIT compilation and the autotuning it runs. XLA
compiles each program and times candidate kernels on the GPU (in `nsys_jax_mlp`, a quarter of
the kernel time is autotuning); torch.compile's Dynamo and Inductor compile during the first
step, whose span is then the compiler's (11.7 s against 15 ms for the next steps). Counted as an
iteration, such a step ruins every per-iteration mean and comparison.

Compilation is read from the ranges the compilers open (`COMPILE_REGEX`), in any domain and on
any thread of the process (XLA autotunes on threads of its own): XLA's `XlaCompile:`,
`XlaPass:`, `XlaEmitLlvmIr:`, ... under nsys, `PjRtCApiClient::CompileAndLoad(...)`,
`backend_compile_and_load`, `CompileToBackendResult` in an XPlane, torch.compile's
`... (dynamo_timed)` ranges and `entire_frame_compile`, `backend_compile`, `inductor_compile`. Then

- work launched while its process compiles belongs to the iteration `warm-up` (and, where no
  range names its layer, to the layer `compile`: XLA's autotuning kernels);
- so does all the work of an iteration during which its process compiled.

`warm-up` is shown where iterations are (`traceq stages` lists it as a row of its own) and left
out of every per-iteration statistic (`conventions.steady`).
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.intervals import last_at_or_before
from traceq.analysis.structure.conventions import WARM_UP
from traceq.analysis.structure.operators import recontext
from traceq.store import registered, sql_frame

COMPILE_LAYER = "compile"
"""The layer of work launched while compiling that no range names (autotuning's own kernels)."""
COMPILE_RULE = "rule: compile"

COMPILE_REGEX = (r"^Xla(Compile|Pass|PassPipeline|EmitLlvmIr|OptimizeLlvmIr|EmitGpuAsm|BufferAssignment"
                 r"|MemoryScheduler|CreateGpuExecutable|Autotun\w*)\b"
                 r"|^(PjRt\w*::Compile\w*|backend_compile_and_load|CompileToBackendResult)\b"
                 r"|\(dynamo_timed\)$|^(entire_frame_compile|backend_compile|inductor_compile)$")
"""Range names that mark compilation: XLA's compiler and autotuner, torch.compile's."""


def either(iteration_regex: str) -> str:
    """One regex for the names of iteration ranges and of compile ranges: a scan of ten million
    ranges evaluates it once a range (as fast as the iteration regex alone), the one that
    matched is told apart on the few that did."""
    return f"(?:{iteration_regex})|(?:{COMPILE_REGEX})"


def compile_intervals(con: duckdb.DuckDBPyConnection, trace_id: int, names: pl.Series) -> pl.DataFrame:
    """pid, start_ns, end_ns: when each process compiled (its compile ranges merged into
    disjoint intervals, in start order), from the trace's distinct range `names`. Empty (and no
    range read) when no name marks compilation."""
    marking = names.filter(names.str.contains(COMPILE_REGEX)).unique()
    if marking.is_empty():
        return merged(pl.DataFrame())
    with registered(con, marking=pl.DataFrame({"name": marking})) as rel:
        ranges = sql_frame(con, f"SELECT pid, start_ns, end_ns FROM nvtx WHERE trace_id = {int(trace_id)} "
                                f"AND kind IN ('pushpop', 'startend') AND pid IS NOT NULL AND end_ns > start_ns "
                                f"AND name IN (SELECT name FROM {rel['marking']})")
    return merged(ranges)


def split_warm(ranges: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    """The rows of one scan by `either` (pid, start_ns, end_ns, is_iter, ...) as (the iteration
    ranges, without is_iter; whether each is the warm-up: its process compiled during it, an
    open iteration counted from its start)."""
    compiling = merged(ranges.filter(~pl.col("is_iter") & pl.col("end_ns").is_not_null()))
    iterations = ranges.filter("is_iter").drop("is_iter")
    ends = iterations["end_ns"].fill_null(iterations["start_ns"])
    return iterations, overlapping(compiling, iterations["pid"], iterations["start_ns"], ends)


def merged(ranges: pl.DataFrame) -> pl.DataFrame:
    """pid, start_ns, end_ns: `ranges` (pid, start_ns, end_ns) merged per process into disjoint
    intervals, in start order."""
    schema = {"pid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64}
    if ranges.is_empty():
        return pl.DataFrame(schema=schema)
    ranges = ranges.select("pid", "start_ns", "end_ns").sort("pid", "start_ns").with_columns(
        before=pl.col("end_ns").cum_max().shift(1).over("pid"))
    return (ranges.with_columns(group=(pl.col("before").is_null() | (pl.col("start_ns") > pl.col("before"))).cum_sum())
            .group_by("pid", "group").agg(pl.col("start_ns").min(), pl.col("end_ns").max())
            .sort("pid", "start_ns").select("pid", "start_ns", "end_ns").cast(schema))


def overlapping(intervals: pl.DataFrame, pid: pl.Series, start: pl.Series, end: pl.Series) -> pl.Series:
    """Whether each span [start, end) of process `pid` overlaps one of its process's `intervals`
    (`merged`): the last interval begun before its end ends after its start."""
    if intervals.is_empty():
        return pl.repeat(False, len(start), eager=True)
    last = last_at_or_before(intervals["pid"], intervals["start_ns"], pid, end - 1)
    return (intervals["end_ns"].gather(last) > start).fill_null(False)


def inside(intervals: pl.DataFrame, pid: pl.Series, time: pl.Series) -> pl.Series:
    """Whether each (pid, time) falls in one of its process's `intervals`."""
    if intervals.is_empty():
        return pl.repeat(False, len(time), eager=True)
    row = last_at_or_before(intervals["pid"], intervals["start_ns"], pid, time)
    return (intervals["end_ns"].gather(row) > time).fill_null(False)


def warm_up(index: pl.Series, contexts: pl.DataFrame, pid: pl.Series, time: pl.Series, intervals: pl.DataFrame,
            iterations: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """`attribution.point_contexts`' (index, contexts) with the warm-up applied (see the module's
    docstring). pid, time: each index entry's process and when it was launched (a replayed
    kernel: when its graph was); intervals: `compile_intervals`; iterations: pid, start_ns,
    end_ns, nm of the iteration ranges."""
    if intervals.is_empty():
        return index, contexts
    compiled = overlapping(intervals, iterations["pid"], iterations["start_ns"], iterations["end_ns"])
    warm = iterations.filter(compiled)["nm"].unique()
    compiling = inside(intervals, pid, time)
    moved = compiling
    if not warm.is_empty():
        moved = moved | contexts["iteration"].is_in(warm.implode()).fill_null(False).gather(index)
    if not moved.any():
        return index, contexts
    pos = pl.int_range(0, len(index), eager=True, dtype=pl.UInt32)
    moved = pl.DataFrame({"pos": pos, "context": index, "compiling": compiling}).filter(moved)
    unplaced = pl.col("compiling") & pl.col("layer").is_null()
    changed = (contexts.with_row_index("context").join(moved, on="context")
               .with_columns(iteration=pl.lit(WARM_UP),
                             layer=pl.when(unplaced).then(pl.lit(COMPILE_LAYER)).otherwise(pl.col("layer")),
                             **({"attribution": pl.when(unplaced).then(pl.lit(COMPILE_RULE))
                                 .otherwise(pl.col("attribution"))} if "attribution" in contexts.columns else {}))
               .select("pos", *contexts.columns))
    return recontext(index, contexts, changed)
