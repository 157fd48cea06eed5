"""KV policies as the composition sees them: on-device bytes, cold-tier bytes, recall traffic and
fidelity, all *measured* by chapter 4 (:func:`analysis.qevict.experiment.run_experiment`, every run
cached on disk) on SmolLM2-135M and short documents (chapter 4's corpora).

A :class:`KVPolicy` is one (policy, budget) stream of chapter 4, reduced to ratios against the
full cache of the same run, so that it can be applied to any model of chapter 1:

* ``hot_ratio``: bytes held on the device (full-precision + quantized windows, the open window
  included) / bytes of the full cache;
* ``cold_ratio``: exact copies of quantized windows kept off the device for recall / full cache;
* ``recall_ratio_per_step``: bytes recalled from the cold tier per decoding step / full cache;
* ``kl``, ``top1``, ``ppl_change``: mean next-token KL divergence to the full cache (nats),
  top-1 agreement with it, and relative change of perplexity on the document's true next tokens.

Assumption (stated in the chapter): these ratios and fidelities, measured on a 135M model at a
short context, carry over to the served model at the same budget fraction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class KVPolicy:
    name: str
    budget: float = 1.0
    hot_ratio: float = 1.0
    cold_ratio: float = 0.0
    recall_ratio_per_step: float = 0.0
    kl: float = 0.0
    top1: float = 1.0
    ppl_change: float = 0.0
    fits: bool = True

    def __post_init__(self):
        for f in ("budget", "hot_ratio"):
            v = getattr(self, f)
            if not (math.isfinite(v) and 0 < v <= 1.0 + 1e-9):
                raise ValueError(f"KVPolicy {self.name!r}: {f} must be in (0, 1], got {v!r}")
        for f in ("cold_ratio", "recall_ratio_per_step", "kl"):
            v = getattr(self, f)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"KVPolicy {self.name!r}: {f} must be finite and >= 0, got {v!r}")
        if not 0 <= self.top1 <= 1:
            raise ValueError(f"KVPolicy {self.name!r}: top1 must be in [0, 1], got {self.top1!r}")

    @property
    def label(self) -> str:
        return "full cache" if self.name == "full" else f"{self.name} @ {self.budget:.0%}"

    @property
    def needs_cold_tier(self) -> bool:
        return self.cold_ratio > 0 or self.recall_ratio_per_step > 0

    @classmethod
    def full(cls) -> "KVPolicy":
        """The full cache (the baseline): everything on the device, exact."""
        return cls("full")


def measure(policies, budgets, *, documents=("docs:typing",), prefill_tokens: int = 256, decode_tokens: int = 32,
            verbose: bool = False, **overrides) -> list[KVPolicy]:
    """Chapter 4's experiment (:func:`analysis.qevict.experiment.run_experiment`, every run cached
    on disk) with a small configuration: the full cache and every policy at every budget on
    ``documents``; chapter 4's other parameters at their defaults unless overridden."""
    from analysis.qevict import experiment
    from analysis.qevict import params as qparams
    from analysis.qevict.policies import POLICIES

    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown KV policies {unknown}; chapter 4 has {', '.join(POLICIES)}")
    if not budgets or any(not 0 < b <= 1 for b in budgets):
        raise ValueError(f"budgets are fractions of the full cache in (0, 1], got {list(budgets)}")
    p = {k: v.default for k, v in qparams.PARAMS.items()}
    p["tuned_settings"] = "none"  # chapter 4's frozen settings cover its own budgets only (issue 14)
    p.update(documents=list(documents), prefill_tokens=int(prefill_tokens), decode_tokens=int(decode_tokens),
             policies=["full"] + [x for x in policies if x != "full"], budgets=[float(b) for b in budgets],
             heatmap_document=0, **overrides)
    p = qparams_validate(qparams, p)
    exp = experiment.run_experiment(p, verbose=verbose)
    return from_summary(exp.summary)


def qparams_validate(qparams, p: dict) -> dict:
    """Chapter 4's schema and cross-parameter checks (clear errors before any model run)."""
    from analysis.params import validate

    out = validate(qparams.PARAMS, p)
    qparams.check_consistency(out)
    return out


def from_summary(summary: pd.DataFrame) -> list[KVPolicy]:
    """:class:`KVPolicy` of each (policy, budget) of chapter 4's summary table (one row per
    document and stream), averaged over documents; bytes relative to the full cache's."""
    need = {"document", "policy", "budget", "kl", "top1", "dppl", "fits", "bytes_full", "bytes_quantized",
            "bytes_cold", "recall_bytes", "decode_steps"}
    missing = need - set(summary.columns)
    if missing:
        raise ValueError(f"chapter 4's summary lacks columns {sorted(missing)}")
    ref = summary[summary["policy"] == "full"].set_index("document")
    if ref.empty:
        raise ValueError("chapter 4's summary has no full-cache stream to compare with")
    hot_ref = (ref["bytes_full"] + ref["bytes_quantized"]).astype(float)
    res = [KVPolicy.full()]
    for (pol, frac), g in summary[summary["policy"] != "full"].groupby(["policy", "budget"], sort=False):
        g = g.set_index("document")
        r = hot_ref.loc[g.index]
        res.append(KVPolicy(
            name=str(pol), budget=float(frac),
            hot_ratio=float(min(((g["bytes_full"] + g["bytes_quantized"]) / r).mean(), 1.0)),
            cold_ratio=float((g["bytes_cold"] / r).mean()),
            recall_ratio_per_step=float((g["recall_bytes"] / g["decode_steps"] / r).mean()),
            kl=max(float(g["kl"].mean()), 0.0), top1=float(g["top1"].mean()), ppl_change=float(g["dppl"].mean()),
            fits=bool(g["fits"].all())))
    return res


def table(policies: list[KVPolicy]) -> pd.DataFrame:
    return pd.DataFrame([{"policy": p.label, "name": p.name, "budget": p.budget, "on-device bytes": p.hot_ratio,
                          "cold-tier bytes": p.cold_ratio, "recall / step": p.recall_ratio_per_step,
                          "KL (nats)": p.kl, "top-1 agreement": p.top1, "perplexity change": p.ppl_change,
                          "within budget without extra eviction": p.fits} for p in policies])
