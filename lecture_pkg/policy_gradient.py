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
* **PPO as RLHF runs it** (Ziegler et al. 2019; Ouyang et al. 2022): :func:`kl_shaped_rewards`
  puts the per-token KL penalty into the reward and the score on the answer's last token;
  :func:`gae` turns per-token rewards and a value model's estimates into advantages and
  returns (Schulman et al. 2016); :func:`whiten` normalises advantages over the answer tokens;
  :func:`value_loss` is the value model's clipped regression on the returns.
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

__all__ = ["AGGREGATIONS", "aggregate_loss", "gae", "kl_shaped_rewards", "masked_mean",
           "masked_sum", "reinforce_loss", "token_entropy", "value_loss", "whiten"]

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


def kl_shaped_rewards(scores: Tensor, logprobs: Tensor, reference_logprobs: Tensor,
                      mask: Tensor, beta: float) -> Tensor:
    """Per-token rewards for PPO in RLHF, (batch, t): ``-beta * (log pi - log pi_ref)`` of each
    sampled answer token (the k1 estimate of KL(pi || pi_ref), so its policy gradient is the
    KL's), plus the answer's score (batch,) on its last marked token; 0 off the mask."""
    _check_values_and_mask(logprobs, mask)
    check_float_tensor("scores", scores)
    if reference_logprobs.shape != logprobs.shape or scores.shape != logprobs.shape[:1]:
        raise ValueError(f"reference_logprobs must be {tuple(logprobs.shape)} and scores "
                         f"({logprobs.shape[0]},), got {tuple(reference_logprobs.shape)} and "
                         f"{tuple(scores.shape)}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if not bool(mask.any(1).all()):
        raise ValueError("every row of mask needs at least one answer token")
    rewards = torch.where(mask, -beta * (logprobs - reference_logprobs),
                          torch.zeros_like(logprobs))
    last = mask.shape[1] - 1 - mask.flip(1).int().argmax(1)  # each row's last marked token
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last] += scores.to(rewards.dtype)
    return rewards


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over each row's marked tokens: (advantages, returns),
    both (batch, t) and 0 off the mask.

    With the next marked token's value V' (0 after the last), ``delta = r + gamma * V' - V`` and
    ``A = delta + gamma * lam * A'``; the returns ``A + V`` are the value model's targets.
    ``lam = 1`` gives the Monte Carlo return minus V, ``lam = 0`` the one-step TD error. The
    marked tokens of a row must be contiguous (an answer)."""
    _check_values_and_mask(rewards, mask)
    check_float_tensor("values", values)
    if values.shape != rewards.shape or rewards.dim() != 2:
        raise ValueError(f"rewards and values must both be (batch, t), got "
                         f"{tuple(rewards.shape)} and {tuple(values.shape)}")
    if not (0 <= gamma <= 1 and 0 <= lam <= 1):
        raise ValueError(f"gamma and lam must lie in [0, 1], got {gamma} and {lam}")
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        on = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(on, advantage, torch.zeros_like(advantage))
        next_value = torch.where(on, values[:, t], next_value)
        next_advantage = torch.where(on, advantage, next_advantage)
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return advantages, returns


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``values`` shifted and scaled to mean 0 and standard deviation 1 over the marked tokens
    (InstructGPT and trl whiten PPO's advantages so); 0 off the mask."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    return torch.where(mask, (values - mean) * torch.rsqrt(var + eps), torch.zeros_like(values))


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor,
               clip: float = 0.2) -> Tensor:
    """The value model's loss, as trl's PPO: half the larger of the squared errors of the new
    values and of the new values clipped to ``old_values +- clip``, averaged over the marked
    tokens."""
    _check_values_and_mask(values, mask)
    if old_values.shape != values.shape or returns.shape != values.shape:
        raise ValueError(f"old_values and returns must have the shape of values "
                         f"{tuple(values.shape)}, got {tuple(old_values.shape)} and "
                         f"{tuple(returns.shape)}")
    if clip <= 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    worst = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return 0.5 * masked_mean(worst, mask)
