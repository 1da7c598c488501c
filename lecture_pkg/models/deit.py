"""DeiT, the data-efficient image Transformer (Touvron et al., 2021), with a distillation token.

DeiT is a ViT (:mod:`lecture_pkg.models.vit`) with one more learned token. After [CLS] comes a
*distillation token*; both take part in every attention layer, and each gets its own linear head
on its final state. In hard distillation the [CLS] head is trained on the true labels and the
distillation head on the hard decisions (arg max) of a teacher, usually a CNN:

    loss = 1/2 CE(cls_logits, y) + 1/2 CE(distillation_logits, argmax teacher(x)).

At test time the two heads' logits are averaged. What is particular to DeiT, then: the extra
token (``EXTRA_TOKENS``, so the position table has N + 2 rows), the second head, the loss
(:func:`hard_distillation_loss`) and Hugging Face's names
(``DeiTForImageClassificationWithTeacher``).

Shapes: pixel_values (batch, channels, height, width), float.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.models.common import check_hf_class
from lecture_pkg.models.vit import ViT, ViTConfig

__all__ = ["DeiT", "DeiTOutput", "hard_distillation_loss"]


class DeiTOutput(NamedTuple):
    """last_hidden_state: (batch, 2 + N, hidden) after the final LayerNorm ([CLS], distillation,
    patches); logits: (batch, num_labels), the mean of cls_logits and distillation_logits;
    attentions: one (batch, heads, 2 + N, 2 + N) tensor per layer, or None."""

    last_hidden_state: Tensor
    logits: Tensor
    cls_logits: Tensor
    distillation_logits: Tensor
    attentions: tuple[Tensor, ...] | None


class DeiT(ViT):
    """ViT with a distillation token and head. forward(pixel_values,
    interpolate_pos_encoding=False, output_attentions=False) -> :class:`DeiTOutput`.

    The config must have 1-D positions, no pooler and ``num_labels`` > 0.
    """

    HF_CLASSES = ("DeiTForImageClassificationWithTeacher",)
    HF_PREFIX, HF_HEAD = "deit.", "cls_classifier."
    EXTRA_TOKENS = ("distillation_token",)

    def __init__(self, config: ViTConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        if not isinstance(config, ViTConfig):
            raise TypeError(f"config must be a ViTConfig, got {type(config).__name__}")
        if config.num_labels < 1 or config.pooler or config.positions != "1d":
            raise ValueError("DeiT needs num_labels > 0, no pooler and positions='1d', got "
                             f"num_labels={config.num_labels}, pooler={config.pooler}, "
                             f"positions={config.positions!r}")
        super().__init__(config, device=device, dtype=dtype)
        self.distillation_classifier = nn.Linear(config.hidden_size, config.num_labels,
                                                 device=device, dtype=dtype)
        if device is None or torch.device(device).type != "meta":
            self.reset_parameters()

    def forward(self, pixel_values: Tensor, interpolate_pos_encoding: bool = False,
                output_attentions: bool = False) -> DeiTOutput:
        x, attentions = self.encode(self.embed(pixel_values, interpolate_pos_encoding),
                                    output_attentions)
        cls_logits = self.classifier(x[:, 0])
        distillation_logits = self.distillation_classifier(x[:, 1])
        return DeiTOutput(x, (cls_logits + distillation_logits) / 2, cls_logits,
                          distillation_logits, attentions)

    @classmethod
    def from_config(cls, hf_config: Any, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None, *, num_labels: int | None = None,
                    **_: Any) -> DeiT:
        """An untrained DeiT with the sizes of a ``transformers.DeiTConfig`` (its
        ``num_labels`` unless given)."""
        labels = hf_config.num_labels if num_labels is None else num_labels
        config = ViTConfig.from_hf(hf_config, num_labels=labels, hf_class="DeiTConfig")
        return cls(config, device=device, dtype=dtype)

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> DeiT:
        """A copy of a ``transformers.DeiTForImageClassificationWithTeacher``."""
        check_hf_class(hf_model, cls.HF_CLASSES[0])
        weight = next(hf_model.parameters())
        model = cls.from_config(hf_model.config, device=weight.device, dtype=weight.dtype)
        model.load_hf_state_dict(hf_model.state_dict())
        return model.train(hf_model.training)

    def hf_names(self) -> list[tuple[str, str]]:
        return super().hf_names() + [("distillation_classifier.", "distillation_classifier.")]


def hard_distillation_loss(output: DeiTOutput, labels: Tensor, teacher_logits: Tensor) -> Tensor:
    """DeiT's hard distillation: the mean of the [CLS] head's cross-entropy with ``labels``
    (batch,) and the distillation head's with the teacher's arg max (teacher_logits: (batch,
    num_labels))."""
    if teacher_logits.shape != output.distillation_logits.shape:
        raise ValueError(f"teacher_logits must have shape "
                         f"{tuple(output.distillation_logits.shape)}, got "
                         f"{tuple(teacher_logits.shape)}")
    return 0.5 * (F.cross_entropy(output.cls_logits, labels)
                  + F.cross_entropy(output.distillation_logits, teacher_logits.argmax(-1)))
