"""`traceq load` of one trace at two commits, runs interleaved in one session (run on demand).

    python bench/ab.py main HEAD /tmp/traceq-bench/alexnet_10M.sqlite --runs 3

Each commit is exported (`git archive`) and installed into a virtualenv of its own under
--work (pip from the same package index as the checkout's, so the dependencies are the same;
an existing install is reused), then the loads alternate, A B A B ..., each a child process
loading into a fresh store, timed by wall clock with its CPU seconds and peak RSS from the
kernel's rusage. Interleaving is what makes the two comparable on a shared machine whose speed
changes from minute to minute: the ratio of the medians is the figure to trust, CPU seconds
more than wall seconds. The load average at each run is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def install(commit: str, work: Path) -> Path:
    """The python of a virtualenv with traceq at `commit` installed (made once per commit)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", commit], check=True,
                         capture_output=True, text=True).stdout.strip()
    venv = work / f"venv-{sha}"
    python = venv / "bin" / "python"
    if not python.exists():
        source = work / f"src-{sha}"
        source.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", str(source)], check=True)
    return python


def load(python: Path, trace: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one `traceq load` into a fresh store."""
    with tempfile.TemporaryDirectory(prefix="traceq-ab-") as tmp:
        started = time.perf_counter()
        proc = subprocess.Popen([str(python), "-m", "traceq", "load", str(trace), "--db", f"{tmp}/s.duckdb"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        if status != 0:
            raise SystemExit(f"{python} failed to load {trace}: {proc.stderr.read().decode()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="the commit to compare against (e.g. main)")
    parser.add_argument("b", help="the commit measured (e.g. HEAD)")
    parser.add_argument("trace", type=Path)
    parser.add_argument("--runs", type=int, default=3, help="loads per commit")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "traceq-ab")
    args = parser.parse_args()
    pythons = {c: install(c, args.work) for c in (args.a, args.b)}
    results: dict[str, list[tuple[float, float, float]]] = {c: [] for c in pythons}
    for i in range(args.runs):
        for commit, python in pythons.items():
            wall, cpu, rss = load(python, args.trace)
            results[commit].append((wall, cpu, rss))
            print(f"run {i + 1} {commit}: {wall:.2f} s, {cpu:.2f} CPU s, {rss:.0f} MiB "
                  f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    medians = {c: [statistics.median(r[k] for r in rows) for k in range(3)] for c, rows in results.items()}
    for commit, (wall, cpu, rss) in medians.items():
        print(f"{commit}: median {wall:.2f} s, {cpu:.2f} CPU s, {rss:.0f} MiB")
    (wa, ca, _), (wb, cb, _) = medians[args.a], medians[args.b]
    print(f"{args.b} / {args.a}: wall {wb / wa:.3f}, CPU {cb / ca:.3f}")


if __name__ == "__main__":
    main()
