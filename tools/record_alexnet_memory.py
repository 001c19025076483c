"""Record `sample_traces/alexnet_b64_nocache.sqlite`: AlexNet training with PyTorch's caching
allocator switched off, so that GPU memory is allocated inside the NVTX layer ranges.

The other AlexNet samples were captured after PyTorch's caching allocator had warmed up: every
driver allocation there predates the capture, and `traceq memory` can only list it as 'before
capture'. Here `PYTORCH_NO_CUDA_MEMORY_CACHING=1` makes every tensor a cudaMalloc/cudaFree of
its exact size, made by the layer that creates it, which is what the paper's per-layer memory
figures (section 5.4) show.

Workload: AlexNet as in `sample_traces/alexnet.model.toml` (torchvision's layout, 64-192-384-
256-256 channels, 3x227x227 inputs; defined inline, no torchvision), batch 64, synthetic data,
SGD with momentum, fp32 (cuDNN may use TF32, PyTorch's default), one warm-up iteration outside
the capture, then `cudaProfilerStart()`, 2 iterations, `cudaProfilerStop()`.

NVTX, as in the team's reference traces (`shared/reference/README.md`): `iteration N` and inside
it `data_copy`, `forward`, `backward`, `weight_update` on the main thread; Caffe-style layer
ranges (`conv1`, `relu1`, `pool1`, ..., `drop1`, `fc6`..`fc8`) pushed from module forward hooks;
the backward pass of each layer as `b` + name (`bconv1`), pushed from hooks on the layer's
autograd node (`grad_fn` pre- and post-hooks), so on PyTorch's autograd thread. ReLUs are not in
place.

How the sample was recorded (one NVIDIA H100 80GB HBM3, driver 580.159.04, PyTorch
2.11.0+cu130; the Nsight Systems CLI shipped in the Nsight Compute 2025.3.1 install, at
`host/target-linux-x64/nsys`, which prints version 2025.3.1 (its export's metadata says 2025.3.2.0, schema 3.20.3),
with libdw.so.1 and libelf.so.1 put on LD_LIBRARY_PATH and `host/linux-desktop-glibc_2_11_3-x64`
on PATH so that it can turn the capture into a report):

    nsys profile -t cuda,nvtx --cuda-memory-usage=true -s none --cpuctxsw=none \\
        --capture-range=cudaProfilerApi -o alexnet_b64_nocache \\
        python3 tools/record_alexnet_memory.py
    nsys export --type sqlite -o alexnet_b64_nocache.sqlite alexnet_b64_nocache.nsys-rep

nsys's default `--capture-range-end=stop-shutdown` ends the program at `cudaProfilerStop()`;
run without nsys, it trains the same steps and then prints, per layer, the forward bytes it
expects each layer to allocate (fp32 output, plus int64 max-pool indices and bool dropout masks).
In the sample these agree byte for byte with the allocations `traceq memory` puts in each
forward layer range, once the cuDNN workspaces that conv1..conv5 allocate and free are
subtracted.
"""

from __future__ import annotations

import os
from collections import OrderedDict

# Must be set before CUDA is initialised: every allocation goes straight to cudaMalloc.
os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"

import torch  # noqa: E402
from torch import nn  # noqa: E402

BATCH = 64
INPUT = (3, 227, 227)
CLASSES = 1000
ITERATIONS = 2


def alexnet() -> nn.Sequential:
    """torchvision's AlexNet, its modules named as the traces' NVTX ranges."""
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(3, 64, 11, stride=4, padding=2), relu1=nn.ReLU(), pool1=nn.MaxPool2d(3, 2),
        conv2=nn.Conv2d(64, 192, 5, padding=2), relu2=nn.ReLU(), pool2=nn.MaxPool2d(3, 2),
        conv3=nn.Conv2d(192, 384, 3, padding=1), relu3=nn.ReLU(),
        conv4=nn.Conv2d(384, 256, 3, padding=1), relu4=nn.ReLU(),
        conv5=nn.Conv2d(256, 256, 3, padding=1), relu5=nn.ReLU(), pool3=nn.MaxPool2d(3, 2),
        pool4=nn.AdaptiveAvgPool2d((6, 6)), flatten=nn.Flatten(),
        drop1=nn.Dropout(), fc6=nn.Linear(256 * 6 * 6, 4096), relu6=nn.ReLU(),
        drop2=nn.Dropout(), fc7=nn.Linear(4096, 4096), relu7=nn.ReLU(),
        fc8=nn.Linear(4096, CLASSES),
    ))


def add_nvtx_hooks(model: nn.Sequential) -> None:
    """Forward range `name` around each layer; backward range `bname` around its autograd node."""
    push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop

    for name, module in model.named_children():
        if name == "flatten":   # a view: no kernel, no range (as in the reference traces)
            continue

        def pre(_module, _inputs, name=name):
            push(name)

        def post(_module, _inputs, output, name=name):
            pop()
            node = output.grad_fn
            if node is not None:
                # Both run on the autograd thread, just before and just after the node's backward;
                # they must return None (a value would replace the gradients).
                def bpre(_grad_outputs, name=name) -> None:
                    push("b" + name)

                def bpost(_grad_inputs, _grad_outputs) -> None:
                    pop()

                node.register_prehook(bpre)
                node.register_hook(bpost)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def expected_forward_bytes(batch: int = BATCH) -> dict[str, int]:
    """Bytes each layer's forward allocates: fp32 output, int64 max-pool indices, bool dropout mask."""
    out = {}
    x = torch.zeros(1, *INPUT, device="meta")
    for name, module in alexnet().to("meta").eval().named_children():
        x = module(x)
        if name == "flatten":
            continue
        n = batch * x[0].numel()
        extra = n * 8 if isinstance(module, nn.MaxPool2d) else n if isinstance(module, nn.Dropout) else 0
        out[name] = n * 4 + extra
    return out


def main() -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = alexnet().to(dev)
    add_nvtx_hooks(model)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(BATCH, *INPUT).pin_memory()
    labels = torch.randint(0, CLASSES, (BATCH,)).pin_memory()
    push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop

    def step(label: str) -> None:
        push(label)
        push("data_copy")
        x = images.to(dev, non_blocking=True)
        y = labels.to(dev, non_blocking=True)
        pop()
        push("forward")
        loss = loss_fn(model(x), y)
        pop()
        push("backward")
        loss.backward()
        pop()
        push("weight_update")
        opt.step()
        opt.zero_grad(set_to_none=True)
        pop()
        torch.cuda.synchronize()
        pop()

    step("warmup")               # outside the capture: cuDNN/cuBLAS handles, momentum buffers
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for i in range(ITERATIONS):
        step(f"iteration {i}")
    torch.cuda.cudart().cudaProfilerStop()

    for name, nbytes in expected_forward_bytes().items():
        print(f"{name:6s} {nbytes:>12,d}")


if __name__ == "__main__":
    main()
