"""Figures of chapter 5 (on the book's theme, :mod:`analysis.plots`)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

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


def layout_colors(layouts=tuple(LAYOUT_COLOR_INDEX)):
    return {l: plots.PALETTE[LAYOUT_COLOR_INDEX.get(l, 7) % len(plots.PALETTE)] for l in layouts}


def _annotate_frontiers(ax, lay, n_rows, n_cols):
    """Label each distinct frontier (from -> to layout) once, at its first edge."""
    seen = set()
    for i in range(n_rows):
        for j in range(n_cols):
            for di, dj in ((0, 1), (1, 0)):
                i2, j2 = i + di, j + dj
                if i2 >= n_rows or j2 >= n_cols or lay[i, j] == lay[i2, j2]:
                    continue
                a, b = lay[i, j], lay[i2, j2]
                if a is None or b is None or (a, b) in seen:
                    continue
                seen.add((a, b))
                x, y = (j + 0.5, i) if dj else (j, i + 0.5)
                ax.annotate(f"{LAYOUT_SHORT.get(a, a)}→{LAYOUT_SHORT.get(b, b)}", (x, y), fontsize=6.5,
                            ha="center", va="center", rotation=90 if dj else 0, fontweight="bold",
                            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="black", lw=0.6, alpha=0.9))


def decision_map(cells, layouts, *, fmt_cost="${:.3f}"):
    """One panel per SSD price factor: context (rows) x hit rate (columns), coloured by the
    cheapest layout, with the policy, mode and cost written in each cell and thick lines on the
    frontiers where the cheapest layout changes."""
    colors = layout_colors(layouts)
    factors = sorted(cells["ssd_price_factor"].unique())
    hits = sorted(cells["hit_rate"].unique())
    ctxs = sorted(cells["context"].unique())
    fig, axes = plt.subplots(1, len(factors), figsize=(4.3 * len(factors) + 1.5, 0.62 * len(ctxs) + 2.2),
                             squeeze=False, sharey=True)
    for ax, f in zip(axes[0], factors):
        sub = cells[cells["ssd_price_factor"] == f].set_index(["context", "hit_rate"])
        grid = np.full((len(ctxs), len(hits), 3), 0.92)
        lay = np.empty((len(ctxs), len(hits)), dtype=object)
        for i, c in enumerate(ctxs):
            for j, h in enumerate(hits):
                r = sub.loc[(c, h)]
                lay[i, j] = r["layout"]
                if r["layout"] in colors:
                    grid[i, j] = colors[r["layout"]][:3]
                    ax.text(j, i, f"{short_policy(r['policy'])}\n{r['mode']}\n{fmt_cost.format(r['usd_per_mtok'])}",
                            ha="center", va="center", fontsize=6.5, color="black")
                else:
                    ax.text(j, i, "—", ha="center", va="center", fontsize=7)
        ax.imshow(grid, aspect="auto", origin="lower", alpha=0.75)
        # frontier lines: cell edges across which the cheapest layout changes
        for i in range(len(ctxs)):
            for j in range(len(hits)):
                if j + 1 < len(hits) and lay[i, j] != lay[i, j + 1]:
                    ax.plot([j + 0.5, j + 0.5], [i - 0.5, i + 0.5], color="k", lw=2.2)
                if i + 1 < len(ctxs) and lay[i, j] != lay[i + 1, j]:
                    ax.plot([j - 0.5, j + 0.5], [i + 0.5, i + 0.5], color="k", lw=2.2)
        _annotate_frontiers(ax, lay, len(ctxs), len(hits))
        ax.set_xticks(range(len(hits)), [f"{h:.0%}" for h in hits])
        ax.set_yticks(range(len(ctxs)), [f"{c / 1024:g}K" for c in ctxs])
        ax.set_xlabel("reuse: hit rate with an unbounded cache")
        ax.set_title(f"SSD prices × {f:g}", fontsize=10)
        ax.grid(False)
    axes[0][0].set_ylabel("prompt length (tokens)")
    used = [l for l in layouts if (cells["layout"] == l).any()]
    fig.legend(handles=[Patch(color=colors[l], alpha=0.75, label=LAYOUT_LABELS[l]) for l in used],
               loc="upper center", ncol=min(len(used), 4), bbox_to_anchor=(0.5, 1.02), title="cheapest tier layout",
               fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    return fig


def sensitivity(ax, df, *, xlabel, title, logx=False, groups_label=None, colors=None):
    """Lines of the cheapest cost per group (layout, mode, ...) against one input, the overall
    cheapest as a thick grey line. ``colors``: group -> colour (default: the palette in order)."""
    groups = [g for g in df["group"].unique() if g != "best"]
    for i, g in enumerate(groups):
        sub = df[df["group"] == g]
        col = (colors or {}).get(g, plots.PALETTE[i % len(plots.PALETTE)])
        ax.plot(sub["value"], sub["usd_per_mtok"], marker=plots.MARKERS[i % len(plots.MARKERS)], ms=4, lw=1.2,
                color=col, label=(groups_label or {}).get(g, g))
    best = df[df["group"] == "best"]
    ax.plot(best["value"], best["usd_per_mtok"], color="k", lw=2.5, alpha=0.35, label="cheapest")
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("USD per million tokens")
    ax.set_title(title, fontsize=10)
