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

from ..specs import ModelSpec, model as _model
from ..tiering.tiers import CONFIGS
from .fidelity import KVPolicy
from .pipeline import LAYOUTS, MODES, ComposeError, ReuseCurve, Scenario, evaluate

LAYOUT_LABELS = {k: CONFIGS[k][0] for k in LAYOUTS}


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
        raise ComposeError(f"unknown layouts/modes {bad}; layouts: {', '.join(LAYOUTS)}; modes: {', '.join(MODES)}")
    if not (layouts and policies and modes):
        raise ComposeError("options need at least one layout, one policy and one mode")
    return [Option(l, p, m) for l, p, m in itertools.product(layouts, policies, modes)]


def admissible(policy: KVPolicy, fidelity_floor_top1: float) -> bool:
    """A policy passes the fidelity floor when its top-1 agreement with the full cache reaches it."""
    return policy.name == "full" or policy.top1 >= fidelity_floor_top1


def evaluate_options(base: Scenario, opts, reuse: ReuseCurve | None, fidelity_floor_top1: float) -> pd.DataFrame:
    """One row per option: cost, SLO, fidelity and whether it is admissible."""
    rows = []
    for o in opts:
        s = base.replace(layout=o.layout, policy=o.policy, mode=o.mode)
        r = evaluate(s, reuse)
        fid = admissible(o.policy, fidelity_floor_top1)
        rows.append({"layout": o.layout, "policy": o.policy.label, "mode": o.mode, "option": o.label,
                     **r.as_dict(), "fidelity_ok": fid, "admissible": bool(r.feasible and fid),
                     "top1": o.policy.top1, "kl": o.policy.kl})
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


def decision_map(base: Scenario, contexts, hit_rates, ssd_price_factors, opts, reuse, fidelity_floor_top1):
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
                    cells.append({"context": I, "hit_rate": h, "ssd_price_factor": f, "option": "beyond context window",
                                  "layout": None, "policy": None, "mode": None, "usd_per_mtok": np.nan})
                continue
            for h in hit_rates:
                df = evaluate_options(bf.replace(input_tokens=I, hit_rate=h), opts, reuse, fidelity_floor_top1)
                df = df.assign(context=I, hit_rate=h, ssd_price_factor=f)
                every.append(df)
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
                cells.append(row)
    return pd.DataFrame(cells), (pd.concat(every, ignore_index=True) if every else pd.DataFrame())


def sweep(base: Scenario, values, make, opts, reuse, fidelity_floor_top1, *, by: str = "layout") -> pd.DataFrame:
    """For each ``v`` of ``values``: the cheapest admissible option of ``make(base, v)`` overall
    (``group = 'best'``) and per value of ``by`` (layout, mode or policy)."""
    rows = []
    for v in values:
        df = evaluate_options(make(base, v), opts, reuse, fidelity_floor_top1)
        best = cheapest(df)
        rows.append({"value": v, "group": "best", "usd_per_mtok": np.nan if best is None else best["usd_per_mtok"],
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
        new[k] = f if k in ("nvme_bw_override", "ai_ssd_bits", "ai_ssd_drives", "cxl_devices") else getattr(d, k) * f
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
    holds it)."""
    from ..disagg import search
    from ..disagg.costs import Efficiency, Precision

    wl = search.Workload(float(context_tokens), float(output_tokens))
    c = search.role_candidates("D", model, wl, gpu, prec=Precision(), eff=Efficiency(), grid=search.Grid(),
                               budget=budget)
    ok = c["feasible"] & (c["tpot"] <= tpot_slo_s)
    if not ok.any():
        return {"feasible": False, "tokens_per_s_per_device": np.nan, "tpot_batch1_s": np.nan}
    tput = c["rate"] * float(output_tokens) / c["devices"]
    i = int(np.flatnonzero(ok)[np.argmax(tput[ok])])
    one = c["feasible"] & (c["batch"] == np.min(c["batch"][c["feasible"]]))
    j = int(np.flatnonzero(one)[np.argmin(c["tpot"][one])]) if one.any() else i
    return {"feasible": True, "tokens_per_s_per_device": float(tput[i]), "batch": float(c["batch"][i]),
            "devices": float(c["devices"][i]), "tpot_s": float(c["tpot"][i]), "tpot_batch1_s": float(c["tpot"][j]),
            "batch1": float(c["batch"][j])}
