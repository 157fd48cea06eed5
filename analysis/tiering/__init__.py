"""Chapter 2: SSD-offload economics of the KV cache on real request traces.

* :mod:`.trace`      Mooncake-format JSONL traces (validated, line-numbered errors).
* :mod:`.hitcurve`   exact one-pass LRU prefix-cache hit curves for all capacities; tier splits.
* :mod:`.policies`   per-capacity LFU and Belady (and a plain LRU) simulators.
* :mod:`.loadcompute` Mooncake Eq. 1-2 (load vs recompute) and its roofline generalisation.
* :mod:`.tiers`      tier hardware, data paths (CPU bounce vs GPU direct) and costs.
* :mod:`.replay`     trace replay on a prefill cluster with tiers: TTFT, SLO, cost per token.
"""
from ..traces import BLOCK_TOKENS, Trace, TraceError, from_requests, load_trace  # noqa: F401
from .hitcurve import HitCurve, lru_hit_curve, stack_distances  # noqa: F401
