"""The library objects of chapter 2's typed configuration (:class:`~analysis.tiering.params.TieringConfig`,
made by ``analysis.tiering.params.SCHEMA.config(values)``): the tier deployment, the economics of
the replay, and the checks that need the trace."""
from __future__ import annotations

from .cluster import check as _check_routing
from .params import Hardware, Prices, TieringConfig, Tiers
from .replay import Economics
from .tiers import YEAR_S, Deployment, gpu_usd_per_s


def deployment(c: TieringConfig) -> Deployment:
    """The :class:`~analysis.tiering.tiers.Deployment` (SI units) of a configuration: its hardware,
    tiers, prices and write path."""
    h: Hardware = c.hardware
    t: Tiers = c.tiers
    pr: Prices = c.prices
    e = c.endurance
    return Deployment(
        model=h.model,
        gpu=h.gpu,
        tp=h.tp,
        kv_dtype=h.kv_dtype,
        compute_eff=h.compute_eff,
        bw_eff=h.bw_eff,
        hbm_cache_fraction=h.hbm_cache_fraction,
        gpus_per_pcie_switch=h.gpus_per_pcie_switch,
        local_dram_bytes=t.local_dram_gb * 1e9,
        dram_usd_per_byte=pr.dram_usd_per_gb * 1e-9,
        cxl_devices=t.cxl_devices,
        cxl_usd_per_byte=pr.cxl_usd_per_gb * 1e-9,
        pool_nodes=t.pool_nodes,
        pool_bytes_per_node=t.pool_gb_per_node * 1e9,
        nics_per_instance=t.nics_per_instance,
        nvme_drives=t.nvme_drives,
        nvme_usd_per_byte=pr.nvme_usd_per_tb * 1e-12,
        qlc_drives=t.qlc_drives,
        qlc_usd_per_byte=pr.qlc_usd_per_tb * 1e-12,
        ai_ssd_drives=t.ai_ssd_drives,
        ai_ssd_usd_per_byte=pr.ai_ssd_usd_per_tb * 1e-12,
        ai_ssd_bits=t.ai_ssd_bits,
        data_path=t.data_path,
        cpu_copy_cores=t.cpu_copy_cores,
        cpu_copy_bw_per_core=t.cpu_copy_gb_s_per_core * 1e9,
        storage_lifetime_s=pr.storage_lifetime_years * YEAR_S,
        electricity_usd_per_j=pr.electricity_usd_per_kwh / 3.6e6,
        pue=pr.pue,
        write_amplification=e.write_amplification,
        mixed_interference=e.mixed_interference,
        nvme_dwpd=e.nvme_dwpd,
        qlc_dwpd=e.qlc_dwpd,
        nvme_write_bw=e.nvme_write_gb_s * 1e9,
    ).validate()


def economics(c: TieringConfig, d: Deployment) -> Economics:
    """The :class:`~analysis.tiering.replay.Economics` of a configuration on deployment ``d``."""
    gpu_s = gpu_usd_per_s(d, c.prices.gpu_cost_basis, c.prices.gpu_rent_usd_per_hour / 3600.0)
    s = c.service
    return Economics(gpu_s, s.slo_ttft_s, s.attainment_target, c.workload.load_scale, s.chunk_tokens)


def check_against_trace(c: TieringConfig, trace) -> None:
    """Checks that need the trace, run as soon as it is read (before any simulation): the routing
    study's cluster sizes must not exceed the trace's requests."""
    too_big = [n for n in c.routing.routing_instances if n > trace.n_requests]
    if too_big:
        raise ValueError(
            f"routing_instances {too_big} exceed the trace's {trace.n_requests} requests "
            f"(trace_requests = {c.workload.trace_requests}): use at most {trace.n_requests} "
            f"instances"
        )
    for pol in c.routing.routing_policies:
        _check_routing(trace, 1, pol, 0)
    if c.routing.fig10_instances > trace.n_requests:
        raise ValueError(
            f"fig10_instances = {c.routing.fig10_instances} exceeds the trace's {trace.n_requests} requests "
            f"(trace_requests = {c.workload.trace_requests}): use at most {trace.n_requests} instances or "
            f"more requests"
        )
