"""Validation cells against public production systems: the simulator's best decode throughput per GPU
in the setting a production report states, next to the published figure (data/published.csv).

StepFun's Step-3 report (arXiv 2507.19427) gives decode throughput per Hopper GPU at 4K context under a
50 ms TPOT SLO, FP8, no multi-token prediction: Step-3 with attention-FFN disaggregation (AFD) and
DeepSeek-V3 in the same setting. The cell prices every decode configuration of the mode on the named
GPU within the budget and keeps the best one that meets the TPOT SLO.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import forward as costs
from .. import measured as M
from .. import specs
from ..forward import Efficiency, Precision
from . import des, devices, sharegpt
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


def best_decode(model, device, mode: str, wl: S.Workload, *, tpot_slo_s: float, prec: Precision = Precision(),
                eff: Efficiency = Efficiency(), grid: S.Grid | None = None,
                budget: int = VALIDATION_BUDGET) -> dict:
    """The book's one decode throughput: the best output tokens/s per device of decode role ``mode``
    (``"D"``: one instance holding attention and experts, EP across it; ``"AFD"``: attention and FFN
    pools, :func:`analysis.disagg.search.af_layer_time`) for workload ``wl`` that meets ``tpot_slo_s``,
    over every configuration of ``grid`` (default :class:`~analysis.disagg.search.Grid`) within
    ``budget`` devices. A configuration of ``B`` sequences per instance of ``n`` devices stepping
    every TPOT ``t`` delivers ``B / (t n)`` output tokens/s per device.

    Returns ``feasible``, ``tokens_per_s_per_device`` (NaN if nothing meets the SLO), ``tpot_s``,
    ``batch``, ``devices``, ``config`` (the chosen configuration's axes), ``grid_edge`` (the choice
    sits on the grid's largest size or batch), ``edges`` (every grid edge it sits on,
    :func:`analysis.disagg.search.grid_edges`; a :class:`~analysis.disagg.search.GridEdgeWarning`
    names them), ``candidates``, and ``tpot_batch1_s`` / ``batch1``:
    the fastest TPOT among the feasible configurations with the smallest batch."""
    if mode not in ("D", "AFD"):
        raise S.SearchError(f"mode must be 'D' or 'AFD', got {mode!r}")
    g = grid or S.Grid()
    if mode == "D":
        c = S.role_candidates("D", model, wl, device, prec=prec, eff=eff, grid=g, budget=budget)
    else:
        c = S.role_candidates("DAF", model, wl, (device, device), prec=prec, eff=eff, grid=g, budget=budget)
    ok = c["feasible"] & (c["tpot"] <= tpot_slo_s)
    tps = np.where(ok, c["batch"] / (c["tpot"] * c["devices"]), -np.inf)
    if not ok.any():
        return {"feasible": False, "tokens_per_s_per_device": float("nan"), "tpot_s": float("nan"),
                "tpot_batch1_s": float("nan"), "config": {}, "candidates": int(len(tps))}
    i = int(np.argmax(tps))
    keys = [k for k in ("size", "tp", "n_a", "n_f", "m", "ovl", "batch", "devices") if k in c]
    one = c["feasible"] & (c["batch"] == np.min(c["batch"][c["feasible"]]))
    j = int(np.flatnonzero(one)[np.argmin(c["tpot"][one])])
    moe = bool((model if isinstance(model, costs.Shape) else costs.shape(model)).n_moe)
    chosen = {"unit": mode, **{k: float(c[k][i]) for k in keys}}
    edges = S.grid_edges([chosen], g.limited(budget), budget, moe)
    where = device if isinstance(device, str) else device.get("name", "the device")
    S.warn_edges(f"the best {mode} decode of {getattr(model, 'name', model)} on {where}", edges,
                 g.limited(budget), budget)
    return {"edges": edges,
            "feasible": True, "tokens_per_s_per_device": float(tps[i]), "tpot_s": float(c["tpot"][i]),
            "batch": float(c["batch"][i]), "devices": float(c["devices"][i]),
            "config": {k: float(c[k][i]) for k in keys},
            "grid_edge": bool(c["devices"][i] >= max(g.sizes) or c["batch"][i] >= max(g.batches)),
            "candidates": int(len(tps)), "tpot_batch1_s": float(c["tpot"][j]), "batch1": float(c["batch"][j])}


def measured_device(device, precision: str) -> dict:
    """The device dict of ``device`` (a name or a :func:`.devices.device` dict) priced by its measured
    kernel tables (:mod:`analysis.measured`; the roofline where they have no entry)."""
    d = devices.device(device, precision) if isinstance(device, str) else dict(device)
    return {**d, "backend": M.device(d["name"], Precision.named(precision))["backend"]}


def decode_throughput(model, device: str, mode: str, *, context: float = 4096.0, tpot_slo_s: float = 0.05,
                      precision: str = "fp8", budget: int = VALIDATION_BUDGET, eff: Efficiency = Efficiency(),
                      grid: S.Grid | None = None, backend: str = "roofline") -> dict:
    """:func:`best_decode` in a production report's setting: mean context ``context`` (prompts of
    ``context - OUT_TOKENS / 2`` tokens, ``OUT_TOKENS`` output tokens), ``precision`` (FP8 by
    default), the validation grid (:func:`validation_grid`), operators priced by ``backend``
    (``"roofline"``, or ``"measured"``: :func:`measured_device`). Returns the throughput (tokens/s per
    device, NaN if nothing meets the SLO), the TPOT (s), the chosen configuration and its grid ``edges``."""
    if mode not in ("D", "AFD"):
        raise S.SearchError(f"mode must be 'D' or 'AFD', got {mode!r}")
    if backend not in ("roofline", "measured"):
        raise S.SearchError(f"backend must be 'roofline' or 'measured', got {backend!r}")
    if backend == "measured":
        device = measured_device(device, precision)
    wl = S.Workload(max(1.0, context - OUT_TOKENS / 2), OUT_TOKENS)
    r = best_decode(model, device, mode, wl, tpot_slo_s=tpot_slo_s, prec=Precision.named(precision), eff=eff,
                    grid=grid or validation_grid(budget), budget=budget)
    keys = ("tokens_per_s_per_device", "tpot_s", "config", "grid_edge", "edges", "candidates")
    return {k: r[k] for k in keys if k in r}



def afd_gain(model, setting: dict, *, tpot_slo_s: float, eff: Efficiency = Efficiency(),
             backend: str = "roofline", baseline_gpus: int | None = None) -> tuple[float, dict]:
    """MegaScale-Infer's cell: (AFD's decode tokens/s per GPU over plain EP decode's, {mode: result})
    for ``model`` in ``setting`` (``data/claims.yaml``, ``ch3_val_megascale``): BF16 on its ``gpu``,
    decode context = input + half the output, AFD on up to ``gpus`` GPUs and EP decode on
    ``baseline_gpus`` (the setting's, or the one given: a sensitivity end)."""
    ctx = float(setting["input_tokens"]) + float(setting["output_tokens"]) / 2
    gpus = {"AFD": int(setting["gpus"]),
            "D": int(setting["baseline_gpus"] if baseline_gpus is None else baseline_gpus)}
    r = {m: decode_throughput(model, setting["gpu"], m, precision="bf16", budget=gpus[m], context=ctx,
                              tpot_slo_s=tpot_slo_s, eff=eff, backend=backend) for m in ("D", "AFD")}
    return r["AFD"]["tokens_per_s_per_device"] / r["D"]["tokens_per_s_per_device"], r

# MegaScale-Infer's baselines as its section 7.1 describes them: "They primarily rely on tensor
# parallelism for distributed LLM serving, with TensorRT-LLM additionally supporting expert parallelism
# for expert layers"; the techniques it lists for them are FlashAttention, PagedAttention and continuous
# batching, not the two-micro-batch overlap DeepSeek described later (2025-03). So: attention
# tensor-parallel over the whole node, experts spread over it, one micro-batch. A diagnosis (revalidate)
# and a declared sensitivity of ch3_val_megascale, not its declared baseline.
def ms_paper_baseline(model, setting: dict, *, tpot_slo_s: float, eff: Efficiency = Efficiency(),
                      backend: str = "roofline") -> dict:
    """MegaScale-Infer's EP-decode baseline priced as the paper describes TensorRT-LLM: tensor
    parallelism over the ``baseline_gpus`` of ``setting`` (one node), experts spread across it, no
    micro-batch overlap (:func:`decode_throughput`'s result)."""
    gpus = int(setting["baseline_gpus"])
    ctx = float(setting["input_tokens"]) + float(setting["output_tokens"]) / 2
    grid = replace(validation_grid(gpus), tps=(gpus,), overlaps=(1,))
    return decode_throughput(model, setting["gpu"], "D", precision="bf16", budget=gpus, context=ctx,
                             tpot_slo_s=tpot_slo_s, eff=eff, backend=backend, grid=grid)


# --- DistServe (OSDI'24, arXiv 2401.09670): chatbot, OPT-13B, A100-SXM4-80GB, FP16, Poisson arrivals ---
DISTSERVE_SLO = S.SLO(ttft_s=0.25, tpot_s=0.1)  # Table 1 / section 6.1, chatbot OPT-13B
ATTAINMENT = 0.90                               # goodput: the highest rate meeting both SLOs for 90%
# ShareGPT mean lengths as the vLLM paper (SOSP'23, Figure 11) prints them: DistServe samples ShareGPT
# too but prints only the distribution (its Figure 7), so these means are an estimate of its sample.
SHAREGPT_MEAN_LENGTHS = (161.31, 337.99)
# ... and the per-request lengths behind them: the vLLM paper's artifact (data registry
# ``sharegpt_opt_lengths``), requests whose prompt plus output fit OPT's 2,048-token context (their
# means are SHAREGPT_MEAN_LENGTHS). The book and CI read a seeded sample of it committed with its
# provenance (results/sharegpt_lengths/, :mod:`.sharegpt`, ``make sharegpt-lengths``), never the file.
# DistServe samples ShareGPT for its chatbot workload with OPT models; its own sample is not published,
# so this distribution stands for it.


def sharegpt_lengths(n: int, *, max_context: float = 2048.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (input, output) token-length pairs of ShareGPT conversations (first rounds, OPT tokenizer),
    drawn with ``seed`` without replacement from the committed sample's pairs whose prompt and output
    fit ``max_context`` tokens together (:func:`.sharegpt.lengths`; the sample's means are close to
    :data:`SHAREGPT_MEAN_LENGTHS`)."""
    return sharegpt.lengths(n, max_context=max_context, seed=seed)


def goodput(plan, model, wl, slo, *, budget: int, chunked: bool = True, n_requests: int = 600, seed: int = 0,
            prec: Precision = Precision(), eff: Efficiency = Efficiency(), grid: S.Grid | None = None,
            target: float = ATTAINMENT, iters: int = 10) -> dict:
    """DistServe's goodput of ``plan``: the highest Poisson arrival rate (requests/s) at which at least
    ``target`` of the requests meet both SLOs in the event simulation (:func:`.des.simulate`, seeded),
    found by bisection over the rate (attainment falls with the rate); per device of the plan's whole
    instances. Returns the rate, the rate per device, the devices and the attainment at that rate."""
    g = grid or S.Grid()
    counts = des.instance_counts(plan, budget)
    used = sum(counts[u["unit"]] * u["devices"] for u in plan.units)

    def att(rate):
        return des.simulate(plan, model, wl, budget=budget, rate=rate, n_requests=n_requests, seed=seed,
                            slo=slo, prec=prec, eff=eff, grid=g, instances=counts, chunked=chunked).attainment

    lo, hi = 0.0, 1.0
    while att(hi) >= target and hi < 1e4:  # bracket: double until the target fails
        lo, hi = hi, hi * 2
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if att(mid) >= target else (lo, mid)
    return {"rate": lo, "rate_per_device": lo / used, "devices": used, "instances": counts,
            "attainment": att(lo) if lo > 0 else float("nan")}


@S.keeps_edges
def distserve_gain(model="OPT-13B", device="A100-SXM4-80GB", *, budget: int = 8, precision: str = "bf16",
                   eff: Efficiency = Efficiency(), n_requests: int = 600, seed: int = 0,
                   lengths: str = "sharegpt") -> dict:
    """DistServe's chatbot cell: goodput per GPU of the best PD plan (the analytic screen's best within
    ``budget`` GPUs at the ShareGPT means, replayed with whole instances) over vLLM's colocated serving
    as DistServe ran it (one GPU, tensor parallel 1, no chunked prefill: whole prompts pause decoding),
    both at :data:`DISTSERVE_SLO`, Poisson arrivals. The replay's requests carry ShareGPT's per-request
    lengths (``lengths="sharegpt"``: :func:`sharegpt_lengths`, ``n_requests`` pairs drawn with
    ``seed``, so the tail of long prompts stalls the colocated engine) or every request the means
    (``lengths="means"``, the cell before issue 27). With per-request lengths the PD plan is chosen as
    DistServe's placement search chooses it, by simulated goodput on the lengths: the screen's best
    plan at the means and its best at each tensor-parallel degree are replayed and the best kept
    (``PD_candidates`` lists them; a plan sized for the mean prompt misses the TTFT SLO on the long
    ones even unloaded). FP16 as DistServe ran it is priced as ``bf16`` (the same bytes and
    tensor-core rate on Ampere). ``edges``: the grid edges of the kept PD plan and the vLLM plan (their
    warnings are kept out of the page, :func:`.search.edges_kept`)."""
    if lengths not in ("sharegpt", "means"):
        raise ValueError(f"lengths must be 'sharegpt' or 'means', got {lengths!r}")
    per_req = None
    if lengths == "sharegpt":
        per_req = sharegpt_lengths(n_requests, max_context=float(specs.model(model).max_context), seed=seed)
    wl = S.Workload(*SHAREGPT_MEAN_LENGTHS, lengths=per_req)
    prec = Precision.named(precision)
    hw = S.default_hardware(device)
    tps = (1, 2, 4, 8)
    g = S.Grid(tps=tps, sizes=S._p2(1, budget))
    # PD candidates: the screen's best at the means; with per-request lengths also its best at each
    # tensor-parallel degree, the one kept being the best replayed goodput (DistServe's placement search
    # simulates each parallel configuration on the workload's length distribution, its section 4)
    cands = [(g, S.best_plan("PD", model, wl, DISTSERVE_SLO, hw, budget=budget, prec=prec, eff=eff, grid=g))]
    if per_req is not None:
        for t in tps:
            gt = S.Grid(tps=(t,), sizes=S._p2(1, budget))
            plan = S.best_plan("PD", model, wl, DISTSERVE_SLO, hw, budget=budget, prec=prec, eff=eff, grid=gt)
            cands.append((gt, plan))
    g1 = S.Grid(tps=(1,), sizes=(1,))
    c_plan = S.best_plan("C", model, wl, DISTSERVE_SLO, hw, budget=1, prec=prec, eff=eff, grid=g1)
    out, seen, tried = {}, set(), []
    for gg, plan in cands:
        key = repr([(u["unit"], u["size"], u["tp"]) for u in plan.units]) if plan.feasible else None
        if not plan.feasible or key in seen:
            continue
        seen.add(key)
        r = goodput(plan, model, wl, DISTSERVE_SLO, budget=budget, chunked=True, n_requests=n_requests,
                    seed=seed, prec=prec, eff=eff, grid=gg)
        r["plan"] = key
        r["edges"] = list(plan.edges)
        tried.append(r)
    out["PD"] = (max(tried, key=lambda r: r["rate_per_device"]) if tried else
                 {"rate_per_device": float("nan"), "reason": cands[0][1].reason})
    out["PD_candidates"] = [(r["plan"], r["rate_per_device"]) for r in tried]
    out["vLLM"] = (goodput(c_plan, model, wl, DISTSERVE_SLO, budget=1, chunked=False, n_requests=n_requests,
                           seed=seed, prec=prec, eff=eff, grid=g1) if c_plan.feasible else
                   {"rate_per_device": float("nan"), "reason": c_plan.reason})
    out["gain"] = out["PD"]["rate_per_device"] / out["vLLM"]["rate_per_device"]
    # the grid edges of the two plans compared (recorded, not warned: :func:`.search.edges_kept`)
    out["edges"] = list(out["PD"].get("edges", [])) + (list(c_plan.edges) if c_plan.feasible else [])
    out["lengths"] = lengths
    return out
