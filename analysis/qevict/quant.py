"""KIVI-style asymmetric integer quantization of KV windows, with byte accounting.

Keys are quantized **per channel** (a group is ``group`` consecutive tokens of one channel),
values **per token** (a group is ``group`` consecutive channels of one token), as in KIVI.  Each
group stores a scale and a zero point (its minimum), both as fp16 (2 bytes each).  The codes are
``bits``-bit unsigned integers, packed: ``bits / 8`` bytes per element.
"""
from __future__ import annotations

import numpy as np

FULL_BYTES_PER_ELEM = 2  # fp16 storage of the full-precision tier
META_BYTES = 2  # one fp16 scale or zero point
SUPPORTED_BITS = (1, 2, 3, 4, 8)


def _check(bits: int, group: int, n: int, what: str):
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
    if group < 1 or n % group:
        raise ValueError(f"group size {group} must divide the {what} ({n})")


def _fake_quant(x: np.ndarray, bits: int, axis: int):
    """Quantize-dequantize along ``axis`` (the group axis).  Returns (deq, scale, zero, codes)."""
    levels = (1 << bits) - 1
    mn = x.min(axis=axis, keepdims=True)
    mx = x.max(axis=axis, keepdims=True)
    zero = mn.astype(np.float16).astype(np.float32)
    scale = ((mx - mn) / np.float32(levels)).astype(np.float16).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1.0))
    codes = np.clip(np.rint((x - zero) / safe), 0, levels)
    codes = np.where(scale > 0, codes, 0.0)
    deq = (codes * scale + zero).astype(np.float32)
    return deq, scale, zero, codes.astype(np.uint8)


def quantize_keys(k: np.ndarray, bits: int, group: int) -> np.ndarray:
    """Per-channel quantize-dequantize of keys ``k`` of shape (..., W, hd): groups of ``group`` tokens."""
    W, hd = k.shape[-2:]
    _check(bits, group, W, "window length in tokens")
    kk = k.reshape(*k.shape[:-2], W // group, group, hd)
    deq = _fake_quant(kk, bits, axis=-2)[0]
    return deq.reshape(k.shape)


def quantize_values(v: np.ndarray, bits: int, group: int) -> np.ndarray:
    """Per-token quantize-dequantize of values ``v`` of shape (..., W, hd): groups of ``group`` channels."""
    W, hd = v.shape[-2:]
    _check(bits, group, hd, "head dimension")
    vv = v.reshape(*v.shape[:-1], hd // group, group)
    deq = _fake_quant(vv, bits, axis=-1)[0]
    return deq.reshape(v.shape)


def quant_error_bound(x: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Largest error the quantizer may make on each group: half a step, plus fp16 rounding of the
    scale and zero point (relative 2**-11 each, the scale's error multiplied by the code)."""
    levels = (1 << bits) - 1
    mn = x.min(axis=axis, keepdims=True)
    mx = x.max(axis=axis, keepdims=True)
    step = (mx - mn) / levels
    eps16 = 2.0 ** -11
    return 0.5 * step * (1 + eps16) + levels * step * eps16 + np.abs(mn) * eps16 + 1e-7


def full_window_bytes(window: int, head_dim: int) -> int:
    """Bytes of K and V of one window of one KV head at full precision (fp16)."""
    return 2 * window * head_dim * FULL_BYTES_PER_ELEM


def quant_window_bytes(window: int, head_dim: int, bits: int, group: int) -> int:
    """Bytes of K and V of one window of one KV head quantized KIVI-style (codes + scales + zeros)."""
    _check(bits, group, window, "window length in tokens")
    _check(bits, group, head_dim, "head dimension")
    codes = 2 * window * head_dim * bits // 8
    k_groups = head_dim * (window // group)
    v_groups = window * (head_dim // group)
    return codes + 2 * META_BYTES * (k_groups + v_groups)
