"""Each kernel's launching call, stored at load (`kernel_events.launch_*`, `ingest.launches`):
against the export's own join of kernels to calls (read with sqlite3), against a dictionary
lookup on random keys, and the analyses unchanged where the store has no call stored (a reader
that finds none at load: the view and `operations.with_calls` join instead)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from conftest import SAMPLES, sample, shared, shared_files, source_count, source_rows, trace_id
from polars.testing import assert_frame_equal

from traceq.ingest.launches import LAUNCH_COLUMNS, CallIndex, call_keys

NSYS = sorted(p.name for p in SAMPLES.glob("*.sqlite"))


def _source_calls(path: Path) -> list[tuple]:
    """Per kernel in the export's row order: its launching call's start, end and name, from the
    export's own tables (runtime and driver calls named as launches, of the kernel's process)."""
    if not source_count(path, "CUPTI_ACTIVITY_KIND_KERNEL"):
        return []
    if not source_count(path, "CUPTI_ACTIVITY_KIND_RUNTIME"):
        return [(None, None, None)] * source_count(path, "CUPTI_ACTIVITY_KIND_KERNEL")
    return source_rows(path, """
        SELECT r.start, r."end", s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k
        LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
             AND (r.globalTid / 16777216) % 16777216 = (k.globalPid / 16777216) % 16777216
             AND r.eventClass IN (0, 1)
             AND r.nameId IN (SELECT id FROM StringIds WHERE value LIKE '%aunch%')
        LEFT JOIN StringIds s ON s.id = r.nameId
        ORDER BY k.rowid""")


def _stored_calls(con, t: int) -> list[tuple]:
    """The same from the store: kernel_events.launch_* with the name's id resolved."""
    return con.execute(f"""
        SELECT e.launch_start_ns, e.launch_end_ns, n.name FROM kernel_events e
        LEFT JOIN api_names n ON n.trace_id = e.trace_id AND n.name_id = e.launch_name_id
        WHERE e.trace_id = {t} ORDER BY e.kernel_id""").fetchall()


@pytest.mark.parametrize("name", NSYS + [p.name for p in shared_files("realtraces/nsys_sqlite", "*.sqlite")])
def test_stored_calls_are_the_exports_join(sample_store, tmp_path, name: str) -> None:
    """Every kernel's stored call is the one the export's tables join it to (a pair of calls
    with one id does not occur in these files), its times shifted as the kernels' are."""
    path = SAMPLES / name if name in NSYS else shared_files("realtraces/nsys_sqlite", name)[0]
    if name in NSYS:
        con, t = sample_store, trace_id(sample_store, path.stem)
    else:
        from traceq.api.loading import load_trace
        from traceq.store import open_store

        con = open_store(tmp_path / "s.duckdb", create=True)
        t = load_trace(con, path).trace_id
    want = _source_calls(path)
    got = _stored_calls(con, t)
    assert len(got) == len(want)
    assert [r[2] for r in got] == [r[2] for r in want]
    linked = [(g, w) for g, w in zip(got, want) if w[0] is not None]
    assert all(g[0] is not None for g, _ in linked)
    if linked:  # one shift for every call: the stored times are the source's, relative to one origin
        shifts = {w[0] - g[0] for g, w in linked} | {w[1] - g[1] for g, w in linked}
        assert len(shifts) == 1


def test_a_sample_has_calls_of_two_processes(sample_store) -> None:
    """ddp_resnet18_2gpu's two ranks number their calls alike: the process keeps them apart."""
    t = trace_id(sample_store, "ddp_resnet18_2gpu")
    rows = sample_store.execute(f"""
        SELECT q.pid, count(*), count(DISTINCT t.pid), bool_and(t.pid = q.pid) FROM kernel_events e
        JOIN kernel_queues q ON q.trace_id = e.trace_id AND q.queue_id = e.queue_id
        JOIN api_threads t ON t.trace_id = e.trace_id AND t.thread_id = e.launch_thread_id
        WHERE e.trace_id = {t} GROUP BY q.pid ORDER BY q.pid""").fetchall()
    assert len(rows) == 2 and all(r[2] == 1 and r[3] for r in rows)


@pytest.mark.parametrize("seed", range(6))
def test_call_index_against_a_dictionary(seed: int) -> None:
    """Random calls of three processes, keys unsorted or sorted, some repeated, some calls not
    launches: each kernel finds the last call with its key, as a dictionary built in order does."""
    rng = random.Random(seed)
    n = 3000
    pids = [rng.choice([7, 8, 2**20]) for _ in range(n)]
    ids = [rng.randrange(0, 2000) if seed % 2 else i * 3 + rng.randrange(3) for i in range(n)]
    if seed % 3 == 0:
        ids = sorted(ids)
    launch = [rng.random() < 0.8 for _ in range(n)]
    starts = [rng.randrange(0, 10**12) for _ in range(n)]
    ends = [s + rng.choice([5, 2**33]) for s in starts]  # durations past 32 bits keep their width
    names = [rng.randrange(0, 70000 if seed == 5 else 30) for _ in range(n)]
    threads = [rng.randrange(0, 5) for _ in range(n)]
    index = CallIndex()
    for lo in range(0, n, 700):  # in batches, as the reader adds them
        hi = min(lo + 700, n)
        keys = call_keys(pa.array(pids[lo:hi], pa.int64()), pa.array(ids[lo:hi], pa.int64()))
        keys = pa.array([k if ok else None for k, ok in zip(keys.to_pylist(), launch[lo:hi])], pa.int64())
        index.add(keys, pa.array(starts[lo:hi], pa.int64()), pa.array(ends[lo:hi], pa.int64()),
                  pa.array(names[lo:hi], pa.int32()), pa.array(threads[lo:hi], pa.int32()))
    index.finish()
    last = {}
    for i in range(n):
        if launch[i]:
            last[(pids[i], ids[i])] = (starts[i], ends[i], names[i], threads[i])
    kernel_pids = [rng.choice([7, 8, 9, 2**20, None]) for _ in range(2000)]
    kernel_ids = [rng.choice([rng.randrange(0, 6500), None, -1, 2**33]) for _ in range(2000)]
    found = index.launches(call_keys(pa.array(kernel_pids, pa.int64()), pa.array(kernel_ids, pa.int64())))
    got = list(zip(*(found[c].to_pylist() for c in LAUNCH_COLUMNS)))
    want = [last.get((p, i), (None,) * 4) for p, i in zip(kernel_pids, kernel_ids)]
    assert got == want
    assert found["launch_start_ns"].type == pa.int64() and found["launch_name_id"].type == pa.int32()


def _outputs(path: Path) -> dict[str, pl.DataFrame]:
    import traceq

    t = traceq.open(path).trace()
    frames = {"launches": t.launches(), "idle": t.idle(), "idle_iteration": t.idle("iteration"),
              "kern_exec": t.stats("cuda_kern_exec_sum"), "proj": t.stats("nvtx_gpu_proj_sum"),
              "view": t.con.sql(f"SELECT * FROM kernel_launches WHERE trace_id = {t.id} ORDER BY kernel_id").pl()}
    t.store.close()
    return frames


@pytest.mark.parametrize("name", ["alexnet_b64_graph.sqlite", "ddp_resnet18_2gpu.sqlite", "badloop_mlp.sqlite"])
def test_analyses_without_stored_calls_are_the_same(tmp_path, name: str) -> None:
    """A store whose kernels have no stored call (as a reader that finds none at load leaves
    them) gives the same launches, idle, nsys reports and kernel_launches rows: they join."""
    import duckdb

    import traceq

    linked = tmp_path / "linked.duckdb"
    traceq.load(sample(name), store=linked).store.close()
    unlinked = tmp_path / "unlinked.duckdb"
    shutil.copy(linked, unlinked)
    con = duckdb.connect(str(unlinked))
    con.execute(f"UPDATE kernel_events SET {', '.join(c + ' = NULL' for c in LAUNCH_COLUMNS)}")
    con.close()
    want, got = _outputs(linked), _outputs(unlinked)
    assert want["view"]["launch_start_ns"].null_count() < want["view"].height
    for key in want:
        assert_frame_equal(got[key], want[key])


def _gap_iterations_against_sql(con, t: int, like: str) -> list[tuple]:
    """(the gap's iteration, the range of its process named `like` (SQL) around its call's start,
    gaps) over the trace's gaps."""
    from traceq.analysis.timeline.gaps import gap_frame

    gaps, names = gap_frame(con, t)
    gaps = gaps.select("pid", "call_start_ns", "iteration").collect()
    frame = gaps.select("pid", "call_start_ns", iteration=names["iteration"].gather(gaps["iteration"]))
    con.register("_gaps", frame.to_arrow())
    try:
        return con.execute(f"""
            SELECT g.iteration, r.name, count(*) FROM _gaps g
            LEFT JOIN nvtx r ON r.trace_id = {t} AND r.pid = g.pid AND r.name LIKE '{like}'
                 AND g.call_start_ns >= r.start_ns AND g.call_start_ns < r.end_ns
            GROUP BY ALL""").fetchall()
    finally:
        con.unregister("_gaps")


@pytest.mark.parametrize("name", ["ddp_resnet18_2gpu", "badloop_mlp"])
def test_gaps_take_the_iteration_their_call_began_in(sample_store, name: str) -> None:
    """Every gap whose issuing call began inside an iteration range of its process belongs to that
    iteration (SQL over the store's ranges): rank 1 of ddp_resnet18_2gpu began its first
    iteration after its first calls, which the lookup by correlation id missed (450 gaps).
    badloop_mlp has one process, whose calls find their iteration by a search of its own."""
    rows = _gap_iterations_against_sql(sample_store, trace_id(sample_store, name), "iteration %")
    assert all(got == want for got, want, _ in rows)
    if name == "ddp_resnet18_2gpu":
        assert sum(n for got, _, n in rows if got == "iteration 0") > 450
    assert sum(n for got, _, n in rows if got is not None) > 0.9 * sum(n for _, _, n in rows)


def test_a_range_of_no_process_holds_no_call(tmp_path) -> None:
    """Kineto puts a copy of each ProfilerStep on the GPU's track, with no process: on this ROCm
    trace it ends 8 ms before the CPU's, and the gaps whose calls came after its end were taken
    out of the iteration (8 of 15) while attribution, stages and the SQL here keep them in."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    path = shared("realtraces", "kineto_json",
                  "facebookresearch__HolisticTraceAnalysis__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    con = open_store(tmp_path / "s.duckdb", create=True)
    t = load_trace(con, path).trace_id
    assert con.execute(f"SELECT count(*) FROM nvtx WHERE trace_id = {t} AND pid IS NULL "
                       "AND name LIKE 'ProfilerStep%'").fetchone()[0] > 0
    rows = _gap_iterations_against_sql(con, t, "ProfilerStep%")
    assert all(got == want for got, want, _ in rows)
    assert sum(n for got, _, n in rows if got == "ProfilerStep#1") == 15
    con.close()


def test_row_numbers_of_ids_never_point_past_the_table() -> None:
    """operations._row_of: ids numbered 0, 1, ... are their own rows; an id no row has (a
    damaged store) is null, not a row past the table's end that a gather would fail on."""
    from traceq.analysis.operations import _row_of

    dense = pl.DataFrame({"k": pl.Series([0, 1, 2], dtype=pl.Int32)})
    ids = pl.Series([0, 2, None, 1], dtype=pl.UInt32)
    assert _row_of(dense, "k", ids).to_list() == [0, 2, None, 1]
    assert _row_of(dense, "k", pl.Series([0, 5, None], dtype=pl.UInt32)).to_list() == [0, None, None]
    assert _row_of(dense.clear(), "k", pl.Series([0, None], dtype=pl.UInt32)).to_list() == [None, None]
    sparse = pl.DataFrame({"k": pl.Series([4, 9], dtype=pl.Int32)})
    assert _row_of(sparse, "k", pl.Series([9, 4, 7], dtype=pl.UInt32)).to_list() == [1, 0, None]
