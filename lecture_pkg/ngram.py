"""Character (or any token) n-gram language models: the baselines a neural LM must beat.

- :class:`AddK`: order-n counts with add-k smoothing (order 1 = unigram, order 2 = bigram),
  P(w | h) = (c(h w) + k) / (c(h) + k V).
- :class:`KneserNey`: interpolated Kneser-Ney (Kneser & Ney 1995; Chen & Goodman 1998). The
  highest order uses counts, every lower order *continuation* counts N1+(. h w) (how many
  different tokens precede h w), and each order hands a discounted share of its mass down:

      P_m(w | h) = [max(c_m(h w) - D_m, 0) + D_m T_m(h) P_{m-1}(w | h')] / C_m(h)

  with C_m(h) = sum_w c_m(h w), T_m(h) = #{w : c_m(h w) > 0}, h' = h without its oldest token,
  and P_0 = 1 / V (uniform), so every token of the vocabulary keeps some probability. A context
  never seen (C_m(h) = 0) falls back to P_{m-1}. D_m defaults to Ney's n1 / (n1 + 2 n2) from
  the count-of-counts of that order (1/2 when that order has no singletons).
- :class:`ModifiedKneserNey`: the same with three discounts per order, for n-grams seen once,
  twice and three or more times (Chen & Goodman 1998), the strongest of the count models.
- :func:`tune_order`: the order picked on validation data, with every order's score.

Everything is vectorised with numpy: an n-gram is an integer code (the newest token least
significant, base V), counts are sorted unique codes, and a lookup is a ``searchsorted``.

Usage: ``lm = KneserNey(5).fit(train_ids, vocab_size)``; ``lm.nats_per_token(ids, positions)``
is the mean of -ln P(ids[i] | ids[i-n+1 : i]) over the positions (each predicted from the
tokens before it in ``ids``); ``lm.window_losses(ids, starts, length)`` scores windows as a GPT
does, each token from the tokens before it *in its window* only; ``lm.distribution(context)`` is
the (V,) next-token distribution; ``lm.fill_in_scores(ids, positions, history, right)`` scores
every candidate for a missing token from the tokens on both sides of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from lecture_pkg.checks import check_int

__all__ = ["AddK", "KneserNey", "ModifiedKneserNey", "NGramLM", "OrderSearch", "tune_order",
           "window_positions"]


def window_positions(starts: Sequence[int], length: int) -> np.ndarray:
    """The positions a model scores in windows ``ids[s : s + length]``: s + 1 .. s + length - 1
    (the first token of each window has nothing before it in the window)."""
    check_int("length", length, minimum=2)
    return (np.asarray(starts, dtype=np.int64)[:, None] + np.arange(1, length)).ravel()


class _Counts:
    """Sorted unique codes with their counts, and per-context totals and type counts."""

    def __init__(self, codes: np.ndarray, counts: np.ndarray, vocab_size: int) -> None:
        self.codes, self.counts = codes, counts
        contexts, first = np.unique(codes // vocab_size, return_index=True)
        self.contexts = contexts
        self.totals = np.add.reduceat(counts, first) if len(codes) else counts
        self.types = np.diff(np.append(first, len(codes)))

    @staticmethod
    def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
        index = np.searchsorted(keys, query).clip(max=max(len(keys) - 1, 0))
        if not len(keys):
            return np.zeros(query.shape, dtype=np.int64)
        return np.where(keys[index] == query, values[index], 0)

    def count(self, query: np.ndarray) -> np.ndarray:
        return self._lookup(self.codes, self.counts, query)

    def context(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (self._lookup(self.contexts, self.totals, query),
                self._lookup(self.contexts, self.types, query))


class NGramLM:
    """Shared machinery: fitting counts of every order up to ``order``, and scoring."""

    def __init__(self, order: int) -> None:
        self.order = check_int("order", order, minimum=1)
        self.vocab_size = 0

    def fit(self, ids: Sequence[int] | np.ndarray, vocab_size: int) -> NGramLM:
        """Count the n-grams of ``ids`` (a 1-D sequence of ints in [0, vocab_size))."""
        check_int("vocab_size", vocab_size, minimum=1)
        if float(vocab_size) ** self.order >= 2.0 ** 62:
            raise ValueError(f"vocab_size ** order = {vocab_size}**{self.order} overflows int64")
        if not np.size(ids):
            raise ValueError("ids must not be empty: there is nothing to count")
        ids = self._check_ids(ids, vocab_size)
        self.vocab_size = vocab_size
        self.raw = [self._unique(self._codes(ids, m)) for m in range(1, self.order + 1)]
        self._build()
        return self

    def _fit_from(self, other: NGramLM) -> NGramLM:
        """Fit from the counts of ``other``, fitted with an order at least this one: the same
        model as ``fit`` on other's ids, without counting them again."""
        if not other.vocab_size or other.order < self.order:
            raise ValueError(f"other must be fitted with an order >= {self.order}")
        self.vocab_size, self.raw = other.vocab_size, other.raw[: self.order]
        self._build()
        return self

    def _build(self) -> None:
        raise NotImplementedError

    def _check_ids(self, ids: Sequence[int] | np.ndarray, vocab_size: int) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ids must be a 1-D integer sequence, got shape {ids.shape} "
                             f"dtype {ids.dtype}")
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"ids must lie in [0, {vocab_size})")
        return ids.astype(np.int64)

    def _codes(self, ids: np.ndarray, m: int) -> np.ndarray:
        """Codes of every m-gram of ids (newest token least significant)."""
        n = max(len(ids) - m + 1, 0)  # none when the text is shorter than m
        code = np.zeros(n, dtype=np.int64)
        for j in range(m):  # token at offset j inside the m-gram, oldest first
            code = code * self.vocab_size + ids[j:j + n]
        return code

    @staticmethod
    def _unique(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        uniq, counts = np.unique(codes, return_counts=True)
        return uniq, counts.astype(np.int64)

    def _probs(self, contexts: list[np.ndarray], valid: list[np.ndarray],
               words: np.ndarray) -> np.ndarray:
        """P(word | context) for rows of queries; contexts[m - 1] holds the code of the m - 1
        tokens before each query (valid[m - 1] False where the text is too short)."""
        raise NotImplementedError

    def _queries(self, ids: np.ndarray, positions: np.ndarray, history: np.ndarray
                 ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Context codes of each order for the tokens at ``positions``, which have
        ``history`` tokens before them that may be read."""
        contexts, valid = [], []
        code = np.zeros(len(positions), dtype=np.int64)
        scale = 1
        for m in range(1, self.order + 1):  # context of m - 1 tokens
            contexts.append(code.copy())
            valid.append(history >= m - 1)
            if m < self.order:
                previous = ids[np.clip(positions - m, 0, None)]
                code = code + previous * scale
                scale *= self.vocab_size
        return contexts, valid

    def log_probs(self, ids: Sequence[int] | np.ndarray, positions: Sequence[int]
                  ) -> np.ndarray:
        """ln P(ids[i] | the up to order - 1 tokens before i) for each i in ``positions``."""
        if not self.vocab_size:
            raise RuntimeError("call fit first")
        ids = self._check_ids(ids, self.vocab_size)
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) and (positions.min() < 0 or positions.max() >= len(ids)):
            raise ValueError(f"positions must lie in [0, {len(ids)})")
        contexts, valid = self._queries(ids, positions, positions)
        return np.log(self._probs(contexts, valid, ids[positions]))

    def nats_per_token(self, ids: Sequence[int] | np.ndarray, positions: Sequence[int]
                       ) -> float:
        """Mean negative log-likelihood (nats) of the tokens at ``positions``."""
        return float(-self.log_probs(ids, positions).mean())

    def window_losses(self, ids: Sequence[int] | np.ndarray, starts: Sequence[int],
                      length: int) -> np.ndarray:
        """-ln P of every token of the windows ``ids[s : s + length]``, scored as a GPT scores
        them: the context is cut at the window's start, so position 0 gets the lowest order's
        prediction (no context) and position t at most t tokens. Returns (len(starts), length)
        nats; ``[:, 1:]`` are the positions a GPT predicts from its window."""
        if not self.vocab_size:
            raise RuntimeError("call fit first")
        ids = self._check_ids(ids, self.vocab_size)
        check_int("length", length, minimum=1)
        starts = np.asarray(starts, dtype=np.int64)
        if starts.ndim != 1 or (len(starts) and (starts.min() < 0
                                                 or starts.max() + length > len(ids))):
            raise ValueError(f"starts must be a 1-D sequence in [0, {len(ids) - length}] "
                             f"(windows of length {length} inside {len(ids)} ids)")
        offsets = np.tile(np.arange(length), len(starts))
        positions = np.repeat(starts, length) + offsets
        contexts, valid = self._queries(ids, positions, history=offsets)
        return -np.log(self._probs(contexts, valid, ids[positions])).reshape(-1, length)

    def distribution(self, context: Sequence[int]) -> np.ndarray:
        """The (V,) float64 distribution of the token after ``context`` (its last order - 1
        tokens count)."""
        context = list(context)
        scores = self.fill_in_scores(context + [0], [len(context)])
        return np.exp(scores[0])

    def fill_in_scores(self, ids: Sequence[int] | np.ndarray, positions: Sequence[int],
                       history: Sequence[int] | None = None,
                       right: Sequence[int] | None = None) -> np.ndarray:
        """(len(positions), V) log-scores of every token w as the token at each position i,
        whatever ``ids[i]`` holds:

            ln P(w | left) + sum_{j=1..right[i]} ln P(ids[i + j] | its context, w at i),

        which is ln P(w, ids[i+1 : i+right[i]+1] | left) under the model: its argmax is the
        model's best guess for one missing token, read from ``history[i]`` tokens before it
        (default: all, cut at the start of ``ids``) and ``right[i]`` tokens after it (default
        0: left context only, a row of next-token log-probabilities). Only the first
        order - 1 tokens after i have w in their context; more do not change the argmax."""
        if not self.vocab_size:
            raise RuntimeError("call fit first")
        ids = self._check_ids(ids, self.vocab_size)
        positions = np.asarray(positions, dtype=np.int64)
        if positions.ndim != 1:
            raise ValueError(f"positions must be 1-D, got shape {positions.shape}")
        n, vocab = len(positions), self.vocab_size
        history = positions if history is None else np.asarray(history, dtype=np.int64)
        right = np.zeros(n, np.int64) if right is None else np.asarray(right, dtype=np.int64)
        for name, value in (("history", history), ("right", right)):
            if value.shape != (n,) or (n and value.min() < 0):
                raise ValueError(f"{name} must hold one count >= 0 per position, got shape "
                                 f"{value.shape}")
        right = np.minimum(right, self.order - 1)
        if n and (positions.min() < 0 or (positions + right).max() >= len(ids)
                  or (history > positions).any()):
            raise ValueError(f"positions (with right tokens after them) must lie in "
                             f"[0, {len(ids)}), and history[i] <= positions[i]")
        words = np.tile(np.arange(vocab), n)
        scores = self._candidates(ids, positions, history, words, None).reshape(n, vocab)
        for j in range(1, int(right.max(initial=0)) + 1):
            use = right >= j  # ids[i + j] is read, with the candidate j tokens back
            at = positions[use]
            target = np.repeat(ids[at + j], vocab)
            logp = self._candidates(ids, at + j, history[use] + j, target, (j, words[:vocab]))
            scores[use] += logp.reshape(-1, vocab)
        return scores

    def _candidates(self, ids: np.ndarray, positions: np.ndarray, history: np.ndarray,
                    words: np.ndarray, swap: tuple[int, np.ndarray] | None) -> np.ndarray:
        """ln P(words) at each position repeated V times; with ``swap`` = (j, candidates),
        the token j places back is replaced by each candidate in turn."""
        vocab = self.vocab_size
        contexts, valid = self._queries(ids, positions, history)
        contexts = [np.repeat(c, vocab) for c in contexts]
        valid = [np.repeat(v, vocab) for v in valid]
        if swap is not None:
            j, candidates = swap
            old = np.repeat(ids[positions - j], vocab)
            new = np.tile(candidates, len(positions))
            for m in range(j + 1, self.order + 1):  # contexts of m - 1 >= j tokens hold it
                contexts[m - 1] = contexts[m - 1] + (new - old) * vocab ** (j - 1)
        return np.log(self._probs(contexts, valid, words))


class AddK(NGramLM):
    """Order-n counts with add-k smoothing: (c(h w) + k) / (c(h) + k V). A position with fewer
    than order - 1 tokens before it uses the longest context it has."""

    def __init__(self, order: int, k: float = 1.0) -> None:
        super().__init__(order)
        if not k > 0:
            raise ValueError(f"k must be positive, got {k}")
        self.k = float(k)

    def _build(self) -> None:
        self.tables = [_Counts(*raw, self.vocab_size) for raw in self.raw]

    def _probs(self, contexts: list[np.ndarray], valid: list[np.ndarray],
               words: np.ndarray) -> np.ndarray:
        probs = np.zeros(len(words))
        for m in range(1, self.order + 1):  # the longest valid context wins
            table, h = self.tables[m - 1], contexts[m - 1]
            total, _ = table.context(h)
            p = (table.count(h * self.vocab_size + words) + self.k) / (
                total + self.k * self.vocab_size)
            probs = np.where(valid[m - 1], p, probs)
        return probs


class KneserNey(NGramLM):
    """Interpolated Kneser-Ney of order n (see the module docstring). ``discount``: one D for
    every order, or None for Ney's estimate per order (stored in ``self.discounts``)."""

    def __init__(self, order: int, discount: float | None = None) -> None:
        super().__init__(order)
        if discount is not None and not 0 < discount < 1:
            raise ValueError(f"discount must be in (0, 1), got {discount}")
        self.discount = discount

    def _build(self) -> None:
        tables = []
        for m in range(1, self.order + 1):
            if m == self.order:
                codes, counts = self.raw[m - 1]
            else:  # continuation counts: distinct tokens before each m-gram
                codes, counts = self._unique(self.raw[m][0] % self.vocab_size ** m)
            tables.append(_Counts(codes, counts, self.vocab_size))
        self.tables = tables
        self.discounts = []
        for table in tables:
            n1, n2 = np.sum(table.counts == 1), np.sum(table.counts == 2)
            ney = n1 / (n1 + 2 * n2) if n1 else 0.5  # no singletons: a fixed 1/2
            self.discounts.append(self.discount if self.discount is not None else float(ney))

    def _removed(self, m: int, count: np.ndarray) -> np.ndarray:
        """The mass taken from each count c of order m: min(c, D_m)."""
        return np.minimum(count, self.discounts[m - 1])

    def _handed_down(self, m: int, h: np.ndarray, types: np.ndarray) -> np.ndarray:
        """The mass context h of order m hands to order m - 1: D_m T_m(h)."""
        return self.discounts[m - 1] * types

    def _probs(self, contexts: list[np.ndarray], valid: list[np.ndarray],
               words: np.ndarray) -> np.ndarray:
        probs = np.full(len(words), 1.0 / self.vocab_size)
        for m in range(1, self.order + 1):
            table, h = self.tables[m - 1], contexts[m - 1]
            total, types = table.context(h)
            count = table.count(h * self.vocab_size + words)
            seen = valid[m - 1] & (total > 0)
            mixed = (count - self._removed(m, count) + self._handed_down(m, h, types) * probs
                     ) / np.maximum(total, 1)
            probs = np.where(seen, mixed, probs)
        return probs


class ModifiedKneserNey(KneserNey):
    """Interpolated modified Kneser-Ney (Chen & Goodman 1998): KneserNey with three discounts per
    order, D1 for n-grams seen once, D2 twice, D3+ three times or more:

        P_m(w | h) = [c_m(h w) - D(c_m(h w)) + gamma_m(h) P_{m-1}(w | h')] / C_m(h),
        gamma_m(h) = D1 N1(h) + D2 N2(h) + D3+ N3+(h),

    N_k(h) = #{w : c_m(h w) = k} (N3+: >= 3), D(0) = 0, counts and the rest as in KneserNey.
    ``discounts``: one (D1, D2, D3+) for every order, each 0 < D_k <= k, or None for the
    estimate from that order's count-of-counts n1..n4:

        Y = n1 / (n1 + 2 n2), D1 = 1 - 2Y n2/n1, D2 = 2 - 3Y n3/n2, D3+ = 3 - 4Y n4/n3.

    Where the estimate is undefined (n1, n2 or n3 is 0) or out of range, that order falls back to
    (0.5, 1, 1.5), KenLM's ``--discount_fallback`` default. ``self.discounts`` holds the triple
    of each order, lowest first.
    """

    FALLBACK = (0.5, 1.0, 1.5)

    def __init__(self, order: int, discounts: Sequence[float] | None = None) -> None:
        NGramLM.__init__(self, order)
        if discounts is not None:
            discounts = tuple(float(d) for d in discounts)
            if len(discounts) != 3 or not _in_range(discounts):
                raise ValueError("discounts must be (D1, D2, D3+) with 0 < D_k <= k, "
                                 f"got {discounts}")
        self.discount = discounts

    def _build(self) -> None:
        super()._build()
        self.discounts = [self.discount or _estimate(table.counts) for table in self.tables]
        # gamma_m(h) of every context h of each table, aligned with table.contexts
        self.gammas = []
        for m, table in enumerate(self.tables, start=1):
            removed = self._removed(m, table.counts)
            starts = np.cumsum(table.types) - table.types
            self.gammas.append(np.add.reduceat(removed, starts) if len(removed) else removed)

    def _removed(self, m: int, count: np.ndarray) -> np.ndarray:
        """D(c) of order m for each count c: 0, D1, D2 or D3+."""
        return np.asarray((0.0, *self.discounts[m - 1]))[np.minimum(count, 3)]

    def _handed_down(self, m: int, h: np.ndarray, types: np.ndarray) -> np.ndarray:
        table = self.tables[m - 1]
        return _Counts._lookup(table.contexts, self.gammas[m - 1], h)


def _in_range(discounts: tuple[float, ...]) -> bool:
    """0 < D_k <= k for each k: every count keeps a non-negative share, every seen context
    hands some mass down."""
    return all(0 < d <= k for k, d in enumerate(discounts, start=1))


def _estimate(counts: np.ndarray) -> tuple[float, float, float]:
    """Chen & Goodman's (D1, D2, D3+) from the count-of-counts n1..n4 of one order, or
    ModifiedKneserNey.FALLBACK where that is undefined or out of range."""
    n1, n2, n3, n4 = (float(np.sum(counts == k)) for k in (1, 2, 3, 4))
    if not (n1 and n2 and n3):
        return ModifiedKneserNey.FALLBACK
    y = n1 / (n1 + 2 * n2)
    discounts = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    return discounts if _in_range(discounts) else ModifiedKneserNey.FALLBACK


@dataclass
class OrderSearch:
    """The result of :func:`tune_order`: ``scores`` maps each order tried to its validation
    nats per token; ``model`` is the model of ``best_order``, fitted on the training ids."""

    best_order: int
    scores: dict[int, float]
    model: NGramLM


def tune_order(make: Callable[[int], NGramLM], train: Sequence[int] | np.ndarray,
               validation: Sequence[int] | np.ndarray, vocab_size: int,
               orders: Iterable[int] = range(1, 11), window: int | None = None) -> OrderSearch:
    """Fit ``make(order)`` on ``train`` for each of ``orders`` and keep the order with the lowest
    validation loss (the lowest order on a tie). No test data goes in: evaluate the returned
    model on the test set once, afterwards.

    ``make``: an order -> unfitted model, e.g. ``ModifiedKneserNey`` or
    ``lambda n: KneserNey(n, 0.75)``. Scoring: with ``window`` None every validation token
    after the first, each from the tokens before it; with ``window`` = L, consecutive windows
    of L validation tokens scored as a GPT scores them (:meth:`NGramLM.window_losses`,
    positions 1 .. L - 1).
    """
    orders = sorted({check_int("orders", order, minimum=1) for order in orders})
    if not orders:
        raise ValueError("orders must name at least one order")
    validation = np.asarray(validation)
    if window is not None and check_int("window", window, minimum=2) > len(validation):
        raise ValueError(f"validation has {len(validation)} ids, fewer than one window of "
                         f"{window}")
    scores: dict[int, float] = {}
    best: NGramLM | None = None
    counted = make(orders[-1]).fit(train, vocab_size)  # every order's n-grams, counted once
    for order in orders:
        model = counted if order == counted.order else make(order)._fit_from(counted)
        scores[order] = _validation_loss(model, validation, window)
        if best is None or scores[order] < scores[best.order]:
            best = model
    assert best is not None
    return OrderSearch(best.order, scores, best)


def _validation_loss(model: NGramLM, validation: np.ndarray, window: int | None) -> float:
    """Nats per token of ``validation`` under ``model``, as :func:`tune_order` scores it."""
    if window is None:
        return model.nats_per_token(validation, np.arange(1, len(validation)))
    starts = np.arange(0, len(validation) - window + 1, window)
    return float(model.window_losses(validation, starts, window)[:, 1:].mean())
