"""Attention rollout and the hand-built spotlight ViT: cases whose answer is known exactly."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.attention_maps import attention_rollout, spotlight_vit
from lecture_pkg.models.vit import ViT, ViTConfig


def images(*size: int, seed: int = 1) -> torch.Tensor:
    return torch.rand(*size, generator=torch.Generator().manual_seed(seed))


def one_hot_attention(t: int, target: int, heads: int = 2) -> torch.Tensor:
    # every token attends only to `target`: (1, heads, t, t)
    weights = torch.zeros(1, heads, t, t)
    weights[..., target] = 1.0
    return weights


def test_rollout_identity_and_one_hot_layers() -> None:
    t = 5
    eye = torch.eye(t).expand(1, 3, t, t)
    for residual in (0.0, 0.5, 1.0):
        assert torch.equal(attention_rollout([eye, eye, eye], residual), torch.eye(t)[None])
    # residual 0: a layer that gathers token 0 sends every token's rollout to token 0
    gather0 = one_hot_attention(t, 0)
    assert torch.equal(attention_rollout([gather0], 0.0)[0], torch.zeros(t, t).index_fill(
        1, torch.tensor([0]), 1.0))
    # order: layer 1 gathers token 0 into every token, layer 2 reads token 1, which by then
    # holds token 0: everything comes from token 0 (the reverse order would say token 1)
    gather1 = one_hot_attention(t, 1)
    assert torch.equal(attention_rollout([gather0, gather1], 0.0), attention_rollout([gather0], 0.0))
    assert torch.equal(attention_rollout([gather1, gather0], 0.0), attention_rollout([gather1], 0.0))
    # residual 1/2 over L such layers: (J/2 + I/2)^L = I / 2^L + (1 - 1 / 2^L) J, J idempotent
    for layers in (1, 2, 4):
        expected = torch.eye(t) / 2**layers
        expected[:, 0] += 1 - 1 / 2**layers
        torch.testing.assert_close(attention_rollout([gather0] * layers)[0], expected)


def test_rollout_equals_a_float64_product() -> None:
    gen = torch.Generator().manual_seed(0)
    layers = [torch.randn(2, 3, 6, 6, generator=gen).softmax(-1) for _ in range(3)]
    got = attention_rollout(layers, residual=0.3)
    for b in range(2):
        expected = torch.eye(6, dtype=torch.float64)
        for weights in layers:
            mixed = 0.7 * weights[b].double().mean(0) + 0.3 * torch.eye(6, dtype=torch.float64)
            expected = mixed @ expected
        torch.testing.assert_close(got[b].double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.sum(-1), torch.ones(2, 6))


@pytest.mark.parametrize(("token", "hidden", "heads"),
                         [(0, 8, 2), (6, 8, 2), (7, 32, 4), (3, 9, 3), (5, 8, 8)])
def test_rollout_of_a_hand_built_model(token: int, hidden: int, heads: int) -> None:
    config = ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=hidden,
                       num_layers=3, num_heads=heads, intermediate_size=16)
    model = spotlight_vit(config, token).eval()
    with torch.no_grad():
        out = model(images(2, 1, 8, 8), output_attentions=True)
    t = 17  # [CLS] and 16 patches
    for weights in out.attentions:  # the model does what it was built to do
        torch.testing.assert_close(weights[..., token], torch.ones(2, heads, t))
    gather = torch.zeros(t, t)
    gather[:, token] = 1.0
    torch.testing.assert_close(attention_rollout(out.attentions, 0.0), gather.expand(2, t, t))
    expected = torch.eye(t) / 8 + (1 - 1 / 8) * gather  # three layers, residual 1/2
    expected[token, token] = 1.0
    torch.testing.assert_close(attention_rollout(out.attentions), expected.expand(2, t, t))


def test_rollout_of_uniform_attention() -> None:
    # queries and keys zeroed: every head attends uniformly, whatever the other weights;
    # (U/2 + I/2)^L = I / 2^L + (1 - 1 / 2^L) U with U the uniform matrix (idempotent)
    model = ViT(ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=8,
                          num_layers=2, num_heads=2, intermediate_size=16)).eval()
    with torch.no_grad():
        for layer in model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                proj.weight.zero_()
                proj.bias.zero_()
        out = model(images(1, 1, 8, 8), output_attentions=True)
    uniform = torch.full((17, 17), 1 / 17)
    torch.testing.assert_close(attention_rollout(out.attentions)[0],
                               torch.eye(17) / 4 + 3 / 4 * uniform)


def test_rollout_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        attention_rollout([])
    with pytest.raises(ValueError, match="residual"):
        attention_rollout([torch.eye(3).expand(1, 1, 3, 3)], residual=1.5)
    with pytest.raises(ValueError, match="batch, heads, t, t"):
        attention_rollout([torch.eye(3)])
    config = ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=8,
                       num_layers=1, num_heads=2, intermediate_size=16)
    with pytest.raises(ValueError, match="token"):
        spotlight_vit(config, 17)
    with pytest.raises(ValueError, match=r"attentions\[1\]"):
        attention_rollout([torch.eye(3).expand(1, 1, 3, 3), torch.eye(4).expand(1, 1, 4, 4)])
