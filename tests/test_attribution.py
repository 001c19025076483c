"""Kernel attribution to NVTX layers, passes, iterations and stages, checked against
independent counts on the sample and reference traces."""

from __future__ import annotations

import re
from collections import defaultdict

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
        main = ops.filter(pl.col("operation").is_in(["im2col", "col2im", "gemm"]))["dur_ns"].sum()
        assert main / total > 0.95, (layer, ops)
        assert set(group.filter(pl.col("operation") == "gemm")["library"]) == {"cuBLAS"}
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


def test_resnet50_every_kernel_maps_to_its_aten_op_and_pass(resnet50_store) -> None:
    con, tid = resnet50_store
    frame = kernel_attribution(con, tid)
    # independent: a per-thread stack sweep in Python over ranges and launches
    ranges = con.execute("SELECT pid, tid, start_ns, end_ns, name FROM nvtx WHERE trace_id = ? AND kind = 'pushpop' "
                         "ORDER BY pid, tid, start_ns, end_ns DESC", [tid]).fetchall()
    launches = con.execute("SELECT pid, launch_tid, launch_start_ns, kernel_id FROM kernel_launches "
                           "WHERE trace_id = ? ORDER BY pid, launch_tid, launch_start_ns", [tid]).fetchall()
    by_thread: dict[tuple[int, int], list] = defaultdict(list)
    for pid, t, s, e, name in ranges:
        by_thread[(pid, t)].append((s, e, name))
    events: dict[tuple[int, int], list] = defaultdict(list)
    for pid, t, at, kid in launches:
        events[(pid, t)].append((at, 1, kid))
    expected: dict[int, str | None] = {}
    for thread, items in events.items():  # one stack per thread, ranges before launches at equal times
        stack: list = []
        merged = sorted([(s, 0, -e, name) for s, e, name in by_thread[thread]] + items, key=lambda x: x[:2])
        for item in merged:
            while stack and stack[-1][1] <= item[0]:
                stack.pop()
            if item[1] == 0:
                stack.append((item[0], -item[2], item[3]))
            else:
                aten = [r[2] for r in stack if r[2].startswith("aten::")]
                expected[item[2]] = _SUFFIX.sub("", aten[-1]) if aten else None
    got = dict(frame.select("kernel_id", "layer").iter_rows())
    assert all(v is not None for v in expected.values())
    assert got == expected
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
