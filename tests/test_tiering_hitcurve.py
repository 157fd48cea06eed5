"""The one-pass LRU prefix-cache curve against the slow reference simulator, and trace reading."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _tiering_reference import lru_prefix_hits, lru_prefix_hits_fast  # noqa: E402

from analysis.tiering import (  # noqa: E402
    TraceError,
    from_requests,
    load_trace,
    lru_hit_curve,
    policies,  # noqa: E402
    stack_distances,
)


def random_requests(seed, n_req=120, n_roots=6, max_len=9, dup_prob=0.0):
    """Requests with shared prefixes: each extends a random earlier prompt's prefix or starts anew."""
    rng = np.random.default_rng(seed)
    next_id = 0
    prompts, reqs = [], []
    for _ in range(n_req):
        if prompts and rng.random() < 0.7:
            base = prompts[rng.integers(len(prompts))]
            keep = base[: rng.integers(0, len(base) + 1)]
        else:
            keep = [int(rng.integers(n_roots))] if rng.random() < 0.5 else []
        n_new = int(rng.integers(0 if keep else 1, max_len))
        new = []
        for _ in range(n_new):
            if new and rng.random() < dup_prob:
                new.append(new[rng.integers(len(new))])
            else:
                new.append(1000 + next_id)
                next_id += 1
        blocks = list(keep) + new
        prompts.append(blocks)
        length = max(1, 512 * (len(blocks) - 1) + int(rng.integers(1, 513))) if blocks else 0
        reqs.append({"timestamp": 0, "input_length": length, "output_length": 5, "hash_ids": blocks})
    return reqs


def _lists(tr):
    reqs = [tr.request_blocks(i).tolist() for i in range(tr.n_requests)]
    toks = [tr.block_tokens[tr.offsets[i]:tr.offsets[i + 1]].tolist() for i in range(tr.n_requests)]
    return reqs, toks


def brute_distances(ids):
    out = []
    for t, x in enumerate(ids):
        prev = [s for s in range(t) if ids[s] == x]
        out.append(len(set(ids[prev[-1] + 1:t])) + 1 if prev else None)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_stack_distances_brute_force(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1 + seed * 3, size=200)
    d = stack_distances(ids)
    u = len(set(ids.tolist()))
    for got, want in zip(d.tolist(), brute_distances(ids.tolist())):
        assert got == (want if want is not None else u + 1)


@pytest.mark.parametrize("seed,dup", [(s, p) for s in range(8) for p in (0.0, 0.2)])
def test_one_pass_equals_reference_on_random_traces(seed, dup):
    tr = from_requests(random_requests(seed, dup_prob=dup))
    hc = lru_hit_curve(tr)
    reqs, toks = _lists(tr)
    n_distinct = len(set(tr.block_ids.tolist()))
    for cap in sorted({0, 1, 2, 3, 5, 8, 13, 21, 34, 55, n_distinct, n_distinct + 7}):
        hb, ht = lru_prefix_hits(reqs, cap, toks)
        assert hc.block_hits(cap) == hb, cap
        assert hc.token_hits(cap) == ht, cap


def test_one_pass_equals_reference_on_real_trace():
    tr = load_trace("mooncake_conversation")
    hc = lru_hit_curve(tr)
    reqs, toks = _lists(tr)
    caps = [0, 1, 57, 1000, 5859, 30000, hc.saturation_blocks - 1, hc.saturation_blocks]
    for cap in caps:
        hb, ht = lru_prefix_hits_fast(reqs, cap, toks)
        assert (hc.block_hits(cap), hc.token_hits(cap)) == (hb, ht), cap
    # the package's own OrderedDict LRU agrees too
    r = policies.simulate(tr, 5859, "lru")
    assert (r["hit_blocks"], r["hit_tokens"]) == (hc.block_hits(5859), hc.token_hits(5859))


def test_curve_monotone_and_bounded_by_infinite_cache():
    tr = load_trace("mooncake_conversation")
    hc = lru_hit_curve(tr)
    caps = np.unique(np.geomspace(1, 4 * tr.n_unique_blocks, 300).astype(int))
    for rate, inf in ((hc.token_hit_rate(caps), hc.infinite_token_hit_rate),
                      (hc.block_hit_rate(caps), hc.infinite_block_hit_rate)):
        assert np.all(np.diff(rate) >= 0)
        assert np.all(rate <= inf + 1e-15)
        assert rate[-1] == pytest.approx(inf)
    # infinite cache = every block seen before at the start of a prompt chain
    assert 0 < hc.infinite_token_hit_rate < 1


@pytest.mark.parametrize("caps", [[2, 5, 11], [0, 3], [1, 10**6], [10**7]])
def test_tier_split_sums_to_total_capacity_hits(caps):
    tr = from_requests(random_requests(3))
    hc = lru_hit_curve(tr)
    split = hc.tier_split(caps)
    total = sum(caps)
    assert split.sum() == hc.token_hits(total)
    assert np.array_equal(split.sum(axis=1), hc.per_request_hit_tokens(total))
    assert split.sum() <= hc.infinite_token_hit_rate * hc.total_tokens
    # the fastest tier serves exactly the hits a cache of its own size would have at the top of the stack
    assert split[:, 0].sum() <= hc.token_hits(caps[0])


@pytest.mark.parametrize("seed", range(3))
def test_other_policies_bounded(seed):
    tr = from_requests(random_requests(seed, n_req=80))
    hc = lru_hit_curve(tr)
    for cap in (3, 10, 40):
        bel = policies.simulate(tr, cap, "belady")["hit_blocks"]
        lfu = policies.simulate(tr, cap, "lfu")["hit_blocks"]
        assert 0 <= lfu <= hc.block_hits(10**9)
        assert 0 <= bel <= hc.block_hits(10**9)
        assert policies.simulate(tr, cap, "lru")["hit_blocks"] == hc.block_hits(cap)
    with pytest.raises(ValueError, match="unknown policy"):
        policies.simulate(tr, 3, "fifo")
    with pytest.raises(ValueError, match="capacity_blocks"):
        policies.simulate(tr, -1, "lfu")


# ------------------------------------------------------------------------------ trace errors

def _write(tmp_path, lines):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


GOOD = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]})


@pytest.mark.parametrize("bad,msg", [
    ('{"timestamp": 0, "input_length": 600', "not valid JSON"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 3}', "missing field 'hash_ids'"),
    ('{"timestamp": -5, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}', "timestamp"),
    ('{"timestamp": 0, "input_length": "600", "output_length": 3, "hash_ids": [1, 2]}', "input_length"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, "x"]}', "hash_ids"),
    ('{"timestamp": 0, "input_length": 6000, "output_length": 3, "hash_ids": [1, 2]}', "expected ceil"),
    ('[1, 2, 3]', "JSON object"),
])
def test_malformed_line_reports_line_number(tmp_path, bad, msg):
    p = _write(tmp_path, [GOOD, GOOD, bad])
    with pytest.raises(TraceError, match=msg) as ei:
        load_trace(p)
    assert f"{p}:3:" in str(ei.value)


def test_out_of_order_and_empty(tmp_path):
    late = json.dumps({"timestamp": 10, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]})
    with pytest.raises(TraceError, match=r":2: timestamp"):
        load_trace(_write(tmp_path, [late, GOOD]))
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(TraceError, match="no requests"):
        load_trace(tmp_path / "e.jsonl")


def test_missing_file_says_how_to_obtain(tmp_path):
    with pytest.raises(TraceError, match="mooncake_conversation") as ei:
        load_trace(tmp_path / "nope.jsonl")
    assert "raw.githubusercontent.com" in str(ei.value)


def test_any_path_in_same_format(tmp_path):
    p = _write(tmp_path, [GOOD, json.dumps({"timestamp": 1500, "input_length": 1100, "output_length": 1,
                                            "hash_ids": [1, 2, 3]})])
    tr = load_trace(p)
    assert tr.n_requests == 2 and tr.arrival_s.tolist() == [0.0, 1.5]
    assert tr.block_tokens.tolist() == [512, 88, 512, 512, 76]
    hc = lru_hit_curve(tr)
    assert hc.token_hits(10) == 512 + 512 and hc.block_hits(10) == 2


# ------------------------------------------------------------------------------ property test

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=6), min_size=1, max_size=25),
       st.integers(0, 20))
def test_one_pass_equals_reference_property(reqs, cap):
    """Arbitrary block lists (repeats and shared ids anywhere, not only prefix trees)."""
    objs = [{"timestamp": 0, "input_length": 512 * len(r), "output_length": 1, "hash_ids": r} for r in reqs]
    tr = from_requests(objs)
    hc = lru_hit_curve(tr)
    toks = [[512] * len(r) for r in reqs]
    hb, ht = lru_prefix_hits(reqs, cap, toks)
    assert (hc.block_hits(cap), hc.token_hits(cap)) == (hb, ht)
    assert hc.per_request_hit_tokens(cap).sum() == ht
