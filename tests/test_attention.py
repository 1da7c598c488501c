"""lecture_pkg.attention against independent references: float64 NumPy loops, torch's
scaled_dot_product_attention and nn.MultiheadAttention, Nadaraya-Watson regression, and
hypothesis properties (rows sum to one, permutation equivariance, convexity)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lecture_pkg import kernels
from lecture_pkg.attention import (
    AdditiveScore,
    BilinearScore,
    KVCache,
    MultiHeadAttention,
    attention,
    cosine_score,
    dot_score,
    flash_attention,
    gaussian_score,
    grouped_query_attention,
    local_attention,
    scaled_dot_product_attention,
    scaled_dot_score,
    softmax,
    sparsemax,
)
from lecture_pkg.kernel_regression import nadaraya_watson

FAST = settings(max_examples=40, deadline=None)


def randn(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def numpy_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: np.ndarray,
                    bias: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Reference: one query at a time in float64 NumPy, zeros for a query that sees no key.
    q: (B, t_q, d), k: (B, t_k, d), v: (B, t_k, d_v); allowed, bias: (B, t_q, t_k)."""
    q, k, v = (x.double().numpy() for x in (q, k, v))
    batch, t_q, t_k = allowed.shape
    out, weights = np.zeros((batch, t_q, v.shape[-1])), np.zeros((batch, t_q, t_k))
    for b, i in itertools.product(range(batch), range(t_q)):
        keys = np.flatnonzero(allowed[b, i])
        if keys.size == 0:
            continue
        s = np.array([q[b, i] @ k[b, j] * scale + bias[b, i, j] for j in keys])
        w = np.exp(s - s.max())
        weights[b, i, keys] = w / w.sum()
        out[b, i] = weights[b, i] @ v[b]
    return out, weights


# --------------------------------------------------------------------------------------------
# Scoring functions
# --------------------------------------------------------------------------------------------

def test_scores_match_numpy_loops() -> None:
    q, k = randn(2, 4, 5), randn(2, 3, 5, seed=1)
    qn, kn = q.numpy(), k.numpy()
    for b, i, j in itertools.product(range(2), range(4), range(3)):
        dot = float(np.dot(qn[b, i], kn[b, j]))
        assert dot_score(q, k)[b, i, j].item() == pytest.approx(dot)
        assert scaled_dot_score(q, k)[b, i, j].item() == pytest.approx(dot / math.sqrt(5))
        assert scaled_dot_score(q, k, scale=0.5)[b, i, j].item() == pytest.approx(dot / 2)
        cos = dot / (np.linalg.norm(qn[b, i]) * np.linalg.norm(kn[b, j]))
        assert cosine_score(q, k)[b, i, j].item() == pytest.approx(cos)
        sq = float(np.sum((qn[b, i] - kn[b, j]) ** 2))
        assert gaussian_score(q, k, sigma=0.7)[b, i, j].item() == pytest.approx(-sq / (2 * 0.49))


def test_gaussian_softmax_is_nadaraya_watson() -> None:
    x_query, x_train, y_train = randn(6, 1), randn(9, 1, seed=1), randn(9, seed=2)
    _, expected = nadaraya_watson(x_query, x_train, y_train, kernel="gaussian", bandwidth=0.8)
    assert torch.allclose(softmax(gaussian_score(x_query, x_train, sigma=0.8)), expected)


def test_additive_and_bilinear_scores_match_loops() -> None:
    torch.manual_seed(0)
    additive = AdditiveScore(d_q=3, d_k=5, hidden=7).double()
    bilinear = BilinearScore(d_q=3, d_k=5).double()
    q, k = randn(2, 4, 3), randn(2, 6, 5, seed=1)
    w_q, w_k, b = additive.query_proj.weight, additive.key_proj.weight, additive.key_proj.bias
    v, w = additive.v.weight[0], bilinear.weight
    got_additive, got_bilinear = additive(q, k), bilinear(q, k)
    for n, i, j in itertools.product(range(2), range(4), range(6)):
        expected = v @ torch.tanh(w_q @ q[n, i] + w_k @ k[n, j] + b)
        assert torch.allclose(got_additive[n, i, j], expected)
        assert torch.allclose(got_bilinear[n, i, j], q[n, i] @ w @ k[n, j])


def test_bilinear_with_identity_is_dot() -> None:
    bilinear = BilinearScore(4, 4).double()
    with torch.no_grad():
        bilinear.weight.copy_(torch.eye(4))
    q, k = randn(3, 4), randn(5, 4, seed=1)
    assert torch.allclose(bilinear(q, k), dot_score(q, k))


def test_additive_score_gradcheck() -> None:
    torch.manual_seed(0)
    additive = AdditiveScore(d_q=3, d_k=2, hidden=4).double()
    q = randn(2, 3).requires_grad_()
    k = randn(4, 2, seed=1).requires_grad_()
    assert torch.autograd.gradcheck(additive, (q, k))


def test_score_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="k has last dim 3 but q has 4"):
        dot_score(randn(2, 4), randn(2, 3))
    with pytest.raises(ValueError, match="batch dims"):
        scaled_dot_score(randn(2, 5, 4), randn(3, 5, 4))
    with pytest.raises(TypeError, match="q must have a floating dtype"):
        cosine_score(torch.ones(2, 4, dtype=torch.long), randn(2, 4))
    with pytest.raises(ValueError, match="sigma must be positive"):
        gaussian_score(randn(2, 4), randn(2, 4), sigma=0.0)
    with pytest.raises(ValueError, match=r"expected q \(\.\.\., t_q, 3\)"):
        AdditiveScore(3, 2, 4).double()(randn(2, 4), randn(2, 2))


# --------------------------------------------------------------------------------------------
# Normalisers
# --------------------------------------------------------------------------------------------

def test_softmax_matches_torch_and_does_not_overflow() -> None:
    scores = randn(3, 7) * 10
    assert torch.allclose(softmax(scores), torch.softmax(scores, -1))
    assert torch.allclose(softmax(scores, dim=0), torch.softmax(scores, 0))
    huge = torch.tensor([1000.0, 1001.0, 999.0])  # exp(1000) overflows float32
    assert torch.allclose(softmax(huge), torch.softmax(huge, -1))


def numpy_sparsemax(z: np.ndarray) -> np.ndarray:
    """Reference: the projection onto the simplex by bisection on tau with sum(max(z - tau, 0)) = 1
    (no sorting, unlike the implementation)."""
    low, high = z.max() - 1.0, z.max()
    for _ in range(200):
        tau = (low + high) / 2
        low, high = (tau, high) if np.maximum(z - tau, 0).sum() > 1 else (low, tau)
    return np.maximum(z - (low + high) / 2, 0)


@FAST
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=12))
def test_sparsemax_is_the_simplex_projection(values: list[float]) -> None:
    z = torch.tensor(values, dtype=torch.float64)
    p = sparsemax(z)
    assert np.allclose(p.numpy(), numpy_sparsemax(z.numpy()), atol=1e-9)
    assert (p >= 0).all() and torch.isclose(p.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_sparsemax_worked_values_and_dim() -> None:
    z = torch.tensor([[1.0, 0.8, 0.1, -1.0], [0.0, 0.0, 0.0, 0.0]])
    expected = torch.tensor([[0.6, 0.4, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    assert torch.allclose(sparsemax(z), expected)
    assert torch.allclose(sparsemax(z.T, dim=0), expected.T)
    assert sparsemax(z.bfloat16()).dtype == torch.bfloat16


def test_sparsemax_gradcheck() -> None:
    # Away from the kinks (ties at the support boundary) sparsemax is linear, so finite
    # differences are exact there; these scores have gaps of at least 0.1.
    z = torch.tensor([[0.3, 1.2, -0.5, 0.9, 0.0], [2.0, -1.0, 1.5, 0.1, 1.4]],
                     dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(sparsemax, (z,))
    z3 = randn(2, 3, 6).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: sparsemax(x, dim=1), (z3,))


# --------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# --------------------------------------------------------------------------------------------

@FAST
@given(batch=st.integers(1, 2), t_q=st.integers(1, 6), t_k=st.integers(1, 6),
       d_k=st.integers(1, 5), d_v=st.integers(1, 5),
       mask_kind=st.sampled_from(["none", "bool", "float", "causal", "causal+bool"]),
       seed=st.integers(0, 2**16))
def test_sdpa_matches_numpy_and_torch(batch: int, t_q: int, t_k: int, d_k: int, d_v: int,
                                      mask_kind: str, seed: int) -> None:
    q, k, v = randn(batch, t_q, d_k, seed=seed), randn(batch, t_k, d_k, seed=seed + 1), \
        randn(batch, t_k, d_v, seed=seed + 2)
    gen = torch.Generator().manual_seed(seed)
    allowed = np.ones((batch, t_q, t_k), dtype=bool)
    bias = np.zeros((batch, t_q, t_k))
    kwargs: dict = {}
    if mask_kind in ("bool", "causal+bool"):
        mask = torch.rand(batch, t_q, t_k, generator=gen) > 0.3
        kwargs["attn_mask"] = mask
        allowed &= mask.numpy()
    if mask_kind == "float":
        mask = torch.randn(batch, t_q, t_k, generator=gen, dtype=torch.float64)
        kwargs["attn_mask"] = mask
        bias = mask.numpy()
    if mask_kind.startswith("causal"):
        kwargs["is_causal"] = True
        allowed &= np.tril(np.ones((t_q, t_k), dtype=bool))
    out, weights = scaled_dot_product_attention(q, k, v, **kwargs)
    ref_out, ref_weights = numpy_attention(q, k, v, allowed, bias, 1 / math.sqrt(d_k))
    assert np.allclose(out.numpy(), ref_out) and np.allclose(weights.numpy(), ref_weights)
    if mask_kind != "causal+bool":  # torch refuses attn_mask together with is_causal
        assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, **kwargs))


def test_sdpa_matches_torch_4d_broadcast_masks_and_scale() -> None:
    q, k, v = randn(2, 3, 5, 8), randn(2, 3, 7, 8, seed=1), randn(2, 3, 7, 4, seed=2)
    for mask in (torch.rand(5, 7) > 0.4, torch.rand(2, 1, 5, 7) > 0.4, randn(1, 3, 1, 7, seed=3)):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        assert torch.allclose(scaled_dot_product_attention(q, k, v, mask, scale=0.3)[0], expected)


def test_fully_masked_rows_give_zeros_not_nan() -> None:
    q, k, v = randn(1, 4, 8), randn(1, 6, 8, seed=1), randn(1, 6, 3, seed=2)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    additive = torch.zeros(4, 6, dtype=torch.float64).masked_fill(~mask, -math.inf)
    finfo_min = torch.zeros(4, 6, dtype=torch.float64).masked_fill(~mask, torch.finfo(torch.float64).min)
    for attn_mask in (mask, additive, finfo_min):
        out, weights = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        assert torch.isfinite(out).all() and torch.isfinite(weights).all()
        assert (out[0, 2] == 0).all() and (weights[0, 2] == 0).all()
        assert torch.allclose(weights[0, [0, 1, 3]].sum(-1), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(scaled_dot_product_attention(q, k, v, attn_mask=mask)[0],
                          F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_finite_and_close(dtype: torch.dtype) -> None:
    # Large inputs (scores ~ +-100) on purpose: -1e9 or an fp16 softmax would overflow here.
    q, k, v = (randn(2, 2, 16, 32, dtype=torch.float32, seed=s).mul(4).to(dtype) for s in range(3))
    mask = torch.rand(16, 16, generator=torch.Generator().manual_seed(0)) > 0.5
    mask[3] = False  # a fully masked row
    # The reference computes in float32 from the same rounded inputs, so what differs is only
    # the rounding of the results to dtype (8 mantissa bits for bf16, 11 for fp16).
    reference, reference_weights = scaled_dot_product_attention(q.float(), k.float(), v.float(), mask)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert out.dtype == weights.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    rtol = 2**-7 if dtype == torch.bfloat16 else 2**-10
    assert torch.allclose(out.float(), reference, rtol=rtol, atol=1e-3)
    assert torch.allclose(weights.float(), reference_weights, rtol=rtol, atol=1e-3)
    flash = flash_attention(q, k, v, is_causal=True, block_size=5, query_block_size=6)
    causal, _ = scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert flash.dtype == dtype and torch.allclose(flash.float(), causal, rtol=rtol, atol=1e-3)


def test_dropout_is_reproducible_and_consistent() -> None:
    q, k, v = randn(2, 6, 4), randn(2, 6, 4, seed=1), randn(2, 6, 3, seed=2)
    first = scaled_dot_product_attention(q, k, v, dropout_p=0.5,
                                         generator=torch.Generator().manual_seed(7))
    second = scaled_dot_product_attention(q, k, v, dropout_p=0.5,
                                          generator=torch.Generator().manual_seed(7))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    torch.manual_seed(3)
    global_first = scaled_dot_product_attention(q, k, v, dropout_p=0.5)[0]
    torch.manual_seed(3)
    assert torch.equal(global_first, scaled_dot_product_attention(q, k, v, dropout_p=0.5)[0])
    out, weights = first
    assert torch.allclose(out, weights @ v)  # the returned weights are the applied ones
    _, clean = scaled_dot_product_attention(q, k, v)
    kept = weights != 0
    assert 0 < kept.sum() < kept.numel()
    assert torch.allclose(weights[kept], clean[kept] * 2)  # survivors scaled by 1 / (1 - p)


def test_dropout_is_unbiased() -> None:
    q, k, v = randn(1, 3, 4), randn(1, 5, 4, seed=1), randn(1, 5, 2, seed=2)
    clean, _ = scaled_dot_product_attention(q, k, v)
    gen = torch.Generator().manual_seed(0)
    mean = torch.stack([scaled_dot_product_attention(q, k, v, dropout_p=0.3, generator=gen)[0]
                        for _ in range(4000)]).mean(0)
    assert torch.allclose(mean, clean, atol=0.05)


def test_sdpa_errors_name_the_problem() -> None:
    q, k, v = randn(2, 5, 4), randn(2, 6, 4), randn(2, 6, 3)
    with pytest.raises(ValueError, match=r"k has last dim 3 but q has 4 \(d_k must match\)"):
        scaled_dot_product_attention(q, randn(2, 6, 3), v)
    with pytest.raises(ValueError, match="v has 7 positions but k has 6"):
        scaled_dot_product_attention(q, k, randn(2, 7, 3))
    with pytest.raises(ValueError, match="batch dims"):
        scaled_dot_product_attention(q, randn(1, 6, 4), randn(1, 6, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):  # would enlarge the scores
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 2, 5, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 6, dtype=torch.int64))
    with pytest.raises(TypeError, match="share dtype and device"):
        scaled_dot_product_attention(q, k.float(), v)
    with pytest.raises(ValueError, match="dropout_p"):
        scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        scaled_dot_product_attention(q.numpy(), k, v)


# --------------------------------------------------------------------------------------------
# Properties: rows sum to one, permutation equivariance, convexity
# --------------------------------------------------------------------------------------------

@FAST
@given(t_q=st.integers(1, 6), t_k=st.integers(1, 6), seed=st.integers(0, 2**16),
       normaliser=st.sampled_from(["softmax", "sparsemax"]))
def test_weights_are_convex_and_attention_is_permutation_equivariant(
        t_q: int, t_k: int, seed: int, normaliser: str) -> None:
    q, k, v = randn(t_q, 3, seed=seed) * 3, randn(t_k, 3, seed=seed + 1), randn(t_k, 2, seed=seed + 2)
    normalise = softmax if normaliser == "softmax" else sparsemax
    out, weights = attention(q, k, v, normalise=normalise)
    assert (weights >= 0).all() and torch.allclose(weights.sum(-1), torch.ones(t_q, dtype=torch.float64))
    # Convexity: every output lies in the box spanned by the values (a convex hull superset).
    assert (out >= v.min(0).values - 1e-12).all() and (out <= v.max(0).values + 1e-12).all()
    gen = torch.Generator().manual_seed(seed)
    perm_q, perm_k = torch.randperm(t_q, generator=gen), torch.randperm(t_k, generator=gen)
    permuted_out, permuted_weights = attention(q[perm_q], k[perm_k], v[perm_k], normalise=normalise)
    assert torch.allclose(permuted_out, out[perm_q])  # keys/values: invariant; queries: equivariant
    assert torch.allclose(permuted_weights, weights[perm_q][:, perm_k])


def test_general_attention_with_sparsemax_mask_and_learned_score() -> None:
    q, k, v = randn(2, 4, 3), randn(2, 5, 3, seed=1), randn(2, 5, 2, seed=2)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1, :] = False
    mask[2, 3:] = False
    out, weights = attention(q, k, v, normalise=sparsemax, mask=mask)
    assert (weights[:, 1] == 0).all() and (out[:, 1] == 0).all() and (weights[:, 2, 3:] == 0).all()
    additive = AdditiveScore(3, 3, 8).double()
    out, weights = attention(q, k, v, score=additive)
    assert torch.allclose(weights, torch.softmax(additive(q, k), -1))
    with pytest.raises(ValueError, match="score"):
        attention(q, k, v, score=lambda a, b: dot_score(a, b)[..., :2])


# --------------------------------------------------------------------------------------------
# Multi-head attention against torch.nn.MultiheadAttention
# --------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")  # torch's own
@pytest.mark.parametrize("kdim,vdim,bias", [(None, None, True), (6, 10, True), (None, None, False)])
def test_multihead_matches_torch(kdim: int | None, vdim: int | None, bias: bool) -> None:
    torch.manual_seed(0)
    reference = torch.nn.MultiheadAttention(16, 4, bias=bias, kdim=kdim, vdim=vdim,
                                            batch_first=True).double().eval()
    ours = MultiHeadAttention.from_torch(reference).eval()
    x = randn(3, 7, 16)
    key, value = randn(3, 5, kdim or 16, seed=1), randn(3, 5, vdim or 16, seed=2)
    padding = torch.rand(3, 5) > 0.3
    padding[:, 0] = True
    allowed = torch.rand(7, 5) > 0.3
    float_mask = randn(7, 5, seed=3)
    cases = [({}, {}),  # (our kwargs, torch kwargs): torch's bool masks mean True = blocked
             ({"key_padding_mask": padding}, {"key_padding_mask": ~padding}),
             ({"attn_mask": allowed}, {"attn_mask": ~allowed}),
             ({"attn_mask": allowed, "key_padding_mask": padding},
              {"attn_mask": ~allowed, "key_padding_mask": ~padding}),
             ({"attn_mask": float_mask, "key_padding_mask": padding},
              {"attn_mask": float_mask, "key_padding_mask": ~padding})]
    for ours_kwargs, torch_kwargs in cases:
        expected, expected_weights = reference(x, key, value, average_attn_weights=False,
                                               **torch_kwargs)
        out, weights = ours(x, key, value, **ours_kwargs)
        assert weights.shape == (3, 4, 7, 5)
        assert torch.allclose(out, expected) and torch.allclose(weights, expected_weights)


@FAST
@given(batch=st.integers(1, 3), t_q=st.integers(1, 6), t_k=st.integers(1, 6),
       num_heads=st.integers(1, 3), head_dim=st.integers(1, 4), kdim=st.integers(1, 6),
       vdim=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_multihead_matches_torch_on_random_shapes(batch: int, t_q: int, t_k: int, num_heads: int,
                                                  head_dim: int, kdim: int, vdim: int,
                                                  seed: int) -> None:
    torch.manual_seed(seed)
    embed_dim = num_heads * head_dim
    reference = torch.nn.MultiheadAttention(embed_dim, num_heads, kdim=kdim, vdim=vdim,
                                            batch_first=True).double().eval()
    ours = MultiHeadAttention.from_torch(reference).eval()
    query = randn(batch, t_q, embed_dim, seed=seed)
    key, value = randn(batch, t_k, kdim, seed=seed + 1), randn(batch, t_k, vdim, seed=seed + 2)
    padding = torch.rand(batch, t_k) > 0.3
    padding[:, 0] = True  # torch's module returns NaN for a query that sees no key
    expected, expected_weights = reference(query, key, value, key_padding_mask=~padding,
                                           average_attn_weights=False)
    out, weights = ours(query, key, value, key_padding_mask=padding)
    assert out.shape == (batch, t_q, embed_dim) and weights.shape == (batch, num_heads, t_q, t_k)
    assert torch.allclose(out, expected) and torch.allclose(weights, expected_weights)


def test_multihead_self_attention_causal_matches_torch() -> None:
    torch.manual_seed(1)
    reference = torch.nn.MultiheadAttention(12, 3, batch_first=True).double().eval()
    ours = MultiHeadAttention.from_torch(reference).eval()
    x = randn(2, 6, 12)
    blocked = torch.ones(6, 6, dtype=torch.bool).triu(1)
    expected, expected_weights = reference(x, x, x, attn_mask=blocked, average_attn_weights=False)
    out, weights = ours(x, x, x, is_causal=True)
    assert torch.allclose(out, expected) and torch.allclose(weights, expected_weights)


def test_multihead_heads_are_independent_sdpa_calls() -> None:
    """Split, attend per head, concatenate, W_O, written out by hand."""
    torch.manual_seed(2)
    mha = MultiHeadAttention(8, 2).double()
    x = randn(1, 4, 8)
    q, k, v = mha.q_proj(x), mha.k_proj(x), mha.v_proj(x)
    heads = [scaled_dot_product_attention(q[..., h * 4:(h + 1) * 4], k[..., h * 4:(h + 1) * 4],
                                          v[..., h * 4:(h + 1) * 4])[0] for h in range(2)]
    assert torch.allclose(mha(x, x, x)[0], mha.out_proj(torch.cat(heads, -1)))


def test_multihead_dropout_only_in_training_and_reproducible() -> None:
    mha = MultiHeadAttention(8, 2, dropout=0.5).double()
    x = randn(2, 5, 8)
    torch.manual_seed(0)
    a = mha(x, x, x)[1]
    torch.manual_seed(0)
    assert torch.equal(a, mha(x, x, x)[1]) and (a == 0).any()
    mha.eval()
    assert torch.allclose(mha(x, x, x)[1].sum(-1), torch.ones(2, 2, 5, dtype=torch.float64))


def test_multihead_errors() -> None:
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)
    mha = MultiHeadAttention(8, 2).double()
    with pytest.raises(ValueError, match=r"query must have shape \(batch, length, 8\)"):
        mha(randn(2, 5, 6), randn(2, 5, 8), randn(2, 5, 8))
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        mha(randn(2, 5, 8), randn(2, 4, 8), randn(2, 4, 8),
            key_padding_mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, add_bias_kv=True))


# --------------------------------------------------------------------------------------------
# Local and flash attention
# --------------------------------------------------------------------------------------------

def test_local_attention_equals_banded_sdpa() -> None:
    q, k, v = randn(2, 9, 4), randn(2, 9, 4, seed=1), randn(2, 9, 3, seed=2)
    distance = (torch.arange(9)[:, None] - torch.arange(9)).abs()
    for radius in (0, 1, 3, 12):
        out, band = local_attention(q, k, v, radius)
        expected, weights = F.scaled_dot_product_attention(q, k, v, attn_mask=distance <= radius), \
            torch.softmax((q @ k.mT / 2).masked_fill(distance > radius, -math.inf), -1)
        assert torch.allclose(out, expected)
        assert band.shape == (2, 9, 2 * radius + 1)
        for i, w in itertools.product(range(9), range(2 * radius + 1)):
            j = i - radius + w
            assert band[:, i, w].tolist() == pytest.approx(weights[:, i, j].tolist() if 0 <= j < 9 else [0, 0])


def test_local_attention_errors() -> None:
    q = randn(2, 9, 4)
    with pytest.raises(ValueError, match="radius must be >= 0"):
        local_attention(q, q, q, radius=-1)
    with pytest.raises(ValueError, match="q has 9 positions but k has 5"):
        local_attention(q, randn(2, 5, 4), randn(2, 5, 4), radius=1)


@FAST
@given(t_q=st.integers(1, 40), t_k=st.integers(1, 40), block_size=st.integers(1, 17),
       query_block_size=st.integers(1, 17), is_causal=st.booleans(), seed=st.integers(0, 2**16))
def test_flash_attention_equals_exact_attention(t_q: int, t_k: int, block_size: int,
                                                query_block_size: int, is_causal: bool,
                                                seed: int) -> None:
    q, k, v = randn(2, t_q, 5, seed=seed), randn(2, t_k, 5, seed=seed + 1), randn(2, t_k, 3, seed=seed + 2)
    expected, _ = scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    got = flash_attention(q, k, v, is_causal=is_causal, block_size=block_size,
                          query_block_size=query_block_size, backend="torch")
    assert torch.allclose(got, expected, atol=1e-12)


def test_flash_attention_gradients_match_torch() -> None:
    q, k, v = (randn(2, 37, 5, seed=s).requires_grad_() for s in range(3))
    for is_causal in (False, True):
        got = flash_attention(q, k, v, is_causal=is_causal, block_size=7, query_block_size=9,
                              backend="torch")
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        got_grads = torch.autograd.grad(got.pow(2).sum(), (q, k, v))
        expected_grads = torch.autograd.grad(expected.pow(2).sum(), (q, k, v))
        for got_grad, expected_grad in zip(got_grads, expected_grads):
            assert torch.allclose(got_grad, expected_grad)


class LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an op returns while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        result = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(result):
            if isinstance(leaf, torch.Tensor):
                self.numel = max(self.numel, leaf.numel())
        return result


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_flash_attention_never_materialises_the_scores(is_causal: bool) -> None:
    t_q, t_k, d = 384, 512, 8
    q, k, v = randn(1, t_q, d), randn(1, t_k, d, seed=1), randn(1, t_k, d, seed=2)
    with LargestTensor() as naive:  # the detector sees the (t_q, t_k) matrix when it exists
        scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert naive.numel >= t_q * t_k
    with LargestTensor() as flash:
        flash_attention(q, k, v, is_causal=is_causal, block_size=64, query_block_size=32,
                        backend="torch")
    # Nothing bigger than the inputs, the output or one (32, 64) tile of scores.
    assert flash.numel <= max(t_k * d, 32 * 64)


def test_flash_attention_extreme_scores_and_no_keys() -> None:
    # Scores of +-1000: a naive exp overflows; the running max must keep everything finite.
    q, k, v = randn(1, 8, 4) * 30, randn(1, 20, 4, seed=1) * 30, randn(1, 20, 2, seed=2)
    expected = F.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(flash_attention(q, k, v, block_size=3, query_block_size=3), expected)
    empty = flash_attention(q, k[:, :0], v[:, :0])
    assert empty.shape == (1, 8, 2) and (empty == 0).all()


def test_flash_attention_cpu_never_needs_triton() -> None:
    q = randn(1, 4, 64).half()
    assert not kernels.flash_attention_applies(q, q, q)  # "auto" uses the loop on the CPU
    assert torch.allclose(flash_attention(q, q, q).float(),
                          F.scaled_dot_product_attention(q.float(), q.float(), q.float()), atol=1e-3)
    with pytest.raises(ValueError, match="block_size"):
        flash_attention(q, q, q, block_size=0)
    with pytest.raises(ValueError, match="backend"):
        flash_attention(q, q, q, backend="cuda")  # type: ignore[arg-type]


def test_triton_backend_on_cpu_says_why_not() -> None:
    q = randn(1, 4, 64).half()
    if kernels.triton_usable(q.device):
        pytest.skip("TRITON_INTERPRET=1 and Triton installed: the kernel can run on the CPU")
    with pytest.raises(ValueError, match="needs Triton and a CUDA device"):
        flash_attention(q, q, q, backend="triton")



# --------------------------------------------------------------------------------------------
# MultiHeadAttention: fused fast path, scale, key-value cache
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [None, 1.0])
def test_mha_fast_path_equals_teaching_path(scale: float | None) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, scale=scale).double()
    x, memory = randn(3, 5, 16), randn(3, 7, 16)
    padding = torch.tensor([[True] * 7, [True] * 4 + [False] * 3, [False] * 7])  # row 3: nothing
    bias = randn(1, 4, 5, 7)  # an additive per-head bias (T5/Swin style)
    cases = [dict(), dict(key_padding_mask=padding), dict(attn_mask=bias),
             dict(attn_mask=bias, key_padding_mask=padding)]
    for kwargs in cases:
        slow, weights = mha(x, memory, memory, **kwargs)
        fast, none = mha(x, memory, memory, need_weights=False, **kwargs)
        assert none is None and weights is not None
        torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    slow, _ = mha(x, x, x, is_causal=True)
    fast, _ = mha(x, x, x, is_causal=True, need_weights=False)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    # a query with no key to attend to gets a zero attention output on both paths
    fast, _ = mha(x, memory, memory, key_padding_mask=padding, need_weights=False)
    torch.testing.assert_close(fast[2], mha.out_proj.bias.expand(5, 16))


def test_mha_scale_multiplies_scores() -> None:
    torch.manual_seed(1)
    mha = MultiHeadAttention(8, 2, scale=1.0).double()
    x = randn(1, 3, 8)
    _, weights = mha(x, x, x)
    q = mha._split_heads(mha.q_proj(x))
    k = mha._split_heads(mha.k_proj(x))
    torch.testing.assert_close(weights, torch.softmax(q @ k.transpose(-2, -1), dim=-1))
    with pytest.raises(TypeError, match="scale"):
        MultiHeadAttention(8, 2, scale="1")


def test_kv_cache_equals_full_causal_attention() -> None:
    torch.manual_seed(2)
    mha = MultiHeadAttention(12, 3).double().eval()
    x = randn(2, 6, 12)
    padding = torch.tensor([[True] * 6, [False, False, True, True, True, True]])  # left padded
    full, _ = mha(x, x, x, is_causal=True, key_padding_mask=padding, need_weights=False)
    for need_weights in (True, False):
        cache = KVCache()
        # a prompt of 3 positions at once (chunked prefill), then one position at a time
        steps = [(0, 3), (3, 4), (4, 5), (5, 6)]
        outs = []
        for start, stop in steps:
            chunk = x[:, start:stop]
            out, _ = mha(chunk, chunk, chunk, is_causal=True, key_padding_mask=padding[:, :stop],
                         cache=cache, need_weights=need_weights)
            outs.append(out)
        assert len(cache) == 6
        torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-12, atol=1e-12)


def test_static_kv_cache_projects_memory_once() -> None:
    torch.manual_seed(3)
    mha = MultiHeadAttention(8, 2).double()
    y, memory = randn(2, 1, 8), randn(2, 5, 8)
    cache = KVCache(static=True)
    first, _ = mha(y, memory, memory, cache=cache)
    k_before = cache.k
    second, _ = mha(y, memory * 0, memory * 0, cache=cache)  # memory ignored once cached
    assert cache.k is k_before and len(cache) == 5
    torch.testing.assert_close(first, second)
    cache.reorder(torch.tensor([1, 1]))
    torch.testing.assert_close(cache.k[0], cache.k[1])
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        mha(y, memory, memory, cache={})


def test_fast_path_float32_bias_under_bf16_autocast() -> None:
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    bias = torch.randn(1, 2, 4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = mha(x, x, x, attn_mask=bias, need_weights=False)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


@pytest.mark.parametrize("groups", [8, 4, 2, 1])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_grouped_query_attention_matches_torch(groups: int, is_causal: bool) -> None:
    gen = torch.Generator().manual_seed(groups)
    q = torch.randn(2, 8, 6, 5, generator=gen, dtype=torch.float64)
    k = torch.randn(2, groups, 9, 5, generator=gen, dtype=torch.float64)
    v = torch.randn(2, groups, 9, 3, generator=gen, dtype=torch.float64)
    out, weights = grouped_query_attention(q, k, v, is_causal=is_causal, scale=0.7)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.7,
                                              enable_gqa=True)
    torch.testing.assert_close(out, expected)
    assert weights.shape == (2, 8, 6, 9)
    # query heads 0 .. 8/g - 1 read key-value head 0: same output as plain attention on it
    share = 8 // groups
    first, _ = scaled_dot_product_attention(q[:, :share], k[:, :1].expand(-1, share, -1, -1),
                                            v[:, :1].expand(-1, share, -1, -1),
                                            is_causal=is_causal, scale=0.7)
    torch.testing.assert_close(out[:, :share], first)


def test_grouped_query_attention_mask_and_errors() -> None:
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    mask = torch.tensor([[True, True, False, True, False]])  # (1, t_k): for every query
    out, weights = grouped_query_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                   enable_gqa=True))
    assert (weights[..., ~mask[0]] == 0).all()
    with pytest.raises(ValueError, match="not a multiple"):
        grouped_query_attention(torch.randn(1, 3, 3, 8), k, v)
    with pytest.raises(ValueError, match="v has 1 heads but k has 2"):
        grouped_query_attention(q, k, v[:, :1])
    with pytest.raises(ValueError, match=r"k must have shape \(batch, heads"):
        grouped_query_attention(q, k[0], v)
    with pytest.raises(ValueError, match="batch dims"):
        grouped_query_attention(q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1))


# --------------------------------------------------------------------------------------------
# Linformer: keys and values projected along the sequence
# --------------------------------------------------------------------------------------------


def test_linformer_attention_is_sdpa_on_projected_keys_and_values() -> None:
    from lecture_pkg.attention import linformer_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 12, 8, generator=g, dtype=torch.float64) for _ in range(3))
    e, f = torch.randn(2, 4, 12, generator=g, dtype=torch.float64)
    out, weights = linformer_attention(q, k, v, e, f)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, e @ k, f @ v))
    assert weights.shape == (2, 3, 12, 4)
    # a float64 loop over one query, from the paper's formula
    row = torch.softmax(q[1, 2, 5] @ (e @ k[1, 2]).T / math.sqrt(8), -1)
    torch.testing.assert_close(out[1, 2, 5], row @ (f @ v[1, 2]))
    # proj_len = n with E = F = I is full attention
    eye = torch.eye(12, dtype=torch.float64)
    torch.testing.assert_close(linformer_attention(q, k, v, eye, eye)[0],
                               F.scaled_dot_product_attention(q, k, v))
    with pytest.raises(ValueError, match=r"e must have shape \(proj_len, n\)"):
        linformer_attention(q, k, v, e[:, :5], f)
    with pytest.raises(ValueError, match="same shape"):
        linformer_attention(q, k, v, e, f[:2])


def test_linformer_module_matches_its_functional_form_and_checks_length() -> None:
    from lecture_pkg.attention import LinformerSelfAttention, linformer_attention

    torch.manual_seed(0)
    layer = LinformerSelfAttention(16, 2, seq_len=10, proj_len=3).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)  # shorter than seq_len: first 7 columns
    out, weights = layer(x, x, x)
    split = lambda t: t.view(2, -1, 2, 8).transpose(1, 2)  # noqa: E731
    q, k, v = split(layer.q_proj(x)), split(layer.k_proj(x)), split(layer.v_proj(x))
    expected, w = linformer_attention(q, k, v, layer.e[:, :7], layer.f[:, :7])
    torch.testing.assert_close(out, layer.out_proj(expected.transpose(1, 2).reshape(2, 7, 16)))
    torch.testing.assert_close(weights, w)
    assert weights.shape == (2, 2, 7, 3) and layer(x, x, x, need_weights=False)[1] is None
    # a drop-in for MultiHeadAttention: cross-attention with 4 queries over the 7 keys
    y = torch.randn(2, 4, 16, dtype=torch.float64)
    cross, cross_w = layer(y, x, x)
    expected, _ = linformer_attention(split(layer.q_proj(y)), k, v, layer.e[:, :7],
                                      layer.f[:, :7])
    torch.testing.assert_close(cross, layer.out_proj(expected.transpose(1, 2).reshape(2, 4, 16)))
    assert cross_w.shape == (2, 2, 4, 3)
    assert LinformerSelfAttention(16, 2, 10, 3, share_kv=True).f is not None
    shared = LinformerSelfAttention(16, 2, 10, 3, share_kv=True)
    assert shared.e is shared.f
    long = torch.randn(1, 11, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="seq_len = 10"):
        layer(long, long, long)
    mask = torch.ones(7, 7, dtype=torch.bool)
    for kwargs, name in (({"attn_mask": mask}, "attn_mask"), ({"is_causal": True}, "is_causal"),
                         ({"key_padding_mask": torch.ones(2, 7, dtype=torch.bool)},
                          "key_padding_mask")):
        with pytest.raises(ValueError, match=f"^{name} is not supported"):
            layer(x, x, x, **kwargs)


def test_linformer_mixing_reproduces_the_output_and_has_rank_at_most_proj_len() -> None:
    from lecture_pkg.attention import linformer_attention, linformer_mixing

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 12, 8, generator=g, dtype=torch.float64) for _ in range(3))
    e, f = torch.randn(2, 4, 12, generator=g, dtype=torch.float64)
    out, weights = linformer_attention(q, k, v, e, f)
    mixing = linformer_mixing(weights, f)
    assert mixing.shape == (2, 3, 12, 12)
    torch.testing.assert_close(mixing @ v, out)
    # an independent reference: one query's row, a loop over the proj_len projected values
    row = sum(weights[1, 2, 5, r] * f[r] for r in range(4))
    torch.testing.assert_close(mixing[1, 2, 5], row)
    assert int(torch.linalg.matrix_rank(mixing[0, 0])) == 4          # proj_len, not 12
    with pytest.raises(ValueError, match="f must have shape"):
        linformer_mixing(weights, f[:3])
    with pytest.raises(TypeError, match="f is torch.float32"):
        linformer_mixing(weights, f.float())
