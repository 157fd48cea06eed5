"""The chapter's experiments, each a pure function of its parameters (cached on disk by the chapter):
the ratio sweep on GPUs and NPU design points, the attention-vs-FFN ablation, Pareto fronts,
the Mooncake-trace workload and the validation against measured runs."""
from __future__ import annotations

import json
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from .. import claims, data, specs
from .. import forward as costs
from .. import measured as M
from ..forward import Efficiency, Precision
from ..traces import load_trace
from . import des, devices
from . import production as P
from . import search as S
from . import validate as V

DISAGG_MODES = ("PD", "AF", "3-way", "PDAF")

PAPER_MODELS = ["Llama-3.1-405B", "Qwen3-235B-A22B", "GLM-4.6", "DeepSeek-V3", "Llama-4-Scout",
                "Llama-4-Maverick", "gpt-oss-120b"]
# the paper's DeepSeek V4 Pro/Flash have no public configuration in data/models.csv; DeepSeek-V3
# (MLA + fine-grained MoE, the V4 family's predecessor) is the closest configuration the book has


def slo_for(input_tokens, ttft_slo_s, ttft_slo_s_per_1k_input, tpot_slo_s) -> S.SLO:
    """TTFT SLO grows with the prompt (a fixed part + a per-1k-input-token part); TPOT SLO fixed."""
    return S.SLO(ttft_slo_s + ttft_slo_s_per_1k_input * input_tokens / 1000.0, tpot_slo_s)


OVERLAPS = (1, 2)  # the chapter searches communication/compute overlap with two micro-batches


def gpu_grid(af_over_scaleup=True) -> S.Grid:
    """The chapter's grid on GPUs: the default grid plus two-micro-batch overlap in C, P and D."""
    return S.Grid(af_over_scaleup=af_over_scaleup, overlaps=OVERLAPS)


def npu_grid(af_over_scaleup=True) -> S.Grid:
    """A coarser grid for searches over device *types* (each A/F unit tries every pair of design
    points, so the configuration grid is thinned to keep the chapter within its time budget); the
    prefill utilisation reaches the GPU grid's cap, 0.95."""
    return S.Grid(sizes=(1, 2, 4, 8, 16, 32), batches=(1, 4, 16, 64, 256, 1024, 4096),
                  chunks=(1024, 4096, 16384), prefill_batches=(1, 4, 16), utilisations=(0.6, 0.85, 0.95),
                  microbatches=(1, 2), af_over_scaleup=af_over_scaleup, overlaps=OVERLAPS)


BACKENDS = ("roofline", "measured")


def measured_hardware(hardware: dict, precision: str) -> dict:
    """``hardware`` (role -> device list) with every GPU that has AIConfigurator kernel tables
    (:data:`analysis.measured.DEVICE_TABLES`) replaced by its measured device dict
    (:func:`.production.measured_device`); other devices (NPU design points, GPUs without tables) stay
    names, priced by the roofline (their measured share is 0)."""
    def one(d):
        name = d["name"] if isinstance(d, dict) else d
        return P.measured_device(d, precision) if name in M.DEVICE_TABLES else d
    return {r: [one(d) for d in lst] for r, lst in hardware.items()}


def _check_backend(backend):
    if backend not in BACKENDS:
        raise S.SearchError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def hardware_sets(gpus, npu_points, role_hardware=None) -> dict:
    """Named hardware assignments: one per GPU (every role on it), one where every role picks among
    the NPU design points, and optionally a custom per-role assignment."""
    out = {g: S.default_hardware(g) for g in gpus}
    if npu_points:
        out["NPU design points"] = S.default_hardware(list(npu_points))
    if role_hardware:
        base = S.default_hardware(gpus[0] if gpus else list(npu_points))
        for r, v in role_hardware.items():
            if r not in S.ROLES:
                raise S.SearchError(f"role_hardware: unknown role {r!r}; roles: {', '.join(S.ROLES)}")
            base[r] = [v] if isinstance(v, str) else list(v)
        out["custom roles"] = base
    return out


def attention_share(model, input_tokens, output_tokens, device="H100-SXM5-80GB", precision="fp8",
                    batch=64, tp=8) -> float:
    """Share of a colocated decode step spent in attention (projections + core + KV reads) at a fixed
    reference configuration (``tp`` devices, ``batch`` sequences, mean context ``I + O/2``): the
    book's measure of how attention-dense a model/workload is."""
    s = costs.shape(model)
    prec = Precision.named(precision)
    eff = Efficiency()
    dev = devices.device(device, prec.compute)
    ta, tf, _ = costs.forward_parts(s, prec, eff, dev, dev, tp=float(tp), dp=1.0, n_ffn=float(tp),
                                    dec_seqs=float(batch), dec_ctx=input_tokens + output_tokens / 2)
    return float(ta / (ta + tf))


def _plan_row(p: S.Plan):
    keep = ("unit", "size", "tp", "n_a", "n_f", "batch", "pbatch", "chunk", "m", "ovl", "rho", "hw", "hw_a",
            "hw_f", "device_share", "devices", "instances")
    units = [{k: v for k, v in u.items() if k in keep} for u in p.units]
    return {"feasible": p.feasible, "reason": p.reason, "tps_device": p.tokens_per_s_per_device,
            "tps_kusd": p.tokens_per_s_per_kusd, "ttft_s": p.ttft_s, "tpot_s": p.tpot_s,
            "measured_share": p.measured_share,
            "units": json.dumps(units, default=float), "candidates": p.candidates, "edges": ",".join(p.edges)}


@S.keeps_edges
def run_cell(model, hw_name, hardware, wl, slo, *, budget, precision, objective, grid, enforce_context,
             eff=Efficiency(), price_models=None, whole=(), modes=S.MODES):
    """Best plan of every mode for one model, hardware set and workload (rows of the sweep).
    ``price_models``: optional ``{hardware-set name: {device: USD}}``; the candidates are priced once
    and re-priced per model (:func:`.search.reprice`), one set of rows per name (objective dollar);
    names in ``whole`` are searched with whole instances instead of rate-matched pools; ``modes``: the
    modes of a GPU cell (all by default)."""
    rows = []
    name = model if isinstance(model, str) else model.name
    kw = dict(budget=budget, prec=Precision.named(precision), eff=eff, grid=grid,
              enforce_context=enforce_context)
    if price_models:
        s = costs.shape(model)
        memo, cands = {}, {}
        if not (enforce_context and wl.input_tokens + wl.output_tokens > s.max_context):
            for mode in S.MODES:
                cands[mode] = S.mode_candidates(mode, s, wl, hardware, budget=budget, prec=kw["prec"],
                                                eff=eff, grid=grid, _memo=memo)
        repriced = {}  # a unit shared by modes (and a price model shared by sets) is repriced once

        def reprice(c, prices):
            k = (id(c), tuple(sorted(prices.items())))
            if k not in repriced:
                repriced[k] = S.reprice(c, prices)
            return repriced[k]
        for set_name, prices in price_models.items():
            for mode in S.MODES:
                cc = [reprice(c, prices) for c in cands[mode]] if mode in cands else None
                p = S.best_plan(mode, s, wl, slo, hardware, objective="dollar", _cands=cc,
                                whole_instances=set_name in whole, **kw)
                rows.append({"model": name, "hardware": set_name, "input_tokens": wl.input_tokens,
                             "output_tokens": wl.output_tokens, "mode": mode, "objective": "dollar",
                             **_plan_row(p)})
        return rows
    plans = S.best_plans(model, wl, slo, hardware, modes=modes, objective=objective, **kw)
    for mode, p in plans.items():
        rows.append({"model": name, "hardware": hw_name, "input_tokens": wl.input_tokens,
                     "output_tokens": wl.output_tokens, "mode": mode, "objective": objective, **_plan_row(p)})
    return rows


NPU_SET = "NPU design points"
PRICE_SET_NAMES = {"linear": NPU_SET, "power-law": f"{NPU_SET} (power-law prices)",
                   "gpu-fit": f"{NPU_SET} (GPU-fit prices)"}
WHOLE_SET = f"{NPU_SET} (whole instances)"  # listed prices, whole instances within the budget


def npu_price_models(npu_points) -> dict:
    """Hardware-set name -> prices of the NPU design points under each price model."""
    out = {PRICE_SET_NAMES[m]: {k: v for k, v in devices.npu_prices(m).items() if k in npu_points}
           for m in devices.PRICE_MODELS}
    out[WHOLE_SET] = out[NPU_SET]
    return out


def ratio_sweep(models, gpus, npu_points, ratios, output_tokens, *, ttft_slo_s, ttft_slo_s_per_1k_input,
                tpot_slo_s, budget, precision, af_over_scaleup, enforce_context, role_hardware=None,
                jobs=2, eff: Efficiency = Efficiency(), backend: str = "roofline") -> pd.DataFrame:
    """Best plan of every mode for every model x hardware set x input/output ratio. GPUs are compared
    per device; the NPU set (roles choose their design point) per dollar of estimated device price.
    ``eff``: the efficiencies every cell is priced with (default: the stated ones); ``backend``:
    ``"roofline"`` or ``"measured"`` (the GPUs' operators from their kernel tables,
    :func:`measured_hardware`; the roofline at ``eff`` for what the tables lack). Each row carries its
    plan's ``measured_share``."""
    _check_backend(backend)
    sets = hardware_sets(gpus, npu_points, role_hardware)
    if backend == "measured":
        sets = {k: measured_hardware(v, precision) for k, v in sets.items()}
    tasks = []
    for hw_name, hw in sets.items():
        npu = hw_name == "NPU design points"
        grid = npu_grid(af_over_scaleup) if npu else gpu_grid(af_over_scaleup)
        for model in models:
            for r in ratios:
                wl = S.Workload(max(1.0, round(r * output_tokens)), output_tokens)
                slo = slo_for(wl.input_tokens, ttft_slo_s, ttft_slo_s_per_1k_input, tpot_slo_s)
                tasks.append(((model, hw_name, hw, wl, slo),
                              dict(budget=budget, precision=precision,
                                   objective="dollar" if npu else "device", grid=grid,
                                   enforce_context=enforce_context,
                                   price_models=npu_price_models(npu_points) if npu else None,
                                   whole=(WHOLE_SET,), eff=eff), r))
    rows = []
    for (args, kw, r), cell in zip(tasks, warm_cells([(a, k) for a, k, _ in tasks], jobs)):
        for row in cell:
            row["ratio"] = r
            rows.append(row)
    df = pd.DataFrame(rows)
    return add_speedup(df, ["model", "hardware", "ratio"])


def warm_cells(tasks, jobs):
    """``[run_cell_task(t) for t in tasks]`` (:func:`parallel_map`), where one task of every measured
    hardware set runs first in this process: its kernel tables are read (and the interpolation
    compiled) once, before the workers fork, instead of once in every worker. The task warmed is the
    set's first on a MoE model (the MoE tables too), else its first; each task still runs once."""
    first = {}
    for i, (args, _) in enumerate(tasks):
        hw = args[2]
        if not any(isinstance(d, dict) and str(d.get("backend", "")).startswith("measured")
                   for lst in hw.values() for d in lst):
            continue
        moe = specs.model(args[0]).is_moe if isinstance(args[0], str) else False
        if args[1] not in first or (moe and not first[args[1]][1]):
            first[args[1]] = (i, moe)
    done = {i: run_cell_task(tasks[i]) for i, _ in first.values()}
    rest = [i for i in range(len(tasks)) if i not in done]
    out = dict(zip(rest, parallel_map(run_cell_task, [tasks[i] for i in rest], jobs)))
    return [done[i] if i in done else out[i] for i in range(len(tasks))]


def run_cell_task(task):
    """``run_cell(*args, **kw)`` for ``task = (args, kw)`` (picklable for a process pool)."""
    args, kw = task
    return run_cell(*args, **kw)


def parallel_map(fn, items, jobs):
    """``map`` over a process pool of ``jobs`` workers (order kept; serial when jobs <= 1)."""
    if jobs <= 1 or len(items) < 2:
        return [fn(x) for x in items]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("fork")) as ex:
        return list(ex.map(fn, items, chunksize=1))


def add_speedup(df, keys):
    """Speedup of each mode over the colocated plan of the same cell (per device on GPUs, per
    dollar on NPU design points); NaN where either is infeasible."""
    df = df.copy()
    df["metric"] = np.where(df["objective"] == "dollar", df["tps_kusd"], df["tps_device"])
    base = df[df["mode"] == "C"].set_index(keys)["metric"]
    df["speedup"] = df["metric"].to_numpy() / base.reindex(pd.MultiIndex.from_frame(df[keys])).to_numpy()
    return df


def ablation(base_model, ratios, output_tokens, *, gpu, ttft_slo_s, ttft_slo_s_per_1k_input, tpot_slo_s,
             budget, precision, af_over_scaleup, eff: Efficiency | None = None,
             backend: str = "roofline") -> pd.DataFrame:
    """Attention-vs-FFN intensity ablation on one architecture: routed experts per token (FFN
    density) and KV heads (attention density, up to MHA), across input/output ratios, every cell priced
    at the efficiencies ``eff`` (None: the stated ones) by ``backend`` (``"measured"``: the GPU's kernel
    tables, :func:`measured_hardware`)."""
    _check_backend(backend)
    m = specs.model(base_model)
    variants = []
    if m.is_moe:
        for k in sorted({1, 2, 4, 8, 16, 32, m.moe_active}):
            if k <= m.moe_experts:
                variants.append(("active experts", k, m.replace(name=f"{m.name} k={k}", moe_active=k)))
    for kvh in sorted({1, 4, 16, m.n_kv_heads, m.n_heads}):
        if m.n_heads % kvh == 0 and m.attention != "mla":
            att = "mha" if kvh == m.n_heads else "gqa"
            variants.append(("KV heads", kvh, m.replace(name=f"{m.name} kv={kvh}", n_kv_heads=kvh,
                                                        attention=att)))
    kw = {} if eff is None else {"eff": eff}
    rows = []
    hw = S.default_hardware(gpu)
    hw = measured_hardware(hw, precision) if backend == "measured" else hw
    for axis, val, spec in variants:
        for r in ratios:
            wl = S.Workload(max(1.0, round(r * output_tokens)), output_tokens)
            slo = slo_for(wl.input_tokens, ttft_slo_s, ttft_slo_s_per_1k_input, tpot_slo_s)
            share = attention_share(spec, wl.input_tokens, wl.output_tokens, gpu, precision)
            for row in run_cell(spec, gpu, hw, wl, slo, budget=budget, precision=precision,
                                objective="device", grid=gpu_grid(af_over_scaleup), enforce_context=False,
                                **kw):
                row.update(axis=axis, value=val, ratio=r, attention_share=share)
                rows.append(row)
    return add_speedup(pd.DataFrame(rows), ["model", "ratio"])


@S.keeps_edges
def pareto_fronts(model, ratio, output_tokens, *, hardware_name, hardware, tpot_grid, ttft_slo_s,
                  ttft_slo_s_per_1k_input, budget, precision, af_over_scaleup,
                  eff: Efficiency = Efficiency()) -> pd.DataFrame:
    """Best throughput per device of every mode at each TPOT SLO of ``tpot_grid`` (priced at ``eff``), with
    each plan's grid edges (``edges``, comma-joined; no warning per plan)."""
    wl = S.Workload(max(1.0, round(ratio * output_tokens)), output_tokens)
    ttft = slo_for(wl.input_tokens, ttft_slo_s, ttft_slo_s_per_1k_input, 1.0).ttft_s
    rows = []
    for mode in S.MODES:
        tps, edges = S.pareto(mode, model, wl, ttft, tpot_grid, hardware, budget=budget,
                              prec=Precision.named(precision), grid=gpu_grid(af_over_scaleup),
                              enforce_context=False, eff=eff, with_edges=True)
        rows += [{"mode": mode, "tpot_slo_s": t, "tps_device": v, "edges": ",".join(e)}
                 for t, v, e in zip(tpot_grid, tps, edges)]
    return pd.DataFrame(rows)


def mooncake_workload():
    """Mean input and output lengths of the Mooncake conversation trace (chapter 2's reader) and its
    prefix-hit share with an unbounded cache (input blocks seen before / all input blocks; the trace's
    block hashes chain a block to its prefix, so a seen block means a cached prefix)."""
    t = load_trace("mooncake_conversation")
    sm = t.summary()
    return {"input_tokens": float(np.mean(t.input_tokens)), "output_tokens": float(np.mean(t.output_tokens)),
            "requests": int(t.n_requests), "input_p90": float(np.percentile(t.input_tokens, 90)),
            "prefix_hit": 1.0 - sm["unique_blocks"] / sm["blocks"]}


GPU_MIX = "GPUs mixed per role (per dollar)"


def mooncake_cells(workload, models, gpus, npu_points, role_hardware, *, ttft_slo_s, ttft_slo_s_per_1k_input,
                   tpot_slo_s, budget, precision, af_over_scaleup, enforce_context, jobs=2,
                   eff: Efficiency = Efficiency()) -> pd.DataFrame:
    """Best plan of every mode at the Mooncake trace's mean lengths (``workload``: dict with
    ``input_tokens`` and ``output_tokens``), for every model x hardware set, with speedups; with two
    GPUs or more also heterogeneous pairs (every role picks its GPU, per dollar, :data:`GPU_MIX`);
    every cell priced at ``eff``."""
    sets = hardware_sets(gpus, npu_points, role_hardware or None)
    if len(gpus) > 1:  # heterogeneous pairs: each role picks its GPU, compared per dollar
        sets[GPU_MIX] = S.default_hardware(list(gpus))
    wl = S.Workload(round(workload["input_tokens"]), round(workload["output_tokens"]))
    slo = slo_for(wl.input_tokens, ttft_slo_s, ttft_slo_s_per_1k_input, tpot_slo_s)
    tasks = []
    for hw_name, hw in sets.items():
        npu = hw_name in ("NPU design points", GPU_MIX)
        grid = npu_grid(af_over_scaleup) if npu else gpu_grid(af_over_scaleup)
        for m in models:
            tasks.append(((m, hw_name, hw, wl, slo),
                          dict(budget=budget, precision=precision, objective="dollar" if npu else "device",
                               grid=grid, enforce_context=enforce_context, eff=eff)))
    h = float(workload.get("prefix_hit", 0.0))
    if h > 0 and gpus:  # the same on the first GPU with the trace's prefix hits loaded over the NIC
        g0 = gpus[0]
        wl_h = S.Workload(wl.input_tokens, wl.output_tokens, prefix_hit=h, hit_bw=devices.device(g0)["net"])
        for m in models:
            tasks.append(((m, f"{g0} + prefix hits", S.default_hardware(g0), wl_h, slo),
                          dict(budget=budget, precision=precision, objective="device",
                               grid=gpu_grid(af_over_scaleup), enforce_context=enforce_context, eff=eff)))
    cells = parallel_map(run_cell_task, tasks, jobs)
    return add_speedup(pd.DataFrame([row for cell in cells for row in cell]), ["model", "hardware"])


@S.keeps_edges
def production_cells(device="H800-SXM5-80GB", budget=256,
                     eff_calibrated: Efficiency | None = None) -> pd.DataFrame:
    """The validation cells against StepFun's Step-3 report (see :mod:`.production`): simulated
    decode tokens/s per GPU of Step-3 with AFD and with plain EP decode, and of DeepSeek-V3 with EP
    decode, next to the published figures. With ``eff_calibrated`` each cell is computed with the
    stated default efficiencies (``raw``) and the calibrated ones side by side; the error uses the
    calibrated figure (the raw one otherwise). The verdicts are :func:`analysis.claims.evaluate`'s
    (:func:`.chapter.production_verdicts`)."""
    rows = []
    for model, mode, key in [("Step-3", "AFD", "stepfun_step3_afd_tps_per_gpu"),
                             ("DeepSeek-V3", "D", "stepfun_dsv3_tps_per_gpu"),
                             ("Step-3", "D", None)]:
        raw = P.decode_throughput(model, device, mode, budget=budget)
        r = (P.decode_throughput(model, device, mode, budget=budget, eff=eff_calibrated) if eff_calibrated
             else raw)
        pub = data.published(key)["value"] if key else float("nan")
        sim = r["tokens_per_s_per_device"]
        rows.append({"model": model, "mode": mode, "raw": raw["tokens_per_s_per_device"], "simulated": sim,
                     "published": pub, "error": sim / pub - 1 if key else float("nan"),
                     "tpot_ms": r["tpot_s"] * 1e3, "config": json.dumps(r["config"], default=float),
                     "grid_edge": r.get("grid_edge", False), "edges": ",".join(r.get("edges", []))})
    return pd.DataFrame(rows)


# Single-effect changes on the expert-parallel side, each stated before it is computed; none is adopted
# by the model (none is established for these deployments): the table shows how large a missing effect
# would have to be to close the DeepSeek-V3 gap or flip the Step-3 ordering.
EP_SENSITIVITY = (
    ("as modelled", {}, None),
    ("MoE load imbalance 1.5", {"moe_imbalance": 1.5}, None),
    ("MoE load imbalance 2.0", {"moe_imbalance": 2.0}, None),
    ("links at 50% of peak", {"link": 0.5}, None),
    ("links at 35% of peak", {"link": 0.35}, None),
    ("memory reserve 20%", {"mem_reserve": 0.2}, None),
    ("memory reserve 30%", {"mem_reserve": 0.3}, None),
    ("memory reserve 50%", {"mem_reserve": 0.5}, None),
    ("no two-micro-batch overlap", {}, (1,)),
    # the overlap before issue 27 (Efficiency.overlap is now an estimate below 1)
    ("perfect two-micro-batch overlap", {"overlap": 1.0}, None),
    # DeepEP's low-latency kernels (DeepSeek's decode) send every token over RDMA, none over NVLink
    ("all-to-all over the NICs only", {}, "no-domain"),
)


@S.keeps_edges
def production_sensitivity(device="H800-SXM5-80GB", budget=256,
                           eff: Efficiency | None = None) -> pd.DataFrame:
    """The StepFun cells (Step-3 AFD, DeepSeek-V3 EP decode, Step-3 EP decode; tokens/s per GPU) under
    each single change of :data:`EP_SENSITIVITY` to ``eff`` (default: the stated efficiencies), the
    overlap choices or the scale-up domain (FP8 device numbers, as the cells run), with DeepSeek-V3's
    error against its published figure and whether AFD beats plain decode for Step-3 (and each cell's
    grid edges, ``<cell> edges``)."""
    base = eff or Efficiency()
    pub = data.published("stepfun_dsv3_tps_per_gpu")["value"]
    rows = []
    for name, kw, overlaps in EP_SENSITIVITY:
        e = base.replace(**kw)
        g = P.validation_grid(budget)
        dev = device
        if overlaps == "no-domain":  # a scale-up domain of one device: all traffic over the NICs
            dev = {**devices.device(device, "fp8"), "domain": 1.0}
        elif overlaps:
            g = replace(g, overlaps=overlaps)
        r = {f"{m} {md}": P.decode_throughput(m, dev, md, budget=budget, eff=e, grid=g)
             for m, md in (("Step-3", "AFD"), ("DeepSeek-V3", "D"), ("Step-3", "D"))}
        t = {k: v["tokens_per_s_per_device"] for k, v in r.items()}
        rows.append({"change": name, **t, "DeepSeek-V3 error": t["DeepSeek-V3 D"] / pub - 1,
                     "AFD above D": bool(t["Step-3 AFD"] > t["Step-3 D"]),
                     **{f"{k} edges": ",".join(v.get("edges", [])) for k, v in r.items()}})
    return pd.DataFrame(rows)


def pd_gain_sweep(models, gpus, ratios, output_tokens, *, ttft_slo_s, ttft_slo_s_per_1k_input, tpot_slo_s,
                  budget, precision, af_over_scaleup, enforce_context, eff: Efficiency = Efficiency(),
                  jobs=2, backend: str = "roofline") -> float:
    """Claim (a)'s value alone (the largest PD gain over colocated among the GPU cells, as
    :func:`claim_inputs` takes it from :func:`ratio_sweep`), searching only modes C and PD on the GPUs:
    what the chapter recomputes at the declared ends of the TPOT SLO (``backend`` as in
    :func:`ratio_sweep`)."""
    _check_backend(backend)
    tasks = []
    for g in gpus:
        hw = S.default_hardware(g)
        hw = measured_hardware(hw, precision) if backend == "measured" else hw
        for model in models:
            for r in ratios:
                wl = S.Workload(max(1.0, round(r * output_tokens)), output_tokens)
                slo = slo_for(wl.input_tokens, ttft_slo_s, ttft_slo_s_per_1k_input, tpot_slo_s)
                tasks.append(((model, g, hw, wl, slo),
                              dict(budget=budget, precision=precision, objective="device",
                                   grid=gpu_grid(af_over_scaleup), enforce_context=enforce_context, eff=eff,
                                   modes=("C", "PD")), r))
    rows = []
    for (_, _, r), cell in zip(tasks, warm_cells([(a_, k_) for a_, k_, _ in tasks], jobs)):
        for row in cell:
            row["ratio"] = r
            rows.append(row)
    df = add_speedup(pd.DataFrame(rows), ["model", "hardware", "ratio"])
    pdg = df[(df["mode"] == "PD") & np.isfinite(df["speedup"])]
    return float(pdg["speedup"].max() - 1) if len(pdg) else float("nan")


def claim_inputs(sweep: pd.DataFrame, gpus, output_tokens, precision, modes=None) -> dict:
    """The inputs of claims (a)-(c) from one ratio sweep (as the chapter derives them): the largest PD
    gain over colocated among the GPU cells, the NPU set's consistency ranking of the disaggregated
    modes, and the median within-ratio Spearman correlation of the best disaggregated speedup with the
    attention share (first GPU)."""
    modes = list(modes or DISAGG_MODES)
    gs = sweep[sweep["hardware"].isin(gpus)]
    pdg = gs[(gs["mode"] == "PD") & np.isfinite(gs["speedup"])]
    pd_gain = float(pdg["speedup"].max() - 1) if len(pdg) else float("nan")
    ns = sweep[sweep["hardware"] == NPU_SET]
    ranking = rank_modes(consistency(ns, modes)) if len(ns) else []
    g0 = sweep[sweep["hardware"] == gpus[0]]
    bd = best_disagg(g0, ["model", "ratio"]).reset_index()
    bd["attention_share"] = [attention_share(m, max(1.0, round(r * output_tokens)), output_tokens, gpus[0],
                                             precision) for m, r in zip(bd["model"], bd["ratio"])]
    return {"pd_gain": pd_gain, "ranking": ranking, "rho_sweep": float(within_ratio_rho(bd).median())}


@S.keeps_edges
def gain_cells(eff_calibrated: Efficiency | None = None, *,
               distserve_budget=8, n_requests=600) -> pd.DataFrame:
    """The validation cells that publish a gain rather than a throughput, raw (stated efficiencies) and
    calibrated side by side (the verdict judges the calibrated figure):

    * MegaScale-Infer (arXiv 2504.02263): best decode tokens/s per GPU with attention/FFN
      disaggregation over plain expert-parallel decode (:func:`.production.decode_throughput`, modes
      AFD and D) for each model of the setting declared in ``data/claims.yaml`` (``ch3_val_megascale``:
      Mixtral-8x22B and DBRX on A800 boards, BF16, the paper's median lengths and 150 ms TBT SLO; AFD on
      up to ``gpus`` GPUs, the EP-decode baseline on ``baseline_gpus``, one node, as the paper's
      baselines), also at the declared ends of the TBT SLO (``tbt_low``, ``tbt_high``, calibrated) and
      with the baseline on the sensitivity's other GPU count (``baseline_alt``, calibrated); one row per
      model, each against the published figure for the two models;
    * DistServe (arXiv 2401.09670): goodput per GPU of PD over vLLM-style colocated serving, OPT-13B
      chatbot on A100 at its SLOs, ShareGPT's per-request lengths (:func:`.production.distserve_gain`,
      the PD plan chosen by replayed goodput as DistServe's placement search does); the published figure is a
      range over three models.

    The verdicts are :func:`analysis.claims.evaluate`'s under the rules of ``data/claims.yaml``
    (:func:`.chapter.gain_verdicts`)."""
    effs = {"raw": Efficiency(), "simulated": eff_calibrated or Efficiency()}
    rows = []
    rule = claims.rule("ch3_val_megascale")
    st = rule["setting"]  # declared in data/claims.yaml from the paper's section 7.1 before computing
    ms_pub = data.published(rule["reference"]["published"])["value"]
    ctx = float(st["input_tokens"]) + float(st["output_tokens"]) / 2  # mean decode context
    sens = {s_["name"]: s_ for s_ in rule["sensitivity"]}
    tbt = sens["TBT SLO (s)"]
    (base_alt,) = sens["EP-decode baseline GPUs"]["alternatives"]
    gpus = {"AFD": int(st["gpus"]), "D": int(st["baseline_gpus"])}
    for model in st["model"]:
        row = {"cell": "MegaScale-Infer: AFD over EP decode", "model": model, "device": st["gpu"],
               "setting": f"context {ctx:g} (input {st['input_tokens']} + output {st['output_tokens']} / 2), "
                          f"TBT {float(st['tpot_slo_s']) * 1e3:g} ms; AFD on up to {gpus['AFD']} GPUs, "
                          f"EP decode on {gpus['D']}",
               "published": ms_pub, "published_text": f"{ms_pub:.2f}x (one figure, two models)"}

        def gain(eff, slo, baseline_gpus=None):
            return P.afd_gain(model, st, tpot_slo_s=slo, eff=eff, baseline_gpus=baseline_gpus)

        for col, eff in effs.items():
            row[col], r = gain(eff, float(st["tpot_slo_s"]))
            if col == "simulated":
                r_sim = r
                row["edges"] = ",".join(e for m in ("AFD", "D") for e in r[m].get("edges", []))
                row["detail"] = (f"AFD {r['AFD']['tokens_per_s_per_device']:,.0f} tok/s/GPU on "
                                 f"{r['AFD']['config'].get('devices', float('nan')):g} GPUs vs D "
                                 f"{r['D']['tokens_per_s_per_device']:,.0f} on "
                                 f"{r['D']['config'].get('devices', float('nan')):g}")
        row["tbt_low"] = gain(effs["simulated"], float(tbt["low"]))[0]
        row["tbt_high"] = gain(effs["simulated"], float(tbt["high"]))[0]
        row["baseline_alt"] = gain(effs["simulated"], float(st["tpot_slo_s"]), int(base_alt))[0]
        # the baseline as the paper describes TensorRT-LLM (the 'EP-decode baseline parallelism' sensitivity)
        paper = P.ms_paper_baseline(model, st, tpot_slo_s=float(st["tpot_slo_s"]), eff=effs["simulated"])
        row["baseline_paper"] = r_sim["AFD"]["tokens_per_s_per_device"] / paper["tokens_per_s_per_device"]
        row["error"] = row["simulated"] / ms_pub - 1
        rows.append(row)
    lo, hi = (data.published(f"distserve_chatbot_goodput_gain_{k}")["value"] for k in ("low", "high"))
    row = {"cell": "DistServe: PD goodput over vLLM", "model": "OPT-13B", "device": "A100-SXM4-80GB",
           "setting": "ShareGPT per-request lengths (vLLM artifact, seeded), TTFT 0.25 s, TPOT 0.1 s, "
                      "90% attainment",
           "published": float("nan"), "published_text": f"{lo:g}-{hi:g}x (three models)"}
    for col, eff in effs.items():
        r = P.distserve_gain(budget=distserve_budget, eff=eff, n_requests=n_requests)
        row[col] = r["gain"]
        if col == "simulated":
            row["edges"] = ",".join(r.get("edges", []))
            row["detail"] = (f"PD {r['PD']['rate_per_device']:.2f} req/s/GPU on {r['PD']['devices']:g} GPUs "
                             f"{r['PD']['instances']} vs vLLM {r['vLLM']['rate_per_device']:.2f}")
    row["error"] = (row["simulated"] / lo - 1 if row["simulated"] < lo else
                    row["simulated"] / hi - 1 if row["simulated"] > hi else 0.0)
    rows.append(row)
    return pd.DataFrame(rows)


def calibrated_efficiency(cal, system="h100_sxm", backend="trtllm") -> Efficiency:
    """The stated efficiencies with one GPU's fitted compute and bandwidth efficiency and one backend's
    step and per-layer overheads (:class:`.validate.Calibration`; the step overhead is not fitted, 0:
    :data:`.validate.DROPPED`)."""
    return Efficiency().replace(compute=float(cal.compute[system]), bandwidth=float(cal.bandwidth[system]),
                                step_overhead_s=float(cal.step_overhead_s[backend]),
                                layer_overhead_s=float(cal.layer_overhead_s[backend]))


def validation(max_nfev=40, backend: str = "roofline", sensitivities: bool = True):
    """Rows, the calibration fitted on the train split, and predictions (calibrated and not), with
    operators priced by ``backend`` (:func:`.validate.predict`: ``"roofline"`` or ``"measured"``).
    ``sensitivities=False`` leaves out the uncalibrated predictions and those of the PD runs with
    assumed worker counts (``None``), for a caller that reads only the calibrated ones."""
    rows = V.load_rows()
    cal = V.fit(rows, split="train", max_nfev=max_nfev, backend=backend)
    pred = V.predict(rows, cal, backend=backend)
    raw = V.predict(rows, V.Calibration(), backend=backend) if sensitivities else None
    assumed = (V.predict(V.load_rows(assume_workers=True), cal, backend=backend) if sensitivities
               else None)
    return {"rows": rows, "calibration": cal, "pred": pred, "uncalibrated": raw, "assumed_workers": assumed,
            "backend": backend}


NO_CHUNK = "C, no chunked prefill"  # the colocated baseline as vLLM ran it by default


@S.keeps_edges
def tail_rerank(model, gpu, *, k, load, ttft_slo_s, ttft_slo_s_per_1k_input, tpot_slo_s, budget, precision,
                af_over_scaleup, seed=0, eff: Efficiency = Efficiency()) -> pd.DataFrame:
    """Each mode's ``k`` best plans by the analytic screen on the Mooncake conversation trace (its
    length distribution and arrival times), replayed by the event simulation at ``load`` times each
    plan's capacity, run to steady state within the trace (warm-up discarded) and judged at the 90th
    percentile of TTFT and TPOT (:func:`.des.rerank`); the colocated plans are also replayed without
    chunked prefill (mode :data:`NO_CHUNK`)."""
    t = load_trace("mooncake_conversation")
    wl = S.Workload.from_lengths(t.input_tokens, t.output_tokens)
    slo = slo_for(wl.input_tokens, ttft_slo_s, ttft_slo_s_per_1k_input, tpot_slo_s)
    rows = []
    for mode, chunked in [(m, True) for m in S.MODES] + [("C", False)]:
        for r in des.rerank(mode, model, wl, slo, S.default_hardware(gpu), k=k, budget=budget, load=load,
                            trace_s=t.arrival_s, seed=seed, prec=Precision.named(precision), eff=eff,
                            grid=gpu_grid(af_over_scaleup), chunked=chunked, steady=True):
            p = r.pop("plan")
            rows.append({"mode": mode if chunked else NO_CHUNK,
                         **{k_: v for k_, v in r.items() if k_ != "instances"},
                         "instances": json.dumps(r.get("instances", {})), "ttft_s": p.ttft_s,
                         "tpot_s": p.tpot_s, "ttft_slo_s": slo.ttft_s, "tpot_slo_s": slo.tpot_s})
    return pd.DataFrame(rows)


def reranked_best(tail: pd.DataFrame) -> pd.DataFrame:
    """Per mode: the screen's best throughput per device (rate-matched pools) and, among the ``k``
    plans whose simulated 90th percentiles meet the SLOs, the best throughput per device their whole
    instances serve in the simulation (NaN if none does), each as a speedup over C's."""
    out = []
    for mode, d in tail.groupby("mode", sort=False):
        ok = d[d["feasible"] & d["meets_p90"].fillna(False).astype(bool)]
        out.append({"mode": mode, "screen": float(d["tps_device"].max()) if d["feasible"].any() else np.nan,
                    "simulated": float(ok["des_tps_device"].max()) if len(ok) else np.nan,
                    "plans_meeting_p90": int(len(ok)), "plans": int(d["feasible"].sum())})
    df = pd.DataFrame(out).set_index("mode")
    df["screen_speedup"] = df["screen"] / df.loc["C", "screen"] if "C" in df.index else np.nan
    df["simulated_speedup"] = df["simulated"] / df.loc["C", "simulated"] if "C" in df.index else np.nan
    return df


# ---------------------------------------------------------------------------------------------------
# Summaries of the sweep that the claims rank and correlate with (the verdicts are analysis.claims's)

def best_disagg(df: pd.DataFrame, keys) -> pd.Series:
    """Best speedup over colocated among the disaggregated modes, per group of ``keys``."""
    d = df[df["mode"] != "C"].dropna(subset=["speedup"])
    return d.groupby(keys)["speedup"].max().rename("best_disagg")


def spearman(x, y) -> float:
    """Spearman rank correlation; NaN with fewer than three points or a constant input."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def axis_rho(ab: pd.DataFrame, axis: str) -> float:
    """Rank correlation of the best disaggregated speedup with the varied value of one ablation axis."""
    d = ab[ab["axis"] == axis]
    return spearman(d["value"], d["best_disagg"]) if d["value"].nunique() > 2 else float("nan")


def consistency(ns: pd.DataFrame, modes=DISAGG_MODES) -> pd.DataFrame:
    """Per disaggregated mode over the NPU cells: share of cells above colocated, median, min, max."""
    nd = ns[(ns["mode"] != "C") & np.isfinite(ns["speedup"])]
    return nd.groupby("mode")["speedup"].agg(win_share=_win_share, median="median",
                                             minimum="min", maximum="max", cells="size").reindex(list(modes))


def _win_share(s: pd.Series) -> float:
    """Share of a mode's cells with a speedup above 1."""
    return float((s > 1).mean())


def rank_modes(consist: pd.DataFrame) -> list:
    """Modes from most to least consistent (share of wins, then the worst cell)."""
    return list(consist.sort_values(["win_share", "minimum"], ascending=False).index)


def within_ratio_rho(df: pd.DataFrame, x: str = "attention_share", y: str = "best_disagg") -> pd.Series:
    """Spearman correlation of ``x`` and ``y`` within each input/output ratio (the attention share and
    the speedup both grow with the prompt, so a correlation across ratios mostly restates that)."""
    return pd.Series({r: spearman(d[x], d[y]) for r, d in df.groupby("ratio")}, name="rho",
                     dtype=float).rename_axis("ratio")
