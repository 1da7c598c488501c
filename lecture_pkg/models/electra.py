"""ELECTRA (Clark et al., 2020): pretraining by replaced-token detection.

A small generator is trained by masked language modelling (as BERT). Its samples fill the masked
positions, and the discriminator, the model that is kept, labels every token of the result as
original or replaced. The discriminator thus gets a loss at every position, not only at the
~15 % that MLM selects. Both are BERT encoders; the generator is narrower and shares the
embeddings with the discriminator.

What is particular to ELECTRA, and therefore in this file (everything else is
:mod:`lecture_pkg.models.bert`):

1. :class:`ElectraConfig`: BERT's fields plus ``embedding_size``; when it differs from
   ``hidden_size`` a linear layer projects the embeddings up to the encoder's width;
2. :class:`ElectraModel`: BERT without the pooler;
3. the heads: :class:`ElectraForPreTraining` (the discriminator: dense, activation, one logit
   per token) and :class:`ElectraForMaskedLM` (the generator: dense to ``embedding_size``, GELU,
   LayerNorm, decoder tied to the word embeddings plus its own bias);
4. :func:`share_embeddings` and :func:`replaced_token_detection`, the pretraining objective;
5. the names of the weights in Hugging Face's implementation (``from_hf``, ``hf_state_dict``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.layers import ACTIVATIONS
from lecture_pkg.masks import IGNORE_INDEX
from lecture_pkg.models.bert import (
    _ENCODER_NAMES,
    BertConfig,
    BertModel,
    _BertInterop,
    _encoder_kwargs,
    encoder_layers,
    init_bert_weights,
    run_layers,
)
from lecture_pkg.models.common import check_hf_class, check_padding_mask

__all__ = ["ElectraConfig", "ElectraForMaskedLM", "ElectraForPreTraining", "ElectraModel",
           "ElectraOutput", "RTDOutput", "replaced_token_detection", "share_embeddings"]


@dataclass(frozen=True)
class ElectraConfig(BertConfig):
    """BERT's hyper-parameters plus the embedding width; the defaults are ELECTRA-small's
    discriminator (Clark et al., 2020, Table 6)."""

    hidden_size: int = 256
    num_heads: int = 4
    intermediate_size: int = 1024
    embedding_size: int = 128

    @classmethod
    def from_hf(cls, hf_config: Any) -> ElectraConfig:
        """Ours from a ``transformers.ElectraConfig`` (one dropout rate, as for BERT)."""
        check_hf_class(hf_config, "ElectraConfig")
        return cls(**_encoder_kwargs(hf_config), embedding_size=hf_config.embedding_size)


class ElectraOutput(NamedTuple):
    """last_hidden_state: (batch, t, hidden); hidden_states: the (projected) embeddings then
    every layer's output; attentions: every layer's (batch, heads, t, t) weights or None."""

    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...]
    attentions: tuple[Tensor, ...] | None = None


_ELECTRA_NAMES = [(ours, hf) for ours, hf in _ENCODER_NAMES if ours != "pooler."] + [
    ("project.", "embeddings_project.")]


def _prefixed(names: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(f"electra.{ours}", f"electra.{hf}") for ours, hf in names]


class _ElectraInterop(_BertInterop):
    CONFIG = ElectraConfig
    IGNORED = [r"(electra\.)?embeddings\.(position_ids|token_type_ids)"]


class ElectraModel(_ElectraInterop, nn.Module):
    """BERT's embeddings (width ``embedding_size``), a projection to ``hidden_size`` when the two
    differ, BERT's post-LN encoder layers; no pooler.

    forward(input_ids, attention_mask=None, token_type_ids=None, output_attentions=False):
        as :class:`lecture_pkg.models.bert.BertModel`; returns an :class:`ElectraOutput`.
    """

    HF_CLASS = "ElectraModel"
    NAMES = _ELECTRA_NAMES
    embed = BertModel.embed  # token + position + segment, LayerNorm, dropout
    build_embeddings = BertModel.build_embeddings

    def __init__(self, config: ElectraConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.config = config
        e, d = config.embedding_size, config.hidden_size
        self.build_embeddings(config, e, factory)
        self.project = nn.Linear(e, d, **factory) if e != d else None
        self.layers = encoder_layers(config, **factory)
        self.apply(init_bert_weights)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None,
                output_attentions: bool = False) -> ElectraOutput:
        x = self.embed(input_ids, token_type_ids)
        if self.project is not None:
            x = self.project(x)
        padding = check_padding_mask("attention_mask", attention_mask, tuple(input_ids.shape))
        hidden_states, attentions = run_layers(self.layers, x, padding, output_attentions)
        return ElectraOutput(hidden_states[-1], hidden_states, attentions)


class ElectraHeadOutput(NamedTuple):
    """logits: (batch, t) for the discriminator (> 0: replaced), (batch, t, vocab_size) for the
    generator; electra: the encoder's :class:`ElectraOutput`."""

    logits: Tensor
    electra: ElectraOutput


class ElectraForPreTraining(_ElectraInterop, nn.Module):
    """The discriminator: per token, dense -> activation -> one logit, "this token was replaced".
    forward takes ElectraModel's arguments and returns an :class:`ElectraHeadOutput`."""

    HF_CLASS = "ElectraForPreTraining"
    NAMES = _prefixed(_ELECTRA_NAMES) + [
        ("dense.", "discriminator_predictions.dense."),
        ("prediction.", "discriminator_predictions.dense_prediction.")]

    def __init__(self, config: ElectraConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.config = config
        self.electra = ElectraModel(config, **factory)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, **factory)
        self.act = ACTIVATIONS[config.activation]
        self.prediction = nn.Linear(config.hidden_size, 1, **factory)
        self.apply(init_bert_weights)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None,
                output_attentions: bool = False) -> ElectraHeadOutput:
        out = self.electra(input_ids, attention_mask, token_type_ids, output_attentions)
        logits = self.prediction(self.act(self.dense(out.last_hidden_state))).squeeze(-1)
        return ElectraHeadOutput(logits, out)


class ElectraForMaskedLM(_ElectraInterop, nn.Module):
    """The generator: dense to ``embedding_size``, exact GELU, LayerNorm, then logits through the
    word-embedding matrix (tied) plus a bias of its own. forward takes ElectraModel's arguments
    and returns an :class:`ElectraHeadOutput`; :meth:`mlm_logits` applies the head to any
    selection of hidden vectors."""

    HF_CLASS = "ElectraForMaskedLM"
    NAMES = _prefixed(_ELECTRA_NAMES) + [
        ("mlm_dense.", "generator_predictions.dense."),
        ("mlm_norm.", "generator_predictions.LayerNorm."),
        ("mlm_bias", "generator_lm_head.bias")]
    IGNORED = [*_ElectraInterop.IGNORED, r"generator_lm_head\.weight"]

    def __init__(self, config: ElectraConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.config = config
        self.electra = ElectraModel(config, **factory)
        self.mlm_dense = nn.Linear(config.hidden_size, config.embedding_size, **factory)
        self.mlm_norm = nn.LayerNorm(config.embedding_size, eps=config.eps, **factory)
        self.mlm_bias = nn.Parameter(torch.zeros(config.vocab_size, **factory))
        self.apply(init_bert_weights)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None,
                output_attentions: bool = False) -> ElectraHeadOutput:
        out = self.electra(input_ids, attention_mask, token_type_ids, output_attentions)
        return ElectraHeadOutput(self.mlm_logits(out.last_hidden_state), out)

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """(..., hidden) -> (..., vocab_size). HF's generator always uses the exact GELU here."""
        h = self.mlm_norm(F.gelu(self.mlm_dense(hidden)))
        return F.linear(h, self.electra.token.weight, self.mlm_bias)

    def hf_aliases(self) -> dict[str, str]:
        return {"generator_lm_head.weight": "electra.embeddings.word_embeddings.weight"}


def share_embeddings(generator: ElectraForMaskedLM, discriminator: ElectraForPreTraining) -> None:
    """Make the generator use the discriminator's token, position and segment embeddings and
    their LayerNorm (the same modules, so one gradient step updates both), as ELECTRA does.
    Their ``embedding_size`` must agree; the hidden sizes may differ."""
    g, d = generator.electra, discriminator.electra
    if g.config.embedding_size != d.config.embedding_size:
        raise ValueError(f"embedding_size must agree: generator {g.config.embedding_size}, "
                         f"discriminator {d.config.embedding_size}")
    g.token, g.position, g.segment, g.embed_norm = d.token, d.position, d.segment, d.embed_norm


class RTDOutput(NamedTuple):
    """mlm_loss, rtd_loss: scalars; loss = mlm_loss + rtd_weight * rtd_loss;
    corrupted: (batch, t) the discriminator's input; replaced: (batch, t) bool, its labels;
    rtd_logits: (batch, t) the discriminator's logits."""

    loss: Tensor
    mlm_loss: Tensor
    rtd_loss: Tensor
    corrupted: Tensor
    replaced: Tensor
    rtd_logits: Tensor


def replaced_token_detection(generator: ElectraForMaskedLM,
                             discriminator: ElectraForPreTraining, input_ids: Tensor,
                             masked_ids: Tensor, mlm_labels: Tensor,
                             attention_mask: Tensor | None = None, rtd_weight: float = 50.0,
                             generator_rng: torch.Generator | None = None) -> RTDOutput:
    """ELECTRA's loss on one batch.

    input_ids: (batch, t) the original text; masked_ids, mlm_labels: (batch, t) as
    :func:`lecture_pkg.masks.mlm_mask` returns them (labels IGNORE_INDEX where not selected);
    attention_mask: (batch, t), True/1 = real token.

    The generator is trained by MLM at the selected positions; a token is sampled from its
    output there (no gradient flows through the sample), and the discriminator classifies
    every real token of the result. A sample that equals the original counts as original.
    ``rtd_weight`` is the paper's lambda = 50.
    """
    if not (input_ids.shape == masked_ids.shape == mlm_labels.shape):
        raise ValueError(f"input_ids, masked_ids and mlm_labels must have one shape, got "
                         f"{tuple(input_ids.shape)}, {tuple(masked_ids.shape)}, "
                         f"{tuple(mlm_labels.shape)}")
    real = check_padding_mask("attention_mask", attention_mask, tuple(input_ids.shape))
    selected = mlm_labels != IGNORE_INDEX
    hidden = generator.electra(masked_ids, attention_mask).last_hidden_state[selected]
    logits = generator.mlm_logits(hidden)
    mlm_loss = F.cross_entropy(logits, mlm_labels[selected])
    with torch.no_grad():
        probs = torch.softmax(logits.float(), dim=-1)
        rng_device = generator_rng.device if generator_rng is not None else probs.device
        sampled = torch.multinomial(probs.to(rng_device), 1, generator=generator_rng)
    corrupted = input_ids.clone()
    corrupted[selected] = sampled.squeeze(-1).to(input_ids.device, input_ids.dtype)
    replaced = corrupted != input_ids
    rtd_logits = discriminator(corrupted, attention_mask).logits
    counted = torch.ones_like(replaced) if real is None else real
    rtd_loss = F.binary_cross_entropy_with_logits(rtd_logits[counted],
                                                  replaced[counted].to(rtd_logits.dtype))
    return RTDOutput(mlm_loss + rtd_weight * rtd_loss, mlm_loss, rtd_loss, corrupted, replaced,
                     rtd_logits)
