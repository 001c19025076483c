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


def command_buffer_truth(source: Path, target: Path) -> None:
    """From nsys_jax_mlp_nocb.sqlite (the same MLP with XLA's command buffers off, so every op
    launches its own kernels inside its thunk): for each HLO op, the name and grid of the kernels
    it launched in each step, as JSON: the ground truth for which op each kernel of the command
    buffer in jax_nsys_train_step.sqlite ran (tests/test_structure_jax.py)."""
    raw = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    ranges = raw.execute("""
        SELECT n.start, n."end", n.globalTid, coalesce(n.text, s.value) FROM NVTX_EVENTS n
        LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = 59""").fetchall()
    first = min(r[0] for r in ranges if r[3].startswith("XlaModule:#hlo_module=jit_train_step,"))
    thunks = sorted((r for r in ranges if r[3].startswith("Thunk:") and r[0] >= first), key=lambda r: r[0])
    ops: dict[str, set] = {}
    for at, tid, name, gx, gy, gz in raw.execute("""
            SELECT a.start, a.globalTid, s.value, k.gridX, k.gridY, k.gridZ FROM CUPTI_ACTIVITY_KIND_KERNEL k
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME a ON a.correlationId = k.correlationId
            JOIN StringIds s ON s.id = k.shortName WHERE a.start >= ?""", [first]):
        around = [t for t in thunks if t[2] == tid and t[0] <= at < t[1]]
        if around:
            op = re.search(r"hlo_op=([^,#]+)", around[-1][3]).group(1)
            ops.setdefault(op, set()).add(f"{name} grid {gx}x{gy}x{gz}")
    target.write_text(json.dumps({op: sorted(v) for op, v in sorted(ops.items())}, indent=1) + "\n")


def gpu_metrics_nsys(source: Path, target: Path) -> None:
    """base_metrics.sqlite (a CNN+MLP training run on one H200 under `nsys profile
    --gpu-metrics-devices=0`) without nsys's diagnostics, system environment and profiler
    overhead rows; every kernel, call, range and GPU metric sample stays."""
    shutil.copyfile(source, target)
    con = sqlite3.connect(target)
    con.executescript("""
        DELETE FROM DIAGNOSTIC_EVENT; DELETE FROM PROFILER_OVERHEAD; DELETE FROM TARGET_INFO_SYSTEM_ENV;
    """)
    con.commit()
    con.execute("VACUUM")
    con.close()


if __name__ == "__main__":
    recorded, out = Path(sys.argv[1]), Path(sys.argv[2])
    jax_nsys(recorded / "r15/jax/nsys_jax_mlp_node.sqlite", out / "jax_nsys_train_step.sqlite")
    kineto_compile_cold(recorded / "kineto_gpt_compile_cold.json.gz", out / "gpt_kineto_compile_cold.json.gz")
    command_buffer_truth(recorded / "r15/jax/nsys_jax_mlp_nocb.sqlite", out / "jax_nsys_nocb_ops.json")
    gpu_metrics_nsys(recorded / "r16/gpumetrics/base_metrics.sqlite", out / "cnn_nsys_gpu_metrics.sqlite")
