"""Kineto traces with layer ranges (sample_traces/*_layers_kineto.json.gz, our H200 recordings):
FLOPs per operator against PyTorch's own count, and layers, stages, ce and compare against the
nsys capture of the same AlexNet step."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from conftest import sample, trace_id
from typer.testing import CliRunner

from traceq.analysis.compare.side_by_side import compare_runs
from traceq.analysis.efficiency.flops import FLOP_OPS, op_flops
from traceq.analysis.structure.layers import layer_times, stage_times
from traceq.cli import app
from traceq.store import open_store

pytestmark = pytest.mark.xdist_group("kineto_layers")  # one worker builds its module fixtures once (--dist loadgroup)

KINETO = ("alexnet_b256_fp32_layers_kineto", "alexnet_b256_amp_layers_kineto", "resnet50_b32_amp_layers_kineto")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    """The four traces loaded by `traceq load` (names: the files' without .json.gz or .sqlite),
    then opened read-only, as the commands open it."""
    db = tmp_path_factory.mktemp("layers") / "layers.duckdb"
    files = [str(sample(f"{name}.json.gz")) for name in KINETO] + [str(sample("alexnet_b256_cudnn.sqlite"))]
    result = CliRunner().invoke(app, ["load", *files, "--db", str(db)])
    assert result.exit_code == 0, result.output
    con = open_store(db, read_only=True)
    ids = {name: trace_id(con, name) for name in (*KINETO, "alexnet_b256_cudnn")}
    yield con, ids, db
    con.close()


def pytorch_flops(name: str) -> list[tuple[str, str, int]]:
    """PyTorch's FLOPs per op (`FunctionEvent.flops`, written beside the trace by
    tools/record_training.py): (op, input shapes as JSON, flops), sorted; an op inside another op
    of the same name on its thread (autocast's aten::conv2d inside aten::conv2d) counts once, as
    the outer one, and only the ops traceq counts (elementwise aten::mul it does not)."""
    events = json.loads(gzip.decompress(sample(f"{name}.flops.json.gz").read_bytes()))
    outer = [e for e in events if e["name"] in FLOP_OPS and not any(
        o is not e and o["name"] == e["name"] and o["thread"] == e["thread"]
        and o["start_us"] <= e["start_us"] and e["end_us"] <= o["end_us"] for o in events)]
    return sorted((e["name"], json.dumps(e["input_shapes"]), e["flops"]) for e in outer)


@pytest.mark.parametrize("name", KINETO)
def test_operator_flops_equal_pytorchs(store, name: str) -> None:
    """Each op's FLOPs (op_flops) equal PyTorch's for the op PyTorch counts: the op itself, or the
    first such op inside it (traceq counts aten::linear, PyTorch the aten::addmm it calls)."""
    con, ids, _ = store
    pytorch = pytorch_flops(name)
    counted = ", ".join(f"'{op}'" for op in {op for op, _, _ in pytorch})
    counted_ops = con.sql(f"""
        SELECT o.pid, o.tid, o.start_ns, arg_min(i.name, i.start_ns) AS name, arg_min(i.input_dims, i.start_ns) AS dims
        FROM operators o JOIN operators i ON i.trace_id = o.trace_id AND i.pid = o.pid AND i.tid = o.tid
             AND o.start_ns <= i.start_ns AND i.end_ns <= o.end_ns AND i.name IN ({counted})
        WHERE o.trace_id = {ids[name]} GROUP BY ALL""").pl()
    ops = op_flops(con, ids[name]).join(counted_ops, on=["pid", "tid", "start_ns"], how="inner")
    ours = sorted((op, json.dumps(json.loads(dims)), flops)
                  for op, dims, flops in ops.select("name", "dims", "flops").iter_rows())
    assert len(pytorch) >= 16 and ours == pytorch


def test_layers_and_stages_match_the_nsys_capture(store) -> None:
    """The Kineto trace's record_function ranges carry the nsys capture's NVTX names: the same
    (layer, pass) rows, the weight update too: the Kineto trace has PyTorch's own Optimizer.step
    range around it, the nsys capture none, and both name its kernels' layer 'optimizer' (an
    optimizer's range is a stage, not a layer); the same iterations, every stage with GPU time
    in both."""
    con, ids, _ = store
    kineto, nsys = ids["alexnet_b256_fp32_layers_kineto"], ids["alexnet_b256_cudnn"]

    def layers(trace: int) -> set[tuple[str, str | None]]:
        return {(layer, p) for layer, p in layer_times(con, trace).select("layer", "pass").iter_rows() if layer}

    both = layers(kineto) & layers(nsys)
    assert len(both) >= 35
    assert ("optimizer", None) in both
    assert layers(nsys) == layers(kineto)
    stages = {t: stage_times(con, t) for t in (kineto, nsys)}
    assert stages[kineto]["iteration"].to_list() == ["iteration 0", "iteration 1"]
    for column in ("data_copy_ns", "forward_ns", "backward_ns", "weight_update_ns"):
        assert (stages[kineto][column] > 0).all() and (stages[nsys][column] > 0).all()


def test_compare_by_layer_pairs_the_layers(store) -> None:
    """`compare --by layer`: one row per layer present in both runs, with both sides filled."""
    con, ids, db = store
    frame, per_iteration = compare_runs(con, ids["alexnet_b256_cudnn"], ids["alexnet_b256_fp32_layers_kineto"])
    paired = frame.filter(pl.col("layer").is_not_null() & pl.col("a_ns").is_not_null() & pl.col("b_ns").is_not_null())
    assert per_iteration and paired.height == paired.select("layer", "pass").unique().height >= 35
    result = CliRunner().invoke(app, ["compare", "alexnet_b256_cudnn", "alexnet_b256_fp32_layers_kineto",
                                      "--by", "layer", "--db", str(db), "-f", "csv"])
    assert result.exit_code == 0, result.output
    assert "conv1,forward" in result.output


def test_ce_on_the_layered_trace(store) -> None:
    """`ce` on the Kineto trace: FLOPs per layer from the operators' shapes, a CE for each conv
    and fc layer of both passes."""
    from traceq.analysis.efficiency.ce import ce_table

    con, ids, _ = store
    frame = ce_table(con, ids["alexnet_b256_fp32_layers_kineto"], "layer")
    with_flops = set(frame.filter(pl.col("flops") > 0)["layer"].to_list())
    assert {f"{p}{layer}" for p in ("", "b") for layer in ("conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8")} <= with_flops
