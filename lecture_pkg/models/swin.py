"""Swin, the shifted-window hierarchical Vision Transformer (Liu et al., 2021).

What is particular to Swin, on top of :mod:`lecture_pkg.layers` (pre-LN residuals, GELU FFN)
and :class:`lecture_pkg.attention.MultiHeadAttention`:

1. window attention: the H x W token map is cut into M x M windows (:func:`window_partition`,
   :func:`window_reverse`) and each window attends only to itself, so the attention matrices
   hold M^2 HW entries instead of (HW)^2: linear in the image size;
2. shifted windows: every second block rolls the map by -floor(M/2) in both directions
   (:func:`cyclic_shift`) so windows straddle the previous block's borders, and rolls back
   afterwards. Windows at the bottom/right edge then hold tokens from up to four regions that
   are not neighbours in the image; :func:`region_labels` labels the 9 regions and
   :func:`shifted_window_mask` lets a token attend only to tokens of its own region;
3. a learned relative position bias B added to q k^T / sqrt(d): one scalar per head for each of
   the (2M - 1)^2 offsets between two tokens of a window, looked up through
   :func:`relative_position_index`;
4. patch merging between stages: each 2 x 2 block of tokens is concatenated (4C), normalised
   and projected to 2C without bias, halving the resolution and doubling the channels;
5. padding: a map that is not a multiple of M is padded with zeros at the bottom/right (the
   padded tokens take part in attention, as in the reference code); a map no larger than M uses
   one window of the map's size and no shift (:func:`window_and_shift`);
6. the names of Hugging Face's weights (``from_hf``, ``hf_state_dict``).

The float mask handed to :class:`MultiHeadAttention` is the bias plus ``finfo.min`` where the
shift mask blocks (the reference code adds -100: its weight e^-100 = 3.8e-44 is a float32
subnormal, negligible but not zero).
Stochastic depth (``drop_path_rate``) drops both residual branches, as in the paper's code;
Hugging Face 5.x drops only the attention branch. Evaluation outputs are unaffected.

Shapes: pixel_values (batch, channels, height, width); token maps (batch, H, W, C).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from lecture_pkg.attention import MultiHeadAttention
from lecture_pkg.checks import check_int
from lecture_pkg.layers import FeedForward, Residual
from lecture_pkg.models.common import HFInterop
from lecture_pkg.models.vit import check_hf_vision_config, check_hf_vision_model, check_pixels, init_vision_weights_

__all__ = ["PatchMerging", "Swin", "SwinBlock", "SwinConfig", "SwinOutput", "cyclic_shift",
           "region_labels", "relative_position_index", "shifted_window_mask", "window_and_shift",
           "window_partition", "window_reverse"]


@dataclass(frozen=True)
class SwinConfig:
    """Swin's hyper-parameters; the defaults are Swin-T at 224 px (Liu et al., 2021).

    Stage s has ``depths[s]`` blocks of width ``embed_dim * 2**s`` with ``num_heads[s]`` heads.
    ``num_labels`` > 0 adds a linear classifier on the mean of the last stage's tokens.
    ``shift_windows=False`` keeps every block on the regular window grid (no cyclic shift): the
    "w/o shifting" ablation of the paper's Table 4.
    """

    image_size: int = 224
    patch_size: int = 4
    num_channels: int = 3
    embed_dim: int = 96
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 7
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    drop_path_rate: float = 0.1
    absolute_positions: bool = False
    eps: float = 1e-5
    num_labels: int = 0
    shift_windows: bool = True

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "num_channels", "embed_dim", "window_size"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("num_labels", self.num_labels)
        object.__setattr__(self, "depths", tuple(self.depths))
        object.__setattr__(self, "num_heads", tuple(self.num_heads))
        if not self.depths or len(self.depths) != len(self.num_heads):
            raise ValueError(f"depths {self.depths} and num_heads {self.num_heads} must be "
                             f"non-empty and of the same length (one entry per stage)")
        for s, (depth, heads) in enumerate(zip(self.depths, self.num_heads)):
            check_int(f"depths[{s}]", depth, minimum=1)
            check_int(f"num_heads[{s}]", heads, minimum=1)
            if self.dims[s] % heads:
                raise ValueError(f"stage {s} has width {self.dims[s]}, not divisible by "
                                 f"num_heads[{s}]={heads}")
        if not isinstance(self.shift_windows, bool):
            raise ValueError(f"shift_windows must be True or False, got {self.shift_windows!r}")
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise ValueError(f"drop_path_rate must be in [0, 1), got {self.drop_path_rate}")

    @property
    def dims(self) -> list[int]:
        """The width of every stage: embed_dim, 2 embed_dim, 4 embed_dim, ..."""
        return [self.embed_dim * 2**s for s in range(len(self.depths))]

    @classmethod
    def from_hf(cls, hf_config: Any, num_labels: int = 0) -> SwinConfig:
        """Ours from a ``transformers.SwinConfig`` (square images and patches, exact GELU, one
        dropout rate, q/k/v biases)."""
        size, patch = check_hf_vision_config(hf_config, "SwinConfig")
        return cls(image_size=size, patch_size=patch, num_channels=hf_config.num_channels,
                   embed_dim=hf_config.embed_dim, depths=tuple(hf_config.depths),
                   num_heads=tuple(hf_config.num_heads), window_size=hf_config.window_size,
                   mlp_ratio=hf_config.mlp_ratio, dropout=hf_config.hidden_dropout_prob,
                   drop_path_rate=hf_config.drop_path_rate,
                   absolute_positions=hf_config.use_absolute_embeddings,
                   eps=hf_config.layer_norm_eps, num_labels=num_labels)


# --------------------------------------------------------------------------------------------
# 1.-3. Windows, the cyclic shift, its mask, and the relative position index
# --------------------------------------------------------------------------------------------

def window_partition(x: Tensor, window: int) -> Tensor:
    """(batch, H, W, C) -> (batch * (H/M) * (W/M), M, M, C): the M x M windows, batch-major and
    in raster order inside each image. H and W must be multiples of M."""
    batch, height, width, channels = x.shape
    if height % window or width % window:
        raise ValueError(f"a {height}x{width} map does not split into {window}x{window} "
                         f"windows: pad it to a multiple of the window first")
    x = x.view(batch, height // window, window, width // window, window, channels)
    return x.transpose(2, 3).reshape(-1, window, window, channels)


def window_reverse(windows: Tensor, window: int, height: int, width: int) -> Tensor:
    """The inverse of :func:`window_partition`: (batch * nW, M, M, C) -> (batch, H, W, C)."""
    channels = windows.shape[-1]
    x = windows.view(-1, height // window, width // window, window, window, channels)
    return x.transpose(2, 3).reshape(-1, height, width, channels)


def cyclic_shift(x: Tensor, shift: int) -> Tensor:
    """Roll a (batch, H, W, C) map by ``shift`` rows and columns: ``shift = -floor(M/2)`` moves
    the top-left corner to the bottom-right before attention, ``+floor(M/2)`` moves it back."""
    return torch.roll(x, shifts=(shift, shift), dims=(1, 2)) if shift else x


def region_labels(height: int, width: int, window: int, shift: int,
                  device: torch.device | str | None = None) -> Tensor:
    """(H, W) integer labels 0..8 of the 9 regions of a map rolled by -shift: along each axis
    [0, H - M), [H - M, H - s) and [H - s, H); label = 3 * row region + column region.
    Tokens of one region were neighbours before the roll; tokens of different regions were not.
    """
    check_int("shift", shift, minimum=1)
    if shift >= window or window > min(height, width):
        raise ValueError(f"need 0 < shift < window <= the map's sides, got shift={shift}, "
                         f"window={window}, map {height}x{width}")
    labels = torch.zeros(height, width, dtype=torch.long, device=device)
    bands = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for i, rows in enumerate(bands):
        for j, cols in enumerate(bands):
            labels[rows, cols] = 3 * i + j
    return labels


def shifted_window_mask(height: int, width: int, window: int, shift: int,
                        device: torch.device | str | None = None) -> Tensor:
    """Bool (nW, M^2, M^2), True = may attend: within each window of the rolled map a token
    attends only to tokens of its own region (:func:`region_labels`)."""
    labels = region_labels(height, width, window, shift, device)
    per_window = window_partition(labels[None, :, :, None], window).flatten(1)  # (nW, M^2)
    return per_window[:, :, None] == per_window[:, None, :]


def relative_position_index(window: int, device: torch.device | str | None = None) -> Tensor:
    """(M^2, M^2) long: for tokens i, j of a window at (y_i, x_i), (y_j, x_j), the row of the
    (2M - 1)^2-row bias table for the offset (y_i - y_j, x_i - x_j), i.e.
    (y_i - y_j + M - 1) * (2M - 1) + (x_i - x_j + M - 1)."""
    coords = torch.stack(torch.meshgrid(torch.arange(window, device=device),
                                        torch.arange(window, device=device),
                                        indexing="ij")).flatten(1)  # (2, M^2): y, x
    offset = coords[:, :, None] - coords[:, None, :] + window - 1  # (2, M^2, M^2) in [0, 2M-2]
    return offset[0] * (2 * window - 1) + offset[1]


def window_and_shift(height: int, width: int, window: int) -> tuple[int, int]:
    """The window and shift a block uses on an H x W map (the reference rule): a map no larger
    than M in some direction gets one window of side min(H, W) and no shift; otherwise (M,
    floor(M/2)) and the map is padded to a multiple of M."""
    if min(height, width) <= window:
        return min(height, width), 0
    return window, window // 2


# --------------------------------------------------------------------------------------------
# 4. Blocks, patch merging, the model
# --------------------------------------------------------------------------------------------

def drop_path(x: Tensor, p: float, training: bool) -> Tensor:
    """Stochastic depth: zero a residual branch for a whole sample with probability p (and
    scale the kept ones by 1/(1 - p)); identity at evaluation."""
    if p == 0.0 or not training:
        return x
    keep = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device) >= p
    return x * keep.to(x.dtype) / (1 - p)


class SwinBlock(nn.Module):
    """(Shifted-)window multi-head self-attention then an FFN, each in a pre-LN residual.

    forward(x (batch, H*W, C), size (H, W), shifted, output_attentions) -> (x, weights):
    weights (batch * nW, heads, M^2, M^2) with output_attentions, else None.
    """

    def __init__(self, dim: int, num_heads: int, window: int, mlp_ratio: float = 4.0,
                 dropout: float = 0.0, drop_path: float = 0.0, eps: float = 1e-5,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.window, self.drop_path = window, drop_path
        self.attn_block = Residual(dim, "pre", eps=eps, dropout=dropout, **factory)
        self.attn = MultiHeadAttention(dim, num_heads, dropout=dropout, **factory)
        # one learned scalar per head for each of the (2M - 1)^2 relative offsets
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window - 1) ** 2, num_heads, **factory))
        self.register_buffer("relative_position_index",
                             relative_position_index(window, device=device), persistent=False)
        self.ffn_block = Residual(dim, "pre", eps=eps, dropout=dropout, **factory)
        self.ffn = FeedForward(dim, int(mlp_ratio * dim), "gelu", **factory)

    def relative_bias(self) -> Tensor:
        """B: (1, heads, M^2, M^2), the table read through the index."""
        m2 = self.window**2
        bias = self.relative_position_bias_table[self.relative_position_index.flatten()]
        return bias.view(m2, m2, -1).permute(2, 0, 1)[None]

    def window_attention(self, x: Tensor, size: tuple[int, int], shifted: bool,
                         output_attentions: bool) -> tuple[Tensor, Tensor | None]:
        """Attention inside (shifted) windows of the normalised map x: (batch, H*W, C)."""
        height, width = size
        batch, _, channels = x.shape
        window, shift = window_and_shift(height, width, self.window)
        if window != self.window:
            raise ValueError(f"the {height}x{width} feature map is smaller than window_size "
                             f"{self.window}, and the block's relative-position table only fits "
                             f"{self.window}x{self.window} windows: use window_size <= "
                             f"{min(height, width)} or a larger image")
        shift = shift if shifted else 0
        pad_h, pad_w = -height % window, -width % window
        grid = nn.functional.pad(x.view(batch, height, width, channels), (0, 0, 0, pad_w, 0, pad_h))
        windows = window_partition(cyclic_shift(grid, -shift), window).flatten(1, 2)
        mask = self.relative_bias()  # (1, heads, M^2, M^2), broadcast over windows
        if shift:
            allowed = shifted_window_mask(height + pad_h, width + pad_w, window, shift, x.device)
            mask = mask.masked_fill(~allowed[:, None], torch.finfo(mask.dtype).min)
            mask = mask.repeat(batch, 1, 1, 1)  # windows are batch-major: (batch * nW, ...)
        out, weights = self.attn(windows, windows, windows, attn_mask=mask,
                                 need_weights=output_attentions)
        grid = window_reverse(out.view(-1, window, window, channels), window,
                              height + pad_h, width + pad_w)
        grid = cyclic_shift(grid, shift)[:, :height, :width]
        return grid.reshape(batch, height * width, channels), weights

    def forward(self, x: Tensor, size: tuple[int, int], shifted: bool,
                output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        weights = None

        def attention(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.window_attention(h, size, shifted, output_attentions)
            return drop_path(out, self.drop_path, self.training)

        x = self.attn_block(x, attention)
        x = self.ffn_block(x, lambda h: drop_path(self.ffn(h), self.drop_path, self.training))
        return x, weights


class PatchMerging(nn.Module):
    """Concatenate each 2 x 2 block of tokens (top-left, bottom-left, top-right, bottom-right:
    the reference order), LayerNorm(4C), bias-free linear 4C -> 2C. An odd side is padded.

    forward(x (batch, H*W, C), size (H, W)) -> (batch, ceil(H/2) * ceil(W/2), 2C).
    """

    def __init__(self, dim: int, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim, device=device, dtype=dtype)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False, device=device, dtype=dtype)

    def forward(self, x: Tensor, size: tuple[int, int]) -> Tensor:
        height, width = size
        batch, _, channels = x.shape
        grid = nn.functional.pad(x.view(batch, height, width, channels),
                                 (0, 0, 0, width % 2, 0, height % 2))
        blocks = [grid[:, row::2, col::2] for col in range(2) for row in range(2)]
        merged = torch.cat(blocks, dim=-1).view(batch, -1, 4 * channels)
        return self.reduction(self.norm(merged))


class SwinStage(nn.Module):
    """``depth`` blocks (odd ones shifted unless ``config.shift_windows`` is False), then patch
    merging unless it is the last stage."""

    def __init__(self, dim: int, depth: int, num_heads: int, config: SwinConfig,
                 drop_paths: list[float], merge: bool,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.blocks = nn.ModuleList(
            SwinBlock(dim, num_heads, config.window_size, config.mlp_ratio, config.dropout,
                      drop_paths[b], config.eps, **factory) for b in range(depth))
        self.merge = PatchMerging(dim, **factory) if merge else None


class SwinOutput(NamedTuple):
    """last_hidden_state: (batch, tokens of the last stage, C_last), after the final LayerNorm;
    pooler_output: (batch, C_last), their mean; logits: (batch, num_labels) or None;
    attentions: every block's (batch * nW, heads, M^2, M^2) weights with output_attentions."""

    last_hidden_state: Tensor
    pooler_output: Tensor
    logits: Tensor | None
    attentions: tuple[Tensor, ...] | None


class Swin(HFInterop, nn.Module):
    """The Swin Transformer. forward(pixel_values, output_attentions=False) -> SwinOutput.

    An image whose sides are not multiples of patch_size is padded (bottom/right) as in the
    reference; feature maps are padded to multiples of the window inside each block.
    """

    CONFIG = SwinConfig
    HF_CLASSES = ("SwinModel", "SwinForImageClassification")

    def __init__(self, config: SwinConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not isinstance(config, SwinConfig):
            raise TypeError(f"config must be a SwinConfig, got {type(config).__name__} "
                            f"(use Swin.from_config for a transformers SwinConfig)")
        self.config = config
        factory = {"device": device, "dtype": dtype}
        c, p = config.embed_dim, config.patch_size
        self.patch_embed = nn.Conv2d(config.num_channels, c, kernel_size=p, stride=p, **factory)
        self.embed_norm = nn.LayerNorm(c, **factory)  # eps 1e-5 whatever the config says (HF)
        grid = config.image_size // p
        self.position = (nn.Parameter(torch.zeros(1, grid * grid, c, **factory))
                         if config.absolute_positions else None)
        self.drop = nn.Dropout(config.dropout)
        total = sum(config.depths)  # stochastic depth grows linearly from 0 over all blocks
        rates = [config.drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        starts = [sum(config.depths[:s]) for s in range(len(config.depths))]
        self.stages = nn.ModuleList(
            SwinStage(dim, depth, heads, config, rates[start:start + depth],
                      merge=s < len(config.depths) - 1, **factory)
            for s, (dim, depth, heads, start) in enumerate(
                zip(config.dims, config.depths, config.num_heads, starts)))
        self.norm = nn.LayerNorm(config.dims[-1], eps=config.eps, **factory)
        self.classifier = (nn.Linear(config.dims[-1], config.num_labels, **factory)
                           if config.num_labels else None)
        if device is None or torch.device(device).type != "meta":
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Hugging Face's initialisation (:func:`init_vision_weights_`), with zero relative-bias
        tables and absolute positions."""
        init_vision_weights_(self, std)
        for module in self.modules():
            if isinstance(module, SwinBlock):
                nn.init.zeros_(module.relative_position_bias_table)
        if self.position is not None:
            nn.init.zeros_(self.position)

    def embed(self, pixel_values: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Patch tokens (batch, H*W, embed_dim), normalised, and the grid size (H, W)."""
        check_pixels(pixel_values, self.config.num_channels)
        p = self.config.patch_size
        height, width = pixel_values.shape[-2:]
        pixels = nn.functional.pad(pixel_values.to(self.patch_embed.weight.dtype),
                                   (0, -width % p, 0, -height % p))
        x = self.patch_embed(pixels)
        size = (x.shape[2], x.shape[3])
        x = self.embed_norm(x.flatten(2).transpose(1, 2))
        if self.position is not None:
            if x.shape[1] != self.position.shape[1]:
                raise ValueError(f"absolute positions exist for {self.config.image_size}px "
                                 f"images only, got {height}x{width}")
            x = x + self.position
        return self.drop(x), size

    def forward(self, pixel_values: Tensor, output_attentions: bool = False) -> SwinOutput:
        x, size = self.embed(pixel_values)
        attentions = []
        for stage in self.stages:
            for b, block in enumerate(stage.blocks):
                shifted = self.config.shift_windows and b % 2 == 1
                x, weights = block(x, size, shifted=shifted,
                                   output_attentions=output_attentions)
                attentions.append(weights)
            if stage.merge is not None:
                x = stage.merge(x, size)
                size = ((size[0] + 1) // 2, (size[1] + 1) // 2)
        x = self.norm(x)
        pooled = x.mean(dim=1)
        logits = self.classifier(pooled) if self.classifier is not None else None
        return SwinOutput(x, pooled, logits, tuple(attentions) if output_attentions else None)

    # ---- Hugging Face interop ---------------------------------------------------------------

    @classmethod
    def from_config(cls, hf_config: Any, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None, *, num_labels: int = 0) -> Swin:
        """An untrained Swin with the sizes of a ``transformers.SwinConfig`` (``SwinModel``;
        ``num_labels`` > 0: ``SwinForImageClassification``). device="meta" allocates nothing."""
        return cls(SwinConfig.from_hf(hf_config, num_labels=num_labels), device=device,
                   dtype=dtype)

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> Swin:
        """A copy of a ``transformers`` ``SwinModel`` or ``SwinForImageClassification``."""
        classifier = check_hf_vision_model(hf_model, cls.HF_CLASSES)
        num_labels = hf_model.config.num_labels if classifier else 0
        weight = next(hf_model.parameters())
        model = cls.from_config(hf_model.config, device=weight.device, dtype=weight.dtype,
                                num_labels=num_labels)
        model.load_hf_state_dict(hf_model.state_dict())
        return model.train(hf_model.training)

    def hf_names(self) -> list[tuple[str, str]]:
        base = "swin." if self.classifier is not None else ""
        block = [("attn_block.norm.", "layernorm_before."),
                 ("attn.q_proj.", "attention.q_proj."), ("attn.k_proj.", "attention.k_proj."),
                 ("attn.v_proj.", "attention.v_proj."), ("attn.out_proj.", "attention.o_proj."),
                 ("relative_position_bias_table",
                  "attention.relative_position_bias.relative_position_bias_table"),
                 ("ffn_block.norm.", "layernorm_after."),
                 ("ffn.linear1.", "mlp.fc1."), ("ffn.linear2.", "mlp.fc2.")]
        names = [("patch_embed.", base + "embeddings.patch_embeddings.projection."),
                 ("embed_norm.", base + "embeddings.norm."),
                 ("position", base + "embeddings.position_embeddings"),
                 ("norm.", base + "layernorm.")]
        for s, depth in enumerate(self.config.depths):
            stage, hf_stage = f"stages.{s}.", f"{base}encoder.layers.{s}."
            names += [(f"{stage}blocks.{b}.{ours}", f"{hf_stage}blocks.{b}.{theirs}")
                      for b in range(depth) for ours, theirs in block]
            names += [(f"{stage}merge.", f"{hf_stage}downsample.")]
        if self.classifier is not None:
            names.append(("classifier.", "classifier."))
        return names
