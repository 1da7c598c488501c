"""The encoder-decoder: training-step throughput against torch.nn.Transformer, and greedy
decoding with the key-value cache against recomputing the prefix.

Run from the repository root: .venv/bin/python benchmarks/transformer.py [--repeats 5]
    [--threads 1] [--device cpu]

Every ratio is taken within this one run. Times are lecture_pkg.measure.wall_time, the best of
--repeats runs (the least disturbed one on a shared machine), with torch pinned to --threads.

Tables:
1. training step (forward, label-smoothed loss, backward, Adam step) on the same configuration
   and batch: lecture_pkg.transformer.Transformer against torch.nn.Transformer fed the same
   embeddings and output layer (so the difference is the encoder/decoder stacks), tokens/s;
2. greedy decoding of a batch with and without the KV cache as the output grows (EOS disabled,
   so every row decodes to the full length); outputs are checked identical.
"""

from __future__ import annotations

import argparse
import platform

import torch
from torch import nn

from lecture_pkg.masks import causal_mask, padding_mask
from lecture_pkg.measure import wall_time
from lecture_pkg.transformer import Transformer, label_smoothed_cross_entropy, transformer_adam

PAD, BOS = 0, 1


def training_step(model: nn.Module, forward, batch) -> None:  # noqa: ANN001
    src, tgt, src_mask, tgt_mask = batch
    logits = forward(src, tgt[:, :-1], src_mask, tgt_mask[:, :-1])
    loss = label_smoothed_cross_entropy(logits, tgt[:, 1:], 0.1, ignore_index=PAD)
    loss.backward()
    model.optimizer.step()
    model.optimizer.zero_grad(set_to_none=True)


def throughput_table(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    configs = [  # (name, d_model, heads, layers, d_ff, batch, t)
        ("small", 128, 4, 2, 512, 32, 32),
        ("medium", 256, 8, 3, 1024, 16, 64),
        ("base-width", 512, 8, 2, 2048, 8, 64),
    ]
    print("1. training step, tokens/s (source + target tokens per step / best step time)")
    print(f"{'config':12}{'ours':>12}{'torch':>12}{'ours/torch':>12}")
    for name, d, h, n, d_ff, batch, t in configs:
        torch.manual_seed(0)
        reference = nn.Transformer(d, h, n, n, d_ff, dropout=0.1, batch_first=True,
                                   device=device).train()
        ours = Transformer.from_torch(reference, 1000, 1000, pad_token_id=None).train()
        ours.optimizer = transformer_adam(ours.parameters())
        # torch's stacks between our embeddings and output layer: only the stacks differ
        reference.optimizer = transformer_adam(
            list(reference.parameters()) + list(ours.src_embed.parameters()))
        lengths = torch.randint(t // 2, t + 1, (batch,))
        lengths[0] = t
        src = torch.randint(3, 1000, (batch, t), device=device)
        tgt = torch.randint(3, 1000, (batch, t + 1), device=device)
        src_mask = padding_mask(lengths, t).to(device)
        tgt_mask = padding_mask(lengths + 1, t + 1).to(device)
        src, tgt = src.masked_fill(~src_mask, PAD), tgt.masked_fill(~tgt_mask, PAD)
        batch_data = (src, tgt, src_mask, tgt_mask)
        causal = ~causal_mask(t, device=device)

        def torch_forward(s, y, sm, ym):  # noqa: ANN001, ANN202
            hidden = reference(ours.embed_source(s), ours.embed_target(y), tgt_mask=causal,
                               src_key_padding_mask=~sm, tgt_key_padding_mask=~ym,
                               memory_key_padding_mask=~sm, tgt_is_causal=True)
            return ours.output(hidden)

        tokens = int(src_mask.sum() + tgt_mask[:, :-1].sum())
        t_ours = wall_time(lambda: training_step(ours, ours, batch_data), device,
                           repeats=args.repeats, warmup=2, cpu_threads=args.threads)
        t_torch = wall_time(lambda: training_step(reference, torch_forward, batch_data),
                            device, repeats=args.repeats, warmup=2, cpu_threads=args.threads)
        print(f"{name:12}{tokens / t_ours:>12,.0f}{tokens / t_torch:>12,.0f}"
              f"{t_torch / t_ours:>12.2f}")


def decoding_table(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = Transformer(1000, 1000, d_model=256, num_heads=8, num_encoder_layers=3,
                        num_decoder_layers=3, d_ff=1024, device=device).eval()
    src = torch.randint(3, 1000, (8, 32), device=device)
    print("\n2. greedy decoding, batch 8, source 32 tokens, EOS disabled")
    print(f"{'new tokens':>10}{'cache (s)':>12}{'recompute (s)':>15}{'speed-up':>10}")
    for new_tokens in (16, 32, 64, 128):
        def run(use_cache: bool) -> torch.Tensor:
            with torch.no_grad():
                return model.generate(src, bos_token_id=BOS, eos_token_id=[],
                                      max_new_tokens=new_tokens, use_cache=use_cache)

        assert torch.equal(run(True), run(False))
        t_cache = wall_time(lambda: run(True), device, repeats=args.repeats, warmup=1,
                            cpu_threads=args.threads)
        t_full = wall_time(lambda: run(False), device, repeats=args.repeats, warmup=1,
                           cpu_threads=args.threads)
        print(f"{new_tokens:>10}{t_cache:>12.3f}{t_full:>15.3f}{t_full / t_cache:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"device {args.device}, {args.threads} thread(s), best of {args.repeats}\n")
    throughput_table(args)
    decoding_table(args)


if __name__ == "__main__":
    main()
