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
    if P % W:
        raise ValueError(f"prefill_tokens ({P}) must be a multiple of the window ({W})")
    if P + D > cfg.context_length:  # before any work
        raise ValueError(f"prefill + decode = {P + D} exceeds the model context {cfg.context_length}")
    if len(tokens) < P + D + 1:
        raise ValueError(f"document has {len(tokens)} tokens, needs prefill + decode + 1 = {P + D + 1}")
    streams = stream_list(policies, budgets, include_full)
    overrides = overrides or {}
    cfgs = [overrides.get((p, f), pcfg) for p, f in streams]
    for p, f, c in extra_streams:
        streams.append((p, float(f)))
        cfgs.append(c)
    if not streams:
        raise ValueError("no streams to run")
    B, L, Hkv = len(streams), cfg.n_layers, cfg.n_kv_heads
    t0 = time.perf_counter()
    cap = PrefillCapture(L, cfg.n_heads, P, pcfg.snap_obs_tokens)
    pre = model.prefill(tokens[:P], logits="none", capture=cap)
    stats = window_stats(cap, Hkv, W, pcfg.snap_kernel)
    t_prefill = time.perf_counter() - t0
    cache = MultiStreamCache(cfg, B, pre["k"], pre["v"], P + D, W,
                             bits=[0] * B, group=pcfg.group, engine=engine)
    if hasattr(model, "attach_local"):  # sliding-window layers keep their own window per stream
        model.attach_local(cache, pre)
    del pre
    NW = cache.NW
    pols = [make_policy(p, f, c, L, Hkv, NW) for (p, f), c in zip(streams, cfgs)]
    cache.set_bits([p.bits for p in pols])
    cache.digest_rows[:] = [p.uses_digest for p in pols]
    for p in pols:
        p.init(stats)

    hot, budget = [], []
    n_redecide = [0]

    def redecide(nc):
        h_row, b_row = [], []
        for b, p in enumerate(pols):
            new = p.target(cache.tier[b], nc)
            cache.set_tiers(b, new, promote=p.promote)
            if p.step_pages is not None:
                cache.step_pages[b] = p.step_pages
            hb = cache.hot_bytes(b, nc) + p.extra_device_bytes(nc)
            h_row.append(int(hb.sum()))
            b_row.append(p.budget_bytes(nc) * L * Hkv)
            if p.name != "full" and hb.max() > p.budget_bytes(nc) + 1e-6:
                raise AssertionError(f"{p.name}@{p.frac}: {hb.max()} bytes > budget {p.budget_bytes(nc)}")
        hot.append(h_row)
        budget.append(b_row)

    redecide(P // W)
    kl = np.zeros((D, B))
    nll = np.zeros((D, B))
    top1 = np.zeros((D, B), bool)
    correct = np.zeros((D, B), bool)
    argmax = np.zeros((D, B), np.int64)
    free = np.zeros(len(tokens), bool)
    for a_, b_ in free_run_spans:
        if a_ <= P:
            raise ValueError(f"free-running span {a_}:{b_} must start after the prefill ({P})")
        free[a_:b_] = True
    fmm = np.zeros((D, B, L), np.float32)
    fmm_ev = np.zeros((D, B, L), np.float32)
    fmm_q = np.zeros((D, B, L), np.float32)
    fmm_off = np.zeros((D, B, L), np.float32)
    dev_b = np.zeros((D, B))
    off_b = np.zeros((D, B))
    st_rb = np.zeros((D, B))
    st_rn = np.zeros((D, B))
    attn_full = np.zeros((D, L, Hkv, NW), np.float32)
    tiers = [] if record_tiers else None

    def _decode_loop():
        for s in range(D):
            pos = P + s
            rb0, rn0 = cache.recall_bytes.copy(), cache.recall_transfers.copy()
            token = argmax[s - 1] if free[pos] else int(tokens[pos])  # own prediction inside a span
            logits = model.decode_step(token, pos, cache).astype(np.float64)
            lp = logits - logits.max(-1, keepdims=True)
            lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
            p0 = np.exp(lp[0])
            kl[s] = (p0 * (lp[0] - lp)).sum(-1)
            tgt = int(tokens[pos + 1])
            nll[s] = -lp[:, tgt]
            am = logits.argmax(-1)
            argmax[s] = am
            top1[s] = am == am[0]
            correct[s] = am == tgt
            A = cache.win_attn[:, 0]  # (L, Hkv, NW) full-cache attention
            attn_full[s] = A
            unread_off = (cache.tier == OFFLOADED) & ~cache.loaded  # (B, L, Hkv, NW)
            notfull = (cache.tier != FULL) & ~cache.loaded  # windows not yet closed are FULL
            ev = (cache.tier == EVICTED) | unread_off
            fmm[s] = np.einsum("blhw,lhw->bl", notfull, A, optimize=True) / Hkv
            fmm_ev[s] = np.einsum("blhw,lhw->bl", ev, A, optimize=True) / Hkv
            fmm_q[s] = np.einsum("blhw,lhw->bl", cache.tier == QUANT, A, optimize=True) / Hkv
            fmm_off[s] = np.einsum("blhw,lhw->bl", unread_off, A, optimize=True) / Hkv
            nc_now = pos // W  # windows closed before this step's token (the open window holds it)
            for b in range(B):
                dev_b[s, b] = cache.device_bytes(b, nc_now)
                off_b[s, b] = cache.offdevice_bytes(b, nc_now)
            if record_tiers:
                tiers.append(cache.tier.copy())
            for b, p in enumerate(pols):
                p.observe(cache.win_attn[:, b])
                if p.uses_digest:
                    p.observe_estimate(cache.win_est[:, b])
            if (pos + 1) % W == 0 and s < D - 1:
                redecide((pos + 1) // W)
                n_redecide[0] += 1
            st_rb[s] = cache.recall_bytes - rb0
            st_rn[s] = cache.recall_transfers - rn0
            if verbose and (s + 1) % 32 == 0:
                ms = (time.perf_counter() - t1) / (s + 1) * 1e3
                print(f"  step {s + 1}/{D}: {ms:.0f} ms/step", flush=True)

    t1 = time.perf_counter()
    with _blas_threads(DECODE_BLAS_THREADS):
        _decode_loop()
    nc_end = (P + D) // W

    out = dict(
        streams=streams, kl=kl, nll=nll, top1=top1, correct=correct, fmm=fmm, fmm_evicted=fmm_ev,
        fmm_quantized=fmm_q, fmm_offloaded=fmm_off, device_bytes=dev_b, offdevice_bytes=off_b,
        step_recall_bytes=st_rb, step_recall_transfers=st_rn, recall_transfers=cache.recall_transfers.copy(),
        full_bytes_step=((P + np.arange(D)) // W + 1) * float(cache.F * L * Hkv),
        attn_full=attn_full, hot_bytes=np.array(hot, float), budget_bytes=np.array(budget, float),
        tier_bytes=[cache.tier_bytes(b, nc_end) for b in range(B)],
        recall_bytes=cache.recall_bytes.copy(), offload_bytes=cache.offload_bytes.copy(),
        promotions=cache.n_promotions.copy(), fits=np.array([p.fits for p in pols]),
        redecisions=n_redecide[0], argmax=argmax, free_run_spans=list(free_run_spans),
        full_bytes_end=float(nc_end * cache.F * L * Hkv), prefill_tokens=P, decode_tokens=D, window=W,
        seconds_prefill=t_prefill, seconds_decode=time.perf_counter() - t1,
    )
    if record_tiers:
        out["tiers"] = np.array(tiers)
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
