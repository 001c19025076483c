"""Theoretical occupancy of a kernel launch on AMD's CDNA GPUs (CDNA2 gfx90a, CDNA3 gfx942,
CDNA4 gfx950), from the resources a trace records: arch and accumulation VGPRs per work-item,
SGPRs per wavefront, LDS per workgroup and the workgroup's size (docs/amd.md, "Occupancy").

A CU has 4 SIMDs of 8 wave slots each. A wavefront's registers come from its SIMD: the unified
VGPR file holds 512 registers a lane, arch VGPRs then AGPRs (the arch count aligned to 4),
allocated 8 at a time; 800 SGPRs, 16 at a time. LDS is the CU's (64 KiB on CDNA2/3, 160 KiB on
CDNA4), allocated 512 bytes at a time (1,280 on CDNA4). A workgroup of more than one wavefront
takes one of the CU's 16 barriers. Workgroups per CU = the least of what each allows, as HIP's
`hipOccupancyMaxActiveBlocksPerMultiprocessor` counts them (a CU's waves by the per-SIMD limit x
4, divided by the workgroup's waves). Units: bytes, registers, workgroups per CU, occupancy a
fraction of the CU's 32 wave slots.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import duckdb

from traceq.errors import MissingDataError, TraceqError

LIMITERS = ("waves", "vgprs", "sgprs", "lds", "workgroups")
"""What may bound an AMD launch's workgroups per CU, in the order a limiter is named."""


@dataclass(frozen=True)
class CdnaLimits:
    """One CDNA architecture's per-CU limits (sources in docs/amd.md)."""

    arch: str  # ISA target: 'gfx942'
    generation: str  # 'CDNA3'
    cus: int  # compute units of the family's largest product, used where the trace gives none
    lds_per_cu: int  # bytes
    lds_granule: int  # bytes a workgroup's LDS is allocated in
    simds_per_cu: int = 4
    waves_per_simd: int = 8
    vgprs_per_simd: int = 512  # per lane: arch VGPRs and AGPRs share the file
    vgpr_granule: int = 8
    sgprs_per_simd: int = 800
    sgpr_granule: int = 16
    max_workgroups_per_cu: int = 16  # barriers: workgroups of more than one wavefront
    max_threads_per_workgroup: int = 1024
    wave_size: int = 64

    @property
    def waves_per_cu(self) -> int:
        return self.simds_per_cu * self.waves_per_simd


CDNA = {
    "gfx90a": CdnaLimits("gfx90a", "CDNA2", cus=110, lds_per_cu=64 << 10, lds_granule=512),
    "gfx942": CdnaLimits("gfx942", "CDNA3", cus=304, lds_per_cu=64 << 10, lds_granule=512),
    "gfx950": CdnaLimits("gfx950", "CDNA4", cus=256, lds_per_cu=160 << 10, lds_granule=1280),
}
"""The CDNA architectures traceq models, by ISA target."""

_PRODUCTS = ((re.compile(r"\bMI2[15]0X?\b"), "gfx90a"), (re.compile(r"\bMI3(?:00[XA]|08X|25X)\b"), "gfx942"),
             (re.compile(r"\bMI35[05]X\b"), "gfx950"))
"""Instinct products -> their ISA target, for traces that name the product only."""


def arch_of(arch: str | None, name: str | None) -> str | None:
    """The ISA target of an AMD GPU from the trace's arch, else its product name; None if neither says."""
    if arch:
        return arch
    for pattern, target in _PRODUCTS:
        if name and pattern.search(name):
            return target
    return None


@dataclass(frozen=True)
class CdnaOccupancy:
    """Workgroups per CU and what bounds them, for one launch. limit_* are the workgroups per CU
    each resource alone allows; `limiting` names those equal to the result, in LIMITERS order."""

    workgroups_per_cu: int
    waves_per_workgroup: int
    limit_waves: int
    limit_vgprs: int
    limit_sgprs: int
    limit_lds: int
    limit_workgroups: int
    limiting: tuple[str, ...]
    occupancy: float  # active wavefronts / the CU's wave slots
    vgprs_allocated: int  # per lane of a wavefront: arch aligned to 4, plus AGPRs, in granules
    lds_allocated: int  # bytes per workgroup


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def cdna_occupancy(threads: int, arch_vgprs: int, accum_vgprs: int, sgprs: int | None, lds_bytes: int,
                   gpu: CdnaLimits) -> CdnaOccupancy:
    """Theoretical occupancy of a workgroup of `threads` work-items with the given registers
    (arch VGPRs and AGPRs per work-item, SGPRs per wavefront: None where unknown, then not a
    limit) and LDS bytes per workgroup. Raises TraceqError for an impossible input."""
    if threads <= 0 or min(arch_vgprs, accum_vgprs, sgprs or 0, lds_bytes) < 0:
        raise TraceqError(f"invalid launch: {threads} work-items, {arch_vgprs}+{accum_vgprs} VGPRs, {sgprs} SGPRs, "
                          f"{lds_bytes} B of LDS; work-items must be positive and the rest non-negative.")
    waves = -(-threads // gpu.wave_size)
    vgprs = _round_up(max(1, (_round_up(arch_vgprs, 4) + accum_vgprs) if accum_vgprs else arch_vgprs),
                      gpu.vgpr_granule)
    lds = _round_up(lds_bytes, gpu.lds_granule)
    slots = gpu.waves_per_cu
    if threads > gpu.max_threads_per_workgroup:
        limit_waves = 0
    else:
        limit_waves = slots // waves
    vgpr_waves = gpu.vgprs_per_simd // vgprs if vgprs <= gpu.vgprs_per_simd else 0
    limit_vgprs = gpu.simds_per_cu * min(vgpr_waves, gpu.waves_per_simd) // waves
    if sgprs is None:
        limit_sgprs = slots
    else:
        sgpr_waves = gpu.sgprs_per_simd // _round_up(max(1, sgprs), gpu.sgpr_granule)
        limit_sgprs = gpu.simds_per_cu * min(sgpr_waves, gpu.waves_per_simd) // waves
    limit_lds = (gpu.lds_per_cu // lds if lds <= gpu.lds_per_cu else 0) if lds else slots
    limit_workgroups = gpu.max_workgroups_per_cu if waves > 1 else slots
    limits = (limit_waves, limit_vgprs, limit_sgprs, limit_lds, limit_workgroups)
    active = min(limits)
    return CdnaOccupancy(
        workgroups_per_cu=active, waves_per_workgroup=waves, limit_waves=limit_waves, limit_vgprs=limit_vgprs,
        limit_sgprs=limit_sgprs, limit_lds=limit_lds, limit_workgroups=limit_workgroups,
        limiting=tuple(name for name, limit in zip(LIMITERS, limits) if limit == active),
        occupancy=active * waves / slots, vgprs_allocated=vgprs, lds_allocated=lds)


def amd_device_limits(con: duckdb.DuckDBPyConnection, trace_id: int, arch: str | None = None,
                      cus: int | None = None) -> dict[int, tuple[CdnaLimits, int]] | None:
    """Per device id of a trace of AMD GPUs: its CdnaLimits (the architecture's, the LDS and wave
    slots per CU the trace records over them) and CU count; None when the trace's GPUs are not
    AMD's. `arch` ('gfx942') and `cus` stand in for what the trace lacks and override it.
    Raises MissingDataError for a GPU whose architecture is unknown or not CDNA2, 3 or 4."""
    rows = con.execute(
        "SELECT device_id, name, arch, sm_count, max_warps_per_sm, max_smem_per_sm_bytes FROM gpus "
        "WHERE trace_id = ? AND vendor = 'AMD' ORDER BY device_id", [trace_id]).fetchall()
    if not rows:
        return None
    if not con.execute("SELECT count(*) FROM kernel_configs WHERE trace_id = ? AND registers_per_thread IS NOT NULL "
                       "AND accum_vgprs IS NOT NULL", [trace_id]).fetchall()[0][0]:
        fmt = con.execute("SELECT format FROM traces WHERE trace_id = ?", [trace_id]).fetchall()
        raise MissingDataError(
            f"this {fmt[0][0] if fmt else 'AMD'} trace records no VGPR and AGPR counts per kernel: no occupancy for its "
            "AMD GPU (rocprofv3 JSON and rocpd, and CSVs with register columns, record them)")
    if arch is not None and arch not in CDNA:
        raise MissingDataError(f"{arch!r} is not a CDNA GPU traceq models: pass --cc {', '.join(CDNA)}")
    records = {r[0]: r for r in rows}
    devices = [r[0] for r in con.execute(
        "SELECT DISTINCT device_id FROM kernel_queues WHERE trace_id = ? ORDER BY ALL", [trace_id]).fetchall()]
    out: dict[int, tuple[CdnaLimits, int]] = {}
    for device in devices:
        _, name, recorded, count, waves, lds = records.get(device) or rows[0]
        target = arch or arch_of(recorded, name)
        if target not in CDNA:
            said = f"is a {target}" if target else "is not named by its architecture"
            raise MissingDataError(
                f"device {device} ({name}) {said}: occupancy is modelled for CDNA2, 3 and 4 only; "
                f"pass --cc {' | '.join(CDNA)} (and --sms, its CU count) for the GPU it ran on")
        gpu = CDNA[target]
        if not arch:
            if waves and waves % gpu.simds_per_cu == 0:
                gpu = replace(gpu, waves_per_simd=waves // gpu.simds_per_cu)
            if lds:
                gpu = replace(gpu, lds_per_cu=lds)
        out[device] = (gpu, cus or count or gpu.cus)
    return out
