"""What keeps `traceq top` fast on big traces, checked without timing anything (bench/ measures).

The load writes kernel_summary, which must hold exactly what aggregating the launches gives; the
CLI must build without importing the analyses or polars; rankings rendered straight from DuckDB
must read exactly as their polars frames.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import sample, trace_id
from polars.testing import assert_frame_equal

from traceq.analysis.kernels.top import (
    NameBy,
    kernel_statistics,
    kernel_time_total,
    top_instances_relation,
    top_kernels_relation,
)
from traceq.render import Format, render

SAMPLES = ["alexnet_b256_cudnn", "alexnet_b256_nocudnn", "lenet_b256_cudnn", "ddp_resnet18_2gpu",
           "alexnet_b128_cudnn", "alexnet_b64_nocache"]


@pytest.mark.parametrize("by", list(NameBy))
@pytest.mark.parametrize("name", SAMPLES)
def test_summary_equals_the_live_aggregation(sample_store, name: str, by: NameBy) -> None:
    tid = trace_id(sample_store, name)
    stored = kernel_statistics(sample_store, tid, by)
    assert_frame_equal(stored, kernel_statistics(sample_store, tid, by, live=True))
    rows = sample_store.execute("SELECT count(*) FROM kernel_summary WHERE trace_id = ? AND name_by = ?",
                                [tid, by.value]).fetchall()[0][0]
    assert rows == len(stored) > 0  # read from the table, not aggregated again
    live_total = sample_store.execute("SELECT sum(dur_ns)::BIGINT FROM kernels WHERE trace_id = ?",
                                      [tid]).fetchall()[0][0]
    assert kernel_time_total(sample_store, tid) == live_total == stored["total_ns"].sum()


@pytest.mark.parametrize("fmt", list(Format))
def test_a_relation_renders_as_its_frame(sample_store, fmt: Format) -> None:
    tid = trace_id(sample_store, "alexnet_b256_cudnn")
    for relation in (top_kernels_relation(sample_store, tid, 15), top_instances_relation(sample_store, tid, 5),
                     top_kernels_relation(sample_store, tid, 0)):
        assert render(relation, fmt, title="t", width=120) == render(relation.pl(), fmt, title="t", width=120)


def _run(code: str) -> tuple[str, set[str]]:
    """Run Python `code` in a fresh interpreter: (its stdout, the modules it imported)."""
    done = subprocess.run([sys.executable, "-c", code + "\nimport sys; print('MODULES', *sys.modules)"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    out, _, modules = done.stdout.rpartition("MODULES ")
    return out, set(modules.split())


def test_the_cli_builds_without_analyses_or_polars() -> None:
    _, loaded = _run("import traceq.cli")
    assert "polars" not in loaded and "pyarrow" not in loaded
    assert {m for m in loaded if m.startswith("traceq.analysis.")} == {"traceq.analysis.choices"}


def test_top_with_the_library_column_needs_no_polars(tmp_path) -> None:
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    db = tmp_path / "s.duckdb"
    con = open_store(db, create=True)
    load_trace(con, sample("lenet_b256_cudnn.sqlite"))
    con.close()
    for extra in (["--no-context"], [], ["--instances"]):  # above the limit: the library column only
        out, loaded = _run(
            "import sys, traceq.api.trace, traceq.cli\n"
            "traceq.api.trace.AUTO_CONTEXT_MAX_KERNELS = 100\n"
            f"sys.argv = ['traceq', 'top', '--db', {str(db)!r}, *{extra!r}]\n"
            "try:\n    traceq.cli.main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n")
        assert "polars" not in loaded, extra
        headers = [h.strip() for h in out.splitlines()[2].split("┃")[1:-1]]
        assert headers[0] == "#" and headers[-1] == ("Name" if "--no-context" in extra else "Library")


def test_rm_removes_the_summary(tmp_path) -> None:
    from typer.testing import CliRunner

    from traceq.cli import app
    from traceq.store import open_store

    db = tmp_path / "s.duckdb"
    runner = CliRunner()
    assert runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    assert runner.invoke(app, ["rm", "lenet_b256_cudnn", "--db", str(db)]).exit_code == 0
    con = open_store(db, read_only=True)
    assert con.execute("SELECT count(*) FROM kernel_summary").fetchall()[0][0] == 0
    con.close()
