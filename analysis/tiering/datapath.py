"""Small random reads from SSD tiers, and recall of evicted KV with prefetch one layer ahead.

Loading a cached prefix reads long runs of KV (a 512-token block of one layer is megabytes) at the
drive's sequential bandwidth. Recalling *selected* KV (chapter 5: a 32-token window of one layer and
one KV head is a few KiB to tens of KiB) is a stream of small random reads, bounded by the drive's
IOPS as well as its bandwidth:

* one read of ``u`` bytes occupies one I/O slot, so ``d`` drives deliver
  ``min(d x seq_read, d x IOPS_4K x u / ceil(u / 4 KiB))`` bytes/s of ``u``-byte reads (4 KiB random
  read IOPS from the datasheet; a read larger than 4 KiB costs one slot per 4 KiB page), times
  ``bw_eff``;
* a batch of reads issued together pays the drive's read latency once (enough queue depth).

:func:`recall_time` prices ``n`` such reads per layer for ``layers`` layers: without prefetch every
layer waits for its reads; with prefetch one layer ahead, the reads of layer ``l + 1`` overlap the
computation of layer ``l`` and only the excess stalls.
"""
from __future__ import annotations

import math

import numpy as np

from ..specs import hardware as _hw

PAGE = 4096


def random_read_bandwidth(drive: str, unit_bytes, drives: int = 1, bw_eff: float = 0.8):
    """Bytes/s that ``drives`` drives deliver as random reads of ``unit_bytes`` each."""
    u = np.asarray(unit_bytes, dtype=float)
    if np.any(u <= 0) or drives < 1:
        raise ValueError(f"unit_bytes must be > 0 and drives >= 1, got {unit_bytes!r}, {drives!r}")
    s = _hw(drive, "ssd")
    if "random_read_iops" not in s.values:
        raise ValueError(f"drive {drive!r} has no random_read_iops in data/hardware.csv")
    seq = drives * min(s["seq_read"], s.values.get("interface_bandwidth", math.inf))
    iops = drives * s["random_read_iops"] * u / np.ceil(u / PAGE)
    out = bw_eff * np.minimum(seq, iops)
    return out if out.ndim else float(out)


def read_batch_time(drive: str, unit_bytes, n_units, drives: int = 1, bw_eff: float = 0.8):
    """Seconds to read ``n_units`` random units of ``unit_bytes`` issued together (one latency)."""
    n = np.asarray(n_units, dtype=float)
    if np.any(n < 0):
        raise ValueError(f"n_units must be >= 0, got {n_units!r}")
    lat = _hw(drive, "ssd")["read_latency"]
    t = np.where(n > 0, lat + n * np.asarray(unit_bytes, dtype=float)
                 / random_read_bandwidth(drive, unit_bytes, drives, bw_eff), 0.0)
    return t if t.ndim else float(t)


def recall_time(drive: str, unit_bytes, units_per_layer, layers: int, compute_per_layer_s=0.0, *,
                drives: int = 1, bw_eff: float = 0.8, prefetch: bool = True):
    """Stall (seconds) that recalling ``units_per_layer`` random units per layer adds to a forward
    pass of ``layers`` layers, each computing for ``compute_per_layer_s``. With ``prefetch`` the
    first layer's reads are exposed and each later layer stalls by ``max(0, read - compute)``."""
    if int(layers) != layers or layers < 1:
        raise ValueError(f"layers must be an integer >= 1, got {layers!r}")
    r = np.asarray(read_batch_time(drive, unit_bytes, units_per_layer, drives, bw_eff), dtype=float)
    c = np.asarray(compute_per_layer_s, dtype=float)
    if prefetch:
        t = r + (layers - 1) * np.maximum(r - c, 0.0)
    else:
        t = layers * r
    return t if t.ndim else float(t)
