"""Residual wiring with asymmetric weights: every norm gets a gain and bias of its own, so that
swapping two norms (sandwich's input and output norm, a layer's first and second block) changes
the output. With the default (1, 0) norms such swaps cancel out and no test can see them.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from lecture_pkg.layers import EncoderLayer, Residual, make_norm


def randn(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def distinct_norms(module: nn.Module, seed: int = 7) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.5 * torch.randn(m.bias.shape, generator=g))
            elif hasattr(m, "weight") and type(m).__name__ == "RMSNorm":
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=g))


def sublayer(h: Tensor) -> Tensor:
    """A non-linear, non-symmetric branch: any swap of the order of operations shows."""
    return torch.tanh(1.3 * h + 0.2) * h.roll(1, dims=-1)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_wirings_with_distinct_norm_weights(norm: str) -> None:
    x = randn(2, 5, 8) * 3 + 1
    for wiring in ("post", "pre", "sandwich"):
        block = Residual(8, wiring, norm=norm, dtype=torch.float64)
        distinct_norms(block)
        n_in, n_out = block.norm, block.out_norm
        expected = {"post": lambda: n_in(x + sublayer(x)),
                    "pre": lambda: x + sublayer(n_in(x)),
                    "sandwich": lambda: x + n_out(sublayer(n_in(x)))}[wiring]()
        torch.testing.assert_close(block(x, sublayer), expected, rtol=0, atol=1e-12)
    sandwich = Residual(8, "sandwich", norm=norm, dtype=torch.float64)
    distinct_norms(sandwich)
    swapped = x + sandwich.norm(sublayer(sandwich.out_norm(x)))
    assert not torch.allclose(sandwich(x, sublayer), swapped)  # the test can tell them apart


def test_sandwich_norms_are_two_modules() -> None:
    block = Residual(8, "sandwich")
    assert block.out_norm is not None and block.out_norm is not block.norm
    assert block.norm.weight.data_ptr() != block.out_norm.weight.data_ptr()
    assert isinstance(make_norm("rms", 8), nn.Module)


@pytest.mark.parametrize("wiring", ["post", "pre", "sandwich"])
def test_encoder_layer_uses_each_block_norm_in_its_place(wiring: str) -> None:
    """Attention block first, FFN block second, each with its own norm(s)."""
    torch.manual_seed(0)
    layer = EncoderLayer(8, 2, 16, dropout=0.0, wiring=wiring, dtype=torch.float64).eval()
    distinct_norms(layer)
    x = randn(2, 5, 8)

    def attention(h: Tensor) -> Tensor:
        return layer.self_attn(h, h, h)[0]

    expected = layer.ffn_block(layer.attn_block(x, attention), layer.ffn)
    torch.testing.assert_close(layer(x)[0], expected, rtol=0, atol=1e-12)
    if wiring == "pre":  # written out: the two blocks' norms are not interchangeable
        h = x + attention(layer.attn_block.norm(x))
        torch.testing.assert_close(layer(x)[0], h + layer.ffn(layer.ffn_block.norm(h)),
                                   rtol=0, atol=1e-12)
