"""Runs: several files, or one file's processes and GPUs, as the ranks of one job.

Ranks are checked against what the traces record, read here with the standard library (json,
sqlite3): distributedInfo.rank of each Kineto file, the GPU and process of each nsys and nvprof
file's NCCL kernels. Clock alignment is checked by shifting one rank's file by a known amount:
the shift traceq finds changes by exactly that amount. Bad input is refused in one line with the
store byte for byte as it was.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from conftest import DLRM, assert_load_refused, sample, shared, shared_files
from typer.testing import CliRunner

from traceq.analysis.multigpu.comm import comm_table
from traceq.api.loading import load_run, load_trace
from traceq.cli import app
from traceq.store import open_store, resolve_run

QCU = shared_files("realtraces/nvprof_sqlite", "ZhangXin8069__qcu__test__log_x99-Yang_12368*.nvvp")
BLINK = "UCBerkeley-Spring2022-CS267-project__blinkplus-nccl-base__output.nvvp"


def ranks_of(con, run: str) -> list[tuple]:
    """(rank, trace name, pid, device_id, rank_from, shift_ns) of a run, by rank."""
    return con.execute("SELECT k.rank, t.name, k.pid, k.device_id, k.rank_from, k.shift_ns FROM ranks k "
                       "JOIN runs r USING (run_id) JOIN traces t USING (trace_id) WHERE r.name = ? ORDER BY k.rank",
                       [run]).fetchall()


def distributed_rank(path: Path) -> int:
    with gzip.open(path, "rb") as f:
        return json.load(f)["distributedInfo"]["rank"]


def nccl_gpus(path: Path, nvprof: bool) -> list[tuple[int, int]]:
    """(device, pid) of the processes that ran NCCL kernels, as the SQLite file has them."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if nvprof:
            sql = ("SELECT DISTINCT k.deviceId, 0 FROM CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL k "
                   "JOIN StringTable s ON s._id_ = k.name WHERE s.value LIKE '%nccl%' ORDER BY 1")
        else:
            sql = ("SELECT DISTINCT k.deviceId, (k.globalPid >> 24) & 16777215 FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                   "JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'nccl%' ORDER BY 1, 2")
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_one_file_of_two_processes_is_a_run_of_two_ranks(tmp_path: Path) -> None:
    path = sample("ddp_resnet18_2gpu.sqlite")
    con = open_store(tmp_path / "s.duckdb", create=True)
    load_trace(con, path)
    expected = [(i, "ddp_resnet18_2gpu", pid, device, "device and process ids", 0)
                for i, (device, pid) in enumerate(nccl_gpus(path, nvprof=False))]
    assert len(expected) == 2
    assert ranks_of(con, "ddp_resnet18_2gpu") == expected
    con.close()
    runner = CliRunner()
    db = ["--db", str(tmp_path / "s.duckdb")]
    assert runner.invoke(app, ["load", str(path), "--run", "ddp", "--replace", *db]).exit_code == 0
    con = open_store(tmp_path / "s.duckdb", read_only=True)
    assert ranks_of(con, "ddp") == expected and ranks_of(con, "ddp_resnet18_2gpu") == []
    con.close()
    removed = runner.invoke(app, ["rm", "ddp", *db])  # a run of one file goes by its name too
    assert removed.exit_code == 0 and "removed 'ddp_resnet18_2gpu'" in removed.stdout, removed.output
    con = open_store(tmp_path / "s.duckdb", read_only=True)
    assert con.execute("SELECT (SELECT count(*) FROM runs) + (SELECT count(*) FROM traces)").fetchone()[0] == 0
    con.close()


def test_one_process_on_four_gpus_is_four_ranks(tmp_path: Path) -> None:
    path = shared("realtraces", "nvprof_sqlite", BLINK)
    con = open_store(tmp_path / "s.duckdb", create=True)
    load_trace(con, path)
    assert [(r[0], r[3]) for r in ranks_of(con, path.stem)] == \
        [(i, device) for i, (device, _) in enumerate(nccl_gpus(path, nvprof=True))]
    assert len(ranks_of(con, path.stem)) == 4


@pytest.fixture(scope="module")
def dlrm(dlrm_store):
    """The store holding the 8 DLRM rank files as the run 'dlrm8'."""
    return dlrm_store[0]


def test_ranks_come_from_distributed_info(dlrm) -> None:
    by_name = {r[1]: r for r in ranks_of(dlrm, "dlrm8")}
    assert len(by_name) == 8
    for path in DLRM:
        rank, _, pid, device, rank_from, shift = by_name[path.name.removesuffix(".json.gz")]
        assert rank == distributed_rank(path)
        assert (pid, device, rank_from) == (None, None, "distributedInfo")
        assert abs(shift) <= 2_000  # one host's clock: the collectives' ends agree to the microsecond


def test_shifted_and_late_captures_are_aligned(dlrm, tmp_path: Path) -> None:
    """Rank 3's file with every timestamp 2.5 s later: its shift is 2.5 s less, to the ns. Rank
    5's file without its first all-reduce kernel (a capture that began after it): its other
    all-reduces still meet the same collectives on the other ranks."""
    moved = tmp_path / DLRM[3].name
    trace = json.loads(gzip.decompress(DLRM[3].read_bytes()))
    for event in trace["traceEvents"]:
        if "ts" in event:
            assert isinstance(event["ts"], int)  # whole microseconds: the sum is exact
            event["ts"] += 2_500_000
    moved.write_bytes(gzip.compress(json.dumps(trace).encode()))
    late = tmp_path / DLRM[5].name
    trace = json.loads(gzip.decompress(DLRM[5].read_bytes()))
    first = min((e for e in trace["traceEvents"] if e.get("cat") == "kernel" and "AllReduce" in e["name"]),
                key=lambda e: e["ts"])
    trace["traceEvents"].remove(first)
    late.write_bytes(gzip.compress(json.dumps(trace).encode()))
    con = open_store(tmp_path / "s.duckdb", create=True)
    load_run(con, [*DLRM[:3], moved, DLRM[4], late, *DLRM[6:]], "moved")
    before = {r[0]: r[5] for r in ranks_of(dlrm, "dlrm8")}
    after = {r[0]: r[5] for r in ranks_of(con, "moved")}
    assert after[3] == before[3] - 2_500_000_000
    assert {r: s for r, s in after.items() if r != 3} == {r: s for r, s in before.items() if r != 3}
    seen = comm_table(con, resolve_run(con, "moved")[0], by="instance").filter(pl.col("collective") == "all_reduce")
    assert dict(seen.select("instance", "ranks_seen").iter_rows()) == {0: 7, 1: 8, 2: 8}
    original = comm_table(dlrm, resolve_run(dlrm, "dlrm8")[0], by="instance").filter(pl.col("collective") == "all_reduce")
    assert seen.filter(pl.col("instance") > 0)["start_skew_ns"].to_list() == \
        original.filter(pl.col("instance") > 0)["start_skew_ns"].to_list()


def test_two_nvprof_processes_are_ranks_by_gpu(tmp_path: Path) -> None:
    if len(QCU) != 2:
        pytest.skip("the qcu pair is absent")
    con = open_store(tmp_path / "s.duckdb", create=True)
    load_run(con, QCU, "qcu")
    ranks = ranks_of(con, "qcu")
    devices = {path.stem: nccl_gpus(path, nvprof=True) for path in QCU}
    assert [r[1] for r in ranks] == sorted(devices, key=lambda name: devices[name])
    assert all(len(d) == 1 for d in devices.values())
    (matched, residual), = con.execute("SELECT shift_collectives, shift_residual_ns FROM ranks WHERE rank = 1").fetchall()
    assert matched >= 100 and residual < 2_000  # all-reduces end within 2 us once the clocks agree
    nccl_ns = {}  # per file: the sum of its NCCL kernels' durations, as nvprof recorded them
    for path in QCU:
        source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        nccl_ns[path.stem] = source.execute(
            "SELECT sum(k.\"end\" - k.start) FROM CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL k "
            "JOIN StringTable s ON s._id_ = k.name WHERE s.value LIKE '%nccl%'").fetchone()[0]
        source.close()
    per_rank = dict(comm_table(con, resolve_run(con, "qcu")[0]).group_by("rank").agg(pl.col("total_ns").sum()).iter_rows())
    # durations are each rank's own clock's (the drift fit moves starts and ends, not lengths)
    assert per_rank == {r[0]: nccl_ns[r[1]] for r in ranks}


def rewritten(path: Path, out: Path, **info: int) -> Path:
    """A copy of a Kineto trace with distributedInfo fields changed."""
    trace = json.loads(gzip.decompress(path.read_bytes()))
    trace["distributedInfo"].update(info)
    out.write_bytes(gzip.compress(json.dumps(trace).encode()))
    return out


def test_bad_runs_are_refused_in_one_line(tmp_path: Path) -> None:
    if len(DLRM) != 8:
        pytest.skip("the DLRM rank files are absent")
    other_job = shared("realtraces", "kineto_json", "facebookresearch__HolisticTraceAnalysis__trace_diff__test.json.gz")
    db = tmp_path / "s.duckdb"
    run = ("--run", "job")
    assert_load_refused(db, [DLRM[0], other_job], "ranks of different runs mixed", "world size", options=run)
    assert_load_refused(db, DLRM[:2], "ranks 2, 3, 4, 5, 6, 7 of 8 missing", options=run)
    twin = rewritten(DLRM[1], tmp_path / "twin.json.gz", rank=0)
    assert_load_refused(db, [DLRM[0], twin], "rank 0 twice", options=run)
    assert CliRunner().invoke(app, ["load", str(DLRM[0]), "--db", str(db)]).exit_code == 0
    assert_load_refused(db, DLRM[:2], "already loaded", "--replace", options=run)


def test_a_rank_leaves_only_with_its_run(dlrm, tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    runner = CliRunner()
    assert runner.invoke(app, ["load", *map(str, DLRM), "--run", "dlrm8", "--db", str(db)]).exit_code == 0
    again = runner.invoke(app, ["load", *map(str, DLRM), "--run", "dlrm8", "--db", str(db)])
    assert again.exit_code == 0 and "already loaded" in again.stdout
    listed = json.loads(runner.invoke(app, ["traces", "--db", str(db), "-f", "json"]).stdout)
    assert [(t["name"], t["run"]) for t in listed] == [(Path(p.name.removesuffix(".gz")).stem, "dlrm8") for p in DLRM]
    before = db.read_bytes()
    refused = runner.invoke(app, ["rm", "1", "--db", str(db)])
    assert refused.exit_code == 1 and "without rank 0" in refused.stderr and "traceq rm dlrm8" in refused.stderr
    assert db.read_bytes() == before
    removed = runner.invoke(app, ["rm", "dlrm8", "--db", str(db)])
    assert removed.exit_code == 0 and "8 traces" in removed.stdout
    listed = runner.invoke(app, ["traces", "--db", str(db), "-f", "csv"])
    assert listed.exit_code == 0 and len(listed.stdout.strip().splitlines()) == 1  # the header alone
    assert runner.invoke(app, ["comm", "dlrm8", "--db", str(db)]).exit_code == 1  # no such run now
