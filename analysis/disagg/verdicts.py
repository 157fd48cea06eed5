"""Chapter 3's verdict rules and the summaries they read, in one place (the chapter only calls these).

The rules are declared here, before any result is computed, and :func:`verdicts` applies all of them:

* claim (a), PD up to +X% over colocated: the largest PD gain on the GPUs against the published gain
  through :func:`analysis.report.verdict` (reproduced within 10%, partly within 30%);
* claim (b), PDAF the most consistent under NPU design points: modes ranked by the share of cells where
  they beat colocated serving, ties broken by the worst cell; reproduced if PDAF ranks first, partly if
  second;
* claim (c), attention-dense models gain most: Spearman correlation of the attention share with the best
  disaggregated speedup within each input/output ratio (median over the ratios; both grow with the
  prompt, so a pooled correlation mostly restates that), across the sweep's models and in the ablation;
  reproduced if both are at least :data:`RHO_FULL`, partly if either is at least :data:`RHO_PART`;
* validation cells: a simulated throughput within :data:`VALIDATION_TOL` of the published one.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from ..report import VERDICTS, verdict

RHO_FULL, RHO_PART = 0.5, 0.3       # claim (c)
VALIDATION_TOL = 0.25               # validation cells: |simulated / published - 1|
DISAGG_MODES = ("PD", "AF", "3-way", "PDAF")


def best_disagg(df: pd.DataFrame, keys) -> pd.Series:
    """Best speedup over colocated among the disaggregated modes, per group of ``keys``."""
    d = df[df["mode"] != "C"].dropna(subset=["speedup"])
    return d.groupby(keys)["speedup"].max().rename("best_disagg")


def spearman(x, y) -> float:
    """Spearman rank correlation; NaN with fewer than three points or a constant input."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def axis_rho(ab: pd.DataFrame, axis: str) -> float:
    """Rank correlation of the best disaggregated speedup with the varied value of one ablation axis."""
    d = ab[ab["axis"] == axis]
    return spearman(d["value"], d["best_disagg"]) if d["value"].nunique() > 2 else float("nan")


def consistency(ns: pd.DataFrame, modes=DISAGG_MODES) -> pd.DataFrame:
    """Per disaggregated mode over the NPU cells: share of cells above colocated, median, min, max."""
    nd = ns[(ns["mode"] != "C") & np.isfinite(ns["speedup"])]
    return nd.groupby("mode")["speedup"].agg(win_share=lambda s: float((s > 1).mean()), median="median",
                                             minimum="min", maximum="max", cells="size").reindex(list(modes))


def rank_modes(consist: pd.DataFrame) -> list:
    """Modes from most to least consistent (share of wins, then the worst cell)."""
    return list(consist.sort_values(["win_share", "minimum"], ascending=False).index)


def verdict_a(pd_gain: float, published_gain: float) -> str:
    return verdict(pd_gain, published_gain)


def verdict_b(ranking) -> str:
    if not ranking:
        return VERDICTS[3]
    if ranking[0] == "PDAF":
        return VERDICTS[0]
    return VERDICTS[1] if "PDAF" in ranking and ranking.index("PDAF") == 1 else VERDICTS[2]


def verdict_c(rho_sweep: float, rho_abl: float) -> str:
    if np.isfinite(rho_sweep) and np.isfinite(rho_abl) and min(rho_sweep, rho_abl) >= RHO_FULL:
        return VERDICTS[0]
    if max(np.nan_to_num(rho_sweep, nan=-1.0), np.nan_to_num(rho_abl, nan=-1.0)) >= RHO_PART:
        return VERDICTS[1]
    return VERDICTS[2]


def verdict_validation(simulated: float, published: float) -> str:
    """'reproduced' within :data:`VALIDATION_TOL`, else 'not reproduced' (NaN: not testable)."""
    if not np.isfinite(simulated):
        return VERDICTS[3]
    return VERDICTS[0] if abs(simulated / published - 1) <= VALIDATION_TOL else VERDICTS[2]


def verdict_range(simulated: float, low: float, high: float) -> str:
    """A published figure known only as a range (e.g. DistServe's 2.0-4.6x over three models):
    'reproduced' when ``simulated`` lies within the range widened by :data:`VALIDATION_TOL` on each side
    (``low * (1 - tol)`` to ``high * (1 + tol)``), else 'not reproduced' (NaN: not testable)."""
    if not np.isfinite(simulated):
        return VERDICTS[3]
    inside = low * (1 - VALIDATION_TOL) <= simulated <= high * (1 + VALIDATION_TOL)
    return VERDICTS[0] if inside else VERDICTS[2]


def verdict_ordering(higher: float, lower: float) -> str:
    """An ordering claim ('``higher`` beats ``lower``')."""
    if not (np.isfinite(higher) and np.isfinite(lower)):
        return VERDICTS[3]
    return VERDICTS[0] if higher > lower else VERDICTS[2]


def verdicts(*, pd_gain, published_pd_gain, ranking, rho_sweep, rho_abl) -> dict:
    """All of chapter 3's claim verdicts from their computed inputs (the one place they are decided)."""
    return {"a": verdict_a(pd_gain, published_pd_gain), "b": verdict_b(ranking),
            "c": verdict_c(rho_sweep, rho_abl)}


def within_ratio_rho(df: pd.DataFrame, x: str = "attention_share", y: str = "best_disagg") -> pd.Series:
    """Spearman correlation of ``x`` and ``y`` within each input/output ratio (the attention share and
    the speedup both grow with the prompt, so a correlation across ratios mostly restates that)."""
    return df.groupby("ratio").apply(lambda d: spearman(d[x], d[y]), include_groups=False).rename("rho")


def claim_b_by_price(sweep: pd.DataFrame, sets: dict) -> pd.DataFrame:
    """Claim (b) under each price model: ``sets`` maps a price model to its hardware-set name in the
    sweep; per model the most consistent mode, PDAF's rank, its share of wins and the verdict."""
    rows = []
    for model, name in sets.items():
        ns = sweep[sweep["hardware"] == name]
        if not len(ns):
            continue
        ranking = rank_modes(consistency(ns))
        c = consistency(ns)
        rows.append({"price model": model, "most consistent": ranking[0],
                     "PDAF rank": ranking.index("PDAF") + 1,
                     "PDAF above C": c.loc["PDAF", "win_share"], "PDAF median": c.loc["PDAF", "median"],
                     "verdict": verdict_b(ranking)})
    return pd.DataFrame(rows).set_index("price model") if rows else pd.DataFrame()
