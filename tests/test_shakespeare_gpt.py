"""The shipped Shakespeare GPT: its API, its tokenizer, and its held-out loss on a small fixed
slice of the test works equal to the figure recorded when it was exported."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.char_tokenizers import SPECIAL_TOKENS, CharTokenizer
from lecture_pkg.data import shakespeare, shakespeare_works
from lecture_pkg.lm_eval import eval_starts, nats_per_char
from lecture_pkg.models.gpt import GPT
from lecture_pkg.models.llama import Llama
from lecture_pkg.shakespeare_gpt import (
    DEMOS_CHECKPOINT,
    FORMATS_CHECKPOINT,
    load_shakespeare_gpt,
    load_shakespeare_modern,
    shakespeare_gpt_info,
    shakespeare_modern_info,
)
from lecture_pkg.shakespeare_tasks import SPELLINGS, spelling_accuracy, spelling_words


def test_tokenizer_vocabulary_round_trip_and_special_tokens() -> None:
    _, tokenizer = load_shakespeare_gpt()
    chars = sorted(set("".join(shakespeare_works().values())))
    assert tokenizer.itos == chars + list(SPECIAL_TOKENS)
    assert tokenizer.vocab_size == len(chars) + 5
    assert tokenizer.special_tokens == {s: len(chars) + i for i, s in enumerate(SPECIAL_TOKENS)}
    assert (tokenizer.eos_id, tokenizer.pad_id) == (len(chars), len(chars) + 4)
    text = "<|user|>Who's there?<|end|><|assistant|>Nay, answer me.<|end|><|endoftext|>"
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.special_tokens["<|user|>"]
    assert ids[1:4] == [tokenizer.stoi[c] for c in "Who"]
    assert len(ids) == len(text) - sum(text.count(s) * (len(s) - 1) for s in SPECIAL_TOKENS)
    assert tokenizer.decode(ids) == text
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.encode("naïve \u2603")
    with pytest.raises(ValueError, match="ids must be in"):
        tokenizer.decode([tokenizer.vocab_size])
    assert CharTokenizer.from_text("ba").encode("ab<|pad|>") == [0, 1, 6]


@pytest.mark.parametrize("checkpoint", ["shakespeare_gpt", DEMOS_CHECKPOINT, FORMATS_CHECKPOINT])
def test_checkpoint_loads_in_eval_mode_and_reproduces_its_recorded_loss(checkpoint: str) -> None:
    model, tokenizer = load_shakespeare_gpt(checkpoint=checkpoint)
    info = shakespeare_gpt_info(checkpoint)
    assert isinstance(model, GPT) and not model.training
    assert model.config.vocab_size == tokenizer.vocab_size
    assert model.lm_head.weight is model.wte.weight
    check = info["figures"]["check_slice"]
    test = torch.tensor(tokenizer.encode(shakespeare(check["split"])))
    starts = eval_starts(len(test), check["windows"], check["length"])
    loss = nats_per_char(model, test, starts, check["length"])
    assert loss == pytest.approx(check["nats_per_char"], abs=2e-5)
    assert info["figures"]["test_slice"]["length"] <= model.config.n_positions


def test_modern_checkpoint_reproduces_its_recorded_loss_and_shares_the_gpts_vocabulary() -> None:
    """Chapter 7.4's modern decoder: a Llama with its own output layer, trained by the reference
    GPT's recipe (same steps, batch, context and rate); the check slice as recorded."""
    model, tokenizer = load_shakespeare_modern()
    info, gpt_info = shakespeare_modern_info(), shakespeare_gpt_info()
    assert isinstance(model, Llama) and not model.training and info["arch"] == "modern"
    assert model.lm_head.weight is not model.embed_tokens.weight
    assert info["chars"] == gpt_info["chars"]
    assert tokenizer.vocab_size == model.config.vocab_size
    assert model.context_length == gpt_info["config"]["n_positions"]
    check = info["figures"]["check_slice"]
    assert check == {**gpt_info["figures"]["check_slice"], "nats_per_char": check["nats_per_char"]}
    test = torch.tensor(tokenizer.encode(shakespeare(check["split"])))
    starts = eval_starts(len(test), check["windows"], check["length"])
    loss = nats_per_char(model, test, starts, check["length"])
    assert loss == pytest.approx(check["nats_per_char"], abs=2e-5)


@pytest.mark.parametrize("checkpoint", [DEMOS_CHECKPOINT, FORMATS_CHECKPOINT])
def test_demos_checkpoint_reproduces_its_recorded_few_shot_accuracy(checkpoint: str) -> None:
    """A continuation's recorded held-out accuracy at one shot, for every spelling, and the
    claim the book builds on: one demonstration lifts it far above the zero-shot figure."""
    model, tokenizer = load_shakespeare_gpt(checkpoint=checkpoint)
    recorded = shakespeare_gpt_info(checkpoint)["figures"]["spelling_accuracy"]
    words = spelling_words(recorded["words"])
    for spelling in SPELLINGS:
        got = spelling_accuracy(model, tokenizer, words, spelling, 1, recorded["seed"],
                                recorded["queries"])
        assert got == pytest.approx(recorded["shots"]["1"][spelling], abs=1e-6)
    mean = {k: sum(v.values()) / len(v) for k, v in recorded["shots"].items()}
    assert mean["1"] > mean["0"] + 0.3 and mean["4"] > 0.8


def test_unknown_gpt_checkpoint_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="checkpoint must be"):
        load_shakespeare_gpt(checkpoint="shakespeare_bert")
