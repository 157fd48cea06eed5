"""The write path: bytes written per tier against an explicit-stack simulator, drive ratings, wear."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_tiering_hitcurve import random_requests  # noqa: E402

from analysis.specs import hardware  # noqa: E402
from analysis.tiering import endurance as E  # noqa: E402
from analysis.tiering import from_requests, load_trace, lru_hit_curve  # noqa: E402
from analysis.tiering import replay as R  # noqa: E402
from analysis.tiering import tiers as T  # noqa: E402


def stack_writes(tr, tier_blocks):
    """Explicit LRU stack (list, most recent first); a block written into tier j each time it moves
    from depth E_{j-1} to E_{j-1} + 1 (depth = 1-based position), or on use when E_{j-1} = 0."""
    edges = np.cumsum(tier_blocks)[:-1]
    stack: list = []
    out = np.zeros(len(tier_blocks))
    ids = tr.block_ids.tolist()
    tok = tr.block_tokens.tolist()
    tok_of = {}
    for x, w in zip(ids, tok):
        if x in stack:
            p = stack.index(x)
            stack.pop(p)
            moved = range(0, p)          # the blocks above it sink one place
        else:
            moved = range(0, len(stack))
        for q in moved:
            for j, e in enumerate(edges):
                if q + 1 == e and tier_blocks[j + 1] > 0:  # depth q+1 -> q+2 crosses edge e
                    out[j + 1] += tok_of[stack[q]]
        stack.insert(0, x)
        tok_of[x] = w
        for j, e in enumerate(edges):  # a tier of no capacity passes the block on at once
            if e == 0 and tier_blocks[j + 1] > 0:
                out[j + 1] += w
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("caps", [[2, 3, 5], [0, 4, 100], [1, 0, 3, 2], [5, 5]])
def test_written_tokens_equal_explicit_stack(seed, caps):
    tr = from_requests(random_requests(seed, n_req=60), name="r")
    hc = lru_hit_curve(tr)
    np.testing.assert_allclose(E.written_tokens(tr, hc, caps), stack_writes(tr, caps))


def test_written_tokens_real_trace_and_bounds():
    tr = load_trace("mooncake_conversation").head(1500)
    hc = lru_hit_curve(tr)
    caps = [60, 120, 10**9]
    w = E.written_tokens(tr, hc, caps)
    assert w[0] == 0 and 0 < w[2] <= w[1] <= tr.block_tokens.sum()
    small = tr.head(80)
    np.testing.assert_allclose(E.written_tokens(small, lru_hit_curve(small), caps), stack_writes(small, caps))
    # a bigger first tier absorbs more reuse: never more writes below it
    w2 = E.written_tokens(tr, hc, [120, 60, 10**9])
    assert w2[1] <= w[1]
    with pytest.raises(ValueError, match="capacities"):
        E.written_tokens(tr, hc, [1, -2])


def test_drive_rating_closed_form_and_datasheet_tbw():
    r = E.drive_rating("Micron-9550-MAX-25.6TB")
    s = hardware("Micron-9550-MAX-25.6TB", "ssd")
    assert r["tbw_bytes"] == pytest.approx(3 * 25.6e12 * 5 * 365.25)
    assert r["tbw_bytes"] == pytest.approx(s["tbw_random"], rel=1e-3)  # the datasheet's TBW (365-day years)
    # k from the 70/30 figure: 0.7 X / R + k 0.3 X / W = 1
    k = E.write_interference("Micron-9550-MAX-25.6TB")
    assert 0.7 * 1.3 / 3.3 + k * 0.3 * 1.3 / 1.2 == pytest.approx(1.0)
    assert E.read_factor(0.0, 10e9, k) == 1.0 and E.read_factor(10e9 / k, 10e9, k) == 0.0
    assert E.read_factor(1e9, 10e9, k) == pytest.approx(1 - k * 0.1)


@pytest.mark.parametrize("kw,msg", [({"nvme_dwpd": 0.0}, "nvme_dwpd"),
                                    ({"nvme_write_bw": -1e9}, "nvme_write_bw"),
                                    ({"qlc_dwpd": float("nan")}, "qlc_dwpd"),
                                    ({"write_amplification": 0.0}, "write_amplification")])
def test_bad_drive_inputs_fail_before_work(kw, msg):
    with pytest.raises(ValueError, match=msg):
        T.Deployment().replace(**kw)
    with pytest.raises(ValueError, match="endurance must be > 0"):
        E.drive_rating("Micron-9550-MAX-25.6TB", dwpd=0.0)
    with pytest.raises(ValueError, match="write bandwidth must be > 0"):
        E.drive_rating("Micron-9550-MAX-25.6TB", write_bw=-5.0)


def test_ssd_tier_wear_price():
    d = T.Deployment(write_amplification=2.0)
    t = T.build_tier("nvme", d)
    s = hardware(d.nvme_name, "ssd")
    tbw = d.nvme_drives * 3 * s["capacity"] * s["warranty"] / 86400
    assert t.tbw_bytes == pytest.approx(tbw)
    price = d.nvme_drives * s["capacity"] * d.nvme_usd_per_byte
    assert t.usd_per_byte_written == pytest.approx(price / tbw * 2.0, rel=1e-9, abs=0)
    assert t.write_bw == pytest.approx(d.bw_eff * d.nvme_drives * s["seq_write"])
    assert T.build_tier("dram", d).usd_per_byte_written == 0.0


def test_endurance_decides_when_wear_exceeds_amortisation():
    reqs = [{"timestamp": 10 * i, "input_length": 1024, "output_length": 1, "hash_ids": [2 * i, 2 * i + 1]}
            for i in range(50)]
    tr = from_requests(reqs, name="cold")
    hc = lru_hit_curve(tr)
    econ = R.Economics(1e-3, 5.0)
    costs = []
    for dwpd in (100.0, 1.0, 0.01):
        d = T.Deployment(hbm_cache_fraction=0.0, local_dram_bytes=0.0, qlc_dwpd=dwpd)
        svc = R.service_times(tr, hc, T.build_tiers("qlc", d), d, config="qlc")
        w = R.wear(svc, float(svc.service_s.sum()))[2]
        assert w["written_bytes"] == pytest.approx(tr.block_tokens.sum() * d.kv_bytes_per_token)
        assert w["endurance_decides"] == (w["wear_usd"] > w["amortised_usd"])
        costs.append(R.busy_cost_per_mtok(svc, d, econ, 500.0, float(tr.input_tokens.sum())))
        if dwpd == 0.01:
            assert w["endurance_decides"]
    assert costs[0] <= costs[1] < costs[2]
