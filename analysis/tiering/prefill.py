"""Chapter 2's prefill pricing through the one forward-pass model (:mod:`analysis.forward`).

A thin adapter (chapter 2 must not import chapter 3's ``disagg``): a
:class:`~analysis.tiering.tiers.Deployment` becomes the forward model's device numbers, precision
and efficiencies, and a prefill of ``n_new`` tokens after ``prefix`` cached ones on one instance of
``tp`` GPUs costs one colocated forward pass (tensor-parallel all-reduces over NVLink, per-step and
per-layer overheads, attention by its attended pairs). Chapter 2's ``compute_eff`` is the forward
model's ``Efficiency.compute``; the other efficiencies are chapter 3's defaults.

:func:`chunked_prefill_time` prices a prompt prefilled in chunks of ``chunk_tokens`` (chunked
prefill, as a continuous-batching engine schedules it): one forward pass per chunk, each after the
prefix and the chunks before it.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import forward as fw
from .. import kv
from ..specs import gpu as _gpu


@functools.lru_cache(maxsize=64)
def _setup(model: str, gpu: str, weight_dtype: str, kv_dtype: str, compute_eff: float):
    g = _gpu(gpu)
    wb = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625, "int4": 0.5625}.get(weight_dtype, 2.0)
    kb = kv.dtype_bytes(kv_dtype)  # the KV element size chapter 2 uses everywhere
    prec = fw.Precision(weight_bytes=wb, kv_bytes=kb, act_bytes=2.0,
                        compute=weight_dtype if weight_dtype in ("bf16", "fp8", "fp4") else "bf16")
    dev = {"flops": g.flops(prec.compute), "attn_flops": g.flops("bf16"), "bw": g["hbm_bandwidth"],
           "link": g.values.get("nvlink_bandwidth", g.values.get("pcie_bandwidth", 64e9)) / 2.0}
    eff = fw.Efficiency().replace(compute=float(compute_eff))
    return fw.shape(model), prec, eff, dev


def efficiency(d) -> "fw.Efficiency":
    """The forward model's efficiencies for deployment ``d``."""
    return _setup(d.model, d.gpu, d.weight_dtype, d.kv_dtype, float(d.compute_eff))[2]


def prefill_time(d, n_new, prefix=0.0, seqs=1.0):
    """Seconds of one forward pass prefilling ``seqs`` prompts of ``n_new`` new tokens after
    ``prefix`` cached ones each on one instance of ``d.tp`` GPUs (vectorised)."""
    s, prec, eff, dev = _setup(d.model, d.gpu, d.weight_dtype, d.kv_dtype, float(d.compute_eff))
    n_new = np.asarray(n_new, dtype=float)
    if np.any(n_new < 0):
        raise ValueError("n_new must be >= 0 tokens")
    t = fw.colocated_pass_time(s, prec, eff, dev, tp=float(d.tp), dp=1.0, pre_seqs=seqs, pre_len=n_new,
                               pre_prefix=np.asarray(prefix, dtype=float))
    return np.asarray(t, dtype=float)


def chunked_prefill_time(d, n_new, prefix=0.0, chunk_tokens: int = 8192):
    """Seconds to prefill ``n_new`` tokens after ``prefix`` in chunks of ``chunk_tokens`` (one pass
    per chunk, each after all earlier tokens)."""
    if int(chunk_tokens) != chunk_tokens or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be an integer >= 1, got {chunk_tokens!r}")
    n_new = np.atleast_1d(np.asarray(n_new, dtype=float))
    prefix = np.broadcast_to(np.asarray(prefix, dtype=float), n_new.shape)
    n_chunks = np.maximum(np.ceil(n_new / chunk_tokens), 1).astype(int)
    total = np.zeros_like(n_new)
    for k in range(int(n_chunks.max())):
        active = k < n_chunks
        ln = np.where(active, np.minimum(chunk_tokens, n_new - k * chunk_tokens), 0.0)
        t = prefill_time(d, np.maximum(ln, 0.0), prefix + k * chunk_tokens)
        total += np.where(active, t, 0.0)
    return total
