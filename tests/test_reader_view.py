"""The reader's view of code cells (book/_ext/reader_view.py): tool markers and pragmas go, code stays."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

from reader_view import reader_source  # noqa: E402


def test_marker_lines_and_trailing_pragmas_are_removed() -> None:
    cell = ("# NBVAL_CHECK_OUTPUT\n"
            "import numpy as np  # noqa: F401\n"
            "x = f(1)  # type: ignore[arg-type]\n"
            "    # NBVAL_IGNORE_OUTPUT\n"
            "print(x)  # NBVAL_SKIP\n")
    assert reader_source(cell) == "import numpy as np\nx = f(1)\nprint(x)"
    assert reader_source("import transformers  # noqa: E402  (for the reference checks)") == \
        "import transformers  # (for the reference checks)"


def test_code_and_ordinary_comments_are_kept() -> None:
    cell = ("# the lectures' example: noqa is not a marker here\n"
            "s = '# NBVAL_CHECK_OUTPUT'  # a string that names a marker stays\n"
            "y = 2  # why: two heads\n")
    assert reader_source(cell) == cell.rstrip("\n")


def test_the_built_book_uses_the_extension() -> None:
    config = (ROOT / "_config.yml").read_text()
    assert "reader_view: book/_ext" in config
