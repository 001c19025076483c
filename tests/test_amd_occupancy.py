"""Occupancy on AMD's CDNA GPUs (analysis/efficiency/cdna.py, `traceq ru` on an AMD trace) against
a computation written here from the ISA limits (docs/amd.md, "Occupancy"), from the registers and
LDS the raw files record (json, sqlite3: not the product's code)."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import shared

import traceq
from traceq import TraceqError
from traceq.analysis.efficiency.cdna import CDNA, cdna_occupancy

ROCPD = ("realtraces", "rocpd")
KD = re.compile(r"(\s*\[clone \.kd\]|\.kd)$")


def _up(value: int, unit: int) -> int:
    return (value + unit - 1) // unit * unit


def expected(threads: int, arch: int, agprs: int, sgprs: int, lds: int, *, lds_per_cu: int,
             lds_granule: int) -> tuple[int, float, set[str]]:
    """Workgroups per CU, occupancy and the binding limits of a CDNA2/3/4 launch, by hand: 4 SIMDs
    of 8 wave slots; 512 VGPRs a lane per SIMD, arch VGPRs aligned to 4 then AGPRs, granule 8;
    800 SGPRs per SIMD, granule 16; LDS per CU in granules; 16 workgroups of 2+ waves per CU."""
    waves = -(-threads // 64)
    vgprs = _up(max(_up(arch, 4) + agprs if agprs else arch, 1), 8)
    per_simd = {"waves": 8, "vgprs": min(8, 512 // vgprs), "sgprs": min(8, 800 // _up(max(sgprs, 1), 16))}
    limits = {k: 4 * v // waves for k, v in per_simd.items()}
    limits["lds"] = lds_per_cu // _up(lds, lds_granule) if lds else 32
    limits["workgroups"] = 16 if waves > 1 else 32
    active = min(limits.values())
    return active, active * waves / 32, {k for k, v in limits.items() if v == active}


def test_the_model_by_hand() -> None:
    """A few launches worked by hand: AGPRs after the arch VGPRs aligned to 4 (130 -> 132 + 100 =
    232 a lane: 2 waves a SIMD), SGPRs (112: 7 waves), LDS granules (gfx950: 1,280 bytes)."""
    gfx942, gfx950 = CDNA["gfx942"], CDNA["gfx950"]
    occ = cdna_occupancy(256, 130, 100, 32, 0, gfx942)
    assert (occ.workgroups_per_cu, occ.occupancy, occ.limiting, occ.vgprs_allocated) == (2, 0.25, ("vgprs",), 232)
    occ = cdna_occupancy(512, 80, 0, 112, 0, gfx942)  # VGPRs 6 waves a SIMD (24 a CU), SGPRs 7 (28): 3 groups of 8
    assert (occ.workgroups_per_cu, occ.occupancy, occ.limiting) == (3, 0.75, ("vgprs", "sgprs"))
    assert cdna_occupancy(512, 88, 0, 32, 0, gfx942).limiting == ("vgprs",)  # 88 -> 5 waves a SIMD: 2 groups
    occ = cdna_occupancy(256, 24, 0, 112, 0, gfx942)  # SGPRs: 7 waves a SIMD, 28 a CU, 7 groups of 4
    assert (occ.workgroups_per_cu, occ.occupancy, occ.limiting) == (7, 0.875, ("sgprs",))
    occ = cdna_occupancy(256, 32, 0, 32, 37664, gfx950)  # 30 granules of 1,280: 4 groups in 160 KiB
    assert (occ.workgroups_per_cu, occ.occupancy, occ.limiting, occ.lds_allocated) == (4, 0.5, ("lds",), 38400)
    occ = cdna_occupancy(256, 32, 0, 32, 37664, gfx942)  # 74 granules of 512: 1 group in 64 KiB
    assert (occ.workgroups_per_cu, occ.limiting) == (1, ("lds",))
    occ = cdna_occupancy(64, 16, 0, 32, 0, gfx942)  # one-wave groups hold no barrier: 32 of them
    assert (occ.workgroups_per_cu, occ.occupancy) == (32, 1.0)
    occ = cdna_occupancy(128, 16, 0, 32, 0, gfx942)  # 16 groups of 2 waves: the slots and the barriers at once
    assert (occ.workgroups_per_cu, occ.limiting) == (16, ("waves", "vgprs", "sgprs", "workgroups"))
    assert cdna_occupancy(256, 16, 0, 32, 70000, gfx942).workgroups_per_cu == 0  # more LDS than a CU has
    with pytest.raises(TraceqError):
        cdna_occupancy(0, 16, 0, 32, 0, gfx942)


def _json_configs(path: Path) -> dict[str, set[tuple[int, ...]]]:
    tool = json.loads(gzip.decompress(path.read_bytes()))["rocprofiler-sdk-tool"][0]
    symbols = {s["kernel_id"]: s for s in tool["kernel_symbols"]}
    configs: dict[str, set[tuple[int, ...]]] = defaultdict(set)
    for record in tool["buffer_records"]["kernel_dispatch"]:
        info = record["dispatch_info"]
        s = symbols[info["kernel_id"]]
        size = info["workgroup_size"]
        configs[KD.sub("", s["demangled_kernel_name"])].add((
            size["x"] * size["y"] * size["z"], s["arch_vgpr_count"], s["accum_vgpr_count"], s["sgpr_count"],
            info["group_segment_size"]))
    return configs


def test_rocprofv3_json_on_mi350x(tmp_path: Path) -> None:
    """TraceLens's 908 file (MI350X, gfx950, named by its agents): every kernel name of one launch
    shape has the occupancy, workgroups per CU and limiter computed here from its kernel symbol's
    registers and its dispatch's LDS."""
    path = shared(*ROCPD, "AMD-AGI__TraceLens__rocprof__908_results.json.gz")
    frame = traceq.load(path, tmp_path / "s.duckdb").ru("kernel")
    got = {r["name"]: r for r in frame.iter_rows(named=True)}
    checked = set()
    for name, shapes in _json_configs(path).items():
        if len(shapes) != 1:
            continue
        (shape,) = shapes
        wgs, occupancy, limiting = expected(*shape, lds_per_cu=160 << 10, lds_granule=1280)
        row = got[name]
        assert (row["blocks_per_sm"], row["occupancy"], set(row["limiter"].split("+"))) == (wgs, occupancy, limiting), name
        checked.add((wgs, occupancy, frozenset(limiting)))
    assert len(checked) >= 5  # several distinct outcomes, LDS- and register-bound among them
    assert {"lds"} in [set(c[2]) for c in checked] and any("vgprs" in c[2] and c[0] < 8 for c in checked)
    nccl = got["ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)"]
    assert (nccl["blocks_per_sm"], nccl["occupancy"], nccl["limiter"]) == (4, 0.5, "lds")  # worked in docs/amd.md


def test_rocprof_v1_needs_the_gpu_and_then_agrees(tmp_path: Path) -> None:
    """rocprof v1 names no GPU: ru says so in one line; with --cc gfx90a each kernel's occupancy is
    the one computed here from the KERN table's arch_vgpr, accum_vgpr, sgpr, lds and wgr."""
    path = shared(*ROCPD, "amd__HPCTrainingExamples__finite-difference__results.db")
    t = traceq.load(path, tmp_path / "s.duckdb")
    with pytest.raises(TraceqError, match="not named by its architecture.*--cc gfx90a"):
        t.ru("kernel")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    raw = {KD.sub("", name.strip('"')): (wgr, vgpr, agpr, sgpr, lds) for name, wgr, vgpr, agpr, sgpr, lds in con.execute(
        "SELECT DISTINCT KernelName, wgr, arch_vgpr, accum_vgpr, sgpr, lds FROM KERN")}
    assert any(shape[2] for shape in raw.values())  # AGPRs in use: the unified file's sum is checked
    frame = t.ru("kernel", cc="gfx90a")
    assert frame.height == len(raw)
    for row in frame.iter_rows(named=True):
        wgs, occupancy, limiting = expected(*raw[row["name"]], lds_per_cu=64 << 10, lds_granule=512)
        assert (row["blocks_per_sm"], row["occupancy"], set(row["limiter"].split("+"))) == (wgs, occupancy, limiting)
        assert row["ru"] is not None and 0 < row["ru"] <= 1


def test_a_trace_without_registers_says_so(tmp_path: Path) -> None:
    """rocprofv3's early CSV has no register columns: no occupancy, said in one line."""
    path = shared(*ROCPD, "ROCm__rocprofiler-sdk__docs__kernel_trace.csv")
    t = traceq.load(path, tmp_path / "s.duckdb")
    with pytest.raises(TraceqError, match="records no VGPR and AGPR counts per kernel: no occupancy"):
        t.ru("kernel", cc="gfx942")
