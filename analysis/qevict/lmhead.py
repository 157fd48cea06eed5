"""The output head of chapter 4's models after a prefill: the logits asked for, or the negative
log-likelihood of given next tokens (both models' ``prefill(..., logits=...)``).

``logits`` modes: ``"all"`` (T, V) logits, ``"last"`` (V,) logits of the last position, ``"none"``,
``"nll"`` the per-position negative log-likelihood of ``targets`` (the next token at each position,
-1 to skip; NaN where skipped), computed ``chunk`` rows at a time in float64 so that T x V logits
never exist at once.
"""
from __future__ import annotations

import numpy as np

LOGITS_MODES = ("all", "last", "none", "nll")


def check_mode(logits: str, targets, n_tokens: int) -> None:
    """Reject a bad ``logits`` mode (or ``"nll"`` without matching targets) before any forward work."""
    if logits not in LOGITS_MODES:
        raise ValueError(f"logits must be 'all', 'last', 'none' or 'nll', got {logits!r}")
    if logits == "nll" and (targets is None or len(targets) != n_tokens):
        raise ValueError("logits='nll' needs targets of the same length as tokens")


def head_outputs(x: np.ndarray, logits: str, targets, head_fn, chunk: int) -> dict:
    """What ``prefill`` adds for mode ``logits`` from the final hidden states ``x`` (T, D):
    ``{"logits": ...}``, ``{"nll": ...}`` or ``{}``.  ``head_fn`` maps hidden rows to logits (the
    model's final norm and output projection); ``chunk``: rows per head product in ``"nll"``."""
    T = x.shape[0]
    check_mode(logits, targets, T)
    if logits == "all":
        return dict(logits=head_fn(x))
    if logits == "last":
        return dict(logits=head_fn(x[-1:])[0])
    if logits == "none":
        return {}
    targets = np.asarray(targets)
    nll = np.full(T, np.nan, dtype=np.float64)
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        lg = head_fn(x[s:e]).astype(np.float64)
        mx = lg.max(-1)
        lse = np.log(np.exp(lg - mx[:, None]).sum(-1)) + mx
        tt = targets[s:e]
        ok = tt >= 0
        nll[s:e][ok] = lse[ok] - lg[np.arange(e - s)[ok], tt[ok]]
    return dict(nll=nll)
