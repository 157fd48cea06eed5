"""A windowed KV cache for ``B`` streams decoded in lockstep (one per policy and budget).

Tokens are grouped into windows of ``window`` tokens.  For every stream, layer, KV head and
window the cache holds a tier:

* ``FULL`` (0): exact fp16 values,
* ``QUANT`` (1): KIVI-quantized values (the attention reads their dequantized values),
* ``EVICTED`` (2): gone; masked out of attention, never readable again.

The prompt (prefill) K/V is identical for every stream and is stored once (``Kp``), together
with its quantize-dequantized copy at each bit width in use (``Kq[bits]``, also shared: KIVI
quantization of a window is deterministic); tokens decoded afterwards differ between streams
(their hidden states differ) and are stored per stream, exact (``Kd``) and as read (``Kdh``).
The exact copies model the cold tier (host DRAM / SSD) from which a quantized window may be
recalled at full precision.  For every stream, layer, head and token the cache knows whether the
attention reads the exact or the dequantized value (``lossy``) and whether it is masked (evicted),
so the attention over the shared prompt is a few large matrix products for all streams at once.

Two ways to promote a quantized window back to ``FULL``:

* ``"dequant"``: dequantize in place (the QEvict paper's description).  The window is stored in
  fp16 again, but its values are the dequantized ones: the information lost by quantization stays
  lost (``lossy`` stays true).
* ``"recall"``: copy the exact window back from the cold tier (ArkVale-style); the bytes moved are
  counted in ``recall_bytes``.  Writing the exact copy of a window to the cold tier when it is
  first demoted is counted in ``offload_bytes``.

Offloading policies (issue 14: Quest-style page selection, ArkVale-style H2O / SnapKV with recall)
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

from .quant import full_window_bytes, quant_window_bytes, quantize_keys, quantize_values

FULL, QUANT, EVICTED, OFFLOADED = 0, 1, 2, 3
TIER_NAMES = {FULL: "full", QUANT: "quantized", EVICTED: "evicted", OFFLOADED: "offloaded"}
DIGEST_BYTES_PER_ELEM = 2  # fp16 min and max of each key channel of a window (Quest / ArkVale digest)


def digest_window_bytes(head_dim: int) -> int:
    """Bytes of one window's key digest (channel-wise min and max, fp16) for one KV head."""
    return 2 * head_dim * DIGEST_BYTES_PER_ELEM


class MultiStreamCache:
    def __init__(self, cfg, n_streams: int, prompt_k, prompt_v, max_tokens: int, window: int,
                 bits, group: int, record_attention: bool = True):
        """prompt_k/v: lists over layers of (Hkv, P, hd) arrays; P must be a multiple of ``window``.
        bits: per stream quantization bit width (0 for streams that never quantize)."""
        L, Hkv, hd = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim
        P = prompt_k[0].shape[1]
        if P % window:
            raise ValueError(f"prefill length {P} must be a multiple of the window size {window}")
        if max_tokens > cfg.context_length:
            raise ValueError(f"{max_tokens} tokens exceed the model context {cfg.context_length}")
        self.cfg, self.B, self.L, self.Hkv, self.hd, self.g = cfg, n_streams, L, Hkv, hd, cfg.group
        self.W, self.P, self.group = window, P, group
        self.Tmax = -(-max_tokens // window) * window
        self.NW = self.Tmax // window
        self.NWp = P // window
        self.Dmax = self.Tmax - P
        self.Kp = np.stack(prompt_k)  # (L, Hkv, P, hd) exact
        self.Vp = np.stack(prompt_v)
        self.Kq, self.Vq = {}, {}  # bits -> (L, Hkv, P, hd) dequantized prompt
        self.Kd = np.zeros((L, n_streams, Hkv, self.Dmax, hd), np.float32)  # decoded tokens, exact
        self.Vd = np.zeros_like(self.Kd)
        self.Kdh = np.zeros_like(self.Kd)  # decoded tokens as the attention reads them
        self.Vdh = np.zeros_like(self.Kd)
        self.bias = np.zeros((L, n_streams, Hkv, self.Tmax), np.float32)  # -inf: evicted
        self.lossy_tok = np.zeros((L, n_streams, Hkv, self.Tmax), bool)
        self.tier = np.zeros((n_streams, L, Hkv, self.NW), np.int8)
        self.lossy = np.zeros((n_streams, L, Hkv, self.NW), bool)
        self.in_cold = np.zeros((n_streams, L, Hkv, self.NW), bool)
        self.recall_bytes = np.zeros(n_streams, np.int64)
        self.offload_bytes = np.zeros(n_streams, np.int64)
        self.n_promotions = np.zeros(n_streams, np.int64)
        self.recall_transfers = np.zeros(n_streams, np.int64)  # window-heads moved back to the device
        self.F = full_window_bytes(window, hd)
        # --- digests and per-step page selection (offloading policies, issue 14)
        pk = self.Kp.reshape(L, Hkv, self.NWp, window, hd)
        self.pmin, self.pmax = pk.min(3), pk.max(3)  # (L, Hkv, NWp, hd)
        nwd = max(self.Dmax // window, 1)
        self.dmin = np.zeros((L, n_streams, Hkv, nwd, hd), np.float32)
        self.dmax = np.zeros_like(self.dmin)
        self.step_pages = np.full(n_streams, -1, np.int64)
        self.digest_rows = np.zeros(n_streams, bool)
        self.loaded = np.zeros((n_streams, L, Hkv, self.NW), bool)  # windows loaded this step
        self.win_est = np.zeros((L, n_streams, Hkv, self.NW), np.float32)
        self.set_bits(bits)
        self.length = P
        self.record_attention = record_attention
        self.win_attn = np.zeros((L, n_streams, Hkv, self.NW), np.float32)  # last step, mean over q heads

    def set_bits(self, bits):
        self.bits = np.broadcast_to(np.asarray(bits, dtype=int), (self.B,)).copy()
        self.Q = np.array([quant_window_bytes(self.W, self.hd, int(b), self.group) if b else 0
                           for b in self.bits])
        for b in set(int(x) for x in self.bits if x):
            if b not in self.Kq:
                shp = (self.L, self.Hkv, self.NWp, self.W, self.hd)
                self.Kq[b] = quantize_keys(self.Kp.reshape(shp), b, self.group).reshape(self.Kp.shape)
                self.Vq[b] = quantize_values(self.Vp.reshape(shp), b, self.group).reshape(self.Vp.shape)

    @property
    def n_streams(self):
        return self.B

    # -------------------------------------------------------------- forward-pass interface
    def append(self, layer: int, k: np.ndarray, v: np.ndarray, pos: int):
        if pos >= self.Tmax:
            raise ValueError(f"position {pos} beyond cache capacity {self.Tmax}")
        if pos < self.P:
            raise ValueError("decode positions start after the prefill")
        d = pos - self.P
        self.Kd[layer, :, :, d] = k
        self.Vd[layer, :, :, d] = v
        self.Kdh[layer, :, :, d] = k
        self.Vdh[layer, :, :, d] = v
        wd, r = divmod(d, self.W)
        if r == 0:
            self.dmin[layer, :, :, wd] = k
            self.dmax[layer, :, :, wd] = k
        else:
            np.minimum(self.dmin[layer, :, :, wd], k, out=self.dmin[layer, :, :, wd])
            np.maximum(self.dmax[layer, :, :, wd], k, out=self.dmax[layer, :, :, wd])
        if layer == self.L - 1:
            self.length = pos + 1

    def attend(self, layer: int, q: np.ndarray, pos: int) -> np.ndarray:
        """q: (B, H, hd), already scaled.  Returns (B, H, hd).

        Scores over the prompt are computed against the shared exact and dequantized prompt K
        (one matrix product per KV head for all streams), then each stream picks, token by token,
        the exact or the dequantized score; decoded tokens use each stream's own K."""
        t = pos + 1
        P, B, Hkv, g, hd = self.P, self.B, self.Hkv, self.g, self.hd
        td = t - P
        qh = q.reshape(B, Hkv, g, hd).transpose(1, 0, 2, 3).reshape(Hkv, B * g, hd)
        sc = np.empty((Hkv, B * g, t), np.float32)
        np.matmul(qh, self.Kp[layer].swapaxes(-1, -2), out=sc[:, :, :P])
        lossy = self.lossy_tok[layer, :, :, :P]  # (B, Hkv, P)
        sel = {}
        for b in self.Kq:
            rows = np.nonzero(self.bits == b)[0]
            if len(rows) == 0:
                continue
            lz = lossy[rows]  # (nb, Hkv, P)
            if not lz.any():
                continue
            qb = q.reshape(B, Hkv, g, hd)[rows].transpose(1, 0, 2, 3)  # (Hkv, nb, g, hd)
            sq = np.matmul(qb.reshape(Hkv, -1, hd), self.Kq[b][layer].swapaxes(-1, -2))
            sq = sq.reshape(Hkv, len(rows), g, P)
            full = sc[:, :, :P].reshape(Hkv, B, g, P)
            lzt = lz.transpose(1, 0, 2)[:, :, None, :]  # (Hkv, nb, 1, P)
            full[:, rows] = np.where(lzt, sq, full[:, rows])
            sel[b] = (rows, lzt)
        if td > 0:
            qd = q.reshape(B, Hkv, g, hd)
            sd = np.matmul(qd, self.Kdh[layer, :, :, :td].swapaxes(-1, -2))  # (B, Hkv, g, td)
            sc.reshape(Hkv, B, g, t)[..., P:] = sd.transpose(1, 0, 2, 3)
        s4 = sc.reshape(Hkv, B, g, t)
        bias = self.bias[layer, :, :, :t]
        if self.digest_rows.any() or (self.step_pages >= 0).any():
            bias = self._digest_step(layer, q, t, bias)
        s4 += bias.transpose(1, 0, 2)[:, :, None, :]
        s4 -= s4.max(-1, keepdims=True)
        np.exp(s4, out=s4)
        s4 /= s4.sum(-1, keepdims=True)
        if self.record_attention:
            a = s4.mean(2).transpose(1, 0, 2)  # (B, Hkv, t)
            nw = -(-t // self.W)
            self.win_attn[layer, :, :, :nw] = np.add.reduceat(a, np.arange(0, t, self.W), axis=-1)
            self.win_attn[layer, :, :, nw:] = 0
        pp = s4[..., :P]
        if sel:
            exact = pp.copy()
            out = np.zeros((Hkv, B, g, hd), np.float32)
            for b, (rows, lzt) in sel.items():
                pq = np.where(lzt, exact[:, rows], 0.0).astype(np.float32)
                exact[:, rows] = np.where(lzt, 0.0, exact[:, rows])
                pv = np.matmul(pq.reshape(Hkv, -1, P), self.Vq[b][layer])
                out[:, rows] += pv.reshape(Hkv, len(rows), g, hd)
            out += np.matmul(exact.reshape(Hkv, B * g, P), self.Vp[layer]).reshape(Hkv, B, g, hd)
        else:
            out = np.matmul(np.ascontiguousarray(pp).reshape(Hkv, B * g, P), self.Vp[layer]).reshape(
                Hkv, B, g, hd
            )
        out = out.transpose(1, 0, 2, 3)  # (B, Hkv, g, hd)
        if td > 0:
            pd = s4[..., P:].transpose(1, 0, 2, 3)  # (B, Hkv, g, td)
            out = out + np.matmul(pd, self.Vdh[layer, :, :, :td])
        return out.reshape(B, Hkv * g, hd)

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
        bp = np.matmul(qpt, self.pmax[layer, :, :k].swapaxes(-1, -2)) + np.matmul(
            qnt, self.pmin[layer, :, :k].swapaxes(-1, -2)
        )
        out[..., :k] = bp.reshape(Hkv, nb, g, k).transpose(1, 0, 2, 3)
        if nw > nwp:
            nd = nw - nwp
            dmx = self.dmax[layer, rows, :, :nd]  # (nb, Hkv, nd, hd)
            dmn = self.dmin[layer, rows, :, :nd]
            out[..., nwp:] = np.matmul(qp, dmx.swapaxes(-1, -2)) + np.matmul(qn, dmn.swapaxes(-1, -2))
        return out.max(2)

    def _digest_step(self, layer: int, q: np.ndarray, t: int, bias: np.ndarray) -> np.ndarray:
        """ArkVale-style window estimates (``win_est``) and Quest page selection: returns the
        attention bias (B, Hkv, t) with the windows loaded this step unmasked (a copy if changed)."""
        W, copied = self.W, False
        nw = -(-t // W)
        nc = t // W  # closed windows (the window holding token t-1 is open unless t % W == 0)
        rows = np.nonzero(self.digest_rows | (self.step_pages >= 0))[0]
        bound = self._bound(layer, q, rows, nw)  # (nb, Hkv, nw)
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
            if sel.any():  # the loaded windows are attended exactly this step
                if not copied:
                    bias, copied = bias.copy(), True
                tok = np.zeros((self.Hkv, t), bool)
                tok[:, : nc * W] = np.repeat(sel, W, axis=-1)
                bias[b][tok] = 0.0
        return bias

    # -------------------------------------------------------------- tiers
    def _hot_blocks(self, l, b, h, w):
        """Current (as read) K and V blocks (n, W, hd)."""
        n = len(l)
        Kh = np.empty((n, self.W, self.hd), np.float32)
        Vh = np.empty_like(Kh)
        pm = w < self.NWp
        if pm.any():
            bits = int(self.bits[b[pm][0]]) if self.bits[b[pm]].any() else 0
            Kp = self.Kp.reshape(self.L, self.Hkv, self.NWp, self.W, self.hd)
            Vp = self.Vp.reshape(self.L, self.Hkv, self.NWp, self.W, self.hd)
            Kh[pm] = Kp[l[pm], h[pm], w[pm]]
            Vh[pm] = Vp[l[pm], h[pm], w[pm]]
            lz = self.lossy[b[pm], l[pm], h[pm], w[pm]]
            if lz.any():
                Kq = self.Kq[bits].reshape(Kp.shape)
                Vq = self.Vq[bits].reshape(Vp.shape)
                idx = np.nonzero(pm)[0][lz]
                Kh[idx] = Kq[l[idx], h[idx], w[idx]]
                Vh[idx] = Vq[l[idx], h[idx], w[idx]]
        dm = ~pm
        if dm.any():
            nwd = self.Dmax // self.W
            Kd = self.Kdh.reshape(self.L, self.B, self.Hkv, nwd, self.W, self.hd)
            Vd = self.Vdh.reshape(self.L, self.B, self.Hkv, nwd, self.W, self.hd)
            Kh[dm] = Kd[l[dm], b[dm], h[dm], w[dm] - self.NWp]
            Vh[dm] = Vd[l[dm], b[dm], h[dm], w[dm] - self.NWp]
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
        return self.Kd[l, b, h, sl], self.Vd[l, b, h, sl]

    def _write_decoded(self, l, b, h, w, K, V):
        nwd = self.Dmax // self.W
        self.Kdh.reshape(self.L, self.B, self.Hkv, nwd, self.W, self.hd)[l, b, h, w - self.NWp] = K
        self.Vdh.reshape(self.L, self.B, self.Hkv, nwd, self.W, self.hd)[l, b, h, w - self.NWp] = V

    def _set_lossy(self, b, l, h, w, value: bool):
        self.lossy[b, l, h, w] = value
        lt = self.lossy_tok.reshape(self.L, self.B, self.Hkv, self.NW, self.W)
        lt[l, b, h, w] = value

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
                self._write_decoded(
                    ld,
                    bb,
                    hd_,
                    wd,
                    quantize_keys(Kh, bits, self.group),
                    quantize_values(Vh, bits, self.group),
                )
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
                    nwd = self.Dmax // self.W
                    K = self.Kd.reshape(self.L, self.B, self.Hkv, nwd, self.W, self.hd)[
                        ld, b, hd_, wd - self.NWp
                    ]
                    V = self.Vd.reshape(self.L, self.B, self.Hkv, nwd, self.W, self.hd)[
                        ld, b, hd_, wd - self.NWp
                    ]
                    self._write_decoded(ld, np.full(len(ld), b), hd_, wd, K, V)
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
            bias = self.bias.reshape(self.L, self.B, self.Hkv, self.NW, self.W)
            bias[l, b, h, w] = -np.inf
        self.tier[b] = new

    def _offload_moves(self, b: int, old: np.ndarray, new: np.ndarray):
        """Moves to and from the ``OFFLOADED`` tier: offloading writes the exact window off the
        device once (``offload_bytes``); a recall brings the exact window back (``recall_bytes``,
        ``recall_transfers``, ``n_promotions``)."""
        if np.any((old == OFFLOADED) & (new == QUANT)):
            raise ValueError("an offloaded window comes back at full precision (recall), not quantized")
        bias = self.bias.reshape(self.L, self.B, self.Hkv, self.NW, self.W)
        l, h, w = np.nonzero((old != OFFLOADED) & (old != EVICTED) & (new == OFFLOADED))
        if len(l):
            fresh = ~self.in_cold[b, l, h, w]
            self.offload_bytes[b] += int(fresh.sum()) * self.F
            self.in_cold[b, l, h, w] = True
            bias[l, b, h, w] = -np.inf
        l, h, w = np.nonzero((old == OFFLOADED) & (new == FULL))
        if len(l):
            dec = w >= self.NWp
            if dec.any():
                ld, hd_, wd = l[dec], h[dec], w[dec]
                nwd = self.Dmax // self.W
                K = self.Kd.reshape(self.L, self.B, self.Hkv, nwd, self.W, self.hd)[ld, b, hd_, wd - self.NWp]
                V = self.Vd.reshape(self.L, self.B, self.Hkv, nwd, self.W, self.hd)[ld, b, hd_, wd - self.NWp]
                self._write_decoded(ld, np.full(len(ld), b), hd_, wd, K, V)
            self._set_lossy(b, l, h, w, False)
            bias[l, b, h, w] = 0.0
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
        return (
            (t == FULL).sum(-1) * self.F + (t == QUANT).sum(-1) * self.Q[b] + (self.F if open_window else 0)
        )

    def tier_bytes(self, b: int, n_closed: int) -> dict:
        """Total bytes per tier for stream ``b`` (all layers and heads): full (device, the open
        window included), quantized (device), cold (exact copies of quantized windows kept
        off-device for recall), evicted (freed)."""
        t = self.tier[b][..., :n_closed]
        n_full = int((t == FULL).sum()) + self.L * self.Hkv  # + open window
        n_q = int((t == QUANT).sum())
        cold = int((self.in_cold[b][..., :n_closed] & (t == QUANT)).sum()) + int((t == OFFLOADED).sum())
        return dict(
            full=n_full * self.F,
            quantized=n_q * int(self.Q[b]),
            cold=cold * self.F,
            evicted=int((t == EVICTED).sum()) * self.F,
        )
