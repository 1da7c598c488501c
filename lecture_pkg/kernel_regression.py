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

    Working with u^2 avoids a square root (and its infinite gradient at 0) for all kernels but
    the Laplace one.
    """
    if kernel == "gaussian":  # K(u) = exp(-u^2 / 2)
        return -sq_u / 2, torch.ones_like(sq_u, dtype=torch.bool)
    if kernel == "laplace":  # K(u) = exp(-|u|): softmax of the negative distance
        return -sq_u.sqrt(), torch.ones_like(sq_u, dtype=torch.bool)
    if kernel == "boxcar":  # K(u) = 1 for |u| <= 1
        return torch.zeros_like(sq_u), sq_u <= 1
    if kernel == "epanechnikov":  # K(u) = 3/4 (1 - u^2) for |u| < 1; the 3/4 cancels
        support = sq_u < 1
        return torch.log1p(-sq_u.clamp(max=1.0)), support
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def kernel_profile(kernel: Kernel, u: Tensor) -> Tensor:
    """The (unnormalised) kernel K(u), for plotting its shape. u: any shape."""
    log_k, support = _log_kernel(kernel, u * u)
    return torch.where(support, log_k.exp(), torch.zeros_like(u))


def _as_matrix(x: Tensor, name: str) -> Tensor:
    check_float_tensor(name, x)
    if x.dim() not in (1, 2):
        raise ValueError(f"{name} must have shape (n,) or (n, d), got {tuple(x.shape)}")
    return x[:, None] if x.dim() == 1 else x


def _check_inputs(x_query: Tensor, x_train: Tensor, y_train: Tensor) -> tuple[Tensor, Tensor]:
    queries, keys = _as_matrix(x_query, "x_query"), _as_matrix(x_train, "x_train")
    _as_matrix(y_train, "y_train")
    for name, t in (("x_train", x_train), ("y_train", y_train)):
        if t.dtype != x_query.dtype or t.device != x_query.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device} but x_query is {x_query.dtype} on "
                             f"{x_query.device}; all inputs must share dtype and device")
    if keys.shape[0] == 0:
        raise ValueError("x_train is empty: need at least one training pair")
    if queries.shape[1] != keys.shape[1]:
        raise ValueError(f"x_query has {queries.shape[1]} features but x_train has {keys.shape[1]} "
                         f"(shapes {tuple(x_query.shape)} and {tuple(x_train.shape)})")
    if y_train.shape[0] != keys.shape[0]:
        raise ValueError(f"y_train has {y_train.shape[0]} rows but x_train has {keys.shape[0]} "
                         f"(one target per training point)")
    return queries, keys


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
            enters the support); "raise" raises a
            ValueError naming the queries. A row that the mask blocks entirely gets zero weights
            and a zero prediction, as a fully masked attention row does.

    Returns:
        predictions: (m,) if y_train is (n,), else (m, d_y).
        weights: (m, n); each row is non-negative and sums to 1 (0 for fully masked rows).
        dtype and device follow the inputs.
    """
    queries, keys = _check_inputs(x_query, x_train, y_train)
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

    sq_dist = (queries[:, None, :] - keys[None, :, :]).pow(2).sum(-1)  # (m, n)
    log_k, support = _log_kernel(kernel, sq_dist / bandwidth**2)
    allowed = support & mask
    scores = log_k.masked_fill(~allowed, torch.finfo(log_k.dtype).min)
    weights = torch.softmax(scores, dim=-1) * allowed  # exact zeros where not allowed

    empty = ~allowed.any(-1) & mask.any(-1)  # compact support caught no allowed point
    if bool(empty.any()):
        if on_empty == "raise":
            rows = empty.nonzero().flatten().tolist()
            raise ValueError(f"no training point within bandwidth {bandwidth.item():g} of queries "
                             f"{rows[:10]} for the {kernel} kernel; widen the bandwidth or use "
                             f"on_empty='nearest'")
        allowed_dist = sq_dist.masked_fill(~mask, math.inf)
        nearest = (allowed_dist == allowed_dist.min(-1, keepdim=True).values) & mask
        nearest = nearest.to(weights.dtype) / nearest.sum(-1, keepdim=True).clamp(min=1)  # ties share
        weights = torch.where(empty[:, None], nearest, weights)
    return weights @ y_train, weights


class NadarayaWatson(nn.Module):
    """Nadaraya-Watson regression with a learnable bandwidth: attention pooling you can train.

    forward(queries, keys, values, mask=None) -> (predictions, weights), with queries (m,) or
    (m, d), keys (n,) or (n, d), values (n,) or (n, d_v) and weights (m, n), as in
    :func:`nadaraya_watson`. The bandwidth is stored as its logarithm so that gradient steps keep
    it positive. The last weights are kept in ``self.attention_weights`` for plotting.
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
        bandwidth = self.bandwidth.to(dtype=queries.dtype, device=queries.device)
        predictions, weights = nadaraya_watson(queries, keys, values, self.kernel, bandwidth, mask)
        self.attention_weights = weights.detach()
        return predictions, weights

    def extra_repr(self) -> str:
        return f"kernel={self.kernel!r}, bandwidth={self.bandwidth.item():.4g}"
