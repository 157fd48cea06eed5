"""Load the prefix KV cache or recompute it? Mooncake's Eq. 1-2 and their roofline generalisation.

Mooncake (Qin et al., FAST'25) compares, for a prompt whose first ``n`` tokens are cached elsewhere,
the time to *load* their KV cache at bandwidth ``B`` with the time to *recompute* them on GPUs of
aggregate peak ``G``: Eq. 1 counts prefill FLOPs per layer as ``a n^2 d + b n d^2`` and the KV bytes
as ``2 n d s / g`` (``d`` hidden size, ``s`` bytes per element, ``g`` = query heads per KV head), and
Eq. 2 states that reuse pays when ``B > G * 2 d s / (g (a n d + b d^2))``. For LLaMA3-70B with an
8,192-token prefix the paper finds >= 6 GB/s on 8xA800 and >= 19 GB/s on 8xH800.

Here the same criterion is computed from first principles with :mod:`analysis.kv` (KV bytes per
token from the configuration; FLOPs = 2 x active parameters per token plus the causal attention
core) and :mod:`analysis.roofline` (time = max(FLOPs / peak, bytes / HBM bandwidth)):

* :func:`reuse_bandwidth_needed` -- Mooncake's criterion: KV bytes of the prefix divided by the
  time to prefill the prefix from scratch (load faster than recompute);
* :func:`overlap_bandwidth_needed` -- the stricter layer-wise-overlap criterion of
  :func:`analysis.roofline.prefix_load_bandwidth_needed`: loading the prefix hides entirely behind
  the prefill of the ``n_new`` tokens that follow it;
* :func:`implied_eq1_coefficient` -- the ``a n/d + b`` that a published bandwidth implies, to set the
  paper's FLOP count beside ours.
"""
from __future__ import annotations

import numpy as np

from .. import kv, roofline
from ..specs import gpu as _gpu
from ..specs import model as _model


def _check_prefix(prefix_tokens):
    p = np.asarray(prefix_tokens, dtype=float)
    if np.any(~np.isfinite(p)) or np.any(p <= 0):
        raise ValueError(f"prefix_tokens must be finite and > 0, got {prefix_tokens!r}")
    return p


def reuse_bandwidth_needed(model, gpu, prefix_tokens, *, n_gpus=1, dtype="bf16", kv_dtype="bf16",
                           compute_eff=1.0):
    """Bytes/s above which loading a prefix's KV is faster than recomputing it (Mooncake Eq. 2)."""
    p = _check_prefix(prefix_tokens)
    if int(n_gpus) != n_gpus or n_gpus < 1:
        raise ValueError(f"n_gpus must be a positive integer, got {n_gpus!r}")
    t = roofline.prefill_time(model, gpu, p, 0, n_gpus=n_gpus, dtype=dtype, kv_dtype=kv_dtype,
                              compute_eff=compute_eff)
    out = kv.kv_bytes(model, p, 1, kv_dtype) / t
    return out if np.ndim(out) else float(out)


def overlap_bandwidth_needed(model, gpu, prefix_tokens, n_new, *, n_gpus=1, dtype="bf16", kv_dtype="bf16",
                             compute_eff=1.0):
    """Bytes/s at which loading ``prefix_tokens`` of KV hides behind prefilling ``n_new`` new tokens."""
    _check_prefix(prefix_tokens)
    return roofline.prefix_load_bandwidth_needed(model, gpu, prefix_tokens, n_new, n_gpus=n_gpus, dtype=dtype,
                                                 kv_dtype=kv_dtype, compute_eff=compute_eff)


def implied_eq1_coefficient(model, gpu, prefix_tokens, bandwidth, *, n_gpus=1, dtype="bf16", kv_dtype="bf16"):
    """``a n/d + b`` of Mooncake's Eq. 1 that makes Eq. 2 give ``bandwidth`` (bytes/s).

    From Eq. 2: ``a n d + b d^2 = G * (KV bytes per token and layer) / B``; divided by ``d^2``."""
    m = _model(model)
    g = _gpu(gpu)
    G = n_gpus * g.flops(dtype)
    per_tok_layer = kv.kv_bytes_per_token_layer(m, kv_dtype)
    return G * per_tok_layer / float(bandwidth) / m.hidden_size**2


def our_eq1_coefficient(model, prefix_tokens):
    """Our FLOPs per token and layer for a prefill of ``prefix_tokens`` from scratch, in units of
    ``d^2`` (comparable with ``a n/d + b``); split into weights, LM head and attention core."""
    m = _model(model)
    n = float(prefix_tokens)
    pc = kv.param_counts(m)
    lm = m.vocab_size * m.hidden_size
    weights = 2.0 * (pc["active"] - pc["embedding"] - pc["lm_head"])
    attn = float(kv.attention_core_flops(m, n, 0)) / n
    d2 = m.hidden_size**2 * m.n_layers
    return {"weights": weights / d2, "lm_head": 2.0 * lm / d2, "attention": attn / d2,
            "total": (weights + 2.0 * lm + attn) / d2}


def requirement_grid(
    models, gpus, prefix_tokens, *, n_gpus=8, dtype="bf16", kv_dtype="bf16", compute_eff=1.0
):
    """Tidy rows: Mooncake's reuse bandwidth for every model x GPU x prefix length."""
    rows = []
    p = np.atleast_1d(np.asarray(prefix_tokens, dtype=float))
    for mname in models:
        for gname in gpus:
            bw = np.atleast_1d(
                reuse_bandwidth_needed(
                    mname, gname, p, n_gpus=n_gpus, dtype=dtype, kv_dtype=kv_dtype, compute_eff=compute_eff
                )
            )
            for pi, b in zip(p, bw):
                rows.append(
                    {"model": mname, "gpu": gname, "prefix_tokens": int(pi), "bandwidth_needed": float(b)}
                )
    return rows
