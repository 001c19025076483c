"""The docs say what the code does: schema.md is generated, every command is documented."""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from traceq.cli import app
from traceq.store import schema_markdown

pytestmark = pytest.mark.xdist_group("docs")  # one worker builds its module fixtures once (--dist loadgroup)

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
    blocks = re.findall(r"```(?:sh|bash)?\n(.*?)```", section, re.DOTALL)  # console blocks quote output
    commands = [line for block in blocks for line in block.splitlines()
                if line.strip() and not line.startswith("#") and not line.startswith(" ")
                and not line.startswith(("│", "┃", "┏", "┡", "└", "loaded", "lenet", "alexnet"))]
    commands = [c.removeprefix("$ ") for c in commands if c.startswith("$ ")]
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci, ".ci/run must run the README's test command"


# --------------------------------------------------------------------------- the docs are true

DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "schema.md")]
PLACEHOLDER = re.compile(r"^\[?[A-Z][A-Z0-9_|]*(\.\.\.)?\]?(\.\.\.)?$|^\.\.\.$")
"""A word of a command synopsis that stands for a value (FILE, TRACE, [TRACE]..., A, B)."""


@dataclass
class Quoted:
    """A traceq command as a document quotes it, and (in a console block) what it prints."""

    doc: Path
    command: str
    output: list[str] | None = None
    heading: bool = False
    block: int | None = None  # the fenced block it is in (its offset)


def _traceq_part(part: str) -> str | None:
    """'.venv/bin/traceq top --k 15' -> 'traceq top --k 15'; None when not a traceq command."""
    words = part.strip().split(maxsplit=1)
    if words and (words[0] == "traceq" or words[0].endswith("/traceq")):
        return "traceq" + (" " + words[1] if len(words) > 1 else "")
    return None


def quoted(doc: Path) -> list[Quoted]:
    """Every traceq command `doc` quotes: the lines of its sh and console blocks (prompts, `&&`
    chains and comments taken apart) in document order, then the inline code spans that start
    with traceq, in document order."""
    text = doc.read_text(encoding="utf-8")
    found: list[tuple[int, Quoted]] = []
    fences = list(re.finditer(r"^```(\w*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL))
    for fence in fences:
        if fence.group(1) not in ("", "sh", "bash", "console"):
            continue
        lines = fence.group(2).replace("\\\n", " ").splitlines()
        if fence.group(1) == "console":
            for i, line in enumerate(lines):
                if line.startswith("$ "):
                    rest = lines[i + 1:]
                    end = next((j for j, x in enumerate(rest) if x.startswith("$ ")), len(rest))
                    found.append((fence.start() + i, Quoted(doc, line[2:], rest[:end], block=fence.start())))
            continue
        for i, line in enumerate(lines):
            line = re.sub(r"\s+#.*$", "", line.removeprefix("$ "))
            for part in line.split("&&"):
                if (command := _traceq_part(part)) is not None:
                    found.append((fence.start() + i, Quoted(doc, command, block=fence.start())))
    inside = [(f.start(), f.end()) for f in fences]
    for span in re.finditer(r"`(traceq [^`]*)`", text):  # after every block: prose assumes a loaded store
        if not any(a <= span.start() < b for a, b in inside):
            line = text.rfind("\n", 0, span.start()) + 1
            found.append((len(text) + span.start(), Quoted(doc, span.group(1),
                                                           heading=text.startswith("## `traceq", line))))
    return [q for _, q in sorted(found, key=lambda f: f[0])]


def _is_synopsis(command: str) -> bool:
    return any(PLACEHOLDER.match(word) for word in command.split()[1:])


def _check_synopsis(q: Quoted) -> None:
    """A synopsis names real commands and options; a heading's is the command's usage line."""
    root = get_command(app)
    current = root
    words = q.command.split()[1:]
    takes_value = False
    for word in words:
        if takes_value:
            takes_value = False
        elif word.startswith("-"):
            options = {o: p for p in current.params for o in (*p.opts, *p.secondary_opts)}
            assert word.split("=")[0] in options, f"{q.doc.name}: `{q.command}`: no option {word}"
            takes_value = not options[word.split("=")[0]].is_flag and "=" not in word
        elif current is root and not PLACEHOLDER.match(word):
            commands = root.commands  # type: ignore[attr-defined]
            assert word in commands, f"{q.doc.name}: `{q.command}`: no command {word}"
            current = commands[word]
    if q.heading:
        usage = " ".join(current.collect_usage_pieces(click_context(current)))
        assert " ".join(words[1:]) == usage.replace("[OPTIONS]", "").strip(), (q.command, usage)


def click_context(command):  # -> click.Context
    from typer import Context

    return Context(command, info_name=command.name)


def _normalized(lines: list[str]) -> list[str]:
    """Output lines without what varies between runs (a load's seconds) or trailing blanks."""
    return [re.sub(r" in \d+\.\d+ s$", " in N s", line.rstrip()) for line in lines if line.strip()]


@pytest.fixture(scope="module")
def samples_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding every bundled sample, loaded as `traceq load sample_traces/*.sqlite` would."""
    store = tmp_path_factory.mktemp("docs") / "traceq.duckdb"
    samples = [str(p) for p in sorted((ROOT / "sample_traces").glob("*.sqlite"))]
    assert CliRunner().invoke(app, ["load", *samples, "--db", str(store)]).exit_code == 0
    return store


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_quoted_command_runs_as_written(doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              samples_store: Path) -> None:
    """Each traceq command README.md and docs/*.md quote runs, in document order, in a fresh
    folder holding sample_traces/ (docs other than the README: with the samples loaded, as they
    assume); where a console block quotes what it prints (error messages included), it prints
    exactly that. Synopses (`traceq compare A B`) name real commands and options, and a command's
    heading in docs/cli.md is its usage line. Python blocks run too, each document's in one session."""
    runner = CliRunner()
    monkeypatch.delenv("TRACEQ_DB", raising=False)
    folders: dict[str, Path] = {}

    def folder(q: Quoted) -> Path:
        """The document's folder, or a console block's own: a transcript starts afresh."""
        name = f"console-{q.block}" if q.output is not None else "doc"
        if name not in folders:
            folders[name] = tmp_path / name
            folders[name].mkdir()
            (folders[name] / "sample_traces").symlink_to(ROOT / "sample_traces")
            if doc.name != "README.md":
                shutil.copyfile(samples_store, folders[name] / "traceq.duckdb")
        return folders[name]

    ran = 0
    measured_only = doc.name == "performance.md"  # commands quoted as what was timed (on 10M-kernel stores)
    for q in quoted(doc):
        if measured_only and q.output is None or _is_synopsis(q.command) or len(q.command.split()) == 2 and not q.output:
            _check_synopsis(q)  # `traceq top` in a sentence names the command
            continue
        monkeypatch.chdir(folder(q))
        result = runner.invoke(app, shlex.split(q.command)[1:], env={"COLUMNS": "160"})
        ran += 1
        if q.output is not None and q.output and q.output[0].startswith("traceq: ") and result.exit_code == 1:
            assert _normalized(result.stderr.splitlines()) == _normalized(q.output), f"{doc.name}: {q.command}"
            continue
        assert result.exit_code == 0, f"{doc.name}: `{q.command}` failed: {result.output[-500:]}"
        if q.output is not None:
            assert _normalized(result.stdout.splitlines()) == _normalized(q.output), f"{doc.name}: {q.command}"
    monkeypatch.chdir(folders.get("doc", tmp_path))
    session: dict[str, object] = {}  # one session per document, as a notebook runs its cells
    for block in re.findall(r"^```python\n(.*?)^```", doc.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL):
        exec(compile(block, f"{doc.name} (python block)", "exec"), session)  # on the store the commands made
    if doc.name in ("README.md", "cli.md", "findings.md"):
        assert ran >= 3, f"{doc.name}: the test found only {ran} commands to run"


def test_docs_link_only_inside_the_repository() -> None:
    """Every link of README.md and docs/*.md points at a file of the repository (or a heading of
    the same page): nothing outside it, which offline readers and forks cannot follow."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        assert not re.search(r"https?://|ftp://|mailto:", text), f"{doc.name} has a link outside the repository"
        slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                 for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path, _, anchor = target.partition("#")
            if not path:
                assert anchor in slugs, f"{doc.name}: no heading for #{anchor}"
                continue
            assert not path.startswith("/") and ":" not in path, f"{doc.name}: {target}"
            assert (doc.parent / path).exists(), f"{doc.name}: {target} does not exist"
