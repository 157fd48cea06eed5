"""Parameter schema of chapter 3 (``book/03_disagg.md``; see :mod:`analysis.params`). The NPU design
points are the rows of ``data/npu_design_points.csv`` (read here as data, as
:func:`analysis.disagg.devices.npu_names` reads them)."""
from __future__ import annotations

from dataclasses import dataclass

from ..data import table
from ..params import Param, Schema, register
from ..specs import hardware_names, model_names


def _models():
    return model_names()


def _gpus():
    return hardware_names("gpu")


def _npus():
    return [str(n) for n in table("npu_design_points.csv")["name"]]


PARAMS = {
    "models": Param(
        [
            "Llama-3.1-405B",
            "Qwen3-235B-A22B",
            "GLM-4.6",
            "DeepSeek-V3",
            "Llama-4-Scout",
            "Llama-4-Maverick",
            "gpt-oss-120b",
        ],
        "list[str]",
        "models of the ratio sweep (the paper's, or their closest configurations)",
        choices=_models,
    ),
    "gpus": Param(
        ["H100-SXM5-80GB", "B200-SXM-180GB"],
        "list[str]",
        "GPUs of the sweep (every role on the same GPU; compared per device)",
        choices=_gpus,
        nonempty=True,
    ),
    "npu_points": Param(
        _npus(),
        "list[str]",
        "NPU design points each role may choose among (compared per "
        "dollar of estimated price); empty list skips the NPU study",
        choices=_npus,
        nonempty=False,
    ),
    "role_hardware": Param(
        {},
        "dict",
        "optional per-role device override, e.g. {'P': 'B200-SXM-180GB', "
        "'D': 'H200-SXM-141GB'}; roles C P D A F PA PF DA DF; adds a 'custom roles' set",
    ),
    "ratios": Param(
        [0.01, 0.1, 1.0, 10.0, 100.0, 1000.0],
        "list[float]",
        "input/output length ratios (the paper sweeps 0.01 to 1000)",
        min=0.001,
        max=10000,
    ),
    "output_tokens": Param(
        1000, "int", "output tokens per request (the paper uses 1,000)", min=1, max=100000
    ),
    "ttft_slo_s": Param(2.0, "float", "TTFT SLO, fixed part (s)", min=1e-3, max=1e5),
    "ttft_slo_s_per_1k_input": Param(
        0.5, "float", "TTFT SLO, added per 1,000 input tokens (s)", min=0.0, max=1e3
    ),
    "tpot_slo_s": Param(0.05, "float", "TPOT SLO (mean time per output token, s)", min=1e-4, max=10.0),
    "budget_devices": Param(64, "int", "device budget: all instances of a plan together", min=2, max=1024),
    "precision": Param(
        "fp8", "str", "weights / compute precision of the sweep", choices=["bf16", "fp8", "fp4"]
    ),
    "af_interconnect": Param(
        "scale-up", "str", "link carrying attention<->FFN activations", choices=["scale-up", "scale-out"]
    ),
    "enforce_context_window": Param(
        False,
        "bool",
        "reject workloads longer than a model's context window "
        "(the paper's ratio 1000 = 1M-token prompts exceeds most)",
    ),
    "focus_model": Param(
        "Qwen3-235B-A22B", "str", "model of the Pareto fronts and the plan picture", choices=_models
    ),
    "focus_ratio": Param(
        10.0, "float", "input/output ratio of the Pareto fronts and the plan picture", min=0.001, max=10000
    ),
    "ablation_model": Param(
        "Qwen3-235B-A22B", "str", "MoE GQA model whose experts/KV heads are varied", choices=_models
    ),
    "ablation_ratios": Param(
        [1.0, 10.0, 100.0], "list[float]", "ratios of the ablation", min=0.001, max=10000
    ),
    "validation_fit_evals": Param(40, "int", "function evaluations of the calibration fit", min=1, max=1000),
    "des_top_k": Param(
        3, "int", "plans per mode the event simulation replays (the screen's best k)", min=1, max=20
    ),
    "des_load": Param(
        0.9,
        "float",
        "arrival rate of the event simulation, as a share of each plan's capacity",
        min=0.05,
        max=1.5,
    ),
}


# ------------------------------------------------------------------------- typed configuration
# Each field is the parameter of the same name (no defaults here: the schema above holds them).

@dataclass(frozen=True)
class Workload:
    """The models and request shapes of the sweep."""

    models: list
    ratios: list
    output_tokens: int
    enforce_context_window: bool


@dataclass(frozen=True)
class Hardware:
    """The devices every role may run on, the precision and the attention<->FFN link."""

    gpus: list
    npu_points: list
    role_hardware: dict
    precision: str
    af_interconnect: str


@dataclass(frozen=True)
class Slo:
    """The service-level objectives a plan must meet."""

    ttft_slo_s: float
    ttft_slo_s_per_1k_input: float
    tpot_slo_s: float


@dataclass(frozen=True)
class Search:
    """The plan search's device budget, its focus (Pareto fronts, plan picture) and the ablation."""

    budget_devices: int
    focus_model: str
    focus_ratio: float
    ablation_model: str
    ablation_ratios: list


@dataclass(frozen=True)
class Validation:
    """The calibration fit and the event simulation that checks the screen's best plans."""

    validation_fit_evals: int
    des_top_k: int
    des_load: float


@dataclass(frozen=True)
class DisaggConfig:
    """Chapter 3's parameters, typed and grouped: ``SCHEMA.config(values)``."""

    workload: Workload
    hardware: Hardware
    slo: Slo
    search: Search
    validation: Validation


SCHEMA = register(Schema("03_disagg", PARAMS, config=DisaggConfig))
PARAMS = SCHEMA
