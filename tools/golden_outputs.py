"""Every command's `-f json` output on every bundled sample, as one JSON document.

`python tools/golden_outputs.py tests/golden/outputs.json.gz` writes what the code of this
checkout prints; `tests/test_outputs_unchanged.py` runs the same commands and compares them with
that file (digests: exit code, length, first characters, SHA-256), so a change meant to leave behaviour alone (a regrouping of modules, a speed-up)
is checked command by command on every sample. Re-record only when a change of output is meant.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"

SINGLE = ["alexnet_b128_cudnn.sqlite", "alexnet_b256_amp.sqlite", "alexnet_b256_amp_kineto.json",
          "alexnet_b256_amp_layers_kineto.json.gz", "alexnet_b256_cudnn.sqlite", "alexnet_b256_fp32_layers_kineto.json.gz",
          "alexnet_b256_kineto.json", "alexnet_b256_nocudnn.sqlite", "alexnet_b64_graph.sqlite",
          "alexnet_b64_nocache.sqlite", "badloop_mlp.sqlite", "ddp_resnet18_2gpu.sqlite", "lenet_b256_cudnn.sqlite",
          "resnet50_b32_amp_layers_kineto.json.gz", "resnet50_b32_amp_ops.sqlite", "ncu/alexnet_b256_fp32.sqlite",
          "ncu/resnet50_b32_fp32.sqlite"]
RUNS = {"ddp50": "multigpu/ddp_resnet50_2gpu_rank{}.sqlite", "ddp50k": "multigpu/ddp_resnet50_2gpu_kineto_rank{}.json.gz",
        "fsdp": "multigpu/fsdp_transformer_2gpu_rank{}.sqlite", "fsdpk": "multigpu/fsdp_transformer_2gpu_kineto_rank{}.json.gz"}
STATS = ("cuda_api_sum", "cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum", "nvtx_sum",
         "nvtx_gpu_proj_sum", "cuda_kern_exec_sum")
TRACE_COMMANDS = [
    ["top"], ["top", "--by", "short"], ["top", "--instances"], ["top", "--no-context"], ["layers"], ["libs"],
    ["libs", "--by-layer"], ["stages"], ["ru", "--by", "kernel"], ["ru", "--by", "layer"], ["ru", "--by", "library"],
    ["ce", "--by", "layer"], ["ce", "--by", "kernel"], ["ce", "--by", "library"], ["traffic"], ["idle"],
    ["idle", "--by", "iteration"], ["idle", "--by", "stream"], ["idle", "--by", "layer"], ["launches"], ["advise"],
    ["memory"], ["memory", "--by", "time"], *(["stats", "--report", r] for r in STATS),
]
SPEC_COMMANDS = [["ce", "--by", "layer"], ["traffic"], ["traffic", "--by", "kernel"]]
RUN_COMMANDS = [["comm"], ["comm", "--by", "instance"], ["overlap"], ["ranks"], ["ranks", "--by", "collective"]]
PAIRS = [("alexnet_b256_cudnn", "alexnet_b64_nocache"), ("alexnet_b256_cudnn", "alexnet_b256_nocudnn"),
         ("alexnet_b128_cudnn", "alexnet_b256_cudnn"), ("alexnet_b256_cudnn", "ddp_resnet18_2gpu")]


def commands() -> list[list[str]]:
    """Every command line, without --db and -f json (added when run); `SAMPLES/` stands for the
    sample folder, wherever the checkout is, so the lines name the outputs the same everywhere."""
    out: list[list[str]] = [["traces"]]
    names = [Path(f).name.split(".")[0] for f in SINGLE]
    for name in names:
        out += [[*c, "-t", name] for c in TRACE_COMMANDS]
    spec = "SAMPLES/alexnet.model.toml"  # the sample folder's path is put in when the command runs
    for name in ("alexnet_b256_cudnn", "alexnet_b128_cudnn"):
        out += [[*c, "-t", name, "--spec", spec] for c in SPEC_COMMANDS]
    for run in ("ddp_resnet18_2gpu", *RUNS):
        out += [[*c, run] for c in RUN_COMMANDS]
    for a, b in PAIRS:
        out += [["compare", a, b, "--by", by] for by in ("layer", "kernel", "library", "stage")]
    out += [["compare", "alexnet_b256_cudnn", "alexnet_b64_nocache", "--gate", "5%"],
            ["compare", "ddp50", "ddp50k", "--by", "stage"]]
    out += [["occupancy", "--cc", "9.0", "--threads", "256", "--regs", "64", "--grid", "4096", "--sms", "132"],
            ["sql", "SELECT t.name, count(*) AS n FROM kernels k JOIN traces t USING (trace_id) GROUP BY ALL ORDER BY ALL"]]
    lenet = "SAMPLES/lenet.model.toml"
    out += [[*c, "-t", "lenet_b256_cudnn", "--spec", lenet] for c in SPEC_COMMANDS]
    return out


def load(db: Path) -> None:
    from typer.testing import CliRunner

    from traceq.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["load", *(str(SAMPLES / f) for f in SINGLE), "--db", str(db)])
    assert result.exit_code == 0, result.output
    for run, pattern in RUNS.items():
        files = [str(SAMPLES / pattern.format(r)) for r in (0, 1)]
        result = runner.invoke(app, ["load", *files, "--run", run, "--db", str(db)])
        assert result.exit_code == 0, result.output


def run(db: Path, command: list[str]) -> dict[str, object]:
    """exit code and stdout of one command (stderr kept apart: its notes are not output)."""
    from typer.testing import CliRunner

    from traceq.cli import app

    store = [] if command[0] == "occupancy" else ["--db", str(db)]
    command = [str(SAMPLES / word.removeprefix("SAMPLES/")) if word.startswith("SAMPLES/") else word
               for word in command]
    result = CliRunner().invoke(app, [*command, *store, "-f", "json"])
    return {"exit": result.exit_code, "stdout": result.stdout if result.exit_code == 0 else result.stderr.strip()}


def outputs(db: Path) -> dict[str, dict[str, object]]:
    return {" ".join(c): run(db, c) for c in commands()}


def _stable(key: str, record: dict[str, object]) -> dict[str, object]:
    """`traces` carries the load's time and path: left out of the comparison."""
    if key == "traces" and record["exit"] == 0:
        rows = json.loads(str(record["stdout"]))
        for row in rows:
            for volatile in ("loaded_at", "load_seconds", "source_path", "load_s"):
                row.pop(volatile, None)
        return {"exit": 0, "stdout": json.dumps(rows, sort_keys=True)}
    return record


def digest(record: dict[str, object]) -> dict[str, object]:
    """What the file keeps of one output: its exit code, its length, its first 120 characters and
    its SHA-256 (the whole output would be 19 MB)."""
    text = str(record["stdout"])
    return {"exit": record["exit"], "chars": len(text), "head": text[:120],
            "sha256": hashlib.sha256(text.encode()).hexdigest()}


def main(target: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "golden.duckdb"
        load(db)
        found = {k: digest(_stable(k, v)) for k, v in outputs(db).items()}
    with gzip.open(target, "wt") as f:
        json.dump(found, f, indent=0, sort_keys=True)
    print(f"{len(found)} commands, {sum(v['exit'] == 0 for v in found.values())} succeeded -> {target}")


if __name__ == "__main__":
    main(sys.argv[1])
