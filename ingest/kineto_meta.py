"""The keys of a Kineto trace outside its event array (`json_events.TraceEvents.metadata`):
`deviceProperties` into the store's gpus, `distributedInfo` into process_groups and the trace's
rank, world size and backend, the profiler's versions and options into the trace's tool."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from traceq.ingest.base import SourceInfo

KNOWN_CLOCKS_HZ = {
    "NVIDIA H200": 1_980_000_000,
    "NVIDIA H100 80GB HBM3": 1_980_000_000,
    "NVIDIA A100-SXM4-80GB": 1_410_000_000,
    "NVIDIA A100-PG509-200": 1_410_000_000,
    "Tesla V100-SXM2-32GB": 1_530_000_000,
    "Tesla V100-SXM2-16GB": 1_530_000_000,
    "Tesla V100-DGXS-32GB": 1_530_000_000,
}
"""Maximum SM clock by device name, for the peaks of `traceq ce`: Kineto's deviceProperties
lack it. Each value is the clockRate of a device record of the same name (nsys TARGET_INFO_GPU,
nvprof CUPTI_ACTIVITY_KIND_DEVICE) in our reference traces or realtraces; tests check them."""


def gpu_table(meta: dict[str, Any]) -> pa.Table:
    rows = []
    amd = any(k.startswith(("roctracer", "hip_")) for k in meta)
    for d in meta.get("deviceProperties") or []:
        if not isinstance(d, dict):
            continue
        name = d.get("name")
        vendor = "AMD" if amd or str(name or "").startswith("AMD") or d.get("warpSize") == 64 else "NVIDIA"
        nvidia = vendor == "NVIDIA"
        threads, warp = int_or_none(d.get("maxThreadsPerMultiprocessor")), int_or_none(d.get("warpSize"))
        rows.append({
            "device_id": int_or_none(d.get("id")), "name": name, "vendor": vendor,
            # AMD's computeMajor/Minor are a gfx version (9.4: MI300X), not a CUDA compute capability
            "cc_major": int_or_none(d.get("computeMajor")) if nvidia else None,
            "cc_minor": int_or_none(d.get("computeMinor")) if nvidia else None,
            "sm_count": int_or_none(d.get("numSms")), "clock_hz": KNOWN_CLOCKS_HZ.get(name) if nvidia else None,
            "memory_bytes": int_or_none(d.get("totalGlobalMem")), "threads_per_warp": warp,
            "max_threads_per_block": int_or_none(d.get("maxThreadsPerBlock")),
            "max_warps_per_sm": threads // warp if threads and warp else None,
            "max_registers_per_sm": int_or_none(d.get("regsPerMultiprocessor")),
            "max_registers_per_block": int_or_none(d.get("regsPerBlock")),
            "max_smem_per_sm_bytes": int_or_none(d.get("sharedMemPerMultiprocessor")
                                          or d.get("maxSharedMemoryPerMultiProcessor")),
            "max_smem_per_block_bytes": int_or_none(d.get("sharedMemPerBlock")),
            "max_smem_per_block_optin_bytes": int_or_none(d.get("sharedMemPerBlockOptin")),
        })
    types = {"name": pa.string(), "vendor": pa.string()}
    columns = ["device_id", "name", "vendor", "cc_major", "cc_minor", "sm_count", "clock_hz", "memory_bytes",
               "threads_per_warp", "max_threads_per_block", "max_warps_per_sm", "max_registers_per_sm",
               "max_registers_per_block", "max_smem_per_sm_bytes", "max_smem_per_block_bytes",
               "max_smem_per_block_optin_bytes"]
    return pa.table({c: pa.array([r[c] for r in rows], types.get(c, pa.int64())) for c in columns})


def process_group_table(meta: dict[str, Any]) -> pa.Table:
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    groups = [g for g in info.get("pg_config") or [] if isinstance(g, dict)]
    return pa.table({
        "pg_name": pa.array([text_or_none(g.get("pg_name")) for g in groups], pa.string()),
        "pg_desc": pa.array([text_or_none(g.get("pg_desc")) for g in groups], pa.string()),
        "backend_config": pa.array([text_or_none(g.get("backend_config")) for g in groups], pa.string()),
        "pg_size": pa.array([int_or_none(g.get("pg_size")) for g in groups], pa.int64()),
        "ranks": pa.array([[r for r in g.get("ranks") or [] if isinstance(r, int)] for g in groups],
                          pa.list_(pa.int64())),
    })


def source_info(meta: dict[str, Any]) -> SourceInfo:
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    versions = [f"{key} {meta[key]}" for key in ("cupti_version", "roctracer_version") if key in meta]
    options = [k for k in ("record_shapes", "with_stack", "profile_memory", "with_modules", "with_flops") if meta.get(k) == 1]
    tool = "PyTorch profiler (Kineto)" + "".join(f"{sep}{', '.join(p)}" for sep, p in ((", ", versions), ("; ", options)) if p)
    base = int_or_none(meta.get("baseTimeNanoseconds"))
    if base is not None and not 0 <= base < 2**63:  # no wall clock: its times stand as they are
        base = None
    return SourceInfo(format="kineto", tool=tool, schema_version=text_or_none(meta.get("schemaVersion")),
                      session_start_utc_ns=base, rank=int_or_none(info.get("rank")),
                      world_size=int_or_none(info.get("world_size")), backend=text_or_none(info.get("backend")))


def int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
