"""Structure on traces recorded other ways than the team's (docs/structure.md), each checked
against a reading of the raw file written here, not with the product's code."""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import defaultdict

import duckdb
import polars as pl
import pytest
from conftest import sample, shared

from traceq.analysis.structure.attribution import kernel_attribution
from traceq.analysis.structure.conventions import ITERATION_REGEX, stage_of
from traceq.analysis.structure.layers import stage_times
from traceq.api.loading import load_trace
from traceq.store import open_store

pytestmark = pytest.mark.xdist_group("structure_conventions")

V100_RESNET50 = ("realtraces", "kineto_json", "pytorch__kineto__resnet50_num_workers_0__worker0.1623143566756.pt.trace.json.gz")
"""pytorch/kineto's TensorBoard-plugin sample: plain torch.profiler, ProfilerStep#N recorded as
operators (2021), no annotation of the user's, no record of module names."""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    con = open_store(tmp_path_factory.mktemp("conventions") / "s.duckdb", create=True)
    ids = {}
    for key, path in (("resnet50", shared(*V100_RESNET50)), ("alexnet", sample("alexnet_b256_kineto.json"))):
        ids[key] = load_trace(con, path).trace_id
    yield con, ids
    con.close()


def _raw_passes(path) -> tuple[dict[int, str], set[int]]:
    """From the raw events: each kernel (by correlation id) is backward when the runtime call that
    launched it lies inside an autograd engine op on its thread, forward when inside another
    operator; and the correlations of the launches inside an optimizer's range (step, zero_grad)."""
    events = json.load(gzip.open(path))["traceEvents"]
    ops: dict[tuple, list] = defaultdict(list)
    steps = []
    for e in events:
        if e.get("cat") in ("Operator", "cpu_op") and e.get("ph") == "X":
            if re.search(r"ProfilerStep#\d+", e["name"]):
                continue
            if e["name"].startswith("Optimizer."):  # step and zero_grad: the weight update, no pass
                steps.append((e["ts"], e["ts"] + e["dur"]))
            ops[(e["pid"], str(e["tid"]))].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for thread in ops.values():
        thread.sort(key=lambda o: (o[0], -o[1]))
    tops: dict[tuple, list] = {}
    for key, thread in ops.items():  # outermost ops: those that start after every earlier op ended
        out, end = [], None
        for s, e, name in thread:
            if end is None or s >= end:
                out.append((s, e, name))
                end = e
            end = max(end, e)
        tops[key] = out
    passes, in_step = {}, set()
    for e in events:
        if e.get("cat") in ("Runtime", "cuda_runtime") and "correlation" in e.get("args", {}):
            key, t = (e["pid"], str(e["tid"])), e["ts"]
            thread = tops.get(key, [])
            i = bisect.bisect_right([o[0] for o in thread], t) - 1
            correlation = e["args"]["correlation"]
            if any(s <= t < f for s, f in steps):
                in_step.add(correlation)
            if i >= 0 and t < thread[i][1]:
                name = thread[i][2]
                backward = name.startswith("autograd::engine::evaluate_function") or re.search(r"Backward\d*$|AccumulateGrad", name)
                passes[correlation] = "backward" if backward else "forward"
    return passes, in_step


def test_plain_kineto_resnet50_passes_and_layers(store) -> None:
    """Every kernel's pass equals the raw reading; at least 95 % of the steady state's kernel time
    has a layer and a pass; the iterations are the file's ProfilerStep#N, the five whole ones
    each hold the same 53 convolutions forward and their backward, and the stages add up to the
    busy time."""
    con, ids = store
    t = ids["resnet50"]
    frame = kernel_attribution(con, t).join(
        con.sql(f"SELECT kernel_id, correlation_id, dur_ns FROM kernel_launches WHERE trace_id = {t}").pl(),
        on="kernel_id")
    passes, in_step = _raw_passes(shared(*V100_RESNET50))
    model = frame.filter(~pl.col("correlation_id").is_in(list(in_step)))
    expected = model.select("kernel_id", pl.col("correlation_id").replace_strict(passes, default=None).alias("pass"))
    assert expected["pass"].null_count() < 0.01 * model.height
    got = dict(model.select("kernel_id", "pass").iter_rows())
    wrong = [k for k, p in expected.iter_rows() if p is not None and got[k] != p]
    assert not wrong
    steady = frame.filter(pl.col("iteration").is_not_null())
    named = steady.filter(pl.col("layer").is_not_null() & (pl.col("pass").is_not_null() | (pl.col("stage") == "weight_update")))
    assert named["dur_ns"].sum() >= 0.95 * steady["dur_ns"].sum()
    raw_steps = {e["name"] for e in json.load(gzip.open(shared(*V100_RESNET50)))["traceEvents"]
                 if re.fullmatch(r"ProfilerStep#\d+", str(e.get("name")))}
    assert set(steady["iteration"].unique()) == raw_steps and len(raw_steps) == 6
    whole = [f"ProfilerStep#{n}" for n in range(16, 21)]  # #21: the profiler stopped inside it
    convs = steady.filter(pl.col("layer").str.starts_with("conv2d #") & pl.col("iteration").is_in(whole)).group_by(
        "iteration", "pass").agg(pl.col("layer").n_unique())
    assert set(convs["layer"]) == {53} and convs.height == 10
    stages = stage_times(con, t)
    parts = sum(stages[f"{s}_ns"] for s in ("data_copy", "forward", "backward", "weight_update", "other"))
    assert (parts == stages["busy_ns"]).all() and (stages["other_ns"] == 0).all()


def test_iterations_from_optimizer_steps(store) -> None:
    """A trace with no iteration range but two optimizer steps (the bundled AlexNet Kineto
    trace): two iterations, each ending with its step, each with the same forward layers."""
    con, ids = store
    frame = kernel_attribution(con, ids["alexnet"])
    steps = con.execute("SELECT end_ns FROM nvtx WHERE trace_id = ? AND kind = 'pushpop' AND name LIKE 'Optimizer.step%' ORDER BY 1",
                        [ids["alexnet"]]).fetchall()
    assert len(steps) == 2
    forward = frame.filter(pl.col("pass") == "forward").group_by("iteration").agg(pl.col("layer").unique().sort())
    assert sorted(forward["iteration"]) == ["step 0", "step 1"]
    assert forward["layer"][0].to_list() == forward["layer"][1].to_list()
    assert {"conv2d #5", "linear #3"} <= set(forward["layer"][0].to_list())


@pytest.mark.parametrize(("name", "iteration"), [
    ("iteration 3", True), ("step 12", True), ("ProfilerStep#7", True), ("train_step 5", True),
    ("training step 5", True), ("global_step: 9", True), ("decode 15", True), ("decode_step 2", True),
    ("iteration", False), ("stepper 3", False), ("prefill", False), ("conv1", False)])
def test_iteration_names(name: str, iteration: bool) -> None:
    assert bool(re.search(ITERATION_REGEX, name)) is iteration
    assert duckdb.sql(f"SELECT regexp_matches('{name}', '{ITERATION_REGEX}')").fetchall()[0][0] is iteration


@pytest.mark.parametrize(("name", "stage"), [
    ("forward", "forward"), ("Forward", "forward"), ("forward-compute", "forward"), ("fwd", "forward"),
    ("backward-compute", "backward"), ("## backward ##", "backward"), ("optimizer-step", "weight_update"),
    ("weight_update", "weight_update"), ("data_copy", "data_copy"),
    ("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "data_copy"),
    ("forward_layer", None), ("conv1", None), ("bforward", None)])
def test_stage_names(name: str, stage: str | None) -> None:
    assert duckdb.sql(f"SELECT {stage_of(repr(name))}").fetchall()[0][0] == stage
