"""Issue 27 item 4: every production row against its target, by operator backend and overlap.

:func:`revalidation_table` prices every production validation row of chapter 3 with both operator
backends (``"roofline"``; ``"measured"``: AIConfigurator's kernel tables,
:func:`.production.measured_device`) at the declared two-micro-batch overlap
(``Efficiency().overlap``) and at perfect overlap, stated efficiencies otherwise: StepFun's Step-3 AFD
and DeepSeek-V3 EP decode cells (H800, FP8, 4K context, 50 ms TPOT, up to 256 GPUs), the ordering
StepFun measured (Step-3 AFD over DeepSeek-V3 EP decode) and the one it argues (Step-3 AFD over Step-3's
own plain EP decode, for which it publishes no figure: :data:`ARGUED`), MegaScale-Infer's AFD-over-EP
gain for its two models (the setting declared in ``data/claims.yaml``, ``ch3_val_megascale``) and
DistServe's PD goodput gain
(:func:`.production.distserve_gain`: ShareGPT's per-request lengths drawn with several seeds, and every
request at the mean lengths; the roofline at the declared overlap, as the chapter computes it). Each
row is judged against the issue's targets: a published ordering right; a value within :data:`TOL` of
its published figure (a published range: of the nearer end, 0 inside). :func:`revalidation_values`
words the table for the chapter; ``benchmarks/revalidate_production.py`` prints it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import claims, data
from .. import measured as M
from ..forward import LAYERWISE_OVERLAP, WEIGHT_FORMATS, Efficiency, shape
from . import production as P
from . import search as S
from . import validate as V

PD_TTFT_TARGET = 0.25  # the target: disaggregated TTFT median error on the held-out runs at most 25%
# Diagnosis threshold (stated before the count was taken): a measured TTFT above this share of the run's
# own decode cycle ((osl - 1) x measured TPOT) is far beyond a prefill pass in these runs (a prefill of
# one prompt takes a few percent of the cycle), so it is queueing the recorded configuration does not show.
SLOW_SHARE = 0.2
KV_OVERLAPS = (0.0, 0.5)  # the PD KV transfer's layer-wise overlap the size estimate prices
# the assumed overlap "carries" the error when pricing the transfer at KV_OVERLAPS moves the held-out median
# TTFT error by more than this (absolute, in error units)
KV_CARRY = 0.05
# an ordering a paper argues but does not measure (StepFun: AFD above Step-3's own EP decode, for which it
# publishes no figure): judged like an ordering, counted apart from the published ones
ARGUED = "argued ordering"
ORDER_KINDS = ("ordering", ARGUED)
# a row that prices a named candidate effect (not a declared cell): shown, judged, never counted with the rows
# of the targets
DIAGNOSIS = "diagnosis"
TOL = 0.25  # the band: every row within +-25% of its published figure, or the missing effect named
BACKENDS = ("roofline", "measured")
STEPFUN_CELLS = (("Step-3", "AFD"), ("DeepSeek-V3", "D"), ("Step-3", "D"))
COLUMNS = ["row", "kind", "backend", "overlap", "simulated", "published", "published_text", "error",
           "target_met", "edges", "requests"]


# MegaScale-Infer's Figure 8: each model's absolute per-GPU throughput of its baseline (TensorRT-LLM, EP
# decode) and of MegaScale-Infer (AFD), read from the bars (data/published.csv says how)
MS_BARS = {"D": ("megascale_infer_fig8_trtllm_tps_", "TensorRT-LLM"),
           "AFD": ("megascale_infer_fig8_msi_tps_", "MegaScale-Infer")}


def _published() -> dict:
    keys = ("stepfun_step3_afd_tps_per_gpu", "stepfun_dsv3_tps_per_gpu",
            "stepfun_step3_afd_8k_tps_per_gpu",
            "megascale_infer_gain_vs_trtllm_mixtral_dbrx", "distserve_chatbot_goodput_gain_low",
            "distserve_chatbot_goodput_gain_high")
    return {k: data.published(k)["value"] for k in keys}


def _ms_bar(mode: str, model: str) -> float:
    return data.published(MS_BARS[mode][0] + model.split("-")[0].lower())["value"]


def _band_error(sim: float, lo: float, hi: float) -> float:
    """Relative distance of ``sim`` from the published range [lo, hi] (0 inside)."""
    return sim / lo - 1 if sim < lo else sim / hi - 1 if sim > hi else 0.0


@S.keeps_edges
def revalidation_table(seeds: int = 3, n_requests: int = 600, backends=BACKENDS,
                       overlaps=None, device: str = "H800-SXM5-80GB", budget: int = 256,
                       distserve_budget: int = 8) -> pd.DataFrame:
    """One row per production row x backend x overlap (DistServe: per seed, and at the means), with
    ``kind`` (``throughput``, ``ordering``, :data:`ARGUED`, ``gain`` or ``range``), the ``simulated`` and
    ``published`` value (NaN for an ordering or a range; ``published_text`` says what was published), the
    ``error``
    (simulated / published - 1; for a range the distance to its nearer end), ``target_met`` (the
    ordering right, or the error within :data:`TOL`), the chosen plans' grid ``edges`` (recorded, not
    warned) and, for DistServe, the ``requests`` replayed per draw. ``overlaps``: default the declared
    overlap and perfect overlap."""
    if not (isinstance(seeds, int) and seeds >= 1):
        raise ValueError(f"seeds must be a positive integer number of DistServe draws, got {seeds!r}")
    bad = [b for b in backends if b not in BACKENDS]
    if bad:
        raise ValueError(f"unknown backend(s) {bad}; backends: {', '.join(BACKENDS)}")
    overlaps = tuple(overlaps) if overlaps is not None else (Efficiency().overlap, 1.0)
    pub = _published()
    st = claims.rule("ch3_val_megascale")["setting"]  # the paper's section 7.1, declared before computing
    ms_pub = pub["megascale_infer_gain_vs_trtllm_mixtral_dbrx"]
    rows, paper = [], {}

    def add(row, kind, backend, overlap, sim, published, text, err, met, edges, requests=float("nan")):
        rows.append(dict(zip(COLUMNS, (row, kind, backend, float(overlap), float(sim), float(published), text,
                                       float(err), bool(met), ",".join(edges), float(requests)))))

    for backend in backends:
        for ov in overlaps:
            eff = Efficiency(overlap=ov)
            r = {f"{m} {md}": P.decode_throughput(m, device, md, budget=budget, eff=eff, backend=backend)
                 for m, md in STEPFUN_CELLS}
            t = {k: v["tokens_per_s_per_device"] for k, v in r.items()}
            for key, name, pkey in (("Step-3 AFD", "StepFun Step-3 AFD (tokens/s per GPU)",
                                     "stepfun_step3_afd_tps_per_gpu"),
                                    ("DeepSeek-V3 D", "StepFun DeepSeek-V3 EP decode (tokens/s per GPU)",
                                     "stepfun_dsv3_tps_per_gpu")):
                err = t[key] / pub[pkey] - 1
                add(name, "throughput", backend, ov, t[key], pub[pkey], f"{pub[pkey]:,.0f}", err,
                    abs(err) <= TOL, r[key].get("edges", []))
            # the report's 8K-context figure (Table 8): the same cell at 8,192 tokens of context
            r8 = P.decode_throughput("Step-3", device, "AFD", budget=budget, eff=eff, backend=backend,
                                     context=8192.0)
            pub8 = pub["stepfun_step3_afd_8k_tps_per_gpu"]
            tps8 = r8["tokens_per_s_per_device"]
            add("StepFun Step-3 AFD at 8K context (tokens/s per GPU)", "throughput", backend, ov, tps8, pub8,
                f"{pub8:,.0f}", tps8 / pub8 - 1, abs(tps8 / pub8 - 1) <= TOL, r8.get("edges", []))
            ratio = t["Step-3 AFD"] / t["DeepSeek-V3 D"]
            s3_pub, ds_pub = pub["stepfun_step3_afd_tps_per_gpu"], pub["stepfun_dsv3_tps_per_gpu"]
            add("StepFun ordering: Step-3 AFD / DeepSeek-V3 EP decode", "ordering", backend, ov, ratio,
                float("nan"), f"Step-3 AFD above DeepSeek-V3 EP decode ({s3_pub:,.0f} > {ds_pub:,.0f})",
                float("nan"), ratio > 1,
                r["Step-3 AFD"].get("edges", []) + r["DeepSeek-V3 D"].get("edges", []))
            ratio = t["Step-3 AFD"] / t["Step-3 D"]
            add("StepFun's argument: Step-3 AFD / Step-3 EP decode", ARGUED, backend, ov, ratio,
                float("nan"), "AFD above EP decode for Step-3 (argued; no EP figure published)", float("nan"),
                ratio > 1, r["Step-3 AFD"].get("edges", []) + r["Step-3 D"].get("edges", []))
            for model in st["model"]:
                sim, g = P.afd_gain(model, st, tpot_slo_s=float(st["tpot_slo_s"]), eff=eff, backend=backend)
                err = sim / ms_pub - 1
                add(f"MegaScale-Infer {model}: AFD / EP decode", "gain", backend, ov, sim, ms_pub,
                    f"{ms_pub:.2f}x (one figure, two models)", err, abs(err) <= TOL,
                    g["AFD"].get("edges", []) + g["D"].get("edges", []))
                # each side on its own against Figure 8's bars: which side the gap is on
                for mode, what in (("D", "EP decode"), ("AFD", "AFD")):
                    bar, tps = _ms_bar(mode, model), g[mode]["tokens_per_s_per_device"]
                    add(f"MegaScale-Infer {model}: {what} (tokens/s per GPU)", "throughput", backend, ov, tps,
                        bar, f"{bar:,.0f} ({MS_BARS[mode][1]}, Figure 8 bar)", tps / bar - 1,
                        abs(tps / bar - 1) <= TOL, g[mode].get("edges", []))
                # the candidate effect on the baseline side: TensorRT-LLM as the paper describes it
                # (P.ms_paper_baseline; one micro-batch, so the same at every overlap)
                key = (backend, model)
                if key not in paper:
                    paper[key] = P.ms_paper_baseline(model, st, tpot_slo_s=float(st["tpot_slo_s"]),
                                                     backend=backend)
                base, bar = paper[key], _ms_bar("D", model)
                tps = base["tokens_per_s_per_device"]
                as_paper = "EP decode as the paper describes TensorRT-LLM"
                add(f"MegaScale-Infer {model}: {as_paper} (tokens/s per GPU)", DIAGNOSIS, backend, ov, tps,
                    bar, f"{bar:,.0f} (TensorRT-LLM, Figure 8 bar)", tps / bar - 1, abs(tps / bar - 1) <= TOL,
                    base.get("edges", []))
                gain = g["AFD"]["tokens_per_s_per_device"] / tps
                add(f"MegaScale-Infer {model}: AFD / {as_paper}", DIAGNOSIS, backend, ov, gain, ms_pub,
                    f"{ms_pub:.2f}x (one figure, two models)", gain / ms_pub - 1,
                    abs(gain / ms_pub - 1) <= TOL, g["AFD"].get("edges", []) + base.get("edges", []))
    lo, hi = pub["distserve_chatbot_goodput_gain_low"], pub["distserve_chatbot_goodput_gain_high"]
    ov = Efficiency().overlap
    for lengths, seed in [("sharegpt", s) for s in range(seeds)] + [("means", 0)]:
        r = P.distserve_gain(budget=distserve_budget, lengths=lengths, seed=seed, n_requests=n_requests)
        what = f"ShareGPT lengths, seed {seed}" if lengths == "sharegpt" else "every request at the means"
        err = _band_error(r["gain"], lo, hi)
        add(f"DistServe PD / vLLM goodput ({what})", "range", "roofline", ov, r["gain"], float("nan"),
            f"{lo:g}-{hi:g}x (three models)", err, abs(err) <= TOL, r.get("edges", []), n_requests)
    return pd.DataFrame(rows, columns=COLUMNS)


def _range(s: pd.Series, fmt: str) -> str:
    lo, hi = float(s.min()), float(s.max())
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)} to {fmt.format(hi)}"


def revalidation_values(table: pd.DataFrame) -> dict:
    """The chapter's words on :func:`revalidation_table` (every number from the table): how many rows
    meet their target, the Step-3 ordering, MegaScale-Infer's gains and the factor by which AFD would
    have to gain to reach the published figure, and DistServe over the draws and at the means."""
    t = table
    out = {"ch3_reval_band": f"±{TOL:.0%}", "ch3_reval_backends": " and ".join(dict.fromkeys(t["backend"])),
           "ch3_reval_overlaps": " and ".join(f"{o:g}" for o in sorted(set(t["overlap"])))}
    valued = t[~t["kind"].isin(ORDER_KINDS + (DIAGNOSIS,))]
    order, argued = t[t["kind"] == "ordering"], t[t["kind"] == ARGUED]
    out["ch3_reval_within"] = f"{int(valued['target_met'].sum()):,} of {len(valued):,}"
    # every published ordering: StepFun's measured one and the one each published gain implies (MegaScale-
    # Infer's AFD above its EP-decode baseline: a gain above 1)
    gains = t[t["kind"] == "gain"]
    right = int(order["target_met"].sum()) + int((gains["simulated"] > 1).sum())
    out["ch3_reval_order_right"] = f"{right:,} of {len(order) + len(gains):,}"
    out["ch3_reval_pub_order_ratio"] = _range(order["simulated"], "{:.2f}x")
    out["ch3_reval_argued_right"] = f"{int(argued['target_met'].sum()):,} of {len(argued):,}"
    out["ch3_reval_order_ratio"] = _range(argued["simulated"], "{:.2f}x")
    stepfun = t[(t["kind"] == "throughput") & t["row"].str.startswith("StepFun")]
    out["ch3_reval_stepfun_within"] = f"{int(stepfun['target_met'].sum()):,} of {len(stepfun):,}"
    out["ch3_reval_stepfun_error"] = _range(stepfun["error"], "{:+.0%}")
    ms = t[t["kind"] == "gain"]
    out["ch3_reval_ms_gain"] = _range(ms["simulated"], "{:.2f}x")
    out["ch3_reval_ms_published"] = ms["published_text"].iloc[0] if len(ms) else "n/a"
    # at perfect overlap: the ping-pong pipeline as MegaScale-Infer's own performance model prices it
    perfect = ms[ms["overlap"] == 1.0]
    out["ch3_reval_ms_gain_perfect"] = _range(perfect["simulated"], "{:.2f}x") if len(perfect) else "n/a"
    # the two candidates for the missing effect, each judged from its own rows: imperfect overlap (perfect
    # overlap still below 1 rules it out) and expert GEMMs read from the measured tables (the gain still
    # below 1 and Step-3's AFD still below its own EP decode on the measured rows rule it out: the effect
    # would favour AFD over EP decode of the same model)
    below = bool(len(perfect)) and bool((perfect["simulated"] < 1).all())
    out["ch3_reval_ms_overlap_reading"] = "Nor is imperfect overlap" if below else "Imperfect overlap may be"
    out["ch3_reval_ms_perfect_clause"] = (f"AFD {'still ' if below else ''}gives "
                                          f"{out['ch3_reval_ms_gain_perfect']} of EP decode")
    meas_ms, meas_order = ms[ms["backend"] == "measured"], argued[argued["backend"] == "measured"]
    right = int(meas_order["target_met"].sum() + (meas_ms["simulated"] >= 1).sum())
    ruled_out = len(meas_ms) > 0 and len(meas_order) > 0 and right == 0
    out["ch3_reval_ms_gemm_reading"] = "are not that effect" if ruled_out else "may be that effect"
    out["ch3_reval_ms_gemm_order"] = ("the order stays wrong there too" if ruled_out else
                                      f"the order or the gain comes out right in {right} of "
                                      f"{len(meas_order) + len(meas_ms)} of those rows")
    # each side against Figure 8's bars: the side with the larger error is where the gap is
    bars = t[(t["kind"] == "throughput") & t["row"].str.startswith("MegaScale")]
    base, afd = (bars[bars["row"].str.contains(w)] for w in (": EP decode", ": AFD"))
    out["ch3_reval_ms_base_error"] = _range(base["error"], "{:+.0%}") if len(base) else "n/a"
    out["ch3_reval_ms_afd_error"] = _range(afd["error"], "{:+.0%}") if len(afd) else "n/a"

    def side(x):
        key = [x["backend"], x["overlap"], x["row"].str.split(":").str[0]]
        return x.set_index(key)["error"].abs()

    pair = pd.concat({"base": side(base), "afd": side(afd)}, axis=1)
    farther = int((pair["base"] > pair["afd"]).sum())
    out["ch3_reval_ms_base_farther"] = f"{farther:,} of {len(pair):,}"
    n = len(pair)
    side = "baseline" if n and 2 * farther > n else "AFD" if n and 2 * farther < n else None
    out["ch3_reval_ms_side_short"] = f"mostly on the {side} side" if side else "on neither side alone"
    out["ch3_reval_ms_side_reading"] = (f"the gap is {out['ch3_reval_ms_side_short']}" if side else
                                        "neither side carries the gap alone")
    if side == "baseline" and (base["error"] > 0).all():
        out["ch3_reval_ms_side_reading"] += (
            ": the simulator prices the EP-decode baseline more efficiently than TensorRT-LLM ran it (the "
            "paper: TensorRT-LLM \"cannot avoid the issue of low GPU utilization in the FFN modules\", "
            "section 7.2)")
    # the baseline priced as the paper describes TensorRT-LLM (tensor-parallel over the node, one micro-batch)
    diag = t[t["kind"] == DIAGNOSIS]
    pb, pg = diag[~diag["row"].str.contains("AFD /")], diag[diag["row"].str.contains("AFD /")]
    out["ch3_reval_ms_paper_error"] = _range(pb["error"], "{:+.0%}") if len(pb) else "n/a"
    out["ch3_reval_ms_paper_within"] = f"{int(pb['target_met'].sum()):,} of {len(pb):,}"
    out["ch3_reval_ms_paper_gain"] = _range(pg["simulated"], "{:.2f}x") if len(pg) else "n/a"
    out["ch3_reval_ms_paper_above"] = f"{int((pg['simulated'] > 1).sum()):,} of {len(pg):,}"
    out["ch3_reval_ms_paper_gain_within"] = f"{int(pg['target_met'].sum()):,} of {len(pg):,}"
    inside = bool(len(pb)) and bool(pb["target_met"].all())
    out["ch3_reval_ms_paper_reading"] = (
        "so the searched baseline's attention data parallelism (and its two-micro-batch overlap where it "
        "uses one), which the paper's TensorRT-LLM did not have, carry the baseline's excess" if inside else
        "so how the paper's TensorRT-LLM was parallelised does not account for all of the baseline's excess")
    # the size the missing effect must have: the factor AFD's throughput over EP decode would need to gain
    need = ms["published"] / ms["simulated"]
    out["ch3_reval_ms_needed"] = _range(need, "{:.1f}x")
    ds = t[t["kind"] == "range"]
    draws = ds[~ds["row"].str.contains("means")]
    means = ds[ds["row"].str.contains("means")]
    out["ch3_reval_ds_draws"] = f"{len(draws):,}"
    out["ch3_reval_ds_gain"] = _range(draws["simulated"], "{:.1f}x")
    out["ch3_reval_ds_inside"] = f"{int((draws['error'] == 0).sum()):,} of {len(draws):,}"
    out["ch3_reval_ds_means"] = _range(means["simulated"], "{:.2f}x") if len(means) else "n/a"
    out["ch3_reval_ds_published"] = ds["published_text"].iloc[0] if len(ds) else "n/a"
    n = int(ds["requests"].max()) if len(ds) else 0
    out["ch3_reval_ds_requests"] = f"{n:,}"
    out["ch3_reval_attainment"] = f"{P.ATTAINMENT:.0%}"
    # the requests of a draw that may miss their SLO at the attainment goodput is judged at
    out["ch3_reval_ds_tail"] = f"{round(n * (1 - P.ATTAINMENT)):,}"
    return out


def display(table: pd.DataFrame):
    """The table for the page, one line per production row (not per setting): the published figure in words,
    then per backend and overlap the simulated value, its error and whether the target is met."""
    def cell(r):
        err = "" if pd.isna(r["error"]) else f" ({r['error']:+.0%})"
        met = "" if pd.isna(r["target_met"]) else (" ✓" if r["target_met"] else " ✗")
        return f"{r['simulated']:,.2f}{err}{met}"

    t = table.assign(value=[cell(r) for _, r in table.iterrows()],
                     setting=[f"{b}, overlap {o:g}" for b, o in zip(table["backend"], table["overlap"])])
    wide = t.pivot_table(index=["row", "published_text"], columns="setting", values="value",
                         aggfunc="first", sort=False)
    wide = wide.reset_index().rename(columns={"published_text": "published"})
    wide.columns.name = None
    return wide.style.format(na_rep="–").hide(axis="index")


def _pd_held_out(pred: pd.DataFrame) -> pd.DataFrame:
    return pred[(pred["skip_reason"] == "") & (pred["split"] == "test") & (pred["mode"] == "disagg")]


def pd_ttft_values(val: dict) -> dict:
    """The disaggregated-TTFT target on AIConfigurator's held-out PD runs (``val``:
    :func:`.study.validation`): the median error against :data:`PD_TTFT_TARGET`, the calibrated
    constants at a bound (:func:`.validate.at_bounds`), the runs whose measured TTFT exceeds
    :data:`SLOW_SHARE` of their own decode cycle (count, median error, the configurations that show
    both regimes at different concurrencies, how many of the runs with one decode rank and with several
    are slow, and the median error without those runs), and the size of
    the assumed perfect layer-wise overlap of the KV transfer (the median error at the overlaps
    :data:`KV_OVERLAPS`)."""
    t = _pd_held_out(val["pred"])
    err = t["err_ttft"].abs()
    med = float(err.median())
    out = {"ch3_reval_pd_rows": f"{len(t):,}", "ch3_reval_pd_ttft_median": f"{med:.0%}",
           "ch3_reval_pd_ttft_target": f"{PD_TTFT_TARGET:.0%}",
           "ch3_reval_pd_ttft_met": "meets" if med <= PD_TTFT_TARGET else "misses"}
    pinned = V.at_bounds(val["calibration"])
    out["ch3_reval_cal_fitted"] = f"{len(val['calibration'].vector()):,}"
    out["ch3_reval_cal_at_bound"] = f"{len(pinned):,}" + (f" ({', '.join(pinned)})" if pinned else "")
    cycle = (t["osl"] - 1) * t["silicon_tpot_ms"]
    slow = t["silicon_ttft_ms"] > SLOW_SHARE * cycle
    out["ch3_reval_pd_slow_share"] = f"{SLOW_SHARE:.0%}"
    out["ch3_reval_pd_slow"] = f"{int(slow.sum()):,} of {len(t):,}"
    out["ch3_reval_pd_slow_err"] = f"{float(err[slow].median()):.0%}" if slow.any() else "n/a"
    under = float((t.loc[slow, "err_ttft"] < 0).mean()) if slow.any() else float("nan")
    out["ch3_reval_pd_slow_under"] = f"{under:.0%}" if slow.any() else "n/a"
    out["ch3_reval_pd_rest_err"] = f"{float(err[~slow].median()):.0%}" if (~slow).any() else "n/a"
    # where requests can be placed: decode ranks = decode workers x decode attention DP ranks
    ddp = t["decode_attention_dp_size"]
    ranks = t["decode_num_workers"] * ddp.where(ddp >= 1, 1.0)
    one = ranks.fillna(1.0) <= 1
    # clients exactly as many as the recorded decode slots (decode ranks x decode batch per rank)
    filled = t["concurrency"] == ranks.fillna(1.0) * t["decode_batch_size"]
    out["ch3_reval_pd_slow_filled"] = f"{int(filled[slow].sum()):,} of {int(slow.sum()):,}"
    out["ch3_reval_pd_one_rank_slow"] = f"{int(slow[one].sum()):,} of {int(one.sum()):,}"
    out["ch3_reval_pd_many_rank_slow"] = f"{int(slow[~one].sum()):,} of {int((~one).sum()):,}"
    cfg = t["id"].astype(str).str.extract(r"(cfg\d+)")[0].fillna(t["group"])
    both = slow.groupby(cfg).agg(["any", "all"])
    out["ch3_reval_pd_mixed_cfgs"] = (f"{int((both['any'] & ~both['all']).sum()):,} of "
                                      f"{int(both['any'].sum()):,}")
    moved = 0.0
    for o in KV_OVERLAPS:
        p = _pd_held_out(V.predict(val["rows"], val["calibration"], kv_overlap=o))
        m = float(p["err_ttft"].abs().median())
        moved = max(moved, abs(m - med))
        out[f"ch3_reval_pd_kv{int(o * 10):02d}"] = f"{m:.0%}"
        shift = float((p["pred_ttft_ms"] / t["pred_ttft_ms"]).max() - 1)
        out[f"ch3_reval_pd_kv{int(o * 10):02d}_shift"] = f"{shift:+.1%}"
    out["ch3_reval_kv_overlap"] = f"{LAYERWISE_OVERLAP:g}"
    out["ch3_reval_pd_kv_reading"] = ("so the assumption does not carry the error" if moved <= KV_CARRY else
                                      "so the assumption carries part of the error")
    return out


RELAX_TO = 3.0  # the diagnosis lifts an efficiency's upper bound from 1 to this multiple of the peak
MIN_GROUP_RUNS = 10  # a (model, framework) group of runs named by the diagnosis has at least this many


def bound_values(val: dict, max_nfev: int = 40) -> dict:
    """Where the efficiencies at a bound go when the bound is lifted (to :data:`RELAX_TO`), refitted on
    the same train runs (``val``: :func:`.study.validation`), and which runs of each such GPU pull them:
    the (model, framework) groups of at least :data:`MIN_GROUP_RUNS` train runs with the largest
    median over-prediction of TTFT at the bound."""
    pinned = [n for n in V.at_bounds(val["calibration"]) if n.split("/")[0] in ("compute", "bandwidth")]
    out = {"ch3_reval_bound_relax_to": f"{RELAX_TO:g}"}
    if not pinned:
        out["ch3_reval_bound_relaxed"] = out["ch3_reval_bound_pull"] = "none (no efficiency at a bound)"
        out["ch3_reval_bound_reading"] = "no efficiency is held by a bound"
        return out
    fields = {n.split("/")[0] for n in pinned}
    cal = V.fit(val["rows"], max_nfev=max_nfev, relax={f: (V._BOUNDS[f][0], RELAX_TO) for f in fields})
    lifted = [getattr(cal, n.split("/")[0])[n.split("/")[1]] for n in pinned]
    out["ch3_reval_bound_relaxed"] = ", ".join(f"{n} {v:.2f}" for n, v in zip(pinned, lifted))
    out["ch3_reval_bound_reading"] = (
        "the runs ask for more than the GPU's peak, so the efficiency carries an effect the roofline lacks"
        if max(lifted) > 1 else "lifted, it stays within the peak, so the bound was not what held it")
    p = val["pred"]
    pulls = []
    for n in pinned:
        systems = [x for x in V.SYSTEMS if V.SILICON[x] == n.split("/")[1]]
        t = p[(p["skip_reason"] == "") & (p["split"] == "train") & p["system"].isin(systems)]
        g = t.groupby(["model", "backend"])["err_ttft"].agg(["median", "size"])
        g = g[(g["size"] >= MIN_GROUP_RUNS) & (g["median"] > 0)]
        g = g.sort_values("median", ascending=False).head(3)
        pulls += [f"{m} on {b} ({e:+.0%}, {int(k):,} runs)" for (m, b), (e, k) in g.iterrows()]
    out["ch3_reval_bound_pull"] = "; ".join(pulls) if pulls else "no group over-predicted"
    return out


def backend_table(vals: dict) -> pd.DataFrame:
    """Held-out median and 90th-percentile absolute errors of TTFT and TPOT per mode, the constants at a
    bound and the median measured share, one column per operator backend (``vals``: backend ->
    :func:`.study.validation` with that backend, each calibrated on the same train split)."""
    out = {}
    for backend, val in vals.items():
        p = val["pred"]
        t = p[(p["skip_reason"] == "") & (p["split"] == "test")]
        col = {}
        for mode, name in (("agg", "colocated"), ("disagg", "disaggregated")):
            m = t[t["mode"] == mode]
            for metric in ("ttft", "tpot"):
                e = m[f"err_{metric}"].abs()
                col[(name, metric.upper(), "median")] = float(e.median())
                col[(name, metric.upper(), "p90")] = float(e.quantile(0.9))
            col[(name, "share of operator time from tables", "median")] = float(m["measured_share"].median())
        col[("fit", "constants at a bound", "")] = float(len(V.at_bounds(val["calibration"])))
        out[backend] = col
    df = pd.DataFrame(out)
    df.index.names = ["runs", "quantity", "statistic"]
    return df


def backend_values(table: pd.DataFrame) -> dict:
    """The chapter's words on :func:`backend_table`: per backend the held-out PD TTFT median, the
    constants at a bound and the median measured share, and on how many of the eight held-out error
    statistics (median and 90th percentile of TTFT and TPOT, colocated and disaggregated) the measured
    backend is the closer one."""
    errs = table[table.index.get_level_values("quantity").isin(["TTFT", "TPOT"])]
    out = {}
    share = "share of operator time from tables"
    for b in table.columns:
        out[f"ch3_reval_{b}_pd_ttft"] = f"{table.loc[('disaggregated', 'TTFT', 'median'), b]:.0%}"
        out[f"ch3_reval_{b}_at_bound"] = f"{int(table.loc[('fit', 'constants at a bound', ''), b]):,}"
        out[f"ch3_reval_{b}_share_agg"] = f"{table.loc[('colocated', share, 'median'), b]:.0%}"
        out[f"ch3_reval_{b}_share_disagg"] = f"{table.loc[('disaggregated', share, 'median'), b]:.0%}"
    if {"roofline", "measured"} <= set(table.columns):
        closer = int((errs["measured"] < errs["roofline"]).sum())
        out["ch3_reval_measured_closer"] = f"{closer:,} of {len(errs):,}"
        out["ch3_reval_backend_reading"] = (
            "the measured tables do not bring the silicon runs closer" if 2 * closer < len(errs) else
            "neither backend is the closer one on these runs" if 2 * closer == len(errs) else
            "the measured tables bring the silicon runs closer")
    return out


def backend_display(table: pd.DataFrame):
    """:func:`backend_table` for the page: errors and shares in percent, the count of constants as is."""
    shown = table.reset_index()
    for b in table.columns:
        shown[b] = [f"{int(v):,}" if q == "constants at a bound" else f"{v:.0%}"
                    for q, v in zip(shown["quantity"], shown[b])]
    return shown.style.hide(axis="index")


# the MoE kernels the tensor-split runs use, from AIConfigurator's tables: DeepSeek-V3's experts in FP8 on
# eight GPUs, split eight ways (moe_tp 8) against spread over them (moe_ep 8), at decode- and prefill-sized
# token counts
MOE_SPLIT_KERNEL = {"model": "DeepSeek-V3", "dtype": "fp8", "gpus": 8, "tokens": (64.0, 8192.0),
                    "devices": ("h200_sxm", "b200_sxm")}


def moe_split_kernel_values(setting: dict = MOE_SPLIT_KERNEL) -> dict:
    """How much slower AIConfigurator's measured MoE kernel runs with the experts tensor-split
    (``moe_tp`` = the GPU count) than spread (``moe_ep`` = the GPU count) at the same tokens
    (:func:`analysis.measured.moe_seconds`, the installed tables of the default framework): the effect
    the roofline lacks (it prices both splits at one efficiency). Ratios over ``setting``'s devices
    and token counts; a point the tables do not hold is an error."""
    s = shape(setting["model"])
    n = float(setting["gpus"])
    tok = np.asarray(setting["tokens"], dtype=float)
    ratios = []
    for dev in setting["devices"]:
        args = (s.h, s.moe_inter, s.k_active, s.n_experts, setting["dtype"], 1.0)
        split, c1 = M.moe_seconds(dev, tok, np.ones_like(tok), *args, moe_tp=n)
        spread, c2 = M.moe_seconds(dev, tok, np.full_like(tok, n), *args, moe_tp=1.0)
        if np.any(c1 != M.MEASURED) or np.any(c2 != M.MEASURED):
            raise ValueError(f"the MoE table of {dev} lacks {setting['model']} {setting['dtype']} at "
                             f"{tok.tolist()} tokens, moe_tp {n:g} or moe_ep {n:g}")
        ratios += list(split / spread)
    r = np.asarray(ratios)
    gpus = ", ".join(d.split("_")[0].upper() for d in setting["devices"])
    return {"ch3_reval_moe_tp_ratio": _range(pd.Series(r), "{:.1f}x"),
            "ch3_reval_moe_tp_tokens": " and ".join(f"{t:,.0f}" for t in tok),
            "ch3_reval_moe_tp_setting": (f"{setting['model']}'s experts in {setting['dtype'].upper()} on "
                                         f"{setting['gpus']} GPUs ({gpus})")}


def moe_split_source_values(rows: pd.DataFrame) -> dict:
    """Where the validation's measured slowdown of tensor-split experts comes from
    (:func:`analysis.measured.moe_split_slowdown`): of the predictable runs with experts split in some
    stage (``moe_tp > 1``; PD runs count once), how many read their own model's expert shape in the MoE
    table of their GPU, how many the nearest measured shape or another dtype's table, and how many none
    (priced as the roofline: no shape holds both layouts at their GPU count)."""
    ok = rows[rows["skip_reason"] == ""]
    num = ok[list(V.NUMERIC)].apply(pd.to_numeric, errors="coerce")
    rank = {"own": 0, "near": 1, "none": 2}
    worst = pd.Series(-1, index=ok.index)
    for pre in ("", "prefill_", "decode_"):
        stage = (ok["mode"] == "agg") if pre == "" else (ok["mode"] != "agg")
        tp, dp = V._deg(num, f"{pre}tp_size"), V._deg(num, f"{pre}attention_dp_size")
        mt = pd.Series(V._moe_tp(num, tp, dp, pre), index=ok.index)
        todo = pd.DataFrame({"system": ok["system"], "model": ok["model"], "q": ok["moe_quant_mode"],
                             "mt": mt, "n": tp * dp})[stage & (mt > 1)]
        for (sy, mo, q, m, n), idx in todo.groupby(["system", "model", "q", "mt", "n"]).groups.items():
            s = shape(mo)
            if not s.n_moe:
                continue
            dt = str(M.moe_split_dtype(costs_weight_bytes(q)))
            key = (int(s.h), int(s.moe_inter), int(s.k_active), int(s.n_experts))
            got = M._split_source(V.SILICON[sy], dt, key, int(round(m)), float(n), M.DEFAULT_FRAMEWORK)
            own = got is not None and got[1] == key and got[0] in M.MOE_DTYPES[dt]
            kind = "none" if got is None else "own" if own else "near"
            worst.loc[idx] = np.maximum(worst.loc[idx], rank[kind])
    c = worst[worst >= 0].map({v: k for k, v in rank.items()}).value_counts()
    return {"ch3_reval_split_runs": f"{int((worst >= 0).sum()):,}",
            "ch3_reval_split_own": f"{int(c.get('own', 0)):,}",
            "ch3_reval_split_near": f"{int(c.get('near', 0)):,}",
            "ch3_reval_split_none": f"{int(c.get('none', 0)):,}"}


def costs_weight_bytes(quant: str) -> float:
    """Bytes per weight of a run's quant mode (:data:`.validate.QUANT`)."""
    return WEIGHT_FORMATS[V.QUANT[quant]][0]


def moe_split_effect_values(val: dict) -> dict:
    """The measured slowdown of tensor-split experts at the fitted constants of ``val``
    (:func:`.study.validation`): the median signed TPOT and TTFT error of the held-out MoE runs with
    experts split in their (decode) stage, priced with it and without it (the roofline alone), and
    where the slowdown comes from (:func:`moe_split_source_values`)."""
    rows, cal = val["rows"], val["calibration"]
    groups = V._prepare(rows, 50e9)
    with_ = V.predict(rows, cal, _groups=groups)
    for G in groups:
        G["dev"].pop("moe_split_slowdown")
    without = V.predict(rows, cal, _groups=groups)
    moe = with_["model"].map(lambda m: isinstance(m, str) and shape(m).n_moe > 0)
    mt = np.where(with_["mode"] == "agg", with_["moe_tp_size"], with_["decode_moe_tp_size"]).astype(float)
    sel = (with_["skip_reason"] == "") & moe & (mt > 1) & (with_["split"] == "test")
    out = {"ch3_reval_split_test_runs": f"{int(sel.sum()):,}"}
    for m in ("tpot", "ttft"):
        out[f"ch3_reval_split_{m}_with"] = f"{float(with_.loc[sel, f'err_{m}'].median()):+.0%}"
        out[f"ch3_reval_split_{m}_without"] = f"{float(without.loc[sel, f'err_{m}'].median()):+.0%}"
    out.update(moe_split_source_values(rows))
    return out
