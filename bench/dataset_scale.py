"""Many rank files loaded into a dataset on Dask: wall and CPU time, peak RSS per worker, the
speed-up of N workers over one process, and `traceq top` on the result (run on demand).

    python bench/dataset_scale.py [--ranks 256] [--kernels N] [--workers 2] [-o /tmp/traceq-bench/ranks]

Making (once; files already there are kept): OUT/files/rank<i>.json[.gz] is rank i mod 8 of the
DLRM set (../shared/realtraces/kineto_json, 8 real Kineto rank files of about 250 kernels), as
it is, or with --kernels N grown to N kernels by bench/kineto_scale.py (its events repeated,
shifted in time, ids offset).

Measuring, in one run, on the same files, one after the other:
- one process: `traceq.ingest.parallel.load_rank` on each file in turn in this process (what a
  Dask task does, without Dask), wall and CPU seconds;
- N local Dask workers (`traceq load --dataset --workers N`'s code): the cluster's start, the
  load's wall time, the workers' CPU seconds (psutil) and each worker's peak RSS (ru_maxrss);
- `traceq top --dataset` on the result, each in a child process: wall and CPU, median of 3.
The machine may be shared: compare the ratios of one run, and CPU seconds, not wall times of
different runs.
"""

from __future__ import annotations

import argparse
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


def one_process(files: list[Path], dataset: Path) -> tuple[float, float]:
    """(wall s, CPU s) of loading `files` one after the other in this process."""
    from traceq.dataset import write_catalog
    from traceq.ingest import default_name
    from traceq.ingest.parallel import load_rank

    shutil.rmtree(dataset, ignore_errors=True)
    dataset.mkdir(parents=True)
    wall, cpu = time.perf_counter(), time.process_time()
    entries = [load_rank(str(f), i, default_name(f), str(dataset)) for i, f in enumerate(files, 1)]
    write_catalog(dataset, entries)
    return time.perf_counter() - wall, time.process_time() - cpu


def _cpu_s() -> float:
    import psutil

    t = psutil.Process().cpu_times()
    return t.user + t.system


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def on_dask(files: list[Path], dataset: Path, workers: int) -> dict[str, object]:
    from traceq.ingest.parallel import dask_client, load_dataset, plan_load

    shutil.rmtree(dataset, ignore_errors=True)
    started = time.perf_counter()
    with dask_client(workers=workers) as client:
        up = time.perf_counter() - started
        cpu_before = client.run(_cpu_s)
        plan = plan_load(files, dataset)
        done = load_dataset(client, plan)
        cpu = sum(client.run(_cpu_s).values()) - sum(cpu_before.values())
        rss = sorted(client.run(_peak_rss_mib).values())
    assert not done.failed, done.failed
    return {"start_s": up, "wall_s": done.seconds, "cpu_s": cpu, "rss_mib": rss}


def top(dataset: Path, repeat: int = 3) -> tuple[float, float]:
    """Median (wall s, CPU s) of `traceq top --dataset` in a child process."""
    runs = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "traceq", "top", "--dataset", str(dataset)], check=True,
                       stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append((time.perf_counter() - started,
                     after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime))
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--kernels", type=int, help="grow each rank file to this many kernels")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-o", "--output", type=Path, default=Path("/tmp/traceq-bench/ranks"))
    args = parser.parse_args()
    files = make(args.output / "files", args.ranks, args.kernels)
    size = sum(f.stat().st_size for f in files)
    print(f"{len(files)} rank files, {size / 1e6:.1f} MB, on {os.cpu_count()} cores "
          f"(load average {os.getloadavg()[0]:.1f})")
    serial = one_process(files, args.output / "one")
    print(f"one process:  {serial[0]:7.1f} s wall, {serial[1]:7.1f} CPU s")
    dask = on_dask(files, args.output / "dask", args.workers)
    rss = ", ".join(f"{r:.0f}" for r in dask["rss_mib"])
    print(f"{args.workers} Dask workers: {dask['wall_s']:7.1f} s wall, {dask['cpu_s']:7.1f} CPU s of the workers "
          f"(cluster start {dask['start_s']:.1f} s); peak RSS per worker {rss} MiB")
    print(f"speed-up: {serial[0] / dask['wall_s']:.2f}x wall; CPU s per rank {serial[1] / len(files):.3f} "
          f"in one process, {dask['cpu_s'] / len(files):.3f} on the workers")
    parquet = sum(p.stat().st_size for p in (args.output / "dask").rglob("*.parquet"))
    print(f"dataset: {parquet / 1e6:.1f} MB of Parquet in {sum(1 for _ in (args.output / 'dask').rglob('*.parquet'))} files")
    wall, cpu = top(args.output / "dask")
    print(f"traceq top --dataset ({len(files)} ranks): {wall:.2f} s wall, {cpu:.2f} CPU s (median of 3)")
    print(f"load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
