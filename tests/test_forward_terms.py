"""Every term of chapter 3's TTFT, TPOT and cost per token pinned by closed forms on small cases and by
an independent scalar reference (tests/_forward_reference.py): deleting or altering any term of
analysis.forward or of the role pricing in analysis.disagg.search makes one of these fail."""
import math

import numpy as np
import pytest

from analysis import forward as F
from analysis.disagg import devices
from analysis.disagg import search as S
from analysis.forward import Efficiency, Precision
from tests import _forward_reference as REF

H100 = "H100-SXM5-80GB"
EFF = Efficiency()


def _dev(**kw):
    return {**devices.device(H100, "fp8"), **kw}


@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Qwen3-30B-A3B", "DeepSeek-V3", "gpt-oss-120b"])
def test_colocated_pass_agrees_with_scalar_reference(model):
    """Random passes (decode, prefill chunks with cached prefixes, mixed; TP, DP/EP over and beyond a
    scale-up domain) in every regime: the vectorised model equals the loop-over-layers reference."""
    s = F.shape(model)
    rng = np.random.default_rng(7)
    prec = Precision.named("fp8")
    for _ in range(40):
        tp = int(rng.choice([1, 2, 4, 8]))
        dp = int(rng.choice([1, 2, 4, 8]))
        B = float(rng.choice([0, 1, 7, 64, 300]))
        P = float(rng.choice([0, 0, 1, 3, 16]))
        L = float(rng.choice([1, 17, 300]))
        X = float(rng.choice([0, 50, 1000]))
        ctx = float(rng.choice([10, 2000, 30000]))
        if B + P == 0:
            B = 1.0
        dev = _dev(domain=float(rng.choice([1, 4, 8, 72])), net=float(rng.choice([5e9, 50e9])))
        got = F.colocated_pass_time(s, prec, EFF, dev, tp=tp, dp=dp, dec_seqs=B, dec_ctx=ctx, pre_seqs=P,
                                    pre_len=L, pre_prefix=X)
        want = REF.pass_time(s, prec, EFF, dev, tp=tp, dp=dp, B=B, ctx=ctx, P=P, L=L, X=X)
        assert float(got) == pytest.approx(want, rel=1e-9), (tp, dp, B, P, L, X, ctx)


def test_moe_layer_closed_form():
    """Qwen3-30B-A3B, one device: a single decode token reads k experts + router and is
    bandwidth-bound; 4,096 prefill tokens are compute-bound on the experts plus the router GEMM."""
    s = F.shape("Qwen3-30B-A3B")
    prec = Precision()  # bf16 weights and activations
    peak, bw = 1e15, 3e12
    eff = Efficiency(compute=0.5, bandwidth=0.8, moe_imbalance=1.25)
    h, E, k, Pe = 2048, 128, 8, 3 * 2048 * 768
    assert (s.h, s.n_experts, s.k_active, s.expert_params, s.n_shared) == (h, E, k, Pe, 0)
    t1 = F.ffn_block(s, prec, eff, peak, bw, tokens=1.0, n=1.0)
    bytes1 = k * Pe * 2 + h * E * 2 + 1 * (k + 1) * h * 2 * 2
    assert float(t1) == pytest.approx(48 * bytes1 / (bw * 0.8), rel=1e-12)
    T = 4096.0
    tT = F.ffn_block(s, prec, eff, peak, bw, tokens=T, n=4.0)
    flops = 2 * T * k * Pe / 4 * 1.25 + 2 * T * h * E / 4
    assert float(tT) == pytest.approx(48 * flops / (peak * 0.5), rel=1e-12)
    # the router is h x E weights read once, not per token: its bytes do not grow with the batch
    b_router = F.ffn_block(s, prec, Efficiency(compute=1e-9 + 1.0), 1e30, bw, tokens=T, n=1.0)
    touched = E * (1 - (1 - k / E) ** T)
    want = 48 * (touched * Pe * 2 + h * E * 2 + T * (k + 1) * h * 4) / (bw * 0.8)
    assert float(b_router) == pytest.approx(want)


def test_dense_ffn_activation_bytes_do_not_shrink_with_devices():
    """A tensor-split dense FFN reads every token row and writes a partial row on each device."""
    s = F.shape("Llama-3.1-8B")
    t = F.ffn_block(s, Precision(), Efficiency(), 1e30, 1e12, tokens=1000.0, n=4.0)
    want = 32 * (s.dense_params * 2 / 4 + 1000 * 4096 * 2 * 2) / (1e12 * 0.8)
    assert float(t) == pytest.approx(want, rel=1e-12)


def test_mla_decode_pairs_in_a_mixed_pass_cost_the_decode_rate():
    s = F.shape("DeepSeek-V3")
    assert s.pair_flops_decode / s.pair_flops_prefill > 3.0
    kw = dict(tokens=101.0, seqs=2.0, kv_tokens=1000.0, pairs_full=1000.0 + 1 + 100 * 101 / 2,
              pairs_slide=0.0, tp=1.0, dp=1.0)
    big_bw = 1e30
    t = F.attention_block(s, Precision(), Efficiency(), 1e15, big_bw, dec_pairs_full=1001.0, **kw)
    core = (1001 * s.pair_flops_decode + 100 * 101 / 2 * s.pair_flops_prefill) / (1e15 * 0.6)
    proj = 2 * 101 * s.attn_params / (1e15 * 0.6)
    assert float(t) == pytest.approx(s.n_full * (core + proj), rel=1e-12)


def test_kv_transfer_counts_sliding_layers_at_their_window():
    s = F.shape("gpt-oss-120b")
    assert (s.n_full, s.n_sliding, s.window) == (18, 18, 128)
    got = F.kv_transfer_bytes(s, Precision(), 1000.0)
    assert float(got) == pytest.approx((18 * 1000 + 18 * 128) * s.kv_elems * 2.0)


def test_kv_transfer_exposed_closed_form():
    s = F.shape("Llama-3.1-8B")
    eff = Efficiency(link=0.5)
    x = 3 * 2000 * 32 * s.kv_elems * 2.0 / (2 * 1e9 * 0.5)  # 3 prompts of 2,000 tokens, 2 devices, 1 GB/s
    short = F.kv_transfer_exposed(s, Precision(), eff, seqs=3, tokens=2000, t_pass=0.01, devices=2, net=1e9)
    assert float(short) == pytest.approx(x - 0.01 + x / 32)
    hidden = F.kv_transfer_exposed(s, Precision(), eff, seqs=3, tokens=2000, t_pass=10 * x, devices=2,
                                   net=1e9)
    assert float(hidden) == pytest.approx(x / 32)


def test_prefill_ttft_terms():
    """pass + M/D/1 wait + batch-forming wait + exposed transfer, each term separately."""
    t, rho, b, x = 0.2, 0.75, 4.0, 0.03
    want = 0.2 + 0.75 / 0.5 * 0.2 + 3 / (2 * 0.75 * 4) * 0.2 + 0.03
    assert S.prefill_ttft(t, rho, b, x) == pytest.approx(want)
    assert S.prefill_ttft(t, 1e-9 + 0.0, 1.0, 0.0) == pytest.approx(t)


def test_prefill_role_prices_every_term():
    """P candidates: TTFT and rate rebuilt from one pass time, the queue and the KV transfer over a
    deliberately slow NIC (so the transfer shows), and the cost per request from the device price."""
    s = F.shape("Llama-3.1-8B")
    prec, eff = Precision(), Efficiency()
    dev = {**devices.device(H100), "net": 2e9}
    wl = S.Workload(4000, 200)
    g = S.Grid(sizes=(1, 2), tps=(1, 2), prefill_batches=(1, 4), utilisations=(0.5, 0.8))
    c = S.role_candidates("P", s, wl, dev, prec=prec, eff=eff, grid=g, budget=8)
    assert len(c["rate"]) == 12  # (size, tp) in (1,1), (2,1), (2,2); two batches; two utilisations
    for i in range(len(c["rate"])):
        size, tp, b, rho = c["size"][i], c["tp"][i], c["pbatch"][i], c["rho"][i]
        t = float(F.colocated_pass_time(s, prec, eff, dev, tp=tp, dp=size / tp, pre_seqs=b, pre_len=4000.0))
        x = b * 4000 * 32 * s.kv_elems * 2.0 / (size * 2e9 * eff.link)
        exposed = max(x - t, 0) + x / 32
        assert exposed > 0.01 * t
        ttft = t + rho / (2 * (1 - rho)) * t + (b - 1) / (2 * rho * b) * t + exposed
        assert c["ttft"][i] == pytest.approx(ttft, rel=1e-12)
        assert c["rate"][i] == pytest.approx(rho * b / t, rel=1e-12)
        assert c["usd_per_rate"][i] == pytest.approx(size * dev["price"] / (rho * b / t), rel=1e-12)


def test_decode_and_colocated_roles_price_every_term():
    s = F.shape("Qwen3-30B-A3B")
    prec, eff = Precision.named("fp8"), Efficiency()
    dev = devices.device(H100, "fp8")
    I, O = 3000.0, 300.0
    wl = S.Workload(I, O)
    g = S.Grid(sizes=(2,), tps=(1,), batches=(64,), chunks=(1024,), overlaps=(1, 2))
    d = S.role_candidates("D", s, wl, H100, prec=prec, eff=eff, grid=g, budget=8)
    for i in range(len(d["rate"])):
        m = d["ovl"][i]
        t = float(F.colocated_pass_time(s, prec, eff, dev, tp=1.0, dp=2.0, microbatches=m, dec_seqs=64.0,
                                        dec_ctx=I + O / 2))
        assert d["tpot"][i] == pytest.approx(t) and d["rate"][i] == pytest.approx(64 / (O * t))
    c = S.role_candidates("C", s, wl, H100, prec=prec, eff=eff, grid=g, budget=8)
    i = int(np.flatnonzero(c["ovl"] == 1)[0])
    run = lambda **kw: float(F.colocated_pass_time(s, prec, eff, dev, tp=1.0, dp=2.0, **kw))
    t_mix = run(dec_seqs=64.0, dec_ctx=I + O / 2, pre_seqs=1.0, pre_len=1024.0, pre_prefix=(I - 1024) / 2)
    t_dec = run(dec_seqs=64.0, dec_ctx=I + O / 2)
    f = 64 * I / (O * 1024)
    tpot = f * t_mix + (1 - f) * t_dec
    service = math.ceil(I / 1024) * t_mix
    assert c["tpot"][i] == pytest.approx(tpot)
    assert c["ttft"][i] == pytest.approx(service + f / (2 * (1 - f)) * service + t_dec / 2)
    assert c["rate"][i] == pytest.approx(64 / (O * tpot))


def test_plan_throughput_and_cost_per_token_are_rate_matched():
    wl, slo = S.Workload(2000, 200), S.SLO(5.0, 0.1)
    g = S.Grid(sizes=(1, 2, 4), tps=(1, 2), batches=(16, 64), prefill_batches=(1, 4), utilisations=(0.5, 0.8))
    p = S.best_plan("PD", "Llama-3.1-8B", wl, slo, S.default_hardware(H100), budget=8, grid=g)
    dev_s = sum(u["dev_per_rate"] for u in p.units)
    usd_s = sum(u["usd_per_rate"] for u in p.units)
    assert p.tokens_per_s_per_device == pytest.approx(200 / dev_s)
    assert p.tokens_per_s_per_kusd == pytest.approx(200 / usd_s * 1e3)
    price = devices.device(H100)["price"]
    assert usd_s == pytest.approx(dev_s * price)


def test_af_layer_charges_each_link_direction():
    # perfect overlap (overlap = 1)
    assert S.af_layer_time(1.0, 2.0, 0.5, 1, 1.0) == pytest.approx(4.0)     # plain sum, both directions
    assert S.af_layer_time(1.0, 2.0, 0.5, 3, 1.0) == pytest.approx(6.0)     # FFN-bound pipeline
    assert S.af_layer_time(1.0, 1.0, 1.5, 2, 1.0) == pytest.approx(5.0)     # latency bound: a + f + 2 x
    assert S.af_layer_time(0.1, 0.1, 1.5, 4, 1.0) == pytest.approx(6.0)     # one link direction busiest


def test_af_ring_hides_only_the_declared_share_of_overlap():
    """The attention/FFN ring takes the time model's one overlap rule (forward.pipelined): of the
    time perfect pipelining would save over running the micro-batches one after another, it hides
    the share overlap."""
    serial, perfect = 3 * 4.0, 6.0                                           # 3 micro-batches of a ring of 4
    assert S.af_layer_time(1.0, 2.0, 0.5, 3, 0.0) == pytest.approx(serial)  # none hidden
    assert S.af_layer_time(1.0, 2.0, 0.5, 3, 0.8) == pytest.approx(serial - 0.8 * (serial - perfect))
    assert S.af_layer_time(1.0, 2.0, 0.5, 1, 0.3) == pytest.approx(4.0)     # one micro-batch: nothing to hide
    # the same rule as colocated two-micro-batch overlap: c = a + f, k = 2 x with a, f on one resource
    assert float(S.af_layer_time(1.0, 0.0, 0.25, 2, 0.6)) == pytest.approx(
        float(F.overlap_time(1.0, 0.5, 2, 0.6)))


def test_topology_switches_at_the_domain_size():
    """EP all-to-all of a MoE instance: scale-up speed up to the domain, slower (NIC) beyond it."""
    s = F.shape("Qwen3-30B-A3B")
    prec = Precision()
    for domain in (4, 8):
        kw = dict(tokens=1024.0, tp=1.0)
        t = [float(F.comm_time(s, prec, EFF, 450e9, dp=float(n), net=50e9, domain=domain, **kw))
             for n in (2, 4, 8, 16)]
        flat = [float(F.comm_time(s, prec, EFF, 450e9, dp=float(n), **kw)) for n in (2, 4, 8, 16)]
        for n, a, b in zip((2, 4, 8, 16), t, flat):
            if n <= domain:
                assert a == pytest.approx(b)
            else:
                assert a > 2 * b
    # AF pair: inside one domain at link speed, beyond it partly over the NIC
    x_in = F.af_hop_time(s, prec, EFF, 50e9, tokens=256.0, n_attn=4.0, n_ffn=4.0, link=450e9, domain=8)
    x_out = F.af_hop_time(s, prec, EFF, 50e9, tokens=256.0, n_attn=8.0, n_ffn=8.0, link=450e9, domain=8)
    x_ref = F.af_hop_time(s, prec, EFF, 450e9, tokens=256.0, n_attn=4.0, n_ffn=4.0)
    assert float(x_in) == pytest.approx(float(x_ref))
    assert float(x_out) > float(x_in)


@pytest.mark.parametrize("mode", ["C", "PD", "AF"])
def test_overlap_is_never_slower_than_no_overlap(mode):
    """Overlap is a searched choice: adding micro-batch options never lowers the best plan."""
    wl, slo = S.Workload(3000, 300), S.SLO(5.0, 0.1)
    base = S.Grid(sizes=(1, 2, 4, 8, 16), tps=(1, 2, 4), batches=(16, 64, 256), chunks=(1024, 4096),
                  prefill_batches=(1, 4), utilisations=(0.5, 0.8), microbatches=(1,), overlaps=(1,))
    more = S.Grid(**{**base.__dict__, "microbatches": (1, 2, 3), "overlaps": (1, 2)})
    hw = S.default_hardware(H100)
    a = S.best_plan(mode, "Qwen3-30B-A3B", wl, slo, hw, budget=32, grid=base)
    b = S.best_plan(mode, "Qwen3-30B-A3B", wl, slo, hw, budget=32, grid=more)
    assert a.feasible and b.feasible
    assert b.tokens_per_s_per_device >= a.tokens_per_s_per_device * (1 - 1e-12)
    # and the overlap formula itself never exceeds the serial sum of one full pass's parts
    c, k = np.array([1.0, 2.0, 0.5]), np.array([0.3, 2.0, 4.0])
    assert np.all(F.overlap_time(c / 2, k / 2, 2) <= c + k + 1e-12)


def test_unknown_device_suggests_close_names():
    from analysis import specs
    with pytest.raises(specs.UnknownNameError, match="H100-SXM5-80GB"):
        devices.device("H100-SXM5")


def test_prefix_hits_compute_the_misses_and_load_the_hits():
    """P role with half the prompt cached, hits read at 2 GB/s per device: the pass computes 2,000 new
    tokens after a 2,000-token prefix, then the hits' load shows where it outlasts the pass."""
    s = F.shape("Llama-3.1-8B")
    prec, eff = Precision(), Efficiency()
    dev = devices.device(H100)
    g = S.Grid(sizes=(2,), tps=(1,), prefill_batches=(4,), utilisations=(0.5,))
    wl = S.Workload(4000, 200, prefix_hit=0.5, hit_bw=2e9)
    c = S.role_candidates("P", s, wl, dev, prec=prec, eff=eff, grid=g, budget=8)
    t0 = float(F.colocated_pass_time(s, prec, eff, dev, tp=1.0, dp=2.0, pre_seqs=4.0, pre_len=2000.0,
                                     pre_prefix=2000.0))
    load = 4 * 2000 * 32 * s.kv_elems * 2.0 / (2 * 2e9)
    t = t0 + max(load - t0, 0) + load / 32
    x = 4 * 4000 * 32 * s.kv_elems * 2.0 / (2 * dev["net"] * eff.link)
    ttft = t + 0.5 / (2 * 0.5) * t + 3 / (2 * 0.5 * 4) * t + max(x - t, 0) + x / 32
    assert c["ttft"][0] == pytest.approx(ttft, rel=1e-12)
    assert c["rate"][0] == pytest.approx(0.5 * 4 / t, rel=1e-12)
    # hits in HBM (free load) are cheaper than computing the whole prompt
    full = S.role_candidates("P", s, S.Workload(4000, 200), dev, prec=prec, eff=eff, grid=g, budget=8)
    free = S.role_candidates("P", s, S.Workload(4000, 200, prefix_hit=0.5), dev, prec=prec, eff=eff, grid=g,
                             budget=8)
    assert free["rate"][0] > full["rate"][0] and c["rate"][0] < free["rate"][0]


def test_workload_validation_and_lengths():
    w = S.Workload.from_lengths([100, 300], [10, 30])
    assert (w.input_tokens, w.output_tokens) == (200.0, 20.0) and len(w.lengths[0]) == 2
    with pytest.raises(S.SearchError, match="prefix_hit"):
        S.Workload(100, 10, prefix_hit=1.0)
    with pytest.raises(S.SearchError, match="lengths"):
        S.Workload(100, 10, lengths=([1, 2], [1]))


def test_plan_reports_pool_throughput_and_grid_edges():
    wl, slo = S.Workload(2000, 200), S.SLO(5.0, 0.1)
    g = S.Grid(sizes=(1, 2), tps=(1, 2), batches=(16, 64), prefill_batches=(1, 4), utilisations=(0.5, 0.8))
    p = S.best_plan("PD", "Llama-3.1-8B", wl, slo, S.default_hardware(H100), budget=8, grid=g)
    pools = p.pool_throughput()
    d = [u for u in p.units if u["unit"] == "D"][0]
    assert pools["D"] == pytest.approx(d["batch"] / (d["tpot"] * d["devices"]))
    pu = [u for u in p.units if u["unit"] == "P"][0]
    assert pools["P"] == pytest.approx(pu["rate"] * 2000 / pu["devices"])
    assert "D.batch" in p.edges  # the decode batch wants more than 64 sequences here
    wide = S.Grid(**{**g.__dict__, "batches": (16, 64, 256, 1024)})
    p2 = S.best_plan("PD", "Llama-3.1-8B", wl, slo, S.default_hardware(H100), budget=8, grid=wide)
    assert p2.tokens_per_s_per_device > p.tokens_per_s_per_device


def test_whole_instances_cost_and_never_beat_rate_matching():
    # two units: 2-device instances at 1 req/s and 3-device instances at 2 req/s, 12 devices
    cost, counts = S.whole_instance_cost([(2, 2.0, 1.0), (3, 3.0, 2.0)], 12)
    brute = min(((n1 * 2 + n2 * 3) / min(n1 * 1.0, n2 * 2.0), (n1, n2))
                for n1 in range(1, 7) for n2 in range(1, 5) if 2 * n1 + 3 * n2 <= 12)
    assert cost == pytest.approx(brute[0]) and counts == brute[1]
    wl, slo = S.Workload(3000, 300), S.SLO(5.0, 0.1)
    g = S.Grid(sizes=(1, 2, 4, 8), tps=(1, 2), batches=(16, 64, 256), prefill_batches=(1, 4),
               utilisations=(0.7,))
    hw = S.default_hardware(H100)
    for mode in ("PD", "3-way", "C"):
        frac = S.best_plan(mode, "Qwen3-30B-A3B", wl, slo, hw, budget=16, grid=g)
        whole = S.best_plan(mode, "Qwen3-30B-A3B", wl, slo, hw, budget=16, grid=g, whole_instances=True)
        assert whole.tokens_per_s_per_device <= frac.tokens_per_s_per_device * (1 + 1e-12)
        used = sum(u["instances"] * u["devices"] for u in whole.units)
        assert used <= 16
        rate = min(u["instances"] * u["rate"] for u in whole.units)
        assert whole.tokens_per_s_per_device == pytest.approx(300 * rate / used)


@pytest.mark.parametrize("n, e_dev", [(1, 48), (16, 3), (32, 2), (64, 1)])
def test_moe_expert_placement_closed_form(n, e_dev):
    """Step-3 (48 routed experts, top-3, one shared): the busiest of n devices holds ceil(48 / n)
    experts and all of the replicated shared expert; 48 / 32 leaves some devices with two."""
    s = F.shape("Step-3")
    assert (s.n_experts, s.k_active, s.n_shared, s.n_moe) == (48, 3, 1, 56)
    assert float(F.experts_per_device(s, n)) == e_dev
    prec, eff = Precision.named("fp8"), Efficiency(moe_imbalance=1.0)
    T, Pe, h = 4096.0, s.expert_params, 7168
    compute_only = F.ffn_block(s, prec, eff, 1e15, 1e30, tokens=T, n=float(n))  # bandwidth unlimited
    dense = 5 * 2 * T * s.dense_params / n / (1e15 * 0.6)
    moe = 56 * (2 * T * 3 * Pe * e_dev / 48 + 2 * T * 1 * Pe / n + 2 * T * h * 48 / n) / (1e15 * 0.6)
    assert float(compute_only) == pytest.approx(dense + moe, rel=1e-12)
    w = F.weight_bytes_per_device(s, prec, tp=1, n=float(n), part="ffn")
    assert float(w) == pytest.approx(5 * s.dense_params / n + 56 * ((e_dev + 1) * Pe + h * 48))


@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Qwen3-30B-A3B"])
def test_af_split_step_composes_every_term(model):
    """A decode pass of an attention/FFN split (TP 2 x DP 2 attention, 4 FFN devices, 2 micro-batches,
    pools inside one scale-up domain): per layer, attention + LM head + TP all-reduce + layer overhead,
    FFN (+ its all-reduce for a dense FFN), the one-way hop, pipelined by af_layer_time."""
    s = F.shape(model)
    prec, eff = Precision(), Efficiency()
    dev = devices.device(H100)
    B, ctx, m, tp, n_a, n_f = 64.0, 3000.0, 2.0, 2.0, 4.0, 4.0
    b = B / m
    dp = n_a / tp
    p = F.pass_inputs(s, dec_seqs=b, dec_ctx=ctx)
    att = F.attention_block(s, prec, eff, dev["flops"], dev["bw"], tokens=b, seqs=b, kv_tokens=b * ctx,
                            pairs_full=b * (ctx + 1), pairs_slide=0.0, tp=tp, dp=dp,
                            attn_peak=dev["attn_flops"], dec_pairs_full=b * (ctx + 1), dec_pairs_slide=0.0)
    att += F.head_time(s, prec, eff, dev["flops"], dev["bw"], seqs=b, tokens=b, n=n_a)
    att += 2 * s.n_layers * (2 * (tp - 1) / tp * (b / dp) * s.h * 2 / (dev["link"] * eff.link)
                             + eff.collective_latency_s)
    ffn = F.ffn_block(s, prec, eff, dev["flops"], dev["bw"], tokens=b, n=n_f)
    if not s.n_moe:
        ffn += s.n_layers * (2 * (n_f - 1) / n_f * b * s.h * 2 / (dev["link"] * eff.link)
                             + eff.collective_latency_s)
    a = float(att) / s.n_layers + eff.layer_overhead_s
    f = float(ffn) / s.n_layers
    x1 = float(F.af_hop_time(s, prec, eff, dev["link"], tokens=b, n_attn=n_a, n_ffn=n_f))
    assert float(p["tokens"]) == b
    perfect = max(m * max(a, f, x1 / 2), a + f + x1)
    serial = m * (a + f + x1)
    assert eff.overlap < 1 and serial > perfect  # the declared overlap hides only part of the difference
    want = s.n_layers * (serial - eff.overlap * (serial - perfect)) + eff.step_overhead_s
    got = S._split_step(s, prec, eff, dev, dev, tp=tp, n_a=n_a, n_f=n_f, m=m, dec_seqs=B, dec_ctx=ctx)
    assert float(got) == pytest.approx(want, rel=1e-12)
