"""Drift diagnostics and outcomes from :func:`analysis.qevict.runner.run_document` results.

Definitions (also stated in chapter 4):

* attention of a window: sum over its tokens of the softmax weights of a query, averaged over the
  query heads that share a KV head; per (layer, KV head) the window attentions of one query sum to 1.
* **Future Missed Mass** of a policy at decoding step s: the full-cache attention of step s's query
  on the windows the policy does not hold at full precision at step s (quantized or evicted),
  averaged over KV heads and layers; ``fmm_evicted`` counts only windows it does not hold at all.
* **attention recall**: 1 - ``fmm_evicted``, the full-cache attention mass that falls on KV the policy
  can still read (exactly or quantized).
* **Global LIR** (per layer): among prompt windows (sinks excluded) that stay *inactive* for at
  least ``gap`` consecutive decoding steps, the fraction that later become *active* again, and
  the attention mass (per step and KV head) those re-activated windows receive from then on.  A
  window is active at step s when its full-cache attention is at least ``tau`` times a uniform
  share, ``tau * W / t_s`` for ``t_s`` tokens in context.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .policies import POLICY_LABELS


def needle_accuracy(result: dict, answers) -> np.ndarray:
    """Per stream, the fraction of answers whose every target token is the argmax (teacher-forced;
    equal to greedy-decoding exact match).  ``answers``: [(start, end)] document token ranges."""
    P = result["prefill_tokens"]
    correct = result["correct"]
    ok = []
    for a, b in answers:
        steps = np.arange(a, b) - P - 1
        if steps.min() < 0 or steps.max() >= correct.shape[0]:
            raise ValueError(f"answer {a}:{b} not inside the decoded range")
        ok.append(correct[steps].all(0))
    return np.mean(ok, axis=0) if ok else np.full(correct.shape[1], np.nan)


def summarize_run(result: dict, doc_spec: str, answers=()) -> pd.DataFrame:
    """One row per stream (policy, budget) with the outcomes and diagnostics of one document."""
    nll = result["nll"]
    ppl = np.exp(nll.mean(0))
    acc = needle_accuracy(result, answers) if len(answers) else np.full(nll.shape[1], np.nan)
    D = nll.shape[0]
    rows = []
    for i, (pol, frac) in enumerate(result["streams"]):
        tb = result["tier_bytes"][i]
        rows.append(dict(
            document=doc_spec, policy=pol, label=POLICY_LABELS.get(pol, pol), budget=frac,
            kl=float(result["kl"][:, i].mean()), ppl=float(ppl[i]), ppl_full=float(ppl[0]),
            dppl=float(ppl[i] / ppl[0] - 1), top1=float(result["top1"][:, i].mean()),
            token_acc=float(result["correct"][:, i].mean()),
            fmm=float(result["fmm"][:, i].mean()), fmm_evicted=float(result["fmm_evicted"][:, i].mean()),
            attn_recall=float(1 - result["fmm_evicted"][:, i].mean()),
            needle_acc=float(acc[i]), fits=bool(result["fits"][i]),
            promotions=int(result["promotions"][i]), recall_bytes=int(result["recall_bytes"][i]),
            offload_bytes=int(result["offload_bytes"][i]),
            hot_over_budget=float((result["hot_bytes"][:, i] / result["budget_bytes"][:, i]).mean()),
            bytes_full=tb["full"], bytes_quantized=tb["quantized"], bytes_cold=tb["cold"],
            bytes_evicted=tb["evicted"], full_cache_bytes=result["full_bytes_end"], decode_steps=D,
            context_tokens=result["prefill_tokens"] + D,
        ))
    return pd.DataFrame(rows)


def fmm_by_step(result: dict) -> np.ndarray:
    """(D, B) FMM per step (mean over layers)."""
    return result["fmm"].mean(-1)


def global_lir(attn_full: np.ndarray, prefill_tokens: int, window: int, gap: int, tau: float = 1.0,
               sink_windows: int = 1) -> pd.DataFrame:
    """Global LIR per layer from the full-cache window attention ``attn_full`` (D, L, Hkv, NW)."""
    if gap < 1:
        raise ValueError("gap must be >= 1 step")
    D, L, H, _ = attn_full.shape
    nwp = prefill_tokens // window
    a = attn_full[..., sink_windows:nwp].astype(np.float64)  # (D, L, H, n)
    t = prefill_tokens + np.arange(D) + 1
    thr = tau * window / t
    act = a >= thr[:, None, None, None]
    run = np.zeros(a.shape[1:], int)
    had_long = np.zeros(a.shape[1:], bool)
    react = np.zeros(a.shape[1:], bool)
    mass = np.zeros(a.shape[1:])
    for s in range(D):
        long_ = run >= gap
        had_long |= long_
        now = act[s] & long_
        react |= now
        mass += np.where(react & act[s], a[s], 0.0)
        run = np.where(act[s], 0, run + 1)
    had_long |= run >= gap
    rows = []
    for li in range(L):
        n_in = int(had_long[li].sum())
        rows.append(dict(layer=li, inactive_windows=n_in, reactivated=int(react[li].sum()),
                         lir=(react[li].sum() / n_in) if n_in else np.nan,
                         reactivated_mass=float(mass[li].sum() / (D * H)),
                         windows=int(a.shape[-1] * H)))
    return pd.DataFrame(rows)


def bootstrap_ci(values, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05):
    """Mean and percentile-bootstrap (1 - alpha) interval over the given per-document values."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return np.nan, np.nan, np.nan
    if len(v) == 1:
        return float(v[0]), np.nan, np.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(v), size=(n_boot, len(v)))
    means = v[idx].mean(1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(v.mean()), float(lo), float(hi)


def compare(summary: pd.DataFrame, policy: str, baselines, metric: str = "kl", lower_is_better: bool = True,
            n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Paired per-document comparison of ``policy`` with each baseline at each budget.

    ``diff`` = mean over documents of (policy - baseline) ``metric``; the bootstrap interval is over
    documents.  ``verdict``: 'better' / 'worse' when the interval excludes 0, else 'no clear difference'."""
    rows = []
    for base in baselines:
        for frac in sorted(summary.budget.unique()):
            a = summary[(summary.policy == policy) & (summary.budget == frac)].set_index("document")[metric]
            b = summary[(summary.policy == base) & (summary.budget == frac)].set_index("document")[metric]
            common = a.index.intersection(b.index)
            d = (a[common] - b[common]).dropna()
            if len(d) == 0:
                continue
            m, lo, hi = bootstrap_ci(d.values, n_boot, seed)
            better = (lambda x: x < 0) if lower_is_better else (lambda x: x > 0)
            if not np.isfinite(lo):
                verdict = "one document only"
            elif better(lo) and better(hi):
                verdict = "better"
            elif better(-lo) and better(-hi):
                verdict = "worse"
            else:
                verdict = "no clear difference"
            rows.append(dict(policy=policy, baseline=base, budget=frac, metric=metric, diff=m, lo=lo, hi=hi,
                             n_docs=len(d), policy_value=float(a[common].mean()), baseline_value=float(b[common].mean()),
                             verdict=verdict))
    return pd.DataFrame(rows)


def tier_bytes_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Bytes each tier holds per policy and budget at the end of decoding, mean over documents,
    as totals and per token of context (to price the quantized and cold tiers in chapter 2)."""
    g = summary.groupby(["policy", "label", "budget"], as_index=False)[
        ["bytes_full", "bytes_quantized", "bytes_cold", "bytes_evicted", "full_cache_bytes", "recall_bytes",
         "offload_bytes"]].mean()
    ctx = summary.groupby(["policy", "budget"], as_index=False)["context_tokens"].mean()
    g = g.merge(ctx, on=["policy", "budget"])
    for c in ("bytes_full", "bytes_quantized", "bytes_cold"):
        g[c + "_per_token"] = g[c] / g["context_tokens"]
    g["hot_fraction"] = (g.bytes_full + g.bytes_quantized) / g.full_cache_bytes
    return g


def drift_verdict(lir_ci_low: float, fmm_evicted_min: float, fmm_threshold: float = 0.01) -> str:
    """Claims-ledger verdict on "window importance drifts; evicted KV is later missed":
    'reproduced' when windows re-activate (the lower end of the Global LIR interval over documents is
    above 0) *and* every eviction policy misses at least ``fmm_threshold`` of the attention at every
    budget; 'partly reproduced' when one of the two holds; else 'not reproduced'."""
    a = bool(np.isfinite(lir_ci_low) and lir_ci_low > 0)
    b = bool(np.isfinite(fmm_evicted_min) and fmm_evicted_min >= fmm_threshold)
    return "reproduced" if a and b else "partly reproduced" if a or b else "not reproduced"


def qevict_verdict(cmp: pd.DataFrame) -> str:
    """Claims-ledger verdict on "three tiers beat eviction and quantization baselines at a fixed
    budget" from :func:`compare` rows: 'reproduced' when better in every (baseline, budget) pair,
    'partly reproduced' when better in some, 'not reproduced' when better in none."""
    if len(cmp) == 0:
        return "not testable from public data"
    nb = int((cmp.verdict == "better").sum())
    return "reproduced" if nb == len(cmp) else "partly reproduced" if nb else "not reproduced"
