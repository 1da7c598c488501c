"""The book's character-level GPTs trained on the Shakespeare corpus
(:func:`lecture_pkg.data.shakespeare`), shipped with the package as safetensors plus a JSON file
holding the configuration, vocabulary and recorded figures of each:

* ``shakespeare_gpt`` (:data:`CHECKPOINT`), the reference GPT of chapter 7.3;
* ``shakespeare_gpt_demos`` (:data:`DEMOS_CHECKPOINT`), chapter 10's continuation of it whose
  pretraining batches held demonstration lists
  (:func:`lecture_pkg.shakespeare_tasks.demonstration_windows`), and ``shakespeare_gpt_formats``
  (:data:`FORMATS_CHECKPOINT`), the same with seven separators;
* ``shakespeare_modern`` (:data:`MODERN_CHECKPOINT`), chapter 7.4's modern decoder
  (:class:`~lecture_pkg.models.llama.Llama`) trained by the reference GPT's recipe;
* ``shakespeare_sft`` (:data:`SFT_CHECKPOINT`), the reference GPT after supervised fine-tuning
  on chapter 10's instructions (:func:`lecture_pkg.shakespeare_tasks.shakespeare_instructions`).

::

    from lecture_pkg.shakespeare_gpt import load_shakespeare_gpt
    model, tokenizer = load_shakespeare_gpt()          # GPT in eval mode, CharTokenizer
    ids = torch.tensor([tokenizer.encode("ROMEO.\\n")])
    out = model.generate(ids, max_new_tokens=100, do_sample=True, top_p=0.9)
    print(tokenizer.decode(out[0].tolist()))

The context (block size) is ``model.config.n_positions`` (also ``model.context_length``).
``scripts/train_gpt.py --export`` writes the first four, ``scripts/train_sft.py`` the last.
"""

from __future__ import annotations

from typing import Any

import torch

from lecture_pkg.char_tokenizers import CharTokenizer
from lecture_pkg.models.gpt import GPT, GPTConfig
from lecture_pkg.models.llama import Llama, LlamaConfig
from lecture_pkg.shipped import Shipped, shipped_info, shipped_state

__all__ = ["CHECKPOINT", "DEMOS_CHECKPOINT", "FORMATS_CHECKPOINT", "MODERN_CHECKPOINT",
           "SFT_CHECKPOINT", "load_gpt_weights", "load_shakespeare_gpt",
           "load_shakespeare_modern", "load_shakespeare_sft", "shakespeare_gpt_info",
           "shakespeare_modern_info", "shakespeare_sft_info"]

CHECKPOINT = "shakespeare_gpt"
DEMOS_CHECKPOINT = "shakespeare_gpt_demos"
FORMATS_CHECKPOINT = "shakespeare_gpt_formats"
MODERN_CHECKPOINT = "shakespeare_modern"
SFT_CHECKPOINT = "shakespeare_sft"


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
                         checkpoint: str = CHECKPOINT) -> Shipped:
    """The reference character GPT (float32, eval mode, on ``device``; default CPU) and its
    :class:`~lecture_pkg.char_tokenizers.CharTokenizer`; ``checkpoint=DEMOS_CHECKPOINT`` gives
    chapter 10's few-shot continuation (``FORMATS_CHECKPOINT``: the same with seven separators
    in its demonstration lists). The weights are stored in float16 and read with safetensors."""
    info = shakespeare_gpt_info(checkpoint)
    tokenizer = CharTokenizer(info["chars"], info["special_tokens"])
    model = GPT(GPTConfig(**info["config"]), device=device)
    load_gpt_weights(model, checkpoint)
    return Shipped(model.eval(), tokenizer)


def load_gpt_weights(model: GPT, name: str) -> None:
    """Load shipped checkpoint ``name`` into ``model``; the output layer is tied to the token
    embedding, so it is stored once, as ``wte.weight``."""
    state = shipped_state(name)
    state["lm_head.weight"] = state["wte.weight"]
    model.load_state_dict(state)


def shakespeare_modern_info() -> dict[str, Any]:
    """The JSON stored beside the modern decoder's weights: ``config`` (LlamaConfig fields),
    the vocabulary, ``figures`` and ``history``, as for the GPT."""
    return shipped_info(MODERN_CHECKPOINT)


def load_shakespeare_modern(device: torch.device | str | None = None) -> Shipped:
    """Chapter 7.4's modern decoder (float32, eval mode, on ``device``; default CPU) and its
    tokenizer, the reference GPT's. Its output layer is its own (untied), stored with the rest."""
    info = shakespeare_modern_info()
    config = LlamaConfig(**info["config"])
    model = Llama(config, device=device)
    model.load_state_dict(shipped_state(MODERN_CHECKPOINT))
    return Shipped(model.eval(), CharTokenizer(info["chars"], info["special_tokens"]))


def shakespeare_sft_info() -> dict[str, Any]:
    """The JSON stored beside the SFT weights: how they were trained and their held-out
    accuracy (``figures``)."""
    return shipped_info(SFT_CHECKPOINT)


def load_shakespeare_sft(device: torch.device | str | None = None) -> Shipped:
    """The reference Shakespeare GPT after supervised fine-tuning on chapter 10's instructions
    (float32, eval mode, on ``device``; default CPU) and its tokenizer."""
    model, tokenizer = load_shakespeare_gpt(device=device)
    load_gpt_weights(model, SFT_CHECKPOINT)
    return Shipped(model.eval(), tokenizer)
