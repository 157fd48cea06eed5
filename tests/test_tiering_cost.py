"""Load-vs-recompute (Mooncake Eq. 2), the tier cost model and the trace replay."""
from __future__ import annotations

import numpy as np
import pytest

from analysis import data
from analysis.specs import UnknownNameError
from analysis.tiering import load_trace, lru_hit_curve
from analysis.tiering import loadcompute as L
from analysis.tiering import replay as R
from analysis.tiering import tiers as T


@pytest.fixture(scope="module")
def small():
    tr = load_trace("mooncake_conversation").head(2500)
    return tr, lru_hit_curve(tr)


@pytest.mark.parametrize(
    "gpu,key", [("A800-SXM4-80GB", "mooncake_eq2_a800"), ("H800-SXM5-80GB", "mooncake_eq2_h800")]
)
def test_mooncake_eq2_within_10_percent(gpu, key):
    pub = data.published(key)
    b = L.reuse_bandwidth_needed("Llama-3.1-70B", gpu, 8192, n_gpus=8)
    assert abs(b / (pub["value"] * 1e9) - 1) <= 0.10


def test_reuse_bandwidth_scales_with_gpu_speed_and_rejects_bad_prefix():
    a = L.reuse_bandwidth_needed("Llama-3.1-70B", "A800-SXM4-80GB", 8192, n_gpus=8)
    h = L.reuse_bandwidth_needed("Llama-3.1-70B", "H800-SXM5-80GB", 8192, n_gpus=8)
    assert h / a == pytest.approx(989 / 312, rel=1e-6)  # FLOPs only: proportional to peak FLOP/s
    # longer prefixes are dearer to recompute per token (quadratic term): less bandwidth needed
    bw = L.reuse_bandwidth_needed("Llama-3.1-70B", "H800-SXM5-80GB", np.array([1024, 8192, 131072]), n_gpus=8)
    assert np.all(np.diff(bw) < 0)
    for f in (L.reuse_bandwidth_needed, L.breakeven_bandwidth):
        for bad in (0, -5, np.nan):
            with pytest.raises(ValueError, match="prefix_tokens"):
                f("Llama-3.1-70B", "H800-SXM5-80GB", bad)
        with pytest.raises(ValueError, match="n_gpus"):
            f("Llama-3.1-70B", "H800-SXM5-80GB", 8192, n_gpus=0)


def test_breakeven_bandwidth_is_kv_over_the_time_models_prefill():
    """Load vs recompute with recomputation timed by the one time model (not the closed form): the
    KV bytes of the prefix over one prefill pass of it on an instance of ``n_gpus`` GPUs; slower
    recomputation (weight reads, all-reduces, overheads, compute efficiency) lowers the threshold
    below the paper's closed form (:func:`reuse_bandwidth_needed`) at the same compute efficiency."""
    from analysis import forward as fw
    from analysis import kv

    m, g = "Llama-3.1-70B", "H800-SXM5-80GB"
    b = L.breakeven_bandwidth(m, g, 8192, n_gpus=8, compute_eff=0.5)
    t = fw.prefill_time(m, g, 8192, 0, tp=8, eff=fw.Efficiency().replace(compute=0.5))
    assert b == pytest.approx(kv.kv_bytes(m, 8192) / float(t), rel=1e-12)
    assert b < L.reuse_bandwidth_needed(m, g, 8192, n_gpus=8, compute_eff=0.5)
    o = L.overlap_bandwidth_needed(m, g, 8192, 1024, n_gpus=8)
    t = fw.prefill_time(m, g, 1024, 8192, tp=8, eff=fw.Efficiency().replace(compute=1.0))
    assert o == pytest.approx(kv.kv_bytes(m, 8192) / float(t), rel=1e-12)


def test_implied_coefficient_consistent_between_gpus():
    a = L.implied_eq1_coefficient("Llama-3.1-70B", "A800-SXM4-80GB", 8192, 6e9, n_gpus=8)
    h = L.implied_eq1_coefficient("Llama-3.1-70B", "H800-SXM5-80GB", 8192, 19e9, n_gpus=8)
    ours = L.our_eq1_coefficient("Llama-3.1-70B", 8192)
    assert a == pytest.approx(h, rel=0.02)
    assert ours["weights"] == pytest.approx(25.5, rel=0.01) and ours["total"] > a


# ------------------------------------------------------------------------------ tiers


def test_deployment_rejects_nonsense():
    d = T.Deployment()
    for kw, msg in [
        ({"dram_usd_per_byte": -1.0}, "dram_usd_per_byte"),
        ({"compute_eff": 1.5}, "compute_eff"),
        ({"compute_eff": 0.0}, "compute_eff"),
        ({"data_path": "magic"}, "data_path"),
        ({"ai_ssd_bits": 7}, "ai_ssd_bits"),
        ({"pue": 0.5}, "pue"),
        ({"nvme_drives": float("nan")}, "nvme_drives"),
    ]:
        with pytest.raises(ValueError, match=msg):
            d.replace(**kw)
    with pytest.raises(UnknownNameError, match="Allowed"):
        d.replace(gpu="H900")
    with pytest.raises(ValueError, match="unknown configuration"):
        T.build_tiers("tape", d)


def test_cpu_bounce_never_faster_and_capped_by_copy_cores():
    d = T.Deployment(nvme_drives=8)
    direct = T.build_tier("nvme", d)
    bounce = T.build_tier(
        "nvme", d.replace(data_path="cpu_bounce", cpu_copy_cores=2, cpu_copy_bw_per_core=5e9)
    )
    assert bounce.bandwidth <= direct.bandwidth
    assert bounce.bandwidth == pytest.approx(d.bw_eff * 2 * 5e9) and bounce.limit == "CPU copy cores"


def test_ai_ssd_quantization_shrinks_bytes_and_plausibility():
    d = T.Deployment()
    t4 = T.build_tier("ai_ssd", d)
    t16 = T.build_tier("ai_ssd", d.replace(ai_ssd_bits=16))
    assert t4.bytes_per_token * 4 == pytest.approx(t16.bytes_per_token)
    assert t4.token_rate == pytest.approx(4 * t16.token_rate)
    p = T.ai_ssd_plausibility(d)
    assert 0 < p["seq_fraction_of_ceiling"] < 1 and p["tops_headroom_quant"] > 1


def test_hbm_tier_is_what_weights_leave():
    d = T.Deployment(model="Llama-3.1-70B", gpu="H800-SXM5-80GB", tp=8, hbm_cache_fraction=1.0)
    from analysis import kv

    free = 8 * 80e9 - kv.weight_bytes("Llama-3.1-70B")
    assert T.hbm_cache_tokens(d) == pytest.approx(free / kv.kv_bytes_per_token_all_layers("Llama-3.1-70B"))


# ------------------------------------------------------------------------------ replay


def _econ(d, **kw):
    return R.Economics(T.gpu_usd_per_s(d), **{"slo_s": 5.0, **kw})


def test_cost_non_increasing_in_bandwidth_and_non_decreasing_in_price(small):
    tr, hc = small
    d = T.Deployment(local_dram_bytes=50e9, nvme_drives=4)  # 4 drives: the writes fit beside the reads
    econ = _econ(d)
    dur, tok = float(tr.arrival_s[-1]), float(tr.input_tokens.sum())

    def cost(dd, ee=econ, cfg="nvme"):
        return R.busy_cost_per_mtok(R.service_times(tr, hc, T.build_tiers(cfg, dd), dd), dd, ee, dur, tok)

    bw = [cost(d.replace(nvme_bw_override=b * 1e9)) for b in (0.5, 1, 2, 4, 8, 14, 30)]
    assert np.all(np.diff(bw) <= 1e-12) and bw[0] > bw[-1]
    pr = [cost(d.replace(nvme_usd_per_byte=p * 1e-12)) for p in (0, 50, 150, 500)]
    assert np.all(np.diff(pr) >= 0) and pr[-1] > pr[0]
    dr = [cost(d.replace(dram_usd_per_byte=p * 1e-9)) for p in (1, 5, 20)]
    assert np.all(np.diff(dr) > 0)
    gp = [cost(d, R.Economics(r / 3600, 5.0)) for r in (1.0, 2.0, 4.0)]
    assert np.all(np.diff(gp) > 0)
    pool = [cost(d.replace(nics_per_instance=n), cfg="pool") for n in (1, 2, 4, 8)]
    assert np.all(np.diff(pool) <= 1e-12)


def test_replay_invariants(small):
    tr, hc = small
    d = T.Deployment()
    econ = _econ(d)
    svc = R.service_times(tr, hc, T.build_tiers("nvme", d), d, config="nvme")
    assert np.all(svc.hit_tokens.sum(axis=1) <= tr.input_tokens - 1)
    assert np.all(svc.service_s >= np.maximum(svc.compute_s, svc.load_s))
    hbm_only = R.service_times(tr, hc, T.build_tiers("hbm", d), d)
    assert svc.hit_tokens.sum() >= hbm_only.hit_tokens.sum()
    att = [R.outcome(tr, svc, d, econ, n).attainment for n in (1, 2, 3, 6)]
    assert np.all(np.diff(att) >= 0)
    o = R.size_for_slo(tr, svc, d, econ)
    assert o is not None and o.attainment >= econ.attainment_target
    if o.n_instances > 1:
        assert R.outcome(tr, svc, d, econ, o.n_instances - 1).attainment < econ.attainment_target


def test_fcfs_by_hand_and_errors():
    start = R.fcfs_start_times(np.array([0.0, 0.0, 1.0, 10.0]), np.array([2.0, 2.0, 2.0, 1.0]), 2)
    assert start.tolist() == [0.0, 0.0, 2.0, 10.0]
    with pytest.raises(ValueError, match="n_instances"):
        R.fcfs_start_times(np.array([0.0]), np.array([1.0]), 0)
    for kw, msg in [
        ({"gpu_usd_per_s": 0.0, "slo_s": 1.0}, "gpu_usd_per_s"),
        ({"gpu_usd_per_s": 1.0, "slo_s": -1.0}, "slo_s"),
        ({"gpu_usd_per_s": 1.0, "slo_s": 1.0, "attainment_target": 1.5}, "attainment_target"),
    ]:
        with pytest.raises(ValueError, match=msg):
            R.Economics(**kw)


def test_pareto_front():
    pts = [(1, 5), (2, 2), (3, 1), (2.5, 2.5), (4, 4), (np.nan, 1)]
    assert R.pareto_front(pts).tolist() == [True, True, True, False, False, False]
