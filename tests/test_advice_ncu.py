"""`advise`'s low-occupancy finding (`low_ru`) beside Nsight Compute's measurements, where a
report is joined to the trace (`traceq load --ncu`): the evidence gives ncu's occupancy for each
kernel it names, checked against the report's CSV read here."""

from __future__ import annotations

import csv
import gzip
import io
import re

import polars as pl
import pytest
from conftest import sample

from traceq.analysis.advise import advise


def _csv_rows(path) -> list[dict[str, str]]:
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    return rows[1:]  # the units row


def test_low_occupancy_states_what_nsight_compute_measured(tmp_path) -> None:
    """AlexNet FP32 at batch 256 with its ncu report (30 launches of one iteration): the
    transposed FC GEMM leaves block slots empty (4 blocks per SM, limited by registers), and ncu's
    theoretical occupancy for it, in every launch it measured, is what the evidence says."""
    from traceq.api.loading import load_trace
    from traceq.api.store import Store
    from traceq.store import open_store

    db = tmp_path / "s.duckdb"
    con = open_store(db, create=True)
    trace = load_trace(con, sample("ncu/alexnet_b256_fp32.sqlite")).trace_id
    frame, _ = advise(con, trace)
    con.close()
    before = frame.filter(pl.col("rule") == "low_ru").row(0, named=True)
    assert before["title"].startswith("Low occupancy") and "Nsight Compute" not in before["evidence"]
    report = sample("ncu/alexnet_b256_fp32_ncu.csv.gz")
    with Store(db, write=True) as store:
        store.load_ncu(report, into="alexnet_b256_fp32")
    rows = [r for r in _csv_rows(report) if "f32_tn_n_tilesize64x64x8" in r["Kernel Name"]]
    values = {float(r["sm__maximum_warps_per_active_cycle_pct"]) for r in rows}
    assert len(values) == 1 and len(rows) == 2
    con = open_store(db)
    frame, _ = advise(con, trace)
    con.close()
    evidence = frame.filter(pl.col("rule") == "low_ru")["evidence"][0]
    line = next(part for part in evidence.split("; ") if "tilesize64x64x8" in part)
    m = re.search(r"\(Nsight Compute on (\d+) launches: theoretical occupancy (\d+) %\)", line)
    assert m, line
    assert int(m[1]) == len(rows) and int(m[2]) == round(values.pop())


UNCOALESCED = sample("ncu/planted_uncoalesced_raw.csv.gz")


def _excess_by_name(rows: list[dict[str, str]]) -> dict[str, float]:
    """Per kernel name of the report: the share of its global sectors that were excess (sums over
    its launches), read from the CSV's own columns."""
    sums: dict[str, list[float]] = {}
    for r in rows:
        asked = float(r["memory_l2_theoretical_sectors_global"].replace(",", "") or 0)
        ideal = float(r["memory_l2_theoretical_sectors_global_ideal"].replace(",", "") or 0)
        s = sums.setdefault(r["Kernel Name"], [0.0, 0.0])
        s[0] += asked
        s[1] += ideal
    return {name: (a - i) / a for name, (a, i) in sums.items() if a > 0}


def _planted(tmp_path, trace_file: str, truth_file: str):
    import json

    from traceq.api.loading import load_trace
    from traceq.api.store import Store
    from traceq.store import open_store

    db = tmp_path / "s.duckdb"
    con = open_store(db, create=True)
    trace = load_trace(con, sample(trace_file), name="uncoalesced").trace_id
    before, _ = advise(con, trace)
    con.close()
    with Store(db, write=True) as store:
        store.load_ncu(UNCOALESCED, into="uncoalesced")
    con = open_store(db)
    frame, totals = advise(con, trace)
    con.close()
    return before, frame, totals, json.loads(sample(truth_file).read_text())


@pytest.mark.parametrize(("trace_file", "truth_file"), [
    ("planted/uncoalesced.sqlite", "planted/uncoalesced.truth.json"),
    ("planted/kineto/uncoalesced.json.gz", "planted/kineto/uncoalesced.truth.json")])
def test_planted_uncoalesced_reads_are_the_first_finding(tmp_path, trace_file: str, truth_file: str) -> None:
    """tools/record_planted.py's `uncoalesced` plant (ten adds per step of an 8192 x 8192 fp32
    matrix read through its transpose, against the same adds untransposed in the base loop),
    recorded under nsys and under torch.profiler, with an Nsight Compute report of two planted
    steps (another process) joined: advise's first finding is the uncoalesced access, its time at
    stake per step within 25 % of the planted cost (the traced step times of the truth file);
    without the report, no such finding. The kernels it names are those whose excess share of
    sectors, computed from the CSV here, reaches EXCESS_SHARE."""
    from traceq.analysis.advice.coalescing import EXCESS_SHARE

    before, frame, totals, truth = _planted(tmp_path, trace_file, truth_file)
    assert "uncoalesced_access" not in before["rule"].to_list()
    assert frame["rule"][0] == "uncoalesced_access", frame.select("rule", "time_ns").rows()
    cost = truth["traced_step_ns"] - truth["base"]["traced_step_ns"]
    assert cost > 0.1 * truth["base"]["traced_step_ns"]
    assert totals.iterations == truth["steps"]
    stake = frame["time_ns"][0] / totals.iterations
    assert abs(stake - cost) <= 0.25 * cost, (stake, cost)
    excess = _excess_by_name(_csv_rows(UNCOALESCED))
    named = sorted(v for v in excess.values() if v >= EXCESS_SHARE)
    evidence = frame["evidence"][0]
    shown = [int(p) for p in re.findall(r": (\d+) % of its global-memory sectors were excess", evidence)]
    more = re.search(r"; \+(\d+) more", evidence)
    assert len(shown) + (int(more[1]) if more else 0) == len(named)
    planted = next(v for n, v in excess.items() if "CUDAFunctor_add<float>" in n and "nocast" in n)
    assert round(100 * planted) in shown and shown[0] == round(100 * planted)
