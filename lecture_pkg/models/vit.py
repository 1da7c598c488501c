"""ViT, the Vision Transformer (Dosovitskiy et al., 2021): "an image is worth 16x16 words".

What is particular to ViT, on top of :class:`lecture_pkg.layers.EncoderLayer` (pre-LN, exact
GELU, LayerNorm eps 1e-12 as in Hugging Face's port):

1. :func:`patchify` and :class:`PatchEmbedding`: the image is cut into non-overlapping P x P
   patches, each flattened and projected to ``hidden_size``. A linear map of every patch *is* a
   convolution with kernel P and stride P, which is how it is computed (tested equal to
   unfold + linear);
2. a learned [CLS] token in front of the N = HW / P^2 patch tokens; the classifier reads its
   final state;
3. positions: a learned table of N + 1 vectors ("1d", the paper's default), a row table and a
   column table of D/2 each concatenated ("2d", the paper's ablation), or none ("none").
   :meth:`ViT.position_table` interpolates the 1-D table bicubically to another image size
   (Hugging Face's ``interpolate_pos_encoding``);
4. :class:`ViT`: embeddings, ``num_layers`` encoder layers, a final LayerNorm, optionally HF's
   tanh pooler (``ViTModel``) and a classification head (``ViTForImageClassification``);
5. the names of the weights in Hugging Face's implementation (``from_hf``, ``hf_state_dict``).

Attention runs through torch's fused SDPA; ``output_attentions=True`` switches to the package's
own attention and returns every layer's weights (for the attention maps and rollout).

Shapes: pixel_values (batch, channels, height, width), float.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.checks import check_int
from lecture_pkg.layers import EncoderLayer
from lecture_pkg.models.common import HFInterop, check_hf_class

__all__ = ["HF_LAYER_NAMES", "PatchEmbedding", "ViT", "ViTConfig", "ViTOutput", "check_hf_vision_config",
           "check_hf_vision_model", "check_pixels", "init_vision_weights_", "patchify"]

Positions = Literal["1d", "2d", "none"]

# Our EncoderLayer's weights and Hugging Face's ViTLayer's (shared by DeiT, ViTMAE)
HF_LAYER_NAMES = [("self_attn.q_proj.", "attention.q_proj."),
                  ("self_attn.k_proj.", "attention.k_proj."),
                  ("self_attn.v_proj.", "attention.v_proj."),
                  ("self_attn.out_proj.", "attention.o_proj."),
                  ("attn_block.norm.", "layernorm_before."),
                  ("ffn.linear1.", "mlp.fc1."), ("ffn.linear2.", "mlp.fc2."),
                  ("ffn_block.norm.", "layernorm_after.")]


@dataclass(frozen=True)
class ViTConfig:
    """ViT's hyper-parameters; the defaults are ViT-B/16 at 224 px (Dosovitskiy et al., Table 1).

    ``pooler``: HF ``ViTModel``'s tanh layer on [CLS]; ``num_labels`` > 0 adds a linear
    classifier on the final [CLS] state (HF ``ViTForImageClassification``).
    """

    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    dropout: float = 0.0
    eps: float = 1e-12
    positions: Positions = "1d"
    pooler: bool = False
    num_labels: int = 0

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "num_channels", "hidden_size", "num_layers",
                     "num_heads", "intermediate_size"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("num_labels", self.num_labels)
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} must be divisible by patch_size "
                             f"{self.patch_size}: ViT cuts the image into whole patches")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by num_heads "
                             f"{self.num_heads}")
        if self.positions not in ("1d", "2d", "none"):
            raise ValueError(f"positions must be '1d', '2d' or 'none', got {self.positions!r}")
        if self.positions == "2d" and self.hidden_size % 2:
            raise ValueError(f"2-D positions split hidden_size in two halves: it must be even, "
                             f"got {self.hidden_size}")

    @property
    def grid(self) -> int:
        """Patches per side: image_size / patch_size."""
        return self.image_size // self.patch_size

    @classmethod
    def from_hf(cls, hf_config: Any, pooler: bool = False, num_labels: int = 0,
                hf_class: str = "ViTConfig") -> ViTConfig:
        """Ours from a ``transformers.ViTConfig`` (square images and patches, exact GELU, one
        dropout rate, q/k/v biases, pooler width = hidden_size); ``hf_class`` names another
        config class with the same fields (``DeiTConfig``, ``ViTMAEConfig``)."""
        size, patch = check_hf_vision_config(hf_config, hf_class)
        if pooler and (hf_config.pooler_output_size != hf_config.hidden_size
                       or hf_config.pooler_act != "tanh"):
            raise ValueError("the pooler must be a tanh layer of width hidden_size")
        return cls(image_size=size, patch_size=patch, num_channels=hf_config.num_channels,
                   hidden_size=hf_config.hidden_size, num_layers=hf_config.num_hidden_layers,
                   num_heads=hf_config.num_attention_heads,
                   intermediate_size=hf_config.intermediate_size,
                   dropout=hf_config.hidden_dropout_prob, eps=hf_config.layer_norm_eps,
                   pooler=pooler, num_labels=num_labels)


def check_hf_vision_config(hf_config: Any, expected: str) -> tuple[int, int]:
    """(image_size, patch_size) of a ``transformers`` ViT or Swin config, after checking
    what our models support: square images and patches, exact GELU, one dropout rate (HF has
    two), biases on q, k and v."""
    check_hf_class(hf_config, expected)
    size, patch = hf_config.image_size, hf_config.patch_size
    if not isinstance(size, int) or not isinstance(patch, int):
        raise ValueError(f"only square images and patches are supported, got image_size="
                         f"{size!r}, patch_size={patch!r}")
    if hf_config.hidden_act != "gelu":
        raise ValueError(f"hidden_act must be 'gelu' (exact), got {hf_config.hidden_act!r}")
    if hf_config.hidden_dropout_prob != hf_config.attention_probs_dropout_prob:
        raise ValueError("hidden_dropout_prob and attention_probs_dropout_prob must be equal: "
                         "our layers use one rate")
    if not hf_config.qkv_bias:
        raise ValueError("qkv_bias=False is not supported")
    return size, patch


def check_hf_vision_model(hf_model: object, classes: tuple[str, str]) -> bool:
    """TypeError unless ``hf_model`` is a ``transformers`` model of one of ``classes`` (backbone,
    classifier); True for the classifier, which must then have a linear head."""
    cls = type(hf_model)
    if cls.__name__ not in classes or not cls.__module__.startswith("transformers."):
        raise TypeError(f"hf_model must be a transformers {' or '.join(classes)}, got "
                        f"{cls.__module__}.{cls.__name__}")
    if cls.__name__ == classes[1] and not isinstance(hf_model.classifier, nn.Linear):
        raise ValueError(f"{classes[1]} needs num_labels > 0")
    return cls.__name__ == classes[1]


@torch.no_grad()
def init_vision_weights_(model: nn.Module, std: float = 0.02) -> None:
    """Hugging Face's initialisation of ViT and Swin: N(0, std^2) for linear and convolution
    weights, zero biases, unit LayerNorm gains."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


def check_pixels(pixel_values: object, num_channels: int) -> Tensor:
    """``pixel_values`` if it is a float tensor (batch, num_channels, height, width)."""
    if not isinstance(pixel_values, Tensor) or not pixel_values.is_floating_point():
        got = pixel_values.dtype if isinstance(pixel_values, Tensor) else type(pixel_values).__name__
        raise TypeError(f"pixel_values must be a float tensor (batch, channels, height, width), "
                        f"got {got}")
    if pixel_values.dim() != 4:
        raise ValueError(f"pixel_values must have shape (batch, channels, height, width), got "
                         f"{tuple(pixel_values.shape)}")
    if pixel_values.shape[1] != num_channels:
        raise ValueError(f"pixel_values has {pixel_values.shape[1]} channels but the model "
                         f"expects num_channels={num_channels}")
    return pixel_values


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """Cut images into non-overlapping patches, row by row, each flattened channel-first.

    images: (batch, C, H, W) with H and W multiples of patch_size ->
    (batch, N = HW / P^2, C * P * P), patches in raster order (left to right, top to bottom).
    """
    _, _, height, width = images.shape
    if height % patch_size or width % patch_size:
        raise ValueError(f"image size {height}x{width} is not divisible by patch_size "
                         f"{patch_size}")
    return F.unfold(images, kernel_size=patch_size, stride=patch_size).transpose(1, 2)


class PatchEmbedding(nn.Module):
    """Linear projection of every P x P patch, computed as a Conv2d with kernel = stride = P.

    forward(images (batch, C, H, W)) -> (batch, N, hidden_size), raster order as
    :func:`patchify`; equal to ``patchify(x, P) @ proj.weight.flatten(1).T + proj.bias``.
    """

    def __init__(self, num_channels: int, hidden_size: int, patch_size: int,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(num_channels, hidden_size, kernel_size=patch_size,
                              stride=patch_size, device=device, dtype=dtype)

    def forward(self, images: Tensor) -> Tensor:
        self._check_images(images)
        return self.proj(images).flatten(2).transpose(1, 2)

    def _check_images(self, images: Tensor) -> None:
        _, _, height, width = images.shape
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(f"pixel_values has size {height}x{width}, not divisible by "
                             f"patch_size {self.patch_size}")


class ViTOutput(NamedTuple):
    """last_hidden_state: (batch, 1 + N, hidden), after the final LayerNorm; pooler_output:
    (batch, hidden) or None; logits: (batch, num_labels) or None; attentions: one
    (batch, heads, 1 + N, 1 + N) tensor per layer with output_attentions, else None."""

    last_hidden_state: Tensor
    pooler_output: Tensor | None
    logits: Tensor | None
    attentions: tuple[Tensor, ...] | None


class ViT(HFInterop, nn.Module):
    """The Vision Transformer. forward(pixel_values, interpolate_pos_encoding=False,
    output_attentions=False) -> :class:`ViTOutput`.

    Without ``interpolate_pos_encoding`` the image must have the configured size (learned
    positions exist for that grid only); with it, the position table is resized to the image's
    grid (:meth:`position_table`), so a model trained at one size runs at another.
    """

    CONFIG = ViTConfig
    HF_CLASSES = ("ViTModel", "ViTForImageClassification")
    HF_PREFIX, HF_HEAD = "vit.", "classifier."  # HF's names in its classifier model
    EXTRA_TOKENS: tuple[str, ...] = ()  # learned tokens after [CLS] (DeiT: distillation)

    def __init__(self, config: ViTConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not isinstance(config, ViTConfig):
            raise TypeError(f"config must be a ViTConfig, got {type(config).__name__} "
                            f"(use ViT.from_config for a transformers ViTConfig)")
        self.config = config
        factory = {"device": device, "dtype": dtype}
        d, grid = config.hidden_size, config.grid
        self.patch_embed = PatchEmbedding(config.num_channels, d, config.patch_size, **factory)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d, **factory))
        for name in self.EXTRA_TOKENS:
            self.register_parameter(name, nn.Parameter(torch.zeros(1, 1, d, **factory)))
        prefix = self.num_prefix_tokens
        if config.positions == "1d":  # one vector per position, [CLS] first
            self.position = nn.Parameter(torch.zeros(1, prefix + grid * grid, d, **factory))
        elif config.positions == "2d":  # row and column halves, concatenated; [CLS] its own
            self.cls_position = nn.Parameter(torch.zeros(1, prefix, d, **factory))
            self.row_position = nn.Parameter(torch.zeros(grid, d // 2, **factory))
            self.col_position = nn.Parameter(torch.zeros(grid, d // 2, **factory))
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(d, config.num_heads, config.intermediate_size, dropout=config.dropout,
                         activation="gelu", wiring="pre", eps=config.eps, **factory)
            for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(d, eps=config.eps, **factory)
        self.pooler = nn.Linear(d, d, **factory) if config.pooler else None
        self.classifier = (nn.Linear(d, config.num_labels, **factory) if config.num_labels
                           else None)
        if device is None or torch.device(device).type != "meta":
            self.reset_parameters()

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens in front of the patches: [CLS] and the ``EXTRA_TOKENS``."""
        return 1 + len(self.EXTRA_TOKENS)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Hugging Face's initialisation (:func:`init_vision_weights_`), with truncated normal
        [CLS] and positions."""
        init_vision_weights_(self, std)
        for _name, param in self.named_parameters(recurse=False):
            nn.init.trunc_normal_(param, std=std)  # cls_token and the position tables

    def no_weight_decay(self) -> set[str]:
        """Names of the learned tokens and position tables, which the DeiT and timm recipes
        train without weight decay (decay would pull them towards an arbitrary 0)."""
        return {name for name, _ in self.named_parameters(recurse=False)}

    def position_table(self, grid_h: int, grid_w: int) -> Tensor | None:
        """The positions for a grid_h x grid_w patch grid, [CLS] first: (1, 1 + grid_h grid_w, D).

        The learned 1-D table belongs to a square grid; for another grid it is reshaped to that
        square and resized bicubically (HF's ``interpolate_pos_encoding``; unchanged for the
        trained square grid). 2-D tables are resized linearly along their own axis.
        """
        config = self.config
        if config.positions == "none":
            return None
        if config.positions == "2d":
            rows, cols = self.row_position, self.col_position
            if (grid_h, grid_w) != (config.grid, config.grid):
                rows = F.interpolate(rows.T[None], size=grid_h, mode="linear")[0].T
                cols = F.interpolate(cols.T[None], size=grid_w, mode="linear")[0].T
            patches = torch.cat([rows[:, None].expand(-1, grid_w, -1),
                                 cols[None].expand(grid_h, -1, -1)], dim=-1)
            return torch.cat([self.cls_position, patches.reshape(1, grid_h * grid_w, -1)], dim=1)
        if grid_h == grid_w == config.grid:
            return self.position
        prefix = self.num_prefix_tokens
        cls_pos, patch_pos = self.position[:, :prefix], self.position[:, prefix:]
        d = patch_pos.shape[-1]
        square = patch_pos.reshape(1, config.grid, config.grid, d).permute(0, 3, 1, 2)
        resized = F.interpolate(square, size=(grid_h, grid_w), mode="bicubic", align_corners=False)
        return torch.cat([cls_pos, resized.permute(0, 2, 3, 1).reshape(1, -1, d)], dim=1)

    def embed(self, pixel_values: Tensor, interpolate_pos_encoding: bool = False) -> Tensor:
        """[CLS] (and the extra tokens) + patch embeddings + positions, after dropout:
        (batch, num_prefix_tokens + N, hidden)."""
        config = self.config
        check_pixels(pixel_values, config.num_channels)
        height, width = pixel_values.shape[-2:]
        if not interpolate_pos_encoding and (height, width) != (config.image_size,) * 2:
            raise ValueError(f"pixel_values is {height}x{width} but the model was built for "
                             f"{config.image_size}x{config.image_size}: resize the image, or "
                             f"pass interpolate_pos_encoding=True to resize the positions")
        patches = self.patch_embed(pixel_values.to(self.cls_token.dtype))
        tokens = [getattr(self, name) for name in ("cls_token", *self.EXTRA_TOKENS)]
        x = torch.cat([t.expand(len(patches), -1, -1) for t in tokens] + [patches], dim=1)
        positions = self.position_table(height // config.patch_size, width // config.patch_size)
        return self.drop(x if positions is None else x + positions)

    def encode(self, x: Tensor,
               output_attentions: bool = False) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """The encoder layers and the final LayerNorm on embedded tokens x (batch, t, hidden)
        -> (states (batch, t, hidden), one (batch, heads, t, t) weight tensor per layer or
        None)."""
        attentions = []
        for layer in self.layers:
            x, weights = layer(x, output_attentions=output_attentions)
            attentions.append(weights)
        return self.norm(x), tuple(attentions) if output_attentions else None

    def forward(self, pixel_values: Tensor, interpolate_pos_encoding: bool = False,
                output_attentions: bool = False) -> ViTOutput:
        x, attentions = self.encode(self.embed(pixel_values, interpolate_pos_encoding),
                                    output_attentions)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None
        logits = self.classifier(x[:, 0]) if self.classifier is not None else None
        return ViTOutput(x, pooled, logits, attentions)

    # ---- Hugging Face interop ---------------------------------------------------------------

    @classmethod
    def from_config(cls, hf_config: Any, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None, *, pooler: bool = False,
                    num_labels: int = 0) -> ViT:
        """An untrained ViT with the sizes of a ``transformers.ViTConfig``: ``pooler=True`` is
        HF's ``ViTModel`` (default add_pooling_layer), ``num_labels`` > 0 its
        ``ViTForImageClassification``. device="meta" counts parameters without memory."""
        config = ViTConfig.from_hf(hf_config, pooler=pooler, num_labels=num_labels)
        return cls(config, device=device, dtype=dtype)

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> ViT:
        """A copy of a ``transformers`` ``ViTModel`` (with or without its pooler) or
        ``ViTForImageClassification``, giving the same outputs."""
        if check_hf_vision_model(hf_model, cls.HF_CLASSES):
            head = {"num_labels": hf_model.config.num_labels}
        else:
            if hf_model.embeddings.mask_token is not None:
                raise ValueError("ViTModel with use_mask_token=True is not supported")
            head = {"pooler": hf_model.pooler is not None}
        weight = next(hf_model.parameters())
        model = cls.from_config(hf_model.config, device=weight.device, dtype=weight.dtype, **head)
        model.load_hf_state_dict(hf_model.state_dict())
        return model.train(hf_model.training)

    def hf_names(self) -> list[tuple[str, str]]:
        if self.config.positions != "1d":
            raise ValueError("only 1-D positions have a Hugging Face counterpart")
        base = self.HF_PREFIX if self.classifier is not None else ""
        names = [(token, f"{base}embeddings.{token}") for token in ("cls_token",
                                                                    *self.EXTRA_TOKENS)]
        names += [("position", base + "embeddings.position_embeddings"),
                  ("patch_embed.proj.", base + "embeddings.patch_embeddings.projection."),
                  ("norm.", base + "layernorm.")]
        names += [(f"layers.{{i}}.{ours}", f"{base}layers.{{i}}.{theirs}")
                  for ours, theirs in HF_LAYER_NAMES]
        if self.pooler is not None:
            names.append(("pooler.", "pooler.dense."))
        if self.classifier is not None:
            names.append(("classifier.", self.HF_HEAD))
        return names
