"""KV-cache tiers of one prefill instance: capacity, delivered bandwidth, data path and cost.

A :class:`Deployment` holds every input (SI units; prices in USD per byte; defaults read from
``data/hardware.csv`` by :mod:`analysis.tiering.params`). :func:`build_tiers` turns it into the tier
list of a named configuration (``CONFIGS``), fastest first:

* ``hbm``     the share of the instance's HBM left for prefix KV after the weights (no load cost);
* ``dram``    local host DRAM, read by the GPUs' DMA engines over their host links (PCIe);
* ``cxl``     CXL memory expanders on the host (read like DRAM, at the expanders' bandwidth);
* ``pool``    pooled DRAM of ``pool_nodes`` hosts (Mooncake Store), read over the RDMA NICs;
* ``nvme``    local enterprise NVMe Gen5 TLC drives; ``qlc`` high-capacity QLC drives;
* ``ai_ssd``  the seed's AI SSDs, which quantize KV in the drive: bytes on disk and over PCIe shrink
  by ``16 / ai_ssd_bits`` (the GPU dequantizes; the drive's TOPS are checked in
  :func:`ai_ssd_plausibility`).

Two data paths for storage and remote tiers (``data_path``):

* ``gpu_direct``: GPUDirect Storage / GPU-initiated I/O / GPUDirect RDMA, device -> HBM, limited by
  the devices and the GPUs' host links;
* ``cpu_bounce``: device -> host DRAM bounce buffer -> HBM: the bytes cross host DRAM twice (write
  and read) and are copied by ``cpu_copy_cores`` cores at ``cpu_copy_bw_per_core`` each; the
  delivered bandwidth is the minimum of all these.

Costs per second: capital cost amortised linearly over ``storage_lifetime_s`` plus energy
(power x PUE x electricity price). NICs and host CPUs are assumed present anyway (they serve the
prefill-decode transfer), so only the cache media are charged; GPUs are charged in
:mod:`analysis.tiering.replay`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .. import kv
from ..specs import gpu as _gpu
from ..specs import hardware as _hw
from ..specs import model as _model
from . import endurance as _endurance

YEAR_S = 365.25 * 86400.0

CONFIGS = {
    "hbm": ("HBM only", ("hbm",)),
    "dram": ("+ local DRAM", ("hbm", "dram")),
    "cxl": ("+ local DRAM + CXL", ("hbm", "dram", "cxl")),
    "pool": ("+ pooled DRAM (Mooncake Store)", ("hbm", "pool")),
    "nvme": ("+ local DRAM + NVMe Gen5", ("hbm", "dram", "nvme")),
    "qlc": ("+ local DRAM + QLC", ("hbm", "dram", "qlc")),
    "ai_ssd": ("+ local DRAM + AI SSD (in-drive quant.)", ("hbm", "dram", "ai_ssd")),
}
DATA_PATHS = ("gpu_direct", "cpu_bounce")


@dataclass(frozen=True)
class Deployment:
    """Every input of the tier and cost model (SI units)."""

    model: str = "Llama-3.1-70B"
    gpu: str = "H800-SXM5-80GB"
    tp: int = 8                               # GPUs per prefill instance
    gpus_per_pcie_switch: int = 1             # GPUs sharing one PCIe switch uplink to the host
    kv_dtype: str = "bf16"
    weight_dtype: str = "bf16"
    compute_eff: float = 0.5                  # achieved fraction of peak FLOP/s in prefill
    bw_eff: float = 0.8                       # achieved fraction of peak bandwidth of every link/device
    hbm_cache_fraction: float = 0.5           # share of HBM left after weights that holds prefix KV
    local_dram_bytes: float = 1.0e12          # host DRAM per instance given to the KV cache
    dram_usd_per_byte: float = 10e-9
    dram_name: str = "DDR5-6400-RDIMM-64GB"
    cxl_name: str = "Micron-CZ120-256GB"
    cxl_devices: int = 4
    cxl_usd_per_byte: float = 12e-9
    pool_nodes: int = 16                      # hosts contributing DRAM to the pool
    pool_bytes_per_node: float = 1.0e12
    nic_name: str = "ConnectX-7-400G"
    nics_per_instance: int = 8
    nvme_name: str = "Micron-9550-MAX-25.6TB"
    nvme_drives: int = 2
    nvme_usd_per_byte: float = 150e-12
    nvme_bw_override: float = 0.0             # bytes/s per drive; 0 = the drive's seq_read
    qlc_name: str = "Solidigm-D5-P5336-122.88TB"
    qlc_drives: int = 1
    qlc_usd_per_byte: float = 90e-12
    ai_ssd_name: str = "AI-SSD-STAR-seed"
    ai_ssd_drives: int = 1
    ai_ssd_usd_per_byte: float = 200e-12
    ai_ssd_bits: int = 4
    data_path: str = "gpu_direct"
    cpu_copy_cores: int = 8
    cpu_copy_bw_per_core: float = 8e9         # bytes/s one core copies (memcpy, estimate)
    rdma_latency_s: float = 10e-6
    storage_lifetime_s: float = 5 * YEAR_S
    electricity_usd_per_j: float = 0.10 / 3.6e6
    pue: float = 1.3
    write_amplification: float = 1.0          # NAND bytes per host byte, relative to the DWPD rating workload
    mixed_interference: float = 0.0           # k of the mixed read/write rule; 0 = from the drive's datasheet
    nvme_dwpd: float | None = None            # None = the drive's datasheet rating
    qlc_dwpd: float | None = None
    ai_ssd_dwpd: float | None = None
    nvme_write_bw: float | None = None        # bytes/s per drive; None = the drive's seq_write

    def replace(self, **changes) -> "Deployment":
        new = dataclasses.replace(self, **changes)
        new.validate()
        return new

    def validate(self) -> "Deployment":
        bad = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if not math.isfinite(v) or v < 0:
                    bad.append(f"{f.name} must be finite and >= 0, got {v!r}")
        if int(self.gpus_per_pcie_switch) != self.gpus_per_pcie_switch or self.gpus_per_pcie_switch < 1:
            bad.append(f"gpus_per_pcie_switch must be an integer >= 1, got {self.gpus_per_pcie_switch!r}")
        for f in ("tp", "compute_eff", "bw_eff", "storage_lifetime_s"):
            if getattr(self, f) <= 0:
                bad.append(f"{f} must be > 0, got {getattr(self, f)!r}")
        for f in ("compute_eff", "bw_eff", "hbm_cache_fraction"):
            if getattr(self, f) > 1:
                bad.append(f"{f} is a fraction and must be <= 1, got {getattr(self, f)!r}")
        if self.ai_ssd_bits not in (2, 3, 4, 5, 6, 8, 16):
            bad.append(f"ai_ssd_bits must be one of 2, 3, 4, 5, 6, 8, 16, got {self.ai_ssd_bits!r}")
        if self.data_path not in DATA_PATHS:
            bad.append(f"data_path must be one of {DATA_PATHS}, got {self.data_path!r}")
        if self.write_amplification <= 0:
            bad.append(f"write_amplification must be > 0, got {self.write_amplification!r}")
        for f in ("nvme_dwpd", "qlc_dwpd", "ai_ssd_dwpd", "nvme_write_bw"):
            v = getattr(self, f)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                what = "endurance (drive writes per day)" if "dwpd" in f else "write bandwidth (bytes/s)"
                bad.append(f"{f} must be a {what} > 0 (or None for the datasheet value), got {v!r}")
        if self.pue < 1:
            bad.append(f"pue must be >= 1, got {self.pue!r}")
        if bad:
            raise ValueError("invalid deployment: " + "; ".join(bad))
        _model(self.model), _gpu(self.gpu)  # unknown names raise UnknownNameError
        return self

    # ------------------------------------------------------------------ derived quantities
    @property
    def kv_bytes_per_token(self) -> float:
        return kv.kv_bytes_per_token_all_layers(self.model, self.kv_dtype)

    @property
    def gpu_link_bw(self) -> float:
        """Host-to-GPU bandwidth of the instance, one direction (bytes/s, peak): one GPU link per PCIe
        switch uplink when ``gpus_per_pcie_switch`` GPUs share a switch (the uplink has the GPU's width)."""
        return math.ceil(self.tp / self.gpus_per_pcie_switch) * _gpu(self.gpu)["pcie_bandwidth"] / 2.0

    @property
    def host_dram_bw(self) -> float:
        d = _hw(self.dram_name, "dram")
        return d["bandwidth_per_socket"] * d["sockets_per_node"]


@dataclass(frozen=True)
class Tier:
    """One tier as the replay sees it."""

    key: str
    name: str
    capacity_tokens: float      # KV tokens it holds
    bandwidth: float            # stored bytes per second delivered to the instance's GPUs
    bytes_per_token: float      # stored bytes per KV token (smaller when quantized)
    latency_s: float            # fixed cost of a load from this tier
    usd_per_s: float            # amortised capex + energy of the tier
    local: bool                 # one per instance (True) or shared by the cluster (False)
    path: str
    limit: str                  # what bounds the bandwidth
    capex_usd_per_s: float = 0.0        # the capital part of usd_per_s (amortised over the lifetime)
    usd_per_byte_written: float = 0.0   # wear: price / rated bytes written x write amplification (0: no wear)
    write_bw: float = math.inf          # bytes/s the tier absorbs (all drives; before mixed-load sharing)
    interference: float = 1.0           # k of the mixed read/write rule
    tbw_bytes: float = math.inf         # rated host bytes writable (all drives)
    dwpd: float = 0.0                   # rated drive writes per day (0: not a drive)

    @property
    def token_rate(self) -> float:
        return self.bandwidth / self.bytes_per_token


def energy_usd_per_s(power_w: float, d: Deployment) -> float:
    return power_w * d.pue * d.electricity_usd_per_j


def capex_usd_per_s(capex_usd: float, d: Deployment) -> float:
    return capex_usd / d.storage_lifetime_s


def delivered_bandwidth(device_bw: float, link_bw: float, d: Deployment, path: str | None = None):
    """Bandwidth (bytes/s) a storage/remote device reaches the GPUs with, and what bounds it."""
    path = path or d.data_path
    cands = {"devices": device_bw, "GPU host links": d.gpu_link_bw, "device links": link_bw}
    if path == "cpu_bounce":
        cands["host DRAM (bounce: written and read)"] = d.host_dram_bw / 2.0
        cands["CPU copy cores"] = d.cpu_copy_cores * d.cpu_copy_bw_per_core
    limit = min(cands, key=cands.get)
    return d.bw_eff * cands[limit], limit


def hbm_cache_tokens(d: Deployment) -> float:
    g = _gpu(d.gpu)
    free = d.tp * g["hbm_capacity"] - kv.weight_bytes(d.model, d.weight_dtype)
    return max(free, 0.0) * d.hbm_cache_fraction / d.kv_bytes_per_token


def build_tier(key: str, d: Deployment) -> Tier:
    bpt = d.kv_bytes_per_token
    if key == "hbm":
        return Tier("hbm", "HBM", hbm_cache_tokens(d), math.inf, bpt, 0.0, 0.0, True, "hbm", "on the GPU")
    if key == "dram":
        dr = _hw(d.dram_name, "dram")
        bw = d.bw_eff * min(d.gpu_link_bw, d.host_dram_bw)
        limit = "GPU host links" if d.gpu_link_bw <= d.host_dram_bw else "host DRAM"
        power = d.local_dram_bytes / dr["module_capacity"] * dr["power"]
        capex = capex_usd_per_s(d.local_dram_bytes * d.dram_usd_per_byte, d)
        cost = capex + energy_usd_per_s(power, d)
        return Tier("dram", "local DRAM", d.local_dram_bytes / bpt, bw, bpt, 2e-6, cost, True, "dma", limit,
                    capex)
    if key == "cxl":
        c = _hw(d.cxl_name, "cxl")
        cap = d.cxl_devices * c["capacity"]
        bw = d.bw_eff * min(d.cxl_devices * c["bandwidth"], d.gpu_link_bw)
        limit = "CXL devices" if d.cxl_devices * c["bandwidth"] <= d.gpu_link_bw else "GPU host links"
        capex = capex_usd_per_s(cap * d.cxl_usd_per_byte, d)
        cost = capex + energy_usd_per_s(d.cxl_devices * c["power"], d)
        # a DMA transfer's setup (as for DRAM) plus the expander's extra load latency (measured range)
        lat = 2e-6 + c.values.get("read_latency", 1e-6)
        return Tier("cxl", "CXL memory", cap / bpt, bw, bpt, lat, cost, True, "dma", limit, capex)
    if key == "pool":
        nic = _hw(d.nic_name, "nic")
        dr = _hw(d.dram_name, "dram")
        cap = d.pool_nodes * d.pool_bytes_per_node
        bw, limit = delivered_bandwidth(d.nics_per_instance * nic["bandwidth"], math.inf, d)
        limit = "RDMA NICs" if limit == "devices" else limit
        power = cap / dr["module_capacity"] * dr["power"]
        capex = capex_usd_per_s(cap * d.dram_usd_per_byte, d)
        cost = capex + energy_usd_per_s(power, d)
        return Tier("pool", "pooled DRAM (RDMA)", cap / bpt, bw, bpt, d.rdma_latency_s, cost, False,
                    d.data_path, limit, capex)
    if key in ("nvme", "qlc", "ai_ssd"):
        name = {"nvme": d.nvme_name, "qlc": d.qlc_name, "ai_ssd": d.ai_ssd_name}[key]
        n = {"nvme": d.nvme_drives, "qlc": d.qlc_drives, "ai_ssd": d.ai_ssd_drives}[key]
        price = {"nvme": d.nvme_usd_per_byte, "qlc": d.qlc_usd_per_byte, "ai_ssd": d.ai_ssd_usd_per_byte}[key]
        s = _hw(name, "ssd")
        per_drive = d.nvme_bw_override if (key == "nvme" and d.nvme_bw_override > 0) else s["seq_read"]
        bw, limit = delivered_bandwidth(n * per_drive, n * s["interface_bandwidth"], d)
        limit = "drives" if limit == "devices" else limit
        stored = bpt * (d.ai_ssd_bits / 16.0 if key == "ai_ssd" else 1.0)
        cap = n * s["capacity"]
        capex = capex_usd_per_s(cap * price, d)
        cost = capex + energy_usd_per_s(n * s["power"], d)
        label = {
            "nvme": "NVMe Gen5 TLC",
            "qlc": "QLC",
            "ai_ssd": f"AI SSD (int{d.ai_ssd_bits} in drive)",
        }[key]
        dwpd = {"nvme": d.nvme_dwpd, "qlc": d.qlc_dwpd, "ai_ssd": d.ai_ssd_dwpd}[key]
        rating = _endurance.drive_rating(name, dwpd, d.nvme_write_bw if key == "nvme" else None)
        k = d.mixed_interference if d.mixed_interference > 0 else _endurance.write_interference(name)
        # writes cross the drives (and, on the bounce path, the same host copy) like reads do
        wbw = delivered_bandwidth(n * rating["write_bw"], n * s["interface_bandwidth"], d)[0]
        tbw = n * rating["tbw_bytes"]
        per_byte = (cap * price) / tbw * d.write_amplification if n else 0.0
        return Tier(
            key,
            label,
            cap / stored,
            bw,
            stored,
            s["read_latency"],
            cost,
            True,
            d.data_path,
            limit,
            capex,
            per_byte,
            wbw,
            k,
            tbw,
            rating["dwpd"],
        )
    raise ValueError(f"unknown tier {key!r}; tiers: hbm, dram, cxl, pool, nvme, qlc, ai_ssd")


def build_tiers(config: str, d: Deployment) -> list[Tier]:
    """The tiers of configuration ``config`` (a key of ``CONFIGS``), fastest first."""
    if config not in CONFIGS:
        raise ValueError(f"unknown configuration {config!r}; configurations: {', '.join(CONFIGS)}")
    d.validate()
    return [build_tier(k, d) for k in CONFIGS[config][1]]


def scaling_knee(d: Deployment, path: str, key: str = "nvme", max_drives: int = 256) -> tuple[int, float]:
    """Number of drives after which the delivered bandwidth of tier ``key`` stops growing on data
    path ``path`` (by more than 0.1% per drive), and that bandwidth (bytes/s)."""
    field = {"nvme": "nvme_drives", "qlc": "qlc_drives", "ai_ssd": "ai_ssd_drives"}[key]
    prev = 0.0
    for n in range(1, max_drives + 1):
        b = build_tier(key, d.replace(data_path=path, **{field: n})).bandwidth
        if b <= prev * 1.001:
            return n - 1, prev
        prev = b
    return max_drives, prev


def tier_bandwidths(d: Deployment) -> dict:
    """Delivered bytes/s of each tier kind for one instance (for the load-vs-recompute figure);
    the AI SSD's figure is in *bf16-equivalent* KV bytes (its stored bytes are smaller)."""
    out = {}
    g = _gpu(d.gpu)
    out["HBM (read by the GPUs)"] = d.tp * g["hbm_bandwidth"] * d.bw_eff
    for key in ("dram", "cxl", "pool", "nvme", "qlc", "ai_ssd"):
        t = build_tier(key, d)
        out[t.name] = t.bandwidth * d.kv_bytes_per_token / t.bytes_per_token
    return out


def ai_ssd_plausibility(
    d: Deployment, ops_per_element_quant: float = 8.0, ops_per_element_score: float = 2.0
) -> dict:
    """Physical checks of the seed's AI SSD figures against PCIe 5.0 x4 and its own TOPS.

    Quantizing bf16 KV arriving at line rate costs ``ops_per_element_quant`` operations per element
    (scale, divide, round, clamp, pack); scoring stored keys against a query (an in-drive search)
    ``ops_per_element_score`` (multiply-add) per stored element."""
    s = _hw(d.ai_ssd_name, "ssd")
    link = _hw("PCIe-5.0", "link")["x4_bandwidth"]
    seq = s["seq_read"]
    iops_bytes = s["random_read_iops"] * 4096
    bits = d.ai_ssd_bits
    elems_in_bf16 = seq / 2.0  # bf16 elements/s if bf16 KV arrived at the drive's line rate
    elems_stored = seq * 8.0 / bits  # stored low-bit elements/s read at line rate
    quant_ops = elems_in_bf16 * ops_per_element_quant
    score_ops = elems_stored * ops_per_element_score
    return {
        "seq_read": seq,
        "x4_ceiling": link,
        "seq_fraction_of_ceiling": seq / link,
        "iops_4k_bytes": iops_bytes,
        "iops_fraction_of_ceiling": iops_bytes / link,
        "tops": s["in_drive_compute"],
        "quant_ops_needed": quant_ops,
        "score_ops_needed": score_ops,
        "tops_headroom_quant": s["in_drive_compute"] / quant_ops,
        "tops_headroom_score": s["in_drive_compute"] / score_ops,
        "effective_kv_bw": seq * 16.0 / bits,
    }


def gpu_usd_per_s(
    d: Deployment, basis: str = "rent", rent_override_usd_per_s: float = 0.0, lifetime_s: float = 4 * YEAR_S
) -> float:
    """Cost of one GPU per second: its rental rate, or its price amortised plus its energy."""
    g = _gpu(d.gpu)
    if basis == "rent":
        return rent_override_usd_per_s if rent_override_usd_per_s > 0 else g["rent"]
    if basis == "own":
        return g["price"] / lifetime_s + energy_usd_per_s(g["power"], d)
    raise ValueError(f"gpu cost basis must be 'rent' or 'own', got {basis!r}")
