"""Critical path and a what-if replay of a large trace (requirement 4 of issue 37; run on demand).

    python bench/scale.py sample_traces/alexnet_b256_cudnn.sqlite --kernels 1000000 -o /tmp/traceq-bench/1m.sqlite
    python bench/critical_scale.py /tmp/traceq-bench/1m.sqlite

Loads the trace into a fresh store (not timed), then times building the dependency graph, the
critical paths of every iteration, and one what-if replay (cuDNN at half its time) and its
path, in CPU seconds (user + system, every thread: the machine is shared, wall time says little)
and wall seconds; then `traceq whatif`'s own work on the same graph (`whatif.predict`: the
unchanged replay beside the changed one), and the peak resident memory.
"""

from __future__ import annotations

import itertools
import resource
import sys
import tempfile
import time
from pathlib import Path


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    from traceq.analysis.critical.graph import build_graph
    from traceq.analysis.critical.path import critical_paths
    from traceq.analysis.critical.whatif import Changes, Scale, apply, predict
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    src = Path(sys.argv[1])
    change = Changes(scales=(Scale.parse("library=cuDNN:0.5"),))
    with tempfile.TemporaryDirectory() as tmp:
        con = open_store(Path(tmp) / "bench.duckdb", create=True)
        t = load_trace(con, src).trace_id
        marks = [(_cpu(), time.perf_counter())]
        graph = build_graph(con, t)
        marks.append((_cpu(), time.perf_counter()))
        paths = critical_paths(graph)
        paths_kept, iterations = paths, paths.iterations.height
        del paths
        marks.append((_cpu(), time.perf_counter()))
        nodes, dur, _ = apply(con, t, graph, change)
        critical_paths(graph, dur, nodes)
        marks.append((_cpu(), time.perf_counter()))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        del paths_kept, nodes, dur
        predict(con, t, change, graph)
        marks.append((_cpu(), time.perf_counter()))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu = [b[0] - a[0] for a, b in itertools.pairwise(marks)]
    wall = [b[1] - a[1] for a, b in itertools.pairwise(marks)]
    print(f"{graph.nodes.height} nodes, {iterations} iterations, CPU s (wall s): graph {cpu[0]:.2f} "
          f"({wall[0]:.2f}), critical paths {cpu[1]:.2f} ({wall[1]:.2f}), what-if {cpu[2]:.2f} ({wall[2]:.2f}), "
          f"total {sum(cpu[:3]):.2f} ({sum(wall[:3]):.2f}); whatif.predict {cpu[3]:.2f} ({wall[3]:.2f}); "
          f"peak RSS {before:.0f} MiB before predict, {peak:.0f} MiB after (load included)")


if __name__ == "__main__":
    main()
