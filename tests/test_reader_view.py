"""The reader's view (book/_ext/reader_view.py): tool markers and pragmas go, code stays; pages are
numbered n.1, n.2 within their chapter; a script registered twice is written once; the front page
lists every page."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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


def test_further_pages_are_numbered_within_their_chapter() -> None:
    from reader_view import page_numbers

    numbers = page_numbers([(6, ["deep", "moe"]), (8, ["swin", "mae", "detr"]), (9, [])])
    assert numbers == {"deep": (6, 1), "moe": (6, 2), "swin": (8, 1), "mae": (8, 2), "detr": (8, 3)}
    with pytest.raises(ValueError, match="chapter must be a positive int"):
        page_numbers([(0, ["a"])])
    with pytest.raises(ValueError, match="listed under two chapters"):
        page_numbers([(1, ["a"]), (2, ["a"])])


class _Script:
    """What Sphinx puts in a page's script_files: a file name (None or "" when inline) and
    attributes (the inline body among them)."""

    def __init__(self, filename: str | None, **attributes: str) -> None:
        self.filename, self.attributes, self.priority = filename, attributes, 500


def test_a_script_registered_twice_is_written_once() -> None:
    from reader_view import one_copy_of_each_script

    thebe = 'const THEBE_JS_URL = "https://unpkg.com/thebe"'
    scripts = [_Script(None, body=thebe), _Script("a.js"), _Script("", body=thebe), _Script("a.js"),
               _Script("a.js", defer="defer"), _Script("", body="let x = 1;")]
    context: dict = {"script_files": scripts}
    one_copy_of_each_script(None, "page", "page.html", context, None)
    assert context["script_files"] is scripts  # the builder's list: later handlers still add to it
    kept = [(s.filename or "", s.attributes) for s in context["script_files"]]
    assert kept == [("", {"body": thebe}), ("a.js", {}), ("a.js", {"defer": "defer"}),
                    ("", {"body": "let x = 1;"})]
    assert context["default_mode"] == "auto"  # pydata-sphinx-theme's colour mode


def test_front_page_lists_every_page_with_its_number() -> None:
    """book/intro.md names every page of _toc.yml once, in reading order, numbered as the sidebar
    numbers it (chapter n, its further pages n.1, n.2, ...)."""
    import re

    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    expected = []
    for part in toc["parts"]:
        for n, chapter in enumerate(part["chapters"], 1):
            stem = Path(chapter["file"]).name
            if not part.get("numbered"):
                expected.append(("", stem))
                continue
            expected.append((f"{n}.", stem))
            expected += [(f"{n}.{i}", Path(s["file"]).name) for i, s in enumerate(chapter.get("sections", []), 1)]
    intro = (ROOT / "book" / "intro.md").read_text()
    listed = re.findall(r"^\s*(?:[-*] )?(\d+\.(?:\d+)?)? ?\{doc\}`([^`]+)`", intro, re.M)
    listed = [(number, stem) for number, stem in listed]
    assert listed == expected, f"intro.md lists {listed}, _toc.yml has {expected}"
