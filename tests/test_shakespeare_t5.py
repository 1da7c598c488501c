"""lecture_pkg.shakespeare_t5: the byte vocabulary, the span-corruption batches (checked by
rebuilding each chunk from its input and target) and the shipped checkpoint's recorded held-out
figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lecture_pkg.data import shakespeare
from lecture_pkg.shakespeare_t5 import (
    CHUNK,
    EOS,
    MIN_CHUNK,
    NOISE_RANGE,
    PAD,
    SENTINEL_IDS,
    TOKENIZER,
    SentinelScores,
    held_out_batches,
    load_shakespeare_t5,
    ngram_fill_in_accuracy,
    sentinel_scores,
    shakespeare_t5_info,
    small_config,
    t5_batch,
    t5_eval,
    to_chunks,
)


def test_vocabulary_and_chunks() -> None:
    vocab = TOKENIZER.itos
    assert len(vocab) == TOKENIZER.vocab_size == 2 + 256 + 16
    assert vocab[SENTINEL_IDS[0]] == "<extra_id_0>" and vocab[2 + ord(" ")] == "␣"
    text = "Fair is foul, and foul is fair: naïve"
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == text
    assert TOKENIZER.decode([*TOKENIZER.encode("ab"), SENTINEL_IDS[1], EOS]) == "ab<extra_id_1></s>"
    chunks = to_chunks("a" * (CHUNK + 5))
    assert chunks.shape == (1, CHUNK) and (chunks == ord("a") + 2).all()
    with pytest.raises(ValueError, match="pool"):
        t5_batch(chunks[:, :10], 2, torch.Generator())


def _rebuild(inputs: list[int], labels: list[int]) -> list[int]:
    """Plain-Python reference: put each span of the target back at its sentinel."""
    spans, current = {}, None
    for token in labels[:-1]:
        if token in SENTINEL_IDS:
            current = token
            spans[current] = []
        else:
            spans[current].append(token)
    out = []
    for token in inputs[:-1]:
        out += spans[token] if token in SENTINEL_IDS else [token]
    return out


def test_batches_rebuild_their_chunks_and_mark_the_noise() -> None:
    pool = torch.randint(2, 258, (50, CHUNK))
    inputs, labels, chunks, noise = t5_batch(pool, 8, torch.Generator().manual_seed(3))
    assert (inputs[:, -1] == EOS).all() and (labels[:, -1] == EOS).all()
    for row in range(8):
        assert _rebuild(inputs[row].tolist(), labels[row].tolist()) == chunks[row].tolist()
        dropped = [t for t in labels[row, :-1].tolist() if t not in SENTINEL_IDS]
        assert dropped == chunks[row][noise[row]].tolist()
        assert labels[row, -2].item() not in SENTINEL_IDS  # T5's sampler ends on a span


def test_varied_batches_differ_row_to_row_and_pad_what_is_short() -> None:
    from lecture_pkg.masks import IGNORE_INDEX

    pool = torch.randint(2, 258, (50, CHUNK))
    inputs, labels, chunks, noise = t5_batch(pool, 32, torch.Generator().manual_seed(4),
                                             varied=True)
    lengths, label_lengths = set(), set()
    for row in range(32):
        real_in = inputs[row][inputs[row] != PAD].tolist()
        real_out = labels[row][labels[row] != IGNORE_INDEX].tolist()
        assert real_in[-1] == EOS and real_out[-1] == EOS
        assert inputs[row, len(real_in):].eq(PAD).all()  # padding only on the right
        rebuilt = _rebuild(real_in, real_out)
        length = len(rebuilt)
        assert MIN_CHUNK <= length <= CHUNK and rebuilt == chunks[row, :length].tolist()
        assert not noise[row, length:].any()
        density = noise[row].sum().item() / length
        assert NOISE_RANGE[0] - 1 / length <= density <= NOISE_RANGE[1] + 1 / length
        lengths.add(length)
        label_lengths.add(len(real_out))
    assert len(lengths) > 10 and len(label_lengths) > 3  # the format is no longer a constant
    again = t5_batch(pool, 32, torch.Generator().manual_seed(4), varied=True)
    assert all(torch.equal(a, b) for a, b in zip(again, (inputs, labels, chunks, noise)))


def test_t5_eval_ignores_padding() -> None:
    """A padded varied batch scores as its rows do one at a time, unpadded."""
    from lecture_pkg.masks import IGNORE_INDEX
    from lecture_pkg.models.t5 import T5

    torch.manual_seed(0)
    model = T5(small_config()).eval()
    pool = to_chunks(shakespeare("validation"))[:40]
    batch = t5_batch(pool, 6, torch.Generator().manual_seed(1), varied=True)
    inputs, labels = batch[0], batch[1]
    rows = [(inputs[i:i + 1, :int((inputs[i] != PAD).sum())],
             labels[i:i + 1, :int((labels[i] != IGNORE_INDEX).sum())]) for i in range(6)]
    assert {r[0].shape[1] for r in rows} != {inputs.shape[1]}  # some rows were padded
    padded = t5_eval(model, [batch])
    one_by_one = [t5_eval(model, [(x, y)]) for x, y in rows]
    counts = [int(((y >= 2) & (y < SENTINEL_IDS[0])).sum()) for _, y in rows]
    pooled = sum(f["dropped bytes accuracy"] * n for f, n in zip(one_by_one, counts))
    assert padded["dropped bytes accuracy"] == pytest.approx(pooled / sum(counts))
    assert padded["</s> accuracy"] == pytest.approx(
        sum(f["</s> accuracy"] for f in one_by_one) / 6)


def test_shipped_checkpoint_reproduces_its_recorded_figure() -> None:
    model, _ = load_shakespeare_t5()
    figures = shakespeare_t5_info()["figures"]
    check = figures["check_slice"]
    got = t5_eval(model, held_out_batches()[: check["batches"]])
    for kind, value in got.items():
        assert value == pytest.approx(check[kind], abs=1e-3), kind
    assert figures["test"]["</s> accuracy"] > 0.5 and figures["test"]["sentinels accuracy"] > 0.5
    assert figures["varied"] and set(figures["history"]) == {"steps", "validation",
                                                             "validation_varied"}


def test_ngram_fill_in_accuracy_against_a_loop_over_bytes_and_candidates() -> None:
    """Each dropped byte guessed by trying every byte in a copy of its chunk: the n-gram's
    log-probability of the byte and, two-sided, of the kept bytes right after it."""
    from lecture_pkg.ngram import KneserNey

    text = "When shall we three meet again? In thunder, lightning, or in rain. " * 20
    pool = to_chunks(text)
    lm = KneserNey(3).fit(pool.flatten().numpy(), TOKENIZER.vocab_size)
    batches = [t5_batch(pool, 4, torch.Generator().manual_seed(0))]
    _, _, chunks, noise = batches[0]
    for two_sided in (False, True):
        hits = total = 0
        for r, c in noise.nonzero().tolist():
            chunk = chunks[r].numpy()
            right = 0
            while two_sided and right < 2 and c + right + 1 < CHUNK and not noise[r, c + right + 1]:
                right += 1
            best, best_score = None, -np.inf
            for byte in range(2, SENTINEL_IDS[0]):
                filled = chunk.copy()
                filled[c] = byte
                score = lm.log_probs(filled, np.arange(c, c + right + 1)).sum()
                if score > best_score + 1e-12:
                    best, best_score = byte, score
            hits += best == chunk[c]
            total += 1
        assert ngram_fill_in_accuracy(lm, batches, two_sided) == pytest.approx(hits / total)
    with pytest.raises(ValueError, match="split"):
        held_out_batches(split="train")


def test_sentinel_scores_on_hand_made_decodes() -> None:
    s0, s1, s2 = SENTINEL_IDS[:3]
    b = 50  # any byte
    target = [s0, b, b, s1, b, EOS]
    perfect = sentinel_scores([target], [target])
    assert perfect == SentinelScores(1.0, 1.0, 1.0)
    # tokens after </s> do not count, neither in decodes nor in targets
    assert sentinel_scores([[s0, b, b, s1, b, EOS, s2]], [target + [PAD]]) == perfect
    # the first span one byte short: s1 one place early, a miss and a false sentinel
    assert sentinel_scores([[s0, b, s1, b, b, EOS]], [target]) == SentinelScores(0.5, 0.5, 0.0)
    # an extra sentinel: precision 2/3, recall 1, not all right
    extra = sentinel_scores([[s0, b, b, s1, s2, EOS]], [target])
    assert extra == pytest.approx(SentinelScores(2 / 3, 1.0, 0.0))
    # the right place but the wrong sentinel is no hit
    assert sentinel_scores([[s1, b, b, s1, b, EOS]], [target]).recall == 0.5
    # pooled over decodes (micro averages): 3 hits of 4 written, of 4 wanted; 1 of 2 exact
    pooled = sentinel_scores([target, [s0, b, s1, b, b, EOS]], torch.tensor([target, target]))
    assert pooled == SentinelScores(3 / 4, 3 / 4, 0.5)
    # nothing decoded: precision undefined, recall 0
    empty = sentinel_scores([[b, b, EOS]], [target])
    assert np.isnan(empty.precision) and empty.recall == 0.0 and empty.all_right == 0.0


def test_sentinel_scores_on_real_targets_and_bad_input() -> None:
    labels = held_out_batches(batches=1, size=8)[0][1]
    assert sentinel_scores(labels.tolist(), labels) == SentinelScores(1.0, 1.0, 1.0)
    shifted = [[PAD] + row[:-1] for row in labels.tolist()]  # every sentinel one place late
    late = sentinel_scores(shifted, labels)
    assert late.precision == late.recall == late.all_right == 0.0
    with pytest.raises(ValueError, match="decodes and targets must be as many"):
        sentinel_scores(labels.tolist()[:3], labels)
    with pytest.raises(ValueError, match="every target must hold a sentinel"):
        sentinel_scores([[2, EOS]], [[2, EOS]])
