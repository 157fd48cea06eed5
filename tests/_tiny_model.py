"""Tiny random-weight models of chapter 4's two architectures, for logic and property tests.

They are built through the real classes (:class:`analysis.qevict.gguf_model.LlamaModel`,
:class:`analysis.qevict.gemma_model.Gemma3Model`) and their config dataclasses, with seeded random
weights in the layout ``from_gguf`` produces (transposed, Q/K/V and gate/up fused): the same forward
passes, caches and policies run, only on a few narrow layers and a small vocabulary.  The head
dimension is SmolLM2's and Gemma's own (64, 256) and the query-group sizes are kept (>1), so window and
byte arithmetic has the real shapes per head.  Queries and keys are drawn a little wider than the
residual stream so that attention is peaked (scores of a few units), as a trained model's is.

Real weights are kept for the few checks that are about the weights (tests marked ``real_weights``).
"""
from __future__ import annotations

import os
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from analysis.qevict.gemma_model import Gemma3Config, Gemma3Model
from analysis.qevict.gguf_model import LlamaConfig, LlamaModel
from analysis.qevict.tokenizer import load_tokenizer

TINY_VOCAB = 512


def _w(rng, n_in, n_out, scale=1.0):
    """(n_in, n_out) float32, so that unit-RMS rows map to outputs of RMS ``scale``."""
    return (rng.standard_normal((n_in, n_out)) * (scale / np.sqrt(n_in))).astype(np.float32)


def _norm(rng, n):
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


@lru_cache(maxsize=4)
def tiny_llama(seed: int = 0, n_layers: int = 4) -> LlamaModel:
    """A Llama of SmolLM2's head layout (head_dim 64, 3 KV heads, 2 queries per KV head), 4 layers."""
    cfg = LlamaConfig(n_layers=n_layers, d_model=384, d_ff=512, n_heads=6, n_kv_heads=3, head_dim=64,
                      vocab_size=TINY_VOCAB, context_length=4096, rope_base=10000.0, rms_eps=1e-5)
    rng = np.random.default_rng(seed)
    D, kvd = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    layers = []
    for _ in range(n_layers):
        wq, wk, wv = _w(rng, D, D, 1.5), _w(rng, D, kvd, 1.5), _w(rng, D, kvd)
        layers.append(dict(
            attn_norm=_norm(rng, D), ffn_norm=_norm(rng, D),
            wqkv=np.ascontiguousarray(np.concatenate([wq, wk, wv], 1)),
            wo=_w(rng, D, D, 0.5),
            w13=np.ascontiguousarray(np.concatenate([_w(rng, D, cfg.d_ff), _w(rng, D, cfg.d_ff)], 1)),
            w2=_w(rng, cfg.d_ff, D, 0.5)))
    tok_emb = rng.standard_normal((cfg.vocab_size, D)).astype(np.float32) * np.float32(0.2)
    return LlamaModel(cfg, dict(tok_emb=tok_emb, out_norm=_norm(rng, D), layers=layers))


@lru_cache(maxsize=4)
def tiny_gemma(seed: int = 0, rope_layout: str = "neox") -> Gemma3Model:
    """A Gemma 3 of Gemma 270M's head layout (4 query heads on 1 KV head of dimension 256, QK-norm,
    post-norms), 5 layers of which 2 global (1 and 4) and 3 local with a 32-token sliding window."""
    cfg = Gemma3Config(n_layers=5, d_model=256, d_ff=384, n_heads=4, n_kv_heads=1, head_dim=256,
                       vocab_size=TINY_VOCAB, context_length=4096, rope_base=1e6, rope_base_local=1e4,
                       sliding_window=32, rms_eps=1e-6, global_layers=(1, 4), query_scale=256 ** -0.5)
    rng = np.random.default_rng(seed)
    D, hd = cfg.d_model, cfg.head_dim
    layers = []
    for _ in range(cfg.n_layers):
        wq = _w(rng, D, cfg.n_heads * hd)
        wk, wv = _w(rng, D, cfg.n_kv_heads * hd), _w(rng, D, cfg.n_kv_heads * hd)
        layers.append(dict(
            attn_norm=_norm(rng, D), post_attn_norm=_norm(rng, D) * np.float32(0.5),
            ffn_norm=_norm(rng, D), post_ffw_norm=_norm(rng, D) * np.float32(0.5),
            q_norm=_norm(rng, hd) * np.float32(2.0), k_norm=_norm(rng, hd) * np.float32(2.0),
            wqkv=np.ascontiguousarray(np.concatenate([wq, wk, wv], 1)),
            wo=_w(rng, cfg.n_heads * hd, D),
            w13=np.ascontiguousarray(np.concatenate([_w(rng, D, cfg.d_ff), _w(rng, D, cfg.d_ff)], 1)),
            w2=_w(rng, cfg.d_ff, D)))
    tok_emb = rng.standard_normal((cfg.vocab_size, D)).astype(np.float32) * np.float32(0.05)
    return Gemma3Model(cfg, dict(tok_emb=tok_emb, out_norm=_norm(rng, D), layers=layers),
                       rope_layout=rope_layout)


def tiny_tokens(n: int, seed: int = 0, vocab: int = TINY_VOCAB) -> np.ndarray:
    """``n`` token ids with some repetition (a text-like document for the tiny vocabulary): a seeded
    random walk over a few recurring phrases, so that attention has something to find again."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, vocab, rng.integers(3, 9)) for _ in range(24)]
    out = []
    while len(out) < n:
        out.extend(phrases[int(rng.integers(len(phrases)))] if rng.random() < 0.7
                   else rng.integers(0, vocab, 2))
    return np.asarray(out[:n], dtype=np.int64)


class TinyTokenizer:
    """The real SmolLM2 tokenizer with its ids folded into the tiny vocabulary (``id % TINY_VOCAB``):
    chapter 4's documents (code, prose, needles) can be built for a tiny model; decoding reads the
    folded ids as the real tokenizer's (the text is nonsense, the shapes are real)."""

    def __init__(self, real):
        self._real = real

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._real.encode(text), np.int64) % TINY_VOCAB

    def decode(self, ids) -> str:
        return self._real.decode(ids)

    def token_to_str(self, i: int) -> str:
        return self._real.token_to_str(int(i))


def longrun_loader(model: str):
    """(tiny model, folded tokenizer) for a long run's ``model`` name: the loader the long-run driver's
    tests inject (:mod:`analysis.qevict.longrun_units`,
    ``KVBOOK_LONGRUN_LOADER=tests._tiny_model:longrun_loader``), in the test process and in Dask
    worker processes alike.  With ``KVBOOK_TEST_MARKERS`` set to a folder, each load (one per unit)
    writes ``started-<pid>-<ns>`` there and, if ``KVBOOK_TEST_HOLD`` is set, waits until a file
    ``release`` appears (at most 120 s): a test can kill the process mid-unit."""
    marks = os.environ.get("KVBOOK_TEST_MARKERS")
    if marks:
        d = Path(marks)
        name = f"started-{os.getpid()}-{time.monotonic_ns()}"
        (d / f".{name}").write_text(str(os.getpid()))
        (d / f".{name}").rename(d / name)  # atomic: a reader never sees an empty marker
        t0 = time.time()
        while os.environ.get("KVBOOK_TEST_HOLD") and not (d / "release").exists() and time.time() - t0 < 120:
            time.sleep(0.05)
    m = {"smollm2": tiny_llama, "gemma3-270m": tiny_gemma}.get(model)
    if m is None:
        raise ValueError(f"unknown model {model!r}")
    return (m(n_layers=2) if model == "smollm2" else m()), TinyTokenizer(load_tokenizer())
