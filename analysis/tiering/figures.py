"""Figures of chapter 2 (``book/02_ssd_offload.md``), one function per figure, named after the
figure's label (``fig-hit-curve`` -> :func:`fig_hit_curve`), each returning its Figure on the book's
theme (:mod:`analysis.plots`). The data come from :mod:`analysis.tiering.chapter` and the library."""
from __future__ import annotations

import textwrap

import matplotlib.ticker as mticker
import numpy as np
import seaborn as sns
from matplotlib.colors import TwoSlopeNorm

from .. import plots
from ..report import fmt_bytes
from . import datapath as dpath
from . import loadcompute as lc
from . import tiers as tiering


def _bytes_per_s(x, _pos):
    return fmt_bytes(x) + "/s"


def _bytes(x, _pos):
    return fmt_bytes(x)


def fig_hit_curve(tr, hc, h: dict):
    """Token- and block-weighted LRU hit curves, the sampled policies, the HBM/3M/50M reference lines
    and the infinite-cache bound (``h``: :func:`analysis.tiering.chapter.hit_curve`)."""
    fig, ax = plots.subplots(height=4.6)
    ax.plot(h["caps_tok"], h["curve_tok"], color=plots.PALETTE[0], lw=2, label="LRU, token-weighted")
    ax.plot(h["caps_tok"], h["curve_blk"], color=plots.PALETTE[0], lw=1.2, ls="--",
            label="LRU, block-weighted")
    for i, (p_name, g) in enumerate(h["policies"].groupby("policy")):
        ax.plot(g["capacity_blocks"] * tr.block_size, g["token_hit_rate"], marker=plots.MARKERS[i + 1], ls="",
                color=plots.PALETTE[i + 1], ms=7,
                label=f"{p_name.upper() if p_name == 'lfu' else 'Belady, the offline bound'} (sampled)")
    ax.axhline(hc.infinite_token_hit_rate, color="grey", lw=1)
    _hit_rate_axes(ax, ((h["hbm_tok"], "HBM of one instance"), (h["local_dram"], "Mooncake: local DRAM 3M"),
                        (h["sat_pub"], "Mooncake: ~50M")), ylabel="prefix-cache hit rate",
                   top=max(0.05, hc.infinite_token_hit_rate * 1.15))
    plots.legend_below(fig, ncol=2)
    return fig


def _hit_rate_axes(ax, marks, *, ylabel: str, top: float) -> None:
    """A hit-rate-against-capacity panel's axes: log capacity in tokens, percent hit rate up to ``top``,
    and a dotted vertical line labelled at its foot for each ``(capacity, label)`` of ``marks``."""
    for x, lab in marks:
        ax.axvline(x, ls=":", color="k", lw=1)
        ax.annotate(lab, (x, 0.02), rotation=90, fontsize=plots.SMALL_PT, xytext=(3, 0),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(mticker.EngFormatter(sep=""))
    ax.yaxis.set_major_formatter(mticker.PercentFormatter(1.0))
    ax.set_xlabel("cache capacity (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top)


def fig_load_vs_recompute(models_grid, gpu: str, tp: int, kv_dtype: str, dep, prefix=None):
    """Bandwidth that matches recomputation against prefix length per model, with each tier's
    delivered bandwidth as a horizontal line."""
    prefix = np.unique(np.geomspace(512, 262144, 60).astype(int)) if prefix is None else prefix
    models_grid = list(models_grid)
    groups = plots.chunks(models_grid)
    bws = {m: lc.breakeven_bandwidth(m, gpu, prefix, n_gpus=tp, kv_dtype=kv_dtype) for m in models_grid}
    tiers = tiering.tier_bandwidths(dep)
    fig, axes = plots.subplots(len(groups), 1, height=3.4 * len(groups) + 0.6, squeeze=False, sharex=True,
                               sharey=True)
    for ax, group in zip(axes[:, 0], groups):
        if len(groups) > 1:
            plots.context_lines(ax, prefix, [bws[m] for m in models_grid if m not in group])
        for i, m in enumerate(group):
            ax.plot(prefix, bws[m], label=m, **plots.series_style(i, markevery=12, ms=4, lw=1.3))
        for name, b in tiers.items():
            ax.axhline(b, ls=":", color="k", lw=0.8, label="_nolegend_")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(plots.tokens_formatter())
        ax.yaxis.set_major_formatter(mticker.FuncFormatter(_bytes_per_s))
        ax.set_ylabel("load bandwidth that\nmatches recompute")
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=plots.SMALL_PT)
    axes[-1, 0].set_xlabel("prefix length (tokens)")
    for ax in axes[:, 0]:  # each tier's name right of the panel, at its bandwidth (none over the curves)
        plots.label_right(ax, list(tiers.values()), list(tiers))
    return fig


def fig_load_heatmap(piv):
    """Heat map (log colour) of :func:`analysis.tiering.chapter.requirement_pivot` (GB/s), annotated."""
    fig, ax = plots.subplots(height=0.45 * len(piv) + 1.9)
    annot = piv.map("{:.3g}".format)
    sns.heatmap(np.log10(piv), annot=annot, fmt="", cmap=plots.SEQUENTIAL, ax=ax,
                cbar_kws={"label": "log10 GB/s"}, annot_kws={"fontsize": plots.SMALL_PT})
    ax.set_xlabel("")
    ax.set_ylabel("")
    ax.set_xticklabels([t.get_text().split("-")[0] for t in ax.get_xticklabels()], rotation=30)
    return fig


def fig_data_path(dep, max_drives: int = 48):
    """Delivered NVMe bandwidth against the number of drives on the two data paths."""
    n_drv = np.arange(1, max_drives + 1)
    fig, ax = plots.subplots(height=4.2)
    for i, path in enumerate(("gpu_direct", "cpu_bounce")):
        bw = [tiering.build_tier("nvme", dep.replace(data_path=path, nvme_drives=int(n))).bandwidth
              for n in n_drv]
        ax.plot(n_drv, np.asarray(bw) / 1e9, label=path.replace("_", " "), **plots.series_style(i, ms=4))
    ax.set_xlabel("NVMe Gen5 drives per instance")
    ax.set_ylabel("delivered bandwidth (GB/s)")
    plots.legend_below(fig)
    return fig


def fig_small_reads(dep, unit_bytes: float, bw_eff: float):
    """Random-read bandwidth of one drive of each kind against the read size; a dotted line at the
    recall unit ``unit_bytes``."""
    sizes = np.geomspace(512, 1 << 20, 40)
    fig, ax = plots.subplots(height=4.2)
    for i, (lab, name) in enumerate((("NVMe Gen5 TLC", dep.nvme_name), ("QLC", dep.qlc_name),
                                     ("AI SSD (seed)", dep.ai_ssd_name))):
        ax.plot(sizes, dpath.random_read_bandwidth(name, sizes, bw_eff=bw_eff) / 1e9, label=lab,
                **plots.series_style(i, markevery=6))
    ax.axvline(unit_bytes, ls=":", color="k", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per random read")
    ax.xaxis.set_major_formatter(mticker.FuncFormatter(_bytes))
    ax.set_ylabel("delivered GB/s per drive")
    plots.legend_below(fig)
    return fig


def fig_pareto(pp, front, slo_ttft_s: float):
    """Cluster cost against p90 TTFT per configuration and cluster size, the Pareto front circled
    (``pp``, ``front``: :func:`analysis.tiering.chapter.pareto`)."""
    labels = list(dict.fromkeys(pp["label"]))
    groups = plots.chunks(labels)
    fig, axes = plots.subplots(len(groups), 1, height=3.4 * len(groups) + 0.6, squeeze=False, sharex=True,
                               sharey=True)
    for ax, group in zip(axes[:, 0], groups):
        for lab, g in pp.groupby("label", sort=False):
            if lab not in group:
                ax.plot(g["cluster_usd_per_mtok"], g["ttft_p90_s"], color=plots.GREY, lw=0.9, zorder=1,
                        label="_nolegend_")
        for i, lab in enumerate(group):
            g = pp[pp["label"] == lab]
            ax.plot(g["cluster_usd_per_mtok"], g["ttft_p90_s"], label=textwrap.fill(lab, 24),
                    **plots.series_style(i, lw=1))
        f = pp.loc[front]
        f = f[f["label"].isin(group)]
        ax.scatter(f["cluster_usd_per_mtok"], f["ttft_p90_s"], s=140, facecolors="none", edgecolors="k",
                   lw=1.2, zorder=5, label="Pareto front")
        ax.axhline(slo_ttft_s, ls="--", color="k", lw=0.8, label="_nolegend_")
        ax.set_yscale("log")
        ax.set_ylabel("p90 TTFT (s)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=plots.SMALL_PT)
    axes[-1, 0].set_xlabel("cluster cost (USD per million input tokens)")
    plots.tidy_log_ticks(fig)
    return fig


def fig_writes(wr):
    """TB written per tier per hour (bars) and, for the SSD tiers, DWPD used against rated (markers,
    top axis) (``wr``: :func:`analysis.tiering.chapter.write_table`)."""
    fig, ax = plots.subplots(height=0.5 * len(wr) + 2.4, width=6.4)
    lab = wr["label"].astype(str) + "\n→ " + wr["tier"].astype(str)
    ax.barh(lab, wr["tb_written_per_h"], color=plots.PALETTE[0])
    ax.set_xlabel("TB written per hour (cluster-wide)")
    ssd = wr[wr["dwpd_rated"].notna()]
    ax2 = ax.twiny()
    ax2.scatter(ssd["dwpd_used_busy"], lab[ssd.index], color=plots.PALETTE[3], marker="o", label="DWPD used")
    ax2.scatter(ssd["dwpd_rated"], lab[ssd.index], color="k", marker="|", s=200, label="DWPD rated")
    dwpd = ssd[["dwpd_used_busy", "dwpd_rated"]].to_numpy(dtype=float)
    if (dwpd > 0).any():  # a small trace may write nothing to any drive: no log axis without data
        ax2.set_xscale("log")
    ax2.set_xlabel("drive writes per day (per busy instance)")
    ax2.grid(False)
    plots.legend_below(fig, *ax2.get_legend_handles_labels(), ncol=2)
    plots.tidy_log_ticks(fig)
    return fig


def fig_admission(acost):
    """Hit rate and TB written per hour against store capacity for each eviction + admission run
    (``acost``: :func:`analysis.tiering.chapter.admission`'s costs)."""
    col = "label" if "label" in acost else "run"  # offline pairs labelled as the offline bound
    runs = list(dict.fromkeys(acost[col]))
    groups = plots.chunks(runs)
    fig, axes = plots.subplots(len(groups), 2, height=3.3 * len(groups) + 0.4, squeeze=False, sharex=True)
    for row, group in zip(axes, groups):
        for run, g in acost.groupby(col, sort=False):
            if run in group:
                kw = dict(label=run, **plots.series_style(group.index(run)))
            else:
                kw = dict(color=plots.GREY, lw=0.9, zorder=1, label="_nolegend_")
            row[0].plot(g["capacity (M tokens)"], g["token_hit_rate"], **kw)
            row[1].plot(g["capacity (M tokens)"], g["tb_written_per_h"], **kw)
        row[0].yaxis.set_major_formatter(mticker.PercentFormatter(1.0))
        row[0].set_ylabel("prefix-cache hit rate")
        row[1].set_ylabel("TB written per hour")
        row[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=plots.SMALL_PT)
    for ax in axes.flat:
        ax.set_xscale("log")
    for ax in axes[-1]:
        ax.set_xlabel("store capacity (M tokens)")
    return fig


def fig_routing(rrows, routing_policies, routing_load_scales):
    """Hit rate against the number of instances per router (solid at the lowest load scale; dashed at
    the highest where it differs) and of the pooled store
    (``rrows``: :func:`analysis.tiering.chapter.routing`)."""
    scales = sorted(set(routing_load_scales))
    pooled = rrows[rrows.policy == "pooled store"]
    at = {ls_: set(rrows.policy[rrows.load_scale == ls_]) for ls_ in scales}
    panels = [(ls_, [p for p in routing_policies if p in at[ls_]]) for ls_ in scales]
    panels = [(ls_, pols) for ls_, pols in panels if pols]
    fig, axes = plots.subplots(1, len(panels), height=4.4, squeeze=False, sharey=True)
    for ax, (ls_, pols) in zip(axes[0], panels):
        # the pooled store first, thick and light, so that no router's line hides under it
        ax.plot(pooled["n_instances"], pooled["token_hit_rate"], color="0.55", lw=5, alpha=0.5, zorder=1,
                solid_capstyle="round", label="pooled store (RDMA)")
        for pol_name in pols:
            i = list(routing_policies).index(pol_name)
            g = rrows[(rrows.policy == pol_name) & (rrows.load_scale == ls_)]
            ax.plot(g["n_instances"], g["token_hit_rate"], zorder=3, label=pol_name,
                    **plots.series_style(i, ms=6 - i * 0.6))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("instances N")
        ax.set_title(f"load ×{ls_:g}", fontsize=plots.SMALL_PT + 2)
        ax.yaxis.set_major_formatter(mticker.PercentFormatter(1.0))
    axes[0, 0].set_ylabel("prefix-cache hit rate")
    plots.legend_below(fig, ncol=3)
    return fig


def _delta_map(delta, xticks, yticks, figsize, contour_always: bool):
    """A diverging map of cost differences centred on zero, with the break-even contour."""
    fig, ax = plots.subplots(height=figsize[1], width=figsize[0])
    lo, hi = float(np.nanmin(delta)), float(np.nanmax(delta))
    norm = TwoSlopeNorm(vcenter=0.0, vmin=min(lo, -1e-9), vmax=max(hi, 1e-9))
    nx, ny = len(xticks), len(yticks)
    im = ax.pcolormesh(np.arange(nx + 1), np.arange(ny + 1), delta, cmap=plots.DIVERGING, norm=norm,
                       shading="flat")
    if contour_always or lo < 0 < hi:
        ax.contour(np.arange(nx) + 0.5, np.arange(ny) + 0.5, delta, levels=[0.0], colors="k", linewidths=1.5)
    step = max(1, -(-nx // 10))  # at most ten price labels, upright (no two overlap)
    ax.set_xticks(np.arange(nx) + 0.5, [f"{p:g}" if k % step == 0 else "" for k, p in enumerate(xticks)])
    ax.set_yticks(np.arange(ny) + 0.5, [f"{b:g}" for b in yticks])
    ax.set_xlabel("SSD price (USD/TB)")
    fig.colorbar(im, ax=ax, label="Δ USD per million input tokens (SSD tier − DRAM only)")
    return fig, ax


def fig_breakeven(delta, prices, bws):
    """Busy-cost difference of DRAM + NVMe against DRAM alone over SSD price and per-drive bandwidth
    (``delta``: :func:`analysis.tiering.replay.breakeven_grid`)."""
    fig, ax = _delta_map(delta, prices, bws, (7.5, 5), contour_always=True)
    ax.set_ylabel("read bandwidth per drive (GB/s)")
    return fig


def fig_endurance_map(eg, prices, dwpd_grid):
    """Busy-cost difference of DRAM + NVMe against DRAM alone over SSD price and endurance
    (``eg``: :func:`analysis.tiering.replay.endurance_grid`)."""
    fig, ax = _delta_map(eg, prices, dwpd_grid, (7.5, 4.5), contour_always=False)
    ax.set_ylabel("endurance (drive writes per day)")
    return fig


def fig_tornado(torn, base: float, tornado_config: str):
    """Busy cost at each input's low and high value around the default ``base``, largest swing on top
    (``torn``: :func:`analysis.tiering.replay.tornado`)."""
    rows = list(reversed(torn))
    fig, ax = plots.subplots(height=0.42 * len(rows) + 1.8, width=6.0)
    y = np.arange(len(rows))
    ax.barh(y, [r["cost_low"] - base for r in rows], left=base, color=plots.PALETTE[0], label="low value")
    ax.barh(y, [r["cost_high"] - base for r in rows], left=base, color=plots.PALETTE[3], alpha=0.8,
            label="high value")
    ax.axvline(base, color="k", lw=1)
    ax.set_yticks(y, [r["input"] for r in rows])
    ax.set_xlabel(f"busy cost, USD per million input tokens ({tiering.CONFIGS[tornado_config][0]})")
    plots.legend_below(fig, ncol=2)
    return fig


def fig_fig10(f):
    """Mooncake's Figure 10 against its replay, per trace: token hit rate of the local caches and the
    global pool (top), and the global / local ratios of hit rate and mean prefill time (bottom); paper
    solid, replay hatched (``f``: :func:`analysis.tiering.chapter.fig10`'s table). A trace that could
    not be computed shows only the paper's bars."""
    fig, axes = plots.subplots(2, 1, height=5.6, sharex=True)
    x = np.arange(len(f))
    w = 0.2
    series = [  # (column, label, colour, hatch)
        [("pub_local_hit", "paper: local caches", 0, ""), ("pub_global_hit", "paper: global pool", 1, ""),
         ("local_hit", "replay: local caches", 0, "//"), ("global_hit", "replay: global pool", 1, "//")],
        [("pub_hit_ratio", "paper: hit-rate ratio", 2, ""), ("hit_ratio", "replay: hit-rate ratio", 2, "//"),
         ("pub_prefill_ratio", "paper: prefill-time ratio", 4, ""),
         ("prefill_ratio", "replay: prefill-time ratio", 4, "//")],
    ]
    for ax, ser in zip(axes, series):
        for k, (col, lab, ci, hatch) in enumerate(ser):
            vals = f[col].astype(float) if col in f else np.full(len(f), np.nan)
            ax.bar(x + (k - 1.5) * w, vals, w, label=lab, color=plots.PALETTE[ci] if not hatch else "white",
                   edgecolor=plots.PALETTE[ci], hatch=hatch, lw=1.0)
    done = f["local_hit"].notna() if "local_hit" in f else np.zeros(len(f), dtype=bool)
    axes[1].set_xticks(x, [t if ok else f"{t}\n(no trace file: paper only)"
                           for t, ok in zip(f["trace"], done)])
    axes[0].yaxis.set_major_formatter(mticker.PercentFormatter(1.0))
    axes[0].set_ylabel("token hit rate")
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].set_ylabel("global / local")
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    plots.legend_below(fig, handles, labels, ncol=2)
    return fig



def fig_vllm_offload(f: dict):
    """vLLM's KV offloading connector (blog post of 2026-01-08) against the chapter's models
    (``f``: :func:`analysis.tiering.chapter.vllm_offload`): left, single-request TTFT over the prompt
    length, recomputed or loaded from CPU memory; right, throughput of 512-token prefills over the CPU
    hit rate. Published points as markers (none in another setting); the model's overlap rule solid, the
    load added to the compute dashed."""
    fig, (a1, a2) = plots.subplots(1, 2, height=3.3)
    t, p = f["ttft"], f["tput"]
    a1.plot(t["prompt_k"], t["recompute_s"], color=plots.PALETTE[0], lw=1.5, label="model: recompute")
    a1.plot(t["prompt_k"], t["load_ttft_s"], color=plots.PALETTE[1], lw=1.5, label="model: load (overlapped)")
    a1.plot(t["prompt_k"], t["load_ttft_serial_s"], color=plots.PALETTE[1], lw=1.2, ls="--",
            label="model: load (added)")
    a1.plot(t["prompt_k"], t["pub_compute_s"], "o", color=plots.PALETTE[0], ms=5, label="blog: GPU compute")
    a1.plot(t["prompt_k"], t["pub_load_s"], "s", color=plots.PALETTE[1], ms=5, label="blog: load from CPU")
    a1.set_yscale("log")
    a1.set_xlabel("prompt length (K tokens)")
    a1.set_ylabel("TTFT (s)")
    a2.plot(p["hit_pct"], p["tokens_per_s"], color=plots.PALETTE[2], lw=1.5,
            label="model: throughput (overlapped)")
    a2.plot(p["hit_pct"], p["tokens_per_s_serial"], color=plots.PALETTE[2], lw=1.2, ls="--",
            label="model: throughput (added)")
    a2.plot(p["hit_pct"], p["pub_tokens_per_s"], "D", color=plots.PALETTE[2], ms=5,
            label="blog: with offloading")
    if np.isfinite(f["pub"]["baseline"]) and p["pub_tokens_per_s"].notna().any():
        a2.axhline(f["pub"]["baseline"], color=plots.PALETTE[7], lw=1.0, ls=":",
                   label="blog: without offloading")
    a2.set_yscale("log")
    a2.set_yticks([3e4, 5e4, 1e5, 2e5, 4e5])
    a2.yaxis.set_major_formatter(mticker.FuncFormatter(lambda x, _p: f"{x / 1e3:,.0f}K"))
    a2.yaxis.set_minor_formatter(mticker.NullFormatter())
    a2.set_xlabel("CPU hit rate (%)")
    a2.set_ylabel("prompt tokens/s")
    for ax in (a1, a2):
        ax.grid(True, which="major", alpha=0.3)
    plots.legend_below(fig, ncol=3)
    return fig


def fig_agent_hit_curves(cmp: dict):
    """Token-weighted LRU hit rate against capacity of the chapter's trace and of each LMCache agent
    family, with the HBM left for KV on one instance and Mooncake's 3M-token local DRAM (``cmp``:
    :func:`analysis.tiering.agents.compare`)."""
    fig, ax = plots.subplots(height=4.0)
    for i, (name, (caps, rate)) in enumerate(cmp["curves"].items()):
        ax.plot(caps, rate, color=plots.PALETTE[i], lw=2 if i == 0 else 1.6, ls="-" if i == 0 else "--",
                label=name)
    marks = ((cmp["hbm_tok"], "HBM of one instance"), (cmp["local_dram"], "Mooncake: local DRAM 3M"))
    _hit_rate_axes(ax, marks, ylabel="prefix-cache hit rate (tokens)", top=1)
    plots.legend_below(fig, ncol=2)
    return fig
