"""Chapter 2's tables, derived numbers and verdicts (``book/02_ssd_offload.md``): the chapter calls
these, glues and plots (figures in :mod:`analysis.tiering.figures`). Each function takes the objects
the chapter already holds (trace, hit curve, deployment, economics, replay outcomes) and returns a
table or a dict of the values the prose quotes."""
from __future__ import annotations

import time
from functools import partial

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from .. import claims, data, kv, specs, traces
from . import admission as adm
from . import agents
from . import cluster as cl
from . import datapath as dpath
from . import endurance as endu
from . import loadcompute as lc
from . import policies as pol
from . import prefill as pf
from . import replay as rp
from . import tiers as tiering
from .hitcurve import lru_hit_curve

TABLE2 = {"mooncake_conversation": "conversation", "mooncake_toolagent": "toolagent",
          "mooncake_synthetic": "synthetic"}
NONE_PUBLISHED = "none published"


def timed_hit_curve(trace):
    """The one-pass LRU hit curve of ``trace`` and the seconds it took."""
    t0 = time.perf_counter()
    hc = lru_hit_curve(trace)
    return hc, time.perf_counter() - t0


def load(trace: str, trace_requests: int = 0):
    """The chapter's trace: ``trace`` (registered name, path, or an agent family ``lmcache_<family>``
    from :mod:`analysis.tiering.agents`), its first ``trace_requests`` requests when that is positive."""
    tr = agents.load(trace) if agents.is_agent(trace) else traces.load_trace(trace)
    return tr.head(trace_requests) if trace_requests else tr


def trace_summary_table(tr) -> pd.DataFrame:
    s = tr.summary()
    return pd.DataFrame([{
        "requests": f"{s['requests']:,}", "block accesses": f"{s['blocks']:,}",
        "distinct blocks": f"{s['unique_blocks']:,}", "input tokens": f"{s['input_tokens']:,}",
        "mean input (tokens)": f"{s['mean_input_tokens']:,.0f}",
        "mean output (tokens)": f"{s['mean_output_tokens']:,.0f}",
        "duration": f"{s['duration_s'] / 60:,.1f} min"}], index=[tr.name]).rename_axis("trace").reset_index()


def cache_ratio_at(tr, hc, _name, weighting) -> float:
    """The unbounded cache's ratio of ``tr`` weighted by ``weighting``: ``token`` (share of prompt
    tokens), ``request`` (mean over requests of each prompt's share) or ``block`` (share of blocks); the
    ``recompute`` of ``ch2_table2_cache_ratio``."""
    if weighting == "token":
        return float(hc.infinite_token_hit_rate)
    if weighting == "request":
        return float((hc.per_request_hit_tokens(np.inf) / np.maximum(tr.input_tokens, 1)).mean())
    if weighting == "block":
        return float(hc.infinite_block_hit_rate)
    raise ValueError(f"unknown weighting {weighting!r}: token, request or block")


def cache_ratio(trace: str, tr, hc) -> dict:
    """Mooncake's Table 2 against this trace: the cache ratio token-weighted (the declared weighting),
    as a mean over requests and block-weighted; the verdicts (declared and mean over requests); the
    table; the trace as recognised."""
    setting_trace, recognised_by = ((None, f"{trace}, an agent trace converted from LMCache's (no published "
                                           f"figure)") if agents.is_agent(trace) else traces.recognise(trace))
    pub = {}
    if setting_trace in TABLE2:
        pub = {k: data.published(f"mooncake_table2_{TABLE2[setting_trace]}_{k}")["value"]
               for k in ("requests", "avg_input", "avg_output", "cache_ratio")}
    ratio = {w: cache_ratio_at(tr, hc, "weighting", w) for w in ("token", "request", "block")}
    setting = {"trace": setting_trace}
    verdict = claims.evaluate("ch2_table2_cache_ratio", ratio["token"], setting=setting,
                              recompute=partial(cache_ratio_at, tr, hc))
    req_verdict = claims.evaluate("ch2_table2_cache_ratio", ratio["request"], setting=setting).verdict
    s = tr.summary()
    none = NONE_PUBLISHED
    table = pd.DataFrame([
        {"quantity": "requests", "Mooncake Table 2": f"{pub['requests']:,.0f}" if pub else none,
         "this trace": f"{s['requests']:,}"},
        {"quantity": "mean input (tokens)", "Mooncake Table 2": f"{pub['avg_input']:,.0f}" if pub else none,
         "this trace": f"{s['mean_input_tokens']:,.1f}"},
        {"quantity": "mean output (tokens)", "Mooncake Table 2": f"{pub['avg_output']:,.0f}" if pub else none,
         "this trace": f"{s['mean_output_tokens']:,.1f}"},
        {"quantity": "cache ratio (%), token-weighted (declared)",
         "Mooncake Table 2": f"{pub['cache_ratio']:.0%}" if pub else none,
         "this trace": f"{ratio['token']:.1%}"},
        {"quantity": "cache ratio (%), mean over requests", "Mooncake Table 2": "(weighting not stated)",
         "this trace": f"{ratio['request']:.1%}"},
        {"quantity": "cache ratio (%), block-weighted", "Mooncake Table 2": "(weighting not stated)",
         "this trace": f"{ratio['block']:.1%}"},
    ])
    label = f"{setting_trace} ({recognised_by})" if setting_trace else recognised_by
    published_glue = ((pub["cache_ratio"], "{:.0%}") if pub
                      else (f"none (no published figure for {tr.name})", None))
    return {"setting_trace": setting_trace, "recognised_by": recognised_by, "label": label, "published": pub,
            "published_glue": published_glue,
            "ratio": ratio, "verdict": verdict, "request_verdict": req_verdict, "table": table,
            "weighting": claims.rule("ch2_table2_cache_ratio")["weighting"]}


def hit_curve(tr, hc, dep, policy_capacities_mtok, policies) -> dict:
    """The hit-rate curve's samples (token- and block-weighted, 400 capacities), the other policies at
    their sampled capacities, Mooncake's two reference capacities, the curve's saturation points and
    the HBM left for KV on one instance (tokens)."""
    caps_tok = np.geomspace(tr.block_size, 4 * hc.n_distinct * tr.block_size, 400)
    pcaps = sorted({max(1, int(c * 1e6 / tr.block_size)) for c in policy_capacities_mtok})
    return {
        "caps_tok": caps_tok, "curve_tok": hc.token_hit_rate_at_tokens(caps_tok),
        "curve_blk": hc.block_hit_rate(np.floor(caps_tok / tr.block_size)),
        "policies": pd.DataFrame(pol.policy_curve(tr, pcaps, tuple(policies))),
        "local_dram": data.published("mooncake_local_dram_tokens")["value"],
        "sat_pub": data.published("mooncake_saturation_tokens")["value"],
        "sat99": hc.capacity_for_fraction(0.99) * tr.block_size,
        "sat100": hc.saturation_blocks * tr.block_size,
        "hbm_tok": tiering.hbm_cache_tokens(dep),
    }


def lru_example(tr, hc) -> str:
    """Worked example of the stack-distance criterion: the first request whose first three blocks
    were seen before (first uses carry ``n_distinct + 1``) with distinct running maxima, and a fourth
    block."""
    cand = [i for i in np.flatnonzero(np.diff(tr.offsets) >= 4)
            if hc.run_max[tr.offsets[i] + 2] <= hc.n_distinct
            and len(set(hc.run_max[tr.offsets[i]:tr.offsets[i] + 3])) >= 2]
    if not cand:
        return "no request of this trace has four previously seen leading blocks"
    o = tr.offsets[cand[0]]
    d_ex, m_ex = hc.distance[o:o + 4].astype(int), hc.run_max[o:o + 4].astype(int)
    show = [f"{x:,}" if x <= hc.n_distinct else "∞ (first use)" for x in d_ex]
    c_ex = int(m_ex[0])
    m_show = [f"{x:,}" if x <= hc.n_distinct else "∞" for x in m_ex]
    return (f"request {cand[0]:,} has stack distances d = ({', '.join(show)}) for its first "
            f"four blocks, so m = ({', '.join(m_show)}); an LRU "
            f"cache of C = {c_ex:,} blocks serves its first {int((m_ex <= c_ex).sum())} block(s) and one of "
            f"C = {int(m_ex[2]):,} its first {int((m_ex <= m_ex[2]).sum())}")


SATURATION = {"fraction": 0.99, "definition": "fraction of the maximum"}  # ch2_fig9_saturation's defaults
KNEE_POINTS = 0.01  # the knee: every further doubling of the capacity adds under 1 point of hit rate


def saturation_tokens(hc, block_size: int, definition: str = "fraction of the maximum",
                      fraction: float = 0.99) -> float:
    """Capacity (tokens) at which the LRU curve ``hc`` saturates: where the token hit rate reaches
    ``fraction`` of its maximum, or (``definition="knee"``) the smallest capacity from which every
    doubling adds under :data:`KNEE_POINTS` of hit rate (on 400 geometric capacities)."""
    if definition == "fraction of the maximum":
        return float(hc.capacity_for_fraction(fraction) * block_size)
    if definition != "knee":
        raise ValueError(f"unknown saturation definition {definition!r}: 'fraction of the maximum' or 'knee'")
    caps = np.geomspace(block_size, 4 * max(hc.n_distinct, 1) * block_size, 400)
    gain = hc.token_hit_rate_at_tokens(2 * caps) - hc.token_hit_rate_at_tokens(caps)
    later = np.maximum.accumulate(gain[::-1])[::-1]  # the largest gain of any later doubling
    return float(caps[int(np.argmax(later < KNEE_POINTS))])


def _saturation_at(hc, block_size, name, val):
    """``recompute`` of ``ch2_fig9_saturation``: the fraction of the maximum or the definition moved."""
    if name == "saturation definition":
        return saturation_tokens(hc, block_size, val, SATURATION["fraction"])
    return saturation_tokens(hc, block_size, SATURATION["definition"], val)


def local_fraction(tr, hc, capacity_tokens: float, weighting: str = "token") -> float:
    """Hit rate of an LRU cache of ``capacity_tokens`` over the unbounded cache's, token- or
    block-weighted."""
    if weighting == "token":
        return float(hc.token_hit_rate_at_tokens(capacity_tokens) / hc.infinite_token_hit_rate)
    if weighting == "block":
        blocks = np.floor(capacity_tokens / tr.block_size)
        return float(hc.block_hit_rate(blocks) / hc.infinite_block_hit_rate)
    raise ValueError(f"unknown weighting {weighting!r}: token or block")


def _local_fraction_at(tr, hc, capacity_tokens, name, val):
    """``recompute`` of ``ch2_fig9_local_dram``: the weighting or the local cache's size moved."""
    if name == "weighting":
        return local_fraction(tr, hc, capacity_tokens, val)
    return local_fraction(tr, hc, float(val))


def saturation(tr, hc, h: dict, setting_trace) -> dict:
    """Hit rates at Mooncake's capacities and at the HBM left for KV, the saturation verdicts (Figure
    9), the share of single-use blocks and Belady's rate at its smallest sampled capacity (``None``
    when Belady was not simulated). ``h``: :func:`hit_curve`."""
    local_dram, sat_pub, sat99 = h["local_dram"], h["sat_pub"], h["sat99"]
    setting = {"trace": setting_trace}
    frac_3m = {w: local_fraction(tr, hc, local_dram, w) for w in ("token", "block")}
    out = {
        "hit_at_3m": float(hc.token_hit_rate_at_tokens(local_dram)),
        "hit_at_50m": float(hc.token_hit_rate_at_tokens(sat_pub)),
        "hit_at_hbm": float(hc.token_hit_rate_at_tokens(h["hbm_tok"])),
        "frac_at_3m": frac_3m["token"],
        "sat99_diff": sat99 / sat_pub - 1,
        "single_use": tr.single_use_share(),
        "fig9": claims.evaluate("ch2_fig9_saturation", sat99, setting=setting,
                                recompute=partial(_saturation_at, hc, tr.block_size)),
        "fig9_3m": claims.evaluate("ch2_fig9_local_dram", frac_3m["token"], setting=setting,
                                   recompute=partial(_local_fraction_at, tr, hc, local_dram)),
        "belady": None,
    }
    prow = h["policies"]
    if "belady" in set(prow["policy"]):
        b = prow[prow.policy == "belady"].sort_values("capacity_blocks").iloc[0]
        out["belady"] = {"capacity_tokens": b["capacity_blocks"] * tr.block_size, "rate": b["token_hit_rate"],
                         "lru_rate": float(hc.token_hit_rate(b["capacity_blocks"]))}
    out["belady_glue"] = belady_glue(out["belady"])
    return out


def belady_glue(b) -> dict:
    """Glue arguments ``(value, format)`` of Belady's smallest sampled capacity, its hit rate and LRU's
    there (``b``: :func:`saturation`'s ``belady``), or "not simulated"."""
    if not b:
        return {k: ("not simulated", None) for k in ("cap", "rate", "lru_rate")}
    return {"cap": (b["capacity_tokens"] / 1e6, "{:.1f}M tokens"), "rate": (b["rate"], "{:.1%}"),
            "lru_rate": (b["lru_rate"], "{:.1%}")}


EQ2 = {"8xA800": ("A800-SXM4-80GB", "mooncake_eq2_a800"), "8xH800": ("H800-SXM5-80GB", "mooncake_eq2_h800")}
EQ2_MODEL, EQ2_PREFIX, EQ2_GPUS = "Llama-3.1-70B", 8192, 8
EQ2_FLOPS = ("configuration", "weights only", "non-causal attention")


def eq2_flops(model: str, prefix_tokens: int, convention: str = "configuration") -> float:
    """Prefill FLOPs of a ``prefix_tokens`` prefix under a FLOP-counting convention of Eq. 2:
    ``configuration`` (:func:`analysis.kv.prefill_flops`: 2 per active parameter per token, LM head
    included, plus the causal attention core), ``weights only`` (no LM head, no attention core) or
    ``non-causal attention`` (every query-key pair of the full-attention layers: n^2, not n(n+1)/2)."""
    n = float(prefix_tokens)
    m = specs.model(model)
    mat = float(kv.matmul_flops_per_token(m)) * n
    core = float(kv.attention_core_flops(m, n))
    if convention == "configuration":
        return float(kv.prefill_flops(m, n))
    if convention == "weights only":
        return mat - 2.0 * m.vocab_size * m.hidden_size * n
    if convention == "non-causal attention":
        full = m.n_full_layers * kv.attention_core_flops_per_layer_token(m)
        return mat + core + full * (n * n - float(kv.attended_pairs(n)))
    raise ValueError(f"unknown FLOP convention {convention!r}: one of {EQ2_FLOPS}")


def eq2_bandwidth(gpu: str, *, compute_eff: float = 1.0, convention: str = "configuration") -> float:
    """Mooncake's Eq. 2 threshold (GB/s) for LLaMA3-70B's 8,192-token prefix on 8 ``gpu``: the paper's
    closed form (:func:`.loadcompute.reuse_bandwidth_needed`) with the FLOPs counted by ``convention``
    (the threshold is inversely proportional to the FLOPs)."""
    bw = lc.reuse_bandwidth_needed(EQ2_MODEL, gpu, EQ2_PREFIX, n_gpus=EQ2_GPUS, compute_eff=compute_eff) / 1e9
    if convention == "configuration":
        return bw
    return bw * eq2_flops(EQ2_MODEL, EQ2_PREFIX) / eq2_flops(EQ2_MODEL, EQ2_PREFIX, convention)


def _eq2_at(name, val) -> dict:
    """``recompute`` of ``ch2_eq2`` (both GPUs): compute_eff or the FLOP convention moved."""
    kw = {"compute_eff": float(val)} if name == "compute_eff" else {"convention": val}
    if name not in ("compute_eff", "FLOP convention"):
        raise KeyError(f"unknown sensitivity {name!r} of ch2_eq2: compute_eff or FLOP convention")
    return {k: eq2_bandwidth(g, **kw) for k, (g, _) in EQ2.items()}


def eq2() -> dict:
    """Mooncake's Eq. 2 (LLaMA3-70B, 8,192-token prefix, 8 GPUs) at the declared compute efficiency,
    at 0.5 and at 1.0; its verdict; the table against the published figures with the Eq. 1
    coefficient each implies; the coefficient counted from the configuration; the worked example."""
    eff = claims.rule("ch2_eq2")["sensitivity"][0]["default"]
    at = {e: {k: lc.reuse_bandwidth_needed("Llama-3.1-70B", g, 8192, n_gpus=8, compute_eff=e) / 1e9
              for k, (g, _) in EQ2.items()} for e in (eff, 0.5, 1.0)}
    verdict = claims.evaluate("ch2_eq2", at[eff], recompute=_eq2_at)
    table = pd.DataFrame([
        {"GPUs": k, "Mooncake (GB/s)": data.published(key)["value"], "this book (GB/s)": at[eff][k],
         "difference (%)": at[eff][k] / data.published(key)["value"] - 1,
         "at η = 0.5 (GB/s)": at[0.5][k],
         "implied a·n/d + b": lc.implied_eq1_coefficient("Llama-3.1-70B", g, 8192,
                                                         data.published(key)["value"] * 1e9, n_gpus=8)}
        for k, (g, key) in EQ2.items()])
    kv_bytes = kv.kv_bytes("Llama-3.1-70B", 8192, 1, "bf16")
    return {"eff": eff, "at": at, "verdict": verdict, "table": table,
            "coef": lc.our_eq1_coefficient("Llama-3.1-70B", 8192), "kv_bytes": kv_bytes,
            "eq1_implied": float(table["implied a·n/d + b"].mean()),
            "flops": float(kv.prefill_flops("Llama-3.1-70B", 8192)),
            "time_s": float(kv_bytes) / (at[eff]["8xH800"] * 1e9),
            "eff_why": claims.rule("ch2_eq2")["weighting"]}


def eq2_forward_rows(dep) -> list:
    """Mooncake's Eq. 2 criterion (the load bandwidth that matches recomputing an 8,192-token prefix of
    LLaMA3-70B on 8 GPUs) with the prefill priced by the book's one time model on ``dep``'s
    efficiencies, on both of the paper's GPUs (GB/s)."""
    out = []
    for k, (g, _) in EQ2.items():
        d_eq = dep.replace(model="Llama-3.1-70B", gpu=g, tp=8)
        bw = kv.kv_bytes("Llama-3.1-70B", 8192, 1, "bf16") / float(pf.prefill_time(d_eq, 8192, 0.0))
        out.append((f"ch2_eq2_fw_{k[2:].lower()}", bw / 1e9, "{:.2f} GB/s"))
    return out


def recall_stall_rows(dep, model: str, unit: float, k_units: int = 64, context_tokens: int = 8192) -> list:
    """How long recalling ``k_units`` reads of ``unit`` bytes per layer stalls one decode step of one
    sequence at ``context_tokens`` (the per-layer compute the reads can hide behind, from the book's
    time model): from the NVMe drive without and with prefetch one layer ahead, from the QLC drive (ms)."""
    n_layers = specs.model(model).n_layers
    per_layer = float(pf.decode_step_time(dep, context_tokens)) / n_layers
    return [
        ("ch2_recall_k", k_units, None),
        ("ch2_recall_noprefetch",
         dpath.recall_time(dep.nvme_name, unit, k_units, n_layers, per_layer, prefetch=False) * 1e3,
         "{:.2f} ms"),
        ("ch2_recall_prefetch",
         dpath.recall_time(dep.nvme_name, unit, k_units, n_layers, per_layer) * 1e3, "{:.2f} ms"),
        ("ch2_recall_qlc",
         dpath.recall_time(dep.qlc_name, unit, k_units, n_layers, per_layer) * 1e3, "{:.2f} ms"),
    ]


def replay_compare(tr, hc, dep, econ, configs, max_instances: int):
    """Chapter 2's replay of every tier configuration (:func:`analysis.tiering.replay.compare`) as a
    table, one row per configuration, and each configuration's outcome."""
    rows, outcomes = rp.compare(tr, hc, dep, econ, configs, max_instances)
    return pd.DataFrame(rows), outcomes


def requirement_pivot(models_grid, gpus_grid, prefix_tokens: int, kv_dtype: str,
                      n_gpus: int = 8) -> pd.DataFrame:
    """Load bandwidth (GB/s) that matches recomputing a ``prefix_tokens`` prefix, model x GPU."""
    grid = pd.DataFrame(lc.requirement_grid(models_grid, gpus_grid, [prefix_tokens], n_gpus=n_gpus,
                                            kv_dtype=kv_dtype))
    piv = grid.pivot(index="model", columns="gpu", values="bandwidth_needed")
    return piv.loc[models_grid, gpus_grid] / 1e9


def requirement_extremes(piv: pd.DataFrame, bandwidth: float) -> dict:
    """The largest and smallest requirement of :func:`requirement_pivot` (GB/s) and the share of
    pairs that ``bandwidth`` (bytes/s) meets."""
    pair = piv.stack()
    return {"max_pair": f"{pair.idxmax()[0]} on {pair.idxmax()[1]}", "max": float(pair.max()),
            "min_pair": f"{pair.idxmin()[0]} on {pair.idxmin()[1]}", "min": float(pair.min()),
            "share_met": float((pair * 1e9 <= bandwidth).mean())}


def tier_table(dep) -> pd.DataFrame:
    """Every tier beyond HBM on both data paths: capacity, delivered bandwidth, KV token rate, bound,
    cost per hour."""
    rows = []
    for path in ("gpu_direct", "cpu_bounce"):
        dp = dep.replace(data_path=path)
        for key in ("dram", "cxl", "pool", "nvme", "qlc", "ai_ssd"):
            t = tiering.build_tier(key, dp)
            rows.append({"data path": path, "tier": t.name, "capacity (M tokens)": t.capacity_tokens / 1e6,
                         "delivered (GB/s stored)": t.bandwidth / 1e9, "KV tokens/s (M)": t.token_rate / 1e6,
                         "bounded by": t.limit, "USD/h": t.usd_per_s * 3600})
    return pd.DataFrame(rows)


def recall_unit_bytes(model: str, kv_dtype: str, window_tokens: int = 32) -> float:
    """Bytes of one recall unit: ``window_tokens`` tokens of one layer's K and V for one KV head."""
    heads = max(specs.model(model).n_kv_heads, 1)
    return window_tokens * kv.kv_bytes_per_token_layer(model, kv_dtype) / heads


AI_SSD_DRIVES = ["Micron-9550-MAX-25.6TB", "Solidigm-D7-PS1010", "Solidigm-D5-P5336-122.88TB",
                 "AI-SSD-STAR-seed"]


def drive_sheet(drives=AI_SSD_DRIVES) -> pd.DataFrame:
    """The datasheet figures of ``drives`` (sequential read, 4K random read, capacity, in-drive
    compute) and whether they come from a public datasheet; indexed by device."""
    hw = specs.hardware_table()
    sub = hw[(hw.device.isin(drives)) & (hw.quantity.isin(["seq_read", "random_read_iops", "capacity",
                                                           "in_drive_compute"]))]
    sheet = sub.pivot_table(index="device", columns="quantity", values="si_value",
                            aggfunc="first").reindex(drives)
    src = sub.groupby("device")["estimate"].max().reindex(drives)
    return pd.DataFrame({
        "seq. read (GB/s)": sheet["seq_read"] / 1e9,
        "4K random read (M IOPS)": sheet.get("random_read_iops") / 1e6,
        "capacity (TB)": sheet["capacity"] / 1e12,
        "in-drive compute (TOPS)": sheet.get("in_drive_compute") / 1e12,
        "public datasheet": ["yes" if not e else "no: seed article's figures" for e in src],
    })


def gen5_published(sheet: pd.DataFrame) -> str:
    """The PCIe Gen5 drives of ``sheet`` (:func:`drive_sheet`) with a public datasheet and their figures."""
    hw = specs.hardware_table()
    gen5 = set(hw[(hw.quantity == "interface_bandwidth") & (hw.si_value >= 15e9)].device)
    pub = sheet[(sheet["public datasheet"] == "yes") & sheet.index.isin(gen5)]
    parts = []
    for dev, r in pub.iterrows():
        iops = r["4K random read (M IOPS)"]
        parts.append(f"{dev}: {r['seq. read (GB/s)']:g} GB/s" + (f", {iops:g}M IOPS" if iops == iops else ""))
    return "; ".join(parts)


def ai_ssd_verdicts(pl: dict) -> dict:
    """The AI SSD's two verdicts: its figures (no datasheet) and whether the link carries them
    (``pl``: :func:`analysis.tiering.tiers.ai_ssd_plausibility`)."""
    return {"datasheet": claims.evaluate("ch2_ai_ssd_datasheet", None),
            "link": claims.evaluate("ch2_ai_ssd_link", link_fractions(pl), recompute=partial(_link_at, pl))}


def link_fractions(pl: dict, payload_efficiency: float = 1.0) -> dict:
    """The AI SSD's sequential and 4 KiB random read as fractions of the PCIe 5.0 x4 ceiling times
    ``payload_efficiency`` (the share of the line rate that carries data)."""
    ceiling = pl["x4_ceiling"] * float(payload_efficiency)
    return {"sequential read": pl["seq_read"] / ceiling, "random read": pl["iops_4k_bytes"] / ceiling}


def _link_at(pl, name, val):
    if name != "link payload efficiency":
        raise KeyError(f"unknown sensitivity {name!r} of ch2_ai_ssd_link")
    return link_fractions(pl, val)


COMPARE_FORMAT = {
    "hit_rate": "{:.1%}", "attainment": "{:.1%}", "ttft_p50_s": "{:.2f}", "ttft_p90_s": "{:.2f}",
    "ttft_p99_s": "{:.2f}", "gpu_seconds": "{:,.0f}", "gpu_seconds_saved": "{:,.0f}",
    "busy_usd_per_mtok": "{:.4f}", "cluster_usd_per_mtok": "{:.4f}", "tier_usd_per_h": "{:.3f}",
    "mean_load_s": "{:.4f}", "mean_compute_s": "{:.3f}", "instances": "{:.0f}", "gpus": "{:.0f}"}
COMPARE_HEADERS = {
    "label": "configuration", "hit_rate": "hit rate (%)", "instances": "instances", "gpus": "GPUs",
    "attainment": "SLO attainment (%)", "ttft_p50_s": "TTFT p50 (s)", "ttft_p90_s": "TTFT p90 (s)",
    "ttft_p99_s": "TTFT p99 (s)", "gpu_seconds": "GPU time (GPU·s)",
    "gpu_seconds_saved": "GPU time saved (GPU·s)",
    "busy_usd_per_mtok": "busy cost (USD/M tokens)", "cluster_usd_per_mtok": "cluster cost (USD/M tokens)",
    "tier_usd_per_h": "tiers (USD/h)", "mean_load_s": "mean load (s)", "mean_compute_s": "mean compute (s)"}


def compare_table(cmp: pd.DataFrame):
    """The replay's comparison (:func:`analysis.tiering.replay.compare` rows) as a styled table; an
    en dash marks a value not computed for the row."""
    return cmp.drop(columns=["config"]).rename(columns=COMPARE_HEADERS).style.format(
        {COMPARE_HEADERS.get(k, k): v for k, v in COMPARE_FORMAT.items()}, na_rep="–").hide(axis="index")


BRIEF_COLUMNS = ("label", "hit_rate", "instances", "ttft_p90_s", "busy_usd_per_mtok", "cluster_usd_per_mtok")


def compare_table_brief(cmp: pd.DataFrame):
    """The columns of :func:`compare_table` that chapter 2's argument reads (hit rate, cluster size, p90
    TTFT, busy and cluster cost); the evidence page shows every column."""
    return compare_table(cmp[["config", *BRIEF_COLUMNS]])


SSD_KEYS = ("nvme", "qlc", "ai_ssd")
MEMORY_KEYS = ("hbm", "dram", "cxl", "pool")
SSD_PRICES = ("nvme_usd_per_byte", "qlc_usd_per_byte", "ai_ssd_usd_per_byte")


def _tier_gain(busy: dict, ssd_keys, mem_keys) -> float:
    """Share by which the cheapest SSD configuration undercuts the cheapest memory-only one."""
    if not (ssd_keys and mem_keys):
        return float("nan")
    return 1 - min(busy[k] for k in ssd_keys) / min(busy[k] for k in mem_keys)


def tiering_gain_at(tr, hc, dep, econ, ssd_keys, mem_keys, name: str, val) -> float:
    """:func:`_tier_gain` with the ``ch2_tiering_cost`` assumption ``name`` at ``val``: the SSD prices
    or the GPU rent scaled by ``val``, or the compute efficiency set to ``val``."""
    d_, e_ = dep, econ
    if name == "SSD price (x)":
        d_ = dep.replace(**{k: getattr(dep, k) * val for k in SSD_PRICES})
    elif name == "GPU rent (x)":
        e_ = rp.Economics(econ.gpu_usd_per_s * val, econ.slo_s, econ.attainment_target, econ.load_scale)
    else:
        d_ = dep.replace(compute_eff=val)
    duration = max(float(tr.arrival_s[-1] / econ.load_scale), 1.0)
    busy = {k: rp.busy_cost_per_mtok(rp.service_times(tr, hc, rp.build_tiers(k, d_), d_), d_, e_, duration,
                                     float(tr.input_tokens.sum())) for k in list(ssd_keys) + list(mem_keys)}
    return _tier_gain(busy, ssd_keys, mem_keys)


def replay_summary(cmp: pd.DataFrame, tr, hc, dep, econ, setting_trace) -> dict:
    """The cheapest configuration (busy cost), its saving against HBM only (or the first row), and the
    tiering claim: the best SSD configuration's saving over the best memory-only one, with its verdict
    recomputed at the ends of the declared assumptions; the range of SLO-sized cluster sizes."""
    c = cmp.set_index("config")
    best = c["busy_usd_per_mtok"].idxmin()
    ref = "hbm" if "hbm" in c.index else c.index[0]
    ssd_keys = [k for k in SSD_KEYS if k in c.index]
    mem_keys = [k for k in MEMORY_KEYS if k in c.index]
    tier_gain = {}
    for s_ in claims.rule("ch2_tiering_cost")["sensitivity"]:
        for val in claims.ends(s_):
            tier_gain[(s_["name"], val)] = tiering_gain_at(tr, hc, dep, econ, ssd_keys, mem_keys,
                                                           s_["name"], val)
    gain = (1 - c.loc[ssd_keys, "busy_usd_per_mtok"].min() / c.loc[mem_keys, "busy_usd_per_mtok"].min()
            if ssd_keys and mem_keys else float("nan"))
    verdict = claims.evaluate("ch2_tiering_cost", gain, setting={"trace": setting_trace},
                              recompute=partial(_tier_gain_lookup, tier_gain))
    inst = c["instances"].dropna()
    if not len(inst):
        inst_range = "no feasible number of"
    elif inst.min() != inst.max():
        inst_range = f"{inst.min():.0f} to {inst.max():.0f}"
    else:
        inst_range = f"{inst.min():.0f}"
    return {"table": c, "best": best, "best_label": c.loc[best, "label"],
            "best_busy": c.loc[best, "busy_usd_per_mtok"], "ref_label": c.loc[ref, "label"],
            "ref_busy": c.loc[ref, "busy_usd_per_mtok"],
            "best_saving": 1 - c.loc[best, "busy_usd_per_mtok"] / c.loc[ref, "busy_usd_per_mtok"],
            "best_gpu_hours_saved": c.loc[best, "gpu_seconds_saved"] / 3600,
            "best_hit": c.loc[best, "hit_rate"], "gain": gain, "tier_gain": tier_gain, "verdict": verdict,
            "gain_glue": (gain, "{:.0%}" if np.isfinite(gain)
                          else "not compared (configs lack SSD or memory tiers)"),
            "instance_range": inst_range}


def _tier_gain_lookup(tier_gain, name, val):
    return tier_gain[(name, val)]


def pareto(tr, outcomes, dep, econ):
    """The replay's (cluster cost, p90 TTFT) points over cluster sizes and the indices of the Pareto
    front."""
    pp = pd.DataFrame(rp.pareto_points(tr, outcomes, dep, econ))
    return pp, rp.pareto_front(pp[["cluster_usd_per_mtok", "ttft_p90_s"]].to_numpy())


def pareto_configs(pp: pd.DataFrame, front) -> str:
    return ", ".join(dict.fromkeys(pp.loc[front, "label"]))


WRITE_COLUMNS = ["config", "label", "tier", "tb_written_per_h", "dwpd_rated", "dwpd_used_busy", "read_factor",
                 "wear_usd_per_h", "amortised_usd_per_h_busy", "endurance_decides_busy", "instances",
                 "endurance_decides_cluster"]
WRITE_HEADERS = {
    "tb_written_per_h": "written (TB/h)", "dwpd_rated": "rated (DWPD)", "dwpd_used_busy": "used (DWPD, busy)",
    "read_factor": "read bandwidth kept (×)", "wear_usd_per_h": "wear (USD/h)",
    "amortised_usd_per_h_busy": "amortisation (USD/h, busy)", "endurance_decides_busy": "endurance decides"}


def write_table(tr, outcomes, econ) -> pd.DataFrame:
    """Bytes written per tier and their wear (:func:`analysis.tiering.replay.write_rows`), with the same
    columns when no tier is written (a small trace)."""
    return pd.DataFrame(rp.write_rows(tr, outcomes, econ)).reindex(columns=WRITE_COLUMNS)


def write_table_shown(wr: pd.DataFrame):
    shown = wr[["label", "tier", "tb_written_per_h", "dwpd_rated", "dwpd_used_busy", "read_factor",
                "wear_usd_per_h", "amortised_usd_per_h_busy", "endurance_decides_busy"]]
    shown = shown.rename(columns=WRITE_HEADERS)
    return shown.style.format({"written (TB/h)": "{:.1f}", "rated (DWPD)": "{:.2f}",
                               "used (DWPD, busy)": "{:.2f}",
                               "read bandwidth kept (×)": "{:.2f}", "wear (USD/h)": "{:.3f}",
                               "amortisation (USD/h, busy)": "{:.3f}"},
                              na_rep="–").hide(axis="index")  # – : no endurance rating (memory tiers)


def write_numbers(wr: pd.DataFrame, tr, dep) -> dict:
    """The write path's numbers: distinct KV written per hour, the NVMe tier's TB per hour, its DWPD
    used, the read bandwidth it keeps, the NVMe drive's write interference and the endurance summary."""
    s = tr.summary()
    nv_rows = wr[wr["tier"] == "NVMe Gen5 TLC"]
    nv_first = nv_rows.iloc[0] if len(nv_rows) else pd.Series(dtype=float)
    distinct_tb = s["unique_blocks"] * tr.block_size * dep.kv_bytes_per_token / 1e12
    es = rp.endurance_summary(wr.to_dict("records"))
    return {"distinct_blocks": s["unique_blocks"],
            "distinct_tb_per_h": distinct_tb / max(s["duration_s"] / 3600, 1e-9),
            "nvme_tb_per_h": float(nv_rows["tb_written_per_h"].iloc[0]) if len(nv_rows) else float("nan"),
            "nvme_dwpd_used": float(nv_first.get("dwpd_used_busy", np.nan)),
            "nvme_read_factor": float(nv_first.get("read_factor", np.nan)),
            "k_nvme": endu.write_interference(dep.nvme_name), "endurance": es,
            "endurance_decides_text": ", ".join(es["endurance_decides"]) or "none of the SSD configurations",
            "endurance_worst_text": f"{es['worst_label']} ({es['worst_ratio']:.1f}× its rating)"}


ADMISSION_HEADERS = {"token_hit_rate": "token hit rate (%)", "tb_written_per_h": "written (TB/h)",
                     "wear_usd_per_h": "wear (USD/h)", "read_factor": "read bandwidth kept (×)",
                     "busy_usd_per_mtok": "busy cost (USD/M tokens)", "seconds": "simulation time (s)"}


def admission(tr, dep, econ, admission_runs, admission_capacities_mtok, tier: str) -> dict:
    """Each ``eviction+admission`` run of ``admission_runs`` simulated at each capacity (libCacheSim)
    and priced on ``tier`` drives (:func:`analysis.tiering.admission.costs`), with the capacities in
    blocks and the simulation's wall time."""
    runs = [tuple(r.split("+")) for r in admission_runs]
    acaps = sorted({max(1, int(c * 1e6 / tr.block_size)) for c in admission_capacities_mtok})
    t0 = time.perf_counter()
    arows = adm.curves(tr, acaps, runs)
    seconds = time.perf_counter() - t0
    acost = pd.DataFrame(adm.costs(tr, arows, dep, econ, tier))
    acost["run"] = acost["policy"] + " + " + acost["admission"]
    acost["label"] = [run_label(p, a) for p, a in zip(acost["policy"], acost["admission"])]
    acost["capacity (M tokens)"] = acost["capacity_tokens"] / 1e6
    return {"capacities": acaps, "costs": acost, "seconds": seconds}


OFFLINE_BOUND = "offline bound"
OFFLINE_EVICTION = ("belady",)        # needs every block's next use: the future
OFFLINE_ADMISSION = ("oracle_reuse",)  # needs every block's next reuse distance: the future


def offline(policy: str, admission: str) -> bool:
    """Whether an eviction + admission pair needs the future (Belady, the reuse oracle): an offline
    bound for what a realisable policy could reach, never a policy to deploy."""
    return policy in OFFLINE_EVICTION or admission in OFFLINE_ADMISSION


def run_label(policy: str, admission: str) -> str:
    """The run's name as tables and figures show it: an offline pair says it is the offline bound."""
    run = f"{policy} + {admission}"
    return f"{run} ({OFFLINE_BOUND})" if offline(policy, admission) else run


def admission_table(acost: pd.DataFrame):
    acost = acost.assign(run=acost["label"]) if "label" in acost else acost
    shown = acost[["run", "capacity (M tokens)", "token_hit_rate", "tb_written_per_h", "wear_usd_per_h",
                   "read_factor", "busy_usd_per_mtok", "seconds"]].rename(columns=ADMISSION_HEADERS)
    return shown.style.format({
        "capacity (M tokens)": "{:.1f}", "token hit rate (%)": "{:.1%}", "written (TB/h)": "{:.1f}",
        "wear (USD/h)": "{:.3f}", "read bandwidth kept (×)": "{:.2f}", "busy cost (USD/M tokens)": "{:.4f}",
        "simulation time (s)": "{:.2f}"}, na_rep="–").hide(axis="index")


ADMISSION_QUOTED = (("lru", "lru + all"), ("sec", "lru + second_use"), ("ora", "lru + oracle_reuse"),
                    ("s3", "s3fifo + all"), ("bel", "belady + all"))


def admission_numbers(acost: pd.DataFrame, acaps, tr) -> dict:
    """At the middle capacity: each quoted run's hit rate and TB written per hour (NaN when not run),
    the cheapest run and its cost; the longest simulation."""
    mid = acaps[len(acaps) // 2]
    at = acost[acost["capacity_blocks"] == mid].set_index("run")
    runs = {}
    for key, run in ADMISSION_QUOTED:
        ok = run in at.index
        runs[key] = {"hit": float(at.loc[run, "token_hit_rate"]) if ok else float("nan"),
                     "tb": float(at.loc[run, "tb_written_per_h"]) if ok else float("nan")}
    best_run = at["busy_usd_per_mtok"].idxmin()
    pairs = [tuple(run.split(" + ", 1)) for run in at.index]
    real = at[[not offline(p, a) for p, a in pairs]]
    best_real = real["busy_usd_per_mtok"].idxmin() if len(real) else None
    gate = gate_savings(acost, mid)
    return {"capacity_tokens": mid * tr.block_size, "seconds_max": float(acost["seconds"].max()),
            "runs": runs,
            "best": best_run, "best_label": run_label(*best_run.split(" + ", 1)),
            "best_cost": float(at.loc[best_run, "busy_usd_per_mtok"]),
            "best_real": best_real if best_real is not None else "none simulated",
            "best_real_cost": float(real.loc[best_real, "busy_usd_per_mtok"]) if best_real is not None
            else float("nan"), "gate": gate}


def gate_savings(acost: pd.DataFrame, capacity_blocks: int, eviction: str = "lru") -> dict:
    """What frequency-gated demotion saves at ``capacity_blocks``: ``eviction + second_use`` (a block is
    written to the drive only on its second use, NVIDIA Dynamo's frequency filter for disk offload)
    against ``eviction + all`` (every miss written): the share of bytes written saved, the wear cost
    saved per hour, the factor by which the drives' rated writes last longer, and the hit-rate change
    (NaN where either run was not simulated)."""
    at = acost[acost["capacity_blocks"] == capacity_blocks].set_index("run")
    a, g = f"{eviction} + all", f"{eviction} + second_use"
    if a not in at.index or g not in at.index:
        nan = float("nan")
        return {"write_saving": nan, "wear_saved_usd_per_h": nan, "life_x": nan, "hit_change": nan}
    wa, wg = float(at.loc[a, "tb_written_per_h"]), float(at.loc[g, "tb_written_per_h"])
    wear = at["wear_usd_per_h"] if "wear_usd_per_h" in at else pd.Series(float("nan"), index=at.index)
    return {"write_saving": 1 - wg / wa if wa > 0 else float("nan"),
            "wear_saved_usd_per_h": float(wear[a] - wear[g]),
            "life_x": wa / wg if wg > 0 else float("inf"),
            "hit_change": float(at.loc[g, "token_hit_rate"] - at.loc[a, "token_hit_rate"])}


def routing(tr, hc, dep, routing_config, routing_instances, routing_policies, routing_load_scales,
            routing_load_slack_s, affinity_blocks) -> dict:
    """Hit rate of ``routing_instances`` instances, each with the local tiers of ``routing_config``,
    under each router and load scale, and of the pooled store (:func:`analysis.tiering.cluster.curves`);
    the tiers, their single-stack service, the wall time, and the trace's distinct first blocks."""
    rtiers = tiering.build_tiers(routing_config, dep)
    rcap = sum(int(t.capacity_tokens // tr.block_size) for t in rtiers)
    svc = rp.service_times(tr, hc, rtiers, dep, config=routing_config)
    t0 = time.perf_counter()
    rows = pd.DataFrame(cl.curves(tr, hc, routing_instances, routing_policies, rcap, full_s=svc.nocache_s,
                                  load_scales=routing_load_scales, load_slack_s=routing_load_slack_s,
                                  affinity_blocks=affinity_blocks))
    seconds = time.perf_counter() - t0
    first_blocks = len(np.unique(tr.block_ids[tr.offsets[:-1][np.diff(tr.offsets) > 0]]))
    return {"tiers": rtiers, "service": svc, "rows": rows, "seconds": seconds, "first_blocks": first_blocks}


# The replay's single LRU stack cut at one instance's tiers: every instance sees every other's blocks but
# holds one instance's capacity. Neither ideal nor a bound: routed instances together hold N times more.
SINGLE_STACK = "single stack (one instance's tiers, shared)"


CACHE_AWARE = ("prefix_affinity", "kv_aware")  # the routers a deployment with local caches would use


def routed_sizing(tr, cmp: pd.DataFrame, r: dict, dep, econ, routing_config, routing_policies,
                  max_instances: int, routing_load_slack_s, affinity_blocks) -> dict:
    """The SLO-sized cluster of ``routing_config`` under each cache-aware router of ``routing_policies``
    (each instance its own tiers and its own queue: :func:`analysis.tiering.replay.size_routed`), the
    router a deployment would use (the cheapest cluster meeting the SLO), against the replay's sizing
    on the single stack (``cmp``). ``r``: :func:`routing`."""
    c = cmp.set_index("config")
    t0 = time.perf_counter()
    nan = float("nan")
    rows = []
    n0 = c["instances"].get(routing_config, np.nan) if "instances" in c else np.nan
    start = int(n0) if n0 == n0 else 1  # search from the single stack's size
    for policy in [p for p in routing_policies if p in CACHE_AWARE]:
        o = rp.size_routed(tr, r["tiers"], dep, econ, policy, max_instances=max_instances,
                           full_s=r["service"].nocache_s, load_slack_s=routing_load_slack_s,
                           affinity_blocks=affinity_blocks, config=routing_config, start=start)
        rows.append({"routing": policy, "instances": o.n_instances if o else nan,
                     "cluster_usd_per_mtok": o.cluster_usd_per_mtok if o else nan,
                     "hit_rate": o.hit_rate if o else nan, "ttft_p90_s": o.p90_s if o else nan})
    table = pd.DataFrame(rows, columns=["routing", "instances", "cluster_usd_per_mtok", "hit_rate",
                                        "ttft_p90_s"])
    ok = table.dropna(subset=["cluster_usd_per_mtok"])
    use = ok.loc[ok["cluster_usd_per_mtok"].idxmin()] if len(ok) else None
    return {"config": routing_config, "label": tiering.CONFIGS[routing_config][0], "table": table,
            "policy": use["routing"] if use is not None else "none",
            "n": float(use["instances"]) if use is not None else nan,
            "cluster_cost": float(use["cluster_usd_per_mtok"]) if use is not None else nan,
            "hit": float(use["hit_rate"]) if use is not None else nan,
            "single_n": float(c.loc[routing_config, "instances"]) if routing_config in c.index else nan,
            "single_cost": float(c.loc[routing_config, "cluster_usd_per_mtok"]) if routing_config in c.index
            else nan, "seconds": time.perf_counter() - t0}


def routed_sizing_rows(s: dict) -> list:
    """Glue rows of :func:`routed_sizing`."""
    def n_text(n):
        return f"{int(n)} instances" if n == n else "no cluster up to max_instances"
    return [("ch2_route_slo_router", s["policy"].replace("_", " "), None),
            ("ch2_route_slo_n", n_text(s["n"]), None),
            ("ch2_route_slo_cost", s["cluster_cost"], "{:.3f} USD"),
            ("ch2_route_slo_hit", s["hit"], "{:.1%}"),
            ("ch2_route_slo_single_n", n_text(s["single_n"]), None),
            ("ch2_route_slo_single_cost", s["single_cost"], "{:.3f} USD"),
            ("ch2_route_slo_seconds", s["seconds"], "{:.1f} s"),
            ("ch2_route_slo_reading", routed_sizing_reading(s), None)]


def routed_sizing_reading(s: dict) -> str:
    """Whether the router that keeps the most reuse is also the one that sizes the cheapest cluster."""
    tb = s["table"].dropna(subset=["hit_rate"])
    if tb.empty:
        return "no cache-aware router meets the SLO within max_instances"
    top = tb.loc[tb["hit_rate"].idxmax()]
    name = top["routing"].replace("_", " ")
    if top["routing"] == s["policy"]:
        return f"{name} keeps the most reuse and also sizes the cheapest cluster"
    return (f"{name} keeps more reuse ({top['hit_rate']:.1%}) yet needs {int(top['instances'])} instances: "
            f"it sends every request of a prefix to one instance, whose queue then decides the TTFT")


def routed_sizing_table(s: dict):
    shown = s["table"].rename(columns={"cluster_usd_per_mtok": "cluster cost (USD/M tokens)",
                                       "hit_rate": "token hit rate (%)", "ttft_p90_s": "p90 TTFT (s)"})
    return shown.style.format({"instances": "{:.0f}", "cluster cost (USD/M tokens)": "{:.3f}",
                               "token hit rate (%)": "{:.1%}", "p90 TTFT (s)": "{:.2f}"},
                              na_rep="–").hide(axis="index")


def routing_replay(tr, cmp: pd.DataFrame, r: dict, dep, econ, routing_config, routing_policies, load_scale,
                   routing_load_slack_s, affinity_blocks) -> dict:
    """The replay's own cluster (SLO-sized for ``routing_config`` when it was compared, else the
    instances its busy time fills) under each router, against the single stack: hit rate and busy
    cost. ``r``: :func:`routing`."""
    c = cmp.set_index("config")
    svc_r = r["service"]
    dur = max(float(tr.arrival_s[-1] / load_scale), 1.0)
    tokens = float(tr.input_tokens.sum())
    n_slo = c["instances"].get(routing_config, np.nan) if "instances" in c else np.nan
    n_rep = min(int(n_slo) if n_slo == n_slo else rp.busy_instances(svc_r, dur), tr.n_requests)
    rep = [{"routing": SINGLE_STACK, "hit_rate": float(svc_r.hit_tokens.sum() / tokens),
            "busy_usd_per_mtok": rp.busy_cost_per_mtok(svc_r, dep, econ, dur, tokens)}]
    for pol_name in routing_policies:
        s_, _ = rp.routed_service(tr, r["tiers"], dep, n_rep, pol_name, full_s=svc_r.nocache_s,
                                  load_scale=load_scale, load_slack_s=routing_load_slack_s,
                                  affinity_blocks=affinity_blocks)
        rep.append({"routing": pol_name, "hit_rate": float(s_.hit_tokens.sum() / tokens),
                    "busy_usd_per_mtok": rp.busy_cost_per_mtok(s_, dep, econ, dur, tokens)})
    return {"table": pd.DataFrame(rep).set_index("routing"), "n_instances": n_rep}


def routing_table(rep: pd.DataFrame):
    return rep.reset_index().rename(columns={"hit_rate": "token hit rate (%)",
                                             "busy_usd_per_mtok": "busy cost (USD/M tokens)"}).style.format(
        {"token hit rate (%)": "{:.1%}", "busy cost (USD/M tokens)": "{:.4f}"}).hide(axis="index")


def routing_numbers(rrows: pd.DataFrame, rep: pd.DataFrame, routing_instances, routing_load_scales) -> dict:
    """At the largest number of instances and the lowest load: each router's hit rate and its busiest
    instance's share of requests; at the replay's cluster: the single stack's hit rate and the best
    and worst router's."""
    nmax = max(routing_instances)
    base_load = (rrows.load_scale == min(routing_load_scales)) | rrows.load_scale.isna()
    at_n = rrows[(rrows.n_instances == nmax) & base_load].set_index("policy")
    hit, share = at_n["token_hit_rate"], at_n["max_share"]
    routed = rep.drop(index=SINGLE_STACK)["hit_rate"]
    best = routed.idxmax()
    return {"nmax": nmax, "hit": {k: float(hit.get(k, np.nan)) for k in (
                "pooled store", "round_robin", "kv_aware", "prefix_affinity")},
            "share": {k: float(share.get(k, np.nan)) for k in ("prefix_affinity", "kv_aware")},
            "ideal_hit": float(rep.loc[SINGLE_STACK, "hit_rate"]), "best": best,
            "best_hit": float(rep.loc[best, "hit_rate"]), "worst_hit": float(routed.min())}


def breakeven_numbers(tr, hc, dep, econ, delta, prices, bws, nvme_usd_per_tb: float,
                      at_bw: float = 14.0) -> dict:
    """From the break-even map ``delta`` (bandwidths x prices): the grid bandwidth nearest ``at_bw``
    and the exact break-even price there (cost is linear in price: ``nan`` when the tier is dearer
    even free, ``inf`` at any price), and the least grid bandwidth at which the tier pays at the grid
    price nearest ``nvme_usd_per_tb`` (``None`` when none does)."""
    bw = bws[int(np.argmin(np.abs(np.asarray(bws) - at_bw)))]
    col = int(np.argmin(np.abs(np.asarray(prices) - nvme_usd_per_tb)))
    ok_bw = np.asarray(bws)[delta[:, col] < 0]
    price = rp.breakeven_price(tr, hc, dep, econ, bw)
    min_bw = float(ok_bw.min()) if ok_bw.size else None
    if np.isfinite(price):
        price_glue = (price, "{:,.0f} USD/TB")
    else:
        dearer = "no price at all: it is dearer even when free"
        price_glue = (dearer if np.isnan(price) else "any price", None)
    min_bw_glue = ((min_bw, "{:g} GB/s") if min_bw is not None
                   else (f"more than the grid's largest ({max(bws):g} GB/s)", None))
    return {"bw": bw, "price_at_bw": price, "price": prices[col], "min_bw": min_bw,
            "price_at_bw_glue": price_glue, "min_bw_glue": min_bw_glue}


def endurance_numbers(eg, prices, dwpd_grid, nvme_usd_per_tb: float) -> dict:
    """From the endurance map ``eg`` (DWPD x prices): the least grid endurance at which the NVMe tier
    pays at the grid price nearest ``nvme_usd_per_tb`` (``None`` when none does)."""
    col = int(np.argmin(np.abs(np.asarray(prices) - nvme_usd_per_tb)))
    ok_w = np.asarray(dwpd_grid)[eg[:, col] < 0]
    min_dwpd = float(ok_w.min()) if ok_w.size else None
    glue_args = ((min_dwpd, "{:g} DWPD") if min_dwpd is not None else (
        f"no endurance of the grid (up to {max(dwpd_grid):g} DWPD): the writes' share of drive time, "
        "not their wear, keeps it from paying", None))
    return {"price": prices[col], "min_dwpd": min_dwpd, "min_dwpd_glue": glue_args}


TORNADO_MEDIA = {"SSD price": "nvme", "QLC price": "qlc", "AI SSD price": "ai_ssd", "CXL price": "cxl",
                 "DRAM price": "dram", "local DRAM": "dram", "NVMe endurance": "nvme", "QLC endurance": "qlc"}
GPU_SIDE = {"GPU rent (×0.5 / ×2)", "prefill MFU (0.3 / 0.7)"}


def tornado_inputs(dep, econ, tornado_config: str, nvme_dwpd: float, qlc_dwpd: float) -> dict:
    """The tornado's inputs, ``label -> (field, low, high)``, keeping only the prices and endurance of
    media ``tornado_config`` uses (DRAM's price also for the pooled store), and routing only for local
    tiers (the pooled store is one stack)."""
    f = {
        "GPU rent (×0.5 / ×2)": ("gpu_usd_per_s", econ.gpu_usd_per_s * 0.5, econ.gpu_usd_per_s * 2),
        "prefill MFU (0.3 / 0.7)": ("compute_eff", 0.3, 0.7),
        "SSD price (×0.5 / ×3)": ("nvme_usd_per_byte", dep.nvme_usd_per_byte * 0.5,
                                  dep.nvme_usd_per_byte * 3),
        "QLC price (×0.5 / ×3)": ("qlc_usd_per_byte", dep.qlc_usd_per_byte * 0.5, dep.qlc_usd_per_byte * 3),
        "AI SSD price (×0.5 / ×3)": ("ai_ssd_usd_per_byte", dep.ai_ssd_usd_per_byte * 0.5,
                                     dep.ai_ssd_usd_per_byte * 3),
        "CXL price (×0.5 / ×3)": ("cxl_usd_per_byte", dep.cxl_usd_per_byte * 0.5, dep.cxl_usd_per_byte * 3),
        "DRAM price (×0.3 / ×2)": ("dram_usd_per_byte", dep.dram_usd_per_byte * 0.3,
                                   dep.dram_usd_per_byte * 2),
        "link efficiency (0.5 / 1.0)": ("bw_eff", 0.5, 1.0),
        "HBM share for KV (0.1 / 0.9)": ("hbm_cache_fraction", 0.1, 0.9),
        "local DRAM (100 GB / 4 TB)": ("local_dram_bytes", 100e9, 4e12),
        "storage lifetime (3 / 7 years)": ("storage_lifetime_s", 3 * tiering.YEAR_S, 7 * tiering.YEAR_S),
        "electricity (×0.5 / ×3)": ("electricity_usd_per_j", dep.electricity_usd_per_j * 0.5,
                                    dep.electricity_usd_per_j * 3),
        "data path (GPU-direct / CPU bounce)": ("data_path", "gpu_direct", "cpu_bounce"),
        "write amplification (1 / 3)": ("write_amplification", 1.0, 3.0),
        "NVMe endurance (×2 / ×0.25 DWPD)": ("nvme_dwpd", nvme_dwpd * 2, nvme_dwpd * 0.25),
        "QLC endurance (×2 / ×0.25 DWPD)": ("qlc_dwpd", qlc_dwpd * 2, qlc_dwpd * 0.25),
        "read slowdown by writes (none / datasheet ×2)": ("mixed_interference", 1.0,
                                                          2 * endu.write_interference(dep.nvme_name)),
        "routing (single stack / round robin)": ("routing", "ideal", "round_robin"),
        "GPUs per PCIe switch (1 / 2)": ("gpus_per_pcie_switch", 1, 2),
    }
    used = set(tiering.CONFIGS[tornado_config][1])
    if "pool" in used:
        f.pop("routing (single stack / round robin)")
    return {k: v for k, v in f.items()
            if not any(k.startswith(m) and t not in used and not (m == "DRAM price" and "pool" in used)
                       for m, t in TORNADO_MEDIA.items())}


def tornado_reading(torn) -> str:
    """What the tornado's top input says about the chain."""
    if torn[0]["input"] in GPU_SIDE:
        return ("the GPU side of the chain dominates, and the cache media are a second-order "
                "term as long as they are fast enough to keep prefill from stalling")
    return "here a property of the cache tiers moves the cost as much as the GPUs do"


# ----------------------------------------------------------------------- glue rows: (name, value, format)


def hbm_rows(h: dict) -> list:
    """The HBM left for KV on one instance and the capacities that reach 99% and 100% of the
    largest hit rate (:func:`hit_curve`), in millions of tokens."""
    return [
        ("ch2_hbm_tokens", h["hbm_tok"] / 1e6, "{:.2f}M tokens"),
        ("ch2_sat99_tokens", h["sat99"] / 1e6, "{:.0f}M"),
        ("ch2_sat100_tokens", h["sat100"] / 1e6, "{:.0f}M"),
    ]


def eq2_rows(e2: dict) -> list:
    """Mooncake's Eq. 2 reproduced (:func:`eq2`): the criterion on both GPUs at the declared efficiency
    and at 0.5, its difference from the published figures, the worked example (KV bytes, PFLOP, ms)
    and the Eq. 1 coefficients, implied and counted."""
    at, eff, table, coef = e2["at"], e2["eff"], e2["table"], e2["coef"]
    return [
        ("ch2_eq2_a800", at[eff]["8xA800"], "{:.2f} GB/s"),
        ("ch2_eq2_h800", at[eff]["8xH800"], "{:.2f} GB/s"),
        ("ch2_eq2_a800_diff", table.loc[0, "difference (%)"], "{:+.1%}"),
        ("ch2_eq2_h800_diff", table.loc[1, "difference (%)"], "{:+.1%}"),
        ("ch2_eq2_kv_bytes", e2["kv_bytes"], "bytes"),
        ("ch2_eq2_flops", e2["flops"] / 1e15, "{:.2f} PFLOP"),
        ("ch2_eq2_time", e2["time_s"] * 1e3, "{:.0f} ms"),
        ("ch2_eq2_eff", eff, "{:g}"),
        ("ch2_eq2_eff_why", e2["eff_why"], None),
        ("ch2_eq2_half_a800", at[0.5]["8xA800"], "{:.2f} GB/s"),
        ("ch2_eq2_half_h800", at[0.5]["8xH800"], "{:.2f} GB/s"),
        ("ch2_eq1_implied", e2["eq1_implied"], "{:.1f}"),
        ("ch2_eq1_ours", coef["total"], "{:.1f}"),
        ("ch2_eq1_weights", coef["weights"], "{:.1f}"),
        ("ch2_eq1_attn", coef["attention"], "{:.1f}"),
        ("ch2_eq1_lm", coef["lm_head"], "{:.2f}"),
    ]


def requirement_rows(piv: pd.DataFrame, dep) -> list:
    """The largest and smallest requirement of :func:`requirement_pivot` and the share of pairs that
    one NVMe tier of ``dep`` meets, with that tier's bandwidth."""
    nv = tiering.build_tier("nvme", dep)
    rq = requirement_extremes(piv, nv.bandwidth)
    return [
        ("ch2_grid_max_pair", rq["max_pair"], None),
        ("ch2_grid_max", rq["max"], "{:.0f} GB/s"),
        ("ch2_grid_min_pair", rq["min_pair"], None),
        ("ch2_grid_min", rq["min"], "{:.2g} GB/s"),
        ("ch2_nvme_bw", nv.bandwidth / 1e9, "{:.1f} GB/s"),
        ("ch2_grid_share_nvme", rq["share_met"], "{:.0%}"),
    ]


def knee_rows(dep) -> list:
    """The drive count where each data path stops scaling and the bandwidth it reaches there
    (:func:`analysis.tiering.tiers.scaling_knee`)."""
    kb_n, kb_bw = tiering.scaling_knee(dep, "cpu_bounce")
    kd_n, kd_bw = tiering.scaling_knee(dep, "gpu_direct")
    return [
        ("ch2_bounce_knee_drives", kb_n, None),
        ("ch2_bounce_knee_bw", kb_bw / 1e9, "{:.0f} GB/s"),
        ("ch2_direct_knee_drives", kd_n, None),
        ("ch2_direct_knee_bw", kd_bw / 1e9, "{:.0f} GB/s"),
    ]


def ai_ssd_rows(pl: dict) -> list:
    """The AI SSD's claims against the drive ceilings (:func:`analysis.tiering.tiers.ai_ssd_plausibility`)
    and the KV bandwidth its in-drive quantization delivers."""
    return [
        ("ch2_ai_seq_frac", pl["seq_fraction_of_ceiling"], "{:.0%}"),
        ("ch2_ai_iops_frac", pl["iops_fraction_of_ceiling"], "{:.0%}"),
        ("ch2_ai_tops_headroom", pl["tops_headroom_quant"], "{:.0f}×"),
        ("ch2_ai_eff_bw", pl["effective_kv_bw"] / 1e9, "{:.0f} GB/s"),
    ]


def gpu_rent_row(econ) -> tuple:
    """The GPU's rental rate per hour."""
    return ("ch2_gpu_rent", econ.gpu_usd_per_s * 3600, "{:.2f} USD/h")


def admission_rows(an: dict) -> list:
    """The admission comparison (:func:`admission_numbers`): the store's capacity, the slowest run, each
    run's hit rate and write rate, the cheapest pair and its cost."""
    rows = [
        ("ch2_adm_cap", an["capacity_tokens"] / 1e6, "{:.1f}M tokens"),
        ("ch2_adm_seconds_max", an["seconds_max"], "{:.2f} s"),
    ]
    for key, run in an["runs"].items():
        rows += [(f"ch2_adm_{key}_hit", run["hit"], "{:.1%}"),
                 (f"ch2_adm_{key}_tb", run["tb"], "{:.1f} TB/h")]
    return rows + [("ch2_adm_best", an["best"], None), ("ch2_adm_best_cost", an["best_cost"], "{:.3f} USD")]


def admission_gate_rows(an: dict) -> list:
    """Glue rows of the offline-bound labels, the cheapest realisable pair and the frequency gate's
    savings (:func:`admission_numbers`)."""
    g = an["gate"]
    return [("ch2_adm_best_label", an["best_label"], None),
            ("ch2_adm_best_real", an["best_real"], None),
            ("ch2_adm_best_real_cost", an["best_real_cost"], "{:.3f} USD"),
            ("ch2_adm_gate_write_saving", g["write_saving"], "{:.0%}"),
            ("ch2_adm_gate_wear_saved", g["wear_saved_usd_per_h"], "{:.3f} USD per hour"),
            ("ch2_adm_gate_life_x", g["life_x"], "{:.1f}×"),
            ("ch2_adm_gate_hit_change", g["hit_change"] * 100, "{:+.1f} points")]


FIG10_TRACES = {"mooncake_conversation": "conversation", "mooncake_toolagent": "tool&agent",
                "mooncake_synthetic": "synthetic"}
FIG10_SLACK_ENDS = (0.0, float("inf"))  # the declared sensitivity ends of routing_load_slack_s


def fig10(traces_, trace_requests: int, dep, n_instances: int, capacity_mtok: float, load_slack_s: float,
          affinity_blocks: int, own=None) -> dict:
    """Mooncake's Figure 10 (FAST'25, Sec. 5.3.2) on each trace of ``traces_`` (its first
    ``trace_requests`` requests, as the chapter's trace): ``n_instances`` instances with local caches of
    ``capacity_mtok`` million tokens and KV-aware routing against one global pool of their capacity
    (:func:`analysis.tiering.cluster.local_vs_global`), at the chapter's ``load_slack_s`` and at the
    rule's sensitivity ends; each trace's verdict under ``ch2_fig10_global_vs_local``. A trace whose file
    cannot be obtained gets a row of NaN and a not-testable verdict saying so. ``own``: ``(name, trace,
    hit curve)`` of the chapter's trace, reused. Returns the table (one row per trace), the verdicts and
    the wall time."""
    t0 = time.perf_counter()
    rows, verdicts = [], {}
    cap = capacity_mtok * 1e6
    for name in traces_:
        label = FIG10_TRACES.get(name, name)
        try:
            if own is not None and own[0] == name:
                tr, hc = own[1], own[2]
            else:
                if name in data.registry():  # a comparison trace is used where it is already present:
                    data.path(name, download=False)  # the build never downloads it (`make data` does)
                tr = load(name, trace_requests)
                hc = lru_hit_curve(tr)
        except data.DataError as exc:
            rows.append({"trace": label, "key": name, "missing": str(exc).split(". Looked in")[0],
                         **{f"pub_{q}": v for q, v in _fig10_published(name).items()}})
            verdicts[name] = claims.evaluate(
                "ch2_fig10_global_vs_local", {"hit-rate ratio": None, "prefill-time ratio": None},
                {"trace": name}, missing=f"the {label} trace file is not available here (data/registry.yaml "
                                         f"names its source; `make data` fetches it where a network is)")
            continue
        runs = {s: cl.local_vs_global(tr, dep, n_instances, cap, hc=hc, load_slack_s=s,
                                      affinity_blocks=affinity_blocks)
                for s in (load_slack_s, *FIG10_SLACK_ENDS)}
        r = runs[load_slack_s]

        def value(x):
            return {"hit-rate ratio": x["hit_ratio"], "prefill-time ratio": x["prefill_ratio"]}

        verdicts[name] = claims.evaluate("ch2_fig10_global_vs_local", value(r), {"trace": name},
                                         recompute=lambda _n, s, runs=runs: value(runs[float(s)]))
        key = TABLE2.get(name)
        pub = _fig10_published(name)
        # the missing effect's size: where the paper's local hit rate sits between cache-oblivious
        # placement (random routing: 1) and this router (0), a linear estimate of the share of requests
        # the paper's scheduler placed without regard to their cached prefix
        rnd = cl.local_vs_global(tr, dep, n_instances, cap, hc=hc, policy="random")["local_hit"]
        span = r["local_hit"] - rnd
        obl = (r["local_hit"] - pub["local_hit"]) / span if key and span > 0 else float("nan")
        rows.append({"trace": label, "key": name, **r, "local_hit_random": rnd, "oblivious_share": obl,
                     "hit_ratio_slack0": runs[0.0]["hit_ratio"],
                     "hit_ratio_prefix_only": runs[float("inf")]["hit_ratio"],
                     "local_hit_slack0": runs[0.0]["local_hit"],
                     "local_hit_prefix_only": runs[float("inf")]["local_hit"],
                     **{f"pub_{q}": v for q, v in pub.items()}})
    return {"table": pd.DataFrame(rows), "verdicts": verdicts, "seconds": time.perf_counter() - t0}


FIG10_QUANTITIES = ("local_hit", "global_hit", "hit_ratio", "local_prefill_s", "global_prefill_s",
                    "prefill_ratio")


def _fig10_published(name: str) -> dict:
    """The paper's Figure 10 values for a trace; NaN for each quantity of a trace the paper did not run
    (an agent family, a path): its row is replayed and shown, and its verdict is not testable."""
    key = TABLE2.get(name)
    if not key:
        return {q: float("nan") for q in FIG10_QUANTITIES}
    return {q: data.published(f"mooncake_fig10_{key}_{q}")["value"] for q in FIG10_QUANTITIES}


def fig10_table(f: pd.DataFrame):
    """Figure 10 side by side: the paper's bars and ratios against the replay's, per trace."""
    cols = {"trace": "trace", "pub_local_hit": "paper: local hit", "local_hit": "replay: local hit",
            "pub_global_hit": "paper: global hit", "global_hit": "replay: global hit",
            "pub_hit_ratio": "paper: hit ratio", "hit_ratio": "replay: hit ratio",
            "pub_prefill_ratio": "paper: prefill-time ratio", "prefill_ratio": "replay: prefill-time ratio",
            "local_prefill_s": "replay: local prefill (s)", "global_prefill_s": "replay: global prefill (s)"}
    shown = f.reindex(columns=list(cols)).rename(columns=cols)
    pct = {c: "{:.1%}" for c in cols.values() if c.endswith(" hit")}
    x = {c: "{:.2f}×" for c in cols.values() if "ratio" in c}
    s = {c: "{:.2f}" for c in cols.values() if c.endswith("(s)")}
    return shown.style.format(pct | x | s, na_rep="–").hide(axis="index")


def fig10_numbers(f: pd.DataFrame) -> dict:
    """The prose's Figure 10 numbers: per computed trace (key: conversation, toolagent, synthetic) its
    local and global hit rates, hit ratio and prefill ratio, the local hit rate at the slack ends, and
    the random router's local hit rate and the share of requests the paper's scheduler would have placed
    without regard to their cache (``oblivious_share``, see :func:`fig10`); and the traces that could
    not be computed."""
    done = f[f.get("local_hit", pd.Series(dtype=float)).notna()] if "local_hit" in f else f.iloc[:0]
    out = {"missing": [r["trace"] for _, r in f.iterrows() if r.get("missing") == r.get("missing") and
                       isinstance(r.get("missing"), str)]}
    for _, r in done.iterrows():
        k = TABLE2.get(r["key"], r["key"])
        out[k] = {q: float(r[q]) for q in ("local_hit", "global_hit", "hit_ratio", "prefill_ratio",
                                            "local_hit_slack0", "local_hit_prefix_only", "pub_local_hit",
                                            "pub_global_hit", "pub_hit_ratio", "pub_prefill_ratio",
                                            "local_hit_random", "oblivious_share") if q in r}
    return out


def _per_trace(n: dict, fmt) -> str:
    """'conversation a; synthetic b' over the computed traces of :func:`fig10_numbers`."""
    parts = [f"{FIG10_TRACES.get('mooncake_' + k, k)} {fmt(v)}" for k, v in n.items() if k != "missing"]
    if not parts:
        return "not computed (no trace file of fig10_traces is available)"
    return "; ".join(parts)


def _published(x: float, fmt) -> str:
    """A published Figure 10 value formatted, or a statement that the paper has none for the trace."""
    return "no published value" if x != x else fmt(x)


def _oblivious_text(v: dict) -> str:
    s = v["oblivious_share"]
    if v.get("pub_local_hit", 0.0) != v.get("pub_local_hit", 0.0):
        return "not estimable (the paper's Figure 10 has no bars for this trace)"
    if 0 <= s <= 1:
        return f"{s:.0%}"
    return ("not estimable (the paper's local hit rate lies outside the range from random placement to "
            "this router)")


def fig10_rows(n: dict, verdicts: dict) -> list:
    """Glue rows ``(key, text, None)`` of the Figure 10 prose (``n``: :func:`fig10_numbers`)."""
    pct = "{:.1%}".format
    missing = (f"; the {', '.join(n['missing'])} trace file is not available here, so that trace is not "
               f"compared" if n["missing"] else "")
    verdict_text = "; ".join(f"{FIG10_TRACES.get(k, k)}: {v.label}" for k, v in verdicts.items()) or "none"
    return [
        ("ch2_fig10_global_text", "the pooled capacity reaches " + _per_trace(
            n, lambda v: f"{pct(v['global_hit'])} against the paper's "
                         f"{_published(v['pub_global_hit'], pct)}") + missing,
         None),
        ("ch2_fig10_local_text", _per_trace(
            n, lambda v: f"{pct(v['local_hit'])} against the paper's "
                         f"{_published(v['pub_local_hit'], pct)}"), None),
        ("ch2_fig10_ratio_text", _per_trace(
            n, lambda v: f"{v['hit_ratio']:.2f}× in hit rate "
                         f"(paper {_published(v['pub_hit_ratio'], '{:.2f}×'.format)}) and "
                         f"{v['prefill_ratio']:.2f}× in mean prefill time "
                         f"(paper {_published(v['pub_prefill_ratio'], '{:.2f}×'.format)})"),
         None),
        ("ch2_fig10_verdicts_text", verdict_text, None),
        ("ch2_fig10_prefix_only_text", _per_trace(n, lambda v: pct(v["local_hit_prefix_only"])), None),
        ("ch2_fig10_slack0_text", _per_trace(n, lambda v: pct(v["local_hit_slack0"])), None),
        ("ch2_fig10_random_text", _per_trace(n, lambda v: pct(v["local_hit_random"])), None),
        ("ch2_fig10_oblivious_text", _per_trace(n, _oblivious_text), None),
    ]


# ------------------------------------------------------------------ vLLM's KV offloading connector
# The blog post of 2026-01-08 (vllm-project.github.io): Fig. 1's prompt lengths (K tokens), Fig. 2's CPU
# hit rates (%) and its prompt; their published points are rows of data/published.csv.
VLLM_PROMPTS_K = (1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100)
VLLM_HIT_PCT = (0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100)
VLLM_GAINS_PCT = (50, 90, 100)
VLLM_BLOCK_TOKENS = 16  # the post's GPU and CPU block size (its "Evaluation Setup")


def vllm_published() -> dict:
    """The post's published setup and points (data/published.csv): Fig. 1's TTFTs (s) per prompt
    length, Fig. 2's throughputs (tokens/s) per hit rate and the baseline without offloading, the gains
    over the 0% point, the DMA bandwidth (as printed, GB/s), the prompt of Fig. 2 and the setting
    (model, gpu) the figures belong to."""
    p = data.published
    ref = claims.rule("ch2_vllm_offload_ttft")["components"][0]["reference"]["setting"]
    return {
        "compute_s": np.array([p(f"vllm_offload_fig1_compute_ms_{k}k")["value"]
                               for k in VLLM_PROMPTS_K]) / 1e3,
        "load_s": np.array([p(f"vllm_offload_fig1_load_ms_{k}k")["value"] for k in VLLM_PROMPTS_K]) / 1e3,
        "speedup_min": p("vllm_offload_ttft_speedup_min")["value"],
        "speedup_max": p("vllm_offload_ttft_speedup_max")["value"],
        "tput": np.array([p(f"vllm_offload_fig2_tput_h{h}")["value"] for h in VLLM_HIT_PCT], dtype=float),
        "baseline": p("vllm_offload_fig2_tput_baseline")["value"],
        "gains": {h: p(f"vllm_offload_fig2_gain_h{h}")["value"] for h in VLLM_GAINS_PCT},
        "dma_gb_s": p("vllm_offload_dma_h2d_gb_s_2mb")["value"],
        "prompt_tokens": p("vllm_offload_fig2_prompt_tokens")["value"],
        "block_mb": p("vllm_offload_block_mb")["value"],
        "setting": dict(ref)}


def vllm_ttft_value(model, gpu, compute_eff, bytes_per_gb=2**30, tokens_per_k=1000, overlap=True, pub=None):
    """The model's Fig. 1 at the post's prompt lengths (:func:`analysis.tiering.loadcompute.cpu_hit_ttft`,
    the post's DMA bandwidth) and the components of ``ch2_vllm_offload_ttft``."""
    pub = pub or vllm_published()
    r = lc.cpu_hit_ttft(model, gpu, np.array(VLLM_PROMPTS_K, dtype=float) * tokens_per_k,
                        pub["dma_gb_s"] * bytes_per_gb, block_tokens=VLLM_BLOCK_TOKENS,
                        compute_eff=compute_eff, overlap=overlap)
    comps = {"speed-up at 1K tokens": float(r["speedup"][0]),
             "speed-up at 100K tokens": float(r["speedup"][-1]),
             "recompute TTFT at 100K tokens": float(r["recompute_s"][-1]),
             "CPU-load TTFT at 100K tokens": float(r["load_ttft_s"][-1])}
    return r, comps


def vllm_tput_value(model, gpu, compute_eff, chunk_tokens, bytes_per_gb=2**30, overlap=True, pub=None):
    """The model's Fig. 2 at the post's hit rates (:func:`analysis.tiering.loadcompute.offload_throughput`)
    and the components of ``ch2_vllm_offload_throughput``."""
    pub = pub or vllm_published()
    r = lc.offload_throughput(model, gpu, pub["prompt_tokens"], np.array(VLLM_HIT_PCT) / 100.0,
                              pub["dma_gb_s"] * bytes_per_gb, chunk_tokens=chunk_tokens,
                              block_tokens=VLLM_BLOCK_TOKENS, compute_eff=compute_eff, overlap=overlap)
    t = r["tokens_per_s"]
    comps = {"throughput at 0% hits": float(t[0])}
    comps |= {f"gain at {h}% hits": float(t[VLLM_HIT_PCT.index(h)] / t[0]) for h in VLLM_GAINS_PCT}
    return r, comps


def _implied_compute_eff(f, target, lo=0.05, hi=1.0):
    """The compute efficiency at which ``f(eff)`` (monotone in it) equals ``target`` (NaN outside
    ``[lo, hi]``)."""
    g = lambda e: f(e) - target  # noqa: E731
    if g(lo) * g(hi) > 0:
        return float("nan")
    return float(brentq(g, lo, hi, xtol=1e-4))


def vllm_offload(model: str, gpu: str, compute_eff: float, chunk_tokens: int) -> dict:
    """vLLM's KV offloading connector (blog post of 2026-01-08) against this chapter's models on
    ``model`` and one ``gpu``: Fig. 1 (single-request TTFT, CPU loads against recompute, over prompt
    lengths) and Fig. 2 (throughput of 512-token prefills over the CPU hit rate), each curve with the
    replay's overlap rule and with the load added to the compute (the missing effect's size); the
    verdicts of ``ch2_vllm_offload_ttft`` and ``ch2_vllm_offload_throughput`` (another model or GPU
    than the post's: not testable); and estimates of what the model misses from the published points:
    the compute efficiency the measured recompute and 0% throughput imply, and a line fitted to the
    published CPU-load TTFTs (its slope as an effective copy bandwidth, its intercept a fixed time per
    request)."""
    t0 = time.perf_counter()
    pub = vllm_published()
    same = (model, gpu) == (pub["setting"].get("model"), pub["setting"].get("gpu"))
    setting = {"model": model, "gpu": gpu}
    t1 = time.perf_counter()
    r1, v1 = vllm_ttft_value(model, gpu, compute_eff, pub=pub)
    r1s, v1s = vllm_ttft_value(model, gpu, compute_eff, overlap=False, pub=pub)
    r2, v2 = vllm_tput_value(model, gpu, compute_eff, chunk_tokens, pub=pub)
    r2s, v2s = vllm_tput_value(model, gpu, compute_eff, chunk_tokens, overlap=False, pub=pub)
    curve_s = time.perf_counter() - t1

    def re1(name, val):
        kw = {"compute_eff": compute_eff}
        names = {"compute_eff": "compute_eff", "bytes per GB": "bytes_per_gb", "tokens per K": "tokens_per_k"}
        kw[names[name]] = float(val)
        return vllm_ttft_value(model, gpu, pub=pub, **kw)[1]


    def re2(name, val):
        kw = {"compute_eff": compute_eff, "chunk_tokens": chunk_tokens}
        names = {"compute_eff": "compute_eff", "bytes per GB": "bytes_per_gb", "chunk_tokens": "chunk_tokens"}
        key = names[name]
        kw[key] = int(val) if key == "chunk_tokens" else float(val)
        return vllm_tput_value(model, gpu, pub=pub, **kw)[1]

    verdicts = {"ttft": claims.evaluate("ch2_vllm_offload_ttft", v1, setting, recompute=re1),
                "throughput": claims.evaluate("ch2_vllm_offload_throughput", v2, setting, recompute=re2)}
    nan = np.full(len(VLLM_PROMPTS_K), np.nan)
    ttft = pd.DataFrame({"prompt_k": VLLM_PROMPTS_K, "pub_compute_s": pub["compute_s"] if same else nan,
                         "pub_load_s": pub["load_s"] if same else nan, "recompute_s": r1["recompute_s"],
                         "load_ttft_s": r1["load_ttft_s"], "load_ttft_serial_s": r1s["load_ttft_s"]})
    nan = np.full(len(VLLM_HIT_PCT), np.nan)
    tput = pd.DataFrame({"hit_pct": VLLM_HIT_PCT, "pub_tokens_per_s": pub["tput"] if same else nan,
                         "tokens_per_s": r2["tokens_per_s"], "tokens_per_s_serial": r2s["tokens_per_s"]})
    est = {"same_setting": same}
    if same:
        # what the model misses, sized from the published points (estimates, not fitted into the model)
        L = VLLM_PROMPTS_K[-1] * 1000.0
        est["eff_recompute"] = _implied_compute_eff(
            lambda e: float(lc.cpu_hit_ttft(model, gpu, [L], 1.0, compute_eff=e)["recompute_s"][0]),
            pub["compute_s"][-1])
        est["eff_tput0"] = _implied_compute_eff(
            lambda e: float(lc.offload_throughput(model, gpu, pub["prompt_tokens"], 0.0, 1.0, compute_eff=e,
                                                  chunk_tokens=chunk_tokens)["tokens_per_s"][0]),
            pub["tput"][0])
        k = np.array(VLLM_PROMPTS_K[1:], dtype=float) * 1000.0
        slope, icpt = np.polyfit(k, pub["load_s"][1:], 1)
        est["fit_bw_bytes_s"] = kv.kv_bytes(model, 1.0, 1, "bf16") / slope
        est["fit_fixed_s"] = float(icpt)
        est["dma_bytes_s"] = pub["dma_gb_s"] * 2**30
        # the 1K speed-up with the fitted fixed time added to the model's load
        est["speedup_1k_with_fixed"] = float(r1["recompute_s"][0] / (r1["load_ttft_s"][0] + icpt))
    return {"ttft": ttft, "tput": tput, "values": {"ttft": v1, "throughput": v2},
            "serial": {"ttft": v1s, "throughput": v2s}, "verdicts": verdicts, "estimates": est, "pub": pub,
            "model": model, "gpu": gpu, "curve_seconds": curve_s, "seconds": time.perf_counter() - t0}


def _max_dev(values: dict, pub: dict, gains) -> float:
    """Largest relative deviation of the model's gains from the post's."""
    return max(abs(values[f"gain at {h}% hits"] / pub["gains"][h] - 1.0) for h in gains)


def vllm_rows(r: dict, compute_eff: float) -> list:
    """Glue rows ``(key, value, fmt)`` of the vLLM offloading prose (``r``: :func:`vllm_offload`); the
    blog's numbers are quoted beside the model's only in the blog's setting."""
    v1, v2 = r["values"]["ttft"], r["values"]["throughput"]
    s2 = r["serial"]["throughput"]
    pub, est = r["pub"], r["estimates"]
    same = bool(est.get("same_setting"))
    other = (f"not estimated: the blog's figures are for {pub['setting'].get('model')} on one "
             f"{pub['setting'].get('gpu')}")

    def blog(text):
        return f" (blog {text})" if same else ""

    gains = VLLM_GAINS_PCT
    pct = ", ".join(f"{h}%" for h in gains[:-1]) + f" and {gains[-1]}%"
    g_model = ", ".join(f"{v2[f'gain at {h}% hits']:.2f}×" for h in gains)
    g_blog = ", ".join(f"{pub['gains'][h]:.2f}×" for h in gains)
    b_min, b_max = f"{pub['speedup_min']:g}×", f"{pub['speedup_max']:g}×"
    b_rc, b_ld, b_t0 = f"{pub['compute_s'][-1]:.2f} s", f"{pub['load_s'][-1]:.3f} s", f"{pub['tput'][0]:,.0f}"
    rows = [
        ("ch2_vllm_ttft_text", f"{v1['speed-up at 1K tokens']:.1f}× at 1K tokens{blog(b_min)} "
                               f"and {v1['speed-up at 100K tokens']:.1f}× at 100K{blog(b_max)}", None),
        ("ch2_vllm_ttft_100k_text", f"{v1['recompute TTFT at 100K tokens']:.2f} s to recompute{blog(b_rc)} "
                                    f"and {v1['CPU-load TTFT at 100K tokens']:.3f} s to load{blog(b_ld)}",
         None),
        ("ch2_vllm_tput_text", f"{v2['throughput at 0% hits']:,.0f} tokens/s at 0% CPU hits{blog(b_t0)} and "
                               f"{g_model} that at {pct}{blog(g_blog)}", None),
        ("ch2_vllm_setup_text", f"{pub['setting'].get('model')} on one {pub['setting'].get('gpu')}"
                                + ("" if same else f" (this run: {r['model']} on one {r['gpu']})")
                                + ", its KV cache copied from CPU "
                                f"memory in {VLLM_BLOCK_TOKENS}-token blocks of {pub['block_mb']:g} MB at "
                                f"{pub['dma_gb_s']:g} GB/s (the post's Fig. 4, GB read as 2³⁰ bytes), the "
                                f"throughput runs on {pub['prompt_tokens']:g}-token prompts", None),
        ("ch2_vllm_serial_text", ", ".join(f"{s2[f'gain at {h}% hits']:.2f}×" for h in gains)
         + (f", at most {_max_dev(s2, pub, gains):.0%} from the post's (overlapped: at most "
            f"{_max_dev(v2, pub, gains):.0%})" if same else ""), None),
        ("ch2_vllm_curve_seconds", r["curve_seconds"], "{:.2f} s"),
        ("ch2_vllm_seconds", r["seconds"], "{:.2f} s"),
    ]
    if same:
        e1, e2 = est["eff_recompute"], est["eff_tput0"]
        way = ("faster" if min(e1, e2) > compute_eff else "slower" if max(e1, e2) < compute_eff
               else "about as fast")
        bw, dma = est["fit_bw_bytes_s"] / 1e9, est["dma_bytes_s"] / 1e9
        fixed_ms = est["fit_fixed_s"] * 1e3
        rows += [
            ("ch2_vllm_eff_text", f"the post's prefill is {way} than the time model at compute_eff = "
                                  f"{compute_eff:g}: its points imply a compute efficiency of {e1:.2f} "
                                  f"(recompute TTFT at 100K tokens) and {e2:.2f} (throughput at 0% hits)",
             None),
            ("ch2_vllm_loadfit_text", f"the post's CPU-load TTFTs lie on a line of {bw:.1f} GB/s "
                                      f"({'slower' if bw < dma else 'faster'} than the {dma:.1f} GB/s of its "
                                      f"own copy benchmark, both in 10⁹ bytes) plus {fixed_ms:.0f} ms per "
                                      f"request, a fixed time the model lacks", None),
            ("ch2_vllm_speedup_1k_fixed", est["speedup_1k_with_fixed"], "{:.1f}×")]
    else:
        rows += [("ch2_vllm_eff_text", other, None), ("ch2_vllm_loadfit_text", other, None),
                 ("ch2_vllm_speedup_1k_fixed", other, None)]
    return rows
