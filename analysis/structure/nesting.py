"""The push/pop ranges of one thread as a tree, without a loop over ranges or launches.

`thread_chains` takes one thread's ranges in start order (`in_start_order`) and the launch times
on that thread, and gives every range its chain of names (the names from the root range down to
it, numbered by value: millions of ranges share a few thousand chains) and every launch the
chain of the innermost range open at its time. Depths, parents and "the innermost open range"
are counts and binary searches over sorted columns (see `thread_chains`); the results equal those
of the sweep over push and pop events that `analysis.structure.attribution` used before (its tests compare
the two on random traces).
"""

from __future__ import annotations

import polars as pl


def in_start_order(part: pl.DataFrame, names: pl.DataFrame) -> pl.DataFrame:
    """One thread's ranges by start; ranges starting together longest first, then by hash of the
    name (a full sort only when some start together: usually the data is in start order)."""
    part = part.sort("start_ns")
    if (part["start_ns"].diff() == 0).any():
        part = (part.with_columns(h=names["h"].gather(part["name_id"]))
                .sort("start_ns", "end_ns", "h", descending=[False, True, False]).drop("h"))
    return part


def thread_chains(
    starts: pl.Series, ends: pl.Series, name_id: pl.Series, times: pl.Series, n_names: int
) -> tuple[pl.DataFrame, pl.Series]:
    """One thread's ranges (rows, in start order) as chains of names, and the chain of the
    innermost range open at each of `times`.

    Depth, as the sweep over push and pop events of the all-SQL form counts it: for a range,
    the ranges started up to it (its row + 1) less those ended by its start; for a time, the
    ranges started by then less those ended by then. The rows of each depth, in start order, are
    the key depth * (n + 1) + row in ascending order, so one binary search finds the last range
    of a depth started before a given row: the innermost range at a time is the last range of
    the time's depth started by then; a range's parent is the last range one level up before it.
    (With ranges that nest, that is the enclosing range; with ranges that overlap without
    nesting, it is what the sweep gives.)

    A range's chain is numbered by value from its parent's chain and its name, one depth at a
    time, so ranges whose ancestors and selves have the same names share it, and with it their
    layer, path and flags. Returns (chains: chain, parent chain or null at depth 1, name_id;
    the chain at each time, null outside every range).
    """
    n = len(starts)
    ended, depth, levels, keys = _levels(starts, ends)
    del depth
    innermost = _last_of_depth(keys, n, starts, ended, times)
    del keys, ended
    chains, chain_of_row = _chains(levels["row"], name_id, n_names)
    return chains, chain_of_row.gather(innermost)


def _levels(starts: pl.Series, ends: pl.Series) -> tuple[pl.Series, pl.Series, pl.DataFrame, pl.Series]:
    """The counts `thread_chains` and `range_tree` start from: (the end times sorted; each row's
    depth; the rows of each depth, depth 1 first, each in start order; their keys depth * (n + 1)
    + row, ascending)."""
    n = len(starts)
    ended = ends.sort()
    row = pl.int_range(0, n, dtype=pl.Int64, eager=True)
    depth = row + 1 - count_at_most(ended, starts)
    levels = pl.DataFrame({"depth": depth, "row": row}).group_by("depth").agg("row").sort("depth")
    keys = pl.concat([rows + d * (n + 1) for d, rows in zip(levels["depth"], levels["row"], strict=True)])
    return ended, depth, levels, keys


def _last_of_depth(keys: pl.Series, n: int, starts: pl.Series, ended: pl.Series, times: pl.Series) -> pl.Series:
    """The row of the innermost range open at each of `times` (see `thread_chains`), null if none."""
    started = starts.search_sorted(times, side="right").cast(pl.Int64)
    level = started - ended.search_sorted(times, side="right").cast(pl.Int64)
    pos = keys.search_sorted(level * (n + 1) + started, side="left").cast(pl.Int64) - 1
    found = keys.gather(pos.clip(lower_bound=0))
    return pl.select(pl.when((pos >= 0) & (found // (n + 1) == level)).then(found % (n + 1))).to_series()


def _chains(levels: pl.Series, name_id: pl.Series, n_names: int) -> tuple[pl.DataFrame, pl.Series]:
    """Chains of names (see `thread_chains`) from the rows of each depth (`levels`: depth 1 first,
    each in start order): (chains: chain, parent, name_id; the chain of each row)."""
    chain_of_row = pl.repeat(None, len(name_id), dtype=pl.Int64, eager=True)
    chain_keys: list[pl.Series] = []  # per depth, each chain's (parent chain + 1) * n_names + name_id
    n_chains = 0
    above = above_chain = None  # the previous depth's rows (in start order) and their chains
    for rows in levels:
        key = name_id.gather(rows).cast(pl.Int64)
        if above is not None:  # the parent: the last row one level up before the row
            key += (above_chain.gather(count_at_most(above, rows - 1) - 1) + 1) * n_names
        chain = key.rank("dense").cast(pl.Int64) + (n_chains - 1)
        chain_of_row.scatter(rows, chain)
        chain_keys.append(key.unique().sort())
        n_chains += len(chain_keys[-1])
        above, above_chain = rows, chain
    packed = pl.concat(chain_keys)
    chains = pl.DataFrame({"chain": pl.int_range(0, n_chains, eager=True),
                           "parent": null_if_negative(packed // n_names - 1),
                           "name_id": (packed % n_names).cast(pl.UInt32)})
    return chains, chain_of_row


def count_at_most(values: pl.Series, queries: pl.Series) -> pl.Series:
    """How many of `values` are <= each of `queries`, both ascending. A merge (an ASOF join)
    when there are many: several times faster than a binary search per query."""
    if len(queries) < 10_000:
        return values.search_sorted(queries, side="right").cast(pl.Int64)
    right = pl.DataFrame({"v": values}).with_row_index("count", offset=1).set_sorted("v")
    left = pl.DataFrame({"q": queries}).set_sorted("q")
    return (left.join_asof(right, left_on="q", right_on="v", strategy="backward")["count"]
            .fill_null(0).cast(pl.Int64))


def null_if_negative(values: pl.Series) -> pl.Series:
    """-1 (no such row) as null."""
    return pl.select(pl.when(values >= 0).then(values)).to_series()


def range_tree(starts: pl.Series, ends: pl.Series, times: pl.Series) -> tuple[pl.Series, pl.Series, pl.Series]:
    """One thread's ranges (rows, in start order, as `thread_chains` takes them) as a tree of rows:
    (the depth of each range, 1 at the roots; its parent row, null at the roots; the innermost
    range row open at each of `times`, null outside every range), by the same counts and
    searches as `thread_chains`."""
    n = len(starts)
    ended, depth, levels, keys = _levels(starts, ends)
    parent = pl.repeat(None, n, dtype=pl.Int64, eager=True)
    above = None
    for rows in levels["row"]:
        if above is not None:  # the last row one level up before the row
            parent.scatter(rows, above.gather(count_at_most(above, rows - 1) - 1))
        above = rows
    return depth, parent, _last_of_depth(keys, n, starts, ended, times)
