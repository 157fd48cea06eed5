"""Chapter 2's parameter schema: defaults come from the data tables; nonsense is refused early."""
from __future__ import annotations

import pytest

from analysis import params, rerun, specs
from analysis.params import ParameterError
from analysis.tiering import params as tp


def test_defaults_validate_and_build():
    p = params.validate(params.schema("02_ssd_offload"), params.defaults("02_ssd_offload"))
    d = tp.deployment(p)
    econ = tp.economics(p, d)
    assert econ.gpu_usd_per_s == pytest.approx(specs.gpu(p["gpu"])["rent"])
    assert d.nvme_usd_per_byte == pytest.approx(specs.hardware("Micron-9550-MAX-25.6TB")["price_per_capacity"])
    assert d.dram_usd_per_byte == pytest.approx(specs.hardware("DDR5-6400-RDIMM-64GB")["price_per_capacity"])


@pytest.mark.parametrize("bad,msg", [
    ({"tp": 0}, "tp"), ({"compute_eff": 1.5}, "compute_eff"), ({"configs": ["tape"]}, "configs"),
    ({"gpu": "H900"}, "allowed: A800"), ({"data_path": "pigeon"}, "data_path"), ({"ai_ssd_bits": 7}, "ai_ssd_bits"),
    ({"slo_ttft_s": 0.0}, "slo_ttft_s"), ({"nvme_usd_per_tb": -1.0}, "nvme_usd_per_tb"),
    ({"policies": ["fifo"]}, "policies"), ({"bogus": 1}, "unknown parameter"),
])
def test_nonsense_is_refused_before_running(bad, msg):
    with pytest.raises(ParameterError, match=msg):
        rerun.prepare("book/02_ssd_offload.md", bad)


def test_gpu_rent_override_and_own_basis():
    p = params.validate(params.schema("02_ssd_offload"), params.defaults("02_ssd_offload"))
    d = tp.deployment(p)
    assert tp.economics({**p, "gpu_rent_usd_per_hour": 3.6}, d).gpu_usd_per_s == pytest.approx(1e-3)
    own = tp.economics({**p, "gpu_cost_basis": "own"}, d).gpu_usd_per_s
    assert 0 < own < tp.economics(p, d).gpu_usd_per_s * 10
