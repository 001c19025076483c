"""The CLI end to end with typer's CliRunner: what a user sees."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import sample
from typer.testing import CliRunner

from traceq.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "s.duckdb"
    result = runner.invoke(app, ["load", str(sample("alexnet_b256_cudnn.sqlite")),
                                 str(sample("lenet_b256_cudnn.sqlite")), "--db", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("loaded 'alexnet_b256_cudnn' (trace 1) from ")
    assert "648 kernels, 1,290 API calls, 64 memcpy/memset, 188 NVTX events" in lines[0]
    assert lines[1].startswith("loaded 'lenet_b256_cudnn' (trace 2)")
    return path


def test_top_table_is_readable(db: Path) -> None:
    result = runner.invoke(app, ["top", "--k", "15", "--trace", "alexnet_b256_cudnn", "--db", str(db)],
                           env={"COLUMNS": "160"})
    assert result.exit_code == 0
    out = result.stdout
    assert out.startswith("alexnet_b256_cudnn: top 15 kernels by total time (all kernels: 58.458 ms")
    assert "Instances" in out and "Median" in out and "Time %" in out
    first = next(line for line in out.splitlines() if line.startswith("│  1 │"))  # the '#' column
    # rank 1: 4 instances, 6.793 ms total, 11.6 %, the cuDNN fprop kernel
    assert "│         4 │ 6.793 ms │   11.6 │" in first and "sm80_xmma_fprop" in first and "__5x_cudnn" in first
    assert sum(1 for line in out.splitlines() if line.startswith("│ ")) == 15


def test_top_defaults_to_the_latest_trace(db: Path) -> None:
    result = runner.invoke(app, ["top", "--db", str(db), "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 15
    assert sum(int(r["instances"]) for r in rows) <= 260
    out = runner.invoke(app, ["top", "--db", str(db)], env={"COLUMNS": "100"}).stdout
    assert out.startswith("lenet_b256_cudnn: top 15 kernels")
    assert max(len(line) for line in out.splitlines()[1:]) <= 100


def test_top_csv_and_json_in_ns(db: Path) -> None:
    as_csv = runner.invoke(app, ["top", "-k", "3", "-t", "1", "--db", str(db), "-f", "csv"]).stdout
    rows = list(csv.DictReader(io.StringIO(as_csv)))
    assert list(rows[0]) == ["rank", "instances", "total_ns", "pct", "avg_ns", "median_ns", "min_ns",
                             "max_ns", "stddev_ns", "name", "layer", "pass", "library"]
    plain = runner.invoke(app, ["top", "-k", "3", "-t", "1", "--db", str(db), "-f", "csv", "--no-context"]).stdout
    assert plain.splitlines()[0] == "rank,instances,total_ns,pct,avg_ns,median_ns,min_ns,max_ns,stddev_ns,name"
    assert rows[0]["total_ns"] == "6793368" and rows[0]["instances"] == "4"
    as_json = json.loads(runner.invoke(app, ["top", "-k", "3", "-t", "1", "--db", str(db), "-f", "json"]).stdout)
    assert [r["total_ns"] for r in as_json] == [int(r["total_ns"]) for r in rows]
    assert as_json[0]["median_ns"] == 1698254.0


def test_top_instances(db: Path) -> None:
    rows = json.loads(runner.invoke(app, ["top", "--instances", "-k", "5", "-t", "alexnet_b256_cudnn",
                                          "--db", str(db), "-f", "json"]).stdout)
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5]
    durations = [r["dur_ns"] for r in rows]
    assert durations == sorted(durations, reverse=True)
    # the longest single launch is the max of the heaviest-by-max kernel in nsys stats
    with sample("alexnet_b256_cudnn.nsys_stats_kern_sum.csv").open() as f:
        longest = max(int(r["Max (ns)"]) for r in csv.DictReader(f))
    assert durations[0] == longest
    assert set(rows[0]) >= {"start_ns", "dur_ns", "device_id", "stream_id", "name"}


def test_output_file_format_from_suffix(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "top.json"
    result = runner.invoke(app, ["top", "-t", "1", "--db", str(db), "-o", str(out)])
    assert result.exit_code == 0 and result.stdout == ""
    assert result.stderr.strip() == f"traceq: wrote {out}"
    assert len(json.loads(out.read_text())) == 15


def test_by_short_name(db: Path) -> None:
    rows = json.loads(runner.invoke(app, ["top", "-t", "1", "--by", "short", "--db", str(db), "-f", "json",
                                          "-k", "100"]).stdout)
    names = [r["name"] for r in rows]
    assert "nchwToNhwcKernel" in names and all("(" not in n for n in names)


def test_occupancy_calculator_json() -> None:
    """notes §5.4: the H200 nvjet GEMM (opt-in, 213,204 B smem) fits 1 block/SM, 132 blocks = 1 wave."""
    result = runner.invoke(app, ["occupancy", "--cc", "9.0", "--threads", "384", "--regs", "168",
                                 "--smem-dynamic", "213204", "--opt-in", "--carveout", "233472",
                                 "--grid", "132", "--sms", "132", "--format", "json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["blocks_per_sm"] == 1
    assert got["limiter"] == "registers+shared_mem"
    assert got["occupancy"] == pytest.approx(0.1875)
    assert got["waves"] == 1 and got["ru"] == 1
    no_opt_in = json.loads(runner.invoke(app, ["occupancy", "--cc", "9.0", "--threads", "384", "--regs", "168",
                                               "--smem-dynamic", "213204", "--format", "json"]).stdout)
    assert no_opt_in["blocks_per_sm"] == 0


def test_occupancy_bad_cc() -> None:
    result = runner.invoke(app, ["occupancy", "--cc", "4.2", "--threads", "32", "--regs", "8"])
    assert result.exit_code == 1 and result.stderr.startswith("traceq: compute capability 4.2 is not")
    assert runner.invoke(app, ["occupancy", "--cc", "nine", "--threads", "32", "--regs", "8"]).exit_code == 2


def test_help_lists_every_command() -> None:
    out = runner.invoke(app, ["--help"]).stdout
    for command in ("load", "traces", "top", "rm", "occupancy"):
        assert command in out


def test_console_script_and_module_run(tmp_path: Path) -> None:
    for argv in (["traceq", "--version"], [sys.executable, "-m", "traceq", "--version"]):
        exe = Path(sys.executable).parent / "traceq" if argv[0] == "traceq" else None
        cmd = [str(exe), *argv[1:]] if exe else argv
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith("traceq "), done.stderr


def test_export_runs_nsys_on_a_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--export runs `nsys export --type sqlite` (here a stand-in nsys on PATH) and loads the result."""
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        "# stand-in for: nsys export --type sqlite --output OUT REPORT\n"
        f'[ "$1 $2 $3" = "export --type sqlite" ] && [ "$4" = "--output" ] || exit 3\n'
        f'cp "{sample("lenet_b256_cudnn.sqlite")}" "$5"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{__import__('os').environ['PATH']}")
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"NVIDIA Tegra Profiler Report 2025.3\n" + b"\0" * 100)
    db = tmp_path / "s.duckdb"
    refused = runner.invoke(app, ["load", str(report), "--db", str(db)])
    assert refused.exit_code == 1 and "pass --export to let traceq run it" in refused.stderr
    result = runner.invoke(app, ["load", str(report), "--export", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "loaded 'run' (trace 1)" in result.stdout and "260 kernels" in result.stdout


def test_progress_bar_appears_on_a_terminal_after_a_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from traceq.cli import base as cli

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    fake = Tty()
    monkeypatch.setattr(cli.sys, "stderr", fake)
    quick = cli._LazyProgress("loading", delay_s=3600)
    quick(10, 100)
    assert quick.bar is None  # a fast load shows nothing
    slow = cli._LazyProgress("loading", delay_s=0)
    slow(10, 100)
    slow(100, 100)
    assert slow.bar is not None and slow.bar.tasks[0].completed == 100
    slow.close()
    monkeypatch.setattr(cli.sys, "stderr", io.StringIO())
    assert cli._LazyProgress("loading", delay_s=0).enabled is False  # not a terminal: no bar


def test_a_spinner_shows_on_a_terminal_after_the_first_second_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands without steps to count show a spinner with the seconds spent (`_working`): on a
    terminal, once `delay_s` has passed, erased when the work ends; never for quick work or off
    a terminal."""
    import time

    from traceq.cli.base import _working

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, delay_s, seconds, shown in ((Terminal(), 0.05, 0.4, True), (Terminal(), 5.0, 0.0, False),
                                            (io.StringIO(), 0.05, 0.4, False)):
        monkeypatch.setattr(sys, "stderr", stream)
        with _working("alexnet_10M vs alexnet_b256", delay_s=delay_s):
            time.sleep(seconds)
        written = stream.getvalue()
        assert ("alexnet_10M vs alexnet_b256" in written) is shown, written
        assert not shown or written.endswith("\x1b[2K"), "the spinner's line is erased"
