"""The shared-tensor decode engine: equal to an independent per-stream implementation, lockstep equal
to single-stream runs, bounded blocks, bad input rejected before any work."""
from dataclasses import dataclass

import numpy as np
import pytest

from analysis.qevict.kvcache import EVICTED, FULL, OFFLOADED, QUANT, MultiStreamCache


@dataclass(frozen=True)
class Cfg:
    n_layers: int = 2
    n_heads: int = 6
    n_kv_heads: int = 2
    head_dim: int = 32
    context_length: int = 4096

    @property
    def group(self):
        return self.n_heads // self.n_kv_heads


def _step_inputs(cfg, n_streams, pos):
    """Seeded key, value and query rows of one decoding step for ``n_streams`` streams."""
    r = np.random.default_rng(pos)
    k = r.standard_normal((n_streams, cfg.n_kv_heads, cfg.head_dim)).astype(np.float32)
    v = r.standard_normal(k.shape).astype(np.float32)
    q = r.standard_normal((n_streams, cfg.n_heads, cfg.head_dim)).astype(np.float32) / 4
    return k, v, q


def _caches(bits, P=128, W=16, D=40, block=32, seed=0, engine="sparse"):
    cfg = Cfg()
    rng = np.random.default_rng(seed)
    shape = (cfg.n_kv_heads, P, cfg.head_dim)
    pk = [rng.standard_normal(shape).astype(np.float32) for _ in range(cfg.n_layers)]
    pv = [rng.standard_normal(shape).astype(np.float32) for _ in range(cfg.n_layers)]
    mk = dict(bits=bits, group=16)
    return cfg, [MultiStreamCache(cfg, len(bits), pk, pv, P + D, W, block=block, engine=engine, **mk),
                 MultiStreamCache(cfg, len(bits), pk, pv, P + D, W, engine="reference", **mk)]


def _retier(c, rng_seed, nc, bits):
    r = np.random.default_rng(rng_seed)
    for b in range(c.B):
        t = c.tier[b].copy()
        cand = t[..., 1:nc]
        u = r.random(cand.shape)
        new = cand.copy()
        if bits[b]:
            new = np.where((cand == FULL) & (u < 0.4), QUANT, new)
            new = np.where((cand == QUANT) & (u > 0.8), FULL, new)  # promotions
        new = np.where((cand != EVICTED) & (u > 0.9) & (b % 2 == 1), EVICTED, new)
        t[..., 1:nc] = new
        c.set_tiers(b, t, promote="recall" if b % 3 else "dequant")


@pytest.mark.parametrize("engine", ["fused", "sparse"])
@pytest.mark.parametrize("bits", [[0, 2, 4, 2, 0, 4], [0], [2, 2]])
def test_engine_equals_reference(bits, engine):
    """Exact and dequantized prompt keys, quantized and evicted decoded windows, promotions by
    recall and by dequantization, several key blocks: same outputs and window attention (both
    shared-tensor engines)."""
    cfg, (eng, ref) = _caches(bits, engine=engine)
    P, W = eng.P, eng.W
    for pos in range(P, P + 40):
        if pos % W == 0:
            for c in (eng, ref):
                _retier(c, pos, pos // W, bits)
        k, v, q = _step_inputs(cfg, len(bits), pos)
        for li in range(cfg.n_layers):
            outs = []
            for c in (eng, ref):
                c.append(li, k, v, pos)
                outs.append((c.attend(li, q, pos), c.win_attn[li].copy()))
            np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-4, atol=2e-5)
            np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(outs[0][1].sum(-1), 1, rtol=1e-5)
    assert np.array_equal(eng.tier, ref.tier) and np.any(eng.tier == QUANT) == any(bits)


def test_fused_engine_beyond_the_decoded_kernels_stream_limit_equals_reference():
    """More streams than the int8 stream codes of the decoded-window pass can name
    (``DECODED_KERNEL_MAX_STREAMS``): the fused engine reads the decoded tokens in numpy instead and
    still equals the per-stream reference, complete decoded windows included."""
    from analysis.qevict.kvcache import DECODED_KERNEL_MAX_STREAMS

    bits = [(0, 2, 4)[i % 3] for i in range(DECODED_KERNEL_MAX_STREAMS + 3)]
    cfg, (fus, ref) = _caches(bits, P=64, D=24, engine="fused")
    P, W = fus.P, fus.W
    for pos in range(P, P + 20):
        if pos % W == 0:
            for c in (fus, ref):
                _retier(c, pos, pos // W, bits)
        k, v, q = _step_inputs(cfg, len(bits), pos)
        for li in range(cfg.n_layers):
            outs = []
            for c in (fus, ref):
                c.append(li, k, v, pos)
                outs.append((c.attend(li, q, pos), c.win_attn[li].copy()))
            np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-4, atol=2e-5)
            np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-4, atol=1e-6)


def test_engine_uses_the_mask():
    """An evicted window gets no attention; removing the mask term would give it some."""
    cfg, (eng, _) = _caches([0, 0])
    t = eng.tier[1].copy()
    t[:, :, 3] = EVICTED
    eng.set_tiers(1, t)
    q = np.ones((2, cfg.n_heads, cfg.head_dim), np.float32)
    kv = np.zeros((2, cfg.n_kv_heads, cfg.head_dim), np.float32)
    eng.append(0, kv, kv, eng.P)
    eng.attend(0, q, eng.P)
    assert np.all(eng.win_attn[0, 1, :, 3] == 0) and np.all(eng.win_attn[0, 0, :, 3] > 0)


def test_streams_are_independent_of_their_order():
    """Streams are sorted by bit width inside the cache; the caller's order does not matter."""
    bits = [2, 0, 4, 0]
    cfg, (a, _) = _caches(bits)
    perm = [3, 0, 2, 1]
    _, (b, _) = _caches([bits[i] for i in perm])
    for c, order in ((a, range(4)), (b, perm)):
        for j, i in enumerate(order):
            t = c.tier[j].copy()
            t[:, :, 2:4] = QUANT if bits[i] else EVICTED
            c.set_tiers(j, t)
    r = np.random.default_rng(5)
    q = r.standard_normal((4, cfg.n_heads, cfg.head_dim)).astype(np.float32)
    kv = r.standard_normal((4, cfg.n_kv_heads, cfg.head_dim)).astype(np.float32)
    a.append(0, kv, kv, a.P)
    b.append(0, kv[perm], kv[perm], b.P)
    oa, ob = a.attend(0, q, a.P), b.attend(0, q[perm], b.P)
    np.testing.assert_allclose(oa[perm], ob, rtol=1e-5, atol=1e-6)


def test_context_above_model_maximum_rejected_before_any_work():
    from analysis.qevict.policies import PolicyConfig
    from analysis.qevict.runner import run_document

    class NoWork:
        cfg = Cfg()
        gguf_file = None

        def prefill(self, *a, **k):
            raise AssertionError("prefill ran")

    with pytest.raises(ValueError, match="exceeds the model context 4096"):
        run_document(NoWork(), np.zeros(5000, int), 4032, 100, ["streaming"], [0.5],
                     PolicyConfig(head_dim=32))


def test_block_size_bounds_memory():
    cfg, (eng, _) = _caches([0] * 4, P=256, block=None)
    assert eng.block % eng.W == 0 and eng.block >= eng.W
    z = [np.zeros((2, 256, 32), np.float32)] * 2
    big = MultiStreamCache(cfg, 400, z, z, 300, 16, bits=0, group=16)
    assert big.block * 4 * 2 * 400 * 3 <= 2 * (1 << 21) + 16 * 4 * 2 * 400 * 3


def _free_running_matches_teacher_forced(model, tokens, P, D, answers):
    """Free-running generation inside the answers: each stream reads back its own predictions.
    On the first answer, exact match equals the teacher-forced one (identical until the first wrong
    token); later answers may differ, since a wrong generated answer stays in the context."""
    from analysis.qevict.metrics import needle_accuracy
    from analysis.qevict.policies import PolicyConfig
    from analysis.qevict.runner import run_document

    pc = PolicyConfig(window=16, group=16, snap_obs_tokens=16)
    args = (model, tokens, P, D, ["streaming", "kivi2"], [0.3], pc)
    tf = run_document(*args)
    fr = run_document(*args, free_run_spans=answers)
    first = answers[:1]
    np.testing.assert_array_equal(needle_accuracy(tf, first), needle_accuracy(fr, first))
    a, b = answers[0]
    steps = np.arange(a, b) - P - 1
    for i in range(len(fr["streams"])):
        gen, ref = fr["argmax"][steps, i], tokens[a:b]
        first_wrong = np.nonzero(gen != ref)[0]
        k = first_wrong[0] + 1 if len(first_wrong) else len(gen)
        np.testing.assert_array_equal(gen[:k], tf["argmax"][steps, i][:k])  # same until the first error
    with pytest.raises(ValueError, match="after the prefill"):
        run_document(*args, free_run_spans=[(P - 4, P + 2)])
    return tf, fr


def test_free_running_answers_match_teacher_forced_exact_match():
    """On a tiny random-weight model, with answers that are the model's own greedy continuations (so
    that the full cache answers them and the compressed streams answer some and miss others)."""
    from tests._tiny_model import tiny_llama, tiny_tokens

    model = tiny_llama()
    P, D = 128, 40
    tokens = tiny_tokens(P + D + 1, seed=2)
    answers = [(P + 6, P + 14), (P + 22, P + 30)]
    for a, b in answers:
        for j in range(a, b):
            tokens[j] = int(model.prefill(tokens[:j], logits="last")["logits"].argmax())
    tf, fr = _free_running_matches_teacher_forced(model, tokens, P, D, answers)
    from analysis.qevict.metrics import needle_accuracy

    acc = needle_accuracy(tf, answers[:1])
    assert acc[0] == 1 and acc.min() < 1  # the full cache answers; a compressed stream does not


@pytest.mark.real_weights
def test_free_running_answers_match_teacher_forced_exact_match_real_weights():
    """The same on SmolLM2 and a needle document (its answers are digits the real model retrieves)."""
    pytest.importorskip("gguf")
    from analysis.qevict import corpora
    from analysis.qevict.gguf_model import gguf_path, load_model
    from analysis.qevict.tokenizer import load_tokenizer

    try:
        gguf_path()
    except FileNotFoundError as e:  # pragma: no cover
        pytest.skip(str(e))
    model, tok = load_model(), load_tokenizer()
    P, D = 192, 40  # one question: its answer ends 39 tokens after the prompt (two spans: the tiny test)
    doc = corpora.load_document("needle:textwrap", tok, P + D + 1, prefill_tokens=P, n_needles=2, n_queries=1)
    tf, fr = _free_running_matches_teacher_forced(model, doc.tokens, P, D, doc.answers)
    from analysis.qevict.metrics import needle_accuracy

    assert needle_accuracy(tf, doc.answers)[0] == 1  # the full cache retrieves the needle


def _retier_offload(c, rng_seed, nc):
    """Issue 14's tier on top of issue 13's engine: offload and recall exact windows (no quantized
    window goes off the device), evict a few."""
    r = np.random.default_rng(rng_seed)
    for b in range(c.B):
        t = c.tier[b].copy()
        cand = t[..., 1:nc]
        u = r.random(cand.shape)
        new = np.where((cand == FULL) & (u < 0.5), OFFLOADED, cand)
        new = np.where((cand == OFFLOADED) & (u > 0.7), FULL, new)  # recalls
        new = np.where((cand != EVICTED) & (u > 0.95), EVICTED, new)
        if c.bits[b]:
            new = np.where((new == FULL) & (u > 0.3) & (u < 0.4), QUANT, new)
        t[..., 1:nc] = new
        c.set_tiers(b, t)


@pytest.mark.parametrize("engine", ["fused", "sparse"])
def test_engine_equals_reference_with_offloaded_windows_and_page_loads(engine):
    """OFFLOADED windows are masked unless recalled (set back to FULL) or loaded for one step by
    Quest's page selection (``step_pages``); streams with digests get window estimates.  Each
    shared-tensor engine, with streams reordered by bit width, reads exactly what the per-stream
    reference reads, and both count the same page loads."""
    bits = [4, 0, 2, 0, 4]
    cfg, (eng, ref) = _caches(bits, engine=engine)
    P, W = eng.P, eng.W
    for c in (eng, ref):
        c.step_pages[:] = [-1, 2, 1, -1, 3]
        c.digest_rows[:] = [False, False, True, True, True]
    loaded_any = False
    for pos in range(P, P + 40):
        if pos % W == 0:
            for c in (eng, ref):
                _retier_offload(c, pos, pos // W)
        k, v, q = _step_inputs(cfg, len(bits), pos)
        for li in range(cfg.n_layers):
            outs = []
            for c in (eng, ref):
                c.append(li, k, v, pos)
                outs.append((c.attend(li, q, pos), c.win_attn[li].copy(), c.win_est[li].copy()))
            np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-4, atol=2e-5)
            np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(outs[0][2], outs[1][2], rtol=1e-5, atol=1e-7)
            # an offloaded window that is not loaded this step gets no attention; a loaded one does
            off = eng.tier[:, li] == OFFLOADED
            assert np.all(outs[0][1][off & ~eng.loaded[:, li]] == 0)
            if np.any(off & eng.loaded[:, li]):
                loaded_any = True
                assert np.all(outs[0][1][off & eng.loaded[:, li]] > 0)
    assert loaded_any and np.any(eng.tier == OFFLOADED)
    assert np.array_equal(eng.recall_transfers, ref.recall_transfers)
    assert np.array_equal(eng.recall_bytes, ref.recall_bytes) and eng.recall_transfers[[0, 3]].sum() > 0
    assert not np.any(eng.loaded[[0, 3]])  # streams without page selection load nothing per step


def test_sparse_engines_skip_blocks_and_equal_reference():
    """The sparse and fused engines give a stream no product for a key block it reads at neither precision
    (whole blocks evicted, or all quantized / all exact), and still equal the reference engine;
    the skipped rows are really skipped (a NaN planted in keys only skipped rows would read
    stays out of every output)."""
    bits = [0, 2, 0, 4]
    outs = []
    for engine in ("sparse", "fused", "reference"):
        cfg, (c, _) = _caches(bits, engine=engine)
        nw = c.P // c.W
        for b in range(4):
            t = c.tier[b].copy()
            if b in (0, 2):
                t[:, :, 2:4] = EVICTED  # the whole second block (32 keys = 2 windows)
            else:
                t[:, :, 0:nw] = QUANT  # every prompt window quantized: no exact product at all
            c.set_tiers(b, t)
        r = np.random.default_rng(3)
        q = r.standard_normal((4, cfg.n_heads, cfg.head_dim)).astype(np.float32) / 4
        kv = r.standard_normal((4, cfg.n_kv_heads, cfg.head_dim)).astype(np.float32)
        if engine in ("sparse", "fused"):
            # streams 0 and 2 evicted block 1 and streams 1 and 3 read only dequantized keys: no
            # stream reads the exact keys of block 1, so a NaN there must not reach any output
            c.Kp[0, :, 32:48] = np.nan
        c.append(0, kv, kv, c.P)
        outs.append((c.attend(0, q, c.P), c.win_attn[0].copy()))
    assert np.all(np.isfinite(outs[0][0])) and np.all(np.isfinite(outs[1][0]))
    for o in outs[1:]:
        np.testing.assert_allclose(outs[0][0], o[0], rtol=1e-4, atol=2e-5)
        np.testing.assert_allclose(outs[0][1], o[1], rtol=1e-4, atol=1e-6)
    assert np.all(outs[0][1][[0, 2], :, 2:4] == 0) and np.all(outs[0][1][[1, 3], :, 2:4] > 0)


def test_kernel_exp_matches_numpy_and_underflows_to_zero():
    """The fused kernel's float32 exp (Cephes polynomial) is within 2e-7 relative of exp on
    [-86.9, 0] (numpy's float32 exp: 1.7e-7) and exactly 0 at and below -87 and at -inf (masked or
    unread entries add nothing)."""
    from analysis.qevict.kernels import exp_array

    x = np.concatenate([-np.geomspace(1e-8, 86.9, 20001), [0.0, -87.5, -200.0, -np.inf]]).astype(np.float32)
    got = exp_array(x)
    ref = np.exp(x[:-3].astype(np.float64))
    assert np.max(np.abs(got[:-3] - ref) / ref) < 2e-7
    assert got[-4] == 1.0 and np.all(got[-3:] == 0.0)


def test_fused_engine_does_not_depend_on_thread_count_or_chunk():
    """Each task owns its streams' softmax state: one thread or two, chunks of 1 or 8 streams, the
    same bits."""
    import numba

    from analysis.qevict import kernels

    bits = [0, 2, 4, 2, 0, 4, 2]
    cfg, (c, _) = _caches(bits, engine="fused")
    _retier(c, 1, c.P // c.W, bits)
    KT, VV, rp = c._fused_tensors()
    r = np.random.default_rng(5)
    Q = r.standard_normal((cfg.n_kv_heads, len(bits), cfg.group, cfg.head_dim)).astype(np.float32) / 4
    code = np.where(c._lz_w[0, :, :, :c.NWp], rp[None, :, None], np.int8(0))
    code[np.isneginf(c.bias[0][:, :, 0:c.P:c.W])] = -1
    assert (code == -1).any() and (code == 0).any() and (code > 0).any()
    outs = []
    before = numba.get_num_threads()
    try:
        for threads, chunk in ((1, 1), (min(2, numba.config.NUMBA_NUM_THREADS), 8), (1, 3)):
            numba.set_num_threads(threads)
            o = [np.empty((cfg.n_kv_heads, len(bits), cfg.group), np.float32) for _ in range(2)]
            o.append(np.empty((cfg.n_kv_heads, len(bits), cfg.group, cfg.head_dim), np.float32))
            o += [np.empty((cfg.n_kv_heads, len(bits), cfg.group, c.NWp), np.float32) for _ in range(2)]
            kernels.prompt_attention(Q, KT[0], VV[0], code, *o, chunk=chunk)
            outs.append(o)
    finally:
        numba.set_num_threads(before)
    for o in outs[1:]:
        for a, b in zip(outs[0], o):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("g,hd,W", [(3, 64, 32), (4, 256, 32), (1, 24, 5), (2, 8, 16)])
def test_specialised_kernel_equals_generic_loops_bit_for_bit(g, hd, W):
    """The shape-specialised kernel (scores and output tiles in registers) performs the generic loops'
    operations in the same order: identical bits, for SmolLM2's and Gemma's decoding shapes and for odd
    ones (a head dimension that is not a multiple of 64, a window that is not a multiple of 8), with
    rows that read no window, any chunking and the default (thread-balanced) chunk."""
    from analysis.qevict import kernels

    r = np.random.default_rng(g * 1000 + hd + W)
    Hkv, B, nprec, NWp = 2, 7, 3, 6
    Q = (r.standard_normal((Hkv, B, g, hd)) / 3).astype(np.float32)
    KT = r.standard_normal((nprec, Hkv, NWp, hd, W)).astype(np.float32)
    VV = r.standard_normal((nprec, Hkv, NWp, W, hd)).astype(np.float32)
    code = r.integers(-1, nprec, (Hkv, B, NWp)).astype(np.int8)
    code[1, 3] = -1  # a stream that reads nothing on head 1

    def run(**kw):
        o = [np.empty((Hkv, B, g), np.float32) for _ in range(2)] + [np.empty((Hkv, B, g, hd), np.float32)]
        o += [np.empty((Hkv, B, g, NWp), np.float32) for _ in range(2)]
        kernels.prompt_attention(Q, KT, VV, code, *o, **kw)
        return o

    ref = run(specialised=False, chunk=3)
    assert np.isneginf(ref[0][1, 3]).all() and (ref[1][1, 3] == 0).all()
    assert np.all(np.isfinite(ref[2][0]))
    for kw in (dict(), dict(chunk=1), dict(chunk=4), dict(chunk=B)):
        for a, b in zip(ref, run(**kw)):
            np.testing.assert_array_equal(a, b)


def test_stream_chunk_balances_tasks_over_threads():
    from analysis.qevict.kernels import stream_chunk

    assert stream_chunk(3, 37, 2) == 19  # 2 chunks per head, 6 tasks
    assert stream_chunk(1, 49, 2) == 25  # Gemma's one KV head: 2 tasks
    assert stream_chunk(3, 37, 1) == 37 and stream_chunk(2, 5, 2) == 5
    assert stream_chunk(3, 4, 16) == 1  # never an empty chunk size


def test_kernel_rejects_mismatched_inputs():
    from analysis.qevict import kernels

    Q = np.zeros((1, 2, 1, 4), np.float32)
    KT = np.zeros((1, 1, 3, 4, 8), np.float32)
    VV = np.zeros((1, 1, 3, 8, 4), np.float32)
    out = [np.empty((1, 2, 1), np.float32)] * 2 + [np.empty((1, 2, 1, 4), np.float32)] + \
        [np.empty((1, 2, 1, 3), np.float32)] * 2
    with pytest.raises(ValueError, match="precision index"):
        kernels.prompt_attention(Q, KT, VV, np.ones((1, 2, 3), np.int8), *out)
    with pytest.raises(ValueError, match="shapes do not match"):
        kernels.prompt_attention(Q, KT, VV[:, :, :2], np.zeros((1, 2, 3), np.int8), *out)
