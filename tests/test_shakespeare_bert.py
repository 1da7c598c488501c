"""lecture_pkg.shakespeare_bert and its vocabulary (char_tokenizers.MLMChars): RoBERTa-style
batches, the count rules (against a plain-Python reference) and the shipped checkpoint's recorded held-out figure."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from lecture_pkg.char_tokenizers import MASK
from lecture_pkg.data import shakespeare
from lecture_pkg.masks import IGNORE_INDEX
from lecture_pkg.shakespeare_bert import (
    CountRules,
    held_out_batch,
    load_shakespeare_bert,
    masked_accuracy,
    mlm_predict,
    random_batch,
    shakespeare_bert_info,
)


def test_random_batch_is_contiguous_text_with_a_fresh_mask() -> None:
    ids = torch.arange(10, 1010)  # every window of it is an arithmetic sequence
    inputs, labels = random_batch(ids, 8, 16, 1100, generator=torch.Generator().manual_seed(0))
    assert inputs.shape == labels.shape == (8, 16)
    original = torch.where(labels == IGNORE_INDEX, inputs, labels)
    assert (original.diff(dim=1) == 1).all()
    again, _ = random_batch(ids, 8, 16, 1100, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(again, inputs)
    with pytest.raises(ValueError, match="ids"):
        random_batch(ids.float(), 8, 16, 1100)
    with pytest.raises(ValueError, match="length"):
        random_batch(ids[:10], 8, 16, 1100)


def test_held_out_batch_is_fixed_and_consecutive() -> None:
    ids = torch.arange(5, 505)
    a = held_out_batch(ids, 10, 50, 600)
    b = held_out_batch(ids, 10, 50, 600)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    original = torch.where(a[1] == IGNORE_INDEX, a[0], a[1])
    assert torch.equal(original.flatten(), ids)
    with pytest.raises(ValueError, match="windows"):
        held_out_batch(ids, 11, 50, 600)


def reference_rules(stream: list[int], inputs: list[list[int]]) -> dict[str, list[list[int]]]:
    """The three rules written out with Counters, position by position."""
    unigram = max(Counter(stream).items(), key=lambda kv: (kv[1], kv[0]))[0]
    between: dict[tuple[int, int], Counter] = {}
    after: dict[int, Counter] = {}
    for a, m, b in zip(stream, stream[1:], stream[2:]):
        between.setdefault((a, b), Counter())[m] += 1
    for a, m in zip(stream, stream[1:]):
        after.setdefault(a, Counter())[m] += 1

    def best(counter: Counter) -> int:
        return max(counter.items(), key=lambda kv: (kv[1], kv[0]))[0]

    out: dict[str, list[list[int]]] = {"unigram": [], "copy": [], "neighbours": []}
    for row in inputs:
        out["unigram"].append([unigram] * len(row))
        out["copy"].append([unigram if x == MASK else x for x in row])
        guesses = []
        for i, x in enumerate(row):
            if x != MASK:
                guesses.append(x)
                continue
            left = row[i - 1] if i > 0 else MASK
            right = row[i + 1] if i + 1 < len(row) else MASK
            if left != MASK and right != MASK and (left, right) in between:
                guesses.append(best(between[left, right]))
            elif left != MASK and left in after:
                guesses.append(best(after[left]))
            else:
                guesses.append(unigram)
        out["neighbours"].append(guesses)
    return out


def test_count_rules_match_a_plain_python_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    vocab_size = 12
    stream = torch.randint(5, vocab_size, (3000,), generator=gen)
    inputs = torch.randint(5, vocab_size, (20, 15), generator=gen)
    inputs[torch.rand(20, 15, generator=gen) < 0.3] = MASK
    rules = CountRules(stream, vocab_size)
    expected = reference_rules(stream.tolist(), inputs.tolist())
    for rule in ("unigram", "copy", "neighbours"):
        assert rules.predict(inputs, rule).tolist() == expected[rule], rule
    with pytest.raises(ValueError, match="lm"):
        rules.predict(inputs, "kneser-ney")
    with pytest.raises(ValueError, match="rule"):
        rules.predict(inputs, "trigram")
    with pytest.raises(ValueError, match="vocab_size"):
        CountRules(stream, 5)


def test_masked_accuracy_counts_selected_positions_only() -> None:
    labels = torch.tensor([[IGNORE_INDEX, 3, 4], [5, IGNORE_INDEX, IGNORE_INDEX]])
    predicted = torch.tensor([[0, 3, 0], [5, 0, 0]])
    assert masked_accuracy(predicted, labels) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="predicted"):
        masked_accuracy(predicted[:1], labels)


def test_shipped_checkpoint_reproduces_its_recorded_figure() -> None:
    model, vocab = load_shakespeare_bert()
    figures = shakespeare_bert_info()["figures"]
    check = figures["check_slice"]
    test = vocab.encode(shakespeare("test"))
    inputs, labels = held_out_batch(test, check["windows"], check["length"],
                                    vocab.vocab_size, check["mask_rate"])
    accuracy = masked_accuracy(mlm_predict(model, inputs), labels)
    assert accuracy == pytest.approx(check["accuracy"], abs=1e-3)
    rules = CountRules(vocab.encode(shakespeare("train")), vocab.vocab_size)
    assert masked_accuracy(rules.predict(inputs, "neighbours"), labels) == pytest.approx(
        check["neighbours"], abs=1e-6)
    assert figures["test_slice"]["accuracy"] > figures["test_slice"]["neighbours"]


def test_kneser_ney_rule_against_trying_every_character() -> None:
    """Under each [MASK], every character written into the run of unmasked tokens around it,
    scored by the n-gram's log_probs on that stretch alone: the best one is the rule's."""
    import numpy as np

    from lecture_pkg.ngram import ModifiedKneserNey

    gen = torch.Generator().manual_seed(1)
    vocab_size, order = 9, 3
    stream = torch.randint(5, vocab_size, (3000,), generator=gen)
    inputs = torch.randint(5, vocab_size, (10, 12), generator=gen)
    inputs[torch.rand(10, 12, generator=gen) < 0.3] = MASK
    lm = ModifiedKneserNey(order).fit(stream.numpy(), vocab_size)
    predicted = CountRules(stream, vocab_size, lm=lm).predict(inputs, "kneser-ney")
    for r, row in enumerate(inputs.tolist()):
        for i, x in enumerate(row):
            if x != MASK:
                assert predicted[r, i] == x
                continue
            start, end = i, i + 1
            while start > 0 and row[start - 1] != MASK:
                start -= 1
            while end < len(row) and row[end] != MASK:
                end += 1
            scores = {}
            for w in range(5, vocab_size):
                stretch = np.array(row[start:end])
                stretch[i - start] = w
                last = min(i - start + order - 1, len(stretch) - 1)
                scores[w] = lm.log_probs(stretch, np.arange(i - start, last + 1)).sum()
            assert predicted[r, i] == max(scores, key=lambda w: (scores[w], -w))
    with pytest.raises(ValueError, match="lm"):
        CountRules(stream, vocab_size + 1, lm=lm)
