"""What-if changes to a dependency graph (`traceq whatif`): each change rewrites node durations
or edges, states its assumption, and the graph is replayed (`path.critical_paths`).

- `Scale`: kernels whose library, name or layer (a regex) matches take `factor` times as long
  (layers: where the store keeps the trace's attribution).
- `no_launch_overhead`: the GPU no longer waits for the host to launch its work (CUDA graphs):
  a GPU operation's launch edge is kept only for the first operation of its iteration on its
  stream; one that waited for its launch follows its stream's previous operation after the
  device's median queued gap.
- `overlap_comm`: collective kernels are fully hidden behind compute: they take no time.
- `precision`: GEMM and convolution kernels run in another precision: scaled by the ratio of
  the GPU's dense peaks (`efficiency.peaks`) in their own precision and the new one.
- `gpu`: the trace on another GPU (`efficiency.gpu_products`, `gpu_model`): each kernel's time
  at its roof (FLOPs and bytes from the recorded shapes) moves with the roof, the rest with
  the SM clock; device-to-device copies by the DRAM ratio; host-device copies, collectives and
  host time unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb
import polars as pl

from traceq.analysis.critical.graph import Graph
from traceq.errors import TraceqError

VALIDATION = {
    "precision": "validated: FP32 -> AMP fp16, AlexNet b256 on an H200, -0.1 % (docs/whatif.md)",
    "no_launch_overhead": ("validated: eager -> CUDA graph, a launch-bound training step on an H200, +8.3 % "
                           "(docs/whatif.md)"),
    "overlap_comm": "NOT validated against a real pair yet",
    "gpu": ("validated H100 <-> H200 only, a Qwen prefill: GPU time +6.0 % / -3.7 %, step +6.0 % / -13.2 %; "
            "attention kernels of another library miss; other GPUs NOT validated (docs/whatif.md)"),
    "scale": "exact for the durations given; the durations are yours",
}
"""How each change's prediction fared against real pairs (tools/whatif_validate.py), said with its
assumption; a change whose validation missed its bound, or that has none, is labelled so."""

COMPUTE_BOUND = ("gemm", "convolution")
"""Kernel operations the precision model takes as compute-bound (the GPU model: `gpu_model`)."""

LAUNCH_HELPERS = (r"^(cuKernelGet|cuFuncGet|cudaFuncGetAttributes|cudaGetDevice|cuCtxGetCurrent|cuCtxGetDevice|"
                  r"cudaGetLastError|cudaPeekAtLastError|cuGetProcAddress|cudaStreamIsCapturing|cuModuleGetFunction|"
                  r"cudaDeviceGetAttribute|cuDeviceGetAttribute)")
"""Host calls made around launches that launch nothing themselves (PyTorch's and the runtime's
name and attribute queries, error checks): replayed from a CUDA graph they are not made."""


@dataclass(frozen=True)
class Scale:
    """Kernels whose `field` ('library', 'kernel' or 'layer') matches `pattern` take `factor` x as long."""

    field: str
    pattern: str
    factor: float

    @classmethod
    def parse(cls, text: str) -> Scale:
        """'library=cuBLAS:0.5', 'kernel=gemm:0.8'."""
        match = re.fullmatch(r"\s*(library|kernel|layer)\s*=\s*(.+):\s*([0-9.eE+-]+)\s*", text)
        if not match:
            raise TraceqError(f"--scale {text!r}: expected FIELD=REGEX:FACTOR with FIELD library, kernel or layer, "
                              "e.g. 'library=cuBLAS:0.5'")
        field, pattern, factor = match.group(1), match.group(2), float(match.group(3))
        if factor < 0:
            raise TraceqError(f"--scale {text!r}: the factor must be >= 0")
        try:
            re.compile(pattern)
        except re.error as error:
            raise TraceqError(f"--scale {text!r}: bad regex ({error})") from None
        return cls(field, pattern, factor)


@dataclass(frozen=True)
class Changes:
    """The changes of one what-if; they combine (applied in this order)."""

    scales: tuple[Scale, ...] = ()
    no_launch_overhead: bool = False
    overlap_comm: bool = False
    precision: str | None = None
    gpu: str | None = None

    def any(self) -> bool:
        return bool(self.scales or self.no_launch_overhead or self.overlap_comm or self.precision or self.gpu)


def apply(con: duckdb.DuckDBPyConnection, trace_id: int, graph: Graph, changes: Changes
          ) -> tuple[pl.DataFrame, pl.Series, list[str]]:
    """The graph's node table and durations with `changes` made, and one assumption per change."""
    nodes, dur = graph.nodes, graph.nodes["dur_ns"].cast(pl.Float64)
    kernel = nodes["kind"] == 1
    notes: list[str] = []
    for scale in changes.scales:
        column = nodes[{"library": "library", "kernel": "name", "layer": "layer"}[scale.field]].fill_null("")
        hit = kernel & column.str.contains(scale.pattern)
        if scale.field == "layer" and nodes["layer"].null_count() == nodes.height:
            raise TraceqError("--scale layer=...: the store keeps no layer attribution for this trace; run "
                              "`traceq attribute` first")
        dur = pl.select(pl.when(hit).then(dur * scale.factor).otherwise(dur)).to_series()
        notes.append(f"{int(hit.sum())} kernels whose {scale.field} matches {scale.pattern!r} take "
                     f"{scale.factor:g} x their measured time ({VALIDATION['scale']})")
    if changes.precision or changes.gpu:
        dur, said = _model(con, trace_id, nodes, dur, changes.precision, changes.gpu)
        for what, lines in said.items():  # each change's validation after its first line
            notes.extend([f"{lines[0]} ({VALIDATION[what]})", *lines[1:]])
    if changes.overlap_comm:
        comm = kernel & (nodes["library"] == "NCCL").fill_null(False)
        dur = pl.select(pl.when(comm).then(0.0).otherwise(dur)).to_series()
        notes.append(f"{int(comm.sum())} collective kernels fully hidden behind compute (they take no time on "
                     f"any path; {VALIDATION['overlap_comm']})")
    nodes = _coupled_scaled(nodes, dur)
    if changes.no_launch_overhead:
        nodes, gone, note = _without_launches(nodes)
        dur = pl.select(pl.when(gone).then(0.0).otherwise(dur)).to_series()
        notes.append(f"{note} ({VALIDATION['no_launch_overhead']})")
    return nodes, dur.round(0).cast(pl.Int64), notes


def _coupled_scaled(nodes: pl.DataFrame, dur: pl.Series) -> pl.DataFrame:
    """A collective of a run ends at its last rank's arrival plus the transfer (`ranks`): the
    transfer and the kernel's own least time scaled as its duration was."""
    old = nodes["dur_ns"].cast(pl.Float64)
    ratio = pl.select(pl.when(old > 0).then(dur / old).otherwise(1.0)).to_series()
    coupled = nodes["peer"] >= 0
    if not coupled.any():
        return nodes
    return nodes.with_columns(
        peer_gap=pl.when(coupled).then((nodes["peer_gap"] * ratio).round(0).cast(pl.Int64)).otherwise(nodes["peer_gap"]),
        sync_floor_ns=pl.when(coupled).then((nodes["sync_floor_ns"] * ratio).round(0).cast(pl.Int64))
        .otherwise(nodes["sync_floor_ns"]))


def _without_launches(nodes: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series, str]:
    """Launch edges kept for each iteration's first operation per stream only; the calls that
    launched only the rest (and the host's time before each) gone: (nodes, which calls are gone,
    the assumption)."""
    gpu = nodes["kind"] > 0
    queued = nodes.filter(gpu & (nodes["prog"] >= 0) & (nodes["prog_gap"] > 0) & (nodes["launch"] >= 0)
                          & (nodes["launch_gap"] == nodes.select(pl.col("launch_gap").min().over("device"))
                             .to_series()))
    medians = queued.group_by("device").agg(median=pl.col("prog_gap").median().round(0).cast(pl.Int64))
    median = nodes.select("device").join(medians, on="device", how="left", maintain_order="left")["median"]
    first = nodes.select(pl.int_range(pl.len()).over("lane", pl.col("iteration")) == 0).to_series()
    floor = nodes.select(pl.col("launch_gap").min().over("device")).to_series()
    launch_bound = gpu & (nodes["launch"] >= 0) & (nodes["launch_gap"] > floor)
    keep = ~gpu | first | (nodes["prog"] < 0)
    launch = nodes["launch"]
    def marked(rows: pl.Series) -> pl.Series:
        return pl.repeat(False, nodes.height, dtype=pl.Boolean, eager=True).scatter(rows.unique(), True)

    gone = marked(launch.filter(gpu & ~keep & (launch >= 0))) & ~marked(launch.filter(gpu & keep & (launch >= 0)))
    # the calls that only serve launching (name and attribute queries, error checks) go with them
    helpers = (~gpu & (nodes["awaited"].fill_null(-1) < 0) & nodes["iteration"].is_not_null()
               & nodes["name"].fill_null("").str.contains(LAUNCH_HELPERS) & ~marked(launch.filter(launch >= 0)))
    gone = gone | helpers
    out = nodes.with_columns(
        launch=pl.when(keep).then(nodes["launch"]).otherwise(-1),
        prog_gap=pl.when(launch_bound & ~keep).then(median.fill_null(0))
        .when(gone).then(0).otherwise(nodes["prog_gap"]))
    out = out.with_columns(fixed=(pl.col("prog") < 0) & (pl.col("launch") < 0) & (pl.col("wait") < 0))
    moved = int((launch_bound & ~keep).sum())
    return out, gone, (f"no launch overhead (CUDA graphs): GPU work no longer waits for its launch but for the first "
                       f"of each iteration and stream; {moved} operations that waited for the host follow their "
                       f"stream after its median queued gap; {int(gone.sum())} launch calls and the calls "
                       "around them (attribute queries, error checks), and the host time before each, take no time")


def _model(con: duckdb.DuckDBPyConnection, trace_id: int, nodes: pl.DataFrame, dur: pl.Series,
           precision: str | None, gpu: str | None) -> tuple[pl.Series, dict[str, list[str]]]:
    """Durations under another precision (GEMM and convolution kernels by the trace's GPU's peak
    ratio) and/or on another GPU (`gpu_model`: each kernel by its roofline position)."""
    from traceq.analysis.critical.gpu_model import kernel_roofs, rescale
    from traceq.analysis.efficiency.gpu_products import gpu_product, trace_gpu
    from traceq.analysis.efficiency.peaks import peak_flops

    here = trace_gpu(con, trace_id)
    there = gpu_product(gpu) if gpu else None
    if there is not None and there.name == gpu_product(here.name).name:
        there = here  # the trace's own GPU: its device record, so that the replay is the identity
    notes: dict[str, list[str]] = {}
    if precision:
        compute = (nodes["kind"] == 1) & nodes["operation"].is_in(list(COMPUTE_BOUND)).fill_null(False)
        own = nodes["precision"].fill_null("").replace("", "fp32")
        factors: dict[str, float] = {}
        for p in own.filter(compute).unique().to_list():
            before, after = (peak_flops(*here.cc, here.sm_count, here.clock_hz, q) for q in (p, precision))
            if not before or not after:
                raise TraceqError(f"no dense {p if not before else precision} peak for {here.name} in traceq's "
                                  "peak table")
            factors[p] = before / after
        factor = own.replace_strict(list(factors), list(factors.values()), default=1.0, return_dtype=pl.Float64)
        dur = pl.select(pl.when(compute).then(dur * factor).otherwise(dur)).to_series()
        notes["precision"] = [f"{int(compute.sum())} GEMM/convolution kernels compute-bound, in {precision} on "
                              f"{here.name}: x " + ", ".join(f"{v:.3g} ({k})" for k, v in sorted(factors.items()))]
    if there is not None:
        roofs = kernel_roofs(con, trace_id) if "rank" not in nodes.columns else None
        dur, lines = rescale(nodes, dur, roofs, here, there, precision)
        notes["gpu"] = lines
    return dur, notes


def predict(con: duckdb.DuckDBPyConnection, trace_id: int, changes: Changes, graph: Graph
            ) -> tuple[pl.DataFrame, object, list[str]]:
    """The graph replayed unchanged and with `changes`: (per iteration: iteration, measured_ns
    (the trace's times), replayed_ns (the unchanged graph's replay), predicted_ns, gain_ns
    (measured - predicted), gain_pct; the predicted `path.Critical`; the assumptions)."""
    from traceq.analysis.critical.path import critical_paths
    from traceq.analysis.critical.replay import iteration_ends, replay

    nodes = graph.nodes
    measured = iteration_ends(nodes, nodes["end_ns"], nodes["start_ns"])
    unchanged = replay(nodes)
    same = iteration_ends(nodes, *reversed(unchanged.times))
    del unchanged
    changed_nodes, dur, notes = apply(con, trace_id, graph, changes)
    new = critical_paths(graph, dur, changed_nodes)
    table = new.iterations.select(
        "iteration", measured_ns=measured["iteration_ns"], replayed_ns=same["iteration_ns"],
        predicted_ns=pl.col("iteration_ns"))
    table = table.with_columns(gain_ns=pl.col("measured_ns") - pl.col("predicted_ns")).with_columns(
        gain_pct=100.0 * pl.col("gain_ns") / pl.col("measured_ns"))
    return table, new, notes or ["no change: the graph replayed as measured"]
