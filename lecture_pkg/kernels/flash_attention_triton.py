"""FlashAttention forward pass as one Triton kernel (fp16/bf16, head dims 64 and 128, causal or not).

The algorithm is the loop of :func:`lecture_pkg.attention.flash_attention`, fused: each program
owns one block of BLOCK_Q queries of one (batch, head) pair, keeps them in on-chip memory, and
streams the keys and values past them BLOCK_K at a time, carrying per query the running maximum
m, the running sum l and the unnormalised output acc in float32 registers. Scores never reach
global memory, so global-memory traffic falls (each key and value is read once per query block);
that is the IO argument for its speed on a GPU, which no recorded run has measured yet.

Two details beyond the PyTorch loop:

* exponentials are taken base 2 (``exp2`` is the hardware instruction), with log2(e) folded into
  the scale: exp(x) = 2^(x log2 e), and the ratios that make up softmax do not change;
* key blocks that need no mask (entirely before the causal diagonal and inside t_k) run a loop
  without the mask arithmetic; only the remaining blocks pay for ``tl.where``.

Causal masking is top-left aligned (query i sees keys j <= i), as torch's ``is_causal``.
Only imported through :mod:`lecture_pkg.kernels`, once Triton is known to be importable.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["flash_attention_forward"]

LOG2_E = math.log2(math.e)


def launch_config(head_dim: int, device: torch.device) -> dict[str, int]:
    """Tile sizes and launch parameters. BLOCK_Q must be a multiple of BLOCK_K (see
    `unmasked_stop`). Ampere and newer GPUs (and the interpreter) take 128 x 64 tiles with a
    3-stage pipeline (about 128 KiB of shared memory at d = 128); older GPUs such as Colab's T4
    (64 KiB) get 64 x 32 tiles without pipelining. Not tuned: no GPU was available when written."""
    recent = device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0)
    if recent:
        return {"BLOCK_Q": 128, "BLOCK_K": 64, "num_warps": 4 if head_dim == 64 else 8,
                "num_stages": 3}
    return {"BLOCK_Q": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}


@triton.jit
def _attend_key_blocks(acc, row_sum, row_max, q, k_base, v_base, stride_kt, stride_kd,
                       stride_vt, stride_vd, query_index, feature_index, start, stop, t_k,
                       qk_scale, BLOCK_K: tl.constexpr, MASKED: tl.constexpr,
                       CAUSAL: tl.constexpr):
    """Fold key blocks [start, stop) into the running (acc, row_sum, row_max) of one query block.

    q: (BLOCK_Q, HEAD_DIM); the scores use base-2 exponentials (qk_scale includes log2 e).
    With MASKED, keys at or beyond t_k, and (CAUSAL) keys after the query, are excluded.
    """
    key_offsets = tl.arange(0, BLOCK_K)
    for block_start in range(start, stop, BLOCK_K):
        key_index = block_start + key_offsets
        k_ptrs = k_base + key_index[None, :] * stride_kt + feature_index[:, None] * stride_kd
        v_ptrs = v_base + key_index[:, None] * stride_vt + feature_index[None, :] * stride_vd
        if MASKED:
            k_t = tl.load(k_ptrs, mask=key_index[None, :] < t_k, other=0.0)  # (HEAD_DIM, BLOCK_K)
            v = tl.load(v_ptrs, mask=key_index[:, None] < t_k, other=0.0)  # (BLOCK_K, HEAD_DIM)
        else:
            k_t = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        scores = tl.dot(q, k_t) * qk_scale  # (BLOCK_Q, BLOCK_K), float32
        if MASKED:
            allowed = key_index[None, :] < t_k
            if CAUSAL:
                allowed = allowed & (key_index[None, :] <= query_index[:, None])
            # Every query's first key block holds key 0, which it may attend, so row_max is
            # finite from the first block on and -inf here never meets -inf (no NaN).
            scores = tl.where(allowed, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        probs = tl.math.exp2(scores - new_max[:, None])
        rescale = tl.math.exp2(row_max - new_max)  # 0 on the first block (row_max = -inf)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v)
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def _flash_forward_kernel(Q, K, V, Out,
                          stride_qz, stride_qt, stride_qd, stride_kz, stride_kt, stride_kd,
                          stride_vz, stride_vt, stride_vd, stride_oz, stride_ot, stride_od,
                          t_q, t_k, qk_scale,
                          HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                          CAUSAL: tl.constexpr):
    """One program: queries [q_start, q_start + BLOCK_Q) of batch-head z. Tensors are
    (batch * heads, t, HEAD_DIM) with arbitrary strides."""
    q_start = tl.program_id(0) * BLOCK_Q
    z = tl.program_id(1).to(tl.int64)  # int64: z * stride may exceed 2^31 for long sequences
    query_index = q_start + tl.arange(0, BLOCK_Q)
    feature_index = tl.arange(0, HEAD_DIM)

    q_ptrs = Q + z * stride_qz + query_index[:, None] * stride_qt + feature_index[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=query_index[:, None] < t_q, other=0.0)
    row_max = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, HEAD_DIM], dtype=tl.float32)
    k_base = K + z * stride_kz
    v_base = V + z * stride_vz

    # Key blocks lying wholly inside t_k and (causal) wholly before this query block need no
    # mask; q_start is a multiple of BLOCK_K, so the two bounds are block boundaries.
    unmasked_stop = (t_k // BLOCK_K) * BLOCK_K
    stop = t_k
    if CAUSAL:
        unmasked_stop = tl.minimum(unmasked_stop, q_start)
        stop = tl.minimum(t_k, q_start + BLOCK_Q)
    acc, row_sum, row_max = _attend_key_blocks(
        acc, row_sum, row_max, q, k_base, v_base, stride_kt, stride_kd, stride_vt, stride_vd,
        query_index, feature_index, 0, unmasked_stop, t_k, qk_scale,
        BLOCK_K=BLOCK_K, MASKED=False, CAUSAL=CAUSAL)
    acc, row_sum, row_max = _attend_key_blocks(
        acc, row_sum, row_max, q, k_base, v_base, stride_kt, stride_kd, stride_vt, stride_vd,
        query_index, feature_index, unmasked_stop, stop, t_k, qk_scale,
        BLOCK_K=BLOCK_K, MASKED=True, CAUSAL=CAUSAL)

    out = acc / row_sum[:, None]
    o_ptrs = Out + z * stride_oz + query_index[:, None] * stride_ot + feature_index[None, :] * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=query_index[:, None] < t_q)


def flash_attention_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool,
                            scale: float) -> Tensor:
    """q: (..., t_q, d), k: (..., t_k, d), v: (..., t_k, d), fp16 or bf16, d in {64, 128}, batch
    dims identical (checked by the caller). Returns softmax(q k^T scale) v: (..., t_q, d)."""
    *batch, t_q, head_dim = q.shape
    t_k = k.shape[-2]
    if t_k == 0:
        return q.new_zeros(q.shape)
    # (batch..., t, d) -> (batch * heads, t, d); reshape copies only if the layout requires it.
    q3, k3, v3 = (x.reshape(-1, x.shape[-2], head_dim) for x in (q, k, v))
    out = torch.empty_like(q3)
    if q3.shape[0] == 0 or t_q == 0:
        return out.reshape(q.shape)
    config = launch_config(head_dim, q.device)
    grid = (triton.cdiv(t_q, config["BLOCK_Q"]), q3.shape[0])
    _flash_forward_kernel[grid](
        q3, k3, v3, out,
        *q3.stride(), *k3.stride(), *v3.stride(), *out.stride(),
        t_q, t_k, scale * LOG2_E,
        HEAD_DIM=head_dim, CAUSAL=is_causal, **config,
    )
    return out.reshape(*batch, t_q, head_dim)
