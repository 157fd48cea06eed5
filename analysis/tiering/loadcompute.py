"""Load the prefix KV cache or recompute it? Mooncake's Eq. 1-2 and the book's time model.

Mooncake (Qin et al., FAST'25) compares, for a prompt whose first ``n`` tokens are cached elsewhere,
the time to *load* their KV cache at bandwidth ``B`` with the time to *recompute* them on GPUs of
aggregate peak ``G``: Eq. 1 counts prefill FLOPs per layer as ``a n^2 d + b n d^2`` and the KV bytes
as ``2 n d s / g`` (``d`` hidden size, ``s`` bytes per element, ``g`` = query heads per KV head), and
Eq. 2 states that reuse pays when ``B > G * 2 d s / (g (a n d + b d^2))``. For LLaMA3-70B with an
8,192-token prefix the paper finds >= 6 GB/s on 8xA800 and >= 19 GB/s on 8xH800.

* :func:`reuse_bandwidth_needed` -- Mooncake's criterion in the paper's closed form
  (:func:`analysis.roofline.mooncake_eq2_bandwidth`), FLOPs counted from the configuration with
  :mod:`analysis.kv`: what the chapter compares with the published numbers;
* :func:`breakeven_bandwidth` -- the same criterion with recomputation timed by the book's one time
  model (:func:`analysis.forward.prefill_time`: per-layer operators on one instance of ``n_gpus``
  GPUs, weight reads, tensor-parallel all-reduces and overheads): KV bytes of the prefix divided by
  the time to prefill it from scratch (load faster than recompute);
* :func:`overlap_bandwidth_needed` -- the stricter layer-wise-overlap criterion: loading the prefix
  hides entirely behind the prefill of the ``n_new`` tokens that follow it;
* :func:`implied_eq1_coefficient` -- the ``a n/d + b`` that a published bandwidth implies, to set the
  paper's FLOP count beside ours.
"""
from __future__ import annotations

import numpy as np

from .. import forward as fw
from .. import kv, roofline
from ..specs import gpu as _gpu
from ..specs import model as _model


def _check_prefix(prefix_tokens):
    p = np.asarray(prefix_tokens, dtype=float)
    if np.any(~np.isfinite(p)) or np.any(p <= 0):
        raise ValueError(f"prefix_tokens must be finite and > 0, got {prefix_tokens!r}")
    return p


def _check_gpus(n_gpus):
    if int(n_gpus) != n_gpus or n_gpus < 1:
        raise ValueError(f"n_gpus must be a positive integer, got {n_gpus!r}")


def reuse_bandwidth_needed(model, gpu, prefix_tokens, *, n_gpus=1, dtype="bf16", kv_dtype="bf16",
                           compute_eff=1.0):
    """Bytes/s above which loading a prefix's KV is faster than recomputing it: Mooncake's Eq. 2 as
    the paper writes it (:func:`analysis.roofline.mooncake_eq2_bandwidth`; recomputation priced by
    its FLOPs at ``n_gpus x compute_eff x peak``)."""
    _check_prefix(prefix_tokens)
    _check_gpus(n_gpus)
    return roofline.mooncake_eq2_bandwidth(model, gpu, prefix_tokens, n_gpus=n_gpus, dtype=dtype,
                                           kv_dtype=kv_dtype, compute_eff=compute_eff)


def _time_model(dtype, kv_dtype, compute_eff, eff):
    prec = fw.Precision.named(dtype, kv_dtype=kv_dtype)
    e = fw.Efficiency() if eff is None else eff
    return prec, e.replace(compute=float(compute_eff))


def breakeven_bandwidth(model, gpu, prefix_tokens, *, n_gpus=1, dtype="bf16", kv_dtype="bf16",
                        compute_eff=1.0, eff: fw.Efficiency | None = None):
    """Bytes/s above which loading a prefix's KV is faster than recomputing it on one instance of
    ``n_gpus`` GPUs, recomputation timed by the one time model (``compute_eff`` replaces the
    compute efficiency of ``eff``, default :class:`analysis.forward.Efficiency`)."""
    p = _check_prefix(prefix_tokens)
    _check_gpus(n_gpus)
    prec, e = _time_model(dtype, kv_dtype, compute_eff, eff)
    t = fw.prefill_time(model, gpu, p, 0.0, tp=n_gpus, prec=prec, eff=e)
    out = kv.kv_bytes(model, p, 1, kv_dtype) / t
    return out if np.ndim(out) else float(out)


def overlap_bandwidth_needed(model, gpu, prefix_tokens, n_new, *, n_gpus=1, dtype="bf16", kv_dtype="bf16",
                             compute_eff=1.0, eff: fw.Efficiency | None = None):
    """Bytes/s at which loading ``prefix_tokens`` of KV hides behind prefilling ``n_new`` new tokens
    after them (layer-wise overlapped; time model as in :func:`breakeven_bandwidth`)."""
    p = _check_prefix(prefix_tokens)
    _check_gpus(n_gpus)
    prec, e = _time_model(dtype, kv_dtype, compute_eff, eff)
    t = fw.prefill_time(model, gpu, n_new, p, tp=n_gpus, prec=prec, eff=e)
    out = kv.kv_bytes(model, p, 1, kv_dtype) / t
    return out if np.ndim(out) else float(out)


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
    """Tidy rows: the load-vs-recompute break-even bandwidth (:func:`breakeven_bandwidth`, one
    instance of ``n_gpus`` GPUs) for every model x GPU x prefix length."""
    rows = []
    p = np.atleast_1d(np.asarray(prefix_tokens, dtype=float))
    for mname in models:
        for gname in gpus:
            bw = np.atleast_1d(
                breakeven_bandwidth(
                    mname, gname, p, n_gpus=n_gpus, dtype=dtype, kv_dtype=kv_dtype, compute_eff=compute_eff
                )
            )
            for pi, b in zip(p, bw):
                rows.append(
                    {"model": mname, "gpu": gname, "prefix_tokens": int(pi), "bandwidth_needed": float(b)}
                )
    return rows
