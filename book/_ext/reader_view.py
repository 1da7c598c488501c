"""Sphinx extension: what a reader of the HTML book sees of a chapter, beyond its stored content.

* Code cells lose the lines and comments that only tools read: nbval's cell markers
  (``# NBVAL_CHECK_OUTPUT`` and the like) and lint pragmas (``# noqa``, ``# type: ignore``). The
  notebook keeps them, so nbval and the linters still see them; Colab users see them too, which is
  where they are useful.
* A style sheet gives code of 88 characters the width it needs at 1280 px, wraps text outputs and
  keeps what cannot wrap (tables, charts, display equations) inside the text column.
* Pages are numbered the way the prose names them: a chapter is "8", its further pages "8.1",
  "8.2", ... in the sidebar, in their titles and in the previous/next links. (Sphinx's own
  numbering would continue a chapter's first page's sections: the second page became 8.11.)
* A clean console: Sphinx extensions that register their inline script once per build pass
  (sphinx-thebe's ``const THEBE_JS_URL``) no longer put it twice on a page; the jupyter-widgets
  manager, written for MathJax 2, finds the ``MathJax.Hub.Queue`` it calls (MathJax 3 typesets
  instead); the theme gets a valid default colour mode; the book has a favicon.
* One search box (the theme's header bar held a second one), and search results quote formulas as
  plain text instead of raw LaTeX (reader_view/reader_view.js).
"""

from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment

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


def page_numbers(chapters: list[tuple[int, list[str]]]) -> dict[str, tuple[int, ...]]:
    """The number of every further page: chapter ``n``'s pages after its first are n.1, n.2, ...

    chapters: (chapter number, [further pages in reading order]) for each numbered chapter."""
    numbers: dict[str, tuple[int, ...]] = {}
    for chapter, pages in chapters:
        if not isinstance(chapter, int) or chapter < 1:
            raise ValueError(f"chapter must be a positive int, got {chapter!r}")
        for i, page in enumerate(pages, 1):
            if page in numbers:
                raise ValueError(f"page {page!r} is listed under two chapters")
            numbers[page] = (chapter, i)
    return numbers


def number_further_pages(app: Sphinx, env: BuildEnvironment) -> list[str]:
    """After Sphinx numbered the chapters (``numbered: 1`` in _toc.yml), number each chapter's
    further pages n.1, n.2, ...: their entry in every table of contents, their title (and so the
    previous/next links), while their own headings stay unnumbered."""
    chapters = []
    for chapter, anchors in env.toc_secnumbers.items():
        number = anchors.get("")
        if number and len(number) == 1:
            chapters.append((number[0], list(env.toctree_includes.get(chapter, []))))
    numbers = page_numbers(sorted(chapters))
    for page, number in numbers.items():
        toc = env.tocs.get(page)
        if toc is None:
            continue
        references = [ref for ref in toc.findall(nodes.reference)
                      if isinstance(ref.parent, addnodes.compact_paragraph)]
        env.toc_secnumbers[page] = {ref["anchorname"]: None for ref in references}
        env.toc_secnumbers[page][""] = number
        for ref in references:  # Sphinx keeps these as lists (sphinx-external-toc edits them)
            ref["secnumber"] = list(number) if ref["anchorname"] == "" else None
            ref[_MARK] = True
        env.titles[page]["secnumber"] = list(number)
        env.titles[page][_MARK] = True
    return sorted(numbers)


_MARK = "reader_view_number"


def forget_page_numbers(app: Sphinx, env: BuildEnvironment) -> list[str]:
    """Before Sphinx numbers the chapters again (an incremental build keeps the stored tables of
    contents), take back the numbers number_further_pages gave: sphinx-external-toc would look
    up a numbered entry in a table Sphinx has just emptied."""
    for node in [*env.tocs.values(), *env.titles.values()]:
        for marked in node.findall(lambda n: isinstance(n, nodes.Element) and _MARK in n):
            for attribute in ("secnumber", _MARK):
                if attribute in marked:
                    del marked[attribute]
    return []


def one_copy_of_each_script(app: Sphinx, pagename: str, templatename: str, context: dict,
                            doctree: nodes.document | None) -> None:
    """Drop repeated script tags (same file or same inline body, same attributes) from a page: a
    second ``const THEBE_JS_URL = ...`` is a SyntaxError in the console. Also give the theme its
    colour mode (pydata-sphinx-theme reads ``default_mode`` from the page context and logs "Got
    invalid theme mode" as a console error without it)."""
    context.setdefault("default_mode", "auto")
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[str] = set()
    unique = []
    for script in scripts:
        # an inline script's file is None from one extension and "" from another
        key = repr((getattr(script, "filename", str(script)) or "",
                    sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    # in place: the list is the builder's own, which later handlers (MathJax's) still add to
    scripts[:] = unique


def setup(app: Sphinx) -> dict[str, object]:
    app.connect("doctree-read", strip_tool_markers)
    static = Path(__file__).with_suffix("")  # reader_view/ beside this file holds the style sheet
    app.connect("builder-inited", lambda app: app.config.html_static_path.append(str(static)))
    # around Sphinx's own TocTreeCollector (priority 500), which numbers the chapters
    app.connect("env-get-updated", forget_page_numbers, priority=100)
    app.connect("env-get-updated", number_further_pages, priority=900)
    # early: a theme handler returns a template name, which ends html-page-context's emission
    app.connect("html-page-context", one_copy_of_each_script, priority=100)
    app.add_css_file("reader_view.css")
    # after MathJax 3's configuration (an inline script that replaces window.MathJax)
    app.add_js_file("reader_view.js", priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
