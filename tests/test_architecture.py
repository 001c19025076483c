"""The package's imports run one way (docs/architecture.md): errors -> store -> ingest -> analysis
-> api -> cli, with the renderers a layer of their own that reads no store. Every import counts,
those inside functions too; only `if TYPE_CHECKING:` blocks (never run) are left out. The walk
is this file's own (ast), not the product's code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP = {"tests", "bench", "tools", "build", "sample_traces", "docs"}

LAYERS = [
    ("base", ("traceq", "traceq.errors", "traceq.units", "traceq.text")),
    ("store", ("traceq.store", "traceq.dataset")),
    ("ingest", ("traceq.ingest",)),
    ("analysis", ("traceq.analysis",)),
    ("render", ("traceq.render",)),
    ("api", ("traceq.api",)),
    ("agents", ("traceq.agents",)),
    ("cli", ("traceq.cli", "traceq.__main__")),
]
"""Each layer imports only layers above it in this list, and itself."""

RENDER_MAY_IMPORT = {"base", "render"}
"""Renderers turn frames into text, HTML or figures: they read no store and run no analysis."""

MAX_LINES = 600
GENERATED = {"traceq.ingest.cupti_cbid"}


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in SKIP or rel.parts[0].startswith("."):
            continue
        parts = ("traceq", *rel.with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node but those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The traceq modules `name` imports (a `from package import module` names the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def layer_of(name: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if name == prefix or (prefix != "traceq" and name.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best[0]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_the_walk_finds_the_package(graph):
    assert {"traceq.api", "traceq.cli", "traceq.store", "traceq.analysis.structure.attribution"} <= set(graph)
    assert "traceq.store" in graph["traceq.ingest"]  # readers write into the store


def test_imports_run_one_way(graph):
    wrong = []
    for name, targets in sorted(graph.items()):
        mine = layer_of(name)
        for target in sorted(targets):
            theirs = layer_of(target)
            allowed = theirs <= mine and (LAYERS[mine][0] != "render" or LAYERS[theirs][0] in RENDER_MAY_IMPORT)
            if LAYERS[theirs][0] == "render" and LAYERS[mine][0] not in ("render", "api", "cli"):
                allowed = False
            if not allowed:
                wrong.append(f"{name} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})")
    assert not wrong, "\n".join(wrong)


def test_no_import_circles(graph):
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, circles


def test_a_circle_and_a_wrong_way_import_are_found(tmp_path):
    """The walk itself: a function-level import counts, a TYPE_CHECKING one does not."""
    (tmp_path / "a.py").write_text("def f():\n    from traceq.b import x\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from traceq.a import f\n")
    known = {"traceq.a": tmp_path / "a.py", "traceq.b": tmp_path / "b.py"}
    assert imports("traceq.a", known["traceq.a"], known) == {"traceq.b"}
    assert imports("traceq.b", known["traceq.b"], known) == set()


def test_modules_stay_small():
    big = {name: n for name, path in modules().items()
           if name not in GENERATED and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not big, big


def test_every_package_says_what_belongs_in_it():
    for name, path in modules().items():
        if path.name == "__init__.py":
            assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))), f"{name} has no docstring"
