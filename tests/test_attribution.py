"""Kernel attribution to NVTX layers, passes, iterations and stages, checked against
independent counts on the sample and reference traces."""

from __future__ import annotations

import bisect
import itertools
import re
from collections import Counter, defaultdict

import polars as pl
import pytest
from conftest import trace_id

from traceq.analysis.structure.attribution import gpu_activity, kernel_attribution
from traceq.analysis.structure.conventions import STAGES
from traceq.analysis.structure.layers import attributed_kernels, library_times, stage_times


def _enclosing_counts(con, tid: int) -> dict[str, int]:
    """Kernels whose launch lies inside a range of each name on the launching thread (quadratic
    join, fine on small traces): an independent count of what attribution should give."""
    rows = con.execute(
        """SELECT n.name, count(*) FROM kernel_launches k JOIN nvtx n
           ON n.trace_id = k.trace_id AND n.pid = k.pid AND n.tid = k.launch_tid
          AND n.kind = 'pushpop' AND n.start_ns <= k.launch_start_ns AND k.launch_start_ns < n.end_ns
           WHERE k.trace_id = ? GROUP BY 1""", [tid]).fetchall()
    return {name: count for name, count in rows}


@pytest.mark.parametrize("name", ["alexnet_b256_cudnn", "lenet_b256_cudnn"])
def test_every_kernel_in_a_layer_range_gets_that_layer_and_pass(sample_store, name: str) -> None:
    tid = trace_id(sample_store, name)
    frame = kernel_attribution(sample_store, tid)
    assert frame.height == sample_store.execute(
        "SELECT count(*) FROM kernels WHERE trace_id = ?", [tid]).fetchall()[0][0]
    expected = {n: c for n, c in _enclosing_counts(sample_store, tid).items()
                if n not in STAGES and not n.startswith("iteration")}
    assert {"conv1", "bconv2", "fc1" if name.startswith("lenet") else "fc6"} <= set(expected)
    in_range = frame.filter(pl.col("attribution") == "range")  # the others: tests/test_inference.py
    got = dict(in_range.group_by("layer").len().iter_rows())
    assert got == expected
    passes = dict(in_range.select("layer", "pass").unique().iter_rows())
    for layer, pass_ in passes.items():
        assert pass_ == ("backward" if layer.startswith("b") and layer[1:] in passes else "forward"), layer
    # backward layers run on the autograd thread; their iteration and stage come by time
    bconv = frame.filter(pl.col("layer") == "bconv2")
    assert set(bconv["stage"]) == {"backward"}
    assert bconv["nvtx_path"].str.contains(r"^iteration \d+/backward/bconv2$").all()
    # stages by time: every kernel lies in one iteration, in one of the four stages
    assert frame["iteration"].null_count() == 0
    assert set(frame["stage"]) <= set(STAGES)


def test_stage_counts_match_time_ranges(sample_store) -> None:
    tid = trace_id(sample_store, "alexnet_b256_cudnn")
    frame = kernel_attribution(sample_store, tid)
    by_time = dict(sample_store.execute(
        """SELECT n.name, count(*) FROM kernel_launches k JOIN nvtx n
           ON n.trace_id = k.trace_id AND n.pid = k.pid AND n.start_ns <= k.launch_start_ns
          AND k.launch_start_ns < n.end_ns AND n.name IN ('data_copy', 'forward', 'backward', 'weight_update')
           WHERE k.trace_id = ? GROUP BY 1""", [tid]).fetchall())
    assert dict(frame.group_by("stage").len().iter_rows()) == by_time


def test_iteration_regex_is_configurable(sample_store) -> None:
    tid = trace_id(sample_store, "lenet_b256_cudnn")
    frame = kernel_attribution(sample_store, tid, iteration_regex=r"^no such range$")
    assert frame["iteration"].null_count() == frame.height
    assert frame.filter(pl.col("layer") == "conv1")["pass"].to_list() != []


def test_nocudnn_convolutions_are_im2col_col2im_and_cublas_gemm(sample_store) -> None:
    k = attributed_kernels(sample_store, trace_id(sample_store, "alexnet_b256_nocudnn"))
    conv = k.filter(pl.col("layer").str.contains(r"^b?conv\d$"))
    assert set(conv["layer"]) >= {f"conv{i}" for i in range(1, 6)}
    for layer, group in conv.group_by("layer"):
        ops = group.group_by("operation").agg(pl.col("dur_ns").sum())
        total = group["dur_ns"].sum()
        # cuBLAS's GEMMs with their split-K sums (a reduction kernel of their own, no FLOPs)
        gemm = group.filter((pl.col("operation") == "gemm") | pl.col("name").str.contains("splitKreduce_kernel"))
        main = ops.filter(pl.col("operation").is_in(["im2col", "col2im"]))["dur_ns"].sum() + gemm["dur_ns"].sum()
        assert main / total > 0.95, (layer, ops)
        assert set(gemm["library"]) == {"cuBLAS"}
        assert group.filter(pl.col("operation").is_in(["im2col", "col2im"])).height > 0
    assert "cuDNN" not in set(library_times(sample_store, trace_id(sample_store, "alexnet_b256_nocudnn"))["library"])


def test_ddp_nccl_kernels_are_communication_on_both_devices(sample_store) -> None:
    k = attributed_kernels(sample_store, trace_id(sample_store, "ddp_resnet18_2gpu"))
    nccl = k.filter(pl.col("name").str.starts_with("ncclDevKernel") | pl.col("name").str.contains("nccl"))
    assert nccl.height > 0
    assert set(nccl["device_id"]) == {0, 1}
    assert set(nccl["library"]) == {"NCCL"} and set(nccl["operation"]) == {"communication"}
    assert set(nccl.filter(pl.col("name").str.contains("AllReduce"))["stage"]) == {"backward"}
    stages = stage_times(sample_store, trace_id(sample_store, "ddp_resnet18_2gpu"))
    assert set(stages["device_id"]) == {0, 1}
    assert (stages["idle_ns"] == stages["span_ns"] - stages["busy_ns"]).all()
    assert (stages["busy_ns"] <= stages["span_ns"]).all()


@pytest.mark.parametrize("name", ["ddp_resnet18_2gpu", "alexnet_b256_cudnn", "badloop_mlp"])
def test_stage_busy_time_is_the_union_of_each_iterations_work(sample_store, name: str) -> None:
    """busy_ns per iteration and device: the time covered by its kernels and copies, merged here
    one interval after another in Python; the span from their first start to last end."""
    t = trace_id(sample_store, name)
    ops = gpu_activity(sample_store, t).sort("start_ns")
    want = {}
    for (iteration, device), group in ops.group_by("iteration", "device_id"):
        busy, reach = 0, None
        for start, end in group.select("start_ns", "end_ns").iter_rows():
            if reach is None or start >= reach:
                busy, reach = busy + end - start, end
            elif end > reach:
                busy, reach = busy + end - reach, end
        want[(iteration, device)] = (busy, group["end_ns"].max() - group["start_ns"].min())
    got = {(r["iteration"], r["device_id"]): (r["busy_ns"], r["span_ns"])
           for r in stage_times(sample_store, t).iter_rows(named=True)}
    assert got == want and len(want) > 1


def test_stage_times_add_up(sample_store) -> None:
    tid = trace_id(sample_store, "alexnet_b256_cudnn")
    frame = stage_times(sample_store, tid)
    assert frame["iteration"].to_list() == [f"iteration {i}" for i in range(4)]
    kernel_ns = sample_store.execute("SELECT sum(dur_ns) FROM kernels WHERE trace_id = ?", [tid]).fetchall()[0][0]
    memop_ns = sample_store.execute("SELECT sum(dur_ns) FROM memops WHERE trace_id = ?", [tid]).fetchall()[0][0]
    stage_sum = sum(frame[f"{s}_ns"].sum() for s in (*STAGES, "other"))
    assert stage_sum == kernel_ns + memop_ns
    assert (frame["forward_ns"] < frame["backward_ns"]).all()  # the paper: about 40 % / 60 %


_SUFFIX = re.compile(r",\s*(seq|op_id|sizes|input_op_ids)\s*=.*$")


def _op_sequence_layers(con, tid: int) -> dict[int, str | None]:
    """Each kernel's layer as the op-sequence convention defines it (docs/structure.md), computed
    here on its own: a stack per thread over the emit_nvtx op ranges; a launch's outermost op is
    its top op; a forward top op is `<op> #k`, the k-th of its name in its iteration; a backward
    top op takes the layer of the forward top op holding the last op that recorded its autograd
    sequence number; ops in an optimizer's range are left out (None)."""
    op = re.compile(r"^(aten|autograd|torch)::|Backward\d*(,|$)|^AccumulateGrad|, (seq|op_id) = ")
    rows = con.execute("SELECT pid, tid, start_ns, end_ns, name FROM nvtx WHERE trace_id = ? AND kind = 'pushpop' "
                       "ORDER BY pid, tid, start_ns, end_ns DESC", [tid]).fetchall()
    iterations = sorted((s, e, n) for p, t, s, e, n in rows if re.fullmatch(r"iteration \d+", n))
    optimizers = [(s, e) for p, t, s, e, n in rows if n.startswith("Optimizer.")]

    def iteration(at: int) -> str | None:
        return next((n for s, e, n in iterations if s <= at < e), None)

    tops: list[dict] = []  # in start order per thread
    for (pid, t), group in itertools.groupby([r for r in rows if op.search(r[4]) and not r[4].startswith("Optimizer.")],
                                            key=lambda r: (r[0], r[1])):
        end = None
        for _, _, s, e, name in group:
            seq = re.search(r", seq = (\d+)", name)
            entry = (s, _SUFFIX.sub("", name), int(seq.group(1)) if seq else None)
            if end is None or s >= end:
                tops.append({"pid": pid, "tid": t, "start": s, "end": e, "ops": [entry]})
                end = e
            else:
                tops[-1]["ops"].append(entry)
    counts: Counter = Counter()
    made: dict[tuple[int, int], tuple[int, str]] = {}
    for top in sorted(tops, key=lambda x: x["start"]):
        name = top["ops"][0][1]
        top["backward"] = bool(re.search(r"^autograd::engine::evaluate_function|Backward\d*$|AccumulateGrad", name))
        short = name
        for prefix in (r"autograd::engine::evaluate_function:\s*", "aten::", "torch::autograd::"):
            short = re.sub("^" + prefix, "", short)
        top["label"] = None
        if any(s <= top["start"] < e for s, e in optimizers):
            continue
        if not top["backward"]:
            key = (iteration(top["start"]), short)
            counts[key] += 1
            top["label"] = f"{short} #{counts[key]}"
            for start, _, seq in top["ops"]:
                if seq is not None and made.get((top["pid"], seq), (-1,))[0] < start:
                    made[(top["pid"], seq)] = (start, top["label"])
        else:
            top["short"] = short
    for top in tops:
        if top.get("backward") and top["label"] is None and "short" in top:
            link = next((seq for _, n, seq in top["ops"] if seq is not None and re.search(r"Backward\d*$", n)
                         and not n.startswith("autograd::")), None)
            top["label"] = made.get((top["pid"], link), (0, top["short"]))[1]
    by_thread: dict[tuple[int, int], list] = defaultdict(list)
    for top in tops:
        by_thread[(top["pid"], top["tid"])].append(top)
    launches = con.execute("SELECT pid, launch_tid, launch_start_ns, kernel_id FROM kernel_launches "
                           "WHERE trace_id = ?", [tid]).fetchall()
    expected: dict[int, str | None] = {}
    for pid, t, at, kid in launches:
        starts = [x["start"] for x in by_thread[(pid, t)]]
        i = bisect.bisect_right(starts, at) - 1
        inside = i >= 0 and at < by_thread[(pid, t)][i]["end"]
        expected[kid] = by_thread[(pid, t)][i]["label"] if inside else None
    return expected


def test_resnet50_every_kernel_gets_its_op_sequence_layer_and_pass(resnet50_store) -> None:
    """emit_nvtx without layer ranges: every kernel under a model op gets its op-sequence layer,
    equal to an independent reading of the raw ranges, and the 53 layers a ResNet-50 has in
    forward (conv, batch norm, ...) each show up in every one of the 40 iterations."""
    con, tid = resnet50_store
    frame = kernel_attribution(con, tid)
    expected = _op_sequence_layers(con, tid)
    got = dict(frame.select("kernel_id", "layer").iter_rows())
    labelled = {k: v for k, v in expected.items() if v is not None}
    assert len(labelled) == frame.filter(pl.col("stage") != "weight_update").height  # all but the optimizer's
    assert {k: got[k] for k in labelled} == labelled
    forward = frame.filter(pl.col("pass") == "forward").group_by("layer").agg(pl.col("iteration").n_unique())
    assert forward.filter(pl.col("layer").str.starts_with("conv2d #"))["layer"].n_unique() == 53
    assert (forward.filter(pl.col("layer").str.contains(" #"))["iteration"] == 40).all()
    # pass: by the backward / forward stage ranges on the main thread, by time
    stage_of = dict(con.execute(
        """SELECT k.kernel_id, any_value(n.name) FROM kernel_launches k JOIN nvtx n ON n.trace_id = k.trace_id
           AND n.pid = k.pid AND n.name IN ('forward', 'backward') AND n.start_ns <= k.launch_start_ns
           AND k.launch_start_ns < n.end_ns WHERE k.trace_id = ? GROUP BY 1""", [tid]).fetchall())
    passes = dict(frame.select("kernel_id", "pass").iter_rows())
    assert {kid: passes[kid] for kid in stage_of} == stage_of
    assert frame["iteration"].n_unique() == 40


@pytest.mark.parametrize("name", ["alexnet_b256_cudnn", "ddp_resnet18_2gpu", "alexnet_b64_nocache"])
def test_without_paths_the_rest_is_the_same(sample_store, name: str) -> None:
    tid = trace_id(sample_store, name)
    full = kernel_attribution(sample_store, tid)
    light = kernel_attribution(sample_store, tid, paths=False)
    keys = ["kernel_id", "layer", "pass", "iteration", "stage"]
    assert light.select(keys).equals(full.select(keys))
    assert light["nvtx_path"].null_count() == light.height and full["nvtx_path"].null_count() < full.height


def test_resnet50_without_paths_is_the_same(resnet50_store) -> None:
    con, tid = resnet50_store
    keys = ["kernel_id", "layer", "pass", "iteration", "stage"]
    assert kernel_attribution(con, tid, paths=False).select(keys).equals(kernel_attribution(con, tid).select(keys))
