"""Chapter 6.1's experiment: deep encoder-decoders of each residual wiring (post-LN, pre-LN,
sandwich, DeepNorm) trained on the number-translation task, and the loss a model reaches
without reading the source.

One run is :func:`train_deep`: a thin model (d_model 32, 2 heads, d_ff 64, no dropout) with
``depth`` encoder and ``depth`` decoder layers, Adam with the paper's betas at a constant rate
after an optional linear warmup, label smoothing 0.1, batches drawn by
:func:`lecture_pkg.generator` (the same batches for every wiring and seed). The page trains
some arms live; ``scripts/deep_controls.py`` trains the rest with the same function and ships
them as ``lecture_pkg/recorded/deep_controls_cpu.json`` (:func:`load_deep_controls`).

::

    run = train_deep(task, "post", seed, lr=2e-3, warmup=40)
    run.end_loss, run.exact_match          # mean loss of the last 10 steps; held-out, in %
    source_blind_loss(train_tgt, len(task.vocab))   # the best loss without the source
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch
from torch import Tensor

from lecture_pkg import generator
from lecture_pkg.checks import check_int
from lecture_pkg.number_translation import BOS, EOS, PAD, TGT_LEN, NumberTranslation
from lecture_pkg.training import train
from lecture_pkg.transformer import Transformer, label_smoothed_cross_entropy

__all__ = ["DeepRun", "load_deep_controls", "make_deep", "source_blind_loss", "train_deep"]

END_STEPS = 10  # the loss "at the end": the mean over this many last steps


def make_deep(vocab_size: int, wiring: str, seed: int, depth: int = 18,
              device: torch.device | str = "cpu") -> Transformer:
    """The thin ``depth`` + ``depth``-layer model of chapter 6.1, initialised from ``seed``."""
    check_int("depth", depth, minimum=1)
    torch.manual_seed(seed)
    return Transformer(
        vocab_size, vocab_size, d_model=32, num_heads=2, num_encoder_layers=depth,
        num_decoder_layers=depth, d_ff=64, dropout=0.0, wiring=wiring, pad_token_id=PAD,
    ).to(device)


def exact_match(model: Transformer, src: Tensor, tgt: Tensor) -> float:
    """Held-out exact match in %: greedy outputs of ``src`` (n, s) equal to ``tgt`` (n, t)."""
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(src.to(device), bos_token_id=BOS, eos_token_id=EOS,
                             pad_token_id=PAD, max_new_tokens=TGT_LEN - 1).cpu()
    out = torch.nn.functional.pad(out, (0, tgt.shape[1] - out.shape[1]), value=PAD)
    return 100 * (out == tgt).all(1).float().mean().item()


@dataclass
class DeepRun:
    """One run: the training loss of every step, its mean over the last ``END_STEPS`` steps,
    and held-out exact match (%) at the end."""

    wiring: str
    seed: int
    losses: list[float]
    end_loss: float
    exact_match: float


def train_deep(task: NumberTranslation, wiring: str, seed: int, *, lr: float = 2e-3,
               warmup: int = 0, steps: int = 120, depth: int = 18, batch: int = 16,
               device: torch.device | str = "cpu") -> DeepRun:
    """Train one wiring from one seed on ``task``'s training numbers: Adam (0.9, 0.98, 1e-9) at
    ``lr``, reached linearly over the first ``warmup`` steps (0: from the first step), then
    constant; label smoothing 0.1; no gradient clipping."""
    check_int("warmup", warmup)
    check_int("steps", steps, minimum=END_STEPS)
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    train_src, train_tgt = task.encode(task.train_numbers)
    test_src, test_tgt = task.encode(task.test_numbers)

    def batches(step: int) -> tuple[Tensor, Tensor]:
        rows = torch.randint(0, len(train_src), (batch,), generator=generator(step))
        return train_src[rows], train_tgt[rows]

    def loss_fn(model: Transformer, pair: tuple[Tensor, ...]) -> Tensor:
        src, tgt = (t.to(device) for t in pair)
        logits = model(src, tgt[:, :-1])
        return label_smoothed_cross_entropy(logits, tgt[:, 1:], 0.1, ignore_index=PAD)

    model = make_deep(len(task.vocab), wiring, seed, depth, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9)
    ramp = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    run = train(model, batches, loss_fn, steps=steps, optimizer=optimizer, scheduler=ramp,
                clip_grad_norm=None, progress=False, log_every=1)
    return DeepRun(wiring, seed, run.losses, sum(run.losses[-END_STEPS:]) / END_STEPS,
                   exact_match(model, test_src, test_tgt))


def source_blind_loss(tgt: Tensor, vocab_size: int, smoothing: float = 0.1,
                      context: int | None = None) -> float:
    """The lowest mean label-smoothed loss on targets ``tgt`` (n, t; BOS first, PAD after EOS)
    of a predictor that never reads the source and sees the last ``context`` target tokens
    (None: the whole prefix; 0: nothing, the unigram predictor).

    For a context c with empty next-token distribution p, the smoothed target is
    (1 - smoothing) p + smoothing / V; the cross entropy against it is smallest for the
    prediction q equal to it, where it is the entropy H(q). Averaged over the target tokens."""
    if context is not None:
        check_int("context", context)
    counts: dict[tuple[int, ...], Tensor] = defaultdict(
        lambda: torch.zeros(vocab_size, dtype=torch.float64))
    for row in tgt.tolist():
        for j in range(1, len(row)):
            if row[j] == PAD:
                break
            start = 0 if context is None else max(0, j - context)
            counts[tuple(row[start:j])][row[j]] += 1
    total = loss = 0.0
    for c in counts.values():
        q = (1 - smoothing) * c / c.sum() + smoothing / vocab_size
        loss += c.sum().item() * -(q * q.log()).sum().item()
        total += c.sum().item()
    return loss / total


def load_deep_controls() -> dict[str, Any]:
    """The recorded arms of ``scripts/deep_controls.py``: ``{"info": {...}, "runs": [{"arm",
    "wiring", "lr", "warmup", "seed", "end_loss", "exact_match", "losses"}, ...]}``, losses
    one per step."""
    path = resources.files("lecture_pkg") / "recorded" / "deep_controls_cpu.json"
    return json.loads(path.read_text())
