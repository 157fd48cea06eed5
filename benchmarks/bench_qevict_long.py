"""Chapter 4 at long context: decode and prefill speed against this machine's limits.

    python benchmarks/bench_qevict_long.py decode  [--prefill 7168] [--decode 1024]
    python benchmarks/bench_qevict_long.py prefill [--tokens 8192]
    python benchmarks/bench_qevict_long.py gemma   [--tokens 32768]

* ``decode``: one document, every policy x 4 budgets on SmolLM2 (``--policies all``: the 13 of
  ``analysis.qevict.policies``, 49 lockstep streams; ``--policies issue13``: the 10 the chapter had when
  the target was set, full cache included, 37 streams), one shared
  prefill with capture, then the decoding steps; target: 8,192 context tokens (SmolLM2's whole
  context: 7,168 + 1,024) in <= 10 min on 2 cores; measure it whole (a step's cost depends on the
  decoded tokens and one-time costs fall in the first steps, so short runs extrapolate badly).
  Reports the time per decoding step against the
  bytes a step must read (the shared prompt K/V once, plus one dequantized copy per bit width, each
  stream's own decoded K/V, and the float32 weights) divided by the measured memory read bandwidth,
  and against the FLOPs it multiplies (weights, and the attention rows x keys the engine computes:
  the "fused" default only the windows each stream reads, "sparse" whole 512-key blocks) divided by
  the single-thread matmul rate at the step's shapes; per-phase times
  (attention, LM head, projections/MLP, the policies' bookkeeping).  ``--blas-threads`` (default 2:
  every core of the target machine; the runner's ``DECODE_BLAS_THREADS`` is 1, for runs of several
  documents in parallel processes) sets the BLAS threads of the decoding step's projections; the
  compiled attention kernel uses numba's threads (every core).  Two thread pools take turns on the
  same cores at every layer, so this script makes both of them sleep as soon as their work is done
  (``OMP_WAIT_POLICY=PASSIVE`` for numba's OpenMP threads, ``OPENBLAS_THREAD_TIMEOUT=4`` for
  OpenBLAS's; set before numpy and numba load, unless already set): with their default busy-waiting,
  two BLAS threads were slower than one (1,282 against 830 ms per step, session 5); with these, two
  BLAS threads cut the projections and LM head from 250 to 156 ms per step (session 6).
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

# Before numpy (OpenBLAS) and numba (OpenMP) start their threads: idle threads sleep instead of spinning,
# so the BLAS threads and the attention kernel's threads do not take the cores from each other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import numpy as np  # noqa: E402

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


def gemm_rate(B: int, cfg, repeat: int = 3) -> float:
    """FLOP/s of this machine's single-thread float32 matrix products at a decoding step's shapes:
    B rows against one layer's projection matrices, and the attention's batched products
    (KV heads x B * group rows x head_dim against 512-key blocks and back)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    d, f, hd, Hkv, g = cfg.d_model, cfg.d_ff, cfg.head_dim, cfg.n_kv_heads, cfg.group
    x = rng.standard_normal((B, d), dtype=np.float32)
    w = rng.standard_normal((d, 2 * f), dtype=np.float32)
    q = rng.standard_normal((Hkv, B * g, hd), dtype=np.float32)
    k = rng.standard_normal((Hkv, 512, hd), dtype=np.float32)
    fl = 2 * B * d * 2 * f + 2 * 2 * Hkv * B * g * 512 * hd
    best = float("inf")
    with threadpool_limits(1, user_api="blas"):
        for _ in range(repeat):
            t = time.perf_counter()
            for _ in range(20):
                x @ w
                s = np.matmul(q, k.swapaxes(-1, -2))
                np.matmul(s, k)
            best = min(best, (time.perf_counter() - t) / 20)
    return fl / best


def attention_flops(cache, pos: int) -> tuple:
    """(FLOPs the cache's engine multiplies, FLOPs of the keys each stream reads) of one layer's
    attention at position ``pos``, from the cache's current tiers: scores and values, 2 x 2 x rows x
    keys x head_dim each.  The "fused" engine multiplies only the keys each stream reads; the
    "sparse" engine's count is per key block: a stream's rows count for a block if it reads any of its
    windows at that precision (exact, or dequantized at its bit width)."""
    from analysis.qevict.kvcache import EVICTED, OFFLOADED

    P, W, g, hd = cache.P, cache.W, cache.g, cache.hd
    t = pos + 1
    per_key = 2 * 2 * g * hd * cache.Hkv
    tier = cache.tier[:, :, :, : P // W]  # (B, L, Hkv, NWp)
    read = (tier != EVICTED) & (tier != OFFLOADED)
    lz = cache.lossy[:, :, :, : P // W]
    useful = (read.sum() / cache.L * W / cache.Hkv + cache.B * (t - P)) * per_key
    if cache.engine == "fused":
        return useful, useful
    bw = cache.block // W
    starts = np.arange(0, P // W, bw)
    ex = np.logical_or.reduceat(read & ~lz, starts, axis=-1).any(2)  # (B, L, blocks)
    qz = np.logical_or.reduceat(read & lz, starts, axis=-1).any(2)
    sizes = np.diff(np.append(starts, P // W)) * W
    done = ((ex + qz) * sizes).sum() / cache.L + cache.B * (t - P)
    return done * per_key, useful


def bench_decode(a):
    from analysis.qevict import corpora, runner
    from analysis.qevict.gguf_model import load_model
    from analysis.qevict.policies import POLICIES, PolicyConfig
    from analysis.qevict.tokenizer import load_tokenizer

    policies = POLICIES if a.policies == "all" else POLICIES[:10]
    runner.DECODE_BLAS_THREADS = a.blas_threads
    model, tok = load_model(), load_tokenizer()
    doc = corpora.load_document(corpora.LONG_DOCUMENTS["code"], tok, a.prefill + a.decode + 1)
    bw = read_bandwidth()
    B = 1 + (len(policies) - 1) * 4
    print(f"policies ({a.policies}): {', '.join(policies)}; decode BLAS threads {a.blas_threads}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
          f"OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT')}", flush=True)
    rate = gemm_rate(B, model.cfg)
    print(f"memory read bandwidth {bw / 1e9:.1f} GB/s; single-thread matmul rate at decode shapes "
          f"{rate / 1e9:.1f} GFLOP/s   ({load()})", flush=True)
    # phase timers: the cache's attention, the LM head, the whole forward step; the rest of a step is
    # the policies' bookkeeping (re-decisions, observations, metrics)
    timers = dict(attend=0.0, lm_head=0.0, step=0.0)
    holder, flops = {}, []

    def timed(name, f):
        def g(*args, **kw):
            t = time.perf_counter()
            try:
                return f(*args, **kw)
            finally:
                timers[name] += time.perf_counter() - t
        return g

    Cache = runner.MultiStreamCache

    def make_cache(*args, **kw):
        c = Cache(*args, **kw)
        holder["c"] = c
        c.attend = timed("attend", c.attend)
        return c

    runner.MultiStreamCache = make_cache
    model.logits = timed("lm_head", model.logits)
    dec = model.decode_step

    def decode_step(token, pos, cache, **kw):
        if pos % 64 == 0 or pos == a.prefill:  # engine FLOPs sampled every 64 steps
            flops.append(attention_flops(cache, pos))
        return timed("step", dec)(token, pos, cache, **kw)

    model.decode_step = decode_step
    t0 = time.perf_counter()
    try:
        r = runner.run_document(model, doc.tokens, a.prefill, a.decode, policies, [0.10, 0.20, 0.35, 0.50],
                                PolicyConfig(), verbose=True)
    finally:
        runner.MultiStreamCache = Cache
    wall = time.perf_counter() - t0
    B, D, c = len(r["streams"]), a.decode, model.cfg
    per = r["seconds_decode"] / D
    by = step_bytes(c, n_weights(model), a.prefill, (D + 1) / 2, B, 2)
    att_done, att_useful = (np.mean(x) * c.n_layers for x in zip(*flops))
    w_flops = 2 * B * n_weights(model)  # projections and the (tied) LM head: 2 FLOPs per weight and row
    ph = {k: v / D for k, v in timers.items()}
    other = ph["step"] - ph["attend"] - ph["lm_head"]
    print(f"engine {holder['c'].engine!r}; {a.prefill:,} prefill + {D:,} decode, {B} streams:")
    print(f"total {wall:.0f} s (target <= 600 s at "
          f"7,168 + 1,024); prefill {r['seconds_prefill']:.0f} s   ({load()})")
    print(f"decode {per * 1e3:.0f} ms/step (target <= 500): attention {ph['attend'] * 1e3:.0f} ms, "
          f"LM head {ph['lm_head'] * 1e3:.0f} ms, projections/MLP/norms {other * 1e3:.0f} ms, "
          f"policies and metrics {(per - ph['step']) * 1e3:.0f} ms")
    print(f"bytes per step {by / 1e9:.2f} GB -> at {bw / 1e9:.1f} GB/s {by / bw * 1e3:.0f} ms: "
          f"{by / bw / per:.0%} of the bandwidth limit")
    fl = att_done + w_flops
    print(f"FLOPs per step {fl / 1e9:.1f} G (attention {att_done / 1e9:.1f} G as multiplied, "
          f"{att_useful / 1e9:.1f} G on the keys the streams read; weights {w_flops / 1e9:.1f} G) -> at "
          f"{rate / 1e9:.1f} GFLOP/s {fl / rate * 1e3:.0f} ms: {fl / rate / per:.0%} of the matmul limit")


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
    ap.add_argument("--policies", choices=["all", "issue13"], default="all",
                    help="decode: every policy (default) or the 10 of the issue's target (full included)")
    ap.add_argument("--blas-threads", type=int, default=2,
                    help="decode: BLAS threads of the projections (default 2; the runner's is 1)")
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
