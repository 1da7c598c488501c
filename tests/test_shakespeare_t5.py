"""lecture_pkg.shakespeare_t5: the byte vocabulary, the span-corruption batches (checked by
rebuilding each chunk from its input and target) and the shipped checkpoint's recorded held-out
figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lecture_pkg.shakespeare_t5 import (
    CHUNK,
    EOS,
    SENTINEL_IDS,
    TOKENIZER,
    held_out_batches,
    load_shakespeare_t5,
    ngram_fill_in_accuracy,
    shakespeare_t5_info,
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


def test_shipped_checkpoint_reproduces_its_recorded_figure() -> None:
    model, _ = load_shakespeare_t5()
    figures = shakespeare_t5_info()["figures"]
    check = figures["check_slice"]
    got = t5_eval(model, held_out_batches()[: check["batches"]])
    for kind, value in got.items():
        assert value == pytest.approx(check[kind], abs=1e-3), kind
    assert figures["test"]["</s> accuracy"] > 0.5 and figures["test"]["sentinels accuracy"] > 0.5


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
