"""`traceq idle`: the gaps of every device, checked against the source files read with sqlite3,
and their causes on traces recorded to show each."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest
from conftest import sample, shared, trace_id
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from traceq.analysis.timeline.gaps import CAUSE_LABELS, CAUSES, idle_gaps
from traceq.analysis.timeline.idle import idle_causes, idle_split
from traceq.cli import app


def source_gaps(path: Path) -> dict[int, list[tuple[int, int]]]:
    """Per device, every gap between the busy spells of its kernels, memcpys and memsets,
    computed from the export itself (a loop over its rows: the reference, not traceq's way)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        rows += con.execute(f'SELECT deviceId, start, "end" FROM {table}').fetchall()
    con.close()
    by_device: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for device, start, end in sorted(rows, key=lambda r: (r[0], r[1])):
        by_device[device].append((start, end))
    gaps: dict[int, list[tuple[int, int]]] = {}
    for device, spells in by_device.items():
        reach, found = spells[0][1], []
        for start, end in spells[1:]:
            if start > reach:
                found.append((reach, start))
            reach = max(reach, end)
        gaps[device] = found
    return gaps


@pytest.mark.parametrize("name", ["alexnet_b256_cudnn", "ddp_resnet18_2gpu"])
def test_gaps_equal_the_source_files(sample_store, name: str) -> None:
    gaps = idle_gaps(sample_store, trace_id(sample_store, name))
    want = source_gaps(sample(f"{name}.sqlite"))
    assert sorted(gaps["device_id"].unique()) == sorted(want)
    for device, expected in want.items():
        got = gaps.filter(pl.col("device_id") == device).sort("start_ns")
        assert list(zip(got["start_ns"], got["end_ns"])) == expected
    assert (gaps["dur_ns"] == gaps["end_ns"] - gaps["start_ns"]).all()
    assert set(gaps["cause"]) <= set(CAUSE_LABELS.values())


def test_causes_sum_to_the_idle_time(sample_store) -> None:
    tid = trace_id(sample_store, "ddp_resnet18_2gpu")
    frame, totals = idle_causes(sample_store, tid)
    assert frame["cause"].to_list() == [CAUSE_LABELS[c] for c in CAUSES]
    assert frame["total_ns"].sum() == totals.idle_ns == idle_gaps(sample_store, tid)["dur_ns"].sum()
    assert frame["pct"].sum() == pytest.approx(100.0)
    assert totals.devices == 2 and totals.iterations == 5
    by_iteration = idle_split(sample_store, tid, "iteration")
    causes = [f"{c}_ns" for c in CAUSES]
    assert (by_iteration.select(pl.sum_horizontal(causes)).to_series() == by_iteration["idle_ns"]).all()
    assert by_iteration["idle_ns"].sum() == totals.idle_ns


@pytest.mark.parametrize("by, keys", [("iteration", ("iteration", "device_id")), ("stream", ("device_id", "stream_id"))])
def test_split_equals_the_gaps_summed_one_by_one(sample_store, by: str, keys: tuple[str, str]) -> None:
    """Each row of `idle --by` (grouped by codes, named after) holds its key's gaps, summed here
    by a loop over the named gap list; iterations in the order their first gap began."""
    tid = trace_id(sample_store, "ddp_resnet18_2gpu")
    want: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, *[0] * len(CAUSES)])
    first: dict[object, int] = {}
    for gap in idle_gaps(sample_store, tid).iter_rows(named=True):
        sums = want[tuple(gap[k] for k in keys)]
        sums[0] += 1
        sums[1] += gap["dur_ns"]
        sums[2 + list(CAUSE_LABELS.values()).index(gap["cause"])] += gap["dur_ns"]
        first[gap[keys[0]]] = min(first.get(gap[keys[0]], gap["start_ns"]), gap["start_ns"])
    split = idle_split(sample_store, tid, by)
    columns = ["gaps", "idle_ns", *[f"{c}_ns" for c in CAUSES]]
    got = {tuple(r[k] for k in keys): [r[c] for c in columns] for r in split.iter_rows(named=True)}
    assert got == dict(want) and len(want) > 2
    if by == "iteration":
        named = sorted((k for k in first if k is not None), key=first.__getitem__) + [None] * (None in first)
        assert list(dict.fromkeys(split["iteration"])) == named


def test_queued_work_is_not_the_host(sample_store) -> None:
    """AlexNet with cuDNN is GPU-bound: the host ran ahead, every launch was queued before the GPU
    reached it, so no gap is the host's doing (not even under the capture's final
    cudaDeviceSynchronize, which covers the whole last iteration)."""
    gaps = idle_gaps(sample_store, trace_id(sample_store, "alexnet_b256_cudnn"))
    assert set(gaps["cause"]) == {"Other"}


def test_idle_cli(tmp_path) -> None:
    db = tmp_path / "s.duckdb"
    runner = CliRunner()
    assert runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    table = runner.invoke(app, ["idle", "--db", str(db)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "GPU idle" in table.stdout and "Launch-bound" in table.stdout
    rows = json.loads(runner.invoke(app, ["idle", "--by", "stream", "--db", str(db), "-f", "json"]).stdout)
    assert rows and {"device_id", "stream_id", "idle_ns", "sync_ns"} <= set(rows[0])
    bad = runner.invoke(app, ["idle", "--by", "nothing", "--db", str(db)])
    assert bad.exit_code == 2


def test_a_gap_goes_to_the_first_of_the_work_that_ends_it(tmp_path) -> None:
    """Kineto times work in µs, so several operations often start together after a gap. The gap
    goes to the first of them in the order the work is read (kernels, then copies and sets, each
    in the store's row order): the reference sorts that list stably by start with Python's
    sort and walks it. Three gaps of this trace went to another of the operations when the
    order was the one DuckDB's joins happened to return."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    path = shared("realtraces", "kineto_json", "facebookresearch__HolisticTraceAnalysis__trace_diff__test.json.gz")
    con = open_store(tmp_path / "s.duckdb", create=True)
    t = load_trace(con, path).trace_id
    work = con.execute(f"""
        SELECT q.device_id, e.start_ns, e.end_ns, n.name FROM kernel_events e
        JOIN kernel_queues q ON q.trace_id = e.trace_id AND q.queue_id = e.queue_id
        JOIN kernel_names n ON n.trace_id = e.trace_id AND n.name_id = e.name_id
        WHERE e.trace_id = {t} ORDER BY e.kernel_id""").fetchall()
    work += con.execute(f"""
        SELECT device_id, start_ns, end_ns,
               CASE op WHEN 'memcpy' THEN '[CUDA memcpy ' || copy_kind || ']' ELSE '[CUDA memset]' END
        FROM memops WHERE trace_id = {t} ORDER BY rowid""").fetchall()
    want, reach = [], {}
    for device, start, end, name in sorted(work, key=lambda w: w[1]):  # stable: ties keep the list's order
        if device in reach and start > reach[device]:
            want.append((device, reach[device], start, name))
        reach[device] = max(reach.get(device, end), end)
    gaps = idle_gaps(con, t)
    got = list(zip(gaps["device_id"], gaps["start_ns"], gaps["end_ns"], gaps["next_name"]))
    assert sorted(got) == sorted(want) and len(want) > 8000
    con.close()


@pytest.mark.parametrize("name", ["alexnet_b256_nocudnn", "alexnet_b256_cudnn", "alexnet_b64_graph", "badloop_mlp",
                                  "resnet50_b32_amp_ops", "ddp_resnet18_2gpu"])
def test_layers_found_per_time_class_equal_those_found_per_gap(sample_store, monkeypatch, name: str) -> None:
    """`idle --by layer` finds the layer of each time class of the launch calls (between two
    NVTX boundaries) rather than of each gap: the table equals the one with every gap's own
    time, on traces with layer ranges, inferred layers (the loss, weight gradients after their
    range) and CUDA graph replays."""
    import traceq.analysis.timeline.idle as idle_module

    tid = trace_id(sample_store, name)
    by_class = idle_split(sample_store, tid, "layer")
    classes = idle_module._time_classes
    seen = []

    def recorded(bounds, t, replay):
        got = classes(bounds, t, replay)
        seen.append((t.n_unique(), got[0].n_unique()))
        return got

    monkeypatch.setattr(idle_module, "_time_classes", recorded)
    assert_frame_equal(idle_split(sample_store, tid, "layer"), by_class)
    monkeypatch.setattr(idle_module, "_time_classes", lambda bounds, t, replay: (t, replay))
    by_gap = idle_split(sample_store, tid, "layer")
    assert_frame_equal(by_class, by_gap)
    assert by_gap["idle_ns"].sum() > 0 and by_gap["layer"].n_unique() > 2
    if name == "alexnet_b256_nocudnn":  # 37k launches, 189 NVTX events: a few hundred points
        assert seen[0][1] < seen[0][0] / 20


@pytest.mark.parametrize("seed", range(10))
def test_a_time_and_its_class_compare_alike_with_every_boundary(seed: int) -> None:
    """`_time_classes`: each time's representative is <, = or > each NVTX boundary exactly when
    the time is (random boundaries and times, many of them on a boundary or next to one); a
    replayed kernel's times and unknown times stay as they are."""
    import random

    from traceq.analysis.timeline.idle import _time_classes

    rng = random.Random(seed)
    bounds = sorted({rng.randrange(1000, 2000) for _ in range(30)})
    times = [rng.choice([rng.randrange(900, 2100), rng.choice(bounds) + rng.choice([-1, 0, 1])]) for _ in range(2000)]
    replay = [x + 7 if i % 50 == 0 else x for i, x in enumerate(times)]
    times[3] = replay[3] = None
    t, again = _time_classes(pl.Series(bounds, dtype=pl.Int64), pl.Series(times, dtype=pl.Int64),
                             pl.Series(replay, dtype=pl.Int64))
    assert t.n_unique() < len(set(times)) / 2
    for x, r, got, time in zip(times, replay, t, again):
        if x is None or r != x:
            assert (got, time) == (x, r)
            continue
        assert time == got
        assert all((x < b, x == b) == (got < b, got == b) for b in bounds), (x, got)


def test_per_iteration_counts_the_steady_iterations_only(tmp_path) -> None:
    """On a torch.compile trace whose first step compiles (the warm-up), a cause's per-iteration
    idle is its gaps in the steady iterations over their number, not its total over them."""
    from traceq.analysis.timeline.gaps import idle_gaps
    from traceq.analysis.timeline.idle import idle_causes
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    con = open_store(tmp_path / "s.duckdb", create=True)
    t = load_trace(con, sample("conventions/gpt_kineto_compile_cold.json.gz")).trace_id
    frame, totals = idle_causes(con, t)
    gaps = idle_gaps(con, t)
    con.close()
    steady = gaps.filter(pl.col("iteration").is_not_null() & (pl.col("iteration") != "warm-up"))
    assert totals.iterations == steady["iteration"].n_unique() >= 2
    want = dict(steady.group_by("cause").agg(pl.col("dur_ns").sum()).iter_rows())
    got = dict(frame.select("cause", "per_iteration_ns").iter_rows())
    assert all(got[c] == want.get(c, 0) // totals.iterations for c in got)
    assert any(total // totals.iterations != got[c] for c, total in frame.select("cause", "total_ns").iter_rows())
