"""The book's reference GPT: a character-level GPT trained on the Shakespeare corpus
(:func:`lecture_pkg.data.shakespeare`), shipped with the package as safetensors plus a JSON file
holding its configuration, vocabulary and recorded figures.

::

    from lecture_pkg.pretrained import load_shakespeare_gpt
    model, tokenizer = load_shakespeare_gpt()          # GPT in eval mode, CharTokenizer
    ids = torch.tensor([tokenizer.encode("ROMEO.\\n")])
    out = model.generate(ids, max_new_tokens=100, do_sample=True, top_p=0.9)
    print(tokenizer.decode(out[0].tolist()))

The context (block size) is ``model.config.n_positions`` (also ``model.context_length``).
``scripts/train_gpt.py --export`` writes the two files. ``load_shakespeare_gpt(checkpoint=
"shakespeare_gpt_demos")`` loads chapter 10's continuation of it, whose pretraining batches held
demonstration lists (:func:`lecture_pkg.in_context.demonstration_windows`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lecture_pkg.checks import check_int
from lecture_pkg.models.gpt import GPT, GPTConfig, next_token_loss
from lecture_pkg.shipped import shipped_info, shipped_state

__all__ = ["DEMOS_CHECKPOINT", "FORMATS_CHECKPOINT", "SPECIAL_TOKENS", "CharTokenizer",
           "eval_starts", "load_shakespeare_gpt", "nats_per_char", "shakespeare_gpt_info"]

SPECIAL_TOKENS = ("<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>", "<|pad|>")
CHECKPOINT = "shakespeare_gpt"
DEMOS_CHECKPOINT = "shakespeare_gpt_demos"
FORMATS_CHECKPOINT = "shakespeare_gpt_formats"


class CharTokenizer:
    """One id per character, then one id per special token (in that order).

    ``encode`` turns every occurrence of a special token's text (``"<|user|>"``) into its id and
    every other character into its own id; a character outside the vocabulary raises ValueError.
    ``decode`` is the inverse: ``decode(encode(s)) == s``.
    """

    def __init__(self, chars: Iterable[str], special_tokens: Sequence[str] = SPECIAL_TOKENS):
        chars = list(chars)
        if any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise ValueError("chars must be single characters")
        if len(set(chars)) != len(chars) or len(set(special_tokens)) != len(special_tokens):
            raise ValueError("chars and special_tokens must not repeat")
        self.chars = chars
        self.itos = chars + list(special_tokens)
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.special_tokens = {s: len(chars) + i for i, s in enumerate(special_tokens)}
        longest_first = sorted(special_tokens, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") \
            if special_tokens else None

    @classmethod
    def from_text(cls, text: str, special_tokens: Sequence[str] = SPECIAL_TOKENS
                  ) -> CharTokenizer:
        """The sorted characters of ``text``, then the special tokens."""
        return cls(sorted(set(text)), special_tokens)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    @property
    def eos_id(self) -> int:
        return self.special_tokens["<|endoftext|>"]

    @property
    def pad_id(self) -> int:
        return self.special_tokens["<|pad|>"]

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        pieces = self._split.split(text) if self._split else [text]
        ids: list[int] = []
        for piece in pieces:
            if piece in self.special_tokens:
                ids.append(self.special_tokens[piece])
                continue
            try:
                ids.extend(self.stoi[c] for c in piece)
            except KeyError as missing:
                raise ValueError(f"text holds {missing} outside the vocabulary") from None
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = list(ids)
        if any(not 0 <= int(i) < self.vocab_size for i in ids):
            raise ValueError(f"ids must be in [0, {self.vocab_size}), got {ids}")
        return "".join(self.itos[int(i)] for i in ids)


def eval_starts(n_tokens: int, windows: int, length: int) -> np.ndarray:
    """Start offsets of ``windows`` windows of ``length`` tokens spread evenly over a stream of
    ``n_tokens`` (the first at 0, the last ending at the end): a fixed held-out slice."""
    check_int("windows", windows, minimum=1)
    check_int("length", length, minimum=2)
    if n_tokens < length:
        raise ValueError(f"n_tokens {n_tokens} is shorter than length {length}")
    return np.linspace(0, n_tokens - length, windows).round().astype(np.int64)


@torch.no_grad()
def nats_per_char(model: GPT, ids: Tensor, starts: Sequence[int], length: int,
                  batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats per token; per character for a character model) over
    the windows ``ids[s : s + length]``: positions 1..length-1 of each window, each predicted
    from the window's earlier tokens. ids: (n,) integer tensor; length <= the model's context."""
    if length > model.config.n_positions:
        raise ValueError(f"length {length} exceeds the context n_positions="
                         f"{model.config.n_positions}")
    device = model.wte.weight.device
    offsets = torch.arange(length)
    total, count = 0.0, 0
    for i in range(0, len(starts), batch_size):
        chunk = torch.as_tensor(np.asarray(starts[i:i + batch_size]))
        batch = ids[chunk[:, None] + offsets].to(device)
        n = batch.numel() - batch.shape[0]
        total += next_token_loss(model(batch).logits, batch).item() * n
        count += n
    return total / count


def _check_gpt_checkpoint(checkpoint: str) -> None:
    names = (CHECKPOINT, DEMOS_CHECKPOINT, FORMATS_CHECKPOINT)
    if checkpoint not in names:
        raise ValueError(f"checkpoint must be one of {names}, got {checkpoint!r}")


def shakespeare_gpt_info(checkpoint: str = CHECKPOINT) -> dict[str, Any]:
    """The JSON stored beside the weights: ``config`` (GPTConfig fields), ``chars`` and
    ``special_tokens`` (the vocabulary), ``figures`` (held-out losses, training time, the
    command), ``history`` (the training curve)."""
    _check_gpt_checkpoint(checkpoint)
    return shipped_info(checkpoint)


def load_shakespeare_gpt(device: torch.device | str | None = None,
                         checkpoint: str = CHECKPOINT) -> tuple[GPT, CharTokenizer]:
    """The reference character GPT (float32, eval mode, on ``device``; default CPU) and its
    tokenizer; ``checkpoint=DEMOS_CHECKPOINT`` gives chapter 10's few-shot continuation
    (``FORMATS_CHECKPOINT``: the same with seven separators in its demonstration lists). The
    weights are stored in float16 and read with safetensors."""
    info = shakespeare_gpt_info(checkpoint)
    tokenizer = CharTokenizer(info["chars"], info["special_tokens"])
    model = GPT(GPTConfig(**info["config"]), device=device)
    load_gpt_weights(model, checkpoint)
    return model.eval(), tokenizer


def load_gpt_weights(model: GPT, name: str) -> None:
    """Load shipped checkpoint ``name`` into ``model``; the output layer is tied to the token
    embedding, so it is stored once, as ``wte.weight``."""
    state = shipped_state(name)
    state["lm_head.weight"] = state["wte.weight"]
    model.load_state_dict(state)
