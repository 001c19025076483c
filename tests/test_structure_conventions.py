"""Structure on traces recorded other ways than the team's (docs/structure.md), each checked
against a reading of the raw file written here, not with the product's code."""

from __future__ import annotations

import bisect
import gzip
import json
import re
import sqlite3
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
    """From the raw events: each kernel (by correlation id) is communication when the runtime
    call that launched it lies inside a collective's `nccl:...` annotation on its thread, else
    backward when inside an autograd engine op, forward when inside another operator; and the
    correlations of the launches inside an optimizer's range (step, zero_grad)."""
    events = json.load(gzip.open(path))["traceEvents"]
    ops: dict[tuple, list] = defaultdict(list)
    steps = []
    comms: dict[tuple, list] = defaultdict(list)
    for e in events:
        if e.get("cat") in ("Operator", "cpu_op", "user_annotation") and e.get("ph") == "X":
            if e["name"].startswith("Optimizer."):  # step and zero_grad: the weight update, no pass
                steps.append((e["ts"], e["ts"] + e["dur"]))
            elif e["cat"] == "user_annotation" and re.fullmatch(r"nccl:\w+", e["name"]):  # a collective's own
                comms[(e["pid"], str(e["tid"]))].append((e["ts"], e["ts"] + e["dur"]))
            elif e["cat"] != "user_annotation" and not re.search(r"ProfilerStep#\d+", e["name"]):
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
        if e.get("cat") in ("Runtime", "cuda_runtime", "Driver", "cuda_driver") and "correlation" in e.get("args", {}):
            key, t = (e["pid"], str(e["tid"])), e["ts"]
            thread = tops.get(key, [])
            i = bisect.bisect_right([o[0] for o in thread], t) - 1
            correlation = e["args"]["correlation"]
            if any(s <= t < f for s, f in steps):
                in_step.add(correlation)
            if any(s <= t < f for s, f in comms.get(key, [])):
                passes[correlation] = "communication"
            elif i >= 0 and t < thread[i][1]:
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


CONVENTIONS = "conventions"
"""Our own recordings of a tiny GPT the ways engineers record (tools/record_conventions.py)."""


@pytest.fixture(scope="module")
def gpt(tmp_path_factory: pytest.TempPathFactory):
    from traceq.api.loading import load_run

    con = open_store(tmp_path_factory.mktemp("gpt") / "s.duckdb", create=True)
    ids = {name: load_trace(con, sample(f"{CONVENTIONS}/gpt_{name}")).trace_id
           for name in ("kineto_plain.json.gz", "kineto_compile.json.gz", "nsys_graph_infer.sqlite",
                        "nsys_train_step.sqlite")}
    load_run(con, [sample(f"{CONVENTIONS}/gpt_kineto_fsdp_rank{r}.json.gz") for r in (0, 1)], "fsdp")
    ids["fsdp0"] = int(con.execute("SELECT trace_id FROM traces WHERE name = 'gpt_kineto_fsdp_rank0'").fetchall()[0][0])
    yield con, ids
    con.close()


def _passes_match_raw(con, trace: int, path) -> pl.DataFrame:
    """kernel_attribution of `trace`, after checking that every kernel outside the optimizer
    has the pass the raw operator stack gives it."""
    frame = kernel_attribution(con, trace).join(
        con.sql(f"SELECT kernel_id, correlation_id, dur_ns FROM kernel_launches WHERE trace_id = {trace}").pl(),
        on="kernel_id")
    passes, in_step = _raw_passes(path)
    model = frame.filter(~pl.col("correlation_id").is_in(list(in_step)))
    expected = model.select("kernel_id", pl.col("correlation_id").replace_strict(passes, default=None).alias("raw"))
    assert expected["raw"].null_count() < 0.02 * model.height
    got = dict(model.select("kernel_id", "pass").iter_rows())
    assert [k for k, p in expected.iter_rows() if p is not None and got[k] != p] == []
    return frame


@pytest.mark.parametrize("name", ["kineto_plain.json.gz", "kineto_compile.json.gz"])
def test_gpt_kineto_passes_layers_and_iterations(gpt, name: str) -> None:
    """Plain and torch.compile Kineto traces of the GPT: the raw operator stack's pass for every
    kernel (the compiled backward graph, called from autograd's thread, is backward), >= 95 % of
    the profiled steps' kernel time with a layer and a pass (or in the weight update), and the
    schedule's three steps as iterations."""
    con, ids = gpt
    frame = _passes_match_raw(con, ids[name], sample(f"{CONVENTIONS}/gpt_{name}"))
    steady = frame.filter(pl.col("iteration").is_not_null())
    assert sorted(steady["iteration"].unique()) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    named = steady.filter(pl.col("layer").is_not_null()
                          & (pl.col("pass").is_not_null() | (pl.col("stage") == "weight_update")))
    assert named["dur_ns"].sum() >= 0.95 * steady["dur_ns"].sum()
    assert steady.filter(pl.col("pass") == "backward")["dur_ns"].sum() > 0
    if name == "kineto_plain.json.gz":  # the model's 17 nn.Linear (4 blocks x qkv, proj, fc1, fc2; head), each step
        linears = steady.filter((pl.col("pass") == "forward") & pl.col("layer").str.starts_with("linear #"))
        assert (linears.group_by("iteration").agg(pl.col("layer").n_unique())["layer"] == 17).all()


def test_gpt_fsdp_run_passes(gpt) -> None:
    """FSDP2 on 2 GPUs: rank 0's kernels have the raw operator stack's pass."""
    con, ids = gpt
    frame = _passes_match_raw(con, ids["fsdp0"], sample(f"{CONVENTIONS}/gpt_kineto_fsdp_rank0.json.gz"))
    assert set(frame.drop_nulls("iteration")["iteration"]) == {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"}


def test_cuda_graph_inference_decode_steps(gpt) -> None:
    """CUDA-graph inference under nsys: each replayed kernel's iteration is the `decode N` range
    around its replay's launch (an SQL of the raw export's own, below); all replayed work is in
    the layer 'CUDA graph' (its capture was outside every range), the prefill in 'prefill'."""
    con, ids = gpt
    path = sample(f"{CONVENTIONS}/gpt_nsys_graph_infer.sqlite")
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    expected = {c: v for c, v in raw.execute("""
        SELECT k.correlationId, coalesce(n.text, s.value) FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME a ON a.correlationId = k.correlationId
        JOIN NVTX_EVENTS n ON n.start <= a.start AND a.start < n."end"
        LEFT JOIN StringIds s ON s.id = n.textId
        WHERE k.graphNodeId IS NOT NULL""").fetchall() if re.fullmatch(r"decode \d+", v or "")}
    t = ids["nsys_graph_infer.sqlite"]
    frame = kernel_attribution(con, t).join(
        con.sql(f"SELECT kernel_id, correlation_id, graph_node_id FROM kernels WHERE trace_id = {t}").pl(), on="kernel_id")
    replayed = frame.filter(pl.col("graph_node_id").is_not_null() & pl.col("correlation_id").is_in(list(expected)))
    assert replayed.height == 16 * replayed.filter(pl.col("iteration") == "decode 0").height > 0
    assert all(expected[c] == i for c, i in replayed.select("correlation_id", "iteration").iter_rows())
    assert set(replayed["layer"]) == {"CUDA graph"} and set(replayed["attribution"]) == {"graph launch"}
    assert set(replayed["pass"]) == {"forward"}  # inference: no range around the replay says otherwise
    assert "prefill" in set(frame["layer"].drop_nulls())


def test_train_step_ranges_with_megatron_stages(gpt) -> None:
    """nsys with only `train_step N` and forward-compute / backward-compute / optimizer-step
    ranges: three iterations; each kernel's stage is the range its launch lies in (raw SQL)."""
    con, ids = gpt
    path = sample(f"{CONVENTIONS}/gpt_nsys_train_step.sqlite")
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = {"forward-compute": "forward", "backward-compute": "backward", "optimizer-step": "weight_update"}
    expected = {c: names[v] for c, v in raw.execute("""
        SELECT k.correlationId, coalesce(n.text, s.value) FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME a ON a.correlationId = k.correlationId
        JOIN NVTX_EVENTS n ON n.start <= a.start AND a.start < n."end"
        LEFT JOIN StringIds s ON s.id = n.textId""").fetchall() if v in names}
    t = ids["nsys_train_step.sqlite"]
    frame = kernel_attribution(con, t).join(
        con.sql(f"SELECT kernel_id, correlation_id FROM kernels WHERE trace_id = {t}").pl(), on="kernel_id")
    assert len(expected) == frame.height
    assert all(expected[c] == s for c, s in frame.select("correlation_id", "stage").iter_rows())
    assert sorted(frame["iteration"].unique()) == ["train_step 0", "train_step 1", "train_step 2"]
    stages = stage_times(con, t)
    parts = sum(stages[f"{s}_ns"] for s in ("data_copy", "forward", "backward", "weight_update", "other"))
    assert (parts == stages["busy_ns"]).all() and (stages["backward_ns"] > stages["forward_ns"]).all()


def _raw_modules(path) -> dict[int, str]:
    """From the raw events of a `with_modules` trace: for each kernel (by correlation id) whose
    launching runtime call lies under an operator on the main thread, the innermost
    `nn.Module: X` frame of that thread open when its outermost operator began (the module
    that called the op)."""
    events = json.load(gzip.open(path))["traceEvents"]
    modules: dict[tuple, list] = defaultdict(list)
    ops: dict[tuple, list] = defaultdict(list)
    calls = {}
    for e in events:
        key = (e.get("pid"), str(e.get("tid")))
        if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: "):
            modules[key].append((e["ts"], e["ts"] + e["dur"], e["name"][len("nn.Module: "):]))
        elif e.get("cat") == "cpu_op":
            ops[key].append((e["ts"], e["ts"] + e["dur"]))
        elif e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            calls[e["args"]["correlation"]] = (key, e["ts"])
    expected = {}
    for corr, (key, at) in calls.items():
        around = [o for o in ops[key] if o[0] <= at < o[1]]
        if not around:
            continue
        top = min(around, key=lambda o: (o[0], -o[1]))  # the outermost operator
        inside = [m for m in modules[key] if m[0] <= top[0] < m[1]]
        if inside:
            expected[corr] = max(inside, key=lambda m: (m[0], -m[1]))[2]  # the innermost frame
    return expected


def test_with_modules_names_layers(tmp_path) -> None:
    """`with_modules=True`: every forward kernel launched under a module takes the innermost
    module frame around its op (raw events, above) as its layer, attribution 'module'; the
    backward kernels of the model's Linear modules take the same names through the autograd
    link; >= 95 % of the profiled steps' kernel time has a layer and a pass or the update."""
    path = sample(f"{CONVENTIONS}/gpt_kineto_modules.json.gz")
    con = open_store(tmp_path / "m.duckdb", create=True)
    t = load_trace(con, path).trace_id
    frame = kernel_attribution(con, t).join(
        con.sql(f"SELECT kernel_id, correlation_id, dur_ns FROM kernel_launches WHERE trace_id = {t}").pl(),
        on="kernel_id")
    expected = _raw_modules(path)
    forward = frame.filter((pl.col("pass") == "forward") & pl.col("correlation_id").is_in(list(expected)))
    assert forward.height > 250  # 87 a step
    assert [(c, layer) for c, layer in forward.select("correlation_id", "layer").iter_rows()
            if expected[c] != layer] == []
    assert set(forward["attribution"]) == {"module"}
    backward = set(frame.filter(pl.col("pass") == "backward")["layer"].drop_nulls())
    assert {f"Linear_{n}" for n in range(17)} <= backward
    steady = frame.filter(pl.col("iteration").is_not_null())
    named = steady.filter(pl.col("layer").is_not_null()
                          & (pl.col("pass").is_not_null() | (pl.col("stage") == "weight_update")))
    assert named["dur_ns"].sum() >= 0.95 * steady["dur_ns"].sum()
    con.close()


def test_nccl_ranges_are_the_communication_pass(tmp_path) -> None:
    """NCCL's own NVTX ranges (domain NCCL) name their kernels' layer and give them the pass
    'communication': in the DDP sample, every kernel whose launching call lies in an NCCL range
    of its thread (raw SQL of the export) and no other; their stage stays the stage range's."""
    path = sample("ddp_resnet18_2gpu.sqlite")
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    expected = {(c, p): v for c, p, v in raw.execute("""
        SELECT k.correlationId, k.globalPid / 16777216 % 16777216, coalesce(n.text, s.value)
        FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME a ON a.correlationId = k.correlationId AND a.globalTid / 16777216 = k.globalPid / 16777216
        JOIN NVTX_EVENTS n ON n.globalTid = a.globalTid AND n.start <= a.start AND a.start < n."end"
        LEFT JOIN StringIds s ON s.id = n.textId
        WHERE n.domainId IN (SELECT domainId FROM NVTX_EVENTS WHERE eventType = 75 AND text = 'NCCL')""").fetchall()}
    assert len(expected) == 50
    con = open_store(tmp_path / "d.duckdb", create=True)
    t = load_trace(con, path).trace_id
    frame = kernel_attribution(con, t).join(
        con.sql(f"SELECT kernel_id, correlation_id, pid FROM kernels WHERE trace_id = {t}").pl(), on="kernel_id")
    comm = frame.filter(pl.col("pass") == "communication")
    assert sorted((c, p, layer) for c, p, layer in comm.select("correlation_id", "pid", "layer").iter_rows()) == \
        sorted((c, p, v) for (c, p), v in expected.items())
    assert set(comm["stage"]) <= {"forward", "backward"}
    con.close()
