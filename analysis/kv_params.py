"""Chapter 1's parameter schema (``book/01_kv_footprint.md``; see :mod:`analysis.params`)."""
from __future__ import annotations

from dataclasses import dataclass

from .params import KV_DTYPES, Param, Schema, register
from .specs import hardware_names, model_names


def _gpu_names():
    return hardware_names("gpu")


PARAMS = {
    "models": Param(["GPT-2 small", "GPT-2 XL", "SmolLM2-135M", "Llama-3.1-8B", "Llama-3.1-70B",
                     "Llama-3.1-405B", "Mixtral-8x7B", "Qwen3-235B-A22B", "DeepSeek-V3", "Kimi-K2",
                     "Kimi-Linear-48B-A3B", "Gemma-3-27B", "gpt-oss-120b"], "list[str]",
                    "models shown in the figures", choices=model_names),
    "dtype": Param("bf16", "str", "KV-cache element type", choices=KV_DTYPES),
    "weight_dtype": Param("bf16", "str", "weight element type (for KV vs weights)", choices=KV_DTYPES),
    "context_tokens": Param(131072, "int", "context length for the headline comparisons", min=1, max=1 << 24),
    "batch": Param(1, "int", "sequences in a batch for the headline comparisons", min=1, max=1 << 20),
    "gpu": Param("H100-SXM5-80GB", "str", "GPU whose HBM is the reference line", choices=_gpu_names),
    "max_context_tokens": Param(1048576, "int", "right end of the context axis", min=1024, max=1 << 24),
}


# typed configuration (each field is the parameter of the same name; the defaults are the schema's)

@dataclass(frozen=True)
class Models:
    """The models compared and the element types of their KV cache and weights."""

    models: list
    dtype: str
    weight_dtype: str


@dataclass(frozen=True)
class Workload:
    """The context and batch of the headline comparisons, and the context axis."""

    context_tokens: int
    batch: int
    max_context_tokens: int


@dataclass(frozen=True)
class Hardware:
    """The GPU whose HBM is the reference line."""

    gpu: str


@dataclass(frozen=True)
class FootprintConfig:
    """Chapter 1's parameters, typed and grouped: ``SCHEMA.config(values)``."""

    models: Models
    workload: Workload
    hardware: Hardware


SCHEMA = register(Schema("01_kv_footprint", PARAMS, config=FootprintConfig))
PARAMS = SCHEMA
