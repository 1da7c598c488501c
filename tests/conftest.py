"""Shared test setup: GPU tests skip cleanly on machines without CUDA; the built-book checks
skip unless asked for (make test sets LECTURE_REQUIRE_BOOK=1 after building)."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA device")
    no_book = pytest.mark.skip(reason="set LECTURE_REQUIRE_BOOK=1 after `make book` to check the build")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "book" in item.keywords and os.environ.get("LECTURE_REQUIRE_BOOK") != "1":
            item.add_marker(no_book)
