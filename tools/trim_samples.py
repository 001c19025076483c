"""Make the small derived samples of `sample_traces/conventions/` from the team's recordings
(`tools/record_conventions.py`, `tools/record_jax.sh`), dropping what the samples do not need so
that each stays near a megabyte. What each keeps and drops is in sample_traces/MANIFEST.md.

    python tools/trim_samples.py RECORDED_DIR OUT_DIR
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
import sys
from pathlib import Path

COMPILE = re.compile(r"\(dynamo_timed\)$|^(entire_frame_compile|backend_compile|inductor_compile)$")


def jax_nsys(source: Path, target: Path) -> None:
    """nsys_jax_mlp_node.sqlite without XLA's compiler-pass ranges (XlaPass*, 80 % of the NVTX
    events), nsys's GPU-metrics markers and diagnostics, and the runtime calls made before the
    first training step that launched nothing."""
    shutil.copyfile(source, target)
    con = sqlite3.connect(target)
    text = "coalesce(text, (SELECT value FROM StringIds WHERE id = textId))"
    con.executescript(f"""
        DELETE FROM NVTX_EVENTS WHERE {text} LIKE 'XlaPass%' OR {text} LIKE 'GpuMetrics%';
        DELETE FROM DIAGNOSTIC_EVENT; DELETE FROM PROFILER_OVERHEAD; DELETE FROM TARGET_INFO_SYSTEM_ENV;
        DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME
        WHERE start < (SELECT min(start) FROM NVTX_EVENTS WHERE {text} LIKE 'XlaModule:#hlo_module=jit_train_step%')
          AND correlationId NOT IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL
                                    UNION SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY
                                    UNION SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET);
        DELETE FROM StringIds WHERE id NOT IN (
            SELECT nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME UNION SELECT textId FROM NVTX_EVENTS WHERE textId IS NOT NULL
            UNION SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL UNION SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL
            UNION SELECT mangledName FROM CUPTI_ACTIVITY_KIND_KERNEL UNION SELECT nameId FROM CUDA_GRAPH_NODE_EVENTS
            UNION SELECT nameId FROM ThreadNames);
    """)
    con.commit()
    con.execute("VACUUM")
    con.close()


def kineto_compile_cold(source: Path, target: Path) -> None:
    """kineto_gpt_compile_cold.json.gz without the operators Dynamo and Inductor trace while they
    compile (cpu_op events inside a compile range that mark no compilation themselves: 90 % of
    the events); the compile ranges, the steps and everything on the GPU stay."""
    trace = json.loads(gzip.open(source).read())
    events = trace["traceEvents"]
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                   if e.get("cat") == "cpu_op" and COMPILE.search(e.get("name", "")))

    def compiling(e: dict) -> bool:
        ts = e.get("ts")
        return ts is not None and any(a <= ts and ts + e.get("dur", 0) <= b for a, b in spans)

    trace["traceEvents"] = [e for e in events if not (e.get("cat") == "cpu_op" and not COMPILE.search(e.get("name", ""))
                                                      and compiling(e))]
    with gzip.open(target, "wt", compresslevel=9) as out:
        json.dump(trace, out, separators=(",", ":"))


if __name__ == "__main__":
    recorded, out = Path(sys.argv[1]), Path(sys.argv[2])
    jax_nsys(recorded / "r15/jax/nsys_jax_mlp_node.sqlite", out / "jax_nsys_train_step.sqlite")
    kineto_compile_cold(recorded / "kineto_gpt_compile_cold.json.gz", out / "gpt_kineto_compile_cold.json.gz")
