"""Muon: momentum, then the update's matrix orthogonalised (Jordan et al. 2024).

AdamW scales each coordinate of the update by its own running size. Muon treats a weight matrix
as a matrix: it keeps a momentum buffer of the gradient, replaces that matrix ``M = U S V^T`` by
(approximately) ``U V^T``, all singular values set to one, and steps along it. Every direction
of the layer moves by the same amount, however small its gradient was.

1. ``newton_schulz``: ``U V^T`` without an SVD, by five steps of a quintic polynomial iteration
   (matrix products only, so it runs in bf16 on a GPU). Its coefficients are chosen for speed, not
   convergence: the singular values come out between about 0.7 and 1.2, not exactly 1.
2. ``Muon``: the optimiser for 2-D weights: Nesterov momentum, the orthogonalised update, a learning
   rate scaled by ``sqrt(max(1, rows / cols))``, decoupled weight decay. Equal to
   ``torch.optim.Muon`` (tests/test_muon.py).
3. ``muon_and_adamw``: the usual split: Muon for the hidden matrices, AdamW for embeddings, the
   output layer and every vector (norm gains, biases), as nanochat and Moonlight do.

Shapes: a parameter of shape (rows, cols); the iteration works on the wide orientation
(rows <= cols) and transposes back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

# Keller Jordan's quintic coefficients: a steep slope at 0 pulls small singular values up fast.
COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(matrix: Tensor, steps: int = 5, coefficients: tuple[float, float, float] = COEFFICIENTS,
                  eps: float = 1e-7, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """Approximately ``U V^T`` for ``matrix = U S V^T``: (rows, cols) -> (rows, cols), in ``dtype``.

    Each step maps ``X -> a X + (b X X^T + c (X X^T)^2) X``, which acts on every singular value
    alone (``s -> a s + b s^3 + c s^5``) and leaves the singular vectors unchanged. Dividing by
    the Frobenius norm first puts every singular value in (0, 1].
    """
    if matrix.dim() != 2:
        raise ValueError(f"matrix must be 2-D (rows, cols), got shape {tuple(matrix.shape)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    a, b, c = coefficients
    x = matrix.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters (see the module docstring); the same defaults as
    ``torch.optim.Muon``."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 1e-3,
                 weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
                 steps: int = 5, eps: float = 1e-7) -> None:
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                  "nesterov": nesterov, "steps": steps, "eps": eps})
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"params: Muon updates 2-D matrices only, got a parameter of "
                                     f"shape {tuple(p.shape)}; give vectors to AdamW")

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 (torch.optim.Optimizer's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buffer = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buffer.lerp_(p.grad, 1 - mu)
                direction = p.grad.lerp(buffer, mu) if group["nesterov"] else buffer
                update = newton_schulz(direction, group["steps"], eps=group["eps"])
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-lr * math.sqrt(max(1, p.size(0) / p.size(1))))
        return loss


def muon_and_adamw(model: nn.Module, muon_lr: float, adamw_lr: float, weight_decay: float = 0.1,
                   betas: tuple[float, float] = (0.9, 0.95)) -> list[torch.optim.Optimizer]:
    """[Muon for the hidden matrices, AdamW for the rest]: step both every iteration.

    Embedding tables and the output layer (the modules named ``lm_head`` or ``*_head``) stay with
    AdamW: their rows are tokens, not directions of a linear map. AdamW decays only the matrices.
    """
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head_ids = {id(p) for name, m in model.named_modules() if name.endswith("head")
                for p in m.parameters()}
    hidden, adam_matrices, vectors = [], [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.dim() < 2:
            vectors.append(p)
        elif id(p) in embedding_ids or id(p) in head_ids:
            adam_matrices.append(p)
        else:
            hidden.append(p)
    adamw = torch.optim.AdamW([{"params": adam_matrices, "weight_decay": weight_decay},
                               {"params": vectors, "weight_decay": 0.0}], lr=adamw_lr, betas=betas)
    return [Muon(hidden, lr=muon_lr, weight_decay=weight_decay), adamw]
