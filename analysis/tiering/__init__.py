"""Chapter 2: SSD-offload economics of the KV cache on real request traces.

* :mod:`analysis.traces` Mooncake-format JSONL traces (re-exported here).
* :mod:`.hitcurve`   exact one-pass LRU prefix-cache hit curves for all capacities; tier splits.
* :mod:`.policies`   per-capacity LFU and Belady (and a plain LRU) simulators.
* :mod:`.loadcompute` Mooncake Eq. 1-2 (load vs recompute) as the paper writes them, and the
  break-even with recomputation timed by the one time model (:mod:`analysis.forward`).
* :mod:`.tiers`      tier hardware, data paths (CPU bounce vs GPU direct) and costs.
* :mod:`.replay`     trace replay on a prefill cluster with tiers: TTFT (continuous batching with
  chunked prefill), SLO, cost per token, break-even and sensitivity solves.
* :mod:`.prefill`    prefill and decode steps of a deployment, a thin call-through to the one time
  model (:mod:`analysis.forward`).
* :mod:`.endurance`  bytes written per tier, drive endurance and wear, reads under mixed load.
* :mod:`.admission`  admission and eviction policies with libCacheSim (hit rate, bytes written).
* :mod:`.cluster`    N instances with their own caches under routing policies; the pooled store.
* :mod:`.datapath`   small random reads by IOPS and latency; recall with prefetch (chapter 5).
"""
from ..traces import BLOCK_TOKENS, Trace, TraceError, from_requests, load_trace  # noqa: F401
from .hitcurve import HitCurve, lru_hit_curve, stack_distances  # noqa: F401
