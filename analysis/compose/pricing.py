"""Chapter 2's write path, small-read and routing models plugged into chapter 5's hooks.

Two adapters (chapter 5 never re-implements a chapter-2 model; it calls it and states the glue):

**:class:`RandomReadRecall`** (``Scenario.recall_model``). QEvict recalls *selected* windows: units
of ``unit_tokens`` tokens of one layer and one KV head, ``u = unit_tokens x (stored bytes per
token) / (layers x KV heads)`` bytes each (a few KiB to tens of KiB). A decoding step recalls
``b`` bytes, ``n = b / (layers x u)`` units per layer:

* per layer, on a drive tier (NVMe, QLC, AI SSD), the reads take chapter 2's
  ``tiering.datapath.read_batch_time`` (one read latency, then IOPS- or bandwidth-bound:
  ``min(seq, IOPS_4K x u / ceil(u / 4 KiB))`` per drive, times ``bw_eff``), and never less than the
  tier's delivered bandwidth allows (``latency + b / (layers x tier bandwidth)``: the host links);
  a memory tier (DRAM, CXL) has no IOPS figure and takes ``latency + b / (layers x bandwidth)``;
* with ``prefetch`` the reads of layer ``l + 1`` overlap the compute of layer ``l``
  (``r + (layers - 1) max(r - c, 0)``, ``c`` = the step's compute per layer; chapter 2's
  ``datapath.recall_time`` rule), without it every layer waits (``layers x r``);
* **writes**: the cold copies are written once. In steady state ``B / O`` new sequences join a
  decode batch of ``B`` per step, so the tier absorbs ``w = B x cold bytes / O`` per step; by
  chapter 2's mixed-load rule (``r / R + k w / W <= 1``) they take ``k w / W`` of drive time from
  the reads every step (``W``: the tier's write bandwidth, ``k``: its read slowdown per written
  byte). The writes are asynchronous (buffered) but the drive must keep up, so a step lasts at least
  the drive's busy time: the added time is ``max(stall, layers x r + k w / W - step)``;
* **wear**: ``write_usd = bytes x tier.usd_per_byte_written`` (price / rated bytes written x write
  amplification). The pipeline charges it by chapter 2's replacement rule: a drive is paid by
  amortisation or by wear, whichever is larger (``energy + max(capex, wear)``).

With ``unit_tokens`` large, no prefetch and no write terms it is the sequential model plus one
latency per layer.

**:class:`RoutedReuse`** (the pipeline's ``reuse``). Chapter 2's routing-dependent hit rate: ``N``
instances with their own LRU caches of the capacity the pipeline asks about, requests routed by a
policy of :mod:`analysis.tiering.cluster` (default KV-aware, capped by load, at the replay's
``N``). ``tiering.cluster.route`` gives the token hit rate at a grid of per-instance capacities
(log-spaced up to the trace's distinct blocks), divided by the ideal unbounded cache's (the map's
``hit_rate`` is that of an unbounded ideal cache), interpolated linearly in ``log c`` between grid
points and constant beyond. At ``N = 1`` the grid values are the single stack's exactly (one
instance is the single stack); with ``N`` caches of ``c`` each a router can beat one cache of ``c``
(it is bounded by the pooled store of ``N c``) and loses the sharing across instances at large ``c``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..cache import cached
from ..data import content_id
from ..specs import model as _model
from ..tiering import cluster as cl
from ..tiering import configure, datapath, load_trace, lru_hit_curve
from ..tiering import params as tparams
from ..tiering import replay as rp
from ..tiering.tiers import build_tiers
from .pipeline import ComposeError, ReuseCurve, reuse_curve_from_trace

DRIVE_KEYS = ("nvme", "qlc", "ai_ssd")
ROUTING = ("ideal", "random", "round_robin", "prefix_affinity", "kv_aware")


# ------------------------------------------------------------------------------ recall and writes

@dataclass(frozen=True)
class RandomReadRecall:
    """Recall by small random reads (IOPS, latency, prefetch one layer ahead), cold-copy writes
    sharing the drive (mixed-load rule) and wear (price / TBW). ``drives``: tier key -> (drive
    name in data/hardware.csv, number of drives), from :meth:`from_deployment`."""

    drives: tuple = ()
    bw_eff: float = 0.8
    unit_tokens: int = 32
    prefetch: bool = True
    charge_writes: bool = True
    name: str = "random reads (IOPS, latency), writes and wear"

    def __post_init__(self):
        if not (int(self.unit_tokens) == self.unit_tokens and self.unit_tokens >= 1):
            raise ComposeError(f"unit_tokens must be an integer >= 1, got {self.unit_tokens!r}")
        if not 0 < self.bw_eff <= 1:
            raise ComposeError(f"bw_eff must be in (0, 1], got {self.bw_eff!r}")

    @classmethod
    def from_deployment(cls, d, **kw) -> "RandomReadRecall":
        """The drives of chapter 2's :class:`~analysis.tiering.tiers.Deployment` ``d``."""
        drives = (("nvme", d.nvme_name, int(d.nvme_drives)), ("qlc", d.qlc_name, int(d.qlc_drives)),
                  ("ai_ssd", d.ai_ssd_name, int(d.ai_ssd_drives)))
        return cls(drives=drives, bw_eff=float(d.bw_eff), **kw)

    def unit_bytes(self, tier, model) -> float:
        m = _model(model)
        return self.unit_tokens * tier.bytes_per_token / (m.n_layers * m.n_kv_heads)

    def layer_read_s(self, tier, bytes_per_layer: float, unit_bytes: float) -> float:
        """Seconds to read one layer's ``bytes_per_layer`` as random units of ``unit_bytes``."""
        if bytes_per_layer <= 0:
            return 0.0
        link = tier.latency_s + bytes_per_layer / tier.bandwidth
        drive = {k: (n, c) for k, n, c in self.drives}.get(tier.key)
        if tier.key not in DRIVE_KEYS or drive is None or drive[1] < 1:
            return link
        return max(link, datapath.read_batch_time(drive[0], unit_bytes, bytes_per_layer / unit_bytes,
                                                  drives=drive[1], bw_eff=self.bw_eff))

    def write_s(self, tier, write_bytes_per_step: float) -> float:
        """Drive time the cold-copy writes take from the reads per step (``k w / W``)."""
        if not self.charge_writes or write_bytes_per_step <= 0 or not math.isfinite(tier.write_bw):
            return 0.0
        return tier.interference * write_bytes_per_step / tier.write_bw

    def recall_s(self, tier, bytes_per_step: float, *, model=None, step_s: float = 0.0,
                 write_bytes_per_step: float = 0.0) -> float:
        if model is None:
            raise ComposeError("RandomReadRecall needs the served model (layers and KV heads)")
        L = _model(model).n_layers
        r = self.layer_read_s(tier, float(bytes_per_step) / L, self.unit_bytes(tier, model))
        stall = r + (L - 1) * max(r - step_s / L, 0.0) if self.prefetch else L * r
        # the writes are asynchronous, but the drive must keep up: a step lasts at least the drive's
        # busy time (all reads + the writes' share)
        busy = L * r + self.write_s(tier, float(write_bytes_per_step))
        return max(stall, busy - step_s)

    def write_usd(self, tier, bytes_written: float) -> float:
        return float(bytes_written) * tier.usd_per_byte_written if self.charge_writes else 0.0


# ------------------------------------------------------------------------------ routed reuse

@dataclass(frozen=True)
class RoutedReuse:
    """Chapter 2's routed token hit rate at a grid of per-instance capacities, as a fraction of the
    ideal unbounded cache's, interpolated in ``log`` capacity (see the module docstring)."""

    ideal: ReuseCurve
    grid_tokens: np.ndarray      # per-instance capacities (tokens of the trace), increasing
    fraction: np.ndarray         # routed token hit rate / the ideal unbounded cache's, at each capacity
    n_instances: int = 1
    policy: str = "kv_aware"
    name: str = field(default="")
    max_dip: float = 0.0         # largest drop of the raw routed hit rate as the caches grow (see below)

    def __post_init__(self):
        g, f = np.asarray(self.grid_tokens, float), np.asarray(self.fraction, float)
        if g.ndim != 1 or g.shape != f.shape or g.size < 2 or np.any(np.diff(g) <= 0) or g[0] <= 0:
            raise ComposeError("RoutedReuse: grid_tokens must increase from > 0, one fraction each")
        if np.any(np.diff(f) < 0) or f[0] < 0 or f[-1] > 1 + 1e-12:
            raise ComposeError("RoutedReuse: fractions must be non-decreasing within [0, 1]")

    def at(self, capacity_tokens, input_tokens):
        scaled = np.asarray(capacity_tokens, float) * self.ideal.mean_input_tokens / float(input_tokens)
        g = np.log(self.grid_tokens)
        x = np.log(np.maximum(scaled, 1e-300))
        out = np.interp(x, g, self.fraction)
        # below the grid: the first point's hit rate scaled down with the capacity (0 at no capacity)
        return np.where(scaled < self.grid_tokens[0], self.fraction[0] * scaled / self.grid_tokens[0], out)

    def unbounded(self) -> float:
        """Fraction of the ideal unbounded cache's hits that routing keeps with unbounded caches."""
        return float(self.fraction[-1])

    def __hash__(self):
        return hash((self.name, self.n_instances, self.policy, hash(self.ideal), self.fraction.tobytes()))

    def __eq__(self, other):
        return isinstance(other, RoutedReuse) and hash(self) == hash(other)


def replay_instances(trace="mooncake_conversation", model=None, gpu=None, config: str = "dram") -> int:
    """The number of prefill instances chapter 2's replay keeps busy (its busy view) on ``trace``
    with its default deployment (``model`` and ``gpu`` replaced when given) and local tiers
    ``config``."""
    d = _ch2_deployment(model, gpu)
    tr = load_trace(trace)
    svc = rp.service_times(tr, lru_hit_curve(tr), build_tiers(config, d), d, config=config)
    dur = max(float(tr.arrival_s[-1]) / float(tparams.PARAMS["load_scale"].default), 1.0)
    return min(rp.busy_instances(svc, dur), tr.n_requests)


def _ch2_deployment(model=None, gpu=None):
    d = configure.deployment(tparams.SCHEMA.config())
    kw = {k: v for k, v in (("model", model), ("gpu", gpu)) if v is not None}
    return d.replace(**kw) if kw else d


def routed_reuse(trace="mooncake_conversation", n_instances: int | None = None, policy: str = "kv_aware", *,
                 model=None, gpu=None, config: str = "dram", grid_points: int = 24,
                 load_slack_s: float | None = None, seed: int = 0):
    """Chapter 2's routing-dependent reuse curve of ``trace`` (``policy`` at ``n_instances``; None:
    the replay's busy instances), memoised on disk. ``policy='ideal'`` returns the single-stack
    :class:`~analysis.compose.pipeline.ReuseCurve` itself."""
    if policy not in ROUTING:
        raise ComposeError(f"unknown routing policy {policy!r}; use one of {', '.join(ROUTING)}")
    ideal = reuse_curve_from_trace(trace)
    if policy == "ideal":
        return ideal

    n = replay_instances(trace, model, gpu, config) if n_instances is None else n_instances
    if not (int(n) == n and n >= 1):
        raise ComposeError(f"routing_instances must be an integer >= 1 (0: the replay's), "
                           f"got {n_instances!r}")
    n = int(n)
    slack = float(tparams.PARAMS["routing_load_slack_s"].default if load_slack_s is None else load_slack_s)

    def compute():
        tr = load_trace(trace)
        if n > tr.n_requests:
            raise ComposeError(f"routing_instances = {n} exceeds the trace's {tr.n_requests} requests")
        hc = lru_hit_curve(tr)
        d = _ch2_deployment(model, gpu)
        full = rp.service_times(tr, hc, build_tiers(config, d), d, config=config).nocache_s
        top = float(hc.capacities[-1]) + 1.0
        grid = np.unique(np.round(np.geomspace(8.0, top, grid_points)))
        routed = np.array([cl.route(tr, n, policy, float(c), full_s=full, load_slack_s=slack, seed=seed)
                           ["token_hit_rate"] for c in grid])
        return grid * tr.block_size, routed / hc.token_hit_rate(top)

    grid, raw = cached("compose_routed_reuse", {"trace": content_id(trace), "n": n, "policy": policy,
                                                "model": str(model), "gpu": str(gpu), "config": config,
                                                "points": grid_points, "slack": slack, "seed": seed},
                       compute)
    # a load-capped router can lose a little when caches grow (its choices change); the curve keeps
    # the best hit rate reached at any smaller capacity (the largest such dip is ``max_dip``)
    raw = np.asarray(raw, float)
    frac = np.maximum.accumulate(raw)
    return RoutedReuse(ideal, np.asarray(grid, float), frac, n, policy, f"{trace}/{policy}@{n}",
                       float((frac - raw).max()))

