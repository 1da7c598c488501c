"""Attention masks. Boolean masks use True = "may attend", as torch's SDPA does.

Shapes broadcast against attention scores of shape (batch, heads, t_q, t_k).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal_mask", "to_additive_mask"]


def causal_mask(t_q: int, t_k: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """(t_q, t_k) bool mask letting query i attend to keys j <= i (the lower triangle).

    For t_q != t_k the triangle is aligned top-left, exactly as
    ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` aligns it.
    """
    t_k = t_q if t_k is None else t_k
    for name, value in (("t_q", t_q), ("t_k", t_k)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril()


def to_additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Bool mask (True = may attend) -> float mask to add to scores: 0 where allowed and
    ``torch.finfo(dtype).min`` where blocked (finite, so fp16/bf16 never overflow to -inf - -inf
    = NaN; -1e9 would overflow fp16, whose most negative value is -65504)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = may attend), got {mask.dtype}")
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    zeros = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zeros, torch.finfo(dtype).min)
