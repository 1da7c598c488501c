"""Loading Hugging Face weights is strict: a missing weight or one the architecture does not
have is an error, never a silently skipped or randomly initialised tensor."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

transformers = pytest.importorskip("transformers")


def tiny_models() -> dict[str, Callable[[], tuple[torch.nn.Module, type]]]:
    from lecture_pkg.models.bert import (
        BertForPreTraining,
        BertForQuestionAnswering,
        BertForTokenClassification,
        BertModel,
    )
    from lecture_pkg.models.gpt import GPT
    from lecture_pkg.models.swin import Swin
    from lecture_pkg.models.t5 import T5
    from lecture_pkg.models.vit import ViT

    bert = {"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 16}
    return {
        "bert": lambda: (transformers.BertModel(transformers.BertConfig(**bert)), BertModel),
        "bert-pretraining": lambda: (
            transformers.BertForPreTraining(transformers.BertConfig(**bert)), BertForPreTraining),
        "bert-qa": lambda: (transformers.BertForQuestionAnswering(transformers.BertConfig(**bert)),
                            BertForQuestionAnswering),
        "bert-tagging": lambda: (
            transformers.BertForTokenClassification(transformers.BertConfig(**bert)),
            BertForTokenClassification),
        "gpt2": lambda: (transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2)), GPT),
        "t5": lambda: (transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=40, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2)), T5),
        "vit": lambda: (transformers.ViTModel(transformers.ViTConfig(
            image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=32)), ViT),
        "swin": lambda: (transformers.SwinModel(transformers.SwinConfig(
            image_size=16, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[2, 2],
            window_size=2)), Swin),
    }


MODELS = ["bert", "bert-pretraining", "bert-qa", "bert-tagging", "gpt2", "t5", "vit", "swin"]


def ours_and_state(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    hf, cls = tiny_models()[name]()
    return cls.from_hf(hf), dict(hf.state_dict())


def weight_names(state: dict[str, torch.Tensor]) -> list[str]:
    """Names of real weights: not HF's position-id or causal-mask buffers, nor the copies HF
    keeps of a tied matrix (lm_head, embed_tokens, the MLM decoder)."""
    buffers = ("position_ids", "token_type_ids", "attn.bias", "masked_bias",
               "relative_position_index")
    copies = ("lm_head.weight", "embed_tokens.weight", "cls.predictions.decoder.weight",
              "cls.predictions.decoder.bias")
    return [k for k in state if not k.endswith(buffers + copies)]


@pytest.mark.parametrize("name", MODELS)
def test_a_missing_weight_is_an_error(name: str) -> None:
    ours, state = ours_and_state(name)
    names = weight_names(state)
    for missing in (names[0], names[len(names) // 2], names[-1]):
        partial = {k: v for k, v in state.items() if k != missing}
        with pytest.raises((KeyError, RuntimeError, ValueError)):
            ours.load_hf_state_dict(partial)


@pytest.mark.parametrize("name", MODELS)
def test_an_unknown_weight_is_an_error(name: str) -> None:
    ours, state = ours_and_state(name)
    ours.load_hf_state_dict(state)  # the full state loads
    extra = {**state, "encoder.layer.99.extra.weight": torch.zeros(3)}
    with pytest.raises((KeyError, RuntimeError, ValueError), match="99"):
        ours.load_hf_state_dict(extra)


def test_gpt_from_a_deeper_checkpoint_is_an_error() -> None:
    """A 3-layer checkpoint into a 2-layer model: the third layer has nowhere to go."""
    from lecture_pkg.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=40, n_positions=16, n_embd=16, n_layer=3, n_head=2))
    small = GPT(GPTConfig(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2))
    with pytest.raises(ValueError, match=r"transformer\.h\.2\."):
        small.load_hf_state_dict(hf.state_dict())


@pytest.mark.parametrize("name", ["bert", "bert-qa", "bert-tagging", "t5"])
def test_loaded_weights_are_the_checkpoint_s(name: str) -> None:
    """Every one of our tensors comes from the checkpoint: exporting gives it back unchanged."""
    ours, state = ours_and_state(name)
    exported = ours.hf_state_dict()
    for key in weight_names(state):
        assert torch.equal(exported[key], state[key]), key
