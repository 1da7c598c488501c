"""lecture_pkg.wordpiece: greedy longest-match encoding against HuggingFace tokenizers' WordPiece
model (same vocabulary), BERT's pre-tokenization against tokenizers' BertPreTokenizer, and the
likelihood-score trainer against a brute-force restatement of its rule."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers

from lecture_pkg.data import pydoc_topics
from lecture_pkg.wordpiece import BERT_SPECIAL_TOKENS, WordPiece, bert_pretokenize


@pytest.fixture(scope="module")
def wp() -> WordPiece:
    return WordPiece.train(pydoc_topics()[:30_000], vocab_size=500)


@pytest.fixture(scope="module")
def hf(wp):
    return wp.to_hf_tokenizer()


LINES = pydoc_topics()[100_000:140_000].splitlines()
SPECIAL = ["[CLS] Hello, y'all! [SEP]", "naïve café_x $5 ¿qué?", "東京は日本の首都です。", "[MASK][PAD]x",
           "e\u0301 \u2028\u00a0\u3000 tab\there", "[CLS[SEP]]", "a" * 120]
# Characters that Unicode 3.2 already had, in the same category as today: the Unicode tables
# inside tokenizers are older than Python's, so punctuation added since (U+11A3F, ...) is split
# by this Python but not by HF's BertPreTokenizer.
STABLE_CHARS = [chr(cp) for cp in range(0x30000)
                if not 0xD800 <= cp < 0xE000
                and unicodedata.ucd_3_2_0.category(chr(cp)) != "Cn"
                and unicodedata.ucd_3_2_0.category(chr(cp)) == unicodedata.category(chr(cp))]
texts = st.one_of(st.text(st.sampled_from(STABLE_CHARS)),
                  st.lists(st.sampled_from(LINES + SPECIAL), max_size=4).map("\n".join),
                  st.lists(st.one_of(st.text(st.sampled_from(STABLE_CHARS), max_size=4),
                                     st.sampled_from(SPECIAL)), max_size=6).map("".join))


def test_greedy_longest_match_and_whole_word_unk() -> None:
    wp = WordPiece(["[UNK]", "un", "##aff", "##able", "##a", "a", "##ff"])
    assert wp.tokens("unaffable") == ["un", "##aff", "##able"]   # not un ##a ##ff ##able
    assert wp.tokens("unaffablex") == ["[UNK]"]                 # one unknown piece: the whole word
    assert wp.tokens("a, un") == ["a", "[UNK]", "un"]           # "," is a word of its own, unknown


def test_long_words_are_unknown() -> None:
    wp = WordPiece(["[UNK]", "a", "##a"], max_word_chars=3)
    assert wp.tokens("aaa aaaa") == ["a", "##a", "##a", "[UNK]"]


def test_trainer_picks_the_likelihood_score() -> None:
    """The pair maximising count(ab) / (count(a) count(b)), first seen on a tie, at every step;
    a brute-force restatement over the words written out in full."""
    counts = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
    text = " ".join(w for w, c in counts.items() for _ in range(c))
    wp = WordPiece.train(text, vocab_size=30, special_tokens=["[UNK]"])
    words = {w: [w[0]] + ["##" + c for c in w[1:]] for w in counts}
    expected = []
    while True:
        unit, pair_n, order = {}, {}, []
        for w, segs in words.items():
            for s in segs:
                unit[s] = unit.get(s, 0) + counts[w]
            for pair in zip(segs, segs[1:]):
                pair_n[pair] = pair_n.get(pair, 0) + counts[w]
                order.append(pair)
        if not pair_n:
            break
        best = None
        for pair in dict.fromkeys(order):
            score = pair_n[pair] / (unit[pair[0]] * unit[pair[1]])
            if best is None or score > best[0]:
                best = (score, pair)
        a, b = best[1]
        new = a + b[2:]
        expected.append(new)
        for w, segs in words.items():
            out, i = [], 0
            while i < len(segs):
                if i + 1 < len(segs) and (segs[i], segs[i + 1]) == (a, b):
                    out.append(new)
                    i += 2
                else:
                    out.append(segs[i])
                    i += 1
            words[w] = out
    alphabet = ["[UNK]", "h", "##u", "##g", "p", "##n", "b", "##s"]
    assert wp.vocab == alphabet + list(dict.fromkeys(expected))
    assert expected[0] == "##gs"   # 5 / (20 * 5): the rare pair of a rare symbol wins, not "##u ##g"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts)
def test_encoding_matches_hf_wordpiece(wp, hf, text) -> None:
    assert hf.encode(text).ids == wp.encode(text)


@settings(max_examples=300, deadline=None)
@given(texts)
def test_pretokenize_matches_hf_bert(text) -> None:
    stock = pre_tokenizers.BertPreTokenizer()
    assert bert_pretokenize(text) == [w for w, _ in stock.pre_tokenize_str(text)]


def test_special_tokens_are_never_split_or_learned(wp) -> None:
    assert wp.vocab[:5] == list(BERT_SPECIAL_TOKENS)
    assert wp.tokens("[CLS]class[SEP]") == ["[CLS]", *wp.tokens("class"), "[SEP]"]
    trained = WordPiece.train("[CLS] a b [SEP] " * 50 + "ab ba", vocab_size=40)
    assert not any("CLS" in t or "SEP" in t for t in trained.vocab[5:])   # never cut into pieces
    assert trained.tokens("[CLS]") == ["[CLS]"] and trained.tokens("CLS") == ["[UNK]"]


def test_decode_glues_continuations(wp) -> None:
    text = "The default value of the attribute"
    assert wp.decode(wp.encode(text)) == text


def test_trained_vocabulary_has_the_requested_size(wp) -> None:
    assert wp.vocab_size == 500 and len(set(wp.vocab)) == 500
    assert "[UNK]" not in wp.tokens(pydoc_topics()[:30_000])   # every training word is spellable


@pytest.mark.parametrize("call, error, match", [
    (lambda: WordPiece(["a", "##b"]), ValueError, r"\[UNK\]"),
    (lambda: WordPiece(["[UNK]", "a", "a"]), ValueError, "duplicate"),
    (lambda: WordPiece(["[UNK]", 3]), TypeError, "str"),
    (lambda: WordPiece(["[UNK]"], special_tokens="[CLS]"), TypeError, "special_tokens"),
    (lambda: WordPiece.train("abc", vocab_size=2), ValueError, "vocab_size"),
    (lambda: WordPiece.train(b"abc", vocab_size=20), TypeError, "text"),
    (lambda: WordPiece(["[UNK]"]).decode([1]), ValueError, "ids"),
    (lambda: bert_pretokenize(None), TypeError, "text"),
])
def test_errors(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


def test_hf_wordpiece_trainer_uses_the_count_rule_instead() -> None:
    """What the chapter says about HF: its WordPieceTrainer merges by BPE's count, so on the same
    words its first merge is the most frequent pair (##u ##g, 20 times), not the best score."""
    from tokenizers import Tokenizer, models, trainers
    counts = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
    text = " ".join(w for w, c in counts.items() for _ in range(c))
    hf = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf_alphabet = 12   # [UNK], b g h n p s u, ##u ##g ##s ##n: HF adds every character both ways
    hf.train_from_iterator([text], trainers.WordPieceTrainer(
        vocab_size=hf_alphabet + 1, special_tokens=["[UNK]"], show_progress=False))
    first_hf = [t for t, i in hf.get_vocab().items() if i == hf_alphabet]
    ours = WordPiece.train(text, vocab_size=8 + 1, special_tokens=["[UNK]"])   # 8: [UNK] + 7
    assert first_hf == ["##ug"] and ours.vocab[-1] == "##gs"


def test_where_unicode_versions_disagree() -> None:
    """Why the property tests above draw from STABLE_CHARS: U+11A3F (Unicode 10) is punctuation
    for this Python, a word character for the older tables inside tokenizers."""
    text = "0\U00011A3F"
    assert unicodedata.category("\U00011A3F") == "Po"
    assert bert_pretokenize(text) == ["0", "\U00011A3F"]
    assert [w for w, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(text)] == [text]
