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
  paper's FLOP count beside ours;
* :func:`cpu_hit_ttft` -- one request's TTFT when its prompt's whole blocks (all but the last token) are
  loaded from CPU memory at a copy bandwidth and the rest is prefilled, against recomputing the whole
  prompt (vLLM's KV offloading connector, Fig. 1 of its 2026-01-08 blog post);
* :func:`offload_throughput` -- prefill throughput of a stream of equal prompts, a share of each
  loaded from CPU memory, in the steady state of continuous-batching steps (the post's Fig. 2).

Both overlap a load with the computation layer by layer (:func:`analysis.forward.layerwise_overlap`,
the replay's one overlap rule) unless ``overlap=False``: then the load completes before the prefill
starts (its time adds).
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


def _cached_tokens(prompt_tokens, share, block_tokens):
    """Whole ``block_tokens`` blocks of the first ``share`` of each prompt, never its last token (a
    prefill computes at least one token)."""
    L = np.asarray(prompt_tokens, dtype=float)
    full = block_tokens * np.floor((L - 1.0) / block_tokens)
    return np.minimum(block_tokens * np.floor(np.asarray(share, dtype=float) * L / block_tokens), full)


def _check_copy(bandwidth, block_tokens):
    if not (np.isfinite(bandwidth) and bandwidth > 0):
        raise ValueError(f"bandwidth must be a finite number of bytes/s > 0, got {bandwidth!r}")
    if int(block_tokens) != block_tokens or block_tokens < 1:
        raise ValueError(f"block_tokens must be an integer >= 1, got {block_tokens!r}")


def cpu_hit_ttft(model, gpu, prompt_tokens, bandwidth, *, block_tokens=16, n_gpus=1, dtype="bf16",
                 kv_dtype="bf16", compute_eff=1.0, eff: fw.Efficiency | None = None, overlap=True) -> dict:
    """TTFT of one request of ``prompt_tokens`` whose KV cache of all whole ``block_tokens`` blocks but
    the one holding the last token is loaded from CPU memory at ``bandwidth`` bytes/s, the remaining
    tokens prefilled after them (``overlap``: load and prefill overlapped layer by layer; else
    added), against prefilling the whole prompt from scratch; one instance of ``n_gpus`` GPUs, the one
    time model (:func:`analysis.forward.prefill_time`). Returns arrays over ``prompt_tokens``:
    ``recompute_s``, ``load_ttft_s``, ``transfer_s`` (the copy alone), ``cached_tokens`` and
    ``speedup`` (recompute / load)."""
    L = _check_prefix(prompt_tokens)
    _check_gpus(n_gpus)
    _check_copy(bandwidth, block_tokens)
    prec, e = _time_model(dtype, kv_dtype, compute_eff, eff)
    cached = _cached_tokens(L, 1.0, block_tokens)
    recompute = fw.prefill_time(model, gpu, L, 0.0, tp=n_gpus, prec=prec, eff=e)
    tail = fw.prefill_time(model, gpu, L - cached, cached, tp=n_gpus, prec=prec, eff=e)
    transfer = kv.kv_bytes(model, cached, 1, kv_dtype) / float(bandwidth)
    load = fw.layerwise_overlap(tail, transfer, _model(model).n_layers) if overlap else tail + transfer
    return {"prompt_tokens": L, "cached_tokens": cached, "recompute_s": np.asarray(recompute, dtype=float),
            "transfer_s": np.asarray(transfer, dtype=float), "load_ttft_s": np.asarray(load, dtype=float),
            "speedup": np.asarray(recompute / load, dtype=float)}


def offload_throughput(model, gpu, prompt_tokens, hit_rates, bandwidth, *, chunk_tokens=8192, block_tokens=16,
                       n_gpus=1, dtype="bf16", kv_dtype="bf16", compute_eff=1.0,
                       eff: fw.Efficiency | None = None, overlap=True) -> dict:
    """Prefill throughput (prompt tokens/s) of a long stream of prompts of ``prompt_tokens``, the first
    ``hit_rate`` share of each (whole ``block_tokens`` blocks, never the last token) loaded from CPU
    memory over one copy engine of ``bandwidth`` bytes/s, in the steady state of continuous-batching
    steps of ``chunk_tokens`` new tokens (0: one prompt per step): a step prefills
    ``k = chunk_tokens / new`` prompts after their cached prefixes while the ``k`` prompts' loads,
    summed (one shared copy engine), overlap it layer by layer (``overlap=False``: add to it).
    Returns arrays over ``hit_rates``: ``tokens_per_s``, ``step_s``, ``compute_s``, ``load_s``,
    ``prompts_per_step`` and ``cached_tokens``."""
    L = float(_check_prefix(prompt_tokens))
    _check_gpus(n_gpus)
    _check_copy(bandwidth, block_tokens)
    h = np.atleast_1d(np.asarray(hit_rates, dtype=float))
    if np.any(~np.isfinite(h)) or np.any((h < 0) | (h > 1)):
        raise ValueError(f"hit_rates must lie in [0, 1], got {hit_rates!r}")
    if int(chunk_tokens) != chunk_tokens or chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be an integer >= 0, got {chunk_tokens!r}")
    if 0 < chunk_tokens < L:
        raise ValueError(f"chunk_tokens = {chunk_tokens} is shorter than a prompt ({L:g} tokens): a step "
                         f"would hold part of one prompt, which this steady-state model does not price; use "
                         f"chunk_tokens >= {L:g} or 0 (one prompt per step)")
    prec, e = _time_model(dtype, kv_dtype, compute_eff, eff)
    cached = _cached_tokens(L, h, block_tokens)
    new = L - cached
    k = chunk_tokens / new if chunk_tokens else np.ones_like(new)
    comp = np.asarray(fw.prefill_time(model, gpu, new, cached, tp=n_gpus, seqs=k, prec=prec, eff=e),
                      dtype=float)
    load = k * kv.kv_bytes(model, cached, 1, kv_dtype) / float(bandwidth)
    step = fw.layerwise_overlap(comp, load, _model(model).n_layers) if overlap else comp + load
    return {"hit_rate": h, "tokens_per_s": k * L / step, "step_s": step, "compute_s": comp, "load_s": load,
            "prompts_per_step": k, "cached_tokens": cached}
