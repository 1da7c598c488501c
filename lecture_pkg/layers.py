"""The Transformer's building blocks, in the order a block uses them.

1. position-wise feed-forward networks: plain (ReLU, GELU, tanh-GELU, SiLU/Swish) and gated
   (GLU, ReGLU, GEGLU, SwiGLU; Shazeer 2020);
2. normalisation: LayerNorm (torch's) and RMSNorm;
3. residual wiring around a sub-layer: post-LN, pre-LN, sandwich and DeepNorm;
4. :class:`EncoderLayer` (self-attention + FFN) and :class:`DecoderLayer` (causal
   self-attention + cross-attention + FFN). A decoder-only model (GPT) stacks EncoderLayers with
   ``is_causal=True``: "encoder" here means "no cross-attention";
5. a sparse mixture-of-experts FFN with top-k routing and the Switch load-balancing loss.

Attention itself is :class:`lecture_pkg.attention.MultiHeadAttention`: the fused
``torch.nn.functional.scaled_dot_product_attention`` by default, the package's own attention
(which returns the weights) when a layer is called with ``output_attentions=True``.

Shapes: x: (batch, t, d_model), batch first. Masks: bool, True = may attend (see
:mod:`lecture_pkg.masks`), or float (added to the scores, e.g. a relative-position bias).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.attention import KVCache, MultiHeadAttention
from lecture_pkg.checks import check_float_tensor, check_int

__all__ = [
    "ACTIVATIONS",
    "GATED_ACTIVATIONS",
    "DecoderLayer",
    "EncoderLayer",
    "FeedForward",
    "MoEFeedForward",
    "RMSNorm",
    "Residual",
    "deepnet_constants",
    "deepnet_init_",
    "make_norm",
    "rms_norm",
]

Wiring = Literal["post", "pre", "sandwich", "deepnorm"]
NormKind = Literal["layer", "rms"]

# --------------------------------------------------------------------------------------------
# 1. Position-wise feed-forward networks
# --------------------------------------------------------------------------------------------

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact: x * Phi(x)
    "gelu_tanh": partial(F.gelu, approximate="tanh"),  # GPT-2's and BERT-TF's approximation
    "silu": F.silu,  # Swish with beta = 1: x * sigmoid(x)
}
"""Activations of the plain FFN: act(x W1 + b1) W2 + b2."""

GATED_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "glu": torch.sigmoid,  # Dauphin et al. 2017: sigmoid(xW) * xV
    "reglu": F.relu,
    "geglu": F.gelu,
    "geglu_tanh": partial(F.gelu, approximate="tanh"),  # T5 v1.1's "gated-gelu"
    "swiglu": F.silu,  # Shazeer 2020: Swish(xW) * xV, a Swish gate, not a sigmoid gate
}
"""Gates of the gated FFN: (act(x W) * (x V)) W2."""


def _check_choice(name: str, value: object, choices: object) -> None:
    if value not in choices:  # type: ignore[operator]
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")  # type: ignore[call-overload]


class FeedForward(nn.Module):
    """The position-wise FFN, applied to every position independently.

    Plain: ``linear2(dropout(act(linear1(x))))``. Gated (``activation`` in GATED_ACTIVATIONS):
    ``linear2(dropout(act(linear1(x)) * linear_v(x)))``.

    d_ff convention: ``d_ff`` is the width of each hidden projection, gated or not (as in T5
    v1.1 and HF). A gated FFN therefore has three d_model x d_ff matrices instead of two; to
    keep the parameter count of a plain FFN of width d, pass d_ff = 2d/3 (Shazeer 2020).

    x: (..., d_model) -> (..., d_model).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        check_int("d_model", d_model, minimum=1)
        check_int("d_ff", d_ff, minimum=1)
        _check_choice("activation", activation, ACTIVATIONS.keys() | GATED_ACTIVATIONS.keys())
        factory = {"device": device, "dtype": dtype}
        self.activation, self.gated = activation, activation in GATED_ACTIVATIONS
        self.act = (GATED_ACTIVATIONS if self.gated else ACTIVATIONS)[activation]
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias, **factory)
        self.linear_v = nn.Linear(d_model, d_ff, bias=bias, **factory) if self.gated else None
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias, **factory)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.act(self.linear1(x))
        if self.linear_v is not None:
            hidden = hidden * self.linear_v(x)
        return self.linear2(self.dropout(hidden))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


# --------------------------------------------------------------------------------------------
# 2. Normalisation
# --------------------------------------------------------------------------------------------

def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim: LayerNorm without the mean and
    without a bias (Zhang & Sennrich 2019). fp16/bf16 are normalised in float32."""
    x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return normed if weight is None else normed * weight


class RMSNorm(nn.Module):
    """:func:`rms_norm` with a learned gain; equal to ``torch.nn.RMSNorm(d, eps)``.

    T5 calls this its "LayerNorm" (eps 1e-6, no mean, no bias). x: (..., d) -> (..., d).
    """

    def __init__(self, d: int, eps: float = 1e-6, elementwise_affine: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        check_int("d", d, minimum=1)
        self.d, self.eps = d, eps
        self.weight = (nn.Parameter(torch.ones(d, device=device, dtype=dtype))
                       if elementwise_affine else None)

    def forward(self, x: Tensor) -> Tensor:
        check_float_tensor("x", x)
        if x.shape[-1] != self.d:
            raise ValueError(f"x has last dim {x.shape[-1]} but RMSNorm normalises {self.d}")
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"


def make_norm(kind: NormKind, d: int, eps: float = 1e-5, bias: bool = True,
              device: torch.device | str | None = None,
              dtype: torch.dtype | None = None) -> nn.Module:
    """``"layer"``: ``nn.LayerNorm(d, eps, bias=bias)``; ``"rms"``: :class:`RMSNorm` (no bias)."""
    _check_choice("norm", kind, ("layer", "rms"))
    if kind == "layer":
        return nn.LayerNorm(d, eps=eps, bias=bias, device=device, dtype=dtype)
    return RMSNorm(d, eps=eps, device=device, dtype=dtype)


# --------------------------------------------------------------------------------------------
# 3. Residual wiring
# --------------------------------------------------------------------------------------------

class Residual(nn.Module):
    """A sub-layer F with its residual connection, normalisation and dropout:

    - ``"post"``:     Norm(x + Dropout(F(x)))            (Vaswani et al. 2017; BERT)
    - ``"pre"``:      x + Dropout(F(Norm(x)))            (GPT-2, T5, ViT; Xiong et al. 2020)
    - ``"sandwich"``: x + Dropout(Norm'(F(Norm(x))))     (CogView's Sandwich-LN, Ding et al. 2021)
    - ``"deepnorm"``: Norm(alpha * x + Dropout(F(x)))    (DeepNet, Wang et al. 2022)

    Dropout sits on the sub-layer's output before the add (the paper's residual dropout). ``norm`` is the norm
    at the input (pre, sandwich) or at the output (post, deepnorm); ``out_norm`` is sandwich's
    second one. forward(x, sublayer): x (batch, t, d_model) -> (batch, t, d_model).
    """

    def __init__(self, d_model: int, wiring: Wiring = "post", norm: NormKind = "layer",
                 eps: float = 1e-5, dropout: float = 0.0, alpha: float = 1.0, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        _check_choice("wiring", wiring, ("post", "pre", "sandwich", "deepnorm"))
        if wiring != "deepnorm" and alpha != 1.0:
            raise ValueError(f"alpha scales the residual only for wiring='deepnorm', got {alpha}")
        factory = {"device": device, "dtype": dtype}
        self.wiring, self.alpha = wiring, alpha
        self.norm = make_norm(norm, d_model, eps, bias, **factory)
        self.out_norm = make_norm(norm, d_model, eps, bias, **factory) if wiring == "sandwich" else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.wiring == "post":
            return self.norm(x + self.dropout(sublayer(x)))
        if self.wiring == "pre":
            return x + self.dropout(sublayer(self.norm(x)))
        if self.wiring == "sandwich":
            assert self.out_norm is not None
            return x + self.dropout(self.out_norm(sublayer(self.norm(x))))
        return self.norm(self.alpha * x + self.dropout(sublayer(x)))

    def extra_repr(self) -> str:
        return f"wiring={self.wiring!r}" + (f", alpha={self.alpha:.4g}" if self.alpha != 1 else "")


def deepnet_constants(encoder_layers: int, decoder_layers: int) -> dict[str, tuple[float, float]]:
    """DeepNet's (alpha, beta) for each stack (Wang et al. 2022, Table 1).

    alpha up-weights the residual in Norm(alpha x + F(x)); beta scales the initialisation of
    the FFN, value and output projections (:func:`deepnet_init_`). Pass 0 layers for a stack a
    model does not have: encoder-only uses (2N)^(1/4), (8N)^(-1/4); decoder-only (2M)^(1/4),
    (8M)^(-1/4); an encoder-decoder 0.81 (N^4 M)^(1/16), 0.87 (N^4 M)^(-1/16) for the encoder
    and (3M)^(1/4), (12M)^(-1/4) for the decoder.
    """
    n = check_int("encoder_layers", encoder_layers)
    m = check_int("decoder_layers", decoder_layers)
    if n == m == 0:
        raise ValueError("encoder_layers and decoder_layers cannot both be 0")
    if m == 0:
        return {"encoder": ((2 * n) ** 0.25, (8 * n) ** -0.25)}
    if n == 0:
        return {"decoder": ((2 * m) ** 0.25, (8 * m) ** -0.25)}
    return {"encoder": (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)),
            "decoder": ((3 * m) ** 0.25, (12 * m) ** -0.25)}


def deepnet_init_(layer: nn.Module, beta: float) -> None:
    """DeepNet's initialisation: Xavier-normal with gain beta for every FFN weight and the value
    and output projections of every attention, gain 1 for queries and keys."""
    for module in layer.modules():
        if isinstance(module, MultiHeadAttention):
            nn.init.xavier_normal_(module.q_proj.weight)
            nn.init.xavier_normal_(module.k_proj.weight)
            nn.init.xavier_normal_(module.v_proj.weight, gain=beta)
            nn.init.xavier_normal_(module.out_proj.weight, gain=beta)
        elif isinstance(module, FeedForward):
            for linear in (module.linear1, module.linear_v, module.linear2):
                if linear is not None:
                    nn.init.xavier_normal_(linear.weight, gain=beta)


# --------------------------------------------------------------------------------------------
# 4. Encoder and decoder layers
# --------------------------------------------------------------------------------------------

class EncoderLayer(nn.Module):
    """Self-attention then FFN, each inside a :class:`Residual`.

    With ``is_causal=True`` (and optionally a :class:`KVCache`) it is a decoder-only block (GPT).
    ``ffn`` replaces the default :class:`FeedForward` (e.g. by a :class:`MoEFeedForward`).
    ``ffn_dropout`` is the default FFN's dropout between its two linear layers: ``None`` uses
    ``dropout`` (torch's layers, T5), 0.0 leaves only the residual dropout after the FFN (BERT,
    GPT-2: HF's BertIntermediate/BertOutput and GPT2MLP have no inner dropout).
    ``attn_scale`` multiplies q k^T (default 1/sqrt(head_dim); T5 uses 1.0).

    forward(x, attn_mask=None, key_padding_mask=None, is_causal=False, cache=None,
            output_attentions=False) -> (x, weights):
        x: (batch, t, d_model); masks as :class:`MultiHeadAttention` takes them;
        weights: (batch, heads, t, t_k) when output_attentions, else None.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1,
                 activation: str = "relu", norm: NormKind = "layer", wiring: Wiring = "post",
                 eps: float = 1e-5, bias: bool = True, attn_scale: float | None = None,
                 alpha: float = 1.0, ffn: nn.Module | None = None,
                 ffn_dropout: float | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        residual = {"wiring": wiring, "norm": norm, "eps": eps, "dropout": dropout,
                    "alpha": alpha, "bias": bias, **factory}
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias,
                                            scale=attn_scale, **factory)
        inner = dropout if ffn_dropout is None else ffn_dropout
        self.ffn = ffn if ffn is not None else FeedForward(d_model, d_ff, activation, inner,
                                                           bias, **factory)
        self.attn_block = Residual(d_model, **residual)
        self.ffn_block = Residual(d_model, **residual)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None,
                key_padding_mask: Tensor | None = None, is_causal: bool = False,
                cache: KVCache | None = None,
                output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        weights = None

        def self_attention(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.self_attn(h, h, h, attn_mask, key_padding_mask, is_causal,
                                          need_weights=output_attentions, cache=cache)
            return out

        x = self.attn_block(x, self_attention)
        return self.ffn_block(x, self.ffn), weights

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> EncoderLayer:
        """A copy of ``layer``'s weights (post-LN or ``norm_first``), giving equal outputs. Our
        layer is batch first and its bool masks mean "may attend": pass ``~mask`` to torch."""
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise TypeError(f"layer must be a torch.nn.TransformerEncoderLayer, "
                            f"got {type(layer).__name__}")
        copy = cls(**_torch_layer_config(layer))
        _copy_torch_blocks(copy, layer, [copy.attn_block, copy.ffn_block])
        copy.self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        return copy


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder's output, FFN; each inside a
    :class:`Residual`.

    forward(y, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
            memory_key_padding_mask=None, tgt_is_causal=True, cache=None,
            output_attentions=False) -> (y, self_weights, cross_weights):
        y: (batch, t_tgt, d_model); memory: (batch, t_src, d_model).
        cache: (self-attention KVCache, cross-attention KVCache(static=True)) for incremental
            decoding; y then holds only the new positions.
        The weights are (batch, heads, t_tgt, t_k) when output_attentions, else None.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1,
                 activation: str = "relu", norm: NormKind = "layer", wiring: Wiring = "post",
                 eps: float = 1e-5, bias: bool = True, attn_scale: float | None = None,
                 alpha: float = 1.0, ffn: nn.Module | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        residual = {"wiring": wiring, "norm": norm, "eps": eps, "dropout": dropout,
                    "alpha": alpha, "bias": bias, **factory}
        attention = {"dropout": dropout, "bias": bias, "scale": attn_scale, **factory}
        self.self_attn = MultiHeadAttention(d_model, num_heads, **attention)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, **attention)
        self.ffn = ffn if ffn is not None else FeedForward(d_model, d_ff, activation, dropout,
                                                           bias, **factory)
        self.self_block = Residual(d_model, **residual)
        self.cross_block = Residual(d_model, **residual)
        self.ffn_block = Residual(d_model, **residual)

    def forward(self, y: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None, tgt_is_causal: bool = True,
                cache: tuple[KVCache, KVCache] | None = None,
                output_attentions: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        self_cache, cross_cache = (None, None) if cache is None else cache
        self_weights = cross_weights = None

        def self_attention(h: Tensor) -> Tensor:
            nonlocal self_weights
            out, self_weights = self.self_attn(h, h, h, tgt_mask, tgt_key_padding_mask,
                                               tgt_is_causal, need_weights=output_attentions,
                                               cache=self_cache)
            return out

        def cross_attention(h: Tensor) -> Tensor:
            nonlocal cross_weights
            out, cross_weights = self.cross_attn(h, memory, memory, memory_mask,
                                                 memory_key_padding_mask,
                                                 need_weights=output_attentions,
                                                 cache=cross_cache)
            return out

        y = self.self_block(y, self_attention)
        y = self.cross_block(y, cross_attention)
        return self.ffn_block(y, self.ffn), self_weights, cross_weights

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> DecoderLayer:
        """A copy of ``layer``'s weights (post-LN or ``norm_first``), giving equal outputs."""
        if not isinstance(layer, nn.TransformerDecoderLayer):
            raise TypeError(f"layer must be a torch.nn.TransformerDecoderLayer, "
                            f"got {type(layer).__name__}")
        copy = cls(**_torch_layer_config(layer))
        _copy_torch_blocks(copy, layer, [copy.self_block, copy.cross_block, copy.ffn_block])
        copy.self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        copy.cross_attn = MultiHeadAttention.from_torch(layer.multihead_attn)
        return copy


def _torch_layer_config(layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer) -> dict:
    """Our constructor arguments for one of torch's layers."""
    activation = layer.activation
    names = {F.relu: "relu", F.gelu: "gelu"}
    if isinstance(activation, nn.ReLU):
        name = "relu"
    elif isinstance(activation, nn.GELU) and activation.approximate == "none":
        name = "gelu"
    elif activation in names:
        name = names[activation]
    else:
        raise ValueError(f"unsupported activation {activation!r}: relu or exact gelu only")
    weight = layer.linear1.weight
    return {"d_model": layer.linear1.in_features, "num_heads": layer.self_attn.num_heads,
            "d_ff": layer.linear1.out_features, "dropout": layer.dropout.p, "activation": name,
            "wiring": "pre" if layer.norm_first else "post", "eps": layer.norm1.eps,
            "bias": layer.linear1.bias is not None, "device": weight.device, "dtype": weight.dtype}


def _copy_torch_blocks(copy: nn.Module, layer: nn.Module, blocks: list[Residual]) -> None:
    """Copy the FFN and the norms (norm1, norm2, norm3 in block order) from torch's layer."""
    with torch.no_grad():
        copy.ffn.linear1.load_state_dict(layer.linear1.state_dict())
        copy.ffn.linear2.load_state_dict(layer.linear2.state_dict())
        for i, block in enumerate(blocks, start=1):
            block.norm.load_state_dict(getattr(layer, f"norm{i}").state_dict())


# --------------------------------------------------------------------------------------------
# 5. Sparse mixture of experts
# --------------------------------------------------------------------------------------------

class MoEFeedForward(nn.Module):
    """A sparse mixture-of-experts FFN (Shazeer et al. 2017; Switch, Fedus et al. 2022).

    A linear router scores every token against ``num_experts`` experts; each token goes to its
    top ``k`` experts, whose outputs are mixed with the router's softmax probabilities
    renormalised over those k (for k = 1 the probability itself is used, as in Switch, so the
    router still gets a gradient). Every expert is a :class:`FeedForward`.

    After each forward the module holds, for the batch it just saw:

    - ``aux_loss``: Switch's load-balancing loss E * sum_e f_e * P_e, where f_e is the fraction
      of token-to-expert assignments that went to expert e and P_e the mean router probability
      of e. It is 1 for perfectly balanced routing and grows as routing concentrates; add it
      (times a small coefficient such as 0.01) to the training loss;
    - ``expert_fraction``: (num_experts,) the f_e above, summing to 1;
    - ``dropped_fraction``: the fraction of assignments that found their expert full.

    ``capacity_factor`` (Switch): each expert processes at most
    ceil(capacity_factor * tokens * k / num_experts) assignments per forward, in token order;
    the rest are dropped (that expert adds nothing for them, so in a residual block the token
    passes through unchanged). None: no limit.

    x: (..., d_model) -> (..., d_model).
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, k: int = 1,
                 activation: str = "relu", dropout: float = 0.0, bias: bool = True,
                 capacity_factor: float | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        check_int("num_experts", num_experts, minimum=1)
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0 or None, got {capacity_factor!r}")
        self.capacity_factor = capacity_factor
        check_int("k", k, minimum=1)
        if k > num_experts:
            raise ValueError(f"k must be <= num_experts = {num_experts}, got {k}")
        factory = {"device": device, "dtype": dtype}
        self.num_experts, self.k = num_experts, k
        self.router = nn.Linear(d_model, num_experts, bias=False, **factory)
        self.experts = nn.ModuleList(
            FeedForward(d_model, d_ff, activation, dropout, bias, **factory)
            for _ in range(num_experts))
        self.aux_loss: Tensor | None = None
        self.expert_fraction: Tensor | None = None
        self.dropped_fraction: float | None = None

    def forward(self, x: Tensor) -> Tensor:
        check_float_tensor("x", x)
        tokens = x.reshape(-1, x.shape[-1])  # (n, d_model)
        logits = self.router(tokens)
        if logits.dtype in (torch.float16, torch.bfloat16):  # route in float32: ties and
            logits = logits.float()                         # overflow in half are common
        probs = torch.softmax(logits, dim=-1)  # (n, E)
        top_p, top_e = probs.topk(self.k, dim=-1)  # (n, k)
        gates = top_p if self.k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)

        out = torch.zeros_like(tokens)
        capacity = (None if self.capacity_factor is None else
                    math.ceil(self.capacity_factor * tokens.shape[0] * self.k / self.num_experts))
        dropped = 0
        for e, expert in enumerate(self.experts):
            token_idx, slot = (top_e == e).nonzero(as_tuple=True)  # in token order
            if capacity is not None and token_idx.numel() > capacity:
                dropped += token_idx.numel() - capacity
                token_idx, slot = token_idx[:capacity], slot[:capacity]
            if token_idx.numel():
                gate = gates[token_idx, slot, None].to(tokens.dtype)
                out.index_add_(0, token_idx, gate * expert(tokens[token_idx]))

        counts = torch.bincount(top_e.flatten(), minlength=self.num_experts).to(probs.dtype)
        self.expert_fraction = counts / counts.sum()
        self.dropped_fraction = dropped / top_e.numel()
        self.aux_loss = self.num_experts * (self.expert_fraction * probs.mean(dim=0)).sum()
        return out.reshape(x.shape)

    def extra_repr(self) -> str:
        capacity = "" if self.capacity_factor is None else f", capacity_factor={self.capacity_factor}"
        return f"num_experts={self.num_experts}, k={self.k}{capacity}"

