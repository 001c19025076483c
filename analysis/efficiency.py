"""Resource utilization (the method's equations 9 to 11) and compute efficiency (equation 8)
of every kernel launch in a trace, and their kernel-time-weighted means per kernel name, layer
and library: the `traceq ru` and `traceq ce` analyses.

RU needs only the launch records: occupancy is computed once per distinct launch shape
(block size, registers, shared memory, carveout, device) with `occupancy.launch_occupancy`, the
calculator that agrees with Nsight Compute, then joined back to the launches. The GPU's limits
come from the trace's own device record (`gpus`), over the compute-capability table.

CE needs FLOPs, which a trace has only when PyTorch recorded the op shapes
(`emit_nvtx(record_shapes=True)`) or the user describes the model in a spec file
(`analysis.flops`). Peaks come from `analysis.peaks`: the paper's 2 x clock x FP32 lanes, and
separately the dense tensor-core peak for the data type; CE is reported against each, labelled.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import duckdb
import polars as pl

from traceq.analysis.attribution import ITERATION_REGEX
from traceq.analysis.gpu_specs import GpuLimits, limits_for_cc
from traceq.analysis.layers import attributed_kernels
from traceq.analysis.occupancy import launch_occupancy
from traceq.errors import MissingDataError


class GroupBy(str, Enum):
    """What `traceq ru` and `traceq ce` group launches by."""

    kernel = "kernel"
    layer = "layer"
    library = "library"


_SHAPE = ["device_id", "block_threads", "registers_per_thread", "smem_static_bytes",
          "smem_dynamic_bytes", "smem_carveout_bytes"]


def device_limits(con: duckdb.DuckDBPyConnection, trace_id: int, cc: str | None = None,
                  sms: int | None = None) -> dict[int, tuple[GpuLimits, int]]:
    """Per device id of the trace: its GpuLimits (the CC table overridden by the trace's own
    device record) and SM count. `cc` ('9.0') and `sms` stand in for what the trace lacks and
    override it. Raises MissingDataError when neither the trace nor the caller gives them."""
    rows = con.execute(
        "SELECT device_id, cc_major, cc_minor, sm_count, max_warps_per_sm, threads_per_warp, "
        "max_blocks_per_sm, max_registers_per_sm, max_registers_per_block, max_smem_per_sm_bytes, "
        "max_smem_per_block_bytes, max_smem_per_block_optin_bytes FROM gpus WHERE trace_id = ?",
        [trace_id]).fetchall()
    devices = {r[0] for r in con.execute(
        "SELECT DISTINCT device_id FROM kernels WHERE trace_id = ?", [trace_id]).fetchall()}
    records = {r[0]: r for r in rows}
    out: dict[int, tuple[GpuLimits, int]] = {}
    for device in sorted(devices, key=lambda d: (d is None, d)):
        rec = records.get(device) or (rows[0] if len(rows) == 1 else None)
        major, minor = _cc(cc) if cc else ((rec[1], rec[2]) if rec and rec[1] is not None else (None, None))
        count = sms or (rec[3] if rec else None)
        if major is None or not count:
            raise MissingDataError(
                f"the trace has no GPU description for device {device}: pass --cc MAJOR.MINOR and --sms N")
        overrides = {}
        if rec and not cc:
            fields = ("max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm", "regs_per_block",
                      "smem_per_sm", "smem_per_block", "smem_per_block_optin")
            values = ((rec[4] or 0) * (rec[5] or 32) or None, rec[6], rec[7], rec[8], rec[9], rec[10], rec[11])
            overrides = {f: v for f, v in zip(fields, values) if v}
        out[device] = (limits_for_cc(major, minor, **overrides), int(count))
    return out


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise MissingDataError(f"{text!r} is not a compute capability like 9.0")
    return int(major), int(minor)


def launch_ru(con: duckdb.DuckDBPyConnection, trace_id: int, *, cc: str | None = None,
              sms: int | None = None, iteration_regex: str = ITERATION_REGEX) -> pl.DataFrame:
    """Every kernel launch with its occupancy and resource utilization.

    Columns: kernel_id, name, short_name, library, layer, pass, device_id, dur_ns, grid_blocks,
    block_threads, registers_per_thread, smem_static_bytes, smem_dynamic_bytes,
    smem_carveout_bytes, blocks_per_sm (active blocks per SM), limiter (the binding limit(s):
    warps, registers, shared_mem, blocks, barriers, joined with '+'), occupancy (theoretical,
    fraction), max_blocks (SMs x blocks_per_sm), waves, ru (eq. 11, fraction), paper_max_blocks
    (eq. 10: registers only), paper_ru (eq. 11 with eq. 10's maxBlocks), kineto_occupancy
    (Kineto's estimate, 0 for launches over 48 KB of shared memory). Launches with no
    launch-shape record (null block size) have null RU columns.
    """
    limits = device_limits(con, trace_id, cc, sms)
    k = attributed_kernels(con, trace_id, iteration_regex).select(
        "kernel_id", "name", "short_name", "library", "layer", "pass")
    shapes = con.sql(
        f"SELECT kernel_id, dur_ns, grid_blocks, {', '.join(_SHAPE)} FROM kernels "
        f"WHERE trace_id = {int(trace_id)}").pl()
    occupancy = _shape_occupancy(shapes.select(_SHAPE).unique(), limits)
    frame = (k.join(shapes, on="kernel_id", how="left")
             .join(occupancy, on=_SHAPE, how="left", nulls_equal=True))
    grid = pl.col("grid_blocks")
    waves_needed = (grid / pl.col("max_blocks")).ceil()
    paper_waves = (grid / pl.col("paper_max_blocks")).ceil()
    kineto_blocks = pl.min_horizontal(pl.col("kineto_blocks"), grid / pl.col("sms"))
    return (frame.with_columns(
                waves=grid / pl.col("max_blocks"),
                ru=grid / (waves_needed * pl.col("max_blocks")),
                paper_ru=pl.when(pl.col("paper_max_blocks") > 0)
                .then(grid / (paper_waves * pl.col("paper_max_blocks"))),
                kineto_occupancy=kineto_blocks * pl.col("block_threads") / pl.col("max_threads_per_sm"))
            .select("kernel_id", "name", "short_name", "library", "layer", "pass", "device_id", "dur_ns",
                    "grid_blocks", "block_threads", "registers_per_thread", "smem_static_bytes",
                    "smem_dynamic_bytes", "smem_carveout_bytes", "blocks_per_sm", "limiter", "occupancy",
                    "max_blocks", "waves", "ru", "paper_max_blocks", "paper_ru", "kineto_occupancy")
            .sort("kernel_id"))


def _shape_occupancy(shapes: pl.DataFrame, limits: dict[int, tuple[GpuLimits, int]]) -> pl.DataFrame:
    """Occupancy per distinct launch shape (a few hundred in a real trace, not one per launch)."""
    rows = []
    for shape in shapes.iter_rows(named=True):
        gpu, sms = limits[shape["device_id"]] if shape["device_id"] in limits else next(iter(limits.values()))
        threads, regs = shape["block_threads"], shape["registers_per_thread"]
        row = dict(shape, sms=sms, max_threads_per_sm=gpu.max_threads_per_sm, blocks_per_sm=None, limiter=None,
                   occupancy=None, max_blocks=None, paper_max_blocks=None, kineto_blocks=None)
        if threads and regs is not None:
            static, dynamic = shape["smem_static_bytes"] or 0, shape["smem_dynamic_bytes"] or 0
            # A launch that ran had the shared memory it asked for: it opted in where it needed to.
            occ = launch_occupancy(threads, regs, gpu, static_smem=static, dynamic_smem=dynamic,
                                   carveout=shape["smem_carveout_bytes"], opt_in=True)
            # Kineto's inputs (notes §5.3): no opt-in, the default carveout, no barrier limit.
            kineto = launch_occupancy(threads, regs, gpu, static_smem=static, dynamic_smem=dynamic,
                                      opt_in=False, barriers=0).active_blocks_per_sm
            row.update(blocks_per_sm=occ.active_blocks_per_sm, limiter="+".join(occ.limiting),
                       occupancy=occ.theoretical_occupancy,
                       max_blocks=sms * occ.active_blocks_per_sm or None,
                       paper_max_blocks=sms * (gpu.regs_per_sm // (threads * regs)) if regs else None,
                       kineto_blocks=kineto)
        rows.append(row)
    schema = {**{c: shapes.schema[c] for c in _SHAPE}, "sms": pl.Int64, "max_threads_per_sm": pl.Int64,
              "blocks_per_sm": pl.Int64, "limiter": pl.String, "occupancy": pl.Float64,
              "max_blocks": pl.Int64, "paper_max_blocks": pl.Int64, "kineto_blocks": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def _weighted(column: str) -> pl.Expr:
    """Kernel-time-weighted mean of `column` over the launches where it is known."""
    known = pl.col(column).is_not_null()
    weight = pl.when(known).then(pl.col("dur_ns"))
    return ((pl.col(column) * weight).sum() / weight.sum()).alias(column)


def _dominant(column: str, label: str | None = None) -> pl.Expr:
    """The value of `column` with the most kernel time in the group."""
    return pl.col(column).sort_by("dur_ns", descending=True).first().alias(label or column)


_KEYS = {GroupBy.kernel: ["name"], GroupBy.layer: ["layer", "pass"], GroupBy.library: ["library"]}


def ru_table(con: duckdb.DuckDBPyConnection, trace_id: int, by: GroupBy | str = GroupBy.kernel, *,
             cc: str | None = None, sms: int | None = None,
             iteration_regex: str = ITERATION_REGEX) -> pl.DataFrame:
    """RU and occupancy per kernel name, layer or library, heaviest first.

    Columns: the keys (name | layer, pass | library), kernels, total_ns, then for `kernel`: the
    launch shape with most time (grid_blocks, block_threads, registers_per_thread, smem_bytes = static + dynamic),
    limiter and blocks_per_sm of that shape; for `layer` and `library`: library (the dominant
    one; layer only) and limiter (the dominant one). Then for all: occupancy,
    waves, ru, paper_ru, kineto_occupancy (kernel-time-weighted means; fractions).
    """
    by = GroupBy(by)
    launches = launch_ru(con, trace_id, cc=cc, sms=sms, iteration_regex=iteration_regex).with_columns(
        smem_bytes=pl.col("smem_static_bytes").fill_null(0) + pl.col("smem_dynamic_bytes").fill_null(0))
    keys = _KEYS[by]
    if by is GroupBy.kernel:
        described = [_dominant(c) for c in ("grid_blocks", "block_threads", "registers_per_thread",
                                            "smem_bytes", "limiter", "blocks_per_sm")]
    elif by is GroupBy.layer:
        described = [_dominant("library"), _dominant("limiter")]
    else:
        described = [_dominant("limiter")]
    means = ["occupancy", "waves", "ru", "paper_ru", "kineto_occupancy"]
    return (launches.group_by(keys)
            .agg(pl.len().cast(pl.Int64).alias("kernels"), pl.col("dur_ns").sum().cast(pl.Int64).alias("total_ns"),
                 *described, *[_weighted(c) for c in means])
            .sort(["total_ns", *keys], descending=[True] + [False] * len(keys), nulls_last=True))
