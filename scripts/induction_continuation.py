"""Does training with repeated spans give the book's GPT an induction head? Record the sweep
behind chapter 10.4's section 2 in ``lecture_pkg/recorded/induction_continuation_cpu.json``.

The shipped Shakespeare GPT (:func:`lecture_pkg.shakespeare_gpt.load_shakespeare_gpt`) is
continued on windows of the training plays in which every row carries a random string of
lower-case letters shown twice (:func:`lecture_pkg.interpretability.repeat_span_batches`,
``repeat=True``), and, as the control, the same windows with two different strings
(``repeat=False``): same seeds, steps, offsets and letters otherwise. Every ``--eval-every``
steps it records, on chapter 10a's probe (64 random strings of 50 letters shown twice), the
loss on the first and on the second copy and every head's prefix-matching score::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/induction_continuation.py

(``make induction-continuation``; 384 s of CPU time on one thread).
``tests/test_interpretability.py`` reruns the first evaluation of one seed and checks it
against the file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from lecture_pkg import seeds
from lecture_pkg.data import shakespeare
from lecture_pkg.interpretability import (
    induction_scores,
    repeat_losses,
    repeat_span_batches,
    repeated_tokens,
    run_with_cache,
)
from lecture_pkg.models.gpt import next_token_loss
from lecture_pkg.shakespeare_gpt import load_shakespeare_gpt
from lecture_pkg.training import adamw, train

OUT = Path(__file__).resolve().parent.parent / "lecture_pkg" / "recorded"
SETTINGS = {"batch_size": 16, "window": 64, "lr": 3e-3, "min_length": 6, "max_length": 24}


def probe(letters: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 10a's test: 64 strings of 50 random letters, each shown twice."""
    draw, lengths = repeated_tokens(64, 100, 26, generator=torch.Generator().manual_seed(502))
    return letters[draw], lengths


def evaluate(model: torch.nn.Module, twice: torch.Tensor, lengths: torch.Tensor
             ) -> dict[str, object]:
    first, second = repeat_losses(model, twice, lengths)
    _, cache = run_with_cache(model, twice)
    scores = induction_scores([cache[f"pattern{i}"] for i in range(len(model.blocks))], twice)
    return {"first": first, "second": second, "induction": scores.tolist()}


def continuation(seed: int, repeat: bool, steps: int, eval_every: int
                 ) -> list[dict[str, object]]:
    """One continuation of the shipped GPT; its evaluations (step 0 is the shipped model)."""
    torch.manual_seed(seed)
    model, tokenizer = load_shakespeare_gpt()
    letters = torch.tensor(tokenizer.encode("abcdefghijklmnopqrstuvwxyz"))
    twice, lengths = probe(letters)
    ids = torch.tensor(tokenizer.encode(shakespeare("train")))
    batches = repeat_span_batches(ids, letters, SETTINGS["batch_size"], SETTINGS["window"],
                                  seed, repeat, SETTINGS["min_length"], SETTINGS["max_length"])
    evals = [{"step": 0, **evaluate(model.eval(), twice, lengths)}]

    def record(m: torch.nn.Module) -> dict[str, float]:
        evals.append({"step": len(evals) * eval_every, **evaluate(m, twice, lengths)})
        return {}

    train(model.train(), batches, lambda m, x: next_token_loss(m(x).logits, x), steps=steps,
          optimizer=adamw(model, SETTINGS["lr"]), eval_every=eval_every, eval_fn=record,
          progress=False)
    return evals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    began = time.perf_counter()
    runs = []
    for seed in seeds(args.seeds, start=20):
        for repeat in (True, False):
            runs.append({"seed": seed, "repeat": repeat,
                         "evals": continuation(seed, repeat, args.steps, args.eval_every)})
            print(f"seed {seed}, repeat {repeat}: {runs[-1]['evals'][-1]['second']:.3f} "
                  f"({time.perf_counter() - began:.0f} s)", flush=True)
    record = {"settings": SETTINGS, "steps": args.steps, "eval_every": args.eval_every,
              "runs": runs, "threads": 1, "seconds": round(time.perf_counter() - began),
              "command": "OMP_NUM_THREADS=1 .venv/bin/python scripts/induction_continuation.py "
                         + " ".join(sys.argv[1:] if argv is None else argv)}
    OUT.mkdir(exist_ok=True)
    (OUT / "induction_continuation_cpu.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
