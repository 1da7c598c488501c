"""Vision Transformers: our ViT and Swin against Hugging Face's, and attention memory as the image
grows, measured in one run.

1. Forward time, CPU, float32, eval mode, no_grad, random weights: ViT-B/16 and Swin-T at 224 px,
   ours (fused SDPA) against transformers' ViTModel / SwinModel (their default attention, SDPA).
   Target: HF time / our time >= 1.0. Median of interleaved rounds (each round times every model
   once), so load from other processes hits all of them alike.
2. Attention memory against image size: one ViT block (global attention over all patch tokens)
   against one shifted Swin block (7 x 7 windows) on the same C = 96, 3-head token map of side
   n, n = 14 ... 56, with the attention weights materialised (output_attentions: the entries the
   lectures' formulas count) and with the fused path. Peak bytes beyond the input, via
   lecture_pkg.measure.peak_memory (resident-set high-water mark; a few MB resolution).

Run: .venv/bin/python benchmarks/vision.py [--batch 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from lecture_pkg.layers import EncoderLayer
from lecture_pkg.measure import peak_memory, wall_time
from lecture_pkg.models.swin import Swin, SwinBlock
from lecture_pkg.models.vit import ViT

MIB = 2**20


def forward_times(batch: int, repeats: int) -> None:
    import transformers

    torch.manual_seed(0)
    pixels = torch.randn(batch, 3, 224, 224)
    hf_vit = transformers.ViTModel(transformers.ViTConfig(), add_pooling_layer=False).eval()
    hf_swin = transformers.SwinModel(transformers.SwinConfig()).eval()
    models = {"ViT-B/16 ours": ViT.from_hf(hf_vit).eval(), "ViT-B/16 HF": hf_vit,
              "Swin-T ours": Swin.from_hf(hf_swin).eval(), "Swin-T HF": hf_swin}
    with torch.no_grad():
        ours_vit = models["ViT-B/16 ours"](pixels).last_hidden_state
        ours_swin = models["Swin-T ours"](pixels).last_hidden_state
        vit_gap = (ours_vit - hf_vit(pixels).last_hidden_state).abs().max().item()
        swin_gap = (ours_swin - hf_swin(pixels).last_hidden_state).abs().max().item()
        times: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(repeats):
            for name, model in models.items():
                times[name].append(wall_time(lambda: model(pixels), repeats=1, warmup=0))
    median = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"\n## Forward time, batch {batch}, 224 px, float32, {torch.get_num_threads()} "
          f"threads, median of {repeats} interleaved rounds")
    print(f"max |ours - HF| of last_hidden_state: ViT {vit_gap:.1e}, Swin {swin_gap:.1e}")
    print("| model | ours s | HF s | HF / ours |")
    print("|---|---|---|---|")
    for arch in ("ViT-B/16", "Swin-T"):
        ours, hf = median[f"{arch} ours"], median[f"{arch} HF"]
        print(f"| {arch} | {ours:.3f} | {hf:.3f} | {hf / ours:.2f} |")


def attention_memory(sides: list[int]) -> None:
    dim, heads, window = 96, 3, 7
    torch.manual_seed(0)
    vit_block = EncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                             wiring="pre").eval()
    swin_block = SwinBlock(dim, heads, window).eval()
    print(f"\n## Attention memory, one block, C = {dim}, {heads} heads, batch 1, "
          f"Swin window {window}, shifted")
    print("| side n | tokens | ViT entries | Swin entries | ViT MiB (weights) | Swin MiB "
          "(weights) | ViT MiB (fused) | Swin MiB (fused) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in sides:
        x = torch.randn(1, n * n, dim)
        cells = {}
        for weights in (True, False):
            with torch.no_grad():
                _, vit_bytes = peak_memory(lambda: vit_block(x, output_attentions=weights))
                _, swin_bytes = peak_memory(lambda: swin_block(x, (n, n), shifted=True,
                                                               output_attentions=weights))
            cells[weights] = (vit_bytes / MIB, swin_bytes / MIB)
        padded = -(-n // window) * window
        print(f"| {n} | {n * n} | {heads * (n * n) ** 2:,} | {heads * window**2 * padded**2:,} "
              f"| {cells[True][0]:.1f} | {cells[True][1]:.1f} | {cells[False][0]:.1f} "
              f"| {cells[False][1]:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    began = time.perf_counter()
    print(f"# benchmarks/vision.py: torch {torch.__version__}, {platform.machine()}, "
          f"{torch.get_num_threads()} threads")
    forward_times(args.batch, args.repeats)
    attention_memory([14, 28, 42, 56])
    print(f"\n(total {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
