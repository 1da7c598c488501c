"""The shared argument checks."""

from __future__ import annotations

import pytest

from lecture_pkg.checks import check_int


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
