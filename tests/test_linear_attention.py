"""Tests for lecture_pkg.linear_attention: the parallel, chunked and recurrent forms agree in
float64, and the non-causal form equals its associativity rewrite phi(Q)(phi(K)^T V)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lecture_pkg.linear_attention import (
    LinearAttention,
    elu_feature_map,
    linear_attention,
    linear_attention_recurrent,
)

F64 = torch.float64


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), chunk=st.integers(1, 50), seed=st.integers(0, 1000))
def test_parallel_recurrent_and_chunked_forms_agree(n, chunk, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, 3, n, 5, generator=g, dtype=F64) for _ in range(2))
    v = torch.randn(2, 3, n, 7, generator=g, dtype=F64)
    parallel = linear_attention(q, k, v, causal=True)
    recurrent, state = linear_attention_recurrent(q, k, v)
    chunked = linear_attention(q, k, v, method="chunked", chunk_size=chunk)
    torch.testing.assert_close(recurrent, parallel, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(chunked, parallel, rtol=1e-10, atol=1e-12)
    assert state.shape == (2, 3, 5, 7)  # d_k x d_v, whatever n is
    torch.testing.assert_close(state, elu_feature_map(k).transpose(-2, -1) @ v)


def test_causal_rows_do_not_see_the_future():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 10, 4, generator=g, dtype=F64) for _ in range(3))
    out = linear_attention(q, k, v)
    v2 = v.clone()
    v2[:, 6:] += 1.0
    assert torch.equal(linear_attention(q, k, v2)[:, :6], out[:, :6])


def test_non_causal_equals_associative_form():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 9, 4, generator=g, dtype=F64) for _ in range(3))
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    expected = (fq @ (fk.transpose(-2, -1) @ v)) / (fq @ fk.sum(-2)[..., None] + 1e-6)
    torch.testing.assert_close(linear_attention(q, k, v, causal=False), expected)


def test_module_methods_agree_and_shapes():
    torch.manual_seed(0)
    layer = LinearAttention(16, 4, method="chunked", chunk_size=3).double()
    x = torch.randn(2, 11, 16, dtype=F64)
    out = layer(x)
    layer.method = "parallel"
    torch.testing.assert_close(layer(x), out)
    assert out.shape == x.shape


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="q, k and v must share"):
        linear_attention(torch.zeros(4, 3), torch.zeros(5, 3), torch.zeros(5, 3))
    with pytest.raises(ValueError, match="k has last dim 2 but q has 3"):
        linear_attention(torch.zeros(4, 3), torch.zeros(4, 2), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="chunk_size must be positive"):
        linear_attention(torch.zeros(4, 3), torch.zeros(4, 3), torch.zeros(4, 3),
                         method="chunked", chunk_size=0)
    with pytest.raises(ValueError, match="causal=True"):
        linear_attention(torch.zeros(4, 3), torch.zeros(4, 3), torch.zeros(4, 3), causal=False,
                         method="chunked")
    with pytest.raises(ValueError, match="divisible by num_heads"):
        LinearAttention(10, 4)
