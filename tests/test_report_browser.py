"""`traceq report`'s figures as a browser lays them out, checked against rules (issue 34).

Three reports (one nsys trace, a pair, the 8-rank DLRM Kineto run) and a page of crafted
defects are opened together, each in an iframe of one index page, in headless Chromium at 1280
and at 1920 px: one browser run per width (module fixture), as Chromium is slow on 2 cores.
Each page carries tests/figure_checks.js, which measures every figure after plotly has drawn it
and posts its findings to the index page; the test reads them back from `--dump-dom`.

The rules: no text poking out of its figure or out of the plot area that clips it, no two texts
overlapping, no legend with a scroll bar, every plot area at least 200 px high, every subplot
drawing marks a reader can see or saying why it has none, no column of dots where one x value
would read better as bars. The crafted page breaks each rule once, so the check can fail.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path

import plotly.graph_objects as go
import pytest
from conftest import DLRM, sample, trace_id
from plotly.subplots import make_subplots
from test_report import _chromium

from traceq.api.report import build_report

pytestmark = pytest.mark.xdist_group("report")

CHECKS = Path(__file__).with_name("figure_checks.js")
SPEC = sample("alexnet.model.toml")
PAGES = ("single", "pair", "run", "crafted")
MIN_PLOT_PX = 200


def _crafted() -> str:
    """A page whose figures break each rule once: a y label cut by a 10 px margin, two notes on
    top of each other, a legend of 40 entries in a short figure, a 120 px high plot area, bars
    a pixel high on a 0-100 axis, and one x value's markers in a column."""
    pages = []
    clipped = go.Figure(go.Bar(y=["a label far longer than its ten pixel margin", "b"], x=[1, 2],
                               orientation="h"))
    clipped.update_layout(margin=dict(l=10), height=400)
    clipped.update_yaxes(automargin=False)
    clipped.add_annotation(text="first note, long", x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False)
    clipped.add_annotation(text="second note, long", x=0.52, y=0.5, xref="paper", yref="paper", showarrow=False)
    pages.append(("clipped", clipped))
    legend = go.Figure([go.Scatter(x=[i, i + 1], y=[i, i], name=f"series {i}") for i in range(40)])
    legend.update_layout(height=300)
    pages.append(("legend", legend))
    short = go.Figure(go.Bar(x=["a"], y=[1]))
    short.update_layout(height=260, margin=dict(t=70, b=70))
    pages.append(("short", short))
    flat = make_subplots(rows=1, cols=2)
    flat.add_bar(x=["a", "b"], y=[0.3, 0.5], row=1, col=1)
    flat.add_bar(x=["a", "b"], y=[50, 70], row=1, col=2)
    flat.update_yaxes(range=[0, 100])
    flat.update_layout(height=450)
    pages.append(("flat", flat))
    dots = go.Figure([go.Scatter(x=["iteration 0"], y=[r], mode="markers", name=f"rank {r}") for r in range(8)])
    dots.update_layout(height=450)
    pages.append(("dots", dots))
    divs = "".join(f.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{k}") for k, f in pages)
    import plotly.offline

    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>crafted</title><script>'
            f'{plotly.offline.get_plotlyjs()}</script></head><body>{divs}</body></html>')


@pytest.fixture(scope="module")
def reports(sample_store, request: pytest.FixtureRequest) -> dict[str, str]:
    """The HTML of each page, built once for both widths (the DLRM run's only with ../shared)."""
    pages = {
        "single": build_report(sample_store, [trace_id(sample_store, "alexnet_b256_cudnn")], spec=SPEC),
        "pair": build_report(sample_store, [trace_id(sample_store, n) for n in ("alexnet_b256_cudnn",
                                                                                "alexnet_b256_amp")], spec=SPEC),
        "crafted": _crafted(),
    }
    if len(DLRM) == 8:
        con, run = request.getfixturevalue("dlrm_store")
        rank0 = con.execute("SELECT trace_id FROM ranks WHERE run_id = ? ORDER BY rank LIMIT 1", [run]).fetchone()[0]
        pages["run"] = build_report(con, [rank0])
    return pages


@pytest.fixture(scope="module", params=[1280, 1920], ids=lambda w: f"{w}px")
def checks(request: pytest.FixtureRequest, reports: dict[str, str], tmp_path_factory) -> dict[str, dict]:
    """{page: its findings} at one window width: one Chromium run over an index of iframes."""
    width = request.param
    folder = tmp_path_factory.mktemp(f"browser{width}")
    script = f"<script>{CHECKS.read_text()}</script>"
    for name, page in reports.items():
        (folder / f"{name}.html").write_text(page.replace("</body>", script + "</body>"), encoding="utf-8")
    frames = "".join(f'<iframe src="{n}.html" style="display:block;width:100%;height:2000px;border:0"></iframe>'
                     for n in reports)
    (folder / "index.html").write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><style>body { margin: 0 }</style></head><body>'
        f'{frames}<pre id="checks">[]</pre><script>var got = {{}};\n'
        "window.addEventListener('message', function (e) { var found = JSON.parse(e.data); got[found.page] = found;"
        " document.getElementById('checks').textContent = JSON.stringify(got); });</script></body></html>")
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-extensions", f"--user-data-dir={folder / 'profile'}", f"--window-size={width},4000",
               "--virtual-time-budget=30000", "--dump-dom", (folder / "index.html").as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    found = re.search(r'<pre id="checks">(.*?)</pre>', result.stdout, re.S)
    assert found, "the index page wrote no findings"
    by_title = json.loads(html.unescape(found.group(1)))
    titles = {name: re.search(r"<title>(.*?)</title>", page).group(1) for name, page in reports.items()}
    out = {name: by_title.get(html.unescape(title)) for name, title in titles.items()}
    missing = [name for name, page in out.items() if page is None]
    assert not missing, f"no findings came back from {missing}"
    return out


def _broken(figure: dict) -> list[str]:
    """Every rule `figure` breaks, in words."""
    if "error" in figure:
        return [f"the check failed: {figure['error']}"]
    broken = [f"text clipped: {t!r}" for t in figure["clipped"]]
    broken += [f"texts overlap: {a!r} and {b!r}" for a, b in figure["overlaps"]]
    if figure["legend_scroll"]:
        broken.append("the legend has a scroll bar")
    for sub in figure["subplots"]:
        if sub["plot_height"] < MIN_PLOT_PX:
            broken.append(f"{sub['id']}: plot area {sub['plot_height']} px high")
        if not sub["marks"] and not sub["note"]:
            broken.append(f"{sub['id']}: nothing visible drawn and no note saying why")
        if sub["column"]:
            broken.append(f"{sub['id']}: markers in one column")
    return broken


def test_the_check_catches_each_crafted_defect(checks: dict[str, dict]) -> None:
    figures = {f["id"]: f for f in checks["crafted"]["figures"]}
    clipped = figures["fig-clipped"]
    assert "a label far longer than its ten pixel margin" in clipped["clipped"]
    assert ["first note, long", "second note, long"] in clipped["overlaps"]
    assert figures["fig-legend"]["legend_scroll"]
    assert [b for b in _broken(figures["fig-short"]) if b.startswith("xy: plot area ")]
    flat = {s["id"]: s for s in figures["fig-flat"]["subplots"]}
    assert flat["xy"]["marks"] == 0 and flat["x2y2"]["marks"] == 2
    assert _broken(figures["fig-dots"]) == ["xy: markers in one column"]


@pytest.mark.parametrize("page", ["single", "pair", "run"])
def test_every_figure_keeps_the_rules(page: str, checks: dict[str, dict], reports: dict[str, str]) -> None:
    if page not in reports:
        pytest.skip("the DLRM rank files are absent")
    found = checks[page]
    assert found["figures"], "no figure was drawn"
    assert "fig-op-roofline" in {f["id"] for f in found["figures"]}  # traceq roofline's, on a trace and a run
    broken = {f["id"]: _broken(f) for f in found["figures"]}
    assert {k: v for k, v in broken.items() if v} == {}
    for figure in found["figures"]:
        assert figure["width"] <= found["window"], figure["id"]
