"""One pipeline: model x workload x KV policy x tier layout x deployment mode -> cost per million
tokens, SLO, fidelity. Everything is computed by the other chapters' public functions; the glue
between them (the adapters below) is small and stated.

For a :class:`Scenario` (SI units):

1. **Deployment** (chapter 3): ``search.best_plan(mode, model, Workload(I, O), SLO, hardware)``,
   with the KV policy's on-device bytes as the KV element size
   (``Precision.kv_bytes = 2 bytes x hot_ratio``: a compressed cache holds more sequences and is
   read faster in decode) and, for the *maturity of disaggregation*, the scale-out bandwidth of
   every device divided by ``transfer_overhead`` (chapter 3 moves the prefill-to-decode KV over it;
   its A/F activations go over the scale-up link unless its grid says otherwise).
2. **Prefix reuse** (chapter 2): the instances that run the prefill carry the tier ``layout``
   (``tiering.tiers.build_tiers``: HBM share, DRAM, CXL, NVMe, QLC, AI SSD, with their capacities,
   delivered bandwidths and amortised cost). A colocated instance keeps no prefix cache in HBM:
   chapter 3 sized its decode batch to fill it; a prefill instance keeps chapter 2's share. The
   workload's reuse has the shape of the Mooncake trace's exact LRU hit curve
   (``tiering.lru_hit_curve``), rescaled to the map's ``hit_rate`` (the hit rate of an unbounded
   cache) and to the context length (prefixes ``I / mean input`` times longer need that many times
   the capacity). The realised hit tokens of each tier shorten the
   prefill: compute of the ``I - H`` new tokens after ``H`` cached ones, timed by the one time model
   (:mod:`analysis.forward`) on the plan's own prefill configuration as chapter 3 priced it (the
   unit's tensor and data parallelism, prompts per pass, device, efficiencies and precision:
   :func:`prefill_pass_time`), overlapped layer by layer with the tier loads (the one overlap rule,
   ``forward.layerwise_overlap``: ``max(c, l) + min(c, l) / layers``), unless that is slower than
   recomputing the whole prompt, which the instance then does (ratio 1, no hit used), as chapter 2's
   replay decides per request. The prefill
   share of the plan's device time and TTFT are scaled by that ratio (*adapter*: the plan itself is
   held fixed, so the cost is an upper bound of a re-optimised plan).
3. **KV policy** (chapter 4): exact copies of quantized windows (QEvict with recall) live in the
   slowest tier of the layout, paid per byte-second for the decode time; recalls add
   ``recall_model.recall_s(tier, batch x recall bytes, model=, step_s=, write_bytes_per_step=)`` to
   every decode step (``step_s``: the step before recalls; ``write_bytes_per_step``: the cold copies
   of the ``batch / O`` sequences that join per step in steady state) and the copies are written once
   per request, ``recall_model.write_usd(tier, bytes)``, charged by chapter 2's replacement rule
   (a drive is paid by amortisation or wear, whichever is larger: only the wear above the copies'
   share of the tier's capex is added). The default :class:`SequentialRecall` is chapter 2's
   sequential-bandwidth model (``bytes / tier bandwidth``) with no write charge;
   :class:`analysis.compose.pricing.RandomReadRecall` is its IOPS/latency, prefetch, mixed-load and
   endurance model.
4. **Cost**: device-seconds per request x GPU cost per second (``tiering.tiers.gpu_usd_per_s``) +
   the layout's tiers for the prefill instance-seconds + the cold copies; divided by the request's
   ``I + O`` tokens. SLOs are re-checked after the adjustments.

Every mode of chapter 3 enters: C, PD, AF, 3-way and PDAF. Chapter 3's plan record exposes each unit's
prefill and decode work (``prefill_share`` of a unit's device time; :meth:`search.Plan.pools` and
:meth:`search.Plan.phases` per pool and phase), which step 2 needs: a unit that runs both phases (C,
and AF's attention/FFN pair with chunked prefill in the decode batch) has only its prefill share scaled
by the reuse ratio; a prefill unit (P, PAF) all of its time. The prefix tiers sit on the attention
devices of a split unit (they hold the KV) and are paid per instance-second of the unit.

**Extension points** (for the write path, the routing and the deployment modes still to come):

* ``Scenario.recall_model``: anything with ``recall_s(tier, bytes_per_step, **context) -> s`` and
  ``write_usd(tier, bytes) -> USD`` (e.g. chapter 2's IOPS/latency and endurance model); the
  default reproduces the sequential-bandwidth pricing exactly.
* ``reuse``: anything with ``at(capacity_tokens, input_tokens) -> fraction of the reusable tokens``
  (:class:`analysis.compose.pricing.RoutedReuse`: chapter 2's routing-dependent hit curve instead
  of the ideal single-cache one).
* :func:`prefill_decode_units`: where a plan is split into the unit that runs the prefill and the
  one that decodes; a mode enters the composition once its plan exposes both.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

import numpy as np

from .. import forward as fw
from .. import kv
from ..cache import cached
from ..data import content_id
from ..disagg import devices as _devices
from ..disagg import search, study
from ..forward import Precision
from ..specs import ModelSpec
from ..specs import model as _model
from ..tiering import load_trace, lru_hit_curve
from ..tiering import tiers as _tiers
from ..tiering.endurance import read_factor
from .fidelity import KVPolicy

MODES = ("C", "PD", "AF", "3-way", "PDAF")
PREFILL_UNIT = {"C": "C", "PD": "P", "AF": "AF", "3-way": "P", "PDAF": "PAF"}
DECODE_UNIT = {"C": "C", "PD": "D", "AF": "AF", "3-way": "DAF", "PDAF": "DAF"}
LAYOUTS = tuple(k for k in _tiers.CONFIGS if k != "pool")  # the pool is cluster-wide, not per instance


class ComposeError(ValueError):
    """A scenario cannot be evaluated as given; the message says why and what is allowed."""


# --------------------------------------------------------------------------------- reuse curve

@dataclass(frozen=True)
class ReuseCurve:
    """Fraction of the unbounded-cache hits reached at each cache capacity, with capacities in
    tokens of a trace whose mean prompt is ``mean_input_tokens`` long."""

    capacity_tokens: np.ndarray  # increasing
    fraction: np.ndarray         # non-decreasing, ends at 1
    mean_input_tokens: float
    name: str = ""

    def __post_init__(self):
        c, f = np.asarray(self.capacity_tokens, float), np.asarray(self.fraction, float)
        if c.ndim != 1 or c.shape != f.shape or c.size == 0:
            raise ComposeError("ReuseCurve: capacity_tokens and fraction must be equal-length 1-D arrays")
        if np.any(np.diff(c) < 0) or np.any(np.diff(f) < 0) or f[0] < 0 or abs(f[-1] - 1) > 1e-9:
            raise ComposeError("ReuseCurve: capacities must increase and fractions rise to 1")
        if not self.mean_input_tokens > 0:
            raise ComposeError("ReuseCurve: mean_input_tokens must be > 0")

    def at(self, capacity_tokens, input_tokens):
        """Fraction of the reusable tokens that a cache of ``capacity_tokens`` (tokens of the served
        workload, prompts of ``input_tokens``) catches."""
        scaled = np.asarray(capacity_tokens, float) * self.mean_input_tokens / float(input_tokens)
        i = np.searchsorted(self.capacity_tokens, scaled, "right")
        return np.concatenate([[0.0], self.fraction])[i]

    def __hash__(self):
        return hash((self.name, self.mean_input_tokens, self.capacity_tokens.size,
                     float(self.capacity_tokens[-1])))

    def __eq__(self, other):
        return isinstance(other, ReuseCurve) and hash(self) == hash(other)


def reuse_curve_from_trace(trace="mooncake_conversation") -> ReuseCurve:
    """The normalised LRU hit curve of a trace (chapter 2), cached on disk."""
    def compute():
        tr = load_trace(trace)
        hc = lru_hit_curve(tr)
        if not hc.cum_tokens.size:
            raise ComposeError(f"trace {trace!r} has no prefix reuse at any capacity")
        return (hc.capacities.astype(float) * tr.block_size, hc.cum_tokens / hc.cum_tokens[-1],
                float(tr.input_tokens.mean()))

    cap, frac, mean_in = cached("compose_reuse", {"trace": content_id(trace)}, compute)
    return ReuseCurve(cap, frac, mean_in, str(trace))


# --------------------------------------------------------------------------------- recall pricing

@dataclass(frozen=True)
class SequentialRecall:
    """Chapter 2's sequential-bandwidth model of the cold tier: a recall of ``b`` bytes takes
    ``b / tier.bandwidth``; writing the cold copies is not charged (their storage is, by the
    byte-second). The default of :class:`Scenario`."""

    name: str = "sequential bandwidth"

    def recall_s(self, tier, bytes_per_step: float, **context) -> float:
        return float(bytes_per_step) / tier.bandwidth

    def write_usd(self, tier, bytes_written: float) -> float:
        return 0.0


# ------------------------------------------------------------------------------------- scenario

@dataclass(frozen=True)
class Scenario:
    model: str | ModelSpec = "Llama-3.1-70B"
    gpu: str = "H100-SXM5-80GB"
    input_tokens: float = 32768
    output_tokens: float = 1000
    hit_rate: float = 0.0            # hit rate the workload reaches with an unbounded prefix cache
    layout: str = "hbm"              # chapter 2 tier configuration of the prefill instances
    mode: str = "C"
    policy: KVPolicy = field(default_factory=KVPolicy.full)
    ttft_slo_s: float = 10.0
    tpot_slo_s: float = 0.1
    budget_devices: int = 64
    transfer_overhead: float = 1.0   # >= 1: scale-out bandwidth for KV / activation transfer divided by it
    tiers: _tiers.Deployment = field(default_factory=_tiers.Deployment)  # prices and devices of the tiers
    gpu_cost_basis: str = "rent"
    gpu_rent_usd_per_s: float = 0.0  # 0: the GPU's rent in data/hardware.csv
    recall_model: object = field(default_factory=SequentialRecall)  # prices recalls and cold-copy writes

    def replace(self, **kw) -> "Scenario":
        return dataclasses.replace(self, **kw)

    def validate(self) -> "Scenario":
        bad = []
        m = _model(self.model)  # unknown names raise UnknownNameError
        for f in ("input_tokens", "output_tokens"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v) and v >= 1):
                bad.append(f"{f} must be a number of tokens >= 1, got {v!r}")
        if not 0 <= self.hit_rate <= 1:
            bad.append(f"hit_rate must be in [0, 1], got {self.hit_rate!r}")
        if self.layout not in LAYOUTS:
            bad.append(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.mode not in MODES:
            bad.append(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for f in ("ttft_slo_s", "tpot_slo_s"):
            v = getattr(self, f)
            if not (math.isfinite(v) and v > 0):
                bad.append(f"{f} must be a time > 0 s, got {v!r}")
        if not (isinstance(self.budget_devices, (int, np.integer)) and self.budget_devices >= 1):
            bad.append(f"budget_devices must be a positive integer, got {self.budget_devices!r}")
        if not (math.isfinite(self.transfer_overhead) and self.transfer_overhead >= 1):
            bad.append(f"transfer_overhead must be >= 1 (1 = chapter 3's network), "
                       f"got {self.transfer_overhead!r}")
        if not isinstance(self.policy, KVPolicy):
            bad.append(f"policy must be a KVPolicy, got {type(self.policy).__name__}")
        if not (callable(getattr(self.recall_model, "recall_s", None))
                and callable(getattr(self.recall_model, "write_usd", None))):
            bad.append("recall_model must have recall_s(tier, bytes) and write_usd(tier, bytes) "
                       "(e.g. pipeline.SequentialRecall())")
        if bad:
            raise ComposeError("invalid scenario: " + "; ".join(bad))
        _devices.device(self.gpu)
        if self.input_tokens + self.output_tokens > m.max_context:
            raise ComposeError(f"{self.input_tokens + self.output_tokens:,.0f} tokens exceed {m.name}'s "
                               f"context window of {m.max_context:,}")
        return self


@dataclass
class Result:
    feasible: bool                  # a plan exists, everything fits and the SLOs hold
    reason: str = ""
    usd_per_mtok: float = math.inf
    gpu_usd_per_mtok: float = math.inf
    tier_usd_per_mtok: float = 0.0
    cold_usd_per_mtok: float = 0.0
    ttft_s: float = math.nan
    tpot_s: float = math.nan
    meets_slo: bool = False
    realized_hit_rate: float = 0.0
    prefill_ratio: float = 1.0
    recall_s_per_step: float = 0.0
    cold_write_usd_per_mtok: float = 0.0
    output_tokens_per_s_per_device: float = math.nan
    plan_tokens_per_s_per_device: float = math.nan
    prefix_write_usd_per_mtok: float = 0.0  # wear of the prefix cache's demotions above the tiers' capex
    plan_overlap: bool = True               # chapter 3's plan with overlap searched (False: the fallback)
    # the grid edges chapter 3's plan sits on (search.grid_edges codes, comma-joined; "" inside the grid;
    # None where no plan was found)
    plan_edges: str | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------- adapters

def hardware(gpu: str, transfer_overhead: float = 1.0) -> dict:
    """Chapter 3's hardware dict (every role on ``gpu``), with the GPU's scale-out bandwidth (its NIC
    per GPU in data/hardware.csv, chapter 3's default where the file has none) divided by
    ``transfer_overhead`` (1 returns exactly ``search.default_hardware(gpu)``)."""
    if transfer_overhead == 1.0:
        return search.default_hardware(gpu)
    dev = _devices.device(gpu, net_bw=_devices.device(gpu)["net"] / float(transfer_overhead))
    return search.default_hardware([dev])


def precision(hot_ratio: float) -> Precision:
    """Chapter 3's precision with a KV policy's on-device bytes per element (exactly the default
    ``Precision()`` when ``hot_ratio`` = 1)."""
    if not 0 < hot_ratio <= 1:
        raise ComposeError(f"hot_ratio must be in (0, 1], got {hot_ratio!r}")
    if hot_ratio == 1.0:
        return Precision()
    base = Precision()  # chapter 3's default precision (bf16 KV: the one bytes-per-dtype table)
    return dataclasses.replace(base, kv_bytes=base.kv_bytes * hot_ratio)


@functools.lru_cache(maxsize=4096)
@search.keeps_edges
def plan(mode: str, model, gpu: str, input_tokens: float, output_tokens: float, ttft_slo_s: float,
         tpot_slo_s: float, budget: int, kv_hot_ratio: float, transfer_overhead: float,
         overlap: bool = True) -> search.Plan:
    """Chapter 3's best plan (memoised in the process), searched over chapter 3's grid on GPUs
    (:func:`analysis.disagg.study.gpu_grid`: two-micro-batch overlap of communication and compute in
    C, P and D instances included, as chapter 3 searches it); ``overlap=False``: the grid without it.
    The plan keeps its grid edges (:attr:`~analysis.disagg.search.Plan.edges`, carried into
    :attr:`Result.plan_edges`) and raises no :class:`~analysis.disagg.search.GridEdgeWarning`: the
    chapter prices hundreds of plans and states their edges in one line (:func:`.decide.edge_counts`)."""
    return search.best_plan(mode, model, search.Workload(input_tokens, output_tokens),
                            search.SLO(ttft_slo_s, tpot_slo_s), hardware(gpu, transfer_overhead),
                            budget=int(budget), prec=precision(kv_hot_ratio),
                            grid=study.gpu_grid() if overlap else search.Grid())


def _instance_gpus(unit: dict) -> int:
    """GPUs of an instance that hold its KV (all of a single-pool unit, the attention side of a split)."""
    return int(unit["size"] if "size" in unit else unit["n_a"])


def _instance_s(unit: dict) -> float:
    """Instance-seconds per request of a unit (its device-seconds over its devices per instance)."""
    return unit["dev_per_rate"] / unit["devices"]


@functools.lru_cache(maxsize=4096)
def _tier_list(layout: str, d: _tiers.Deployment):
    return _tiers.build_tiers(layout, d)


@functools.lru_cache(maxsize=4096)
def _tier_deployment(d: _tiers.Deployment, model, gpu: str, tp: int) -> _tiers.Deployment:
    return d.replace(model=model, gpu=gpu, tp=int(tp), kv_dtype="bf16")


def tier_deployment(s: Scenario, tp: int) -> _tiers.Deployment:
    """Chapter 2's tier deployment of the scenario's prices and devices on an instance of ``tp``
    GPUs of the scenario's model and GPU."""
    return _tier_deployment(s.tiers, s.model, s.gpu, int(tp))


def prefill_config(unit) -> tuple[float, float, float, float]:
    """``(tp, dp, prompts per pass, micro-batches)`` of the prefill passes of a plan unit, as chapter 3
    priced them: the unit's tensor-parallel degree, its instance's data-parallel ranks, the prompts a
    prefill pool batches per pass (``pbatch``; one prompt otherwise, split over the ranks by context
    parallelism) and the pool's micro-batches. A split unit is timed as its attention side holding
    the FFN too (one micro-batch): an approximation of its ratio, not of its time. An int ``n``
    stands for one prompt on an instance of ``n`` GPUs in one tensor-parallel group."""
    if not isinstance(unit, dict):
        return float(unit), 1.0, 1.0, 1.0
    tp = float(unit["tp"])
    pool = "pbatch" in unit
    return (tp, _instance_gpus(unit) / tp, float(unit["pbatch"]) if pool else 1.0,
            float(unit.get("ovl", 1.0)) if pool else 1.0)


def prefill_ratio(s: Scenario, tiers, unit, reuse: ReuseCurve) -> tuple[float, float]:
    """(prefill service time with the realised prefix hits / without, realised hit rate) of the plan
    unit ``unit`` that runs the prefill (:func:`prefill_config`)."""
    if s.hit_rate == 0:
        return 1.0, 0.0
    sig = tuple((t.capacity_tokens, t.bandwidth, t.bytes_per_token, t.latency_s) for t in tiers)
    return _prefill_ratio(s.model, s.gpu, float(s.policy.hot_ratio), float(s.transfer_overhead),
                          prefill_config(unit), float(s.input_tokens), float(s.hit_rate), sig, reuse)


def prefill_pass_time(model, gpu: str, hot_ratio: float, transfer_overhead: float, config, new_tokens,
                      prefix_tokens) -> float:
    """Seconds of one prefill pass of the plan's configuration ``config`` (:func:`prefill_config`)
    computing ``new_tokens`` per prompt after ``prefix_tokens`` cached ones: the one time model with
    chapter 3's device, efficiencies and the plan's precision, as the plan itself was priced."""
    tp, dp, seqs, m = config
    dev = hardware(gpu, transfer_overhead)["C"][0]
    return float(fw.colocated_pass_time(fw.shape_of(model), precision(hot_ratio), fw.Efficiency(),
                                        _devices.device(dev), tp=tp, dp=dp, microbatches=m, pre_seqs=seqs,
                                        pre_len=new_tokens, pre_prefix=prefix_tokens))


@functools.lru_cache(maxsize=65536)
def _prefill_ratio(model, gpu, hot_ratio, transfer_overhead, config, I, hit_rate, sig, reuse):
    edges = np.cumsum([c for c, *_ in sig])
    frac = reuse.at(edges, I)
    per_tier = hit_rate * np.diff(np.concatenate([[0.0], frac])) * I  # hit tokens served by each tier
    H = min(float(per_tier.sum()), I - 1.0)
    if H <= 0:
        return 1.0, 0.0
    c0 = prefill_pass_time(model, gpu, hot_ratio, transfer_overhead, config, I, 0.0)
    ch = prefill_pass_time(model, gpu, hot_ratio, transfer_overhead, config, I - H, H)
    # the instance's tiers serve the prefixes of every prompt of the pass
    load = config[2] * sum(h * bpt / bw + lat for h, (_, bw, bpt, lat) in zip(per_tier, sig)
                           if h > 0 and math.isfinite(bw))
    svc = float(fw.layerwise_overlap(ch, load, _model(model).n_layers))
    if svc >= c0:  # loading is slower than recomputing the whole prompt: recompute, as the replay does
        return 1.0, 0.0
    return svc / c0, H / I


# declared: prefix demotions may take at most this share of a drive's time; the rest are not admitted
WRITE_SHARE_CAP = 0.5


def prefix_writes(s: Scenario, tiers, reuse: ReuseCurve, inst_s: float) -> tuple[list, list, list, float]:
    """The prefix cache's demotions (chapter 2's write path in closed form): (host bytes written into
    each tier per request, the fraction of its read bandwidth each tier keeps under those writes, the
    fraction of the demotions each tier admits, wear USD per request above the tiers' capex share).

    The tiers are one LRU stack cut at cumulative capacities ``E_0 < E_1 < ...``; an access's block is
    written into tier ``j`` iff it sinks below ``E_{j-1}`` before its next use (chapter 2's crossing
    rule, :func:`analysis.tiering.endurance.crossings`), i.e. iff its next reuse is not a hit within
    ``E_{j-1}``. In steady state that is the miss fraction at ``E_{j-1}``: ``I (1 - h f(E_{j-1}))``
    tokens per request (``f``: the reuse curve, ``h``: the hit rate; ``E_{-1} = 0``: every token
    enters the top tier). A tier absorbs them at ``bytes / instance-second``; a drive whose writes
    would take more than ``WRITE_SHARE_CAP`` of its time under the mixed-load rule (``k w / W``) admits
    only that share (bandwidth-limited admission; what it does not admit never reaches the tiers below,
    and its useful capacity shrinks in proportion); reads keep
    :func:`analysis.tiering.endurance.read_factor` of their bandwidth. Wear is
    ``bytes x usd_per_byte_written``, charged by chapter 2's replacement rule (only the wear above the
    tier's capex share of the request)."""
    I = float(s.input_tokens)
    edges = np.cumsum([t.capacity_tokens for t in tiers])
    above = np.concatenate([[0.0], edges[:-1]])
    written, keep, admit, wear, passed = [], [], [], 0.0, 1.0
    for t, e in zip(tiers, above):
        f = float(reuse.at(np.array([e]), I)[0]) if e > 0 else 0.0
        b = I * (1.0 - s.hit_rate * f) * t.bytes_per_token * passed
        a = 1.0
        if math.isfinite(t.write_bw) and inst_s > 0 and b > 0:
            share = t.interference * b / inst_s / t.write_bw
            a = min(1.0, WRITE_SHARE_CAP / share)
            b *= a
            keep.append(float(read_factor(b / inst_s, t.write_bw, t.interference)))
        else:
            keep.append(1.0)
        passed *= a
        written.append(b)
        admit.append(passed)
        wear += max(0.0, s.recall_model.write_usd(t, b) - t.capex_usd_per_s * inst_s)
    return written, keep, admit, wear


def prefill_decode_units(mode: str, p: search.Plan) -> tuple[dict, dict, dict]:
    """(all units by name, the unit that runs the prefill, the unit that decodes) of a chapter-3 plan,
    copied so that the composition may adjust them; the same dict twice when one unit runs both phases
    (C, AF), its ``prefill_share`` being the prefill part of its device time. A mode the composition
    does not know, or a plan record without the phase split, raises :class:`ComposeError`."""
    if mode not in PREFILL_UNIT:
        raise ComposeError(f"mode {mode!r}: chapter 3's plan does not separate prefill from decode work; "
                           f"modes: {', '.join(MODES)}")
    units = {u["unit"]: dict(u) for u in p.units}
    missing = [n for n, u in units.items() if "prefill_share" not in u]
    if missing:
        raise ComposeError(f"mode {mode!r}: units {', '.join(missing)} of the plan do not separate prefill "
                           "from decode work (no prefill_share; a plan from search.best_plan has it)")
    try:
        return units, units[PREFILL_UNIT[mode]], units[DECODE_UNIT[mode]]
    except KeyError as e:
        raise ComposeError(f"mode {mode!r}: the plan has no unit {e.args[0]!r} "
                           f"(units: {', '.join(units)})") from None


def evaluate(s: Scenario, reuse: ReuseCurve | None = None) -> Result:
    """Cost per million tokens (input + output), latencies and SLO check of one scenario, on chapter 3's
    best plan (overlap searched). The plan is chosen before the composition adds recalls and cold
    copies, so a plan at the edge of the TPOT SLO or of the memory can fail once they are added; then
    the best plan without two-micro-batch overlap (smaller batches) is tried too (a partial
    re-optimisation, stated in the chapter) and the feasible one is returned."""
    r = _evaluate(s, reuse, True)
    if r.feasible or r.reason.startswith("chapter 3:") or not s.policy.needs_cold_tier:
        return r
    r2 = _evaluate(s, reuse, False)
    return r2 if r2.feasible else r


def _evaluate(s: Scenario, reuse: ReuseCurve | None, overlap: bool) -> Result:
    s.validate()
    pol = s.policy
    if pol.needs_cold_tier and s.layout == "hbm":
        return Result(False, f"{pol.label} keeps exact copies off the device: it needs a layout with an "
                             "off-HBM tier")
    p = plan(s.mode, s.model, s.gpu, float(s.input_tokens), float(s.output_tokens), float(s.ttft_slo_s),
             float(s.tpot_slo_s), int(s.budget_devices), float(pol.hot_ratio), float(s.transfer_overhead),
             overlap)
    if not p.feasible:
        return Result(False, f"chapter 3: {p.reason}")
    edges = ",".join(p.edges)
    I, O = float(s.input_tokens), float(s.output_tokens)
    units, up, ud = prefill_decode_units(s.mode, p)
    # 2. prefix reuse through the layout's tiers on the prefill instances
    tp_p = _instance_gpus(up)
    dp_ = tier_deployment(s, tp_p)
    both = up is ud  # one unit runs both phases (C, AF)
    if both:  # the colocated plan fills its HBM with the decode batch it was sized for
        dp_ = dp_.replace(hbm_cache_fraction=0.0)
    tiers = _tier_list(s.layout, dp_)
    if s.hit_rate > 0 and reuse is None:
        reuse = reuse_curve_from_trace()
    r, h_real = prefill_ratio(s, tiers, up, reuse) if s.hit_rate > 0 else (1.0, 0.0)
    prefix_write_usd_per_req = 0.0
    if s.hit_rate > 0 and getattr(s.recall_model, "charge_writes", False):
        # the prefix cache's demotions: wear, and drive time taken from the loads (one pass: the
        # instance-seconds before the writes slow the loads, so the write rate is an upper bound)
        share = up["prefill_share"] if both else 1.0
        inst_s = _instance_s(up) * (1 - share + share * r)
        written, keep, admit, prefix_write_usd_per_req = prefix_writes(s, tiers, reuse, inst_s)
        if any(k < 1 for k in keep) or any(x < 1 for x in admit):
            sig = tuple((t.capacity_tokens * x, t.bandwidth * k, t.bytes_per_token, t.latency_s)
                        for t, k, x in zip(tiers, keep, admit))
            r, h_real = _prefill_ratio(s.model, s.gpu, float(s.policy.hot_ratio), float(s.transfer_overhead),
                                       prefill_config(up), float(s.input_tokens), float(s.hit_rate), sig,
                                       reuse)
    ttft = p.ttft_s * r
    if r != 1.0 and both:
        share = up["prefill_share"]                 # prefill share of the unit's device time (chapter 3)
        factor = 1 - share + share * r
        up["dev_per_rate"] *= factor
        up["tpot"] *= factor
    elif r != 1.0:
        up["dev_per_rate"] *= r
    # 3. recall traffic and cold copies of the policy, in the slowest tier of the layout
    recall_s = cold_usd_per_req = write_usd_per_req = 0.0
    tpot_new = ud["tpot"]
    if pol.needs_cold_tier:
        cold = _tier_list(s.layout, tier_deployment(s, _instance_gpus(ud)))[-1]
        kv_seq = kv.kv_bytes(s.model, I + O / 2.0, 1, "bf16")
        # bytes on the tier / bf16 bytes
        stored = cold.bytes_per_token / kv.kv_bytes_per_token_all_layers(s.model, "bf16")
        B = ud["batch"]
        cold_bytes_seq = pol.cold_ratio * kv_seq * stored
        # steady state: B / O sequences join the batch per step, each writing its cold copies once
        recall_s = s.recall_model.recall_s(cold, B * pol.recall_ratio_per_step * kv_seq * stored,
                                           model=s.model, step_s=ud["tpot"],
                                           write_bytes_per_step=B * cold_bytes_seq / O)
        tpot_new = ud["tpot"] + recall_s
        ud["dev_per_rate"] *= tpot_new / ud["tpot"]
        cap_bytes = cold.capacity_tokens * cold.bytes_per_token
        if B * cold_bytes_seq > cap_bytes:
            return Result(False, f"cold copies of {B:.0f} sequences ({B * cold_bytes_seq / 1e9:.0f} GB) "
                                 f"exceed the {cold.name} tier ({cap_bytes / 1e9:.0f} GB)",
                          plan_overlap=overlap, plan_edges=edges)
        cold_usd_per_req = cold.usd_per_s / cap_bytes * cold_bytes_seq * O * tpot_new
        # chapter 2's replacement rule: a drive is paid by amortisation or by wear, whichever is larger
        # (energy + max(capex, wear)); the storage share above already pays the capex part
        capex_usd_per_req = cold.capex_usd_per_s / cap_bytes * cold_bytes_seq * O * tpot_new
        write_usd_per_req = max(0.0, s.recall_model.write_usd(cold, cold_bytes_seq) - capex_usd_per_req)
        ud["tpot"] = tpot_new
    tpot = max(u["tpot"] for u in units.values() if "tpot" in u)
    # 4. cost
    gpu_s = _tiers.gpu_usd_per_s(tier_deployment(s, tp_p), s.gpu_cost_basis, s.gpu_rent_usd_per_s)
    dev_s = sum(u["dev_per_rate"] for u in units.values())
    tier_usd_s = sum(t.usd_per_s for t in tiers)
    gpu_usd = dev_s * gpu_s
    tier_usd = _instance_s(up) * tier_usd_s
    per_m = 1e6 / (I + O)
    meets = bool(ttft <= s.ttft_slo_s * (1 + 1e-12) and tpot <= s.tpot_slo_s * (1 + 1e-12))
    usd = (gpu_usd + tier_usd + cold_usd_per_req + write_usd_per_req + prefix_write_usd_per_req) * per_m
    reason = "" if meets else (f"SLO missed after the tier loads / recalls: TTFT {ttft:.3g} s "
                               f"(SLO {s.ttft_slo_s:g}), TPOT {tpot * 1e3:.3g} ms "
                               f"(SLO {s.tpot_slo_s * 1e3:g})")
    return Result(meets, reason, usd, gpu_usd * per_m, tier_usd * per_m, cold_usd_per_req * per_m,
                  ttft, tpot, meets, h_real, r, recall_s, write_usd_per_req * per_m, O / dev_s,
                  p.tokens_per_s_per_device, prefix_write_usd_per_mtok=prefix_write_usd_per_req * per_m,
                  plan_overlap=overlap, plan_edges=edges)
