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

Everything is vectorised with numpy: an n-gram is an integer code (the newest token least
significant, base V), counts are sorted unique codes, and a lookup is a ``searchsorted``.

Usage: ``lm = KneserNey(5).fit(train_ids, vocab_size)``; ``lm.nats_per_token(ids, positions)``
is the mean of -ln P(ids[i] | ids[i-n+1 : i]) over the positions (each predicted from the
tokens before it in ``ids``); ``lm.distribution(context)`` is the (V,) next-token distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lecture_pkg.checks import check_int

__all__ = ["AddK", "KneserNey", "NGramLM", "window_positions"]


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
        ids = self._check_ids(ids, vocab_size)
        self.vocab_size = vocab_size
        self.raw = [self._unique(self._codes(ids, m)) for m in range(1, self.order + 1)]
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
        n = len(ids) - m + 1
        code = np.zeros(max(n, 0), dtype=np.int64)
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

    def distribution(self, context: Sequence[int]) -> np.ndarray:
        """The (V,) float64 distribution of the token after ``context`` (its last order - 1
        tokens count)."""
        if not self.vocab_size:
            raise RuntimeError("call fit first")
        context = self._check_ids(list(context) + [0], self.vocab_size)
        ids = np.concatenate([np.repeat(context[None, :-1], self.vocab_size, 0),
                              np.arange(self.vocab_size)[:, None]], axis=1).ravel()
        positions = np.arange(1, self.vocab_size + 1) * len(context) - 1
        history = np.full(self.vocab_size, len(context) - 1)
        contexts, valid = self._queries(ids, positions, history)
        return self._probs(contexts, valid, ids[positions])


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

    def _probs(self, contexts: list[np.ndarray], valid: list[np.ndarray],
               words: np.ndarray) -> np.ndarray:
        probs = np.full(len(words), 1.0 / self.vocab_size)
        for m in range(1, self.order + 1):
            table, h, d = self.tables[m - 1], contexts[m - 1], self.discounts[m - 1]
            total, types = table.context(h)
            count = table.count(h * self.vocab_size + words)
            seen = valid[m - 1] & (total > 0)
            mixed = (np.maximum(count - d, 0) + d * types * probs) / np.maximum(total, 1)
            probs = np.where(seen, mixed, probs)
        return probs
