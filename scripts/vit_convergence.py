"""Chapter 8's digits arms trained to convergence, recorded: the ViT page and the Swin page
train at a fixed 500 steps, where the ViT has not yet fitted its training images, and a
training-set-size sweep at fixed steps gives the small subsets far more epochs than the full set.
Here every run is trained until it fits and keeps the weights chosen on a validation split.

The rule, the same for every arm and size:

* 260 of the chapter's 1,300 training digits (stratified, fixed seed) are a validation set; the
  other 1,040 are the training pool, and the 497 held-out digits are scored once, at the end;
* a run lasts ``EPOCHS`` passes over its training images, and at least ``MIN_STEPS`` optimizer
  steps, the pages' own budget (a 50-image subset is one batch, so 100 epochs would be 100
  steps, too few for the ViT to fit it), with
  the chapter's recipe (:func:`lecture_pkg.digits_vision.fit`: AdamW 3e-3, warmup-cosine over
  the run, batches of 64);
* the validation error is measured about 50 times per run, and the weights with the lowest
  validation error are kept (early stopping, never on the test split);
* logistic regression on the pixels is fitted on the same images, its inverse regularisation
  ``C`` chosen on the same validation set.

Arms: every arm of the two pages, at 50, 200 and 1,040 images (a different stratified subset
per seed): the CNN, the ViT, the hybrid (conv stem + ViT), "ViT + shifts" (one-pixel shifts of
the training images), DeiT (hard distillation from the CNN of the same seed and images, trained
first under the same rule), the ViT without positions, Swin and Swin without shifted windows.
Seeds: ``lecture_pkg.seeds(4)``, one CPU thread; ``--arms`` and ``--sizes`` run a subset. The
pages read ``lecture_pkg/recorded/vit_convergence_cpu.json`` (``make vit-convergence``; 22
minutes on one thread of a shared 2-core machine, see ``benchmarks/RESULTS.md``).

    OMP_NUM_THREADS=1 python scripts/vit_convergence.py --out lecture_pkg/recorded/vit_convergence_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time

import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

from lecture_pkg import seed_offset, seeds
from lecture_pkg.digits_vision import (
    DigitsSplit,
    digits_split,
    error_rate,
    fit,
    hybrid,
    small_cnn,
    small_deit,
    small_swin,
    small_vit,
    steps_for_epochs,
)

VALIDATION, EPOCHS, MIN_STEPS, EVALS = 260, 100, 500, 50
SIZES = (50, 200)  # and the whole training pool
LOGREG_C = (0.01, 0.1, 1.0, 10.0, 100.0)
MAKERS = {"CNN": small_cnn, "ViT": small_vit, "hybrid": hybrid, "ViT + shifts": small_vit,
          "DeiT": small_deit, "ViT, no positions": lambda s: small_vit(s, "none"),
          "Swin": small_swin, "Swin, no shift": lambda s: small_swin(s, shift_windows=False)}
ARMS = tuple(MAKERS)  # the CNN first: it is DeiT's teacher


def subset(data: DigitsSplit, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` training images of a stratified draw with ``seed`` (all of them when
    ``n`` is the pool's size)."""
    if n == len(data.y_train):
        return data.x_train, data.y_train
    index = train_test_split(torch.arange(len(data.y_train)).numpy(), train_size=n,
                             stratify=data.y_train.numpy(), random_state=seed)[0]
    return data.x_train[index], data.y_train[index]


def run_arm(data: DigitsSplit, arm: str, n: int, seed: int,
            teacher: torch.nn.Module | None = None) -> tuple[dict, torch.nn.Module]:
    """Train one arm on ``n`` images with ``seed`` under the script's rule: its record and model.
    DeiT needs ``teacher``, the CNN trained on the same images with the same seed."""
    if arm not in MAKERS:
        raise ValueError(f"arm must be one of {list(MAKERS)}, got {arm!r}")
    if (arm == "DeiT") != (teacher is not None):
        raise ValueError("teacher is needed for DeiT and only for DeiT")
    x, y = subset(data, n, seed)
    steps = max(steps_for_epochs(n, EPOCHS), MIN_STEPS)
    began = time.perf_counter()
    run = fit(MAKERS[arm](seed), x, y, seed, steps=steps, augment=arm == "ViT + shifts",
              background=data.background, teacher=teacher, val=(data.x_val, data.y_val),
              eval_every=max(1, steps // EVALS))
    record = {"arm": arm, "n": n, "seed": seed, "steps": steps,
              "epochs": round(steps * min(64, n) / n, 1), "best_step": run.best_step,
              "val_error": run.val_error,
              "test_error": error_rate(run.model, data.x_test, data.y_test),
              "train_error": error_rate(run.model, x, y),
              "end_train_loss": round(run.train_loss, 5),
              "seconds": round(time.perf_counter() - began, 1)}
    return record, run.model


def logistic_regression(data: DigitsSplit, n: int, seed: int) -> dict:
    """Logistic regression on the pixels of the same ``n`` images, ``C`` chosen on validation
    (lowest validation error; ties: the smaller ``C``, the stronger regularisation)."""
    x, y = subset(data, n, seed)
    scored = []
    for c in LOGREG_C:
        model = LogisticRegression(C=c, max_iter=5000).fit(x.flatten(1).numpy(), y.numpy())
        val_error = 1 - model.score(data.x_val.flatten(1).numpy(), data.y_val.numpy())
        scored.append((val_error, c, model))
    val_error, c, model = min(scored, key=lambda t: t[:2])
    test_error = 1 - model.score(data.x_test.flatten(1).numpy(), data.y_test.numpy())
    return {"n": n, "seed": seed, "C": c, "val_error": float(val_error),
            "test_error": float(test_error)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(MAKERS))
    parser.add_argument("--sizes", nargs="*", type=int, default=None,
                        help="training-set sizes (default: 50, 200 and the whole pool)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = digits_split(VALIDATION)
    full = len(data.y_train)
    sizes = args.sizes or [*SIZES, full]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    info = {"command": "OMP_NUM_THREADS=1 python scripts/vit_convergence.py --out "
                       + args.out, "commit": commit, "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(), "seed_offset": seed_offset(),
            "seeds": seeds(args.seeds), "validation": VALIDATION, "train_pool": full,
            "test": len(data.y_test), "epochs": EPOCHS, "min_steps": MIN_STEPS,
            "evals_per_run": EVALS, "sizes": sizes, "arms": args.arms}
    result: dict = {"info": info, "runs": [], "logreg": []}
    start = time.time()

    def save() -> None:
        info["seconds"] = round(time.time() - start, 1)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")

    for n in sizes:
        if n == full:  # the same images for every seed
            whole = logistic_regression(data, full, seeds(1)[0])
            result["logreg"] += [whole | {"seed": seed} for seed in seeds(args.seeds)]
        else:
            result["logreg"] += [logistic_regression(data, n, s) for s in seeds(args.seeds)]
    # the largest size first: the pages' main comparisons are there
    for n in sorted(sizes, reverse=True):
        for seed in seeds(args.seeds):
            teacher = None
            for arm in args.arms:
                if arm == "DeiT" and teacher is None:  # CNN not among the arms
                    teacher = run_arm(data, "CNN", n, seed)[1]
                record, model = run_arm(data, arm, n, seed,
                                        teacher.eval() if arm == "DeiT" else None)
                if arm == "CNN":
                    teacher = model
                result["runs"].append(record)
                print(record, flush=True)
                save()
    save()


if __name__ == "__main__":
    main()
