"""Attention maps with a known answer: attention rollout (Abnar & Zuidema, 2020) and a
hand-built ViT on which its result is known exactly (chapter 8's "Looking inside").

1. :func:`attention_rollout`: the per-layer attention weights a model returns, followed through
   the stack: heads averaged, the residual connection added as an identity, layers multiplied;
2. :func:`spotlight_vit`: a ViT whose every head in every layer attends (almost) only to one
   chosen token, whatever the image, so that rollout must send everything to that token. A map
   that does not show it is a broken map.

Shapes: attentions, one (batch, heads, t, t) tensor per layer, first layer first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from lecture_pkg.checks import check_int
from lecture_pkg.models.vit import ViT, ViTConfig

__all__ = ["attention_rollout", "spotlight_vit"]


def attention_rollout(attentions: Sequence[Tensor], residual: float = 0.5) -> Tensor:
    """Attention rollout: how much of each input token reaches each token's final state, if
    information moved only along the attention weights.

    attentions: one (batch, heads, t, t) tensor per layer, first layer first, rows summing to
    one (the ``attentions`` of a ``ViT`` run with ``output_attentions=True``). Each layer's
    heads are averaged and the residual connection added as an identity,
    ``A~ = (1 - residual) * mean_h(A) + residual * I``, and the layers are multiplied top down:
    ``R = A~_L ... A~_1``. Returns R, (batch, t, t): row i the share of every input token in
    token i's final state (rows sum to one). ``residual=0.5`` is the paper's choice;
    ``residual=0`` multiplies the raw head-averaged weights."""
    if len(attentions) == 0:
        raise ValueError("attentions must hold at least one layer's weights")
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be in [0, 1], got {residual}")
    shape = attentions[0].shape
    if len(shape) != 4 or shape[-1] != shape[-2]:
        raise ValueError(f"attentions must be (batch, heads, t, t) per layer, got {tuple(shape)}")
    rollout = None
    for layer, weights in enumerate(attentions):
        if weights.shape[0] != shape[0] or weights.shape[-2:] != shape[-2:]:
            raise ValueError(f"attentions[{layer}] has shape {tuple(weights.shape)}, "
                             f"but attentions[0] has {tuple(shape)}")
        eye = torch.eye(shape[-1], dtype=weights.dtype, device=weights.device)
        mixed = (1 - residual) * weights.mean(dim=1) + residual * eye
        rollout = mixed if rollout is None else mixed @ rollout
    return rollout


def spotlight_vit(config: ViTConfig, token: int, strength: float = 60.0) -> ViT:
    """A ViT of ``config`` whose every head in every layer puts almost all its attention on
    ``token`` (0 is [CLS], 1..N the patches), for any image.

    Every weight is zero except the LayerNorm gains (one), ``token``'s position vector (+1, -1,
    +1, ... across the width), the key projections (identity) and the query biases
    (``strength`` times ``token``'s normalised vector n, entries about +-1). So every other
    token's stream is zero and its score zero, while ``token`` scores
    ``strength * |n_head|^2 / sqrt(d_head)``, about ``strength * sqrt(d_head)``, in every head;
    values, outputs and
    feed-forward blocks are zero, so the stream, and with it the attention, is the same in every
    layer. Rollout with ``residual=0`` is then (to within e^-score) a matrix whose every row is
    one-hot at ``token``."""
    model = ViT(config)
    check_int("token", token, minimum=0)
    t = model.position.shape[1]
    if config.positions != "1d" or token >= t:
        raise ValueError(f"token must index one of the {t} rows of a 1-D position table, "
                         f"got {token} with positions={config.positions!r}")
    d = config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        model.position[0, token] = torch.tensor([1.0, -1.0]).repeat(d // 2 + 1)[:d]
        spot = F.layer_norm(model.position[0, token], (d,), eps=config.eps)
        for layer in model.layers:
            layer.self_attn.k_proj.weight.copy_(torch.eye(d))
            layer.self_attn.q_proj.bias.copy_(strength * spot)
    return model
