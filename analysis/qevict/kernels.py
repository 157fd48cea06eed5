"""Compiled kernel of chapter 4's decode engine (``MultiStreamCache``'s ``"fused"`` engine).

One decoding step's attention of every stream over the shared prompt cache, computing only what each
stream reads: for each KV head and window of prompt keys, every stream that reads the window (exactly,
or dequantized at its bit width) gets its scores, an online-softmax update and its value sum, in one
pass over the window's keys and values while they sit in the core's cache.  The numpy engine
(``"sparse"``) multiplies whole blocks of keys for every stream that reads any window of the block
and masks afterwards; its elementwise passes (max, shift, exp, window sums, masks) over
those blocks were most of a decoding step (docs/design.md).

Work is split into tasks of (KV head, chunk of streams; ``stream_chunk``); a task owns its streams'
softmax state and computes it in a fixed order, so the result does not depend on the number of
threads.  Keys are stored transposed per window (``hd x W``) so that the score loop runs over a
window's tokens in SIMD lanes without reassociating a sum; the value loop runs over the head
dimension.  float32 throughout; ``exp`` is Cephes' float32 polynomial (relative error below 1e-7,
and it vectorizes, which ``math.exp`` does not); products may be fused (``contract``), no sum is
reordered.

The kernel that runs is specialised to the shape (``_specialised``): the query group ``g``, the head
dimension and the window length are compile-time constants and a stream's scores (``g x W``) and its
output rows (``g x`` a tile of the head dimension) live in stack scratch (``_scratch``), so that LLVM
keeps them in vector registers across the loop over the head dimension (for the scores) or over a
window's tokens (for the values) instead of loading and storing them at every multiply-add; this needs
LLVM's SLP vectoriser, which numba leaves off by default (``NUMBA_SLP_VECTORIZE``) and which is switched
on for the specialised kernel's compilation only.  Twice as fast at SmolLM2's and 1.5x at Gemma's
decoding shapes (session 6, docs/design.md).  It performs the same operations in the same order as the
generic loops (``_prompt_attention``, kept as the reference the tests compare with bit for bit).
"""
from __future__ import annotations

import contextlib
import math
from functools import lru_cache

import numpy as np
from numba import get_num_threads, njit, prange, types
from numba.core import cgutils
from numba.core import config as _numba_config
from numba.core.errors import RequireLiteralValue
from numba.extending import intrinsic

STREAM_CHUNK = None  # streams per task: None = as many as balance the tasks over numba's threads


def stream_chunk(n_kv: int, n_streams: int, threads: int) -> int:
    """Streams per task when the tasks are split evenly over ``threads``: each KV head's streams in
    ``threads / gcd(n_kv, threads)`` chunks, so that there are lcm(n_kv, threads) tasks (6 for SmolLM2's
    3 KV heads on 2 threads, 2 for Gemma's 1); larger chunks reuse each window's keys and values from
    the core's cache for more streams.  Chunking does not change any result (a task owns its streams)."""
    nch = max(1, threads // math.gcd(n_kv, threads))
    return max(1, -(-n_streams // nch))


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


@intrinsic
def _scratch(typingctx, n):
    """``_scratch(n)``: a pointer to ``n`` (a compile-time constant) float32 of stack memory, allocated
    once at the entry of the compiled function, so that constant-index accesses can live in registers.
    A module-level intrinsic, so that numba's on-disk cache of the kernels that use it stays valid."""
    if not isinstance(n, types.IntegerLiteral):
        raise RequireLiteralValue(n)
    size = n.literal_value

    def codegen(context, builder, sig, args):
        ty = context.get_value_type(types.float32)
        return cgutils.alloca_once(builder, ty, size=context.get_constant(types.intp, size))
    return types.CPointer(types.float32)(n), codegen


@contextlib.contextmanager
def _slp_vectorize():
    """Compile with LLVM's SLP vectoriser (it packs the scratch's scalars into vectors); restores
    numba's setting afterwards, so other compiled code in the process is unaffected."""
    before = _numba_config.SLP_VECTORIZE
    _numba_config.SLP_VECTORIZE = 1
    try:
        yield
    finally:
        _numba_config.SLP_VECTORIZE = before


@lru_cache(maxsize=None)
def _specialised(G: int, HD: int, WW: int):
    """``_prompt_attention`` for query group ``G``, head dimension ``HD`` and window ``WW`` known at
    compile time: the same loops in the same order, with the scores and a tile of ``DT`` output columns
    of the head dimension in stack scratch."""
    DT = math.gcd(HD, 64)  # output columns per tile: G x 64 floats stay within the vector registers
    NDT = HD // DT
    SN, AN = G * WW, G * DT

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def kernel(Q, KT, VV, code, m, den, acc, ws, wsh, chunk):  # pragma: no cover - compiled
        Hkv, B = Q.shape[0], Q.shape[1]
        NWp = KT.shape[2]
        nch = (B + chunk - 1) // chunk
        for task in prange(Hkv * nch):
            h = task // nch
            b0 = (task % nch) * chunk
            b1 = min(B, b0 + chunk)
            s = _scratch(SN)
            a = _scratch(AN)
            for b in range(b0, b1):
                for r in range(G):
                    m[h, b, r] = -np.inf
                    den[h, b, r] = 0.0
                    for d in range(HD):
                        acc[h, b, r, d] = 0.0
                    for w in range(NWp):
                        ws[h, b, r, w] = 0.0
                        wsh[h, b, r, w] = -np.inf
            for w in range(NWp):
                for b in range(b0, b1):
                    p = code[h, b, w]
                    if p < 0:
                        continue
                    for i in range(G * WW):
                        s[i] = 0.0
                    for d in range(HD):
                        for r in range(G):
                            qd = Q[h, b, r, d]
                            for t in range(WW):
                                s[r * WW + t] += qd * KT[p, h, w, d, t]
                    for r in range(G):
                        mx = s[r * WW]
                        for t in range(1, WW):
                            mx = max(mx, s[r * WW + t])
                        mo = m[h, b, r]
                        mn = max(mx, mo)
                        for t in range(WW):
                            s[r * WW + t] = expneg(s[r * WW + t] - mn)
                        tot = np.float32(0.0)
                        for t in range(WW):
                            tot += s[r * WW + t]
                        alpha = expneg(mo - mn) if mo > -np.inf else np.float32(0.0)
                        den[h, b, r] = den[h, b, r] * alpha + tot
                        m[h, b, r] = mn
                        ws[h, b, r, w] = tot
                        wsh[h, b, r, w] = mn
                        for d in range(HD):
                            acc[h, b, r, d] = acc[h, b, r, d] * alpha
                    for k in range(NDT):
                        d0 = k * DT
                        for r in range(G):
                            for d in range(DT):
                                a[r * DT + d] = acc[h, b, r, d0 + d]
                        for t in range(WW):
                            for r in range(G):
                                pt = s[r * WW + t]
                                for d in range(DT):
                                    a[r * DT + d] += pt * VV[p, h, w, t, d0 + d]
                        for r in range(G):
                            for d in range(DT):
                                acc[h, b, r, d0 + d] = a[r * DT + d]

    return kernel


def prompt_attention(Q, KT, VV, code, m, den, acc, ws, wsh, chunk: int | None = STREAM_CHUNK, *,
                     specialised: bool = True):
    """Q (Hkv, B, g, hd) float32 queries (scaled); KT (nprec, Hkv, NWp, hd, W) keys per precision,
    transposed per window; VV (nprec, Hkv, NWp, W, hd) values; code (Hkv, B, NWp) int8: the precision a
    stream reads the window at (0 exact, k the k-th bit width), -1 not read.  Writes, per (KV head,
    stream, query row): ``m`` the running maximum, ``den`` the softmax denominator and ``acc`` (.., hd)
    the unnormalised output, both relative to ``m``; ``ws`` (.., NWp) each window's sum of
    exp(score - wsh) and ``wsh`` that shift (-inf where the window is not read, so that
    ws * exp(wsh - m) is 0 there).  A row that reads no window keeps m = -inf, den = 0.
    ``specialised=False`` runs the generic loops (the same arithmetic in the same order; slower)."""
    Hkv, B, g, hd = Q.shape
    nprec, _, NWp, _, W = KT.shape
    if VV.shape != (nprec, Hkv, NWp, W, hd) or code.shape != (Hkv, B, NWp):
        raise ValueError(f"shapes do not match: Q {Q.shape}, KT {KT.shape}, VV {VV.shape}, code {code.shape}")
    if code.size and int(code.max()) >= nprec:
        raise ValueError(f"precision index {int(code.max())} but only {nprec} precisions stored")
    if not specialised:  # the generic loops: the reference of the tests
        chunk = 8 if chunk is None else chunk
        _prompt_attention(Q, KT, VV, code, m, den, acc, ws, wsh, chunk)
        return
    if chunk is None:
        chunk = stream_chunk(Hkv, B, get_num_threads())
    kernel = _specialised(g, hd, W)
    with _slp_vectorize():  # takes effect when this call compiles (or loads from numba's cache)
        kernel(Q, KT, VV, code, m, den, acc, ws, wsh, chunk)
