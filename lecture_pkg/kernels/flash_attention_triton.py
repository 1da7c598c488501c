"""FlashAttention-2 in Triton: the forward pass and the backward pass, each fused (fp16/bf16, head
dims 64 and 128, causal or not).

**Forward** (the loop of :func:`lecture_pkg.attention.flash_attention`, fused). Each program owns
one block of BLOCK_Q queries of one (batch, head) pair, keeps them in on-chip memory, and streams
the keys and values past them BLOCK_K at a time, carrying per query the running maximum m, the
running sum l and the unnormalised output acc in float32 registers. Scores never reach global
memory: each key and value is read once per query block. Besides the output it writes one number
per query, the log-sum-exp L = m + log l of its scores: all the backward pass needs to rebuild
any tile of probabilities, P = exp(S - L), without the running statistics.

**Backward** (Dao 2023, FlashAttention-2, Algorithm 2). With dO the gradient of the output and
delta_i = sum_d dO_id O_id (one number per query, computed first),

    P = exp(S - L),  dV = P^T dO,  dP = dO V^T,  dS = P * (dP - delta),
    dQ = scale dS K,  dK = scale dS^T Q,

tile by tile, never storing S or P. Two kernels split the work so that no two programs write the
same rows: one program per key block accumulates that block's dK and dV over every query block
that sees it; one program per query block accumulates its dQ over every key block it sees. The
(t_q, t_k) matrices exist only as on-chip tiles, so training through attention needs O(t d)
memory, not O(t^2).

Details beyond the PyTorch loop:

* exponentials are taken base 2 (``exp2`` is the hardware instruction), with log2(e) folded into
  the scale: exp(x) = 2^(x log2 e); the stored L is in the same base-2 units;
* tiles that need no mask (entirely before the causal diagonal and inside the sequence) run a loop
  without the mask arithmetic; only the remaining tiles pay for ``tl.where``;
* on a CUDA GPU of compute capability 8.0 or newer the tile sizes, warps and pipeline stages are
  autotuned per head dim, causality, dtype and length class (:data:`FORWARD_CONFIGS`, ...);
  older GPUs and the interpreter use the fixed :func:`launch_config`. The measured speeds are
  in ``benchmarks/RESULTS.md`` (``benchmarks/attention.py``).

Causal masking is top-left aligned (query i sees keys j <= i), as torch's ``is_causal``.
Only imported through :mod:`lecture_pkg.kernels`, once Triton is known to be importable.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["flash_attention_backward", "flash_attention_forward"]

LOG2_E = math.log2(math.e)

# Autotuning candidates for Hopper/Ampere. Forward: BLOCK_Q must be a multiple of BLOCK_K (see
# `unmasked_stop`). Backward: the dK/dV kernel's BLOCK_K a multiple of its BLOCK_Q, the dQ
# kernel's BLOCK_Q a multiple of its BLOCK_K, for the same reason.
FORWARD_CONFIGS = [
    triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=w, num_stages=s)
    for bq, bk, w, s in [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 32, 4, 4),
                         (64, 64, 4, 4), (256, 64, 8, 3), (128, 64, 4, 4), (128, 128, 8, 2),
                         (128, 64, 8, 4), (128, 128, 4, 3)]
]
BACKWARD_KV_CONFIGS = [
    triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=w, num_stages=s)
    for bq, bk, w, s in [(32, 128, 4, 5), (64, 128, 8, 3), (32, 64, 4, 4), (64, 64, 4, 3)]
]
BACKWARD_Q_CONFIGS = [
    triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=w, num_stages=s)
    for bq, bk, w, s in [(128, 32, 4, 5), (128, 64, 8, 3), (64, 32, 4, 4), (64, 64, 4, 3)]
]


def launch_config(head_dim: int, device: torch.device) -> dict[str, int]:
    """Fixed forward tiles where nothing is autotuned: the interpreter (128 x 64 tiles, as a
    recent GPU) and GPUs older than compute capability 8.0 such as Colab's T4 (64 KiB of shared
    memory: 64 x 32 tiles without pipelining). The backward uses the same tile sizes, arranged
    for each of its kernels (:func:`_backward_launch_configs`)."""
    recent = device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0)
    if recent:
        return {"BLOCK_Q": 128, "BLOCK_K": 64, "num_warps": 4 if head_dim == 64 else 8,
                "num_stages": 3}
    return {"BLOCK_Q": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}


def length_class(t_k: int) -> int:
    """The autotuner's view of the sequence length: t_k rounded up to a power of two, at most
    2^14. Each class is tuned once (a long sequence may want deeper pipelining than a short
    one), without retuning for every length a generation loop passes through."""
    return min(1 << max(t_k - 1, 0).bit_length(), 1 << 14)


def _autotuned(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------

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
        scores = tl.dot(q, k_t)  # (BLOCK_Q, BLOCK_K), float32, not yet scaled
        if MASKED:
            allowed = key_index[None, :] < t_k
            if CAUSAL:
                allowed = allowed & (key_index[None, :] <= query_index[:, None])
            # Every query's first key block holds key 0, which it may attend, so row_max is
            # finite from the first block on and -inf here never meets -inf (no NaN).
            scores = tl.where(allowed, scores, float("-inf"))
        # Scaling the maximum rather than every score lets the scale and the subtraction
        # below fuse into one multiply-add per score (qk_scale > 0 keeps the maximum).
        new_max = tl.maximum(row_max, tl.max(scores, 1) * qk_scale)
        probs = tl.math.exp2(scores * qk_scale - new_max[:, None])
        rescale = tl.math.exp2(row_max - new_max)  # 0 on the first block (row_max = -inf)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        acc = tl.dot(probs.to(v.dtype), v, acc * rescale[:, None])  # accumulates in place
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def _flash_forward_kernel(Q, K, V, Out, LSE,
                          stride_qz, stride_qt, stride_qd, stride_kz, stride_kt, stride_kd,
                          stride_vz, stride_vt, stride_vd, stride_oz, stride_ot, stride_od,
                          t_q, t_k, length_class, qk_scale,
                          HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                          BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program: queries [q_start, q_start + BLOCK_Q) of batch-head z. Q, K, V, Out are
    (batch * heads, t, HEAD_DIM) with arbitrary strides; LSE is a contiguous (batch * heads, t_q)
    float32 tensor receiving each query's log-sum-exp in base 2."""
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
    tl.store(LSE + z * t_q + query_index, row_max + tl.math.log2(row_sum), mask=query_index < t_q)


# ---------------------------------------------------------------------------------------------
# Backward: dK and dV, one program per key block
# ---------------------------------------------------------------------------------------------

@triton.jit
def _key_block_grads(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qt, stride_qd,
                     stride_dot, stride_dod, key_index, feature_index, start, stop, t_q,
                     qk_scale, BLOCK_Q: tl.constexpr, MASKED: tl.constexpr,
                     CAUSAL: tl.constexpr):
    """Add to (dk, dv) of one key block the terms of query blocks [start, stop).

    k, v: (BLOCK_K, HEAD_DIM); the probabilities are rebuilt transposed, P^T = 2^(S^T - L), as
    (BLOCK_K, BLOCK_Q) tiles. With MASKED, queries at or beyond t_q, and (CAUSAL) queries before
    a key, contribute nothing.
    """
    query_offsets = tl.arange(0, BLOCK_Q)
    for block_start in range(start, stop, BLOCK_Q):
        query_index = block_start + query_offsets
        q_ptrs = q_base + query_index[:, None] * stride_qt + feature_index[None, :] * stride_qd
        do_ptrs = do_base + query_index[:, None] * stride_dot + feature_index[None, :] * stride_dod
        if MASKED:
            inside = query_index < t_q
            q = tl.load(q_ptrs, mask=inside[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=inside[:, None], other=0.0)
            lse = tl.load(lse_base + query_index, mask=inside, other=float("inf"))
            delta = tl.load(delta_base + query_index, mask=inside, other=0.0)
        else:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
            lse = tl.load(lse_base + query_index)
            delta = tl.load(delta_base + query_index)
        scores_t = tl.dot(k, tl.trans(q)) * qk_scale  # (BLOCK_K, BLOCK_Q), base 2
        probs_t = tl.math.exp2(scores_t - lse[None, :])  # 0 for queries past t_q (L = inf)
        if MASKED and CAUSAL:
            probs_t = tl.where(key_index[:, None] <= query_index[None, :], probs_t, 0.0)
        dv += tl.dot(probs_t.to(do.dtype), do)
        dprobs_t = tl.dot(v, tl.trans(do))  # (BLOCK_K, BLOCK_Q): dP^T = V dO^T
        dscores_t = probs_t * (dprobs_t - delta[None, :])
        dk += tl.dot(dscores_t.to(q.dtype), q)
    return dk, dv


@triton.jit
def _flash_backward_kv_kernel(Q, K, V, DO, LSE, Delta, DK, DV,
                              stride_qz, stride_qt, stride_qd, stride_kz, stride_kt, stride_kd,
                              stride_vz, stride_vt, stride_vd, stride_doz, stride_dot, stride_dod,
                              stride_dkz, stride_dkt, stride_dkd, stride_dvz, stride_dvt,
                              stride_dvd, t_q, t_k, length_class, qk_scale, scale,
                              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                              BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program: dK and dV of keys [k_start, k_start + BLOCK_K) of batch-head z."""
    k_start = tl.program_id(0) * BLOCK_K
    z = tl.program_id(1).to(tl.int64)
    key_index = k_start + tl.arange(0, BLOCK_K)
    feature_index = tl.arange(0, HEAD_DIM)
    key_inside = key_index[:, None] < t_k
    k = tl.load(K + z * stride_kz + key_index[:, None] * stride_kt + feature_index[None, :] * stride_kd,
                mask=key_inside, other=0.0)
    v = tl.load(V + z * stride_vz + key_index[:, None] * stride_vt + feature_index[None, :] * stride_vd,
                mask=key_inside, other=0.0)
    dk = tl.zeros([BLOCK_K, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_K, HEAD_DIM], dtype=tl.float32)
    q_base = Q + z * stride_qz
    do_base = DO + z * stride_doz
    lse_base = LSE + z * t_q
    delta_base = Delta + z * t_q

    # Query blocks wholly inside t_q and (causal) wholly after this key block need no mask.
    # Causal: queries before k_start never see these keys; k_start is a multiple of BLOCK_Q.
    start = 0
    masked_stop = 0
    if CAUSAL:
        start = tl.minimum(k_start, t_q)
        masked_stop = tl.minimum(k_start + BLOCK_K, t_q)  # the tiles crossing the diagonal
        dk, dv = _key_block_grads(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qt, stride_qd,
            stride_dot, stride_dod, key_index, feature_index, start, masked_stop, t_q, qk_scale,
            BLOCK_Q=BLOCK_Q, MASKED=True, CAUSAL=CAUSAL)
    full_stop = tl.maximum((t_q // BLOCK_Q) * BLOCK_Q, masked_stop)
    dk, dv = _key_block_grads(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qt, stride_qd,
        stride_dot, stride_dod, key_index, feature_index, masked_stop, full_stop, t_q, qk_scale,
        BLOCK_Q=BLOCK_Q, MASKED=False, CAUSAL=CAUSAL)
    dk, dv = _key_block_grads(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qt, stride_qd,
        stride_dot, stride_dod, key_index, feature_index, full_stop, t_q, t_q, qk_scale,
        BLOCK_Q=BLOCK_Q, MASKED=True, CAUSAL=CAUSAL)

    dk_ptrs = DK + z * stride_dkz + key_index[:, None] * stride_dkt + feature_index[None, :] * stride_dkd
    dv_ptrs = DV + z * stride_dvz + key_index[:, None] * stride_dvt + feature_index[None, :] * stride_dvd
    tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=key_inside)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=key_inside)


# ---------------------------------------------------------------------------------------------
# Backward: dQ, one program per query block
# ---------------------------------------------------------------------------------------------

@triton.jit
def _query_block_grads(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_kd, stride_vt,
                       stride_vd, query_index, feature_index, start, stop, t_k, qk_scale,
                       BLOCK_K: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Add to dq of one query block the terms of key blocks [start, stop): dS K per tile."""
    key_offsets = tl.arange(0, BLOCK_K)
    for block_start in range(start, stop, BLOCK_K):
        key_index = block_start + key_offsets
        k_ptrs = k_base + key_index[:, None] * stride_kt + feature_index[None, :] * stride_kd
        v_ptrs = v_base + key_index[:, None] * stride_vt + feature_index[None, :] * stride_vd
        if MASKED:
            k = tl.load(k_ptrs, mask=key_index[:, None] < t_k, other=0.0)
            v = tl.load(v_ptrs, mask=key_index[:, None] < t_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        scores = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_Q, BLOCK_K), base 2
        probs = tl.math.exp2(scores - lse[:, None])
        if MASKED:
            allowed = key_index[None, :] < t_k
            if CAUSAL:
                allowed = allowed & (key_index[None, :] <= query_index[:, None])
            probs = tl.where(allowed, probs, 0.0)
        dprobs = tl.dot(do, tl.trans(v))  # (BLOCK_Q, BLOCK_K): dP = dO V^T
        dscores = probs * (dprobs - delta[:, None])
        dq += tl.dot(dscores.to(k.dtype), k)
    return dq


@triton.jit
def _flash_backward_q_kernel(Q, K, V, DO, LSE, Delta, DQ,
                             stride_qz, stride_qt, stride_qd, stride_kz, stride_kt, stride_kd,
                             stride_vz, stride_vt, stride_vd, stride_doz, stride_dot, stride_dod,
                             stride_dqz, stride_dqt, stride_dqd, t_q, t_k, length_class, qk_scale,
                             scale,
                             HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                             BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program: dQ of queries [q_start, q_start + BLOCK_Q) of batch-head z."""
    q_start = tl.program_id(0) * BLOCK_Q
    z = tl.program_id(1).to(tl.int64)
    query_index = q_start + tl.arange(0, BLOCK_Q)
    feature_index = tl.arange(0, HEAD_DIM)
    inside = query_index < t_q
    q = tl.load(Q + z * stride_qz + query_index[:, None] * stride_qt + feature_index[None, :] * stride_qd,
                mask=inside[:, None], other=0.0)
    do = tl.load(DO + z * stride_doz + query_index[:, None] * stride_dot + feature_index[None, :] * stride_dod,
                 mask=inside[:, None], other=0.0)
    lse = tl.load(LSE + z * t_q + query_index, mask=inside, other=float("inf"))
    delta = tl.load(Delta + z * t_q + query_index, mask=inside, other=0.0)
    dq = tl.zeros([BLOCK_Q, HEAD_DIM], dtype=tl.float32)
    k_base = K + z * stride_kz
    v_base = V + z * stride_vz

    unmasked_stop = (t_k // BLOCK_K) * BLOCK_K  # as in the forward kernel
    stop = t_k
    if CAUSAL:
        unmasked_stop = tl.minimum(unmasked_stop, q_start)
        stop = tl.minimum(t_k, q_start + BLOCK_Q)
    dq = _query_block_grads(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_kd,
                            stride_vt, stride_vd, query_index, feature_index, 0, unmasked_stop,
                            t_k, qk_scale, BLOCK_K=BLOCK_K, MASKED=False, CAUSAL=CAUSAL)
    dq = _query_block_grads(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_kd,
                            stride_vt, stride_vd, query_index, feature_index, unmasked_stop, stop,
                            t_k, qk_scale, BLOCK_K=BLOCK_K, MASKED=True, CAUSAL=CAUSAL)
    dq_ptrs = DQ + z * stride_dqz + query_index[:, None] * stride_dqt + feature_index[None, :] * stride_dqd
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=inside[:, None])


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------

_TUNED: dict[triton.JITFunction, triton.runtime.Autotuner] = {}


def _kernel(kernel: triton.JITFunction, configs: list[triton.Config],
            device: torch.device) -> triton.JITFunction | triton.runtime.Autotuner:
    """The autotuned wrapper of ``kernel`` on recent CUDA GPUs (tuned once per head dim,
    causality, dtype and :func:`length_class`), else the plain kernel, launched with fixed
    tiles."""
    if not _autotuned(device):
        return kernel
    if kernel not in _TUNED:
        key = ["HEAD_DIM", "CAUSAL", "length_class"]
        _TUNED[kernel] = triton.autotune(configs=configs, key=key)(kernel)
    return _TUNED[kernel]


def _backward_launch_configs(head_dim: int, device: torch.device
                             ) -> tuple[dict[str, int], dict[str, int]]:
    """Fixed tiles of the two backward kernels where nothing is autotuned: the forward's tile
    sizes, with the larger one on the side each kernel keeps in registers."""
    forward = launch_config(head_dim, device)
    small, large = forward["BLOCK_K"], forward["BLOCK_Q"]
    launch = {"num_warps": forward["num_warps"], "num_stages": forward["num_stages"]}
    return {"BLOCK_Q": small, "BLOCK_K": large, **launch}, {"BLOCK_Q": large, "BLOCK_K": small, **launch}


def _as_3d(x: Tensor) -> Tensor:
    """(batch..., t, d) -> (batch * heads, t, d); reshape copies only if the layout requires it."""
    return x.reshape(-1, x.shape[-2], x.shape[-1])


def flash_attention_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool,
                            scale: float) -> tuple[Tensor, Tensor]:
    """q: (..., t_q, d), k: (..., t_k, d), v: (..., t_k, d), fp16 or bf16, d in {64, 128}, batch
    dims identical (checked by the caller). Returns out = softmax(q k^T scale) v: (..., t_q, d)
    and the log-sum-exp of each query's scores in base 2, lse: (batch * heads, t_q) float32."""
    *batch, t_q, head_dim = q.shape
    t_k = k.shape[-2]
    q3, k3, v3 = _as_3d(q), _as_3d(k), _as_3d(v)
    out = torch.empty_like(q3)
    lse = torch.empty(q3.shape[0], t_q, device=q.device, dtype=torch.float32)
    if t_k == 0:
        return out.zero_().reshape(q.shape), lse.fill_(float("-inf"))
    if q3.shape[0] == 0 or t_q == 0:
        return out.reshape(q.shape), lse
    args = (q3, k3, v3, out, lse, *q3.stride(), *k3.stride(), *v3.stride(), *out.stride(),
            t_q, t_k, length_class(t_k), scale * LOG2_E)
    kernel = _kernel(_flash_forward_kernel, FORWARD_CONFIGS, q.device)
    if kernel is _flash_forward_kernel:
        config = launch_config(head_dim, q.device)
        grid = (triton.cdiv(t_q, config["BLOCK_Q"]), q3.shape[0])
        kernel[grid](*args, HEAD_DIM=head_dim, CAUSAL=is_causal, **config)
    else:
        grid = lambda meta: (triton.cdiv(t_q, meta["BLOCK_Q"]), q3.shape[0])  # noqa: E731
        kernel[grid](*args, HEAD_DIM=head_dim, CAUSAL=is_causal)
    return out.reshape(*batch, t_q, head_dim), lse


def flash_attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                             lse: Tensor, is_causal: bool, scale: float
                             ) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients (dq, dk, dv) of out = flash_attention_forward(q, k, v)[0] for the output
    gradient grad_out: (..., t_q, d); lse is the forward's second result. Shapes and dtypes
    follow q, k and v."""
    t_q, t_k, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    q3, k3, v3, do3 = _as_3d(q), _as_3d(k), _as_3d(v), _as_3d(grad_out)
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    if t_q == 0 or t_k == 0 or q3.shape[0] == 0:
        return dq.zero_().reshape(q.shape), dk.zero_().reshape(k.shape), dv.zero_().reshape(v.shape)
    # delta_i = sum_d dO_id O_id = sum_j P_ij dP_ij: one number per query, in float32.
    delta = (do3.float() * _as_3d(out).float()).sum(-1)
    common = (*q3.stride(), *k3.stride(), *v3.stride(), *do3.stride())
    kv_args = (q3, k3, v3, do3, lse, delta, dk, dv, *common, *dk.stride(), *dv.stride(),
               t_q, t_k, length_class(t_k), scale * LOG2_E, scale)
    q_args = (q3, k3, v3, do3, lse, delta, dq, *common, *dq.stride(), t_q, t_k,
              length_class(t_k), scale * LOG2_E, scale)
    kv_kernel = _kernel(_flash_backward_kv_kernel, BACKWARD_KV_CONFIGS, q.device)
    q_kernel = _kernel(_flash_backward_q_kernel, BACKWARD_Q_CONFIGS, q.device)
    z = q3.shape[0]
    if kv_kernel is _flash_backward_kv_kernel:
        kv_config, q_config = _backward_launch_configs(head_dim, q.device)
        kv_kernel[(triton.cdiv(t_k, kv_config["BLOCK_K"]), z)](
            *kv_args, HEAD_DIM=head_dim, CAUSAL=is_causal, **kv_config)
        q_kernel[(triton.cdiv(t_q, q_config["BLOCK_Q"]), z)](
            *q_args, HEAD_DIM=head_dim, CAUSAL=is_causal, **q_config)
    else:
        kv_kernel[lambda meta: (triton.cdiv(t_k, meta["BLOCK_K"]), z)](
            *kv_args, HEAD_DIM=head_dim, CAUSAL=is_causal)
        q_kernel[lambda meta: (triton.cdiv(t_q, meta["BLOCK_Q"]), z)](
            *q_args, HEAD_DIM=head_dim, CAUSAL=is_causal)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
