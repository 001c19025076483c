"""Small training and inference runs recorded the ways other engineers record them, not the
team's way (no `conv1`/`bconv1` module-hook ranges, no `iteration N`): test material for the
structure recogniser (which iteration, pass, layer, stage each kernel belongs to).

One `--case NAME` a run (`tools/record_conventions.sh` runs them all on a GPU machine and packs
what they write). Each writes its trace into `--out` (Kineto JSON, gzip) or runs under nsys, and
a sidecar `<name>.truth.json` with what the program knows for certain: steps profiled, the
model's modules in order, the optimizer, whether torch.compile / CUDA graphs were used, versions.
No kernel is labelled here.

Models (seed 0, synthetic data):
- tiny GPT: decoder-only, 4 blocks, d_model 512, 8 heads, sequence 256, batch 8, vocabulary
  8192, nn.Linear / nn.LayerNorm / F.scaled_dot_product_attention(is_causal=True), AdamW, bf16
  autocast; top-level modules `embed`, `blocks.0`..`blocks.3`, `ln_f`, `head`.
- torchvision ResNet-18, batch 32, 224x224, SGD (momentum 0.9), fp32.

Cases and the exact command lines (as tools/record_conventions.sh runs them; NSYS is
/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys, R=`python3
tools/record_conventions.py --out DIR`):

- `kineto_resnet18_plain`: torch.profiler.profile(activities=[CPU, CUDA], record_shapes=True,
  schedule=schedule(wait=1, warmup=1, active=3, repeat=1), on_trace_ready=export_chrome_trace),
  prof.step() after each of 5 steps; no record_function or NVTX of ours. `$R --case
  kineto_resnet18_plain`
- `kineto_gpt_plain`: the same for the GPT.
- `kineto_gpt_modules`: the GPT, plus with_stack=True, with_modules=True.
- `kineto_gpt_compile`: `torch.compile(model)` (default mode), 3 unprofiled warm-up steps
  (compilation happens there), then the plain profiler as above (3 active steps).
- `kineto_gpt_compile_cold`: `torch.compile(model)`, profiled from the first (compiling) step:
  schedule(wait=0, warmup=0, active=4, repeat=1), 4 steps.
  (Each compile case gets its own fresh TORCHINDUCTOR_CACHE_DIR from the shell script.)
- `nsys_gpt_cudagraph_infer`: GPT inference (eval, weights bf16, no grad). Outside the capture
  range: warm-up of the decode forward on a side stream. Inside cudaProfilerStart/Stop: the
  capture of one decode-step forward (input (8, 1)) into a torch.cuda.CUDAGraph (no NVTX range
  around the capture), NVTX `prefill` around a forward of the whole (8, 256) prompt, then 16
  replays of the graph, each inside NVTX `decode N` (N = 0..15), the next token copied into the
  static input. `$NSYS profile -t cuda,nvtx -s none --cpuctxsw=none --capture-range=cudaProfilerApi
  --capture-range-end=stop --cuda-graph-trace=node -o nsys_gpt_cudagraph_infer $R --case
  nsys_gpt_cudagraph_infer`
- `nsys_gpt_cudagraph_infer_graphmode`: the same program, `--cuda-graph-trace=graph`.
- `nsys_resnet18_emit_nvtx`: ResNet-18 training, 2 warm-up steps, then 3 steps inside
  torch.autograd.profiler.emit_nvtx(record_shapes=True) and cudaProfilerStart/Stop, no other
  ranges. nsys as above without --cuda-graph-trace.
- `nsys_gpt_train_step`: GPT training, 2 warm-up steps, then 3 steps inside
  cudaProfilerStart/Stop; the only NVTX ranges: `train_step N` (N = 0..2) around each step and,
  inside, Megatron-style `forward-compute`, `backward-compute`, `optimizer-step`.
- `nsys_jax_mlp`: JAX, a jitted training step (`train_step`, XLA module `jit_train_step`) of a
  small MLP (1024-4096-4096-1024, gelu) with optax.adamw (manual SGD if optax is missing), 5
  steps, under nsys with no capture range (`$NSYS profile -t cuda,nvtx -s none --cpuctxsw=none
  -o nsys_jax_mlp $R --case nsys_jax_mlp`), so compilation and XLA's autotuning are in the
  trace. No XLA_FLAGS are set; the log prints XLA_FLAGS as seen.
- `kineto_fsdp_gpt` (2 GPUs): `torchrun --nproc_per_node 2 tools/record_conventions.py --case
  kineto_fsdp_gpt --out DIR`: the GPT under FSDP2 (`fully_shard` on each block, then on the
  model), the plain profiler (wait=1, warmup=1, active=3), one JSON per rank
  (`kineto_fsdp_gpt_rank{R}.json.gz`).
- `nsys_fsdp_gpt` (2 GPUs): `torchrun --nproc_per_node 2 --no-python $NSYS profile -t cuda,nvtx
  -s none --cpuctxsw=none --capture-range=cudaProfilerApi --capture-range-end=stop -o
  nsys_fsdp_gpt_rank%q{RANK} python3 tools/record_conventions.py --case nsys_fsdp_gpt --out DIR`:
  2 warm-up steps, 3 steps inside cudaProfilerStart/Stop, no NVTX of ours (NCCL's own ranges are
  on).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import sys
from pathlib import Path

STEPS = 3
GPT_MODULES = ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "head"]
VOCAB, SEQ, BATCH = 8192, 256, 8


def gpt(torch, nn):
    F = nn.functional

    class Block(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)
            self.heads = heads

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self, vocab: int = VOCAB, d: int = 512, heads: int = 8, layers: int = 4):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab)

        def forward(self, idx):
            x = self.embed(idx)
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    return GPT()


def truth(out: Path, name: str, **facts) -> None:
    facts = {"name": name, **facts}
    (out / f"{name}.truth.json").write_text(json.dumps(facts, indent=1) + "\n")
    print(f"truth {name}: {json.dumps(facts)}")


def torch_facts(torch) -> dict:
    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name()}
    try:
        import torchvision

        facts["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    return facts


def gzip_file(raw: Path) -> Path:
    path = raw.with_name(raw.name + ".gz")
    with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return path


def step_labels(path: Path) -> list[str]:
    """The ProfilerStep#N names the written trace holds (read back from the file, for the truth)."""
    with gzip.open(path, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    names = {e.get("name", "") for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    return sorted(names, key=lambda n: int(re.sub(r"\D", "", n) or 0))


class Workload:
    """A model, an optimizer and one training step, GPT or ResNet-18."""

    def __init__(self, torch, model_name: str, compiled: bool = False, fsdp: bool = False):
        from torch import nn

        self.torch, self.nn = torch, nn
        self.model_name = model_name
        torch.manual_seed(0)
        if model_name == "gpt":
            model = gpt(torch, nn).cuda()
            if fsdp:
                from torch.distributed.fsdp import fully_shard

                for block in model.blocks:
                    fully_shard(block)
                fully_shard(model)
            self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            self.optimizer = "AdamW"
            g = torch.Generator(device="cuda").manual_seed(1 + int(os.environ.get("RANK", "0")))
            self.data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device="cuda", generator=g)
            self.modules = list(GPT_MODULES)
        else:
            import torchvision

            model = torchvision.models.resnet18(num_classes=1000).cuda()
            self.opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            self.optimizer = "SGD"
            self.images = torch.randn(32, 3, 224, 224, device="cuda")
            self.labels = torch.randint(0, 1000, (32,), device="cuda")
            self.modules = [name for name, _ in model.named_children()]
        self.model = model
        self.step_model = torch.compile(model) if compiled else model

    def step(self, ranges: int | None = None) -> None:
        """One training step; with `ranges` = N, the Megatron-style NVTX ranges around its parts."""
        torch, F = self.torch, self.nn.functional
        nvtx = torch.cuda.nvtx
        if ranges is not None:
            nvtx.range_push(f"train_step {ranges}")
            nvtx.range_push("forward-compute")
        if self.model_name == "gpt":
            with torch.autocast("cuda", torch.bfloat16):
                logits = self.step_model(self.data[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), self.data[:, 1:].reshape(-1))
        else:
            loss = F.cross_entropy(self.step_model(self.images), self.labels)
        if ranges is not None:
            nvtx.range_pop()
            nvtx.range_push("backward-compute")
        loss.backward()
        if ranges is not None:
            nvtx.range_pop()
            nvtx.range_push("optimizer-step")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if ranges is not None:
            nvtx.range_pop()
            nvtx.range_pop()

    def facts(self) -> dict:
        return {"model": "tiny GPT" if self.model_name == "gpt" else "torchvision resnet18",
                "modules": self.modules, "optimizer": self.optimizer,
                "precision": "bf16 autocast" if self.model_name == "gpt" else "fp32",
                "batch": BATCH if self.model_name == "gpt" else 32, **torch_facts(self.torch)}


def kineto(case: str, out: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    fsdp = case == "kineto_fsdp_gpt"
    if fsdp:
        import torch.distributed as dist

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group("nccl")
    compiled = case.startswith("kineto_gpt_compile")
    cold = case == "kineto_gpt_compile_cold"
    work = Workload(torch, "resnet18" if "resnet18" in case else "gpt", compiled=compiled, fsdp=fsdp)
    name = f"{case}_rank{rank}" if fsdp else case
    warm = 3 if case == "kineto_gpt_compile" else 0
    for _ in range(warm):
        work.step()
    torch.cuda.synchronize()
    if cold:
        plan, total, sched = schedule(wait=0, warmup=0, active=STEPS + 1, repeat=1), STEPS + 1, \
            "schedule(wait=0, warmup=0, active=4, repeat=1)"
    else:
        plan, total, sched = schedule(wait=1, warmup=1, active=STEPS, repeat=1), STEPS + 2, \
            "schedule(wait=1, warmup=1, active=3, repeat=1)"
    raw = out / f"{name}.json"
    extra = {"with_stack": True, "with_modules": True} if case == "kineto_gpt_modules" else {}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, schedule=plan,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw)), **extra) as prof:
        for _ in range(total):
            work.step()
            prof.step()
    torch.cuda.synchronize()
    path = gzip_file(raw)
    facts = work.facts()
    truth(out, name, steps_profiled=total if cold else STEPS, steps_run=warm + total,
          unprofiled_warmup_steps_before_profiler=warm, profiler_schedule=sched,
          profiler_step_labels=step_labels(path),
          first_profiled_step_compiles=cold, compiled=compiled, compile_mode="default" if compiled else None,
          cuda_graphs=False, with_stack=bool(extra), with_modules=bool(extra), record_shapes=True,
          annotations_of_ours=None, fsdp="FSDP2 fully_shard per block and on the model" if fsdp else None,
          rank=rank, world_size=world, **facts)
    if fsdp:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def nsys_train(case: str, out: Path) -> None:
    """nsys_gpt_train_step, nsys_resnet18_emit_nvtx, nsys_fsdp_gpt: 2 warm-up steps, 3 in the range."""
    import torch
    from contextlib import nullcontext

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    fsdp = case == "nsys_fsdp_gpt"
    if fsdp:
        import torch.distributed as dist

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group("nccl")
    work = Workload(torch, "resnet18" if "resnet18" in case else "gpt", fsdp=fsdp)
    for _ in range(2):
        work.step()
    torch.cuda.synchronize()
    emit = case == "nsys_resnet18_emit_nvtx"
    ranges = case == "nsys_gpt_train_step"
    with torch.autograd.profiler.emit_nvtx(record_shapes=True) if emit else nullcontext():
        torch.cuda.cudart().cudaProfilerStart()
        for n in range(STEPS):
            work.step(ranges=n if ranges else None)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    name = f"{case}_rank{rank}" if fsdp else case
    truth(out, name, steps_profiled=STEPS, steps_run=STEPS + 2, unprofiled_warmup_steps_before_capture=2,
          capture="cudaProfilerStart/Stop (nsys --capture-range=cudaProfilerApi --capture-range-end=stop)",
          emit_nvtx="torch.autograd.profiler.emit_nvtx(record_shapes=True)" if emit else None,
          nvtx_ranges_of_ours=(["train_step N (N=0..2)", "forward-compute", "backward-compute", "optimizer-step"]
                               if ranges else []),
          compiled=False, cuda_graphs=False,
          fsdp="FSDP2 fully_shard per block and on the model" if fsdp else None,
          rank=rank, world_size=world, **work.facts())
    if fsdp:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def cudagraph_infer(name: str, out: Path) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = gpt(torch, nn).cuda().to(torch.bfloat16).eval()
    nvtx = torch.cuda.nvtx
    prompt = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
    token = torch.randint(0, VOCAB, (BATCH, 1), device="cuda")  # the graph's static input
    with torch.no_grad():
        model(prompt)  # warm-up of the prefill shapes (eager)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(token)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        torch.cuda.cudart().cudaProfilerStart()
        with torch.cuda.graph(graph):
            static_out = model(token)
        nvtx.range_push("prefill")
        logits = model(prompt)
        nvtx.range_pop()
        token.copy_(logits[:, -1:].argmax(-1))
        for n in range(16):
            nvtx.range_push(f"decode {n}")
            graph.replay()
            token.copy_(static_out[:, -1:].argmax(-1))
            nvtx.range_pop()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    truth(out, name, mode="inference, eval, no_grad, weights bf16 (no autocast)", prefill_steps=1,
          prefill_shape=[BATCH, SEQ], decode_steps=16, decode_shape=[BATCH, 1],
          nvtx_ranges_of_ours=["prefill", "decode N (N=0..15)"],
          cuda_graphs="one decode-step forward captured into torch.cuda.CUDAGraph inside the capture range, "
                      "outside every NVTX range of ours; replayed once inside each decode N",
          graph_replays=16, also_inside_decode_ranges="token.copy_(argmax of the graph's output), eager",
          nsys_cuda_graph_trace="graph" if name.endswith("graphmode") else "node",
          compiled=False, modules=list(GPT_MODULES), optimizer=None,
          capture="cudaProfilerStart/Stop (nsys --capture-range=cudaProfilerApi --capture-range-end=stop)",
          **torch_facts(torch))


def jax_mlp(out: Path, name: str = "nsys_jax_mlp") -> None:
    """A jitted MLP training step, STEPS times after its first (compiling) call. With
    `name` 'xplane_jax_mlp' the steps run under `jax.profiler.trace` (an XPlane in
    `out/xplane_jax_mlp/`); otherwise under whatever profiler runs the script (nsys)."""
    import contextlib

    import jax
    import jax.numpy as jnp

    print("XLA_FLAGS =", os.environ.get("XLA_FLAGS"), "devices", jax.devices())
    key = jax.random.PRNGKey(0)
    sizes = [1024, 4096, 4096, 1024]
    params = [{"w": jax.random.normal(k, (a, b), jnp.float32) * 0.02, "b": jnp.zeros((b,), jnp.float32)}
              for k, a, b in zip(jax.random.split(key, 3), sizes[:-1], sizes[1:])]
    kx, ky = jax.random.split(jax.random.PRNGKey(1))
    x = jax.random.normal(kx, (512, 1024))
    y = jax.random.normal(ky, (512, 1024))

    def loss_fn(p, x, y):
        for layer in p[:-1]:
            x = jax.nn.gelu(x @ layer["w"] + layer["b"])
        return jnp.mean((x @ p[-1]["w"] + p[-1]["b"] - y) ** 2)

    try:
        import optax

        tx = optax.adamw(1e-3)
        optimizer = f"optax.adamw (optax {optax.__version__})"
    except ImportError:
        tx = None
        optimizer = "manual SGD"
    state = tx.init(params) if tx is not None else None

    @jax.jit
    def train_step(p, s, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        if tx is None:
            return jax.tree_util.tree_map(lambda a, b: a - 1e-3 * b, p, g), s, loss
        updates, s = tx.update(g, s, p)
        return optax.apply_updates(p, updates), s, loss

    steps = int(os.environ.get("STEPS", "5"))
    losses = []
    profiling = (jax.profiler.trace(str(out / name), create_perfetto_link=False) if name.startswith("xplane")
                 else contextlib.nullcontext())
    with profiling:
        for _ in range(steps):
            params, state, loss = train_step(params, state, x, y)
            losses.append(float(loss))
        jax.block_until_ready(params)
    print("losses", losses)
    truth(out, name, steps=steps, jit_function="train_step", xla_module_expected="jit_train_step",
          model="MLP 1024-4096-4096-1024 gelu, float32, batch 512", optimizer=optimizer,
          compile_inside_trace=True, capture="whole process (no capture range)",
          xla_flags=os.environ.get("XLA_FLAGS"), jax=jax.__version__,
          jaxlib=getattr(__import__("jaxlib"), "__version__", None), devices=[str(d) for d in jax.devices()])


CASES = ["kineto_resnet18_plain", "kineto_gpt_plain", "kineto_gpt_modules", "kineto_gpt_compile",
         "kineto_gpt_compile_cold", "nsys_gpt_cudagraph_infer", "nsys_gpt_cudagraph_infer_graphmode",
         "nsys_resnet18_emit_nvtx", "nsys_gpt_train_step", "nsys_jax_mlp", "xplane_jax_mlp", "kineto_fsdp_gpt",
         "nsys_fsdp_gpt"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, choices=CASES)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("case", args.case, "python", sys.version.split()[0], flush=True)
    if args.case.startswith("nsys_gpt_cudagraph_infer"):
        cudagraph_infer(args.case, out)
    elif args.case in ("nsys_jax_mlp", "xplane_jax_mlp"):
        jax_mlp(out, args.case)
    elif args.case.startswith("kineto_"):
        kineto(args.case, out)
    else:
        nsys_train(args.case, out)


if __name__ == "__main__":
    main()
