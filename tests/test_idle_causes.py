"""`traceq idle`'s cause of every gap, against the rules of docs/idle.md applied naively to the
export itself: sqlite3 reads, then a plain loop over the gaps with linear scans of the calls
(the reference, not traceq's way: no correlation-id arithmetic, no as-of joins)."""

from __future__ import annotations

import re
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from conftest import sample, trace_id

from traceq.analysis.timeline.gaps import idle_gaps

ITERATION = re.compile(r"(?i)^\s*(iteration|iter|step|ProfilerStep)[\s_#]*\d+\s*$")
SYNC = re.compile(r"^(cuda|cu)(Device|Stream|Event|Thread|Ctx)Synchronize|^(cudaFree|cuMemFree)")
HTOD, PAGEABLE = 1, 0  # ENUM_CUDA_MEMCPY_OPER, ENUM_CUDA_MEM_KIND


def reference_causes(path: Path) -> dict[tuple[int, int, int], str]:
    """(device, gap start, gap end) -> cause, by docs/idle.md's rules, from the export."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    strings = dict(con.execute("SELECT id, value FROM StringIds"))
    ops = []  # device, start, end, pid, correlation id
    copies = {}  # (pid, correlation id) -> (copy kind, src kind, dst kind)
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMSET"):
        ops += con.execute(f'SELECT deviceId, start, "end", globalPid >> 24, correlationId FROM {table}').fetchall()
    for device, start, end, pid, corr, kind, src, dst in con.execute(
            'SELECT deviceId, start, "end", globalPid >> 24, correlationId, copyKind, srcKind, dstKind '
            "FROM CUPTI_ACTIVITY_KIND_MEMCPY"):
        ops.append((device, start, end, pid, corr))
        copies[(pid, corr)] = (kind, src, dst)
    calls = {}  # (pid, correlation id) -> (tid, start, end, name)
    for start, end, gtid, corr, name in con.execute(
            'SELECT start, "end", globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME'):
        calls[(gtid >> 24, corr)] = (gtid & 0xFFFFFF, start, end, re.sub(r"_v\d+$", "", strings[name]))
    ranges = [(gtid >> 24, start, end) for gtid, start, end, text, text_id in con.execute(
        "SELECT globalTid, start, \"end\", text, textId FROM NVTX_EVENTS WHERE eventType IN (59, 60)")
        if ITERATION.match(text if text is not None else strings.get(text_id, "") or "")]
    range_names = {(gtid >> 24, start): (text if text is not None else strings.get(text_id))
                   for gtid, start, text, text_id in con.execute(
                       "SELECT globalTid, start, text, textId FROM NVTX_EVENTS WHERE eventType IN (59, 60)")}
    con.close()

    def iteration(pid: int, corr: int) -> str | None:  # the last iteration range open at the call
        call = calls.get((pid, corr))
        if call is None:
            return None
        open_ = [(s, e) for p, s, e in ranges if p == pid and s <= call[1] and (e is None or call[1] < e)]
        return range_names[(pid, max(open_)[0])] if open_ else None

    blocking, h2d, pageable_h2d = [], [], set()  # (pid, start, end, corr); (pid, tid, start, end, pageable)
    for (pid, corr), (tid, start, end, name) in calls.items():
        copy = copies.get((pid, corr))
        if re.match(r"^(cuda|cu)Memcpy", name):
            if copy and copy[0] == HTOD:
                h2d.append((pid, tid, start, end, copy[1] == PAGEABLE))
                if copy[1] == PAGEABLE:
                    pageable_h2d.add((pid, corr))
            elif "Async" not in name or (copy and PAGEABLE in (copy[1], copy[2])):
                blocking.append((pid, start, end, corr))
        elif SYNC.match(name):
            blocking.append((pid, start, end, corr))

    causes = {}
    by_device = defaultdict(list)
    for op in ops:
        by_device[op[0]].append(op)
    for device, work in by_device.items():
        work.sort(key=lambda o: o[1])
        seen, first, its = set(), [], []
        for _, _, _, pid, corr in work:
            it = iteration(pid, corr)
            first.append(it is not None and it not in seen)
            its.append(it)
            seen.add(it)
        reach = work[0][2]
        last = None  # (index, cause) of the device's last gap
        for i, (_, start, end, pid, corr) in enumerate(work[1:], 1):
            if start > reach:
                cause = _cause(reach, start, pid, corr, first[i], calls, blocking, h2d, pageable_h2d)
                # a sync's echo: launch-bound right after a sync gap, no work between found queued
                if (cause == "launch_bound" and last and last[0] == i - 1 and last[1] == "sync"
                        and its[i] is not None and its[i] == its[i - 1]):
                    cause = "sync"
                causes[(device, reach, start)] = cause
                last = (i, cause)
            reach = max(reach, end)
    return causes


def _cause(gap_start, gap_end, pid, corr, first, calls, blocking, h2d, pageable_h2d) -> str:
    call = calls.get((pid, corr))
    if call is None or call[2] <= gap_start:
        return "other"  # queued before the device ran out of work (or issued before the capture)
    covering = [b for b in blocking if b[0] == pid and b[1] <= gap_start <= b[2]]
    if covering:
        holder = max(covering, key=lambda b: b[2])
        if (pid, holder[3] - 1) in pageable_h2d:
            return "h2d_pageable"
        if not (first and holder[2] - gap_start < 0.5 * (gap_end - gap_start)):  # left early, between iterations
            return "sync"
    begun = [c for c in h2d if c[0] == pid and c[1] == call[0] and c[2] < gap_end]
    if begun:
        copy = max(begun, key=lambda c: c[2])
        if min(copy[3], gap_end) - max(copy[2], gap_start) >= 0.5 * (gap_end - gap_start):
            return "h2d_pageable" if copy[4] else "h2d_pinned"
    return "iteration_start" if first else "launch_bound"


LABELS = {"Sync": "sync", "H2D pageable": "h2d_pageable", "H2D pinned": "h2d_pinned",
          "Iteration start": "iteration_start", "Launch-bound": "launch_bound", "Compile": "compile",
          "Other": "other"}
"""The causes as traceq writes them (docs/idle.md) -> the reference's names for them."""


@pytest.mark.parametrize("name", ["badloop_mlp", "resnet50_b32_amp_ops", "ddp_resnet18_2gpu"])
def test_causes_equal_the_rules_applied_to_the_export(sample_store, name: str) -> None:
    want = reference_causes(sample(f"{name}.sqlite"))
    gaps = idle_gaps(sample_store, trace_id(sample_store, name))
    got = {(d, s, e): LABELS[c] for d, s, e, c in gaps.select("device_id", "start_ns", "end_ns", "cause").iter_rows()}
    assert got.keys() == want.keys()
    wrong = Counter((want[k], got[k]) for k in want if want[k] != got[k])
    assert not wrong, f"(reference, traceq) gaps: {wrong}"
    if name == "badloop_mlp":  # the trace recorded to show every host-caused class but pinned copies
        assert {"sync", "h2d_pageable", "iteration_start", "launch_bound", "other"} <= set(want.values())


@pytest.mark.parametrize("name", ["sync", "dataloader"])
def test_causes_on_the_planted_loops(tmp_path, name: str) -> None:
    """The loops with syncs after every layer (the launch-bound gaps that follow a sync until
    the host is ahead again are the sync's) and with host-side data preparation after the
    step's closing sync (between iterations, not the sync's): the same rules, naively."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    path = Path(__file__).resolve().parent.parent / "sample_traces" / "planted" / f"{name}.sqlite"
    want = reference_causes(path)
    con = open_store(tmp_path / "s.duckdb", create=True)
    gaps = idle_gaps(con, load_trace(con, path).trace_id)
    con.close()
    got = {(d, s, e): LABELS[c] for d, s, e, c in gaps.select("device_id", "start_ns", "end_ns", "cause").iter_rows()}
    assert got.keys() == want.keys()
    wrong = Counter((want[k], got[k]) for k in want if want[k] != got[k])
    assert not wrong, f"(reference, traceq) gaps: {wrong}"
    counts = Counter(want.values())
    assert counts["sync" if name == "sync" else "iteration_start"] >= 7


@pytest.mark.parametrize("seed", range(6))
def test_sync_echoes_equal_a_walk_over_each_device(seed: int) -> None:
    """`gaps._sync_echoes` (runs found without a window per run) against a plain walk: per
    device in its gaps' order, a launch-bound gap right after a sync gap (its next operation the
    device's next, the same iteration) becomes sync, with that gap's call; chains carry on."""
    import random

    import polars as pl

    from traceq.analysis.timeline.gaps import _sync_echoes

    rng = random.Random(seed)
    n, devices = 400, rng.choice([None, 2, 3])
    device = [rng.randrange(devices) for _ in range(n)] if devices else [0] * n
    pos, seen = [], Counter()
    for d in device:  # each device's operations in start order; a gap skips some
        seen[d] += rng.choice([1, 1, 1, 2])
        pos.append(seen[d])
    cause = [rng.choice([0, 0, 4, 4, 4, 3, 6, 5]) for _ in range(n)]
    call = [rng.choice([None, *range(1, 9)]) if c != 0 else rng.randrange(1, 9) for c in cause]
    iteration = [rng.choice([None, 0, 1, 1, 1]) for _ in range(n)]
    want_cause, want_call = list(cause), list(call)
    last: dict[int, int] = {}  # device -> its last gap's row
    for i in range(n):
        j = last.get(device[i])
        if (j is not None and want_cause[i] == 4 and want_cause[j] == 0 and pos[j] == pos[i] - 1
                and iteration[i] is not None and iteration[i] == iteration[j]):
            want_cause[i], want_call[i] = 0, want_call[j]
        last[device[i]] = i
    own = pl.DataFrame({"cause": pl.Series(cause, dtype=pl.UInt8), "call": pl.Series(call, dtype=pl.UInt32)})
    got = _sync_echoes(own, pl.Series(pos, dtype=pl.UInt32),
                       pl.Series(device, dtype=pl.UInt32) if devices else None, pl.Series(iteration, dtype=pl.UInt32))
    assert got["cause"].to_list() == want_cause
    assert got["call"].to_list() == want_call
    assert want_cause != cause  # some gaps echoed
