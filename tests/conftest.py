"""Shared fixtures: the bundled sample traces, ../shared when present, and loaded stores."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
SHARED = ROOT.parent / "shared"


def sample(name: str) -> Path:
    """A file in sample_traces/; fails loudly when it is missing."""
    path = SAMPLES / name
    assert path.exists(), f"missing sample trace {path}"
    return path


def shared(*parts: str) -> Path:
    """A path under ../shared; skips the test when ../shared is not beside the checkout."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent: tests on the team's and public real traces skipped")
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return path


def shared_files(folder: str, pattern: str) -> list[Path]:
    """Files for parametrizing; an empty list (the test then skips) when ../shared is absent."""
    base = SHARED / folder
    return sorted(base.glob(pattern)) if base.is_dir() else []


NCU_STACK = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"


def ncu_rows(path: Path) -> list[dict[str, str]]:
    """The kernel rows of a gzipped Nsight Compute `--csv --page raw` file (its leading `==`
    notices and the units row dropped), read with the csv module."""
    import csv
    import gzip
    import io

    text = gzip.decompress(path.read_bytes()).decode("utf-8")
    lines = [line for line in text.splitlines(keepends=True) if not line.startswith("==")]
    return list(csv.DictReader(io.StringIO("".join(lines))))[1:]


def ncu_layer(row: dict[str, str]) -> str:
    """The innermost NVTX push/pop range an Nsight Compute `--nvtx` row was launched in ('' if none)."""
    import re

    stack = re.findall(r'"<default domain>:([^:]*):', row[NCU_STACK])
    return stack[-1] if stack else ""


def source_rows(path: Path, sql: str) -> list[tuple]:
    """The rows of a query on an SQLite file, read independently of traceq."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def source_count(path: Path, table: str, where: str = "") -> int:
    """Rows in a table of an SQLite file, counted independently of traceq (0 when absent)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if table not in tables:
            return 0
        return con.execute(f'SELECT count(*) FROM "{table}" {where}').fetchone()[0]
    finally:
        con.close()


@pytest.fixture(scope="session")
def sample_store(tmp_path_factory: pytest.TempPathFactory):
    """A store holding every bundled nsys sample, loaded once for the session (read-only use)."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    db = tmp_path_factory.mktemp("store") / "samples.duckdb"
    con = open_store(db, create=True)
    for path in sorted(SAMPLES.glob("*.sqlite")):
        load_trace(con, path)
    yield con
    con.close()


@pytest.fixture(scope="session")
def resnet50_store(tmp_path_factory: pytest.TempPathFactory):
    """(connection, trace id) of the team's ResNet-50 emit_nvtx trace (26 MB, 107k NVTX ranges),
    loaded once for the session; skips without ../shared."""
    from traceq.api.loading import load_trace
    from traceq.store import open_store

    path = shared("reference", "resnet50_b32_autograd_40it.sqlite")
    con = open_store(tmp_path_factory.mktemp("resnet50") / "r50.duckdb", create=True)
    yield con, load_trace(con, path).trace_id
    con.close()


DLRM = shared_files("realtraces/kineto_json", "facebookresearch__param__dlrm_kineto__worker*.json.gz")
"""The 8 ranks of the PARAM DLRM Kineto job (one file per rank)."""


@pytest.fixture(scope="session")
def dlrm_store(tmp_path_factory: pytest.TempPathFactory):
    """(connection, run id) of a store holding the 8 DLRM rank files as the run 'dlrm8', loaded
    once for the session; skips without ../shared."""
    from traceq.api.loading import load_run
    from traceq.store import open_store

    if len(DLRM) != 8:
        pytest.skip("the DLRM rank files are absent")
    con = open_store(tmp_path_factory.mktemp("dlrm") / "dlrm.duckdb", create=True)
    load_run(con, DLRM, "dlrm8")
    yield con, int(con.execute("SELECT run_id FROM runs WHERE name = 'dlrm8'").fetchone()[0])
    con.close()


def assert_load_refused(db: Path, target: Path | list[Path], *words: str, options: tuple[str, ...] = ()) -> str:
    """`traceq load target [options]` fails as bad input must: one `traceq:` line on stderr
    naming `words`, exit 1, no traceback, and the store file byte for byte as it was (or still
    absent). `target` may be several files (a run)."""
    import hashlib

    from typer.testing import CliRunner

    from traceq.cli import app

    def digest() -> str | None:
        return hashlib.sha256(db.read_bytes()).hexdigest() if db.exists() else None

    before = digest()
    targets = [str(t) for t in (target if isinstance(target, list) else [target])]
    result = CliRunner().invoke(app, ["load", *targets, "--db", str(db), *options])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceq: "), result.stderr
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], lines[0]
    assert digest() == before, "the store changed"
    return lines[0]


def trace_id(con, name: str) -> int:
    from traceq.store import resolve_trace

    return resolve_trace(con, name)[0]


_SPEC = str(SAMPLES / "alexnet.model.toml")
TABLE_COMMANDS = {
    "traces": ["traces"],
    "top": ["top", "-t", "alexnet_b256_cudnn"],
    "top short": ["top", "-t", "ddp_resnet18_2gpu", "--by", "short", "-k", "30"],
    "top instances": ["top", "--instances", "-t", "alexnet_b256_cudnn"],
    "layers": ["layers", "-t", "alexnet_b256_cudnn"],
    "libs": ["libs", "-t", "alexnet_b256_cudnn"],
    "libs by layer": ["libs", "--by-layer", "-t", "alexnet_b256_cudnn"],
    "stages": ["stages", "-t", "ddp_resnet18_2gpu"],
    "ru kernel": ["ru", "--by", "kernel", "-t", "alexnet_b256_cudnn"],
    "ru layer": ["ru", "--by", "layer", "-t", "alexnet_b256_cudnn"],
    "ru library": ["ru", "--by", "library", "-t", "alexnet_b256_cudnn"],
    "ce layer": ["ce", "--by", "layer", "--spec", _SPEC, "-t", "alexnet_b256_cudnn"],
    "ce kernel": ["ce", "--by", "kernel", "--spec", _SPEC, "-t", "alexnet_b256_cudnn"],
    "ce library": ["ce", "--by", "library", "--spec", _SPEC, "-t", "alexnet_b256_cudnn"],
    "compare layer": ["compare", "alexnet_b256_cudnn", "alexnet_b64_nocache", "--spec", _SPEC],
    "compare kernel": ["compare", "alexnet_b256_cudnn", "alexnet_b64_nocache", "--by", "kernel", "-k", "40"],
    "compare stage": ["compare", "alexnet_b256_cudnn", "alexnet_b64_nocache", "--by", "stage"],
    "memory layer": ["memory", "-t", "alexnet_b64_nocache"],
    "memory time": ["memory", "--by", "time", "-t", "lenet_b256_cudnn"],
    "top kineto": ["top", "-t", "alexnet_b256_kineto"],
    "ru layer kineto": ["ru", "--by", "layer", "-t", "alexnet_b256_kineto"],
    "traffic layer": ["traffic", "--spec", _SPEC, "-t", "alexnet_b256_cudnn"],
    "traffic kernel": ["traffic", "--by", "kernel", "--spec", _SPEC, "-t", "alexnet_b256_cudnn"],
    "idle": ["idle", "-t", "ddp_resnet18_2gpu"],
    "idle iteration": ["idle", "--by", "iteration", "-t", "ddp_resnet18_2gpu"],
    "idle stream": ["idle", "--by", "stream", "-t", "ddp_resnet18_2gpu"],
    "idle layer": ["idle", "--by", "layer", "-t", "alexnet_b256_cudnn"],
    "launches": ["launches", "-t", "alexnet_b256_cudnn"],
    **{f"stats {r}": ["stats", "--report", r, "-t", "ddp_resnet18_2gpu"]
       for r in ("cuda_api_sum", "cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum", "nvtx_sum",
                 "nvtx_gpu_proj_sum", "cuda_kern_exec_sum")},
    "comm": ["comm", "ddp_resnet18_2gpu"],
    "comm instance": ["comm", "ddp_resnet18_2gpu", "--by", "instance"],
    "overlap": ["overlap", "ddp_resnet18_2gpu"],
    "ranks": ["ranks", "ddp_resnet18_2gpu"],
    "ranks collective": ["ranks", "ddp_resnet18_2gpu", "--by", "collective"],
    "compare gpus": ["compare", "alexnet_b256_cudnn", "ddp_resnet18_2gpu", "--by", "stage"],
}
"""Every tabular command (and grouping), as run against `cli_store`."""


@pytest.fixture(scope="session")
def cli_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store file for CLI tests (read-only use) with five samples, loaded by `traceq load`."""
    from typer.testing import CliRunner

    from traceq.cli import app

    path = tmp_path_factory.mktemp("cli-store") / "s.duckdb"
    names = ["alexnet_b256_cudnn.sqlite", "alexnet_b64_nocache.sqlite", "ddp_resnet18_2gpu.sqlite",
             "lenet_b256_cudnn.sqlite", "alexnet_b256_kineto.json"]
    result = CliRunner().invoke(app, ["load", *(str(sample(n)) for n in names), "--db", str(path)])
    assert result.exit_code == 0, result.output
    return path
