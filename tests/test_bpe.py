"""Tests for lecture_pkg.bpe: the lecture's worked examples, the incremental trainer against the
recount reference and an explicit tie rule, and byte-level BPE against HuggingFace tokenizers."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers

from lecture_pkg.bpe import (
    ByteLevelBPE,
    apply_bpe,
    bpe_steps,
    bytes_to_unicode,
    iter_merges,
    iter_merges_recount,
    learn_bpe,
    learned_vocabulary,
    merge_pair,
    pair_counts,
    pretokenize,
    split_on_special_tokens,
    word_counts,
)
from lecture_pkg.data import pydoc_topics

SLIDE_WORDS = {"low": 5, "lower": 2, "newest": 6, "widest": 3}
SLIDE_MERGES = [("e", "s"), ("es", "t"), ("est", "</w>"), ("l", "o"), ("lo", "w"), ("n", "e"),
                ("ne", "w"), ("new", "est</w>"), ("low", "</w>"), ("w", "i")]
ABWASSER_MERGES = [tuple(m.split()) for m in [
    "A b", "a s", "e r", "s er", "w as", "Ab was", "Abwas ser", "B e", "a n", "d l", "h an", "n g",
    "u ng", "Be han", "dl ung", "Behan dlung", "A n", "a g", "l ag"]]


# ---------------------------------------------------------------- the lecture's worked examples

def test_slides_merges_and_vocabulary() -> None:
    for trainer in ("incremental", "recount"):
        assert learn_bpe(SLIDE_WORDS, 10, trainer=trainer) == SLIDE_MERGES
    vocab = learned_vocabulary(SLIDE_WORDS, SLIDE_MERGES)
    assert vocab == "l o w </w> e r n s t i d es est est</w> lo low ne new newest</w> low</w> wi".split()
    assert len(vocab) == 11 + 10   # initial vocabulary + number of merges


def test_slides_pair_tables() -> None:
    """The rows the slides show of the first four pair-count tables. The fourth slide writes
    `d es` 3; after the third merge that pair is `d est</w>`, with the same count."""
    segs = [list(w) + ["</w>"] for w in SLIDE_WORDS]
    counts = list(SLIDE_WORDS.values())
    shown = [{("l", "o"): 7, ("o", "w"): 7, ("e", "s"): 9, ("t", "</w>"): 9},
             {("l", "o"): 7, ("o", "w"): 7, ("es", "t"): 9, ("t", "</w>"): 9},
             {("l", "o"): 7, ("o", "w"): 7, ("est", "</w>"): 9, ("d", "est"): 3},
             {("l", "o"): 7, ("o", "w"): 7, ("w", "est</w>"): 6, ("d", "est</w>"): 3}]
    for step, rows in enumerate(shown):
        table = pair_counts(segs, counts)
        assert {pair: table[pair] for pair in rows} == rows
        segs = [merge_pair(s, SLIDE_MERGES[step]) for s in segs]


def test_slides_final_segmentation() -> None:
    final = [apply_bpe(w, SLIDE_MERGES) for w in SLIDE_WORDS]
    assert final == [["low</w>"], ["low", "e", "r", "</w>"], ["newest</w>"], ["wi", "d", "est</w>"]]


def test_abwasser_segmentation() -> None:
    tokens = apply_bpe("Abwasserbehandlungsanlage", ABWASSER_MERGES)
    assert tokens == "Abwasser b e han dlung s an lag e </w>".split()
    steps = list(bpe_steps("Abwasserbehandlungsanlage", ABWASSER_MERGES))
    assert " ".join(steps[0][1]) == "Ab w a s s e r b e h a n d l u n g s a n l a g e </w>"
    assert steps[-1][1] == tokens
    used = [pair for pair, _ in steps]
    assert ("B", "e") not in used and ("A", "n") not in used   # capital letters never occur there
    assert used.count(("a", "n")) == 2                          # "han" and "san" both merge


def test_a_repeated_merge_keeps_its_earliest_rank() -> None:
    """Training can list a pair twice (two merges that build the same string); the pair keeps
    its best rank. Letting the later rank win would give `a bc </w>` here."""
    merges = [("a", "b"), ("b", "c"), ("a", "b")]
    assert apply_bpe("abc", merges) == ["ab", "c", "</w>"]
    assert [pair for pair, _ in bpe_steps("abc", merges)] == [("a", "b")]


def test_merge_pair_is_left_to_right() -> None:
    assert merge_pair(list("aaa"), ("a", "a")) == ["aa", "a"]
    assert merge_pair(list("abab"), ("a", "b")) == ["ab", "ab"]
    assert merge_pair(list("ba"), ("a", "b")) == ["b", "a"]
    assert merge_pair(["a", "##b", "a"], ("a", "##b"), into="ab") == ["ab", "a"]


# ---------------------------------------------------------------- trainers

def explicit_tie_rule_merges(words: list[list[str]], counts: list[int]) -> list[tuple[str, str]]:
    """Brute force with the tie rule spelled out: position = (word index, symbol index)."""
    segs = [list(w) for w in words]
    merges = []
    while True:
        best_key, best_pair = None, None
        for w, seg in enumerate(segs):
            for i in range(len(seg) - 1):
                pair = (seg[i], seg[i + 1])
                total = sum(c * sum(1 for j in range(len(s) - 1) if (s[j], s[j + 1]) == pair)
                            for s, c in zip(segs, counts))
                key = (-total, w, i)
                if best_key is None or key < best_key:
                    best_key, best_pair = key, pair
        if best_pair is None:
            return merges
        merges.append(best_pair)
        a, b = best_pair
        new_segs = []
        for seg in segs:
            out, i = [], 0
            while i < len(seg):
                if i + 1 < len(seg) and seg[i] == a and seg[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(seg[i])
                    i += 1
            new_segs.append(out)
        segs = new_segs


def corpora(alphabet: list[str], max_words: int = 12, max_len: int = 14):
    return st.lists(st.tuples(st.lists(st.sampled_from(alphabet), min_size=1, max_size=max_len),
                              st.integers(1, 5)), max_size=max_words)


@settings(max_examples=300, deadline=None)
@given(st.one_of(corpora(["a"]), corpora(["a", "b"]), corpora(["a", "b", "ab", "</w>"]),
                 corpora(list("abcdefg"), max_len=8)))
def test_incremental_trainer_matches_recount_and_tie_rule(corpus) -> None:
    words, counts = [w for w, _ in corpus], [c for _, c in corpus]
    fast = list(iter_merges(words, counts))
    assert fast == list(iter_merges_recount(words, counts))
    if sum(len(w) for w in words) <= 40:   # the brute force is quartic
        assert fast == explicit_tie_rule_merges(words, counts)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(st.sampled_from("abcde"), min_size=1, max_size=8), st.integers(1, 9),
                       max_size=10),
       st.integers(0, 40))
def test_learn_bpe_trainers_agree_and_training_words_reproduce(wc, num_merges) -> None:
    merges = learn_bpe(wc, num_merges)
    assert merges == learn_bpe(wc, num_merges, trainer="recount")
    assert len(merges) <= num_merges
    # applying the merges to a training word gives the segmentation training ended with
    segs = [list(w) + ["</w>"] for w in wc]
    for pair in merges:
        segs = [merge_pair(s, pair) for s in segs]
    assert [apply_bpe(w, merges) for w in wc] == segs


def test_learn_bpe_stops_when_no_pair_is_left() -> None:
    merges = learn_bpe({"ab": 3, "b": 1}, 100)
    assert merges == [("b", "</w>"), ("a", "b</w>")]   # (b, </w>) occurs 3 + 1 times


def test_trainer_on_real_text_matches_recount() -> None:
    wc = word_counts(pydoc_topics()[:20_000])
    assert learn_bpe(wc, 60) == learn_bpe(wc, 60, trainer="recount")


def test_apply_bpe_to_unseen_words() -> None:
    assert apply_bpe("lowest", SLIDE_MERGES) == ["low", "est</w>"]
    assert apply_bpe("newer", SLIDE_MERGES) == ["new", "e", "r", "</w>"]
    assert apply_bpe("x", SLIDE_MERGES) == ["x", "</w>"]
    assert apply_bpe("low", SLIDE_MERGES, end_of_word="") == ["low"]


@pytest.mark.parametrize("call, error, match", [
    (lambda: learn_bpe(SLIDE_WORDS, -1), ValueError, "num_merges must be >= 0"),
    (lambda: learn_bpe(SLIDE_WORDS, 2.5), TypeError, "num_merges must be an int"),
    (lambda: learn_bpe({"low": 0}, 3), ValueError, "positive"),
    (lambda: learn_bpe({"low": -2}, 3), ValueError, "positive"),
    (lambda: learn_bpe({"low": 1.0}, 3), TypeError, "int"),
    (lambda: learn_bpe({"low": True}, 3), TypeError, "int"),
    (lambda: learn_bpe({3: 1}, 3), TypeError, "str"),
    (lambda: learn_bpe({"": 1}, 3), ValueError, "empty"),
    (lambda: learn_bpe(["low", "lower"], 3), TypeError, "mapping"),
    (lambda: learn_bpe(SLIDE_WORDS, 3, end_of_word=None), TypeError, "end_of_word"),
    (lambda: learn_bpe(SLIDE_WORDS, 3, trainer="fast"), ValueError, "trainer"),
    (lambda: apply_bpe(42, SLIDE_MERGES), TypeError, "word"),
    (lambda: apply_bpe("", SLIDE_MERGES), ValueError, "word"),
    (lambda: apply_bpe("low", [("l", "o", "w")]), TypeError, r"merges\[0\]"),
    (lambda: list(iter_merges([["a", "b"]], [1, 2])), ValueError, "counts"),
    (lambda: word_counts(b"bytes"), TypeError, "text"),
])
def test_classic_errors(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------- byte-level BPE

@pytest.fixture(scope="module")
def tok() -> ByteLevelBPE:
    return ByteLevelBPE().train(pydoc_topics()[:60_000], vocab_size=700)


@pytest.fixture(scope="module")
def hf(tok):
    return tok.to_hf_tokenizer()


CORPUS_LINES = pydoc_topics()[60_000:120_000].splitlines()
SPECIAL = ["Hello, y'all! How are you 😊 ?", "Abwasserbehandlungsanlage", "naïve café, Ørsted, ß",
           "東京は日本の首都です。", "e\u0301 (combining accent)", "  leading   and trailing  \n\n\t",
           "x = 3.14159e-10; y='it's'", "\r\n\u2028\u00a0\u3000", "", "🧑🏽‍💻 ZWJ sequence"]
any_text = st.one_of(
    st.text(),                                                      # arbitrary Unicode
    st.lists(st.sampled_from(CORPUS_LINES + SPECIAL), max_size=4).map("\n".join),
    st.lists(st.one_of(st.text(max_size=5), st.sampled_from(SPECIAL)), max_size=6).map("".join),
)


def test_byte_alphabet_is_a_bijection() -> None:
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert table[ord(" ")] == "Ġ" and table[ord("A")] == "A"


def test_training_reaches_vocab_size_and_uses_the_shared_trainer(tok) -> None:
    assert tok.vocab_size == 700 and len(tok.merges) == 700 - 256
    text = pydoc_topics()[:5_000]
    small = ByteLevelBPE().train(text, vocab_size=300)
    pieces = {}
    for p in pretokenize(text):
        pieces[p] = pieces.get(p, 0) + 1
    table = bytes_to_unicode()
    words = [[table[b] for b in p.encode()] for p in pieces]
    assert small.merges == list(iter_merges_recount(words, list(pieces.values())))[:44]
    # a smaller vocabulary is a prefix of a larger one
    assert ByteLevelBPE().train(text, vocab_size=280).merges == small.merges[:24]


def test_byte_level_repeated_merge_keeps_its_earliest_rank() -> None:
    """A merges list with a pair twice: the class keeps one merge per pair, at its first rank,
    and the HF export (whose BPE model would let a later duplicate win) encodes alike."""
    tok = ByteLevelBPE([("a", "b"), ("b", "c"), ("a", "b")])
    assert tok.merges == [("a", "b"), ("b", "c")] and tok.vocab_size == 258
    assert tok.tokens("abc") == ["ab", "c"]
    hf = tok.to_hf_tokenizer()
    for text in ["abc", "abcabc bc ab", "cabbc"]:
        assert hf.encode(text).ids == tok.encode(text)


def test_special_tokens_are_never_merged() -> None:
    """GPT-2's <|endoftext|>: cut out before pre-tokenization, so training never merges into it and
    encoding gives it one id (the last ones), in our class and in the HF export alike."""
    eot = "<|endoftext|>"
    text = (pydoc_topics()[:300] + eot) * 20
    tok = ByteLevelBPE(special_tokens=[eot, "<|pad|>"]).train(text, vocab_size=400)
    assert tok.vocab_size == 256 + len(tok.merges) + 2 and tok.vocab[-2:] == [eot, "<|pad|>"]
    assert not any("|" in a + b for a, b in tok.merges)        # "|" occurs only inside the specials
    probe = f"end.{eot}Start <|pad|>{eot}< |endoftext|>"
    ids = tok.encode(probe)
    eot_id, pad_id = tok.vocab_size - 2, tok.vocab_size - 1
    assert ids.count(eot_id) == 2 and ids.count(pad_id) == 1 and tok.decode(ids) == probe
    assert tok.encode("< |endoftext|>") == ids[-len(tok.encode("< |endoftext|>")):]   # no match: bytes
    hf = tok.to_hf_tokenizer()
    assert hf.encode(probe).ids == ids and hf.decode(ids, skip_special_tokens=False) == probe
    plain = ByteLevelBPE().train(text, vocab_size=400)
    assert ("<", "|") in plain.merges                           # without: the marker gets merged


def test_split_on_special_tokens_prefers_the_longest() -> None:
    assert split_on_special_tokens("a<s><ss>b", ["<s>", "<ss>"]) == [
        ("a", False), ("<s>", True), ("<ss>", True), ("b", False)]
    assert split_on_special_tokens("", ["<s>"]) == [] and split_on_special_tokens("x", []) == [("x", False)]


def test_special_tokens_survive_save_and_load(tmp_path) -> None:
    tok = ByteLevelBPE([("a", "b")], special_tokens=["<s>"])
    tok.save(tmp_path / "t.json")
    loaded = ByteLevelBPE.load(tmp_path / "t.json")
    assert loaded.special_tokens == ["<s>"] and loaded.encode("ab<s>") == tok.encode("ab<s>") == [256, 257]


def test_tiny_corpus_stops_early() -> None:
    small = ByteLevelBPE().train("aaab", vocab_size=1000)
    assert small.merges == [("a", "a"), ("aa", "a"), ("aaa", "b")] and small.vocab_size == 259


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(any_text)
def test_round_trip_and_id_range(tok, text) -> None:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert len(ids) <= len(text.encode("utf-8"))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(any_text)
def test_hf_export_encodes_identically(tok, hf, text) -> None:
    ids = tok.encode(text)
    assert hf.encode(text).ids == ids
    assert hf.decode(ids) == text


def test_hf_export_on_corpus_text(tok, hf) -> None:
    text = pydoc_topics()[120_000:220_000]
    assert hf.encode(text).ids == tok.encode(text)
    assert [hf.id_to_token(i) for i in range(tok.vocab_size)] == tok.vocab


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 699), max_size=30))
def test_decode_matches_hf_on_any_ids(tok, hf, ids) -> None:
    """Arbitrary ids can cut UTF-8 sequences apart: both replace the broken bytes alike."""
    assert tok.decode(ids) == hf.decode(ids)


# Characters that Unicode 3.2 already had, in the same major category as today: HuggingFace's own
# GPT-2 regex (Oniguruma, its own Unicode tables) must split them exactly as our expanded pattern.
STABLE_CHARS = [chr(cp) for cp in range(0x30000)
                if not 0xD800 <= cp < 0xE000
                and unicodedata.ucd_3_2_0.category(chr(cp)) != "Cn"
                and unicodedata.ucd_3_2_0.category(chr(cp))[0] == unicodedata.category(chr(cp))[0]]


TRICKY_CHARS = " \n\t\r'sdl0.\x1c\x1f\x85\xa0\u2028\u3000"   # apostrophes, digits, several kinds of space


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(STABLE_CHARS) | st.sampled_from(TRICKY_CHARS), max_size=40).map("".join))
def test_pretokenize_matches_hf_gpt2_regex(text) -> None:
    stock = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    table = bytes_to_unicode()
    ours = ["".join(table[b] for b in piece.encode()) for piece in pretokenize(text)]
    assert ours == [piece for piece, _ in stock.pre_tokenize_str(text)]
    assert "".join(pretokenize(text)) == text


def test_hf_export_where_unicode_versions_disagree() -> None:
    """Python's unicodedata and tokenizers' regex engine know different Unicode versions, so the stock
    GPT-2 regex of tokenizers splits some strings unlike ours ("a" and a letter new to tokenizers
    form one pre-token there, two here). Merges that glue "a" to any UTF-8 lead byte make such a split
    change the ids; the export must still match ours."""
    stock = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    table = bytes_to_unicode()
    probes = [f"a{chr(cp)}1" for cp in range(0x80, 0x20000) if not 0xD800 <= cp < 0xE000]
    differ = [text for text in probes
              if [piece for piece, _ in stock.pre_tokenize_str(text)]
              != ["".join(table[b] for b in piece.encode()) for piece in pretokenize(text)]]
    if tuple(map(int, unicodedata.unidata_version.split("."))) < (16, 0):
        assert differ   # letters new in Unicode 16 (U+1C89, ...), which tokenizers' engine knows
    glue = ByteLevelBPE([("a", table[lead]) for lead in range(0xC2, 0xF5)])
    exported = glue.to_hf_tokenizer()
    for text in differ:
        assert ([piece for piece, _ in exported.pre_tokenizer.pre_tokenize_str(text)]
                == ["".join(table[b] for b in piece.encode()) for piece in pretokenize(text)])
        assert exported.encode(text).ids == glue.encode(text)


def test_save_load_round_trip(tok, tmp_path) -> None:
    path = tmp_path / "bpe.json"
    tok.save(path)
    loaded = ByteLevelBPE.load(path)
    assert loaded.merges == tok.merges and loaded.vocab == tok.vocab
    text = pydoc_topics()[:3_000] + " 😊"
    assert loaded.encode(text) == tok.encode(text)
    assert json.loads(path.read_text(encoding="utf-8"))["merges"][0] == list(tok.merges[0])


def test_encode_cache_is_bounded() -> None:
    small = ByteLevelBPE(cache_size=3).train("a b c d e f g " * 3, vocab_size=260)
    small.encode("a b c d e f g h i")
    assert len(small._cache) == 3


@pytest.mark.parametrize("call, error, match", [
    (lambda: ByteLevelBPE().train("abc", vocab_size=255), ValueError, "vocab_size must be >= 256"),
    (lambda: ByteLevelBPE().train("abc", vocab_size="300"), TypeError, "vocab_size must be an int"),
    (lambda: ByteLevelBPE().train(["abc"], vocab_size=300), TypeError, "text"),
    (lambda: ByteLevelBPE().encode(None), TypeError, "text"),
    (lambda: ByteLevelBPE().decode([256]), ValueError, r"\[0, 256\)"),
    (lambda: ByteLevelBPE().decode([-1]), ValueError, "ids"),
    (lambda: ByteLevelBPE().decode(["a"]), ValueError, "ids"),
    (lambda: ByteLevelBPE([("a", "zz")]), ValueError, r"merges\[0\]"),
    (lambda: ByteLevelBPE(cache_size=-1), ValueError, "cache_size"),
    (lambda: ByteLevelBPE(special_tokens="<s>"), TypeError, "special_tokens"),
    (lambda: ByteLevelBPE(special_tokens=["<s>", "<s>"]), ValueError, "duplicates"),
    (lambda: ByteLevelBPE(special_tokens=["a"]), ValueError, "ordinary token"),
    (lambda: ByteLevelBPE(special_tokens=["<s>"]).train("abc", vocab_size=256), ValueError, "vocab_size"),
])
def test_byte_level_errors(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


def test_load_rejects_foreign_json(tmp_path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"model": {"type": "BPE"}}))
    with pytest.raises(ValueError, match="ByteLevelBPE.save"):
        ByteLevelBPE.load(path)


# ---------------------------------------------------------------- the other tie rule: greatest pair

def greatest_pair_reference(words: list[list[bytes]], counts: list[int], num_merges: int
                            ) -> list[tuple[bytes, bytes]]:
    """A plain trainer on byte strings in the style of CS336's assignment and subword-nmt:
    recount, take max over (count, (first bytes, second bytes)), merge everywhere.
    words: each word's initial symbols as byte strings."""
    words = [list(word) for word in words]
    merges = []
    for _ in range(num_merges):
        totals: dict[tuple[bytes, bytes], int] = {}
        for word, n in zip(words, counts):
            for pair in zip(word, word[1:]):
                totals[pair] = totals.get(pair, 0) + n
        if not totals:
            break
        best = max(totals, key=lambda pair: (totals[pair], pair))
        merges.append(best)
        for k, word in enumerate(words):
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            words[k] = out
    return merges


def test_greatest_tie_rule_on_the_lectures_words() -> None:
    """e s, s t and t </w> all occur 9 times: the lectures' rule takes the first seen (e s),
    the greatest-pair rule t </w> (t > s > e)."""
    for trainer in ("incremental", "recount"):
        assert learn_bpe(SLIDE_WORDS, 1, trainer=trainer) == [("e", "s")]
        assert learn_bpe(SLIDE_WORDS, 1, trainer=trainer, tie_break="greatest") == [("t", "</w>")]
    assert learn_bpe({"ab": 1, "cd": 1}, 1, end_of_word="", tie_break="greatest") == [("c", "d")]
    assert learn_bpe({"ab": 1, "cd": 1}, 1, end_of_word="") == [("a", "b")]


@pytest.mark.parametrize("seed", range(4))
def test_greatest_tie_rule_trainers_agree_with_the_reference(seed: int) -> None:
    import random

    rng = random.Random(seed)
    counts = {"".join(rng.choice("abcé") for _ in range(rng.randint(1, 6))): rng.randint(1, 3)
              for _ in range(25)}
    fast = learn_bpe(counts, 40, end_of_word="", tie_break="greatest")
    slow = learn_bpe(counts, 40, end_of_word="", trainer="recount", tie_break="greatest")
    ref = greatest_pair_reference([[c.encode() for c in w] for w in counts],
                                  list(counts.values()), 40)
    assert fast == slow
    assert [(a.encode(), b.encode()) for a, b in fast] == ref[:len(fast)]
    assert fast != learn_bpe(counts, 40, end_of_word="")  # the rule does change the merges


def test_byte_level_greatest_rule_compares_bytes_not_characters() -> None:
    """A space is byte 0x20 but the character Ġ (U+0120) in token strings: by bytes
    (z, x) > (space, z); by the token strings it would be the other way round."""
    tok = ByteLevelBPE().train(" x zx", vocab_size=257, tie_break="greatest")
    assert tok.merges == [("z", "x")]
    assert ByteLevelBPE().train(" x zx", vocab_size=257).merges == [("Ġ", "x")]
    text = pydoc_topics()[:3000]
    tok = ByteLevelBPE().train(text, vocab_size=256 + 60, tie_break="greatest")
    pieces = {}
    for piece in pretokenize(text):
        pieces[piece] = pieces.get(piece, 0) + 1
    ref = greatest_pair_reference([[bytes([b]) for b in p.encode()] for p in pieces],
                                  list(pieces.values()), 60)
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    ours = [tuple(bytes(byte_of[c] for c in s) for s in pair) for pair in tok.merges]
    assert ours == ref[:len(ours)] and len(ours) == 60
    assert tok.decode(tok.encode(text)) == text


def test_tie_break_errors() -> None:
    with pytest.raises(ValueError, match="tie_break must be 'first' or 'greatest'"):
        learn_bpe(SLIDE_WORDS, 3, tie_break="last")
    with pytest.raises(ValueError, match="tie_break"):
        ByteLevelBPE().train("abc", 260, tie_break="smallest")
