"""The book's masks as FlexAttention ``mask_mod`` functions (``torch.nn.attention.flex_attention``,
He et al., 2024).

A mask_mod says for one (batch, head, query, key) index whether the key may be attended:
``mask_mod(b, h, q_idx, kv_idx) -> bool tensor``. FlexAttention turns it into two things:

* a dense answer where needed (``create_mask``: the (t_q, t_k) bool mask of
  :mod:`lecture_pkg.masks`);
* a :class:`~torch.nn.attention.flex_attention.BlockMask`: for each tile of BLOCK_SIZE queries x
  BLOCK_SIZE keys, whether it is empty (skipped: no scores computed at all), full (no mask needed)
  or partial (the mask_mod is evaluated inside it). Its ``sparsity()`` is the share of tiles a
  kernel skips: what turns a sparse mask into saved time.

The mask_mods here equal :func:`~lecture_pkg.masks.causal_mask`,
:func:`~lecture_pkg.masks.sliding_window_causal_mask` (with sinks),
:func:`~lecture_pkg.masks.prefix_lm_mask` and :func:`~lecture_pkg.masks.document_mask`;
:func:`flex_masked_attention` runs ``flex_attention`` with one (eagerly on the CPU, compiled on a
GPU for speed).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask, flex_attention

from lecture_pkg.checks import check_float_tensor, check_int

__all__ = ["block_mask", "causal_mod", "dense_mask", "document_mod", "flex_masked_attention",
           "prefix_lm_mod", "sliding_window_mod"]

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def causal_mod() -> MaskMod:
    """Key j may be attended by query i when j <= i."""
    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx <= q_idx
    return mask_mod


def sliding_window_mod(window: int, num_sinks: int = 0) -> MaskMod:
    """A decoder's window: i - window < j <= i, plus j < num_sinks (attention sinks)."""
    check_int("window", window, 1)
    check_int("num_sinks", num_sinks)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx <= q_idx) & ((q_idx - kv_idx < window) | (kv_idx < num_sinks))
    return mask_mod


def prefix_lm_mod(prefix_len: int) -> MaskMod:
    """The prefix (positions < prefix_len) is seen by every query; the rest causally."""
    check_int("prefix_len", prefix_len)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx <= q_idx) | (kv_idx < prefix_len)
    return mask_mod


def document_mod(document_ids: Tensor, causal: bool = True) -> MaskMod:
    """Packed documents: same document (and causal), never a padding key (negative id).
    document_ids: (t,) integers, one per position."""
    if not isinstance(document_ids, Tensor) or document_ids.dim() != 1 \
            or document_ids.is_floating_point() or document_ids.dtype == torch.bool:
        got = tuple(document_ids.shape) if isinstance(document_ids, Tensor) else type(document_ids)
        raise ValueError(f"document_ids must be a 1-D integer tensor (t,), got {got}")

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        same = (document_ids[q_idx] == document_ids[kv_idx]) & (document_ids[kv_idx] >= 0)
        return same & (kv_idx <= q_idx) if causal else same
    return mask_mod


def dense_mask(mask_mod: MaskMod, t_q: int, t_k: int | None = None,
               device: torch.device | str = "cpu") -> Tensor:
    """The (t_q, t_k) bool mask that ``mask_mod`` describes (FlexAttention's ``create_mask``)."""
    check_int("t_q", t_q, 1)
    t_k = t_q if t_k is None else check_int("t_k", t_k, 1)
    return create_mask(mask_mod, None, None, t_q, t_k, device=device)[0, 0]


def block_mask(mask_mod: MaskMod, t_q: int, t_k: int | None = None, block_size: int = 128,
               device: torch.device | str = "cpu") -> BlockMask:
    """FlexAttention's tile map of ``mask_mod`` with tiles of block_size x block_size."""
    check_int("t_q", t_q, 1)
    t_k = t_q if t_k is None else check_int("t_k", t_k, 1)
    check_int("block_size", block_size, 1)
    return create_block_mask(mask_mod, None, None, t_q, t_k, device=device, BLOCK_SIZE=block_size)


def flex_masked_attention(q: Tensor, k: Tensor, v: Tensor, mask_mod: MaskMod,
                          block_size: int = 128, scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + mask) v with the mask given as a mask_mod, through
    ``flex_attention`` (tiles the BlockMask marks empty are never computed).

    q: (batch, heads, t_q, d), k: (batch, heads, t_k, d), v: (batch, heads, t_k, d_v).
    A query with no allowed key gets zeros. Returns (batch, heads, t_q, d_v). Called eagerly
    (as here, on the CPU) flex_attention is a reference implementation that builds the full score
    matrix; ``torch.compile(flex_attention)`` generates the fused kernel that skips empty tiles.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, x)
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, heads, length, features), got "
                             f"{tuple(x.shape)}")
    if k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2] or k.shape[2] != v.shape[2]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} must "
                         f"share batch and heads, and k and v their length")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k has last dim {k.shape[-1]} but q has {q.shape[-1]} (d_k must match)")
    blocks = block_mask(mask_mod, q.shape[2], k.shape[2], block_size, device=q.device)
    with warnings.catch_warnings():  # the eager path says it is not the fused kernel: we know
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, block_mask=blocks, scale=scale)
