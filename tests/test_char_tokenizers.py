"""lecture_pkg.char_tokenizers: the character vocabularies of the shipped GPT and BERT and the
byte vocabulary of the shipped T5, each checked by round trips and by hand-built ids."""

from __future__ import annotations

import pytest

from lecture_pkg.char_tokenizers import (
    SPECIAL_TOKENS,
    SPECIALS,
    UNK,
    ByteTokenizer,
    CharTokenizer,
    MLMChars,
    normalise,
)


def test_char_tokenizer_sorts_characters_then_appends_special_tokens() -> None:
    tokenizer = CharTokenizer.from_text("ba ab")
    assert tokenizer.itos == [" ", "a", "b", *SPECIAL_TOKENS]
    assert tokenizer.encode("ab<|end|>") == [1, 2, 3 + SPECIAL_TOKENS.index("<|end|>")]
    assert tokenizer.decode(tokenizer.encode("a b<|pad|>")) == "a b<|pad|>"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.encode("c")


def test_mlm_chars_round_trip_and_unknown_characters() -> None:
    vocab = MLMChars.from_text("To be,\n\n\nor not to be.")
    assert vocab.itos[: len(SPECIALS)] == list(SPECIALS)
    ids = vocab.encode("Or not TO be,\n\nto be")
    assert vocab.decode(ids) == "or not to be,\nto be"
    assert vocab.encode("xyz").tolist() == [UNK, UNK, UNK]
    with pytest.raises(ValueError, match="ids"):
        vocab.decode([vocab.vocab_size])
    with pytest.raises(ValueError, match="chars"):
        MLMChars(["a", "a"])
    assert normalise("A\n \n\nB") == "a\nb"


def test_byte_tokenizer_is_utf8_shifted_by_two_with_named_specials() -> None:
    tokenizer = ByteTokenizer(num_sentinels=2)
    assert tokenizer.vocab_size == 2 + 256 + 2
    assert tokenizer.encode("aé") == [ord("a") + 2, 0xC3 + 2, 0xA9 + 2]
    ids = [*tokenizer.encode("aé"), tokenizer.sentinel_ids[0], tokenizer.eos_id]
    assert tokenizer.decode(ids) == "aé<extra_id_0></s>"
    with pytest.raises(ValueError, match="num_sentinels must be at most"):
        ByteTokenizer(num_sentinels=10_000)
    with pytest.raises(ValueError, match="ids must be in"):
        tokenizer.decode([tokenizer.vocab_size])
