"""Chapter 3's verdict rules (analysis.disagg.verdicts): each boundary, and the summaries they read."""
import numpy as np
import pandas as pd
import pytest

from analysis.disagg import verdicts as V
from analysis.report import VERDICTS


def test_claim_a_tolerances():
    assert V.verdict_a(0.75, 0.75) == VERDICTS[0]
    assert V.verdict_a(0.60, 0.75) == VERDICTS[1]   # 20% below
    assert V.verdict_a(0.30, 0.75) == VERDICTS[2]


def test_claim_b_rank_rule():
    assert V.verdict_b(["PDAF", "PD", "AF", "3-way"]) == VERDICTS[0]
    assert V.verdict_b(["PD", "PDAF", "AF", "3-way"]) == VERDICTS[1]
    assert V.verdict_b(["PD", "AF", "PDAF", "3-way"]) == VERDICTS[2]
    assert V.verdict_b([]) == VERDICTS[3]


def test_claim_c_thresholds():
    assert V.verdict_c(0.6, 0.5) == VERDICTS[0]
    assert V.verdict_c(0.6, 0.49) == VERDICTS[1]
    assert V.verdict_c(0.29, float("nan")) == VERDICTS[2]
    assert V.verdict_c(float("nan"), 0.3) == VERDICTS[1]


def test_validation_and_ordering():
    assert V.verdict_validation(5000, 4039) == VERDICTS[0]   # +23.8%
    assert V.verdict_validation(5100, 4039) == VERDICTS[2]   # +26.3%
    assert V.verdict_validation(float("nan"), 4039) == VERDICTS[3]
    assert V.verdict_ordering(2.0, 1.0) == VERDICTS[0] and V.verdict_ordering(1.0, 2.0) == VERDICTS[2]


def test_verdicts_gathers_all_three():
    v = V.verdicts(pd_gain=0.5, published_pd_gain=0.75, ranking=["PD", "PDAF"], rho_sweep=0.75, rho_abl=-0.2)
    assert v == {"a": VERDICTS[2], "b": VERDICTS[1], "c": VERDICTS[1]}


def test_consistency_and_ranking():
    ns = pd.DataFrame({"mode": ["C", "PD", "PD", "PDAF", "PDAF", "AF", "AF", "3-way"],
                       "speedup": [1.0, 1.2, 0.9, 1.1, 1.3, 0.5, np.nan, 2.0]})
    c = V.consistency(ns)
    assert c.loc["PD", "win_share"] == 0.5 and c.loc["PDAF", "win_share"] == 1.0
    assert c.loc["AF", "cells"] == 1
    assert V.rank_modes(c)[:2] == ["3-way", "PDAF"]  # both win everywhere; 3-way's worst cell is higher


def test_best_disagg_and_axis_rho():
    df = pd.DataFrame({"k": [1, 1, 1, 2, 2, 3, 3], "mode": ["C", "PD", "AF", "C", "PD", "C", "PD"],
                       "speedup": [1, 1.5, 2.5, 1, 0.8, 1, np.nan]})
    b = V.best_disagg(df, ["k"])
    assert b.to_dict() == {1: 2.5, 2: 0.8}
    ab = pd.DataFrame({"axis": ["x"] * 4, "value": [1, 2, 4, 8], "best_disagg": [1.0, 1.1, 1.3, 1.2]})
    assert V.axis_rho(ab, "x") == pytest.approx(0.8)
    assert np.isnan(V.spearman([1, 1, 1], [1, 2, 3]))
