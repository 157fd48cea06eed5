"""A windowed KV cache for ``B`` streams decoded in lockstep (one per policy and budget).

Tokens are grouped into windows of ``window`` tokens.  For every stream, layer, KV head and
window the cache holds a tier:

* ``FULL`` (0): exact fp16 values,
* ``QUANT`` (1): KIVI-quantized values (the attention reads their dequantized values),
* ``EVICTED`` (2): gone; masked out of attention, never readable again.

**Shared tensors.** The prompt (prefill) K/V is identical for every stream and is stored once
(``Kp``), together with its quantize-dequantized copy at each bit width in use (``Kq[bits]``,
also shared: KIVI quantization of a window is deterministic).  Tokens decoded afterwards differ
between streams (their hidden states differ) and are stored per stream, exact (``Kd``) and as
read (``Kdh``).  The exact copies model the cold tier (host DRAM / SSD) from which a quantized
window may be recalled at full precision.

**The decode engines** (:meth:`MultiStreamCache.attend`, chosen by ``engine``) all read each
distinct prompt tensor once per step instead of once per stream, and put the prompt's scores and
each stream's own decoded tokens through one online (running-maximum) softmax per query row, so
memory stays bounded however long the context:

* ``"fused"`` (the default): the compiled kernel :func:`analysis.qevict.kernels.prompt_attention`
  walks the prompt window by window and, per KV head, computes scores, softmax update and value
  sum only for the streams that read that window, at the precision they read it (exact, or one
  bit width's dequantized copy); the keys are stacked transposed per window (``_fused_tensors``).
  A second pass of the same kernel covers each stream's complete decoded windows, with the stream's
  own keys and values as its "precision" (``_decoded_windows``; keys kept transposed per window in
  ``KdhT``), merged into the same softmax state; only the open window goes through numpy.
* ``"sparse"``: per block of ``block`` prompt keys, one GEMM of the streams that read some of its
  windows exactly against the shared exact keys and one GEMM per bit width of that bit width's
  streams against its dequantized keys, with ``-inf`` on the windows a row does not read.

Streams are kept internally sorted by bit width so that each bit width's rows are one contiguous
slice (no copies).

Bytes read per step: about (1 + number of bit widths) x the prompt cache, plus each stream's own
decoded tokens (which cannot be shared; :meth:`_attend_decoded`: all of them in the sparse engine,
the open window in the fused one).  ``"reference"`` (:meth:`attend_reference`) is an independent
per-stream implementation (slow) that the tests compare both engines against.

Two ways to promote a quantized window back to ``FULL``:

* ``"dequant"``: dequantize in place (the QEvict paper's description).  The window is stored in
  fp16 again, but its values are the dequantized ones: the information lost by quantization stays
  lost (``lossy`` stays true).
* ``"recall"``: copy the exact window back from the cold tier (ArkVale-style); the bytes moved are
  counted in ``recall_bytes``.  Writing the exact copy of a window to the cold tier when it is
  first demoted is counted in ``offload_bytes``.

Offloading policies (Quest-style page selection, ArkVale-style H2O / SnapKV with recall)
use a fourth tier, ``OFFLOADED`` (3): the exact window lives off the device (masked out of the
attention like an evicted one) and may come back to ``FULL`` by a recall (counted in
``recall_bytes`` and ``recall_transfers``).  These policies rank windows by a *digest* kept on the
device, the channel-wise min and max of each window's keys (Quest's page metadata, ArkVale's
bounding box): for a query q the largest logit any key of the window can give is
``relu(q) . kmax + min(q, 0) . kmin``.  ``step_pages`` (per stream, -1: off) makes a stream load,
at every decoding step and for every layer and KV head, the ``step_pages`` offloaded windows with the
largest bound (max over the query heads of the KV head) and attend to them exactly (Quest); the
windows loaded at the previous step stay on the device, so only the newly selected ones are moved.
``digest_rows`` makes the cache estimate, for those streams, each window's attention share as the
softmax over windows of (bound + log tokens in the window) (``win_est``).
"""
from __future__ import annotations

import numpy as np

from .kernels import prompt_attention
from .quant import full_window_bytes, quant_window_bytes, quantize_keys, quantize_values

FULL, QUANT, EVICTED, OFFLOADED = 0, 1, 2, 3
TIER_NAMES = {FULL: "full", QUANT: "quantized", EVICTED: "evicted", OFFLOADED: "offloaded"}
DIGEST_BYTES_PER_ELEM = 2  # fp16 min and max of each key channel of a window (Quest / ArkVale digest)


DECODED_KERNEL_MAX_STREAMS = 127  # fused engine: decoded windows in the kernel, stream index as int8 code


def _softmax_rescale(m: np.ndarray, S: np.ndarray):
    """One online-softmax update of the numpy engines: the new running maximum ``mn`` of ``m`` and the
    scores ``S`` (.., n), the finite shift the block is exponentiated with (0 where every score is
    -inf) and ``alpha`` = exp(m - shift), the factor of the state so far; ``S`` becomes exp(S - shift)
    in place."""
    mn = np.maximum(m, S.max(-1))
    shift = np.where(np.isfinite(mn), mn, np.float32(0))
    alpha = np.exp(m - shift)
    S -= shift[..., None]
    np.exp(S, out=S)
    return mn, shift, alpha


def digest_window_bytes(head_dim: int) -> int:
    """Bytes of one window's key digest (channel-wise min and max, fp16) for one KV head."""
    return 2 * head_dim * DIGEST_BYTES_PER_ELEM
SCORE_BLOCK_BYTES = 1 << 21  # target size of one block of scores (all streams, one layer)
SPARSE_BLOCK = 512  # keys per block of the "sparse" engine: smaller blocks skip more streams
ENGINES = ("fused", "sparse", "reference")


class MultiStreamCache:
    def __init__(self, cfg, n_streams: int, prompt_k, prompt_v, max_tokens: int, window: int,
                 bits, group: int, record_attention: bool = True, engine: str = "fused",
                 block: int | None = None):
        """prompt_k/v: lists over layers of (Hkv, P, hd) arrays; P must be a multiple of ``window``.
        bits: per stream quantization bit width (0 for streams that never quantize).
        engine: "fused" (compiled: each stream's scores, softmax and values computed only on the
        windows it reads, one pass over each shared window of keys; ``kernels.prompt_attention``),
        "sparse" (shared-tensor GEMMs over key blocks, each only for the streams that read
        the block at that precision, online softmax) or "reference" (one stream at a time, for tests).
        block: keys per block (default: ~2 MiB of scores, at most SPARSE_BLOCK tokens for "sparse")."""
        L, Hkv, hd = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim
        P = prompt_k[0].shape[1]
        if P % window:
            raise ValueError(f"prefill length {P} must be a multiple of the window size {window}")
        if max_tokens > cfg.context_length:
            raise ValueError(f"{max_tokens} tokens exceed the model context {cfg.context_length}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        self.cfg, self.B, self.L, self.Hkv, self.hd, self.g = cfg, n_streams, L, Hkv, hd, cfg.group
        self.W, self.P, self.group, self.engine = window, P, group, engine
        self.Tmax = -(-max_tokens // window) * window
        self.NW = self.Tmax // window
        self.NWp = P // window
        self.Dmax = self.Tmax - P
        if block is None:
            block = SCORE_BLOCK_BYTES // (4 * Hkv * n_streams * self.g)
            if engine == "sparse":
                block = min(block, SPARSE_BLOCK)
        self.block = max(window, int(block) // window * window)
        self.Kp = np.stack(prompt_k).astype(np.float32, copy=False)  # (L, Hkv, P, hd) exact
        self.Vp = np.stack(prompt_v).astype(np.float32, copy=False)
        self.Kq, self.Vq = {}, {}  # bits -> (L, Hkv, P, hd) dequantized prompt
        # per-stream arrays in the *internal* order (streams sorted by bit width): index self.pos[b]
        self.Kd = np.zeros((L, n_streams, Hkv, self.Dmax, hd), np.float32)  # decoded tokens, exact
        self.Vd = np.zeros_like(self.Kd)
        self.Kdh = np.zeros_like(self.Kd)  # decoded tokens as the attention reads them
        self.Vdh = np.zeros_like(self.Kd)
        # the fused engine's copy of Kdh transposed per window (hd x W, like the prompt's keys), for the
        # compiled kernel over each stream's complete decoded windows (_decoded_windows); written when a
        # window completes (one block copy, not a strided write per token) and when a window is rewritten
        self.KdhT = (np.zeros((L, n_streams, Hkv, self.Dmax // window, hd, window), np.float32)
                     if engine == "fused" else None)
        self.bias = np.zeros((L, Hkv, n_streams, self.Tmax), np.float32)  # -inf: evicted
        self.lossy_tok = np.zeros((L, Hkv, n_streams, self.Tmax), bool)
        self._ev_w = np.zeros((L, Hkv, n_streams, self.NW), bool)
        self._lz_w = np.zeros((L, Hkv, n_streams, self.NW), bool)
        # per-stream bookkeeping in the caller's (external) order
        self.tier = np.zeros((n_streams, L, Hkv, self.NW), np.int8)
        self.lossy = np.zeros((n_streams, L, Hkv, self.NW), bool)
        self.in_cold = np.zeros((n_streams, L, Hkv, self.NW), bool)
        self.recall_bytes = np.zeros(n_streams, np.int64)
        self.offload_bytes = np.zeros(n_streams, np.int64)
        self.n_promotions = np.zeros(n_streams, np.int64)
        self.recall_transfers = np.zeros(n_streams, np.int64)  # window-heads moved back to the device
        self.F = full_window_bytes(window, hd)
        # --- digests and per-step page selection (offloading policies)
        pk = self.Kp.reshape(L, Hkv, self.NWp, window, hd)
        self.pmin, self.pmax = pk.min(3), pk.max(3)  # (L, Hkv, NWp, hd)
        nwd = max(self.Dmax // window, 1)
        self.dmin = np.zeros((L, n_streams, Hkv, nwd, hd), np.float32)  # internal stream order
        self.dmax = np.zeros_like(self.dmin)
        self.step_pages = np.full(n_streams, -1, np.int64)
        self.digest_rows = np.zeros(n_streams, bool)
        self.loaded = np.zeros((n_streams, L, Hkv, self.NW), bool)  # windows loaded this step
        self.win_est = np.zeros((L, n_streams, Hkv, self.NW), np.float32)
        self.length = P
        self.set_bits(bits)
        self.record_attention = record_attention
        self.win_attn = np.zeros((L, n_streams, Hkv, self.NW), np.float32)  # last step, mean over q heads

    def set_bits(self, bits):
        bits = np.broadcast_to(np.asarray(bits, dtype=int), (self.B,)).copy()
        order = np.argsort(bits, kind="stable")  # internal row i holds external stream order[i]
        if hasattr(self, "order") and not np.array_equal(order, self.order) and (
                self.length > self.P or np.any(self.tier != FULL)):
            raise ValueError("set_bits must be called before any decoding or tier change")
        self.bits, self.order = bits, order
        self.pos = np.empty(self.B, int)
        self.pos[order] = np.arange(self.B)  # external b -> internal row
        sb = bits[order]
        self.groups = [(int(b), int(np.searchsorted(sb, b)), int(np.searchsorted(sb, b, "right")))
                       for b in sorted(set(int(x) for x in bits if x))]
        self.Q = np.array([quant_window_bytes(self.W, self.hd, int(b), self.group) if b else 0
                           for b in self.bits])
        for b, _, _ in self.groups:
            if b not in self.Kq:
                shp = (self.L, self.Hkv, self.NWp, self.W, self.hd)
                self.Kq[b] = quantize_keys(self.Kp.reshape(shp), b, self.group).reshape(self.Kp.shape)
                self.Vq[b] = quantize_values(self.Vp.reshape(shp), b, self.group).reshape(self.Vp.shape)

    @property
    def n_streams(self):
        return self.B

    # -------------------------------------------------------------- forward-pass interface
    def append(self, layer: int, k: np.ndarray, v: np.ndarray, pos: int):
        """k, v: (B, Hkv, hd) in the caller's stream order."""
        if pos >= self.Tmax:
            raise ValueError(f"position {pos} beyond cache capacity {self.Tmax}")
        if pos < self.P:
            raise ValueError("decode positions start after the prefill")
        d = pos - self.P
        k, v = k[self.order], v[self.order]
        self.Kd[layer, :, :, d] = k
        self.Vd[layer, :, :, d] = v
        self.Kdh[layer, :, :, d] = k
        self.Vdh[layer, :, :, d] = v
        wd, r = divmod(d, self.W)
        if self.KdhT is not None and r == self.W - 1:  # a decoded window is complete: its transposed copy
            self.KdhT[layer, :, :, wd] = self.Kdh[layer, :, :, d + 1 - self.W:d + 1].swapaxes(-1, -2)
        if r == 0:
            self.dmin[layer, :, :, wd] = k
            self.dmax[layer, :, :, wd] = k
        else:
            np.minimum(self.dmin[layer, :, :, wd], k, out=self.dmin[layer, :, :, wd])
            np.maximum(self.dmax[layer, :, :, wd], k, out=self.dmax[layer, :, :, wd])
        if layer == self.L - 1:
            self.length = pos + 1

    def attend(self, layer: int, q: np.ndarray, pos: int) -> np.ndarray:
        """q: (B, H, hd), already scaled, in the caller's stream order.  Returns (B, H, hd)."""
        t = pos + 1
        bias = self.bias[layer]  # (Hkv, B internal, Tmax)
        restore = None
        if self.digest_rows.any() or (self.step_pages >= 0).any():
            restore = self._digest_step(layer, q, t)  # Quest: this step's loaded windows unmasked
        try:
            if self.engine == "reference":
                return self.attend_reference(layer, q, pos, bias)
            if self.engine == "fused":
                return self._attend_fused(layer, q, pos, bias)
            return self._attend_sparse(layer, q, pos, bias)
        finally:
            if restore is not None:  # the loaded windows are masked again after the step
                self.bias.reshape(self.L, self.Hkv, self.B, self.NW, self.W)[layer][restore] = -np.inf

    def _attend_sparse(self, layer: int, q: np.ndarray, pos: int, bias: np.ndarray) -> np.ndarray:
        """The shared-tensor GEMMs, each only for the streams that read the key block at that
        precision: per block of ``block`` prompt keys, one GEMM of the streams holding at least one
        of its windows exact (unmasked and not lossy) against the shared exact keys, and per bit width
        one GEMM of that bit width's streams holding at least one of its windows dequantized against
        its dequantized keys; each stream's own decoded tokens last.  Every GEMM's scores go through
        one online (running-maximum) softmax per query row, so rows skipped for a block cost nothing
        and a row's exact and dequantized parts of the same block are two updates of the same sum."""
        t = pos + 1
        P, B, Hkv, g, hd, W, NWp = self.P, self.B, self.Hkv, self.g, self.hd, self.W, self.NWp
        td = t - P
        qi = q[self.order].reshape(B, Hkv, g, hd)
        Q4 = np.ascontiguousarray(qi.transpose(1, 0, 2, 3))  # (Hkv, B, g, hd)
        m = np.full((Hkv, B, g), -np.inf, np.float32)
        den = np.zeros((Hkv, B, g), np.float32)
        acc = np.zeros((Hkv, B, g, hd), np.float32)
        rec = self.record_attention
        win = np.zeros((Hkv, B, g, self.NW), np.float32) if rec else None
        parts = []  # (rows or None, first window, window sums (Hkv, nr, g, nw), shift (Hkv, nr, g))
        masked_w = np.isneginf(bias[:, :, 0:P:W])  # (Hkv, B, NWp): evicted, or offloaded and not loaded
        lz_w = self._lz_w[layer, :, :, :NWp]
        exact_w = ~masked_w & ~lz_w
        quant_w = ~masked_w & lz_w
        starts = np.arange(0, NWp, self.block // W)
        need_e = np.logical_or.reduceat(exact_w, starts, axis=-1).any(0)  # (B, n blocks)
        need_q = np.logical_or.reduceat(quant_w, starts, axis=-1).any(0)
        mask_e = masked_w | lz_w  # windows a stream does not read exactly
        neg = np.float32(-np.inf)

        def update(rows, S, V, w0):
            """One block of scores S (Hkv, nr, g, n) of rows ``rows`` (None: all) against values V."""
            sel = slice(None) if rows is None else rows
            mo = m[:, sel]
            mn, shift, alpha = _softmax_rescale(mo, S)
            nr, n = S.shape[1], S.shape[-1]
            if rec:  # window sums first: the row sums are their sums
                ws = S.reshape(Hkv, nr, g, n // W, W).sum(-1)
                parts.append((rows, w0, ws, shift))
                den[:, sel] = den[:, sel] * alpha + ws.sum(-1)
            else:
                den[:, sel] = den[:, sel] * alpha + S.sum(-1)
            o = np.matmul(S.reshape(Hkv, nr * g, n), V).reshape(Hkv, nr, g, hd)
            acc[:, sel] = acc[:, sel] * alpha[..., None] + o
            m[:, sel] = mn

        for j, w0 in enumerate(starts):
            s = int(w0) * W
            e = min(P, s + self.block)
            w1 = e // W
            rows = np.flatnonzero(need_e[:, j])
            if len(rows):
                all_rows = len(rows) == B
                Qr = Q4 if all_rows else Q4[:, rows]
                S = np.matmul(Qr.reshape(Hkv, -1, hd), self.Kp[layer, :, s:e].swapaxes(-1, -2))
                S = S.reshape(Hkv, len(rows), g, e - s)
                mw = mask_e[:, :, w0:w1] if all_rows else mask_e[:, rows, w0:w1]
                if mw.any():  # -inf on the windows these rows do not read exactly
                    bw = np.where(mw, neg, np.float32(0))
                    S += np.repeat(bw, W, axis=-1)[:, :, None]
                update(None if all_rows else rows, S, self.Vp[layer, :, s:e], int(w0))
            for b, r0, r1 in self.groups:
                rows = r0 + np.flatnonzero(need_q[r0:r1, j])
                if not len(rows):
                    continue
                S = np.matmul(Q4[:, rows].reshape(Hkv, -1, hd), self.Kq[b][layer, :, s:e].swapaxes(-1, -2))
                S = S.reshape(Hkv, len(rows), g, e - s)
                mw = ~quant_w[:, rows, w0:w1]
                if mw.any():
                    bw = np.where(mw, neg, np.float32(0))
                    S += np.repeat(bw, W, axis=-1)[:, :, None]
                update(rows, S, self.Vq[b][layer, :, s:e], int(w0))
        if td > 0:  # each stream's own decoded tokens
            m, den, acc, wd = self._attend_decoded(layer, qi, bias, t, m, den, acc, rec)
            if rec:
                win[..., NWp:NWp + wd.shape[-1]] = wd
        out = (acc / den[..., None]).transpose(1, 0, 2, 3)  # (B internal, Hkv, g, hd)
        if rec:
            for rows, w0, ws, shift in parts:
                sel = slice(None) if rows is None else rows
                f = np.exp(shift - m[:, sel]) / den[:, sel]
                win[:, sel, :, w0:w0 + ws.shape[-1]] += ws * f[..., None]
            wa = win.mean(2).transpose(1, 0, 2)  # (B internal, Hkv, NW)
            self.win_attn[layer] = wa[self.pos]
        return out[self.pos].reshape(B, Hkv * g, hd)

    def _attend_decoded(self, layer: int, qi: np.ndarray, bias: np.ndarray, t: int, m, den, acc, rec: bool,
                        d0: int = 0):
        """Each stream's own decoded tokens (positions ``P + d0`` to ``t - 1``; ``d0`` a multiple of the
        window) through the running softmax state ``m``, ``den`` (Hkv, B, g) and ``acc`` (Hkv, B, g, hd)
        left by the parts before (the sparse engine: all decoded tokens; the fused engine: the open
        window).  ``qi``: (B internal, Hkv, g, hd).  Returns the updated (m, den, acc) and, with
        ``rec``, these windows' final attention shares (Hkv, B, g, windows), else None."""
        P, B, Hkv, g, W, NWp = self.P, self.B, self.Hkv, self.g, self.W, self.NWp
        td = t - P
        Sd = np.matmul(qi, self.Kdh[layer, :, :, d0:td].swapaxes(-1, -2))  # (B, Hkv, g, td - d0)
        S = np.ascontiguousarray(Sd.transpose(1, 0, 2, 3))  # (Hkv, B, g, td - d0)
        if self._ev_w[layer, :, :, NWp + d0 // W:].any() or np.isneginf(bias[:, :, P + d0:t]).any():
            S += bias[:, :, None, P + d0:t]
        mn, shift, alpha = _softmax_rescale(m, S)
        den = den * alpha + S.sum(-1)
        o = np.matmul(S.transpose(1, 0, 2, 3), self.Vdh[layer, :, :, d0:td])  # (B, Hkv, g, hd)
        acc = acc * alpha[..., None] + o.transpose(1, 0, 2, 3)
        wd = None
        if rec:
            n = td - d0
            nd = -(-n // W)
            ws = np.add.reduceat(S, np.arange(0, n, W), axis=-1) if n % W else \
                S.reshape(Hkv, B, g, nd, W).sum(-1)
            wd = ws * (np.exp(shift - mn) / den)[..., None]
        return mn, den, acc, wd

    def _fused_tensors(self):
        """The prompt's keys (transposed per window) and values at every precision the streams read,
        stacked for the compiled kernel: (L, 1 + bit widths, Hkv, NWp, hd, W) and (.., W, hd); and each
        internal row's precision index when it reads a lossy window (0: it never quantizes)."""
        key = tuple(b for b, _, _ in self.groups)
        if getattr(self, "_fused_key", None) != key:
            L, Hkv, NWp, W, hd = self.L, self.Hkv, self.NWp, self.W, self.hd
            Ks = [self.Kp] + [self.Kq[b] for b in key]
            Vs = [self.Vp] + [self.Vq[b] for b in key]
            self._KT = np.ascontiguousarray(np.stack(Ks, 1).reshape(L, len(Ks), Hkv, NWp, W, hd)
                                            .transpose(0, 1, 2, 3, 5, 4))
            self._VV = np.stack(Vs, 1).reshape(L, len(Vs), Hkv, NWp, W, hd)
            self._row_prec = np.zeros(self.B, np.int8)
            for k, (_, r0, r1) in enumerate(self.groups):
                self._row_prec[r0:r1] = k + 1
            self._fused_key = key
        return self._KT, self._VV, self._row_prec

    def _attend_fused(self, layer: int, q: np.ndarray, pos: int, bias: np.ndarray) -> np.ndarray:
        """Prompt attention in the compiled kernel (only the windows each stream reads, at the precision
        it reads them), then each stream's own decoded tokens in numpy, through the same softmax state."""
        t = pos + 1
        P, B, Hkv, g, hd, W, NWp = self.P, self.B, self.Hkv, self.g, self.hd, self.W, self.NWp
        td = t - P
        KT, VV, row_prec = self._fused_tensors()
        qi = q[self.order].reshape(B, Hkv, g, hd)
        Q4 = np.ascontiguousarray(qi.transpose(1, 0, 2, 3), dtype=np.float32)  # (Hkv, B, g, hd)
        masked_w = np.isneginf(bias[:, :, 0:P:W])  # (Hkv, B, NWp): evicted, or offloaded and not loaded
        code = np.where(self._lz_w[layer, :, :, :NWp], row_prec[None, :, None], np.int8(0))
        code[masked_w] = -1
        m = np.empty((Hkv, B, g), np.float32)
        den = np.empty_like(m)
        acc = np.empty((Hkv, B, g, hd), np.float32)
        ws = np.empty((Hkv, B, g, NWp), np.float32)
        wsh = np.empty_like(ws)
        prompt_attention(Q4, KT[layer], VV[layer], code, m, den, acc, ws, wsh)
        rec = self.record_attention
        wd, nf = None, 0
        if td > 0:  # each stream's own decoded tokens: complete windows in the kernel, the open one here
            nf = td // W if B <= DECODED_KERNEL_MAX_STREAMS else 0
            if nf:
                m, den, acc, dws, dwsh = self._decoded_windows(layer, Q4, bias, nf, m, den, acc)
            if td > nf * W:
                m, den, acc, wd = self._attend_decoded(layer, qi, bias, t, m, den, acc, rec, d0=nf * W)
        out = (acc / den[..., None]).transpose(1, 0, 2, 3)  # (B internal, Hkv, g, hd)
        if rec:
            win = np.zeros((Hkv, B, g, self.NW), np.float32)
            win[..., :NWp] = ws * (np.exp(wsh - m[..., None]) / den[..., None])
            if nf:
                win[..., NWp:NWp + nf] = dws * (np.exp(dwsh - m[..., None]) / den[..., None])
            if wd is not None:
                win[..., NWp + nf:NWp + nf + wd.shape[-1]] = wd
            self.win_attn[layer] = win.mean(2).transpose(1, 0, 2)[self.pos]
        return out[self.pos].reshape(B, Hkv * g, hd)

    def _decoded_windows(self, layer: int, Q4: np.ndarray, bias: np.ndarray, nf: int, m, den, acc):
        """Every stream's complete decoded windows (0 to ``nf - 1``) in the compiled kernel, as a
        second pass with stream ``b``'s own keys and values as its "precision" (code b; -1 where the
        window is masked: evicted, or offloaded and not loaded), merged into the prompt part's softmax
        state (m, den, acc).  Returns the merged state and the windows' sums ``dws`` with their shifts
        ``dwsh`` (Hkv, B, g, nf), as the kernel defines them."""
        P, B, Hkv, g, hd, W = self.P, self.B, self.Hkv, self.g, self.hd, self.W
        # every decoded window's slot is passed (contiguous arrays: the kernel's loops vectorize only
        # over unit strides); the windows from nf on are not read (code -1)
        KT = self.KdhT[layer]  # (B, Hkv, NWd, hd, W)
        VV = self._dec_view(self.Vdh)[layer]  # (B, Hkv, NWd, W, hd)
        code = np.full((Hkv, B, KT.shape[2]), -1, np.int8)
        code[:, :, :nf] = np.arange(B, dtype=np.int8)[None, :, None]
        code[:, :, :nf][np.isneginf(bias[:, :, P:P + nf * W:W])] = -1
        m2 = np.empty((Hkv, B, g), np.float32)
        den2 = np.empty_like(m2)
        acc2 = np.empty((Hkv, B, g, hd), np.float32)
        ws2 = np.empty((Hkv, B, g, KT.shape[2]), np.float32)
        wsh2 = np.empty_like(ws2)
        prompt_attention(Q4, KT, VV, code, m2, den2, acc2, ws2, wsh2)
        dws, dwsh = ws2[..., :nf], wsh2[..., :nf]
        mn = np.maximum(m, m2)
        shift = np.where(np.isfinite(mn), mn, np.float32(0))
        f1, f2 = np.exp(m - shift), np.exp(m2 - shift)  # 0 for a part that read nothing (m = -inf)
        return mn, den * f1 + den2 * f2, acc * f1[..., None] + acc2 * f2[..., None], dws, dwsh

    def read_all(self, b: int, layer: int, t: int, bias: np.ndarray | None = None):
        """K, V (Hkv, t, hd) as stream ``b`` reads them and its mask (Hkv, t) (0 or -inf); ``bias``:
        the layer's mask (Hkv, B internal, >= t) to use instead of the stored one."""
        ib = self.pos[b]
        P = self.P
        K = np.empty((self.Hkv, t, self.hd), np.float32)
        V = np.empty_like(K)
        K[:, :P], V[:, :P] = self.Kp[layer], self.Vp[layer]
        bits = int(self.bits[b])
        if bits:
            lz = self.lossy_tok[layer, :, ib, :P, None]
            K[:, :P] = np.where(lz, self.Kq[bits][layer], K[:, :P])
            V[:, :P] = np.where(lz, self.Vq[bits][layer], V[:, :P])
        K[:, P:] = self.Kdh[layer, ib, :, : t - P]
        V[:, P:] = self.Vdh[layer, ib, :, : t - P]
        bias = self.bias[layer] if bias is None else bias
        return K, V, bias[:, ib, :t]

    def attend_reference(self, layer: int, q: np.ndarray, pos: int,
                         bias: np.ndarray | None = None) -> np.ndarray:
        """The same attention, one stream and one KV head at a time, two-pass softmax (``bias``: the
        mask :meth:`attend` computed for this step, with Quest's loaded windows unmasked)."""
        t = pos + 1
        g, W = self.g, self.W
        out = np.empty((self.B, self.Hkv * g, self.hd), np.float32)
        for b in range(self.B):
            K, V, mask = self.read_all(b, layer, t, bias)
            for h in range(self.Hkv):
                s = q[b, h * g:(h + 1) * g] @ K[h].T + mask[h]
                p = np.exp(s - s.max(-1, keepdims=True))
                p /= p.sum(-1, keepdims=True)
                out[b, h * g:(h + 1) * g] = p @ V[h]
                if self.record_attention:
                    nw = -(-t // W)
                    self.win_attn[layer, b, h, :nw] = np.add.reduceat(p.mean(0), np.arange(0, t, W))
                    self.win_attn[layer, b, h, nw:] = 0
        return out

    def _bound(self, layer: int, q: np.ndarray, rows: np.ndarray, nw: int) -> np.ndarray:
        """Upper bound of the logit of any key of each window ``< nw`` for the queries of streams
        ``rows``: (nb, Hkv, nw), max over the query heads of each KV head."""
        Hkv, g, hd, nwp = self.Hkv, self.g, self.hd, self.NWp
        qr = q.reshape(self.B, Hkv, g, hd)[rows]  # (nb, Hkv, g, hd)
        qp = np.maximum(qr, 0)
        qn = qr - qp
        nb = len(rows)
        out = np.empty((nb, Hkv, g, nw), np.float32)
        k = min(nw, nwp)
        qpt = qp.transpose(1, 0, 2, 3).reshape(Hkv, nb * g, hd)
        qnt = qn.transpose(1, 0, 2, 3).reshape(Hkv, nb * g, hd)
        bp = (np.matmul(qpt, self.pmax[layer, :, :k].swapaxes(-1, -2))
              + np.matmul(qnt, self.pmin[layer, :, :k].swapaxes(-1, -2)))
        out[..., :k] = bp.reshape(Hkv, nb, g, k).transpose(1, 0, 2, 3)
        if nw > nwp:
            nd = nw - nwp
            dmx = self.dmax[layer, self.pos[rows], :, :nd]  # (nb, Hkv, nd, hd)
            dmn = self.dmin[layer, self.pos[rows], :, :nd]
            out[..., nwp:] = np.matmul(qp, dmx.swapaxes(-1, -2)) + np.matmul(qn, dmn.swapaxes(-1, -2))
        return out.max(2)

    def _digest_step(self, layer: int, q: np.ndarray, t: int):
        """ArkVale-style window estimates (``win_est``) and Quest page selection: unmasks, in place in
        the layer's stored mask, the windows loaded this step and returns their index
        (Hkv, B internal, window) arrays for :meth:`attend` to mask them again after the step (None if
        none).  ``q`` and the bookkeeping (``tier``, ``loaded``, ``win_est``) are in the caller's
        stream order."""
        W = self.W
        nw = -(-t // W)
        nc = t // W  # closed windows (the window holding token t-1 is open unless t % W == 0)
        rows = np.nonzero(self.digest_rows | (self.step_pages >= 0))[0]
        bound = self._bound(layer, q, rows, nw)  # (nb, Hkv, nw)
        hs, bs, ws = [], [], []
        for j, b in enumerate(rows):
            if self.digest_rows[b]:
                ntok = np.full(nw, float(W))
                ntok[-1] = t - (nw - 1) * W
                z = bound[j] + np.log(ntok)
                z -= z.max(-1, keepdims=True)
                e = np.exp(z)
                self.win_est[layer, b, :, :nw] = e / e.sum(-1, keepdims=True)
                self.win_est[layer, b, :, nw:] = 0
            k = int(self.step_pages[b])
            if k < 0:
                continue
            off = self.tier[b, layer, :, :nc] == OFFLOADED  # (Hkv, nc)
            pr = np.where(off, bound[j, :, :nc], -np.inf)
            if k > 0 and off.any():
                order = np.argsort(-pr, axis=-1, kind="stable")[:, :k]
                sel = np.zeros_like(off)
                np.put_along_axis(sel, order, True, axis=-1)
                sel &= off
            else:
                sel = np.zeros_like(off)
            prev = self.loaded[b, layer, :, :nc]
            new = sel & ~prev
            n_new = int(new.sum())
            if n_new:
                self.recall_transfers[b] += n_new
                self.recall_bytes[b] += n_new * self.F
            self.loaded[b, layer, :, :nc] = sel
            self.loaded[b, layer, :, nc:] = False
            h, w = np.nonzero(sel)  # the loaded windows are attended exactly this step
            hs.append(h)
            ws.append(w)
            bs.append(np.full(len(h), self.pos[b]))
        if not hs or not sum(len(h) for h in hs):
            return None
        idx = np.concatenate(hs), np.concatenate(bs), np.concatenate(ws)
        self.bias.reshape(self.L, self.Hkv, self.B, self.NW, W)[layer][idx] = 0.0
        return idx

    # -------------------------------------------------------------- tiers
    def _dec_view(self, X):
        return X.reshape(self.L, self.B, self.Hkv, self.Dmax // self.W, self.W, self.hd)

    def _hot_blocks(self, l, b, h, w):
        """Current (as read) K and V blocks (n, W, hd) of windows (l, b, h, w), b external."""
        n = len(l)
        Kh = np.empty((n, self.W, self.hd), np.float32)
        Vh = np.empty_like(Kh)
        pm = w < self.NWp
        if pm.any():
            Kp = self.Kp.reshape(self.L, self.Hkv, self.NWp, self.W, self.hd)
            Vp = self.Vp.reshape(self.L, self.Hkv, self.NWp, self.W, self.hd)
            Kh[pm] = Kp[l[pm], h[pm], w[pm]]
            Vh[pm] = Vp[l[pm], h[pm], w[pm]]
            lz = self.lossy[b[pm], l[pm], h[pm], w[pm]]
            for bits in set(int(x) for x in self.bits[b[pm][lz]]):
                idx = np.nonzero(pm)[0][lz]
                idx = idx[self.bits[b[idx]] == bits]
                Kq = self.Kq[bits].reshape(Kp.shape)
                Vq = self.Vq[bits].reshape(Vp.shape)
                Kh[idx] = Kq[l[idx], h[idx], w[idx]]
                Vh[idx] = Vq[l[idx], h[idx], w[idx]]
        dm = ~pm
        if dm.any():
            ib = self.pos[b[dm]]
            Kh[dm] = self._dec_view(self.Kdh)[l[dm], ib, h[dm], w[dm] - self.NWp]
            Vh[dm] = self._dec_view(self.Vdh)[l[dm], ib, h[dm], w[dm] - self.NWp]
        return Kh, Vh

    def read_window(self, b: int, l: int, h: int, w: int):
        """K, V of one window (W, hd) as the attention of stream ``b`` reads it (for tests)."""
        a = np.array([l]), np.array([b]), np.array([h]), np.array([w])
        K, V = self._hot_blocks(*a)
        return K[0], V[0]

    def exact_window(self, b: int, l: int, h: int, w: int):
        """Exact (full-precision) K, V of one window (W, hd)."""
        if w < self.NWp:
            sl = slice(w * self.W, (w + 1) * self.W)
            return self.Kp[l, h, sl], self.Vp[l, h, sl]
        sl = slice((w - self.NWp) * self.W, (w - self.NWp + 1) * self.W)
        ib = self.pos[b]
        return self.Kd[l, ib, h, sl], self.Vd[l, ib, h, sl]

    def _write_decoded(self, l, b, h, w, K, V):
        ib = self.pos[b]
        self._dec_view(self.Kdh)[l, ib, h, w - self.NWp] = K
        self._dec_view(self.Vdh)[l, ib, h, w - self.NWp] = V
        if self.KdhT is not None:
            self.KdhT[l, ib, h, w - self.NWp] = np.swapaxes(K, -1, -2)

    def _set_lossy(self, b, l, h, w, value: bool):
        self.lossy[b, l, h, w] = value
        ib = self.pos[b]
        self.lossy_tok.reshape(self.L, self.Hkv, self.B, self.NW, self.W)[l, h, ib, w] = value
        self._lz_w[l, h, ib, w] = value

    def set_tiers(self, b: int, new: np.ndarray, promote: str = "recall"):
        """Move stream ``b`` to tiers ``new`` (L, Hkv, NW).

        Evicted windows cannot come back; a quantized window may be promoted with ``promote``
        ("recall" or "dequant"); promotion is an error for ``promote="none"``."""
        old = self.tier[b]
        if new.shape != old.shape:
            raise ValueError(f"tier array shape {new.shape} != {old.shape}")
        if np.any((old == EVICTED) & (new != EVICTED)):
            raise ValueError("an evicted window cannot be brought back")
        # demotions full -> quant
        l, h, w = np.nonzero((old == FULL) & (new == QUANT))
        if len(l):
            bits = int(self.bits[b])
            if bits <= 0:
                raise ValueError(f"stream {b} has no quantization bit width")
            dec = w >= self.NWp
            if dec.any():  # decoded windows: quantize the values as currently read
                ld, hd_, wd = l[dec], h[dec], w[dec]
                bb = np.full(len(ld), b)
                Kh, Vh = self._hot_blocks(ld, bb, hd_, wd)
                self._write_decoded(ld, b, hd_, wd, quantize_keys(Kh, bits, self.group),
                                    quantize_values(Vh, bits, self.group))
            # prompt windows read the shared dequantized copy (quantization is idempotent, so a
            # window dequantized in place and quantized again reads the same values)
            if promote == "recall":  # keep the exact copy in the cold tier
                fresh = ~self.in_cold[b, l, h, w]
                self.offload_bytes[b] += int(fresh.sum()) * self.F
                self.in_cold[b, l, h, w] = True
            self._set_lossy(b, l, h, w, True)
        # promotions quant -> full
        l, h, w = np.nonzero((old == QUANT) & (new == FULL))
        if len(l):
            if promote == "recall":
                dec = w >= self.NWp
                if dec.any():
                    ld, hd_, wd = l[dec], h[dec], w[dec]
                    ib = self.pos[b]
                    K = self._dec_view(self.Kd)[ld, ib, hd_, wd - self.NWp]
                    V = self._dec_view(self.Vd)[ld, ib, hd_, wd - self.NWp]
                    self._write_decoded(ld, b, hd_, wd, K, V)
                self._set_lossy(b, l, h, w, False)
                self.recall_bytes[b] += len(l) * self.F
                self.recall_transfers[b] += len(l)
            elif promote == "dequant":
                pass  # stays lossy: the dequantized values are now stored in fp16
            else:
                raise ValueError(f"promotion of quantized windows not allowed (promote={promote!r})")
            self.n_promotions[b] += len(l)
        self._offload_moves(b, old, new)
        # evictions
        l, h, w = np.nonzero((old != EVICTED) & (new == EVICTED))
        if len(l):
            ib = self.pos[b]
            self.bias.reshape(self.L, self.Hkv, self.B, self.NW, self.W)[l, h, ib, w] = -np.inf
            self._ev_w[l, h, ib, w] = True
        self.tier[b] = new

    def _offload_moves(self, b: int, old: np.ndarray, new: np.ndarray):
        """Moves to and from the ``OFFLOADED`` tier: offloading writes the exact window off the
        device once (``offload_bytes``); a recall brings the exact window back (``recall_bytes``,
        ``recall_transfers``, ``n_promotions``)."""
        if np.any((old == OFFLOADED) & (new == QUANT)):
            raise ValueError("an offloaded window comes back at full precision (recall), not quantized")
        bias = self.bias.reshape(self.L, self.Hkv, self.B, self.NW, self.W)
        ib = self.pos[b]
        l, h, w = np.nonzero((old != OFFLOADED) & (old != EVICTED) & (new == OFFLOADED))
        if len(l):
            fresh = ~self.in_cold[b, l, h, w]
            self.offload_bytes[b] += int(fresh.sum()) * self.F
            self.in_cold[b, l, h, w] = True
            bias[l, h, ib, w] = -np.inf
            self._ev_w[l, h, ib, w] = True
        l, h, w = np.nonzero((old == OFFLOADED) & (new == FULL))
        if len(l):
            dec = w >= self.NWp
            if dec.any():
                ld, hd_, wd = l[dec], h[dec], w[dec]
                K = self._dec_view(self.Kd)[ld, ib, hd_, wd - self.NWp]
                V = self._dec_view(self.Vd)[ld, ib, hd_, wd - self.NWp]
                self._write_decoded(ld, b, hd_, wd, K, V)
            self._set_lossy(b, l, h, w, False)
            bias[l, h, ib, w] = 0.0
            self._ev_w[l, h, ib, w] = False
            self.recall_bytes[b] += len(l) * self.F
            self.recall_transfers[b] += len(l)
            self.n_promotions[b] += len(l)

    def device_bytes(self, b: int, n_closed: int) -> int:
        """Bytes stream ``b`` holds on the device now (all layers and heads): full and quantized
        windows, the open window, the windows loaded this step (Quest) and the key digests of the
        closed windows (streams with digests)."""
        t = self.tier[b][..., :n_closed]
        n = int((t == FULL).sum()) + self.L * self.Hkv
        loaded = int((self.loaded[b][..., :n_closed] & (t == OFFLOADED)).sum())
        dig = self.L * self.Hkv * n_closed * digest_window_bytes(self.hd) if self.uses_digest(b) else 0
        return (n + loaded) * self.F + int((t == QUANT).sum()) * int(self.Q[b]) + dig

    def offdevice_bytes(self, b: int, n_closed: int) -> int:
        """Bytes stream ``b`` keeps off the device (exact copies it may recall): quantized windows
        with a cold copy, and offloaded windows."""
        t = self.tier[b][..., :n_closed]
        cold = self.in_cold[b][..., :n_closed]
        return int(((cold & (t == QUANT)) | (t == OFFLOADED)).sum()) * self.F

    def uses_digest(self, b: int) -> bool:
        return bool(self.digest_rows[b] or self.step_pages[b] >= 0)

    def hot_bytes(self, b: int, n_closed: int, open_window: bool = True) -> np.ndarray:
        """Bytes held on the device by stream ``b`` per (layer, KV head), counting the closed
        windows ``< n_closed`` by tier and the open window as a full window."""
        t = self.tier[b][..., :n_closed]
        return ((t == FULL).sum(-1) * self.F + (t == QUANT).sum(-1) * self.Q[b]
                + (self.F if open_window else 0))

    def tier_bytes(self, b: int, n_closed: int) -> dict:
        """Total bytes per tier for stream ``b`` (all layers and heads): full (device, the open
        window included), quantized (device), cold (exact copies of quantized windows kept
        off-device for recall), evicted (freed)."""
        t = self.tier[b][..., :n_closed]
        n_full = int((t == FULL).sum()) + self.L * self.Hkv  # + open window
        n_q = int((t == QUANT).sum())
        cold = int((self.in_cold[b][..., :n_closed] & (t == QUANT)).sum()) + int((t == OFFLOADED).sum())
        return dict(full=n_full * self.F, quantized=n_q * int(self.Q[b]), cold=cold * self.F,
                    evicted=int((t == EVICTED).sum()) * self.F)
