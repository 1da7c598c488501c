"""MAE, masked autoencoders (He et al., 2022): BERT's masked-token task for image patches.

What is particular to MAE, on top of the ViT of :mod:`lecture_pkg.models.vit`:

1. :func:`random_masking`: per image, a random 75 % of the patches are dropped (argsort of
   uniform noise; the first ``len_keep`` of the shuffled order stay);
2. an *asymmetric* pair: the ViT encoder sees only the visible 25 % (plus [CLS]); a small
   decoder (its own width and depth) gets the encoded visible tokens back in image order with a
   learned [MASK] vector in every dropped place, and predicts the pixels of every patch;
3. fixed 2-D sine-cosine positions (:func:`sincos_2d`) in encoder and decoder;
4. the loss: mean squared error per patch, averaged over the *masked* patches only, against
   the raw pixels or, with ``norm_pix_loss``, each patch's pixels standardised by its own mean
   and variance;
5. Hugging Face's names (``ViTMAEForPreTraining``); :func:`mae_patchify` orders the pixels of
   a patch as HF and the MAE code do (row, column, channel).

Shapes: pixel_values (batch, channels, height, width); noise (batch, N) with N patches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from lecture_pkg.layers import EncoderLayer
from lecture_pkg.models.common import HFInterop
from lecture_pkg.models.vit import HF_LAYER_NAMES, ViT, ViTConfig, check_pixels, init_vision_weights_

__all__ = ["MAE", "MAEConfig", "MAEOutput", "mae_patchify", "random_masking", "sincos_2d"]


@dataclass(frozen=True)
class MAEConfig:
    """The encoder (a :class:`ViTConfig` without head) and the decoder's sizes."""

    encoder: ViTConfig = field(default_factory=ViTConfig)
    decoder_hidden_size: int = 512
    decoder_layers: int = 8
    decoder_heads: int = 16
    decoder_intermediate_size: int = 2048
    mask_ratio: float = 0.75
    norm_pix_loss: bool = False

    def __post_init__(self) -> None:
        if self.encoder.num_labels or self.encoder.pooler or self.encoder.positions != "1d":
            raise ValueError("the encoder must have 1-D positions, no pooler and no head")
        if not 0.0 <= self.mask_ratio < 1.0:
            raise ValueError(f"mask_ratio must be in [0, 1), got {self.mask_ratio}")
        for size in (self.encoder.hidden_size, self.decoder_hidden_size):
            if size % 4:
                raise ValueError(f"2-D sine-cosine positions need widths divisible by 4, "
                                 f"got {size}")

    @classmethod
    def from_hf(cls, hf_config: Any) -> MAEConfig:
        """Ours from a ``transformers.ViTMAEConfig``."""
        return cls(encoder=ViTConfig.from_hf(hf_config, hf_class="ViTMAEConfig"),
                   decoder_hidden_size=hf_config.decoder_hidden_size,
                   decoder_layers=hf_config.decoder_num_hidden_layers,
                   decoder_heads=hf_config.decoder_num_attention_heads,
                   decoder_intermediate_size=hf_config.decoder_intermediate_size,
                   mask_ratio=hf_config.mask_ratio, norm_pix_loss=hf_config.norm_pix_loss)


def sincos_2d(grid: int, dim: int) -> Tensor:
    """MAE's fixed positions for a grid x grid map, a zero row for [CLS] first: (1 + grid^2,
    dim). Each patch (row h, column w) gets [sin(w omega), cos(w omega), sin(h omega),
    cos(h omega)] with omega_k = 10000^(-k / (dim/4)), k < dim/4 (computed in float64)."""
    omega = 1.0 / 10000.0 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
    rows, cols = torch.meshgrid(torch.arange(grid, dtype=torch.float64),
                                torch.arange(grid, dtype=torch.float64), indexing="ij")
    w, h = cols.flatten().outer(omega), rows.flatten().outer(omega)
    table = torch.cat([w.sin(), w.cos(), h.sin(), h.cos()], dim=1)
    return torch.cat([torch.zeros(1, dim, dtype=torch.float64), table]).float()


def mae_patchify(images: Tensor, patch_size: int) -> Tensor:
    """(batch, C, H, W) -> (batch, N, P * P * C), patches in raster order, the pixels of a
    patch row by row with the channels innermost (the reconstruction target's layout)."""
    b, c, height, width = images.shape
    gh, gw = height // patch_size, width // patch_size
    x = images.reshape(b, c, gh, patch_size, gw, patch_size).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, gh * gw, patch_size * patch_size * c)


def random_masking(x: Tensor, mask_ratio: float,
                   noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Keep a random (1 - mask_ratio) of the tokens of every sequence.

    x: (batch, N, D); noise: (batch, N) uniform (drawn when None): the tokens with the smallest
    noise stay. Returns (kept (batch, len_keep, D) in shuffled order, mask (batch, N) with 1 =
    dropped, ids_restore (batch, N): the inverse permutation, which puts tokens back in place).
    """
    batch, n, d = x.shape
    len_keep = int(n * (1 - mask_ratio))
    if noise is None:
        noise = torch.rand(batch, n, device=x.device)
    if noise.shape != (batch, n):
        raise ValueError(f"noise must have shape {(batch, n)}, got {tuple(noise.shape)}")
    ids_shuffle = noise.argsort(dim=1)
    ids_restore = ids_shuffle.argsort(dim=1)
    kept = x.gather(1, ids_shuffle[:, :len_keep, None].expand(-1, -1, d))
    mask = torch.ones(batch, n, device=x.device, dtype=x.dtype)
    mask[:, :len_keep] = 0
    return kept, mask.gather(1, ids_restore), ids_restore


class MAEOutput(NamedTuple):
    """loss: scalar, over masked patches; logits: (batch, N, P*P*C), the predicted pixels of
    every patch; mask: (batch, N), 1 = masked; ids_restore: (batch, N)."""

    loss: Tensor
    logits: Tensor
    mask: Tensor
    ids_restore: Tensor


class MAE(HFInterop, nn.Module):
    """Masked autoencoder: forward(pixel_values, noise=None) -> :class:`MAEOutput`.

    ``encoder`` is a plain :class:`ViT` (its position table frozen to :func:`sincos_2d`), so
    after pre-training ``encoder(pixel_values)`` encodes whole, unmasked images for a probe or
    fine-tuning.
    """

    CONFIG = MAEConfig
    HF_CLASS = "ViTMAEForPreTraining"

    def __init__(self, config: MAEConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not isinstance(config, MAEConfig):
            raise TypeError(f"config must be a MAEConfig, got {type(config).__name__}")
        self.config = config
        factory = {"device": device, "dtype": dtype}
        enc, d = config.encoder, config.decoder_hidden_size
        self.encoder = ViT(enc, **factory)
        self.encoder.position.requires_grad_(False)
        self.decoder_embed = nn.Linear(enc.hidden_size, d, **factory)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, d, **factory))
        self.decoder_position = nn.Parameter(torch.zeros(1, 1 + enc.grid ** 2, d, **factory),
                                             requires_grad=False)
        self.decoder_layers = nn.ModuleList(
            EncoderLayer(d, config.decoder_heads, config.decoder_intermediate_size,
                         dropout=enc.dropout, activation="gelu", wiring="pre", eps=enc.eps,
                         **factory) for _ in range(config.decoder_layers))
        self.decoder_norm = nn.LayerNorm(d, eps=enc.eps, **factory)
        self.decoder_pred = nn.Linear(d, enc.patch_size ** 2 * enc.num_channels, **factory)
        if device is None or torch.device(device).type != "meta":
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Linear layers N(0, std^2), LayerNorms 1 and 0 (:func:`init_vision_weights_`),
        [CLS] and [MASK] N(0, std^2), fixed sine-cosine positions."""
        init_vision_weights_(self, std)
        nn.init.normal_(self.encoder.cls_token, std=std)
        nn.init.normal_(self.mask_token, std=std)
        grid = self.config.encoder.grid
        self.encoder.position.copy_(sincos_2d(grid, self.config.encoder.hidden_size))
        self.decoder_position.copy_(sincos_2d(grid, self.config.decoder_hidden_size))

    def encode_visible(self, pixel_values: Tensor,
                       noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Embed, drop the masked patches, run the encoder on [CLS] + the visible ones:
        (states (batch, 1 + len_keep, D), mask, ids_restore)."""
        enc = self.encoder
        check_pixels(pixel_values, enc.config.num_channels)
        patches = enc.patch_embed(pixel_values.to(enc.cls_token.dtype)) + enc.position[:, 1:]
        kept, mask, ids_restore = random_masking(patches, self.config.mask_ratio, noise)
        cls = (enc.cls_token + enc.position[:, :1]).expand(len(kept), -1, -1)
        states, _ = enc.encode(torch.cat([cls, kept], dim=1))
        return states, mask, ids_restore

    def decode(self, states: Tensor, ids_restore: Tensor) -> Tensor:
        """Visible states (batch, 1 + len_keep, D) -> predicted pixels (batch, N, P*P*C)."""
        x = self.decoder_embed(states)
        batch, n = ids_restore.shape
        masks = self.mask_token.expand(batch, n + 1 - x.shape[1], -1)
        patches = torch.cat([x[:, 1:], masks], dim=1)
        patches = patches.gather(1, ids_restore[..., None].expand(-1, -1, x.shape[-1]))
        x = torch.cat([x[:, :1], patches], dim=1) + self.decoder_position
        for layer in self.decoder_layers:
            x, _ = layer(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:]

    def target(self, pixel_values: Tensor) -> Tensor:
        """The reconstruction target (batch, N, P*P*C): pixels, or per-patch standardised."""
        target = mae_patchify(pixel_values, self.config.encoder.patch_size)
        if self.config.norm_pix_loss:
            mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
            target = (target - mean) / (var + 1e-6) ** 0.5
        return target

    def forward(self, pixel_values: Tensor, noise: Tensor | None = None) -> MAEOutput:
        states, mask, ids_restore = self.encode_visible(pixel_values, noise)
        logits = self.decode(states, ids_restore)
        per_patch = ((logits - self.target(pixel_values)) ** 2).mean(-1)
        loss = (per_patch * mask).sum() / mask.sum()
        return MAEOutput(loss, logits, mask, ids_restore)

    def hf_names(self) -> list[tuple[str, str]]:
        names = [(f"encoder.{ours}", f"vit.{theirs}") for ours, theirs in
                 self.encoder.hf_names()]
        names += [("decoder_embed.", "decoder.decoder_embed."),
                  ("mask_token", "decoder.mask_token"),
                  ("decoder_position", "decoder.decoder_pos_embed"),
                  ("decoder_norm.", "decoder.decoder_norm."),
                  ("decoder_pred.", "decoder.decoder_pred.")]
        names += [(f"decoder_layers.{{i}}.{ours}", f"decoder.decoder_layers.{{i}}.{theirs}")
                  for ours, theirs in HF_LAYER_NAMES]
        return names
