/* The reader's view in the browser (book/_ext/reader_view.py). Loaded after MathJax 3's
   configuration and before the page's widgets render. */

/* The jupyter-widgets HTML manager typesets widget labels with MathJax 2's MathJax.Hub.Queue; the
   book loads MathJax 3, where that call throws "Cannot read properties of undefined (reading
   'Queue')". This gives it MathJax 3's equivalent. */
(() => {
  const typeset = (job) => {
    const el = Array.isArray(job) ? job[2] : undefined;
    const mj = window.MathJax;
    const run = () => (mj.typesetPromise ? mj.typesetPromise(el ? [el] : undefined) : undefined);
    const ready = mj.startup && mj.startup.promise ? mj.startup.promise : Promise.resolve();
    ready.then(run).catch(() => {});
  };
  // Only once MathJax 3 itself has loaded (it is deferred, so before DOMContentLoaded): a Hub in
  // its configuration object would stop it from typesetting the page.
  const install = () => {
    const mj = window.MathJax;
    if (mj && mj.version && !mj.Hub) mj.Hub = { Queue: typeset };
  };
  document.addEventListener("DOMContentLoaded", install);
})();

/* Search results quote the page around the match; its math is raw LaTeX there (MathJax does not
   run on the fetched page). Each formula is shown as plain text instead: \(\sqrt{d_k}\) -> √d_k. */
const readerViewPlainMath = (() => {
  const symbols = {
    alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε", theta: "θ",
    lambda: "λ", mu: "μ", pi: "π", rho: "ρ", sigma: "σ", tau: "τ", phi: "φ", omega: "ω",
    Delta: "Δ", Sigma: "Σ", Omega: "Ω", sum: "Σ", prod: "∏", sqrt: "√", cdot: "·", times: "×",
    to: "→", rightarrow: "→", leftarrow: "←", le: "≤", leq: "≤", ge: "≥", geq: "≥", ne: "≠",
    neq: "≠", approx: "≈", infty: "∞", in: "∈", top: "ᵀ", partial: "∂", nabla: "∇", mid: "|",
    ldots: "…", dots: "…", cdots: "⋯", log: "log", exp: "exp", max: "max", min: "min",
  };
  return (tex) => tex
    .replace(/\\(?:operatorname|mathrm|mathbf|mathit|text|textrm|mathcal|boldsymbol)\s*\{([^{}]*)\}/g, "$1")
    .replace(/\\sqrt\s*\{([^{}]*)\}/g, "√$1")
    .replace(/\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}/g, "($1)/($2)")
    .replace(/\\([A-Za-z]+)/g, (m, name) => (name in symbols ? symbols[name] : name))
    .replace(/\\[,;:! ]/g, " ")
    .replace(/\\([{}|%$_])/g, "$1")
    .replace(/[{}]/g, "")
    .replace(/\^ᵀ/g, "ᵀ")
    .replace(/\s+/g, " ")
    .trim();
})();

(() => {
  const patch = () => {
    if (typeof Search === "undefined" || Search.readerViewPatched) return;
    const htmlToText = Search.htmlToText;
    Search.htmlToText = (htmlString, anchor) => {
      const doc = new DOMParser().parseFromString(htmlString, "text/html");
      for (const el of doc.querySelectorAll("span.math, div.math")) {
        const tex = el.textContent.replace(/^\s*(\\\(|\\\[|\$\$?)|(\\\)|\\\]|\$\$?)\s*$/g, "");
        el.textContent = " " + readerViewPlainMath(tex) + " ";
      }
      return htmlToText(doc.documentElement.outerHTML, anchor);
    };
    Search.readerViewPatched = true;
  };
  patch();
  document.addEventListener("DOMContentLoaded", patch);
})();

/* bertviz's model view draws every head as a thumbnail in an SVG of fixed width (970 px for 12
   heads), wider than the text column. Each view's SVG (drawn again whenever the reader picks
   another attention or layer) gets a viewBox, so that it scales down to the column instead of
   scrolling sideways. */
(() => {
  const fit = () => {
    for (const svg of document.querySelectorAll('div[id^="bertviz-"] svg')) {
      const w = parseFloat(svg.getAttribute("width")), h = parseFloat(svg.getAttribute("height"));
      if (!(w > 0 && h > 0)) continue;
      if (svg.getAttribute("viewBox") !== `0 0 ${w} ${h}`) svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
      svg.style.maxWidth = "100%";
      svg.style.height = "auto";
    }
  };
  document.addEventListener("DOMContentLoaded", () => {
    if (!document.querySelector('div[id^="bertviz-"]')) return;
    new MutationObserver(fit).observe(document.body, { childList: true, subtree: true });
    fit();
  });
})();

/* require.js gives up on a module that takes more than 7 s to load ("Load timeout for modules:
   vega,vega-lite") and the chart stays blank; on a busy machine vega's 1 MB can take that long. A
   missing file still fails at once (the script's error event), so no time limit is needed. */
(() => {
  // require.js comes before this file on widget pages and after it (end of <head>) on bertviz
  // pages; its time limit is checked as modules load, so setting it by DOMContentLoaded is in time.
  const noTimeout = () => {
    if (typeof window.require === "function" && window.require.config) window.require.config({ waitSeconds: 0 });
  };
  noTimeout();
  document.addEventListener("DOMContentLoaded", noTimeout);
})();
