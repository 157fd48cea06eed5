"""Parameter schema of chapter 4 (``book/04_qevict.md``; see :mod:`analysis.params`) and its typed
configuration, :class:`QEvictConfig`, grouped by concern. This module imports no computation module:
the policies and document genres below are written here as data, and ``tests/test_params_schema.py``
checks them against :mod:`analysis.qevict.policies` and :mod:`analysis.qevict.corpora`."""
from __future__ import annotations

from dataclasses import dataclass

from ..params import Param, ParameterError, Schema, register

# what the computation modules implement (checked by tests/test_params_schema.py)
POLICIES = ("full", "streaming", "h2o", "tova", "snapkv", "kivi2", "kivi4", "mikv", "qevict_dequant",
            "qevict_recall", "quest", "h2o_recall", "snapkv_recall")  # policies.POLICIES
GENRES = ("code", "docs", "needle", "ref", "news", "tests", "lit", "encyc", "man")  # corpora.GENRES
HEAD_DIM = 64  # head dimension of the chapter's model (SmolLM2-135M): quantization groups divide it
CONTEXT_TOKENS = 8192  # the model's context window

# The default (book-build) run: one document per genre, six genres (three documents, the fewest the
# declared QEvict rule accepts, leave its Holm-corrected t tests on 2 degrees of freedom without power:
# 39 of 40 pairs unclear), decoded for 64 steps, the length the frozen settings were tuned at (96 in
# earlier editions: sweeps/qevict_genres.yaml). Long context comes from the committed runs of
# sweeps/qevict_long.yaml (results/), read by analysis.qevict.longview.
DEFAULT_DOCUMENTS = ["code:argparse", "docs:typing", "needle:turtle", "ref:assignment", "news:NEWS",
                     "tests:argparse"]

PARAMS = {
    "documents": Param(
        DEFAULT_DOCUMENTS,
        "list[str]",
        "evaluation documents: 'code:<stdlib module>', 'docs:<stdlib module>' (docstrings), "
        "'needle:<stdlib module>' (multi-key retrieval on its docstrings), 'ref:<topic>' "
        "(language reference), 'news:<NEWS|NEWS2x|HISTORY>' (IDLE release notes), "
        "'tests:<module>' (Lib/test/test_<module>.py)",
    ),
    "tuned_settings": Param(
        "results/qevict_tuned.json",
        "str",
        "frozen QEvict/MiKV settings per budget from the search on tuning documents "
        "(python -m analysis.qevict.tuning); 'none': the hand-set knobs below",
    ),
    "prefill_tokens": Param(
        1024,
        "int",
        "tokens prefilled at full attention before compression (a multiple of window_tokens)",
        min=64,
        max=8192,
    ),
    "decode_tokens": Param(64, "int", "teacher-forced decoding steps after the prefill", min=8, max=4096),
    "budgets": Param(
        [0.10, 0.20, 0.35, 0.50],
        "list[float]",
        "memory budgets as fractions of the full cache's bytes",
        min=0.01,
        max=1.0,
    ),
    "policies": Param(
        list(POLICIES), "list[str]", "policies compared (the full cache always runs)", choices=list(POLICIES)
    ),
    "window_tokens": Param(32, "int", "window size in tokens (unit of every decision)", min=4, max=512),
    "group_size": Param(
        32, "int", "quantization group (tokens for keys, channels for values)", choices=[8, 16, 32, 64]
    ),
    "qevict_bits": Param(
        2, "int", "bits of the quantized tier of MiKV-style and QEvict", choices=[2, 3, 4, 8]
    ),
    "full_share": Param(
        0.5,
        "float",
        "share of the budget kept at full precision when MiKV/QEvict must evict",
        min=0.05,
        max=1.0,
    ),
    "score_decay": Param(
        0.95, "float", "per-step decay of the MiKV/QEvict accumulated attention", min=0.5, max=1.0
    ),
    "sink_windows": Param(
        1, "int", "leading windows protected as attention sinks (every policy)", min=0, max=8
    ),
    "snap_obs_tokens": Param(
        32, "int", "SnapKV/QEvict observation window at the end of the prefill", min=1, max=1024
    ),
    "snap_kernel": Param(7, "int", "SnapKV max-pooling kernel (tokens)", min=1, max=63),
    "n_needles": Param(4, "int", "needles inserted in each needle document", min=1, max=30),
    "n_queries": Param(2, "int", "needles asked for at the end of each needle document", min=1, max=30),
    "lir_gap_steps": Param(16, "int", "L: inactive steps before a re-activation counts (Global LIR)", min=1),
    "lir_tau": Param(
        1.0, "float", "a window is active when its attention >= tau x a uniform share", min=0.01, max=100.0
    ),
    "heatmap_document": Param(0, "int", "index in documents of the document in the drift heatmap", min=0),
    "heatmap_layer": Param(
        15, "int", "layer shown in the drift heatmap (-1: mean over layers)", min=-1, max=29
    ),
    "seed": Param(0, "int", "seed of the needle documents and of the bootstrap", min=0),
    "n_boot": Param(2000, "int", "bootstrap resamples for confidence intervals over documents", min=100),
}


def check_consistency(p: dict) -> None:
    """Cross-parameter checks (after the schema's type and range checks)."""
    errs = []
    if p["prefill_tokens"] % p["window_tokens"]:
        errs.append(
            f"prefill_tokens ({p['prefill_tokens']}) must be a multiple of "
            f"window_tokens ({p['window_tokens']})"
        )
    if p["window_tokens"] % p["group_size"] or HEAD_DIM % p["group_size"]:
        errs.append(
            f"group_size ({p['group_size']}) must divide window_tokens ({p['window_tokens']}) "
            f"and the head dimension {HEAD_DIM}"
        )
    if p["prefill_tokens"] + p["decode_tokens"] + 1 > CONTEXT_TOKENS:
        errs.append(f"prefill_tokens + decode_tokens + 1 must fit in the model's {CONTEXT_TOKENS:,}-token "
                    f"context")
    if p["n_queries"] > p["n_needles"]:
        errs.append(f"n_queries ({p['n_queries']}) must not exceed n_needles ({p['n_needles']})")
    if p["heatmap_document"] >= len(p["documents"]):
        errs.append(
            f"heatmap_document ({p['heatmap_document']}) must index documents (0..{len(p['documents']) - 1})"
        )
    for d in p["documents"]:
        kind, sep, mod = d.partition(":")
        if kind not in GENRES or not sep or not mod:
            errs.append(f"documents: {d!r} must be one of " + ", ".join(f"'{g}:<name>'" for g in GENRES))
    nw = p["prefill_tokens"] // p["window_tokens"]
    for f in p["budgets"]:
        if f * (nw + 1) < p["sink_windows"] + 1:
            errs.append(
                f"budget {f} cannot hold the {p['sink_windows']} sink window(s) and the open window "
                f"with {nw} prefill windows; raise the budget or prefill_tokens, or lower window_tokens"
            )
    if len(set(p["budgets"])) != len(p["budgets"]):
        errs.append("budgets must be distinct")
    if errs:
        raise ParameterError("invalid parameters:\n  - " + "\n  - ".join(errs))


# ------------------------------------------------------------------------- typed configuration
# Each field is the parameter of the same name (no defaults here: the schema above holds them).

@dataclass(frozen=True)
class Workload:
    """The evaluation documents and the lengths run on each."""

    documents: list
    prefill_tokens: int
    decode_tokens: int
    n_needles: int
    n_queries: int
    seed: int


@dataclass(frozen=True)
class Policies:
    """The policies compared, their budgets and knobs (``tuned_settings`` overrides the knobs it
    froze)."""

    policies: list
    budgets: list
    tuned_settings: str
    window_tokens: int
    group_size: int
    qevict_bits: int
    full_share: float
    score_decay: float
    sink_windows: int
    snap_obs_tokens: int
    snap_kernel: int


@dataclass(frozen=True)
class Drift:
    """The attention-drift measures (Global LIR), their heatmap and the bootstrap."""

    lir_gap_steps: int
    lir_tau: float
    heatmap_document: int
    heatmap_layer: int
    n_boot: int


@dataclass(frozen=True)
class QEvictConfig:
    """Chapter 4's parameters, typed and grouped: ``SCHEMA.config(values)`` (validated and
    cross-checked by :func:`check_consistency`)."""

    workload: Workload
    policies: Policies
    drift: Drift


SCHEMA = register(Schema("04_qevict", PARAMS, config=QEvictConfig, consistency=check_consistency))
PARAMS = SCHEMA
