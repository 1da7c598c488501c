"""Argument checks shared by the package's public functions. Each error names the argument and
says what was expected, so a wrong call fails loudly instead of broadcasting or returning NaN."""

from __future__ import annotations

__all__ = ["check_int"]


def check_int(name: str, value: object, minimum: int = 0) -> int:
    """``value`` if it is an int (not a bool) of at least ``minimum``; TypeError for another type,
    ValueError below the minimum."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        kind = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be {kind}, got {value}")
    return value
