"""Issue 29 item 5: where an eviction-based policy (QEvict included) loses most to the best
quantization-only policy at the same budget, per document (analysis.qevict.failures)."""
import numpy as np
import pandas as pd
import pytest

from analysis.qevict import failures as qf
from analysis.qevict.labels import EVICTS_TO_FIT, display_label

# KL per (policy, budget) on document "a" of model m1; document "b" doubles it; model m2 halves it
KL = {"h2o": {0.1: 0.9, 0.2: 0.5, 0.5: 0.30}, "kivi2": {0.1: 0.8, 0.2: 0.2, 0.5: 0.10},
      "kivi4": {0.1: 0.7, 0.2: 0.6, 0.5: 0.01}, "qevict_recall": {0.1: 0.3, 0.2: 0.1, 0.5: 0.02},
      "full": {1.0: 0.0}}
UNFIT = {("kivi2", 0.1), ("kivi4", 0.1), ("kivi4", 0.2)}


def _summary():
    rows = []
    for m, fm in (("m1", 1.0), ("m2", 0.5)):
        for doc, fd in (("code:a", 1.0), ("ref:b", 2.0)):
            for pol, by in KL.items():
                for b, kl in by.items():
                    rows.append(dict(model=m, document=f"{doc} [{m}]", policy=pol, budget=b, kl=kl * fm * fd,
                                     top1=1 - kl, fits=(pol, b) not in UNFIT))
    return pd.DataFrame(rows)


def test_quantize_only_is_the_kivi_family_by_class():
    assert qf.quantize_only("kivi2") and qf.quantize_only("kivi4")
    assert not any(qf.quantize_only(p) for p in ("mikv", "qevict_recall", "h2o", "quest", "full"))
    with pytest.raises(ValueError, match="unknown policy"):
        qf.quantize_only("nope")


def test_reference_is_the_best_fitting_quantizer_per_model_and_budget():
    r = qf.quantization_references(_summary()).set_index(["model", "budget"])
    assert pd.isna(r.loc[("m1", 0.1), "reference"]) and r.loc[("m1", 0.1), "unfit"] == ("kivi2", "kivi4")
    assert r.loc[("m1", 0.2), "reference"] == "kivi2"  # kivi4 evicted to fit at 20%: not quantization-only
    assert r.loc[("m1", 0.5), "reference"] == "kivi4"  # the lower geometric-mean KL of the two
    geo = np.exp(np.mean(np.log(np.array([0.01, 0.02]) + qf.EPS)))
    assert r.loc[("m1", 0.5), "reference_geo_kl"] == pytest.approx(geo)
    assert "none at 10%" in qf.references_text(qf.quantization_references(_summary()))


def test_losses_are_per_document_against_the_reference_on_the_same_document():
    L = qf.losses_to_quantization(_summary())
    assert 0.1 not in set(L.budget)  # no quantization-only reference at 10%
    assert not ((L.policy == "kivi2") & (L.budget == 0.2)).any()  # the reference itself is not a loss
    row = L[(L.model == "m1") & (L.document == "ref:b") & (L.policy == "h2o") & (L.budget == 0.5)].iloc[0]
    assert row.reference == "kivi4" and row.kl_reference == pytest.approx(0.02)
    assert row.excess == pytest.approx(0.6 - 0.02)
    assert row.ratio == pytest.approx((0.6 + qf.EPS) / (0.02 + qf.EPS))
    assert list(L["rank"]) == list(range(1, len(L) + 1)) and L.excess.is_monotonic_decreasing
    # a KIVI that evicted to fit is eviction-based there, and named so at that budget
    k4 = L[(L.policy == "kivi4") & (L.budget == 0.2)]
    assert len(k4) == 4 and (k4.reference == "kivi2").all()
    assert k4.label.iloc[0] == display_label("kivi4", (0.2,)) and EVICTS_TO_FIT in k4.label.iloc[0]
    assert (L.reference_label == L.reference.map(display_label)).all()


def test_worst_losses_one_per_cell_and_each_qevict_variant_below():
    L = qf.losses_to_quantization(_summary())
    w = qf.worst_losses(L, n=2, focus=("qevict_recall",))
    top = w.head(2)
    assert (top.excess > 0).all() and not top.duplicated(["model", "document", "budget"]).any()
    assert top.iloc[0].policy == "kivi4" and top.iloc[0].document == "ref:b"  # 1.2 - 0.4 at 20% on m1
    assert w.iloc[-1].policy == "qevict_recall" and w.iloc[-1]["rank"] > top["rank"].max()
    assert len(qf.worst_losses(L, n=2, focus=())) == 2
    with pytest.raises(ValueError):
        qf.worst_losses(L, n=0)
    t = qf.failures_table(w)
    assert list(t.columns) == list(qf.FAILURE_COLUMNS.values())


def test_failures_glue_names_the_worst_case_and_counts():
    g = {n: v for n, v, _ in qf.failures_glue(_summary())}
    assert set(g) == set(qf.GLUE_KEYS)
    assert g["ch4_main_worst_loss"].startswith(display_label("kivi4", (0.2,)) + " on ref:b (m1) at 20%")
    assert "rank" in g["ch4_main_worst_loss_qevict_recall"]
    assert g["ch4_main_worst_loss_qevict_dequant"] == (
        f"none ({display_label('qevict_dequant')} never has a higher KL than the reference)")
    # h2o loses in its 8 cases, kivi4 (evicting) at 20% in 4, QEvict-recall at 50% only (4 of its 8)
    assert g["ch4_main_losses_count"].startswith("16 of 20 ") and g["ch4_main_losses_count"].endswith(
        f"{display_label('qevict_recall')} in 4 of 8")
    assert " on ref:b (m1) at 50%: KL 0.0400 " in g["ch4_main_worst_loss_qevict_recall"]


def test_failures_view_without_a_fresh_main_comparison_says_why():
    v = qf.failures_view(None)
    assert v["table"] is None and [k for k, _, _ in v["glue"]] == list(qf.GLUE_KEYS)
    assert all("no main run committed" in x for _, x, _ in v["glue"])
    stale = qf.failures_view(dict(summary=_summary(), stale=["run_x"]))
    assert all("stale main run(s): run_x" in x for _, x, _ in stale["glue"])
    ok = qf.failures_view(dict(summary=_summary(), stale=[]), n=3)
    assert len(ok["table"]) <= 3 + len(qf.FOCUS) and len(ok["losses"]) == 20


def test_bad_input_says_what_to_pass():
    with pytest.raises(ValueError, match="fits"):
        qf.losses_to_quantization(_summary().drop(columns="fits"))
    s = _summary()
    s = s[~((s.policy == "kivi4") & (s.document == "ref:b [m1]") & (s.budget == 0.5))]
    with pytest.raises(ValueError, match="every document"):
        qf.losses_to_quantization(s)


def test_committed_main_comparison_both_models():
    from analysis.qevict.longview import long_results, main_comparison

    main = main_comparison(long_results()[0])
    if main is None:
        pytest.skip("no main run committed")
    v = qf.failures_view(main)
    if v["table"] is None:
        pytest.skip("the main comparison is stale")
    assert set(v["losses"].model) == set(main["models"]) and len(main["models"]) == 2
    assert v["losses"].excess.iloc[0] > 0 and set(v["losses"].budget) <= {0.2, 0.35, 0.5}
