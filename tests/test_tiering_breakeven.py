"""Chapter 2's solves, moved out of the chapter: break-even price, data-path knee, endurance map,
tornado with routing."""
from __future__ import annotations

import numpy as np
import pytest

from analysis.tiering import load_trace, lru_hit_curve
from analysis.tiering import replay as R
from analysis.tiering import tiers as T


@pytest.fixture(scope="module")
def small():
    tr = load_trace("mooncake_conversation").head(1500)
    return tr, lru_hit_curve(tr)


def test_breakeven_price_is_the_zero_of_the_grid(small):
    tr, hc = small
    d = T.Deployment(local_dram_bytes=50e9, nvme_drives=4)
    econ = R.Economics(T.gpu_usd_per_s(d), 5.0)
    p = R.breakeven_price(tr, hc, d, econ, 14.0)
    assert np.isfinite(p) and p > 0
    grid, _ = R.breakeven_grid(tr, hc, d, econ, [p * 0.5, p, p * 2], [14.0])
    assert grid[0, 0] < 0 < grid[0, 2]
    assert abs(grid[0, 1]) < 1e-9 * max(1.0, abs(grid[0, 0]))
    # a tier that cannot pay even when free: no break-even price
    bad = d.replace(nvme_dwpd=1e-6)
    pb = R.breakeven_price(tr, hc, bad, econ, 0.5)
    assert np.isnan(pb) or pb < p


def test_scaling_knee_closed_form():
    d = T.Deployment()
    n, bw = T.scaling_knee(d, "cpu_bounce")
    cores = d.bw_eff * d.cpu_copy_cores * d.cpu_copy_bw_per_core
    assert bw == pytest.approx(min(cores, d.bw_eff * d.host_dram_bw / 2, d.bw_eff * d.gpu_link_bw))
    one = T.build_tier("nvme", d.replace(nvme_drives=1, data_path="cpu_bounce")).bandwidth
    assert n == int(np.ceil(bw / one - 1e-9))
    nd, bwd = T.scaling_knee(d, "gpu_direct")
    assert bwd == pytest.approx(d.bw_eff * d.gpu_link_bw) and nd >= n


def test_endurance_grid_monotone(small):
    tr, hc = small
    d = T.Deployment(local_dram_bytes=50e9, nvme_drives=4)
    econ = R.Economics(T.gpu_usd_per_s(d), 5.0)
    g, base = R.endurance_grid(tr, hc, d, econ, [0.1, 1.0, 3.0, 10.0], [50.0, 150.0, 600.0])
    assert np.all(np.diff(g, axis=0) <= 1e-12)   # more endurance never costs more
    assert np.all(np.diff(g, axis=1) >= -1e-12)  # dearer drives never cost less
    assert g[0, -1] > g[-1, -1]                  # wear binds at low endurance


def test_tornado_routing_and_endurance_factors(small):
    tr, hc = small
    d = T.Deployment(local_dram_bytes=50e9, nvme_drives=4)
    econ = R.Economics(T.gpu_usd_per_s(d), 5.0)
    rows, base = R.tornado(tr, hc, d, econ, "nvme", {
        "routing": ("routing", "ideal", "round_robin"),
        "WAF": ("write_amplification", 1.0, 3.0),
        "DWPD": ("nvme_dwpd", 0.3, 3.0)})
    by = {r["input"]: r for r in rows}
    assert by["routing"]["cost_low"] == pytest.approx(base)
    assert by["WAF"]["cost_high"] >= by["WAF"]["cost_low"]
    assert by["DWPD"]["cost_low"] >= by["DWPD"]["cost_high"]
