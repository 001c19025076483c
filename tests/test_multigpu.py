"""comm, overlap and ranks against an independent reading of the traces.

The references are computed here with a few lines of plain Python over the raw files (sqlite3
for the nsys DDP sample, json for the DLRM Kineto ranks): each NCCL kernel's interval, its
process's `iteration N` / `ProfilerStep#N` range around the call that launched it, unions and
intersections of intervals by a sort and a scan. Nothing here calls traceq's analysis code.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest
from conftest import DLRM, sample, shared

from traceq.analysis.multigpu.comm import comm_table
from traceq.analysis.multigpu.overlap import overlap_table
from traceq.analysis.multigpu.ranks import IDLE, late_collectives, rank_iterations
from traceq.api.loading import load_trace
from traceq.store import open_store, resolve_run

DDP = sample("ddp_resnet18_2gpu.sqlite")


def union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def length(intervals: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in intervals)


def intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    total, i, j = 0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def around(ranges: list[tuple[int, int, str]], t: int | None) -> str | None:
    """The name of the range containing t."""
    return next((name for s, e, name in ranges if t is not None and s <= t <= e), None)


def ddp_work(stages: bool = False) -> list[tuple]:
    """(rank, iteration, start, end, name, kind) of every kernel, memcpy and memset of the DDP
    sample: rank = GPU order, iteration = the process's 'iteration N' range around the call;
    with `stages`, the stage range around it too (forward, backward, ...) as a 7th item."""
    con = sqlite3.connect(f"file:{DDP}?mode=ro", uri=True)
    pid = "(globalPid >> 24) & 16777215"
    calls = {(p, c): t for p, c, t in con.execute(
        "SELECT (globalTid >> 24) & 16777215, correlationId, start FROM CUPTI_ACTIVITY_KIND_RUNTIME")}
    iterations, stage_ranges = defaultdict(list), defaultdict(list)
    for p, s, e, text in con.execute("SELECT (globalTid >> 24) & 16777215, start, end, text FROM NVTX_EVENTS "
                                     "WHERE text LIKE 'iteration %' OR text IN ('forward', 'backward')"):
        (iterations if text.startswith("iteration") else stage_ranges)[p].append((s, e, text))
    devices = sorted({d for (d,) in con.execute("SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL")})
    work = []
    for table, name in (("CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName", "s.value"),
                        ("CUPTI_ACTIVITY_KIND_MEMCPY k", "NULL"), ("CUPTI_ACTIVITY_KIND_MEMSET k", "NULL")):
        for device, p, corr, start, end, text in con.execute(
                f"SELECT deviceId, {pid}, correlationId, start, end, {name} FROM {table}"):
            kind = "memory" if text is None else "comm" if text.startswith("nccl") else "compute"
            launch = calls.get((p, corr))
            item = (devices.index(device), around(iterations[p], launch), start, end, text, kind)
            work.append((*item, around(stage_ranges[p], launch)) if stages else item)
    con.close()
    return work


def kineto_work(path: Path, step: str = "ProfilerStep#") -> list[tuple]:
    """The same for one Kineto rank file: rank = distributedInfo.rank, iteration = the
    `step`N range (ProfilerStep#N, or a record_function range such as 'iteration N') of the
    process around the launching runtime or driver call, times in ns (the file's decimal
    microseconds times 1000, rounded half up)."""
    from decimal import ROUND_HALF_UP, Decimal

    def ns(us: Decimal | int) -> int:
        return int((Decimal(us) * 1000).to_integral_value(ROUND_HALF_UP))

    with gzip.open(path, "rb") as f:
        trace = json.load(f, parse_float=Decimal)
    rank = trace["distributedInfo"]["rank"]
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    calls = {e["args"]["correlation"]: ns(e["ts"]) for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    steps = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"]) for e in events
             if e.get("cat") == "user_annotation" and e["name"].startswith(step)]
    work = []
    for e in events:
        cat = e.get("cat")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        # communication: NCCL/RCCL kernels, and PyTorch's symmetric-memory all-reduce (B200)
        comm = "nccl" in e["name"] or "multimem_all_reduce" in e["name"]
        kind = "memory" if cat != "kernel" else "comm" if comm else "compute"
        launch = calls.get(e.get("args", {}).get("correlation"))
        work.append((rank, around(steps, launch), ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"], kind))
    return work


def dlrm_work() -> list[tuple]:
    """`kineto_work` of the 8 DLRM rank files."""
    return [item for path in DLRM for item in kineto_work(path)]


def independent_overlap(work: list[tuple]) -> dict[tuple, dict[str, int]]:
    groups = defaultdict(list)
    for rank, iteration, start, end, _, kind in work:
        groups[(rank, iteration)].append((start, end, kind))
    out = {}
    for key, items in groups.items():
        comp = union([(s, e) for s, e, k in items if k == "compute"])
        comm = union([(s, e) for s, e, k in items if k == "comm"])
        span = max(e for _, e, _ in items) - min(s for s, _, _ in items)
        out[key] = {"span_ns": span, "compute_ns": length(comp), "comm_ns": length(comm),
                    "overlap_ns": intersection(comp, comm),
                    "idle_ns": span - length(union([(s, e) for s, e, _ in items]))}
    return out


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory):
    con = open_store(tmp_path_factory.mktemp("ddp") / "s.duckdb", create=True)
    load_trace(con, DDP)
    yield con, resolve_run(con, "ddp_resnet18_2gpu")[0]
    con.close()


@pytest.fixture(scope="module")
def dlrm(dlrm_store):
    return dlrm_store


@pytest.mark.parametrize("which", ["ddp", "dlrm"])
def test_communication_time_per_rank_is_the_sum_of_nccl_kernels(which: str, request) -> None:
    con, run = request.getfixturevalue(which)
    work = ddp_work() if which == "ddp" else dlrm_work()
    expected = defaultdict(int)
    for rank, _, start, end, _, kind in work:
        if kind == "comm":
            expected[rank] += end - start
    frame = comm_table(con, run).group_by("rank").agg(pl.col("total_ns").sum())
    assert dict(frame.iter_rows()) == dict(expected)
    assert len(expected) == (2 if which == "ddp" else 8)


@pytest.mark.parametrize("which", ["ddp", "dlrm"])
def test_overlap_equals_an_interval_computation(which: str, request) -> None:
    con, run = request.getfixturevalue(which)
    expected = independent_overlap(ddp_work() if which == "ddp" else dlrm_work())
    frame = overlap_table(con, run)
    got = {(r["rank"], r["iteration"]): {k: r[k] for k in ("span_ns", "compute_ns", "comm_ns", "overlap_ns", "idle_ns")}
           for r in frame.iter_rows(named=True)}
    assert got == expected
    for r in frame.filter(pl.col("comm_ns") > 0).iter_rows(named=True):
        assert r["hidden_pct"] == pytest.approx(100 * r["overlap_ns"] / r["comm_ns"])
        assert r["exposed_ns"] == r["comm_ns"] - r["overlap_ns"]
    assert sum(v["overlap_ns"] for v in expected.values()) > 0


RANK_FILES = [
    "AMD-AGI__TraceLens__mi300__resnet_act_checkpoint.json.gz",  # RCCL on MI300X, rank 0 of 8, 17 kernels
    "AMD-AGI__TraceLens__b200__eager_trace.json.gz",  # B200, rank 0 of 8, NCCL all-gather, 73 multimem all-reduces
    "facebookresearch__HolisticTraceAnalysis__trace_diff__control.json.gz",  # A100, rank 3 of 8, 60 kernels
]
"""Corpus files that are one rank of a larger job (distributedInfo), beyond the DLRM set."""


@pytest.mark.parametrize("name", RANK_FILES)
def test_one_rank_of_a_larger_job(name: str, tmp_path: Path) -> None:
    """A file loaded alone is a run of its one rank (the rank distributedInfo names); its
    communication time and overlap per iteration equal the independent reading of the JSON."""
    path = shared("realtraces", "kineto_json", name)
    con = open_store(tmp_path / "s.duckdb", create=True)
    load_trace(con, path)
    run = resolve_run(con, None)[0]
    work = kineto_work(path)
    comm = [(rank, end - start) for rank, _, start, end, _, kind in work if kind == "comm"]
    assert comm, "no NCCL/RCCL kernel in the file"
    frame = comm_table(con, run).group_by("rank").agg(pl.col("total_ns").sum(), pl.col("calls").sum())
    assert frame.rows() == [(comm[0][0], sum(t for _, t in comm), len(comm))]
    overlap = overlap_table(con, run)
    got = {(r["rank"], r["iteration"]): {k: r[k] for k in ("span_ns", "compute_ns", "comm_ns", "overlap_ns", "idle_ns")}
           for r in overlap.iter_rows(named=True)}
    assert got == independent_overlap(work)
    # sizes where the kernels carry them (not in HTA's file: its sizes are on annotations, as in
    # the DLRM test): bytes = max(In, Out msg nelems) x the dtype's size, bus bandwidth = nccl-tests'
    # factor of the group size x bytes / the kernel's time
    factors = {"allreduce": lambda n: 2 * (n - 1) / n, "broadcast": lambda n: 1, "_allgather_base": lambda n: (n - 1) / n}
    with gzip.open(path, "rb") as f:
        sized = sorted((e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"
                        and "Collective name" in e.get("args", {})), key=lambda e: e["ts"])
    assert len(sized) == {"mi300": 12, "b200": 1}.get(name.split("__")[2], 0)
    instances = comm_table(con, run, by="instance").filter(pl.col("bytes").is_not_null())
    assert instances.height == len(sized) or not sized
    for row, kernel in zip(instances.iter_rows(named=True), sized):
        a = kernel["args"]
        size = {"BFloat16": 2, "Long": 8}[a["dtype"]] * max(a["In msg nelems"], a["Out msg nelems"])
        assert row["bytes"] == size
        assert row["time_ns"] == pytest.approx(kernel["dur"] * 1000, abs=1)
        assert row["busbw_gbps"] == pytest.approx(factors[a["Collective name"]](a["Group size"]) * size / row["time_ns"])
    con.close()


def test_bus_bandwidth_of_an_all_reduce_of_known_size(dlrm) -> None:
    """Each rank's all-reduces: bytes from PyTorch's nccl:all_reduce annotations (Input Dims,
    float), time from the AllReduce kernels, paired in order; busbw = 2 (n-1)/n bytes / time."""
    con, run = dlrm
    frame = comm_table(con, run).filter(pl.col("collective") == "all_reduce")
    assert frame.height == 8
    for path in DLRM:
        with gzip.open(path, "rb") as f:
            trace = json.load(f)
        n = trace["distributedInfo"]["world_size"]
        events = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
        sizes = [e["args"]["Input Dims"][0] for e in events if e["name"] == "nccl:all_reduce"]
        assert all(e["args"]["Input type"][0] == "float" for e in events if e["name"] == "nccl:all_reduce")
        kernels = [e["dur"] * 1000 for e in events if e.get("cat") == "kernel" and "AllReduce" in e["name"]]
        assert len(sizes) == len(kernels) == 3
        total_bytes = sum(4 * dims[0] for dims in sizes)
        row = frame.filter(pl.col("rank") == trace["distributedInfo"]["rank"]).row(0, named=True)
        assert row["bytes"] == total_bytes
        assert row["busbw_gbps"] == pytest.approx(2 * (n - 1) / n * total_bytes / sum(kernels), rel=1e-12)
        assert row["algbw_gbps"] == pytest.approx(total_bytes / sum(kernels), rel=1e-12)


def test_hta_nccl_parser_trace(tmp_path: Path) -> None:
    """HTA's tests/test_trace_parse.py (test_nccl_parser_config) on its nccl_parser_config trace:
    21 NCCL kernels, the longest an all-reduce of 2,049,000 elements of process group '0'."""
    path = shared("realtraces", "kineto_json", "facebookresearch__HolisticTraceAnalysis__nccl_parser_config__nccl_data.json.gz")
    con = open_store(tmp_path / "s.duckdb", create=True)
    load_trace(con, path)
    frame = comm_table(con, resolve_run(con, None)[0], by="instance")
    assert frame["max_ns"].len() == 21
    longest = frame.sort("max_ns", descending=True).row(0, named=True)
    assert (longest["collective"], longest["bytes"], longest["group"]) == ("all_reduce", 2_049_000 * 4, "0")


def ddp_pairs() -> list[dict]:
    """The k-th all-reduce (broadcast) kernel of GPU 0 with GPU 1's k-th, from SQLite."""
    by_gpu = defaultdict(lambda: defaultdict(list))
    for rank, iteration, start, end, name, kind in ddp_work():
        if kind == "comm":
            by_gpu[rank]["all_reduce" if "AllReduce" in name else "broadcast"].append((start, end, iteration))
    pairs = []
    for collective in ("all_reduce", "broadcast"):
        a, b = (sorted(by_gpu[r][collective]) for r in (0, 1))
        assert len(a) == len(b)
        pairs += [{"collective": collective, "k": k, "starts": (x[0], y[0]), "ends": (x[1], y[1]),
                   "iterations": (x[2], y[2])} for k, (x, y) in enumerate(zip(a, b))]
    return pairs


def test_skew_and_wait_across_ranks(ddp) -> None:
    con, run = ddp
    pairs = ddp_pairs()
    frame = comm_table(con, run, by="instance")
    got = {(r["collective"], r["instance"]): (r["start_skew_ns"], r["end_skew_ns"], r["last_rank"])
           for r in frame.iter_rows(named=True)}
    assert got == {(p["collective"], p["k"]): (abs(p["starts"][0] - p["starts"][1]), abs(p["ends"][0] - p["ends"][1]),
                                                int(p["starts"][1] > p["starts"][0])) for p in pairs}
    waits = defaultdict(int)
    for p in pairs:
        last = max(p["starts"])
        for rank in (0, 1):
            waits[(rank, p["iterations"][rank])] += max(0, min(p["ends"][rank], last) - p["starts"][rank])
    ranks = rank_iterations(con, run)
    assert {(r["rank"], r["iteration"]): r["wait_ns"] for r in ranks.iter_rows(named=True)} == \
        {k: v for k, v in waits.items() if k[1] is not None}
    slowest = ranks.filter(pl.col("slowest"))
    assert slowest["iteration"].n_unique() == slowest.height == 5  # one per iteration
    held = defaultdict(int)  # the straggler: the rank the others waited for longest (start skews it caused)
    for p in pairs:
        if p["starts"][0] != p["starts"][1]:
            late = int(p["starts"][1] > p["starts"][0])
            held[(late, p["iterations"][late])] += abs(p["starts"][0] - p["starts"][1])
    for r in slowest.iter_rows(named=True):
        mine = {k: v for k, v in held.items() if k[1] == r["iteration"]}
        if mine:
            assert held[(r["rank"], r["iteration"])] == max(mine.values())


def test_what_delayed_the_latest_collective(ddp) -> None:
    """Windows before the most skewed all-reduce, from SQLite: from each GPU's previous NCCL
    kernel's end to its start of this one; GPU time per kernel name in them, and idle time.
    The cause is the name (or idle) with the most time on the late GPU over the other's."""
    con, run = ddp
    top = late_collectives(con, run, k=1).row(0, named=True)
    pair = next(p for p in ddp_pairs() if (p["collective"], p["k"]) == (top["collective"], top["instance"]))
    late = int(pair["starts"][1] > pair["starts"][0])
    assert top["last_rank"] == late
    work = ddp_work()
    nccl = sorted((r, s, e, it) for r, it, s, e, _, kind in work if kind == "comm")
    windows = {}
    for rank in (0, 1):
        start = pair["starts"][rank]
        before = [(e, it) for r, s, e, it in nccl if r == rank and s < start]
        assert before and before[-1][1] == pair["iterations"][rank]  # a previous collective in the iteration
        windows[rank] = (before[-1][0], start)
    time = defaultdict(lambda: [0, 0])
    for rank, (w0, w1) in windows.items():
        inside = [(s, min(e, w1), name) for r, _, s, e, name, kind in work
                  if r == rank and kind != "memory" and w0 <= s < w1]
        for s, e, name in inside:
            time[name][rank] += e - s
        time[IDLE][rank] = (w1 - w0) - length(union([(s, e) for s, e, _ in inside]))
    cause = min(time, key=lambda name: (time[name][1 - late] - time[name][late], name))  # ties: first name
    assert top["delayed_by"] == cause
    assert top["delayed_ns"] == time[cause][late] - time[cause][1 - late]
    assert top["window_ns"] == windows[late][1] - windows[late][0]
    every = late_collectives(con, run, k=100)  # a cause is named only where it took longer on the late rank
    assert every.height == sum(p["starts"][0] != p["starts"][1] for p in ddp_pairs())
    assert (every["delayed_by"].is_null() == every["delayed_ns"].is_null()).all()
    assert (every["delayed_ns"].drop_nulls() > 0).all() and every["delayed_by"].null_count() > 0


def test_16_ranks_made_from_the_dlrm_set(dlrm) -> None:
    """bench/ranks_scale.py's 16-rank copy of the DLRM run (the bench makes 64 and more): rank r's
    overlap and communication are rank (r mod 8)'s; its bus bandwidth is scaled by nccl-tests'
    factor for 16 ranks."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ranks_scale", Path(__file__).parents[1] / "bench" / "ranks_scale.py")
    scaler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scaler)
    con, run = dlrm
    big = scaler.scale_run(con, "dlrm8", 16, "dlrm16")
    small, large = overlap_table(con, run), overlap_table(con, big)
    assert large.height == 2 * small.height
    assert large.with_columns(rank=pl.col("rank") % 8).sort("rank", "iteration").equals(
        pl.concat([small] * 2).sort("rank", "iteration"))
    small, large = comm_table(con, run), comm_table(con, big)
    keys = ["collective", "iteration", "rank"]
    joined = large.with_columns(rank=pl.col("rank") % 8).join(small, on=keys, suffix="_8", nulls_equal=True)
    assert joined.height == large.height == 2 * small.height
    assert (joined["total_ns"] == joined["total_ns_8"]).all() and (joined["bytes"] == joined["bytes_8"]).all()
    reduce = joined.filter(pl.col("collective") == "all_reduce")
    assert (reduce["busbw_gbps"] / reduce["busbw_gbps_8"]).to_list() == pytest.approx([(15 / 16) / (7 / 8)] * 16)


def test_report_draws_the_run_figures(ddp, dlrm) -> None:
    """A rank of a run of several gets the four run figures after the others; the bars of the
    time per rank add up to the rank's mean iteration span, the peak line is its GPU's link."""
    import re

    from traceq.analysis.multigpu.links import link_for
    from traceq.api.report import build_report
    from traceq.render.report import FIGURE_KEYS, RUN_FIGURE_KEYS

    con, run = ddp
    page = build_report(con, [1])
    ids = re.findall(r'id="fig-([a-z-]+)"', page)
    assert ids[-4:] == list(RUN_FIGURE_KEYS) and set(ids[:-4]) <= set(FIGURE_KEYS)
    assert "the trace records no message sizes" in page
    from traceq.render import rank_figures

    overlap = overlap_table(con, run)
    chart = rank_figures.rank_time_chart({"ddp": overlap})
    stacked = defaultdict(float)
    for bar in chart.figure.data:
        for x, y in zip(bar.x, bar.y):
            stacked[x] += y
    spans = overlap.filter(pl.col("iteration").is_not_null()).group_by("rank").agg(pl.col("span_ns").mean())
    assert stacked == pytest.approx({f"rank {r}": s / 1e6 for r, s in spans.iter_rows()})
    dcon, drun = dlrm
    chart = rank_figures.bandwidth_chart({"dlrm": comm_table(dcon, drun, by="instance")},
                                    {"dlrm": ("NVLink 2", link_for("Tesla V100-SXM2-32GB").gbps)})
    assert [shape.y0 for shape in chart.figure.layout.shapes] == [150.0]
    assert sum(len(d.x) for d in chart.figure.data) == 8  # every DLRM collective has its size


def test_compare_runs_of_different_gpu_counts(ddp, tmp_path: Path) -> None:
    """The 2-GPU DDP run against a 1-GPU trace: its forward and backward time per GPU and
    iteration is the SQLite sum of the work launched in those ranges / 2 GPUs / 5 iterations,
    and scaling is the 1-GPU time over it."""
    from traceq.analysis.compare.scaling import compare_scaling

    con, run = ddp
    load_trace(con, sample("alexnet_b256_cudnn.sqlite"))
    single = resolve_run(con, "alexnet_b256_cudnn")[0]
    frame = compare_scaling(con, single, run, "stage")
    totals = defaultdict(int)
    iterations = set()
    for rank, iteration, start, end, _, _, stage in ddp_work(stages=True):
        if iteration is not None:
            totals[stage] += end - start
            iterations.add(iteration)
    assert len(iterations) == 5
    rows = {r["stage"]: r for r in frame.iter_rows(named=True)}
    for stage in ("forward", "backward"):
        assert rows[stage]["b_ns"] == round(totals[stage] / 2 / 5)
        assert rows[stage]["scaling_pct"] == pytest.approx(100 * rows[stage]["a_ns"] / rows[stage]["b_ns"], rel=1e-6)
    assert (rows["forward"]["a_gpus"], rows["forward"]["b_gpus"]) == (1, 2)
    exposed = overlap_table(con, run).filter(pl.col("iteration").is_not_null())["exposed_ns"].mean()
    assert rows["(exposed communication)"]["b_ns"] == round(exposed)
    assert rows["(communication)"]["a_ns"] == 0 and rows["(communication)"]["scaling_pct"] is None
