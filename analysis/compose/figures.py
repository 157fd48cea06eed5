"""Figures of chapter 5 (on the book's theme, :mod:`analysis.plots`)."""
from __future__ import annotations

import json
from html import escape as html_escape

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Polygon

from .. import plots
from .decide import LAYOUT_LABELS

SHORT_POLICY = {"full cache": "full", "snapkv": "SnapKV", "kivi4": "KIVI-4", "kivi2": "KIVI-2",
                "qevict_recall": "QEvict", "qevict_dequant": "QEvict-dq", "mikv": "MiKV", "h2o": "H2O",
                "tova": "TOVA", "streaming": "Stream"}


def short_policy(label: str) -> str:
    if label is None:
        return ""
    name, _, budget = label.partition(" @ ")
    return SHORT_POLICY.get(name, name) + (f" {budget}" if budget else "")


# one colour per tier layout in every figure of the chapter (distinct hues of the book's palette)
LAYOUT_COLOR_INDEX = {"hbm": 0, "dram": 8, "cxl": 2, "nvme": 1, "qlc": 4, "ai_ssd": 9}
LAYOUT_SHORT = {"hbm": "HBM", "dram": "DRAM", "cxl": "CXL", "nvme": "NVMe", "qlc": "QLC", "ai_ssd": "AI SSD"}


FLIP_CORNER = 0.17  # the side of a flipping cell's corner mark, in cells
FLIP_COLOR = "0.15"


def layout_colors(layouts=tuple(LAYOUT_COLOR_INDEX)):
    return {l: plots.PALETTE[LAYOUT_COLOR_INDEX.get(l, 7) % len(plots.PALETTE)] for l in layouts}


def decision_map(cells, layouts, *, factors=None, fmt_cost="${:.3f}", panel_width=5.4,
                 fontsize=plots.SMALL_PT):
    """One panel per SSD price factor (``factors``: a subset; default all), stacked in one column so
    that the cell labels stay legible at the page width: context (rows) x hit rate (columns),
    coloured by the cheapest layout, with the policy, mode and cost written in each cell and thick
    lines on the frontiers where the cheapest layout changes (unlabelled: where several frontiers meet
    one column their labels crowd each other, and the colours and legend say the same). Cells whose
    answer flips within the declared sensitivity ranges (a ``flips`` column,
    :func:`~analysis.compose.decide.map_uncertainty`) carry a dark mark in their top-right corner (a
    hatch over every cell hid the text when most cells flip)."""
    colors = layout_colors(layouts)
    factors = sorted(cells["ssd_price_factor"].unique()) if factors is None else list(factors)
    hits = sorted(cells["hit_rate"].unique())
    ctxs = sorted(cells["context"].unique())
    panel_h = 0.66 * len(ctxs) + 1.0
    size = plots.figsize(panel_h * len(factors) + 1.2, panel_width + 1.5)
    fig, axes = plt.subplots(len(factors), 1, figsize=size, squeeze=False, sharex=True)
    for ax, f in zip(axes[:, 0], factors):
        sub = cells[np.isclose(cells["ssd_price_factor"], f)].set_index(["context", "hit_rate"])
        grid = np.full((len(ctxs), len(hits), 3), 0.92)
        lay = np.empty((len(ctxs), len(hits)), dtype=object)
        for i, c in enumerate(ctxs):
            for j, h in enumerate(hits):
                r = sub.loc[(c, h)]
                lay[i, j] = r["layout"]
                if r["layout"] in colors:
                    grid[i, j] = colors[r["layout"]][:3]
                    label = f"{short_policy(r['policy'])}\n{r['mode']}\n{fmt_cost.format(r['usd_per_mtok'])}"
                    ax.text(j, i, label, ha="center", va="center", fontsize=fontsize, color="black")
                else:
                    ax.text(j, i, "—", ha="center", va="center", fontsize=fontsize + 0.5)
                if bool(r.get("flips", False)):  # a corner mark, not a hatch: the cell's text stays legible
                    x1, y1 = j + 0.5, i + 0.5  # the cell's top-right corner (origin="lower")
                    ax.add_patch(Polygon([(x1 - FLIP_CORNER, y1), (x1, y1), (x1, y1 - FLIP_CORNER)],
                                         closed=True, fc=FLIP_COLOR, ec="none", zorder=4))
        ax.imshow(grid, aspect="auto", origin="lower", alpha=0.75)
        # frontier lines: cell edges across which the cheapest layout changes
        for i in range(len(ctxs)):
            for j in range(len(hits)):
                if j + 1 < len(hits) and lay[i, j] != lay[i, j + 1]:
                    ax.plot([j + 0.5, j + 0.5], [i - 0.5, i + 0.5], color="k", lw=2.2)
                if i + 1 < len(ctxs) and lay[i, j] != lay[i + 1, j]:
                    ax.plot([j - 0.5, j + 0.5], [i + 0.5, i + 0.5], color="k", lw=2.2)
        ax.set_xticks(range(len(hits)), [f"{h:.0%}" for h in hits])
        ax.set_yticks(range(len(ctxs)), [f"{c / 1024:g}K" for c in ctxs])
        ax.set_ylabel("prompt length (tokens)")
        ax.set_title(f"SSD prices × {f:g}", fontsize=10)
        ax.grid(False)
    axes[-1][0].set_xlabel("reuse: hit rate with an unbounded cache")
    shown = cells[np.isin(cells["ssd_price_factor"], factors)]
    used = [l for l in layouts if (shown["layout"] == l).any()]
    handles = [Patch(color=colors[l], alpha=0.75, label=LAYOUT_LABELS[l]) for l in used]
    if "flips" in shown and shown["flips"].any():
        handles.append(Line2D([], [], ls="none", marker=[(-1, 1), (1, 1), (1, -1), (-1, 1)], ms=9,
                              color=FLIP_COLOR, label="corner: the answer flips within the declared ranges"))
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 3), bbox_to_anchor=(0.5, 1.02),
               title="cheapest tier layout", fontsize=plots.SMALL_PT)
    top = 1 - (1.0 if len(handles) > 3 else 0.75) / size[1]  # inches for the legend above the panels
    fig.tight_layout(rect=(0, 0, 1, top))
    return fig


# ------------------------------------------------------------------------------ interactive map

def interactive_data(cells, every, layouts) -> dict:
    """The precomputed grid of the interactive map (JSON-ready): for every SSD price factor the map
    (layout index, label and cost per prompt length x reuse cell) and, per cell, the cheapest
    admissible cost of each tier layout (what the cell's bar chart shows)."""
    factors = sorted(float(f) for f in cells["ssd_price_factor"].unique())
    ctxs = sorted(int(c) for c in cells["context"].unique())
    hits = sorted(float(h) for h in cells["hit_rate"].unique())
    lay_idx = {l: i for i, l in enumerate(layouts)}
    ok = every[every["admissible"]] if len(every) else every
    best = (ok.groupby(["ssd_price_factor", "context", "hit_rate", "layout"])["usd_per_mtok"].min()
            if len(ok) else pd.Series(dtype=float))
    maps, bars = [], []
    for f in factors:
        sub = cells[np.isclose(cells["ssd_price_factor"], f)].set_index(["context", "hit_rate"])
        z, text, cost, fb = [], [], [], []
        bf = []
        for c in ctxs:
            zr, tr, cr, fr, br = [], [], [], [], []
            for h in hits:
                r = sub.loc[(c, h)]
                lay = r["layout"]
                zr.append(lay_idx.get(lay, None))
                cr.append(None if not np.isfinite(r["usd_per_mtok"]) else round(float(r["usd_per_mtok"]), 5))
                tr.append(f"{short_policy(r['policy'])}<br>{r['mode']}" if lay in lay_idx else "—")
                fr.append(bool(r.get("flips", False)))
                br.append([None if (f, c, h, l) not in best.index else round(float(best[(f, c, h, l)]), 5)
                           for l in layouts])
            z.append(zr)
            text.append(tr)
            cost.append(cr)
            fb.append(fr)
            bf.append(br)
        maps.append({"z": z, "text": text, "cost": cost, "flips": fb})
        bars.append(bf)
    cols = layout_colors(layouts)
    hexes = ["#%02x%02x%02x" % tuple(int(round(255 * v)) for v in cols[l][:3]) for l in layouts]
    return {"factors": factors, "contexts": ctxs, "hits": hits, "layouts": list(layouts),
            "layout_labels": [LAYOUT_LABELS[l] for l in layouts],
            "layout_short": [LAYOUT_SHORT.get(l, l) for l in layouts], "colors": hexes, "maps": maps,
            "bars": bars}


_JS = """
(function () {
  var D = __DATA__, id = "__ID__";
  var root = document.getElementById(id);
  var sel = {f: D.factors.indexOf(1) >= 0 ? D.factors.indexOf(1) : 0, c: D.contexts.length - 1,
             h: D.hits.length - 1};
  function fmtK(c) { return (c / 1024) + "K"; }
  function scale() {
    var n = D.layouts.length, cs = [];
    for (var i = 0; i < n; i++) { cs.push([i / n, D.colors[i]]); cs.push([(i + 1) / n, D.colors[i]]); }
    return cs;
  }
  function mapTraces() {
    var m = D.maps[sel.f], hover = [];
    for (var i = 0; i < D.contexts.length; i++) {
      var row = [];
      for (var j = 0; j < D.hits.length; j++) {
        var l = m.z[i][j];
        row.push(l === null ? "no admissible option" : D.layout_labels[l] + "<br>" + m.text[i][j] +
                 "<br>$" + m.cost[i][j] + " per M tokens" +
                 (m.flips[i][j] ? "<br>flips within the declared ranges" : ""));
      }
      hover.push(row);
    }
    var x = D.hits.map(function (h) { return Math.round(h * 100) + "%"; });
    var y = D.contexts.map(fmtK);
    var z = m.z.map(function (r) { return r.map(function (v) { return v === null ? null : v + 0.5; }); });
    return [{type: "heatmap", z: z, x: x, y: y, text: m.text, customdata: hover, texttemplate: "%{text}",
             hovertemplate: "%{customdata}<extra></extra>", colorscale: scale(), zmin: 0,
             zmax: D.layouts.length, showscale: false, xgap: 1, ygap: 1},
            {type: "scatter", mode: "markers", x: [x[sel.h]], y: [y[sel.c]], hoverinfo: "skip",
             marker: {symbol: "square-open", size: 38, line: {width: 3, color: "black"}}, showlegend: false}];
  }
  function barTraces() {
    var b = D.bars[sel.f][sel.c][sel.h];
    return [{type: "bar", x: D.layout_short, y: b, marker: {color: D.colors},
             hovertemplate: "%{x}: $%{y:.4f} per M tokens<extra></extra>"}];
  }
  function draw() {
    root.querySelector(".kv-f-val").textContent = "× " + D.factors[sel.f];
    root.querySelector(".kv-h-val").textContent = Math.round(D.hits[sel.h] * 100) + "%";
    root.querySelector(".kv-c-val").textContent = D.contexts[sel.c].toLocaleString("en-US") + " tokens";
    Plotly.react(id + "-map", mapTraces(), {margin: {t: 30, l: 60, r: 10, b: 50}, height: 420,
      title: {text: "cheapest tier layout at SSD prices × " + D.factors[sel.f], font: {size: 13}},
      xaxis: {title: {text: "reuse (hit rate, unbounded cache)"}, type: "category"},
      yaxis: {title: {text: "prompt length"}, type: "category"}},
      {displayModeBar: false, responsive: true});
    Plotly.react(id + "-bars", barTraces(), {margin: {t: 30, l: 60, r: 10, b: 90}, height: 420,
      title: {text: "cheapest admissible cost per layout at " + fmtK(D.contexts[sel.c]) + ", reuse " +
              Math.round(D.hits[sel.h] * 100) + "%", font: {size: 13}},
      xaxis: {type: "category"}, yaxis: {title: {text: "USD per million tokens"}}},
      {displayModeBar: false, responsive: true});
    root.setAttribute("data-state", [sel.f, sel.c, sel.h].join(","));
  }
  [["f", "kv-f"], ["c", "kv-c"], ["h", "kv-h"]].forEach(function (p) {
    var inp = root.querySelector("." + p[1]);
    inp.value = sel[p[0]];
    inp.addEventListener("input", function () { sel[p[0]] = parseInt(inp.value, 10); draw(); });
  });
  draw();
})();
"""


PLOTLY_BOOK_PATH = "_static/plotly.min.js"  # written by _ext/kvbook_html.py from the pinned plotly package

# Loads the book's one copy of Plotly (relative to the page's Sphinx content root), with an AMD loader on
# the page hidden while it loads so that ``window.Plotly`` is defined, then draws.
_BOOK_LOADER = """
(function () {
  var root = document.getElementById("__ID__");
  function go() { __DRAW__ }
  if (window.Plotly) { go(); return; }
  var base = document.documentElement.getAttribute("data-content_root");
  if (base === null) {
    root.insertAdjacentHTML("beforeend", "<p><em>The interactive map loads Plotly from the built book " +
      "(__PATH__); in a notebook, call interactive_map_html(..., plotly_js='inline').</em></p>");
    return;
  }
  var amd = window.define, s = document.createElement("script");
  window.define = undefined;
  window.PlotlyConfig = {MathJaxConfig: "local"};
  s.src = base + "__PATH__";
  s.onload = function () { window.define = amd; go(); };
  s.onerror = function () { window.define = amd; };
  document.head.appendChild(s);
})();
"""


def interactive_legend_html(data: dict) -> str:
    """The interactive map's colour legend (HTML): one swatch per tier layout, in the map's colours."""
    items = "".join(
        f'<span style="margin-right:1.2em;white-space:nowrap"><span style="display:inline-block;width:0.9em;'
        f'height:0.9em;background:{c};border:1px solid #555;vertical-align:middle;margin-right:0.35em">'
        f'</span>{html_escape(label)}</span>'
        for c, label in zip(data["colors"], data["layout_labels"]))
    return (f'<div class="kv-map-legend" style="font-size:0.85em;margin-bottom:0.4em">'
            f'<span style="margin-right:0.8em">cheapest tier layout:</span>{items}</div>')


def interactive_map_html(data: dict, div_id: str = "kv-decision-map", plotly_js: str = "inline") -> str:
    """A self-contained HTML fragment: the decision map as a Plotly heatmap with three sliders (SSD
    price, prompt length, reuse) and the selected cell's cost per layout.

    ``plotly_js``: ``"inline"`` puts Plotly's JavaScript bundle (from the pinned ``plotly`` package, 4.6
    MB) into the fragment, so it needs no server and no network (a notebook); ``"book"`` loads the
    book's one copy, ``_static/plotly.min.js`` (written at build time by ``_ext/kvbook_html.py``), so the
    chapter's page stays small. Either way an AMD loader on the page is hidden while Plotly loads so that
    ``window.Plotly`` is defined."""
    if plotly_js not in ("inline", "book"):
        raise ValueError(f"plotly_js must be 'inline' or 'book', not {plotly_js!r}")
    nf, nc, nh = len(data["factors"]), len(data["contexts"]), len(data["hits"])
    controls = "".join(
        f'<label style="margin-right:1.5em">{name} <input type="range" class="{cls}" min="0" max="{n - 1}" '
        f'step="1" aria-label="{name}"> <span class="{cls}-val"></span></label>'
        for name, cls, n in (("SSD price", "kv-f", nf), ("prompt length", "kv-c", nc), ("reuse", "kv-h", nh)))
    js = _JS.replace("__DATA__", json.dumps(data, separators=(",", ":"))).replace("__ID__", div_id)
    html = (f'<div id="{div_id}" class="kv-interactive-map">'
            f'<div style="font-size:0.9em;margin-bottom:0.5em">{controls}</div>'
            f'{interactive_legend_html(data)}'
            f'<div style="display:flex;flex-wrap:wrap">'
            f'<div id="{div_id}-map" style="flex:1 1 380px;min-width:320px"></div>'
            f'<div id="{div_id}-bars" style="flex:1 1 320px;min-width:280px"></div></div></div>')
    if plotly_js == "book":
        return html + "<script>" + _BOOK_LOADER.replace("__ID__", div_id).replace(
            "__PATH__", PLOTLY_BOOK_PATH).replace("__DRAW__", js) + "</script>"
    from plotly.offline import get_plotlyjs  # optional heavy dependency

    return (html + '<script>window.__kvAmd = window.define; window.define = undefined; '
            'window.PlotlyConfig = {MathJaxConfig: "local"};</script>'
            f'<script>{get_plotlyjs()}</script>'
            '<script>window.define = window.__kvAmd;</script>'
            f'<script>{js}</script>')


def sensitivity(ax, df, *, xlabel, title, logx=False, groups_label=None, colors=None):
    """Lines of the cheapest cost per group (layout, mode, ...) against one input, each in its colour,
    marker and line style (lines that coincide stay visible: the later dashed over the earlier, the
    earlier's markers larger), over the overall cheapest as a thick light-grey line (unlabelled: the
    legend's title names it). ``colors``: group -> colour (default: the book's series colours)."""
    best = df[df["group"] == "best"]
    ax.plot(best["value"], best["usd_per_mtok"], color="k", lw=5, alpha=0.18, zorder=1,
            solid_capstyle="round", label="_nolegend_")
    groups = [g for g in df["group"].unique() if g != "best"]
    for i, g in enumerate(groups):
        sub = df[df["group"] == g]
        st = plots.series_style(i, ms=7 - 0.7 * (i % 6), lw=1.3)
        if colors and g in colors:
            st["color"] = colors[g]
        ax.plot(sub["value"], sub["usd_per_mtok"], zorder=2 + i, label=(groups_label or {}).get(g, g), **st)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("USD per million tokens")
    ax.set_title(title, fontsize=plots.SMALL_PT + 2)


LEGEND_TITLE = "cheapest per {}; thick grey line: the cheapest overall"


# ----------------------------------------------------------------------- the chapter's figures, by label


def fig_decision_map_answer(cells, layouts, factor):
    """The decision map at one SSD price factor (the chapter's answer)."""
    return decision_map(cells, layouts, factors=[factor])


def fig_decision_map(cells, layouts):
    """The decision map at every SSD price factor of the map."""
    return decision_map(cells, layouts)


def fig_sens_devices(sweeps: dict, layout_labels: dict):
    """Cheapest cost per tier layout against the AI-SSD price, the CXL price, the NVMe per-drive
    bandwidth and the AI SSD's read gain (``sweeps``: ``chapter.sensitivity_sweeps``)."""
    fig, axs = plots.subplots(2, 2, height=7.6, sharey=True)
    col = layout_colors()
    sensitivity(axs[0, 0], sweeps["ai"], xlabel="× AI-SSD price of data/hardware.csv", title="AI-SSD price",
                logx=True, groups_label=layout_labels, colors=col)
    sensitivity(axs[0, 1], sweeps["cxl"], xlabel="× CXL price of data/hardware.csv", title="CXL price",
                logx=True, groups_label=layout_labels, colors=col)
    sensitivity(axs[1, 0], sweeps["bw"], xlabel="GB/s per drive", title="NVMe read bandwidth",
                logx=True, groups_label=layout_labels, colors=col)
    sensitivity(axs[1, 1], sweeps["bits"], xlabel="× read rate (16 / stored bits)",
                title="AI-SSD effective bandwidth", logx=True, groups_label=layout_labels, colors=col)
    plots.legend_below(fig, *axs[0, 0].get_legend_handles_labels(), ncol=3,
                       title=LEGEND_TITLE.format("tier layout"), title_fontsize=plots.SMALL_PT)
    return fig


def fig_sens_arch_disagg(sweeps: dict, layout_labels: dict):
    """Cheapest cost per tier layout against the linear-attention share (left) and per deployment
    mode against disaggregation's transfer overhead (right)."""
    fig, axs = plots.subplots(1, 2, height=5.4)
    sensitivity(axs[0], sweeps["lin"], xlabel="share of layers with linear\nattention (KV per token −x)",
                title="KV-shrinking architectures", groups_label=layout_labels, colors=layout_colors())
    sensitivity(axs[1], sweeps["xfer"], xlabel="transfer overhead\n(× slower scale-out transfer)",
                title="maturity of disaggregation", logx=True)
    for ax, what in ((axs[0], "tier layout"), (axs[1], "deployment mode")):
        # each panel's legend below it (its own groups), the title naming the grey line
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=1, fontsize=plots.SMALL_PT,
                  title=LEGEND_TITLE.format(what).replace("; ", "\n"), title_fontsize=plots.SMALL_PT)
    return fig
