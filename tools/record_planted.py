"""A clean training loop and variants of it with one planted performance problem each, for
checking that `traceq advise` names the planted problem first with the right time at stake
(issue 34). Run under Nsight Systems by `tools/record_planted.sh`; alone it just trains and writes
the truth file.

    python tools/record_planted.py --plant NAME --truth OUT.truth.json [--graph]

The base loop: a small CNN (two 3x3 convolutions, pooled, three linear layers) trained with SGD
under bf16 autocast in channels_last layout, its input already on the GPU, `loss.item()` at the
end of each step (the logging sync most loops have). NVTX as traceq's reference traces: `iteration
N` around each step, `forward`, `backward`, `weight_update` inside it.

Plants (each adds one thing to the base loop):

- `pageable`: the input (51 MB of fp32) copied from pageable host memory every step;
- `sync`: `torch.cuda.synchronize()` after every layer of the forward and the backward pass;
- `smallkernels`: 400 tiny element-wise kernels per step (a launch-bound storm);
- `fp32`: no autocast and TF32 off: convolutions and GEMMs in full FP32;
- `layout`: the same bf16 model in NCHW (contiguous) layout, so cuDNN converts layouts;
- `dataloader`: about 4 ms of host-side data preparation (NumPy) at the start of each step;
- `churn`: `torch.cuda.empty_cache()` in the forward pass and at the end of each step, so every
  step frees (cudaFree synchronises) and allocates afresh;
- `recompile`: the linear head under `torch.compile` with a new batch size every step;
- `uncoalesced`: ten adds of two 8192 x 8192 fp32 matrices per step, one read through its
  transpose (a strided view), so a warp's 32 loads of it touch 32 sectors instead of 4; the base
  loop of this plant does the same adds on the untransposed matrix (the same kernels' work, read in
  order), so the plant's cost is the uncoalesced reads alone;
- `base`: nothing.

`--kineto FILE` records both captures with `torch.profiler` instead (record_shapes; the ranges
as `record_function`s too) and writes the plant's as Kineto JSON to FILE.

`--only-planted` starts the profiler (`cudaProfilerStart`) for the planted steps only, for a
profiler that cannot tell the two capture ranges apart (Nsight Compute: `tools/record_planted.sh`
with `NCU=1` profiles two planted steps' kernels that way).

`--graph` captures the whole step into a CUDA graph replayed once per iteration (for the eager ->
CUDA graphs what-if pair with `smallkernels`).

The truth file: the median wall time of a step for the plant and for the base loop, in the same
process after the same warm-up, measured without a profiler (`step_ns`, interleaved) and traced
(`traced_step_ns`): `{"step_ns": ..., "traced_step_ns": ..., "base": {"step_ns": ...,
"traced_step_ns": ...}, "plant": ..., "steps": ...}`. The traced steps are two capture ranges
(`cudaProfilerStart()`/`cudaProfilerStop()`), first the base loop's, then the plant's: nsys with
`--capture-range=cudaProfilerApi --capture-range-end=repeat:2` writes one report of each.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

PLANTS = ("base", "pageable", "sync", "smallkernels", "fp32", "layout", "dataloader", "churn", "recompile", "uncoalesced")
BATCH, CHANNELS, SIDE = 256, 16, 56
_STACK: list = []
KINETO = False  # ranges also as torch.profiler record_functions (--kineto)


def push(name: str) -> None:
    torch.cuda.nvtx.range_push(name)
    if KINETO:
        _STACK.append(torch.profiler.record_function(name))
        _STACK[-1].__enter__()


def pop() -> None:
    torch.cuda.nvtx.range_pop()
    if KINETO:
        _STACK.pop().__exit__(None, None, None)


def build() -> nn.Sequential:
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(CHANNELS, 128, 3, padding=1), relu1=nn.ReLU(),
        conv2=nn.Conv2d(128, 128, 3, padding=1), relu2=nn.ReLU(),
        pool=nn.AdaptiveAvgPool2d(1), flatten=nn.Flatten(),
        fc1=nn.Linear(128, 4096), relu3=nn.ReLU(), fc2=nn.Linear(4096, 4096), relu4=nn.ReLU(),
        fc3=nn.Linear(4096, 1000)))


class Loop:
    """One training loop, its plant switched on or off per step."""

    def __init__(self, plant: str, graph: bool):
        self.plant, self.graph = plant, graph
        dev = self.dev = torch.device("cuda")
        torch.manual_seed(0)
        self.model = build().to(dev).to(memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        self.x = torch.randn(BATCH, CHANNELS, SIDE, SIDE, device=dev).to(memory_format=torch.channels_last)
        if plant == "layout":  # a twin in NCHW with the same weights, for the planted steps
            self.nchw = build().to(dev)
            self.nchw.load_state_dict(self.model.state_dict())
            self.nchw_opt = torch.optim.SGD(self.nchw.parameters(), lr=1e-3, momentum=0.9)
            self.nchw_x = self.x.contiguous()
        self.y = torch.randint(0, 1000, (BATCH,), device=dev)
        self.host_x = torch.randn(BATCH, CHANNELS, SIDE, SIDE)  # pageable: not pinned
        self.host_work = np.ones((64, 64), dtype=np.float32)
        self.tiny = torch.ones(64, device=dev)
        self.head = torch.compile(lambda h: torch.relu(h) * 1.5 + 0.5, dynamic=False)
        self.batches = iter(range(8, 10_000, 8))
        if plant == "uncoalesced":  # 3 x 256 MiB; the transposed view's data is another matrix
            self.wide = torch.randn(8192, 8192, device=dev)
            self.wide_t = torch.randn(8192, 8192, device=dev).t()
            self.wide_b = torch.randn(8192, 8192, device=dev)
            self.wide_out = torch.empty(8192, 8192, device=dev)
        self.syncs: list = []

    def _sync_hooks(self, on: bool) -> None:
        for h in self.syncs:
            h.remove()
        self.syncs = []
        if on:
            for m in self.model:
                self.syncs.append(m.register_forward_hook(lambda *_: torch.cuda.synchronize()))
                self.syncs.append(m.register_full_backward_hook(lambda *_: torch.cuda.synchronize()))

    def step(self, planted: bool, label: str) -> float:
        """One step, its wall time in ns (ended by the loss read-back)."""
        p = self.plant if planted else "base"
        t0 = time.perf_counter_ns()
        push(label)
        x = self.x
        if p == "dataloader":
            push("data_prep")
            end = time.perf_counter_ns() + 4_000_000  # 4 ms of host work (decoding, augmenting)
            while time.perf_counter_ns() < end:
                self.host_work[:8] *= 1.0
            pop()
        if p == "pageable":
            push("data_copy")
            x = self.host_x.to(self.dev).to(memory_format=torch.channels_last)
            pop()
        if self.graph and planted:
            self.replay.replay()
            loss = self.static_loss
        else:
            loss = self._train(x, p)
        value = loss.item()
        pop()
        if p == "churn":
            torch.cuda.empty_cache()
        assert math.isfinite(value)
        return time.perf_counter_ns() - t0

    def _train(self, x: torch.Tensor, p: str) -> torch.Tensor:
        autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=p != "fp32")
        torch.backends.cuda.matmul.allow_tf32 = p != "fp32"
        torch.backends.cudnn.allow_tf32 = p != "fp32"
        self._sync_hooks(p == "sync")
        model, opt = (self.nchw, self.nchw_opt) if p == "layout" else (self.model, self.opt)
        x = self.nchw_x if p == "layout" else x
        push("forward")
        with autocast:
            out = model(x)
            if p == "smallkernels":
                t = self.tiny
                for _ in range(400):
                    t = t * 1.0001
                out = out + t[:1]
            if p == "churn":  # the cached blocks handed back mid-step: cudaFree syncs, the next step
                torch.cuda.empty_cache()  # allocates afresh
            if self.plant == "uncoalesced":  # the same adds in both loops; planted, one operand strided
                src = self.wide_t if p == "uncoalesced" else self.wide
                for _ in range(10):
                    torch.add(src, self.wide_b, out=self.wide_out)
            if p == "recompile":
                n = next(self.batches) if self.plant == "recompile" else BATCH
                h = self.head(out[:n])
                out = out + h.sum() * 0
            loss = self.loss_fn(out.float(), self.y)
        pop()
        push("backward")
        loss.backward()
        pop()
        push("weight_update")
        opt.step()
        opt.zero_grad(set_to_none=False)
        pop()
        return loss

    def capture(self) -> None:
        """The planted step as one CUDA graph (after eager warm-up on a side stream)."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                self._train(self.x, self.plant)
        torch.cuda.current_stream().wait_stream(s)
        self.replay = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.replay):
            self.static_loss = self._train(self.x, self.plant)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plant", choices=PLANTS, required=True)
    ap.add_argument("--truth", required=True)
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--measure", type=int, default=30)
    ap.add_argument("--traced", type=int, default=8)
    ap.add_argument("--only-planted", action="store_true", help="start the profiler for the planted steps only")
    ap.add_argument("--kineto", help="record the plant's steps with torch.profiler into this JSON file instead")
    a = ap.parse_args()
    global KINETO
    KINETO = bool(a.kineto)
    if a.plant == "recompile":
        from torch import _dynamo

        _dynamo.config.cache_size_limit = 10_000
        if hasattr(_dynamo.config, "recompile_limit"):
            _dynamo.config.recompile_limit = 10_000
        a.measure = min(a.measure, 6)
    loop = Loop(a.plant, a.graph)
    for i in range(5):
        loop.step(False, f"warmup {i}")
    if a.graph:
        loop.capture()
    for i in range(3):
        loop.step(True, f"warmup planted {i}")
    base, planted = [], []
    for i in range(a.measure):  # interleaved, so that drift hits both alike
        base.append(loop.step(False, f"measure base {i}"))
        planted.append(loop.step(True, f"measure planted {i}"))
    torch.cuda.synchronize()
    traced = {}
    for kind in ("base", "planted"):  # two capture ranges: nsys --capture-range-end=repeat:2
        capture = not (a.only_planted and kind == "base")
        profiler = (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                       torch.profiler.ProfilerActivity.CUDA], record_shapes=True)
                    if a.kineto else None)
        if capture:
            torch.cuda.cudart().cudaProfilerStart()
        if profiler:
            profiler.__enter__()
        traced[kind] = [loop.step(kind == "planted", f"iteration {i}") for i in range(a.traced)]
        torch.cuda.synchronize()
        if profiler:
            profiler.__exit__(None, None, None)
            if kind == "planted":
                profiler.export_chrome_trace(a.kineto)
        if capture:
            torch.cuda.cudart().cudaProfilerStop()
        time.sleep(1.0)
    truth = {"plant": a.plant, "graph": a.graph, "step_ns": statistics.median(planted),
             "traced_step_ns": statistics.median(traced["planted"]),
             "base": {"step_ns": statistics.median(base), "traced_step_ns": statistics.median(traced["base"])},
             "steps": a.traced, "batch": BATCH, "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    with open(a.truth, "w") as f:
        json.dump(truth, f, indent=1)
    print(json.dumps(truth))


if __name__ == "__main__":
    main()
