"""Discrete-event simulation of a plan over a workload's arrivals and lengths (simpy), judged at the
90th percentile of TTFT and TPOT (the SLO attainment of DistServe and Splitwise).

The analytic screen (:mod:`.search`) prices steady-state means; this replays requests one by one
through whole instances of the plan's units:

* **prefill instance** (``P``, ``PAF``): takes up to ``pbatch`` waiting prompts (FIFO, never waits
  for a batch to fill), runs one pass, then moves the KV cache to the least-loaded decode instance
  (the exposed part of the layer-wise transfer, :func:`analysis.forward.kv_transfer_exposed`); the
  first token leaves with the transfer;
* **decode instance** (``D``, ``DAF``): continuous batching up to the plan's batch; every iteration
  emits one token per running sequence; a finished sequence frees its slot at once;
* **colocated instance** (``C``, ``AF``): continuous batching with chunked prefill: every iteration
  carries the running decode batch plus up to ``chunk`` prompt tokens of the waiting prompts (FIFO;
  a prompt that finishes its prefill emits its first token and joins the decode batch).

Step times come from the same cost model as the screen (:mod:`analysis.forward`, same efficiencies),
tabulated once per plan over the batch size and context (decode), prompts and length (prefill) and
chunk tokens (mixed iterations), then interpolated, so one iteration costs a table lookup; an
engine's iterations are not simpy events but a loop advanced up to each routing decision (simpy
schedules arrivals, prefill passes and hand-overs), which gives the same times as one event per
iteration (tests/_des_reference.py) at about one event per request. Whole
instances: the plan's rate-matched device shares are rounded to instances within the budget (at least
one each). Arrivals: a trace's timestamps rescaled to the requested rate (keeping its burstiness) or a
seeded Poisson process. Simplifications, stated: a prefill batch is priced at its prompts' mean length;
a mixed iteration's chunk cost is added to the decode step (its increment at the plan's batch); the
decode step is priced at the running batch's mean context; memory is the plan's batch cap.

Run length: by default to steady state (:func:`simulate`): windows of requests, each judged once all
its requests are done while arrivals go on, until two successive windows' p90 TTFT and TPOT agree
within :data:`STEADY_TOL`; the windows before them are the discarded warm-up. A fixed count of 2,000
requests (the earlier default) ended before steady state at large scale: for DeepSeek-V3 on H800s
its p90 TPOT was 31 ms against 42 ms over 100,000 requests
(``benchmarks/bench_disagg_des_steady.py --long 100000``).

Where each rule lives: :func:`simulate` is the driver; :func:`_run_length` (requests and window),
:func:`_requests` (lengths and arrivals), :func:`_instances` (whole instances, routing to the least
loaded), :class:`_Prefiller` and :class:`_Decoder` (the instances above; a decode iteration is composed
by ``_Decoder._whole_prefill``, ``_mixed`` or ``_decode``), :func:`_steady_state` (the stop rule) and
:func:`_result` (percentiles and attainment).
"""
from __future__ import annotations

import bisect
import functools
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import simpy

from .. import forward as costs
from ..forward import Efficiency, Precision
from . import devices as _devices
from . import search as S

PERCENTILE = 90.0
MAX_PREFILL_PROMPTS = 64  # prompts in one whole-prompt prefill iteration (chunked=False)
STEADY_TOL = 0.02         # steady state: successive windows' p90 TTFT and TPOT agree within 2%
STEADY_MAX = 100_000      # steady state: at most this many requests (the long run)
FIXED_REQUESTS = 2000  # a fixed-count run's default length (steady=False without lengths or n_requests)
MIN_WINDOW = 1_000        # steady state: requests per window, at least


@dataclass
class DESResult:
    """Per-request TTFT and TPOT (s), their 90th percentiles, SLO attainment (share of requests meeting
    both SLOs), the instances simulated, the arrival rate (requests/s), and timing."""

    ttft: np.ndarray
    tpot: np.ndarray
    p90_ttft_s: float
    p90_tpot_s: float
    attainment: float
    instances: dict
    rate: float
    sim_seconds: float
    wall_s: float
    requests: int = 0          # requests simulated (arrived)
    warmup: int = 0            # first requests discarded from the percentiles (warm-up)
    measured: int = 0          # requests the percentiles are taken over
    steady: bool | None = None  # steady-state run: True if the p90s settled, False if the cap came first;
                                # None for a fixed request count

    def judged(self, slo: S.SLO) -> bool:
        """Both 90th percentiles within the SLO."""
        return bool(self.p90_ttft_s <= slo.ttft_s and self.p90_tpot_s <= slo.tpot_s)


class _Table:
    """Linear interpolation on a grid (1-D or 2-D; the grid points may be log-spaced, the interpolation
    is linear, exact where the cost model is linear in the context), in plain Python (bisect on lists):
    one lookup per simulated iteration must cost microseconds."""

    def __init__(self, x, y=None, v=None):
        self.x = [float(a) for a in np.asarray(x, float)]
        self.y = None if y is None else [float(b) for b in np.asarray(y, float)]
        self.v = np.asarray(v, float).tolist()

    def __call__(self, a, b=None):
        x = self.x
        i = min(max(bisect.bisect_right(x, a) - 1, 0), len(x) - 2)
        tx = min(max((a - x[i]) / (x[i + 1] - x[i]), 0.0), 1.0)
        if self.y is None:
            return self.v[i] + tx * (self.v[i + 1] - self.v[i])
        y = self.y
        lb = b
        j = min(max(bisect.bisect_right(y, lb) - 1, 0), len(y) - 2)
        ty = min(max((lb - y[j]) / (y[j + 1] - y[j]), 0.0), 1.0)
        r0, r1 = self.v[i], self.v[i + 1]
        lo = r0[j] + ty * (r0[j + 1] - r0[j])
        hi = r1[j] + ty * (r1[j + 1] - r1[j])
        return lo + tx * (hi - lo)


def _runner(s, prec, eff, u, grid):
    """The forward-pass time function of a unit configuration (``u``: a plan unit dict)."""
    if "n_a" in u:
        da = _devices.device(u["hw_a"], prec.compute)
        df = _devices.device(u["hw_f"], prec.compute)
        shape = dict(tp=u["tp"], n_a=u["n_a"], n_f=u["n_f"], m=u["m"], scaleup=grid.af_over_scaleup)
        return lambda **kw: S._split_step(s, prec, eff, da, df, **shape, **kw), u["n_a"], da
    dev = _devices.device(u["hw"], prec.compute)
    tp, size = u["tp"], u["size"]
    return lambda **kw: costs.colocated_pass_time(s, prec, eff, dev, tp=tp, dp=size / tp,
                                                  microbatches=u.get("ovl", 1.0), **kw), size, dev


def _ctx_grid(lo, hi):
    lo = max(lo, 1.0)
    return np.geomspace(lo, max(hi, 2.0 * lo), 24)


class _ByBatch:
    """Decode step time for every whole batch size 0..bmax (a row each), linear in the context."""

    def __init__(self, run, bmax, ctx_lo, ctx_hi):
        B = np.arange(0, int(bmax) + 1, dtype=float)
        self.c = [float(x) for x in _ctx_grid(ctx_lo, ctx_hi)]
        v = run(dec_seqs=np.maximum(B, 1.0)[:, None], dec_ctx=np.asarray(self.c)[None, :])
        self.rows = np.broadcast_to(v, (len(B), len(self.c))).tolist()
        self.last = len(self.c) - 2

    def __call__(self, b, ctx):
        c = self.c
        j = bisect.bisect_right(c, ctx) - 1
        j = 0 if j < 0 else (self.last if j > self.last else j)
        t = (ctx - c[j]) / (c[j + 1] - c[j])
        t = 0.0 if t < 0 else (1.0 if t > 1 else t)
        r = self.rows[b]
        return r[j] + t * (r[j + 1] - r[j])


def _decode_table(run, bmax, ctx_lo, ctx_hi):
    return _ByBatch(run, bmax, ctx_lo, ctx_hi)


def _prefill_table(run, bmax, L_lo, L_hi, prefix):
    Bs = np.arange(1, int(bmax) + 1, dtype=float)
    L = _ctx_grid(L_lo, L_hi)
    v = run(pre_seqs=Bs[:, None], pre_len=L[None, :], pre_prefix=prefix)
    if len(Bs) == 1:  # a single row: duplicate it so the 2-D lookup has two rows
        Bs, v = np.array([1.0, 2.0]), np.vstack([v, v])
    return _Table(Bs, L, np.broadcast_to(v, (len(Bs), len(L))).copy())


def instance_counts(plan: S.Plan, budget: int) -> dict:
    """Whole instances per unit: the plan's device shares of the budget, rounded, at least one."""
    out = {}
    for u in plan.units:
        per = u["devices"]
        out[u["unit"]] = max(1, int(round(u["device_share"] * budget / per)))
    while sum(n * u["devices"] for u, n in zip(plan.units, out.values())) > budget and max(out.values()) > 1:
        k = max(out, key=lambda x: out[x])
        out[k] -= 1
    return out


def arrivals(n, rate, *, trace_s=None, seed=0):
    """``n`` arrival times (s) at mean ``rate`` requests/s: a trace's timestamps rescaled (its first
    ``n``), or a seeded Poisson process."""
    if trace_s is not None:
        t = np.sort(np.asarray(trace_s, dtype=float))[:n]
        t = t - t[0]
        span = t[-1] if t[-1] > 0 else 1.0
        return t * ((len(t) - 1) / rate) / span
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate, n))


def simulate(plan: S.Plan, model, wl: S.Workload, *, budget: int, rate: float | None = None,
             load: float = 0.9, n_requests: int | None = None, trace_s=None, seed: int = 0,
             slo: S.SLO | None = None, prec: Precision = Precision(), eff: Efficiency = Efficiency(),
             grid: S.Grid = S.Grid(), instances: dict | None = None, chunked: bool = True,
             steady: bool | None = None, window: int | None = None, tol: float = STEADY_TOL) -> DESResult:
    """Replay requests through whole instances of ``plan`` (see the module docstring).

    ``chunked=False`` runs a colocated (C, AF) plan without chunked prefill, as vLLM did by default:
    an iteration either prefills whole waiting prompts (FIFO, up to the plan's chunk size in tokens
    but at least one prompt, at most :data:`MAX_PREFILL_PROMPTS`) while the decode batch waits, or
    decodes.

    ``rate``: arrivals per second (default ``load`` times the capacity of the whole instances at the
    plan's design point); lengths from ``wl.lengths`` (per request, cycled) or the means.

    Run length. ``steady=True`` runs to steady state: requests in windows of ``window`` arrivals
    (default: the plan's decode slots at ``load``, ``load x instances x batch``, at least
    :data:`MIN_WINDOW`); each window's p90 TTFT and TPOT are taken once all its requests are done
    (arrivals go on meanwhile, so no window sees the drain at the end); the run stops at the first
    window whose two p90s agree with the previous window's within ``tol`` (relative), and judges the
    plan on those two windows (everything before them is the discarded warm-up). ``n_requests`` then
    caps the run (default :data:`STEADY_MAX`; a trace's arrivals cap it at the trace's length); a run
    that reaches the cap first reports ``steady=False`` and judges on every window but the first (on
    every request if it never completed one).
    ``steady=False`` replays exactly ``n_requests`` requests (default: the number of lengths) and
    judges on all of them. The default is steady state, except with per-request lengths or a trace
    and no ``n_requests`` (a trace is replayed whole). The result reports the requests simulated,
    discarded and measured."""
    _check_args(plan, tol, n_requests)
    t0 = time.perf_counter()
    cost = _Cost(model if isinstance(model, costs.Shape) else costs.shape(model), prec, eff, grid)
    units = {u["unit"]: u for u in plan.units}
    counts = instances or instance_counts(plan, budget)
    if rate is None:
        rate = load * _capacity(units, counts)
    n, m = _run_length(wl, units, counts, rate, n_requests=n_requests, trace_s=trace_s, steady=steady,
                       window=window)
    rq = _requests(wl, n, rate, trace_s, seed)
    env = simpy.Environment()
    engines = _instances(cost, wl, units, counts, chunked, rq, env)
    if m is None:  # a fixed count: every request, judged on all of them
        _drain(env, engines)
        lo, hi, arrived, settled = 0, n, n, None
    else:
        lo, hi, arrived, settled = _steady_state(env, engines, rq, m, tol)
    return _result(rq, env, engines, lo, hi, arrived, settled, counts=counts, rate=rate, slo=slo, t0=t0)


# ---------------------------------------------------------------- the run's inputs

def _check_args(plan, tol, n_requests):
    """Refuse what :func:`simulate` cannot run: an infeasible plan, a tolerance outside (0, 1), a
    request count below one (:class:`~analysis.disagg.search.SearchError`, saying what was given)."""
    if not plan.feasible:
        raise S.SearchError(f"cannot simulate an infeasible plan: {plan.reason}")
    if not 0 < tol < 1:
        raise S.SearchError(f"tol must be a relative tolerance in (0, 1), got {tol!r}")
    if n_requests is not None and not int(n_requests) >= 1:
        raise S.SearchError(f"n_requests must be a positive number of requests, got {n_requests!r}")


def _capacity(units, counts) -> float:
    """Requests/s the whole instances serve at the plan's design point: the least, over the plan's
    units, of the unit's instances (``counts``) times its rate (requests/s per instance) over its
    utilisation ``rho`` (1 for a unit without one)."""
    return min(counts[k] * units[k]["rate"] / (units[k].get("rho", 1.0)) for k in units)


def _run_length(wl, units, counts, rate, *, n_requests, trace_s, steady, window):
    """How many requests to simulate and how to judge them, as :func:`simulate` documents (``steady``
    None resolved to its default here): ``(n, m)``, ``n`` requests and ``m`` the steady-state window
    (requests), or None for a fixed count. The default window is the plan's decode slots (whole
    instances x batch) times ``rate`` over :func:`_capacity`, at least :data:`MIN_WINDOW`."""
    if steady is None:
        steady = n_requests is None and wl.lengths is None and trace_s is None
    if not steady:
        n = int(n_requests or (len(wl.lengths[0]) if wl.lengths is not None else FIXED_REQUESTS))
        if trace_s is not None and n > len(trace_s):
            raise S.SearchError(f"n_requests={n} is more than the trace's {len(trace_s)} arrivals: pass at "
                                f"most that many, or steady=True to stop at steady state within the trace")
        return n, None
    n = int(n_requests or STEADY_MAX)
    if trace_s is not None:
        n = min(n, len(trace_s))
    slots = sum(counts[k] * units[k]["batch"] for k in units if "batch" in units[k])
    m = int(window or max(MIN_WINDOW, round(slots * rate / max(_capacity(units, counts), 1e-300))))
    if m < 1:
        raise S.SearchError(f"window must be a positive number of requests, got {window!r}")
    return n, m


class _Requests:
    """The ``n`` simulated requests, indexed in order of arrival: computed prompt tokens ``I``, cached
    prompt tokens ``H`` (the prefix-cache hit) and output tokens ``O`` (arrays, and as lists ``Il``,
    ``Hl``, ``Ol`` for the engines' one-request lookups), arrival times ``arr`` (s), and the times (s)
    each emits its first token (``first``) and its last (``done``), NaN until it does. ``ctx_lo``,
    ``ctx_hi`` bound the decode context and ``L_lo``, ``L_hi`` the computed prompt (tokens; the step
    tables span them); ``mean_hit``: the mean cached prefix (tokens)."""

    def __init__(self, I, H, O, arr):
        self.n = len(I)
        self.I, self.H, self.O, self.arr = I, H, O, arr
        self.Il, self.Hl, self.Ol = I.tolist(), H.tolist(), O.tolist()
        self.first = np.full(self.n, np.nan)
        self.done = np.full(self.n, np.nan)
        self.ctx_lo, self.ctx_hi = float((I + H).min()), float((I + H + O).max())
        self.L_lo, self.L_hi = float(I.min()), float(I.max())
        self.mean_hit = float(H.mean())


def _requests(wl, n, rate, trace_s, seed) -> _Requests:
    """``n`` requests: lengths from ``wl.lengths`` (cycled) or the means, the prompt split by
    ``wl.prefix_hit`` into cached and computed tokens (rounded; at least one computed prompt token and
    one output token), arriving at ``rate`` requests/s (:func:`arrivals`)."""
    if wl.lengths is not None:
        ins, outs = wl.lengths
    else:
        ins, outs = np.array([wl.input_tokens]), np.array([wl.output_tokens])
    idx = np.arange(n) % len(ins)
    I = np.maximum(np.round(ins[idx] * (1 - wl.prefix_hit)), 1.0)   # computed prompt tokens
    H = np.round(ins[idx] * wl.prefix_hit)                            # cached prompt tokens
    O = np.maximum(np.round(outs[idx]), 1.0)
    return _Requests(I, H, O, arrivals(n, rate, trace_s=trace_s, seed=seed))


@dataclass(frozen=True)
class _Cost:
    """The cost model the instances price their passes with (:mod:`analysis.forward`): the model's
    shape, the precision, the efficiencies, and the search grid (the A/F split's scale-up)."""

    s: costs.Shape
    prec: Precision
    eff: Efficiency
    grid: S.Grid

    def runner(self, u):
        """:func:`_runner` of plan unit ``u``: (pass time function in s, devices per instance, device)."""
        return _runner(self.s, self.prec, self.eff, u, self.grid)


# ---------------------------------------------------------------- the instances

def _instances(cost, wl, units, counts, chunked, rq, env) -> list:
    """Put the plan's whole instances (``counts`` of each unit) and the arrivals (:func:`_arrive`) on
    ``env``, and return the continuous-batching engines (:class:`_Decoder`), whose last iteration ends
    the run. Colocated plans (``C``, ``AF``): every engine runs chunked prefill (whole-prompt prefill
    with ``chunked=False``) and each arrival goes to the least-loaded engine. Disaggregated plans:
    the prefill instances (:class:`_Prefiller`) share one FIFO of arrivals and hand each batch to the
    least-loaded decode engine."""
    names = list(units)
    if names[0] in ("C", "AF"):
        u = units[names[0]]
        engines = [_Decoder(cost, rq, u, chunk=u["chunk"], whole=not chunked)
                   for _ in range(counts[names[0]])]

        def route(r):
            now = env.now
            for e in engines:
                e.advance(now)
            min(engines, key=lambda e: e.load).submit(r, now)
    else:
        pu, du = units[names[0]], units[names[1]]
        engines = [_Decoder(cost, rq, du) for _ in range(counts[names[1]])]
        queue = _PromptQueue(env)
        for _ in range(counts[names[0]]):
            _Prefiller(cost, wl, rq, env, pu, engines, queue)
        route = queue.put
    env.process(_arrive(env, rq, route))
    return engines


def _arrive(env, rq, route):
    """The arrival process (simpy): request ``r`` is routed at its arrival time ``rq.arr[r]`` (s)."""
    arr = rq.arr
    for r in range(rq.n):
        dt = arr[r] - env.now
        if dt > 0:
            yield env.timeout(dt)
        route(r)


def _chunk_tables(run, cap, chunk, rq):
    """The time (s) of ``k`` prompt tokens (0 to ``chunk``) in a mixed iteration, as two memoised
    tables over ``k``: the increment over the decode step of a full batch (``cap`` sequences at the
    requests' mean mid-decode context; the prompt after its cached prefix and half its computed
    tokens), and the pass alone when no sequence decodes."""
    K = float(chunk)
    ks = np.unique(np.r_[0.0, np.geomspace(1, K, 16)])
    ctx_mid = float(np.mean(rq.I + rq.H + rq.O / 2))
    base = run(dec_seqs=float(cap), dec_ctx=ctx_mid)
    inc = run(dec_seqs=float(cap), dec_ctx=ctx_mid, pre_seqs=1.0,
              pre_len=np.maximum(ks, 1.0), pre_prefix=rq.mean_hit + float(np.mean(rq.I)) / 2) - base
    t_chunk = functools.lru_cache(maxsize=4096)(_Table(ks, v=np.where(ks > 0, inc, 0.0)))
    solo = run(pre_seqs=1.0, pre_len=np.maximum(ks, 1.0), pre_prefix=rq.mean_hit)
    t_solo = functools.lru_cache(maxsize=4096)(_Table(ks, v=np.where(ks > 0, solo, 0.0)))
    return t_chunk, t_solo


class _Decoder:
    """A continuous-batching engine (times in s, lengths in tokens): a decode instance (``D``,
    ``DAF``), or with ``chunk`` a colocated instance (``C``, ``AF``) running chunked prefill, or with
    ``whole`` one prefilling whole prompts instead (``chunked=False``). Each iteration is composed by
    one rule (:meth:`_begin`): :meth:`_whole_prefill`, :meth:`_mixed` or :meth:`_decode`.

    A running sequence is a count and an entry in ``finish`` (the iteration it ends at), so one
    iteration is a table lookup and a dictionary pop. The engine is advanced lazily: its iterations
    are not simpy events but a loop run up to the time of the next routing decision (:meth:`advance`),
    since nothing but a submission can change what an engine does; the state seen at that time is the
    one an event per iteration would give."""

    def __init__(self, cost, rq, u, chunk=None, whole=False):
        run, self.devices, _ = cost.runner(u)
        self.Il, self.Hl, self.Ol, self.first, self.done = rq.Il, rq.Hl, rq.Ol, rq.first, rq.done
        self.cap = int(u["batch"])
        self.t_dec = _decode_table(run, self.cap, rq.ctx_lo, rq.ctx_hi)
        self.whole = whole
        if whole:  # prefill whole prompts, pausing the decode batch
            self.tok_budget = float(chunk)
            self.t_pre = _prefill_table(run, MAX_PREFILL_PROMPTS, rq.L_lo, rq.L_hi, rq.mean_hit)
            chunk = None
        self.chunk = chunk
        if chunk:
            self.t_chunk, self.t_solo = _chunk_tables(run, self.cap, chunk, rq)
        self.n = 0              # running sequences
        self.it = 0             # iterations done
        self.finish = {}        # iteration -> requests that emit their last token in it
        self.ctx_sum = 0.0
        self.waiting = deque()  # decode: request ids; chunked: [id, prompt tokens left]
        self.end = None         # end time of the iteration in flight (None: idle)
        self.flight = None      # (decode batch, requests whose prefill the iteration finishes)
        self.start = None       # an idle engine's wake-up time (its first iteration starts then)
        self.last = 0.0         # end of the last iteration run

    @property
    def load(self):
        """Running and waiting sequences (the router picks the least)."""
        return self.n + len(self.waiting)

    def submit(self, r, now):
        """Request ``r`` arrives at ``now`` (s): it waits for its prefill (chunked) or a decode slot."""
        self.waiting.append(r if not self.chunk else [r, self.Il[r]])
        if self.end is None and self.start is None:
            self.start = now  # starts once every submission of this instant is in

    def _admit(self, r, now):
        """A sequence whose first token is out joins the decode batch."""
        if self.Ol[r] <= 1:
            self.done[r] = now
            return
        self.n += 1
        self.finish.setdefault(self.it + int(self.Ol[r]) - 1, []).append(r)
        self.ctx_sum += self.Il[r] + self.Hl[r] + 1

    def _begin(self, now):
        """Compose the iteration starting at ``now`` (s) by the engine's rule, or go idle when there is
        nothing to run."""
        while self.n or self.waiting:
            if self.whole and self.waiting and self.n < self.cap:
                step = self._whole_prefill()
            elif self.chunk:
                step = self._mixed()
            else:
                step = self._decode(now)
            if step is not None:
                B, finished_prefill, dt = step
                self.flight = (B, finished_prefill)
                self.end = now + dt
                return
        self.end = None

    def _whole_prefill(self):
        """Without chunked prefill: whole waiting prompts (FIFO: at least one, then while they fit in
        ``tok_budget`` tokens, :data:`MAX_PREFILL_PROMPTS` prompts and the free decode slots) in one
        iteration priced at their mean length, while the decode batch waits. Returns (decode batch 0,
        the prompts, the iteration's time in s)."""
        finished_prefill = []
        tok = 0.0
        while (self.waiting and self.n + len(finished_prefill) < self.cap
               and len(finished_prefill) < MAX_PREFILL_PROMPTS
               and (not finished_prefill or tok + self.Il[self.waiting[0]] <= self.tok_budget)):
            r = self.waiting.popleft()
            tok += self.Il[r]
            finished_prefill.append(r)
        return 0, finished_prefill, self.t_pre(len(finished_prefill), tok / len(finished_prefill))

    def _mixed(self):
        """Chunked prefill: the running decode batch plus up to ``chunk`` prompt tokens of the waiting
        prompts (FIFO, no more prompts finishing than free decode slots), priced as the decode step at
        the batch's mean context plus the chunk's increment (the chunk alone with no batch). Returns
        (decode batch, the prompts whose prefill it finishes, the iteration's time in s)."""
        B = self.n
        finished_prefill = []
        k_tok, left_tok, slots = 0.0, float(self.chunk), self.cap - B
        for w in self.waiting:
            if left_tok <= 0 or slots <= 0:
                break
            take = min(w[1], left_tok)
            w[1] -= take
            left_tok -= take
            k_tok += take
            if w[1] <= 0:
                finished_prefill.append(w[0])
                slots -= 1
        dt = (self.t_dec(B, self.ctx_sum / B) + self.t_chunk(k_tok)) if B else self.t_solo(k_tok)
        return B, finished_prefill, dt

    def _decode(self, now):
        """A decode instance: waiting sequences (prefilled elsewhere) join the batch up to its cap, then
        one decode step at the batch's mean context. Returns (decode batch, no prompts, the step's
        time in s), or None when nothing is left to decode."""
        while self.waiting and self.n < self.cap:
            self._admit(self.waiting.popleft(), now)
        B = self.n
        if not B:
            return None
        return B, [], self.t_dec(B, self.ctx_sum / B)

    def _complete(self):
        """End the iteration in flight: every running sequence emits a token (the finished ones leave),
        every prompt it prefilled emits its first token and joins the batch; begin the next."""
        now = self.end
        B, finished_prefill = self.flight
        if B:  # every running sequence emitted a token
            self.it += 1
            self.ctx_sum += B
            for r in self.finish.pop(self.it, ()):
                self.done[r] = now
                self.n -= 1
                self.ctx_sum -= self.Il[r] + self.Hl[r] + self.Ol[r]
        if finished_prefill:
            while self.chunk and self.waiting and self.waiting[0][1] <= 0:
                self.waiting.popleft()
            for r in finished_prefill:  # the first token comes out of the prefill iteration
                self.first[r] = now
                self._admit(r, now)
        self.last = now
        self._begin(now)

    def advance(self, t):
        """Run every iteration that ends by ``t`` (an idle engine woken before ``t`` starts first)."""
        if self.start is not None and self.start < t:
            st, self.start = self.start, None
            self._begin(st)
        while self.end is not None and self.end <= t:
            self._complete()


class _PromptQueue:
    """The prefill instances' shared FIFO of arrived request ids; :meth:`put` wakes the idle ones."""

    def __init__(self, env):
        self.env = env
        self.ids = []
        self.event = env.event()

    def put(self, r):
        """Request ``r`` arrives: queue it and wake every prefill instance waiting for a prompt."""
        self.ids.append(r)
        ev = self.event
        self.event = self.env.event()
        ev.succeed()


class _Prefiller:
    """A prefill instance (``P``, ``PAF``; a simpy process, times in s): takes up to ``pbatch``
    waiting prompts (FIFO, never waiting for a batch to fill), runs one pass priced at their mean
    length (plus the exposed load of the cached prefix), then hands them over (:meth:`hand_over`)."""

    def __init__(self, cost, wl, rq, env, u, decoders, queue):
        s, prec, eff = cost.s, cost.prec, cost.eff
        run, self.devices, self.dev = cost.runner(u)
        self.b = int(u["pbatch"])
        self.t_pass = _prefill_table(run, self.b, rq.L_lo, rq.L_hi, rq.mean_hit)
        self.decoders = decoders
        self.queue = queue
        self.rq, self.env = rq, env
        mean_hit = rq.mean_hit
        # the exposed transfers, memoised on their exact arguments (fixed lengths repeat them)
        hit_net, net = wl.hit_bw / eff.link, self.dev["net"]
        self.x_hit = functools.lru_cache(maxsize=4096)(
            lambda b, t: float(costs.kv_transfer_exposed(s, prec, eff, seqs=b, tokens=mean_hit, t_pass=t,
                                                         devices=self.devices, net=hit_net)))
        self.x_kv = functools.lru_cache(maxsize=4096)(
            lambda b, L, t: float(costs.kv_transfer_exposed(s, prec, eff, seqs=b, tokens=L + mean_hit,
                                                            t_pass=t, devices=self.devices, net=net)))
        env.process(self.loop())

    def loop(self):
        """The instance's passes, one after another, while prompts wait."""
        rq, env, queue = self.rq, self.env, self.queue
        while True:
            while not queue.ids:
                yield queue.event
            batch = queue.ids[:self.b]
            del queue.ids[:self.b]
            L = float(np.mean(rq.I[batch])) if len(batch) > 1 else rq.Il[batch[0]]
            t = self.t_pass(len(batch), L)
            if rq.mean_hit > 0:
                t += self.x_hit(len(batch), t)
            yield env.timeout(t)
            env.process(self.hand_over(batch, self.x_kv(len(batch), L, t)))

    def hand_over(self, batch, x):
        """After the exposed KV transfer ``x`` (s), each prompt's first token leaves and the sequence
        goes to the least-loaded decode instance."""
        env = self.env
        yield env.timeout(x)
        now = env.now
        for d in self.decoders:
            d.advance(now)
        for r in batch:
            self.rq.first[r] = now
            d = min(self.decoders, key=lambda e: e.load)
            d.submit(r, now)


# ---------------------------------------------------------------- run length and result

def _drain(env, engines):
    """Run to the end: every simpy event, then the engines' iterations after the last routing
    decision."""
    env.run()
    for e in engines:  # the iterations after the last routing decision
        e.advance(np.inf)


def _p90s(rq, lo, hi):
    """The :data:`PERCENTILE` TTFT and TPOT (s) of requests ``lo:hi`` (TPOT over those with more than
    one output token; 0 if none has)."""
    tt = rq.first[lo:hi] - rq.arr[lo:hi]
    multi = rq.O[lo:hi] > 1
    tp = (rq.done[lo:hi] - rq.first[lo:hi])[multi] / (rq.O[lo:hi][multi] - 1)
    return (float(np.percentile(tt, PERCENTILE)),
            float(np.percentile(tp, PERCENTILE)) if multi.any() else 0.0)


def _agree(cur, prev, tol) -> bool:
    """Steady state: each of two windows' p90s within ``tol`` of the other (relative to the larger)."""
    return prev is not None and all(abs(a - b) <= tol * max(abs(a), abs(b), 1e-300)
                                    for a, b in zip(cur, prev))


def _await_window(env, engines, rq, lo, hi, j, m) -> int:
    """Run on, arrivals continuing, until every request of the window ``lo:hi`` is done: up to the
    arrival of request ``j`` (at least the window's last), then a quarter window of arrivals (at least
    one) at a time; past the last arrival, to the end (:func:`_drain`). Returns the last ``j``."""
    n = rq.n
    j = max(j, hi - 1)
    while np.isnan(rq.first[lo:hi]).any() or np.isnan(rq.done[lo:hi]).any():
        if j >= n - 1:
            _drain(env, engines)
            break
        j = min(j + max(m // 4, 1), n - 1)
        t = float(rq.arr[j])
        if t > env.now:
            env.run(until=t)
        for e in engines:
            e.advance(t)
    return j


def _steady_state(env, engines, rq, m, tol):
    """The steady-state stop rule (:func:`simulate`), windows of ``m`` requests: ``(lo, hi, arrived,
    settled)``, the requests ``lo:hi`` judged on, the requests arrived when the run stopped, and
    whether two successive windows' p90s agreed (:func:`_agree`) before the last request. Settled:
    judged on those two windows. Not: the run goes to the end and is judged on every window but the
    first (on every request if it never completed one)."""
    n = rq.n
    hi, prev, j = 0, None, 0
    while hi + m <= n:
        lo, hi = hi, hi + m
        j = _await_window(env, engines, rq, lo, hi, j, m)
        cur = _p90s(rq, lo, hi)
        if _agree(cur, prev, tol):
            arrived = int(np.searchsorted(rq.arr, env.now, side="left")) if env.now < rq.arr[-1] else n
            return lo - m, hi, max(arrived, hi), True
        prev = cur
    _drain(env, engines)
    return (m if n > m else 0), n, n, False  # the first window is the warm-up


def _result(rq, env, engines, lo, hi, arrived, settled, *, counts, rate, slo, t0) -> DESResult:
    """The :class:`DESResult`: per-request TTFT and TPOT (s; TPOT 0 for a single output token) of the
    first ``hi`` requests, their p90s and SLO attainment over ``lo:hi`` (NaN without ``slo``), the
    simulated time to the last iteration (s) and the wall time since ``t0`` (s)."""
    end = max([env.now] + [e.last for e in engines])
    ttft = (rq.first - rq.arr)[:hi]
    tpot = np.where(rq.O > 1, (rq.done - rq.first) / np.maximum(rq.O - 1, 1), 0.0)[:hi]
    p90_ttft, p90_tpot = _p90s(rq, lo, hi)
    sel = slice(lo, hi)
    att = (float(np.mean((ttft[sel] <= slo.ttft_s) & (tpot[sel] <= slo.tpot_s))) if slo else float("nan"))
    return DESResult(ttft, tpot, p90_ttft, p90_tpot, att, counts, float(rate), float(end),
                     time.perf_counter() - t0, requests=int(arrived), warmup=int(lo), measured=int(hi - lo),
                     steady=settled)


def rerank(mode, model, wl: S.Workload, slo: S.SLO, hardware: dict, *, k: int = 5, budget: int = 64,
           load: float = 0.9, trace_s=None, seed: int = 0, prec: Precision = Precision(),
           eff: Efficiency = Efficiency(), grid: S.Grid = S.Grid(), chunked: bool = True,
           n_requests: int | None = None, steady: bool | None = None) -> list:
    """The analytic screen's ``k`` best plans of ``mode``, each replayed by :func:`simulate` at
    ``load`` times its capacity and judged at the 90th percentile: a list of dicts (best analytic
    first) with the plan, its analytic throughput per device (rate-matched pools), the devices of its
    whole instances and the throughput per device they serve in the simulation (``des_tps_device``:
    arrival rate x mean output / devices), the simulated p90 TTFT and TPOT, the SLO attainment and
    whether both p90s meet the SLO. ``n_requests`` and ``steady`` as :func:`simulate` (steady state,
    or a fixed request count); each row reports ``requests`` simulated, ``warmup`` discarded,
    ``measured`` and ``steady`` (whether the p90s settled within the cap)."""
    plans = S.top_plans(mode, model, wl, slo, hardware, k=k, budget=budget, prec=prec, eff=eff, grid=grid,
                        enforce_context=False)
    out = []
    for rank, p in enumerate(plans):
        if not p.feasible:
            out.append({"rank": rank, "plan": p, "feasible": False})
            continue
        r = simulate(p, model, wl, budget=budget, load=load, trace_s=trace_s, seed=seed, slo=slo, prec=prec,
                     eff=eff, grid=grid, chunked=chunked, n_requests=n_requests, steady=steady)
        used = sum(r.instances[u["unit"]] * u["devices"] for u in p.units)
        mean_out = float(np.mean(wl.lengths[1])) if wl.lengths is not None else wl.output_tokens
        out.append({"rank": rank, "plan": p, "feasible": True, "tps_device": p.tokens_per_s_per_device,
                    "devices_used": used, "des_tps_device": r.rate * mean_out / used,
                    "p90_ttft_s": r.p90_ttft_s, "p90_tpot_s": r.p90_tpot_s, "attainment": r.attainment,
                    "meets_p90": r.judged(slo), "rate": r.rate, "instances": r.instances, "wall_s": r.wall_s,
                    "requests": r.requests, "warmup": r.warmup, "measured": r.measured, "steady": r.steady})
    return out
