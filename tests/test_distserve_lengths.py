"""Issue 27 item 2: DistServe's cell replays ShareGPT's per-request lengths, drawn with a seed, instead of
every request at the mean lengths. The lengths come from a seeded sample of the vLLM paper's length file
committed with provenance (results/sharegpt_lengths/, analysis.disagg.sharegpt); the book and CI read
the sample, never the registered file (not in the shared data mirror; CI reaches no other network)."""
import json
import os
import pickle
import shutil

import numpy as np
import pytest

from analysis import artifacts, data
from analysis.disagg import production as P
from analysis.disagg import sharegpt as G


@pytest.fixture
def results_copy(tmp_path, monkeypatch):
    """A copy of the committed sample in a results folder of its own (KVBOOK_RESULTS)."""
    root = tmp_path / "results"
    shutil.copytree(artifacts.REPO_ROOT / "results" / G.ARTIFACT, root / G.ARTIFACT)
    monkeypatch.setenv("KVBOOK_RESULTS", str(root))
    return root / G.ARTIFACT


def test_the_committed_sample_names_its_source_and_matches_its_distribution():
    art = G.sample()
    src, params = art.provenance["source"], art.provenance["params"]
    reg = data.registry()[G.REGISTRY_KEY]
    assert src["registry_key"] == G.REGISTRY_KEY
    assert src["sha256"] == reg["sha256"] and src["url"] == reg["url"]
    assert "make sharegpt-lengths" in art.provenance["command"] and not art.stale
    t = art.tables["pairs"]
    assert len(t) == params["n"] and (os.path.getsize(artifacts.results_dir() / G.ARTIFACT / "pairs.csv")
                                       < 100_000)  # tens of KB
    assert np.all(t["input"] + t["output"] <= params["max_context"]) and np.all(t[["input", "output"]] >= 1)
    # a uniform sample of the pairs whose means the vLLM paper prints: each mean within 4 standard errors
    for col, mean in zip(("input", "output"), P.SHAREGPT_MEAN_LENGTHS):
        assert abs(t[col].mean() - mean) < 4 * t[col].std() / np.sqrt(len(t))
    assert src["means_within_context"] == pytest.approx(P.SHAREGPT_MEAN_LENGTHS, abs=0.01)
    assert np.percentile(t["input"], 99) > 5 * t["input"].mean()  # the tail the mean-length replay lacked


def test_the_committed_sample_is_what_the_registered_file_derives(tmp_path, monkeypatch):
    """Reproducible: derived again from the registered file (where this machine has it), the same pairs."""
    monkeypatch.setenv("KVBOOK_OFFLINE", "1")
    try:
        src = data.path(G.REGISTRY_KEY)
    except data.DataError:
        pytest.skip("the registered ShareGPT length file is not on this machine (CI reads the sample)")
    committed = G.sample().tables["pairs"]
    monkeypatch.setenv("KVBOOK_RESULTS", str(tmp_path / "results"))
    G.derive(n=len(committed), source=src)
    again = artifacts.read_artifact(G.ARTIFACT).tables["pairs"]
    assert again.equals(committed)


def test_derive_draws_a_seeded_filtered_sample_and_records_the_source(tmp_path, monkeypatch):
    pairs = [(1000 + i, 1500) for i in range(50)] + [(i + 1, 2 * i + 1) for i in range(200)] + [(0, 5)]
    f = tmp_path / "lengths.pkl"
    f.write_bytes(pickle.dumps(pairs))
    entry = {**data.registry()[G.REGISTRY_KEY], "sha256": data.sha256(f)}
    monkeypatch.setattr(data, "registry", lambda: {G.REGISTRY_KEY: entry})
    monkeypatch.setenv("KVBOOK_RESULTS", str(tmp_path / "results"))
    G.derive(n=120, seed=5, source=f)
    a = artifacts.read_artifact(G.ARTIFACT)
    t = a.tables["pairs"]
    assert len(t) == 120 and np.all(t["input"] + t["output"] <= 2048) and np.all(t["input"] >= 1)
    src = a.provenance["source"]
    assert src["sha256"] == entry["sha256"] and src["pairs_within_context"] == 200
    G.derive(n=120, seed=5, source=f)
    assert artifacts.read_artifact(G.ARTIFACT).tables["pairs"].equals(t)  # seeded
    f.write_bytes(pickle.dumps(pairs[:-1]))  # not the registered file
    with pytest.raises(data.DataError, match="sha256"):
        G.derive(n=10, source=f)


def test_draws_are_seeded_and_fit_the_context():
    a = P.sharegpt_lengths(600, seed=3)
    b = P.sharegpt_lengths(600, seed=3)
    c = P.sharegpt_lengths(600, seed=4)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])
    assert np.all(a[0] + a[1] <= 2048) and np.all(a[0] >= 1) and np.all(a[1] >= 1)
    short = P.sharegpt_lengths(100, max_context=512.0)
    assert np.all(short[0] + short[1] <= 512)
    with pytest.raises(ValueError, match="n must be"):
        P.sharegpt_lengths(10**7)
    with pytest.raises(ValueError, match="--max-context 4096"):
        P.sharegpt_lengths(10, max_context=4096.0)  # wider than the sample was filtered to


def test_a_stale_or_missing_sample_is_flagged(results_copy, monkeypatch):
    assert not G.sample().stale
    # the code that derived it changed: the provenance's code hash no longer matches
    prov = json.loads((results_copy / "provenance.json").read_text())
    (results_copy / "provenance.json").write_text(json.dumps({**prov, "code_hash": "0" * 64}))
    assert any("code it depends on has changed" in r for r in G.sample().stale_reasons)
    with pytest.warns(G.StaleLengthsWarning, match="make sharegpt-lengths"):
        P.sharegpt_lengths(10)
    # a table edited by hand
    (results_copy / "provenance.json").write_text(json.dumps(prov))
    (results_copy / "pairs.csv").write_text("input,output\n5,6\n7,8\n")
    assert any("edited" in r for r in G.sample().stale_reasons)
    shutil.rmtree(results_copy)
    with pytest.raises(data.DataError, match="make sharegpt-lengths"):
        P.sharegpt_lengths(10)


class _Boom:
    def __reduce__(self):
        return (os.getpid, ())


def test_a_length_file_that_would_run_code_or_is_malformed_is_refused(tmp_path):
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps([(1, 2), _Boom()]))
    with pytest.raises(data.DataError, match="run code"):
        G.read_pairs(bad)
    odd = tmp_path / "odd.pkl"
    odd.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(data.DataError, match="expected a list"):
        G.read_pairs(odd)


def test_distserve_replays_the_committed_per_request_lengths(monkeypatch, results_copy):
    seen = {}

    def fake_goodput(plan, model, wl, slo, **kw):
        seen.setdefault("wl", []).append(wl)
        return {"rate_per_device": 1.0}

    def no_registry(*a, **k):
        raise AssertionError("the DistServe cell read the registered file, not the committed sample")

    monkeypatch.setattr(P, "goodput", fake_goodput)
    monkeypatch.setattr(data, "path", no_registry)
    P.distserve_gain(n_requests=50, seed=1)
    ins, outs = P.sharegpt_lengths(50, seed=1)
    for wl in seen["wl"]:  # both PD and vLLM replay the same drawn requests
        np.testing.assert_array_equal(wl.lengths[0], ins)
        np.testing.assert_array_equal(wl.lengths[1], outs)
    # the replay's requests are the sample's rows: change the sample and they change
    t = G.sample().tables["pairs"]
    t.assign(input=t["input"] // 2 + 1).to_csv(results_copy / "pairs.csv", index=False)
    seen.clear()
    with pytest.warns(G.StaleLengthsWarning):
        P.distserve_gain(n_requests=50, seed=1)
    np.testing.assert_array_equal(seen["wl"][0].lengths[0], ins // 2 + 1)
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
