"""Chapter 3's figures, one function per figure, named after its label (``fig-disagg-heatmap`` ->
:func:`fig_disagg_heatmap`); each returns the matplotlib Figure. The chapter gives each its name and
caption (``mystnb: figure:`` cell metadata) and computes nothing here: the data come from
:mod:`.study` and :mod:`.chapter`."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.lines import Line2D

from .. import plots
from . import search as S

MODE_ORDER = list(S.MODES)
MODE_COLORS = dict(zip(MODE_ORDER, plots.PALETTE))
ROLE_COLORS = {"C": plots.PALETTE[0], "P": plots.PALETTE[1], "D": plots.PALETTE[2], "A": plots.PALETTE[3],
               "F": plots.PALETTE[4], "PA": plots.PALETTE[5], "PF": plots.PALETTE[6], "DA": plots.PALETTE[8],
               "DF": plots.PALETTE[9]}


def fig_disagg_validation(test: pd.DataFrame):
    """Predicted against measured TPOT and TTFT of the held-out runs (``chapter.held_out``), log-log,
    with the diagonal and a ±30% band."""
    fig, axes = plots.subplots(1, 2, height=4.4)
    for ax, m, lab in [(axes[0], "tpot", "TPOT (ms)"), (axes[1], "ttft", "TTFT (ms)")]:
        for mode, mk, col in [("agg", "o", plots.PALETTE[0]), ("disagg", "s", plots.PALETTE[1])]:
            d = test[test["mode"] == mode]
            ax.scatter(d[f"silicon_{m}_ms"], d[f"pred_{m}_ms"], s=8, alpha=0.45, marker=mk, color=col,
                       label=f"{'colocated' if mode == 'agg' else 'PD'} ({len(d):,})")
        lo = min(test[f"silicon_{m}_ms"].min(), test[f"pred_{m}_ms"].min())
        hi = max(test[f"silicon_{m}_ms"].max(), test[f"pred_{m}_ms"].max())
        xs = np.array([lo, hi])
        ax.plot(xs, xs, color="k", lw=1)
        ax.fill_between(xs, xs / 1.3, xs * 1.3, color="k", alpha=0.08, lw=0)
        ax.set(xscale="log", yscale="log", xlabel=f"measured {lab}", ylabel=f"predicted {lab}")
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=1, fontsize=plots.SMALL_PT,
                  markerscale=2)
    plots.tidy_log_ticks(fig)
    return fig


def fig_disagg_queueing(curve: pd.DataFrame):
    """Median measured and predicted TTFT per concurrency bin (``chapter.queueing_curve``)."""
    fig, ax = plots.subplots(height=4.2)
    ax.plot(curve.index, curve["silicon_ttft_ms"], "o-", label="measured", color=plots.PALETTE[0])
    ax.plot(curve.index, curve["pred_ttft_ms"], "s--", label="predicted", color=plots.PALETTE[1])
    ax.set(xscale="log", yscale="log", xlabel="client concurrency", ylabel="median TTFT (ms)")
    plots.legend_below(fig, ncol=2)
    return fig


def heatmap_text(speedup: float, feasible: bool, colocated_feasible: bool) -> str:
    """A heatmap cell's text: the speedup, "∞" where only the disaggregated mode meets the SLOs, "–"
    where it meets none."""
    if np.isfinite(speedup):
        return f"{speedup:.2f}"
    return "∞" if bool(feasible) and not bool(colocated_feasible) else "–"


def fig_disagg_heatmap(sweep: pd.DataFrame, models, ratios, hw_sets, modes=("PD", "AF", "3-way", "PDAF"),
                       ncol: int = 2):
    """Speedup of each disaggregated mode over colocated serving, model x ratio, one panel per mode
    and hardware set (``ncol`` modes side by side per set)."""
    modes = list(modes)
    nrow = -(-len(modes) // ncol)
    fig, axes = plots.subplots(nrow * len(hw_sets), ncol,
                               height=(0.3 * len(models) + 0.9) * nrow * len(hw_sets),
                               squeeze=False, sharex=True, sharey=True)
    norm = LogNorm(vmin=0.25, vmax=4)
    for i, hw in enumerate(hw_sets):
        d = sweep[sweep["hardware"] == hw]
        cfeas = d[d["mode"] == "C"].set_index(["model", "ratio"])["feasible"]
        cf = cfeas.unstack("ratio").reindex(index=models, columns=ratios)
        for j, mode in enumerate(modes):
            ax = axes[i * nrow + j // ncol, j % ncol]
            dm = d[d["mode"] == mode]
            piv = dm.pivot(index="model", columns="ratio", values="speedup").reindex(index=models,
                                                                                     columns=ratios)
            fm = dm.pivot(index="model", columns="ratio", values="feasible").reindex(index=models,
                                                                                     columns=ratios)
            ax.imshow(piv.to_numpy(dtype=float), cmap=plots.DIVERGING + "_r", norm=norm, aspect="auto")
            for a in range(len(models)):
                for b in range(len(ratios)):
                    ax.text(b, a, heatmap_text(piv.iloc[a, b], fm.iloc[a, b], cf.iloc[a, b]), ha="center",
                            va="center", fontsize=plots.SMALL_PT)
            ax.set_xticks(range(len(ratios)), [f"{r:g}" for r in ratios], fontsize=plots.SMALL_PT)
            ax.set_yticks(range(len(models)), models, fontsize=plots.SMALL_PT)
            ax.grid(False)
            ax.set_title(f"{mode} — {hw}", fontsize=plots.SMALL_PT + 1)
            if i == len(hw_sets) - 1 and j // ncol == nrow - 1:
                ax.set_xlabel("input / output ratio")
        for j in range(len(modes), nrow * ncol):  # an odd number of modes leaves a panel empty
            axes[i * nrow + j // ncol, j % ncol].axis("off")
    return fig


def fig_disagg_heatmap_other(sweep: pd.DataFrame, models, ratios, hw_sets, modes=("AF", "3-way")):
    """The heatmap of :func:`fig_disagg_heatmap` for the modes the chapter's leaves out (its evidence page):
    AF and 3-way, side by side per hardware set."""
    return fig_disagg_heatmap(sweep, models, ratios, hw_sets, modes=modes)


def fig_disagg_ablation(bd: pd.DataFrame, ab: pd.DataFrame, models, ablation_ratios, ablation_model,
                        rho_sweep: float, rho_abl: float):
    """Best disaggregated speedup against the attention share: the sweep's cells (``bd``) and the
    ablation (``ab``), from ``chapter.attention_frames``; ``rho_*``: the pooled correlations."""
    models = list(models)
    groups = plots.chunks(models)
    nrow, ncol = plots.panel_grid(len(groups) + 1, 2)
    fig, axes = plots.subplots(nrow, ncol, height=4.0 * nrow, squeeze=False, sharey=True)
    flat = list(axes.flat)
    for k, (ax, group) in enumerate(zip(flat, groups)):
        for m in models:
            d = bd[bd["model"] == m]
            if m in group:
                st = plots.series_style(group.index(m))
                ax.scatter(d["attention_share"], d["best_disagg"], marker=st["marker"], color=st["color"],
                           label=m, zorder=3)
            else:
                ax.scatter(d["attention_share"], d["best_disagg"], marker=".", color=plots.GREY, zorder=1)
        ax.axhline(1, color="k", lw=0.8)
        ax.set(xlabel="attention share of a decode step", yscale="log")
        part = f", models {k + 1}/{len(groups)}" if len(groups) > 1 else ""
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=plots.SMALL_PT,
                  title=f"sweep (ρ = {rho_sweep:+.2f}){part}", title_fontsize=plots.SMALL_PT + 1)
    for row in axes:
        row[0].set_ylabel("best disaggregated speedup")
    ax = flat[len(groups)]
    rc = dict(zip(ablation_ratios, plots.SERIES_COLORS[3:] + plots.SERIES_COLORS[:3]))
    for (axis, mk) in [("active experts", "o"), ("KV heads", "s")]:
        d = ab[ab["axis"] == axis]
        ax.scatter(d["attention_share"], d["best_disagg"], marker=mk, c=[rc[r] for r in d["ratio"]])
        for _, r in d.iterrows():
            ax.annotate(f"{r['value']:g}", (r["attention_share"], r["best_disagg"]), fontsize=plots.SMALL_PT,
                        xytext=(3, 2), textcoords="offset points")
    ax.axhline(1, color="k", lw=0.8)
    ax.set(xlabel="attention share of a decode step", yscale="log")
    handles = [Line2D([], [], marker="o", ls="", color="grey", label="active experts"),
               Line2D([], [], marker="s", ls="", color="grey", label="KV heads")]
    handles += [Line2D([], [], marker="o", ls="", color=c, label=f"ratio {r:g}") for r, c in rc.items()]
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=plots.SMALL_PT,
              title=f"ablation of {ablation_model} (ρ = {rho_abl:+.2f})", title_fontsize=plots.SMALL_PT + 1)
    for ax in flat[len(groups) + 1:]:
        ax.axis("off")
    return fig


def fig_disagg_pareto(par: pd.DataFrame, title: str):
    """Best throughput per device of each mode against the TPOT SLO (:func:`.study.pareto_fronts`)."""
    fig, ax = plots.subplots(height=4.6)
    for i, mode in enumerate(MODE_ORDER):
        d = par[par["mode"] == mode]
        ax.plot(d["tpot_slo_s"] * 1e3, d["tps_device"], marker=plots.MARKERS[i], ls=plots.LINESTYLES[i % 4],
                color=MODE_COLORS[mode], label=mode)
    ax.set(xscale="log", yscale="log", xlabel="TPOT SLO (ms)", ylabel="output tokens/s per device")
    ax.set_title(title, fontsize=plots.SMALL_PT + 2)
    plots.legend_below(fig, ncol=5)
    return fig


def plan_segments(mode: str, unit: dict, budget: int) -> list:
    """The bar segments of one unit of a plan scaled to ``budget`` devices: (role, devices, label); an
    attention/FFN unit splits into its two roles by their device counts."""
    share = unit["device_share"] * budget
    batch = unit.get("batch", unit.get("pbatch", 0))
    if "n_a" not in unit:
        return [(unit["unit"], share, f"{unit['size']:g}×TP{unit['tp']:g} B={batch:g}")]
    roles = dict(S.MODE_UNITS[mode])[unit["unit"]]
    tot = unit["n_a"] + unit["n_f"]
    return [(roles[0], share * unit["n_a"] / tot,
             f"{unit['n_a']:g}×TP{unit['tp']:g} m={unit['m']:g} B={batch:g}"),
            (roles[1], share * unit["n_f"] / tot, f"{unit['n_f']:g} FFN")]


def fig_disagg_plans(cell: pd.DataFrame, budget: int, title: str):
    """The best plan of each mode (``chapter.focus_cell``) as bars of roles scaled to the budget."""
    fig, ax = plots.subplots(height=0.95 * len(MODE_ORDER) + 1.3)
    px_per_device = 5.6 * plots.FIG_DPI / budget  # the bars' axes are about 5.6 in wide
    for y, mode in enumerate(MODE_ORDER):
        r = cell[cell["mode"] == mode].iloc[0]
        if not r["feasible"]:
            ax.text(0, y, "no feasible plan: " + textwrap.shorten(str(r["reason"]), 70, placeholder="…"),
                    va="center", fontsize=plots.SMALL_PT)
            continue
        left, details = 0.0, []
        for u in json.loads(r["units"]):
            for role, w, lab in plan_segments(mode, u, budget):
                ax.barh(y, w, left=left, height=0.45, color=ROLE_COLORS[role], edgecolor="white")
                # the role inside its segment when it fits; every segment's plan in one line below the bar
                if w * px_per_device > len(role) * plots.SMALL_PT * 0.9 + 6:
                    ax.text(left + w / 2, y, role, ha="center", va="center", fontsize=plots.SMALL_PT)
                details.append(f"{role}: {lab}")
                left += w
        ax.text(0, y + 0.27, "\n".join(textwrap.wrap("   ".join(details), 95)), ha="left", va="top",
                fontsize=plots.SMALL_PT)
    ax.set_yticks(range(len(MODE_ORDER)), MODE_ORDER)
    ax.set_ylim(len(MODE_ORDER) - 0.25, -0.5)
    ax.set(xlabel=f"devices (of a budget of {budget})", xlim=(0, budget))
    ax.set_title(title, fontsize=plots.SMALL_PT + 2)
    ax.grid(False, axis="y")
    return fig
