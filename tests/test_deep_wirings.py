"""Chapter 6.1's runs: the source-blind bound against independent computations, argument
checks, and one recorded control run reproduced."""

from __future__ import annotations

import math

import pytest
import torch

from lecture_pkg.deep_wirings import load_deep_controls, source_blind_loss, train_deep
from lecture_pkg.number_translation import PAD, NumberTranslation
from lecture_pkg.transformer import label_smoothed_cross_entropy


@pytest.fixture(scope="module")
def task() -> NumberTranslation:
    return NumberTranslation()


def test_unigram_bound_is_the_entropy_of_the_smoothed_frequencies(task) -> None:
    _, tgt = task.encode(task.train_numbers)
    v = len(task.vocab)
    targets = tgt[:, 1:][tgt[:, 1:] != PAD]
    p = torch.bincount(targets, minlength=v).double() / len(targets)
    q = 0.9 * p + 0.1 / v
    assert source_blind_loss(tgt, v, context=0) == pytest.approx(-(q * q.log()).sum().item())


def test_prefix_bound_is_the_loss_of_the_best_prefix_predictor(task) -> None:
    """The bound equals the package's label-smoothed loss of the predictor q = smoothed
    next-token frequencies given the whole target prefix, and moving q raises the loss."""
    _, tgt = task.encode(task.train_numbers)
    v = len(task.vocab)
    counts: dict[tuple[int, ...], torch.Tensor] = {}
    for row in tgt.tolist():
        for j in range(1, len(row)):
            if row[j] != PAD:
                counts.setdefault(tuple(row[:j]), torch.zeros(v, dtype=torch.float64))
                counts[tuple(row[:j])][row[j]] += 1
    logits = torch.zeros(*tgt[:, 1:].shape, v, dtype=torch.float64)
    for i, row in enumerate(tgt.tolist()):
        for j in range(1, len(row)):
            c = counts.get(tuple(row[:j]))
            if c is not None:
                logits[i, j - 1] = (0.9 * c / c.sum() + 0.1 / v).log()
    best = label_smoothed_cross_entropy(logits, tgt[:, 1:], 0.1, ignore_index=PAD).item()
    bound = source_blind_loss(tgt, v)
    assert bound == pytest.approx(best, rel=1e-10)
    worse = label_smoothed_cross_entropy(logits * 1.1, tgt[:, 1:], 0.1, ignore_index=PAD)
    assert worse.item() > bound
    assert bound < source_blind_loss(tgt, v, context=1) < source_blind_loss(tgt, v, context=0)


def test_bound_on_a_hand_example() -> None:
    # BOS=1, tokens 3/4, EOS=2: after BOS always 3, after (1, 3) half 4 half EOS
    tgt = torch.tensor([[1, 3, 4, 2], [1, 3, 2, 0]])
    v, eps = 5, 0.1

    def h(p: list[float]) -> float:
        q = [(1 - eps) * x + eps / v for x in p]
        return -sum(x * math.log(x) for x in q)

    tokens = {"after BOS": 2, "after 1 3": 2, "after 1 3 4": 1}
    expected = (2 * h([0, 0, 0, 1, 0]) + 2 * h([0, 0, 0.5, 0, 0.5])
                + h([0, 0, 1, 0, 0])) / sum(tokens.values())
    assert source_blind_loss(tgt, v, eps) == pytest.approx(expected)


def test_train_deep_checks_its_arguments(task) -> None:
    with pytest.raises(ValueError, match="lr"):
        train_deep(task, "post", 0, lr=0.0)
    with pytest.raises(ValueError, match="warmup"):
        train_deep(task, "post", 0, warmup=-1)
    with pytest.raises(ValueError, match="context"):
        source_blind_loss(torch.tensor([[1, 2]]), 3, context=-1)


def test_a_recorded_control_run_reproduces(task, monkeypatch) -> None:
    recorded = load_deep_controls()
    monkeypatch.setenv("LECTURE_SEED_OFFSET", str(recorded["info"]["seed_offset"]))
    run = next(r for r in recorded["runs"] if r["arm"] == "post-LN, lr 5e-4")
    torch.set_num_threads(1)
    again = train_deep(task, run["wiring"], run["seed"], lr=run["lr"], warmup=run["warmup"])
    assert again.end_loss == pytest.approx(run["end_loss"], abs=0.05)
    assert again.exact_match == run["exact_match"]
