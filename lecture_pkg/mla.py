"""Multi-head latent attention (MLA; DeepSeek-V2, 2024, and V3): cache one low-rank latent per
token instead of every head's keys and values.

Per token, the layer computes a latent c = RMSNorm(W_DKV x) of ``kv_lora_rank`` numbers and a
single rotary key k_R = RoPE(W_KR x) of ``qk_rope_head_dim`` numbers shared by all heads. Head h's
key is [W_UK^h c ; k_R] and its value W_UV^h c. Only (c, k_R) is cached: r + d_R numbers per token
and layer, against 2 h d for multi-head attention.

RoPE is *decoupled*: the rotation acts on a separate small part of q and k. Were it applied to
W_UK^h c, the position-dependent rotation would sit between q and W_UK^h, and W_UK^h could not be
folded into the query. Without it the up-projections are absorbed at decode time
(``absorb=True``): q_nope . (W_UK^h c) = ((W_UK^h)^T q_nope) . c, so scores are taken against the
cached latents directly, and the output sum_j p_j W_UV^h c_j = W_UV^h (sum_j p_j c_j) is
projected up once per query instead of once per key.

:class:`MultiHeadLatentAttention` uses Hugging Face's ``DeepseekV3Attention`` names, so
:meth:`~MultiHeadLatentAttention.from_hf` copies its weights; :func:`kv_cache_bytes_per_token`
compares the cache of MHA, GQA, MQA and MLA.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from lecture_pkg.checks import check_float_tensor, check_int
from lecture_pkg.masks import causal_mask
from lecture_pkg.positional import apply_rope

__all__ = ["MLACache", "MultiHeadLatentAttention", "kv_cache_bytes_per_token"]


class MLACache:
    """What MLA caches per layer: the latents c (batch, t, kv_lora_rank) and the rotated shared
    keys k_R (batch, t, qk_rope_head_dim)."""

    def __init__(self) -> None:
        self.latent: Tensor | None = None
        self.k_rope: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.latent is None else self.latent.shape[1]

    def append(self, latent: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        if self.latent is None or self.k_rope is None:
            self.latent, self.k_rope = latent, k_rope
        else:
            self.latent = torch.cat([self.latent, latent], dim=1)
            self.k_rope = torch.cat([self.k_rope, k_rope], dim=1)
        return self.latent, self.k_rope

    def numel_per_token(self) -> int:
        if self.latent is None or self.k_rope is None:
            return 0
        return self.latent.shape[-1] + self.k_rope.shape[-1]


class MultiHeadLatentAttention(nn.Module):
    """MLA self-attention, causal. x: (batch, t, hidden_size) -> (batch, t, hidden_size).

    q_lora_rank: None projects queries directly (``q_proj``, as DeepSeek-V2-Lite); an int
    compresses them too (``q_a_proj`` -> RMSNorm -> ``q_b_proj``). rope_interleave: rotate pairs
    (2j, 2j+1) (DeepSeek's checkpoints) instead of (j, j + d/2).
    """

    def __init__(self, hidden_size: int, num_heads: int, kv_lora_rank: int,
                 qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int,
                 q_lora_rank: int | None = None, rope_base: float = 10000.0,
                 rope_interleave: bool = False, rms_norm_eps: float = 1e-6,
                 attention_bias: bool = False) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads),
                            ("kv_lora_rank", kv_lora_rank), ("qk_nope_head_dim", qk_nope_head_dim),
                            ("qk_rope_head_dim", qk_rope_head_dim), ("v_head_dim", v_head_dim)):
            check_int(name, value, 1)
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs), got "
                             f"{qk_rope_head_dim}")
        if q_lora_rank is not None:
            check_int("q_lora_rank", q_lora_rank, 1)
        self.num_heads, self.kv_lora_rank = num_heads, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.v_head_dim, self.q_lora_rank = v_head_dim, q_lora_rank
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.rope_base, self.rope_interleave = rope_base, rope_interleave
        self.scaling = self.qk_head_dim ** -0.5
        if q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, num_heads * self.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=attention_bias)
            self.q_a_layernorm = nn.RMSNorm(q_lora_rank, eps=rms_norm_eps)
            self.q_b_proj = nn.Linear(q_lora_rank, num_heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_head_dim,
                                            bias=attention_bias)
        self.kv_a_layernorm = nn.RMSNorm(kv_lora_rank, eps=rms_norm_eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(num_heads * v_head_dim, hidden_size, bias=attention_bias)

    # ---- Hugging Face interop --------------------------------------------------------------
    @classmethod
    def from_config(cls, config: Any) -> MultiHeadLatentAttention:
        """An untrained layer shaped like ``transformers.DeepseekV3Config`` ``config`` (default
        RoPE only: YaRN's rescaled frequencies and mscale are not implemented here)."""
        rope = getattr(config, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"only rope_type 'default' is supported, got {rope.get('rope_type')!r}")
        return cls(config.hidden_size, config.num_attention_heads, config.kv_lora_rank,
                   config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim,
                   q_lora_rank=config.q_lora_rank, rope_base=rope.get("rope_theta", 10000.0),
                   rope_interleave=bool(config.rope_interleave),
                   rms_norm_eps=config.rms_norm_eps, attention_bias=config.attention_bias)

    @classmethod
    def from_hf(cls, hf_attention: nn.Module) -> MultiHeadLatentAttention:
        """A copy of HF's ``DeepseekV3Attention`` (same parameter names and shapes)."""
        layer = cls.from_config(hf_attention.config)
        layer.load_state_dict(hf_attention.state_dict())
        param = next(hf_attention.parameters())
        return layer.to(dtype=param.dtype, device=param.device)

    # ---- the computation ---------------------------------------------------------------------
    def _rope(self, x: Tensor, positions: Tensor) -> Tensor:
        return apply_rope(x, positions, self.rope_base, interleaved=self.rope_interleave)

    def queries(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """q_nope (batch, heads, t, qk_nope_head_dim) and rotated q_R (batch, heads, t, d_R)."""
        b, t, _ = x.shape
        q = self.q_proj(x) if self.q_lora_rank is None else \
            self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, t, self.num_heads, self.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        return q_nope, self._rope(q_rope, positions)

    def latents(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """What the cache stores: c (batch, t, kv_lora_rank) and rotated k_R (batch, t, d_R)."""
        latent, k_rope = self.kv_a_proj_with_mqa(x).split(
            [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        return self.kv_a_layernorm(latent), self._rope(k_rope, positions)

    def _up_weights(self) -> tuple[Tensor, Tensor]:
        """W_UK (heads, d_nope, r) and W_UV (heads, d_v, r), the rows of kv_b_proj."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim,
                                       self.kv_lora_rank)
        return w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]

    def forward(self, x: Tensor, cache: MLACache | None = None,
                mode: Literal["expand", "absorb"] = "expand") -> Tensor:
        """``mode="expand"``: rebuild every head's keys and values from the latents (training,
        prefill). ``mode="absorb"``: fold W_UK into the queries and W_UV after the weighted sum,
        attending to the latents themselves (decode). Both give the same output. With ``cache``
        the new positions follow the cached ones."""
        check_float_tensor("x", x)
        if x.dim() != 3 or x.shape[-1] != self.o_proj.out_features:
            raise ValueError(f"x must have shape (batch, t, hidden_size={self.o_proj.out_features}),"
                             f" got {tuple(x.shape)}")
        if mode not in ("expand", "absorb"):
            raise ValueError(f"mode must be 'expand' or 'absorb', got {mode!r}")
        b, t, _ = x.shape
        past = 0 if cache is None else len(cache)
        positions = torch.arange(past, past + t, device=x.device)
        q_nope, q_rope = self.queries(x, positions)
        latent, k_rope = self.latents(x, positions)
        if cache is not None:
            latent, k_rope = cache.append(latent, k_rope)
        w_uk, w_uv = self._up_weights()
        if mode == "expand":
            k_nope = torch.einsum("btr,hnr->bhtn", latent, w_uk)
            values = torch.einsum("btr,hvr->bhtv", latent, w_uv)
            scores = q_nope @ k_nope.transpose(-2, -1)
        else:
            q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # (W_UK^h)^T q_nope
            scores = q_latent @ latent[:, None].transpose(-2, -1)
        scores = (scores + q_rope @ k_rope[:, None].transpose(-2, -1)) * self.scaling
        allowed = causal_mask(t, past + t, device=x.device, align="bottom-right")
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        if mode == "expand":
            out = weights @ values
        else:
            out = torch.einsum("bhtr,hvr->bhtv", weights @ latent[:, None], w_uv)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def kv_cache_bytes_per_token(attention: Literal["MHA", "GQA", "MQA", "MLA"], *, num_layers: int,
                             num_heads: int, head_dim: int, num_kv_heads: int | None = None,
                             kv_lora_rank: int | None = None, qk_rope_head_dim: int | None = None,
                             bytes_per_element: int = 2) -> int:
    """Bytes the key-value cache holds per token, over all layers.

    MHA: 2 (k and v) x num_heads x head_dim; GQA: 2 x num_kv_heads x head_dim; MQA: 2 x head_dim;
    MLA: kv_lora_rank + qk_rope_head_dim (the latent and the shared rotary key). Times num_layers
    and bytes_per_element (2 for bf16).
    """
    for name, value in (("num_layers", num_layers), ("num_heads", num_heads),
                        ("head_dim", head_dim), ("bytes_per_element", bytes_per_element)):
        check_int(name, value, 1)
    if attention == "MHA":
        per_layer = 2 * num_heads * head_dim
    elif attention == "MQA":
        per_layer = 2 * head_dim
    elif attention == "GQA":
        if num_kv_heads is None:
            raise ValueError("GQA needs num_kv_heads")
        check_int("num_kv_heads", num_kv_heads, 1)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads}")
        per_layer = 2 * num_kv_heads * head_dim
    elif attention == "MLA":
        if kv_lora_rank is None or qk_rope_head_dim is None:
            raise ValueError("MLA needs kv_lora_rank and qk_rope_head_dim")
        per_layer = check_int("kv_lora_rank", kv_lora_rank, 1) \
            + check_int("qk_rope_head_dim", qk_rope_head_dim, 1)
    else:
        raise ValueError(f"attention must be 'MHA', 'GQA', 'MQA' or 'MLA', got {attention!r}")
    return per_layer * num_layers * bytes_per_element
