"""Two fine-tuning tasks for the book's character BERT (:mod:`lecture_pkg.shakespeare_bert`),
built from the Shakespeare corpus, with the surface rules they are judged against.

* **Case tagging** (token classification): the model reads lower-cased text, as it was
  pretrained, and marks every character that the original prints in upper case (speaker
  labels, the first letter of a verse line or a sentence, "I", names). :func:`case_windows`
  gives windows and their labels, :func:`case_rule` the surface rule, :func:`f1` the score.
* **Who speaks** (extractive question answering, one fixed question): a window holds exactly
  one speaker label ("MENENIUS." on a line of its own); the answer is the span of the name.
  :func:`speaker_windows` gives windows and answers, :func:`speaker_rule` the surface rule.

Texts are passed with their original case and with runs of blank lines collapsed
(:func:`collapse_blank_lines`), so that character ``i`` of a window is token ``i`` of
``MLMChars.encode(window)``.

::

    text = collapse_blank_lines(shakespeare("validation"))
    windows, upper = case_windows(text, 256, 64, starts="spaced")
    score = f1([case_rule(w.lower(), max_label=15) for w in windows], upper)
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from lecture_pkg.checks import check_int

__all__ = ["SPEAKER_LABEL", "SpeakerItem", "case_rule", "case_windows", "collapse_blank_lines",
           "f1", "speaker_rule", "speaker_windows"]

# a speaker label: a line of upper-case words ending in a full stop ("FIRST CITIZEN.")
SPEAKER_LABEL = re.compile(r"^[A-Z][A-Z' ]*[A-Z]\.$", re.MULTILINE)


def collapse_blank_lines(text: str) -> str:
    """``text`` with every run of blank lines collapsed into one line break: the character BERT's
    normalisation (:func:`lecture_pkg.char_tokenizers.normalise`) without the lower-casing."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return re.sub(r"\n\s*\n+", "\n", text)


def _starts(text: str, n: int, length: int, starts: str, generator: torch.Generator | None
            ) -> list[int]:
    check_int("n", n, minimum=1)
    check_int("length", length, minimum=2)
    if len(text) < length:
        raise ValueError(f"text holds {len(text)} characters, fewer than length {length}")
    if starts == "spaced":  # spread over the whole text, not its first works only
        return torch.linspace(0, len(text) - length, n).long().tolist()
    if starts == "random":
        return torch.randint(len(text) - length + 1, (n,), generator=generator).tolist()
    raise ValueError(f"starts must be 'random' or 'spaced', got {starts!r}")


def case_windows(text: str, n: int, length: int, starts: str = "random",
                 generator: torch.Generator | None = None) -> tuple[list[str], Tensor]:
    """``n`` windows of ``length`` characters of ``text`` (original case), at random offsets or
    ``"spaced"`` evenly over the text. Returns (the windows, their labels (n, length) bool: True
    where the character is upper case)."""
    windows = [text[s:s + length] for s in _starts(text, n, length, starts, generator)]
    return windows, torch.tensor([[c.isupper() for c in w] for w in windows])


def case_rule(window: str, max_label: int) -> list[bool]:
    """The surface rule for case tagging, on a lower-cased ``window``: upper case for the first
    letter of every line and of every sentence (after ``.``, ``!`` or ``?`` and a space), for
    the word "i" (also in "i'll"), and for every letter of a line of at most ``max_label``
    characters that ends in a full stop and lies wholly inside the window (a speaker label;
    0 turns this part off). Returns one bool per character."""
    check_int("max_label", max_label)
    upper = [False] * len(window)
    lines, offset = window.split("\n"), 0
    for index, line in enumerate(lines):
        whole = 0 < index < len(lines) - 1  # its start and end are both inside the window
        if whole and 1 < len(line) <= max_label and line.endswith("."):
            for k, c in enumerate(line):
                upper[offset + k] = c.isalpha()
        elif index > 0:
            first = re.search(r"[a-z]", line)
            if first:
                upper[offset + first.start()] = True
        offset += len(line) + 1
    for m in re.finditer(r"[.!?] +([a-z])", window):
        upper[m.start(1)] = True
    for m in re.finditer(r"(?<![a-z'])i(?![a-z])", window):
        upper[m.start()] = True
    return upper


def f1(predicted: Sequence[Sequence[bool]] | Tensor, gold: Tensor) -> float:
    """F1 of the positive class (upper case) over all positions: predicted and gold (n, t)."""
    predicted = torch.as_tensor(predicted, dtype=torch.bool)
    gold = torch.as_tensor(gold, dtype=torch.bool)
    if predicted.shape != gold.shape:
        raise ValueError(f"predicted has shape {tuple(predicted.shape)} but gold "
                         f"{tuple(gold.shape)}")
    tp = int((predicted & gold).sum())
    wrong = int((predicted ^ gold).sum())
    if tp + wrong == 0:
        raise ValueError("gold and predicted hold no positive position")
    return 2 * tp / (2 * tp + wrong)


class SpeakerItem(NamedTuple):
    """A window (original case) and its answer: the name's first and last character (inclusive,
    the full stop left out)."""

    window: str
    start: int
    end: int


def speaker_windows(text: str, n: int, length: int, seed: int) -> list[SpeakerItem]:
    """``n`` windows of ``length`` characters of ``text`` that hold exactly one whole speaker
    label (:data:`SPEAKER_LABEL`), placed at a random position of the window; drawn with
    ``random.Random(seed)``."""
    check_int("n", n, minimum=1)
    check_int("length", length, minimum=2)
    labels = [m for m in SPEAKER_LABEL.finditer(text) if m.end() - m.start() < length - 2]
    if not labels:
        raise ValueError("text holds no speaker label shorter than the window")
    rng, items = random.Random(seed), []
    while len(items) < n:
        label = rng.choice(labels)
        start = label.start() - rng.randrange(length - (label.end() - label.start()) - 1)
        window = text[max(start, 0):max(start, 0) + length]
        found = list(SPEAKER_LABEL.finditer(window))
        if len(window) == length and len(found) == 1 and found[0].start() > 0:
            items.append(SpeakerItem(window, found[0].start(), found[0].end() - 2))
    return items


def speaker_rule(window: str, max_label: int) -> tuple[int, int]:
    """The surface rule for "who speaks", on a lower-cased ``window``: the first line wholly
    inside the window of at most ``max_label`` characters that ends in a full stop. Returns its
    (first, last) character without the full stop, or (-1, -1) when there is none."""
    check_int("max_label", max_label)
    lines, offset = window.split("\n"), 0
    for index, line in enumerate(lines):
        if 0 < index < len(lines) - 1 and 1 < len(line) <= max_label and line.endswith("."):
            return offset, offset + len(line) - 2
        offset += len(line) + 1
    return -1, -1
