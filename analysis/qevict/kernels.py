"""Compiled kernel of chapter 4's decode engine (``MultiStreamCache``'s ``"fused"`` engine, issue 13).

One decoding step's attention of every stream over the shared prompt cache, computing only what each
stream reads: for each KV head and window of prompt keys, every stream that reads the window (exactly,
or dequantized at its bit width) gets its scores, an online-softmax update and its value sum, in one
pass over the window's keys and values while they sit in the core's cache.  The numpy engines
(``"sparse"``, ``"blocked"``) multiply whole blocks of keys for every stream that reads any window of
the block and mask afterwards; their elementwise passes (max, shift, exp, window sums, masks) over
those blocks were most of a decoding step (docs/design.md).

Work is split into tasks of (KV head, chunk of ``STREAM_CHUNK`` streams); a task owns its streams'
softmax state and computes it in a fixed order, so the result does not depend on the number of
threads.  Keys are stored transposed per window (``hd x W``) so that the score loop runs over a
window's tokens in SIMD lanes without reassociating a sum; the value loop runs over the head
dimension.  float32 throughout; ``exp`` is Cephes' float32 polynomial (relative error below 1e-7,
and it vectorizes, which ``math.exp`` does not); products may be fused (``contract``), no sum is
reordered.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

STREAM_CHUNK = 8  # streams per task: >= 7 tasks per KV head for two cores, each key window reused 8x


@njit(inline="always", fastmath={"contract"}, cache=True)
def expneg(x):  # pragma: no cover - compiled
    """float32 exp(x) for x <= 0 (Cephes expf: Cody-Waite reduction, degree-6 polynomial, 2^n from the
    bits of n by exact multiplications); 0 below -87, where float32 exp leaves the normal range."""
    xc = max(x, np.float32(-87.0))
    fx = np.floor(xc * np.float32(1.44269504088896341) + np.float32(0.5))
    r = xc - fx * np.float32(0.693359375) - fx * np.float32(-2.12194440e-4)
    y = ((((np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)) * r
           + np.float32(8.3334519073e-3)) * r + np.float32(4.1665795894e-2)) * r
         + np.float32(1.6666665459e-1)) * r + np.float32(5.0000001201e-1)
    y = y * (r * r) + r + np.float32(1.0)
    k = np.int32(-fx)
    p = np.float32(1.0)
    if k & 1:
        p *= np.float32(0.5)
    if k & 2:
        p *= np.float32(0.25)
    if k & 4:
        p *= np.float32(0.0625)
    if k & 8:
        p *= np.float32(0.00390625)
    if k & 16:
        p *= np.float32(1.52587890625e-05)
    if k & 32:
        p *= np.float32(2.3283064365386963e-10)
    if k & 64:
        p *= np.float32(5.421010862427522e-20)
    return y * p if x > np.float32(-87.0) else np.float32(0.0)


@njit(fastmath={"contract"}, cache=True)
def exp_array(x):  # pragma: no cover - compiled
    """``expneg`` over a float32 array (for the tests against numpy's exp)."""
    out = np.empty_like(x)
    for i in range(x.size):
        out.flat[i] = expneg(x.flat[i])
    return out


@njit(parallel=True, cache=True, fastmath={"contract"})
def _prompt_attention(Q, KT, VV, code, m, den, acc, ws, wsh, chunk):  # pragma: no cover - compiled
    Hkv, B, g, hd = Q.shape
    NWp, W = KT.shape[2], KT.shape[4]
    nch = (B + chunk - 1) // chunk
    for task in prange(Hkv * nch):
        h = task // nch
        b0 = (task % nch) * chunk
        b1 = min(B, b0 + chunk)
        s = np.empty((g, W), np.float32)  # one stream's scores, then weights, for one window
        a = np.empty((g, hd), np.float32)  # its output rows while a window's values are added
        for b in range(b0, b1):
            for r in range(g):
                m[h, b, r] = -np.inf
                den[h, b, r] = 0.0
                for d in range(hd):
                    acc[h, b, r, d] = 0.0
                for w in range(NWp):
                    ws[h, b, r, w] = 0.0
                    wsh[h, b, r, w] = -np.inf
        for w in range(NWp):  # window-major: the window's keys and values stay in cache
            for b in range(b0, b1):
                p = code[h, b, w]
                if p < 0:
                    continue
                s[:] = 0.0
                for d in range(hd):
                    for r in range(g):
                        qd = Q[h, b, r, d]
                        for t in range(W):
                            s[r, t] += qd * KT[p, h, w, d, t]
                for r in range(g):
                    mx = s[r, 0]
                    for t in range(1, W):
                        mx = max(mx, s[r, t])
                    mo = m[h, b, r]
                    mn = max(mx, mo)
                    for t in range(W):
                        s[r, t] = expneg(s[r, t] - mn)
                    tot = np.float32(0.0)
                    for t in range(W):
                        tot += s[r, t]
                    alpha = expneg(mo - mn) if mo > -np.inf else np.float32(0.0)
                    den[h, b, r] = den[h, b, r] * alpha + tot
                    m[h, b, r] = mn
                    ws[h, b, r, w] = tot
                    wsh[h, b, r, w] = mn
                    for d in range(hd):
                        a[r, d] = acc[h, b, r, d] * alpha
                for t in range(W):
                    for r in range(g):
                        pt = s[r, t]
                        for d in range(hd):
                            a[r, d] += pt * VV[p, h, w, t, d]
                for r in range(g):
                    for d in range(hd):
                        acc[h, b, r, d] = a[r, d]


def prompt_attention(Q, KT, VV, code, m, den, acc, ws, wsh, chunk: int = STREAM_CHUNK):
    """Q (Hkv, B, g, hd) float32 queries (scaled); KT (nprec, Hkv, NWp, hd, W) keys per precision,
    transposed per window; VV (nprec, Hkv, NWp, W, hd) values; code (Hkv, B, NWp) int8: the precision a
    stream reads the window at (0 exact, k the k-th bit width), -1 not read.  Writes, per (KV head,
    stream, query row): ``m`` the running maximum, ``den`` the softmax denominator and ``acc`` (.., hd)
    the unnormalised output, both relative to ``m``; ``ws`` (.., NWp) each window's sum of
    exp(score - wsh) and ``wsh`` that shift (-inf where the window is not read, so that
    ws * exp(wsh - m) is 0 there).  A row that reads no window keeps m = -inf, den = 0."""
    Hkv, B, g, hd = Q.shape
    nprec, _, NWp, _, W = KT.shape
    if VV.shape != (nprec, Hkv, NWp, W, hd) or code.shape != (Hkv, B, NWp):
        raise ValueError(f"shapes do not match: Q {Q.shape}, KT {KT.shape}, VV {VV.shape}, code {code.shape}")
    if code.size and int(code.max()) >= nprec:
        raise ValueError(f"precision index {int(code.max())} but only {nprec} precisions stored")
    _prompt_attention(Q, KT, VV, code, m, den, acc, ws, wsh, chunk)
