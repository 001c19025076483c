"""`traceq whatif --gpu NAME`: each kernel's time on another GPU from its roofline position on
the recorded one.

A kernel with FLOPs and bytes (`efficiency.roofline`: the recorded shapes, the DeLTA model for
convolutions) has a roof time on each GPU, T = max(FLOPs / peak of its precision, bytes / DRAM
bandwidth). The share of its measured time that the roof explains, f = min(T_here / t, 1),
moves with the roof (x T_there / T_here: the peak ratio for a compute-bound kernel, the DRAM
ratio for a memory-bound one, either where it crosses the ridge); the rest (launch ramp and
tail, latency, caches, a library's inefficiency) moves with the SM clock:

    t_there = t x (f x T_there / T_here + (1 - f) x clock_here / clock_there)

so a kernel at its roof scales fully, a small latency-bound kernel (f near 0) only by the clock.
A kernel without shapes takes f and the roof ratio of the kernels of its name that have them
(the same kernel of another step); else its class decides the roof: kernels under `SMALL_NS`
latency-bound (f = 0), GEMM, convolution and attention kernels compute-bound, the rest
memory-bound, with the time-weighted f of the trace's placed kernels of that bound (1 where
none is placed).
Device-to-device copies move with DRAM; host-device copies, collectives (the product table has
no interconnect bandwidths) and host time do not.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceq.errors import MissingDataError, TraceqError

SMALL_NS = 5_000
"""A kernel without shapes shorter than this is taken as latency-bound (its launch ramp and
tail, a few µs on any GPU, are most of it)."""

COMPUTE_CLASSES = ("gemm", "convolution", "attention")
"""Kernel operations taken as compute-bound when no shapes place them on the roofline."""

BOUNDS = ("compute", "memory", "latency")
"""What bounds a kernel, in the order the assumptions list them."""


def kernel_roofs(con: duckdb.DuckDBPyConnection, trace_id: int) -> pl.DataFrame:
    """Every kernel with FLOPs or bytes (`efficiency.roofline`): device, start_ns, end_ns (the
    graph's keys), flops, bytes, roof_precision; empty where the trace has no shapes."""
    from traceq.analysis.efficiency.ce import kernel_ce
    from traceq.analysis.efficiency.roofline import kernel_bytes, kernel_roofline
    from traceq.analysis.efficiency.traffic import launch_traffic

    empty = pl.DataFrame(schema={"device": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "flops": pl.Float64,
                                 "bytes": pl.Float64, "roof_precision": pl.String})
    t = int(trace_id)
    try:
        per_kernel = kernel_ce(con, t)
    except MissingDataError:
        return empty
    try:
        model = launch_traffic(con, t).select("kernel_id", "dram_bytes")
    except MissingDataError:
        model = pl.DataFrame(schema={"kernel_id": pl.Int64, "dram_bytes": pl.Float64})
    k = kernel_roofline(per_kernel, model, kernel_bytes(con, t)).filter((pl.col("flops") > 0) | (pl.col("bytes") > 0))
    if k.is_empty():
        return empty
    keys = con.sql(f"""SELECT e.kernel_id::BIGINT AS kernel_id, q.device_id::BIGINT AS device,
                              e.start_ns, e.end_ns
                       FROM kernel_events e JOIN kernel_queues q ON q.trace_id = {t} AND q.queue_id = e.queue_id
                       WHERE e.trace_id = {t}""").pl()
    return (k.select(pl.col("kernel_id").cast(pl.Int64), pl.col("flops").cast(pl.Float64),
                     pl.col("bytes").cast(pl.Float64), roof_precision=pl.col("precision"))
            .join(keys, on="kernel_id").select(empty.columns).unique(["device", "start_ns", "end_ns"]))


def rescale(nodes: pl.DataFrame, dur: pl.Series, roofs: pl.DataFrame | None, here, there,
            precision: str | None = None) -> tuple[pl.Series, list[str]]:
    """Durations `dur` of the graph's `nodes` on GPU `there` (`gpu_products.GpuProduct`) from the
    trace's GPU `here`, `roofs` (`kernel_roofs`) placing kernels on the roofline; `precision`:
    the GEMM and convolution kernels' precision after a `--precision` change. (durations, assumptions)."""
    from traceq.analysis.efficiency.peaks import peak_flops

    def peaks(gpu, names: list[str]) -> dict[str, float | None]:
        return {p: peak_flops(*gpu.cc, gpu.sm_count, gpu.clock_hz, p) for p in names}

    kernel = nodes["kind"] == 1
    frame = nodes.select("kind", "name", "operation", "precision", "library", "start_ns", "end_ns",
                         device=pl.col("device").cast(pl.Int64)).with_columns(dur=dur)
    if roofs is None or roofs.is_empty():  # no shapes (or a run: its ranks are on the run's clock)
        frame = frame.with_columns(flops=pl.lit(None, pl.Float64), bytes=pl.lit(None, pl.Float64),
                                   roof_precision=pl.lit(None, pl.String))
    else:
        frame = frame.join(roofs, on=["device", "start_ns", "end_ns"], how="left", maintain_order="left")
    changed = pl.col("operation").is_in(["gemm", "convolution"]) & pl.lit(precision is not None)
    own = pl.when(changed).then(pl.lit(precision)).otherwise(pl.coalesce(
        pl.col("roof_precision"), pl.col("precision").replace("", None), pl.lit("fp32")))
    frame = frame.with_columns(p=pl.when(kernel).then(own))
    used = [p for p in frame["p"].drop_nulls().unique().sort().to_list()]
    before, after = peaks(here, used), peaks(there, used)
    missing = [p for p in used if not after.get(p) and frame.filter((pl.col("p") == p)
                                                                    & pl.col("operation").is_in(COMPUTE_CLASSES)).height]
    if missing:
        raise TraceqError(f"no dense {missing[0]} peak for {there.name} in traceq's peak table")
    nan = float("nan")
    pa = pl.col("p").replace_strict(before, default=None, return_dtype=pl.Float64).fill_null(nan)
    pb = pl.col("p").replace_strict(after, default=None, return_dtype=pl.Float64).fill_null(nan)
    fa, fb = (pl.col("flops").fill_null(0.0) / pa * 1e9).fill_nan(0.0), (pl.col("flops").fill_null(0.0) / pb * 1e9).fill_nan(0.0)
    ba = pl.col("bytes").fill_null(0.0) / here.dram_bytes_per_s * 1e9
    bb = pl.col("bytes").fill_null(0.0) / there.dram_bytes_per_s * 1e9
    frame = frame.with_columns(ta=pl.max_horizontal(fa, ba), tb=pl.max_horizontal(fb, bb), compute=fa >= ba)
    placed = kernel & (frame["ta"] > 0) & (frame["dur"] > 0)
    frame = frame.with_columns(placed=placed).with_columns(
        f=pl.when("placed").then(pl.min_horizontal(pl.col("ta") / pl.col("dur"), 1.0)),
        r=pl.when("placed").then(pl.col("tb") / pl.col("ta")),
        bound=pl.when("placed").then(pl.when("compute").then(pl.lit("compute")).otherwise(pl.lit("memory"))))
    # a kernel without shapes: its name's placed kernels (median share and ratio, most common bound)
    by_name = (frame.filter("placed").group_by("name")
               .agg(nf=pl.col("f").median(), nr=pl.col("r").median(), nb=pl.col("bound").mode().first()))
    frame = frame.join(by_name, on="name", how="left", maintain_order="left")
    borrowed = kernel & ~frame["placed"] & frame["nf"].is_not_null()
    dram = here.dram_bytes_per_s / there.dram_bytes_per_s
    clock = here.clock_hz / there.clock_hz
    compute_class = pl.col("operation").is_in(COMPUTE_CLASSES).fill_null(False)
    fallback = pl.when(pl.col("dur") < SMALL_NS).then(pl.lit("latency")).when(compute_class).then(pl.lit("compute"))
    # a kernel of neither: the time-weighted roof share of the trace's placed kernels of its bound (1 without)
    share = {b: s for b, s in frame.filter("placed").group_by("bound").agg(
        s=(pl.col("f") * pl.col("dur")).sum() / pl.col("dur").sum()).iter_rows()}
    guess = fallback.otherwise(pl.lit("memory"))
    frame = frame.with_columns(borrowed=borrowed).with_columns(
        f=pl.when("placed").then("f").when("borrowed").then("nf")
        .when(kernel).then(pl.when(guess == "latency").then(0.0).when(guess == "compute")
                           .then(share.get("compute", 1.0)).otherwise(share.get("memory", 1.0))),
        r=pl.when("placed").then("r").when("borrowed").then("nr")
        .when(kernel).then(pl.when(compute_class).then(pa / pb).otherwise(dram)),
        bound=pl.when("placed").then("bound").when("borrowed").then("nb").when(kernel).then(guess))
    frame = frame.with_columns(new=pl.col("dur") * (pl.col("f") * pl.col("r") + (1 - pl.col("f")) * clock))
    copies = (nodes["kind"] == 2) & nodes["name"].fill_null("").str.contains("Device-to-Device")
    collective = kernel & (nodes["library"] == "NCCL").fill_null(False)
    scaled = (pl.select(pl.when(kernel & ~collective).then(frame["new"]).when(copies).then(dur * dram).otherwise(dur))
              .to_series().fill_nan(None).fill_null(dur))
    return scaled, _notes(frame.filter(kernel & ~collective), here, there, before, after, dram, clock, int(copies.sum()),
                          int(collective.sum()))


def _notes(k: pl.DataFrame, here, there, before: dict, after: dict, dram: float, clock: float, copies: int,
           collectives: int) -> list[str]:
    """One line per kind of kernel and what moved it."""
    from traceq.units import format_duration

    ratios = ", ".join(f"{p} x{(before[p] or 0) / after[p]:.3g}" for p in sorted(before) if after.get(p) and before[p])
    lines = [(f"on {there.name} from {here.name}: a kernel's time at its roof moves with the roof (peak {ratios}; "
              f"DRAM {here.dram_bytes_per_s / 1e12:.2f} -> {there.dram_bytes_per_s / 1e12:.2f} TB/s: x{dram:.3g}), "
              f"the rest with the SM clock (x{clock:.3g})")]
    source = (pl.when("placed").then(pl.lit("by shapes")).when("borrowed").then(pl.lit("by name"))
              .otherwise(pl.lit("by class")))
    k = k.with_columns(source=source)
    per = (k.group_by("bound").agg(n=pl.len(), old=pl.col("dur").sum(), new=pl.col("new").sum(),
                                   at_roof=(pl.col("f") * pl.col("dur")).sum() / pl.col("dur").sum().clip(1))
           .sort(pl.col("bound").replace_strict(BOUNDS, range(3), return_dtype=pl.Int64)))
    counts = k.group_by("bound", "source").len().sort("source")
    for bound, n, old, new, at_roof in per.iter_rows():
        how = ", ".join(f"{c} {w}" for w, c in counts.filter(pl.col("bound") == bound).select("source", "len").iter_rows())
        lines.append(f"{bound}-bound: {n} kernels ({how}), {100 * at_roof:.0f} % of their time at the roof: "
                     f"{format_duration(old)} -> {format_duration(new)}")
    if copies:
        lines.append(f"{copies} device-to-device copies with DRAM: x{dram:.3g}")
    lines.append("host time and host-device copies unchanged" + (
        f"; {collectives} collective kernels unchanged (the product table has no interconnect bandwidths)"
        if collectives else ""))
    return lines
