"""Fused GPU kernels behind :mod:`lecture_pkg.attention`, written in Triton.

Nothing here imports Triton until a kernel is actually run, so a CPU install never needs it.
A kernel runs on a CUDA device, or on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``
set before the first kernel call, see ``make triton-check``), which is how its correctness is
tested on machines without a GPU.

* :func:`flash_attention_applies` says whether ``flash_attention(backend="auto")`` will use the
  kernel for given inputs (CUDA only); :func:`triton_flash_attention` runs it (CUDA, or the CPU
  under the interpreter), differentiably: its backward pass is FlashAttention-2's, two more fused
  kernels that rebuild each tile of probabilities from the saved log-sum-exp;
* :func:`recorded_gpu_benchmark` reads the kernels' measured speed and accuracy against torch's
  SDPA on a GPU (``benchmarks/attention.py --gpu-only``, shipped as JSON beside this file), so
  a chapter can show GPU figures on a machine without one.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["FLASH_HEAD_DIMS", "flash_attention_applies", "recorded_gpu_benchmark",
           "triton_flash_attention", "triton_usable"]

FLASH_HEAD_DIMS = (64, 128)  # the head dims the kernel is tested with
FLASH_DTYPES = (torch.float16, torch.bfloat16)
# The recorded benchmark runs: "h200" measured the kernels as they are now (bfloat16, d = 128,
# 2026-11-28); "h200-adfdfb1" the whole grid (fp16 and bf16, d = 64 and 128) at commit adfdfb1,
# before the forward folded its scale into one multiply-add and tuned per length class.
RECORDED_RUNS = {"h200": "flash_attention_h200.json",
                 "h200-adfdfb1": "flash_attention_h200_adfdfb1.json"}


@functools.cache
def _triton_importable() -> bool:
    try:
        importlib.import_module("triton")
    except ImportError:  # includes a Triton whose native parts fail to load
        return False
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_usable(device: torch.device) -> bool:
    """Triton is importable and can run on ``device``: CUDA, or the CPU under the interpreter."""
    on_device = device.type == "cuda" or (device.type == "cpu" and _interpreting())
    return on_device and _triton_importable()


def _unsupported_reason(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """Why the kernel cannot run on these inputs, or None if it can. Shapes as in
    :func:`lecture_pkg.attention.flash_attention`, already validated there."""
    if not triton_usable(q.device):
        return (f"needs Triton and a CUDA device (or TRITON_INTERPRET=1 on the CPU); q is on "
                f"{q.device}, Triton importable: {_triton_importable()}")
    if q.dtype not in FLASH_DTYPES:
        return f"needs float16 or bfloat16 inputs, got {q.dtype}"
    if q.dtype == torch.bfloat16 and q.device.type == "cuda" and \
            torch.cuda.get_device_capability(q.device) < (8, 0):
        return "needs a GPU of compute capability 8.0 or newer for bfloat16 (use float16)"
    if q.shape[-1] != v.shape[-1] or q.shape[-1] not in FLASH_HEAD_DIMS:
        return (f"needs d_k = d_v in {FLASH_HEAD_DIMS}, got d_k = {q.shape[-1]}, "
                f"d_v = {v.shape[-1]}")
    return None


def flash_attention_applies(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """True when ``flash_attention(backend="auto")`` runs the Triton kernel: CUDA inputs it
    supports. (The interpreter is only used when asked for with ``backend="triton"``.)"""
    return q.device.type == "cuda" and _unsupported_reason(q, k, v) is None


class _FlashAttention(torch.autograd.Function):
    """The Triton kernels as one differentiable operation. The forward saves q, k, v, the output
    and one log-sum-exp per query (O(t d) memory); the backward recomputes every tile from them."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool,  # type: ignore[override]
                scale: float) -> Tensor:
        from lecture_pkg.kernels.flash_attention_triton import flash_attention_forward

        out, lse = flash_attention_forward(q, k, v, is_causal=is_causal, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal, ctx.scale = is_causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor  # type: ignore[override]
                 ) -> tuple[Tensor, Tensor, Tensor, None, None]:
        from lecture_pkg.kernels.flash_attention_triton import flash_attention_backward

        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(grad_out, q, k, v, out, lse,
                                              is_causal=ctx.is_causal, scale=ctx.scale)
        return dq, dk, dv, None, None


def triton_flash_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool,
                           scale: float) -> Tensor:
    """Run the Triton FlashAttention kernels: forward, and backward under autograd.
    q: (..., t_q, d), k: (..., t_k, d), v: (..., t_k, d) with identical batch dims; returns
    (..., t_q, d). Raises ValueError when the kernel does not apply (see
    :func:`flash_attention_applies`)."""
    reason = _unsupported_reason(q, k, v)
    if reason is not None:
        raise ValueError(f"the Triton flash-attention kernel {reason}")
    return _FlashAttention.apply(q, k, v, is_causal, scale)


def recorded_gpu_benchmark(gpu: str = "h200") -> dict:
    """A recorded run of ``benchmarks/attention.py --gpu-only``: {"device", "date", "versions",
    "command", "commit", "tokens", "hidden", "rows"}, one row per (dtype, head_dim, n, causal,
    pass) with TFLOP/s of "triton", "sdpa" (torch's choice of kernel) and "sdpa-flash", and the
    max errors of out, dq, dk, dv against float64 for "triton" and "sdpa"."""
    if gpu not in RECORDED_RUNS:
        raise ValueError(f"gpu must be one of {sorted(RECORDED_RUNS)}, got {gpu!r}")
    return json.loads((Path(__file__).with_name(RECORDED_RUNS[gpu])).read_text())
