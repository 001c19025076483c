"""Rules of the findings catalogue that read kernels, API calls, ranges and communication
directly: `exposed_comm`, `layout_transforms`, `allocator_churn`, `recompilation`, and
`is_communication`, which the compute rules of `analysis.advise` use to leave communication
kernels out.

Every rule takes advise's `_Facts` (con, trace_id, iteration_regex, totals, classified) and
returns a list of `Finding`s (none or one); docs/advise.md gives the thresholds and estimates.
"""

from __future__ import annotations

import re

import polars as pl

from traceq.analysis.advice import Finding
from traceq.units import format_duration as _ms

LAYOUT_REGEX = r"(?i)nchwToNhwc|nhwcToNchw|nchw_?to_?nhwc|nhwc_?to_?nchw"
"""Kernel names of layout transforms between NCHW and NHWC (cuDNN's, MIOpen's, PyTorch's)."""

ALLOC_CALLS = ("cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "hipMalloc", "hipFree",
               "cuMemAlloc", "cuMemFree", "cuMemAlloc_v2", "cuMemFree_v2")
"""Allocator calls (nsys's version suffix, `cudaMalloc_v3020`, dropped): a caching allocator makes
them in the first iteration, not in steady state."""

_COMM_REGEX = re.compile(r"^(nccl|rccl|ncclDev)|ncclKernel|ncclDevKernel|rcclKernel|__nccl|msccl", re.IGNORECASE)


def communication(facts: object) -> set[str]:
    """The trace's communication kernel names (by the classification rules, and NCCL/RCCL
    names), computed once per facts."""
    cached = getattr(facts, "_comm_names", None)
    if cached is None:
        from traceq.analysis.multigpu.collectives import communication_names

        cached = set(communication_names(facts.con, facts.trace_id)["name"].to_list())
        names = facts.con.execute("SELECT DISTINCT name FROM kernel_names WHERE trace_id = ?",
                                  [int(facts.trace_id)]).fetchall()
        cached |= {n for (n,) in names if _COMM_REGEX.search(n)}
        facts._comm_names = cached
    return cached


def is_communication(facts: object) -> pl.Expr:
    """True for a row of a frame with a `name` column whose kernel is communication."""
    return pl.col("name").is_in(sorted(communication(facts)))


def exposed_comm(facts: object) -> list[Finding]:
    """Communication the GPU ran with no computation beside it (per device, the time a
    communication kernel ran and no other kernel did), as `traceq overlap` counts it; on a rank of
    a run (`load --run`), less the time it waited inside collectives for later ranks (the
    `straggler` rule's, so the two do not count one wait twice)."""
    names = communication(facts)
    if not names:
        return []
    from traceq.analysis.multigpu.overlap import interval_sums

    kernels = facts.con.sql(f"SELECT device_id, name, start_ns, end_ns FROM kernels "
                            f"WHERE trace_id = {int(facts.trace_id)}").pl()
    work = kernels.with_columns(device_id=pl.col("device_id").fill_null(-1),
                                work=pl.when(pl.col("name").is_in(sorted(names))).then(pl.lit("comm"))
                                .otherwise(pl.lit("compute")))
    sums = interval_sums(work.select("device_id", "work", "start_ns", "end_ns"), ["device_id"])
    comm, overlap = float(sums["comm_ns"].fill_null(0).sum()), float(sums["overlap_ns"].fill_null(0).sum())
    from traceq.analysis.advice.ranks import run_ranks

    found = run_ranks(facts)  # a rank of a run: its wait in collectives for later ranks is `straggler`'s
    waited = float(found[1].filter(pl.col("rank") == found[0])["wait_ns"].sum()) if found else 0.0
    exposed = comm - overlap - min(waited, comm - overlap)
    if exposed <= 0:
        return []
    heavy = (work.filter(pl.col("work") == "comm").group_by("name")
             .agg(n=pl.len(), ns=(pl.col("end_ns") - pl.col("start_ns")).sum()).sort("ns", "name", descending=[True, False]))
    top = ", ".join(f"{_short(r['name'])} x{r['n']} {_ms(r['ns'])}" for r in heavy.head(3).iter_rows(named=True))
    evidence = (f"communication kernels ran {_ms(comm)}, {100 * overlap / comm:.0f} % of it beside computation: "
                f"{_ms(exposed)} exposed, the step waits for it; heaviest: {top}. A communication kernel's time "
                f"includes waiting for the slowest rank: `traceq ranks RUN --by collective` names the rank that "
                f"arrives last" + (f"; this rank's {_ms(waited)} waiting for later ranks left out (`straggler`)"
                                   if waited else ""))
    fix = ("Overlap communication with computation (DDP's gradient buckets: bucket_cap_mb, "
           "gradient_as_bucket_view; FSDP prefetch), make the slowest rank faster (an even load across "
           "ranks), or communicate less (gradient compression, a larger batch per collective)")
    return [Finding("exposed_comm", "Exposed communication: the GPU waits for collectives", exposed, evidence, fix)]


def layout_transforms(facts: object) -> list[Finding]:
    """Kernels that convert tensors between NCHW and NHWC: all their time is at stake, since a
    model kept in one layout end to end needs none of them."""
    kernels = facts.classified.filter(pl.col("name").str.contains(LAYOUT_REGEX))
    if kernels.is_empty():
        return []
    total = float(kernels["total_ns"].sum())
    top = ", ".join(f"{r['label'] or _short(r['name'])} x{r['launches']:,} {_ms(r['total_ns'])}"
                    for r in kernels.sort("total_ns", descending=True).head(3).iter_rows(named=True))
    busy = float(facts.classified["total_ns"].sum())
    evidence = (f"{int(kernels['launches'].sum()):,} layout transforms (NCHW <-> NHWC) took {_ms(total)}, "
                f"{100 * total / max(busy, 1):.1f} % of kernel time; {top}")
    fix = ("Keep one layout end to end: model.to(memory_format=torch.channels_last) and inputs in "
           "channels_last (tensor cores' convolutions want NHWC), so cuDNN does not convert around each layer")
    return [Finding("layout_transforms", "Layout transforms between NCHW and NHWC", total, evidence, fix)]


def allocator_churn(facts: object) -> list[Finding]:
    """cudaMalloc/cudaFree (and their HIP and driver twins) after the first iteration: a caching
    allocator reuses its blocks, so these calls in steady state mean it keeps freeing and
    allocating (fragmentation, empty_cache(), changing shapes). At stake: the calls' host time and
    the GPU idle that the frees' waits for the whole device caused (`traceq idle`'s sync gaps
    whose call is a free: `_freed_idle`)."""
    t = int(facts.trace_id)
    ranges = facts.con.execute(
        "SELECT min(start_ns), count(*) FROM nvtx WHERE trace_id = ? AND end_ns IS NOT NULL "
        "AND kind IN ('pushpop', 'startend') AND regexp_matches(coalesce(name, ''), ?)",
        [t, facts.iteration_regex]).fetchall()[0]
    if not ranges[1] or ranges[1] < 2:
        return []
    second = facts.con.execute(
        "SELECT start_ns FROM nvtx WHERE trace_id = ? AND end_ns IS NOT NULL AND kind IN ('pushpop', 'startend') "
        "AND regexp_matches(coalesce(name, ''), ?) ORDER BY start_ns LIMIT 1 OFFSET 1",
        [t, facts.iteration_regex]).fetchall()[0][0]
    calls = facts.con.execute(
        "SELECT regexp_replace(name, '_v[0-9]+$', '') AS call, count(*), sum(dur_ns) FROM api_calls "
        "WHERE trace_id = ? AND list_contains(?, regexp_replace(name, '_v[0-9]+$', '')) AND start_ns >= ? "
        "GROUP BY call ORDER BY 3 DESC, call", [t, list(ALLOC_CALLS), int(second)]).fetchall()
    if not calls:
        return []
    total = float(sum(c[2] or 0 for c in calls))
    n = sum(c[1] for c in calls)
    drained = _freed_idle(facts)
    total += drained
    evidence = (f"{n:,} allocator calls after the first iteration took {_ms(total)} of host time"
                f" ({_ms(total / max(ranges[1] - 1, 1))} per iteration); "
                + ", ".join(f"{name} x{k:,} {_ms(ns or 0)}" for name, k, ns in calls[:3])
                + f"; the frees' waits for the whole device left the GPU idle {_ms(drained)}")
    fix = ("Let the caching allocator reuse memory: no torch.cuda.empty_cache() in the loop, fixed or bucketed "
           "shapes, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation")
    return [Finding("allocator_churn", "Allocator churn: cudaMalloc/cudaFree in steady state", total, evidence, fix)]


def _freed_idle(facts: object) -> float:
    """The GPU idle time of `traceq idle`'s sync gaps (their echoes included) whose call was an
    allocator call (a free), summed from the gaps themselves (`gaps.gap_frame`; read only when
    the trace has allocator calls in steady state)."""
    from traceq.analysis.timeline.gaps import CAUSES, gap_frame

    gaps, names = gap_frame(facts.con, facts.trace_id, facts.iteration_regex)
    frees = [i for i, name in enumerate(names["api"].to_list()) if name in ALLOC_CALLS]
    total = (gaps.filter((pl.col("cause") == CAUSES.index("sync")) & pl.col("call").is_in(frees))
             .select(pl.col("dur_ns").sum()).collect().item())
    return float(total or 0)


def recompilation(facts: object) -> list[Finding]:
    """JIT compilation after the first iteration (`structure.phases.COMPILE_REGEX`: torch.compile's
    Dynamo and Inductor, XLA's compiler): the first step compiles, a steady one should not. Each
    recompile stalls the step it happens in; at stake, after the second iteration range starts,
    the compile ranges' host time and the GPU idle they caused (`traceq idle`'s Compile gaps),
    their union: overlapping ranges and gaps counted once. Needs two iteration ranges."""
    from traceq.analysis.structure.phases import COMPILE_REGEX, merged

    t = int(facts.trace_id)
    second = facts.con.execute(
        "SELECT start_ns, count(*) OVER () - 1 FROM nvtx WHERE trace_id = ? AND end_ns IS NOT NULL "
        "AND kind IN ('pushpop', 'startend') AND pid IS NOT NULL AND regexp_matches(coalesce(name, ''), ?) "
        "ORDER BY start_ns LIMIT 1 OFFSET 1", [t, facts.iteration_regex]).fetchall()
    if not second:
        return []
    after, later = int(second[0][0]), int(second[0][1])
    ranges = facts.con.sql(
        "SELECT pid, start_ns, end_ns, name FROM nvtx WHERE trace_id = $t AND end_ns > start_ns AND pid IS NOT NULL "
        "AND kind IN ('pushpop', 'startend') AND start_ns >= $after AND regexp_matches(coalesce(name, ''), $names)",
        params={"t": t, "after": after, "names": COMPILE_REGEX}).pl()
    if ranges.is_empty():
        return []
    spans = merged(ranges)
    host = float((spans["end_ns"] - spans["start_ns"]).sum())
    idle = _compile_gaps(facts, after)
    both = merged(pl.concat([spans, idle.select(pid=pl.lit(0, pl.Int64), start_ns="start_ns", end_ns="end_ns")
                             .cast({"start_ns": pl.Int64, "end_ns": pl.Int64})])
                  .with_columns(pid=pl.lit(0, pl.Int64)))
    total = float((both["end_ns"] - both["start_ns"]).sum())
    gpu = float(idle["dur_ns"].sum()) if idle.height else 0.0
    names = ranges.group_by("name").agg(pl.len(), (pl.col("end_ns") - pl.col("start_ns")).sum().alias("ns")) \
        .sort("ns", descending=True)
    evidence = (f"{spans.height:,} compilation(s) after the first iteration took {_ms(host)} of host time: "
                + ", ".join(f"{_short(n)} x{k:,} {_ms(ns)}" for n, k, ns in names.head(3).iter_rows())
                + f"; the GPU sat idle {_ms(gpu)} in {idle.height:,} gaps while its process compiled (`traceq idle`'s "
                f"Compile); at stake, the two together ({_ms(total / max(later, 1))} per iteration after the first)")
    fix = ("Compile once: keep shapes and Python values the compiled code sees fixed (pad or bucket sequence "
           "lengths; torch._dynamo.mark_dynamic for a dimension that must vary; TORCH_LOGS=recompiles names the "
           "guard that failed); in JAX, the same shapes and static arguments to each jitted call")
    return [Finding("recompilation", "Recompilation in steady state", total, evidence, fix)]


def _compile_gaps(facts: object, after: int) -> pl.DataFrame:
    """start_ns, end_ns, dur_ns of `traceq idle`'s Compile gaps starting at or after `after`
    (`gaps.gap_frame`, read only when the trace compiles after its first iteration)."""
    from traceq.analysis.timeline.gaps import CAUSES, gap_frame

    gaps, _ = gap_frame(facts.con, facts.trace_id, facts.iteration_regex)
    return (gaps.filter((pl.col("cause") == CAUSES.index("compile")) & (pl.col("start_ns") >= after))
            .select("start_ns", "end_ns", "dur_ns").collect())


def _short(name: str) -> str:
    """A kernel name without return type, namespaces, templates or arguments."""
    bare = re.sub(r"[<(].*$", "", re.sub(r"^void\s+", "", name)).strip()
    name = bare.rsplit("::", 1)[-1] or name
    return name if len(name) <= 48 else name[:47] + "…"


IDLE_TENSOR_PCT = 50.0
"""Idle tensor cores: a layer's tensor-core kernels kept the tensor pipes busy less than this % of their time."""


def idle_tensor_cores(facts: object) -> list[Finding]:
    """Layers whose tensor-core kernels (convolutions, GEMMs, attention whose names show tensor
    cores) left the tensor pipes idle most of their time, measured by nsys's GPU metrics
    (`efficiency.measured`: Tensor Active over those kernels' time). At stake: their time x the
    idle share (what full pipes would save at most)."""
    from traceq.analysis.efficiency.measured import grouped, has_metrics, kernel_integrals
    from traceq.analysis.structure.layers import attributed_kernels

    if not has_metrics(facts.con, facts.trace_id):
        return []
    integrals = kernel_integrals(facts.con, facts.trace_id)
    if "tensor_active_pct_ns" not in integrals.columns:
        return []
    on_tensor = facts.classified.filter(pl.col("tensor_cores").fill_null(False) & ~is_communication(facts))
    keys = ["layer", "pass"]
    k = attributed_kernels(facts.con, facts.trace_id, facts.iteration_regex).join(
        on_tensor.select("name"), on="name", how="semi")
    if k.is_empty():
        return []
    time = k.group_by(keys).agg(total_ns=pl.col("dur_ns").sum())
    idle = (grouped(k, integrals, keys).join(time, on=keys, how="left", nulls_equal=True)
            .filter(pl.col("tensor_active_pct") < IDLE_TENSOR_PCT)
            .with_columns(stake=pl.col("total_ns") * (1 - pl.col("tensor_active_pct") / 100))
            .sort("stake", "layer", descending=[True, False], nulls_last=True))
    if idle.is_empty():
        return []
    lines = []
    for r in idle.head(3).iter_rows(named=True):
        dram = f", DRAM {r['dram_pct']:.0f} % of peak" if r["dram_pct"] is not None else ""
        lines.append(f"{r['layer'] or '(none)'} ({r['pass'] or 'no pass'}): tensor cores idle "
                     f"{100 - r['tensor_active_pct']:.0f} % of its tensor-core kernels' {_ms(r['total_ns'])} "
                     f"(SM active {r['sm_active_pct']:.0f} %{dram})")
    fix = ("Give the tensor cores more work per launch: larger GEMM/convolution shapes (batch, fused "
           "projections), dimensions in multiples of 8 (16 for FP8), channels_last for convolutions; where DRAM "
           "is near its peak the kernels are memory-bound (`traceq roofline`): fuse the ops around them")
    return [Finding("idle_tensor_cores", "Tensor cores idle in tensor-core kernels (measured)",
                    float(idle["stake"].sum()), "; ".join(lines), fix)]
