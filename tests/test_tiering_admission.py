"""Admission and eviction with libCacheSim: its LRU equals the exact one-pass curve; admission and
Belady behave as defined; costs are priced from the simulated hits and writes."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_tiering_hitcurve import random_requests  # noqa: E402

from analysis.tiering import admission as A  # noqa: E402
from analysis.tiering import from_requests, load_trace, lru_hit_curve  # noqa: E402
from analysis.tiering import policies as P  # noqa: E402
from analysis.tiering import replay as R  # noqa: E402
from analysis.tiering import tiers as T  # noqa: E402


@pytest.fixture(scope="module")
def real():
    tr = load_trace("mooncake_conversation").head(3000)
    return tr, lru_hit_curve(tr)


def _same(a, b):
    for k in ("hit_blocks", "hit_tokens", "access_hits", "written_blocks", "written_tokens"):
        assert a[k] == b[k], k
    np.testing.assert_array_equal(a["per_request_hit_tokens"], b["per_request_hit_tokens"])


@pytest.mark.parametrize("cap", [1, 7, 300, 2000, 10**6])
def test_library_lru_equals_one_pass_curve(real, cap):
    tr, hc = real
    lib = A.simulate(tr, cap, "lru", "all", hc, library_lru=True)
    assert lib["hit_blocks"] == int(hc.block_hits(cap)) and lib["hit_tokens"] == int(hc.token_hits(cap))
    _same(lib, A.simulate(tr, cap, "lru", "all", hc))


@pytest.mark.parametrize("seed", range(4))
def test_library_lru_equals_curve_random(seed):
    tr = from_requests(random_requests(seed, dup_prob=0.2), name="r")
    hc = lru_hit_curve(tr)
    for cap in (1, 3, 10, 40):
        _same(A.simulate(tr, cap, "lru", "all", hc, library_lru=True), A.simulate(tr, cap, "lru", "all", hc))


def test_admission_rules(real):
    tr, hc = real
    cap = 500
    full = A.simulate(tr, cap, "lru", "all", hc)
    sec = A.simulate(tr, cap, "lru", "second_use", hc)
    ora = A.simulate(tr, cap, "lru", "oracle_reuse", hc)
    # second use never writes a block on its first access; the oracle only blocks that come back
    _, first = np.unique(tr.block_ids, return_index=True)
    prev_seen = np.ones(tr.n_blocks, dtype=bool)
    prev_seen[first] = False
    assert sec["written_blocks"] <= int(prev_seen.sum())
    reused = int((P.next_use(tr.block_ids) < tr.n_blocks).sum())
    assert ora["written_blocks"] <= reused
    assert sec["written_blocks"] < full["written_blocks"] and ora["written_blocks"] < full["written_blocks"]
    for r in (full, sec, ora):
        assert r["hit_tokens"] == int(r["per_request_hit_tokens"].sum())
        assert r["hit_blocks"] <= r["access_hits"] <= tr.n_blocks


def test_belady_library_matches_own_and_bounds_lru(real):
    tr, hc = real
    for cap in (100, 1000):
        lib = A.simulate(tr, cap, "belady", "all", hc)
        own = P.simulate(tr, cap, "belady")
        assert lib["hit_blocks"] == pytest.approx(own["hit_blocks"], rel=0.01)
        lru = A.simulate(tr, cap, "lru", "all", hc)
        assert lib["access_hits"] >= lru["access_hits"]  # optimal for plain (per-access) caching


def test_other_policies_run_and_are_bounded(real):
    tr, hc = real
    rows = A.curves(tr, [200, 2000], [(p, "all") for p in ("s3fifo", "sieve", "arc", "wtinylfu", "fifo")],
                    use_cache=False)
    for r in rows:
        assert 0 <= r["token_hit_rate"] <= hc.infinite_token_hit_rate + 1e-12
        assert r["written_blocks"] == tr.n_blocks - r["access_hits"]


def test_bad_input():
    tr = from_requests(random_requests(0), name="r")
    with pytest.raises(ValueError, match="eviction policy"):
        A.simulate(tr, 10, "mru")
    with pytest.raises(ValueError, match="admission"):
        A.simulate(tr, 10, "lru", "maybe")
    with pytest.raises(ValueError, match="capacity_blocks"):
        A.simulate(tr, 0)
    with pytest.raises(ValueError, match="eviction policy"):
        A.curves(tr, [5], [("lru", "all"), ("nope", "all")], use_cache=False)


def test_costs_price_writes_and_hits(real):
    tr, hc = real
    d = T.Deployment()
    econ = R.Economics(T.gpu_usd_per_s(d), 5.0)
    rows = A.costs(tr, [A.simulate(tr, 1000, "lru", a, hc) for a in ("all", "second_use")], d, econ)
    full, sec = rows
    nv = T.build_tier("nvme", d)
    hours = tr.arrival_s[-1] / 3600
    tb = full["written_tokens"] * nv.bytes_per_token / 1e12 / hours
    assert full["tb_written_per_h"] == pytest.approx(tb)
    assert full["wear_usd_per_h"] == pytest.approx(full["written_tokens"] * nv.bytes_per_token
                                                   * nv.usd_per_byte_written / hours)
    assert sec["tb_written_per_h"] < full["tb_written_per_h"] and sec["read_factor"] >= full["read_factor"]


def test_costs_price_the_store_pro_rata_to_its_capacity(real):
    """A store of capacity C on ``admission_tier`` drives of total capacity D costs C/D of the drives'
    price per second (capex and energy), never more than the whole drives: with no hits and no
    writes, the busy cost is ``busy_s * (tp * gpu + min(1, C/D) * tier_usd_per_s)`` per token, and
    the tier part is read off by moving the GPU price (the cost is linear in it)."""
    tr, _ = real
    d = T.Deployment()
    nv = T.build_tier("nvme", d)
    D = nv.capacity_tokens
    tokens = float(tr.input_tokens.sum())

    def cost_at(cap_tokens, gpu_usd_per_s):
        row = {"policy": "none", "admission": "none", "capacity_blocks": cap_tokens / tr.block_size,
               "per_request_hit_tokens": np.zeros(tr.n_requests), "written_tokens": 0.0}
        econ = R.Economics(gpu_usd_per_s, 5.0)
        return A.costs(tr, [row], d, econ, "nvme")[0]["busy_usd_per_mtok"] * tokens / 1e6

    g1, g2 = 1e-3, 2e-3
    for frac in (0.01, 0.25, 1.0, 4.0):
        c1, c2 = cost_at(frac * D, g1), cost_at(frac * D, g2)
        gpu_s = (c2 - c1) / (g2 - g1)                  # busy instance-seconds x tp
        busy_s = gpu_s / d.tp
        tier_usd = c1 - gpu_s * g1
        assert tier_usd == pytest.approx(busy_s * nv.usd_per_s * min(1.0, frac), rel=1e-6), frac
