/* The book's Shakespeare GPT, live in the page (book/text/07e_live_gpt.md).
 *
 * The model is book/live_gpt/shakespeare_gpt.onnx (scripts/export_live_gpt.py), run by
 * onnxruntime-web's single-threaded WebAssembly build, which the built book serves itself from
 * _static/vendor/onnxruntime-web (book/_ext/offline_js.py): nothing is fetched from another host.
 * Every <div class="live-gpt"> on the page becomes one widget. Sampling follows
 * lecture_pkg.generation: logits / temperature, then top-k (ties with the k-th kept), then top-p
 * (the smallest most-probable set whose mass reaches p), then a draw from the softmax.
 */
(function () {
  "use strict";
  const SCRIPT = document.currentScript && document.currentScript.src;
  const HERE = SCRIPT ? new URL(".", SCRIPT).href : "../_static/live_gpt/";
  const RUNTIME = new URL("../vendor/onnxruntime-web/dist/", HERE).href;
  const TOP = 10;         // bars in the next-character chart
  const WINDOW = 24;      // characters shown on each axis of the attention heatmap
  const SERVE = "python -m http.server -d _build/html";

  // ---------------------------------------------------------------- loading the runtime once
  let runtime = null;
  function loadRuntime() {
    if (runtime) return runtime;
    runtime = new Promise((resolve, reject) => {
      if (window.ort) return resolve(window.ort);
      const tag = document.createElement("script");
      tag.src = RUNTIME + "ort.wasm.min.js";
      tag.onload = () => resolve(window.ort);
      tag.onerror = () => reject(new Error(
        "The WebAssembly runtime (onnxruntime-web) is not part of this build: build the book " +
        "after `npm ci`, which fills node_modules/ with it."));
      document.head.appendChild(tag);
    }).then((ort) => {
      ort.env.wasm.wasmPaths = RUNTIME;  // the vendored .mjs glue and .wasm, not a CDN
      ort.env.wasm.numThreads = 1;       // threads need cross-origin isolation, which a plain server lacks
      ort.env.logLevel = "error";
      return ort;
    });
    return runtime;
  }

  // ---------------------------------------------------------------- sampling (generation.py)
  function softmax(logits) {
    let max = -Infinity;
    for (const x of logits) if (x > max) max = x;
    const e = Array.from(logits, (x) => Math.exp(x - max));
    const sum = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / sum);
  }
  function argmax(values) {
    let best = 0;
    for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
    return best;
  }
  function filtered(logits, temperature, topK, topP) {
    let z = Array.from(logits, (x) => x / temperature);
    if (topK) {
      const kth = z.slice().sort((a, b) => b - a)[Math.min(topK, z.length) - 1];
      z = z.map((x) => (x < kth ? -Infinity : x));
    }
    if (topP < 1) {
      const order = z.map((_, i) => i).sort((a, b) => z[b] - z[a]);
      const p = softmax(order.map((i) => z[i]));
      let before = 0;
      const out = z.slice();
      order.forEach((i, rank) => {
        if (before >= topP) out[i] = -Infinity;  // the set reached top_p without this token
        before += p[rank];
      });
      z = out;
    }
    return z;
  }
  function mulberry32(seed) {  // a small seeded generator (not torch's: the draws differ from Python's)
    let a = seed >>> 0;
    return function () {
      a = (a + 0x6D2B79F5) >>> 0;
      let t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }
  function draw(probs, random) {
    let u = random(), last = 0;
    for (let i = 0; i < probs.length; i++) {
      if (probs[i] <= 0) continue;
      last = i;
      u -= probs[i];
      if (u < 0) return i;
    }
    return last;
  }

  // ---------------------------------------------------------------- small DOM helpers
  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, v);
    }
    for (const child of children || []) node.appendChild(child);
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }
  function shown(ch) {  // a character as a label: newline and space made visible
    return ch === "\n" ? "\u23CE" : ch === " " ? "\u2423" : ch;
  }
  function field(label, input) {
    return el("label", { class: "live-gpt-field" }, [el("span", { text: label }), input]);
  }

  // ---------------------------------------------------------------- one widget
  async function mount(root) {
    const status = el("p", { class: "live-gpt-status", role: "status", text: "Loading the model\u2026" });
    root.textContent = "";  // the placeholder Jupyter shows, where this script does not run
    root.appendChild(status);
    root.dataset.state = "loading";
    if (location.protocol === "file:") {
      status.className = "live-gpt-status live-gpt-problem";
      status.textContent = "This page was opened as a file, and browsers do not let a file load " +
        "the WebAssembly runtime the model runs on. Serve the book instead: from the repository, " +
        `run \`${SERVE}\` and open http://localhost:8000/book/07e_live_gpt.html.`;
      root.dataset.state = "file";
      return;
    }
    let ort, meta, session, timings = {};
    try {
      const started = performance.now();
      ort = await loadRuntime();
      const base = root.dataset.model || new URL("shakespeare_gpt", HERE).href;
      const response = await fetch(base + ".json");
      if (!response.ok) throw new Error(`could not read ${base}.json (HTTP ${response.status})`);
      meta = await response.json();
      session = await ort.InferenceSession.create(base + ".onnx", { executionProviders: ["wasm"] });
      timings.load_ms = performance.now() - started;
    } catch (error) {
      status.className = "live-gpt-status live-gpt-problem";
      status.textContent = `The model could not be loaded: ${error.message}`;
      root.dataset.state = "failed";
      return;
    }
    const vocab = meta.chars.concat(meta.special_tokens);
    const stoi = new Map(meta.chars.map((c, i) => [c, i]));

    // controls
    const prompt = el("textarea", { class: "live-gpt-prompt", rows: "3", spellcheck: "false",
                                    "aria-label": "prompt" });
    prompt.value = root.dataset.prompt || "ROMEO:\nBut soft, what light through yonder window breaks";
    const temperature = el("input", { type: "number", min: "0.05", max: "5", step: "0.05", value: "0.8" });
    const topK = el("input", { type: "number", min: "0", max: String(vocab.length), step: "1", value: "0" });
    const topP = el("input", { type: "number", min: "0.01", max: "1", step: "0.01", value: "1" });
    const seed = el("input", { type: "number", min: "0", step: "1", value: "0" });
    const length = el("input", { type: "number", min: "1", max: "400", step: "1", value: "120" });
    const greedyButton = el("button", { type: "button", class: "live-gpt-greedy", text: "Greedy" });
    const sampleButton = el("button", { type: "button", class: "live-gpt-sample", text: "Sample" });
    const layer = el("select", { class: "live-gpt-layer", "aria-label": "layer" });
    const head = el("select", { class: "live-gpt-head", "aria-label": "head" });
    for (let i = 0; i < meta.n_layer; i++) layer.appendChild(el("option", { value: String(i), text: `layer ${i + 1}` }));
    for (let i = 0; i < meta.n_head; i++) head.appendChild(el("option", { value: String(i), text: `head ${i + 1}` }));

    const message = el("p", { class: "live-gpt-message", role: "alert" });
    const bars = el("div", { class: "live-gpt-bars" });
    const continuation = el("pre", { class: "live-gpt-continuation" });
    const heatmap = el("div", { class: "live-gpt-heatmap" });
    const lens = el("table", { class: "live-gpt-lens" });
    root.appendChild(el("div", { class: "live-gpt-grid" }, [
      el("div", { class: "live-gpt-panel" }, [
        field("Prompt", prompt), message,
        el("h4", { text: "Next character" }), bars,
      ]),
      el("div", { class: "live-gpt-panel" }, [
        el("h4", { text: "Continue the prompt" }),
        el("div", { class: "live-gpt-controls" }, [
          field("temperature", temperature), field("top-k (0: off)", topK), field("top-p", topP),
          field("seed", seed), field("characters", length),
        ]),
        el("div", { class: "live-gpt-buttons" }, [greedyButton, sampleButton]), continuation,
        el("h4", { text: "Logit lens: each layer's guess" }), lens,
      ]),
      el("div", { class: "live-gpt-panel live-gpt-wide" }, [
        el("h4", { text: "Attention of one head" }),
        el("div", { class: "live-gpt-controls" }, [layer, head]), heatmap,
      ]),
    ]));

    function encode(text) {
      if (!text.length) throw new RangeError("Type a prompt: the model needs at least one character to continue.");
      const plain = meta.special_tokens.reduce((t, s) => t.split(s).join(""), text);
      const unknown = [...new Set([...plain].filter((c) => !stoi.has(c)))];
      if (unknown.length) {
        throw new RangeError(`The model has never seen ${unknown.map((c) => JSON.stringify(c)).join(", ")}: ` +
          "its vocabulary is the characters of the Shakespeare corpus (letters, digits, punctuation, " +
          "space and newline). Remove or replace them.");
      }
      const ids = [];  // as CharTokenizer.encode: a special token's text becomes its one id
      const specials = meta.special_tokens.map((s, i) => [s, meta.chars.length + i])
        .sort((a, b) => b[0].length - a[0].length);
      for (let i = 0; i < text.length;) {
        const special = specials.find(([s]) => text.startsWith(s, i));
        if (special) { ids.push(special[1]); i += special[0].length; continue; }
        const c = String.fromCodePoint(text.codePointAt(i));
        ids.push(stoi.get(c));
        i += c.length;
      }
      return ids.slice(-meta.n_positions);
    }
    async function forward(ids) {
      const input = new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, ids.length]);
      return session.run({ input_ids: input });
    }
    const lastRow = (logits, t) => logits.data.subarray((t - 1) * vocab.length, t * vocab.length);

    let current = null;  // {ids, logits, attentions, lens}
    function drawBars(probs) {
      bars.textContent = "";
      const order = probs.map((_, i) => i).sort((a, b) => probs[b] - probs[a]).slice(0, TOP);
      for (const i of order) {
        const bar = el("span", { class: "live-gpt-bar" });
        bar.style.width = `${(100 * probs[i]).toFixed(2)}%`;
        bars.appendChild(el("div", { class: "live-gpt-row", "data-id": String(i), "data-prob": String(probs[i]) }, [
          el("code", { class: "live-gpt-char", text: shown(vocab[i]) }),
          el("span", { class: "live-gpt-track" }, [bar]),
          el("span", { class: "live-gpt-prob", text: `${(100 * probs[i]).toFixed(2)} %` }),
        ]));
      }
    }
    function drawHeatmap() {
      heatmap.textContent = "";
      if (!current) return;
      const t = current.ids.length, L = Number(layer.value), H = Number(head.value);
      // the last WINDOW characters; when the prompt is longer, a first column "…" holds each
      // row's weight on all the earlier characters, so every drawn row still sums to 1
      const from = Math.max(0, t - WINDOW), n = t - from, extra = from ? 1 : 0;
      const cell = 18, pad = 22, width = pad + (n + extra) * cell, height = pad + n * cell;
      const box = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
                               "aria-label": `attention weights, layer ${L + 1}, head ${H + 1}` });
      const data = current.attentions.data, base = (L * meta.n_head + H) * t * t;
      const square = (x, y, w, text) => {
        const rect = svg("rect", { x, y, width: cell - 1, height: cell - 1, class: "live-gpt-cell",
                                   "fill-opacity": Math.max(0.03, w).toFixed(3) });
        const tip = svg("title");
        tip.textContent = `${text}: ${w.toFixed(3)}`;
        rect.appendChild(tip);
        box.appendChild(rect);
      };
      const axis = (x, y, anchor, text) => {
        const label = svg("text", { x, y, "text-anchor": anchor, class: "live-gpt-axis" });
        label.textContent = text;
        box.appendChild(label);
      };
      for (let q = from; q < t; q++) {
        const y = pad + (q - from) * cell, query = shown(vocab[current.ids[q]]);
        axis(pad - 4, y + cell - 5, "end", query);
        if (extra) {
          let earlier = 0;
          for (let k = 0; k < from; k++) earlier += data[base + q * t + k];
          square(pad, y, earlier, `${query} → the ${from} earlier characters`);
        }
        for (let k = from; k <= q; k++) {
          square(pad + (k - from + extra) * cell, y, data[base + q * t + k],
                 `${query} → ${shown(vocab[current.ids[k]])}`);
        }
      }
      if (extra) axis(pad + cell / 2, pad - 6, "middle", "…");
      for (let k = from; k < t; k++) {
        axis(pad + (k - from + extra) * cell + cell / 2, pad - 6, "middle", shown(vocab[current.ids[k]]));
      }
      heatmap.appendChild(box);
      heatmap.appendChild(el("p", { class: "live-gpt-note", text: from ?
        `The last ${n} of ${t} characters; the first column (…) is each row's weight on the ` +
        `${from} earlier ones. Rows are queries, columns the keys each attends to (darker: more weight).` :
        "Rows are queries, columns the keys each attends to (darker: more weight)." }));
    }
    function drawLens() {
      lens.textContent = "";
      lens.appendChild(el("tr", {}, [el("th", { text: "after" }), el("th", { text: "top guesses" })]));
      for (let L = 0; L < meta.n_layer; L++) {
        const probs = softmax(current.lens.data.subarray(L * vocab.length, (L + 1) * vocab.length));
        const order = probs.map((_, i) => i).sort((a, b) => probs[b] - probs[a]).slice(0, 3);
        lens.appendChild(el("tr", {}, [
          el("td", { text: `layer ${L + 1}` }),
          el("td", { text: order.map((i) => `${shown(vocab[i])} ${(100 * probs[i]).toFixed(0)}%`).join("   ") }),
        ]));
      }
    }

    let pending = Promise.resolve();
    async function analyse() {
      let ids;
      try {
        ids = encode(prompt.value);
      } catch (error) {
        message.textContent = error.message;
        root.dataset.state = "invalid";
        return;
      }
      message.textContent = prompt.value.length > meta.n_positions ?
        `The model reads at most ${meta.n_positions} characters: only the last ${meta.n_positions} are used.` : "";
      const started = performance.now();
      const out = await forward(ids);
      timings.forward_ms = performance.now() - started;
      timings.t = ids.length;
      current = { ids, logits: out.logits, attentions: out.attentions, lens: out.lens };
      drawBars(softmax(lastRow(out.logits, ids.length)));
      drawHeatmap();
      drawLens();
      root.dataset.timings = JSON.stringify(timings);
      root.dataset.state = "ran";
      root.dispatchEvent(new CustomEvent("live-gpt:ran", { bubbles: true }));
    }
    async function generate(greedy) {
      let ids;
      try {
        ids = encode(prompt.value);
      } catch (error) {
        message.textContent = error.message;
        return;
      }
      const T = Number(temperature.value), K = Math.round(Number(topK.value)), P = Number(topP.value);
      const N = Math.round(Number(length.value)), S = Math.round(Number(seed.value));
      const problems = [];
      if (!greedy && !(T > 0 && Number.isFinite(T))) problems.push("temperature must be a number above 0");
      if (!greedy && !(K >= 0 && Number.isInteger(K))) problems.push("top-k must be a whole number, 0 for off");
      if (!greedy && !(P > 0 && P <= 1)) problems.push("top-p must be in (0, 1]");
      if (!(N >= 1 && N <= 400)) problems.push("characters must be between 1 and 400");
      if (!greedy && !(S >= 0)) problems.push("seed must be a whole number \u2265 0");
      if (problems.length) {
        message.textContent = problems.join("; ") + ".";
        return;
      }
      message.textContent = "";
      greedyButton.disabled = sampleButton.disabled = true;
      const random = mulberry32(S);
      const context = ids.slice();
      let text = "";
      continuation.textContent = "";
      const started = performance.now();
      try {
        for (let step = 0; step < N; step++) {
          const visible = context.slice(-meta.n_positions);
          const out = await forward(visible);
          const logits = lastRow(out.logits, visible.length);
          const next = greedy ? argmax(logits) : draw(softmax(filtered(logits, T, K, P)), random);
          context.push(next);
          text += vocab[next];
          continuation.textContent = text;
        }
      } finally {
        greedyButton.disabled = sampleButton.disabled = false;
      }
      timings.per_character_ms = (performance.now() - started) / N;
      root.dataset.timings = JSON.stringify(timings);
      continuation.dataset.mode = greedy ? "greedy" : "sample";
      root.dispatchEvent(new CustomEvent("live-gpt:generated", { bubbles: true }));
    }
    const queue = (job) => { pending = pending.then(job).catch((error) => {
      message.textContent = `Something went wrong: ${error.message}`;
    }); return pending; };
    let timer = null;
    prompt.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => queue(analyse), 150);
    });
    layer.addEventListener("change", drawHeatmap);
    head.addEventListener("change", drawHeatmap);
    greedyButton.addEventListener("click", () => queue(() => generate(true)));
    sampleButton.addEventListener("click", () => queue(() => generate(false)));
    root.liveGPT = { analyse: () => queue(analyse), generate: (greedy) => queue(() => generate(greedy)),
                     filtered, softmax };
    status.textContent = `The model is running in this page (${vocab.length} characters, ` +
      `${meta.n_layer} layers \u00d7 ${meta.n_head} heads, context ${meta.n_positions}).`;
    await queue(analyse);
    root.dataset.state = root.dataset.state === "ran" ? "ready" : root.dataset.state;
    root.dispatchEvent(new CustomEvent("live-gpt:ready", { bubbles: true }));
  }

  function start() {
    for (const root of document.querySelectorAll("div.live-gpt")) {
      if (!root.dataset.state) mount(root);
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
