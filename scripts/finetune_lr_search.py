"""Chapter 9's fine-tuning methods, each at its own learning rate chosen on validation data.

Every method of :data:`lecture_pkg.docstring_task.METHODS` (head only, full fine-tuning, LoRA at
ranks 1, 8 and 32 with alpha = 2r, rsLoRA at ranks 1 and 32, LoRA on all linear layers, Houlsby
adapters, prompt tuning, QLoRA) trains with :func:`~lecture_pkg.docstring_task.fit_classifier`
at every rate of one shared grid, over ``seeds(--seeds)``; the rate with the best mean accuracy
on the 100 validation docstrings (ties: the lower validation loss) is the method's rate. Only
then is the 200-example test set scored, once per method, at that rate, over
``seeds(--test-seeds)`` (the selection seeds' models are reused, the others trained afresh).
The chapter (book/text/09_lora_qlora.md) reads the result from
``lecture_pkg/recorded/finetune_lr_search_cpu.json`` (``make finetune-lr-search``; about 20
minutes on one CPU thread).

    OMP_NUM_THREADS=1 python scripts/finetune_lr_search.py \
        --out lecture_pkg/recorded/finetune_lr_search_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from typing import Any

import torch
from torch import nn

from lecture_pkg import seed_offset, seeds
from lecture_pkg.docstring_task import (
    METHODS,
    DocstringTask,
    accuracy,
    fit_classifier,
    load_docstring_task,
    loss_on,
)

GRID = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)  # half-decade steps, for every method
STEPS, BATCH = 40, 16


def run_one(task: DocstringTask, method: str, lr: float, seed: int,
            steps: int = STEPS, batch_size: int = BATCH) -> tuple[dict[str, Any], nn.Module]:
    """Train ``method`` at ``lr`` with ``seed``; its row (validation scores, losses, sizes)
    and the trained model. The test split is not touched here."""
    fit = fit_classifier(task, METHODS[method], lr=lr, seed=seed, steps=steps,
                         batch_size=batch_size)
    row = {"method": method, "lr": lr, "seed": seed,
           "val_accuracy": accuracy(fit.model, task, task.val_idx),
           "val_loss": round(loss_on(fit.model, task, task.val_idx), 5),
           "first_loss": round(fit.losses[0], 5), "last_loss": round(fit.losses[-1], 5),
           "trainable": fit.trainable, "total": fit.total}
    return row, fit.model


def choose(rows: list[dict[str, Any]]) -> float:
    """The rate with the highest mean validation accuracy over the seeds; ties go to the
    lower mean validation loss."""
    rates = sorted({row["lr"] for row in rows})

    def score(lr: float) -> tuple[float, float]:
        mine = [row for row in rows if row["lr"] == lr]
        return (statistics.mean(r["val_accuracy"] for r in mine),
                -statistics.mean(r["val_loss"] for r in mine))
    return max(rates, key=score)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per rate (selection)")
    parser.add_argument("--test-seeds", type=int, default=5, help="seeds at the chosen rate")
    parser.add_argument("--methods", nargs="*", default=list(METHODS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = load_docstring_task(n_layers=1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    info = {"command": "OMP_NUM_THREADS=1 python scripts/finetune_lr_search.py --out "
                       + args.out, "commit": commit, "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(), "seed_offset": seed_offset(),
            "steps": STEPS, "batch": BATCH, "n_layers": task.n_layers,
            "n_train": len(task.train_idx), "n_val": len(task.val_idx),
            "n_test": len(task.test_idx), "selection_seeds": seeds(args.seeds),
            "test_seeds": seeds(args.test_seeds),
            "date": time.strftime("%Y-%m-%d")}
    record: dict[str, Any] = {"info": info, "grid": list(GRID), "runs": [], "chosen": {},
                              "test": []}
    start = time.time()
    for method in args.methods:
        models: dict[tuple[float, int], nn.Module] = {}
        rows = []
        for lr in GRID:
            for seed in seeds(args.seeds):
                row, models[lr, seed] = run_one(task, method, lr, seed)
                rows.append(row)
                print({k: row[k] for k in ("method", "lr", "seed", "val_accuracy",
                                           "last_loss")}, flush=True)
        lr = choose(rows)
        record["runs"] += rows
        record["chosen"][method] = lr
        for seed in seeds(args.test_seeds):  # the test set, once, at the chosen rate
            model = models.get((lr, seed))
            row = next((r for r in rows if r["lr"] == lr and r["seed"] == seed), None)
            if model is None:
                row, model = run_one(task, method, lr, seed)
            record["test"].append({"method": method, "lr": lr, "seed": seed,
                                   "test_accuracy": accuracy(model, task, task.test_idx),
                                   "val_accuracy": row["val_accuracy"],
                                   "last_loss": row["last_loss"],
                                   "trainable": row["trainable"], "total": row["total"]})
        mean = statistics.mean(t["test_accuracy"] for t in record["test"]
                               if t["method"] == method)
        print(f"== {method}: lr {lr:g}, test accuracy {mean:.3f}, "
              f"{time.time() - start:.0f} s", flush=True)
        info["seconds"] = round(time.time() - start, 1)
        with open(args.out, "w") as f:  # after every method: a partial run keeps its rows
            json.dump(record, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
