"""Many rank files loaded into a dataset on Dask: wall and CPU time, peak RSS per worker, the
speed-up of N workers over one process, and `traceq top` on the result (run on demand).

    python bench/dataset_scale.py [--ranks 256] [--batch 32] [--compare 4] [--kernels N] [--workers 2]
                                  [-o /tmp/traceq-bench/ranks] [--run-only]

Making (once; files already there are kept): OUT/files/rank<i>.json[.gz] is rank i mod 8 of the
DLRM set (../shared/realtraces/kineto_json, 8 real Kineto rank files of about 250 kernels), as
it is, or with --kernels N grown to N kernels by bench/kineto_scale.py (its events repeated,
shifted in time, ids offset).

Measuring, in one run: the ranks are loaded into OUT/dask a batch at a time (`--batch` files)
on one local cluster of N Dask workers (`traceq load --dataset --workers N`'s code), and in
each of the first `--compare` rounds the same batch is loaded, just before, by one process
(`traceq.ingest.parallel.load_rank` on each file in turn, what a Dask task does, without Dask)
into a scratch dataset. Each round's two wall times are taken seconds apart, so their ratio is
the speed-up under the same load from other processes; the median of the rounds' ratios is the
figure. CPU seconds (this process's; the workers' from psutil) do not depend on that load.
Then: each worker's peak RSS (ru_maxrss), and `traceq top --dataset` on the whole dataset, each
in a child process: wall and CPU, median of 3. The machine may be shared: compare the ratios of
one run, and CPU seconds, not wall times of different runs. Each wall time is printed with the
cores it used (CPU s / wall s): on a busy Linux machine with autogroup scheduling (the default)
a session's processes share one session's part of the CPUs, so N local workers get no more
CPU than one process would while other sessions keep the cores busy; the CPU seconds per file
then say what N free cores would give (N x one process's / a worker's).

Last (alone with --run-only, on the dataset a previous run left): the N traces made the ranks of
one run, as `traceq load --run --dataset` makes it once its files are in, in a copy of the
dataset (OUT/run) where trace i's traces file says rank i - 1 of N (the files are copies of 8
ranks, whose collectives match rank 0's); wall, CPU and peak RSS of making it, and of
`traceq ranks` and `traceq comm` on the run, each in a child process.
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

                grow(src, kernels, path)
            else:
                shutil.copyfile(src, path)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32, help="files per round")
    parser.add_argument("--compare", type=int, default=4, help="rounds that also load in one process")
    parser.add_argument("--kernels", type=int, help="grow each rank file to this many kernels")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-o", "--output", type=Path, default=Path("/tmp/traceq-bench/ranks"))
    parser.add_argument("--run-only", action="store_true", help="only make OUT/dask's traces one run, and read it")
    args = parser.parse_args()
    if args.run_only:
        run_of_all(args.output / "dask", args.output / "run")
        return
    files = make(args.output / "files", args.ranks, args.kernels)
    size = sum(f.stat().st_size for f in files)
    print(f"{len(files)} rank files, {size / 1e6:.1f} MB, on {os.cpu_count()} cores "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    run = rounds(files, args.output, args.workers, args.batch, args.compare)
    compared = [r for r in run["rounds"] if "one_s" in r]
    ratios = [r["one_s"] / r["dask_s"] for r in compared]
    one_cpu = sum(r["one_cpu_s"] for r in compared) / sum(min(args.batch, len(files) - i * args.batch)
                                                       for i in range(len(compared)))
    dask_cpu = sum(r["dask_cpu_s"] for r in compared) / sum(min(args.batch, len(files) - i * args.batch)
                                                         for i in range(len(compared)))
    dask_s = sum(r["dask_s"] for r in run["rounds"])
    print(f"speed-up of {args.workers} workers over one process, per round: "
          f"{', '.join(f'{x:.2f}' for x in ratios)}; median {statistics.median(ratios):.2f}x")
    print(f"CPU s per file (compared rounds): {one_cpu:.3f} in one process, {dask_cpu:.3f} on the workers; "
          f"on {args.workers} free cores that is {args.workers * one_cpu / dask_cpu:.2f}x (workers x the ratio)")
    print(f"all {len(files)} files on {args.workers} workers: {dask_s:.1f} s wall in {len(run['rounds'])} rounds, "
          f"{run['cpu_s']:.1f} CPU s of the workers (cluster start {run['start_s']:.1f} s); "
          f"peak RSS per worker {', '.join(f'{r:.0f}' for r in run['rss_mib'])} MiB")
    dataset = args.output / "dask"
    parquet = list(dataset.rglob("*.parquet"))
    print(f"dataset: {sum(p.stat().st_size for p in parquet) / 1e6:.1f} MB of Parquet in {len(parquet)} files")
    wall, cpu = top(dataset)
    print(f"traceq top --dataset ({len(files)} ranks): {wall:.2f} s wall, {cpu:.2f} CPU s (median of 3)")
    run_of_all(dataset, args.output / "run")
    print(f"load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
