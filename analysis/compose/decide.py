"""The decision map and the sensitivities: the cheapest (tier layout x KV policy x deployment mode)
meeting the SLOs and a fidelity floor, over context length x hit rate x SSD price, and how the
choice moves with prices, bandwidths, the share of linear-attention layers and the transfer
overheads of disaggregation. Every cost comes from :func:`analysis.compose.pipeline.evaluate`."""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..disagg import production, search
from ..specs import ModelSpec
from ..specs import model as _model
from ..tiering.tiers import CONFIGS, gpu_usd_per_s
from .fidelity import KVPolicy
from .pipeline import LAYOUTS, MODES, ComposeError, ReuseCurve, Scenario, evaluate

LAYOUT_LABELS = {k: CONFIGS[k][0] for k in LAYOUTS}
# modes the composition reads from chapter 3's plan records that split prefill from decode work (the
# attention/FFN pair that runs both phases); the chapter reports them apart from the older modes
NEW_MODES = ("AF",)


@dataclass(frozen=True)
class Option:
    layout: str
    policy: KVPolicy
    mode: str

    @property
    def label(self) -> str:
        return f"{LAYOUT_LABELS[self.layout]} | {self.policy.label} | {self.mode}"


def options(layouts, policies, modes) -> list[Option]:
    bad = [x for x in layouts if x not in LAYOUTS] + [x for x in modes if x not in MODES]
    if bad:
        raise ComposeError(f"unknown layouts/modes {bad}; layouts: {', '.join(LAYOUTS)}; "
                           f"modes: {', '.join(MODES)}")
    if not (layouts and policies and modes):
        raise ComposeError("options need at least one layout, one policy and one mode")
    return [Option(l, p, m) for l, p, m in itertools.product(layouts, policies, modes)]


@dataclass(frozen=True)
class FidelityFloor:
    """The fidelity floor, declared before any map is computed. A policy measured by chapter 4 is
    admissible when its top-1 agreement with the full cache is at least ``top1`` and its perplexity
    rises by at most ``max_ppl_change`` (relative); a policy with published long-context results
    when its benchmark score is at least ``min_score_ratio`` of the full cache's (mean over the
    published models); an exact policy always; one without evidence (source ``'none'``) never.

    ``in_drive`` maps the AI SSD's stored bits to its in-drive quantization as a KV policy
    (:func:`analysis.compose.fidelity.in_drive_policy`): an option on the ``ai_ssd`` layout must pass
    the floor with it too. A precision missing from ``in_drive`` is judged as having no evidence."""

    top1: float = 0.9
    max_ppl_change: float = 0.05
    min_score_ratio: float = 0.95
    published_ratio: str = "mean"  # 'mean' over the published models, or 'min': the worst model's
    in_drive: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if not 0 <= self.top1 <= 1:
            raise ComposeError(f"fidelity floor: top1 must be in [0, 1], got {self.top1!r}")
        if not self.max_ppl_change >= 0:  # inf: no perplexity condition
            raise ComposeError(f"fidelity floor: max_ppl_change must be >= 0, got {self.max_ppl_change!r}")
        if self.published_ratio not in ("mean", "min"):
            raise ComposeError("fidelity floor: published_ratio must be 'mean' or 'min', "
                               f"got {self.published_ratio!r}")
        if not 0 <= self.min_score_ratio <= 10:
            raise ComposeError(f"fidelity floor: min_score_ratio must be in [0, 10], "
                               f"got {self.min_score_ratio!r}")

    def admits(self, policy: KVPolicy) -> bool:
        if policy.name == "full" or policy.source == "exact":
            return True
        if policy.source == "none":
            return False
        if policy.source == "published":
            ratio = policy.score_ratio_min if self.published_ratio == "min" else policy.score_ratio
            return bool(ratio >= self.min_score_ratio)
        return policy.top1 >= self.top1 and policy.ppl_change <= self.max_ppl_change

    def in_drive_policy(self, bits: int) -> KVPolicy:
        if int(bits) >= 16:
            return KVPolicy(f"ai_ssd_int{int(bits)}", 1.0, source="exact")
        none = KVPolicy(f"ai_ssd_int{int(bits)}", int(bits) / 16.0, source="none")
        return self.in_drive.get(int(bits), none)

    def admits_option(self, policy: KVPolicy, layout: str, ai_ssd_bits: int = 16) -> bool:
        """The policy, and on the ``ai_ssd`` layout the drive's in-drive quantization too."""
        return self.admits(policy) and (layout != "ai_ssd" or self.admits(self.in_drive_policy(ai_ssd_bits)))

    def replace(self, **kw) -> "FidelityFloor":
        return dataclasses.replace(self, **kw)


def _floor(f) -> FidelityFloor:
    if isinstance(f, FidelityFloor):
        return f
    if isinstance(f, (int, float)):
        return FidelityFloor(float(f), math.inf)
    raise ComposeError(f"fidelity floor must be a FidelityFloor or a top-1 agreement, got {f!r}")


def admissible(policy: KVPolicy, floor) -> bool:
    return _floor(floor).admits(policy)


def evaluate_options(base: Scenario, opts, reuse: ReuseCurve | None, floor) -> pd.DataFrame:
    """One row per option: cost, SLO, fidelity and whether it is admissible (feasible, SLOs met
    and the policy above the fidelity floor)."""
    floor = _floor(floor)
    rows = []
    for o in opts:
        s = base.replace(layout=o.layout, policy=o.policy, mode=o.mode)
        r = evaluate(s, reuse)
        fid = floor.admits_option(o.policy, o.layout, s.tiers.ai_ssd_bits)
        rows.append({"layout": o.layout, "policy": o.policy.label, "mode": o.mode, "option": o.label,
                     **r.as_dict(), "fidelity_ok": fid, "admissible": bool(r.feasible and fid),
                     "top1": o.policy.top1, "kl": o.policy.kl, "fidelity_source": o.policy.source,
                     "ai_ssd_bits": int(s.tiers.ai_ssd_bits)})
    return pd.DataFrame(rows)


def cheapest(df: pd.DataFrame) -> pd.Series | None:
    ok = df[df["admissible"]]
    if ok.empty:
        return None
    return ok.loc[ok["usd_per_mtok"].idxmin()]


def ssd_priced(base: Scenario, factor: float) -> Scenario:
    """All SSD prices (NVMe, QLC, AI SSD) multiplied by ``factor``."""
    if not (math.isfinite(factor) and factor >= 0):
        raise ComposeError(f"SSD price factor must be >= 0, got {factor!r}")
    d = base.tiers
    return base.replace(tiers=d.replace(nvme_usd_per_byte=d.nvme_usd_per_byte * factor,
                                        qlc_usd_per_byte=d.qlc_usd_per_byte * factor,
                                        ai_ssd_usd_per_byte=d.ai_ssd_usd_per_byte * factor))


def decision_map(base: Scenario, contexts, hit_rates, ssd_price_factors, opts, reuse, floor):
    """(cells, all): ``cells`` has one row per (context, hit rate, SSD price factor) with the
    cheapest admissible option (NaN cost when none), the cheapest HBM-only option and the cheapest
    colocated option; ``all`` has every option of every cell."""
    m = _model(base.model)
    cells, every = [], []
    for f in ssd_price_factors:
        bf = ssd_priced(base, f)
        for I in contexts:
            if I + base.output_tokens > m.max_context:
                for h in hit_rates:
                    cells.append({"context": I, "hit_rate": h, "ssd_price_factor": f,
                                  "option": "beyond context window", "layout": None, "policy": None,
                                  "mode": None, "usd_per_mtok": np.nan})
                continue
            for h in hit_rates:
                df = evaluate_options(bf.replace(input_tokens=I, hit_rate=h), opts, reuse, floor)
                df = df.assign(context=I, hit_rate=h, ssd_price_factor=f)
                every.append(df)
                cells.append(_cell(df, I, h, f))
    return pd.DataFrame(cells), (pd.concat(every, ignore_index=True) if every else pd.DataFrame())


def _cell(df: pd.DataFrame, I, h, f) -> dict:
    """One cell of the map from every option of it: the cheapest admissible option, the cheapest
    HBM-only and colocated ones, and the HBM-only, full-cache, colocated baseline."""
    best = cheapest(df)
    hbm = cheapest(df[df["layout"] == "hbm"])
    col = cheapest(df[df["mode"] == "C"])
    base_row = df[(df["layout"] == "hbm") & (df["policy"] == KVPolicy.full().label) & (df["mode"] == "C")]
    row = {"context": I, "hit_rate": h, "ssd_price_factor": f,
           "n_admissible": int(df["admissible"].sum()), "n_options": len(df)}
    if best is None:
        row.update(option="no admissible option", layout=None, policy=None, mode=None, usd_per_mtok=np.nan)
    else:
        row.update(option=best["option"], layout=best["layout"], policy=best["policy"], mode=best["mode"],
                   usd_per_mtok=best["usd_per_mtok"], ttft_s=best["ttft_s"], tpot_s=best["tpot_s"],
                   realized_hit_rate=best["realized_hit_rate"])
    row["hbm_only_usd_per_mtok"] = hbm["usd_per_mtok"] if hbm is not None else np.nan
    row["colocated_usd_per_mtok"] = col["usd_per_mtok"] if col is not None else np.nan
    row["baseline_usd_per_mtok"] = (float(base_row["usd_per_mtok"].iloc[0])
                                    if len(base_row) and bool(base_row["feasible"].iloc[0]) else np.nan)
    return row


def cells_from_every(cells: pd.DataFrame, every: pd.DataFrame) -> pd.DataFrame:
    """The map's cells recomputed from (a repriced or re-judged) ``every`` of :func:`decision_map`;
    cells beyond the model's context window are kept as they are."""
    key = ["context", "hit_rate", "ssd_price_factor"]
    rows = {k: _cell(g, *k) for k, g in every.groupby(key, sort=False)} if len(every) else {}
    kept = cells[key + ["option", "layout", "policy", "mode", "usd_per_mtok"]]
    out = [rows.get(tuple(r[k] for k in key), r.to_dict()) for _, r in kept.iterrows()]
    return pd.DataFrame(out)


def mode_shares(cells: pd.DataFrame, modes) -> pd.Series:
    """Share of the map's cells with an admissible option that each mode of ``modes`` wins (0 for a
    mode that wins none; empty when no cell has an admissible option)."""
    ok = cells.dropna(subset=["usd_per_mtok"])
    if ok.empty:
        return pd.Series(dtype=float)
    return ok["mode"].value_counts(normalize=True).reindex(list(modes), fill_value=0.0)


def cells_changed(cells: pd.DataFrame, every: pd.DataFrame, modes) -> float:
    """Share of the cells with an admissible option whose cheapest option differs from the map
    restricted to ``modes`` (recomputed from ``every`` by :func:`cells_from_every`); NaN without cells."""
    if not set(modes) <= set(every["mode"]):
        raise ComposeError(f"cells_changed: modes {sorted(set(modes) - set(every['mode']))} were not priced")
    sub = cells_from_every(cells, every[every["mode"].isin(list(modes))])
    ok = cells["usd_per_mtok"].notna().to_numpy()
    if not ok.any():
        return math.nan
    return float((cells["option"].to_numpy()[ok] != sub["option"].to_numpy()[ok]).mean())


def mode_premium(every: pd.DataFrame, mode: str) -> float:
    """Median over the cells of (the cheapest admissible option of ``mode`` / the cell's cheapest
    admissible option) - 1: how much dearer the mode's best is than the cell's answer (0 where it wins;
    NaN when no cell admits the mode)."""
    if every.empty:
        return math.nan
    ok = every[every["admissible"]]
    key = ["context", "hit_rate", "ssd_price_factor"]
    best = ok.groupby(key)["usd_per_mtok"].min()
    mine = ok[ok["mode"] == mode].groupby(key)["usd_per_mtok"].min()
    if mine.empty:
        return math.nan
    return float((mine / best.reindex(mine.index) - 1).median())


def sweep(base: Scenario, values, make, opts, reuse, floor, *, by: str = "layout") -> pd.DataFrame:
    """For each ``v`` of ``values``: the cheapest admissible option of ``make(base, v)`` overall
    (``group = 'best'``) and per value of ``by`` (layout, mode or policy)."""
    rows = []
    for v in values:
        df = evaluate_options(make(base, v), opts, reuse, floor)
        best = cheapest(df)
        rows.append({"value": v, "group": "best",
                     "usd_per_mtok": np.nan if best is None else best["usd_per_mtok"],
                     "option": None if best is None else best["option"]})
        for g, sub in df.groupby(by, sort=False):
            b = cheapest(sub)
            rows.append({"value": v, "group": g, "usd_per_mtok": np.nan if b is None else b["usd_per_mtok"],
                         "option": None if b is None else b["option"]})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------- scenario transformations

def with_linear_share(model, share: float) -> ModelSpec:
    """The model with a fraction ``share`` of its full-attention layers turned into linear-attention
    layers (a fixed recurrent state of ``n_heads x head_dim x v_head_dim`` per layer, as Kimi
    Linear's KDA): KV per token shrinks by ``share`` (Kimi Linear's 3:1 layout is 75%)."""
    m = _model(model)
    if not 0 <= share < 1:
        raise ComposeError(f"linear-attention share must be in [0, 1), got {share!r}")
    k = int(round(share * m.n_full_layers))
    if k == 0:
        return m
    return m.replace(n_linear_layers=m.n_linear_layers + k, linear_heads=m.linear_heads or m.n_heads,
                     linear_dk=m.linear_dk or m.head_dim, linear_dv=m.linear_dv or m.v_head_dim)


def tiers_scaled(base: Scenario, **factors) -> Scenario:
    """The scenario with Deployment fields of chapter 2 multiplied by factors (e.g.
    ``ai_ssd_usd_per_byte=2``) or set (``nvme_bw_override``/``ai_ssd_bits`` are set, not scaled)."""
    d = base.tiers
    new = {}
    for k, f in factors.items():
        if not hasattr(d, k):
            raise ComposeError(f"chapter 2's Deployment has no field {k!r}")
        set_ = k in ("nvme_bw_override", "ai_ssd_bits", "ai_ssd_drives", "cxl_devices")
        new[k] = f if set_ else getattr(d, k) * f
    return base.replace(tiers=d.replace(**new))


def frontier_changes(cells: pd.DataFrame, key: str = "layout") -> pd.DataFrame:
    """Adjacent cells (along context and along hit rate) whose cheapest ``key`` differs: the
    frontier lines of the map, one row per crossing with what changes and where."""
    out = []
    name = (lambda v: LAYOUT_LABELS.get(v, v)) if key == "layout" else (lambda v: v)
    for f, sub in cells.groupby("ssd_price_factor"):
        piv = sub.pivot(index="context", columns="hit_rate", values=key)
        ctx, hits = list(piv.index), list(piv.columns)
        for i, c in enumerate(ctx):
            for j, h in enumerate(hits):
                a = piv.iloc[i, j]
                if j + 1 < len(hits) and piv.iloc[i, j + 1] != a:
                    out.append({"ssd_price_factor": f, "frontier": f"{name(a)} → {name(piv.iloc[i, j + 1])}",
                                "where": f"hit rate {h:.0%} → {hits[j + 1]:.0%} at {c:,} tokens"})
                if i + 1 < len(ctx) and piv.iloc[i + 1, j] != a:
                    out.append({"ssd_price_factor": f, "frontier": f"{name(a)} → {name(piv.iloc[i + 1, j])}",
                                "where": f"prompt {c:,} → {ctx[i + 1]:,} tokens at hit rate {h:.0%}"})
    return pd.DataFrame(out, columns=["ssd_price_factor", "frontier", "where"])


def decode_throughput(model, context_tokens: float, output_tokens: float, gpu: str, tpot_slo_s: float,
                      budget: int = 64) -> dict:
    """Best decode throughput per device (output tokens/s/device) of chapter 3's decode role at a
    given context, under a TPOT SLO, and the TPOT of a single sequence (smallest instance that
    holds it): chapter 3's one decode throughput (:func:`analysis.disagg.production.best_decode`) on
    its default grid, bf16, default efficiencies; ``edges``: the grid edges of the chosen configuration
    (a single call warns of them, :class:`~analysis.disagg.search.GridEdgeWarning`)."""
    wl = search.Workload(float(context_tokens), float(output_tokens))
    r = production.best_decode(model, gpu, "D", wl, tpot_slo_s=tpot_slo_s, grid=search.Grid(), budget=budget)
    if not r["feasible"]:
        return {"feasible": False, "tokens_per_s_per_device": np.nan, "tpot_batch1_s": np.nan}
    keys = ("feasible", "tokens_per_s_per_device", "batch", "devices", "tpot_s", "tpot_batch1_s", "batch1",
            "edges")
    return {k: r[k] for k in keys}


# --------------------------------------------------------------------------- chapter 3's grid edges

def edge_counts(every: pd.DataFrame, opts) -> dict:
    """The grid edges of chapter 3's plans under the map (``every`` of :func:`decision_map`, whose rows
    carry :attr:`.pipeline.Result.plan_edges`): each distinct plan counted once (a plan is set by the
    cell's prompt, the option's mode and KV bytes per element, and whether overlap was searched; the
    map's hit rates, SSD prices and layouts share it). Returns ``plans`` (distinct plans priced),
    ``at_edge`` (those at an edge of their search grid), ``kinds`` (``{edge kind: plans}``,
    :func:`analysis.disagg.search.edge_kinds`) and ``per_plan`` (one row per plan: its ``edges``)."""
    cols = ["context", "mode", "kv_hot_ratio", "plan_overlap", "edges"]
    if every.empty or "plan_edges" not in every:
        return {"plans": 0, "at_edge": 0, "kinds": {}, "per_plan": pd.DataFrame(columns=cols)}
    hot = {o.label: float(o.policy.hot_ratio) for o in opts}
    missing = sorted(set(every["option"]) - set(hot))
    if missing:
        raise ComposeError(f"edge_counts: options {missing} of the map are not in opts; pass the options "
                           "the map was computed with")
    priced = every[every["plan_edges"].notna()]
    per = pd.DataFrame({"context": priced["context"].to_numpy(), "mode": priced["mode"].to_numpy(),
                        "kv_hot_ratio": priced["option"].map(hot).to_numpy(),
                        "plan_overlap": priced["plan_overlap"].to_numpy(),
                        "edges": priced["plan_edges"].astype(str).to_numpy()})
    per = per.drop_duplicates(subset=cols[:4]).reset_index(drop=True)
    at = int((per["edges"] != "").sum())
    return {"plans": len(per), "at_edge": at, "kinds": search.edge_kinds(per["edges"]), "per_plan": per}


def edge_line(counts: dict) -> str:
    """One sentence from :func:`edge_counts`: how many of the priced plans sit at an edge of their search
    grid, and which edges (a plan may sit at several)."""
    kinds = sorted(counts["kinds"].items(), key=lambda x: -x[1])
    which = ", ".join(f"{n:,} at {search.edge_kind_words(k)}" for k, n in kinds)
    return (f"{counts['at_edge']:,} of the {counts['plans']:,} chapter 3 plans priced for the map sit at an "
            "edge of their search grid" + (f" (which edges: {which}; a plan may sit at several)" if which
                                           else "") + ".")


# --------------------------------------------------------------------------- findings, in words

def _share(mask) -> float:
    return float(np.mean(mask)) if len(mask) else math.nan


def _saving(ok: pd.DataFrame, against: str, how: str) -> float:
    if not len(ok):
        return math.nan
    return float(getattr(1 - ok["usd_per_mtok"] / ok[against], how)())


def map_findings(cells: pd.DataFrame) -> dict:
    """Shares and savings over the cells of a decision map that have an admissible option."""
    ok = cells.dropna(subset=["usd_per_mtok"])
    off = ok["layout"] != "hbm"
    full = KVPolicy.full().label
    out = {
        "n_cells": len(ok), "n_cells_total": len(cells),
        "share_off_hbm": _share(off), "share_compressed": _share(ok["policy"] != full),
        "share_qevict": _share(ok["policy"].astype(str).str.startswith("qevict")),
        "share_disagg": _share(ok["mode"] != "C"),
        "tier_saving_median": _saving(ok, "hbm_only_usd_per_mtok", "median"),
        "tier_saving_max": _saving(ok, "hbm_only_usd_per_mtok", "max"),
        "total_saving_median": _saving(ok, "baseline_usd_per_mtok", "median"),
        "total_saving_max": _saving(ok, "baseline_usd_per_mtok", "max"),
        "disagg_saving_max": _saving(ok, "colocated_usd_per_mtok", "max"),
    }
    pol = ok["policy"].value_counts()
    out["top_policy"] = pol.index[0] if len(pol) else "no admissible option"
    out["top_policy_share"] = float(pol.iloc[0] / len(ok)) if len(pol) else math.nan
    lay = ok.loc[off, "layout"].value_counts()
    out["top_offhbm_layout"] = LAYOUT_LABELS[lay.index[0]] if len(lay) else "no layout beyond HBM"
    hbm = ok[~off]
    if hbm.empty:
        out["hbm_max_hit_text"] = "at no reuse level, not even without reuse"
    elif hbm["hit_rate"].max() == 0:
        out["hbm_max_hit_text"] = "only where requests share no prefix"
    else:
        out["hbm_max_hit_text"] = f"up to a reuse of {hbm['hit_rate'].max():.0%}"
    return out


def describe_sweep(df: pd.DataFrame, fmt=lambda v: f"{v:g}") -> str:
    """How the overall cheapest option of a :func:`sweep` moves, in one sentence."""
    b = df[df["group"] == "best"].reset_index(drop=True)
    if b.empty or b["option"].isna().all():
        return "no option is admissible at any value"
    parts, prev = [], None
    for _, r in b.iterrows():
        o = r["option"] if isinstance(r["option"], str) else "no admissible option"
        if o != prev:
            cost = f" (${r['usd_per_mtok']:.3f})" if np.isfinite(r["usd_per_mtok"]) else ""
            parts.append(f"{o}{cost} from {fmt(r['value'])}")
            prev = o
    if len(parts) == 1:
        first, last = b.iloc[0], b.iloc[-1]
        return (f"the cheapest option stays {prev}, its cost going from ${first['usd_per_mtok']:.3f} to "
                f"${last['usd_per_mtok']:.3f}")
    return "the cheapest option moves: " + "; then ".join(parts)


def group_change(df: pd.DataFrame, groups) -> float:
    """Relative change of the cheapest cost among ``groups`` from the first to the last value of a
    sweep (inf when it becomes infeasible, nan when never feasible)."""
    sub = df[df["group"].isin(list(groups))]
    if sub.empty:
        return math.nan
    per = sub.groupby("value", sort=False)["usd_per_mtok"].min()
    a, z = per.iloc[0], per.iloc[-1]
    if not np.isfinite(a):
        return math.nan
    return math.inf if not np.isfinite(z) else float(z / a - 1)


# ------------------------------------------------------------------------- uncertainty on the map

@dataclass(frozen=True)
class Perturbation:
    """One end of a declared sensitivity range: ``apply(base, floor) -> (base, floor)`` (the map is
    recomputed), and optionally ``reprice(every, floor, opts) -> every`` giving exactly the same
    options from the unperturbed map's options without re-evaluating them (a GPU rate scales the GPU
    cost linearly; a fidelity floor only re-judges admissibility)."""

    input: str
    label: str
    apply: object
    reprice: object = None


def declared_perturbations(gpu_rent_range=(0.8, 1.25), tier_price_range=(0.5, 2.0),
                           published_spread: bool = True) -> list[Perturbation]:
    """The sensitivity ranges the chapter declares before computing the map: the GPU's rental rate
    and every off-HBM tier's price (DRAM, CXL, NVMe, QLC, AI SSD) at both ends of their ranges, and
    the published fidelity judged at the worst published model instead of the mean."""
    out = []
    for f in gpu_rent_range:
        def gpu(b, fl, f=float(f)):
            rent = gpu_usd_per_s(b.tiers.replace(gpu=b.gpu), "rent", b.gpu_rent_usd_per_s)
            return b.replace(gpu_rent_usd_per_s=rent * f), fl
        def gpu_fast(every, fl, opts, f=float(f)):
            e = every.copy()
            ok = np.isfinite(e["gpu_usd_per_mtok"])
            e.loc[ok, "usd_per_mtok"] = e.loc[ok, "usd_per_mtok"] + (f - 1) * e.loc[ok, "gpu_usd_per_mtok"]
            e.loc[ok, "gpu_usd_per_mtok"] = f * e.loc[ok, "gpu_usd_per_mtok"]
            return e
        out.append(Perturbation("GPU rent", f"GPU rent × {f:g}", gpu, gpu_fast))
    for f in tier_price_range:
        def price(b, fl, f=float(f)):
            return tiers_scaled(b, **{k: f for k in TIER_PRICE_FIELDS}), fl
        out.append(Perturbation("tier prices", f"off-HBM tier prices × {f:g}", price))
    if published_spread:
        out.append(Perturbation("published fidelity", "published fidelity of the worst model",
                                lambda b, fl: (b, fl.replace(published_ratio="min")),
                                lambda every, fl, opts: rejudge(every, fl.replace(published_ratio="min"),
                                                                opts)))
    return out


TIER_PRICE_FIELDS = ("dram_usd_per_byte", "cxl_usd_per_byte", "nvme_usd_per_byte", "qlc_usd_per_byte",
                     "ai_ssd_usd_per_byte")


def rejudge(every: pd.DataFrame, floor, opts) -> pd.DataFrame:
    """``every`` of :func:`decision_map` with fidelity and admissibility judged by another floor."""
    floor = _floor(floor)
    by_label = {o.label: o for o in opts}
    e = every.copy()
    bits = e["ai_ssd_bits"] if "ai_ssd_bits" in e else pd.Series(16, index=e.index)
    e["fidelity_ok"] = [floor.admits_option(by_label[o].policy, by_label[o].layout, int(b))
                        for o, b in zip(e["option"], bits)]
    e["admissible"] = e["feasible"].astype(bool) & e["fidelity_ok"]
    return e


def map_uncertainty(base: Scenario, contexts, hit_rates, ssd_price_factors, opts, reuse, floor,
                    perturbations, cells: pd.DataFrame | None = None, every: pd.DataFrame | None = None):
    """(cells, findings): the decision map's cells with ``flips`` (the cheapest option changes at some
    end of a declared range), ``layout_flips`` (its tier layout changes) and ``flipped_by`` (which
    ranges), and the :func:`map_findings` of every perturbed map (one row each, ``perturbation``)."""
    floor = _floor(floor)
    if cells is None or every is None:
        cells, every = decision_map(base, contexts, hit_rates, ssd_price_factors, opts, reuse, floor)
    key = ["context", "hit_rate", "ssd_price_factor"]
    out = cells.copy()
    out["flips"], out["layout_flips"] = False, False
    out["flipped_by"] = [[] for _ in range(len(out))]
    found = [{"perturbation": "declared values", **map_findings(cells)}]
    ref = out.set_index(key)
    for pt in perturbations:
        if pt.reprice is not None:
            alt = cells_from_every(cells, pt.reprice(every, floor, opts))
        else:
            b, fl = pt.apply(base, floor)
            alt, _ = decision_map(b, contexts, hit_rates, ssd_price_factors, opts, reuse, fl)
        found.append({"perturbation": pt.label, **map_findings(alt)})
        alt = alt.set_index(key).reindex(ref.index)
        opt_change = alt["option"].astype(str).to_numpy() != ref["option"].astype(str).to_numpy()
        lay_change = alt["layout"].astype(str).to_numpy() != ref["layout"].astype(str).to_numpy()
        out.loc[opt_change, "flips"] = True
        out.loc[lay_change, "layout_flips"] = True
        for i in np.flatnonzero(opt_change):
            out.at[out.index[i], "flipped_by"] = out.at[out.index[i], "flipped_by"] + [pt.label]
    out["flipped_by"] = out["flipped_by"].map(lambda v: "; ".join(v))
    return out, pd.DataFrame(found)


def finding_range(found: pd.DataFrame, key: str) -> tuple[float, float, float]:
    """(declared value, lowest, highest) of one finding over the perturbed maps."""
    v = found[key].astype(float)
    return float(v.iloc[0]), float(np.nanmin(v)), float(np.nanmax(v))


def compare_maps(a: pd.DataFrame, b: pd.DataFrame, label_a: str, label_b: str) -> pd.DataFrame:
    """The cells whose cheapest option differs between two decision maps of the same grid."""
    key = ["context", "hit_rate", "ssd_price_factor"]
    m = a.set_index(key)[["option"]].join(b.set_index(key)[["option"]], lsuffix="_a", rsuffix="_b")
    d = m[m["option_a"].astype(str) != m["option_b"].astype(str)].reset_index()
    return d.rename(columns={"option_a": label_a, "option_b": label_b})


# ----------------------------------------------------------------------------- rules of thumb

def rules_of_thumb(cells: pd.DataFrame, ssd_price_factor: float = 1.0) -> dict:
    """Short rules the map supports, each computed from its cells (at ``ssd_price_factor`` where a
    rule needs one price): when HBM alone is enough, from which reuse a tier beyond HBM always wins,
    which tier and policy win most, from which prompt length disaggregation wins most cells, and how
    much the SSD price moves the answer."""
    ok = cells.dropna(subset=["usd_per_mtok"])
    at = ok[np.isclose(ok["ssd_price_factor"], ssd_price_factor)]
    if at.empty:
        at = ok
    F = map_findings(ok)
    rules = {"hbm": f"Keep the KV cache in HBM alone {F['hbm_max_hit_text']}."}
    off_by_hit = at.groupby("hit_rate")["layout"].apply(lambda v: bool((v != "hbm").all()))
    hs = [h for h in sorted(off_by_hit.index) if off_by_hit.loc[h:].all()]
    rules["tier"] = (f"From a reuse of {hs[0]:.0%} on, a tier beyond HBM is cheapest at every prompt length "
                     f"(mostly {F['top_offhbm_layout']})." if hs else
                     "No reuse level makes a tier beyond HBM cheapest at every prompt length.")
    rules["policy"] = (f"Compress the KV cache: {F['top_policy']} is the cheapest admissible policy in "
                       f"{F['top_policy_share']:.0%} of the cells." if F["top_policy"] != "full cache" else
                       "Keep the full cache: no compressed policy both passes the fidelity floor and wins "
                       "most cells.")
    dis = at.assign(d=at["mode"] != "C").groupby("context")["d"].mean()
    cs = [c for c in sorted(dis.index) if (dis.loc[c:] > 0.5).all()]
    rules["mode"] = (f"Disaggregate from a prompt of {cs[0]:,} tokens on (a disaggregated mode wins most "
                     f"cells there); below, colocated serving is as cheap." if cs else
                     "Colocated serving wins most cells at the longest prompts too; disaggregate only where "
                     "the map says so.")
    if ok["ssd_price_factor"].nunique() > 1:
        piv = ok.pivot_table(index=["context", "hit_rate"], columns="ssd_price_factor", values="option",
                             aggfunc="first")
        moved = float((piv.nunique(axis=1) > 1).mean())
        lo, hi = min(piv.columns), max(piv.columns)
        rules["ssd"] = (f"SSD prices from × {lo:g} to × {hi:g} change the answer in {moved:.0%} of the "
                        "(prompt, reuse) cells.")
    else:
        rules["ssd"] = "One SSD price only: the map does not show how SSD prices move the answer."
    return rules
