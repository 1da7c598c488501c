"""Decode-time attention: a key-value cache in fixed-size pages, split-K decoding, and a rolling
cache for sliding-window attention.

When a decoder generates, each step has ONE new query per sequence and all the cached keys and
values of that sequence. Two things then matter more than the arithmetic:

* **where the cache lives.** Reserving a contiguous buffer of the longest possible length per
  request wastes most of it (a request rarely runs to the maximum). PagedAttention (Kwon et al.,
  2023, vLLM) stores the cache in pages of ``page_size`` positions taken from one shared pool;
  a per-sequence *block table* lists which physical page holds its positions
  ``[i * page_size, (i + 1) * page_size)``. :class:`PagedKVCache` and :func:`paged_attention`;
  :func:`cache_waste` counts what each allocation scheme reserves for a stream of requests.
* **parallelism with one query.** A single query row gives a GPU too little work when the loop
  runs over queries (FlashAttention-2's outer loop). FlashDecoding (Dao et al., 2023) splits the
  *keys* into chunks, attends to each chunk independently (in parallel), and merges the partial
  outputs with their log-sum-exps: :func:`split_k_attention` and :func:`merge_partials`. The merge
  is exact, the same rescaling as the online softmax.

:class:`RollingKVCache` keeps only the last ``window`` positions (Mistral's rolling buffer), plus
optionally the first ``num_sinks`` (StreamingLLM's attention sinks, Xiao et al., 2023); decoding
with it equals attention under :func:`lecture_pkg.masks.sliding_window_causal_mask`.

Shapes: cache tensors are (heads, t, head_dim) per sequence; a decode query is
(batch, heads, head_dim), one row per sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lecture_pkg.attention import _check_qkv, _default_scale
from lecture_pkg.checks import check_float_tensor, check_int

__all__ = ["CacheWaste", "PagedKVCache", "RollingKVCache", "cache_waste", "merge_partials",
           "paged_attention", "split_k_attention"]


def _partial(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Attention of q (..., t_q, d) over one chunk of keys: normalised output (..., t_q, d_v) and
    log-sum-exp of the scaled scores (..., t_q); an empty chunk gives zeros and -inf."""
    if k.shape[-2] == 0:
        return q.new_zeros(*q.shape[:-1], v.shape[-1]), q.new_full(q.shape[:-1], -math.inf)
    scores = (q * scale) @ k.transpose(-2, -1)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]) @ v, lse


# ---------------------------------------------------------------------------------------------
# Split-K (FlashDecoding): attend to chunks of keys independently, merge exactly
# ---------------------------------------------------------------------------------------------

def merge_partials(outs: Sequence[Tensor], lses: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Merge attention outputs computed over disjoint chunks of the keys.

    Chunk s gave o_s = sum_{j in s} softmax_s(x)_j v_j and L_s = log sum_{j in s} exp(x_j). Over
    all keys L = log sum_s exp(L_s) and o = sum_s exp(L_s - L) o_s: each chunk is weighted by
    its share of the softmax's denominator. outs: (..., t_q, d_v) each; lses: (..., t_q) each.
    Returns (out, lse); a query whose chunks are all empty gets zeros.
    """
    if len(outs) == 0 or len(outs) != len(lses):
        raise ValueError(f"outs and lses must be non-empty and of equal length, got {len(outs)} "
                         f"and {len(lses)}")
    lse_all = torch.stack(list(lses))  # (splits, ..., t_q)
    lse = torch.logsumexp(lse_all, dim=0)
    weights = torch.exp(lse_all - lse).nan_to_num(0.0)  # -inf - -inf: a query with no keys
    out = (weights[..., None] * torch.stack(list(outs))).sum(0)
    return out, lse


def split_k_attention(q: Tensor, k: Tensor, v: Tensor, num_splits: int,
                      scale: float | None = None) -> tuple[Tensor, Tensor]:
    """softmax(q k^T * scale) v computed as FlashDecoding does: the t_k keys are cut into
    ``num_splits`` contiguous chunks (of ceil(t_k / num_splits) keys), each chunk's partial
    attention is computed independently (on a GPU, by its own thread block), and
    :func:`merge_partials` combines them. Exactly equal to full attention.

    q: (..., t_q, d_k), k: (..., t_k, d_k), v: (..., t_k, d_v), batch dims identical.
    Returns (out: (..., t_q, d_v), lse: (..., t_q)).
    """
    _check_qkv(q, k, v)
    check_int("num_splits", num_splits, 1)
    scale = _default_scale(q, scale)
    chunk = max(1, math.ceil(k.shape[-2] / num_splits))
    parts = [_partial(q, k[..., s:s + chunk, :], v[..., s:s + chunk, :], scale)
             for s in range(0, num_splits * chunk, chunk)]
    return merge_partials([o for o, _ in parts], [lse for _, lse in parts])


# ---------------------------------------------------------------------------------------------
# PagedAttention: one pool of pages, a block table per sequence
# ---------------------------------------------------------------------------------------------

class PagedKVCache:
    """A key-value cache for many sequences in one pool of fixed-size pages (PagedAttention).

    The pool holds ``num_tokens`` positions as ``num_tokens // page_size`` pages of
    (heads, page_size, head_dim) keys and values. A sequence takes a free page when its last page
    is full, so at most ``page_size - 1`` positions per sequence are reserved and unused; pages of
    one sequence need not be adjacent. ``block_table(seq)`` lists its pages in order.
    """

    def __init__(self, num_tokens: int, page_size: int, heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
                 ) -> None:
        check_int("num_tokens", num_tokens, 1)
        check_int("page_size", page_size, 1)
        check_int("heads", heads, 1)
        check_int("head_dim", head_dim, 1)
        if num_tokens % page_size:
            raise ValueError(f"page_size={page_size} does not divide num_tokens={num_tokens}: the "
                             f"pool must hold a whole number of pages")
        self.page_size, self.heads, self.head_dim = page_size, heads, head_dim
        num_pages = num_tokens // page_size
        shape = (num_pages, heads, page_size, head_dim)
        self.k_pages = torch.zeros(shape, dtype=dtype, device=device)
        self.v_pages = torch.zeros(shape, dtype=dtype, device=device)
        self.free_pages: list[int] = list(range(num_pages))
        self.tables: dict[object, list[int]] = {}
        self.lengths: dict[object, int] = {}

    @property
    def num_pages(self) -> int:
        return self.k_pages.shape[0]

    def block_table(self, seq: object) -> Tensor:
        """(pages,) physical page of each of ``seq``'s logical pages, in order."""
        self._check_seq(seq)
        return torch.tensor(self.tables[seq], dtype=torch.long, device=self.k_pages.device)

    def _check_seq(self, seq: object) -> None:
        if seq not in self.tables:
            raise KeyError(f"sequence {seq!r} is not in the cache (append to it first)")

    def append(self, seq: object, k: Tensor, v: Tensor) -> None:
        """Store the keys and values of ``seq``'s next positions; k, v: (heads, t_new, head_dim)."""
        want = (self.heads, self.head_dim)
        for name, x in (("k", k), ("v", v)):
            check_float_tensor(name, x)
            if x.dim() != 3 or (x.shape[0], x.shape[2]) != want:
                raise ValueError(f"{name} must have shape (heads={self.heads}, t_new, "
                                 f"head_dim={self.head_dim}), got {tuple(x.shape)}")
        if k.shape != v.shape:
            raise ValueError(f"k has shape {tuple(k.shape)} but v has {tuple(v.shape)}")
        table = self.tables.setdefault(seq, [])
        length = self.lengths.setdefault(seq, 0)
        new = k.shape[1]
        pages_needed = math.ceil((length + new) / self.page_size) - len(table)
        if pages_needed > len(self.free_pages):
            raise RuntimeError(f"out of pages: sequence {seq!r} needs {pages_needed} more, "
                               f"{len(self.free_pages)} are free")
        table.extend(self.free_pages.pop(0) for _ in range(pages_needed))
        positions = torch.arange(length, length + new)
        pages = torch.tensor(table)[positions // self.page_size]
        slots = positions % self.page_size
        self.k_pages[pages, :, slots] = k.transpose(0, 1).to(self.k_pages.dtype)
        self.v_pages[pages, :, slots] = v.transpose(0, 1).to(self.v_pages.dtype)
        self.lengths[seq] = length + new

    def free(self, seq: object) -> None:
        """Return ``seq``'s pages to the pool (the request finished)."""
        self._check_seq(seq)
        self.free_pages.extend(self.tables.pop(seq))
        del self.lengths[seq]

    def gather(self, seq: object) -> tuple[Tensor, Tensor]:
        """``seq``'s keys and values as contiguous (heads, length, head_dim) tensors, read through
        its block table (what a paged kernel does one page at a time without copying)."""
        table, length = self.block_table(seq), self.lengths[seq]

        def read(pages: Tensor) -> Tensor:
            chosen = pages[table]  # (pages, heads, page_size, head_dim)
            return chosen.transpose(0, 1).reshape(self.heads, -1, self.head_dim)[:, :length]

        return read(self.k_pages), read(self.v_pages)


def paged_attention(q: Tensor, cache: PagedKVCache, seqs: Sequence[object],
                    scale: float | None = None) -> Tensor:
    """One decode step against a paged cache: sequence b's query attends to every cached position
    of ``seqs[b]``, page by page in block-table order; the pages are merged with
    :func:`merge_partials`, as a paged kernel does without ever making the cache contiguous.

    q: (batch, heads, head_dim), batch = len(seqs). Returns (batch, heads, head_dim).
    """
    check_float_tensor("q", q)
    if q.dim() != 3 or q.shape[1:] != (cache.heads, cache.head_dim):
        raise ValueError(f"q must have shape (batch, heads={cache.heads}, head_dim="
                         f"{cache.head_dim}), got {tuple(q.shape)}")
    if len(seqs) != q.shape[0]:
        raise ValueError(f"q has {q.shape[0]} rows but seqs names {len(seqs)} sequences")
    scale = _default_scale(q, scale)
    rows = []
    for b, seq in enumerate(seqs):
        table, length = cache.block_table(seq), cache.lengths[seq]
        query = q[b][:, None, :].to(cache.k_pages.dtype)  # (heads, 1, head_dim)
        outs, lses = [], []
        for i, page in enumerate(table.tolist()):
            used = min(cache.page_size, length - i * cache.page_size)  # the last page may be partial
            o, lse = _partial(query, cache.k_pages[page, :, :used], cache.v_pages[page, :, :used],
                              scale)
            outs.append(o)
            lses.append(lse)
        if not outs:  # a sequence with no cached positions attends to nothing
            rows.append(query.new_zeros(cache.heads, cache.head_dim))
            continue
        rows.append(merge_partials(outs, lses)[0][:, 0])
    return torch.stack(rows).to(q.dtype)


# ---------------------------------------------------------------------------------------------
# What each allocation scheme reserves
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheWaste:
    """Cache positions used by a set of requests and reserved by each allocation scheme."""

    used: int
    contiguous: int  # one buffer of max_len positions per request
    paged: int  # whole pages: ceil(length / page_size) * page_size per request

    @property
    def contiguous_waste(self) -> float:
        """Fraction of the contiguous reservation that holds no key or value."""
        return 1 - self.used / self.contiguous

    @property
    def paged_waste(self) -> float:
        return 1 - self.used / self.paged


def cache_waste(lengths: Sequence[int], max_len: int, page_size: int) -> CacheWaste:
    """Positions used and reserved when each request of final length ``lengths[i]`` (prompt plus
    generated tokens) holds a cache: contiguous allocation reserves ``max_len`` per request (the
    length it might reach, unknown in advance), paging reserves whole pages of what it uses."""
    check_int("max_len", max_len, 1)
    check_int("page_size", page_size, 1)
    if len(lengths) == 0:
        raise ValueError("lengths must name at least one request")
    for length in lengths:
        check_int("each length", length, 1)
        if length > max_len:
            raise ValueError(f"a request of length {length} exceeds max_len={max_len}")
    used = sum(lengths)
    paged = sum(math.ceil(n / page_size) * page_size for n in lengths)
    return CacheWaste(used=used, contiguous=max_len * len(lengths), paged=paged)


# ---------------------------------------------------------------------------------------------
# A rolling cache: sliding-window attention, optionally with attention sinks
# ---------------------------------------------------------------------------------------------

class RollingKVCache:
    """The last ``window`` positions' keys and values in a ring buffer of ``window`` slots
    (Mistral's rolling buffer cache: position p goes to slot p mod window), plus the first
    ``num_sinks`` positions kept for good (StreamingLLM's attention sinks). Memory is
    O(window + num_sinks) however long the sequence grows.

    k, v appended as (batch, heads, t_new, head_dim). ``keys_values()`` returns the cached
    (batch, heads, n, head_dim) keys and values and their absolute positions (n,).
    """

    def __init__(self, window: int, num_sinks: int = 0) -> None:
        check_int("window", window, 1)
        check_int("num_sinks", num_sinks, 0)
        self.window, self.num_sinks = window, num_sinks
        self.k: Tensor | None = None  # (batch, heads, window, head_dim) ring
        self.v: Tensor | None = None
        self.sink_k: Tensor | None = None
        self.sink_v: Tensor | None = None
        self.length = 0  # positions seen so far

    def __len__(self) -> int:
        """Positions held now (at most window + num_sinks)."""
        return len(self.positions())

    def positions(self) -> Tensor:
        """Absolute positions of the cached entries, in the order :meth:`keys_values` returns."""
        sinks = torch.arange(min(self.num_sinks, self.length))
        recent = torch.arange(max(min(self.num_sinks, self.length), self.length - self.window),
                              self.length)
        return torch.cat([sinks, recent])

    def append(self, k: Tensor, v: Tensor) -> None:
        for name, x in (("k", k), ("v", v)):
            check_float_tensor(name, x)
            if x.dim() != 4:
                raise ValueError(f"{name} must have shape (batch, heads, t_new, head_dim), got "
                                 f"{tuple(x.shape)}")
        if k.shape[:-1] != v.shape[:-1]:
            raise ValueError(f"k has shape {tuple(k.shape)} but v has {tuple(v.shape)}")
        if self.k is None:
            b, h, _, _ = k.shape
            self.k = k.new_zeros(b, h, self.window, k.shape[-1])
            self.v = v.new_zeros(b, h, self.window, v.shape[-1])
            self.sink_k = k.new_zeros(b, h, self.num_sinks, k.shape[-1])
            self.sink_v = v.new_zeros(b, h, self.num_sinks, v.shape[-1])
        for i in range(k.shape[2]):
            p = self.length
            if p < self.num_sinks:
                self.sink_k[:, :, p], self.sink_v[:, :, p] = k[:, :, i], v[:, :, i]
            self.k[:, :, p % self.window] = k[:, :, i]
            self.v[:, :, p % self.window] = v[:, :, i]
            self.length += 1

    def keys_values(self) -> tuple[Tensor, Tensor, Tensor]:
        if self.k is None:
            raise RuntimeError("the cache is empty: append first")
        positions = self.positions()
        n_sinks = min(self.num_sinks, self.length)
        recent = positions[n_sinks:] % self.window
        k = torch.cat([self.sink_k[:, :, :n_sinks], self.k[:, :, recent]], dim=2)
        v = torch.cat([self.sink_v[:, :, :n_sinks], self.v[:, :, recent]], dim=2)
        return k, v, positions
