"""`traceq ru` over the store: per-launch occupancy and RU from the trace's own launch records
and device record, checked against Nsight Compute, the paper's equations and by hand."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import polars as pl
import pytest
from conftest import SAMPLES, sample, trace_id
from typer.testing import CliRunner

from traceq.analysis.efficiency.ce import GroupBy
from traceq.analysis.efficiency.ru import device_limits, launch_ru, ru_table
from traceq.cli import app
from traceq.errors import MissingDataError

runner = CliRunner()


def _ncu_launches() -> pl.DataFrame:
    """One row per kernel Nsight Compute profiled (the same AlexNet b256 step, another run)."""
    with (SAMPLES / "alexnet_ncu_raw.csv").open(newline="") as f:
        names, _units, *rows = csv.reader(f)
    num = lambda text: float(text.replace(",", ""))  # noqa: E731
    records = [dict(zip(names, r)) for r in rows]
    return pl.DataFrame({
        "name": [r["Kernel Name"] for r in records],
        "grid_blocks": [int(num(r["launch__grid_size"])) for r in records],
        "block_threads": [int(num(r["launch__block_size"])) for r in records],
        "registers_per_thread": [int(num(r["launch__registers_per_thread"])) for r in records],
        "smem_carveout_bytes": [round(num(r["launch__shared_mem_config_size"]) * 1000) for r in records],
        "smem_static_bytes": [round(num(r["launch__shared_mem_per_block_static"]) * 1000) for r in records],
        "smem_dynamic_bytes": [round(num(r["launch__shared_mem_per_block_dynamic"]) * 1000) for r in records],
        "ncu_blocks_per_sm": [int(min(num(r[f"launch__occupancy_limit_{x}"]) for x in
                                      ("blocks", "registers", "shared_mem", "warps", "barriers")))
                              for r in records],
        "ncu_occupancy": [num(r["sm__maximum_warps_per_active_cycle_pct"]) / 100 for r in records],
        "ncu_waves": [num(r["launch__waves_per_multiprocessor"]) for r in records],
    })


def test_store_launches_agree_with_nsight_compute(sample_store) -> None:
    """The trace's launches whose shape (grid, block, registers, shared memory, carveout) Nsight
    Compute also profiled get ncu's active blocks per SM, occupancy and waves, from the trace's
    own H200 record. (ncu prints template names, nsys argument lists: the shape is the key.)"""
    launches = launch_ru(sample_store, trace_id(sample_store, "alexnet_b256_cudnn"))
    keys = ["grid_blocks", "block_threads", "registers_per_thread", "smem_static_bytes",
            "smem_dynamic_bytes", "smem_carveout_bytes"]
    ncu = _ncu_launches().drop("name").unique(keys)
    both = launches.with_columns(pl.col(keys).cast(pl.Int64)).join(ncu, on=keys, how="inner")
    assert both.height == launches.height == 648  # every launch of the trace has an ncu twin
    assert (both["blocks_per_sm"] == both["ncu_blocks_per_sm"]).all()
    assert ((both["occupancy"] - both["ncu_occupancy"]).abs() < 5e-5).all()
    # ncu prints waves to 2 decimals
    assert ((both["waves"] - both["ncu_waves"]).abs() <= 0.005 + 1e-9).all()


def test_ru_is_equation_11_by_hand(sample_store) -> None:
    launches = launch_ru(sample_store, trace_id(sample_store, "alexnet_b256_nocudnn"))
    assert launches["ru"].null_count() == 0
    for row in launches.sample(200, seed=1).iter_rows(named=True):
        max_blocks = 132 * row["blocks_per_sm"]
        assert row["max_blocks"] == max_blocks
        grid = row["grid_blocks"]
        assert row["ru"] == pytest.approx(grid / (math.ceil(grid / max_blocks) * max_blocks))
        paper = 132 * (65536 // (row["block_threads"] * row["registers_per_thread"]))
        assert row["paper_max_blocks"] == paper
        assert row["paper_ru"] == pytest.approx(grid / (math.ceil(grid / paper) * paper))
        assert 0 < row["ru"] <= 1 and 0 < row["occupancy"] <= 1


def test_kineto_estimate_is_zero_over_48_kib(sample_store) -> None:
    """notes §5.3: Kineto's estimate is 0 for kernels over 48 KiB + 1 KiB of shared memory;
    the calculator's occupancy is not."""
    launches = launch_ru(sample_store, trace_id(sample_store, "alexnet_b256_cudnn"))
    big = launches.filter(pl.col("smem_static_bytes") + pl.col("smem_dynamic_bytes") > 48 * 1024)
    assert big.height > 0
    assert (big["kineto_occupancy"] == 0).all() and (big["occupancy"] > 0).all()


def test_grouped_means_are_time_weighted(sample_store) -> None:
    t = trace_id(sample_store, "alexnet_b256_cudnn")
    launches = launch_ru(sample_store, t)
    by_layer = ru_table(sample_store, t, GroupBy.layer)
    conv1 = launches.filter((pl.col("layer") == "conv1") & (pl.col("pass") == "forward"))
    row = by_layer.filter((pl.col("layer") == "conv1") & (pl.col("pass") == "forward")).row(0, named=True)
    expected = (conv1["ru"] * conv1["dur_ns"]).sum() / conv1["dur_ns"].sum()
    assert row["ru"] == pytest.approx(expected) and row["kernels"] == conv1.height
    assert row["library"] == "cuDNN"
    by_lib = ru_table(sample_store, t, "library")
    assert by_lib["total_ns"].sum() == launches["dur_ns"].sum()
    by_kernel = ru_table(sample_store, t)
    assert by_kernel["kernels"].sum() == launches.height


@pytest.mark.parametrize("by", [GroupBy.kernel, GroupBy.library, GroupBy.layer])
@pytest.mark.parametrize("name", [p.stem for p in sorted(SAMPLES.glob("*.sqlite"))])
def test_grouped_launches_give_the_per_launch_means(sample_store, name: str, by: GroupBy) -> None:
    """ru_table groups the launches of one name, shape and grid (in the store by kernel or
    library; with their library, layer and pass when attributed, the path `layer` and `compare`
    take) and weights each group's RU by its time: the same kernels, times, time-weighted means
    and dominant limiter as summed here launch by launch over `launch_ru`."""
    from polars.testing import assert_frame_equal

    from traceq.analysis.structure.layers import launch_groups

    t = trace_id(sample_store, name)
    keys = {GroupBy.kernel: ["name"], GroupBy.layer: ["layer", "pass"], GroupBy.library: ["library"]}[by]
    launches = launch_ru(sample_store, t)
    means = ["occupancy", "waves", "ru", "paper_ru"]
    weighted = [((pl.col(c) * pl.col("dur_ns")).sum() / pl.col("dur_ns").filter(pl.col(c).is_not_null()).sum())
                .alias(c) for c in means]
    want = (launches.sort(["dur_ns", "kernel_id"], descending=[True, False])
            .group_by(keys).agg(kernels=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum(),
                                limiter=pl.col("limiter").first(), *weighted)
            .select(*keys, "kernels", "total_ns", "limiter", *means).sort(keys, nulls_last=True))
    tables = [ru_table(sample_store, t, by, groups=launch_groups(sample_store, t))]
    if by is not GroupBy.layer:
        tables.append(ru_table(sample_store, t, by))
    for table in tables:
        got = table.select(*keys, "kernels", "total_ns", "limiter", *means).sort(keys, nulls_last=True)
        assert_frame_equal(got, want, check_exact=False, rel_tol=1e-9)


def test_paper_finding_cublas_grids_are_small(sample_store) -> None:
    """The paper's §5: cuBLAS runs convolutions one image at a time, so its conv layers' RU is
    far below cuDNN's (RU about 47 % there; above 95 % with cuDNN)."""
    def conv_ru(name: str) -> float:
        frame = ru_table(sample_store, trace_id(sample_store, name), GroupBy.layer)
        conv = frame.filter(pl.col("layer").str.contains(r"^b?conv\d$"))
        return float((conv["ru"] * conv["total_ns"]).sum() / conv["total_ns"].sum())

    assert conv_ru("alexnet_b256_cudnn") > 0.9
    assert conv_ru("alexnet_b256_nocudnn") < 0.5


def test_device_limits_from_the_trace(sample_store) -> None:
    limits = device_limits(sample_store, trace_id(sample_store, "ddp_resnet18_2gpu"))
    assert sorted(limits) == [0, 1]
    gpu, sms = limits[0]
    assert sms == 132 and gpu.smem_per_sm == 233472 and gpu.smem_per_block_optin == 232448
    gpu, sms = device_limits(sample_store, trace_id(sample_store, "lenet_b256_cudnn"), cc="8.0", sms=108)[0]
    assert (gpu.cc_major, sms) == (8, 0) or (gpu.cc_major, gpu.cc_minor, sms) == (8, 0, 108)
    with pytest.raises(MissingDataError):
        device_limits(sample_store, trace_id(sample_store, "lenet_b256_cudnn"), cc="nine")


def test_ru_cli(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    assert runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    rows = json.loads(runner.invoke(app, ["ru", "--by", "layer", "--db", str(db), "-f", "json"]).stdout)
    assert {"layer", "pass", "library", "limiter", "kernels", "total_ns", "occupancy", "waves", "ru",
            "paper_ru", "kineto_occupancy"} <= set(rows[0])
    assert all(r["ru"] is None or 0 < r["ru"] <= 1 for r in rows)
    table = runner.invoke(app, ["ru", "-k", "5", "--db", str(db)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "RU %" in table.stdout and "Limiter" in table.stdout
    assert len([line for line in table.stdout.splitlines() if line.startswith("│")]) == 5
    bad = runner.invoke(app, ["ru", "--cc", "x", "--db", str(db)])
    assert bad.exit_code == 1 and bad.stderr.startswith("traceq: ")


# --- compute efficiency ----------------------------------------------------------------------

ALEXNET = SAMPLES / "alexnet.model.toml"
H200_FP32_PEAK = 2 * 1.98e9 * 128 * 132  # 2 x clock x FP32 lanes per SM x SMs (the trace's clock)
H200_TF32_PEAK = 2048 * 1.98e9 * 132  # Hopper whitepaper: 2048 dense TF32 FLOP per clock per SM


def test_batch_is_inferred_from_the_input_copies(sample_store) -> None:
    from traceq.analysis.efficiency.ce import infer_batch
    from traceq.analysis.structure.layers import attributed_kernels

    for name, sample_bytes, batch in (("alexnet_b256_cudnn", 3 * 227 * 227 * 4, 256),
                                      ("alexnet_b128_cudnn", 3 * 227 * 227 * 4, 128),
                                      ("lenet_b256_cudnn", 28 * 28 * 4, 256)):
        t = trace_id(sample_store, name)
        assert infer_batch(sample_store, t, attributed_kernels(sample_store, t), sample_bytes) == batch
    t = trace_id(sample_store, "alexnet_b256_cudnn")  # a wrong sample size divides nothing
    assert infer_batch(sample_store, t, attributed_kernels(sample_store, t), 3 * 224 * 224 * 4) is None


def test_ce_by_layer_is_equation_8_against_the_kernels_precision(sample_store) -> None:
    """The paper's equation 8, FLOPs over time over peak, with the peak of the precision the
    layer's kernels ran at: cuDNN's convolutions run TF32 tensor cores (their names say
    tf32f32_tf32f32 or f32f32_tf32f32), cuBLAS's fully connected GEMMs FP32 FMAs (ffma, simt)."""
    from traceq.analysis.efficiency.ce import ce_table
    from traceq.analysis.efficiency.flops import spec_layer_flops
    from traceq.analysis.structure.layers import attributed_kernels

    t = trace_id(sample_store, "alexnet_b256_cudnn")
    frame = ce_table(sample_store, t, "layer", spec=ALEXNET)
    spec = spec_layer_flops(ALEXNET, 256)
    kernels = attributed_kernels(sample_store, t)
    for layer, precision, peak, name_says in (("conv1", "tf32", H200_TF32_PEAK, "tf32"),
                                              ("bconv3", "tf32", H200_TF32_PEAK, "tf32"),
                                              ("fc6", "fp32", H200_FP32_PEAK, "ffma")):
        row = frame.filter(pl.col("layer") == layer).row(0, named=True)
        step = spec.filter(pl.col("layer") == layer)["flops"][0]
        assert row["flops"] == pytest.approx(4 * step)  # four iterations, one range each
        layer_kernels = kernels.filter(pl.col("layer") == layer)
        time_ns = layer_kernels["dur_ns"].sum()
        assert row["total_ns"] == time_ns
        doers = layer_kernels.filter(pl.col("operation").is_in(["convolution", "gemm"])
                                     & ~pl.col("name").str.contains("init_device_workspace"))  # cuDNN's setup
        assert doers.height and doers["name"].str.contains(name_says).all()
        assert row["precision"] == precision
        assert row["ce"] == pytest.approx(4 * step / (time_ns * 1e-9) / peak, rel=1e-3)
        assert row["tflops"] == pytest.approx(4 * step / time_ns / 1e3)
        assert row["peak_tflops"] == pytest.approx(peak / 1e12)
    # cuDNN's convolutions exceed the FP32 peak (which only tensor cores explain) but not TF32's
    conv2 = frame.filter(pl.col("layer") == "conv2").row(0, named=True)
    assert conv2["tflops"] * 1e12 > H200_FP32_PEAK and 0 < conv2["ce"] < 1 and conv2["tensor_core_pct"] > 50


def test_paper_finding_cudnn_conv_ce_beats_cublas(sample_store) -> None:
    """The paper: cuDNN's convolution CE is about 2x cuBLAS's, both against the FP32 peak, i.e. in
    achieved FLOP/s (here: far more, TF32 tensor cores). Against each one's own precision's peak
    both stay below 100 %."""
    from traceq.analysis.compare.side_by_side import compare_runs

    a, b = trace_id(sample_store, "alexnet_b256_cudnn"), trace_id(sample_store, "alexnet_b256_nocudnn")
    frame, _ = compare_runs(sample_store, a, b, "layer", spec=ALEXNET)
    conv = frame.filter(pl.col("layer").str.contains(r"^b?conv\d$") & pl.col("a_tflops").is_not_null())
    assert conv.height >= 9 and (conv["a_tflops"] > 2 * conv["b_tflops"]).all()
    assert (conv["a_ce"] <= 1).all() and (conv["b_ce"] <= 1).all()
    fc = frame.filter(pl.col("layer").str.contains(r"^b?fc\d$"))  # the same cuBLAS GEMMs in both
    assert ((fc["a_ce"] / fc["b_ce"] - 1).abs() < 0.15).all()


def test_ce_without_flops_says_how_to_get_them(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    assert runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    result = runner.invoke(app, ["ce", "--db", str(db)])
    assert result.exit_code == 1 and "emit_nvtx(record_shapes=True)" in result.stderr and "--spec" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    rows = json.loads(runner.invoke(app, ["ce", "--spec", str(SAMPLES / "lenet.model.toml"), "--db", str(db),
                                          "-f", "json"]).stdout)
    assert {r["layer"] for r in rows} == {"conv1", "conv2", "fc1", "fc2", "bconv1", "bconv2", "bfc1", "bfc2"}
    bad = runner.invoke(app, ["ce", "--spec", str(tmp_path / "missing.toml"), "--db", str(db)])
    assert bad.exit_code == 1 and bad.stderr.startswith("traceq: ")


def test_ce_from_recorded_shapes(resnet50_store) -> None:
    from traceq.analysis.efficiency.ce import ce_table

    con, t = resnet50_store
    frame = ce_table(con, t, "layer")
    convs = frame.filter(pl.col("layer").str.starts_with("conv2d #"))  # emit_nvtx: layers by op sequence
    forward, backward = (convs.filter(pl.col("pass") == p) for p in ("forward", "backward"))
    assert forward.height == backward.height == 53  # ResNet-50's convolutions
    # ~4.09 G multiply-adds per 224x224 image in the convs, batch 32, 40 iterations
    assert forward["flops"].sum() == pytest.approx(2 * 4.09e9 * 32 * 40, rel=0.01)
    assert forward["flops"].sum() / (forward["total_ns"].sum() * 1e-9) > H200_FP32_PEAK  # tensor cores, all convs
    tf32 = forward.filter(pl.col("precision") == "tf32")
    assert tf32["total_ns"].sum() > 0.5 * forward["total_ns"].sum()
    heaviest = tf32.sort("total_ns", descending=True).row(0, named=True)
    assert heaviest["tensor_core_pct"] > 50 and heaviest["ce"] == pytest.approx(heaviest["tflops"] * 1e12 / H200_TF32_PEAK)
    assert 1.9 < backward["flops"].sum() / forward["flops"].sum() < 2.0  # twice the forward, less conv1's data gradient


# --- CE never above the peak -------------------------------------------------------------------

SPECS = {"alexnet": ALEXNET, "lenet": SAMPLES / "lenet.model.toml", "resnet50": None}  # resnet50: shapes
H200_FP16_PEAK = 4096 * 1.98e9 * 132  # Hopper whitepaper: 4096 dense FP16 FLOP per clock per SM


def _corpus_with_shapes() -> list[Path]:
    """The third-party nsys and nvprof exports whose NVTX ranges carry emit_nvtx op shapes (so
    traceq can count their FLOPs), found with sqlite3 alone."""
    import sqlite3

    from conftest import shared_files

    found = []
    for path in shared_files("realtraces", "nsys_sqlite/*.sqlite") + shared_files("realtraces", "nvprof_sqlite/*"):
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "NVTX_EVENTS" in tables and con.execute(
                    "SELECT count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                    "WHERE coalesce(e.text, s.value) LIKE '%, sizes = %'").fetchone()[0]:
                found.append(path)
            elif "CUPTI_ACTIVITY_KIND_MARKER" in tables and con.execute(
                    "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MARKER m JOIN StringTable s ON s._id_ = m.name "
                    "WHERE s.value LIKE '%, sizes = %'").fetchone()[0]:
                found.append(path)
        finally:
            con.close()
    return found


def _assert_ce_at_most_1(con, t: int, spec: Path | None) -> int:
    """Every CE of the trace, by layer, kernel and library, is at most 1; returns the rows seen."""
    from traceq.analysis.efficiency.ce import ce_table, kernel_ce

    per_kernel = kernel_ce(con, t, spec=spec)
    rows = 0
    for by in GroupBy:
        ce = ce_table(con, t, by, per_kernel=per_kernel)["ce"].drop_nulls()
        assert ce.len() and (ce <= 1).all() and (ce > 0).all(), (t, by.value, ce.max())
        rows += ce.len()
    return rows


@pytest.mark.parametrize("name", [p.stem for p in sorted(SAMPLES.glob("*.sqlite")) if p.stem.split("_")[0] in SPECS])
def test_ce_never_exceeds_the_peak_on_the_samples(sample_store, name: str) -> None:
    """A CE above 100 % is a bug, never a result: every sample CE can be computed for (its spec,
    or the shapes it recorded): all but the DDP trace."""
    assert _assert_ce_at_most_1(sample_store, trace_id(sample_store, name), SPECS[name.split("_")[0]]) >= 10


def test_ce_never_exceeds_the_peak_with_recorded_shapes(resnet50_store, tmp_path: Path) -> None:
    """The reference ResNet-50 (emit_nvtx shapes), and every nsys or nvprof corpus export with
    shapes (none today: the corpus's PyTorch captures under nsys record no shapes)."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    con, t = resnet50_store
    assert _assert_ce_at_most_1(con, t, None) >= 10
    store = open_store(tmp_path / "corpus.duckdb", create=True)
    for path in _corpus_with_shapes():
        _assert_ce_at_most_1(store, load_trace(store, path).trace_id, None)


def _kineto_with_shapes_and_gpu() -> list[Path]:
    """The corpus's Kineto traces that record operator shapes and a GPU's compute capability
    (found by a byte search of the JSON, not by traceq)."""
    import gzip

    from conftest import shared_files

    found = []
    for path in shared_files("realtraces", "kineto_json/*.json*"):
        data = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        if b'"computeMajor"' in data and b'"Input Dims"' in data:
            found.append(path)
    return found


def test_ce_never_exceeds_the_peak_on_kineto_traces(tmp_path: Path) -> None:
    """Every Kineto trace CE can be computed for: the samples (fp32 and fp16 autocast AlexNet) and
    the corpus's (H100 transformers, DLRM, HTA's, ResNet-50 on V100); the others lack a CUDA
    compute capability (AMD, B200 without device properties) or FLOP-bearing operators. ~10 s."""
    from traceq.api.loading import load_trace
    from traceq.errors import MissingDataError
    from traceq.store import open_store

    store = open_store(tmp_path / "kineto.duckdb", create=True)
    computed = 0
    for path in [*sorted(SAMPLES.glob("*.json")), *_kineto_with_shapes_and_gpu()]:
        t = load_trace(store, path).trace_id
        try:
            _assert_ce_at_most_1(store, t, None)
        except MissingDataError:
            continue
        computed += 1
    assert computed >= 2 + (11 if _kineto_with_shapes_and_gpu() else 0)


def test_an_operators_recorded_dtype_decides_where_the_name_says_nothing(tmp_path: Path) -> None:
    """Kineto records each operator's input types: under fp16 autocast, cuDNN's workspace
    kernels (names without a type) launched by convolutions on c10::Half inputs are fp16; the
    same kernels in the fp32 run are fp32 (a workspace initialisation runs nothing on tensor
    cores, so not TF32). They are helpers, not convolutions: no FLOPs; every FLOP is on a kernel
    whose name says its precision."""
    from traceq.analysis.efficiency.ce import kernel_ce
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    store = open_store(tmp_path / "kineto.duckdb", create=True)
    for name, expected, input_type in (("alexnet_b256_amp_kineto.json", "fp16", "c10::Half"),
                                       ("alexnet_b256_kineto.json", "fp32", "float")):
        path = sample(name)
        types = {e.get("args", {}).get("Input type", [None])[0] for e in json.loads(path.read_text())["traceEvents"]
                 if e.get("cat") == "cpu_op" and e.get("name") == "aten::cudnn_convolution"}
        assert types == {input_type}  # what the JSON itself says
        k = kernel_ce(store, load_trace(store, path).trace_id)
        workspace = k.filter(pl.col("name").str.contains("init_device_workspace"))
        assert workspace.height and set(workspace["precision_from"]) == {"operator dtype"}
        assert set(workspace["precision"]) == {expected} and workspace["flops"].sum() == 0
        assert set(k.filter(pl.col("flops") > 0)["precision_from"]) == {"kernel name"}


# --- library by the operation that launched the kernel ----------------------------------------

def test_gemms_launched_by_convolutions_are_cudnn(resnet50_store) -> None:
    """ResNet-50 under emit_nvtx: cuDNN runs some convolutions as CUTLASS or cuBLAS GEMMs. Every
    kernel whose innermost op range (found here with SQL: the latest range on the launching
    thread that encloses the launch) is aten::cudnn_convolution or aten::convolution_backward is
    cuDNN's; its name's library stays its implementation."""
    from traceq.analysis.structure.layers import attributed_kernels

    con, t = resnet50_store
    innermost = con.sql(f"""
        SELECT k.kernel_id, arg_max(regexp_extract(n.name, '^([^,]+)', 1), n.start_ns) AS op
        FROM kernel_launches k JOIN nvtx n ON n.trace_id = k.trace_id AND n.pid = k.pid
          AND n.tid = k.launch_tid AND n.kind = 'pushpop'
          AND n.start_ns <= k.launch_start_ns AND k.launch_start_ns < n.end_ns
        WHERE k.trace_id = {t} GROUP BY 1""").pl()
    k = attributed_kernels(con, t).join(innermost, on="kernel_id", how="left")
    conv = k.filter(pl.col("op").is_in(["aten::cudnn_convolution", "aten::convolution_backward"]))
    gemms = conv.filter(pl.col("implementation") == "cuBLAS")
    assert gemms.height >= 3000 and gemms["name"].str.contains("gemm").all()
    assert set(conv["library"]) == {"cuDNN"}
    assert set(k.filter(pl.col("op").is_in(["aten::addmm", "aten::mm"]))["library"]) == {"cuBLAS"}
    assert k.filter(pl.col("library") != pl.col("implementation")).height == gemms.height


def test_ce_by_library_counts_only_the_kernels_that_carry_flops(resnet50_store) -> None:
    """cuBLAS keeps only the fully connected layer, whose FLOPs are analytic: 2 x batch 32 x
    2048 x 1000 forward, twice that backward (data and weight gradients), 40 iterations. Each
    library's time is its FLOP-carrying kernels; the others' (batch norm, elementwise) is
    no_flops_ns, and the two add up to all kernel time."""
    from traceq.analysis.efficiency.ce import ce_table
    from traceq.analysis.structure.layers import attributed_kernels

    con, t = resnet50_store
    frame = ce_table(con, t, "library")
    rows = {r["library"]: r for r in frame.iter_rows(named=True)}
    assert rows["cuBLAS"]["flops"] == 3 * 2 * 32 * 2048 * 1000 * 40
    assert rows["cuDNN"]["no_flops_ns"] > 0 and rows["PyTorch ATen"]["flops"] == 0
    assert rows["PyTorch ATen"]["total_ns"] == 0 and rows["PyTorch ATen"]["ce"] is None
    kernels = attributed_kernels(con, t)
    assert frame["total_ns"].sum() + frame["no_flops_ns"].sum() == kernels["dur_ns"].sum()
    norm = kernels.filter((pl.col("library") == "cuDNN") & (pl.col("operation") == "normalization"))["dur_ns"].sum()
    assert rows["cuDNN"]["no_flops_ns"] >= norm > 0  # batch norm is cuDNN's, and carries no FLOPs
    assert 0 < rows["cuDNN"]["ce"] <= 1 and 0 < rows["cuBLAS"]["ce"] <= 1


def test_amp_ce_is_against_the_fp16_peak(sample_store) -> None:
    """AlexNet under fp16 autocast: cuDNN's and cuBLAS's kernels say f16 (xmma f16f16_f16f32,
    nvjet hsh), and their fastest reach 700 TFLOP/s, above the TF32 peak a float32 reading would
    divide by (CE 130 %); against the FP16 peak every CE stays below 100 %."""
    from traceq.analysis.efficiency.ce import ce_table
    from traceq.analysis.efficiency.flops import spec_layer_flops
    from traceq.analysis.structure.layers import attributed_kernels

    t = trace_id(sample_store, "alexnet_b256_amp")
    by_layer = ce_table(sample_store, t, "layer", spec=ALEXNET)
    conv2 = by_layer.filter(pl.col("layer") == "conv2").row(0, named=True)
    kernels = attributed_kernels(sample_store, t).filter(pl.col("layer") == "conv2")
    doers = kernels.filter(pl.col("operation") == "convolution")
    assert doers.height and doers["name"].str.contains("f16f16_f16f32").all()
    step = spec_layer_flops(ALEXNET, 256).filter(pl.col("layer") == "conv2")["flops"][0]
    assert conv2["precision"] == "fp16"
    assert conv2["ce"] == pytest.approx(4 * step / (kernels["dur_ns"].sum() * 1e-9) / H200_FP16_PEAK, rel=1e-3)
    by_kernel = ce_table(sample_store, t, "kernel", spec=ALEXNET)
    assert by_kernel["tflops"].max() * 1e12 > H200_TF32_PEAK and (by_kernel["ce"].drop_nulls() <= 1).all()
    fp16 = by_kernel.filter(pl.col("precision") == "fp16")
    assert fp16["flops"].sum() > 0.9 * by_kernel["flops"].sum()


def test_amp_ce_from_recorded_shapes(sample_store) -> None:
    """ResNet-50 under fp16 autocast and emit_nvtx: the convolutions' FLOPs from the recorded
    shapes (4.09 G multiply-adds per image, batch 32, 5 iterations), CE against the FP16 peak."""
    from traceq.analysis.efficiency.ce import ce_table

    frame = ce_table(sample_store, trace_id(sample_store, "resnet50_b32_amp_ops"), "layer")
    forward = frame.filter(pl.col("layer").str.starts_with("conv2d #") & (pl.col("pass") == "forward"))
    assert forward["flops"].sum() == pytest.approx(2 * 4.09e9 * 32 * 5, rel=0.01)
    assert forward["precision"].str.starts_with("fp16").all() and forward["ce"].is_between(0, 1, closed="none").all()
    assert (frame["ce"] <= 1).all()


# --- no FLOPs dropped ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["alexnet_b256_cudnn", "alexnet_b256_nocudnn", "alexnet_b256_amp", "lenet_b256_cudnn"])
def test_flops_add_up_to_the_spec(sample_store, name: str) -> None:
    """Every FLOP of the spec lands in some row, by layer, kernel and library: the spec's
    per-step FLOPs (its own formulas, tests/test_flops.py) times the steps, here one range per
    layer and iteration."""
    from traceq.analysis.efficiency.ce import ce_table
    from traceq.analysis.efficiency.flops import spec_layer_flops

    spec = SPECS[name.split("_")[0]]
    t = trace_id(sample_store, name)
    iterations = sample_store.execute("SELECT count(*) FROM nvtx WHERE trace_id = ? AND name LIKE 'iteration %'",
                                      [t]).fetchall()[0][0]
    total = spec_layer_flops(spec, 256)["flops"].sum() * iterations
    for by in GroupBy:
        frame = ce_table(sample_store, t, by, spec=spec)
        assert frame["flops"].sum() == pytest.approx(total, rel=1e-9), by
        assert frame.filter(pl.col("flops") > 0)["kernels"].min() > 0, by  # all found kernels (bconv1 by rule)


def test_spec_layers_without_kernels_are_said_and_kept(tmp_path: Path) -> None:
    """A spec layer no kernel of the trace belongs to (here conv1 renamed convA, so neither
    convA nor bconvA has a range) keeps its FLOPs in a row of its own, and `ce` says so."""
    spec = tmp_path / "alexnet_renamed.toml"
    spec.write_text(ALEXNET.read_text().replace('name = "conv1"', 'name = "convA"'))
    db = tmp_path / "s.duckdb"
    assert runner.invoke(app, ["load", str(sample("alexnet_b256_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    result = runner.invoke(app, ["ce", "--spec", str(spec), "--db", str(db), "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = {(r["layer"], r["pass"]): r for r in json.loads(result.stdout)}
    from traceq.analysis.efficiency.flops import spec_layer_flops

    step = spec_layer_flops(spec, 256)
    for layer, pass_ in (("convA", "forward"), ("bconvA", "backward")):
        row = rows[(layer, pass_)]
        assert row["kernels"] == 0 and row["total_ns"] == 0 and row["ce"] is None
        assert row["flops"] == 4 * step.filter(pl.col("layer") == layer)["flops"][0]
        assert f"{layer} ({pass_}): the spec's" in result.stderr
    assert sum(r["flops"] for r in rows.values()) == pytest.approx(4 * step["flops"].sum())
    library = json.loads(runner.invoke(app, ["ce", "--spec", str(spec), "--db", str(db), "--by", "library",
                                             "-f", "json"]).stdout)
    assert sum(r["flops"] for r in library) == pytest.approx(4 * step["flops"].sum())


def test_precision_option_sets_every_kernels_peak(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    assert runner.invoke(app, ["load", str(sample("alexnet_b256_cudnn.sqlite")), "--db", str(db)]).exit_code == 0
    args = ["ce", "--spec", str(ALEXNET), "--db", str(db), "-f", "json"]
    own = {r["layer"]: r for r in json.loads(runner.invoke(app, args).stdout)}
    forced = runner.invoke(app, [*args, "--precision", "fp16"])
    assert forced.exit_code == 0 and "note:" not in forced.stderr
    rows = {r["layer"]: r for r in json.loads(forced.stdout)}
    assert {r["precision"] for r in rows.values()} == {"fp16"}
    assert own["conv2"]["precision"] == "tf32" and own["fc6"]["precision"] == "fp32"
    for layer in ("conv2", "fc6"):
        assert rows[layer]["ce"] == pytest.approx(own[layer]["tflops"] * 1e12 / H200_FP16_PEAK)
    bad = runner.invoke(app, [*args, "--precision", "fp4"])
    assert bad.exit_code == 2 and "fp4" in bad.output


def test_no_op_with_flops_is_refused_before_any_kernel_is_read(sample_store, monkeypatch) -> None:
    """Without a spec, a trace whose ops carry no FLOPs (no shapes recorded) is refused before
    every launch is classified and given a peak (seconds at ten million launches)."""
    import traceq.analysis.efficiency.ce as efficiency
    from traceq.analysis.efficiency.ce import NO_FLOPS, ce_table
    from traceq.errors import MissingDataError

    def unread(*args, **kwargs):
        raise AssertionError("kernel_ce ran")

    monkeypatch.setattr(efficiency, "kernel_ce", unread)
    with pytest.raises(MissingDataError, match="no FLOPs"):
        ce_table(sample_store, trace_id(sample_store, "alexnet_b256_cudnn"))
    assert NO_FLOPS.startswith("no FLOPs")
    with pytest.raises(AssertionError, match="kernel_ce ran"):  # shapes recorded: the kernels are read
        ce_table(sample_store, trace_id(sample_store, "resnet50_b32_amp_ops"))
