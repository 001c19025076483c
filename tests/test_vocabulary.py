"""One vocabulary in every command (issue 15, item 7): the same column names, headers, units and
stage names everywhere, usage lines as a person writes them, and the global options (--db,
--format, --output) accepted before the command as well as after it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import TABLE_COMMANDS
from typer.main import get_command
from typer.testing import CliRunner

from traceq.cli import app
from traceq.render.columns import COLUMNS, SIDES

pytestmark = pytest.mark.xdist_group("vocabulary")  # one worker builds its module fixtures once (--dist loadgroup)

runner = CliRunner()
STAGES = ("data copy", "forward", "backward", "weight update")
"""The training stages, as the paper names them and every table and figure writes them."""


def _json(*args: str) -> list[dict]:
    result = runner.invoke(app, [*args, "-f", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _table(*args: str, width: int = 400) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.stdout


def _headers(table: str) -> list[str]:
    """The first header line's cells (at 400 columns no header wraps)."""
    first = next(line for line in table.splitlines() if line.startswith("┃"))
    return [cell.strip() for cell in first.split("┃")[1:-1]]


@pytest.fixture(scope="module")
def outputs(cli_store: Path) -> dict[str, tuple[list[dict], str]]:
    """Each tabular command's json records and its table at a width that drops nothing."""
    return {name: (_json(*args, "--db", str(cli_store)), _table(*args, "--db", str(cli_store)))
            for name, args in TABLE_COMMANDS.items()}


def test_every_column_is_in_the_vocabulary(outputs: dict[str, tuple[list[dict], str]]) -> None:
    """Every csv/json column of every command is snake_case and declared in render/columns.py
    (a compare column as a_/b_ of one), and its table header is the declared one, with no
    snake_case left and no header twice in a table."""
    for name, (records, table) in outputs.items():
        for column in records[0]:
            assert re.fullmatch(r"[a-z][a-z0-9_]*", column), (name, column)
            base = column[2:] if column[:2] in SIDES and column not in COLUMNS else column
            assert base in COLUMNS or base in ("ns", "ce"), f"{name}: column {column!r} is not in render/columns.py"
        headers = _headers(table)
        assert len(set(headers)) == len(headers), (name, headers)
        assert not any("_" in h for h in headers), (name, headers)


def test_shares_are_percent_in_tables_and_fractions_in_json(outputs: dict[str, tuple[list[dict], str]]) -> None:
    """A header ending in '%' shows a percentage in every table: for RU, occupancy and CE (which
    csv and json hold as fractions, 0 to 1) the cell is 100 times the json value."""
    fractions = {"RU %", "Occupancy %", "Paper RU %", "Kineto occupancy %", "CE %", "A RU %", "B RU %",
                 "A CE %", "B CE %"}
    seen = set()
    for name, (records, table) in outputs.items():
        headers = _headers(table)
        rows = [[c.strip() for c in line.split("│")[1:-1]] for line in table.splitlines() if line.startswith("│")]
        keys = [k for k in records[0] if k not in ("sha256", "source_path", "loaded_at")]
        assert len(keys) == len(headers), name
        for i, (key, head) in enumerate(zip(keys, headers)):
            if head not in fractions:
                continue
            seen.add(head)
            for row, record in zip(rows, records):
                if record[key] is not None:
                    assert record[key] >= 0, (name, key, record[key])
                    assert row[i] == f"{100 * record[key]:.1f}", (name, key, row[i], record[key])
    assert {"RU %", "Occupancy %", "CE %", "A RU %"} <= seen


def test_occupancy_speaks_like_ru(outputs: dict[str, tuple[list[dict], str]]) -> None:
    """`traceq occupancy` on the launch shape of ru's heaviest kernel gives ru's values under
    ru's names and headers: blocks_per_sm, limiter, occupancy (a fraction in json, % in tables)."""
    kernel = outputs["ru kernel"][0][0]
    args = ["occupancy", "--cc", "9.0", "--threads", str(kernel["block_threads"]), "--regs",
            str(kernel["registers_per_thread"]), "--smem-dynamic", str(kernel["smem_bytes"]), "--opt-in"]
    got = json.loads(runner.invoke(app, [*args, "-f", "json"]).stdout)
    assert (got["blocks_per_sm"], got["limiter"], got["occupancy"]) == (
        kernel["blocks_per_sm"], kernel["limiter"], pytest.approx(kernel["occupancy"]))
    rows = dict(tuple(c.strip() for c in line.split("│")[1:-1]) for line in _table(*args).splitlines()
                if line.startswith("│"))
    ru_headers = _headers(outputs["ru kernel"][1])
    ru_row = [c.strip() for c in next(line for line in outputs["ru kernel"][1].splitlines()
                                      if line.startswith("│")).split("│")[1:-1]]
    for head in ("Blocks/SM", "Limiter", "Occupancy %"):
        assert rows[head] == ru_row[ru_headers.index(head)], head


def test_stage_names_are_the_same_everywhere(outputs: dict[str, tuple[list[dict], str]]) -> None:
    """The stages read 'data copy' and 'weight update' in every table, as headers (stages) and
    as values (compare --by stage); csv and json keep the snake_case keys. The nsys reports of
    `stats` print NVTX range names as the trace wrote them (':data_copy'), so there only the
    headers are checked."""
    for name, (_, table) in outputs.items():
        text = " ".join(_headers(table)) if name.startswith("stats nvtx") else table
        assert "data_copy" not in text and "weight_update" not in text, name
    stage_headers = [h.lower() for h in _headers(outputs["stages"][1])]
    compare_rows = [line.split("│")[1].strip() for line in outputs["compare stage"][1].splitlines()
                    if line.startswith("│")]
    for stage in STAGES:
        assert stage in stage_headers and stage in compare_rows, stage
    assert [r["stage"] for r in outputs["compare stage"][0]][:4] == ["data_copy", "forward", "backward",
                                                                      "weight_update"]


def test_usage_lines_name_arguments_plainly() -> None:
    for name, command in get_command(app).commands.items():  # type: ignore[attr-defined]
        usage = next(line for line in runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"}).stdout
                     .splitlines() if "Usage:" in line).strip()
        assert re.fullmatch(rf"Usage: traceq {name} \[OPTIONS\]( \[?[A-Z]+(\]|\]\.\.\.|\.\.\.)?)*", usage), usage


def _same(a: list[dict], b: list[dict]) -> bool:
    """Equal records, floats to 12 digits (polars' parallel sums may differ in the last bit)."""
    return a == b or (len(a) == len(b) and all(
        x.keys() == y.keys() and all(v == y[k] or (isinstance(v, float) and v == pytest.approx(y[k], rel=1e-12))
                                     for k, v in x.items()) for x, y in zip(a, b)))


@pytest.mark.parametrize("name", ["traces", "top", "layers", "stages", "ru kernel", "memory layer"])
def test_global_options_before_or_after_the_command(cli_store: Path, tmp_path: Path, name: str) -> None:
    command, *rest = TABLE_COMMANDS[name]
    after = runner.invoke(app, [command, *rest, "--db", str(cli_store), "--format", "json"])
    before = runner.invoke(app, ["--db", str(cli_store), "--format", "json", command, *rest])
    assert after.exit_code == before.exit_code == 0, before.output
    expected = json.loads(after.stdout)
    assert expected and _same(json.loads(before.stdout), expected)
    out = tmp_path / "out.json"
    written = runner.invoke(app, ["--db", str(cli_store), "-o", str(out), command, *rest])
    assert written.exit_code == 0 and _same(json.loads(out.read_text()), expected)
    # given after the command, an option wins over the same option given before it
    both = runner.invoke(app, ["--format", "csv", command, *rest, "--db", str(cli_store), "--format", "json"])
    assert _same(json.loads(both.stdout), expected)


def test_a_global_option_a_command_cannot_use_is_refused(cli_store: Path) -> None:
    result = runner.invoke(app, ["--format", "csv", "rm", "1", "--db", str(cli_store)])
    assert result.exit_code == 2 and "`traceq rm` takes no --format" in result.output


def test_idle_causes_have_one_name(outputs: dict[str, tuple[list[dict], str]]) -> None:
    """An idle cause reads the same in `idle`'s rows (table and json) and as the header of its
    column in `idle --by` (issue 34): one name per cause, never `h2d_pageable` in one place and
    'H2D pageable' in another; docs/idle.md and docs/cli.md use those names."""
    records, table = outputs["idle"]
    causes = [r["cause"] for r in records]
    split_records, split_table = outputs["idle stream"]
    cause_columns = [c for c in split_records[0] if c.endswith("_ns") and c != "idle_ns"]
    headers = dict(zip(split_records[0], _headers(split_table)))
    assert causes == [headers[c] for c in cause_columns]
    assert all(f"│ {cause} " in table for cause in causes)  # the table's rows name them so too
    assert not any("_" in cause for cause in causes)
    root = Path(__file__).resolve().parents[1]
    for doc in ("docs/idle.md", "docs/cli.md"):
        text = (root / doc).read_text(encoding="utf-8")
        assert all(f"`{cause}`" in text for cause in causes), doc
        assert not re.search(r"`(h2d_pageable|h2d_pinned|iteration_start|launch_bound)`", text), doc
