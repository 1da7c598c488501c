"""WordPiece (BERT): a vocabulary of word starts and ``##``-marked word continuations.

**Pre-tokenization** (BERT's): split on whitespace, and make every punctuation character a word of
its own (:func:`bert_pretokenize`).

**Encoding** is greedy, longest match first (:meth:`WordPiece.encode_word`): take the longest
vocabulary entry that starts the word, then the longest ``##`` entry that continues it, and so on.
If some position cannot be continued, the *whole word* becomes ``[UNK]``, unlike BPE, which
always falls back to single symbols.

**Training** (:meth:`WordPiece.train`) starts from the characters (``##``-marked unless they start
a word) and, like BPE, merges adjacent pairs one at a time. Schuster and Nakajima (2012) choose the
merge that most increases the likelihood of the training data under a unigram model of the
symbols; Google never released that trainer. The default here, ``score="pmi"``, is the rule the
HuggingFace course gives for WordPiece: the pair maximising count(ab) / (count(a) count(b)), a
pointwise mutual information (its exponential, up to the constant N), which favours pairs of rare
symbols that always occur together, count-1 pairs first. It is *not* the likelihood gain.
``score="likelihood"`` merges by the exact gain of the unigram log-likelihood
L = sum_s c(s) log(c(s) / N) (:func:`likelihood_gain`), which grows with the pair's count:
roughly c(ab) times its log-ratio. Ties go to the pair seen first, as in :mod:`lecture_pkg.bpe`.
(HuggingFace's ``WordPieceTrainer`` trains with BPE's frequency rule instead; its encoder is the
same as ours, which the tests check.)

Special tokens (``[CLS]``, ``[SEP]``, ...) are matched in the raw text before anything else and
are never split; they take the first ids, ``[UNK]`` among them.
"""

from __future__ import annotations

import math
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lecture_pkg.bpe import (
    check_special_tokens,
    check_token_ids,
    merge_pair,
    pair_counts,
    segment_with_special_tokens,
    split_on_special_tokens,
)
from lecture_pkg.checks import check_int

__all__ = ["BERT_SPECIAL_TOKENS", "WordPiece", "bert_pretokenize", "is_bert_punctuation",
           "likelihood_gain", "merge_scores", "unigram_log_likelihood"]

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PREFIX = "##"   # marks a piece that continues a word


def is_bert_punctuation(char: str) -> bool:
    """BERT's punctuation: every ASCII symbol that is not a letter, digit or space (``$``, ``^``,
    `````, ``_`` included), and every character of a Unicode punctuation category."""
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


# Unicode White_Space (what BERT's pre-tokenizer splits on); str.isspace also holds for U+001C..1F
_SPACES = frozenset(chr(cp) for cp in range(sys.maxunicode + 1)
                    if chr(cp).isspace() and not 0x1C <= cp <= 0x1F)


def bert_pretokenize(text: str) -> list[str]:
    """Split ``text`` into words at whitespace, each punctuation character a word of its own."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    words: list[str] = []
    current: list[str] = []
    for char in text:
        if char in _SPACES or is_bert_punctuation(char):
            if current:
                words.append("".join(current))
                current = []
            if char not in _SPACES:
                words.append(char)
        else:
            current.append(char)
    if current:
        words.append("".join(current))
    return words


def _xlogx(x: float) -> float:
    return x * math.log(x) if x > 0 else 0.0


def unigram_log_likelihood(words: Sequence[Sequence[str]], counts: Sequence[int]) -> float:
    """L = sum over symbols s of c(s) log(c(s) / N): the log-likelihood, in nats, of the
    segmented corpus (each word's symbols, ``counts[i]`` times) under the unigram model whose
    probabilities are the symbols' relative frequencies (its maximum-likelihood fit)."""
    symbols: Counter[str] = Counter()
    for word, n in zip(words, counts, strict=True):
        for s in word:
            symbols[s] += n
    total = sum(symbols.values())
    return sum(_xlogx(c) for c in symbols.values()) - _xlogx(total)


def _merged(pair: tuple[str, str]) -> str:
    return pair[0] + pair[1].removeprefix(PREFIX)


def merge_scores(words: Sequence[Sequence[str]], counts: Sequence[int]
                 ) -> dict[tuple[str, str], tuple[int, float, float]]:
    """For every adjacent pair (a, b): ``(count, pmi_score, gain)``, where count is c(ab),
    pmi_score is c(ab) / (c(a) c(b)) (the HF course's WordPiece score) and gain is the exact
    change of :func:`unigram_log_likelihood` (nats) if every occurrence of the pair, left to
    right, were merged (:func:`likelihood_gain`)."""
    symbols: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()       # c(ab), overlapping occurrences
    replaced: Counter[tuple[str, str]] = Counter()    # merges made left to right (a a a: one)
    for word, n in zip(words, counts, strict=True):
        last: dict[tuple[str, str], int] = {}
        for i, s in enumerate(word):
            symbols[s] += n
            if i:
                pair = (word[i - 1], s)
                pairs[pair] += n
                if last.get(pair, -2) != i - 2:       # not overlapping the previous merge
                    replaced[pair] += n
                    last[pair] = i - 1
    total = sum(symbols.values())
    return {pair: (c, c / (symbols[pair[0]] * symbols[pair[1]]),
                   likelihood_gain(symbols, pair, replaced[pair], total))
            for pair, c in pairs.items()}


def likelihood_gain(symbol_counts: Mapping[str, int], pair: tuple[str, str], merges: int,
                    total: int | None = None) -> float:
    """The exact change of the unigram log-likelihood L = sum c log(c / N) when ``merges``
    occurrences of ``pair`` become one symbol: c(a) and c(b) drop by ``merges`` (by 2 ``merges``
    if a = b), the merged symbol gains ``merges`` (it may exist already), and N drops by
    ``merges``. symbol_counts: c(s) before the merge; total: N (their sum, if None)."""
    a, b = pair
    merged = _merged(pair)
    n = check_int("merges", merges, 0)
    before = dict(symbol_counts)
    after = dict(before)
    after[a] = after.get(a, 0) - n
    after[b] = after.get(b, 0) - n
    if min(after[a], after[b]) < 0:
        raise ValueError(f"merges={n} exceeds the counts of {pair!r} in symbol_counts")
    after[merged] = after.get(merged, 0) + n
    big_n = sum(before.values()) if total is None else total
    changed = {a, b, merged}
    return (sum(_xlogx(after[s]) - _xlogx(before.get(s, 0)) for s in changed)
            - (_xlogx(big_n - n) - _xlogx(big_n)))


class WordPiece:
    """BERT's WordPiece tokenizer: greedy longest-match encoding over a fixed vocabulary.

    >>> wp = WordPiece(["[UNK]", "un", "##aff", "##able", "##a"])
    >>> wp.tokens("unaffable unx")
    ['un', '##aff', '##able', '[UNK]']
    """

    def __init__(self, vocab: Iterable[str], unk_token: str = "[UNK]", *,
                 special_tokens: Iterable[str] = (), max_word_chars: int = 100) -> None:
        """vocab: the token strings in id order (``##`` marks continuations); unk_token: a vocab
        entry that stands for any word that cannot be spelled; special_tokens: vocab entries
        matched whole in the text (unk_token is always one); max_word_chars: longer words are
        ``[UNK]`` at once, as in BERT."""
        self.vocab = list(vocab)
        if not all(isinstance(t, str) and t for t in self.vocab):
            raise TypeError("vocab must hold non-empty str tokens")
        self._ids = {token: i for i, token in enumerate(self.vocab)}
        if len(self._ids) != len(self.vocab):
            raise ValueError("vocab has duplicate tokens")
        self.special_tokens = check_special_tokens(special_tokens)
        if unk_token not in self.special_tokens:
            self.special_tokens.insert(0, unk_token)
        missing = [t for t in self.special_tokens if t not in self._ids]
        if missing:
            raise ValueError(f"special tokens {missing} (unk_token included) are not in vocab")
        self.unk_token = unk_token
        self.max_word_chars = check_int("max_word_chars", max_word_chars, 1)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @classmethod
    def train(cls, text: str, vocab_size: int,
              special_tokens: Sequence[str] = BERT_SPECIAL_TOKENS,
              unk_token: str = "[UNK]", score: str = "pmi") -> WordPiece:
        """Learn a vocabulary of ``vocab_size`` tokens (fewer if no pair is left) on ``text``.

        score: ``"pmi"`` merges the pair with the largest c(ab) / (c(a) c(b)) (the HF course's
        rule); ``"likelihood"`` the pair with the largest exact gain of the unigram
        log-likelihood (see :func:`merge_scores`).

        The vocabulary is the special tokens, then the characters in order of first appearance
        (``##c`` for a character inside a word), then one token per merge.
        """
        special_tokens = check_special_tokens(special_tokens)
        if unk_token not in special_tokens:
            special_tokens = [unk_token, *special_tokens]
        check_int("vocab_size", vocab_size, len(special_tokens))
        if score not in ("pmi", "likelihood"):
            raise ValueError(f"score must be 'pmi' or 'likelihood', got {score!r}")
        counts = Counter(word for chunk, special in split_on_special_tokens(text, special_tokens)
                         if not special for word in bert_pretokenize(chunk))
        words = [[w[0]] + [PREFIX + c for c in w[1:]] for w in counts]
        freqs = list(counts.values())
        vocab = list(dict.fromkeys([*special_tokens, *(s for w in words for s in w)]))
        while len(vocab) < vocab_size:
            if score == "pmi":
                pairs = pair_counts(words, freqs)
                if not pairs:
                    break
                symbols: Counter[str] = Counter()
                for word, n in zip(words, freqs):
                    for s in word:
                        symbols[s] += n
                best = max(pairs, key=lambda p: pairs[p] / (symbols[p[0]] * symbols[p[1]]))
            else:
                scored = merge_scores(words, freqs)
                if not scored:
                    break
                best = max(scored, key=lambda p: scored[p][2])
            merged = _merged(best)
            words = [merge_pair(w, best, into=merged) for w in words]
            if merged not in vocab:
                vocab.append(merged)
        return cls(vocab, unk_token, special_tokens=special_tokens)

    def encode_word(self, word: str) -> list[str]:
        """The pieces of one word, greedy longest match first; ``[unk_token]`` if none fits."""
        if len(word) > self.max_word_chars:
            return [self.unk_token]
        pieces: list[str] = []
        start = 0
        while start < len(word):
            for end in range(len(word), start, -1):       # longest candidate first
                piece = word[start:end] if start == 0 else PREFIX + word[start:end]
                if piece in self._ids:
                    break
            else:
                return [self.unk_token]
            pieces.append(piece)
            start = end
        return pieces

    def tokens(self, text: str) -> list[str]:
        """The token strings of ``text``: special tokens whole, every other word in pieces."""
        return segment_with_special_tokens(text, self.special_tokens, bert_pretokenize, self.encode_word)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return [self._ids[token] for token in self.tokens(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """Words joined by spaces, ``##`` pieces glued to the word before (punctuation and
        special tokens come out as words of their own; original spacing is not kept)."""
        words: list[str] = []
        for i in check_token_ids(ids, self.vocab_size):
            token = self.vocab[i]
            if token.startswith(PREFIX) and words:
                words[-1] += token[len(PREFIX):]
            else:
                words.append(token)
        return " ".join(words)

    def to_hf_tokenizer(self) -> Any:
        """A ``tokenizers.Tokenizer`` with the same vocabulary that encodes every text alike:
        ``WordPiece`` model, ``BertPreTokenizer``, the special tokens added, no normaliser."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        model = models.WordPiece({t: i for i, t in enumerate(self.vocab)}, unk_token=self.unk_token,
                                 max_input_chars_per_word=self.max_word_chars)
        tokenizer = Tokenizer(model)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(prefix=PREFIX)
        tokenizer.add_special_tokens(self.special_tokens)
        return tokenizer

    def __repr__(self) -> str:
        return f"WordPiece(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"
