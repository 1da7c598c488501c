"""The policy-gradient losses of RL for language models, as plain per-token functions: the pieces
from which REINFORCE, GRPO and its variants are assembled, so that each choice can be named and
compared (chapter 10). :mod:`lecture_pkg.alignment` holds the book's GRPO objective; this module
spells out what the field varies around it.

* **Masked reductions**: :func:`masked_sum` and :func:`masked_mean` over a dimension (or all),
  counting only the tokens the mask marks.
* **Entropy** of the next-token distribution at every position: :func:`token_entropy`.
* **Advantages**: :func:`lecture_pkg.alignment.group_advantages` subtracts each group's mean
  reward and, unless ``normalise_std=False`` (Dr. GRPO, Liu et al. 2025), divides by the group's
  standard deviation.
* **REINFORCE**: :func:`reinforce_loss`, ``-(R - b) * log pi(token)`` per token, with or without a
  baseline ``b``.
* **Aggregation** (:func:`aggregate_loss`), how per-token losses become one number, the choice
  that separates the GRPO variants:

  - ``"sequence"``: each sequence's mean over its tokens, then the mean over sequences, as
    Shao et al. (2024) write GRPO's objective; a long answer's tokens weigh less each;
  - ``"token"``: the sum over every token of the batch over their number (trl's ``"bnpo"``,
    DAPO's token-level loss); every token weighs the same;
  - ``"constant"``: the sum over a constant, batch size times the longest allowed answer
    (Dr. GRPO), so that neither the answer's length nor the batch's token count rescales it.

Shapes: per-token values and masks (batch, t); rewards, baselines and advantages (batch,).
Masks are bool, True = the token counts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lecture_pkg.checks import check_bool_mask, check_float_tensor, check_int

__all__ = ["AGGREGATIONS", "aggregate_loss", "masked_mean", "masked_sum", "reinforce_loss",
           "token_entropy"]

AGGREGATIONS = ("sequence", "token", "constant")


def _check_values_and_mask(values: Tensor, mask: Tensor) -> None:
    check_float_tensor("values", values)
    check_bool_mask("mask", mask)
    if mask.shape != values.shape:
        raise ValueError(f"mask must have the shape of values {tuple(values.shape)}, got "
                         f"{tuple(mask.shape)}")


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is True, along ``dim`` (all of it when None)."""
    _check_values_and_mask(values, mask)
    kept = torch.where(mask, values, torch.zeros_like(values))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` where ``mask`` is True, along ``dim`` (all of it when None). A row
    with no marked entry has mean 0, not NaN."""
    total = masked_sum(values, mask, dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1)


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy (nats) of softmax(logits) over the last dimension: (..., V) -> (...)."""
    check_float_tensor("logits", logits)
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def reinforce_loss(logprobs: Tensor, rewards: Tensor, baseline: Tensor | None = None
                   ) -> Tensor:
    """REINFORCE's per-token loss ``-(R - b) * log pi(token)``, (batch, t): its gradient is the
    policy gradient of the sequence's reward. ``baseline`` (batch,), e.g. a group mean, lowers
    the estimate's variance without biasing it; None is b = 0."""
    check_float_tensor("logprobs", logprobs)
    check_float_tensor("rewards", rewards)
    if logprobs.dim() != 2 or rewards.shape != logprobs.shape[:1]:
        raise ValueError(f"logprobs must be (batch, t) and rewards (batch,), got "
                         f"{tuple(logprobs.shape)} and {tuple(rewards.shape)}")
    if baseline is not None and check_float_tensor("baseline", baseline).shape != rewards.shape:
        raise ValueError(f"baseline must be (batch,) = {tuple(rewards.shape)}, got "
                         f"{tuple(baseline.shape)}")
    weight = rewards if baseline is None else rewards - baseline
    return -weight[:, None].detach() * logprobs


def aggregate_loss(per_token: Tensor, mask: Tensor, how: str,
                   max_length: int | None = None) -> Tensor:
    """One loss from per-token losses (batch, t) over the tokens ``mask`` marks: ``how`` is
    ``"sequence"`` (Shao et al.'s GRPO), ``"token"`` (trl's bnpo, DAPO) or ``"constant"``
    (Dr. GRPO: the masked sum over batch * ``max_length``, which it needs)."""
    _check_values_and_mask(per_token, mask)
    if per_token.dim() != 2:
        raise ValueError(f"per_token must be (batch, t), got shape {tuple(per_token.shape)}")
    if how == "sequence":
        return masked_mean(per_token, mask, dim=1).mean()
    if how == "token":
        return masked_mean(per_token, mask)
    if how == "constant":
        if max_length is None:
            raise ValueError("how='constant' needs max_length, the longest answer allowed")
        check_int("max_length", max_length, minimum=1)
        return masked_sum(per_token, mask) / (per_token.shape[0] * max_length)
    raise ValueError(f"how must be one of {AGGREGATIONS}, got {how!r}")
