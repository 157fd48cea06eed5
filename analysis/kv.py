"""KV-cache bytes, parameter counts and FLOPs per token for each attention family.

Attention families and what one token costs in KV cache, per layer (``b`` = bytes per element):

* MHA / GQA / MQA: ``n_kv_heads * (head_dim + v_head_dim) * b`` (MQA is GQA with one KV head);
* MLA (DeepSeek-V3, Kimi K2): the compressed latent ``(kv_lora_rank + qk_rope_dim) * b``, as served
  with the absorbed-weight formulation (vLLM, SGLang);
* sliding-window layers: as their attention type, but at most ``sliding_window`` tokens are kept, so
  their KV saturates with context;
* linear-attention layers (Kimi Delta Attention, Gated DeltaNet): no per-token KV; a fixed recurrent
  state of ``linear_heads * linear_dk * linear_dv`` elements per layer and sequence (kept in fp32 by
  default).

Everything accepts numpy arrays for ``context`` and ``batch`` and returns bytes (SI), FLOP or counts.
"""
from __future__ import annotations

import numpy as np

from .specs import ModelSpec
from .specs import model as _model

DTYPE_BYTES = {
    "fp32": 4.0, "float32": 4.0, "bf16": 2.0, "fp16": 2.0, "float16": 2.0,
    "fp8": 1.0, "int8": 1.0, "fp4": 0.5, "int4": 0.5, "nvfp4": 0.5, "mxfp4": 0.5, "int2": 0.25,
}


def dtype_bytes(dtype: str | float) -> float:
    """Bytes per element of a dtype name (``"bf16"`` -> 2.0); a positive number passes through."""
    if isinstance(dtype, (int, float)) and not isinstance(dtype, bool):
        if dtype <= 0:
            raise ValueError(f"bytes per element must be positive, got {dtype}")
        return float(dtype)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def _m(model) -> ModelSpec:
    return _model(model)


def kv_elements_per_token_layer(model) -> int:
    """Cached elements per token in one softmax-attention layer (K and V, or the MLA latent)."""
    m = _m(model)
    if m.attention == "mla":
        return m.mla_kv_lora_rank + m.mla_qk_rope_dim
    return m.n_kv_heads * (m.head_dim + m.v_head_dim)


def kv_bytes_per_token_layer(model, dtype="bf16") -> float:
    return kv_elements_per_token_layer(model) * dtype_bytes(dtype)


def linear_state_bytes(model, state_dtype="fp32") -> float:
    """Fixed recurrent-state bytes of all linear-attention layers, per sequence."""
    m = _m(model)
    return m.n_linear_layers * m.linear_heads * m.linear_dk * m.linear_dv * dtype_bytes(state_dtype)


def kv_bytes_per_token(model, dtype="bf16") -> float:
    """Marginal KV bytes per token at long context (only full-attention layers keep growing)."""
    m = _m(model)
    return m.n_full_layers * kv_bytes_per_token_layer(m, dtype)


def kv_bytes_per_token_all_layers(model, dtype="bf16") -> float:
    """KV bytes per token counting every softmax-attention layer (sliding ones below their window)."""
    m = _m(model)
    return m.n_attn_layers * kv_bytes_per_token_layer(m, dtype)


def kv_bytes(model, context, batch=1, dtype="bf16", state_dtype="fp32"):
    """Total KV-cache bytes for ``batch`` sequences of ``context`` tokens each.

    Full-attention layers grow linearly; sliding layers keep ``min(context, window)`` tokens;
    linear-attention layers hold a constant state. Vectorised over ``context`` and ``batch``.
    """
    m = _m(model)
    context = np.asarray(context, dtype=float)
    batch = np.asarray(batch, dtype=float)
    if np.any(context < 0) or np.any(batch < 0):
        raise ValueError("context and batch must be >= 0")
    per_layer = kv_bytes_per_token_layer(m, dtype)
    full = m.n_full_layers * per_layer * context
    sliding = m.n_sliding_layers * per_layer * np.minimum(context, m.sliding_window)
    state = linear_state_bytes(m, state_dtype) * (context > 0)
    out = batch * (full + sliding + state)
    return out if out.ndim else float(out)


def kv_bytes_if_all_full(model, context, batch=1, dtype="bf16"):
    """KV bytes of the same model with every layer as full softmax attention (the counterfactual
    that hybrid linear and sliding-window designs are compared against)."""
    m = _m(model)
    context = np.asarray(context, dtype=float)
    out = np.asarray(batch, dtype=float) * m.n_layers * kv_bytes_per_token_layer(m, dtype) * context
    return out if out.ndim else float(out)


# ------------------------------------------------------------------------------------- parameters

def attention_params_per_layer(model) -> int:
    m = _m(model)
    h = m.hidden_size
    if m.attention == "mla":
        nope = m.head_dim - m.mla_qk_rope_dim
        if m.mla_q_lora_rank:
            q = h * m.mla_q_lora_rank + m.mla_q_lora_rank * m.n_heads * m.head_dim
        else:
            q = h * m.n_heads * m.head_dim
        kv_a = h * (m.mla_kv_lora_rank + m.mla_qk_rope_dim)
        kv_b = m.mla_kv_lora_rank * m.n_heads * (nope + m.v_head_dim)
        return q + kv_a + kv_b + m.n_heads * m.v_head_dim * h
    # a query low rank (Step-3's MFA: h -> r -> heads) when given, else a full query projection
    r = m.mla_q_lora_rank or 0
    q = h * r + r * m.n_heads * m.head_dim if r else h * m.n_heads * m.head_dim
    kv = h * m.n_kv_heads * (m.head_dim + m.v_head_dim)
    return q + kv + m.n_heads * m.v_head_dim * h


def linear_attention_params_per_layer(model) -> int:
    """Approximate: q, k, v, output projections of a linear-attention layer (gates and short
    convolutions, well under 10% of a layer, are not counted)."""
    m = _m(model)
    return m.hidden_size * m.linear_heads * (2 * m.linear_dk + 2 * m.linear_dv)


def param_counts(model) -> dict:
    """Parameter counts by component; ``total`` and ``active`` (per token) at the end."""
    m = _m(model)
    h = m.hidden_size
    mats = 3 if m.ffn_gated else 2
    attn = (m.n_attn_layers * attention_params_per_layer(m)
            + m.n_linear_layers * linear_attention_params_per_layer(m))
    dense_ffn = m.n_dense_layers * mats * h * m.ffn_intermediate
    expert = mats * h * m.moe_intermediate
    moe_total = m.n_moe_layers * ((m.moe_experts + m.moe_shared) * expert + h * m.moe_experts)
    moe_active = m.n_moe_layers * ((m.moe_active + m.moe_shared) * expert + h * m.moe_experts)
    embed = m.vocab_size * h
    lm_head = 0 if m.tied_embeddings else m.vocab_size * h
    total = attn + dense_ffn + moe_total + embed + lm_head
    active = attn + dense_ffn + moe_active + embed + lm_head
    return {"attention": attn, "dense_ffn": dense_ffn, "moe_total": moe_total, "moe_active": moe_active,
            "embedding": embed, "lm_head": lm_head, "total": total, "active": active}


def weight_bytes(model, dtype="bf16") -> float:
    """Bytes of all weights stored in ``dtype``."""
    return param_counts(model)["total"] * dtype_bytes(dtype)


# ------------------------------------------------------------------------------------------- FLOPs

def matmul_flops_per_token(model) -> float:
    """FLOPs of the weight matmuls per token (2 x active parameters, LM head included, the
    embedding lookup excluded)."""
    pc = param_counts(model)
    m = _m(model)
    lm = m.vocab_size * m.hidden_size  # the LM head is a matmul even when tied
    return 2.0 * (pc["active"] - pc["embedding"] - pc["lm_head"] + lm)


def attention_core_flops_per_layer_token(model) -> float:
    """FLOPs per (query token, attended token) pair in one softmax-attention layer: QK^T and AV."""
    m = _m(model)
    return 2.0 * m.n_heads * (m.head_dim + m.v_head_dim)


def attended_pairs(n_new, prefix=0, window=None):
    """Number of (query, key) pairs when ``n_new`` tokens follow ``prefix`` cached ones under causal
    attention (each token attends to itself and everything before it, or to its last ``window``)."""
    n = np.asarray(n_new, dtype=float)
    p = np.asarray(prefix, dtype=float)
    full = n * p + n * (n + 1) / 2.0
    if window is None or window <= 0:
        return full
    w = float(window)
    # token at absolute position t (1-based) attends to min(t, w) keys; sum over t in (p, p+n]
    def s(t):  # sum_{k=1..t} min(k, w)
        t = np.asarray(t, dtype=float)
        return np.where(t <= w, t * (t + 1) / 2.0, w * (w + 1) / 2.0 + (t - w) * w)
    return s(p + n) - s(p)


def attention_core_flops(model, n_new, prefix=0):
    """Attention-core FLOPs for ``n_new`` tokens after ``prefix`` cached tokens (the quadratic
    term of prefill; for decode ``n_new=1``). Linear layers are charged their state update."""
    m = _m(model)
    per = attention_core_flops_per_layer_token(m)
    full = m.n_full_layers * per * attended_pairs(n_new, prefix)
    sliding = (m.n_sliding_layers * per * attended_pairs(n_new, prefix, m.sliding_window)
               if m.n_sliding_layers else 0.0)
    linear = (m.n_linear_layers * 4.0 * m.linear_heads * m.linear_dk * m.linear_dv
              * np.asarray(n_new, dtype=float))
    return full + sliding + linear


def block_sparse_attention_core_flops(model, n_new, attended_tokens, block_size):
    """Attention-core FLOPs of causal block-sparse attention (MoBA) when prefilling ``n_new`` tokens:
    each query attends to at most ``attended_tokens`` keys (its top-k blocks of ``block_size``, the
    current block included; counted as a window of that many keys, which is exact once the query is
    past k blocks) and its gate scores the mean key of every completed block before it (one dot
    product per query head and block). Sliding and linear layers are charged as in
    :func:`attention_core_flops`."""
    m = _m(model)
    n = np.asarray(n_new, dtype=float)
    per = attention_core_flops_per_layer_token(m)
    w = np.minimum(np.asarray(attended_tokens, dtype=float), n)
    pairs = np.where(w >= n, attended_pairs(n, 0), _window_pairs(n, w))
    b = float(block_size)
    q = np.floor(n / b)  # sum_{t=1..n} floor(t / b): completed blocks before each query
    gate_pairs = b * q * (q - 1) / 2.0 + q * (n - q * b + 1)
    gate = 2.0 * m.n_heads * m.head_dim * gate_pairs
    sliding = m.n_sliding_layers * per * attended_pairs(n, 0, m.sliding_window) if m.n_sliding_layers else 0.0
    linear = m.n_linear_layers * 4.0 * m.linear_heads * m.linear_dk * m.linear_dv * n
    return m.n_full_layers * (per * pairs + gate) + sliding + linear


def _window_pairs(n, w):
    """(query, key) pairs of causal attention over ``n`` tokens with a window of ``w`` keys (arrays)."""
    return np.where(n <= w, n * (n + 1) / 2.0, w * (w + 1) / 2.0 + (n - w) * w)


def prefill_flops(model, n_new, prefix=0):
    """Total FLOPs to prefill ``n_new`` tokens after ``prefix`` cached tokens."""
    return (matmul_flops_per_token(model) * np.asarray(n_new, dtype=float)
            + attention_core_flops(model, n_new, prefix))


def kv_exceeds_weights_batch(model, context, dtype="bf16", weight_dtype="bf16"):
    """Smallest (fractional) batch at which the KV cache of ``batch x context`` exceeds the weights."""
    per_seq = np.asarray(kv_bytes(model, context, 1, dtype), dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(per_seq > 0, weight_bytes(model, weight_dtype) / per_seq, np.inf)
