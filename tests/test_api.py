"""The Python API gives what the CLI prints: every command's json equals the API method's frame,
on every bundled sample; the API raises where the CLI refuses, with the same message."""

from __future__ import annotations

import json
import math
import warnings
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
from conftest import SAMPLES
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

import traceq
from traceq.analysis.choices import StatsReport
from traceq.cli import app

pytestmark = pytest.mark.xdist_group("api")  # one worker builds its module fixtures once (--dist loadgroup)

runner = CliRunner()
SAMPLE_FILES = sorted([*SAMPLES.glob("*.sqlite"), *SAMPLES.glob("*.json"), *SAMPLES.glob("*_kineto.json.gz")])
SPEC = str(SAMPLES / "alexnet.model.toml")

COMMANDS = {  # what the CLI runs (with -t TRACE) -> the same through the API
    "top": (["top"], lambda t: t.top()),
    "top short": (["top", "--by", "short", "-k", "5"], lambda t: t.top(5, "short")),
    "top no context": (["top", "--no-context"], lambda t: t.top(context=False)),
    "top instances": (["top", "--instances", "-k", "5"], lambda t: t.top(5, instances=True)),
    "layers": (["layers"], lambda t: t.layers()),
    "libs": (["libs"], lambda t: t.libs()),
    "libs by layer": (["libs", "--by-layer"], lambda t: t.libs(by_layer=True)),
    "stages": (["stages"], lambda t: t.stages()),
    "ru kernel": (["ru"], lambda t: t.ru()),
    "ru layer": (["ru", "--by", "layer", "-k", "10"], lambda t: t.ru("layer", k=10)),
    "ru library": (["ru", "--by", "library"], lambda t: t.ru("library")),
    "ce layer": (["ce"], lambda t: t.ce()),
    "ce library": (["ce", "--by", "library", "--precision", "fp16"], lambda t: t.ce("library", precision="fp16")),
    "memory layer": (["memory"], lambda t: t.memory()),
    "memory time": (["memory", "--by", "time"], lambda t: t.memory("time")),
    "traffic": (["traffic", "-k", "8"], lambda t: t.traffic(k=8)),
    "idle": (["idle"], lambda t: t.idle()),
    **{f"idle {by}": (["idle", "--by", by], lambda t, by=by: t.idle(by)) for by in ("iteration", "stream", "layer")},
    "launches": (["launches", "-k", "10"], lambda t: t.launches(k=10)),
    **{f"stats {r.value}": (["stats", "-r", r.value], lambda t, r=r: t.stats(r.value)) for r in StatsReport},
    "advise": (["advise"], lambda t: t.advise()),
}
ALEXNET_SPEC = {  # with a model spec, on the AlexNet samples
    "ce spec kernel": (["ce", "--by", "kernel", "--spec", SPEC], lambda t: t.ce("kernel", spec=SPEC)),
    "traffic spec kernel": (["traffic", "--by", "kernel", "--spec", SPEC, "--gpu", "A100-SXM4-80GB"],
                            lambda t: t.traffic("kernel", spec=SPEC, gpu="A100-SXM4-80GB")),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every bundled sample, loaded by `traceq load`."""
    path = tmp_path_factory.mktemp("api") / "s.duckdb"
    result = runner.invoke(app, ["load", *(str(p) for p in SAMPLE_FILES), "--db", str(path)])
    assert result.exit_code == 0, result.output
    return path


def _value(v: object) -> object:
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, datetime):
        return str(v)
    return v


def _rows(rows: list[dict]) -> list[dict]:
    return [{k: _value(v) for k, v in row.items()} for row in rows]


def _trace_name(path: Path) -> str:
    return path.name.removesuffix(".gz").removesuffix(".json").removesuffix(".sqlite")


@pytest.mark.parametrize("sample", [_trace_name(p) for p in SAMPLE_FILES])
def test_every_command_gives_the_api_frame(store: Path, sample: str) -> None:
    """For each command (and grouping) on one sample: the CLI's json rows are the API frame's
    rows, value for value; where the CLI refuses in one line, the API raises that message."""
    t = traceq.open(store).trace(sample)
    commands = {**COMMANDS, **(ALEXNET_SPEC if sample.startswith("alexnet_b256_cudnn") else {})}
    for command, (args, call) in commands.items():
        result = runner.invoke(app, [*args, "-t", sample, "--db", str(store), "-f", "json"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", traceq.TraceqWarning)
            try:
                frame = call(t)
            except traceq.TraceqError as e:
                assert result.exit_code == 1, f"{command}: the CLI did not refuse: {result.output[-300:]}"
                assert result.stderr.strip().splitlines()[-1] == f"traceq: {e}", command
                continue
        assert result.exit_code == 0, f"{command}: {result.output[-300:]}"
        assert _rows(json.loads(result.stdout)) == _rows(frame.to_dicts()), f"{sample}: {command}"
    t.store.close()


def test_compare_and_traces(store: Path) -> None:
    with traceq.open(store) as s:
        assert _rows(json.loads(runner.invoke(app, ["traces", "--db", str(store), "-f", "json"]).stdout)) == _rows(
            s.traces().to_dicts())
        a = s.trace("alexnet_b256_cudnn")
        for by in ("layer", "kernel", "library", "stage"):
            cli = runner.invoke(app, ["compare", "alexnet_b256_cudnn", "alexnet_b128_cudnn", "--by", by, "--spec",
                                      SPEC, "--db", str(store), "-f", "json"])
            assert cli.exit_code == 0, cli.output
            assert _rows(json.loads(cli.stdout)) == _rows(a.compare("alexnet_b128_cudnn", by, spec=SPEC).to_dicts()), by


def test_compare_reads_both_traces_at_once_as_one_after_the_other(store: Path, monkeypatch) -> None:
    """`Trace.compare` attributes b in a thread of its own (`Trace._both`): the frames are
    `compare_runs`' on one connection, b's attribution is kept for b's next call, and an
    error on either side is the caller's."""
    from traceq.analysis.compare.side_by_side import compare_runs
    from traceq.analysis.structure import layers

    with traceq.open(store) as s:
        a, b = s.trace("alexnet_b256_cudnn"), s.trace("alexnet_b128_cudnn")
        for by in ("layer", "stage"):
            alone, _ = compare_runs(s._over([a.id, b.id]), a.id, b.id, by, spec=Path(SPEC))
            assert_frame_equal(a.compare(b, by, spec=SPEC), alone)
        assert b._kept.get("stages") is not None
    stage_times = layers.stage_times
    for failing in ("alexnet_b256_cudnn", "alexnet_b128_cudnn"):
        with traceq.open(store) as s:
            a, b = s.trace("alexnet_b256_cudnn"), s.trace("alexnet_b128_cudnn")
            broken = s.trace(failing).id

            def stages(con, trace_id, regex):
                if trace_id == broken:
                    raise traceq.TraceqError(f"trace {trace_id} refused")
                return stage_times(con, trace_id, regex)

            monkeypatch.setattr(layers, "stage_times", stages)
            with pytest.raises(traceq.TraceqError, match=f"trace {broken} refused"):
                a.compare(b, "stage")


RUN_COMMANDS = {  # what the CLI runs on a run -> the same through the API
    "comm": (["comm"], lambda r: r.comm()),
    "comm instance": (["comm", "--by", "instance"], lambda r: r.comm("instance")),
    "overlap": (["overlap"], lambda r: r.overlap()),
    "ranks": (["ranks"], lambda r: r.ranks()),
    "ranks collective": (["ranks", "--by", "collective", "-k", "5"], lambda r: r.ranks("collective", k=5)),
}


def _run_commands_give_the_api_frames(db: Path, run: traceq.Run) -> None:
    for command, (args, call) in RUN_COMMANDS.items():
        result = runner.invoke(app, [*args, run.name, "--db", str(db), "-f", "json"])
        assert result.exit_code == 0, f"{command}: {result.output[-300:]}"
        frame = call(run)
        assert frame.height > 0, command
        assert _rows(json.loads(result.stdout)) == _rows(frame.to_dicts()), f"{run.name}: {command}"


def test_layers_libs_top_ru_and_compare_group_the_launches_once(store: Path, monkeypatch) -> None:
    """A Trace keeps its launch groups: `layers`, `libs`, `top`'s context, `ru` by layer,
    `iterations` and `compare` all sum the same ones, made once per trace."""
    from traceq.analysis.structure import layers

    made: list[int] = []
    launch_groups = layers.launch_groups

    def counted(con, trace_id, regex):
        made.append(trace_id)
        return launch_groups(con, trace_id, regex)

    monkeypatch.setattr(layers, "launch_groups", counted)
    with traceq.open(store) as s:
        a, b = s.trace("alexnet_b256_cudnn"), s.trace("alexnet_b128_cudnn")
        a.layers(), a.libs(), a.top(context=True), a.ru("layer"), a.iterations(), a.compare(b), b.layers()
    assert sorted(made) == sorted([a.id, b.id])


def test_run_commands_give_the_api_frames(store: Path) -> None:
    """comm, overlap, ranks and compare across GPU counts on the DDP sample (one file, two
    processes: a run of 2 ranks): the CLI's json is the Run method's frame; report and compare
    take a run's name for its rank 0's trace."""
    with traceq.open(store) as s:
        r = s.run("ddp_resnet18_2gpu")
        assert (r.world_size, r.clock, [t.name for t in r.traces()]) == (2, "one trace", ["ddp_resnet18_2gpu"])
        assert s.run(s.trace("ddp_resnet18_2gpu")).id == r.id
        _run_commands_give_the_api_frames(store, r)
        cli = runner.invoke(app, ["compare", "alexnet_b256_cudnn", "ddp_resnet18_2gpu", "--by", "stage", "--db",
                                  str(store), "-f", "json"])
        assert cli.exit_code == 0, cli.output
        frame = s.run("alexnet_b256_cudnn").compare(r, "stage")
        assert frame["b_gpus"].unique().to_list() == [2]
        assert _rows(json.loads(cli.stdout)) == _rows(frame.to_dicts())


def test_a_run_loaded_and_read_through_the_api(tmp_path: Path) -> None:
    """The 8 DLRM Kineto ranks: `Store.load_run` loads what `traceq load --run` does (the same
    ranks and shifts), and every run command's json equals the Run method's frame."""
    from conftest import DLRM

    if len(DLRM) != 8:
        pytest.skip("the DLRM rank files are absent")
    db = tmp_path / "cli.duckdb"
    loaded = runner.invoke(app, ["load", *map(str, DLRM), "--run", "dlrm8", "--db", str(db)])
    assert loaded.exit_code == 0 and "run 'dlrm8': 8 ranks" in loaded.stdout, loaded.output
    ranks = "SELECT k.rank, t.name, k.shift_ns, k.drift_ppm FROM ranks k JOIN traces t USING (trace_id) ORDER BY 1"
    with traceq.Store(tmp_path / "api.duckdb", lazy=True) as s:
        r = s.load_run(DLRM, "dlrm8")
        assert [x.status for x in r.load_results] == ["loaded"] * 8 and (r.world_size, r.clock) == (8, "collective ends")
        via_api = s.con.execute(ranks).fetchall()
    with traceq.open(db) as s:
        r = s.run("dlrm8")
        assert s.con.execute(ranks).fetchall() == via_api
        assert r.max_shift_ns == max(abs(row[2]) for row in via_api)
        _run_commands_give_the_api_frames(db, r)
        assert s.trace("dlrm8").name == via_api[0][1]  # a run's name: its rank 0's trace


def test_compare_gate_gives_the_api_verdict(store: Path) -> None:
    """`compare --gate`: the CLI exits 3 exactly when the API's GateResult failed, and its last
    stderr line is the result's verdict; a gate on traces without iterations is refused alike.
    b256 takes about 1.8 times b128's time per iteration: slower beyond 5 %, not beyond 100 %."""
    b128, b256 = "alexnet_b128_cudnn", "alexnet_b256_cudnn"
    with traceq.open(store) as s:
        failed = []
        for a, b, gate, threshold in ((b256, b128, "5%", 0.05), (b128, b256, "5%", 0.05), (b128, b256, "100", 1.0)):
            cli = runner.invoke(app, ["compare", a, b, "--gate", gate, "--db", str(store), "-f", "json"])
            result = s.trace(a).gate(b, threshold)
            assert cli.exit_code == (3 if result.failed else 0), cli.output
            assert cli.stderr.strip().splitlines()[-1] == f"traceq: {result.verdict}"
            assert _rows(json.loads(cli.stdout)) == _rows(s.trace(a).compare(b).to_dicts())
            failed.append(result.failed)
        assert failed == [False, True, False], "b128 -> b256 only fails the 5 % gate"
        with pytest.raises(traceq.MissingDataError) as e:
            s.trace("alexnet_b256_cudnn").gate("alexnet_b128_cudnn", iteration_regex="^no such range$")
        cli = runner.invoke(app, ["compare", "alexnet_b256_cudnn", "alexnet_b128_cudnn", "--gate", "5%",
                                  "--iteration-regex", "^no such range$", "--db", str(store), "-f", "json"])
        assert cli.exit_code == 1 and cli.stderr.strip().splitlines()[-1] == f"traceq: {e.value}"


def test_every_command_has_a_documented_method() -> None:
    """docs/api.md's table gives every `traceq` command its API method, and each method it names
    exists (a command added to the CLI without its method, or a renamed method, fails here)."""
    import re

    from typer.main import get_command

    rows = re.findall(r"^\| `traceq ([a-z]+)[^`]*` \| (.*?) \|", (SAMPLES.parent / "docs" / "api.md").read_text(),
                      re.MULTILINE)
    assert set(get_command(app).commands) <= {command for command, _ in rows}  # type: ignore[attr-defined]
    for command, methods in rows:
        for owner, name in re.findall(r"`(Store|Trace|Run|traceq)\.(\w+)\(", methods):
            assert hasattr(traceq if owner == "traceq" else getattr(traceq, owner), name), (command, owner, name)


def test_kernels_hold_every_launch_with_its_context(store: Path) -> None:
    """`Trace.kernels()`: one row per launch of the trace (counted in the store), its layer as
    `layers` sums it, its precision as `ce` reads it, its RU as `ru` weighs it."""
    with traceq.open(store) as s:
        t = s.trace("alexnet_b256_cudnn")
        k = t.kernels()
        assert k.height == s.con.execute("SELECT count(*) FROM kernel_events WHERE trace_id = ?", [t.id]).fetchone()[0]
        assert k["kernel_id"].is_sorted() and k["ru"].null_count() == 0
        per_layer = {(layer, pass_): total for layer, pass_, total in
                     k.group_by("layer", "pass").agg(pl.col("dur_ns").sum()).iter_rows()}
        assert per_layer == {(r["layer"], r["pass"]): r["total_ns"] for r in t.layers().iter_rows(named=True)}
        assert set(k["precision"]) <= {"fp32", "tf32", "fp16", "bf16", "fp64", "fp8", "int8"}


def test_the_api_raises_instead_of_exiting(store: Path, tmp_path: Path) -> None:
    with pytest.raises(traceq.StoreError, match="no store at"):
        traceq.open(tmp_path / "none.duckdb")
    with traceq.open(store) as s:
        with pytest.raises(traceq.NotFoundError, match="no trace 'nope'"):
            s.trace("nope")
        with pytest.raises(traceq.MissingDataError, match="no CUDA memory usage events"):
            s.trace("ddp_resnet18_2gpu").memory()
    with pytest.raises(traceq.TraceFormatError):
        traceq.load(SAMPLES / "alexnet.model.toml", store=tmp_path / "new.duckdb")
    assert not (tmp_path / "new.duckdb").exists(), "a refused load left a store behind"


def test_load_returns_the_trace_and_the_store_stays_read_only(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    t = traceq.load(SAMPLES / "lenet_b256_cudnn.sqlite", store=db)
    assert (t.name, t.load_result.status) == ("lenet_b256_cudnn", "loaded")
    assert t.top(3).height == 3
    with pytest.raises(traceq.TraceqError, match="refused"):
        t.store.sql("DELETE FROM kernel_events")
    assert traceq.load(SAMPLES / "lenet_b256_cudnn.sqlite", store=t.store).load_result.status == "already_loaded"
    t.store.close()


def test_dir_shows_the_public_api_and_imports_stay_lazy() -> None:
    import subprocess
    import sys

    code = ("import sys, traceq; print(sorted(n for n in dir(traceq) if not n.startswith('_'))); "
            "print('polars' in sys.modules, 'traceq.analysis.structure.layers' in sys.modules); import traceq.analysis.structure.layers")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert eval(out[0]) == ["MissingDataError", "NotFoundError", "OptionError", "RegressionError", "Run", "Store", "StoreError",
                            "Trace", "TraceFormatError", "TraceqError", "TraceqWarning", "load", "load_dataset", "occupancy", "open",
                            "use_rules"]
    assert out[1] == "False False"
    import traceq.errors as errors

    assert {n for n, v in vars(errors).items() if isinstance(v, type)} <= set(dir(traceq)), "an error class not exported"


def test_sql_reads_and_refuses_writes_in_one_line(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`traceq sql`: rows as every table prints them (the kept attribution grouped by layer equals
    `layers`), a write refused in one line with the store unchanged, DuckDB's shell when on PATH."""
    import hashlib

    query = ("SELECT layer, pass, sum(dur_ns)::BIGINT AS total_ns FROM kernels_attributed k JOIN traces t "
             "USING (trace_id) WHERE t.name = 'alexnet_b256_cudnn' GROUP BY ALL ORDER BY 3 DESC, 1, 2")
    rows = json.loads(runner.invoke(app, ["sql", query, "--db", str(store), "-f", "json"]).stdout)
    with traceq.open(store) as s:
        layers = s.trace("alexnet_b256_cudnn").layers()
    assert [(r["layer"], r["pass"], r["total_ns"]) for r in rows] == list(
        layers.select("layer", "pass", "total_ns").sort(["total_ns", "layer", "pass"], descending=[True, False, False],
                                                        nulls_last=True).iter_rows())
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    for statement in ("DELETE FROM kernel_events", "DROP TABLE traces", "COPY traces TO 'x.csv'", "SELECT 1; SELECT 2"):
        result = runner.invoke(app, ["sql", statement, "--db", str(store)])
        assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.output
        assert result.stderr.startswith("traceq: sql: "), result.stderr
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before
    monkeypatch.setenv("PATH", str(tmp_path))
    missing = runner.invoke(app, ["sql", "--db", str(store)])
    assert missing.exit_code == 1 and "`duckdb` is not on PATH" in missing.stderr.replace("(`duckdb`)", "`duckdb`")
    shell = tmp_path / "duckdb"
    shell.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'args'}\nexit 7\n")
    shell.chmod(0o755)
    assert runner.invoke(app, ["sql", "--db", str(store)]).exit_code == 7
    assert (tmp_path / "args").read_text().split() == ["-readonly", str(store)]
