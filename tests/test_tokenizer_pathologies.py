"""What chapter 4.2 builds on: the published pre-tokenizer regexes (GPT-2, cl100k, o200k) against
HuggingFace tokenizers' Oniguruma engine, BPE-dropout's guarantees, Unigram's byte fallback
against HF's Unigram model with ``byte_fallback=True``, and WordPiece's merge scores against a
brute-force recount of the unigram log-likelihood."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lecture_pkg.bpe import (
    PRETOKENIZER_PATTERNS,
    ByteLevelBPE,
    merge_pair,
    pretokenize,
    pretokenize_with,
)
from lecture_pkg.data import pydoc_topics
from lecture_pkg.unigram import Unigram, byte_piece
from lecture_pkg.wordpiece import (
    WordPiece,
    bert_pretokenize,
    likelihood_gain,
    merge_scores,
    unigram_log_likelihood,
)

TRAIN = pydoc_topics()[:20_000]
# letters of several scripts and cases, digits, marks, punctuation, apostrophes, slashes, spaces
ALPHABET = "aAbBzZ éÉçßΩω東京 0123456789 '’/.,:;!?()_-\n\r\t" + "\u0301" + "😊"
texts = st.text(alphabet=ALPHABET, max_size=60)


@pytest.fixture(scope="module")
def tok() -> ByteLevelBPE:
    return ByteLevelBPE().train(TRAIN, vocab_size=600)


# ------------------------------------------------------------------ pre-tokenizer regexes

@pytest.mark.parametrize("name", sorted(PRETOKENIZER_PATTERNS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
def test_patterns_split_as_oniguruma(name, text):
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(PRETOKENIZER_PATTERNS[name]), behavior="isolated")
    assert pretokenize_with(text, name) == [p for p, _ in split.pre_tokenize_str(text)]


@given(text=texts)
@settings(max_examples=200, deadline=None)
def test_gpt2_pattern_agrees_with_the_explicit_ranges(text):
    assert pretokenize_with(text, "gpt2") == pretokenize(text)


def test_pattern_differences_on_known_cases():
    assert pretokenize_with("x 1234567", "gpt2") == ["x", " 1234567"]
    assert pretokenize_with("x 1234567", "cl100k") == ["x", " ", "123", "456", "7"]
    assert pretokenize_with("CamelCase DON'T", "cl100k") == ["CamelCase", " DON", "'T"]
    assert pretokenize_with("CamelCase DON'T", "o200k") == ["Camel", "Case", " DON'T"]


def test_pattern_refusals():
    with pytest.raises(ValueError, match="pattern must be one of"):
        pretokenize_with("a", "gpt4")
    with pytest.raises(TypeError, match="text must be a str"):
        pretokenize_with(b"a", "cl100k")


# ------------------------------------------------------------------ BPE-dropout

@given(text=texts, dropout=st.floats(0.0, 1.0), seed=st.integers(0, 2**31))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_dropout_round_trips_and_is_seeded(tok, text, dropout, seed):
    ids = tok.encode(text, dropout=dropout, seed=seed)
    assert tok.decode(ids) == text
    assert ids == tok.encode(text, dropout=dropout, seed=seed)
    assert len(tok.encode(text)) <= len(ids) <= len(text.encode("utf-8"))


def test_dropout_limits(tok):
    text = TRAIN[:3000]
    assert tok.encode(text, dropout=0.0, seed=1) == tok.encode(text) == tok.encode(text, dropout=0)
    assert tok.encode(text, dropout=1.0, seed=1) == list(text.encode("utf-8"))
    lengths = [len(tok.encode(text, dropout=p, seed=3)) for p in (0.0, 0.1, 0.3, 0.6)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    # different seeds give different segmentations of the same text
    assert tok.encode(text, dropout=0.1, seed=1) != tok.encode(text, dropout=0.1, seed=2)


def test_dropout_refusals(tok):
    for bad in (-0.1, 1.5, "0.1", True, float("nan")):
        with pytest.raises(ValueError, match="dropout must be a number in"):
            tok.encode("abc", dropout=bad, seed=0)
    with pytest.raises(TypeError, match="seed must be an int"):
        tok.encode("abc", dropout=0.1)


# ------------------------------------------------------------------ byte fallback

@pytest.fixture(scope="module")
def unigram_pair():
    lm = Unigram.train(TRAIN, vocab_size=300)
    fallback = Unigram(lm.scores, special_tokens=lm.special_tokens, byte_fallback=True)
    return lm, fallback, fallback.to_hf_tokenizer()


@given(text=texts)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_byte_fallback_matches_hf_and_round_trips(unigram_pair, text):
    _, fallback, hf = unigram_pair
    ids = fallback.encode(text)
    assert ids == hf.encode(text).ids
    assert fallback.unk_token not in fallback.tokens(text)
    if not text.startswith(" "):   # Metaspace's leading space is dropped on decoding
        assert fallback.decode(ids) == text


def test_byte_fallback_spells_unknown_characters_as_bytes(unigram_pair):
    plain, fallback, _ = unigram_pair
    assert "<unk>" in plain.tokens("東京")
    assert fallback.tokens("東京")[1:] == [byte_piece(b) for b in "東京".encode()]
    assert fallback.decode(fallback.encode("naïve 東京 😊")) == "naïve 東京 😊"
    assert fallback.vocab_size == plain.vocab_size + 256
    with pytest.raises(TypeError, match="byte_fallback must be a bool"):
        Unigram({"a": -1.0}, byte_fallback=1)


# ------------------------------------------------------------------ WordPiece's scores

def _corpus(text: str):
    counts = Counter(bert_pretokenize(text))
    return [[w[0]] + ["##" + c for c in w[1:]] for w in counts], list(counts.values())


@pytest.mark.parametrize("text", [TRAIN[:4000], "aaaa aaa aa abab ab ba " * 3, "x y xy yx xyxy"])
def test_gain_equals_the_recounted_likelihood(text):
    words, counts = _corpus(text)
    before = unigram_log_likelihood(words, counts)
    scores = merge_scores(words, counts)
    for pair, (count, pmi, gain) in scores.items():
        merged = pair[0] + pair[1].removeprefix("##")
        after = unigram_log_likelihood([merge_pair(w, pair, into=merged) for w in words], counts)
        assert math.isclose(gain, after - before, rel_tol=1e-9, abs_tol=1e-9), pair
        assert count >= 1 and 0 < pmi <= 1


def test_pmi_prefers_rare_pairs_and_the_gain_frequent_ones():
    words, counts = _corpus(TRAIN[:30_000])
    scores = merge_scores(words, counts)
    by_pmi = max(scores, key=lambda p: scores[p][1])
    by_gain = max(scores, key=lambda p: scores[p][2])
    assert scores[by_pmi][0] < 5 < scores[by_gain][0]
    assert scores[by_gain][2] > 10 * scores[by_pmi][2]


def test_likelihood_trainer_and_refusals():
    wp = WordPiece.train(TRAIN[:3000], vocab_size=200, score="likelihood")
    words, counts = _corpus(TRAIN[:3000])
    scores = merge_scores(words, counts)
    first = max(scores, key=lambda p: scores[p][2])
    assert first[0] + first[1].removeprefix("##") in wp.vocab
    with pytest.raises(ValueError, match="score must be 'pmi' or 'likelihood'"):
        WordPiece.train("a b", 10, score="count")
    with pytest.raises(ValueError, match="exceeds the counts"):
        likelihood_gain({"a": 1, "b": 1}, ("a", "b"), 2)
