"""Chapter 4's crosscheck against kvpress (analysis.qevict.crosscheck): the comparison functions that
run in the main environment (no torch), the project's SnapKV definition as rebuilt for kvpress
(analysis.qevict.kvpress_side.window_snap_scores) against the project's own selection, and the
committed artifact's schema and what the chapter reads from it.  The torch side is exercised by
`make crosscheck` itself."""
import numpy as np
import pandas as pd
import pytest

from analysis import artifacts
from analysis.qevict import crosscheck as xc
from analysis.qevict import crosscheck_view as xv
from analysis.qevict.kvcache import EVICTED, FULL
from analysis.qevict.kvpress_side import n_kept_ratio, window_snap_scores
from analysis.qevict.policies import PolicyConfig, SnapKV, StreamingLLM
from analysis.qevict.runner import PrefillCapture, window_stats


@pytest.mark.parametrize("k_len", [64, 256, 1000, 1024, 7936])
def test_n_kept_ratio_keeps_exactly_n_in_kvpress_arithmetic(k_len):
    for n in range(1, k_len + 1, max(1, k_len // 97)):
        r = n_kept_ratio(n, k_len)
        assert 0 <= r < 1
        assert int(k_len * (1 - r)) == n  # kvpress: compute_n_kept and StreamingLLMPress's n_pruned
        assert k_len - int(k_len * (1 - r)) == k_len - n
    with pytest.raises(ValueError):
        n_kept_ratio(0, k_len)


@pytest.mark.parametrize("frac", [0.1, 0.2, 0.35, 0.5])
def test_n_keep_tokens_is_what_the_projects_streaming_policy_keeps(frac):
    cfg = PolicyConfig()
    P = 1024
    nc = P // cfg.window
    pol = StreamingLLM(frac, cfg, 2, 3, nc + 1)
    tier = np.full((2, 3, nc + 1), FULL, np.int8)
    new = pol.target(tier, nc)
    kept = xc.kept_from_tiers(new, cfg.window, FULL, nc)
    n = xc.n_keep_tokens(frac, P, cfg)
    assert all(len(h) == n for layer in kept for h in layer)
    # sinks and the most recent windows, as kvpress's StreamingLLMPress with n_sink = the sink window
    expect = np.r_[np.arange(cfg.window), np.arange(P - (n - cfg.window), P)]
    assert all(np.array_equal(h, expect) for layer in kept for h in layer)


def test_kept_from_tiers_ignores_decoding_windows_and_evicted_ones():
    tier = np.array([[[FULL, EVICTED, FULL, FULL]]])  # window 3 is the decoding's
    kept = xc.kept_from_tiers(tier, 4, FULL, 3)
    assert kept[0][0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11]


def test_jaccard_and_identical_share():
    a = [[np.array([0, 1, 2, 3]), np.array([0, 1])]]
    b = [[np.array([2, 3, 4, 5]), np.array([1, 0])]]
    assert xc.jaccard(a, b) == pytest.approx((2 / 6 + 1) / 2)
    assert xc.identical_share(a, b) == 0.5
    assert xc.jaccard(a, a) == 1.0 and xc.identical_share(a, a) == 1.0
    with pytest.raises(ValueError):
        xc.jaccard(a, [[np.array([0])]])


def test_kl_top1_as_the_runner_computes_them():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(5, 11))
    kl, t1 = xc.kl_top1(ref, ref + 3.0)  # a constant shift is the same distribution
    assert np.allclose(kl, 0, atol=1e-12) and t1.all()
    other = ref.copy()
    other[:, 0] += 5
    kl, t1 = xc.kl_top1(ref, other)
    p = np.exp(ref - ref.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    q = np.exp(other - other.max(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    assert np.allclose(kl, (p * np.log(p / q)).sum(-1))
    assert (kl > 0).all() and not t1.all()


def _causal_probs(rng, H, T):
    s = rng.normal(size=(H, T, T)) * 2
    s += np.triu(np.full((T, T), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("kernel", [1, 4, 7])
@pytest.mark.parametrize("frac", [0.2, 0.35, 0.5])
def test_window_snap_scores_select_what_the_projects_snapkv_selects(kernel, frac):
    """The project's SnapKV definition rebuilt as per-token scores for a kvpress scorer keeps the
    same windows per (layer, KV head) as runner.window_stats + policies.SnapKV."""
    rng = np.random.default_rng(kernel)
    H, n_kv, W, T, L = 6, 2, 8, 128, 2
    cfg = PolicyConfig(window=W, group=8, head_dim=64, snap_obs_tokens=12, snap_kernel=kernel)
    cap = PrefillCapture(L, H, T, cfg.snap_obs_tokens)
    attn = [_causal_probs(rng, H, T) for _ in range(L)]
    for li in range(L):
        cap.on_attention(li, 0, attn[li])
    stats = window_stats(cap, n_kv, W, kernel)
    nc = T // W
    pol = SnapKV(frac, cfg, L, n_kv, nc + 1)
    pol.init(stats)
    new = pol.target(np.full((L, n_kv, nc + 1), FULL, np.int8), nc)
    ours = xc.kept_from_tiers(new, W, FULL, nc)
    n = xc.n_keep_tokens(frac, T, cfg)
    for li in range(L):
        sc = window_snap_scores(attn[li].astype(np.float64), obs=cfg.snap_obs_tokens, kernel=kernel,
                                window=W, n_kv=n_kv, sink_windows=cfg.sink_windows)
        assert sc.shape == (n_kv, T)
        for h in range(n_kv):
            top = np.sort(np.argsort(-sc[h], kind="stable")[:n])
            assert np.array_equal(top, ours[li][h]), (li, h)


def test_window_snap_scores_pooling_matters():
    """Removing the max-pooling changes the ranking on peaked attention (the test guards the term)."""
    rng = np.random.default_rng(3)
    a = _causal_probs(rng, 3, 64)
    s7 = window_snap_scores(a, obs=8, kernel=7, window=4, n_kv=1, sink_windows=1)
    s1 = window_snap_scores(a, obs=8, kernel=1, window=4, n_kv=1, sink_windows=1)
    assert not np.allclose(s7, s1)


def test_kvpress_specs_match_budgets_and_settings():
    cfg = PolicyConfig()
    specs = xc.kvpress_specs([0.1, 0.5], 1024, cfg)
    assert specs[0]["press"] == "full"
    assert len(specs) == 1 + 2 * len(xc.KVPRESS_STREAMS)
    st = [s for s in specs if s["press"] == "StreamingLLMPress"]
    assert [s["n_keep"] for s in st] == [xc.n_keep_tokens(0.1, 1024, cfg), xc.n_keep_tokens(0.5, 1024, cfg)]
    assert st[0]["kwargs"] == dict(n_sink=cfg.sink_windows * cfg.window)
    sn = next(s for s in specs if s["press"] == "SnapKVPress")
    assert sn["kwargs"] == dict(window_size=cfg.snap_obs_tokens, kernel_size=cfg.snap_kernel)
    # the matched presses at the first budget also run through kvpress's own hooks (run_job checks)
    assert {s["key"] for s in specs if s.get("hook_check")} == {f"{k}@0.1" for k in xc.MATCHED}
    assert set(xc.MATCHED.values()) <= set(xc.PROJECT_POLICIES)


def _fake_tables():
    rows, agree = [], []
    for doc in ("code:a", "docs:b"):
        for impl, pols in (("project (numpy)", ["full", "streaming", "snapkv", "qevict_recall"]),
                           ("kvpress (torch)", ["full", "kvp_streaming", "kvp_snapkv", "kvp_snapkv_window",
                                                "kvp_knorm"])):
            for p in pols:
                for b in ((1.0,) if p == "full" else (0.2, 0.5)):
                    full = p == "full"
                    rows.append(dict(document=doc, implementation=impl, policy=p, label=p, budget=b,
                                     kl=0.0 if full else 0.1 / b, top1=1.0 if full else 0.9, fits=True))
        agree.append(dict(document=doc, pair="full cache", budget=1.0, kept_tokens=1024, identical_heads=1.0,
                          jaccard=1.0, max_logit_diff=1e-4, full_logit_diff=1e-4, kl_project=0.0,
                          kl_kvpress=0.0))
        for pair, j in (("streaming vs kvp_streaming", 1.0), ("snapkv vs kvp_snapkv", 0.6),
                        ("snapkv vs kvp_snapkv_window", 1.0)):
            for b in (0.2, 0.5):
                agree.append(dict(document=doc, pair=pair, budget=b, kept_tokens=100,
                                  identical_heads=float(j == 1), jaccard=j, max_logit_diff=2e-4,
                                  full_logit_diff=1e-4,
                                  kl_project=0.1, kl_kvpress=0.12))
    return dict(outcomes=pd.DataFrame(rows), agreement=pd.DataFrame(agree),
                differences=xc.differences_table())


@pytest.fixture
def tmp_results(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBOOK_RESULTS", str(tmp_path / "results"))
    return tmp_path


def test_chapter_reads_an_artifact(tmp_results):
    assert xv.crosscheck_result() is None
    artifacts.write_artifact(xc.ARTIFACT, _fake_tables(), modules=xc.MODULES, command="make crosscheck",
                             wall_seconds=1)
    art = xv.crosscheck_result()
    assert not art.stale
    t = xv.chapter_table(art)
    assert list(t.columns[:2]) == ["implementation", "policy"]
    assert {"KL 20%", "top-1 50%"} <= set(t.columns)
    assert "full" not in set(t.policy)
    assert t.iloc[0].policy == "qevict_recall"  # CHAPTER_ROWS order, QEvict first
    s = xv.agreement_summary(art)
    assert s["documents"] == 2 and s["budgets"] == [0.2, 0.5]
    assert s["streaming_identical"] == 1.0 and s["streaming_within_tol"]
    assert s["snapkv_jaccard"] == pytest.approx(0.6) and s["snapkv_kl_diff"] == pytest.approx(0.02)
    assert s["snapkv_window_jaccard"] == 1.0


def test_schema_errors_say_what_to_do(tmp_results):
    t = _fake_tables()
    t["agreement"] = t["agreement"].drop(columns=["jaccard"])
    artifacts.write_artifact(xc.ARTIFACT, t, modules=xc.MODULES, command="c", wall_seconds=1)
    with pytest.raises(ValueError, match="lacks.*jaccard.*make crosscheck"):
        xv.check_schema(xv.crosscheck_result())
    t = _fake_tables()
    del t["differences"]
    artifacts.write_artifact(xc.ARTIFACT, t, modules=xc.MODULES, command="c", wall_seconds=1)
    with pytest.raises(ValueError, match="no table 'differences'"):
        xv.chapter_table(xv.crosscheck_result())


def test_committed_artifact_schema():
    """The committed result (when present) has what the chapter reads, and its streaming pair passed."""
    if xc.ARTIFACT not in artifacts.list_artifacts():
        pytest.skip("results/qevict_kvpress_crosscheck not committed")
    art = artifacts.read_artifact(xc.ARTIFACT)
    xv.check_schema(art)
    s = xv.agreement_summary(art)
    assert s["documents"] >= 1 and 0 <= s["snapkv_jaccard"] <= 1
    assert art.provenance["params"]["decode_tokens"] <= art.provenance["params"]["window"]
    assert set(xc.MODULES) == set(art.provenance["modules"])


def test_logit_tolerance_is_relative_to_the_full_caches_difference():
    assert xc.within_tolerance(2e-4, 1e-4)
    assert not xc.within_tolerance(2.1e-4, 1e-4)
    assert list(xc.within_tolerance([1e-3, 5e-3], [1e-3, 1e-3])) == [True, False]


def test_chapter_glue(tmp_results):
    keys = {k for k, _ in xv.chapter_glue(None)}
    assert all("make crosscheck" in v for _, v in xv.chapter_glue(None))
    artifacts.write_artifact(xc.ARTIFACT, _fake_tables(), modules=xc.MODULES, command="make crosscheck",
                             wall_seconds=1, params=dict(prefill_tokens=1024, decode_tokens=32))
    g = dict(xv.chapter_glue(xv.crosscheck_result()))
    assert set(g) == keys
    assert ": agreement (" in g["ch4_xc_streaming"] and "100%" in g["ch4_xc_streaming"]
    assert "2 documents" in g["ch4_xc_setup"] and "1,024 prefill + 32" in g["ch4_xc_setup"]
    assert "Jaccard 0.60" in g["ch4_xc_snapkv"] and "+0.0200" in g["ch4_xc_snapkv"]
    assert "20% budget" in g["ch4_xc_extra"] and "granularity" in g["ch4_xc_differences"]
    t = _fake_tables()  # a streaming pair beyond the tolerance is reported as a disagreement
    t["agreement"].loc[t["agreement"].pair == "streaming vs kvp_streaming", "max_logit_diff"] = 1.0
    artifacts.write_artifact(xc.ARTIFACT, t, modules=xc.MODULES, command="c", wall_seconds=1,
                             params=dict(prefill_tokens=1024, decode_tokens=32))
    assert "disagreement" in dict(xv.chapter_glue(xv.crosscheck_result()))["ch4_xc_streaming"]
    t = _fake_tables()  # a pair whose kept positions differ somewhere is named, with its logit gap
    sel = (t["agreement"].pair == "snapkv vs kvp_snapkv_window") & (t["agreement"].document == "docs:b") & (
        t["agreement"].budget == 0.5)
    t["agreement"].loc[sel, ["identical_heads", "max_logit_diff"]] = [0.9, 0.7]
    artifacts.write_artifact(xc.ARTIFACT, t, modules=xc.MODULES, command="c", wall_seconds=1,
                             params=dict(prefill_tokens=1024, decode_tokens=32))
    w = dict(xv.chapter_glue(xv.crosscheck_result()))["ch4_xc_snapkv_window"]
    assert "3 of the 4 (document, budget) pairs" in w and "docs:b at 50% (90.0%" in w and "7.0e-01" in w
    assert "at most 2.0e-04" in w


def test_the_amended_tolerance_is_logged_with_the_outcome_under_the_original(tmp_results):
    """The agreement tolerance was changed after the first run (an amendment): the page states the
    original tolerance, the new one, the date and why, and StreamingLLM's outcome under both."""
    a = xv.TOLERANCE_AMENDMENT
    assert a["original_abs"] == 5e-3 and a["date"] == "2026-12-03" and a["commit"] and a["reason"]
    assert xv.within_original_tolerance([1e-3, 5e-3]) and not xv.within_original_tolerance([1e-3, 6e-3])
    t = _fake_tables()  # full caches 1e-2 apart, the streaming pairs 1.5e-2: amended yes, original no
    t["agreement"]["full_logit_diff"] = 1e-2
    t["agreement"].loc[t["agreement"].pair == "full cache", "max_logit_diff"] = 1e-2
    t["agreement"].loc[t["agreement"].pair == "streaming vs kvp_streaming", "max_logit_diff"] = 1.5e-2
    artifacts.write_artifact(xc.ARTIFACT, t, modules=xc.MODULES, command="c", wall_seconds=1,
                             params=dict(prefill_tokens=1024, decode_tokens=32))
    art = xv.crosscheck_result()
    s = xv.agreement_summary(art)
    assert s["streaming_within_tol"] and not s["streaming_within_original"]
    assert s["streaming_over_original"] == s["streaming_pairs"] == 4
    g = dict(xv.chapter_glue(art))
    txt = g["ch4_xc_tolerance_amendment"]
    assert txt.startswith("amended after the result") and "5e-3" in txt and "2026-12-03" in txt
    assert "reads disagreement: 4 of its 4" in txt and "4 of its 4" in txt and txt.endswith("reads agreement")
    assert g["ch4_xc_streaming"].endswith("under the original one: disagreement)")
    t["agreement"].loc[t["agreement"].pair == "streaming vs kvp_streaming", "max_logit_diff"] = 1e-3
    artifacts.write_artifact(xc.ARTIFACT, t, modules=xc.MODULES, command="c", wall_seconds=1,
                             params=dict(prefill_tokens=1024, decode_tokens=32))
    g = dict(xv.chapter_glue(xv.crosscheck_result()))
    assert "reads agreement: 0 of its 4" in g["ch4_xc_tolerance_amendment"]
