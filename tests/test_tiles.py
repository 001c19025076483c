"""Tile rules (analysis/efficiency/tile_rules.toml) on every convolution and GEMM kernel name of the samples
and of ../shared's reference and real traces: each gets a tile read from its name, a reason it
is not modelled, or the stated default with a flag; and a tile the name spells out is the one
read. The tile and the implicit GEMM dimensions are checked against the grids Nsight Compute
recorded for non-persistent launches (tests/test_traffic_accuracy.py has the bytes and times)."""

from __future__ import annotations

import gzip
import json
import math
import re
import sqlite3
from pathlib import Path

import pytest
from conftest import SAMPLES, ncu_layer, ncu_rows, shared_files

from traceq.analysis.efficiency.tiles import DEFAULT_TILE, kernel_tile
from traceq.analysis.kernels.classify import classify

pytestmark = pytest.mark.xdist_group("tiles")  # one worker builds its module fixtures once (--dist loadgroup)

# Name families whose names carry no tile: they get the default and the flag. A new family here
# needs a reason; a name with a tile in it that the rules miss fails below instead.
NO_TILE_IN_NAME = re.compile(
    r"implicit_convolve_sgemm|magma_sgemmEx_kernel|sgemm_largek_lds|_ZN2ck16tensor_operation")


def _sqlite_names(path: Path) -> set[str]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
        names: set[str] = set()
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL"):
            if table not in tables:
                continue
            join = ("StringIds s ON s.id = k.demangledName" if "StringIds" in tables
                    else "StringTable s ON s._id_ = k.name")
            names |= {r[0] for r in con.execute(f"SELECT DISTINCT s.value FROM {table} k JOIN {join}")}
        return names
    finally:
        con.close()


_JSON_NAME = re.compile(r'"name": ?"((?:[^"\\]|\\.)*)"')


def _kineto_names(path: Path) -> set[str]:
    """Kernel event names of a Kineto JSON, found by text search (3x faster than json.load on
    these files, the same names): from each '"cat": "kernel"' back to its event's opening brace
    and on to the next event's "ph" key."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        text = f.read()
    names = set()
    for kernel in re.finditer(r'"cat": ?"[Kk]ernel"', text):
        start, end = text.rfind("{", 0, kernel.start()), text.find('"ph"', kernel.end())
        found = _JSON_NAME.search(text, start, end if end >= 0 else len(text))
        if found:
            names.add(json.loads(f'"{found.group(1)}"'))
    return names


@pytest.fixture(scope="module")
def names() -> dict[str, str]:
    """Every distinct convolution or GEMM kernel name -> a file it was seen in (about 8 s with
    ../shared: the Kineto files are parsed whole)."""
    files = [*sorted(SAMPLES.glob("*.sqlite")), *sorted((SAMPLES / "ncu").glob("*.sqlite")),
             *shared_files("reference", "*.sqlite"), *shared_files("realtraces/nsys_sqlite", "*"),
             *shared_files("realtraces/nvprof_sqlite", "*")]
    found: dict[str, str] = {}
    for path in files:
        for name in _sqlite_names(path):
            found.setdefault(name, path.name)
    for path in shared_files("realtraces/kineto_json", "*.json*"):
        for name in _kineto_names(path):
            found.setdefault(name, path.name)
    return {n: f for n, f in found.items() if classify(n).operation in ("convolution", "gemm")}


def test_the_corpus_is_read(names: dict[str, str]) -> None:
    assert len(names) >= 60  # the samples alone hold 60-odd; with ../shared about 500


def test_every_conv_and_gemm_name_gets_a_tile_a_reason_or_a_flagged_default(names: dict[str, str]) -> None:
    unexplained = []
    for name, where in names.items():
        tile = kernel_tile(name)
        if not tile.modelled:
            assert tile.reason, name
        elif "default tile" in tile.flags:
            assert (tile.m, tile.n, tile.k) == DEFAULT_TILE
            if not NO_TILE_IN_NAME.search(name):
                unexplained.append(f"{where}: {name[:120]}")
        else:
            assert tile.m > 0 and tile.n > 0 and tile.k > 0
    assert not unexplained, "names with no tile rule:\n" + "\n".join(unexplained)


def test_a_tile_spelled_in_the_name_is_the_tile_read(names: dict[str, str]) -> None:
    # independent readings of the three spellings the corpus uses most
    spellings = [re.compile(r"tilesize(\d+)x(\d+)x(\d+)"),
                 re.compile(r"cutlass_\d*_?\w*?_(\d+)x(\d+)_(\d+)x\d+_(?:nn|nt|tn|tt|nhwc)"),
                 re.compile(r"GemmShape<\(int\)(\d+), \(int\)(\d+), \(int\)(\d+)>")]
    checked = 0
    for name in names:
        tile = kernel_tile(name)
        for spelling in spellings:
            found = spelling.search(name)
            if found and tile.modelled:
                assert (tile.m, tile.n, tile.k) == tuple(int(g) for g in found.groups()), name
                checked += 1
                break
    assert checked >= 40


@pytest.mark.parametrize("name, expected", [
    ("sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize256x64x32_warpgroupsize1x1x1"
     "_g1_execute_segment_k_on_kernel__5x_cudnn", ("tf32", "segment_k", "tma", "nhwc", 1, 1)),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_split_k"
     "_kernel__5x_cublas", ("ffma", "split_k", "l1", "nchw", 1, 4)),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1"
     "_g1_tensor16x8x8_execute_kernel__5x_cudnn", ("tf32", None, "bypass", "nhwc", 2, 2)),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(T1::Params)",
     ("ffma", None, "l1", "nchw", None, None)),
    ("nvjet_sm90_hsh_320x128_64x3_1x2_h_ssched_bz_coopB_NNT", ("fp16", None, "tma", "nchw", None, None)),
    # BF16 (Kineto's operator dtypes say so); the tile rules' own math list once called both TF32
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN", ("bf16", None, "tma", "nchw", None, None)),
    ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1>(T1::Params)",
     ("bf16", None, "bypass", "nchw", None, None)),
])
def test_how_a_kernel_runs(name: str, expected: tuple) -> None:
    t = kernel_tile(name)
    assert (t.math, t.schedule, t.operand_path, t.layout, t.warps_m, t.warps_n) == expected


@pytest.mark.parametrize("path", sorted((SAMPLES / "ncu").glob("*_ncu.csv.gz")), ids=lambda p: p.name[:-11])
def test_tiles_times_gemm_dimensions_equal_the_grid(path: Path) -> None:
    """For one-tile-per-CTA launches (sm80 xmma and CUTLASS convolution kernels), the CTAs Nsight
    Compute counted equal ceil(M / tile M) x ceil(N / tile N) (x split-K slices in grid z), with
    M and N of CUTLASS's implicit GEMM (fprop M = NPQ, N = K; dgrad M = NHW, N = C) computed here
    from the recorded layer shapes."""
    shapes = json.loads(path.with_name(path.name.replace("_ncu.csv.gz", "_shapes.json")).read_text())
    checked = 0
    for row in ncu_rows(path):
        name = row["Kernel Name"]
        layer = ncu_layer(row)
        backward = layer.startswith("b") and layer[1:] in shapes
        shape = shapes.get(layer[1:] if backward else layer)
        if not shape or shape["type"] != "Conv2d" or not re.match(r"sm80_xmma_(fprop|dgrad)", name):
            continue
        tile = kernel_tile(name)
        (n, c, h, w), (_, k, p, q) = shape["input"], shape["output"]
        m_dim, n_dim = (n * p * q, k) if "fprop" in name else (n * h * w, c)
        grid = [int(v) for v in re.findall(r"\d+", row["Grid Size"])]
        tiles = math.ceil(m_dim / tile.m) * math.ceil(n_dim / tile.n)
        assert grid[0] * grid[1] == tiles, (layer, name, grid, tiles)
        checked += 1
    if not checked:
        pytest.skip("no sm80 xmma convolution launch in this recording")
    assert checked >= 1
