"""Small random reads by IOPS and latency, and recall with prefetch one layer ahead."""
from __future__ import annotations

import pytest

from analysis.specs import hardware
from analysis.tiering import datapath as D

NV = "Micron-9550-MAX-25.6TB"
QLC = "Solidigm-D5-P5336-122.88TB"


def test_random_read_bandwidth_closed_form():
    s = hardware(QLC, "ssd")
    # 4 KiB reads on the QLC drive are IOPS-bound, below its sequential bandwidth
    assert D.random_read_bandwidth(QLC, 4096, bw_eff=1.0) == pytest.approx(s["random_read_iops"] * 4096)
    assert D.random_read_bandwidth(QLC, 4096, bw_eff=1.0) < s["seq_read"]
    # a 2 KiB read costs a whole I/O slot: half the bytes per second
    assert D.random_read_bandwidth(QLC, 2048, bw_eff=1.0) == pytest.approx(s["random_read_iops"] * 2048)
    # large reads reach the sequential ceiling; more drives scale it
    n = hardware(NV, "ssd")
    big = D.random_read_bandwidth(NV, 1 << 20, drives=2, bw_eff=1.0)
    assert big == pytest.approx(2 * min(n["seq_read"], n["random_read_iops"] * 4096))
    with pytest.raises(ValueError, match="unit_bytes"):
        D.random_read_bandwidth(NV, 0)


def test_recall_time_prefetch_hides_reads_behind_compute():
    u, k, L = 16384, 64, 80
    r = D.read_batch_time(NV, u, k)
    assert r == pytest.approx(hardware(NV, "ssd")["read_latency"] + k * u / D.random_read_bandwidth(NV, u))
    assert D.recall_time(NV, u, k, L, prefetch=False) == pytest.approx(L * r)
    assert D.recall_time(NV, u, k, L, compute_per_layer_s=10 * r) == pytest.approx(r)  # fully hidden
    half = D.recall_time(NV, u, k, L, compute_per_layer_s=r / 2)
    assert half == pytest.approx(r + (L - 1) * r / 2)
    assert D.read_batch_time(NV, u, 0) == 0.0
    with pytest.raises(ValueError, match="layers"):
        D.recall_time(NV, u, k, 0)
