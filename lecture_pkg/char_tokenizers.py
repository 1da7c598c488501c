"""The character and byte tokenizers of the book's shipped models, one class each.

* :class:`CharTokenizer` (the Shakespeare GPT, chapters 7.3 and 10): one id per character, then
  the special tokens of :data:`SPECIAL_TOKENS` (end of text, the chat roles, padding).
* :class:`MLMChars` (the character BERT, 7.1): the BERT special tokens of :data:`SPECIALS`
  (ids :data:`PAD`, :data:`UNK`, :data:`CLS`, :data:`SEP`, :data:`MASK`), then one id per
  character of the lower-cased text (:func:`normalise`).
* :class:`ByteTokenizer` (the byte T5, 7.7): ``<pad>``, ``</s>``, the 256 UTF-8 bytes, then
  T5's sentinels ``<extra_id_0>``, ....

Each has ``encode`` (text -> ids), ``decode`` (ids -> text), ``itos`` (the token of each id)
and ``vocab_size``. The subword tokenizers are :mod:`lecture_pkg.bpe`,
:mod:`lecture_pkg.wordpiece` and :mod:`lecture_pkg.unigram`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from lecture_pkg.checks import check_int
from lecture_pkg.masks import T5_SENTINELS

__all__ = ["CLS", "MASK", "PAD", "SEP", "SPECIALS", "SPECIAL_TOKENS", "UNK", "ByteTokenizer",
           "CharTokenizer", "MLMChars", "normalise"]

SPECIAL_TOKENS = ("<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>", "<|pad|>")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = range(len(SPECIALS))


def _check_chars(chars: list[str]) -> None:
    if any(not isinstance(c, str) or len(c) != 1 for c in chars):
        raise ValueError("chars must be single characters")


def _check_text(text: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")


class CharTokenizer:
    """One id per character, then one id per special token (in that order).

    ``encode`` turns every occurrence of a special token's text (``"<|user|>"``) into its id and
    every other character into its own id; a character outside the vocabulary raises ValueError.
    ``decode`` is the inverse: ``decode(encode(s)) == s``.
    """

    def __init__(self, chars: Iterable[str], special_tokens: Sequence[str] = SPECIAL_TOKENS):
        chars = list(chars)
        _check_chars(chars)
        if len(set(chars)) != len(chars) or len(set(special_tokens)) != len(special_tokens):
            raise ValueError("chars and special_tokens must not repeat")
        self.chars = chars
        self.itos = chars + list(special_tokens)
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.special_tokens = {s: len(chars) + i for i, s in enumerate(special_tokens)}
        longest_first = sorted(special_tokens, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") \
            if special_tokens else None

    @classmethod
    def from_text(cls, text: str, special_tokens: Sequence[str] = SPECIAL_TOKENS
                  ) -> CharTokenizer:
        """The sorted characters of ``text``, then the special tokens."""
        return cls(sorted(set(text)), special_tokens)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    @property
    def eos_id(self) -> int:
        return self.special_tokens["<|endoftext|>"]

    @property
    def pad_id(self) -> int:
        return self.special_tokens["<|pad|>"]

    def encode(self, text: str) -> list[int]:
        _check_text(text)
        pieces = self._split.split(text) if self._split else [text]
        ids: list[int] = []
        for piece in pieces:
            if piece in self.special_tokens:
                ids.append(self.special_tokens[piece])
                continue
            try:
                ids.extend(self.stoi[c] for c in piece)
            except KeyError as missing:
                raise ValueError(f"text holds {missing} outside the vocabulary") from None
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = list(ids)
        if any(not 0 <= int(i) < self.vocab_size for i in ids):
            raise ValueError(f"ids must be in [0, {self.vocab_size}), got {ids}")
        return "".join(self.itos[int(i)] for i in ids)


def normalise(text: str) -> str:
    """Lower-cased, with every run of blank lines collapsed into one line break."""
    return re.sub(r"\n\s*\n+", "\n", text.lower())


class MLMChars:
    """The special tokens, then one id per character. ``encode`` normalises the text (see
    :func:`normalise`) and maps characters outside the vocabulary to ``[UNK]``."""

    def __init__(self, chars: Iterable[str]) -> None:
        chars = list(chars)
        _check_chars(chars)
        if len(set(chars)) != len(chars):
            raise ValueError("chars must not repeat")
        self.chars = chars
        self.itos = list(SPECIALS) + chars
        self.stoi = {c: i for i, c in enumerate(self.itos) if i >= len(SPECIALS)}

    @classmethod
    def from_text(cls, text: str) -> MLMChars:
        """The sorted characters of the normalised ``text``."""
        return cls(sorted(set(normalise(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> Tensor:
        """(n,) int64 ids of the normalised text."""
        _check_text(text)
        return torch.tensor([self.stoi.get(c, UNK) for c in normalise(text)], dtype=torch.long)

    def decode(self, ids: Iterable[int]) -> str:
        """Characters as themselves, special tokens by name."""
        ids = [int(i) for i in ids]
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise ValueError(f"ids must be in [0, {self.vocab_size})")
        return "".join(self.itos[i] for i in ids)


class ByteTokenizer:
    """T5's layout over bytes: ``<pad>`` (id 0), ``</s>`` (id 1), the 256 bytes (ids 2 to 257),
    then ``num_sentinels`` sentinels. ``itos`` names a byte by itself when printable, ``␣`` for
    the space and ``xNN`` otherwise. ``encode`` gives the UTF-8 bytes shifted by 2; ``decode``
    joins the bytes back into text (invalid UTF-8 replaced) and writes other tokens by name."""

    pad_id, eos_id = 0, 1

    def __init__(self, num_sentinels: int = 16) -> None:
        check_int("num_sentinels", num_sentinels, minimum=0)
        if num_sentinels > len(T5_SENTINELS):
            raise ValueError(f"num_sentinels must be at most {len(T5_SENTINELS)}, got "
                             f"{num_sentinels}")
        names = [chr(b) if 32 < b < 127 else "␣" if b == 32 else f"x{b:02x}" for b in range(256)]
        self.itos = ["<pad>", "</s>", *names, *T5_SENTINELS[:num_sentinels]]
        self.sentinel_ids = list(range(len(self.itos) - num_sentinels, len(self.itos)))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        _check_text(text)
        return [b + 2 for b in text.encode("utf-8")]

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise ValueError(f"ids must be in [0, {self.vocab_size})")
        out, run = [], bytearray()
        for i in ids:
            if 2 <= i < 258:
                run.append(i - 2)
                continue
            out += [run.decode("utf-8", errors="replace"), self.itos[i]]
            run = bytearray()
        return "".join([*out, run.decode("utf-8", errors="replace")])
