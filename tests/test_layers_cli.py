"""`traceq layers`, `libs`, `stages` and the context columns of `top`, end to end."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from conftest import sample
from typer.testing import CliRunner

from traceq.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("layers") / "s.duckdb"
    result = runner.invoke(app, ["load", str(sample("alexnet_b256_cudnn.sqlite")),
                                 str(sample("ddp_resnet18_2gpu.sqlite")), "--db", str(path)])
    assert result.exit_code == 0, result.output
    return path


def _json(db: Path, *args: str) -> list[dict]:
    result = runner.invoke(app, [*args, "--db", str(db), "-f", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_layers(db: Path) -> None:
    rows = _json(db, "layers", "-t", "alexnet_b256_cudnn")
    assert list(rows[0]) == ["layer", "pass", "kernels", "total_ns", "pct", "heaviest", "libraries", "attribution"]
    by_key = {(r["layer"], r["pass"]): r for r in rows}
    assert by_key[("conv1", "forward")]["libraries"].startswith("cuDNN")
    assert by_key[("bconv2", "backward")]["kernels"] > 0
    assert sum(r["kernels"] for r in rows) == 648
    assert abs(sum(r["pct"] for r in rows) - 100) < 1e-6
    table = runner.invoke(app, ["layers", "-t", "1", "--db", str(db)], env={"COLUMNS": "160"}).stdout
    assert table.startswith("alexnet_b256_cudnn: GPU time per layer and pass (")


def test_libs_and_by_layer(db: Path) -> None:
    rows = _json(db, "libs", "-t", "ddp_resnet18_2gpu")
    libs = {r["library"]: r for r in rows}
    assert libs["NCCL"]["operations"] == "communication 100%"
    by_layer = list(csv.DictReader(io.StringIO(runner.invoke(
        app, ["libs", "--by-layer", "-t", "alexnet_b256_cudnn", "--db", str(db), "-f", "csv"]).stdout)))
    assert list(by_layer[0])[:3] == ["layer", "pass", "library"]
    assert sum(int(r["kernels"]) for r in by_layer) == 648


def test_stages(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "stages.csv"
    result = runner.invoke(app, ["stages", "-t", "alexnet_b256_cudnn", "--db", str(db), "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert [r["iteration"] for r in rows] == [f"iteration {i}" for i in range(4)]
    assert {"data_copy_ns", "forward_ns", "backward_ns", "weight_update_ns", "idle_ns"} <= set(rows[0])
    ddp = _json(db, "stages", "-t", "ddp_resnet18_2gpu", "--iteration-regex", r"^iteration \d+$")
    assert {r["device_id"] for r in ddp} == {0, 1}


def test_top_context_columns(db: Path) -> None:
    plain = _json(db, "top", "-t", "alexnet_b256_cudnn", "-k", "3", "--no-context")
    assert "layer" not in plain[0]
    rows = _json(db, "top", "-t", "alexnet_b256_cudnn", "-k", "3")
    assert list(rows[0])[:10] == list(plain[0]) and list(rows[0])[10:] == ["layer", "pass", "library"]
    assert rows[0]["layer"] == "conv1" and rows[0]["pass"] == "forward" and rows[0]["library"] == "cuDNN"
    inst = _json(db, "top", "--instances", "-t", "alexnet_b256_cudnn", "-k", "2")
    assert list(inst[0])[:5] == ["rank", "layer", "pass", "name", "dur_ns"]
    assert inst[0]["layer"] == "conv1"
    table = runner.invoke(app, ["top", "-t", "alexnet_b256_cudnn", "--db", str(db)],
                          env={"COLUMNS": "240"}).stdout
    header = table.splitlines()[2]
    assert "Layer" in header and "Library" in header and "StdDev" in header
    assert "6.793 ms" in table  # numbers are never cut, whatever the names need
    narrow = runner.invoke(app, ["top", "-t", "alexnet_b256_cudnn", "--db", str(db)],
                           env={"COLUMNS": "140"}).stdout
    header = narrow.splitlines()[2]
    assert "Layer" in header and "StdDev" not in header and "6.793 ms" in narrow
    assert narrow.splitlines()[-1].startswith("Left out to fit 140 columns: StdDev, Max, Min")


def test_user_rules_file_for_every_command(db: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text("[[library]]\nmatch = '^sm80_xmma_fprop'\nvalue = \"MyLib\"\n")
    from traceq.analysis.kernels.classify import use_rules

    request.addfinalizer(lambda: use_rules(None))  # later tests classify with the packaged rules
    rows = json.loads(runner.invoke(app, ["--rules", str(rules), "libs", "-t", "alexnet_b256_cudnn",
                                          "--db", str(db), "-f", "json"]).stdout)
    mine = [r for r in rows if r["library"] == "MyLib"]
    assert len(mine) == 1 and mine[0]["kernels"] == 4  # conv1's forward kernel, 4 iterations
    env = {"TRACEQ_RULES": str(rules)}
    top = json.loads(runner.invoke(app, ["top", "-k", "1", "-t", "alexnet_b256_cudnn", "--db", str(db),
                                         "-f", "json"], env=env).stdout)
    assert top[0]["library"] == "MyLib"
    bad = runner.invoke(app, ["--rules", str(tmp_path / "none.toml"), "libs", "--db", str(db)])
    assert bad.exit_code == 1 and bad.stderr.startswith("traceq: cannot read rules file")


def test_top_leaves_attribution_out_on_big_traces(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import traceq.api.trace

    monkeypatch.setattr(traceq.api.trace, "AUTO_CONTEXT_MAX_KERNELS", 100)  # the samples have more
    result = runner.invoke(app, ["top", "-k", "2", "-t", "alexnet_b256_cudnn", "--db", str(db), "-f", "json"])
    rows = json.loads(result.stdout)
    assert list(rows[0])[-2:] == ["name", "library"] and rows[0]["library"] == "cuDNN"
    assert "layer and pass columns left out" in result.stderr and "--context" in result.stderr
    forced = json.loads(runner.invoke(app, ["top", "-k", "2", "-t", "alexnet_b256_cudnn", "--context",
                                            "--db", str(db), "-f", "json"]).stdout)
    assert forced[0]["layer"] == "conv1"


def test_title_shares_every_attribution(tmp_path: Path) -> None:
    """The title's shares are the layers' own: each attribution's share of the rows' kernel time
    (summed here from the JSON rows, every `rule: ...` as `rule`), largest first. On the
    Qwen prefill recorded with `with_modules` every kernel is placed by its module (the title once
    said 0.0 % in a layer range, 0.0 % by rule and 0.0 % in no layer there)."""
    import re
    from collections import defaultdict

    db = tmp_path / "q.duckdb"
    result = runner.invoke(app, ["load", str(sample("whatif/qwen1.5-0.5b_prefill_h200.json.gz")),
                                 str(sample("conventions/gpt_ncu_step.json.gz")), "--db", str(db)])
    assert result.exit_code == 0, result.output
    for trace in ("qwen1.5-0.5b_prefill_h200", "gpt_ncu_step"):
        rows = _json(db, "layers", "-t", trace)
        total = sum(r["total_ns"] for r in rows)
        shares: dict[str, float] = defaultdict(float)
        for r in rows:
            shares[re.sub(r"^(rule|none):.*", r"\1", r["attribution"] or "none")] += 100 * r["total_ns"] / total
        table = runner.invoke(app, ["layers", "-t", trace, "--db", str(db)], env={"COLUMNS": "200"})
        title = table.stdout.splitlines()[0]
        placed = ", ".join(f"{k} {v:.1f} %" for k, v in sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))
                           if k != "none" and v >= 0.05)
        assert f"(placed by {placed}; {shares.get('none', 0.0):.1f} % in no layer" in title, title
        if trace.startswith("qwen"):
            assert "(placed by module 100.0 %; 0.0 % in no layer" in title
