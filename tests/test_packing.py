"""Packing that keeps examples apart (lecture_pkg.alignment.pack_isolated, GPT's attn_mask):
position ids and loss targets against trl's default packing (pack_dataset "bfd" + its
padding-free collator), the mask against transformers' packed-sequence detection, and the real
test: each example's logits, loss and gradients in a packed row equal those it gets alone."""

from __future__ import annotations

import random

import pytest
import torch

from lecture_pkg.alignment import (
    PackedRows,
    completion_loss,
    encode_chat,
    generate_answers,
    pack,
    pack_isolated,
)
from lecture_pkg.char_tokenizers import CharTokenizer
from lecture_pkg.masks import causal_mask
from lecture_pkg.models.gpt import GPT, GPTConfig

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
trl_data = pytest.importorskip("trl.data_utils")
trl_sft = pytest.importorskip("trl.trainer.sft_trainer")

BLOCK = 32


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return CharTokenizer.from_text("abcdefghij ?:")


def chat_examples(tokenizer: CharTokenizer, n: int, seed: int) -> list[tuple[list[int], list[bool]]]:
    """n chat examples of 7 to 23 tokens (prompt and answer of random letters)."""
    rng = random.Random(seed)
    words = ["".join(rng.choices("abcdefghij", k=rng.randint(1, 8))) for _ in range(2 * n)]
    return [encode_chat(tokenizer, f"{a}?", b) for a, b in zip(words[::2], words[1::2])]


def small_gpt(vocab_size: int, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=vocab_size, n_positions=BLOCK, n_embd=32, n_layer=2, n_head=4,
                       dropout=0.0, embd_dropout=0.0)
    return GPT(config).eval()


def split_examples(ids: list[int], positions: list[int], targets: list[bool],
                   ) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[bool, ...]]]:
    """A packed row cut where the positions restart: (ids, positions, targets) per example."""
    starts = [i for i, p in enumerate(positions) if p == 0] + [len(ids)]
    return [(tuple(ids[a:b]), tuple(positions[a:b]), tuple(targets[a:b]))
            for a, b in zip(starts, starts[1:])]


def test_positions_and_targets_equal_trl_default_packing(tokenizer):
    """trl's bfd packing reorders examples into other rows, so the rows differ; each example's
    position ids and loss targets must be the same in both."""
    examples = chat_examples(tokenizer, 40, seed=0)
    labels = [[i if m else -100 for i, m in zip(ids, mask)] for ids, mask in examples]
    dataset = datasets.Dataset.from_dict({"input_ids": [ids for ids, _ in examples],
                                          "labels": labels})
    packed = trl_data.pack_dataset(dataset, seq_length=BLOCK, strategy="bfd")
    collate = trl_sft.DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_id,
                                                      padding_free=True)
    theirs = []
    for row in packed:  # one packed row per batch: padding-free, like trl's training step
        batch = collate([row])
        ids, positions = batch["input_ids"][0].tolist(), batch["position_ids"][0].tolist()
        theirs += split_examples(ids, positions, (batch["labels"][0] != -100).tolist())
    rows = pack_isolated(examples, BLOCK, tokenizer.pad_id)
    ours = []
    for ids, positions, targets, mask in zip(rows.input_ids.tolist(),
                                             rows.position_ids.tolist(),
                                             rows.completion_mask.tolist(),
                                             rows.attn_mask):
        real = int(mask.any(-1).sum())  # padding attends to nothing
        ours += split_examples(ids[:real], positions[:real], targets[:real])
    assert len(ours) == len(examples) == len(theirs)
    assert sorted(ours) == sorted(theirs)
    assert len(packed) <= rows.input_ids.shape[0]  # best fit decreasing: no more rows


def test_attn_mask_equals_transformers_packed_sequence_mask(tokenizer):
    examples = chat_examples(tokenizer, 12, seed=1)
    rows = pack_isolated(examples, BLOCK, tokenizer.pad_id)
    real = rows.attn_mask.any(-1)  # (rows, t): the tokens of some example
    sequence = transformers.masking_utils.find_packed_sequence_indices(rows.position_ids)
    same = sequence[:, :, None] == sequence[:, None, :]
    expected = same & causal_mask(BLOCK) & real[:, :, None] & real[:, None, :]
    assert torch.equal(rows.attn_mask, expected)
    assert isinstance(rows, PackedRows) and rows.attn_mask.dtype == torch.bool
    plain_ids, plain_mask = pack(examples, BLOCK, tokenizer.pad_id)
    assert torch.equal(rows.input_ids, plain_ids)  # the same rows as pack
    first = rows.position_ids == 0
    assert torch.equal(rows.completion_mask, plain_mask & ~first)


@pytest.mark.parametrize("output_attentions", [False, True])
def test_each_example_in_a_packed_row_gets_its_logits_alone(tokenizer, output_attentions):
    model = small_gpt(tokenizer.vocab_size)
    examples = chat_examples(tokenizer, 12, seed=2)
    rows = pack_isolated(examples, BLOCK, tokenizer.pad_id)
    assert rows.input_ids.shape[0] < len(examples)  # several examples share a row
    with torch.no_grad():
        packed = model(rows.input_ids, position_ids=rows.position_ids, attn_mask=rows.attn_mask,
                       output_attentions=output_attentions).logits
        running_on = model(rows.input_ids).logits  # plain packing: examples see each other
        checked = later = 0
        for r, ids in enumerate(rows.input_ids):
            real = int(rows.attn_mask[r].any(-1).sum())  # padding attends to nothing
            starts = (rows.position_ids[r, :real] == 0).nonzero().flatten().tolist()
            for a, b in zip(starts, [*starts[1:], real]):
                alone = model(ids[None, a:b]).logits[0]
                torch.testing.assert_close(packed[r, a:b], alone, atol=1e-5, rtol=0)
                checked += 1
                if a > 0:
                    later += 1
                    assert (running_on[r, a:b] - alone).abs().max() > 1e-3
    assert checked == len(examples) and later > 0


def test_packed_logits_equal_hf_gpt2_padding_free(tokenizer):
    """HF's GPT-2 given only the restarted position ids (trl's padding-free batch) builds the
    same block-diagonal mask itself."""
    torch.manual_seed(3)
    config = transformers.GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=BLOCK,
                                     n_embd=32, n_layer=2, n_head=4)
    hf = transformers.GPT2LMHeadModel(config).eval()
    ours = GPT.from_hf(hf).eval()
    rows = pack_isolated(chat_examples(tokenizer, 10, seed=3), BLOCK, tokenizer.pad_id)
    with torch.no_grad():
        expected = hf(input_ids=rows.input_ids, position_ids=rows.position_ids,
                      use_cache=False).logits
        got = ours(rows.input_ids, position_ids=rows.position_ids,
                   attn_mask=rows.attn_mask).logits
    real = rows.attn_mask.any(-1)  # HF's padding is its own sequences; ours attends to nothing
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)


def test_training_on_isolated_rows_equals_training_on_examples_alone(tokenizer):
    """The SFT loss on packed rows and its gradients equal those of the examples run one by
    one (every completion token weighs the same), so training on them is training alone."""
    model = small_gpt(tokenizer.vocab_size, seed=4).train()  # dropout 0: deterministic
    examples = chat_examples(tokenizer, 10, seed=4)
    rows = pack_isolated(examples, BLOCK, tokenizer.pad_id)
    logits = model(rows.input_ids, position_ids=rows.position_ids,
                   attn_mask=rows.attn_mask).logits
    packed_loss = completion_loss(logits, rows.input_ids, rows.completion_mask)
    packed_grads = torch.autograd.grad(packed_loss, list(model.parameters()))
    total, count = 0.0, 0
    for ids, mask in examples:
        ids_t, mask_t = torch.tensor([ids]), torch.tensor([mask])
        logp = model(ids_t).logits[0, :-1].log_softmax(-1)
        picked = logp.gather(-1, ids_t[0, 1:, None])[:, 0]
        total = total - picked[mask_t[0, 1:]].sum()
        count += int(mask_t[0, 1:].sum())
    alone_loss = total / count
    alone_grads = torch.autograd.grad(alone_loss, list(model.parameters()))
    torch.testing.assert_close(packed_loss, alone_loss, atol=1e-5, rtol=0)
    for got, expected in zip(packed_grads, alone_grads):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_generate_answers_isolated_prefix_answers_as_alone(tokenizer):
    model = small_gpt(tokenizer.vocab_size, seed=5)
    prompts = ["abc?", "hij?", "a b?", "jjjj?"]
    prefixes = [encode_chat(tokenizer, "ddd?", "ddd")[0], encode_chat(tokenizer, "e?", "e")[0],
                [], encode_chat(tokenizer, "fgh?", "hgf")[0]]
    alone = generate_answers(model, tokenizer, prompts, max_new_tokens=6).texts
    isolated = generate_answers(model, tokenizer, prompts, max_new_tokens=6,
                                prefixes=prefixes, isolated=True)
    assert isolated.texts == alone
    running_on = generate_answers(model, tokenizer, prompts, max_new_tokens=6,
                                  prefixes=prefixes)
    # the prompt's next-token logits: pack_isolated's row = isolated prefix = alone, and a
    # prefix with positions running on changes them
    first = encode_chat(tokenizer, "ddd?", "ddd")
    prompt = encode_chat(tokenizer, prompts[0])
    rows = pack_isolated([first, prompt], BLOCK, tokenizer.pad_id)
    width = len(first[0]) + len(prompt[0])

    def last_logits(rollout) -> torch.Tensor:
        t = rollout.ids.shape[1] - 6
        return model(rollout.ids[:1, :t], rollout.attention_mask[:1, :t]).logits[0, -1]

    with torch.no_grad():
        row = model(rows.input_ids, position_ids=rows.position_ids,
                    attn_mask=rows.attn_mask).logits[0, width - 1]
        alone_logits = model(torch.tensor([prompt[0]])).logits[0, -1]
        torch.testing.assert_close(last_logits(isolated), row, atol=1e-5, rtol=0)
        torch.testing.assert_close(alone_logits, row, atol=1e-5, rtol=0)
        assert (last_logits(running_on) - row).abs().max() > 1e-3


def test_bad_input_names_the_argument(tokenizer):
    examples = chat_examples(tokenizer, 3, seed=6)
    with pytest.raises(ValueError, match="block_size"):
        pack_isolated(examples, 1, tokenizer.pad_id)
    with pytest.raises(ValueError, match=r"examples\[1\] has \d+ tokens.*block_size=8"):
        pack_isolated([([1, 2], [False, True]), (list(range(9)), [True] * 9)], 8, 0)
    with pytest.raises(ValueError, match=r"examples\[0\] has 0 tokens"):
        pack_isolated([([], [])], 8, 0)
    with pytest.raises(ValueError, match=r"examples\[0\] has 2 ids but 1 mask"):
        pack_isolated([([1, 2], [True])], 8, 0)
    with pytest.raises(TypeError, match=r"examples\[0\] must be an \(ids, completion_mask\)"):
        pack_isolated([[1, 2, 3]], 8, 0)
    with pytest.raises(TypeError, match="examples must be a sequence"):
        pack_isolated("abc", 8, 0)
    with pytest.raises(TypeError, match="pad_id"):
        pack_isolated(examples, BLOCK, 0.5)
    model = small_gpt(tokenizer.vocab_size)
    rows = pack_isolated(examples, BLOCK, tokenizer.pad_id)
    with pytest.raises(TypeError, match="attn_mask must be a bool tensor"):
        model(rows.input_ids, attn_mask=rows.attn_mask.float())
    with pytest.raises(ValueError, match=r"attn_mask must have shape \(batch, t, past \+ t\)"):
        model(rows.input_ids, attn_mask=rows.attn_mask[:, :-1])
    with pytest.raises(TypeError, match="isolated must be a bool"):
        generate_answers(model, tokenizer, ["abc?"], isolated="yes")
