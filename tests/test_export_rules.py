"""Every rule of Perfetto's JSON importer that `traceq export` relies on, checked on the file as
Python's json reads it (not with our writer's code), on the samples (nsys, Kineto, a 2-rank run
of each), HTA's VGG-16 trace and the 8-rank DLRM run:

- on every track (pid, tid) the `X` slices nest or are disjoint (a slice that starts inside
  another and ends after it is dropped or misdrawn by the importer);
- async `b`/`e` events pair up per (cat, id), the end not before the begin;
- flow `s`/`f` events pair up per id: `s` at the start of its launching call's slice, `f`
  inside a slice of its track (it binds to the enclosing slice: `bp: 'e'`);
- exactly one process_name per pid and one thread_name per (pid, tid) that has events, and no
  pid both a GPU's (kernels) and a host process's (API calls);
- every number a number (not a string or a bool), ts >= 0, dur >= 0;
- a run: every rank present (named in its processes), with as many kernels as the store holds
  for it, on the run's clock (the shift and drift of the `ranks` table).

Perfetto's trace processor itself is not run: it is not installed here and cannot be downloaded
(tools/perfetto_check.py runs it where it is)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import duckdb
import pytest
from conftest import sample, shared
from typer.testing import CliRunner

from traceq.cli import app

runner = CliRunner()
HTA_VGG16 = ("realtraces/kineto_json", "facebookresearch__HolisticTraceAnalysis__nccl_parser_config__nccl_data.json.gz")
RANK = re.compile(r"^ranks? ([\d, ]+) · ")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_importer_rules(path: Path) -> list[dict]:
    """The file's events, after asserting every rule above but the run's; returns them."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    process_names: dict[int, list[str]] = defaultdict(list)
    thread_names: dict[tuple[int, int], list[str]] = defaultdict(list)
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    calls: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    used: set[tuple[int, int]] = set()
    for e in events:
        assert _number(e["pid"]) and _number(e["tid"]) and isinstance(e["pid"], int), e
        if e["ph"] == "M":
            names = process_names if e["name"] == "process_name" else thread_names
            if e["name"] in ("process_name", "thread_name"):
                names[e["pid"] if e["name"] == "process_name" else (e["pid"], e["tid"])].append(e["args"]["name"])
            continue
        assert _number(e["ts"]) and e["ts"] >= 0, e
        used.add((e["pid"], e["tid"]))
        if e["ph"] == "X":
            assert _number(e["dur"]) and e["dur"] >= 0, e
            slices[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
            if e["cat"] == "cuda_api":
                calls[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
        if e["ph"] in "bsef":
            assert _number(e["id"]), e
    assert all(len(n) == 1 for n in process_names.values()), {p: n for p, n in process_names.items() if len(n) > 1}
    assert all(len(n) == 1 for n in thread_names.values()), {t: n for t, n in thread_names.items() if len(n) > 1}
    assert {pid for pid, _ in used} <= set(process_names) and used <= set(thread_names)
    gpu = {e["pid"] for e in events if e.get("cat") == "kernel"}
    host = {e["pid"] for e in events if e.get("cat") == "cuda_api"}
    assert not gpu & host, gpu & host
    for track, spans in slices.items():  # nest or disjoint: a stack of open slices
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[float] = []
        for start, end in spans:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], (track, start, end, open_ends[-1])
            open_ends.append(end)
    pairs: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for e in events:
        if e["ph"] in "be":
            pairs[e["cat"], e["id"]].append(e)
    for key, pair in pairs.items():
        assert sorted(p["ph"] for p in pair) == ["b", "e"], key
        begin, end = sorted(pair, key=lambda p: p["ph"])
        assert begin["ts"] <= end["ts"] and begin["pid"] == end["pid"], key
    flows: dict[int, dict[str, dict]] = defaultdict(dict)
    for e in events:
        if e["ph"] in "sf":
            assert e["ph"] not in flows[e["id"]], e
            flows[e["id"]][e["ph"]] = e
    for flow_id, ends in flows.items():
        assert set(ends) == {"s", "f"} and ends["f"].get("bp") == "e", flow_id
        s, f = ends["s"], ends["f"]
        assert any(a <= f["ts"] <= b for a, b in slices[f["pid"], f["tid"]]), f
        assert any(a == s["ts"] <= b for a, b in calls[s["pid"], s["tid"]]), s  # at its launching call
    return events


def _export(db: Path, ref: str, out: Path) -> list[dict]:
    result = runner.invoke(app, ["export", ref, "-o", str(out), "--db", str(db)])
    assert result.exit_code == 0, result.output
    return check_importer_rules(out)


def _load(db: Path, *args: str) -> None:
    result = runner.invoke(app, ["load", *args, "--db", str(db)])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("export-rules") / "s.duckdb"
    _load(db, *(str(sample(n)) for n in ("alexnet_b256_cudnn.sqlite", "ddp_resnet18_2gpu.sqlite",
                                         "alexnet_b256_kineto.json")))
    _load(db, *(str(sample(f"multigpu/ddp_resnet50_2gpu_kineto_rank{r}.json.gz")) for r in (0, 1)), "--run", "ddpk")
    _load(db, *(str(sample(f"multigpu/ddp_resnet50_2gpu_rank{r}.sqlite")) for r in (0, 1)), "--run", "ddpn")
    return db


def _streams(db: Path, trace: str) -> tuple[Counter, set]:
    """Kernels and memops per (device, stream), and the streams where one starts before the
    one before it ends, counted from the store's rows."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("""
            WITH w AS (SELECT coalesce(device_id, 0) d, coalesce(stream_id, 0) s, start_ns, end_ns FROM kernels
                       WHERE trace_id = (SELECT trace_id FROM traces WHERE name = ?)
                       UNION ALL SELECT coalesce(device_id, 0), coalesce(stream_id, 0), start_ns, end_ns FROM memops
                       WHERE trace_id = (SELECT trace_id FROM traces WHERE name = ?))
            SELECT d, s, count(*), count(*) FILTER (WHERE start_ns < reach) FROM (
                SELECT *, max(end_ns) OVER (PARTITION BY d, s ORDER BY start_ns, end_ns
                                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) reach FROM w)
            GROUP BY ALL""", [trace, trace]).fetchall()
    return Counter({(d, s): n for d, s, n, _ in rows}), {(d, s) for d, s, _, late in rows if late}


@pytest.mark.parametrize("trace", ["alexnet_b256_cudnn", "ddp_resnet18_2gpu", "alexnet_b256_kineto"])
def test_a_trace_keeps_every_importer_rule(store: Path, tmp_path: Path, trace: str) -> None:
    """Each stream's work is on the stream's threads (`stream 7`, its extra tracks `stream 7 · 2`),
    all of it; a stream whose work overlaps in the store has an extra track, and only such a one."""
    events = _export(store, trace, tmp_path / "t.json.gz")
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    gpus = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    per_stream: Counter = Counter()
    extra = set()
    for e in events:
        if e["ph"] == "X" and e["cat"] in ("kernel", "memcpy", "memset"):
            device = int(re.search(r"GPU (\d+)", gpus[e["pid"]]).group(1))
            stream = re.fullmatch(r"stream (\d+)( · \d+)?", names[e["pid"], e["tid"]])
            per_stream[device, int(stream.group(1))] += 1
            if stream.group(2):
                extra.add((device, int(stream.group(1))))
    counted, overlapping = _streams(store, trace)
    assert per_stream == counted
    assert extra == overlapping
    if trace == "ddp_resnet18_2gpu":  # Hopper's split-K kernels start before the one before them ends
        assert len(overlapping) == 2


def test_kineto_gpu_annotations_name_no_host_process(store: Path, tmp_path: Path) -> None:
    """Kineto's gpu_user_annotation ranges belong to no process in the store: they are drawn on
    the GPU, and no process 0 beside GPU 0 gets a second name (as the export did: 'python3 0')."""
    events = _export(store, "alexnet_b256_kineto", tmp_path / "k.json.gz")
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    annotations = [e for e in events if e["ph"] == "b"]
    assert annotations and all(names[e["pid"]].startswith("GPU 0") for e in annotations)
    assert sorted(names.values()) == ["GPU 0: NVIDIA H200", "python3 (pid 1476)"]


def _rank_kernels(db: Path, run: str) -> dict[int, list[int]]:
    """Each rank's kernels' starts on the run's clock (ns), from the store's rows and its ranks table."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("""
            SELECT r.rank, k.start_ns + r.shift_ns + round((k.start_ns - r.shift_at_ns) * r.drift_ppm * 1e-6)::BIGINT
            FROM runs u JOIN ranks r USING (run_id) JOIN kernels k ON k.trace_id = r.trace_id
                 AND (r.device_id IS NULL OR k.device_id = r.device_id) AND (r.pid IS NULL OR k.pid = r.pid)
            WHERE u.name = ?""", [run]).fetchall()
        world = con.execute("SELECT world_size FROM runs WHERE name = ?", [run]).fetchone()[0]
    out: dict[int, list[int]] = {r: [] for r in range(world)}
    for rank, start in rows:
        out[rank].append(start)
    return out


def check_run(db: Path, run: str, events: list[dict]) -> None:
    """Every rank of the run present, its kernels counted as the store holds them, each rank's
    kernels at their time on the run's clock (one offset for the whole file)."""
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    by_rank: dict[int, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "kernel":
            ranks = RANK.match(names[e["pid"]])
            assert ranks, names[e["pid"]]
            by_rank[int(ranks.group(1))].append(e["ts"])
    expected = _rank_kernels(db, run)
    assert set(by_rank) == set(expected) and all(expected.values())
    offsets = set()
    for rank, starts in expected.items():
        assert len(by_rank[rank]) == len(starts), rank
        offsets |= {round(a * 1000) - b for a, b in zip(sorted(by_rank[rank]), sorted(starts), strict=True)}
    assert len(offsets) == 1, sorted(offsets)[:5]


@pytest.mark.parametrize("run", ["ddpk", "ddpn"])
def test_a_run_writes_every_rank_on_its_clock(store: Path, tmp_path: Path, run: str) -> None:
    events = _export(store, run, tmp_path / "r.json.gz")
    check_run(store, run, events)
    pids = [e["pid"] for e in events if e["name"] == "process_name"]
    assert len(pids) == 4  # each rank's GPU and process


def test_a_run_whose_clocks_drift(store: Path, tmp_path: Path) -> None:
    """A rank whose clock runs 80 ppm slow (the loads here measured none): its kernels are put on
    the run's clock with the drift too, t + shift + drift x 1e-6 x (t - shift_at), to the ns."""
    db = tmp_path / "drift.duckdb"
    shutil.copyfile(store, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE ranks SET drift_ppm = 80.0 WHERE rank = 1 AND run_id = (SELECT run_id FROM runs "
                    "WHERE name = 'ddpn')")
    events = _export(db, "ddpn", tmp_path / "d.json.gz")
    check_run(db, "ddpn", events)
    with duckdb.connect(str(db), read_only=True) as con:
        span = con.execute("SELECT max(k.end_ns) - min(k.start_ns) FROM kernels k JOIN traces t USING (trace_id) "
                           "WHERE t.name = 'ddp_resnet50_2gpu_rank1'").fetchone()[0]
    assert span * 80e-6 > 1_000  # the drift moves its last kernels by more than a microsecond


def test_vgg16_and_the_8_rank_dlrm_run(tmp_path: Path) -> None:
    """HTA's VGG-16 trace (Kineto, A100) and the 8-rank DLRM Kineto job, from ../shared."""
    vgg = shared(*HTA_VGG16)
    dlrm = sorted(shared("realtraces/kineto_json").glob("facebookresearch__param__dlrm_kineto__worker*.json.gz"))
    db = tmp_path / "s.duckdb"
    _load(db, str(vgg))
    events = _export(db, vgg.name.removesuffix(".json.gz"), tmp_path / "vgg.json.gz")
    assert sum(e.get("cat") == "kernel" for e in events) == 2700
    if len(dlrm) != 8:
        pytest.skip("the DLRM rank files are absent")
    _load(db, *map(str, dlrm), "--run", "dlrm8")
    check_run(db, "dlrm8", _export(db, "dlrm8", tmp_path / "dlrm.json.gz"))


def test_crossing_calls_and_ranges_go_on_extra_tracks_of_their_thread(tmp_path: Path) -> None:
    """A store whose API calls cross the NVTX ranges and calls after them (every 7th call made
    3 ms longer): every call and range is still written, each thread's slices nest or are
    disjoint on its tracks (`python3 · 2`, ...), and each launch's flow starts inside its call."""
    db = tmp_path / "s.duckdb"
    _load(db, str(sample("alexnet_b256_cudnn.sqlite")))
    with duckdb.connect(str(db)) as con:
        stretched = con.execute("UPDATE api_events SET end_ns = end_ns + 3000000 WHERE start_ns % 7 = 0").fetchone()[0]
        con.execute("UPDATE kernel_events SET launch_end_ns = launch_end_ns + 3000000 WHERE launch_start_ns % 7 = 0")
        calls, ranges = (con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in ("api_events", "nvtx"))
    assert stretched > 100
    events = _export(db, "alexnet_b256_cudnn", tmp_path / "x.json.gz")
    kinds = Counter((e["ph"], e.get("cat")) for e in events)
    assert kinds["X", "cuda_api"] == calls and kinds["X", "nvtx"] == ranges
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    moved = {names[e["pid"], e["tid"]] for e in events if e.get("cat") == "cuda_api" and " · " in names[e["pid"], e["tid"]]}
    assert "python3 · 2" in moved
    launches = [e for e in events if e["ph"] == "s"]
    assert sum(" · " in names[e["pid"], e["tid"]] for e in launches) > 0
