"""lecture_pkg.shakespeare_tasks.spelling_generation_accuracy against a one-prompt-at-a-time
greedy loop written out from the model's full forward pass (no padding, no cache)."""

from __future__ import annotations

import random

import pytest
import torch

from lecture_pkg.shakespeare_gpt import DEMOS_CHECKPOINT, load_shakespeare_gpt
from lecture_pkg.shakespeare_tasks import (
    SPELLINGS,
    demonstration_text,
    spelling_generation_accuracy,
    spelling_words,
)


def by_hand(model, tokenizer, words, spelling, shots, seed, n, separator=": "):
    rng = random.Random(seed)
    right = 0
    for query in rng.sample(list(words), n):
        demos = rng.sample([w for w in words if w != query], shots)
        ids = tokenizer.encode(demonstration_text(demos, spelling, separator) + query
                               + separator)
        line = []
        for _ in range(10):
            with torch.no_grad():
                nxt = int(model(torch.tensor([ids + line])).logits[0, -1].argmax())
            if tokenizer.decode([nxt]) == "\n":
                right += tokenizer.decode(line) == SPELLINGS[spelling](query)
                break
            line.append(nxt)
    return right / n


@pytest.mark.parametrize("spelling,shots,separator", [("upper", 3, ": "), ("title", 1, ", ")])
def test_batched_generation_equals_the_loop(spelling, shots, separator):
    model, tokenizer = load_shakespeare_gpt(checkpoint=DEMOS_CHECKPOINT)
    words = spelling_words("test")
    got = spelling_generation_accuracy(model, tokenizer, words, spelling, shots, seed=4, n=12,
                                       separator=separator)
    assert got == pytest.approx(by_hand(model, tokenizer, words, spelling, shots, 4, 12,
                                        separator))


def test_the_demonstrations_model_writes_upper_case_and_bad_input_is_refused():
    model, tokenizer = load_shakespeare_gpt(checkpoint=DEMOS_CHECKPOINT)
    words = spelling_words("test")
    assert spelling_generation_accuracy(model, tokenizer, words, "upper", 4, 0, 20) > 0.5
    with pytest.raises(ValueError, match="spelling"):
        spelling_generation_accuracy(model, tokenizer, words, "shout", 4, 0, 20)
    with pytest.raises(ValueError, match="n \\+ shots"):
        spelling_generation_accuracy(model, tokenizer, words[:3], "upper", 4, 0, 20)
