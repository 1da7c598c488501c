"""Argument checks shared by the package's public functions. Each error names the argument and
says what was expected, so a wrong call fails loudly instead of broadcasting or returning NaN."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_bool_mask", "check_float_tensor", "check_int"]


def check_int(name: str, value: object, minimum: int = 0) -> int:
    """``value`` if it is an int (not a bool) of at least ``minimum``; TypeError for another type,
    ValueError below the minimum."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        kind = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be {kind}, got {value}")
    return value


def check_float_tensor(name: str, value: object) -> Tensor:
    """``value`` if it is a tensor with a floating dtype; TypeError otherwise."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {value.dtype}")
    return value


def check_bool_mask(name: str, value: object) -> Tensor:
    """``value`` if it is a bool tensor (the book's masks: True = may attend); TypeError otherwise."""
    if not isinstance(value, Tensor) or value.dtype != torch.bool:
        got = value.dtype if isinstance(value, Tensor) else type(value).__name__
        raise TypeError(f"{name} must be a bool tensor (True = may attend), got {got}")
    return value
