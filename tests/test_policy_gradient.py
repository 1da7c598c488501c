"""lecture_pkg.policy_gradient against float64 loops written out here: the masked reductions,
token entropy, REINFORCE's per-token loss and its gradient, and the three ways GRPO's variants
turn per-token losses into one number; lecture_pkg.alignment.group_advantages with and without
the standard deviation (Dr. GRPO)."""

from __future__ import annotations

import math

import pytest
import torch

from lecture_pkg.alignment import group_advantages
from lecture_pkg.policy_gradient import (
    aggregate_loss,
    gae,
    kl_shaped_rewards,
    masked_mean,
    masked_sum,
    reinforce_loss,
    token_entropy,
    value_loss,
    whiten,
)


def _example(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=gen) < 0.6
    mask[2] = False  # a row with no token
    mask[0, 0] = True
    return values, mask


def test_masked_reductions_equal_loops() -> None:
    values, mask = _example()
    rows = [[v for v, m in zip(vr.tolist(), mr.tolist()) if m] for vr, mr in zip(values, mask)]
    everything = [v for r in rows for v in r]
    assert masked_sum(values, mask).item() == pytest.approx(math.fsum(everything))
    assert masked_mean(values, mask).item() == pytest.approx(math.fsum(everything)
                                                             / len(everything))
    sums = masked_sum(values, mask, dim=1)
    means = masked_mean(values, mask, dim=1)
    for i, r in enumerate(rows):
        assert sums[i].item() == pytest.approx(math.fsum(r))
        assert means[i].item() == pytest.approx(math.fsum(r) / len(r) if r else 0.0)
    columns = masked_sum(values, mask, dim=0)
    for j in range(values.shape[1]):
        expected = math.fsum(values[i, j].item() for i in range(4) if mask[i, j])
        assert columns[j].item() == pytest.approx(expected)
    values[~mask] = float("nan")  # what the mask leaves out never reaches the result
    assert masked_sum(values, mask).isfinite()


def test_token_entropy_equals_the_definition() -> None:
    logits = torch.randn(3, 5, 7, dtype=torch.float64)
    got = token_entropy(logits)
    for index in torch.cartesian_prod(torch.arange(3), torch.arange(5)).tolist():
        p = torch.softmax(logits[tuple(index)], -1).tolist()
        assert got[tuple(index)].item() == pytest.approx(-sum(q * math.log(q) for q in p))
    uniform = token_entropy(torch.zeros(2, 11))
    torch.testing.assert_close(uniform, torch.full((2,), math.log(11)))


def test_group_advantages_with_and_without_the_standard_deviation() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0, 2.0], dtype=torch.float64)
    centred = group_advantages(rewards, 4, normalise_std=False)
    scaled = group_advantages(rewards, 4, eps=0.0)
    for g in range(2):
        group = rewards[4 * g: 4 * g + 4].tolist()
        mean = sum(group) / 4
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / 3)
        for i, r in enumerate(group):
            assert centred[4 * g + i].item() == pytest.approx(r - mean)
            assert scaled[4 * g + i].item() == pytest.approx((r - mean) / std)


def test_reinforce_gradient_is_the_reward_weighted_score() -> None:
    """d loss / d logit of a softmax policy: -(R - b) (onehot - p), summed over tokens."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(5, (2, 3), generator=gen)
    logprobs = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    rewards = torch.tensor([2.0, -1.0], dtype=torch.float64)
    baseline = torch.tensor([0.5, 0.5], dtype=torch.float64)
    reinforce_loss(logprobs, rewards, baseline).sum().backward()
    p = torch.softmax(logits.detach(), -1)
    onehot = torch.nn.functional.one_hot(tokens, 5).double()
    expected = -(rewards - baseline)[:, None, None] * (onehot - p)
    torch.testing.assert_close(logits.grad, expected)
    no_baseline = reinforce_loss(logprobs.detach(), rewards)
    torch.testing.assert_close(no_baseline, -rewards[:, None] * logprobs.detach())


def test_aggregations_weigh_tokens_as_their_papers_do() -> None:
    values, mask = _example(3)
    rows = [[v for v, m in zip(vr.tolist(), mr.tolist()) if m] for vr, mr in zip(values, mask)]
    sequence = sum(math.fsum(r) / len(r) if r else 0.0 for r in rows) / len(rows)
    token = math.fsum(v for r in rows for v in r) / sum(map(len, rows))
    constant = math.fsum(v for r in rows for v in r) / (len(rows) * 10)
    assert aggregate_loss(values, mask, "sequence").item() == pytest.approx(sequence)
    assert aggregate_loss(values, mask, "token").item() == pytest.approx(token)
    assert aggregate_loss(values, mask, "constant", max_length=10).item() == pytest.approx(
        constant)
    # equal lengths: Shao et al.'s and the token-level means agree
    full = torch.ones_like(mask)
    torch.testing.assert_close(aggregate_loss(values, full, "sequence"),
                               aggregate_loss(values, full, "token"))


def test_argument_checks() -> None:
    values, mask = _example()
    with pytest.raises(ValueError, match="how must be one of"):
        aggregate_loss(values, mask, "mean")
    with pytest.raises(ValueError, match="max_length"):
        aggregate_loss(values, mask, "constant")
    with pytest.raises(ValueError, match="mask must have the shape"):
        masked_sum(values, mask[:, :3])
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        masked_mean(values, mask.float())
    with pytest.raises(ValueError, match="rewards"):
        reinforce_loss(values, torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="baseline"):
        reinforce_loss(values, torch.ones(4, dtype=torch.float64),
                       torch.ones(2, dtype=torch.float64))


def _answer_mask(batch: int, t: int, seed: int) -> torch.Tensor:
    """A contiguous run of marked tokens per row, at a random start and length."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, t, dtype=torch.bool)
    for row in range(batch):
        start = int(torch.randint(t - 1, (1,), generator=gen))
        length = int(torch.randint(1, t - start + 1, (1,), generator=gen))
        mask[row, start:start + length] = True
    return mask


def _gae_loop(rewards, values, mask, gamma, lam):
    """Float64 GAE written per row over its answer tokens only."""
    advantages = [[0.0] * len(r) for r in rewards]
    for row, (r, v, m) in enumerate(zip(rewards, values, mask)):
        idx = [i for i, on in enumerate(m) if on]
        following = 0.0
        for k in reversed(range(len(idx))):
            i = idx[k]
            next_value = v[idx[k + 1]] if k + 1 < len(idx) else 0.0
            delta = r[i] + gamma * next_value - v[i]
            following = delta + gamma * lam * following
            advantages[row][i] = following
    return advantages


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0)])
def test_gae_equals_a_float64_loop_over_each_answer(gamma, lam):
    mask = _answer_mask(6, 9, seed=1)
    gen = torch.Generator().manual_seed(2)
    rewards = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    values = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    expected = torch.tensor(_gae_loop(rewards.tolist(), values.tolist(), mask.tolist(), gamma,
                                      lam), dtype=torch.float64)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, torch.where(mask, expected + values, 0.0))
    if lam == 1.0 and gamma == 1.0:  # Monte Carlo: the rewards still to come, minus V
        to_come = torch.where(mask, rewards, 0.0).flip(1).cumsum(1).flip(1)
        torch.testing.assert_close(advantages, torch.where(mask, to_come - values, 0.0))


def test_kl_shaped_rewards_sum_to_the_score_minus_beta_times_the_k1_kl():
    mask = _answer_mask(5, 7, seed=3)
    gen = torch.Generator().manual_seed(4)
    logp, ref = (torch.randn(5, 7, generator=gen) for _ in range(2))
    scores = torch.tensor([1.0, 0.0, -2.0, 0.5, 3.0])
    rewards = kl_shaped_rewards(scores, logp, ref, mask, beta=0.3)
    assert torch.all(rewards[~mask] == 0)
    torch.testing.assert_close(rewards.sum(1), scores - 0.3 * ((logp - ref) * mask).sum(1))
    last = mask.shape[1] - 1 - mask.flip(1).int().argmax(1)
    rows = torch.arange(5)
    torch.testing.assert_close(rewards[rows, last] + 0.3 * (logp - ref)[rows, last], scores)
    with pytest.raises(ValueError, match="at least one answer token"):
        kl_shaped_rewards(scores, logp, ref, torch.zeros(5, 7, dtype=torch.bool), beta=0.3)
    with pytest.raises(ValueError, match="scores"):
        kl_shaped_rewards(scores[:2], logp, ref, mask, beta=0.3)


def test_whiten_and_value_loss():
    mask = _answer_mask(4, 6, seed=5)
    x = torch.randn(4, 6, dtype=torch.float64) * 3 + 2
    w = whiten(x, mask)
    assert abs(w[mask].mean().item()) < 1e-9
    assert w[mask].var(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)
    assert torch.all(w[~mask] == 0)
    old, ret = torch.zeros(4, 6), torch.ones(4, 6)
    new = torch.full((4, 6), 0.5)
    # inside the clip the loss is half the squared error; outside it the clipped error counts
    assert value_loss(new, old, ret, mask, clip=1.0).item() == pytest.approx(0.125)
    assert value_loss(new, old, ret, mask, clip=0.2).item() == pytest.approx(0.5 * 0.8**2)
    with pytest.raises(ValueError, match="clip"):
        value_loss(new, old, ret, mask, clip=0.0)
