"""The attribution kept in windows of kernel ids (`keep.attribute_trace`, how a ten-million-kernel
trace is attributed within the load's memory) is the one kept whole: each kernel's layer, pass,
iteration, stage, library, precision and attribution, and the kernel names' classes."""

from __future__ import annotations

import duckdb
import pytest
from conftest import sample

from traceq.analysis.structure import keep
from traceq.store import connect, open_store

_PER_KERNEL = """
    SELECT a.kernel_id, c.layer, c.pass, c.iteration, c.stage, c.library, c.precision, c.precision_from,
           c.attribution
    FROM kernel_attribution a JOIN kernel_contexts c ON c.trace_id = a.trace_id AND c.context_id = a.context_id
    WHERE a.trace_id = ? ORDER BY a.kernel_id"""


def _kept(con: duckdb.DuckDBPyConnection, trace_id: int) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """(per kernel, the classes, the attribution's kernel_attribution rows in table order)."""
    return (con.execute(_PER_KERNEL, [trace_id]).fetchall(),
            con.execute("SELECT name, implementation, operation FROM kernel_classes WHERE trace_id = ? ORDER BY name",
                        [trace_id]).fetchall(),
            con.execute("SELECT kernel_id FROM kernel_attribution WHERE trace_id = ?", [trace_id]).fetchall())


def _windowed_equals_whole(con: duckdb.DuckDBPyConnection, trace_id: int, name: str) -> None:
    n = con.execute("SELECT count(*) FROM kernel_events WHERE trace_id = ?", [trace_id]).fetchone()[0]
    whole = _kept(con, trace_id)  # what the load kept, in one piece
    assert len(whole[0]) == n, name
    chunk = max(n // 3, 1)
    windows = keep.windows(con, trace_id, chunk)
    con.execute("BEGIN TRANSACTION")
    try:
        keep.attribute_trace(con, trace_id, chunk)
        windowed = _kept(con, trace_id)
        kept_count = con.execute("SELECT kernels FROM attributions WHERE trace_id = ?", [trace_id]).fetchone()[0]
    finally:
        con.execute("ROLLBACK")
    assert windowed[0] == whole[0], name
    assert windowed[1] == whole[1], name
    assert [k for (k,) in windowed[2]] == sorted(k for (k,) in whole[2]), name  # written in kernel_id order
    assert kept_count == n, name
    if windows != [None]:  # the windows cover every kernel id once
        ids = [k for (k,) in con.execute("SELECT kernel_id FROM kernel_events WHERE trace_id = ?",
                                         [trace_id]).fetchall()]
        assert sorted(ids) == sorted(k for k in ids for lo, hi in windows if lo <= k <= hi), name
        assert len(windows) >= 3, name


def test_windowed_attribution_equals_the_whole_on_every_nsys_sample(sample_store) -> None:
    con = sample_store
    for trace_id, name in con.execute("SELECT trace_id, name FROM traces ORDER BY trace_id").fetchall():
        _windowed_equals_whole(con, trace_id, name)


@pytest.mark.parametrize("name", ["alexnet_b256_amp_kineto.json", "resnet50_b32_amp_layers_kineto.json.gz"])
def test_windowed_attribution_equals_the_whole_on_kineto_samples(tmp_path, name: str) -> None:
    """Kineto: operators give passes, layers and dtypes (the precision by operator)."""
    import traceq

    t = traceq.load(sample(name), store=tmp_path / "s.duckdb")
    trace_id = t.id
    t.store.close()
    con = open_store(tmp_path / "s.duckdb")
    try:
        _windowed_equals_whole(con, trace_id, name)
    finally:
        con.close()


def test_windows_and_the_traces_attributed_whole() -> None:
    """Windows of about `chunk` kernel ids; a JAX trace (its programs placed by their launches)
    is attributed in one piece, whatever its size."""
    from traceq.analysis.structure.xla import MODULE_PREFIX

    con = connect()
    con.execute("CREATE TABLE kernel_events AS SELECT 1 AS trace_id, range AS kernel_id FROM range(10)")
    con.execute("CREATE TABLE nvtx (trace_id INT, kind VARCHAR, name VARCHAR)")
    assert keep.windows(con, 1, 4) == [(0, 3), (4, 7), (8, 9)]
    assert keep.windows(con, 1, 10) == [None]
    con.execute("INSERT INTO nvtx VALUES (1, 'pushpop', ?)", [MODULE_PREFIX + "jit_step"])
    assert keep.windows(con, 1, 4) == [None]
    con.close()
