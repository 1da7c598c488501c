"""DETR, detection Transformer (Carion et al., 2020), at toy size.

What is particular to DETR, on top of the encoder and decoder layers of :mod:`lecture_pkg.layers`:

1. a small CNN backbone (:class:`Backbone`) whose feature map (batch, d_model, h, w) is
   flattened into h * w tokens;
2. 2-D positions for those tokens: :func:`sine_positions_2d` (x and y encoded independently
   with sines and cosines and concatenated, DETR's choice), a learned table, or none;
   here they are added once at the encoder's input ("sine at input", a row of the paper's
   Table 3), not inside every attention layer as in the full model;
3. ``num_queries`` learned *object queries*: the decoder's input, attending to each other
   (not causally) and to the encoded image;
4. two heads shared by all queries: a class head with one extra "no object" logit and a box
   head (a 3-layer MLP, sigmoid) predicting normalised (cx, cy, w, h). The same heads read
   every decoder layer's output, for DETR's auxiliary losses.

The set loss, the matching, the AP metric and the shipped checkpoint are in
:mod:`lecture_pkg.detection`.

Shapes: images (batch, channels, size, size); logits (batch, queries, classes + 1);
boxes (batch, queries, 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn

from lecture_pkg.checks import check_int
from lecture_pkg.layers import DecoderLayer, EncoderLayer
from lecture_pkg.models.vit import check_pixels

__all__ = ["DETR", "DETRConfig", "DETROutput", "Backbone", "sine_positions_2d"]

Positions = Literal["sine", "learned", "none"]


@dataclass(frozen=True)
class DETRConfig:
    """Sizes of a small DETR. The backbone halves the image ``backbone_stages`` times."""

    image_size: int = 32
    num_channels: int = 3
    num_classes: int = 3
    d_model: int = 64
    num_heads: int = 4
    d_ff: int = 128
    encoder_layers: int = 2
    decoder_layers: int = 2
    num_queries: int = 8
    backbone_stages: int = 2
    backbone_width: int = 32
    positions: Positions = "sine"
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("image_size", "num_channels", "num_classes", "d_model", "num_heads",
                     "d_ff", "num_queries", "backbone_stages", "backbone_width"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("encoder_layers", "decoder_layers"):
            check_int(name, getattr(self, name), minimum=0)
        if self.d_model % 4:
            raise ValueError(f"d_model must be divisible by 4 (2-D sine positions), "
                             f"got {self.d_model}")
        if self.image_size % 2 ** self.backbone_stages:
            raise ValueError(f"image_size {self.image_size} must be divisible by "
                             f"2 ** backbone_stages = {2 ** self.backbone_stages}")
        if self.positions not in ("sine", "learned", "none"):
            raise ValueError(f"positions must be 'sine', 'learned' or 'none', "
                             f"got {self.positions!r}")

    @property
    def grid(self) -> int:
        """Side of the backbone's feature map."""
        return self.image_size // 2 ** self.backbone_stages


def sine_positions_2d(height: int, width: int, d_model: int,
                      temperature: float = 10000.0) -> Tensor:
    """DETR's fixed 2-D positions: (height * width, d_model), row-major.

    Coordinates are normalised to (0, 2 pi]: y = 2 pi (row + 1) / height, likewise x. Each
    half of d_model encodes one axis as [sin(y / T^(0/D)), cos(y / T^(0/D)),
    sin(y / T^(2/D)), cos(y / T^(2/D)), ...] with D = d_model / 2; the y half comes first."""
    check_int("height", height, minimum=1)
    check_int("width", width, minimum=1)
    check_int("d_model", d_model, minimum=4)
    if d_model % 4:
        raise ValueError(f"d_model must be divisible by 4, got {d_model}")
    half = d_model // 2
    freqs = temperature ** (2 * (torch.arange(half, dtype=torch.float64) // 2) / half)
    y = (torch.arange(1, height + 1, dtype=torch.float64) / height * 2 * math.pi)
    x = (torch.arange(1, width + 1, dtype=torch.float64) / width * 2 * math.pi)

    def encode(coord: Tensor) -> Tensor:  # (n,) -> (n, half), sin on even, cos on odd
        angles = coord[:, None] / freqs
        return torch.stack([angles[:, 0::2].sin(), angles[:, 1::2].cos()], -1).flatten(1)

    pos_y = encode(y)[:, None, :].expand(height, width, half)
    pos_x = encode(x)[None, :, :].expand(height, width, half)
    return torch.cat([pos_y, pos_x], -1).reshape(height * width, d_model).float()


class Backbone(nn.Module):
    """``stages`` x (3x3 conv stride 2, BatchNorm, ReLU, 3x3 conv, BatchNorm, ReLU), widths
    doubling from ``width``, then a 1x1 projection to d_model (DETR's ``input_proj``).

    forward(images (b, c, s, s)) -> (b, d_model, s / 2^stages, s / 2^stages)."""

    def __init__(self, num_channels: int, d_model: int, stages: int, width: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = num_channels
        for _ in range(stages):
            layers += [nn.Conv2d(c_in, width, 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(width), nn.ReLU(),
                       nn.Conv2d(width, width, 3, padding=1, bias=False),
                       nn.BatchNorm2d(width), nn.ReLU()]
            c_in, width = width, width * 2
        self.body = nn.Sequential(*layers)
        self.proj = nn.Conv2d(c_in, d_model, 1)

    def forward(self, images: Tensor) -> Tensor:
        return self.proj(self.body(images))


class DETROutput(NamedTuple):
    """logits: (b, queries, classes + 1), last = "no object"; boxes: (b, queries, 4) cxcywh in
    (0, 1); aux: the (logits, boxes) of every earlier decoder layer."""

    logits: Tensor
    boxes: Tensor
    aux: list[tuple[Tensor, Tensor]]


class DETR(nn.Module):
    """Backbone -> + positions -> Transformer encoder -> decoder over learned object queries ->
    class and box heads. Pre-norm layers with a final LayerNorm on each side (the decoder's is
    applied to every layer's output before the heads)."""

    def __init__(self, config: DETRConfig) -> None:
        super().__init__()
        self.config = c = config
        self.backbone = Backbone(c.num_channels, c.d_model, c.backbone_stages,
                                 c.backbone_width)
        tokens = c.grid * c.grid
        if c.positions == "sine":
            self.register_buffer("position", sine_positions_2d(c.grid, c.grid, c.d_model),
                                 persistent=False)
        elif c.positions == "learned":
            self.position = nn.Parameter(torch.randn(tokens, c.d_model) * 0.02)
        else:
            self.position = None
        layer = {"d_model": c.d_model, "num_heads": c.num_heads, "d_ff": c.d_ff,
                 "dropout": c.dropout, "wiring": "pre"}
        self.encoder = nn.ModuleList([EncoderLayer(**layer) for _ in range(c.encoder_layers)])
        self.encoder_norm = nn.LayerNorm(c.d_model)
        self.queries = nn.Parameter(torch.randn(c.num_queries, c.d_model))
        self.decoder = nn.ModuleList([DecoderLayer(**layer) for _ in range(c.decoder_layers)])
        self.decoder_norm = nn.LayerNorm(c.d_model)
        self.class_head = nn.Linear(c.d_model, c.num_classes + 1)
        self.box_head = nn.Sequential(nn.Linear(c.d_model, c.d_model), nn.ReLU(),
                                      nn.Linear(c.d_model, c.d_model), nn.ReLU(),
                                      nn.Linear(c.d_model, 4))

    def encode(self, images: Tensor) -> Tensor:
        """(b, c, s, s) -> memory (b, grid^2, d_model)."""
        images = check_pixels(images, self.config.num_channels)
        if images.shape[-2:] != (self.config.image_size,) * 2:
            raise ValueError(f"images must be {self.config.image_size}x"
                             f"{self.config.image_size}, got {tuple(images.shape[-2:])}")
        x = self.backbone(images).flatten(2).transpose(1, 2)
        if self.position is not None:
            x = x + self.position
        for layer in self.encoder:
            x, _ = layer(x)
        return self.encoder_norm(x)

    def heads(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Decoder states (b, queries, d_model) -> (logits, boxes)."""
        h = self.decoder_norm(h)
        return self.class_head(h), self.box_head(h).sigmoid()

    def forward(self, images: Tensor) -> DETROutput:
        memory = self.encode(images)
        y = self.queries.expand(memory.shape[0], -1, -1)
        outputs = []
        for layer in self.decoder:
            y, _, _ = layer(y, memory, tgt_is_causal=False)
            outputs.append(self.heads(y))
        if not outputs:
            outputs.append(self.heads(y))
        logits, boxes = outputs[-1]
        return DETROutput(logits, boxes, outputs[:-1])

    @torch.no_grad()
    def predict(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Every query as a detection: (boxes (b, q, 4), scores (b, q), classes (b, q)), the
        score being the largest probability of a real class (DETR's evaluation)."""
        out = self(images)
        probs = out.logits.softmax(-1)[..., :-1]
        scores, classes = probs.max(-1)
        return out.boxes, scores, classes
