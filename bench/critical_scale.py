"""Critical path and a what-if replay of a large trace (requirement 4 of issue 37; run on demand).

    python bench/scale.py sample_traces/alexnet_b256_cudnn.sqlite --kernels 1000000 -o /tmp/traceq-bench/1m.sqlite
    python bench/critical_scale.py /tmp/traceq-bench/1m.sqlite

Loads the trace into a fresh store (not timed), then times building the dependency graph, the
critical paths of every iteration, and one what-if replay (cuDNN at half its time), and prints
the peak resident memory.
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    from traceq.analysis.critical.graph import build_graph
    from traceq.analysis.critical.path import critical_paths
    from traceq.analysis.critical.whatif import Changes, Scale, apply
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    src = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        con = open_store(Path(tmp) / "bench.duckdb", create=True)
        t = load_trace(con, src).trace_id
        began = time.perf_counter()
        graph = build_graph(con, t)
        built = time.perf_counter()
        paths = critical_paths(graph)
        walked = time.perf_counter()
        nodes, dur, _ = apply(con, t, graph, Changes(scales=(Scale.parse("library=cuDNN:0.5"),)))
        critical_paths(graph, dur, nodes)
        replayed = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{graph.nodes.height} nodes, {paths.iterations.height} iterations: graph {built - began:.2f} s, "
          f"critical paths {walked - built:.2f} s, what-if {replayed - walked:.2f} s, "
          f"total {replayed - began:.2f} s; peak RSS {peak:.0f} MiB (load included)")


if __name__ == "__main__":
    main()
