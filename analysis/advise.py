"""What to change first: ranked findings, each with the GPU time at stake, the evidence and the
usual fix (the `traceq advise` analysis, and the first section of `traceq report`).

Each rule reads other analyses (`idle`, `launches`, `classify`, `efficiency`) and reports a
finding when its time at stake reaches MIN_SHARE of the devices' span and its own condition
holds (docs/advise.md gives every rule, threshold and estimate). Times at stake are upper
bounds of what the fix could save, each estimated its own way, so findings can overlap (a
launch-bound step and its tiny kernels are two views of one cost); they rank the findings, they
do not add up.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import duckdb
import polars as pl

from traceq.analysis.advice import Finding
from traceq.analysis.advice.catalogue import (
    allocator_churn,
    exposed_comm,
    idle_tensor_cores,
    is_communication,
    layout_transforms,
    recompilation,
)
from traceq.analysis.advice.coalescing import uncoalesced_access
from traceq.analysis.advice.ranks import load_imbalance, straggler
from traceq.analysis.structure.conventions import ITERATION_REGEX
from traceq.analysis.timeline.gaps import CAUSE_LABELS
from traceq.analysis.timeline.idle import IdleTotals, idle_causes
from traceq.analysis.timeline.launches import launch_table, repeated_launches
from traceq.errors import TraceqError
from traceq.store import side_by_side

MIN_SHARE = 0.01
"""A finding is reported when its time at stake is at least this share of the devices' span."""

TINY_SHARE = 0.5
"""Tiny-kernel storm: at least this share of the launches ran shorter than their launch call."""

TRANSPOSED_RATIO = 1.5
"""Transposed GEMM: at least this many times slower per launch than the layer's `nn` GEMM."""

LOW_RU = 0.5
"""Low RU: a kernel's time-weighted resource utilization below this."""

TF32_CC = (8, 0)
"""TF32 tensor cores from this compute capability on (FP16 ones from 7.0)."""


@dataclass
class _Facts:
    """What several rules read, computed once. The idle analysis is set when it is done; the
    rest `prefetch` reads beside it."""

    con: duckdb.DuckDBPyConnection
    trace_id: int
    iteration_regex: str
    launches: tuple[pl.DataFrame, dict[str, float]] | None  # launches.launch_table, if the caller had it
    idle: pl.DataFrame = field(default_factory=pl.DataFrame)
    totals: IdleTotals = IdleTotals(0, 0, 0, 0)

    @cached_property
    def launch_table(self) -> tuple[pl.DataFrame, dict[str, float]]:
        return self.launches or launch_table(self.con, self.trace_id)

    @cached_property
    def classified(self) -> pl.DataFrame:
        """`_classified`, which four rules read: computed once."""
        return _classified(self)

    @cached_property
    def peaks(self) -> pl.DataFrame:
        from traceq.analysis.efficiency.peaks import trace_peaks

        return trace_peaks(self.con, self.trace_id)

    @cached_property
    def ru_launches(self) -> pl.DataFrame:
        """`ru.kernel_launch_groups`: each kernel name's launch configurations with their RU."""
        from traceq.analysis.efficiency.ru import kernel_launch_groups

        return kernel_launch_groups(self.con, self.trace_id)

    @cached_property
    def ru(self) -> pl.DataFrame:
        from traceq.analysis.efficiency.ru import ru_table

        return ru_table(self.con, self.trace_id, "kernel", iteration_regex=self.iteration_regex,
                        launches=self.ru_launches)

    @cached_property
    def gemm_layers(self) -> tuple[pl.DataFrame, int]:
        return _gemm_layers(self)

    def prefetch(self, con: duckdb.DuckDBPyConnection) -> None:
        """Read what the rules other than the idle ones need, on `con` (a connection of its own,
        on another thread), then give the facts their connection back. A failure is left for the
        rule that reads the fact to meet again, on the calling thread."""
        own, self.con = self.con, con
        try:
            for fact in ("launch_table", "classified", "peaks", "ru_launches", "ru", "gemm_layers"):
                try:
                    getattr(self, fact)
                except Exception:  # noqa: BLE001 (raised again where the rule reads it)
                    pass
        finally:
            self.con = own


def advise(con: duckdb.DuckDBPyConnection, trace_id: int, iteration_regex: str = ITERATION_REGEX,
           idle: tuple[pl.DataFrame, IdleTotals] | Callable[[], tuple[pl.DataFrame, IdleTotals]] | None = None,
           launches: tuple[pl.DataFrame, dict[str, float]] | None = None) -> tuple[pl.DataFrame, IdleTotals]:
    """The trace's findings, most time at stake first, and its idle totals.

    Columns: rank, title, time_ns (GPU time at stake: what the fix could save at most), pct
    (time_ns as a share of the devices' span, %), evidence, fix, rule (the rule's id, one of
    RULES). `idle`, `launches`: the trace's `idle.idle_causes` and `launches.launch_table`, when
    the caller has them already; `idle` may be a function that gives them. The idle analysis
    runs on this thread and `con` while another thread reads the other rules' facts through a
    cursor of its own (`store.side_by_side`, `_Facts.prefetch`): at ten million kernels the two
    take about as long, mostly inside Polars and DuckDB, which release the GIL.
    """
    facts = _Facts(con, trace_id, iteration_regex, launches)

    def read_idle(_: duckdb.DuckDBPyConnection) -> tuple[pl.DataFrame, IdleTotals]:
        if idle is None:
            return idle_causes(con, trace_id, iteration_regex)
        return idle() if callable(idle) else idle

    (facts.idle, facts.totals), _ = side_by_side(con, read_idle, facts.prefetch)
    totals = facts.totals
    found = [f for rule in RULES.values() for f in rule(facts)
             if f.time_ns >= MIN_SHARE * max(totals.span_ns, 1)]
    found.sort(key=lambda f: (-f.time_ns, f.rule))
    frame = pl.DataFrame({"title": [f.title for f in found], "time_ns": [int(f.time_ns) for f in found],
                          "evidence": [f.evidence for f in found], "fix": [f.fix for f in found],
                          "rule": [f.rule for f in found]},
                         schema={"title": pl.String, "time_ns": pl.Int64, "evidence": pl.String, "fix": pl.String,
                                 "rule": pl.String})
    return (frame.with_row_index("rank", offset=1).with_columns(pl.col("rank").cast(pl.Int64),
                                                               pct=100.0 * pl.col("time_ns") / max(totals.span_ns, 1))
            .select("rank", "title", "time_ns", "pct", "evidence", "fix", "rule"), totals)


def _ms(ns: float) -> str:
    from traceq.units import format_duration

    return format_duration(ns)


def _per_iteration(facts: _Facts, value: float) -> str:
    n = facts.totals.iterations
    return f" ({_ms(value / n)} per iteration)" if n else ""


def _cause(facts: _Facts, cause: str) -> dict[str, object]:
    """The `traceq idle` row of `cause` (an identifier of `gaps.CAUSES`; the row says its label)."""
    return facts.idle.filter(pl.col("cause") == CAUSE_LABELS[cause]).row(0, named=True)


def _first(shares: str | None, n: int = 3) -> str:
    """The first `n` items of an idle shares list, then '+N' for the rest (as tables cut lists)."""
    items = (shares or "").split(", ")
    return ", ".join(items[:n]) + (f" +{len(items) - n}" if len(items) > n else "")


def _idle_rule(cause: str, title: str, fix: str) -> Callable[[_Facts], list[Finding]]:
    """A finding of the GPU's idle time of one cause (`analysis.timeline.gaps.CAUSES`)."""
    def rule(facts: _Facts) -> list[Finding]:
        row = _cause(facts, cause)
        if not row["gaps"]:
            return []
        spread = (f", the longest {_ms(row['longest_ns'])}" if cause == "iteration_start"
                  else f" ({_ms(row['per_iteration_ns'])} per steady iteration)" if row["per_iteration_ns"] else "")
        evidence = (f"{row['gaps']:,} GPU gaps, {_ms(row['total_ns'])} idle{spread}; "
                    f"calls: {_first(row['call_shares'])}; the work that waited: {_first(row['work_shares'])}")
        return [Finding(cause, title, row["total_ns"], evidence, fix)]
    return rule


def _pageable(facts: _Facts) -> list[Finding]:
    """Copies from pageable memory: the idle they caused (`h2d_pageable`) and the copies' own
    time that no kernel of their device overlapped (a pageable copy is staged by the host and
    blocks it; pinned and issued ahead it would run beside the work), with every pageable copy
    of the trace as evidence."""
    row = _cause(facts, "h2d_pageable")
    copies = facts.con.execute("""
        WITH c AS (SELECT row_number() OVER () AS memop_id, device_id, start_ns, end_ns, bytes FROM memops
                   WHERE trace_id = ?
                   AND op = 'memcpy' AND (src_kind = 'Pageable' OR dst_kind = 'Pageable')),
             o AS (SELECT c.memop_id, sum(least(k.end_ns, c.end_ns) - greatest(k.start_ns, c.start_ns)) AS ns
                   FROM c JOIN kernels k ON k.trace_id = ? AND k.device_id IS NOT DISTINCT FROM c.device_id
                    AND k.start_ns < c.end_ns AND k.end_ns > c.start_ns GROUP BY c.memop_id)
        SELECT count(*), coalesce(sum(bytes), 0), coalesce(sum(end_ns - start_ns), 0),
               coalesce(sum(greatest(end_ns - start_ns - coalesce(o.ns, 0), 0)), 0)
        FROM c LEFT JOIN o USING (memop_id)""", [facts.trace_id, facts.trace_id]).fetchall()[0]
    if not copies[0] or not (row["gaps"] or copies[3]):
        return []
    from traceq.units import format_bytes

    stake = row["total_ns"] + copies[3]
    evidence = (f"{copies[0]:,} copies to or from pageable host memory ({format_bytes(copies[1])}, "
                f"{_ms(copies[2])} of copying, {_ms(copies[3])} of it with no kernel beside it); the GPU waited "
                f"{_ms(row['total_ns'])} for them in {row['gaps']:,} gaps; at stake{_per_iteration(facts, stake)}: "
                f"both; calls: {_first(row['call_shares'])}")
    fix = ("Pin the host buffers (DataLoader(pin_memory=True), tensor.pin_memory()) and copy with "
           ".to(device, non_blocking=True) ahead of use: pinned copies run on the copy engine beside the "
           "kernels without blocking the host")
    return [Finding("pageable_copies", "Copies from pageable memory", stake, evidence, fix)]


def _tiny_kernels(facts: _Facts) -> list[Finding]:
    """A storm of tiny kernels: the launch-call time the tiny launches cost beyond their kernels."""
    table, totals = facts.launch_table
    if not totals["launches"] or totals["tiny_pct"] < 100 * TINY_SHARE:
        return []
    tiny = table.filter(pl.col("tiny") > 0).join(facts.classified.select("name", "label"), on="name", how="left")
    overhead = float((tiny["api_ns"] * tiny["tiny"] / tiny["launches"]).sum()) - totals["tiny_kernel_ns"]
    n = max(facts.totals.iterations, 1)
    top = ", ".join(f"{_label(r)} x{r['tiny'] // n:,}" for r in tiny.sort("tiny", descending=True).head(3)
                    .iter_rows(named=True))
    evidence = (f"{totals['tiny']:,} of {totals['launches']:,} launches ({totals['tiny_pct']:.0f} %) ran shorter than "
                f"their launch call: {_ms(totals['tiny_kernel_ns'])} of kernels for "
                f"{_ms(overhead + totals['tiny_kernel_ns'])} of launch calls; most"
                f"{' per iteration' if facts.totals.iterations else ''}: {top}")
    fix = ("Fuse the small operations (torch.compile, foreach/fused optimizers, vectorized code instead of "
           "Python loops over tensors) or replay the step as a CUDA graph")
    return [Finding("tiny_kernels", "A storm of tiny kernels", max(overhead, 0.0), evidence, fix)]


def _classified(facts: _Facts) -> pl.DataFrame:
    """Per kernel name: launches, time (total_ns), per-launch mean, short (the short name),
    library, operation, gemm_variant, tensor_cores, precision (what the name says, else null),
    label (how evidence names it: the short name, or `_telling_name` where names share it)."""
    from traceq.analysis.kernels.classify import classify_names

    t = int(facts.trace_id)
    names = facts.con.sql(f"SELECT s.name, s.instances AS launches, s.total_ns, s.avg_ns, n.short AS short "
                          f"FROM kernel_summary s LEFT JOIN (SELECT name, any_value(short_name) AS short "
                          f"FROM kernel_names WHERE trace_id = {t} GROUP BY name) n USING (name) "
                          f"WHERE s.trace_id = {t} AND s.name_by = 'demangled'").pl()
    classes = classify_names(names["name"]).select("name", "library", "operation", "gemm_variant", "tensor_cores",
                                                  "precision")
    telling = pl.Series([_telling_name(n) for n in names["name"]], dtype=pl.String)  # one per kernel name
    shared = pl.col("short").is_null() | (pl.len().over("short") > 1)
    return names.join(classes, on="name", how="left").with_columns(
        label=pl.when(shared).then(telling).otherwise(pl.col("short")))


def _telling_name(name: str) -> str:
    """A kernel name that tells apart kernels of one short name (`vectorized_elementwise_kernel`,
    `Kernel2`): the function's unqualified name with its first template argument that is not a
    number, itself unqualified and without its parameter list:
    'vectorized_elementwise_kernel<CUDAFunctor_add<float>>',
    'Kernel2<cutlass_80_simt_sgemm_32x128_8x5_tn_align1>'; the name itself without templates."""
    name = re.sub(r"<unnamed>::|\(anonymous namespace\)::", "", name)
    depth, cut, args, start = 0, -1, [], 0
    for i, c in enumerate(name):  # the top-level template argument list: a few hundred characters
        if c in "<([":
            depth += 1
            if c == "<" and depth == 1:
                cut, start = i, i + 1
        elif c in ">)]":
            depth -= 1
            if c == ">" and depth == 0 and cut >= 0:
                args.append(name[start:i])
                break
        elif c == "," and depth == 1 and cut >= 0:
            args.append(name[start:i])
            start = i + 1
    if cut < 0:
        return name
    function = re.sub(r"^.*\s", "", name[:cut]).rsplit("::", 1)[-1]
    for arg in (a.strip() for a in args):
        if arg and not re.fullmatch(r"(\([a-z ]+\))?-?\d+[a-zA-Z]*", arg):
            arg = re.sub(r"(::\[|::\{|(?<=[\w>])\().*$", "", arg)  # a lambda's or function's parameters
            arg = re.sub(r"\b[A-Za-z_]\w*::|^void ", "", arg)
            return f"{function}<{arg}>"
    return function


def _label(row: dict[str, object]) -> str:
    """A kernel as evidence names it: its short name (templates and arguments dropped), or where
    kernels share that, `_telling_name`; cut to 64 characters."""
    name = str(row.get("label") or row.get("short") or row["name"])
    return name if len(name) <= 64 else name[:63] + "…"


def _fp32_math(facts: _Facts) -> list[Finding]:
    """Convolution and GEMM kernels in FP32 (by name, or a name that says no precision) without
    tensor cores, on a GPU that has them. Attention kernels (FlashAttention, cuDNN's SDPA, fused
    MHA: operation 'attention') and the math libraries' helpers (split-K reductions, workspace
    initialisation, epilogues, offset tables: reduction, memset, elementwise, indexing) are
    neither, by their classification (kernel_rules.toml)."""
    peaks = facts.peaks
    if peaks.is_empty():
        return []
    gpu = peaks.sort("sm_count", descending=True).row(0, named=True)
    cc = tuple(int(part) for part in gpu["cc"].split("."))
    if cc < (7, 0):
        return []
    kernels = facts.classified.filter(pl.col("operation").is_in(["gemm", "convolution"]) & ~is_communication(facts)
                                      & ~pl.col("tensor_cores").fill_null(False)
                                      & pl.col("precision").fill_null("fp32").eq("fp32"))
    if kernels.is_empty():
        return []
    tf32 = cc >= TF32_CC
    ratio = gpu["peak_tf32"] / gpu["peak_fp32"] if tf32 and gpu["peak_tf32"] and gpu["peak_fp32"] else None
    total = float(kernels["total_ns"].sum())
    at_stake = total * (1 - 1 / ratio) if ratio else total / 2
    top = ", ".join(f"{_label(r)} {_ms(r['total_ns'])}" for r in kernels.sort("total_ns", descending=True)
                    .head(3).iter_rows(named=True))
    evidence = (f"{kernels['launches'].sum():,} convolution/GEMM launches ran FP32 math without tensor cores: "
                f"{_ms(total)} on {gpu['name']}"
                + (f", whose TF32 tensor cores peak at {ratio:.1f}x its FP32 rate" if ratio else "")
                + f"; heaviest: {top}")
    fix = ("Let matrix math use tensor cores: torch.set_float32_matmul_precision('high') "
           "(TF32 matmuls; torch.backends.cudnn.allow_tf32 for convolutions), or autocast to float16/bfloat16 (AMP)"
           if tf32 else "Autocast to float16 (AMP): this GPU's tensor cores take FP16, not TF32")
    return [Finding("fp32_math", "FP32 matrix math where tensor cores were available", at_stake, evidence, fix)]


def _transposed_gemms(facts: _Facts) -> list[Finding]:
    """GEMMs with a transposed operand slower than the `nn` GEMM of the same fully connected
    layer. A linear layer's forward, data-gradient and weight-gradient products do the same
    FLOPs, so the kernel time each operand layout (nn, nt, tn, tt) takes in the layer compares
    directly; a layer with a convolution kernel is left out (its products differ)."""
    kernels, scale = facts.gemm_layers
    if kernels.is_empty():
        return []
    forward = kernels.filter(pl.col("pass") == "forward")["layer"].unique().to_list()
    base = (pl.when((pl.col("pass") == "backward") & pl.col("layer").str.slice(1).is_in(forward))
            .then(pl.col("layer").str.slice(1)).otherwise(pl.col("layer")))
    per_layer = kernels.with_columns(base=base)
    convolutions = per_layer.filter(pl.col("operation") == "convolution")["base"].unique().to_list()
    gemms = (per_layer.filter(pl.col("gemm_variant").is_not_null() & ~pl.col("base").is_in(convolutions))
             .group_by("base", "gemm_variant")
             .agg(layers=pl.col("layer").unique().sort().str.join("/"), launches=pl.len(), total_ns=pl.col("dur_ns").sum()))
    twins = gemms.filter(pl.col("gemm_variant") == "nn").select("base", nn_ns="total_ns")
    slow = (gemms.filter(pl.col("gemm_variant") != "nn").join(twins, on="base")
            .filter((pl.col("nn_ns") > 0) & (pl.col("total_ns") >= TRANSPOSED_RATIO * pl.col("nn_ns")))
            .with_columns(excess_ns=(pl.col("total_ns") - pl.col("nn_ns")) * scale)
            .sort("excess_ns", descending=True))
    if slow.is_empty():
        return []
    where = "in one iteration (of " + str(scale) + ")" if scale > 1 else "in the trace"
    evidence = f"{where}: " + "; ".join(
        f"{r['base']}: its {r['gemm_variant']} GEMM kernels took {_ms(r['total_ns'])} ({r['launches']} launch"
        f"{'es' if r['launches'] != 1 else ''}), "
        f"its nn ones {_ms(r['nn_ns'])} for the same FLOPs ({r['total_ns'] / r['nn_ns']:.1f}x)"
        for r in slow.head(3).iter_rows(named=True))
    fix = ("Give cuBLAS operands it reads without transposing: keep the weight in the layout the product wants "
           "(store it pre-transposed, or make it .contiguous() once outside the step) instead of a .t() view per "
           "call, or let a faster kernel take over (TF32/AMP, cuBLASLt heuristics)")
    return [Finding("transposed_gemm", "GEMMs with a transposed operand slower than their twins",
                    float(slow["excess_ns"].sum()), evidence, fix)]


def _gemm_layers(facts: _Facts) -> tuple[pl.DataFrame, int]:
    """The GEMM and convolution kernels of one iteration (the median one; the whole trace when it
    marks none) with their layer: (name, operation, gemm_variant, dur_ns, layer, pass; how many
    times the trace holds what they took). One iteration is enough to compare a layer's GEMMs,
    and attributing every launch of a ten-million-kernel trace would take seconds."""
    from traceq.analysis.structure.attribution import attribute_points
    from traceq.analysis.structure.graphs import kernel_points_sql

    t = int(facts.trace_id)
    classes = facts.classified.filter(pl.col("operation").is_in(["gemm", "convolution"]))
    if classes.is_empty():
        return pl.DataFrame(schema={"name": pl.String, "operation": pl.String, "gemm_variant": pl.String,
                                    "dur_ns": pl.Int64, "layer": pl.String, "pass": pl.String}), 1
    ranges = facts.con.sql(f"SELECT pid, start_ns, end_ns FROM nvtx WHERE trace_id = {t} AND end_ns IS NOT NULL "
                           f"AND kind IN ('pushpop', 'startend') AND regexp_matches(coalesce(name, ''), ?) "
                           f"ORDER BY start_ns", params=[facts.iteration_regex]).fetchall()
    window = ""
    if ranges:
        pid, start, end = ranges[len(ranges) // 2]
        window = (f" AND time_ns >= {int(start)} AND time_ns < {int(end)}"
                  + ("" if pid is None else f" AND pid = {int(pid)}"))  # Kineto ranges may have no pid
    kernels = facts.con.sql(
        f"SELECT * FROM ({kernel_points_sql(facts.con, t, 'k.kernel_id, k.name, k.dur_ns, k.pid')}) "
        f"WHERE list_contains(?, name){window}", params=[classes["name"].to_list()]).pl()
    points = kernels.select(id="kernel_id", pid="pid", tid="point_tid", t="point_ns", time="time_ns")
    layers = attribute_points(facts.con, t, points, facts.iteration_regex, paths=False)
    return (pl.concat([kernels.select("name", "dur_ns"), layers.select("layer", "pass")], how="horizontal")
            .join(classes.select("name", "operation", "gemm_variant"), on="name", how="left")
            .filter(pl.col("layer").is_not_null())), max(len(ranges), 1)


_LIMITER_FIX = {
    "registers": "fewer registers per thread (__launch_bounds__, -maxrregcount) or a smaller tile",
    "shared_mem": "less shared memory per block (a smaller tile, fewer pipeline stages)",
    "warps": "smaller blocks, so more of them fit an SM",
    "blocks": "larger blocks: the SM's block limit binds before its threads do",
    "barriers": "fewer blocks with barriers per SM",
    # AMD's (analysis.efficiency.cdna): per CU, wavefronts for warps, workgroups for blocks
    "waves": "smaller workgroups, so more of them fit a CU",
    "vgprs": "fewer vector registers per work-item (__launch_bounds__, fewer live values; VGPRs and AGPRs share a file)",
    "sgprs": "fewer scalar registers per wavefront",
    "lds": "less LDS per workgroup (a smaller tile)",
    "workgroups": "larger workgroups: the CU's workgroup limit binds before its wavefronts do",
}


def _low_ru(facts: _Facts) -> list[Finding]:
    """Kernels whose grids leave block slots empty (RU below LOW_RU), with their limiter."""
    try:
        ru = facts.ru
    except TraceqError:  # no GPU description
        return []
    low = (ru.filter((pl.col("ru") < LOW_RU) & ~is_communication(facts)).with_columns(waste_ns=pl.col("total_ns") * (1 - pl.col("ru")))
           .sort("waste_ns", descending=True).join(facts.classified.select("name", "label"), on="name", how="left",
                                                   maintain_order="left"))
    if low.is_empty():
        return []
    lines, limiter = [], None
    measured = _measured_occupancy(facts)
    for r in low.head(3).iter_rows(named=True):
        configs = _configurations(facts.ru_launches, r["name"])
        if configs.height > 1:  # several grids or block sizes: described by all of them, never by one
            line, dominant = _several_configurations(r, configs)
            lines.append(line + measured.get(r["name"], ""))
            limiter = limiter or dominant
            continue
        why = ("its grid fills less than one wave" if (r["waves"] or 0) < 1 else "its last wave is partly empty")
        blocks = ("an unknown grid" if r["grid_blocks"] is None
                  else f"{r['grid_blocks']:,} block{'s' if r['grid_blocks'] != 1 else ''}")
        lines.append(f"{_label(r)}: RU {100 * r['ru']:.0f} %, {why} ({blocks} of {r['block_threads']} threads, "
                     f"{r['blocks_per_sm']} per SM, limiter {r['limiter']}), {_ms(r['total_ns'])}"
                     + measured.get(r["name"], ""))
        limiter = limiter or str(r["limiter"] or "")
    limiter = limiter or ""
    fix = ("Fill the GPU: a larger batch, or fusing or batching small kernels, for grids under one wave; "
           "for the limiter, " + "; ".join(_LIMITER_FIX[part] for part in limiter.split("+") if part in _LIMITER_FIX)
           if limiter else "Fill the GPU: a larger batch, or fusing or batching small kernels")
    return [Finding("low_ru", "Low occupancy: kernels that leave GPU block slots empty (low RU)",
                    float(low["waste_ns"].sum()),
                    "; ".join(lines), fix)]


def _measured_occupancy(facts: _Facts) -> dict[str, str]:
    """Per kernel name, what Nsight Compute measured of its occupancy where a report is joined
    (`load --ncu`): theoretical (sm__maximum_warps_per_active_cycle_pct) and achieved
    (sm__warps_active) occupancy, means over its measured launches weighted by their time, as
    evidence text; empty without a report."""
    from traceq.analysis.efficiency.ncu_columns import ncu_launches

    measured = ncu_launches(facts.con, facts.trace_id)
    if measured is None:
        return {}
    names = facts.con.sql(f"SELECT kernel_id, name FROM kernels WHERE trace_id = {int(facts.trace_id)}").pl()
    out = {}
    weighted = {c: (pl.col(c) * pl.col("dur_ns")).filter(pl.col(c).is_not_null()).sum()
                / pl.col("dur_ns").filter(pl.col(c).is_not_null()).sum()
                for c in ("theoretical_occupancy_pct", "achieved_occupancy_pct")}
    per = measured.join(names, on="kernel_id").group_by("name").agg(n=pl.len(), **weighted)
    for r in per.iter_rows(named=True):
        parts = [f"{label} {r[c]:.0f} %" for label, c in (("theoretical occupancy", "theoretical_occupancy_pct"),
                                                         ("achieved", "achieved_occupancy_pct"))
                 if r[c] is not None and r[c] == r[c]]
        if parts:
            out[r["name"]] = f" (Nsight Compute on {r['n']} launch{'es' if r['n'] != 1 else ''}: {', '.join(parts)})"
    return out


def _configurations(launches: pl.DataFrame, name: str) -> pl.DataFrame:
    """The launch configurations (grid_blocks, block_threads) of kernel `name` in `launches`
    (`ru.kernel_launch_groups`), most kernel time first: launches, total_ns, and the
    blocks_per_sm, limiter and waves of the heaviest launch group among them."""
    mine = launches.filter(pl.col("name") == name).sort("dur_ns", "first_kernel", descending=[True, False])
    return (mine.group_by("grid_blocks", "block_threads", maintain_order=True)
            .agg(launches=pl.col("instances").sum(), total_ns=pl.col("dur_ns").sum().cast(pl.Float64),
                 blocks_per_sm=pl.col("blocks_per_sm").first(), limiter=pl.col("limiter").first(),
                 waves=pl.col("waves").first())
            .sort("total_ns", descending=True, maintain_order=True))


def _several_configurations(r: dict[str, object], configs: pl.DataFrame) -> tuple[str, str]:
    """A low-RU kernel that ran with several grids or block sizes: the range of its grids and
    block sizes, then the configuration that took most of its time, with its share ("8 to 2,048
    blocks of 128 threads; 86 % of its time with 8 blocks, under one wave (12 per SM, limiter
    registers)"). Returns the line and that configuration's limiter."""
    def span(column: str) -> str:
        low, high = configs[column].min(), configs[column].max()
        return "unknown" if low is None else f"{low:,}" if low == high else f"{low:,} to {high:,}"

    top = configs.row(0, named=True)
    share = 100 * top["total_ns"] / max(float(configs["total_ns"].sum()), 1.0)
    threads = configs["block_threads"].n_unique() > 1
    with_ = ("an unknown grid" if top["grid_blocks"] is None else f"{top['grid_blocks']:,} blocks"
             + (f" of {top['block_threads']} threads" if threads else ""))
    why = "under one wave" if (top["waves"] or 0) < 1 else "its last wave partly empty"
    line = (f"{_label(r)}: RU {100 * float(r['ru']):.0f} %, {int(configs['launches'].sum()):,} launches in "
            f"{configs.height} configurations, {span('grid_blocks')} blocks of {span('block_threads')} threads; "
            f"{share:.0f} % of its time with {with_}, {why} ({top['blocks_per_sm']} per SM, limiter "
            f"{top['limiter']}), {_ms(float(r['total_ns']))}")
    return line, str(top["limiter"] or "")


_launch_bound = _idle_rule("launch_bound", "Launch-bound: the host issues work slower than the GPU runs it",
                           "Launch fewer, larger kernels: CUDA graphs (torch.cuda.graphs, "
                           "torch.compile(mode='reduce-overhead')), fused or foreach optimizers, larger batches")


def _graph_candidate(facts: _Facts, found: list[Finding]) -> list[Finding]:
    """A launch-bound finding says whether the step is a CUDA-graph candidate: every iteration
    range after the first launches the same kernels in the same order (by the launching calls'
    starts), so one capture could replay them all."""
    if not found:
        return found
    rows = repeated_launches(facts.con, facts.trace_id, facts.iteration_regex)
    if rows[0] >= 2 and rows[1] == 1 and rows[2]:
        f = found[0]
        evidence = (f"{f.evidence}; a CUDA-graph candidate: each of {rows[0]} iterations after the first launches the "
                    f"same {rows[2]:,} kernels in the same order")
        found = [Finding(f.rule, f.title, f.time_ns, evidence, f.fix)]
    return found


def _profiler_caveat(facts: _Facts, found: list[Finding]) -> list[Finding]:
    """A launch-bound finding on a trace recorded with torch.profiler's options that add host
    work to every operator (with_stack, profile_memory: the trace's header says so, kept in
    `traces.tool`) says that part of the host's lateness is the profiler's own. (A Qwen prefill
    recorded so on an H200: 42.5 ms a step traced, 32.9 ms untraced, 15.4 ms launch-bound.)"""
    if not found:
        return found
    tool = facts.con.execute("SELECT tool FROM traces WHERE trace_id = ?", [facts.trace_id]).fetchone()
    options = (tool[0] or "").partition("; ")[2].split(", ") if tool and (tool[0] or "").startswith("PyTorch") else []
    costly = [o for o in ("with_stack", "profile_memory") if o in options]
    if not costly:
        return found
    f = found[0]
    evidence = (f"{f.evidence}; recorded with torch.profiler's {' and '.join(costly)}, which add host time to every "
                "operator: part of this idle is the profiler's own, so time the step without them before acting")
    return [Finding(f.rule, f.title, f.time_ns, evidence, f.fix)]


RULES: dict[str, Callable[[_Facts], list[Finding]]] = {
    "sync": _idle_rule("sync", "Synchronizations inside the iteration",
                       "Keep results on the GPU: take loss.item(), .cpu(), print(tensor) and torch.cuda.synchronize() "
                       "out of the step (or do them every N steps); each one drains the GPU's queue"),
    "pageable_copies": _pageable,
    "h2d_pinned": _idle_rule("h2d_pinned", "Waiting on host-to-device copies",
                             "Overlap the copy with compute: copy the next batch early with non_blocking=True "
                             "(on a side stream), from pinned memory"),
    "iteration_start": _idle_rule("iteration_start", "GPU idle between iterations",
                                  "Prepare the next batch while the GPU runs: DataLoader(num_workers>0, "
                                  "prefetch_factor), preprocessing off the training thread"),
    "launch_bound": lambda facts: _profiler_caveat(facts, _graph_candidate(facts, _launch_bound(facts))),
    "tiny_kernels": _tiny_kernels,
    "fp32_math": _fp32_math,
    "transposed_gemm": _transposed_gemms,
    "low_ru": _low_ru,
    "uncoalesced_access": uncoalesced_access,
    "exposed_comm": exposed_comm,
    "straggler": straggler,
    "load_imbalance": load_imbalance,
    "layout_transforms": layout_transforms,
    "idle_tensor_cores": idle_tensor_cores,
    "allocator_churn": allocator_churn,
    "recompilation": recompilation,
}
"""Every rule, by id: each takes the shared facts and returns its findings (none or one)."""
