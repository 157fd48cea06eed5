"""Chapter 4's verdicts under its declared rules (``data/claims.yaml``; the rule parameters in
:data:`analysis.qevict.metrics.DRIFT_RULE` and :data:`~analysis.qevict.metrics.QEVICT_RULE`): the value
each ledger rule tests, that value recomputed at the sensitivity ends the claims table declares (for
``analysis.claims.evaluate``'s robust / fragile label), and the QEvict rule per genre.

Kept out of :mod:`analysis.qevict.metrics` so that the ledger's bookkeeping stays apart from the
measurements.  Since the long runs compute their ``drift_ends`` tables with :func:`drift_excess`,
this module is part of their code hash too (``analysis.qevict.longrun.MODULES``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .metrics import (
    DRIFT_RULE,
    QEVICT_RULE,
    drift_against_null,
    drift_rule_verdict,
    far_pair_matrix,
    far_pair_mean,
    qevict_rule,
)

PASS = ("better", "not worse")

# The sensitivity names of data/claims.yaml -> the rule parameter each one moves.
QEVICT_SENSITIVITY = {"alpha": "alpha", "non-inferiority margin": "margin_rel",
                      "share of budgets passed": "min_budget_share"}
DRIFT_SENSITIVITY = ("alpha", "top share of windows", "shuffle block (steps)", "minimum effect")


def qevict_share(R: pd.DataFrame, rule: dict = QEVICT_RULE) -> float:
    """The value the ledger's QEvict rule tests: the share of baselines against which the policy is
    'better' or 'not worse' at ``>= min_budget_share`` of the budgets (outcomes of
    :func:`~analysis.qevict.metrics.qevict_rule`); NaN when nothing was testable."""
    if R is None or len(R) == 0 or "outcome" not in R or (R.outcome == "not testable").any():
        return float("nan")
    ok = R.assign(ok=R.outcome.isin(PASS)).groupby("baseline").ok.agg(["sum", "size"])
    return float((ok["sum"] >= np.ceil(rule["min_budget_share"] * ok["size"] - 1e-9)).mean())


def qevict_value(summary: pd.DataFrame, policy: str, baselines, rule: dict = QEVICT_RULE):
    """(share, verdict of the rule in metrics, per-pair table) for ``policy`` against ``baselines``."""
    verdict, R = qevict_rule(summary, policy, baselines, rule)
    return qevict_share(R, rule), verdict, R


def qevict_recompute(summary: pd.DataFrame, policy: str, baselines):
    """``recompute(name, value)`` for :func:`analysis.claims.evaluate`: the share with one rule
    parameter (a sensitivity name of data/claims.yaml, see :data:`QEVICT_SENSITIVITY`) moved."""
    def recompute(name, value):
        if name not in QEVICT_SENSITIVITY:
            raise KeyError(f"unknown sensitivity {name!r} for the QEvict rule; declare one of "
                           f"{sorted(QEVICT_SENSITIVITY)} in data/claims.yaml")
        rule = dict(QEVICT_RULE, **{QEVICT_SENSITIVITY[name]: float(value)})
        return qevict_value(summary, policy, baselines, rule)[0]
    return recompute


def missing_documents(n_docs: int, need: int, what: str = "documents") -> str:
    return f"{n_docs} {what} with results (the declared rule needs at least {need})"


def by_genre(summary: pd.DataFrame, policy: str, baselines, labels: dict | None = None,
             rule: dict = QEVICT_RULE):
    """The QEvict rule applied to each genre's documents alone: one row per genre with its number of
    documents, the outcome counts over (baseline, budget) pairs, the share the ledger's rule tests
    and the (share, recompute, missing) needed for a verdict. A genre with fewer documents than the
    rule needs is not testable, and says so."""
    rows, extra = [], {}
    for g, d in summary.groupby("genre", sort=False):
        n = int(d.document.nunique())
        share, _, R = qevict_value(d, policy, baselines, rule)
        c = R.outcome.value_counts() if len(R) and "outcome" in R else pd.Series(dtype=int)
        name = (labels or {}).get(g, g)
        rows.append({"genre": name, "documents": n, "better": int(c.get("better", 0)),
                     "not worse": int(c.get("not worse", 0)), "worse": int(c.get("worse", 0)),
                     "unclear": int(c.get("unclear", 0)), "share": share})
        extra[name] = (share, qevict_recompute(d, policy, baselines),
                       missing_documents(n, rule["min_docs"], f"document(s) of genre {name}"))
    return pd.DataFrame(rows), extra


def drift_excess(attn_full: np.ndarray, prefill_tokens: int, window: int, sink_windows: int, *,
                 budget: float = DRIFT_RULE["budget"], block: int = DRIFT_RULE["block_steps"],
                 n_shuffles: int = DRIFT_RULE["n_shuffles"], seed: int = 0) -> float:
    """One document's relative excess of the declared drift statistic (far-pair missed share) over
    its block-shuffled null; at the defaults it equals ``document_drift(...)['miss_rel_excess']``."""
    D = attn_full.shape[0]
    M = far_pair_matrix(attn_full, prefill_tokens, window, budget, sink_windows)
    r = drift_against_null(attn_full, lambda a: far_pair_mean(M, np.arange(D)), n_shuffles, seed, int(block),
                           permuted=lambda perm: far_pair_mean(M, perm))
    return float(r["rel_excess"])


def drift_rule_recompute(rel_excess_default, rel_excess_at, n_boot: int = 2000, seed: int = 0):
    """``recompute(name, value)`` for :func:`analysis.claims.evaluate` on the drift claim, whose value
    is the lower end of the interval over documents of the relative excess: with the interval's
    alpha or a minimum effect (the lower end must exceed it: the value is returned less it) moved
    to ``value`` acting on ``rel_excess_default``; any other sensitivity needs the statistic itself
    recomputed, which ``rel_excess_at(name, value)`` returns per document (from the attention, or
    from a committed table)."""
    rel0 = np.asarray(rel_excess_default, float)

    def lo(rel, alpha=DRIFT_RULE["alpha"]):
        return drift_rule_verdict(rel, n_boot, seed, alpha)["lo"]

    def recompute(name, value):
        if name == "alpha":
            return lo(rel0, float(value))
        if name == "minimum effect":
            return lo(rel0) - float(value)
        return lo(np.asarray(rel_excess_at(name, value), float))
    return recompute


def drift_recompute(attn_per_doc, rel_excess_default, prefill_tokens: int, window: int, sink_windows: int,
                    n_boot: int = 2000, seed: int = 0):
    """:func:`drift_rule_recompute` with the top share of windows and the shuffle block recomputed
    from each document's full-cache attention (``attn_per_doc``)."""
    def rel_at(name, value):
        if name == "top share of windows":
            kw = dict(budget=float(value))
        elif name == "shuffle block (steps)":
            kw = dict(block=int(value))
        else:
            raise KeyError(f"unknown sensitivity {name!r} for the drift rule; declare one of "
                           f"{list(DRIFT_SENSITIVITY)} in data/claims.yaml")
        return [drift_excess(a, prefill_tokens, window, sink_windows, seed=seed, **kw) for a in attn_per_doc]
    return drift_rule_recompute(rel_excess_default, rel_at, n_boot, seed)
