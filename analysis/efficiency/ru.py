"""Resource utilization (the method's equations 9 to 11) of every kernel launch in a trace, and
its kernel-time-weighted means per kernel name, layer and library: the `traceq ru` analysis.

RU needs only the launch records: occupancy is computed once per distinct launch shape
(block size, registers, shared memory, carveout, device) with `occupancy.launch_occupancy`, the
calculator that agrees with Nsight Compute, then joined back to the launches. The GPU's limits
come from the trace's own device record (`gpus`), over the compute-capability table.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.analysis.choices import GroupBy
from traceq.analysis.efficiency.cdna import CdnaLimits, amd_device_limits, cdna_occupancy
from traceq.analysis.efficiency.gpu_specs import GpuLimits, limits_for_cc
from traceq.analysis.efficiency.occupancy import launch_occupancy
from traceq.analysis.structure.conventions import ITERATION_REGEX, SUFFIX_REGEX
from traceq.analysis.structure.layers import attributed_kernels, launch_groups
from traceq.errors import MissingDataError

_SHAPE = ["device_id", "block_threads", "registers_per_thread", "smem_static_bytes",
          "smem_dynamic_bytes", "smem_carveout_bytes", "accum_vgprs", "sgprs"]


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
        "SELECT DISTINCT device_id FROM kernel_queues WHERE trace_id = ?", [trace_id]).fetchall()}
    records = {r[0]: r for r in rows}
    _refuse_other_vendors(con, trace_id)
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


def _refuse_other_vendors(con: duckdb.DuckDBPyConnection, trace_id: int) -> None:
    """Occupancy follows CUDA's rules: a trace whose GPUs are not NVIDIA's gets none (never a wrong one)."""
    other = con.execute("SELECT DISTINCT vendor, name FROM gpus WHERE trace_id = ? AND vendor <> 'NVIDIA'",
                        [trace_id]).fetchall()
    if other:
        name = con.execute("SELECT name FROM traces WHERE trace_id = ?", [trace_id]).fetchall()[0][0]
        raise MissingDataError(f"{name} ran on {other[0][1]} ({other[0][0]}): occupancy and RU follow CUDA's "
                               "rules and are computed for NVIDIA GPUs only")


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise MissingDataError(f"{text!r} is not a compute capability like 9.0")
    return int(major), int(minor)


def launch_ru(con: duckdb.DuckDBPyConnection, trace_id: int, *, cc: str | None = None,
              sms: int | None = None, iteration_regex: str = ITERATION_REGEX,
              kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every kernel launch with its occupancy and resource utilization.

    Columns: kernel_id, name, short_name, library, layer, pass, device_id, dur_ns, grid_blocks,
    block_threads, registers_per_thread, smem_static_bytes, smem_dynamic_bytes,
    smem_carveout_bytes, blocks_per_sm (active blocks per SM), limiter (the binding limit(s):
    warps, registers, shared_mem, blocks, barriers, joined with '+'), occupancy (theoretical,
    fraction), max_blocks (SMs x blocks_per_sm), waves, ru (eq. 11, fraction), paper_max_blocks
    (eq. 10: registers only), paper_ru (eq. 11 with eq. 10's maxBlocks), kineto_occupancy
    (Kineto's estimate: as a Kineto trace recorded it, `est. achieved occupancy %`; for other
    traces kineto_emulated), kineto_emulated (ours of Kineto's estimate from the launch shape: no
    opt-in, so 0 for launches over 48 KB of shared memory). Launches with no
    launch-shape record (null block size) have null RU columns. `kernels`: the trace's
    `layers.attributed_kernels` frame when the caller has it already (attribution is the cost).
    """
    limits = _limits(con, trace_id, cc, sms)
    if kernels is None:
        kernels = attributed_kernels(con, trace_id, iteration_regex)
    k = kernels.select("kernel_id", "name", "short_name", "library", "layer", "pass")
    shapes = con.sql(
        f"SELECT kernel_id, dur_ns, grid_blocks, {', '.join(_SHAPE)}, kineto_occupancy_pct FROM kernels "
        f"WHERE trace_id = {int(trace_id)}").pl()
    return (_with_ru(k.join(shapes, on="kernel_id", how="left"), limits)
            .select("kernel_id", "name", "short_name", "library", "layer", "pass", "device_id", "dur_ns",
                    "grid_blocks", "block_threads", "registers_per_thread", "smem_static_bytes",
                    "smem_dynamic_bytes", "smem_carveout_bytes", "blocks_per_sm", "limiter", "occupancy",
                    "max_blocks", "waves", "ru", "paper_max_blocks", "paper_ru", "kineto_occupancy",
                    "kineto_emulated")
            .sort("kernel_id"))


def _limits(con: duckdb.DuckDBPyConnection, trace_id: int, cc: str | None,
            sms: int | None) -> dict[int, tuple[GpuLimits | CdnaLimits, int]]:
    """`device_limits`, or for a trace of AMD GPUs `cdna.amd_device_limits` (`cc` then an ISA
    target such as gfx942, `sms` the CU count)."""
    amd = amd_device_limits(con, trace_id, cc, sms)
    return dict(amd) if amd is not None else dict(device_limits(con, trace_id, cc, sms))


def _shape_occupancy(shapes: pl.DataFrame, limits: dict[int, tuple[GpuLimits | CdnaLimits, int]]) -> pl.DataFrame:
    """Occupancy per distinct launch shape (a few hundred in a real trace, not one per launch)."""
    rows = []
    for shape in shapes.iter_rows(named=True):
        gpu, sms = limits[shape["device_id"]] if shape["device_id"] in limits else next(iter(limits.values()))
        threads, regs = shape["block_threads"], shape["registers_per_thread"]
        if isinstance(gpu, CdnaLimits):
            rows.append(_amd_shape(shape, gpu, sms))
            continue
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


def _amd_shape(shape: dict, gpu: CdnaLimits, cus: int) -> dict:
    """`_shape_occupancy`'s row for a launch on a CDNA GPU: workgroups per CU as blocks_per_sm;
    none where the trace lacks its arch VGPRs or AGPRs (no paper or Kineto estimate: CUDA's)."""
    row = dict(shape, sms=cus, max_threads_per_sm=gpu.waves_per_cu * gpu.wave_size, blocks_per_sm=None,
               limiter=None, occupancy=None, max_blocks=None, paper_max_blocks=None, kineto_blocks=None)
    threads, regs, agprs = shape["block_threads"], shape["registers_per_thread"], shape["accum_vgprs"]
    if threads and regs is not None and agprs is not None:
        occ = cdna_occupancy(threads, regs, agprs, shape["sgprs"], shape["smem_static_bytes"] or 0, gpu)
        row.update(blocks_per_sm=occ.workgroups_per_cu, limiter="+".join(occ.limiting), occupancy=occ.occupancy,
                   max_blocks=cus * occ.workgroups_per_cu or None)
    return row


def _weighted(column: str) -> pl.Expr:
    """Kernel-time-weighted mean of `column` over the launches where it is known."""
    known = pl.col(column).is_not_null()
    weight = pl.when(known).then(pl.col("dur_ns"))
    return ((pl.col(column) * weight).sum() / weight.sum()).alias(column)


def _dominant(column: str, label: str | None = None) -> pl.Expr:
    """The value of `column` at the group's longest launch (the first of them, in kernel order)."""
    return pl.col(column).sort_by("longest_ns", "first_kernel", descending=[True, False]).first().alias(label or column)


_KEYS = {GroupBy.kernel: ["name"], GroupBy.layer: ["layer", "pass"], GroupBy.library: ["library"]}


def ru_table(con: duckdb.DuckDBPyConnection, trace_id: int, by: GroupBy | str = GroupBy.kernel, *,
             cc: str | None = None, sms: int | None = None,
             iteration_regex: str = ITERATION_REGEX, groups: pl.DataFrame | None = None,
             launches: pl.DataFrame | None = None) -> pl.DataFrame:
    """RU and occupancy per kernel name, layer or library, heaviest first (`groups`: the trace's
    `layers.launch_groups`, when the caller has them; `launches`: by kernel, the trace's
    `kernel_launch_groups`, when the caller has them).

    Columns: the keys (name | layer, pass | library), kernels, total_ns, then for `kernel`: the
    launch shape of the group's longest launch (grid_blocks, block_threads, registers_per_thread,
    smem_bytes = static + dynamic), limiter and blocks_per_sm of that shape; for `layer` and
    `library`: library (the dominant one; layer only) and limiter (the dominant one). Then for all:
    occupancy, waves, ru, paper_ru, kineto_occupancy (kernel-time-weighted means; fractions).

    By kernel, and by library where no range of the trace is an operation that decides a
    kernel's library (`classify` [[launcher]] rules), no launch needs its NVTX context, and every
    launch of one name, shape and grid has the same RU: those are aggregated in the store first
    (a few thousand groups for ten million launches) and weighted by their time, which gives
    `launch_ru`'s means. Otherwise the attributed launches come grouped the same way, with
    their library, layer and pass (`layers.launch_groups`, `_attributed_groups`).
    """
    by = GroupBy(by)
    if by is not GroupBy.kernel or groups is not None:
        launches = None  # the kernel launch groups stand for the launches by kernel only
    if launches is None and groups is None and (
            by is GroupBy.kernel or by is GroupBy.library and not _has_launchers(con, trace_id)):
        launches = _launch_groups(con, trace_id, cc=cc, sms=sms, library=by is GroupBy.library)
    elif launches is None:
        if groups is None:
            groups = launch_groups(con, trace_id, iteration_regex)
        launches = _attributed_groups(con, trace_id, groups, cc=cc, sms=sms)
    launches = launches.sort("first_kernel").with_columns(  # in a fixed order: float sums the same every run
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
            .agg(pl.col("instances").sum().cast(pl.Int64).alias("kernels"),
                 pl.col("dur_ns").sum().cast(pl.Int64).alias("total_ns"),
                 *described, *[_weighted(c) for c in means])
            .sort(["total_ns", *keys], descending=[True] + [False] * len(keys), nulls_last=True))


def _has_launchers(con: duckdb.DuckDBPyConnection, trace_id: int) -> bool:
    """Whether some push/pop range of the trace is named by a [[launcher]] rule (RE2 in DuckDB
    takes the rules' plain regexes; the scan stops at the first)."""
    from traceq.analysis.kernels.classify import default_rules

    patterns = [rule.pattern.pattern for rule in default_rules().launchers]
    if not patterns:
        return False
    regex = "|".join(f"(?:{p})" for p in patterns)
    return bool(con.execute(
        "SELECT count(*) FROM (SELECT 1 FROM nvtx WHERE trace_id = ? AND kind = 'pushpop' "
        "AND regexp_matches(regexp_replace(name, ?, ''), ?) LIMIT 1)",
        [int(trace_id), SUFFIX_REGEX, regex]).fetchone()[0])


_SHAPE_SQL = ("c.grid_x::BIGINT * c.grid_y * c.grid_z AS grid_blocks, q.device_id, "
              "c.block_x * c.block_y * c.block_z AS block_threads, c.registers_per_thread, c.smem_static_bytes, "
              "c.smem_dynamic_bytes, c.smem_carveout_bytes, c.accum_vgprs, c.sgprs, c.kineto_occupancy_pct")
"""A launch's grid, shape and Kineto occupancy from its configuration c and queue q, as `_with_ru` takes them."""


def kernel_launch_groups(con: duckdb.DuckDBPyConnection, trace_id: int, *, cc: str | None = None,
                         sms: int | None = None) -> pl.DataFrame:
    """The trace's launches grouped per kernel name, launch shape, grid and device, each group
    with its RU: name, grid_blocks, device_id, block_threads, registers_per_thread,
    smem_static_bytes, smem_dynamic_bytes, smem_carveout_bytes, kineto_occupancy_pct, instances,
    dur_ns (their total), longest_ns, first_kernel, then `_shape_occupancy`'s and `_with_ru`'s
    columns (blocks_per_sm, limiter, occupancy, max_blocks, waves, ru, ...). A kernel name that
    ran with several configurations has a row for each: `ru_table` by kernel sums them into one
    row, `advise` tells them apart."""
    return _launch_groups(con, trace_id, cc=cc, sms=sms, library=False)


def _launch_groups(con: duckdb.DuckDBPyConnection, trace_id: int, *, cc: str | None, sms: int | None,
                   library: bool) -> pl.DataFrame:
    """`launch_ru`'s columns (but layer, pass) for groups of launches with one name, shape and grid:
    instances, dur_ns (their total), longest_ns and first_kernel (the first of the longest)."""
    limits = _limits(con, trace_id, cc, sms)
    t = int(trace_id)
    # by the launches' ids first (name, configuration, queue: ten million rows, no join), then the
    # few groups named and merged by what the columns say
    groups = con.sql(f"""
        SELECT n.name, {_SHAPE_SQL}, sum(g.instances)::BIGINT AS instances, sum(g.dur_ns) AS dur_ns,
               max(g.longest_ns) AS longest_ns, arg_min(g.first_kernel, (-g.longest_ns, g.first_kernel)) AS first_kernel
        FROM (SELECT name_id, config_id, queue_id, count(*) AS instances, sum(end_ns - start_ns) AS dur_ns,
                     max(end_ns - start_ns) AS longest_ns,
                     arg_min(kernel_id, (start_ns - end_ns, kernel_id)) AS first_kernel
              FROM kernel_events WHERE trace_id = {t} GROUP BY ALL) g
        JOIN kernel_names n ON n.trace_id = {t} AND n.name_id = g.name_id
        JOIN kernel_configs c ON c.trace_id = {t} AND c.config_id = g.config_id
        JOIN kernel_queues q ON q.trace_id = {t} AND q.queue_id = g.queue_id
        GROUP BY ALL""").pl()
    if library:
        from traceq.analysis.kernels.classify import classify_names

        classes = classify_names(groups["name"].unique(maintain_order=True)).select("name", "library")
        groups = groups.join(classes, on="name", how="left")
    return _with_ru(groups, limits)


def _attributed_groups(con: duckdb.DuckDBPyConnection, trace_id: int, groups: pl.DataFrame, *,
                       cc: str | None, sms: int | None) -> pl.DataFrame:
    """`_launch_groups` for attributed launches (`groups`: `layers.launch_groups`): one row per
    name, library, layer, pass, configuration and queue, with its shape, grid and RU computed
    once."""
    limits = _limits(con, trace_id, cc, sms)
    t = int(trace_id)
    groups = (groups.sort("longest_ns", "first_kernel", descending=[True, False])  # each group's first: its longest
              .group_by("name", "library", "layer", "pass", "config_id", "queue_id")
              .agg(pl.col("instances").sum(), pl.col("dur_ns").sum(), pl.col("longest_ns", "first_kernel").first()))
    shapes = con.sql(f"""
        SELECT c.config_id, q.queue_id, {_SHAPE_SQL}
        FROM kernel_configs c JOIN kernel_queues q ON q.trace_id = c.trace_id WHERE c.trace_id = {t}""").pl()
    groups = groups.join(shapes.cast({"config_id": groups.schema["config_id"], "queue_id": groups.schema["queue_id"]}),
                         on=["config_id", "queue_id"], how="left")
    return _with_ru(groups.drop("config_id", "queue_id"), limits)


def _with_ru(frame: pl.DataFrame, limits: dict[int, tuple[GpuLimits | CdnaLimits, int]]) -> pl.DataFrame:
    """`frame` (grid_blocks, the `_SHAPE` columns and kineto_occupancy_pct) with `_shape_occupancy`'s
    columns, computed once per distinct shape, and waves, ru, paper_ru, kineto_emulated and
    kineto_occupancy (the recorded estimate where there is one)."""
    occupancy = _shape_occupancy(frame.select(_SHAPE).unique(), limits)
    frame = frame.join(occupancy, on=_SHAPE, how="left", nulls_equal=True)
    grid = pl.col("grid_blocks")
    waves_needed = (grid / pl.col("max_blocks")).ceil()
    paper_waves = (grid / pl.col("paper_max_blocks")).ceil()
    kineto_blocks = pl.min_horizontal(pl.col("kineto_blocks"), grid / pl.col("sms"))
    return frame.with_columns(
        waves=grid / pl.col("max_blocks"),
        ru=grid / (waves_needed * pl.col("max_blocks")),
        paper_ru=pl.when(pl.col("paper_max_blocks") > 0).then(grid / (paper_waves * pl.col("paper_max_blocks"))),
        kineto_emulated=kineto_blocks * pl.col("block_threads") / pl.col("max_threads_per_sm"),
    ).with_columns(kineto_occupancy=pl.coalesce(pl.col("kineto_occupancy_pct") / 100, pl.col("kineto_emulated")))


# --- compute efficiency ----------------------------------------------------------------------
