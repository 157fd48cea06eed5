"""Figures of chapter 1 (``book/01_kv_footprint.md``), one function per figure, named after the
figure's label (``fig-kv-per-token`` -> :func:`fig_kv_per_token`), each returning its Figure on the
book's theme (:mod:`analysis.plots`)."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from . import kv, plots, specs


def _family_color(family):
    return plots.FAMILY_COLORS.get(family, plots.PALETTE[7])


def fig_kv_per_token(table, dtype: str):
    """Horizontal bars of KV bytes per token (log scale) from :func:`analysis.kv_chapter.footprint_table`,
    coloured by attention family."""
    order = table.sort_values("KV bytes/token")
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(order) + 1.2))
    ax.barh(order["model"], order["KV bytes/token"], color=[_family_color(f) for f in order["family"]])
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(plots.bytes_formatter())
    ax.set_xlabel(f"KV bytes per token ({dtype}, layers that grow with context)")
    fams = list(dict.fromkeys(order["family"]))
    ax.legend(handles=[Patch(color=_family_color(f), label=f) for f in fams], loc="lower right",
              title="family")
    return fig


def _series_style(i):
    return dict(color=plots.PALETTE[i % len(plots.PALETTE)], ls=plots.LINESTYLES[i // len(plots.PALETTE)],
                marker=plots.MARKERS[i % len(plots.MARKERS)], markevery=16, ms=4, lw=1.4)


def fig_kv_vs_context(models, ctx, dtype: str, gpu: str):
    """KV cache of one sequence against context ``ctx`` per model (log-log), with the HBM of one
    ``gpu`` as a dashed line."""
    g = specs.gpu(gpu)
    fig, ax = plt.subplots(figsize=(6.6, 4.6))
    for i, m in enumerate(specs.model(n) for n in models):
        ax.plot(ctx, kv.kv_bytes(m, ctx, 1, dtype), label=m.name, **_series_style(i))
    ax.axhline(g["hbm_capacity"], ls="--", color="k", lw=1)
    ax.annotate(f"HBM of one {g.name}", (ctx[-1], g["hbm_capacity"]), xytext=(0, -4),
                textcoords="offset points", fontsize=8, ha="right", va="top")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(plots.tokens_formatter())
    ax.yaxis.set_major_formatter(plots.bytes_formatter())
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(f"KV cache per sequence ({dtype})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def fig_kv_vs_weights(models, ctx, dtype: str, weight_dtype: str):
    """Batch at which the KV cache of ``batch x context`` equals the weights, per model (log-log)."""
    fig, ax = plt.subplots(figsize=(6.6, 4.6))
    for i, m in enumerate(specs.model(n) for n in models):
        b = kv.kv_exceeds_weights_batch(m, ctx, dtype, weight_dtype)
        ax.plot(ctx, b, label=m.name, **_series_style(i))
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(plots.tokens_formatter())
    ax.set_xlabel("context length per sequence (tokens)")
    ax.set_ylabel("batch at which KV = weights")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
