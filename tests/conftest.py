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


@pytest.fixture(scope="session")
def load_script():
    """``load_script("ppo_vs_grpo")``: scripts/ppo_vs_grpo.py imported as a module, so a test can
    call its functions to reproduce a row the script recorded."""
    import importlib.util
    from pathlib import Path

    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
