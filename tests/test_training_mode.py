"""Dropout placement in training mode: where each dropout sits, checked with dropout rates that
make the answer exact (p = 1 drops a whole branch; a hook sees what a dropout receives).

Evaluation-mode comparisons with Hugging Face cannot see any of this: every dropout is then the
identity, wherever it is placed.
"""

from __future__ import annotations

import pytest
import torch
from test_wiring import distinct_norms  # every norm its own gain and bias
from torch import Tensor, nn

from lecture_pkg.layers import EncoderLayer, Residual
from lecture_pkg.lora import LoRALinear
from lecture_pkg.models.swin import drop_path


def randn(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --------------------------------------------------------------------------------------------
# Residual wiring: dropout on the sub-layer's output, never on the residual path
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wiring", ["post", "pre", "sandwich"])
def test_dropout_of_one_removes_the_branch_and_keeps_the_residual(wiring: str) -> None:
    block = Residual(8, wiring, dropout=1.0, dtype=torch.float64).train()
    distinct_norms(block)
    x = randn(2, 5, 8)
    out = block(x, lambda h: 3.0 * h + 1.0)
    expected = block.norm(x) if wiring == "post" else x
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    block.eval()  # and the branch is back at evaluation
    assert not torch.allclose(block(x, lambda h: 3.0 * h + 1.0), expected)


@pytest.mark.parametrize("wiring", ["post", "pre"])
def test_encoder_layer_with_dropout_one_passes_the_residual_stream(wiring: str) -> None:
    layer = EncoderLayer(8, 2, 16, dropout=0.5, wiring=wiring, dtype=torch.float64).train()
    layer.attn_block.dropout = nn.Dropout(1.0)  # the residual dropouts only (attention's own
    layer.ffn_block.dropout = nn.Dropout(1.0)   # dropout must stay below 1)
    distinct_norms(layer)
    x = randn(2, 5, 8)
    out, _ = layer(x)
    expected = x if wiring == "pre" else layer.ffn_block.norm(layer.attn_block.norm(x))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_dropout_sees_the_branch_output_not_the_sum() -> None:
    """A hook on the residual's dropout: in pre-LN it receives F(Norm(x)), nothing with x added."""
    block = Residual(8, "pre", dropout=0.5, dtype=torch.float64).train()
    distinct_norms(block)
    seen: list[Tensor] = []
    block.dropout.register_forward_hook(lambda _m, inp, _out: seen.append(inp[0]))
    x = randn(2, 5, 8)
    block(x, lambda h: 2.0 * h)
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], 2.0 * block.norm(x), rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------------
# LoRA: dropout on the adapter's input only
# --------------------------------------------------------------------------------------------

def test_lora_dropout_acts_on_the_update_path_only() -> None:
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(6, 5), r=2, alpha=4, dropout=0.5).train()
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(3, 6)
    layer.dropout = nn.Dropout(1.0)  # drop every input of the update: only W x + b is left
    torch.testing.assert_close(layer(x), layer.base(x), rtol=0, atol=0)
    layer.dropout = nn.Identity()    # keep everything: the full update
    expected = layer.base(x) + layer.scaling * x @ layer.lora_A.T @ layer.lora_B.T
    torch.testing.assert_close(layer(x), expected)
    assert not torch.allclose(layer(x), layer.base(x))


def test_lora_dropout_is_inactive_at_evaluation() -> None:
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(6, 5), r=2, alpha=4, dropout=0.9).eval()
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(3, 6)
    expected = layer.base(x) + layer.scaling * x @ layer.lora_A.T @ layer.lora_B.T
    torch.testing.assert_close(layer(x), expected)


# --------------------------------------------------------------------------------------------
# Stochastic depth: whole samples dropped, the kept ones rescaled by 1 / (1 - p)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.25, 0.5])
def test_drop_path_drops_whole_samples_and_rescales_the_rest(p: float) -> None:
    torch.manual_seed(0)
    x = torch.rand(4000, 3, 2, dtype=torch.float64) + 1.0
    out = drop_path(x, p, training=True)
    dropped = (out == 0).flatten(1).all(dim=1)
    kept = ~dropped
    assert ((out != 0).flatten(1).all(dim=1) | dropped).all()  # all or nothing per sample
    torch.testing.assert_close(out[kept], x[kept] / (1 - p), rtol=0, atol=1e-12)
    assert abs(dropped.double().mean().item() - p) < 0.03
    assert abs(out.mean().item() / x.mean().item() - 1) < 0.05  # unbiased in expectation
    assert torch.equal(drop_path(x, p, training=False), x)


# --------------------------------------------------------------------------------------------
# Embedding dropout: on the sum (and norm) of the embeddings, in every model
# --------------------------------------------------------------------------------------------

def _record(module: nn.Module) -> list[Tensor]:
    seen: list[Tensor] = []
    module.register_forward_hook(lambda _m, inp, _out: seen.append(inp[0].detach().clone()))
    return seen


def test_t5_drops_out_its_embeddings_and_final_states() -> None:
    """HF's T5Stack: dropout(embeddings) before the first layer, dropout after the final norm."""
    from lecture_pkg.models.t5 import T5, T5Config

    torch.manual_seed(0)
    model = T5(T5Config(vocab_size=50, d_model=16, d_ff=32, num_layers=2, num_decoder_layers=2,
                        num_heads=2, dropout=0.1)).train()
    ids = torch.randint(0, 50, (2, 7))
    dec = torch.randint(0, 50, (2, 5))
    enc_seen, dec_seen = _record(model.encoder.dropout), _record(model.decoder.dropout)
    final = _record(model.encoder.final_norm)
    model(ids, dec)
    assert len(enc_seen) == len(dec_seen) == 2
    torch.testing.assert_close(enc_seen[0], model.shared(ids), rtol=0, atol=0)
    torch.testing.assert_close(dec_seen[0], model.shared(dec), rtol=0, atol=0)
    torch.testing.assert_close(enc_seen[1], model.encoder.final_norm(final[0]), rtol=0, atol=0)


def test_embedding_dropout_of_one_zeroes_the_embedded_input() -> None:
    """p = 1 on the embedding dropout: whatever was summed before it (tokens, positions,
    segments) must be gone, so every model's embedding output is exactly zero."""
    from lecture_pkg.models.bert import BertConfig, BertModel
    from lecture_pkg.models.gpt import GPT, GPTConfig
    from lecture_pkg.models.vit import ViT, ViTConfig
    from lecture_pkg.transformer import Transformer

    torch.manual_seed(0)
    ids = torch.randint(1, 30, (2, 6))
    transformer = Transformer(30, 30, d_model=8, num_heads=2, num_encoder_layers=1,
                              num_decoder_layers=1, d_ff=16).train()
    transformer.dropout = nn.Dropout(1.0)
    assert transformer.embed_source(ids).abs().max() == 0
    assert transformer.embed_target(ids, start=3).abs().max() == 0

    bert = BertModel(BertConfig(vocab_size=30, hidden_size=8, num_layers=1, num_heads=2,
                                intermediate_size=16, max_positions=8)).train()
    bert.dropout = nn.Dropout(1.0)
    with torch.no_grad():  # a norm bias that is not 0, so dropout before the norm would show
        bert.embed_norm.bias.fill_(1.0)
    assert bert.embed(ids).abs().max() == 0

    vit = ViT(ViTConfig(image_size=8, patch_size=4, hidden_size=8, num_layers=1, num_heads=2,
                        intermediate_size=16)).train()
    vit.drop = nn.Dropout(1.0)
    assert vit.embed(torch.randn(2, 3, 8, 8)).abs().max() == 0

    gpt = GPT(GPTConfig(vocab_size=30, n_positions=8, n_embd=8, n_layer=1, n_head=2)).train()
    seen = _record(gpt.drop)
    gpt(ids)
    positions = torch.arange(6)
    torch.testing.assert_close(seen[0], gpt.wte(ids) + gpt.wpe(positions), rtol=0, atol=0)
