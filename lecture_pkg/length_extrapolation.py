"""Train short, test long: one small causal language model per position scheme, and RoPE's
context-extension rules.

* :class:`PositionLM`: a pre-LN decoder-only byte model whose only difference between arms is
  where positions enter: ``"learned"`` table, ``"sinusoidal"`` table, ``"rope"``, ``"alibi"``,
  ``"t5"`` (causal relative buckets) or ``"nope"`` (no positions: the causal mask only). The
  position code is the package's own (:mod:`lecture_pkg.positional`), the blocks are
  :class:`lecture_pkg.layers.Residual` and :class:`lecture_pkg.layers.FeedForward`.
* :func:`band_losses`: the per-position cross-entropy of a model on long held-out windows.
* RoPE frequencies under context extension by a factor s, each returning
  ``(inv_freq, attention_factor)`` as Hugging Face's ``ROPE_INIT_FUNCTIONS`` do:
  :func:`rope_linear` (position interpolation, Chen et al. 2023: every frequency / s),
  :func:`rope_ntk` (NTK-aware: a larger base, base * s^(d/(d-2))), :func:`rope_dynamic_ntk`
  (the same rule, with s set by the current length) and :func:`rope_yarn` (Peng et al. 2023:
  interpolate only the slow frequencies, keep the fast ones, and sharpen attention).

Frequencies are computed in float64 (Hugging Face computes them in float32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lecture_pkg.checks import check_int
from lecture_pkg.layers import FeedForward, Residual
from lecture_pkg.lm_eval import eval_starts
from lecture_pkg.positional import (
    LearnedPositionalEmbedding,
    RelativePositionBias,
    SinusoidalPositionalEncoding,
    alibi_bias,
    angular_frequencies,
    rotate_half,
)
from lecture_pkg.training import adamw, train, warmup_cosine

__all__ = ["SCHEMES", "PositionLM", "PositionLMConfig", "band_losses", "byte_ids",
           "random_windows", "rope_dynamic_ntk", "rope_linear", "rope_ntk", "rope_yarn",
           "spaced_windows", "train_position_lm", "yarn_ramp"]

SCHEMES = ("learned", "sinusoidal", "rope", "alibi", "t5", "nope")


# --------------------------------------------------------------------------- RoPE scaling

def _check_factor(factor: float) -> float:
    if not isinstance(factor, (int, float)) or isinstance(factor, bool):
        raise TypeError(f"factor must be a real number, got {type(factor).__name__}")
    if not (math.isfinite(factor) and factor >= 1):
        raise ValueError(f"factor must be a finite number >= 1 (the length multiple), got {factor}")
    return float(factor)


def rope_linear(d_head: int, base: float, factor: float) -> tuple[Tensor, float]:
    """Position interpolation: angles p w_i / s, so s L positions span the angles of L.

    Returns inv_freq (d_head/2,) float64 = w_i / factor, and attention factor 1.0.
    """
    return angular_frequencies(d_head, base) / _check_factor(factor), 1.0


def rope_ntk(d_head: int, base: float, factor: float) -> tuple[Tensor, float]:
    """NTK-aware scaling: the base becomes base * s^(d/(d-2)).

    The fastest pair (w_0 = 1) is untouched and the slowest, w = base^(-(d-2)/d), is divided by
    exactly s, as position interpolation would; the pairs between are interpolated less the
    faster they turn. Returns inv_freq (d_head/2,) float64 and attention factor 1.0.
    """
    factor = _check_factor(factor)
    if d_head <= 2:
        raise ValueError(f"d_head must be > 2 for NTK scaling (exponent d/(d-2)), got {d_head}")
    return angular_frequencies(d_head, base * factor ** (d_head / (d_head - 2))), 1.0


def rope_dynamic_ntk(d_head: int, base: float, factor: float, seq_len: int,
                     max_positions: int) -> tuple[Tensor, float]:
    """Dynamic NTK (Hugging Face's ``"dynamic"``): NTK scaling whose base grows with the length.

    base' = base * (factor * t / L - (factor - 1))^(d/(d-2)) with t = max(seq_len, L), L =
    max_positions: nothing changes up to L. With factor = 1 it is :func:`rope_ntk` with s = t / L.
    """
    factor = _check_factor(factor)
    check_int("seq_len", seq_len, 1)
    check_int("max_positions", max_positions, 1)
    t = max(seq_len, max_positions)
    return rope_ntk(d_head, base, factor * t / max_positions - (factor - 1))


def yarn_ramp(d_head: int, base: float, max_positions: int, beta_fast: float = 32.0,
              beta_slow: float = 1.0, truncate: bool = True) -> tuple[float, float, Tensor]:
    """YaRN's split of the pairs: (low, high, keep) with keep (d_head/2,) in [0, 1].

    Pair i completes r_i = L w_i / (2 pi) turns over the training length L. Pairs with r_i >
    beta_fast keep their frequency (keep = 1), pairs with r_i < beta_slow are interpolated
    (keep = 0), and keep falls linearly in the index between the pair indices low and high
    where r equals beta_fast and beta_slow (rounded outwards with ``truncate``).
    """
    check_int("max_positions", max_positions, 1)
    if not beta_fast > beta_slow > 0:
        raise ValueError(f"need beta_fast > beta_slow > 0, got {beta_fast} and {beta_slow}")

    def pair_index(turns: float) -> float:  # solve L w_i / (2 pi) = turns for i
        return d_head * math.log(max_positions / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_index(beta_fast), pair_index(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d_head - 1)
    if low == high:
        high += 0.001  # as in the reference code: no division by zero
    ramp = ((torch.arange(d_head // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return float(low), float(high), 1 - ramp


def rope_yarn(d_head: int, base: float, factor: float, max_positions: int,
              beta_fast: float = 32.0, beta_slow: float = 1.0,
              truncate: bool = True) -> tuple[Tensor, float]:
    """YaRN: inv_freq = keep * w + (1 - keep) * w / s (keep from :func:`yarn_ramp`), and the
    attention factor 0.1 ln s + 1 that multiplies cos and sin (so the logits by its square).

    max_positions is the training length L. Returns inv_freq (d_head/2,) float64 and the factor.
    """
    factor = _check_factor(factor)
    keep = yarn_ramp(d_head, base, max_positions, beta_fast, beta_slow, truncate)[2]
    w = angular_frequencies(d_head, base)
    attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return keep * w + (1 - keep) * w / factor, attention_factor


# --------------------------------------------------------------------------- the model

@dataclass(frozen=True)
class PositionLMConfig:
    """Sizes of :class:`PositionLM`. ``max_positions`` is the training length: the learned table's
    size and T5's ``max_distance`` (offsets beyond it share the last bucket)."""

    position: str = "rope"
    vocab_size: int = 256
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 256
    max_positions: int = 64
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.position not in SCHEMES:
            raise ValueError(f"position must be one of {SCHEMES}, got {self.position!r}")
        for name in ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_positions"):
            check_int(name, getattr(self, name), 1)
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise ValueError(f"d_model / num_heads must be an even integer, got "
                             f"{self.d_model} / {self.num_heads}")


class _Attention(nn.Module):
    """Causal self-attention; queries and keys rotated when cos/sin are given, bias added."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None,
                bias: Tensor | None) -> Tensor:
        batch, t, d = x.shape
        q, k, v = self.qkv(x).view(batch, t, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        if rope is not None:
            cos, sin = rope
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if bias is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.out(out.transpose(1, 2).reshape(batch, t, d))


class _Block(nn.Module):
    def __init__(self, config: PositionLMConfig) -> None:
        super().__init__()
        d = config.d_model
        self.attn = _Attention(d, config.num_heads)
        self.ffn = FeedForward(d, config.d_ff, "gelu")
        self.attn_block = Residual(d, wiring="pre")
        self.ffn_block = Residual(d, wiring="pre")

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None,
                bias: Tensor | None) -> Tensor:
        x = self.attn_block(x, lambda h: self.attn(h, rope, bias))
        return self.ffn_block(x, self.ffn)


class PositionLM(nn.Module):
    """A small causal byte LM whose position scheme is ``config.position``.

    ``seed`` fixes the initial weights without touching torch's global generator.
    forward(ids, rope=None) -> logits: ids (batch, t) int64 -> (batch, t, vocab_size).
    ``rope`` = (inv_freq (d_head/2,), attention_factor) replaces RoPE's frequencies base^(-2i/d)
    and factor 1 (the context-extension rules of this module return exactly that pair).
    The learned table has no vectors beyond ``max_positions`` and raises there; every other
    scheme runs at any length.
    """

    def __init__(self, config: PositionLMConfig, seed: int | None = None) -> None:
        super().__init__()
        if not isinstance(config, PositionLMConfig):
            raise TypeError(f"config must be a PositionLMConfig, got {type(config).__name__}")
        self.config = config
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            self._build(config)

    def _build(self, config: PositionLMConfig) -> None:
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)  # N(0, 1), like a sinusoid's scale
        self.positions: nn.Module | None = None
        if c.position == "learned":
            self.positions = LearnedPositionalEmbedding(c.max_positions, c.d_model)
        elif c.position == "sinusoidal":
            self.positions = SinusoidalPositionalEncoding(c.d_model)
        self.t5 = (RelativePositionBias(c.num_heads, 32, c.max_positions, bidirectional=False)
                   if c.position == "t5" else None)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.num_layers))
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size)

    @property
    def d_head(self) -> int:
        return self.config.d_model // self.config.num_heads

    def _rope(self, t: int, device: torch.device, dtype: torch.dtype,
              rope: tuple[Tensor, float] | None) -> tuple[Tensor, Tensor]:
        inv_freq, factor = rope if rope is not None else (
            angular_frequencies(self.d_head, self.config.rope_base), 1.0)
        if inv_freq.shape != (self.d_head // 2,):
            raise ValueError(f"rope's inv_freq must have shape ({self.d_head // 2},), "
                             f"got {tuple(inv_freq.shape)}")
        angles = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq.double().cpu()
        angles = torch.cat((angles, angles), dim=-1).to(device)  # rotate-half layout (t, d_head)
        return (factor * angles.cos()).to(dtype), (factor * angles.sin()).to(dtype)

    def _bias(self, t: int, device: torch.device, dtype: torch.dtype) -> Tensor | None:
        """(heads, t, t) additive scores with the causal mask folded in, or None (plain causal)."""
        if self.config.position == "alibi":
            bias = alibi_bias(self.config.num_heads, t, t, dtype=dtype, device=device)
        elif self.t5 is not None:
            bias = self.t5(t, t).to(dtype)
        else:
            return None
        future = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)
        return bias.masked_fill(future, float("-inf"))

    def forward(self, ids: Tensor, rope: tuple[Tensor, float] | None = None) -> Tensor:
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"ids must be (batch, t) int64, got {tuple(ids.shape)} {ids.dtype}")
        if rope is not None and self.config.position != "rope":
            raise ValueError(f"rope frequencies were given to a {self.config.position!r} model")
        t = ids.shape[1]
        x = self.embed(ids)
        if self.positions is not None:
            x = self.positions(x)
        cos_sin = (self._rope(t, x.device, x.dtype, rope)
                   if self.config.position == "rope" else None)
        bias = self._bias(t, x.device, x.dtype)
        for block in self.blocks:
            x = block(x, cos_sin, bias)
        return self.head(self.norm(x))


# --------------------------------------------------------------------------- data, training

def byte_ids(text: str) -> Tensor:
    """The UTF-8 bytes of ``text`` as an int64 tensor (n_bytes,): a 256-symbol vocabulary."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def _check_ids(ids: Tensor, length: int) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype != torch.long:
        raise ValueError("ids must be a 1-D int64 tensor (see byte_ids)")
    if ids.numel() < length + 1:
        raise ValueError(f"ids has {ids.numel()} tokens, fewer than a window of {length + 1}")


def random_windows(ids: Tensor, length: int, batch_size: int,
                   generator: torch.Generator) -> Tensor:
    """(batch_size, length + 1) windows of ``ids`` at random starts drawn from ``generator``."""
    check_int("length", length, 1)
    check_int("batch_size", batch_size, 1)
    _check_ids(ids, length)
    starts = torch.randint(0, ids.numel() - length, (batch_size,), generator=generator)
    return ids[starts[:, None] + torch.arange(length + 1)]


def spaced_windows(ids: Tensor, length: int, count: int) -> Tensor:
    """(count, length + 1) windows at evenly spaced starts (:func:`lecture_pkg.lm_eval.eval_starts`):
    a fixed held-out set."""
    check_int("length", length, 1)
    _check_ids(ids, length)
    starts = torch.from_numpy(eval_starts(ids.numel(), count, length + 1))
    return ids[starts[:, None] + torch.arange(length + 1)]


def train_position_lm(model: PositionLM, ids: Tensor, *, length: int, steps: int, seed: int,
                      batch_size: int = 32, lr: float = 1e-2,
                      rope: tuple[Tensor, float] | None = None) -> float:
    """Train ``model`` in place on random windows of ``ids`` with :func:`lecture_pkg.training.train`
    (AdamW, warmup then cosine decay, clipping at 1). ``seed`` fixes the windows; ``rope`` trains
    with replaced RoPE frequencies (a fine-tune after context extension). Returns the mean
    training loss of the last 10 % of the steps."""
    device = next(model.parameters()).device
    windows = torch.Generator().manual_seed(seed)
    batches = [random_windows(ids, length, batch_size, windows) for _ in range(steps)]

    def loss_fn(m: nn.Module, batch: Tensor) -> Tensor:
        batch = batch.to(device)
        logits = m(batch[:, :-1]) if rope is None else m(batch[:, :-1], rope=rope)
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    optimizer = adamw(model, lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(max(1, steps // 10), steps))
    history = train(model, lambda step: batches[step], loss_fn, steps=steps,
                    optimizer=optimizer, scheduler=schedule, log_every=1, progress=False)
    tail = history.losses[-max(1, steps // 10):]
    return sum(tail) / len(tail)


def band_losses(model: nn.Module, windows: Tensor, rope: tuple[Tensor, float] | None = None,
                batch_size: int = 16) -> Tensor:
    """Cross-entropy (nats per token) at every position, averaged over held-out windows.

    windows: (n, t + 1) int64, each scored as inputs [:-1] and targets [1:]. Returns (t,) float64:
    entry p is the mean loss of predicting token p + 1 from tokens 0..p.
    """
    if windows.dim() != 2 or windows.shape[1] < 2:
        raise ValueError(f"windows must be (n, t + 1) with t >= 1, got {tuple(windows.shape)}")
    device = next(model.parameters()).device
    total = torch.zeros(windows.shape[1] - 1, dtype=torch.float64)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for chunk in windows.split(batch_size):
            chunk = chunk.to(device)
            logits = model(chunk[:, :-1]) if rope is None else model(chunk[:, :-1], rope=rope)
            loss = F.cross_entropy(logits.transpose(1, 2).float(), chunk[:, 1:],
                                   reduction="none")
            total += loss.sum(0).double().cpu()
    model.train(was_training)
    return total / windows.shape[0]
