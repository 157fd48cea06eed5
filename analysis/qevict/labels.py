"""Chapter 4's display names of the policies, honest about the budget.

A quantize-only policy (KIVI) cannot go below its own footprint: where even quantizing every window
does not fit the budget, it evicts its oldest windows to stay within it, and the run records
``fits=False`` for that stream (``analysis.qevict.policies.KIVI``).  Such a policy is no longer what
its name says, so every table, figure and text of chapter 4 names it through :func:`display_label`,
which appends "(evicts to fit at ...)" with the budgets at which it did, read from the run's ``fits``
flags: derived from the data, never from a list of policy names.

:data:`analysis.qevict.policies.POLICY_LABELS` is read here only; the chapter's modules take their
names from this module (``tests/test_qevict_labels.py`` checks both).
"""
from __future__ import annotations

import pandas as pd

from .policies import POLICY_LABELS

EVICTS_TO_FIT = "evicts to fit"


def budgets_text(budgets) -> str:
    """Budgets as whole percentages in ascending order: (0.2, 0.1) -> '10%, 20%'."""
    return ", ".join(f"{b:.0%}" for b in sorted({float(b) for b in budgets}))


def display_label(policy: str, unfit=()) -> str:
    """The name chapter 4 shows for ``policy``: its label, followed by "(evicts to fit at <budgets>)"
    when ``unfit`` (the budgets at which some stream of it did not fit, :func:`unfit_budgets`) is not
    empty."""
    base = POLICY_LABELS.get(policy, policy)
    unfit = tuple(unfit)
    return f"{base} ({EVICTS_TO_FIT} at {budgets_text(unfit)})" if unfit else base


def _check(summary: pd.DataFrame):
    missing = {"policy", "budget", "fits"} - set(summary.columns)
    if missing:
        raise ValueError(f"a summary needs the columns policy, budget and fits to name its policies "
                         f"honestly; missing: {', '.join(sorted(missing))} (use the run's summary table, "
                         f"analysis.qevict.metrics.summarize_run)")


def unfit_budgets(summary: pd.DataFrame) -> dict:
    """Per policy of ``summary``, the sorted budgets at which at least one of its streams (a document,
    in any run the table pools) did not fit its budget (``fits`` False); () where all fitted."""
    _check(summary)
    fits = summary["fits"].astype(bool)
    out = {}
    for p, d in summary.assign(_fits=fits).groupby("policy", sort=False):
        out[p] = tuple(sorted({float(b) for b in d.loc[~d._fits, "budget"]}))
    return out


def display_labels(summary: pd.DataFrame) -> dict:
    """``{policy: display name}`` for every policy of ``summary`` (:func:`display_label` of its
    :func:`unfit_budgets`)."""
    return {p: display_label(p, u) for p, u in unfit_budgets(summary).items()}


def with_display_labels(summary: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``summary`` whose ``label`` column holds :func:`display_labels`: one name per policy,
    so a policy stays one line in a figure and one group in a table across its budgets."""
    names = display_labels(summary)
    out = summary.copy()
    out["label"] = out["policy"].map(names)
    return out


def labels_for(policies, names: dict | None = None) -> dict:
    """``{policy: display name}`` for ``policies``: from ``names`` (:func:`display_labels` of the run)
    where given, else the plain :func:`display_label` (a policy not run has no fits to report)."""
    names = names or {}
    return {p: names.get(p, display_label(p)) for p in policies}


def evicts_to_fit_text(summary: pd.DataFrame) -> str:
    """The policies of ``summary`` that evicted to fit their budget, with the budgets, in words."""
    unfit = {p: u for p, u in unfit_budgets(summary).items() if u}
    if not unfit:
        return "none (every policy fitted its budget at every budget run)"
    return "; ".join(f"{POLICY_LABELS.get(p, p)} at {budgets_text(u)}" for p, u in unfit.items())


def names_of(summary: pd.DataFrame) -> dict:
    """``{policy: display name}`` of a table with one row per stream: :func:`display_labels` where it
    has the ``fits`` flags, else its ``label`` column (already named by :func:`with_display_labels`
    upstream), else the plain :func:`display_label`."""
    if "fits" in summary:
        return display_labels(summary)
    if "label" in summary:
        return dict(summary.drop_duplicates("policy")[["policy", "label"]].itertuples(index=False))
    return {p: display_label(p) for p in dict.fromkeys(summary.policy)}


def named(summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` with its ``label`` column named by :func:`with_display_labels` when it has the
    ``fits`` flags (idempotent), else unchanged."""
    return with_display_labels(summary) if "fits" in summary else summary
