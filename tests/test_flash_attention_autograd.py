"""Tests for lecture_pkg.flash_attention_autograd: FlashAttention-2's forward and recomputing
backward equal autograd through reference attention in float64 (causal and not, ragged tiles),
pass gradcheck, and save only q, k, v, the output and the log-sum-exp."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lecture_pkg.flash_attention_autograd import flash_attention_function
from lecture_pkg.measure import saved_tensor_bytes

F64 = torch.float64


def reference(q, k, v, is_causal, scale):
    scores = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, -torch.inf)
    return torch.softmax(scores, -1) @ v


@settings(max_examples=25, deadline=None)
@given(t_q=st.integers(1, 23), t_k=st.integers(1, 23), block=st.integers(1, 9),
       causal=st.booleans(), seed=st.integers(0, 1000))
def test_gradients_equal_autograd_through_reference(t_q, t_k, block, causal, seed):
    if causal and t_q > t_k:
        t_q = t_k  # top-left causal with more queries than keys is covered below
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, t_q, 5, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(2, 3, t_k, 5, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(2, 3, t_k, 4, generator=g, dtype=F64, requires_grad=True)
    d_out = torch.randn(2, 3, t_q, 4, generator=g, dtype=F64)
    out = flash_attention_function(q, k, v, is_causal=causal, block_size=block)
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    expected = reference(q, k, v, causal, 5 ** -0.5)
    expected_grads = torch.autograd.grad(expected, (q, k, v), d_out)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def test_gradcheck_causal_more_queries_than_keys():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, 3, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(1, 6, 3, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(1, 6, 2, generator=g, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention_function(q, k, v, is_causal=True, block_size=4), (q, k, v))


@pytest.mark.parametrize("n", [256, 512])
def test_saves_linear_memory(n):
    q, k, v = (torch.randn(1, 2, n, 16, requires_grad=True) for _ in range(3))
    _, saved = saved_tensor_bytes(lambda: flash_attention_function(q, k, v, block_size=64),
                                  exclude=(q, k, v))
    assert saved == (2 * n * 16 + 2 * n) * 4  # the output and one log-sum-exp per query
    _, full = saved_tensor_bytes(lambda: reference(q, k, v, False, 0.25), exclude=(q, k, v))
    assert full >= 2 * n * n * 4  # autograd through the reference keeps the n x n weights


def test_half_precision_runs_in_float32():
    q, k, v = (torch.randn(1, 40, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = flash_attention_function(q, k, v, is_causal=True, block_size=16)
    out.sum().backward()
    assert out.dtype == q.grad.dtype == torch.bfloat16
    ref = reference(q.float(), k.float(), v.float(), True, 8 ** -0.5)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="k has last dim 3 but q has 4"):
        flash_attention_function(torch.zeros(2, 4), torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="v has 1 positions but k has 2"):
        flash_attention_function(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(1, 4))
    with pytest.raises(ValueError, match="block_size must be positive"):
        flash_attention_function(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(2, 4),
                                 block_size=0)


def test_saved_bytes_grow_linearly_against_quadratically():
    import math

    sizes, ours, plain = [128, 256, 512], [], []
    for n in sizes:
        q, k, v = (torch.randn(1, 1, n, 16, requires_grad=True) for _ in range(3))
        ours.append(saved_tensor_bytes(lambda: flash_attention_function(q, k, v, True),
                                       exclude=(q, k, v))[1])
        plain.append(saved_tensor_bytes(lambda: reference(q, k, v, True, 0.25),
                                        exclude=(q, k, v))[1])
    exponent = [math.log(b[-1] / b[0]) / math.log(sizes[-1] / sizes[0]) for b in (ours, plain)]
    assert abs(exponent[0] - 1) < 0.05 and abs(exponent[1] - 2) < 0.1
