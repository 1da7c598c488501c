"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017) and the
recipe it was trained with.

1. :class:`Transformer`: token embeddings scaled by sqrt(d_model) plus sinusoidal positions,
   dropout, a stack of :class:`~lecture_pkg.layers.EncoderLayer` and one of
   :class:`~lecture_pkg.layers.DecoderLayer`, a final norm (pre-LN stacks need one; torch's
   ``nn.Transformer`` always has one), and a linear map to the target vocabulary; the source,
   target and output embeddings can share one matrix (the paper's shared BPE vocabulary).
   ``encode``, ``decode`` (incrementally, with a key-value cache) and ``generate`` (greedy or
   beam search through :mod:`lecture_pkg.generation`);
2. :func:`count_parameters`: a configuration's size, built on the meta device (no memory);
3. the training recipe: :func:`transformer_lr` (warmup, then inverse square root decay),
   :func:`label_smoothed_cross_entropy` and :func:`transformer_adam` (beta2 = 0.98, eps = 1e-9);
4. evaluation: :func:`corpus_bleu` (Papineni et al. 2002) on token sequences, with
   :func:`ngram_matches` for its clipped n-gram counts.

Shapes: src (batch, t_src), tgt (batch, t_tgt) LongTensors; masks are bool with True = a real
token that may be attended (the opposite of ``nn.Transformer``'s bool masks).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lecture_pkg.attention import KVCache
from lecture_pkg.checks import check_bool_mask, check_int
from lecture_pkg.generation import beam_search, greedy_search
from lecture_pkg.layers import (
    DecoderLayer,
    EncoderLayer,
    NormKind,
    Wiring,
    deepnet_constants,
    deepnet_init_,
    make_norm,
)
from lecture_pkg.positional import sinusoidal_encoding

__all__ = [
    "Transformer",
    "corpus_bleu",
    "count_parameters",
    "label_smoothed_cross_entropy",
    "ngram_matches",
    "transformer_adam",
    "transformer_lr",
    "transformer_lr_lambda",
]

DecoderCache = list[tuple[KVCache, KVCache]]
"""One (self-attention, cross-attention) cache pair per decoder layer."""

# --------------------------------------------------------------------------------------------
# 1. The model
# --------------------------------------------------------------------------------------------


class Transformer(nn.Module):
    """The encoder-decoder Transformer (base: the defaults; big: d_model 1024, 16 heads,
    d_ff 4096, dropout 0.3).

    ``share_embeddings`` uses one matrix for source and target tokens (a joint vocabulary:
    src_vocab_size must equal tgt_vocab_size); ``tie_output`` makes the pre-softmax linear map
    the target embedding's transpose. The paper does both. ``wiring="deepnorm"`` uses
    DeepNet's constants for N encoder and M decoder layers (:func:`~lecture_pkg.layers.
    deepnet_constants`, held in ``self.deepnet``): each stack's residual is scaled by its alpha
    and its FFN, value and output projections are initialised with gain beta. ``final_norm`` (default: True for
    "pre" and "sandwich" wiring, whose stacks otherwise end un-normalised) adds a norm after
    each stack. ``pad_token_id``, when given, builds the padding masks from the ids.

    forward(src, tgt, src_key_padding_mask=None, tgt_key_padding_mask=None,
            output_attentions=False) -> logits (batch, t_tgt, tgt_vocab_size), with
        output_attentions also a dict of per-layer weights "encoder", "decoder_self", "cross"
        ((batch, heads, t_q, t_k) each). tgt is the decoder input (BOS y1 ... y_{n-1}); the
        decoder is causal.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, d_model: int = 512,
                 num_heads: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 d_ff: int = 2048, dropout: float = 0.1, activation: str = "relu",
                 norm: NormKind = "layer", wiring: Wiring = "post", eps: float = 1e-5,
                 share_embeddings: bool = True, tie_output: bool = True,
                 final_norm: bool | None = None, pad_token_id: int | None = None,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        check_int("src_vocab_size", src_vocab_size, minimum=1)
        check_int("tgt_vocab_size", tgt_vocab_size, minimum=1)
        check_int("d_model", d_model, minimum=2)
        check_int("num_heads", num_heads, minimum=1)
        check_int("num_encoder_layers", num_encoder_layers, minimum=1)
        check_int("num_decoder_layers", num_decoder_layers, minimum=1)
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} must be divisible by num_heads {num_heads}")
        if d_model % 2:
            raise ValueError(f"d_model must be even (sine/cosine pairs), got {d_model}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"share_embeddings needs one vocabulary: src_vocab_size "
                             f"{src_vocab_size} != tgt_vocab_size {tgt_vocab_size}")
        if pad_token_id is not None:
            check_int("pad_token_id", pad_token_id)
        factory = {"device": device, "dtype": dtype}
        layer = {"d_model": d_model, "num_heads": num_heads, "d_ff": d_ff, "dropout": dropout,
                 "activation": activation, "norm": norm, "wiring": wiring, "eps": eps, **factory}
        self.d_model, self.pad_token_id = d_model, pad_token_id
        # DeepNorm: (alpha, beta) per stack; alpha up-weights the residual, beta the init
        self.deepnet = (deepnet_constants(num_encoder_layers, num_decoder_layers)
                        if wiring == "deepnorm" else None)
        alpha = {"encoder": 1.0, "decoder": 1.0} if self.deepnet is None else {
            stack: constants[0] for stack, constants in self.deepnet.items()}
        self.encoder_layers = nn.ModuleList(EncoderLayer(**layer, alpha=alpha["encoder"])
                                            for _ in range(num_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(**layer, alpha=alpha["decoder"])
                                            for _ in range(num_decoder_layers))
        if final_norm is None:
            final_norm = wiring in ("pre", "sandwich")
        self.encoder_norm = make_norm(norm, d_model, eps, **factory) if final_norm else None
        self.decoder_norm = make_norm(norm, d_model, eps, **factory) if final_norm else None
        self.src_embed = nn.Embedding(src_vocab_size, d_model, **factory)
        self.tgt_embed = self.src_embed if share_embeddings else nn.Embedding(
            tgt_vocab_size, d_model, **factory)
        self.output = nn.Linear(d_model, tgt_vocab_size, bias=False, **factory)
        if tie_output:
            self.output.weight = self.tgt_embed.weight
        self.dropout = nn.Dropout(dropout)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """Xavier-uniform matrices (as nn.Transformer); with DeepNorm wiring DeepNet's
        Xavier-normal instead, gain beta on the FFN, value and output projections
        (:func:`~lecture_pkg.layers.deepnet_init_`). Embeddings N(0, 1/d_model), so that
        sqrt(d_model) * embedding has unit variance, like the sinusoids it is added to, and a
        tied output layer starts with small logits."""
        for layer in [*self.encoder_layers, *self.decoder_layers]:
            for p in layer.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
        if self.deepnet is not None:
            for stack, (_, beta) in self.deepnet.items():
                for layer in getattr(self, f"{stack}_layers"):
                    deepnet_init_(layer, beta)
        for embedding in (self.src_embed, self.tgt_embed):
            nn.init.normal_(embedding.weight, std=self.d_model**-0.5)
        if self.output.weight is not self.tgt_embed.weight:
            nn.init.normal_(self.output.weight, std=self.d_model**-0.5)

    # -- embeddings ------------------------------------------------------------------------

    def _embed(self, embedding: nn.Embedding, ids: Tensor, start: int) -> Tensor:
        if not isinstance(ids, Tensor) or ids.dtype != torch.long or ids.dim() != 2:
            got = (f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor)
                   else type(ids).__name__)
            raise TypeError(f"token ids must be a LongTensor of shape (batch, t), got {got}")
        x = embedding(ids) * math.sqrt(self.d_model)
        positions = sinusoidal_encoding(start + ids.shape[1], self.d_model, dtype=x.dtype,
                                        device=x.device)[start:]
        return self.dropout(x + positions)

    def embed_source(self, src: Tensor) -> Tensor:
        """sqrt(d_model) * E[src] + PE, dropped out: (batch, t_src) -> (batch, t_src, d_model)."""
        return self._embed(self.src_embed, src, 0)

    def embed_target(self, tgt: Tensor, start: int = 0) -> Tensor:
        """As :meth:`embed_source`, positions counted from ``start`` (cached decoding)."""
        return self._embed(self.tgt_embed, tgt, start)

    def _padding_mask(self, ids: Tensor, mask: Tensor | None, name: str) -> Tensor | None:
        if mask is None:
            return None if self.pad_token_id is None else ids != self.pad_token_id
        check_bool_mask(name, mask)
        if mask.shape != ids.shape:
            raise ValueError(f"{name} must have the ids' shape (batch, t) = {tuple(ids.shape)}, "
                             f"got {tuple(mask.shape)}")
        return mask

    # -- the two stacks --------------------------------------------------------------------

    def encode(self, src: Tensor, src_key_padding_mask: Tensor | None = None,
               output_attentions: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        """The memory (batch, t_src, d_model); with output_attentions also each layer's
        self-attention weights."""
        mask = self._padding_mask(src, src_key_padding_mask, "src_key_padding_mask")
        x, weights = self.embed_source(src), []
        for layer in self.encoder_layers:
            x, w = layer(x, key_padding_mask=mask, output_attentions=output_attentions)
            weights.append(w)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return (x, weights) if output_attentions else x

    def new_cache(self) -> DecoderCache:
        """An empty cache for :meth:`decode`: self-attention keys/values grow by the new
        positions at each call; cross-attention's are projected from the memory once."""
        return [(KVCache(), KVCache(static=True)) for _ in self.decoder_layers]

    def decode(self, tgt: Tensor, memory: Tensor, memory_key_padding_mask: Tensor | None = None,
               tgt_key_padding_mask: Tensor | None = None, cache: DecoderCache | None = None,
               output_attentions: bool = False
               ) -> Tensor | tuple[Tensor, list[Tensor], list[Tensor]]:
        """Logits (batch, t_tgt, tgt_vocab_size) of the next tokens, causally.

        With a ``cache`` (:meth:`new_cache`) tgt holds only the positions not yet seen, and a
        tgt_key_padding_mask must cover all of them, cached ones included. With
        output_attentions also each layer's self- and cross-attention weights.
        """
        start = 0 if cache is None else len(cache[0][0])
        if cache is not None and len(cache) != len(self.decoder_layers):
            raise ValueError(f"cache must hold one pair per decoder layer "
                             f"({len(self.decoder_layers)}), got {len(cache)}")
        if tgt_key_padding_mask is not None:
            check_bool_mask("tgt_key_padding_mask", tgt_key_padding_mask)
            expected = (tgt.shape[0], start + tgt.shape[1])
            if tuple(tgt_key_padding_mask.shape) != expected:
                raise ValueError(f"tgt_key_padding_mask must have shape (batch, cached + t_tgt)"
                                 f" = {expected}, got {tuple(tgt_key_padding_mask.shape)}")
        elif self.pad_token_id is not None and cache is None:
            tgt_key_padding_mask = tgt != self.pad_token_id
        y, self_weights, cross_weights = self.embed_target(tgt, start), [], []
        for i, layer in enumerate(self.decoder_layers):
            y, w_self, w_cross = layer(
                y, memory, memory_key_padding_mask=memory_key_padding_mask,
                tgt_key_padding_mask=tgt_key_padding_mask, tgt_is_causal=True,
                cache=None if cache is None else cache[i], output_attentions=output_attentions)
            self_weights.append(w_self)
            cross_weights.append(w_cross)
        if self.decoder_norm is not None:
            y = self.decoder_norm(y)
        logits = self.output(y)
        return (logits, self_weights, cross_weights) if output_attentions else logits

    def forward(self, src: Tensor, tgt: Tensor, src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, output_attentions: bool = False
                ) -> Tensor | tuple[Tensor, dict[str, list[Tensor]]]:
        src_mask = self._padding_mask(src, src_key_padding_mask, "src_key_padding_mask")
        tgt_mask = self._padding_mask(tgt, tgt_key_padding_mask, "tgt_key_padding_mask")
        if output_attentions:
            memory, encoder = self.encode(src, src_mask, output_attentions=True)
            logits, decoder_self, cross = self.decode(tgt, memory, src_mask, tgt_mask,
                                                      output_attentions=True)
            return logits, {"encoder": encoder, "decoder_self": decoder_self, "cross": cross}
        return self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask)

    # -- decoding --------------------------------------------------------------------------

    def generate(self, src: Tensor, src_key_padding_mask: Tensor | None = None, *,
                 bos_token_id: int, eos_token_id: int | Sequence[int], pad_token_id: int = 0,
                 num_beams: int = 1, length_penalty: float = 0.6,
                 max_new_tokens: int | None = None, use_cache: bool = True) -> Tensor:
        """Translate: greedy decoding (num_beams = 1) or beam search, by default with the
        paper's limit of source length + 50 new tokens (here the padded batch length, so one
        limit for the whole batch; the paper's is per sentence). Returns (batch, 1 + t_out) target ids
        starting with BOS, padded with pad_token_id after EOS."""
        mask = self._padding_mask(src, src_key_padding_mask, "src_key_padding_mask")
        check_int("num_beams", num_beams, minimum=1)
        memory = self.encode(src, mask)
        if num_beams > 1:  # beam search runs batch * num_beams rows, beams of one example adjacent
            memory = memory.repeat_interleave(num_beams, dim=0)
            mask = None if mask is None else mask.repeat_interleave(num_beams, dim=0)

        def step(tgt: Tensor, cache: DecoderCache | None) -> Tensor:
            return self.decode(tgt, memory, mask, cache=cache)  # type: ignore[return-value]

        start = torch.full((src.shape[0], 1), bos_token_id, dtype=torch.long, device=src.device)
        options: dict[str, Any] = {
            "max_new_tokens": src.shape[1] + 50 if max_new_tokens is None else max_new_tokens,
            "eos_token_id": eos_token_id, "pad_token_id": pad_token_id,
            "new_cache": self.new_cache, "use_cache": use_cache}
        if num_beams == 1:
            return greedy_search(step, start, **options)
        return beam_search(step, start, num_beams=num_beams, length_penalty=length_penalty,
                           **options)  # type: ignore[return-value]

    # -- interop ---------------------------------------------------------------------------

    @classmethod
    def from_torch(cls, module: nn.Transformer, src_vocab_size: int, tgt_vocab_size: int,
                   **embedding_options: Any) -> Transformer:
        """A Transformer whose encoder, decoder and final norms are copies of ``module``'s, with
        new embeddings and output layer (nn.Transformer has none). Feeding
        ``embed_source(src)``/``embed_target(tgt)`` to ``module`` and applying ``output`` gives
        our forward's logits. ``embedding_options``: share_embeddings, tie_output,
        pad_token_id."""
        if not isinstance(module, nn.Transformer):
            raise TypeError(f"module must be a torch.nn.Transformer, got {type(module).__name__}")
        encoder_layers = list(module.encoder.layers)
        decoder_layers = list(module.decoder.layers)
        first = encoder_layers[0]
        weight = first.linear1.weight
        model = cls(src_vocab_size, tgt_vocab_size, d_model=module.d_model,
                    num_heads=module.nhead, num_encoder_layers=len(encoder_layers),
                    num_decoder_layers=len(decoder_layers), d_ff=first.linear1.out_features,
                    dropout=first.dropout.p, wiring="pre" if first.norm_first else "post",
                    eps=first.norm1.eps, final_norm=module.encoder.norm is not None,
                    device=weight.device, dtype=weight.dtype, **embedding_options)
        model.encoder_layers = nn.ModuleList(EncoderLayer.from_torch(layer)
                                             for layer in encoder_layers)
        model.decoder_layers = nn.ModuleList(DecoderLayer.from_torch(layer)
                                             for layer in decoder_layers)
        with torch.no_grad():
            for ours, theirs in ((model.encoder_norm, module.encoder.norm),
                                 (model.decoder_norm, module.decoder.norm)):
                if ours is not None:
                    ours.load_state_dict(theirs.state_dict())
        return model


# --------------------------------------------------------------------------------------------
# 2. Counting parameters without allocating them
# --------------------------------------------------------------------------------------------


def count_parameters(src_vocab_size: int = 37000, tgt_vocab_size: int | None = None,
                     **config: Any) -> int:
    """The number of parameters of ``Transformer(src_vocab_size, tgt_vocab_size, **config)``,
    built on the meta device (shapes only, no memory), shared matrices counted once.
    The default vocabulary is the paper's shared English-German BPE vocabulary of ~37k."""
    with torch.device("meta"):
        model = Transformer(src_vocab_size, tgt_vocab_size or src_vocab_size, **config)
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------
# 3. The training recipe
# --------------------------------------------------------------------------------------------


def transformer_lr(step_num: int, d_model: int = 512, warmup_steps: int = 4000) -> float:
    """lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5) (the paper's
    eq. 3): linear warmup, then decay with the inverse square root of the step. The two terms
    meet at step_num = warmup_steps, the peak d_model^-0.5 * warmup_steps^-0.5 (6.99e-4 for
    d_model 512, warmup 4000). step_num counts optimizer steps from 1."""
    check_int("step_num", step_num, minimum=1)
    check_int("d_model", d_model, minimum=1)
    check_int("warmup_steps", warmup_steps, minimum=1)
    return d_model**-0.5 * min(step_num**-0.5, step_num * warmup_steps**-1.5)


def transformer_lr_lambda(d_model: int = 512, warmup_steps: int = 4000) -> Callable[[int], float]:
    """The schedule as a ``torch.optim.lr_scheduler.LambdaLR`` factor for an optimizer whose
    base lr is 1.0. LambdaLR asks for step 0 before the first update, so the factor at
    scheduler step s is :func:`transformer_lr` at step_num s + 1."""
    transformer_lr(1, d_model, warmup_steps)  # check the arguments now, not at the first step
    return lambda step: transformer_lr(step + 1, d_model, warmup_steps)


def transformer_adam(params: Any, lr: float = 1.0) -> torch.optim.Adam:
    """Adam with the paper's beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (no weight decay). Leave lr at
    1.0 and let :func:`transformer_lr_lambda` set the rate."""
    return torch.optim.Adam(params, lr=lr, betas=(0.9, 0.98), eps=1e-9)


def label_smoothed_cross_entropy(logits: Tensor, target: Tensor, smoothing: float = 0.1,
                                 ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """Cross entropy against a smoothed target: 1 - smoothing on the true class plus
    smoothing / vocab on every class (the true one included, as torch does), so

        loss = (1 - smoothing) * (-log p[y]) + smoothing * mean_v(-log p[v]).

    Positions whose target is ``ignore_index`` (padding) count for nothing; "mean" averages over
    the others. logits: (..., vocab) ; target: (...) long. Equals
    ``F.cross_entropy(logits.reshape(-1, vocab), target.flatten(), label_smoothing=smoothing,
    ignore_index=ignore_index)``.
    """
    if not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing!r}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not isinstance(target, Tensor) or target.dtype != torch.long:
        raise TypeError("target must be a LongTensor of class indices")
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"logits (..., vocab) and target (...) must agree: logits "
                         f"{tuple(logits.shape)}, target {tuple(target.shape)}")
    log_probs = logits.log_softmax(dim=-1)
    keep = target != ignore_index
    nll = -log_probs.gather(-1, target.masked_fill(~keep, 0)[..., None])[..., 0]
    uniform = -log_probs.mean(dim=-1)
    loss = ((1.0 - smoothing) * nll + smoothing * uniform).masked_fill(~keep, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / keep.sum()  # no real token at all: 0/0 = nan, as F.cross_entropy


# --------------------------------------------------------------------------------------------
# 4. Evaluating a translation: corpus BLEU
# --------------------------------------------------------------------------------------------


def ngram_matches(hypotheses: Sequence[Sequence[Any]], references: Sequence[Sequence[Any]],
                  max_order: int = 4) -> tuple[list[int], list[int]]:
    """Clipped n-gram matches and hypothesis n-gram totals for n = 1..max_order, pooled over
    the corpus (one reference per hypothesis): a hypothesis n-gram counts as matched at most as
    often as it occurs in its reference. Returns (matches, totals), each of length max_order."""
    check_int("max_order", max_order, minimum=1)
    if len(hypotheses) != len(references):
        raise ValueError(f"hypotheses and references must pair up, got {len(hypotheses)} and "
                         f"{len(references)}")
    matches, totals = [0] * max_order, [0] * max_order
    for hyp, ref in zip(hypotheses, references):
        for n in range(1, max_order + 1):
            hyp_ngrams = Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
            ref_ngrams = Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
            totals[n - 1] += sum(hyp_ngrams.values())
            matches[n - 1] += sum((hyp_ngrams & ref_ngrams).values())
    return matches, totals


def corpus_bleu(hypotheses: Sequence[Sequence[Any]], references: Sequence[Sequence[Any]],
                max_order: int = 4, smoothing: float | str = 0.0) -> float:
    """Corpus BLEU in percent: 100 * BP * exp(mean_n log p_n), p_n the pooled clipped n-gram
    precisions of :func:`ngram_matches` and BP = min(1, exp(1 - ref_len / hyp_len)) the
    brevity penalty (Papineni et al. 2002). Unsmoothed by default, so a corpus without a single
    matching max_order-gram scores 0. ``smoothing`` = k > 0 adds k to the matches and totals of
    the orders n >= 2 (Lin & Och 2004; sacreBLEU's ``smooth_method="add-k"``); ``"exp"`` is
    NIST's method, sacreBLEU's default: the j-th order with no match gets precision
    1 / (2^j * total). Tokens are any hashable items; equals ``sacrebleu.corpus_bleu`` with
    ``tokenize="none"`` and the same ``smooth_method`` ("none" for the default 0.0) on the
    space-joined tokens."""
    if smoothing != "exp" and (
            not isinstance(smoothing, (int, float)) or smoothing < 0):
        raise ValueError(f"smoothing must be a number >= 0 or 'exp', got {smoothing!r}")
    matches, totals = ngram_matches(hypotheses, references, max_order)
    hyp_len = sum(map(len, hypotheses))
    ref_len = sum(map(len, references))
    if hyp_len == 0 or not any(matches):
        return 0.0
    log_precision, halvings = 0.0, 0
    for n, (m, t) in enumerate(zip(matches, totals), start=1):
        if smoothing == "exp":
            if t == 0:
                return 0.0
            if m == 0:
                halvings += 1
            precision = 1 / (2**halvings * t) if m == 0 else m / t
            log_precision += math.log(precision) / max_order
            continue
        k = smoothing if n > 1 else 0.0
        if m + k == 0 or t + k == 0:
            return 0.0
        log_precision += math.log((m + k) / (t + k)) / max_order
    brevity = min(1.0, math.exp(1 - ref_len / hyp_len))
    return 100 * brevity * math.exp(log_precision)
