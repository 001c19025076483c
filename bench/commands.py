"""Wall time, CPU time and peak RSS of traceq commands on a loaded store (run on demand).

    python bench/scale.py ../shared/reference/alexnet_b256_nocudnn.sqlite --kernels 10000000 \\
        -o /tmp/traceq-bench/alexnet_10M.sqlite
    traceq load /tmp/traceq-bench/alexnet_10M.sqlite --db /tmp/traceq-bench/alexnet_10M.duckdb
    python bench/commands.py /tmp/traceq-bench/alexnet_10M.duckdb [--repeat 3] [COMMAND ...]

Each command (default: `idle`, `idle --by iteration`, `idle --by stream`, `launches`, `advise`
and `stats --report R` for every report) runs as a child process (`python -m traceq ... --db
STORE`), --repeat times; the figures are the median wall and CPU times and the largest peak RSS
(`bench/run.py`'s measurement, whose helpers this reuses). Prints a markdown table.

`--against DIR` compares with another revision in the same run: DIR holds that revision as a
folder named `traceq` (`mkdir -p DIR/traceq && git archive main | tar -x -C DIR/traceq`); each
repeat runs both, one after the other, and the table gains its column and the CPU ratio.
`--against-store` gives that revision a store of its own, loaded by it, where the two revisions'
store schemas differ.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import Run, fmt, machine, median, repeat, run  # noqa: E402  (bench/run.py, beside this file)

REPORTS = ("cuda_api_sum", "cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum", "nvtx_sum",
           "nvtx_gpu_proj_sum", "cuda_kern_exec_sum")
DEFAULT = ["idle", "idle --by iteration", "idle --by stream", "launches", "advise",
           *[f"stats --report {r}" for r in REPORTS]]


def interleaved(n: int, argv: list[str], env: dict[str, str], other_argv: list[str] | None = None
                ) -> tuple[Run | str, Run | str]:
    """`repeat` of argv with env (other_argv, if given) and of argv without it, the two alternating
    (a busy machine slows both alike)."""
    other: list[Run | str] = []
    this: list[Run | str] = []
    for _ in range(n):
        other.append(run(other_argv or argv, env))
        this.append(run(argv))
    return median(other), median(this)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", type=Path)
    parser.add_argument("commands", nargs="*", default=DEFAULT, help="traceq commands, quoted [default: %(default)s]")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", type=Path, help="a folder holding another revision as `traceq`, run alongside")
    parser.add_argument("--against-store", type=Path,
                        help="the store that revision reads (default: STORE; needed when their schemas differ)")
    args = parser.parse_intermixed_args()
    lines = [f"Store: {args.store}, median of {args.repeat} runs", *machine(), ""]
    if args.against is None:
        lines += ["| command | wall (CPU, peak RSS) |", "|---|---|"]
    else:
        lines += [f"| command | {args.against} | this checkout | CPU ratio |", "|---|---|---|---|"]
    for command in args.commands:
        argv = [sys.executable, "-m", "traceq", *shlex.split(command), "--db", str(args.store)]
        if args.against is None:
            lines.append(f"| `traceq {command}` | {fmt(repeat(args.repeat, argv))} |")
        else:
            other_argv = argv[:-1] + [str(args.against_store)] if args.against_store else None
            other, this = interleaved(args.repeat, argv, {"PYTHONPATH": str(args.against.resolve())}, other_argv)
            ratio = f"{this.cpu / other.cpu:.2f}" if isinstance(this, Run) and isinstance(other, Run) else ""
            lines.append(f"| `traceq {command}` | {fmt(other)} | {fmt(this)} | {ratio} |")
        print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
