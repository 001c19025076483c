"""FP8 GEMMs, grouped (MoE) GEMMs and causal attention recorded by PyTorch's profiler, with
PyTorch's own FLOP count of the same calls: the reference for traceq's FLOPs of `_scaled_mm`,
`_grouped_mm` and `scaled_dot_product_attention` in a real trace (issue 36).

Run on a GPU machine with FP8 (H100/H200): `python3 tools/record_fp8.py --out DIR` writes
- DIR/fp8_grouped_kineto.json.gz: `torch.profiler` (record_shapes) around 3 repetitions of: an FP8
  (e4m3) `torch._scaled_mm` of [4096, 8192] x [8192, 4096] with per-tensor scales, bf16 out; a
  bf16 `torch._grouped_mm` of 8 experts ([8192, 2048] rows split unevenly by `offs` x [8, 2048,
  1024]); `scaled_dot_product_attention` on [4, 16, 2048, 128] bf16, causal and not, forward and
  backward;
- DIR/fp8_grouped_flops.json: per op, `torch.utils.flop_counter.FlopCounterMode`'s FLOPs for one
  repetition (`flop_counter`), which ops ran (`ran`: an op the build lacks is left out, with its
  error), versions and the GPU.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)

    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    dev = "cuda"
    ran: dict[str, str] = {}

    a8 = torch.randn(4096, 8192, device=dev).to(torch.float8_e4m3fn)
    b8 = torch.randn(4096, 8192, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
    one = torch.tensor(1.0, device=dev)
    experts, rows, k, n = 8, 8192, 2048, 1024
    ga = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
    gb = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16).transpose(-2, -1)
    counts = torch.tensor([512, 1536, 256, 2048, 1024, 768, 1280, 768], device=dev)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    q, kk, v = (torch.randn(4, 16, 2048, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def fp8() -> None:
        torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    def grouped() -> None:
        torch._grouped_mm(ga, gb, offs=offs, out_dtype=torch.bfloat16)

    def attention() -> None:
        for causal in (True, False):
            o = F.scaled_dot_product_attention(q, kk, v, is_causal=causal)
            o.sum().backward()

    steps = []
    for name, fn in (("_scaled_mm", fp8), ("_grouped_mm", grouped), ("sdpa", attention)):
        try:
            fn()
            torch.cuda.synchronize()
            steps.append(fn)
            ran[name] = "ok"
        except Exception as e:  # noqa: BLE001 (an op this build or GPU lacks is left out, said why)
            ran[name] = f"{type(e).__name__}: {e}"[:300]

    def once() -> None:
        for fn in steps:
            fn()

    with FlopCounterMode(display=False) as counter:
        once()
    counts_by_op = {str(op): int(f) for op, f in counter.get_flop_counts()["Global"].items()}
    torch.cuda.synchronize()

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for i in range(3):
            with torch.profiler.record_function(f"iteration {i}"):
                once()
            torch.cuda.synchronize()
    raw = out / "fp8_grouped_kineto.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(out / "fp8_grouped_kineto.json.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    info = {"flop_counter": counts_by_op, "repetitions": 3, "ran": ran, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda}
    (out / "fp8_grouped_flops.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))


if __name__ == "__main__":
    main()
