"""Parameter schema of chapter 2 (``book/02_ssd_offload.md``; see :mod:`analysis.params`) and its typed
configuration, :class:`TieringConfig`, grouped by concern. Price defaults are read from
``data/hardware.csv`` (dated rows), so the chapter's defaults are the table's values. The library
objects a configuration describes (the tier deployment, the economics) are built by
:mod:`analysis.tiering.configure`; this module imports no computation module: the allowed names
below are written here as data, and ``tests/test_params_schema.py`` checks them against the modules
that implement them."""
from __future__ import annotations

from dataclasses import dataclass

from ..params import KV_DTYPES, Param, Schema, register
from ..specs import hardware, hardware_names, model_names

# what the computation modules implement (checked by tests/test_params_schema.py)
CONFIGS = ("hbm", "dram", "cxl", "pool", "nvme", "qlc", "ai_ssd")  # tiers.CONFIGS
DATA_PATHS = ("gpu_direct", "cpu_bounce")  # tiers.DATA_PATHS
ROUTING = ("random", "round_robin", "prefix_affinity", "kv_aware")  # cluster.ROUTING
EVICTION_POLICIES = ("lru", "lfu", "belady")  # policies.POLICIES
EVICTION = ("lru", "fifo", "s3fifo", "sieve", "arc", "wtinylfu", "belady")  # admission.EVICTION
ADMISSION = ("all", "second_use", "oracle_reuse")  # admission.ADMISSION
ADMISSION_RUNS = [f"{e}+{a}" for e in EVICTION for a in ADMISSION]


def _price(device, category, quantity, per):
    return round(hardware(device, category)[quantity] * per, 6)


def _gpus():
    return hardware_names("gpu")


PARAMS = {
    "trace": Param(
        "mooncake_conversation",
        "str",
        "registered trace name (data/registry.yaml), path of a Mooncake-format JSONL trace, or an agent "
        "family converted from LMCache's traces (lmcache_miniswe, lmcache_taubench, lmcache_magagent)",
    ),
    "trace_requests": Param(0, "int", "use only the first N requests (0 = all)", min=0),
    "model": Param("Llama-3.1-70B", "str", "model served by the prefill cluster", choices=model_names),
    "gpu": Param("H800-SXM5-80GB", "str", "GPU of the prefill instances", choices=_gpus),
    "tp": Param(8, "int", "GPUs per prefill instance (tensor parallel)", min=1, max=72),
    "models_grid": Param(
        [
            "Llama-3.1-8B",
            "Llama-3.1-70B",
            "Llama-3.1-405B",
            "Qwen3-235B-A22B",
            "DeepSeek-V3",
            "Kimi-K2",
            "Kimi-Linear-48B-A3B",
            "gpt-oss-120b",
            "GLM-4.6",
        ],
        "list[str]",
        "models of the load-vs-recompute generalisation",
        choices=model_names,
    ),
    "gpus_grid": Param(
        [
            "A800-SXM4-80GB",
            "H800-SXM5-80GB",
            "H100-SXM5-80GB",
            "H200-SXM-141GB",
            "B200-SXM-180GB",
            "B300-SXM-288GB",
            "GB200-NVL72",
            "GB300-NVL72",
        ],
        "list[str]",
        "GPUs of the load-vs-recompute generalisation",
        choices=_gpus,
    ),
    "prefix_tokens": Param(
        8192, "int", "prefix length of the Eq. 2 comparison and the model x GPU heatmap", min=16, max=1 << 22
    ),
    "kv_dtype": Param("bf16", "str", "KV-cache element type in HBM/DRAM/NVMe", choices=KV_DTYPES),
    "compute_eff": Param(
        0.5, "float", "achieved fraction of peak FLOP/s in prefill (replay)", min=0.01, max=1.0
    ),
    "bw_eff": Param(
        0.8, "float", "achieved fraction of peak bandwidth of links and devices", min=0.01, max=1.0
    ),
    "hbm_cache_fraction": Param(
        0.5, "float", "share of the HBM left after weights that holds prefix KV", min=0.0, max=1.0
    ),
    "local_dram_gb": Param(1000.0, "float", "host DRAM per instance given to the KV cache (GB)", min=0.0),
    "cxl_devices": Param(4, "int", "CXL memory expanders per instance", min=0, max=64),
    "pool_nodes": Param(16, "int", "hosts whose DRAM forms the pooled store", min=1, max=4096),
    "pool_gb_per_node": Param(1000.0, "float", "DRAM per host given to the pool (GB)", min=0.0),
    "nics_per_instance": Param(8, "int", "RDMA NICs per prefill instance (pooled tier)", min=1, max=64),
    "nvme_drives": Param(2, "int", "NVMe Gen5 TLC drives per instance", min=0, max=64),
    "qlc_drives": Param(1, "int", "high-capacity QLC drives per instance", min=0, max=64),
    "ai_ssd_drives": Param(1, "int", "AI SSDs per instance", min=0, max=64),
    "ai_ssd_bits": Param(
        4,
        "int",
        "bits per KV element after the AI SSD's in-drive quantization",
        choices=[2, 3, 4, 5, 6, 8, 16],
    ),
    "data_path": Param("gpu_direct", "str", "storage/remote data path", choices=list(DATA_PATHS)),
    "cpu_copy_cores": Param(8, "int", "CPU cores copying bounce buffers (cpu_bounce path)", min=1, max=512),
    "cpu_copy_gb_s_per_core": Param(8.0, "float", "memcpy bandwidth of one core (GB/s, estimate)", min=0.1),
    "price_date": Param("2026-11-01", "str", "date the prices below refer to (display only)"),
    "gpu_rent_usd_per_hour": Param(
        0.0, "float", "GPU rental price; 0 = the GPU's estimate in data/hardware.csv", min=0.0
    ),
    "gpu_cost_basis": Param(
        "rent", "str", "GPU cost: rental rate, or purchase price amortised + energy", choices=["rent", "own"]
    ),
    "dram_usd_per_gb": Param(
        _price("DDR5-6400-RDIMM-64GB", "dram", "price_per_capacity", 1e9),
        "float",
        "DDR5 RDIMM price (USD/GB)",
        min=0.0,
    ),
    "cxl_usd_per_gb": Param(
        _price("Micron-CZ120-256GB", "cxl", "price_per_capacity", 1e9),
        "float",
        "CXL expander price (USD/GB)",
        min=0.0,
    ),
    "nvme_usd_per_tb": Param(
        _price("Micron-9550-MAX-25.6TB", "ssd", "price_per_capacity", 1e12),
        "float",
        "NVMe Gen5 TLC price (USD/TB)",
        min=0.0,
    ),
    "qlc_usd_per_tb": Param(
        _price("Solidigm-D5-P5336-122.88TB", "ssd", "price_per_capacity", 1e12),
        "float",
        "QLC price (USD/TB)",
        min=0.0,
    ),
    "ai_ssd_usd_per_tb": Param(
        _price("AI-SSD-STAR-seed", "ssd", "price_per_capacity", 1e12),
        "float",
        "AI SSD price (USD/TB; no public price: an assumption)",
        min=0.0,
    ),
    "electricity_usd_per_kwh": Param(
        _price("Datacenter", "facility", "electricity_price", 3.6e6),
        "float",
        "electricity price (USD/kWh)",
        min=0.0,
    ),
    "pue": Param(
        float(hardware("Datacenter", "facility")["pue"]),
        "float",
        "power usage effectiveness",
        min=1.0,
        max=3.0,
    ),
    "storage_lifetime_years": Param(
        5.0, "float", "amortisation period of DRAM, CXL and SSDs", min=0.25, max=15
    ),
    "slo_ttft_s": Param(5.0, "float", "TTFT service-level objective (s)", min=0.01),
    "attainment_target": Param(
        0.9, "float", "fraction of requests that must meet the TTFT SLO", min=0.01, max=1.0
    ),
    "load_scale": Param(
        1.0, "float", "arrival-rate multiplier applied to the trace's timestamps", min=0.01, max=1000.0
    ),
    "chunk_tokens": Param(
        8192,
        "int",
        "continuous batching with chunked prefill: tokens per step (0: one request at a time per instance)",
        min=0,
        max=1 << 20,
    ),
    "max_instances": Param(
        64, "int", "largest prefill cluster tried when sizing for the SLO", min=1, max=4096
    ),
    "configs": Param(list(CONFIGS), "list[str]", "tier configurations compared", choices=list(CONFIGS)),
    "policies": Param(
        ["lfu", "belady"],
        "list[str]",
        "other eviction policies at sampled capacities",
        choices=[p for p in EVICTION_POLICIES if p != "lru"],
    ),
    "policy_capacities_mtok": Param(
        [0.5, 1.0, 3.0, 10.0, 30.0, 50.0],
        "list[float]",
        "capacities (million tokens) where the other policies are simulated",
        min=0.0005,
        max=1e4,
    ),
    "breakeven_prices_usd_per_tb": Param(
        [25.0, 50.0, 100.0, 150.0, 200.0, 300.0, 450.0, 600.0, 800.0, 1000.0],
        "list[float]",
        "SSD prices of the break-even heatmap (USD/TB)",
        min=0.0,
    ),
    "breakeven_bw_gb_s": Param(
        [0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 10.0, 14.0, 20.0, 28.0],
        "list[float]",
        "per-drive read bandwidths of the break-even heatmap (GB/s)",
        min=0.01,
    ),
    "tornado_config": Param(
        "nvme", "str", "configuration whose cost the tornado chart perturbs", choices=list(CONFIGS)
    ),
    # the write path and drive endurance
    "write_amplification": Param(
        1.0,
        "float",
        "NAND bytes written per host byte, relative to the drives' DWPD rating workload",
        min=0.1,
        max=10.0,
    ),
    "nvme_dwpd": Param(
        float(hardware("Micron-9550-MAX-25.6TB", "ssd")["dwpd"]),
        "float",
        "NVMe drive endurance (drive writes per day over the warranty; datasheet default)",
        min=0.0,
    ),
    "qlc_dwpd": Param(
        float(hardware("Solidigm-D5-P5336-122.88TB", "ssd")["dwpd"]),
        "float",
        "QLC drive endurance (drive writes per day; datasheet default)",
        min=0.0,
    ),
    "nvme_write_gb_s": Param(
        round(hardware("Micron-9550-MAX-25.6TB", "ssd")["seq_write"] / 1e9, 3),
        "float",
        "NVMe drive sequential write bandwidth (GB/s; datasheet default)",
        min=0.0,
    ),
    "mixed_interference": Param(
        0.0,
        "float",
        "read slowdown per written byte (k of r/R + k w/W <= 1); "
        "0 = derived from each drive's 70/30 random IOPS",
        min=0.0,
        max=20.0,
    ),
    "endurance_dwpd_grid": Param(
        [0.1, 0.3, 0.58, 1.0, 3.0, 10.0],
        "list[float]",
        "NVMe endurances (DWPD) of the endurance x price map",
        min=0.001,
    ),
    # admission and eviction (libCacheSim)
    "admission_runs": Param(
        [
            "lru+all",
            "s3fifo+all",
            "sieve+all",
            "arc+all",
            "wtinylfu+all",
            "belady+all",
            "lru+second_use",
            "lru+oracle_reuse",
        ],
        "list[str]",
        "eviction+admission pairs simulated with libCacheSim",
        choices=ADMISSION_RUNS,
    ),
    "admission_capacities_mtok": Param(
        [1.0, 3.0, 10.0],
        "list[float]",
        "store capacities (million tokens) of the admission curves",
        min=0.0005,
        max=1e4,
    ),
    "admission_tier": Param(
        "nvme",
        "str",
        "drives that hold the store (price, wear, bandwidth)",
        choices=["nvme", "qlc", "ai_ssd"],
    ),
    # a cluster of instances with routing
    "routing_policies": Param(
        list(ROUTING), "list[str]", "routing policies of the cluster", choices=list(ROUTING)
    ),
    "routing_instances": Param(
        [1, 2, 4, 8, 16], "list[int]", "cluster sizes of the routing curves", min=1, max=4096
    ),
    "routing_load_scales": Param(
        [1.0, 4.0], "list[float]", "arrival-rate multipliers of the routing curves", min=0.01, max=1000.0
    ),
    "routing_config": Param(
        "dram",
        "str",
        "local tiers of each instance in the routing study",
        choices=[c for c in CONFIGS if c != "pool"],
    ),
    "routing_load_slack_s": Param(
        1.0,
        "float",
        "KV-aware routing: queued seconds above the least-loaded "
        "instance beyond which an instance is not eligible",
        min=0.0,
    ),
    "gpus_per_pcie_switch": Param(
        int(hardware("HGX-8GPU-host", "topology")["gpus_per_pcie_switch"]),
        "int",
        "GPUs sharing one PCIe switch uplink to the host (1: DGX H100; 2: DGX A100, some B200 hosts)",
        min=1,
        max=8,
    ),
    "affinity_blocks": Param(
        2, "int", "prefix-affinity routing hashes this many leading blocks", min=1, max=64
    ),
    # Mooncake's Figure 10: local caches with KV-aware routing against one global pool
    "fig10_traces": Param(
        ["mooncake_conversation", "mooncake_toolagent", "mooncake_synthetic"],
        "list[str]",
        "traces of the local-versus-global comparison (Mooncake FAST'25 Fig. 10), each cut to trace_requests",
    ),
    "fig10_instances": Param(10, "int", "prefill instances of the Figure 10 comparison", min=1, max=4096),
    "fig10_capacity_mtok": Param(
        3.0, "float", "local cache of each instance in the Figure 10 comparison (million tokens)", min=0.001,
        max=1e4
    ),
    # vLLM's KV offloading connector (blog post of 2026-01-08): CPU loads against recompute
    "vllm_model": Param(
        "Llama-3.1-8B", "str",
        "model of the vLLM offloading comparison (the post measured Llama-3.1-8B-Instruct)",
        choices=model_names,
    ),
    "vllm_gpu": Param(
        "H100-SXM5-80GB", "str",
        "GPU of the vLLM offloading comparison, one of them (the post measured one H100 80GB HBM3)",
        choices=_gpus,
    ),
}


# ------------------------------------------------------------------------- typed configuration
# Each field is the parameter of the same name (no defaults here: the schema above holds them).

@dataclass(frozen=True)
class Workload:
    """The requests replayed: the trace, how much of it, how fast."""

    trace: str
    trace_requests: int
    load_scale: float


@dataclass(frozen=True)
class Hardware:
    """One prefill instance: the model it serves, its GPUs and how well they are used."""

    model: str
    gpu: str
    tp: int
    gpus_per_pcie_switch: int
    kv_dtype: str
    compute_eff: float
    bw_eff: float
    hbm_cache_fraction: float


@dataclass(frozen=True)
class Tiers:
    """The capacity tiers of an instance and the path their bytes take."""

    local_dram_gb: float
    cxl_devices: int
    pool_nodes: int
    pool_gb_per_node: float
    nics_per_instance: int
    nvme_drives: int
    qlc_drives: int
    ai_ssd_drives: int
    ai_ssd_bits: int
    data_path: str
    cpu_copy_cores: int
    cpu_copy_gb_s_per_core: float


@dataclass(frozen=True)
class Prices:
    """What GPUs, memory, drives and energy cost."""

    price_date: str
    gpu_rent_usd_per_hour: float
    gpu_cost_basis: str
    dram_usd_per_gb: float
    cxl_usd_per_gb: float
    nvme_usd_per_tb: float
    qlc_usd_per_tb: float
    ai_ssd_usd_per_tb: float
    electricity_usd_per_kwh: float
    pue: float
    storage_lifetime_years: float


@dataclass(frozen=True)
class Endurance:
    """The write path: amplification, drive endurance and write bandwidth, read/write interference."""

    write_amplification: float
    nvme_dwpd: float
    qlc_dwpd: float
    nvme_write_gb_s: float
    mixed_interference: float


@dataclass(frozen=True)
class Service:
    """The service-level objective and how the cluster is sized and batched for it."""

    slo_ttft_s: float
    attainment_target: float
    chunk_tokens: int
    max_instances: int


@dataclass(frozen=True)
class Routing:
    """The routed cluster study."""

    routing_policies: list
    routing_instances: list
    routing_load_scales: list
    routing_config: str
    routing_load_slack_s: float
    affinity_blocks: int
    fig10_traces: list
    fig10_instances: int
    fig10_capacity_mtok: float


@dataclass(frozen=True)
class Admission:
    """The admission and eviction study (libCacheSim)."""

    admission_runs: list
    admission_capacities_mtok: list
    admission_tier: str


@dataclass(frozen=True)
class Studies:
    """The grids of the chapter's other studies: generalisation, policies, break-even, tornado, endurance."""

    models_grid: list
    gpus_grid: list
    prefix_tokens: int
    configs: list
    policies: list
    policy_capacities_mtok: list
    breakeven_prices_usd_per_tb: list
    breakeven_bw_gb_s: list
    tornado_config: str
    endurance_dwpd_grid: list
    vllm_model: str
    vllm_gpu: str


@dataclass(frozen=True)
class TieringConfig:
    """Chapter 2's parameters, typed and grouped: ``SCHEMA.config(values)``."""

    workload: Workload
    hardware: Hardware
    tiers: Tiers
    prices: Prices
    endurance: Endurance
    service: Service
    routing: Routing
    admission: Admission
    studies: Studies


SCHEMA = register(Schema("02_ssd_offload", PARAMS, config=TieringConfig))
PARAMS = SCHEMA
