"""Chapter 4's figures for issue 14 (forest plot of the declared rule, Pareto fronts, drift against
its null, results per genre), so the chapter stays thin."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..plots import LINESTYLES
from .policies import POLICY_LABELS

OUTCOME_COLORS = {"better": "#1b9e77", "not worse": "#7fc97f", "unclear": "#999999", "worse": "#d95f02",
                  "not testable": "#cccccc"}


def forest_plot(rule_table: pd.DataFrame, title: str = ""):
    """KL ratio QEvict / baseline (geometric mean over documents) with its Holm-level interval, one
    row per (baseline, budget), coloured by the rule's outcome; the 10% non-inferiority margin dotted."""
    import matplotlib.pyplot as plt

    t = rule_table.sort_values(["baseline", "budget"]).reset_index(drop=True)
    n = len(t)
    fig, ax = plt.subplots(figsize=(7.0, 0.2 * n + 1.4))
    y = np.arange(n)[::-1]
    for yi, (_, r) in zip(y, t.iterrows()):
        c = OUTCOME_COLORS.get(r.outcome, "k")
        if np.isfinite(r.get("lo", np.nan)):
            ax.plot([r.lo, r.hi], [yi, yi], color=c, lw=2)
        ax.plot(r.ratio, yi, "o", color=c, ms=4)
    ax.axvline(1, color="k", lw=0.8)
    ax.axvline(1.10, color="k", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yticks(y, [f"{POLICY_LABELS.get(b, b)} @ {f:.0%}" for b, f in zip(t.baseline, t.budget)],
                  fontsize=7)
    ax.set_xlabel("KL(QEvict) / KL(baseline), geometric mean over documents\n(log scale; < 1: QEvict better)",
                  fontsize=8)
    handles = [plt.Line2D([], [], color=c, lw=2, label=k) for k, c in OUTCOME_COLORS.items()
               if k in set(t.outcome)]
    ax.legend(handles=handles, loc="lower right", fontsize=7, title="outcome (Holm)", title_fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def pareto_plot(ptab: pd.DataFrame, palette: dict, markers: dict):
    """Two views of the three-way trade-off (on-device bytes, recall bytes per step, KL): KL against
    the on-device share (left) and against the recall traffic (right); the points not dominated on
    all three are outlined and joined per panel by their two-way front."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8.2, 4.8), sharey=True)
    views = ((axes[0], "device_frac", "on-device bytes\n(fraction of the full cache, mean over steps)"),
             (axes[1], "recall_bytes_per_step", "recall traffic per decoding step\n[bytes] (symlog)"))
    for ax, x, xl in views:
        for lab, d in ptab.groupby("label"):
            ax.scatter(d[x], d.kl, color=palette.get(lab, "k"), marker=markers.get(lab, "o"), s=36,
                       edgecolor=np.where(d.pareto, "k", "none"), linewidth=1.2, label=lab, zorder=3)
        pts = ptab[[x, "kl"]].values
        from .metrics import pareto_mask

        fr = ptab[pareto_mask(pts)].sort_values(x)
        ax.step(fr[x], fr.kl, where="post", color="k", lw=0.8, ls="--", zorder=2)
        ax.set_xlabel(xl, fontsize=8)
        ax.set_yscale("log")
    axes[1].set_xscale("symlog", linthresh=1e3)
    axes[0].set_ylabel("KL(full ‖ policy) per token [nats],\nmean over documents", fontsize=8)
    h, lab = axes[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=4, fontsize=7, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.17, 1, 1))
    return fig


def drift_null_plot(drift: pd.DataFrame):
    """Per document, each drift statistic in decoding order against its shuffled-order null."""
    import matplotlib.pyplot as plt

    stats = [("miss", "far-pair missed share\n(declared statistic)"), ("global_lir", "Global LIR"),
             ("budget_lir", "budget-relative LIR")]
    fig, axes = plt.subplots(1, 3, figsize=(8.2, 0.35 * len(drift) + 2.0), sharey=True)
    y = np.arange(len(drift))[::-1]
    for ax, (k, lab) in zip(axes, stats):
        ax.errorbar(drift[f"{k}_null_mean"], y, xerr=2 * drift[f"{k}_null_sd"], fmt="s", color="#999999",
                    ms=4, label="shuffled order (mean ± 2 sd)")
        ax.plot(drift[f"{k}_observed"], y, "o", color="#d95f02", ms=5, label="decoding order")
        ax.set_xlabel(lab, fontsize=8)
    axes[0].set_yticks(y, drift.document, fontsize=8)
    axes[0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def genre_heatmap(summary: pd.DataFrame, policy: str, baselines, labels: dict):
    """Geometric-mean KL ratio policy / baseline per genre (rows) and baseline (columns), over
    budgets and the genre's documents."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    k = summary.pivot_table(index=["genre", "document", "budget"], columns="policy", values="kl")
    rows = []
    for b in baselines:
        if b not in k or policy not in k:
            continue
        lr = np.log((k[policy] + 1e-6) / (k[b] + 1e-6)).rename("lr").reset_index()
        for g, d in lr.groupby("genre"):
            rows.append(dict(genre=labels.get(g, g), baseline=POLICY_LABELS.get(b, b),
                             ratio=float(np.exp(d.lr.mean()))))
    t = pd.DataFrame(rows).pivot(index="genre", columns="baseline", values="ratio")
    fig, ax = plt.subplots(figsize=(min(0.55 * t.shape[1] + 2.6, 8.2), 0.5 * t.shape[0] + 2.2))
    sns.heatmap(np.log2(t), annot=t.map(lambda v: f"{v:.2f}"), fmt="", cmap="RdBu_r", center=0, ax=ax,
                cbar_kws={"label": "log2 KL ratio (blue: QEvict better)"}, annot_kws={"fontsize": 7})
    ax.set_xlabel("")
    ax.set_ylabel("")
    ax.tick_params(axis="x", labelrotation=60, labelsize=7)
    fig.tight_layout()
    return fig, t


def long_kl_plot(long_table: pd.DataFrame, palette: dict, markers: dict):
    """KL against the budget for every policy, one panel per committed long run (mean over its
    documents): the committed long-context table (``longview.long_results``) as a figure, whose full
    table the chapter offers as a CSV download."""
    import matplotlib
    import matplotlib.pyplot as plt

    runs = list(dict.fromkeys(long_table.run))
    n = len(runs)
    ncol = min(n, 2)
    nrow = int(np.ceil(n / ncol))
    below = n % ncol == 0  # the legend below the panels, or in the one left empty
    size = (8.2 if ncol > 1 else 6.0, 3.6 * nrow + (1.0 if below else 0.2))
    fig, axes = plt.subplots(nrow, ncol, figsize=size, squeeze=False, sharey=True)
    # the book's second cue (plots.LINESTYLES): the k-th policy with a given colour gets line style k
    uses, style = {}, {}
    for lab in dict.fromkeys(long_table.label):
        c = matplotlib.colors.to_rgba(palette.get(lab, "k"))
        style[lab] = LINESTYLES[uses.get(c, 0) % len(LINESTYLES)]
        uses[c] = uses.get(c, 0) + 1
    for ax, run in zip(axes.flat, runs):
        d = long_table[long_table.run == run]
        for lab, g in d.groupby("label", sort=False):
            g = g.sort_values("budget")
            ax.plot(g.budget, g.KL, marker=markers.get(lab, "o"), color=palette.get(lab, "k"), ms=4, lw=1,
                    ls=style[lab], label=lab)
        ctx = int(d.context_tokens.max())
        ax.set_title(f"{run}\n{d.model.iloc[0]}, {ctx:,} tokens", fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("budget (fraction of full-cache bytes)", fontsize=8)
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x:.0%}"))
    spare = list(axes.flat)[n:]
    for ax in spare:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("KL(full ‖ policy) per token [nats]", fontsize=8)
    h, lab = axes[0, 0].get_legend_handles_labels()
    if not below:
        spare[0].legend(h, lab, loc="center", ncol=2, fontsize=7, frameon=False)
        fig.tight_layout()
    else:
        fig.legend(h, lab, loc="lower center", ncol=4, fontsize=7, bbox_to_anchor=(0.5, 0.0))
        fig.tight_layout(rect=(0, 0.9 / (3.6 * nrow + 1.0) + 0.12, 1, 1))
    return fig
