"""The discrete-event simulation (analysis.disagg.des): M/D/1 where it must agree, conservation,
determinism, and the speed of one plan over the Mooncake conversation trace is in benchmarks/."""
import numpy as np
import pytest

from analysis import forward as F
from analysis.disagg import des, devices
from analysis.disagg import search as S
from analysis.forward import Efficiency, Precision

H100 = "H100-SXM5-80GB"
MODEL = "Llama-3.1-8B"


def _pd_plan(wl, rho=0.7):
    g = S.Grid(sizes=(1,), tps=(1,), prefill_batches=(1,), utilisations=(rho,), batches=(64,))
    p = S.best_plan("PD", MODEL, wl, S.SLO(1e6, 1e6), S.default_hardware(H100), budget=8, grid=g)
    assert p.feasible
    return p, g


def test_prefill_queue_matches_md1():
    """One prefill instance, batches of one prompt, fixed lengths, Poisson arrivals at utilisation 0.7:
    the mean wait before the pass is the M/D/1 mean ``rho / (2 (1 - rho)) t``, and the mean TTFT equals
    the analytic screen's prefill TTFT with b = 1."""
    wl = S.Workload(2000, 20)
    p, g = _pd_plan(wl)
    s, prec, eff = F.shape(MODEL), Precision(), Efficiency()
    dev = devices.device(H100)
    t = float(F.colocated_pass_time(s, prec, eff, dev, tp=1.0, dp=1.0, pre_seqs=1.0, pre_len=2000.0))
    x = float(F.kv_transfer_exposed(s, prec, eff, seqs=1, tokens=2000.0, t_pass=t, devices=1, net=dev["net"]))
    rho = 0.7
    r = des.simulate(p, MODEL, wl, budget=8, rate=rho / t, n_requests=40000, seed=3,
                     instances={"P": 1, "D": 1}, grid=g)
    wait = r.ttft - t - x
    assert wait.mean() == pytest.approx(rho / (2 * (1 - rho)) * t, rel=0.05)
    p_unit = [u for u in p.units if u["unit"] == "P"][0]
    assert r.ttft.mean() == pytest.approx(p_unit["ttft"], rel=0.05)
    assert np.all(wait >= -1e-12)


def test_every_request_completes_in_order_of_its_events():
    ins = np.array([500, 3000, 9000, 120, 40000])
    outs = np.array([1, 50, 300, 7, 200])
    wl = S.Workload.from_lengths(ins, outs)
    for mode in ("C", "PD"):
        g = S.Grid(sizes=(1, 2), tps=(1, 2), batches=(16, 64), chunks=(2048,), prefill_batches=(1, 4),
                   utilisations=(0.7,))
        p = S.best_plan(mode, MODEL, wl, S.SLO(1e6, 1e6), S.default_hardware(H100), budget=8, grid=g)
        r = des.simulate(p, MODEL, wl, budget=8, n_requests=500, seed=1, grid=g, slo=S.SLO(10.0, 0.1))
        assert np.isfinite(r.ttft).all() and (r.ttft > 0).all()
        assert np.isfinite(r.tpot).all() and (r.tpot >= 0).all()
        assert 0 <= r.attainment <= 1 and r.p90_ttft_s >= np.median(r.ttft)
        r2 = des.simulate(p, MODEL, wl, budget=8, n_requests=500, seed=1, grid=g, slo=S.SLO(10.0, 0.1))
        assert np.array_equal(r.ttft, r2.ttft) and np.array_equal(r.tpot, r2.tpot)


def test_light_load_decode_runs_at_the_single_sequence_step():
    """Requests 100 s apart (evenly spaced arrivals): each decodes alone, so its TPOT is the
    one-sequence decode step at a context between the prompt and the last token."""
    wl = S.Workload(1000, 100)
    p, g = _pd_plan(wl)
    r = des.simulate(p, MODEL, wl, budget=8, rate=0.01, n_requests=20, trace_s=np.arange(20.0),
                     instances={"P": 1, "D": 1}, grid=g)
    s, dev = F.shape(MODEL), devices.device(H100)
    step = [float(F.colocated_pass_time(s, Precision(), Efficiency(), dev, tp=1.0, dp=1.0, dec_seqs=1.0,
                                        dec_ctx=c)) for c in (1001.0, 1100.0)]
    assert min(step) * 0.999 <= r.tpot.mean() <= max(step) * 1.001


def test_more_load_never_improves_the_tail():
    wl = S.Workload(3000, 100)
    p, g = _pd_plan(wl)
    lo = des.simulate(p, MODEL, wl, budget=8, load=0.3, n_requests=3000, seed=2, grid=g)
    hi = des.simulate(p, MODEL, wl, budget=8, load=0.9, n_requests=3000, seed=2, grid=g)
    assert hi.p90_ttft_s >= lo.p90_ttft_s and hi.p90_tpot_s >= lo.p90_tpot_s * (1 - 1e-9)


def test_rerank_keeps_the_analytic_order_and_judges_each_plan():
    wl = S.Workload(2000, 100)
    g = S.Grid(sizes=(1, 2, 4), tps=(1, 2), batches=(16, 64), chunks=(2048,), prefill_batches=(1, 4),
               utilisations=(0.5, 0.8))
    slo = S.SLO(3.0, 0.05)
    rows = des.rerank("PD", MODEL, wl, slo, S.default_hardware(H100), k=3, budget=8, grid=g)
    tps = [r["tps_device"] for r in rows]
    assert len(rows) == 3 and tps == sorted(tps, reverse=True)
    top = S.best_plan("PD", MODEL, wl, slo, S.default_hardware(H100), budget=8, grid=g)
    assert tps[0] == pytest.approx(top.tokens_per_s_per_device)
    for r in rows:
        assert r["meets_p90"] == (r["p90_ttft_s"] <= slo.ttft_s and r["p90_tpot_s"] <= slo.tpot_s)


def test_reranked_best_takes_only_plans_meeting_the_tail():
    import pandas as pd

    from analysis.disagg import study
    tail = pd.DataFrame({"mode": ["C", "C", "PD", "PD", "AF"], "feasible": [True] * 5,
                         "tps_device": [10.0, 9.0, 20.0, 15.0, 5.0],
                         "des_tps_device": [8.0, 7.0, 18.0, 12.0, 4.0],
                         "meets_p90": [False, True, False, True, False]})
    b = study.reranked_best(tail)
    assert b.loc["C", "simulated"] == 7.0 and b.loc["PD", "simulated"] == 12.0
    assert np.isnan(b.loc["AF", "simulated"])
    assert b.loc["PD", "simulated_speedup"] == pytest.approx(12 / 7) and b.loc["PD", "screen_speedup"] == 2.0


def test_colocated_without_chunked_prefill_stalls_decoding():
    """Without chunked prefill every prompt's prefill pauses the decode batch: TPOT's tail grows and
    the first token of a lone request is one whole-prompt pass."""
    wl = S.Workload.from_lengths(np.full(400, 6000.0), np.full(400, 200.0))
    g = S.Grid(sizes=(1,), tps=(1,), batches=(64,), chunks=(2048,))
    p = S.best_plan("C", MODEL, wl, S.SLO(1e6, 1e6), S.default_hardware(H100), budget=8, grid=g)
    on = des.simulate(p, MODEL, wl, budget=8, load=0.7, seed=4, grid=g)
    off = des.simulate(p, MODEL, wl, budget=8, load=0.7, seed=4, grid=g, chunked=False)
    assert np.isfinite(off.tpot).all() and off.p90_tpot_s > on.p90_tpot_s
    lone = des.simulate(p, MODEL, S.Workload(6000, 50), budget=8, rate=1e-3, n_requests=3, grid=g,
                        chunked=False, trace_s=np.arange(3.0))
    s, dev = F.shape(MODEL), devices.device(H100)
    t = float(F.colocated_pass_time(s, Precision(), Efficiency(), dev, tp=1.0, dp=1.0, pre_seqs=1.0,
                                    pre_len=6000.0))
    assert lone.ttft == pytest.approx(np.full(3, t), rel=1e-9)


def test_goodput_is_the_highest_rate_meeting_the_attainment_target():
    """DistServe's goodput (bisection over the rate): the target holds at the returned rate and fails
    a little above it; per device divides by the whole instances' devices."""
    from analysis.disagg import production as P

    wl = S.Workload(512, 64)
    p, g = _pd_plan(wl)
    slo = S.SLO(ttft_s=0.05, tpot_s=0.02)
    r = P.goodput(p, MODEL, wl, slo, budget=8, n_requests=200, grid=g, iters=8)
    assert r["rate"] > 0 and r["attainment"] >= P.ATTAINMENT
    counts = r["instances"]
    above = des.simulate(p, MODEL, wl, budget=8, rate=r["rate"] * 1.15, n_requests=200, slo=slo, grid=g,
                         instances=counts)
    assert above.attainment < P.ATTAINMENT
    assert r["rate_per_device"] == pytest.approx(r["rate"] / r["devices"])
    assert r["devices"] == sum(counts[u["unit"]] * u["devices"] for u in p.units)


@pytest.mark.parametrize("mode,chunked", [("C", True), ("C", False), ("PD", True), ("AF", True),
                                          ("PDAF", True)])
def test_lazy_engines_match_one_event_per_iteration(mode, chunked):
    """The engines advanced between routing decisions give the same per-request TTFT and TPOT as the
    earlier simulation with one simpy event per iteration (tests/_des_reference.py), on a bursty
    workload with mixed lengths, several instances and simultaneous arrivals."""
    from tests import _des_reference as ref

    rng = np.random.default_rng(5)
    ins = rng.integers(50, 12000, 400).astype(float)
    outs = rng.integers(1, 400, 400).astype(float)
    wl = S.Workload.from_lengths(ins, outs)
    g = S.Grid(sizes=(1, 2), tps=(1, 2), batches=(8, 32), chunks=(1024,), prefill_batches=(1, 4),
               utilisations=(0.7,), microbatches=(1, 2))
    p = S.best_plan(mode, MODEL, wl, S.SLO(1e6, 1e6), S.default_hardware(H100), budget=8, grid=g)
    assert p.feasible
    trace = np.floor(np.sort(rng.exponential(1.0, 400)).cumsum() / 5) * 5  # ties: several at one instant
    kw = dict(budget=8, load=0.95, trace_s=trace, grid=g, chunked=chunked, slo=S.SLO(5.0, 0.05))
    a = des.simulate(p, MODEL, wl, **kw)
    b = ref.simulate(p, MODEL, wl, **kw)
    assert sum(a.instances.values()) >= 2 or mode != "C"
    np.testing.assert_array_equal(a.ttft, b.ttft)
    np.testing.assert_array_equal(a.tpot, b.tpot)
    assert a.sim_seconds == pytest.approx(b.sim_seconds)


def test_plans_are_judged_at_the_90th_percentile():
    """The tail the simulation judges is the 90th percentile (DistServe's and Splitwise's), written
    here as a literal, not read from ``des.PERCENTILE``: on a loaded PD plan the 90th and 50th
    percentiles differ, so judging at any other percentile fails this test. The reference copy in
    tests/_des_reference.py keeps its own constant, so the equality test above cannot see it."""
    wl = S.Workload.from_lengths(np.array([500.0, 4000.0, 12000.0, 800.0] * 100),
                                 np.array([20.0, 200.0, 60.0, 400.0] * 100))
    p, g = _pd_plan(wl)
    r = des.simulate(p, MODEL, wl, budget=8, load=0.9, n_requests=400, seed=6, grid=g)
    decoding = r.tpot[r.tpot > 0]
    assert np.percentile(r.ttft, 90) > 1.01 * np.percentile(r.ttft, 50)  # the sample tells them apart
    assert np.percentile(decoding, 90) > 1.01 * np.percentile(decoding, 50)
    assert r.p90_ttft_s == pytest.approx(np.percentile(r.ttft, 90), rel=1e-12)
    assert r.p90_tpot_s == pytest.approx(np.percentile(decoding, 90), rel=1e-12)
    slo = S.SLO(ttft_s=r.p90_ttft_s * 0.999, tpot_s=1e6)
    assert not r.judged(slo) and r.judged(S.SLO(ttft_s=r.p90_ttft_s, tpot_s=r.p90_tpot_s))


def test_a_fixed_count_longer_than_its_trace_says_so():
    """steady=False replays exactly n_requests arrivals: more than the trace holds is a clear error."""
    wl = S.Workload(1000, 100)
    p, g = _pd_plan(wl)
    kw = dict(budget=8, rate=0.01, trace_s=np.arange(20.0), instances={"P": 1, "D": 1}, grid=g, steady=False)
    with pytest.raises(S.SearchError, match="more than the trace's 20 arrivals"):
        des.simulate(p, MODEL, wl, n_requests=21, **kw)
    assert len(des.simulate(p, MODEL, wl, n_requests=20, **kw).ttft) == 20
