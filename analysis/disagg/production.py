"""Validation cells against public production systems: the simulator's best decode throughput per GPU
in the setting a production report states, next to the published figure (data/published.csv).

StepFun's Step-3 report (arXiv 2507.19427) gives decode throughput per Hopper GPU at 4K context under a
50 ms TPOT SLO, FP8, no multi-token prediction: Step-3 with attention-FFN disaggregation (AFD) and
DeepSeek-V3 in the same setting. The cell prices every decode configuration of the mode on the named
GPU within the budget and keeps the best one that meets the TPOT SLO.
"""
from __future__ import annotations

import numpy as np

from ..forward import Efficiency, Precision
from . import search as S

# decode at a mean context of `context` tokens: prompts of context - OUT/2 tokens, OUT output tokens
OUT_TOKENS = 1024


VALIDATION_BUDGET = 256  # DeepSeek-scale: EP decode instances of 144+ GPUs fit


def validation_grid(max_devices: int = VALIDATION_BUDGET) -> S.Grid:
    """Instances up to ``max_devices`` (DeepSeek-scale EP decode reaches 144 GPUs), TP up to 8,
    batches up to 65,536 sequences per instance, up to 3 ping-pong micro-batches, two-micro-batch
    overlap."""
    return S.Grid(sizes=S._p2(1, max_devices), tps=(1, 2, 4, 8), batches=S._p2(1, 65536),
                  microbatches=(1, 2, 3), overlaps=(1, 2))


def decode_throughput(model, device: str, mode: str, *, context: float = 4096.0, tpot_slo_s: float = 0.05,
                      precision: str = "fp8", budget: int = VALIDATION_BUDGET, eff: Efficiency = Efficiency(),
                      grid: S.Grid | None = None) -> dict:
    """Best decode output tokens/s per device of ``mode`` (``"D"``: one instance holding attention and
    experts, EP across it; ``"AFD"``: attention and FFN pools, :func:`analysis.disagg.search.af_layer_time`)
    meeting ``tpot_slo_s`` at mean context ``context``. Returns the throughput (tokens/s per device, NaN if
    nothing meets the SLO), the TPOT (s) and the chosen configuration."""
    if mode not in ("D", "AFD"):
        raise S.SearchError(f"mode must be 'D' or 'AFD', got {mode!r}")
    g = grid or validation_grid(budget)
    wl = S.Workload(max(1.0, context - OUT_TOKENS / 2), OUT_TOKENS)
    prec = Precision.named(precision)
    if mode == "D":
        c = S.role_candidates("D", model, wl, device, prec=prec, eff=eff, grid=g, budget=budget)
    else:
        c = S.role_candidates("DAF", model, wl, (device, device), prec=prec, eff=eff, grid=g, budget=budget)
    ok = c["feasible"] & (c["tpot"] <= tpot_slo_s)
    tps = np.where(ok, c["batch"] / (c["tpot"] * c["devices"]), -np.inf)
    if not ok.any():
        return {"tokens_per_s_per_device": float("nan"), "tpot_s": float("nan"), "config": {},
                "candidates": int(len(tps))}
    i = int(np.argmax(tps))
    keys = [k for k in ("size", "tp", "n_a", "n_f", "m", "ovl", "batch", "devices") if k in c]
    at_edge = bool(c["devices"][i] >= max(g.sizes) or c["batch"][i] >= max(g.batches))
    return {"tokens_per_s_per_device": float(tps[i]), "tpot_s": float(c["tpot"][i]),
            "config": {k: float(c[k][i]) for k in keys}, "grid_edge": at_edge, "candidates": int(len(tps))}
