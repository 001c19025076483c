"""The report's roofline of `traceq roofline` (render/op_roofline.py): its points are the rows
`traceq roofline` positions, its roofs the GPU's DRAM bandwidth and dense peaks, on one trace
(the GPT under the plain profiler) and on the two ranks of a run (the GPT under FSDP). The
browser rules (no clipped or overlapping text, nothing empty shown as data) are checked with the
other figures in tests/test_report_browser.py."""

from __future__ import annotations

import pytest
from conftest import sample
from test_report import _figure
from typer.testing import CliRunner

pytestmark = pytest.mark.xdist_group("report")

H200_BF16 = 132 * 1.98e9 * 4096  # SMs x clock x dense bf16 FLOP per SM per clock
H200_DRAM = 4.814e12  # an H200 as nsys records it (TARGET_INFO_GPU of sample_traces/alexnet_b256_cudnn)


def _panel_points(data: list[dict], axis: str) -> set[tuple[float, float]]:
    return {(round(x, 6), round(y, 6)) for t in data if t.get("mode") == "markers"
            and t.get("xaxis", "x") == axis for x, y in zip(t["x"], t["y"])}


def _rounded(pairs) -> set[tuple[float, float]]:
    return {(round(x, 6), round(y, 6)) for x, y in pairs}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from traceq.cli import app

    db = tmp_path_factory.mktemp("oproof") / "s.duckdb"
    runner = CliRunner()
    files = [sample(f"conventions/gpt_kineto_fsdp_rank{r}.json.gz") for r in (0, 1)]
    for args in ([str(sample("conventions/gpt_kineto_plain.json.gz"))], [*map(str, files), "--run", "fsdp"]):
        result = runner.invoke(app, ["load", *args, "--db", str(db)])
        assert result.exit_code == 0, result.output
    return db


def _report(db, names: list[str]) -> str:
    import traceq
    from traceq.api.report import build_report

    s = traceq.open(db)
    ids = [s.trace(n).id for n in names]
    return build_report(s.con, ids)


def _check_panel(data: list[dict], layout: dict, table, flop_axis: str, byte_axis: str) -> None:
    placed = table.filter(table["intensity"].is_not_null() & (table["tflops"] > 0))
    assert _panel_points(data, flop_axis) == _rounded(zip(placed["intensity"], placed["tflops"]))
    no_flops = table.filter((table["flops"] <= 0) & (table["tbps"] > 0))
    assert _panel_points(data, byte_axis) == _rounded(zip(no_flops["bytes"] / 1e6, no_flops["tbps"]))
    assert placed.height + no_flops.height == table.filter(table["tflops"].is_not_null() | (table["tbps"] > 0)).height
    lines = [t for t in data if t.get("mode") == "lines" and t.get("xaxis", "x") == flop_axis]
    dram = next(t for t in lines if t["name"].startswith("DRAM"))
    assert dram["y"][0] / dram["x"][0] * 1e12 == pytest.approx(H200_DRAM, rel=1e-6)  # TFLOP/s per FLOP/byte
    peak = next(t for t in lines if "bf16" in t["name"])
    assert peak["y"][0] == pytest.approx(H200_BF16 / 1e12, rel=1e-6)
    assert peak["x"][0] == pytest.approx(H200_BF16 / H200_DRAM, rel=1e-6)  # the ridge point
    assert dram["x"][-1] == pytest.approx(peak["x"][0], rel=1e-6) and dram["y"][-1] == pytest.approx(peak["y"][0])
    names = [text for t in data if t.get("mode") == "text" and t.get("xaxis", "x") == flop_axis for text in t["text"]]
    longest = placed.sort("total_ns", descending=True).row(0, named=True)
    assert names and names[0][:5] == longest["layer"][:5], names  # the longest group is named first
    assert all(len(n) <= 22 for n in names)
    hovers = [t for t in data if t.get("mode") == "markers" and t.get("xaxis", "x") == flop_axis]
    assert all(t["customdata"] and "TFLOP/s" in t["hovertemplate"] for t in hovers)


def test_one_trace_shows_every_roofline_row(store) -> None:
    import traceq

    table = traceq.open(store).trace("gpt_kineto_plain").roofline("layer")
    data, layout = _figure(_report(store, ["gpt_kineto_plain"]), "op-roofline")
    _check_panel(data, layout, table, "x", "x2")
    assert layout["xaxis"]["type"] == "log" and layout["yaxis"]["type"] == "log"


def test_each_rank_of_a_run_has_its_panel(store) -> None:
    import traceq

    s = traceq.open(store)
    ranks = ["gpt_kineto_fsdp_rank0", "gpt_kineto_fsdp_rank1"]
    data, layout = _figure(_report(store, ranks), "op-roofline")
    for col, name in enumerate(ranks, start=1):
        table = s.trace(name).roofline("layer")
        _check_panel(data, layout, table, "x" if col == 1 else f"x{col}", f"x{len(ranks) + col}")
    titles = [a["text"] for a in layout["annotations"]]
    assert set(ranks) <= set(titles)


def test_a_trace_without_flops_or_bytes_says_why(tmp_path) -> None:
    """An nsys trace without shapes or spec: no figure drawn, a note with `traceq roofline`'s reason."""
    import traceq
    from traceq.api.report import build_report

    t = traceq.load(sample("conventions/gpt_nsys_train_step.sqlite"), tmp_path / "n.duckdb")
    page = build_report(t.con, [t.id])
    assert 'id="fig-op-roofline"' not in page
    assert "Roofline per layer and operation (traceq roofline)</h2><p>Not drawn: no kernel has FLOPs or bytes" in page


def test_layer_names_from_the_trace_reach_the_figure_escaped() -> None:
    """A layer is a trace's string: both rooflines' point labels and hover text carry it
    HTML-escaped (Plotly reads tags in text), never as markup."""
    import polars as pl

    from traceq.render.op_roofline import _hover, _names
    from traceq.render.roofline import _point_names

    frame = pl.DataFrame({"layer": ["<b>x</b>"], "pass": ["forward"], "operation": ["gemm"], "precision": ["bf16"],
                          "kernels": [1], "total_ns": [1000], "achieved_pct": [50.0], "direction": [None]})
    assert _names(frame) == ["&lt;b&gt;x&lt;/b&gt; fwd"]
    assert _hover(frame)[0][0] == "&lt;b&gt;x&lt;/b&gt; (forward), gemm"
    assert _point_names(frame) == ["&lt;b&gt;x&lt;/b&gt;"]
