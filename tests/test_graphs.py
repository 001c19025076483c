"""CUDA graphs: kernels replayed from a graph take the NVTX ranges open when it was captured.

alexnet_b64_graph.sqlite captures AlexNet's whole training step once into a graph, with the
layer ranges open during the capture (backward layers on the autograd thread), and replays it
once per iteration. The reference below follows the export's own CUDA_GRAPH_NODE_EVENTS from
each kernel's node back to the node's creation and finds, with a plain loop over that thread's
ranges, the innermost one open then."""

from __future__ import annotations

import re
import sqlite3
from collections import Counter

import polars as pl
from conftest import sample, trace_id

from traceq.analysis.structure.attribution import kernel_attribution
from traceq.analysis.structure.conventions import ITERATION_REGEX, STAGES
from traceq.analysis.structure.layers import stage_times

GRAPH = "alexnet_b64_graph"


def _expected() -> dict[int, tuple[str | None, str | None]]:
    """kernel row (0-based, table order) -> (layer at capture, iteration at replay)."""
    con = sqlite3.connect(f"file:{sample(GRAPH + '.sqlite')}?mode=ro", uri=True)
    events = con.execute("SELECT graphNodeId, originalGraphNodeId, globalTid, start FROM CUDA_GRAPH_NODE_EVENTS").fetchall()
    ranges = con.execute("SELECT start, \"end\", globalTid, text FROM NVTX_EVENTS WHERE eventType = 59").fetchall()
    kernels = con.execute("""SELECT k.graphNodeId, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k
                             LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                             ORDER BY k.rowid""").fetchall()
    con.close()
    original = {node: orig for node, orig, _, _ in events if orig is not None}
    created = {node: (tid, start) for node, orig, tid, start in events if orig is None}
    iteration = re.compile(ITERATION_REGEX)

    def innermost(tid: int, t: int, layers: bool) -> str | None:
        open_ = [(s, -e, name) for s, e, g, name in ranges if g == tid and s <= t < e
                 and (not layers or (not iteration.match(name) and name.lower() not in STAGES))]
        return max(open_)[2] if open_ else None

    out = {}
    for row, (node, launched) in enumerate(kernels):
        if not node:
            continue
        while node in original:
            node = original[node]
        tid, t = created[node]
        iterations = [name for s, e, _, name in ranges if s <= launched < e and iteration.match(name)]
        out[row] = (innermost(tid, t, layers=True), iterations[0] if iterations else None)
    return out


def test_replayed_kernels_take_the_capture_layers(sample_store) -> None:
    expected = _expected()
    assert len(expected) == 676
    got = kernel_attribution(sample_store, trace_id(sample_store, GRAPH), infer=False).filter(
        pl.col("kernel_id").is_in(list(expected)))  # the ranges alone (tests/test_inference.py: the rules)
    assert {r["kernel_id"]: (r["layer"], r["iteration"]) for r in got.iter_rows(named=True)} == expected
    layers = Counter(layer for layer, _ in expected.values())
    assert {"conv1", "fc6", "bconv1", "bfc8"} <= set(layers)  # forward and (autograd thread) backward layers
    assert got.filter(pl.col("layer").is_in(["conv1", "conv2"]))["pass"].unique().to_list() == ["forward"]
    assert got.filter(pl.col("layer").is_in(["bconv1", "bfc6"]))["pass"].unique().to_list() == ["backward"]


def test_replays_fill_their_iterations_stages(sample_store) -> None:
    """Each replay's kernels land in its iteration, split into the stages open at the capture:
    the graph runs the same step four times, so the four iterations have the same stages."""
    stages = stage_times(sample_store, trace_id(sample_store, GRAPH)).filter(pl.col("iteration").is_not_null())
    assert stages.height == 4
    for stage in ("forward_ns", "backward_ns", "weight_update_ns", "data_copy_ns"):
        values = stages[stage]
        assert values.min() > 0 and values.max() < 1.05 * values.min(), (stage, values.to_list())
    assert (stages["backward_ns"] > stages["forward_ns"]).all()


def test_graph_nodes_are_loaded(sample_store) -> None:
    from conftest import source_count

    tid = trace_id(sample_store, GRAPH)
    rows = sample_store.execute("SELECT count(*), count(original_graph_node_id), count(DISTINCT graph_node_id) "
                                "FROM graph_nodes WHERE trace_id = ?", [tid]).fetchall()[0]
    path = sample(GRAPH + ".sqlite")
    assert rows == (source_count(path, "CUDA_GRAPH_NODE_EVENTS"),
                    source_count(path, "CUDA_GRAPH_NODE_EVENTS", "WHERE originalGraphNodeId IS NOT NULL"), 379)
    none = sample_store.execute("SELECT count(*) FROM graph_nodes WHERE trace_id = ?",
                                [trace_id(sample_store, "alexnet_b256_cudnn")]).fetchall()[0][0]
    assert none == 0


def test_idle_gaps_take_the_capture_layers(sample_store) -> None:
    """`traceq idle --by layer` puts a gap before a replayed kernel in the layer it was captured in."""
    from traceq.analysis.timeline.idle import idle_split

    frame = idle_split(sample_store, trace_id(sample_store, GRAPH), "layer")
    assert {"conv1", "fc6", "bconv1", "bfc8"} <= set(frame["layer"].drop_nulls())


def test_graph_level_replays_are_gpu_work(tmp_path) -> None:
    """nsys's default `--cuda-graph-trace=graph` records each replay as one GRAPH_TRACE row and no
    kernel rows (planted/smallkernels_graph.sqlite): each replay is one GPU operation named
    `[CUDA graph N]`, launched by its cudaGraphLaunch, so the GPU is busy while it runs (read
    with sqlite3 from the export)."""
    from pathlib import Path

    from traceq.api.loading import load_trace
    from traceq.store import open_store

    path = Path(__file__).resolve().parent.parent / "sample_traces" / "planted" / "smallkernels_graph.sqlite"
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = raw.execute('SELECT graphId, start, "end", correlationId FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE '
                       "ORDER BY start").fetchall()
    launch = dict(raw.execute("SELECT r.correlationId, s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                              "JOIN StringIds s ON s.id = r.nameId").fetchall())
    raw.close()
    assert rows and all(re.match(r"cudaGraphLaunch", launch[r[3]]) for r in rows)
    con = open_store(tmp_path / "s.duckdb", create=True)
    t = load_trace(con, path).trace_id
    got = con.execute("SELECT k.name, k.start_ns, k.end_ns, l.launch_api FROM kernels k JOIN kernel_launches l "
                      "USING (trace_id, kernel_id) WHERE k.trace_id = ? ORDER BY k.start_ns", [t]).fetchall()
    from traceq.analysis.timeline.idle import idle_totals

    busy = idle_totals(con, t)
    con.close()
    assert [(n, s, e) for n, s, e, _ in got] == [(f"[CUDA graph {g}]", s, e) for g, s, e, _ in rows]
    assert all(a and a.startswith("cudaGraphLaunch") for *_, a in got)
    assert busy.span_ns - busy.idle_ns >= sum(e - s for _, s, e, _ in rows)
