"""Issue 27 item 2: DistServe's cell replays ShareGPT's per-request lengths (the vLLM paper's artifact,
through the data registry), drawn with a seed, instead of every request at the mean lengths."""
import os
import pickle

import numpy as np
import pytest

from analysis import data
from analysis.disagg import production as P


def test_the_length_file_is_registered_and_its_filtered_means_are_the_published_means():
    a = P._sharegpt_pairs(str(data.path(P.SHAREGPT_LENGTHS)))
    ins, outs = P.sharegpt_lengths(int(((a.sum(1) <= 2048) & (a >= 1).all(1)).sum()))
    assert (ins.mean(), outs.mean()) == pytest.approx(P.SHAREGPT_MEAN_LENGTHS, abs=0.01)
    assert np.percentile(ins, 99) > 5 * ins.mean()  # the tail the mean-length replay had no part of


def test_draws_are_seeded_and_fit_the_context():
    a = P.sharegpt_lengths(600, seed=3)
    b = P.sharegpt_lengths(600, seed=3)
    c = P.sharegpt_lengths(600, seed=4)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])
    assert np.all(a[0] + a[1] <= 2048) and np.all(a[0] >= 1) and np.all(a[1] >= 1)
    with pytest.raises(ValueError, match="n must be"):
        P.sharegpt_lengths(10**7)


class _Boom:
    def __reduce__(self):
        return (os.getpid, ())


def test_a_length_file_that_would_run_code_or_is_malformed_is_refused(tmp_path):
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps([(1, 2), _Boom()]))
    with pytest.raises(data.DataError, match="run code"):
        P._sharegpt_pairs(str(bad))
    odd = tmp_path / "odd.pkl"
    odd.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(data.DataError, match="expected a list"):
        P._sharegpt_pairs(str(odd))


def test_distserve_replays_the_per_request_lengths(monkeypatch):
    seen = {}

    def fake_goodput(plan, model, wl, slo, **kw):
        seen.setdefault("wl", []).append(wl)
        return {"rate_per_device": 1.0}

    monkeypatch.setattr(P, "goodput", fake_goodput)
    P.distserve_gain(n_requests=50, seed=1)
    ins, outs = P.sharegpt_lengths(50, seed=1)
    for wl in seen["wl"]:  # both PD and vLLM replay the same drawn requests
        np.testing.assert_array_equal(wl.lengths[0], ins)
        np.testing.assert_array_equal(wl.lengths[1], outs)
    seen.clear()
    P.distserve_gain(n_requests=50, lengths="means")
    assert all(wl.lengths is None for wl in seen["wl"])
    with pytest.raises(ValueError, match="lengths"):
        P.distserve_gain(lengths="trace")


def test_with_lengths_the_pd_plan_is_chosen_by_replayed_goodput(monkeypatch):
    """DistServe's placement search: each candidate PD plan (the screen's best, and its best at each
    TP degree) is replayed on the lengths and the best goodput kept; with means only the screen's best."""
    calls = []

    def fake_goodput(plan, model, wl, slo, *, budget, chunked, **kw):
        tp = max(u["tp"] for u in plan.units)
        calls.append((chunked, tp))
        return {"rate_per_device": 10.0 * tp if chunked else 1.0}

    monkeypatch.setattr(P, "goodput", fake_goodput)
    r = P.distserve_gain(n_requests=50)
    pd_tps = sorted({tp for c, tp in calls if c})
    assert len(pd_tps) >= 2 and r["PD"]["rate_per_device"] == 10.0 * max(pd_tps)
    assert r["gain"] == pytest.approx(10.0 * max(pd_tps)) and len(r["PD_candidates"]) == len(pd_tps)
    calls.clear()
    P.distserve_gain(n_requests=50, lengths="means")
    assert sum(c for c, _ in calls) == 1  # the screen's best only
