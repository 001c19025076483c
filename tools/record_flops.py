"""PyTorch's own FLOP count of one training step of the tiny GPT of tools/record_conventions.py
(the model of `sample_traces/conventions/gpt_kineto_*.json.gz`: 4 blocks, d_model 512, 8 heads,
sequence 256, batch 8, vocabulary 8192, causal SDPA, bf16 autocast, AdamW), the reference that
tests/test_transformer_flops.py compares traceq's FLOPs per op with.

Run on a GPU machine: `python3 tools/record_flops.py --out DIR` writes DIR/gpt_flops.json:
- `flop_counter`: `torch.utils.flop_counter.FlopCounterMode(display=False)` around one step
  (forward under autocast, loss, backward), `get_flop_counts()['Global']`: FLOPs per ATen op;
  `total`: its `get_total_flops()`;
- `calls`: every call of an op PyTorch has a formula for, in order (op, the arguments' shapes,
  the boolean arguments, flops), from a dispatch mode around a second step that calls
  PyTorch's own formulas (`torch.utils.flop_counter.flop_registry`);
- versions, GPU, the SDPA back end chosen, the model's parameter count.
One warm-up step runs first (cuDNN picks its kernels), unprofiled.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)

    import torch
    import torch.utils.flop_counter as fc
    from record_conventions import BATCH, SEQ, VOCAB, gpt
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    model = gpt(torch, nn).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(0)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device="cuda", generator=g)

    def step() -> None:
        with torch.autocast("cuda", torch.bfloat16):
            logits = model(data[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().view(-1, VOCAB), data[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()

    calls: list[dict] = []

    def shape(x):
        return list(x.shape) if isinstance(x, torch.Tensor) else None

    class Calls(TorchDispatchMode):
        """Every call of an op PyTorch has a formula for, with its shapes and that formula's FLOPs."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = func._overloadpacket
            if packet in fc.flop_registry:
                try:
                    flops = int(fc.flop_registry[packet](*args, **kwargs, out_val=out))
                except Exception as error:  # noqa: BLE001 (a formula that cannot take these arguments: recorded)
                    flops = str(error)
                calls.append({"op": f"aten::{packet.__name__}", "shapes": [shape(a) for a in args],
                              "bools": [a for a in args if isinstance(a, bool)], "flops": flops})
            return out

    with fc.FlopCounterMode(display=False) as counter:
        step()
    torch.cuda.synchronize()
    with Calls():
        step()
    torch.cuda.synchronize()
    counts = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
    matmul_params = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith("embed"))
    result = {
        "model": "tiny GPT of tools/record_conventions.py, one training step (bf16 autocast, causal SDPA)",
        "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(),
        "batch": BATCH, "seq": SEQ, "vocab": VOCAB,
        "params": sum(p.numel() for p in model.parameters()), "matmul_params": matmul_params,
        "flop_counter": counts, "total": int(counter.get_total_flops()), "calls": calls,
    }
    (out / "gpt_flops.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "calls"}, indent=1))
    print(len(calls), "calls")


if __name__ == "__main__":
    main()
