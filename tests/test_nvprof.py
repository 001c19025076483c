"""nvprof databases load into the same tables as nsys exports; counts come from the source files.

Every expected number is computed here with sqlite3 straight from the nvprof database, never
through traceq. The 13 real databases live in ../shared/realtraces/nvprof_sqlite.
"""

from __future__ import annotations

import csv
import io
import shutil
import sqlite3
import struct
from pathlib import Path

import cxxfilt
import pytest
from conftest import assert_load_refused
from conftest import source_rows as query
from typer.testing import CliRunner

from traceq.api.loading import load_trace
from traceq.cli import app
from traceq.ingest import cupti_cbid
from traceq.ingest.nvprof import base_name, demangle
from traceq.store import open_store

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
NVPROF_DIR = SHARED / "realtraces" / "nvprof_sqlite"
NVPROF_FILES = sorted(NVPROF_DIR.glob("*")) if NVPROF_DIR.is_dir() else []
ABSENT = f"{NVPROF_DIR} is absent: the real nvprof databases are not beside this checkout"
EACH_FILE = NVPROF_FILES or [pytest.param(None, marks=pytest.mark.skip(reason=ABSENT))]
NSYS_SAMPLE = ROOT / "sample_traces" / "lenet_b256_cudnn.sqlite"
K = "CUPTI_ACTIVITY_KIND_"
VALID = 'start > 0 AND "end" >= start'

runner = CliRunner()


def nvprof(stem: str) -> Path:
    """One of the real nvprof databases; skips when ../shared is absent."""
    if not NVPROF_DIR.is_dir():
        pytest.skip(ABSENT)
    (path,) = [p for p in NVPROF_FILES if p.name.startswith(stem)]
    return path


def tables(path: Path) -> set[str]:
    return {r[0] for r in query(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}


def count(path: Path, table: str, where: str = "") -> int:
    return query(path, f'SELECT count(*) FROM "{table}" {where}')[0][0] if table in tables(path) else 0


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    con = open_store(tmp_path_factory.mktemp("nvprof") / "all.duckdb", create=True)
    yield con
    con.close()


_LOADS: dict[Path, object] = {}


def loaded(store, path: Path) -> int:
    """The trace id of `path` in the module's store, loading it on first use."""
    if path not in _LOADS:
        _LOADS[path] = load_trace(store, path)
    return _LOADS[path].trace_id


def scalar(store, sql: str, tid: int):
    return store.execute(sql, {"t": tid}).fetchall()[0][0]


@pytest.mark.parametrize("path", EACH_FILE, ids=lambda p: getattr(p, "name", "absent"))
def test_every_database_loads_with_source_counts(store, path: Path) -> None:
    tid = loaded(store, path)
    n = lambda sql: scalar(store, sql, tid)  # noqa: E731

    kernels = count(path, K + "CONCURRENT_KERNEL") + count(path, K + "KERNEL")
    incomplete = count(path, K + "CONCURRENT_KERNEL", f"WHERE NOT ({VALID})") + count(
        path, K + "KERNEL", f"WHERE NOT ({VALID})")
    assert n("SELECT count(*) FROM kernels WHERE trace_id = $t") == kernels - incomplete
    # the load says so: kernels still running when nvprof stopped have start = end = 0 (the only
    # damage-like records in these real databases; every other kind of record is complete)
    assert _LOADS[path].notes == ([f"{incomplete} kernels without a start or end time dropped"] if incomplete else [])
    assert n("SELECT kernel_count FROM traces WHERE trace_id = $t") == kernels - incomplete
    assert n("SELECT count(*) FROM api_calls WHERE trace_id = $t") == (
        count(path, K + "RUNTIME") + count(path, K + "DRIVER"))
    assert n("SELECT count(*) FROM api_calls WHERE trace_id = $t AND api = 'driver'") == count(path, K + "DRIVER")
    assert n("SELECT count(*) FROM memops WHERE trace_id = $t AND op = 'memcpy'") == (
        count(path, K + "MEMCPY") + count(path, K + "MEMCPY2"))
    assert n("SELECT count(*) FROM memops WHERE trace_id = $t AND op = 'memset'") == count(path, K + "MEMSET")
    assert n("SELECT count(*) FROM gpus WHERE trace_id = $t") == count(path, K + "DEVICE")
    paired = count(path, K + "MARKER", f"s WHERE flags = 2 AND EXISTS (SELECT 1 FROM {K}MARKER e "
                                       "WHERE e.flags = 4 AND e.id = s.id)")
    assert n("SELECT count(*) FROM nvtx WHERE trace_id = $t AND kind != 'mark'") == paired
    assert n("SELECT count(*) FROM nvtx WHERE trace_id = $t AND kind = 'mark'") == count(
        path, K + "MARKER", "WHERE flags = 1")

    version = query(path, "SELECT version FROM Version")[0][0]
    assert store.execute("SELECT format, source_schema_version FROM traces WHERE trace_id = ?",
                         [tid]).fetchall() == [("nvprof", str(version))]
    assert n("""SELECT count(*) FROM kernels WHERE trace_id = $t AND (name IS NULL OR short_name IS NULL
                OR mangled_name IS NULL OR name = '<unnamed kernel>' OR pid IS NULL)""") == 0
    assert n("SELECT count(*) FROM kernels WHERE trace_id = $t AND (dur_ns < 0 OR start_ns < 0)") == 0
    assert n("SELECT count(*) FROM api_calls WHERE trace_id = $t AND (name IS NULL OR name LIKE 'cbid_%')") == 0
    if count(path, K + "RUNTIME") + count(path, K + "DRIVER"):
        assert n("SELECT count(*) FROM kernel_launches WHERE trace_id = $t AND launch_api IS NULL") == 0
    # row by row, in source order: kernel_id follows CONCURRENT_KERNEL then KERNEL, by _id_
    t0 = n("SELECT session_start_utc_ns FROM traces WHERE trace_id = $t")
    source = [(start - t0, end - start, grid, corr) for kernels_table in ("CONCURRENT_KERNEL", "KERNEL")
              if K + kernels_table in tables(path) for start, end, grid, corr in query(
                  path, f'SELECT start, "end", gridX * gridY * gridZ, correlationId FROM {K}{kernels_table} '
                        f"WHERE {VALID} ORDER BY _id_")]
    assert store.execute("SELECT start_ns, dur_ns, grid_blocks, correlation_id FROM kernels WHERE trace_id = ? "
                         "ORDER BY kernel_id", [tid]).fetchall() == source
    threads = {(p, t & 0xFFFFFFFF) for api in ("RUNTIME", "DRIVER") if K + api in tables(path)
               for p, t in query(path, f"SELECT DISTINCT processId, threadId FROM {K}{api}")}
    assert set(store.execute("SELECT DISTINCT pid, tid FROM api_calls WHERE trace_id = ?", [tid]).fetchall()) == threads


@pytest.mark.parametrize("path", EACH_FILE, ids=lambda p: getattr(p, "name", "absent"))
def test_memory_kinds_read_with_cupti_numbering(store, path: Path) -> None:
    """CUPTI numbers memory kinds from 1 = pageable (nsys from 0): a copy to the GPU lands in 'Device'."""
    tid = loaded(store, path)
    kinds = set(store.execute("SELECT op, copy_kind, src_kind, dst_kind FROM memops WHERE trace_id = ?",
                              [tid]).fetchall())
    memset_kind = "memoryKind" in {r[1] for r in query(path, f"PRAGMA table_info({K}MEMSET)")}
    for op, copy, src, dst in kinds:
        if op == "memset":
            assert dst == ("Device" if memset_kind else None)
        elif copy == "Host-to-Device":
            assert (src, dst) in {("Pageable", "Device"), ("Pinned", "Device")}
        elif copy == "Device-to-Host":
            assert (src, dst) in {("Device", "Pageable"), ("Device", "Pinned")}
        elif copy == "Device-to-Device":
            assert (src, dst) == ("Device", "Device")


@pytest.mark.parametrize("path", EACH_FILE, ids=lambda p: getattr(p, "name", "absent"))
def test_times_are_relative_to_the_earliest_event(store, path: Path) -> None:
    tid = loaded(store, path)
    have = tables(path)
    parts = [f'SELECT min(start) AS m FROM "{K}{t}" WHERE {VALID}' for t in
             ("CONCURRENT_KERNEL", "KERNEL", "RUNTIME", "DRIVER", "MEMCPY", "MEMCPY2", "MEMSET") if K + t in have]
    parts.append(f"SELECT min(timestamp) AS m FROM {K}MARKER WHERE timestamp > 0")
    first = query(path, f"SELECT min(m) FROM ({' UNION ALL '.join(parts)})")[0][0]
    assert scalar(store, "SELECT session_start_utc_ns FROM traces WHERE trace_id = $t", tid) == first
    earliest = scalar(store, """SELECT min(s) FROM (
        SELECT min(start_ns) AS s FROM kernels WHERE trace_id = $t
        UNION ALL SELECT min(start_ns) FROM api_calls WHERE trace_id = $t
        UNION ALL SELECT min(start_ns) FROM memops WHERE trace_id = $t
        UNION ALL SELECT min(start_ns) FROM nvtx WHERE trace_id = $t)""", tid)
    assert earliest == 0
    source_first_kernel = query(path, " UNION ALL ".join(
        f'SELECT min(start) FROM "{K}{t}" WHERE {VALID}' for t in ("CONCURRENT_KERNEL", "KERNEL") if K + t in have))
    expected = min(r[0] for r in source_first_kernel if r[0] is not None) - first
    assert scalar(store, "SELECT min(start_ns) FROM kernels WHERE trace_id = $t", tid) == expected


def test_incomplete_kernels_are_dropped(store) -> None:
    """One qcu rank stopped with 5 kernels unfinished (start = end = 0); the other has none."""
    a = nvprof("ZhangXin8069__qcu__test__log_x99-Yang_1236834")
    b = nvprof("ZhangXin8069__qcu__test__log_x99-Yang_1236835")
    assert count(a, K + "CONCURRENT_KERNEL") == 4011 and count(a, K + "CONCURRENT_KERNEL", "WHERE start = 0") == 5
    assert scalar(store, "SELECT kernel_count FROM traces WHERE trace_id = $t", loaded(store, a)) == 4006
    assert scalar(store, "SELECT kernel_count FROM traces WHERE trace_id = $t", loaded(store, b)) == 4006


def test_four_gpu_nccl_file_has_four_devices(store) -> None:
    path = nvprof("UCBerkeley-Spring2022-CS267-project__blinkplus")
    tid = loaded(store, path)
    used = {r[0] for r in query(path, f"SELECT DISTINCT deviceId FROM {K}CONCURRENT_KERNEL")}
    assert used == {0, 1, 2, 3}
    devices = store.execute("SELECT DISTINCT device_id FROM kernels WHERE trace_id = ?", [tid]).fetchall()
    assert {r[0] for r in devices} == used
    assert scalar(store, "SELECT gpus FROM traces WHERE trace_id = $t", tid) == "4x Tesla V100-SXM2-32GB"
    # DEVICE gives kHz and kB/s; the store has Hz and B/s.
    clock_khz, bw_kbs, mem = query(path, f"SELECT coreClockRate, globalMemoryBandwidth, globalMemorySize "
                                         f"FROM {K}DEVICE WHERE id = 0")[0]
    assert store.execute("SELECT clock_hz, memory_bandwidth_bytes_per_s, memory_bytes, sm_count, cc_major FROM gpus "
                         "WHERE trace_id = ? AND device_id = 0", [tid]).fetchall() == [
        (clock_khz * 1000, bw_kbs * 1000, mem, 80, 7)]
    assert clock_khz * 1000 == 1_530_000_000
    launches = store.execute("SELECT DISTINCT launch_api, launch_type FROM kernel_launches WHERE trace_id = ?",
                             [tid]).fetchall()
    assert launches == [("cudaLaunchCooperativeKernelMultiDevice_v9000", "cooperative_multi_device")]


def test_kernel_names_demangled_with_short_and_mangled(store) -> None:
    path = nvprof("UCBerkeley-Spring2022-CS267-project__blinkplus")
    rows = set(store.execute("SELECT name, short_name, mangled_name FROM kernels WHERE trace_id = ?",
                             [loaded(store, path)]).fetchall())
    assert rows == {
        ("ncclAllReduceTreeLLKernel_sum_i32(ncclColl)", "ncclAllReduceTreeLLKernel_sum_i32",
         "_Z33ncclAllReduceTreeLLKernel_sum_i328ncclColl"),
        ("ncclBroadcastRingLLKernel_copy_i8(ncclColl)", "ncclBroadcastRingLLKernel_copy_i8",
         "_Z33ncclBroadcastRingLLKernel_copy_i88ncclColl"),
    }
    lm = loaded(store, nvprof("josiahdavis__profiling-lm"))
    assert store.execute("SELECT name, short_name, mangled_name FROM kernels WHERE trace_id = ? "
                         "AND name = 'volta_sgemm_128x64_nn' LIMIT 1", [lm]).fetchall() == [
        ("volta_sgemm_128x64_nn",) * 3]
    shorts = {r[0] for r in store.execute("SELECT short_name FROM kernels WHERE trace_id = ?", [lm]).fetchall()}
    assert {"elementwise_kernel", "reduce_kernel", "cunn_SoftMaxForward", "softmax_warp_forward"} <= shorts


@pytest.mark.parametrize("path", EACH_FILE, ids=lambda p: getattr(p, "name", "absent"))
def test_names_match_cxxfilt_and_short_names_are_bare(store, path: Path) -> None:
    tid = loaded(store, path)
    for name, short, mangled in store.execute(
            "SELECT DISTINCT name, short_name, mangled_name FROM kernels WHERE trace_id = ?", [tid]).fetchall():
        if mangled.startswith("_Z"):
            assert name == cxxfilt.demangle(mangled) != mangled
            assert short and not any(c in short for c in "()<>: ") and short in name
        else:
            assert name == short == mangled


def test_base_name() -> None:
    assert base_name("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                     "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"
                     ) == "vectorized_elementwise_kernel"
    assert base_name("ncclAllReduceRingLLKernel_sum_f32(ncclColl)") == "ncclAllReduceRingLLKernel_sum_f32"
    assert base_name("void (anonymous namespace)::softmax_warp_forward<float, 6>(float*, int)") == \
        "softmax_warp_forward"
    assert base_name("void at::native::(anonymous namespace)::kern<float, at::native::f(at::TensorBase const&)::"
                     "{lambda(int)#1}>(long, float)") == "kern"
    assert base_name("std::enable_if<use<quda::rngArg>(), void>::type quda::Kernel2D<quda::init, quda::rngArg>"
                     "(quda::rngArg)") == "Kernel2D"
    assert demangle("volta_sgemm_128x64_nn") == ("volta_sgemm_128x64_nn", "volta_sgemm_128x64_nn")
    assert demangle("_Z15squareMatrixGpuPdS_") == ("squareMatrixGpu(double*, double*)", "squareMatrixGpu")


def test_kernel_rows_match_nsys_columns_and_types(store) -> None:
    """A kernel row from nvprof has the columns, types and non-null pattern of one from nsys."""
    if not NSYS_SAMPLE.exists():
        pytest.skip(f"{NSYS_SAMPLE} is absent")
    nsys = loaded(store, NSYS_SAMPLE)
    columns = [r[0] for r in store.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'kernels' ORDER BY column_index").fetchall()]
    shape = ", ".join(f"any_value(typeof({c})), bool_and({c} IS NOT NULL)" for c in columns)

    def pattern(tid: int) -> list:
        return store.execute(f"SELECT {shape} FROM kernels WHERE trace_id = ?", [tid]).fetchall()[0]

    reference = pattern(nsys)
    for stem in ("UCBerkeley-Spring2022-CS267-project__blinkplus", "ZhangXin8069__qcu__test__log_x99-Yang_1236834"):
        got = pattern(loaded(store, nvprof(stem)))
        differ = [c for i, c in enumerate(columns) if got[2 * i: 2 * i + 2] != reference[2 * i: 2 * i + 2]]
        assert differ == [], f"{stem}: {differ}"


def test_nvtx_ranges_from_markers(store) -> None:
    path = nvprof("ZhangXin8069__qcu__test__log_x99-Yang_1236834")
    tid = loaded(store, path)
    obj, name, first_ts = query(path, f"SELECT objectId, (SELECT value FROM StringTable WHERE _id_ = m.name), "
                                      f"timestamp FROM {K}MARKER m WHERE flags = 2 ORDER BY _id_ LIMIT 1")[0]
    pid, tid32 = struct.unpack_from("<II", obj)
    assert (pid, tid32) == (1236834, 0x789E21C0) and obj[8:] == b"\0\0\0\0"
    t0 = scalar(store, "SELECT session_start_utc_ns FROM traces WHERE trace_id = $t", tid)
    assert store.execute("SELECT name, domain, kind, pid, tid FROM nvtx WHERE trace_id = ? AND start_ns = ?",
                         [tid, first_ts - t0]).fetchall() == [(name, "NCCL", "pushpop", pid, tid32)]
    # the marker thread is one of the threads that called the CUDA API
    api_threads = {(r[0], r[1] & 0xFFFFFFFF) for r in query(path, f"SELECT processId, threadId FROM {K}RUNTIME")}
    assert (pid, tid32) in api_threads
    assert store.execute("SELECT count(*), count(DISTINCT tid), min(dur_ns) >= 0 FROM nvtx WHERE trace_id = ?",
                         [tid]).fetchall() == [(1748, 1, True)]
    assert store.execute("SELECT pid, tid, name FROM threads WHERE trace_id = ?", [tid]).fetchall() == [
        (1236834, 1237125, "NCCL Progress 0")]
    other = loaded(store, nvprof("ZhangXin8069__qcu__test__log_x99-Yang_1236835"))
    assert scalar(store, "SELECT count(*) FROM nvtx WHERE trace_id = $t AND kind = 'pushpop'", other) == 1747


def test_nvtx_colors_and_start_end_ranges(store, tmp_path: Path) -> None:
    path = nvprof("F64081169__Nvprof_Jetson_Nano_Example__yolo")
    tid = loaded(store, path)
    colors = {r[0] & 0xFFFFFFFF for r in query(path, f"SELECT color FROM {K}MARKER_DATA WHERE flags & 2")}
    assert colors == {0xFFD2691E, 0xFFFFD700}
    stored = store.execute("SELECT DISTINCT color FROM nvtx WHERE trace_id = ?", [tid]).fetchall()
    assert {r[0] for r in stored} == colors
    assert scalar(store, "SELECT count(*) FROM nvtx WHERE trace_id = $t AND domain = 'TensorRT'", tid) == 58
    # a range that ends on another thread, and one that outlives its enclosing range, are start/end
    copy = tmp_path / "cross.nvvp"
    shutil.copy(path, copy)
    con = sqlite3.connect(copy)
    # bytes 8-12 belong to the union's other member: they must not leak into the thread id
    con.execute(f"UPDATE {K}MARKER SET objectId = X'42370000FFFFFFFF01020304' WHERE id = 2 AND flags = 4")
    con.execute(f"UPDATE {K}MARKER SET timestamp = (SELECT max(timestamp) + 1 FROM {K}MARKER) "
                "WHERE id = 4 AND flags = 4")
    con.commit()
    con.close()
    cross = load_trace(store, copy).trace_id
    got = store.execute("SELECT name, kind, end_tid FROM nvtx WHERE trace_id = ? AND kind = 'startend' "
                        "ORDER BY start_ns", [cross]).fetchall()
    assert got == [("Reformatting CopyNode for Input Tensor 0 to 001_convolutional + 001_convolutional_bn",
                    "startend", 0xFFFFFFFF), ("PWN(001_convolutional_lrelu)", "startend", 0x9C3A6010)]


def test_callback_ids() -> None:
    assert cupti_cbid.RUNTIME[211] == "cudaLaunchKernel_v7000"
    assert cupti_cbid.RUNTIME[41] == "cudaMemcpyAsync_v3020"
    assert cupti_cbid.RUNTIME[165] == "cudaDeviceSynchronize_v3020"
    assert cupti_cbid.RUNTIME[430] == "cudaLaunchKernelExC_v11060"
    assert cupti_cbid.DRIVER[307] == "cuLaunchKernel"
    assert cupti_cbid.DRIVER[126] == "cuStreamSynchronize"
    for path in NVPROF_FILES:  # every id the real databases use has its name
        for api, table in (("RUNTIME", cupti_cbid.RUNTIME), ("DRIVER", cupti_cbid.DRIVER)):
            assert {r[0] for r in query(path, f"SELECT DISTINCT cbid FROM {K}{api}")} <= set(table), path.name


def test_unknown_callback_id_and_duplicate_kernel_tables(store, tmp_path: Path) -> None:
    path = nvprof("UCBerkeley-Spring2022-CS267-project__blinkplus")
    copy = tmp_path / "edited.nvvp"
    shutil.copy(path, copy)
    con = sqlite3.connect(copy)
    con.execute(f"UPDATE {K}RUNTIME SET cbid = 9999 WHERE _id_ = 1")
    # the same 24 launches also in KERNEL (as when both activity kinds are on), plus one of its own
    con.execute(f"INSERT INTO {K}KERNEL SELECT * FROM {K}CONCURRENT_KERNEL")
    con.execute(f"CREATE TEMP TABLE extra AS SELECT * FROM {K}CONCURRENT_KERNEL WHERE _id_ = 1")
    con.execute("UPDATE extra SET _id_ = 100, correlationId = 999999")
    con.execute(f"INSERT INTO {K}KERNEL SELECT * FROM extra")
    con.commit()
    con.close()
    assert count(copy, K + "KERNEL") == 25
    tid = load_trace(store, copy).trace_id
    assert scalar(store, "SELECT count(*) FROM kernels WHERE trace_id = $t", tid) == 25
    assert scalar(store, "SELECT count(*) FROM api_calls WHERE trace_id = $t AND name = 'cbid_9999'", tid) == 1


def test_several_processes_and_peer_copies(store, tmp_path: Path) -> None:
    """GPU records carry no pid: with two processes each takes its API call's; MEMCPY2 rows load."""
    path = nvprof("UCBerkeley-Spring2022-CS267-project__blinkplus")
    copy = tmp_path / "two_processes.nvvp"
    shutil.copy(path, copy)
    con = sqlite3.connect(copy)
    moved = f"(SELECT DISTINCT correlationId FROM {K}CONCURRENT_KERNEL ORDER BY 1 LIMIT 3)"
    con.execute(f"UPDATE {K}RUNTIME SET processId = 4242 WHERE correlationId IN {moved} "
                f"OR correlationId IN (SELECT correlationId FROM {K}MEMCPY)")
    n_moved = con.execute(f"SELECT count(*) FROM {K}CONCURRENT_KERNEL WHERE correlationId IN {moved}").fetchone()[0]
    con.execute(f"""INSERT INTO {K}MEMCPY2 (copyKind, srcKind, dstKind, flags, bytes, start, "end", deviceId,
                    contextId, streamId, srcDeviceId, srcContextId, dstDeviceId, dstContextId, correlationId,
                    graphNodeId, graphId)
                    SELECT 10, 3, 3, 0, bytes, start, "end", 1, contextId, streamId, 0, 1, 1, 2, correlationId, 0, 0
                    FROM {K}MEMCPY LIMIT 3""")
    con.commit()
    con.close()
    tid = load_trace(store, copy).trace_id
    pids = store.execute("SELECT pid, count(*) FROM kernels WHERE trace_id = ? GROUP BY ALL ORDER BY 1",
                         [tid]).fetchall()
    assert pids == [(4242, n_moved), (52977, 24 - n_moved)] and 0 < n_moved < 24
    assert store.execute("SELECT DISTINCT pid FROM memops WHERE trace_id = ? AND op = 'memcpy'", [tid]).fetchall() == [
        (4242,)]
    assert store.execute("SELECT copy_kind, src_kind, dst_kind, count(*) FROM memops WHERE trace_id = ? "
                         "AND copy_kind = 'Peer-to-Peer' GROUP BY ALL", [tid]).fetchall() == [
        ("Peer-to-Peer", "Device", "Device", 3)]
    assert scalar(store, "SELECT count(*) FROM memops WHERE trace_id = $t AND op = 'memcpy'", tid) == 124 + 3


def test_bad_nvprof_files_leave_the_store_alone(tmp_path: Path) -> None:
    path = nvprof("josiahdavis__profiling-lm")
    data = path.read_bytes()
    cut = tmp_path / "cut.nvvp"
    cut.write_bytes(data[: len(data) // 2])
    assert_load_refused(tmp_path / "never.duckdb", cut, "truncated")  # no store is created either

    db = tmp_path / "store.duckdb"
    result = runner.invoke(app, ["load", str(nvprof("dipsankarb__csl7520")), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert_load_refused(db, cut, "truncated")
    tiny = tmp_path / "tiny.prof"
    tiny.write_bytes(data[:4096])
    assert_load_refused(db, tiny, "truncated")

    bare = tmp_path / "bare.sqlite"  # the activity tables are gone
    shutil.copy(path, bare)
    con = sqlite3.connect(bare)
    for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'CUPTI%'"
                                ).fetchall():
        con.execute(f'DROP TABLE "{table}"')
    con.commit()
    con.close()
    assert_load_refused(db, bare, "not a profiler export")

    broken = tmp_path / "broken.nvvp"  # kernel table without its time columns
    shutil.copy(path, broken)
    con = sqlite3.connect(broken)
    con.execute(f"DROP TABLE {K}CONCURRENT_KERNEL")
    con.execute(f"CREATE TABLE {K}CONCURRENT_KERNEL (_id_ INTEGER PRIMARY KEY, name INT)")
    con.commit()
    con.close()
    assert_load_refused(db, broken, "lacks column start")

    damaged = bytearray(data)  # junk pages: detection passes, reading fails part-way
    page = int.from_bytes(damaged[16:18], "big")
    for start in range(page * 4, len(damaged) - page, page * 3):
        damaged[start: start + page] = b"\xa5" * page
    bad = tmp_path / "damaged.nvvp"
    bad.write_bytes(bytes(damaged))
    assert_load_refused(db, bad)
    assert runner.invoke(app, ["traces", "--db", str(db), "-f", "csv"]).output.count("\n") == 2


@pytest.mark.parametrize("path", EACH_FILE, ids=lambda p: getattr(p, "name", "absent"))
def test_cli_load_and_top(tmp_path: Path, path: Path) -> None:
    db = tmp_path / "one.duckdb"
    copy = tmp_path / ("run" + path.suffix)  # any name: the content decides
    shutil.copy(path, copy)
    result = runner.invoke(app, ["load", str(copy), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "loaded 'run'" in result.stdout
    result = runner.invoke(app, ["top", "--db", str(db), "-f", "csv", "-k", "3"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert 1 <= len(rows) <= 3
    heaviest = query(path, " UNION ALL ".join(
        f'SELECT s.value, sum("end" - start) AS total FROM "{K}{t}" k JOIN StringTable s ON s._id_ = k.name '
        f"WHERE {VALID} GROUP BY s.value" for t in ("CONCURRENT_KERNEL", "KERNEL") if K + t in tables(path))
        + " ORDER BY total DESC LIMIT 1")[0]
    assert (rows[0]["name"], int(rows[0]["total_ns"])) == (demangle(heaviest[0])[0], heaviest[1])
