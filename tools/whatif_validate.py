"""Check `traceq whatif` predictions against pairs of real recordings that differ in one thing
(issue 37, requirement 3; the results are in docs/whatif.md).

    python tools/whatif_validate.py [--gpu] [SAMPLES_DIR]

Each pair predicts the second recording's median iteration time from the first's graph:

- FP32 -> AMP (alexnet_b256_cudnn -> alexnet_b256_amp): (a) `--precision fp16`, the peak-ratio
  model; (b) each layer's GEMM and convolution kernels scaled to the AMP run's measured GEMM and
  convolution time in that layer (the issue's method).
- batch 128 -> 256 (alexnet_b128_cudnn -> alexnet_b256_cudnn): every kernel and copy twice as
  long (the naive model, kept to show why a fit is needed).
- batch 128 -> 256 with a fit (whatif/alexnet_b{64,128,256}_fp32, one session): each layer's GPU
  work at batch 128 scaled by that layer's measured growth from batch 64 to 128.
- eager -> CUDA graphs (planted/smallkernels -> planted/smallkernels_graph: a launch-bound step,
  tools/record_planted.py): `--no-launch-overhead`.
- DDP all-reduce -> no_sync() (multigpu/mgplants_base_2gpu -> mgplants_nosync_2gpu, rank 0: a
  wide MLP whose one gradient all-reduce runs exposed, tools/record_multigpu_plants.py):
  `--overlap-comm`.

`gpu_pair` (run with `--gpu`): H100 <-> H200 through `--gpu` (the per-kernel roofline model),
on a Qwen1.5-0.5B prefill recorded on each (AMD TraceLens' H100 sample in ../shared, and
whatif/qwen1.5-0.5b_prefill_h200 recorded with its settings, tools/record_qwen_prefill.py): the
step time both ways, and the GPU time per kernel class (GEMM, attention, the rest) of the
step's own forward (the kernels launched in the step: the H100 step also holds the previous
step's last kernels, launched before it began).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import polars as pl

BOUND = 0.10
"""The issue's bound on a prediction's error."""

GPU_BOUND = 0.15
"""The issue's bound for a prediction on another GPU (H200 -> H100 through the per-kernel model)."""

QWEN_H100 = ("realtraces", "kineto_json", "AMD-AGI__TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
"""The H100 half of the GPU pair, under ../shared."""

CLASSES = ("gemm", "attention", "other")
"""Kernel classes the GPU pair is compared on (`operation`; 'other': elementwise, norms, copies)."""


def _median(graph, dur=None) -> float:
    from traceq.analysis.critical.path import critical_paths

    return float(critical_paths(graph, dur, graph.nodes if dur is not None else None).iterations["iteration_ns"]
                 .median())


def _gemm_conv_by_layer(graph) -> pl.DataFrame:
    nodes = graph.nodes
    return (nodes.filter((pl.col("kind") == 1) & pl.col("operation").is_in(["gemm", "convolution"]))
            .group_by("layer").agg(ns=pl.col("dur_ns").sum()))


def _gpu_by_layer(graph) -> pl.DataFrame:
    return graph.nodes.filter(pl.col("kind") > 0).group_by("layer").agg(ns=pl.col("dur_ns").sum())


def main(samples: Path) -> list[tuple[str, float, float, float]]:
    from traceq.analysis.critical.graph import build_graph
    from traceq.analysis.critical.whatif import Changes, predict
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        con = open_store(Path(tmp) / "pairs.duckdb", create=True)
        ids = {n: load_trace(con, samples / f"{n}.sqlite").trace_id
               for n in ("alexnet_b256_cudnn", "alexnet_b256_amp", "alexnet_b128_cudnn")}
        graphs = {n: build_graph(con, t) for n, t in ids.items()}
        fp32, amp, b128 = graphs["alexnet_b256_cudnn"], graphs["alexnet_b256_amp"], graphs["alexnet_b128_cudnn"]
        truth_amp, truth_b256 = _median(amp), _median(fp32)
        table, _, _ = predict(con, ids["alexnet_b256_cudnn"], Changes(precision="fp16"), fp32)
        results.append(("FP32 -> AMP, --precision fp16 (peak ratio)", _median(fp32), float(table["predicted_ns"]
                                                                                             .median()), truth_amp))
        ratio = (_gemm_conv_by_layer(fp32).join(_gemm_conv_by_layer(amp), on="layer", suffix="_amp", nulls_equal=True)
                 .select("layer", factor=pl.col("ns_amp") / pl.col("ns")))
        nodes = fp32.nodes
        gemm = (nodes["kind"] == 1) & nodes["operation"].is_in(["gemm", "convolution"]).fill_null(False)
        factor = nodes.select("layer").join(ratio, on="layer", how="left", nulls_equal=True,
                                            maintain_order="left")["factor"].fill_null(1.0)
        dur = pl.select(pl.when(gemm).then(nodes["dur_ns"] * factor).otherwise(nodes["dur_ns"])).to_series()
        results.append(("FP32 -> AMP, GEMM/conv per layer from the AMP run", _median(fp32),
                        _median(fp32, dur.round(0).cast(pl.Int64)), truth_amp))
        gpu = b128.nodes["kind"] > 0
        dur = pl.select(pl.when(gpu).then(b128.nodes["dur_ns"] * 2).otherwise(b128.nodes["dur_ns"])).to_series()
        results.append(("batch 128 -> 256, GPU work x 2", _median(b128), _median(b128, dur), truth_b256))
        series = {b: build_graph(con, load_trace(con, samples / "whatif" / f"alexnet_b{b}_fp32.sqlite").trace_id)
                  for b in (64, 128, 256)}
        growth = (_gpu_by_layer(series[128]).join(_gpu_by_layer(series[64]), on="layer", suffix="_64", nulls_equal=True)
                  .select("layer", factor=pl.col("ns") / pl.col("ns_64")))
        nodes = series[128].nodes
        factor = nodes.select("layer").join(growth, on="layer", how="left", nulls_equal=True,
                                            maintain_order="left")["factor"].fill_null(2.0)
        dur = pl.select(pl.when(nodes["kind"] > 0).then(nodes["dur_ns"] * factor).otherwise(nodes["dur_ns"])).to_series()
        results.append(("batch 128 -> 256, each layer's growth from 64 -> 128", _median(series[128]),
                        _median(series[128], dur.round(0).cast(pl.Int64)), _median(series[256])))
        eager_id = load_trace(con, samples / "planted" / "smallkernels.sqlite").trace_id
        eager = build_graph(con, eager_id)
        graphed = build_graph(con, load_trace(con, samples / "planted" / "smallkernels_graph.sqlite").trace_id)
        table, _, _ = predict(con, eager_id, Changes(no_launch_overhead=True), eager)
        results.append(("eager -> CUDA graphs, --no-launch-overhead", _median(eager),
                        float(table["predicted_ns"].median()), _median(graphed)))
        ddp = samples / "multigpu" / "mgplants_base_2gpu_rank0.sqlite"
        if ddp.exists():  # two GPUs: rank 0 of the DDP MLP, with and without no_sync()
            base_id = load_trace(con, ddp).trace_id
            base = build_graph(con, base_id)
            alone = build_graph(con, load_trace(con, samples / "multigpu" / "mgplants_nosync_2gpu_rank0.sqlite").trace_id)
            table, _, _ = predict(con, base_id, Changes(overlap_comm=True), base)
            results.append(("DDP all-reduce -> no_sync(), --overlap-comm", _median(base),
                            float(table["predicted_ns"].median()), _median(alone)))
        con.close()
    return results


def _own_forward(nodes: pl.DataFrame, dur: pl.Series) -> dict[str, float]:
    """GPU time per class of the kernels launched in the trace (a launch edge), ns."""
    kernels = nodes.with_columns(dur=dur).filter((pl.col("kind") == 1) & (pl.col("launch") >= 0))
    cls = pl.when(pl.col("operation").is_in(CLASSES[:2])).then(pl.col("operation")).otherwise(pl.lit("other"))
    return dict(kernels.group_by(cls.alias("cls")).agg(pl.col("dur").sum()).iter_rows())


def gpu_pair(h100: Path, h200: Path) -> list[tuple[str, float, float, float]]:
    """(what, first, predicted, measured) for H100 -> H200 and H200 -> H100: the step time, then
    the GPU time per class (`CLASSES`) of the step's own forward (module docstring)."""
    from traceq.analysis.critical.graph import build_graph
    from traceq.analysis.critical.whatif import Changes, apply, predict
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        con = open_store(Path(tmp) / "gpus.duckdb", create=True)
        ids = {"H100": load_trace(con, h100).trace_id, "H200": load_trace(con, h200).trace_id}
        graphs = {g: build_graph(con, t) for g, t in ids.items()}
        for here, there in (("H100", "H200"), ("H200", "H100")):
            graph, other = graphs[here], graphs[there]
            table, _, _ = predict(con, ids[here], Changes(gpu=there), graph)
            results.append((f"{here} -> {there}, step", _median(graph), float(table["predicted_ns"].median()),
                            _median(other)))
            _, dur, _ = apply(con, ids[here], graph, Changes(gpu=there))
            first, predicted = _own_forward(graph.nodes, graph.nodes["dur_ns"]), _own_forward(graph.nodes, dur)
            measured = _own_forward(other.nodes, other.nodes["dur_ns"])
            for cls in CLASSES:
                results.append((f"{here} -> {there}, {cls} kernels", first[cls], predicted[cls], measured[cls]))
            results.append((f"{here} -> {there}, all kernels", sum(first.values()), sum(predicted.values()),
                            sum(measured.values())))
        con.close()
    return results


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--gpu"]
    folder = Path(args[0]) if args else Path(__file__).resolve().parent.parent / "sample_traces"
    pairs = (gpu_pair(folder.parent.parent / "shared" / Path(*QWEN_H100),
                      folder / "whatif" / "qwen1.5-0.5b_prefill_h200.json.gz") if "--gpu" in sys.argv
             else main(folder))
    bound = GPU_BOUND if "--gpu" in sys.argv else BOUND
    for what, base, predicted, truth in pairs:
        error = (predicted - truth) / truth
        label = "" if abs(error) <= bound else f"  MISSES the {bound:.0%} bound"
        print(f"{what}: first {base / 1e6:.3f} ms, predicted {predicted / 1e6:.3f} ms, measured "
              f"{truth / 1e6:.3f} ms, error {100 * error:+.1f} %{label}")
