"""Chapter 3's plan records expose prefill and decode work per pool (Plan.pools / Plan.phases): the rows sum
to the plan's totals, a prefill or decode unit is wholly one phase, and a unit running both phases (C, AF)
splits its time by the closed form f (t_mix - t_dec) / TPOT of its chunked-prefill mix."""
import pytest

from analysis.disagg import search

MODEL, GPU = "Llama-3.1-70B", "H100-SXM5-80GB"
WL, SLO = search.Workload(16384, 1000), search.SLO(10.0, 0.1)


@pytest.fixture(scope="module")
def plans():
    return search.best_plans(MODEL, WL, SLO, search.default_hardware(GPU), budget=64)


@pytest.mark.parametrize("mode", search.MODES)
def test_pools_sum_to_the_plan_totals(plans, mode):
    p = plans[mode]
    assert p.feasible, p.reason
    rows = p.pools()
    O = WL.output_tokens
    assert sum(r["dev_per_rate"] for r in rows) == pytest.approx(O / p.tokens_per_s_per_device, rel=1e-12)
    assert sum(r["usd_per_rate"] for r in rows) == pytest.approx(O / p.tokens_per_s_per_kusd * 1e3, rel=1e-12)
    ph = p.phases()
    assert ph["prefill"]["dev_per_rate"] > 0 and ph["decode"]["dev_per_rate"] > 0
    assert ph["prefill"]["device_share"] + ph["decode"]["device_share"] == pytest.approx(1.0, rel=1e-12)
    assert ph["prefill"]["ttft_s"] == p.ttft_s and ph["decode"]["tpot_s"] == p.tpot_s
    # every pool of the mode's roles appears, with its devices per instance
    pools = {r["pool"] for r in rows}
    want = {"C": {"C"}, "PD": {"P", "D"}, "AF": {"A", "F"}, "3-way": {"P", "DA", "DF"},
            "PDAF": {"PA", "PF", "DA", "DF"}}[mode]
    assert pools == want
    for u in p.units:
        if "n_a" in u:
            side = [r for r in rows if r["unit"] == u["unit"]]
            assert {r["devices"] for r in side} == {u["n_a"], u["n_f"]}


@pytest.mark.parametrize("mode", ["PD", "3-way", "PDAF"])
def test_a_disaggregated_mode_puts_each_unit_in_one_phase(plans, mode):
    p = plans[mode]
    ph = p.phases()
    pre, dec = p.units
    assert pre["prefill_share"] == 1.0 and dec["prefill_share"] == 0.0
    assert ph["prefill"]["dev_per_rate"] == pytest.approx(pre["dev_per_rate"], rel=1e-12)
    assert ph["decode"]["dev_per_rate"] == pytest.approx(dec["dev_per_rate"], rel=1e-12)
    assert ph["decode"]["usd_per_rate"] == pytest.approx(dec["usd_per_rate"], rel=1e-12)


@pytest.mark.parametrize("mode", ["C", "AF"])
def test_a_unit_running_both_phases_splits_by_its_chunk_mix(plans, mode):
    p = plans[mode]
    (u,) = p.units
    B, K, x = u["batch"], u["chunk"], u["interference"]
    f = B * WL.input_tokens / (WL.output_tokens * K)
    share = f * (x - 1) / (f * x + 1 - f)  # prefill chunks' extra time over the mean step
    assert 0 < share < 1
    assert u["prefill_share"] == pytest.approx(share, rel=1e-12)
    ph = p.phases()
    assert ph["prefill"]["dev_per_rate"] == pytest.approx(share * u["dev_per_rate"], rel=1e-12)
    assert ph["decode"]["dev_per_rate"] == pytest.approx((1 - share) * u["dev_per_rate"], rel=1e-12)
    if mode == "AF":  # the attention and FFN pools split by devices
        a = sum(r["dev_per_rate"] for r in p.pools() if r["pool"] == "A")
        assert a == pytest.approx(u["dev_per_rate"] * u["n_a"] / (u["n_a"] + u["n_f"]), rel=1e-12)


def test_whole_instances_rows_sum_to_the_plan_totals():
    p = search.best_plan("PD", MODEL, WL, SLO, search.default_hardware(GPU), budget=64, whole_instances=True)
    assert p.feasible, p.reason
    rows = p.pools()
    O = WL.output_tokens
    assert sum(r["dev_per_rate"] for r in rows) == pytest.approx(O / p.tokens_per_s_per_device, rel=1e-12)
    assert sum(r["usd_per_rate"] for r in rows) == pytest.approx(O / p.tokens_per_s_per_kusd * 1e3, rel=1e-12)
    # idle slack of the faster pool is charged to it: its share exceeds its rate-matched device time
    rm = search.best_plan("PD", MODEL, WL, SLO, search.default_hardware(GPU), budget=64)
    assert sum(r["dev_per_rate"] for r in rows) >= O / rm.tokens_per_s_per_device * (1 - 1e-12)


def test_repriced_split_units_keep_the_attention_pools_price():
    c = search.unit_candidates("DAF", ("DA", "DF"), MODEL, WL, search.default_hardware(GPU),
                               prec=search.Precision(), eff=search.Efficiency(), grid=search.Grid(),
                               budget=16)
    r = search.reprice(c, {GPU: 1000.0})
    assert (r["dollars_a"] == r["n_a"] * 1000.0).all() and (r["dollars"] == r["devices"] * 1000.0).all()


def test_infeasible_plan_has_no_pools():
    p = search.best_plan("PD", MODEL, WL, search.SLO(1e-4, 1e-4), search.default_hardware(GPU), budget=64)
    assert not p.feasible and p.pools() == []
