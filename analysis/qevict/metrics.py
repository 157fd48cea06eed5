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


def shared_history_steps(result: dict) -> np.ndarray:
    """(D,) bool: the decoding steps at which every stream has read the same tokens so far.

    Inside a free-running span (``free_run_spans``) each stream reads back its own prediction, so
    from the first such token on a stream that answered differently conditions on a different
    history; its next-token distribution then differs from the full cache's for that reason and not
    only because of its compressed cache.  Likelihood metrics compare like with like only before it
    (the step that predicts the first answer token is still shared); the answers themselves are
    scored by :func:`needle_accuracy`."""
    D = result["kl"].shape[0]
    spans = result.get("free_run_spans") or []
    if not len(spans):
        return np.ones(D, bool)
    first = min(a for a, _ in spans) - result["prefill_tokens"]  # first step fed an own prediction
    return np.arange(D) < first


def summarize_run(result: dict, doc_spec: str, answers=()) -> pd.DataFrame:
    """One row per stream (policy, budget) with the outcomes and diagnostics of one document.

    ``kl``, ``ppl``, ``top1`` and ``token_acc`` average over the steps of shared history
    (:func:`shared_history_steps`, all steps without free-running spans; ``scored_steps`` counts
    them); ``kl_all`` is the KL over every step, free-running ones included."""
    sh = shared_history_steps(result)
    if not sh.any():
        raise ValueError("no decoding step before the first free-running span: nothing to score KL on; "
                         "decode more steps before the answers or run teacher-forced")
    nll = result["nll"][sh]
    ppl = np.exp(nll.mean(0))
    acc = needle_accuracy(result, answers) if len(answers) else np.full(nll.shape[1], np.nan)
    D = result["nll"].shape[0]
    rows = []
    for i, (pol, frac) in enumerate(result["streams"]):
        tb = result["tier_bytes"][i]
        rows.append(dict(
            document=doc_spec, policy=pol, label=POLICY_LABELS.get(pol, pol), budget=frac,
            kl=float(result["kl"][sh, i].mean()), kl_all=float(result["kl"][:, i].mean()),
            scored_steps=int(sh.sum()), ppl=float(ppl[i]), ppl_full=float(ppl[0]),
            dppl=float(ppl[i] / ppl[0] - 1), top1=float(result["top1"][sh, i].mean()),
            token_acc=float(result["correct"][sh, i].mean()),
            fmm=float(result["fmm"][:, i].mean()), fmm_evicted=float(result["fmm_evicted"][:, i].mean()),
            attn_recall=float(1 - result["fmm_evicted"][:, i].mean()),
            needle_acc=float(acc[i]), fits=bool(result["fits"][i]),
            promotions=int(result["promotions"][i]), recall_bytes=int(result["recall_bytes"][i]),
            offload_bytes=int(result["offload_bytes"][i]),
            hot_over_budget=float((result["hot_bytes"][:, i] / result["budget_bytes"][:, i]).mean()),
            bytes_full=tb["full"], bytes_quantized=tb["quantized"], bytes_cold=tb["cold"],
            bytes_evicted=tb["evicted"], full_cache_bytes=result["full_bytes_end"], decode_steps=D,
            context_tokens=result["prefill_tokens"] + D, **_traffic_columns(result, i),
        ))
    return pd.DataFrame(rows)


def _traffic_columns(result: dict, i: int) -> dict:
    """The tiered accounting for stream ``i``: FMM by tier, bytes on and off the device and recall
    traffic per decoding step (absent in results computed before the offloading tier: NaN)."""
    if "device_bytes" not in result:
        return dict(fmm_quantized=np.nan, fmm_offloaded=np.nan, device_bytes=np.nan, device_frac=np.nan,
                    offdevice_bytes=np.nan, offdevice_frac=np.nan, recall_bytes_per_step=np.nan,
                    recall_transfers_per_step=np.nan)
    full = result["full_bytes_step"]
    return dict(
        fmm_quantized=float(result["fmm_quantized"][:, i].mean()),
        fmm_offloaded=float(result["fmm_offloaded"][:, i].mean()),
        device_bytes=float(result["device_bytes"][:, i].mean()),
        device_frac=float((result["device_bytes"][:, i] / full).mean()),
        offdevice_bytes=float(result["offdevice_bytes"][:, i].mean()),
        offdevice_frac=float((result["offdevice_bytes"][:, i] / full).mean()),
        recall_bytes_per_step=float(result["step_recall_bytes"][:, i].mean()),
        recall_transfers_per_step=float(result["step_recall_transfers"][:, i].mean()),
    )


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


# ----------------------------------------------------------------------------------------------
# Metrics tied to what a policy decides, drift against a declared null, the declared rules
# ----------------------------------------------------------------------------------------------

def pareto_mask(points) -> np.ndarray:
    """Boolean mask of the non-dominated rows of ``points`` (n, k), every column to be minimised: a
    row is dominated when another is no worse in every column and better in one."""
    x = np.asarray(points, float)
    n = len(x)
    keep = np.ones(n, bool)
    for i in range(n):
        le = np.all(x <= x[i], axis=1)
        lt = np.any(x < x[i], axis=1)
        if np.any(le & lt):
            keep[i] = False
    return keep


def pareto_table(summary: pd.DataFrame, cols=("device_frac", "recall_bytes_per_step", "kl")) -> pd.DataFrame:
    """Mean over documents per (policy, budget) of on-device bytes (fraction of the full cache),
    recall bytes per step and KL, with ``pareto``: not dominated on all three (lower is better)."""
    g = (summary[summary.policy != "full"].groupby(["policy", "label", "budget"], as_index=False)
         [list(cols) + ["offdevice_frac", "recall_transfers_per_step"]].mean())
    g["pareto"] = pareto_mask(g[list(cols)].values)
    return g


def _top_sets(score: np.ndarray, n: int) -> np.ndarray:
    """Boolean (..., m): the ``n`` largest entries of the last axis (ties towards later entries)."""
    m = score.shape[-1]
    n = int(min(max(n, 0), m))
    out = np.zeros(score.shape, bool)
    if n == 0:
        return out
    idx = np.argsort(-score[..., ::-1], axis=-1, kind="stable")[..., :n]
    np.put_along_axis(out, m - 1 - idx, True, axis=-1)
    return out


def budget_lir(attn_full: np.ndarray, prefill_tokens: int, window: int, frac: float, gap: int = 1,
               sink_windows: int = 1, decay: float = 1.0) -> pd.DataFrame:
    """Budget-relative LIR per layer: the top-B set at step s is the ``B = floor(frac * n)`` prompt
    windows (sinks excluded; ``n`` of them) with the largest importance, importance being the
    full-cache attention accumulated over steps ``<= s`` with per-step ``decay`` (1: H2O's sum; 0:
    the current step alone).  Among windows that leave the top-B set and stay out for at least
    ``gap`` steps, the fraction that re-enter it later (``lir_b``): the windows an evicting policy
    with that importance and budget would have dropped and then needed."""
    if gap < 1:
        raise ValueError("gap must be >= 1 step")
    if not 0 < frac <= 1:
        raise ValueError("frac must be in (0, 1]")
    if not 0 <= decay <= 1:
        raise ValueError("decay must be in [0, 1]")
    D, L, H, _ = attn_full.shape
    nwp = prefill_tokens // window
    a = attn_full[..., sink_windows:nwp].astype(np.float64)
    n = a.shape[-1]
    B = int(np.floor(frac * n + 1e-9))
    score = np.zeros(a.shape[1:])
    prev = None
    out_run = np.zeros(a.shape[1:], int)
    left = np.zeros(a.shape[1:], bool)  # has been out for >= gap steps after being in
    was_in = np.zeros(a.shape[1:], bool)
    reent = np.zeros(a.shape[1:], bool)
    for s in range(D):
        score = decay * score + a[s]
        top = _top_sets(score, B)
        if prev is not None:
            out_run = np.where(top, 0, out_run + 1)
            reent |= top & left
            left |= was_in & (out_run >= gap)
        was_in |= top
        prev = top
    rows = []
    for li in range(L):
        n_left = int(left[li].sum())
        rows.append(dict(layer=li, budget=frac, top_b=B, left=n_left, reentered=int(reent[li].sum()),
                         lir_b=(reent[li].sum() / n_left) if n_left else np.nan))
    return pd.DataFrame(rows)


def far_pair_miss(attn_full: np.ndarray, prefill_tokens: int, window: int, frac: float,
                  sink_windows: int = 1, min_lag: int | None = None) -> float:
    """Drift statistic of the declared rule: for every pair of decoding steps (s, t) with
    ``t - s >= min_lag`` (default: half the decoding steps), keep the top ``B = floor(frac * n)``
    prompt windows (sinks excluded; ``n`` of them) by step s's full-cache attention, and measure the
    share of step t's attention (on non-sink prompt windows) that falls outside that set; mean over
    the pairs, layers and KV heads.  A one-shot eviction decided at s pays it at t.  If importance
    drifts, far-apart steps disagree more than steps paired at random."""
    D = attn_full.shape[0]
    M = far_pair_matrix(attn_full, prefill_tokens, window, frac, sink_windows)
    return far_pair_mean(M, np.arange(D), min_lag)


def far_pair_mean(M: np.ndarray, perm: np.ndarray, min_lag: int | None = None) -> float:
    """Mean of ``M[perm[s], perm[t]]`` over the pairs ``t - s >= min_lag`` (default half the steps):
    :func:`far_pair_miss` of the attention with its steps reordered by ``perm``, without recomputing."""
    D = len(perm)
    min_lag = D // 2 if min_lag is None else int(min_lag)
    if not 1 <= min_lag < D:
        raise ValueError(f"min_lag must be in [1, {D - 1}] for {D} decoding steps")
    s, t = np.triu_indices(D, k=min_lag)
    return float(M[perm[s], perm[t]].mean())


def far_pair_matrix(attn_full: np.ndarray, prefill_tokens: int, window: int, frac: float,
                    sink_windows: int = 1) -> np.ndarray:
    """(D, D): entry (s, t) is the share of step t's attention (non-sink prompt windows) outside the
    top-B windows of step s, mean over layers and KV heads."""
    D = attn_full.shape[0]
    nwp = prefill_tokens // window
    a = attn_full[..., sink_windows:nwp].astype(np.float64)
    B = int(np.floor(frac * a.shape[-1] + 1e-9))
    tot = a.sum(-1, keepdims=True)
    an = np.where(tot > 0, a / np.where(tot > 0, tot, 1), 0.0)  # (D, L, H, n)
    out = ~_top_sets(a, B)
    return out.reshape(D, -1).astype(np.float64) @ an.reshape(D, -1).T / (a.shape[1] * a.shape[2])


def block_permutation(n: int, block: int, rng) -> np.ndarray:
    """A permutation of ``range(n)`` that shuffles consecutive blocks of ``block`` steps (the last
    one possibly shorter) and keeps the order inside each block."""
    if block < 1:
        raise ValueError("block must be >= 1")
    blocks = [np.arange(i, min(i + block, n)) for i in range(0, n, block)]
    return np.concatenate([blocks[k] for k in rng.permutation(len(blocks))])


def drift_against_null(attn_full: np.ndarray, statistic, n_shuffles: int = 20, seed: int = 0,
                       block: int = 1, permuted=None) -> dict:
    """``statistic(attn)`` on the attention in decoding order and on ``n_shuffles`` copies with the
    decoding steps' order permuted in blocks of ``block`` steps (seeded): the declared null of "no
    drift" (the same per-step attention and, inside a block, its short-range persistence; no
    long-range order).  Returns observed, null mean and spread, and the relative excess
    ``observed / null - 1``.  ``permuted(perm)``, if given, computes the statistic of the permuted
    attention faster than ``statistic(attn_full[perm])`` (same value)."""
    obs = float(statistic(attn_full))
    rng = np.random.default_rng(seed)
    D = attn_full.shape[0]
    f = permuted or (lambda perm: statistic(attn_full[perm]))
    null = np.array([f(block_permutation(D, block, rng)) for _ in range(n_shuffles)], float)
    nm = float(np.nanmean(null))
    return dict(observed=obs, null_mean=nm, null_sd=float(np.nanstd(null)), excess=obs - nm,
                rel_excess=(obs / nm - 1) if nm > 0 else np.nan, n_shuffles=n_shuffles)


# The drift rule, declared before any result (it replaces an earlier rule, which passed whenever any
# window re-activated once).
DRIFT_RULE = dict(
    statistic="far_pair_miss", budget=0.20, block_steps=8, n_shuffles=20, alpha=0.05,
    text=("importance drifts when, for decoding steps at least half the run apart, the top 20% of prompt "
          "windows by the earlier step's attention miss more of the later step's attention in decoding "
          "order than with the steps' order shuffled in blocks of 8 (same attention and short-range "
          "persistence, no long-range order; 20 seeded shuffles): 'reproduced' when the lower end of the "
          "95% bootstrap interval over documents of the relative excess is above 0, 'not reproduced' "
          "otherwise; fewer than 2 documents: not testable"),
)


def drift_rule_verdict(rel_excess_per_doc, n_boot: int = 2000, seed: int = 0,
                       alpha: float = DRIFT_RULE["alpha"]) -> dict:
    """Verdict of :data:`DRIFT_RULE` from the per-document relative excess over the shuffled null."""
    v = np.asarray(rel_excess_per_doc, float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return dict(verdict="not testable from public data", mean=float(v.mean()) if len(v) else np.nan,
                    lo=np.nan, hi=np.nan, n_docs=len(v))
    m, lo, hi = bootstrap_ci(v, n_boot, seed, alpha)
    return dict(verdict="reproduced" if lo > 0 else "not reproduced", mean=m, lo=lo, hi=hi, n_docs=len(v))


def document_drift(attn_full: np.ndarray, prefill_tokens: int, window: int, *, gap: int, tau: float,
                   sink_windows: int, budget: float = DRIFT_RULE["budget"], decay: float = 1.0,
                   n_shuffles: int = DRIFT_RULE["n_shuffles"], block: int = DRIFT_RULE["block_steps"],
                   seed: int = 0) -> dict:
    """One document's drift measurements against the block-shuffled null: the declared statistic
    (:func:`far_pair_miss`), Global LIR and the budget-relative LIR (pooled over layers)."""
    def glir(a):
        t = global_lir(a, prefill_tokens, window, gap, tau, sink_windows)
        n = t.inactive_windows.sum()
        return t.reactivated.sum() / n if n else np.nan

    def blir(a):
        t = budget_lir(a, prefill_tokens, window, budget, gap, sink_windows, decay)
        n = t.left.sum()
        return t.reentered.sum() / n if n else np.nan

    out = {}
    M = far_pair_matrix(attn_full, prefill_tokens, window, budget, sink_windows)
    fast = dict(miss=lambda perm: far_pair_mean(M, perm))
    stats = dict(miss=lambda a: far_pair_miss(a, prefill_tokens, window, budget, sink_windows),
                 global_lir=glir, budget_lir=blir)
    for k, f in stats.items():
        r = drift_against_null(attn_full, f, n_shuffles, seed, block, permuted=fast.get(k))
        for kk, vv in r.items():
            out[f"{k}_{kk}"] = vv
    return out


def lir_gain_correlation(summary: pd.DataFrame, lir_per_doc: pd.Series, policy: str = "qevict_recall",
                         reference: str = "mikv", n_boot: int = 2000, seed: int = 0) -> dict:
    """Per document, the KL gain of ``policy`` over ``reference`` (mean over budgets of
    KL(reference) - KL(policy)) against the document's LIR: Spearman's rho with a bootstrap interval
    over documents.  Does drift predict when recovery pays?"""
    from scipy.stats import spearmanr  # optional heavy dependency: scipy.stats takes about 1 s to import

    k = summary[summary.policy.isin([policy, reference])].pivot_table(
        index="document", columns="policy", values="kl", aggfunc="mean")
    if policy not in k or reference not in k:
        return dict(rho=np.nan, lo=np.nan, hi=np.nan, n_docs=0, table=pd.DataFrame())
    gain = (k[reference] - k[policy]).rename("kl_gain")
    t = pd.concat([gain, lir_per_doc.rename("lir")], axis=1, join="inner").dropna()
    n = len(t)
    if n < 3 or t.lir.nunique() < 2 or t.kl_gain.nunique() < 2:
        return dict(rho=np.nan, lo=np.nan, hi=np.nan, n_docs=n, table=t)
    rho = float(spearmanr(t.lir, t.kl_gain)[0])
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        x, y = t.lir.values[idx], t.kl_gain.values[idx]
        if np.unique(x).size > 1 and np.unique(y).size > 1:
            boots.append(spearmanr(x, y)[0])
    lo, hi = (np.quantile(boots, [0.025, 0.975]) if len(boots) > 10 else (np.nan, np.nan))
    return dict(rho=rho, lo=float(lo), hi=float(hi), n_docs=n, table=t)


# The QEvict rule, declared before any result.
QEVICT_RULE = dict(
    metric="kl", alpha=0.05, margin_rel=0.10, min_budget_share=0.75, min_docs=3, eps=1e-6,
    text=("per (baseline, budget), the per-document log ratio log(KL_QEvict / KL_baseline): 'better' when "
          "its Holm-corrected one-sided test of a mean below 0 rejects, 'not worse' when the test of a mean "
          "below log(1 + 10%) rejects, 'worse' when the test of a mean above 0 rejects (each a Holm family "
          "over all pairs, alpha 5%, t over documents); 'reproduced' when QEvict is better or not worse "
          "than every baseline at >= 3 of 4 budgets (>= 75% of the budgets), 'partly reproduced' when "
          "that holds against some baselines, 'not reproduced' against none; fewer than 3 documents: "
          "not testable"),
)


def holm_adjust(p) -> np.ndarray:
    """Holm step-down adjusted p-values (monotone, capped at 1); NaN stays NaN."""
    p = np.asarray(p, float)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    q = p[ok]
    m = len(q)
    if m == 0:
        return out
    order = np.argsort(q, kind="stable")
    adj = np.maximum.accumulate((m - np.arange(m)) * q[order])
    res = np.empty(m)
    res[order] = np.minimum(adj, 1.0)
    out[ok] = res
    return out


def qevict_rule(summary: pd.DataFrame, policy: str, baselines,
                rule: dict = QEVICT_RULE) -> tuple[str, pd.DataFrame]:
    """Apply :data:`QEVICT_RULE`: returns (verdict, one row per (baseline, budget) with the mean log
    ratio, its Holm-level interval (level 1 - alpha / (m - k + 1) for the pair ranked k-th by its
    not-worse p-value), the three Holm-adjusted p-values and the outcome)."""
    from scipy import stats as st  # optional heavy dependency: scipy.stats takes about 1 s to import

    metric, eps, alpha = rule["metric"], rule["eps"], rule["alpha"]
    delta = np.log1p(rule["margin_rel"])
    rows = []
    for base in baselines:
        for frac in sorted(summary.budget.unique()):
            a = summary[(summary.policy == policy) & (summary.budget == frac)].set_index("document")[metric]
            b = summary[(summary.policy == base) & (summary.budget == frac)].set_index("document")[metric]
            common = a.index.intersection(b.index)
            if len(common) == 0:
                continue
            r = np.log((a[common].values + eps) / (b[common].values + eps))
            r = r[np.isfinite(r)]
            n = len(r)
            m = float(r.mean()) if n else np.nan
            se = float(r.std(ddof=1) / np.sqrt(n)) if n > 1 else np.nan
            if n > 1 and se == 0:
                se = 1e-12
            df = max(n - 1, 1)
            p_better = float(st.t.cdf(m / se, df)) if n > 1 else np.nan
            p_notworse = float(st.t.cdf((m - delta) / se, df)) if n > 1 else np.nan
            p_worse = float(st.t.sf(m / se, df)) if n > 1 else np.nan
            rows.append(dict(policy=policy, baseline=base, budget=frac, n_docs=n, log_ratio=m, se=se, df=df,
                             ratio=float(np.exp(m)), policy_value=float(a[common].mean()),
                             baseline_value=float(b[common].mean()), p_better=p_better,
                             p_notworse=p_notworse, p_worse=p_worse))
    t = pd.DataFrame(rows)
    if len(t) == 0 or t.n_docs.min() < rule["min_docs"]:
        if len(t):
            t["outcome"] = "not testable"
        return "not testable from public data", t
    for c in ("p_better", "p_notworse", "p_worse"):
        t[c + "_holm"] = holm_adjust(t[c].values)
    mpairs = len(t)
    rank = np.empty(mpairs, int)
    rank[np.argsort(t.p_notworse.values, kind="stable")] = np.arange(mpairs)
    lev = alpha / (mpairs - rank)
    tq = st.t.ppf(1 - lev / 2, t.df.values)
    t["level"] = 1 - lev
    t["lo"] = np.exp(t.log_ratio - tq * t.se)
    t["hi"] = np.exp(t.log_ratio + tq * t.se)
    t["outcome"] = np.where(t.p_better_holm < alpha, "better",
                            np.where(t.p_notworse_holm < alpha, "not worse",
                                     np.where(t.p_worse_holm < alpha, "worse", "unclear")))
    ok = t.assign(ok=t.outcome.isin(["better", "not worse"])).groupby("baseline").agg(
        ok=("ok", "sum"), n=("ok", "size"))
    passed = ok.ok >= np.ceil(rule["min_budget_share"] * ok.n - 1e-9)
    verdict = ("reproduced" if passed.all() else "partly reproduced" if passed.any() else "not reproduced")
    return verdict, t
