"""Chapter 4's figures, one function per figure, named after the figure's label in the chapter
(label ``fig-qevict-fmm`` -> :func:`fig_qevict_fmm`); each returns the matplotlib Figure."""
from __future__ import annotations

import textwrap

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from .. import plots
from ..plots import LINESTYLES
from .labels import labels_for, names_of
from .metrics import pareto_mask


def percent_tick(x, _pos=None) -> str:
    """Axis tick of a fraction as a whole percentage (0.35 -> '35%')."""
    return f"{x:.0%}"


OUTCOME_COLORS = {"better": "#1b9e77", "not worse": "#7fc97f", "unclear": "#999999", "worse": "#d95f02",
                  "not testable": "#cccccc"}


def _forest(rule_table: pd.DataFrame, title: str = "", labels: dict | None = None):
    """KL ratio QEvict / baseline (geometric mean over documents) with its Holm-level interval, one
    row per (baseline, budget), coloured by the rule's outcome; the 10% non-inferiority margin dotted.
    Baselines by their display names (``labels``: ``analysis.qevict.labels.names_of`` the run)."""
    t = rule_table.sort_values(["baseline", "budget"]).reset_index(drop=True)
    names = labels_for(t.baseline.unique(), labels)
    n = len(t)
    fig, ax = plots.subplots(height=0.24 * n + 2.0)
    y = np.arange(n)[::-1]
    for yi, (_, r) in zip(y, t.iterrows()):
        c = OUTCOME_COLORS.get(r.outcome, "k")
        if np.isfinite(r.get("lo", np.nan)):
            ax.plot([r.lo, r.hi], [yi, yi], color=c, lw=2)
        ax.plot(r.ratio, yi, "o", color=c, ms=4)
    ax.axvline(1, color="k", lw=0.8)
    ax.axvline(1.10, color="k", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yticks(y, [f"{names[b]} @ {f:.0%}" for b, f in zip(t.baseline, t.budget)],
                  fontsize=plots.SMALL_PT)
    ax.set_xlabel("KL(QEvict) / KL(baseline), geometric mean over documents\n(log scale; < 1: QEvict better)",
                  fontsize=plots.SMALL_PT + 1)
    handles = [plt.Line2D([], [], color=c, lw=2, label=k) for k, c in OUTCOME_COLORS.items()
               if k in set(t.outcome)]
    plots.legend_below(fig, handles, [h.get_label() for h in handles], ncol=5, title="outcome (Holm)",
                       title_fontsize=plots.SMALL_PT)
    ax.set_title(title, fontsize=plots.SMALL_PT + 1)
    return fig


def fig_qevict_pareto(ptab: pd.DataFrame, palette: dict, markers: dict):
    """Two views of the three-way trade-off (on-device bytes, recall bytes per step, KL): KL against
    the on-device share (left) and against the recall traffic (right); the points not dominated on
    all three are outlined and joined per panel by their two-way front."""
    labels = list(dict.fromkeys(ptab.label))
    groups = plots.chunks(labels)
    fig, axes = plots.subplots(len(groups), 2, height=3.6 * len(groups) + 1.2, squeeze=False, sharey=True)
    views = (("device_frac", "on-device bytes\n(fraction of the full cache, mean over steps)"),
             ("recall_bytes_per_step", "recall traffic per decoding step\n[bytes] (symlog)"))
    for row, group in zip(axes, groups):
        for ax, (x, xl) in zip(row, views):
            rest = ptab[~ptab.label.isin(group)]
            ax.scatter(rest[x], rest.kl, color=plots.GREY, marker=".", s=30, zorder=1)
            for lab in group:
                d = ptab[ptab.label == lab]
                ax.scatter(d[x], d.kl, color=palette.get(lab, "k"), marker=markers.get(lab, "o"), s=36,
                           edgecolor=np.where(d.pareto, "k", "none"), linewidth=1.2, label=lab, zorder=3)
            pts = ptab[[x, "kl"]].values
            fr = ptab[pareto_mask(pts)].sort_values(x)
            ax.step(fr[x], fr.kl, where="post", color="k", lw=0.8, ls="--", zorder=2)
            ax.set_xlabel(xl, fontsize=plots.SMALL_PT + 1)
            ax.set_yscale("log")
        row[1].set_xscale("symlog", linthresh=1e3)
        row[0].set_ylabel("KL(full ‖ policy) per token\n[nats], mean over documents",
                          fontsize=plots.SMALL_PT + 1)
        row[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=plots.SMALL_PT)
    return fig


def fig_qevict_drift_null(drift: pd.DataFrame):
    """Per document, each drift statistic in decoding order against its shuffled-order null: the primary
    rule's two metrics (Global LIR; the one-shot FMM at far pairs, the far-pair missed share), then the
    budget-relative LIR (shown, not judged)."""
    stats = [("global_lir", "Global LIR\n(primary)"), ("miss", "one-shot FMM, far pairs\n(primary)"),
             ("budget_lir", "budget-relative LIR\n(not judged)")]
    fig, axes = plots.subplots(1, 3, height=0.35 * len(drift) + 2.4, sharey=True)
    y = np.arange(len(drift))[::-1]
    for ax, (k, lab) in zip(axes, stats):
        ax.errorbar(drift[f"{k}_null_mean"], y, xerr=2 * drift[f"{k}_null_sd"], fmt="s", color="#999999",
                    ms=4, label="shuffled order (mean ± 2 sd)")
        ax.plot(drift[f"{k}_observed"], y, "o", color="#d95f02", ms=5, label="decoding order")
        ax.set_xlabel(lab, fontsize=plots.SMALL_PT + 1)
        ax.tick_params(axis="x", labelsize=plots.SMALL_PT)
        ax.xaxis.set_major_locator(plt.MaxNLocator(3))
    axes[0].set_yticks(y, drift.document, fontsize=plots.SMALL_PT)
    handles, labels = axes[0].get_legend_handles_labels()
    plots.legend_below(fig, handles, labels, ncol=2)
    return fig


def genre_kl_ratios(summary: pd.DataFrame, policy: str, baselines, labels: dict) -> pd.DataFrame:
    """Geometric-mean KL ratio policy / baseline per genre (rows) and baseline (columns), over
    budgets and the genre's documents."""
    k = summary.pivot_table(index=["genre", "document", "budget"], columns="policy", values="kl")
    names = names_of(summary)
    rows = []
    for b in baselines:
        if b not in k or policy not in k:
            continue
        lr = np.log((k[policy] + 1e-6) / (k[b] + 1e-6)).rename("lr").reset_index()
        for g, d in lr.groupby("genre"):
            rows.append(dict(genre=labels.get(g, g), baseline=names[b],
                             ratio=float(np.exp(d.lr.mean()))))
    return pd.DataFrame(rows).pivot(index="genre", columns="baseline", values="ratio")


def fig_qevict_genres(ratios: pd.DataFrame):
    """Heat map of :func:`genre_kl_ratios` (log2 colour scale, the ratio written in each cell)."""
    t = ratios
    fig, ax = plots.subplots(height=0.5 * t.shape[0] + 2.6, width=min(0.75 * t.shape[1] + 3.0, 7.5))
    sns.heatmap(np.log2(t), annot=t.map("{:.2f}".format), fmt="", cmap="RdBu_r", center=0, ax=ax,
                cbar_kws={"label": "log2 KL ratio (blue: QEvict better)"},
                annot_kws={"fontsize": plots.SMALL_PT})
    ax.set_xlabel("")
    ax.set_ylabel("")
    ax.tick_params(axis="x", labelrotation=60, labelsize=plots.SMALL_PT)
    ax.tick_params(axis="y", labelsize=plots.SMALL_PT)
    return fig


def fig_qevict_long_kl(long_table: pd.DataFrame, palette: dict, markers: dict):
    """KL against the budget for every policy, one panel per committed long run (mean over its
    documents): the committed long-context table (``longview.long_results``) as a figure, whose full
    table the chapter offers as a CSV download."""
    runs = list(dict.fromkeys(long_table.run))
    labels = list(dict.fromkeys(long_table.label))
    groups = plots.chunks(labels)
    nrow, ncol = len(runs), len(groups)
    fig, axes = plots.subplots(nrow, ncol, height=3.4 * nrow + 1.4, squeeze=False, sharey=True)
    # the book's second cue (plots.LINESTYLES): the k-th policy with a given colour gets line style k
    uses, style = {}, {}
    for lab in labels:
        c = matplotlib.colors.to_rgba(palette.get(lab, "k"))
        style[lab] = LINESTYLES[uses.get(c, 0) % len(LINESTYLES)]
        uses[c] = uses.get(c, 0) + 1
    for row, run in zip(axes, runs):
        d = long_table[long_table.run == run]
        ctx = int(d.context_tokens.max())
        for ax, group in zip(row, groups):
            for lab, g in d.groupby("label", sort=False):
                g = g.sort_values("budget")
                if lab in group:
                    ax.plot(g.budget, g.KL, marker=markers.get(lab, "o"), color=palette.get(lab, "k"), ms=4,
                            lw=1, ls=style[lab], label=lab, zorder=3)
                else:
                    ax.plot(g.budget, g.KL, color=plots.GREY, lw=0.9, zorder=1, label="_nolegend_")
            ax.set_title(f"{run}\n{d.model.iloc[0]}, {ctx:,} tokens", fontsize=plots.SMALL_PT)
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(plt.FuncFormatter(percent_tick))
        row[0].set_ylabel("KL(full ‖ policy)\nper token [nats]", fontsize=plots.SMALL_PT + 1)
    for ax in axes[-1]:
        ax.set_xlabel("budget (fraction of\nfull-cache bytes)", fontsize=plots.SMALL_PT + 1)
    plots.legend_below(fig, ncol=3)
    return fig


def policy_styles(policies, palette, markers, names: dict | None = None):
    """Presentation order, colours and markers of the non-full policies: ``(keys, labels, colour by
    label, markers)``, the labels being display names (``names``: ``analysis.qevict.labels.names_of``
    the run, so that a policy that evicted to fit its budget is named so); colours repeat after
    ``len(palette)`` policies, markers do not."""
    keys = [p for p in policies if p != "full"]
    shown = labels_for(keys, names)
    labels = [shown[p] for p in keys]
    # grey is the book's colour for context series and references, never a policy's
    hues = [c for c in palette if np.ptp(matplotlib.colors.to_rgb(c)) > 0.05] or list(palette)
    colours = dict(zip(labels, hues * (len(labels) // len(hues) + 1)))
    marks = (list(markers) + ["h", "p", "8", "d"])[:len(labels)]
    return keys, labels, colours, marks


def heatmap_frame(attn_full: np.ndarray, prefill_tokens: int, window_tokens: int, layer: int) -> pd.DataFrame:
    """Window attention of one document, windows (rows, by first token position) by decoding steps
    (columns): one layer's mean over KV heads (``layer < 0``: mean of all layers); NaN before a
    window starts."""
    a = attn_full.mean(axis=(1, 2)) if layer < 0 else attn_full[:, layer].mean(axis=1)
    nwin = a.shape[-1]
    first_tok = np.arange(nwin) * window_tokens
    exists = first_tok[None, :] <= prefill_tokens + np.arange(a.shape[0])[:, None]  # window started by step s
    return pd.DataFrame(np.where(exists, a, np.nan).T, index=[f"{t}" for t in first_tok])


def fig_qevict_heatmap(attn_full: np.ndarray, prefill_tokens: int, window_tokens: int, layer: int,
                       document: str, cmap: str = "viridis"):
    """log10 attention mass per window and decoding step (:func:`heatmap_frame`)."""
    h = heatmap_frame(attn_full, prefill_tokens, window_tokens, layer)
    fig, ax = plots.subplots(height=4.8)
    sns.heatmap(np.log10(h.clip(lower=1e-4)), ax=ax, cmap=cmap, vmin=-4, vmax=0,
                cbar_kws={"label": "log10 attention mass of the window"}, xticklabels=16, yticklabels=4)
    ax.set_xlabel("decoding step")
    ax.set_ylabel("window (first token position)")
    lay = "mean of all layers" if layer < 0 else f"layer {layer}"
    ax.set_title(f"{document}: window attention, {lay}")
    return fig


def fig_qevict_lir(lir: pd.DataFrame, gap_steps: int, seed: int, colour):
    """Global LIR per layer (left) and the attention mass on re-activated windows (right), mean over
    documents with a 95% bootstrap interval."""
    fig, axes = plots.subplots(1, 2, height=3.8)
    sns.lineplot(data=lir, x="layer", y="lir", ax=axes[0], marker="o", errorbar=("ci", 95), seed=seed)
    axes[0].set_ylabel("Global LIR (fraction re-activated)")
    axes[0].set_ylim(0, 1)
    sns.lineplot(data=lir, x="layer", y="reactivated_mass", ax=axes[1], marker="o", errorbar=("ci", 95),
                 seed=seed, color=colour)
    axes[0].set_ylabel("Global LIR\n(fraction re-activated)")
    axes[1].set_ylabel("attention mass on re-activated\nwindows (per step and KV head)")
    for ax in axes:
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(plt.MaxNLocator(6, integer=True))
    fig.suptitle(f"Global LIR by layer (L = {gap_steps} steps), mean over documents with 95% CI",
                 fontsize=plots.SMALL_PT + 1)
    return fig


def _budget_lines(ax, data, col, order, palette, markers, seed, legend="auto", group=None):
    """Policies of ``group`` (default: all of ``order``) against the budget with 95% intervals; the
    other policies' means as thin grey lines behind them, without intervals."""
    group = list(order) if group is None else list(group)
    rest = data[~data.label.isin(group)]
    for _, g in rest.groupby("label"):
        m = g.groupby("budget")[col].mean()
        ax.plot(m.index, m.values, color=plots.GREY, lw=0.9, zorder=1, label="_nolegend_")
    mk = dict(zip(order, markers))
    sub = data[data.label.isin(group)]
    hue = [o for o in group if o in set(sub.label)]
    if hue:
        sns.lineplot(data=sub, x="budget", y=col, hue="label", style="label", hue_order=hue, style_order=hue,
                     palette=palette, markers=[mk[o] for o in hue], dashes=False, errorbar=("ci", 95),
                     seed=seed, ax=ax, legend=legend)
    ax.xaxis.set_major_formatter(plt.FuncFormatter(percent_tick))


def _policy_groups(data, order):
    return plots.chunks([o for o in order if o in set(data.label)]) or [list(order)]


def fig_qevict_fmm(summary: pd.DataFrame, order, palette, markers, seed: int):
    """Future Missed Mass against the budget, on windows held quantized (left) and on windows not
    readable (right), per policy with 95% intervals over documents, at most six policies per row of
    panels (the others in grey); ``summary`` without the full cache."""
    groups = _policy_groups(summary, order)
    fig, axes = plots.subplots(len(groups), 2, height=3.3 * len(groups) + 0.8, squeeze=False, sharey=True,
                               sharex=True)
    for row, group in zip(axes, groups):
        for ax, col, title in ((row[0], "fmm_quantized", "held quantized"),
                               (row[1], "fmm_evicted", "not readable\n(evicted / offloaded)")):
            _budget_lines(ax, summary, col, order, palette, markers, seed, group=group)
            ax.set_title(f"FMM on windows {title}", fontsize=plots.SMALL_PT + 1)
            ax.set_ylabel("Future Missed Mass")
            ax.get_legend().remove()
        row[1].legend(*row[1].get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.02, 1.0),
                      fontsize=plots.SMALL_PT)
    for ax in axes[-1]:
        ax.set_xlabel("budget (fraction of\nfull-cache bytes)")
    return fig


def fig_qevict_outcomes(summary: pd.DataFrame, order, palette, markers, seed: int):
    """KL, perplexity change, top-1 agreement and needle accuracy (rows) against the budget, per policy,
    at most six policies per column (the others in grey); ``summary`` with the full cache, whose needle
    accuracy is the dotted line."""
    sp = summary[summary.policy != "full"]
    groups = _policy_groups(sp, order)
    panels = [("kl", "KL(full ‖ policy)\nper token [nats]", sp),
              ("dppl", "perplexity change\nvs full cache", sp),
              ("top1", "top-1 agreement\nwith full cache", sp),
              ("needle_acc", "needle retrieval\naccuracy", sp[sp.document.str.startswith("needle:")])]
    fig, axes = plots.subplots(len(panels), len(groups), height=2.5 * len(panels) + 1.0, squeeze=False,
                               sharex=True, sharey="row")
    full_needle = summary[(summary.policy == "full") & summary.document.str.startswith("needle:")].needle_acc
    for row, (col, lab, data) in zip(axes, panels):
        for ax, group in zip(row, groups):
            if data[col].notna().any():
                _budget_lines(ax, data, col, order, palette, markers, seed, legend=False, group=group)
            else:
                ax.xaxis.set_major_formatter(plt.FuncFormatter(percent_tick))
            ax.set_ylabel("")
            if col == "needle_acc":
                ax.axhline(full_needle.mean(), color="k", ls=":", lw=1, label="full cache")
        row[0].set_ylabel(lab, fontsize=plots.SMALL_PT + 1)
        if col == "kl":
            for ax in row:
                ax.set_yscale("log")
    for ax, group in zip(axes[0], groups):  # each column's policies in a legend above it
        handles = [plt.Line2D([], [], color=palette[o], marker=dict(zip(order, markers))[o], lw=1.5, label=o)
                   for o in group]
        ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=1,
                  fontsize=plots.SMALL_PT)
    for ax in axes[-1]:
        ax.set_xlabel("budget (fraction of\nfull-cache bytes)", fontsize=plots.SMALL_PT + 1)
    return fig


def fig_qevict_forest(rule_table: pd.DataFrame, n_documents: int, labels: dict | None = None):
    """The declared QEvict rule on the default run: :func:`_forest` of QEvict-recall vs every
    (baseline, budget) pair."""
    return _forest(rule_table, f"QEvict-recall vs baselines, {n_documents} documents", labels)


def fig_qevict_main_forest(rule_table: pd.DataFrame, n_units: int, labels: dict | None = None):
    """The declared QEvict rule on the main comparison at long context (units: document, model)."""
    return _forest(rule_table,
                   f"QEvict-recall vs baselines at long context, {n_units} (document, model) units", labels)


def fig_qevict_lir_gain(table: pd.DataFrame, colour, label_top: int | None = None):
    """Per document, the KL gain of recall over MiKV against the document's Global LIR (``table``:
    ``lir`` and ``kl_gain`` by document, from ``metrics.lir_gain_correlation``); every point annotated,
    or with ``label_top`` only the points of largest absolute gain (many units would overlap)."""
    fig, ax = plots.subplots(height=4.4, width=6.4)
    ax.scatter(table.lir, table.kl_gain, color=colour)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlabel("Global LIR of the document")
    ax.set_ylabel("KL(MiKV) − KL(QEvict-recall) [nats]")
    lab = table if label_top is None else table.loc[table.kl_gain.abs().nlargest(label_top).index]
    plots.place_labels(ax, lab.lir.to_numpy(), lab.kl_gain.to_numpy(), [str(d) for d in lab.index])
    return fig


TIER_NAMES = {"bytes_full_per_token": "full precision (device)",
              "bytes_quantized_per_token": "quantized (device)",
              "bytes_cold_per_token": "cold copy (DRAM/SSD)"}


def tier_bytes_long(tier_bytes: pd.DataFrame) -> pd.DataFrame:
    """``Experiment.tier_bytes()`` without the full cache, one row per (policy, budget, tier)."""
    tb = tier_bytes[tier_bytes.policy != "full"]
    long = tb.melt(id_vars=["label", "budget"], value_vars=list(TIER_NAMES), var_name="tier",
                   value_name="bytes_per_token")
    long["tier"] = long.tier.map(TIER_NAMES)
    return long


def fig_qevict_tier_bytes(tier_bytes: pd.DataFrame, order, palette):
    """Bytes per token of context held per tier, per policy (panels) and budget (bars)."""
    long = tier_bytes_long(tier_bytes)
    cols = [o for o in order if o in set(long.label)]
    nrow, ncol = plots.panel_grid(len(cols), 3)
    fig, axes = plots.subplots(nrow, ncol, height=2.2 * nrow + 0.8, squeeze=False, sharex=True, sharey=True)
    budgets = sorted(long.budget.unique())
    tiers = list(TIER_NAMES.values())
    w = 0.8 / len(tiers)
    for ax, lab in zip(axes.flat, cols):
        d = long[long.label == lab]
        for k, tier in enumerate(tiers):
            v = d[d.tier == tier].groupby("budget").bytes_per_token.mean().reindex(budgets)
            ax.bar(np.arange(len(budgets)) + (k - (len(tiers) - 1) / 2) * w, v.to_numpy(), width=w,
                   color=list(palette)[k], label=tier)
        ax.set_title("\n".join(_wrap(lab)), fontsize=plots.SMALL_PT)
        ax.set_xticks(range(len(budgets)), [f"{b:.0%}" for b in budgets], fontsize=plots.SMALL_PT)
        ax.tick_params(axis="y", labelsize=plots.SMALL_PT)
    for ax in list(axes.flat)[len(cols):]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("bytes per token")
    for ax in axes[-1]:
        ax.set_xlabel("budget")
    plots.legend_below(fig, ncol=3)
    return fig


def _wrap(label: str, width: int = 22) -> list:

    return textwrap.wrap(label, width) or [label]
