"""Chapter 4's view of the committed long-context artifacts (``results/qevict_long_*``)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from analysis.artifacts import REPO_ROOT, list_artifacts, read_artifact

LONG_SWEEP = REPO_ROOT / "sweeps" / "qevict_long.yaml"


def long_runs(sweep: Path = LONG_SWEEP) -> list:
    """The runs declared in the long sweep, in its order."""
    with open(sweep) as fh:
        return yaml.safe_load(fh)["runs"]


def long_results(sweep: Path = LONG_SWEEP):
    """(artifacts present, in the sweep's order; names declared but not computed; one table per
    (run, policy, budget) with means over documents)."""
    have = set(list_artifacts())
    names = [r["name"] for r in long_runs(sweep)]
    arts = [read_artifact(n) for n in names if n in have]
    missing = [n for n in names if n not in have]
    rows = []
    for a in arts:
        s = a.tables["summary"].copy()
        s.insert(0, "run", a.name)
        rows.append(s)
    if not rows:
        return arts, missing, pd.DataFrame()
    s = pd.concat(rows, ignore_index=True)
    keys = ["run", "model", "context_tokens", "label", "budget"]
    tbl = s[s.policy != "full"].groupby(keys, sort=False).agg(
        KL=("kl", "mean"), FMM=("fmm", "mean"), needle=("needle_acc", "mean"), top1=("top1", "mean"),
        redecisions_per_1000=("redecisions_per_1000", "mean"),
        promotions_per_1000=("promotions_per_1000", "mean")).reset_index()
    return arts, missing, tbl


def gemma_reference():
    """The committed check of the Gemma 3 port against transformers (or None if not computed)."""
    name = "qevict_gemma_reference"
    return read_artifact(name) if name in set(list_artifacts()) else None


def long_rule_tables(arts, policy: str = "qevict_recall", genre_labels: dict | None = None) -> pd.DataFrame:
    """The declared QEvict rule (``analysis.qevict.verdicts``) on each committed long run, overall and
    per genre: one row per (run, scope) with the documents it has, the outcome counts of its
    (baseline, budget) pairs and the share the ledger's rule tests (NaN when not testable: fewer
    documents than the rule needs, or the policy not run)."""
    from .metrics import QEVICT_RULE
    from .verdicts import by_genre, qevict_value

    rows = []
    for a in arts:
        s = a.tables["summary"].copy()
        s["genre"] = s.document.str.split(":").str[0]
        base = [p for p in s.policy.unique() if p not in ("full", "qevict_dequant", policy)]
        ctx = int(s.context_tokens.max()) if "context_tokens" in s else None
        model = str(s.model.iloc[0]) if "model" in s else ""
        head = dict(run=a.name, model=model, context_tokens=ctx, stale=bool(a.stale))
        if policy not in set(s.policy):
            rows.append(dict(head, scope="all", documents=int(s.document.nunique()), share=float("nan")))
            continue
        share, _, R = qevict_value(s, policy, base)
        c = R.outcome.value_counts() if len(R) else pd.Series(dtype=int)
        rows.append(dict(head, scope="all genres", documents=int(s.document.nunique()),
                         **{k: int(c.get(k, 0)) for k in ("better", "not worse", "worse", "unclear")},
                         share=share, min_docs=QEVICT_RULE["min_docs"]))
        g, _ = by_genre(s, policy, base, genre_labels)
        for r in g.to_dict("records"):
            rows.append(dict(head, scope=r.pop("genre"), **r, min_docs=QEVICT_RULE["min_docs"]))
    return pd.DataFrame(rows)
