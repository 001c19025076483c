"""Kernel and API names are stored once per trace and numbered: `Names` and `kernel_names`."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceq.ingest.base import KERNEL_CONFIG_COLUMNS, UNNAMED_KERNEL, Names, kernel_configs, kernel_names, key_rows
from traceq.store import open_store


def test_ids_follow_the_first_appearance_of_each_key_across_batches() -> None:
    names = Names()
    first = names.number(pa.array([7, 3, 7, None]), pa.array([1, 1, 1, 1]))
    second = names.number(pa.array([3, 9, None]), pa.array([1, 1, 2]))
    assert first.to_pylist() == [0, 1, 0, 2]
    assert second.to_pylist() == [1, 3, 4]
    assert names.keys == [(7, 1), (3, 1), (None, 1), (9, 1), (None, 2)]
    assert first.type == pa.int32()


def test_keys_are_ordered_tuples_not_sets() -> None:
    names = Names()
    assert names.number(pa.array([1, 2]), pa.array([2, 1])).to_pylist() == [0, 1]
    assert names.keys == [(1, 2), (2, 1)]


def test_many_distinct_values_per_column_do_not_collide() -> None:
    n = 60_000  # three columns of n distinct values: the combined code needs more than 32 bits
    a = pa.array(range(n))
    b = pa.array(range(n, 0, -1))
    c = pa.array([i % 7 for i in range(n)])
    names = Names()
    ids = names.number(a, b, c)
    assert ids.to_pylist() == list(range(n))
    assert names.keys[12345] == (12345, n - 12345, 12345 % 7)


def test_strings_and_chunked_arrays_number_too() -> None:
    names = Names()
    ids = names.number(pa.chunked_array([["runtime", "driver"], ["runtime"]]), pa.array([5, 5, 5]))
    assert ids.to_pylist() == [0, 1, 0]


@pytest.mark.parametrize("columns", [
    [[7, 3, 7, None, 0], [1, 1, 1, 1, 0], [None, None, 5, None, 0]],
    [[2**62, -(2**62), 2**62, 0], [1, 1, 1, 1]],                  # ranges past 63 bits: dictionary indices
    [[2**40, 0, 2**40, 7], [2**40, 0, 2**40, 3], [1, 2, 1, 2]],    # together past 63 bits: the code is condensed
    [["runtime", "driver", "runtime", None], [5, 5, 5, 5]],        # text
    [[1, 2, 3], [None, None, None]],                               # a column the trace lacks: all NULL
    [[c % 3 for c in range(20)]] * 14,                             # a kernel's launch configuration
    [[4, 4, 4, 4], [None, None, None, None], [9, 9, 9, 9]],        # one key: every column one-valued
    [[1, 3, None, 3, 2, None], [0, 5, 0, 5, 0, 7]],                # kept unshifted: NULL beside 1.., 0 without NULL
    [[1000, 1003, 1000, 1001], [2**62, 2**62 + 1, 2**62, 2**62]],  # shifted by the minimum: fewer bits
])
def test_keys_encoded_on_a_reading_thread_number_as_the_columns_do(columns: list[list]) -> None:
    """`key_rows` then `number_keys` give the ids and keys of numbering the columns row by row."""
    half = len(columns[0]) // 2
    names = Names()
    got = []
    for part in (slice(0, half), slice(half, None)):
        keys = key_rows(*[pa.chunked_array([pa.array(c[part])]) for c in columns])
        assert keys.indices.type == pa.int32()
        got += names.number_keys(keys).to_pylist()
    rows = list(zip(*columns))
    first_seen = list(dict.fromkeys(rows))
    assert names.keys == first_seen
    assert got == [first_seen.index(r) for r in rows]


def test_a_kernel_configuration_decodes_the_sources_codes() -> None:
    key = dict(zip(KERNEL_CONFIG_COLUMNS, range(1, 100)))
    other = {**key, "smem_optin": 1, "launch_type": 9}
    unknown = {**key, "smem_optin": None, "launch_type": None}
    rows = kernel_configs([tuple(k.values()) for k in (key, other, unknown)], optin_code=1,
                          launch_types={key["launch_type"]: "regular"}).to_pylist()
    assert [r["config_id"] for r in rows] == [0, 1, 2]
    assert [(r["smem_optin"], r["launch_type"]) for r in rows] == [(False, "regular"), (True, None), (None, None)]
    assert rows[0]["grid_x"] == key["grid_x"] and rows[0]["local_memory_total_bytes"] == key["local_memory_total_bytes"]


def test_every_kernel_gets_a_name_and_a_short_name() -> None:
    rows = kernel_names(["void k<int>()", None, None, None, ""],
                        ["k", "s", None, None, None],
                        ["_Z1kIiEvv", "_Zs", "_Zm", None, None]).to_pylist()
    assert [(r["name_id"], r["name"], r["short_name"], r["mangled_name"]) for r in rows] == [
        (0, "void k<int>()", "k", "_Z1kIiEvv"),
        (1, "s", "s", "_Zs"),
        (2, "_Zm", "_Zm", "_Zm"),
        (3, UNNAMED_KERNEL, UNNAMED_KERNEL, None),
        (4, "", "", None),  # an empty name is a name, as the source gave it
    ]


KERNELS = ["trace_id", "kernel_id", "start_ns", "end_ns", "dur_ns", "device_id", "context_id", "stream_id",
           "correlation_id", "pid", "name", "short_name", "mangled_name", "grid_x", "grid_y", "grid_z",
           "block_x", "block_y", "block_z", "grid_blocks", "block_threads", "registers_per_thread",
           "smem_static_bytes", "smem_dynamic_bytes", "smem_carveout_bytes", "smem_optin",
           "local_memory_per_thread_bytes", "local_memory_total_bytes", "launch_type", "graph_node_id",
           "kineto_occupancy_pct",  # schema 6 appends Kineto's own estimate
           "accum_vgprs", "sgprs"]  # schema 11, AMD's AGPRs and SGPRs
API_CALLS = ["trace_id", "start_ns", "end_ns", "dur_ns", "api", "name", "correlation_id", "pid", "tid",
             "global_tid", "return_value"]


NVTX = {"trace_id": "INTEGER", "start_ns": "BIGINT", "end_ns": "BIGINT", "dur_ns": "BIGINT", "kind": "VARCHAR",
        "name": "VARCHAR", "domain": "VARCHAR", "category": "BIGINT", "color": "BIGINT", "pid": "BIGINT",
        "tid": "BIGINT", "global_tid": "BIGINT", "end_tid": "BIGINT"}
"""The columns and types of schema 4's `nvtx` table."""


@pytest.mark.parametrize(("view", "columns"), [("kernels", KERNELS), ("api_calls", API_CALLS), ("nvtx", list(NVTX))])
def test_views_keep_the_columns_of_the_tables_they_replaced(view: str, columns: list[str], tmp_path) -> None:
    """Schema 2 stored `kernels` and `api_calls` as tables, schema 4 `nvtx`; analyses and users'
    SQL read the same columns, in the same order, from the views that replaced them."""
    con = open_store(tmp_path / "s.duckdb", create=True)
    assert [r[0] for r in con.execute(f"DESCRIBE {view}").fetchall()] == columns
    types = dict(con.execute(f"SELECT column_name, column_type FROM (DESCRIBE {view})").fetchall())
    assert types["dur_ns"] == "BIGINT" and types["name"] == "VARCHAR"
    if view == "nvtx":
        assert types == NVTX
    if view == "kernels":
        assert types["grid_blocks"] == "BIGINT" and types["block_threads"] == "INTEGER"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.integers(-3, 3), st.integers(0, 2**62)), min_size=1, max_size=6)
                .map(lambda r: r + [None] * (6 - len(r))), min_size=1, max_size=40))
def test_key_rows_number_rows_as_python_does(rows: list[list]) -> None:
    """Any small table: each row's key index is its first appearance among the distinct rows,
    and the keys are those rows, in that order."""
    columns = [pa.array([r[i] for r in rows], pa.int64()) for i in range(6)]
    keys = key_rows(*columns)
    first_seen = list(dict.fromkeys(tuple(r) for r in rows))
    assert keys.indices.to_pylist() == [first_seen.index(tuple(r)) for r in rows]
    assert [tuple(k.values()) for k in keys.dictionary.to_pylist()] == first_seen
