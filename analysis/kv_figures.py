"""Figures of chapter 1 (``book/01_kv_footprint.md``), one function per figure, named after the
figure's label (``fig-kv-per-token`` -> :func:`fig_kv_per_token`), each returning its Figure on the
book's theme (:mod:`analysis.plots`)."""
from __future__ import annotations

from matplotlib.patches import Patch

from . import kv, plots, specs


def _family_color(family):
    return plots.FAMILY_COLORS.get(family, plots.PALETTE[7])


def fig_kv_per_token(table, dtype: str):
    """Horizontal bars of KV bytes per token (log scale) from :func:`analysis.kv_chapter.footprint_table`,
    coloured by attention family (legend below the bars)."""
    order = table.sort_values("KV bytes/token")
    fig, ax = plots.subplots(height=0.32 * len(order) + 1.9)
    ax.barh(order["model"], order["KV bytes/token"], color=[_family_color(f) for f in order["family"]])
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(plots.bytes_formatter())
    ax.set_xlabel(f"KV bytes per token ({dtype}, layers that grow with context)")
    fams = list(dict.fromkeys(order["family"]))
    plots.legend_below(fig, [Patch(color=_family_color(f), label=f) for f in fams], fams, ncol=3,
                       title="attention family")
    return fig


def _panels(models, ctx, values, xlabel, ylabel, reference=None):
    """One panel per group of at most ``plots.MAX_SERIES`` models (each model's series distinct in
    colour, marker and line style; the other panels' models in light grey behind), log-log, each
    panel's legend right of it; ``reference``: (y, label) of a dashed horizontal line."""
    groups = plots.chunks(models)
    n = len(groups)
    fig, axes = plots.subplots(n, 1, height=3.0 * n + 0.6, squeeze=False, sharex=True, sharey=True)
    ys = {m: values(m) for m in models}
    for ax, group in zip(axes[:, 0], groups):
        if n > 1:
            plots.context_lines(ax, ctx, [ys[m] for m in models if m not in group])
        for i, m in enumerate(group):
            ax.plot(ctx, ys[m], label=m, **plots.series_style(i, markevery=max(1, len(ctx) // 8)))
        if reference is not None:
            ax.axhline(reference[0], ls="--", color="k", lw=1, label="_nolegend_")
            ax.annotate(reference[1], (ctx[0], reference[0]), xytext=(2, 3), textcoords="offset points",
                        fontsize=plots.SMALL_PT, ha="left", va="bottom")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(plots.tokens_formatter())
        ax.set_ylabel(ylabel)
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=plots.SMALL_PT)
    axes[-1, 0].set_xlabel(xlabel)
    return fig, axes


def fig_kv_vs_context(models, ctx, dtype: str, gpu: str):
    """KV cache of one sequence against context ``ctx`` per model (log-log, at most six models per
    panel), with the HBM of one ``gpu`` as a dashed line."""
    g = specs.gpu(gpu)
    fig, axes = _panels(list(models), ctx, lambda n: kv.kv_bytes(specs.model(n), ctx, 1, dtype),
                        "context length (tokens)", f"KV per sequence ({dtype})",
                        (g["hbm_capacity"], f"HBM of one {g.name}"))
    for ax in axes[:, 0]:
        ax.yaxis.set_major_formatter(plots.bytes_formatter())
    return fig


def fig_kv_vs_weights(models, ctx, dtype: str, weight_dtype: str):
    """Batch at which the KV cache of ``batch x context`` equals the weights, per model (log-log, at
    most six models per panel)."""
    fig, axes = _panels(list(models), ctx,
                        lambda n: kv.kv_exceeds_weights_batch(specs.model(n), ctx, dtype, weight_dtype),
                        "context length per sequence (tokens)", "batch at which KV = weights")
    for ax in axes[:, 0]:
        ax.axhline(1, color="k", lw=0.8, label="_nolegend_")
    return fig
