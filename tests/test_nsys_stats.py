"""traceq's numbers equal what `nsys stats` printed for the same export (exactly, in ns)."""

from __future__ import annotations

import csv

import pytest
from conftest import sample, trace_id

from traceq.analysis.kernels.top import NameBy, top_kernels


def _rows(name: str) -> list[dict[str, str]]:
    with sample(name).open(newline="") as f:
        return list(csv.DictReader(f))


def test_top_equals_nsys_stats_kern_sum(sample_store) -> None:
    expected = _rows("alexnet_b256_cudnn.nsys_stats_kern_sum.csv")
    frame = top_kernels(sample_store, trace_id(sample_store, "alexnet_b256_cudnn"), k=10_000)
    assert len(frame) == len(expected) == 44
    # the same kernels in the same order (nsys sorts by total time, as traceq does)
    assert frame["name"].to_list() == [r["Name"] for r in expected]
    for got, want in zip(frame.iter_rows(named=True), expected):
        assert got["instances"] == int(want["Instances"])
        assert got["total_ns"] == int(want["Total Time (ns)"])
        assert got["min_ns"] == int(want["Min (ns)"])
        assert got["max_ns"] == int(want["Max (ns)"])
        assert got["median_ns"] == float(want["Med (ns)"])
        assert got["avg_ns"] == pytest.approx(float(want["Avg (ns)"]), abs=0.0501)
        assert got["stddev_ns"] == pytest.approx(float(want["StdDev (ns)"]), abs=0.0501)
        assert got["pct"] == pytest.approx(float(want["Time (%)"]), abs=0.0501)


def test_top_k_is_a_prefix_and_short_names_group_more(sample_store) -> None:
    tid = trace_id(sample_store, "alexnet_b256_cudnn")
    full = top_kernels(sample_store, tid, k=10_000)
    assert top_kernels(sample_store, tid, k=15).equals(full.head(15))
    short = top_kernels(sample_store, tid, k=10_000, by=NameBy.short)
    assert short["instances"].sum() == full["instances"].sum() == 648
    assert short["total_ns"].sum() == full["total_ns"].sum()
    assert len(short) < len(full)


def test_memops_equal_nsys_stats_mem_time_sum(sample_store) -> None:
    tid = trace_id(sample_store, "alexnet_b256_cudnn")
    got = {
        (f"[CUDA memcpy {kind}]" if op == "memcpy" else "[CUDA memset]"): (n, total, lo, hi, med)
        for op, kind, n, total, lo, hi, med in sample_store.execute(
            "SELECT op, any_value(copy_kind), count(*), sum(dur_ns)::BIGINT, min(dur_ns), max(dur_ns), "
            "quantile_cont(dur_ns, 0.5) FROM memops WHERE trace_id = ? GROUP BY op, copy_kind",
            [tid]).fetchall()
    }
    expected = {
        r["Operation"]: (int(r["Count"]), int(r["Total Time (ns)"]), int(r["Min (ns)"]),
                         int(r["Max (ns)"]), float(r["Med (ns)"]))
        for r in _rows("alexnet_b256_cudnn.nsys_stats_mem_time_sum.csv")
    }
    assert got == expected


def test_nvtx_ranges_equal_nsys_stats_nvtx_sum(sample_store) -> None:
    tid = trace_id(sample_store, "alexnet_b256_cudnn")
    got = {
        (":" + name): (n, total, lo, hi)
        for name, n, total, lo, hi in sample_store.execute(
            "SELECT name, count(*), sum(dur_ns)::BIGINT, min(dur_ns), max(dur_ns) FROM nvtx "
            "WHERE trace_id = ? AND kind = 'pushpop' GROUP BY name", [tid]).fetchall()
    }
    expected = {
        r["Range"]: (int(r["Instances"]), int(r["Total Time (ns)"]), int(r["Min (ns)"]), int(r["Max (ns)"]))
        for r in _rows("alexnet_b256_cudnn.nsys_stats_nvtx_sum.csv")
    }
    assert got == expected
