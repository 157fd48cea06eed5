"""Chapter 4's derived numbers, tables and texts, so that its cells only call, glue and plot.

A function named ``*_glue`` returns the chapter's glued values as ``(name, value, format)`` rows
(``for row in f(...): glue(*row)``); the others return the tables and texts the chapter shows.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from .. import claims
from ..cache import cached
from . import longrun_units
from .config import policy_config
from .corpora import document_sources
from .labels import display_label, labels_for, named, names_of
from .longview import (
    DRIFT_PRIMARY_RULE,
    MAIN_PREFIX,
    budget_trend_rule_text,
    budget_trend_table,
    budget_trend_text,
    drift_by_scope,
    drift_ends_at,
    drift_primary,
    drift_primary_missing,
    drift_primary_recompute,
    drift_primary_scope,
    drift_primary_text,
    long_lengths_text,
    long_runs,
    main_comparison,
    main_setup_text,
    primary_verdict,
    qevict_by_scope,
    scored_steps_text,
    secondary_drift_label,
)
from .metrics import DRIFT_RULE, QEVICT_RULE, bootstrap_ci, drift_rule_verdict, lir_gain_correlation
from .policies import make_policy
from .quant import full_window_bytes, quant_window_bytes
from .tuning import stale_reasons
from .verdicts import by_genre as rule_by_genre
from .verdicts import missing_documents, qevict_recompute, qevict_value

EVICTING = ("streaming", "h2o", "tova", "snapkv")
RECALLING = ("qevict_recall", "quest", "h2o_recall", "snapkv_recall")
THREE_TIER = ("full", "qevict_dequant", "qevict_recall")
OUTCOMES = ("better", "not worse", "worse", "unclear")


# --- the model and the cache ---------------------------------------------------------------------


def tier_table(window_tokens: int, head_dim: int, qevict_bits: int, group_size: int) -> pd.DataFrame:
    """Bytes per window and KV head (keys + values) of each precision tier, and its share of a
    full-precision window: fp16, and KIVI at 2, 4 and ``qevict_bits`` bits."""
    full = full_window_bytes(window_tokens, head_dim)
    rows = [dict(tier="full precision (fp16)", bytes_per_window=full, fraction_of_full=1.0)]
    for b in sorted({2, 4, qevict_bits}):
        q = quant_window_bytes(window_tokens, head_dim, b, group_size)
        rows.append(dict(tier=f"{b}-bit KIVI", bytes_per_window=q, fraction_of_full=q / full))
    return pd.DataFrame(rows)


def model_glue(tiers: pd.DataFrame, cfg, group_size: int) -> list:
    """The model's shape and the 2- and 4-bit windows' share of a full one."""
    frac = tiers.set_index("tier").fraction_of_full
    return [
        ("ch4_group", group_size, None),
        ("ch4_q2_frac", frac.loc["2-bit KIVI"], "{:.1%}"),
        ("ch4_q4_frac", frac.loc["4-bit KIVI"], "{:.1%}"),
        ("ch4_kv_per_token", cfg.kv_bytes_per_token_fp16, "bytes"),
        ("ch4_layers", cfg.n_layers, None),
        ("ch4_heads", cfg.n_heads, None),
        ("ch4_kv_heads", cfg.n_kv_heads, None),
        ("ch4_head_dim", cfg.head_dim, None),
        ("ch4_context", cfg.context_length, "{:,}"),
    ]


def full_cache_glue(summary: pd.DataFrame) -> list:
    """The full cache's perplexity per genre (``ch4_ppl_full_<genre>``) and needle accuracy."""
    full = summary[summary.policy == "full"].copy()
    full["kind"] = full.document.str.split(":").str[0]
    rows = [(f"ch4_ppl_full_{k}", v, "{:.1f}") for k, v in full.groupby("kind").ppl.mean().items()]
    needle = full[full.kind == "needle"].needle_acc
    rows.append(("ch4_needle_full", needle.mean() if len(needle) else float("nan"), "{:.0%}"))
    return rows


# --- drift -----------------------------------------------------------------------------------------


def lir_example_glue(lir: pd.DataFrame, document: str, layer: int) -> list:
    """The worked example of Global LIR: one document and layer (``layer < 0``: layer 0)."""
    ex = lir[(lir.document == document) & (lir.layer == max(layer, 0))].iloc[0]
    return [
        ("ch4_lir_ex_where", f"{document}, layer {int(ex.layer)}", None),
        ("ch4_lir_ex_react", int(ex.reactivated), "{:,}"),
        ("ch4_lir_ex_inactive", int(ex.inactive_windows), "{:,}"),
        (
            "ch4_lir_ex",
            f"{int(ex.reactivated):,} / {int(ex.inactive_windows):,} = {ex.lir:.0%}"
            if ex.inactive_windows
            else "undefined (no window went quiet)",
            None,
        ),
    ]


def per_document_lir(lir: pd.DataFrame) -> pd.Series:
    """Global LIR per document, pooled over layers and KV heads: re-activated / inactive windows."""
    g = lir.groupby("document")[["reactivated", "inactive_windows"]].sum()
    return g.reactivated / g.inactive_windows.clip(lower=1)


def lir_glue(lir: pd.DataFrame, per_doc: pd.Series, n_boot: int, seed: int) -> list:
    """Global LIR over documents with its bootstrap interval, the mass re-activated windows draw and
    the most drift-prone layer."""
    m, lo, hi = bootstrap_ci(per_doc.values, n_boot, seed)
    by_layer = lir.groupby("layer").lir.mean()
    return [
        ("ch4_lir", m, "{:.0%}"),
        ("ch4_lir_ci", f"{lo:.0%}–{hi:.0%}" if np.isfinite(lo) else "n/a", None),
        ("ch4_lir_mass", lir.groupby("document").reactivated_mass.mean().mean(), "{:.3f}"),
        ("ch4_lir_max_layer", int(by_layer.idxmax()), None),
        ("ch4_lir_max", by_layer.max(), "{:.0%}"),
    ]


def budget_lir_example(bl: pd.DataFrame, gap_steps: int) -> str:
    """The worked example of the budget-relative LIR (``metrics.budget_lir`` of one document)."""
    left, back = int(bl.left.sum()), int(bl.reentered.sum())
    if not left:
        return "no window left the top set"
    return (
        f"{back:,} of the {left:,} (window, KV head) pairs that left the top set for {gap_steps} steps "
        f"re-entered it, LIR_B = {back / left:.0%}"
    )


def drift_glue(drift: pd.DataFrame, dv: dict, dp: dict) -> list:
    """The drift statistics in decoding order against their shuffled null (``experiment.drift``): the
    primary rule's metrics (``dp``: ``longview.drift_primary``; its FMM is the far-pair missed share) and
    the former rule on that share alone, now secondary (``dv``: ``metrics.drift_rule_verdict``)."""
    return [
        ("ch4_drift_block", DRIFT_RULE["block_steps"], None),
        ("ch4_drift_shuffles", DRIFT_RULE["n_shuffles"], None),
        ("ch4_drift_budget", DRIFT_RULE["budget"], "{:.0%}"),
        ("ch4_drift_effect", dv["mean"], "{:+.1%}"),
        (
            "ch4_drift_effect_ci",
            f"{dv['lo']:+.1%} to {dv['hi']:+.1%}" if np.isfinite(dv["lo"]) else "not computable",
            None,
        ),
        ("ch4_drift_obs", drift.miss_observed.mean(), "{:.3f}"),
        ("ch4_drift_null", drift.miss_null_mean.mean(), "{:.3f}"),
        ("ch4_glir_excess", (drift.global_lir_observed - drift.global_lir_null_mean).mean(), "{:+.0%}"),
        ("ch4_blir_obs", drift.budget_lir_observed.mean(), "{:.0%}"),
        ("ch4_blir_excess", (drift.budget_lir_observed - drift.budget_lir_null_mean).mean(), "{:+.0%}"),
        ("ch4_drift_rule", DRIFT_PRIMARY_RULE["text"], None),
        ("ch4_drift_secondary_rule", DRIFT_RULE["text"], None),
        ("ch4_drift_primary", drift_primary_text(dp), None),
        ("ch4_drift_secondary", secondary_drift_label(dv), None),
    ]


def drift_verdict(drift: pd.DataFrame, dp: dict, n_boot: int, seed: int, at=None):
    """The primary drift rule as declared in data/claims.yaml (``ch4_drift``: Global LIR and the one-shot
    FMM against their shuffled-order null, ``longview.DRIFT_PRIMARY_RULE``) on a per-unit drift table
    (``dp``: ``longview.drift_primary`` of it), recomputed at its declared sensitivity ends (``at``: the
    attention-dependent ones, where the attention is at hand); it must agree with ``dp``'s verdict."""
    v = claims.evaluate("ch4_drift", dp["value"], missing=drift_primary_missing(dp),
                        recompute=drift_primary_recompute(drift, n_boot, seed, at))
    own = primary_verdict(dp)
    if v.verdict != own:
        raise AssertionError(f"claims.evaluate says {v.verdict!r}, the primary drift rule {own!r}")
    return v


def drift_claim_text(drift: pd.DataFrame, dv: dict, dp: dict, lir_mean: float,
                     units: str = "documents") -> str:
    """What the ledger shows as computed for the drift claim: the primary metrics against their null (the
    FMM as the far-pair missed share in decoding order vs shuffled), then the former rule's verdict on the
    FMM alone, labelled secondary."""
    return (
        f"primary (the paper's metrics against the shuffled-order null, {dv['n_docs']} {units}): "
        f"{drift_primary_text(dp)}; one-shot FMM at far pairs {drift.miss_observed.mean():.3f} in decoding "
        f"order vs {drift.miss_null_mean.mean():.3f} shuffled; {secondary_drift_label(dv)}"
        + (f"; Global LIR {lir_mean:.0%}" if np.isfinite(lir_mean) else "")
    )


# --- Future Missed Mass, outcomes, memory ----------------------------------------------------------


def fmm_example_glue(sp: pd.DataFrame, policies, budgets) -> list:
    """FMM's two terms for one policy (QEvict-recall if run) at the second-smallest budget."""
    pol = "qevict_recall" if "qevict_recall" in policies else [p for p in policies if p != "full"][0]
    b = sorted(budgets)[min(1, len(budgets) - 1)]
    fx = sp[(sp.policy == pol) & (sp.budget == b)][["fmm", "fmm_quantized", "fmm_evicted"]].mean()
    name = names_of(sp).get(pol, display_label(pol))
    if abs(fx.fmm - fx.fmm_quantized - fx.fmm_evicted) >= 1e-4:
        raise AssertionError("the two terms of FMM do not add up to FMM")
    return [
        ("ch4_fmm_ex_where", f"{name} at a budget of {b:.0%}", None),
        (
            "ch4_fmm_ex",
            f"{fx.fmm_quantized:.3f} (quantized) + {fx.fmm_evicted:.3f} (not readable) = {fx.fmm:.3f}",
            None,
        ),
    ]


def fmm_glue(sp: pd.DataFrame, policies) -> list:
    """Range of the evicting policies' missed mass, and QEvict-recall's by budget and tier."""
    evp = [p for p in EVICTING if p in policies]
    fe = sp[sp.policy.isin(evp)].groupby(["policy", "budget"]).fmm_evicted.mean()
    tq = sp[sp.policy == "qevict_recall"].groupby("budget")[["fmm_quantized", "fmm_evicted"]].mean()
    names = names_of(sp)
    return [
        ("ch4_fmm_evict_min", float(fe.min()) if len(fe) else float("nan"), "{:.3f}"),
        (
            "ch4_fmm_evict_min_at",
            f"{names[fe.idxmin()[0]]} at {fe.idxmin()[1]:.0%}" if len(fe) else "n/a",
            None,
        ),
        ("ch4_fmm_evict_max", float(fe.max()) if len(fe) else float("nan"), "{:.3f}"),
        (
            "ch4_fmm_qevict_split",
            "; ".join(
                f"{f:.0%}: {r.fmm_quantized:.3f} quantized, {r.fmm_evicted:.3f} evicted"
                for f, r in tq.iterrows()
            )
            or "not run",
            None,
        ),
    ]


def outcomes_table(sp: pd.DataFrame) -> pd.DataFrame:
    """Means over documents of every outcome per (budget, policy label); the label is the display name
    (``analysis.qevict.labels``), which says where a policy evicted to fit its budget."""
    return (
        named(sp).groupby(["budget", "label"], sort=False)
        .agg(
            KL=("kl", "mean"),
            dppl=("dppl", "mean"),
            top1=("top1", "mean"),
            FMM=("fmm", "mean"),
            FMM_quantized=("fmm_quantized", "mean"),
            FMM_unreadable=("fmm_evicted", "mean"),
            device_frac=("device_frac", "mean"),
            offdevice_frac=("offdevice_frac", "mean"),
            recall_bytes_per_step=("recall_bytes_per_step", "mean"),
            needle=("needle_acc", "mean"),
            fits=("fits", "all"),
            promotions=("promotions", "mean"),
        )
        .reset_index()
    )


def best_glue(outcomes: pd.DataFrame, budgets) -> list:
    """The policy of lowest mean KL per budget (``ch4_best_<percent>``) and the budgets."""
    best = outcomes.loc[outcomes.groupby("budget").KL.idxmin()].set_index("budget")
    rows = [(f"ch4_best_{int(round(f * 100))}", r["label"], None) for f, r in best.iterrows()]
    return rows + [("ch4_budgets", ", ".join(f"{b:.0%}" for b in budgets), None)]


def quest_pages_low(params, cfg, prefill_tokens: int, window_tokens: int, budgets) -> int:
    """Full windows per layer and KV head an offloading policy holds after the prefill at the lowest
    budget, its key digests paid (besides the sinks and the window being written); ``params``: the
    chapter's parameters, as ``experiment.policy_config`` reads them."""
    nc0 = prefill_tokens // window_tokens
    qp = make_policy("quest", min(budgets), policy_config(params), cfg.n_layers, cfg.n_kv_heads, nc0 + 1)
    return nc0 if qp.fits_all(nc0) else qp.n_hold(nc0)


def pareto_glue(ptab: pd.DataFrame, policies) -> list:
    """The three-way Pareto front's members and Quest's median recall traffic over QEvict-recall's."""
    front = ptab[ptab.pareto]
    rows = [
        ("ch4_pareto_members", "; ".join(f"{r.label} at {r.budget:.0%}" for _, r in front.iterrows()), None)
    ]
    rp = [p for p in RECALLING if p in policies]
    traffic = ptab[ptab.policy.isin(rp)].pivot(
        index="budget", columns="policy", values="recall_bytes_per_step"
    )
    if {"qevict_recall", "quest"} <= set(traffic.columns):
        r = (traffic.quest / traffic.qevict_recall.replace(0, np.nan)).median()
        rows.append(
            (
                "ch4_quest_traffic_ratio",
                f"{r:,.0f}×" if np.isfinite(r) else "n/a (QEvict recalled nothing)",
                None,
            )
        )
    else:
        rows.append(("ch4_quest_traffic_ratio", "not run", None))
    return rows


RECALL_COLUMNS = {
    "label": "policy",
    "budget": "budget (% of full cache)",
    "kl": "KL (nats/token)",
    "device_frac": "on device (% of full cache)",
    "offdevice_frac": "off device (% of full cache)",
    "recall_bytes_per_step": "recalled (bytes/step)",
    "recall_transfers_per_step": "window transfers (count/step)",
}


def recall_table(ptab: pd.DataFrame, policies) -> pd.DataFrame:
    """The recalling policies' KL, bytes on and off the device and recall traffic (display names)."""
    rp = [p for p in RECALLING if p in policies]
    return ptab[ptab.policy.isin(rp)][list(RECALL_COLUMNS)].rename(columns=RECALL_COLUMNS)


# --- tuning, verdicts -----------------------------------------------------------------------------

TUNED_COLUMNS = {
    "budget": "budget (% of full cache)",
    "full_share": "full-precision share of the budget (%)",
    "qbits": "quantized tier (bits)",
    "score_decay": "score decay (per step)",
    "promote_margin": "promotion margin (fraction of score)",
    "geo_mean_kl": "tuning KL, geometric mean (nats)",
}


def tuned_table(tuned: dict) -> pd.DataFrame:
    """The frozen settings, one row per (policy, budget), display names."""
    rows = [
        dict(policy=display_label(p), budget=float(f), **dict(s.items()))
        for p, d in tuned["settings"].items()
        for f, s in d.items()
    ]
    return pd.DataFrame(rows).rename(columns=TUNED_COLUMNS)


def tuning_glue(tuned: dict | None) -> list:
    """Where the frozen settings come from and whether the code they were searched with changed."""
    if tuned is None:
        return [
            ("ch4_tuning_docs", "none (hand-set knobs)", None),
            ("ch4_tuning_candidates", 0, None),
            ("ch4_tuning_when", "not searched", None),
            ("ch4_tuning_status", "not used", None),
        ]

    sr = stale_reasons(tuned)
    status = (
        "current"
        if sr == []
        else "unknown (no git history here)"
        if sr is None
        else "STALE: " + "; ".join(sr) + " (rerun python -m analysis.qevict.tuning)"
    )
    return [
        ("ch4_tuning_docs", ", ".join(tuned["tuning_documents"]), None),
        ("ch4_tuning_candidates", tuned["n_candidates"], None),
        (
            "ch4_tuning_when",
            f"{tuned['provenance']['date']} (commit {tuned['provenance']['commit'][:10]})",
            None,
        ),
        ("ch4_tuning_status", status, None),
    ]


def compressed(summary: pd.DataFrame) -> pd.DataFrame:
    """The run's summary rows of every policy but the full cache (the compressed ones)."""
    return summary[summary.policy != "full"]


def baselines(policies) -> list:
    """The policies QEvict-recall is compared with: all but the full cache and the QEvict variants."""
    return [p for p in policies if p not in THREE_TIER]


def qevict_default(summary: pd.DataFrame, policies):
    """The declared QEvict rule on the default run: ``(share, verdict, rule table, why missing)``
    (``verdicts.qevict_value``), or not testable when QEvict-recall or every baseline is absent."""
    base = baselines(policies)
    if "qevict_recall" in policies and base:
        share, v, table = qevict_value(summary, "qevict_recall", base)
        return share, v, table, missing_documents(summary.document.nunique(), QEVICT_RULE["min_docs"])
    return (
        float("nan"),
        "not testable from public data",
        pd.DataFrame(columns=["baseline", "outcome"]),
        "QEvict-recall and at least one baseline must be among the policies run",
    )


def qevict_verdict(summary: pd.DataFrame, base, share: float, verdict: str, why: str):
    """The declared QEvict rule (``ch4_qevict_three_tiers`` in data/claims.yaml: the share of baselines
    QEvict-recall passes at >= 75% of the budgets) on :func:`qevict_default`'s share, recomputed at the
    rule's declared sensitivity ends; it must agree with ``verdict``, the rule's own."""
    v = claims.evaluate("ch4_qevict_three_tiers", share, missing=why,
                        recompute=qevict_recompute(summary, "qevict_recall", base))
    if not (v.verdict == verdict or verdict.startswith("not testable")):
        raise AssertionError(f"claims.evaluate says {v.verdict!r}, the QEvict rule {verdict!r}")
    return v


def outcome_counts(table: pd.DataFrame) -> dict:
    """Pairs per outcome of the rule table (every outcome of :data:`OUTCOMES`, zero if absent)."""
    c = table.outcome.value_counts() if len(table) else pd.Series(dtype=int)
    return {k: int(c.get(k, 0)) for k in OUTCOMES}


def outcome_counts_text(table: pd.DataFrame) -> str:
    """'b better, n not worse, w worse, u unclear' of a rule table."""
    c = outcome_counts(table)
    return f"{c['better']} better, {c['not worse']} not worse, {c['worse']} worse, {c['unclear']} unclear"


def verdict_glue(table: pd.DataFrame, n_budgets: int, labels: dict | None = None) -> list:
    """Pairs per outcome (``ch4_n_<outcome>``), their number, and the baselines QEvict-recall passes
    (better or not worse at the rule's share of the budgets) or fails, by their display names
    (``labels``: ``analysis.qevict.labels.names_of`` the run's summary)."""
    rows = [(f"ch4_n_{k.replace(' ', '_')}", n, None) for k, n in outcome_counts(table).items()]
    rows.append(("ch4_n_pairs", len(table), None))
    passed = (
        table.assign(ok=table.outcome.isin(["better", "not worse"])).groupby("baseline").ok.sum()
        if len(table)
        else pd.Series(dtype=int)
    )
    need = int(np.ceil(QEVICT_RULE["min_budget_share"] * n_budgets - 1e-9))
    names = labels_for(passed.index, labels)
    rows.append(
        (
            "ch4_baselines_passed",
            ", ".join(names[b] for b, k in passed.items() if k >= need) or "none",
            None,
        )
    )
    rows.append(
        (
            "ch4_baselines_failed",
            ", ".join(names[b] for b, k in passed.items() if k < need) or "none",
            None,
        )
    )
    return rows


def qevict_claim_text(
    table: pd.DataFrame, verdict: str, why: str, n_documents: int, prefill_tokens: int, decode_tokens: int
) -> str:
    """What the ledger shows as computed for the three-tier claim on the default run."""
    if verdict == "not testable from public data":
        return f"not testable: {why}"
    return (
        f"QEvict-recall vs {len(table)} (baseline, budget) pairs on KL (Holm): {outcome_counts_text(table)} "
        f"({n_documents} documents, {prefill_tokens:,} + {decode_tokens:,} tokens)"
    )


def rule_labels(extra: dict, keys) -> list:
    """The ledger's label of the declared QEvict rule for each scope in ``keys`` (``extra[key]``:
    ``(share, recompute, why missing)``, as ``verdicts.by_genre`` and ``longview.qevict_by_scope``
    return them)."""
    return [
        claims.evaluate("ch4_qevict_three_tiers", sh, recompute=rc, missing=why).label
        for sh, rc, why in (extra[k] for k in keys)
    ]


def runs_genres(policies, base) -> bool:
    """Whether the per-genre comparison can run: QEvict-recall and at least one baseline were run."""
    return "qevict_recall" in policies and bool(base)


GENRE_COLUMNS = {"documents": "documents (count)", "better": "better (pairs)",
                 "not worse": "not worse (pairs)", "worse": "worse (pairs)", "unclear": "unclear (pairs)"}


def genre_rule_table(summary: pd.DataFrame, base, labels: dict) -> pd.DataFrame:
    """The declared QEvict rule on each genre's documents alone (``verdicts.by_genre``) with the
    ledger's label of each genre's verdict, units in the column names."""
    gtab, gextra = rule_by_genre(summary, "qevict_recall", base, labels)
    gtab["verdict (declared rule)"] = rule_labels(gextra, gtab.genre)
    return gtab.drop(columns="share").rename(columns=GENRE_COLUMNS)


def genre_wins_text(ratios: pd.DataFrame) -> str:
    """Per genre, how many baselines QEvict-recall has a lower mean KL than (ratio below 1)."""
    wins = (ratios < 1).sum(axis=1)
    return "; ".join(f"{g}: lower KL than {int(n)} of {ratios.shape[1]} baselines" for g, n in wins.items())


def lir_gain_glue(cor: dict, prefix: str = "ch4_lir_gain") -> list:
    """Spearman's rho between a document's LIR and the KL gain of recall, with its interval."""
    return [
        (
            f"{prefix}_rho",
            f"{cor['rho']:+.2f}" if np.isfinite(cor["rho"]) else "not computable (fewer than 3 documents)",
            None,
        ),
        (
            f"{prefix}_ci",
            f"{cor['lo']:+.2f} to {cor['hi']:+.2f}" if np.isfinite(cor["lo"]) else "not computable",
            None,
        ),
    ]


PROMOTION_COLUMNS = [
    "policy",
    "budget (% of full cache)",
    "promotions (window-heads per document)",
    "recalled (bytes per document)",
    "KL (nats/token)",
]


def promotion_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Promotions, recalled bytes and KL of the three-tier policies per budget (means over documents)."""
    pr = (
        named(summary)[summary.policy.isin(["mikv", "qevict_dequant", "qevict_recall"])]
        .groupby(["label", "budget"])
        .agg(promotions=("promotions", "mean"), recall_bytes=("recall_bytes", "mean"), kl=("kl", "mean"))
        .reset_index()
    )
    pr.columns = PROMOTION_COLUMNS
    return pr


def promotion_glue(summary: pd.DataFrame) -> list:
    """QEvict-recall's recalled bytes per decoding step and promotions per document."""
    rb = summary[summary.policy == "qevict_recall"]
    return [
        ("ch4_recall_bytes_per_step", (rb.recall_bytes / rb.decode_steps).mean(), "bytes"),
        ("ch4_promotions_per_doc", rb.promotions.mean(), "{:,.0f}"),
    ]


def cold_glue(tier_bytes: pd.DataFrame, cfg) -> list:
    """QEvict-recall's cold-tier bytes per token against the whole fp16 cache's."""
    qr = tier_bytes[tier_bytes.policy == "qevict_recall"]
    return [
        ("ch4_cold_per_token", qr.bytes_cold_per_token.mean(), "bytes"),
        ("ch4_full_kv_per_token", cfg.kv_bytes_per_token_fp16, "bytes"),
    ]


# --- committed long runs ----------------------------------------------------------------------------


def stale_text(arts, config: str = "sweeps/qevict_long.yaml") -> str:
    """The stale long runs in words; those being regenerated with how far each is
    (``longrun_units.regeneration_status``: documents computed on the current code, of all)."""
    stale = [a.name for a in arts if a.stale]
    if not stale:
        return "none"
    reg = longrun_units.regenerating(config)
    status = longrun_units.regeneration_status(config) if reg["runs"] else {}
    plain = [n for n in stale if n not in status]
    regen = [f"{n} {status[n]['done']} of {status[n]['total']}" for n in stale if n in status]
    parts = ["; ".join(plain)] if plain else []
    if regen:
        parts.append(f"being regenerated since {reg['since']} (documents computed on the current code: "
                     + ", ".join(regen) + ")")
    return "; ".join(parts)


def long_glue(arts, missing, long_table: pd.DataFrame) -> list:
    """Which long runs are committed, missing or stale, and their re-decisions and promotions."""
    rows = [
        ("ch4_long_lengths", long_lengths_text(), None),
        ("ch4_long_scored_steps", scored_steps_text([a.tables["summary"] for a in arts]), None),
        ("ch4_long_present", ", ".join(a.name for a in arts) or "none", None),
        ("ch4_long_missing", ", ".join(missing) or "none", None),
        ("ch4_long_stale", stale_text(arts), None),
    ]
    if len(long_table):
        rq = (long_table[long_table.policy == "qevict_recall"] if "policy" in long_table
              else long_table[long_table.label == display_label("qevict_recall")])
        rows += [
            ("ch4_long_redecide", long_table.redecisions_per_1000.mean(), "{:.0f}"),
            ("ch4_long_promote", rq.promotions_per_1000.mean() if len(rq) else float("nan"), "{:,.0f}"),
        ]
    else:
        rows += [("ch4_long_redecide", "n/a", None), ("ch4_long_promote", "n/a", None)]
    return rows


def long_descriptions(arts) -> list:
    """One Markdown list item per committed long run: its description and its provenance's notes."""
    return [
        "- " + a.describe() + (f" — *{a.provenance['notes']}*" if a.provenance.get("notes") else "")
        for a in arts
    ]


LONG_RULE_COLUMNS = {
    "scope": "genre",
    "context_tokens": "context (tokens)",
    "documents": "documents (count)",
    "better": "better (pairs)",
    "not worse": "not worse (pairs)",
    "worse": "worse (pairs)",
    "unclear": "unclear (pairs)",
}


def long_rule_verdicts(rules: pd.DataFrame) -> pd.DataFrame:
    """``longview.long_rule_tables`` with the ledger's label of the declared rule per row."""
    out = rules.copy()
    out["verdict (declared rule)"] = [
        claims.evaluate(
            "ch4_qevict_three_tiers",
            r.share,
            missing=(
                f"{r.documents} document(s) with results in this run "
                f"(the declared rule needs at least {r.min_docs})"
                if r.documents < r.min_docs
                else "QEvict-recall not in this run"
            ),
        ).label
        for r in out.itertuples()
    ]
    return out


def long_rule_summary(rules: pd.DataFrame) -> str:
    """The declared rule's label per committed run, over all its genres."""
    if not len(rules):
        return "no long run committed yet"
    top = rules[rules.scope == "all genres"]
    return (
        "; ".join(
            f"{r['run']} ({r['model']}, {r['context_tokens']:,} tokens, {r['documents']} documents): "
            f"{r['verdict (declared rule)']}"
            for r in top.to_dict("records")
        )
        or "no committed run has QEvict-recall"
    )


def long_rule_display(rules: pd.DataFrame) -> pd.DataFrame:
    """:func:`long_rule_verdicts` with the chapter's columns and names."""
    return rules[
        [
            "run",
            "scope",
            "context_tokens",
            "documents",
            "better",
            "not worse",
            "worse",
            "unclear",
            "verdict (declared rule)",
        ]
    ].rename(columns=LONG_RULE_COLUMNS)


def gemma_reference_text(ref) -> str:
    """The Gemma 3 port against Hugging Face transformers (``longview.gemma_reference``)."""
    if ref is None:
        return "not computed yet"
    r = ref.tables["perplexity"].iloc[0]
    return (
        f"perplexity on {r.tokens:,} tokens of {r.module}.py {r.ppl_numpy_fp32_kv:.4f} here "
        f"vs {r.ppl_transformers:.4f} with {r.reference} (relative difference {r.rel_diff:.1e}, tolerance "
        f"{r.tolerance:g}: {r.verdict}); {ref.describe()}"
    )


# --- the main comparison ------------------------------------------------------------------------------

MAIN_GLUE = (
    "ch4_main_units",
    "ch4_main_setup",
    "ch4_main_qevict_counts",
    "ch4_main_drift_effect",
    "ch4_main_lir_gain_rho",
    "ch4_main_recall_trend",
    "ch4_main_recall_trend_rule",
    "ch4_main_trend_count",
    "ch4_ledger_scope",
    "ch4_main_drift_primary",
    "ch4_main_drift_secondary",
)


def main_missing_reason(main) -> str | None:
    """Why the main comparison cannot be judged (``longview.main_comparison``), None if it can."""
    if main is not None and not main["stale"] and len(main["summary"]) and len(main["drift"]):
        return None
    return (
        "no main run committed"
        if main is None
        else f"stale main run(s): {', '.join(main['stale'])}"
        if main["stale"]
        else "the main runs have no drift table"
    )


def _missing_main_glue(why: str) -> list:
    """The glue rows of :data:`MAIN_GLUE` when the main comparison is not there: each says why."""
    said = {"ch4_main_units": "none", "ch4_main_trend_count": f"none (not computed: {why})",
            "ch4_ledger_scope": f"the default run above ({why})"}
    return [(k, said.get(k, f"not computed ({why})"), None) for k in MAIN_GLUE]


def _main_qevict(sm, base) -> tuple:
    """QEvict-recall against the baselines: the ledger's verdict (checked against the rule's), the
    rule table and its outcome counts in words."""
    share, vq, rm = qevict_value(sm, "qevict_recall", base)
    v_qc = claims.evaluate(
        "ch4_qevict_three_tiers",
        share,
        missing=missing_documents(sm.document.nunique(), QEVICT_RULE["min_docs"]),
        recompute=qevict_recompute(sm, "qevict_recall", base),
    )
    if not (v_qc.verdict == vq or vq.startswith("not testable")):
        raise AssertionError(f"ledger verdict {v_qc.verdict!r} differs from the rule's {vq!r}")
    c = outcome_counts(rm)
    counts = (
        f"{c['better']} better, {c['not worse']} not worse, {c['worse']} worse and {c['unclear']} unclear "
        f"of {len(rm)} pairs"
    )
    return v_qc, rm, counts


def _main_scope_tables(sm, dm, base, genre_labels: dict, n_boot: int, seed: int) -> dict:
    """Per (model, genre): QEvict-recall's outcome counts and verdict, the primary drift statistic and
    the relative drift excess, with the chapter's column names."""
    qt, qx = qevict_by_scope(sm, "qevict_recall", base, genre_labels)
    qt["verdict (declared rule)"] = rule_labels(qx, list(zip(qt.model, qt.genre)))
    qt = qt.drop(columns="share").rename(
        columns={
            "units": "units (count)",
            "better": "better (pairs)",
            "not worse": "not worse (pairs)",
            "worse": "worse (pairs)",
            "unclear": "unclear (pairs)",
        }
    )
    pscope = drift_primary_scope(dm, genre_labels, n_boot, seed).rename(
        columns={"scope": "genre", "units": "units (count)"})
    ex_cols = ["relative excess (mean, %)", "95% interval low (%)", "95% interval high (%)"]
    dscope = drift_by_scope(dm, genre_labels, n_boot, seed).rename(
        columns={
            "scope": "genre",
            "documents": "units (count)",
            "mean": ex_cols[0],
            "lo": ex_cols[1],
            "hi": ex_cols[2],
            "verdict": "verdict (declared rule)",
        }
    )
    p_cols = [c for c in pscope.columns if c not in ("model", "genre", "units (count)")]
    return dict(by_scope=qt, drift_scope=dscope, drift_columns=ex_cols, drift_primary_scope=pscope,
                drift_primary_columns=p_cols)


def main_view(main, n_boot: int, seed: int, genre_labels: dict) -> dict:
    """Everything the chapter shows of the main comparison at long context: the ledger's two
    verdicts, the rule table and its forest plot's input, the per-scope tables, the budget trend and
    the glue rows (``glue``). Without a fresh main comparison the verdicts are None and every glued
    value says why."""
    why = main_missing_reason(main)
    if why is not None:
        return dict(glue=_missing_main_glue(why), v_drift=None, v_qevict=None)
    sm, dm = main["summary"], main["drift"]
    units = sm.document.nunique()
    base = baselines(sm.policy.unique())
    v_qc, rm, counts = _main_qevict(sm, base)
    dvm = drift_rule_verdict(dm.miss_rel_excess.values, n_boot, seed)  # the secondary statistic
    dpm = drift_primary(dm, n_boot, seed)
    # the committed runs hold no attention: the top-share ends from drift_ends, the block ends not assessed
    v_drift = drift_verdict(dm, dpm, n_boot, seed, drift_ends_at(dm, main["drift_ends"]))
    lg = lir_gain_correlation(sm, dm.set_index("document").global_lir_observed, n_boot=n_boot, seed=seed)
    trend, trend_count = budget_trend_table(sm, ("mikv", "qevict_dequant", "qevict_recall"), names_of(sm))
    models = " and ".join(main["models"])
    glue = [
        ("ch4_main_units", units, None),
        ("ch4_main_setup", main_setup_text(sm, genre_labels), None),
        ("ch4_main_qevict_counts", counts, None),
        (
            "ch4_main_drift_effect",
            f"{dvm['mean']:+.1%} (95% interval {dvm['lo']:+.1%} to {dvm['hi']:+.1%})"
            if np.isfinite(dvm["lo"])
            else "not computable",
            None,
        ),
        (
            "ch4_main_lir_gain_rho",
            f"{lg['rho']:+.2f} (95% bootstrap interval {lg['lo']:+.2f} to "
            f"{lg['hi']:+.2f}, {lg['n_docs']} units)"
            if np.isfinite(lg["rho"])
            else "not computable",
            None,
        ),
        ("ch4_main_recall_trend", budget_trend_text(sm, "qevict_recall"), None),
        ("ch4_main_recall_trend_rule", budget_trend_rule_text(sm, "qevict_recall"), None),
        ("ch4_main_trend_count", trend_count, None),
        (
            "ch4_ledger_scope",
            f"the main comparison at long context ({', '.join(main['names'])}; {units} units)",
            None,
        ),
        ("ch4_main_drift_primary", drift_primary_text(dpm), None),
        ("ch4_main_drift_secondary", secondary_drift_label(dvm), None),
    ]
    claim_drift = drift_claim_text(dm, dvm, dpm, float("nan"),
                                   f"(document, model) units at long context, {models}")
    claim_qevict = (
        f"QEvict-recall vs {len(rm)} (baseline, budget) pairs on KL (Holm) at long context: "
        f"{counts} ({units} (document, model) units, {models})"
    )
    return dict(
        glue=glue,
        v_drift=v_drift,
        v_qevict=v_qc,
        units=units,
        rules=rm,
        labels=names_of(sm),
        **_main_scope_tables(sm, dm, base, genre_labels, n_boot, seed),
        trend=trend,
        claim_drift=claim_drift,
        claim_qevict=claim_qevict,
    )


def _main_view_of(arts, n_boot: int, seed: int, genre_labels: dict) -> dict:
    return main_view(main_comparison(arts), n_boot, seed, genre_labels)


def main_view_cached(arts, n_boot: int, seed: int, genre_labels: dict) -> dict:
    """:func:`main_view` of the committed runs ``arts`` (``longview.long_results``) through
    :mod:`analysis.cache`: the chapter (its ledger verdicts) and its evidence page (the tables) both
    need it, and it costs about a minute.  Keyed on each run's recorded table hashes and code hash,
    its staleness now, the arguments and this module's code with its imports."""
    runs = [dict(name=a.name, tables=a.provenance.get("tables"), code_hash=a.provenance.get("code_hash"),
                 stale=list(a.stale_reasons)) for a in arts]
    return cached("qevict_main_view", dict(runs=runs, n_boot=n_boot, seed=seed, genre_labels=genre_labels),
                  functools.partial(_main_view_of, arts, n_boot, seed, genre_labels),
                  code=["analysis.qevict.chapter"])


def short_unit_names(units) -> list:
    """Short labels of the main comparison's units ``"genre:first+second... [model]"`` for a scatter plot:
    the first source document, ``+`` when it continues, and the model's family (``gemma3-270m`` ->
    ``gemma3``)."""
    out = []
    for u in units:
        doc, _, model = str(u).partition(" [")
        first, plus, _ = doc.partition("+")
        out.append(f"{first}{plus} [{model.rstrip(']').split('-')[0]}]" if model else f"{first}{plus}")
    return out


def ledger_glue(
    main: dict, v_drift_default, v_qc_default, claim_drift_default: str, claim_qevict_default: str
) -> tuple:
    """The ledger's two chapter-4 verdicts (the main comparison where it is committed and fresh, else
    the default run) and the computed texts: ``(v_drift, v_qevict, glue rows)``."""
    v_drift = main["v_drift"] or v_drift_default
    v_qc = main["v_qevict"] or v_qc_default
    rows = [
        ("ch4_verdict_counts", claims.counts_text([v_drift, v_qc]), None),
        (
            "ch4_claim_drift_computed",
            main["claim_drift"] if main["v_drift"] else f"{claim_drift_default} (default run)",
            None,
        ),
        (
            "ch4_claim_qevict_computed",
            main["claim_qevict"] if main["v_qevict"] else f"{claim_qevict_default} (default run)",
            None,
        ),
    ]
    return v_drift, v_qc, rows


def value_of(rows: list, name: str):
    """The value of glue row ``name`` among ``rows``."""
    return next(v for n, v, _ in rows if n == name)


def main_document_sources() -> pd.DataFrame:
    """Where the main comparison's documents come from, one row per genre
    (:func:`analysis.qevict.corpora.document_sources` of every document the main runs declare)."""
    specs = [s for r in long_runs() if r["name"].startswith(MAIN_PREFIX) for s in r["documents"]]
    return document_sources(specs)
