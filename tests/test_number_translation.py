"""lecture_pkg.number_translation: the German pieces rebuild num2words' words, the held-out
endings never occur in training, the encoding round-trips and the metrics are exact."""

from __future__ import annotations

import torch

from lecture_pkg.number_translation import BOS, EOS, PAD, SRC_LEN, TGT_LEN, NumberTranslation, strip


def test_pairs_vocabulary_and_split() -> None:
    from num2words import num2words

    task = NumberTranslation()
    assert task.pairs[47] == (["forty", "seven"], ["sieben", "und", "vierzig"])
    assert all("".join(task.pairs[n][1]) == num2words(n, lang="de") for n in task.numbers)
    assert task.vocab[:3] == ["<pad>", "<bos>", "<eos>"] and len(task.vocab) == len(task.index)
    assert task.held_endings == [27, 31, 44, 57, 61, 74, 87, 91]
    assert not {n % 100 for n in task.train_numbers} & set(task.held_endings)
    assert sorted(task.train_numbers + task.test_numbers) == list(range(1, 1000))


def test_encode_strip_and_evaluate() -> None:
    task = NumberTranslation()
    src, tgt = task.encode([7, 347])
    assert src.shape == (2, SRC_LEN) and tgt.shape == (2, TGT_LEN) and (tgt[:, 0] == BOS).all()
    assert [task.vocab[i] for i in strip(tgt[1].tolist())] == task.pairs[347][1]
    assert strip([BOS, 5, PAD, 6, EOS, 7]) == [5, 6]
    assert task.evaluate(tgt, tgt) == {"exact match": 100.0, "BLEU": 100.0}
    wrong = tgt.clone()
    wrong[0, 1] = task.index["acht"]
    assert task.evaluate(wrong, tgt)["exact match"] == 50.0
    assert torch.equal(task.encode([7])[0], src[:1])
