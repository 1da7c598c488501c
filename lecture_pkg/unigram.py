"""The Unigram language-model tokenizer (Kudo, 2018), as SentencePiece trains it for T5.

A vocabulary of pieces, each with a log-probability log p(x). A word is segmented into the pieces
x_1 .. x_k that maximise sum log p(x_i), found by dynamic programming over the word's characters
(Viterbi: :meth:`Unigram.encode_word`). There are no merges: a piece is used because it makes the
whole segmentation likely, not because of the order it was learned in.

**Pre-tokenization** (SentencePiece's): spaces become ``▁`` and every word starts with one, so
``"the cat"`` is ``▁the ▁cat`` and decoding just turns ``▁`` back into spaces.

**Training** (:meth:`Unigram.train`) runs the other way round from BPE: start from a large seed
vocabulary (every character and the frequent substrings), then alternate

1. EM: the E-step computes, with the forward-backward algorithm over every word's segmentation
   lattice, the expected number of times each piece is used; the M-step sets
   p(x) = expected count / total. Each iteration cannot lower the corpus log-likelihood.
2. Pruning: for each piece, the loss of likelihood if it were removed (its Viterbi uses times the
   log-probability lost by spelling it with the best other pieces); keep the most useful
   ``shrink`` share. Single characters are always kept, so every word stays spellable.

until ``vocab_size`` pieces are left. A character never seen in training is ``<unk>``, and
consecutive unknown characters make one ``<unk>``, as in HuggingFace ``tokenizers``; with
``byte_fallback=True`` (SentencePiece's option, used by Llama 1/2) they become the pieces of their
UTF-8 bytes instead, ``<0xE6>`` ..., so nothing is unknown. Special
tokens (T5's ``<pad>``, ``</s>``, ``<unk>``) take the first ids and are never split.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from lecture_pkg.bpe import (
    check_special_tokens,
    check_token_ids,
    segment_with_special_tokens,
    split_on_special_tokens,
)
from lecture_pkg.checks import check_int

__all__ = ["SPACE", "T5_SPECIAL_TOKENS", "Unigram", "byte_piece", "metaspace_pretokenize"]

SPACE = "\u2581"   # ▁, SentencePiece's visible space
T5_SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")
UNK_PENALTY = 10.0   # an unknown character scores 10 below the least likely piece (as HF)


def metaspace_pretokenize(text: str) -> list[str]:
    """Spaces to ``▁``, a ``▁`` in front, then one word per ``▁`` (HF's ``Metaspace``)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text:
        return []
    text = text.replace(" ", SPACE)
    if not text.startswith(SPACE):
        text = SPACE + text
    return re.findall(f"{SPACE}[^{SPACE}]*", text)


def byte_piece(byte: int) -> str:
    """SentencePiece's name for the byte-fallback piece of ``byte``: ``<0xE6>``."""
    return f"<0x{byte:02X}>"


_BYTE_PIECES = {byte_piece(b): b for b in range(256)}


def _logsumexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    hi, lo = (a, b) if a > b else (b, a)
    return hi + math.log1p(math.exp(lo - hi))


class Unigram:
    """Unigram-LM tokenizer: Viterbi segmentation over pieces with log-probabilities.

    >>> lm = Unigram({"▁": -2.0, "▁un": -3.0, "un": -4.0, "able": -3.5, "u": -6.0, "n": -6.0})
    >>> lm.tokens("unable")
    ['▁un', 'able']
    """

    def __init__(self, pieces: dict[str, float] | Iterable[tuple[str, float]],
                 unk_token: str = "<unk>", *, special_tokens: Iterable[str] = (),
                 byte_fallback: bool = False) -> None:
        """pieces: piece -> log-probability (ordinary pieces, in id order after the special
        tokens); unk_token: stands for unknown characters, added to special_tokens if absent;
        byte_fallback: as SentencePiece for Llama 1/2, the 256 pieces ``<0x00>`` .. ``<0xFF>``
        (score 0, as in Llama's vocabulary) follow the special tokens, and a run of unknown
        characters becomes the pieces of its UTF-8 bytes instead of ``unk_token``."""
        if not isinstance(byte_fallback, bool):
            raise TypeError(f"byte_fallback must be a bool, got {byte_fallback!r}")
        self.byte_fallback = byte_fallback
        pieces = dict(pieces)
        if byte_fallback:
            pieces = {**{byte_piece(b): 0.0 for b in range(256)}, **pieces}
        for piece, score in pieces.items():
            if not isinstance(piece, str) or not piece:
                raise TypeError(f"pieces must be non-empty str, got {piece!r}")
            if not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score):
                raise ValueError(f"the log-probability of {piece!r} must be a finite number, got {score!r}")
        self.special_tokens = check_special_tokens(special_tokens)
        if unk_token not in self.special_tokens:
            self.special_tokens.append(unk_token)
        clash = [t for t in self.special_tokens if t in pieces]
        if clash:
            raise ValueError(f"special tokens {clash} are also ordinary pieces")
        self.unk_token = unk_token
        self.scores = {piece: float(score) for piece, score in pieces.items()}
        self.vocab = [*self.special_tokens, *self.scores]   # id -> token
        self._ids = {token: i for i, token in enumerate(self.vocab)}
        self._max_len = max(map(len, self.scores), default=1)
        # as HF: specials score 0, and an unknown character scores UNK_PENALTY below the minimum
        self._unk_score = min([0.0, *self.scores.values()]) - UNK_PENALTY

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    # ---------------------------------------------------------------- segmentation

    def encode_word(self, word: str) -> list[str]:
        """Viterbi: the pieces of ``word`` with the largest total log-probability (on a tie, the
        path whose last piece starts earliest, as HF). Unknown characters become one
        ``unk_token`` per run."""
        n = len(word)
        best = [0.0] + [-math.inf] * n                 # best[e]: best score of word[:e]
        back = [0] * (n + 1)                           # back[e]: start of the last piece
        for end in range(1, n + 1):
            for start in range(max(0, end - self._max_len), end):
                score = self.scores.get(word[start:end])
                if score is None and end - start == 1 and word[start] not in self.scores:
                    score = self._unk_score            # an unknown character, alone
                if score is not None and best[start] + score > best[end]:
                    best[end], back[end] = best[start] + score, start
        pieces: list[str] = []                         # backwards; None: unknown character
        unknown_run: list[str] = []
        end = n
        while end > 0:
            piece = word[back[end]:end]
            if piece not in self.scores:
                unknown_run.append(piece)              # runs of unknown characters: one unit
            else:
                if unknown_run:
                    pieces.extend(self._unknown(unknown_run))
                    unknown_run = []
                pieces.append(piece)
            end = back[end]
        if unknown_run:
            pieces.extend(self._unknown(unknown_run))
        return pieces[::-1]

    def _unknown(self, run_backwards: list[str]) -> list[str]:
        """The pieces (backwards) standing for a run of unknown characters (given backwards)."""
        if not self.byte_fallback:
            return [self.unk_token]
        return [byte_piece(b) for b in "".join(reversed(run_backwards)).encode("utf-8")][::-1]

    def tokens(self, text: str) -> list[str]:
        """The token strings of ``text``: special tokens whole, the rest pre-tokenized and
        segmented word by word."""
        return segment_with_special_tokens(text, self.special_tokens, metaspace_pretokenize, self.encode_word)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return [self._ids[token] for token in self.tokens(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """The pieces concatenated, ``▁`` turned back into spaces, the leading one dropped."""
        out = bytearray()
        for i in check_token_ids(ids, self.vocab_size):
            token = self.vocab[i]
            byte = _BYTE_PIECES.get(token) if self.byte_fallback else None
            out.extend(bytes([byte]) if byte is not None else token.encode("utf-8"))
        text = out.decode("utf-8", errors="replace")
        return text.replace(SPACE, " ").removeprefix(" ")

    # ---------------------------------------------------------------- training

    @staticmethod
    def expected_counts(words: dict[str, int], scores: dict[str, float],
                        max_len: int) -> tuple[dict[str, float], float]:
        """E-step: the expected uses of each piece over all segmentations of every word, each
        weighted by its probability (forward-backward), and the corpus log-likelihood
        sum_w f(w) log P(w). words: word -> frequency; every word must be spellable."""
        counts: dict[str, float] = defaultdict(float)
        log_likelihood = 0.0
        for word, freq in words.items():
            n = len(word)
            arcs = [(s, e, word[s:e]) for e in range(1, n + 1)
                    for s in range(max(0, e - max_len), e) if word[s:e] in scores]
            alpha = [0.0] + [-math.inf] * n       # log P(word[:e]), summed over segmentations
            for s, e, piece in arcs:              # arcs are sorted by end
                alpha[e] = _logsumexp(alpha[e], alpha[s] + scores[piece])
            beta = [-math.inf] * n + [0.0]        # log P(word[s:])
            for s, e, piece in reversed(arcs):
                beta[s] = _logsumexp(beta[s], scores[piece] + beta[e])
            log_likelihood += freq * alpha[n]
            for s, e, piece in arcs:
                counts[piece] += freq * math.exp(alpha[s] + scores[piece] + beta[e] - alpha[n])
        return dict(counts), log_likelihood

    @classmethod
    def train(cls, text: str, vocab_size: int,
              special_tokens: Sequence[str] = T5_SPECIAL_TOKENS, unk_token: str = "<unk>", *,
              max_piece_chars: int = 12, seed_factor: int = 4, shrink: float = 0.75,
              em_iterations: int = 2) -> Unigram:
        """Learn ``vocab_size`` tokens (special tokens included) on ``text``: seed with every
        character and the ``seed_factor`` x vocab_size substrings of at most ``max_piece_chars``
        characters with the largest frequency x length, then alternate ``em_iterations`` EM steps
        and pruning to a ``shrink`` share until the size is reached (see the module docstring)."""
        special_tokens = check_special_tokens(special_tokens)
        if unk_token not in special_tokens:
            special_tokens = [*special_tokens, unk_token]
        target = check_int("vocab_size", vocab_size, len(special_tokens) + 1) - len(special_tokens)
        check_int("max_piece_chars", max_piece_chars, 1)
        check_int("seed_factor", seed_factor, 1)
        check_int("em_iterations", em_iterations, 1)
        if not 0 < shrink < 1:
            raise ValueError(f"shrink must be in (0, 1), got {shrink}")
        words = Counter(w for chunk, special in split_on_special_tokens(text, special_tokens)
                        if not special for w in metaspace_pretokenize(chunk))
        chars = list(dict.fromkeys(c for w in words for c in w))
        substrings: Counter[str] = Counter()
        for word, freq in words.items():
            for s in range(len(word)):
                for e in range(s + 2, min(len(word), s + max_piece_chars) + 1):
                    substrings[word[s:e]] += freq
        seeds = sorted((x for x, f in substrings.items() if f > 1),
                       key=lambda x: -substrings[x] * len(x))[:seed_factor * vocab_size]
        frequency = {**{c: sum(f * w.count(c) for w, f in words.items()) for c in chars},
                     **{x: substrings[x] for x in seeds}}
        total = sum(frequency.values())
        scores = {x: math.log(f / total) for x, f in frequency.items()}
        while True:
            for _ in range(em_iterations):
                counts, _ = cls.expected_counts(words, scores, max_piece_chars)
                kept = {x: c for x, c in counts.items() if c > 0.5 or len(x) == 1}
                total = sum(kept.values())
                scores = {x: math.log(max(c, 1e-3) / total) for x, c in kept.items()}
            if len(scores) <= target:
                break
            keep = max(target, int(shrink * len(scores)))
            scores = cls._prune(words, scores, keep, unk_token)
        ordered = sorted(scores, key=lambda x: (len(x) > 1, -scores[x]))   # characters first
        return cls({x: scores[x] for x in ordered}, unk_token, special_tokens=special_tokens)

    @classmethod
    def _prune(cls, words: dict[str, int], scores: dict[str, float], keep: int,
               unk_token: str) -> dict[str, float]:
        """Keep the ``keep`` pieces whose removal would cost the most likelihood (every single
        character included)."""
        model = cls(scores, unk_token)
        uses: Counter[str] = Counter()
        for word, freq in words.items():
            for piece in model.encode_word(word):
                uses[piece] += freq
        loss = {}
        for piece, score in scores.items():
            if len(piece) == 1:
                loss[piece] = math.inf
                continue
            del model.scores[piece]                     # the best spelling without this piece
            spelled = sum(model.scores[x] for x in model.encode_word(piece))
            model.scores[piece] = score
            loss[piece] = uses[piece] * (score - spelled)
        kept = sorted(scores, key=lambda x: -loss[x])[:keep]
        return {x: scores[x] for x in kept}

    def to_hf_tokenizer(self) -> Any:
        """A ``tokenizers.Tokenizer`` that encodes every text to the same ids: ``Unigram`` model
        with these scores (special tokens at score 0), ``Metaspace`` pre-tokenizer and decoder,
        the special tokens added."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        vocab = [(t, 0.0) for t in self.special_tokens] + list(self.scores.items())
        tokenizer = Tokenizer(models.Unigram(vocab, unk_id=self._ids[self.unk_token],
                                             byte_fallback=self.byte_fallback))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")
        tokenizer.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
        tokenizer.add_special_tokens(self.special_tokens)
        return tokenizer

    def __repr__(self) -> str:
        return f"Unigram(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"
