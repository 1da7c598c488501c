"""The modern decoder (Llama, Touvron et al. 2023; Qwen3, 2025): GPT-2 with six changes.

What is particular to it, on top of :mod:`lecture_pkg.layers` (RMSNorm, the SwiGLU
:class:`~lecture_pkg.layers.FeedForward`, the pre-norm :class:`~lecture_pkg.layers.Residual`) and
:mod:`lecture_pkg.attention` (:func:`~lecture_pkg.attention.grouped_query_attention`,
:class:`~lecture_pkg.attention.KVCache`):

- no position table: queries and keys are rotated (RoPE, Su et al. 2021; rotate-half pairs as in
  HF's port), optionally with linear position interpolation (``rope_scaling_factor``);
- RMSNorm instead of LayerNorm, before each sub-layer and once after the last block;
- a SwiGLU FFN, ``down(silu(gate(x)) * up(x))`` (Shazeer 2020), and no biases anywhere;
- grouped-query attention (Ainslie et al. 2023): ``num_key_value_heads`` key-value heads shared by
  the query heads, and a cache that stores only those;
- optional QK-norm (Qwen3): an RMSNorm over each head's query and key before the rotation;
- optional sliding-window layers (Mistral, Qwen3's ``layer_types``): query i sees keys
  i - window < j <= i;
- an output layer of its own (untied), unless ``tie_word_embeddings``.

For ablations (not in HF's classes, so refused by :meth:`LlamaConfig.to_hf`), each change can be
undone alone: ``position_embedding`` "learned" (GPT-2's table) or "none" (NoPE), ``norm``
"layer" (LayerNorm without bias), ``mlp`` "gelu" or "relu2" (a plain FFN; ReLU squared as in So
et al. 2021 and nanochat).

Interop with Hugging Face: :meth:`Llama.from_hf` / :meth:`Llama.to_hf` for ``LlamaForCausalLM``
and (with ``qk_norm``) ``Qwen3ForCausalLM``; :meth:`Llama.from_config`, :meth:`hf_state_dict`.

Shapes: input_ids (batch, t); attention_mask (batch, past + t), 1/True for real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.attention import KVCache, grouped_query_attention
from lecture_pkg.checks import check_int
from lecture_pkg.layers import FeedForward, Residual, RMSNorm, make_norm
from lecture_pkg.models.common import (
    HFInterop,
    check_hf_class,
    check_padding_mask,
    check_position_ids,
    check_token_ids,
)
from lecture_pkg.positional import angular_frequencies, rotate_half

__all__ = ["Llama", "LlamaAttention", "LlamaBlock", "LlamaConfig", "LlamaOutput",
           "relu_squared", "rope_cos_sin"]

LAYER_TYPES = ("full_attention", "sliding_attention")
POSITION_EMBEDDINGS = ("rope", "learned", "none")
NORMS = ("rms", "layer")
MLPS = ("swiglu", "gelu", "relu2")
HF_CLASSES = ("LlamaForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True)
class LlamaConfig:
    """The decoder's hyper-parameters under HF's names (LlamaConfig / Qwen3Config).

    ``num_key_value_heads`` None means as many as query heads (multi-head attention);
    ``head_dim`` None means hidden_size // num_attention_heads. ``layer_types`` None means every
    layer attends to the whole past; otherwise one of LAYER_TYPES per layer, "sliding_attention"
    layers seeing the last ``sliding_window`` keys.
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 4096  # the training context (RoPE itself has no limit)
    rope_theta: float = 10000.0
    rope_scaling_factor: float = 1.0  # linear interpolation: positions / factor (Chen et al.)
    rms_norm_eps: float = 1e-6
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    position_embedding: str = "rope"  # ablations: "learned" (GPT-2's table), "none" (NoPE)
    norm: str = "rms"  # ablation: "layer" (LayerNorm without bias)
    mlp: str = "swiglu"  # ablations: "gelu", "relu2" (plain FFNs of width intermediate_size)

    def __post_init__(self) -> None:
        for name, choices in (("position_embedding", POSITION_EMBEDDINGS), ("norm", NORMS),
                              ("mlp", MLPS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "max_position_embeddings"):
            check_int(name, getattr(self, name), minimum=1)
        if self.num_key_value_heads is not None:
            check_int("num_key_value_heads", self.num_key_value_heads, minimum=1)
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} must be divisible "
                             f"by num_key_value_heads {self.kv_heads} (each key-value head "
                             f"serves the same number of query heads)")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by "
                             f"num_attention_heads {self.num_attention_heads} (or give head_dim)")
        if self.head_dim is not None:
            check_int("head_dim", self.head_dim, minimum=1)
        if self.d_head % 2:
            raise ValueError(f"head_dim must be even for RoPE (it rotates pairs of features), "
                             f"got {self.d_head}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta!r}")
        if not self.rope_scaling_factor >= 1:
            raise ValueError(f"rope_scaling_factor must be >= 1, got {self.rope_scaling_factor!r}")
        if not 0 <= self.attention_dropout < 1:
            raise ValueError(f"attention_dropout must be in [0, 1), got {self.attention_dropout}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers or \
                    any(kind not in LAYER_TYPES for kind in self.layer_types):
                raise ValueError(f"layer_types must hold one of {LAYER_TYPES} per layer "
                                 f"({self.num_hidden_layers}), got {self.layer_types!r}")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has sliding_attention layers: give sliding_window")
        if self.sliding_window is not None:
            check_int("sliding_window", self.sliding_window, minimum=1)

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window, None when it attends to the whole past."""
        if self.layer_types is None or self.layer_types[layer] == "full_attention":
            return None
        return self.sliding_window

    def kv_cache_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """Keys and values one token adds to the cache, all layers (bf16: 2 bytes a value)."""
        return 2 * self.num_hidden_layers * self.kv_heads * self.d_head * bytes_per_value

    # ------------------------------------------------------------ Hugging Face configs

    @classmethod
    def from_hf(cls, hf_config: Any) -> LlamaConfig:
        """Our config from a ``transformers`` LlamaConfig (qk_norm off) or Qwen3Config (on)."""
        kind = type(hf_config).__name__
        if kind not in ("LlamaConfig", "Qwen3Config"):
            raise TypeError(f"hf_config must be a transformers LlamaConfig or Qwen3Config, "
                            f"got {kind}")
        rope = dict(getattr(hf_config, "rope_parameters", None) or {})
        rope_type = rope.get("rope_type", "default")
        if rope_type not in ("default", "linear"):
            raise ValueError(f"{kind}.rope_parameters rope_type={rope_type!r} is not supported "
                             f"(expected 'default' or 'linear')")
        unsupported = {"hidden_act": ("silu",), "pretraining_tp": (1,)}
        for name, allowed in unsupported.items():
            value = getattr(hf_config, name, allowed[0])
            if value not in allowed:
                raise ValueError(f"{kind}.{name}={value!r} is not supported "
                                 f"(expected one of {allowed})")
        layer_types = getattr(hf_config, "layer_types", None)
        if layer_types is not None and all(k == "full_attention" for k in layer_types):
            layer_types = None
        return cls(vocab_size=hf_config.vocab_size, hidden_size=hf_config.hidden_size,
                   intermediate_size=hf_config.intermediate_size,
                   num_hidden_layers=hf_config.num_hidden_layers,
                   num_attention_heads=hf_config.num_attention_heads,
                   num_key_value_heads=hf_config.num_key_value_heads,
                   head_dim=getattr(hf_config, "head_dim", None),
                   max_position_embeddings=hf_config.max_position_embeddings,
                   rope_theta=float(rope.get("rope_theta", 10000.0)),
                   rope_scaling_factor=float(rope.get("factor", 1.0)),
                   rms_norm_eps=hf_config.rms_norm_eps, qk_norm=kind == "Qwen3Config",
                   tie_word_embeddings=bool(hf_config.tie_word_embeddings),
                   attention_bias=bool(hf_config.attention_bias),
                   mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
                   sliding_window=getattr(hf_config, "sliding_window", None)
                   if layer_types is not None else None,
                   layer_types=None if layer_types is None else tuple(layer_types),
                   attention_dropout=float(hf_config.attention_dropout),
                   initializer_range=hf_config.initializer_range)

    def to_hf(self) -> Any:
        """The ``transformers`` config: Qwen3Config with qk_norm, LlamaConfig without."""
        import transformers

        for name, default in (("position_embedding", "rope"), ("norm", "rms"), ("mlp", "swiglu")):
            if getattr(self, name) != default:
                raise ValueError(f"{name}={getattr(self, name)!r} is an ablation: Hugging Face's "
                                 f"Llama and Qwen3 have {name}={default!r} only")
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling_factor != 1:
            rope = {"rope_type": "linear", "rope_theta": self.rope_theta,
                    "factor": self.rope_scaling_factor}
        common = {"vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                  "intermediate_size": self.intermediate_size,
                  "num_hidden_layers": self.num_hidden_layers,
                  "num_attention_heads": self.num_attention_heads,
                  "num_key_value_heads": self.kv_heads, "head_dim": self.d_head,
                  "max_position_embeddings": self.max_position_embeddings,
                  "rope_parameters": rope, "rms_norm_eps": self.rms_norm_eps,
                  "tie_word_embeddings": self.tie_word_embeddings,
                  "attention_bias": self.attention_bias,
                  "attention_dropout": self.attention_dropout,
                  "initializer_range": self.initializer_range}
        if self.qk_norm:
            if self.mlp_bias:
                raise ValueError("Qwen3Config has no mlp_bias: a qk_norm model exports without it")
            sliding = self.layer_types is not None
            return transformers.Qwen3Config(
                **common, use_sliding_window=sliding, sliding_window=self.sliding_window,
                layer_types=list(self.layer_types or ["full_attention"] * self.num_hidden_layers))
        if self.layer_types is not None:
            raise ValueError("LlamaConfig has no sliding-window layers: export with qk_norm "
                             "(Qwen3) or without layer_types")
        return transformers.LlamaConfig(**common, mlp_bias=self.mlp_bias)


class LlamaOutput(NamedTuple):
    """logits: (batch, t, vocab); last_hidden_state: (batch, t, hidden), after the final norm;
    attentions: one (batch, heads, t, past + t) tensor per layer with output_attentions."""

    logits: Tensor
    last_hidden_state: Tensor
    attentions: tuple[Tensor, ...] | None


def rope_cos_sin(positions: Tensor, head_dim: int, base: float, factor: float = 1.0,
                 dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotation angles p / factor * w_i, once for every layer.

    positions: (batch, t) -> cos, sin: (batch, 1, t, head_dim), rotate-half layout (the angle
    of pair i repeated at i and i + head_dim/2). Angles in float32 (float64 for float64).
    """
    angle_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    freqs = angular_frequencies(head_dim, base).to(device=positions.device, dtype=angle_dtype)
    theta = (positions.to(angle_dtype) / factor)[..., None] * freqs  # (batch, t, d/2)
    theta = torch.cat((theta, theta), dim=-1)[:, None]
    return theta.cos().to(dtype), theta.sin().to(dtype)


class LlamaAttention(nn.Module):
    """Grouped-query self-attention with RoPE and optional QK-norm.

    forward(x, cos, sin, mask, is_causal, cache, output_attentions) -> (out, weights):
    x (batch, t, hidden); cos, sin from :func:`rope_cos_sin`; mask bool (batch | 1, 1, t,
    past + t), True = may attend, or None; the cache receives the rotated keys of
    ``num_key_value_heads`` heads only.
    """

    def __init__(self, config: LlamaConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype, "bias": config.attention_bias}
        d, heads, groups, d_head = (config.hidden_size, config.num_attention_heads,
                                    config.kv_heads, config.d_head)
        self.heads, self.groups, self.d_head = heads, groups, d_head
        self.dropout = config.attention_dropout
        self.q_proj = nn.Linear(d, heads * d_head, **factory)
        self.k_proj = nn.Linear(d, groups * d_head, **factory)
        self.v_proj = nn.Linear(d, groups * d_head, **factory)
        self.o_proj = nn.Linear(heads * d_head, d, **factory)
        norm = {"eps": config.rms_norm_eps, "device": device, "dtype": dtype}
        self.q_norm = RMSNorm(d_head, **norm) if config.qk_norm else None
        self.k_norm = RMSNorm(d_head, **norm) if config.qk_norm else None

    def forward(self, x: Tensor, cos: Tensor | None, sin: Tensor | None, mask: Tensor | None,
                is_causal: bool, cache: KVCache | None = None,
                output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        batch, t, _ = x.shape
        q = self.q_proj(x).view(batch, t, self.heads, self.d_head)
        k = self.k_proj(x).view(batch, t, self.groups, self.d_head)
        v = self.v_proj(x).view(batch, t, self.groups, self.d_head).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:  # QK-norm, per head
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (batch, heads | groups, t, d_head)
        if cos is not None and sin is not None:  # RoPE (None: positions added at the input)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.append(k, v)
        dropout = self.dropout if self.training else 0.0
        weights = None
        if output_attentions:  # the package's attention, returning the weights
            if dropout:
                raise ValueError("output_attentions runs without dropout: call model.eval()")
            out, weights = grouped_query_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                                 is_causal=is_causal,
                                                 enable_gqa=self.groups != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(batch, t, -1)), weights


def relu_squared(x: Tensor) -> Tensor:
    """max(0, x)^2 (So et al. 2021), the FFN activation of the ``mlp="relu2"`` ablation."""
    return F.relu(x).square()


class LlamaBlock(nn.Module):
    """x + Attn(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)). forward as LlamaAttention's."""

    def __init__(self, config: LlamaConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        residual = {"wiring": "pre", "norm": config.norm, "eps": config.rms_norm_eps,
                    "bias": False, **factory}
        self.attn_block = Residual(config.hidden_size, **residual)
        self.self_attn = LlamaAttention(config, **factory)
        self.ffn_block = Residual(config.hidden_size, **residual)
        activation = {"swiglu": "swiglu", "gelu": "gelu", "relu2": "relu"}[config.mlp]
        self.ffn = FeedForward(config.hidden_size, config.intermediate_size, activation,
                               bias=config.mlp_bias, **factory)
        if config.mlp == "relu2":
            self.ffn.act, self.ffn.activation = relu_squared, "relu2"

    def forward(self, x: Tensor, cos: Tensor | None, sin: Tensor | None, mask: Tensor | None,
                is_causal: bool, cache: KVCache | None = None,
                output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        weights = None

        def attention(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.self_attn(h, cos, sin, mask, is_causal, cache, output_attentions)
            return out

        x = self.attn_block(x, attention)
        return self.ffn_block(x, self.ffn), weights


class Llama(HFInterop, nn.Module):
    """The modern decoder language model. forward(input_ids, attention_mask=None,
    position_ids=None, cache=None, output_attentions=False) -> :class:`LlamaOutput`.

    - attention_mask: (batch, past + t), 1/True = real token. Without position_ids, positions
      count real tokens only, so a left-padded prompt is rotated as the unpadded one.
    - cache: :meth:`new_cache`; input_ids then holds only the new tokens.
    - output_attentions: the package's grouped-query attention, returning the weights; without
      it torch's fused ``scaled_dot_product_attention`` (tested equal).
    """

    HF_CLASS = "LlamaForCausalLM"
    CONFIG = LlamaConfig

    def __init__(self, config: LlamaConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__} (use "
                            f"Llama.from_config for a transformers LlamaConfig or Qwen3Config)")
        self.config = config
        factory = {"device": device, "dtype": dtype}
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, **factory)
        self.wpe = (nn.Embedding(config.max_position_embeddings, config.hidden_size, **factory)
                    if config.position_embedding == "learned" else None)
        self.layers = nn.ModuleList(LlamaBlock(config, **factory)
                                    for _ in range(config.num_hidden_layers))
        self.norm = make_norm(config.norm, config.hidden_size, config.rms_norm_eps, bias=False,
                              **factory)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **factory)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """HF's initialisation: N(0, initializer_range^2) for every matrix, zero biases, unit
        norm gains."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.config.initializer_range)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, (RMSNorm, nn.LayerNorm)) and module.weight is not None:
                nn.init.ones_(module.weight)

    @property
    def context_length(self) -> int:
        """The training context (RoPE itself has no limit; a learned table has this many rows)."""
        return self.config.max_position_embeddings

    def new_cache(self) -> list[KVCache]:
        """An empty key-value cache: one :class:`KVCache` per layer."""
        return [KVCache() for _ in self.layers]

    def _masks(self, keep: Tensor | None, past: int, t: int,
               device: torch.device) -> dict[int | None, Tensor | None]:
        """{window: bool mask (batch | 1, 1, t, past + t) or None} for each window in use."""
        query = torch.arange(past, past + t, device=device)[:, None]
        key = torch.arange(past + t, device=device)
        masks: dict[int | None, Tensor | None] = {}
        for window in {self.config.window(i) for i in range(len(self.layers))}:
            if keep is None and (window is None or past + t <= window) and (past == 0 or t == 1):
                masks[window] = None  # the fused kernel's is_causal (or nothing for t = 1)
                continue
            allowed = key <= query
            if window is not None:
                allowed = allowed & (key > query - window)
            allowed = allowed[None, None]
            if keep is not None:  # padding; every query still sees itself, so no row is empty
                allowed = (allowed & keep[:, None, None, :]) | (key == query)
            masks[window] = allowed
        return masks

    def features(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                 position_ids: Tensor | None = None, cache: list[KVCache] | None = None,
                 output_attentions: bool = False) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """The final hidden states (batch, t, hidden), after the last RMSNorm, and the
        attention weights."""
        check_token_ids("input_ids", input_ids, self.config.vocab_size, nonempty=True)
        batch, t = input_ids.shape
        past = self._check_cache(cache)
        keep = check_padding_mask("attention_mask", attention_mask, (batch, past + t))
        if keep is not None and bool(keep.all()):
            keep = None
        if position_ids is None:
            if keep is None:
                position_ids = torch.arange(past, past + t, device=input_ids.device)
                position_ids = position_ids.expand(batch, t)
            else:  # count real tokens only: left padding starts at position 0
                position_ids = (keep.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
        table = self.config.max_position_embeddings if self.wpe is not None else None
        check_position_ids(position_ids, batch, t, table, "max_position_embeddings")
        x = self.embed_tokens(input_ids)
        cos = sin = None
        if self.config.position_embedding == "rope":
            cos, sin = rope_cos_sin(position_ids, self.config.d_head, self.config.rope_theta,
                                    self.config.rope_scaling_factor, dtype=x.dtype)
        elif self.wpe is not None:
            x = x + self.wpe(position_ids)
        masks = self._masks(keep, past, t, input_ids.device)
        attentions = []
        for i, layer in enumerate(self.layers):
            mask = masks[self.config.window(i)]
            x, weights = layer(x, cos, sin, mask, mask is None and t > 1,
                               None if cache is None else cache[i], output_attentions)
            attentions.append(weights)
        return self.norm(x), tuple(attentions) if output_attentions else None

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, cache: list[KVCache] | None = None,
                output_attentions: bool = False) -> LlamaOutput:
        hidden, attentions = self.features(input_ids, attention_mask, position_ids, cache,
                                           output_attentions)
        return LlamaOutput(self.lm_head(hidden), hidden, attentions)

    def _check_cache(self, cache: list[KVCache] | None) -> int:
        if cache is None:
            return 0
        if not isinstance(cache, (list, tuple)) or len(cache) != len(self.layers) \
                or not all(isinstance(c, KVCache) for c in cache):
            raise TypeError(f"cache must be a list of {len(self.layers)} KVCache "
                            f"(Llama.new_cache()), got {cache!r}")
        return len(cache[0])

    @torch.no_grad()
    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                 max_new_tokens: int = 50, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None,
                 eos_token_id: int | Sequence[int] | None = None, pad_token_id: int = 0,
                 use_cache: bool = True) -> Tensor:
        """Greedy or sampled continuation through :mod:`lecture_pkg.generation`, as
        :meth:`lecture_pkg.models.gpt.GPT.generate`. Returns (batch, t + t_out)."""
        from lecture_pkg import generation

        check_token_ids("input_ids", input_ids, self.config.vocab_size)
        check_int("max_new_tokens", max_new_tokens, minimum=1)
        batch, t_prompt = input_ids.shape
        prompt_mask = check_padding_mask("attention_mask", attention_mask, (batch, t_prompt))

        def step(new: Tensor, cache: list[KVCache] | None) -> Tensor:
            mask = None
            if prompt_mask is not None:  # the prompt's padding, then every generated token
                past = 0 if cache is None else len(cache[0])
                generated = past + new.shape[1] - t_prompt
                mask = torch.cat([prompt_mask, prompt_mask.new_ones(batch, generated)], dim=1)
            return self(new, mask, cache=cache).logits

        if not do_sample and (temperature != 1.0 or top_k is not None or top_p is not None):
            raise ValueError("temperature, top_k and top_p shape a sampling distribution: "
                             "pass do_sample=True")
        common = {"max_new_tokens": max_new_tokens, "eos_token_id": eos_token_id,
                  "pad_token_id": pad_token_id, "new_cache": self.new_cache,
                  "use_cache": use_cache}
        if do_sample:
            return generation.sample(step, input_ids, temperature=temperature, top_k=top_k,
                                     top_p=top_p, generator=generator, **common)
        return generation.greedy_search(step, input_ids, **common)

    # ---------------------------------------------------------------- Hugging Face interop

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> Llama:
        """A copy of a ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` (same device, dtype, mode)."""
        name = type(hf_model).__name__
        check_hf_class(hf_model, name if name in HF_CLASSES else " or ".join(HF_CLASSES))
        weight = next(hf_model.parameters())
        model = cls.from_config(hf_model.config, device=weight.device, dtype=weight.dtype)
        model.load_hf_state_dict(hf_model.state_dict())
        return model.train(hf_model.training)

    def to_hf(self) -> nn.Module:
        """HF's model with our weights: Qwen3ForCausalLM with qk_norm, else LlamaForCausalLM."""
        import transformers

        config = self.config.to_hf()
        hf_class = (transformers.Qwen3ForCausalLM if self.config.qk_norm
                    else transformers.LlamaForCausalLM)
        weight = self.embed_tokens.weight
        hf_model = hf_class(config).to(device=weight.device, dtype=weight.dtype)
        hf_model.load_state_dict(self.hf_state_dict(), strict=True)
        return hf_model.train(self.training)

    def hf_names(self) -> list[tuple[str, str]]:
        names = [("embed_tokens.", "model.embed_tokens."), ("norm.", "model.norm."),
                 ("lm_head.", "lm_head.")]
        per_layer = [("attn_block.norm.", "input_layernorm."),
                     ("ffn_block.norm.", "post_attention_layernorm."),
                     ("self_attn.", "self_attn."), ("ffn.linear1.", "mlp.gate_proj."),
                     ("ffn.linear_v.", "mlp.up_proj."), ("ffn.linear2.", "mlp.down_proj.")]
        return names + [(f"layers.{{i}}.{ours}", f"model.layers.{{i}}.{theirs}")
                        for ours, theirs in per_layer]

    def load_hf_state_dict(self, state: Any) -> None:
        """Load weights under HF's names; a tied checkpoint may leave lm_head.weight out."""
        state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
        if self.config.tie_word_embeddings:
            state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
        super().load_hf_state_dict(state)
