"""Supervised fine-tuning (SFT) of the book's Shakespeare GPT on the instruction set of
:func:`lecture_pkg.shakespeare_tasks.shakespeare_instructions` (upper-case a word, reverse it, count
the words of a line): the chat template, the loss on the answers only, packed rows.

The book's SFT checkpoint (``lecture_pkg/checkpoints/shakespeare_sft.*``), on one CPU thread::

    OMP_NUM_THREADS=1 python scripts/train_sft.py --steps 1500 \\
        --export lecture_pkg/checkpoints

Every evaluation overwrites the export (float16 weights and a JSON holding the command, the
commit, the time and the held-out accuracy per task of the exported float16 weights on
``TEST_ITEMS`` instructions from the test works, the figure a unit test reproduces).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from lecture_pkg.alignment import completion_loss, encode_chat, generate_answers, pack
from lecture_pkg.models.gpt import GPT
from lecture_pkg.shakespeare_gpt import SFT_CHECKPOINT, load_shakespeare_gpt, shakespeare_gpt_info
from lecture_pkg.shakespeare_tasks import exact_match, shakespeare_instructions
from lecture_pkg.shipped import provenance, save_shipped

TEST_ITEMS, TEST_SEED = 300, 1  # the recorded held-out set


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-items", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=8, help="packed rows per step")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--export", default=None, help="a folder for the float16 checkpoint")
    parser.add_argument("--base", default=None,
                        help="a folder holding shakespeare_gpt.safetensors to start from "
                             "instead of the packaged one (same configuration)")
    return parser.parse_args(argv)


def held_out_accuracy(model: GPT, tokenizer) -> dict[str, float]:
    items = shakespeare_instructions("test", TEST_ITEMS, seed=TEST_SEED)
    answers = generate_answers(model, tokenizer, [it.prompt for it in items]).texts
    return exact_match(answers, items)


def export(model: GPT, tokenizer, folder: Path, figures: dict) -> dict[str, float]:
    """Write float16 weights and the JSON; returns the held-out accuracy of the float16 model."""
    state = {k: v.detach().cpu().half().contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to wte.weight
    half = GPT(model.config)
    half.load_state_dict({**{k: v.float() for k, v in state.items()},
                          "lm_head.weight": state["wte.weight"].float()})
    figures["test"] = {"split": "test", "items": TEST_ITEMS, "seed": TEST_SEED,
                       "accuracy": held_out_accuracy(half, tokenizer)}
    save_shipped(folder, SFT_CHECKPOINT, state, {"figures": figures})
    return figures["test"]["accuracy"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    model, tokenizer = load_shakespeare_gpt()
    base = shakespeare_gpt_info()["figures"]
    if args.base:
        from safetensors.torch import load_file

        state = load_file(str(Path(args.base) / "shakespeare_gpt.safetensors"))
        state["lm_head.weight"] = state["wte.weight"]
        model.load_state_dict({k: v.float() for k, v in state.items()})
        base = json.loads((Path(args.base) / "shakespeare_gpt.json").read_text())["figures"]
    items = shakespeare_instructions("train", args.train_items, seed=args.seed)
    rows, mask = pack([encode_chat(tokenizer, it.prompt, it.answer) for it in items],
                      block_size=model.config.n_positions, pad_id=tokenizer.pad_id)
    print(f"{len(items)} instructions in {len(rows)} packed rows; before SFT: "
          f"{held_out_accuracy(model, tokenizer)}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / args.warmup)
                                                 * (0.55 + 0.45 * math.cos(math.pi * s
                                                                           / args.steps)))
    batches = torch.Generator().manual_seed(args.seed)
    run = provenance(__file__, argv)
    start = time.time()
    for step in range(1, args.steps + 1):
        model.train()
        pick = torch.randint(len(rows), (args.batch_size,), generator=batches)
        loss = completion_loss(model(rows[pick]).logits, rows[pick], mask[pick])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        opt.zero_grad()
        if step % args.eval_every == 0 or step == args.steps:
            seconds = time.time() - start
            figures = {"steps": step, "train_seconds": round(seconds, 1), "loss": loss.item(),
                       "threads": torch.get_num_threads(), **run,
                       "base": {"commit": base.get("commit"), "steps": base.get("steps"),
                                "val_nats_per_char": base.get("val_nats_per_char")},
                       "train_items": args.train_items, "batch_size": args.batch_size,
                       "lr": args.lr}
            accuracy = (export(model, tokenizer, Path(args.export), figures) if args.export
                        else held_out_accuracy(model, tokenizer))
            print(f"step {step}: loss {loss.item():.3f}, held-out accuracy {accuracy}, "
                  f"{seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main()
