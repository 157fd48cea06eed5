"""Chapter 4's primary drift rule (issue 28, item 5: the paper's own metrics first): Global LIR and the
one-shot Future Missed Mass, each against its shuffled-order null (analysis.qevict.longview), judged
through the ledger's rule (analysis.claims.evaluate, ``ch4_drift``); the far-pair missed share is only
the secondary statistic. Small synthetic tables and the committed long-run CSVs; no model runs."""
import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import claims
from analysis.qevict import chapter as ch
from analysis.qevict import defaultrun as DR
from analysis.qevict import longview as LV
from analysis.qevict.metrics import bootstrap_ci, document_drift, far_pair_matrix, far_pair_mean

ROOT = Path(__file__).resolve().parents[1]
MAIN = [ROOT / "results" / f"qevict_long_main_{m}" / "drift.csv" for m in ("gemma", "smollm2")]


def _table(glir_obs, glir_null, fmm_obs=None, fmm_null=None, models=None):
    """A per-unit drift table; the one-shot FMM lives in the ``miss_*`` columns (the far-pair share)."""
    n = len(glir_obs)
    t = pd.DataFrame(dict(document=[f"code:d{i}" for i in range(n)], global_lir_observed=glir_obs,
                          global_lir_null_mean=glir_null))
    if fmm_obs is not None:
        t["miss_observed"], t["miss_null_mean"] = fmm_obs, fmm_null
        t["miss_rel_excess"] = t.miss_observed / t.miss_null_mean - 1
    if models is not None:
        t.insert(0, "model", models)
    return t


def test_primary_value_is_a_conjunction_of_both_metrics():
    nan = float("nan")
    assert LV.primary_value({"Global LIR": 0.1, "FMM": 0.05}) == 0.05
    assert LV.primary_value({"Global LIR": 0.1, "FMM": -0.2}) == -0.2  # either failing fails the claim
    assert LV.primary_value({"Global LIR": -0.1, "FMM": nan}) == -0.1  # fails whatever FMM would say
    assert math.isnan(LV.primary_value({"Global LIR": 0.1, "FMM": nan}))  # cannot pass on one metric
    assert math.isnan(LV.primary_value({"Global LIR": nan, "FMM": nan}))


def test_a_metric_that_does_not_beat_its_null_cannot_pass():
    # large observed values, but each below its own null: without the null comparison they would pass
    t = _table([0.5, 0.6, 0.55, 0.52], [0.6, 0.7, 0.6, 0.6], [0.4, 0.45, 0.42, 0.41], [0.3, 0.3, 0.3, 0.3])
    dp = LV.drift_primary(t, n_boot=500)
    assert dp["metrics"]["Global LIR"]["hi"] < 0 < dp["metrics"]["FMM"]["lo"]
    assert dp["value"] == dp["metrics"]["Global LIR"]["lo"] < 0
    assert LV.primary_verdict(dp) == "not reproduced"
    # both above their nulls: reproduced, the value the smaller lower end
    t2 = _table([0.7, 0.75, 0.8, 0.72], [0.6, 0.6, 0.6, 0.6], [0.4, 0.45, 0.42, 0.41], [0.3, 0.3, 0.3, 0.3])
    dp2 = LV.drift_primary(t2, n_boot=500)
    assert LV.primary_verdict(dp2) == "reproduced"
    assert dp2["value"] == min(dp2["metrics"]["Global LIR"]["lo"], dp2["metrics"]["FMM"]["lo"])
    rel = LV.rel_excess_over_null(t2, "global_lir")
    assert rel == pytest.approx(t2.global_lir_observed / t2.global_lir_null_mean - 1)
    assert dp2["metrics"]["Global LIR"]["mean"] == pytest.approx(rel.mean())


def test_the_fmm_alone_no_longer_decides_the_verdict():
    # FMM well above its null (the former rule passes), Global LIR below its own: not reproduced
    t = _table([0.5, 0.6, 0.55, 0.52], [0.6, 0.7, 0.6, 0.6], [0.4, 0.45, 0.42, 0.41], [0.3, 0.3, 0.3, 0.3])
    from analysis.qevict.metrics import drift_rule_verdict
    assert drift_rule_verdict(t.miss_rel_excess.values, 500)["verdict"] == "reproduced"
    v = ch.drift_verdict(t, LV.drift_primary(t, n_boot=500), 500, 0)
    assert v.verdict == claims.NOT_REPRODUCED
    assert "not the ledger's verdict" in LV.secondary_drift_label(drift_rule_verdict(t.miss_rel_excess, 500))


def test_a_metric_missing_from_the_table_is_named_and_not_testable_unless_the_other_fails():
    up = _table([0.7, 0.75, 0.8, 0.72], [0.6, 0.6, 0.6, 0.6])
    dp = LV.drift_primary(up, n_boot=500)
    assert dp["missing"] == ["FMM"] and math.isnan(dp["value"])
    assert "FMM against its null not in" in LV.drift_primary_missing(dp)
    v = ch.drift_verdict(up, dp, 500, 0)
    assert v.verdict == claims.NOT_TESTABLE and "FMM" in v.detail
    down = _table([0.5, 0.6, 0.55, 0.52], [0.6, 0.7, 0.6, 0.6])
    v2 = ch.drift_verdict(down, LV.drift_primary(down, n_boot=500), 500, 0)
    assert v2.verdict == claims.NOT_REPRODUCED
    one = LV.drift_primary(down.iloc[:1], n_boot=500)
    assert "(the declared rule needs at least 2)" in LV.drift_primary_missing(one)


def test_model_end_is_recomputed_from_that_models_units():
    models = ["m1"] * 4 + ["m2"] * 4
    t = _table([0.7, 0.75, 0.8, 0.72, 0.5, 0.52, 0.55, 0.5], [0.6] * 8,
               [0.4, 0.45, 0.42, 0.41, 0.4, 0.45, 0.42, 0.41], [0.3] * 8, models)
    rc = LV.drift_primary_recompute(t, n_boot=500, seed=0)
    assert rc("model", "m1") == LV.drift_primary(t[t.model == "m1"], n_boot=500)["value"] > 0
    assert rc("model", "m2") == LV.drift_primary(t[t.model == "m2"], n_boot=500)["value"] < 0
    assert rc("model", "m1") != rc("model", "m2")
    assert math.isnan(rc("model", "absent"))
    lo = LV.drift_primary(t, n_boot=500)["value"]
    assert rc("alpha", 0.01) <= lo <= rc("alpha", 0.10)
    assert rc("minimum effect", 0.05) == pytest.approx(lo - 0.05)
    assert math.isnan(rc("shuffle block (steps)", 16))  # no attention at hand: not assessed
    with pytest.raises(KeyError):
        rc("an undeclared assumption", 1)


def test_declared_sensitivity_of_the_drift_claim_is_recomputed_and_names_the_model():
    c = claims.rule("ch4_drift")
    names = [s["name"] for s in c["sensitivity"]]
    assert set(names) == set(LV.PRIMARY_SENSITIVITY)
    assert c["largest_driver"]["name"] == "model"
    assert "Global LIR" in c["quantity"] and "Future Missed Mass" in c["quantity"]
    assert claims.amendments(c)[-1]["new"]["quantity"] == c["quantity"]


def _attn(D, NW, rng, drift=False):
    a = np.zeros((D, 1, 1, NW))
    half = (NW - 1) // 2
    for s in range(D):
        prof = np.ones(NW - 1)
        prof[slice(0, half) if (not drift or s < D // 2) else slice(half, NW - 1)] = 8.0
        a[s, 0, 0, 1:] = 0.8 * rng.dirichlet(prof * 2)
        a[s, 0, 0, 0] = 0.2
    return a


def test_oneshot_fmm_at_far_pairs_detects_drift_and_over_all_pairs_it_cannot():
    rng = np.random.default_rng(1)
    P, W = 16 * 20, 16
    flat, moving = _attn(64, 20, rng), _attn(64, 20, rng, drift=True)
    r0 = LV.oneshot_fmm_against_null(flat, P, W, 1, budget=0.3, block=4, n_shuffles=8)
    r1 = LV.oneshot_fmm_against_null(moving, P, W, 1, budget=0.3, block=4, n_shuffles=8)
    assert abs(r0["miss_rel_excess"]) < 0.05 < r1["miss_rel_excess"]
    ref = document_drift(moving, P, W, gap=4, tau=1.0, sink_windows=1, budget=0.3, block=4, n_shuffles=8)
    assert r1["miss_observed"] == pytest.approx(ref["miss_observed"])
    assert r1["miss_null_mean"] == pytest.approx(ref["miss_null_mean"])
    # why far pairs: over every later step the null cannot see a drift this plain
    every = LV.oneshot_fmm_against_null(moving, P, W, 1, budget=0.3, block=4, n_shuffles=8, min_lag=1)
    assert abs(every["miss_rel_excess"]) < 0.05
    M = far_pair_matrix(moving, P, W, 0.3, 1)
    S = (M + M.T) / 2
    perm = np.random.default_rng(0).permutation(64)
    assert far_pair_mean(S, perm, 1) == pytest.approx(far_pair_mean(S, np.arange(64), 1))
    with pytest.raises(ValueError):
        LV.oneshot_fmm_against_null(moving[:1], P, W, 1)


def test_attention_ends_recompute_both_metrics_and_glir_matches_document_drift():
    rng = np.random.default_rng(3)
    P, W = 16 * 20, 16
    docs = [_attn(48, 20, rng, drift=True) for _ in range(3)]
    m = LV.primary_metrics_from_attention(docs[0], P, W, 1, gap=4, tau=1.0, n_shuffles=5)
    ref = document_drift(docs[0], P, W, gap=4, tau=1.0, sink_windows=1, n_shuffles=5)
    assert m["global_lir_observed"] == ref["global_lir_observed"]
    assert m["global_lir_null_mean"] == ref["global_lir_null_mean"]
    table = pd.DataFrame([dict(model="smollm2", document=f"code:{i}",
                               **LV.primary_metrics_from_attention(a, P, W, 1, gap=4, tau=1.0, n_shuffles=5))
                          for i, a in enumerate(docs)])
    pairs = [("shuffle block (steps)", 16), ("top share of windows", 0.35)]
    ends = DR.ends_table(docs, table, P, W, 1, 4, 1.0, 0, pairs)
    at = functools.partial(DR.end_rows, ends)
    with pytest.raises(KeyError, match="make default-run"):
        at("shuffle block (steps)", 4)  # not computed: says how to get it
    t16 = at("shuffle block (steps)", 16)
    assert list(t16.document) == list(table.document) and "miss_observed" in t16
    assert (t16.global_lir_null_mean != table.global_lir_null_mean).any()  # the null recomputed at 16
    t35 = at("top share of windows", 0.35)
    assert (t35.miss_observed != table.miss_observed).any()
    assert (t35.global_lir_observed == table.global_lir_observed).all()  # Global LIR has no top share


def test_committed_top_share_ends_feed_the_fmm_and_keep_global_lir():
    t = _table([0.5, 0.6, 0.55, 0.52], [0.6, 0.7, 0.6, 0.6], [0.4, 0.45, 0.42, 0.41], [0.3] * 4, ["m"] * 4)
    ends = pd.DataFrame([dict(model="m", document=d, sensitivity="top share of windows", end="low", value=0.1,
                              rel_excess=-0.5) for d in t.document])
    at = LV.drift_ends_at(t, ends)
    t10 = at("top share of windows", 0.1)
    assert LV.rel_excess_over_null(t10, "miss") == pytest.approx([-0.5] * 4)
    assert (t10.global_lir_observed == t.global_lir_observed).all()
    assert at("top share of windows", 0.35) is None and at("shuffle block (steps)", 4) is None


def test_committed_main_runs_primary_rule_and_per_model_ends():
    if not all(p.exists() for p in MAIN):
        pytest.skip("the committed main runs are not in this checkout")
    d = pd.concat([pd.read_csv(p) for p in MAIN]).sort_values(["model", "document"], kind="stable")
    d = d.reset_index(drop=True)
    dp = LV.drift_primary(d)
    rel = d.global_lir_observed / d.global_lir_null_mean - 1
    m, lo, hi = bootstrap_ci(rel.values)
    assert dp["metrics"]["Global LIR"]["mean"] == pytest.approx(m)
    assert dp["missing"] == []
    fm, flo, fhi = bootstrap_ci((d.miss_observed / d.miss_null_mean - 1).values)
    assert dp["metrics"]["FMM"]["mean"] == pytest.approx(fm)
    assert dp["value"] == pytest.approx(min(lo, flo))
    rc = LV.drift_primary_recompute(d)
    for model in ("smollm2", "gemma3-270m"):
        own = d[d.model == model]
        assert rc("model", model) == LV.drift_primary(own)["value"]
        assert len(own) < len(d)
    v = ch.drift_verdict(d, dp, 2000, 0)
    assert v.verdict == LV.primary_verdict(dp)
    assert "model" in v.robustness and "not assessed" not in v.robustness.split(";")[0]
