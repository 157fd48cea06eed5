"""Chapter 4's main comparison pooled over architectures (analysis.qevict.longview): units, scopes,
and the drift rule's sensitivity ends read from committed tables."""
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from analysis.qevict.longview import drift_by_scope, drift_table_recompute, main_comparison, qevict_by_scope
from analysis.qevict.metrics import drift_rule_verdict

DOCS = ["code:a", "code:b", "tests:c", "tests:d"]


def _summary(model, seed, recall_gain):
    r = np.random.default_rng(seed)
    rows = []
    for d in DOCS:
        base = r.uniform(0.2, 0.4)
        for b in (0.1, 0.2, 0.35, 0.5):
            for p, f in (("full", 0.0), ("h2o", 1.0), ("kivi2", 1.2), ("qevict_recall", 1.0 - recall_gain)):
                rows.append(dict(model=model, document=d, policy=p, budget=b,
                                 kl=0.0 if p == "full" else base * f * (1 - b) * r.uniform(0.97, 1.03)))
    return pd.DataFrame(rows)


def _drift(model, rel):
    return pd.DataFrame(dict(model=model, document=DOCS, miss_rel_excess=rel, global_lir_observed=0.1))


def _art(name, model, seed, gain, rel, stale=False):
    ends = pd.DataFrame([dict(model=model, document=d, sensitivity="top share of windows", end=e, value=v,
                              rel_excess=x * f) for d, x in zip(DOCS, rel)
                         for e, v, f in (("low", 0.10, 0.5), ("high", 0.35, 2.0))])
    return SimpleNamespace(name=name, stale=stale, tables=dict(summary=_summary(model, seed, gain),
                                                               drift=_drift(model, rel), drift_ends=ends))


def test_main_comparison_pools_units_over_models_and_keeps_genres():
    arts = [_art("qevict_long_main_a", "m1", 0, 0.3, [0.1, 0.2, 0.15, 0.05]),
            _art("qevict_long_main_b", "m2", 1, 0.3, [0.12, 0.1, 0.2, 0.08]),
            _art("qevict_long_other", "m1", 2, 0.0, [0.0] * 4)]
    M = main_comparison(arts)
    assert M["names"] == ["qevict_long_main_a", "qevict_long_main_b"] and M["models"] == ["m1", "m2"]
    S = M["summary"]
    assert S.document.nunique() == 8 and set(S.genre) == {"code", "tests"}  # same spec, two models: 2 units
    assert list(M["drift"].document) == sorted(M["drift"].document, key=lambda d: (d[-3:], d))
    t, extra = qevict_by_scope(S, "qevict_recall", ["h2o", "kivi2"], {"code": "source code"})
    assert list(zip(t.model, t.genre, t.units)) == [("both", "all genres", 8), ("m1", "all genres", 4),
                                                    ("m2", "all genres", 4), ("both", "source code", 4),
                                                    ("both", "tests", 4)]
    assert t.iloc[0].better == 8  # 30% lower KL than both baselines at all 4 budgets, on 8 units
    assert extra[("both", "all genres")][0] == 1.0
    assert main_comparison([arts[2]]) is None
    assert main_comparison([_art("qevict_long_main_a", "m1", 0, 0.3, [0.1] * 4, stale=True)])["stale"]


def test_drift_table_recompute_reads_the_committed_ends():
    rel = np.array([0.1, 0.2, 0.15, 0.05, 0.12, 0.1, 0.2, 0.08])
    ends = pd.concat([_art("x", m, 0, 0, rel[i * 4:(i + 1) * 4]).tables["drift_ends"]
                      for i, m in enumerate("ab")])
    rc = drift_table_recompute(rel, ends, n_boot=500, seed=0)
    lo = drift_rule_verdict(rel, 500, 0)["lo"]
    assert rc("minimum effect", 0.05) == pytest.approx(lo - 0.05)
    assert rc("alpha", 0.01) < lo < rc("alpha", 0.10)
    assert rc("top share of windows", 0.35) == pytest.approx(drift_rule_verdict(2 * rel, 500, 0)["lo"])
    with pytest.raises(KeyError, match="shuffle block"):
        rc("shuffle block (steps)", 4)  # not committed: a clear error, not a silent default


def test_drift_by_scope_tests_pooled_genres():
    d = pd.concat([_drift("m1", [0.1, 0.2, -0.3, -0.2]), _drift("m2", [0.12, 0.1, -0.1, -0.25])])
    d["document"] = d.document + " [" + d.model + "]"
    t = drift_by_scope(d, n_boot=500)
    assert list(zip(t.model, t.scope, t.documents)) == [("both", "all genres", 8), ("m1", "all genres", 4),
                                                        ("m2", "all genres", 4), ("both", "code", 4),
                                                        ("both", "tests", 4)]
    assert t.set_index("scope").loc["code", "verdict"] == "reproduced"
    assert t.set_index("scope").loc["tests", "verdict"] == "not reproduced"


def test_budget_trend_finds_the_steps_where_kl_rises():
    from analysis.qevict.longview import budget_trend

    s = pd.DataFrame(dict(model=["a"] * 4 + ["b"] * 4, policy="p", budget=[0.1, 0.2, 0.35, 0.5] * 2,
                          kl=[0.3, 0.2, 0.01, 0.05, 0.3, 0.2, 0.1, 0.0]))
    t = budget_trend(s, "p")
    assert t.loc["a", "rises"] == [(0.35, 0.5)] and t.loc["b", "rises"] == []
    assert t.loc["a", 0.5] == 0.05


def test_main_setup_and_trend_text_come_from_the_tables():
    from analysis.qevict.longview import budget_trend_text, main_setup_text

    arts = [_art("qevict_long_main_a", "m1", 0, 0.3, [0.1] * 4),
            _art("qevict_long_main_b", "m2", 1, 0.3, [0.1] * 4)]
    for a, n in zip(arts, (8192, 15616)):
        a.tables["summary"]["context_tokens"] = n
    S = main_comparison(arts)["summary"]
    assert main_setup_text(S, {"code": "source code"}) == (
        "4 evaluation documents in 2 genres (source code: 2, tests: 2) on m1 at 8,192 tokens and m2 at "
        "15,616 tokens, 3 policies besides the full cache at 4 budgets each")
    assert budget_trend_text(S, "qevict_recall").count("(falls at every step)") == 2


def _trend_summary(kl_by_budget, model="m", policy="p", seed=0):
    """Per-document KL at each budget from geometric means with multiplicative noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for doc in range(10):
        noise = np.exp(rng.normal(0, 0.3))
        for b, k in kl_by_budget.items():
            rows.append(dict(model=model, document=f"d{doc}", policy=policy, budget=b,
                             kl=k * noise * np.exp(rng.normal(0, 0.05))))
    return pd.DataFrame(rows)


def test_budget_trend_rule_falls_rises_and_holm():
    from analysis.qevict.longview import BUDGET_TREND_RULE, budget_trend_rule, budget_trend_rule_text

    falls = _trend_summary({0.1: 0.1, 0.2: 0.03, 0.35: 0.01, 0.5: 0.003})
    v, tab = budget_trend_rule(falls, "p")
    assert v == {"m": "approaches the full cache"} and (tab.outcome == "falls").all()
    assert tab.geo_kl_from.iloc[1] == pytest.approx(tab.geo_kl_to.iloc[0])
    rises = _trend_summary({0.1: 0.1, 0.2: 0.03, 0.35: 0.01, 0.5: 0.05}, model="r")
    v, tab = budget_trend_rule(pd.concat([falls, rises]), "p")
    assert v["r"] == "rises at some budget step" and tab.outcome.tolist()[-1] == "rises"
    assert "r: rises at some budget step" in budget_trend_rule_text(pd.concat([falls, rises]), "p")
    # one document rising a hundredfold does not decide the rule (the arithmetic mean would rise)
    outlier = falls.copy()
    sel = (outlier.document == "d0") & (outlier.budget == 0.5)
    outlier.loc[sel, "kl"] = 0.5
    assert outlier[outlier.budget == 0.5].kl.mean() > outlier[outlier.budget == 0.35].kl.mean()
    v, tab = budget_trend_rule(outlier, "p")
    assert tab.outcome.iloc[-1] in ("falls", "unclear")
    # Holm: two steps that pass on their own (one-sided p of about 0.03 and 0.04) fail once corrected
    z = np.array([-1.5, -1.0, -0.6, -0.3, 0.0, 0.1, 0.4, 0.7, 1.0, 1.2])
    z = (z - z.mean()) / z.std(ddof=1)
    logk = np.zeros((10, 4))
    logk[:, 1] = -3 + 0.1 * z
    logk[:, 2] = logk[:, 1] + (-2.14 / np.sqrt(10) + z)
    logk[:, 3] = logk[:, 2] + (-1.97 / np.sqrt(10) + z[::-1])
    weak = pd.DataFrame([dict(model="m", document=f"d{i}", policy="p", budget=b, kl=float(np.exp(logk[i, j])))
                         for i in range(10) for j, b in enumerate((0.1, 0.2, 0.35, 0.5))])
    v, tab = budget_trend_rule(weak, "p", dict(BUDGET_TREND_RULE, eps=0.0))
    assert tab.outcome.tolist() == ["falls", "unclear", "unclear"], tab
    assert (tab.p_fall.iloc[1:] < BUDGET_TREND_RULE["alpha"]).all()
    assert v["m"] == "not shown at every budget step"


def test_long_lengths_text_reads_the_sweep():
    from analysis.qevict.longview import long_lengths_text, long_runs

    runs = [dict(name="a", model="m1", prefill_tokens=7168, decode_tokens=1024, documents=["x", "y"]),
            dict(name="b", model="m2", prefill_tokens=31744, decode_tokens=256, documents=["x"]),
            dict(name="c", model="m1", prefill_tokens=7936, decode_tokens=256, documents=["x"])]
    assert long_lengths_text(runs) == ("m1: 7,168 + 1,024 (a, 2 documents), 7,936 + 256 (c, 1 document); "
                                       "m2: 31,744 + 256 (b, 1 document)")
    assert all(r["name"] in long_lengths_text() for r in long_runs())


def test_budget_trend_table_and_scored_steps_text():
    from analysis.qevict.longview import budget_trend_table, scored_steps_text

    s = pd.concat([_trend_summary({0.1: 0.1, 0.2: 0.03, 0.35: 0.01, 0.5: 0.003}, policy="a"),
                   _trend_summary({0.1: 0.1, 0.2: 0.03, 0.35: 0.01, 0.5: 0.05}, policy="b")])
    t, count = budget_trend_table(s, ("a", "b"), {"a": "A"})
    assert count == "1 of 2" and set(t.policy) == {"A", "b"} and len(t) == 6
    assert t[t.policy == "b"]["verdict (declared rule)"].iloc[0] == "rises at some budget step"
    sm = pd.DataFrame(dict(model=["m"] * 3, document=["needle:x", "needle:y", "code:z"],
                           scored_steps=[156, 156, 256],
                           decode_steps=[256, 256, 256]))
    assert scored_steps_text([sm]) == "m: 156 of 256 steps"
    assert scored_steps_text([sm.drop(columns="scored_steps")]) == "not recorded in the committed runs"
