"""`traceq report`: the HTML holds every figure once, embeds plotly.js once, needs no network,
and renders in a real browser (headless Chromium) without script errors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import plotly.offline
import pytest
from conftest import sample, trace_id
from typer.testing import CliRunner

from traceq.api.report import build_report
from traceq.cli import app
from traceq.render import figures
from traceq.render.report import FIGURE_KEYS, RUN_FIGURE_KEYS

pytestmark = pytest.mark.xdist_group("report")  # one worker builds its module fixtures once (--dist loadgroup)

runner = CliRunner()
SPEC = sample("alexnet.model.toml")
PAIR = ["alexnet_b256_cudnn", "alexnet_b256_nocudnn"]
ALL = ["alexnet_b256_cudnn", "alexnet_b256_nocudnn", "alexnet_b128_cudnn", "lenet_b256_cudnn", "ddp_resnet18_2gpu"]


@pytest.fixture(scope="module")
def pair_html(sample_store) -> str:
    """cuDNN vs cuBLAS at batch 256, with the AlexNet spec for CE: every figure can be drawn."""
    return build_report(sample_store, [trace_id(sample_store, n) for n in PAIR], spec=SPEC)


@pytest.fixture(scope="module")
def all_html(sample_store) -> str:
    """Every bundled sample side by side, no spec: some traces lack layers, FLOPs or memory events."""
    return build_report(sample_store, [trace_id(sample_store, n) for n in ALL])


def _figure_ids(page: str) -> list[str]:
    return re.findall(r'<div id="(fig-[a-z-]+)" class="plotly-graph-div"', page)


def _section(page: str, key: str) -> str:
    start = page.index(f'<section id="sec-{key}"')
    return page[start:page.index("</section>", start)]


def test_every_figure_is_present_with_title_and_caption(pair_html: str) -> None:
    assert _figure_ids(pair_html) == [f"fig-{k}" for k in FIGURE_KEYS]
    for key in FIGURE_KEYS:
        section = _section(pair_html, key)
        assert re.search(r'<p class="caption">[^<]{60,}</p>', section), key
        assert '"title":{"text":"' in section, key  # the figure's own title
    assert pair_html.count('class="caption"') == len(FIGURE_KEYS)
    assert "Not drawn" not in pair_html


def test_axis_titles_carry_units() -> None:
    """Every figure function labels its axes, and time, memory and efficiency axes say their unit."""
    import polars as pl

    stages = {"a": pl.DataFrame({"iteration": ["iteration 0"], "device_id": [0], "data_copy_ns": [1],
                                 "forward_ns": [2], "backward_ns": [3], "weight_update_ns": [0], "other_ns": [0],
                                 "idle_ns": [1]})}
    chart = figures.stage_chart(stages)
    assert chart.figure.layout.yaxis.title.text == "GPU time (ms)"
    assert chart.figure.layout.xaxis.title.text == "iteration"
    assert chart.title.startswith("Stage breakdown") and chart.caption.endswith(".")


def test_self_contained(pair_html: str) -> None:
    assert not re.search(r"<script[^>]*\bsrc=", pair_html), "no external scripts"
    assert not re.search(r"""<(link|img|iframe)[^>]*\b(href|src)=["']?https?:""", pair_html)
    bundle = plotly.offline.get_plotlyjs()
    assert pair_html.count(bundle[:200]) == 1 and bundle in pair_html, "plotly.js embedded exactly once"
    assert not re.search(r"https?://", pair_html.replace(bundle, "")), "no URL outside plotly.js itself"
    assert pair_html.count("<html") == 1 and pair_html.rstrip().endswith("</html>")
    assert len(pair_html) < 8_000_000


def test_side_by_side_names_every_trace(pair_html: str, all_html: str) -> None:
    for name in PAIR:
        assert _section(pair_html, "stages").count(name) >= 1
        assert f"{name}: iteration 0" in _section(pair_html, "timeline")
    for name in ALL:
        assert name in _section(all_html, "stages")
    # the DDP trace has no memory events, and only NCCL's own ranges for layers; CE has no
    # FLOPs and the roofline no traffic without a spec
    assert "ddp_resnet18_2gpu: no memory events: capture with `nsys profile --cuda-memory-usage=true" in all_html
    assert "ncclAllReduce" in _section(all_html, "layer-time")
    assert "fig-ce" not in all_html
    assert re.search(r'<section class="note"><h2>Compute efficiency per layer[^<]*</h2><p>Not drawn: ', all_html)
    assert re.search(r'<section class="note"><h2>Roofline per layer[^<]*</h2><p>Not drawn: no layer shapes', all_html)
    assert re.search(r'<section class="note"><h2>Roofline per layer and operation[^<]*</h2><p>Not drawn: no kernel '
                     r'has FLOPs or bytes', all_html)
    # the DDP trace is a run of two ranks: the run figures come after the others
    assert _figure_ids(all_html)[-len(RUN_FIGURE_KEYS):] == [f"fig-{k}" for k in RUN_FIGURE_KEYS]
    assert set(_figure_ids(all_html)) == {f"fig-{k}" for k in (*FIGURE_KEYS, *RUN_FIGURE_KEYS)
                                          if k not in ("ce", "roofline", "op-roofline")}


def test_cli_writes_the_report(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    loaded = runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")),
                                 str(sample("alexnet_b128_cudnn.sqlite")), "--db", str(db)])
    assert loaded.exit_code == 0, loaded.output
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", "lenet_b256_cudnn", "2", "--db", str(db), "-o", str(out),
                                 "--title", "LeNet vs AlexNet"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == f"traceq: wrote {out}"
    page = out.read_text()
    assert "<title>LeNet vs AlexNet</title>" in page and "alexnet_b128_cudnn" in page
    latest = tmp_path / "latest.html"
    result = runner.invoke(app, ["report", "--db", str(db), "-o", str(latest)])
    assert result.exit_code == 0, result.output
    assert "traceq report: alexnet_b128_cudnn</title>" in latest.read_text()
    missing = runner.invoke(app, ["report", "nope", "--db", str(db), "-o", str(tmp_path / "x.html")])
    assert missing.exit_code == 1 and missing.stderr.startswith("traceq: no trace 'nope' in the store")
    assert not (tmp_path / "x.html").exists()


def _figure(page: str, key: str) -> tuple[list[dict], dict]:
    """(traces, layout) of figure `key` as the page hands them to Plotly.newPlot."""
    start = page.index(f'"fig-{key}",', page.index(f'id="fig-{key}"'))
    decoder = json.JSONDecoder()
    rest = page[page.index("[", start):]
    data, end = decoder.raw_decode(rest)
    layout, _ = decoder.raw_decode(rest[rest.index("{", end):])
    return data, layout


def _notes(layout: dict) -> list[dict]:
    """The figure's annotations that are not subplot titles."""
    return [a for a in layout.get("annotations", []) if a.get("yanchor") != "bottom"]


def _panel_of(layout: dict, note: dict) -> int:
    """The panel (1, 2, ...) whose domain holds a note placed on the page (paper coordinates)."""
    assert note["xref"] == "paper" and note["yref"] == "paper", "a note must be placed by its panel's domain"
    for i in range(1, 10):
        x, y = layout.get(f"xaxis{'' if i == 1 else i}"), layout.get(f"yaxis{'' if i == 1 else i}")
        if x and x["domain"][0] <= note["x"] <= x["domain"][1] and y.get("domain", [0, 1])[0] <= note["y"] <= \
                y.get("domain", [0, 1])[1]:
            return i
    raise AssertionError(f"note outside every panel: {note['text'][:60]}")


def test_memory_figure_says_what_a_warm_allocator_hides(pair_html: str) -> None:
    """The samples were captured with PyTorch's caching allocator warm: every byte was allocated
    before the capture. The figure says so in each trace's panel with the peak (the same 3.0 and
    2.4 GiB `traceq memory` prints), draws no '(before capture)' bar, and shows the layers'
    output sizes from the model spec: relu1's is 256 x 64 x 56 x 56 fp32 values."""
    data, layout = _figure(pair_html, "memory-layers")
    assert not any("(before capture)" in str(x) for trace in data for x in trace.get("x", []))
    notes = {_panel_of(layout, n): n["text"].replace("<br>", " ") for n in _notes(layout)}
    assert "the 3.0 GiB in use were allocated before it began" in notes[1] and "Peak in use: 3.0 GiB" in notes[1]
    assert "the 2.4 GiB in use were allocated before it began" in notes[2]
    estimates = [t for t in data if t.get("legendgroup") == "estimate"]
    assert len(estimates) == 2
    relu1 = dict(zip(estimates[0]["x"], estimates[0]["y"]))["relu1"]
    assert relu1 == pytest.approx(256 * 64 * 56 * 56 * 4 / (1 << 20))


def test_activation_estimates_match_the_allocations_measured_without_caching(sample_store) -> None:
    """alexnet_b64_nocache allocated every tensor with cudaMalloc inside its layer's range: the
    spec's output sizes at batch 64 equal what the ReLU and fully connected layers allocated in
    each of the trace's two iterations (max pooling also keeps its indices; convolutions, workspaces)."""
    import polars as pl

    from traceq.analysis.efficiency.modelspec import spec_activations
    from traceq.analysis.memory import memory_by_layer

    measured = memory_by_layer(sample_store, trace_id(sample_store, "alexnet_b64_nocache"))
    estimate = dict(spec_activations(SPEC, 64).iter_rows())
    for layer in ("relu1", "relu2", "relu3", "relu4", "relu5", "fc6", "fc7", "fc8"):
        allocated = int(measured.filter(pl.col("layer") == layer)["alloc_bytes"].sum())
        assert estimate[layer] * 2 == allocated, layer


def test_notes_sit_inside_their_own_panel(all_html: str) -> None:
    """A trace without the data says so in its own panel (the DDP trace has no memory events: its
    note is in the third of the five memory panels), placed by the panel's domain so that it shows
    even where the panel has no axes; nothing is said twice under the figure."""
    _, layout = _figure(all_html, "memory-layers")
    ddp = [n for n in _notes(layout) if "no memory events" in n["text"]]
    assert len(ddp) == 1 and _panel_of(layout, ddp[0]) == ALL.index("ddp_resnet18_2gpu") + 1
    for key in ("stages", "layer-time", "ru", "memory-layers"):
        _, layout = _figure(all_html, key)
        for note in _notes(layout):
            _panel_of(layout, note)
    assert "panel-note" not in all_html


def test_longest_launches_name_each_kernel_in_full_on_hover(pair_html: str) -> None:
    """The bars of the longest launches are the trace's longest kernels, in order, and each
    hover gives the kernel's full demangled name, as the export itself records them."""
    import html as html_lib
    import sqlite3

    data, _ = _figure(pair_html, "top")
    bars = sorted(((y, x, c[0]) for t in data if t.get("xaxis", "x") == "x"
                   for y, x, c in zip(t["y"], t["x"], t["customdata"])), key=lambda b: int(b[0].split(".")[0]))
    assert len(bars) == 15
    con = sqlite3.connect(f"file:{sample('alexnet_b256_cudnn.sqlite')}?mode=ro", uri=True)
    names = {r[0] for r in con.execute("SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                       "JOIN StringIds s ON s.id = k.demangledName")}
    con.close()
    for _, _, hover in bars:
        assert html_lib.unescape(hover.replace("<br>", "")) in names
    times = [x for _, x, _ in bars]
    assert times == sorted(times, reverse=True) and times[0] == pytest.approx(1.698, abs=0.002)


def test_panels_share_an_axis_only_when_their_scales_compare(all_html: str, pair_html: str) -> None:
    """LeNet's iterations (about 5 ms) next to the cuBLAS AlexNet's (122 ms): each panel of the
    stage figure gets its own y axis; cuDNN against cuBLAS at batch 256 (18 against 122 ms)
    share one, which shows the 7x at a glance."""
    _, layout = _figure(all_html, "stages")
    assert "matches" not in layout["yaxis2"]
    _, layout = _figure(pair_html, "stages")
    assert layout["yaxis2"]["matches"] == "y"


# --------------------------------------------------------------------------- in a real browser

def _chromium() -> str:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.skip("no headless Chromium (Debian: apt-get install chromium): the browser test is skipped")


def _open(page: Path, tmp_path: Path) -> tuple[str, str]:
    """(DOM after scripts ran, browser log) of `page` in headless Chromium, offline."""
    profile = tmp_path / f"profile-{page.stem}"
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-extensions", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
               "--virtual-time-budget=15000", "--dump-dom", page.as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, result.stderr


def _console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if ":CONSOLE" in line and ("Uncaught" in line or "Error" in line)]


def test_browser_check_sees_script_errors(tmp_path: Path) -> None:
    """The check below is not vacuous: a page that throws is caught by it."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><body><script>throw new Error("boom")</script></body></html>')
    _dom, log = _open(page, tmp_path)
    assert any("Uncaught Error: boom" in line for line in _console_errors(log))


@pytest.mark.parametrize("which", ["pair", "all"])
def test_report_renders_in_chromium(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    html_text = request.getfixturevalue(f"{which}_html")
    page = tmp_path / f"{which}.html"
    page.write_text(html_text, encoding="utf-8")
    dom, log = _open(page, tmp_path)
    assert _console_errors(log) == []
    assert 'data-script-errors="0"' in dom, "the page's own error hook saw errors (or never ran)"
    ids = _figure_ids(html_text)
    assert ids
    for fig_id in ids:
        start = dom.index(f'id="{fig_id}"')
        end = dom.find("</section>", start)
        assert 'class="main-svg"' in dom[start:end], f"{fig_id} did not render"
        # plotly gives a legend taller than its figure a scroll bar: the legend is clipped
        bars = re.findall(r'class="scrollbar"[^>]*\bheight="([\d.]+)"', dom[start:end])
        assert all(float(h) == 0 for h in bars), f"{fig_id}'s legend is clipped"


def test_ce_figure_reads_fp32_tf32_and_fp16_on_one_axis(sample_store) -> None:
    """Each layer's CE is against its own precision's peak, so one 0-100 % axis reads the TF32
    convolutions, the FP32 GEMMs and the fp16 autocast run alike (with a TF32 or FP32 denominator
    the AMP bars went to 130 % and 1,000 %, flattening the others); hover names the precision."""
    import json

    from traceq.analysis.efficiency.ce import ce_table

    frames = {name: ce_table(sample_store, trace_id(sample_store, name), "layer", spec=SPEC)
              for name in ("alexnet_b256_cudnn", "alexnet_b256_amp")}
    figure = figures.ce_chart(frames).figure
    layout = json.loads(figure.to_json())["layout"]
    assert layout["yaxis"]["range"] == [0, 100] and layout["yaxis2"]["range"] == [0, 100]
    bars = [trace for trace in figure.data if trace.type == "bar"]
    values = [y for trace in bars for y in trace.y]
    assert values and max(values) <= 100 and min(values) > 0
    assert all("precision: %{customdata[2]}" in trace.hovertemplate for trace in bars)
    assert {row[2] for trace in bars for row in trace.customdata} >= {"tf32", "fp32", "fp16"}


def test_findings_come_first(pair_html: str) -> None:
    """`traceq advise`'s findings open the report, for each trace."""
    section = _section(pair_html, "advise")
    assert pair_html.index('id="sec-advise"') < pair_html.index('id="sec-stages"')
    assert all(f"<h3>{name}</h3>" in section for name in PAIR)
    assert "FP32 matrix math where tensor cores were available" in section  # AlexNet's FP32 FC GEMMs


def test_memory_events_of_no_bytes_are_not_charted(tmp_path: Path) -> None:
    """Memory events that never hold a byte (seen in a Kineto run) drew a flat line on a -1..4 MiB
    axis and empty bars: both memory figures say instead why they are not drawn."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    con = open_store(tmp_path / "zero.duckdb", create=True)
    load_trace(con, sample("lenet_b256_cudnn.sqlite"))
    assert con.execute("SELECT count(*) FROM memory_events WHERE bytes > 0").fetchone()[0] > 0
    con.execute("UPDATE memory_events SET bytes = 0")
    page = build_report(con, [trace_id(con, "lenet_b256_cudnn")])
    con.close()
    assert "fig-memory" not in page
    assert "<h2>GPU memory in use over time</h2><p>Not drawn: the memory events never hold a byte" in page
    assert "<h2>GPU memory allocated per layer (paper figures 13 to 16)</h2><p>Not drawn: the memory events " \
           "allocate no device memory" in page
