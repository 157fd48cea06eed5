"""Deployment modes and the vectorised parallelism / sizing search.

A *role* is a set of identical instances doing one job: colocated serving (``C``), prefill (``P``),
decode (``D``), or one side of an attention/FFN split (``A``/``F`` for both phases, ``PA``/``PF``
for prefill, ``DA``/``DF`` for decode). Modes are compositions of roles:

=========  ==========================================  ==========================================
mode       roles                                       what runs where
=========  ==========================================  ==========================================
C          C                                           continuous batching + chunked prefill
PD         P, D                                        prefill pool, decode pool, KV transfer
AF         A, F                                        attention pool, FFN pool, both phases
3-way      P, DA, DF                                   prefill pool; decode split attention/FFN
PDAF       PA, PF, DA, DF                              both phases split attention/FFN
=========  ==========================================  ==========================================

Every candidate configuration of a role (devices, TP, DP/EP, batch, micro-batches, chunk size,
prefill utilisation, device type) is priced at once with numpy; the mode's plan then combines its
roles' best feasible candidates (an instance splits into whole data-parallel groups: its devices a
multiple of its TP degree; the prefill utilisation is searched up to 0.95; a best plan at the top of an
axis or filling the budget raises a :class:`GridEdgeWarning`). Pools are *rate-matched*: a plan's
throughput per device is ``1 / sum(devices per (request/s) of each phase)``, i.e. devices are shared
between the phases in the proportion their work needs (pools of fractional size; the plan picture
scales them to the budget). Instances must fit the budget together (one instance of each role at least).

Latency model (per request, steady state, open arrivals at the utilisation the plan chooses):
* C / AF: a fraction ``f = B I / (O K)`` of iterations carry a prefill chunk of ``K`` tokens
  (interference); TPOT is the mean iteration time, TTFT = ``ceil(I/K)`` mixed iterations + M/D/1
  wait for the chunk slot + half an iteration.
* P: batches of ``b`` prompts at utilisation ``rho``: TTFT = pass + M/D/1 wait + batch-forming wait
  + exposed KV transfer (layer-wise overlapped, over the prefill instance's NICs).
* D / DA+DF: TPOT = one decode iteration at the mean context ``I + O/2``.
* A/F split: per layer with ``m`` ping-pong micro-batches, ``max(m * max(a, f, x), a + f + x)`` for
  attention ``a``, FFN ``f`` and activation transfer ``x`` of one micro-batch.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import math
import time
import warnings
from dataclasses import dataclass, field, replace

import numpy as np

from .. import forward as costs
from ..forward import Efficiency, Precision
from . import devices as _devices

MODES = ("C", "PD", "AF", "3-way", "PDAF")
MODE_ROLES = {"C": ("C",), "PD": ("P", "D"), "AF": ("A", "F"), "3-way": ("P", "DA", "DF"),
              "PDAF": ("PA", "PF", "DA", "DF")}
ROLES = ("C", "P", "D", "A", "F", "PA", "PF", "DA", "DF")


class SearchError(ValueError):
    """Bad search input (SLO, workload, budget, role hardware)."""


class GridEdgeWarning(UserWarning):
    """The best plan sits at an edge of the search grid (its largest instance size, batch, prefill
    utilisation, ..., or the device budget): a better plan may lie beyond it. Raised by
    :func:`best_plan` (and :func:`analysis.disagg.production.best_decode`) with the edges named;
    :func:`describe_edges` words them."""


@dataclass(frozen=True)
class Workload:
    """Requests of ``input_tokens`` prompt and ``output_tokens`` generated tokens (means, tokens).

    ``prefix_hit``: share of the prompt found in a prefix cache (0 to 1, below 1): prefill computes
    the missed ``(1 - prefix_hit) * input_tokens`` after the cached prefix and loads the hits' KV at
    ``hit_bw`` bytes/s per device (default: already in HBM, free). ``lengths``: optional
    ``(inputs, outputs)`` sequences of per-request lengths (e.g. from a trace) for the discrete-event
    simulation (:mod:`analysis.disagg.des`); the analytic screen uses the means."""

    input_tokens: float
    output_tokens: float
    name: str = ""
    prefix_hit: float = 0.0
    hit_bw: float = float("inf")
    lengths: tuple | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self):
        for f in ("input_tokens", "output_tokens"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v) and v >= 1):
                raise SearchError(f"Workload.{f} must be a finite number >= 1 token, got {v!r}")
        if not (isinstance(self.prefix_hit, (int, float, np.floating)) and 0 <= self.prefix_hit < 1):
            raise SearchError(f"Workload.prefix_hit must be a share in [0, 1), got {self.prefix_hit!r}")
        if not self.hit_bw > 0:
            raise SearchError(f"Workload.hit_bw must be a bandwidth > 0 bytes/s, got {self.hit_bw!r}")
        if self.lengths is not None:
            ins, outs = (np.asarray(x, dtype=float) for x in self.lengths)
            bad = ins.shape != outs.shape or ins.ndim != 1 or len(ins) == 0
            if bad or (ins < 1).any() or (outs < 1).any():
                raise SearchError("Workload.lengths must be two equal-length sequences of token counts >= 1")
            object.__setattr__(self, "lengths", (ins, outs))

    @classmethod
    def from_lengths(cls, inputs, outputs, **kw) -> "Workload":
        """A workload whose means and length distribution come from per-request lengths."""
        ins, outs = np.asarray(inputs, dtype=float), np.asarray(outputs, dtype=float)
        return cls(float(ins.mean()), float(outs.mean()), lengths=(ins, outs), **kw)

    @property
    def missed_tokens(self) -> float:
        """Prompt tokens prefill computes (the rest is a prefix-cache hit)."""
        return self.input_tokens * (1.0 - self.prefix_hit)


@dataclass(frozen=True)
class SLO:
    ttft_s: float
    tpot_s: float

    def __post_init__(self):
        for f in ("ttft_s", "tpot_s"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v) and v > 0):
                raise SearchError(f"impossible SLO: {f} must be a finite time > 0 seconds, got {v!r}")


def _p2(lo, hi):
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return tuple(out)


@dataclass(frozen=True)
class Grid:
    """The candidate values the search enumerates (each role takes the product of its axes)."""

    sizes: tuple = _p2(1, 64)                 # devices per instance (per pool for A/F)
    tps: tuple = (1, 2, 4, 8)                 # tensor-parallel degree (DP/EP = size / tp)
    batches: tuple = _p2(1, 4096)             # decode sequences per instance
    chunks: tuple = _p2(512, 32768)           # chunked-prefill tokens per iteration (C, AF)
    prefill_batches: tuple = (1, 2, 4, 8, 16)  # prompts per prefill pass
    utilisations: tuple = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)  # prefill pool utilisation
                                              # (searched up to 0.95; a plan at the top is an edge)
    microbatches: tuple = (1, 2, 3)           # ping-pong micro-batches (A/F split)
    overlaps: tuple = (1,)                    # micro-batches overlapping communication with compute
                                              # (C, P, D instances: DeepSeek's two-micro-batch overlap);
                                              # chapter 3 searches (1, 2), see study.gpu_grid
    af_over_scaleup: bool = True              # A/F activations over the scale-up link (NVLink-class
                                              # domain holding both pools) rather than scale-out NICs

    def __post_init__(self):
        for name in ("sizes", "tps", "batches", "chunks", "prefill_batches", "utilisations", "microbatches",
                     "overlaps"):
            v = getattr(self, name)
            if not (isinstance(v, (tuple, list)) and len(v) > 0):
                raise SearchError(f"Grid.{name} must be a non-empty tuple of values, got {v!r}")
        if not all(0 < u < 1 for u in self.utilisations):
            raise SearchError(f"Grid.utilisations must lie in (0, 1) (a prefill pool at utilisation 1 has "
                              f"no steady state), got {self.utilisations!r}")

    def limited(self, budget: int) -> "Grid":
        sz = tuple(x for x in self.sizes if x <= budget)
        if not sz:
            raise SearchError(f"budget {budget} devices is smaller than every instance size {self.sizes}")
        return replace(self, sizes=sz)


def _mesh(**axes):
    keys = list(axes)
    grids = np.meshgrid(*[np.asarray(axes[k], dtype=float) for k in keys], indexing="ij")
    return {k: g.ravel() for k, g in zip(keys, grids)}


def prefill_ttft(t_pass, rho, b, exposed):
    """TTFT of a prefill pool serving batches of ``b`` prompts, each pass taking ``t_pass``, at
    utilisation ``rho`` (open Poisson arrivals): the pass, the M/D/1 wait for the server
    ``rho / (2 (1 - rho)) t_pass``, the mean wait for the batch to fill ``(b - 1) / (2 rho b) t_pass``
    (prompts arrive at ``rho b / t_pass``; a prompt waits for half of the other ``b - 1``), and the
    exposed KV transfer (:func:`analysis.forward.kv_transfer_exposed`)."""
    return t_pass + rho / (2 * (1 - rho)) * t_pass + (b - 1) / (2 * rho * b) * t_pass + exposed


def _cap(dev, eff):
    return dev["cap"] * (1.0 - eff.mem_reserve)


# ------------------------------------------------------------------------------ role candidates

def _split_step(s, prec, eff, da, df, *, tp, n_a, n_f, m, scaleup=True, **pass_kw):
    """Forward-pass time of an attention/FFN split with ``m`` ping-pong micro-batches; ``pass_kw``
    describe the whole pass and are divided among micro-batches."""
    a, f, x1 = split_layer_parts(s, prec, eff, da, df, tp=tp, n_a=n_a, n_f=n_f, m=m, scaleup=scaleup,
                                 **pass_kw)
    return s.n_layers * af_layer_time(a, f, x1, m, eff.overlap) + eff.step_overhead_s


# Within one unit's search over device pairs (:func:`unit_candidates` of a split unit on named devices),
# the attention side of a pass depends on the attention device only and the FFN side on the FFN device
# only: each is priced once per device and reused for every pair (with the operators it priced replayed,
# in order, into the active ledger), instead of once per pair. Same operations, same values.
_SIDE_MEMO: contextvars.ContextVar = contextvars.ContextVar("split_side_memo", default=None)


class _Recorder(costs.Ledger):
    """A ledger that keeps its calls, to replay them into another ledger."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def add(self, kind, seconds, measured):
        self.calls.append((kind, seconds, measured))


def _array_key(kw: dict) -> tuple:
    out = []
    for k in sorted(kw):
        v = kw[k]
        if isinstance(v, np.ndarray):
            out.append((k, v.dtype.str, v.shape, v.tobytes()))
        else:
            out.append((k, type(v).__name__, repr(v)))
    return tuple(out)


def _memo_side(memo: dict, key, compute):
    """``compute()`` once per ``key`` of ``memo``; the operators it priced are replayed into the active
    ledger at every use, so a ledger sees exactly what the computation itself would record."""
    hit = memo.get(key)
    if hit is None:
        rec = _Recorder()
        tok = costs._LEDGER.set(rec)
        try:
            value = compute()
        finally:
            costs._LEDGER.reset(tok)
        hit = memo[key] = (value, rec.calls)
    led = costs._LEDGER.get()
    if led is not None:
        for call in hit[1]:
            led.add(*call)
    return hit[0]


def _attn_layer(s, prec, eff, da, ta, p, kw, *, tp, dp):
    """Per layer: the attention side ``ta`` of a pass with its two TP all-reduces, the context-parallel
    exchange and the layer overhead (:func:`split_layer_parts`)."""
    ba = da.get("backend", "roofline")
    # two TP all-reduces per layer on the attention side
    ta = ta + costs.allreduce_time(s, prec, eff, da["link"], tokens=p["tokens"] / dp, n=tp, backend=ba)
    cp = np.where(np.asarray(kw.get("pre_seqs", 0.0)) < dp, p["cp_tokens"], 0.0)
    ta = ta + costs.cp_time(s, prec, eff, da["link"], cp_tokens=cp, dp=dp, backend=ba)
    return ta / s.n_layers + eff.layer_overhead_s


def _ffn_layer(s, prec, eff, df, tf, p, *, n_f):
    """Per layer: the FFN side ``tf`` of a pass, with a dense FFN's all-reduce inside its pool."""
    if not s.n_moe:  # dense FFN split over n_f devices: one all-reduce per layer inside the FFN pool
        tf = tf + costs.allreduce_time(s, prec, eff, df["link"], tokens=p["tokens"], n=n_f, per_layer=1,
                                       backend=df.get("backend", "roofline"))
    return tf / s.n_layers


def split_layer_parts(s, prec, eff, da, df, *, tp, n_a, n_f, m, scaleup=True, **pass_kw):
    """Per layer and per micro-batch (s): attention time ``a`` (with its tensor-parallel all-reduce,
    context-parallel exchange and layer overhead), FFN time ``f`` and one direction of the activation
    hop ``x`` of an attention/FFN split (``da``, ``df``: device dicts); the layer takes
    :func:`af_layer_time` ``(a, f, x, m, eff.overlap)``, the pass ``n_layers`` of them plus the step
    overhead."""
    kw = {k: (np.asarray(v, dtype=float) / m if k in ("dec_seqs", "pre_seqs") else v)
          for k, v in pass_kw.items()}
    dp = n_a / tp
    memo = _SIDE_MEMO.get()
    if memo is None:
        ta, tf, p = costs.forward_parts(s, prec, eff, da, df, tp=tp, dp=dp, n_ffn=n_f, **kw)
        a = _attn_layer(s, prec, eff, da, ta, p, kw, tp=tp, dp=dp)
        f = _ffn_layer(s, prec, eff, df, tf, p, n_f=n_f)
    else:  # one unit's device pairs share their sides: each attention device and FFN device priced once
        k = _array_key(kw) + _array_key(dict(tp=tp, n_a=n_a, n_f=n_f))
        p = memo.get(("pass", k))
        if p is None:
            p = memo[("pass", k)] = costs.pass_inputs(s, **kw)
        # the operators replayed in the order the lines above price them: attention side, FFN side,
        # the attention side's all-reduce and context-parallel exchange, the dense FFN's all-reduce
        ta = _memo_side(memo, ("attn", da["name"], k),
                        lambda: costs.attention_side(s, prec, eff, da, p, tp=tp, dp=dp))
        tf = _memo_side(memo, ("ffn", df["name"], k), lambda: costs.ffn_side(s, prec, eff, df, p, n_ffn=n_f))
        a = _memo_side(memo, ("a", da["name"], k),
                       lambda: _attn_layer(s, prec, eff, da, ta, p, kw, tp=tp, dp=dp))
        f = _memo_side(memo, ("f", df["name"], k), lambda: _ffn_layer(s, prec, eff, df, tf, p, n_f=n_f))
    ba = da.get("backend", "roofline")
    net = np.minimum(da["net"], df["net"])
    if scaleup:  # scale-up where the pair fits in one domain of the same device type; hierarchical beyond
        same = da["name"] == df["name"]
        dom = min(da.get("domain", np.inf), df.get("domain", np.inf)) if same else 0.0
        x1 = costs.af_hop_time(s, prec, eff, net, tokens=p["tokens"], n_attn=n_a, n_ffn=n_f,
                               link=min(da["link"], df["link"]), domain=dom, per_direction=True, backend=ba)
    else:
        x1 = costs.af_hop_time(s, prec, eff, net, tokens=p["tokens"], n_attn=n_a, n_ffn=n_f,
                               per_direction=True, backend=ba)
    return a, f, x1


def af_layer_time(a, f, x1, m, overlap):
    """One layer of an attention/FFN split with ``m`` ping-pong micro-batches: four resources in a
    ring (attention devices ``a``, the A->F direction of the link ``x1``, FFN devices ``f``, the F->A
    direction ``x1``; each value for one micro-batch). Perfectly pipelined, the busiest resource
    bounds the cycle, ``m * max(a, x1, f)``, and one micro-batch must still go round,
    ``a + f + 2 x1``: ``max(m * max(a, f, x1), a + f + 2 x1)``; one micro-batch after another it is
    ``m * (a + f + 2 x1)``. ``overlap`` (:attr:`analysis.forward.Efficiency.overlap`) is the share
    of the difference that is hidden, by the time model's one rule :func:`analysis.forward.pipelined`
    (the same as colocated two-micro-batch overlap); with ``m = 1`` it is the plain sum."""
    ring = a + f + 2.0 * x1
    perfect = np.maximum(m * np.maximum(np.maximum(a, f), x1), ring)
    return costs.pipelined(m * ring, perfect, overlap)


def _chunk_geometry(I, K, hit=0.0):
    """A chunk of ``K`` tokens of the ``I`` computed prompt tokens after ``hit`` cached ones: its
    length, prompts per step and mean cached prefix."""
    pre_len = np.minimum(K, I)
    return pre_len, K / pre_len, hit + np.where(K < I, (I - K) / 2.0, 0.0)


def _chunked_mix(c, run, I, O, ctx, hit=0.0, t_load=0.0):
    """Continuous batching with chunked prefill (colocated and AF units): a step carries the decode
    batch plus one prefill chunk for a fraction ``f`` of steps. Sets ``c['ttft']`` and ``c['tpot']``;
    returns (tpot, f, prefill seqs per step, mixed-step time, decode-only step time)."""
    B, K = c["batch"], c["chunk"]
    pl, ps, pp = _chunk_geometry(I, K, hit)
    t_mix = run(dec_seqs=B, dec_ctx=ctx, pre_seqs=ps, pre_len=pl, pre_prefix=pp)
    t_dec = run(dec_seqs=B, dec_ctx=ctx)
    f = B * I / (O * K)
    tpot = f * t_mix + (1 - f) * t_dec
    service = np.ceil(I / K) * t_mix
    fc = np.minimum(f, 0.999)
    c["ttft"] = service + fc / (2 * (1 - fc)) * service + t_dec / 2 + t_load
    c["tpot"] = tpot
    c["interference"] = t_mix / t_dec
    # share of the unit's device time that is prefill work: the chunks' extra time over decode-only steps
    c["prefill_share"] = f * (t_mix - t_dec) / tpot
    return tpot, f, ps, t_mix, t_dec


def _finish(out, rate, devices, dollars):
    if "prefill_share" not in out:  # a prefill unit does only prefill work, a decode unit only decode work
        out["prefill_share"] = np.full(np.shape(rate), 0.0 if "tpot" in out else 1.0)
    out["rate"] = rate                       # requests/s of one instance (or unit)
    out["devices"] = devices
    out["dollars"] = dollars
    out["dev_per_rate"] = devices / rate     # device-seconds per request
    out["usd_per_rate"] = dollars / rate
    return out


def _divisible(ok, devices, tp, role, name, grid):
    """``ok`` with the candidates whose ``devices`` do not split into whole data-parallel groups of
    ``tp`` devices dropped (``dp = devices / tp`` must be a whole number: 5 devices at TP 4 leave one
    device out of every group). A grid where no candidate of the role divides is a :class:`SearchError`
    naming the sizes and TP degrees."""
    div = np.isclose(np.mod(devices, tp), 0.0)
    if ok.any() and not (ok & div).any():
        raise SearchError(f"role {role}: no instance size in Grid.sizes {tuple(grid.sizes)} within the "
                          f"budget splits into whole data-parallel groups of a TP degree in Grid.tps "
                          f"{tuple(grid.tps)} ({name} / tp must be a whole number); add sizes that are "
                          "multiples of a TP degree")
    return ok & div


# the phase each role serves: a chunked mix of prefill and decode (colocated and AF units), prefill only,
# decode only; a single-pool role and its split unit price their phase the same way
PHASE = {"C": "mix", "AF": "mix", "P": "prefill", "PAF": "prefill", "D": "decode", "DAF": "decode"}
SPLIT_ROLES = ("AF", "PAF", "DAF")


def _phase_axes(phase: str, g: Grid, split: bool) -> dict:
    """The configuration axes of a phase beyond the instance's size and parallelism (a split unit
    searches every other chunk size)."""
    if phase == "mix":
        return {"batch": g.batches, "chunk": g.chunks[::2] if split else g.chunks}
    if phase == "prefill":
        return {"pbatch": g.prefill_batches, "rho": g.utilisations}
    return {"batch": g.batches}


def _price_phase(phase, c, run, *, s, prec, eff, wl, n_kv, tp, dp, mb, net, fits):
    """Price one phase's candidates ``c`` (sets ``feasible`` and ``ttft`` or ``tpot``; returns the
    requests/s of one instance or unit). ``run``: the pass time of the candidates' instance; ``n_kv``:
    the devices its KV spreads over; ``mb``: micro-batches (each DP rank needs a sequence per
    micro-batch); ``net``: the KV link to the other phase; ``fits(kv_bytes)``: per candidate, whether
    weights plus that KV fit its devices."""
    I, O = float(wl.input_tokens), float(wl.output_tokens)
    ctx = I + O / 2.0
    Im, Ih = float(wl.missed_tokens), float(wl.input_tokens - wl.missed_tokens)  # computed, cached
    if phase == "mix":
        B = c["batch"]
        # one prompt's cached KV read from its tier by the instance's devices
        hit = costs.kv_transfer_bytes(s, prec, Ih) / (n_kv * wl.hit_bw) if Ih > 0 else 0.0
        tpot, f, ps, _, _ = _chunked_mix(c, run, Im, O, ctx, Ih, hit)
        kvb = costs.kv_bytes_per_device(s, prec, seqs=B + ps, ctx=I + O, tp=tp, dp=dp)
        c["feasible"] = (f < 1) & fits(kvb) & (B >= dp * mb)
        return B / (O * tpot)
    if phase == "prefill":
        b, rho = c["pbatch"], c["rho"]
        t = run(pre_seqs=b, pre_len=Im, pre_prefix=Ih)
        if Ih > 0:  # the hits' KV loaded layer by layer behind the pass
            t = t + costs.kv_transfer_exposed(s, prec, eff, seqs=b, tokens=Ih, t_pass=t, devices=n_kv,
                                              net=wl.hit_bw / eff.link)
        exposed = costs.kv_transfer_exposed(s, prec, eff, seqs=b, tokens=I, t_pass=t, devices=n_kv, net=net)
        c["ttft"] = prefill_ttft(t, rho, b, exposed)
        kvb = costs.kv_bytes_per_device(s, prec, seqs=b, ctx=I, tp=tp, dp=dp)
        c["feasible"] = fits(kvb) & (b >= mb)
        return rho * b / t
    B = c["batch"]
    t = run(dec_seqs=B, dec_ctx=ctx)
    c["tpot"] = t
    kvb = costs.kv_bytes_per_device(s, prec, seqs=B, ctx=I + O, tp=tp, dp=dp)
    c["feasible"] = fits(kvb) & (B >= dp * mb)
    return B / (O * t)


def role_candidates(role, model, wl: Workload, hw, *, prec: Precision, eff: Efficiency, grid: Grid,
                    budget: int):
    """All candidate configurations of one role, priced: a dict of equal-length arrays with
    ``feasible`` (fits in memory, steady state exists), ``ttft`` or ``tpot`` (seconds), ``rate``,
    ``devices``, ``dev_per_rate``, ``usd_per_rate`` and the configuration axes. ``hw`` is a device
    name (or dict) for single-pool roles and a pair ``(attention, ffn)`` for split units.

    Data parallelism must divide: a candidate whose instance (attention pool of a split unit) does not
    split into whole groups of ``tp`` devices (``size / tp`` not a whole number, e.g. 5 devices at TP 4)
    is skipped; a grid with no dividing candidate raises :class:`SearchError`."""
    if role not in PHASE:
        raise SearchError(f"unknown role {role!r}; roles: {', '.join(PHASE)}")
    s = model if isinstance(model, costs.Shape) else costs.shape(model)
    phase, g = PHASE[role], grid.limited(budget)
    price = functools.partial(_price_phase, phase, s=s, prec=prec, eff=eff, wl=wl)
    if role not in SPLIT_ROLES:
        dev = _devices.device(hw, prec.compute)
        c = _mesh(size=g.sizes, tp=g.tps, ovl=g.overlaps, **_phase_axes(phase, g, split=False))
        ok = c["tp"] <= c["size"]
        ok = _divisible(ok, c["size"], c["tp"], role, "size", g)
        # overlap needs communication to hide: only instances larger than one device
        ok &= (c["ovl"] == 1) | (c["size"] > 1)
        c = {k: v[ok] for k, v in c.items()}
        size, tp, ovl = c["size"], c["tp"], c["ovl"]
        dp = size / tp
        wbytes = costs.weight_bytes_per_device(s, prec, tp=tp, n=size)
        run = lambda **kw: costs.colocated_pass_time(s, prec, eff, dev, tp=tp, dp=dp, microbatches=ovl, **kw)
        rate = price(c, run, n_kv=size, tp=tp, dp=dp, mb=ovl, net=dev["net"],
                     fits=lambda kvb: wbytes + kvb <= _cap(dev, eff))
        c["hw"] = dev["name"]  # scalar: unit_candidates turns it into an index into its device list
        return _finish(c, rate, size, size * dev["price"])

    # attention/FFN split units: A+F (both phases), PA+PF (prefill), DA+DF (decode)
    ha, hf = hw
    da, df = _devices.device(ha, prec.compute), _devices.device(hf, prec.compute)
    memo = _SIDE_MEMO.get()
    mesh = None if memo is None else memo.get(("mesh", role, g, budget))
    if mesh is None:  # the configurations and weight bytes do not depend on the devices
        c = _mesh(n_a=g.sizes, tp=g.tps, n_f=g.sizes, m=g.microbatches, **_phase_axes(phase, g, split=True))
        ok = (c["tp"] <= c["n_a"]) & (c["n_a"] + c["n_f"] <= budget)
        ok = _divisible(ok, c["n_a"], c["tp"], role, "n_a", g)
        c = {k: v[ok] for k, v in c.items()}
        wa = costs.weight_bytes_per_device(s, prec, tp=c["tp"], n=c["n_a"], part="attn")
        wf = costs.weight_bytes_per_device(s, prec, tp=1, n=c["n_f"], part="ffn")
        if memo is not None:
            memo[("mesh", role, g, budget)] = (c, wa, wf)
    else:
        c, wa, wf = mesh
    c = dict(c)  # this pair's own dict (the configuration arrays are shared, never written)
    n_a, tp, n_f, m = c["n_a"], c["tp"], c["n_f"], c["m"]
    dp = n_a / tp
    run = lambda **kw: _split_step(s, prec, eff, da, df, tp=tp, n_a=n_a, n_f=n_f, m=m,
                                   scaleup=g.af_over_scaleup, **kw)
    rate = price(c, run, n_kv=n_a, tp=tp, dp=dp, mb=m, net=da["net"],
                 fits=lambda kvb: (wa + kvb <= _cap(da, eff)) & (wf <= _cap(df, eff)))
    c["hw_a"], c["hw_f"] = da["name"], df["name"]
    c["dollars_a"] = n_a * da["price"]  # the attention pool's share of the unit's price
    return _finish(c, rate, n_a + n_f, n_a * da["price"] + n_f * df["price"])


# ------------------------------------------------------------------------------------- modes

MODE_UNITS = {"C": (("C", "C"),), "PD": (("P", "P"), ("D", "D")), "AF": (("AF", ("A", "F")),),
              "3-way": (("P", "P"), ("DAF", ("DA", "DF"))),
              "PDAF": (("PAF", ("PA", "PF")), ("DAF", ("DA", "DF")))}


def default_hardware(device: str | list) -> dict:
    """Every role on the same candidate device list (names of ``data/hardware.csv`` GPUs or NPU design
    points; an unknown name fails here, with the closest names)."""
    lst = [device] if isinstance(device, str) else list(device)
    for d in lst:
        _devices.device(d)
    return {r: lst for r in ROLES}


def _unit_hw(roles, hardware):
    if isinstance(roles, str):
        return list(hardware[roles])
    a, f = roles
    return list(itertools.product(hardware[a], hardware[f]))


def _check_hardware(hardware, mode):
    names = set(_devices.names())
    for r in itertools.chain.from_iterable((x,) if isinstance(x, str) else x for _, x in MODE_UNITS[mode]):
        if r not in hardware or not hardware[r]:
            raise SearchError(f"mode {mode}: no hardware given for role {r!r} (roles: {ROLES})")
        for h in hardware[r]:
            if not isinstance(h, dict) and h not in names:
                _devices.device(h)  # raises UnknownNameError with the allowed names


HW_KEYS = ("hw", "hw_a", "hw_f")


def unit_candidates(unit, roles, model, wl, hardware, **kw):
    """Candidates of one unit concatenated over its hardware choices; the device names are kept
    once per choice (``_hw`` list) and referenced by the integer array ``hw_idx``."""
    parts = []
    pairs = _unit_hw(roles, hardware)
    # split units over several named devices: share each device's side across its pairs (_SIDE_MEMO)
    shared = (not isinstance(roles, str) and len(pairs) > 1
              and all(isinstance(h, str) for pair in pairs for h in pair))
    tok = _SIDE_MEMO.set({} if shared else None)
    try:
        for hw in pairs:
            with costs.ledger() as led:  # per candidate: the share of its operator seconds read from tables
                p = role_candidates(unit, model, wl, hw, **kw)
            share = np.asarray(led.measured_share, dtype=float)
            p["measured_share"] = np.broadcast_to(share, np.shape(p["rate"])).copy()
            parts.append(p)
    finally:
        _SIDE_MEMO.reset(tok)
    names = [{k: p[k] for k in HW_KEYS if k in p} for p in parts]
    keys = [k for k in parts[0] if k not in HW_KEYS]
    out = {k: np.concatenate([p[k] for p in parts]) for k in keys}
    out["hw_idx"] = np.concatenate([np.full(len(p["rate"]), i, dtype=np.int32) for i, p in enumerate(parts)])
    out["_hw"] = names
    return out


def reprice(c: dict, prices: dict) -> dict:
    """A unit's candidates (:func:`unit_candidates`) with every device priced from ``prices`` (device
    name -> USD): ``dollars`` and ``usd_per_rate`` recomputed, everything else shared (the
    throughputs do not depend on prices, so one pricing of the candidates serves every price model)."""
    names = c["_hw"]
    if "hw" in names[0]:
        per = np.array([prices[h["hw"]] for h in names])[c["hw_idx"]]
        dollars = c["devices"] * per
    else:
        pa = np.array([prices[h["hw_a"]] for h in names])[c["hw_idx"]]
        pf = np.array([prices[h["hw_f"]] for h in names])[c["hw_idx"]]
        dollars = c["n_a"] * pa + c["n_f"] * pf
        return {**c, "dollars": dollars, "dollars_a": c["n_a"] * pa, "usd_per_rate": dollars / c["rate"]}
    return {**c, "dollars": dollars, "usd_per_rate": dollars / c["rate"]}


@dataclass
class Plan:
    """The best plan of a mode (or why there is none).

    ``tokens_per_s_per_device``: output tokens/s per device of the whole plan (pools rate-matched);
    ``tokens_per_s_per_kusd``: the same per 1,000 USD of device price; ``ttft_s``, ``tpot_s``: mean
    latencies (s) of the screen; ``units``: one dict per unit (configuration, ``rate`` requests/s of one
    instance, ``devices`` per instance, ``device_share`` of the plan); ``edges``: the grid edges the
    chosen configuration sits on (a better plan may lie beyond them); ``input_tokens``,
    ``output_tokens``: the workload's means."""

    mode: str
    feasible: bool
    reason: str = ""
    tokens_per_s_per_device: float = float("nan")
    tokens_per_s_per_kusd: float = float("nan")
    ttft_s: float = float("nan")
    tpot_s: float = float("nan")
    units: list = field(default_factory=list)  # one dict per unit: configuration + share of devices
    candidates: int = 0
    edges: list = field(default_factory=list)
    input_tokens: float = float("nan")
    output_tokens: float = float("nan")

    @property
    def measured_share(self) -> float:
        """Share of the plan's device time spent in operators priced from measured kernel tables
        (:mod:`analysis.measured`; 0 under the roofline): each unit's share of its candidate's priced
        operator seconds, weighted by the unit's share of the plan's devices (NaN if infeasible)."""
        if not self.feasible:
            return float("nan")
        return float(sum(u["device_share"] * u.get("measured_share", 0.0) for u in self.units))

    def pool_throughput(self) -> dict:
        """Throughput per device of each pool, as operators publish it (tokens/s per device): output
        tokens of a decode-side pool (units with a TPOT: ``C``, ``D``, ``AF``, ``DAF``), input tokens of a
        prefill pool (``P``, ``PAF``), per device of one of its instances."""
        out = {}
        for u in self.units:
            per_req = self.output_tokens if "tpot" in u else self.input_tokens
            out[u["unit"]] = u["rate"] * per_req / u["devices"]
        return out

    def pools(self) -> list:
        """The plan's work by pool and phase, one row per (pool, phase) with work: ``unit``, ``pool``
        (the unit for a single-pool unit, ``A``/``F`` sides of a split unit: ``PA``/``PF``, ``DA``/``DF``),
        ``phase`` (``prefill`` or ``decode``), ``devices`` per instance of the pool, ``dev_per_rate``
        (device-seconds per request) and ``usd_per_rate`` (USD of device price per request/s) of the
        plan's deployment. A unit that runs both phases (``C``, ``AF``: chunked prefill in the decode
        batch) splits its time by ``prefill_share``, the chunks' extra time over decode-only steps,
        ``f (t_mix - t_dec) / TPOT``; a split unit splits by devices (time) and by price (USD).
        The rows sum to the plan's totals, ``output_tokens / tokens_per_s_per_device`` device-seconds
        and ``output_tokens / tokens_per_s_per_kusd * 1e3`` USD per request/s (whole instances
        included: each unit then carries its instances' share)."""
        if not self.feasible:
            return []
        rows = []
        whole = any("instances" in u for u in self.units)
        if whole:
            dev_cost = self.output_tokens / self.tokens_per_s_per_device
            devs = sum(u["instances"] * u["devices"] for u in self.units)
        for u in self.units:
            if whole:  # the deployment's rate is its slowest pool's: a unit's share of it
                dev, usd = u["device_share"] * dev_cost, u["instances"] * u["dollars"] * dev_cost / devs
            else:
                dev, usd = u["dev_per_rate"], u["usd_per_rate"]
            if "n_a" in u:
                side = {"AF": ("A", "F"), "PAF": ("PA", "PF"), "DAF": ("DA", "DF")}[u["unit"]]
                fa = u.get("dollars_a", math.nan) / u["dollars"] if u["dollars"] else u["n_a"] / u["devices"]
                parts = [(side[0], u["n_a"], u["n_a"] / u["devices"], fa),
                         (side[1], u["n_f"], u["n_f"] / u["devices"], 1.0 - fa)]
            else:
                parts = [(u["unit"], u["devices"], 1.0, 1.0)]
            ps = u.get("prefill_share", 0.0 if "tpot" in u else 1.0)
            for pool, n, fd, fu in parts:
                for phase, share in (("prefill", ps), ("decode", 1.0 - ps)):
                    if share > 0:
                        rows.append({"unit": u["unit"], "pool": pool, "phase": phase, "devices": n,
                                     "dev_per_rate": dev * fd * share, "usd_per_rate": usd * fu * share})
        return rows

    def phases(self) -> dict:
        """Prefill and decode work of the plan: ``{phase: {"dev_per_rate", "usd_per_rate",
        "device_share"}}`` summed over its pools (:meth:`pools`), plus the phase's latency (``ttft_s``
        for prefill, ``tpot_s`` for decode)."""
        out = {ph: {"dev_per_rate": 0.0, "usd_per_rate": 0.0} for ph in ("prefill", "decode")}
        for r in self.pools():
            out[r["phase"]]["dev_per_rate"] += r["dev_per_rate"]
            out[r["phase"]]["usd_per_rate"] += r["usd_per_rate"]
        tot = sum(v["dev_per_rate"] for v in out.values())
        for v in out.values():
            v["device_share"] = v["dev_per_rate"] / tot if tot else float("nan")
        out["prefill"]["ttft_s"], out["decode"]["tpot_s"] = self.ttft_s, self.tpot_s
        return out

    def __repr__(self):
        if not self.feasible:
            return f"Plan({self.mode}: infeasible — {self.reason})"
        return (f"Plan({self.mode}: {self.tokens_per_s_per_device:.4g} tok/s/device, "
                f"TTFT {self.ttft_s*1e3:.0f} ms, "
                f"TPOT {self.tpot_s*1e3:.1f} ms)")


def _pick(c, i):
    out = {k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in c.items() if k != "_hw"}
    if "_hw" in c:
        out.update(c["_hw"][out.pop("hw_idx")])
    return out


def best_plan(mode, model, wl: Workload, slo: SLO, hardware: dict, *, budget: int = 64,
              objective: str = "device", prec: Precision = Precision(), eff: Efficiency = Efficiency(),
              grid: Grid = Grid(), enforce_context: bool = True, whole_instances: bool = False, _cands=None,
              _top: int = 0) -> Plan:
    """The best plan of ``mode`` for ``model`` on ``wl`` under ``slo`` within ``budget`` devices.

    Pools are rate-matched continuously (fractional pools), unless ``whole_instances``: then each
    unit gets a whole number of instances within the budget (:func:`whole_instance_cost`).

    ``objective``: ``"device"`` (output tokens/s per device) or ``"dollar"`` (per USD of devices).
    A mode that no candidate can run within the SLOs returns ``Plan(feasible=False, reason=...)``,
    never a zero throughput. A plan at an edge of ``grid`` (``Plan.edges``, :func:`grid_edges`) raises
    a :class:`GridEdgeWarning` naming the edges."""
    if mode not in MODES:
        raise SearchError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    if objective not in ("device", "dollar"):
        raise SearchError(f"objective must be 'device' or 'dollar', got {objective!r}")
    if not isinstance(slo, SLO):
        raise SearchError("slo must be an SLO(ttft_s, tpot_s)")
    if not (isinstance(budget, (int, np.integer)) and budget >= 1):
        raise SearchError(f"budget must be a positive integer number of devices, got {budget!r}")
    _check_hardware(hardware, mode)
    s = model if isinstance(model, costs.Shape) else costs.shape(model)
    if enforce_context and wl.input_tokens + wl.output_tokens > s.max_context:
        return Plan(mode, False, f"{wl.input_tokens + wl.output_tokens:,.0f} tokens exceed {s.name}'s "
                    "context "
                    f"window of {s.max_context:,.0f}")
    cands = _cands if _cands is not None else mode_candidates(mode, s, wl, hardware, budget=budget,
                                                               prec=prec, eff=eff, grid=grid)
    key = "dev_per_rate" if objective == "device" else "usd_per_rate"
    if objective == "dollar":
        for c in cands:
            if not np.isfinite(c["usd_per_rate"]).any():
                raise SearchError("objective 'dollar' needs a price for every device; "
                                  "data/hardware.csv or data/npu_design_points.csv lacks one")
    n_total = sum(len(c["rate"]) for c in cands)
    oks, why = zip(*[_slo_feasible(c, unit, slo, key, budget)
                     for (unit, _), c in zip(MODE_UNITS[mode], cands)])
    if not all(ok.any() for ok in oks):
        return Plan(mode, False, "; ".join(w for w in why if w) or "no feasible configuration",
                    candidates=n_total)
    per_unit = [(_unit_choices(c, ok, key, _top), c) for c, ok in zip(cands, oks)]
    if not whole_instances and not _top:
        return _best_rate_matched(mode, per_unit, key, budget, wl, n_total, grid, s)
    combos = []
    for combo in itertools.product(*[list(ix) for ix, _ in per_unit]):
        devs = sum(c["devices"][i] for i, (_, c) in zip(combo, per_unit))
        if devs > budget:
            continue
        if whole_instances:
            cost, counts = whole_instance_cost([(c["devices"][i], c[key][i] * c["rate"][i], c["rate"][i])
                                                for i, (_, c) in zip(combo, per_unit)], budget)
            combos.append((cost, combo, counts))
        else:
            combos.append((sum(c[key][i] for i, (_, c) in zip(combo, per_unit)), combo, None))
    if not combos:
        return Plan(mode, False,
                    f"the units' smallest feasible instances need more than {budget} devices together",
                    candidates=n_total)
    combos.sort(key=lambda x: x[0])
    if _top:
        return [_assemble(mode, combo, per_unit, wl, n_total, grid.limited(budget), budget, counts,
                          bool(s.n_moe)) for _, combo, counts in combos[:_top]]
    _, combo, counts = combos[0]
    plan = _assemble(mode, combo, per_unit, wl, n_total, grid.limited(budget), budget, counts, bool(s.n_moe))
    warn_edges(f"the best {mode} plan ({plan.tokens_per_s_per_device:,.4g} tokens/s per device)", plan.edges,
               grid.limited(budget), budget)
    return plan


def _slo_feasible(c, unit, slo: SLO, key: str, budget: int):
    """The candidates of one unit that fit, have a finite cost and meet the SLOs their role bears (TTFT for
    a role that prefills, TPOT for one that decodes), and why none does ('' when some do)."""
    ok = c["feasible"] & np.isfinite(c[key])
    if not ok.any():
        return ok, f"unit {unit}: no configuration fits in device memory within {budget} devices"
    for metric, limit, scale, fmt in (("ttft", slo.ttft_s, 1e3, ".0f"), ("tpot", slo.tpot_s, 1e3, ".1f")):
        if metric not in c:
            continue
        met = ok & (c[metric] <= limit)
        if not met.any():
            best = np.nanmin(np.where(ok, c[metric], np.nan))
            return met, (f"unit {unit}: {metric.upper()} SLO {limit * scale:{fmt}} ms unmet (best feasible "
                         f"{best * scale:{fmt}} ms)")
        ok = met
    return ok, ""


def _unit_choices(c, ok, key: str, top: int):
    """The candidates of a unit worth combining: per distinct instance size the cheapest feasible one, or
    with ``top`` > 1 the ``top`` cheapest of each size."""
    idx = np.flatnonzero(ok)
    if top <= 1:
        return _cheapest_per_size(idx, c["devices"][idx], c[key][idx])
    order = idx[np.lexsort((c[key][idx], c["devices"][idx]))]
    dv = c["devices"][order]
    rank = np.arange(len(dv)) - np.searchsorted(dv, dv, side="left")  # rank within its instance size
    return order[rank < top]


def _cheapest_per_size(idx, devices, cost):
    """Of the candidates ``idx`` (ascending), for each distinct instance size (``devices``, ascending)
    the first of the least ``cost`` (finite): what a stable sort by size then cost puts first in each
    size, without sorting."""
    sizes, inv = np.unique(devices, return_inverse=True)
    least = np.full(len(sizes), np.inf)
    np.minimum.at(least, inv, cost)
    at = np.flatnonzero(cost == least[inv])
    _, first = np.unique(inv[at], return_index=True)
    return idx[at[first]]


def _best_rate_matched(mode, per_unit, key, budget, wl, n_total, grid, s) -> Plan:
    """:func:`best_plan`'s choice among rate-matched combinations, vectorised: every combination of the
    units' candidates (in ``itertools.product`` order, row-major) within the budget, its cost the sum of
    the units' costs added in unit order; the first of the least cost wins (what a stable sort by cost
    picks)."""
    n = len(per_unit)
    devs, cost = 0, 0.0
    for j, (ix, c) in enumerate(per_unit):
        shape = [1] * n
        shape[j] = len(ix)
        devs = devs + c["devices"][ix].reshape(shape)
        cost = cost + c[key][ix].reshape(shape)
    fits = np.flatnonzero(np.ravel(devs <= budget))
    if not len(fits):
        return Plan(mode, False,
                    f"the units' smallest feasible instances need more than {budget} devices together",
                    candidates=n_total)
    flat = fits[np.argmin(np.ravel(cost)[fits])]
    at = np.unravel_index(flat, tuple(len(ix) for ix, _ in per_unit))
    combo = tuple(ix[a] for (ix, _), a in zip(per_unit, at))
    plan = _assemble(mode, combo, per_unit, wl, n_total, grid.limited(budget), budget, None, bool(s.n_moe))
    warn_edges(f"the best {mode} plan ({plan.tokens_per_s_per_device:,.4g} tokens/s per device)", plan.edges,
               grid.limited(budget), budget, stacklevel=4)
    return plan


def whole_instance_cost(units, budget):
    """Cost per request of whole instances within ``budget`` devices: ``units`` gives per unit
    ``(devices per instance, cost per instance, requests/s per instance)`` (cost in devices or USD);
    with ``n_u`` instances the deployment serves ``min_u(n_u * rate_u)`` requests/s at a cost of
    ``sum_u n_u * cost_u``. Returns the least cost per request/s and the counts. One unit: one
    instance (the cost per request does not depend on how many). Two units: every count of the first
    that fits, and the two counts of the second nearest to rate matching."""
    if len(units) == 1:
        d, c, r = units[0]
        return c / r, (1,)
    (d1, c1, r1), (d2, c2, r2) = units
    best = (math.inf, None)
    for n1 in range(1, int((budget - d2) // d1) + 1):
        cap2 = int((budget - n1 * d1) // d2)
        want = n1 * r1 / r2
        for n2 in {max(1, min(cap2, math.floor(want))), max(1, min(cap2, math.ceil(want)))}:
            cost = (n1 * c1 + n2 * c2) / min(n1 * r1, n2 * r2)
            if cost < best[0]:
                best = (cost, (n1, n2))
    return best


def top_plans(mode, model, wl: Workload, slo: SLO, hardware: dict, k: int = 5, **kw) -> list:
    """The ``k`` best plans of ``mode`` by the analytic screen (best first; up to ``k`` configurations
    per instance size and unit are combined), e.g. to re-rank with :func:`analysis.disagg.des.simulate`.
    Keywords as :func:`best_plan`; an infeasible mode gives ``[Plan(feasible=False, ...)]``."""
    out = best_plan(mode, model, wl, slo, hardware, _top=int(k), **kw)
    return out if isinstance(out, list) else [out]


EDGE_AXES = {"size": "sizes", "n_a": "sizes", "n_f": "sizes", "tp": "tps", "batch": "batches",
             "chunk": "chunks", "pbatch": "prefill_batches", "rho": "utilisations", "m": "microbatches",
             "ovl": "overlaps"}
# what an edge of each axis means, for warnings and the chapter's line
EDGE_WORDS = {"size": "largest instance size", "n_a": "largest attention pool", "n_f": "largest FFN pool",
              "tp": "largest TP degree", "batch": "largest decode batch", "chunk": "largest prefill chunk",
              "pbatch": "largest prefill batch", "rho": "prefill utilisation cap",
              "m": "most ping-pong micro-batches", "ovl": "most overlap micro-batches"}
NOT_SEARCHED = ("m", "ovl")  # single-valued at 1 (no overlap / no ping-pong): an edge all the same


def grid_edges(units, grid: Grid, budget: int, moe: bool = True) -> list:
    """``unit.axis`` for every chosen value at the top of its grid axis (a better plan may lie beyond;
    single-valued axes the caller fixed and the smallest values are not reported, except overlap and
    ping-pong micro-batches held at 1, which the default grid does not search: ``unit.ovl`` for an
    instance with communication to hide (more than one device, with tensor parallelism or, ``moe``,
    expert parallelism), ``unit.m`` for a split unit), and ``budget`` when one instance of every unit
    together fills the device budget. The prefill utilisation at its cap is ``unit.rho``."""
    out = []
    for u in units:
        for k, ax in EDGE_AXES.items():
            if k not in u:
                continue
            vals = getattr(grid, ax)
            top = max(vals)
            if len(vals) > 1 and u[k] >= top:
                out.append(f"{u['unit']}.{k}")
            elif len(vals) == 1 and k in NOT_SEARCHED and top == 1 and (
                    k == "m" or (u.get("size", 1) > 1 and (moe or u.get("tp", 1) > 1))):
                out.append(f"{u['unit']}.{k}")
    if budget is not None and sum(u["devices"] for u in units) >= budget:
        out.append("budget")
    return out


def describe_edges(edges, grid: Grid, budget: int | None = None) -> str:
    """Words for :func:`grid_edges`' codes, e.g. ``"D.batch (largest decode batch, 4,096)"``."""
    out = []
    for e in edges:
        if e == "budget":
            out.append(f"the device budget{f' ({budget:,})' if budget else ''}")
            continue
        unit, k = e.split(".")
        vals = getattr(grid, EDGE_AXES[k])
        if len(vals) == 1 and k in NOT_SEARCHED:
            what = "no overlap searched" if k == "ovl" else "no ping-pong micro-batches searched"
            out.append(f"{unit}.{k} ({what})")
        else:
            top = max(vals)
            out.append(f"{unit}.{k} ({EDGE_WORDS[k]}, {top:,.2f})" if k == "rho"
                       else f"{unit}.{k} ({EDGE_WORDS[k]}, {top:,.0f})")
    return "; ".join(out)


def warn_edges(what: str, edges, grid: Grid, budget: int | None = None, stacklevel: int = 3) -> None:
    """A :class:`GridEdgeWarning` naming ``edges`` (nothing when there are none)."""
    if edges:
        warnings.warn(GridEdgeWarning(f"{what} sits at the search grid's edge: "
                                      f"{describe_edges(edges, grid, budget)}; a larger grid may find a "
                                      "better plan"), stacklevel=stacklevel)


@contextlib.contextmanager
def edges_kept():
    """No :class:`GridEdgeWarning` reaches the caller inside: for a function that prices many plans for a
    page, where one warning per plan would bury the page. Every plan still keeps its edges
    (:attr:`Plan.edges`), and such a function records them in its result (an ``edges`` column, or a
    count: :func:`edge_kinds`) for the page to state in one line. A direct :func:`best_plan` call
    outside warns as before. Worker processes forked inside inherit the filter."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        yield


def keeps_edges(fn):
    """Decorator: ``fn`` runs inside :func:`edges_kept` (its plans' edges recorded, not warned)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with edges_kept():
            return fn(*args, **kwargs)
    return wrapper


def edge_kinds(edges) -> dict:
    """Plans per kind of grid edge: ``edges`` holds one entry per plan, its :func:`grid_edges` codes as a
    list or comma-joined (empty or None: inside the grid); ``{kind: plans}`` (kind: the axis, e.g.
    ``batch``, or ``budget``), a plan counted once per kind."""
    out: dict = {}
    for e in edges:
        codes = e if isinstance(e, (list, tuple)) else ([] if e is None or e != e else str(e).split(","))
        for k in {x.split(".")[-1] for x in codes if x}:
            out[k] = out.get(k, 0) + 1
    return out


def edge_kind_words(k: str) -> str:
    """Words for a kind of :func:`edge_kinds`, e.g. ``"the largest decode batch"``."""
    return {"budget": "the device budget", "ovl": "the most overlap micro-batches searched",
            "m": "the most ping-pong micro-batches searched"}.get(k, f"the {EDGE_WORDS.get(k, k)}")


def _assemble(mode, combo, per_unit, wl, n_total, grid=None, budget=None, counts=None, moe=True) -> Plan:
    units, dev_cost, usd_cost, ttft, tpot = [], 0.0, 0.0, 0.0, 0.0
    for (unit, roles), i, (_, c) in zip(MODE_UNITS[mode], combo, per_unit):
        u = _pick(c, i)
        u["unit"] = unit
        dev_cost += u["dev_per_rate"]
        usd_cost += u["usd_per_rate"]
        ttft = u.get("ttft", ttft) if "ttft" in u else ttft
        tpot = u.get("tpot", tpot) if "tpot" in u else tpot
        units.append(u)
    if counts is not None:  # whole instances: the slowest pool sets the rate of the deployment
        rate = min(n * u["rate"] for n, u in zip(counts, units))
        devs = sum(n * u["devices"] for n, u in zip(counts, units))
        dev_cost = devs / rate
        usd_cost = sum(n * u["dollars"] for n, u in zip(counts, units)) / rate
        for n, u in zip(counts, units):
            u["instances"] = n
            u["device_share"] = n * u["devices"] / devs
    else:
        for u in units:
            u["device_share"] = u["dev_per_rate"] / dev_cost
    O = float(wl.output_tokens)
    edges = grid_edges(units, grid, budget, moe) if grid is not None else []
    return Plan(mode, True, "", O / dev_cost, O / usd_cost * 1e3, ttft, tpot, units, n_total, edges,
                float(wl.input_tokens), O)


def mode_candidates(mode, model, wl, hardware, *, budget, prec, eff, grid, _memo=None):
    """Candidates of each unit of ``mode`` (``_memo``: a dict shared across modes so that a unit
    used by several modes, e.g. the decode A/F split of 3-way and PDAF, is priced once)."""
    s = model if isinstance(model, costs.Shape) else costs.shape(model)
    out = []
    for unit, roles in MODE_UNITS[mode]:
        key = (unit, roles)
        if _memo is not None and key in _memo:
            out.append(_memo[key])
            continue
        c = unit_candidates(unit, roles, s, wl, hardware, prec=prec, eff=eff, grid=grid, budget=budget)
        if _memo is not None:
            _memo[key] = c
        out.append(c)
    return out


def best_plans(model, wl, slo, hardware, modes=MODES, **kw) -> dict:
    """Best plan of every mode under the same SLO, budget and objective (shared units priced once)."""
    memo = {}
    out = {}
    for m in modes:
        if m not in MODES:
            raise SearchError(f"unknown mode {m!r}; modes: {', '.join(MODES)}")
        s = model if isinstance(model, costs.Shape) else costs.shape(model)
        cands = None
        if not (kw.get("enforce_context", True) and wl.input_tokens + wl.output_tokens > s.max_context):
            _check_hardware(hardware, m)
            cands = mode_candidates(m, s, wl, hardware, budget=kw.get("budget", 64),
                                    prec=kw.get("prec", Precision()),
                                    eff=kw.get("eff", Efficiency()), grid=kw.get("grid", Grid()), _memo=memo)
        out[m] = best_plan(m, model, wl, slo, hardware, _cands=cands, **kw)
    return out


def pareto(mode, model, wl, ttft_s, tpot_grid, hardware, with_edges: bool = False, **kw):
    """Best tokens/s per device of ``mode`` at each TPOT SLO of ``tpot_grid`` (TTFT SLO fixed):
    the Pareto front of throughput per device against TPOT. NaN where no plan meets the SLO.
    ``with_edges``: also each plan's :attr:`Plan.edges` (empty where none is feasible)."""
    cands = mode_candidates(mode, model, wl, hardware, budget=kw.get("budget", 64),
                            prec=kw.get("prec", Precision()), eff=kw.get("eff", Efficiency()),
                            grid=kw.get("grid", Grid()))
    out, edges = [], []
    for t in tpot_grid:
        p = best_plan(mode, model, wl, SLO(ttft_s, t), hardware, _cands=cands, **kw)
        out.append(p.tokens_per_s_per_device if p.feasible else float("nan"))
        edges.append(list(p.edges) if p.feasible else [])
    return (np.array(out), edges) if with_edges else np.array(out)


def throughput_benchmark(model="Llama-3.1-70B", device="H100-SXM5-80GB", repeat=3) -> dict:
    """Distinct candidate configurations priced per second by the vectorised search (all five modes
    for one model and workload; units shared by several modes counted once)."""
    hw = default_hardware(device)
    wl = Workload(8192, 1000)
    n, best = 0, float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        memo = {}
        for mode in MODES:
            mode_candidates(mode, model, wl, hw, budget=64, prec=Precision.named("fp8"), eff=Efficiency(),
                            grid=Grid(), _memo=memo)
        best = min(best, time.perf_counter() - t0)
        n = sum(len(c["rate"]) for c in memo.values())
    return {"candidates": n, "seconds": best, "per_s": n / best}
