"""lecture_pkg.ngram against float64 brute force: dictionaries of n-gram counts and the
textbook recursions, written out again here, on tiny texts."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from lecture_pkg.ngram import AddK, KneserNey, window_positions


def _counts(ids: list[int], m: int) -> Counter:
    return Counter(tuple(ids[i:i + m]) for i in range(len(ids) - m + 1))


def _kn_reference(ids: list[int], order: int, vocab: int, discount: float | None):
    """Interpolated Kneser-Ney, recursive, one probability at a time."""
    tables = []
    for m in range(1, order + 1):
        if m == order:
            tables.append(_counts(ids, m))
        else:
            longer = _counts(ids, m + 1)
            tables.append(Counter(g[1:] for g in longer))  # distinct predecessors
    discounts = []
    for table in tables:
        values = list(table.values())
        n1, n2 = values.count(1), values.count(2)
        ney = n1 / (n1 + 2 * n2) if n1 else 0.5
        discounts.append(discount if discount is not None else ney)

    def prob(w: int, h: tuple[int, ...]) -> float:
        m = len(h) + 1
        lower = prob(w, h[1:]) if h else 1.0 / vocab
        table, d = tables[m - 1], discounts[m - 1]
        total = sum(table[h + (v,)] for v in range(vocab))
        if total == 0:
            return lower
        types = sum(table[h + (v,)] > 0 for v in range(vocab))
        return (max(table[h + (w,)] - d, 0) + d * types * lower) / total

    return prob


def _addk_reference(ids: list[int], order: int, vocab: int, k: float):
    tables = {m: _counts(ids, m) for m in range(1, order + 1)}

    def prob(w: int, h: tuple[int, ...]) -> float:
        table = tables[len(h) + 1]
        total = sum(table[h + (v,)] for v in range(vocab))
        return (table[h + (w,)] + k) / (total + k * vocab)

    return prob


TRAIN = [0, 1, 2, 0, 1, 3, 1, 2, 2, 0, 1, 0, 3, 3, 1, 2, 0, 1, 2, 1]
HELD_OUT = [1, 2, 0, 3, 0, 1, 1, 2, 3, 2, 0]
VOCAB = 5  # token 4 never occurs


@pytest.mark.parametrize("order,discount", [(1, None), (2, None), (3, None), (3, 0.75),
                                            (4, None)])
def test_kneser_ney_equals_the_recursion(order: int, discount: float | None) -> None:
    lm = KneserNey(order, discount).fit(TRAIN, VOCAB)
    reference = _kn_reference(TRAIN, order, VOCAB, discount)
    for context in itertools.product(range(VOCAB), repeat=order - 1):  # seen and unseen
        dist = lm.distribution(context)
        expected = [reference(w, context) for w in range(VOCAB)]
        np.testing.assert_allclose(dist, expected, rtol=1e-12)
        assert dist.sum() == pytest.approx(1.0, abs=1e-12)
        assert (dist > 0).all()
    positions = np.arange(len(HELD_OUT))  # short contexts at the start included
    expected = [np.log(reference(HELD_OUT[i], tuple(HELD_OUT[max(0, i - order + 1):i])))
                for i in positions]
    np.testing.assert_allclose(lm.log_probs(HELD_OUT, positions), expected, rtol=1e-12)


@pytest.mark.parametrize("order,k", [(1, 1.0), (2, 0.1), (3, 0.5)])
def test_add_k_equals_the_formula(order: int, k: float) -> None:
    lm = AddK(order, k).fit(TRAIN, VOCAB)
    reference = _addk_reference(TRAIN, order, VOCAB, k)
    for context in itertools.product(range(VOCAB), repeat=order - 1):
        dist = lm.distribution(context)
        np.testing.assert_allclose(dist, [reference(w, context) for w in range(VOCAB)],
                                   rtol=1e-12)
        assert dist.sum() == pytest.approx(1.0, abs=1e-12)
    positions = np.arange(len(HELD_OUT))
    expected = [np.log(reference(HELD_OUT[i], tuple(HELD_OUT[max(0, i - order + 1):i])))
                for i in positions]
    np.testing.assert_allclose(lm.log_probs(HELD_OUT, positions), expected, rtol=1e-12)
    assert lm.nats_per_token(HELD_OUT, positions) == pytest.approx(-np.mean(expected))


def test_kneser_ney_hand_computed_bigram() -> None:
    """"abcabb", D = 1/2. Bigrams ab 2, bc 1, ca 1, bb 1; distinct predecessors of a, b, c:
    1, 2, 1 (total 4), so P1 = (a 1/4, b 1/2, c 1/4). After b (count 2, 2 types):
    P(b|b) = (1 - 1/2 + 1/2 * 2 * 1/2) / 2 = 1/2, P(c|b) = 3/8, P(a|b) = (1/2 * 2 * 1/4) / 2
    = 1/8; after c (count 1, 1 type): P(a|c) = 1/2 + 1/2 * 1/4 = 5/8."""
    lm = KneserNey(2, discount=0.5).fit([0, 1, 2, 0, 1, 1], 3)
    np.testing.assert_allclose(lm.distribution([1]), [1 / 8, 1 / 2, 3 / 8], rtol=1e-15)
    assert lm.distribution([2])[0] == pytest.approx(5 / 8, rel=1e-15)
    np.testing.assert_allclose(lm.distribution([]), [1 / 4, 1 / 2, 1 / 4], rtol=1e-15)


def test_window_positions_and_argument_checks() -> None:
    assert window_positions([0, 10], 3).tolist() == [1, 2, 11, 12]
    lm = KneserNey(2).fit(TRAIN, VOCAB)
    with pytest.raises(ValueError, match="ids must lie"):
        lm.log_probs([0, 7], [1])
    with pytest.raises(ValueError, match="positions must lie"):
        lm.log_probs([0, 1], [2])
    with pytest.raises(RuntimeError, match="fit"):
        KneserNey(2).distribution([0])
    with pytest.raises(ValueError, match="discount"):
        KneserNey(2, discount=1.5)
    with pytest.raises(ValueError, match="k must be positive"):
        AddK(2, k=0)
