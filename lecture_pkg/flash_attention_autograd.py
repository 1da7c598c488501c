"""FlashAttention-2 for training, in PyTorch: a ``torch.autograd.Function`` whose forward keeps
only Q, K, V, the output O and one log-sum-exp per query, and whose backward recomputes each tile
of probabilities from them (Dao, 2023, Algorithms 1 and 2).

Autograd through a tiled loop (``lecture_pkg.attention.flash_attention`` with
``backend="torch"``) saves every tile it computed, so training memory is O(t_q t_k) again. Here
the forward saves O(t (d_k + d_v)) numbers and the backward rebuilds what it needs:

    L_i = m_i + log l_i                      (forward: the row's log-sum-exp)
    P_ij = exp(s * q_i.k_j - L_i)            (backward: a tile, recomputed exactly)
    D_i = dO_i . O_i                         (= sum_j P_ij dP_ij, one number per query)
    dV_j += P_ij dO_i,   dP_ij = dO_i . v_j,   dS_ij = P_ij (dP_ij - D_i)
    dQ_i += s dS_ij k_j,  dK_j += s dS_ij q_i

The backward's outer loop runs over key blocks (each owns its dK_j, dV_j), the inner over query
blocks, as FA-2's Algorithm 2. This module is the readable reference; ``lecture_pkg.kernels``
holds the Triton kernels that run the same algorithm on a GPU.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lecture_pkg.attention import _check_qkv, _default_scale
from lecture_pkg.checks import check_int

__all__ = ["flash_attention_function"]


def _tile_mask(q_start: int, q_stop: int, k_start: int, k_stop: int, device: torch.device
               ) -> Tensor:
    """(q_stop - q_start, k_stop - k_start) bool: key j <= query i (top-left causal)."""
    return torch.arange(k_start, k_stop, device=device) <= torch.arange(q_start, q_stop,
                                                                        device=device)[:, None]


def _forward(q: Tensor, k: Tensor, v: Tensor, scale: float, is_causal: bool, block: int
             ) -> tuple[Tensor, Tensor]:
    t_q, t_k = q.shape[-2], k.shape[-2]
    out = q.new_zeros(*q.shape[:-1], v.shape[-1])
    lse = q.new_full(q.shape[:-1], -math.inf)
    for qs in range(0, t_q, block):
        qe = min(qs + block, t_q)
        qb = q[..., qs:qe, :] * scale
        m = qb.new_full((*qb.shape[:-1], 1), -math.inf)
        l_sum = qb.new_zeros(*qb.shape[:-1], 1)
        acc = qb.new_zeros(*qb.shape[:-1], v.shape[-1])
        for ks in range(0, min(t_k, qe) if is_causal else t_k, block):
            ke = min(ks + block, t_k)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1)
            if is_causal:
                s = s.masked_fill(~_tile_mask(qs, qe, ks, ke, q.device), -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            rescale = torch.exp(m - m_new)
            l_sum = l_sum * rescale + p.sum(-1, keepdim=True)
            acc = acc * rescale + p @ v[..., ks:ke, :]
            m = m_new
        if t_k > 0:
            out[..., qs:qe, :] = acc / l_sum
            lse[..., qs:qe] = (m + l_sum.log()).squeeze(-1)
    return out, lse


def _backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, d_out: Tensor,
              scale: float, is_causal: bool, block: int) -> tuple[Tensor, Tensor, Tensor]:
    t_q, t_k = q.shape[-2], k.shape[-2]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    delta = (d_out * out).sum(-1, keepdim=True)  # D_i = dO_i . O_i
    for ks in range(0, t_k, block):  # outer loop: key blocks
        ke = min(ks + block, t_k)
        kb, vb = k[..., ks:ke, :], v[..., ks:ke, :]
        for qs in range(0, t_q, block):  # inner loop: query blocks
            qe = min(qs + block, t_q)
            if is_causal and qe - 1 < ks:
                continue  # every query of this block is before every key: nothing to do
            qb, dob = q[..., qs:qe, :], d_out[..., qs:qe, :]
            p = torch.exp((qb @ kb.transpose(-2, -1)) * scale - lse[..., qs:qe, None])
            if is_causal:
                p = p.masked_fill(~_tile_mask(qs, qe, ks, ke, q.device), 0.0)
            dv[..., ks:ke, :] += p.transpose(-2, -1) @ dob
            dp = dob @ vb.transpose(-2, -1)
            ds = p * (dp - delta[..., qs:qe, :])
            dq[..., qs:qe, :] += scale * (ds @ kb)
            dk[..., ks:ke, :] += scale * (ds.transpose(-2, -1) @ qb)
    return dq, dk, dv


class _FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float,
                block: int) -> Tensor:
        compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        qc, kc, vc = q.to(compute), k.to(compute), v.to(compute)
        out, lse = _forward(qc, kc, vc, scale, is_causal, block)
        ctx.save_for_backward(q, k, v, out.to(q.dtype), lse)  # O(t d) numbers, no tile
        ctx.is_causal, ctx.scale, ctx.block = is_causal, scale, block
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, d_out: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        compute = lse.dtype
        grads = _backward(q.to(compute), k.to(compute), v.to(compute), out.to(compute), lse,
                          d_out.to(compute), ctx.scale, ctx.is_causal, ctx.block)
        dq, dk, dv = (g.to(x.dtype) for g, x in zip(grads, (q, k, v)))
        return dq, dk, dv, None, None, None


def flash_attention_function(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                             scale: float | None = None, block_size: int = 64) -> Tensor:
    """softmax(q k^T * scale) v (top-left causal if ``is_causal``), differentiable with
    FlashAttention-2's memory: autograd keeps q, k, v, the output and a log-sum-exp per query.

    q: (..., t_q, d_k), k: (..., t_k, d_k), v: (..., t_k, d_v), batch dims identical.
    block_size: queries and keys per tile. Returns (..., t_q, d_v) in q's dtype.
    """
    _check_qkv(q, k, v)
    check_int("block_size", block_size, 1)
    scale = _default_scale(q, scale)
    return _FlashAttentionFunction.apply(q, k, v, bool(is_causal), float(scale), block_size)
