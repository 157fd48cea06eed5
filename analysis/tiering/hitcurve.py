"""Prefix-cache hit rate against capacity, exact, for every capacity from one pass (LRU).

Semantics (prefix caching, as in vLLM/SGLang/Mooncake): a request reuses the *leading* blocks of its
prompt that are in the cache and recomputes the rest; then every block it touched is in the cache,
most recently used last. Under LRU the cache of capacity ``C`` blocks holds exactly the ``C`` most
recently used distinct blocks, so accessing the blocks one after another in prompt order,

* block access ``t`` is in the cache iff its **stack distance** ``d_t`` (1 + the number of distinct
  blocks used since the previous use of the same block; infinite on a first use) is ``<= C``;
* a request's ``k``-th block is a *prefix* hit iff all its first ``k`` blocks are, i.e. iff the
  running maximum ``m_k = max(d_1..d_k)`` within the request is ``<= C`` (hits among the leading
  blocks only permute the top ``C`` of the stack, so membership at request start and at access time
  agree).

Hence one pass computing all ``d_t`` and their per-request running maxima gives the hit count at every
capacity: ``hits(C) = #{(request, k): m_k <= C}``, weighted by blocks or by tokens. The ``d_t`` are
computed offline in ``O(N log^2 N)`` numpy work (no Python loop over accesses): ``d_t - 1`` is the
number of distinct blocks in the window ``(p, t)`` where ``p`` is the previous use, which equals
``#{s < t : prev[s] < p} - (p + 1)``, a 2-D dominance count done level by level over the bits of the
index (each pair ``s < t`` is counted at the highest bit where they differ); see
:func:`stack_distances`.

A hierarchy of exclusive LRU tiers (HBM, then DRAM, then SSD; a block evicted from one tier is
demoted to the next) is the same single stack cut at ``C1``, ``C1 + C2``, ...: the tier that serves
a hit block is the one its own ``d_t`` falls in (:meth:`HitCurve.tier_split`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..traces import Trace


def previous_use(ids: np.ndarray) -> np.ndarray:
    """Index of the previous access of the same id (-1 for a first access)."""
    ids = np.asarray(ids)
    n = ids.size
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    same = s[1:] == s[:-1]
    prev = np.full(n, -1, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    return prev


def earlier_smaller_counts(a: np.ndarray) -> np.ndarray:
    """For each ``i``, ``#{j < i : a[j] < a[i]}`` (vectorised; ``O(n log^2 n)`` numpy work).

    A pair ``j < i`` is counted at the highest bit where ``j`` and ``i`` differ (``j`` has a 0 there,
    ``i`` a 1): at level ``k`` every index in the upper half of a block of ``2^(k+1)`` counts the
    smaller values in the lower half of the same block, by binary search in the sorted lower halves."""
    a = np.asarray(a, dtype=np.int64)
    n = a.size
    out = np.zeros(n, dtype=np.int64)
    if n < 2:
        return out
    y = a - a.min()
    span = int(y.max()) + 2
    idx = np.arange(n, dtype=np.int64)
    for k in range(int(n - 1).bit_length()):
        lower = ((idx >> k) & 1) == 0
        keys = np.sort((idx[lower] >> (k + 1)) * span + y[lower])
        upper = ~lower
        base = (idx[upper] >> (k + 1)) * span
        out[upper] += np.searchsorted(keys, base + y[upper], "left") - np.searchsorted(keys, base, "left")
    return out


def stack_distances(ids: np.ndarray) -> np.ndarray:
    """LRU stack distance of every access (1 = most recently used); first uses get ``U + 1`` where
    ``U`` is the number of distinct ids (larger than any finite distance).

    For an access ``t`` with previous use ``p``: ``d_t - 1`` = distinct ids in ``(p, t)``
    = ``#{s < t : prev[s] < p} - (p + 1)`` (every ``s <= p`` has ``prev[s] < p``; an ``s`` in
    ``(p, t)`` with ``prev[s] < p`` is the first use of its id in the window). First uses
    (``prev = -1``) always count, so only re-uses need the dominance count, among themselves."""
    ids = np.asarray(ids, dtype=np.int64)
    n = ids.size
    prev = previous_use(ids)
    first = prev < 0
    n_distinct = int(first.sum())
    d = np.full(n, n_distinct + 1, dtype=np.int64)
    w = np.flatnonzero(~first)          # re-use accesses, in order
    if w.size == 0:
        return d
    cold_before = np.cumsum(first) - first  # first uses strictly before each index
    p = prev[w]
    d[w] = cold_before[w] + earlier_smaller_counts(p) - (p + 1) + 1
    return d


def segmented_cummax(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` restarted at every segment start (segments given by offsets)."""
    values = np.asarray(values, dtype=np.int64)
    if values.size == 0:
        return values.copy()
    lens = np.diff(offsets)
    seg = np.repeat(np.arange(lens.size, dtype=np.int64), lens)
    big = int(values.max()) - int(values.min()) + 1
    shifted = (values - values.min()) + seg * big
    return np.maximum.accumulate(shifted) - seg * big + values.min()


@dataclass(frozen=True)
class HitCurve:
    """Hit counts of a trace at every LRU capacity (in blocks). Build with :func:`lru_hit_curve`."""

    trace_name: str
    block_size: int
    distance: np.ndarray       # d_t per block access
    run_max: np.ndarray        # m_k per block access (per-request running max of d)
    block_tokens: np.ndarray
    offsets: np.ndarray
    n_distinct: int
    capacities: np.ndarray     # sorted distinct finite run_max values: the curve's step points
    cum_blocks: np.ndarray     # block hits at capacity == capacities[i]
    cum_tokens: np.ndarray     # token hits at capacity == capacities[i]
    total_blocks: int
    total_tokens: int

    def _at(self, cap_blocks, cum) -> np.ndarray:
        c = np.asarray(cap_blocks, dtype=float)
        if np.any(c < 0) or np.any(np.isnan(c)):
            raise ValueError(f"capacity must be >= 0 blocks, got {cap_blocks!r}")
        i = np.searchsorted(self.capacities, np.floor(np.minimum(c, 2**62)), "right")
        full = np.concatenate([[0], cum])
        return full[i]

    def block_hits(self, cap_blocks):
        return self._at(cap_blocks, self.cum_blocks)

    def token_hits(self, cap_blocks):
        return self._at(cap_blocks, self.cum_tokens)

    def block_hit_rate(self, cap_blocks):
        return self.block_hits(cap_blocks) / self.total_blocks

    def token_hit_rate(self, cap_blocks):
        return self.token_hits(cap_blocks) / self.total_tokens

    def token_hit_rate_at_tokens(self, cap_tokens):
        """Token-weighted hit rate for a capacity given in tokens (``floor(tokens / block_size)`` blocks)."""
        return self.token_hit_rate(np.floor(np.asarray(cap_tokens, dtype=float) / self.block_size))

    @property
    def infinite_token_hit_rate(self) -> float:
        return float(self.cum_tokens[-1] / self.total_tokens) if self.cum_tokens.size else 0.0

    @property
    def infinite_block_hit_rate(self) -> float:
        return float(self.cum_blocks[-1] / self.total_blocks) if self.cum_blocks.size else 0.0

    @property
    def saturation_blocks(self) -> int:
        """Smallest capacity (blocks) that reaches the infinite-cache hit count."""
        return int(self.capacities[-1]) if self.capacities.size else 0

    def capacity_for_fraction(self, fraction: float, weight: str = "tokens") -> int:
        """Smallest capacity (blocks) reaching ``fraction`` of the infinite-cache hits."""
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        cum = self.cum_tokens if weight == "tokens" else self.cum_blocks
        i = int(np.searchsorted(cum, fraction * cum[-1], "left"))
        return int(self.capacities[min(i, len(cum) - 1)])

    def per_request_hit_tokens(self, cap_blocks: float) -> np.ndarray:
        """Prefix-hit tokens of each request at one capacity (blocks); 0 for a request without blocks.

        Per-request sums as differences of one cumulative sum at the request offsets
        (``np.add.reduceat`` would give a zero-block request the next request's first block)."""
        w = np.where((self.run_max <= cap_blocks) & (self.run_max <= self.n_distinct), self.block_tokens, 0)
        cum = np.concatenate(([0], np.cumsum(w, dtype=np.int64)))
        return cum[self.offsets[1:]] - cum[self.offsets[:-1]]

    def tier_split(self, tier_blocks) -> np.ndarray:
        """Per-request hit tokens served by each of a hierarchy of exclusive LRU tiers.

        ``tier_blocks`` are the capacities (blocks) of the tiers from fastest to slowest; returns an
        array ``(n_requests, n_tiers)``. A block is a prefix hit iff its running max is within the
        total capacity; it is served by the tier its own stack distance falls into."""
        caps = np.asarray(tier_blocks, dtype=float)
        if caps.ndim != 1 or np.any(caps < 0):
            raise ValueError(f"tier capacities must be a list of numbers >= 0, got {tier_blocks!r}")
        edges = np.cumsum(caps)
        hit = (self.run_max <= (edges[-1] if edges.size else 0)) & (self.run_max <= self.n_distinct)
        tier = np.searchsorted(edges, self.distance, "left")  # d <= edges[j] -> tier j
        out = np.zeros((len(self.offsets) - 1, caps.size), dtype=np.int64)
        req = np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))
        sel = hit & (tier < caps.size)
        np.add.at(out, (req[sel], tier[sel]), self.block_tokens[sel])
        return out


def lru_hit_curve(trace: Trace) -> HitCurve:
    """Exact LRU prefix-cache hit curve of ``trace`` at every capacity, from one pass."""
    d = stack_distances(trace.block_ids)
    m = segmented_cummax(d, trace.offsets)
    n_distinct = int(d.max()) - 1 if d.size else 0  # first uses carry U + 1
    finite = m <= n_distinct
    mf = m[finite]
    order = np.argsort(mf, kind="stable")
    ms = mf[order]
    wt = trace.block_tokens[finite][order]
    last = np.r_[ms[1:] != ms[:-1], True] if ms.size else np.zeros(0, bool)
    caps = ms[last]
    cum_b = (np.flatnonzero(last) + 1).astype(np.int64)
    cum_t = np.cumsum(wt)[last] if ms.size else np.zeros(0, np.int64)
    return HitCurve(trace.name, trace.block_size, d, m, trace.block_tokens, trace.offsets, n_distinct,
                    caps, cum_b, cum_t, int(trace.n_blocks), int(trace.block_tokens.sum()))
