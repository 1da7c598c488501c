"""Attention: scoring functions, normalisers, scaled dot-product and multi-head attention, and
FlashAttention's exact, memory-efficient evaluation.

Every attention layer in this book is

    attention(Q, K, V) = normalise(score(Q, K)) V,

a soft dictionary lookup: each query is scored against every key, the scores become weights
(non-negative, summing to one per query), and the output is the weighted mean of the values.
The module follows that sentence from top to bottom:

1. scoring functions ``score(q, k) -> (..., t_q, t_k)``: dot, scaled dot, cosine, Gaussian, and
   the learned additive (Bahdanau) and bilinear (Luong's "general") scores;
2. normalisers: :func:`softmax` and :func:`sparsemax` (which can give exact zeros);
3. :func:`attention` (any score, any normaliser) and :func:`scaled_dot_product_attention`
   (the Transformer's, with torch's masks, dropout, fp16/bf16 safety and the weights);
4. :class:`MultiHeadAttention`, interchangeable with ``torch.nn.MultiheadAttention``;
5. :func:`local_attention` (each query sees a window of keys: O(r n d) instead of O(n^2 d)),
   :func:`linformer_attention` / :class:`LinformerSelfAttention` (keys and values projected
   along the sequence to k << n rows: O(n k d), an approximation) and :func:`flash_attention`
   (all keys, exactly, one tile of scores at a time, never the whole t_q x t_k matrix).

Conventions: batch first, shapes written ``q: (..., t_q, d_k)`` where ``...`` are batch dims
(e.g. batch, heads) that q, k and v must share exactly (no silent broadcasting); boolean masks use
True = "may attend"; blocked scores are set to ``torch.finfo(dtype).min`` and a query that may
attend to nothing gets zero weights and a zero output. fp16/bf16 inputs are computed in float32
and returned in their own dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.checks import check_bool_mask, check_float_tensor, check_int
from lecture_pkg.masks import causal_mask

__all__ = [
    "AdditiveScore",
    "BilinearScore",
    "KVCache",
    "LinformerSelfAttention",
    "MultiHeadAttention",
    "attention",
    "cosine_score",
    "dot_score",
    "flash_attention",
    "gaussian_score",
    "grouped_query_attention",
    "linformer_attention",
    "linformer_mixing",
    "local_attention",
    "scaled_dot_product_attention",
    "scaled_dot_score",
    "softmax",
    "sparsemax",
]

ScoreFn = Callable[[Tensor, Tensor], Tensor]
Normaliser = Callable[[Tensor], Tensor]


# --------------------------------------------------------------------------------------------
# Input checks shared by every public function
# --------------------------------------------------------------------------------------------

def _check_tensor(x: object, name: str, min_dim: int = 2) -> None:
    check_float_tensor(name, x)
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dims (..., length, features), "
                         f"got shape {tuple(x.shape)}")


def _check_same_kind(x: Tensor, name: str, ref: Tensor, ref_name: str) -> None:
    if x.dtype != ref.dtype or x.device != ref.device:
        raise TypeError(f"{name} is {x.dtype} on {x.device} but {ref_name} is {ref.dtype} on "
                        f"{ref.device}; they must share dtype and device")
    if x.shape[:-2] != ref.shape[:-2]:
        raise ValueError(f"{name} has batch dims {tuple(x.shape[:-2])} but {ref_name} has "
                         f"{tuple(ref.shape[:-2])} (the leading dims must match; no broadcasting)")


def _check_qk(q: Tensor, k: Tensor, same_features: bool = True) -> None:
    """q: (..., t_q, d_k) and k: (..., t_k, d_k) with identical batch dims ``...``."""
    _check_tensor(q, "q")
    _check_tensor(k, "k")
    _check_same_kind(k, "k", q, "q")
    if same_features and k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k has last dim {k.shape[-1]} but q has {q.shape[-1]} (d_k must match)")


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """q: (..., t_q, d_k), k: (..., t_k, d_k), v: (..., t_k, d_v)."""
    _check_qk(q, k)
    _check_tensor(v, "v")
    _check_same_kind(v, "v", q, "q")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v has {v.shape[-2]} positions but k has {k.shape[-2]} "
                         f"(one value per key: t_k must match)")


def _check_scale(scale: object) -> float | None:
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    return float(scale)


def _default_scale(q: Tensor, scale: float | None) -> float:
    scale = _check_scale(scale)
    if scale is None:
        if q.shape[-1] == 0:
            raise ValueError("q has last dim 0: the default scale 1/sqrt(d_k) needs d_k >= 1")
        return 1.0 / math.sqrt(q.shape[-1])
    return scale


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16 and bf16 are computed in float32 (sums of many small weights lose too much in 8 or
    11 mantissa bits); float32 and float64 are computed as they are."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# --------------------------------------------------------------------------------------------
# 1. Scoring functions: (..., t_q, d) x (..., t_k, d) -> (..., t_q, t_k)
# --------------------------------------------------------------------------------------------

def dot_score(q: Tensor, k: Tensor) -> Tensor:
    """q . k for every pair. q: (..., t_q, d), k: (..., t_k, d) -> (..., t_q, t_k)."""
    _check_qk(q, k)
    return q @ k.transpose(-2, -1)


def scaled_dot_score(q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    """q . k * scale, by default scale = 1/sqrt(d) (Vaswani et al.): for independent unit-variance
    entries q . k has variance d, and the scale brings it back to 1.

    q: (..., t_q, d), k: (..., t_k, d) -> (..., t_q, t_k)."""
    _check_qk(q, k)
    return (q * _default_scale(q, scale)) @ k.transpose(-2, -1)


def cosine_score(q: Tensor, k: Tensor, eps: float = 1e-8) -> Tensor:
    """Cosine similarity q . k / (|q| |k|), in [-1, 1]; a zero vector scores 0 against all.

    q: (..., t_q, d), k: (..., t_k, d) -> (..., t_q, t_k)."""
    _check_qk(q, k)
    unit_q = q / q.norm(dim=-1, keepdim=True).clamp_min(eps)
    unit_k = k / k.norm(dim=-1, keepdim=True).clamp_min(eps)
    return unit_q @ unit_k.transpose(-2, -1)


def gaussian_score(q: Tensor, k: Tensor, sigma: float = 1.0) -> Tensor:
    """-|q - k|^2 / (2 sigma^2): the log of a Gaussian kernel, so softmax of it is Nadaraya-Watson
    regression with bandwidth sigma (the slides write sigma^2 for 2 sigma^2; same family).

    q: (..., t_q, d), k: (..., t_k, d) -> (..., t_q, t_k)."""
    _check_qk(q, k)
    if not sigma > 0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    # The explicit difference (not |q|^2 + |k|^2 - 2 q.k) is exact when q = k; it costs
    # t_q * t_k * d memory, fine for the sizes it is taught with.
    squared_distance = (q.unsqueeze(-2) - k.unsqueeze(-3)).pow(2).sum(-1)
    return -squared_distance / (2 * sigma**2)


class AdditiveScore(nn.Module):
    """Bahdanau's additive score v^T tanh(W_q q + W_k k + b), a one-hidden-layer MLP on each pair.

    forward(q, k): q: (..., t_q, d_q), k: (..., t_k, d_k) -> (..., t_q, t_k); d_q and d_k may
    differ. Memory is t_q * t_k * hidden, which is why dot products replaced it at scale.
    """

    def __init__(self, d_q: int, d_k: int, hidden: int, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.d_q, self.d_k = d_q, d_k
        self.query_proj = nn.Linear(d_q, hidden, bias=False, device=device, dtype=dtype)
        self.key_proj = nn.Linear(d_k, hidden, bias=True, device=device, dtype=dtype)  # W_k, b
        self.v = nn.Linear(hidden, 1, bias=False, device=device, dtype=dtype)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        _check_qk(q, k, same_features=False)
        if q.shape[-1] != self.d_q or k.shape[-1] != self.d_k:
            raise ValueError(f"expected q (..., t_q, {self.d_q}) and k (..., t_k, {self.d_k}), "
                             f"got {tuple(q.shape)} and {tuple(k.shape)}")
        # (..., t_q, 1, hidden) + (..., 1, t_k, hidden): every query meets every key.
        hidden = torch.tanh(self.query_proj(q).unsqueeze(-2) + self.key_proj(k).unsqueeze(-3))
        return self.v(hidden).squeeze(-1)

    def extra_repr(self) -> str:
        return f"d_q={self.d_q}, d_k={self.d_k}, hidden={self.v.in_features}"


class BilinearScore(nn.Module):
    """Luong's "general" score q W k^T with a learned (d_q, d_k) matrix W; W = I gives dot_score.

    forward(q, k): q: (..., t_q, d_q), k: (..., t_k, d_k) -> (..., t_q, t_k).
    """

    def __init__(self, d_q: int, d_k: int, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_q, d_k, device=device, dtype=dtype))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        _check_qk(q, k, same_features=False)
        d_q, d_k = self.weight.shape
        if q.shape[-1] != d_q or k.shape[-1] != d_k:
            raise ValueError(f"expected q (..., t_q, {d_q}) and k (..., t_k, {d_k}), "
                             f"got {tuple(q.shape)} and {tuple(k.shape)}")
        return (q @ self.weight) @ k.transpose(-2, -1)

    def extra_repr(self) -> str:
        return f"d_q={self.weight.shape[0]}, d_k={self.weight.shape[1]}"


# --------------------------------------------------------------------------------------------
# 2. Normalisers: scores -> weights that are >= 0 and sum to 1 along `dim`
# --------------------------------------------------------------------------------------------

def softmax(scores: Tensor, dim: int = -1) -> Tensor:
    """exp(s_j) / sum_i exp(s_i), computed as exp(s_j - max s) / sum_i exp(s_i - max s): the same
    value, but no exponent exceeds 0, so nothing overflows. Equal to ``torch.softmax``."""
    shifted = scores - scores.amax(dim, keepdim=True)
    exp = shifted.exp()
    return exp / exp.sum(dim, keepdim=True)


class _Sparsemax(torch.autograd.Function):
    """sparsemax(z) = argmin_{p in simplex} |p - z|^2 (Martins & Astudillo, 2016), on the last dim.

    Forward: sort z descending; the support is the largest k with 1 + k z_(k) > sum_{j<=k} z_(j);
    the threshold is tau = (sum_{j<=k} z_(j) - 1) / k and p = max(z - tau, 0).
    Backward: on the support S the Jacobian is I - 1 1^T / |S|, zero elsewhere, so
    grad_z = [p > 0] * (g - mean_{j in S} g_j).
    """

    @staticmethod
    def forward(ctx, z: Tensor) -> Tensor:  # type: ignore[override]
        z_sorted = z.sort(dim=-1, descending=True).values
        cumulative = z_sorted.cumsum(-1)
        ranks = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
        in_support = 1 + ranks * z_sorted > cumulative
        support_size = in_support.sum(-1, keepdim=True).clamp_min(1)  # k >= 1 for finite z
        tau = (cumulative.gather(-1, support_size - 1) - 1) / support_size.to(z.dtype)
        p = (z - tau).clamp_min(0)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (p,) = ctx.saved_tensors
        support = p > 0
        mean_on_support = (grad * support).sum(-1, keepdim=True) / support.sum(-1, keepdim=True)
        return torch.where(support, grad - mean_on_support, torch.zeros_like(grad))


def sparsemax(scores: Tensor, dim: int = -1) -> Tensor:
    """The Euclidean projection of the scores onto the probability simplex (Martins & Astudillo,
    2016): like softmax, weights are >= 0 and sum to 1, but low scores get exactly 0. Piecewise
    linear, with the exact gradient in backward. Any shape; normalises along ``dim``."""
    if not isinstance(scores, Tensor) or not scores.is_floating_point():
        got = scores.dtype if isinstance(scores, Tensor) else type(scores).__name__
        raise TypeError(f"scores must be a floating-point torch.Tensor, got {got}")
    z = scores.movedim(dim, -1)
    p = _Sparsemax.apply(z.to(_compute_dtype(z.dtype)))
    return p.to(scores.dtype).movedim(-1, dim)


# --------------------------------------------------------------------------------------------
# 3. Attention = normalise(score(q, k)) v
# --------------------------------------------------------------------------------------------

def _blocked_to_zero(weights: Tensor, allowed: Tensor | None) -> Tensor:
    """Zero the weights of queries that may attend to nothing (else softmax would spread them
    uniformly over blocked keys)."""
    if allowed is None:
        return weights
    return weights * allowed.any(-1, keepdim=True)


def attention(q: Tensor, k: Tensor, v: Tensor, score: ScoreFn = scaled_dot_score,
              normalise: Normaliser = softmax, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The general form normalise(score(q, k)) v, with any scoring function and normaliser.

    q: (..., t_q, d_q), k: (..., t_k, d_k), v: (..., t_k, d_v); ``score(q, k)`` must return
    (..., t_q, t_k) (e.g. :func:`gaussian_score` or an :class:`AdditiveScore`), ``normalise``
    maps scores to weights along the last dim (:func:`softmax`, :func:`sparsemax`).
    mask: optional bool, broadcastable to (..., t_q, t_k), True = may attend.

    Returns (out, weights): out (..., t_q, d_v), weights (..., t_q, t_k).
    """
    _check_qk(q, k, same_features=False)
    _check_tensor(v, "v")
    _check_same_kind(v, "v", k, "k")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v has {v.shape[-2]} positions but k has {k.shape[-2]} (t_k must match)")
    scores = score(q, k)
    expected = (*q.shape[:-1], k.shape[-2])
    if tuple(scores.shape) != expected:
        raise ValueError(f"score(q, k) returned shape {tuple(scores.shape)}, expected "
                         f"(..., t_q, t_k) = {expected}")
    allowed = _bool_mask(mask, "mask", expected, q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = _blocked_to_zero(normalise(scores), allowed)
    return weights @ v, weights


def _bool_mask(mask: Tensor | None, name: str, scores_shape: tuple[int, ...],
               device: torch.device) -> Tensor | None:
    if mask is None:
        return None
    check_bool_mask(name, mask)
    _check_broadcast(mask, name, scores_shape, device)
    return mask


def _check_broadcast(mask: Tensor, name: str, scores_shape: tuple[int, ...],
                     device: torch.device) -> None:
    """A mask may broadcast *to* the scores' shape but must never enlarge it."""
    try:
        ok = torch.broadcast_shapes(mask.shape, scores_shape) == torch.Size(scores_shape)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, which does not broadcast to the "
                         f"scores' shape (..., t_q, t_k) = {scores_shape}")
    if mask.device != device:
        raise ValueError(f"{name} is on {mask.device} but q is on {device}")


def _split_mask(attn_mask: Tensor | None, is_causal: bool, q: Tensor,
                t_k: int) -> tuple[Tensor | None, Tensor | None]:
    """Turn SDPA's mask arguments into (additive bias or None, allowed bool mask or None).

    A float mask is added to the scores; its entries <= finfo(dtype).min (including -inf) count as
    blocked, so that a row blocked everywhere gives zeros instead of uniform weights or NaN.
    """
    scores_shape = (*q.shape[:-1], t_k)
    bias, allowed = None, None
    if attn_mask is not None:
        if not isinstance(attn_mask, Tensor):
            raise TypeError(f"attn_mask must be a torch.Tensor, got {type(attn_mask).__name__}")
        _check_broadcast(attn_mask, "attn_mask", scores_shape, q.device)
        if attn_mask.dtype == torch.bool:
            allowed = attn_mask
        elif attn_mask.is_floating_point():
            # A float32 bias meets bf16 queries under autocast: add it in q's dtype.
            attn_mask = attn_mask.to(q.dtype)
            blocked = attn_mask <= torch.finfo(q.dtype).min
            allowed = ~blocked
            bias = attn_mask.masked_fill(blocked, 0)
        else:
            raise TypeError(f"attn_mask must be bool (True = may attend) or floating (added to "
                            f"the scores), got {attn_mask.dtype}")
    if is_causal:
        causal = causal_mask(q.shape[-2], t_k, device=q.device)
        allowed = causal if allowed is None else allowed & causal
    return bias, allowed


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    *,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T * scale + mask) v, as ``torch.nn.functional.scaled_dot_product_attention``
    computes it, plus the attention weights.

    Args:
        q: (..., t_q, d_k) queries; k: (..., t_k, d_k) keys; v: (..., t_k, d_v) values. The
            batch dims ``...`` (e.g. batch, heads) must be identical; t_q may differ from t_k and
            d_v from d_k.
        attn_mask: optional, broadcastable to (..., t_q, t_k). Bool: True = may attend. Float (cast
            to q's dtype, so a float32 bias works under autocast): added to the scores; entries
            <= ``torch.finfo(dtype).min`` (or -inf) block.
        is_causal: query i may attend to keys j <= i (top-left aligned, as torch's is_causal).
            Unlike torch, it may be combined with attn_mask (both must allow a position).
        scale: multiplies q k^T; default 1/sqrt(d_k).
        dropout_p: probability of zeroing each weight (the rest are scaled by 1/(1 - p)); applied
            whenever > 0, as in torch: pass 0.0 at evaluation time.
        generator: the random generator for dropout, on q's device; None uses torch's global
            generator, so results are reproducible after ``torch.manual_seed``.

    Returns:
        out: (..., t_q, d_v), and weights: (..., t_q, t_k), the weights actually applied (after
        dropout), so ``out == weights @ v``. A query that may attend to no key gets zero weights
        and a zero output (torch's SDPA also returns zeros there). fp16/bf16 inputs are computed in
        float32 and both results are returned in the inputs' dtype; masked scores are set to
        ``torch.finfo(float32).min``, never a constant such as −10⁹ (which overflows fp16 to −inf).
    """
    _check_qkv(q, k, v)
    scale = _default_scale(q, scale)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    bias, allowed = _split_mask(attn_mask, is_causal, q, k.shape[-2])

    compute = _compute_dtype(q.dtype)
    # Autocast would run the matmuls below in half precision again: the dtypes here are chosen.
    with torch.autocast(q.device.type, enabled=False):
        scores = (q.to(compute) * scale) @ k.to(compute).transpose(-2, -1)  # (..., t_q, t_k)
        if bias is not None:
            scores = scores + bias.to(compute)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(compute).min)
        # torch.softmax is :func:`softmax` (max subtracted first) fused into one pass over memory.
        weights = _blocked_to_zero(torch.softmax(scores, dim=-1), allowed)
        if dropout_p > 0:
            keep = torch.rand(weights.shape, generator=generator, device=weights.device) >= dropout_p
            weights = weights * keep / (1 - dropout_p)
        out = weights @ v.to(compute)
    return out.to(q.dtype), weights.to(q.dtype)


# --------------------------------------------------------------------------------------------
# 4. Multi-head attention
# --------------------------------------------------------------------------------------------

class KVCache:
    """The keys and values one attention layer has computed so far, for incremental decoding.

    Self-attention appends the new positions' keys and values at every step, so step t projects
    one token instead of t (``static=False``). Cross-attention attends to a fixed memory, so its
    keys and values are computed at the first step and reused (``static=True``).

    k, v: (batch, heads, t, head_dim), or None before the first step.
    """

    def __init__(self, static: bool = False) -> None:
        self.static = static
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new positions' k, v (batch, heads, t_new, head_dim); return all so far."""
        if self.k is None or self.v is None:
            self.k, self.v = k, v
        else:
            self.k, self.v = torch.cat([self.k, k], dim=-2), torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search: each surviving beam continues its parent)."""
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)

    def __repr__(self) -> str:
        return f"KVCache(static={self.static}, length={len(self)})"


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al., 2017): project, split into heads, attend in each head,
    concatenate, project with W_O. Batch first; self-attention is ``mha(x, x, x)``,
    cross-attention ``mha(y, x, x)``.

    forward(query, key, value, attn_mask=None, key_padding_mask=None, is_causal=False,
            need_weights=True, cache=None):
        query: (batch, t_q, embed_dim); key: (batch, t_k, kdim); value: (batch, t_k, vdim).
        attn_mask: bool (True = may attend) or float (added to the scores, e.g. a relative
            position bias), broadcastable to (batch, num_heads, t_q, t_k), e.g. (t_q, t_k).
        key_padding_mask: (batch, t_k) bool, True = a real token that may be attended.
        Both follow SDPA's convention. ``torch.nn.MultiheadAttention`` uses the opposite one for
        bool masks (True = blocked / padding): pass ``~mask`` to torch.
        need_weights: True computes attention with the package's own
            :func:`scaled_dot_product_attention` and returns the per-head weights (the teaching
            path, for figures); False calls torch's fused
            ``torch.nn.functional.scaled_dot_product_attention`` (the fast path) and returns
            None for the weights. Both give the same output (tested).
        cache: a :class:`KVCache` for incremental decoding. Self-attention (``static=False``):
            ``query``, ``key``, ``value`` hold only the new positions; their keys and values are
            appended, the queries attend to every cached position, and ``is_causal`` aligns the
            triangle bottom-right (the new queries are the last positions). Cross-attention
            (``static=True``): key/value are projected once and reused afterwards. The
            key_padding_mask then covers every cached key: (batch, len(cache) + t_new).
        Returns (out: (batch, t_q, embed_dim), weights: (batch, num_heads, t_q, t_k) or None).

    scale multiplies q k^T (default 1/sqrt(head_dim); T5 uses 1.0). Dropout on the weights is
    applied in training mode only.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 kdim: int | None = None, vdim: int | None = None, scale: float | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        check_int("embed_dim", embed_dim, minimum=1)
        check_int("num_heads", num_heads, minimum=1)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.scale = _check_scale(scale)
        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)

    def _split_heads(self, x: Tensor) -> Tensor:
        """(batch, t, embed_dim) -> (batch, heads, t, head_dim)."""
        batch, t, _ = x.shape
        return x.view(batch, t, self.num_heads, -1).transpose(1, 2)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        expected = (("query", query, self.embed_dim), ("key", key, self.kdim),
                    ("value", value, self.vdim))
        for name, x, features in expected:
            _check_tensor(x, name, min_dim=3)
            if x.dim() != 3 or x.shape[-1] != features:
                raise ValueError(f"{name} must have shape (batch, length, {features}), "
                                 f"got {tuple(x.shape)}")
            if x.shape[0] != query.shape[0]:
                raise ValueError(f"{name} has batch size {x.shape[0]} but query has {query.shape[0]}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key has {key.shape[1]} positions but value has {value.shape[1]}")

    def _keys_values(self, key: Tensor, value: Tensor,
                     cache: KVCache | None) -> tuple[Tensor, Tensor]:
        """Projected keys and values (batch, heads, t_k, head_dim), through the cache if any."""
        if cache is not None and cache.static and len(cache):
            return cache.k, cache.v  # type: ignore[return-value]
        k, v = self._split_heads(self.k_proj(key)), self._split_heads(self.v_proj(value))
        return (k, v) if cache is None else cache.append(k, v)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                key_padding_mask: Tensor | None = None, is_causal: bool = False,
                need_weights: bool = True,
                cache: KVCache | None = None) -> tuple[Tensor, Tensor | None]:
        self._check_inputs(query, key, value)
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
        batch, t_q, _ = query.shape
        q = self._split_heads(self.q_proj(query))
        k, v = self._keys_values(key, value, cache)
        t_k = k.shape[-2]
        if is_causal and t_q != t_k:  # cached decoding: the new queries are the last positions
            causal = causal_mask(t_q, t_k, device=q.device, align="bottom-right")
            attn_mask = causal if attn_mask is None else _and_masks(attn_mask, causal)
            is_causal = False
        mask = _with_key_padding(attn_mask, key_padding_mask, batch, t_k)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale,
                dropout_p=dropout_p)
        else:
            out, weights = _fused_attention(q, k, v, mask, is_causal, self.scale, dropout_p), None
        out = out.transpose(1, 2).reshape(batch, t_q, self.embed_dim)  # concatenate the heads
        return self.out_proj(out), weights

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of ``module``'s weights, giving equal outputs and per-head weights (call torch's
        module with ``average_attn_weights=False`` and batch-first inputs to compare)."""
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}")
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not supported")
        reference = module.out_proj.weight
        copy = cls(module.embed_dim, module.num_heads, dropout=module.dropout,
                   bias=module.in_proj_bias is not None, kdim=module.kdim, vdim=module.vdim,
                   device=reference.device, dtype=reference.dtype)
        if module.in_proj_weight is not None:  # q, k, v stacked in one (3 E, E) matrix
            weights = module.in_proj_weight.chunk(3)
        else:
            weights = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)
        biases = module.in_proj_bias.chunk(3) if module.in_proj_bias is not None else (None,) * 3
        with torch.no_grad():
            for proj, weight, bias in zip((copy.q_proj, copy.k_proj, copy.v_proj), weights, biases):
                proj.weight.copy_(weight)
                if bias is not None:
                    proj.bias.copy_(bias)
            copy.out_proj.load_state_dict(module.out_proj.state_dict())
        return copy

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, kdim={self.kdim}, "
                f"vdim={self.vdim}, dropout={self.dropout}")


def _with_key_padding(attn_mask: Tensor | None, key_padding_mask: Tensor | None, batch: int,
                      t_k: int) -> Tensor | None:
    """Fold a (batch, t_k) key padding mask (True = real token) into attn_mask."""
    if key_padding_mask is None:
        return attn_mask
    if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
        raise TypeError("key_padding_mask must be a bool tensor (True = real token, may attend)")
    if tuple(key_padding_mask.shape) != (batch, t_k):
        raise ValueError(f"key_padding_mask must have shape (batch, t_k) = {(batch, t_k)}, "
                         f"got {tuple(key_padding_mask.shape)}")
    padding = key_padding_mask[:, None, None, :]  # (batch, 1, 1, t_k): same for all heads, queries
    if attn_mask is None or attn_mask.dtype == torch.bool:
        return padding if attn_mask is None else attn_mask & padding
    return torch.where(padding, attn_mask, torch.finfo(attn_mask.dtype).min)


def _and_masks(attn_mask: Tensor, allowed: Tensor) -> Tensor:
    """Restrict a bool or additive float mask to the positions ``allowed`` (bool) permits."""
    if attn_mask.dtype == torch.bool:
        return attn_mask & allowed
    return attn_mask.masked_fill(~allowed, torch.finfo(attn_mask.dtype).min)


def _fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                     scale: float | None, dropout_p: float) -> Tensor:
    """torch's fused SDPA with this module's mask semantics: a float mask's entries
    <= finfo.min block, and a query that may attend to nothing gets a zero output."""
    # torch refuses an explicit mask together with is_causal: fold the triangle into the mask
    fold_causal = is_causal and mask is not None
    bias, allowed = _split_mask(mask, fold_causal, q, k.shape[-2])
    fused_mask = allowed if bias is None else _and_masks(bias, allowed) if allowed is not None \
        else bias
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=fused_mask, dropout_p=dropout_p,
                                         is_causal=is_causal and not fold_causal, scale=scale)
    if allowed is not None:  # torch gives NaN or a uniform average for an all-blocked row
        out = out.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
    return out


def grouped_query_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                            is_causal: bool = False,
                            scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Grouped-query attention (Ainslie et al., 2023): h query heads share g key-value heads,
    query head i reading key-value head i // (h / g). g = h is multi-head attention, g = 1 is
    multi-query attention (Shazeer, 2019); the key-value cache is h / g times smaller.

    q: (batch, h, t_q, d_k), k: (batch, g, t_k, d_k), v: (batch, g, t_k, d_v), g divides h.
    attn_mask, is_causal, scale: as in :func:`scaled_dot_product_attention`.
    Returns (out: (batch, h, t_q, d_v), weights: (batch, h, t_q, t_k)); out equals torch's
    ``scaled_dot_product_attention(q, k, v, enable_gqa=True)``.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, x)
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, heads, length, features), "
                             f"got {tuple(x.shape)}")
    heads, groups = q.shape[1], k.shape[1]
    if v.shape[1] != groups:
        raise ValueError(f"v has {v.shape[1]} heads but k has {groups} (each key-value head "
                         f"has both)")
    if groups == 0 or heads % groups:
        raise ValueError(f"q has {heads} heads, which is not a multiple of k's {groups} "
                         f"key-value heads")
    # Repeat each key-value head for the h / g query heads that share it.
    share = heads // groups
    return scaled_dot_product_attention(q, k.repeat_interleave(share, dim=1),
                                        v.repeat_interleave(share, dim=1), attn_mask=attn_mask,
                                        is_causal=is_causal, scale=scale)


# --------------------------------------------------------------------------------------------
# 5. Cheaper attention: a local window, or all keys one block at a time
# --------------------------------------------------------------------------------------------

def local_attention(q: Tensor, k: Tensor, v: Tensor, radius: int,
                    scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Restricted self-attention: query i attends to keys i - radius .. i + radius only (the
    window, r = 2 radius + 1 keys, is Vaswani et al.'s neighbourhood size r). Cost O(r n d)
    time and memory instead of O(n^2 d): only each query's window of keys is gathered.

    q: (..., n, d_k), k: (..., n, d_k), v: (..., n, d_v) (self-attention: one length n).
    Returns out: (..., n, d_v) and band weights: (..., n, 2 radius + 1), where
    ``weights[..., i, w]`` belongs to key ``i - radius + w`` (zero outside the sequence).
    """
    _check_qkv(q, k, v)
    n = q.shape[-2]
    if k.shape[-2] != n:
        raise ValueError(f"local_attention is self-attention: q has {n} positions but k has "
                         f"{k.shape[-2]}")
    check_int("radius", radius, 0)
    scale = _default_scale(q, scale)
    compute = _compute_dtype(q.dtype)
    window = 2 * radius + 1

    def windows(x: Tensor) -> Tensor:
        """(..., n, d) -> (..., n, window, d): row i holds positions i - radius .. i + radius."""
        padded = nn.functional.pad(x.to(compute), (0, 0, radius, radius))  # zero rows at both ends
        return padded.unfold(-2, window, 1).transpose(-2, -1)

    scores = ((q.to(compute) * scale).unsqueeze(-2) @ windows(k).transpose(-2, -1)).squeeze(-2)
    position = torch.arange(n, device=q.device)[:, None] + torch.arange(window, device=q.device) - radius
    inside = (position >= 0) & (position < n)  # (n, window): False for the zero padding
    scores = scores.masked_fill(~inside, torch.finfo(compute).min)
    weights = torch.softmax(scores, dim=-1)
    out = (weights.unsqueeze(-2) @ windows(v)).squeeze(-2)
    return out.to(q.dtype), weights.to(q.dtype)


def linformer_attention(q: Tensor, k: Tensor, v: Tensor, e: Tensor, f: Tensor,
                        scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Linformer attention (Wang et al. 2020): softmax(q (E k)^T * scale) (F v). E and F mix
    the n keys and values into proj_len rows along the *sequence*, so the weights are
    (n, proj_len) instead of (n, n): O(n proj_len d) time and memory. It approximates full
    attention (exactly equal when proj_len = n and E = F = I); it cannot be causal, since
    every projected row mixes all positions.

    q: (..., n_q, d_k), k: (..., n, d_k), v: (..., n, d_v); e, f: (proj_len, n), shared by
    the batch dims. Returns out: (..., n_q, d_v) and weights: (..., n_q, proj_len).
    """
    _check_qkv(q, k, v)
    n = k.shape[-2]
    for name, proj in (("e", e), ("f", f)):
        _check_tensor(proj, name)
        if proj.dtype != q.dtype or proj.device != q.device:
            raise TypeError(f"{name} is {proj.dtype} on {proj.device} but q is {q.dtype} on "
                            f"{q.device}; they must share dtype and device")
        if proj.dim() != 2 or proj.shape[1] != n:
            raise ValueError(f"{name} must have shape (proj_len, n) = (proj_len, {n}), "
                             f"got {tuple(proj.shape)}")
    if e.shape != f.shape:
        raise ValueError(f"e and f must have the same shape, got {tuple(e.shape)} and "
                         f"{tuple(f.shape)}")
    compute = _compute_dtype(q.dtype)
    k_low = e.to(compute) @ k.to(compute)  # (..., proj_len, d_k)
    v_low = f.to(compute) @ v.to(compute)  # (..., proj_len, d_v)
    scores = (q.to(compute) @ k_low.transpose(-2, -1)) * _default_scale(q, scale)
    weights = torch.softmax(scores, dim=-1)
    return (weights @ v_low).to(q.dtype), weights.to(q.dtype)


def linformer_mixing(weights: Tensor, f: Tensor) -> Tensor:
    """The matrix that Linformer's output applies to the values: ``out = mixing @ v``, with
    mixing = weights F. Full attention's mixing matrix is its weights (n_q, n); Linformer's is
    a product through proj_len rows, so its rank is at most proj_len, whatever the weights.

    weights: (..., n_q, proj_len) as returned by :func:`linformer_attention`; f: (proj_len, n).
    Returns (..., n_q, n).
    """
    _check_tensor(weights, "weights", min_dim=2)
    _check_tensor(f, "f")
    if f.dim() != 2 or f.shape[0] != weights.shape[-1]:
        raise ValueError(f"f must have shape (proj_len, n) with proj_len = weights' last dim "
                         f"{weights.shape[-1]}, got {tuple(f.shape)}")
    if f.dtype != weights.dtype or f.device != weights.device:
        raise TypeError(f"f is {f.dtype} on {f.device} but weights is {weights.dtype} on "
                        f"{weights.device}; they must share dtype and device")
    return weights @ f


class LinformerSelfAttention(MultiHeadAttention):
    """Multi-head attention with Linformer's projections, a drop-in for
    :class:`MultiHeadAttention`: the projected keys and values of each head are mixed along the
    sequence by E and F, (proj_len, seq_len) parameters shared by all heads (the paper's
    "headwise sharing"; ``share_kv`` uses one matrix for both). Key sequences up to ``seq_len``
    long are accepted; a shorter one uses the first t_k columns of E and F. No attention dropout.

    forward(query, key, value, attn_mask=None, key_padding_mask=None, is_causal=False,
            need_weights=True, cache=None), as :class:`MultiHeadAttention`; self-attention is
        ``layer(x, x, x)``. Returns (out: (batch, t_q, embed_dim),
        weights: (batch, heads, t_q, proj_len) or None). Masks, ``is_causal`` and a cache are
        refused: every projected key mixes all positions, so no key can be hidden from a query.
    """

    def __init__(self, embed_dim: int, num_heads: int, seq_len: int, proj_len: int,
                 share_kv: bool = False, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(embed_dim, num_heads, bias=bias, device=device, dtype=dtype)
        check_int("seq_len", seq_len, minimum=1)
        check_int("proj_len", proj_len, minimum=1)
        self.seq_len, self.proj_len = seq_len, proj_len
        factory = {"device": device, "dtype": dtype}
        self.e = nn.Parameter(torch.randn(proj_len, seq_len, **factory) / math.sqrt(proj_len))
        self.f = self.e if share_kv else nn.Parameter(
            torch.randn(proj_len, seq_len, **factory) / math.sqrt(proj_len))

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                key_padding_mask: Tensor | None = None, is_causal: bool = False,
                need_weights: bool = True,
                cache: KVCache | None = None) -> tuple[Tensor, Tensor | None]:
        self._check_inputs(query, key, value)
        refused = (("attn_mask", attn_mask is not None), ("key_padding_mask",
                   key_padding_mask is not None), ("is_causal", bool(is_causal)),
                   ("cache", cache is not None))
        for name, given in refused:
            if given:
                raise ValueError(f"{name} is not supported by LinformerSelfAttention: each of "
                                 f"its proj_len projected keys mixes all positions, so no key "
                                 f"can be hidden from a query")
        t_k = key.shape[1]
        if t_k > self.seq_len:
            raise ValueError(f"key has {t_k} positions but this layer projects at most "
                             f"seq_len = {self.seq_len}")
        q = self._split_heads(self.q_proj(query))
        k, v = self._split_heads(self.k_proj(key)), self._split_heads(self.v_proj(value))
        out, weights = linformer_attention(q, k, v, self.e[:, :t_k], self.f[:, :t_k], self.scale)
        out = out.transpose(1, 2).reshape(query.shape[0], query.shape[1], self.embed_dim)
        return self.out_proj(out), weights if need_weights else None

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, seq_len={self.seq_len}, proj_len={self.proj_len}"


def flash_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                    scale: float | None = None, block_size: int = 256,
                    query_block_size: int = 1024,
                    backend: Literal["auto", "torch", "triton"] = "auto") -> Tensor:
    """Exact softmax(q k^T * scale) v without materialising the (t_q, t_k) weights: queries are
    taken a block at a time, keys are streamed past them a block at a time, and the softmax is
    normalised online (Milakov & Gimelshein, 2018; FlashAttention, Dao et al., 2022).

    For each query the loop keeps the running maximum m of its scores, the running sum
    l = sum_j exp(s_j - m) and the unnormalised output acc = sum_j exp(s_j - m) v_j. When a key
    block raises the maximum to m', the old sums are rescaled by exp(m - m'); at the end
    out = acc / l. Only one (query_block_size, block_size) tile of scores exists at a time, so
    memory is O(t_q d + tile) instead of O(t_q t_k); a 1 MiB float32 tile also stays in cache.

    Args:
        q: (..., t_q, d_k), k: (..., t_k, d_k), v: (..., t_k, d_v), batch dims identical.
        is_causal: query i attends to keys j <= i (top-left aligned, as torch's is_causal).
            Tiles entirely after the diagonal are skipped, which halves the work.
        scale: default 1/sqrt(d_k).
        block_size, query_block_size: keys and queries per tile in the PyTorch loop.
        backend: "torch" is the loop below, on any device; "triton" runs the fused kernel of
            :mod:`lecture_pkg.kernels` (CUDA, fp16/bf16, d_k = d_v in {64, 128}; on the CPU only
            under TRITON_INTERPRET=1, for testing); "auto" picks Triton for CUDA inputs it
            supports when Triton is importable, else the loop.

    Returns:
        out: (..., t_q, d_v) in q's dtype (fp16/bf16 accumulate in float32). Autograd works
        through the loop, but it keeps every tile for the backward pass (so training with it
        needs O(t_q t_k) memory again); the Triton kernels have FlashAttention-2's own backward
        pass, which keeps only the output and one log-sum-exp per query.
    """
    _check_qkv(q, k, v)
    scale = _default_scale(q, scale)
    check_int("block_size", block_size, 1)
    check_int("query_block_size", query_block_size, 1)
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    from lecture_pkg import kernels  # the kernels package imports Triton only when asked to

    if backend == "triton" or (backend == "auto" and kernels.flash_attention_applies(q, k, v)):
        return kernels.triton_flash_attention(q, k, v, is_causal=is_causal, scale=scale)

    t_q, t_k = q.shape[-2], k.shape[-2]
    out = q.new_zeros(*q.shape[:-1], v.shape[-1])
    if t_k == 0:  # no keys: every query attends to nothing
        return out
    compute = _compute_dtype(q.dtype)
    q_scaled, k, v = q.to(compute) * scale, k.to(compute), v.to(compute)
    for q_start in range(0, t_q, query_block_size):
        q_stop = min(q_start + query_block_size, t_q)
        q_block = q_scaled[..., q_start:q_stop, :]
        running_max = q_block.new_full((*q_block.shape[:-1], 1), -math.inf)  # m, per query
        running_sum = q_block.new_zeros(*q_block.shape[:-1], 1)  # l = sum_j exp(s_j - m)
        acc = q_block.new_zeros(*q_block.shape[:-1], v.shape[-1])  # sum_j exp(s_j - m) v_j
        # Causal: keys after this block's last query are masked for all of its queries.
        keys_stop = min(t_k, q_stop) if is_causal else t_k
        for start in range(0, keys_stop, block_size):
            stop = min(start + block_size, t_k)
            scores = q_block @ k[..., start:stop, :].transpose(-2, -1)  # one tile
            if is_causal and stop - 1 > q_start:  # the tile crosses the diagonal
                # The tile's slice of the causal mask (slicing causal_mask(t_q, t_k) would
                # build the whole t_q x t_k mask this function exists to avoid).
                allowed = (torch.arange(start, stop, device=q.device)
                           <= torch.arange(q_start, q_stop, device=q.device)[:, None])
                # Finite, not -inf: the first tile (start = 0) holds key 0, which every query
                # may attend, so the running max is a real score from then on.
                scores = scores.masked_fill(~allowed, torch.finfo(compute).min)
            # The max only keeps exp() in range: the result does not depend on it, so it gets no
            # gradient (and autograd need not keep the tile that the next line overwrites).
            new_max = torch.maximum(running_max, scores.detach().amax(-1, keepdim=True))
            probs = scores.sub_(new_max).exp_()  # in place: the tile's scores are not needed again
            rescale = (running_max - new_max).exp()  # exp(-inf) = 0 on the first tile
            running_sum = running_sum * rescale + probs.sum(-1, keepdim=True)
            acc = acc * rescale + probs @ v[..., start:stop, :]
            running_max = new_max
        out[..., q_start:q_stop, :] = acc / running_sum
    return out
