"""Tests for lecture_pkg.data: the offline corpora are real prose, deterministic and prefix-stable."""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

import pytest
from pydoc_data.topics import topics

from lecture_pkg.data import pydoc_topics, stdlib_docstrings


def test_pydoc_topics_holds_every_topic_in_sorted_order() -> None:
    text = pydoc_topics()
    assert len(text) == sum(len(t.strip()) for t in topics.values()) + 2 * (len(topics) - 1)
    end = 0
    for name in sorted(topics):                       # each topic found after the previous one
        end = text.index(topics[name].strip(), end) + len(topics[name].strip())
    assert end == len(text)


def test_stdlib_docstrings_prefix_and_limit() -> None:
    small, larger = stdlib_docstrings(max_bytes=50_000), stdlib_docstrings(max_bytes=200_000)
    assert 40_000 < len(small.encode()) <= 50_000 and len(larger.encode()) <= 200_000
    assert larger.startswith(small)
    assert stdlib_docstrings(max_bytes=0) == ""


def test_stdlib_docstrings_match_an_independent_read_of_the_first_file() -> None:
    """The first docstrings are those of the first (sorted) library file, read here with ast."""
    root = Path(sysconfig.get_paths()["stdlib"])
    first = min((p for p in root.glob("*.py")), key=lambda p: p.name)   # a top-level file sorts first
    docs = [ast.get_docstring(n).strip() for n in ast.walk(ast.parse(first.read_bytes()))
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and ast.get_docstring(n)]
    expected = "\n\n".join(docs)
    assert stdlib_docstrings(max_bytes=len(expected.encode())) == expected


def test_deterministic() -> None:
    stdlib_docstrings.cache_clear()
    once = stdlib_docstrings(max_bytes=30_000)
    stdlib_docstrings.cache_clear()
    assert stdlib_docstrings(max_bytes=30_000) == once


@pytest.mark.parametrize(("bad", "error"), [(-1, ValueError), (1.5, TypeError), ("10", TypeError), (True, TypeError)])
def test_bad_max_bytes(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_bytes"):
        stdlib_docstrings(max_bytes=bad)
