"""`traceq stats --report R` equals what `nsys stats --report R` printed for the same export.

The CSVs in sample_traces/nsys_stats/ are Nsight Systems 2025.3.1's own reports on every bundled
trace (sample_traces/MANIFEST.md); every row and every column is compared. nsys rounds averages,
medians, standard deviations and shares to 0.1 and prints sizes in MB (10^6 bytes, 3 decimals).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import pytest
from conftest import SAMPLES, sample, trace_id
from typer.testing import CliRunner

from traceq.analysis.timeline.stats import REPORTS, stats_report
from traceq.cli import app

_STATISTICS = ["Avg", "Med", "Min", "Max", "StdDev"]
_OURS = ["avg", "median", "min", "max", "stddev"]


def _summary(count: str, ours: str, label: list[tuple[str, str]], unit: str = "ns") -> list[tuple[str, str, str]]:
    """(nsys column, traceq column, how to compare) of the common 'Time, Total, count, stats' shape."""
    kind = "mb" if unit == "MB" else "round"
    total = [("Time (%)", "pct", "round"), ("Total Time (ns)", "total_ns", "exact")] if unit == "ns" else \
        [("Total (MB)", "total_bytes", "mb")]
    suffix = "ns" if unit == "ns" else "bytes"
    stats = [(f"{s} ({unit})", f"{o}_{suffix}", "exact" if s in ("Min", "Max") and unit == "ns" else kind)
             for s, o in zip(_STATISTICS, _OURS)]
    return [*total, (count, ours, "exact"), *stats, *[(a, b, "key") for a, b in label]]


_EXEC = [(f"{p}{s} (ns)", f"{o}_{t}_ns", "exact" if s in ("Min", "Max") else "round")
         for p, o in zip("TAQK", ["total", "api", "queue", "kernel"]) for s, t in zip(_STATISTICS, _OURS)]

COLUMNS = {
    "cuda_api_sum": _summary("Num Calls", "calls", [("Name", "name")]),
    "cuda_gpu_kern_sum": _summary("Instances", "instances", [("Name", "name")]),
    "cuda_gpu_mem_time_sum": _summary("Count", "count", [("Operation", "operation")]),
    "cuda_gpu_mem_size_sum": _summary("Count", "count", [("Operation", "operation")], unit="MB"),
    "nvtx_sum": _summary("Instances", "instances", [("Style", "style"), ("Range", "range")]),
    "nvtx_gpu_proj_sum": [
        ("Range", "range", "key"), ("Style", "style", "key"), ("Total Proj Time (ns)", "total_proj_ns", "exact"),
        ("Total Range Time (ns)", "total_range_ns", "exact"), ("Range Instances", "instances", "exact"),
        *[(f"Proj {s} (ns)", f"proj_{o}_ns", "exact" if s in ("Min", "Max") else "round")
          for s, o in zip(_STATISTICS, _OURS)],
        ("Total GPU Ops", "gpu_ops", "exact"), ("Avg GPU Ops", "avg_gpu_ops", "round"),
        ("Avg Range Lvl", "avg_level", "round"), ("Avg Num Child", "avg_children", "round")],
    "cuda_kern_exec_sum": [("PID", "pid", "key"), ("TID", "tid", "key"), ("DevId", "device_id", "key"),
                           ("Count", "count", "exact"), ("QCount", "queued", "exact"), *_EXEC,
                           ("API Name", "api_name", "key"), ("Kernel Name", "kernel_name", "key")],
}
_OLD_NAMES = {"cuda_gpu_kern_sum": "kern_sum", "cuda_gpu_mem_time_sum": "mem_time_sum", "nvtx_sum": "nvtx_sum"}


def _ground_truth() -> list[tuple[str, str, Path]]:
    found = [(p.name.split(".")[0], p.name.split(".")[1], p) for p in sorted((SAMPLES / "nsys_stats").glob("*.csv*"))]
    found += [("alexnet_b256_cudnn", report, SAMPLES / f"alexnet_b256_cudnn.nsys_stats_{old}.csv")
              for report, old in _OLD_NAMES.items()]
    return found


CASES = _ground_truth()


def test_every_report_has_ground_truth_on_every_sample() -> None:
    traces = {p.stem for p in SAMPLES.glob("*.sqlite")}
    assert {(t, r) for t, r, _ in CASES} == {(t, r) for t in traces for r in REPORTS}


def _same(kind: str, got: object, want: str) -> bool:
    if want == "":  # nsys leaves the queue statistics of launches that never queued empty
        return got is None
    value = float(want)
    if got is None:
        return False
    if kind == "exact":
        return float(got) == value  # type: ignore[arg-type]
    if kind == "mb":
        return abs(float(got) / 1e6 - value) <= 0.0005 + 1e-9  # type: ignore[arg-type]
    return abs(float(got) - value) <= 0.05 + 1e-9 * abs(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("trace", "report", "path"), CASES, ids=[f"{t}-{r}" for t, r, _ in CASES])
def test_report_equals_nsys_stats(sample_store, trace: str, report: str, path: Path) -> None:
    data = path.read_bytes()  # the largest are gzipped
    expected = list(csv.DictReader(io.StringIO((gzip.decompress(data) if path.suffix == ".gz" else data).decode(),
                                               newline="")))
    frame = stats_report(sample_store, trace_id(sample_store, trace), report)
    columns = COLUMNS[report]
    keys = [(theirs, ours) for theirs, ours, kind in columns if kind == "key"]
    got = {tuple(str(row[ours]) for _, ours in keys): row for row in frame.iter_rows(named=True)}
    assert len(got) == frame.height == len(expected)
    for want in expected:
        key = tuple(want[theirs] for theirs, _ in keys)
        assert key in got, f"{report}: nsys has a row {key} traceq lacks"
        row = got[key]
        for theirs, ours, kind in columns:
            if kind != "key":
                assert _same(kind, row[ours], want[theirs]), (report, key, theirs, row[ours], want[theirs])
    # the same order where nsys's sort key (the first numeric column) differs
    first = next(ours for _, ours, kind in columns if kind != "key")
    if report == "cuda_kern_exec_sum":
        first = "total_avg_ns"
    values = frame[first].to_list()
    assert values == sorted(values, reverse=True)


def test_stats_cli(tmp_path) -> None:
    db = tmp_path / "s.duckdb"
    runner = CliRunner()
    assert runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    rows = json.loads(runner.invoke(app, ["stats", "--report", "cuda_api_sum", "--db", str(db), "-f", "json"]).stdout)
    assert rows[0]["name"] and {"pct", "total_ns", "calls", "median_ns", "stddev_ns"} <= set(rows[0])
    narrow = runner.invoke(app, ["stats", "-r", "cuda_kern_exec_sum", "--db", str(db)], env={"COLUMNS": "120"})
    headers = [h.strip() for h in next(line for line in narrow.stdout.splitlines() if line.startswith("┃"))
               .split("┃")[1:-1]]
    assert narrow.exit_code == 0 and {"Kernel", "API", "Total avg", "Kernel avg"} <= set(headers), headers
    assert not {"Kernel StdDev", "Total max", "API min"} & set(headers), headers
    assert all(len(line) <= 120 for line in narrow.stdout.splitlines())
    wrong = runner.invoke(app, ["stats", "-r", "cuda_gpu_sum", "--db", str(db)])
    assert wrong.exit_code == 2
