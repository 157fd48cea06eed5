"""The roofline: an operator takes as long as its slower resource, plus fixed overheads.

    time = max(FLOPs / (peak_flops * compute_eff), bytes / (bandwidth * bw_eff)) + overhead_s

All functions are vectorised (numpy broadcasting) so that a parallelism search can evaluate many
candidate plans at once. Efficiencies are explicit parameters, never hidden constants.

This module holds the roofline primitive (:func:`op_time`, :func:`gemm`, the ridge point) and
Mooncake's closed-form Eq. 2 as the paper writes it (:func:`mooncake_eq2_bandwidth`). Forward
passes are timed by the book's one time model, :mod:`analysis.forward`, whose default backend is
this roofline applied per operator.
"""
from __future__ import annotations

import numpy as np

from . import kv
from .specs import gpu as _gpu


def _check_positive(name, x):
    a = np.asarray(x, dtype=float)
    if np.any(~np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{name} must be finite and > 0, got {x!r}")
    return a


def op_time(flops, bytes_moved, peak_flops, bandwidth, *, compute_eff=1.0, bw_eff=1.0, overhead_s=0.0):
    """Roofline time in seconds of an operator (vectorised)."""
    peak = _check_positive("peak_flops", peak_flops) * _check_positive("compute_eff", compute_eff)
    bw = _check_positive("bandwidth", bandwidth) * _check_positive("bw_eff", bw_eff)
    f = np.asarray(flops, dtype=float)
    b = np.asarray(bytes_moved, dtype=float)
    if np.any(f < 0) or np.any(b < 0):
        raise ValueError("flops and bytes must be >= 0")
    t = np.maximum(f / peak, b / bw) + np.asarray(overhead_s, dtype=float)
    return t if t.ndim else float(t)


def arithmetic_intensity(flops, bytes_moved):
    return np.asarray(flops, dtype=float) / np.maximum(np.asarray(bytes_moved, dtype=float), 1e-30)


def ridge_point(peak_flops, bandwidth):
    """FLOP per byte above which an operator is compute-bound."""
    return float(peak_flops) / float(bandwidth)


def is_compute_bound(flops, bytes_moved, peak_flops, bandwidth):
    return arithmetic_intensity(flops, bytes_moved) >= ridge_point(peak_flops, bandwidth)


def gemm(m, n, k, *, bytes_per_elem=2.0, weight_bytes_per_elem=None):
    """FLOPs and bytes of an (m x k) @ (k x n) matmul: activations m x k in, m x n out, weights k x n."""
    wb = bytes_per_elem if weight_bytes_per_elem is None else weight_bytes_per_elem
    m, n, k = (np.asarray(v, dtype=float) for v in (m, n, k))
    flops = 2.0 * m * n * k
    bytes_moved = (m * k + m * n) * bytes_per_elem + k * n * wb
    return flops, bytes_moved


def mooncake_eq2_bandwidth(model, gpu, prefix_tokens, *, n_gpus=1, dtype="bf16", kv_dtype="bf16",
                           compute_eff=1.0):
    """**Mooncake's Eq. 2, as the paper writes it** (Qin et al., FAST'25): reusing a cached prefix of
    ``n`` tokens pays when the tier delivers more than

        B* = G * (KV bytes per token and layer) / (prefill FLOPs per token and layer)
           = KV(n) / (FLOP(n) / (n_gpus * compute_eff * peak))

    (``G``: the GPUs' aggregate FLOP/s at ``compute_eff``): recomputation is priced by its FLOPs
    alone (no weight reads, no communication, no overheads). The paper counts the FLOPs with its
    Eq. 1, ``a n^2 d + b n d^2`` per layer; here they are counted from the model's configuration
    (:func:`analysis.kv.prefill_flops`: two per active parameter per token, LM head included, plus
    the causal attention core). This is the paper's closed form, kept to compare with its published
    numbers; the book times prefill with its one time model (:mod:`analysis.forward`)."""
    p = np.asarray(prefix_tokens, dtype=float)
    if np.any(~np.isfinite(p)) or np.any(p <= 0):
        raise ValueError(f"prefix_tokens must be finite and > 0, got {prefix_tokens!r}")
    G = _check_positive("peak", n_gpus * _gpu(gpu).flops(dtype)) * _check_positive("compute_eff", compute_eff)
    t = np.asarray(kv.prefill_flops(model, p, 0), dtype=float) / G
    out = kv.kv_bytes(model, p, 1, kv_dtype) / t
    return out if np.ndim(out) else float(out)
