"""Nsight Compute's measurements beside traceq's theory: the `ncu_` columns `traceq ru`, `ce` and
`traffic` gain when the trace has a report joined (`traceq load --ncu`, table `ncu_metrics`).

Each helper takes the command's frame and returns it with its columns added, or unchanged when
the trace has no ncu data (the columns are then absent, not null). A column whose metric the
report lacks is left out too. Means are kernel-time-weighted (by the trace's own durations) over
the launches with a measurement; `ncu_kernels`/`ncu_launches` say how many those were.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.efficiency.ncu import has_ncu


def ncu_launches(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame | None:
    """The trace's measured launches: kernel_id, dur_ns (the trace's), matched_by and the
    ncu_metrics columns; None when the trace has no ncu data."""
    if not has_ncu(con, trace_id):
        return None
    return con.sql(f"""
        SELECT m.* EXCLUDE (trace_id, ncu_id), k.end_ns - k.start_ns AS dur_ns
        FROM ncu_metrics m JOIN kernel_events k ON k.trace_id = m.trace_id AND k.kernel_id = m.kernel_id
        WHERE m.trace_id = {int(trace_id)}""").pl()


def _weighted(column: str, label: str, scale: float = 1.0) -> pl.Expr:
    known = pl.col(column).is_not_null()
    weight = pl.when(known).then(pl.col("dur_ns"))
    return (pl.when(weight.sum() > 0).then((pl.col(column) * weight).sum() / weight.sum() * scale)
            .alias(label))


def _beside(frame: pl.DataFrame, measured: pl.DataFrame, kernels: pl.DataFrame, keys: list[str],
            columns: dict[str, pl.Expr], count: str) -> pl.DataFrame:
    """`frame` with `columns` (aggregations of `measured` joined to `kernels` per `keys`) and the
    count of measured launches (`count`), for the metrics the report had."""
    present = {label: expr for label, expr in columns.items()
               if measured[_source(label)].is_not_null().any()}
    if not present:
        return frame
    joined = measured.join(kernels.select("kernel_id", *keys), on="kernel_id", how="inner")
    per_group = joined.group_by(keys).agg(pl.len().cast(pl.Int64).alias(count), *present.values())
    keys_dtype = {k: frame.schema[k] for k in keys}
    out = frame.join(per_group.cast(keys_dtype), on=keys, how="left", nulls_equal=True)
    return out.with_columns(pl.col(count).fill_null(0))


_SOURCES = {"ncu_occupancy_pct": "achieved_occupancy_pct", "ncu_sm_pct": "sm_throughput_pct",
            "ncu_tensor_pct": "tensor_pipe_pct", "ncu_dram_bytes": "dram_read_bytes", "ncu_l2_bytes": "l2_bytes"}


def _source(label: str) -> str:
    return _SOURCES[label]


def ncu_ru_columns(con: duckdb.DuckDBPyConnection, trace_id: int, frame: pl.DataFrame, keys: list[str],
                   kernels: pl.DataFrame) -> pl.DataFrame:
    """`traceq ru`'s frame (grouped by `keys`: name | layer, pass | library) with ncu_kernels
    (measured launches) and ncu_occupancy_pct (achieved occupancy, sm__warps_active over the
    peak, %) beside `occupancy` (theoretical). `kernels`: kernel_id and the keys per launch."""
    measured = ncu_launches(con, trace_id)
    if measured is None:
        return frame
    return _beside(frame, measured, kernels, keys,
                   {"ncu_occupancy_pct": _weighted("achieved_occupancy_pct", "ncu_occupancy_pct")}, "ncu_kernels")


def ncu_ce_columns(con: duckdb.DuckDBPyConnection, trace_id: int, frame: pl.DataFrame, keys: list[str],
                   kernels: pl.DataFrame) -> pl.DataFrame:
    """`traceq ce`'s frame with ncu_kernels, ncu_sm_pct (SM throughput, % of peak) and
    ncu_tensor_pct (tensor pipe active, % of peak) beside `ce`. `kernels`: kernel_id and the keys
    per launch (`kernel_ce`'s frame)."""
    measured = ncu_launches(con, trace_id)
    if measured is None:
        return frame
    return _beside(frame, measured, kernels.filter(pl.col("kernel_id").is_not_null()), keys,
                   {"ncu_sm_pct": _weighted("sm_throughput_pct", "ncu_sm_pct"),
                    "ncu_tensor_pct": _weighted("tensor_pipe_pct", "ncu_tensor_pct")}, "ncu_kernels")


def ncu_traffic_columns(con: duckdb.DuckDBPyConnection, trace_id: int, frame: pl.DataFrame,
                        launches: pl.DataFrame, by_kernel: bool) -> pl.DataFrame:
    """`traceq traffic`'s frame with ncu_launches (measured launches), ncu_dram_bytes (DRAM
    bytes read + written) and ncu_l2_bytes (L2 bytes, lts__t_bytes) beside the model's
    dram_bytes and l2_bytes: by kernel per launch (the mean of the measured ones), by layer
    for the group's launches (that mean times its launches). `launches`: `launch_traffic`'s."""
    measured = ncu_launches(con, trace_id)
    if measured is None:
        return frame
    measured = measured.with_columns(
        dram=pl.col("dram_read_bytes") + pl.col("dram_write_bytes"))
    keys = ["name", "layer", "pass", "m", "n", "k"] if by_kernel else ["layer", "pass", "m", "n", "k"]
    if not by_kernel:
        launches = launches.filter(pl.col("predicted_ns").is_not_null())
    columns = {"ncu_dram_bytes": pl.col("dram").mean().alias("ncu_dram_bytes"),
               "ncu_l2_bytes": pl.col("l2_bytes").mean().alias("ncu_l2_bytes")}
    out = _beside(frame, measured, launches, keys, columns, "ncu_launches")
    if not by_kernel:
        out = out.with_columns(pl.col(c) * pl.col("launches") for c in columns if c in out.columns)
    return out


__all__ = ["ncu_ce_columns", "ncu_launches", "ncu_ru_columns", "ncu_traffic_columns"]
