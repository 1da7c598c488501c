"""T5 (Raffel et al., 2020): an encoder-decoder Transformer that casts every task as text to
text, pretrained by span corruption (:func:`lecture_pkg.masks.span_corruption`).

What is particular to T5, and therefore in this file:

1. :class:`T5Config` and its translation from a ``transformers.T5Config``: v1.0 (ReLU FFN, word
   embeddings tied to the output layer) and v1.1 (gated-GELU FFN, untied);
2. pre-LN layers with T5's "LayerNorm", an RMS norm without mean or bias (eps 1e-6), no biases
   anywhere, and no 1/sqrt(d) in attention (the initialisation absorbs it);
3. positions only as a learned relative bias per head (:class:`lecture_pkg.positional.
   RelativePositionBias`, T5's log buckets), computed once per stack and added to the scores of
   every layer; bidirectional in the encoder, causal in the decoder, none in cross-attention;
4. with tied embeddings (v1.0), the decoder's output is scaled by d_model^-0.5 before the
   logits;
5. Hugging Face's weight names, for ``from_hf`` and ``hf_state_dict``.

Attention runs through torch's fused SDPA; ``output_attentions=True`` switches to the package's
own attention and returns every layer's weights (encoder, decoder and cross attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.attention import MultiHeadAttention
from lecture_pkg.layers import ACTIVATIONS, GATED_ACTIVATIONS, DecoderLayer, EncoderLayer, FeedForward, RMSNorm
from lecture_pkg.masks import IGNORE_INDEX, causal_mask
from lecture_pkg.models.common import HFInterop, check_hf_class, check_padding_mask, check_token_ids
from lecture_pkg.positional import RelativePositionBias

__all__ = ["T5", "T5Config", "T5Output", "shift_right", "t5_loss"]

# HF's (is_gated_act, dense_act_fn) -> our FeedForward activation
_HF_FFNS = {(False, "relu"): "relu", (False, "gelu"): "gelu", (False, "gelu_new"): "gelu_tanh",
            (True, "relu"): "reglu", (True, "gelu"): "geglu", (True, "gelu_new"): "geglu_tanh",
            (True, "silu"): "swiglu"}


@dataclass(frozen=True)
class T5Config:
    """T5's hyper-parameters; the defaults are T5-small v1.0 (60.5M parameters)."""

    vocab_size: int = 32128
    d_model: int = 512
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int = 6
    num_heads: int = 8
    num_buckets: int = 32
    max_distance: int = 128
    activation: str = "relu"  # v1.1: "geglu_tanh" (HF's "gated-gelu")
    tie_word_embeddings: bool = True  # v1.1: False (its own output matrix)
    rescale_output: bool = True  # d_model^-0.5 before the logits; v1.1: False
    dropout: float = 0.1
    eps: float = 1e-6
    pad_token_id: int = 0
    decoder_start_token_id: int = 0

    @classmethod
    def from_hf(cls, hf_config: Any) -> T5Config:
        """Ours from a ``transformers.T5Config``. Our attention projects to d_model, so
        num_heads * d_kv must equal d_model (true of t5-small/base/large, not of v1.1-small)."""
        check_hf_class(hf_config, "T5Config")
        if hf_config.num_heads * hf_config.d_kv != hf_config.d_model:
            raise ValueError(f"num_heads * d_kv = {hf_config.num_heads * hf_config.d_kv} must "
                             f"equal d_model = {hf_config.d_model} for this implementation")
        ffn = (hf_config.is_gated_act, hf_config.dense_act_fn)
        if ffn not in _HF_FFNS:
            raise ValueError(f"feed_forward_proj {hf_config.feed_forward_proj!r} is not supported")
        return cls(vocab_size=hf_config.vocab_size, d_model=hf_config.d_model,
                   d_ff=hf_config.d_ff, num_layers=hf_config.num_layers,
                   num_decoder_layers=hf_config.num_decoder_layers,
                   num_heads=hf_config.num_heads,
                   num_buckets=hf_config.relative_attention_num_buckets,
                   max_distance=hf_config.relative_attention_max_distance,
                   activation=_HF_FFNS[ffn], tie_word_embeddings=hf_config.tie_word_embeddings,
                   # transformers 5 always ties and keeps v1.1's "untied" as "do not rescale"
                   rescale_output=getattr(hf_config, "scale_decoder_outputs",
                                          hf_config.tie_word_embeddings),
                   dropout=hf_config.dropout_rate, eps=hf_config.layer_norm_epsilon,
                   pad_token_id=hf_config.pad_token_id,
                   decoder_start_token_id=getattr(hf_config, "decoder_start_token_id", None)
                   or hf_config.pad_token_id)  # T5 starts decoding with the pad id


class T5Stack(nn.Module):
    """T5's encoder (``is_decoder=False``) or decoder: layers, one relative position bias shared
    by all of them, a final RMS norm. The token embedding is the model's (shared by both)."""

    def __init__(self, config: T5Config, is_decoder: bool,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.is_decoder = is_decoder
        layer = DecoderLayer if is_decoder else EncoderLayer
        n = config.num_decoder_layers if is_decoder else config.num_layers
        self.layers = nn.ModuleList(
            layer(config.d_model, config.num_heads, config.d_ff, config.dropout,
                  activation=config.activation, norm="rms", wiring="pre", eps=config.eps,
                  bias=False, attn_scale=1.0, **factory)
            for _ in range(n))
        self.relative_bias = RelativePositionBias(config.num_heads, config.num_buckets,
                                                  config.max_distance,
                                                  bidirectional=not is_decoder)
        self.relative_bias.to(**factory)
        self.final_norm = RMSNorm(config.d_model, eps=config.eps, **factory)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, padding: Tensor | None, memory: Tensor | None = None,
                memory_padding: Tensor | None = None, output_attentions: bool = False
                ) -> tuple[Tensor, list[Tensor | None], list[Tensor | None]]:
        """x: (batch, t, d_model) embedded tokens -> (batch, t, d_model), self-attention weights
        and (decoder only) cross-attention weights per layer."""
        t = x.shape[1]
        bias = self.relative_bias(t, t).unsqueeze(0).to(x.dtype)  # (1, heads, t, t), all layers
        if self.is_decoder:  # the causal triangle folded into the bias (SDPA takes one mask)
            bias = bias.masked_fill(~causal_mask(t, device=x.device), torch.finfo(bias.dtype).min)
        x = self.dropout(x)
        self_weights, cross_weights = [], []
        for layer in self.layers:
            if self.is_decoder:
                x, w_self, w_cross = layer(x, memory, tgt_mask=bias, tgt_key_padding_mask=padding,
                                           memory_key_padding_mask=memory_padding,
                                           tgt_is_causal=False,
                                           output_attentions=output_attentions)
                cross_weights.append(w_cross)
            else:
                x, w_self = layer(x, attn_mask=bias, key_padding_mask=padding,
                                  output_attentions=output_attentions)
            self_weights.append(w_self)
        return self.dropout(self.final_norm(x)), self_weights, cross_weights


@dataclass
class T5Output:
    """logits: (batch, t_dec, vocab_size); encoder_last_hidden_state: (batch, t_enc, d_model);
    with output_attentions, per layer: encoder_attentions (batch, heads, t_enc, t_enc),
    decoder_attentions (batch, heads, t_dec, t_dec), cross_attentions (batch, heads, t_dec,
    t_enc); otherwise None."""

    logits: Tensor
    encoder_last_hidden_state: Tensor
    encoder_attentions: tuple[Tensor, ...] | None = None
    decoder_attentions: tuple[Tensor, ...] | None = None
    cross_attentions: tuple[Tensor, ...] | None = None


def _stack_names(hf: str, decoder: bool, gated: bool) -> list[tuple[str, str]]:
    ours = "decoder" if decoder else "encoder"
    block = f"{hf}.block.{{i}}.layer"
    ffn = f"{block}.{2 if decoder else 1}"
    names = [
        (f"{ours}.layers.{{i}}.self_attn.q_proj.", f"{block}.0.SelfAttention.q."),
        (f"{ours}.layers.{{i}}.self_attn.k_proj.", f"{block}.0.SelfAttention.k."),
        (f"{ours}.layers.{{i}}.self_attn.v_proj.", f"{block}.0.SelfAttention.v."),
        (f"{ours}.layers.{{i}}.self_attn.out_proj.", f"{block}.0.SelfAttention.o."),
        (f"{ours}.layers.{{i}}.{'self' if decoder else 'attn'}_block.norm.",
         f"{block}.0.layer_norm."),
        # gated: act(x wi_0) * (x wi_1); plain: act(x wi)
        (f"{ours}.layers.{{i}}.ffn.linear1.", f"{ffn}.DenseReluDense.wi{'_0' if gated else ''}."),
        (f"{ours}.layers.{{i}}.ffn.linear_v.", f"{ffn}.DenseReluDense.wi_1."),
        (f"{ours}.layers.{{i}}.ffn.linear2.", f"{ffn}.DenseReluDense.wo."),
        (f"{ours}.layers.{{i}}.ffn_block.norm.", f"{ffn}.layer_norm."),
        (f"{ours}.relative_bias.bias.",
         f"{hf}.block.0.layer.0.SelfAttention.relative_attention_bias."),
        (f"{ours}.final_norm.", f"{hf}.final_layer_norm."),
    ]
    if decoder:
        names += [
            (f"{ours}.layers.{{i}}.cross_attn.q_proj.", f"{block}.1.EncDecAttention.q."),
            (f"{ours}.layers.{{i}}.cross_attn.k_proj.", f"{block}.1.EncDecAttention.k."),
            (f"{ours}.layers.{{i}}.cross_attn.v_proj.", f"{block}.1.EncDecAttention.v."),
            (f"{ours}.layers.{{i}}.cross_attn.out_proj.", f"{block}.1.EncDecAttention.o."),
            (f"{ours}.layers.{{i}}.cross_block.norm.", f"{block}.1.layer_norm."),
        ]
    return names


def init_t5_weights(model: T5) -> None:
    """T5's initialisation (Mesh TensorFlow's): embeddings N(0, 1); every other matrix
    N(0, 1/fan_in), with the query's also divided by d_kv. That 1/sqrt(d_kv) in the
    initialisation replaces the 1/sqrt(d_kv) T5 leaves out of attention."""
    cfg = model.config
    d_kv = cfg.d_model // cfg.num_heads
    with torch.no_grad():
        nn.init.normal_(model.shared.weight, std=1.0)
        if model.lm_head is not None:
            nn.init.normal_(model.lm_head.weight, std=1.0)
        for module in model.modules():
            if isinstance(module, MultiHeadAttention):
                nn.init.normal_(module.q_proj.weight, std=(cfg.d_model * d_kv) ** -0.5)
                nn.init.normal_(module.k_proj.weight, std=cfg.d_model ** -0.5)
                nn.init.normal_(module.v_proj.weight, std=cfg.d_model ** -0.5)
                nn.init.normal_(module.out_proj.weight, std=cfg.d_model ** -0.5)
            elif isinstance(module, FeedForward):
                for linear in (module.linear1, module.linear_v):
                    if linear is not None:
                        nn.init.normal_(linear.weight, std=cfg.d_model ** -0.5)
                nn.init.normal_(module.linear2.weight, std=cfg.d_ff ** -0.5)
            elif isinstance(module, RelativePositionBias):
                nn.init.normal_(module.bias.weight, std=cfg.d_model ** -0.5)


def shift_right(labels: Tensor, start_token_id: int = 0, pad_token_id: int = 0) -> Tensor:
    """Teacher forcing's decoder input: ``start_token_id`` then the labels without their last
    token, IGNORE_INDEX replaced by the pad id. (batch, t) -> (batch, t)."""
    shifted = labels.new_full(labels.shape, start_token_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_token_id)


class T5(HFInterop, nn.Module):
    """T5 for conditional generation: shared token embedding, encoder, decoder, output layer.

    forward(input_ids, decoder_input_ids, attention_mask=None, decoder_attention_mask=None,
            output_attentions=False):
        input_ids: (batch, t_enc) and decoder_input_ids: (batch, t_dec) ids in [0, vocab_size)
        (build the decoder's with :func:`shift_right` from the labels);
        attention_mask / decoder_attention_mask: (batch, t) bool or 0/1, True = real token.
        Returns a :class:`T5Output`; :func:`t5_loss` gives the training loss.
    Relative positions have no maximum length: any t is accepted.
    """

    HF_CLASS = "T5ForConditionalGeneration"
    CONFIG = T5Config

    def __init__(self, config: T5Config, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if config.activation not in ACTIVATIONS.keys() | GATED_ACTIVATIONS.keys():
            raise ValueError(f"activation {config.activation!r} is not an FFN activation of "
                             "lecture_pkg.layers")
        factory = {"device": device, "dtype": dtype}
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model, **factory)
        self.encoder = T5Stack(config, is_decoder=False, **factory)
        self.decoder = T5Stack(config, is_decoder=True, **factory)
        self.lm_head = None if config.tie_word_embeddings else \
            nn.Linear(config.d_model, config.vocab_size, bias=False, **factory)
        init_t5_weights(self)

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None,
               output_attentions: bool = False) -> tuple[Tensor, list[Tensor | None]]:
        """(batch, t_enc) ids -> ((batch, t_enc, d_model), encoder self-attention weights)."""
        check_token_ids("input_ids", input_ids, self.config.vocab_size)
        padding = check_padding_mask("attention_mask", attention_mask, tuple(input_ids.shape))
        memory, weights, _ = self.encoder(self.shared(input_ids), padding,
                                          output_attentions=output_attentions)
        return memory, weights

    def decode(self, decoder_input_ids: Tensor, memory: Tensor,
               attention_mask: Tensor | None = None, decoder_attention_mask: Tensor | None = None,
               output_attentions: bool = False) -> tuple[Tensor, list, list]:
        """Logits (batch, t_dec, vocab_size) for every decoder position given the encoder's
        output ``memory`` (batch, t_enc, d_model), plus self and cross weights per layer."""
        check_token_ids("decoder_input_ids", decoder_input_ids, self.config.vocab_size)
        if decoder_input_ids.shape[0] != memory.shape[0]:
            raise ValueError(f"decoder_input_ids has batch size {decoder_input_ids.shape[0]} but "
                             f"the encoder's output has {memory.shape[0]}")
        padding = check_padding_mask("decoder_attention_mask", decoder_attention_mask,
                                     tuple(decoder_input_ids.shape))
        memory_padding = check_padding_mask("attention_mask", attention_mask,
                                            tuple(memory.shape[:2]))
        y, self_weights, cross_weights = self.decoder(
            self.shared(decoder_input_ids), padding, memory, memory_padding, output_attentions)
        if self.config.rescale_output:  # v1.0's tied embeddings: N(0, 1) rows, so scale down
            y = y * self.config.d_model ** -0.5
        weight = self.shared.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(y, weight), self_weights, cross_weights

    def forward(self, input_ids: Tensor, decoder_input_ids: Tensor,
                attention_mask: Tensor | None = None, decoder_attention_mask: Tensor | None = None,
                output_attentions: bool = False) -> T5Output:
        memory, enc_weights = self.encode(input_ids, attention_mask, output_attentions)
        logits, dec_weights, cross_weights = self.decode(
            decoder_input_ids, memory, attention_mask, decoder_attention_mask, output_attentions)
        if not output_attentions:
            return T5Output(logits, memory)
        return T5Output(logits, memory, tuple(enc_weights), tuple(dec_weights),
                        tuple(cross_weights))

    # ---------------------------------------------------------------- Hugging Face interop

    def hf_names(self) -> list[tuple[str, str]]:
        gated = self.config.activation in GATED_ACTIVATIONS
        return [("shared.", "shared."), ("lm_head.", "lm_head."),
                *_stack_names("encoder", decoder=False, gated=gated),
                *_stack_names("decoder", decoder=True, gated=gated)]

    def hf_ignored(self) -> list[str]:
        """HF stores the shared embedding in the encoder and decoder too (and as lm_head when
        tied): the same tensor, loaded once."""
        ignored = [r"(encoder|decoder)\.embed_tokens\.weight"]
        return ignored + [r"lm_head\.weight"] if self.lm_head is None else ignored

    def hf_aliases(self) -> dict[str, str]:
        copies = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
        copies += ["lm_head.weight"] if self.lm_head is None else []
        return dict.fromkeys(copies, "shared.weight")


def t5_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the label positions that are not IGNORE_INDEX.
    logits: (batch, t, vocab_size); labels: (batch, t)."""
    if tuple(labels.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"labels must have shape {tuple(logits.shape[:2])}, "
                         f"got {tuple(labels.shape)}")
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
