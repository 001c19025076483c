"""The distribution as a user gets it: `python -m build` makes an sdist and a wheel; the wheel
holds the package and its data (schema, rules, the docs the MCP server serves) and nothing of the
repository's own (tests, bench, tools, samples); installed alone into an empty folder, it loads a
bundled sample and prints `top`."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES

pytest.importorskip("build")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # from a copy of the tracked tree, so the checkout's build/ and egg-info are left alone
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, files):
        target = src / name.decode()
        if (ROOT / name.decode()).is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((ROOT / name.decode()).read_bytes())
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
                   check=True, capture_output=True)
    return out


def test_wheel_carries_the_package_and_nothing_else(dist: Path) -> None:
    (wheel,) = dist.glob("traceq_gpu-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"traceq", next(t for t in tops if t.endswith(".dist-info"))}
    for needed in ("traceq/schema.sql", "traceq/analysis/kernels/kernel_rules.toml", "traceq/cli/__init__.py",
                   "traceq/agents/server.py", "traceq/docs/schema.md", "traceq/py.typed"):
        assert needed in names, needed
    for absent in ("traceq/tests/", "traceq/bench/", "traceq/tools/", "traceq/sample_traces/", "traceq/build/"):
        assert not any(n.startswith(absent) for n in names), absent
    assert not any(n.endswith((".png", ".duckdb", ".sqlite", ".pyc")) for n in names)
    meta = next(n for n in names if n.endswith("entry_points.txt"))
    assert "traceq = traceq.cli:main" in zipfile.ZipFile(wheel).read(meta).decode()


def test_sdist_builds_with_what_the_tests_need(dist: Path) -> None:
    (sdist,) = dist.glob("traceq_gpu-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    assert any(n.endswith("/pyproject.toml") for n in names)
    assert any("/sample_traces/" in n for n in names) and any("/tests/" in n for n in names)


def test_installed_wheel_loads_a_sample_and_prints_top(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("traceq_gpu-*.whl")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                    str(site), str(wheel)], check=True, capture_output=True)
    # the installed copy, ahead of this checkout's editable install (the dependencies come from this venv)
    env = {**os.environ, "PYTHONPATH": str(site), "TRACEQ_DB": str(tmp_path / "t.duckdb"), "COLUMNS": "120"}
    where = subprocess.run([sys.executable, "-c", "import traceq; print(traceq.__file__)"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site))
    load = subprocess.run([sys.executable, "-m", "traceq", "load", str(SAMPLES / "lenet_b256_cudnn.sqlite")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert load.returncode == 0, load.stderr
    top = subprocess.run([sys.executable, "-m", "traceq", "top", "--k", "3"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=False)
    assert top.returncode == 0, top.stderr
    assert "lenet_b256_cudnn: top 3 kernels" in top.stdout
    version = subprocess.run([sys.executable, "-m", "traceq", "--version"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, check=True).stdout
    assert version.startswith("traceq ")


def test_the_unrelated_namesake_is_named_when_installed_beside(dist: Path, tmp_path: Path) -> None:
    """`traceq` on the package index is another project: its metadata beside ours gets one line."""
    (wheel,) = dist.glob("traceq_gpu-*.whl")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    quiet = subprocess.run([sys.executable, "-m", "traceq", "--version"], env=env, capture_output=True, text=True,
                           check=False)
    assert quiet.returncode == 0 and quiet.stderr == ""
    (site / "traceq-0.0.1.dist-info").mkdir()
    (site / "traceq-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: traceq\nVersion: 0.0.1\n")
    noted = subprocess.run([sys.executable, "-m", "traceq", "--version"], env=env, capture_output=True, text=True,
                           check=False)
    assert noted.returncode == 0 and "unrelated package named 'traceq'" in noted.stderr
