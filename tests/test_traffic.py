"""`traceq traffic` and `analysis.efficiency.traffic` on real traces: the GEMM each launch is given, the whole
path from an nsys trace to bytes checked against Nsight Compute's counters of the same run, the
what-if on another GPU, and the command's output and refusals. About 6 s."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import polars as pl
import pytest
from conftest import SAMPLES, ncu_layer, ncu_rows, sample
from typer.testing import CliRunner

from traceq.cli import app

runner = CliRunner()
NCU = SAMPLES / "ncu"
SPEC = SAMPLES / "alexnet.model.toml"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    """A store with the AlexNet sample (H200, cuDNN) and the AlexNet FP32 trace Nsight Compute
    recorded the counters of (same GPU, same network)."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    db = tmp_path_factory.mktemp("traffic") / "t.duckdb"
    con = open_store(db, create=True)
    ids = {path.stem: load_trace(con, path).trace_id
           for path in (sample("alexnet_b256_cudnn.sqlite"), NCU / "alexnet_b256_fp32.sqlite")}
    con.close()
    con = open_store(db, read_only=True)  # as the command opens it, so both can be open at once
    yield con, ids, db
    con.close()


def _expected_gemms(shapes: dict) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(layer, direction) -> M, N, K as CUTLASS lowers a convolution, and as a linear layer's
    three GEMMs are (with M and N in either order), from the hook-recorded shapes."""
    out = {}
    for name, s in shapes.items():
        if s["type"] == "Conv2d":
            (n, c, h, w), (_, k, p, q), (_, _, r, t) = s["input"], s["output"], s["weight"]
            out[(name, "fprop")] = (n * p * q, k, c * r * t)
            out[("b" + name, "dgrad")] = (n * h * w, c, k * r * t)
            out[("b" + name, "wgrad")] = (k, c * r * t, n * p * q)
        elif s["type"] == "Linear":
            (rows, inputs), (outputs, _) = s["input"], s["weight"]
            out[(name, "fprop")] = (outputs, rows, inputs)
            out[("b" + name, "dgrad")] = (inputs, rows, outputs)
            out[("b" + name, "wgrad")] = (outputs, inputs, rows)
    return out


def test_hand_written_spec_gives_the_gemms_of_the_recorded_shapes(store) -> None:
    """The AlexNet sample with sample_traces/alexnet.model.toml (written from a Kineto trace):
    every convolution and GEMM kernel of every layer gets the GEMM that the shapes recorded by
    module hooks on the same network give."""
    from traceq.analysis.efficiency.traffic import launch_traffic

    con, ids, _ = store
    expected = _expected_gemms(json.loads((NCU / "alexnet_b256_fp32_shapes.json").read_text()))
    launches = launch_traffic(con, ids["alexnet_b256_cudnn"], spec=SPEC).filter(pl.col("m").is_not_null())
    # conv1's weight gradient runs after bconv1's range closed (bconv1 by rule, analysis/structure/inference.py)
    # on the 3 input channels padded to 4: its grid has 4 tiles of 128 along C x R x S (363 needs 3)
    m, n, k = expected[("bconv1", "wgrad")]
    expected[("bconv1", "wgrad")] = (m, n // 3 * 4, k)
    seen = set()
    for row in launches.iter_rows(named=True):
        m, n, k = expected[(row["layer"], row["direction"])]
        assert (row["k"], {row["m"], row["n"]}) == (k, {m, n}), row
        seen.add((row["layer"], row["direction"]))
    assert seen == set(expected) - {("bconv1", "dgrad")}  # conv1 has no data gradient


def _ncu_layers(path: Path) -> dict[tuple[str, str], list[float]]:
    """(layer, kernel name) -> DRAM bytes of each launch, from an Nsight Compute CSV."""
    out: dict[tuple[str, str], list[float]] = {}
    for row in ncu_rows(path):
        bytes_ = sum(float(row[f"dram__bytes_{way}.sum"].replace(",", "")) for way in ("read", "write"))
        out.setdefault((ncu_layer(row), row["Kernel Name"]), []).append(bytes_)
    return out


def test_from_the_trace_alone_dram_bytes_match_nsight_compute(store) -> None:
    """The whole path: the nsys trace, its layer ranges, the layer-shapes file, no cluster sizes
    (nsys records none): each modelled kernel's DRAM bytes against what Nsight Compute counted
    for the same kernel of the same layer in the same run, median error within 20 %."""
    from traceq.analysis.efficiency.traffic import launch_traffic

    con, ids, _ = store
    measured = _ncu_layers(NCU / "alexnet_b256_fp32_ncu.csv.gz")
    launches = launch_traffic(con, ids["alexnet_b256_fp32"], spec=NCU / "alexnet_b256_fp32_shapes.json")
    per_kernel = (launches.filter(pl.col("dram_bytes").is_not_null())
                  .group_by("layer", "name").agg(pl.col("dram_bytes").mean()))
    errors = [abs(predicted - statistics.mean(measured[(layer, name)])) / statistics.mean(measured[(layer, name)])
              for layer, name, predicted in per_kernel.iter_rows() if (layer, name) in measured]
    assert len(errors) >= 20
    assert statistics.median(errors) <= 0.20


def test_layer_rows_sum_their_launches(store) -> None:
    from traceq.analysis.efficiency.traffic import launch_traffic, traffic_table

    con, ids, _ = store
    trace = ids["alexnet_b256_cudnn"]
    layers = traffic_table(con, trace, "layer", spec=SPEC)
    launches = launch_traffic(con, trace, spec=SPEC).filter(pl.col("predicted_ns").is_not_null())
    conv2 = launches.filter(pl.col("layer") == "conv2")
    row = layers.filter(pl.col("layer") == "conv2").row(0, named=True)
    assert row["launches"] == conv2.height == 4  # four iterations
    assert row["measured_ns"] == conv2["measured_ns"].sum()
    assert row["dram_bytes"] == pytest.approx(conv2["dram_bytes"].sum())
    assert row["achieved_pct"] == pytest.approx(100 * conv2["here_ns"].sum() / conv2["measured_ns"].sum())


def test_what_if_on_another_gpu(store) -> None:
    from traceq.analysis.efficiency.traffic import traffic_table

    con, ids, _ = store
    here = traffic_table(con, ids["alexnet_b256_cudnn"], "layer", spec=SPEC)
    v100 = traffic_table(con, ids["alexnet_b256_cudnn"], "layer", spec=SPEC, gpu="V100-SXM2")
    assert "expected_ns" not in here.columns and "expected_ns" in v100.columns
    joined = here.join(v100, on=["layer", "pass", "direction", "m", "n", "k"], suffix="_v100")
    assert joined.height == here.height
    assert (joined["predicted_ns_v100"] > joined["predicted_ns"]).all()  # a V100 is slower at everything
    assert (joined["here_ns_v100"] == joined["here_ns"]).all()


def test_cli_table_and_json(store) -> None:
    _, ids, db = store
    table = runner.invoke(app, ["traffic", "--db", str(db), "-t", "alexnet_b256_cudnn", "--spec", str(SPEC), "-k", "5"],
                          env={"COLUMNS": "230"})
    assert table.exit_code == 0, table.output
    assert "predicted on NVIDIA H200" in table.output and "Of bound %" in table.output
    conv1 = next(line for line in table.output.splitlines() if line.startswith("│ conv1 "))
    assert [c.strip() for c in conv1.split("│")[5:8]] == ["802,816", "64", "363"]  # its implicit GEMM M, N, K
    out = runner.invoke(app, ["traffic", "--db", str(db), "-t", "alexnet_b256_cudnn", "--spec", str(SPEC),
                              "--by", "kernel", "-f", "json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert {"name", "m", "n", "k", "tile", "l1_bytes", "shared_bytes", "l2_bytes", "dram_bytes", "flops", "bound",
            "predicted_ns", "measured_ns", "achieved_pct", "note"} <= set(rows[0])
    # split-K GEMMs are modelled with their splits; their reduction kernels are helpers, no GEMMs: not listed
    assert any(r["note"] and "split-K x" in r["note"] for r in rows)
    assert not any(re.search("splitKreduce|ReduceSplitK|init_device_workspace", r["name"]) for r in rows)


@pytest.mark.parametrize("args, words", [
    (["--gpu", "GeForce 256"], "not in traceq's product table"),
    ([], "no layer shapes: pass --spec"),
    (["--spec", "nope.toml"], "cannot read model spec"),
])
def test_cli_refusals(store, tmp_path: Path, args: list[str], words: str) -> None:
    _, _, db = store
    result = runner.invoke(app, ["traffic", "--db", str(db), "-t", "alexnet_b256_cudnn",
                                 *(args if "--spec" in args or not args else ["--spec", str(SPEC), *args])])
    assert result.exit_code == 1
    assert result.stderr.startswith("traceq: ") and words in result.stderr and result.stderr.count("\n") == 1


def test_shapes_recorded_by_emit_nvtx(resnet50_store) -> None:
    """ResNet-50 under emit_nvtx(record_shapes=True), no spec: the op ranges' shapes give most of
    the convolution and GEMM time a GEMM, and every forward convolution's is ResNet-50's at
    batch 32 (output sides 112, 56, 28, 14, 7; filters 7x7, 3x3, 1x1): N P Q x K x C R S when
    implicit, K x P Q x C for a 1x1 convolution cuDNN runs as a GEMM. ~3 s."""
    from traceq.analysis.efficiency.traffic import launch_traffic

    con, trace = resnet50_store
    launches = launch_traffic(con, trace)
    modelled = launches.filter(pl.col("predicted_ns").is_not_null())
    assert modelled["measured_ns"].sum() >= 0.9 * launches["measured_ns"].sum()
    fprop = modelled.filter(pl.col("direction") == "fprop").filter(pl.col("layer").str.starts_with("conv2d #"))
    assert fprop.height >= 2000
    sides, channels = {112 * 112, 56 * 56, 28 * 28, 14 * 14, 7 * 7}, {64, 128, 256, 512, 1024, 2048}
    for m, n, k in fprop.select("m", "n", "k").unique().iter_rows():
        assert any(k % taps == 0 and k // taps in {3, *channels} for taps in (49, 9, 1)), (m, n, k)
        if n in channels:  # implicit GEMM: N P Q x K x C R S
            assert m % 32 == 0 and m // 32 in sides, (m, n, k)
        else:  # explicit GEMM of a 1x1 convolution: K x P Q (one image, or all 32) x C
            assert m in channels and (n in sides or (n % 32 == 0 and n // 32 in sides)), (m, n, k)
