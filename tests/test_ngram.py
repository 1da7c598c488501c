"""lecture_pkg.ngram against float64 brute force: dictionaries of n-gram counts and the
textbook recursions, written out again here, on tiny texts."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lecture_pkg.ngram import (
    AddK,
    KneserNey,
    ModifiedKneserNey,
    tune_order,
    window_positions,
)


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


# ----- modified Kneser-Ney -----

def _mkn_reference(ids: list[int], order: int, vocab: int,
                   discounts: tuple[float, float, float] | None):
    """Modified Kneser-Ney, recursive, one probability at a time, with Chen & Goodman's
    discounts from the count-of-counts (KenLM's fallback 0.5, 1, 1.5 where they fail)."""
    tables = []
    for m in range(1, order + 1):
        if m == order:
            tables.append(_counts(ids, m))
        else:
            tables.append(Counter(g[1:] for g in _counts(ids, m + 1)))

    def estimate(table: Counter) -> tuple[float, float, float]:
        n = [list(table.values()).count(k) for k in range(5)]
        if 0 in n[1:4]:
            return (0.5, 1.0, 1.5)
        y = n[1] / (n[1] + 2 * n[2])
        d = (1 - 2 * y * n[2] / n[1], 2 - 3 * y * n[3] / n[2], 3 - 4 * y * n[4] / n[3])
        return d if all(0 < dk <= k for k, dk in enumerate(d, 1)) else (0.5, 1.0, 1.5)

    all_discounts = [discounts or estimate(table) for table in tables]

    def prob(w: int, h: tuple[int, ...]) -> float:
        m = len(h) + 1
        lower = prob(w, h[1:]) if h else 1.0 / vocab
        table, d = tables[m - 1], (0.0, *all_discounts[m - 1])
        row = [table[h + (v,)] for v in range(vocab)]
        if sum(row) == 0:
            return lower
        gamma = sum(d[min(c, 3)] for c in row)
        return (row[w] - d[min(row[w], 3)] + gamma * lower) / sum(row)

    return prob, all_discounts


LONG = np.random.default_rng(0).choice(4, size=400, p=[0.4, 0.3, 0.2, 0.1]).tolist()


@pytest.mark.parametrize("order,discounts", [(1, None), (2, None), (3, None), (4, None),
                                             (3, (0.4, 0.9, 1.3))])
@pytest.mark.parametrize("text", ["short", "long"])
def test_modified_kneser_ney_equals_the_recursion(order: int, discounts, text: str) -> None:
    train = TRAIN if text == "short" else LONG
    lm = ModifiedKneserNey(order, discounts).fit(train, VOCAB)
    reference, expected_discounts = _mkn_reference(train, order, VOCAB, discounts)
    np.testing.assert_allclose(lm.discounts, expected_discounts, rtol=1e-12)
    for context in itertools.product(range(VOCAB), repeat=order - 1):  # seen and unseen
        dist = lm.distribution(context)
        np.testing.assert_allclose(dist, [reference(w, context) for w in range(VOCAB)],
                                   rtol=1e-12)
        assert dist.sum() == pytest.approx(1.0, abs=1e-12)
        assert (dist > 0).all()
    positions = np.arange(len(HELD_OUT))
    expected = [np.log(reference(HELD_OUT[i], tuple(HELD_OUT[max(0, i - order + 1):i])))
                for i in positions]
    np.testing.assert_allclose(lm.log_probs(HELD_OUT, positions), expected, rtol=1e-12)


def test_modified_discounts_are_estimated_where_defined_and_fall_back_elsewhere() -> None:
    lm = ModifiedKneserNey(4).fit(LONG, VOCAB)
    assert ModifiedKneserNey.FALLBACK in lm.discounts  # the unigrams: too few types
    estimated = [d for d in lm.discounts if d != ModifiedKneserNey.FALLBACK]
    assert estimated and all(0 < d1 < d2 < d3 <= 3 for d1, d2, d3 in estimated)


@pytest.mark.parametrize("order", [1, 2, 3, 5])
@pytest.mark.parametrize("d", [0.3, 0.75])
def test_modified_kneser_ney_with_equal_discounts_is_kneser_ney(order: int, d: float) -> None:
    for train in (TRAIN, LONG):
        modified = ModifiedKneserNey(order, (d, d, d)).fit(train, VOCAB)
        plain = KneserNey(order, d).fit(train, VOCAB)
        for context in [(), (1,), (4,), (0, 1), (2, 4, 4), (1, 2, 0, 1)]:
            np.testing.assert_allclose(modified.distribution(context),
                                       plain.distribution(context), rtol=1e-12)
        positions = np.arange(len(HELD_OUT))
        np.testing.assert_allclose(modified.log_probs(HELD_OUT, positions),
                                   plain.log_probs(HELD_OUT, positions), rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(train=st.lists(st.integers(0, 3), min_size=1, max_size=80),
       order=st.integers(1, 5), context=st.lists(st.integers(0, 4), max_size=5))
def test_modified_kneser_ney_distributions_sum_to_one(train: list[int], order: int,
                                                       context: list[int]) -> None:
    dist = ModifiedKneserNey(order).fit(train, VOCAB).distribution(context)
    assert dist.sum() == pytest.approx(1.0, abs=1e-12)
    assert (dist > 0).all()


@pytest.mark.parametrize("cls", [KneserNey, ModifiedKneserNey])
def test_a_text_shorter_than_the_order_is_counted(cls) -> None:
    lm = cls(5).fit([0, 0, 0], VOCAB)  # no 4- or 5-grams: the lower orders speak
    np.testing.assert_allclose(lm.distribution([0, 0, 0, 0]), lm.distribution([0, 0]),
                               rtol=1e-12)
    assert lm.distribution([1, 2]).sum() == pytest.approx(1.0, abs=1e-12)


def test_modified_kneser_ney_argument_checks() -> None:
    with pytest.raises(ValueError, match="order must be positive"):
        ModifiedKneserNey(0)
    with pytest.raises(TypeError, match="order must be an int"):
        ModifiedKneserNey(2.0)
    with pytest.raises(ValueError, match="ids must not be empty"):
        ModifiedKneserNey(2).fit([], VOCAB)
    with pytest.raises(ValueError, match="ids must lie"):
        ModifiedKneserNey(2).fit([0, 1, 5], VOCAB)
    with pytest.raises(ValueError, match="ids must lie"):
        ModifiedKneserNey(2).fit([0, -1], VOCAB)
    with pytest.raises(ValueError, match="ids must lie"):
        ModifiedKneserNey(2).fit(TRAIN, VOCAB).log_probs([0, 9], [1])
    with pytest.raises(ValueError, match="discounts"):
        ModifiedKneserNey(2, (0.5, 2.5, 1.0))
    with pytest.raises(ValueError, match="discounts"):
        ModifiedKneserNey(2, (0.5, 1.0))
    with pytest.raises(ValueError, match="vocab_size must be positive"):
        ModifiedKneserNey(2).fit([0], 0)


# ----- scoring within windows -----

@pytest.mark.parametrize("lm", [KneserNey(3), ModifiedKneserNey(4), AddK(2, 0.5)],
                         ids=["kn3", "mkn4", "add-k2"])
def test_window_losses_cut_the_context_at_the_window_start(lm) -> None:
    lm.fit(LONG, VOCAB)
    text = LONG[::-1][:60]
    starts, length = [0, 7, 30, 52], 8
    losses = lm.window_losses(text, starts, length)
    assert losses.shape == (4, length)
    for row, s in zip(losses, starts):
        window = text[s:s + length]
        expected = [-np.log(lm.distribution(window[:t])[window[t]]) for t in range(length)]
        np.testing.assert_allclose(row, expected, rtol=1e-12)
        # position 0: the lowest order's prediction, whatever came before the window
        assert row[0] == pytest.approx(-np.log(lm.distribution([])[window[0]]), rel=1e-12)
        # the window scored as a text of its own
        np.testing.assert_allclose(row, -lm.log_probs(window, np.arange(length)), rtol=1e-12)
    # past order - 1 tokens the window start no longer matters
    positions = np.asarray(starts)[:, None] + np.arange(length)
    full = -lm.log_probs(text, positions.ravel()).reshape(positions.shape)
    np.testing.assert_allclose(losses[:, lm.order - 1:], full[:, lm.order - 1:], rtol=1e-12)
    assert not np.allclose(losses[1:, 0], full[1:, 0])


def test_window_losses_argument_checks() -> None:
    lm = KneserNey(2).fit(TRAIN, VOCAB)
    with pytest.raises(ValueError, match="starts"):
        lm.window_losses(HELD_OUT, [5], 7)  # 5 + 7 > 11
    with pytest.raises(ValueError, match="starts"):
        lm.window_losses(HELD_OUT, [-1], 3)
    with pytest.raises(ValueError, match="length must be positive"):
        lm.window_losses(HELD_OUT, [0], 0)
    with pytest.raises(RuntimeError, match="fit"):
        KneserNey(2).window_losses(HELD_OUT, [0], 3)


# ----- the order, tuned on validation -----

def _order3_chain(n: int, seed: int, vocab: int = 6, noise: float = 0.1) -> np.ndarray:
    """x_t = (x_{t-1} + 2 x_{t-2} + 1) mod vocab, replaced by a uniform token with
    probability ``noise``: an order-3 source (two tokens of context)."""
    rng = np.random.default_rng(seed)
    x = list(rng.integers(0, vocab, size=2))
    for _ in range(n - 2):
        x.append((x[-1] + 2 * x[-2] + 1) % vocab if rng.random() > noise
                 else int(rng.integers(vocab)))
    return np.asarray(x)


@pytest.mark.parametrize("window", [None, 32])
@pytest.mark.parametrize("make", [ModifiedKneserNey, KneserNey, lambda n: AddK(n, 0.1)],
                         ids=["mkn", "kn", "add-k"])
def test_tune_order_finds_the_order_of_a_markov_chain(make, window: int | None) -> None:
    train, validation = _order3_chain(20_000, seed=0), _order3_chain(4_000, seed=1)
    search = tune_order(make, train, validation, 6, orders=range(1, 8), window=window)
    assert sorted(search.scores) == list(range(1, 8))
    assert search.best_order >= 3
    assert search.model.order == search.best_order
    assert search.scores[search.best_order] == min(search.scores.values())
    assert search.scores[3] < search.scores[2] - 0.5  # the third token of context pays
    # the recorded scores are the validation losses of freshly fitted models
    expected = make(2).fit(train, 6)
    if window is None:
        score = expected.nats_per_token(validation, np.arange(1, len(validation)))
    else:
        starts = np.arange(0, len(validation) - window + 1, window)
        score = expected.window_losses(validation, starts, window)[:, 1:].mean()
    assert search.scores[2] == pytest.approx(score, rel=1e-12)


def test_tune_order_argument_checks() -> None:
    with pytest.raises(ValueError, match="orders must name"):
        tune_order(KneserNey, TRAIN, HELD_OUT, VOCAB, orders=[])
    with pytest.raises(ValueError, match="orders must be positive"):
        tune_order(KneserNey, TRAIN, HELD_OUT, VOCAB, orders=[0, 1])
    with pytest.raises(ValueError, match="fewer than one window"):
        tune_order(KneserNey, TRAIN, HELD_OUT, VOCAB, window=12)


@pytest.mark.parametrize("cls", [AddK, KneserNey, ModifiedKneserNey])
@pytest.mark.parametrize("order", [1, 2, 4])
def test_fill_in_scores_equal_substituting_every_candidate(cls, order: int) -> None:
    """Each candidate w written into a copy of the text, then the log-probabilities of the
    token at i and of the next right[i] tokens summed with log_probs: the same scores."""
    rng = np.random.default_rng(order)
    vocab = 5
    train = rng.integers(0, vocab, 400).tolist()
    lm = cls(order).fit(train, vocab)
    text = rng.integers(0, vocab, 40)
    positions, right = np.array([0, 3, 10, 17, 30]), np.array([2, 0, 1, 3, 5])
    scores = lm.fill_in_scores(text, positions, right=right)
    for row, (i, r) in enumerate(zip(positions, right)):
        for w in range(vocab):
            filled = text.copy()
            filled[i] = w
            expected = lm.log_probs(filled, np.arange(i, i + min(r, order - 1) + 1)).sum()
            assert scores[row, w] == pytest.approx(expected, abs=1e-12)


def test_fill_in_scores_cut_the_history_as_a_window_does() -> None:
    rng = np.random.default_rng(0)
    lm = ModifiedKneserNey(4).fit(rng.integers(0, 6, 500), 6)
    text = rng.integers(0, 6, 30)
    cut = lm.fill_in_scores(text, [12], history=[1], right=[2])
    # the same position in a text that starts one token before it
    np.testing.assert_allclose(cut, lm.fill_in_scores(text[11:], [1], right=[2]), rtol=1e-12)
    assert not np.allclose(cut, lm.fill_in_scores(text, [12], right=[2]))


def test_fill_in_scores_without_right_context_are_next_token_distributions() -> None:
    lm = ModifiedKneserNey(3).fit(np.arange(60) % 7, 7)
    scores = lm.fill_in_scores([1, 2, 3, 4], [2, 3])
    np.testing.assert_allclose(np.exp(scores).sum(1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(np.exp(scores[1]), lm.distribution([1, 2, 3]), rtol=1e-12)


def test_fill_in_scores_argument_checks() -> None:
    lm = KneserNey(3).fit([0, 1, 2, 0, 1, 2], 3)
    with pytest.raises(ValueError, match="positions"):
        lm.fill_in_scores([0, 1, 2], [2], right=[1])  # reads past the end
    with pytest.raises(ValueError, match="right"):
        lm.fill_in_scores([0, 1, 2], [1], right=[1, 1])
    with pytest.raises(ValueError, match="history"):
        lm.fill_in_scores([0, 1, 2], [1], history=[2])
    with pytest.raises(RuntimeError, match="fit"):
        KneserNey(2).fill_in_scores([0, 1], [1])
