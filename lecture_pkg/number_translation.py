"""Chapter 6's translation task: English number words to German ("forty seven" -> "sieben und
vierzig"), whose units come before the tens, so a word-by-word translation gets every such
number wrong and a model must learn to reorder.

``num2words`` writes both languages; German, written as one word, is cut into its number words
by a longest match (:func:`german_tokens`), English at spaces and hyphens
(:func:`english_tokens`). Source and target share one vocabulary (``<pad>``, ``<bos>``,
``<eos>``, then the sorted words). The held-out set holds out whole endings: for each tens word
one units word (:data:`HELD_ENDINGS`: 27, 31, ...), in every hundred, so a held-out number asks
for the reordering rule on a tens-units pair never seen in training.

::

    task = NumberTranslation()
    train_src, train_tgt = task.encode(task.train_numbers)    # (n, SRC_LEN), (n, TGT_LEN)
    task.evaluate(model_outputs, test_tgt)                     # exact match and BLEU, in %
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from lecture_pkg.transformer import corpus_bleu

__all__ = ["BOS", "EOS", "HELD_ENDINGS", "PAD", "SRC_LEN", "TGT_LEN", "NumberTranslation",
           "english_tokens", "german_tokens", "strip"]

PAD, BOS, EOS = 0, 1, 2
SRC_LEN, TGT_LEN = 6, 7  # longest source 5 words + EOS; BOS + 5 pieces + EOS
HELD_ENDINGS = sorted(10 * t + (3 * t) % 9 + 1 for t in range(2, 10))


@functools.cache
def _german_pieces() -> list[str]:
    from num2words import num2words

    pieces = {num2words(n, lang="de") for n in [*range(1, 20), *range(20, 100, 10)]}
    return sorted(pieces | {"ein", "und", "hundert"}, key=len, reverse=True)


def german_tokens(text: str) -> list[str]:
    """A German number word cut into its parts, longest match first:
    ``"siebenundvierzig"`` -> ``["sieben", "und", "vierzig"]``."""
    tokens = []
    while text:
        piece = next(p for p in _german_pieces() if text.startswith(p))
        tokens.append(piece)
        text = text[len(piece):]
    return tokens


def english_tokens(text: str) -> list[str]:
    """English number words split at spaces and hyphens, commas dropped."""
    return text.replace(",", "").replace("-", " ").split()


def strip(ids: Sequence[int]) -> list[int]:
    """Drop BOS/PAD and everything from EOS on."""
    out = []
    for i in ids:
        if i == EOS:
            break
        if i not in (PAD, BOS):
            out.append(i)
    return out


class NumberTranslation:
    """The task over ``numbers`` (default 1 to 999): ``pairs[n]`` (English tokens, German
    tokens), the shared ``vocab`` and its ``index``, and the split by ending into
    ``train_numbers`` and ``test_numbers`` (``held_endings`` held out)."""

    def __init__(self, numbers: Sequence[int] = range(1, 1000),
                 held_endings: Sequence[int] = HELD_ENDINGS) -> None:
        from num2words import num2words

        self.numbers, self.held_endings = numbers, list(held_endings)
        self.pairs = {n: (english_tokens(num2words(n)), german_tokens(num2words(n, lang="de")))
                      for n in numbers}
        self.vocab = ["<pad>", "<bos>", "<eos>"] + sorted(
            {t for e, g in self.pairs.values() for t in e + g})
        self.index = {token: i for i, token in enumerate(self.vocab)}
        self.test_numbers = [n for n in numbers if n % 100 in self.held_endings]
        self.train_numbers = [n for n in numbers if n % 100 not in self.held_endings]

    def to_ids(self, tokens: Sequence[str], length: int, bos: bool = False) -> list[int]:
        """``tokens`` as ids, after BOS if ``bos``, then EOS, padded to ``length``."""
        ids = [BOS] * bos + [self.index[t] for t in tokens] + [EOS]
        return ids + [PAD] * (length - len(ids))

    def encode(self, ns: Sequence[int]) -> tuple[Tensor, Tensor]:
        """Sources (len(ns), SRC_LEN) and targets (len(ns), TGT_LEN, starting with BOS)."""
        src = torch.tensor([self.to_ids(self.pairs[n][0], SRC_LEN) for n in ns])
        tgt = torch.tensor([self.to_ids(self.pairs[n][1], TGT_LEN, bos=True) for n in ns])
        return src, tgt

    @staticmethod
    def evaluate(outputs: Tensor, tgt: Tensor) -> dict[str, float]:
        """Exact match (%) and unsmoothed corpus BLEU of output ids against target ids, both
        (n, t), each stripped by :func:`strip`."""
        hyps = [strip(row) for row in outputs.tolist()]
        refs = [strip(row) for row in tgt.tolist()]
        exact_match = sum(h == r for h, r in zip(hyps, refs)) / len(refs)
        return {"exact match": 100 * exact_match, "BLEU": corpus_bleu(hyps, refs)}
