"""Nadaraya-Watson kernel regression: attention pooling before attention had a name.

Given training pairs (x_i, y_i), the prediction at a query x is a weighted mean of the y_i:

    f(x) = sum_i  a(x, x_i) y_i,     a(x, x_i) = K(||x - x_i|| / h) / sum_j K(||x - x_j|| / h)

Read x as a query, the x_i as keys and the y_i as values, and this is attention: the weights
a(x, .) are non-negative and sum to one, so every prediction is a convex combination of values.
With the Gaussian kernel the weights are exactly softmax(-||x - x_i||^2 / (2 h^2)).

Each kernel is written as a log-kernel so that the softmax kernels (gaussian, laplace) stay
numerically stable and the compact ones (boxcar, epanechnikov) give exact zeros outside their
support.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from lecture_pkg.checks import check_float_tensor

__all__ = ["KERNELS", "NadarayaWatson", "kernel_profile", "nadaraya_watson"]

KERNELS = ("gaussian", "laplace", "boxcar", "epanechnikov")
Kernel = Literal["gaussian", "laplace", "boxcar", "epanechnikov"]
OnEmpty = Literal["nearest", "raise"]


def _log_kernel(kernel: str, sq_u: Tensor) -> tuple[Tensor, Tensor]:
    """log K(u) and the support {K(u) > 0} as functions of u^2 = (distance / bandwidth)^2.

    Working with u^2 avoids a square root for all kernels but the Laplace one. Each branch keeps
    its gradient finite where a query coincides with a key (u = 0) and outside the support.
    """
    everywhere = torch.ones_like(sq_u, dtype=torch.bool)
    if kernel == "gaussian":  # K(u) = exp(-u^2 / 2)
        return -sq_u / 2, everywhere
    if kernel == "laplace":  # K(u) = exp(-|u|): softmax of the negative distance
        return -_safe_sqrt(sq_u), everywhere
    if kernel == "boxcar":  # K(u) = 1 for |u| <= 1: no gradient in the bandwidth
        return torch.zeros_like(sq_u), sq_u <= 1
    if kernel == "epanechnikov":  # K(u) = 3/4 (1 - u^2) for |u| < 1; the 3/4 cancels
        support = sq_u < 1
        # 0 outside the support, so that log1p's gradient 1 / (1 - u^2) never meets u^2 >= 1
        return torch.log1p(-torch.where(support, sq_u, 0.0)), support
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def _safe_sqrt(x: Tensor) -> Tensor:
    """sqrt(x) for x >= 0 with gradient 0 instead of NaN at x = 0 (the double-where trick).

    sqrt's derivative 1 / (2 sqrt(x)) is infinite at 0, and infinity times the zero that flows
    back from a masked entry is NaN. The inner where feeds sqrt a harmless 1 at the zeros, so its
    backward never divides by 0; the outer where puts the 0s back and sends them no gradient.
    """
    positive = x > 0
    return torch.where(positive, torch.where(positive, x, 1.0).sqrt(), 0.0)


def kernel_profile(kernel: Kernel, u: Tensor) -> Tensor:
    """The (unnormalised) kernel K(u), for plotting its shape. u: any shape."""
    log_k, support = _log_kernel(kernel, u * u)
    return torch.where(support, log_k.exp(), torch.zeros_like(u))


def _as_matrix(x: Tensor, name: str) -> Tensor:
    check_float_tensor(name, x)
    if x.dim() not in (1, 2):
        raise ValueError(f"{name} must have shape (n,) or (n, d), got {tuple(x.shape)}")
    return x[:, None] if x.dim() == 1 else x


def _check_arguments(x_query: Tensor, x_train: Tensor, y_train: Tensor, kernel: str,
                     bandwidth: float | Tensor, mask: Tensor | None,
                     on_empty: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Everything :func:`nadaraya_watson` checks, so that its body shows only the computation.
    Returns queries (m, d), keys (n, d), the bandwidth as a scalar tensor and the (m, n) mask."""
    queries, keys = _as_matrix(x_query, "x_query"), _as_matrix(x_train, "x_train")
    _as_matrix(y_train, "y_train")
    for name, t in (("x_train", x_train), ("y_train", y_train)):
        if t.dtype != x_query.dtype or t.device != x_query.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device} but x_query is {x_query.dtype} "
                             f"on {x_query.device}; all inputs must share dtype and device")
    if keys.shape[0] == 0:
        raise ValueError("x_train is empty: need at least one training pair")
    if queries.shape[1] != keys.shape[1]:
        raise ValueError(f"x_query has {queries.shape[1]} features but x_train has "
                         f"{keys.shape[1]} (shapes {tuple(x_query.shape)} and "
                         f"{tuple(x_train.shape)})")
    if y_train.shape[0] != keys.shape[0]:
        raise ValueError(f"y_train has {y_train.shape[0]} rows but x_train has {keys.shape[0]} "
                         f"(one target per training point)")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if on_empty not in ("nearest", "raise"):
        raise ValueError(f"on_empty must be 'nearest' or 'raise', got {on_empty!r}")
    bandwidth = torch.as_tensor(bandwidth, dtype=x_query.dtype, device=x_query.device)
    if bandwidth.dim() != 0:
        raise ValueError(f"bandwidth must be a scalar, got shape {tuple(bandwidth.shape)}")
    if not bool(bandwidth > 0):
        raise ValueError(f"bandwidth must be positive, got {bandwidth.item()}")
    m, n = queries.shape[0], keys.shape[0]
    if mask is None:
        mask = torch.ones(m, n, dtype=torch.bool, device=x_query.device)
    elif mask.dtype != torch.bool or tuple(mask.shape) != (m, n):
        raise ValueError(f"mask must be a bool tensor of shape ({m}, {n}) = (queries, training "
                         f"points), got {mask.dtype} of shape {tuple(mask.shape)}")
    return queries, keys, bandwidth, mask


def _nearest_weights(sq_dist: Tensor, mask: Tensor) -> Tensor:
    """(m, n) weights putting each row's mass on its nearest allowed key, ties sharing equally."""
    allowed_dist = sq_dist.masked_fill(~mask, math.inf)
    nearest = (allowed_dist == allowed_dist.min(-1, keepdim=True).values) & mask
    return nearest.to(sq_dist.dtype) / nearest.sum(-1, keepdim=True).clamp(min=1)


def nadaraya_watson(
    x_query: Tensor,
    x_train: Tensor,
    y_train: Tensor,
    kernel: Kernel = "gaussian",
    bandwidth: float | Tensor = 1.0,
    mask: Tensor | None = None,
    on_empty: OnEmpty = "nearest",
) -> tuple[Tensor, Tensor]:
    """Nadaraya-Watson regression, i.e. attention pooling with a distance-based score.

    Args:
        x_query: (m,) or (m, d) query points.
        x_train: (n,) or (n, d) training inputs (the keys); same feature count as x_query.
        y_train: (n,) or (n, d_y) training targets (the values).
        kernel: "gaussian" (softmax of -||x - x_i||^2 / (2 h^2)), "laplace" (softmax of
            -||x - x_i|| / h), "boxcar" (uniform over ||x - x_i|| <= h) or "epanechnikov"
            (weights proportional to 1 - (||x - x_i|| / h)^2 inside the support).
        bandwidth: h > 0, a float or a scalar tensor (which may require grad).
        mask: optional (m, n) bool, True = query i may use training point j.
        on_empty: what a query with no allowed training point inside a compact kernel's support
            gets: "nearest" puts all its weight on the nearest allowed training point, shared
            equally between ties (the limit of the weights as h grows until the first point
            enters the support); "raise" raises a ValueError naming the queries. A row that
            the mask blocks entirely gets zero weights and a zero prediction, as a fully masked
            attention row does.

    Returns:
        predictions: (m,) if y_train is (n,), else (m, d_y).
        weights: (m, n); each row is non-negative and sums to 1 (0 for fully masked rows).
        dtype and device follow the inputs.
    """
    queries, keys, bandwidth, mask = _check_arguments(x_query, x_train, y_train, kernel,
                                                      bandwidth, mask, on_empty)
    sq_dist = (queries[:, None, :] - keys[None, :, :]).pow(2).sum(-1)  # (m, n)
    log_k, support = _log_kernel(kernel, sq_dist / bandwidth**2)
    allowed = support & mask
    scores = log_k.masked_fill(~allowed, torch.finfo(log_k.dtype).min)
    weights = torch.softmax(scores, dim=-1) * allowed  # exact zeros where not allowed

    empty = ~allowed.any(-1) & mask.any(-1)  # compact support caught no allowed point
    if bool(empty.any()):
        if on_empty == "raise":
            rows = empty.nonzero().flatten().tolist()
            raise ValueError(f"no training point within bandwidth {bandwidth.item():g} of "
                             f"queries {rows[:10]} for the {kernel} kernel; widen the bandwidth "
                             f"or use on_empty='nearest'")
        weights = torch.where(empty[:, None], _nearest_weights(sq_dist, mask), weights)
    return weights @ y_train, weights


class NadarayaWatson(nn.Module):
    """Nadaraya-Watson regression with a learnable bandwidth: attention pooling you can train.

    forward(queries, keys, values, mask=None) -> (predictions, weights), with queries (m,) or
    (m, d), keys (n,) or (n, d), values (n,) or (n, d_v) and weights (m, n), as in
    :func:`nadaraya_watson`. The bandwidth is stored as its logarithm so that gradient steps keep
    it positive. The last weights are kept in ``self.attention_weights`` for plotting.

    The gaussian, laplace and epanechnikov kernels can be trained: their weights are
    differentiable in the bandwidth, with finite gradients also where a query coincides with a
    key. The boxcar's weights are piecewise constant in the bandwidth (its gradient is 0 almost
    everywhere), so a forward pass that would train it raises a RuntimeError; evaluate it under
    ``torch.no_grad()`` or freeze ``log_bandwidth``.
    """

    def __init__(self, kernel: Kernel = "gaussian", bandwidth: float = 1.0) -> None:
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        if not bandwidth > 0:
            raise ValueError(f"bandwidth must be positive, got {bandwidth}")
        self.kernel = kernel
        self.log_bandwidth = nn.Parameter(torch.tensor(math.log(bandwidth)))
        self.attention_weights: Tensor | None = None

    @property
    def bandwidth(self) -> Tensor:
        return self.log_bandwidth.exp()

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if self.kernel == "boxcar" and self.log_bandwidth.requires_grad \
                and torch.is_grad_enabled():
            raise RuntimeError("the boxcar kernel cannot learn its bandwidth: its weights are "
                               "piecewise constant in h, so the gradient is 0 almost everywhere; "
                               "train gaussian, laplace or epanechnikov instead, or evaluate "
                               "under torch.no_grad() / after log_bandwidth.requires_grad_(False)")
        bandwidth = self.bandwidth.to(dtype=queries.dtype, device=queries.device)
        predictions, weights = nadaraya_watson(queries, keys, values, self.kernel, bandwidth,
                                               mask)
        self.attention_weights = weights.detach()
        return predictions, weights

    def extra_repr(self) -> str:
        return f"kernel={self.kernel!r}, bandwidth={self.bandwidth.item():.4g}"
