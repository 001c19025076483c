"""Critical path and a what-if replay of a large trace (requirement 4 of issue 37: at most 10 s
within 2 GB; run on demand).

    python bench/scale.py sample_traces/alexnet_b256_cudnn.sqlite --kernels 1000000 -o /tmp/traceq-bench/1m.sqlite
    python bench/critical_scale.py /tmp/traceq-bench/1m.sqlite [--repeat 3] [--store S.duckdb] [--no-commands]

Each step runs in a process of its own, so that one's memory is not counted in another's:

- load: the trace into a fresh store (`--store`: that one, kept; the load is skipped where it
  exists already);
- analysis: building the dependency graph, the critical paths of every iteration, one what-if
  replay (cuDNN at half its time) and its path, then `traceq whatif`'s own work on the same
  graph (`whatif.predict`: the unchanged replay beside the changed one). Per phase: CPU seconds
  (user + system, every thread: the machine is shared, wall time says little), wall seconds and
  the phase's own peak RSS (VmHWM, reset before each phase);
- the commands themselves: `traceq critical` and `traceq whatif --scale library=cuDNN:0.5` on
  the store, as a user runs them (start-up and table included); `--no-commands` leaves them out.

Every process's CPU seconds and peak RSS come from the kernel's account of it (`os.wait4`). With
`--repeat N` the analysis and the commands run N times, alternately, and medians are printed.
Run it with another checkout's `traceq` first on PYTHONPATH to compare two versions.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHANGE = "library=cuDNN:0.5"
PHASES = ("graph", "critical paths", "what-if replay and path", "whatif.predict")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _hwm_mib() -> float:
    """This process's peak RSS since the last `_reset` (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset() -> None:
    """VmHWM back to the current RSS (Linux: 5 > /proc/self/clear_refs), so that the next
    phase's peak is its own; where that is refused, peaks are since the start."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _load(trace: str, store: str) -> None:
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    con = open_store(Path(store), create=True)
    load_trace(con, Path(trace))
    con.close()


def _analyse(store: str) -> None:
    """The phases in this process; prints one JSON line: per phase [cpu_s, wall_s, peak_mib]."""
    from traceq.analysis.critical.graph import build_graph
    from traceq.analysis.critical.path import critical_paths
    from traceq.analysis.critical.whatif import Changes, Scale, apply, predict
    from traceq.store import open_store

    con = open_store(Path(store), read_only=True)
    t = int(con.execute("SELECT min(trace_id) FROM traces").fetchone()[0])
    change = Changes(scales=(Scale.parse(CHANGE),))
    phases: list[list[float]] = []
    kept: dict = {}

    def phase(work) -> None:
        _reset()
        cpu, wall = _cpu(), time.perf_counter()
        work()
        phases.append([_cpu() - cpu, time.perf_counter() - wall, _hwm_mib()])

    phase(lambda: kept.update(graph=build_graph(con, t)))
    graph = kept["graph"]
    phase(lambda: kept.update(paths=critical_paths(graph)))
    kept.update(iterations=kept.pop("paths").iterations.height)

    def whatif() -> None:
        nodes, dur, _ = apply(con, t, graph, change)
        critical_paths(graph, dur, nodes)

    phase(whatif)
    phase(lambda: predict(con, t, change, graph))
    print(json.dumps({"nodes": graph.nodes.height, "iterations": kept["iterations"], "phases": phases}))


def _child(args: list[str]) -> tuple[float, float, float, str]:
    """Run a process to its end: (CPU s, wall s, peak RSS MiB, stdout), from the kernel's account."""
    began = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(args, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - began
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            sys.exit(f"{' '.join(args[:4])} ...: exit {proc.returncode}\n{err.read()[-2000:]}")
        return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024, out.read()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace", nargs="?")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--store", type=Path, help="load into (or, where it exists, read) this store")
    parser.add_argument("--no-commands", action="store_true", help="the analysis only, not the two commands")
    parser.add_argument("--load-into", help=argparse.SUPPRESS)
    parser.add_argument("--analyse", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_into:
        return _load(args.trace, args.load_into)
    if args.analyse:
        return _analyse(args.analyse)
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp) / "bench.duckdb"
        me = [sys.executable, __file__]
        if not store.exists():
            cpu, wall, peak, _ = _child([*me, args.trace, "--load-into", str(store)])
            print(f"load: {cpu:.2f} CPU s ({wall:.2f} s wall), peak RSS {peak:.0f} MiB (a process of its own)")
        traceq = [sys.executable, "-m", "traceq"]
        name = Path(args.trace).name.split(".")[0] if args.trace else None
        target = ["--db", str(store), *(["-t", name] if name else [])]
        commands = {} if args.no_commands else {
            "traceq critical": [*traceq, "critical", *target],
            f"traceq whatif --scale {CHANGE}": [*traceq, "whatif", "--scale", CHANGE, *target]}
        runs: list[dict] = []
        for _ in range(args.repeat):
            cpu, wall, peak, out = _child([*me, "--analyse", str(store)])
            runs.append({"analysis": (cpu, wall, peak), "detail": json.loads(out.strip().splitlines()[-1])})
            for what, argv in commands.items():
                runs[-1][what] = _child(argv)[:3]
    _report(runs, list(commands))


def _report(runs: list[dict], commands: list[str]) -> None:
    def median(values) -> float:
        return statistics.median(values)

    detail = runs[0]["detail"]
    print(f"{detail['nodes']} nodes, {detail['iterations']} iterations; medians of {len(runs)} run(s), "
          "CPU s (wall s), the phase's own peak RSS:")
    phases = [run["detail"]["phases"] for run in runs]
    for i, what in enumerate(PHASES):
        cpu, wall, peak = (median(p[i][k] for p in phases) for k in range(3))
        print(f"  {what}: {cpu:.2f} ({wall:.2f}), {peak:.0f} MiB")
    total = [sum(p[i][0] for i in range(3)) for p in phases]
    total_wall = [sum(p[i][1] for i in range(3)) for p in phases]
    print(f"  graph + paths + one what-if: {median(total):.2f} CPU s ({median(total_wall):.2f} s wall)")
    # the analysis process's peak: its phases' highest (resetting VmHWM resets ru_maxrss too)
    peaks = [max(p[i][2] for i in range(len(PHASES))) for p in phases]
    for what in ["analysis", *commands]:
        cpu, wall, peak = (median(run[what][k] for run in runs) for k in range(3))
        label = "the analysis process (all four phases)" if what == "analysis" else f"`{what}`"
        peak = median(peaks) if what == "analysis" else peak
        print(f"{label}: {cpu:.2f} CPU s ({wall:.2f} s wall), peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
