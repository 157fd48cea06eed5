"""Chapter 2's prefill and decode-step pricing: a thin call-through to the book's one time model
(:mod:`analysis.forward`).

A :class:`~analysis.tiering.tiers.Deployment` names the model, the GPU, the instance's ``tp``, the
weight and KV dtypes and the compute efficiency; :func:`analysis.forward.prefill_time` prices one
colocated forward pass on that instance (tensor-parallel all-reduces over NVLink, per-step and
per-layer overheads, attention by its attended pairs). Chapter 2's ``compute_eff`` is the time
model's ``Efficiency.compute``; the other efficiencies are its defaults. Precisions come from the time
model's table (:data:`analysis.forward.WEIGHT_FORMATS`) and :data:`analysis.kv.DTYPE_BYTES`.

:func:`chunked_prefill_time` prices a prompt prefilled in chunks of ``chunk_tokens`` (chunked
prefill, as a continuous-batching engine schedules it): one forward pass per chunk, each after the
prefix and the chunks before it.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import forward as fw


@functools.lru_cache(maxsize=64)
def _setup(weight_dtype: str, kv_dtype: str, compute_eff: float):
    return fw.Precision.named(weight_dtype, kv_dtype=kv_dtype), fw.Efficiency().replace(compute=compute_eff)


def efficiency(d) -> "fw.Efficiency":
    """The time model's efficiencies for deployment ``d``."""
    return _setup(d.weight_dtype, d.kv_dtype, float(d.compute_eff))[1]


def prefill_time(d, n_new, prefix=0.0, seqs=1.0):
    """Seconds of one forward pass prefilling ``seqs`` prompts of ``n_new`` new tokens after
    ``prefix`` cached ones each on one instance of ``d.tp`` GPUs (vectorised)."""
    prec, eff = _setup(d.weight_dtype, d.kv_dtype, float(d.compute_eff))
    return fw.prefill_time(d.model, d.gpu, n_new, prefix, tp=d.tp, seqs=seqs, prec=prec, eff=eff)


def decode_step_time(d, context, seqs=1.0):
    """Seconds of one decode step of ``seqs`` sequences at ``context`` tokens each on one instance of
    ``d.tp`` GPUs (vectorised)."""
    prec, eff = _setup(d.weight_dtype, d.kv_dtype, float(d.compute_eff))
    return fw.decode_step_time(d.model, d.gpu, context, tp=d.tp, seqs=seqs, prec=prec, eff=eff)


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
