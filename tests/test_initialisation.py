"""Initialisation statistics: each model starts from the distribution its paper (or Hugging
Face's port) prescribes. Outputs equal to HF after loading HF's weights cannot see this, since
loading overwrites the initial values; so the statistics are checked directly, on tensors large
enough that a sample std is within a few percent of the true one.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lecture_pkg.layers import EncoderLayer, deepnet_init_


def assert_std(tensor: torch.Tensor, expected: float, rel: float = 0.05, name: str = "") -> None:
    std = tensor.detach().double().std().item()
    assert std == pytest.approx(expected, rel=rel), f"{name}: std {std:.5g}, expected {expected:.5g}"


def xavier_std(linear: nn.Linear, gain: float = 1.0) -> float:
    fan_out, fan_in = linear.weight.shape
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


@pytest.mark.parametrize("beta", [0.3, 1.7])
def test_deepnet_init_gains(beta: float) -> None:
    """Xavier-normal with gain beta for v, out and the FFN; gain 1 for q and k."""
    torch.manual_seed(0)
    layer = EncoderLayer(128, 4, 256)
    deepnet_init_(layer, beta)
    attn, ffn = layer.self_attn, layer.ffn
    for name in ("q_proj", "k_proj"):
        assert_std(getattr(attn, name).weight, xavier_std(getattr(attn, name)), name=name)
    for name in ("v_proj", "out_proj"):
        assert_std(getattr(attn, name).weight, xavier_std(getattr(attn, name), beta), name=name)
    for name in ("linear1", "linear2"):
        assert_std(getattr(ffn, name).weight, xavier_std(getattr(ffn, name), beta), name=name)


def test_transformer_embeddings_and_matrices() -> None:
    """Embeddings N(0, 1/d_model) (so sqrt(d_model) E has unit variance, like the sinusoids),
    Xavier-uniform matrices in every layer."""
    from lecture_pkg.transformer import Transformer

    torch.manual_seed(0)
    d = 64
    model = Transformer(2000, 1500, d_model=d, num_heads=4, num_encoder_layers=1,
                        num_decoder_layers=1, d_ff=128, share_embeddings=False, tie_output=False)
    for name in ("src_embed", "tgt_embed"):
        assert_std(getattr(model, name).weight, d**-0.5, name=name)
    assert_std(model.output.weight, d**-0.5, name="output")
    assert_std(model.src_embed.weight * math.sqrt(d), 1.0, name="scaled embedding")
    for layer in (model.encoder_layers[0].self_attn.v_proj, model.decoder_layers[0].ffn.linear1,
                  model.decoder_layers[0].cross_attn.out_proj):
        assert_std(layer.weight, xavier_std(layer), name=str(layer))


def test_gpt_residual_projections_scaled_by_depth() -> None:
    from lecture_pkg.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    n_layer = 6
    model = GPT(GPTConfig(vocab_size=1000, n_positions=64, n_embd=128, n_layer=n_layer,
                          n_head=4))
    residual = 0.02 / math.sqrt(2 * n_layer)
    for block in model.blocks:
        assert_std(block.self_attn.out_proj.weight, residual, rel=0.08, name="out_proj")
        assert_std(block.ffn.linear2.weight, residual, rel=0.08, name="linear2")
        assert_std(block.self_attn.q_proj.weight, 0.02, rel=0.08, name="q_proj")
        assert_std(block.ffn.linear1.weight, 0.02, rel=0.08, name="linear1")
        assert block.ffn.linear1.bias.abs().max() == 0
    assert_std(model.wte.weight, 0.02, name="wte")
    assert_std(model.wpe.weight, 0.02, name="wpe")


def test_vit_positions_and_cls_token_are_truncated_normal() -> None:
    from lecture_pkg.models.vit import ViT, ViTConfig

    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=64, patch_size=4, hidden_size=64, num_layers=1,
                          num_heads=2, intermediate_size=64))
    assert_std(model.position, 0.02, name="position")  # (1, 257, 64)
    assert model.position.abs().max() <= 2.0  # torch's trunc_normal_ cuts at +-2
    assert model.cls_token.abs().max() > 0
    assert_std(model.patch_embed.proj.weight, 0.02, name="patch projection")
    assert model.layers[0].attn_block.norm.weight.eq(1).all()


def test_bert_and_t5_statistics() -> None:
    from lecture_pkg.models.bert import BertConfig, BertModel
    from lecture_pkg.models.t5 import T5, T5Config

    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=3000, hidden_size=64, num_layers=1, num_heads=2,
                                intermediate_size=128))
    for name in ("token", "position", "segment"):
        weight = getattr(bert, name).weight
        assert_std(weight, 0.02, rel=0.3 if weight.numel() < 1000 else 0.05, name=name)
    t5 = T5(T5Config(vocab_size=2000, d_model=64, d_ff=128, num_layers=1, num_decoder_layers=1,
                     num_heads=4))
    d_kv = 16
    assert_std(t5.shared.weight, 1.0, name="shared")
    attn = t5.encoder.layers[0].self_attn
    assert_std(attn.q_proj.weight, (64 * d_kv) ** -0.5, name="q")
    assert_std(attn.k_proj.weight, 64**-0.5, name="k")
    assert_std(t5.encoder.layers[0].ffn.linear2.weight, 128**-0.5, name="wo")
