"""Offloading and recall: the OFFLOADED tier, key digests, Quest's per-step page loads (on a tiny
random-weight Llama of SmolLM2's head layout, tests/_tiny_model.py: bookkeeping, not the model)."""
import numpy as np
import pytest

from analysis.qevict.kvcache import EVICTED, FULL, OFFLOADED, QUANT, MultiStreamCache
from tests._tiny_model import tiny_llama, tiny_tokens

W, P = 16, 96


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def ids():
    return tiny_tokens(200)


@pytest.fixture(scope="module")
def pre(model, ids):
    return model.prefill(ids[:P], logits="none")


def _cache(model, pre, B=1):
    return MultiStreamCache(model.cfg, B, pre["k"], pre["v"], P + 32, W, bits=2, group=16)


def _offload_all(c, b=0, keep_sink=True):
    t = c.tier[b].copy()
    t[:, :, 1 if keep_sink else 0:P // W] = OFFLOADED
    c.set_tiers(b, t, promote="recall")


def test_offload_and_recall_round_trip(model, pre, ids):
    ref, c = _cache(model, pre), _cache(model, pre)
    cfg = model.cfg
    F = 2 * W * cfg.head_dim * 2
    _offload_all(c)
    n = cfg.n_layers * cfg.n_kv_heads * (P // W - 1)
    assert c.offload_bytes[0] == n * F and c.recall_bytes[0] == 0
    assert c.offdevice_bytes(0, P // W) == n * F
    t = c.tier[0].copy()
    t[:, :, 1:P // W] = FULL
    c.set_tiers(0, t, promote="recall")
    assert c.recall_bytes[0] == n * F and c.recall_transfers[0] == n and c.n_promotions[0] == n
    assert c.offdevice_bytes(0, P // W) == 0
    tok = int(ids[P])
    np.testing.assert_array_equal(model.decode_step(tok, P, c)[0], model.decode_step(tok, P, ref)[0])
    t[:, :, 2] = OFFLOADED
    c.set_tiers(0, t, promote="recall")
    t[:, :, 2] = QUANT
    with pytest.raises(ValueError):
        c.set_tiers(0, t, promote="recall")


def test_digest_bound_is_an_upper_bound(model, pre, ids):
    c = _cache(model, pre)
    rng = np.random.default_rng(0)
    hd, layer = model.cfg.head_dim, model.cfg.n_layers - 2
    q = rng.standard_normal((1, model.cfg.n_heads, hd)).astype(np.float32)
    b = c._bound(layer, q, np.array([0]), P // W)[0]  # (Hkv, NW)
    K = c.Kp[layer]  # (Hkv, P, hd)
    g = model.cfg.n_heads // model.cfg.n_kv_heads
    logits = np.einsum("hgd,htd->hgt", q[0].reshape(-1, g, hd), K).max(1)  # (Hkv, P)
    actual = logits.reshape(K.shape[0], P // W, W).max(-1)
    assert np.all(b >= actual - 1e-4)
    # equal to the bound computed channel by channel (independent slow form)
    Kw = K.reshape(K.shape[0], P // W, W, hd)
    kmin, kmax = Kw.min(2), Kw.max(2)
    slow = np.zeros_like(b)
    for h in range(K.shape[0]):
        for w in range(P // W):
            slow[h, w] = max(sum(max(qc * lo, qc * hi) for qc, lo, hi in zip(qh, kmin[h, w], kmax[h, w]))
                             for qh in q[0].reshape(-1, g, hd)[h])
    np.testing.assert_allclose(b, slow, rtol=1e-4, atol=1e-3)


def test_quest_loading_every_page_is_the_full_cache(model, pre, ids):
    """Quest with as many pages as there are equals the full cache bit for bit; with none it equals
    evicting them; loads count only pages not already on the device."""
    ref, allp, nop, ev = (_cache(model, pre) for _ in range(4))
    for c in (allp, nop):
        _offload_all(c)
    allp.step_pages[0] = P // W
    nop.step_pages[0] = 0
    t = ev.tier[0].copy()
    t[:, :, 1:P // W] = EVICTED
    ev.set_tiers(0, t)
    for s in range(3):
        tok = int(ids[P + s])
        lr, la, ln, le = (model.decode_step(tok, P + s, c)[0] for c in (ref, allp, nop, ev))
        np.testing.assert_array_equal(la, lr)
        np.testing.assert_array_equal(ln, le)
    cfg = model.cfg
    n = cfg.n_layers * cfg.n_kv_heads * (P // W - 1)
    F = 2 * W * cfg.head_dim * 2
    assert allp.recall_transfers[0] == n  # loaded once, then resident
    assert allp.recall_bytes[0] == n * F
    assert nop.recall_bytes[0] == 0
    assert allp.loaded[0][:, :, 1:P // W].all() and not allp.loaded[0][:, :, 0].any()


def test_quest_loads_the_highest_bound_pages(model, pre, ids):
    c = _cache(model, pre)
    _offload_all(c)
    c.step_pages[0] = 2
    tok = int(ids[P])
    # bound of the query each layer sees, recomputed independently after the step
    qs = {}
    orig = c._bound

    def spy(layer, q, rows, nw):
        qs[layer] = q.copy()
        return orig(layer, q, rows, nw)

    c._bound = spy
    model.decode_step(tok, P, c)
    for layer in range(model.cfg.n_layers):
        b = orig(layer, qs[layer], np.array([0]), P // W)[0][:, 1:]
        top = np.argsort(-b, axis=-1)[:, :2] + 1
        for h in range(model.cfg.n_kv_heads):
            assert set(np.nonzero(c.loaded[0, layer, h])[0]) == set(top[h])
