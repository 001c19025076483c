"""Every tabular command reads at any terminal width (issue 15, item 6; issue 34): at 60, 80, 100,
120, 160, 200 and 240 columns no line is wider than the terminal, the table's key columns (what a
row is: listed here per command) are all shown, no number is cut (each agrees with the command's
own json value, parsed here independently of traceq's formatting), every row can be told from
the others, a shortened name or list is a faithful part of the full value, and the columns left
out are exactly those the line under the table names. csv and json carry every value in full."""

from __future__ import annotations

import json
import re
from itertools import pairwise
from pathlib import Path

import pytest
from conftest import TABLE_COMMANDS as COMMANDS
from typer.testing import CliRunner

from traceq.cli import app
from traceq.render.columns import column_spec, header
from traceq.render.table import SAID_WHEN_NONE

runner = CliRunner()
WIDTHS = (60, 80, 100, 120, 160, 200, 240)
COMMANDS = {**COMMANDS,
            "critical": ["critical", "-t", "ddp_resnet18_2gpu"],
            "critical longest": ["critical", "--view", "longest", "-t", "ddp_resnet18_2gpu"],
            "critical composition": ["critical", "--view", "composition", "-t", "alexnet_b256_cudnn"],
            "whatif": ["whatif", "--no-launch-overhead", "-t", "alexnet_b256_cudnn"]}
_STATS_KEYS = {"cuda_api_sum": ("name",), "cuda_gpu_kern_sum": ("name",), "cuda_gpu_mem_time_sum": ("operation",),
               "cuda_gpu_mem_size_sum": ("operation",), "nvtx_sum": ("range",), "nvtx_gpu_proj_sum": ("range",),
               "cuda_kern_exec_sum": ("pid", "tid", "device_id", "api_name", "kernel_name")}
KEYS = {
    "traces": ("trace_id", "name"), "top": ("rank", "name"), "top short": ("rank", "name"),
    "top instances": ("rank", "layer", "pass", "name"), "top kineto": ("rank", "name"),
    "layers": ("layer", "pass"), "libs": ("library",), "libs by layer": ("layer", "pass", "library"),
    "stages": ("iteration", "device_id"), "ru kernel": ("name",), "ru layer": ("layer", "pass"),
    "ru layer kineto": ("layer", "pass"), "ru library": ("library",), "ce layer": ("layer", "pass"),
    "ce kernel": ("name",), "ce library": ("library",), "compare layer": ("layer", "pass"),
    "compare kernel": ("name",), "compare stage": ("stage",), "compare gpus": ("stage",),
    "memory layer": ("device_id", "layer", "pass"), "memory time": ("event_id",),
    "traffic layer": ("layer", "pass", "direction"), "traffic kernel": ("name", "layer", "pass"),
    "idle": ("cause",), "idle iteration": ("iteration", "device_id"), "idle stream": ("device_id", "stream_id"),
    "idle layer": ("layer", "pass"), "launches": ("name",),
    **{f"stats {report}": keys for report, keys in _STATS_KEYS.items()},
    "comm": ("collective", "iteration", "rank"), "comm instance": ("collective", "group", "instance", "iteration"),
    "overlap": ("rank", "iteration"), "ranks": ("iteration", "rank"),
    "ranks collective": ("collective", "group", "instance", "iteration"),
    "critical": ("iteration",), "critical longest": ("iteration", "category", "name"),
    "critical composition": ("category", "library"), "whatif": ("iteration",),
}
"""Per command, the columns that say what a row is: a table shows them at every width."""
NOT_IN_TABLES = {"traces": {"sha256", "source_path", "loaded_at"}}
"""Columns a command gives csv and json but never a table."""

FRACTIONS = {"ru", "paper_ru", "occupancy", "kineto_occupancy", "ce", "a_ru", "b_ru", "a_ce", "b_ce"}
"""Columns docs/cli.md says csv and json hold as fractions (tables show them as %)."""

UNIT = r"(ns|µs|ms|s|%|B|KiB|MiB|GiB|TB/s|GB/s)(\W|$)"
"""A unit at the start of a line (a title wrapped between a number and its unit)."""

SCALE = {"ns": 1, "µs": 1e3, "ms": 1e6, "s": 1e9, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
         "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def _parse_table(text: str) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows of cells, the text under the table) of a rich table with a heavy head."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    sep = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    bottom = next(i for i, line in enumerate(lines) if line.startswith("└"))
    parts = [[cell.strip() for cell in line.split("┃")[1:-1]] for line in lines[top + 1:sep]]
    headers = [" ".join(p for p in column if p) for column in zip(*parts)]
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines[sep + 1:bottom]]
    return headers, rows, " ".join(lines[bottom + 1:])


def _number(cell: str) -> tuple[float, float]:
    """(value, half of the last digit's step) of a table's number, with its unit applied."""
    match = re.fullmatch(r"(-?[\d,]*\.?\d+)(?: (ns|µs|ms|s|B|KiB|MiB|GiB|k|M|G|T|P))?", cell)
    assert match, f"not a whole number with its unit: {cell!r}"
    digits, unit = match.group(1).replace(",", ""), match.group(2)
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    scale = SCALE[unit] if unit else 1
    return float(digits) * scale, 0.5 * 10 ** -decimals * scale * 1.0001


def _check_text(cell: str, value: object) -> None:
    """A text cell is the value, or a faithful shortening of it: its pieces in order, or its
    first list items and a count of the rest."""
    full = "" if value is None else str(value)
    if cell in (full, full.replace("_", " ")) or (isinstance(value, bool) and cell == ("yes" if value else "no")):
        return
    listed = re.fullmatch(r"(.*) \+(\d+)", cell)
    if listed and ", " in full:
        items, shown = full.split(", "), listed.group(1)
        k = len(items) - int(listed.group(2))
        if shown == ", ".join(items[:k]):
            return
        cell = shown  # the first item itself was cut
    cell = re.sub(r"~\d+$", "", cell)  # the mark that keeps names cut alike apart (render.table._numbered)
    position = 0
    for piece in cell.split("…"):
        found = full.find(piece, position)
        assert found >= 0, f"{cell!r} is not a shortening of {full!r}"
        position = found + len(piece)


def _tables(args: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    """The command's table at every width: printed by the command itself at the narrowest and the
    widest, and between them the frame and title it rendered, through the same renderer (the
    analyses are what takes time, and they do not depend on the width)."""
    import importlib
    import pkgutil

    import traceq.cli
    from traceq.render import Format, render

    real, seen = render, {}

    def spy(frame, fmt, **kwargs):  # records what the command rendered
        seen.update(frame=frame.pl() if hasattr(frame, "pl") else frame, kwargs=kwargs)
        return real(frame, fmt, **kwargs)

    for module in pkgutil.iter_modules(traceq.cli.__path__):  # each family of commands renders
        commands = importlib.import_module(f"traceq.cli.{module.name}")
        if hasattr(commands, "render"):
            monkeypatch.setattr(commands, "render", spy)
    tables = {}
    for width in (WIDTHS[0], WIDTHS[-1]):
        result = runner.invoke(app, args, env={"COLUMNS": str(width)})
        assert result.exit_code == 0, result.output
        tables[width] = result.stdout
    for width in WIDTHS[1:-1]:
        tables[width] = real(seen["frame"], Format.table, **{**seen["kwargs"], "width": width})
    return dict(sorted(tables.items()))


@pytest.mark.parametrize("name", list(COMMANDS))
def test_tables_at_every_width(cli_store: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    args = [*COMMANDS[name], "--db", str(cli_store)]
    full = runner.invoke(app, [*args, "-f", "json"])
    assert full.exit_code == 0, full.output
    records = json.loads(full.stdout)
    assert records, "no rows to look at"
    columns = [c for c in records[0] if c not in NOT_IN_TABLES.get(name, set())]
    assert not any(isinstance(v, str) and "…" in v for r in records for v in r.values()), "json cut a value"
    for width, table in _tables(args, monkeypatch).items():
        assert max(map(len, table.splitlines())) <= width, f"wider than {width}"
        title = table.split("┏", 1)[0].splitlines()
        for line, after in pairwise(title):  # never '4.549' at a line's end and 'ms' at the next one's start
            assert not (re.search(r"\d$", line) and re.match(UNIT, after)), (line, after)
        headers, rows, under = _parse_table(table)
        by_header = {header(c): c for c in columns}
        if "rank" in columns and name.startswith("top"):  # top's row position reads '#' in a table
            by_header["#"] = "rank"
        shown = [by_header[h] for h in headers]
        missing = [k for k in KEYS[name] if k not in shown]
        assert not missing, f"key columns {missing} left out at {width} columns"
        assert len(rows) == len(records)
        assert len({tuple(r) for r in rows}) == len(rows), f"rows look alike at {width} columns"
        for row, record in zip(rows, records):
            for cell, column in zip(row, shown):
                value = record[column]
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    number, step = _number(cell)
                    expected = 100 * value if column in FRACTIONS else value
                    assert abs(number - expected) <= step, f"{column}: {cell!r} is not {value!r}"
                elif value is None or (value == "" and column in SAID_WHEN_NONE):
                    assert cell == ("(none)" if column in SAID_WHEN_NONE else "")
                else:
                    _check_text(cell, value)
        for i, column in enumerate(shown):  # different names never print alike
            if column_spec(column, False).kind != "name":
                continue  # numbers round, lists are summaries ('conv1 +3'): names must stay apart
            pairs = {(row[i], str(record[column])) for row, record in zip(rows, records)}
            cells = [cell for cell, _ in pairs]
            assert len(cells) == len(set(cells)), f"{column}: different values print alike at {width} columns"
        left_out = [header(c) for c in columns if c not in shown and not (c == "rank" and "#" in headers)]
        if left_out:
            assert under.startswith(f"Left out to fit {width} columns: "), under
            named = under.split(": ", 1)[1].split(" (a wider terminal")[0].split(", ")
            assert sorted(named) == sorted(left_out)
        else:
            assert "Left out" not in under


def test_every_command_names_its_keys() -> None:
    assert set(KEYS) == set(COMMANDS)


def test_occupancy_table_at_every_width() -> None:
    args = ["occupancy", "--cc", "9.0", "--threads", "384", "--regs", "168", "--smem-dynamic", "213204",
            "--opt-in", "--grid", "130", "--sms", "132"]
    for width in WIDTHS:
        out = runner.invoke(app, args, env={"COLUMNS": str(width)}).stdout
        assert max(map(len, out.splitlines())) <= width
        _, rows, _ = _parse_table(out)
        assert dict(rows)["RU %"] == "98.5" and dict(rows)["Limiter"] == "registers+shared_mem"


def test_names_that_differ_past_the_cut_show_where() -> None:
    """Kernel names alike at both ends (cuDNN's nchwToNhwcKernel with different template
    arguments) stay apart when cut; the cut keeps the start and the distinguishing end."""
    from traceq.render.table import cut_list, cut_names

    a = "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>"
    b = a.replace(")2>", ")0>")
    c = "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, true, true, (cudnnKernelDataType_t)2>"
    for width in (16, 24, 40):
        cut = cut_names([a, b, c], width)
        assert len(set(cut)) == 3 and all(len(x) <= width for x in cut), cut
    assert cut_list("conv1, conv2, conv3, conv4", 16) == "conv1, conv2 +2"


def test_findings_never_wrap_between_a_number_and_its_unit() -> None:
    import polars as pl

    from traceq.render.findings import render_findings

    frame = pl.DataFrame({"rank": [1], "title": ["Kernels that leave GPU block slots empty (low RU)"],
                          "time_ns": [67_244_000], "pct": [23.1], "evidence": ["RU 12 %, 23.431 ms"],
                          "fix": ["Fill the GPU"], "rule": ["low_ru"]})
    for width in range(60, 120):
        lines = render_findings(frame, title="t: 5 finding(s), of 290.643 ms on 2 device(s)", width=width).splitlines()
        assert max(map(len, lines)) <= width
        for line, after in pairwise(lines):
            assert not (re.search(r"\d$", line) and re.match(UNIT, after.strip())), (width, line, after)
