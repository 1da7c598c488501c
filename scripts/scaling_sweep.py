"""A scaling-law sweep on Shakespeare: the modern decoder (lecture_pkg.models.llama) trained at
several model sizes N and token budgets D, characters as tokens, every run with its config,
its validation curve and its final held-out loss written to one JSON file.

The grid is isoFLOP (Chinchilla's approach 2): for each compute budget C (6 N D, N the
non-embedding parameters), every model size in the family trains on D = C / (6 N) tokens with a
cosine schedule that ends at D, so each run's final loss is a valid point for the fit (approach 3
fits L(N, D) = E + A / N^alpha + B / D^beta to all of them). Runs whose D would give fewer than
``--min-steps`` optimizer steps, or more than ``--max-tokens`` tokens, are left out of the plan.
One more run, at a larger budget (``--holdout-flops``), is marked ``"role": "holdout"``: the page
fits without it and checks the prediction on it.

On one H200 (bf16 autocast; about 4 minutes, see benchmarks/RESULTS.md)::

    python scripts/scaling_sweep.py --out sweep.json

The step time of these small models is bound by kernel launches (about 13 ms a step on an
H200 at 32 windows of 256 characters), so the preset takes 64 windows a step.

A tiny CPU check of the whole pipeline (seconds)::

    OMP_NUM_THREADS=1 python scripts/scaling_sweep.py --preset tiny --out /tmp/sweep.json

The JSON is rewritten after every run, so a run cut short (``--max-seconds``) keeps what it
finished. The training set is 4 MB of characters: the larger budgets repeat it for several
epochs (each run records its ``epochs``), which is the regime of Muennighoff et al. (2023).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from lecture_pkg.char_tokenizers import CharTokenizer
from lecture_pkg.data import shakespeare
from lecture_pkg.lm_eval import eval_starts
from lecture_pkg.models.llama import Llama, LlamaConfig

# (n_layer, d_model): widths and depths of one family, head_dim 32 (16 in the tiny preset)
FAMILY = [(2, 64), (3, 96), (4, 128), (4, 192), (6, 256), (8, 320)]
PRESETS = {
    "h200": {"family": FAMILY, "flops": [2e13, 6e13, 2e14], "holdout_flops": 6e14,
             "holdout_size": 4, "head_dim": 32, "batch_size": 64, "block_size": 256,
             "min_steps": 100, "max_tokens": 60e6, "eval_windows": 128, "curve_points": 8},
    "tiny": {"family": [(1, 32), (2, 48), (2, 64)], "flops": [3e9, 1e10],
             "holdout_flops": 3e10, "holdout_size": 1, "head_dim": 16, "batch_size": 8,
             "block_size": 64, "min_steps": 10, "max_tokens": 2e5, "eval_windows": 16,
             "curve_points": 3},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file the results go to")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="h200")
    parser.add_argument("--flops", type=float, nargs="+", default=None,
                        help="compute budgets 6ND of the isoFLOP grid")
    parser.add_argument("--holdout-flops", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="windows per optimizer step (default: the preset's)")
    parser.add_argument("--lr", type=float, default=3e-3,
                        help="peak learning rate at d_model 128, scaled by 128 / d_model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    parser.add_argument("--max-seconds", type=float, default=480,
                        help="start no new run after this many seconds")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    return parser.parse_args(argv)


def model_config(n_layer: int, d_model: int, head_dim: int, vocab: int,
                 block: int) -> LlamaConfig:
    heads = max(2, d_model // head_dim)
    return LlamaConfig(vocab_size=vocab, hidden_size=d_model,
                       intermediate_size=16 * max(1, round(8 * d_model / 3 / 16)),
                       num_hidden_layers=n_layer, num_attention_heads=heads,
                       num_key_value_heads=heads // 2, head_dim=d_model // heads,
                       max_position_embeddings=block)


def non_embedding_params(config: LlamaConfig) -> int:
    model = Llama(config, device="meta")
    total = sum(p.numel() for p in model.parameters())
    return total - 2 * config.vocab_size * config.hidden_size  # untied: table and head


def plan(preset: dict, flops: list[float], holdout_flops: float, vocab: int) -> list[dict]:
    """The runs: every (budget, size) pair inside the step and token limits, then the holdout."""
    tokens_per_step = preset["batch_size"] * preset["block_size"]
    runs = []
    grid = [(c, shape, "grid") for c in flops for shape in preset["family"]]
    grid.append((holdout_flops, preset["family"][preset["holdout_size"]], "holdout"))
    for budget, (n_layer, d_model), role in grid:
        config = model_config(n_layer, d_model, preset["head_dim"], vocab, preset["block_size"])
        n = non_embedding_params(config)
        steps = round(budget / (6 * n) / tokens_per_step)
        if role == "grid" and not (preset["min_steps"] <= steps
                                   and steps * tokens_per_step <= preset["max_tokens"]):
            continue
        runs.append({"role": role, "flops_budget": budget, "n_layer": n_layer,
                     "d_model": d_model, "config": config, "non_embedding_params": n,
                     "steps": steps, "tokens": steps * tokens_per_step})
    return runs


@torch.no_grad()
def evaluate(model: Llama, ids: torch.Tensor, starts: torch.Tensor, block: int,
             autocast: torch.dtype | None) -> float:
    """Mean next-character cross-entropy (nats) over fixed validation windows."""
    model.eval()
    total, count = 0.0, 0
    offsets = torch.arange(block, device=ids.device)
    for chunk in starts.split(64):
        windows = ids[chunk[:, None] + offsets]
        with torch.autocast(ids.device.type, dtype=autocast, enabled=autocast is not None):
            logits = model(windows).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                                 windows[:, 1:].flatten(), reduction="sum")
        total += float(loss)
        count += windows[:, 1:].numel()
    model.train()
    return total / count


def train_run(run: dict, preset: dict, train_ids: torch.Tensor, val_ids: torch.Tensor,
              val_starts: torch.Tensor, lr_128: float, seed: int, device: torch.device,
              autocast: torch.dtype | None) -> dict:
    """Train one run; return its record (config, losses, curve, seconds)."""
    config: LlamaConfig = run["config"]
    block, batch, steps = preset["block_size"], preset["batch_size"], run["steps"]
    torch.manual_seed(seed)
    model = Llama(config).to(device)
    lr = lr_128 * 128 / config.hidden_size
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1},
                                   {"params": others, "weight_decay": 0.0}], lr=lr,
                                  betas=(0.9, 0.95), fused=device.type == "cuda")
    warmup = max(1, min(100, steps // 10))

    def factor(step: int) -> float:  # linear warmup, cosine to 10 %
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    generator = torch.Generator(device=device).manual_seed(seed)
    offsets = torch.arange(block, device=device)
    marks = sorted({max(1, round(steps * (i + 1) / preset["curve_points"]))
                    for i in range(preset["curve_points"])})
    curve: dict[str, list] = {"steps": [], "tokens": [], "val_loss": [], "train_loss": []}
    began = time.perf_counter()
    running = torch.zeros((), device=device)
    for step in range(1, steps + 1):
        starts = torch.randint(len(train_ids) - block, (batch,), device=device,
                               generator=generator)
        windows = train_ids[starts[:, None] + offsets]
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            logits = model(windows).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                                 windows[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        running = 0.9 * running + 0.1 * loss.detach() if step > 1 else loss.detach()
        if step in marks:
            curve["steps"].append(step)
            curve["tokens"].append(step * batch * block)
            curve["train_loss"].append(float(running))
            curve["val_loss"].append(evaluate(model, val_ids, val_starts, block, autocast))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    n = run["non_embedding_params"]
    attention_flops = 6 * config.num_hidden_layers * block * config.hidden_size  # per token
    return {"role": run["role"], "flops_budget": run["flops_budget"],
            "n_layer": config.num_hidden_layers, "d_model": config.hidden_size,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.kv_heads,
            "intermediate_size": config.intermediate_size,
            "non_embedding_params": n, "params": sum(p.numel() for p in model.parameters()),
            "tokens": run["tokens"], "steps": steps, "batch_size": batch, "block_size": block,
            "flops": 6 * n * run["tokens"],
            "flops_with_attention": (6 * n + attention_flops) * run["tokens"],
            "epochs": run["tokens"] / len(train_ids), "tokens_per_param": run["tokens"] / n,
            "lr": lr, "warmup": warmup, "seed": seed, "val_loss": curve["val_loss"][-1],
            "train_loss": curve["train_loss"][-1], "curve": curve,
            "seconds": round(seconds, 2), "tokens_per_second": round(run["tokens"] / seconds)}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    preset = dict(PRESETS[args.preset])
    if args.batch_size is not None:
        preset["batch_size"] = args.batch_size
    flops = args.flops or preset["flops"]
    holdout = args.holdout_flops or preset["holdout_flops"]
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    autocast = torch.bfloat16 if device.type == "cuda" else None
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    tokenizer = CharTokenizer.from_text("".join(shakespeare(s)
                                                for s in ("train", "validation", "test")))
    runs = plan(preset, flops, holdout, tokenizer.vocab_size)
    for run in runs:
        print(f"{run['role']:8s} C={run['flops_budget']:.0e} L={run['n_layer']} "
              f"d={run['d_model']} N={run['non_embedding_params']:,} steps={run['steps']} "
              f"D={run['tokens']:,}", flush=True)
    print(f"{len(runs)} runs, {sum(r['tokens'] for r in runs):,} tokens", flush=True)
    if args.dry_run:
        return {}
    train_ids = torch.tensor(tokenizer.encode(shakespeare("train")), device=device)
    val_ids = torch.tensor(tokenizer.encode(shakespeare("validation")), device=device)
    block = preset["block_size"]
    val_starts = torch.as_tensor(eval_starts(len(val_ids), preset["eval_windows"], block),
                                 device=device)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
               "commit": commit(), "torch": torch.__version__, "python": platform.python_version(),
               "device": torch.cuda.get_device_name(device) if device.type == "cuda"
               else platform.processor() or "cpu",
               "autocast": str(autocast), "preset": args.preset,
               "settings": {k: v for k, v in preset.items() if k != "family"},
               "family": preset["family"], "flops": flops, "holdout_flops": holdout,
               "lr_at_d128": args.lr, "vocab_size": tokenizer.vocab_size,
               "train_tokens": len(train_ids), "val_tokens": len(val_ids),
               "planned": len(runs), "runs": [], "complete": False}
    began = time.perf_counter()
    for run in runs:
        if time.perf_counter() - began > args.max_seconds:
            print(f"--max-seconds {args.max_seconds} reached: stopping", flush=True)
            break
        record = train_run(run, preset, train_ids, val_ids, val_starts, args.lr, args.seed,
                           device, autocast)
        payload["runs"].append(record)
        payload["total_seconds"] = round(time.perf_counter() - began, 1)
        payload["complete"] = len(payload["runs"]) == len(runs)
        write(out, payload)
        print(f"{record['role']:8s} N={record['non_embedding_params']:,} "
              f"D={record['tokens']:,} val {record['val_loss']:.4f} "
              f"({record['seconds']} s, {record['tokens_per_second']:,} tok/s)", flush=True)
    return payload


if __name__ == "__main__":
    main()
