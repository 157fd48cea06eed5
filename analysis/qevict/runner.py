"""Run every (policy, budget) stream on one document in lockstep and record what happens.

One shared prefill of ``prefill_tokens`` tokens at full attention (attention reduced on the fly
to per-window statistics), then ``decode_tokens`` teacher-forced decoding steps in which each
stream reads its own compressed cache.  Stream 0 is the full cache (unless ``include_full`` is
false), the reference for the
next-token KL divergence, top-1 agreement and for the attention that defines Future Missed Mass.
"""
from __future__ import annotations

import dataclasses
import hashlib
import time
from functools import lru_cache

import numpy as np
from scipy.ndimage import maximum_filter1d

from analysis.cache import cached

from .kvcache import EVICTED, FULL, OFFLOADED, QUANT, MultiStreamCache
from .policies import PolicyConfig, make_policy

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # optional: _blas_threads then leaves the BLAS as it is
    threadpool_limits = None


class PrefillCapture:
    """Reduces prefill attention probabilities chunk by chunk to per-token column statistics."""

    def __init__(self, n_layers, n_heads, P, obs_tokens):
        self.P, self.obs = P, obs_tokens
        self.colsum = np.zeros((n_layers, n_heads, P), np.float32)
        self.obs_sum = np.zeros((n_layers, n_heads, P), np.float32)
        self.last = np.zeros((n_layers, n_heads, P), np.float32)

    def on_attention(self, li, s, probs):  # probs (H, n, e), e = s + n
        n, e = probs.shape[1], probs.shape[2]
        self.colsum[li, :, :e] += probs.sum(1)
        lo = max(self.P - self.obs, s)
        if lo < s + n:
            self.obs_sum[li, :, :e] += probs[:, lo - s:, :].sum(1)
        if s + n == self.P:
            self.last[li, :, :e] = probs[:, -1, :]


def window_stats(cap: PrefillCapture, n_kv: int, window: int, kernel: int) -> dict:
    """Per (layer, KV head, window) statistics: mean over the query heads of a KV head, sum over
    the tokens of a window.  ``snap`` max-pools the observation-window attention over ``kernel``
    tokens first (SnapKV)."""
    L, H, P = cap.colsum.shape
    g = H // n_kv

    def red(x):
        x = x.reshape(L, n_kv, g, P).mean(2)
        return x.reshape(L, n_kv, P // window, window).sum(-1).astype(np.float64)

    obs = cap.obs_sum
    if kernel > 1:
        pooled = maximum_filter1d(obs, size=kernel, axis=-1, mode="constant", cval=0.0)
    else:
        pooled = obs
    return dict(colsum=red(cap.colsum), obs=red(obs), snap=red(pooled), last=red(cap.last))


@lru_cache(maxsize=4)
def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


# Decoding multiplies small matrices (one row per stream); one BLAS thread is about as fast as two
# and far more robust when other processes share the cores (OpenBLAS threads then spin and stall).
DECODE_BLAS_THREADS = 1


class _blas_threads:
    def __init__(self, n):
        self.n, self.ctl = n, None

    def __enter__(self):
        if threadpool_limits is None:  # optional: leave the BLAS as it is
            return self
        self.ctl = threadpool_limits(limits=self.n, user_api="blas")
        return self

    def __exit__(self, *exc):
        if self.ctl is not None:
            self.ctl.restore_original_limits()


def stream_list(policies, budgets, include_full: bool = True):
    """[(policy, frac)], the full cache first (at 100%), then every other policy at every budget."""
    out = [("full", 1.0)] if include_full else []
    for p in policies:
        if p == "full":
            continue
        for f in budgets:
            out.append((p, float(f)))
    return out


def run_document(model, tokens, prefill_tokens: int, decode_tokens: int, policies, budgets,
                 pcfg: PolicyConfig, *, verbose: bool = False, record_tiers: bool = False,
                 include_full: bool = True, overrides: dict | None = None, extra_streams=(),
                 engine: str = "fused", free_run_spans=()) -> dict:
    """Run all streams on ``tokens`` (at least prefill + decode + 1 tokens).

    ``overrides``: {(policy, frac): PolicyConfig} replacing ``pcfg`` for those streams (settings
    tuned per budget); ``extra_streams``: further (policy, frac, PolicyConfig) streams appended after
    the others (a settings search runs its candidates in one lockstep batch).  Returns arrays:

    * ``kl``, ``nll``, ``top1``, ``correct``: (D, B) per decoding step and stream,
    * ``fmm``, ``fmm_evicted``: (D, B, L) full-cache attention mass (mean over KV heads) on windows
      the stream does not hold at full precision / does not hold at all,
    * ``attn_full``: (D, L, Hkv, NW) full-cache attention per window (mean over query heads),
    * ``fmm_quantized``, ``fmm_offloaded``: (D, B, L) the parts of ``fmm`` on quantized windows and
      on offloaded windows not loaded at that step; ``fmm_evicted`` counts every window the stream
      cannot read at that step (evicted, or offloaded and not loaded),
    * ``hot_bytes``, ``budget_bytes``: (R, B) at each re-decision; ``tier_bytes``: per stream dict
      at the end; ``recall_bytes``, ``offload_bytes``, ``promotions``, ``fits``: per stream;
      ``argmax``: (D, B) each stream's greedy prediction at each step; ``redecisions`` during decoding,
    * ``device_bytes``, ``offdevice_bytes``, ``step_recall_bytes``, ``step_recall_transfers``: (D, B)
      per decoding step: bytes on the device (tiers, open window, loaded pages, digests), exact copies
      kept off the device, and the bytes and window-head transfers recalled to the device during the
      step (Quest's page loads, and the recalls of the re-decision that follows the step).

    ``free_run_spans``: [(start, end)] document token ranges (e.g. needle answers) decoded
    free-running: inside them each stream reads back its own previous prediction instead of the
    document's token (greedy generation), so the answer scored is the one the stream generated.
    """
    cfg = getattr(model, "kv_cfg", model.cfg)  # the layers the policies manage (Gemma: the global ones)
    tokens = np.asarray(tokens, dtype=np.int64)
    P, D, W = int(prefill_tokens), int(decode_tokens), pcfg.window
    _check_lengths(cfg, len(tokens), P, D, W)  # before any work
    streams, cfgs = _build_streams(policies, budgets, include_full, pcfg, overrides or {}, extra_streams)
    free = _free_running_mask(len(tokens), P, free_run_spans)
    t0 = time.perf_counter()
    pre, stats = _prefill(model, tokens[:P], cfg, pcfg)
    t_prefill = time.perf_counter() - t0
    cache = _open_cache(model, cfg, pre, len(streams), P + D, pcfg, engine)
    del pre
    pols = _start_policies(streams, cfgs, cache, stats)
    trace = _Trace.empty(D, cache, record_tiers)
    _redecide(cache, pols, P // W, trace)
    t1 = time.perf_counter()
    with _blas_threads(DECODE_BLAS_THREADS):
        _decode_loop(model, tokens, free, cache, pols, trace, P, D, W, verbose=verbose, t1=t1)
    return _result(streams, cache, pols, trace, P, D, W, free_run_spans, t_prefill=t_prefill, t1=t1)


def _check_lengths(cfg, n_tokens: int, P: int, D: int, W: int) -> None:
    """Reject a prefill that is not whole windows, a run beyond the model context or a short document."""
    if P % W:
        raise ValueError(f"prefill_tokens ({P}) must be a multiple of the window ({W})")
    if P + D > cfg.context_length:
        raise ValueError(f"prefill + decode = {P + D} exceeds the model context {cfg.context_length}")
    if n_tokens < P + D + 1:
        raise ValueError(f"document has {n_tokens} tokens, needs prefill + decode + 1 = {P + D + 1}")


def _build_streams(policies, budgets, include_full, pcfg, overrides, extra_streams):
    """([(policy, frac)], [PolicyConfig]) of every stream, the extra streams last."""
    streams = stream_list(policies, budgets, include_full)
    cfgs = [overrides.get((p, f), pcfg) for p, f in streams]
    for p, f, c in extra_streams:
        streams.append((p, float(f)))
        cfgs.append(c)
    if not streams:
        raise ValueError("no streams to run")
    return streams, cfgs


def _free_running_mask(n_tokens: int, P: int, free_run_spans) -> np.ndarray:
    """(n_tokens,) bool: the document positions decoded free-running (each span after the prefill)."""
    free = np.zeros(n_tokens, bool)
    for a_, b_ in free_run_spans:
        if a_ <= P:
            raise ValueError(f"free-running span {a_}:{b_} must start after the prefill ({P})")
        free[a_:b_] = True
    return free


def _prefill(model, prompt, cfg, pcfg: PolicyConfig):
    """(prefill output, per-window attention statistics) of the shared full-attention prefill."""
    cap = PrefillCapture(cfg.n_layers, cfg.n_heads, len(prompt), pcfg.snap_obs_tokens)
    pre = model.prefill(prompt, logits="none", capture=cap)
    return pre, window_stats(cap, cfg.n_kv_heads, pcfg.window, pcfg.snap_kernel)


def _open_cache(model, cfg, pre, n_streams: int, Tmax: int, pcfg: PolicyConfig, engine: str):
    """The multi-stream cache holding the prefill's keys and values, every stream at full precision."""
    cache = MultiStreamCache(cfg, n_streams, pre["k"], pre["v"], Tmax, pcfg.window,
                             bits=[0] * n_streams, group=pcfg.group, engine=engine)
    if hasattr(model, "attach_local"):  # sliding-window layers keep their own window per stream
        model.attach_local(cache, pre)
    return cache


def _start_policies(streams, cfgs, cache, stats) -> list:
    """One policy per stream, initialised on the prefill statistics; sets the cache's bits and digests."""
    pols = [make_policy(p, f, c, cache.L, cache.Hkv, cache.NW) for (p, f), c in zip(streams, cfgs)]
    cache.set_bits([p.bits for p in pols])
    cache.digest_rows[:] = [p.uses_digest for p in pols]
    for p in pols:
        p.init(stats)
    return pols


@dataclasses.dataclass
class _Trace:
    """What decoding records: per step and stream, and per re-decision (``hot``, ``budget``)."""

    kl: np.ndarray
    nll: np.ndarray
    top1: np.ndarray
    correct: np.ndarray
    argmax: np.ndarray
    fmm: np.ndarray
    fmm_evicted: np.ndarray
    fmm_quantized: np.ndarray
    fmm_offloaded: np.ndarray
    device_bytes: np.ndarray
    offdevice_bytes: np.ndarray
    step_recall_bytes: np.ndarray
    step_recall_transfers: np.ndarray
    attn_full: np.ndarray
    tiers: list | None
    hot: list = dataclasses.field(default_factory=list)
    budget: list = dataclasses.field(default_factory=list)
    redecisions: int = 0

    @classmethod
    def empty(cls, D: int, cache, record_tiers: bool) -> _Trace:
        """Zeroed arrays for ``D`` steps of the cache's streams (``tiers`` only if recorded)."""
        B, L, Hkv, NW = cache.B, cache.L, cache.Hkv, cache.NW
        return cls(
            kl=np.zeros((D, B)), nll=np.zeros((D, B)), top1=np.zeros((D, B), bool),
            correct=np.zeros((D, B), bool), argmax=np.zeros((D, B), np.int64),
            fmm=np.zeros((D, B, L), np.float32), fmm_evicted=np.zeros((D, B, L), np.float32),
            fmm_quantized=np.zeros((D, B, L), np.float32), fmm_offloaded=np.zeros((D, B, L), np.float32),
            device_bytes=np.zeros((D, B)), offdevice_bytes=np.zeros((D, B)),
            step_recall_bytes=np.zeros((D, B)), step_recall_transfers=np.zeros((D, B)),
            attn_full=np.zeros((D, L, Hkv, NW), np.float32), tiers=[] if record_tiers else None)


def _redecide(cache, pols, nc: int, trace: _Trace) -> None:
    """Each policy re-tiers its stream over ``nc`` closed windows; records hot and budget bytes."""
    h_row, b_row = [], []
    for b, p in enumerate(pols):
        new = p.target(cache.tier[b], nc)
        cache.set_tiers(b, new, promote=p.promote)
        if p.step_pages is not None:
            cache.step_pages[b] = p.step_pages
        hb = cache.hot_bytes(b, nc) + p.extra_device_bytes(nc)
        h_row.append(int(hb.sum()))
        b_row.append(p.budget_bytes(nc) * cache.L * cache.Hkv)
        if p.name != "full" and hb.max() > p.budget_bytes(nc) + 1e-6:
            raise AssertionError(f"{p.name}@{p.frac}: {hb.max()} bytes > budget {p.budget_bytes(nc)}")
    trace.hot.append(h_row)
    trace.budget.append(b_row)


def _decode_loop(model, tokens, free, cache, pols, trace: _Trace, P: int, D: int, W: int, *,
                 verbose: bool, t1: float) -> None:
    """``D`` lockstep decoding steps, each recorded in ``trace``; re-decides as each window closes."""
    for s in range(D):
        pos = P + s
        rb0, rn0 = cache.recall_bytes.copy(), cache.recall_transfers.copy()
        token = trace.argmax[s - 1] if free[pos] else int(tokens[pos])  # own prediction inside a span
        logits = model.decode_step(token, pos, cache).astype(np.float64)
        _score_step(trace, s, logits, int(tokens[pos + 1]))
        _record_missed_mass(trace, s, cache)
        _record_bytes(trace, s, cache, pos // W)  # windows closed before this step's token
        _observe(pols, cache)
        if (pos + 1) % W == 0 and s < D - 1:
            _redecide(cache, pols, (pos + 1) // W, trace)
            trace.redecisions += 1
        trace.step_recall_bytes[s] = cache.recall_bytes - rb0
        trace.step_recall_transfers[s] = cache.recall_transfers - rn0
        if verbose and (s + 1) % 32 == 0:
            ms = (time.perf_counter() - t1) / (s + 1) * 1e3
            print(f"  step {s + 1}/{D}: {ms:.0f} ms/step", flush=True)


def _score_step(trace: _Trace, s: int, logits: np.ndarray, tgt: int) -> None:
    """KL to stream 0, NLL of the target, greedy prediction and its agreement at step ``s``."""
    lp = logits - logits.max(-1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
    p0 = np.exp(lp[0])
    trace.kl[s] = (p0 * (lp[0] - lp)).sum(-1)
    trace.nll[s] = -lp[:, tgt]
    am = logits.argmax(-1)
    trace.argmax[s] = am
    trace.top1[s] = am == am[0]
    trace.correct[s] = am == tgt


def _record_missed_mass(trace: _Trace, s: int, cache) -> None:
    """Full-cache attention at step ``s`` and its mass on the windows each stream cannot read fully."""
    Hkv = cache.Hkv
    A = cache.win_attn[:, 0]  # (L, Hkv, NW) full-cache attention
    trace.attn_full[s] = A
    unread_off = (cache.tier == OFFLOADED) & ~cache.loaded  # (B, L, Hkv, NW)
    notfull = (cache.tier != FULL) & ~cache.loaded  # windows not yet closed are FULL
    ev = (cache.tier == EVICTED) | unread_off
    trace.fmm[s] = np.einsum("blhw,lhw->bl", notfull, A, optimize=True) / Hkv
    trace.fmm_evicted[s] = np.einsum("blhw,lhw->bl", ev, A, optimize=True) / Hkv
    trace.fmm_quantized[s] = np.einsum("blhw,lhw->bl", cache.tier == QUANT, A, optimize=True) / Hkv
    trace.fmm_offloaded[s] = np.einsum("blhw,lhw->bl", unread_off, A, optimize=True) / Hkv


def _record_bytes(trace: _Trace, s: int, cache, nc_now: int) -> None:
    """Device and off-device bytes of each stream at step ``s`` (and its tiers, if recorded)."""
    for b in range(cache.B):
        trace.device_bytes[s, b] = cache.device_bytes(b, nc_now)
        trace.offdevice_bytes[s, b] = cache.offdevice_bytes(b, nc_now)
    if trace.tiers is not None:
        trace.tiers.append(cache.tier.copy())


def _observe(pols, cache) -> None:
    """Each policy observes its stream's attention at this step (and its digest estimate)."""
    for b, p in enumerate(pols):
        p.observe(cache.win_attn[:, b])
        if p.uses_digest:
            p.observe_estimate(cache.win_est[:, b])


def _result(streams, cache, pols, trace: _Trace, P: int, D: int, W: int, free_run_spans, *,
            t_prefill: float, t1: float) -> dict:
    """The result dict of :func:`run_document` from the trace, the cache and the timings."""
    B, L, Hkv = len(streams), cache.L, cache.Hkv
    nc_end = (P + D) // W
    out = dict(
        streams=streams, kl=trace.kl, nll=trace.nll, top1=trace.top1, correct=trace.correct, fmm=trace.fmm,
        fmm_evicted=trace.fmm_evicted, fmm_quantized=trace.fmm_quantized,
        fmm_offloaded=trace.fmm_offloaded, device_bytes=trace.device_bytes,
        offdevice_bytes=trace.offdevice_bytes, step_recall_bytes=trace.step_recall_bytes,
        step_recall_transfers=trace.step_recall_transfers, recall_transfers=cache.recall_transfers.copy(),
        full_bytes_step=((P + np.arange(D)) // W + 1) * float(cache.F * L * Hkv),
        attn_full=trace.attn_full, hot_bytes=np.array(trace.hot, float),
        budget_bytes=np.array(trace.budget, float),
        tier_bytes=[cache.tier_bytes(b, nc_end) for b in range(B)],
        recall_bytes=cache.recall_bytes.copy(), offload_bytes=cache.offload_bytes.copy(),
        promotions=cache.n_promotions.copy(), fits=np.array([p.fits for p in pols]),
        redecisions=trace.redecisions, argmax=trace.argmax, free_run_spans=list(free_run_spans),
        full_bytes_end=float(nc_end * cache.F * L * Hkv), prefill_tokens=P, decode_tokens=D, window=W,
        seconds_prefill=t_prefill, seconds_decode=time.perf_counter() - t1,
    )
    if trace.tiers is not None:
        out["tiers"] = np.array(trace.tiers)
    return out


def run_document_cached(model, tokens, prefill_tokens, decode_tokens, policies, budgets, pcfg,
                        *, verbose=False, overrides: dict | None = None, extra_streams=()):
    """:func:`run_document`, memoised on disk by the tokens, lengths, policies, budgets, policy
    configuration, model file and code (``analysis.cache``)."""
    tokens = np.asarray(tokens, dtype=np.int64)[: prefill_tokens + decode_tokens + 1]
    inputs = dict(tokens=hashlib.sha256(tokens.tobytes()).hexdigest(), P=int(prefill_tokens),
                  D=int(decode_tokens), policies=list(policies), budgets=[float(b) for b in budgets],
                  pcfg=dataclasses.asdict(pcfg),
                  model=file_sha256(model.gguf_file) if model.gguf_file else None)
    if overrides:
        inputs["overrides"] = sorted([p, float(f), dataclasses.asdict(c)] for (p, f), c in overrides.items())
    if extra_streams:
        inputs["extra_streams"] = [[p, float(f), dataclasses.asdict(c)] for p, f, c in extra_streams]
    return cached("qevict_run", inputs, lambda: run_document(
        model, tokens, prefill_tokens, decode_tokens, policies, budgets, pcfg, verbose=verbose,
        overrides=overrides, extra_streams=extra_streams))
