"""Chapter 4's derived numbers (analysis.qevict.chapter) and figures (analysis.qevict.figures) on
small synthetic tables: each test fails when the term it names is removed."""

import math
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from analysis.qevict import chapter as ch  # noqa: E402
from analysis.qevict import figures as qfig  # noqa: E402
from analysis.qevict.metrics import QEVICT_RULE  # noqa: E402
from analysis.qevict.policies import POLICY_LABELS  # noqa: E402
from analysis.qevict.quant import full_window_bytes, quant_window_bytes  # noqa: E402


def rows_dict(rows):
    return {n: v for n, v, _ in rows}


def test_tier_table_counts_each_precision_once_against_the_full_window():
    t = ch.tier_table(32, 64, 3, 32)
    assert list(t.tier) == ["full precision (fp16)", "2-bit KIVI", "3-bit KIVI", "4-bit KIVI"]
    assert t.fraction_of_full.iloc[2] == quant_window_bytes(32, 64, 3, 32) / full_window_bytes(32, 64)
    assert len(ch.tier_table(32, 64, 2, 32)) == 3  # 2 bits is not listed twice


def _lir():
    return pd.DataFrame(
        {
            "document": ["a", "a", "b", "b"],
            "layer": [0, 1, 0, 1],
            "reactivated": [1, 2, 0, 0],
            "inactive_windows": [2, 2, 0, 0],
            "lir": [0.5, 1.0, np.nan, np.nan],
            "reactivated_mass": [0.1, 0.3, 0.0, 0.0],
        }
    )


def test_per_document_lir_pools_layers_and_guards_an_empty_denominator():
    s = ch.per_document_lir(_lir())
    assert s["a"] == pytest.approx(3 / 4)  # pooled, not the mean of 0.5 and 1.0
    assert s["b"] == 0.0


def test_lir_glue_picks_the_most_drift_prone_layer_and_the_example():
    g = rows_dict(ch.lir_glue(_lir(), ch.per_document_lir(_lir()), 50, 0))
    assert g["ch4_lir_max_layer"] == 1 and g["ch4_lir_max"] == 1.0
    assert g["ch4_lir"] == pytest.approx(np.mean([0.75, 0.0]))
    ex = rows_dict(ch.lir_example_glue(_lir(), "a", -1))
    assert ex["ch4_lir_ex"] == "1 / 2 = 50%" and ex["ch4_lir_ex_where"] == "a, layer 0"
    assert rows_dict(ch.lir_example_glue(_lir(), "b", 0))["ch4_lir_ex"].startswith("undefined")


def test_budget_lir_example():
    bl = pd.DataFrame({"left": [3, 1], "reentered": [1, 1]})
    assert ch.budget_lir_example(bl, 8).endswith("LIR_B = 50%") and "2 of the 4" in ch.budget_lir_example(
        bl, 8
    )
    assert ch.budget_lir_example(bl * 0, 8) == "no window left the top set"


def _summary():
    rows = []
    for doc in ("code:x", "needle:y"):
        for pol, kl in (
            ("full", 0.0),
            ("h2o", 0.3),
            ("snapkv", 0.2),
            ("kivi2", 0.1),
            ("qevict_recall", 0.05),
        ):
            for b in (0.2, 0.5):
                ev = {"h2o": 0.4, "snapkv": 0.1}.get(pol, 0.0) * (1 - b)
                q = 0.05 if pol in ("kivi2", "qevict_recall") else 0.0
                rows.append(
                    dict(
                        document=doc,
                        genre=doc.split(":")[0],
                        policy=pol,
                        label=POLICY_LABELS[pol],
                        budget=b,
                        kl=kl * (1 - b),
                        dppl=kl,
                        top1=1 - kl,
                        fmm=ev + q,
                        fmm_quantized=q,
                        fmm_evicted=ev,
                        device_frac=b,
                        offdevice_frac=0.5 if pol == "qevict_recall" else 0,
                        recall_bytes_per_step=10.0 if pol == "qevict_recall" else 0.0,
                        recall_transfers_per_step=1.0,
                        needle_acc=1.0 if doc.startswith("needle") else np.nan,
                        fits=True,
                        promotions=4.0,
                        recall_bytes=480.0,
                        decode_steps=48,
                        ppl=5.0,
                    )
                )
    return pd.DataFrame(rows)


def test_fmm_glue_ranges_over_the_evicting_policies_only():
    sp = _summary()[lambda d: d.policy != "full"]
    g = rows_dict(ch.fmm_glue(sp, ["h2o", "snapkv", "kivi2", "qevict_recall"]))
    assert g["ch4_fmm_evict_min"] == pytest.approx(0.1 * 0.5) and g["ch4_fmm_evict_max"] == pytest.approx(
        0.4 * 0.8
    )
    assert g["ch4_fmm_evict_min_at"] == f"{POLICY_LABELS['snapkv']} at 50%"
    assert g["ch4_fmm_qevict_split"].startswith("20%: 0.050 quantized, 0.000 evicted")
    ex = rows_dict(ch.fmm_example_glue(sp, ["qevict_recall"], [0.5, 0.2]))
    assert ex["ch4_fmm_ex_where"].endswith("budget of 50%")  # the second-smallest budget
    bad = sp.assign(fmm=sp.fmm + 1)
    with pytest.raises(AssertionError):
        ch.fmm_example_glue(bad, ["qevict_recall"], [0.2, 0.5])


def test_best_glue_names_the_lowest_mean_kl_per_budget():
    tbl = ch.outcomes_table(_summary()[lambda d: d.policy != "full"])
    g = rows_dict(ch.best_glue(tbl, [0.2, 0.5]))
    assert g["ch4_best_20"] == POLICY_LABELS["qevict_recall"] and g["ch4_budgets"] == "20%, 50%"


def test_full_cache_glue_per_genre():
    g = rows_dict(ch.full_cache_glue(_summary()))
    assert g["ch4_ppl_full_code"] == 5.0 and g["ch4_needle_full"] == 1.0


def test_pareto_glue_median_traffic_ratio():
    ptab = pd.DataFrame(
        {
            "policy": ["quest", "qevict_recall"] * 2,
            "label": ["Q", "R"] * 2,
            "budget": [0.2, 0.2, 0.5, 0.5],
            "recall_bytes_per_step": [100.0, 1.0, 300.0, 2.0],
            "pareto": [True, False, False, True],
        }
    )
    g = rows_dict(ch.pareto_glue(ptab, ["quest", "qevict_recall"]))
    assert g["ch4_quest_traffic_ratio"] == "125×"  # median of 100 and 150
    assert g["ch4_pareto_members"] == "Q at 20%; R at 50%"
    assert rows_dict(ch.pareto_glue(ptab, ["qevict_recall"]))["ch4_quest_traffic_ratio"] == "not run"


def _rules(outcomes):
    return pd.DataFrame(
        {"baseline": ["h2o"] * len(outcomes), "budget": np.arange(len(outcomes)) / 10, "outcome": outcomes}
    )


def test_verdict_glue_counts_and_the_budget_share_rule():
    n = 4
    need = math.ceil(QEVICT_RULE["min_budget_share"] * n - 1e-9)
    ok = ["better"] * need + ["worse"] * (n - need)
    g = rows_dict(ch.verdict_glue(_rules(ok), n))
    assert g["ch4_n_better"] == need and g["ch4_n_worse"] == n - need and g["ch4_n_pairs"] == n
    assert g["ch4_baselines_passed"] == POLICY_LABELS["h2o"] and g["ch4_baselines_failed"] == "none"
    short = ["not worse"] * (need - 1) + ["unclear"] * (n - need + 1)
    g = rows_dict(ch.verdict_glue(_rules(short), n))
    assert g["ch4_baselines_passed"] == "none" and g["ch4_n_unclear"] == n - need + 1


def test_claim_text_and_default_rule_when_qevict_is_absent():
    share, v, table, why = ch.qevict_default(_summary(), ["full", "h2o"])
    assert math.isnan(share) and v == "not testable from public data" and len(table) == 0
    assert ch.qevict_claim_text(table, v, why, 2, 256, 48) == f"not testable: {why}"
    t = ch.qevict_claim_text(_rules(["better", "worse"]), "reproduced", "", 2, 1024, 64)
    assert "1 better, 0 not worse, 1 worse, 0 unclear" in t and "1,024 + 64 tokens" in t


def test_main_view_without_a_main_run_falls_back_to_the_default_run():
    mv = ch.main_view(None, 100, 0, {})
    g = rows_dict(mv["glue"])
    assert set(g) == set(ch.MAIN_GLUE) and g["ch4_main_units"] == "none"
    assert g["ch4_ledger_scope"] == "the default run above (no main run committed)"
    assert ch.main_missing_reason({"stale": ["x"], "summary": [1], "drift": [1]}) == "stale main run(s): x"
    vd, vq = SimpleNamespace(verdict="reproduced"), SimpleNamespace(verdict="not reproduced")
    v_d, v_q, rows = ch.ledger_glue(mv, vd, vq, "drift text", "qevict text")
    assert (v_d, v_q) == (vd, vq)
    assert rows_dict(rows)["ch4_claim_drift_computed"] == "drift text (default run)"
    assert rows_dict(rows)["ch4_claim_qevict_computed"] == "qevict text (default run)"


def test_genre_wins_promotions_cold_bytes_and_lookup():
    r = pd.DataFrame({"A": [0.5, 2.0], "B": [0.9, 0.8]}, index=["code", "prose"])
    assert (
        ch.genre_wins_text(r) == "code: lower KL than 2 of 2 baselines; prose: lower KL than 1 of 2 baselines"
    )
    g = rows_dict(ch.promotion_glue(_summary()))
    assert g["ch4_recall_bytes_per_step"] == 10.0 and g["ch4_promotions_per_doc"] == 4.0
    assert list(ch.promotion_table(_summary()).columns) == ch.PROMOTION_COLUMNS
    assert ch.value_of([("a", 1, None), ("b", 2, None)], "b") == 2
    assert ch.long_rule_summary(pd.DataFrame()) == "no long run committed yet"


def test_heatmap_frame_blanks_windows_before_they_exist():
    a = np.ones((3, 2, 1, 4))  # steps, layers, KV heads, windows
    h = qfig.heatmap_frame(a, prefill_tokens=32, window_tokens=16, layer=1)
    assert list(h.index) == ["0", "16", "32", "48"]
    assert h.loc["48"].isna().all() and h.loc["32", 0] == 1.0  # 48 > 32 + 2 steps: not yet written


def test_figures_named_after_their_labels_return_figures():
    import matplotlib.pyplot as plt

    s = _summary()
    sp = s[s.policy != "full"]
    keys, order, pal, mk = qfig.policy_styles(list(dict.fromkeys(s.policy)), ["r", "g", "b"], ["o", "s"])
    assert (
        keys[0] == "h2o" and pal[order[3]] == "r" and len(mk) == len(order)
    )  # colours cycle, markers do not
    figs = [
        qfig.fig_qevict_fmm(sp, order, pal, mk, 0),
        qfig.fig_qevict_outcomes(s, order, pal, mk, 0),
        qfig.fig_qevict_heatmap(np.ones((3, 2, 1, 4)), 32, 16, 0, "doc"),
        qfig.fig_qevict_lir(_lir(), 8, 0, "r"),
        qfig.fig_qevict_lir_gain(pd.DataFrame({"lir": [0.1], "kl_gain": [0.2]}, index=["d"]), "r"),
        qfig.fig_qevict_genres(pd.DataFrame({"A": [0.5]}, index=["code"])),
    ]
    assert all(isinstance(f, matplotlib.figure.Figure) for f in figs)
    plt.close("all")


def test_qevict_verdict_is_the_declared_rule_and_must_agree_with_it():
    pols = ["full", "h2o", "snapkv", "kivi2", "qevict_recall"]
    base = ch.baselines(pols)
    n = max(QEVICT_RULE["min_docs"], 2)
    s = pd.concat([_summary().assign(document=lambda d, i=i: d.document + str(i)) for i in range(n)],
                  ignore_index=True)
    share, v, table, why = ch.qevict_default(s, pols)
    assert np.isfinite(share)  # enough documents: the rule is testable
    vq = ch.qevict_verdict(s, base, share, v, why)
    assert vq.claim_id == "ch4_qevict_three_tiers" and vq.computed == share and vq.verdict == v
    assert vq.robustness  # recomputed at the declared sensitivity ends
    with pytest.raises(AssertionError):
        ch.qevict_verdict(s, base, share, "a verdict the rule never gives", why)


def test_drift_verdict_names_the_missing_documents_and_must_agree_with_the_rule():
    from analysis.qevict.longview import drift_primary

    drift = pd.DataFrame({"document": ["code:a"], "global_lir_observed": [0.2], "global_lir_null_mean": [0.1],
                          "miss_observed": [0.3], "miss_null_mean": [0.2]})
    dp = drift_primary(drift, n_boot=100)
    v = ch.drift_verdict(drift, dp, 100, 0)
    assert v.claim_id == "ch4_drift" and v.verdict.startswith("not testable")
    assert "1 (document, model) units with results" in v.detail
    assert ch.drift_verdict(drift, {**dp, "value": -0.5}, 100, 0).verdict == "not reproduced"


def test_drift_glue_states_the_primary_rule_and_labels_the_secondary():
    from analysis.qevict.longview import DRIFT_PRIMARY_RULE, drift_primary
    from analysis.qevict.metrics import DRIFT_RULE, drift_rule_verdict

    drift = pd.DataFrame({"document": ["code:a", "code:b"], "global_lir_observed": [0.2, 0.3],
                          "global_lir_null_mean": [0.25, 0.3], "miss_observed": [0.3, 0.4],
                          "miss_null_mean": [0.2, 0.3], "miss_rel_excess": [0.5, 1 / 3],
                          "budget_lir_observed": [0.1, 0.1], "budget_lir_null_mean": [0.1, 0.1]})
    dv, dp = drift_rule_verdict(drift.miss_rel_excess, 100), drift_primary(drift, n_boot=100)
    g = rows_dict(ch.drift_glue(drift, dv, dp))
    assert g["ch4_drift_rule"] == DRIFT_PRIMARY_RULE["text"]
    assert g["ch4_drift_secondary_rule"] == DRIFT_RULE["text"]
    assert g["ch4_drift_primary"].startswith("Global LIR: -10.0%") and "FMM: +41.7%" in g["ch4_drift_primary"]
    sec = g["ch4_drift_secondary"]
    assert sec.startswith("secondary") and "not the ledger's verdict" in sec
    text = ch.drift_claim_text(drift, dv, dp, 0.16)
    assert text.startswith("primary") and text.index("Global LIR") < text.index("secondary")


def test_genre_rule_table_and_when_it_runs():
    base = ["h2o", "snapkv", "kivi2"]
    assert ch.runs_genres(["full", "qevict_recall", "h2o"], ["h2o"])
    assert not ch.runs_genres(["full", "h2o"], ["h2o"]) and not ch.runs_genres(["qevict_recall"], [])
    t = ch.genre_rule_table(_summary(), base, {"code": "code", "needle": "needle"})
    assert "share" not in t and "verdict (declared rule)" in t and "better (pairs)" in t
    assert len(t) == 2 and all(isinstance(x, str) for x in t["verdict (declared rule)"])


def test_compressed_drops_only_the_full_cache():
    sp = ch.compressed(_summary())
    assert "full" not in set(sp.policy) and len(sp) == len(_summary()) - (_summary().policy == "full").sum()


def test_main_view_cached_reuses_the_result_and_is_keyed_on_the_runs(tmp_path, monkeypatch):
    """The chapter and its evidence page share main_view through analysis.cache: the second call with the
    same committed runs reads the cache; a run whose table, code or staleness differs recomputes."""
    monkeypatch.setenv("KVBOOK_CACHE", str(tmp_path))
    monkeypatch.delenv("KVBOOK_NO_CACHE", raising=False)
    calls = []
    monkeypatch.setattr(ch, "main_comparison", lambda arts: None)
    monkeypatch.setattr(ch, "main_view",
                        lambda main, n_boot, seed, labels: calls.append(n_boot) or {"n": n_boot})

    def run(sha="a", stale=()):
        return SimpleNamespace(name="qevict_long_main_x", stale_reasons=list(stale),
                               provenance={"tables": {"summary": sha}, "code_hash": "c"})

    assert ch.main_view_cached([run()], 10, 0, {}) == {"n": 10} and len(calls) == 1
    assert ch.main_view_cached([run()], 10, 0, {}) == {"n": 10} and len(calls) == 1  # from the cache
    ch.main_view_cached([run(sha="b")], 10, 0, {})
    ch.main_view_cached([run(stale=["code changed"])], 10, 0, {})
    ch.main_view_cached([run()], 20, 0, {})
    assert len(calls) == 4


def test_short_unit_names_keep_the_first_document_and_the_model_family():
    units = ["code:typing+inspect+argparse [gemma3-270m]", "docs:a [smollm2]", "ref:x"]
    assert ch.short_unit_names(units) == ["code:typing+ [gemma3]", "docs:a [smollm2]", "ref:x"]


def test_lir_gain_figure_names_only_the_largest_gains_when_asked():
    t = pd.DataFrame({"lir": [0.1, 0.2, 0.3, 0.4], "kl_gain": [0.5, -0.01, 0.02, -0.9]}, index=list("abcd"))
    names = lambda fig: sorted(x.get_text() for x in fig.axes[0].texts)  # noqa: E731
    assert names(qfig.fig_qevict_lir_gain(t, "C0")) == ["a", "b", "c", "d"]
    assert names(qfig.fig_qevict_lir_gain(t, "C0", label_top=2)) == ["a", "d"]
