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

Arms: ViT and CNN at 50, 200 and 1,040 images (a different stratified subset per seed);
``--arms`` adds, at 1,040 images, the hybrid (conv stem + ViT), "ViT + shifts" and Swin (not in
the recorded file: the shared CPU of the recording did not allow them). Seeds:
``lecture_pkg.seeds(4)``, one CPU thread. The pages read
``lecture_pkg/recorded/vit_convergence_cpu.json`` (``make vit-convergence``; 200 s of CPU time,
9 minutes of wall time on a shared machine; about 10 minutes of CPU with all five arms).

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
    small_swin,
    small_vit,
    steps_for_epochs,
)

VALIDATION, EPOCHS, MIN_STEPS, EVALS = 260, 100, 500, 50
SIZES = (50, 200)  # and the whole training pool
LOGREG_C = (0.01, 0.1, 1.0, 10.0, 100.0)
MAKERS = {"ViT": small_vit, "CNN": small_cnn, "hybrid": hybrid, "ViT + shifts": small_vit,
          "Swin": small_swin}
ARMS = ("ViT", "CNN")  # what the recorded file holds; the others run with --arms


def subset(data: DigitsSplit, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` training images of a stratified draw with ``seed`` (all of them when
    ``n`` is the pool's size)."""
    if n == len(data.y_train):
        return data.x_train, data.y_train
    index = train_test_split(torch.arange(len(data.y_train)).numpy(), train_size=n,
                             stratify=data.y_train.numpy(), random_state=seed)[0]
    return data.x_train[index], data.y_train[index]


def run_arm(data: DigitsSplit, arm: str, n: int, seed: int) -> tuple[dict, torch.nn.Module]:
    """Train one arm on ``n`` images with ``seed`` under the script's rule: its record and model."""
    x, y = subset(data, n, seed)
    steps = max(steps_for_epochs(n, EPOCHS), MIN_STEPS)
    began = time.perf_counter()
    run = fit(MAKERS[arm](seed), x, y, seed, steps=steps, augment=arm == "ViT + shifts",
              background=data.background, val=(data.x_val, data.y_val),
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
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(MAKERS),
                        help="arms at the full size (ViT and CNN also run the size sweep)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = digits_split(VALIDATION)
    full = len(data.y_train)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    info = {"command": "OMP_NUM_THREADS=1 python scripts/vit_convergence.py --out "
                       + args.out, "commit": commit, "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(), "seed_offset": seed_offset(),
            "seeds": seeds(args.seeds), "validation": VALIDATION, "train_pool": full,
            "test": len(data.y_test), "epochs": EPOCHS, "min_steps": MIN_STEPS,
            "evals_per_run": EVALS, "sizes": [*SIZES, full], "arms": args.arms}
    result: dict = {"info": info, "runs": [], "logreg": []}
    start = time.time()

    def save() -> None:
        info["seconds"] = round(time.time() - start, 1)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")

    for n in SIZES:
        result["logreg"] += [logistic_regression(data, n, seed) for seed in seeds(args.seeds)]
    whole = logistic_regression(data, full, seeds(1)[0])  # the same images for every seed
    result["logreg"] += [whole | {"seed": seed} for seed in seeds(args.seeds)]
    for seed in seeds(args.seeds):
        for n in SIZES:
            for arm in ("ViT", "CNN"):
                if arm in args.arms:
                    result["runs"].append(run_arm(data, arm, n, seed)[0])
                print(result["runs"][-1], flush=True)
        for arm in args.arms:
            record, _ = run_arm(data, arm, full, seed)
            result["runs"].append(record)
            print(record, flush=True)
            save()
    save()


if __name__ == "__main__":
    main()
