"""As-of lookups by binary search: for many points, the last of a few sorted events of the same
group (process, thread) at or before each point, without sorting the points.

Polars' `join_asof` wants both sides sorted; the points here are millions of gaps or
operations and the events a few thousand calls or ranges, so sorting the events and searching
each point costs a fraction of sorting the points. Group and time are packed into one int64 key:
group number x 2^b + (time - the earliest time + 1), b the bits the times' span needs; each group
begins with a sentinel event at key group number x 2^b, so that a point never finds another
group's event.
"""

from __future__ import annotations

import polars as pl


def last_at_or_before(
    event_group: pl.Series, event_time: pl.Series, group: pl.Series, time: pl.Series
) -> pl.Series:
    """For each (group, time) point, the row of the event with the same group and the latest
    time <= the point's time (ties: the last such row in the events' order), or null.

    Groups are any integer ids (several columns: pass a struct's hash, or pack them first);
    null groups or times find nothing.
    """
    if len(event_time) == 0:
        return pl.repeat(None, len(time), dtype=pl.Int64, eager=True)
    bounds = [v for v in (event_group.min(), event_group.max(), group.min(), group.max()) if v is not None]
    if len(set(bounds)) <= 1:  # one group: search the times themselves
        events = pl.DataFrame({"key": event_time}).with_row_index("row")
        point_keys = time
    else:
        groups = pl.concat([event_group.unique(), group.unique()]).drop_nulls().unique().sort()
        origin = min(v for v in (event_time.min(), time.min()) if v is not None)  # type: ignore[type-var]
        top = max(v for v in (event_time.max(), time.max()) if v is not None)  # type: ignore[type-var]
        bits = max(int(top - origin + 1).bit_length(), 1)
        if bits + len(groups).bit_length() > 62:
            raise ValueError("times span too long or too many groups to pack into one key")
        scale = 1 << bits

        def keys(g: pl.Series, t: pl.Series) -> pl.Series:  # times from 1: 0 is each group's sentinel
            return groups.search_sorted(g.fill_null(groups[0])).cast(pl.Int64) * scale + (t - origin + 1)

        # a sentinel event (no row) first in each group: a point finds its own group's events or it
        events = pl.concat([pl.DataFrame({"key": keys(event_group, event_time)}).with_row_index("row"),
                            pl.DataFrame({"key": pl.int_range(0, len(groups), eager=True) * scale})
                            .select(pl.lit(None, pl.UInt32).alias("row"), "key")])
        point_keys = keys(group, time)
    if not events["key"].is_sorted():
        events = events.sort("key", maintain_order=True)
    order, event_keys = events["row"], events["key"]
    at = event_keys.search_sorted(point_keys, side="right").cast(pl.Int64) - 1
    valid = at >= 0
    if point_keys.null_count() or group.null_count():
        valid = valid & point_keys.is_not_null() & group.is_not_null()
    return order.cast(pl.Int64).gather(pl.select(pl.when(valid).then(at)).to_series())


def last_open(start: pl.Series, end: pl.Series, values: pl.Series, time: pl.Series) -> pl.Series:
    """For each time, `values` of the range (start, end: one group's, in any order) begun last at
    or before it (ties: the last in the given order, as `last_at_or_before` finds it), if the
    time is before its end; else null, as for a null time. One binary search per time and two
    gathers of what its count leads to, no key packing: the one-group case of the iteration a
    call began in, at ten million calls."""
    if len(start) == 0:
        return pl.repeat(None, len(time), dtype=values.dtype, eager=True)
    ranges = pl.DataFrame({"start": start, "end": end, "value": values}).sort("start", maintain_order=True)
    at = ranges["start"].search_sorted(time.fill_null(ranges["start"][0] - 1), side="right")  # ranges begun
    end, value = (pl.concat([pl.Series([None], dtype=ranges[c].dtype), ranges[c]]) for c in ("end", "value"))
    return pl.select(pl.when(time < end.gather(at)).then(value.gather(at))).to_series().alias(values.name)


def union_lengths(group: pl.Series, start: pl.Series, end: pl.Series) -> pl.DataFrame:
    """Per group (any integer ids): the length of the union of its intervals [start, end), one
    sort in all. The groups are laid end to end on one time line (each shifted to begin one past
    the previous one's end), so a single sort orders them by group and then start; each interval
    then adds what it reaches past the furthest end before it (nothing when that end covers it).

    Columns: group, length. Raises ValueError where the groups' spans add up past 2^62."""
    frame = pl.DataFrame({"group": group, "start": start, "end": end})
    spans = (frame.group_by("group").agg(lo=pl.col("start").min(), hi=pl.col("end").max())
             .sort("group", nulls_last=True)
             .with_columns(width=pl.col("hi") - pl.col("lo") + 1))
    if spans["width"].sum() >= 1 << 62:
        raise ValueError("the groups' spans add up to too long a time line")
    spans = spans.with_columns(shift=pl.col("width").cum_sum() - pl.col("width") - pl.col("lo"))
    reached = pl.col("end").cum_max().shift(1)  # over all the rows, in order: no group sees another's
    return (frame.lazy()  # one query: 0.4 s at ten million rows, 0.7 s step by step
            .join(spans.lazy().select("group", "shift"), on="group", how="left", nulls_equal=True)
            .select("group", start=pl.col("start") + pl.col("shift"), end=pl.col("end") + pl.col("shift"))
            .sort("start")
            .select("group", added=(pl.col("end") - pl.max_horizontal(pl.col("start"), reached)).clip(lower_bound=0))
            .group_by("group").agg(length=pl.col("added").sum())
            .collect())
