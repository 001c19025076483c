"""Run a few steps of CNN training on one GPU, annotated the way traceq's reference traces are,
for recording under Nsight Systems, Nsight Compute or PyTorch's profiler.

This is the workload behind the team's second-round recordings (AMP, CUDA graphs, a badly
written loop for `traceq advise`, and the Nsight Compute ground truth of the DeLTA traffic
model). It is run on the device machine by `tools/record_device.sh`, which has the exact
profiler command lines; run alone it just trains.

NVTX, as in the reference traces (`shared/reference/README.md`):

- `iteration N` encloses one step; inside it `data_copy`, `forward`, `backward`,
  `weight_update` (the paper's stages 3 to 5), on the main thread.
- `--nvtx layers`: a range per layer pushed from module hooks, Caffe-style names for AlexNet
  (`conv1`, `pool1`, `fc6`) and the module's qualified name for torchvision models
  (`layer1.0.conv1`); the backward pass of a layer is `b` + its name, pushed from hooks on the
  layer's autograd node, so on PyTorch's autograd thread.
- `--nvtx ops`: `torch.autograd.profiler.emit_nvtx(record_shapes=True)`: one range per ATen op
  with its input shapes (and the stage ranges above).

Options that shape the trace:

- `--amp fp16|bf16`: forward and loss under `torch.autocast`; fp16 with a GradScaler.
- `--graph`: the whole step (forward, backward, optimizer) is captured once into a CUDA graph with
  the layer ranges open during capture (inside a `graph capture` range), then replayed once per
  iteration; only the input copy and the replay run inside `iteration N`.
- `--model badloop`: a small MLP trained the way the performance guides say not to: batches
  copied from pageable memory, `loss.item()` and `torch.cuda.synchronize()` inside the step, FP32
  matrix products with TF32 off, one with a transposed operand, and a storm of tiny
  element-wise kernels, for `traceq idle` and `traceq advise`.
- `--kineto FILE`: record the captured steps with `torch.profiler` (record_shapes, with_flops,
  profile_memory) and write Kineto's Chrome-trace JSON there.
- `--shapes FILE`: write every hooked layer's input/output/weight shapes, stride, padding,
  dilation, groups and compute dtype (as JSON), for the traffic model's ground truth.

The captured steps are bracketed by `cudaProfilerStart()`/`cudaProfilerStop()`, so profilers
started with a capture range on the CUDA profiler API (`nsys --capture-range=cudaProfilerApi`,
`ncu --profile-from-start off`) record only the steady state.
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop


@contextmanager
def nvtx(name: str):
    push(name)
    try:
        yield
    finally:
        pop()


def alexnet(classes: int = 1000) -> nn.Sequential:
    """torchvision's AlexNet, its modules named as the reference traces' NVTX ranges."""
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(3, 64, 11, stride=4, padding=2), relu1=nn.ReLU(), pool1=nn.MaxPool2d(3, 2),
        conv2=nn.Conv2d(64, 192, 5, padding=2), relu2=nn.ReLU(), pool2=nn.MaxPool2d(3, 2),
        conv3=nn.Conv2d(192, 384, 3, padding=1), relu3=nn.ReLU(),
        conv4=nn.Conv2d(384, 256, 3, padding=1), relu4=nn.ReLU(),
        conv5=nn.Conv2d(256, 256, 3, padding=1), relu5=nn.ReLU(), pool3=nn.MaxPool2d(3, 2),
        pool4=nn.AdaptiveAvgPool2d((6, 6)), flatten=nn.Flatten(),
        drop1=nn.Dropout(), fc6=nn.Linear(256 * 6 * 6, 4096), relu6=nn.ReLU(),
        drop2=nn.Dropout(), fc7=nn.Linear(4096, 4096), relu7=nn.ReLU(),
        fc8=nn.Linear(4096, classes),
    ))


def build(model: str) -> tuple[nn.Module, tuple[int, ...], int]:
    """(model, input shape of one sample, classes)."""
    if model == "alexnet":
        return alexnet(), (3, 227, 227), 1000
    if model in ("vgg16", "resnet50"):
        import torchvision

        return getattr(torchvision.models, model)(weights=None), (3, 224, 224), 1000
    if model == "badloop":
        return nn.Sequential(OrderedDict(fc1=nn.Linear(1024, 4096), relu1=nn.ReLU(),
                                         fc2=nn.Linear(4096, 4096), relu2=nn.ReLU(),
                                         fc3=nn.Linear(4096, 10))), (1024,), 10
    raise SystemExit(f"unknown model {model!r}")


_HOOKED = (nn.Conv2d, nn.Linear, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d, nn.AdaptiveAvgPool2d,
           nn.Dropout)


def layer_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The leaf layers that get an NVTX range, with their range names."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, _HOOKED) and name]


class _Annotations:
    """Layer ranges as both NVTX ranges and, for torch.profiler (Kineto), `record_function`
    ranges (user_annotation events), one stack per thread."""

    def __init__(self, kineto: bool):
        import threading

        self.kineto = kineto
        self.local = threading.local()

    def push(self, name: str) -> None:
        push(name)
        if self.kineto:
            stack = self.local.__dict__.setdefault("stack", [])
            stack.append(torch.profiler.record_function(name))
            stack[-1].__enter__()

    def pop(self) -> None:
        pop()
        if self.kineto:
            self.local.stack.pop().__exit__(None, None, None)


ANNOTATE = _Annotations(kineto=False)


@contextmanager
def stage(name: str):
    """A stage or iteration range (NVTX, and record_function under Kineto)."""
    ANNOTATE.push(name)
    try:
        yield
    finally:
        ANNOTATE.pop()


def add_nvtx_hooks(model: nn.Module) -> None:
    """Forward range `name` around each layer; backward range `bname` around its autograd node."""
    push, pop = ANNOTATE.push, ANNOTATE.pop
    for name, module in layer_modules(model):
        def pre(_module, _inputs, name=name):
            push(name)

        def post(_module, _inputs, output, name=name):
            pop()
            node = output.grad_fn if isinstance(output, torch.Tensor) else None
            if node is not None:
                def bpre(_grad_outputs, name=name) -> None:
                    push("b" + name)

                def bpost(_grad_inputs, _grad_outputs) -> None:
                    pop()

                node.register_prehook(bpre)
                node.register_hook(bpost)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def record_shapes(model: nn.Module, path: str) -> callable:
    """Hooks that write each layer's shapes to `path` after the first forward pass; returns a
    function that writes them and removes the hooks."""
    seen: dict[str, dict] = {}
    handles = []
    for name, module in layer_modules(model):
        def hook(m, inputs, output, name=name):
            if name in seen:
                return
            entry = {"type": type(m).__name__, "input": list(inputs[0].shape), "output": list(output.shape),
                     "dtype": str(output.dtype).removeprefix("torch.")}
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                entry["weight"] = list(m.weight.shape)
            if isinstance(m, nn.Conv2d):
                entry.update(stride=list(m.stride), padding=list(m.padding), dilation=list(m.dilation),
                             groups=m.groups)
            seen[name] = entry
        handles.append(module.register_forward_hook(hook))

    def done() -> None:
        for h in handles:
            h.remove()
        with open(path, "w") as f:
            json.dump(seen, f, indent=1)
    return done


def write_flops(profiler, path: str) -> None:
    """PyTorch's own FLOP count of every op it counted (`FunctionEvent.flops`, from the op's
    recorded shapes), in the order the profiler lists them per thread: name, thread, input shapes
    and flops. Kineto's JSON does not carry these; they are the reference for traceq's FLOPs."""
    rows = [{"name": e.name, "thread": e.thread, "input_shapes": e.input_shapes, "flops": e.flops,
             "start_us": e.time_range.start, "end_us": e.time_range.end}
            for e in profiler.events() if getattr(e, "flops", 0)]
    with open(path, "w") as f:
        json.dump(rows, f, indent=0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="alexnet", choices=["alexnet", "vgg16", "resnet50", "badloop"])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--amp", default="none", choices=["none", "fp16", "bf16"])
    p.add_argument("--nvtx", default="layers", choices=["layers", "ops", "none"])
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--graph", action="store_true")
    p.add_argument("--kineto")
    p.add_argument("--shapes")
    args = p.parse_args()
    global ANNOTATE
    ANNOTATE = _Annotations(kineto=bool(args.kineto))

    torch.manual_seed(0)
    dev = torch.device("cuda")
    model, sample, classes = build(args.model)
    model = model.to(dev)
    bad = args.model == "badloop"
    if bad:
        torch.backends.cuda.matmul.allow_tf32 = False
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.amp)
    autocast = (lambda: torch.autocast("cuda", dtype=amp_dtype)) if amp_dtype else nullcontext
    scaler = torch.amp.GradScaler("cuda") if args.amp == "fp16" and not args.graph else None
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(args.batch, *sample)
    labels = torch.randint(0, classes, (args.batch,))
    if not bad:
        images, labels = images.pin_memory(), labels.pin_memory()
    write_shapes = record_shapes(model, args.shapes) if args.shapes else None
    if args.nvtx == "layers":
        add_nvtx_hooks(model)
    extra_w = torch.randn(4096, 4096, device=dev) if bad else None

    def forward_backward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with stage("forward"):
            with autocast():
                out = model(x)
                if bad:  # a transposed-operand product and a storm of tiny kernels
                    out = out + (x[:, :10] @ extra_w[:10, :10].t())
                    small = out[:, :1]
                    for _ in range(200):
                        small = small * 1.0001 + 0.0001
                    out = out + small
                loss = loss_fn(out, y)
        with stage("backward"):
            (scaler.scale(loss) if scaler else loss).backward()
        return loss

    def update() -> None:
        with stage("weight_update"):
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=not args.graph)

    def step(label: str) -> None:
        with stage(label):
            with stage("data_copy"):
                x = images.to(dev, non_blocking=not bad)
                y = labels.to(dev, non_blocking=not bad)
            loss = forward_backward(x, y)
            if bad:
                print(f"loss {loss.item():.4f}")  # a sync inside the step
                torch.cuda.synchronize()
            update()
        torch.cuda.synchronize()

    emit = (torch.autograd.profiler.emit_nvtx(record_shapes=True) if args.nvtx == "ops" else nullcontext())
    with emit:
        if not args.graph:
            for i in range(args.warmup):
                step(f"warmup {i}")
                if write_shapes and i == 0:
                    write_shapes()
            profiler = (torch.profiler.profile(record_shapes=True, with_flops=True, profile_memory=True,
                                               activities=[torch.profiler.ProfilerActivity.CPU,
                                                           torch.profiler.ProfilerActivity.CUDA],
                                               schedule=torch.profiler.schedule(
                                                   wait=0, warmup=0, active=args.iterations, repeat=1))
                        if args.kineto else nullcontext())
            torch.cuda.cudart().cudaProfilerStart()
            with profiler:
                for i in range(args.iterations):
                    step(f"iteration {i}")
                    if args.kineto:
                        profiler.step()
            torch.cuda.cudart().cudaProfilerStop()
            if args.kineto:
                profiler.export_chrome_trace(args.kineto)
                write_flops(profiler, args.kineto.removesuffix(".json") + ".flops.json")
            return

        # CUDA graph: warm up on a side stream (as PyTorch's whole-network capture example does),
        # capture inside the profiler's range, then replay once per iteration.
        static_x, static_y = images.to(dev), labels.to(dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(args.warmup):
                with nvtx(f"warmup {i}"):
                    forward_backward(static_x, static_y)
                    update()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        graph = torch.cuda.CUDAGraph()
        with nvtx("graph capture"):
            with torch.cuda.graph(graph):
                forward_backward(static_x, static_y)
                update()
        torch.cuda.synchronize()
        for i in range(args.iterations):
            with nvtx(f"iteration {i}"):
                with nvtx("data_copy"):
                    static_x.copy_(images, non_blocking=True)
                    static_y.copy_(labels, non_blocking=True)
                graph.replay()
            torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
