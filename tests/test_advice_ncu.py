"""`advise`'s low-occupancy finding (`low_ru`) beside Nsight Compute's measurements, where a
report is joined to the trace (`traceq load --ncu`): the evidence gives ncu's occupancy for each
kernel it names, checked against the report's CSV read here."""

from __future__ import annotations

import csv
import gzip
import io
import re

import polars as pl
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
