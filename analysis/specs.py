"""Typed, validated model and hardware specs loaded from ``data/models.csv`` and ``data/hardware.csv``.

``model(name)`` and ``hardware(name)`` are the only ways chapters obtain a spec. Unknown names raise
:class:`UnknownNameError` listing the close matches and every allowed name; rows whose values are
inconsistent (negative sizes, more sliding layers than layers, ...) raise :class:`SpecError` naming
the row and the field.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from dataclasses import dataclass, field

import pandas as pd

from . import data

# unit -> factor to SI (bytes, bytes/s, FLOP/s, W, USD, USD/s, USD/byte)
UNITS = {
    "B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "GiB": 2.0**30, "TiB": 2.0**40,
    "B/s": 1.0, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
    "Gbit/s": 1e9 / 8, "Tbit/s": 1e12 / 8,
    "TFLOPS": 1e12, "TOPS": 1e12, "PFLOPS": 1e15,
    "IOPS": 1.0, "KIOPS": 1e3, "MIOPS": 1e6,
    "W": 1.0, "kW": 1e3,
    "USD": 1.0, "USD/h": 1.0 / 3600.0, "USD/GB": 1e-9, "USD/TB": 1e-12, "USD/kWh": 1.0 / 3.6e6,
    "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9,
    "1": 1.0, "count": 1.0, "fraction": 1.0, "years": 365.25 * 86400.0,
}


class SpecError(ValueError):
    """A spec row is inconsistent or a value is out of range."""


class UnknownNameError(KeyError):
    """An unknown model or hardware name. ``str()`` lists close matches and the allowed names."""

    def __init__(self, kind: str, name: str, allowed):
        self.kind, self.name, self.allowed = kind, name, sorted(allowed)
        close = difflib.get_close_matches(str(name), self.allowed, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        super().__init__(f"unknown {kind} {name!r}.{hint} Allowed: {', '.join(self.allowed)}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


@dataclass(frozen=True)
class ModelSpec:
    """One architecture (see the header of data/models.csv for the conventions)."""

    name: str
    family: str
    attention: str  # mha | gqa | mla  (type of the softmax-attention layers)
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    v_head_dim: int
    mla_kv_lora_rank: int
    mla_qk_rope_dim: int
    mla_q_lora_rank: int
    ffn_intermediate: int
    ffn_gated: bool
    n_dense_layers: int
    moe_experts: int
    moe_active: int
    moe_shared: int
    moe_intermediate: int
    n_sliding_layers: int
    sliding_window: int
    n_linear_layers: int
    linear_heads: int
    linear_dk: int
    linear_dv: int
    vocab_size: int
    tied_embeddings: bool
    max_context: int
    params_total_published: float
    params_active_published: float
    native_dtype: str
    source: str
    date: str
    estimate: bool
    notes: str = ""

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers

    @property
    def n_attn_layers(self) -> int:
        """Softmax-attention layers (full or sliding), i.e. layers that keep a per-token KV cache."""
        return self.n_layers - self.n_linear_layers

    @property
    def n_full_layers(self) -> int:
        """Softmax-attention layers attending to the whole context."""
        return self.n_layers - self.n_linear_layers - self.n_sliding_layers

    @property
    def is_moe(self) -> bool:
        return self.moe_experts > 0 and self.n_moe_layers > 0

    def replace(self, **changes) -> "ModelSpec":
        """A modified copy (validated), e.g. for ablations: ``m.replace(moe_active=2)``."""
        new = dataclasses.replace(self, **changes)
        _validate_model(new)
        return new


_INT_FIELDS = [f.name for f in dataclasses.fields(ModelSpec) if f.type in ("int", int)]


def _validate_model(m: ModelSpec, where: str = "data/models.csv") -> None:
    def bad(field_name, why):
        raise SpecError(f"{where}: model {m.name!r}: {field_name} {why}")

    for f in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "max_context"):
        if getattr(m, f) <= 0:
            bad(f, f"must be positive, got {getattr(m, f)}")
    for f in _INT_FIELDS:
        if getattr(m, f) < 0:
            bad(f, f"must be >= 0, got {getattr(m, f)}")
    if m.attention not in ("mha", "gqa", "mla"):
        bad("attention", f"must be mha, gqa or mla, got {m.attention!r}")
    if m.n_heads % m.n_kv_heads:
        bad("n_kv_heads", f"({m.n_kv_heads}) must divide n_heads ({m.n_heads})")
    if m.attention == "mha" and m.n_kv_heads != m.n_heads:
        bad("n_kv_heads", "must equal n_heads for MHA")
    if m.attention == "mla" and m.mla_kv_lora_rank <= 0:
        bad("mla_kv_lora_rank", "must be positive for MLA")
    if m.n_sliding_layers + m.n_linear_layers > m.n_layers:
        bad("n_sliding_layers + n_linear_layers", "exceed n_layers")
    if m.n_sliding_layers and m.sliding_window <= 0:
        bad("sliding_window", "must be positive when there are sliding layers")
    if m.n_linear_layers and min(m.linear_heads, m.linear_dk, m.linear_dv) <= 0:
        bad("linear_heads/dk/dv", "must be positive when there are linear layers")
    if not 0 <= m.n_dense_layers <= m.n_layers:
        bad("n_dense_layers", "must be within [0, n_layers]")
    if m.n_dense_layers < m.n_layers and not (0 < m.moe_active <= m.moe_experts and m.moe_intermediate > 0):
        bad("moe_*", "MoE layers need 0 < moe_active <= moe_experts and moe_intermediate > 0")
    if m.n_dense_layers > 0 and m.ffn_intermediate <= 0:
        bad("ffn_intermediate", "must be positive when there are dense layers")


def _as_int(v, where: str = "", field: str = "") -> int:
    """An integer field: empty is 0; a whole number (8 or 8.0) is accepted; 8.5 or text is an error
    naming the file, line, row and field."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip()):
        return 0
    try:
        f = float(v)
    except (TypeError, ValueError):
        f = None
    if f is None or not math.isfinite(f) or f != int(f):
        raise SpecError(f"{where or 'data'}: {field or 'value'} = {v!r} is not an integer")
    return int(f)


@functools.lru_cache(maxsize=1)
def _models() -> dict[str, ModelSpec]:
    df = data.table("models.csv")
    out: dict[str, ModelSpec] = {}
    for i, row in df.iterrows():
        kw = {}
        where = f"{data.where(df, i)} (model {row.get('name')!r})"
        for f in dataclasses.fields(ModelSpec):
            v = row.get(f.name)
            if f.type in ("int", int):
                kw[f.name] = _as_int(v, where, f.name)
            elif f.type in ("bool", bool):
                kw[f.name] = bool(_as_int(v, where, f.name))
            elif f.type in ("float", float):
                kw[f.name] = float(v)
            else:
                kw[f.name] = "" if (v is None or (isinstance(v, float) and math.isnan(v))) else str(v)
        if kw["v_head_dim"] == 0:
            kw["v_head_dim"] = kw["head_dim"]
        m = ModelSpec(**kw)
        _validate_model(m, data.where(df, i))
        if m.name in out:
            raise SpecError(f"{data.where(df, i)}: model {m.name!r} appears twice in data/models.csv")
        out[m.name] = m
    return out


def model_names() -> list[str]:
    return list(_models())


def model(name: str | ModelSpec) -> ModelSpec:
    """The :class:`ModelSpec` of ``name`` (a spec passes through unchanged)."""
    if isinstance(name, ModelSpec):
        return name
    models = _models()
    if name not in models:
        raise UnknownNameError("model", name, models)
    return models[name]


def models() -> list[ModelSpec]:
    return list(_models().values())


# ---------------------------------------------------------------------------------------- hardware

@dataclass(frozen=True)
class HardwareSpec:
    """A device of data/hardware.csv: ``values`` in SI units, with per-value provenance."""

    name: str
    category: str
    values: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)  # quantity -> (source, date, estimate, notes)

    def __getitem__(self, quantity: str) -> float:
        if quantity not in self.values:
            raise SpecError(
                f"{self.category} {self.name!r} has no {quantity!r} in data/hardware.csv; it has "
                f"{sorted(self.values)}"
            )
        return self.values[quantity]

    def get(self, quantity: str, default=None):
        return self.values.get(quantity, default)

    def flops(self, dtype: str = "bf16") -> float:
        """Dense peak FLOP/s for a compute dtype (bf16, fp16, fp8, fp4, int8, int4)."""
        key = {"bf16": "bf16_flops", "fp16": "bf16_flops", "fp8": "fp8_flops", "int8": "fp8_flops",
               "fp4": "fp4_flops", "int4": "fp4_flops", "nvfp4": "fp4_flops", "mxfp4": "fp4_flops"}.get(dtype)
        if key is None:
            raise SpecError(f"unknown compute dtype {dtype!r}; use bf16, fp16, fp8, int8, fp4 or int4")
        return self[key]

    def replace(self, **values) -> "HardwareSpec":
        """A copy with some SI values changed (for sensitivities), e.g. ``hbm_bandwidth=4e12``."""
        for k, v in values.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise SpecError(f"{self.name}: {k} must be a finite number >= 0, got {v!r}")
        return HardwareSpec(self.name, self.category, {**self.values, **values}, self.provenance)


@functools.lru_cache(maxsize=1)
def _hardware() -> dict[str, HardwareSpec]:
    df = data.table("hardware.csv")
    need = {"device", "category", "quantity", "value", "unit"}
    if need - set(df.columns):
        raise SpecError(f"data/hardware.csv lacks columns {sorted(need - set(df.columns))}")
    out: dict[str, HardwareSpec] = {}
    for i, row in df.iterrows():
        at = data.where(df, i)  # data/hardware.csv:LINE, comment lines counted
        unit = str(row["unit"]).strip()
        if unit not in UNITS:
            raise SpecError(f"{at}: unknown unit {unit!r}; known: {sorted(UNITS)}")
        try:
            value = float(row["value"])
        except (TypeError, ValueError):
            raise SpecError(f"{at}: value {row['value']!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise SpecError(f"{at}: {row['quantity']} = {value} must be finite and >= 0")
        name, cat = str(row["device"]), str(row["category"])
        hw = out.setdefault(name, HardwareSpec(name, cat, {}, {}))
        if hw.category != cat:
            raise SpecError(f"{at}: {name!r} is both {hw.category!r} and {cat!r}")
        q = str(row["quantity"])
        if q in hw.values:
            raise SpecError(f"{at}: {name!r} {q!r} given twice")
        hw.values[q] = value * UNITS[unit]
        notes = row.get("notes")
        notes = "" if notes is None or (isinstance(notes, float) and math.isnan(notes)) else str(notes)
        estimate = bool(_as_int(row.get("estimate"), at, "estimate"))
        hw.provenance[q] = (str(row["source"]), str(row["date"]), estimate, notes)
    return out


def hardware_names(category: str | None = None) -> list[str]:
    return [n for n, h in _hardware().items() if category is None or h.category == category]


def hardware(name: str | HardwareSpec, category: str | None = None) -> HardwareSpec:
    """The :class:`HardwareSpec` of ``name`` (optionally checking its category)."""
    if isinstance(name, HardwareSpec):
        return name
    hw = _hardware()
    allowed = hardware_names(category)
    if name not in hw or (category and hw[name].category != category):
        raise UnknownNameError(category or "hardware", name, allowed)
    return hw[name]


def gpu(name: str | HardwareSpec) -> HardwareSpec:
    return hardware(name, "gpu")


def hardware_table() -> pd.DataFrame:
    """data/hardware.csv with an extra ``si_value`` column (for display in the appendix)."""
    df = data.table("hardware.csv")
    df["si_value"] = [float(v) * UNITS[str(u).strip()] for v, u in zip(df["value"], df["unit"])]
    return df
