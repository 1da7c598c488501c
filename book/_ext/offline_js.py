"""Sphinx extension: make the book's interactive figures render with no network.

Pages reference their JavaScript on CDNs: altair's charts load vega, vega-lite and vega-embed from
jsdelivr, myst-nb loads require.js (cdnjs) and the jupyter-widgets HTML manager (jsdelivr) on pages
with widgets, bertviz's views load require.js, d3 and jQuery (cdnjs) and Sphinx loads MathJax
(jsdelivr). Offline, figures stay blank and math stays raw.

When ``npm ci`` has filled ``node_modules/`` (see package.json), this extension copies the needed
files into ``_build/html/_static/vendor/`` after the build and points every page at them. The
copies live only in the build (never in the repository) and deliberately not in a top-level
``_static/``: Jupyter Book 1 injects every .js file there into every page. Without node_modules
(no npm on the machine) the pages keep the CDN addresses, which work wherever there is a network.

It also serves the live GPT page (book/text/07e_live_gpt.md): ``book/live_gpt/`` (the widget's
script and style, the exported model and its vocabulary) is copied to ``_static/live_gpt/``, and
onnxruntime-web's single-threaded WebAssembly runtime (``RUNTIME``: its script, module glue and
.wasm, which the widget loads itself; no page names a CDN for it) to ``_static/vendor/``.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Library:
    """One CDN script the pages load, and the npm copy that replaces it.

    cdn: the address as the pages write it (altair appends "?noext", which require.js needs and the
        substitution keeps). file: its replacement, a path inside node_modules, served at the same
        path under _static/vendor/. folders: folders next to ``file`` that it fetches at run time
        (MathJax's fonts). from_page: a node_modules folder whose fonts the library requests relative
        to the *page* (the widgets bundle has an empty webpack publicPath); copied next to each
        page that uses it. module: the page names it as a require.js module path, which require.js
        completes with ".js" (bertviz's d3 and jQuery), so the substitute leaves the extension off.
    """

    cdn: re.Pattern[str]
    file: str
    folders: tuple[str, ...] = ()
    from_page: str | None = None
    module: bool = False


VENDORED = [
    Library(re.compile(r"https://cdn\.jsdelivr\.net/npm/vega@[0-9.]+(?=\?noext)"), "vega/build/vega.min.js"),
    Library(re.compile(r"https://cdn\.jsdelivr\.net/npm/vega-lite@[0-9.]+(?=\?noext)"),
            "vega-lite/build/vega-lite.min.js"),
    Library(re.compile(r"https://cdn\.jsdelivr\.net/npm/vega-embed@[0-9.]+(?=\?noext)"),
            "vega-embed/build/vega-embed.min.js"),
    Library(re.compile(r"https://cdnjs\.cloudflare\.com/ajax/libs/require\.js/[0-9.]+/require\.min\.js"),
            "requirejs/require.js"),
    Library(re.compile(r"https://cdn\.jsdelivr\.net/npm/@jupyter-widgets/html-manager@[0-9.^]+/dist/embed-amd\.js"),
            "@jupyter-widgets/html-manager/dist/embed-amd.js", from_page="@jupyter-widgets/html-manager/dist"),
    Library(re.compile(r"https://cdnjs\.cloudflare\.com/ajax/libs/d3/[0-9.]+/d3\.min(?=['\"])"),
            "d3/dist/d3.min.js", module=True),  # bertviz
    Library(re.compile(r"https://cdnjs\.cloudflare\.com/ajax/libs/jquery/[0-9.]+/jquery\.min(?=['\"])"),
            "jquery/dist/jquery.min.js", module=True),  # bertviz
    Library(re.compile(r"https://cdn\.jsdelivr\.net/npm/mathjax@3/es5/tex-mml-chtml\.js"),
            "mathjax/es5/tex-mml-chtml.js", folders=("output/chtml/fonts/woff-v2", "input/tex/extensions", "ui", "a11y")),
]
# onnxruntime-web's WebAssembly build: the script (global `ort`), the module glue it imports and the
# .wasm (14 MB, 3.7 MB gzipped), copied for the live GPT page; env.wasm.wasmPaths points at them.
RUNTIME = ("onnxruntime-web/dist/ort.wasm.min.js", "onnxruntime-web/dist/ort-wasm-simd-threaded.mjs",
           "onnxruntime-web/dist/ort-wasm-simd-threaded.wasm")
LIVE_GPT = ("live_gpt.js", "live_gpt.css", "shakespeare_gpt.onnx", "shakespeare_gpt.json")
FONTS = ("*.woff", "*.woff2", "*.ttf", "*.eot", "*.svg")
VENDOR_TAG = re.compile(r"<script\b[^>]*_static/vendor/[^>]*>")
INTEGRITY = re.compile(r'\s(integrity|crossorigin)="[^"]*"')


def localise_page(html: str, page: Path, vendor_dir: Path) -> tuple[str, list[Library]]:
    """Point one page's CDN addresses at the vendored copies; return it and the libraries it uses."""
    used = []
    for lib in VENDORED:
        local = Path(os.path.relpath(vendor_dir / lib.file, page.parent)).as_posix()
        if lib.module:
            local = local.removesuffix(".js")
        html, count = lib.cdn.subn(local, html)
        if count:
            used.append(lib)
    # A CDN tag's Subresource-Integrity hash names the CDN's build; the browser would refuse our copy.
    html = VENDOR_TAG.sub(lambda tag: INTEGRITY.sub("", tag.group(0)), html)
    return _require_once_in_head(html), used


REQUIRE_TAG = re.compile(r'<script\b[^>]*src="[^"]*_static/vendor/requirejs/require\.js"[^>]*>\s*</script>\n?')


def _require_once_in_head(html: str) -> str:
    """Load require.js once, in <head>. bertviz's output loads it in the body, after altair's
    loader has already started vega as plain scripts; vega's UMD bundles then register as
    anonymous AMD modules instead of globals and the charts stay blank. A tag already in <head>
    (myst-nb's, on widget pages) is kept where it is; later copies are dropped."""
    tags = list(REQUIRE_TAG.finditer(html))
    head_end = html.find("</head>")
    if not tags or head_end < 0:
        return html
    first_in_head = tags[0].start() < head_end
    for tag in reversed(tags[1:] if first_in_head else tags):
        html = html[:tag.start()] + html[tag.end():]
    if not first_in_head:
        html = html.replace("</head>", tags[0].group(0).strip() + "\n</head>", 1)
    return html


def copy_live_gpt(srcdir: Path, outdir: Path) -> list[str]:
    """Copy the live GPT's files to _static/live_gpt/ and, where node_modules has it, the WebAssembly
    runtime to _static/vendor/; return the runtime files node_modules lacks."""
    live = outdir / "_static" / "live_gpt"
    live.mkdir(parents=True, exist_ok=True)
    for name in LIVE_GPT:
        shutil.copyfile(srcdir / "book" / "live_gpt" / name, live / name)
    node_modules = srcdir / "node_modules"
    missing = [f for f in RUNTIME if not (node_modules / f).is_file()]
    for name in RUNTIME if not missing else ():
        (outdir / "_static" / "vendor" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(node_modules / name, outdir / "_static" / "vendor" / name)
    return missing


def vendor_javascript(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    missing_runtime = copy_live_gpt(Path(app.srcdir), Path(app.outdir))
    if missing_runtime:
        logger.info("offline_js: node_modules lacks %s; the live GPT page will say so", missing_runtime)
    node_modules = Path(app.srcdir) / "node_modules"
    missing = [lib.file for lib in VENDORED if not (node_modules / lib.file).is_file()]
    if missing:
        logger.info("offline_js: node_modules lacks %s; pages keep their CDN addresses", missing)
        return
    outdir = Path(app.outdir)
    vendor_dir = outdir / "_static" / "vendor"
    for lib in VENDORED:
        (vendor_dir / lib.file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(node_modules / lib.file, vendor_dir / lib.file)
        for folder in lib.folders:
            shutil.copytree((node_modules / lib.file).parent / folder, (vendor_dir / lib.file).parent / folder,
                            dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.map"))
    pages = 0
    for page in outdir.rglob("*.html"):
        html, used = localise_page(page.read_text(encoding="utf-8"), page, vendor_dir)
        if not used:
            continue
        page.write_text(html, encoding="utf-8")
        pages += 1
        for lib in used:
            if lib.from_page:
                fonts = [f for pattern in FONTS for f in (node_modules / lib.from_page).glob(pattern)]
                (page.parent / lib.from_page).mkdir(parents=True, exist_ok=True)
                for font in fonts:
                    shutil.copyfile(font, page.parent / lib.from_page / font.name)
    logger.info("offline_js: served %d libraries from _static/vendor on %d pages", len(VENDORED), pages)


def setup(app: Sphinx) -> dict[str, object]:
    app.connect("build-finished", vendor_javascript)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
