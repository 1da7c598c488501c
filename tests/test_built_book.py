"""Headless-Chromium check of the built HTML book, with the network cut off.

Run by `make test` after `jupyter-book build` (LECTURE_REQUIRE_BOOK=1); skipped otherwise. Pages are
served from _build/html on 127.0.0.1 and every other host fails to resolve, so a figure that still
needs a CDN stays blank here and the test fails.

Every page is opened at 1280 px (a laptop) and the chart pages again at 390 px (a phone). A probe
script, inserted first in the page's <head>, records what a reader would meet: console errors,
uncaught exceptions and failed loads; content that passes the text column or needs a sideways
scroll; the smallest text drawn in a chart. It writes its findings into the page as JSON, which
`--dump-dom` returns.
"""

from __future__ import annotations

import functools
import html
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
PAGES = ["intro", *CHAPTERS, "bibliography"]  # every page the table of contents lists
LAPTOP, PHONE = 1280, 390  # window widths, px
MIN_CHART_FONT_PX = 10  # the smallest chart text a reader can read on a phone, as drawn
MAX_PAGE_PX = 27_000  # about 30 screens at 1280 px: a longer chapter is split into pages
# Pages still over the limit, each with the height it must not exceed until it is split or its
# plotting folded. The list may only shrink; it is empty since 7.1 and 7.3 were folded.
OVER_THE_LIMIT_PX: dict[str, int] = {}


# Inserted right after <head> of a page served as "<page>.html?probe": it hooks the console and the
# error events before any other script runs, and once scripts, MathJax and the charts have had
# their time it writes {problems, overflow, scrolling, chart_fonts, height} as JSON into a
# <pre id="probe-report">. Hidden cells (folded input, exercise solutions) are opened first, so
# their code is measured too.
PROBE = """<script>
(() => {
  const problems = [];
  const text = (x) => {
    if (x instanceof Error) return `${x.name}: ${x.message}`;
    try { return typeof x === "string" ? x : JSON.stringify(x); } catch (e) { return String(x); }
  };
  const consoleError = console.error.bind(console);
  console.error = (...args) => {
    problems.push("console.error: " + args.map(text).join(" ").slice(0, 300));
    consoleError(...args);
  };
  window.addEventListener("error", (event) => {
    const el = event.target;
    if (el && el !== window && el.tagName)
      problems.push(`failed to load <${el.tagName.toLowerCase()}> ${el.src || el.href || ""}`);
    else problems.push("uncaught " + (event.message || text(event.error)));
  }, true);
  window.addEventListener("unhandledrejection", (event) =>
    problems.push("unhandled rejection: " + text(event.reason).slice(0, 300)));

  const describe = (el) => {
    const cell = el.closest("div.cell");
    const where = cell ? `cell ${[...document.querySelectorAll("div.cell")].indexOf(cell)}` : "text";
    const kind = el.closest("div.cell_input") ? "code" : el.closest("div.cell_output") ? "output"
               : el.tagName.toLowerCase();
    const first = (el.innerText || "").trim().split("\\n")[0].slice(0, 70);
    return `${kind} (${where}, ${el.tagName.toLowerCase()}.${el.className}) "${first}"`;
  };
  function report() {
    const height = document.documentElement.scrollHeight;  // as the reader first sees it
    for (const d of document.querySelectorAll("details")) d.open = true;
    for (const el of document.querySelectorAll(".toggle-hidden, .tag_hide-input .cell_input"))
      el.classList.remove("toggle-hidden");
    const column = document.querySelector("article.bd-article") || document.querySelector("main");
    const right = column.getBoundingClientRect().right;
    const overflow = [], scrolling = [];
    const boxes = "div.cell_output > *, div.cell_output table, div.cell_output .vega-embed, "
                + "div.math, mjx-container[display='true'], div.cell_input";
    for (const el of document.querySelectorAll(boxes)) {
      const r = el.getBoundingClientRect();
      if (r.width > 0 && r.right > right + 1) overflow.push(`${describe(el)}: ${Math.round(r.right - right)} px`);
    }
    // code cells, outputs and tables that the reader would have to scroll sideways
    const scrollable = "div.cell_input pre, div.cell_output pre, div.cell_output .output, "
                     + "div.cell_output > *, div.cell_output table, article table, div.highlight pre";
    for (const el of new Set(document.querySelectorAll(scrollable))) {
      if (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1)
        scrolling.push(`${describe(el)}: ${el.scrollWidth} px in ${el.clientWidth} px`);
    }
    // chart text as drawn: the font size times the scale at which the chart's SVG is shown
    const chartFonts = [];
    for (const svg of document.querySelectorAll(".vega-embed svg")) {
      const box = svg.getBoundingClientRect(), own = svg.width.baseVal.value || box.width;
      const scale = own > 0 ? box.width / own : 1;
      for (const t of svg.querySelectorAll("text")) {
        if (!t.textContent.trim() || t.getBoundingClientRect().width === 0) continue;
        const size = parseFloat(getComputedStyle(t).fontSize) * scale;
        chartFonts.push([Math.round(size * 10) / 10, t.textContent.trim().slice(0, 30)]);
      }
    }
    chartFonts.sort((a, b) => a[0] - b[0]);
    const out = document.createElement("pre");
    out.id = "probe-report";
    const searchFields = [...document.querySelectorAll(".search-button-field, .search-button")]
      .filter((el) => el.getBoundingClientRect().width > 0 && getComputedStyle(el).visibility !== "hidden").length;
    out.textContent = JSON.stringify({problems, overflow, scrolling, chart_fonts: chartFonts.slice(0, 5),
                                      search_fields: searchFields,
                                      charts: document.querySelectorAll(".vega-embed svg").length,
                                      height});
    document.body.appendChild(out);
  }
  window.addEventListener("load", () => setTimeout(report, 8000));
})();
</script>"""


class RecordingHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[tuple[str, int, str]] = []  # (path, status, the page that asked for it)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        referer = self.headers.get("Referer", "") if self.headers else ""
        self.requests.append((self.path, int(code) if str(code).isdigit() else 0, referer))

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if query != "probe" or not path.endswith(".html"):
            return super().do_GET()
        page = (Path(self.directory) / path.lstrip("/")).read_text(encoding="utf-8")
        body = re.sub(r"<head>", lambda m: m.group(0) + PROBE, page, count=1).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list[tuple[str, int, str]]]]:
    if not (HTML / "index.html").exists():
        pytest.fail("no built book in _build/html: run `make book` first")
    log: list[tuple[str, int, str]] = []
    handler = type("Handler", (RecordingHandler,), {"requests": log})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(HTML)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", log
    httpd.shutdown()


def chromium(url: str, width: int = LAPTOP) -> subprocess.CompletedProcess[str]:
    """Headless Chromium's --dump-dom of `url` in a window `width` px wide, with no network."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.fail("headless Chromium not found: `make browser-check` installs Debian's chromium")
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
             f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
             f"--window-size={width},1000", "--virtual-time-budget=20000", "--dump-dom", url],
            capture_output=True, text=True, timeout=180,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result


@functools.cache
def rendered(url: str, width: int = LAPTOP) -> tuple[str, dict, list[str]]:
    """A page after its scripts ran, from headless Chromium with no network and a window `width`
    px wide: its DOM (script bodies removed), the probe's report, and the console messages
    Chromium logged as uncaught errors or failed loads."""
    result = chromium(url, width)
    dom = re.sub(r"<script\b.*?</script>", "", result.stdout, flags=re.S)  # keep rendered elements only
    found = re.search(r'<pre id="probe-report">(.*?)</pre>', dom, re.S)
    assert found, f"{url}: the probe did not report (page did not finish loading?)"
    report = json.loads(html.unescape(found.group(1)))
    console = [m for m in re.findall(r'INFO:CONSOLE[^\]]*\] "(.*?)", source:', result.stderr)
               if m.startswith("Uncaught") or "Failed to load resource" in m]
    return dom, report, console


def page_url(base: str, page: str) -> str:
    return f"{base}/book/{page}.html?probe"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_renders_offline(server: tuple[str, list[tuple[str, int, str]]], chapter: str) -> None:
    base, _ = server
    page = HTML / "book" / f"{chapter}.html"
    assert page.exists(), f"{chapter} was not built"
    source = page.read_text(encoding="utf-8")
    dom, _, _ = rendered(page_url(base, chapter))

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


@pytest.mark.parametrize("page", PAGES)
def test_console_is_clean(server: tuple[str, list[tuple[str, int, str]]], page: str) -> None:
    """No console error, uncaught exception, rejected promise or failed load on the page, and no
    request of the page (the favicon included) answered with an error by the local server."""
    base, log = server
    _, report, console = rendered(page_url(base, page))
    assert not report["problems"], f"{page}: console errors: {report['problems'][:5]}"
    assert not console, f"{page}: Chromium logged: {console[:5]}"
    failed = [(path, code) for path, code, referer in log if code >= 400 and f"/book/{page}.html" in referer]
    assert not failed, f"{page}: requests failed on the local server: {failed[:5]}"


@pytest.mark.parametrize("page", PAGES)
def test_content_fits_the_column(server: tuple[str, list[tuple[str, int, str]]], page: str) -> None:
    """At 1280 px no code cell, output or table needs a sideways scroll, and nothing (charts and
    display equations included) runs past the text column; no tool marker or lint pragma shows."""
    base, _ = server
    _, report, _ = rendered(page_url(base, page))
    assert not report["scrolling"], \
        f"{page}: {len(report['scrolling'])} boxes need a horizontal scroll at {LAPTOP} px: {report['scrolling'][:5]}"
    assert not report["overflow"], f"{page}: content wider than the column: {report['overflow'][:5]}"
    source = (HTML / "book" / f"{page}.html").read_text(encoding="utf-8")
    shown = re.findall(r"NBVAL_[A-Z_]+|# noqa", source)
    assert not shown, f"{page}: tool markers shown to readers: {shown[:3]}"


@pytest.mark.parametrize("page", PAGES)
def test_page_is_at_most_30_screens(server: tuple[str, list[tuple[str, int, str]]], page: str) -> None:
    """At 1280 px, with folded cells folded, a page is at most MAX_PAGE_PX tall."""
    base, _ = server
    _, report, _ = rendered(page_url(base, page))
    limit = OVER_THE_LIMIT_PX.get(page, MAX_PAGE_PX)
    assert report["height"] <= limit, \
        f"{page}: {report['height']} px at {LAPTOP} px ({report['height'] / 900:.0f} screens): split it into pages"
    if page in OVER_THE_LIMIT_PX:  # a page that got under the limit leaves the list
        assert report["height"] > MAX_PAGE_PX, f"{page} now fits: remove it from OVER_THE_LIMIT_PX"


CHART_PAGES = [c for c in CHAPTERS if "vega-embed" in (ROOT / "book" / f"{c}.ipynb").read_text(encoding="utf-8")]


@pytest.mark.parametrize("chapter", CHART_PAGES)
def test_chart_text_is_readable_on_a_phone(server: tuple[str, list[tuple[str, int, str]]], chapter: str) -> None:
    """At 390 px every chart is drawn and its smallest text, as shown (font size times the scale
    of its SVG), is at least MIN_CHART_FONT_PX."""
    base, _ = server
    _, report, _ = rendered(page_url(base, chapter), PHONE)
    assert report["charts"] > 0, f"{chapter}: no chart drawn at {PHONE} px"
    smallest = report["chart_fonts"][:1]
    assert not smallest or smallest[0][0] >= MIN_CHART_FONT_PX, \
        f"{chapter}: chart text drawn at {smallest[0][0]} px on a {PHONE} px screen: {report['chart_fonts']}"


def test_nadaraya_watson_chart_has_slider_and_marks(server: tuple[str, list[tuple[str, int, str]]]) -> None:
    """The model chapter's bandwidth chart: rendered rects (heatmap), lines (fit) and a slider."""
    base, log = server
    dom, _, _ = rendered(page_url(base, "01_nadaraya_watson"))
    assert len(re.findall(r'class="mark-rect role-mark', dom)) >= 1
    assert len(re.findall(r'class="mark-line role-mark', dom)) >= 1
    assert '<span class="vega-bind-name">bandwidth h </span>' in dom
    # every vendored library was served by the book itself
    served = json.dumps(log)
    for lib in ("vega.min.js", "vega-lite.min.js", "vega-embed.min.js", "require.js", "embed-amd.js",
                "tex-mml-chtml.js"):
        assert lib in served, f"{lib} was not loaded from the book's own _static/vendor"


BERTVIZ_CHAPTERS = [c for c in CHAPTERS
                    if "bertviz-" in (ROOT / "book" / f"{c}.ipynb").read_text(encoding="utf-8")]


@pytest.mark.parametrize("chapter", BERTVIZ_CHAPTERS)
def test_bertviz_views_draw_their_svg(server: tuple[str, list[tuple[str, int, str]]],
                                      chapter: str) -> None:
    """Every bertviz view (head view, model view) on the page draws an <svg> with token labels
    inside its own container: require.js, d3 and jQuery came from the book's _static/vendor."""
    base, log = server
    source = (HTML / "book" / f"{chapter}.html").read_text(encoding="utf-8")
    views = list(dict.fromkeys(re.findall(r'<div id="(bertviz-[0-9a-f]{32})"', source)))
    assert views, f"{chapter}: the notebook has bertviz output but the page has no view"
    dom, _, _ = rendered(page_url(base, chapter))
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


def test_search_finds_pages_and_quotes_formulas_as_text(server: tuple[str, list[tuple[str, int, str]]]) -> None:
    """The search page lists chapters for a query, and its excerpts show formulas as text, not
    as LaTeX source (book/_ext/reader_view/reader_view.js)."""
    base, _ = server
    dom = re.sub(r"<script\b.*?</script>", "", chromium(f"{base}/search.html?q=softmax+scaled").stdout, flags=re.S)
    results = re.findall(r'<li[^>]*>\s*<a[^>]*href="([^"]+)"', dom)
    assert any("02_attention" in href for href in results), f"search for softmax found {results[:5]}"
    excerpts = " ".join(re.findall(r'<p class="context"[^>]*>(.*?)</p>', dom, re.S))
    assert excerpts, "search results carry no excerpts"
    latex = re.findall(r"\\[()\[\]]|\\(?:operatorname|frac|sqrt|mathrm)\b", excerpts)
    assert not latex, f"raw LaTeX in search excerpts: {latex[:5]}"


def test_one_search_box(server: tuple[str, list[tuple[str, int, str]]]) -> None:
    """At 1280 px the reader sees one search field (the theme's header bar held a second one)."""
    base, _ = server
    dom, _, _ = rendered(page_url(base, "02_attention"))
    report = json.loads(html.unescape(re.search(r'<pre id="probe-report">(.*?)</pre>', dom, re.S).group(1)))
    assert report["search_fields"] == 1, f"{report['search_fields']} search fields visible"
