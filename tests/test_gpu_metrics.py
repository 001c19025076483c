"""GPU metrics of an nsys trace recorded with --gpu-metrics-devices (issue 36): the samples read
at load, and the measured SM, tensor and DRAM activity `traceq ru` and `traceq ce` show per kernel
name and layer, each checked against an integration over the raw export's samples written here
(a sample holds until the next one of its metric)."""

from __future__ import annotations

import sqlite3
import warnings
from bisect import bisect_right
from collections import defaultdict

import pytest
from conftest import sample

from traceq.api.loading import load_trace
from traceq.api.store import Store
from traceq.errors import TraceqError
from traceq.store import open_store

METRICS = "conventions/cnn_nsys_gpu_metrics.sqlite"
PLAIN = "alexnet_b256_cudnn.sqlite"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("metrics") / "s.duckdb"
    con = open_store(path, create=True)
    for name in (METRICS, PLAIN):
        load_trace(con, sample(name))
    con.close()
    return path


def _raw():
    return sqlite3.connect(f"file:{sample(METRICS)}?mode=ro", uri=True)


def _series(raw: sqlite3.Connection, name: str) -> tuple[list[int], list[float]]:
    rows = raw.execute("""SELECT g.timestamp, g.value FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS n
                          ON n.typeId = g.typeId AND n.metricId = g.metricId WHERE n.metricName = ?
                          ORDER BY g.timestamp""", [name]).fetchall()
    return [r[0] for r in rows], [float(r[1]) for r in rows]


def _integral(times: list[int], values: list[float], start: int, end: int) -> tuple[float, float]:
    """(value x ns, covered ns) over [start, end): sample i holds over [t_i, t_i+1)."""
    total = covered = 0.0
    i = max(bisect_right(times, start) - 1, 0)
    while i + 1 < len(times) and times[i] < end:
        lo, hi = max(start, times[i]), min(end, times[i + 1])
        if hi > lo:
            total += values[i] * (hi - lo)
            covered += hi - lo
        i += 1
    return total, covered


def _reference_by_name(name: str) -> dict[str, float]:
    """Per kernel (demangled) name: the time-weighted mean of metric `name` over its kernels."""
    raw = _raw()
    times, values = _series(raw, name)
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for kname, start, end in raw.execute("""SELECT s.value, k.start, k."end" FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                            JOIN StringIds s ON s.id = k.demangledName"""):
        total, covered = _integral(times, values, start, end)
        sums[kname][0] += total
        sums[kname][1] += covered
    return {k: t / c for k, (t, c) in sums.items() if c > 0}


def test_samples_read_at_load(db) -> None:
    raw = _raw()
    expected = raw.execute("""SELECT n.metricName, count(*), sum(g.value) FROM GPU_METRICS g
                              JOIN TARGET_INFO_GPU_METRICS n ON n.typeId = g.typeId AND n.metricId = g.metricId
                              WHERE n.metricName LIKE '%[Throughput \\%]' ESCAPE '\\' GROUP BY 1""").fetchall()
    assert len(expected) == 12
    store = Store(db)
    t = store.trace("cnn_nsys_gpu_metrics")
    got = t.con.execute("SELECT metric, count(*), sum(value) FROM gpu_metrics WHERE trace_id = ? GROUP BY 1",
                        [t.id]).fetchall()
    assert sorted((m, n, pytest.approx(v)) for m, n, v in expected) == sorted(got)
    assert t.con.execute("SELECT DISTINCT device_id FROM gpu_metrics WHERE trace_id = ?", [t.id]).fetchall() == [(0,)]


@pytest.mark.parametrize(("column", "metric"), [("sm_active_pct", "SMs Active [Throughput %]"),
                                                ("tensor_active_pct", "Tensor Active [Throughput %]")])
def test_ru_by_kernel_measures_each_kernel_name(db, column: str, metric: str) -> None:
    expected = _reference_by_name(metric)
    frame = Store(db).trace("cnn_nsys_gpu_metrics").ru("kernel")
    got = dict(zip(frame["name"], frame[column]))
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-9), name
    assert max(expected.values()) > 50  # the GEMM kernels kept the GPU busy: the numbers say something


def test_dram_bandwidth_is_the_share_of_the_gpus_peak(db) -> None:
    read, write = (_reference_by_name(f"DRAM {d} Bandwidth [Throughput %]") for d in ("Read", "Write"))
    peak = _raw().execute("SELECT memoryBandwidth FROM TARGET_INFO_GPU").fetchone()[0]  # bytes/s
    frame = Store(db).trace("cnn_nsys_gpu_metrics").ru("kernel")
    for name, pct, gbps in zip(frame["name"], frame["dram_pct"], frame["dram_gbps"]):
        assert pct == pytest.approx(read[name] + write[name], rel=1e-9, abs=1e-9)
        assert gbps == pytest.approx(pct / 100 * peak / 1e9, rel=1e-9, abs=1e-9)


def test_layers_weight_their_kernels_by_time(db) -> None:
    """By layer: each layer's kernels' integrals over their time; the kernels of a pass are found
    here by the NVTX range (forward, backward, weight_update) their launching call sits in."""
    raw = _raw()
    times, values = _series(raw, "SMs Active [Throughput %]")
    ranges = raw.execute("""SELECT n.start, n."end", coalesce(n.text, s.value) FROM NVTX_EVENTS n
                            LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = 59""").fetchall()
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for at, start, end in raw.execute("""SELECT a.start, k.start, k."end" FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                         JOIN CUPTI_ACTIVITY_KIND_RUNTIME a ON a.correlationId = k.correlationId"""):
        names = {r[2] for r in ranges if r[0] <= at < r[1]}
        part = next((p for p in ("forward", "backward") if p in names), None)
        if part:
            total, covered = _integral(times, values, start, end)
            sums[part][0] += total
            sums[part][1] += covered
    frame = Store(db).trace("cnn_nsys_gpu_metrics").ru("layer")
    got = {p: (frame.filter(frame["pass"] == p)["sm_active_pct"] * frame.filter(frame["pass"] == p)["total_ns"]).sum()
           / frame.filter(frame["pass"] == p)["total_ns"].sum() for p in ("forward", "backward")}
    for part, (total, covered) in sums.items():
        assert got[part] == pytest.approx(total / covered, rel=0.02), part


def test_a_trace_without_metrics_says_so_once(db) -> None:
    """`ru` and `ce` of a trace without metrics are as they were, without a note each time;
    `gpumetrics` refuses it, saying how to record them."""
    t = Store(db).trace(PLAIN.removesuffix(".sqlite"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = t.ru("kernel")
    assert "sm_active_pct" not in frame.columns
    assert not [w for w in caught if "GPU metrics" in str(w.message)]
    with pytest.raises(TraceqError, match="--gpu-metrics-devices"):
        t.gpu_metrics()


def test_advise_is_silent_where_tensor_pipes_were_busy(db) -> None:
    frame = Store(db).trace("cnn_nsys_gpu_metrics").advise()
    assert "idle_tensor_cores" not in frame["rule"].to_list()  # cuDNN's kernels: tensor pipes 64-82 % busy


def test_advise_reports_idle_tensor_cores(tmp_path) -> None:
    """The same trace with every Tensor Active sample set to 10 %: each layer's tensor-core
    kernels had their tensor pipes idle 90 % of their time."""
    path = tmp_path / "s.duckdb"
    con = open_store(path, create=True)
    load_trace(con, sample(METRICS))
    con.execute("UPDATE gpu_metrics SET value = 10 WHERE metric = 'Tensor Active [Throughput %]'")
    xmma = con.execute("SELECT sum(dur_ns) FROM kernels WHERE name LIKE '%xmma%'").fetchall()[0][0]
    con.close()
    frame = Store(path).trace("cnn_nsys_gpu_metrics").advise()
    found = frame.filter(frame["rule"] == "idle_tensor_cores")
    assert found.height == 1
    assert "tensor cores idle 90 %" in found["evidence"][0]
    # at stake: 90 % of the tensor-core kernels' time, cuDNN's xmma convolutions among them
    assert found["time_ns"][0] >= 0.9 * xmma * 0.99


def test_iterations_weight_their_kernels_by_time(db) -> None:
    """Per iteration: the samples integrated over the kernels launched inside each NVTX
    `iteration N` range of the raw export, SM active and DRAM read alike."""
    raw = _raw()
    ranges = [r for r in raw.execute("""SELECT n.start, n."end", coalesce(n.text, s.value) FROM NVTX_EVENTS n
                                        LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = 59""")
              if r[2].startswith("iteration ")]
    assert len(ranges) == 8
    kernels = raw.execute("""SELECT a.start, k.start, k."end" FROM CUPTI_ACTIVITY_KIND_KERNEL k
                             JOIN CUPTI_ACTIVITY_KIND_RUNTIME a ON a.correlationId = k.correlationId""").fetchall()
    frame = Store(db).trace("cnn_nsys_gpu_metrics").gpu_metrics("iteration")
    assert frame["iteration"].to_list() == [f"iteration {i}" for i in range(8)]
    for column, metric in (("sm_active_pct", "SMs Active [Throughput %]"),
                           ("tensor_active_pct", "Tensor Active [Throughput %]")):
        times, values = _series(raw, metric)
        for name, lo, hi in ((r[2], r[0], r[1]) for r in ranges):
            total = covered = 0.0
            for at, start, end in kernels:
                if lo <= at < hi:
                    t, c = _integral(times, values, start, end)
                    total, covered = total + t, covered + c
            got = frame.filter(frame["iteration"] == name)[column][0]
            assert got == pytest.approx(total / covered, rel=1e-9), (column, name)


def test_two_gpus_each_get_their_own_samples(tmp_path) -> None:
    """The recording made into a two-GPU trace: every other kernel moved to device 1, whose
    samples (typeId with low byte 1, metric ids of its own) hold SMs Active at 50 %. Each
    kernel sees its own GPU's samples: device 1's exactly 50 %, device 0's the recorded ones."""
    from traceq.analysis.efficiency.measured import kernel_integrals

    path = tmp_path / "two.sqlite"
    path.write_bytes(sample(METRICS).read_bytes())
    raw = sqlite3.connect(path)
    raw.executescript("""
        INSERT INTO TARGET_INFO_GPU (vmId, id, name, memoryBandwidth) SELECT vmId, 1, name, memoryBandwidth
            FROM TARGET_INFO_GPU WHERE id = 0;
        UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 1 WHERE rowid % 2 = 0;
        INSERT INTO TARGET_INFO_GPU_METRICS SELECT typeId + 1, sourceId, typeName, metricId + 100, metricName
            FROM TARGET_INFO_GPU_METRICS;
        INSERT INTO GPU_METRICS SELECT rawTimestamp, timestamp, typeId + 1, metricId + 100,
            CASE WHEN metricId = 3 THEN 50 ELSE value END FROM GPU_METRICS;
    """)
    raw.commit()
    assert raw.execute("SELECT metricName FROM TARGET_INFO_GPU_METRICS WHERE metricId = 3").fetchone()[0] \
        == "SMs Active [Throughput %]"
    rows = raw.execute("""SELECT g.timestamp, g.value FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS n
                          ON n.typeId = g.typeId AND n.metricId = g.metricId
                          WHERE n.metricName = 'SMs Active [Throughput %]' AND g.typeId % 256 = 0
                          ORDER BY g.timestamp""").fetchall()  # device 0's samples
    times, values = [r[0] for r in rows], [float(r[1]) for r in rows]
    kernels = raw.execute('SELECT deviceId, start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid').fetchall()
    raw.close()
    con = open_store(tmp_path / "s.duckdb", create=True)
    trace = load_trace(con, path).trace_id
    got = kernel_integrals(con, trace).sort("kernel_id")
    con.close()
    checked = {0: 0, 1: 0}
    for (device, start, end), (total, covered) in zip(kernels, got.select("sm_active_pct_ns", "covered_ns").rows()):
        if not covered:
            continue
        expected = 50.0 if device == 1 else _integral(times, values, start, end)[0] / covered
        assert total / covered == pytest.approx(expected, rel=1e-9)
        checked[device] += 1
    assert checked[0] > 300 and checked[1] > 300


def test_a_store_made_before_the_table_gets_it_at_load(tmp_path) -> None:
    """A store without `gpu_metrics` (made before it existed) reads as before, and its first load
    of a trace with metrics creates the table, in the load's transaction."""
    path = tmp_path / "old.duckdb"
    con = open_store(path, create=True)
    con.execute("DROP TABLE gpu_metrics")
    load_trace(con, sample(PLAIN))
    con.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert "sm_active_pct" not in Store(path).trace(PLAIN.removesuffix(".sqlite")).ru("kernel").columns
    con = open_store(path)
    load_trace(con, sample(METRICS))
    count = con.execute("SELECT count(*) FROM gpu_metrics").fetchone()[0]
    con.close()
    assert count == 12 * 1703
    assert "sm_active_pct" in Store(path).trace("cnn_nsys_gpu_metrics").ru("kernel").columns


def test_metrics_without_kernels(tmp_path) -> None:
    """The metrics recording with every kernel row deleted (the fuzzer's damaged times dropped them
    all): the measured columns are there, of no kernel, and advise runs (it raised
    ColumnNotFoundError in the integrals' pivot)."""
    import shutil

    from traceq.analysis.efficiency.measured import kernel_integrals

    path = tmp_path / "nokernels.sqlite"
    shutil.copy(sample(METRICS), path)
    with sqlite3.connect(path) as raw:
        raw.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    con = open_store(tmp_path / "s.duckdb", create=True)
    t = load_trace(con, path).trace_id
    integrals = kernel_integrals(con, t)
    con.close()
    assert integrals.is_empty() and {"tensor_active_pct_ns", "sm_active_pct_ns"} <= set(integrals.columns)
    assert Store(tmp_path / "s.duckdb").trace(t).advise().height >= 0
