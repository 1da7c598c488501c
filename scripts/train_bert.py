"""Pretrain the book's small character-level BERT on Shakespeare, RoBERTa-style: contiguous
windows of text, a fresh mask for every batch (dynamic masking), MLM only (no NSP).

The book's checkpoint (``lecture_pkg/checkpoints/shakespeare_bert.*``), on one CPU thread::

    OMP_NUM_THREADS=1 python scripts/train_bert.py --steps 2000 \\
        --export lecture_pkg/checkpoints

The vocabulary is the special tokens plus every character of the lower-cased training works.
Training reads the 34 training works; the validation works give the curve; the test works give
the recorded figures: masked-position accuracy of the model and of the count rules
(:class:`lecture_pkg.shakespeare_bert.CountRules`) on one fixed corruption of the first
``TEST_WINDOWS`` windows, and on a smaller slice a unit test re-evaluates. Every evaluation
overwrites the export, so the latest one is always usable.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from lecture_pkg.char_tokenizers import MLMChars
from lecture_pkg.data import shakespeare
from lecture_pkg.masks import IGNORE_INDEX
from lecture_pkg.models.bert import BertConfig, BertForPreTraining
from lecture_pkg.shakespeare_bert import (
    CHECKPOINT,
    CountRules,
    held_out_batch,
    masked_accuracy,
    mlm_predict,
    random_batch,
)
from lecture_pkg.shipped import provenance, save_shipped
from lecture_pkg.training import adamw, train, warmup_cosine

VAL_WINDOWS = 256
TEST_WINDOWS = 1024
CHECK_WINDOWS = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--length", type=int, default=64, help="characters per window")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--mask-rate", type=float, default=0.3)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=None, help="default: steps // 5")
    parser.add_argument("--export", default=None, help="a folder for the packaged checkpoint")
    parser.add_argument("--init", default=None,
                        help="start from these weights (a .safetensors export) instead of "
                             "random ones; the steps and time are added to its record")
    return parser.parse_args(argv)


def mlm_loss(model: BertForPreTraining, batch: tuple[torch.Tensor, torch.Tensor]
             ) -> torch.Tensor:
    """Cross-entropy at the selected positions only (the MLM head runs on those alone)."""
    inputs, labels = batch
    chosen = labels != IGNORE_INDEX
    hidden = model.bert(inputs).last_hidden_state[chosen]
    return F.cross_entropy(model.mlm_logits(hidden), labels[chosen])


def export(model: BertForPreTraining, vocab: MLMChars, rules: CountRules, folder: Path,
           figures: dict, args: argparse.Namespace) -> dict:
    """Write float16 weights and the JSON; the held-out figures are those of the float16 model."""
    state = {k: v.detach().cpu().half().contiguous() for k, v in model.state_dict().items()}
    reloaded = BertForPreTraining(model.config)
    reloaded.load_state_dict({k: v.float() for k, v in state.items()})
    reloaded.eval()
    test = vocab.encode(shakespeare("test"))
    for name, windows in (("test", TEST_WINDOWS), ("check", CHECK_WINDOWS)):
        inputs, labels = held_out_batch(test, windows, args.length, vocab.vocab_size,
                                        args.mask_rate)
        slice_figures = {"split": "test", "windows": windows, "length": args.length,
                         "mask_rate": args.mask_rate,
                         "accuracy": masked_accuracy(mlm_predict(reloaded, inputs), labels)}
        for rule in CountRules.RULES:
            slice_figures[rule] = masked_accuracy(rules.predict(inputs, rule), labels)
        figures[f"{name}_slice"] = slice_figures
    info = {"config": asdict(model.config), "chars": vocab.chars, "figures": figures}
    save_shipped(folder, CHECKPOINT, state, info)
    return figures["test_slice"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    vocab = MLMChars.from_text(shakespeare("train"))
    train_ids = vocab.encode(shakespeare("train"))
    rules = CountRules(train_ids, vocab.vocab_size)
    val_inputs, val_labels = held_out_batch(vocab.encode(shakespeare("validation")),
                                            VAL_WINDOWS, args.length, vocab.vocab_size,
                                            args.mask_rate)
    torch.manual_seed(args.seed)
    config = BertConfig(vocab_size=vocab.vocab_size, hidden_size=args.hidden,
                        num_layers=args.layers, num_heads=args.heads,
                        intermediate_size=4 * args.hidden, max_positions=args.length,
                        dropout=0.0)
    model = BertForPreTraining(config)
    before = {"steps": 0, "train_seconds": 0.0, "commands": []}
    if args.init:
        from safetensors.torch import load_file

        model.load_state_dict({k: v.float() for k, v in load_file(args.init).items()})
        record = json.loads(Path(args.init).with_suffix(".json").read_text())["figures"]
        before = {"steps": record["steps"], "train_seconds": record["train_seconds"],
                  "commands": record.get("commands", [record["command"]])}

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:  # a fresh mask every step
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        return random_batch(train_ids, args.batch_size, args.length, vocab.vocab_size,
                            args.mask_rate, gen)

    eval_every = args.eval_every or max(1, args.steps // 5)
    run = provenance(__file__, argv)
    curve: dict[str, list] = {"steps": [], "val_accuracy": []}
    began = time.perf_counter()

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        accuracy = masked_accuracy(mlm_predict(model, val_inputs), val_labels)
        curve["steps"].append(min(len(curve["steps"]) * eval_every + eval_every, args.steps))
        curve["val_accuracy"].append(accuracy)
        if args.export:
            figures = {"steps": before["steps"] + curve["steps"][-1],
                       "batch_size": args.batch_size,
                       "params": sum(p.numel() for p in model.parameters()),
                       "threads": torch.get_num_threads(),
                       "train_seconds": round(before["train_seconds"]
                                              + time.perf_counter() - began, 1),
                       **run, "commands": [*before["commands"], run["command"]], "lr": args.lr,
                       "warmup": args.warmup, "val_accuracy": accuracy, "history": curve}
            test = export(model, vocab, rules, Path(args.export), figures, args)
            print(f"step {curve['steps'][-1]}: val {accuracy:.4f}, test {test}, "
                  f"{figures['train_seconds']} s", flush=True)
        return {"val accuracy": accuracy}

    optimizer = adamw(model, args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                  warmup_cosine(args.warmup, args.steps))
    history = train(model, batches, mlm_loss, steps=args.steps, optimizer=optimizer,
                    scheduler=scheduler, eval_fn=evaluate, eval_every=eval_every,
                    log_every=max(1, args.steps // 30), progress=args.export is None)
    print(f"final train loss {history.losses[-1]:.4f}, {history.evals[-1]}, "
          f"{history.seconds:.0f} s")


if __name__ == "__main__":
    main()
