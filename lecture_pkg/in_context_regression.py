"""In-context regression (chapter 10.1): a Transformer that learns to learn from the examples
in its prompt.

Every training sequence is a new task: a random function f, points x_1..x_n and their values
y_i = f(x_i). The model reads ``x_1, y_1, x_2, y_2, ..., x_n, y_n`` (one token per number
vector, as Garg et al. 2022 set it up) and, at each x_i, predicts y_i from the pairs before it.
No weight changes between tasks: whatever fitting happens, happens in the forward pass. The
baselines are the estimators a statistician would use on the same prefix: least squares
(:func:`prefix_least_squares`, optimal for noiseless linear tasks) and Nadaraya-Watson
(:func:`prefix_nadaraya_watson`, :mod:`lecture_pkg.kernel_regression`), which is one softmax
attention head whose query and key are x and whose value is y.

Shapes: xs (batch, n, d), ys (batch, n); predictions (batch, n), entry i made from pairs < i.

The in-context task on text, few-shot prompts of a pretrained GPT, is in
:mod:`lecture_pkg.shakespeare_tasks`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lecture_pkg.checks import check_float_tensor, check_int
from lecture_pkg.kernel_regression import nadaraya_watson
from lecture_pkg.layers import EncoderLayer

__all__ = ["ICLTransformer", "linear_tasks", "lipschitz_tasks", "prefix_least_squares",
           "prefix_nadaraya_watson"]


def linear_tasks(batch: int, n_points: int, dim: int, generator: torch.Generator | None = None,
                 noise: float = 0.0) -> tuple[Tensor, Tensor]:
    """Random linear tasks y = w . x (+ noise), with w and x standard normal.
    Returns xs (batch, n_points, dim) and ys (batch, n_points)."""
    for name, value in (("batch", batch), ("n_points", n_points), ("dim", dim)):
        check_int(name, value, minimum=1)
    xs = torch.randn(batch, n_points, dim, generator=generator)
    w = torch.randn(batch, dim, 1, generator=generator)
    ys = (xs @ w).squeeze(-1)
    if noise:
        ys = ys + noise * torch.randn(batch, n_points, generator=generator)
    return xs, ys


def lipschitz_tasks(batch: int, n_points: int, lipschitz: float,
                    generator: torch.Generator | None = None,
                    noise: float = 0.0) -> tuple[Tensor, Tensor]:
    """Random 1-D functions with Lipschitz constant at most ``lipschitz`` on [-1, 1]:
    f(x) = (L / k) sin(k x + phi) averaged over three random frequencies k in [1, 4] (each
    term's slope is at most L / 3). xs (batch, n_points, 1) uniform on [-1, 1]; ys (batch,
    n_points) = f(xs) (+ noise times standard normal noise, drawn after the functions)."""
    check_int("batch", batch, minimum=1)
    check_int("n_points", n_points, minimum=1)
    if not lipschitz > 0:
        raise ValueError(f"lipschitz must be positive, got {lipschitz}")
    xs = torch.rand(batch, n_points, 1, generator=generator) * 2 - 1
    k = torch.rand(batch, 1, 3, generator=generator) * 3 + 1
    phase = torch.rand(batch, 1, 3, generator=generator) * 2 * torch.pi
    ys = (lipschitz / (3 * k) * torch.sin(k * xs + phase)).sum(-1)
    if noise:
        ys = ys + noise * torch.randn(batch, n_points, generator=generator)
    return xs, ys


def _check_tasks(xs: Tensor, ys: Tensor) -> None:
    check_float_tensor("xs", xs)
    check_float_tensor("ys", ys)
    if xs.dim() != 3 or ys.shape != xs.shape[:2]:
        raise ValueError(f"xs must be (batch, n, d) and ys (batch, n), got {tuple(xs.shape)} "
                         f"and {tuple(ys.shape)}")


def prefix_least_squares(xs: Tensor, ys: Tensor) -> Tensor:
    """Least squares on each prefix: entry i is x_i . w_i, w_i the minimum-norm solution of the
    pairs before i (0 for i = 0). (batch, n)."""
    _check_tasks(xs, ys)
    predictions = torch.zeros_like(ys)
    for i in range(1, xs.shape[1]):
        w = torch.linalg.pinv(xs[:, :i]) @ ys[:, :i, None]  # (batch, d, 1)
        predictions[:, i] = (xs[:, i:i + 1] @ w).flatten()
    return predictions


def prefix_nadaraya_watson(xs: Tensor, ys: Tensor, bandwidth: float | Tensor) -> Tensor:
    """Gaussian Nadaraya-Watson on each prefix: entry i pools the y_j, j < i, with weights
    softmax(-||x_i - x_j||^2 / (2 h^2)); entry 0 has nothing to pool and is 0. (batch, n)."""
    _check_tasks(xs, ys)
    n = xs.shape[1]
    earlier = torch.ones(n, n, dtype=torch.bool, device=xs.device).tril(-1)
    return torch.stack([nadaraya_watson(x, x, y, "gaussian", bandwidth, mask=earlier)[0]
                        for x, y in zip(xs, ys)])


class ICLTransformer(nn.Module):
    """A small GPT-like model over the interleaved sequence x_1, y_1, ..., x_n, y_n.

    Each token is a (dim + 1)-vector, [x, 0] or [0, y], mapped to d_model by one linear layer,
    plus a learned position embedding; pre-LN causal blocks (:class:`EncoderLayer`); a linear
    read-out of the hidden state at every x token. forward(xs (batch, n, dim), ys (batch, n))
    -> predictions (batch, n): entry i sees x_1, y_1, ..., x_i but not y_i.
    """

    def __init__(self, dim: int, max_points: int, d_model: int = 64, n_layer: int = 2,
                 n_head: int = 4) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("max_points", max_points), ("d_model", d_model),
                            ("n_layer", n_layer), ("n_head", n_head)):
            check_int(name, value, minimum=1)
        self.dim, self.max_points = dim, max_points
        self.read_in = nn.Linear(dim + 1, d_model)
        self.position = nn.Embedding(2 * max_points, d_model)
        self.blocks = nn.ModuleList(
            EncoderLayer(d_model, n_head, 4 * d_model, dropout=0.0, activation="gelu",
                         wiring="pre") for _ in range(n_layer))
        self.norm = nn.LayerNorm(d_model)
        self.read_out = nn.Linear(d_model, 1)

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        _check_tasks(xs, ys)
        batch, n, dim = xs.shape
        if dim != self.dim or n > self.max_points:
            raise ValueError(f"xs must be (batch, n <= {self.max_points}, {self.dim}), "
                             f"got {tuple(xs.shape)}")
        x_tokens = torch.cat([xs, torch.zeros_like(xs[..., :1])], dim=-1)
        y_tokens = torch.cat([torch.zeros_like(xs), ys[..., None]], dim=-1)
        tokens = torch.stack([x_tokens, y_tokens], dim=2).view(batch, 2 * n, dim + 1)
        h = self.read_in(tokens) + self.position.weight[:2 * n]
        for block in self.blocks:
            h, _ = block(h, is_causal=True)
        return self.read_out(self.norm(h[:, ::2])).squeeze(-1)
