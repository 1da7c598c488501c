"""lecture_pkg.layers against torch's own layers and against the formulas written out."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lecture_pkg.attention import KVCache
from lecture_pkg.layers import (
    ACTIVATIONS,
    GATED_ACTIVATIONS,
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    MoEFeedForward,
    Residual,
    RMSNorm,
    deepnet_constants,
    deepnet_init_,
    make_norm,
)
from lecture_pkg.masks import causal_mask, padding_mask

torch.set_default_dtype(torch.float32)


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --------------------------------------------------------------------------------------------
# Feed-forward networks
# --------------------------------------------------------------------------------------------

def test_tanh_gelu_is_the_tanh_formula_and_close_to_exact() -> None:
    x = torch.linspace(-6, 6, 2001, dtype=torch.float64)
    formula = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(ACTIVATIONS["gelu_tanh"](x), formula)
    exact = x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))  # x * Phi(x)
    torch.testing.assert_close(ACTIVATIONS["gelu"](x), exact)
    assert (ACTIVATIONS["gelu_tanh"](x) - exact).abs().max() < 1e-3


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_plain_ffn_is_two_linears_around_the_activation(activation: str) -> None:
    ffn = FeedForward(6, 10, activation).double()
    x = randn(2, 3, 6)
    w1, b1, w2, b2 = ffn.linear1.weight, ffn.linear1.bias, ffn.linear2.weight, ffn.linear2.bias
    expected = ACTIVATIONS[activation](x @ w1.T + b1) @ w2.T + b2
    torch.testing.assert_close(ffn(x), expected)
    assert ffn.linear_v is None


@pytest.mark.parametrize("activation", sorted(GATED_ACTIVATIONS))
def test_gated_ffn_gates_one_projection_by_the_other(activation: str) -> None:
    ffn = FeedForward(6, 4, activation, bias=False).double()
    x = randn(5, 6)
    w, v, w2 = ffn.linear1.weight, ffn.linear_v.weight, ffn.linear2.weight
    gate = {"glu": torch.sigmoid, "reglu": F.relu, "geglu": F.gelu, "swiglu": F.silu,
            "geglu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation]
    torch.testing.assert_close(ffn(x), (gate(x @ w.T) * (x @ v.T)) @ w2.T)
    assert sum(p.numel() for p in ffn.parameters()) == 3 * 6 * 4  # three matrices, d_ff each


def test_swiglu_is_a_swish_gate_not_a_sigmoid_gate() -> None:
    ffn = FeedForward(4, 4, "swiglu", bias=False).double()
    x = randn(3, 4)
    a, b = x @ ffn.linear1.weight.T, x @ ffn.linear_v.weight.T
    swish = (a * torch.sigmoid(a) * b) @ ffn.linear2.weight.T
    sigmoid_gate = (torch.sigmoid(a) * b) @ ffn.linear2.weight.T
    torch.testing.assert_close(ffn(x), swish)
    assert not torch.allclose(ffn(x), sigmoid_gate)


def test_ffn_bad_arguments() -> None:
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(4, 8, "swish")
    with pytest.raises(ValueError, match="d_ff must be positive"):
        FeedForward(4, 0)
    with pytest.raises(TypeError, match="d_model must be an int"):
        FeedForward(4.0, 8)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Norms and residual wiring
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rmsnorm_equals_torch(dtype: torch.dtype) -> None:
    ours, theirs = RMSNorm(8, eps=1e-6).to(dtype), nn.RMSNorm(8, eps=1e-6).to(dtype)
    with torch.no_grad():
        ours.weight.copy_(randn(8, seed=1))
        theirs.weight.copy_(ours.weight)
    x = randn(3, 5, 8, dtype=dtype) * 10
    torch.testing.assert_close(ours(x), theirs(x))
    with pytest.raises(ValueError, match="last dim 7"):
        ours(randn(2, 7, dtype=dtype))


def test_rmsnorm_half_precision_is_computed_in_float32() -> None:
    x = torch.full((2, 4), 300.0, dtype=torch.float16)  # x^2 = 90000 overflows fp16
    out = RMSNorm(4)(x.float()).half()
    torch.testing.assert_close(RMSNorm(4).half()(x), out)
    assert torch.isfinite(RMSNorm(4).half()(x)).all()


def test_make_norm() -> None:
    assert isinstance(make_norm("layer", 4, eps=1e-12), nn.LayerNorm)
    assert make_norm("layer", 4, bias=False).bias is None
    assert isinstance(make_norm("rms", 4), RMSNorm)
    with pytest.raises(ValueError, match="norm must be one of"):
        make_norm("batch", 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("wiring", ["post", "pre", "sandwich", "deepnorm"])
def test_residual_wirings_follow_their_formulas(wiring: str) -> None:
    alpha = 2.5 if wiring == "deepnorm" else 1.0
    block = Residual(6, wiring=wiring, alpha=alpha).double()  # type: ignore[arg-type]
    for norm in [block.norm, block.out_norm]:
        if norm is not None:
            with torch.no_grad():
                norm.weight.copy_(randn(6, seed=2))
                norm.bias.copy_(randn(6, seed=3))
    x = randn(2, 3, 6)
    f = nn.Linear(6, 6).double()
    norm = block.norm
    expected = {"post": lambda: norm(x + f(x)),
                "pre": lambda: x + f(norm(x)),
                "sandwich": lambda: x + block.out_norm(f(norm(x))),
                "deepnorm": lambda: norm(alpha * x + f(x))}[wiring]()
    torch.testing.assert_close(block(x, f), expected)


def test_residual_bad_arguments() -> None:
    with pytest.raises(ValueError, match="wiring must be one of"):
        Residual(4, wiring="middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha"):
        Residual(4, wiring="pre", alpha=2.0)


def test_deepnet_constants_match_the_paper() -> None:
    # Wang et al. 2022, Table 1, with N = M = 6 (encoder-decoder) and N = 6 (encoder only).
    c = deepnet_constants(6, 6)
    assert c["encoder"] == pytest.approx((0.81 * (6**5) ** (1 / 16), 0.87 * (6**5) ** (-1 / 16)))
    assert c["decoder"] == pytest.approx((18**0.25, 72**-0.25))
    assert deepnet_constants(6, 0)["encoder"] == pytest.approx((12**0.25, 48**-0.25))
    assert deepnet_constants(0, 12)["decoder"] == pytest.approx((24**0.25, 96**-0.25))
    with pytest.raises(ValueError, match="both be 0"):
        deepnet_constants(0, 0)


def test_deepnet_init_scales_value_output_and_ffn_only() -> None:
    torch.manual_seed(0)
    layer = EncoderLayer(256, 4, 1024, wiring="deepnorm", alpha=2.0)
    deepnet_init_(layer, beta=0.1)
    attn = layer.self_attn
    xavier_std = math.sqrt(2 / (256 + 256))
    assert attn.q_proj.weight.std().item() == pytest.approx(xavier_std, rel=0.05)
    assert attn.v_proj.weight.std().item() == pytest.approx(0.1 * xavier_std, rel=0.05)
    ffn_std = 0.1 * math.sqrt(2 / (256 + 1024))
    assert layer.ffn.linear1.weight.std().item() == pytest.approx(ffn_std, rel=0.05)


# --------------------------------------------------------------------------------------------
# Encoder and decoder layers against torch's
# --------------------------------------------------------------------------------------------

def _torch_encoder_layer(norm_first: bool, activation: str = "relu") -> nn.TransformerEncoderLayer:
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation=activation,
                                      batch_first=True, norm_first=norm_first).double().eval()


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_equals_torch(norm_first: bool, activation: str) -> None:
    theirs = _torch_encoder_layer(norm_first, activation)
    ours = EncoderLayer.from_torch(theirs).eval()
    assert ours.attn_block.wiring == ("pre" if norm_first else "post")
    x = randn(3, 5, 16)
    lengths = torch.tensor([5, 3, 1])
    pad = padding_mask(lengths, 5)
    cases = [({}, {}), ({"key_padding_mask": pad}, {"src_key_padding_mask": ~pad}),
             ({"attn_mask": causal_mask(5)}, {"src_mask": ~causal_mask(5)})]
    for our_kwargs, their_kwargs in cases:
        expected = theirs(x, **their_kwargs)
        for output_attentions in (False, True):
            got, weights = ours(x, output_attentions=output_attentions, **our_kwargs)
            # torch's fast path leaves padded query rows at 0; compare the real positions
            real = pad if "key_padding_mask" in our_kwargs else torch.ones_like(pad)
            torch.testing.assert_close(got[real], expected[real], rtol=1e-6, atol=1e-6)
            assert (weights is not None) == output_attentions


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_torch(norm_first: bool) -> None:
    torch.manual_seed(1)
    theirs = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                        norm_first=norm_first).double().eval()
    ours = DecoderLayer.from_torch(theirs).eval()
    y, memory = randn(2, 4, 16, seed=1), randn(2, 6, 16, seed=2)
    mem_pad = padding_mask([6, 2], 6)
    tgt_pad = padding_mask([4, 3], 4)
    expected = theirs(y, memory, tgt_mask=~causal_mask(4), tgt_key_padding_mask=~tgt_pad,
                      memory_key_padding_mask=~mem_pad)
    for output_attentions in (False, True):
        got, self_w, cross_w = ours(y, memory, tgt_key_padding_mask=tgt_pad,
                                    memory_key_padding_mask=mem_pad,
                                    output_attentions=output_attentions)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert self_w.shape == (2, 4, 4, 4) and cross_w.shape == (2, 4, 4, 6)
    assert torch.all(self_w.triu(1) == 0)  # causal by default
    assert torch.all(cross_w[1, :, :, 2:] == 0)  # padded memory receives no weight


def test_from_torch_rejects_other_modules() -> None:
    with pytest.raises(TypeError, match="TransformerEncoderLayer"):
        EncoderLayer.from_torch(nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TransformerDecoderLayer"):
        DecoderLayer.from_torch(_torch_encoder_layer(False))  # type: ignore[arg-type]


def test_decoder_layer_kv_cache_equals_full_recomputation() -> None:
    torch.manual_seed(2)
    layer = DecoderLayer(16, 4, 32, dropout=0.0, wiring="pre").double().eval()
    y, memory = randn(2, 5, 16, seed=4), randn(2, 7, 16, seed=5)
    mem_pad = padding_mask([7, 4], 7)
    full, _, _ = layer(y, memory, memory_key_padding_mask=mem_pad)
    cache = (KVCache(), KVCache(static=True))
    steps = [layer(y[:, t:t + 1], memory, memory_key_padding_mask=mem_pad, cache=cache)[0]
             for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-12, atol=1e-12)
    assert len(cache[0]) == 5 and len(cache[1]) == 7


def test_decoder_only_block_with_cache() -> None:
    torch.manual_seed(3)
    block = EncoderLayer(16, 2, 32, dropout=0.0, wiring="pre", activation="gelu_tanh").double()
    x = randn(1, 6, 16, seed=6)
    full, _ = block(x, is_causal=True)
    cache = KVCache()
    prefix, _ = block(x[:, :4], is_causal=True, cache=cache)
    rest = [block(x[:, t:t + 1], is_causal=True, cache=cache)[0] for t in (4, 5)]
    torch.testing.assert_close(torch.cat([prefix, *rest], dim=1), full, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.permutations(list(range(6))), st.sampled_from(["post", "pre", "sandwich"]))
def test_encoder_layer_is_permutation_equivariant(perm: list[int], wiring: str) -> None:
    torch.manual_seed(4)
    layer = EncoderLayer(8, 2, 16, dropout=0.0, wiring=wiring).double()  # type: ignore[arg-type]
    x = randn(2, 6, 8, seed=7)
    perm_t = torch.tensor(perm)
    out, _ = layer(x)
    out_perm, _ = layer(x[:, perm_t])
    torch.testing.assert_close(out_perm, out[:, perm_t], rtol=1e-10, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 4), st.integers(0, 2**31 - 1))
def test_decoder_output_ignores_future_tokens(t: int, seed: int) -> None:
    torch.manual_seed(5)
    layer = DecoderLayer(8, 2, 16, dropout=0.0).double()
    y, memory = randn(1, 5, 8, seed=8), randn(1, 3, 8, seed=9)
    changed = y.clone()
    changed[:, t + 1:] = randn(1, 4 - t, 8, seed=seed)
    out, _, _ = layer(y, memory)
    out_changed, _, _ = layer(changed, memory)
    torch.testing.assert_close(out_changed[:, :t + 1], out[:, :t + 1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layers_stay_finite_under_autocast_and_full_masking(dtype: torch.dtype) -> None:
    torch.manual_seed(6)
    enc, dec = EncoderLayer(16, 4, 32), DecoderLayer(16, 4, 32)
    x = torch.randn(2, 5, 16) * 30
    nothing = torch.zeros(2, 5, dtype=torch.bool)  # every key padded: fully masked rows
    with torch.autocast("cpu", dtype=dtype):
        for output_attentions in (False, True):
            h, _ = enc(x, key_padding_mask=nothing, output_attentions=output_attentions)
            y, _, _ = dec(x, h, memory_key_padding_mask=nothing,
                          output_attentions=output_attentions)
            assert torch.isfinite(h).all() and torch.isfinite(y).all()


def test_encoder_layer_bad_configuration() -> None:
    with pytest.raises(ValueError, match="divisible by num_heads"):
        EncoderLayer(10, 3, 16)
    with pytest.raises(ValueError, match="activation must be one of"):
        EncoderLayer(8, 2, 16, activation="tanh")
    with pytest.raises(ValueError, match="norm must be one of"):
        EncoderLayer(8, 2, 16, norm="batch")  # type: ignore[arg-type]
    layer = EncoderLayer(8, 2, 16)
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        layer(torch.randn(2, 4, 8), key_padding_mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):
        layer(torch.randn(2, 4, 8), attn_mask=torch.ones(3, 3, dtype=torch.bool))


# --------------------------------------------------------------------------------------------
# Mixture of experts
# --------------------------------------------------------------------------------------------

def test_moe_with_one_expert_equals_a_plain_ffn() -> None:
    torch.manual_seed(7)
    moe = MoEFeedForward(8, 16, num_experts=1, k=1).double()
    x = randn(3, 4, 8)
    torch.testing.assert_close(moe(x), moe.experts[0](x))
    assert moe.expert_fraction.tolist() == [1.0]
    assert moe.aux_loss.item() == pytest.approx(1.0)


@pytest.mark.parametrize("k", [1, 2])
def test_moe_equals_a_token_by_token_loop(k: int) -> None:
    torch.manual_seed(8)
    moe = MoEFeedForward(8, 12, num_experts=4, k=k).double()
    x = randn(2, 5, 8, seed=10)
    got = moe(x)
    tokens = x.reshape(-1, 8)
    probs = torch.softmax(tokens @ moe.router.weight.T, dim=-1)
    expected, counts = [], torch.zeros(4, dtype=torch.float64)
    for token, p in zip(tokens, probs):
        top = p.topk(k)
        weights = top.values if k == 1 else top.values / top.values.sum()
        expected.append(sum(w * moe.experts[int(e)](token) for w, e in zip(weights, top.indices)))
        counts[top.indices] += 1
    torch.testing.assert_close(got.reshape(-1, 8), torch.stack(expected))
    fraction = counts / counts.sum()
    torch.testing.assert_close(moe.expert_fraction, fraction)
    torch.testing.assert_close(moe.aux_loss, 4 * (fraction * probs.mean(0)).sum())


def test_moe_aux_loss_grows_when_routing_collapses() -> None:
    moe = MoEFeedForward(4, 8, num_experts=4, k=1)
    x = torch.randn(64, 4)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[2] = 50.0 * x.mean(0).sign()  # everyone prefers expert 2...
        moe(x.abs() * x.mean(0).sign())  # ...for inputs aligned with it
    assert moe.expert_fraction[2] == 1.0
    assert moe.aux_loss.item() > 3.5  # balanced routing gives 1; full collapse gives ~E
    with pytest.raises(ValueError, match="k must be <= num_experts"):
        MoEFeedForward(4, 8, num_experts=2, k=3)


def test_moe_router_gets_a_gradient_from_the_aux_loss() -> None:
    moe = MoEFeedForward(4, 8, num_experts=3, k=1)
    out = moe(torch.randn(10, 4))
    (out.sum() + moe.aux_loss).backward()
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------
# Mixture of experts: the load-balancing loss against HF, and the capacity limit
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2])
def test_moe_load_balancing_loss_equals_hf_mixtral(k: int) -> None:
    mixtral = pytest.importorskip("transformers.models.mixtral.modeling_mixtral")
    torch.manual_seed(0)
    moe = MoEFeedForward(16, 32, num_experts=4, k=k).double()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    moe(x)
    router_logits = moe.router(x.reshape(-1, 16))  # the same logits HF's function gets
    hf = mixtral.load_balancing_loss_func((router_logits,), num_experts=4, top_k=k)
    # HF sums the per-slot fractions (balanced = k); ours divides by k (balanced = 1)
    assert (k * moe.aux_loss).item() == pytest.approx(hf.item(), rel=1e-5)


def test_moe_capacity_drops_the_overflow_in_token_order() -> None:
    torch.manual_seed(0)
    moe = MoEFeedForward(8, 16, num_experts=2, k=1, capacity_factor=0.5).double()
    with torch.no_grad():  # route every token to expert 0
        moe.router.weight.zero_()
        moe.router.weight[0] = 0.0
        moe.router.weight[1] = -1e3
    x = torch.rand(1, 8, 8, dtype=torch.float64) + 0.1  # positive: expert 1 scores below 0
    out = moe(x)
    capacity = 2  # ceil(0.5 * 8 tokens * 1 / 2 experts)
    gate = torch.softmax(moe.router(x[0]), -1)[:, 0, None]
    expected = gate[:capacity] * moe.experts[0](x[0, :capacity])
    torch.testing.assert_close(out[0, :capacity], expected)
    assert (out[0, capacity:] == 0).all()
    assert moe.dropped_fraction == pytest.approx(6 / 8)
    unlimited = MoEFeedForward(8, 16, num_experts=2).double()
    unlimited(x)
    assert unlimited.dropped_fraction == 0.0
    with pytest.raises(ValueError, match="capacity_factor"):
        MoEFeedForward(8, 16, num_experts=2, capacity_factor=0)
