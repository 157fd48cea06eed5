"""Declared verdict rules (analysis/claims.py, data/claims.yaml): every comparison kind can fail."""
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis import claims, data

RULES = {
    "two": {"claim": "x is 100", "source": "t", "quantity": "x", "comparison": "two_sided",
            "reference": {"value": 100}, "tolerance": 0.1, "partial_tolerance": 0.3, "why": "t",
            "sensitivity": [{"name": "eff", "low": 0.5, "high": 1.0, "why": "t"}]},
    "zero": {"claim": "x is 0", "source": "t", "quantity": "x", "comparison": "two_sided",
             "reference": {"value": 0}, "tolerance": 0.1, "why": "t"},
    "zero_abs": {"claim": "x is 0", "source": "t", "quantity": "x", "comparison": "two_sided",
                 "reference": {"value": 0}, "tolerance": 0.1, "abs_tolerance": 0.5, "why": "t"},
    "least": {"claim": "up to 75%", "source": "t", "quantity": "x", "comparison": "at_least",
              "reference": {"value": 0.75}, "tolerance": 0.05, "partial_tolerance": 0.5, "why": "t"},
    "most": {"claim": "under half", "source": "t", "quantity": "x", "comparison": "at_most",
             "reference": {"value": 0.5, "partial_value": 0.6}, "tolerance": 0.0, "why": "t"},
    "order": {"claim": "A most consistent", "source": "t", "quantity": "x", "comparison": "ordering",
              "item": "A", "better": "higher", "partial_rank": 2, "why": "t"},
    "both": {"claim": "a and b", "source": "t", "quantity": "x", "comparison": "two_sided", "tolerance": 0.1,
             "why": "t", "components": [{"name": "a", "reference": {"value": 6}},
                                        {"name": "b", "reference": {"value": 19}}]},
    "bytrace": {"claim": "ratio", "source": "t", "quantity": "x", "comparison": "two_sided", "tolerance": 0.1,
                "why": "t", "reference": {"by": "trace", "keys": {
                    "mooncake_conversation": "mooncake_table2_conversation_cache_ratio",
                    "mooncake_synthetic": "mooncake_table2_synthetic_cache_ratio"}}},
    "nt": {"claim": "K3", "source": "t", "quantity": "x", "comparison": "not_testable",
           "missing": "Kimi K3's configuration"},
}


@pytest.fixture()
def table(tmp_path):
    p = tmp_path / "claims.yaml"
    p.write_text(yaml.safe_dump({"claims": RULES}))
    claims._load.cache_clear()
    return p


def ev(cid, x, path, **kw):
    return claims.evaluate(cid, x, path=path, **kw)


def test_two_sided_bands_and_symmetry(table):
    assert ev("two", 105, table).verdict == claims.REPRODUCED
    assert ev("two", 95, table).verdict == claims.REPRODUCED
    assert ev("two", 120, table).verdict == claims.PARTLY
    assert ev("two", 80, table).verdict == claims.PARTLY
    assert ev("two", 131, table).verdict == claims.NOT_REPRODUCED   # the rule can fail
    assert ev("two", 69, table).verdict == claims.NOT_REPRODUCED


@pytest.mark.parametrize("bad", [float("nan"), None, np.nan, "n/a", float("inf")])
def test_missing_values_are_not_testable_never_not_reproduced(table, bad):
    v = ev("two", bad, table)
    assert v.verdict == claims.NOT_TESTABLE
    assert v.label.startswith("not testable")


def test_published_zero_does_not_divide(table):
    assert ev("zero", 0.0, table).verdict == claims.REPRODUCED
    assert ev("zero", 1e-9, table).verdict == claims.NOT_REPRODUCED  # no absolute tolerance declared
    assert ev("zero_abs", 0.4, table).verdict == claims.REPRODUCED
    assert ev("zero_abs", -0.6, table).verdict == claims.NOT_REPRODUCED
    assert math.isnan(ev("zero", 0.0, table).difference)


def test_one_sided(table):
    assert ev("least", 0.749, table).verdict == claims.REPRODUCED
    assert ev("least", 0.9, table).verdict == claims.REPRODUCED      # more than 'up to' is not a failure
    assert ev("least", 0.5, table).verdict == claims.PARTLY
    assert ev("least", 0.3, table).verdict == claims.NOT_REPRODUCED
    assert ev("most", 0.45, table).verdict == claims.REPRODUCED
    assert ev("most", 0.55, table).verdict == claims.PARTLY          # partial threshold
    assert ev("most", 0.65, table).verdict == claims.NOT_REPRODUCED


def test_ordering(table):
    assert ev("order", {"A": 0.9, "B": 0.5, "C": 0.1}, table).verdict == claims.REPRODUCED
    assert ev("order", {"A": 0.5, "B": 0.9, "C": 0.1}, table).verdict == claims.PARTLY
    v = ev("order", {"A": 0.1, "B": 0.9, "C": 0.5}, table)
    assert v.verdict == claims.NOT_REPRODUCED and "ranks 3" in v.detail
    assert ev("order", {"A": float("nan"), "B": 1.0}, table).verdict == claims.NOT_TESTABLE
    assert ev("order", {"A": 0.5, "B": float("nan")}, table).verdict == claims.REPRODUCED


def test_components_take_the_worst(table):
    assert ev("both", {"a": 6.1, "b": 19.5}, table).verdict == claims.REPRODUCED
    assert ev("both", {"a": 6.1, "b": 40}, table).verdict == claims.NOT_REPRODUCED
    assert ev("both", {"a": 6.1, "b": float("nan")}, table).verdict == claims.NOT_TESTABLE


def test_reference_belongs_to_the_setting(table):
    v = ev("bytrace", 0.65, table, setting={"trace": "mooncake_synthetic"})
    assert v.verdict == claims.REPRODUCED and v.reference == pytest.approx(0.66)
    assert ev("bytrace", 0.65, table, setting={"trace": "mooncake_conversation"}).verdict == \
        claims.NOT_REPRODUCED
    v = ev("bytrace", 0.65, table, setting={"trace": "my_trace.jsonl"})
    assert v.verdict == claims.NOT_TESTABLE and "no published figure" in v.detail
    assert "none" in v.rule


def test_not_testable_says_what_is_missing(table):
    v = ev("nt", 22600, table)
    assert v.verdict == claims.NOT_TESTABLE and "configuration" in v.label


def test_robust_and_fragile(table):
    robust = ev("two", 100, table, recompute=lambda name, val: 100 * (0.95 + 0.05 * val))
    assert robust.robustness.startswith("robust") and robust.label == "reproduced (robust to eff)"
    fragile = ev("two", 100, table, recompute=lambda name, val: 100 * val)
    assert fragile.robustness.startswith("fragile") and "eff = 0.5" in fragile.robustness
    assert fragile.flips == [("eff", 0.5, claims.NOT_REPRODUCED)]
    assert ev("two", 100, table).robustness == "robustness not assessed"


def test_rule_text_names_tolerance_and_reference(table):
    t = claims.rule_text(RULES["two"])
    assert "two-sided" in t and "10%" in t and "100" in t and "30%" in t
    assert "at least" in claims.rule_text(RULES["least"])
    assert "ranks first" in claims.rule_text(RULES["order"])


def test_incomplete_declarations_are_refused(tmp_path):
    bad = {"x": {"claim": "c", "source": "s", "quantity": "q", "comparison": "two_sided", "tolerance": 0.1,
                 "reference": {"value": 1}}}  # no 'why'
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"claims": bad}))
    claims._load.cache_clear()
    with pytest.raises(claims.ClaimError, match="why"):
        claims.table(p)
    with pytest.raises(claims.ClaimError, match="not declared"):
        claims.rule("nope")


def test_the_book_table_is_complete():
    claims._load.cache_clear()
    t = claims.table()
    assert len(t) >= 20
    keys = set(data.table("published.csv")["key"])
    for cid, c in t.items():
        for comp in c.get("components") or [c]:
            ref = comp.get("reference") or {}
            assert ref.get("published", next(iter(keys))) in keys, cid
            for k in (ref.get("keys") or {}).values():
                assert k in keys, (cid, k)
        assert claims.rule_text(cid)
    # every Table 2 trace has its published cache ratio
    assert set(t["ch2_table2_cache_ratio"]["reference"]["keys"]) == {
        "mooncake_conversation", "mooncake_toolagent", "mooncake_synthetic"}


def test_an_end_that_cannot_be_recomputed_is_not_a_flip(table):
    v = ev("two", 100, table, recompute=lambda name, val: float("nan") if val == 0.5 else 100.0)
    assert v.flips == [] and v.robustness == "robust to eff; not assessed at eff = 0.5"


def test_robust_names_only_assumptions_that_were_recomputed(tmp_path):
    rule = {"claim": "c", "source": "s", "quantity": "q", "comparison": "two_sided", "why": "w",
            "reference": {"value": 100.0}, "tolerance": 0.1,
            "sensitivity": [{"name": "eff", "low": 0.5, "high": 1.0, "why": "w"},
                            {"name": "slo", "low": "tight", "high": "loose", "why": "w"}]}
    p = tmp_path / "claims.yaml"
    p.write_text(yaml.safe_dump({"claims": {"both": rule}}))
    claims._load.cache_clear()
    v = ev("both", 100, p, recompute=lambda name, val: 100.0 if name == "eff" else None)
    assert v.robustness == "robust to eff; not assessed at slo = tight, slo = loose"


def test_a_range_is_two_components_with_their_own_comparison(tmp_path):
    rule = {"claim": "c", "source": "s", "quantity": "q", "comparison": "at_least", "why": "w",
            "tolerance": 0.25,
            "components": [{"name": "lo", "comparison": "at_least", "reference": {"value": 2.0}},
                           {"name": "hi", "comparison": "at_most", "reference": {"value": 4.6}}]}
    p = tmp_path / "claims.yaml"
    p.write_text(yaml.safe_dump({"claims": {"range": rule}}))
    claims._load.cache_clear()
    at = lambda x: ev("range", {"lo": x, "hi": x}, p).verdict  # noqa: E731
    assert at(1.6) == at(3.0) == at(5.7) == claims.REPRODUCED  # within [2 * 0.75, 4.6 * 1.25]
    assert at(1.4) == at(5.9) == claims.NOT_REPRODUCED
    assert claims.rule_text(claims.table(p)["range"]).startswith("range:")


def test_no_end_recomputable_says_not_assessed(table):
    v = ev("two", 100, table, recompute=lambda name, val: None)
    assert v.robustness.startswith("robustness not assessed") and v.verdict == claims.REPRODUCED


def test_chapter3_rules_at_their_boundaries():
    """Chapter 3's verdicts come from its rules in data/claims.yaml (the former disagg/verdicts.py
    thresholds restated there): each boundary, judged by claims.evaluate alone."""
    claims._load.cache_clear()

    def v(cid, x):
        return claims.evaluate(cid, x).verdict

    pub = data.published("heteropanacea_pd_gain")["value"]  # claim (a): "up to" reached within 10%
    assert v("ch3_pd_gain", pub * 0.91) == claims.REPRODUCED and v("ch3_pd_gain", pub * 0.89) == claims.PARTLY
    assert v("ch3_pd_gain", pub * 1.09) == claims.REPRODUCED and v("ch3_pd_gain", pub * 1.11) == claims.PARTLY
    assert v("ch3_pd_gain", pub * 0.71) == claims.PARTLY
    assert v("ch3_pd_gain", pub * 0.69) == claims.NOT_REPRODUCED
    assert v("ch3_pd_gain", pub * 2.3) == claims.NOT_REPRODUCED  # +173% does not reproduce "up to +75%"
    order = ["PDAF", "PD", "AF", "3-way"]  # claim (b): PDAF first, partly second
    for i, want in enumerate([claims.REPRODUCED, claims.PARTLY, claims.NOT_REPRODUCED]):
        ranking = order[1:i + 1] + ["PDAF"] + order[i + 1:]
        assert v("ch3_pdaf_consistent", {m: -k for k, m in enumerate(ranking)}) == want, ranking
    assert v("ch3_pdaf_consistent", None) == claims.NOT_TESTABLE
    assert v("ch3_attention_heavy", 0.5) == claims.REPRODUCED  # claim (c): 0.5, partly 0.3
    assert v("ch3_attention_heavy", 0.3) == claims.PARTLY
    assert v("ch3_attention_heavy", 0.29) == claims.NOT_REPRODUCED
    assert v("ch3_attention_heavy", float("nan")) == claims.NOT_TESTABLE
    s3 = data.published("stepfun_step3_afd_tps_per_gpu")["value"]  # validation cells: within 25%
    assert v("ch3_val_step3_afd", s3 * 1.24) == claims.REPRODUCED
    assert v("ch3_val_step3_afd", s3 * 1.26) == claims.NOT_REPRODUCED
    assert v("ch3_val_step3_order", {"AFD": 2.0, "D": 1.0}) == claims.REPRODUCED
    assert v("ch3_val_step3_order", {"AFD": 1.0, "D": 2.0}) == claims.NOT_REPRODUCED
    lo, hi = (data.published(f"distserve_chatbot_goodput_gain_{k}")["value"] for k in ("low", "high"))

    def ds(x):
        return v("ch3_val_distserve", {"above the low end": x, "below the high end": x})
    # the published range widened by 25% on each side
    assert ds(lo * 0.76) == ds(hi * 1.24) == ds((lo + hi) / 2) == claims.REPRODUCED
    assert ds(lo * 0.74) == ds(hi * 1.26) == claims.NOT_REPRODUCED


AMENDED_RULES = {
    "bound": {"claim": "at least 6.5x possible", "source": "t", "quantity": "upper bound", "why": "t",
              "comparison": "at_least", "reference": {"value": 6.5}, "tolerance": 0.0,
              "pass_label": "consistent",
              "amendments": [{"date": "2026-12-02", "commit": "abc1234", "old": {"pass_label": None},
                              "new": {"pass_label": "consistent"}, "reason": "a bound"}]},
    "upto": {"claim": "up to 75", "source": "t", "quantity": "x", "why": "t", "comparison": "two_sided",
             "reference": {"value": 75.0}, "tolerance": 0.1, "partial_tolerance": 0.3,
             "amendments": [{"date": "2026-12-01", "commit": "abc1234",
                             "old": {"comparison": "two_sided", "partial_tolerance": 0.3},
                             "new": {"comparison": "at_least", "partial_tolerance": 0.5},
                             "reason": "loosened"},
                            {"date": "2026-12-02", "commit": "def5678",
                             "old": {"comparison": "at_least", "partial_tolerance": 0.5},
                             "new": {"comparison": "two_sided", "partial_tolerance": 0.3},
                             "reason": "up to"}]},
    "widened": {"claim": "2-4.6", "source": "t", "quantity": "x", "why": "t", "comparison": "at_least",
                "tolerance": 0.25,
                "components": [{"name": "lo", "comparison": "at_least", "reference": {"value": 2.0}},
                               {"name": "hi", "comparison": "at_most", "reference": {"value": 4.6}}],
                "amendments": [{"date": "2026-12-01", "commit": "abc1234", "old": {"tolerance": 0.0},
                                "new": {"tolerance": 0.25}, "reason": "widened with the value in view"}]},
    "requantified": {"claim": "c", "source": "t", "quantity": "new q", "why": "t", "comparison": "two_sided",
                     "reference": {"value": 100.0}, "tolerance": 0.1,
                     "sensitivity": [{"name": "eff", "low": "stated", "high": "calibrated", "why": "t"}],
                     "amendments": [{"date": "2026-12-01", "commit": "abc1234", "old": {"quantity": "old q"},
                                     "new": {"quantity": "new q"}, "reason": "r",
                                     "original_value": {"sensitivity": "eff", "value": "stated"}}]},
}


@pytest.fixture()
def amended(tmp_path):
    p = tmp_path / "amended.yaml"
    p.write_text(yaml.safe_dump({"claims": AMENDED_RULES}))
    claims._load.cache_clear()
    return p


def test_a_bound_says_consistent_never_reproduced(amended):
    v = ev("bound", 10.0, amended)
    assert v.verdict == claims.CONSISTENT and claims.REPRODUCED not in v.label.split(";")[0]
    assert ev("bound", 5.0, amended).verdict == claims.NOT_REPRODUCED  # a bound can still refute
    assert "necessary condition" in v.rule
    assert v.original_verdict == claims.REPRODUCED  # what the rule said before it was amended


def test_up_to_is_reached_within_the_tolerance_not_exceeded(amended):
    assert ev("upto", 75 * 1.09, amended).verdict == claims.REPRODUCED
    assert ev("upto", 75 * 2.3, amended).verdict == claims.NOT_REPRODUCED


def test_original_rule_undoes_every_amendment(amended):
    o = claims.original_rule(claims.table(amended)["upto"])
    assert o["comparison"] == "two_sided" and o["partial_tolerance"] == 0.3
    w = claims.original_rule(claims.table(amended)["widened"])
    assert w["tolerance"] == 0.0


def test_an_amended_rule_shows_the_verdict_under_the_original_rule(amended):
    x = {"lo": 1.61, "hi": 1.61}
    v = ev("widened", x, amended)
    assert v.verdict == claims.REPRODUCED and v.original_verdict == claims.NOT_REPRODUCED
    assert claims.AMENDED in v.label and "under the original rule, not reproduced" in v.label
    assert "original rule: range" in v.rule and "2026-12-01" in v.rule


def test_a_changed_quantity_is_recomputed_where_the_amendment_says_how(amended):
    v = ev("requantified", 100.0, amended, recompute=lambda n, val: 200.0 if val == "stated" else 100.0)
    assert v.verdict == claims.REPRODUCED and v.original_verdict == claims.NOT_REPRODUCED
    assert ev("requantified", 100.0, amended).original_verdict.startswith("not assessed")


def test_unamended_rules_carry_no_amendment_label(table):
    v = ev("two", 100, table)
    assert not v.amended and claims.AMENDED not in v.label and claims.AMENDED not in v.rule


def test_counts_by_label_include_consistent_and_amended(amended, table):
    vs = [ev("bound", 10.0, amended), ev("widened", {"lo": 3.0, "hi": 3.0}, amended)]
    vs.append(ev("two", 100, table))
    c = claims.counts(vs)
    assert c[claims.CONSISTENT] == 1 and c[claims.REPRODUCED] == 2 and c[claims.AMENDED] == 2
    assert claims.counts_text(vs) == "2 reproduced, 1 consistent (2 of them amended after the result)"
    assert claims.counts_text(vs[2:]) == "1 reproduced"


def test_declared_counts(amended):
    c = claims.declared_counts(amended)
    assert c == {"claims": 4, claims.AMENDED: 4, claims.CONSISTENT: 1, claims.NOT_TESTABLE: 0}
    assert claims.declared_counts_text(amended).startswith("4 claims: 4 with a rule amended")


def test_the_book_labels_bounds_consistent_and_up_to_two_sided():
    claims._load.cache_clear()
    t = claims.table()
    assert t["moba_prefill_speedup"]["pass_label"] == t["ch2_ai_ssd_link"]["pass_label"] == claims.CONSISTENT
    for cid in ("ch1_kimi_linear_kv", "ch3_pd_gain"):  # "up to X": reaching X, not exceeding it
        assert t[cid]["comparison"] == "two_sided", cid
    ds = claims.evaluate("ch3_val_distserve", {"above the low end": 1.61, "below the high end": 1.61})
    assert ds.original_verdict == claims.NOT_REPRODUCED  # the un-widened range, shown beside the verdict


def test_ledger_and_front_page_show_counts_by_label():
    """The ledger and the front page glue every chapter's verdict counts and the declared-rule counts,
    and the front page glues the key the ledger reads from it."""
    book = Path(__file__).resolve().parents[1] / "book"
    ledger, intro = (book / "claims.md").read_text(), (book / "intro.md").read_text()
    for page in ("01_kv_footprint", "02_ssd_offload", "03_disagg", "04_qevict", "05_where_kv_lives"):
        key = f"{page}.md::ch{page[1]}_verdict_counts"
        assert key in ledger and key in intro, key
    for key in re.findall(r"intro\.md::(\w+)", ledger):
        assert f'glue("{key}", claims.declared_counts_text())' in intro, key
    assert "intro_claims_declared" in ledger
