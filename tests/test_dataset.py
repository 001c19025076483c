"""Datasets: trace files loaded in parallel on a local Dask cluster into Parquet (traceq load
--dataset), and the commands on them (--dataset) against the same traces in a single-file store
(top, layers, comm, overlap, ranks, report, ...: the same output, to the byte), runs of several
files (--run) included: the 2-GPU DDP recording's two nsys files and the 8 DLRM Kineto ranks.

One local cluster of 2 worker processes serves the module: starting it and loading the 11 traces
into a dataset and into a store takes 11 to 22 s on our busy 2-core machine, the module 27 to
42 s; the worker-killing test loads the 8 DLRM ranks again on it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import sample, shared_files
from typer.testing import CliRunner

from traceq.cli import app

pytestmark = pytest.mark.xdist_group("dataset")  # one worker builds its module fixtures once (--dist loadgroup)

pytest.importorskip("distributed")  # the test extra installs it; CI runs these

runner = CliRunner()
DLRM = shared_files("realtraces/kineto_json", "facebookresearch__param__dlrm_kineto__worker*")
DDP = [sample(f"multigpu/ddp_resnet50_2gpu_rank{r}.sqlite") for r in (0, 1)]  # nsys, a file per rank


def _name(path: Path) -> str:
    """The trace name `traceq load` gives a file: rank0.json.gz is rank0."""
    return path.name.removesuffix(".gz").rsplit(".", 1)[0]


COMMANDS = [["top", "-k", "50"], ["layers"], ["libs"], ["stages"], ["advise"]]
RUN_COMMANDS = [["comm"], ["overlap"], ["ranks"], ["comm", "--by", "instance"], ["ranks", "--by", "collective"]]
RUNS = {"ddp": DDP, "dlrm": DLRM}


@pytest.fixture(scope="module")
def client():
    import dask

    from traceq.api.datasets import dask_client

    # A rank whose worker dies fails at once (Dask's default retries it on another worker), so
    # that the killing test sees the failure the way a rank that kills every worker would.
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), dask_client(workers=2) as c:
        yield c


@pytest.fixture(scope="module")
def scheduler_file(client, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's cluster as a scheduler file names it (a client writes one file only)."""
    path = tmp_path_factory.mktemp("cluster") / "scheduler.json"
    client.write_scheduler_file(str(path))
    return path


@pytest.fixture(scope="module")
def loaded(client, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path]]:
    """The one-file DDP sample (2 ranks), and as runs of several files the 2-GPU DDP recording
    (run ddp) and the 8 DLRM ranks (run dlrm), in a dataset (by the CLI's code path on `client`)
    and in a store (by `traceq load`, `--run` for the runs)."""
    from traceq.api.datasets import load_dataset, plan_load

    if not DLRM:
        pytest.skip("../shared is absent: the DLRM ranks are there")
    alone = sample("ddp_resnet18_2gpu.sqlite")
    base = tmp_path_factory.mktemp("dataset")
    store = base / "s.duckdb"
    for files, run in (([alone], None), *((files, run) for run, files in RUNS.items())):
        done = load_dataset(client, plan_load(files, base / "ds", run))
        assert [e.name for e in done.loaded] == [_name(f) for f in files] and not done.failed
        assert run is None or (done.run.name, done.run.status) == (run, "loaded")
        result = runner.invoke(app, ["load", *map(str, files), "--db", str(store), *(["--run", run] if run else [])])
        assert result.exit_code == 0, result.output
    return base / "ds", store, [alone, *DDP, *DLRM]


def _run(args: list[str]) -> str:
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


VOLATILE = {"traces": {"loaded_at", "load_seconds"}, "attributions": {"seconds"}, "runs": {"run_id"},
            "ranks": {"run_id"}}
"""Columns that say when and how fast a load ran, not what it read; and run ids (a store draws
them in turn, a dataset gives a run of several files its first trace's)."""


def test_every_store_table_holds_the_same_rows_in_the_dataset(loaded) -> None:
    """Table by table, the dataset's views hold the store's rows (every table, so one added to
    the schema is covered or fails here), trace ids, run ids and kept attribution included."""
    dataset, store, _ = loaded
    import traceq

    con = traceq.open(dataset=dataset).con
    con.execute(f"ATTACH '{store}' AS s (READ_ONLY)")
    tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 's' "
                                        "AND table_name != 'traceq_meta' ORDER BY 1").fetchall()]
    # `load --ncu` fills the ncu_* tables in a store only: a dataset keeps them empty
    assert all(con.execute(f"SELECT count(*) FROM main.{t}").fetchone()[0] == 0 for t in tables if t.startswith("ncu_"))
    tables = [t for t in tables if not t.startswith("ncu_")]
    assert {"kernel_events", "graph_nodes", "kernel_attribution", "kernel_contexts", "collectives"} <= set(tables)
    views = {v for (v,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert set(tables) <= views, f"kept in no Parquet file: {sorted(set(tables) - views)}"
    for table in tables:
        columns = [c for (c,) in con.execute("SELECT column_name FROM duckdb_columns() WHERE database_name = 's' "
                                             "AND table_name = ? ORDER BY column_index", [table]).fetchall()
                   if c not in VOLATILE.get(table, ())]
        cols = ", ".join(f'"{c}"' for c in columns)
        rows = con.execute(f"SELECT count(*) FROM s.{table}").fetchone()[0]
        assert con.execute(f"SELECT count(*) FROM main.{table}").fetchone()[0] == rows, table
        differ = con.execute(f"SELECT count(*) FROM (SELECT {cols} FROM s.{table} EXCEPT ALL "
                             f"SELECT {cols} FROM main.{table})").fetchone()[0]
        assert differ == 0, f"{table}: {differ} of {rows} rows differ"
    kept = con.execute("SELECT count(DISTINCT trace_id) FROM attributions").fetchone()[0]
    assert kept == 11  # every trace's attribution is kept, and read from the dataset


def test_commands_on_a_dataset_print_what_they_print_on_the_store(loaded) -> None:
    dataset, store, files = loaded
    for trace in [_name(files[0]), "ddp", "dlrm", _name(files[-1])]:  # a run's name: its rank 0's trace
        for command in COMMANDS if trace == _name(files[0]) else COMMANDS[:2]:
            on_store = _run([*command, "-t", trace, "--db", str(store), "-f", "json"])
            assert _run([*command, "-t", trace, "--dataset", str(dataset), "-f", "json"]) == on_store, (command, trace)
    for run in (_name(files[0]), "ddp", "dlrm"):  # a file of 2 ranks, and runs of 2 and 8 files, clocks aligned
        for command in RUN_COMMANDS[:3] if run == _name(files[0]) else RUN_COMMANDS:
            on_store = _run([*command, run, "--db", str(store), "-f", "json"])
            assert _run([*command, run, "--dataset", str(dataset), "-f", "json"]) == on_store, (command, run)
    ranks = json.loads(_run(["ranks", "dlrm", "--dataset", str(dataset), "-f", "json"]))
    assert sorted({r["rank"] for r in ranks}) == list(range(8))  # one run of the 8 files, not 8 runs
    assert [r["run"] for r in json.loads(_run(["traces", "--dataset", str(dataset), "-f", "json"]))] == \
        [_name(files[0]), "ddp", "ddp", *["dlrm"] * 8]
    on_store = _run(["top", "--db", str(store)])  # the latest trace, as a table
    assert on_store.startswith(_name(DLRM[-1]))
    assert _run(["top", "--dataset", str(dataset)]) == on_store
    assert _run(["compare", _name(files[0]), "dlrm", "--dataset", str(dataset), "-f", "json"]) == \
        _run(["compare", _name(files[0]), "dlrm", "--db", str(store), "-f", "json"])  # runs of 2 and 8 GPUs
    a, b = _name(files[3]), _name(files[4])  # two traces at once: views over both traces' files
    assert _run(["compare", a, b, "--dataset", str(dataset), "-f", "csv"]) == \
        _run(["compare", a, b, "--db", str(store), "-f", "csv"])
    gated = [runner.invoke(app, ["compare", a, b, "--gate", "5%", where, str(source)])
             for where, source in (("--dataset", dataset), ("--db", store))]
    assert gated[0].stderr == gated[1].stderr and "gate" in gated[0].stderr
    query = "SELECT trace_id, count(*) AS kernels FROM kernels GROUP BY 1 ORDER BY 1"
    assert _run(["sql", query, "--dataset", str(dataset)]) == _run(["sql", query, "--db", str(store)])


def _events(path: Path) -> list[str]:
    """An export's events as sorted JSON texts (flows come in no set order)."""
    import gzip

    with gzip.open(path, "rt", encoding="utf-8") as f:
        return sorted(json.dumps(e, sort_keys=True) for e in json.load(f)["traceEvents"])


def test_report_and_export_on_a_dataset_are_those_of_the_store(loaded, tmp_path: Path) -> None:
    dataset, store, files = loaded
    trace = _name(files[0])
    written = {}
    for where in ("--dataset", "--db"):
        source = str(dataset if where == "--dataset" else store)
        html, events = tmp_path / f"{where[2:]}.html", tmp_path / f"{where[2:]}.json.gz"
        _run(["report", "ddp", where, source, "-o", str(html)])  # rank 0's trace, with the run's figures
        _run(["export", trace, where, source, "-o", str(events)])
        run_events = tmp_path / f"{where[2:]}-run.json.gz"
        _run(["export", "dlrm", where, source, "-o", str(run_events)])  # every rank of the 8-file run
        page = re.sub(r"built in [0-9.]+ s", "built in N s", html.read_text())
        written[where] = page, *(_events(path) for path in (events, run_events))
    assert re.search(r'"x":\["rank 0","rank 1"\]', written["--db"][0])  # both ranks' time, read from both files
    assert written["--dataset"] == written["--db"]


def test_the_api_reads_a_dataset_as_a_store(loaded) -> None:
    from polars.testing import assert_frame_equal

    import traceq

    dataset, store, files = loaded
    on_dataset, on_store = traceq.open(dataset=dataset), traceq.open(store)
    assert repr(on_dataset) == f"<traceq.dataset {str(dataset)!r}>"
    a, b = on_dataset.trace(_name(files[0])), on_store.trace(_name(files[0]))
    for method in ("ru", "kernels", "top"):
        assert_frame_equal(getattr(a, method)(), getattr(b, method)(), check_exact=True)
    with pytest.raises(traceq.TraceqError, match="is a dataset: it is read, not changed"):
        on_dataset.remove(_name(files[0]))
    with pytest.raises(traceq.TraceqError, match="give it alone"):
        traceq.open(store, dataset=dataset)


def test_traces_lists_the_same_traces(loaded) -> None:
    dataset, store, _ = loaded
    same = ["trace_id", "name", "sha256", "source_path", "format", "gpus", "kernel_count", "span_ns"]

    def rows(*where: str) -> list[dict]:
        return [{k: r[k] for k in same} for r in json.loads(_run(["traces", *where, "-f", "json"]))]

    assert rows("--dataset", str(dataset)) == rows("--db", str(store))


def test_files_already_there_are_not_loaded_again(loaded) -> None:
    dataset, _, files = loaded
    result = runner.invoke(app, ["load", *map(str, files[:2]), "--dataset", str(dataset)])
    assert (result.exit_code, result.stdout) == (0, f"all 2 file(s) are already in {dataset}; nothing changed\n")


def test_the_catalog_says_what_is_where(loaded) -> None:
    dataset, _, files = loaded
    catalog = json.loads((dataset / "catalog.json").read_text())
    assert [(t["trace_id"], t["name"], t["status"]) for t in catalog["traces"]] == [
        (i, _name(f), "loaded") for i, f in enumerate(files, 1)]
    assert [t["source_bytes"] for t in catalog["traces"]] == [f.stat().st_size for f in files]
    assert catalog["runs"] == [  # a run's id is its first trace's
        {"run_id": 2, "name": "ddp", "trace_ids": [2, 3], "status": "loaded", "error": None},
        {"run_id": 4, "name": "dlrm", "trace_ids": list(range(4, 12)), "status": "loaded", "error": None}]
    assert sorted(p.name for p in dataset.iterdir()) == [
        ".lock", ".partial", "catalog.json", "run=2", "run=4", *sorted(f"trace={i}" for i in range(1, len(files) + 1))]
    assert sorted(p.name for p in (dataset / "run=4").iterdir()) == ["ranks.parquet", "runs.parquet"]
    assert not any((dataset / ".partial").iterdir())


def _hang_before_publishing(victim: int, marker: str) -> None:
    """Run on each worker: the victim trace's task writes its Parquet files, then waits forever
    before renaming them into place (so that the test can kill its worker there)."""
    import traceq.dataset as ds

    publish = ds._publish

    def hang(staging: Path, final: Path) -> None:
        if final.name == f"trace={victim}":
            ready = Path(marker + ".tmp")  # whole or absent: the test may read it as soon as it exists
            ready.write_text(str(os.getpid()))
            ready.rename(marker)
            time.sleep(600)
        publish(staging, final)

    hang.unhung = publish  # type: ignore[attr-defined]
    ds._publish = hang


def _publish_again() -> None:
    import traceq.dataset as ds

    ds._publish = getattr(ds._publish, "unhung", ds._publish)


def test_a_killed_worker_leaves_no_parquet_and_its_rank_is_loaded_again(client, loaded, scheduler_file: Path,
                                                                       tmp_path: Path) -> None:
    """The 8 DLRM ranks loaded as run dlrm, rank 1's worker killed mid-file: its rank is said to
    have failed, the run waits for it (the other ranks read as traces of their own), and the
    same command again loads what failed and makes the run: as the store's."""
    from traceq.api.datasets import load_dataset, plan_load
    from traceq.dataset import open_dataset, read_catalog, read_runs

    dataset = tmp_path / "ds"
    marker = tmp_path / "victim.pid"
    client.run(_hang_before_publishing, 2, str(marker))
    outcome: dict = {}
    loading = threading.Thread(target=lambda: outcome.update(done=load_dataset(client, plan_load(DLRM, dataset, "dlrm"))))
    loading.start()
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "trace 2 never reached its rename"
    partial = list((dataset / ".partial" / "trace=2").glob("*.parquet"))
    assert len(partial) > 10  # mid-file: its Parquet files are written, not yet in place
    os.kill(int(marker.read_text()), signal.SIGKILL)
    loading.join(120)
    done = outcome["done"]
    # trace 2 failed, and so may the tasks queued behind it on that worker (with no retries)
    failed = [e.trace_id for e in done.failed]
    assert 2 in failed and all("worker died" in e.error for e in done.failed)
    assert sorted(failed + [e.trace_id for e in done.loaded]) == list(range(1, 9))
    assert not list((dataset / ".partial").rglob("*"))
    assert {p.parent.name for p in dataset.rglob("*.parquet")} == {f"trace={e.trace_id}" for e in done.loaded}
    assert {e.trace_id: e.status for e in read_catalog(dataset)} == {
        t: "failed" if t in failed else "loaded" for t in range(1, 9)}
    assert [(r.name, r.status) for r in read_runs(dataset)] == [("dlrm", "pending")] == [(done.run.name, done.run.status)]
    held = open_dataset(dataset).execute("SELECT list(trace_id ORDER BY trace_id) FROM traces").fetchone()[0]
    assert held == ([e.trace_id for e in done.loaded] or None)
    result = runner.invoke(app, ["comm", "dlrm", "--dataset", str(dataset)])
    assert (result.exit_code, result.stderr) == (1, f"traceq: run 'dlrm' of {dataset} has {8 - len(failed)} of its 8 "
                                                    "files loaded: load them again (`traceq load FILE... --run NAME "
                                                    "--dataset PATH`) to complete it\n")

    # the workers now publish as usual (the killed one was restarted without the hang)
    client.run(_publish_again)
    result = runner.invoke(app, ["load", *map(str, DLRM), "--run", "dlrm", "--dataset", str(dataset),
                                 "--scheduler", str(scheduler_file)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith(f"loaded {len(failed)} trace(s) into {dataset} (")
    assert f"; {8 - len(failed)} already there) on 2 Dask worker(s)" in result.stdout
    assert result.stdout.splitlines()[-1] == (f"run 'dlrm': 8 ranks; clocks aligned on collectives, largest shift "
                                              f"1.500 µs (`traceq ranks dlrm --dataset {dataset}`)")
    _, store, _ = loaded
    for command in (["comm"], ["ranks"]):
        assert _run([*command, "dlrm", "--dataset", str(dataset), "-f", "json"]) == \
            _run([*command, "dlrm", "--db", str(store), "-f", "json"])


def test_files_that_are_not_one_job_s_ranks_make_no_run(scheduler_file: Path, tmp_path: Path) -> None:
    """3 of the 8 DLRM ranks: each is loaded and reads as a trace of its own; the run is refused
    with the reason a store's `load --run` gives (and the store refuses all three files)."""
    if not DLRM:
        pytest.skip("../shared is absent: the DLRM ranks are there")
    files = [str(f) for f in DLRM[:3]]
    result = runner.invoke(app, ["load", *files, "--run", "part", "--dataset", str(tmp_path / "ds"),
                                 "--scheduler", str(scheduler_file)])
    on_store = runner.invoke(app, ["load", *files, "--run", "part", "--db", str(tmp_path / "s.duckdb")])
    assert (result.exit_code, on_store.exit_code) == (1, 1)
    why = on_store.stderr.removeprefix("traceq: ")
    assert why.startswith("ranks 3, 4, 5, 6, 7 of 8 missing")
    assert result.stderr == f"traceq: run 'part' not made (each file stays a trace of its own): {why}"
    assert [r["run"] for r in json.loads(_run(["traces", "--dataset", str(tmp_path / "ds"), "-f", "json"]))] == \
        [_name(Path(f)) for f in files]


def test_a_load_runs_on_the_cluster_a_scheduler_file_names(scheduler_file: Path, tmp_path: Path) -> None:
    """`--scheduler FILE`: the workers of a running cluster (here the module's), as on a real one."""
    if not DLRM:
        pytest.skip("../shared is absent: the DLRM ranks are there")
    result = runner.invoke(app, ["load", str(DLRM[0]), "--dataset", str(tmp_path / "ds"),
                                 "--scheduler", str(scheduler_file)])
    assert result.exit_code == 0, result.output
    assert re.fullmatch(rf"loaded 1 trace\(s\) into {tmp_path / 'ds'} \([0-9,]+ kernels\) on 2 Dask worker\(s\) "
                        r"in [0-9.]+ s\n", result.stdout), result.stdout


def test_a_damaged_file_s_repairs_are_said_and_kept_in_the_catalog(scheduler_file: Path, tmp_path: Path) -> None:
    """What `traceq load` says of a damaged file (tests/test_damaged.py: 13 kernels of 260 made
    to end before they start), a dataset load says too."""
    import shutil
    import sqlite3

    path = tmp_path / "lenet.sqlite"
    shutil.copy(sample("lenet_b256_cudnn.sqlite"), path)
    with sqlite3.connect(path) as con:
        con.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 1 WHERE rowid % 20 = 3')
    result = runner.invoke(app, ["load", str(path), "--dataset", str(tmp_path / "ds"), "--scheduler", str(scheduler_file)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1] == f"'lenet' (trace 1) from {path}: 13 kernels with end < start dropped"
    assert json.loads((tmp_path / "ds" / "catalog.json").read_text())["traces"][0]["notes"] == [
        "13 kernels with end < start dropped"]


def test_a_bad_file_is_refused_before_a_cluster_starts(tmp_path: Path) -> None:
    bad = tmp_path / "notes.json"
    bad.write_text("{}")
    result = runner.invoke(app, ["load", str(bad), "--dataset", str(tmp_path / "ds"), "--workers", "1"])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"traceq: {bad}")
    assert not (tmp_path / "ds").exists()


def test_without_dask_the_load_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed raises ImportError
    result = runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--dataset", str(tmp_path / "ds")])
    assert result.exit_code == 1
    assert result.stderr == ("traceq: loading into a dataset runs on Dask, which is not installed here: "
                             "pip install 'traceq-gpu[dask]'\n")


def test_dataset_options_are_checked(tmp_path: Path) -> None:
    result = runner.invoke(app, ["top", "--dataset", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr == (f"traceq: no dataset at {tmp_path} (no catalog.json): make one with "
                             "`traceq load FILE... --dataset PATH`\n")
    result = runner.invoke(app, ["top", "--dataset", str(tmp_path), "--db", str(tmp_path / "s.duckdb")])
    assert result.exit_code == 2 and "give --db or --dataset, not both" in result.output
    lenet = str(sample("lenet_b256_cudnn.sqlite"))
    result = runner.invoke(app, ["load", lenet, "--workers", "2"])
    assert result.exit_code == 2 and "add --dataset PATH" in result.output
    result = runner.invoke(app, ["load", lenet, "--dataset", str(tmp_path / "ds"), "--name", "x"])
    assert result.exit_code == 2 and "--name is for the store" in result.output


@pytest.mark.parametrize("name", ["dlrm", "ddp"])
def test_runs_are_made_from_the_summaries_the_workers_wrote(loaded, name: str) -> None:
    """Each rank's task wrote what the run needs of it beside its tables; the coordinator made the
    run from those alone, and it equals the run made by reading every rank's tables (the store's
    `load --run`, compared row by row above; here the dataset's own tables read again): the 8
    DLRM Kineto ranks, and the 2-GPU DDP recording's two nsys files."""
    from traceq.analysis.multigpu.runs import register_run
    from traceq.api.datasets import SUMMARY_FILES, _registrar
    from traceq.dataset import open_dataset, read_runs, trace_dir

    dataset = loaded[0]
    run = next(r for r in read_runs(dataset) if r.name == name)
    for t in run.trace_ids:
        assert all((trace_dir(dataset, t) / f).is_file() for f in SUMMARY_FILES)
    assert _registrar(dataset, run.trace_ids) is not register_run
    by_tables, by_summaries = open_dataset(dataset, []), open_dataset(dataset, [])
    register_run(by_tables, "x", run.trace_ids)
    _registrar(dataset, run.trace_ids)(by_summaries, "x", run.trace_ids)
    rows = "SELECT * EXCLUDE (run_id) FROM ranks ORDER BY rank"
    assert by_summaries.execute(rows).fetchall() == by_tables.execute(rows).fetchall()
    made = by_tables.execute(rows).fetchall()
    assert len(made) == len(RUNS[name])
    assert any(row[5] != 0 for row in made[1:])  # clocks shifted: a fit that the comparison covers


def test_a_load_on_separate_scheduler_and_worker_processes_equals_the_local_cluster(loaded, tmp_path: Path) -> None:
    """A real cluster: `dask scheduler` and two `dask worker` processes started here, the DLRM
    ranks loaded on it as run dlrm; every table equals the module's dataset (local cluster)."""
    import shutil
    import subprocess

    dask = shutil.which("dask", path=str(Path(sys.executable).parent))
    if dask is None:
        pytest.skip("the dask command is not installed beside this Python")
    file = tmp_path / "scheduler.json"
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    procs = [subprocess.Popen([dask, "scheduler", "--scheduler-file", str(file), "--port", "0",
                               "--dashboard-address", ":0", "--no-show"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while not file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        for _ in range(2):
            procs.append(subprocess.Popen([dask, "worker", "--scheduler-file", str(file), "--nthreads", "1",
                                           "--nworkers", "1", "--no-dashboard"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        ours = tmp_path / "ds"
        result = runner.invoke(app, ["load", *map(str, DLRM), "--run", "dlrm", "--dataset", str(ours),
                                     "--scheduler", str(file)])
        assert result.exit_code == 0, result.output
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    from traceq.dataset import open_dataset

    theirs = open_dataset(loaded[0])
    mine = open_dataset(ours)
    ids = {n: t for t, n in theirs.execute("SELECT trace_id, name FROM traces").fetchall()}
    mapping = {t: ids[n] for t, n in mine.execute("SELECT trace_id, name FROM traces").fetchall()}
    assert set(mapping) and len(mapping) == 8
    for table in ("kernel_events", "api_events", "nvtx_events", "collectives"):
        for mine_id, their_id in mapping.items():
            # (`trace`: the folder's hive partition, trace=<id>, which differs as the ids do)
            q = f"SELECT * EXCLUDE (trace_id, trace) FROM {table} WHERE trace_id = ? ORDER BY ALL"
            assert mine.execute(q, [mine_id]).fetchall() == theirs.execute(q, [their_id]).fetchall(), table
    q = ("SELECT k.rank, t.name, k.shift_ns, k.drift_ppm FROM ranks k JOIN runs r USING (run_id) "
         "JOIN traces t USING (trace_id) WHERE r.name = 'dlrm' ORDER BY k.rank")
    assert mine.execute(q).fetchall() == theirs.execute(q).fetchall()


def test_comm_overlap_and_ranks_fan_out_over_worker_processes(loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-trace part of comm, overlap and ranks in 2 spawned processes (the pool a run of
    many ranks gets; lowered here to the 8 DLRM ranks) prints what one process prints (`ranks`
    runs all three per-trace parts)."""
    from traceq.analysis.multigpu import fanout

    dataset = str(loaded[0])
    # ranks reads overlap's and comm's per-trace parts; --by collective the late collectives' windows
    commands = [["ranks", "dlrm"], ["ranks", "dlrm", "--by", "collective"]]
    monkeypatch.setenv("TRACEQ_WORKERS", "1")
    alone = [_run([*c, "--dataset", dataset]) for c in commands]
    monkeypatch.setenv("TRACEQ_WORKERS", "2")
    monkeypatch.setattr(fanout, "MIN_TRACES", 2)
    calls: list[int] = []
    import concurrent.futures

    original = concurrent.futures.ProcessPoolExecutor

    class Counting(original):  # type: ignore[misc, valid-type]
        def __init__(self, *a, **k):
            calls.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Counting)
    fanned = [_run([*c, "--dataset", dataset]) for c in commands]
    assert fanned == alone
    assert len(calls) >= len(commands)


def test_a_load_into_a_dataset_another_load_is_writing_is_one_line(tmp_path: Path) -> None:
    """While a load holds the dataset's lock, a second is refused in one line before any cluster
    starts (no Dask warning around it)."""
    import fcntl

    dataset = tmp_path / "ds"
    dataset.mkdir()
    with (dataset / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--dataset", str(dataset),
                                     "--workers", "1"])
    assert result.exit_code == 1
    assert result.stderr == f"traceq: {dataset} is being written by another traceq load; try again when it finishes\n"


def test_a_worker_s_store_is_emptied_after_each_file_even_a_failed_one(tmp_path: Path) -> None:
    """A worker keeps one store for all its files (`worker_store`): after a file that fails to
    load and one that loads, it holds no row and its ids start at 1 again, and the file loaded
    after the failure is written whole, under its dataset id. In this process, no cluster."""
    import duckdb

    from traceq.api.datasets import load_rank, worker_store
    from traceq.errors import TraceFormatError

    bad = tmp_path / "cut.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur"')
    with pytest.raises(TraceFormatError):
        load_rank(str(bad), 7, "cut", str(tmp_path / "ds"))
    good = sample("lenet_b256_cudnn.sqlite")
    entry = load_rank(str(good), 9, "lenet", str(tmp_path / "ds"))
    assert (entry.trace_id, entry.status, entry.name) == (9, "loaded", "lenet")
    con = worker_store()
    tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE table_name != 'traceq_meta'"
                                        ).fetchall()]
    assert len(tables) > 20 and all(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] == 0 for t in tables)
    assert con.execute("SELECT nextval('trace_ids'), nextval('run_ids')").fetchone() == (1, 1)
    con.execute("DROP SEQUENCE trace_ids; CREATE SEQUENCE trace_ids START 1; DROP SEQUENCE run_ids; "
                "CREATE SEQUENCE run_ids START 1")  # as the next task would find them
    folder = tmp_path / "ds" / "trace=9"
    assert not (tmp_path / "ds" / "trace=7").exists()
    kernels = duckdb.sql(f"SELECT DISTINCT trace_id FROM read_parquet('{folder}/kernel_events.parquet')").fetchall()
    assert kernels == [(9,)]
    import sqlite3

    with sqlite3.connect(f"file:{good}?mode=ro", uri=True) as export:  # its kernels, counted independently
        assert entry.kernels == export.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
