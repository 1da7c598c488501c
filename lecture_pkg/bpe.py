"""Byte pair encoding (BPE): learning subword merges from a corpus and applying them to text.

Two flavours, both from the lecture:

* **Classic BPE** (Sennrich et al., 2016). A word is its characters followed by an end-of-word
  symbol ``</w>``. Training repeatedly merges the most frequent pair of adjacent symbols, counting
  each word as often as it occurs; the ordered list of merges is the model. :func:`learn_bpe`
  learns it, :func:`apply_bpe` segments any word with it, seen in training or not.
* **Byte-level BPE** (GPT-2, Radford et al., 2019). The same merges, learned over the UTF-8 bytes of
  regex pre-tokens, so every string can be encoded and no token is ever unknown:
  :class:`ByteLevelBPE`, which exports itself to a HuggingFace ``tokenizers.Tokenizer``.

Training exists twice, giving identical merges on every input, ties included:

* :func:`iter_merges_recount` recounts every pair after every merge: the textbook algorithm,
  whose cost is (number of merges) x (corpus size);
* :func:`iter_merges` keeps the counts up to date: an index from each pair to the words that
  contain it and a max-heap with lazy invalidation, so a merge costs time in proportion to the
  occurrences it touches.

**Ties.** Among the pairs with the highest count, the winner is by default (``tie_break="first"``)
the pair whose first occurrence comes first when the words are read in the order given (a dict's
insertion order), each from left to right. This rule reproduces the lecture's merge order, and it
is what minbpe's ``max(stats, key=stats.get)`` does. Other well-known trainers (Sennrich's
subword-nmt, the byte-level trainers of Stanford's CS336 course) take the lexicographically
greatest pair instead: ``tie_break="greatest"`` compares the two symbols' bytes (UTF-8 for classic
BPE, the bytes a token stands for in byte-level BPE), the first symbol first. The two rules give
the same merges whenever no two pairs tie for the highest count.

**Applying merges.** A word is split into its initial symbols; then, as long as some adjacent pair
is a learned merge, the pair with the lowest rank (the earliest-learned merge) is merged, the
leftmost one if it occurs twice. This is GPT-2's rule and HuggingFace ``tokenizers``' rule.
A pair listed twice in a merges list keeps its first (best) rank.

**Special tokens** (``<|endoftext|>``, ``[CLS]``, ...) are cut out of the text before anything
else (:func:`split_on_special_tokens`), so they are never merged or split; the WordPiece
(:mod:`lecture_pkg.wordpiece`) and Unigram (:mod:`lecture_pkg.unigram`) tokenizers share this.
"""

from __future__ import annotations

import functools
import heapq
import json
import random
import re
import sys
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from os import PathLike
from typing import Any, Literal, TypeVar

from lecture_pkg.checks import check_int

__all__ = [
    "CL100K_PATTERN", "GPT2_PATTERN", "O200K_PATTERN", "PRETOKENIZER_PATTERNS", "ByteLevelBPE",
    "apply_bpe", "bpe_steps", "bytes_to_unicode",
    "check_special_tokens", "check_token_ids", "gpt2_pattern", "iter_merges", "iter_merges_recount", "learn_bpe",
    "learned_vocabulary", "merge_pair", "pair_counts", "pretokenize", "pretokenize_with",
    "segment_with_special_tokens",
    "split_on_special_tokens",
    "word_counts",
]

Pair = tuple[str, str]
S = TypeVar("S", bound=Hashable)
TieBreak = Literal["first", "greatest"]
"""Which of several equally frequent pairs is merged: see the module docstring."""


def _utf8(symbol: str) -> bytes:
    return symbol.encode("utf-8")


def _descending(data: bytes) -> tuple[int, ...]:
    """A sort key under which byte strings come in descending lexicographic order (the heap pops
    its smallest key): every byte negated, then an end marker above all of them, so that a
    string sorts before its own prefixes."""
    return tuple(-b for b in data) + (1,)


def _check_tie_break(tie_break: object) -> None:
    if tie_break not in ("first", "greatest"):
        raise ValueError(f"tie_break must be 'first' or 'greatest', got {tie_break!r}")

# --------------------------------------------------------------------------------------------
# Counting and merging pairs: the two operations every BPE trainer is made of
# --------------------------------------------------------------------------------------------


def pair_counts(segmentations: Sequence[Sequence[str]], counts: Sequence[int]) -> dict[Pair, int]:
    """Frequency of every adjacent symbol pair, each word weighted by its count.

    segmentations: one symbol sequence per word; counts: (len(segmentations),) word frequencies.
    The dict lists the pairs in order of first occurrence (words in order, each left to right).
    """
    totals: dict[Pair, int] = {}
    for symbols, count in zip(segmentations, counts, strict=True):
        for pair in zip(symbols, symbols[1:]):
            totals[pair] = totals.get(pair, 0) + count
    return totals


def merge_pair(symbols: Sequence[str], pair: Pair, *, into: str | None = None) -> list[str]:
    """Replace every occurrence of ``pair`` in ``symbols`` by one symbol, scanning left to right
    (so ``a a a`` with the pair ``(a, a)`` becomes ``aa a``). The new symbol is ``into``, by
    default the concatenation of the pair (WordPiece drops the ``##`` of the second half)."""
    first, second = pair
    merged = first + second if into is None else into
    out: list[str] = []
    i = 0
    while i < len(symbols):
        if symbols[i] == first and i + 1 < len(symbols) and symbols[i + 1] == second:
            out.append(merged)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def iter_merges_recount(words: Sequence[Sequence[str]], counts: Sequence[int],
                        tie_break: TieBreak = "first",
                        symbol_bytes: Callable[[str], bytes] = _utf8) -> Iterator[Pair]:
    """Yield BPE merges, best first, recounting all pairs after every merge (the reference).

    words: initial symbol sequences, one per distinct word; counts: their frequencies. Ends when no
    word has two symbols left. Among equally frequent pairs, with ``tie_break="first"`` the one seen
    first wins (``max`` returns the first maximum, and ``pair_counts`` lists pairs in order of first
    occurrence); with ``"greatest"`` the greatest (bytes of the first symbol, bytes of the second),
    ``symbol_bytes`` giving a symbol's bytes.
    """
    _check_tie_break(tie_break)
    segmentations = [list(word) for word in words]
    while True:
        totals = pair_counts(segmentations, counts)
        if not totals:
            return
        if tie_break == "first":
            best = max(totals, key=totals.__getitem__)
        else:
            best = max(totals, key=lambda p: (totals[p], symbol_bytes(p[0]), symbol_bytes(p[1])))
        yield best
        segmentations = [merge_pair(symbols, best) for symbols in segmentations]


def iter_merges(words: Sequence[Sequence[str]], counts: Sequence[int],
                tie_break: TieBreak = "first",
                symbol_bytes: Callable[[str], bytes] = _utf8) -> Iterator[Pair]:
    """Yield the same merges as :func:`iter_merges_recount`, updating counts incrementally.

    words: initial symbol sequences, one per distinct word; counts: their frequencies;
    tie_break, symbol_bytes: as :func:`iter_merges_recount`.

    State, for every pair of symbol ids: its total ``count``; ``where`` it occurs (a superset: word
    indices are added when the pair appears and dropped lazily); and ``first``, the position
    ``(word index, offset)`` of its first occurrence, which decides ties. A symbol's offset is that
    of its first initial symbol, so merges never move it. A merge rewrites only the words that
    contain the pair, and adjusts only the pairs next to each merge site.

    The heap holds ``(-count, word, offset, pair)`` entries that are *lower bounds* of each pair's
    true key: a count that falls or a first occurrence that moves right only makes the true key
    larger, so such entries stay valid bounds and are fixed when they reach the top; a pair whose
    key gets smaller (a count that grows, an occurrence further left) is pushed anew. The top entry
    is accepted only if it is exact, so the pair accepted is the true best one. With
    ``tie_break="greatest"`` the position is replaced by a fixed key of the pair's bytes.
    """
    _check_tie_break(tie_break)
    if len(words) != len(counts):
        raise ValueError(f"words has {len(words)} entries but counts has {len(counts)}")
    names = list(dict.fromkeys(symbol for word in words for symbol in word))  # symbol id -> string
    ids = {name: i for i, name in enumerate(names)}
    seqs = [[ids[symbol] for symbol in word] for word in words]
    starts = [list(range(len(seq))) for seq in seqs]   # offset of each symbol in its word
    count: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    first: dict[tuple[int, int], tuple[int, int]] = {}
    stale: set[tuple[int, int]] = set()   # pairs whose `first` is only a lower bound
    for w, seq in enumerate(seqs):
        for offset, pair in enumerate(zip(seq, seq[1:])):
            count[pair] += counts[w]
            where[pair].add(w)
            first.setdefault(pair, (w, offset))
    def order(pair: tuple[int, int]) -> tuple:
        """The tie-breaking part of a pair's heap key (smaller wins)."""
        if tie_break == "first":
            return first[pair]
        return _descending(symbol_bytes(names[pair[0]])), _descending(symbol_bytes(names[pair[1]]))

    heap = [(-c, *order(pair), pair) for pair, c in count.items()]
    heapq.heapify(heap)

    def remove(pair: tuple[int, int], n: int, w: int, offset: int) -> None:
        left = count[pair] - n
        if left:
            count[pair] = left
            if first[pair] == (w, offset):
                stale.add(pair)
        else:                             # gone from the corpus: forget it entirely
            del count[pair], first[pair]
            where.pop(pair, None)
            stale.discard(pair)

    def add(pair: tuple[int, int], n: int, w: int, offset: int, grown: set) -> None:
        count[pair] += n
        where[pair].add(w)
        if pair not in first or (w, offset) < first[pair]:
            first[pair] = (w, offset)     # left of every old occurrence, so exact
            stale.discard(pair)
        grown.add(pair)

    def locate_first(pair: tuple[int, int]) -> tuple[int, int]:
        candidates = where[pair]
        while True:
            w = min(candidates)
            seq = seqs[w]
            for i in range(len(seq) - 1):
                if seq[i] == pair[0] and seq[i + 1] == pair[1]:
                    return w, starts[w][i]
            candidates.discard(w)         # an index entry left over from an earlier merge

    while heap:
        neg_count, w, offset, pair = heapq.heappop(heap)
        c = count.get(pair, 0)
        if c == 0 or c > -neg_count:      # gone, or a fresher entry is queued
            continue
        if pair in stale and tie_break == "first":
            first[pair] = locate_first(pair)
            stale.discard(pair)
        if (neg_count, w, offset) != (-c, *order(pair)):
            heapq.heappush(heap, (-c, *order(pair), pair))
            continue

        a, b = pair
        yield names[a], names[b]
        merged = names[a] + names[b]
        if merged not in ids:             # two different merges can build the same string
            ids[merged] = len(names)
            names.append(merged)
        new = ids[merged]
        grown: set[tuple[int, int]] = set()
        for w in where.pop(pair):
            seq, start, n = seqs[w], starts[w], counts[w]
            i = 0
            while True:                   # merge the occurrences in place, left to right
                try:
                    i = seq.index(a, i)   # jump to the next candidate in C
                except ValueError:
                    break
                if i + 1 < len(seq) and seq[i + 1] == b:
                    if i > 0:             # (prev, a) becomes (prev, new)
                        remove((seq[i - 1], a), n, w, start[i - 1])
                        add((seq[i - 1], new), n, w, start[i - 1], grown)
                    if i + 2 < len(seq):  # (b, next) becomes (new, next)
                        remove((b, seq[i + 2]), n, w, start[i + 1])
                        add((new, seq[i + 2]), n, w, start[i], grown)
                    seq[i] = new
                    del seq[i + 1], start[i + 1]
                i += 1
        count.pop(pair, None)
        first.pop(pair, None)
        stale.discard(pair)
        for p in grown:
            if count.get(p, 0) > 0:
                heapq.heappush(heap, (-count[p], *order(p), p))


# --------------------------------------------------------------------------------------------
# Classic BPE with an end-of-word symbol
# --------------------------------------------------------------------------------------------


def _check_word_counts(word_counts: Mapping[str, int]) -> None:
    if not isinstance(word_counts, Mapping):
        raise TypeError(f"word_counts must be a mapping from word (str) to count (int), "
                        f"got {type(word_counts).__name__}")
    for word, count in word_counts.items():
        if not isinstance(word, str):
            raise TypeError(f"word_counts keys must be str, got {type(word).__name__} {word!r}")
        if not word:
            raise ValueError("word_counts contains the empty string; words must be non-empty")
        if not isinstance(count, int) or isinstance(count, bool):
            raise TypeError(f"the count of {word!r} must be an int, got {type(count).__name__}")
        if count <= 0:
            raise ValueError(f"the count of {word!r} must be positive, got {count}")


def _check_end_of_word(end_of_word: str) -> None:
    if not isinstance(end_of_word, str):
        raise TypeError(f"end_of_word must be a str, got {type(end_of_word).__name__}")


def _symbols(word: str, end_of_word: str) -> list[str]:
    """A word's initial symbols: its characters, then the end-of-word symbol (if not empty)."""
    return list(word) + ([end_of_word] if end_of_word else [])


def word_counts(text: str) -> dict[str, int]:
    r"""Count the words of ``text``: runs of word characters or of punctuation (``\w+|[^\w\s]+``,
    the split of HuggingFace's ``Whitespace`` pre-tokenizer), in order of first appearance."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return dict(Counter(re.findall(r"\w+|[^\w\s]+", text)))


def learn_bpe(word_counts: Mapping[str, int], num_merges: int, end_of_word: str = "</w>",
              *, trainer: str = "incremental", tie_break: TieBreak = "first") -> list[Pair]:
    """Learn up to ``num_merges`` classic BPE merges, best first (fewer if the words run out of pairs).

    word_counts: word -> frequency; with ``tie_break="first"`` its order decides ties, with
    ``"greatest"`` the symbols' UTF-8 bytes do (see the module docstring).
    trainer: ``"incremental"`` (:func:`iter_merges`) or ``"recount"`` (:func:`iter_merges_recount`);
    both return the same list.
    """
    _check_word_counts(word_counts)
    _check_end_of_word(end_of_word)
    check_int("num_merges", num_merges, 0)
    _check_tie_break(tie_break)
    trainers = {"incremental": iter_merges, "recount": iter_merges_recount}
    if trainer not in trainers:
        raise ValueError(f"trainer must be one of {sorted(trainers)}, got {trainer!r}")
    words = [_symbols(word, end_of_word) for word in word_counts]
    merges = trainers[trainer](words, list(word_counts.values()), tie_break)
    return list(islice(merges, num_merges))


def learned_vocabulary(word_counts: Mapping[str, int], merges: Sequence[Pair],
                       end_of_word: str = "</w>") -> list[str]:
    """The initial symbols in order of first appearance, then each merge's new symbol: the
    vocabulary whose size is (initial symbols) + (merges), as long as no two merges build the
    same string."""
    _check_word_counts(word_counts)
    symbols = [s for word in word_counts for s in _symbols(word, end_of_word)]
    return list(dict.fromkeys(symbols + [a + b for a, b in merges]))


def _lowest_rank_merges(symbols: list[S], table: Mapping[tuple[S, S], tuple[int, S]]) -> Iterator[int]:
    """Merge, in place, the adjacent pair of lowest rank (leftmost on a tie) until no adjacent
    pair is in ``table``; yield the rank of each merge as it is made."""
    while len(symbols) > 1:
        best = min(((table[pair][0], i) for i, pair in enumerate(zip(symbols, symbols[1:]))
                    if pair in table), default=None)
        if best is None:
            return
        rank, i = best
        symbols[i:i + 2] = [table[symbols[i], symbols[i + 1]][1]]
        yield rank


def _check_segmentation_args(word: str, merges: Sequence[Pair], end_of_word: str) -> list[Pair]:
    """The checks of :func:`bpe_steps`; returns the merges as a list of tuples."""
    if not isinstance(word, str):
        raise TypeError(f"word must be a str, got {type(word).__name__}")
    if not word:
        raise ValueError("word must be a non-empty str")
    _check_end_of_word(end_of_word)
    for rank, pair in enumerate(merges):
        if not (isinstance(pair, tuple | list) and len(pair) == 2
                and all(isinstance(s, str) and s for s in pair)):
            raise TypeError(f"merges[{rank}] must be a pair of non-empty str, got {pair!r}")
    return [(a, b) for a, b in merges]


def bpe_steps(word: str, merges: Sequence[Pair],
              end_of_word: str = "</w>") -> Iterator[tuple[Pair, list[str]]]:
    """Yield ``(merge, segmentation)`` after each merge :func:`apply_bpe` makes on ``word``."""
    pairs = _check_segmentation_args(word, merges, end_of_word)
    table: dict[Pair, tuple[int, str]] = {}   # pair -> (rank, merged symbol)
    for rank, (a, b) in enumerate(pairs):
        table.setdefault((a, b), (rank, a + b))   # a pair listed twice keeps its best rank
    symbols = _symbols(word, end_of_word)
    for rank in _lowest_rank_merges(symbols, table):
        yield pairs[rank], list(symbols)


def apply_bpe(word: str, merges: Sequence[Pair], end_of_word: str = "</w>") -> list[str]:
    """Segment ``word`` with learned ``merges`` (best first): start from its characters plus
    ``end_of_word`` and keep merging the lowest-ranked adjacent pair, the leftmost on a tie."""
    steps = list(bpe_steps(word, merges, end_of_word))
    return steps[-1][1] if steps else _symbols(word, end_of_word)


# --------------------------------------------------------------------------------------------
# Special tokens: matched in the raw text first, so no merge ever reaches into them
# --------------------------------------------------------------------------------------------


def check_special_tokens(special_tokens: Iterable[str]) -> list[str]:
    """``special_tokens`` as a list of distinct non-empty strings (TypeError/ValueError else)."""
    if isinstance(special_tokens, str):
        raise TypeError("special_tokens must be a sequence of str, got one str")
    tokens = list(special_tokens)
    for k, token in enumerate(tokens):
        if not isinstance(token, str) or not token:
            raise TypeError(f"special_tokens[{k}] must be a non-empty str, got {token!r}")
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"special_tokens has duplicates: {tokens}")
    return tokens


def check_token_ids(ids: Iterable[int], vocab_size: int) -> list[int]:
    """``ids`` (a list, tensor or array) as a list of ints in [0, vocab_size); ValueError else."""
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    for i in ids:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < vocab_size:
            raise ValueError(f"ids must be ints in [0, {vocab_size}), got {i!r}")
    return ids


def split_on_special_tokens(text: str, special_tokens: Sequence[str]) -> list[tuple[str, bool]]:
    """Cut ``text`` into ``(piece, is_special)``: every occurrence of a special token (leftmost
    first, the longest where two start at the same place, as HF ``tokenizers`` matches added
    tokens) and the ordinary text between them. Empty pieces are left out."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not special_tokens:
        return [(text, False)] if text else []
    pattern = "|".join(re.escape(t) for t in sorted(special_tokens, key=len, reverse=True))
    pieces = re.split(f"({pattern})", text)   # odd positions hold the matched special tokens
    return [(piece, k % 2 == 1) for k, piece in enumerate(pieces) if piece]


def segment_with_special_tokens(text: str, special_tokens: Sequence[str],
                                pretokenize: Callable[[str], list[str]],
                                encode_word: Callable[[str], list[str]]) -> list[str]:
    """The tokens of ``text`` for a word-level tokenizer: each special token whole, the text
    between them pre-tokenized into words and each word encoded into pieces."""
    out: list[str] = []
    for chunk, special in split_on_special_tokens(text, special_tokens):
        if special:
            out.append(chunk)
        else:
            out.extend(piece for word in pretokenize(chunk) for piece in encode_word(word))
    return out


# --------------------------------------------------------------------------------------------
# Byte-level BPE (GPT-2)
# --------------------------------------------------------------------------------------------


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from the 256 byte values to printable characters.

    Printable Latin-1 bytes stand for themselves; the other 68 (control characters, space, ...)
    are shifted to the characters 256, 257, ... in byte order. A token is then a readable string,
    and a space shows as ``Ġ`` (chr(256 + 32)).
    """
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    shifted = [b for b in range(256) if b not in keep]
    return {b: chr(b) if b in keep else chr(256 + shifted.index(b)) for b in range(256)}


@functools.cache
def _byte_of_char() -> dict[str, int]:
    return {char: b for b, char in bytes_to_unicode().items()}


def _token_bytes(token: str) -> bytes:
    """The bytes a token over :func:`bytes_to_unicode`'s alphabet stands for (``Ġ`` is 0x20)."""
    return bytes(_byte_of_char()[char] for char in token)


GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""GPT-2's pre-tokenisation regex: contractions, letter runs, digit runs and punctuation runs, each
with at most one leading space, and whitespace (a run of spaces before a word leaves its last space
to the word)."""

# The Unicode White_Space property, which \s means in Oniguruma (HuggingFace's regex engine);
# Python's own \s also matches U+001C..U+001F.
_WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
                (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]


@functools.cache
def _category_ranges(major: str) -> tuple[tuple[int, int], ...]:
    """Code-point ranges whose Unicode general category starts with ``major`` (L or N),
    from this Python's ``unicodedata``."""
    ranges: list[tuple[int, int]] = []
    start = None
    for cp in range(sys.maxunicode + 2):
        inside = cp <= sys.maxunicode and unicodedata.category(chr(cp))[0] == major
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append((start, cp - 1))
            start = None
    return tuple(ranges)


@functools.cache
def gpt2_pattern(engine: str = "python") -> str:
    r""":data:`GPT2_PATTERN` with ``\p{L}``, ``\p{N}`` and ``\s`` spelled out as code-point ranges.

    The classes come from this Python's Unicode database, and the same ranges go into the
    HuggingFace export, so both sides split every string alike even where their Unicode versions
    disagree (each version assigns thousands of new letters). engine: ``"python"`` (for :mod:`re`)
    or ``"oniguruma"`` (for ``tokenizers.Regex``); only the escape syntax differs.
    """
    escapes = {"python": lambda cp: f"\\U{cp:08X}", "oniguruma": lambda cp: f"\\x{{{cp:X}}}"}
    if engine not in escapes:
        raise ValueError(f"engine must be 'python' or 'oniguruma', got {engine!r}")
    esc = escapes[engine]

    def body(ranges: Iterable[tuple[int, int]]) -> str:
        return "".join(esc(a) if a == b else f"{esc(a)}-{esc(b)}" for a, b in ranges)

    classes = {r"\p{L}": body(_category_ranges("L")), r"\p{N}": body(_category_ranges("N")),
               r"\s": body(_WHITE_SPACE)}

    def expand(match: re.Match) -> str:
        token = match.group(0)
        if token.startswith("["):         # inside a bracket: splice the ranges in
            return re.sub(r"\\p\{[LN]\}|\\s", lambda m: classes[m.group(0)], token)
        if token == r"\S":
            return "[^" + classes[r"\s"] + "]"
        return "[" + classes[token] + "]"

    return re.sub(r"\[[^\]]*\]|\\p\{[LN]\}|\\[sS]", expand, GPT2_PATTERN)


@functools.cache
def _gpt2_regex() -> re.Pattern:
    return re.compile(gpt2_pattern("python"))


def pretokenize(text: str) -> list[str]:
    """Split ``text`` into GPT-2 pre-tokens; their concatenation is ``text``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _gpt2_regex().findall(text)


# The pre-tokenizers of GPT-4 (cl100k_base) and GPT-4o (o200k_base), as published in OpenAI's
# tiktoken (tiktoken_ext/openai_public.py). Against GPT-2's: contractions in any case, at most one
# non-letter glued in front of a letter run, digits in groups of one to three, newlines kept with
# the punctuation before them; o200k also splits a word at an upper-case letter after lower-case
# ones (CamelCase) and keeps "/" with the punctuation before it.
CL100K_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
"""GPT-4's (cl100k_base) pre-tokenisation regex."""

O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
"""GPT-4o's (o200k_base) pre-tokenisation regex."""

PRETOKENIZER_PATTERNS = {"gpt2": GPT2_PATTERN, "cl100k": CL100K_PATTERN, "o200k": O200K_PATTERN}
r"""The three published pre-tokenizer regexes by name (they need the ``regex`` module's ``\p{..}``)."""


@functools.cache
def _compiled_pattern(name: str) -> Any:
    try:
        import regex
    except ImportError as err:   # pragma: no cover - regex comes with transformers
        raise ImportError("pretokenize_with needs the 'regex' module (pip install regex)") from err
    return regex.compile(PRETOKENIZER_PATTERNS[name])


def pretokenize_with(text: str, pattern: str = "cl100k") -> list[str]:
    r"""Split ``text`` into pre-tokens with one of :data:`PRETOKENIZER_PATTERNS` (``"gpt2"``,
    ``"cl100k"`` or ``"o200k"``), as published, run by the ``regex`` module (this Python's
    Unicode tables for ``\p{..}``). Characters no alternative matches (none, for these three
    patterns, since ``\s+`` and the negated classes cover everything) would be dropped, so the
    concatenation is checked to be ``text``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if pattern not in PRETOKENIZER_PATTERNS:
        raise ValueError(f"pattern must be one of {sorted(PRETOKENIZER_PATTERNS)}, got {pattern!r}")
    pieces = _compiled_pattern(pattern).findall(text)
    if "".join(pieces) != text:   # pragma: no cover - the patterns cover every character
        raise AssertionError(f"pattern {pattern!r} dropped characters of {text!r}")
    return pieces


def _check_dropout(dropout: object, seed: object) -> float:
    if not isinstance(dropout, int | float) or isinstance(dropout, bool) or not 0.0 <= dropout <= 1.0:
        raise ValueError(f"dropout must be a number in [0, 1], got {dropout!r}")
    if dropout > 0 and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise TypeError(f"seed must be an int when dropout > 0 (encoding is random), got {seed!r}")
    return float(dropout)


class ByteLevelBPE:
    """GPT-2-style byte-level BPE tokenizer.

    Ids 0..255 are the byte values; each merge that builds a new string adds the next id. Tokens
    are written as strings over :func:`bytes_to_unicode`'s alphabet (``Ġthe`` is the bytes of
    `` the``), as in GPT-2's vocabulary files. Special tokens (GPT-2's ``<|endoftext|>``) take the
    last ids; they are cut out of the text before pre-tokenization, in training and in encoding,
    so they are never merged with their neighbours nor split into bytes.

    >>> tok = ByteLevelBPE().train("low lower newest widest " * 50, vocab_size=270)
    >>> tok.decode(tok.encode("lowest 😊")) == "lowest 😊"
    True
    """

    def __init__(self, merges: Iterable[Sequence[str]] = (), cache_size: int = 100_000, *,
                 special_tokens: Iterable[str] = ()) -> None:
        """merges: pairs of token strings, best first; cache_size: how many pre-tokens'
        encodings to remember (encoding cost is mostly spent on the first sight of a pre-token);
        special_tokens: strings that always encode to one id each, after the merges' ids."""
        self.cache_size = check_int("cache_size", cache_size, 0)
        self.special_tokens = check_special_tokens(special_tokens)
        self._reset()
        for k, pair in enumerate(merges):
            if not (isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2
                    and all(isinstance(s, str) and s in self._ids for s in pair)):
                raise ValueError(f"merges[{k}] = {pair!r} is not a pair of tokens known at that point")
            self._add_merge((pair[0], pair[1]))
        self._add_special_tokens()

    def _reset(self) -> None:
        byte_chars = bytes_to_unicode()
        self.merges: list[Pair] = []
        self.vocab: list[str] = [byte_chars[b] for b in range(256)]   # id -> token string
        self._bytes: list[bytes] = [bytes([b]) for b in range(256)]   # id -> the bytes it stands for
        self._ids = {token: i for i, token in enumerate(self.vocab)}
        self._table: dict[tuple[int, int], tuple[int, int]] = {}       # (id, id) -> (rank, id)
        self._cache: dict[str, list[int]] = {}
        self._special_ids: dict[str, int] = {}

    def _add_special_tokens(self) -> None:
        for token in self.special_tokens:
            if token in self._ids:
                raise ValueError(f"special token {token!r} is also an ordinary token of the vocabulary")
            self._special_ids[token] = self._ids[token] = len(self.vocab)
            self.vocab.append(token)
            self._bytes.append(token.encode("utf-8"))

    def _add_merge(self, pair: Pair) -> None:
        key = (self._ids[pair[0]], self._ids[pair[1]])
        if key in self._table:    # possible only when two merges built the same string
            return
        merged = pair[0] + pair[1]
        if merged not in self._ids:
            self._ids[merged] = len(self.vocab)
            self.vocab.append(merged)
            self._bytes.append(self._bytes[key[0]] + self._bytes[key[1]])
        self._table[key] = (len(self.merges), self._ids[merged])
        self.merges.append(pair)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def train(self, text: str, vocab_size: int, tie_break: TieBreak = "first") -> ByteLevelBPE:
        """Learn merges on ``text`` (replacing any earlier ones) until the vocabulary holds
        ``vocab_size`` tokens, special tokens included, or no pair is left. Pre-tokens are counted
        in order of first appearance, which decides ties (``tie_break="first"``); with
        ``"greatest"`` the lexicographically greatest pair of byte strings wins. Special tokens in
        ``text`` are cut out first, so no merge reaches into them. Returns ``self``."""
        check_int("vocab_size", vocab_size, 256 + len(self.special_tokens))  # one token per byte
        _check_tie_break(tie_break)
        byte_chars = bytes_to_unicode()
        pieces = Counter(p for chunk, special in split_on_special_tokens(text, self.special_tokens)
                         if not special for p in pretokenize(chunk))
        words = [[byte_chars[b] for b in piece.encode("utf-8")] for piece in pieces]
        self._reset()
        merges = iter_merges(words, list(pieces.values()), tie_break, _token_bytes)
        n_ordinary = vocab_size - len(self.special_tokens)
        while len(self.vocab) < n_ordinary and (pair := next(merges, None)) is not None:
            self._add_merge(pair)
        self._add_special_tokens()
        return self

    def _encode_piece(self, piece: str) -> list[int]:
        ids = list(piece.encode("utf-8"))
        for _ in _lowest_rank_merges(ids, self._table):
            pass
        return ids

    def _encode_piece_dropout(self, piece: str, dropout: float, rng: random.Random) -> list[int]:
        """BPE-dropout (Provilkov et al., 2020): at every step each applicable merge is skipped
        with probability ``dropout``; the lowest-ranked surviving merge is made (leftmost on a
        tie); when every applicable merge is skipped, the piece is done."""
        ids = list(piece.encode("utf-8"))
        table = self._table
        while len(ids) > 1:
            best = min(((table[pair][0], i) for i, pair in enumerate(zip(ids, ids[1:]))
                        if pair in table and rng.random() >= dropout), default=None)
            if best is None:
                break
            i = best[1]
            ids[i:i + 2] = [table[ids[i], ids[i + 1]][1]]
        return ids

    def encode(self, text: str, *, dropout: float = 0.0, seed: int | None = None) -> list[int]:
        """Token ids of ``text`` (any Unicode string without lone surrogates).

        dropout: BPE-dropout's probability of skipping each applicable merge at each step
        (0: the deterministic encoding; 1: raw bytes); seed: required when dropout > 0, so the
        same seed gives the same segmentation. Every result decodes to ``text``."""
        rate = _check_dropout(dropout, seed)
        rng = random.Random(seed) if rate > 0 else None
        ids: list[int] = []
        for chunk, special in split_on_special_tokens(text, self.special_tokens):
            if special:
                ids.append(self._special_ids[chunk])
            elif rng is None:
                self._encode_ordinary(chunk, ids)
            else:
                for piece in pretokenize(chunk):
                    ids.extend(self._encode_piece_dropout(piece, rate, rng))
        return ids

    def _encode_ordinary(self, text: str, ids: list[int]) -> None:
        """Append the ids of ``text``, which holds no special token, to ``ids``."""
        cache = self._cache
        for piece in pretokenize(text):
            piece_ids = cache.get(piece)
            if piece_ids is None:
                piece_ids = self._encode_piece(piece)
                if len(cache) < self.cache_size:
                    cache[piece] = piece_ids
            ids.extend(piece_ids)

    def tokens(self, text: str, *, dropout: float = 0.0, seed: int | None = None) -> list[str]:
        """The tokens of ``text`` as strings over the byte alphabet (``Ġ`` is a space);
        ``dropout`` and ``seed`` as in :meth:`encode`."""
        return [self.vocab[i] for i in self.encode(text, dropout=dropout, seed=seed)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; byte sequences that are not valid UTF-8 become U+FFFD."""
        ids = check_token_ids(ids, self.vocab_size)
        return b"".join(self._bytes[i] for i in ids).decode("utf-8", errors="replace")

    def save(self, path: str | PathLike) -> None:
        """Write the merges to a JSON file (the vocabulary follows from them)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"format": "lecture_pkg.ByteLevelBPE", "version": 1,
                       "merges": [list(pair) for pair in self.merges],
                       "special_tokens": self.special_tokens}, f, ensure_ascii=False, indent=0)

    @classmethod
    def load(cls, path: str | PathLike) -> ByteLevelBPE:
        """Read a tokenizer written by :meth:`save`."""
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("format") != "lecture_pkg.ByteLevelBPE":
            raise ValueError(f"{path} is not a file written by ByteLevelBPE.save")
        return cls(data["merges"], special_tokens=data.get("special_tokens", ()))

    def to_hf_tokenizer(self) -> Any:
        """A ``tokenizers.Tokenizer`` that encodes every text to the same ids and decodes alike.

        Model: ``BPE`` with this vocabulary and these merges. Pre-tokenizer: a ``Split`` on
        :func:`gpt2_pattern` (the GPT-2 regex with explicit code-point classes, see there), then
        ``ByteLevel`` without its own regex to map bytes to characters. Decoder: ``ByteLevel``.
        """
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

        model = models.BPE(vocab={token: i for i, token in enumerate(self.vocab)}, merges=list(self.merges))
        tokenizer = Tokenizer(model)
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(gpt2_pattern("oniguruma")), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens(self.special_tokens)   # matched before pre-tokenization
        return tokenizer

    def __repr__(self) -> str:
        specials = f", special_tokens={self.special_tokens}" if self.special_tokens else ""
        return f"ByteLevelBPE(vocab_size={self.vocab_size}, merges={len(self.merges)}{specials})"
