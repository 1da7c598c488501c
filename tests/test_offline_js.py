"""The Sphinx extension that points the built pages at vendored JavaScript."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

from offline_js import VENDORED, localise_page  # noqa: E402

PAGE = """
<script integrity="sha256-abc" crossorigin="anonymous" src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.4/require.min.js"></script>
<script>const paths = {"vega": "https://cdn.jsdelivr.net/npm/vega@6?noext",
  "vega-lite": "https://cdn.jsdelivr.net/npm/vega-lite@6.4.1?noext",
  "vega-embed": "https://cdn.jsdelivr.net/npm/vega-embed@7?noext"};</script>
<script src="https://cdn.jsdelivr.net/npm/some-other-lib@1/x.js" integrity="sha256-keep"></script>
"""


def test_localise_page_rewrites_vendored_addresses_relative_to_the_page(tmp_path: Path) -> None:
    page = tmp_path / "book" / "chapter.html"
    html, used = localise_page(PAGE, page, tmp_path / "_static" / "vendor")
    assert '"vega": "../_static/vendor/vega/build/vega.min.js?noext"' in html
    assert '"vega-lite": "../_static/vendor/vega-lite/build/vega-lite.min.js?noext"' in html
    assert '<script src="../_static/vendor/requirejs/require.js"></script>' in html  # SRI hash dropped
    assert 'some-other-lib@1/x.js" integrity="sha256-keep"' in html  # not ours: untouched
    assert {lib.file for lib in used} == {"requirejs/require.js", "vega/build/vega.min.js",
                                         "vega-lite/build/vega-lite.min.js", "vega-embed/build/vega-embed.min.js"}


def test_every_vendored_file_is_declared_in_package_json() -> None:
    import json

    declared = json.loads((ROOT / "package.json").read_text())["dependencies"]
    for lib in VENDORED:
        package = "/".join(lib.file.split("/")[:2]) if lib.file.startswith("@") else lib.file.split("/")[0]
        assert package in declared, f"{package} is vendored but not in package.json"


BERTVIZ = """<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.6/require.min.js"></script>
<script type="text/javascript">
require.config({
  paths: {
      d3: 'https://cdnjs.cloudflare.com/ajax/libs/d3/5.7.0/d3.min',
    jquery: 'https://cdnjs.cloudflare.com/ajax/libs/jquery/2.0.0/jquery.min',
  }
});
</script>"""


def test_bertviz_modules_point_at_vendored_copies_without_extension(tmp_path: Path) -> None:
    """bertviz names d3 and jQuery as require.js module paths: require.js appends ".js", so the
    local path must not end in it (d3.min.js.js would 404)."""
    html, used = localise_page(BERTVIZ, tmp_path / "book" / "07a_bert.html",
                               tmp_path / "_static" / "vendor")
    assert "d3: '../_static/vendor/d3/dist/d3.min'," in html
    assert "jquery: '../_static/vendor/jquery/dist/jquery.min'," in html
    assert '<script src="../_static/vendor/requirejs/require.js"></script>' in html
    assert "cdnjs" not in html
    assert {lib.file for lib in used} == {"requirejs/require.js", "d3/dist/d3.min.js",
                                         "jquery/dist/jquery.min.js"}


def test_require_js_is_loaded_once_in_the_head(tmp_path: Path) -> None:
    """bertviz's require.js tag in the body moves to <head> (before altair's loader runs), and a
    page whose head already loads it (myst-nb on widget pages) keeps that one only."""
    body = f"<html><head><title>x</title></head><body><p>chart</p>{BERTVIZ}{BERTVIZ}</body></html>"
    html, _ = localise_page(body, tmp_path / "book" / "07a_bert.html", tmp_path / "_static" / "vendor")
    tag = '<script src="../_static/vendor/requirejs/require.js"></script>'
    assert html.count(tag) == 1 and html.index(tag) < html.index("</head>")
    with_head = body.replace("<title>x</title>", f"<title>x</title>{BERTVIZ.splitlines()[0]}")
    html, _ = localise_page(with_head, tmp_path / "book" / "07a_bert.html",
                            tmp_path / "_static" / "vendor")
    assert html.count(tag) == 1 and html.index(tag) < html.index("</head>")
