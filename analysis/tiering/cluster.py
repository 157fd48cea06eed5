"""A cluster of N prefill instances, each with its own KV cache, under a routing policy.

The single LRU stack of :mod:`analysis.tiering.hitcurve`, cut at one instance's tiers, lets every
instance reuse what any other computed but holds only one instance's capacity: neither ideal nor a
bound (routed instances together hold N times more). Here each of ``n_instances`` instances keeps its
own LRU cache of ``capacity_blocks`` (its HBM share plus local DRAM/SSD), and a router sends each
request, in arrival order, to one instance:

* ``random`` (seeded) and ``round_robin``: oblivious to the cache;
* ``prefix_affinity``: a hash of the prompt's first ``affinity_blocks`` blocks picks the instance
  (session / prefix affinity: requests sharing that prefix meet on one instance; with one block,
  every request of the conversation trace, which all begin with the same block, lands on one
  instance);
* ``kv_aware``: the instance holding the longest cached prefix of the prompt (as Mooncake's
  conductor or a KV-aware router does), *capped by load*: only instances whose queued work is within
  ``load_slack_s`` seconds of the least-loaded one are eligible (ties and no match: least loaded).

Load: an instance's queued work is the prefill seconds it still has to serve; a request adds its
estimated service time, its no-cache prefill time (``full_s``, from the replay's model) times its
share of tokens to compute. Arrival times are divided by ``load_scale``. The per-instance FCFS queue
gives each request a TTFT estimate under that routing.

Against it, a **pooled store** (Mooncake Store over RDMA): one LRU of ``N x capacity_blocks`` shared
by all instances, exactly the one-pass curve at that capacity; its hits cross the network
(:func:`pooled`).

:func:`routed_tier_split` turns an assignment into per-request hits per tier and bytes written per
tier, exactly, from each instance's own one-pass stack.

:func:`local_vs_global` is Mooncake's Figure 10 setting (FAST'25, Sec. 5.3.2): ``n_instances`` nodes
each with a local cache routed by a router, against one global pool of all their capacity: token hit
rate and mean prefill compute time per request in both.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .. import cache as _cache
from ..traces import Trace
from .endurance import written_tokens
from .hitcurve import HitCurve, lru_hit_curve
from .prefill import prefill_time

ROUTING = ("random", "round_robin", "prefix_affinity", "kv_aware")
LOAD_AWARE = ("kv_aware",)


def check(trace: Trace, n_instances, policy: str, capacity_blocks) -> int:
    if policy not in ROUTING:
        raise ValueError(f"unknown routing policy {policy!r}; use one of {', '.join(ROUTING)}")
    n = int(n_instances)
    if n != n_instances or n < 1:
        raise ValueError(f"n_instances must be an integer >= 1, got {n_instances!r}")
    if n > trace.n_requests:
        raise ValueError(f"n_instances = {n} exceeds the trace's {trace.n_requests} requests: some instances "
                         f"would never be used; use at most {trace.n_requests} (or a longer trace)")
    if not capacity_blocks >= 0:
        raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks!r}")
    return n


def route(trace: Trace, n_instances: int, policy: str, capacity_blocks: float, *, full_s=None,
          load_scale: float = 1.0, load_slack_s: float = 1.0, seed: int = 0,
          affinity_blocks: int = 2) -> dict:
    """Route every request; returns the assignment, per-request prefix-hit tokens (from each
    instance's own LRU of ``capacity_blocks``), per-request TTFT estimates and load statistics."""
    n = check(trace, n_instances, policy, capacity_blocks)
    if int(affinity_blocks) != affinity_blocks or affinity_blocks < 1:
        raise ValueError(f"affinity_blocks must be an integer >= 1, got {affinity_blocks!r}")
    if not load_scale > 0:
        raise ValueError(f"load_scale must be > 0, got {load_scale!r}")
    cap = int(min(capacity_blocks, trace.n_blocks + 1))
    ids = trace.block_ids.tolist()
    tok = trace.block_tokens.tolist()
    offs = trace.offsets.tolist()
    L = trace.input_tokens.astype(float)
    full = np.maximum(np.asarray(full_s, dtype=float), 0.0) if full_s is not None else L / 1e4
    full_l = full.tolist()
    Ll = L.tolist()
    arr = (trace.arrival_s / load_scale).tolist()
    caches = [OrderedDict() for _ in range(n)]
    busy = [0.0] * n
    rng = np.random.default_rng(seed)
    rand = rng.integers(0, n, trace.n_requests).tolist() if policy == "random" else None
    assign = np.empty(trace.n_requests, dtype=np.int64)
    hit_tok = np.zeros(trace.n_requests, dtype=np.int64)
    ttft = np.empty(trace.n_requests)
    for r in range(trace.n_requests):
        a, b = offs[r], offs[r + 1]
        now = arr[r]
        if policy == "round_robin":
            i = r % n
        elif policy == "random":
            i = rand[r]
        elif policy == "prefix_affinity":
            i = hash(tuple(ids[a:min(b, a + affinity_blocks)])) % n if b > a else r % n
        else:
            back = [max(0.0, bu - now) for bu in busy]
            least = min(back)
            best, best_len, best_back = 0, -1, 0.0
            for k in range(n):
                if back[k] > least + load_slack_s:
                    continue
                c = caches[k]
                m = a
                while m < b and ids[m] in c:
                    m += 1
                if m - a > best_len or (m - a == best_len and back[k] < best_back):
                    best, best_len, best_back = k, m - a, back[k]
            i = best
        c = caches[i]
        h = 0
        m = a
        while m < b and ids[m] in c:
            h += tok[m]
            m += 1
        for x in ids[a:b]:
            if x in c:
                c.move_to_end(x)
            else:
                c[x] = None
                if len(c) > cap:
                    c.popitem(last=False)
        assign[r] = i
        hit_tok[r] = h
        s = full_l[r] * max(Ll[r] - h, 1.0) / max(Ll[r], 1.0)
        start = busy[i] if busy[i] > now else now
        busy[i] = start + s
        ttft[r] = busy[i] - now
    counts = np.bincount(assign, minlength=n)
    return {"policy": policy, "n_instances": n, "capacity_blocks": cap, "assignment": assign,
            "per_request_hit_tokens": hit_tok, "token_hit_rate": float(hit_tok.sum() / max(L.sum(), 1)),
            "ttft_s": ttft, "max_share": float(counts.max() / counts.sum()), "load_scale": load_scale}


def pooled(hc: HitCurve, n_instances: int, capacity_blocks: float) -> float:
    """Token hit rate of one pooled LRU holding the capacity of all instances (exact)."""
    return float(hc.token_hit_rate(n_instances * capacity_blocks))


def local_vs_global(trace: Trace, d, n_instances: int = 10, capacity_tokens: float = 3e6, *,
                    hc: HitCurve | None = None, policy: str = "kv_aware", load_slack_s: float = 1.0,
                    load_scale: float = 1.0, seed: int = 0, affinity_blocks: int = 2) -> dict:
    """Mooncake's Figure 10 setting: ``n_instances`` instances, each with its own LRU of
    ``capacity_tokens`` (whole blocks), requests routed by ``policy`` (KV-aware by default, its load
    measured in no-cache prefill seconds of deployment ``d``), against one global LRU of all their
    capacity (the exact one-pass curve ``hc``). Returns both token hit rates, both mean prefill compute
    times per request (:func:`analysis.tiering.prefill.prefill_time` of the uncached tokens after the
    cached prefix, on one instance of ``d``), their ratios (global / local) and the busiest instance's
    share of requests."""
    if not capacity_tokens > 0:
        raise ValueError(f"capacity_tokens must be > 0, got {capacity_tokens!r}")
    cap = int(capacity_tokens // trace.block_size)
    if cap < 1:
        raise ValueError(f"capacity_tokens = {capacity_tokens:g} holds no whole block of "
                         f"{trace.block_size} tokens; use at least {trace.block_size}")
    hc = hc if hc is not None else lru_hit_curve(trace)
    L = trace.input_tokens.astype(float)
    full = prefill_time(d, L, 0.0)
    r = route(trace, n_instances, policy, cap, full_s=full, load_scale=load_scale, load_slack_s=load_slack_s,
              seed=seed, affinity_blocks=affinity_blocks)

    def mean_prefill(hit_tokens):
        new = np.maximum(L - np.asarray(hit_tokens, dtype=float), 1.0)  # the last token is always computed
        return float(np.mean(prefill_time(d, new, L - new)))

    g_hits = hc.tier_split([r["n_instances"] * cap])[:, 0]
    tokens = max(float(L.sum()), 1.0)
    out = {"n_instances": r["n_instances"], "capacity_blocks": cap, "policy": policy,
           "load_slack_s": load_slack_s, "local_hit": r["token_hit_rate"],
           "global_hit": float(g_hits.sum() / tokens),
           "local_prefill_s": mean_prefill(r["per_request_hit_tokens"]),
           "global_prefill_s": mean_prefill(g_hits),
           "nocache_prefill_s": float(np.mean(full)), "max_share": r["max_share"]}
    out["hit_ratio"] = out["global_hit"] / out["local_hit"] if out["local_hit"] > 0 else float("inf")
    out["prefill_ratio"] = out["global_prefill_s"] / out["local_prefill_s"]
    return out


def routed_tier_split(trace: Trace, assignment: np.ndarray, tier_blocks) -> tuple[np.ndarray, np.ndarray]:
    """Per-request hit tokens per tier and tokens written per tier (summed over instances) when
    each instance keeps its own exclusive LRU tiers of ``tier_blocks`` and serves the requests
    ``assignment`` gives it (exact: one one-pass stack per instance)."""
    assignment = np.asarray(assignment)
    if assignment.shape != (trace.n_requests,):
        raise ValueError(f"assignment must give one instance per request ({trace.n_requests}), "
                         f"got shape {assignment.shape}")
    caps = np.asarray(tier_blocks, dtype=float)
    hits = np.zeros((trace.n_requests, caps.size))
    written = np.zeros(caps.size)
    for i in np.unique(assignment):
        sel = np.flatnonzero(assignment == i)
        sub = _subtrace(trace, sel)
        hc = lru_hit_curve(sub)
        hits[sel] = hc.tier_split(caps)
        written += written_tokens(sub, hc, caps)
    return hits, written


def _subtrace(trace: Trace, sel: np.ndarray) -> Trace:
    lens = np.diff(trace.offsets)[sel]
    offs = np.zeros(sel.size + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    idx = np.concatenate([np.arange(trace.offsets[r], trace.offsets[r + 1]) for r in sel]) if sel.size else \
        np.zeros(0, dtype=np.int64)
    return Trace(f"{trace.name}/part", trace.arrival_s[sel], trace.input_tokens[sel],
                 trace.output_tokens[sel],
                 offs, trace.block_ids[idx], trace.block_tokens[idx], trace.block_size)


def curves(trace: Trace, hc: HitCurve, ns, policies, capacity_blocks: float, *, full_s=None,
           load_scales=(1.0,), load_slack_s: float = 1.0, seed: int = 0, affinity_blocks: int = 2,
           use_cache: bool = True) -> list[dict]:
    """Hit rate (and p90 TTFT estimate, busiest instance's share) against the number of instances
    for each routing policy at the first load (and, for load-aware policies, at every load), plus
    the pooled store's exact hit rate (memoised on disk)."""
    ns = [int(n) for n in ns]
    for p in policies:
        for n in ns:
            check(trace, n, p, capacity_blocks)

    def compute():
        rows = []
        for li, ls in enumerate(load_scales):
            for p in policies:
                if li and p not in LOAD_AWARE:
                    continue  # hit rates of load-oblivious routing do not depend on the load
                for n in ns:
                    r = route(trace, n, p, capacity_blocks, full_s=full_s, load_scale=ls,
                              load_slack_s=load_slack_s, seed=seed, affinity_blocks=affinity_blocks)
                    rows.append({"policy": p, "n_instances": n, "load_scale": ls,
                                 "token_hit_rate": r["token_hit_rate"],
                                 "ttft_p90_s": float(np.percentile(r["ttft_s"], 90)),
                                 "max_share": r["max_share"]})
        return rows

    fp = {"ids": trace.block_ids, "tok": trace.block_tokens, "offs": trace.offsets, "arr": trace.arrival_s,
          "ns": ns, "pol": list(policies), "cap": float(capacity_blocks), "full": None if full_s is None else
          np.asarray(full_s, dtype=float), "ls": list(load_scales), "slack": load_slack_s, "seed": seed,
          "aff": affinity_blocks}
    rows = _cache.cached("tiering_routing_curves", fp, compute, enabled=None if use_cache else False)
    for n in ns:
        rows.append({"policy": "pooled store", "n_instances": n, "load_scale": np.nan,
                     "token_hit_rate": pooled(hc, n, capacity_blocks), "ttft_p90_s": np.nan,
                     "max_share": np.nan})
    return rows
