"""The book's one time model: per-layer operator costs of a forward pass, priced by pluggable backends
(the roofline by default), vectorised over candidate plans.

Everything here is numpy-broadcast: every argument that describes a plan (tokens, sequences, context,
tensor/data parallel degrees, device peaks) may be an array, so one call prices many thousands of
candidate plans at once. Units are SI (seconds, bytes, FLOP, FLOP/s, bytes/s).

Per layer, for the tokens of one forward pass on one *instance* of ``n = tp * dp`` devices:

* attention block: QKV and output projections (GEMM on ``tokens / dp`` rows, weights split ``tp``
  ways), attention core (FLOPs of the attended (query, key) pairs; bytes of the KV cache read, split
  by ``dp`` over sequences and by ``min(tp, n_kv_heads)`` over KV heads, MLA latent not split by
  TP), KV written for the new tokens; sliding-window layers read at most ``window`` tokens;
  linear-attention layers read and write a fixed state per sequence;
* FFN block: dense FFN (weights split over the ``n`` devices) or MoE: FLOPs of the ``active +
  shared`` experts per token, and weight bytes of the experts *actually touched* by the batch,
  ``E * (1 - (1 - k/E)^T)`` of ``E`` routed experts for ``T`` tokens (batch-dependent), times a named
  load-imbalance factor on the expert FLOPs (the hottest device computes longest; each touched
  expert's weights are read once whatever its load);
* communication: tensor-parallel all-reduce (two per layer), expert-parallel all-to-all (dispatch
  and combine per MoE layer; the busiest expert device moves the load-imbalance factor times the mean
  traffic), each ``bytes / (link * link_eff) + latency``; a run's recorded MoE split (``moe_tp``,
  :func:`moe_split`) is priced as the engines move tokens instead (:func:`comm_time`: no all-to-all
  without attention data parallelism; :func:`ffn_block`: tensor-split experts);
* once per forward: LM head (and the embedding gather) and a fixed per-step overhead.

Operators add up (no overlap between operators), except that micro-batches may overlap one's
communication with another's compute, hiding the share :attr:`Efficiency.overlap` of what perfect
pipelining would hide (:func:`pipelined`). Each operator is priced by a *backend* (see
"Backends" below): the default ``"roofline"`` backend costs a compute operator
``max(FLOPs / (peak * compute_eff), bytes / (bandwidth * bw_eff))`` (:func:`analysis.roofline.op_time`
semantics) and a communication operator its wire time (bytes over the link at the link efficiency,
plus the collective latency).

This is the book's one time model: every chapter times operators and forward passes here
(chapter 2's replay through :mod:`analysis.tiering.prefill` and its load-versus-recompute break-even,
chapter 3's search and event simulation, chapter 5's composition). :func:`prefill_time` and
:func:`decode_step_time` price one instance's pass from names (model, GPU, dtypes);
:func:`layerwise_overlap` is the rule for loads overlapped layer by layer with compute.

Backends
--------
An operator reaches its backend as an :class:`Op` (kind, kernel-table shape, FLOPs and bytes per
device, the device's peaks, and for communication the wire time), every field an array over the
candidate plans. A backend is a function ``(op, eff) -> (seconds, measured)`` registered by name
with :func:`register_backend`; ``measured`` is the fraction of ``seconds`` read from measured
kernel tables (0 for the roofline), which :func:`ledger` sums into each plan's measured share. A
device dict names its backend under ``"backend"`` (absent: ``"roofline"``), so a measured backend
(per-GPU tables of GEMM by ``(m, n, k, dtype)``, MoE, attention by ``(batch, seq, heads)``, NCCL
all-reduce, DeepEP all-to-all) plugs in per device and falls back to the roofline where its tables
have no entry. Results memoised by callers (in-process caches, :mod:`analysis.cache`) are keyed on
their inputs, not on the registry: a measured backend must enter those keys (its device dicts or
names), and replacing a registered backend does not invalidate them.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable

import numpy as np

from . import kv
from .specs import ModelSpec
from .specs import gpu as _gpu
from .specs import model as _model


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of peak and fixed overheads: the simulator's only tunable constants.

    Defaults are round engineering values (stated, not fitted); :mod:`analysis.disagg.validate`
    fits some of them per GPU on a training split of measured runs."""

    compute: float = 0.6           # achieved / peak tensor FLOP/s (GEMMs and attention)
    bandwidth: float = 0.8         # achieved / peak HBM bandwidth
    link: float = 0.7              # achieved / peak scale-up (NVLink) or scale-out bandwidth
    step_overhead_s: float = 2e-3  # per forward pass: scheduler, sampling, launch
    layer_overhead_s: float = 2e-5 # per layer per forward pass: kernel launches not hidden
    collective_latency_s: float = 1e-5  # per collective (all-reduce, all-to-all, AF hop)
    moe_imbalance: float = 1.2     # hottest device's expert load / mean load (compute and all-to-all)
    mem_reserve: float = 0.1       # fraction of device memory kept free (activations, workspace)
    # Share of the hideable time that micro-batch overlap actually hides (1: perfect pipelining,
    # 0: micro-batches run one after another). ESTIMATE, not fitted: DeepSeek reports its two-micro-
    # batch overlap as effective in decode and prefill but gives no fraction (DeepSeek-V3/R1 inference
    # system overview, 2025-03-01, and github.com/deepseek-ai/profile-data); SGLang's single-batch-
    # overlap PR (sgl-project/sglang#9660, 2025-08-26) reports two-batch overlap's decode gain is only
    # positive at larger batches on Hopper (split MoE GEMMs below WGMMA's block_m of 64 waste compute,
    # kernels of the two micro-batches contend for SMs). 0.8 is a round value below perfect; see
    # :func:`overlap_time`.
    overlap: float = 0.8

    def replace(self, **kw) -> "Efficiency":
        e = replace(self, **kw)
        e.check()
        return e

    def check(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"Efficiency.{f.name} must be finite and >= 0, got {v!r}")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"Efficiency.overlap must be in [0, 1], got {self.overlap!r}")
        for f in ("compute", "bandwidth", "link"):
            if not 0 < getattr(self, f) <= 1:
                raise ValueError(f"Efficiency.{f} must be in (0, 1], got {getattr(self, f)!r}")
        if not 0 <= self.mem_reserve < 1:
            raise ValueError(f"Efficiency.mem_reserve must be in [0, 1), got {self.mem_reserve!r}")
        if self.moe_imbalance < 1:
            raise ValueError(f"Efficiency.moe_imbalance must be >= 1, got {self.moe_imbalance!r}")


@dataclass(frozen=True)
class Shape:
    """Per-layer sizes of a model, precomputed once (scalars)."""

    name: str
    h: float
    n_layers: int
    n_full: int
    n_sliding: int
    window: float
    n_linear: int
    n_dense: int
    n_moe: int
    attn_params: float          # per softmax-attention layer (projections)
    lin_params: float           # per linear-attention layer
    lin_state_elems: float      # recurrent state elements per linear layer and sequence
    kv_elems: float             # KV elements per token per softmax layer
    kv_split_max: float         # KV heads (TP splits KV up to this); 1 for MLA
    pair_flops_prefill: float   # FLOPs per (query, key) pair per layer
    pair_flops_decode: float    # same, decode (MLA absorbed: attends in the latent space)
    dense_params: float         # per dense FFN layer
    expert_params: float        # one routed expert
    n_experts: int
    k_active: int
    n_shared: int
    vocab: float
    embed_params: float
    lm_head_params: float
    max_context: float = float("inf")
    moe_inter: float = 0.0      # intermediate size of one routed expert
    moe_gated: bool = True      # gated (SwiGLU) experts: the up-projection is 2 * moe_inter wide

    @property
    def attn_weights(self) -> float:
        """Parameters of all attention blocks (softmax + linear)."""
        return (self.n_full + self.n_sliding) * self.attn_params + self.n_linear * self.lin_params

    @property
    def ffn_weights(self) -> float:
        return self.n_dense * self.dense_params + self.n_moe * (
            (self.n_experts + self.n_shared) * self.expert_params + self.h * self.n_experts
        )

    @property
    def total_params(self) -> float:
        return self.attn_weights + self.ffn_weights + self.embed_params + self.lm_head_params


def shape(model: str | ModelSpec) -> Shape:
    m = _model(model)
    mats = 3 if m.ffn_gated else 2
    if m.attention == "mla":
        pair_dec = 2.0 * m.n_heads * (2 * m.mla_kv_lora_rank + m.mla_qk_rope_dim)
        split = 1.0
    else:
        pair_dec = kv.attention_core_flops_per_layer_token(m)
        split = float(m.n_kv_heads)
    return Shape(
        name=m.name,
        h=float(m.hidden_size),
        n_layers=m.n_layers,
        n_full=m.n_full_layers,
        n_sliding=m.n_sliding_layers,
        window=float(m.sliding_window or 0),
        n_linear=m.n_linear_layers,
        n_dense=m.n_dense_layers,
        n_moe=m.n_moe_layers if m.is_moe else 0,
        attn_params=float(kv.attention_params_per_layer(m)),
        lin_params=float(kv.linear_attention_params_per_layer(m)) if m.n_linear_layers else 0.0,
        lin_state_elems=float(m.linear_heads * m.linear_dk * m.linear_dv),
        kv_elems=float(kv.kv_elements_per_token_layer(m)),
        kv_split_max=split,
        pair_flops_prefill=kv.attention_core_flops_per_layer_token(m),
        pair_flops_decode=pair_dec,
        dense_params=float(mats * m.hidden_size * m.ffn_intermediate),
        expert_params=float(mats * m.hidden_size * m.moe_intermediate) if m.is_moe else 0.0,
        n_experts=m.moe_experts if m.is_moe else 0,
        k_active=m.moe_active if m.is_moe else 0,
        n_shared=m.moe_shared if m.is_moe else 0,
        vocab=float(m.vocab_size),
        embed_params=float(m.vocab_size * m.hidden_size),
        lm_head_params=0.0 if m.tied_embeddings else float(m.vocab_size * m.hidden_size),
        max_context=float(m.max_context),
        moe_inter=float(m.moe_intermediate) if m.is_moe else 0.0,
        moe_gated=bool(m.ffn_gated),
    )


# Weight storage per named precision: (bytes per weight element, GEMM compute dtype, KV dtype). The
# one table of weight bytes of the time model: scaled 4-bit formats carry their scales (NVFP4: 4 bits
# + one fp8 scale per 16 elements = 0.5625 bytes); KV element bytes come from :data:`analysis.kv.DTYPE_BYTES`.
WEIGHT_FORMATS = {
    "bf16": (2.0, "bf16", "bf16"),
    "fp8": (1.0, "fp8", "fp8"),
    "fp4": (0.5625, "fp4", "fp8"),   # NVFP4
    "int4": (0.5625, "bf16", "fp8"),  # weight-only int4, bf16 math
}


@dataclass(frozen=True)
class Precision:
    """Bytes per element of weights, KV cache and activations, and the compute dtype."""

    weight_bytes: float = 2.0
    kv_bytes: float = 2.0
    act_bytes: float = 2.0
    compute: str = "bf16"

    @classmethod
    def named(cls, name: str, kv_dtype: str | None = None) -> "Precision":
        """The precision called ``name`` in :data:`WEIGHT_FORMATS`, with its KV dtype unless
        ``kv_dtype`` names another (a :data:`analysis.kv.DTYPE_BYTES` key)."""
        if name not in WEIGHT_FORMATS:
            raise ValueError(f"unknown precision {name!r}; use one of {sorted(WEIGHT_FORMATS)}")
        wb, compute, kvd = WEIGHT_FORMATS[name]
        return cls(wb, kv.dtype_bytes(kvd if kv_dtype is None else kv_dtype), 2.0, compute)


# ------------------------------------------------------------------------------------ backends

COMM_KINDS = ("allreduce", "alltoall", "p2p")
OP_KINDS = ("gemm", "attention", "state", "moe") + COMM_KINDS


@dataclass(frozen=True)
class Op:
    """One operator of a forward pass on one device, for every candidate plan at once.

    ``kind``: ``gemm`` (projections, dense FFN, LM head; ``shape``: ``m, n, k``), ``attention`` (the
    attention core; ``batch`` sequences, ``tokens`` new, ``kv_tokens`` read, ``pairs`` attended,
    ``kv_heads`` per device), ``state`` (linear attention), ``moe`` (routed and shared experts;
    ``tokens``, ``experts`` on the device, ``k``, ``expert_params``), ``allreduce`` (``bytes`` per
    device message, ``n`` ranks), ``alltoall`` (``bytes`` sent per device, ``n`` ranks) and ``p2p``
    (``bytes``; activation hops, context-parallel and KV transfers). ``flops``/``bytes_``: per
    device; ``peak``/``bw``: the device's FLOP/s and HBM bytes/s (compute kinds); ``wire_s``: the
    link model's seconds (communication kinds); ``dtype``: the compute dtype."""

    kind: str
    shape: dict = field(default_factory=dict)
    flops: Any = 0.0
    bytes_: Any = 0.0
    peak: Any = None
    bw: Any = None
    wire_s: Any = None
    dtype: str = "bf16"


def roofline_backend(op: Op, eff: "Efficiency"):
    """The roofline: ``max(FLOPs / (peak * compute_eff), bytes / (bandwidth * bw_eff))`` for a
    compute operator, the wire time for communication; nothing is measured."""
    if op.kind in COMM_KINDS:
        return op.wire_s, 0.0
    return np.maximum(op.flops / (op.peak * eff.compute), op.bytes_ / (op.bw * eff.bandwidth)), 0.0


_BACKENDS: dict[str, Callable] = {"roofline": roofline_backend}


def register_backend(name: str, fn: Callable, *, replace: bool = False) -> None:
    """Register ``fn(op, eff) -> (seconds, measured_fraction)`` as the backend ``name`` (device
    dicts select it with ``"backend": name``). Registering a taken name needs ``replace=True``."""
    if not callable(fn):
        raise TypeError(f"backend {name!r} must be callable (op, eff) -> (seconds, measured)")
    if name in _BACKENDS and not replace:
        raise ValueError(f"time-model backend {name!r} is already registered")
    _BACKENDS[name] = fn


def unregister_backend(name: str) -> None:
    if name == "roofline":
        raise ValueError("the roofline backend cannot be removed")
    _BACKENDS.pop(name, None)


def get_backend(name: str) -> Callable:
    if name not in _BACKENDS:
        raise ValueError(f"unknown time-model backend {name!r}; registered: {sorted(_BACKENDS)}")
    return _BACKENDS[name]


def backends() -> list[str]:
    return sorted(_BACKENDS)


class Ledger:
    """Operator seconds priced while it was active (:func:`ledger`), summed per plan (arrays
    broadcast) and per kind: ``total_s``, ``measured_s`` and :attr:`measured_share`."""

    def __init__(self):
        self.total_s = 0.0
        self.measured_s = 0.0
        self.by_kind: dict[str, Any] = {}

    def add(self, kind: str, seconds, measured):
        self.total_s = self.total_s + seconds
        self.measured_s = self.measured_s + seconds * measured
        self.by_kind[kind] = self.by_kind.get(kind, 0.0) + seconds

    def absorb(self, other: "Ledger"):
        """Add the seconds another ledger recorded (a ledger closed inside this one)."""
        self.total_s = self.total_s + other.total_s
        self.measured_s = self.measured_s + other.measured_s
        for kind, sec in other.by_kind.items():
            self.by_kind[kind] = self.by_kind.get(kind, 0.0) + sec

    @property
    def measured_share(self):
        """Share of the priced operator seconds that came from measured tables (0 for the roofline)."""
        tot = np.asarray(self.total_s, dtype=float)
        return np.divide(self.measured_s, tot, out=np.zeros_like(tot), where=tot > 0)


_LEDGER: contextvars.ContextVar = contextvars.ContextVar("time_model_ledger", default=None)


@contextlib.contextmanager
def ledger():
    """Record every operator priced inside the ``with`` block (the innermost ledger records; when it
    closes, an enclosing ledger absorbs its totals, so it also sees what was priced inside)."""
    outer = _LEDGER.get()
    led = Ledger()
    tok = _LEDGER.set(led)
    try:
        yield led
    finally:
        _LEDGER.reset(tok)
        if outer is not None:
            outer.absorb(led)


def price(op: Op, eff: "Efficiency", backend: str = "roofline", count=1.0):
    """Seconds of ``count`` instances of ``op`` (e.g. one per layer) through the named backend."""
    sec, measured = get_backend(backend or "roofline")(op, eff)
    t = count * sec
    led = _LEDGER.get()
    if led is not None:
        led.add(op.kind, t, measured)
    return t


def _backend(dev: dict | None) -> str:
    return "roofline" if dev is None else dev.get("backend", "roofline")


def experts_touched(tokens, n_experts: int, k_active: int):
    """Expected number of distinct routed experts hit by ``tokens`` tokens (uniform routing)."""
    t = np.asarray(tokens, dtype=float)
    if n_experts <= 0:
        return np.zeros_like(t)
    return n_experts * (1.0 - (1.0 - k_active / n_experts) ** t)


def attention_block(
    s: Shape,
    prec: Precision,
    eff: Efficiency,
    peak,
    bw,
    *,
    tokens,
    seqs,
    kv_tokens,
    pairs_full,
    pairs_slide,
    tp,
    dp,
    attn_peak=None,
    dec_pairs_full=None,
    dec_pairs_slide=None,
    backend: str = "roofline",
):
    """Time of all attention blocks (all layers) on one device of an instance, per forward pass.

    ``tokens``: new tokens in the pass (whole instance); ``seqs``: sequences in the pass;
    ``kv_tokens``: cached tokens read per full layer (summed over sequences); ``pairs_*``: attended
    (query, key) pairs per full / sliding layer, summed over sequences. ``dec_pairs_*``: the part of
    those pairs that belongs to decoding sequences, priced at the decode rate (MLA attends in the
    latent space when decoding: about 3x the FLOPs of a prefill pair); the rest at the prefill rate.
    Without them, the whole pass is priced at the decode rate when it has one token per sequence
    and at the prefill rate otherwise."""
    # attention core (QK^T, softmax, AV) runs at ``attn_peak`` (FlashAttention in bf16 even when the
    # GEMMs run in fp8/fp4); projections at the GEMM peak
    apk = peak if attn_peak is None else attn_peak
    tok = tokens / dp
    split = np.minimum(tp, s.kv_split_max)
    wb, kb, ab = prec.weight_bytes, prec.kv_bytes, prec.act_bytes
    # projections (one GEMM group per layer)
    proj_f = 2.0 * tok * s.attn_params / tp
    proj_b = s.attn_params * wb / tp + tok * s.h * ab * 2.0
    proj = Op("gemm", {"m": tok, "n": s.attn_params / s.h / tp, "k": s.h}, proj_f, proj_b, peak, bw,
              dtype=prec.compute)
    if dec_pairs_full is None:
        pf = np.where(tokens > seqs, s.pair_flops_prefill, s.pair_flops_decode)
        core_f = pairs_full / dp * pf / tp
        slide_f = pairs_slide / dp * pf / tp
    else:
        core_f = (
            ((pairs_full - dec_pairs_full) * s.pair_flops_prefill + dec_pairs_full * s.pair_flops_decode)
            / dp
            / tp
        )
        dps = 0.0 if dec_pairs_slide is None else dec_pairs_slide
        slide_f = ((pairs_slide - dps) * s.pair_flops_prefill + dps * s.pair_flops_decode) / dp / tp
    # full-attention core
    core_b = (kv_tokens + tokens) / dp * s.kv_elems * kb / split
    kvh = s.kv_split_max / split  # KV heads (or the MLA latent) per device
    core = Op("attention", {"batch": seqs / dp, "tokens": tok, "kv_tokens": kv_tokens / dp,
                            "pairs": pairs_full / dp, "kv_heads": kvh}, core_f, core_b, apk, bw)
    t = price(proj, eff, backend, s.n_full + s.n_sliding) + price(core, eff, backend, s.n_full)
    if s.n_sliding:
        kv_sl = np.minimum(kv_tokens, seqs * s.window)
        sl = Op("attention", {"batch": seqs / dp, "tokens": tok, "kv_tokens": kv_sl / dp,
                              "pairs": pairs_slide / dp, "kv_heads": kvh, "window": s.window},
                slide_f, (kv_sl + tokens) / dp * s.kv_elems * kb / split, apk, bw)
        t = t + price(sl, eff, backend, s.n_sliding)
    if s.n_linear:
        lf = 2.0 * tok * s.lin_params / tp + 4.0 * tok * s.lin_state_elems / tp
        lb = s.lin_params * wb / tp + 2.0 * seqs / dp * s.lin_state_elems * 4.0 / tp + tok * s.h * ab * 2.0
        lin = Op("state", {"batch": seqs / dp, "tokens": tok, "state_elems": s.lin_state_elems / tp},
                 lf, lb, peak, bw, dtype=prec.compute)
        t = t + price(lin, eff, backend, s.n_linear)
    return t


def ffn_block(s: Shape, prec: Precision, eff: Efficiency, peak, bw, *, tokens, n, moe_tp=None,
              split_slowdown=None, backend: str = "roofline"):
    """Time of all FFN blocks (dense and MoE layers) on one device when ``n`` devices share them
    (dense: tensor-split; MoE: experts spread over the ``n`` devices).

    Per dense layer and device: FLOPs ``2 T P / n`` for ``T`` tokens and ``P`` FFN parameters;
    bytes ``P w / n`` of weights plus ``2 T h a`` of activations (a tensor-split FFN reads every
    token's input row and writes a partial output row of width ``h`` on every device; the
    intermediate stays on chip). Per MoE layer, on the device holding the most routed experts,
    ``e = ceil(E / n)`` (:func:`experts_per_device`): routed FLOPs ``2 T k P_e e / E`` times the
    imbalance factor (its experts' share of the ``T k`` routed tokens); shared-expert FLOPs
    ``2 T s P_e / n`` (shared experts are replicated; each device runs its own tokens); router FLOPs
    ``2 T h E / n``; bytes of its touched experts ``e (1 - (1 - k/E)^T) P_e w``, of the ``s``
    replicated shared experts ``s P_e w``, of the router's ``h E`` weights read once, and activations
    ``2 T (k + 1) h a / n`` (each token's row read and written once per routed expert and once more
    for the router and shared path). With ``n = 1`` the touched experts are ``E (1 - (1 - k/E)^T)``.

    ``moe_tp`` (default ``None``: every expert whole, spread over the ``n`` devices) is the expert
    tensor-parallel size of a recorded run (:func:`moe_split`): the ``n`` devices form ``ep = n /
    moe_tp`` expert-parallel groups, each expert is split ``moe_tp`` ways (its GEMMs ``1 / moe_tp`` as
    wide, as AIConfigurator's MoE operator and kernel tables take ``moe_tp_size``), the busiest device
    holds ``ceil(E / ep)`` expert slices, and the load-imbalance factor applies only where experts are
    spread (``ep > 1``): with ``ep = 1`` every device computes every expert's slice for all tokens.
    The roofline prices tensor-split and spread experts alike (the same FLOPs and expert bytes per
    device); the measured kernels are slower split. ``split_slowdown(s, tokens=, n=, moe_tp=)`` (a
    device's, e.g. :func:`analysis.measured.moe_split_slowdown` bound to the plans' GPUs) gives per plan
    how much slower; the roofline's routed-expert FLOPs and bytes of a tensor-split run are scaled by it
    (roofline backend only: the measured backends read the MoE table at ``moe_tp`` themselves)."""
    wb, ab = prec.weight_bytes, prec.act_bytes
    t = 0.0
    if s.n_dense:
        f = 2.0 * tokens * s.dense_params / n
        b = s.dense_params * wb / n + tokens * s.h * ab * 2.0
        op = Op("gemm", {"m": tokens, "n": s.dense_params / s.h / n, "k": s.h}, f, b, peak, bw,
                dtype=prec.compute)
        t = t + price(op, eff, backend, s.n_dense)
    if s.n_moe:
        E, k = s.n_experts, s.k_active
        if moe_tp is None:  # experts whole, spread over the n devices
            ep, etp, imb = n, 1.0, eff.moe_imbalance
        else:
            etp = np.asarray(moe_tp, dtype=float)
            ep = np.asarray(n, dtype=float) / etp
            imb = np.where(ep > 1, eff.moe_imbalance, 1.0)
        e_dev = experts_per_device(s, ep)  # the device holding the most routed experts (or slices)
        touched = e_dev * (1.0 - (1.0 - k / E) ** np.asarray(tokens, dtype=float))
        # the shared experts and the router (own tokens), which the measured MoE tables do not hold
        rest_f = 2.0 * tokens * s.n_shared * s.expert_params / n + 2.0 * tokens * s.h * E / n
        rest_b = s.n_shared * s.expert_params * wb + s.h * E * wb + tokens * s.h * ab * 2.0 / n
        slow = 1.0  # the tensor-split experts' measured slowdown against spread ones (roofline only)
        if moe_tp is not None and split_slowdown is not None and (backend or "roofline") == "roofline":
            slow = split_slowdown(s, tokens=tokens, n=n, moe_tp=etp)
        f = 2.0 * tokens * k * s.expert_params * e_dev / E / etp * imb * slow + rest_f  # routed + rest
        b = touched * s.expert_params * wb / etp * slow + tokens * k * s.h * ab * 2.0 / n + rest_b
        op = Op("moe", {"tokens": tokens, "experts": e_dev, "n_experts": E, "k": k, "n_shared": s.n_shared,
                        "expert_params": s.expert_params, "n": ep, "hidden": s.h, "inter": s.moe_inter,
                        "moe_tp": etp, "gated": s.moe_gated, "imbalance": imb, "rest_flops": rest_f,
                        "rest_bytes": rest_b}, f, b, peak, bw, dtype=prec.compute)
        t = t + price(op, eff, backend, s.n_moe)
    return t


def experts_per_device(s: Shape, n):
    """Routed experts on the busiest of ``n`` devices: ``ceil(E / n)`` (with ``n > E`` one expert per
    device; with ``E`` not a multiple of ``n`` some devices hold one more)."""
    return np.ceil(s.n_experts / np.maximum(np.asarray(n, dtype=float), 1.0))


def head_time(s: Shape, prec: Precision, eff: Efficiency, peak, bw, *, seqs, tokens, n,
              backend: str = "roofline"):
    """LM head for the ``seqs`` tokens that produce logits, plus the embedding gather."""
    f = 2.0 * seqs * s.vocab * s.h / n
    b = s.vocab * s.h * prec.weight_bytes / n + tokens * s.h * prec.act_bytes
    op = Op("gemm", {"m": seqs, "n": s.vocab / n, "k": s.h}, f, b, peak, bw, dtype=prec.compute)
    return price(op, eff, backend)


def hierarchical_time(bytes_out, n, link, net, domain, eff: Efficiency):
    """Seconds for a device to send ``bytes_out`` spread evenly over the other ``n - 1`` devices of
    its group when only ``domain`` devices share a scale-up domain: the share for the
    ``min(n, domain) - 1`` peers inside the domain goes over the scale-up ``link``, the rest over
    the NIC (``net``), both at once (hierarchical: intra-domain first, DeepEP-style), so the time is
    ``max(bytes_in / link, bytes_out_of_domain / net)`` at the link efficiency. With ``n <= domain``
    it is ``bytes_out / link``: the switch happens exactly at the domain size."""
    n = np.asarray(n, dtype=float)
    f_in = np.where(n > 1, (np.minimum(n, domain) - 1) / np.maximum(n - 1, 1), 1.0)
    if net is None:
        net = link
    return np.maximum(bytes_out * f_in / (link * eff.link), bytes_out * (1 - f_in) / (net * eff.link))


def comm_time(
    s: Shape,
    prec: Precision,
    eff: Efficiency,
    link,
    *,
    tokens,
    tp,
    dp,
    cp_tokens=0.0,
    net=None,
    domain=np.inf,
    moe_tp=None,
    backend: str = "roofline",
):
    """Intra-instance communication per forward: two TP all-reduces per layer (ring: each device
    moves ``2 (tp-1)/tp`` of the activations; TP stays inside a scale-up domain) and, for MoE with
    ``n = tp*dp > 1``, an all-to-all dispatch + combine per MoE layer (each token's activation to the
    distinct devices of its ``k`` experts; the ``(n-1)/n`` that leaves the device is sent
    hierarchically: :func:`hierarchical_time` with the scale-out bandwidth ``net`` and the
    ``domain`` size; the defaults keep every device on the scale-up link).

    ``moe_tp`` (default ``None``: the all-to-all above, every expert whole on one of the ``n``
    devices) prices a recorded MoE split (:func:`moe_split`: ``ep = n / moe_tp`` expert-parallel
    groups of ``moe_tp`` devices that split each expert) as the serving engines move the tokens
    (AIConfigurator's ``MoEDispatch``, the convention its runs were priced by): with attention data
    parallelism ``dp = 1`` every device already holds every token after the attention all-reduce, so
    the experts (split or spread) need no dispatch and their partial outputs are summed by the layer's
    second all-reduce (nothing beyond the two per layer); with ``dp > 1`` an expert-parallel split
    (``ep > 1``) dispatches and combines by the all-to-all among the ``ep`` groups (``n`` replaced by
    ``ep`` above), and a tensor split gathers the other data-parallel ranks' rows inside each group
    before the experts and reduce-scatters them after (:func:`moe_gather_time`)."""
    n = tp * dp
    ab = prec.act_bytes
    tok = tokens / dp
    t = allreduce_time(s, prec, eff, link, tokens=tok, n=tp, per_layer=2, backend=backend)
    if s.n_moe and moe_tp is not None:
        etp = np.asarray(moe_tp, dtype=float)
        ep = n / etp
        out = 2.0 * tok * distinct_destinations(s, ep) * s.h * ab * (ep - 1) / ep * eff.moe_imbalance
        a2a = hierarchical_time(out, n, link, net, domain, eff) + 2 * eff.collective_latency_s
        a2a = np.where((dp > 1) & (ep > 1), a2a, 0.0)
        t = t + price(Op("alltoall", {"bytes": out, "n": ep, "tokens": tok, "hidden": s.h, "k": s.k_active,
                                      "n_experts": s.n_experts, "imbalance": eff.moe_imbalance,
                                      "domain": domain, "act_bytes": ab},
                         bytes_=out, wire_s=a2a), eff, backend, s.n_moe)
        t = t + moe_gather_time(s, prec, eff, link, tokens=tokens, dp=dp, moe_tp=etp, ep=ep, net=net,
                                domain=domain, backend=backend)
    elif s.n_moe:
        # the busiest expert device receives (dispatch) and sends back (combine) moe_imbalance times the
        # mean traffic, and the collective ends when it does
        out = 2.0 * tok * distinct_destinations(s, n) * s.h * ab * (n - 1) / n * eff.moe_imbalance
        a2a = hierarchical_time(out, n, link, net, domain, eff) + 2 * eff.collective_latency_s
        a2a = np.where(n > 1, a2a, 0.0)
        t = t + price(Op("alltoall", {"bytes": out, "n": n, "tokens": tok, "hidden": s.h, "k": s.k_active,
                                      "n_experts": s.n_experts, "imbalance": eff.moe_imbalance,
                                      "domain": domain, "act_bytes": ab},
                         bytes_=out, wire_s=a2a), eff, backend, s.n_moe)
    else:
        # dense FFN split over all n devices with attention DP: gather/scatter around the FFN
        by = 2.0 * tok * s.h * ab
        x = np.where(dp > 1, by / (link * eff.link) + eff.collective_latency_s, 0.0)
        t = t + price(Op("p2p", {"bytes": by, "n": dp}, bytes_=by, wire_s=x), eff, backend, s.n_layers)
    return t + cp_time(s, prec, eff, link, cp_tokens=cp_tokens, dp=dp, backend=backend)


def moe_split(n, moe_tp=None, moe_ep=None):
    """The expert tensor-parallel size of an instance of ``n = tp * dp`` devices from a run's recorded
    ``moe_tp_size`` / ``moe_ep_size`` (AIConfigurator's fields; ``tp * dp = moe_tp * moe_ep`` in its
    configurations): ``moe_tp`` where the two multiply to ``n``, else ``n / moe_ep`` where ``moe_ep``
    divides ``n``, else 1 (every expert whole, spread over the ``n`` devices: the default split).
    Missing values are NaN; vectorised."""
    n = np.asarray(n, dtype=float)
    mt = np.asarray(moe_tp if moe_tp is not None else np.nan, dtype=float)
    me = np.asarray(moe_ep if moe_ep is not None else np.nan, dtype=float)
    both = np.isfinite(mt) & np.isfinite(me) & (mt >= 1) & (np.abs(mt * me - n) < 1e-9)
    q = np.divide(n, me, out=np.full(np.broadcast_shapes(n.shape, me.shape), np.nan), where=me >= 1)
    from_ep = np.isfinite(q) & (np.abs(q - np.round(q)) < 1e-9) & (q >= 1)
    return np.where(both, mt, np.where(from_ep, np.round(q), 1.0))


def moe_gather_time(s: Shape, prec: Precision, eff: Efficiency, link, *, tokens, dp, moe_tp, ep=1.0, net=None,
                    domain=np.inf, backend: str = "roofline"):
    """Gather and scatter around tensor-split experts under attention data parallelism (per forward):
    before each MoE layer a device of an expert tensor-parallel group of ``moe_tp`` devices receives
    the rows its peers hold that it lacks, after it reduce-scatters their partial outputs back
    (AIConfigurator's ``all_gather`` / ``reduce_scatter`` of ``dp`` times the layer's activations).
    Peers hold different rows only across data-parallel ranks, so a device receives ``min(moe_tp, dp)
    - 1`` times the rows it holds for its group: its ``tokens / dp`` rows, times the distinct
    expert-parallel groups they go to where ``ep > 1`` (:func:`distinct_destinations`); twice (gather
    and scatter) over the scale-up link (:func:`hierarchical_time` across ``domain``) plus two
    collective latencies; 0 without data parallelism or without a tensor split."""
    dp = np.asarray(dp, dtype=float)
    etp = np.asarray(moe_tp, dtype=float)
    peers = np.minimum(etp, dp) - 1.0
    rows = tokens / dp * distinct_destinations(s, ep) * peers
    by = 2.0 * rows * s.h * prec.act_bytes
    x = np.where(peers > 0, hierarchical_time(by, etp, link, net, domain, eff)
                 + 2 * eff.collective_latency_s, 0.0)
    return price(Op("p2p", {"bytes": by, "n": etp}, bytes_=by, wire_s=x), eff, backend, s.n_moe)


def allreduce_time(s: Shape, prec: Precision, eff: Efficiency, link, *, tokens, n, per_layer=2,
                   backend: str = "roofline"):
    """``per_layer`` ring all-reduces per layer of ``tokens`` activation rows over ``n`` devices
    (each device moves ``2 (n-1)/n`` of the message, plus the collective latency); 0 for ``n = 1``."""
    by = tokens * s.h * prec.act_bytes
    ar = np.where(n > 1, 2.0 * (n - 1) / n * tokens * s.h * prec.act_bytes / (link * eff.link)
                  + eff.collective_latency_s, 0.0)
    return price(Op("allreduce", {"bytes": by, "n": n}, bytes_=by, wire_s=ar), eff, backend,
                 per_layer * s.n_layers)


def cp_time(s: Shape, prec: Precision, eff: Efficiency, link, *, cp_tokens, dp, backend: str = "roofline"):
    """Context parallelism: a prompt with fewer sequences than DP ranks is split over the ranks
    (ring attention); each rank receives the other ranks' KV of ``cp_tokens`` tokens per layer."""
    x = np.where(
        (cp_tokens > 0) & (dp > 1),
        (s.n_full + s.n_sliding) * cp_tokens * (dp - 1) / dp * s.kv_elems * prec.kv_bytes / (link * eff.link),
        0.0,
    )
    by = cp_tokens * (dp - 1) / dp * s.kv_elems * prec.kv_bytes
    return price(Op("p2p", {"bytes": by, "n": dp, "layers": s.n_full + s.n_sliding}, bytes_=by, wire_s=x),
                 eff, backend)


def pass_inputs(s: Shape, *, dec_seqs=0.0, dec_ctx=0.0, pre_seqs=0.0, pre_len=0.0, pre_prefix=0.0):
    """Tokens, sequences, cached tokens read and attended pairs of one forward pass holding
    ``dec_seqs`` decoding sequences at context ``dec_ctx`` and ``pre_seqs`` prefill chunks of
    ``pre_len`` new tokens after ``pre_prefix`` cached ones (all broadcastable arrays)."""
    dec_seqs, dec_ctx, pre_seqs, pre_len, pre_prefix = (
        np.asarray(x, dtype=float) for x in (dec_seqs, dec_ctx, pre_seqs, pre_len, pre_prefix)
    )
    tokens = dec_seqs + pre_seqs * pre_len
    seqs = dec_seqs + pre_seqs
    kv_tokens = dec_seqs * dec_ctx + pre_seqs * pre_prefix
    dec_full = dec_seqs * (dec_ctx + 1)
    pairs_full = dec_full + pre_seqs * kv.attended_pairs(pre_len, pre_prefix)
    if s.n_sliding:
        w = s.window
        dec_slide = dec_seqs * np.minimum(dec_ctx + 1, w)
        pairs_slide = dec_slide + pre_seqs * kv.attended_pairs(pre_len, pre_prefix, w)
    else:
        pairs_slide = np.zeros_like(pairs_full)
        dec_slide = pairs_slide
    # prompts fewer than the DP ranks are split over them (context parallelism, see cp_time)
    cp_tokens = pre_seqs * pre_len
    return dict(
        tokens=tokens,
        seqs=seqs,
        kv_tokens=kv_tokens,
        pairs_full=pairs_full,
        pairs_slide=pairs_slide,
        dec_pairs_full=dec_full,
        dec_pairs_slide=dec_slide,
        cp_tokens=cp_tokens,
    )


def forward_parts(
    s: Shape, prec: Precision, eff: Efficiency, dev_attn: dict, dev_ffn: dict, *, tp, dp, n_ffn, moe_tp=None,
    **pass_kw
):
    """Per-forward times of the parts: attention side (attention blocks + LM head + overheads),
    FFN side (FFN blocks; ``moe_tp``: a recorded expert tensor-parallel size, :func:`ffn_block`) and
    the intra-instance communication (of the attention side)."""
    p = pass_inputs(s, **pass_kw)
    ta = attention_side(s, prec, eff, dev_attn, p, tp=tp, dp=dp)
    tf = ffn_side(s, prec, eff, dev_ffn, p, n_ffn=n_ffn, moe_tp=moe_tp)
    return ta, tf, p


def attention_side(s: Shape, prec: Precision, eff: Efficiency, dev_attn: dict, p: dict, *, tp, dp):
    """The attention side of :func:`forward_parts` (attention blocks + LM head) for the pass inputs
    ``p`` (:func:`pass_inputs`); it reads only ``dev_attn``."""
    ta = attention_block(
        s,
        prec,
        eff,
        dev_attn["flops"],
        dev_attn["bw"],
        tokens=p["tokens"],
        seqs=p["seqs"],
        kv_tokens=p["kv_tokens"],
        pairs_full=p["pairs_full"],
        pairs_slide=p["pairs_slide"],
        tp=tp,
        dp=dp,
        attn_peak=dev_attn.get("attn_flops"),
        dec_pairs_full=p["dec_pairs_full"],
        dec_pairs_slide=p["dec_pairs_slide"],
        backend=_backend(dev_attn),
    )
    return ta + head_time(
        s, prec, eff, dev_attn["flops"], dev_attn["bw"], seqs=p["seqs"], tokens=p["tokens"], n=tp * dp,
        backend=_backend(dev_attn),
    )


def ffn_side(s: Shape, prec: Precision, eff: Efficiency, dev_ffn: dict, p: dict, *, n_ffn, moe_tp=None):
    """The FFN side of :func:`forward_parts` for the pass inputs ``p``; it reads only ``dev_ffn``."""
    return ffn_block(s, prec, eff, dev_ffn["flops"], dev_ffn["bw"], tokens=p["tokens"], n=n_ffn,
                     moe_tp=moe_tp, split_slowdown=dev_ffn.get("moe_split_slowdown"),
                     backend=_backend(dev_ffn))


def colocated_pass_time(
    s: Shape, prec: Precision, eff: Efficiency, dev: dict, *, tp, dp=1, microbatches=1, moe_tp=None, **pass_kw
):
    """Time of one forward pass on an instance of ``tp * dp`` devices holding attention and FFN.
    ``moe_tp``: the expert tensor-parallel size a recorded run used (:func:`moe_split`; default: every
    expert whole, spread over the devices, dispatched by all-to-all), priced by :func:`ffn_block`
    and :func:`comm_time`.

    ``microbatches`` ``m > 1`` splits the pass's sequences into ``m`` micro-batches whose
    communication overlaps the other micro-batches' computation (DeepSeek's two-micro-batch
    overlap): with ``c`` the compute and ``k`` the communication of one micro-batch, the pass takes
    ``max(m * max(c, k), c + k)`` plus the fixed overheads (``m = 1``: ``c + k``). Splitting repeats
    the weight reads of every micro-batch, so it pays only where communication is a large share."""
    tp = np.asarray(tp, dtype=float)
    dp = np.asarray(dp, dtype=float)
    m = np.asarray(microbatches, dtype=float)
    if np.any(m != 1):
        pass_kw = {
            k: (np.asarray(v, dtype=float) / m if k in ("dec_seqs", "pre_seqs") else v)
            for k, v in pass_kw.items()
        }
    ta, tf, p = forward_parts(s, prec, eff, dev, dev, tp=tp, dp=dp, n_ffn=tp * dp, moe_tp=moe_tp, **pass_kw)
    cp = np.where(np.asarray(pass_kw.get("pre_seqs", 0.0)) < dp, p["cp_tokens"], 0.0)
    tc = comm_time(
        s,
        prec,
        eff,
        dev["link"],
        tokens=p["tokens"],
        tp=tp,
        dp=dp,
        cp_tokens=cp,
        net=dev.get("net"),
        domain=dev.get("domain", np.inf),
        moe_tp=moe_tp,
        backend=_backend(dev),
    )
    c = ta + tf
    return overlap_time(c, tc, m, eff.overlap) + eff.step_overhead_s + s.n_layers * eff.layer_overhead_s


def overlap_time(c, k, m, overlap=1.0):
    """Compute ``c`` and communication ``k`` of one of ``m`` micro-batches, pipelined on two
    resources: perfectly, ``max(m * max(c, k), c + k)``; ``m = 1`` gives ``c + k``. ``overlap`` is
    the share of the hideable time that is hidden (:attr:`Efficiency.overlap`): :func:`pipelined`."""
    return pipelined(m * (c + k), np.maximum(m * np.maximum(c, k), c + k), overlap)


def pipelined(serial, perfect, overlap):
    """Time of work that takes ``serial`` one micro-batch after another and ``perfect`` when every
    hideable part is hidden: ``serial - overlap * (serial - perfect)`` (``overlap = 1``: perfect;
    ``0``: no overlap). The one rule for imperfect micro-batch overlap (colocated two-micro-batch
    overlap here; an attention/FFN ring takes the same rule with its own serial and perfect times)."""
    return serial - overlap * (serial - perfect)


# Layer-wise overlap of a load (a cached prefix read from a tier, the PD KV transfer) with the pass's
# computation: the share of the hideable time that is hidden. 1 (the default) is the ideal layer-wise
# pipeline, an ASSUMPTION with no measured fraction behind it: Mooncake and DistServe describe their
# layer-wise KV transfer as overlapped with computation without giving how much of it hides. Its size is
# stated where it matters (chapter 3's evidence page prices the PD validation at 0 and 0.5).
LAYERWISE_OVERLAP = 1.0


def layerwise_overlap(compute, load, layers, overlap: float = LAYERWISE_OVERLAP):
    """Service time of a pass whose ``load`` (e.g. a cached prefix read from a tier) is overlapped
    layer by layer with its ``compute``: ideally the longer of the two plus one layer's share of the
    shorter, ``max(c, l) + min(c, l) / layers`` (the first layer's load cannot hide, nor the last
    layer's compute); ``overlap`` < 1 hides only that share of what the ideal pipeline hides
    (:func:`pipelined`; 0: ``c + l``). The one overlap rule of chapter 2's replay and chapter 5's
    composition."""
    _check_share(overlap)
    ideal = np.maximum(compute, load) + np.minimum(compute, load) / layers
    return ideal if overlap == 1.0 else pipelined(compute + load, ideal, overlap)


def _check_share(overlap):
    if not (np.isscalar(overlap) and 0.0 <= float(overlap) <= 1.0):
        raise ValueError(f"overlap must be a share in [0, 1] of the hideable time, got {overlap!r}")


@functools.lru_cache(maxsize=256)
def _named_shape(name: str) -> Shape:
    return shape(name)


def shape_of(model) -> Shape:
    """The :class:`Shape` of a model name (memoised), spec or shape."""
    if isinstance(model, Shape):
        return model
    return _named_shape(model) if isinstance(model, str) else shape(model)


def instance_device(gpu, prec: Precision = Precision()) -> dict:
    """A GPU of ``data/hardware.csv`` as the time model's device dict: GEMM peak at the precision's
    compute dtype, attention core in bf16, HBM bandwidth, and the per-direction scale-up link (half
    the NVLink figure, which counts both directions; PCIe where a GPU has no NVLink)."""
    g = _gpu(gpu)
    return {"flops": g.flops(prec.compute), "attn_flops": g.flops("bf16"), "bw": g["hbm_bandwidth"],
            "link": g.values.get("nvlink_bandwidth", g.values.get("pcie_bandwidth", 64e9)) / 2.0}


def prefill_time(model, gpu, n_new, prefix=0.0, *, tp=1, seqs=1.0, prec: Precision = Precision(),
                 eff: Efficiency = Efficiency(), dev: dict | None = None):
    """Seconds of one forward pass prefilling ``seqs`` prompts of ``n_new`` new tokens after
    ``prefix`` cached ones each, on one instance of ``tp`` GPUs (tensor-parallel all-reduces, per-step
    and per-layer overheads, attention by its attended pairs; vectorised over ``n_new`` and
    ``prefix``). ``dev`` overrides the device dict of ``gpu`` (:func:`instance_device`)."""
    n_new = np.asarray(n_new, dtype=float)
    if np.any(n_new < 0):
        raise ValueError("n_new must be >= 0 tokens")
    d = instance_device(gpu, prec) if dev is None else dev
    t = colocated_pass_time(shape_of(model), prec, eff, d, tp=float(tp), dp=1.0, pre_seqs=seqs,
                            pre_len=n_new, pre_prefix=np.asarray(prefix, dtype=float))
    return np.asarray(t, dtype=float)


def decode_step_time(model, gpu, context, *, tp=1, seqs=1.0, prec: Precision = Precision(),
                     eff: Efficiency = Efficiency(), dev: dict | None = None):
    """Seconds of one decode step of ``seqs`` sequences that each hold ``context`` tokens, on one
    instance of ``tp`` GPUs (the same pass as :func:`prefill_time`, one new token per sequence)."""
    d = instance_device(gpu, prec) if dev is None else dev
    t = colocated_pass_time(shape_of(model), prec, eff, d, tp=float(tp), dp=1.0, dec_seqs=seqs,
                            dec_ctx=np.asarray(context, dtype=float))
    return np.asarray(t, dtype=float)


def distinct_destinations(s: Shape, n):
    """Expected number of distinct devices a token's ``k`` routed experts live on when the experts
    are spread over ``n`` devices (a token is sent once per destination device); 1 for dense FFNs."""
    n = np.asarray(n, dtype=float)
    if not s.n_moe:
        return np.ones_like(n)
    k = s.k_active
    return np.where(n > 1, n * (1.0 - (1.0 - 1.0 / np.maximum(n, 1.0)) ** k), 1.0)


def af_hop_time(
    s: Shape,
    prec: Precision,
    eff: Efficiency,
    net,
    *,
    tokens,
    n_attn,
    n_ffn,
    link=None,
    domain=0.0,
    per_direction=False,
    backend: str = "roofline",
):
    """One attention->FFN->attention round trip of ``tokens`` activations in one layer (the slower
    side's per-device link bounds it; MoE tokens go to the distinct devices of their ``k`` experts).

    Without ``link`` every byte goes at ``net``. With ``link`` (scale-up bandwidth) and ``domain``
    (devices per scale-up domain), a pair of pools that fits in one domain (``n_attn + n_ffn <=
    domain``) talks at ``link``; a larger pair sends the share ``domain / (n_attn + n_ffn)`` of its
    traffic inside the domain and the rest over ``net``, both at once. ``per_direction=True`` returns
    the one-way time (dispatch A->F; the combine F->A takes the same on the opposite direction of a
    full-duplex link), for pipelines that charge each direction separately."""
    fan = distinct_destinations(s, n_ffn)
    by = tokens * s.h * prec.act_bytes * fan
    per_dev = np.maximum(by / n_attn, by / n_ffn)
    if link is None:
        one = per_dev / (net * eff.link)
    else:
        f_in = np.minimum(1.0, domain / (n_attn + n_ffn))
        one = np.maximum(per_dev * f_in / (link * eff.link), per_dev * (1 - f_in) / (net * eff.link))
    one = one + eff.collective_latency_s
    one = price(Op("p2p", {"bytes": per_dev, "n_attn": n_attn, "n_ffn": n_ffn}, bytes_=per_dev, wire_s=one),
                eff, backend)
    return one if per_direction else 2.0 * one


def weight_bytes_per_device(s: Shape, prec: Precision, *, tp, n, part="all"):
    """Weight bytes on each device: attention weights split ``tp`` ways (replicated over DP),
    embeddings and dense FFNs split over the ``n`` devices; MoE layers hold ``ceil(E / n)`` routed
    experts on the fullest device, every shared expert and the router."""
    a = (s.attn_weights) * prec.weight_bytes / tp + (
        s.embed_params + s.lm_head_params
    ) * prec.weight_bytes / n
    moe = (
        s.n_moe * ((experts_per_device(s, n) + s.n_shared) * s.expert_params + s.h * s.n_experts)
        if s.n_moe
        else 0.0
    )
    f = (s.n_dense * s.dense_params / n + moe) * prec.weight_bytes
    return {"all": a + f, "attn": a, "ffn": f}[part]


def kv_bytes_per_device(s: Shape, prec: Precision, *, seqs, ctx, tp, dp):
    """KV cache (and linear-attention state) per device for ``seqs`` sequences of ``ctx`` tokens."""
    ctx = np.asarray(ctx, dtype=float)
    split = np.minimum(tp, s.kv_split_max)
    per_seq = (s.n_full * ctx + s.n_sliding * np.minimum(ctx, s.window)) * s.kv_elems * prec.kv_bytes / split
    per_seq = per_seq + s.n_linear * s.lin_state_elems * 4.0 / tp
    return seqs / dp * per_seq


def kv_transfer_bytes(s: Shape, prec: Precision, tokens):
    """KV bytes of one sequence of ``tokens`` tokens, what PD disaggregation moves from the prefill to
    the decode instance: every token for full-attention layers, at most ``window`` tokens for
    sliding-window layers, the fixed fp32 state of linear-attention layers."""
    t = np.asarray(tokens, dtype=float)
    per = (s.n_full * t + s.n_sliding * np.minimum(t, s.window)) * s.kv_elems * prec.kv_bytes
    return per + s.n_linear * s.lin_state_elems * 4.0


def kv_transfer_exposed(s: Shape, prec: Precision, eff: Efficiency, *, seqs, tokens, t_pass, devices, net,
                        backend: str = "roofline", overlap: float = LAYERWISE_OVERLAP):
    """Exposed time of the PD KV transfer of one prefill pass of ``seqs`` prompts of ``tokens``
    tokens over the NICs of ``devices`` prefill devices at ``net`` bytes/s each: the transfer
    ``x = seqs * kv_transfer_bytes / (devices * net * link_eff)`` runs layer by layer behind the pass
    of duration ``t_pass``, so what shows is ``max(x - t_pass, 0) + x / n_layers`` (the part longer
    than the pass, plus the last layer's share, which can only start when the pass ends). ``overlap``
    (:data:`LAYERWISE_OVERLAP`, an assumption) < 1 hides only that share of what the ideal pipeline
    hides (0: the whole transfer shows, ``x``)."""
    _check_share(overlap)
    by = seqs * kv_transfer_bytes(s, prec, tokens)
    x = price(Op("p2p", {"bytes": by / devices, "n": devices}, bytes_=by / devices,
                 wire_s=by / (devices * net * eff.link)), eff, backend)
    ideal = np.maximum(x - t_pass, 0.0) + x / s.n_layers
    return ideal if overlap == 1.0 else pipelined(x, np.minimum(ideal, x), overlap)
