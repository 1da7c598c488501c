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
