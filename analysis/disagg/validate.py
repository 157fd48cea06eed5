"""Predict the measured TTFT and TPOT of AIConfigurator's silicon runs and fit/evaluate calibration.

The runs (``data.path("aiconfigurator_silicon")``) are closed-loop benchmarks: ``c`` clients each send
a request of ``isl`` input tokens that produces ``osl`` output tokens, wait for it to finish and send
the next. The prediction models the benchmark as it was run, on top of the operator costs of
:mod:`.costs`:

**Colocated (``agg``).** ``A = min(c, batch_size * attention_dp, memory limit)`` requests are in the
engine at once, the rest wait in the client queue. With fixed lengths, requests that start together
finish together, so the engine sees *waves*: all ``A`` prompts are prefilled in passes of at most
``chunk`` tokens per DP rank (wave prefill ``W``), then ``osl - 1`` decode steps at batch ``A``. In a
wave a request's first token comes on average after half the wave prefill, and its decoding waits for
the rest of the wave (``TTFT_wave = (W + t_req)/2``, ``TPOT_wave = t_dec + (W - TTFT)/(osl - 1)``).
Fully desynchronised clients would instead see steady chunked prefill (``TTFT_steady`` a few mixed
iterations, ``TPOT_steady`` the mean iteration). The prediction mixes the two with a per-backend
synchronisation weight ``sync`` (fitted; prefill-first schedulers keep more of the wave).
Clients beyond ``A`` queue: ``TTFT += (c - A) / X`` with ``X = A / cycle``
(Little's law).

**Disaggregated (``disagg``).** Prefill workers serve a FIFO queue (``W_p`` workers, ``pbs`` prompts
per pass per DP rank, service rate ``mu_p``); the KV cache moves over the prefill workers' NICs
(layer-wise overlapped); decode workers run continuous batching, each holding the decode batch the
run records (``decode_batch_size`` per DP rank; the memory estimate only where none is recorded).
Throughput ``X`` solves the closed loop ``X = min(mu_p, c / (t_p + x + (osl-1) t_dec(A_d)), decode
limit)`` with ``A_d`` the decode concurrency it implies (fixed-point), and ``TTFT = c / X - (osl-1)
t_dec`` (Little's law), mixed with the wave value by ``sync_disagg``. Rows that do not give worker
counts cannot be predicted (listed); ``load_rows(assume_workers=True)`` predicts them with one worker
per stage as a sensitivity.

Every pass is priced with the MoE split the run records (``moe_tp_size`` / ``moe_ep_size``, per stage for
PD runs; :func:`analysis.forward.moe_split`), as AIConfigurator's ``MoEDispatch`` moves the tokens:
without attention data parallelism every device holds every token, so spread or tensor-split experts
need no all-to-all (the layer's all-reduce sums their outputs); with it, expert parallelism dispatches
by all-to-all and tensor-split experts gather and reduce-scatter the data-parallel ranks' rows
(:func:`analysis.forward.comm_time`).

Rows whose model is not in ``data/models.csv`` or that lack the concurrency or parallel sizes are
*listed*, never dropped silently (:func:`load_rows` returns them with a ``skip_reason``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import data, kv, measured, specs
from .. import forward as costs
from ..forward import Efficiency, Precision

# measured model_path -> data/models.csv name (same architecture)
MODEL_MAP = {
    "deepseek-ai/DeepSeek-R1": "DeepSeek-R1",
    "nvidia/DeepSeek-R1-NVFP4": "DeepSeek-R1",
    "deepseek-ai/DeepSeek-V3": "DeepSeek-V3",
    "nvidia/DeepSeek-V3.1-NVFP4": "DeepSeek-V3",  # V3.1 keeps the V3 architecture (config.json)
    "MiniMaxAI/MiniMax-M2.5": "MiniMax-M2.5",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "meta-llama/Llama-3.1-70B": "Llama-3.1-70B",
    "Qwen/Qwen3-32B": "Qwen3-32B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen3-32B",
    "Qwen/Qwen3.5-397B-A17B": "Qwen3.5-397B-A17B",
    "moonshotai/Kimi-K2.5": "Kimi-K2.5",
    "meta-llama/Llama-3.1-8B-Instruct": "Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "Llama-3.1-8B",
    "Qwen/Qwen3-235B-A22B-FP8": "Qwen3-235B-A22B",
}
SYSTEM_MAP = {
    "h100_sxm": "H100-SXM5-80GB",
    "h200_sxm": "H200-SXM-141GB",
    "b200_sxm": "B200-SXM-180GB",
    "b300_sxm": "B300-SXM-288GB",
    "gb200": "GB200-NVL72",
    "gb300": "GB300-NVL72",
}
QUANT = {  # quant mode -> the time model's weight format (analysis.forward.WEIGHT_FORMATS)
    "fp8": "fp8",
    "fp8_block": "fp8",
    "nvfp4": "fp4",
    "int4_wo": "int4",
    "bf16": "bf16",
    "float16": "bf16",
}
SYSTEMS = tuple(SYSTEM_MAP)
# The calibration fits one compute and one bandwidth efficiency per *silicon*: a GB200 (GB300) NVL72 rack's
# GPU is the B200 (B300) die with the same HBM (data/hardware.csv; NVIDIA's GB200/GB300 NVL72 pages), so
# its kernels reach the same fraction of each device's own peaks. Fitted apart, the GB200 and GB300
# bandwidth efficiencies were not identified by their few training runs (standard errors 0.49 and 0.57
# of a (0.05, 1] range; the GB200 one sat at the bound 1.00).
SILICON = {"h100_sxm": "h100_sxm", "h200_sxm": "h200_sxm", "b200_sxm": "b200_sxm", "b300_sxm": "b300_sxm",
           "gb200": "b200_sxm", "gb300": "b300_sxm"}
FIT_SYSTEMS = tuple(dict.fromkeys(SILICON[x] for x in SYSTEMS))
BACKENDS = ("trtllm", "sglang", "vllm")


NUMERIC = (
    "isl",
    "osl",
    "concurrency",
    "tp_size",
    "attention_dp_size",
    "batch_size",
    "prefill_tp_size",
    "prefill_attention_dp_size",
    "decode_tp_size",
    "decode_attention_dp_size",
    "prefill_num_workers",
    "decode_num_workers",
    "prefill_batch_size",
    "decode_batch_size",
    "moe_tp_size",
    "moe_ep_size",
    "prefill_moe_tp_size",
    "prefill_moe_ep_size",
    "decode_moe_tp_size",
    "decode_moe_ep_size",
)


def _num(g, col, default=np.nan):
    """A numeric column of a prepared group (dict of arrays) with missing values set to ``default``."""
    v = g[col]
    return np.where(np.isnan(v), default, v)


def _bk(d: dict, g):
    """Per-row value of a per-backend calibration entry."""
    return np.array([d[b] for b in BACKENDS])[g["be_idx"]]


def _deg(df, col):
    """A parallel degree: missing or 0 ('none' in the export) means 1."""
    v = _num(df, col, 1.0)
    return np.where(v >= 1, v, 1.0)


def _moe_tp(g, tp, dp, prefix=""):
    """Per row: the expert tensor-parallel size the run recorded (``<prefix>moe_tp_size`` /
    ``<prefix>moe_ep_size``, :func:`analysis.forward.moe_split` on the instance of ``tp * dp``
    devices)."""
    return costs.moe_split(tp * dp, g[f"{prefix}moe_tp_size"], g[f"{prefix}moe_ep_size"])


def load_rows(assume_workers: bool = False) -> pd.DataFrame:
    """All measured rows with the fields the prediction needs, a ``skip_reason`` ('' when the row
    can be predicted), ``group`` (the configuration without its concurrency) and ``split``.

    Disaggregated rows without worker counts (and batch limits) cannot be predicted: how many
    prefill and decode workers served the ``c`` clients decides both the decode batch and the
    prefill queue. With ``assume_workers=True`` they are predicted with one worker per stage (a
    sensitivity, never part of the headline errors). A row that repeats another's measurement
    (:data:`DUPLICATE_KEY`) is listed as its duplicate and predicted once."""
    df = pd.read_csv(data.path("aiconfigurator_silicon"))
    # rows without any precision field: the checkpoint's own dtype (a name without -FP8/-NVFP4 is
    # served in bf16); flagged in ``assumed_precision``
    df["assumed_precision"] = df["precision"].isna() & df["gemm_quant_mode"].isna()
    df["precision"] = df["precision"].fillna("bf16")
    for col in ("gemm_quant_mode", "moe_quant_mode"):
        df[col] = df[col].fillna(df["precision"])
    src_c = pd.to_numeric(
        df["silicon_data_source"].astype(str).str.extract(r"silicon_concurrency=(\d+)")[0], errors="coerce"
    )
    id_c = pd.to_numeric(df["id"].astype(str).str.extract(r"_c(\d+)_")[0], errors="coerce")
    df["concurrency"] = src_c.fillna(id_c)
    df["model"] = df["model_path"].map(MODEL_MAP)
    df["hardware"] = df["system"].map(SYSTEM_MAP)
    reasons = []
    for r in df.itertuples():
        why = []
        if not isinstance(r.model, str):
            why.append(f"model {r.model_path} not in data/models.csv")
        if not isinstance(r.hardware, str):
            why.append(f"system {r.system} unknown")
        if not np.isfinite(r.concurrency):
            why.append("no concurrency (neither silicon_concurrency nor _c<N>_ in the id)")
        if r.gemm_quant_mode not in QUANT or r.moe_quant_mode not in QUANT:
            why.append(f"quant mode {r.gemm_quant_mode}/{r.moe_quant_mode} unknown")
        if r.mode == "agg" and not np.isfinite(r.tp_size):
            why.append("no tp_size")
        if r.mode == "disagg" and not (np.isfinite(r.prefill_tp_size) and np.isfinite(r.decode_tp_size)):
            why.append("no prefill/decode tp_size")
        if (
            r.mode == "disagg"
            and not assume_workers
            and not (np.isfinite(r.prefill_num_workers) and np.isfinite(r.decode_num_workers))
        ):
            why.append("disagg run without prefill/decode worker counts")
        if not (np.isfinite(r.silicon_ttft_ms) and np.isfinite(r.silicon_tpot_ms)):
            why.append("no measured TTFT/TPOT")
        reasons.append("; ".join(why))
    df["skip_reason"] = reasons
    df["source_kind"] = np.where(
        df["silicon_data_source"].astype(str).str.startswith("db-dump"), "db", "export"
    )
    _mark_duplicates(df)
    df["group"] = df["id"].astype(str).str.replace(r"_c\d+_", "_c_", regex=True)
    df["split"] = [
        ("train" if int(hashlib.sha256(g.encode()).hexdigest(), 16) % 2 == 0 else "test") for g in df["group"]
    ]
    df["assumed_workers"] = (df["mode"] == "disagg") & (
        df["prefill_num_workers"].isna() | df["decode_num_workers"].isna()
    )
    return df


# What makes two rows the same measurement: the run's setting and its measured TTFT and TPOT (to the last
# digit). The export lists some runs twice: in the database dump and in a CSV export, and DeepSeek-R1's
# runs also as DeepSeek-V3's (the same architecture, data/models.csv), so the model name is not part of it.
DUPLICATE_KEY = ("system", "backend", "mode", *NUMERIC, "gemm_quant_mode", "moe_quant_mode",
                 "silicon_ttft_ms", "silicon_tpot_ms")
DUPLICATE_PREFIX = "duplicate of "  # a duplicate's skip reason: this, the id of the row it repeats, why


def _mark_duplicates(df: pd.DataFrame) -> None:
    """List every predictable row that repeats an earlier one's measurement (:data:`DUPLICATE_KEY`) as a
    duplicate of it (``skip_reason``), keeping the database dump's row, then the lowest id: a measurement
    counted twice would weigh twice in the fit and could be trained on and held out at once."""
    ok = df[df["skip_reason"] == ""]
    ok = ok.assign(_db=ok["source_kind"] != "db").sort_values(["_db", "id"], kind="stable")
    keys = [repr(k) for k in ok[list(DUPLICATE_KEY)].itertuples(index=False)]  # NaN reprs alike
    first = pd.Series(ok["id"].to_numpy(), index=keys).groupby(level=0).transform("first").to_numpy()
    later = first != ok["id"].to_numpy()
    df.loc[ok.index[later], "skip_reason"] = [f"{DUPLICATE_PREFIX}{f} (the same measurement listed twice)"
                                              for f in first[later]]


@dataclass
class Calibration:
    """Fitted constants: per-system compute/bandwidth efficiency (one pair per silicon, :data:`SILICON`);
    per-backend step and per-layer
    launch overhead, fixed
    per-request TTFT overhead (HTTP, tokenisation, scheduling) and wave-synchronisation weight (how
    much of the benchmark's first-wave burst the backend's scheduler keeps: prefill-first schedulers
    keep more); one synchronisation weight for disaggregated runs. Defaults = uncalibrated model."""

    compute: dict = field(default_factory=lambda: {s: 0.6 for s in SYSTEMS})
    bandwidth: dict = field(default_factory=lambda: {s: 0.8 for s in SYSTEMS})
    step_overhead_s: dict = field(default_factory=lambda: {b: 2e-3 for b in BACKENDS})
    ttft_overhead_s: dict = field(default_factory=lambda: {b: 0.0 for b in BACKENDS})
    sync: dict = field(default_factory=lambda: {b: 0.5 for b in BACKENDS})
    sync_disagg: float = 0.5
    chunk_tokens: dict = field(default_factory=lambda: {b: 8192.0 for b in BACKENDS})
    layer_overhead_s: dict = field(default_factory=lambda: {b: 2e-5 for b in BACKENDS})

    def vector(self):
        out = []
        for f in fitted_fields():
            v = getattr(self, f)
            if f in ("compute", "bandwidth"):
                out += [v[x] for x in FIT_SYSTEMS]
            elif f == "sync_disagg":
                out.append(v)
            else:
                out += [np.log2(v[b]) if f == "chunk_tokens" else v[b] for b in BACKENDS]
        return np.asarray(out, dtype=float)

    @staticmethod
    def bounds(relax: dict | None = None):
        """Lower and upper bounds of :meth:`vector`; ``relax`` maps a fitted field to a (lo, hi) pair
        that replaces its bounds (a diagnosis: where a constant goes when its bound is lifted)."""
        lo, hi = [], []
        for f in fitted_fields():
            n = (len(FIT_SYSTEMS) if f in ("compute", "bandwidth") else 1 if f == "sync_disagg"
                 else len(BACKENDS))
            b = (relax or {}).get(f, _BOUNDS[f])
            lo += [b[0]] * n
            hi += [b[1]] * n
        return np.asarray(lo), np.asarray(hi)

    @classmethod
    def from_vector(cls, v):
        v = [float(x) for x in v]
        kw, i = {}, 0
        for f in fitted_fields():
            if f in ("compute", "bandwidth"):
                per = dict(zip(FIT_SYSTEMS, v[i : i + len(FIT_SYSTEMS)]))
                kw[f] = {x: per[SILICON[x]] for x in SYSTEMS}
                i += len(FIT_SYSTEMS)
            elif f == "sync_disagg":
                kw[f] = v[i]
                i += 1
            else:
                vals = v[i : i + len(BACKENDS)]
                kw[f] = {b: (2.0**x if f == "chunk_tokens" else x) for b, x in zip(BACKENDS, vals)}
                i += len(BACKENDS)
        for f, val in DROPPED.items():
            kw[f] = {b: val for b in BACKENDS}
        return cls(**kw)


# the fitted fields in vector order, their bounds (log2 tokens for the chunk) and the fields dropped from the
# fit with the value they are fixed at
FIELDS = ("compute", "bandwidth", "step_overhead_s", "ttft_overhead_s", "sync", "sync_disagg",
          "layer_overhead_s", "chunk_tokens")
_BOUNDS = {"compute": (0.05, 1.0), "bandwidth": (0.05, 1.0), "step_overhead_s": (0.0, 0.02),
           "ttft_overhead_s": (0.0, 0.5), "sync": (0.0, 1.0), "sync_disagg": (0.0, 1.0),
           "layer_overhead_s": (0.0, 2e-4), "chunk_tokens": (11.0, 15.0)}
# The per-pass overhead is fitted in one form: per layer (launch gaps scale with the layers a pass runs).
# Fitted together, the per-step and the per-layer overhead of a backend were not separable (both add a
# constant to every pass of a model; only the spread of layer counts, 32 to 94, tells them apart): their
# estimates correlated at -0.91 to -0.94 with standard errors as large as the values, and the fit put
# vLLM's step and SGLang's per-layer overhead at the bound 0. The step overhead is dropped (0): kept
# alone, the per-layer form fits the training runs better than the per-step form (held-out TPOT median
# error 14.1% against 16.0% on colocated runs, issue 27 item 4's comparison).
DROPPED = {"step_overhead_s": 0.0}


def at_bounds(cal: "Calibration", rel: float = 1e-3) -> list:
    """Names (``field/key``) of the fitted constants of ``cal`` within ``rel`` of the bound range of
    an end of their bounds (the dropped fields are not fitted and never listed)."""
    lo, hi = Calibration.bounds()
    names = []
    for f in fitted_fields():
        keys = FIT_SYSTEMS if f in ("compute", "bandwidth") else [""] if f == "sync_disagg" else BACKENDS
        names += [f"{f}/{k}" if k else f for k in keys]
    v = cal.vector()
    near = np.minimum(v - lo, hi - v) <= rel * (hi - lo)
    return [n for n, b in zip(names, near) if b]


def fitted_fields() -> tuple:
    return tuple(f for f in FIELDS if f not in DROPPED)


OPERATOR_BACKENDS = ("roofline", "measured")


def _check_backend(backend: str) -> None:
    if backend not in OPERATOR_BACKENDS:
        raise ValueError(f"operator backend must be one of {', '.join(OPERATOR_BACKENDS)}, got {backend!r}")


def _prepare(rows: pd.DataFrame, net_bw: float, backend: str = "roofline") -> list:
    """Everything of the predictable rows that does not depend on the calibration, grouped by
    (model, mode) as numpy arrays (so that a calibration fit re-evaluates only arithmetic).

    ``backend="measured"`` prices each run's operators from AIConfigurator's kernel tables of its own
    GPU and its own serving framework (:func:`analysis.measured.backend_name`; the roofline with the
    calibrated efficiencies where the tables have no entry, as for MLA and attention cores): the rows are
    grouped by (model, mode, system, GEMM precision, framework) so that each group has one backend and
    one compute dtype."""
    _check_backend(backend)
    out = []
    ok = rows[rows["skip_reason"] == ""]
    keys = ["model", "mode"] + (["system", "gemm_quant_mode", "backend"] if backend == "measured" else [])
    for key, g in ok.groupby(keys, sort=True):
        model, mode = key[0], key[1]
        s = costs.shape(model)
        cols = {c: pd.to_numeric(g[c], errors="coerce").to_numpy(float) for c in NUMERIC}
        cols["sys_idx"] = np.array([SYSTEMS.index(x) for x in g["system"]])
        cols["be_idx"] = np.array([BACKENDS.index(x) for x in g["backend"]])
        qcol = "moe_quant_mode" if s.n_moe else "gemm_quant_mode"
        wb = np.array([costs.WEIGHT_FORMATS[QUANT[q]][0] for q in g[qcol]])
        comp = [costs.WEIGHT_FORMATS[QUANT[q]][1] for q in g["gemm_quant_mode"]]
        # KV cache in fp8 for fp8/fp4 runs (the serving recipes of these runs set it), bf16 otherwise
        fp8kv = np.isin(g["gemm_quant_mode"].to_numpy(), ["fp8", "fp8_block", "nvfp4"])
        kvb = np.where(fp8kv, kv.DTYPE_BYTES["fp8"], kv.DTYPE_BYTES["bf16"])
        # the roofline reads each row's compute peak from ``dev["flops"]``; a measured backend reads the
        # GEMM table of the compute dtype the operator carries (one per group)
        prec = Precision(weight_bytes=wb, kv_bytes=kvb, act_bytes=2.0,
                         compute=comp[0] if backend == "measured" else "bf16")
        hwc = {h: specs.gpu(h) for h in set(g["hardware"])}
        hws = [hwc[h] for h in g["hardware"]]
        dev = {
            "flops": np.array([hw.flops(c) for hw, c in zip(hws, comp)]),
            "attn_flops": np.array([hw.flops("bf16") for hw in hws]),
            "bw": np.array([hw["hbm_bandwidth"] for hw in hws]),
            "cap": np.array([hw["hbm_capacity"] for hw in hws]),
            "link": np.array([hw["nvlink_bandwidth"] / 2 for hw in hws]),
            "net": np.full(len(g), float(net_bw)),
            # tensor-split experts' measured slowdown on each run's GPU (AIConfigurator's MoE table of its
            # silicon, the run's expert weight format; analysis.forward.ffn_block)
            "moe_split_slowdown": functools.partial(
                measured.moe_split_slowdown, weight_bytes=wb,
                silicon=np.array([SILICON[x] for x in g["system"]], dtype=object)),
        }
        if backend == "measured":
            weight_only = float(np.min(wb)) < measured.COMPUTE_BYTES.get(comp[0], 2.0) - 1e-9
            dev["backend"] = measured.backend_name(g["hardware"].iloc[0], framework=g["backend"].iloc[0],
                                                   weight_only=weight_only)
        out.append(
            {
                "model": model,
                "mode": mode,
                "shape": s,
                "index": g.index,
                "cols": cols,
                "prec": prec,
                "dev": dev,
            }
        )
    return out


def _eff(g, cal: Calibration, base: Efficiency) -> Efficiency:
    return Efficiency(
        compute=np.array([cal.compute[s] for s in SYSTEMS])[g["sys_idx"]],
        bandwidth=np.array([cal.bandwidth[s] for s in SYSTEMS])[g["sys_idx"]],
        link=base.link,
        step_overhead_s=_bk(cal.step_overhead_s, g),
        layer_overhead_s=_bk(cal.layer_overhead_s, g),
        collective_latency_s=base.collective_latency_s,
        moe_imbalance=base.moe_imbalance,
        mem_reserve=base.mem_reserve,
    )


def _agg(s, g, eff, prec, dev, cal):
    I, O = _num(g, "isl"), _num(g, "osl")
    c = _num(g, "concurrency")
    tp, dp = _deg(g, "tp_size"), _deg(g, "attention_dp_size")
    bs = _num(g, "batch_size", np.inf)
    n = tp * dp
    w = costs.weight_bytes_per_device(s, prec, tp=tp, n=n)
    kv1 = costs.kv_bytes_per_device(s, prec, seqs=1.0, ctx=I + O, tp=tp, dp=1.0)
    mem_seqs = np.maximum(np.floor((dev["cap"] * (1 - eff.mem_reserve) - w) / kv1) * dp, 1.0)
    A = np.maximum(np.minimum(np.minimum(c, bs * dp), mem_seqs), 1.0)
    ctx = I + O / 2
    mtp = _moe_tp(g, tp, dp)
    run = lambda **kw: costs.colocated_pass_time(s, prec, eff, dev, tp=tp, dp=dp, moe_tp=mtp, **kw)
    t_dec = run(dec_seqs=A, dec_ctx=ctx)
    chunk = _bk(cal.chunk_tokens, g)
    K = chunk * dp
    pl = np.minimum(chunk, I)
    ps = np.minimum(A, K / pl)
    pp = np.where(pl < I, (I - pl) / 2, 0.0)
    t_chunk = run(pre_seqs=ps, pre_len=pl, pre_prefix=pp)
    n_chunks = np.ceil(A * I / (ps * pl))
    W = n_chunks * t_chunk
    t_req = np.ceil(I / pl) * t_chunk
    ttft_w = (W + t_req) / 2
    tpot_w = t_dec + np.maximum(W - ttft_w, 0) / np.maximum(O - 1, 1)
    # steady (desynchronised) chunked prefill
    f = np.minimum(A * I / (O * ps * pl), 1.0)
    t_mix = run(dec_seqs=A, dec_ctx=ctx, pre_seqs=ps, pre_len=pl, pre_prefix=pp)
    tpot_s = f * t_mix + (1 - f) * t_dec
    # prefill-bound when the chunks cannot keep up: X_s = min(decode rate, prefill rate); Little's law
    X_s = np.minimum(A / (O * tpot_s), ps * pl / (I * t_mix))
    ttft_s = np.maximum(np.ceil(I / pl) * t_mix + t_dec / 2, A / X_s - (O - 1) * tpot_s)
    sync = _bk(cal.sync, g)
    ttft = sync * ttft_w + (1 - sync) * ttft_s
    tpot = sync * tpot_w + (1 - sync) * tpot_s
    cycle = ttft + (O - 1) * tpot
    X = A / cycle
    ttft = ttft + np.maximum(c - A, 0) / X
    return ttft + _bk(cal.ttft_overhead_s, g), tpot


def _disagg(s, g, eff, prec, dev, cal, kv_overlap=costs.LAYERWISE_OVERLAP):
    I, O = _num(g, "isl"), _num(g, "osl")
    c = _num(g, "concurrency")
    tpp, dpp = _deg(g, "prefill_tp_size"), _deg(g, "prefill_attention_dp_size")
    tpd, dpd = _deg(g, "decode_tp_size"), _deg(g, "decode_attention_dp_size")
    Wp, Wd = _num(g, "prefill_num_workers", 1), _num(g, "decode_num_workers", 1)
    pbs, dbs = _num(g, "prefill_batch_size", 1), _num(g, "decode_batch_size", np.inf)
    ctx = I + O / 2
    # prefill: pbs prompts per DP rank per pass
    pseqs = pbs * dpp
    mtp_p, mtp_d = _moe_tp(g, tpp, dpp, "prefill_"), _moe_tp(g, tpd, dpd, "decode_")
    t_p = costs.colocated_pass_time(s, prec, eff, dev, tp=tpp, dp=dpp, moe_tp=mtp_p, pre_seqs=pseqs,
                                    pre_len=I)
    mu_p = Wp * pseqs / t_p
    exposed = costs.kv_transfer_exposed(
        s, prec, eff, seqs=pseqs, tokens=I, t_pass=t_p, devices=tpp * dpp, net=dev["net"], overlap=kv_overlap
    )
    nd = tpd * dpd
    w = costs.weight_bytes_per_device(s, prec, tp=tpd, n=nd)
    kv1 = costs.kv_bytes_per_device(s, prec, seqs=1.0, ctx=I + O, tp=tpd, dp=1.0)
    # the decode batch the run was configured with (and served: every PD run's concurrency fills it) is a
    # measured fact; the memory estimate (weights plus KV under the simulator's flat planning reserve,
    # ``Efficiency.mem_reserve``) only bounds a run that records no decode batch. Where the two disagree
    # the estimate is wrong for that engine, not the run (DeepSeek-V3 in fp8 on four GB200s leaves
    # less than the 10% reserve beside its weights, yet SGLang served 8 sequences per rank there).
    mem_d = np.maximum(np.floor((dev["cap"] * (1 - eff.mem_reserve) - w) / kv1) * dpd, 1.0)
    cap_d = np.where(np.isfinite(dbs), dbs * dpd, mem_d)
    A = np.minimum(c / Wd, cap_d)
    for _ in range(8):
        t_dec = costs.colocated_pass_time(
            s, prec, eff, dev, tp=tpd, dp=dpd, moe_tp=mtp_d, dec_seqs=np.maximum(A, 1), dec_ctx=ctx
        )
        X = np.minimum.reduce([mu_p, c / (t_p + exposed + (O - 1) * t_dec), Wd * cap_d / ((O - 1) * t_dec)])
        A = np.clip(X * (O - 1) * t_dec / Wd, 1.0, cap_d)
    ttft_s = np.maximum(c / X - (O - 1) * t_dec, t_p + exposed)
    rounds = np.ceil(c / (Wp * pseqs))
    ttft_w = (rounds + 1) / 2 * t_p + exposed
    ttft = cal.sync_disagg * ttft_w + (1 - cal.sync_disagg) * ttft_s
    return ttft + _bk(cal.ttft_overhead_s, g), t_dec


def _predict_arrays(groups, cal: Calibration, base: Efficiency, kv_overlap=costs.LAYERWISE_OVERLAP,
                    share: bool = False):
    """Per group: its row index, predicted TTFT and TPOT (s) and, with ``share``, the share of the priced
    operator seconds read from measured tables (:func:`analysis.forward.ledger`; NaN without)."""
    out = []
    for G in groups:
        g = G["cols"]
        eff = _eff(g, cal, base)
        with costs.ledger() as led:
            if G["mode"] == "agg":
                ttft, tpot = _agg(G["shape"], g, eff, G["prec"], G["dev"], cal)
            else:
                ttft, tpot = _disagg(G["shape"], g, eff, G["prec"], G["dev"], cal, kv_overlap=kv_overlap)
        sh = np.broadcast_to(led.measured_share, np.shape(ttft)) if share else np.full(np.shape(ttft), np.nan)
        out.append((G["index"], ttft, tpot, sh))
    return out


def predict(
    rows: pd.DataFrame,
    cal: Calibration | None = None,
    *,
    base: Efficiency = Efficiency(),
    net_bw: float = 50e9,
    kv_overlap: float = costs.LAYERWISE_OVERLAP,
    backend: str = "roofline",
    _groups=None,
) -> pd.DataFrame:
    """Predicted ``pred_ttft_ms`` / ``pred_tpot_ms`` for every predictable row (others NaN) and
    ``measured_share``, the share of its priced operator seconds read from kernel tables (0 on the
    roofline). ``kv_overlap``: the share of the PD KV transfer hidden behind the prefill pass of what
    the ideal layer-wise pipeline hides (:func:`analysis.forward.kv_transfer_exposed`); ``backend``:
    the operator backend (:func:`_prepare`)."""
    cal = cal or Calibration()
    out = rows.copy()
    ttft_all, tpot_all, share_all = (np.full(len(out), np.nan) for _ in range(3))
    pos = pd.Series(np.arange(len(out)), index=out.index)
    groups = _groups or _prepare(rows, net_bw, backend)
    for idx, ttft, tpot, share in _predict_arrays(groups, cal, base, kv_overlap, share=True):
        ttft_all[pos[idx].to_numpy()] = ttft * 1e3
        tpot_all[pos[idx].to_numpy()] = tpot * 1e3
        share_all[pos[idx].to_numpy()] = share
    out["pred_ttft_ms"] = ttft_all
    out["pred_tpot_ms"] = tpot_all
    out["measured_share"] = share_all
    out["err_ttft"] = out["pred_ttft_ms"] / out["silicon_ttft_ms"] - 1
    out["err_tpot"] = out["pred_tpot_ms"] / out["silicon_tpot_ms"] - 1
    return out


def fit(rows: pd.DataFrame, *, split="train", max_nfev=60, backend: str = "roofline",
        relax: dict | None = None, **kw) -> Calibration:
    """Fit the calibration on the rows of ``split`` (robust least squares on log prediction error of
    TTFT and TPOT); bounds keep efficiencies in (0.05, 1] and overheads in [0, 20 ms]. With
    ``backend="measured"`` the efficiencies apply only to the operators the kernel tables lack.
    ``relax``: bounds lifted for a diagnosis (:meth:`Calibration.bounds`)."""
    bad = sorted(set(relax or {}) - set(fitted_fields()))
    if bad:
        raise ValueError(f"relax names fields that are not fitted: {bad}; "
                         f"fitted: {', '.join(fitted_fields())}")
    from scipy.optimize import least_squares  # optional heavy dependency

    r = rows[(rows["skip_reason"] == "") & (rows["split"] == split)]
    x0 = Calibration().vector()
    lo, hi = Calibration.bounds(relax)

    groups = _prepare(r, kw.get("net_bw", 50e9), backend)
    base = kw.get("base", Efficiency())
    meas = {
        id(G): (
            r.loc[G["index"], "silicon_ttft_ms"].to_numpy() / 1e3,
            r.loc[G["index"], "silicon_tpot_ms"].to_numpy() / 1e3,
        )
        for G in groups
    }

    def resid(v):
        cal = Calibration.from_vector(v)
        parts = []
        for G, (_, ttft, tpot, _) in zip(groups, _predict_arrays(groups, cal, base)):
            mt, mp = meas[id(G)]
            parts += [np.log(ttft / mt), np.log(tpot / mp)]
        e = np.concatenate(parts)
        return np.nan_to_num(e, nan=5.0, posinf=5.0, neginf=-5.0)

    # a measured backend reads the same table points at every evaluation: read each once
    with measured.reuse_reads() if backend == "measured" else contextlib.nullcontext():
        res = least_squares(
            resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.3, max_nfev=max_nfev, diff_step=1e-3
        )
    return Calibration.from_vector(res.x)


def summary(pred: pd.DataFrame, by=None) -> pd.DataFrame:
    """Median and 90th-percentile absolute relative error of TTFT and TPOT (and row counts)."""
    p = pred[pred["skip_reason"] == ""]

    def agg(g):
        return pd.Series(
            {
                "rows": len(g),
                "ttft_median": g["err_ttft"].abs().median(),
                "ttft_p90": g["err_ttft"].abs().quantile(0.9),
                "tpot_median": g["err_tpot"].abs().median(),
                "tpot_p90": g["err_tpot"].abs().quantile(0.9),
            }
        )

    if by is None:
        return agg(p).to_frame().T
    return p.groupby(by).apply(agg, include_groups=False)
