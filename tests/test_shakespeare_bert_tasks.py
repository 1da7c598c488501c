"""lecture_pkg.shakespeare_bert_tasks on hand-made windows whose answers are known, and on the
corpus (labels aligned with the character BERT's tokens, answers inside the windows)."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.char_tokenizers import MLMChars
from lecture_pkg.data import shakespeare
from lecture_pkg.shakespeare_bert import shakespeare_bert_info
from lecture_pkg.shakespeare_bert_tasks import (
    case_rule,
    case_windows,
    collapse_blank_lines,
    f1,
    speaker_rule,
    speaker_windows,
)

WINDOW = "ll tell you.\nMENENIUS.\nWhat then? I will speak. Go, I'll go\nSo"


def test_case_rule_on_a_hand_made_window() -> None:
    gold = [c.isupper() for c in WINDOW]
    guess = case_rule(WINDOW.lower(), max_label=15)
    # every upper-case letter here follows one of the rule's patterns, and nothing else does
    assert guess == gold
    assert sum(guess) == 8 + 5  # "MENENIUS", then W, I, G, I'll and S
    # the 'i' of "i' faith" is lower case in the original: the rule's one false positive kind
    with_i = "x\nab.\nno, i' faith\ny"
    assert case_rule(with_i, 0)[with_i.index("i'")] is True
    # without the label part, the name gets only its first letter (a line start)
    short = case_rule(WINDOW.lower(), max_label=0)
    assert sum(short[WINDOW.index("M"):WINDOW.index("M") + 8]) == 1
    # a label cut by the window's edge is not a whole line: only line-start capitals
    assert case_rule("enenius.\nwhat", 15)[:8] == [False] * 8


def test_f1_counts() -> None:
    gold = torch.tensor([[True, True, False, False]])
    assert f1([[True, False, True, False]], gold) == pytest.approx(0.5)  # tp 1, fp 1, fn 1
    assert f1(gold, gold) == 1.0
    with pytest.raises(ValueError, match="predicted has shape"):
        f1([[True]], gold)
    with pytest.raises(ValueError, match="no positive"):
        f1([[False] * 4], torch.zeros(1, 4, dtype=torch.bool))


def test_speaker_rule_on_hand_made_windows() -> None:
    start = WINDOW.index("MENENIUS")
    assert speaker_rule(WINDOW.lower(), 15) == (start, start + 7)
    assert WINDOW[start:start + 8] == "MENENIUS"
    # too short a max_label misses it; a short sentence on its own line fools a long one
    assert speaker_rule(WINDOW.lower(), 5) == (-1, -1)
    fooled = "e.\ngo home, sir.\nmenenius.\nwe"
    assert speaker_rule(fooled, 15) == (3, 14)
    assert speaker_rule(fooled, 10) == (fooled.index("menenius"), fooled.index("s.\nwe"))
    with pytest.raises(TypeError, match="max_label must be an int"):
        speaker_rule(WINDOW, 1.5)


def test_windows_from_the_corpus_align_with_the_tokens() -> None:
    text = collapse_blank_lines(shakespeare("validation"))
    assert "\n\n" not in text
    vocab = MLMChars(shakespeare_bert_info()["chars"])
    windows, upper = case_windows(text, 16, 64, starts="spaced")
    assert upper.shape == (16, 64) and upper.dtype == torch.bool
    for window, row in zip(windows, upper):
        assert len(vocab.encode(window)) == len(window) == 64  # character i is token i
        assert row.tolist() == [c.isupper() for c in window]
    assert windows[0] == text[:64] and windows[-1] == text[-64:]
    again, _ = case_windows(text, 4, 64, generator=torch.Generator().manual_seed(3))
    assert again == case_windows(text, 4, 64, generator=torch.Generator().manual_seed(3))[0]
    items = speaker_windows(text, 32, 64, seed=1)
    assert items == speaker_windows(text, 32, 64, seed=1)
    for window, start, end in items:
        assert len(window) == 64 and 0 < start <= end < 63
        assert window[end + 1] == "." and window[start - 1] == "\n"
        assert window[start:end + 1].isupper()


def test_argument_checks() -> None:
    with pytest.raises(ValueError, match="starts must be"):
        case_windows("abc" * 30, 2, 10, starts="first")
    with pytest.raises(ValueError, match="fewer than length"):
        case_windows("abc", 2, 10)
    with pytest.raises(ValueError, match="no speaker label"):
        speaker_windows("no label here\n" * 10, 2, 64, seed=0)
    with pytest.raises(TypeError, match="text must be a str"):
        collapse_blank_lines(b"x")
