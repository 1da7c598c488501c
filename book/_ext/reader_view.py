"""Sphinx extension: what a reader of the HTML book sees of a chapter, beyond its stored content.

* Code cells lose the lines and comments that only tools read: nbval's cell markers
  (``# NBVAL_CHECK_OUTPUT`` and the like) and lint pragmas (``# noqa``, ``# type: ignore``). The
  notebook keeps them, so nbval and the linters still see them; Colab users see them too, which is
  where they are useful.
* A style sheet keeps wide content inside the text column: long outputs, tables, charts and
  display equations scroll inside their own box instead of running past the page.
"""

from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx

# A whole line that is only a marker, or a marker at the end of a code line.
_MARKER_LINE = re.compile(r"^[ \t]*# *NBVAL_[A-Z_]+[ \t]*\n?", re.M)
_TRAILING_PRAGMA = re.compile(r"[ \t]*# *(noqa\b[:A-Z0-9, ]*|type: *ignore\b\S*|NBVAL_[A-Z_]+)[ \t]*$", re.M)
# A pragma that opens a comment which goes on ("# noqa: E402  (why)"): the comment stays.
_LEADING_PRAGMA = re.compile(r"# *noqa(?:: *[A-Z]+[0-9]+(?:[, ]+[A-Z]+[0-9]+)*)?[ \t]+(?=\S)")


def reader_source(code: str) -> str:
    """Cell source without tool markers and pragmas (see the module docstring)."""
    code = _TRAILING_PRAGMA.sub("", _MARKER_LINE.sub("", code))
    return _LEADING_PRAGMA.sub("# ", code).strip("\n")


def strip_tool_markers(app: Sphinx, doctree: nodes.document) -> None:
    for block in list(doctree.findall(nodes.literal_block)):
        text = block.astext()
        cleaned = reader_source(text)
        if cleaned != text:
            block.children = [nodes.Text(cleaned)]
            block.rawsource = cleaned


def setup(app: Sphinx) -> dict[str, object]:
    app.connect("doctree-read", strip_tool_markers)
    static = Path(__file__).with_suffix("")  # reader_view/ beside this file holds the style sheet
    app.connect("builder-inited", lambda app: app.config.html_static_path.append(str(static)))
    app.add_css_file("reader_view.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
