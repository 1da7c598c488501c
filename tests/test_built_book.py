"""Headless-Chromium check of the built HTML book, with the network cut off.

Run by `make test` after `jupyter-book build` (LECTURE_REQUIRE_BOOK=1); skipped otherwise. Pages are
served from _build/html on 127.0.0.1 and every other host fails to resolve, so a figure that still
needs a CDN stays blank here and the test fails.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CHAPTERS = sorted(p.stem for p in (ROOT / "book").glob("*.ipynb"))


# Appended to a page served as "<page>.html?layout": once scripts, MathJax and the charts have run,
# it lists every output box, table, chart and display equation whose right edge passes the text
# column's, in a <pre id="layout-report"> that --dump-dom then shows.
LAYOUT_PROBE = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const column = document.querySelector("article.bd-article") || document.querySelector("main");
  const right = column.getBoundingClientRect().right;
  const boxes = "div.cell_output > *, div.cell_output table, div.cell_output .vega-embed, "
              + "div.math, mjx-container[display='true'], div.cell_input";
  const over = [];
  for (const el of document.querySelectorAll(boxes)) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > right + 1)
      over.push(`${el.tagName.toLowerCase()}.${el.className}: ${Math.round(r.right - right)} px`);
  }
  const report = document.createElement("pre");
  report.id = "layout-report";
  report.textContent = JSON.stringify(over);
  document.body.appendChild(report);
}, 8000));
</script>"""


class RecordingHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[tuple[str, int]] = []

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.requests.append((self.path, int(code) if str(code).isdigit() else 0))

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if query != "layout" or not path.endswith(".html"):
            return super().do_GET()
        page = (Path(self.directory) / path.lstrip("/")).read_text(encoding="utf-8")
        body = page.replace("</body>", LAYOUT_PROBE + "</body>", 1).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list[tuple[str, int]]]]:
    if not (HTML / "index.html").exists():
        pytest.fail("no built book in _build/html: run `make book` first")
    log: list[tuple[str, int]] = []
    handler = type("Handler", (RecordingHandler,), {"requests": log})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(HTML)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", log
    httpd.shutdown()


@functools.cache
def rendered_dom(url: str) -> str:
    """The DOM of a page after its scripts ran (script bodies removed), from headless Chromium
    with no network."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.fail("headless Chromium not found: `make browser-check` installs Debian's chromium")
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
             "--window-size=1280,1000", "--virtual-time-budget=20000", "--dump-dom", url],
            capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return re.sub(r"<script\b.*?</script>", "", result.stdout, flags=re.S)  # keep rendered elements only


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_renders_offline(server: tuple[str, list[tuple[str, int]]], chapter: str) -> None:
    base, log = server
    page = HTML / "book" / f"{chapter}.html"
    assert page.exists(), f"{chapter} was not built"
    source = page.read_text(encoding="utf-8")
    dom = rendered_dom(f"{base}/book/{chapter}.html?layout")  # rendered once for both page tests

    # altair's loader writes its failures into the chart's div as <div class="error" ...>
    errors = re.findall(r'<div class="error"[^>]*>([^<]*)', dom)
    assert not errors, f"{chapter}: chart errors in the page: {errors[:3]}"
    assert "Error loading script" not in dom and "JavaScript Error" not in dom
    if "vega-embed" in source or "altair-viz" in source:
        # SVG renderer: each drawn mark is a DOM element; none appear if vega failed to load.
        assert "role-mark" in dom, f"{chapter}: altair chart(s) present but no marks rendered"
    sliders = len(re.findall(r'"bind": \{"input": "range"', source))
    if sliders:  # Vega-Lite parameters bound to sliders: each renders as an <input type="range">
        assert len(re.findall(r'<input type="range"', dom)) >= sliders, f"{chapter}: sliders missing"
    if "application/vnd.jupyter.widget-state+json" in source:
        assert re.search(r'class="[^"]*widget-(hslider|slider|dropdown|box)', dom), \
            f"{chapter}: ipywidgets state is embedded but no widget rendered"
    if "$$" in source or "\\(" in source or "math notranslate" in source:
        assert "<mjx-container" in dom, f"{chapter}: math present but MathJax did not typeset it"
    failed = [(path, code) for path, code in log if code >= 400 and path != "/favicon.ico"]
    assert not failed, f"{chapter}: requests failed on the local server: {failed[:5]}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_wide_content_stays_in_the_column(server: tuple[str, list[tuple[str, int]]], chapter: str) -> None:
    """No output, table, chart or display equation runs past the text column (each scrolls inside
    its own box instead), and no tool marker or lint pragma shows in a code cell."""
    base, _ = server
    dom = rendered_dom(f"{base}/book/{chapter}.html?layout")
    report = re.search(r'<pre id="layout-report">(.*?)</pre>', dom, re.S)
    assert report, f"{chapter}: the layout probe did not run"
    overflowing = json.loads(report.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert not overflowing, f"{chapter}: content wider than the column: {overflowing[:5]}"
    page = (HTML / "book" / f"{chapter}.html").read_text(encoding="utf-8")
    shown = re.findall(r"NBVAL_[A-Z_]+|# noqa", page)
    assert not shown, f"{chapter}: tool markers shown to readers: {shown[:3]}"


def test_nadaraya_watson_chart_has_slider_and_marks(server: tuple[str, list[tuple[str, int]]]) -> None:
    """The model chapter's bandwidth chart: rendered rects (heatmap), lines (fit) and a slider."""
    base, _ = server
    dom = rendered_dom(f"{base}/book/01_nadaraya_watson.html?layout")
    assert len(re.findall(r'class="mark-rect role-mark', dom)) >= 1
    assert len(re.findall(r'class="mark-line role-mark', dom)) >= 1
    assert '<span class="vega-bind-name">bandwidth h </span>' in dom
    # every vendored library was served by the book itself
    served = json.dumps(server[1])
    for lib in ("vega.min.js", "vega-lite.min.js", "vega-embed.min.js", "require.js", "embed-amd.js",
                "tex-mml-chtml.js"):
        assert lib in served, f"{lib} was not loaded from the book's own _static/vendor"


BERTVIZ_CHAPTERS = [c for c in CHAPTERS
                    if "bertviz-" in (ROOT / "book" / f"{c}.ipynb").read_text(encoding="utf-8")]


@pytest.mark.parametrize("chapter", BERTVIZ_CHAPTERS)
def test_bertviz_views_draw_their_svg(server: tuple[str, list[tuple[str, int]]],
                                      chapter: str) -> None:
    """Every bertviz view (head view, model view) on the page draws an <svg> with token labels
    inside its own container: require.js, d3 and jQuery came from the book's _static/vendor."""
    base, log = server
    source = (HTML / "book" / f"{chapter}.html").read_text(encoding="utf-8")
    views = list(dict.fromkeys(re.findall(r'<div id="(bertviz-[0-9a-f]{32})"', source)))
    assert views, f"{chapter}: the notebook has bertviz output but the page has no view"
    dom = rendered_dom(f"{base}/book/{chapter}.html?layout")
    for view in views:
        start = dom.find(f'id="{view}"')
        assert start >= 0, f"{chapter}: {view} missing from the rendered page"
        following = dom.find('id="bertviz-', start + 1)
        block = dom[start:following if following > 0 else len(dom)]
        assert "<svg" in block, f"{chapter}: bertviz view {view} drew no SVG"
        assert len(re.findall(r"<text\b", block)) >= 4, f"{chapter}: {view} has no token labels"
    served = json.dumps(log)
    for lib in ("d3.min.js", "jquery.min.js", "require.js"):
        assert lib in served, f"{lib} was not loaded from the book's own _static/vendor"
