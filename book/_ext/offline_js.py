"""Sphinx extension: make the book's interactive figures render with no network.

Notebook outputs reference their JavaScript on CDNs: altair's charts load vega, vega-lite and
vega-embed from jsdelivr, and myst-nb loads require.js (cdnjs) and the jupyter-widgets HTML manager
(jsdelivr) on pages with widgets. Offline, those pages stay blank.

When ``npm ci`` has filled ``node_modules/`` (see package.json), this extension copies the needed
files into ``_build/html/_static/vendor/`` after the build and points every page at them. The
copies live only in the build (never in the repository) and deliberately not in a top-level
``_static/``: Jupyter Book 1 injects every .js file there into every page. Without node_modules
(no npm on the machine) the pages keep the CDN addresses, which work wherever there is a network.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

# CDN address as notebook outputs and myst-nb write it -> the npm file that replaces it.
# The "?noext" suffix altair appends is kept by the substitution: require.js needs it.
VENDORED: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"https://cdn\.jsdelivr\.net/npm/vega@[0-9.]+(?=\?noext)"), "vega/build/vega.min.js"),
    (re.compile(r"https://cdn\.jsdelivr\.net/npm/vega-lite@[0-9.]+(?=\?noext)"),
     "vega-lite/build/vega-lite.min.js"),
    (re.compile(r"https://cdn\.jsdelivr\.net/npm/vega-embed@[0-9.]+(?=\?noext)"),
     "vega-embed/build/vega-embed.min.js"),
    (re.compile(r"https://cdnjs\.cloudflare\.com/ajax/libs/require\.js/[0-9.]+/require\.min\.js"),
     "requirejs/require.js"),
    (re.compile(r"https://cdn\.jsdelivr\.net/npm/@jupyter-widgets/html-manager@[0-9.^]+/dist/embed-amd\.js"),
     "@jupyter-widgets/html-manager/dist/embed-amd.js"),
]


def vendor_name(npm_path: str) -> str:
    """File name under _static/vendor/ for a path inside node_modules."""
    return npm_path.replace("/", "__").lstrip("@")


def localise_page(html: str, page: Path, vendor_dir: Path) -> str:
    """Replace every vendored CDN address in one page by a path relative to that page."""
    for pattern, npm_path in VENDORED:
        local = Path(os.path.relpath(vendor_dir / vendor_name(npm_path), page.parent)).as_posix()
        html = pattern.sub(local, html)
    return html


def vendor_javascript(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    node_modules = Path(app.srcdir) / "node_modules"
    missing = [p for _, p in VENDORED if not (node_modules / p).is_file()]
    if missing:
        logger.info("offline_js: node_modules lacks %s; pages keep their CDN addresses", missing)
        return
    outdir = Path(app.outdir)
    vendor_dir = outdir / "_static" / "vendor"
    vendor_dir.mkdir(parents=True, exist_ok=True)
    for _, npm_path in VENDORED:
        shutil.copyfile(node_modules / npm_path, vendor_dir / vendor_name(npm_path))
    pages = 0
    for page in outdir.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        local = localise_page(html, page, vendor_dir)
        if local != html:
            page.write_text(local, encoding="utf-8")
            pages += 1
    logger.info("offline_js: served %d libraries from _static/vendor on %d pages", len(VENDORED), pages)


def setup(app: Sphinx) -> dict[str, object]:
    app.connect("build-finished", vendor_javascript)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
