"""Two-GPU recordings with planted problems, for validating `advise` and `whatif --overlap-comm`
on real runs (issues 34 and 37). A wide MLP under DistributedDataParallel whose gradients are
all-reduced in ONE bucket after the whole backward pass, so communication is exposed, not hidden.

Launched by torchrun, one process per GPU (`tools/record_multigpu_plants.sh` records all three):

    torchrun --nproc_per_node 2 tools/record_multigpu_plants.py                 # base
    torchrun --nproc_per_node 2 tools/record_multigpu_plants.py --no-sync       # no communication
    torchrun --nproc_per_node 2 tools/record_multigpu_plants.py --straggle-ms 10  # rank 1 late

- base: forward, backward (one all-reduce of every gradient at its end), SGD step.
- `--no-sync`: forward and backward under DDP's `no_sync()`: the same work, no all-reduce. The
  base iteration minus this one is what the exposed communication costs.
- `--straggle-ms N`: rank 1's host sleeps N ms each step before its forward; the others wait
  for it at the all-reduce. This iteration minus the base one is what the straggler costs.
- NVTX as in tools/record_multigpu.py: `iteration N` enclosing `data_copy`, `forward`,
  `backward`, `weight_update`, a range per Linear layer. cudaProfilerStart/Stop bracket the
  captured steps (nsys --capture-range=cudaProfilerApi).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_training as rt  # the single-GPU recorder's annotations


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=32, help="per GPU")
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-sync", action="store_true", help="backward under no_sync(): no all-reduce")
    p.add_argument("--straggle-ms", type=float, default=0.0, help="rank 1 sleeps this long before its forward")
    args = p.parse_args()

    dist.init_process_group("nccl")
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    rt.ANNOTATE = rt._Annotations(kineto=False)
    torch.manual_seed(0)
    from torch.nn.parallel import DistributedDataParallel

    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers).to(dev)
    rt.layer_modules = lambda m: [(n, x) for n, x in m.named_modules() if isinstance(x, nn.Linear)]
    rt.add_nvtx_hooks(model)
    # one bucket (larger than every gradient together): the all-reduce starts after the backward
    model = DistributedDataParallel(model, device_ids=[local], bucket_cap_mb=1 << 16, gradient_as_bucket_view=True)
    x_host = torch.randn(args.batch, args.width).pin_memory()
    y_host = torch.randn(args.batch, args.width).pin_memory()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    sleep = args.straggle_ms / 1000 if rank == 1 else 0.0

    def step(label: str) -> None:
        with rt.stage(label):
            with rt.stage("data_copy"):
                x, y = x_host.to(dev, non_blocking=True), y_host.to(dev, non_blocking=True)
            if sleep:
                time.sleep(sleep)
            with model.no_sync() if args.no_sync else contextlib.nullcontext():
                with rt.stage("forward"):
                    loss = nn.functional.mse_loss(model(x), y)
                with rt.stage("backward"):
                    loss.backward()
            with rt.stage("weight_update"):
                opt.step()
                opt.zero_grad(set_to_none=False)
        torch.cuda.synchronize()

    for i in range(args.warmup):
        step(f"warmup {i}")
    dist.barrier()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for i in range(args.iterations):
        step(f"iteration {i}")
    torch.cuda.cudart().cudaProfilerStop()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
