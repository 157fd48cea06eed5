"""Chapter 2's parameter schema: defaults come from the data tables; nonsense is refused early; the
typed configuration builds the deployment and the economics."""
from __future__ import annotations

import dataclasses

import pytest

from analysis import rerun, specs
from analysis.params import ParameterError
from analysis.tiering import configure as cf
from analysis.tiering import params as tp


def test_defaults_validate_and_build():
    c = tp.SCHEMA.config()
    d = cf.deployment(c)
    econ = cf.economics(c, d)
    assert econ.gpu_usd_per_s == pytest.approx(specs.gpu(c.hardware.gpu)["rent"])
    assert d.nvme_usd_per_byte == pytest.approx(
        specs.hardware("Micron-9550-MAX-25.6TB")["price_per_capacity"]
    )
    assert d.dram_usd_per_byte == pytest.approx(specs.hardware("DDR5-6400-RDIMM-64GB")["price_per_capacity"])


def test_every_parameter_of_the_deployment_reaches_it():
    """Changing any hardware, tier, price or write-path parameter changes the deployment (none is
    dropped on the way, none is replaced by a default of its own)."""
    base = tp.SCHEMA.defaults()
    d0 = cf.deployment(tp.SCHEMA.config(base))
    changes = dict(tp=4, gpus_per_pcie_switch=2, kv_dtype="fp8", compute_eff=0.4, bw_eff=0.7,
                   hbm_cache_fraction=0.4, local_dram_gb=500.0, cxl_devices=2, pool_nodes=8,
                   pool_gb_per_node=500.0, nics_per_instance=4, nvme_drives=3, qlc_drives=2, ai_ssd_drives=2,
                   ai_ssd_bits=8, data_path="cpu_bounce", cpu_copy_cores=4, cpu_copy_gb_s_per_core=4.0,
                   dram_usd_per_gb=5.0, cxl_usd_per_gb=6.0, nvme_usd_per_tb=100.0, qlc_usd_per_tb=50.0,
                   ai_ssd_usd_per_tb=100.0, electricity_usd_per_kwh=0.2, pue=1.5, storage_lifetime_years=3.0,
                   write_amplification=2.0, nvme_dwpd=1.0, qlc_dwpd=0.3, nvme_write_gb_s=5.0,
                   mixed_interference=1.0, model="Llama-3.1-8B", gpu="H100-SXM5-80GB")
    for k, v in changes.items():
        assert v != base[k], k
        assert cf.deployment(tp.SCHEMA.config({**base, k: v})) != d0, f"{k} does not reach the deployment"
    econ0 = cf.economics(tp.SCHEMA.config(base), d0)
    for k, v in dict(slo_ttft_s=2.0, attainment_target=0.5, load_scale=2.0, chunk_tokens=0).items():
        assert cf.economics(tp.SCHEMA.config({**base, k: v}), d0) != econ0, k


def test_configuration_groups_every_parameter_once():
    c = tp.SCHEMA.config()
    names = [f.name for g in dataclasses.fields(c) for f in dataclasses.fields(getattr(c, g.name))]
    assert sorted(names) == sorted(tp.SCHEMA) and len(names) == len(set(names))
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.prices.pue = 2.0


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
    with pytest.raises(ParameterError, match=msg):
        tp.SCHEMA.config(bad)


def test_gpu_rent_override_and_own_basis():
    p = tp.SCHEMA.defaults()
    c = tp.SCHEMA.config(p)
    d = cf.deployment(c)
    rent = cf.economics(tp.SCHEMA.config({**p, "gpu_rent_usd_per_hour": 3.6}), d).gpu_usd_per_s
    assert rent == pytest.approx(1e-3)
    own = cf.economics(tp.SCHEMA.config({**p, "gpu_cost_basis": "own"}), d).gpu_usd_per_s
    assert 0 < own < cf.economics(c, d).gpu_usd_per_s * 10


def test_zero_endurance_and_too_many_instances_fail_before_work():
    from analysis.tiering import from_requests

    p = tp.SCHEMA.defaults()
    for k in ("nvme_dwpd", "qlc_dwpd", "nvme_write_gb_s"):
        with pytest.raises(ValueError, match=k.replace("_gb_s", "")):
            cf.deployment(tp.SCHEMA.config({**p, k: 0.0}))
    tr = from_requests([{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}] * 3)
    with pytest.raises(ValueError, match="exceed the trace's 3 requests"):
        cf.check_against_trace(tp.SCHEMA.config({**p, "routing_instances": [1, 4]}), tr)
    with pytest.raises(ValueError, match="fig10_instances = 4 exceeds the trace's 3 requests"):
        cf.check_against_trace(tp.SCHEMA.config({**p, "routing_instances": [1, 3], "fig10_instances": 4}), tr)
    cf.check_against_trace(tp.SCHEMA.config({**p, "routing_instances": [1, 3], "fig10_instances": 3}), tr)


def test_deployment_dataclass_defaults_are_the_chapter_defaults():
    """``tiers.Deployment()`` (the unit tests' and the models' starting point) is chapter 2's default
    deployment: its field defaults may not drift from the schema's (None: the drive's datasheet value,
    which is what the schema's default reads from data/hardware.csv)."""
    from analysis.tiering import tiers

    ch2, bare = cf.deployment(tp.SCHEMA.config()), tiers.Deployment()
    for f in dataclasses.fields(bare):
        a, b = getattr(ch2, f.name), getattr(bare, f.name)
        if b is None:
            continue
        assert a == (pytest.approx(b, rel=1e-12) if isinstance(b, float) else b), f.name
    assert ch2.nvme_dwpd == specs.hardware(bare.nvme_name)["dwpd"]
    assert ch2.qlc_dwpd == specs.hardware(bare.qlc_name)["dwpd"]
    assert ch2.nvme_write_bw == pytest.approx(specs.hardware(bare.nvme_name)["seq_write"])
