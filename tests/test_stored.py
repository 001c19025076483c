"""The attribution kept in the store is the one computed on the fly, and is read only while
the options, rules and code it was made with are in force."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest
from conftest import SAMPLES, sample, shared
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

import traceq.analysis.structure.stored as stored
from traceq.analysis.structure.conventions import ITERATION_REGEX
from traceq.analysis.structure.layers import attributed_kernels, kernel_groups, launch_groups, stage_times
from traceq.cli import app
from traceq.store import open_store

runner = CliRunner()


def _computed(monkeypatch: pytest.MonkeyPatch, con, trace_id: int, analysis=attributed_kernels) -> pl.DataFrame:
    with monkeypatch.context() as m:
        m.setattr(stored, "is_kept", lambda *args, **kwargs: False)
        return analysis(con, trace_id)


def _assert_kept_equals_computed(monkeypatch: pytest.MonkeyPatch, con, trace_id: int) -> None:
    assert stored.is_kept(con, trace_id)
    assert_frame_equal(attributed_kernels(con, trace_id), _computed(monkeypatch, con, trace_id))
    keys = ["layer", "pass", "name", "short_name", "library", "implementation", "operation", "attribution"]
    assert_frame_equal(kernel_groups(con, trace_id).sort(keys, nulls_last=True),
                       _computed(monkeypatch, con, trace_id, kernel_groups).sort(keys, nulls_last=True),
                       check_dtypes=False)
    assert_frame_equal(stage_times(con, trace_id), _computed(monkeypatch, con, trace_id, stage_times))
    want = _launch_groups_by_hand(con, trace_id)
    for groups in (launch_groups(con, trace_id), _computed(monkeypatch, con, trace_id, launch_groups)):
        assert_frame_equal(groups.sort(LAUNCH_KEYS, nulls_last=True), want, check_dtypes=False)
    by_hand = (attributed_kernels(con, trace_id).group_by(keys)
               .agg(kernels=pl.len(), dur_ns=pl.col("dur_ns").sum(), first_kernel=pl.col("kernel_id").min()))
    assert_frame_equal(kernel_groups(con, trace_id).sort(keys, nulls_last=True),
                       by_hand.sort(keys, nulls_last=True), check_dtypes=False)


LAUNCH_KEYS = ["layer", "pass", "iteration", "stage", "attribution", "library", "name", "config_id", "queue_id"]


def _launch_groups_by_hand(con, trace_id: int) -> pl.DataFrame:
    """`launch_groups` summed here from the attributed kernels, one launch at a time."""
    ids = con.sql(f"SELECT kernel_id, config_id, queue_id FROM kernel_events WHERE trace_id = {trace_id}").pl()
    k = attributed_kernels(con, trace_id).join(ids, on="kernel_id")
    return (k.sort(["dur_ns", "kernel_id"], descending=[True, False])
            .group_by(LAUNCH_KEYS)
            .agg(pl.col("short_name", "implementation", "operation").first(), instances=pl.len(),
                 dur_ns=pl.col("dur_ns").sum(), longest_ns=pl.col("dur_ns").first(),
                 first_kernel=pl.col("kernel_id").first(), lowest_kernel=pl.col("kernel_id").min())
            .select(*LAUNCH_KEYS[:7], "short_name", "implementation", "operation", "config_id", "queue_id",
                    "instances", "dur_ns", "longest_ns", "first_kernel", "lowest_kernel")
            .sort(LAUNCH_KEYS, nulls_last=True))


def test_kept_attribution_equals_the_computed_one_on_every_sample(sample_store, monkeypatch) -> None:
    """Every nsys sample (the store loads keep their attribution): attributed kernels and the
    groups `layers` and `libs` sum are the same read from the store as computed; the view
    groups by layer as `layers` does."""
    con = sample_store
    for trace_id, name in con.execute("SELECT trace_id, name FROM traces ORDER BY trace_id").fetchall():
        _assert_kept_equals_computed(monkeypatch, con, trace_id)
        in_sql = dict(con.execute("SELECT coalesce(layer, '') || '/' || coalesce(pass, ''), sum(dur_ns) "
                                  "FROM kernels_attributed WHERE trace_id = ? GROUP BY 1", [trace_id]).fetchall())
        k = attributed_kernels(con, trace_id)
        assert in_sql == {f"{layer or ''}/{pass_ or ''}": total for layer, pass_, total in
                          k.group_by("layer", "pass").agg(pl.col("dur_ns").sum()).iter_rows()}, name


def test_kept_attribution_on_the_resnet50_reference(resnet50_store, monkeypatch) -> None:
    """107k NVTX ranges, emit_nvtx op ranges whose [[launcher]] rules relabel libraries."""
    con, trace_id = resnet50_store
    _assert_kept_equals_computed(monkeypatch, con, trace_id)
    libraries = attributed_kernels(con, trace_id).filter(pl.col("library") != pl.col("implementation"))
    assert libraries.height > 0, "no kernel relabelled by its launching op: the test would prove little"


def test_launch_groups_where_the_store_holds_launches_and_attribution_in_other_orders(tmp_path: Path) -> None:
    """`launch_groups` and `stage_times` pair a kept trace's launches with their attribution by
    position; rewritten in another order, they no longer pair up, and they join them by
    kernel_id instead: the same groups as summed by hand, the same stages as computed."""
    db = tmp_path / "s.duckdb"
    assert runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    con = open_store(db)
    asked: list[str] = []  # the launches each read was asked over

    def counted(kept: str) -> str:
        asked.append(kept)
        return f"SELECT count(*) FILTER (WHERE misplaced) AS misplaced FROM {kept}"

    def misplaced(kept: str) -> int:
        return con.execute(f"SELECT count(*) FILTER (WHERE misplaced) FROM {kept}").fetchall()[0][0]

    stored.read_kept_launches(con, 1, counted)
    assert len(asked) == 1 and misplaced(asked[0]) == 0  # by position, in order
    con.execute("CREATE TEMP TABLE backwards AS SELECT * FROM kernel_attribution ORDER BY kernel_id DESC")
    con.execute("DELETE FROM kernel_attribution")
    con.execute("INSERT INTO kernel_attribution SELECT * FROM backwards")
    asked.clear()
    stored.read_kept_launches(con, 1, counted)
    assert stored.is_kept(con, 1) and len(asked) == 2 and misplaced(asked[0]) > 0 and misplaced(asked[1]) == 0
    assert_frame_equal(launch_groups(con, 1).sort(LAUNCH_KEYS, nulls_last=True), _launch_groups_by_hand(con, 1),
                       check_dtypes=False)
    stages = stage_times(con, 1)
    con.execute("DELETE FROM attributions")
    assert_frame_equal(stages, stage_times(con, 1))
    con.close()


def test_kept_attribution_is_read_only_while_its_options_hold(tmp_path: Path, monkeypatch) -> None:
    db = tmp_path / "s.duckdb"
    assert runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    con = open_store(db, read_only=True)
    assert stored.is_kept(con, 1) and not stored.is_kept(con, 1, r"^step \d+$")
    rules = tmp_path / "rules.toml"
    rules.write_text("[[library]]\nmatch = 'nothing matches this'\nvalue = 'X'\n")
    monkeypatch.setenv("TRACEQ_RULES", str(rules))
    assert not stored.is_kept(con, 1)
    monkeypatch.delenv("TRACEQ_RULES")
    stored._code_digest.cache_clear()
    monkeypatch.setattr(stored, "_CODE", (*stored._CODE, "kernels/top.py"))  # traceq's attributing code changed
    assert not stored.is_kept(con, 1)
    stored._code_digest.cache_clear()
    monkeypatch.undo()
    stored._code_digest.cache_clear()
    assert stored.is_kept(con, 1)
    con.close()
    assert runner.invoke(app, ["rm", "lenet_b256_cudnn", "--db", str(db)]).exit_code == 0
    con = open_store(db, read_only=True)
    for table in stored.KEPT_TABLES:
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
    con.close()


def test_load_without_and_attribute_after(tmp_path: Path, monkeypatch) -> None:
    """`load --no-attribute` keeps nothing (analyses compute it, and above the load's limit say
    how to keep it); `traceq attribute` keeps what the analyses computed; a load above the limit
    keeps nothing by default."""
    db = tmp_path / "s.duckdb"
    shutil.copy(SAMPLES / "lenet_b256_cudnn.sqlite", tmp_path / "a.sqlite")
    assert runner.invoke(app, ["load", str(tmp_path / "a.sqlite"), "--no-attribute", "--db", str(db)]).exit_code == 0
    monkeypatch.setattr(stored, "LOAD_MAX_KERNELS", 10)
    assert runner.invoke(app, ["load", str(sample("alexnet_b64_nocache.sqlite")), "--db", str(db)]).exit_code == 0
    con = open_store(db, read_only=True)
    assert not stored.is_kept(con, 1) and not stored.is_kept(con, 2)
    before = attributed_kernels(con, 1)
    con.close()
    note = "`traceq attribute a` keeps the attribution"  # a trace above the limit, attributed on the fly
    for command in (["compare", "a", "a"], ["layers", "-t", "a"], ["stages", "-t", "a"]):
        assert runner.invoke(app, [*command, "--db", str(db)]).stderr.count(note) == 1  # once, both sides a
    assert note not in runner.invoke(app, ["layers", "-t", "a", "--iteration-regex", "^step", "--db", str(db)]).stderr
    result = runner.invoke(app, ["attribute", "a", "--db", str(db)])
    assert result.exit_code == 0 and result.stdout.startswith("attributed 'a' (trace 1) in "), result.output
    assert note not in runner.invoke(app, ["compare", "a", "a", "--db", str(db)]).stderr
    con = open_store(db, read_only=True)
    assert stored.is_kept(con, 1) and not stored.is_kept(con, 2)
    assert_frame_equal(attributed_kernels(con, 1), before)
    con.close()
    refused = runner.invoke(app, ["--rules", str(SAMPLES / "alexnet.model.toml"), "attribute", "--db", str(db)])
    assert refused.exit_code == 1 and refused.stderr.startswith("traceq: ")


def test_kept_precision_is_the_one_ce_reads(tmp_path: Path) -> None:
    """On the AMP Kineto capture (operators' recorded dtypes) and the AMP nsys trace: the kept
    precision of each kernel is the one `ce` measures it against."""
    import traceq

    db = tmp_path / "s.duckdb"
    for name in ("alexnet_b256_amp_kineto.json", "resnet50_b32_amp_ops.sqlite"):
        t = traceq.load(sample(name), store=db)
        kept = dict(t.con.execute("SELECT kernel_id, precision FROM kernels_attributed WHERE trace_id = ?",
                                  [t.id]).fetchall())
        from traceq.analysis.efficiency.ce import kernel_ce

        ce = kernel_ce(t.con, t.id).filter(pl.col("kernel_id").is_not_null())
        assert kept == dict(ce.select("kernel_id", "precision").iter_rows()), name
        assert len(set(kept.values())) > 1, name
        t.store.close()
