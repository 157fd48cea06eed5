"""Chapter 1's tables, derived numbers and checks (``book/01_kv_footprint.md``): the chapter calls
these, glues and plots (figures in :mod:`analysis.kv_figures`)."""
from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from . import claims, data, kv, specs
from .report import fmt_bytes

EXAMPLES = (("gqa", "Llama-3.1-70B"), ("mla", "DeepSeek-V3"), ("hybrid", "Kimi-Linear-48B-A3B"),
            ("sliding", "Gemma-3-27B"))


def seq_column(context_tokens: int) -> str:
    return f"KV per sequence @ {context_tokens:,}"


def footprint_table(models, dtype: str, weight_dtype: str, context_tokens: int) -> pd.DataFrame:
    """One row per model: family, layer kinds, KV bytes per token and per sequence of
    ``context_tokens``, parameter counts (counted from the configuration and published), weights."""
    rows = []
    for m in (specs.model(n) for n in models):
        pc = kv.param_counts(m)
        rows.append({
            "model": m.name, "family": m.family, "layers": m.n_layers,
            "KV layers (full/sliding/linear)": f"{m.n_full_layers}/{m.n_sliding_layers}/{m.n_linear_layers}",
            "KV bytes/token": kv.kv_bytes_per_token(m, dtype),
            seq_column(context_tokens): kv.kv_bytes(m, context_tokens, 1, dtype),
            "params (counted)": pc["total"], "params (published)": m.params_total_published,
            "weights": kv.weight_bytes(m, weight_dtype),
        })
    return pd.DataFrame(rows)


def _billions(x) -> str:
    return f"{x / 1e9:,.2f} B"


def shown_table(table: pd.DataFrame, context_tokens: int) -> pd.DataFrame:
    """:func:`footprint_table` formatted for display (bytes in SI units, parameters in billions)."""
    shown = table.copy()
    for c in ["KV bytes/token", seq_column(context_tokens), "weights"]:
        shown[c] = shown[c].map(fmt_bytes)
    for c in ["params (counted)", "params (published)"]:
        shown[c] = shown[c].map(_billions)
    return shown


def param_count_max_error(table: pd.DataFrame) -> float:
    """Largest relative gap between the counted and the published parameter totals."""
    err = (table["params (counted)"] / table["params (published)"] - 1).abs()
    return float(err.max())


def worked_example(name: str, dtype: str = "bf16") -> str:
    """The KV-bytes-per-token product of ``name`` written out term by term (bf16: 2 bytes)."""
    m = specs.model(name)
    terms = (f"{m.n_full_layers} × ({m.mla_kv_lora_rank} + {m.mla_qk_rope_dim}) × 2" if m.attention == "mla"
             else f"{m.n_full_layers} × {m.n_kv_heads} × ({m.head_dim} + {m.v_head_dim}) × 2")
    return f"{terms} = {kv.kv_bytes_per_token(m, dtype):,.0f} bytes per token"


def kv_extremes(table: pd.DataFrame) -> dict:
    """Largest and smallest KV bytes per token among the table's models, and their ratio."""
    kvt = table.set_index("model")["KV bytes/token"]
    return {"max_model": kvt.idxmax(), "max": kvt.max(), "min_model": kvt.idxmin(), "min": kvt.min(),
            "spread": kvt.max() / kvt.min()}


def context_grid(max_context_tokens: int, n: int = 64) -> np.ndarray:
    """The context lengths of the chapter's curves: ``n`` geometric steps from 1,024 tokens."""
    return np.unique(np.geomspace(1024, max_context_tokens, n).astype(int))


def n_fit_in_hbm(models, context_tokens: int, dtype: str, hbm_bytes: float) -> int:
    """How many models hold one sequence of ``context_tokens`` in ``hbm_bytes`` of KV cache."""
    return sum(bool(kv.kv_bytes(m, context_tokens, 1, dtype) <= hbm_bytes) for m in models)


def n_kv_heavier(models, context_tokens: int, batch: int, dtype: str, weight_dtype: str) -> int:
    """How many models' KV cache of ``batch`` sequences of ``context_tokens`` outweighs their weights."""
    return sum(bool(kv.kv_bytes(m, context_tokens, batch, dtype) > kv.weight_bytes(m, weight_dtype))
               for m in models)


def kv_per_token_kb(model: str, dtype: str, _name=None, bytes_per_kb=1024) -> float:
    """KV bytes per token of ``model`` in ``dtype``, counted from its configuration, in KB of
    ``bytes_per_kb`` bytes (the ``recompute`` of ``ch1_llama70b_kv``: ``(name, bytes per KB)``)."""
    return float(kv.kv_bytes_per_token(model, dtype)) / float(bytes_per_kb)


def kv_reduction(model: str, dtype: str, _name, context_tokens) -> float:
    """1 - KV bytes of ``model`` / the same model with full attention on every layer, at
    ``context_tokens`` (the ``recompute`` of ``ch1_kimi_linear_kv``: ``(name, context_tokens)``)."""
    c = int(context_tokens)
    return float(1 - kv.kv_bytes(model, c, 1, dtype) / kv.kv_bytes_if_all_full(model, c, 1, dtype))


def moba_bound_at(setting: dict, name: str, val) -> float:
    """MoBA's roofline bound recomputed by :func:`moba_bounds` with one assumption of
    ``moba_prefill_speedup`` moved (``scope``: attention or whole prefill; ``sparsity``), the other at
    the rule's setting."""
    scope = val if name == "scope" else "attention"
    sp = float(val) if name == "sparsity" else float(setting["sparsity"])
    if name not in ("scope", "sparsity"):
        raise KeyError(f"unknown sensitivity {name!r} of moba_prefill_speedup: declare scope or sparsity")
    return moba_bounds(setting["model"], int(setting["context_tokens"]), (sp,))["bound"][(scope, sp)]


def moba_bounds(model: str, context_tokens: int, sparsities, n_blocks: int = 64) -> dict:
    """MoBA's roofline speed-up bound: dense over block-sparse FLOPs of a ``context_tokens`` prefill
    (blocks of ``context_tokens / n_blocks``), for the attention core alone and the whole prefill, at
    each sparsity; with the dense attention core's share of the prefill FLOPs."""
    blk = context_tokens // n_blocks
    dense_core = float(kv.attention_core_flops(model, context_tokens))
    lin = float(kv.matmul_flops_per_token(model)) * context_tokens
    bound = {}
    for sp in sparsities:
        sparse_core = float(kv.block_sparse_attention_core_flops(model, context_tokens,
                                                                 (1 - sp) * context_tokens, blk))
        bound[("attention", sp)] = dense_core / sparse_core
        bound[("whole prefill", sp)] = (lin + dense_core) / (lin + sparse_core)
    return {"block": blk, "bound": bound, "attention_share": dense_core / (lin + dense_core)}


def checks() -> dict:
    """The chapter's ledger checks (rules in ``data/claims.yaml``) and the numbers they rest on.

    1. Mooncake: LLaMA3-70B needs 320 KB of KV per token (bf16), "KB" of 1,024 or 1,000 bytes.
    2. Kimi Linear: KV "up to 75%" smaller than the same model with full MLA on every layer.
    3. "Model scale grew 22,600x from GPT-2 to Kimi K3 (2.8T)": K3's count is the claim's own number.
    4. MoBA: 95% sparse block attention, 6.5x faster at 1M tokens (prefill), on its base model: 64
       blocks, top-3; roofline bound = FLOP ratio (a 1M-token prefill is compute-bound on any GPU)."""
    per_tok = kv.kv_bytes_per_token("Llama-3.1-70B", "bf16")
    v1 = claims.evaluate("ch1_llama70b_kv", per_tok / 1024,
                         recompute=partial(kv_per_token_kb, "Llama-3.1-70B", "bf16"))
    ctx_long = np.array([4096, 131072, 1048576])
    red = 1 - kv.kv_bytes("Kimi-Linear-48B-A3B", ctx_long, 1, "bf16") / kv.kv_bytes_if_all_full(
        "Kimi-Linear-48B-A3B", ctx_long, 1, "bf16")
    red_at = dict(zip(ctx_long.tolist(), red.tolist()))
    v2 = claims.evaluate("ch1_kimi_linear_kv", red_at[1048576],
                         recompute=partial(kv_reduction, "Kimi-Linear-48B-A3B", "bf16"))
    v3 = claims.evaluate("ch1_growth_gpt2_k3", None)
    v3b = claims.evaluate("ch1_kimi_k3_cost", None)
    moba = claims.rule("moba_prefill_speedup")["setting"]
    mb = moba_bounds(moba["model"], moba["context_tokens"], (0.9, 0.95, moba["sparsity"]))
    v4 = claims.evaluate("moba_prefill_speedup", mb["bound"][("attention", moba["sparsity"])],
                         recompute=partial(moba_bound_at, moba))
    k3 = data.published("kimi_k3_params")["value"]
    return {
        "verdicts": [v1, v2, v4, v3, v3b], "llama70b": v1, "kimi_linear": v2, "growth": v3,
        "k3_cost": v3b, "moba": v4, "llama70b_kv_bytes": per_tok,
        "kimi_linear_reduction_1m": float(red[-1]), "kimi_linear_reduction_4k": float(red[0]),
        "growth_gpt2_small": k3 / kv.param_counts("GPT-2 small")["total"],
        "growth_gpt2_xl": k3 / kv.param_counts("GPT-2 XL")["total"],
        "moba_setting": moba, "moba_block": mb["block"],
        "moba_attn_bound": mb["bound"][("attention", moba["sparsity"])],
        "moba_prefill_bound": mb["bound"][("whole prefill", moba["sparsity"])],
        "moba_attn_bound_90": mb["bound"][("attention", 0.9)],
        "moba_attn_share": mb["attention_share"],
        "moba_published": data.published("moba_speedup_1m")["value"],
    }
