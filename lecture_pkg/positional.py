"""Position information for attention, which on its own cannot tell word order apart.

Absolute schemes add a vector to each token embedding:

* :func:`sinusoidal_encoding` (Vaswani et al.): PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i)
  with w_i = base^(-2i/d). Shifting by k is the block-diagonal rotation :func:`shift_matrix`.
* :func:`binary_encoding`: the bits of p, a toy that shows what goes wrong without smoothness.
* :class:`LearnedPositionalEmbedding`: one trained vector per position, up to a maximum length.

Relative schemes act inside attention instead, so scores depend on the offset j - i only:

* :func:`apply_rope` (RoFormer): rotate queries and keys by position-dependent angles;
* :func:`alibi_bias` (ALiBi): add -m_h |i - j| to head h's scores, slopes from :func:`alibi_slopes`;
* :func:`t5_relative_position_bucket` and :class:`RelativePositionBias` (T5): one learned scalar
  per head and log-spaced bucket of offsets.

Offsets are "key minus query", j - i, as in T5. Tables are computed in float64 and then cast, so
that the angles at positions in the tens of thousands keep their digits.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lecture_pkg.checks import check_float_tensor, check_int

__all__ = [
    "LearnedPositionalEmbedding",
    "RelativePositionBias",
    "SinusoidalPositionalEncoding",
    "alibi_bias",
    "alibi_slopes",
    "angular_frequencies",
    "apply_rope",
    "binary_encoding",
    "relative_positions",
    "rotate_half",
    "shift_matrix",
    "sinusoidal_encoding",
    "t5_relative_position_bucket",
]


# --------------------------------------------------------------------------- input checks

def _check_pairs(name: str, value: int) -> int:
    """A positive, even size: sinusoids and rotations work on (sin, cos) pairs of dimensions."""
    check_int(name, value, 1)
    if value % 2:
        raise ValueError(f"{name} must be even (dimensions come in sin/cos pairs), got {value}")
    return value


def _check_base(base: object) -> float:
    if not isinstance(base, (int, float)) or isinstance(base, bool):
        raise TypeError(f"base must be a real number, got {type(base).__name__}")
    if not (math.isfinite(base) and base > 1):
        raise ValueError(f"base must be a finite number > 1 (so that frequencies decrease), got {base}")
    return float(base)


def _dtype_or_default(dtype: torch.dtype | None, floating: bool = True) -> torch.dtype:
    if dtype is None:
        return torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    if floating and not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    return dtype


def _check_offset(k: object) -> None:
    if not isinstance(k, (int, float)) or isinstance(k, bool):
        raise TypeError(f"k must be a real number (an offset in positions), got {type(k).__name__}")
    if not math.isfinite(k):
        raise ValueError(f"k must be finite (an offset in positions), got {k}")


# --------------------------------------------------------------------------- sinusoids

def angular_frequencies(d_model: int, base: float = 10000.0) -> Tensor:
    """The frequencies w_i = base^(-2i/d_model), i = 0 .. d_model/2 - 1, as float64 on the CPU.

    Returns (d_model // 2,), decreasing from 1 (wavelength 2 pi) towards 1/base (wavelength just
    under 2 pi base).
    """
    _check_pairs("d_model", d_model)
    base = _check_base(base)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    return base ** (-two_i / d_model)


def sinusoidal_encoding(num_positions: int, d_model: int, base: float = 10000.0, *,
                        dtype: torch.dtype | None = None,
                        device: torch.device | str | None = None) -> Tensor:
    """The Transformer's position table, exactly as in the paper. Returns (num_positions, d_model):

        PE[pos, 2i] = sin(pos / base^(2i/d_model)),   PE[pos, 2i+1] = cos(pos / base^(2i/d_model)).

    dtype defaults to torch's default dtype; the angles are computed in float64 first.
    """
    check_int("num_positions", num_positions, 0)
    dtype = _dtype_or_default(dtype)
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] * angular_frequencies(d_model, base)
    # stack (sin, cos) on a last axis and flatten: sin lands in even columns, cos in odd ones
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
    return table.to(device=device, dtype=dtype)


def shift_matrix(k: float, d_model: int, base: float = 10000.0, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> Tensor:
    """The (d_model, d_model) matrix R_k with PE[p + k] = PE[p] @ R_k for every position p.

    It is block diagonal; the block for the pair (2i, 2i+1) is [[cos t, -sin t], [sin t, cos t]]
    with t = k w_i, which follows from sin(a + t) = sin a cos t + cos a sin t and
    cos(a + t) = cos a cos t - sin a sin t. It does not depend on p, so "move k steps" is one
    linear map; k may be negative or fractional, and R_a @ R_b = R_(a+b).
    """
    _check_offset(k)
    dtype = _dtype_or_default(dtype)
    theta = k * angular_frequencies(d_model, base)
    cos, sin = theta.cos(), theta.sin()
    blocks = torch.stack((torch.stack((cos, -sin), -1), torch.stack((sin, cos), -1)), -2)  # (d/2, 2, 2)
    return torch.block_diag(*blocks).to(device=device, dtype=dtype)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the sinusoidal table to token embeddings: x: (batch, t, d_model) -> (batch, t, d_model).

    No parameters and no maximum length: the table is computed for whatever t arrives.
    """

    def __init__(self, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        self.d_model = _check_pairs("d_model", d_model)
        self.base = _check_base(base)

    def forward(self, x: Tensor) -> Tensor:
        _check_embeddings(x, self.d_model)
        return x + sinusoidal_encoding(x.shape[1], self.d_model, self.base, dtype=x.dtype, device=x.device)


# --------------------------------------------------------------------------- bits, learned

def _check_bits(num_positions: int, num_bits: int) -> None:
    check_int("num_positions", num_positions, 0)
    check_int("num_bits", num_bits, 1)
    if num_bits < 63 and num_positions > 2**num_bits:
        raise ValueError(f"{num_positions} positions need {(num_positions - 1).bit_length()} bits but "
                         f"num_bits={num_bits} (only 2**num_bits positions have distinct codes)")


def binary_encoding(num_positions: int, num_bits: int, *, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> Tensor:
    """The bits of each position, least significant first. Returns (num_positions, num_bits) of 0/1.

    Column b is bit b of p, so column 0 flips every step and column b every 2^b steps. Only
    2^num_bits positions have distinct codes, hence the error beyond that. dtype defaults to
    torch's default float dtype (to add to embeddings); an integer dtype suits printing.
    """
    _check_bits(num_positions, num_bits)
    computed = min(num_bits, 62)  # positions are int64, so every bit from 62 on is zero
    positions = torch.arange(num_positions, device=device)[:, None]
    bits = (positions >> torch.arange(computed, device=device)) & 1
    return nn.functional.pad(bits, (0, num_bits - computed)).to(_dtype_or_default(dtype, floating=False))


def _check_embeddings(x: Tensor, d_model: int) -> None:
    check_float_tensor("x", x)
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"x must have shape (batch, t, d_model={d_model}), got {tuple(x.shape)}")


class LearnedPositionalEmbedding(nn.Module):
    """One trained vector per position (BERT, GPT-2, ViT): x: (batch, t, d_model) -> same shape.

    The table has max_positions rows, so a sequence longer than that has no position vectors at
    all; initialised N(0, 0.02^2) as in GPT-2, from ``generator`` when given.
    """

    def __init__(self, max_positions: int, d_model: int, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.max_positions = check_int("max_positions", max_positions, 1)
        self.d_model = check_int("d_model", d_model, 1)
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))
        nn.init.normal_(self.weight, std=0.02, generator=generator)

    def forward(self, x: Tensor) -> Tensor:
        _check_embeddings(x, self.d_model)
        t = x.shape[1]
        if t > self.max_positions:
            raise ValueError(f"sequence length {t} exceeds max_positions={self.max_positions}: a learned "
                             f"table has no vectors for positions it was never given")
        return x + self.weight[:t].to(x.dtype)


# --------------------------------------------------------------------------- rotary (RoPE)

def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension: the 90-degree turn of every
    pair (j, j + d/2), as in GPT-NeoX and HF's Llama port (whose checkpoint conversion permutes
    W_Q and W_K so that this matches Meta's interleaved pairs). x: (..., d) with d even."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _check_rope_args(x: Tensor, positions: Tensor) -> None:
    check_float_tensor("x", x)
    if not isinstance(positions, Tensor):
        raise TypeError(f"positions must be a torch.Tensor, got {type(positions).__name__}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., t, d), got {tuple(x.shape)}")
    _check_pairs("x's last dim d", x.shape[-1])
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must hold integers or real numbers, got {positions.dtype}")
    if positions.device != x.device:
        raise ValueError(f"positions is on {positions.device} but x is on {x.device}")
    try:
        fits = torch.broadcast_shapes(positions.shape, x.shape[:-1]) == x.shape[:-1]
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"positions has shape {tuple(positions.shape)}, which does not broadcast to "
                         f"x.shape[:-1] = {tuple(x.shape[:-1])} (use (t,) or e.g. (batch, 1, t))")


def apply_rope(x: Tensor, positions: Tensor, base: float = 10000.0, *, interleaved: bool = False) -> Tensor:
    """Rotary position embedding: rotate each pair of x's last dimension by the angle p * w_i.

    x: (..., t, d) queries or keys, d even, e.g. (batch, heads, t, d_head).
    positions: integer or float positions broadcastable to x.shape[:-1], e.g. (t,) or (batch, 1, t).
    Pairs are (j, j + d/2) (rotate-half: GPT-NeoX and HF's Llama port) or, with
    ``interleaved=True``, (2j, 2j+1) (RoFormer, GPT-J, Meta's reference Llama code); pair j turns
    at w_j = base^(-2j/d). Because rotations compose, <rope(q, m), rope(k, n)> depends on the
    offset n - m only. Returns x's shape, dtype and device.
    """
    _check_rope_args(x, positions)
    angle_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32  # fp16 angles lose digits
    freqs = angular_frequencies(x.shape[-1], base).to(device=x.device, dtype=angle_dtype)
    theta = positions.to(angle_dtype)[..., None] * freqs  # (..., t, d/2)
    cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    return x * cos + rotate_half(x) * sin


# --------------------------------------------------------------------------- relative biases

def relative_positions(t_q: int, t_k: int, device: torch.device | str | None = None) -> Tensor:
    """(t_q, t_k) int64 matrix of offsets j - i (key position minus query position)."""
    check_int("t_q", t_q, 0)
    check_int("t_k", t_k, 0)
    return torch.arange(t_k, device=device)[None, :] - torch.arange(t_q, device=device)[:, None]


def alibi_slopes(num_heads: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> Tensor:
    """ALiBi's per-head slopes m_h. Returns (num_heads,).

    For n heads, n a power of two, the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8). For
    other n, the rule of the ALiBi code: the slopes of the largest power of two p < n, then every
    other slope of the 2p sequence (its odd-numbered ones), as many as are missing.
    """
    check_int("num_heads", num_heads, 1)

    def geometric(n: int) -> list[float]:  # n a power of two
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    power = 1 << (num_heads.bit_length() - 1)  # largest power of two <= num_heads
    slopes = geometric(power) + geometric(2 * power)[0::2][: num_heads - power]
    return torch.tensor(slopes, dtype=_dtype_or_default(dtype), device=device)


def alibi_bias(num_heads: int, t_q: int, t_k: int, *, dtype: torch.dtype | None = None,
               device: torch.device | str | None = None) -> Tensor:
    """ALiBi's additive attention bias -m_h |j - i|. Returns (num_heads, t_q, t_k).

    Query i and key j sit at positions i and j (top-left aligned, like
    :func:`lecture_pkg.masks.causal_mask`). Under a causal mask only j <= i survives, where this is
    the paper's -m_h (i - j); the |.| makes the matrix usable without a mask too.
    """
    slopes = alibi_slopes(num_heads, dtype=dtype, device=device)
    distance = relative_positions(t_q, t_k, device=device).abs().to(slopes.dtype)
    return -slopes[:, None, None] * distance


def t5_relative_position_bucket(relative_position: Tensor, bidirectional: bool = True,
                                num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """T5's bucket of each offset j - i: exact for small distances, log-spaced up to max_distance,
    one shared bucket beyond. Returns int64 buckets in [0, num_buckets), relative_position's shape.

    Bidirectional (an encoder): half the buckets for keys after the query (j > i), half for the
    rest. Otherwise (a decoder) all num_buckets serve the past, and later keys fall into bucket 0
    with the offset 0, as they are masked anyway. Within the n buckets of one direction, distances
    below n/2 get their own bucket (0..7 bidirectional, 0..15 causal, with 32 buckets) and the
    other n/2 buckets cover [n/2, max_distance) on a log scale. The float32 operations follow T5's in the same order,
    so that the buckets agree exactly where a log lands on a boundary.
    """
    _check_integer_tensor("relative_position", relative_position)
    num_buckets = _check_buckets(bidirectional, num_buckets, max_distance)  # per direction from here on
    relative_position = relative_position.long()

    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        buckets += (relative_position > 0).long() * num_buckets  # keys after the query: upper half
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2

    # clamp: the log branch is computed everywhere, and log(0) would be -inf where it is not used
    log_ratio = torch.log(distance.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    log_bucket = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, log_bucket)


def _check_integer_tensor(name: str, value: object) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")


def _check_buckets(bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Validate a T5 bucket configuration; returns the number of buckets per direction."""
    if not isinstance(bidirectional, bool):
        raise TypeError(f"bidirectional must be a bool, got {type(bidirectional).__name__}")
    check_int("num_buckets", num_buckets, 4 if bidirectional else 2)  # >= 1 exact bucket per direction
    check_int("max_distance", max_distance, 1)
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    if max_distance <= per_direction // 2:
        raise ValueError(f"max_distance must exceed the {per_direction // 2} exactly bucketed distances, "
                         f"got {max_distance}")
    return per_direction


class RelativePositionBias(nn.Module):
    """T5's learned relative bias: one scalar per (bucket, head), added to the attention scores.

    forward(t_q, t_k) -> (num_heads, t_q, t_k); initialised N(0, 1) (from ``generator`` if given).
    """

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, 1)
        _check_buckets(bidirectional, num_buckets, max_distance)
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.bias = nn.Embedding(num_buckets, num_heads)
        nn.init.normal_(self.bias.weight, generator=generator)

    def forward(self, t_q: int, t_k: int) -> Tensor:
        offsets = relative_positions(t_q, t_k, device=self.bias.weight.device)
        buckets = t5_relative_position_bucket(offsets, self.bidirectional, self.num_buckets, self.max_distance)
        return self.bias(buckets).permute(2, 0, 1)  # (t_q, t_k, heads) -> (heads, t_q, t_k)
