"""Where an eviction-based policy loses most to quantization alone.

The chapter's verdicts pool documents (geometric means, Holm counts); this module shows the single
cases behind them where dropping or offloading windows cost most against keeping every window
quantized.  For each (model, budget) the *reference* is the best quantization-only policy at that
budget: a policy that quantizes every window and evicts none (``analysis.qevict.policies.KIVI`` and its
subclasses), counted only where every one of its streams at that budget fitted (``fits``: where it had
to evict to fit, it is not quantization-only there), the best being the one of lowest geometric-mean
KL over the model's documents (chosen per budget, not per document, as a deployment would choose it).
Every other compressed stream (QEvict included, and a KIVI stream that evicted to fit) is
eviction-based, and its loss on a document is its KL minus the reference's KL on the same document
and budget (nats per token), the ratio alongside.  Losses are ranked by that excess: a ratio is
dominated by the tiny KLs of near-lossless references.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .labels import display_label
from .policies import KIVI, REGISTRY

EPS = 1e-6  # added to KL before logs and ratios, as the QEvict rule and the genre ratios do
FOCUS = ("qevict_recall", "qevict_dequant")  # the chapter's own policies: their worst case is always shown
# the glue rows of :func:`failures_glue` at its defaults (glued even when nothing is computed)
GLUE_KEYS = ("ch4_main_worst_loss", *(f"ch4_main_worst_loss_{p}" for p in FOCUS), "ch4_main_losses_count",
             "ch4_main_quant_reference")


def quantize_only(policy: str) -> bool:
    """Whether ``policy`` quantizes every window instead of evicting any (the KIVI family), by its class."""
    if policy not in REGISTRY:
        raise ValueError(f"unknown policy {policy!r}; policies: {', '.join(REGISTRY)}")
    return issubclass(REGISTRY[policy], KIVI)


def _prepare(summary: pd.DataFrame) -> pd.DataFrame:
    need = {"document", "policy", "budget", "kl", "fits"}
    missing = need - set(summary.columns)
    if missing:
        raise ValueError(f"the summary lacks {', '.join(sorted(missing))}: pass a run's summary table "
                         "(analysis.qevict.longview.main_comparison(...)['summary'] or an artifact's "
                         "'summary')")
    s = summary[summary.policy != "full"].copy()
    if "model" not in s:
        s["model"] = ""
    s["model"] = s.model.astype(str)
    s["fits"] = s.fits.astype(bool)
    s["kl"] = s.kl.astype(float)
    s["document"] = s.document.astype(str).str.rsplit(" [", n=1).str[0]  # main_comparison's ' [model]'
    return s


def quantization_references(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (model, budget): the best quantization-only policy (``reference``, lowest geometric-mean KL over
    the model's documents among the quantize-only policies that fitted on every document), its
    geometric-mean KL, and the quantize-only policies that evicted to fit there (``unfit``); ``reference``
    is missing (NA) where none fitted."""
    s = _prepare(summary)
    s = s[s.policy.map(quantize_only)]
    rows = []
    for (m, b), d in s.groupby(["model", "budget"], sort=True):
        ok = d.groupby("policy").fits.all()
        geo = d.groupby("policy").kl.apply(lambda x: float(np.exp(np.log(x + EPS).mean())))
        cand = geo[ok[ok].index]
        ref = str(cand.idxmin()) if len(cand) else None
        rows.append(dict(model=m, budget=float(b), reference=ref,
                         reference_geo_kl=float(cand.min()) if len(cand) else float("nan"),
                         unfit=tuple(sorted(ok[~ok].index))))
    return pd.DataFrame(rows, columns=["model", "budget", "reference", "reference_geo_kl", "unfit"])


def losses_to_quantization(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per eviction-based stream (model, document, budget, policy) at a budget that has a
    quantization-only reference (:func:`quantization_references`): its KL, the reference's KL on the same
    document, the excess (KL minus the reference's, nats per token: above 0, a loss) and the ratio, with
    top-1 agreement where the summary has it.  Display names (``label``, ``reference_label``) are those of
    the stream at its budget: a KIVI stream that evicted to fit says so, the reference (which fitted) not."""
    s = _prepare(summary)
    refs = quantization_references(summary)
    qonly = s.policy.map(quantize_only) & s.fits
    refs = refs[refs.reference.notna()][["model", "budget", "reference"]]
    ev = s[~qonly].merge(refs, on=["model", "budget"])
    key = ["model", "document", "budget", "policy"]
    cols = ["kl"] + (["top1"] if "top1" in s else [])
    ref = s[key + cols].rename(columns={"policy": "reference", **{c: f"{c}_reference" for c in cols}})
    out = ev.merge(ref, on=["model", "document", "budget", "reference"], how="left")
    if out.kl_reference.isna().any():
        bad = out[out.kl_reference.isna()][key].drop_duplicates().head(3).to_dict("records")
        raise ValueError(f"the reference policy has no stream on some documents (e.g. {bad}); every policy "
                         "must run every document of its model")
    out["excess"] = out.kl - out.kl_reference
    out["ratio"] = (out.kl + EPS) / (out.kl_reference + EPS)
    out["label"] = [display_label(p, () if ok else (b,))
                    for p, b, ok in zip(out.policy, out.budget, out.fits)]
    out["reference_label"] = out.reference.map(display_label)  # it fitted on every document at this budget
    keep = key + ["label", "kl", "reference", "reference_label", "kl_reference", "excess", "ratio"]
    keep += [c for c in ("top1", "top1_reference") if c in out]
    out = out[keep].sort_values("excess", ascending=False, kind="stable").reset_index(drop=True)
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    return out


def worst_losses(losses: pd.DataFrame, n: int = 10, focus=FOCUS, one_per=("model", "document", "budget")):
    """The ``n`` largest losses (excess above 0), one per ``one_per`` cell (its worst policy; None: every
    case), and below them the largest loss of each ``focus`` policy not already among them (``rank``
    says where a case stands among every case)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    lost = losses[losses.excess > 0]
    cells = lost.drop_duplicates(list(one_per)) if one_per else lost
    top = cells.head(n)
    extra = [lost[lost.policy == p].head(1) for p in focus if p not in set(top.policy)]
    return pd.concat([top, *extra], ignore_index=True) if extra else top.reset_index(drop=True)


FAILURE_COLUMNS = {  # nine columns: a plain table (analysis.tables.MAX_PLAIN_COLUMNS)
    "rank": "rank (largest loss: 1)",
    "unit": "document [model]",
    "budget": "budget (% of full cache)",
    "label": "eviction-based policy",
    "kl": "KL of the policy (nats/token)",
    "reference_label": "reference (best quantization-only at this budget)",
    "kl_reference": "KL of the reference (nats/token)",
    "excess": "excess KL (nats/token)",
    "ratio": "KL ratio (×)",
}


def failures_table(worst: pd.DataFrame) -> pd.DataFrame:
    """:func:`worst_losses` with the chapter's columns and names (units in the names)."""
    t = worst.assign(unit=worst.document + " [" + worst.model + "]")
    return t[list(FAILURE_COLUMNS)].rename(columns=FAILURE_COLUMNS)


def _case(r) -> str:
    return (f"{r.label} on {r.document} ({r.model}) at {r.budget:.0%}: KL {r.kl:.4f} nats/token against "
            f"{r.kl_reference:.4f} for {r.reference_label}, {r.excess:.4f} more ({r.ratio:,.1f}×)")


def references_text(refs: pd.DataFrame) -> str:
    """Per model, the quantization-only reference at each budget, or why there is none."""
    parts = []
    for m, d in refs.groupby("model", sort=False):
        items = []
        for r in d.itertuples():
            if r.reference is None or pd.isna(r.reference):
                items.append(f"none at {r.budget:.0%} (every quantize-only policy evicted to fit)")
            else:
                items.append(f"{display_label(r.reference)} at {r.budget:.0%}")
        parts.append((f"{m}: " if m else "") + ", ".join(items))
    return "; ".join(parts)


def failures_glue(summary: pd.DataFrame, focus=FOCUS, prefix: str = "ch4_main") -> list:
    """The worst loss of any eviction-based policy and of each ``focus`` policy in words, how many
    cases lose, and the references (``<prefix>_worst_loss``, ``_worst_loss_<policy>``,
    ``_losses_count``, ``_quant_reference``)."""
    losses = losses_to_quantization(summary)
    lost = losses[losses.excess > 0]
    rows = [(f"{prefix}_worst_loss", _case(lost.iloc[0]) if len(lost) else "none (no eviction-based stream "
             "has a higher KL than the quantization-only reference)", None)]
    for p in focus:
        d = lost[lost.policy == p]
        rows.append((f"{prefix}_worst_loss_{p}",
                     (_case(d.iloc[0]) + f", rank {int(d.iloc[0]['rank'])} of {len(losses)} cases") if len(d)
                     else f"none ({display_label(p)} never has a higher KL than the reference)", None))
    per = ", ".join(f"{display_label(p)} in {int((lost.policy == p).sum())} of "
                    f"{int((losses.policy == p).sum())}" for p in focus if (losses.policy == p).any())
    count = (f"{len(lost)} of {len(losses)} (model, document, budget, eviction-based policy) cases have a "
             f"higher KL than the best quantization-only policy at their budget")
    rows.append((f"{prefix}_losses_count", count + (f"; {per}" if per else ""), None))
    rows.append((f"{prefix}_quant_reference", references_text(quantization_references(summary)), None))
    return rows


FAILURE_FORMATS = {
    FAILURE_COLUMNS["budget"]: "{:.0%}",
    FAILURE_COLUMNS["kl"]: "{:.4f}",
    FAILURE_COLUMNS["kl_reference"]: "{:.4f}",
    FAILURE_COLUMNS["excess"]: "{:.4f}",
    FAILURE_COLUMNS["ratio"]: "{:,.1f}",
}


def failures_view(main, n: int = 10) -> dict:
    """What the chapter shows of the losses to quantization on the main comparison
    (``longview.main_comparison``): ``glue`` rows (:data:`GLUE_KEYS`), the ``table`` of
    :func:`failures_table` of the :func:`worst_losses` and every case (``losses``); without a fresh main
    comparison, table and losses are None and every glued value says why."""
    why = ("no main run committed" if main is None or not len(main.get("summary", ()))
           else f"stale main run(s): {', '.join(main['stale'])}" if main.get("stale") else None)
    if why is not None:
        return dict(glue=[(k, f"not computed ({why})", None) for k in GLUE_KEYS], table=None, losses=None)
    sm = main["summary"]
    losses = losses_to_quantization(sm)
    return dict(glue=failures_glue(sm), table=failures_table(worst_losses(losses, n)), losses=losses)
