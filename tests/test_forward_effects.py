"""Issue 27 item 2 in the time model: the all-to-all responds to the MoE load imbalance (the busiest
expert device's extra traffic), micro-batch overlap is a declared, imperfect parameter, and (with the
measured backend) expert GEMMs and the DeepEP all-to-all come from the kernel tables."""
import numpy as np
import pytest

from analysis import forward as fw

H800 = "H800-SXM5-80GB"


def _ep_decode(eff, m=1.0, n=144.0, dev=None):
    s = fw.shape("DeepSeek-V3")
    prec = fw.Precision.named("fp8")
    d = dev or {**fw.instance_device(H800, prec), "net": 50e9, "domain": 8.0}
    return float(fw.colocated_pass_time(s, prec, eff, d, tp=1.0, dp=n, microbatches=m,
                                        dec_seqs=n * 64.0, dec_ctx=4096.0))


def test_all_to_all_grows_with_the_load_imbalance():
    s, prec = fw.shape("DeepSeek-V3"), fw.Precision.named("fp8")
    kw = dict(tokens=144 * 64.0, tp=1.0, dp=144.0, net=50e9, domain=8.0)
    t1 = float(fw.comm_time(s, prec, fw.Efficiency(moe_imbalance=1.0), 200e9, **kw))
    t2 = float(fw.comm_time(s, prec, fw.Efficiency(moe_imbalance=2.0), 200e9, **kw))
    lat = 2 * fw.Efficiency().collective_latency_s * s.n_moe
    assert (t2 - lat) == pytest.approx(2.0 * (t1 - lat), rel=1e-9)  # wire time doubles, latency does not
    # and so does EP144 decode (issue 27: imbalance 2.0 left it unchanged)
    assert _ep_decode(fw.Efficiency(moe_imbalance=2.0)) > 1.2 * _ep_decode(fw.Efficiency(moe_imbalance=1.0))


def test_overlap_is_a_declared_imperfect_parameter():
    assert 0 < fw.Efficiency().overlap < 1  # not perfect by default (an estimate, see Efficiency)
    # the rule: serial minus the hidden share of what perfect pipelining hides
    assert fw.overlap_time(1.0, 0.5, 2, 1.0) == pytest.approx(2.0)
    assert fw.overlap_time(1.0, 0.5, 2, 0.0) == pytest.approx(3.0)
    assert fw.overlap_time(1.0, 0.5, 2, 0.8) == pytest.approx(3.0 - 0.8 * 1.0)
    assert fw.overlap_time(1.0, 0.5, 1, 0.3) == pytest.approx(1.5)  # one micro-batch: nothing to hide
    # through a pass: two micro-batches with perfect overlap < declared < none
    t = [_ep_decode(fw.Efficiency(overlap=o), m=2.0) for o in (1.0, fw.Efficiency().overlap, 0.0)]
    assert t[0] < t[1] < t[2]
    with pytest.raises(ValueError, match="overlap"):
        fw.Efficiency(overlap=1.5).check()


def test_the_attention_ffn_ring_takes_the_same_overlap():
    """One overlap rule everywhere the time model overlaps communication and compute: an
    attention/FFN split's pass with two ping-pong micro-batches (search._split_step, what the AFD
    search and the event simulation price) moves with Efficiency.overlap as colocated EP decode does."""
    from analysis.disagg import devices
    from analysis.disagg import search as S

    s, prec = fw.shape("Step-3"), fw.Precision.named("fp8")
    d = devices.device(H800, "fp8")
    kw = dict(tp=4.0, n_a=32.0, n_f=16.0, m=2.0, dec_seqs=2048.0, dec_ctx=4096.0)
    t = [float(S._split_step(s, prec, fw.Efficiency(overlap=o), d, d, **kw)) for o in (1.0, 0.8, 0.0)]
    assert t[0] < t[1] < t[2]
    # the declared share of what perfect pipelining hides: linear in overlap, 0.8 of the way
    assert t[1] == pytest.approx(t[2] - 0.8 * (t[2] - t[0]), rel=1e-12)
    one = [float(S._split_step(s, prec, fw.Efficiency(overlap=o), d, d, **{**kw, "m": 1.0}))
           for o in (1.0, 0.0)]
    assert one[0] == pytest.approx(one[1], rel=1e-12)  # one micro-batch: nothing to hide


def test_moe_op_carries_the_expert_shape_and_the_rest_adds_up():
    """The MoE operator names hidden and intermediate sizes (what the measured tables are keyed on) and
    splits off the shared experts and router (priced apart from the routed experts); the roofline sum
    is unchanged by the split."""
    s, prec, eff = fw.shape("DeepSeek-V3"), fw.Precision.named("fp8"), fw.Efficiency()
    seen = []
    fw.register_backend("spy", lambda op, e: (seen.append(op) or fw.roofline_backend(op, e)), replace=True)
    try:
        t = fw.ffn_block(s, prec, eff, 1e15, 3e12, tokens=np.array([8.0, 4096.0]), n=16.0, backend="spy")
    finally:
        fw.unregister_backend("spy")
    [op] = [o for o in seen if o.kind == "moe"]
    sh = op.shape
    assert (sh["hidden"], sh["inter"], sh["k"], sh["n_experts"]) == (7168, 2048, 8, 256)
    assert np.all(op.shape["rest_flops"] < op.flops) and np.all(op.shape["rest_bytes"] < op.bytes_)
    roof = np.maximum(op.flops / (1e15 * eff.compute), op.bytes_ / (3e12 * eff.bandwidth))
    np.testing.assert_allclose(t, s.n_dense * 0 + roof * s.n_moe + fw.ffn_block(
        fw.replace(s, n_moe=0), prec, eff, 1e15, 3e12, tokens=np.array([8.0, 4096.0]), n=16.0), rtol=1e-12)


def test_production_cells_can_be_priced_by_the_measured_tables():
    """``production.decode_throughput(backend="measured")`` prices the same search through the
    measured tables (H800: H100's expert GEMMs, its own links), and it changes the answer."""
    from analysis import measured as M
    from analysis.disagg import production as P
    from analysis.disagg import search as S

    d = P.measured_device(H800, "fp8")
    assert d["backend"] == M.backend_name(H800) and d["domain"] == 8.0
    g = S.Grid(sizes=(16,), tps=(1,), batches=(1024,), microbatches=(1,), overlaps=(1,))
    r = {b: P.decode_throughput("DeepSeek-V3", H800, "D", budget=16, grid=g, backend=b)["tpot_s"]
         for b in ("roofline", "measured")}
    assert np.isfinite(r["measured"]) and r["measured"] != pytest.approx(r["roofline"], rel=1e-3)
    with pytest.raises(S.SearchError, match="backend"):
        P.decode_throughput("DeepSeek-V3", H800, "D", budget=16, grid=g, backend="tables")


def test_layerwise_overlaps_are_a_declared_share_perfect_by_assumption():
    """Layer-wise overlap (a tier load, the PD KV transfer) hides the share ``overlap`` of what the ideal
    layer-wise pipeline hides: 1 (the declared assumption, fw.LAYERWISE_OVERLAP) is the ideal rule, 0
    serial, 0.5 half-way; a share outside [0, 1] is refused."""
    assert fw.LAYERWISE_OVERLAP == 1.0
    c, ld, L = 4.0, 2.0, 4
    ideal = max(c, ld) + min(c, ld) / L
    assert fw.layerwise_overlap(c, ld, L) == pytest.approx(ideal)
    assert fw.layerwise_overlap(c, ld, L, overlap=0.0) == pytest.approx(c + ld)
    assert fw.layerwise_overlap(c, ld, L, overlap=0.5) == pytest.approx((c + ld + ideal) / 2)
    with pytest.raises(ValueError, match="share"):
        fw.layerwise_overlap(c, ld, L, overlap=1.5)
    s = fw.shape("Llama-3.1-8B")
    eff = fw.Efficiency()
    kw = dict(seqs=3, tokens=2000, t_pass=1.0, devices=2, net=1e9)
    x = 3 * float(fw.kv_transfer_bytes(s, fw.Precision(), 2000)) / (2 * 1e9 * eff.link)
    hidden = float(fw.kv_transfer_exposed(s, fw.Precision(), eff, **kw))
    assert hidden == pytest.approx(max(x - 1.0, 0) + x / s.n_layers)
    assert float(fw.kv_transfer_exposed(s, fw.Precision(), eff, overlap=0.0, **kw)) == pytest.approx(x)
    half = float(fw.kv_transfer_exposed(s, fw.Precision(), eff, overlap=0.5, **kw))
    assert half == pytest.approx((x + hidden) / 2)
