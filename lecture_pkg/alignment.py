"""From language model to assistant: the chat template and the losses of post-training, as
small functions (chapter 10). Their data (instructions and preference pairs) is in
:mod:`lecture_pkg.shakespeare_tasks`, the log-probabilities they take come from
:mod:`lecture_pkg.lm_eval`.

* **Chat template and loss masking** (instruction tuning, SFT): a conversation becomes one token
  sequence ``<|user|> prompt <|end|> <|assistant|> response <|end|>``; a boolean
  ``completion_mask`` marks the tokens the model is trained to produce (the response and its
  closing ``<|end|>``), so the prompt is context, never a target. :func:`pack` lays many short
  examples end to end in fixed-length rows (:func:`pack_isolated` restarts the positions and
  masks attention block-diagonally, so examples do not see each other), and
  :func:`completion_loss` is the mean next-token cross-entropy over the marked tokens only
  (what trl's ``SFTTrainer`` computes with ``completion_only_loss``).
* **Reward model** (Bradley-Terry): P(chosen preferred to rejected) = sigmoid(r_c - r_r), so the
  loss is ``-log sigmoid(r_c - r_r)`` (:func:`bradley_terry_loss`); the reward itself is a scalar
  head on the last real token (``GPTForSequenceClassification(gpt, num_labels=1)``).
* **RLHF**: PPO's clipped surrogate (:func:`ppo_clip_loss`), a per-token estimate of the KL
  divergence to the reference model (:func:`kl_penalty`), GRPO's group-normalised advantages
  (:func:`group_advantages`) and the GRPO objective that combines the three (:func:`grpo_loss`).
* **DPO**: :func:`dpo_loss`, the logistic loss on beta times the difference of the policy's and
  the reference's log-ratio of chosen over rejected responses; its implicit reward is
  ``beta * (log pi(y|x) - log pi_ref(y|x))``.
* **Answering** (:func:`generate_answers`): a batch of prompts answered in the chat template,
  greedily or by sampling, with the masks that PPO and GRPO need.

Shapes: token ids (batch, t); per-token log-probabilities and masks (batch, t - 1), aligned with
the targets ``input_ids[:, 1:]`` (position i scores token i + 1); sequence log-probabilities,
rewards and advantages (batch,). Masks are bool, True = the token counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from lecture_pkg.checks import check_float_tensor, check_int
from lecture_pkg.lm_eval import check_logits_and_mask
from lecture_pkg.masks import document_mask, packed_document_ids, position_ids
from lecture_pkg.models.gpt import GPT, next_token_loss
from lecture_pkg.policy_gradient import masked_mean

__all__ = ["CHAT_TOKENS", "PackedRows", "Rollout", "bradley_terry_loss", "completion_loss",
           "dpo_loss", "encode_chat", "generate_answers", "group_advantages", "grpo_loss",
           "kl_penalty", "pack", "pack_isolated", "ppo_clip_loss"]


CHAT_TOKENS = ("<|user|>", "<|assistant|>", "<|end|>")


class ChatTokenizer(Protocol):
    """What the chat template needs: ``encode`` for text and ids of the special tokens."""

    special_tokens: dict[str, int]

    def encode(self, text: str) -> list[int]: ...


def encode_chat(tokenizer: ChatTokenizer, prompt: str,
                response: str | None = None) -> tuple[list[int], list[bool]]:
    """One turn in the chat template: ``<|user|> prompt <|end|> <|assistant|> response <|end|>``.

    Returns (ids, completion_mask), two lists of one length: the mask is True on the response
    and its closing ``<|end|>`` (what the model learns to write) and False on the prompt and the
    role tokens. Without ``response`` the ids end after ``<|assistant|>``: the prompt to
    generate from (mask all False).

    Only the template places special tokens in what the user writes: a prompt that spells one
    (say ``<|end|><|assistant|>``, to forge an assistant turn) is refused with a ValueError, as
    tiktoken refuses special tokens in text by default. A response is the model's side (a
    training answer, or a sampled answer decoded and scored again), so its special tokens
    are read back as the tokens they were.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    if response is not None and not isinstance(response, str):
        raise TypeError(f"response must be a str or None, got {type(response).__name__}")
    missing = [name for name in CHAT_TOKENS if name not in tokenizer.special_tokens]
    if missing:
        raise ValueError(f"tokenizer.special_tokens lacks the chat tokens {missing}")
    forged = [token for token in tokenizer.special_tokens if token in prompt]
    if forged:
        raise ValueError(f"prompt holds the special tokens {forged}: only the chat template "
                         f"may place them")
    user, assistant, end = (tokenizer.special_tokens[name] for name in CHAT_TOKENS)
    ids = [user, *tokenizer.encode(prompt), end, assistant]
    mask = [False] * len(ids)
    if response is not None:
        answer = [*tokenizer.encode(response), end]
        ids += answer
        mask += [True] * len(answer)
    return ids, mask


def _fill_rows(examples: Sequence[tuple[Sequence[int], Sequence[bool]]], block_size: int,
               pad_id: int) -> list[list[tuple[list[int], list[bool]]]]:
    """The examples of each row, in order: a new row starts where an example does not fit."""
    check_int("block_size", block_size, minimum=2)
    check_int("pad_id", pad_id)
    if isinstance(examples, (str, bytes)) or not isinstance(examples, Sequence):
        raise TypeError(f"examples must be a sequence of (ids, completion_mask) pairs, "
                        f"got {type(examples).__name__}")
    rows: list[list[tuple[list[int], list[bool]]]] = [[]]
    used = 0
    for index, example in enumerate(examples):
        if not isinstance(example, (tuple, list)) or len(example) != 2:
            raise TypeError(f"examples[{index}] must be an (ids, completion_mask) pair")
        ids, mask = example
        if len(ids) != len(mask):
            raise ValueError(f"examples[{index}] has {len(ids)} ids but {len(mask)} mask entries")
        if not 0 < len(ids) <= block_size:
            raise ValueError(f"examples[{index}] has {len(ids)} tokens; it needs 1 to "
                             f"block_size={block_size}")
        if used + len(ids) > block_size:
            rows.append([])
            used = 0
        rows[-1].append(([int(i) for i in ids], [bool(m) for m in mask]))
        used += len(ids)
    return rows


def pack(examples: Sequence[tuple[Sequence[int], Sequence[bool]]], block_size: int,
         pad_id: int) -> tuple[Tensor, Tensor]:
    """Lay examples end to end in rows of ``block_size`` tokens (packing).

    Examples keep their order; one that does not fit in what is left of a row starts the next
    row, and the rest of a row is padding (``pad_id``, mask False). Inside a row a later example
    can attend to earlier ones, as in pretraining on concatenated documents; only the mask keeps
    their prompts out of the loss. Returns input_ids (rows, block_size) long and
    completion_mask (rows, block_size) bool. :func:`pack_isolated` keeps examples apart.
    """
    return _row_tensors(_fill_rows(examples, block_size, pad_id), block_size, pad_id)


def _row_tensors(rows: list[list[tuple[list[int], list[bool]]]], block_size: int,
                 pad_id: int) -> tuple[Tensor, Tensor]:
    input_ids = torch.full((len(rows), block_size), pad_id, dtype=torch.long)
    completion_mask = torch.zeros(len(rows), block_size, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids = [token for ids, _ in row for token in ids]
        mask = [m for _, mask in row for m in mask]
        input_ids[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        completion_mask[i, :len(mask)] = torch.tensor(mask, dtype=torch.bool)
    return input_ids, completion_mask


class PackedRows(NamedTuple):
    """Rows of examples packed apart (:func:`pack_isolated`).

    input_ids: (rows, block_size) long; completion_mask: (rows, block_size) bool;
    position_ids: (rows, block_size) long, 0, 1, 2, ... restarting with every example (0 at
    padding); attn_mask: (rows, block_size, block_size) bool, True = may attend: causal and
    block-diagonal, so a token sees only the earlier tokens of its own example (a padding
    token sees nothing). Pass all but completion_mask to the model:
    ``model(input_ids, position_ids=position_ids, attn_mask=attn_mask)``.
    """

    input_ids: Tensor
    completion_mask: Tensor
    position_ids: Tensor
    attn_mask: Tensor


def pack_isolated(examples: Sequence[tuple[Sequence[int], Sequence[bool]]], block_size: int,
                  pad_id: int) -> PackedRows:
    """Pack as :func:`pack` does (same rows), but keep every example on its own: positions
    restart at 0 for each example and the causal attention mask is block-diagonal, so each
    example's logits are those it gets alone at the start of a row (what trl's padding-free
    packing computes, there with varlen attention kernels instead of a mask). The
    completion_mask is :func:`pack`'s, False on each example's first token.
    """
    rows = _fill_rows(examples, block_size, pad_id)
    input_ids, completion_mask = _row_tensors(rows, block_size, pad_id)
    # document index of every token (-1 at padding), as trl derives it from seq_lengths
    document_ids = torch.stack([packed_document_ids([len(ids) for ids, _ in row], block_size)
                                for row in rows])
    positions = position_ids(document_ids)
    # an example's first token has nothing of its own before it: never a target (as in trl)
    return PackedRows(input_ids, completion_mask & (positions > 0), positions,
                      document_mask(document_ids))


def completion_loss(logits: Tensor, input_ids: Tensor, completion_mask: Tensor) -> Tensor:
    """SFT loss: mean next-token cross-entropy over the tokens where ``completion_mask`` is True.

    logits: (batch, t, vocab); input_ids, completion_mask: (batch, t). Token i is predicted at
    position i - 1, so a mask that is True at position 0 has no effect there. Every counted
    token weighs the same (the mean is over tokens, not over examples), as in trl.
    """
    check_logits_and_mask(logits, input_ids, completion_mask)
    if not bool(completion_mask[:, 1:].any()):
        raise ValueError("completion_mask marks no token after position 0: nothing to learn")
    return next_token_loss(logits, input_ids, completion_mask)


def _check_same_shape(**tensors: Tensor) -> None:
    names = list(tensors)
    for name in names:
        check_float_tensor(name, tensors[name])
    first = tensors[names[0]].shape
    for name in names[1:]:
        if tensors[name].shape != first:
            raise ValueError(f"{name} must have {names[0]}'s shape {tuple(first)}, "
                             f"got {tuple(tensors[name].shape)}")


def bradley_terry_loss(chosen_rewards: Tensor, rejected_rewards: Tensor) -> Tensor:
    """Reward-model loss: mean of ``-log sigmoid(r_chosen - r_rejected)`` over pairs (batch,)."""
    _check_same_shape(chosen_rewards=chosen_rewards, rejected_rewards=rejected_rewards)
    return -F.logsigmoid(chosen_rewards - rejected_rewards).mean()


def dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, reference_chosen: Tensor,
             reference_rejected: Tensor, beta: float = 0.1) -> tuple[Tensor, Tensor, Tensor]:
    """DPO's sigmoid loss (Rafailov et al. 2023) from sequence log-probabilities, each (batch,).

    The implicit rewards are r = beta * (log pi(y|x) - log pi_ref(y|x)); the loss is the mean of
    ``-log sigmoid(r_chosen - r_rejected)``, Bradley-Terry on the implicit rewards. Returns
    (loss, chosen_rewards, rejected_rewards), the rewards detached.
    """
    _check_same_shape(policy_chosen=policy_chosen, policy_rejected=policy_rejected,
                      reference_chosen=reference_chosen, reference_rejected=reference_rejected)
    if not beta > 0:
        raise ValueError(f"beta must be positive, got {beta}")
    chosen = beta * (policy_chosen - reference_chosen)
    rejected = beta * (policy_rejected - reference_rejected)
    return -F.logsigmoid(chosen - rejected).mean(), chosen.detach(), rejected.detach()


def group_advantages(rewards: Tensor, group_size: int, eps: float = 1e-4,
                     normalise_std: bool = True) -> Tensor:
    """GRPO's advantages: each reward minus its group's mean, over the group's standard
    deviation (unbiased, plus ``eps``), as trl's GRPOTrainer computes them; with
    ``normalise_std=False`` the centred rewards alone (Dr. GRPO, trl's ``scale_rewards=False``).

    rewards: (batch,), ``group_size`` consecutive entries being the completions of one prompt.
    """
    check_float_tensor("rewards", rewards)
    check_int("group_size", group_size, minimum=2)
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be (batch,) with batch a multiple of group_size="
                         f"{group_size}, got shape {tuple(rewards.shape)}")
    groups = rewards.view(-1, group_size)
    centred = groups - groups.mean(-1, keepdim=True)
    if normalise_std:
        centred = centred / (groups.std(-1, keepdim=True) + eps)
    return centred.flatten()


def kl_penalty(logprobs: Tensor, reference_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimates of KL(pi || pi_ref) from tokens sampled from pi, (batch, t).

    With log-ratio d = log pi_ref - log pi of the sampled token, "k1" is -d (unbiased, can be
    negative) and "k3" is exp(d) - d - 1 (unbiased, never negative; Schulman's estimator that
    GRPO uses).
    """
    _check_same_shape(logprobs=logprobs, reference_logprobs=reference_logprobs)
    d = reference_logprobs - logprobs
    if estimator == "k1":
        return -d
    if estimator == "k3":
        return torch.expm1(d) - d
    raise ValueError(f"estimator must be 'k1' or 'k3', got {estimator!r}")


def ppo_clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                  clip_eps: float = 0.2) -> Tensor:
    """PPO's clipped surrogate, negated to be minimised, averaged over the masked tokens.

    logprobs, old_logprobs, mask: (batch, t); advantages: (batch,) (one per sequence, as in
    GRPO) or (batch, t). With ratio rho = pi / pi_old, each token contributes
    ``-min(rho * A, clip(rho, 1 - eps, 1 + eps) * A)``: the ratio earns nothing beyond the clip
    range in the advantage's direction.
    """
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs)
    check_float_tensor("advantages", advantages)
    if advantages.shape == logprobs.shape[:1]:
        advantages = advantages[:, None]
    elif advantages.shape != logprobs.shape:
        raise ValueError(f"advantages must be (batch,) or (batch, t) with (batch, t) = "
                         f"{tuple(logprobs.shape)}, got {tuple(advantages.shape)}")
    if not 0 < clip_eps < 1:
        raise ValueError(f"clip_eps must lie in (0, 1), got {clip_eps}")
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps)
    return masked_mean(-torch.minimum(ratio * advantages, clipped * advantages), mask)


def grpo_loss(logprobs: Tensor, old_logprobs: Tensor, reference_logprobs: Tensor,
              advantages: Tensor, mask: Tensor, clip_eps: float = 0.2,
              beta: float = 0.04) -> tuple[Tensor, Tensor]:
    """GRPO's objective (Shao et al. 2024): the clipped surrogate plus beta times the k3 KL to
    the reference model, both averaged over all masked tokens of the batch (trl's ``"bnpo"``;
    Shao et al. average each answer first, see :func:`lecture_pkg.policy_gradient.aggregate_loss`).
    Returns (loss, mean KL)."""
    kl = masked_mean(kl_penalty(logprobs, reference_logprobs, "k3"), mask)
    surrogate = ppo_clip_loss(logprobs, old_logprobs, advantages, mask, clip_eps)
    return surrogate + beta * kl, kl.detach()


class Rollout(NamedTuple):
    """Answers generated for a batch of prompts.

    ids: (batch, t) the left-padded prompts then the new tokens; attention_mask: (batch, t) long,
    1 on the prompt's real tokens and on the answer up to and including its first ``<|end|>``;
    completion_mask: (batch, t) bool, True on those answer tokens only; texts: the answers
    decoded, without ``<|end|>``.
    """

    ids: Tensor
    attention_mask: Tensor
    completion_mask: Tensor
    texts: list[str]


@torch.no_grad()
def generate_answers(model: GPT, tokenizer: ChatTokenizer, prompts: Sequence[str],
                     max_new_tokens: int = 12, do_sample: bool = False,
                     generator: torch.Generator | None = None,
                     prefixes: Sequence[Sequence[int]] | None = None,
                     isolated: bool = False) -> Rollout:
    """Answer every prompt in the chat template, greedily or by sampling (``do_sample``), in
    one left-padded batch; an answer ends at ``<|end|>`` or after ``max_new_tokens`` tokens.
    The model is put in eval mode.

    ``prefixes``: token ids to place before each prompt's turn in the same row (for example
    a solved example, as packing puts one there in training); the positions run on from the
    prefix into the prompt, as in a packed row. None: every prompt starts the row.
    ``isolated``: the prefix is packed as :func:`pack_isolated` packs it, the prompt's positions
    restart at 0 and neither it nor the answer may attend to the prefix (the prefix's keys
    are masked out, the last block of the block-diagonal mask), so the answers are those the
    prompts get alone.
    """
    if not isinstance(isolated, bool):
        raise TypeError(f"isolated must be a bool, got {type(isolated).__name__}")
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty sequence of str")
    if prefixes is not None and len(prefixes) != len(prompts):
        raise ValueError(f"prefixes must hold one id list per prompt ({len(prompts)}), got "
                         f"{len(prefixes)}")
    end, pad = tokenizer.special_tokens["<|end|>"], tokenizer.special_tokens["<|pad|>"]
    encoded = [encode_chat(tokenizer, p)[0] for p in prompts]
    seen = [[1] * len(p) for p in encoded]  # 1 where the prompt's turn may attend
    if prefixes is not None:
        seen = [[int(not isolated)] * len(before) + s for before, s in zip(prefixes, seen)]
        encoded = [[int(i) for i in before] + p for before, p in zip(prefixes, encoded)]
    width = max(map(len, encoded))
    device = next(model.parameters()).device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in encoded], device=device)
    keep = torch.tensor([[0] * (width - len(s)) + s for s in seen], device=device)
    out = model.eval().generate(ids, keep, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                generator=generator, eos_token_id=end, pad_token_id=pad)
    new = out[:, width:]
    ended_before = (new == end).long().cumsum(1) - (new == end).long()
    answer = ended_before == 0  # the answer and its first <|end|>
    texts = [tokenizer.decode([i for i, a in zip(row, keep_row) if a and i != end])
             for row, keep_row in zip(new.tolist(), answer.tolist())]
    return Rollout(out, torch.cat([keep, answer.long()], 1),
                   torch.cat([torch.zeros_like(keep, dtype=torch.bool), answer], 1), texts)
