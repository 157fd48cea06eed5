"""HitCurve.per_request_hit_tokens with requests that have no blocks (the trace reader allows them)."""
import numpy as np

from analysis.tiering import from_requests, lru_hit_curve


def _req(blocks, length=None):
    n = len(blocks)
    return {"timestamp": 0, "input_length": length if length is not None else 512 * n, "output_length": 1,
            "hash_ids": blocks}


def _slow(trace, cap_blocks):
    """Reference: walk the requests with an LRU list, counting each request's prefix hits."""
    lru, out = [], []
    for i in range(trace.n_requests):
        blocks = list(trace.request_blocks(i))
        toks = trace.block_tokens[trace.offsets[i]:trace.offsets[i + 1]]
        hit, prefix = 0, True
        for b, t in zip(blocks, toks):
            prefix = prefix and b in lru
            hit += int(t) if prefix else 0
        for b in blocks:
            if b in lru:
                lru.remove(b)
            lru.append(b)
            if len(lru) > cap_blocks:
                lru.pop(0)
        out.append(hit)
    return np.array(out)


def test_zero_block_requests_hit_nothing_and_shift_nothing():
    reqs = [_req([1, 2, 3]), _req([], 0), _req([1, 2, 9]), _req([], 0), _req([1, 2, 3, 4]), _req([], 0)]
    tr = from_requests(reqs)
    assert list(np.diff(tr.offsets)) == [3, 0, 3, 0, 4, 0]
    hc = lru_hit_curve(tr)
    for cap in (1, 2, 3, 4, 5, np.inf):
        got = hc.per_request_hit_tokens(cap)
        assert got.shape == (6,) and got[1] == got[3] == got[5] == 0
        assert np.array_equal(got, _slow(tr, cap if np.isfinite(cap) else 10**9)), cap
    assert list(hc.per_request_hit_tokens(np.inf)) == [0, 0, 1024, 0, 1536, 0]


def test_trace_without_any_block():
    tr = from_requests([_req([], 0), _req([], 0)])
    assert list(lru_hit_curve(tr).per_request_hit_tokens(10)) == [0, 0]
