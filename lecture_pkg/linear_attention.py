"""Linear attention (Katharopoulos et al., 2020): replace softmax's exp(q.k) by a product of
feature maps phi(q).phi(k), and attention becomes an RNN.

With sim(q, k) = phi(q)^T phi(k), causal attention's output at step t is

    o_t = phi(q_t)^T S_t / (phi(q_t)^T z_t),  S_t = sum_{j<=t} phi(k_j) v_j^T,  z_t = sum_{j<=t} phi(k_j)

so a d_k x d_v state S (and a d_k vector z) summarises the whole past: each step costs O(d_k d_v)
whatever t is, and the cache no longer grows. Three ways to compute the same numbers:

* :func:`linear_attention` (``"parallel"``): the attention form, (phi(Q) phi(K)^T masked causally)
  V, normalised by the row sums: O(n^2 d), like softmax attention, but parallel over positions;
* :func:`linear_attention_recurrent`: the RNN, one position at a time, O(n d^2);
* :func:`linear_attention` (``"chunked"``): both at once, as fast kernels do (FLA, Mamba-2's SSD):
  within a chunk of C positions the parallel form, between chunks the state, O(n C d + n d^2).

phi defaults to elu(x) + 1 (positive, so the normaliser is positive). The price: the state has
d_k d_v numbers however many tokens it has seen, so it cannot hold an arbitrary number of
key-value pairs exactly; softmax attention, with its growing cache, can. Gated (GLA, Mamba-2)
and delta-rule (DeltaNet, Gated DeltaNet) successors change how S is updated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.checks import check_float_tensor, check_int

__all__ = ["LinearAttention", "elu_feature_map", "linear_attention", "linear_attention_recurrent"]

FeatureMap = Callable[[Tensor], Tensor]


def elu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1 > 0, Katharopoulos et al.'s feature map."""
    return F.elu(x) + 1


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, x)
        if x.dim() < 2:
            raise ValueError(f"{name} must have shape (..., n, features), got {tuple(x.shape)}")
    if k.shape[:-1] != q.shape[:-1] or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"q, k and v must share (..., n): got {tuple(q.shape[:-1])}, "
                         f"{tuple(k.shape[:-1])} and {tuple(v.shape[:-1])} (self-attention)")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k has last dim {k.shape[-1]} but q has {q.shape[-1]} (d_k must match)")


def linear_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = True,
                     feature_map: FeatureMap = elu_feature_map,
                     method: Literal["parallel", "chunked"] = "parallel", chunk_size: int = 64,
                     eps: float = 1e-6) -> Tensor:
    """Linear attention, phi(q_i).phi(k_j) as the (unnormalised) weight of key j for query i.

    q: (..., n, d_k), k: (..., n, d_k), v: (..., n, d_v). ``causal``: key j <= i only.
    ``method="parallel"``: the n x n weight matrix, normalised per row (any ``causal``);
    ``method="chunked"`` (causal only): chunks of ``chunk_size`` positions, a d_k x d_v state
    carried between them, never an n x n matrix. Returns (..., n, d_v).
    """
    _check_qkv(q, k, v)
    if method not in ("parallel", "chunked"):
        raise ValueError(f"method must be 'parallel' or 'chunked', got {method!r}")
    phi_q, phi_k = feature_map(q), feature_map(k)
    if method == "chunked":
        if not causal:
            raise ValueError("method='chunked' computes the causal form: pass causal=True")
        check_int("chunk_size", chunk_size, 1)
        return _chunked(phi_q, phi_k, v, chunk_size, eps)
    weights = phi_q @ phi_k.transpose(-2, -1)  # (..., n, n), non-negative
    if causal:
        n = q.shape[-2]
        weights = weights * torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    return (weights @ v) / (weights.sum(-1, keepdim=True) + eps)


def _chunked(phi_q: Tensor, phi_k: Tensor, v: Tensor, chunk: int, eps: float) -> Tensor:
    state = phi_k.new_zeros(*phi_k.shape[:-2], phi_k.shape[-1], v.shape[-1])  # S: (..., d_k, d_v)
    norm = phi_k.new_zeros(*phi_k.shape[:-2], phi_k.shape[-1])  # z: (..., d_k)
    outs = []
    for start in range(0, phi_q.shape[-2], chunk):
        qc, kc, vc = (x[..., start:start + chunk, :] for x in (phi_q, phi_k, v))
        c = qc.shape[-2]
        intra = (qc @ kc.transpose(-2, -1)) * torch.ones(c, c, dtype=torch.bool,
                                                         device=qc.device).tril()
        numerator = qc @ state + intra @ vc  # the past chunks through S, this chunk directly
        denominator = qc @ norm[..., None] + intra.sum(-1, keepdim=True)
        outs.append(numerator / (denominator + eps))
        state = state + kc.transpose(-2, -1) @ vc
        norm = norm + kc.sum(-2)
    return torch.cat(outs, dim=-2) if outs else v.new_zeros(v.shape)


def linear_attention_recurrent(q: Tensor, k: Tensor, v: Tensor,
                               feature_map: FeatureMap = elu_feature_map,
                               eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Causal linear attention as an RNN: for t = 1..n, S += phi(k_t) v_t^T, z += phi(k_t),
    o_t = phi(q_t)^T S / (phi(q_t)^T z). Shapes as :func:`linear_attention`.
    Returns (out: (..., n, d_v), final state S: (..., d_k, d_v))."""
    _check_qkv(q, k, v)
    phi_q, phi_k = feature_map(q), feature_map(k)
    state = phi_k.new_zeros(*phi_k.shape[:-2], phi_k.shape[-1], v.shape[-1])
    norm = phi_k.new_zeros(*phi_k.shape[:-2], phi_k.shape[-1])
    outs = []
    for t in range(q.shape[-2]):
        state = state + phi_k[..., t, :, None] * v[..., t, None, :]  # outer product
        norm = norm + phi_k[..., t, :]
        numerator = (phi_q[..., t, None, :] @ state).squeeze(-2)
        denominator = (phi_q[..., t, :] * norm).sum(-1, keepdim=True)
        outs.append(numerator / (denominator + eps))
    out = torch.stack(outs, dim=-2) if outs else v.new_zeros(v.shape)
    return out, state


class LinearAttention(nn.Module):
    """Multi-head causal linear attention, a drop-in for a causal self-attention layer:
    x (batch, n, embed_dim) -> (batch, n, embed_dim). ``method`` as :func:`linear_attention`."""

    def __init__(self, embed_dim: int, num_heads: int, method: Literal["parallel", "chunked"]
                 = "chunked", chunk_size: int = 64) -> None:
        super().__init__()
        check_int("embed_dim", embed_dim, 1)
        check_int("num_heads", num_heads, 1)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.num_heads, self.method, self.chunk_size = num_heads, method, chunk_size
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        check_float_tensor("x", x)
        if x.dim() != 3:
            raise ValueError(f"x must have shape (batch, n, embed_dim), got {tuple(x.shape)}")
        b, n, e = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, e // self.num_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = linear_attention(q, k, v, causal=True, method=self.method,
                               chunk_size=self.chunk_size)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, e))
