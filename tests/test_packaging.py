"""The repo root is the package: every subpackage is declared, data files ship (STYLE §4)."""

from __future__ import annotations

import hashlib
import re
import tomllib
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_SHIPPED = {"tests", "docs", "sample_traces", "build", "dist", "bench"}


def test_every_subpackage_is_declared() -> None:
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"traceq"}
    for init in ROOT.rglob("__init__.py"):
        parts = init.parent.relative_to(ROOT).parts
        if parts and parts[0] not in NOT_SHIPPED and not parts[0].startswith("."):
            found.add(".".join(("traceq", *parts)))
    assert found == declared


def test_no_stray_root_modules() -> None:
    """Every root .py ships inside the wheel as traceq.<name> (caveat 1): keep only package modules."""
    allowed = {"__init__.py", "__main__.py", "dataset.py", "errors.py", "store.py", "text.py", "units.py"}
    assert {p.name for p in ROOT.glob("*.py")} <= allowed
    assert not (ROOT / "tests" / "__init__.py").exists(), "tests/__init__.py brings back the double import"


def test_package_data_is_reachable() -> None:
    files = resources.files("traceq")
    assert "CREATE TABLE kernel_events" in files.joinpath("schema.sql").read_text()
    assert files.joinpath("py.typed").is_file()


def test_sample_manifest_matches_the_files() -> None:
    manifest = (ROOT / "sample_traces" / "MANIFEST.md").read_text()
    listed = dict(re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{16})` \|", manifest, re.MULTILINE))
    folder = ROOT / "sample_traces"
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != "MANIFEST.md"}
    assert set(listed) == present
    for name, prefix in listed.items():
        assert hashlib.sha256((ROOT / "sample_traces" / name).read_bytes()).hexdigest()[:16] == prefix, name


def test_sdist_carries_samples_and_docs() -> None:
    manifest_in = (ROOT / "MANIFEST.in").read_text().splitlines()
    assert "graft sample_traces" in manifest_in and "graft docs" in manifest_in
