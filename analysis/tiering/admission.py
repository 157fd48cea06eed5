"""Admission and eviction beyond LRU for a KV block store, simulated with libCacheSim.

The store (one cache of ``capacity`` blocks; think of an instance's SSD tier, which keeps a block
until it is evicted) sees the trace's block accesses in prompt order. A request's ``k``-th block is
a *prefix hit* iff its first ``k`` accesses all hit. Every block that misses and is admitted is
*written* (a KV block computed on the GPU is stored); hits write nothing (KV is immutable).

* eviction: the policies of `libCacheSim <https://github.com/1a1a11a/libCacheSim>`_ (PyPI
  ``libcachesim``, pinned): LRU, FIFO, S3-FIFO, SIEVE, ARC, W-TinyLFU, and Belady (clairvoyant:
  evicts the block used furthest in the future, given each access's next-use time: the offline
  bound, since it needs the future);
* admission: ``all`` (write on every miss), ``second_use`` (admit a block only on a miss after it
  was seen before: one-use blocks, most of this trace, are never written; this is frequency-gated
  demotion, the filter NVIDIA Dynamo's KV block manager puts in front of disk offload to spare the
  drives' endurance: a block reaches the SSD only once it has been used twice; every access is then
  a hit, a written miss or a refused first use, exactly), ``oracle_reuse`` (admit
  only a block whose next use comes within ``capacity`` distinct blocks, i.e. one an LRU of that
  size would still hold: a perfect reuse-distance predictor, the bound for any learned one).

libCacheSim's own LRU is checked in the tests against the exact one-pass curve of
:mod:`analysis.tiering.hitcurve` (equal hit counts at every capacity tried). Each run is one Python
loop over the accesses calling the library (``benchmarks/bench_admission.py`` times it).
"""
from __future__ import annotations

import dataclasses
import time
from importlib.metadata import version

import numpy as np

from .. import cache as _cache
from ..traces import Trace
from . import replay as _rp
from .hitcurve import HitCurve, lru_hit_curve
from .policies import next_use
from .tiers import build_tier

EVICTION = ("lru", "fifo", "s3fifo", "sieve", "arc", "wtinylfu", "belady")
ADMISSION = ("all", "second_use", "oracle_reuse")
NEVER = 2**62


def _make(policy: str, capacity: int, n_distinct: int):
    """The library's cache, its hash table sized to the trace (the default 2^24 buckets cost ~0.5 s
    to allocate per cache)."""
    import libcachesim as lcs  # optional heavy dependency

    hp = max(12, min(26, int(np.ceil(np.log2(max(n_distinct, 2)))) + 1))
    cls = {"lru": lcs.LRU, "fifo": lcs.FIFO, "s3fifo": lcs.S3FIFO, "sieve": lcs.Sieve, "arc": lcs.ARC,
           "wtinylfu": lcs.WTinyLFU, "belady": lcs.Belady}[policy]
    return cls(int(capacity), hashpower=hp)


def check(policy: str, admission: str, capacity_blocks) -> int:
    if policy not in EVICTION:
        raise ValueError(f"unknown eviction policy {policy!r}; use one of {', '.join(EVICTION)}")
    if admission not in ADMISSION:
        raise ValueError(f"unknown admission policy {admission!r}; use one of {', '.join(ADMISSION)}")
    c = int(capacity_blocks)
    if c != capacity_blocks or c < 1:
        raise ValueError(f"capacity_blocks must be an integer >= 1, got {capacity_blocks!r}")
    return c


def simulate(trace: Trace, capacity_blocks: int, policy: str = "lru", admission: str = "all",
             hc: HitCurve | None = None, *, library_lru: bool = False) -> dict:
    """Prefix hits, per-request hit tokens and blocks written of one (policy, admission, capacity).

    LRU with admission ``all`` is read off the exact one-pass curve ``hc`` when given (the tests
    check that libCacheSim's LRU gives the same counts); ``library_lru`` forces the library."""
    c = check(policy, admission, capacity_blocks)
    if policy == "lru" and admission == "all" and hc is not None and not library_lru:
        return _lru_from_curve(trace, hc, c)
    import libcachesim as lcs  # optional heavy dependency

    ids = trace.block_ids.tolist()
    tok = trace.block_tokens.tolist()
    offs = trace.offsets.tolist()
    n = len(ids)
    nxt = next_use(trace.block_ids)
    if admission == "oracle_reuse":
        if hc is None:
            hc = lru_hit_curve(trace)
        d_next = np.where(nxt < n, hc.distance[np.minimum(nxt, max(n - 1, 0))], NEVER)
        admit = (d_next <= c).tolist()
    nxt_l = np.where(nxt < n, nxt, NEVER).tolist() if policy == "belady" else None
    cache = _make(policy, c, trace.n_unique_blocks)
    req = lcs.Request()
    req.obj_size = 1
    per_req = np.zeros(len(offs) - 1, dtype=np.int64)
    hit_b = acc_hits = ins_b = ins_t = 0
    seen: set = set()
    t0 = time.perf_counter()
    if admission == "all":
        get = cache.get
        for r in range(len(offs) - 1):
            pref = True
            ht = 0
            for t in range(offs[r], offs[r + 1]):
                req.obj_id = ids[t]
                if nxt_l is not None:
                    req.next_access_vtime = nxt_l[t]
                h = get(req)
                if h:
                    acc_hits += 1
                    if pref:
                        hit_b += 1
                        ht += tok[t]
                else:
                    pref = False
                    ins_b += 1
                    ins_t += tok[t]
            per_req[r] = ht
    else:
        find, need, evict, insert = cache.find, cache.need_eviction, cache.evict, cache.insert
        for r in range(len(offs) - 1):
            pref = True
            ht = 0
            for t in range(offs[r], offs[r + 1]):
                x = ids[t]
                req.obj_id = x
                if nxt_l is not None:
                    req.next_access_vtime = nxt_l[t]
                h = find(req, True) is not None
                if h:
                    acc_hits += 1
                    if pref:
                        hit_b += 1
                        ht += tok[t]
                else:
                    pref = False
                    ok = (x in seen) if admission == "second_use" else admit[t]
                    if ok:
                        while need(req):
                            evict(req)
                        insert(req)
                        ins_b += 1
                        ins_t += tok[t]
                seen.add(x)
            per_req[r] = ht
    secs = time.perf_counter() - t0
    return {"policy": policy, "admission": admission, "capacity_blocks": c, "hit_blocks": hit_b,
            "hit_tokens": int(per_req.sum()), "access_hits": acc_hits, "written_blocks": ins_b,
            "written_tokens": ins_t, "per_request_hit_tokens": per_req, "seconds": secs}


def _lru_from_curve(trace: Trace, hc: HitCurve, c: int) -> dict:
    t0 = time.perf_counter()
    hit = (hc.run_max <= c) & (hc.run_max <= hc.n_distinct)
    req = np.repeat(np.arange(trace.n_requests), np.diff(trace.offsets))
    per_req = np.bincount(req[hit], weights=trace.block_tokens[hit], minlength=trace.n_requests)
    per_req = per_req.astype(np.int64)
    miss = hc.distance > c            # first uses carry n_distinct + 1 > any capacity that matters
    miss |= hc.distance > hc.n_distinct
    return {"policy": "lru", "admission": "all", "capacity_blocks": c, "hit_blocks": int(hit.sum()),
            "hit_tokens": int(per_req.sum()), "access_hits": int((~miss).sum()),
            "written_blocks": int(miss.sum()),
            "written_tokens": int(trace.block_tokens[miss].sum()), "per_request_hit_tokens": per_req,
            "seconds": time.perf_counter() - t0}


def curves(trace: Trace, capacities_blocks, runs, *, use_cache: bool = True) -> list[dict]:
    """One row per (policy, admission) in ``runs`` and capacity: hit rates and blocks written
    (memoised on disk keyed by the trace's content and the runs)."""
    caps = [int(c) for c in capacities_blocks]
    runs = [tuple(r) for r in runs]
    for p, a in runs:
        for c in caps:
            check(p, a, c)

    def compute():
        hc = lru_hit_curve(trace)
        rows = []
        for p, a in runs:
            for c in caps:
                rows.append(simulate(trace, c, p, a, hc))
        return rows

    fingerprint = {"n": trace.n_blocks, "ids": trace.block_ids, "tok": trace.block_tokens,
                   "offs": trace.offsets,
                   "caps": caps, "runs": [list(r) for r in runs], "lib": _lib_version()}
    rows = _cache.cached("tiering_admission_curves", fingerprint, compute,
                         enabled=None if use_cache else False)
    tokens = int(trace.block_tokens.sum())
    for r in rows:
        r["token_hit_rate"] = r["hit_tokens"] / tokens
        r["block_hit_rate"] = r["hit_blocks"] / trace.n_blocks
    return rows


def _lib_version() -> str:
    return version("libcachesim")


def costs(trace: Trace, rows: list[dict], d, econ, tier_key: str = "nvme") -> list[dict]:
    """Price each simulated store as the instance's only KV tier beyond HBM (no HBM cache): the
    drives of ``tier_key`` pro rata to the store's capacity (capex and energy), its wear
    (bytes written x price / rated bytes), the reads slowed by those writes, and the GPUs'
    prefill time (:func:`analysis.tiering.replay.service_from_hits`, busy view)."""

    full = build_tier(tier_key, d)
    duration = max(float(trace.arrival_s[-1] / econ.load_scale), 1.0)
    tokens = float(trace.input_tokens.sum())
    out = []
    for r in rows:
        cap_tok = r["capacity_blocks"] * trace.block_size
        share = min(1.0, cap_tok / full.capacity_tokens) if full.capacity_tokens else 0.0
        tier = dataclasses.replace(full, capacity_tokens=cap_tok, usd_per_s=full.usd_per_s * share,
                                   capex_usd_per_s=full.capex_usd_per_s * share)
        svc = _rp.service_from_hits(trace, r["per_request_hit_tokens"][:, None], [r["written_tokens"]],
                                    [tier], d, config=f"{r['policy']}+{r['admission']}")
        w = _rp.wear(svc, float(svc.service_s.sum()))[0]
        hours = duration / 3600.0
        out.append({k: v for k, v in r.items() if k != "per_request_hit_tokens"} | {
            "capacity_tokens": cap_tok, "tb_written_per_h": w["written_bytes"] / 1e12 / hours,
            "wear_usd_per_h": w["wear_usd"] / hours, "endurance_decides": w["endurance_decides"],
            "read_factor": float(svc.read_factor[0]),
            "busy_usd_per_mtok": _rp.busy_cost_per_mtok(svc, d, econ, duration, tokens)})
    return out
