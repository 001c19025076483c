"""`nvtx_gpu_proj_sum`'s innermost ranges: each call finds the innermost range open at its start
through its thread's segments (`projection._thread_tree`); checked against that range found by
brute force over random nested ranges, and the as-of lookup it uses against brute force. (The
report itself is compared with `nsys stats` in test_stats.py.)"""

from __future__ import annotations

import random

import polars as pl
import pytest

from traceq.analysis.intervals import last_at_or_before
from traceq.analysis.timeline.projection import _thread_tree


def _nested(rng: random.Random, start: int, end: int, depth: int) -> list[tuple[int, int]]:
    """Ranges inside [start, end): siblings one after another, each with its own children;
    some start or end where a sibling or the parent does."""
    ranges: list[tuple[int, int]] = []
    at = start
    while depth and at < end and (rng.random() < 0.8 or not ranges):
        lo = at + rng.choice([0, 0, rng.randrange(1, 5)])
        hi = min(end, lo + rng.randrange(1, 40))
        if lo >= hi:
            break
        ranges.append((lo, hi))
        ranges += _nested(rng, lo, hi, depth - 1)
        at = hi
    return ranges


def _innermost(ranges: list[tuple[int, int]], t: int) -> int | None:
    """The row of the innermost range open at t (start <= t < end): the latest started; of
    ranges starting together, the last in start order (the shortest)."""
    open_rows = [row for row, (start, end) in enumerate(ranges) if start <= t < end]
    return max(open_rows, key=lambda row: (ranges[row][0], row)) if open_rows else None


@pytest.mark.parametrize("seed", range(20))
def test_segments_give_the_innermost_range(seed: int) -> None:
    rng = random.Random(seed)
    ranges = sorted(_nested(rng, 0, 400, 4), key=lambda r: (r[0], -r[1]))
    frame = pl.DataFrame({"pid": [1] * len(ranges), "tid": [7] * len(ranges),
                          "start_ns": [s for s, _ in ranges], "end_ns": [e for _, e in ranges]})
    offset = 5
    _, segments = _thread_tree(frame, offset)
    times = pl.Series(list(range(-2, 405)))
    at = last_at_or_before(pl.repeat(0, len(segments), eager=True), segments["at"],
                           pl.repeat(0, len(times), eager=True), times)
    found = (segments["row"].gather(at) - offset).to_list()
    assert found == [_innermost(ranges, t) for t in times.to_list()]


@pytest.mark.parametrize("seed", range(40))
def test_last_at_or_before_is_the_brute_force_answer(seed: int) -> None:
    """The as-of lookup the projection and the gaps use: several groups (each begins with a
    sentinel event, so a point before its group's first event finds none), ties, nulls."""
    rng = random.Random(seed)
    groups = rng.choice([[4], [4, 9], [0, 3, 8, 20]])
    events = [(rng.choice(groups), rng.randrange(-5, 60)) for _ in range(rng.randrange(0, 30))]
    points = [(rng.choice(groups + [None]), rng.choice([rng.randrange(-10, 70), None])) for _ in range(50)]
    found = last_at_or_before(pl.Series([g for g, _ in events], dtype=pl.Int64),
                              pl.Series([t for _, t in events], dtype=pl.Int64),
                              pl.Series([g for g, _ in points], dtype=pl.Int64),
                              pl.Series([t for _, t in points], dtype=pl.Int64))

    def brute(group: int | None, time: int | None) -> int | None:
        rows = [row for row, (g, t) in enumerate(events) if group is not None and time is not None
                and g == group and t <= time]
        return max(rows, key=lambda row: (events[row][1], row)) if rows else None

    assert found.to_list() == [brute(g, t) for g, t in points]


@pytest.mark.parametrize("seed", range(40))
def test_last_open_is_the_brute_force_answer(seed: int) -> None:
    """The iteration of a call on one process: the value of the range begun last at or before the
    time (ties: the last row), if the time is before its end; ranges in any order, overlapping,
    empty, sharing starts; times on every start and end and next to them, and null."""
    from traceq.analysis.intervals import last_open

    rng = random.Random(seed)
    ranges = []
    for _ in range(rng.randrange(0, 12)):
        start = rng.randrange(0, 50)
        ranges.append((start, start + rng.choice([0, 1, rng.randrange(1, 20)]), rng.randrange(100)))
    times = [rng.choice([rng.randrange(-3, 75), None]) for _ in range(80)]
    times += [t + d for s, e, _ in ranges for t in (s, e) for d in (-1, 0, 1)]
    found = last_open(pl.Series([s for s, _, _ in ranges], dtype=pl.Int64),
                      pl.Series([e for _, e, _ in ranges], dtype=pl.Int64),
                      pl.Series([v for _, _, v in ranges], dtype=pl.UInt32), pl.Series(times, dtype=pl.Int64))

    def brute(time: int | None) -> int | None:
        rows = [row for row, (s, _, _) in enumerate(ranges) if time is not None and s <= time]
        if not rows:
            return None
        row = max(rows, key=lambda r: (ranges[r][0], r))
        return ranges[row][2] if time < ranges[row][1] else None

    assert found.to_list() == [brute(t) for t in times]


@pytest.mark.parametrize("seed", range(40))
def test_union_lengths_are_the_brute_force_answer(seed: int) -> None:
    """Per group, the length of the union of its intervals: groups interleaved in time and
    nested, null and negative ids, empty intervals, shared ends, negative times."""
    from traceq.analysis.intervals import union_lengths

    rng = random.Random(seed)
    rows = []
    for _ in range(rng.randrange(1, 60)):
        start = rng.randrange(-40, 200)
        rows.append((rng.choice([None, -3, 0, 1, 7]), start, start + rng.choice([0, 1, rng.randrange(1, 50)])))
    got = union_lengths(pl.Series([g for g, _, _ in rows], dtype=pl.Int64), pl.Series([s for _, s, _ in rows]),
                        pl.Series([e for _, _, e in rows]))

    def brute(group: int | None) -> int:
        covered = set()
        for g, s, e in rows:
            if g == group:
                covered.update(range(s, e))
        return len(covered)

    assert dict(got.iter_rows()) == {g: brute(g) for g in {g for g, _, _ in rows}}
