"""Every Nsight Systems export we have loads, and the store matches the source tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SAMPLES, shared_files, source_count

from traceq.api.loading import load_trace
from traceq.store import open_store

pytestmark = pytest.mark.xdist_group("ingest_nsys")  # one worker builds its module fixtures once (--dist loadgroup)

NSYS_FILES = (
    sorted(SAMPLES.glob("*.sqlite"))
    + shared_files("reference", "*.sqlite")
    + shared_files("realtraces/nsys_sqlite", "*.sqlite")
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    con = open_store(tmp_path_factory.mktemp("nsys") / "all.duckdb", create=True)
    yield con
    con.close()


def _load(store, path: Path) -> int:
    name = f"{path.parent.name}/{path.stem}"
    result = load_trace(store, path, name=name)
    assert result.notes == []  # a real export is never repaired (traceq.ingest.validate)
    return result.trace_id


@pytest.mark.parametrize("path", NSYS_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_export_loads_with_source_counts(store, path: Path) -> None:
    tid = _load(store, path)
    counts = dict(store.execute(
        """SELECT 'kernels', count(*) FROM kernels WHERE trace_id = $t
           UNION ALL SELECT 'api_calls', count(*) FROM api_calls WHERE trace_id = $t
           UNION ALL SELECT 'memcpy', count(*) FROM memops WHERE trace_id = $t AND op = 'memcpy'
           UNION ALL SELECT 'memset', count(*) FROM memops WHERE trace_id = $t AND op = 'memset'
           UNION ALL SELECT 'nvtx', count(*) FROM nvtx WHERE trace_id = $t
           UNION ALL SELECT 'memory_events', count(*) FROM memory_events WHERE trace_id = $t""",
        {"t": tid}).fetchall())
    assert counts["kernels"] == source_count(path, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert counts["api_calls"] == source_count(path, "CUPTI_ACTIVITY_KIND_RUNTIME")
    assert counts["memcpy"] == source_count(path, "CUPTI_ACTIVITY_KIND_MEMCPY")
    assert counts["memset"] == source_count(path, "CUPTI_ACTIVITY_KIND_MEMSET")
    assert counts["nvtx"] == source_count(path, "NVTX_EVENTS", "WHERE eventType IN (34, 59, 60)")
    assert counts["memory_events"] == source_count(path, "CUDA_GPU_MEMORY_USAGE_EVENTS")
    recorded = store.execute("SELECT kernel_count FROM traces WHERE trace_id = ?", [tid]).fetchall()[0][0]
    assert recorded == counts["kernels"]
    unnamed = store.execute(
        "SELECT count(*) FROM kernels WHERE trace_id = ? AND (name IS NULL OR name = '' "
        "OR name = '<unnamed kernel>' OR short_name IS NULL)", [tid]).fetchall()[0][0]
    assert unnamed == 0
    bad_times = store.execute(
        "SELECT count(*) FROM kernels WHERE trace_id = ? AND (dur_ns < 0 OR dur_ns != end_ns - start_ns)",
        [tid]).fetchall()[0][0]
    assert bad_times == 0
    _threads_and_configurations_match_the_source(store, tid, path)
    if counts["kernels"]:
        launched = store.execute(
            "SELECT count(*), count(launch_tid) FROM kernel_launches WHERE trace_id = ?", [tid]).fetchall()[0]
        assert launched[0] == counts["kernels"], "the launch join must not duplicate kernels"
        assert launched[1] == counts["kernels"], "every kernel has its launching call and thread"


def _grouped(con, sql: str, params: list | None = None) -> list[tuple]:
    return sorted(map(tuple, con.execute(sql, params or []).fetchall()),
                  key=lambda row: tuple((value is None, value) for value in row))  # NULLs last


def _threads_and_configurations_match_the_source(store, tid: int, path: Path) -> None:
    """The store keeps each calling thread, launch configuration, launch queue and NVTX event's
    attributes once per trace (api_threads, kernel_configs, kernel_queues, nvtx_attributes); the
    views must give every call, launch and range back its own, as SQLite decodes them from the
    export's rows."""
    import sqlite3

    src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def column(table: str, name: str, expression: str | None = None) -> str:
        have = {r[1] for r in src.execute(f'PRAGMA table_info("{table}")')}
        return (expression or name) if name in have else "NULL"

    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        kernel = "CUPTI_ACTIVITY_KIND_KERNEL"
        expected = _grouped(src, f"SELECT {column(kernel, 'deviceId')}, {column(kernel, 'contextId')}, "
                                 f"{column(kernel, 'streamId')}, "
                                 f"{column(kernel, 'globalPid', 'globalPid / 16777216 % 16777216')}, count(*) "
                                 f"FROM {kernel} GROUP BY 1, 2, 3, 4")
        got = _grouped(store, "SELECT device_id, context_id, stream_id, pid, count(*) FROM kernels "
                              "WHERE trace_id = ? GROUP BY ALL", [tid])
        assert got == expected
    if "NVTX_EVENTS" in tables:
        gtid = column("NVTX_EVENTS", "globalTid", "e.globalTid")
        pid = f"{gtid} / 16777216 % 16777216"
        domains = ("(SELECT domainId, pid, text FROM (SELECT domainId, globalTid / 16777216 % 16777216 AS pid, text, "
                   "row_number() OVER (PARTITION BY domainId, globalTid / 16777216 % 16777216 ORDER BY rowid DESC) AS r "
                   "FROM NVTX_EVENTS WHERE eventType = 75) WHERE r = 1)")
        domain = "d.text" if column("NVTX_EVENTS", "domainId") != "NULL" else "NULL"
        join = f"LEFT JOIN {domains} d ON d.domainId = e.domainId AND d.pid = {pid}" if domain != "NULL" else ""
        expected = _grouped(src, f"""
            SELECT CASE e.eventType WHEN 34 THEN 'mark' WHEN 59 THEN 'pushpop' ELSE 'startend' END, {domain},
                   {column("NVTX_EVENTS", "category", "e.category")}, {column("NVTX_EVENTS", "color", "e.color")},
                   {pid}, {gtid} % 16777216, {gtid},
                   {column("NVTX_EVENTS", "endGlobalTid", "e.endGlobalTid % 16777216")}, count(*)
            FROM NVTX_EVENTS e {join} WHERE e.eventType IN (34, 59, 60) GROUP BY 1, 2, 3, 4, 5, 6, 7, 8""")
        got = _grouped(store, "SELECT kind, domain, category, color, pid, tid, global_tid, end_tid, count(*) "
                              "FROM nvtx WHERE trace_id = ? GROUP BY ALL", [tid])
        assert got == expected
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        expected = _grouped(src, "SELECT globalTid / 16777216 % 16777216, globalTid % 16777216, globalTid, count(*) "
                                 "FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1, 2, 3")
        got = _grouped(store, "SELECT pid, tid, global_tid, count(*) FROM api_calls WHERE trace_id = ? "
                              "GROUP BY 1, 2, 3", [tid])
        assert got == expected
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        columns = "gridX, gridY, gridZ, blockX, blockY, blockZ, registersPerThread, staticSharedMemory, " \
                  "dynamicSharedMemory, localMemoryTotal"
        expected = _grouped(src, f"SELECT {columns}, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10")
        got = _grouped(store, "SELECT grid_x, grid_y, grid_z, block_x, block_y, block_z, registers_per_thread, "
                              "smem_static_bytes, smem_dynamic_bytes, local_memory_total_bytes, count(*) "
                              "FROM kernels WHERE trace_id = ? GROUP BY ALL", [tid])
        assert got == expected
    src.close()


def test_names_agree_with_string_table(tmp_path: Path) -> None:
    import sqlite3

    path = SAMPLES / "alexnet_b256_cudnn.sqlite"
    src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    expected = sorted(src.execute(
        "SELECT d.value, s.value, m.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds d ON d.id = k.demangledName JOIN StringIds s ON s.id = k.shortName "
        "JOIN StringIds m ON m.id = k.mangledName").fetchall())
    con = open_store(tmp_path / "s.duckdb", create=True)
    tid = load_trace(con, path).trace_id
    got = sorted(con.execute(
        "SELECT name, short_name, mangled_name FROM kernels WHERE trace_id = ?", [tid]).fetchall())
    assert len(got) == 648 and got == expected


def test_gpu_description(sample_store) -> None:
    from conftest import trace_id

    rows = sample_store.execute(
        "SELECT device_id, name, cc_major, cc_minor, sm_count, clock_hz, max_smem_per_sm_bytes, "
        "max_smem_per_block_optin_bytes, max_warps_per_sm, max_blocks_per_sm FROM gpus "
        "WHERE trace_id = ? ORDER BY device_id", [trace_id(sample_store, "ddp_resnet18_2gpu")]).fetchall()
    assert rows == [
        (0, "NVIDIA H200", 9, 0, 132, 1_980_000_000, 233472, 232448, 64, 32),
        (1, "NVIDIA H200", 9, 0, 132, 1_980_000_000, 233472, 232448, 64, 32),
    ]
    gpus, = sample_store.execute("SELECT gpus FROM traces WHERE name = 'ddp_resnet18_2gpu'").fetchall()[0]
    assert gpus == "2x NVIDIA H200"


def test_kernel_launch_attributes(sample_store) -> None:
    """A cuDNN kernel's launch parameters, checked against the raw row of the export."""
    from conftest import trace_id

    row = sample_store.execute(
        "SELECT grid_x, grid_y, grid_z, block_x, grid_blocks, block_threads, registers_per_thread, "
        "smem_static_bytes, smem_dynamic_bytes, smem_carveout_bytes, smem_optin, launch_type "
        "FROM kernels WHERE trace_id = ? AND kernel_id = 0",
        [trace_id(sample_store, "alexnet_b256_cudnn")]).fetchall()[0]
    assert row == (1611, 1, 256, 256, 1611 * 256, 256, 32, 4224, 0, 102400, False, "regular")


def test_optin_flag_read_from_limit_config(sample_store) -> None:
    from conftest import trace_id

    path = SAMPLES / "alexnet_b256_cudnn.sqlite"
    optin = source_count(path, "CUPTI_ACTIVITY_KIND_KERNEL", "WHERE sharedMemoryLimitConfig = 1")
    got = sample_store.execute("SELECT count(*) FROM kernels WHERE trace_id = ? AND smem_optin",
                               [trace_id(sample_store, "alexnet_b256_cudnn")]).fetchall()[0][0]
    assert optin > 0 and got == optin


def test_nvtx_ranges_and_threads(sample_store) -> None:
    from conftest import trace_id

    tid = trace_id(sample_store, "alexnet_b256_cudnn")
    rows = sample_store.execute(
        "SELECT name, count(*), min(kind), count(DISTINCT tid) FROM nvtx WHERE trace_id = ? "
        "AND name IN ('forward', 'backward', 'conv1', 'bconv1') GROUP BY name ORDER BY name", [tid]).fetchall()
    assert rows == [("backward", 4, "pushpop", 1), ("bconv1", 4, "pushpop", 1),
                    ("conv1", 4, "pushpop", 1), ("forward", 4, "pushpop", 1)]
    # backward layer ranges are pushed on the autograd thread, forward ones on the main thread
    threads = sample_store.execute(
        "SELECT count(DISTINCT tid) FROM nvtx WHERE trace_id = ? AND name IN ('conv1', 'bconv1')",
        [tid]).fetchall()[0][0]
    assert threads == 2


def test_old_schema_gpu_table(tmp_path: Path) -> None:
    """Pre-2021.3 exports describe GPUs in TARGET_INFO_CUDA_GPU (clock in kHz)."""
    from conftest import shared

    path = shared("realtraces", "nsys_sqlite", "lockfuehrer__beast_ressoruces__report2.sqlite")
    con = open_store(tmp_path / "s.duckdb", create=True)
    tid = load_trace(con, path).trace_id
    rows = con.execute("SELECT device_id, name, cc_major, cc_minor, sm_count, clock_hz FROM gpus "
                       "WHERE trace_id = ? ORDER BY device_id", [tid]).fetchall()
    assert rows == [(0, "Tesla V100-PCIE-32GB", 7, 0, 80, 1_380_000_000),
                    (1, "Tesla V100-PCIE-32GB", 7, 0, 80, 1_380_000_000)]
    info = con.execute("SELECT tool, source_schema_version FROM traces WHERE trace_id = ?", [tid]).fetchall()
    assert info == [(None, None)]


def test_textid_nvtx_names_resolve(tmp_path: Path) -> None:
    """NVTX text registered as a string (textId) resolves through StringIds, never NULL."""
    from conftest import shared

    path = shared("reference", "ddp_resnet18_2gpu.sqlite")
    con = open_store(tmp_path / "s.duckdb", create=True)
    tid = load_trace(con, path).trace_id
    nulls = con.execute("SELECT count(*) FROM nvtx WHERE trace_id = ? AND name IS NULL", [tid]).fetchall()[0][0]
    named = con.execute("SELECT count(*) FROM nvtx WHERE trace_id = ? AND name LIKE 'iteration %'",
                        [tid]).fetchall()[0][0]
    assert nulls == 0 and named > 0
