"""The book's character-level BERT, pretrained by masked language modelling on the Shakespeare
corpus: RoBERTa-style batches (contiguous windows, a fresh mask every step), the count rules a
masked LM has to beat, and the shipped checkpoint. Its vocabulary is
:class:`lecture_pkg.char_tokenizers.MLMChars`.

::

    from lecture_pkg.shakespeare_bert import load_shakespeare_bert
    model, vocab = load_shakespeare_bert()      # BertForPreTraining (eval mode), MLMChars
    inputs, labels = held_out_batch(vocab.encode(shakespeare("test")), windows=64, length=64)
    accuracy = masked_accuracy(mlm_predict(model, inputs), labels)

``scripts/train_bert.py --export lecture_pkg/checkpoints`` writes the two checkpoint files.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lecture_pkg.char_tokenizers import MASK, PAD, SPECIALS, MLMChars
from lecture_pkg.checks import check_int
from lecture_pkg.masks import IGNORE_INDEX, mlm_mask
from lecture_pkg.models.bert import BertConfig, BertForPreTraining
from lecture_pkg.ngram import NGramLM
from lecture_pkg.shipped import Shipped, shipped_info, shipped_state

__all__ = ["CHECKPOINT", "CountRules", "held_out_batch", "load_shakespeare_bert",
           "masked_accuracy", "mlm_predict", "random_batch", "shakespeare_bert_info"]

CHECKPOINT = "shakespeare_bert"
HELD_OUT_SEED = 1234  # the one fixed corruption of the held-out windows


def _check_stream(ids: Tensor, length: int) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype != torch.long:
        raise ValueError("ids must be a 1-D int64 tensor (a token stream)")
    check_int("length", length, minimum=2)
    if len(ids) < length:
        raise ValueError(f"ids holds {len(ids)} tokens, fewer than length {length}")


def random_batch(ids: Tensor, batch: int, length: int, vocab_size: int,
                 mask_rate: float = 0.15, generator: torch.Generator | None = None
                 ) -> tuple[Tensor, Tensor]:
    """RoBERTa's input: ``batch`` windows of ``length`` contiguous tokens from random offsets of
    the stream ``ids`` (n,), each corrupted by :func:`lecture_pkg.masks.mlm_mask` with a fresh
    draw (dynamic masking). Returns ``(inputs, labels)``, both (batch, length)."""
    _check_stream(ids, length)
    check_int("batch", batch, minimum=1)
    starts = torch.randint(len(ids) - length + 1, (batch,), generator=generator)
    windows = ids[starts[:, None] + torch.arange(length)]
    return mlm_mask(windows, vocab_size, MASK, [PAD], mlm_probability=mask_rate,
                    generator=generator)


def held_out_batch(ids: Tensor, windows: int, length: int, vocab_size: int,
                   mask_rate: float = 0.15, seed: int = HELD_OUT_SEED
                   ) -> tuple[Tensor, Tensor]:
    """The first ``windows`` consecutive, non-overlapping windows of ``length`` tokens of ``ids``
    (n,), with one fixed corruption (``seed``). Returns ``(inputs, labels)``, (windows, length).
    """
    _check_stream(ids, length)
    check_int("windows", windows, minimum=1)
    if windows * length > len(ids):
        raise ValueError(f"windows * length = {windows * length} exceeds the {len(ids)} tokens")
    block = ids[:windows * length].view(windows, length)
    return mlm_mask(block, vocab_size, MASK, [PAD], mlm_probability=mask_rate,
                    generator=torch.Generator().manual_seed(seed))


def masked_accuracy(predicted: Tensor, labels: Tensor) -> float:
    """The fraction of selected positions (``labels != -100``) where ``predicted == labels``;
    both (batch, t)."""
    if predicted.shape != labels.shape:
        raise ValueError(f"predicted has shape {tuple(predicted.shape)} but labels "
                         f"{tuple(labels.shape)}")
    chosen = labels != IGNORE_INDEX
    if not chosen.any():
        raise ValueError("labels select no position")
    return (predicted[chosen] == labels[chosen]).float().mean().item()


def _most_frequent_middle(left: Tensor, right: Tensor, middle: Tensor, size: int) -> Tensor:
    """(size, size) table: the most frequent ``middle`` id seen between each (left, right) pair
    (ties: the larger id); -1 where the pair never occurs. All inputs (n,) ids below ``size``."""
    key = (left * size + right) * size + middle
    unique, counts = key.unique(return_counts=True)
    pair, mid = unique // size, unique % size
    order = torch.argsort(pair * (counts.max() + 1) + counts, stable=True)
    pair, mid = pair[order], mid[order]
    last = torch.ones_like(pair, dtype=torch.bool)
    last[:-1] = pair[1:] != pair[:-1]  # the last entry of each pair has the highest count
    table = torch.full((size * size,), -1, dtype=torch.long)
    table[pair[last]] = mid[last]
    return table.view(size, size)


class CountRules:
    """Guesses for masked positions from counts over a training stream ``ids`` (n,):

    - ``unigram``: always the most frequent token;
    - ``copy``: the visible token where the input is not ``[MASK]`` (right for the 10 % of
      selected tokens left unchanged), the unigram guess under ``[MASK]``;
    - ``neighbours``: copy, and under ``[MASK]`` the token seen most often between the same
      left and right neighbours; where a neighbour is masked or outside the window, the most
      frequent successor of the left one, then the unigram guess;
    - ``kneser-ney`` (with ``lm``, an n-gram model fitted on the same ids): copy, and under
      ``[MASK]`` the character the n-gram finds likeliest with the unmasked characters on
      both sides of it inside the window (:meth:`lecture_pkg.ngram.NGramLM.fill_in_scores`).
    """

    RULES = ("unigram", "copy", "neighbours", "kneser-ney")

    def __init__(self, ids: Tensor, vocab_size: int, lm: NGramLM | None = None) -> None:
        _check_stream(ids, 3)
        check_int("vocab_size", vocab_size, minimum=1)
        if int(ids.max()) >= vocab_size:
            raise ValueError(f"ids hold {int(ids.max())}, outside vocab_size {vocab_size}")
        if lm is not None and lm.vocab_size != vocab_size:
            raise ValueError(f"lm must be fitted with vocab_size {vocab_size}, got "
                             f"{lm.vocab_size or 'an unfitted model'}")
        self.vocab_size, self.lm = vocab_size, lm
        self.unigram = int(ids.bincount(minlength=vocab_size).argmax())
        self.between = _most_frequent_middle(ids[:-2], ids[2:], ids[1:-1], vocab_size)
        zeros = torch.zeros_like(ids[1:])
        self.after = _most_frequent_middle(ids[:-1], zeros, ids[1:], vocab_size)[:, 0]

    def predict(self, inputs: Tensor, rule: str) -> Tensor:
        """inputs: (batch, t) corrupted ids -> (batch, t) guesses."""
        if rule not in self.RULES:
            raise ValueError(f"rule must be one of {self.RULES}, got {rule!r}")
        guess = torch.full_like(inputs, self.unigram)
        if rule == "unigram":
            return guess
        if rule == "kneser-ney":
            guess = self._fill_in(inputs)
        if rule == "neighbours":
            padded = F.pad(inputs, (1, 1), value=MASK)
            left, right = padded[:, :-2], padded[:, 2:]
            by_left = torch.where(left == MASK, -1, self.after[left])
            both = torch.where((left == MASK) | (right == MASK), -1,
                               self.between[left, right])
            guess = torch.where(by_left >= 0, by_left, guess)
            guess = torch.where(both >= 0, both, guess)
        return torch.where(inputs == MASK, guess, inputs)

    def _fill_in(self, inputs: Tensor) -> Tensor:
        """The n-gram's guess at every ``[MASK]`` from the runs of unmasked tokens that touch
        it on the left and on the right, inside its row; other positions keep the input."""
        if self.lm is None:
            raise ValueError("rule 'kneser-ney' needs CountRules(ids, vocab_size, lm=...)")
        masked = inputs == MASK
        before, after = torch.zeros_like(inputs), torch.zeros_like(inputs)
        for c in range(1, inputs.shape[1]):  # unmasked tokens directly before column c
            before[:, c] = (~masked[:, c - 1]) * (1 + before[:, c - 1])
        for c in range(inputs.shape[1] - 2, -1, -1):  # ... and directly after it
            after[:, c] = (~masked[:, c + 1]) * (1 + after[:, c + 1])
        rows, cols = masked.nonzero(as_tuple=True)
        scores = self.lm.fill_in_scores(
            inputs.flatten().numpy(), (rows * inputs.shape[1] + cols).numpy(),
            before[rows, cols].numpy(), after[rows, cols].numpy())
        scores[:, :len(SPECIALS)] = -np.inf  # a character, never a special token
        guess = inputs.clone()
        guess[rows, cols] = torch.from_numpy(scores.argmax(1))
        return guess


@torch.no_grad()
def mlm_predict(model: BertForPreTraining, inputs: Tensor, batch_size: int = 256) -> Tensor:
    """The model's most likely token at every position: inputs (batch, t) -> (batch, t), on the
    CPU. The model is used as it is (call ``.eval()`` first)."""
    device = model.bert.token.weight.device
    out = []
    for chunk in inputs.split(batch_size):
        hidden = model.bert(chunk.to(device)).last_hidden_state
        out.append(model.mlm_logits(hidden).argmax(-1).cpu())
    return torch.cat(out)


def shakespeare_bert_info() -> dict[str, Any]:
    """The JSON stored beside the weights: ``config`` (BertConfig fields), ``chars``,
    ``figures`` (the held-out accuracies, the recipe, the command, the time)."""
    return shipped_info(CHECKPOINT)


def load_shakespeare_bert(device: torch.device | str | None = None) -> Shipped:
    """The book's character-level BERT (a ``BertForPreTraining``: float32, eval mode, on
    ``device``; default CPU) and its vocabulary (:class:`MLMChars`). The weights are stored in
    float16 and read with safetensors."""
    info = shakespeare_bert_info()
    model = BertForPreTraining(BertConfig(**info["config"]), device=device)
    model.load_state_dict(shipped_state(CHECKPOINT))
    return Shipped(model.eval(), MLMChars(info["chars"]))
