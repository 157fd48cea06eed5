"""Chapter 5's derived numbers, tables and texts, so that its cells only call, glue and plot.

A function named ``*_row(s)`` returns glued values as ``(name, value, format)`` rows
(``glue(*row)``); the others return what the chapter shows.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from .. import cache, claims, data, kv, report, specs
from ..disagg import search, study
from ..tiering import tiers as tiering_tiers
from . import configure, decide, fidelity, pipeline
from .fidelity import KVPolicy
from .pricing import RandomReadRecall

# ----------------------------------------------------------------------- glue rows


def pct_row(name: str, x: float) -> tuple:
    """A share glued as a whole percentage, 'n/a' when it is not finite."""
    return (name, x, "{:.0%}" if np.isfinite(x) else "n/a")


def range_row(name: str, found: pd.DataFrame, key: str) -> tuple:
    """The lowest and highest value of one finding over the perturbed maps, as 'lo%–hi%'."""
    _, lo, hi = decide.finding_range(found, key)
    return (name, f"{lo:.0%}–{hi:.0%}" if np.isfinite(lo) and np.isfinite(hi) else "n/a", None)


FINDINGS = (
    "share_off_hbm",
    "share_compressed",
    "share_qevict",
    "share_disagg",
    "tier_saving_median",
    "tier_saving_max",
    "total_saving_median",
    "total_saving_max",
    "disagg_saving_max",
    "top_policy_share",
)


def findings_rows(findings: dict, found: pd.DataFrame) -> list:
    """Every share of :data:`FINDINGS` (``ch5_<key>``) and its range over the perturbed maps
    (``ch5_<key>_range``)."""
    rows = []
    for k in FINDINGS:
        rows += [pct_row(f"ch5_{k}", findings[k]), range_row(f"ch5_{k}_range", found, k)]
    return rows


def flip_rows(cells: pd.DataFrame, n_cells: int) -> list:
    """The share of cells whose cheapest option (and layout) flips within the declared ranges, and
    the range that flips most cells."""
    ok = cells.dropna(subset=["usd_per_mtok"])
    flips = (
        cells.loc[cells["flips"], "flipped_by"].str.split("; ").explode().value_counts()
        if cells["flips"].any()
        else pd.Series(dtype=int)
    )
    return [
        ("ch5_flip_share", float(ok["flips"].mean()) if n_cells else np.nan, "{:.0%}"),
        ("ch5_flip_layout_share", float(ok["layout_flips"].mean()) if n_cells else np.nan, "{:.0%}"),
        ("ch5_flip_main", flips.index[0] if len(flips) else "none of them", None),
    ]


# ----------------------------------------------------------------------- tables


def interactive_maps(cells, every, factors, extra_cells, extra_every):
    """The decision map's cells and options at the interactive SSD price ``factors``: those of the
    main map at those factors, then ``extra_cells`` / ``extra_every`` (the map at the others)."""
    keep = np.isin(cells["ssd_price_factor"], factors)
    icells = pd.concat([cells[keep].drop(columns=["flips"]), extra_cells], ignore_index=True)
    ievery = pd.concat([every[np.isin(every["ssd_price_factor"], factors)], extra_every], ignore_index=True)
    return icells, ievery


FIDELITY_PCT = [
    "on-device bytes",
    "cold-tier bytes",
    "recall / step",
    "top-1 agreement",
    "perplexity change",
    "published score ratio",
]
FIDELITY_NAMES = {
    "on-device bytes": "on-device bytes (% of full cache)",
    "cold-tier bytes": "cold-tier bytes (% of full cache)",
    "recall / step": "recall per step (% of full cache)",
    "top-1 agreement": "top-1 agreement (%)",
    "perplexity change": "perplexity change (%)",
    "published score ratio": "published score / full cache's (%)",
}


def _pct_or_dash(x) -> str:
    return f"{x:.1%}" if np.isfinite(x) else "—"


def _kl_or_dash(x) -> str:
    return f"{x:.3f}" if np.isfinite(x) else "—"


def fidelity_display(policies, floor) -> pd.DataFrame:
    """Every KV policy and the AI SSD's in-drive precisions with their bytes, fidelity, evidence and
    whether the floor admits them, formatted for the chapter's table."""
    in_drive = [floor.in_drive_policy(b) for b in sorted(floor.in_drive)]
    fid = fidelity.table(policies)
    fid = pd.concat(
        [
            fid,
            fidelity.table(in_drive).assign(
                policy=[f"AI SSD in-drive int{b}" for b in sorted(floor.in_drive)]
            ),
        ],
        ignore_index=True,
    )
    fid["admitted"] = [floor.admits(p) for p in policies] + [floor.admits(p) for p in in_drive]
    shown = fid.drop(columns=["name", "budget"]).copy()
    for c in FIDELITY_PCT:
        shown[c] = shown[c].map(_pct_or_dash)
    shown["KL (nats)"] = shown["KL (nats)"].map(_kl_or_dash)
    shown["fidelity evidence"] = [
        p.evidence or ("chapter 4, short run" if p.source == "chapter 4" else "—")
        for p in policies + in_drive
    ]
    return shown.rename(columns=FIDELITY_NAMES)


def frontier_summary(cells: pd.DataFrame) -> pd.DataFrame:
    """Where the cheapest tier layout changes, per SSD price (``decide.frontier_changes``)."""
    front = decide.frontier_changes(cells, "layout")
    if front.empty:
        return pd.DataFrame([{"frontier": "none: one layout is cheapest everywhere"}])
    return (
        front.groupby(["ssd_price_factor", "frontier"], sort=False)["where"]
        .agg("; ".join)
        .reset_index()
        .rename(columns={"ssd_price_factor": "SSD price ×"})
    )


def kimi_display(kimi: pd.DataFrame) -> pd.DataFrame:
    """The Kimi Linear comparison with the KV per sequence in GB and units in the column names."""
    shown = kimi.copy()
    shown["KV per sequence"] = (shown["KV per sequence"] / 1e9).map("{:,.1f} GB".format)
    return shown.rename(columns={"batch": "batch (sequences)", "devices": "devices (GPUs)"})


def lookup(values: dict):
    """A ``recompute`` for ``claims.evaluate`` that reads the value already computed at each setting:
    ``lookup({0.5: a, 2.0: b})(name, 0.5) == a``."""

    def recompute(name, setting):
        return values[setting]

    return recompute


# ----------------------------------------------------------------------- sensitivity sweeps


def ai_ssd_price(base, v):
    """The scenario with the AI SSD's price per byte scaled by ``v``."""
    return decide.tiers_scaled(base, ai_ssd_usd_per_byte=v)


def cxl_price(base, v):
    """The scenario with CXL memory's price per byte scaled by ``v``."""
    return decide.tiers_scaled(base, cxl_usd_per_byte=v)


def nvme_bandwidth(base, v):
    """The scenario with every NVMe drive reading ``v`` GB/s."""
    return decide.tiers_scaled(base, nvme_bw_override=v * 1e9)


def ai_ssd_gain(base, v):
    """The scenario with the AI SSD storing ``16 / v`` bits per element (``v``: read-rate gain)."""
    return decide.tiers_scaled(base, ai_ssd_bits=int(round(16 / v)))


def transfer_overhead(base, v):
    """The scenario with disaggregation's KV transfers ``v`` times slower."""
    return base.replace(transfer_overhead=float(v))


class LinearShare:
    """Scenario transformation: ``model`` with a share ``v`` of its full-attention layers linear."""

    def __init__(self, model):
        self.model = model

    def __call__(self, base, v):
        return base.replace(model=decide.with_linear_share(self.model, v))


def sensitivity_sweeps(
    ref,
    model,
    opts,
    reuse,
    floor,
    *,
    price_factors,
    nvme_bw_gb_s,
    ai_ssd_bits_grid,
    linear_shares,
    transfer_overheads,
    sweeps=None,
) -> dict:
    """The six sensitivity sweeps of the chapter around the reference scenario ``ref``: AI-SSD and
    CXL price, NVMe bandwidth, AI-SSD read gain (16 / stored bits) and linear-attention share by
    layout; transfer overhead by deployment mode. ``sweeps``: the names of those to compute (keys of
    :data:`SWEEP_GLUE`; default all): the chapter computes the architecture and disaggregation sweeps
    its verdicts use, its evidence page the device sweeps."""
    sweeps = list(SWEEP_GLUE) if sweeps is None else list(sweeps)
    unknown = sorted(set(sweeps) - set(SWEEP_GLUE))
    if unknown:
        raise ValueError(f"unknown sensitivity sweep(s) {unknown}: choose from {list(SWEEP_GLUE)}")
    gain = sorted({16 / b for b in ai_ssd_bits_grid})
    make = {
        "ai": lambda: decide.sweep(ref, price_factors, ai_ssd_price, opts, reuse, floor),
        "cxl": lambda: decide.sweep(ref, price_factors, cxl_price, opts, reuse, floor),
        "bw": lambda: decide.sweep(ref, nvme_bw_gb_s, nvme_bandwidth, opts, reuse, floor),
        "bits": lambda: decide.sweep(ref, gain, ai_ssd_gain, opts, reuse, floor),
        "lin": lambda: decide.sweep(ref, linear_shares, LinearShare(model), opts, reuse, floor),
        "xfer": lambda: decide.sweep(ref, transfer_overheads, transfer_overhead, opts, reuse, floor,
                                     by="mode"),
    }
    return {k: make[k]() for k in SWEEP_GLUE if k in sweeps}


SWEEP_FORMATS = {
    "ai": "× {:g}",
    "cxl": "× {:g}",
    "bw": "{:g} GB/s",
    "bits": "{:g}×",
    "lin": "{:.0%}",
    "xfer": "{:g}×",
}
SWEEP_GLUE = {
    "ai": "ch5_sens_ai_text",
    "cxl": "ch5_sens_cxl_text",
    "bw": "ch5_sens_bw_text",
    "bits": "ch5_sens_bits_text",
    "lin": "ch5_sens_lin_text",
    "xfer": "ch5_sens_xfer_text",
}


def sweep_rows(sweeps: dict) -> list:
    """One sentence per sweep (``decide.describe_sweep``) on how the cheapest option moves."""
    return [
        (SWEEP_GLUE[k], decide.describe_sweep(sweeps[k], SWEEP_FORMATS[k].format), None)
        for k in SWEEP_GLUE
        if k in sweeps
    ]


def linear_cost_reduction(sweep_lin: pd.DataFrame) -> float:
    """1 - cheapest cost at the largest linear share / at the smallest."""
    best = sweep_lin[sweep_lin["group"] == "best"]["usd_per_mtok"].to_numpy()
    return 1 - float(best[-1]) / float(best[0])


# ----------------------------------------------------------------------- modes, fidelity sources, pricing


def mode_rows(cells: pd.DataFrame, every: pd.DataFrame, modes) -> list:
    """The share of cells each deployment mode wins, how many cells the newly entered modes move
    and what their best option costs above the cell's cheapest."""
    won = decide.mode_shares(cells, modes)
    old = [m for m in modes if m not in decide.NEW_MODES]
    moved = decide.cells_changed(cells, every, old) if old and len(every) else np.nan
    prem = {m: decide.mode_premium(every, m) for m in modes if m in decide.NEW_MODES}
    return [
        ("ch5_modes", ", ".join(modes), None),
        ("ch5_mode_shares", "; ".join(f"{m} {v:.0%}" for m, v in won.items()) if len(won) else "none", None),
        ("ch5_new_modes", ", ".join(m for m in modes if m in decide.NEW_MODES) or "none", None),
        ("ch5_old_modes", ", ".join(old) or "none", None),
        ("ch5_new_mode_moved", moved, "{:.0%}" if np.isfinite(moved) else "n/a"),
        (
            "ch5_new_mode_premium",
            "; ".join(f"{m} {v:.0%}" if np.isfinite(v) else f"{m} never admissible" for m, v in prem.items())
            or "none",
            None,
        ),
        ("ch5_new_mode_text", new_mode_text(old, moved, prem), None),
    ]


def new_mode_text(old_modes, moved: float, premium: dict) -> str:
    """The sentence on the newly entered modes, written from the values (with
    :func:`analysis.report.compare_text`): how many cells they move against the map over ``old_modes``
    only, and, per new mode, its best option's median cost against the cell's cheapest (``premium``:
    mode -> that ratio minus 1)."""
    if not premium:
        return "no newly entered deployment mode is priced"
    new = ", ".join(premium)
    if np.isfinite(moved):
        head = (f"adding {new} to the map over {', '.join(old_modes)} changes the cheapest option in "
                f"{moved:.0%} of the cells")
    else:
        head = f"the map without {new} is not computed, so what {new} changes is not known"
    parts = [f"{m}'s best option is never admissible" if not np.isfinite(v) else
             f"{m}'s best option costs a median {report.compare_text(1.0 + v, 1.0)} the cell's cheapest"
             for m, v in premium.items()]
    return head + "; " + "; ".join(parts)


def long_runs_text(runs, enabled: bool = True) -> str:
    """Chapter 4's committed long-context runs that the fidelity source reads."""
    return "; ".join(
        f"{r['name']} ({r['model']}, {r['context_tokens']:,.0f} tokens"
        + (", stale" if r["stale"] else "")
        + ")"
        for r in runs
    ) or ("none committed" if enabled else "switched off by the parameters")


ROUTING_TEXT = {
    "kv_aware": "to the instance holding the longest cached prefix, capped by load",
    "random": "at random",
    "round_robin": "round robin",
    "prefix_affinity": "by a hash of the prompt's first blocks",
    "ideal": "as if one ideal stack served them all",
}

OLD_PRICING = "before: ideal routing, sequential bandwidth, free writes"
NEW_PRICING = "chapter 2's pricing"


def pricing_comparison(scenario, old_base, reuse, old_reuse, layouts, policies) -> pd.DataFrame:
    """Every off-HBM layout, PD, the full cache and each recalling policy at ``scenario`` (prompt and
    reuse set), priced the old way (``old_base``, ``old_reuse``) and by chapter 2 (``scenario``,
    ``reuse``): realised hits, recall and write time per step, TPOT, wear and cost."""
    recalling = [p for p in policies if p.needs_cold_tier]
    old = old_base.replace(input_tokens=scenario.input_tokens, hit_rate=scenario.hit_rate)
    rows = []
    for lay in [x for x in layouts if x != "hbm"]:
        for lab, b, ru in ((OLD_PRICING, old, old_reuse), (NEW_PRICING, scenario, reuse)):
            for pol in [fidelity.KVPolicy.full()] + recalling:
                r = pipeline.evaluate(b.replace(layout=lay, mode="PD", policy=pol), ru)
                rows.append(
                    {
                        "layout": lay,
                        "policy": pol.label,
                        "pricing": lab,
                        "realised hit rate": r.realized_hit_rate,
                        "recall + writes ms / step": r.recall_s_per_step * 1e3,
                        "TPOT ms": r.tpot_s * 1e3,
                        "wear USD / M tok": r.cold_write_usd_per_mtok,
                        "prefix wear USD / M tok": r.prefix_write_usd_per_mtok,
                        "USD / M tok": r.usd_per_mtok,
                        "feasible": r.feasible,
                    }
                )
    return pd.DataFrame(rows)


def pricing_rows(priced: pd.DataFrame, layout_names: dict) -> list:
    """What chapter 2's pricing changes at the reference point (:func:`pricing_comparison`): the
    realised hits, the recall time against sequential bandwidth, the options that lose the SLOs and
    the largest wear cost."""
    full = priced["policy"] == KVPolicy.full().label
    new = ~priced["pricing"].str.startswith("before")
    step_new = priced[new].set_index(["layout", "policy"])["recall + writes ms / step"]
    step_old = priced[~new].set_index(["layout", "policy"])["recall + writes ms / step"]
    ratio = (step_new / step_old)[step_old > 0]
    feas = priced.assign(new=new)
    lost = feas[feas["new"] & ~feas["feasible"]].merge(
        feas[~feas["new"] & feas["feasible"]], on=["layout", "policy"]
    )
    wear = priced[new & (priced["wear USD / M tok"] > 0)]["wear USD / M tok"]
    return [
        ("ch5_ref_hit_old", float(priced[~new & full]["realised hit rate"].max()), "{:.1%}"),
        ("ch5_ref_hit_new", float(priced[new & full]["realised hit rate"].max()), "{:.1%}"),
        (
            "ch5_recall_ratio_text",
            f"from {ratio.min():.2g}× to {ratio.max():.2g}× the sequential-bandwidth recall time per step "
            f"(over the layouts and the recalling policies)"
            if len(ratio)
            else "no recall time to compare (no measured policy recalls)",
            None,
        ),
        (
            "ch5_pricing_lost_text",
            (
                "; ".join(f"{r.policy} on {layout_names[r.layout][0]}" for r in lost.itertuples())
                + " no longer meet the SLOs"
            )
            if len(lost)
            else "every option that met the SLOs still does",
            None,
        ),
        ("ch5_wear_max", float(wear.max()) if len(wear) else 0.0, "${:.4f}"),
    ]


def fidelity_rows(
    policies, floor, policies_other, floor_other, moved: pd.DataFrame, cells: pd.DataFrame
) -> list:
    """How many policies each fidelity source admits and how many cells switching the source moves
    (``moved``: ``decide.compare_maps`` of the two maps)."""
    return [
        ("ch5_n_policies", len(policies), "{:,} policies"),
        ("ch5_n_admissible_policies", sum(floor.admits(p) for p in policies), "{:,}"),
        ("ch5_n_published_policies", sum(p.source == "published" for p in policies), "{:,}"),
        ("ch5_n_admissible_other", sum(floor_other.admits(p) for p in policies_other), "{:,}"),
        ("ch5_source_moved_share", len(moved) / len(cells) if len(cells) else np.nan, "{:.0%}"),
    ]


def top_options_table(at_ref: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The ``n`` cheapest options of ``decide.evaluate_options`` with their latencies and fidelity,
    formatted for the chapter."""
    top = at_ref.sort_values("usd_per_mtok").head(n)
    return pd.DataFrame(
        {
            "tier layout": top["layout"].map(decide.LAYOUT_LABELS),
            "KV policy": top["policy"],
            "mode": top["mode"],
            "USD / M tokens": top["usd_per_mtok"].map("{:.3f}".format),
            "TTFT (s)": top["ttft_s"].map("{:.2f}".format),
            "TPOT (ms)": (top["tpot_s"] * 1e3).map("{:.1f}".format),
            "meets SLOs": top["meets_slo"],
            "fidelity source": top["fidelity_source"],
            "above fidelity floor": top["fidelity_ok"],
            "hit rate realised (%)": top["realized_hit_rate"].map("{:.0%}".format),
        }
    )


MAP_COLUMNS = {
    "context": "prompt (tokens)",
    "hit_rate": "reuse (hit rate)",
    "ssd_price_factor": "SSD price ×",
}


def flipped_table(cells: pd.DataFrame, n: int = 15) -> pd.DataFrame:
    """The first ``n`` cells whose cheapest option flips within the declared ranges, and at which
    range; one row saying none does otherwise."""
    flipped = cells[cells["flips"]]
    if not len(flipped):
        return pd.DataFrame([{"cells that flip": "none within the declared ranges"}])
    return (
        flipped[["context", "hit_rate", "ssd_price_factor", "option", "flipped_by"]]
        .rename(columns={**MAP_COLUMNS, "option": "cheapest option", "flipped_by": "flips at"})
        .head(n)
    )


def _map_with_flips(base, contexts, hit_rates, ssd_price_factors, opts, reuse, floor, gpu_rent_range,
                    tier_price_range) -> dict:
    t = time.perf_counter()
    cells, every = decide.decision_map(base, contexts, hit_rates, ssd_price_factors, opts, reuse, floor)
    seconds = time.perf_counter() - t
    perturbations = decide.declared_perturbations(gpu_rent_range, tier_price_range)
    cells, found = decide.map_uncertainty(base, contexts, hit_rates, ssd_price_factors, opts, reuse, floor,
                                          perturbations, cells=cells, every=every)
    return {"cells": cells, "every": every, "found": found, "seconds": seconds,
            "seconds_with_flips": time.perf_counter() - t, "edges": decide.edge_counts(every, opts)}


def map_with_flips(base, contexts, hit_rates, ssd_price_factors, opts, reuse, floor, gpu_rent_range,
                   tier_price_range) -> dict:
    """The decision map (``decide.decision_map``) with the cells whose answer flips at the ends of the
    declared ranges (``decide.map_uncertainty`` over ``decide.declared_perturbations(gpu_rent_range,
    tier_price_range)``): ``cells`` (with ``flips``, ``layout_flips``, ``flipped_by``), ``every`` option
    of every cell, ``found`` (the findings of each perturbed map), the seconds the map took
    (``seconds``; ``seconds_with_flips`` with the perturbed maps) when it was computed, and ``edges``:
    the grid edges of chapter 3's plans under the map (:func:`.decide.edge_counts`; recorded, no
    warning per plan).

    Cached on disk (:func:`analysis.cache.cached`, keyed on every input and the code it runs): chapter 5
    and its evidence page show the same map, and the evidence page, executed after the chapter, reuses
    the chapter's instead of computing it again."""
    return cache.cached(
        "compose_map_with_flips", _map_with_flips, base=base, contexts=list(contexts),
        hit_rates=list(hit_rates), ssd_price_factors=list(ssd_price_factors), opts=list(opts), reuse=reuse,
        floor=floor, gpu_rent_range=list(gpu_rent_range), tier_price_range=list(tier_price_range))


def interactive_map_cells(
    base, contexts, hit_rates, ssd_price_factors, factors, opts, reuse, floor, cells, every
):
    """The decision map at the interactive SSD prices ``factors``: the main map's cells where it was
    computed at those prices, a new map (``decide.decision_map``) at the others."""
    extra = [f for f in factors if f not in ssd_price_factors]
    if extra:
        icells, ievery = decide.decision_map(base, contexts, hit_rates, extra, opts, reuse, floor)
    else:
        icells, ievery = cells.iloc[:0], every.iloc[:0]
    return interactive_maps(cells, every, factors, icells, ievery)


# ----------------------------------------------------------------------- the pipeline's checks


@search.keeps_edges
def baseline_check(svc, base, reuse, ref_context: int) -> dict:
    """The pipeline with every extra switched off (HBM only, full cache, colocated, no reuse) at a
    prompt of ``ref_context`` (``pipeline``), and the same cost computed directly from chapter 3's
    best colocated plan and chapter 2's GPU cost (``direct``); ``svc``: the chapter's service
    (:class:`analysis.compose.params.Service`)."""
    s0 = base.replace(input_tokens=ref_context, hit_rate=0.0, layout="hbm", mode="C", policy=KVPolicy.full())
    r0 = pipeline.evaluate(s0, reuse)
    plan_c = search.best_plan(
        "C",
        svc.model,
        search.Workload(ref_context, svc.output_tokens),
        search.SLO(svc.ttft_slo_s, svc.tpot_slo_s),
        search.default_hardware(svc.gpu),
        budget=svc.budget_devices,
        grid=study.gpu_grid(),
    )
    gpu_usd_s = tiering_tiers.gpu_usd_per_s(base.tiers.replace(gpu=svc.gpu), svc.gpu_cost_basis)
    direct = (
        svc.output_tokens
        / plan_c.tokens_per_s_per_device
        * gpu_usd_s
        / (ref_context + svc.output_tokens)
        * 1e6
    )
    return {"pipeline": r0.usd_per_mtok, "direct": direct, "edges": list(plan_c.edges)}


def baseline_table(b: dict) -> pd.DataFrame:
    """The two costs of :func:`baseline_check`, one row each."""
    return pd.DataFrame(
        [
            {"computed by": "the pipeline, everything switched off", "USD per million tokens": b["pipeline"]},
            {
                "computed by": "chapter 3's best colocated plan x chapter 2's GPU cost",
                "USD per million tokens": b["direct"],
            },
        ]
    )


def baseline_rows(b: dict) -> list:
    """Both costs of :func:`baseline_check` and their relative difference."""
    return [
        ("ch5_baseline_usd", b["pipeline"], "${:.4f}"),
        ("ch5_baseline_direct_usd", b["direct"], "${:.4f}"),
        ("ch5_baseline_rel_diff", abs(b["pipeline"] / b["direct"] - 1), "{:.1e} relative"),
    ]


def af_prefill_share_row(svc, ref_context: int) -> tuple:
    """The share of the AF plan's device time spent on prefill at a prompt of ``ref_context``
    (chapter 3's plan record), 'n/a' when no AF plan is feasible."""
    plan_af = pipeline.plan(
        "AF",
        svc.model,
        svc.gpu,
        float(ref_context),
        float(svc.output_tokens),
        svc.ttft_slo_s,
        svc.tpot_slo_s,
        svc.budget_devices,
        1.0,
        1.0,
    )
    share = plan_af.phases()["prefill"]["device_share"] if plan_af.feasible else np.nan
    return ("ch5_af_prefill_share", share, "{:.0%}" if np.isfinite(share) else "n/a (no feasible AF plan)")


def recall_rows(recall, routing, base, reuse) -> list:
    """How recalls are read and prefixes routed: the recall unit (tokens, KiB on the NVMe tier),
    prefetch, the routed instances and why that many, the routing policy, the share of the ideal
    stack's hits the routed instances keep with unbounded caches, the recall model named by
    ``recall_pricing``; ``recall``, ``routing``: the chapter's :class:`~analysis.compose.params.Recall`
    and :class:`~analysis.compose.params.Reuse`."""
    unit = pricing_unit_bytes(base, recall.recall_unit_tokens)
    return [
        ("ch5_unit_tokens", recall.recall_unit_tokens, "{:,} tokens"),
        ("ch5_unit_kib", float(unit / 1024), "{:.0f} KiB"),
        (
            "ch5_prefetch_text",
            "the reads of one layer overlap the previous layer's compute (prefetch one layer ahead)"
            if recall.recall_prefetch
            else "every layer waits for its reads (no prefetch)",
            None,
        ),
        ("ch5_route_n", getattr(reuse, "n_instances", 1), "{:,}"),
        (
            "ch5_route_n_why",
            "the number chapter 2's replay keeps busy on the trace"
            if routing.routing_instances == 0
            else "`routing_instances`",
            None,
        ),
        ("ch5_route_policy", ROUTING_TEXT[routing.routing_policy], None),
        ("ch5_route_unbounded", reuse.unbounded() if hasattr(reuse, "unbounded") else 1.0, "{:.0%}"),
        (
            "ch5_pricing_recall_mode",
            pipeline.SequentialRecall().name
            if recall.recall_pricing == "sequential"
            else base.recall_model.name,
            None,
        ),
    ]


def pricing_unit_bytes(base, unit_tokens: int):
    """Bytes of one recall unit (``unit_tokens`` of one layer and one KV head) on the NVMe tier of
    ``base``'s tiers at TP 8."""
    tier = tiering_tiers.build_tiers("nvme", pipeline.tier_deployment(base, 8))[-1]
    return RandomReadRecall(unit_tokens=unit_tokens).unit_bytes(tier, base.model)


def old_pricing_map(
    old_base, old_reuse, cells: pd.DataFrame, contexts, hit_rates, f_ref: float, opts, floor
) -> dict:
    """The decision map at SSD price ``f_ref`` priced the old way (``old_base``, ``old_reuse``: ideal
    routing, sequential recall, free writes) against the main map's cells at that price: the old map
    (``cells_old``) and the seconds it took, the main map's cells there (``cells_new``), the cells
    whose cheapest option changes (``moved``) and the findings of each map (``F_old``, ``F_new``)."""
    t = time.perf_counter()
    cells_old, _ = decide.decision_map(old_base, contexts, hit_rates, [f_ref], opts, old_reuse, floor)
    seconds = time.perf_counter() - t
    cells_new = cells[cells["ssd_price_factor"] == f_ref]
    moved = decide.compare_maps(
        cells_new, cells_old, "chapter 2's pricing (the map)", "ideal routing, sequential recall, free writes"
    )
    return {
        "cells_old": cells_old,
        "seconds": seconds,
        "cells_new": cells_new,
        "moved": moved,
        "F_old": decide.map_findings(cells_old),
        "F_new": decide.map_findings(cells_new),
    }


def long_runs_row(enabled: bool) -> tuple:
    """Chapter 4's committed long-context runs the fidelity source reads (none when switched off)."""
    return ("ch5_long_runs", long_runs_text(fidelity.long_context_runs() if enabled else [], enabled), None)


def pricing_map_rows(moved: pd.DataFrame, cells_f: pd.DataFrame, F_old: dict, F_new: dict) -> list:
    """How the map at one SSD price moves between the old pricing and chapter 2's: the cells whose
    cheapest option changes (share, count, of how many) and the off-HBM and compressed shares of each."""
    return [
        ("ch5_pricing_moved_share", len(moved) / max(len(cells_f), 1), "{:.0%}"),
        ("ch5_pricing_moved_n", len(moved), "{:,}"),
        ("ch5_pricing_n_cells", len(cells_f), "{:,}"),
        pct_row("ch5_old_share_off_hbm", F_old["share_off_hbm"]),
        pct_row("ch5_new_share_off_hbm", F_new["share_off_hbm"]),
        pct_row("ch5_old_share_compressed", F_old["share_compressed"]),
        pct_row("ch5_new_share_compressed", F_new["share_compressed"]),
    ]


def xfer_rows(sweep_xfer: pd.DataFrame, modes, transfer_overheads) -> list:
    """The relative change of the cheapest disaggregated plan's cost from the smallest to the largest
    transfer overhead ('infeasible' when it becomes infeasible, 'n/a' when never feasible)."""
    change = decide.group_change(sweep_xfer, [m for m in modes if m != "C"])
    return [
        (
            "ch5_xfer_disagg_change",
            change,
            "{:+.1%}" if np.isfinite(change) else ("infeasible" if change == np.inf else "n/a"),
        ),
        ("ch5_xfer_max", transfer_overheads[-1], "{:g}×"),
    ]


# ----------------------------------------------------------------------- Kimi Linear

KIMI_MODEL = "Kimi-Linear-48B-A3B"
KIMI_TPOT_ENDS = (0.5, 2.0)  # the declared TPOT-SLO ends (data/claims.yaml, ch5_kimi_decode)
KIMI_GPU_ENDS = ("B200-SXM-180GB",)  # the declared GPU alternative (data/claims.yaml, ch5_kimi_decode)


@search.keeps_edges
def kimi_decode(
    context_tokens: int, output_tokens: int, gpu: str, tpot_slo_s: float, budget: int, ends=KIMI_TPOT_ENDS,
    gpu_ends=KIMI_GPU_ENDS,
) -> dict:
    """Kimi Linear against the same model with MLA on every layer at a ``context_tokens`` context
    (capped by the model's window): chapter 3's best decode throughput per device of each
    (``table``), the ratio of the two (``speedup``) and of their single-sequence TPOTs
    (``tpot_ratio``), the speedup at each TPOT SLO factor of ``ends`` and 1 (``at``) and on each GPU of
    ``gpu_ends`` and ``gpu`` (``at_gpu``), each a decode-plan search of its own, the context
    (``context``: prompt + output tokens) and the grid edges of the two table rows' plans (``edges``;
    recorded, not warned)."""
    kl = specs.model(KIMI_MODEL)
    kl_full = kl.replace(n_linear_layers=0)
    ctx = min(context_tokens, kl.max_context) - output_tokens
    rows, edges = [], {}
    for name, m in [("Kimi Linear (3:1 KDA:MLA)", kl), ("same model, MLA on every layer", kl_full)]:
        r = decide.decode_throughput(m, ctx, output_tokens, gpu, tpot_slo_s, budget=budget)
        edges[name] = list(r.get("edges", []))
        rows.append(
            {
                "model": name,
                "KV per sequence": kv.kv_bytes(m, ctx + output_tokens),
                "decode tokens/s per device": r["tokens_per_s_per_device"],
                "batch": r.get("batch", np.nan),
                "devices": r.get("devices", np.nan),
                "TPOT of one sequence (s)": r["tpot_batch1_s"],
            }
        )
    table = pd.DataFrame(rows)
    speedup = table["decode tokens/s per device"].iloc[0] / table["decode tokens/s per device"].iloc[1]
    tpot_ratio = table["TPOT of one sequence (s)"].iloc[1] / table["TPOT of one sequence (s)"].iloc[0]
    at = {1.0: speedup}
    for f in ends:
        r_ = [
            decide.decode_throughput(m, ctx, output_tokens, gpu, tpot_slo_s * f, budget=budget)
            for m in (kl, kl_full)
        ]
        at[f] = r_[0]["tokens_per_s_per_device"] / r_[1]["tokens_per_s_per_device"]
    at_gpu = {gpu: speedup}
    for g in gpu_ends:
        r_ = [decide.decode_throughput(m, ctx, output_tokens, g, tpot_slo_s, budget=budget)
              for m in (kl, kl_full)]
        at_gpu[g] = r_[0]["tokens_per_s_per_device"] / r_[1]["tokens_per_s_per_device"]
    return {
        "at_gpu": at_gpu,
        "table": table,
        "speedup": speedup,
        "tpot_ratio": tpot_ratio,
        "at": at,
        "context": ctx + output_tokens,
        "edges": edges,
    }


def kimi_verdict(k: dict):
    """The verdict of ``ch5_kimi_decode`` on :func:`kimi_decode`'s speedup, recomputed at the declared
    TPOT-SLO ends (each a decode-plan search at that SLO, in :func:`kimi_decode`); compared with the
    published 6x only at the context it was published for (1M tokens): at another context, not testable."""
    def recompute(name, val):
        return k["at_gpu"].get(val) if name == "GPU" else k["at"].get(val)
    return claims.evaluate("ch5_kimi_decode", k["speedup"], setting={"context_tokens": int(k["context"])},
                           recompute=recompute)


def kimi_rows(k: dict, tpot_slo_s: float) -> list:
    """The context, TPOT SLO, speedup, TPOT ratio of :func:`kimi_decode` and the published speedup."""
    return [
        ("ch5_kimi_context", k["context"], "{:,}-token"),
        ("ch5_kimi_tpot_slo", tpot_slo_s * 1e3, "{:g} ms"),
        (
            "ch5_kimi_speedup",
            float(k["speedup"]),
            "{:.1f}×" if np.isfinite(k["speedup"]) else "n/a (no feasible decode plan)",
        ),
        ("ch5_kimi_tpot_ratio", float(k["tpot_ratio"]), "{:.1f}×" if np.isfinite(k["tpot_ratio"]) else "n/a"),
        ("ch5_kimi_published", data.published("kimi_linear_decode_speedup_1m")["value"], "{:g}×"),
    ]


# ----------------------------------------------------------------------- verdicts

SHARE_CLAIMS = (
    ("ch5_tiering_share", "share_off_hbm"),
    ("ch5_qevict_share", "share_qevict"),
    ("ch5_compressed_share", "share_compressed"),
    ("ch5_disagg_share", "share_disagg"),
)
# the share claims' sensitivity names (data/claims.yaml) -> the label of the perturbed map that
# decide.map_uncertainty recomputed at that end (decide.declared_perturbations)
SHARE_PERTURBATIONS = {"GPU rent (x)": "GPU rent × {:g}",
                       "off-HBM tier prices (x)": "off-HBM tier prices × {:g}"}


def grid_setting(contexts, hit_rates, ssd_price_factors) -> str:
    """The decision map's grid in words: the setting a share threshold of data/claims.yaml belongs to
    (a share of cells depends on which cells the grid holds)."""
    def f(xs):
        return ", ".join(f"{float(x):g}" for x in xs)
    return f"contexts {f(contexts)}; hit rates {f(hit_rates)}; SSD price factors {f(ssd_price_factors)}"


def share_recompute(key: str, findings: dict, found: pd.DataFrame, other: dict | None = None):
    """``recompute(name, value)`` of a share claim: the share ``key`` of the map recomputed by
    :func:`~analysis.compose.decide.map_uncertainty` at one end of a declared range (``found``: its
    findings, one row per perturbed map), or of the map judged with the other fidelity source
    (``other``: :func:`other_source_map`); None where the chapter did not compute that map (its ranges
    are parameters), so the end is reported as not assessed."""
    def recompute(name, val):
        if name in SHARE_PERTURBATIONS:
            row = found[found["perturbation"] == SHARE_PERTURBATIONS[name].format(float(val))]
            return float(row[key].iloc[0]) if len(row) else None
        if name == "fidelity source":
            if other is None:
                return None
            return float(other["findings"][key]) if val == other["other"] else float(findings[key])
        raise KeyError(f"unknown sensitivity {name!r} of the share claims: declare one of "
                       f"{[*SHARE_PERTURBATIONS, 'fidelity source']}")
    return recompute


def share_verdicts(findings: dict, found: pd.DataFrame, other: dict | None = None,
                   grid: str | None = None) -> tuple:
    """The verdicts of the four share claims (:data:`SHARE_CLAIMS`: tiering, QEvict's ladder,
    compression, disaggregation) on the map's ``findings``, each recomputed on the maps computed at the
    declared ends (:func:`share_recompute`); ``grid`` (:func:`grid_setting`): the map's grid, judged
    against the grid each threshold was declared for (another grid: not testable)."""
    setting = None if grid is None else {"grid": grid}
    return tuple(
        claims.evaluate(cid, findings[key], setting=setting,
                        recompute=share_recompute(key, findings, found, other))
        for cid, key in SHARE_CLAIMS
    )


def arch_ratio(sweep_lin: pd.DataFrame, share: float) -> float:
    """``ch5_arch_cost``'s value at one linear-attention share of the sweep (each share priced on its own
    model by :func:`sensitivity_sweeps`): the cost reduction against no linear layer, per unit of KV
    reduction (the share); nan where the sweep has no such share."""
    best = sweep_lin[sweep_lin["group"] == "best"].set_index("value")["usd_per_mtok"]
    match = [v for v in best.index if np.isclose(float(v), float(share))]
    if share <= 0 or not match or not len(best):
        return float("nan")
    return (1 - float(best[match[0]]) / float(best.iloc[0])) / float(share)


def arch_verdict(lin_reduction: float, lin_share: float, sweep_lin: pd.DataFrame | None = None):
    """The verdict of ``ch5_arch_cost``: the cost reduction per unit of KV reduction (the share of
    layers made linear), nan when no layer is; recomputed at the other declared shares from
    ``sweep_lin`` (None: not assessed)."""
    def at(name, share):
        return None if sweep_lin is None else arch_ratio(sweep_lin, share)
    return claims.evaluate("ch5_arch_cost", lin_reduction / lin_share if lin_share > 0 else float("nan"),
                           recompute=at)


# ----------------------------------------------------------------------- map set-up


def reference_price_factor(ssd_price_factors) -> float:
    """The SSD price factor the chapter's answer is drawn at: 1 when the map has it, else the middle one."""
    return 1.0 if 1.0 in ssd_price_factors else sorted(ssd_price_factors)[len(ssd_price_factors) // 2]


def interactive_factors_row(factors) -> tuple:
    """The interactive map's SSD price factors, in increasing order ('none' when there are none)."""
    return ("ch5_interactive_factors", ", ".join(f"{f:g}" for f in sorted(factors)) or "none", None)


def fid_tokens_row(fid) -> tuple:
    """Tokens of each chapter-4 fidelity run: prefill, decoding steps and the first token
    (``fid``: the chapter's :class:`~analysis.compose.params.Fidelity`)."""
    return ("ch5_fid_tokens", fid.fidelity_prefill_tokens + fid.fidelity_decode_tokens + 1, "{:,} tokens")


def other_source_map(cfg, measured, cells: pd.DataFrame, every: pd.DataFrame) -> dict:
    """The decision map judged with the other fidelity source than ``cfg``'s (``other``): its policies
    and floor, its cells (same options, only admissibility changes, so the map is re-judged, not
    re-priced), the cells whose cheapest option it moves (``moved``) and its findings."""
    fid, dm = cfg.fidelity, cfg.decision_map
    other = "chapter 4" if fid.fidelity_source == "published" else "published"
    pol_other = fidelity.with_source(measured, other, model=cfg.service.model)
    floor_other = configure.fidelity_floor(cfg, pol_other, other)
    cells_other = decide.cells_from_every(
        cells, decide.rejudge(every, floor_other, decide.options(dm.layouts, pol_other, dm.modes))
    )
    moved = decide.compare_maps(
        cells, cells_other, f"fidelity: {fid.fidelity_source} (the map)", f"fidelity: {other}"
    )
    return {
        "other": other,
        "policies": pol_other,
        "floor": floor_other,
        "cells": cells_other,
        "moved": moved,
        "findings": decide.map_findings(cells_other),
    }
