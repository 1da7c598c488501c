"""The shared argument checks."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.checks import check_bool_mask, check_float_tensor, check_int


def test_check_int_accepts_and_returns_valid_ints() -> None:
    assert check_int("n", 0) == 0 and check_int("n", 7, minimum=1) == 7


@pytest.mark.parametrize("bad", [1.0, "3", True, None])
def test_check_int_rejects_other_types(bad: object) -> None:
    with pytest.raises(TypeError, match="n must be an int, got"):
        check_int("n", bad)


def test_check_int_names_the_minimum() -> None:
    with pytest.raises(ValueError, match="n must be positive, got 0"):
        check_int("n", 0, minimum=1)
    with pytest.raises(ValueError, match="n must be >= 256, got 255"):
        check_int("n", 255, minimum=256)


def test_check_float_tensor() -> None:
    x = torch.zeros(2)
    assert check_float_tensor("x", x) is x
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        check_float_tensor("x", [0.0])
    with pytest.raises(TypeError, match="x must have a floating dtype, got torch.int64"):
        check_float_tensor("x", torch.zeros(2, dtype=torch.long))


def test_check_bool_mask() -> None:
    mask = torch.ones(2, 2, dtype=torch.bool)
    assert check_bool_mask("mask", mask) is mask
    with pytest.raises(TypeError, match=r"mask must be a bool tensor \(True = may attend\), got torch.float32"):
        check_bool_mask("mask", mask.float())
    with pytest.raises(TypeError, match="got NoneType"):
        check_bool_mask("mask", None)
