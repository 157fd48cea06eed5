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
    assert d.nvme_usd_per_byte == pytest.approx(
        specs.hardware("Micron-9550-MAX-25.6TB")["price_per_capacity"]
    )
    assert d.dram_usd_per_byte == pytest.approx(specs.hardware("DDR5-6400-RDIMM-64GB")["price_per_capacity"])


@pytest.mark.parametrize(
    "bad,msg",
    [
        ({"tp": 0}, "tp"),
        ({"compute_eff": 1.5}, "compute_eff"),
        ({"configs": ["tape"]}, "configs"),
        ({"gpu": "H900"}, "allowed: A800"),
        ({"data_path": "pigeon"}, "data_path"),
        ({"ai_ssd_bits": 7}, "ai_ssd_bits"),
        ({"slo_ttft_s": 0.0}, "slo_ttft_s"),
        ({"nvme_usd_per_tb": -1.0}, "nvme_usd_per_tb"),
        ({"policies": ["fifo"]}, "policies"),
        ({"bogus": 1}, "unknown parameter"),
        ({"nvme_write_gb_s": -1.0}, "nvme_write_gb_s"),
        ({"routing_policies": ["sticky"]}, "routing_policies"),
        ({"admission_runs": ["lru+maybe"]}, "admission_runs"),
    ],
)
def test_nonsense_is_refused_before_running(bad, msg):
    with pytest.raises(ParameterError, match=msg):
        rerun.prepare("book/02_ssd_offload.md", bad)


def test_gpu_rent_override_and_own_basis():
    p = params.validate(params.schema("02_ssd_offload"), params.defaults("02_ssd_offload"))
    d = tp.deployment(p)
    assert tp.economics({**p, "gpu_rent_usd_per_hour": 3.6}, d).gpu_usd_per_s == pytest.approx(1e-3)
    own = tp.economics({**p, "gpu_cost_basis": "own"}, d).gpu_usd_per_s
    assert 0 < own < tp.economics(p, d).gpu_usd_per_s * 10


def test_zero_endurance_and_too_many_instances_fail_before_work():
    from analysis.tiering import from_requests

    p = params.validate(params.schema("02_ssd_offload"), params.defaults("02_ssd_offload"))
    for k in ("nvme_dwpd", "qlc_dwpd", "nvme_write_gb_s"):
        with pytest.raises(ValueError, match=k.replace("_gb_s", "")):
            tp.deployment({**p, k: 0.0})
    tr = from_requests([{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}] * 3)
    with pytest.raises(ValueError, match="exceed the trace's 3 requests"):
        tp.check_against_trace({**p, "routing_instances": [1, 4]}, tr)
    tp.check_against_trace({**p, "routing_instances": [1, 3]}, tr)
