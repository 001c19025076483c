"""Kernel and API names are stored once per trace and numbered: `Names` and `kernel_names`."""

from __future__ import annotations

import pyarrow as pa
import pytest

from traceq.ingest.base import UNNAMED_KERNEL, Names, kernel_names, pack_keys
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
    [[2**21 - 2, 0, 2**21 - 2], [None, 1, None], [1, 1, 1]],  # the largest value three columns fit
    [[2**31 - 2, 5, 2**31 - 2], [0, 0, 0]],                  # and two
    [[4, 4, 8]],
    [[1, 2, 3], [None, None, None]],                         # a column the trace lacks: all NULL
])
def test_keys_packed_on_a_reading_thread_number_as_the_columns_do(columns: list[list[int | None]]) -> None:
    """`pack_keys` and `number_packed` give `number`'s ids and keys, over batches in row order."""
    first, second = ([pa.array(c[:2], pa.int64()) for c in columns], [pa.array(c[2:], pa.int64()) for c in columns])
    plain, packed = Names(), Names()
    expected = [plain.number(*first).to_pylist(), plain.number(*second).to_pylist()]
    got = []
    for batch in (first, second):
        keys = pack_keys(*[pa.chunked_array([c]) for c in batch])
        assert keys is not None
        got.append(packed.number_packed(keys, len(columns)).to_pylist())
    assert got == expected and packed.keys == plain.keys


@pytest.mark.parametrize("columns", [
    [[-1, 2], [0, 0], [0, 0]],   # negative
    [[2**21 - 1, 0], [0, 0], [0, 0]],  # one too many for three columns of 21 bits
    [[0, 0], [2**31 - 1, 0]],
])
def test_keys_that_do_not_fit_are_left_to_number(columns: list[list[int]]) -> None:
    assert pack_keys(*[pa.array(c, pa.int64()) for c in columns]) is None


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
           "local_memory_per_thread_bytes", "local_memory_total_bytes", "launch_type", "graph_node_id"]
API_CALLS = ["trace_id", "start_ns", "end_ns", "dur_ns", "api", "name", "correlation_id", "pid", "tid",
             "global_tid", "return_value"]


@pytest.mark.parametrize(("view", "columns"), [("kernels", KERNELS), ("api_calls", API_CALLS)])
def test_views_keep_the_columns_of_the_tables_they_replaced(view: str, columns: list[str], tmp_path) -> None:
    """Schema 2 stored `kernels` and `api_calls` as tables; analyses and users' SQL read the same
    columns, in the same order, from the views of schema 3."""
    con = open_store(tmp_path / "s.duckdb", create=True)
    assert [r[0] for r in con.execute(f"DESCRIBE {view}").fetchall()] == columns
    types = dict(con.execute(f"SELECT column_name, column_type FROM (DESCRIBE {view})").fetchall())
    assert types["dur_ns"] == "BIGINT" and types["name"] == "VARCHAR"
    if view == "kernels":
        assert types["grid_blocks"] == "BIGINT" and types["block_threads"] == "INTEGER"
