"""The docs say what the code does: schema.md is generated, every command is documented."""

from __future__ import annotations

import re
from pathlib import Path

from typer.main import get_command

from traceq.cli import app
from traceq.store import schema_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_schema_doc_is_current() -> None:
    assert (ROOT / "docs" / "schema.md").read_text() == schema_markdown(), (
        "docs/schema.md is stale: run `python -m traceq.store --markdown > docs/schema.md`")


def test_schema_doc_lists_every_column() -> None:
    import duckdb

    from traceq.store import schema_sql

    con = duckdb.connect()
    con.execute(schema_sql())
    doc = (ROOT / "docs" / "schema.md").read_text()
    for table, column in con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() WHERE NOT internal "
        "AND table_name IN (SELECT table_name FROM duckdb_tables())").fetchall():
        assert f"| `{column}` |" in doc, f"{table}.{column} undocumented"


def test_every_command_is_documented() -> None:
    cli_doc = (ROOT / "docs" / "cli.md").read_text()
    commands = get_command(app).commands  # type: ignore[attr-defined]
    assert commands
    for name, command in commands.items():
        assert re.search(rf"^## `traceq {name}", cli_doc, re.MULTILINE), f"docs/cli.md lacks `traceq {name}`"
        assert command.help, f"`traceq {name}` has no help text"
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--") and opt not in {"--help"}:
                    assert opt in cli_doc, f"docs/cli.md lacks {opt} of `traceq {name}`"


def test_readme_quickstart_has_exactly_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:sh|bash|console)?\n(.*?)```", section, re.DOTALL)
    commands = [line for block in blocks for line in block.splitlines()
                if line.strip() and not line.startswith("#") and not line.startswith(" ")
                and not line.startswith(("│", "┃", "┏", "┡", "└", "loaded", "lenet", "alexnet"))]
    commands = [c.removeprefix("$ ") for c in commands if c.startswith("$ ")]
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci, ".ci/run must run the README's test command"
