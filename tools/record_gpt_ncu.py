"""One training step of the tiny GPT of tools/record_conventions.py recorded twice, for checking
traceq's bytes per kernel (the roofline's x axis) against Nsight Compute's measured DRAM bytes:

- `--mode trace`: two unprofiled warm-up steps, then one step under `torch.profiler` (CPU and CUDA
  activities, record_shapes=True) written to OUT/gpt_ncu_step.json.gz, with a truth file;
- `--mode ncu`: the same warm-up, then the same step between cudaProfilerStart/Stop, for
  `ncu --profile-from-start off` (tools/record_gpt_ncu.sh has the command line).

Same seed, data and model in both, so the step launches the same kernels in the same order;
`traceq load --ncu CSV --into TRACE` joins them by name and launch order.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("trace", "ncu"), required=True)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import torch
    from record_conventions import Workload, gzip_file, truth

    work = Workload(torch, "gpt")
    for _ in range(2):
        work.step()
    torch.cuda.synchronize()
    if args.mode == "ncu":
        torch.cuda.cudart().cudaProfilerStart()
        work.step()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        return
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        work.step()
        torch.cuda.synchronize()
    raw = args.out / "gpt_ncu_step.json"
    prof.export_chrome_trace(str(raw))
    gzip_file(raw)
    truth(args.out, "gpt_ncu_step", steps=1, **work.facts())
    print(json.dumps({"trace": str(raw) + ".gz"}))


if __name__ == "__main__":
    main()
