"""Replay a trace against a prefill cluster with KV tiers: TTFT, SLO attainment and cost per token.

Model (every assumption explicit):

* the prefix cache is the single LRU stack of :mod:`analysis.tiering.hitcurve`, cut into the tiers
  of one instance (fastest first; evicted blocks are demoted); pooled tiers add the pool's capacity;
* request ``i`` with ``L_i`` prompt tokens reuses ``h_ij`` tokens from tier ``j`` and recomputes
  ``n_i = max(L_i - sum_j h_ij, 1)`` tokens after a cached prefix of ``L_i - n_i``;
* compute time = one forward pass of the shared forward-pass model (:mod:`analysis.forward`, via
  :mod:`analysis.tiering.prefill`) prefilling ``n_i`` new tokens after the prefix on ``tp`` GPUs at
  ``compute_eff`` (tensor-parallel communication, overheads and the quadratic attention term
  included); load time = sum over tiers of
  ``h_ij * stored bytes per token / bandwidth_j`` plus the tier's latency;
* loading is overlapped layer by layer with computation (the one overlap rule,
  :func:`analysis.forward.layerwise_overlap`): service = ``max(c, l) + min(c, l) / layers``,
  unless recomputing the whole prompt is faster (then it recomputes and uses no cached token);
* instances serve one prefill at a time, first come first served, in the trace's arrival order
  (arrival times divided by ``load_scale``); TTFT = queueing + service.

Costs: GPUs at ``gpu_usd_per_s`` each, tiers at their amortised capex + energy. Two views:

* **busy cost**: GPU-seconds actually used (service x tp) plus local tiers for the same average number
  of busy instances, plus pooled tiers, over the trace; continuous in every input (used for the
  heatmap, the tornado and the monotonicity tests);
* **SLO-sized cost**: the smallest cluster whose TTFT attainment reaches the target, paid for the
  whole trace duration.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from .. import forward as fw
from .. import kv
from ..specs import model as _model
from . import prefill as _prefill
from .cluster import route, routed_tier_split
from .endurance import read_factor, written_tokens
from .hitcurve import HitCurve
from .tiers import CONFIGS, Deployment, Tier, build_tiers


@dataclass
class Service:
    """Per-request service times of one configuration."""

    config: str
    tiers: list
    hit_tokens: np.ndarray      # (n_requests, n_tiers)
    compute_s: np.ndarray
    load_s: np.ndarray
    service_s: np.ndarray
    nocache_s: np.ndarray       # service time with nothing cached (same model, GPU, efficiency)
    written_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per tier, over the trace
    read_factor: np.ndarray = field(default_factory=lambda: np.zeros(0))    # read bandwidth kept under writes


def _load_times(hits, tiers, factor):
    load = np.zeros(hits.shape[0])
    for j, t in enumerate(tiers):
        if math.isinf(t.bandwidth):
            continue
        bw = t.bandwidth * factor[j]
        load += np.where(hits[:, j] > 0, hits[:, j] * t.bytes_per_token / bw + t.latency_s, 0.0)
    return load


def service_times(trace, hc: HitCurve, tiers: list[Tier], d: Deployment, *, config: str = "",
                  writes: bool = True) -> Service:
    """Service times with the hits and writes of the single LRU stack cut into ``tiers``."""
    caps = [math.floor(t.capacity_tokens / trace.block_size) for t in tiers]
    hits = hc.tier_split(caps).astype(float)
    written = written_tokens(trace, hc, caps) if writes else np.zeros(len(tiers))
    return service_from_hits(trace, hits, written, tiers, d, config=config)


def service_from_hits(trace, hits, written_tokens_per_tier, tiers: list[Tier], d: Deployment, *,
                      config: str = "") -> Service:
    """Service times of each request given its hit tokens per tier (``(n_requests, n_tiers)``) and
    the tokens written into each tier over the trace (see the module docstring)."""
    L = trace.input_tokens.astype(float)
    hits = np.array(hits, dtype=float)
    total = hits.sum(axis=1)
    n_new = np.maximum(L - total, 1.0)
    prefix = L - n_new
    # a fully cached prompt still computes its last token: charge it to the slowest tier used
    over = total - prefix
    if np.any(over > 0):
        for j in range(hits.shape[1] - 1, -1, -1):
            take = np.minimum(over, hits[:, j])
            hits[:, j] -= take
            over = over - take
    comp = _prefill.prefill_time(d, n_new, prefix)
    nocache = _prefill.prefill_time(d, L, 0.0)
    layers = _model(d.model).n_layers

    def serve(factor):
        # load the cached prefix (overlapped layer by layer) or recompute the whole prompt, whichever
        # is faster (Mooncake's load-vs-recompute decision, per request)
        load = _load_times(hits, tiers, factor)
        return load, np.minimum(fw.layerwise_overlap(comp, load, layers), nocache)

    wbytes = np.asarray(written_tokens_per_tier, dtype=float) * np.array([t.bytes_per_token for t in tiers])
    ones = np.ones(len(tiers))
    load, svc = serve(ones)
    factor = ones
    if np.any(wbytes[[np.isfinite(t.write_bw) for t in tiers]] > 0):
        # writes per busy instance-second (wbytes / B) take drive time from reads, which lengthens
        # service and so B: solve B = sum(service(B)) by bisection (the right side falls with B)
        def fac(B):
            f = np.array([read_factor(w / B, t.write_bw, t.interference) if np.isfinite(t.write_bw) else 1.0
                          for w, t in zip(wbytes, tiers)])
            return np.maximum(f, 1e-12)  # saturated by writes: no reads (B grows until the writes fit)

        lo = float(svc.sum())
        hi = lo
        while float(serve(fac(hi))[1].sum()) > hi:
            hi *= 2.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if float(serve(fac(mid))[1].sum()) > mid:
                lo = mid
            else:
                hi = mid
        factor = fac(hi)
        load, svc = serve(factor)
    # requests that recompute rather than load use none of their cached tokens
    hits[svc >= nocache] = 0.0
    load = np.where(svc >= nocache, 0.0, load)
    comp = np.where(svc >= nocache, nocache, comp)
    return Service(config, tiers, hits, comp, load, svc, nocache, wbytes, factor)


def routed_service(trace, tiers, d, n_instances: int, policy: str, *, full_s=None,
                   load_scale: float = 1.0, load_slack_s: float = 1.0, seed: int = 0,
                   affinity_blocks: int = 2, config: str = ""):
    """Service times when ``n_instances`` instances with the local tiers ``tiers`` are routed by
    ``policy`` (:func:`analysis.tiering.cluster.route`): each instance's own stack gives its hits per
    tier and its writes. Pooled (non-local) tiers are not modelled here (use the pooled-store rows of
    :func:`analysis.tiering.cluster.curves`)."""
    if any(not t.local for t in tiers):
        raise ValueError("routed_service models local tiers only; the pooled store is the single stack")
    caps = [int(t.capacity_tokens // trace.block_size) for t in tiers]
    r = route(trace, n_instances, policy, float(sum(caps)), full_s=full_s, load_scale=load_scale,
              load_slack_s=load_slack_s, seed=seed, affinity_blocks=affinity_blocks)
    hits, written = routed_tier_split(trace, r["assignment"], caps)
    return service_from_hits(trace, hits, written, tiers, d, config=config), r


def fcfs_start_times(arrival_s: np.ndarray, service_s: np.ndarray, n_instances: int) -> np.ndarray:
    """Start times under first-come-first-served on ``n_instances`` identical servers."""
    if int(n_instances) != n_instances or n_instances < 1:
        raise ValueError(f"n_instances must be a positive integer, got {n_instances!r}")
    free = [0.0] * int(n_instances)
    heapq.heapify(free)
    start = np.empty_like(service_s)
    for i, (a, s) in enumerate(zip(arrival_s.tolist(), service_s.tolist())):
        f = heapq.heappop(free)
        st = a if a > f else f
        start[i] = st
        heapq.heappush(free, st + s)
    return start


@dataclass
class Outcome:
    config: str
    label: str
    n_instances: int
    ttft_s: np.ndarray
    attainment: float
    p50_s: float
    p90_s: float
    p99_s: float
    hit_rate: float                 # token-weighted, over all tiers
    tier_hit_rates: dict
    gpu_seconds: float
    gpu_seconds_saved: float        # vs recomputing every prompt
    busy_usd_per_mtok: float
    cluster_usd_per_mtok: float
    tier_usd_per_s: float
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Economics:
    gpu_usd_per_s: float
    slo_s: float
    attainment_target: float = 0.9
    load_scale: float = 1.0
    chunk_tokens: int = 0       # continuous batching, chunked prefill of this many tokens per step;
                                # 0: one request at a time per instance

    def __post_init__(self):
        if int(self.chunk_tokens) != self.chunk_tokens or self.chunk_tokens < 0:
            raise ValueError(f"chunk_tokens must be an integer >= 0 (0: no batching), "
                             f"got {self.chunk_tokens!r}")
        if not (self.gpu_usd_per_s > 0 and math.isfinite(self.gpu_usd_per_s)):
            raise ValueError(f"gpu_usd_per_s must be > 0, got {self.gpu_usd_per_s!r}")
        if not self.slo_s > 0:
            raise ValueError(f"slo_s (TTFT SLO) must be > 0 seconds, got {self.slo_s!r}")
        if not 0 < self.attainment_target <= 1:
            raise ValueError(f"attainment_target must be in (0, 1], got {self.attainment_target!r}")
        if not self.load_scale > 0:
            raise ValueError(f"load_scale must be > 0, got {self.load_scale!r}")


def _tier_costs(tiers):
    local = sum(t.usd_per_s for t in tiers if t.local)
    pooled = sum(t.usd_per_s for t in tiers if not t.local)
    return local, pooled


def wear(svc: Service, instance_s: float) -> list[dict]:
    """Per tier: bytes written, their wear cost, and whether endurance (not the amortisation period)
    sets the drives' capital cost over ``instance_s`` instance-seconds of use."""
    out = []
    wb = svc.written_bytes if svc.written_bytes.size else np.zeros(len(svc.tiers))
    for t, w in zip(svc.tiers, wb):
        worn = float(w) * t.usd_per_byte_written
        amort = instance_s * t.capex_usd_per_s
        cap_bytes = t.capacity_tokens * t.bytes_per_token
        per_s = float(w) / instance_s if instance_s > 0 else 0.0
        out.append({"tier": t.key, "name": t.name, "written_bytes": float(w), "wear_usd": worn,
                    "amortised_usd": amort,
                    "extra_usd": max(0.0, worn - amort) if t.usd_per_byte_written else 0.0,
                    "endurance_decides": bool(t.usd_per_byte_written and worn > amort),
                    "dwpd_used": (per_s * 86400.0 / cap_bytes if cap_bytes > 0 and np.isfinite(t.tbw_bytes)
                                  else 0.0),
                    "write_rate": per_s})
    return out


def busy_cost_per_mtok(
    svc: Service, d: Deployment, econ: Economics, duration_s: float, tokens: float
) -> float:
    """USD per million input tokens for the GPU time used plus the tiers (see module docstring);
    a drive costs the larger of its amortisation and its wear (:mod:`analysis.tiering.endurance`)."""
    local, pooled = _tier_costs(svc.tiers)
    busy_instance_s = float(svc.service_s.sum())
    usd = busy_instance_s * (d.tp * econ.gpu_usd_per_s + local) + pooled * duration_s
    usd += sum(w["extra_usd"] for w in wear(svc, busy_instance_s))
    return usd / tokens * 1e6


def batched_ttft(
    trace, svc: Service, d: Deployment, arrival_s: np.ndarray, n_instances: int, chunk_tokens: int
) -> np.ndarray:
    """TTFT under continuous batching with chunked prefill on ``n_instances`` instances.

    Each request's new tokens are cut into chunks of ``chunk_tokens`` (after its cached prefix). An
    instance, whenever it is free, runs one step: the next chunks of the requests it has started
    (oldest first), then the first chunks of waiting requests that have arrived (first come first
    served; while other instances are idle it takes one, leaving the rest to them), within
    ``chunk_tokens`` tokens (a step holds at least one chunk). A step costs the
    forward pass's fixed part ``F`` (one-token pass: weights and overheads) plus each chunk's marginal
    cost (its pass time minus ``F``), or the longest prefix load of the requests it starts if that
    is longer (loads overlap the step's computation). A request's TTFT ends with its last chunk."""
    if int(n_instances) != n_instances or n_instances < 1:
        raise ValueError(f"n_instances must be a positive integer, got {n_instances!r}")
    C = int(chunk_tokens)
    L = trace.input_tokens.astype(float)
    used = svc.hit_tokens.sum(axis=1)
    n_new = np.maximum(L - used, 1.0)
    prefix = L - n_new
    nch = np.maximum(np.ceil(n_new / C), 1).astype(np.int64)
    req = np.repeat(np.arange(L.size), nch)
    first = np.concatenate([[0], np.cumsum(nch)[:-1]])
    k = np.arange(req.size) - first[req]
    clen = np.minimum(C, n_new[req] - k * C)
    F = float(_prefill.prefill_time(d, 1.0, 0.0))
    marg = np.maximum(_prefill.prefill_time(d, clen, prefix[req] + k * C) - F, 0.0)
    marg_l, clen_l, first_l, nch_l = marg.tolist(), clen.tolist(), first.tolist(), nch.tolist()
    load_l = svc.load_s.tolist()
    arr = np.asarray(arrival_s, dtype=float).tolist()
    n = len(arr)
    ttft = np.empty(n)
    heap = [(0.0, i) for i in range(int(n_instances))]
    heapq.heapify(heap)
    active: list = [[] for _ in range(int(n_instances))]  # per instance: [request, next chunk index]
    nxt = 0
    done = 0
    while done < n:
        t, i = heapq.heappop(heap)
        act = active[i]
        if not act and nxt < n and arr[nxt] > t:
            t = arr[nxt]
        budget = C
        cost = F
        loadmax = 0.0
        finished = []
        for a in act:  # continue started requests
            if budget <= 0 and cost > F:
                break
            r, j = a
            c = first_l[r] + j
            budget -= clen_l[c]
            cost += marg_l[c]
            a[1] += 1
            if a[1] == nch_l[r]:
                finished.append(a)
        # instances idle at the same moment share the waiting requests (one each, as a dispatcher
        # sending each request to an idle instance would)
        idle = sum(1 for ft, j in heap if ft <= t and not active[j]) if heap and heap[0][0] <= t else 0
        take = 1 if idle else n
        while nxt < n and arr[nxt] <= t and (budget > 0 or cost == F) and take > 0:
            take -= 1
            r = nxt
            nxt += 1
            c = first_l[r]
            budget -= clen_l[c]
            cost += marg_l[c]
            loadmax = max(loadmax, load_l[r])
            a = [r, 1]
            act.append(a)
            if nch_l[r] == 1:
                finished.append(a)
        if cost == F and not act:  # nothing to do: every request has been taken
            heapq.heappush(heap, (math.inf, i))
            continue
        end = t + max(cost, loadmax)
        for a in finished:
            act.remove(a)
            ttft[a[0]] = end - arr[a[0]]
            done += 1
        heapq.heappush(heap, (end, i))
    return ttft


def outcome(trace, svc: Service, d: Deployment, econ: Economics, n_instances: int,
            ttft: np.ndarray | None = None) -> Outcome:
    """The cluster of ``n_instances`` serving ``svc``: TTFT (a shared queue: any idle instance takes the
    next request; ``ttft`` when given, e.g. :func:`routed_ttft`), attainment, hit rates and costs."""
    arr = trace.arrival_s / econ.load_scale
    if ttft is not None:
        ttft = np.asarray(ttft, dtype=float)
    elif econ.chunk_tokens:
        ttft = batched_ttft(trace, svc, d, arr, n_instances, econ.chunk_tokens)
    else:
        start = fcfs_start_times(arr, svc.service_s, n_instances)
        ttft = start - arr + svc.service_s
    duration = max(float(arr[-1] - arr[0]), 1.0)
    tokens = float(trace.input_tokens.sum())
    local, pooled = _tier_costs(svc.tiers)
    worn = sum(w["extra_usd"] for w in wear(svc, n_instances * duration))
    cluster = ((n_instances * (d.tp * econ.gpu_usd_per_s + local) + pooled) * duration + worn) / tokens * 1e6
    per_tier = {t.name: float(svc.hit_tokens[:, j].sum() / tokens) for j, t in enumerate(svc.tiers)}
    return Outcome(
        svc.config,
        CONFIGS.get(svc.config, (svc.config,))[0],
        int(n_instances),
        ttft,
        float(np.mean(ttft <= econ.slo_s)),
        *(float(np.percentile(ttft, q)) for q in (50, 90, 99)),
        float(svc.hit_tokens.sum() / tokens),
        per_tier,
        float(svc.service_s.sum() * d.tp),
        float((svc.nocache_s.sum() - svc.service_s.sum()) * d.tp),
        busy_cost_per_mtok(svc, d, econ, duration, tokens),
        cluster,
        local + pooled,
    )


def size_for_slo(
    trace, svc: Service, d: Deployment, econ: Economics, max_instances: int = 64
) -> Outcome | None:
    """The smallest cluster meeting the attainment target (None if even ``max_instances`` fail)."""
    duration = max(float(trace.arrival_s[-1] / econ.load_scale), 1.0)
    lo = max(1, math.ceil(svc.service_s.sum() / duration))  # fewer would never catch up
    if lo > max_instances:
        return None
    if np.mean(svc.service_s <= econ.slo_s) < econ.attainment_target:
        return None  # service alone misses the SLO too often: no cluster size helps
    hi = lo
    while True:
        o = outcome(trace, svc, d, econ, hi)
        if o.attainment >= econ.attainment_target:
            break
        if hi >= max_instances:
            return None
        lo, hi = hi + 1, min(max_instances, hi * 2)
    best = o
    while lo < hi:  # attainment is non-decreasing in the number of FCFS servers
        mid = (lo + hi) // 2
        om = outcome(trace, svc, d, econ, mid)
        if om.attainment >= econ.attainment_target:
            hi, best = mid, om
        else:
            lo = mid + 1
    return best if best.n_instances == hi else outcome(trace, svc, d, econ, hi)


def routed_ttft(trace, svc: Service, d: Deployment, econ: Economics, assignment) -> np.ndarray:
    """TTFT when every request waits for the instance ``assignment`` gives it (a router cannot hand it
    to another idle instance): each instance serves its own requests with continuous batching and
    chunked prefill (:func:`batched_ttft` on one instance), or first come first served when
    ``econ.chunk_tokens`` is 0."""
    assignment = np.asarray(assignment)
    if assignment.shape != (trace.n_requests,):
        raise ValueError(f"assignment must give one instance per request ({trace.n_requests}), "
                         f"got shape {assignment.shape}")
    arr = trace.arrival_s / econ.load_scale
    ttft = np.empty(trace.n_requests)
    for i in np.unique(assignment):
        sel = np.flatnonzero(assignment == i)
        if econ.chunk_tokens:
            sub = dataclasses.replace(svc, hit_tokens=svc.hit_tokens[sel], load_s=svc.load_s[sel])
            part = _Inputs(trace.input_tokens[sel])
            ttft[sel] = batched_ttft(part, sub, d, arr[sel], 1, econ.chunk_tokens)
        else:
            s = svc.service_s[sel]
            ttft[sel] = fcfs_start_times(arr[sel], s, 1) - arr[sel] + s
    return ttft


@dataclass
class _Inputs:
    input_tokens: np.ndarray


def size_routed(trace, tiers, d: Deployment, econ: Economics, policy: str, *, max_instances: int = 64,
                full_s=None, load_slack_s: float = 1.0, affinity_blocks: int = 2, seed: int = 0,
                config: str = "", start: int = 1) -> Outcome | None:
    """The smallest cluster meeting the attainment target when its requests are routed by ``policy``
    to instances with their own local ``tiers`` (:func:`routed_service`: each instance's hits from its
    own stack) and each waits in its instance's queue (:func:`routed_ttft`); None if even
    ``max_instances`` fail. As in :func:`size_for_slo`, a size whose busy time exceeds the trace's
    duration never qualifies. Hits change with the number of instances, so sizes are tried one by one
    from ``start`` (e.g. the single stack's size): downward while the smaller one still meets the
    target, else upward."""
    duration = max(float(trace.arrival_s[-1] / econ.load_scale), 1.0)
    top = min(max_instances, trace.n_requests)
    memo: dict = {}

    def at(n):
        if n not in memo:
            svc, r = routed_service(trace, tiers, d, n, policy, full_s=full_s, load_scale=econ.load_scale,
                                    load_slack_s=load_slack_s, seed=seed, affinity_blocks=affinity_blocks,
                                    config=config)
            if math.ceil(svc.service_s.sum() / duration) > n:  # fewer would never catch up
                memo[n] = None
            else:
                o = outcome(trace, svc, d, econ, n, ttft=routed_ttft(trace, svc, d, econ, r["assignment"]))
                o.extra["routing"] = policy
                memo[n] = o if o.attainment >= econ.attainment_target else None
        return memo[n]

    n = max(1, min(int(start), top))
    if at(n) is not None:
        while n > 1 and at(n - 1) is not None:
            n -= 1
        return at(n)
    while n < top:
        n += 1
        if at(n) is not None:
            return at(n)
    return None


def compare(trace, hc: HitCurve, d: Deployment, econ: Economics, configs=None, max_instances: int = 64):
    """One row per configuration: SLO-sized cluster, TTFT, hit rates, GPU-seconds saved, costs."""
    rows, outcomes = [], {}
    for c in configs or list(CONFIGS):
        svc = service_times(trace, hc, build_tiers(c, d), d, config=c)
        o = size_for_slo(trace, svc, d, econ, max_instances)
        duration = max(float(trace.arrival_s[-1] / econ.load_scale), 1.0)
        busy = busy_cost_per_mtok(svc, d, econ, duration, float(trace.input_tokens.sum()))
        outcomes[c] = (svc, o)
        rows.append(
            {
                "config": c,
                "label": CONFIGS[c][0],
                "hit_rate": float(svc.hit_tokens.sum() / trace.input_tokens.sum()),
                "instances": o.n_instances if o else np.nan,
                "gpus": o.n_instances * d.tp if o else np.nan,
                "attainment": o.attainment if o else np.nan,
                "ttft_p50_s": o.p50_s if o else np.nan,
                "ttft_p90_s": o.p90_s if o else np.nan,
                "ttft_p99_s": o.p99_s if o else np.nan,
                "gpu_seconds": float(svc.service_s.sum() * d.tp),
                "gpu_seconds_saved": float((svc.nocache_s.sum() - svc.service_s.sum()) * d.tp),
                "busy_usd_per_mtok": busy,
                "cluster_usd_per_mtok": o.cluster_usd_per_mtok if o else np.nan,
                "tier_usd_per_h": sum(t.usd_per_s for t in svc.tiers) * 3600.0,
                "mean_load_s": float(svc.load_s.mean()),
                "mean_compute_s": float(svc.compute_s.mean()),
            }
        )
    return rows, outcomes


def write_rows(trace, outcomes: dict, econ: Economics) -> list[dict]:
    """Per configuration and written tier: bytes written per hour of the trace, the drives' rated
    and used drive-writes per day (per busy instance), the read bandwidth kept under those writes,
    and wear against amortisation, in the busy view and for the SLO-sized cluster."""
    rows = []
    hours = max(float(trace.arrival_s[-1] / econ.load_scale), 1.0) / 3600.0
    for c, (svc, o) in outcomes.items():
        busy_s = float(svc.service_s.sum())
        cl = {w["tier"]: w for w in wear(svc, o.n_instances * hours * 3600.0)} if o else {}
        for j, (t, w) in enumerate(zip(svc.tiers, wear(svc, busy_s))):
            if w["written_bytes"] <= 0:
                continue
            rows.append(
                {
                    "config": c,
                    "label": CONFIGS[c][0],
                    "tier": t.name,
                    "tb_written_per_h": w["written_bytes"] / 1e12 / hours,
                    "dwpd_rated": t.dwpd if t.dwpd else np.nan,
                    "dwpd_used_busy": w["dwpd_used"] if np.isfinite(t.tbw_bytes) else np.nan,
                    "read_factor": float(svc.read_factor[j]) if svc.read_factor.size else 1.0,
                    "wear_usd_per_h": w["wear_usd"] / hours,
                    "amortised_usd_per_h_busy": w["amortised_usd"] / hours,
                    "endurance_decides_busy": w["endurance_decides"],
                    "instances": o.n_instances if o else np.nan,
                    "endurance_decides_cluster": cl[t.key]["endurance_decides"] if o else None,
                }
            )
    return rows


def pareto_front(points) -> np.ndarray:
    """Boolean mask of the points (cost, latency) not dominated by any other (both minimised)."""
    pts = np.asarray(points, dtype=float)
    keep = np.ones(len(pts), dtype=bool)
    for i, p in enumerate(pts):
        if not np.all(np.isfinite(p)):
            keep[i] = False
            continue
        dom = np.all(pts <= p, axis=1) & np.any(pts < p, axis=1)
        keep[i] = not dom.any()
    return keep


def pareto_points(trace, outcomes: dict, d: Deployment, econ: Economics, extra_instances: int = 6):
    """(config, instances, cluster cost, p90 TTFT) for each configuration at sizes from its
    SLO-sized cluster upward, plus the smaller sizes down to the throughput floor."""
    rows = []
    duration = max(float(trace.arrival_s[-1] / econ.load_scale), 1.0)
    for c, (svc, o) in outcomes.items():
        floor = max(1, math.ceil(svc.service_s.sum() / duration))
        top = (o.n_instances if o else floor) + extra_instances
        for n in range(floor, top + 1):
            oc = outcome(trace, svc, d, econ, n)
            rows.append(
                {
                    "config": c,
                    "label": CONFIGS[c][0],
                    "instances": n,
                    "cluster_usd_per_mtok": oc.cluster_usd_per_mtok,
                    "ttft_p90_s": oc.p90_s,
                    "attainment": oc.attainment,
                }
            )
    return rows


def breakeven_grid(
    trace,
    hc: HitCurve,
    d: Deployment,
    econ: Economics,
    prices_usd_per_tb,
    bws_gb_s,
    *,
    config: str = "nvme",
    baseline: str = "dram",
):
    """Busy cost per M tokens of ``config`` minus that of ``baseline`` over SSD price x per-drive
    bandwidth (negative = the SSD tier pays). Returns (delta array [bw, price], baseline cost)."""
    duration = max(float(trace.arrival_s[-1] / econ.load_scale), 1.0)
    tokens = float(trace.input_tokens.sum())
    base = busy_cost_per_mtok(
        service_times(trace, hc, build_tiers(baseline, d), d), d, econ, duration, tokens
    )
    out = np.empty((len(bws_gb_s), len(prices_usd_per_tb)))
    for i, bw in enumerate(bws_gb_s):
        dd = d.replace(nvme_bw_override=float(bw) * 1e9)
        svc = service_times(trace, hc, build_tiers(config, dd), dd)
        for j, pr in enumerate(prices_usd_per_tb):
            dp = dd.replace(nvme_usd_per_byte=float(pr) * 1e-12)
            # only the tier cost depends on price: rebuild tiers, reuse service times
            svc_p = dataclasses.replace(svc, tiers=build_tiers(config, dp))
            out[i, j] = busy_cost_per_mtok(svc_p, dp, econ, duration, tokens) - base
    return out, base


def breakeven_price(
    trace,
    hc: HitCurve,
    d: Deployment,
    econ: Economics,
    bw_gb_s: float,
    *,
    config: str = "nvme",
    baseline: str = "dram",
) -> float:
    """SSD price (USD/TB) at which ``config`` costs as much per token as ``baseline`` (busy view) for
    drives of ``bw_gb_s`` read bandwidth each. The cost is linear in the price (service times do
    not depend on it; amortisation and wear both scale with it), so two prices give the zero
    exactly. NaN when the SSD tier never pays (dearer even when free); inf when it always pays."""
    grid, _ = breakeven_grid(trace, hc, d, econ, [0.0, 1000.0], [bw_gb_s], config=config, baseline=baseline)
    d0, d1 = grid[0]
    slope = (d1 - d0) / 1000.0
    if d0 >= 0:
        return float("nan")
    return float("inf") if slope <= 0 else float(-d0 / slope)


def endurance_grid(
    trace,
    hc: HitCurve,
    d: Deployment,
    econ: Economics,
    dwpds,
    prices_usd_per_tb,
    *,
    config: str = "nvme",
    baseline: str = "dram",
):
    """Busy cost per M tokens of ``config`` minus ``baseline`` over the NVMe drives' endurance
    (DWPD) x price: where the SSD tier pays once wear is charged. Returns (delta [dwpd, price],
    baseline cost)."""
    duration = max(float(trace.arrival_s[-1] / econ.load_scale), 1.0)
    tokens = float(trace.input_tokens.sum())
    base_svc = service_times(trace, hc, build_tiers(baseline, d), d)
    base = busy_cost_per_mtok(base_svc, d, econ, duration, tokens)
    svc = service_times(trace, hc, build_tiers(config, d), d)  # endurance and price leave service times alone
    out = np.empty((len(dwpds), len(prices_usd_per_tb)))
    for i, w in enumerate(dwpds):
        for j, pr in enumerate(prices_usd_per_tb):
            dp = d.replace(nvme_dwpd=float(w), nvme_usd_per_byte=float(pr) * 1e-12)
            out[i, j] = (
                busy_cost_per_mtok(
                    dataclasses.replace(svc, tiers=build_tiers(config, dp)), dp, econ, duration, tokens
                )
                - base
            )
    return out, base


def busy_instances(svc: Service, duration_s: float) -> int:
    """Instances kept busy on average (the cluster size the busy view implies), at least one."""
    return max(1, math.ceil(float(svc.service_s.sum()) / duration_s))


def tornado(trace, hc: HitCurve, d: Deployment, econ: Economics, config: str, factors: dict):
    """Busy cost per M tokens when each input moves to its low and high value.

    ``factors``: name -> (field, low, high) where field is a Deployment field, 'gpu_usd_per_s', or
    'routing' (values: 'ideal' for the single stack, or a policy of :mod:`analysis.tiering.cluster`
    at the number of instances the busy view keeps busy)."""
    duration = max(float(trace.arrival_s[-1] / econ.load_scale), 1.0)
    tokens = float(trace.input_tokens.sum())

    def cost(dd, ee, routing="ideal"):
        tiers = build_tiers(config, dd)
        svc = service_times(trace, hc, tiers, dd)
        if routing != "ideal":
            n = min(busy_instances(svc, duration), trace.n_requests)
            svc, _ = routed_service(
                trace, tiers, dd, n, routing, full_s=svc.nocache_s, load_scale=ee.load_scale
            )
        return busy_cost_per_mtok(svc, dd, ee, duration, tokens)

    base = cost(d, econ)
    rows = []
    for name, (fld, lo, hi) in factors.items():
        vals = []
        for v in (lo, hi):
            if fld == "gpu_usd_per_s":
                vals.append(cost(d, dataclasses.replace(econ, gpu_usd_per_s=v)))
            elif fld == "routing":
                vals.append(cost(d, econ, v))
            else:
                vals.append(cost(d.replace(**{fld: v}), econ))
        rows.append(
            {
                "input": name,
                "field": fld,
                "low_value": lo,
                "high_value": hi,
                "cost_low": vals[0],
                "cost_high": vals[1],
                "swing": abs(vals[1] - vals[0]),
            }
        )
    rows.sort(key=lambda r: r["swing"], reverse=True)
    return rows, base


def kv_bytes_per_token(d: Deployment) -> float:
    return kv.kv_bytes_per_token_all_layers(d.model, d.kv_dtype)


def endurance_summary(wrows: list[dict]) -> dict:
    """Verdict values of the write-path section from :func:`write_rows`: the SSD tiers where wear,
    not amortisation, sets the drives' cost (busy view), and the largest ratio of drive writes per
    day used to rated."""
    ssd = [r for r in wrows if r["dwpd_rated"] == r["dwpd_rated"]]
    decides = [r["label"] for r in ssd if r["endurance_decides_busy"]]
    worst = max(ssd, key=lambda r: r["dwpd_used_busy"] / r["dwpd_rated"]) if ssd else None
    return {
        "endurance_decides": decides,
        "n_ssd_configs": len(ssd),
        "worst_label": worst["label"] if worst else "none",
        "worst_ratio": worst["dwpd_used_busy"] / worst["dwpd_rated"] if worst else float("nan"),
    }
