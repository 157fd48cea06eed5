"""Chapter 5 priced with chapter 2's models (analysis/compose/pricing.py): recall by small random reads
(IOPS, latency, prefetch one layer ahead), cold-copy writes sharing the drive, wear charged once by the
replacement rule, and the routing-dependent hit curve. Each term is pinned by a closed form that fails
when the term is removed."""
import math

import numpy as np
import pytest

from analysis import kv
from analysis.compose import configure as cconf
from analysis.compose import params as cparams
from analysis.compose import pipeline, pricing
from analysis.compose.fidelity import KVPolicy
from analysis.compose.pipeline import ReuseCurve, Scenario
from analysis.specs import hardware as _hw
from analysis.specs import model as _model
from analysis.tiering import cluster, load_trace, lru_hit_curve, tiers

MODEL = "Llama-3.1-70B"
DEP = cconf.tier_deployment()
QEVICT = KVPolicy("qevict_recall", 0.5, hot_ratio=0.55, cold_ratio=0.6, recall_ratio_per_step=2e-4, kl=0.1,
                  top1=0.8)
REUSE = ReuseCurve(np.linspace(1e5, 2e7, 200), np.linspace(0.005, 1.0, 200), 10000.0, "synthetic")
BASE = Scenario(model=MODEL, gpu="H100-SXM5-80GB", input_tokens=16384, output_tokens=1000, tiers=DEP)


def _nvme(**kw):
    return tiers.build_tiers("nvme", DEP.replace(model=MODEL, tp=8, **kw))[-1]


def _drive_layer_s(name, n, u, bytes_l, bw_eff):
    """Independent closed form of one layer's random reads on ``n`` drives ``name``."""
    s = _hw(name, "ssd")
    seq = n * min(s["seq_read"], s.values.get("interface_bandwidth", math.inf))
    iops = n * s["random_read_iops"] * u / math.ceil(u / 4096)
    return s["read_latency"] + bytes_l / (bw_eff * min(seq, iops))


def test_recall_small_random_reads_iops_latency_prefetch():
    t = _nvme()
    m = _model(MODEL)
    L, H = m.n_layers, m.n_kv_heads
    rm = pricing.RandomReadRecall.from_deployment(DEP, unit_tokens=1, prefetch=False, charge_writes=False)
    u = t.bytes_per_token / (L * H)  # one token of one layer and head: far below 4 KiB
    assert rm.unit_bytes(t, MODEL) == pytest.approx(u, rel=1e-15) and u < 4096
    b = 2e9
    r = _drive_layer_s(DEP.nvme_name, DEP.nvme_drives, u, b / L, DEP.bw_eff)
    link = t.latency_s + b / L / t.bandwidth
    assert r > 2 * link  # the IOPS bound decides: dropping it (sequential bandwidth) fails below
    assert rm.recall_s(t, b, model=MODEL) == pytest.approx(L * r, rel=1e-12)
    # the sequential model misses both the IOPS bound and the latency
    assert pipeline.SequentialRecall().recall_s(t, b) < 0.5 * L * r
    # prefetch one layer ahead: the first layer exposed, later ones stall by what the compute does not hide
    pre = pricing.RandomReadRecall.from_deployment(DEP, unit_tokens=1, charge_writes=False)
    for step in (0.0, 0.5 * L * r, 4.0 * L * r):
        c = step / L
        assert pre.recall_s(t, b, model=MODEL, step_s=step) == pytest.approx(r + (L - 1) * max(r - c, 0.0),
                                                                             rel=1e-12)
    # large units read at the delivered bandwidth: never faster than the host links allow
    big = pricing.RandomReadRecall.from_deployment(DEP, unit_tokens=4096, prefetch=False, charge_writes=False)
    ub = big.unit_bytes(t, MODEL)
    rb = max(link, _drive_layer_s(DEP.nvme_name, DEP.nvme_drives, ub, b / L, DEP.bw_eff))
    assert big.recall_s(t, b, model=MODEL) == pytest.approx(L * rb, rel=1e-12)
    assert rb > t.latency_s * 1.01  # the bandwidth term is there
    # a memory tier has no IOPS figure: latency + bytes / bandwidth per layer
    dram = tiers.build_tiers("dram", DEP.replace(model=MODEL, tp=8))[-1]
    assert rm.recall_s(dram, b, model=MODEL) == pytest.approx(L * (dram.latency_s + b / L / dram.bandwidth),
                                                              rel=1e-12)
    assert rm.recall_s(t, 0.0, model=MODEL) == 0.0


def test_cold_copy_writes_take_drive_time_and_wear():
    t = _nvme()
    rm = pricing.RandomReadRecall.from_deployment(DEP)
    off = pricing.RandomReadRecall.from_deployment(DEP, charge_writes=False)
    w = 3e8
    k = t.interference
    assert k >= 1 and math.isfinite(t.write_bw)
    assert rm.write_s(t, w) == pytest.approx(k * w / t.write_bw, rel=1e-12)
    L = _model(MODEL).n_layers
    r = rm.layer_read_s(t, 1e8 / L, rm.unit_bytes(t, MODEL))
    stall = r + (L - 1) * max(r - 0.03 / L, 0.0)
    # asynchronous writes: the step lasts at least the drive's busy time (all reads + the writes' share)
    got = rm.recall_s(t, 1e8, model=MODEL, step_s=0.03, write_bytes_per_step=w)
    assert got == pytest.approx(max(stall, L * r + k * w / t.write_bw - 0.03), rel=1e-12)
    assert got > stall * 1.01  # the writes decide here
    assert off.recall_s(t, 1e8, model=MODEL, step_s=0.03, write_bytes_per_step=w) == pytest.approx(stall,
                                                                                                   rel=1e-12)
    # small writes hide under the step
    assert rm.recall_s(t, 1e8, model=MODEL, step_s=0.03, write_bytes_per_step=1.0) == pytest.approx(stall,
                                                                                                    rel=1e-12)
    # wear per byte: price / rated bytes written x write amplification, from the datasheet
    s = _hw(DEP.nvme_name, "ssd")
    per_byte = DEP.nvme_usd_per_byte * 86400.0 / (s["dwpd"] * s["warranty"]) * DEP.write_amplification
    assert rm.write_usd(t, 1e12) == pytest.approx(1e12 * per_byte, rel=1e-12)
    assert off.write_usd(t, 1e12) == 0.0
    dram = tiers.build_tiers("dram", DEP.replace(model=MODEL, tp=8))[-1]
    assert rm.write_usd(dram, 1e12) == 0.0 and rm.write_s(dram, 1e12) == 0.0


def test_pipeline_charges_recall_writes_and_wear_by_the_replacement_rule():
    # a low-endurance NVMe so that wear exceeds the copies' share of the drive's amortisation
    d = DEP.replace(nvme_dwpd=0.01)
    s = BASE.replace(mode="PD", layout="nvme", policy=QEVICT, tiers=d,
                     recall_model=pricing.RandomReadRecall.from_deployment(d))
    r = pipeline.evaluate(s, REUSE)
    ref = pipeline.evaluate(s.replace(recall_model=pipeline.SequentialRecall()), REUSE)
    p = pipeline.plan(s.mode, s.model, s.gpu, 16384.0, 1000.0, s.ttft_slo_s, s.tpot_slo_s, s.budget_devices,
                      QEVICT.hot_ratio, 1.0)
    ud = {u["unit"]: u for u in p.units}["D"]
    I, O, B = 16384.0, 1000.0, ud["batch"]
    cold = tiers.build_tiers("nvme", s.tiers.replace(model=MODEL, gpu=s.gpu, tp=int(ud["size"]),
                                                     kv_dtype="bf16"))[-1]
    stored = cold.bytes_per_token / kv.kv_bytes_per_token_all_layers(MODEL, "bf16")
    kv_seq = kv.kv_bytes(MODEL, I + O / 2, 1, "bf16")
    cold_seq = QEVICT.cold_ratio * kv_seq * stored
    rec = s.recall_model.recall_s(cold, B * QEVICT.recall_ratio_per_step * kv_seq * stored, model=MODEL,
                                  step_s=ud["tpot"], write_bytes_per_step=B * cold_seq / O)
    assert r.recall_s_per_step == pytest.approx(rec, rel=1e-12)
    assert r.tpot_s == pytest.approx(ud["tpot"] + rec, rel=1e-12)
    # the writes of the B / O sequences that join per step are part of it
    no_w = s.recall_model.recall_s(cold, B * QEVICT.recall_ratio_per_step * kv_seq * stored, model=MODEL,
                                   step_s=ud["tpot"])
    assert no_w < rec * (1 - 1e-6) and r.recall_s_per_step > ref.recall_s_per_step
    # wear once per request, minus what amortisation already pays
    capex = cold.capex_usd_per_s / (cold.capacity_tokens * cold.bytes_per_token) * cold_seq * O * r.tpot_s
    wear = cold_seq * cold.usd_per_byte_written
    assert wear > capex > 0
    per_m = 1e6 / (I + O)
    assert r.cold_write_usd_per_mtok == pytest.approx((wear - capex) * per_m, rel=1e-12)
    assert ref.cold_write_usd_per_mtok == 0.0
    assert r.usd_per_mtok == pytest.approx(r.gpu_usd_per_mtok + r.tier_usd_per_mtok + r.cold_usd_per_mtok
                                           + r.cold_write_usd_per_mtok, rel=1e-13)
    # at the datasheet endurance, wear is below amortisation for these copies: nothing extra
    s2 = s.replace(tiers=DEP, recall_model=pricing.RandomReadRecall.from_deployment(DEP))
    c2 = tiers.build_tiers("nvme", DEP.replace(model=MODEL, gpu=s.gpu, tp=int(ud["size"]),
                                               kv_dtype="bf16"))[-1]
    r2 = pipeline.evaluate(s2, REUSE)
    cap2 = c2.capex_usd_per_s / (c2.capacity_tokens * c2.bytes_per_token) * cold_seq * O * r2.tpot_s
    assert r2.cold_write_usd_per_mtok == pytest.approx(max(0.0, cold_seq * c2.usd_per_byte_written - cap2)
                                                       * per_m, rel=1e-12, abs=0.0)


@pytest.fixture(scope="module")
def routed():
    return {n: pricing.routed_reuse("mooncake_conversation", n, "kv_aware", model=MODEL, gpu="H100-SXM5-80GB",
                                    grid_points=5) for n in (1, 4)}


def test_routed_reuse_is_chapter_2s_cluster(routed):
    tr = load_trace("mooncake_conversation")
    hc = lru_hit_curve(tr)
    ideal = pipeline.reuse_curve_from_trace("mooncake_conversation")
    one, four = routed[1], routed[4]
    # one instance is the single stack: equal to the ideal curve at every grid capacity
    np.testing.assert_allclose(one.at(one.grid_tokens, ideal.mean_input_tokens),
                               ideal.at(one.grid_tokens, ideal.mean_input_tokens), rtol=1e-12, atol=1e-15)
    # four instances: chapter 2's router at a grid capacity, over the ideal unbounded cache
    g = four.grid_tokens[2] / tr.block_size
    d = pricing._ch2_deployment(MODEL, "H100-SXM5-80GB")
    from analysis.tiering import replay
    full = replay.service_times(tr, hc, tiers.build_tiers("dram", d), d, config="dram").nocache_s
    direct = cluster.route(tr, 4, "kv_aware", float(g), full_s=full)["token_hit_rate"]
    assert four.fraction[2] == pytest.approx(direct / hc.token_hit_rate(hc.capacities[-1] + 1.0), rel=1e-12)
    assert np.all(np.diff(four.fraction) >= 0) and four.fraction[-1] <= 1.0
    # separate caches lose the sharing across instances when capacity is not the limit
    assert four.unbounded() < 0.99
    # interpolation in log capacity between grid points; linear to zero below the grid
    x = math.sqrt(four.grid_tokens[1] * four.grid_tokens[2])
    assert four.at(x, ideal.mean_input_tokens) == pytest.approx(0.5 * (four.fraction[1] + four.fraction[2]),
                                                                rel=1e-12)
    assert four.at(0.5 * four.grid_tokens[0], ideal.mean_input_tokens) == pytest.approx(
        0.5 * four.fraction[0], rel=1e-12)
    # capacity scales with the prompt length as for the ideal curve
    assert four.at(2 * x, 2 * ideal.mean_input_tokens) == pytest.approx(four.at(x, ideal.mean_input_tokens),
                                                                        rel=1e-12)


def test_pipeline_uses_the_routed_hit_rate(routed):
    four = routed[4]
    s = BASE.replace(mode="PD", layout="dram", hit_rate=0.6)
    r = pipeline.evaluate(s, four)
    p = pipeline.plan("PD", MODEL, s.gpu, 16384.0, 1000.0, s.ttft_slo_s, s.tpot_slo_s, s.budget_devices, 1.0,
                      1.0)
    up = {u["unit"]: u for u in p.units}["P"]
    tl = tiers.build_tiers("dram", pipeline.tier_deployment(s, int(up["size"])))
    total = float(np.sum(np.diff(np.concatenate([[0.0], four.at(np.cumsum([t.capacity_tokens for t in tl]),
                                                                          16384.0)]))))
    assert r.realized_hit_rate == pytest.approx(min(0.6 * total, 1 - 1 / 16384.0), rel=1e-12)
    ideal = pipeline.evaluate(s, pipeline.reuse_curve_from_trace("mooncake_conversation"))
    assert abs(r.realized_hit_rate - ideal.realized_hit_rate) > 1e-4  # routing moves the hit rate


def test_everything_off_equals_the_baseline_under_chapter_2_pricing(routed):
    s0 = BASE.replace(hit_rate=0.0, layout="hbm", mode="C", policy=KVPolicy.full())
    new = s0.replace(recall_model=pricing.RandomReadRecall.from_deployment(DEP))
    assert pipeline.evaluate(new, routed[4]) == pipeline.evaluate(s0, REUSE)


def test_parameters_choose_the_pricing():
    def cfg(**kw):
        return cparams.SCHEMA.config(kw)

    assert isinstance(cconf.recall_model(cfg().recall), pricing.RandomReadRecall)
    assert isinstance(cconf.recall_model(cfg(recall_pricing="sequential").recall), pipeline.SequentialRecall)
    assert not cconf.recall_model(cfg(recall_prefetch=False).recall).prefetch
    assert isinstance(cconf.reuse(cfg(routing_policy="ideal")), ReuseCurve)
    with pytest.raises(pipeline.ComposeError, match="routing"):
        pricing.routed_reuse("mooncake_conversation", 2, "nearest")
    with pytest.raises(pipeline.ComposeError, match="unit_tokens"):
        pricing.RandomReadRecall(unit_tokens=0)
    with pytest.raises(pipeline.ComposeError, match="model"):
        pricing.RandomReadRecall.from_deployment(DEP).recall_s(_nvme(), 1e6)


def test_prefix_demotions_are_chapter_2s_crossings_without_the_end_of_the_trace():
    """The closed form of :func:`pipeline.prefix_writes` (an access is written below depth ``E`` iff
    its next use misses at ``E``) is chapter 2's exact crossing count, apart from the trace's end:
    the last ``E`` distinct blocks never sink below ``E`` because nothing follows them."""
    from analysis.tiering.endurance import crossings

    tr = load_trace("mooncake_conversation")
    hc = lru_hit_curve(tr)
    for e in (1000, 20000, 50000):
        misses = int((hc.distance > e).sum())
        assert int(crossings(tr, hc, [e])[0].sum()) == misses - min(e, hc.n_distinct)


def _prefix_case(drives):
    d = DEP.replace(nvme_dwpd=0.01, nvme_drives=drives)  # low endurance: demotions wear above amortisation
    s = BASE.replace(mode="PD", layout="nvme", hit_rate=0.6, tiers=d,
                     recall_model=pricing.RandomReadRecall.from_deployment(d))
    off = s.replace(recall_model=pricing.RandomReadRecall.from_deployment(d, charge_writes=False))
    p = pipeline.plan(s.mode, s.model, s.gpu, 16384.0, 1000.0, s.ttft_slo_s, s.tpot_slo_s, s.budget_devices,
                      1.0, 1.0)
    up = {u["unit"]: u for u in p.units}["P"]
    tl = tiers.build_tiers("nvme", pipeline.tier_deployment(s, int(up["size"])))
    ratio0, _ = pipeline.prefill_ratio(s, tl, up, REUSE)
    return s, off, tl, up["dev_per_rate"] / up["devices"] * ratio0


def test_pipeline_charges_prefix_demotion_writes_wear_and_drive_time():
    # enough drives that every demotion is admitted (since issue 27 item 2 the searched prefill pool runs
    # faster, so 16 drives no longer absorb them within the write share)
    s, off, tl, inst_s = _prefix_case(32)
    r, r0 = pipeline.evaluate(s, REUSE), pipeline.evaluate(off, REUSE)
    edges = np.cumsum([t.capacity_tokens for t in tl])
    above = np.concatenate([[0.0], edges[:-1]])
    wear = 0.0
    for t, e in zip(tl, above):
        f = REUSE.at(np.array([e]), 16384.0)[0] if e > 0 else 0.0
        b = 16384.0 * (1 - 0.6 * f) * t.bytes_per_token  # every token enters the top tier
        assert t.interference * b / inst_s / t.write_bw < pipeline.WRITE_SHARE_CAP  # all admitted here
        wear += max(0.0, b * t.usd_per_byte_written - t.capex_usd_per_s * inst_s)
    per_m = 1e6 / (16384.0 + 1000.0)
    assert wear > 0 and r.prefix_write_usd_per_mtok == pytest.approx(wear * per_m, rel=1e-9)
    assert r0.prefix_write_usd_per_mtok == 0.0
    parts = (r.gpu_usd_per_mtok + r.tier_usd_per_mtok + r.cold_usd_per_mtok + r.cold_write_usd_per_mtok
             + r.prefix_write_usd_per_mtok)
    assert r.usd_per_mtok == pytest.approx(parts, rel=1e-12)
    # the writes take drive time from the loads: the prefill with hits is slower than without writes
    assert r.prefill_ratio > r0.prefill_ratio and r.usd_per_mtok > r0.usd_per_mtok
    # a DRAM-only layout neither wears nor slows
    dr = pipeline.evaluate(s.replace(layout="dram"), REUSE)
    dr0 = pipeline.evaluate(off.replace(layout="dram"), REUSE)
    assert dr.prefix_write_usd_per_mtok == 0.0 and dr.prefill_ratio == dr0.prefill_ratio


def test_prefix_demotions_beyond_the_drive_share_are_not_admitted():
    s, _, tl, inst_s = _prefix_case(2)
    written, keep, admit, _ = pipeline.prefix_writes(s, tl, REUSE, inst_s)
    nv = tl[-1]
    assert admit[-1] < 1 and admit[:-1] == [1.0] * (len(tl) - 1)
    # the admitted demotions take exactly the declared share of the drive; reads keep the rest
    assert nv.interference * written[-1] / inst_s / nv.write_bw == pytest.approx(pipeline.WRITE_SHARE_CAP)
    assert keep[-1] == pytest.approx(1 - pipeline.WRITE_SHARE_CAP)
    e = tl[0].capacity_tokens + tl[1].capacity_tokens
    demand = 16384.0 * (1 - 0.6 * REUSE.at(np.array([e]), 16384.0)[0]) * nv.bytes_per_token
    assert written[-1] == pytest.approx(demand * admit[-1], rel=1e-12)
