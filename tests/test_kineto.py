"""Kineto (PyTorch profiler) JSON traces: every real trace in ../shared/realtraces/kineto_json loads,
and what the store holds equals an independent reading of the JSON (Python's json, times as
exact decimals), written here, not the loader's code."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
from conftest import sample, shared, shared_files

from traceq.api.loading import load_trace
from traceq.store import open_store

CORPUS = shared_files("realtraces/kineto_json", "*.json*")


def read_json(path: Path) -> dict:
    """The whole trace as Python objects, numbers that are not integers as exact Decimals."""
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return json.load(f, parse_float=Decimal)


def ns(microseconds: int | Decimal) -> int:
    """Kineto's microseconds as integer nanoseconds, rounded half up (as traceq rounds)."""
    return int((Decimal(microseconds) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def independent_counts(trace: dict) -> tuple[Counter, dict[str, list[int]]]:
    """Events per kind as a reader of the Chrome-trace format counts them, and each kernel
    name's durations in ns."""
    counts: Counter = Counter()
    durations: dict[str, list[int]] = defaultdict(list)
    calls, kernel_correlations = set(), []
    kinds = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset",
             "memset": "memset", "cuda_runtime": "api", "runtime": "api", "cuda_driver": "api",
             "user_annotation": "user_annotation", "gpu_user_annotation": "gpu_user_annotation",
             "cpu_op": "cpu_op", "operator": "cpu_op"}
    for e in trace["traceEvents"]:
        if e.get("ph") == "i" and e.get("name") == "[memory]":
            counts["memory"] += 1
        kind = kinds.get(str(e.get("cat", "")).lower()) if e.get("ph") == "X" else None
        if kind:
            counts[kind] += 1
        if kind == "kernel":
            durations[e["name"]].append(ns(e["dur"]))
            kernel_correlations.append(e.get("args", {}).get("correlation"))
        elif kind == "api":
            calls.add(e.get("args", {}).get("correlation"))
    counts["unlaunched"] = sum(c is None or c not in calls for c in kernel_correlations)
    return counts, durations


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory):
    con = open_store(tmp_path_factory.mktemp("kineto") / "kineto.duckdb", create=True)
    yield con
    con.close()


@pytest.mark.parametrize("path", CORPUS, ids=[p.name[:60] for p in CORPUS])
def test_real_trace_matches_its_json(con, path: Path) -> None:
    result = load_trace(con, path)
    trace_id = result.trace_id
    assert result.notes == []  # a real trace is never repaired (docs/damaged-traces.md)
    counts, durations = independent_counts(read_json(path))

    def one(sql: str) -> int:
        return con.execute(sql, [trace_id]).fetchall()[0][0]

    assert one("SELECT count(*) FROM kernels WHERE trace_id = ?") == counts["kernel"]
    assert one("SELECT count(*) FROM memops WHERE trace_id = ? AND op = 'memcpy'") == counts["memcpy"]
    assert one("SELECT count(*) FROM memops WHERE trace_id = ? AND op = 'memset'") == counts["memset"]
    assert one("SELECT count(*) FROM api_calls WHERE trace_id = ?") == counts["api"]
    for domain in ("user_annotation", "gpu_user_annotation", "cpu_op"):
        assert one(f"SELECT count(*) FROM nvtx WHERE trace_id = ? AND domain = '{domain}'") == counts[domain]
    assert one("SELECT count(*) FROM memory_events WHERE trace_id = ? AND tid IS NOT NULL") == counts["memory"]
    # `traceq top`'s totals per kernel name, to the nanosecond
    top = {name: (n, total) for name, n, total in con.execute(
        "SELECT name, instances, total_ns FROM kernel_summary WHERE trace_id = ? AND name_by = 'demangled'",
        [trace_id]).fetchall()}
    assert top == {name: (len(d), sum(d)) for name, d in durations.items()}
    # a kernel finds the API call that launched it by correlation id, where the trace has that call
    unlaunched = one("SELECT count(*) FROM kernel_launches WHERE trace_id = ? AND launch_start_ns IS NULL")
    assert unlaunched == counts["unlaunched"]


def test_times_are_exact_nanoseconds(tmp_path: Path) -> None:
    """ts with three decimals at 4.4e12 us (and epoch-sized ones) lose nanoseconds through a
    float; the store keeps them exact."""
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
               "ts": "TS", "dur": "DUR", "args": {"device": 0, "stream": 7, "correlation": 1}}]
    text = json.dumps({"traceEvents": events}).replace('"TS"', "4414073759678.845").replace('"DUR"', "2.001")
    second = text.replace("4414073759678.845", "1712195495520871.123").replace('"k"', '"k2"')
    assert float("4414073759678.845") * 1000 != 4414073759678845  # what a float would store
    for body, start in ((text, 4414073759678845), (second, 1712195495520871123)):
        path = tmp_path / f"t{start}.json"
        path.write_text(body)
        con = open_store(tmp_path / f"{start}.duckdb", create=True)
        load_trace(con, path)
        assert con.execute("SELECT start_ns, end_ns FROM kernels").fetchall() == [(start, start + 2001)]
        con.close()


def test_alexnet_sample(tmp_path: Path) -> None:
    """Our own H200 trace: GPU description from deviceProperties, Kineto's occupancy estimate kept."""
    con = open_store(tmp_path / "a.duckdb", create=True)
    trace_id = load_trace(con, sample("alexnet_b256_kineto.json")).trace_id
    gpu = con.execute("SELECT name, vendor, cc_major, cc_minor, sm_count, max_smem_per_block_optin_bytes, "
                      "clock_hz FROM gpus WHERE trace_id = ?", [trace_id]).fetchall()
    assert gpu == [("NVIDIA H200", "NVIDIA", 9, 0, 132, 232448, 1_980_000_000)]
    occupancy = con.execute("SELECT count(*) FROM kernels WHERE kineto_occupancy_pct IS NOT NULL").fetchall()[0][0]
    assert occupancy == 324
    assert con.execute("SELECT format, session_start_utc_ns FROM traces").fetchall() == [
        ("kineto", 1790857026000000000)]


@pytest.fixture(scope="module")
def alexnet(tmp_path_factory: pytest.TempPathFactory):
    """Our H200 AlexNet, once under PyTorch's profiler and once under nsys, in one store."""
    con = open_store(tmp_path_factory.mktemp("alexnet") / "a.duckdb", create=True)
    kineto = load_trace(con, sample("alexnet_b256_kineto.json")).trace_id
    nsys = load_trace(con, sample("alexnet_b256_cudnn.sqlite")).trace_id
    yield con, kineto, nsys
    con.close()


def test_alexnet_occupancy_agrees_with_nsys_and_kineto(alexnet) -> None:
    """Our occupancy of each launch configuration equals our nsys capture's for the same kernels,
    and our emulation of Kineto's estimate (no opt-in: 0 % above 48 KB of shared memory) equals
    the `est. achieved occupancy %` Kineto wrote, within its rounding, for all 324 launches;
    the Kineto column of `ru` shows the estimate as recorded, the nsys trace's our emulation."""
    import polars as pl

    from traceq.analysis.efficiency.ru import launch_ru, ru_table

    con, kineto, nsys = alexnet
    ours = launch_ru(con, kineto).join(
        con.sql(f"SELECT kernel_id, kineto_occupancy_pct FROM kernels WHERE trace_id = {kineto}").pl(), on="kernel_id")
    assert ours.height == 324
    assert (ours["kineto_emulated"] * 100 - ours["kineto_occupancy_pct"]).abs().max() <= 0.5
    big = ours.filter(pl.col("smem_static_bytes") > 48 * 1024)
    assert big.height and (big["kineto_occupancy_pct"] == 0).all() and (big["occupancy"] > 0).all()
    key = ["short_name", "grid_blocks", "block_threads", "registers_per_thread"]
    both = (ours.select(*key, "occupancy").unique()
            .join(launch_ru(con, nsys).select(*key, pl.col("occupancy").alias("nsys")).unique(), on=key))
    assert both.height >= 60 and (both["occupancy"] == both["nsys"]).all()
    recorded = ours.group_by("name").agg(
        ((pl.col("kineto_occupancy_pct") / 100 * pl.col("dur_ns")).sum() / pl.col("dur_ns").sum()).alias("want"))
    table = ru_table(con, kineto, "kernel").join(recorded, on="name")
    assert table.height == recorded.height and (table["kineto_occupancy"] - table["want"]).abs().max() < 1e-12
    assert (table["kineto_occupancy"] != table["occupancy"]).any()
    emulated = launch_ru(con, nsys)
    assert emulated["kineto_occupancy"].equals(emulated["kineto_emulated"])


def test_alexnet_operator_flops_equal_the_model_spec(alexnet) -> None:
    """FLOPs from the operators' recorded shapes (Kineto record_shapes=True) equal, per pass, the
    layer shapes of sample_traces/alexnet.model.toml times the trace's two iterations."""
    import polars as pl

    from traceq.analysis.efficiency.flops import op_flops, spec_layer_flops

    con, kineto, _ = alexnet
    got = op_flops(con, kineto).group_by("pass").agg(pl.col("flops").sum())
    spec = spec_layer_flops(sample("alexnet.model.toml"), 256).group_by("pass").agg(pl.col("flops").sum() * 2)
    assert dict(got.iter_rows()) == dict(spec.iter_rows())


def test_python_functions_only_when_asked(tmp_path: Path) -> None:
    """`traceq load --python-functions` keeps each python_function event (with_stack=True) as a
    range of its thread; without the flag only the modules' (`nn.Module: X`, with_modules=True).
    Counted against the JSON."""
    from typer.testing import CliRunner

    from traceq.cli import app

    path = shared("realtraces", "kineto_json", "AMD-AGI__TraceLens__h100__gaunernst_bert-small-uncased__1016001.json.gz")
    events = [e for e in read_json(path)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "python_function"]
    want = Counter((int(e["pid"]), int(e["tid"]), e["name"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in events)
    assert len(events) == 1385
    modules = Counter({key: n for key, n in want.items() if key[2].startswith("nn.Module: ")})
    assert modules  # the trace was recorded with_modules
    for flag, expected in (([], modules), (["--python-functions"], want)):
        db = tmp_path / f"p{len(flag)}.duckdb"
        result = CliRunner().invoke(app, ["load", str(path), "--db", str(db), *flag])
        assert result.exit_code == 0, result.output
        con = open_store(db, read_only=True)
        got = Counter(con.execute("SELECT pid, tid, name, start_ns, end_ns FROM nvtx "
                                  "WHERE domain = 'python_function'").fetchall())
        con.close()
        assert got == expected


def test_separators_inside_strings(tmp_path: Path, monkeypatch) -> None:
    """A compact trace whose names hold the file's own separator (`}, {`): wherever a block is
    cut inside such a name, those events are read again exactly, and every event arrives once."""
    from traceq.ingest import json_events

    monkeypatch.setattr(json_events, "BLOCK_BYTES", 4000)
    monkeypatch.setattr(json_events, "BATCH_BYTES", 12000)
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i % 7}" + "}, {" * (i % 3), "pid": 0, "tid": 7,
               "ts": i * 10, "dur": 1 + i % 5, "args": {"device": 0, "stream": 7, "correlation": i}}
              for i in range(1000)]
    path = tmp_path / "compact.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert path.read_text().count("}, {") > 1.5 * len(events)
    con = open_store(tmp_path / "c.duckdb", create=True)
    load_trace(con, path)
    got = con.execute("SELECT name, start_ns, end_ns, correlation_id FROM kernels ORDER BY kernel_id").fetchall()
    assert got == [(e["name"], e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000, e["args"]["correlation"]) for e in events]


@pytest.mark.parametrize("name", ["facebookresearch__HolisticTraceAnalysis__nccl_parser_config__nccl_data.json.gz",
                                  "AMD-AGI__TraceLens__mi300__resnet_act_checkpoint.json.gz"])
def test_collectives_equal_the_json(tmp_path: Path, name: str) -> None:
    """Every NCCL/RCCL kernel and record_param_comms operator with collective args is one row of
    `collectives`, its fields as the JSON writes them."""
    path = shared("realtraces", "kineto_json", name)
    keys = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype")
    want = Counter(
        (("kernel" if e["cat"].lower() == "kernel" else "cpu_op"), ns(e["ts"]),
         *(e["args"].get(k) for k in keys))
        for e in read_json(path)["traceEvents"]
        if e.get("ph") == "X" and str(e.get("cat")).lower() in ("kernel", "cpu_op")
        and "Collective name" in e.get("args", {}))
    con = open_store(tmp_path / "c.duckdb", create=True)
    load_trace(con, path)
    got = Counter(con.execute("SELECT event, start_ns, collective, in_msg_nelems, out_msg_nelems, group_size, dtype "
                              "FROM collectives WHERE event <> 'user_annotation'").fetchall())
    # and one row per PyTorch `nccl:*` annotation, the collective its name's
    annotations = Counter(con.execute("SELECT start_ns, collective FROM collectives "
                                      "WHERE event = 'user_annotation'").fetchall())
    con.close()
    assert sum(want.values()) >= 15 and got == want
    assert annotations == Counter((ns(e["ts"]), e["name"][len("nccl:"):]) for e in read_json(path)["traceEvents"]
                                  if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:"))


def test_batches_parsed_in_parallel_equal_the_json(tmp_path: Path, monkeypatch) -> None:
    """Our AlexNet trace cut into a dozen batches, parsed two at a time (`json_stage`): the kernels,
    API calls and operators, in the file's order, equal a reading of the JSON with Python's json;
    and every table equals a load one batch after the other, staged on disk."""
    from traceq.ingest import json_events, json_stage, kineto

    monkeypatch.setattr(json_events, "BLOCK_BYTES", 32 << 10)
    monkeypatch.setattr(json_events, "BATCH_BYTES", 96 << 10)
    path = sample("alexnet_b256_kineto.json")
    serial_passes = []
    monkeypatch.setattr(json_stage, "_serial", lambda *a: serial_passes.append(a) or _SERIAL(*a))
    batches = []
    monkeypatch.setattr(json_stage, "_insert", lambda con, folder, batch, insert: batches.append(batch.number)
                        or _INSERT(con, folder, batch, insert))
    con = open_store(tmp_path / "parallel.duckdb", create=True)
    load_trace(con, path)
    assert serial_passes == [] and len(batches) >= 10

    events = read_json(path)["traceEvents"]
    x = [e for e in events if e.get("ph") == "X"]
    kernels = [(e["name"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["args"]["correlation"], e["args"]["grid"][0],
                e["args"]["stream"]) for e in x if e.get("cat") == "kernel"]
    calls = [(e["name"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["args"]["correlation"], e["tid"])
             for e in x if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    ops = [(e["name"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["tid"]) for e in x if e.get("cat") == "cpu_op"]
    assert con.execute("SELECT name, start_ns, end_ns, correlation_id, grid_x, stream_id FROM kernels "
                       "ORDER BY kernel_id").fetchall() == kernels
    assert con.execute("SELECT name, start_ns, end_ns, correlation_id, tid FROM api_calls "
                       "ORDER BY start_ns, correlation_id").fetchall() == sorted(calls, key=lambda c: (c[1], c[3]))
    assert con.execute("SELECT name, start_ns, end_ns, tid FROM nvtx WHERE domain = 'cpu_op' "
                       "ORDER BY start_ns, end_ns DESC, name").fetchall() == sorted(ops, key=lambda o: (o[1], -o[2], o[0]))

    monkeypatch.setattr(json_stage, "STAGE_THREADS", 1)
    monkeypatch.setattr(kineto, "MEMORY_STAGING_BYTES", 0)  # and staged on disk, as a large trace is
    one = open_store(tmp_path / "serial.duckdb", create=True)
    load_trace(one, path)
    assert len(serial_passes) == 1
    skip = "('traces', 'traceq_meta', 'attributions')"  # their times: the load's, in seconds
    for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                                f"AND table_name NOT IN {skip}").fetchall():
        def rows(c, table=table):
            return sorted(c.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
        assert rows(con) == rows(one), table


_SERIAL = __import__("traceq.ingest.json_stage", fromlist=["_serial"])._serial
_INSERT = __import__("traceq.ingest.json_stage", fromlist=["_insert"])._insert


def test_staged_on_disk_operators_in_file_order(tmp_path: Path, monkeypatch) -> None:
    """Staged on disk one batch after the other (as a trace of more than 256 MiB is), the
    operators come out in the file's order without a sort, and a trace without collectives skips
    their query and stores none."""
    from traceq.ingest import json_events, json_stage, kineto

    monkeypatch.setattr(json_events, "BLOCK_BYTES", 32 << 10)
    monkeypatch.setattr(json_events, "BATCH_BYTES", 96 << 10)
    monkeypatch.setattr(json_stage, "STAGE_THREADS", 1)
    monkeypatch.setattr(kineto, "MEMORY_STAGING_BYTES", 0)
    queries = []
    batches = kineto._batches
    monkeypatch.setattr(kineto, "_batches", lambda scratch, sql: queries.append(sql) or batches(scratch, sql))
    path = sample("alexnet_b256_kineto.json")
    con = open_store(tmp_path / "disk.duckdb", create=True)
    load_trace(con, path)
    ops = [(e["name"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), json.dumps(e["args"]["Input Dims"], separators=(",", ":")))
           for e in read_json(path)["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {})]
    assert len(ops) > 500
    got = con.execute("SELECT name, start_ns, end_ns, input_dims FROM operators ORDER BY rowid").fetchall()
    assert got == ops
    assert not any("ORDER BY seq" in q and "input_dims" in q for q in queries)
    assert not any("collective" in q for q in queries)
    assert con.execute("SELECT count(*) FROM collectives").fetchall() == [(0,)]
