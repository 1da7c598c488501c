"""lecture_pkg.rlhf.preference_set, the chapter's one preference data set (10.1's reward model
and 10.2's DPO train on it), and reward_model_train: the pairs are the model's own samples,
re-drawn here by hand from the same generator; the chosen answer always has the higher gold
reward; the split is disjoint and refused when it is not; the same seed gives the same set;
and one reward-model step equals the Bradley-Terry step written out from torch."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from _rlhf_reference import Item, tiny_gpt, tiny_tokenizer

from lecture_pkg.alignment import generate_answers
from lecture_pkg.char_tokenizers import CharTokenizer
from lecture_pkg.models.gpt import GPTForSequenceClassification
from lecture_pkg.rlhf import (
    PreferencePairs,
    exact_reward,
    preference_set,
    reward_model_train,
    verifier_pairs,
)


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return tiny_tokenizer()


TRAIN = [Item("abc", "a"), Item("ba", "b"), Item("cab ?", "c"), Item("j", "j")]
VALIDATION = [Item("dab", "d"), Item("gha", "g"), Item("ee", "e")]


def has_a(texts, batch):  # a gold rule with ties and mixed groups on a random model
    return torch.tensor([float("a" in t) for t in texts])


def expected_pairs(items, texts, group):
    pairs = []
    for i, item in enumerate(items):
        answers = texts[group * i:group * (i + 1)]
        right = [t for t in answers if "a" in t]
        wrong = [t for t in answers if "a" not in t]
        if right:
            pairs += [(item, right[k % len(right)], w) for k, w in enumerate(wrong)]
    return pairs


def test_preference_set_is_the_models_own_samples_ranked_by_the_rule(tokenizer):
    model = tiny_gpt(tokenizer)
    got = preference_set(model, tokenizer, TRAIN, VALIDATION, has_a, group=6, seed=4)
    # the same samples by hand: train then validation, from one generator seeded with 4
    sampler = torch.Generator().manual_seed(4)
    texts = {}
    for name, items in (("train", TRAIN), ("validation", VALIDATION)):
        texts[name] = generate_answers(model, tokenizer,
                                       [it.prompt for it in items for _ in range(6)],
                                       do_sample=True, generator=sampler).texts
    for name, items in (("train", TRAIN), ("validation", VALIDATION)):
        pairs = getattr(got, name)
        assert list(zip(*pairs)) == expected_pairs(items, texts[name], 6)
        assert pairs.items, f"no {name} pairs: the check would be empty"
        for item, chosen, rejected in zip(*pairs):
            own = texts[name][6 * items.index(item):6 * items.index(item) + 6]
            assert chosen in own and rejected in own  # both answers the model's own
        gold_c = has_a(pairs.chosen, pairs.items)
        gold_r = has_a(pairs.rejected, pairs.items)
        assert bool((gold_c > gold_r).all())
    # the split: disjoint prompts on the two sides
    assert not {it.prompt for it in got.train.items} & {it.prompt for it in got.validation.items}
    # the validation pairs are not those verifier_pairs gives the validation items alone
    # with the same seed: the generator has moved on through the training samples
    assert verifier_pairs(model, tokenizer, TRAIN, has_a, 6, 4) == got.train


def test_preference_set_is_seeded_and_refuses_a_shared_prompt(tokenizer):
    model = tiny_gpt(tokenizer)
    one = preference_set(model, tokenizer, TRAIN, VALIDATION, has_a, group=6, seed=4)
    again = preference_set(model, tokenizer, TRAIN, VALIDATION, has_a, group=6, seed=4)
    other = preference_set(model, tokenizer, TRAIN, VALIDATION, has_a, group=6, seed=5)
    assert one == again
    assert one != other
    chunked = preference_set(model, tokenizer, TRAIN, VALIDATION, has_a, group=6, seed=4,
                             batch=5)
    assert all(bool((has_a(p.chosen, p.items) > has_a(p.rejected, p.items)).all())
               for p in chunked)
    with pytest.raises(ValueError, match="validation_items shares 1 prompts"):
        preference_set(model, tokenizer, TRAIN, [Item("ba", "b"), *VALIDATION], has_a, 6, 4)
    with pytest.raises(ValueError, match="validation_items must be a non-empty"):
        preference_set(model, tokenizer, TRAIN, [], has_a, 6, 4)
    with pytest.raises(ValueError, match="group"):
        preference_set(model, tokenizer, TRAIN, VALIDATION, has_a, 1, 4)
    with pytest.raises(ValueError, match="reward_fn must return"):
        preference_set(model, tokenizer, TRAIN, VALIDATION, lambda t, b: torch.ones(2), 6, 4)


def test_rows_put_chosen_first_in_the_chat_template(tokenizer):
    pairs = PreferencePairs([TRAIN[0], TRAIN[1]], ["a", "bb"], ["c", "b"])
    ids, keep, mask = pairs.rows(tokenizer)
    assert ids.shape[0] == 4 and keep.shape == mask.shape == ids.shape
    answers = [tokenizer.decode([i for i, m in zip(row, row_mask) if m])
               for row, row_mask in zip(ids.tolist(), mask.tolist())]
    assert answers == ["a<|end|>", "bb<|end|>", "c<|end|>", "b<|end|>"]
    prompts = [tokenizer.decode([i for i, k, m in zip(r, kr, mr) if k and not m])
               for r, kr, mr in zip(ids.tolist(), keep.tolist(), mask.tolist())]
    assert prompts[0] == prompts[2] and "abc" in prompts[0] and "ba" in prompts[1]
    with pytest.raises(ValueError, match="empty"):
        PreferencePairs([], [], []).rows(tokenizer)


def test_preference_set_on_the_sft_model_prefers_the_correct_answer():
    """On the chapter's SFT model and instructions, with the exact rule: every chosen answer
    is the correct one, every rejected answer a wrong one the model sampled."""
    from lecture_pkg.shakespeare_gpt import load_shakespeare_sft
    from lecture_pkg.shakespeare_tasks import shakespeare_instructions

    sft, tokenizer = load_shakespeare_sft(device="cpu")
    train = shakespeare_instructions("train", 30, seed=0)
    validation = shakespeare_instructions("test", 30, seed=1)
    got = preference_set(sft, tokenizer, train, validation, exact_reward, group=4, seed=10)
    for pairs in got:
        assert pairs.items
        assert all(c == it.answer != r for it, c, r in zip(*pairs))


def test_chapter_preference_set_is_preference_set_with_the_pages_arguments(monkeypatch):
    """10.2, 10.3 and 10.4 share one set: chapter_preference_set equals preference_set called
    with the arguments its docstring names (30 held-out prompts here instead of 600, to keep
    the test short), and it follows LECTURE_SEED_OFFSET through seeds()."""
    from lecture_pkg import rlhf, seeds
    from lecture_pkg.shakespeare_gpt import load_shakespeare_sft
    from lecture_pkg.shakespeare_tasks import shakespeare_instructions

    sft, tokenizer = load_shakespeare_sft(device="cpu")
    monkeypatch.setattr(rlhf, "CHAPTER_VALIDATION_PROMPTS", 30)
    got = rlhf.chapter_preference_set(sft, tokenizer, 20)
    want = preference_set(sft, tokenizer, shakespeare_instructions("train", 20, seed=0),
                          shakespeare_instructions("test", 30, seed=1), exact_reward, group=4,
                          seed=seeds(1, start=10)[0])
    assert got == want
    monkeypatch.setenv("LECTURE_SEED_OFFSET", "1000")
    assert rlhf.chapter_preference_set(sft, tokenizer, 20) != got
    with pytest.raises(ValueError, match="prompts"):
        rlhf.chapter_preference_set(sft, tokenizer, 0)


def test_reward_model_train_step_equals_the_step_written_out(tokenizer):
    """One step: -log sigmoid(r_chosen - r_rejected) on the drawn pairs, the reward the head
    on each row's last real token, the head initialised under the seed."""
    model = tiny_gpt(tokenizer)
    pairs = PreferencePairs(TRAIN[:3], ["a", "bb", "jjj"], ["b", "a", "j"])
    ids, keep, _ = pairs.rows(tokenizer)
    got = reward_model_train(model, ids, keep, steps=1, seed=3, batch=2, lr=1e-2)
    torch.manual_seed(3)
    hand = GPTForSequenceClassification(copy.deepcopy(model), num_labels=1).train()
    start = copy.deepcopy(hand)
    opt = torch.optim.AdamW(hand.parameters(), lr=1e-2, weight_decay=0.0)
    pick = torch.randint(3, (2,), generator=torch.Generator().manual_seed(3))
    losses = []
    for i in pick.tolist():
        def reward(row):
            real = int(keep[row].sum())  # right padding: the last real token
            hidden, _ = hand.gpt.features(ids[row:row + 1, :real])
            return hand.score(hidden[0, -1])[0]
        losses.append(-F.logsigmoid(reward(i) - reward(i + 3)))
    torch.stack(losses).mean().backward()
    opt.step()
    # Adam's first step moves a weight by about lr = 1e-2 in its gradient's sign; where the
    # gradient is near 0 (exactly 0 in one order of summation, 1e-10 in the other) the sign
    # is rounding: compare the weights whose hand-made step is a real one
    real_steps = 0
    for a, b, before in zip(got.parameters(), hand.parameters(), start.parameters()):
        stepped = (b - before).abs() > 5e-3
        torch.testing.assert_close(a[stepped], b[stepped], atol=1e-4, rtol=1e-5)
        real_steps += int(stepped.sum())
    assert real_steps > 0.5 * sum(p.numel() for p in hand.parameters())
    moved = max((a - b).abs().max().item()
                for a, b in zip(got.parameters(), start.parameters()))
    assert moved > 5e-3 and not got.training
    with pytest.raises(ValueError, match="2 n, t"):
        reward_model_train(model, ids[:3], keep[:3], steps=1, seed=0)
