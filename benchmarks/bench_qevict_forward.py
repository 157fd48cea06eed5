"""Prefill throughput of chapter 4's numpy forward pass against this machine's float32 matrix
multiply on the same shapes, and the overhead of capturing attention.

    python benchmarks/bench_qevict_forward.py [--tokens 1024] [--repeat 3]

The reference does, for the same sequence length, exactly the matrix products of the forward pass
(Q/K/V, output, gate/up, down projections of every layer; causal attention scores and weighted sums
per query chunk, as the forward computes them; no LM head) and nothing else: the ratio
``reference time / forward time`` is the fraction of the machine's matmul rate the forward reaches
(target >= 50%).  Capture overhead: forward with the per-window attention reduction of the
experiment versus without (target <= 30%).  Timings are the best of ``--repeat`` interleaved rounds
(other processes on the machine distort them: the script prints the load average).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from analysis.qevict.gguf_model import load_model  # noqa: E402
from analysis.qevict.runner import PrefillCapture  # noqa: E402


def interleaved(fns: dict, repeat: int) -> dict:
    """Best wall time of each function over ``repeat`` rounds, the functions alternating within a
    round so that a change of machine load affects them alike."""
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def matmul_reference(model, T, chunk=256):
    c = model.cfg
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, c.d_model), dtype=np.float32)
    q = rng.standard_normal((c.n_kv_heads, c.group, T, c.head_dim), dtype=np.float32)
    k = rng.standard_normal((c.n_kv_heads, T, c.head_dim), dtype=np.float32)

    def run():
        for lw in model.layers:
            x @ lw["wqkv"]
            x @ lw["wo"]
            h = x @ lw["w13"]
            h[:, : c.d_ff] @ lw["w2"]
            for s in range(0, T, chunk):
                e = min(T, s + chunk)
                sc = np.matmul(q[:, :, s:e], k[:, None, :e].swapaxes(-1, -2))
                np.matmul(sc, k[:, None, :e])
    return run


def flops(model, T, chunk=256):
    c = model.cfg
    lin = 2 * T * (c.d_model * (c.d_model + 2 * c.n_kv_heads * c.head_dim) + c.d_model * c.d_model
                   + c.d_model * 2 * c.d_ff + c.d_ff * c.d_model)
    att = sum(2 * 2 * c.n_heads * (min(T, s + chunk) - s) * min(T, s + chunk) * c.head_dim
              for s in range(0, T, chunk))
    return c.n_layers * (lin + att)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    model = load_model()
    T = a.tokens
    ids = np.random.default_rng(1).integers(0, model.cfg.vocab_size, T)
    model.prefill(ids[:64], logits="none")  # warm up
    c = model.cfg
    t = interleaved({
        "ref": matmul_reference(model, T),
        "fwd": lambda: model.prefill(ids, logits="none"),
        "cap": lambda: model.prefill(ids, logits="none",
                                     capture=PrefillCapture(c.n_layers, c.n_heads, T, 32)),
    }, a.repeat)
    t_ref, t_fwd, t_cap = t["ref"], t["fwd"], t["cap"]
    import os as _os
    load = _os.getloadavg()[0] if hasattr(_os, "getloadavg") else float("nan")
    fl = flops(model, T)
    print(f"tokens                        {T}   (load average {load:.1f} on {_os.cpu_count()} CPUs)")
    print(f"matmul reference (same shapes) {t_ref:.3f} s  {fl / t_ref / 1e9:.1f} GFLOP/s")
    print(f"numpy forward (prefill)        {t_fwd:.3f} s  {fl / t_fwd / 1e9:.1f} GFLOP/s  "
          f"{T / t_fwd:.0f} tokens/s")
    print(f"forward with attention capture {t_cap:.3f} s")
    print(f"ratio forward / matmul rate    {t_ref / t_fwd:.1%}  (target >= 50%)")
    print(f"attention-capture overhead     {t_cap / t_fwd - 1:+.1%}  (target <= 30%)")


if __name__ == "__main__":
    main()
