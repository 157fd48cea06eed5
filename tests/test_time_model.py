"""The one time model (analysis.forward): backend registry, the roofline backend against the closed
forms where they must agree, the one layer-wise overlap rule, and the micro-batch count of
``overlap_time``."""
from __future__ import annotations

import types

import numpy as np
import pytest

from analysis import forward as fw
from analysis import kv, roofline, specs
from analysis.compose import pipeline
from analysis.compose.pipeline import ReuseCurve, Scenario
from analysis.tiering import replay as R
from analysis.tiering import tiers as T

GPU = "H100-SXM5-80GB"
UNIT = fw.Efficiency(compute=1.0, bandwidth=1.0, link=1.0, step_overhead_s=0.0, layer_overhead_s=0.0,
                     collective_latency_s=0.0)


def _pass(dev, **kw):
    s = fw.shape("Llama-3.1-8B")
    return fw.colocated_pass_time(s, fw.Precision(), fw.Efficiency(), dev, tp=2.0, dp=1.0, pre_seqs=2.0,
                                  pre_len=2048.0, dec_seqs=16.0, dec_ctx=4096.0, **kw)


# ------------------------------------------------------------------------------ backend registry


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown time-model backend 'tables'.*roofline"):
        fw.get_backend("tables")
    dev = {**fw.instance_device(GPU), "backend": "tables"}
    with pytest.raises(ValueError, match="unknown time-model backend 'tables'"):
        _pass(dev)
    with pytest.raises(ValueError, match="already registered"):
        fw.register_backend("roofline", fw.roofline_backend)
    with pytest.raises(ValueError, match="cannot be removed"):
        fw.unregister_backend("roofline")


@pytest.fixture
def gemm_tables():
    """A stand-in for a measured backend: GEMMs 'measured' at twice the roofline time, every other
    operator left to the roofline."""

    def backend(op, eff):
        sec, _ = fw.roofline_backend(op, eff)
        return (2.0 * sec, 1.0) if op.kind == "gemm" else (sec, 0.0)

    fw.register_backend("test-gemm-tables", backend)
    yield "test-gemm-tables"
    fw.unregister_backend("test-gemm-tables")


def test_a_registered_backend_prices_the_forward_pass(gemm_tables):
    dev = fw.instance_device(GPU)
    with fw.ledger() as roof:
        base = _pass(dev)
    with fw.ledger() as meas:
        t = _pass({**dev, "backend": gemm_tables})
    assert float(np.max(roof.measured_share)) == 0.0  # the roofline measures nothing
    assert {"gemm", "attention", "allreduce"} <= set(roof.by_kind)
    # operators add up (one micro-batch): doubling every GEMM adds the GEMM seconds once more
    assert t - base == pytest.approx(roof.by_kind["gemm"], rel=1e-9)
    assert meas.measured_share == pytest.approx(meas.by_kind["gemm"] / meas.total_s, rel=1e-12)
    assert 0 < meas.measured_share < 1
    # the search's plans go through the same backend: vectorised over candidate plans
    s = fw.shape("Llama-3.1-8B")
    tp = np.array([1.0, 2.0, 4.0])
    a = fw.colocated_pass_time(s, fw.Precision(), fw.Efficiency(), dev, tp=tp, dec_seqs=64.0, dec_ctx=4096.0)
    b = fw.colocated_pass_time(s, fw.Precision(), fw.Efficiency(), {**dev, "backend": gemm_tables}, tp=tp,
                               dec_seqs=64.0, dec_ctx=4096.0)
    assert a.shape == (3,) and np.all(b > a)


def test_roofline_backend_prices_a_gemm_as_the_roofline_primitive():
    g = specs.gpu(GPU)
    eff = fw.Efficiency(compute=0.6, bandwidth=0.8)
    for m in (1, 64, 8192):
        f, b = roofline.gemm(m, 8192, 8192)
        op = fw.Op("gemm", {"m": m, "n": 8192, "k": 8192}, f, b, g.flops("bf16"), g["hbm_bandwidth"])
        want = roofline.op_time(f, b, g.flops("bf16"), g["hbm_bandwidth"], compute_eff=0.6, bw_eff=0.8)
        assert fw.price(op, eff) == pytest.approx(want, rel=1e-12)
        assert fw.price(op, eff, count=3) == pytest.approx(3 * want, rel=1e-12)


def test_time_model_equals_the_closed_form_where_they_agree():
    """One GPU (no communication), unit efficiencies and no overheads, a long prompt of a dense
    model: every per-layer operator is compute-bound, so the per-layer model gives the whole-model
    FLOPs over the peak; the only difference is the LM head, which a prefill runs for the one token
    that produces logits (bandwidth-bound), where the FLOP count charges it for every token."""
    m, n = "Llama-3.1-8B", 16384
    g, ms = specs.gpu(GPU), specs.model(m)
    t = float(fw.prefill_time(m, GPU, n, 0, tp=1, eff=UNIT))
    lm = ms.vocab_size * ms.hidden_size
    want = ((float(kv.prefill_flops(m, n)) - 2.0 * lm * n) / g.flops("bf16")
            + (lm * 2.0 + n * ms.hidden_size * 2.0) / g["hbm_bandwidth"])
    assert t == pytest.approx(want, rel=1e-12)


def test_decode_step_is_a_one_token_pass_per_sequence():
    d = T.Deployment(model="Llama-3.1-70B", gpu="H800-SXM5-80GB", tp=8, compute_eff=0.5)
    from analysis.tiering import prefill as pf

    step = pf.decode_step_time(d, 8192.0)
    s = fw.shape("Llama-3.1-70B")
    want = fw.colocated_pass_time(s, fw.Precision(), fw.Efficiency().replace(compute=0.5),
                                  fw.instance_device("H800-SXM5-80GB"), tp=8.0, dec_seqs=1.0, dec_ctx=8192.0)
    assert float(step) == pytest.approx(float(want), rel=1e-12)
    # a decode step reads every weight once: at least the weights over the HBM bandwidth of 8 GPUs
    assert step > kv.weight_bytes("Llama-3.1-70B") / (8 * specs.gpu("H800-SXM5-80GB")["hbm_bandwidth"])


def test_one_weight_format_table():
    for name, (wb, compute, kvd) in fw.WEIGHT_FORMATS.items():
        p = fw.Precision.named(name)
        assert (p.weight_bytes, p.compute, p.kv_bytes) == (wb, compute, kv.DTYPE_BYTES[kvd])
    assert fw.Precision.named("fp8", kv_dtype="bf16").kv_bytes == 2.0
    with pytest.raises(ValueError, match="unknown precision"):
        fw.Precision.named("fp16")


# ------------------------------------------------------------------------------ overlap rules


def test_layerwise_overlap_rule():
    assert fw.layerwise_overlap(4.0, 1.0, 4) == pytest.approx(4.25)
    assert fw.layerwise_overlap(1.0, 4.0, 4) == pytest.approx(4.25)
    np.testing.assert_allclose(fw.layerwise_overlap(np.array([2.0, 0.0]), np.array([2.0, 3.0]), 80),
                               [2.025, 3.0])


def test_replay_and_composition_use_the_one_overlap_rule(monkeypatch):
    """Replace the rule by the plain serial sum: both chapter 2's replay and chapter 5's prefill
    ratio follow it (neither keeps its own copy)."""
    d = T.Deployment(model="Llama-3.1-70B", gpu="H100-SXM5-80GB", tp=8)
    tiers = T.build_tiers("nvme", d)
    trace = types.SimpleNamespace(input_tokens=np.array([16384, 32768]))
    hits = np.zeros((2, len(tiers)))
    hits[:, -1] = [4096.0, 8192.0]  # a short prefix from the slowest tier: loading pays
    s = Scenario(model="Llama-3.1-70B", gpu="H100-SXM5-80GB", input_tokens=16384, output_tokens=1000,
                 layout="nvme", hit_rate=0.6)
    reuse = ReuseCurve(np.linspace(1e5, 2e7, 200), np.linspace(0.005, 1.0, 200), 10000.0, "synthetic")
    tl = pipeline._tier_list("nvme", pipeline.tier_deployment(s, 8))

    def run():
        pipeline._prefill_ratio.cache_clear()
        svc = R.service_from_hits(trace, hits, np.zeros(len(tiers)), tiers, d)
        return svc, pipeline.prefill_ratio(s, tl, 8, reuse)[0]

    svc, ratio = run()
    np.testing.assert_allclose(svc.service_s, np.minimum(
        fw.layerwise_overlap(svc.compute_s, svc.load_s, 80), svc.nocache_s), rtol=1e-12)
    monkeypatch.setattr(fw, "layerwise_overlap", lambda c, l, layers: c + l)
    svc2, ratio2 = run()
    pipeline._prefill_ratio.cache_clear()
    np.testing.assert_allclose(svc2.service_s, np.minimum(svc.compute_s + svc.load_s, svc.nocache_s),
                               rtol=1e-12)
    assert np.all(svc2.service_s > svc.service_s)
    assert ratio2 > ratio


def test_composition_recomputes_when_loading_is_slower():
    """Chapter 5's prefill ratio makes the replay's load-versus-recompute decision: a prefix on a tier
    so slow that loading takes longer than recomputing the prompt is not used (ratio 1, no hit);
    without the decision the ratio would exceed 1."""
    s = Scenario(model="Llama-3.1-70B", gpu="H100-SXM5-80GB", input_tokens=16384, output_tokens=1000,
                 layout="nvme", hit_rate=0.6)
    reuse = ReuseCurve(np.linspace(1e5, 2e7, 200), np.linspace(0.005, 1.0, 200), 10000.0, "synthetic")
    fast = pipeline._tier_list("nvme", pipeline.tier_deployment(s, 8))
    sig = [(t.capacity_tokens, t.bandwidth, t.bytes_per_token, t.latency_s) for t in fast]
    pipeline._prefill_ratio.cache_clear()
    r_fast, h_fast = pipeline._prefill_ratio(s.model, s.gpu, 1.0, 1.0, (8, 1, 1.0, 1.0), 16384.0, 0.6,
                                             tuple(sig), reuse)
    assert r_fast < 1 and h_fast > 0  # loading pays on these tiers
    slow = tuple((c, bw / 1e4, bpt, lat) for c, bw, bpt, lat in sig)  # every tier 10,000x slower
    r_slow, h_slow = pipeline._prefill_ratio(s.model, s.gpu, 1.0, 1.0, (8, 1, 1.0, 1.0), 16384.0, 0.6,
                                             slow, reuse)
    assert (r_slow, h_slow) == (1.0, 0.0)
    pipeline._prefill_ratio.cache_clear()


def test_overlap_time_counts_the_micro_batches():
    """``m`` micro-batches on two resources take ``m`` times the busier resource's share once that
    exceeds one micro-batch's serial sum (dropping ``m`` would give ``c + k``)."""
    assert fw.overlap_time(1.0, 0.5, 3) == pytest.approx(3.0)
    assert fw.overlap_time(1.0, 1.0, 2) == pytest.approx(2.0)
    assert fw.overlap_time(1.0, 0.5, 1) == pytest.approx(1.5)
    # through a pass: four prompts in four micro-batches on one GPU (no communication) take four
    # one-prompt passes' compute, plus the fixed overheads once
    s, prec, eff, dev = fw.shape("Llama-3.1-8B"), fw.Precision(), fw.Efficiency(), fw.instance_device(GPU)
    fixed = eff.step_overhead_s + s.n_layers * eff.layer_overhead_s
    one = float(fw.colocated_pass_time(s, prec, eff, dev, tp=1.0, pre_seqs=1.0, pre_len=4096.0)) - fixed
    four = float(fw.colocated_pass_time(s, prec, eff, dev, tp=1.0, pre_seqs=4.0, pre_len=4096.0,
                                        microbatches=4)) - fixed
    assert four == pytest.approx(4 * one, rel=1e-12)


def test_an_enclosing_ledger_sees_what_an_inner_one_recorded():
    """A ledger opened inside another records the operators priced inside it; when it closes, the
    enclosing one absorbs its totals (per kind and measured), so nesting hides nothing."""
    op = fw.Op("gemm", {"m": 8.0, "n": 4096.0, "k": 4096.0}, 1e12, 1e9, 1e15, 1e12)
    with fw.ledger() as outer:
        fw.price(op, fw.Efficiency())
        with fw.ledger() as inner:
            fw.price(op, fw.Efficiency(), count=2.0)
    assert inner.total_s == pytest.approx(2 * fw.price(op, fw.Efficiency()))
    assert outer.total_s == pytest.approx(1.5 * inner.total_s)
    assert outer.by_kind["gemm"] == pytest.approx(outer.total_s) and outer.measured_s == 0.0
