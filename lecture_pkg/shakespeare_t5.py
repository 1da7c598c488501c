"""The book's small byte-level T5, pretrained by span corruption on the bytes of Shakespeare as
chapter 7.7 does it: the batches (64-byte chunks, T5's noise 0.15 and mean span 3, corrupted
afresh at every use), the teacher-forced held-out evaluation, and the shipped checkpoint. Its
vocabulary is :data:`TOKENIZER`, a :class:`lecture_pkg.char_tokenizers.ByteTokenizer`.

::

    from lecture_pkg.shakespeare_t5 import held_out_batches, load_shakespeare_t5, t5_eval
    model, tokenizer = load_shakespeare_t5()     # T5 (eval mode), ByteTokenizer
    figures = t5_eval(model, held_out_batches())  # {"dropped bytes accuracy": ..., ...}

``scripts/train_t5.py --export lecture_pkg/checkpoints`` writes the two checkpoint files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lecture_pkg.char_tokenizers import ByteTokenizer
from lecture_pkg.checks import check_int
from lecture_pkg.data import shakespeare
from lecture_pkg.masks import IGNORE_INDEX, apply_span_corruption, random_spans
from lecture_pkg.models.t5 import T5, T5Config, shift_right
from lecture_pkg.ngram import NGramLM
from lecture_pkg.shipped import Shipped, shipped_info, shipped_state

__all__ = ["CHECKPOINT", "CHUNK", "EOS", "HELD_OUT_SEED", "MIN_CHUNK", "NOISE",
           "NOISE_RANGE", "PAD", "SENTINEL_IDS",
           "TOKENIZER", "SentinelScores", "held_out_batches", "load_shakespeare_t5",
           "ngram_fill_in_accuracy", "sentinel_scores", "shakespeare_t5_info", "small_config",
           "t5_batch", "t5_eval", "to_chunks"]

CHUNK, NOISE, MEAN_SPAN = 64, 0.15, 3.0
MIN_CHUNK, NOISE_RANGE = 24, (0.10, 0.25)  # what ``varied`` batches draw from
CHECKPOINT = "shakespeare_t5"
HELD_OUT_SEED = 1000  # the one fixed corruption of the held-out chunks
TOKENIZER = ByteTokenizer(num_sentinels=16)
PAD, EOS, SENTINEL_IDS = TOKENIZER.pad_id, TOKENIZER.eos_id, TOKENIZER.sentinel_ids


def to_chunks(text: str) -> Tensor:
    """(n_chunks, CHUNK) ids: the UTF-8 bytes shifted by 2 (after <pad> and </s>); the tail
    that does not fill a chunk is dropped."""
    ids = torch.tensor(TOKENIZER.encode(text))
    return ids[: len(ids) // CHUNK * CHUNK].view(-1, CHUNK)


def t5_batch(pool: Tensor, size: int, gen: torch.Generator,
             varied: bool = False) -> tuple[Tensor, ...]:
    """(inputs, labels, chunks, noise) for ``size`` chunks drawn from ``pool``:
    inputs (size, CHUNK - N + S + 1) and labels (size, N + S + 1) end with </s>; noise
    (size, CHUNK) marks the dropped bytes. N = round(0.15 * CHUNK) noise bytes in
    S = round(N / 3) spans, so no row needs padding.

    With ``varied``, each row keeps only the first L bytes of its chunk, L drawn uniformly
    from [MIN_CHUNK, CHUNK], and its own noise density from NOISE_RANGE, so N and S (and
    where </s> falls) differ from row to row: inputs are padded with <pad> and labels with
    IGNORE_INDEX to the batch's longest row, and noise marks bytes of the first L only."""
    check_int("size", size, minimum=1)
    if pool.ndim != 2 or pool.shape[1] != CHUNK:
        raise ValueError(f"pool must have shape (n, {CHUNK}), got {tuple(pool.shape)}")
    chunks = pool[torch.randint(len(pool), (size,), generator=gen)]
    inputs, labels = [], []
    noise = torch.zeros(size, CHUNK, dtype=torch.bool)
    for row, chunk in enumerate(chunks):
        length, density = CHUNK, NOISE
        if varied:
            length = int(torch.randint(MIN_CHUNK, CHUNK + 1, (1,), generator=gen))
            low, high = NOISE_RANGE
            density = low + (high - low) * float(torch.rand(1, generator=gen))
        spans = random_spans(length, density, MEAN_SPAN, generator=gen)
        inp, tgt = apply_span_corruption(chunk[:length], spans, SENTINEL_IDS)
        inputs.append([*inp, EOS])
        labels.append([*tgt, EOS])
        for start, end in spans:
            noise[row, start:end] = True
    return _padded(inputs, PAD), _padded(labels, IGNORE_INDEX), chunks, noise


def _padded(rows: list[list[int]], fill: int) -> Tensor:
    """(len(rows), longest) ids, shorter rows filled on the right with ``fill``."""
    out = torch.full((len(rows), max(map(len, rows))), fill)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row)
    return out


def held_out_batches(batches: int = 8, size: int = 64, seed: int = HELD_OUT_SEED,
                     split: str = "test", varied: bool = False) -> list[tuple[Tensor, ...]]:
    """The chapter's held-out evaluation: ``batches`` batches of ``size`` chunks of the works
    of ``split`` ("test", or "validation" for watching a run), drawn and corrupted by one
    generator seeded with ``seed`` (``varied``: as :func:`t5_batch`'s)."""
    check_int("batches", batches, minimum=1)
    if split not in ("validation", "test"):
        raise ValueError(f"split must be 'validation' or 'test', got {split!r}")
    pool = to_chunks(shakespeare(split))
    gen = torch.Generator().manual_seed(seed)
    return [t5_batch(pool, size, gen, varied) for _ in range(batches)]


@torch.no_grad()
def t5_eval(model: T5, batches: list[tuple[Tensor, ...]]) -> dict[str, float]:
    """Teacher-forced held-out accuracy: at a dropped byte the most probable byte, at a
    sentinel or </s> the most probable token of the whole vocabulary. Padding (<pad> in the
    inputs, IGNORE_INDEX in the labels) is masked and not scored."""
    hit = {"dropped bytes": 0, "sentinels": 0, "</s>": 0}
    total = dict.fromkeys(hit, 0)
    device = next(model.parameters()).device
    for inputs, labels, *_ in batches:
        logits = model(inputs.to(device), shift_right(labels).to(device),
                       attention_mask=(inputs != PAD).to(device)).logits.cpu()
        is_byte = (labels >= 2) & (labels < SENTINEL_IDS[0])
        byte_guess = logits[..., 2:SENTINEL_IDS[0]].argmax(-1) + 2
        right = torch.where(is_byte, byte_guess, logits.argmax(-1)) == labels
        kinds = {"dropped bytes": is_byte, "sentinels": labels >= SENTINEL_IDS[0],
                 "</s>": labels == EOS}
        for kind, where in kinds.items():
            hit[kind] += right[where].sum().item()
            total[kind] += where.sum().item()
    return {f"{kind} accuracy": hit[kind] / total[kind] for kind in hit}


class SentinelScores(NamedTuple):
    """Where decodes put their sentinels, against the targets (see :func:`sentinel_scores`)."""

    precision: float  # share of the decoded sentinels that sit where the target has that one
    recall: float  # share of the targets' sentinels that the decodes put in their place
    all_right: float  # share of decodes whose sentinels are exactly the target's, in place


def _sentinel_places(tokens: Sequence[int], first_sentinel: int) -> set[tuple[int, int]]:
    """{(position, id)} of the sentinels of ``tokens`` before its first </s>."""
    tokens = list(tokens)
    if EOS in tokens:
        tokens = tokens[:tokens.index(EOS)]
    return {(i, t) for i, t in enumerate(tokens) if t >= first_sentinel}


def sentinel_scores(decodes: Sequence[Sequence[int]], targets: Sequence[Sequence[int]] | Tensor,
                    first_sentinel: int = SENTINEL_IDS[0]) -> SentinelScores:
    """Sentinel precision and recall of decodes, and the share of decodes with every sentinel
    in the right place. A sentinel is the pair (position, id): position 0 is the first decoded
    token (the start token left out), so a sentinel in its place means every span before it
    was written with the right length. Tokens from a sequence's first </s> on do not count.
    Counts are pooled over all decodes (micro averages); precision is NaN when no decode
    writes a sentinel.

    decodes: n token-id sequences; targets: n sequences (or an (n, t) tensor), e.g. the labels
    of :func:`t5_batch`; ids >= ``first_sentinel`` are sentinels."""
    if isinstance(targets, Tensor):
        targets = targets.tolist()
    if len(decodes) != len(targets) or not len(targets):
        raise ValueError(f"decodes and targets must be as many and not none, got {len(decodes)}"
                         f" decodes and {len(targets)} targets")
    hits = written = wanted = exact = 0
    for decode, target in zip(decodes, targets):
        got = _sentinel_places(decode, first_sentinel)
        want = _sentinel_places(target, first_sentinel)
        if not want:
            raise ValueError("every target must hold a sentinel before its </s>")
        hits += len(got & want)
        written += len(got)
        wanted += len(want)
        exact += got == want
    return SentinelScores(hits / written if written else float("nan"), hits / wanted,
                          exact / len(targets))


def ngram_fill_in_accuracy(lm: NGramLM, batches: list[tuple[Tensor, ...]],
                           two_sided: bool = False) -> float:
    """The share of the dropped bytes of ``batches`` (from :func:`t5_batch`) that the count
    model ``lm`` (fitted on the same byte ids) guesses right, among bytes only. Each byte is
    read from the true bytes before it in its chunk, which teacher forcing also shows T5's
    decoder; with ``two_sided``, also from the kept bytes right after it (up to
    ``lm.order - 1``), which T5's encoder sees after a span's last byte."""
    hits = total = 0
    for _, _, chunks, noise in batches:
        # visible[r, c]: how many kept bytes follow position c directly, inside the chunk
        visible = torch.zeros(noise.shape, dtype=torch.long)
        for c in range(CHUNK - 2, -1, -1):
            visible[:, c] = (~noise[:, c + 1]) * (1 + visible[:, c + 1])
        rows, cols = noise.nonzero(as_tuple=True)
        positions = (rows * CHUNK + cols).numpy()
        right = visible[rows, cols].numpy() if two_sided else None
        scores = lm.fill_in_scores(chunks.flatten().numpy(), positions, cols.numpy(), right)
        guess = scores[:, 2:SENTINEL_IDS[0]].argmax(1) + 2
        hits += int((guess == chunks[rows, cols].numpy()).sum())
        total += len(positions)
    return hits / total


def small_config() -> T5Config:
    """The chapter's small T5: 2 + 2 layers of width 128, 4 heads, no dropout."""
    return T5Config(vocab_size=TOKENIZER.vocab_size, d_model=128, d_ff=512, num_layers=2,
                    num_decoder_layers=2, num_heads=4, dropout=0.0)


def shakespeare_t5_info() -> dict[str, Any]:
    """The JSON stored beside the weights: ``config`` (T5Config fields), ``figures`` (held-out
    accuracies, training time, the command, the training curve)."""
    return shipped_info(CHECKPOINT)


def load_shakespeare_t5(device: torch.device | str | None = None) -> Shipped:
    """The small byte-level T5 pretrained longer (float32, eval mode, on ``device``; default
    CPU) and its :data:`TOKENIZER`. The weights are stored in float16 and read with
    safetensors."""
    model = T5(T5Config(**shakespeare_t5_info()["config"]))
    model.load_state_dict(shipped_state(CHECKPOINT))
    return Shipped(model.to(device or "cpu").eval(), TOKENIZER)
