"""Tests for lecture_pkg.kv_cache: paged attention, split-K decoding and the rolling cache each
equal full attention in float64 (torch's SDPA as the reference); bad input refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lecture_pkg.kv_cache import (
    PagedKVCache,
    RollingKVCache,
    cache_waste,
    merge_partials,
    paged_attention,
    split_k_attention,
)
from lecture_pkg.masks import sliding_window_causal_mask

F64 = torch.float64


def reference(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@settings(max_examples=30, deadline=None)
@given(t_q=st.integers(1, 5), t_k=st.integers(1, 40), splits=st.integers(1, 50),
       seed=st.integers(0, 1000))
def test_split_k_equals_full_attention(t_q, t_k, splits, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, t_q, 8, generator=g, dtype=F64)
    k = torch.randn(2, 3, t_k, 8, generator=g, dtype=F64)
    v = torch.randn(2, 3, t_k, 6, generator=g, dtype=F64)
    out, lse = split_k_attention(q, k, v, splits)
    torch.testing.assert_close(out, reference(q, k, v), rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, torch.logsumexp(q @ k.transpose(-2, -1) / 8 ** 0.5, -1))


def test_merge_partials_of_empty_chunks_gives_zeros():
    out, lse = merge_partials([torch.zeros(1, 2, 4)] * 2, [torch.full((1, 2), -torch.inf)] * 2)
    assert torch.equal(out, torch.zeros(1, 2, 4)) and torch.isinf(lse).all()


def test_paged_attention_equals_full_attention_for_interleaved_requests():
    g = torch.Generator().manual_seed(0)
    heads, d, page = 3, 8, 4
    cache = PagedKVCache(num_tokens=64, page_size=page, heads=heads, head_dim=d, dtype=F64)
    lengths = {"a": 9, "b": 3, "c": 14}
    keys = {s: torch.randn(heads, n, d, generator=g, dtype=F64) for s, n in lengths.items()}
    values = {s: torch.randn(heads, n, d, generator=g, dtype=F64) for s, n in lengths.items()}
    for step in range(max(lengths.values())):  # one token per request per step, as decoding
        for s, n in lengths.items():
            if step < n:
                cache.append(s, keys[s][:, step:step + 1], values[s][:, step:step + 1])
    # the pages of one request are not adjacent: the block table is what finds them
    assert cache.block_table("c").tolist() != list(range(min(cache.tables["c"]),
                                                         min(cache.tables["c"]) + 4))
    q = torch.randn(3, heads, d, generator=g, dtype=F64)
    out = paged_attention(q, cache, ["a", "b", "c"])
    for row, s in enumerate("abc"):
        ref = reference(q[row][:, None], keys[s], values[s])[:, 0]
        torch.testing.assert_close(out[row], ref, rtol=0, atol=1e-12)
        k, v = cache.gather(s)
        assert torch.equal(k, keys[s]) and torch.equal(v, values[s])
    pages_before = len(cache.free_pages)
    cache.free("c")
    assert len(cache.free_pages) == pages_before + 4


def test_paged_cache_runs_out_of_pages_loudly():
    cache = PagedKVCache(num_tokens=8, page_size=4, heads=1, head_dim=2)
    cache.append(0, torch.zeros(1, 8, 2), torch.zeros(1, 8, 2))
    with pytest.raises(RuntimeError, match="out of pages"):
        cache.append(1, torch.zeros(1, 1, 2), torch.zeros(1, 1, 2))


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="page_size=16 does not divide num_tokens=100"):
        PagedKVCache(num_tokens=100, page_size=16, heads=1, head_dim=4)
    with pytest.raises(ValueError, match="page_size must be positive"):
        PagedKVCache(num_tokens=100, page_size=0, heads=1, head_dim=4)
    cache = PagedKVCache(num_tokens=16, page_size=4, heads=2, head_dim=4)
    with pytest.raises(ValueError, match=r"k must have shape \(heads=2"):
        cache.append(0, torch.zeros(3, 1, 4), torch.zeros(3, 1, 4))
    cache.append(0, torch.zeros(2, 1, 4), torch.zeros(2, 1, 4))
    with pytest.raises(ValueError, match="q must have shape"):
        paged_attention(torch.zeros(1, 2, 5), cache, [0])
    with pytest.raises(ValueError, match="seqs names 2"):
        paged_attention(torch.zeros(1, 2, 4), cache, [0, 0])
    with pytest.raises(KeyError, match="not in the cache"):
        cache.free(7)
    with pytest.raises(ValueError, match="num_splits must be positive"):
        split_k_attention(torch.zeros(1, 4), torch.zeros(3, 4), torch.zeros(3, 4), 0)
    with pytest.raises(ValueError, match="v has 2 positions but k has 3"):
        split_k_attention(torch.zeros(1, 4), torch.zeros(3, 4), torch.zeros(2, 4), 1)
    with pytest.raises(ValueError, match="window must be positive"):
        RollingKVCache(window=0)
    with pytest.raises(ValueError, match="exceeds max_len=10"):
        cache_waste([4, 11], max_len=10, page_size=2)


def test_cache_waste_counts():
    waste = cache_waste([5, 16, 17], max_len=32, page_size=8)
    assert (waste.used, waste.contiguous, waste.paged) == (38, 96, 8 + 16 + 24)
    assert waste.paged_waste < waste.contiguous_waste
    assert cache_waste([7], max_len=7, page_size=1).paged_waste == 0


@pytest.mark.parametrize(("window", "sinks"), [(1, 0), (5, 0), (5, 2), (3, 4), (30, 1)])
def test_rolling_cache_decoding_equals_the_sliding_window_mask(window, sinks):
    g = torch.Generator().manual_seed(window * 10 + sinks)
    q, k, v = (torch.randn(2, 3, 20, 8, generator=g, dtype=F64) for _ in range(3))
    ref = reference(q, k, v, sliding_window_causal_mask(20, window, sinks))
    cache = RollingKVCache(window, sinks)
    for t in range(20):
        cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        keys, values, positions = cache.keys_values()
        assert len(positions) <= window + sinks and cache.k.shape[2] == window
        torch.testing.assert_close(reference(q[:, :, t:t + 1], keys, values), ref[:, :, t:t + 1],
                                   rtol=0, atol=1e-12)


def test_rolling_cache_prefill_in_chunks():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=g, dtype=F64) for _ in range(3))
    cache = RollingKVCache(4, 1)
    cache.append(k[:, :, :7], v[:, :, :7])
    assert cache.positions().tolist() == [0, 3, 4, 5, 6]
    cache.append(k[:, :, 7:], v[:, :, 7:])
    keys, _, positions = cache.keys_values()
    assert positions.tolist() == [0, 8, 9, 10, 11]
    assert torch.equal(keys, k[:, :, positions])
