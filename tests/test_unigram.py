"""lecture_pkg.unigram: Viterbi against brute force over every segmentation and against
HuggingFace tokenizers' Unigram model (same pieces and scores), the E-step against enumeration,
EM's monotone likelihood, and the trainer's guarantees."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lecture_pkg.data import pydoc_topics
from lecture_pkg.unigram import SPACE, T5_SPECIAL_TOKENS, Unigram, metaspace_pretokenize

TRAIN = pydoc_topics()[:40_000]


@pytest.fixture(scope="module")
def lm() -> Unigram:
    return Unigram.train(TRAIN, vocab_size=600)


@pytest.fixture(scope="module")
def hf(lm):
    return lm.to_hf_tokenizer()


def segmentations(word: str):
    """Every way to cut ``word`` into non-empty pieces."""
    n = len(word)
    for k in range(n):
        for cuts in combinations(range(1, n), k):
            bounds = (0, *cuts, n)
            yield [word[a:b] for a, b in zip(bounds, bounds[1:])]


# every letter is a piece, so every word is spellable and no <unk> node enters the lattice (an
# unknown character scores UNK_PENALTY below the least likely piece and can win a tie, as in HF)
pieces = st.tuples(st.dictionaries(st.text("abc", min_size=2, max_size=3), st.floats(-9, -0.5)),
                   st.fixed_dictionaries({c: st.floats(-9, -0.5) for c in "abc"})
                   ).map(lambda dicts: {**dicts[1], **dicts[0]})


@settings(max_examples=300, deadline=None)
@given(pieces, st.text("abc", min_size=1, max_size=7))
def test_viterbi_is_the_best_segmentation(scores, word) -> None:
    model = Unigram(scores)
    spellable = [seg for seg in segmentations(word) if all(p in scores for p in seg)]
    got = model.encode_word(word)
    best = max(sum(scores[p] for p in seg) for seg in spellable)
    assert "".join(got) == word
    assert math.isclose(sum(scores[p] for p in got), best, abs_tol=1e-9)


@settings(max_examples=200, deadline=None)
@given(pieces, st.text("abc", min_size=1, max_size=6))
def test_expected_counts_match_enumeration(scores, word) -> None:
    spellable = [seg for seg in segmentations(word) if all(p in scores for p in seg)]
    probs = [math.exp(sum(scores[p] for p in seg)) for seg in spellable]
    total = sum(probs)
    expected: dict[str, float] = {}
    for seg, p in zip(spellable, probs):
        for piece in seg:
            expected[piece] = expected.get(piece, 0.0) + 3 * p / total
    counts, loglik = Unigram.expected_counts({word: 3}, scores, max_len=3)
    assert math.isclose(loglik, 3 * math.log(total), rel_tol=1e-9)
    assert counts.keys() <= scores.keys()
    for piece, c in expected.items():
        assert math.isclose(counts[piece], c, rel_tol=1e-9, abs_tol=1e-12)


def test_em_never_lowers_the_likelihood() -> None:
    words = {w: n for w, n in zip(metaspace_pretokenize(TRAIN[:5_000]), range(1, 10**6))}
    chars = {c for w in words for c in w}
    scores = {x: -5.0 for x in chars}
    scores.update({w[:k]: -6.0 for w in words for k in (2, 3) if len(w) > k})
    history = []
    for _ in range(5):
        counts, loglik = Unigram.expected_counts(words, scores, max_len=3)
        history.append(loglik)
        total = sum(counts.values())
        scores = {x: math.log(c / total) for x, c in counts.items() if c > 0}
    assert all(b >= a - 1e-6 for a, b in zip(history, history[1:])) and history[-1] > history[0]


texts = st.one_of(st.text(),
                  st.lists(st.sampled_from(pydoc_topics()[60_000:90_000].splitlines()), max_size=4)
                  .map("\n".join),
                  st.lists(st.one_of(st.text(max_size=4), st.sampled_from(T5_SPECIAL_TOKENS)), max_size=6)
                  .map("".join))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts)
def test_encoding_matches_hf_unigram(lm, hf, text) -> None:
    assert hf.encode(text).ids == lm.encode(text)


def test_trainer_guarantees(lm) -> None:
    assert lm.vocab_size == 600 and lm.vocab[:3] == list(T5_SPECIAL_TOKENS)
    assert len(set(lm.vocab)) == 600
    assert set(TRAIN.replace(" ", SPACE)) <= set(lm.vocab)          # every character is kept
    assert lm.unk_token not in lm.tokens(TRAIN)                     # so training text is spellable
    assert math.isclose(sum(math.exp(s) for s in lm.scores.values()), 1.0, rel_tol=1e-6)
    assert lm.decode(lm.encode(TRAIN[:2_000])) == TRAIN[:2_000].removeprefix(" ")
    # multi-character pieces do their job: fewer tokens than characters
    assert len(lm.encode(TRAIN)) < 0.5 * len(TRAIN)


def test_unknown_characters_make_one_unk() -> None:
    model = Unigram({SPACE: -1.0, "a": -2.0})
    assert model.tokens("a😊😊a") == [SPACE, "a", "<unk>", "a"]
    assert model.tokens("<unk>a") == ["<unk>", SPACE, "a"]          # the special token, matched whole
    # an unknown character can win a tie against a spelling from known pieces, in HF as here
    tie = Unigram({SPACE: -1.0, "a": -5.0, "b": -6.0, "cc": -6.0, "cba": -1.0})
    assert tie.encode_word("ccba") == ["<unk>", "cba"]
    assert tie.to_hf_tokenizer().encode("ccba").ids == tie.encode("ccba")


def test_special_tokens_are_never_split_or_learned() -> None:
    lm = Unigram.train("hello</s> world</s> " * 40, vocab_size=30)
    assert not any("</s" in p or "s>" in p for p in lm.scores)
    assert lm.tokens("hi</s>") [-1] == "</s>"


def test_metaspace_matches_hf() -> None:
    from tokenizers import pre_tokenizers
    stock = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")
    for text in ["the cat", "  two  spaces ", "\nnew\tline", "▁already", ""]:
        assert metaspace_pretokenize(text) == [w for w, _ in stock.pre_tokenize_str(text)]


@pytest.mark.parametrize("call, error, match", [
    (lambda: Unigram({"a": math.nan}), ValueError, "finite"),
    (lambda: Unigram({"": -1.0}), TypeError, "non-empty"),
    (lambda: Unigram({"<unk>": -1.0}), ValueError, "special"),
    (lambda: Unigram.train("abc", vocab_size=3), ValueError, "vocab_size"),
    (lambda: Unigram.train("abc", vocab_size=10, shrink=1.0), ValueError, "shrink"),
    (lambda: Unigram.train(["abc"], vocab_size=10), TypeError, "text"),
    (lambda: Unigram({"a": -1.0}).decode([7]), ValueError, "ids"),
])
def test_errors(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()
