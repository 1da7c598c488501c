"""GPT, GPT-2 style (Radford et al. 2018, 2019): a decoder-only Transformer language model.

What is particular to GPT-2, on top of :class:`lecture_pkg.layers.EncoderLayer` (with
``is_causal=True`` it is a decoder block without cross-attention):

- learned absolute positions (``wpe``) added to the token embeddings (``wte``);
- pre-LN blocks (``x + Attn(LN(x))``, ``x + FFN(LN(x))``) with the tanh approximation of GELU,
  and one more LayerNorm after the last block (``ln_f``);
- the LM head is the token embedding itself (tied weights): logits = h @ wte^T;
- GPT-2's initialisation: N(0, 0.02^2) everywhere, except the two projections that write into
  the residual stream in every block (attention's output projection and the FFN's second
  linear), whose std is divided by sqrt(2 * n_layer) so that the stream's variance does not grow
  with depth.

Interop with Hugging Face: ``from_hf``, ``from_config`` from the shared
:class:`~lecture_pkg.models.common.HFInterop`; the weight conversion is GPT-2's own, since HF stores
its linear layers as ``Conv1D`` with weight (in, out), the transpose of ``nn.Linear``'s
(out, in), and fuses q, k, v into one ``c_attn``.

Shapes: input_ids (batch, t) integer token ids; attention_mask (batch, past + t), 1/True for real
tokens and 0/False for padding (HF's convention, left or right padding).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.attention import KVCache
from lecture_pkg.checks import check_bool_mask, check_int
from lecture_pkg.layers import EncoderLayer
from lecture_pkg.models.common import HFInterop, check_padding_mask, check_position_ids, check_token_ids

__all__ = ["GPT", "GPTConfig", "GPTForSequenceClassification", "GPTOutput", "lm_batches",
           "next_token_loss"]


@dataclass(frozen=True)
class GPTConfig:
    """GPT-2's hyper-parameters, under GPT2Config's names. The defaults are GPT-2 small (124M)."""

    vocab_size: int = 50257
    n_positions: int = 1024  # the context: the longest sequence the model has positions for
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None  # FFN width; None means 4 * n_embd
    dropout: float = 0.1  # attention weights, FFN and residual branches
    embd_dropout: float = 0.1  # on token + position embeddings
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            check_int(name, getattr(self, name), minimum=1)
        if self.n_inner is not None:
            check_int("n_inner", self.n_inner, minimum=1)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} must be divisible by n_head {self.n_head}")

    @property
    def d_ff(self) -> int:
        return self.n_inner or 4 * self.n_embd

    @classmethod
    def from_hf(cls, hf_config: Any) -> GPTConfig:
        """The sizes of a ``transformers.GPT2Config``; settings this GPT does not implement are
        refused by name."""
        if type(hf_config).__name__ != "GPT2Config":
            raise TypeError(f"hf_config must be a transformers GPT2Config, "
                            f"got {type(hf_config).__name__}")
        unsupported = {
            "activation_function": (hf_config.activation_function,
                                    ("gelu_new", "gelu_pytorch_tanh")),
            "scale_attn_weights": (hf_config.scale_attn_weights, (True,)),
            "scale_attn_by_inverse_layer_idx": (hf_config.scale_attn_by_inverse_layer_idx,
                                                (False,)),
            "add_cross_attention": (hf_config.add_cross_attention, (False,)),
            "attn_pdrop": (hf_config.attn_pdrop, (hf_config.resid_pdrop,)),
        }
        for name, (value, allowed) in unsupported.items():
            if value not in allowed:
                raise ValueError(f"GPT2Config.{name}={value!r} is not supported "
                                 f"(expected one of {allowed})")
        return cls(vocab_size=hf_config.vocab_size, n_positions=hf_config.n_positions,
                   n_embd=hf_config.n_embd, n_layer=hf_config.n_layer, n_head=hf_config.n_head,
                   n_inner=hf_config.n_inner, dropout=hf_config.resid_pdrop,
                   embd_dropout=hf_config.embd_pdrop,
                   layer_norm_epsilon=hf_config.layer_norm_epsilon,
                   initializer_range=hf_config.initializer_range)


class GPTOutput(NamedTuple):
    """logits: (batch, t, vocab); last_hidden_state: (batch, t, n_embd), after ln_f;
    attentions: one (batch, heads, t, past + t) tensor per layer with output_attentions, else None.
    """

    logits: Tensor
    last_hidden_state: Tensor
    attentions: tuple[Tensor, ...] | None


class GPT(HFInterop, nn.Module):
    """A GPT-2 language model. forward(input_ids, attention_mask=None, position_ids=None,
    cache=None, output_attentions=False) -> :class:`GPTOutput`.

    - attention_mask: (batch, past + t), 1/True = real token. Without position_ids, positions
      count real tokens only (cumsum - 1), so a left-padded prompt gets the same positions as
      the unpadded one.
    - attn_mask: (batch, t, past + t) bool, True = query i may attend to key j, on top of the
      causal triangle and the padding; with packed examples the block-diagonal
      :func:`lecture_pkg.masks.document_mask`, and position_ids restarting per example.
    - cache: :meth:`new_cache` (one :class:`KVCache` per layer); input_ids then holds only the
      new tokens, and the cache grows by t.
    - output_attentions: the package's own attention, returning every layer's weights; without
      it the fused ``scaled_dot_product_attention`` runs (same outputs, tested).
    """

    HF_CLASS = "GPT2LMHeadModel"
    CONFIG = GPTConfig

    def __init__(self, config: GPTConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__} "
                            f"(use GPT.from_config for a transformers GPT2Config)")
        self.config = config
        factory = {"device": device, "dtype": dtype}
        self.wte = nn.Embedding(config.vocab_size, config.n_embd, **factory)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd, **factory)
        self.drop = nn.Dropout(config.embd_dropout)
        self.blocks = nn.ModuleList(
            EncoderLayer(config.n_embd, config.n_head, config.d_ff, dropout=config.dropout,
                         activation="gelu_tanh", wiring="pre", eps=config.layer_norm_epsilon,
                         ffn_dropout=0.0, **factory)  # GPT2MLP has no inner dropout
            for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, **factory)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, **factory)
        self.lm_head.weight = self.wte.weight  # tied: the output layer reads the input table
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2's initialisation (see the module docstring)."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        residual_std = std / math.sqrt(2 * self.config.n_layer)  # two residual writes per block
        for block in self.blocks:
            nn.init.normal_(block.self_attn.out_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.ffn.linear2.weight, mean=0.0, std=residual_std)

    @property
    def context_length(self) -> int:
        return self.config.n_positions

    def new_cache(self) -> list[KVCache]:
        """An empty key-value cache: one :class:`KVCache` per layer."""
        return [KVCache() for _ in self.blocks]

    def features(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                 position_ids: Tensor | None = None, cache: list[KVCache] | None = None,
                 output_attentions: bool = False,
                 attn_mask: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """The final hidden states (batch, t, n_embd), after ln_f, and the attention weights."""
        check_token_ids("input_ids", input_ids, self.config.vocab_size, nonempty=True)
        batch, t = input_ids.shape
        past = self._check_cache(cache)
        keep = check_padding_mask("attention_mask", attention_mask, (batch, past + t))
        allowed = _check_attn_mask(attn_mask, (batch, t, past + t))
        if position_ids is None:
            position_ids = self._position_ids(keep, batch, past, t, input_ids.device)
        check_position_ids(position_ids, batch, t, self.config.n_positions, "n_positions")
        if keep is not None and bool(keep.all()):
            keep = None  # no padding: the fused causal kernel needs no mask
        x = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        attentions = []
        for i, block in enumerate(self.blocks):
            x, weights = block(x, allowed, key_padding_mask=keep, is_causal=True,
                               cache=None if cache is None else cache[i],
                               output_attentions=output_attentions)
            attentions.append(weights)
        return self.ln_f(x), tuple(attentions) if output_attentions else None

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, cache: list[KVCache] | None = None,
                output_attentions: bool = False, attn_mask: Tensor | None = None) -> GPTOutput:
        hidden, attentions = self.features(input_ids, attention_mask, position_ids, cache,
                                           output_attentions, attn_mask)
        return GPTOutput(self.lm_head(hidden), hidden, attentions)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                 max_new_tokens: int = 50, do_sample: bool = False, num_beams: int = 1,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None,
                 eos_token_id: int | Sequence[int] | None = None, pad_token_id: int = 0,
                 use_cache: bool = True) -> Tensor:
        """Continue ``input_ids`` (batch, t) through :mod:`lecture_pkg.generation`: greedy,
        beam search (``num_beams > 1``) or sampling (``do_sample``, with temperature, top-k,
        top-p and a ``generator``). A padded batch passes its ``attention_mask``; generated
        tokens count as real. Returns (batch, t + t_out): the prompt and the new tokens.
        Call ``model.eval()`` first to switch dropout off."""
        from lecture_pkg import generation

        check_token_ids("input_ids", input_ids, self.config.vocab_size, nonempty=True)
        check_int("max_new_tokens", max_new_tokens, minimum=1)
        batch, t_prompt = input_ids.shape
        context = self.config.n_positions
        if t_prompt > context:
            raise ValueError(f"the prompt has {t_prompt} tokens but the context holds "
                             f"n_positions={context}")
        if t_prompt + max_new_tokens > context:
            raise ValueError(f"max_new_tokens={max_new_tokens} does not fit the context: the "
                             f"prompt has {t_prompt} tokens and n_positions={context} leaves "
                             f"room for {context - t_prompt}")
        prompt_mask = check_padding_mask("attention_mask", attention_mask, (batch, t_prompt))

        def step(new: Tensor, cache: list[KVCache] | None) -> Tensor:
            mask = None
            if prompt_mask is not None:  # the prompt's padding, then every generated token
                rows, past = new.shape[0], 0 if cache is None else len(cache[0])
                generated = past + new.shape[1] - t_prompt
                mask = torch.cat([prompt_mask.repeat_interleave(rows // batch, dim=0),
                                  prompt_mask.new_ones(rows, generated)], dim=1)
            return self(new, mask, cache=cache).logits

        if not do_sample and (temperature != 1.0 or top_k is not None or top_p is not None):
            raise ValueError("temperature, top_k and top_p shape a sampling distribution: "
                             "pass do_sample=True")
        common = {"max_new_tokens": max_new_tokens, "eos_token_id": eos_token_id,
                  "pad_token_id": pad_token_id, "new_cache": self.new_cache,
                  "use_cache": use_cache}
        if num_beams > 1:
            if do_sample:
                raise ValueError("num_beams > 1 is beam search: do_sample must be False")
            return generation.beam_search(step, input_ids, num_beams=num_beams, **common)
        if do_sample:
            return generation.sample(step, input_ids, temperature=temperature, top_k=top_k,
                                     top_p=top_p, generator=generator, **common)
        return generation.greedy_search(step, input_ids, **common)

    # ---------------------------------------------------------------- argument checks

    def _check_cache(self, cache: list[KVCache] | None) -> int:
        if cache is None:
            return 0
        if not isinstance(cache, (list, tuple)) or len(cache) != len(self.blocks) \
                or not all(isinstance(c, KVCache) for c in cache):
            raise TypeError(f"cache must be a list of {len(self.blocks)} KVCache "
                            f"(GPT.new_cache()), got {cache!r}")
        return len(cache[0])

    @staticmethod
    def _position_ids(keep: Tensor | None, batch: int, past: int, t: int,
                      device: torch.device) -> Tensor:
        if keep is None:
            return torch.arange(past, past + t, device=device).expand(batch, t)
        # Count real tokens only: under left padding the first real token gets position 0.
        return (keep.long().cumsum(-1) - 1).clamp(min=0)[:, past:]

    # ---------------------------------------------------------------- Hugging Face interop

    def _hf_names(self) -> list[tuple[str, str, bool]]:
        """(our name, HF's name, transposed?) for every tensor except the fused q, k, v."""
        names = [("wte.weight", "transformer.wte.weight", False),
                 ("wpe.weight", "transformer.wpe.weight", False),
                 ("ln_f.weight", "transformer.ln_f.weight", False),
                 ("ln_f.bias", "transformer.ln_f.bias", False)]
        per_block = [("attn_block.norm", "ln_1", False),
                     ("self_attn.out_proj", "attn.c_proj", True),
                     ("ffn_block.norm", "ln_2", False), ("ffn.linear1", "mlp.c_fc", True),
                     ("ffn.linear2", "mlp.c_proj", True)]
        for i in range(len(self.blocks)):
            for ours, theirs, conv1d in per_block:
                names.append((f"blocks.{i}.{ours}.weight", f"transformer.h.{i}.{theirs}.weight",
                              conv1d))
                names.append((f"blocks.{i}.{ours}.bias", f"transformer.h.{i}.{theirs}.bias",
                              False))
        return names

    def hf_state_dict(self) -> dict[str, Tensor]:
        """Our weights under GPT2LMHeadModel's names and layouts (load with
        ``hf_model.load_state_dict``)."""
        ours = self.state_dict()
        out = {theirs: (ours[name].T if conv1d else ours[name]).contiguous()
               for name, theirs, conv1d in self._hf_names()}
        for i, block in enumerate(self.blocks):
            projections = (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj)
            prefix = f"transformer.h.{i}.attn.c_attn"
            out[f"{prefix}.weight"] = torch.cat([p.weight for p in projections]).T.contiguous()
            out[f"{prefix}.bias"] = torch.cat([p.bias for p in projections])
        out["lm_head.weight"] = out["transformer.wte.weight"]
        return {name: tensor.detach() for name, tensor in out.items()}

    def load_hf_state_dict(self, state_dict: dict[str, Tensor]) -> None:
        """Load GPT2LMHeadModel's weights (transposing Conv1D, splitting c_attn). HF's causal-mask
        buffers (``attn.bias``, ``attn.masked_bias`` in older checkpoints) are skipped; any other
        name this architecture lacks is an error, as is a missing weight."""
        known = {theirs for _, theirs, _ in self._hf_names()} | {"lm_head.weight"} | {
            f"transformer.h.{i}.attn.c_attn.{p}" for i in range(len(self.blocks))
            for p in ("weight", "bias")}
        unknown = [k for k in state_dict
                   if k not in known and not k.endswith(("attn.bias", "attn.masked_bias"))]
        if unknown:
            raise ValueError(f"weights with no counterpart in this GPT: {unknown[:5]}")
        ours = {}
        try:
            for name, theirs, conv1d in self._hf_names():
                ours[name] = state_dict[theirs].T if conv1d else state_dict[theirs]
            for i in range(len(self.blocks)):
                prefix = f"transformer.h.{i}.attn.c_attn"
                weights = state_dict[f"{prefix}.weight"].T.chunk(3)
                biases = state_dict[f"{prefix}.bias"].chunk(3)
                for proj, weight, bias in zip("qkv", weights, biases):
                    ours[f"blocks.{i}.self_attn.{proj}_proj.weight"] = weight
                    ours[f"blocks.{i}.self_attn.{proj}_proj.bias"] = bias
        except KeyError as missing:
            raise KeyError(f"state_dict lacks GPT-2 weight {missing}") from None
        ours["lm_head.weight"] = ours["wte.weight"]
        self.load_state_dict(ours)


def _check_attn_mask(attn_mask: Tensor | None, shape: tuple[int, int, int]) -> Tensor | None:
    """A (batch, t, past + t) bool attention mask, returned as (batch, 1, t, past + t) for the
    heads; None stays None."""
    if attn_mask is None:
        return None
    check_bool_mask("attn_mask", attn_mask)
    if tuple(attn_mask.shape) != shape:
        raise ValueError(f"attn_mask must have shape (batch, t, past + t) = {shape}, "
                         f"got {tuple(attn_mask.shape)}")
    return attn_mask[:, None]


def next_token_loss(logits: Tensor, input_ids: Tensor,
                    attention_mask: Tensor | None = None) -> Tensor:
    """Mean cross-entropy of predicting token i+1 from positions <= i (the LM objective).

    logits: (batch, t, vocab); input_ids: (batch, t); attention_mask: (batch, t), padded targets
    are left out. Perplexity is exp of this loss.
    """
    targets = input_ids[:, 1:]
    if attention_mask is not None:
        targets = targets.masked_fill(~attention_mask[:, 1:].bool(), -100)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(),
                           ignore_index=-100)


def lm_batches(tokens: Tensor, batch_size: int, block_size: int, seed: int = 0, rank: int = 0,
               world_size: int = 1) -> Callable[[int], Tensor]:
    """step -> (batch_size // world_size, block_size) windows of a token stream, drawn at
    random offsets from a generator seeded with (seed, step): the batch is a function of the
    step, so a resumed run sees the same data. Under DDP every rank draws the same global
    batch of ``batch_size`` windows and keeps its own contiguous slice of rows.

    tokens: (n,) integer ids. A window is both the input and, shifted by one, the targets
    (:func:`next_token_loss`), so block_size is the context the model needs.
    """
    check_int("batch_size", batch_size, minimum=1)
    check_int("block_size", block_size, minimum=1)
    if batch_size % world_size:
        raise ValueError(f"batch_size {batch_size} must be divisible by world_size {world_size}")
    if tokens.dim() != 1 or tokens.numel() < block_size:
        raise ValueError(f"tokens must be a 1-D stream of at least block_size = {block_size} "
                         f"ids, got shape {tuple(tokens.shape)}")
    per_rank = batch_size // world_size
    offsets = torch.arange(block_size)

    def batch(step: int) -> Tensor:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(tokens.numel() - block_size + 1, (batch_size,),
                               generator=generator)
        mine = starts[rank * per_rank:(rank + 1) * per_rank]
        return tokens[mine[:, None] + offsets]

    return batch


class GPTForSequenceClassification(nn.Module):
    """GPT fine-tuned as a classifier (Radford et al. 2018): a linear layer on the hidden state
    of each sequence's last real token (GPT-1's [EXTRACT] token), trained with the whole network.

    forward(input_ids, attention_mask=None) -> logits (batch, num_labels). Padding may be on
    either side: the last position whose mask is 1 is used.
    """

    def __init__(self, gpt: GPT, num_labels: int, bias: bool = True) -> None:
        super().__init__()
        check_int("num_labels", num_labels, minimum=1)
        self.gpt = gpt
        weight = gpt.wte.weight
        self.score = nn.Linear(gpt.config.n_embd, num_labels, bias=bias, device=weight.device,
                               dtype=weight.dtype)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        hidden, _ = self.gpt.features(input_ids, attention_mask)
        batch, t = input_ids.shape
        if attention_mask is None:
            last = torch.full((batch,), t - 1, device=hidden.device)
        else:  # the highest index holding a real token (left or right padding)
            positions = torch.arange(t, device=hidden.device).expand(batch, t)
            last = positions.masked_fill(~attention_mask.bool(), -1).amax(dim=-1)
        return self.score(hidden[torch.arange(batch, device=hidden.device), last])
