"""Chapter 2 on a second trace family: LMCache's agent sessions beside Mooncake's trace.

The converted traces are the committed artifact ``results/lmcache_agent_traces/`` (written by
``python -m analysis.derive_traces`` with :mod:`analysis.tiering.agent_traces`; stale when that code
changes). :func:`load` reads one family as a :class:`~analysis.traces.Trace` under the chapter's
trace name ``lmcache_<family>`` (so ``python -m analysis.rerun book/02_ssd_offload.md -p trace
lmcache_miniswe`` reruns the chapter on it); :func:`compare` puts every family's hit curve and
economics beside the chapter's own trace.
"""
from __future__ import annotations

import functools
import time

import numpy as np
import pandas as pd

from .. import artifacts, data, traces
from . import agent_traces as at
from . import replay as rp
from . import tiers as tiering
from .hitcurve import lru_hit_curve

ECON_CONFIGS = ("hbm", "dram", "nvme")  # the configurations priced per family (those of `configs`)


def artifact():
    """The committed converted traces (:class:`analysis.artifacts.Artifact`)."""
    return artifacts.read_artifact("lmcache_agent_traces")


@functools.lru_cache(maxsize=8)
def _load(name: str, provenance_date: str) -> traces.Trace:
    fam = at.family_of(name)
    art = artifact()
    df = art.tables.get(f"trace_{fam}")
    if df is None:
        raise traces.TraceError(f"results/{at.ARTIFACT} has no table trace_{fam}: recompute it with "
                                f"`python -m analysis.derive_traces --source <{at.SOURCE_REPO}>`")
    return traces.from_requests(at.from_table(df), name=name, block_size=int(art.provenance["block_size"]))


def load(name: str) -> traces.Trace:
    """The agent family ``lmcache_<family>`` as a trace (memoised per artifact version)."""
    if at.family_of(name) is None:
        raise traces.TraceError(f"{name!r} is not an agent trace; those are "
                                f"{', '.join(at.trace_name(f) for f in at.FAMILIES)}")
    return _load(name, str(artifact().provenance.get("date")))


def is_agent(name) -> bool:
    return at.family_of(name) is not None


FAMILY_LABELS = {"miniswe": "mini-SWE-agent", "taubench": "tau-bench", "magagent": "magagent"}


def _economics(tr, hc, dep, econ, configs) -> dict:
    """Busy cost (USD per million input tokens) of each configuration on ``tr``: GPU time used plus the
    tiers, as the chapter's replay prices it (:func:`analysis.tiering.replay.busy_cost_per_mtok`)."""
    duration = max(float(tr.arrival_s[-1] / econ.load_scale), 1.0)
    tokens = float(tr.input_tokens.sum())
    return {k: rp.busy_cost_per_mtok(rp.service_times(tr, hc, rp.build_tiers(k, dep), dep), dep, econ,
                                     duration, tokens) for k in configs}


def compare(own, dep, econ, configs) -> dict:
    """Each agent family beside the chapter's trace ``own = (name, trace, hit curve)``: the hit curve
    (token-weighted LRU at 200 capacities), and a table row per trace: requests, sessions, mean prompt,
    the unbounded cache's ratio, the hit rate at the HBM left for KV on one instance and at Mooncake's
    3M-token local DRAM, the capacity reaching 99% of the maximum, and the busy cost per million input
    tokens of HBM only and of the cheapest of :data:`ECON_CONFIGS` (those in ``configs``). Returns the
    table, the curves, the seconds each curve took (largest) and the artifact's provenance line."""
    art = artifact()
    summ = art.tables["summary"].set_index("family")
    hbm_tok = tiering.hbm_cache_tokens(dep)
    local_dram = data.published("mooncake_local_dram_tokens")["value"]
    cfgs = [k for k in ECON_CONFIGS if k in configs] or ["hbm"]
    own_fam = at.family_of(own[0])
    entries = [(own[0], own[1], own[2], "this chapter's trace", own_fam)]
    for fam in at.FAMILIES:
        name = at.trace_name(fam)
        if name != own[0]:
            entries.append((name, load(name), None, at.FAMILIES[fam].split(" (")[0], fam))
    rows, curves, worst = [], {}, 0.0
    for name, tr, hc, what, fam in entries:
        t0 = time.perf_counter()
        hc = hc if hc is not None else lru_hit_curve(tr)
        caps = np.geomspace(tr.block_size, 4 * max(hc.n_distinct, 1) * tr.block_size, 200)
        curves[name] = (caps, hc.token_hit_rate_at_tokens(caps))
        worst = max(worst, time.perf_counter() - t0)
        cost = _economics(tr, hc, dep, econ, cfgs)
        best = min(cost, key=cost.get)
        s = tr.summary()
        rows.append({
            "trace": name, "what": what,  # the chapter's trace: sessions unknown (Mooncake's has none)
            "sessions": int(summ.loc[fam, "sessions"]) if fam else np.nan,
            "requests": s["requests"], "mean_prompt": s["mean_input_tokens"],
            "distinct_mtok": hc.n_distinct * tr.block_size / 1e6,
            "per_session_ktok": (hc.n_distinct * tr.block_size / 1e3 / summ.loc[fam, "sessions"]
                                 if fam else np.nan),
            "cache_ratio": float(hc.infinite_token_hit_rate),
            "hit_hbm": float(hc.token_hit_rate_at_tokens(hbm_tok)),
            "hit_3m": float(hc.token_hit_rate_at_tokens(local_dram)),
            "sat99_mtok": hc.capacity_for_fraction(0.99) * tr.block_size / 1e6,
            "hbm_usd": cost.get("hbm", np.nan), "best": tiering.CONFIGS[best][0], "best_usd": cost[best],
            "saving": 1 - cost[best] / cost["hbm"] if "hbm" in cost else np.nan,
        })
    return {"table": pd.DataFrame(rows), "curves": curves, "curve_seconds": worst,
            "hbm_tok": hbm_tok, "local_dram": local_dram, "provenance": art.describe()}


HEADERS = {"trace": "trace", "what": "what", "sessions": "sessions", "requests": "requests",
           "mean_prompt": "mean prompt (tokens)", "distinct_mtok": "distinct KV (M tokens)",
           "per_session_ktok": "distinct KV per session (K tokens)",
           "cache_ratio": "cache ratio (unbounded)", "hit_hbm": "hit rate, HBM of one instance",
           "hit_3m": "hit rate, 3M tokens", "sat99_mtok": "99% of max at (M tokens)",
           "hbm_usd": "USD / M input tokens, HBM only", "best": "cheapest", "best_usd": "its USD / M tokens",
           "saving": "saving"}
FORMAT = {"sessions": "{:,.0f}", "requests": "{:,}", "mean_prompt": "{:,.0f}", "distinct_mtok": "{:,.2f}",
          "per_session_ktok": "{:,.1f}",
          "cache_ratio": "{:.1%}", "hit_hbm": "{:.1%}", "hit_3m": "{:.1%}", "sat99_mtok": "{:,.2f}",
          "hbm_usd": "{:.3f}", "best_usd": "{:.3f}", "saving": "{:.0%}"}


def table_shown(t: pd.DataFrame):
    return t.rename(columns=HEADERS).style.format(
        {HEADERS[k]: v for k, v in FORMAT.items()}, na_rep="–").hide(axis="index")


def glue_rows(t: pd.DataFrame) -> list:
    """``glue`` arguments of each agent family's row: cache ratio, hit rate at the HBM of one instance,
    the cheapest configuration's saving against HBM only, and the range of the families' ratios."""
    out = []
    agents = t[t["trace"].map(is_agent)]
    for _, r in agents.iterrows():
        fam = at.family_of(r["trace"])
        out += [(f"ch2_agent_{fam}_ratio", r["cache_ratio"], "{:.1%}"),
                (f"ch2_agent_{fam}_hit_hbm", r["hit_hbm"], "{:.1%}"),
                (f"ch2_agent_{fam}_saving", r["saving"], "{:.0%}"),
                (f"ch2_agent_{fam}_best", r["best"], None),
                (f"ch2_agent_{fam}_mean_prompt", r["mean_prompt"], "{:,.0f} tokens")]
    out.append(("ch2_agent_requests", int(agents["requests"].sum()), "{:,} requests"))
    out.append(("ch2_agent_max_distinct", float(agents["distinct_mtok"].max()), "{:.2f}M tokens"))
    own = t.iloc[0]
    out.append(("ch2_agent_own_distinct", float(own["distinct_mtok"]), "{:,.1f}M tokens"))
    per = agents.set_index("trace")["per_session_ktok"]
    out.append(("ch2_agent_per_session_range", f"{per.min():,.0f}K to {per.max():,.0f}K tokens", None))
    fits = bool(np.all(agents["hit_hbm"] >= agents["cache_ratio"] - 1e-12))
    out.append(("ch2_agent_hbm_reading",
                "already holds all of it, so the hit rate there equals the unbounded ratio" if fits else
                "does not hold all of it: the hit rate there stays below the unbounded ratio", None))
    big = per.idxmax()
    out.append(("ch2_agent_sessions_for_3m", float(3e6 / (per[big] * 1e3)), "{:,.0f}"))
    out.append(("ch2_agent_sessions_for_3m_family", FAMILY_LABELS[at.family_of(big)], None))
    return out
