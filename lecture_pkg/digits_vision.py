"""Chapter 8's small vision experiments on scikit-learn's 8 x 8 digits, in one place.

The chapter's pages (the ViT page and the Swin page) and ``scripts/vit_convergence.py`` train
the same arms with the same recipe; this module holds that recipe once:

* :func:`digits_split`: the 1,797 UCI digits, 497 held out (stratified, fixed seed), the rest
  for training, optionally with a stratified validation slice taken out of the training images;
  pixels normalised by the training images' mean and standard deviation;
* the arms at matched size: :func:`small_vit` (patch 2, width 32, 2 layers, 4 heads),
  :func:`small_deit`, :func:`hybrid` (a 3 x 3 convolution in front of the ViT),
  :func:`small_swin` and :func:`small_cnn`, each initialised from ``seed``;
* :func:`load_vit_convergence` and :func:`recorded_arm`: the arms trained to convergence by
  ``scripts/vit_convergence.py``, read back as :class:`lecture_pkg.experiments.Arm` objects;
* :func:`fit`: AdamW (decay 0.05 on matrices only, not on learned tokens, position or bias
  tables, see :func:`optimizer_for`), a warmup-cosine schedule, batches of 64 drawn with
  replacement from a generator seeded with ``seed``; optional one-pixel shifts
  (:func:`random_shift`), hard distillation from a teacher, and early stopping on a
  validation set (the weights of the evaluation with the lowest validation error are kept).

::

    data = digits_split()
    run = fit(small_vit(0), data.x_train, data.y_train, seed=0, steps=500)
    error_rate(run.model, data.x_test, data.y_test)

Shapes: images (n, 1, 8, 8) float, labels (n,) int64.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.checks import check_int
from lecture_pkg.experiments import Arm
from lecture_pkg.models.deit import DeiT, hard_distillation_loss
from lecture_pkg.models.swin import Swin, SwinConfig
from lecture_pkg.models.vit import ViT, ViTConfig
from lecture_pkg.training import History, train, warmup_cosine

__all__ = ["VIT", "DigitsSplit", "FitResult", "digits_split", "error_rate", "fit", "hybrid",
           "load_vit_convergence", "logits_of", "n_params", "optimizer_for", "random_shift",
           "recorded_arm", "small_cnn", "small_deit", "small_swin", "small_vit",
           "steps_for_epochs"]

TEST_SIZE = 497
VIT = dict(image_size=8, patch_size=2, hidden_size=32, num_layers=2, num_heads=4,
           intermediate_size=64, num_labels=10)


@dataclass(frozen=True)
class DigitsSplit:
    """Normalised digits: training, held-out test and (possibly empty) validation images.

    ``background`` is a blank pixel after normalisation (what :func:`random_shift` fills in).
    """

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    x_val: Tensor
    y_val: Tensor
    background: float


def digits_split(validation: int = 0) -> DigitsSplit:
    """The chapter's split: 497 held-out digits (stratified, ``random_state=0``), the other
    1,300 for training; ``validation`` > 0 moves that many of the 1,300 (stratified, fixed
    seed) into a validation set. Pixels are scaled to [0, 1] and normalised with the mean and
    standard deviation of the 1,300 training images (validation included), so the training and
    test tensors do not depend on ``validation``'s size except for which rows are training."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    check_int("validation", validation)
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    labels = torch.tensor(digits.target)
    train_idx, test_idx = train_test_split(
        torch.arange(len(labels)).numpy(), test_size=TEST_SIZE, stratify=digits.target,
        random_state=0)
    if validation >= len(train_idx):
        raise ValueError(f"validation must be below {len(train_idx)} (the training images), "
                         f"got {validation}")
    mean, std = images[train_idx].mean(), images[train_idx].std()
    val_idx = train_idx[:0]
    if validation:
        train_idx, val_idx = train_test_split(
            train_idx, test_size=validation, stratify=digits.target[train_idx], random_state=0)
    norm = (images - mean) / std
    return DigitsSplit(norm[train_idx], labels[train_idx], norm[test_idx], labels[test_idx],
                       norm[val_idx], labels[val_idx], (-mean / std).item())


# ---- the arms ----------------------------------------------------------------------------------

def small_vit(seed: int, positions: str = "1d", channels: int = 1) -> ViT:
    """The chapter's ViT: 8 x 8 images, patch 2 (16 tokens + [CLS]), width 32, 2 layers."""
    torch.manual_seed(seed)
    return ViT(ViTConfig(num_channels=channels, positions=positions, **VIT))  # type: ignore[arg-type]


def small_deit(seed: int) -> DeiT:
    """:func:`small_vit` with DeiT's distillation token and second head."""
    torch.manual_seed(seed)
    return DeiT(ViTConfig(num_channels=1, **VIT))  # type: ignore[arg-type]


def hybrid(seed: int) -> nn.Module:
    """A 3 x 3 convolution (16 channels, GELU) in front of :func:`small_vit`."""
    torch.manual_seed(seed)
    stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.GELU())
    return nn.Sequential(stem, small_vit(seed, channels=16))


def small_swin(seed: int, shift_windows: bool = True) -> Swin:
    """A two-stage Swin at about the ViT's size: patch 2, windows of 2 x 2, width 14."""
    torch.manual_seed(seed)
    return Swin(SwinConfig(image_size=8, patch_size=2, num_channels=1, embed_dim=14,
                           depths=(2, 2), num_heads=(2, 4), window_size=2,
                           mlp_ratio=2.0, drop_path_rate=0.0, num_labels=10,
                           shift_windows=shift_windows))


def small_cnn(seed: int) -> nn.Module:
    """Three 3 x 3 convolutions (16, 32, 32 channels), one max-pool, global average pooling."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- training ----------------------------------------------------------------------------------

def logits_of(model: nn.Module, x: Tensor) -> Tensor:
    """(n, 10) logits of any arm (the ViT family returns an output tuple with ``.logits``)."""
    out = model(x)
    return out if isinstance(out, Tensor) else out.logits


def error_rate(model: nn.Module, x: Tensor, y: Tensor) -> float:
    """Fraction of ``x`` (n, 1, 8, 8) that ``model`` misclassifies (eval mode, no gradients)."""
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        wrong = logits_of(model, x.to(device)).argmax(-1).cpu() != y
    return wrong.float().mean().item()


def optimizer_for(model: nn.Module, lr: float = 3e-3,
                  weight_decay: float = 0.05) -> tuple[torch.optim.AdamW, set[str]]:
    """AdamW with decay on matrices only; learned tokens, position and bias tables are spared.
    Returns the optimiser and the names of the spared matrices."""
    skip: set[str] = set()
    for prefix, module in model.named_modules():
        if hasattr(module, "no_weight_decay"):
            skip |= {f"{prefix}.{n}".lstrip(".") for n in module.no_weight_decay()}
    skip |= {n for n, _ in model.named_parameters() if "bias_table" in n}
    decay, rest = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 and name not in skip else rest).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr), skip


def random_shift(x: Tensor, gen: torch.Generator, background: float) -> Tensor:
    """Move every image of ``x`` (n, c, 8, 8) by -1, 0 or +1 pixels along each axis; the
    uncovered pixels take the value ``background``."""
    padded = F.pad(x, (1, 1, 1, 1), value=background)
    offsets = torch.randint(3, (len(x), 2), generator=gen).tolist()
    size = x.shape[-1]
    crops = [padded[i, :, a: a + size, b: b + size] for i, (a, b) in enumerate(offsets)]
    return torch.stack(crops)


def steps_for_epochs(n: int, epochs: int, batch: int = 64) -> int:
    """Optimizer steps that show ``n`` training images ``epochs`` times in batches of
    ``min(batch, n)`` (at least one step)."""
    for name, value in (("n", n), ("epochs", epochs), ("batch", batch)):
        check_int(name, value, minimum=1)
    return max(1, math.ceil(epochs * n / min(batch, n)))


@dataclass
class FitResult:
    """A trained arm: the model (the best validation checkpoint when early stopping), the mean
    training loss of the last 5 logged steps (50 steps), the history, and for early stopping
    the step of the kept weights and their validation error."""

    model: nn.Module
    train_loss: float
    history: History
    best_step: int | None = None
    val_error: float | None = None
    val_curve: list[tuple[int, float, float]] = field(default_factory=list)


def fit(model: nn.Module, x: Tensor, y: Tensor, seed: int, *, steps: int, batch: int = 64,
        lr: float = 3e-3, augment: bool = False, background: float = 0.0,
        teacher: nn.Module | None = None, val: tuple[Tensor, Tensor] | None = None,
        eval_every: int | None = None,
        device: torch.device | str | None = None) -> FitResult:
    """Train ``model`` on ``x`` (n, 1, 8, 8), ``y`` (n,) with the chapter's recipe.

    Batches of ``min(batch, n)`` images are drawn with replacement from a generator seeded with
    ``seed`` (so every arm of a seed sees the same batches); ``augment`` shifts each by one pixel
    (:func:`random_shift`, which draws from the same generator); ``teacher`` switches to hard
    distillation (the model must be a DeiT). With ``val`` = (x_val, y_val), the validation error
    is measured every ``eval_every`` steps and after the last, and the weights with the lowest
    validation error (ties: lowest validation loss, then the earliest) are loaded back.
    """
    check_int("steps", steps, minimum=1)
    check_int("batch", batch, minimum=1)
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} images but y has {len(y)} labels")
    if device is not None:
        model.to(device)
    device = next(model.parameters()).device
    optimizer, _ = optimizer_for(model, lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(steps // 10, steps))
    gen = torch.Generator().manual_seed(seed)

    def batches(step: int) -> tuple[Tensor, Tensor]:
        i = torch.randint(len(y), (min(batch, len(y)),), generator=gen)
        xb = random_shift(x[i], gen, background) if augment else x[i]
        return xb.to(device), y[i].to(device)

    def loss_fn(m: nn.Module, b: tuple[Tensor, Tensor]) -> Tensor:
        if teacher is None:
            return F.cross_entropy(logits_of(m, b[0]), b[1])
        with torch.no_grad():
            teacher_logits = logits_of(teacher, b[0])
        return hard_distillation_loss(m(b[0]), b[1], teacher_logits)

    best: dict[str, object] = {}
    curve: list[tuple[int, float, float]] = []
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None
    if val is not None:
        x_val, y_val = val[0].to(device), val[1].to(device)

        def eval_fn(m: nn.Module) -> dict[str, float]:
            logits = logits_of(m, x_val)
            error = (logits.argmax(-1) != y_val).float().mean().item()
            loss = F.cross_entropy(logits, y_val).item()
            step = (len(curve) + 1) * (eval_every or steps)
            curve.append((min(step, steps), error, loss))
            if not best or (error, loss) < best["key"]:  # type: ignore[operator]
                best.update(key=(error, loss), step=min(step, steps),
                            state={k: v.detach().clone() for k, v in m.state_dict().items()})
            return {"val_error": error, "val_loss": loss}

    history = train(model, batches, loss_fn, steps=steps, optimizer=optimizer,
                    scheduler=schedule, eval_fn=eval_fn, eval_every=eval_every, progress=False)
    train_loss = statistics.mean(history.losses[-5:])
    if not best:
        return FitResult(model, train_loss, history)
    model.load_state_dict(best["state"])  # type: ignore[arg-type]
    return FitResult(model, train_loss, history, int(best["step"]),  # type: ignore[call-overload]
                     best["key"][0], curve)  # type: ignore[index]


# ---- the recorded runs of scripts/vit_convergence.py -------------------------------------------

def load_vit_convergence() -> dict[str, Any]:
    """The recorded runs of ``scripts/vit_convergence.py``: ``{"info": {...}, "runs": [{"arm",
    "n", "seed", "steps", "epochs", "best_step", "val_error", "test_error", "train_error",
    "end_train_loss", "seconds"}, ...], "logreg": [{"n", "seed", "C", "val_error",
    "test_error"}, ...]}``."""
    path = resources.files("lecture_pkg") / "recorded" / "vit_convergence_cpu.json"
    return json.loads(path.read_text())


def recorded_arm(record: dict[str, Any], arm: str, n: int, key: str = "test_error") -> Arm:
    """One recorded arm at ``n`` training images as an :class:`Arm` (values ordered by seed);
    ``arm="logistic regression"`` reads the ``logreg`` rows. ``key`` picks the number."""
    rows = record["logreg"] if arm == "logistic regression" else [
        r for r in record["runs"] if r["arm"] == arm]
    rows = sorted((r for r in rows if r["n"] == n), key=lambda r: r["seed"])
    if not rows:
        arms = sorted({(r["arm"], r["n"]) for r in record["runs"]})
        raise ValueError(f"no recorded runs of arm {arm!r} at n={n}; recorded: {arms}")
    if key not in rows[0]:
        raise ValueError(f"key must be one of {sorted(rows[0])}, got {key!r}")
    return Arm(arm, tuple(float(r[key]) for r in rows), tuple(r["seed"] for r in rows))
