"""Design choices of the modern decoder measured on Shakespeare: the GPT-2 block against the
modern block, then one change at a time away from the modern block, every arm over the same
seeds and the same batches, each compared with the modern block by a paired t test
(lecture_pkg.experiments.compare). Results, per seed and per comparison, go to one JSON file.

Arms (``--arms``, default all):

- ``gpt2``: the book's GPT (learned positions, LayerNorm with biases, GELU, biases, tied head);
- ``modern``: RoPE, RMSNorm, SwiGLU at width 8d/3, no biases, untied head (the reference arm);
- ``learned_positions`` / ``no_positions``: a learned table instead of RoPE, or nothing (NoPE);
- ``layernorm``: LayerNorm (without bias) instead of RMSNorm;
- ``gelu`` / ``relu2``: a plain FFN of width 4d (the same parameters as SwiGLU at 8d/3) with GELU
  or with ReLU squared (So et al. 2021; nanochat);
- ``tied``: the output layer is the embedding table;
- ``qk_norm``: RMSNorm on each head's queries and keys; ``qk_norm_high_lr`` and
  ``modern_high_lr`` compare it at ``--high-lr``, where QK-norm is meant to matter;
- ``muon``: the modern block trained with Muon (``lecture_pkg.muon``) at ``--muon-lr`` for the
  hidden matrices, AdamW at ``--lr`` for embeddings, output layer and gains.

On one GPU (bf16 autocast), 11 arms x 3 seeds of 1000 steps of 64 x 256 characters (4 layers
of width 256, 3.2M parameters); from the sweep's step times on an H200 (13-20 ms) that is
about 15-20 s a run, 8-11 minutes in all (not yet run; ``--arms`` picks a subset)::

    python scripts/modern_ablations.py --out ablations.json

A tiny CPU check (seconds)::

    OMP_NUM_THREADS=1 python scripts/modern_ablations.py --out /tmp/a.json --tiny

The JSON is rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

from lecture_pkg.char_tokenizers import CharTokenizer
from lecture_pkg.data import shakespeare
from lecture_pkg.experiments import Arm, compare
from lecture_pkg.lm_eval import eval_starts
from lecture_pkg.models.gpt import GPT, GPTConfig, next_token_loss
from lecture_pkg.models.llama import Llama, LlamaConfig
from lecture_pkg.muon import muon_and_adamw

CHANGES = {  # arm -> (LlamaConfig overrides, learning-rate multiplier)
    "modern": ({}, 1.0),
    "learned_positions": ({"position_embedding": "learned"}, 1.0),
    "no_positions": ({"position_embedding": "none"}, 1.0),
    "layernorm": ({"norm": "layer"}, 1.0),
    "gelu": ({"mlp": "gelu"}, 1.0),
    "relu2": ({"mlp": "relu2"}, 1.0),
    "tied": ({"tie_word_embeddings": True}, 1.0),
    "qk_norm": ({"qk_norm": True}, 1.0),
    "modern_high_lr": ({}, None),
    "qk_norm_high_lr": ({"qk_norm": True}, None),
    "muon": ({}, 1.0),
}
ARMS = ["gpt2", *CHANGES]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file the results go to")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=ARMS)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--high-lr", type=float, default=2e-2)
    parser.add_argument("--muon-lr", type=float, default=2e-2, help="Muon's rate (arm muon)")
    parser.add_argument("--eval-windows", type=int, default=256)
    parser.add_argument("--device", default=None)
    parser.add_argument("--tiny", action="store_true",
                        help="2 seeds, 1 layer of width 32, 20 steps: a pipeline check")
    args = parser.parse_args(argv)
    if args.tiny:
        args.seeds, args.layers, args.width, args.heads = 2, 1, 32, 2
        args.block_size, args.batch_size, args.steps, args.eval_windows = 32, 8, 20, 16
    return args


def build(arm: str, args: argparse.Namespace, vocab: int) -> torch.nn.Module:
    if arm == "gpt2":
        return GPT(GPTConfig(vocab_size=vocab, n_positions=args.block_size, n_embd=args.width,
                             n_layer=args.layers, n_head=args.heads, dropout=0.0,
                             embd_dropout=0.0))
    overrides, _ = CHANGES[arm]
    mlp = overrides.get("mlp", "swiglu")
    width = 8 * args.width // 3 if mlp == "swiglu" else 4 * args.width  # matched parameters
    return Llama(LlamaConfig(vocab_size=vocab, hidden_size=args.width, intermediate_size=width,
                             num_hidden_layers=args.layers, num_attention_heads=args.heads,
                             max_position_embeddings=args.block_size, **overrides))


def run(arm: str, seed: int, args: argparse.Namespace, data: dict, device: torch.device,
        autocast: torch.dtype | None) -> dict:
    torch.manual_seed(seed)
    model = build(arm, args, data["vocab"]).to(device)
    multiplier = 1.0 if arm == "gpt2" else CHANGES[arm][1]
    lr = args.high_lr if multiplier is None else args.lr * multiplier
    if arm == "muon":
        optimizers = muon_and_adamw(model, muon_lr=args.muon_lr, adamw_lr=lr)
    else:
        matrices = [p for p in model.parameters() if p.dim() >= 2]
        others = [p for p in model.parameters() if p.dim() < 2]
        optimizers = [torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1},
                                         {"params": others, "weight_decay": 0.0}], lr=lr,
                                        betas=(0.9, 0.95))]
    warmup = max(1, args.steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, factor) for o in optimizers]
    generator = torch.Generator(device=device).manual_seed(seed)  # same batches for every arm
    train_ids, offsets = data["train"], torch.arange(args.block_size, device=device)
    began, losses = time.perf_counter(), []
    for step in range(args.steps):
        starts = torch.randint(len(train_ids) - args.block_size, (args.batch_size,),
                               device=device, generator=generator)
        batch = train_ids[starts[:, None] + offsets]
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            loss = next_token_loss(model(batch).logits, batch)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for optimizer, scheduler in zip(optimizers, schedulers):
            optimizer.step()
            scheduler.step()
        if (step + 1) % max(1, args.steps // 20) == 0:
            losses.append(float(loss.detach()))
    model.eval()
    total = 0.0
    with torch.no_grad():
        for chunk in data["val_windows"].split(64):
            with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                total += float(next_token_loss(model(chunk).logits, chunk)) * len(chunk)
    val = total / len(data["val_windows"])
    rates = {"lr": lr, **({"muon_lr": args.muon_lr} if arm == "muon" else {})}
    return {"arm": arm, "seed": seed, **rates, "val_loss": val if math.isfinite(val) else None,
            "train_curve": losses, "params": sum(p.numel() for p in model.parameters()),
            "seconds": round(time.perf_counter() - began, 2)}


def verdicts(runs: list[dict], seeds: list[int]) -> dict:
    """Every arm against its reference (modern, or modern_high_lr for qk_norm_high_lr)."""
    out = {}
    arms = {}
    for arm in {r["arm"] for r in runs}:
        values = [r["val_loss"] for r in runs if r["arm"] == arm]
        if len(values) == len(seeds) and all(v is not None for v in values):
            arms[arm] = Arm(arm, values, seeds)
    for arm in arms:
        reference = "modern_high_lr" if arm == "qk_norm_high_lr" else "modern"
        if arm == reference or reference not in arms or len(seeds) < 2:
            continue
        result = compare(arms[arm], arms[reference], paired=True, higher_is_better=False)
        out[f"{arm} - {reference}"] = {"effect": result.effect, "low": result.low,
                                       "high": result.high, "p_value": result.p_value,
                                       "verdict": result.verdict,
                                       "summary": result.summary(4)}
    return out


def load_data(args: argparse.Namespace, device: torch.device) -> dict:
    """The character vocabulary, the training stream and the fixed validation windows."""
    tokenizer = CharTokenizer.from_text("".join(shakespeare(s)
                                                for s in ("train", "validation", "test")))
    val_ids = torch.tensor(tokenizer.encode(shakespeare("validation")), device=device)
    starts = torch.as_tensor(eval_starts(len(val_ids), args.eval_windows, args.block_size),
                             device=device)
    return {"vocab": tokenizer.vocab_size,
            "train": torch.tensor(tokenizer.encode(shakespeare("train")), device=device),
            "val_windows": val_ids[starts[:, None] + torch.arange(args.block_size,
                                                                  device=device)]}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    autocast = torch.bfloat16 if device.type == "cuda" else None
    data = load_data(args, device)
    seeds = list(range(args.seeds))
    payload = {"args": vars(args), "torch": torch.__version__,
               "device": torch.cuda.get_device_name(device) if device.type == "cuda"
               else platform.processor() or "cpu", "runs": [], "comparisons": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    for arm in args.arms:
        for seed in seeds:
            record = run(arm, seed, args, data, device, autocast)
            payload["runs"].append(record)
            payload["comparisons"] = verdicts(payload["runs"], seeds)
            payload["total_seconds"] = round(time.perf_counter() - began, 1)
            tmp = out.with_suffix(out.suffix + ".tmp")
            tmp.write_text(json.dumps(payload, indent=1))
            os.replace(tmp, out)
            print(f"{arm:18} seed {seed}: val {record['val_loss']} ({record['seconds']} s)",
                  flush=True)
    for name, result in payload["comparisons"].items():
        print(f"{name:34} {result['summary']}")
    return payload


if __name__ == "__main__":
    main()
