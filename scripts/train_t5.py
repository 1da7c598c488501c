"""Pretrain the book's small byte-level T5 on Shakespeare with span corruption, as chapter
7.7 does live (same model, Adafactor with the same relative-step cap, warmup over the first
tenth and a cosine decay), for more steps and, with ``--varied`` (the shipped checkpoint), on
chunks of varied length and noise density, so that where each span and the target end
carries information.

The book's checkpoint (``lecture_pkg/checkpoints/shakespeare_t5.*``), on one CPU thread::

    OMP_NUM_THREADS=1 python scripts/train_t5.py --steps 4000 --varied \\
        --export lecture_pkg/checkpoints

Training reads the 34 training works. The run is watched on the validation works (the
chapter's held-out draw of :func:`lecture_pkg.shakespeare_t5.held_out_batches` from them,
fixed and varied), and the test works are evaluated once, at the end, by the float16 weights
that are exported: on the chapter's held-out evaluation (8 x 64 chunks), its varied twin, and
a smaller slice (the first ``CHECK_BATCHES`` batches) that a unit test re-evaluates.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

import torch

from lecture_pkg.data import shakespeare
from lecture_pkg.models.t5 import T5, shift_right, t5_loss
from lecture_pkg.shakespeare_t5 import (
    CHECKPOINT,
    PAD,
    held_out_batches,
    small_config,
    t5_batch,
    t5_eval,
    to_chunks,
)
from lecture_pkg.shipped import provenance, save_shipped
from lecture_pkg.training import train, warmup_cosine

CHECK_BATCHES = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-2, help="Adafactor's relative-step cap")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--varied", action="store_true",
                        help="train on chunks of varied length and noise density")
    parser.add_argument("--eval-every", type=int, default=0, help="0: every steps // 8")
    parser.add_argument("--export", default=None, help="folder for the checkpoint files")
    return parser.parse_args(argv)


def export(model: T5, folder: Path, figures: dict) -> dict:
    """Write float16 weights and the JSON; the test figures, computed here once, are those
    of the float16 model."""
    state = {k: v.detach().cpu().half().clone() for k, v in model.state_dict().items()}
    reloaded = T5(model.config)
    reloaded.load_state_dict({k: v.float() for k, v in state.items()})
    reloaded.eval()
    held_out = held_out_batches()
    figures["test"] = t5_eval(reloaded, held_out)
    figures["test_varied"] = t5_eval(reloaded, held_out_batches(varied=True))
    figures["check_slice"] = {"batches": CHECK_BATCHES,
                              **t5_eval(reloaded, held_out[:CHECK_BATCHES])}
    info = {"config": asdict(model.config), "figures": figures}
    save_shipped(folder, CHECKPOINT, state, info)
    return figures["test"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    train_chunks = to_chunks(shakespeare("train"))
    watched = {"validation": held_out_batches(split="validation"),
               "validation_varied": held_out_batches(split="validation", varied=True)}
    torch.manual_seed(args.seed)
    model = T5(small_config())

    def batches(step: int) -> tuple:  # a fresh corruption every step
        return t5_batch(train_chunks, args.batch_size,
                        torch.Generator().manual_seed(args.seed * 1_000_003 + step),
                        varied=args.varied)

    def loss_fn(m: T5, batch: tuple) -> torch.Tensor:
        inputs, labels = batch[0], batch[1]
        logits = m(inputs, shift_right(labels), attention_mask=inputs != PAD).logits
        return t5_loss(logits, labels)

    eval_every = args.eval_every or max(1, args.steps // 8)
    curve: dict[str, list] = {"steps": [], **{name: [] for name in watched}}

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        curve["steps"].append(min(len(curve["steps"]) * eval_every + eval_every, args.steps))
        for name, held_out in watched.items():
            curve[name].append(t5_eval(model, held_out))
        print(f"step {curve['steps'][-1]}: {curve['validation'][-1]}", flush=True)
        return curve["validation"][-1]

    optimizer = torch.optim.Adafactor(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(args.steps // 10, args.steps))
    history = train(model, batches, loss_fn, steps=args.steps, optimizer=optimizer,
                    scheduler=scheduler, clip_grad_norm=None, eval_fn=evaluate,
                    eval_every=eval_every, log_every=max(1, args.steps // 40),
                    progress=args.export is None)
    print(f"final train loss {history.losses[-1]:.4f}, {history.seconds:.0f} s")
    if args.export:
        record = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
                  "varied": args.varied,
                  "optimizer": "Adafactor, warmup_cosine(steps // 10, steps), no clipping",
                  "params": sum(p.numel() for p in model.parameters()),
                  "threads": torch.get_num_threads(),
                  "train_seconds": round(history.seconds, 1),
                  **provenance(__file__, argv),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "history": curve}
        print("test:", export(model, Path(args.export), record), flush=True)


if __name__ == "__main__":
    main()
