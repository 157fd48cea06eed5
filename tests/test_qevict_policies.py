"""Policies at equal memory, exactness at 100% budget, FMM, promotion and eviction semantics.

The policies, the cache and the runner are exercised on a tiny random-weight Llama of SmolLM2's head
layout (tests/_tiny_model.py): what is checked here is bookkeeping and semantics, not the model.  The
runner on SmolLM2's real weights is checked in tests/test_qevict_engine.py."""
import numpy as np
import pytest

from analysis.qevict.kvcache import EVICTED, FULL, QUANT, MultiStreamCache
from analysis.qevict.policies import POLICIES, RECALL_POLICIES, PolicyConfig
from analysis.qevict.runner import run_document
from tests._tiny_model import tiny_llama, tiny_tokens

W = 16
PCFG = PolicyConfig(window=W, group=16, qbits=2, snap_obs_tokens=16)


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def ids():
    return tiny_tokens(400)


def _window_bytes(model):
    """Bytes of one window of one KV head of one layer at fp16 (K and V)."""
    return 2 * W * model.cfg.head_dim * 2


def _layers_heads(model):
    return model.cfg.n_layers, model.cfg.n_kv_heads


@pytest.fixture(scope="module")
def run_budgets(model, ids):
    return run_document(model, ids, 192, 40, POLICIES, [0.3, 0.6], PCFG)


@pytest.fixture(scope="module")
def run_full(model, ids):
    return run_document(model, ids, 128, 24, POLICIES, [1.0], PCFG)


def test_memory_equal_across_policies(model, run_budgets):
    r = run_budgets
    streams = r["streams"]
    (L, H), F = _layers_heads(model), _window_bytes(model)
    for frac in (0.3, 0.6):
        idx = [i for i, (p, f) in enumerate(streams) if f == frac]
        budgets = r["budget_bytes"][:, idx]
        # the same budget in bytes for every policy at every re-decision
        assert np.all(budgets == budgets[:, :1])
        hot = r["hot_bytes"][:, idx]
        assert np.all(hot <= budgets + 1e-6)
        for j, i in enumerate(idx):
            p = streams[i][0]
            if p in ("streaming", "h2o", "tova", "snapkv"):  # eviction fills up to one window per head
                assert np.all(hot[:, j] > budgets[:, j] - F * L * H - 1e-6), p
    # policies differ in what they keep, not in what they may hold
    assert len({tuple(r["kl"][:, i].round(6)) for i in range(1, len(streams))}) > 5


def test_budget_100_reproduces_full_cache(run_full):
    """All policies in one lockstep batch: every window stays exact and at full precision, and the
    logits agree up to float32 rounding (BLAS may sum a row differently depending on its position
    in the batch; fp16 rounding of K/V amplifies it to ~1e-3 in per-token NLL)."""
    r = run_full
    for i, (p, f) in enumerate(r["streams"]):
        assert r["promotions"][i] == 0 and r["fits"][i]
        np.testing.assert_allclose(r["nll"][:, i], r["nll"][:, 0], rtol=0, atol=1e-2, err_msg=p)
        assert np.all(r["kl"][:, i] < 1e-4), p
        assert r["top1"][:, i].mean() > 0.9


@pytest.fixture(scope="module")
def alone_full(model, ids):
    return run_document(model, ids, 64, 16, ["full"], [1.0], PCFG)


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "full"])
def test_budget_100_exact_alone(model, ids, alone_full, policy):
    """Each policy alone at 100% reproduces the full cache's logits bit for bit."""
    r = run_document(model, ids, 64, 16, [policy], [1.0], PCFG, include_full=False)
    assert r["streams"] == [(policy, 1.0)] and alone_full["streams"] == [("full", 1.0)]
    np.testing.assert_array_equal(r["nll"][:, 0], alone_full["nll"][:, 0])
    assert np.all(r["fmm"] == 0)


def test_fmm_zero_without_eviction(run_full, run_budgets):
    assert np.all(run_full["fmm"] == 0)
    assert np.all(run_full["fmm_evicted"] == 0)
    assert np.all(run_budgets["fmm"][:, 0] == 0)  # the full-cache stream
    # at a small budget the eviction policies miss attention mass
    i = run_budgets["streams"].index(("streaming", 0.3))
    assert run_budgets["fmm_evicted"][:, i].mean() > 0.01


def test_quantize_only_policy_never_evicts_when_it_fits(run_budgets):
    r = run_budgets
    i = r["streams"].index(("kivi4", 0.6))
    assert r["fits"][i]
    assert np.all(r["fmm_evicted"][:, i] == 0)
    assert r["fmm"][:, i].mean() > 0  # but it misses full-precision mass


def test_recall_counts_bytes(model, run_budgets):
    r = run_budgets
    F = _window_bytes(model)
    for i, (p, f) in enumerate(r["streams"]):
        if p in ("qevict_recall", "h2o_recall", "snapkv_recall"):
            assert r["recall_bytes"][i] == r["promotions"][i] * F
        if p in RECALL_POLICIES:
            assert r["recall_bytes"][i] == r["recall_transfers"][i] * F
            assert r["offdevice_bytes"][:, i].max() > 0, (p, f)
        else:
            assert r["recall_bytes"][i] == 0 and r["offdevice_bytes"][:, i].max() == 0
        # per-step traffic adds up to the total
        assert r["step_recall_bytes"][:, i].sum() == r["recall_bytes"][i]
        assert r["step_recall_transfers"][:, i].sum() == r["recall_transfers"][i]
    for p in RECALL_POLICIES:  # every recalling policy recalls at some budget
        assert sum(r["recall_bytes"][i] for i, (q, f) in enumerate(r["streams"]) if q == p) > 0, p


def test_device_bytes_within_budget_every_step(model, run_budgets):
    """On-device bytes (tiers, open window, Quest's loaded pages, digests) never exceed the budget
    at any decoding step, and the offloading policies use at least the budget minus one window."""
    r = run_budgets
    (L, H), F = _layers_heads(model), _window_bytes(model)
    D = r["kl"].shape[0]
    nc = (192 + np.arange(D)) // W
    for i, (p, f) in enumerate(r["streams"]):
        if p == "full":
            continue
        budget = f * (nc + 1) * F * L * H
        assert np.all(r["device_bytes"][:, i] <= budget + 1e-6), p
        if p in ("quest", "h2o_recall", "snapkv_recall"):
            assert np.all(r["device_bytes"][:, i] > budget - 2 * F * L * H), p


def _cache(model, ids, P=64, B=1, bits=2):
    pre = model.prefill(ids[:P], logits="none")
    return pre, MultiStreamCache(model.cfg, B, pre["k"], pre["v"], P + 16, W, bits=bits, group=16)


def test_promoted_window_is_full_precision_next_step(model, ids):
    P, w = 64, 2
    _, ref = _cache(model, ids, P)  # never touched
    _, quant = _cache(model, ids, P)  # window w quantized
    _, recall = _cache(model, ids, P)  # quantized, then promoted by recall
    _, deq = _cache(model, ids, P)  # quantized, then promoted by dequantizing in place
    for c in (quant, recall, deq):
        t = c.tier[0].copy()
        t[:, :, w] = QUANT
        c.set_tiers(0, t, promote="recall" if c is recall else "dequant")
    K, _ = recall.read_window(0, 2, 0, w)
    Ke, Ve = recall.exact_window(0, 2, 0, w)
    assert not np.array_equal(K, Ke)
    for c, mode in ((recall, "recall"), (deq, "dequant")):
        t = c.tier[0].copy()
        t[:, :, w] = FULL
        c.set_tiers(0, t, promote=mode)
    K, V = recall.read_window(0, 2, 0, w)
    np.testing.assert_array_equal(K, Ke)
    np.testing.assert_array_equal(V, Ve)
    L, H = _layers_heads(model)
    assert recall.recall_bytes[0] == L * H * _window_bytes(model)
    assert recall.offload_bytes[0] == L * H * _window_bytes(model)
    tok = int(ids[P])
    lg_ref, lg_q, lg_r, lg_d = (model.decode_step(tok, P, c)[0] for c in (ref, quant, recall, deq))
    assert not np.allclose(lg_q, lg_ref, atol=1e-3)  # the quantized window changes the output
    np.testing.assert_array_equal(lg_r, lg_ref)  # the promoted window is read at full precision
    # dequantizing in place keeps the quantization error: full precision in storage only
    np.testing.assert_array_equal(lg_d, lg_q)
    assert deq.tier[0][0, 0, w] == FULL and deq.recall_bytes[0] == 0


def test_policy_promotes_quantized_window(model, ids):
    """QEvict promotes during decoding and MiKV never does (same scores and allocation)."""
    r = run_document(model, ids, 192, 48, ["mikv", "qevict_recall"], [0.5], PCFG)
    i_m = r["streams"].index(("mikv", 0.5))
    i_q = r["streams"].index(("qevict_recall", 0.5))
    assert r["promotions"][i_m] == 0
    assert r["promotions"][i_q] > 0


def test_evicted_window_cannot_return(model, ids):
    pre, cache = _cache(model, ids)
    t = cache.tier[0].copy()
    t[:, :, 1] = EVICTED
    cache.set_tiers(0, t)
    t2 = t.copy()
    t2[:, :, 1] = FULL
    with pytest.raises(ValueError):
        cache.set_tiers(0, t2)
    t3 = cache.tier[0].copy()
    t3[:, :, 2] = QUANT
    cache.set_tiers(0, t3)
    t3[:, :, 2] = FULL
    with pytest.raises(ValueError):
        cache.set_tiers(0, t3, promote="none")


def test_bad_budget(model, ids):
    with pytest.raises(ValueError):
        run_document(model, ids, 64, 8, ["streaming"], [0.05], PCFG)
    with pytest.raises(ValueError):
        run_document(model, ids, 60, 8, ["streaming"], [0.5], PCFG)
    with pytest.raises(ValueError):
        run_document(model, ids[:50], 32, 30, ["streaming"], [0.5], PCFG)
