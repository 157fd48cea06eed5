"""Per-capacity prefix-cache simulators for policies other than LRU (LFU, Belady/OPT).

Same prefix semantics as :mod:`analysis.tiering.hitcurve`: a request's hit is the run of its leading
blocks present in the cache when it arrives; then every block of the request is accessed in prompt
order (inserted if absent, evicting a victim while the cache holds more than ``capacity`` blocks).

* ``lfu``: evict the block with the fewest accesses since it entered the cache (ties: least
  recently used). A heap with lazy invalidation, ``O(log n)`` per access.
* ``belady``: evict the block whose next use is furthest in the future (never used again first),
  the clairvoyant policy that is optimal for plain caching; under prefix semantics it is a strong
  bound, not a proven optimum (a block's value also depends on its predecessors being cached).
* ``lru``: a plain OrderedDict LRU, for cross-checks.

These run one capacity per pass (Python loop over accesses), so chapters evaluate them at sampled
capacities; results are memoised on disk with :mod:`analysis.cache`.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict

import numpy as np

from .. import cache as _cache
from ..traces import Trace
from .hitcurve import previous_use

POLICIES = ("lru", "lfu", "belady")


def next_use(ids: np.ndarray) -> np.ndarray:
    """Index of the next access of the same id (``len(ids)`` when never used again)."""
    ids = np.asarray(ids)
    prev = previous_use(ids)
    nxt = np.full(ids.size, ids.size, dtype=np.int64)
    has = prev >= 0
    nxt[prev[has]] = np.flatnonzero(has)
    return nxt


def simulate(trace: Trace, capacity_blocks: int, policy: str = "lfu") -> dict:
    """Hit blocks and hit tokens of ``trace`` with a cache of ``capacity_blocks`` under ``policy``."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    c = int(capacity_blocks)
    if c < 0 or c != capacity_blocks:
        raise ValueError(f"capacity_blocks must be an integer >= 0, got {capacity_blocks!r}")
    ids = trace.block_ids.tolist()
    tok = trace.block_tokens.tolist()
    offs = trace.offsets.tolist()
    hit_b = hit_t = 0
    if policy == "lru":
        od: OrderedDict = OrderedDict()
        for r in range(len(offs) - 1):
            a, b = offs[r], offs[r + 1]
            k = a
            while k < b and ids[k] in od:
                hit_t += tok[k]
                k += 1
            hit_b += k - a
            for x in ids[a:b]:
                if x in od:
                    od.move_to_end(x)
                else:
                    od[x] = None
                    if len(od) > c:
                        od.popitem(last=False)
        return {"capacity_blocks": c, "policy": policy, "hit_blocks": hit_b, "hit_tokens": hit_t}
    meta: dict = {}   # block -> current priority key (validity check for lazy heap entries)
    heap: list = []
    nxt = next_use(trace.block_ids).tolist() if policy == "belady" else None
    for r in range(len(offs) - 1):
        a, b = offs[r], offs[r + 1]
        k = a
        while k < b and ids[k] in meta:
            hit_t += tok[k]
            k += 1
        hit_b += k - a
        for t in range(a, b):
            x = ids[t]
            if policy == "lfu":
                old = meta.get(x)
                key = ((old[0] + 1) if old else 1, t)
            else:
                key = (-nxt[t], t)
            meta[x] = key
            heapq.heappush(heap, (key, x))
            while len(meta) > c:
                key_v, v = heapq.heappop(heap)
                if meta.get(v) == key_v:
                    del meta[v]
    return {"capacity_blocks": c, "policy": policy, "hit_blocks": hit_b, "hit_tokens": hit_t}


def policy_curve(trace: Trace, capacities_blocks, policies=("lfu", "belady"), *, use_cache: bool = True):
    """Token and block hit rates of ``policies`` at each sampled capacity (a list of dicts)."""
    caps = [int(c) for c in capacities_blocks]

    def compute():
        rows = []
        for pol in policies:
            for c in caps:
                r = simulate(trace, c, pol)
                r["token_hit_rate"] = r["hit_tokens"] / int(trace.block_tokens.sum())
                r["block_hit_rate"] = r["hit_blocks"] / trace.n_blocks
                rows.append(r)
        return rows

    fingerprint = {"name": trace.name, "n": trace.n_blocks, "ids": trace.block_ids, "tok": trace.block_tokens,
                   "offs": trace.offsets, "caps": caps, "policies": list(policies)}
    return _cache.cached("tiering_policy_curve", fingerprint, compute, enabled=None if use_cache else False)
