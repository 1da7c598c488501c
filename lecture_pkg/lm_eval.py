"""Scoring a causal language model: nats per character on fixed held-out windows, and the
log-probability of given tokens after given context.

* :func:`eval_starts` spreads fixed evaluation windows over a token stream and
  :func:`nats_per_char` is the mean next-token cross-entropy over them (nats per token; per
  character for a character model), the held-out figure of the book's Shakespeare GPTs;
  :func:`window_losses` keeps the loss of every position of every window, for paired
  comparisons over windows and loss against position in the context.
* :func:`token_logprobs` and :func:`sequence_logprobs` give log p of each token, and of a
  marked completion, under a model's logits; :func:`pad_right` lays examples in one right-padded
  batch; :func:`answer_logprob` scores candidate answers after prompts, the way GPT-3 (Brown et
  al. 2020) scored multiple-choice tasks.

Shapes: token ids (batch, t); per-token log-probabilities and masks (batch, t - 1), aligned with
the targets ``input_ids[:, 1:]``; sequence log-probabilities (batch,). Masks are bool, True =
the token counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from lecture_pkg.checks import check_bool_mask, check_float_tensor, check_int
from lecture_pkg.models.gpt import next_token_loss

__all__ = ["answer_logprob", "check_logits_and_mask", "eval_starts", "nats_per_char",
           "pad_right", "sequence_logprobs", "token_logprobs", "window_losses"]


def eval_starts(n_tokens: int, windows: int, length: int) -> np.ndarray:
    """Start offsets of ``windows`` windows of ``length`` tokens spread evenly over a stream of
    ``n_tokens`` (the first at 0, the last ending at the end): a fixed held-out slice."""
    check_int("windows", windows, minimum=1)
    check_int("length", length, minimum=2)
    if n_tokens < length:
        raise ValueError(f"n_tokens {n_tokens} is shorter than length {length}")
    return np.linspace(0, n_tokens - length, windows).round().astype(np.int64)


@torch.no_grad()
def nats_per_char(model: nn.Module, ids: Tensor, starts: Sequence[int], length: int,
                  batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats per token; per character for a character model) over
    the windows ``ids[s : s + length]``: positions 1..length-1 of each window, each predicted
    from the window's earlier tokens. ids: (n,) integer tensor; length <= the model's context
    (``model.context_length``: a GPT or a Llama; ``model(batch).logits`` is read)."""
    if length > model.context_length:
        raise ValueError(f"length {length} exceeds the model's context_length="
                         f"{model.context_length}")
    device = next(model.parameters()).device
    offsets = torch.arange(length)
    total, count = 0.0, 0
    for i in range(0, len(starts), batch_size):
        chunk = torch.as_tensor(np.asarray(starts[i:i + batch_size]))
        batch = ids[chunk[:, None] + offsets].to(device)
        n = batch.numel() - batch.shape[0]
        total += next_token_loss(model(batch).logits, batch).item() * n
        count += n
    return total / count


@torch.no_grad()
def window_losses(model: nn.Module, ids: Tensor, starts: Sequence[int], length: int,
                  batch_size: int = 32) -> np.ndarray:
    """-ln p of positions 1..length-1 of each window ``ids[s : s + length]``, each predicted
    from the window's earlier tokens: (len(starts), length - 1) float64. Its mean is
    :func:`nats_per_char` of the same windows. ids: (n,) integer tensor; ``model(batch).logits``
    is read."""
    if ids.ndim != 1:
        raise ValueError(f"ids must be a 1-D tensor (n,), got shape {tuple(ids.shape)}")
    check_int("length", length, minimum=2)
    device = next(model.parameters()).device
    windows = ids[torch.as_tensor(np.asarray(starts))[:, None] + torch.arange(length)]
    return torch.cat([-token_logprobs(model(w).logits, w).cpu()
                      for w in windows.to(device).split(batch_size)]).double().numpy()


def check_logits_and_mask(logits: Tensor, input_ids: Tensor, completion_mask: Tensor) -> None:
    """Raise ValueError unless logits is (batch, t, vocab) float and ``completion_mask`` a bool
    mask of ``input_ids``' shape (batch, t)."""
    _check_logits(logits, input_ids)
    check_bool_mask("completion_mask", completion_mask)
    if completion_mask.shape != input_ids.shape:
        raise ValueError(f"completion_mask must have input_ids' shape {tuple(input_ids.shape)}, "
                         f"got {tuple(completion_mask.shape)}")


def _check_logits(logits: Tensor, input_ids: Tensor) -> None:
    check_float_tensor("logits", logits)
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(input_ids.shape):
        raise ValueError(f"logits must be (batch, t, vocab) with (batch, t) = input_ids' shape "
                         f"{tuple(input_ids.shape)}, got {tuple(logits.shape)}")


def token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """log p(input_ids[:, i + 1] | input_ids[:, :i + 1]) for every position: (batch, t - 1)."""
    _check_logits(logits, input_ids)
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def sequence_logprobs(logits: Tensor, input_ids: Tensor, completion_mask: Tensor) -> Tensor:
    """log pi(response | prompt): the sum of the completion tokens' log-probabilities, (batch,)."""
    check_logits_and_mask(logits, input_ids, completion_mask)
    return (token_logprobs(logits, input_ids) * completion_mask[:, 1:]).sum(-1)


def pad_right(examples: Sequence[tuple[Sequence[int], Sequence[bool]]], pad_id: int
              ) -> tuple[Tensor, Tensor, Tensor]:
    """One example per row, padded on the right to the longest: (input_ids, attention_mask,
    completion_mask), each (len(examples), longest); attention_mask is 1 on real tokens."""
    check_int("pad_id", pad_id)
    if not examples:
        raise ValueError("examples must not be empty")
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    keep = torch.zeros(len(examples), width, dtype=torch.long)
    mask = torch.zeros(len(examples), width, dtype=torch.bool)
    for row, (example_ids, example_mask) in enumerate(examples):
        if len(example_ids) != len(example_mask):
            raise ValueError(f"examples[{row}] has {len(example_ids)} ids but "
                             f"{len(example_mask)} mask entries")
        ids[row, :len(example_ids)] = torch.tensor(list(example_ids), dtype=torch.long)
        keep[row, :len(example_ids)] = 1
        mask[row, :len(example_mask)] = torch.tensor([bool(m) for m in example_mask])
    return ids, keep, mask


@torch.no_grad()
def answer_logprob(model: nn.Module, prompts: list[list[int]], answers: list[list[int]],
                   pad_id: int) -> Tensor:
    """log p(answer | prompt) = sum over the answer's tokens of log p(token | everything before
    it), for each (prompt, answer) pair of token ids, in one right-padded batch.

    ``model(ids)`` must return an object with ``.logits`` (batch, t, vocab) from a causal
    language model, so padding after a sequence cannot change its scores. Prompts need at least
    one token, answers too; prompt plus answer must fit the model's context. Returns (n,)
    float32 on the CPU."""
    if len(prompts) != len(answers) or not prompts:
        raise ValueError(f"prompts and answers must be non-empty lists of equal length, got "
                         f"{len(prompts)} and {len(answers)}")
    if any(len(p) == 0 for p in prompts) or any(len(a) == 0 for a in answers):
        raise ValueError("prompts and answers must each hold at least one token")
    # right padding: a causal model's scores of a sequence cannot see the padding after it
    ids, _, scored = pad_right([(list(p) + list(a), [False] * len(p) + [True] * len(a))
                                for p, a in zip(prompts, answers)], pad_id)
    device = next(model.parameters()).device
    logits = model(ids.to(device)).logits
    return sequence_logprobs(logits, ids.to(device), scored.to(device)).float().cpu()
