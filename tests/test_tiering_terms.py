"""Every term of chapter 2's TTFT and cost per token pinned by a closed form on a small case.

Deleting or altering any term (a tier's fixed latency, the load/compute overlap rule, the GPU-link
cap on CXL bandwidth, the DRAM energy cost, ...) changes one of these numbers beyond rounding."""
from __future__ import annotations

import numpy as np
import pytest

from analysis import forward as fw
from analysis.specs import gpu as _gpu
from analysis.specs import hardware as _hw
from analysis.specs import model as _model
from analysis.tiering import from_requests, lru_hit_curve
from analysis.tiering import prefill as PF
from analysis.tiering import replay as R
from analysis.tiering import tiers as T

REL = 1e-12


def _energy(power_w, d):
    return power_w * d.pue * d.electricity_usd_per_j


# ------------------------------------------------------------------------------ tiers


def test_pcie_switch_sharing_halves_the_host_links():
    d = T.Deployment()
    g = _gpu(d.gpu)["pcie_bandwidth"] / 2
    assert d.gpu_link_bw == pytest.approx(8 * g)
    shared = d.replace(gpus_per_pcie_switch=2)
    assert shared.gpu_link_bw == pytest.approx(4 * g)
    assert d.replace(tp=3, gpus_per_pcie_switch=2).gpu_link_bw == pytest.approx(2 * g)
    assert T.build_tier("dram", shared).bandwidth == pytest.approx(d.bw_eff * 4 * g)
    with pytest.raises(ValueError, match="gpus_per_pcie_switch"):
        d.replace(gpus_per_pcie_switch=0)


def test_dram_tier_closed_form_and_its_energy_term():
    d = T.Deployment()
    dr = _hw(d.dram_name, "dram")
    link = d.tp * _gpu(d.gpu)["pcie_bandwidth"] / 2
    host = dr["bandwidth_per_socket"] * dr["sockets_per_node"]
    t = T.build_tier("dram", d)
    assert t.bandwidth == pytest.approx(d.bw_eff * min(link, host), rel=REL) and t.limit == "GPU host links"
    power = d.local_dram_bytes / dr["module_capacity"] * dr["power"]
    capex = d.local_dram_bytes * d.dram_usd_per_byte / d.storage_lifetime_s
    assert t.usd_per_s == pytest.approx(capex + _energy(power, d), rel=REL)
    assert t.latency_s == 2e-6
    assert t.capacity_tokens == pytest.approx(d.local_dram_bytes / d.kv_bytes_per_token)
    # the energy term alone: tripling the electricity price adds exactly twice the energy cost
    t3 = T.build_tier("dram", d.replace(electricity_usd_per_j=3 * d.electricity_usd_per_j))
    assert t3.usd_per_s - t.usd_per_s == pytest.approx(2 * _energy(power, d), rel=1e-9)
    # enough GPUs and host DRAM becomes the bound
    big = T.build_tier("dram", d.replace(tp=32))
    assert big.bandwidth == pytest.approx(d.bw_eff * host, rel=REL) and big.limit == "host DRAM"


@pytest.mark.parametrize("devices", [1, 4, 32])
def test_cxl_tier_capped_by_gpu_links(devices):
    d = T.Deployment(cxl_devices=devices)
    c = _hw(d.cxl_name, "cxl")
    t = T.build_tier("cxl", d)
    raw = devices * c["bandwidth"]
    assert t.bandwidth == pytest.approx(d.bw_eff * min(raw, d.gpu_link_bw), rel=REL)
    assert t.limit == ("CXL devices" if raw <= d.gpu_link_bw else "GPU host links")
    cap = devices * c["capacity"]
    assert t.usd_per_s == pytest.approx(cap * d.cxl_usd_per_byte / d.storage_lifetime_s
                                        + _energy(devices * c["power"], d), rel=REL)
    assert t.latency_s == pytest.approx(2e-6 + c["read_latency"])


def test_ssd_and_pool_tiers_closed_form():
    d = T.Deployment()
    s = _hw(d.nvme_name, "ssd")
    t = T.build_tier("nvme", d)
    n = d.nvme_drives
    assert t.bandwidth == pytest.approx(d.bw_eff * min(n * s["seq_read"], d.gpu_link_bw,
                                                       n * s["interface_bandwidth"]), rel=REL)
    assert t.latency_s == s["read_latency"]
    assert t.usd_per_s == pytest.approx(n * s["capacity"] * d.nvme_usd_per_byte / d.storage_lifetime_s
                                        + _energy(n * s["power"], d), rel=REL)
    nic = _hw(d.nic_name, "nic")
    p = T.build_tier("pool", d)
    assert p.bandwidth == pytest.approx(d.bw_eff * min(d.nics_per_instance * nic["bandwidth"], d.gpu_link_bw),
                                        rel=REL)
    assert p.latency_s == d.rdma_latency_s and not p.local
    dr = _hw(d.dram_name, "dram")
    cap = d.pool_nodes * d.pool_bytes_per_node
    assert p.usd_per_s == pytest.approx(cap * d.dram_usd_per_byte / d.storage_lifetime_s
                                        + _energy(cap / dr["module_capacity"] * dr["power"], d), rel=REL)


# ------------------------------------------------------------------------------ replay


def _tiny():
    reqs = [
        {"timestamp": 0, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]},
        {"timestamp": 100, "input_length": 2000, "output_length": 1, "hash_ids": [1, 2, 3, 4]},
        {"timestamp": 150, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]},
        {"timestamp": 5000, "input_length": 700, "output_length": 1, "hash_ids": [9, 10]},
    ]
    tr = from_requests(reqs, name="tiny")
    return tr, lru_hit_curve(tr)


def _closed_form_service(tr, hits, tiers, d, factor=None):
    """The replay's formula written out: compute of the new tokens after the prefix, load of each
    tier's hit tokens (at the read bandwidth left by writes) plus its latency when it serves any,
    overlapped layer by layer."""
    factor = np.ones(len(tiers)) if factor is None else factor
    L = tr.input_tokens.astype(float)
    n_new = L - hits.sum(axis=1)
    comp = PF.prefill_time(d, n_new, L - n_new)
    load = np.zeros_like(L)
    for j, t in enumerate(tiers):
        if np.isfinite(t.bandwidth):
            bw = t.bandwidth * factor[j]
            load += np.where(hits[:, j] > 0, hits[:, j] * t.bytes_per_token / bw + t.latency_s, 0.0)
    layers = _model(d.model).n_layers
    return comp, load, np.maximum(comp, load) + np.minimum(comp, load) / layers


@pytest.mark.parametrize("drives,bw", [(16, 0.0), (1, 0.0)])  # compute-bound; load-bound
def test_service_time_closed_form(drives, bw):
    tr, hc = _tiny()
    d = T.Deployment(hbm_cache_fraction=0.0, local_dram_bytes=0.0, nvme_drives=drives, nvme_bw_override=bw)
    tiers = T.build_tiers("nvme", d)
    svc = R.service_times(tr, hc, tiers, d, config="nvme", writes=False)
    # by hand: request 1 reuses its 3 blocks (1536 tokens) from the NVMe tier; request 2 reuses them
    # but must compute its last token (1535 from NVMe); requests 0 and 3 are cold
    expect = np.zeros((4, 3))
    expect[1, 2], expect[2, 2] = 1536, 1535
    np.testing.assert_array_equal(svc.hit_tokens, expect)
    comp, load, total = _closed_form_service(tr, expect, tiers, d)
    np.testing.assert_allclose(svc.compute_s, comp, rtol=REL)
    np.testing.assert_allclose(svc.load_s, load, rtol=REL)
    np.testing.assert_allclose(svc.service_s, total, rtol=REL)
    # the tier's latency is in the load time, and only for requests that load something
    nv = tiers[2]
    assert svc.load_s[1] == pytest.approx(1536 * nv.bytes_per_token / nv.bandwidth + nv.latency_s, rel=REL)
    assert svc.load_s[0] == 0.0 and svc.load_s[3] == 0.0
    # overlap: neither the plain sum nor the plain max
    assert svc.service_s[1] < svc.compute_s[1] + svc.load_s[1]
    assert svc.service_s[1] > max(svc.compute_s[1], svc.load_s[1])
    if drives == 1:
        assert svc.load_s[1] > svc.compute_s[1]  # the load-bound branch of the overlap rule
    else:
        assert svc.load_s[1] < svc.compute_s[1]
    full = PF.prefill_time(d, tr.input_tokens.astype(float), 0.0)
    np.testing.assert_allclose(svc.nocache_s, full, rtol=REL)
    assert np.all(svc.service_s[1:3] < full[1:3])


def test_slow_tier_recomputes_instead():
    """When loading the prefix (overlapped) is slower than recomputing the prompt, the request
    recomputes and uses none of its cached tokens."""
    tr, hc = _tiny()
    d = T.Deployment(hbm_cache_fraction=0.0, local_dram_bytes=0.0, nvme_drives=2, nvme_bw_override=0.05e9)
    tiers = T.build_tiers("nvme", d)
    svc = R.service_times(tr, hc, tiers, d, config="nvme", writes=False)
    assert svc.hit_tokens.sum() == 0 and np.all(svc.load_s == 0)
    np.testing.assert_allclose(svc.service_s, svc.nocache_s, rtol=REL)
    would = np.array([[0, 0, 0], [0, 0, 1536], [0, 0, 1535], [0, 0, 0]])
    _, _, total = _closed_form_service(tr, would, tiers, d)
    assert np.all(total[1:3] > svc.nocache_s[1:3])   # loading would have been slower


def test_outcome_and_costs_closed_form():
    tr, hc = _tiny()
    d = T.Deployment(hbm_cache_fraction=0.0, local_dram_bytes=0.0)
    econ = R.Economics(gpu_usd_per_s=1e-3, slo_s=0.05)
    for cfg in ("nvme", "pool"):
        tiers = T.build_tiers(cfg, d)
        svc = R.service_times(tr, hc, tiers, d, config=cfg)
        local = sum(t.usd_per_s for t in tiers if t.local)
        pooled = sum(t.usd_per_s for t in tiers if not t.local)
        assert (pooled > 0) == (cfg == "pool")
        dur = float(tr.arrival_s[-1] - tr.arrival_s[0])
        tok = float(tr.input_tokens.sum())
        B = svc.service_s.sum()

        def worn(inst_s):  # a drive costs the larger of its amortisation and its wear
            return sum(max(0.0, w * t.usd_per_byte_written - inst_s * t.capex_usd_per_s)
                       for w, t in zip(svc.written_bytes, tiers) if t.usd_per_byte_written)

        busy = (B * (d.tp * econ.gpu_usd_per_s + local) + pooled * dur + worn(B)) / tok * 1e6
        assert R.busy_cost_per_mtok(svc, d, econ, dur, tok) == pytest.approx(busy, rel=REL)
        o = R.outcome(tr, svc, d, econ, 1)
        # one instance, FCFS: request i starts when it arrives or when i-1 ends
        start, end = [], 0.0
        for a, s in zip(tr.arrival_s, svc.service_s):
            st = max(a, end)
            start.append(st)
            end = st + s
        ttft = np.asarray(start) - tr.arrival_s + svc.service_s
        np.testing.assert_allclose(o.ttft_s, ttft, rtol=REL)
        assert o.attainment == pytest.approx(np.mean(ttft <= econ.slo_s))
        cl = ((d.tp * econ.gpu_usd_per_s + local + pooled) * dur + worn(dur)) / tok * 1e6
        assert o.cluster_usd_per_mtok == pytest.approx(cl, rel=REL)
        assert o.gpu_seconds == pytest.approx(svc.service_s.sum() * d.tp, rel=REL)
        saved = (svc.nocache_s.sum() - svc.service_s.sum()) * d.tp
        assert o.gpu_seconds_saved == pytest.approx(saved, rel=REL)
        assert o.hit_rate == pytest.approx(svc.hit_tokens.sum() / tok)


def test_service_time_with_writes_is_the_fixed_point():
    """With nothing in HBM or DRAM every block accessed is demoted (written) to the NVMe tier; the
    writes per busy instance-second take drive time from reads by the mixed-load rule."""
    tr, hc = _tiny()
    d = T.Deployment(hbm_cache_fraction=0.0, local_dram_bytes=0.0, nvme_drives=16, nvme_write_bw=2e9)
    tiers = T.build_tiers("nvme", d)
    svc = R.service_times(tr, hc, tiers, d, config="nvme")
    nv = tiers[2]
    assert svc.written_bytes[2] == pytest.approx(tr.block_tokens.sum() * nv.bytes_per_token)
    assert svc.written_bytes[0] == 0 and svc.written_bytes[1] == 0
    B = svc.service_s.sum()
    k = nv.interference
    f = 1 - k * (svc.written_bytes[2] / B) / nv.write_bw
    assert 0 < f < 1 and svc.read_factor[2] == pytest.approx(f, rel=1e-9)
    comp, load, total = _closed_form_service(tr, svc.hit_tokens, tiers, d, svc.read_factor)
    np.testing.assert_allclose(svc.load_s, load, rtol=REL)
    np.testing.assert_allclose(svc.service_s, total, rtol=REL)
    dry = R.service_times(tr, hc, tiers, d, config="nvme", writes=False)
    assert svc.load_s[1] > dry.load_s[1]


def test_prefill_is_the_forward_model_of_one_pass():
    """Chapter 2 prices prefill with chapter 3's forward-pass model (one colocated pass on tp GPUs)
    with chapter 2's compute efficiency; chunking adds one pass per chunk."""
    d = T.Deployment(compute_eff=0.4)
    g = _gpu(d.gpu)
    dev = {"flops": g.flops("bf16"), "attn_flops": g.flops("bf16"), "bw": g["hbm_bandwidth"],
           "link": g["nvlink_bandwidth"] / 2}
    eff = fw.Efficiency().replace(compute=0.4)
    want = fw.colocated_pass_time(fw.shape(d.model), fw.Precision(), eff, dev, tp=8.0, dp=1.0, pre_seqs=1.0,
                                  pre_len=np.array([512.0, 4096.0]), pre_prefix=np.array([0.0, 1024.0]))
    np.testing.assert_allclose(PF.prefill_time(d, [512, 4096], [0, 1024]), want, rtol=REL)
    one = PF.prefill_time(d, 8192, 0)
    two = PF.chunked_prefill_time(d, 8192, 0, chunk_tokens=4096)
    np.testing.assert_allclose(two, PF.prefill_time(d, 4096, 0) + PF.prefill_time(d, 4096, 4096), rtol=REL)
    assert two > one  # a second pass pays the weights and overheads again
    assert PF.efficiency(d).compute == 0.4


def _spaced(reqs, gap_ms=10**7):
    return from_requests([{**r, "timestamp": i * gap_ms} for i, r in enumerate(reqs)], name="spaced")


def test_batched_ttft_closed_forms():
    d = T.Deployment(hbm_cache_fraction=0.0, local_dram_bytes=0.0, nvme_drives=1)
    tr, _ = _tiny()
    tr = _spaced([{"input_length": int(L), "output_length": 1, "hash_ids": tr.request_blocks(i).tolist()}
                  for i, L in enumerate(tr.input_tokens)])
    hc = lru_hit_curve(tr)
    svc = R.service_times(tr, hc, T.build_tiers("nvme", d), d, config="nvme", writes=False)
    arr = tr.arrival_s
    # alone and in one chunk: the step is the request's pass, or its prefix load if longer
    t1 = R.batched_ttft(tr, svc, d, arr, 1, 1 << 20)
    np.testing.assert_allclose(t1, np.maximum(svc.compute_s, svc.load_s), rtol=1e-9)
    # alone in chunks of 512: one pass per chunk
    t2 = R.batched_ttft(tr, svc, d, arr, 1, 512)
    n_new = tr.input_tokens - svc.hit_tokens.sum(axis=1)
    want = PF.chunked_prefill_time(d, n_new, svc.hit_tokens.sum(axis=1), 512)
    cold = svc.load_s == 0
    np.testing.assert_allclose(t2[cold], want[cold], rtol=1e-9)
    # two cold requests arriving together share one step: the fixed part is paid once
    two = from_requests([{"timestamp": 0, "input_length": 300, "output_length": 1, "hash_ids": [1]},
                         {"timestamp": 0, "input_length": 200, "output_length": 1, "hash_ids": [2]}])
    s2 = R.service_times(two, lru_hit_curve(two), T.build_tiers("nvme", d), d, writes=False)
    tb = R.batched_ttft(two, s2, d, two.arrival_s, 1, 8192)
    F = float(PF.prefill_time(d, 1.0, 0.0))
    assert tb[0] == pytest.approx(tb[1]) and tb[0] == pytest.approx(s2.compute_s.sum() - F, rel=1e-9)
    fcfs = R.fcfs_start_times(two.arrival_s, s2.service_s, 1) + s2.service_s
    assert tb.max() < fcfs.max()
    # two instances: each takes one
    np.testing.assert_allclose(R.batched_ttft(two, s2, d, two.arrival_s, 2, 8192), s2.compute_s, rtol=1e-9)
    with pytest.raises(ValueError, match="chunk_tokens"):
        R.Economics(1e-3, 1.0, chunk_tokens=-1)
