"""Chapter 3's search grid and event simulation (issue 27): data-parallel groups that divide, a warning
at every grid edge (none inside), the prefill utilisation searched up to its cap, and the event
simulation run to steady state."""
import warnings

import numpy as np
import pytest

from analysis.disagg import des
from analysis.disagg import production as P
from analysis.disagg import search as S
from analysis.forward import Efficiency, Precision

H100 = "H100-SXM5-80GB"
MODEL = "Llama-3.1-8B"
WL = S.Workload(2000, 200)


def _grid(**kw):
    base = dict(sizes=(1, 2, 4, 8), tps=(1, 2), batches=(8, 16, 32, 64, 128, 256, 512),
                prefill_batches=(1, 2, 4, 8), utilisations=(0.5, 0.7, 0.9, 0.95), overlaps=(1,))
    return S.Grid(**{**base, **kw})


def _edge_warnings(rec):
    return [w for w in rec if issubclass(w.category, S.GridEdgeWarning)]


# ---------------------------------------------------------------- data-parallel divisibility

def test_instances_that_do_not_split_into_tp_groups_are_skipped():
    """5 devices at TP 4 leave a device out of every group: never a candidate; 5 at TP 1 and 8 at TP 4
    are."""
    g = _grid(sizes=(4, 5, 8), tps=(1, 4))
    for role in ("C", "P", "D"):
        c = S.role_candidates(role, MODEL, WL, H100, prec=Precision(), eff=S.Efficiency(), grid=g, budget=16)
        pairs = set(zip(c["size"].tolist(), c["tp"].tolist()))
        assert (5.0, 4.0) not in pairs
        assert {(5.0, 1.0), (8.0, 4.0), (4.0, 4.0)} <= pairs
        assert np.all(np.mod(c["size"], c["tp"]) == 0)
    c = S.role_candidates("DAF", MODEL, WL, (H100, H100), prec=Precision(), eff=S.Efficiency(), grid=g,
                          budget=16)
    assert not np.any((c["n_a"] == 5) & (c["tp"] == 4))
    assert np.any((c["n_a"] == 8) & (c["tp"] == 4)) and np.any((c["n_a"] == 5) & (c["tp"] == 1))


def test_a_grid_where_nothing_divides_is_a_clear_error():
    g = _grid(sizes=(5,), tps=(4,))
    with pytest.raises(S.SearchError, match="whole data-parallel groups"):
        S.role_candidates("D", MODEL, WL, H100, prec=Precision(), eff=S.Efficiency(), grid=g, budget=16)
    with pytest.raises(S.SearchError, match="whole data-parallel groups"):
        S.role_candidates("DAF", MODEL, WL, (H100, H100), prec=Precision(), eff=S.Efficiency(), grid=g,
                          budget=16)


def test_grid_rejects_utilisation_outside_the_open_interval():
    with pytest.raises(S.SearchError, match="utilisations"):
        S.Grid(utilisations=(0.5, 1.0))
    with pytest.raises(S.SearchError, match="sizes"):
        S.Grid(sizes=())


# ---------------------------------------------------------------- grid edges

def test_no_warning_for_a_plan_inside_the_grid():
    """A tight TTFT SLO keeps the prefill utilisation below its cap; the decode batch, sizes and prefill
    batch sit inside their axes; a dense model at TP 1 has no communication for overlap to hide."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        p = S.best_plan("PD", MODEL, WL, S.SLO(0.3, 0.015), S.default_hardware(H100), budget=16, grid=_grid())
    assert p.feasible and p.edges == []
    assert _edge_warnings(rec) == []


def test_prefill_utilisation_cap_is_an_edge_that_warns():
    """With a lax TTFT SLO the prefill pool runs at the grid's top utilisation: the plan names the edge
    and warns; a grid that also offers 0.97 finds a cheaper plan (the edge was binding)."""
    slo = S.SLO(5.0, 0.1)
    with pytest.warns(S.GridEdgeWarning, match=r"P\.rho \(prefill utilisation cap, 0\.95\)"):
        p = S.best_plan("PD", MODEL, WL, slo, S.default_hardware(H100), budget=16, grid=_grid())
    assert "P.rho" in p.edges and [u["rho"] for u in p.units if u["unit"] == "P"] == [0.95]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", S.GridEdgeWarning)
        wider = S.best_plan("PD", MODEL, WL, slo, S.default_hardware(H100), budget=16,
                            grid=_grid(utilisations=(0.5, 0.7, 0.9, 0.95, 0.97)))
    assert wider.tokens_per_s_per_device > p.tokens_per_s_per_device


def test_default_grid_searches_utilisation_past_the_old_cap():
    assert max(S.Grid().utilisations) > 0.85 and len(S.Grid().utilisations) > 3


def test_default_grid_warns_where_a_larger_grid_does_better():
    """The issue's case: DeepSeek-V3 decode on H800 (FP8, 4K context, 50 ms TPOT): the default grid's
    best sits at its edges (without overlap; with balanced experts also at its largest instance and
    batch: the all-to-all's imbalance traffic makes wide instances dearer) and warns saying so; the
    validation grid (to 256 devices, 65,536 sequences, two-micro-batch overlap) gives more."""
    wl = S.Workload(4096 - 512, 1024)
    kw = dict(tpot_slo_s=0.05, prec=Precision.named("fp8"), budget=256)
    balanced = Efficiency(moe_imbalance=1.0)
    for eff, edges in ((Efficiency(), {"D.ovl"}), (balanced, {"D.size", "D.batch", "D.ovl"})):
        with pytest.warns(S.GridEdgeWarning) as rec:
            small = P.best_decode("DeepSeek-V3", "H800-SXM5-80GB", "D", wl, grid=S.Grid(), eff=eff, **kw)
        msg = " ".join(str(w.message) for w in _edge_warnings(rec))
        assert edges <= set(small["edges"])
        assert "no overlap searched" in msg
        if "D.size" in edges:
            assert "largest instance size, 64" in msg and "largest decode batch, 4,096" in msg
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", S.GridEdgeWarning)
            big = P.best_decode("DeepSeek-V3", "H800-SXM5-80GB", "D", wl, grid=P.validation_grid(256),
                                eff=eff, **kw)
        assert big["tokens_per_s_per_device"] > 1.2 * small["tokens_per_s_per_device"]
        assert "D.size" not in big["edges"] and "D.batch" not in big["edges"]


def test_describe_edges_words_every_axis():
    g = _grid(overlaps=(1,), microbatches=(1,))
    words = S.describe_edges(["D.batch", "P.rho", "D.ovl", "DAF.m", "budget"], g, 16)
    assert "largest decode batch, 512" in words and "prefill utilisation cap, 0.95" in words
    assert "no overlap searched" in words and "no ping-pong micro-batches searched" in words
    assert "device budget (16)" in words


# ---------------------------------------------------------------- steady state

def _busy_colocated():
    """Eight one-GPU colocated instances of 256 sequences each: about 1,850 sequences in flight at 90%
    load, so 2,000 requests are mostly the fill and the drain."""
    g = S.Grid(sizes=(1,), tps=(1,), batches=(256,), chunks=(2048,), overlaps=(1,))
    wl = S.Workload(1000, 500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", S.GridEdgeWarning)
        p = S.best_plan("C", MODEL, wl, S.SLO(1e6, 1e6), S.default_hardware(H100), budget=8, grid=g)
    assert p.feasible
    return p, g, wl


@pytest.mark.slow  # the 30,000-request reference run takes a few seconds
def test_steady_state_reproduces_the_long_run_p90_where_2000_requests_do_not():
    p, g, wl = _busy_colocated()
    kw = dict(budget=8, grid=g, seed=1)
    short = des.simulate(p, MODEL, wl, n_requests=2000, steady=False, **kw)
    long = des.simulate(p, MODEL, wl, n_requests=30000, steady=False, **kw)
    st = des.simulate(p, MODEL, wl, **kw)  # steady state is the default without lengths or a trace
    assert st.steady is True and st.warmup > 0 and st.measured > 0
    assert st.requests >= st.warmup + st.measured and st.requests < 30000
    assert short.p90_tpot_s < 0.9 * long.p90_tpot_s  # 2,000 requests end before steady state
    assert st.p90_tpot_s == pytest.approx(long.p90_tpot_s, rel=0.03)
    assert st.p90_ttft_s == pytest.approx(long.p90_ttft_s, rel=0.08)
    assert short.requests == 2000 and short.warmup == 0 and short.steady is None


def test_steady_state_discards_the_warm_up():
    """The same run judged on every request (no warm-up discarded) gives a lower p90 TPOT than the
    steady-state windows: the discarded requests are the fill."""
    p, g, wl = _busy_colocated()
    st = des.simulate(p, MODEL, wl, budget=8, grid=g, seed=1)
    multi = np.isfinite(st.tpot)
    all_p90 = float(np.percentile(st.tpot[multi], 90))
    assert all_p90 < st.p90_tpot_s * 0.99


def test_steady_state_that_never_settles_says_so():
    """A cap below two windows: the run ends before two windows can agree and reports it."""
    p, g, wl = _busy_colocated()
    r = des.simulate(p, MODEL, wl, budget=8, grid=g, seed=1, steady=True, n_requests=1500, window=1000)
    assert r.steady is False and r.requests == 1500 and r.warmup == 1000 and r.measured == 500


def test_rerank_takes_a_request_count_and_steady_state():
    p, g, wl = _busy_colocated()
    kw = dict(k=1, budget=8, grid=g)
    fixed = des.rerank("C", MODEL, wl, S.SLO(1e6, 1e6), S.default_hardware(H100), n_requests=700,
                       steady=False, **kw)
    assert fixed[0]["requests"] == 700 and fixed[0]["steady"] is None
    st = des.rerank("C", MODEL, wl, S.SLO(1e6, 1e6), S.default_hardware(H100), **kw)
    assert st[0]["steady"] is True and st[0]["warmup"] > 0


# ---------------------------------------------------------------- the chapter's lines

def test_chapter_line_counts_plans_at_each_kind_of_edge():
    import pandas as pd

    from analysis.disagg import chapter

    sweep = pd.DataFrame({"feasible": [True, True, True, False],
                          "edges": ["D.batch,P.rho", "", "PAF.rho,budget", "D.batch"]})
    line = chapter.edge_values(sweep)["ch3_grid_edges"]
    assert line.startswith("2 of the sweep's 3 feasible best plans sit at an edge")
    assert "2 at the prefill utilisation cap" in line and "1 at the largest decode batch" in line
    assert "1 at the device budget" in line
    tail = pd.DataFrame({"feasible": [True, True, False], "steady": [True, False, None],
                         "warmup": [2000, 1000, 0], "measured": [2000, 11031, 0]})
    v = chapter.steady_values(tail)
    assert v["ch3_des_settled"] == "1 of 2"
    assert v["ch3_des_requests"] == "1,000 to 2,000 warm-up requests discarded, 2,000 to 11,031 judged"
