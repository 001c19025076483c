"""AMD's profilers (ingest/amd.py) against the real files of ../shared/realtraces/rocpd: per file,
the kernel count, the total kernel time and the five heaviest kernels by time equal a reading of
the raw file written here (json, sqlite3, csv: not the product's code); damaged files are refused
in one line with the store unchanged."""

from __future__ import annotations

import csv
import gzip
import json
import re
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from conftest import sample, shared

from traceq import TraceFormatError

ROCPD = ("realtraces", "rocpd")
KD = re.compile(r"(\s*\[clone \.kd\]|\.kd)$")


def _json(path: Path) -> Counter:
    tool = json.load(gzip.open(path))["rocprofiler-sdk-tool"][0]
    names = {s["kernel_id"]: s["demangled_kernel_name"] for s in tool["kernel_symbols"]}
    return Counter({(KD.sub("", names[r["dispatch_info"]["kernel_id"]]), i): r["end_timestamp"] - r["start_timestamp"]
                    for i, r in enumerate(tool["buffer_records"]["kernel_dispatch"])})


def _rpd(path: Path) -> Counter:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    return Counter({(name, i): end - start for i, (name, start, end) in enumerate(con.execute(
        """SELECT d.string, o.start, o."end" FROM rocpd_op o JOIN rocpd_string d ON d.id = o.description_id
           JOIN rocpd_string t ON t.id = o.opType_id WHERE t.string = 'KernelExecution'"""))})


def _csv(path: Path) -> Counter:
    rows = list(csv.DictReader(path.open()))
    v3 = "Kernel_Name" in rows[0]
    keys = ("Kernel_Name", "Start_Timestamp", "End_Timestamp") if v3 else ("KernelName", "BeginNs", "EndNs")
    return Counter({(KD.sub("", r[keys[0]]), i): int(r[keys[2]]) - int(r[keys[1]]) for i, r in enumerate(rows)})


def _db(path: Path) -> Counter:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    return Counter({(KD.sub("", name.strip('"')), i): end - begin
                    for i, (name, begin, end) in enumerate(con.execute("SELECT KernelName, BeginNs, EndNs FROM KERN"))})


FILES = [
    ("AMD-AGI__TraceLens__rocprof__908_results.json.gz", _json, "rocprofv3", "AMD Instinct MI350X"),
    ("ROCm__rocmProfileData__matmul_result.rpd", _rpd, "rpd", None),
    ("ROCm__rocprofiler-sdk__docs__kernel_trace.csv", _csv, "rocprof-csv", None),
    ("amd__HPCTrainingExamples__finite-difference__results.csv", _csv, "rocprof-csv", None),
    ("amd__HPCTrainingExamples__finite-difference__results.db", _db, "rocprof-db", None),
]


@pytest.mark.parametrize(("file", "raw", "form", "gpu"), FILES, ids=[f[2] + "-" + f[0][:12] for f in FILES])
def test_amd_profile_loads_as_the_raw_file_says(file, raw, form, gpu, tmp_path: Path) -> None:
    import traceq

    path = shared(*ROCPD, file)
    truth = raw(path)
    per_name = Counter()
    for (name, _), ns in truth.items():
        per_name[name] += ns
    t = traceq.load(path, tmp_path / "s.duckdb")
    con = t.con
    count, total = con.execute("SELECT count(*), sum(dur_ns) FROM kernels WHERE trace_id = ?", [t.id]).fetchone()
    assert (count, total) == (len(truth), sum(truth.values()))
    top = t.top(k=5)
    assert [(n, int(ns)) for n, ns in top.select("name", "total_ns").iter_rows()] == per_name.most_common(5)
    assert con.execute("SELECT format FROM traces WHERE trace_id = ?", [t.id]).fetchone()[0] == form
    if gpu:
        assert con.execute("SELECT DISTINCT name FROM gpus WHERE trace_id = ?", [t.id]).fetchall() == [(gpu,)]
        assert con.execute("SELECT count(*) FROM gpus WHERE trace_id = ?", [t.id]).fetchone()[0] == 8
    for command in (t.libs, t.stages):  # the commands of a kernel-only profile work
        assert command().height > 0


def test_rpd_kernels_find_their_launch_calls(tmp_path: Path) -> None:
    """RPD links each GPU operation to the host call that issued it (`rocpd_api_ops`): every
    kernel of the matmul example has its hipLaunchKernel-family call (raw SQL)."""
    import traceq

    path = shared(*ROCPD, "ROCm__rocmProfileData__matmul_result.rpd")
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    expected = Counter(n for (n,) in raw.execute(
        """SELECT s.string FROM rocpd_op o JOIN rocpd_string t ON t.id = o.opType_id
           JOIN rocpd_api_ops l ON l.op_id = o.id JOIN rocpd_api a ON a.id = l.api_id
           JOIN rocpd_string s ON s.id = a.apiName_id WHERE t.string = 'KernelExecution'"""))
    t = traceq.load(path, tmp_path / "s.duckdb")
    got = Counter(n for (n,) in t.con.execute(
        "SELECT launch_api FROM kernel_launches WHERE trace_id = ?", [t.id]).fetchall())
    assert got == expected and sum(got.values()) == 29


@pytest.mark.parametrize("file", [f[0] for f in FILES if not f[0].endswith(".csv")])
def test_a_damaged_amd_profile_is_refused_in_one_line(file: str, tmp_path: Path) -> None:
    """A third of the file (a gzip or SQLite file cut short): one line, the store unchanged."""
    import traceq

    store = tmp_path / "s.duckdb"
    traceq.load(sample("lenet_b256_cudnn.sqlite"), store)
    before = store.read_bytes()
    data = shared(*ROCPD, file).read_bytes()
    broken = tmp_path / ("cut" + "".join(Path(file).suffixes[-2:]))
    broken.write_bytes(data[: len(data) // 3])
    with pytest.raises(TraceFormatError) as e:
        traceq.load(broken, store)
    assert "\n" not in str(e.value)
    assert store.read_bytes() == before


def test_a_csv_with_a_rocprof_header_and_no_dispatch_is_refused(tmp_path: Path) -> None:
    import traceq

    path = tmp_path / "empty.csv"
    path.write_text(shared(*ROCPD, FILES[2][0]).read_text().splitlines()[0] + "\n")
    with pytest.raises(TraceFormatError) as e:
        traceq.load(path, tmp_path / "s.duckdb")
    assert "\n" not in str(e.value) and "no kernel dispatch" in str(e.value)
