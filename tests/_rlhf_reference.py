"""What the rlhf tests share: a tiny GPT on a tiny character vocabulary, an answered item, and
one GRPO step written out by hand from torch (tests/test_rlhf.py: plain GRPO;
tests/test_rlhf_ptx_dpo.py: GRPO with PPO-ptx's extra term), the reference that
lecture_pkg.rlhf.grpo_train's first step must equal."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from lecture_pkg.alignment import generate_answers, group_advantages
from lecture_pkg.char_tokenizers import CharTokenizer
from lecture_pkg.lm_eval import token_logprobs
from lecture_pkg.models.gpt import GPT, GPTConfig


class Item(NamedTuple):
    prompt: str
    answer: str


def tiny_tokenizer() -> CharTokenizer:
    return CharTokenizer.from_text("abcdefghij ?")


def tiny_gpt(tokenizer: CharTokenizer, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_positions=48, n_embd=16, n_layer=1,
                         n_head=2, dropout=0.0, embd_dropout=0.0)).eval()


class HandStep(NamedTuple):
    policy: GPT  # the model after the step
    texts: list[str]  # the sampled answers
    batch: list  # their items, each repeated ``group`` times
    kl: float  # the batch's k3 estimate


def grpo_step_by_hand(model: GPT, reference: GPT, tokenizer: CharTokenizer,
                      items: Sequence, reward: Callable[[list[str], list], Tensor], *,
                      seed: int, prompts: int, group: int, lr: float, beta: float,
                      extra: Callable[[GPT], Tensor] | None = None) -> HandStep:
    """grpo_train(..., steps=1, inner_steps=1) by hand: draw ``prompts`` items with a CPU
    generator seeded with ``seed``, sample ``group`` answers each (a generator seeded with
    ``seed``), group-normalised advantages, and one AdamW step (gradients clipped to norm 1)
    on the surrogate at ratio 1 (gradient of -A log pi per answer token, mean over the tokens)
    plus ``beta`` times the k3 KL to ``reference``, plus ``extra(policy)`` when given."""
    policy = copy.deepcopy(model)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    picks = torch.Generator().manual_seed(seed)
    batch = [items[int(i)] for i in torch.randint(len(items), (prompts,), generator=picks)]
    batch = [it for it in batch for _ in range(group)]
    out = generate_answers(policy, tokenizer, [it.prompt for it in batch], do_sample=True,
                           generator=torch.Generator().manual_seed(seed))
    adv = group_advantages(reward(out.texts, batch), group)
    mask = out.completion_mask[:, 1:]
    with torch.no_grad():
        ref = token_logprobs(reference(out.ids, out.attention_mask).logits, out.ids)
    logp = token_logprobs(policy.train()(out.ids, out.attention_mask).logits, out.ids)
    # first pass: ratio 1, so the clipped surrogate's gradient is that of -A log pi per token
    surrogate = -(adv[:, None] * logp * mask).sum() / mask.sum()
    d = ref - logp
    kl = ((torch.exp(d) - d - 1) * mask).sum() / mask.sum()
    loss = surrogate + beta * kl
    if extra is not None:
        loss = loss + extra(policy)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    opt.step()
    return HandStep(policy, out.texts, batch, kl.item())
