"""lecture_pkg.rlhf's PPO-ptx term in grpo_train, dpo_train and verifier_pairs, each against
the same computation written out by hand from torch (log-softmax, logsigmoid, AdamW), and
exact_reward against the rule."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from _rlhf_reference import Item, grpo_step_by_hand, tiny_gpt, tiny_tokenizer

from lecture_pkg.alignment import encode_chat, generate_answers
from lecture_pkg.char_tokenizers import CharTokenizer
from lecture_pkg.lm_eval import pad_right
from lecture_pkg.rlhf import dpo_train, exact_reward, grpo_train, verifier_pairs


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return tiny_tokenizer()


ITEMS = [Item("abc", "a"), Item("ba", "b"), Item("cab ?", "c"), Item("j", "jj")]


def test_exact_reward_is_the_rule():
    got = exact_reward(["a", "x", "c", ""], ITEMS)
    assert got.tolist() == [1.0, 0.0, 1.0, 0.0] and got.dtype == torch.float32
    with pytest.raises(ValueError, match="texts has"):
        exact_reward(["a"], ITEMS)


def test_grpo_ptx_step_equals_the_step_written_out(tokenizer):
    """One GRPO step with ptx_coef 0.5: the surrogate and KL at ratio 1 plus half the mean
    cross-entropy of the drawn SFT answers (their tokens and closing <|end|>), by hand."""
    model, reference = tiny_gpt(tokenizer), tiny_gpt(tokenizer, seed=1)
    sft_items = [Item("abc", "cba"), Item("de", "ed"), Item("f", "ff")]

    def reward(texts, batch):
        return torch.tensor([float(t.count("a")) for t in texts])

    run = grpo_train(model, reference, tokenizer, ITEMS, reward, steps=1, beta=0.1, seed=5,
                     prompts=2, group=3, lr=1e-2, inner_steps=1, ptx_coef=0.5,
                     ptx_items=sft_items, ptx_batch=4)
    drawn = torch.randint(3, (4,), generator=torch.Generator().manual_seed(5))
    terms = {}

    def ptx_term(policy):  # each SFT example alone, unpadded: the answer tokens' cross-entropy
        ce, count = 0.0, 0
        for i in drawn:
            ids, keep = encode_chat(tokenizer, sft_items[int(i)].prompt,
                                    sft_items[int(i)].answer)
            lp = F.log_softmax(policy(torch.tensor([ids])).logits[0, :-1], -1)
            for pos in range(1, len(ids)):
                if keep[pos]:
                    ce = ce - lp[pos - 1, ids[pos]]
                    count += 1
        terms["ptx"] = ce / count
        return 0.5 * terms["ptx"]

    policy = grpo_step_by_hand(model, reference, tokenizer, ITEMS, reward, seed=5, prompts=2,
                               group=3, lr=1e-2, beta=0.1, extra=ptx_term).policy
    ptx = terms["ptx"]
    assert run.curve[0]["ptx"] == pytest.approx(ptx.item(), rel=1e-5)
    # Adam's first step moves every weight by about lr = 1e-2 in its gradient's sign, so a
    # missing or wrong term shows at 1e-3 and more; 1e-5 absorbs the rounding of a weight
    # whose gradient is near 0 (the padded batch and the unpadded rows sum in other orders)
    for a, b in zip(run.policy.parameters(), policy.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    plain = grpo_train(model, reference, tokenizer, ITEMS, reward, steps=1, beta=0.1, seed=5,
                       prompts=2, group=3, lr=1e-2, inner_steps=1)
    assert plain.curve[0]["reward"] == run.curve[0]["reward"]  # the same RL batch
    assert "ptx" not in plain.curve[0]
    assert any((a - b).abs().max() > 1e-6
               for a, b in zip(run.policy.parameters(), plain.policy.parameters()))
    with pytest.raises(ValueError, match="ptx_items"):
        grpo_train(model, reference, tokenizer, ITEMS, reward, steps=1, beta=0.1, seed=0,
                   ptx_coef=1.0)
    with pytest.raises(ValueError, match="ptx_coef"):
        grpo_train(model, reference, tokenizer, ITEMS, reward, steps=1, beta=0.1, seed=0,
                   ptx_coef=-1.0, ptx_items=sft_items)


def test_dpo_train_step_equals_the_step_written_out(tokenizer):
    """One DPO step: -log sigmoid(beta * margin of log-ratios) over the drawn pairs, with the
    sequence log-probabilities summed token by token from a float64 log-softmax."""
    model, reference = tiny_gpt(tokenizer), tiny_gpt(tokenizer, seed=1)
    pairs = [("abc", "a", "b"), ("ba", "bb", "a"), ("j", "j", "jjj")]
    rows = [encode_chat(tokenizer, p, c) for p, c, _ in pairs]
    rows += [encode_chat(tokenizer, p, r) for p, _, r in pairs]
    ids, _, mask = pad_right(rows, tokenizer.pad_id)
    run = dpo_train(model, reference, ids, mask, steps=1, beta=0.5, seed=2, batch=2, lr=1e-2)

    def seq_logp(net, row):
        ids_r, keep = rows[row]
        lp = F.log_softmax(net(torch.tensor([ids_r])).logits[0, :-1].double(), -1)
        return sum(lp[pos - 1, ids_r[pos]] for pos in range(1, len(ids_r)) if keep[pos])

    policy = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2, weight_decay=0.0)
    pick = torch.randint(3, (2,), generator=torch.Generator().manual_seed(2))
    losses = []
    with torch.no_grad():
        ref = {r: seq_logp(reference, r) for r in range(6)}
    for i in pick.tolist():
        margin = (seq_logp(policy, i) - ref[i]) - (seq_logp(policy, i + 3) - ref[i + 3])
        losses.append(-F.logsigmoid(0.5 * margin))
    loss = torch.stack(losses).mean()
    loss.backward()
    opt.step()
    assert run.curve[0]["loss"] == pytest.approx(loss.item(), rel=1e-5)
    # Adam's first step moves a weight by about lr = 1e-2 unless its gradient is near 0,
    # where float64 against float32 rounding changes the step: compare at 1e-4
    for a, b in zip(run.policy.parameters(), policy.parameters()):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)
    moved = max((a - b).abs().max().item()
                for a, b in zip(run.policy.parameters(), model.parameters()))
    assert moved > 5e-3  # the step itself is far larger than the tolerance
    with pytest.raises(ValueError, match="2 n, t"):
        dpo_train(model, reference, ids[:5], mask[:5], steps=1, beta=0.5, seed=0)
    with pytest.raises(ValueError, match="beta"):
        dpo_train(model, reference, ids, mask, steps=1, beta=0.0, seed=0)


def test_verifier_pairs_pairs_wrong_samples_with_right_ones_of_their_group(tokenizer):
    model = tiny_gpt(tokenizer)
    items = [Item("abc", "a"), Item("ba", "b"), Item("j", "j")]

    def has_a(texts, batch):  # a reward with ties and mixed groups
        return torch.tensor([float("a" in t) for t in texts])

    got_items, chosen, rejected = verifier_pairs(model, tokenizer, items, has_a, group=4,
                                                 seed=3, batch=12)
    # the same samples by hand, in one batch
    out = generate_answers(model, tokenizer, [it.prompt for it in items for _ in range(4)],
                           do_sample=True, generator=torch.Generator().manual_seed(3))
    expected = []
    for i, item in enumerate(items):
        group = out.texts[4 * i:4 * i + 4]
        right = [t for t in group if "a" in t]
        wrong = [t for t in group if "a" not in t]
        if right:
            expected += [(item, right[k % len(right)], w) for k, w in enumerate(wrong)]
    assert list(zip(got_items, chosen, rejected)) == expected
    assert expected and all("a" in c and "a" not in r for c, r in zip(chosen, rejected))
    chunked = verifier_pairs(model, tokenizer, items, has_a, group=4, seed=3, batch=5)
    assert all("a" in c and "a" not in r for c, r in zip(*chunked[1:]))
    none = verifier_pairs(model, tokenizer, items, lambda t, b: torch.ones(len(t)), 4, 3)
    assert none == ([], [], [])
    with pytest.raises(ValueError, match="items"):
        verifier_pairs(model, tokenizer, [], has_a, 4, 0)


def test_generate_answers_with_a_prefix_continues_the_row(tokenizer):
    """A prefix (a solved example) before the prompt's turn: the answer equals a greedy loop
    over the unpadded concatenation, positions running on from the prefix; no prefix is the
    plain call."""
    model = tiny_gpt(tokenizer)
    prompts = ["abc", "j ?"]
    prefixes = [encode_chat(tokenizer, "ba", "ab")[0], encode_chat(tokenizer, "c", "cc")[0]]
    got = generate_answers(model, tokenizer, prompts, max_new_tokens=5, prefixes=prefixes)
    end = tokenizer.special_tokens["<|end|>"]
    for prompt, before, text in zip(prompts, prefixes, got.texts):
        ids = before + encode_chat(tokenizer, prompt)[0]
        new = []
        for _ in range(5):
            with torch.no_grad():
                nxt = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
            if nxt == end:
                break
            new.append(nxt)
        assert text == tokenizer.decode(new)
    plain = generate_answers(model, tokenizer, prompts, max_new_tokens=5)
    none = generate_answers(model, tokenizer, prompts, max_new_tokens=5, prefixes=None)
    assert plain.texts == none.texts
    with pytest.raises(ValueError, match="prefixes"):
        generate_answers(model, tokenizer, prompts, prefixes=prefixes[:1])
