"""The live page's model (book/live_gpt/, written by scripts/export_live_gpt.py) against PyTorch.

The first tests run the shipped ONNX file with onnxruntime (Python) on fixed prompts and compare
logits, every head's attention weights and the logit lens with the package's GPT; one checks
what the build copies (book/_ext/offline_js.py). The last two (marked ``book``, run by `make
browser-check`) open the built page in headless Chromium with every other host unresolvable: a
driver types prompts into the widget and the test compares what it shows (probabilities, greedy
and top-k = 1 continuations, the top-k/top-p filter) with PyTorch's; opened as file://, the page
says how to serve the book.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lecture_pkg import generation
from lecture_pkg.shakespeare_gpt import load_shakespeare_gpt

ROOT = Path(__file__).resolve().parents[1]
LIVE = ROOT / "book" / "live_gpt"
PROMPTS = ["R", "ROMEO:\nBut soft, what light", "KING HENRY.\nOnce more unto the breach, dear friends",
           ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak."
            "\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?")[:128]]


@pytest.fixture(scope="module")
def gpt():
    return load_shakespeare_gpt()


@pytest.fixture(scope="module")
def session():
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(LIVE / "shakespeare_gpt.onnx"), providers=["CPUExecutionProvider"])


def torch_reference(model, ids: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """logits (1, t, V), attentions (layers, heads, t, t) and the logit lens at the last position
    (layers, V), from the package's GPT: the lens reads each block's output through hooks."""
    outputs: list[torch.Tensor] = []
    hooks = [block.register_forward_hook(lambda _m, _i, out: outputs.append(out[0]))
             for block in model.blocks]
    try:
        with torch.no_grad():
            out = model(ids, output_attentions=True)
            lens = torch.stack([model.lm_head(model.ln_f(x[0, -1])) for x in outputs])
    finally:
        for hook in hooks:
            hook.remove()
    return out.logits.numpy(), torch.cat(out.attentions).numpy(), lens.numpy()


def test_vocabulary_and_sizes_match_the_checkpoint(gpt) -> None:
    model, tokenizer = gpt
    meta = json.loads((LIVE / "shakespeare_gpt.json").read_text(encoding="utf-8"))
    assert meta["chars"] + meta["special_tokens"] == tokenizer.itos
    assert (meta["n_positions"], meta["n_layer"], meta["n_head"]) == \
        (model.config.n_positions, model.config.n_layer, model.config.n_head)
    size = (LIVE / "shakespeare_gpt.onnx").stat().st_size
    assert size <= 5e6, f"the exported model is {size / 1e6:.1f} MB (the page's budget is 5 MB)"


@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: f"{len(p)}chars")
def test_onnx_equals_pytorch(gpt, session, prompt: str) -> None:
    model, tokenizer = gpt
    ids = torch.tensor([tokenizer.encode(prompt)])
    logits, attentions, lens = session.run(None, {"input_ids": ids.numpy()})
    ref_logits, ref_attentions, ref_lens = torch_reference(model, ids)
    t = ids.shape[1]
    assert logits.shape == (1, t, tokenizer.vocab_size)
    assert attentions.shape == (model.config.n_layer, model.config.n_head, t, t)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-4, rtol=0)
    np.testing.assert_allclose(attentions, ref_attentions, atol=1e-5, rtol=0)
    np.testing.assert_allclose(lens, ref_lens, atol=1e-4, rtol=0)
    np.testing.assert_allclose(lens[-1], logits[0, -1], atol=1e-5, rtol=0)  # last layer = output
    probs = torch.tensor(logits[0, -1]).softmax(-1)
    ref_probs = torch.tensor(ref_logits[0, -1]).softmax(-1)
    assert (probs - ref_probs).abs().max() < 1e-5


def test_export_script_reproduces_the_shipped_file(gpt, session, tmp_path: Path) -> None:
    """Re-exporting from the shipped checkpoint gives a graph with the same outputs (the shipped
    file is not stale)."""
    pytest.importorskip("onnx")
    import onnxruntime as ort

    spec = importlib.util.spec_from_file_location("export_live_gpt", ROOT / "scripts" / "export_live_gpt.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    onnx_path, json_path = script.export(tmp_path)
    assert json_path.read_text(encoding="utf-8") == (LIVE / "shakespeare_gpt.json").read_text(encoding="utf-8")
    fresh = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ids = np.array([gpt[1].encode(PROMPTS[1])])
    for new, old in zip(fresh.run(None, {"input_ids": ids}), session.run(None, {"input_ids": ids})):
        np.testing.assert_array_equal(new, old)


def test_the_build_serves_the_widget_and_the_pinned_runtime(tmp_path: Path) -> None:
    """offline_js copies book/live_gpt/ to _static/live_gpt/ and onnxruntime-web's three files
    (from node_modules, pinned in package.json) to _static/vendor/; without them it copies the
    widget alone and names what is missing."""
    import sys

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    from offline_js import LIVE_GPT, RUNTIME, copy_live_gpt

    declared = json.loads((ROOT / "package.json").read_text())["dependencies"]
    assert declared.get("onnxruntime-web") == "1.30.0"  # exact pin, as the probe used
    src = tmp_path / "src"
    (src / "book" / "live_gpt").mkdir(parents=True)
    for name in LIVE_GPT:
        (src / "book" / "live_gpt" / name).write_text(name)
    assert copy_live_gpt(src, tmp_path / "out") == list(RUNTIME)  # no node_modules: all missing
    assert sorted(p.name for p in (tmp_path / "out" / "_static" / "live_gpt").iterdir()) == sorted(LIVE_GPT)
    for name in RUNTIME:
        (src / "node_modules" / name).parent.mkdir(parents=True, exist_ok=True)
        (src / "node_modules" / name).write_text(name)
    assert copy_live_gpt(src, tmp_path / "out") == []
    for name in RUNTIME:
        assert (tmp_path / "out" / "_static" / "vendor" / name).read_text() == name
    assert all((LIVE / name).is_file() for name in LIVE_GPT), "book/live_gpt/ lacks a file the build copies"


# --------------------------------------------------------------------------------------------
# The live page in headless Chromium, served from _build/html with every other host unresolvable
# --------------------------------------------------------------------------------------------

PAGE = "07e_live_gpt"
TYPED = "SECOND CITIZEN.\nOne word, good citizens.\n\nFIRST CITIZEN.\nWe are accounted poor"
GREEDY_CHARS = 40
SPECIAL = "<|endoftext|>ROMEO.\n"  # a special token's text is one id, as in CharTokenizer

# Appended to the body: once the widget is ready it types a prompt as a reader would (value + an
# input event), reads the bars, heatmap and lens, switches the head, runs greedy decoding and a
# top-k = 1 sample, sends two bad prompts, and writes everything into <pre id="live-gpt-report">.
DRIVER = """<script>
(function () {
  const root = document.querySelector("div.live-gpt");
  const report = {steps: []};
  const until = (name) => new Promise((resolve) => root.addEventListener(name, resolve, {once: true}));
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const q = (selector) => root.querySelector(selector);
  const type = (text) => {
    const box = q("textarea");
    box.value = text;
    box.dispatchEvent(new Event("input"));
  };
  const set = (label, value) => {
    for (const field of root.querySelectorAll("label.live-gpt-field"))
      if (field.textContent.startsWith(label)) field.querySelector("input").value = String(value);
  };
  async function drive() {
    if (root.dataset.state !== "ready") {
      const state = await Promise.race([until("live-gpt:ready").then(() => "ready"),
                                        sleep(60000).then(() => "timeout")]);
      report.steps.push("ready:" + state + ":" + root.dataset.state);
    }
    if (root.dataset.state !== "ready")
      throw new Error("widget state " + root.dataset.state + ": " + root.textContent.slice(0, 300));
    const ran = until("live-gpt:ran");
    type(__TYPED__);
    await ran;
    report.bars = [...root.querySelectorAll(".live-gpt-row")].map((row) =>
      [Number(row.dataset.id), Number(row.dataset.prob), row.querySelector(".live-gpt-prob").textContent]);
    report.cells = root.querySelectorAll(".live-gpt-heatmap rect").length;
    report.axis = [...root.querySelectorAll(".live-gpt-heatmap text")].length;
    report.lens_rows = root.querySelectorAll(".live-gpt-lens tr").length - 1;
    const before = q(".live-gpt-heatmap svg").getAttribute("aria-label");
    for (const [name, value] of [["layer", "1"], ["head", "2"]]) {
      q("select.live-gpt-" + name).value = value;
      q("select.live-gpt-" + name).dispatchEvent(new Event("change"));
    }
    report.heads = [before, q(".live-gpt-heatmap svg").getAttribute("aria-label")];
    set("characters", __CHARS__);
    let done = until("live-gpt:generated");
    q("button.live-gpt-greedy").click();
    await done;
    report.greedy = q(".live-gpt-continuation").textContent;
    set("top-k", 1); set("seed", 7); set("temperature", 1.3);
    done = until("live-gpt:generated");
    q("button.live-gpt-sample").click();
    await done;
    report.top1 = q(".live-gpt-continuation").textContent;
    set("top-k", 0); set("top-p", 0.9); set("temperature", 0.8); set("seed", 0);
    done = until("live-gpt:generated");
    q("button.live-gpt-sample").click();
    await done;
    report.sampled = q(".live-gpt-continuation").textContent;
    const special = until("live-gpt:ran");
    type(__SPECIAL__);
    await special;
    report.special_bars = [...root.querySelectorAll(".live-gpt-row")].map((row) =>
      [Number(row.dataset.id), Number(row.dataset.prob)]);
    type("h\\u00e9llo \\ud83d\\ude00"); await sleep(1000);
    report.bad_message = q(".live-gpt-message").textContent;
    report.bad_state = root.dataset.state;
    type(""); await sleep(1000);
    report.empty_message = q(".live-gpt-message").textContent;
    report.filters = __FILTERS__.map(([logits, t, k, p]) =>
      root.liveGPT.filtered(logits, t, k, p).map((x) => x === -Infinity ? null : x));
    report.timings = root.dataset.timings;
  }
  drive().catch((e) => { report.failure = String(e && e.message || e); }).finally(() => {
    const pre = document.createElement("pre");
    pre.id = "live-gpt-report";
    pre.textContent = JSON.stringify(report);
    document.body.appendChild(pre);
  });
})();
</script>"""
# (logits, temperature, top-k (0: off), top-p) for the page's filter; equal to generation.py's.
FILTER_CASES = [(np.random.default_rng(seed).normal(0, 2, 89).round(3).tolist(), t, k, p)
                for seed, (t, k, p) in enumerate([(0.7, 5, 1.0), (1.3, 0, 0.8), (1.0, 20, 0.5), (0.5, 1, 0.9)])]
FILTER_CASES.append(([1.0, 2.0, 2.0, 0.5, 2.0], 1.0, 2, 1.0))  # ties with the k-th are kept
DRIVER = (DRIVER.replace("__TYPED__", json.dumps(TYPED))
          .replace("__SPECIAL__", json.dumps(SPECIAL)).replace("__CHARS__", str(GREEDY_CHARS))
          .replace("__FILTERS__", json.dumps(FILTER_CASES)))


@pytest.fixture(scope="module")
def live_server():
    """_build/html on 127.0.0.1 through test_built_book's recording handler, whose "?probe" pages
    carry its console and error probe in <head>; the live page also gets the driver above."""
    import functools
    import http.server
    import threading

    from test_built_book import HTML, PROBE, RecordingHandler

    if not (HTML / "book" / f"{PAGE}.html").exists():
        pytest.fail("no built live page in _build/html: run `make book` first")

    class Handler(RecordingHandler):
        requests: list[tuple] = []

        def do_GET(self) -> None:
            if self.path != f"/book/{PAGE}.html?probe":
                return super().do_GET()
            page = (HTML / "book" / f"{PAGE}.html").read_text(encoding="utf-8")
            page = page.replace("<head>", "<head>" + PROBE, 1).replace("</body>", DRIVER + "</body>", 1)
            body = page.encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(HTML)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", Handler.requests
    httpd.shutdown()


@pytest.mark.book
def test_live_page_runs_the_model_offline(gpt, live_server) -> None:
    """Typed prompt -> the page's bars equal PyTorch's probabilities (1e-4), the heatmap and the
    lens render, greedy and top-k = 1 give model.generate's characters, bad prompts get a message,
    no console error, and every request (runtime, .wasm, model) was served by the book itself."""
    import html
    import re

    from test_built_book import rendered

    base, log = live_server
    dom, probe, console = rendered(f"{base}/book/{PAGE}.html?probe")
    assert not probe["problems"] and not console, \
        f"errors on the live page: {probe['problems'][:3]} {console[:3]}"
    found = re.search(r'<pre id="live-gpt-report">(.*?)</pre>', dom, re.S)
    assert found, "the driver wrote no report: the page's scripts did not finish"
    report = json.loads(html.unescape(found.group(1)))
    assert "failure" not in report, f"the live page failed: {report['failure']} ({report['steps']})"

    model, tokenizer = gpt
    ids = torch.tensor([tokenizer.encode(TYPED)])
    with torch.no_grad():
        probs = model(ids).logits[0, -1].softmax(-1)
    top = probs.topk(10)
    shown_ids = [row[0] for row in report["bars"]]
    assert shown_ids == top.indices.tolist(), "the page's top 10 differ from PyTorch's"
    np.testing.assert_allclose([row[1] for row in report["bars"]], top.values.numpy(), atol=1e-4, rtol=0)
    shown = [float(row[2].removesuffix(" %")) for row in report["bars"]]  # two decimals, in %
    np.testing.assert_allclose(shown, 100 * top.values.numpy(), atol=0.005 + 1e-3, rtol=0)

    with torch.no_grad():
        special = model(torch.tensor([tokenizer.encode(SPECIAL)])).logits[0, -1].softmax(-1).topk(10)
    assert [row[0] for row in report["special_bars"]] == special.indices.tolist()
    np.testing.assert_allclose([row[1] for row in report["special_bars"]], special.values.numpy(), atol=1e-4, rtol=0)

    t = ids.shape[1]
    window = min(t, 24)  # live_gpt.js: WINDOW
    earlier = int(t > window)  # a first column holding the weight on the characters before it
    assert report["cells"] == window * (window + 1) // 2 + earlier * window  # the causal triangle
    assert report["axis"] == 2 * window + earlier
    assert report["heads"] == ["attention weights, layer 1, head 1", "attention weights, layer 2, head 3"]
    assert report["lens_rows"] == model.config.n_layer

    greedy = model.generate(ids, max_new_tokens=GREEDY_CHARS)
    expected = tokenizer.decode(greedy[0, t:].tolist())
    assert report["greedy"] == expected, "the page's greedy continuation differs from model.generate"
    assert report["top1"] == expected, "top-k = 1 sampling is not greedy on the page"
    assert len(report["sampled"]) == GREEDY_CHARS and set(report["sampled"]) <= set(tokenizer.chars)
    for (logits, temperature, top_k, top_p), page in zip(FILTER_CASES, report["filters"], strict=True):
        ref = generation.apply_temperature(torch.tensor(logits, dtype=torch.float64), temperature)
        if top_k:
            ref = generation.top_k_filter(ref, top_k)
        ref = generation.top_p_filter(ref, top_p)
        kept = [x is not None for x in page]
        assert kept == torch.isfinite(ref).tolist(), f"the page filters differently: {temperature, top_k, top_p}"
        np.testing.assert_allclose([x for x in page if x is not None], ref[torch.isfinite(ref)].numpy(), rtol=1e-12)
    assert "\u00e9" in report["bad_message"] and "never seen" in report["bad_message"]
    assert report["bad_state"] == "invalid"
    assert "Type a prompt" in report["empty_message"]

    failed = [(path, code) for path, code, *_ in log if code >= 400 and path != "/favicon.ico"]
    assert not failed, f"requests failed on the local server: {failed[:5]}"
    served = json.dumps(log)
    for name in ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm",
                 "shakespeare_gpt.onnx", "shakespeare_gpt.json", "live_gpt.js"):
        assert name in served, f"{name} was not loaded from the book's own _static"


@pytest.mark.book
def test_live_page_opened_as_a_file_says_how_to_serve_it() -> None:
    """Opened as file://, the runtime's module glue cannot load: the widget says so in words and
    gives the one command that serves the book, instead of failing silently."""
    import shutil
    import subprocess
    import tempfile

    from test_built_book import HTML

    page = HTML / "book" / f"{PAGE}.html"
    if not page.exists():
        pytest.fail("no built live page in _build/html: run `make book` first")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.fail("headless Chromium not found: `make browser-check` installs Debian's chromium")
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", f"--user-data-dir={profile}",
             "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=5000", "--dump-dom",
             page.as_uri()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'data-state="file"' in result.stdout, "the widget did not notice it was opened as a file"
    assert "python -m http.server -d _build/html" in result.stdout
