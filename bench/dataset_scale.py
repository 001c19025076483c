"""Many rank files loaded into a dataset on Dask: wall and CPU time, peak RSS per worker, the
speed-up of N workers over one process, the run made of them, and commands on it (run on demand).

    python bench/dataset_scale.py [--ranks 256] [--workers 2[,4,...]] [--batch 32] [--compare 4]
                                  [--kernels N] [-o /tmp/traceq-bench/ranks] [--run-only]
    python bench/dataset_scale.py --ranks 32 --per-file [--before OLD] [--workers 2]

Making (once; files already there are kept): OUT/files<R>/rank<i>.json[.gz] is rank i mod 8 of
the DLRM set (../shared/realtraces/kineto_json, 8 real Kineto rank files of about 250 kernels)
with its distributedInfo saying rank i of R (the copies' collectives match rank 0's, so the R
files are one job's ranks), as it is, or with --kernels N grown to N kernels by
bench/kineto_scale.py (its events repeated, shifted in time, ids offset).

Measuring, for each worker count N of --workers (a local cluster of N Dask workers each):
- with --compare > 0, rounds: the ranks are loaded into OUT/dask a batch at a time (`--batch`
  files), and in each of the first `--compare` rounds the same batch is loaded, just before, by
  one process (`load_rank` on each file in turn, what a Dask task does, without Dask) into a
  scratch dataset. Each round's two wall times are taken seconds apart, so their ratio is the
  speed-up under the same load from other processes; the median of the rounds' ratios is the
  figure. CPU seconds (this process's; the workers' from psutil) do not depend on that load.
  Then each worker's peak RSS (ru_maxrss).
- end to end: all R files loaded as one run (`traceq load FILE... --run big --dataset`'s code)
  into a new dataset OUT/run<N>: the load's wall time, and within it making the run (the
  coordinator's work once every rank is in: its wall and CPU seconds, and its share of the
  load's wall time), the workers' CPU seconds per file.
Then on the last run: `traceq top --dataset` (median of 3), and `traceq ranks`, `comm` and
`overlap` on the run, each in a child process. The machine may be shared: compare the ratios of
one run, and CPU seconds, not wall times of different runs. Each wall time is printed with the
cores it used (CPU s / wall s): on a busy Linux machine with autogroup scheduling (the default)
a session's processes share one session's part of the CPUs, so N local workers get no more
CPU than one process would while other sessions keep the cores busy.

--per-file: the CPU seconds a worker spends per rank file, once warm (its first files loaded
before the count starts): the R files loaded on N local workers, the workers' CPU seconds (user
+ system, psutil) over R. With --before OLD (a folder holding an older traceq as OLD/traceq,
e.g. `git archive main | tar -x -C OLD/traceq`), that traceq and this one measured in turn, three
times each, in child processes (the workers inherit PYTHONPATH): the medians and their ratio.

--run-only: on the dataset a previous run left in OUT/dask, its traces made one run of R ranks
(as `load --run --dataset` makes it once its files are in) in a copy (OUT/run), and read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT.parent / "shared" / "realtraces" / "kineto_json"


def make(out: Path, ranks: int, kernels: int | None) -> list[Path]:
    """R rank files (see the module's docstring), in `out`."""
    import gzip
    import re

    sources = sorted(DLRM.glob("facebookresearch__param__dlrm_kineto__worker*"))
    if not sources:
        sys.exit(f"no DLRM rank files in {DLRM}")
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(ranks):
        src = sources[i % len(sources)]
        path = out / (f"rank{i:04d}.json" if kernels else f"rank{i:04d}.json.gz")
        if not path.exists():
            if kernels:
                sys.path.insert(0, str(ROOT / "bench"))
                from kineto_scale import make as grow

                grow(src, kernels, out / "grown.json")
                text = (out / "grown.json").read_bytes()
            else:
                text = gzip.decompress(src.read_bytes())
            said = f'"distributedInfo": {{"backend": "nccl", "rank": {i}, "world_size": {ranks}}}'.encode()
            text, n = re.subn(rb'"distributedInfo": \{[^}]*\}', lambda _, said=said: said, text, count=1)
            assert n == 1, src
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(text if kernels else gzip.compress(text, 6))
            os.replace(tmp, path)
        files.append(path)
    return files


def one_process(files: list[Path], dataset: Path, first_id: int) -> tuple[float, float]:
    """(wall s, CPU s) of loading `files` one after the other in this process."""
    from traceq.api.datasets import load_rank
    from traceq.ingest import default_name

    dataset.mkdir(parents=True, exist_ok=True)
    wall, cpu = time.perf_counter(), time.process_time()
    for i, f in enumerate(files, first_id):
        load_rank(str(f), i, default_name(f), str(dataset))
    return time.perf_counter() - wall, time.process_time() - cpu


def _cpu_s() -> float:
    import psutil

    t = psutil.Process().cpu_times()
    return t.user + t.system


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rounds(files: list[Path], out: Path, workers: int, batch: int, compare: int) -> dict[str, object]:
    """Load `files` into OUT/dask `batch` at a time on `workers` local Dask workers; in the
    first `compare` rounds, load the same batch in this process first (into OUT/one)."""
    from traceq.api.datasets import dask_client, load_dataset, plan_load

    for folder in ("dask", "one"):
        shutil.rmtree(out / folder, ignore_errors=True)
    started = time.perf_counter()
    measured: list[dict[str, float]] = []
    with dask_client(workers=workers) as client:
        up = time.perf_counter() - started
        one_process(files[:1], out / "one", 1)  # warm up: imports and caches, here and on the workers
        load_dataset(client, plan_load(files[:workers], out / "one"))
        shutil.rmtree(out / "one")
        cpu_before = sum(client.run(_cpu_s).values())
        for first in range(0, len(files), batch):
            part = files[first:first + batch]
            row = {"load": os.getloadavg()[0]}
            if len(measured) < compare:
                row["one_s"], row["one_cpu_s"] = one_process(part, out / "one", first + 1)
            cpu = sum(client.run(_cpu_s).values())
            done = load_dataset(client, plan_load(files[:first + batch], out / "dask"))
            assert not done.failed, done.failed
            row["dask_s"], row["dask_cpu_s"] = done.seconds, sum(client.run(_cpu_s).values()) - cpu
            measured.append(row)
            print("  round {:2d}: {:3d} files, load average {:4.1f}: ".format(len(measured), len(part), row["load"])
                  + (f"one process {_said(row['one_s'], row['one_cpu_s'])}, " if "one_s" in row else "")
                  + f"{workers} workers {_said(row['dask_s'], row['dask_cpu_s'])}"
                  + (f": {row['one_s'] / row['dask_s']:.2f}x" if "one_s" in row else ""), flush=True)
        cpu = sum(client.run(_cpu_s).values()) - cpu_before
        rss = sorted(client.run(_peak_rss_mib).values())
    return {"start_s": up, "rounds": measured, "cpu_s": cpu, "rss_mib": rss}


def _said(wall: float, cpu: float) -> str:
    """Wall and CPU seconds, and the cores they used (CPU s / wall s)."""
    return f"{wall:6.1f} s ({cpu:5.1f} CPU s, {cpu / wall:.2f} cores)"


def top(dataset: Path, command: list[str] | None = None, repeat: int = 3) -> tuple[float, float]:
    """Median (wall s, CPU s) of `traceq top --dataset` (or another command) in a child process."""
    runs = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "traceq", *(command or ["top"]), "--dataset", str(dataset)], check=True,
                       stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append((time.perf_counter() - started,
                     after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime))
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


RUN = """
import resource, sys, time
from pathlib import Path
from traceq.dataset import RunEntry, read_catalog, read_runs, write_catalog, write_run
from traceq.api.datasets import _registrar
dataset = Path(sys.argv[1])
ids = [e.trace_id for e in read_catalog(dataset)]
run = RunEntry(min(ids), "big", ids, "loaded")
wall, cpu = time.perf_counter(), time.process_time()
write_run(dataset, run, _registrar(dataset, ids))  # from the ranks' summaries, as `load --run --dataset`
print(time.perf_counter() - wall, time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
write_catalog(dataset, read_catalog(dataset), [run])
"""


def run_of_all(dataset: Path, out: Path) -> None:
    """The dataset's traces made one run (see the module's docstring), and read."""
    import duckdb

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(dataset, out)
    folders = sorted(out.glob("trace=*"), key=lambda p: int(p.name.split("=")[1]))
    for folder in folders:
        traces = folder / "traces.parquet"
        duckdb.execute(f"COPY (SELECT * REPLACE ({int(folder.name.split('=')[1]) - 1} AS rank, {len(folders)} AS "
                       f"world_size) FROM read_parquet('{traces}')) TO '{traces}.new' (FORMAT parquet)")
        os.replace(f"{traces}.new", traces)
        summary = folder / "run_summary.json"  # what the rank's worker wrote for making the run
        if summary.exists():
            data = json.loads(summary.read_text())
            data["trace"].update(rank=int(folder.name.split("=")[1]) - 1, world_size=len(folders))
            for unit in data["units"]:
                unit["rank"] = data["trace"]["rank"]
            summary.write_text(json.dumps(data))
    done = subprocess.run([sys.executable, "-c", RUN, str(out)], check=True, capture_output=True, text=True)
    wall, cpu, rss = map(float, done.stdout.split())
    print(f"run of {len(folders)} ranks made: {wall:.1f} s wall, {cpu:.1f} CPU s, peak RSS {rss:.0f} MiB", flush=True)
    for command in ("ranks", "comm"):
        wall, cpu = top(out, [command, "big"], repeat=1)
        print(f"traceq {command} big --dataset ({len(folders)} ranks): {wall:.1f} s wall, {cpu:.1f} CPU s", flush=True)


def end_to_end(files: list[Path], dataset: Path, workers: int) -> dict[str, float]:
    """`files` loaded as run 'big' into a new `dataset` on `workers` local Dask workers: the
    load's wall seconds (the cluster started before), making the run's wall and CPU seconds
    (reading the ranks' summaries and registering the run, timed inside the load), and the
    workers' CPU seconds."""
    from traceq.api import datasets
    from traceq.api.datasets import dask_client, load_dataset, plan_load

    made = {"run_s": 0.0, "run_cpu_s": 0.0}

    def timed(f):  # the coordinator's steps that make the run
        def call(*a, **k):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return f(*a, **k)
            finally:
                made["run_s"] += time.perf_counter() - wall
                made["run_cpu_s"] += time.process_time() - cpu
        return call

    shutil.rmtree(dataset, ignore_errors=True)
    with dask_client(workers=workers) as client:
        warm = dataset.with_name(dataset.name + "-warm")  # imports and each worker's store made
        shutil.rmtree(warm, ignore_errors=True)
        load_dataset(client, plan_load(files[:workers], warm))
        shutil.rmtree(warm)
        cpu = sum(client.run(_cpu_s).values())
        saved = datasets._registrar, datasets.write_run
        datasets._registrar, datasets.write_run = timed(saved[0]), timed(saved[1])
        try:
            done = load_dataset(client, plan_load(files, dataset, "big"))
        finally:
            datasets._registrar, datasets.write_run = saved
        cpu = sum(client.run(_cpu_s).values()) - cpu
    assert not done.failed and done.run.status == "loaded", (done.failed, done.run)
    return {"load_s": done.seconds, "workers_cpu_s": cpu, **made}


def per_file(files: list[Path], workers: int) -> float:
    """CPU seconds of the workers per file, once warm (see the module's docstring)."""
    import tempfile

    from traceq.api.datasets import dask_client, load_dataset, plan_load

    with tempfile.TemporaryDirectory(prefix="traceq-bench-") as tmp, dask_client(workers=workers) as client:
        load_dataset(client, plan_load(files[:2 * workers], Path(tmp) / "warm"))
        cpu = sum(client.run(_cpu_s).values())
        done = load_dataset(client, plan_load(files, Path(tmp) / "ds"))
        assert not done.failed, done.failed
        return (sum(client.run(_cpu_s).values()) - cpu) / len(files)


def before_after(args: argparse.Namespace, workers: int) -> None:
    """--per-file for the traceq in --before and this one, in turn, three times each."""
    measured: dict[str, list[float]] = {"before": [], "now": []}
    for _ in range(3):
        for which, path in (("before", str(args.before.resolve())), ("now", None)):
            env = dict(os.environ)
            if path:
                env["PYTHONPATH"] = path
            done = subprocess.run([sys.executable, __file__, "--per-file", "--ranks", str(args.ranks), "--workers",
                                   str(workers), "-o", str(args.output)], env=env, check=True, capture_output=True,
                                  text=True, cwd=tempfile_dir())
            measured[which].append(float(done.stdout.split()[-1]))
            print(f"  {which:6s} {measured[which][-1]:.3f} CPU s a file (load average {os.getloadavg()[0]:.1f})",
                  flush=True)
    before, now = (statistics.median(measured[k]) for k in ("before", "now"))
    print(f"CPU s per rank file on {workers} workers, median of 3: before {before:.3f}, now {now:.3f} "
          f"({now / before:.2f}x)")


def tempfile_dir() -> str:
    """A folder outside the checkout to run children in (a child's `import traceq` must find the
    PYTHONPATH one or the installed one, not this folder's parent by accident)."""
    import tempfile

    return tempfile.gettempdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32, help="files per round")
    parser.add_argument("--compare", type=int, default=4, help="rounds that also load in one process (0: none)")
    parser.add_argument("--kernels", type=int, help="grow each rank file to this many kernels")
    parser.add_argument("--workers", default="2", help="worker counts, e.g. 8,16,32")
    parser.add_argument("-o", "--output", type=Path, default=Path("/tmp/traceq-bench/ranks"))
    parser.add_argument("--run-only", action="store_true", help="only make OUT/dask's traces one run, and read it")
    parser.add_argument("--per-file", action="store_true", help="only the workers' CPU seconds per file")
    parser.add_argument("--before", type=Path, help="with --per-file: a folder holding an older traceq (OLD/traceq)")
    args = parser.parse_args()
    counts = [int(n) for n in str(args.workers).split(",")]
    if args.run_only:
        run_of_all(args.output / "dask", args.output / "run")
        return
    files = make(args.output / f"files{args.ranks}", args.ranks, args.kernels)
    if args.per_file:
        if args.before is None:
            print(f"{per_file(files, counts[0]):.4f}")
        else:
            before_after(args, counts[0])
        return
    size = sum(f.stat().st_size for f in files)
    print(f"{len(files)} rank files, {size / 1e6:.1f} MB, on {os.cpu_count()} cores "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    for workers in counts:
        if args.compare:
            compare_rounds(args, files, workers)
        e2e = end_to_end(files, args.output / f"run{workers}", workers)
        print(f"{len(files)} files as one run on {workers} workers: {e2e['load_s']:.1f} s wall; making the run "
              f"{e2e['run_s']:.2f} s ({e2e['run_cpu_s']:.2f} CPU s), {100 * e2e['run_s'] / e2e['load_s']:.1f} % of the "
              f"load's wall; {e2e['workers_cpu_s'] / len(files):.3f} CPU s a file on the workers "
              f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    dataset = args.output / f"run{counts[-1]}"
    parquet = list(dataset.rglob("*.parquet"))
    print(f"dataset: {sum(p.stat().st_size for p in parquet) / 1e6:.1f} MB of Parquet in {len(parquet)} files")
    wall, cpu = top(dataset)
    print(f"traceq top --dataset ({len(files)} ranks): {wall:.2f} s wall, {cpu:.2f} CPU s (median of 3)")
    for command in ("ranks", "comm", "overlap"):
        wall, cpu = top(dataset, [command, "big"], repeat=1)
        print(f"traceq {command} big --dataset ({len(files)} ranks): {wall:.1f} s wall, {cpu:.1f} CPU s", flush=True)
    print(f"load average now {os.getloadavg()[0]:.1f}")


def compare_rounds(args: argparse.Namespace, files: list[Path], workers: int) -> None:
    """The rounds (see the module's docstring), and what they say."""
    run = rounds(files, args.output, workers, args.batch, args.compare)
    compared = [r for r in run["rounds"] if "one_s" in r]
    ratios = [r["one_s"] / r["dask_s"] for r in compared]
    counted = sum(min(args.batch, len(files) - i * args.batch) for i in range(len(compared)))
    one_cpu = sum(r["one_cpu_s"] for r in compared) / counted
    dask_cpu = sum(r["dask_cpu_s"] for r in compared) / counted
    dask_s = sum(r["dask_s"] for r in run["rounds"])
    print(f"speed-up of {workers} workers over one process, per round: "
          f"{', '.join(f'{x:.2f}' for x in ratios)}; median {statistics.median(ratios):.2f}x")
    print(f"CPU s per file (compared rounds): {one_cpu:.3f} in one process, {dask_cpu:.3f} on the workers; "
          f"on {workers} free cores that is {workers * one_cpu / dask_cpu:.2f}x (workers x the ratio)")
    print(f"all {len(files)} files on {workers} workers: {dask_s:.1f} s wall in {len(run['rounds'])} rounds, "
          f"{run['cpu_s']:.1f} CPU s of the workers (cluster start {run['start_s']:.1f} s); "
          f"peak RSS per worker {', '.join(f'{r:.0f}' for r in run['rss_mib'])} MiB", flush=True)


if __name__ == "__main__":
    main()
