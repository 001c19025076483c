"""A Qwen1.5-0.5B prefill on this machine's GPU, recorded the way AMD TraceLens' H100 sample
(`../shared/realtraces/kineto_json/AMD-AGI__TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz`)
was: HF transformers' `Qwen2Model` (no LM head) built from the model's config with random weights
(the sample's `pretrained: False`), bf16, SDPA attention, input ids of shape (16, 559), under
`torch.inference_mode()`, `torch.profiler` with the sample's settings (record_shapes,
profile_memory, with_stack, with_flops, with_modules; schedule wait=1, warmup=5, active=1; the
GPU synchronised after each step). The pair (H100 there, this GPU here) tests `traceq whatif
--gpu` (docs/critical.md).

    python3 tools/record_qwen_prefill.py --out DIR   # DIR/qwen1.5-0.5b_prefill_<gpu>.json.gz + .truth.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path

# Qwen/Qwen1.5-0.5B-Chat's config.json (the values the sample's shapes confirm: vocabulary
# 151,936 x 1,024 embedding, 16 heads of 64, MLP 2,816; the rest as published).
CONFIG = {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24,
              "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 32768,
              "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu"}
BATCH, SEQ = 16, 559


def build(torch):
    import transformers
    from transformers import Qwen2Config, Qwen2Model

    cfg = Qwen2Config(**CONFIG)
    try:
        model = Qwen2Model._from_config(cfg, attn_implementation="sdpa")
    except TypeError:
        cfg._attn_implementation = "sdpa"
        model = Qwen2Model(cfg)
    return model.to("cuda", torch.bfloat16).eval(), transformers.__version__


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("."))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)

    import torch

    torch.manual_seed(0)
    model, hf = build(torch)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), device="cuda")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    schedule = torch.profiler.schedule(wait=1, warmup=5, active=1, repeat=1)
    with torch.inference_mode(), torch.profiler.profile(
            activities=acts, schedule=schedule, record_shapes=True, profile_memory=True, with_stack=True,
            with_flops=True, with_modules=True) as prof:
        for _ in range(7):
            model(input_ids=ids)
            torch.cuda.synchronize()
            prof.step()
    gpu = torch.cuda.get_device_name().split()[-1].lower()
    name = f"qwen1.5-0.5b_prefill_{gpu}"
    raw = out / f"{name}.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    # the step untraced, for reference: median of 20 after the profiled ones
    times = []
    with torch.inference_mode():
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            model(input_ids=ids)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
    facts = {"name": name, "model": "Qwen2Model from Qwen1.5-0.5B-Chat's config, random weights",
             "config": CONFIG, "batch": BATCH, "seq": SEQ, "dtype": "bfloat16", "attention": "sdpa",
             "untraced_step_ms_median": sorted(times)[len(times) // 2], "torch": torch.__version__,
             "transformers": hf, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name()}
    (out / f"{name}.truth.json").write_text(json.dumps(facts, indent=1) + "\n")
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
