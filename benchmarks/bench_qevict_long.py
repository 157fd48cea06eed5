"""Chapter 4 at long context: decode and prefill speed against this machine's limits.

    python benchmarks/bench_qevict_long.py decode  [--prefill 7168] [--decode 1024]
    python benchmarks/bench_qevict_long.py prefill [--tokens 8192]
    python benchmarks/bench_qevict_long.py gemma   [--tokens 32768]

* ``decode``: one document, all 10 policies x 4 budgets (41 lockstep streams) on SmolLM2, one shared
  prefill with capture, then the decoding steps; target: 8,192 context tokens (SmolLM2's whole
  context: 7,168 + 1,024) in <= 10 min on 2 cores.  Reports the time per decoding step against the
  bytes a step must read (the shared prompt K/V once, plus one dequantized copy per bit width, each
  stream's own decoded K/V, and the float32 weights) divided by the measured memory read bandwidth.
* ``prefill``: the numpy forward with attention capture against the same-shape matrix products
  (``bench_qevict_forward.matmul_reference``); target >= 50% at 8K.
* ``gemma``: Gemma 3 270M prefill with capture (the global layers' attention reduced on the fly),
  its wall time (target <= 10 min at 32K) and peak resident memory (bounded: blocks of queries).

Timings depend on the load from other processes: every line prints the load average.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def load():
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"


def read_bandwidth(n_bytes: int = 1 << 29, repeat: int = 5) -> float:
    """Bytes per second of a streaming float32 read (np.sum over an array larger than the caches)."""
    x = np.ones(n_bytes // 4, np.float32)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return n_bytes / best


def step_bytes(cfg, n_weights: int, P: int, t_dec: float, n_streams: int, n_bitwidths: int) -> float:
    """Bytes one decoding step must read at float32: prompt K and V once and once per bit width,
    every stream's decoded K and V (``t_dec`` tokens on average), all weights once."""
    kv_tok = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4
    return kv_tok * (P * (1 + n_bitwidths) + n_streams * t_dec) + 4 * n_weights


def n_weights(model) -> int:
    return int(model.tok_emb.size + sum(sum(w.size for w in lw.values()) for lw in model.layers))


def bench_decode(a):
    from analysis.qevict import corpora
    from analysis.qevict.gguf_model import load_model
    from analysis.qevict.policies import POLICIES, PolicyConfig
    from analysis.qevict.runner import run_document
    from analysis.qevict.tokenizer import load_tokenizer

    model, tok = load_model(), load_tokenizer()
    doc = corpora.load_document(corpora.LONG_DOCUMENTS["code"], tok, a.prefill + a.decode + 1)
    bw = read_bandwidth()
    print(f"memory read bandwidth {bw / 1e9:.1f} GB/s   ({load()})", flush=True)
    t0 = time.perf_counter()
    r = run_document(model, doc.tokens, a.prefill, a.decode, POLICIES, [0.10, 0.20, 0.35, 0.50],
                     PolicyConfig(), verbose=True)
    wall = time.perf_counter() - t0
    B, D = len(r["streams"]), a.decode
    per = r["seconds_decode"] / D
    by = step_bytes(model.cfg, n_weights(model), a.prefill, (D + 1) / 2, B, 2)
    print(f"{a.prefill:,} prefill + {D:,} decode, {B} streams: total {wall:.0f} s (target <= 600 s at "
          f"7,168 + 1,024); prefill {r['seconds_prefill']:.0f} s   ({load()})")
    print(f"decode {per * 1e3:.0f} ms/step; bytes per step {by / 1e9:.2f} GB -> at {bw / 1e9:.1f} GB/s "
          f"{by / bw * 1e3:.0f} ms: {by / bw / per:.0%} of the bandwidth limit")


def bench_prefill(a):
    from bench_qevict_forward import flops, interleaved, matmul_reference

    from analysis.qevict.gguf_model import load_model
    from analysis.qevict.runner import PrefillCapture

    model = load_model()
    c, T = model.cfg, a.tokens
    ids = np.random.default_rng(1).integers(0, c.vocab_size, T)
    def cap():
        model.prefill(ids, logits="none", capture=PrefillCapture(c.n_layers, c.n_heads, T, 32))

    t = interleaved({"ref": matmul_reference(model, T), "cap": cap}, a.repeat)
    fl = flops(model, T)
    print(f"prefill {T:,} tokens with capture {t['cap']:.1f} s ({fl / t['cap'] / 1e9:.1f} GFLOP/s); "
          f"same-shape matmuls {t['ref']:.1f} s: {t['ref'] / t['cap']:.0%} of the matmul rate (target >= 50%)"
          f"   ({load()})")


def bench_gemma(a):
    from analysis.qevict.corpora import LONG_DOCUMENTS, load_document
    from analysis.qevict.gemma_model import gemma_gguf_path, load_gemma
    from analysis.qevict.runner import PrefillCapture
    from analysis.qevict.tokenizer import load_tokenizer

    path = gemma_gguf_path()
    model, tok = load_gemma(path), load_tokenizer(path)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    doc = load_document(LONG_DOCUMENTS["code"], tok, a.tokens)
    kc = model.kv_cfg
    t = time.perf_counter()
    model.prefill(doc.tokens, logits="none", capture=PrefillCapture(kc.n_layers, kc.n_heads, a.tokens, 32))
    dt = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"Gemma 3 270M prefill {a.tokens:,} tokens with capture: {dt:.0f} s (target <= 600 s at 32,768); "
          f"peak RSS {rss / 2**30:.2f} GiB (model loaded: {rss0 / 2**30:.2f} GiB)   ({load()})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["decode", "prefill", "gemma"])
    ap.add_argument("--prefill", type=int, default=7168)
    ap.add_argument("--decode", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args(argv)
    if a.what == "decode":
        bench_decode(a)
    elif a.what == "prefill":
        a.tokens = a.tokens or 8192
        bench_prefill(a)
    else:
        a.tokens = a.tokens or 32768
        bench_gemma(a)


if __name__ == "__main__":
    main()
