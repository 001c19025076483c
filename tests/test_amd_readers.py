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
from conftest import ROOT, sample, shared

from traceq import TraceFormatError

ROCPD = ("realtraces", "rocpd")
KD = re.compile(r"(\s*\[clone \.kd\]|\.kd)$")


def _json(path: Path) -> Counter:
    tool = json.loads(gzip.decompress(path.read_bytes()))["rocprofiler-sdk-tool"][0]
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


DAMAGES = [(f[0], damage) for f in FILES if f[0].endswith(".csv") for damage in
           ("header only", "not UTF-8", "no timestamps")] + [(FILES[0][0], "no tool entry")]


@pytest.mark.parametrize(("file", "damage"), DAMAGES, ids=[f"{f[:12]}-{d}" for f, d in DAMAGES])
def test_a_damaged_rocprof_csv_or_json_is_refused_in_one_line(file: str, damage: str, tmp_path: Path) -> None:
    """A rocprof CSV with its header and no dispatch, with bytes that are not UTF-8, with its
    timestamps blanked; a JSON whose `rocprofiler-sdk-tool` is not an object: one line, the store
    unchanged."""
    import traceq

    store = tmp_path / "s.duckdb"
    traceq.load(sample("lenet_b256_cudnn.sqlite"), store)
    before = store.read_bytes()
    lines = [] if damage == "no tool entry" else shared(*ROCPD, file).read_text().splitlines()
    path = tmp_path / ("broken.json" if damage == "no tool entry" else "broken.csv")
    if damage == "header only":
        path.write_text(lines[0] + "\n")
    elif damage == "not UTF-8":
        path.write_bytes(("\n".join(lines[:3]) + "\n").encode() + b"\xff\xfe\x80,1,2\n")
    elif damage == "no timestamps":
        header = next(csv.reader([lines[0]]))
        rows = [dict(zip(header, r)) for r in csv.reader(lines[1:]) if r]
        for r in rows:
            for key in ("Start_Timestamp", "End_Timestamp", "BeginNs", "EndNs"):
                if key in r:
                    r[key] = ""
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, header, quoting=csv.QUOTE_NONNUMERIC)
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text(json.dumps({"rocprofiler-sdk-tool": ["not an object"]}))
    with pytest.raises(TraceFormatError) as e:
        traceq.load(path, store)
    assert "\n" not in str(e.value) and str(e.value)
    assert store.read_bytes() == before


def _small_rocprofv3(path: Path, tmp_path: Path) -> tuple[Path, list[dict], list[dict]]:
    """The real rocprofv3 JSON cut to its first 50 dispatches, with memory copies and roctx
    records added in the form rocprofv3 writes them (`buffer_records.memory_copy`, `marker_api`,
    `strings.marker_api`): the corpus's file traced neither."""
    data = json.loads(gzip.decompress(path.read_bytes()))
    tool = data["rocprofiler-sdk-tool"][0]
    kinds = [entry["kind"] for entry in tool["strings"]["buffer_records"]]
    ops = {entry["kind"]: entry["operations"] for entry in tool["strings"]["buffer_records"]}
    gpu = next(a["id"]["handle"] for a in tool["agents"] if a["type"] == 2)
    cpu = next(a["id"]["handle"] for a in tool["agents"] if a["type"] == 1)
    records = tool["buffer_records"]
    records["kernel_dispatch"] = records["kernel_dispatch"][:50]
    t0 = records["kernel_dispatch"][0]["start_timestamp"]
    copies = []
    for i, (operation, nbytes) in enumerate([("MEMORY_COPY_HOST_TO_DEVICE", 4096), ("MEMORY_COPY_DEVICE_TO_HOST", 512),
                                             ("MEMORY_COPY_DEVICE_TO_DEVICE", 1 << 20)]):
        src, dst = (cpu, gpu) if operation.endswith("HOST_TO_DEVICE") else (gpu, cpu if "TO_HOST" in operation else gpu)
        copies.append({"size": 80, "kind": kinds.index("MEMORY_COPY"), "operation": ops["MEMORY_COPY"].index(operation),
                       "thread_id": 908, "correlation_id": {"internal": 90000 + i, "external": 0},
                       "start_timestamp": t0 + 1000 * i, "end_timestamp": t0 + 1000 * i + 300 + i,
                       "dst_agent_id": {"handle": dst}, "src_agent_id": {"handle": src}, "bytes": nbytes})
    records["memory_copy"] = copies
    ranged = kinds.index("MARKER_CORE_RANGE_API")
    markers = [{"size": 64, "kind": ranged, "operation": ops["MARKER_CORE_RANGE_API"].index(op),
                "thread_id": 908 + i, "correlation_id": {"internal": 80000 + i, "external": 0},
                "start_timestamp": t0 + 10 * i, "end_timestamp": t0 + 10 * i + (0 if op == "roctxMarkA" else 5000)}
               for i, op in enumerate(["roctxThreadRangeA", "roctxThreadRangeA", "roctxProcessRangeA", "roctxMarkA"])]
    markers.append({"size": 64, "kind": kinds.index("MARKER_CORE_API"), "operation": 1, "thread_id": 908,
                    "correlation_id": {"internal": 80009, "external": 0}, "start_timestamp": t0,
                    "end_timestamp": t0 + 2})  # the roctxRangePushA call itself: not a range
    records["marker_api"] = markers
    tool["strings"]["marker_api"] = [{"key": 80000 + i, "value": name}
                                     for i, name in enumerate(["forward", "backward", "step 1", "checkpoint"])]
    out = tmp_path / "small.json"
    out.write_text(json.dumps(data))
    return out, copies, markers[:4]


def test_rocprofv3_json_copies_and_roctx_ranges(tmp_path: Path) -> None:
    import traceq

    path, copies, markers = _small_rocprofv3(shared(*ROCPD, FILES[0][0]), tmp_path)
    t = traceq.load(path, tmp_path / "s.duckdb")
    got = t.con.execute("SELECT copy_kind, bytes, dur_ns, correlation_id FROM memops WHERE trace_id = ? "
                        "ORDER BY start_ns", [t.id]).fetchall()
    assert got == [("Host-to-Device", 4096, 300, 90000), ("Device-to-Host", 512, 301, 90001),
                   ("Device-to-Device", 1 << 20, 302, 90002)]
    assert sum(c["bytes"] for c in copies) == sum(g[1] for g in got)
    ranges = t.con.execute("SELECT name, kind, dur_ns, tid FROM nvtx WHERE trace_id = ? ORDER BY start_ns",
                           [t.id]).fetchall()
    assert ranges == [("forward", "pushpop", 5000, 908), ("backward", "pushpop", 5000, 909),
                      ("step 1", "startend", 5000, 910), ("checkpoint", "mark", None, 911)]
    assert len(ranges) == len(markers)
    assert t.con.execute("SELECT count(*) FROM kernels WHERE trace_id = ?", [t.id]).fetchone()[0] == 50


def test_rpd_copies_carry_their_bytes(tmp_path: Path) -> None:
    """RPD's copies take their size from the launching call's `rocpd_copyapi` row (raw SQL)."""
    import traceq

    path = shared(*ROCPD, "ROCm__rocmProfileData__matmul_result.rpd")
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    expected = sorted(raw.execute(
        """SELECT t.string, count(*), sum(c.size) FROM rocpd_op o JOIN rocpd_string t ON t.id = o.opType_id
           LEFT JOIN rocpd_api_ops l ON l.op_id = o.id LEFT JOIN rocpd_copyapi c ON c.api_ptr_id = l.api_id
           WHERE t.string LIKE 'Copy%' OR t.string = 'FillBuffer' GROUP BY 1""").fetchall())
    t = traceq.load(path, tmp_path / "s.duckdb")
    got = t.con.execute("SELECT coalesce(copy_kind, op), count(*), sum(bytes) FROM memops WHERE trace_id = ? "
                        "GROUP BY 1", [t.id]).fetchall()
    names = {"Device-to-Host": "CopyDeviceToHost", "Host-to-Device": "CopyHostToDevice", "memset": "FillBuffer"}
    assert sorted((names[k], n, b) for k, n, b in got) == expected


def test_rpd_roctx_ranges_and_marks(tmp_path: Path) -> None:
    """rpd_tracer writes a roctx range or mark as a `rocpd_api` row named UserMarker, its message
    as the args (a mark: end = start): ranges in the store, not API calls. The corpus's RPD has
    none, so three are added to a copy."""
    import traceq

    path = tmp_path / "marked.rpd"
    path.write_bytes(shared(*ROCPD, "ROCm__rocmProfileData__matmul_result.rpd").read_bytes())
    con = sqlite3.connect(path)
    (t0,) = con.execute("SELECT min(start) FROM rocpd_api").fetchone()
    ids = {}
    for text in ("UserMarker", "forward", "layer 1", "checkpoint"):
        ids[text] = con.execute("INSERT INTO rocpd_string (string) VALUES (?)", [text]).lastrowid
    for message, start, end in (("forward", t0, t0 + 9000), ("layer 1", t0 + 10, t0 + 500), ("checkpoint", t0 + 20, t0 + 20)):
        con.execute("INSERT INTO rocpd_api (pid, tid, start, \"end\", apiName_id, args_id) VALUES (?, ?, ?, ?, ?, ?)",
                    [7, 7, start, end, ids["UserMarker"], ids[message]])
    con.commit()
    calls = con.execute("SELECT count(*) FROM rocpd_api").fetchone()[0] - 3
    con.close()
    t = traceq.load(path, tmp_path / "s.duckdb")
    assert t.con.execute("SELECT name, kind, dur_ns, tid FROM nvtx WHERE trace_id = ? ORDER BY start_ns",
                         [t.id]).fetchall() == [("forward", "pushpop", 9000, 7), ("layer 1", "pushpop", 490, 7),
                                                ("checkpoint", "mark", None, 7)]
    assert t.con.execute("SELECT count(*) FROM api_calls WHERE trace_id = ?", [t.id]).fetchone()[0] == calls


WRONG_SHAPES = [
    {"buffer_records": {"kernel_dispatch": [1, "x"]}},
    {"agents": "x", "buffer_records": {"kernel_dispatch": [{"start_timestamp": 1, "end_timestamp": 5,
                                                            "dispatch_info": 3}]}},
    {"kernel_symbols": [{"kernel_id": []}], "strings": {"buffer_records": 5, "marker_api": [{"key": 1, "value": 5}]},
     "buffer_records": {"kernel_dispatch": [{"start_timestamp": 1, "end_timestamp": 5,
                                             "dispatch_info": {"kernel_id": [], "workgroup_size": 3}}],
                        "hip_api": [{"kind": "a"}, 3], "marker_api": [3, {"kind": 0}],
                        "memory_copy": [{"start_timestamp": 1, "end_timestamp": 2, "kind": []}]}},
    {"metadata": [], "agents": [{"type": 2, "id": 4, "product_name": 7}],
     "buffer_records": {"kernel_dispatch": [{"start_timestamp": 1, "end_timestamp": 10**23}]}},
    {"buffer_records": {"kernel_dispatch": [{"start_timestamp": 10, "end_timestamp": 50},
                                            {"start_timestamp": 10, "end_timestamp": 5},
                                            {"start_timestamp": -(2**63), "end_timestamp": 2**63 - 1}]}},
]


@pytest.mark.parametrize("tool", WRONG_SHAPES, ids=range(len(WRONG_SHAPES)))
def test_a_rocprofv3_json_of_the_wrong_shape_loads_what_it_can_or_is_refused(tool: dict, tmp_path: Path) -> None:
    """Fields of the wrong JSON type, numbers past 64 bits, ends before starts: what is sound
    loads (the rest dropped and counted), or the file is refused in one line; never a traceback."""
    import traceq

    path = tmp_path / "shape.json"
    path.write_text(json.dumps({"rocprofiler-sdk-tool": [tool]}))
    try:
        t = traceq.load(path, tmp_path / "s.duckdb")
    except TraceFormatError as e:
        assert "\n" not in str(e)
        return
    kernels = t.con.execute("SELECT count(*), min(dur_ns) FROM kernels WHERE trace_id = ?", [t.id]).fetchone()
    assert kernels[0] >= 1 and kernels[1] >= 0
    for command in (t.top, t.libs):
        command()


def test_fuzzing_the_small_amd_profiles() -> None:
    """4 mutants of the RPD, rocprof v1 and rocprofv3 CSV files (fixed seed: SQLite and CSV
    damage), each loaded and the first commands run on it: refused in one line with the store as
    before, or loaded with every command working. `python tools/fuzz.py --amd` is the larger run."""
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import fuzz

    files = [shared(*ROCPD, f[0]) for f in FILES[1:]]
    with fuzz.scratch() as work:
        harness = fuzz.Harness(files, "amd-ci", work, commands=fuzz.FIRST_COMMANDS)
        outcomes = fuzz.run(harness, range(4), progress=False)
    assert [o.problems for o in outcomes if o.problems] == []
    assert len(outcomes) == 4 and "loaded" in {o.result for o in outcomes}
