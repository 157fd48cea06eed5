"""A cluster of instances with their own caches under routing policies, and the pooled store."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_tiering_hitcurve import random_requests  # noqa: E402

from analysis.tiering import cluster as CL  # noqa: E402
from analysis.tiering import from_requests, load_trace, lru_hit_curve  # noqa: E402
from analysis.tiering import replay as R  # noqa: E402
from analysis.tiering import tiers as T  # noqa: E402


@pytest.fixture(scope="module")
def real():
    tr = load_trace("mooncake_conversation").head(3000)
    return tr, lru_hit_curve(tr)


@pytest.mark.parametrize("policy", CL.ROUTING)
def test_one_instance_is_the_single_stack(real, policy):
    tr, hc = real
    for cap in (50, 800):
        r = CL.route(tr, 1, policy, cap)
        assert r["per_request_hit_tokens"].sum() == hc.token_hits(cap)
        hits, _ = CL.routed_tier_split(tr, r["assignment"], [cap // 3, cap - cap // 3])
        np.testing.assert_array_equal(hits, hc.tier_split([cap // 3, cap - cap // 3]))


@pytest.mark.parametrize("seed", range(3))
def test_routed_split_equals_per_instance_lru(seed):
    tr = from_requests(random_requests(seed), name="r")
    for policy in CL.ROUTING:
        r = CL.route(tr, 3, policy, 12)
        hits, written = CL.routed_tier_split(tr, r["assignment"], [4, 8])
        np.testing.assert_array_equal(hits.sum(axis=1), r["per_request_hit_tokens"])
        assert written[0] == 0 and written[1] >= 0


def test_routing_policies_behave(real):
    tr, hc = real
    cap = 400
    rr = CL.route(tr, 4, "round_robin", cap)
    assert np.array_equal(rr["assignment"], np.arange(tr.n_requests) % 4)
    assert CL.route(tr, 4, "random", cap, seed=1)["token_hit_rate"] == \
        CL.route(tr, 4, "random", cap, seed=1)["token_hit_rate"]
    aff = CL.route(tr, 4, "prefix_affinity", cap, affinity_blocks=2)
    first2 = [tuple(tr.request_blocks(i)[:2].tolist()) for i in range(tr.n_requests)]
    by = {}
    for f, a in zip(first2, aff["assignment"]):
        by.setdefault(f, set()).add(int(a))
    assert all(len(v) == 1 for v in by.values())       # a shared prefix always meets on one instance
    one = CL.route(tr, 4, "prefix_affinity", cap, affinity_blocks=1)
    assert one["max_share"] == 1.0                       # every prompt begins with the same block
    kv = CL.route(tr, 4, "kv_aware", cap, load_slack_s=1e9)  # no load cap: longest prefix wins
    assert kv["token_hit_rate"] > rr["token_hit_rate"]
    # a tight load cap trades hits for balance
    tight = CL.route(tr, 4, "kv_aware", cap, load_slack_s=0.0, full_s=np.full(tr.n_requests, 50.0))
    assert tight["max_share"] < 0.5 < kv["max_share"]  # uncapped, the shared first block wins every time
    # the pooled store is the single stack at N x the capacity
    assert CL.pooled(hc, 4, cap) == pytest.approx(hc.token_hit_rate(4 * cap))


def test_bad_input(real):
    tr, _ = real
    with pytest.raises(ValueError, match="unknown routing policy"):
        CL.route(tr, 2, "sticky", 10)
    with pytest.raises(ValueError, match="exceeds the trace"):
        CL.route(tr.head(5), 6, "random", 10)
    with pytest.raises(ValueError, match="n_instances"):
        CL.route(tr, 0, "random", 10)
    with pytest.raises(ValueError, match="unknown routing policy"):
        CL.curves(tr, lru_hit_curve(tr.head(10)), [1, 2], ["random", "bogus"], 10, use_cache=False)


def test_routed_service_and_cost(real):
    tr, hc = real
    d = T.Deployment(local_dram_bytes=20e9)
    econ = R.Economics(T.gpu_usd_per_s(d), 5.0)
    tiers = T.build_tiers("dram", d)
    svc1, _ = R.routed_service(tr, tiers, d, 1, "round_robin")
    ideal = R.service_times(tr, hc, tiers, d)
    np.testing.assert_allclose(svc1.service_s, ideal.service_s)   # one instance = the single stack
    svc4, r4 = R.routed_service(tr, tiers, d, 4, "kv_aware")
    # the instances' own stacks give the router's prefix hits (DRAM loads always beat recompute)
    # (a fully cached prompt still computes its last token)
    expect = np.minimum(r4["per_request_hit_tokens"], np.maximum(tr.input_tokens - 1, 0))
    np.testing.assert_array_equal(svc4.hit_tokens.sum(axis=1), expect)
    dur, tok = float(tr.arrival_s[-1]), float(tr.input_tokens.sum())
    assert R.busy_cost_per_mtok(svc4, d, econ, dur, tok) > 0
    with pytest.raises(ValueError, match="local tiers only"):
        R.routed_service(tr, T.build_tiers("pool", d), d, 2, "kv_aware")
