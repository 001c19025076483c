"""HolisticTraceAnalysis' own expected values on its test traces (copies in ../shared/realtraces).

The numbers below are written in HTA's tests, at commit f4d0062 of facebookresearch/HolisticTraceAnalysis
(`tests/test_trace_analysis.py` and `tests/test_trace_parse.py`); the queries that reproduce them
over our store are this file's own. HTA keeps only the events of the profiler steps but the last
(`align_and_filter_trace`, `include_last_profiler_step=False`): a GPU event belongs to the step of
the CPU call that launched it, by correlation id. HTA's tests assert no kernel-time breakdown of a
trace in the corpus (theirs are of `vision_transformer` and an MTIA trace, not published with it).
"""

from __future__ import annotations

import pytest
from conftest import shared

from traceq.api.loading import load_trace
from traceq.store import open_store

pytestmark = pytest.mark.xdist_group("kineto_hta")  # one worker builds its module fixtures once (--dist loadgroup)

NS_RESOLUTION = "facebookresearch__HolisticTraceAnalysis__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
TRITON = "facebookresearch__HolisticTraceAnalysis__triton_example.json.gz"
NCCL = "facebookresearch__HolisticTraceAnalysis__nccl_parser_config__nccl_data.json.gz"

# the GPU events (kernels, copies, sets) HTA keeps, with the gpu_user_annotation ranges they overlap
KEPT = """
    WITH steps AS (
        SELECT start_ns, end_ns, row_number() OVER (ORDER BY start_ns DESC) AS from_last
        FROM nvtx WHERE trace_id = $id AND name LIKE 'ProfilerStep#%'),
    gpu AS (
        SELECT correlation_id, start_ns, end_ns, stream_id, name FROM kernels WHERE trace_id = $id
        UNION ALL SELECT correlation_id, start_ns, end_ns, stream_id, 'Memcpy ' || copy_kind FROM memops
        WHERE trace_id = $id AND op = 'memcpy'
        UNION ALL SELECT correlation_id, start_ns, end_ns, stream_id, 'Memset' FROM memops
        WHERE trace_id = $id AND op = 'memset'),
    kept AS (
        SELECT gpu.* FROM gpu
        JOIN api_calls a ON a.trace_id = $id AND a.correlation_id = gpu.correlation_id
        JOIN steps ON a.start_ns >= steps.start_ns AND a.start_ns < steps.end_ns AND from_last > 1)
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    folder = shared("realtraces", "kineto_json")
    con = open_store(tmp_path_factory.mktemp("hta") / "hta.duckdb", create=True)
    ids = {name: load_trace(con, folder / name).trace_id for name in (NS_RESOLUTION, TRITON, NCCL)}
    yield con, ids
    con.close()


def test_ns_resolution_gpu_events_and_annotations(store) -> None:
    """test_get_gpu_kernels_with_user_annotations: 4876 GPU kernels in the kept steps; the copy
    with correlation 135139 runs inside "DistributedDataParallel.forward", the kernel with
    correlation 164926 is multi_tensor_apply_kernel inside "Optimizer.step#SGD.step".
    test_gpu_user_annotation_breakdown / test_cpu_user_annotation_breakdown: 3 GPU and 12 CPU
    user annotation names."""
    con, ids = store
    params = {"id": ids[NS_RESOLUTION]}
    assert con.execute(KEPT + "SELECT count(*) FROM kept", params).fetchall() == [(4876,)]
    inside = con.execute(KEPT + """
        SELECT k.correlation_id, k.name, u.name FROM kept k
        JOIN nvtx u ON u.trace_id = $id AND u.domain = 'gpu_user_annotation' AND u.tid = k.stream_id
             AND k.start_ns < u.end_ns AND k.end_ns > u.start_ns
        WHERE k.correlation_id IN (135139, 164926) ORDER BY 1""", params).fetchall()
    assert [(c, u) for c, _, u in inside] == [(135139, "DistributedDataParallel.forward"),
                                              (164926, "Optimizer.step#SGD.step")]
    assert inside[0][1] == "Memcpy Device-to-Device"  # HTA: "Memcpy DtoD (Device -> Device)"
    assert "multi_tensor_apply_kernel" in inside[1][1]
    gpu_names = con.execute("SELECT count(DISTINCT name) FROM nvtx WHERE trace_id = $id "
                            "AND domain = 'gpu_user_annotation'", params).fetchall()
    cpu_names = con.execute("""
        WITH steps AS (SELECT start_ns, end_ns, row_number() OVER (ORDER BY start_ns DESC) AS from_last
                       FROM nvtx WHERE trace_id = $id AND name LIKE 'ProfilerStep#%')
        SELECT count(DISTINCT u.name) FROM nvtx u JOIN steps ON u.start_ns >= steps.start_ns
               AND u.start_ns < steps.end_ns AND from_last > 1
        WHERE u.trace_id = $id AND u.domain = 'user_annotation'""", params).fetchall()
    assert (gpu_names, cpu_names) == ([(3,)], [(12,)])


def test_triton_start_time(store) -> None:
    """test_get_trace_start_unixtime_ns: the first event at 2413669096090100 ns of the trace's
    clock, whose zero is baseTimeNanoseconds 1727743122000000000 (HTA allows 1 us of rounding;
    the store keeps both exactly)."""
    con, ids = store
    tid = ids[TRITON]
    first = con.execute("""
        SELECT min(s) FROM (SELECT min(start_ns) AS s FROM kernels WHERE trace_id = $id
            UNION ALL SELECT min(start_ns) FROM memops WHERE trace_id = $id
            UNION ALL SELECT min(start_ns) FROM api_calls WHERE trace_id = $id
            UNION ALL SELECT min(start_ns) FROM nvtx WHERE trace_id = $id)""", {"id": tid}).fetchall()
    assert first == [(2413669096090100,)]
    assert con.execute("SELECT session_start_utc_ns FROM traces WHERE trace_id = ?", [tid]).fetchall() == [
        (1727743122000000000,)]


def test_nccl_kernels_and_their_collective(store) -> None:
    """test_nccl_parser_config (tests/test_trace_parse.py): 21 kernels named ncclKernel...; the
    longest is an allreduce of 2049000 elements in and out, in split and out split '[]', process
    group '0' ('default_pg', ranks '[0, 1]')."""
    con, ids = store
    params = {"id": ids[NCCL]}
    assert con.execute("SELECT count(*) FROM kernels WHERE trace_id = $id AND name LIKE '%ncclKernel%'",
                       params).fetchall() == [(21,)]
    longest = con.execute("""
        SELECT c.collective, c.in_msg_nelems, c.out_msg_nelems, c.in_split_size, c.out_split_size,
               c.pg_name, c.pg_desc, c.pg_ranks
        FROM kernels k JOIN collectives c ON c.trace_id = k.trace_id AND c.kernel_id = k.kernel_id
        WHERE k.trace_id = $id AND k.name LIKE '%ncclKernel%'
        ORDER BY k.end_ns - k.start_ns DESC LIMIT 1""", params).fetchall()
    assert longest == [("allreduce", 2049000, 2049000, "[]", "[]", "0", "default_pg", "[0, 1]")]
