"""RL against a reward, as chapter 10 runs it: the GRPO loop, the exact KL between two
policies' next-token distributions, and what each KL estimator does when it is used as a loss.

* :func:`grpo_train`: group-relative policy optimisation (Shao et al. 2024) of a copy of a
  language model against any reward function of the answers, with the losses of
  :mod:`lecture_pkg.alignment`. Each step samples ``group`` answers for each of ``prompts``
  prompts, scores them, and takes ``inner_steps`` clipped gradient steps on the batch. The
  reward may be a known rule (the gold reward) or a learned reward model (a proxy); extra
  quantities of each batch (for example the gold reward of answers optimised against a proxy)
  are logged through ``log_fn``, and held-out measurements through ``evaluate``.
  With ``ptx_coef > 0`` every update also takes that multiple of the SFT loss on a batch of
  ``ptx_items`` (prompts with their answers, the SFT data): InstructGPT's PPO-ptx
  (Ouyang et al. 2022), which mixes the original training objective into the RL update to
  reduce the alignment tax.
* :func:`dpo_train`: DPO (Rafailov et al. 2023) from a copy of a model on preference pairs
  given as token ids, the reference's log-probabilities computed once.
* :func:`verifier_pairs`: preference pairs from a model's own sampled answers as the reward
  rule judges them: within each group of answers to one prompt, each wrong answer paired with
  a right one. :func:`preference_set` builds the chapter's one preference data set this way,
  with a fixed train/validation split, and it feeds both the reward model
  (:func:`reward_model_train`, Bradley-Terry, 10.1) and DPO (10.2).
* :func:`exact_reward`: the rule as a reward, 1 for the correct answer and 0 otherwise.
* :func:`ppo_train`: PPO as RLHF runs it (Ziegler et al. 2019; Ouyang et al. 2022), at the
  same scale: a value head on the policy's last hidden state (:class:`ValueHead`), the per-token
  KL to ``reference`` folded into the reward, advantages by GAE, whitened, and the clipped value
  loss beside the clipped surrogate. It samples one answer per prompt where GRPO samples a
  group: the value model is its baseline.
* :func:`exact_kl`: KL(p || q) between two models' full next-token distributions, per position
  (batch, t). Averaged over the answer tokens of a fixed set of held-out prompts it tracks how
  far a policy has moved, without the noise of a per-batch sample estimate.
* :func:`kl_loss_gradient`: for one categorical distribution pi = softmax(theta), the exact
  expected gradient, over answers sampled from pi, of each way of putting a KL penalty into
  the objective: the k1 or k3 estimate as a loss term (GRPO puts k3 there), or k1 folded into
  the reward that the policy gradient weights (InstructGPT, Ziegler et al. 2019). Only the
  last is the gradient of KL(pi || pi_ref); k3 as a loss has the gradient of
  KL(pi_ref || pi), and k1 as a loss has none.

Shapes: token ids (batch, t); per-token quantities (batch, t - 1), aligned with the targets
``input_ids[:, 1:]``; rewards (batch,).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn

from lecture_pkg import seeds
from lecture_pkg.alignment import (
    ChatTokenizer,
    Rollout,
    bradley_terry_loss,
    completion_loss,
    dpo_loss,
    encode_chat,
    generate_answers,
    group_advantages,
    grpo_loss,
    kl_penalty,
    ppo_clip_loss,
)
from lecture_pkg.checks import check_bool_mask, check_float_tensor, check_int
from lecture_pkg.lm_eval import pad_right, sequence_logprobs, token_logprobs
from lecture_pkg.models.gpt import GPT, GPTForSequenceClassification
from lecture_pkg.policy_gradient import gae, kl_shaped_rewards, masked_mean, value_loss, whiten
from lecture_pkg.shakespeare_tasks import shakespeare_instructions

__all__ = ["CHAPTER_VALIDATION_PROMPTS", "PreferencePairs", "PreferenceSet", "RLRun",
           "ValueHead", "chapter_preference_set", "dpo_train", "exact_kl", "exact_reward",
           "grpo_train", "kl_loss_gradient", "masked_answer_kl", "ppo_train", "preference_set",
           "reward_model_train", "verifier_pairs"]


class _Prompted(Protocol):
    prompt: str


class _Answered(Protocol):
    prompt: str
    answer: str


def exact_reward(texts: Sequence[str], items: Sequence[_Answered]) -> Tensor:
    """The known rule as a reward: 1.0 where ``texts[i] == items[i].answer``, else 0.0,
    (len(texts),) float."""
    if len(texts) != len(items):
        raise ValueError(f"texts has {len(texts)} entries but items {len(items)}")
    return torch.tensor([float(t == it.answer) for t, it in zip(texts, items)])


RewardFn = Callable[[list[str], list], Tensor]


class RLRun(NamedTuple):
    """What :func:`grpo_train` and :func:`ppo_train` return.

    policy: the trained copy (eval mode); curve: one dict per step with the batch's mean
    ``reward``, its ``kl`` estimate (k3 for GRPO, k1 for PPO), the share of ``mixed`` groups
    (GRPO: not all rewards equal) or the ``value_loss`` (PPO), and whatever ``log_fn``
    returned; evals: one dict per evaluation, with its ``step`` (0 is
    before any update, ``steps`` after the last) and whatever ``evaluate`` returned.
    """

    policy: GPT
    curve: list[dict[str, float]]
    evals: list[dict[str, float]]


def grpo_train(model: GPT, reference: GPT, tokenizer: ChatTokenizer,
               items: Sequence[_Prompted], reward_fn: RewardFn, steps: int, beta: float,
               seed: int, *, prompts: int = 4, group: int = 8, lr: float = 3e-4,
               clip_eps: float = 0.2, inner_steps: int = 2, max_new_tokens: int = 12,
               log_fn: Callable[[list[str], list], dict[str, float]] | None = None,
               evaluate: Callable[[GPT], dict[str, float]] | None = None,
               eval_every: int = 0, ptx_coef: float = 0.0,
               ptx_items: Sequence[_Answered] = (), ptx_batch: int = 16) -> RLRun:
    """GRPO from a copy of ``model``, with ``reference`` (frozen) in the KL penalty.

    Each step draws ``prompts`` items (with replacement, from a CPU generator seeded
    with ``seed``), samples ``group`` answers to each (a device generator seeded
    with ``seed``), scores them with ``reward_fn(texts, items) -> (batch,)`` float
    rewards, and takes ``inner_steps`` AdamW steps on ``grpo_loss`` (PPO's clip
    against the batch's sampling policy, ``beta`` times the k3 KL to ``reference``;
    gradients clipped to norm 1). The first inner step sees ratio 1; later ones see
    the ratio move. ``evaluate(policy)`` runs before the first step, every
    ``eval_every`` steps (0: never in between) and after the last; it must draw its
    own random numbers (a generator of its own), not the loop's.

    PPO-ptx: with ``ptx_coef > 0`` each step also draws ``ptx_batch`` of ``ptx_items``
    (prompt and answer; a CPU generator of its own, seeded with ``seed``, so the RL
    batches are those of the run without it), and every inner step adds ``ptx_coef``
    times their SFT loss (:func:`~lecture_pkg.alignment.completion_loss`) to the GRPO
    loss; the curve logs it as ``ptx``. ``ptx_coef = 0`` is plain GRPO.
    """
    check_int("group", group, minimum=2)
    _check_loop(items, steps, prompts, inner_steps, eval_every, seed, beta)
    if ptx_coef < 0:
        raise ValueError(f"ptx_coef must be >= 0, got {ptx_coef}")
    if ptx_coef > 0:
        check_int("ptx_batch", ptx_batch, minimum=1)
        if not ptx_items:
            raise ValueError("ptx_coef > 0 needs ptx_items, the SFT data to mix in")
    device = next(model.parameters()).device
    policy = copy.deepcopy(model)
    reference.eval()
    opt, sampler, picks = _optimiser_and_generators(policy, lr, seed, device)
    ptx_picks = torch.Generator().manual_seed(seed)
    curve: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []

    _measure(evals, evaluate, 0, policy)
    for step in range(steps):
        batch, out, rewards = _rollout(policy, tokenizer, items, reward_fn, prompts, group,
                                       picks, sampler, max_new_tokens)
        advantages = group_advantages(rewards, group).to(device)
        by_group = rewards.view(prompts, group)
        mixed = (by_group.max(1).values > by_group.min(1).values).float().mean()
        mask = out.completion_mask[:, 1:]
        with torch.no_grad():
            old = token_logprobs(policy(out.ids, out.attention_mask).logits, out.ids)
            ref = token_logprobs(reference(out.ids, out.attention_mask).logits, out.ids)
        if ptx_coef > 0:
            drawn = torch.randint(len(ptx_items), (ptx_batch,), generator=ptx_picks)
            rows = [encode_chat(tokenizer, ptx_items[int(i)].prompt, ptx_items[int(i)].answer)
                    for i in drawn]
            ptx_ids, _, ptx_mask = (t.to(device) for t in pad_right(rows, _pad_id(tokenizer)))
        policy.train()
        for inner in range(inner_steps):
            logp = token_logprobs(policy(out.ids, out.attention_mask).logits, out.ids)
            loss, kl = grpo_loss(logp, old, ref, advantages, mask, clip_eps, beta)
            row = {"step": step, "reward": rewards.mean().item(), "kl": kl.item(),
                   "mixed": mixed.item()}
            if ptx_coef > 0:
                ptx = completion_loss(policy(ptx_ids).logits, ptx_ids, ptx_mask)
                loss = loss + ptx_coef * ptx
                row["ptx"] = ptx.item()
            if inner == 0:
                _record(curve, row, log_fn, out.texts, batch)
            _update(loss, policy, opt)
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            _measure(evals, evaluate, step + 1, policy)
    _measure(evals, evaluate, steps, policy)
    return RLRun(policy.eval(), curve, evals)


def _pad_id(tokenizer: ChatTokenizer) -> int:
    return tokenizer.special_tokens["<|pad|>"]


class PreferencePairs(NamedTuple):
    """Preference pairs: for each ``i``, ``chosen[i]`` is preferred to ``rejected[i]`` as an
    answer to ``items[i]`` (each entry one pair; an item may appear in several)."""

    items: list
    chosen: list[str]
    rejected: list[str]

    def rows(self, tokenizer: ChatTokenizer) -> tuple[Tensor, Tensor, Tensor]:
        """The pairs as right-padded chat-template rows, the ``n`` chosen answers first and
        the ``n`` rejected ones after them in the same order (what :func:`dpo_train` and
        :func:`reward_model_train` take): (input_ids, attention_mask, completion_mask), each
        (2 n, t), on the CPU."""
        if not self.items:
            raise ValueError("no pairs to lay out: the set is empty")
        both = [encode_chat(tokenizer, it.prompt, a) for it, a in zip(self.items, self.chosen)]
        both += [encode_chat(tokenizer, it.prompt, a)
                 for it, a in zip(self.items, self.rejected)]
        return pad_right(both, _pad_id(tokenizer))


class PreferenceSet(NamedTuple):
    """:func:`preference_set`'s pairs: ``train`` from the training items, ``validation`` from
    the held-out ones; no prompt is in both."""

    train: PreferencePairs
    validation: PreferencePairs


def verifier_pairs(model: GPT, tokenizer: ChatTokenizer, items: Sequence[_Answered],
                   reward_fn: RewardFn, group: int, seed: int, *, batch: int = 64,
                   max_new_tokens: int = 12) -> PreferencePairs:
    """Preference pairs from ``model``'s own sampled answers, judged by ``reward_fn``.

    Samples ``group`` answers to every item (a device generator seeded with ``seed``,
    ``batch`` answers at a time); within each item's group, every answer with a reward
    below the group's best is paired, as rejected, with a best-scoring answer of the group
    (taken in turn), as chosen. A group whose answers all score the same gives no pair, as
    it gives GRPO no advantage. Returns (items, chosen texts, rejected texts), one entry
    per pair.
    """
    check_int("seed", seed, minimum=0)
    sampler = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    return _sampled_pairs(model, tokenizer, items, reward_fn, group, sampler, batch,
                          max_new_tokens, "items")


def preference_set(model: GPT, tokenizer: ChatTokenizer, train_items: Sequence[_Answered],
                   validation_items: Sequence[_Answered], reward_fn: RewardFn, group: int,
                   seed: int, *, batch: int = 64, max_new_tokens: int = 12) -> PreferenceSet:
    """The chapter's preference data: pairs of ``model``'s own sampled answers, ranked by the
    rule ``reward_fn`` (the gold reward), with a fixed train/validation split.

    As :func:`verifier_pairs` on ``train_items`` and then on ``validation_items``, both
    sampled from one device generator seeded with ``seed`` (the same seed gives the same
    set). The split is the one the caller fixes (for the chapter: training plays against
    held-out plays); a validation prompt that is also a training prompt is refused, so the
    validation pairs measure a judge on prompts it never trained on. The set feeds both a
    reward model (:func:`reward_model_train`) and DPO (:func:`dpo_train`), through
    :meth:`PreferencePairs.rows`.
    """
    check_int("seed", seed, minimum=0)
    shared = sorted({it.prompt for it in train_items} & {it.prompt for it in validation_items})
    if shared:
        raise ValueError(f"validation_items shares {len(shared)} prompts with train_items "
                         f"(first: {shared[0]!r}); the split must be disjoint")
    sampler = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    train = _sampled_pairs(model, tokenizer, train_items, reward_fn, group, sampler, batch,
                           max_new_tokens, "train_items")
    validation = _sampled_pairs(model, tokenizer, validation_items, reward_fn, group,
                                sampler, batch, max_new_tokens, "validation_items")
    return PreferenceSet(train, validation)


CHAPTER_VALIDATION_PROMPTS = 600  # held-out-play instructions behind the validation pairs


def chapter_preference_set(model: GPT, tokenizer: ChatTokenizer, prompts: int
                           ) -> PreferenceSet:
    """The one preference set of chapter 10, so that 10.2's reward model, 10.3's DPO and 10.4's
    proxy reward learn from the same pairs: :func:`preference_set` on the first ``prompts``
    training instructions (``shakespeare_instructions("train", prompts, seed=0)``, a prefix of
    the pages' training set) against :data:`CHAPTER_VALIDATION_PROMPTS` instructions of the
    held-out plays (seed 1), four answers sampled per prompt with the sampling seed
    ``seeds(1, start=10)[0]`` (so it follows ``LECTURE_SEED_OFFSET``), ranked by
    :func:`exact_reward`."""
    check_int("prompts", prompts, minimum=1)
    return preference_set(model, tokenizer, shakespeare_instructions("train", prompts, seed=0),
                          shakespeare_instructions("test", CHAPTER_VALIDATION_PROMPTS, seed=1),
                          exact_reward, group=4, seed=seeds(1, start=10)[0])


def _sampled_pairs(model: GPT, tokenizer: ChatTokenizer, items: Sequence[_Answered],
                   reward_fn: RewardFn, group: int, sampler: torch.Generator, batch: int,
                   max_new_tokens: int, name: str) -> PreferencePairs:
    """:func:`verifier_pairs` with the sampling generator given; ``name`` names ``items``
    in errors."""
    check_int("group", group, minimum=2)
    check_int("batch", batch, minimum=1)
    if not items:
        raise ValueError(f"{name} must be a non-empty sequence of items with an answer")
    repeated = [it for it in items for _ in range(group)]
    texts: list[str] = []
    for start in range(0, len(repeated), batch):
        chunk = repeated[start:start + batch]
        texts += generate_answers(model, tokenizer, [it.prompt for it in chunk],
                                  max_new_tokens=max_new_tokens, do_sample=True,
                                  generator=sampler).texts
    rewards = reward_fn(texts, repeated).float().cpu()
    if rewards.shape != (len(repeated),):
        raise ValueError(f"reward_fn must return ({len(repeated)},) rewards, got "
                         f"shape {tuple(rewards.shape)}")
    rewards = rewards.view(len(items), group)
    pairs = PreferencePairs([], [], [])
    for i, item in enumerate(items):
        scores = rewards[i].tolist()
        answers = texts[i * group:(i + 1) * group]
        top = max(scores)
        best = [a for a, r in zip(answers, scores) if r == top]
        worse = [a for a, r in zip(answers, scores) if r < top]
        for k, answer in enumerate(worse):
            pairs.items.append(item)
            pairs.chosen.append(best[k % len(best)])
            pairs.rejected.append(answer)
    return pairs


def reward_model_train(model: GPT, ids: Tensor, attention_mask: Tensor, steps: int,
                       seed: int, *, batch: int = 8, lr: float = 3e-4
                       ) -> GPTForSequenceClassification:
    """A Bradley-Terry reward model: a copy of ``model`` with a scalar head on the last real
    token (``GPTForSequenceClassification(.., num_labels=1)``, as InstructGPT), trained on
    ``n`` preference pairs.

    ids, attention_mask: (2 n, t), right-padded rows, the chosen answers first and the
    rejected ones after them in the same order (:meth:`PreferencePairs.rows`). The head is
    initialised under ``torch.manual_seed(seed)``; each step draws ``batch`` pairs with
    replacement (a CPU generator seeded with ``seed``) and takes one AdamW step (no weight
    decay) on :func:`~lecture_pkg.alignment.bradley_terry_loss`. Returned in eval mode; its
    forward(ids, attention_mask)[:, 0] is the reward, (batch,).
    """
    n = _check_pair_rows(ids, attention_mask, "attention_mask", steps, batch, seed)
    device = next(model.parameters()).device
    ids, attention_mask = ids.to(device), attention_mask.to(device)
    torch.manual_seed(seed)
    reward_model = GPTForSequenceClassification(copy.deepcopy(model), num_labels=1).to(device)
    reward_model.train()
    opt = torch.optim.AdamW(reward_model.parameters(), lr=lr, weight_decay=0.0)
    for both in _pair_batches(n, batch, steps, seed, device):
        rewards = reward_model(ids[both], attention_mask[both])[:, 0]
        bradley_terry_loss(rewards[:batch], rewards[batch:]).backward()
        opt.step()
        opt.zero_grad()
    return reward_model.eval()


def _check_pair_rows(ids: Tensor, mask: Tensor, mask_name: str, steps: int, batch: int,
                     seed: int) -> int:
    """The checks of a loop over preference-pair rows; returns ``n``, the number of pairs
    in ``ids`` (2 n, t), whose ``mask`` must have the same shape."""
    check_int("steps", steps, minimum=1)
    check_int("batch", batch, minimum=1)
    check_int("seed", seed, minimum=0)
    if ids.dim() != 2 or ids.shape[0] % 2 or ids.shape != mask.shape:
        raise ValueError(f"ids and {mask_name} must both be (2 n, t), got "
                         f"{tuple(ids.shape)} and {tuple(mask.shape)}")
    return ids.shape[0] // 2


def _pair_batches(n: int, batch: int, steps: int, seed: int,
                  device: torch.device) -> Iterator[Tensor]:
    """For each of ``steps`` steps, ``batch`` of ``n`` pairs drawn with replacement (a CPU
    generator seeded with ``seed``) as row indices into (2 n, t) pair rows, on ``device``:
    the chosen rows, then the rejected rows of the same pairs, (2 batch,)."""
    picks = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        pick = torch.randint(n, (batch,), generator=picks)
        yield torch.cat([pick, pick + n]).to(device)


def dpo_train(model: GPT, reference: GPT, ids: Tensor, completion_mask: Tensor,
              steps: int, beta: float, seed: int, *, batch: int = 8, lr: float = 5e-5,
              evaluate: Callable[[GPT], dict[str, float]] | None = None,
              eval_every: int = 0) -> RLRun:
    """DPO from a copy of ``model`` on ``n`` preference pairs, ``reference`` frozen.

    ids, completion_mask: (2 n, t), right-padded chat-template rows (prompt and answer,
    :func:`~lecture_pkg.alignment.encode_chat`), the ``n`` chosen answers first and the
    ``n`` rejected ones after them in the same order. The reference's sequence
    log-probabilities are computed once. Each step draws ``batch`` pairs with replacement
    (a CPU generator seeded with ``seed``) and takes one AdamW step (no weight decay, no
    gradient clipping) on :func:`~lecture_pkg.alignment.dpo_loss`. The curve logs the
    batch's ``loss`` and mean ``margin`` (chosen minus rejected implicit reward);
    ``evaluate`` as in :func:`grpo_train`.
    """
    check_int("eval_every", eval_every, minimum=0)
    check_bool_mask("completion_mask", completion_mask)
    n = _check_pair_rows(ids, completion_mask, "completion_mask", steps, batch, seed)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    reference.eval()
    with torch.no_grad():
        ref = sequence_logprobs(reference(ids).logits, ids, completion_mask)
    policy = copy.deepcopy(model)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    curve: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []

    _measure(evals, evaluate, 0, policy)
    for step, both in enumerate(_pair_batches(n, batch, steps, seed, ids.device)):
        policy.train()
        logp = sequence_logprobs(policy(ids[both]).logits, ids[both], completion_mask[both])
        loss, r_c, r_r = dpo_loss(logp[:batch], logp[batch:], ref[both][:batch],
                                  ref[both][batch:], beta)
        loss.backward()
        opt.step()
        opt.zero_grad()
        curve.append({"step": step, "loss": loss.item(), "margin": (r_c - r_r).mean().item()})
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            _measure(evals, evaluate, step + 1, policy)
    _measure(evals, evaluate, steps, policy)
    return RLRun(policy.eval(), curve, evals)


def _check_loop(items: Sequence[_Prompted], steps: int, prompts: int, inner_steps: int,
                eval_every: int, seed: int, beta: float) -> None:
    check_int("steps", steps, minimum=1)
    check_int("prompts", prompts, minimum=1)
    check_int("inner_steps", inner_steps, minimum=1)
    check_int("eval_every", eval_every, minimum=0)
    check_int("seed", seed, minimum=0)
    if not items:
        raise ValueError("items must be a non-empty sequence of prompted items")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")


def _optimiser_and_generators(module: nn.Module, lr: float, seed: int, device: torch.device
                              ) -> tuple[torch.optim.AdamW, torch.Generator, torch.Generator]:
    """AdamW without weight decay on ``module``, and the loop's generators seeded with
    ``seed``: one on ``device`` that samples answers, one on the CPU that draws prompts."""
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0)
    return (opt, torch.Generator(device=device).manual_seed(seed),
            torch.Generator().manual_seed(seed))


def _measure(evals: list[dict[str, float]],
             evaluate: Callable[[GPT], dict[str, float]] | None, step: int,
             policy: GPT) -> None:
    """Append ``evaluate(policy)`` (policy in eval mode) to ``evals`` with its ``step``."""
    if evaluate is not None:
        evals.append({"step": step, **evaluate(policy.eval())})


def _record(curve: list[dict[str, float]], row: dict[str, float],
            log_fn: Callable[[list[str], list], dict[str, float]] | None, texts: list[str],
            batch: list) -> None:
    """Append one step's ``row`` to ``curve``, with what ``log_fn`` says of the batch."""
    if log_fn is not None:
        row.update(log_fn(texts, batch))
    curve.append(row)


def _update(loss: Tensor, module: nn.Module, opt: torch.optim.Optimizer) -> None:
    """One optimiser step on ``loss``, gradients clipped to norm 1."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
    opt.step()
    opt.zero_grad()


def _rollout(policy: GPT, tokenizer: ChatTokenizer, items: Sequence[_Prompted],
             reward_fn: RewardFn, prompts: int, group: int, picks: torch.Generator,
             sampler: torch.Generator, max_new_tokens: int) -> tuple[list, Rollout, Tensor]:
    """Draw ``prompts`` items, sample ``group`` answers to each, score them: the items (each
    repeated ``group`` times), the rollout and the (batch,) float rewards on the CPU."""
    drawn = torch.randint(len(items), (prompts,), generator=picks)
    batch = [items[int(i)] for i in drawn for _ in range(group)]
    out = generate_answers(policy, tokenizer, [it.prompt for it in batch],
                           max_new_tokens=max_new_tokens, do_sample=True, generator=sampler)
    rewards = reward_fn(out.texts, batch).float().cpu()
    if rewards.shape != (len(batch),):
        raise ValueError(f"reward_fn must return ({len(batch)},) rewards, got "
                         f"shape {tuple(rewards.shape)}")
    return batch, out, rewards


class ValueHead(nn.Module):
    """A scalar value per position from a GPT's last hidden state: forward(ids, attention_mask)
    -> (logits (batch, t, vocab), values (batch, t)). The linear head starts at zero, so the
    first values are 0 and the first advantages the plain returns."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model
        self.head = nn.Linear(model.config.n_embd, 1, device=next(model.parameters()).device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
        out = self.model(input_ids, attention_mask)
        return out.logits, self.head(out.last_hidden_state).squeeze(-1)


def ppo_train(model: GPT, reference: GPT, tokenizer: ChatTokenizer,
              items: Sequence[_Prompted], reward_fn: RewardFn, steps: int, beta: float,
              seed: int, *, prompts: int = 32, lr: float = 3e-4, clip_eps: float = 0.2,
              inner_steps: int = 2, max_new_tokens: int = 12, gamma: float = 1.0,
              lam: float = 0.95, value_coef: float = 0.1, value_clip: float = 0.2,
              log_fn: Callable[[list[str], list], dict[str, float]] | None = None,
              evaluate: Callable[[GPT], dict[str, float]] | None = None,
              eval_every: int = 0) -> RLRun:
    """PPO from a copy of ``model`` with a :class:`ValueHead` on it, ``reference`` frozen.

    Each step draws ``prompts`` items and samples one answer to each (generators seeded with
    ``seed``, as :func:`grpo_train`), scores them with ``reward_fn``, and builds per-token
    rewards: ``-beta * (log pi_old - log pi_ref)`` on every answer token plus the score on the
    last (:func:`~lecture_pkg.policy_gradient.kl_shaped_rewards`). GAE (``gamma``, ``lam``)
    on the batch's value estimates gives advantages, whitened over the answer tokens, and
    returns; ``inner_steps`` AdamW steps then minimise the clipped surrogate plus
    ``value_coef`` times the clipped value loss (gradients clipped to norm 1). ``evaluate``
    as in :func:`grpo_train`; the returned policy is the GPT, without its value head.
    """
    _check_loop(items, steps, prompts, inner_steps, eval_every, seed, beta)
    device = next(model.parameters()).device
    agent = ValueHead(copy.deepcopy(model))
    reference.eval()
    opt, sampler, picks = _optimiser_and_generators(agent, lr, seed, device)
    curve: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []

    _measure(evals, evaluate, 0, agent.model)
    for step in range(steps):
        batch, out, scores = _rollout(agent.model.eval(), tokenizer, items, reward_fn,
                                      prompts, 1, picks, sampler, max_new_tokens)
        mask = out.completion_mask[:, 1:]
        with torch.no_grad():
            logits, values = agent(out.ids, out.attention_mask)
            old = token_logprobs(logits, out.ids)
            old_values = values[:, :-1]  # the value of each state, before its next token
            ref = token_logprobs(reference(out.ids, out.attention_mask).logits, out.ids)
            rewards = kl_shaped_rewards(scores.to(device), old, ref, mask, beta)
            advantages, returns = gae(rewards, old_values, mask, gamma, lam)
            advantages = whiten(advantages, mask)
        agent.train()
        for inner in range(inner_steps):
            logits, values = agent(out.ids, out.attention_mask)
            logp = token_logprobs(logits, out.ids)
            v_loss = value_loss(values[:, :-1], old_values, returns, mask, value_clip)
            loss = ppo_clip_loss(logp, old, advantages, mask, clip_eps) + value_coef * v_loss
            if inner == 0:
                _record(curve, {"step": step, "reward": scores.mean().item(),
                                "kl": masked_mean(old - ref, mask).item(),
                                "value_loss": v_loss.item()}, log_fn, out.texts, batch)
            _update(loss, agent, opt)
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            _measure(evals, evaluate, step + 1, agent.model)
    _measure(evals, evaluate, steps, agent.model)
    return RLRun(agent.model.eval(), curve, evals)


def exact_kl(logits: Tensor, reference_logits: Tensor) -> Tensor:
    """KL(p || q) of the next-token distributions p = softmax(logits) and
    q = softmax(reference_logits) at every position, in float32 or wider.

    logits, reference_logits: (batch, t, vocab) -> (batch, t). Summed over the whole vocabulary,
    so it is the exact divergence, not a sample estimate.
    """
    check_float_tensor("logits", logits)
    check_float_tensor("reference_logits", reference_logits)
    if logits.shape != reference_logits.shape or logits.dim() != 3:
        raise ValueError(f"logits and reference_logits must both be (batch, t, vocab), got "
                         f"{tuple(logits.shape)} and {tuple(reference_logits.shape)}")
    dtype = torch.promote_types(logits.dtype, torch.float32)
    logp = torch.log_softmax(logits.to(dtype), -1)
    logq = torch.log_softmax(reference_logits.to(dtype), -1)
    return (logp.exp() * (logp - logq)).sum(-1)


def masked_answer_kl(logits: Tensor, reference_logits: Tensor, completion_mask: Tensor
                     ) -> Tensor:
    """Mean exact per-token KL(pi || pi_ref) over the answer tokens of a batch (a scalar).

    logits, reference_logits: (batch, t, vocab) of the same ids; completion_mask: (batch, t)
    bool, True on the answer tokens (as :class:`~lecture_pkg.alignment.Rollout` gives it). The
    distribution that predicts answer token i sits at position i - 1.
    """
    check_bool_mask("completion_mask", completion_mask)
    if completion_mask.shape != logits.shape[:2]:
        raise ValueError(f"completion_mask must be {tuple(logits.shape[:2])}, got "
                         f"{tuple(completion_mask.shape)}")
    kl = exact_kl(logits[:, :-1], reference_logits[:, :-1])
    mask = completion_mask[:, 1:]
    return (kl * mask).sum() / mask.sum().clamp(min=1)


def kl_loss_gradient(logits: Tensor, reference_logprobs: Tensor, how: str) -> Tensor:
    """Exact expected gradient with respect to ``logits`` of a KL penalty built from samples
    y ~ pi = softmax(logits) of one categorical distribution, (vocab,) -> (vocab,).

    ``how``: "k1 loss" or "k3 loss": the estimator (:func:`~lecture_pkg.alignment.kl_penalty`)
    averaged over samples as a term of the loss, differentiated through log pi(y) with the
    samples fixed (what autograd does to GRPO's KL term); "k1 reward": k1 = log pi(y) -
    log pi_ref(y) subtracted from the reward, so the score-function (REINFORCE) gradient
    E[k1(y) * grad log pi(y)] carries it (InstructGPT's per-token penalty). The expectation is
    the sum over the vocabulary weighted by pi, computed exactly.
    """
    check_float_tensor("logits", logits)
    check_float_tensor("reference_logprobs", reference_logprobs)
    if logits.dim() != 1 or logits.shape != reference_logprobs.shape:
        raise ValueError(f"logits and reference_logprobs must both be (vocab,), got "
                         f"{tuple(logits.shape)} and {tuple(reference_logprobs.shape)}")
    theta = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    weights = logp.detach().exp()  # the sampling distribution: not differentiated
    if how in ("k1 loss", "k3 loss"):
        per_answer = kl_penalty(logp, reference_logprobs, how.split()[0])
        objective = (weights * per_answer).sum()
    elif how == "k1 reward":
        penalty = (logp - reference_logprobs).detach()
        objective = (weights * penalty * logp).sum()
    else:
        raise ValueError("how must be 'k1 loss', 'k3 loss' or 'k1 reward', "
                         f"got {how!r}")
    (grad,) = torch.autograd.grad(objective, theta)
    return grad
