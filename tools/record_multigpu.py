"""Run a few steps of data-parallel training on every GPU of one machine, annotated the way
traceq's reference traces are, for recording under Nsight Systems or PyTorch's profiler.

Launched by torchrun, one process per GPU (`tools/record_device.sh multigpu` has the exact
command lines):

    torchrun --nproc_per_node 2 tools/record_multigpu.py --model resnet50 --batch 32
    torchrun --nproc_per_node 2 tools/record_multigpu.py --model transformer --kineto out/fsdp

- `--model resnet50`: torchvision's ResNet-50 under DistributedDataParallel (gradient buckets
  all-reduced over NCCL while the backward pass runs).
- `--model transformer`: a small transformer encoder (6 layers, d_model 1024, 16 heads, sequence
  512, a 32,000-token vocabulary) under FSDP (`fully_shard` per encoder layer and on the whole
  model): parameters all-gathered before each layer's forward and backward, gradients
  reduce-scattered after its backward.
- NVTX as in the single-GPU recordings (`tools/record_training.py`): `iteration N` enclosing
  `data_copy`, `forward`, `backward`, `weight_update` on the main thread, and a range per layer
  from module hooks (ResNet-50: convolutions, batch norms, ... by qualified name; the
  transformer: `embed`, `encoder.layers.N`, `head`), backward ranges `b` + name on the autograd
  thread. NCCL adds its own ranges (domain NCCL) unless NCCL_NVTX_DISABLE is set.
- `--kineto PREFIX`: record the captured steps with torch.profiler instead and write one
  Chrome-trace JSON per rank, `PREFIX_rank{R}.json` (with `distributedInfo`).

The captured steps are bracketed by `cudaProfilerStart()`/`cudaProfilerStop()` on every rank, so
`nsys --capture-range=cudaProfilerApi` records only the steady state.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_training as rt  # noqa: E402  (the single-GPU recorder's annotations)


class Transformer(nn.Module):
    def __init__(self, vocab: int = 32000, d_model: int = 1024, heads: int = 16, layers: int = 6):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def transformer_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules that get a layer range in the transformer: embedding, each encoder layer, head."""
    return [(name, m) for name, m in model.named_modules()
            if name == "embed" or name == "head" or (name.startswith("encoder.layers.") and name.count(".") == 2)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50", choices=["resnet50", "transformer"])
    p.add_argument("--batch", type=int, default=32, help="per GPU")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--kineto", help="write PREFIX_rank{R}.json with torch.profiler")
    args = p.parse_args()

    dist.init_process_group("nccl")
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    rt.ANNOTATE = rt._Annotations(kineto=bool(args.kineto))
    torch.manual_seed(rank)

    if args.model == "resnet50":
        import torchvision
        from torch.nn.parallel import DistributedDataParallel

        model = torchvision.models.resnet50(weights=None).to(dev)
        rt.add_nvtx_hooks(model)
        model = DistributedDataParallel(model, device_ids=[local])
        x_host = torch.randn(args.batch, 3, 224, 224).pin_memory()
        y_host = torch.randint(0, 1000, (args.batch,)).pin_memory()
        loss_of = lambda out, y: nn.functional.cross_entropy(out, y)  # noqa: E731
    else:
        model = Transformer().to(dev)
        rt.layer_modules = transformer_layers
        rt.add_nvtx_hooks(model)
        from torch.distributed.fsdp import fully_shard

        for layer in model.encoder.layers:
            fully_shard(layer)
        fully_shard(model)
        x_host = torch.randint(0, 32000, (args.batch, args.seq)).pin_memory()
        y_host = torch.randint(0, 32000, (args.batch, args.seq)).pin_memory()
        loss_of = lambda out, y: nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())  # noqa: E731
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(label: str) -> None:
        with rt.stage(label):
            with rt.stage("data_copy"):
                x, y = x_host.to(dev, non_blocking=True), y_host.to(dev, non_blocking=True)
            with rt.stage("forward"):
                loss = loss_of(model(x), y)
            with rt.stage("backward"):
                loss.backward()
            with rt.stage("weight_update"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    for i in range(args.warmup):
        step(f"warmup {i}")
    dist.barrier()
    torch.cuda.synchronize()
    profiler = None
    if args.kineto:
        # no schedule: a schedule's last active step ends its cycle and clears the events
        profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
            record_shapes=True)
        profiler.start()
    torch.cuda.cudart().cudaProfilerStart()
    for i in range(args.iterations):
        step(f"iteration {i}")
        if profiler is not None:
            profiler.step()
    torch.cuda.cudart().cudaProfilerStop()
    if profiler is not None:
        profiler.stop()
        profiler.export_chrome_trace(f"{args.kineto}_rank{rank}.json")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
