"""Parameter schema of chapter 5 (``book/05_where_kv_lives.md``; see :mod:`analysis.params`) and its
typed configuration, :class:`ComposeConfig`, grouped by concern. Tier prices, devices and
efficiencies are chapter 2's defaults (read from ``data/hardware.csv`` by
:mod:`analysis.tiering.params`); SSD prices move through ``ssd_price_factors``. The library objects
a configuration describes (the base scenario, the reuse curve, the measured policies, the floor) are
built by :mod:`analysis.compose.configure`; this module imports no computation module."""
from __future__ import annotations

from dataclasses import dataclass

from ..params import Param, Schema, register
from ..specs import hardware_names, model_names

# what the computation modules implement (checked by tests/test_params_schema.py)
LAYOUTS = ("hbm", "dram", "cxl", "nvme", "qlc", "ai_ssd")  # pipeline.LAYOUTS
MODES = ("C", "PD", "AF", "3-way", "PDAF")  # pipeline.MODES

_QEVICT_POLICIES = ["streaming", "h2o", "tova", "snapkv", "kivi2", "kivi4", "mikv", "qevict_dequant",
                    "qevict_recall"]


def _gpus():
    return hardware_names("gpu")


PARAMS = {
    "model": Param("Llama-3.1-70B", "str", "served model (chapter 1)", choices=model_names),
    "gpu": Param("H100-SXM5-80GB", "str", "GPU of every role (chapter 3)", choices=_gpus),
    "output_tokens": Param(1000, "int", "output tokens per request", min=1, max=1 << 20),
    "contexts": Param([4096, 8192, 16384, 32768, 65536, 126976], "list[int]",
                      "prompt lengths of the decision map (tokens)", min=16, max=1 << 24),
    "hit_rates": Param([0.0, 0.2, 0.4, 0.6, 0.8], "list[float]",
                       "reuse of the decision map: hit rate with an unbounded prefix cache", min=0.0,
                       max=1.0),
    "ssd_price_factors": Param([0.5, 1.0, 4.0], "list[float]",
                               "SSD prices (NVMe, QLC, AI SSD) relative to data/hardware.csv, one map each",
                               min=0.0, max=100.0),
    "layouts": Param(list(LAYOUTS), "list[str]", "tier layouts of the prefill instances (chapter 2)",
                     choices=list(LAYOUTS)),
    "modes": Param(list(MODES), "list[str]", "deployment modes (chapter 3)",
                   choices=list(MODES)),
    "kv_policies": Param(["snapkv", "kivi4", "kivi2", "qevict_recall"], "list[str]",
                         "KV policies measured by chapter 4 (the full cache is always included)",
                         choices=_QEVICT_POLICIES),
    "kv_budgets": Param([0.25, 0.5], "list[float]",
                        "on-device budgets of the KV policies (fraction of the full cache)", min=0.05,
                        max=1.0),
    "fidelity_documents": Param(["docs:typing"], "list[str]",
                                "chapter 4 documents of the fidelity run ('code:', 'docs:' or 'needle:' + "
                                "stdlib module)"),
    "fidelity_prefill_tokens": Param(256, "int", "prompt tokens of the fidelity run (multiple of 32)", min=64,
                                     max=8192),
    "fidelity_decode_tokens": Param(64, "int", "teacher-forced decoding steps of the fidelity run (>= 64: "
                                    "one re-decision of the policies during decoding)", min=4, max=4096),
    "fidelity_floor_top1": Param(0.9, "float", "fidelity floor: top-1 agreement with the full cache", min=0.0,
                                 max=1.0),
    "fidelity_max_ppl_change": Param(0.05, "float", "fidelity floor: largest relative rise of perplexity",
                                     min=0.0, max=100.0),
    "fidelity_source": Param("published", "str",
                             "fidelity of a policy for the served model: published long-context results "
                             "where they cover it (else chapter 4's), or chapter 4's only",
                             choices=["published", "chapter 4"]),
    "fidelity_long_context": Param(True, "bool",
                                   "chapter 4's fidelity from its committed long-context runs (results/) "
                                   "where they cover a policy, else from the short fidelity run"),
    "fidelity_min_score_ratio": Param(0.95, "float",
                                      "fidelity floor for published results: benchmark score / full cache's",
                                      min=0.0, max=10.0),
    "gpu_rent_range": Param([0.8, 1.25], "list[float]",
                            "declared sensitivity range of the GPU rental rate (multipliers; the map marks "
                            "cells whose answer flips within it)", min=0.01, max=100.0),
    "tier_price_range": Param([0.5, 2.0], "list[float]",
                              "declared sensitivity range of every off-HBM tier price (multipliers)", min=0.0,
                              max=100.0),
    "interactive_ssd_price_factors": Param([0.25, 0.5, 1.0, 2.0, 4.0], "list[float]",
                                           "SSD prices of the interactive map (multipliers; [] for none)",
                                           min=0.0, max=100.0),
    "recall_pricing": Param("chapter 2", "str",
                            "recall and cold-copy writes: chapter 2's small random reads (IOPS, latency), "
                            "mixed-load writes and wear, or the sequential bandwidth with free writes",
                            choices=["chapter 2", "sequential"]),
    "recall_prefetch": Param(True, "bool", "recall one layer ahead (overlapped with the previous layer)"),
    "recall_unit_tokens": Param(32, "int", "tokens of one recalled unit (one layer, one KV head)", min=1,
                                max=1 << 20),
    "routing_policy": Param("kv_aware", "str",
                            "routing of the prefill instances (chapter 2's cluster) that sets the hit rate; "
                            "'ideal': one shared stack", choices=["ideal", "random", "round_robin",
                                                                  "prefix_affinity", "kv_aware"]),
    "routing_instances": Param(0, "int", "prefill instances of the routed cluster (0: the number chapter 2's "
                               "replay keeps busy on the trace)", min=0, max=4096),
    "ttft_slo_s": Param(10.0, "float", "TTFT SLO (s)", min=0.001),
    "tpot_slo_s": Param(0.1, "float", "TPOT SLO (s)", min=0.0001),
    "budget_devices": Param(64, "int", "largest deployment searched (devices)", min=1, max=4096),
    "trace": Param("mooncake_conversation", "str",
                   "trace whose reuse curve shapes the hit rates (chapter 2)"),
    "gpu_cost_basis": Param("rent", "str", "GPU cost: rental rate or purchase amortised + energy",
                            choices=["rent", "own"]),
    "ref_context": Param(32768, "int", "prompt length of the sensitivity analyses (tokens)", min=16,
                         max=1 << 24),
    "ref_hit_rate": Param(0.6, "float", "reuse of the sensitivity analyses", min=0.0, max=1.0),
    "price_factors": Param([0.25, 0.5, 1.0, 2.0, 4.0], "list[float]",
                           "AI-SSD and CXL price multipliers of the sensitivity", min=0.0, max=100.0),
    "nvme_bw_gb_s": Param([1.0, 3.5, 7.0, 14.0, 28.0], "list[float]", "NVMe per-drive read bandwidths (GB/s)",
                          min=0.01, max=1000.0),
    "ai_ssd_bits_grid": Param([16, 8, 4, 2], "list[int]",
                              "AI-SSD in-drive quantization (bits; sets its effective bandwidth)",
                              choices=[2, 3, 4, 5, 6, 8, 16]),
    "linear_shares": Param([0.0, 0.25, 0.5, 0.75], "list[float]",
                           "share of full-attention layers turned linear (KV per token shrinks by it)",
                           min=0.0, max=0.95),
    "transfer_overheads": Param([1.0, 4.0, 16.0, 64.0, 256.0], "list[float]",
                                "disaggregation transfer overhead: scale-out bandwidth divided by it",
                                min=1.0, max=1000.0),
    "kimi_context_tokens": Param(1048576, "int", "total context of the Kimi Linear decode check", min=1024,
                                 max=1 << 24),
    "kimi_tpot_slo_s": Param(0.1, "float", "TPOT SLO of the Kimi Linear decode check (s)", min=0.0001),
}


# ------------------------------------------------------------------------- typed configuration
# Each field is the parameter of the same name (no defaults here: the schema above holds them).

@dataclass(frozen=True)
class Service:
    """The served model, its GPU, the requests' output, the SLOs and the largest deployment."""

    model: str
    gpu: str
    output_tokens: int
    ttft_slo_s: float
    tpot_slo_s: float
    budget_devices: int
    gpu_cost_basis: str


@dataclass(frozen=True)
class DecisionMap:
    """The axes and options of the decision map."""

    contexts: list
    hit_rates: list
    ssd_price_factors: list
    interactive_ssd_price_factors: list
    layouts: list
    modes: list


@dataclass(frozen=True)
class Fidelity:
    """The KV policies measured by chapter 4, the fidelity run and the declared floor."""

    kv_policies: list
    kv_budgets: list
    fidelity_documents: list
    fidelity_prefill_tokens: int
    fidelity_decode_tokens: int
    fidelity_floor_top1: float
    fidelity_max_ppl_change: float
    fidelity_source: str
    fidelity_long_context: bool
    fidelity_min_score_ratio: float


@dataclass(frozen=True)
class Recall:
    """How recalls and cold-copy writes are priced."""

    recall_pricing: str
    recall_prefetch: bool
    recall_unit_tokens: int


@dataclass(frozen=True)
class Reuse:
    """The trace and the routing that set the hit rate."""

    trace: str
    routing_policy: str
    routing_instances: int


@dataclass(frozen=True)
class Sensitivity:
    """The reference point and the ranges of the sensitivity analyses."""

    ref_context: int
    ref_hit_rate: float
    gpu_rent_range: list
    tier_price_range: list
    price_factors: list
    nvme_bw_gb_s: list
    ai_ssd_bits_grid: list
    linear_shares: list
    transfer_overheads: list


@dataclass(frozen=True)
class KimiCheck:
    """The Kimi Linear decode check."""

    kimi_context_tokens: int
    kimi_tpot_slo_s: float


@dataclass(frozen=True)
class ComposeConfig:
    """Chapter 5's parameters, typed and grouped: ``SCHEMA.config(values)``."""

    service: Service
    decision_map: DecisionMap
    fidelity: Fidelity
    recall: Recall
    reuse: Reuse
    sensitivity: Sensitivity
    kimi: KimiCheck


SCHEMA = register(Schema("05_where_kv_lives", PARAMS, config=ComposeConfig))
PARAMS = SCHEMA
