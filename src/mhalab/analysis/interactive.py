"""An interactive view of every head, CircuitsVis-style, as one self-contained HTML page (inline script and data:
no server, no network).

Hover a token (a query) to colour the text by where the chosen head looks from it and to see, beside it, where
every head of the layer looks; click a head (or use the layer buttons) to choose it; each head's statistics sit
beside its map. Written at the end of a run (<run_dir>/plots/attention.html) and by `mhalab plots --html`.
Opened with `#selftest` appended to its address, the page hovers a token itself and records in
`<body data-selftest=...>` whether the drawing changed (the headless-browser test reads it).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

MAX_TOKENS = 64  # tokens on the page: L x H x T^2 weights are inlined (2 x 4 x 64^2 ~ 100 kB)


def page_data(weights_per_layer, tokens, stats: dict | None = None, n_kv_heads: int | None = None,
              max_tokens: int = MAX_TOKENS) -> dict:
    """The page's inline data: tokens, weights per layer and head in thousandths ((T, T) lists of ints), the
    head statistics {stat: (L, H) lists} and the model's shape."""
    n = min(len(tokens), max_tokens)
    layers = []
    for w in weights_per_layer:  # (H, T, T)
        w = w.detach().float().cpu()[:, :n, :n]  # (H, n, n)
        layers.append((w * 1000).round().int().tolist())
    n_heads = len(layers[0]) if layers else 0
    return {"tokens": [str(t) for t in tokens[:n]], "weights": layers, "n_heads": n_heads,
            "n_kv_heads": n_kv_heads or n_heads,
            "stats": {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in (stats or {}).items()}}


def write_attention_page(path, weights_per_layer, tokens, stats: dict | None = None, title: str = "attention",
                         n_kv_heads: int | None = None, max_tokens: int = MAX_TOKENS) -> Path:
    """Write the page for one example: weights_per_layer n_layers x (H, T, T), its T tokens, the heads'
    statistics {stat: (n_layers, n_heads)}; returns the path."""
    data = page_data(weights_per_layer, tokens, stats, n_kv_heads, max_tokens)
    inline = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")  # nothing can close the script early
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PAGE.replace("__TITLE__", html.escape(title)).replace("__DATA__", inline), encoding="utf-8")
    return path


PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; margin: 0 0 8px; }
.bar button { margin: 0 4px 4px 0; padding: 2px 8px; border: 1px solid #888; background: #f4f4f4; cursor: pointer; }
.bar button.on { background: #1f77b4; color: white; border-color: #1f77b4; }
.bar .group { display: inline-block; margin-right: 10px; }
.bar .glabel { font-size: 11px; color: #666; }
#text { line-height: 1.9; font-family: ui-monospace, monospace; margin: 10px 0; max-width: 1100px; }
#text span { padding: 1px 1px; border: 1px solid transparent; cursor: default; white-space: pre; }
#text span.q { border-color: #d62728; }
.row { display: flex; gap: 24px; align-items: flex-start; flex-wrap: wrap; }
table { border-collapse: collapse; font-size: 12px; }
td, th { padding: 1px 6px; text-align: right; }
#heads td.strip { padding: 0; }
#heads canvas { display: block; cursor: pointer; }
#heads tr.on th { color: #1f77b4; }
.note { color: #666; font-size: 12px; max-width: 1100px; }
</style></head>
<body>
<h1>__TITLE__</h1>
<div class="note">Hover a token: the text is coloured by where the chosen head looks from it (each query's weights
divided by its largest; the weight on hover), and the strips show where every head of the layer looks from it.
Click a strip or a button to choose a head. The map is coloured the same way: each row over its largest weight.
</div>
<div class="bar" id="layers"></div>
<div class="bar" id="headbar"></div>
<div id="text"></div>
<div class="row">
  <div><b id="striptitle"></b><table id="heads"></table></div>
  <div><b id="maptitle"></b><br><canvas id="map" width="384" height="384"></canvas></div>
  <div><b>statistics of <span id="stathead"></span></b><table id="stats"></table></div>
</div>
<script>
"use strict";
const D = __DATA__;
const T = D.tokens.length, H = D.n_heads, L = D.weights.length, G = D.n_kv_heads;
const state = {layer: 0, head: 0, query: T - 1};
const $ = (id) => document.getElementById(id);
const w = (l, h, q, k) => D.weights[l][h][q][k] / 1000;
const show = (t) => t.replace(/ /g, "\u2423").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5");
function blue(x) {  // x in [0, 1] -> white to blue
  x = Math.max(0, Math.min(1, x));
  const c = (a, b) => Math.round(a + (b - a) * x);
  return "rgb(" + c(255, 31) + "," + c(255, 119) + "," + c(255, 180) + ")";
}
function rowMax(l, h, q) { let m = 1e-6; for (let k = 0; k < T; k++) m = Math.max(m, w(l, h, q, k)); return m; }
const group = (h) => Math.floor(h / (H / G));

function buttons() {
  $("layers").innerHTML = "";
  for (let l = 0; l < L; l++) {
    const b = document.createElement("button");
    b.textContent = "layer " + l; b.className = l === state.layer ? "on" : "";
    b.onclick = () => { state.layer = l; draw(); };
    $("layers").appendChild(b);
  }
  $("headbar").innerHTML = "";
  for (let g = 0; g < G; g++) {
    const box = document.createElement("span"); box.className = "group";
    if (G < H) box.innerHTML = '<span class="glabel">KV head ' + g + ": </span>";
    for (let h = 0; h < H; h++) {
      if (group(h) !== g) continue;
      const b = document.createElement("button");
      b.textContent = "L" + state.layer + "H" + h; b.className = h === state.head ? "on" : "";
      b.onclick = () => { state.head = h; draw(); };
      box.appendChild(b);
    }
    $("headbar").appendChild(box);
  }
}

function text() {
  const box = $("text");
  if (!box.childElementCount) {
    D.tokens.forEach((t, i) => {
      const s = document.createElement("span");
      s.textContent = show(t); s.dataset.i = i;
      s.addEventListener("mouseover", () => { state.query = i; drawQuery(); });
      box.appendChild(s);
    });
  }
  const l = state.layer, h = state.head, q = state.query, m = rowMax(l, h, q);
  Array.from(box.children).forEach((s, k) => {
    s.style.background = blue(w(l, h, q, k) / m);
    s.className = k === q ? "q" : "";
    s.title = "L" + l + "H" + h + ": query " + q + " -> key " + k + ": weight " + w(l, h, q, k).toFixed(3);
  });
}

function strips() {
  const l = state.layer, q = state.query, cell = Math.max(4, Math.min(14, Math.floor(640 / T)));
  $("striptitle").textContent = "where every head of layer " + l + " looks from token " + q + " (" +
    show(D.tokens[q]) + "), keys left to right";
  const table = $("heads"); table.innerHTML = "";
  for (let h = 0; h < H; h++) {
    const tr = document.createElement("tr"); tr.className = h === state.head ? "on" : "";
    tr.innerHTML = "<th>L" + l + "H" + h + (G < H ? " kv" + group(h) : "") + '</th><td class="strip"></td>';
    const c = document.createElement("canvas"); c.width = cell * T; c.height = 12;
    const ctx = c.getContext("2d"), m = rowMax(l, h, q);
    for (let k = 0; k < T; k++) { ctx.fillStyle = blue(w(l, h, q, k) / m); ctx.fillRect(k * cell, 0, cell, 12); }
    c.onclick = () => { state.head = h; draw(); };
    tr.children[1].appendChild(c); table.appendChild(tr);
  }
}

function map() {
  const l = state.layer, h = state.head, c = $("map"), ctx = c.getContext("2d"), s = c.width / T;
  $("maptitle").textContent = "L" + l + "H" + h + " (rows: queries, columns: keys; each row over its largest)";
  for (let q = 0; q < T; q++) {
    const m = rowMax(l, h, q);
    for (let k = 0; k < T; k++) {
      ctx.fillStyle = blue(w(l, h, q, k) / m); ctx.fillRect(k * s, q * s, Math.ceil(s), Math.ceil(s));
    }
  }
  ctx.strokeStyle = "#d62728"; ctx.lineWidth = 2; ctx.strokeRect(1, state.query * s, c.width - 2, s);
}

function stats() {
  const l = state.layer, h = state.head;
  $("stathead").textContent = "L" + l + "H" + h + (G < H ? " (KV head " + group(h) + ")" : "");
  $("stats").innerHTML = Object.keys(D.stats).map((k) => {
    const v = D.stats[k][l][h];
    return "<tr><th>" + k + "</th><td>" + (typeof v === "number" ? v.toPrecision(3) : "-") + "</td></tr>";
  }).join("") || "<tr><td>none recorded</td></tr>";
}

function drawQuery() { text(); strips(); map(); }
function draw() { buttons(); drawQuery(); stats(); }
draw();

if (location.hash === "#selftest") {  // hover a token as a user would; record whether the drawing changed
  const look = () => Array.from($("text").children).map((s) => s.style.background).join("|") +
    $("map").toDataURL() + Array.from($("heads").querySelectorAll("canvas")).map((c) => c.toDataURL()).join("");
  const before = look(), target = $("text").children[Math.floor(T / 2)];
  target.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
  const after = look();
  document.body.dataset.selftest = (before !== after && state.query === Math.floor(T / 2)) ? "hover-changed" :
    "hover-unchanged";
}
</script>
</body></html>
"""
