"""GPU memory (`analysis.memory`, `traceq memory`) on the sample traces, checked against the source
SQLite files, plus allocations placed on real API calls to check the per-layer attribution."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from conftest import sample, source_rows, trace_id
from typer.testing import CliRunner

from traceq.analysis.memory import memory_by_layer, memory_events, memory_summary, memory_timeline
from traceq.analysis.structure.attribution import kernel_attribution
from traceq.cli import app
from traceq.errors import MissingDataError

runner = CliRunner()
WITH_EVENTS = ["alexnet_b256_cudnn", "alexnet_b128_cudnn", "alexnet_b256_nocudnn", "lenet_b256_cudnn",
               "alexnet_b64_nocache"]
HOST_KIND_IDS = "(0, 1)"  # ENUM_CUDA_MEM_KIND: Pageable, Pinned


def _source(name: str, sql: str) -> list[tuple]:
    return source_rows(sample(name + ".sqlite"), sql)


def _source_peak(name: str) -> int:
    """Peak device bytes in use, computed from CUDA_GPU_MEMORY_USAGE_EVENTS alone."""
    return _source(name, f"""
        SELECT max(in_use) FROM (
            SELECT sum(CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes END) OVER (
                       PARTITION BY deviceId ORDER BY start, memoryOperationType DESC, rowid
                       ROWS UNBOUNDED PRECEDING) AS in_use
            FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind NOT IN {HOST_KIND_IDS})""")[0][0]


@pytest.mark.parametrize("name", WITH_EVENTS)
def test_peak_matches_the_source(sample_store, name: str) -> None:
    summary = memory_summary(sample_store, trace_id(sample_store, name))
    assert summary.height == 1
    row = summary.row(0, named=True)
    assert row["peak_bytes"] == _source_peak(name)
    device_allocs = _source(name, "SELECT count(*), sum(bytes) FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
                                  f"WHERE memoryOperationType = 0 AND memKind NOT IN {HOST_KIND_IDS}")[0]
    assert (row["allocs"], row["alloc_bytes"]) == device_allocs
    pinned = _source(name, "SELECT coalesce(sum(bytes), 0) FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind = 1 "
                           "AND memoryOperationType = 0")[0][0]
    assert row["host_pinned_bytes"] == pinned
    assert row["memory_bytes"] == _source(name, "SELECT totalMemory FROM TARGET_INFO_GPU")[0][0]
    assert row["peak_pct"] == pytest.approx(100 * row["peak_bytes"] / row["memory_bytes"])


def test_alexnet_numbers(sample_store) -> None:
    """The numbers the report shows for the paper's configuration, pinned down."""
    t = trace_id(sample_store, "alexnet_b256_cudnn")
    row = memory_summary(sample_store, t).row(0, named=True)
    assert row["peak_bytes"] == 3_196_602_444  # 35 cudaMalloc segments + 781 module statics
    assert row["peak_ts_ns"] == 0 and row["frees"] == 0
    # PyTorch's caching allocator grew during warm-up, before cudaProfilerStart: nsys lists
    # what was allocated then at time 0, with correlation ids of calls outside the capture.
    assert row["before_capture_bytes"] == row["peak_bytes"]
    timeline = memory_timeline(sample_store, t)
    assert timeline["bytes_in_use"].max() == row["peak_bytes"]
    assert timeline["bytes_in_use"].is_sorted()  # allocations only


@pytest.mark.parametrize("name", WITH_EVENTS)
def test_per_layer_sums_to_the_total(sample_store, name: str) -> None:
    t = trace_id(sample_store, name)
    by_layer = memory_by_layer(sample_store, t)
    summary = memory_summary(sample_store, t).row(0, named=True)
    assert by_layer["alloc_bytes"].sum() == summary["alloc_bytes"]
    assert by_layer["allocs"].sum() == summary["allocs"]
    if name != "alexnet_b64_nocache":  # the others' caching allocator was warm before the capture
        assert by_layer["where"].to_list() == ["before capture"]


def test_no_memory_events_is_a_one_line_hint(sample_store, tmp_path: Path) -> None:
    with pytest.raises(MissingDataError, match=r"--cuda-memory-usage=true"):
        memory_by_layer(sample_store, trace_id(sample_store, "ddp_resnet18_2gpu"))
    db = tmp_path / "ddp.duckdb"
    assert runner.invoke(app, ["load", str(sample("ddp_resnet18_2gpu.sqlite")), "--db", str(db)]).exit_code == 0
    for by in ("layer", "time"):
        result = runner.invoke(app, ["memory", "--by", by, "--db", str(db)])
        assert result.exit_code == 1
        lines = result.stderr.strip().splitlines()
        assert lines == ["traceq: ddp_resnet18_2gpu has no CUDA memory usage events: "
                         "capture with `nsys profile --cuda-memory-usage=true ...`"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory):
    """alexnet_b256_cudnn with allocations planted on real launch calls inside layers.

    The real traces were captured after warm-up, so none of their allocations falls inside a
    layer range. Here each of six kernel launches' API calls also 'allocates' 1 MiB times its
    index, and the next launch's call frees it (with 0 bytes, as some drivers report), so the
    memory events' attribution can be compared with the kernels' own.
    """
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    con = open_store(tmp_path_factory.mktemp("planted") / "p.duckdb", create=True)
    load_trace(con, sample("alexnet_b256_cudnn.sqlite"))
    t = trace_id(con, "alexnet_b256_cudnn")
    launches = con.sql(f"""
        SELECT k.kernel_id, k.correlation_id, k.pid, k.device_id, k.launch_start_ns
        FROM kernel_launches k WHERE k.trace_id = {t} AND k.launch_start_ns IS NOT NULL
        ORDER BY k.launch_start_ns""").pl()
    layers = kernel_attribution(con, t).select("kernel_id", "layer", "pass")
    chosen = (launches.join(layers, on="kernel_id").filter(pl.col("layer").is_not_null())
              .unique("layer", keep="first", maintain_order=True).head(6))
    rows = []
    for i, r in enumerate(chosen.iter_rows(named=True), start=1):
        address = 0x7F00_0000_0000 + i * (1 << 24)
        rows.append((t, r["launch_start_ns"] + 100, "alloc", i << 20, address, "Device", r["device_id"],
                     r["correlation_id"], r["pid"]))
        rows.append((t, r["launch_start_ns"] + 5_000_000, "free", 0, address, "Device", r["device_id"], None,
                     r["pid"]))
    con.executemany("INSERT INTO memory_events (trace_id, ts_ns, op, bytes, address, mem_kind, device_id, "
                    "correlation_id, pid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    yield con, t, chosen
    con.close()


def test_allocations_are_attributed_like_the_launches(planted) -> None:
    con, t, chosen = planted
    events = memory_events(con, t).filter(pl.col("api_call").is_not_null())
    assert events.height == chosen.height
    assert sorted(zip(events["layer"], events["pass"], events["bytes"])) == sorted(
        (r["layer"], r["pass"], i << 20) for i, r in enumerate(chosen.iter_rows(named=True), start=1))
    by_layer = memory_by_layer(con, t)
    planted_rows = by_layer.filter(pl.col("where") == "layer")
    assert planted_rows.height == chosen.height
    assert set(planted_rows["layer"]) == set(chosen["layer"])
    assert planted_rows["alloc_bytes"].sum() == sum(i << 20 for i in range(1, chosen.height + 1))
    # frees came with no API call and no size: sized from their allocation, outside layers
    frees = by_layer.filter(pl.col("where") == "outside layers")
    assert frees["frees"].sum() == chosen.height and frees["freed_bytes"].sum() == planted_rows["alloc_bytes"].sum()
    assert by_layer["alloc_bytes"].sum() == memory_summary(con, t)["alloc_bytes"].sum()


def test_bytes_in_use_rise_and_fall(planted) -> None:
    con, t, chosen = planted
    timeline = memory_timeline(con, t)
    base = 3_196_602_444  # what was allocated before the capture
    captured = timeline.filter(pl.col("ts_ns") > 0)
    assert captured["bytes_in_use"].min() >= base
    assert captured["bytes_in_use"][-1] == base  # everything planted was freed
    summary = memory_summary(con, t).row(0, named=True)
    assert summary["peak_bytes"] == timeline["bytes_in_use"].max() > base
    assert summary["final_bytes"] == base


def test_cli_memory_formats(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    assert runner.invoke(app, ["load", str(sample("alexnet_b256_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    result = runner.invoke(app, ["memory", "--db", str(db), "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert list(rows[0]) == ["device_id", "layer", "pass", "allocs", "alloc_bytes", "frees", "freed_bytes",
                             "net_bytes", "share_of_device_pct", "where"]
    assert rows[0]["alloc_bytes"] == 3_196_602_444
    out = tmp_path / "timeline.csv"
    result = runner.invoke(app, ["memory", "--by", "time", "-t", "alexnet_b256_cudnn", "--db", str(db), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().splitlines()[0] == ("event_id,ts_ns,device_id,op,mem_kind,bytes,bytes_in_use,layer,pass,"
                                               "before_capture")
    table = runner.invoke(app, ["memory", "--db", str(db)], env={"COLUMNS": "160"}).stdout
    assert table.startswith("alexnet_b256_cudnn: device memory allocated per layer and pass (GPU 0 peak 3.0 GiB")
    assert "before capture" in table


def test_activations_are_allocated_in_their_layer(sample_store) -> None:
    """alexnet_b64_nocache ran without PyTorch's caching allocator (tools/record_alexnet_memory.py),
    so every tensor is a cudaMalloc inside its layer's range: each layer's allocations are the
    analytic sizes of its outputs (fp32, batch 64), twice (2 iterations)."""
    frame = memory_by_layer(sample_store, trace_id(sample_store, "alexnet_b64_nocache"))

    def allocated(layer: str) -> int:
        return int(frame.filter(pl.col("layer") == layer)["alloc_bytes"].sum())

    f32 = 4 * 64  # bytes of one fp32 value, times the batch
    assert allocated("relu1") == 2 * f32 * 64 * 56 * 56
    assert allocated("relu2") == 2 * f32 * 192 * 27 * 27
    assert allocated("relu3") == 2 * f32 * 384 * 13 * 13
    assert allocated("fc6") == allocated("fc7") == 2 * f32 * 4096
    assert allocated("fc8") == 2 * f32 * 1000
    # max pooling keeps int64 indices beside its fp32 output: 3x the output's fp32 bytes
    assert allocated("pool1") == 2 * 3 * f32 * 64 * 27 * 27
    # backward fc6: input gradient + weight gradient + bias gradient
    assert allocated("bfc6") == 2 * (f32 * 9216 + 4 * 4096 * 9216 + 4 * 4096)
    # the paper's §5.4: conv1, conv2 and fc6 are among the layers that allocate the most
    top = frame.filter(pl.col("where") == "layer").sort("alloc_bytes", descending=True)["layer"].head(6).to_list()
    assert {"conv1", "bfc6", "conv2"} <= set(top)
