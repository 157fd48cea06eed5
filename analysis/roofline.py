"""The roofline: an operator takes as long as its slower resource, plus fixed overheads.

    time = max(FLOPs / (peak_flops * compute_eff), bytes / (bandwidth * bw_eff)) + overhead_s

All functions are vectorised (numpy broadcasting) so that a parallelism search can evaluate many
candidate plans at once. Efficiencies are explicit parameters, never hidden constants.
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


def prefill_time(model, gpu, n_new, prefix=0, *, n_gpus=1, dtype="bf16", kv_dtype="bf16",
                 compute_eff=1.0, bw_eff=1.0):
    """Roofline time to prefill ``n_new`` tokens after ``prefix`` cached ones on ``n_gpus`` GPUs
    (ideal tensor parallelism, no communication): FLOPs include the quadratic attention term;
    bytes are one read of the weights plus the prefix KV read and the new KV written."""
    g = _gpu(gpu)
    flops = kv.prefill_flops(model, n_new, prefix)
    bytes_moved = (kv.weight_bytes(model, dtype)
                   + kv.kv_bytes(model, np.asarray(prefix) + np.asarray(n_new), 1, kv_dtype))
    return op_time(flops, bytes_moved, n_gpus * g.flops(dtype), n_gpus * g["hbm_bandwidth"],
                   compute_eff=compute_eff, bw_eff=bw_eff)


def prefix_load_bandwidth_needed(model, gpu, prefix, n_new, *, n_gpus=1, dtype="bf16", kv_dtype="bf16",
                                 compute_eff=1.0, bw_eff=1.0):
    """Bandwidth (bytes/s) at which loading the KV of ``prefix`` tokens takes as long as the prefill
    of the ``n_new`` tokens that follow it, i.e. the rate at which loading is fully hidden behind
    (layer-wise overlapped) computation. Loading pays when the tier delivers more than this."""
    t = prefill_time(model, gpu, n_new, prefix, n_gpus=n_gpus, dtype=dtype, kv_dtype=kv_dtype,
                     compute_eff=compute_eff, bw_eff=bw_eff)
    return kv.kv_bytes(model, prefix, 1, kv_dtype) / t
