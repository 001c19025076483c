"""Iterations where the trace names none: a training loop that records no step ranges still
calls its optimizer once a step, and PyTorch's profiler wraps each call in a range
(`Optimizer.step#SGD.step`). With two or more of those in a process and no iteration range,
each step's work is what ran from the end of the previous optimizer step (the process's first
range for the first) to the end of its own: iterations `step 0`, `step 1`, ... Work after the
last optimizer step belongs to none.
"""

from __future__ import annotations

import polars as pl

STEP_RANGE = "Optimizer.step"
"""The prefix of the optimizer step ranges PyTorch's profiler records."""


def step_iterations(by_time_ranges: pl.DataFrame, ranges: pl.DataFrame, names: pl.DataFrame,
                    first: pl.DataFrame) -> pl.DataFrame:
    """`by_time_ranges` (the rows `attribution._split_ranges` gives) with iteration rows made
    from the optimizer steps of `ranges` (pid, tid, start_ns, end_ns, name_id; `names` their
    names), for the processes that have no iteration range and two or more steps. `first`:
    pid, first_ns, when each process's first work began (the first step's start)."""
    steps_ids = names.filter(pl.col("name").str.starts_with(STEP_RANGE))["name_id"]
    if steps_ids.is_empty():
        return by_time_ranges
    have = by_time_ranges.filter(pl.col("is_iter"))["pid"].unique()
    steps = (ranges.filter(pl.col("name_id").is_in(steps_ids.implode()) & ~pl.col("pid").is_in(have.implode()))
             .sort("pid", "start_ns"))
    counts = steps.group_by("pid").len()
    steps = steps.join(counts.filter(pl.col("len") >= 2).select("pid"), on="pid")
    if steps.is_empty():
        return by_time_ranges
    made = (steps.join(first, on="pid")
            .with_columns(start=pl.col("end_ns").shift(1).over("pid"), n=pl.int_range(pl.len()).over("pid"))
            .select("pid", "tid", kind=pl.lit("pushpop"),
                    name=pl.lit("step ") + pl.col("n").cast(pl.String),
                    start_ns=pl.coalesce("start", "first_ns"), end_ns="end_ns",
                    nm=pl.lit("step ") + pl.col("n").cast(pl.String), is_iter=pl.lit(True), is_stage=pl.lit(False)))
    return pl.concat([by_time_ranges, made.cast(by_time_ranges.schema)])
