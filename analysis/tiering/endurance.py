"""The write path of a KV tier: bytes written, drive endurance, wear cost, reads under mixed load.

**Bytes written.** The tiers of :mod:`analysis.tiering.hitcurve` are one LRU stack cut at the
cumulative capacities ``E_1 < E_2 < ...`` (exclusive tiers; a block evicted from a tier is demoted,
i.e. *written*, to the next). After an access a block is on top of the stack; it sinks one place
for every distinct other block used after it, so it is written into tier ``j`` (crosses depth
``E_{j-1}``) before its next use iff that next use's stack distance exceeds ``E_{j-1}``; a block never
used again crosses iff at least ``E_{j-1}`` distinct other blocks are used after it. Every access
therefore adds at most one write per tier boundary, counted exactly from the one-pass stack
distances (:func:`written_tokens`; a slow explicit-stack reference checks it in the tests).

**Endurance.** A drive is rated for ``DWPD`` full-capacity writes a day over its warranty:
``TBW = DWPD x capacity x warranty days`` (bytes of host writes at the rating workload). KV blocks
are large sequential writes; ``write_amplification`` scales host bytes to rated-workload bytes
(1.0: the rating as is, conservative; the Micron 9550's sequential TBW is twice its random one,
which corresponds to 0.5). Cost per byte written = drive price / TBW.

**Wear cost.** A drive is replaced at the end of its amortisation period or when its rated bytes
are written, whichever comes first, so over a span in which it is used for ``T`` instance-seconds
and absorbs ``W`` host bytes its capital cost is ``max(T x capex/lifetime, W x WAF x price/TBW)``:
*endurance decides* when the second term is the larger.

**Reads under mixed load.** Writes take drive time from reads. With read and write bandwidths
``R`` and ``W`` a drive serves reads at ``r`` and writes at ``w`` while
``r / R + k w / W <= 1``; ``k >= 1`` is the read slowdown writes cause beyond their own time (garbage
collection, program/erase suspends), derived from a datasheet's mixed 70/30 random IOPS figure
``X`` with ``k = (1 - 0.7 X / R_iops) / (0.3 X / W_iops)`` (:func:`write_interference`).
"""
from __future__ import annotations

import math

import numpy as np

from ..specs import hardware as _hw
from ..traces import Trace
from .hitcurve import HitCurve
from .policies import next_use

SSD_KEYS = ("nvme", "qlc", "ai_ssd")
REFERENCE_INTERFERENCE_DRIVE = "Micron-9550-MAX-25.6TB"  # used for drives without a 70/30 figure


def crossings(trace: Trace, hc: HitCurve, edge_blocks) -> np.ndarray:
    """Boolean array ``(n_edges, n_accesses)``: access ``t``'s block sinks below depth ``edge`` before
    its next use (or before the trace ends)."""
    edges = np.atleast_1d(np.asarray(edge_blocks, dtype=float))
    n = trace.n_blocks
    nxt = next_use(trace.block_ids)
    reused = nxt < n
    d_next = np.where(reused, hc.distance[np.minimum(nxt, n - 1)] if n else 0, 0)
    last = ~reused
    # distinct blocks used after t = blocks whose last use is after t
    after = int(last.sum()) - np.cumsum(last)
    out = np.empty((edges.size, n), dtype=bool)
    for i, e in enumerate(edges):
        out[i] = np.where(reused, d_next > e, after >= e) if e > 0 else True
    return out


def written_tokens(trace: Trace, hc: HitCurve, tier_blocks) -> np.ndarray:
    """Tokens written into each tier over the trace (exclusive LRU tiers, write on demotion).

    ``tier_blocks``: capacities (blocks) fastest first. The first tier (HBM) is where blocks are
    computed; its entry counts nothing. A tier of zero capacity is passed straight through."""
    caps = np.asarray(tier_blocks, dtype=float)
    if caps.ndim != 1 or np.any(caps < 0) or np.any(np.isnan(caps)):
        raise ValueError(f"tier capacities must be a list of numbers >= 0, got {tier_blocks!r}")
    out = np.zeros(caps.size)
    if caps.size < 2 or trace.n_blocks == 0:
        return out
    edges = np.cumsum(caps)[:-1]
    cr = crossings(trace, hc, edges)
    tok = trace.block_tokens.astype(float)
    for j in range(1, caps.size):
        if caps[j] > 0:
            out[j] = float(tok[cr[j - 1]].sum())
    return out


def write_interference(name: str) -> float:
    """``k`` of the mixed-load rule from a drive's 4 KiB random read, write and 70/30 IOPS."""
    s = _hw(name, "ssd")
    if not all(q in s.values for q in ("random_read_iops", "random_write_iops", "mixed_70_30_iops")):
        s = _hw(REFERENCE_INTERFERENCE_DRIVE, "ssd")
    x, r, w = s["mixed_70_30_iops"], s["random_read_iops"], s["random_write_iops"]
    return max(1.0, (1.0 - 0.7 * x / r) / (0.3 * x / w))


def read_factor(write_rate, write_bw, interference):
    """Fraction of its read bandwidth a drive keeps while absorbing ``write_rate`` bytes/s (of its
    ``write_bw``); 0 when the writes alone saturate it."""
    share = interference * np.asarray(write_rate, dtype=float) / write_bw
    return np.clip(1.0 - share, 0.0, 1.0)


def drive_rating(name: str, dwpd=None, write_bw=None) -> dict:
    """Endurance and write bandwidth of one drive (datasheet values unless overridden); clear errors
    for a drive that cannot hold a written tier."""
    s = _hw(name, "ssd")
    missing = [q for q in ("dwpd", "warranty", "seq_write") if q not in s.values]
    if missing and (dwpd is None or write_bw is None or "warranty" in missing):
        raise ValueError(f"drive {name!r} has no {', '.join(missing)} in data/hardware.csv: add the rows "
                         f"(with a source) or give the endurance and write bandwidth as parameters")
    dw = float(s["dwpd"] if dwpd is None else dwpd)
    wb = float(s["seq_write"] if write_bw is None else write_bw)
    if not (math.isfinite(dw) and dw > 0):
        raise ValueError(f"drive {name!r}: endurance must be > 0 drive writes per day, got {dw!r}; a drive "
                         f"that cannot be written cannot hold a KV tier (drop the tier or fix its rating)")
    if not (math.isfinite(wb) and wb > 0):
        raise ValueError(f"drive {name!r}: write bandwidth must be > 0 bytes/s, got {wb!r}")
    warranty = float(s["warranty"])
    tbw = dw * s["capacity"] * warranty / 86400.0
    return {"dwpd": dw, "warranty_s": warranty, "write_bw": wb, "tbw_bytes": tbw, "capacity": s["capacity"]}
