"""Training throughput of the package's GPT at GPT-2 small's shape on one GPU: tokens/s and model
FLOP utilisation (MFU), bfloat16 autocast, eager and under ``torch.compile``, measured in one run.

Models: ``lecture_pkg.models.gpt.GPT`` with GPT-2 small's configuration (12 layers, 12 heads,
d = 768, context 1024) and, for comparison, GPT-2 medium's (24 layers, 16 heads, d = 1024);
"modern" is the chapter-7.4 decoder (``lecture_pkg.models.llama.Llama``: RoPE, RMSNorm, SwiGLU,
QK-norm, 4 key-value heads for 12 query heads) at GPT-2 small's width, depth and context, with
tied embeddings and a SwiGLU width of 2048 (8/3 d), so its parameter count is near GPT-2
small's. Dropout off, the vocabulary padded from 50,257 to 50,304 (a multiple of 64, as nanoGPT
does, so the output layer's matrix product tiles evenly). Random tokens: only the speed is
measured. AdamW (``lecture_pkg.training.adamw``, fused on CUDA).

MFU = achieved FLOP/s / the GPU's dense bf16 peak, with the FLOPs of a training step counted as
PaLM's appendix B does (and nanoGPT): 6 N per token for the weights (N without the position
table) plus 12 L d T per token for attention's two matrix products (forward and backward; d
counts the query heads' width).

Run (GPU only): python benchmarks/train_gpu.py [--steps 20] [--json out.json]
                [--runs small/eager/16 small/compiled/16 ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn

from lecture_pkg.models.gpt import GPT, GPTConfig, next_token_loss
from lecture_pkg.models.llama import Llama, LlamaConfig
from lecture_pkg.training import adamw

# Dense bf16 tensor-core peaks (NVIDIA data sheets, SXM parts, without sparsity).
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}


def peak_tflops(device_name: str) -> float | None:
    for key, peak in PEAK_BF16_TFLOPS.items():
        if key in device_name:
            return peak
    return None


def build(shape: str, device: torch.device) -> tuple[nn.Module, int, float]:
    """The model of ``shape`` on ``device``, its context length and its training FLOPs per
    token (6 N for the weights, N without the position table, + 12 L d T for attention)."""
    if shape == "modern":
        config = LlamaConfig(vocab_size=50304, hidden_size=768, intermediate_size=2048,
                             num_hidden_layers=12, num_attention_heads=12,
                             num_key_value_heads=4, max_position_embeddings=1024,
                             qk_norm=True, tie_word_embeddings=True)
        model = Llama(config, device=device)
        weights = sum(p.numel() for p in model.parameters())
        layers, width = config.num_hidden_layers, config.num_attention_heads * config.d_head
        context = config.max_position_embeddings
    else:
        gpt_config = GPTConfig(vocab_size=50304, dropout=0.0, embd_dropout=0.0, **GPT_SHAPES[shape])
        model = GPT(gpt_config, device=device)
        weights = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
        layers, width, context = gpt_config.n_layer, gpt_config.n_embd, gpt_config.n_positions
    return model, context, 6 * weights + 12 * layers * width * context


GPT_SHAPES = {"small": {}, "medium": {"n_layer": 24, "n_head": 16, "n_embd": 1024}}
SHAPES = (*GPT_SHAPES, "modern")
# shape/mode/batch: eager against compiled at one batch, then a larger batch and model.
RUNS = ["small/eager/16", "small/compiled/16", "small/compiled/32", "medium/compiled/16",
        "modern/compiled/16"]


def parse_run(run: str) -> tuple[str, bool, int]:
    """'small/compiled/16' -> ('small', True, 16)."""
    shape, mode, batch = run.split("/")
    if shape not in SHAPES or mode not in ("eager", "compiled") or not batch.isdigit():
        raise ValueError(f"--runs takes shape/mode/batch with shape in {sorted(SHAPES)}, mode "
                         f"eager or compiled, e.g. small/compiled/16; got {run!r}")
    return shape, mode == "compiled", int(batch)


def measure(shape: str, compiled: bool, batch: int, steps: int, warmup: int) -> dict:
    device = torch.device("cuda")
    torch.manual_seed(0)
    model, context, flops = build(shape, device)
    optimizer = adamw(model, lr=3e-4)
    for group in optimizer.param_groups:
        group["fused"] = True
    step_model = torch.compile(model) if compiled else model
    tokens = torch.randint(0, 50257, (steps + warmup, batch, context), device=device)

    def step(i: int) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = next_token_loss(step_model(tokens[i]).logits, tokens[i])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    start = time.perf_counter()
    for i in range(warmup):  # compilation (if any) and the allocator's first growth
        step(i)
    torch.cuda.synchronize()
    warmup_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens_per_second = steps * batch * context / seconds
    achieved = tokens_per_second * flops / 1e12
    peak = peak_tflops(torch.cuda.get_device_name(device))
    return {"shape": shape, "compiled": compiled, "batch": batch, "tokens_per_step": batch * context,
            "step_ms": 1e3 * seconds / steps, "tokens_per_s": tokens_per_second,
            "tflops": achieved, "mfu": achieved / peak if peak else float("nan"),
            "warmup_s": warmup_seconds,
            "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "parameters": sum(p.numel() for p in model.parameters())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--runs", nargs="+", default=RUNS, help="shape/mode/batch, e.g. "
                        "small/compiled/16 (default: %(default)s)")
    args = parser.parse_args()
    runs = [parse_run(run) for run in args.runs]
    if not torch.cuda.is_available():
        print("Not run: no CUDA device here (this benchmark is for the GPU lane).")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name()
    print(f"## GPT-2-sized decoders on {name}: torch {torch.__version__}, bf16 autocast, "
          f"{args.steps} timed steps after {args.warmup}")
    print("| shape | mode | batch | step ms | tokens/s | TFLOP/s | MFU | peak GiB | warm-up s |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for shape, compiled, batch in runs:
        row = measure(shape, compiled, batch, args.steps, args.warmup)
        rows.append(row)
        print(f"| {shape} | {'torch.compile' if compiled else 'eager'} | {batch} "
              f"| {row['step_ms']:.1f} "
              f"| {row['tokens_per_s']:,.0f} | {row['tflops']:.0f} | {row['mfu']:.1%} "
              f"| {row['peak_memory_gib']:.1f} | {row['warmup_s']:.1f} |", flush=True)
        torch.cuda.reset_peak_memory_stats()
    if args.json is not None:
        args.json.write_text(json.dumps({"device": name, "torch": torch.__version__,
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
