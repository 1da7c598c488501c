"""What every model file needs and none of them owns: checks of token ids and masks at the model's
boundary, and the renaming of weights between our modules and Hugging Face's.

Weight names are translated by a table of prefix pairs such as
``("layers.{i}.self_attn.q_proj.", "encoder.layer.{i}.attention.self.query.")``, where ``{i}``
stands for a layer index. The same table renames in both directions, so loading HF weights and
exporting ours for HF cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["HFInterop", "check_hf_class", "check_padding_mask", "check_token_ids",
           "rename_state_dict"]

NameTable = Sequence[tuple[str, str]]


def check_token_ids(name: str, ids: object, vocab_size: int, max_positions: int | None = None,
                    batch_shape: tuple[int, ...] | None = None, nonempty: bool = False) -> Tensor:
    """``ids`` if it is an integer tensor (batch, t) with every id in [0, vocab_size) (not checked
    under torch.compile), t at most ``max_positions``, t >= 1 with ``nonempty`` and, when given,
    shape ``batch_shape``; a clear error otherwise."""
    if not isinstance(ids, Tensor) or ids.is_floating_point() or ids.is_complex() \
            or ids.dtype == torch.bool:
        got = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
        raise TypeError(f"{name} must be an integer tensor (batch, t), got {got}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, t), got {tuple(ids.shape)}")
    if batch_shape is not None and tuple(ids.shape) != tuple(batch_shape):
        raise ValueError(f"{name} must have the shape of input_ids {tuple(batch_shape)}, "
                         f"got {tuple(ids.shape)}")
    if nonempty and ids.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one token per row, got shape "
                         f"{tuple(ids.shape)}")
    if max_positions is not None and ids.shape[1] > max_positions:
        raise ValueError(f"{name} has {ids.shape[1]} positions but the model has at most "
                         f"max_positions={max_positions}")
    # Reading the values syncs with the device and, under torch.compile, would break the graph
    # at every forward: a compiled model skips this one check.
    if ids.numel() and not torch.compiler.is_compiling() \
            and not (0 <= int(ids.min()) and int(ids.max()) < vocab_size):
        raise ValueError(f"{name} must lie in [0, {vocab_size}) (the vocabulary), found ids in "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    return ids


def check_position_ids(position_ids: Tensor, batch: int, t: int, table: int | None = None,
                       table_name: str = "") -> None:
    """position_ids of shape (batch, t) or (1, t) and, for a model with a learned table of
    ``table`` positions (its config field ``table_name``), every position inside it (not checked
    under torch.compile, where reading the values would break the graph)."""
    if tuple(position_ids.shape) not in ((batch, t), (1, t)):
        raise ValueError(f"position_ids must have shape (batch, t) = {(batch, t)}, "
                         f"got {tuple(position_ids.shape)}")
    if table is None or torch.compiler.is_compiling():
        return
    last = int(position_ids.max())
    if last >= table:
        raise ValueError(f"position {last} is outside the context: the learned table has "
                         f"{table_name}={table} positions (prompt plus cached tokens must not "
                         f"exceed it)")


def check_padding_mask(name: str, mask: object, shape: tuple[int, ...]) -> Tensor | None:
    """A (batch, t) padding mask as bool (True = real token). Accepts bool or HF's 0/1 integers;
    None stays None."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.is_floating_point() or mask.is_complex():
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{name} must be a bool or 0/1 integer tensor (batch, t), got {got}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have the shape of its ids {tuple(shape)}, "
                         f"got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        if mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"{name} must hold only 0 (padding) and 1 (real token)")
        mask = mask.bool()
    return mask


def check_hf_class(hf_model: object, expected: str) -> None:
    """TypeError unless ``hf_model`` is a ``transformers`` model of class ``expected``."""
    cls = type(hf_model)
    if cls.__name__ != expected or not cls.__module__.startswith("transformers."):
        raise TypeError(f"hf_model must be a transformers.{expected}, got "
                        f"{cls.__module__}.{cls.__name__}")


def _pattern(prefix: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(prefix).replace(r"\{i\}", r"(?P<i>\d+)"))


def _rename(name: str, table: NameTable) -> str | None:
    for source, target in table:
        match = _pattern(source).match(name)
        if match:
            index = match.groupdict().get("i")
            new_prefix = target.replace("{i}", index) if index is not None else target
            return new_prefix + name[match.end():]
    return None


def rename_state_dict(state: Mapping[str, Tensor], table: NameTable, to_hf: bool,
                      ignored: Sequence[str] = ()) -> dict[str, Tensor]:
    """Rename a state dict through ``table``: ours -> HF when ``to_hf``, HF -> ours otherwise.

    ``ignored`` lists regular expressions of names that are dropped (HF's position-id buffers,
    the tied copy of the word embeddings); any other name the table does not know is an error,
    so weights of a different architecture are never silently skipped.
    """
    pairs = table if to_hf else [(hf, ours) for ours, hf in table]
    renamed, unknown = {}, []
    for name, tensor in state.items():
        if any(re.fullmatch(pattern, name) for pattern in ignored):
            continue
        new = _rename(name, pairs)
        if new is None:
            unknown.append(name)
        else:
            renamed[new] = tensor
    if unknown:
        raise ValueError(f"weights with no counterpart in this architecture: {unknown[:5]}"
                         + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""))
    return renamed


class HFInterop:
    """``from_config``, ``from_hf``, ``from_pretrained``-style loading and ``hf_state_dict`` for
    a model class that says how it maps to Hugging Face's:

    - ``HF_CLASS``: the name of HF's class (checked by ``from_hf``);
    - ``CONFIG``: our config class, with ``CONFIG.from_hf(hf_config)``;
    - ``hf_names()``: the name table (ours, HF's); ``hf_ignored()``: HF names to drop on loading
      (buffers, tied copies); ``hf_aliases()``: {HF name: HF name it repeats} added on export.
    """

    HF_CLASS: str
    CONFIG: Any

    def hf_names(self) -> NameTable:
        raise NotImplementedError

    def hf_ignored(self) -> list[str]:
        return []

    def hf_aliases(self) -> dict[str, str]:
        return {}

    @classmethod
    def from_config(cls, hf_config: Any, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None) -> Any:
        """An untrained model with the sizes of a ``transformers`` config (device="meta"
        counts parameters without allocating them)."""
        return cls(cls.CONFIG.from_hf(hf_config), device=device, dtype=dtype)

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> Any:
        """A copy of a ``transformers`` model of class ``HF_CLASS`` (same device, dtype and
        train/eval mode), giving the same outputs."""
        check_hf_class(hf_model, cls.HF_CLASS)
        weight = next(hf_model.parameters())
        model = cls.from_config(hf_model.config, device=weight.device, dtype=weight.dtype)
        model.load_hf_state_dict(hf_model.state_dict())
        return model.train(hf_model.training)

    def load_hf_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Load weights named as in HF's class (e.g. from a safetensors checkpoint)."""
        ours = rename_state_dict(state, self.hf_names(), to_hf=False, ignored=self.hf_ignored())
        self.load_state_dict(ours, strict=True)  # type: ignore[attr-defined]

    def hf_state_dict(self) -> dict[str, Tensor]:
        """Our weights under HF's names: HF's ``load_state_dict(..., strict=True)`` takes them."""
        ours = self.state_dict()  # type: ignore[attr-defined]
        state = rename_state_dict(ours, self.hf_names(), to_hf=True)
        for alias, original in self.hf_aliases().items():
            state[alias] = state[original]
        return state
