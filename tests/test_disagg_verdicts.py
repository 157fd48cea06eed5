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


def test_range_verdict_widens_the_published_range_by_the_tolerance():
    assert V.verdict_range(3.0, 2.0, 4.6) == VERDICTS[0]
    assert V.verdict_range(1.51, 2.0, 4.6) == VERDICTS[0] and V.verdict_range(1.49, 2.0, 4.6) == VERDICTS[2]
    assert V.verdict_range(5.74, 2.0, 4.6) == VERDICTS[0] and V.verdict_range(5.76, 2.0, 4.6) == VERDICTS[2]
    assert V.verdict_range(float("nan"), 2.0, 4.6) == VERDICTS[3]


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


def test_repricing_equals_pricing_from_scratch():
    """Claim (b) under several price models re-prices one set of candidates: with the listed prices it
    equals the ordinary per-dollar search; a price model changes dollars only."""
    from analysis.disagg import devices, study
    from analysis.disagg import search as S

    pts = ["NPU-250T-64G", "NPU-5000T-16G"]
    hw = S.default_hardware(pts)
    g = S.Grid(sizes=(1, 2, 4), tps=(1, 2), batches=(16, 64), chunks=(2048,), prefill_batches=(1, 4),
               utilisations=(0.7,), microbatches=(1, 2))
    wl, slo = S.Workload(4000, 200), S.SLO(5.0, 0.1)
    kw = dict(budget=16, precision="bf16", objective="dollar", grid=g, enforce_context=False)
    plain = study.run_cell("Qwen3-30B-A3B", "x", hw, wl, slo, **kw)
    linear = {k: v for k, v in devices.npu_prices("linear").items() if k in pts}
    power = {k: v for k, v in devices.npu_prices("power-law").items() if k in pts}
    rep = study.run_cell("Qwen3-30B-A3B", "x", hw, wl, slo, price_models={"x": linear, "y": power}, **kw)
    for a, b in zip(plain, rep[:5]):
        assert a["mode"] == b["mode"]
        assert a["tps_kusd"] == pytest.approx(b["tps_kusd"], rel=1e-12, nan_ok=True)
    c = S.unit_candidates("P", "P", "Qwen3-30B-A3B", wl, hw, prec=S.Precision(), eff=S.Efficiency(), grid=g,
                          budget=16)
    r = S.reprice(c, {k: 2 * v for k, v in linear.items()})
    assert np.allclose(r["usd_per_rate"], 2 * c["usd_per_rate"]) and r["rate"] is c["rate"]
    assert set(devices.npu_prices("gpu-fit")) == set(devices.npu_names())


def test_within_ratio_rho_and_claim_b_by_price():
    df = pd.DataFrame({"ratio": [1, 1, 1, 10, 10, 10], "attention_share": [0.1, 0.2, 0.3, 0.5, 0.6, 0.7],
                       "best_disagg": [1.0, 1.1, 1.2, 3.0, 2.0, 1.0]})
    r = V.within_ratio_rho(df)
    assert r.loc[1] == pytest.approx(1.0) and r.loc[10] == pytest.approx(-1.0)
    assert V.spearman(df["attention_share"], df["best_disagg"]) > 0  # across ratios it looks positive
    rows = []
    for hw, wins in [("a", {"PD": 1.2, "AF": 0.9, "3-way": 0.8, "PDAF": 1.5}),
                     ("b", {"PD": 1.2, "AF": 1.1, "3-way": 0.8, "PDAF": 0.5})]:
        rows += [{"hardware": hw, "mode": m, "speedup": v} for m, v in wins.items()]
    t = V.claim_b_by_price(pd.DataFrame(rows), {"linear": "a", "power-law": "b"})
    assert t.loc["linear", "verdict"] == VERDICTS[0] and t.loc["power-law", "PDAF rank"] == 4


def test_production_cell_returns_the_best_configuration_meeting_the_slo():
    from analysis.disagg import production as P
    from analysis.disagg import search as S

    g = S.Grid(sizes=(1, 2, 4, 8), tps=(1, 2), batches=(16, 64, 256), microbatches=(1, 2), overlaps=(1,))
    r = P.decode_throughput("Qwen3-30B-A3B", "H100-SXM5-80GB", "D", tpot_slo_s=0.03, budget=8, grid=g)
    c = S.role_candidates("D", "Qwen3-30B-A3B", S.Workload(4096 - 512, 1024), "H100-SXM5-80GB",
                          prec=S.Precision.named("fp8"), eff=S.Efficiency(), grid=g, budget=8)
    ok = c["feasible"] & (c["tpot"] <= 0.03)
    best = np.max((c["batch"] / (c["tpot"] * c["devices"]))[ok])
    assert r["tokens_per_s_per_device"] == pytest.approx(best)
    assert r["tpot_s"] <= 0.03
    none = P.decode_throughput("Qwen3-30B-A3B", "H100-SXM5-80GB", "AFD", tpot_slo_s=1e-6, budget=8, grid=g)
    assert np.isnan(none["tokens_per_s_per_device"])
    with pytest.raises(S.SearchError):
        P.decode_throughput("Qwen3-30B-A3B", "H100-SXM5-80GB", "PD")


def test_production_sensitivity_rows_move_the_right_way():
    """The sensitivity of the StepFun cells: its first row is the cell as modelled; removing the
    overlap choice, slower links and a hotter expert device never raise a throughput; a larger
    memory reserve never raises one either."""
    from analysis.disagg import production as P
    from analysis.disagg import study

    t = study.production_sensitivity("H800-SXM5-80GB", 64).set_index("change")
    base = t.loc["as modelled"]
    assert base["DeepSeek-V3 D"] == pytest.approx(
        P.decode_throughput("DeepSeek-V3", "H800-SXM5-80GB", "D", budget=64)["tokens_per_s_per_device"])
    cols = ["Step-3 AFD", "DeepSeek-V3 D", "Step-3 D"]
    for worse in ["no two-micro-batch overlap", "links at 50% of peak", "MoE load imbalance 1.5",
                  "memory reserve 30%", "all-to-all over the NICs only"]:
        assert (t.loc[worse, cols] <= base[cols] * (1 + 1e-12)).all(), worse
    assert (t.loc["links at 35% of peak", cols] <= t.loc["links at 50% of peak", cols] * (1 + 1e-12)).all()
    assert (t.loc["memory reserve 50%", cols] <= t.loc["memory reserve 30%", cols] * (1 + 1e-12)).all()
    assert t["AFD above D"].dtype == bool
