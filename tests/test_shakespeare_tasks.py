"""lecture_pkg.shakespeare_tasks: chapter 10's few-shot spelling task, instructions and
preference pairs, checked by hand on small texts and against the training split."""

from __future__ import annotations

import random
import re

import pytest
import torch

from lecture_pkg.data import shakespeare
from lecture_pkg.shakespeare_tasks import (
    SPELLINGS,
    demonstration_text,
    demonstration_windows,
    make_instructions,
    spelling_words,
)


def test_spelling_words_held_out_from_training():
    train, test = spelling_words("train"), spelling_words("test")
    assert len(test) >= 500 and train == sorted(train)
    assert all(w.isalpha() and w.islower() and 4 <= len(w) <= 7 for w in test)
    assert not set(test) & set(train)
    seen = set(re.findall(r"[a-z]+", shakespeare("train").lower()))
    assert not set(test) & seen  # never in the training works, in any case
    with pytest.raises(ValueError, match="split must be"):
        spelling_words("validation")


def test_demonstration_text_and_windows():
    assert demonstration_text(["king", "lord"], "title") == "king: King\nlord: Lord\n"
    assert demonstration_text(["ay"], "upper") == "ay: AY\n"
    assert demonstration_text(["ay"], "lower", separator=" - ") == "ay - ay\n"
    with pytest.raises(ValueError, match="spelling must be one of"):
        demonstration_text(["king"], "reverse")
    with pytest.raises(ValueError, match="separator must be"):
        demonstration_text(["king"], "upper", separator="\n")
    words = ["king", "lord", "queen", "fool"]
    chars = sorted(set("".join(words) + "".join(w.upper() for w in words) + ": -\n"))
    encode = lambda text: [chars.index(c) for c in text]  # noqa: E731
    decode = lambda row: "".join(chars[i] for i in row)  # noqa: E731

    def spelling_and_separator(text: str) -> set[tuple[str, str]]:
        """The (spelling, separator) pairs every complete line of a window agrees with."""
        lines = text.split("\n")[:-1]  # the last line may be cut
        assert lines and text.startswith(tuple(words))
        return {(name, sep) for name, spell in SPELLINGS.items() for sep in (": ", " - ")
                if all(line == f"{w}{sep}{spell(w)}" for line in lines
                       for w in [line.split(sep)[0]])}

    windows = demonstration_windows(words, encode, 30, 40, random.Random(0))
    assert windows.shape == (30, 40) and windows.dtype == torch.long
    fits = [spelling_and_separator(decode(row)) for row in windows.tolist()]
    assert all(fit and {sep for _, sep in fit} == {": "} for fit in fits)
    assert set().union(*fits) >= {(name, ": ") for name in SPELLINGS}  # every spelling
    again = demonstration_windows(words, encode, 30, 40, random.Random(0))
    torch.testing.assert_close(windows, again)
    # several separators: one per window, each of them used
    mixed = demonstration_windows(words, encode, 30, 40, random.Random(0),
                                  separators=(": ", " - "))
    fits = [spelling_and_separator(decode(row)) for row in mixed.tolist()]
    assert all(len({sep for _, sep in fit}) == 1 for fit in fits)
    assert {sep for fit in fits for _, sep in fit} == {": ", " - "}
    with pytest.raises(ValueError, match="separators must not be empty"):
        demonstration_windows(words, encode, 1, 8, random.Random(0), separators=())
    with pytest.raises(ValueError, match="words must not be empty"):
        demonstration_windows([], encode, 1, 8, random.Random(0))
    with pytest.raises(ValueError, match="count must be positive"):
        demonstration_windows(words, encode, 0, 8, random.Random(0))


def test_make_instructions_answers_and_held_out_words():
    text = "Which is a wonder how his Grace\\nshould glean it, since night\\n"
    text = text.replace("\\n", "\n")
    items = make_instructions(text, 6, seed=0)
    assert [it.task for it in items] == ["upper", "reverse", "count"] * 2
    for it in items:
        argument = it.prompt.split(": ", 1)[1]
        expected = {"upper": argument.upper(), "reverse": argument[::-1],
                    "count": str(len(argument.split()))}[it.task]
        assert it.answer == expected
    held_out = make_instructions(text, 20, seed=1, tasks=("upper",), exclude_words={"wonder", "night"})
    # capitalised words (Which, Grace) are not lower-case words; excluded words never appear
    assert {it.answer for it in held_out} <= {"HOW", "HIS", "SHOULD", "GLEAN", "SINCE"}
    with pytest.raises(ValueError, match="tasks must be"):
        make_instructions(text, 2, tasks=("translate",))


def test_pad_right_and_exact_match():
    from lecture_pkg.lm_eval import pad_right
    from lecture_pkg.shakespeare_tasks import Instruction, exact_match

    ids, keep, mask = pad_right([([1, 2, 3], [False, True, True]), ([4], [True])], pad_id=9)
    assert ids.tolist() == [[1, 2, 3], [4, 9, 9]]
    assert keep.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert mask.tolist() == [[False, True, True], [True, False, False]]
    with pytest.raises(ValueError, match=r"examples\[0\] has 2 ids but 1 mask"):
        pad_right([([1, 2], [True])], pad_id=0)
    with pytest.raises(ValueError, match="examples must not be empty"):
        pad_right([], pad_id=0)
    items = [Instruction("upper", "upper: ab", "AB"), Instruction("upper", "upper: cd", "CD"),
             Instruction("count", "count: a", "1")]
    assert exact_match(["AB", "cd", "1"], items) == {"upper": 0.5, "count": 1.0}
    with pytest.raises(ValueError, match="predictions has 2 entries but items 3"):
        exact_match(["AB", "CD"], items)


def test_shakespeare_instructions_hold_out_training_words():
    import re

    from lecture_pkg.data import shakespeare
    from lecture_pkg.shakespeare_tasks import shakespeare_instructions

    train_words = set(re.findall(r"\b[a-z]+\b", shakespeare("train")))
    held_out = shakespeare_instructions("test", 60, seed=1)
    words = {it.prompt.split(": ", 1)[1] for it in held_out if it.task != "count"}
    assert words and not words & train_words
    assert held_out == shakespeare_instructions("test", 60, seed=1)


def test_eight_letter_upper_holds_every_eight_letter_word_once() -> None:
    from lecture_pkg.shakespeare_tasks import eight_letter_upper

    train, test = eight_letter_upper("train"), eight_letter_upper("test")
    words = [item.prompt.removeprefix("upper: ") for item in test]
    assert words == sorted(set(words)) and all(len(w) == 8 and w.islower() for w in words)
    assert all(item.answer == w.upper() and item.task == "upper" for item, w in zip(test, words))
    # the held-out words were never seen in training; the training words all were
    seen = set(re.findall(r"\b[a-z]+\b", shakespeare("train")))
    assert not set(words) & seen
    assert {item.prompt.removeprefix("upper: ") for item in train} <= seen
