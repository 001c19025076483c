"""Wall time, CPU time and peak RSS of traceq commands on a loaded store (run on demand).

    python bench/scale.py ../shared/reference/alexnet_b256_nocudnn.sqlite --kernels 10000000 \\
        -o /tmp/traceq-bench/alexnet_10M.sqlite
    traceq load /tmp/traceq-bench/alexnet_10M.sqlite --db /tmp/traceq-bench/alexnet_10M.duckdb
    python bench/commands.py /tmp/traceq-bench/alexnet_10M.duckdb [--repeat 3] [COMMAND ...]

Each command (default: `idle`, `idle --by iteration`, `idle --by stream`, `launches`, `advise`
and `stats --report R` for every report) runs as a child process (`python -m traceq ... --db
STORE`), --repeat times; the figures are the median wall and CPU times and the largest peak RSS
(`bench/run.py`'s measurement, whose helpers this reuses). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import fmt, machine, repeat  # noqa: E402  (bench/run.py, beside this file)

REPORTS = ("cuda_api_sum", "cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum", "nvtx_sum",
           "nvtx_gpu_proj_sum", "cuda_kern_exec_sum")
DEFAULT = ["idle", "idle --by iteration", "idle --by stream", "launches", "advise",
           *[f"stats --report {r}" for r in REPORTS]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", type=Path)
    parser.add_argument("commands", nargs="*", default=DEFAULT, help="traceq commands, quoted [default: %(default)s]")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_intermixed_args()
    lines = [f"Store: {args.store}, median of {args.repeat} runs", *machine(), "",
             "| command | wall (CPU, peak RSS) |", "|---|---|"]
    for command in args.commands:
        result = repeat(args.repeat, [sys.executable, "-m", "traceq", *shlex.split(command), "--db", str(args.store)])
        lines.append(f"| `traceq {command}` | {fmt(result)} |")
        print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
