"""Chapter 3's tables, glued values, verdicts and figures (analysis.disagg.chapter, .figures, the
summaries in .study), on small synthetic results; and the chapter's own cells: they call, glue and
plot (no function of their own), and every figure has a name, a caption and its figures.py function."""

import json
import re
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

from analysis import claims, data  # noqa: E402
from analysis.disagg import chapter, figures, study  # noqa: E402

CHAPTER = Path(__file__).resolve().parent.parent / "book" / "03_disagg.md"
EVIDENCE = CHAPTER.with_name("03_disagg_evidence.md")  # its evidence page (issue 30 item 1)
MODES = ["C", "PD", "AF", "3-way", "PDAF"]


def _sweep(hw, table, ratios=(1.0, 100.0)):
    """A sweep for one hardware set: ``table`` maps model -> per-ratio list of per-mode speedups (C is 1;
    NaN: infeasible)."""
    rows = []
    for model, per_ratio in table.items():
        for r, speedups in zip(ratios, per_ratio):
            for mode, s in zip(MODES, [1.0, *speedups]):
                rows.append(
                    {
                        "model": model,
                        "hardware": hw,
                        "ratio": r,
                        "mode": mode,
                        "speedup": s,
                        "feasible": bool(np.isfinite(s)),
                        "candidates": 10,
                    }
                )
    return pd.DataFrame(rows)


GPU = "H100-SXM5-80GB"
SWEEP = pd.concat(
    [
        _sweep(
            GPU,
            {
                "Llama-3.1-8B": [[0.9, 0.5, 0.7, 0.6], [1.4, 1.1, 1.2, 1.3]],
                "Qwen3-30B-A3B": [[1.1, np.nan, 0.8, 0.9], [1.6, 0.9, 1.5, 1.7]],
            },
        ),
        _sweep(
            study.NPU_SET,
            {
                "Llama-3.1-8B": [[0.9, 0.8, 1.1, 1.2], [1.3, 0.9, 1.4, 1.5]],
                "Qwen3-30B-A3B": [[0.7, 0.6, 1.0, 1.1], [1.2, 1.1, 1.3, 0.95]],
            },
        ),
        _sweep(
            study.PRICE_SET_NAMES["power-law"],
            {
                "Llama-3.1-8B": [[1.2, 0.8, 0.9, 0.7], [1.3, 0.9, 1.4, 0.8]],
                "Qwen3-30B-A3B": [[1.1, 0.6, 0.9, 0.6], [1.2, 1.1, 1.3, 0.5]],
            },
        ),
    ],
    ignore_index=True,
)


def _glued(values):
    """The text each value of a ``*_values`` dict is glued as."""
    from analysis.report import format_value

    return {
        k: (
            v.label if isinstance(v, claims.Verdict) else format_value(*v) if isinstance(v, tuple) else str(v)
        )
        for k, v in values.items()
    }


# ------------------------------------------------------------------------------------------ summaries


def test_consistency_and_ranking():
    ns = pd.DataFrame(
        {
            "mode": ["C", "PD", "PD", "PDAF", "PDAF", "AF", "AF", "3-way"],
            "speedup": [1.0, 1.2, 0.9, 1.1, 1.3, 0.5, np.nan, 2.0],
        }
    )
    c = study.consistency(ns)
    assert c.loc["PD", "win_share"] == 0.5 and c.loc["PDAF", "win_share"] == 1.0
    assert c.loc["AF", "cells"] == 1
    assert study.rank_modes(c)[:2] == ["3-way", "PDAF"]  # both win everywhere; 3-way's worst cell is higher


def test_best_disagg_and_axis_rho():
    df = pd.DataFrame(
        {
            "k": [1, 1, 1, 2, 2, 3, 3],
            "mode": ["C", "PD", "AF", "C", "PD", "C", "PD"],
            "speedup": [1, 1.5, 2.5, 1, 0.8, 1, np.nan],
        }
    )
    assert study.best_disagg(df, ["k"]).to_dict() == {1: 2.5, 2: 0.8}
    ab = pd.DataFrame({"axis": ["x"] * 4, "value": [1, 2, 4, 8], "best_disagg": [1.0, 1.1, 1.3, 1.2]})
    assert study.axis_rho(ab, "x") == pytest.approx(0.8)
    assert np.isnan(study.spearman([1, 1, 1], [1, 2, 3]))


def test_within_ratio_rho_is_not_the_pooled_one():
    df = pd.DataFrame(
        {
            "ratio": [1, 1, 1, 10, 10, 10],
            "attention_share": [0.1, 0.2, 0.3, 0.5, 0.6, 0.7],
            "best_disagg": [1.0, 1.1, 1.2, 3.0, 2.0, 1.0],
        }
    )
    r = study.within_ratio_rho(df)
    assert r.loc[1] == pytest.approx(1.0) and r.loc[10] == pytest.approx(-1.0)
    assert study.spearman(df["attention_share"], df["best_disagg"]) > 0  # across ratios it looks positive


# ------------------------------------------------------------------------------ claims (a) and (b)


def test_claim_a_values_agree_with_claim_inputs():
    """The glued PD gain is the value claim (a)'s verdict judges (study.claim_inputs)."""
    v = chapter.claim_a_values(SWEEP, [GPU])
    ci = study.claim_inputs(SWEEP, [GPU], 1000, "fp8")
    assert v["ch3_pd_max_gain"][0] == pytest.approx(ci["pd_gain"]) == pytest.approx(0.6)
    assert v["ch3_pd_max_where"] == f"Qwen3-30B-A3B on {GPU} at ratio 100"
    assert v["ch3_pd_win_share"][0] == pytest.approx(0.75) and v["ch3_pd_win_short"][0] == pytest.approx(0.5)
    assert v["ch3_pd_max_gain_npu"][0] == pytest.approx(0.3)
    assert v["ch3_pd_published"][0] == data.published("heteropanacea_pd_gain")["value"]


def test_claim_b_values_rank_and_ranges():
    v = chapter.claim_b_values(SWEEP)
    ranking = study.claim_inputs(SWEEP, [GPU], 1000, "fp8")["ranking"]
    assert v["ch3_b_best_mode"] == ranking[0] == "3-way"  # 3-way and PDAF win 3 of 4; 3-way's worst is higher
    assert v["ch3_b_pdaf_rank"] == ranking.index("PDAF") + 1 == 2
    assert v["ch3_pdaf100"] == "0.95×–1.50×" and v["ch3_af100"] == "0.90×–1.10×"
    empty = chapter.claim_b_values(SWEEP[SWEEP["hardware"] == GPU])
    assert empty["ch3_b_best_mode"].startswith("n/a") and set(chapter._B_KEYS) < set(empty)


def test_claim_b_by_price_judges_under_the_declared_rule():
    t = chapter.claim_b_by_price(SWEEP)
    assert list(t.index) == ["linear", "power-law"]  # only the price models the sweep computed
    assert t.loc["linear", "verdict"] == claims.PARTLY and t.loc["linear", "PDAF rank"] == 2
    assert (
        t.loc["power-law", "most consistent"] == "PD"
        and t.loc["power-law", "verdict"] == claims.NOT_REPRODUCED
    )
    v = chapter.price_values(SWEEP)
    assert v["ch3_verdict_b_linear"] == claims.PARTLY and v["ch3_verdict_b_gpu-fit"].startswith("n/a")


def test_claim_verdicts_use_the_declared_rules_and_their_ends():
    """Claims (a)-(c) through claims.evaluate on the measured backend's values: (a) flips to partly where
    the stated efficiencies or the roofline give a smaller gain; the TPOT SLO's declared ends are looked
    up by value; the roofline's values and verdicts are glued and shown beside the measured ones."""
    pub = data.published("heteropanacea_pd_gain")["value"]
    rank = ["PDAF", "PD", "AF", "3-way"]
    ci = {"measured": {"pd_gain": pub, "ranking": rank, "rho_sweep": 0.6},
          "stated": {"pd_gain": pub * 0.75, "ranking": rank, "rho_sweep": 0.55},
          "roofline (calibrated)": {"pd_gain": pub * 0.75, "ranking": rank, "rho_sweep": 0.55},
          "roofline (stated)": {"pd_gain": pub, "ranking": rank, "rho_sweep": 0.6}}
    abl = {"measured": 0.7, "calibrated": 0.7, "roofline": 0.7}
    ranks = {"linear": rank, "power-law": ["PD", "PDAF"], "gpu-fit": ["PDAF"]}
    v = chapter.claim_verdicts(ci, abl, ranks, {"low": pub, "high": pub * 1.05})
    assert v["a"].verdict == claims.REPRODUCED and v["a"].flips == [
        ("backend", "roofline (calibrated)", claims.PARTLY), ("efficiencies", "stated", claims.PARTLY)]
    assert (
        v["b"].verdict == claims.REPRODUCED
        and ("NPU price model", "power-law", claims.PARTLY) in v["b"].flips
    )
    assert v["c"].verdict == claims.REPRODUCED and v["c"].computed == 0.6 and not v["c"].flips
    v2 = chapter.claim_verdicts(ci, abl, ranks, {"low": pub * 0.1, "high": pub})
    low = chapter.tpot_slo_ends()["low"]
    assert ("TPOT SLO (s)", low, claims.NOT_REPRODUCED) in v2["a"].flips
    out = chapter.verdict_values(v, ci, abl, ranks, {"low": pub, "high": pub}, [])
    assert out["ch3_backend_agree"] == "not all the same" and out["ch3_verdict_counts"] == (
        "3 reproduced (3 of them amended after the result)")
    assert out["ch3_roof_verdict_a"] == claims.PARTLY and out["ch3_roof_a_value"][0] == pub * 0.75
    side = chapter.side_table(ci, v, abl, ranks, {"low": pub, "high": pub})
    want = [claims.PARTLY, claims.REPRODUCED, claims.REPRODUCED]
    assert side["verdict, roofline (calibrated)"].tolist() == want
    assert side["verdict, roofline (stated)"].tolist() == [claims.REPRODUCED] * 3
    assert side["measured (default)"].tolist()[1] == "PDAF"


def _with_shares(df, share):
    """``df`` with a ``measured_share`` per row from ``share(row)``."""
    return df.assign(measured_share=[share(r) for _, r in df.iterrows()])


def test_claim_measured_shares_name_the_deciding_plans():
    """(a): the PD and colocated plans of the cell with the largest PD gain; (b): the NPU cells' plans
    (0 there); (c): per cell, the colocated plan and the best disaggregated one (sweep and ablation)."""
    gpu = _sweep("G", {"m1": [(1.5, 0.9, 0.8, 0.7), (1.2, 2.0, 0.8, 0.7)],
                       "m2": [(1.1, 0.9, 0.8, 0.7), (1.3, 0.9, 0.8, 0.7)]})
    npu = _sweep(study.NPU_SET, {"m1": [(1.5, 0.9, 0.8, 0.7), (1.2, 2.0, 0.8, 0.7)]})
    code = {"C": 0.2, "PD": 0.6, "AF": 0.9, "3-way": 0.4, "PDAF": 0.5}
    sw = pd.concat([_with_shares(gpu, lambda r: code[r["mode"]] + (0.01 if r["model"] == "m2" else 0.0)),
                    npu.assign(measured_share=0.0)], ignore_index=True)
    abl = _sweep("G", {"v1": [(1.0, 1.1, 0.8, 0.7)], "v2": [(0.5, 0.6, 0.9, 0.7)]}, ratios=(1.0,))
    abl = _with_shares(abl, lambda r: code[r["mode"]])
    s = chapter.claim_measured_shares(sw, abl, ["G"])
    assert s["a"]["PD"] == 0.6 and s["a"]["C"] == 0.2 and s["a"]["cell"] == "m1, G, ratio 1"
    assert s["b"]["max"] == 0.0 and s["b"]["plans"] == len(npu[npu["feasible"]])
    # (c): 4 sweep cells + 2 ablation cells, each the C plan and the best split: 12 plans
    assert s["c"]["plans"] == 12 and s["c"]["min"] == 0.2 and s["c"]["max"] == pytest.approx(0.9)
    v = chapter.measured_share_values(s)
    assert v["ch3_meas_share_a_pd"] == (0.6, "{:.0%}") and v["ch3_meas_share_c_plans"][0] == 12
    t = chapter.measured_share_table(sw, ["G"])
    assert t["model"].tolist() == ["m1", "m2"] and t.loc[0, "colocated (median)"] == 0.2
    assert ((t["min"] >= 0) & (t["max"] <= 1)).all()


# --------------------------------------------------------------------------- the validation cells


def _prod(s3_afd=4000.0, dsv3=2400.0, s3_d=3000.0, raw=1.0):
    pub = {
        "Step-3": data.published("stepfun_step3_afd_tps_per_gpu")["value"],
        "DeepSeek-V3": data.published("stepfun_dsv3_tps_per_gpu")["value"],
    }
    rows = []
    for model, mode, sim in [("Step-3", "AFD", s3_afd), ("DeepSeek-V3", "D", dsv3), ("Step-3", "D", s3_d)]:
        p = pub[model] if mode == "AFD" or model == "DeepSeek-V3" else float("nan")
        rows.append(
            {
                "model": model,
                "mode": mode,
                "raw": sim * raw,
                "simulated": sim,
                "published": p,
                "error": sim / p - 1,
                "tpot_ms": 40.0,
                "config": json.dumps({"batch": 64, "size": 32}),
                "grid_edge": False,
            }
        )
    return pd.DataFrame(rows)


def test_production_verdicts_and_table():
    prod = _prod(dsv3=data.published("stepfun_dsv3_tps_per_gpu")["value"] * 1.5)
    v = chapter.production_verdicts(prod)
    assert v["s3"].verdict == claims.REPRODUCED and v["dsv3"].verdict == claims.NOT_REPRODUCED
    assert v["order"].verdict == claims.REPRODUCED
    t = chapter.production_table(prod, v).data
    assert t["verdict"].tolist() == [v["s3"].label, v["dsv3"].label, ""]
    assert list(t.columns).index("verdict") == list(t.columns).index("error") + 1
    text = _glued(chapter.production_values(prod, study.Efficiency(), v))
    assert text["ch3_prod_reading"].startswith("Where the cells miss")  # EP decode (3,000) below AFD's
    assert text["ch3_dsv3_batch"] == "64" and text["ch3_prod_tol"] == "25%"
    worse = chapter.production_verdicts(_prod(raw=0.5))
    assert worse["s3"].flips and worse["s3"].robustness.startswith("fragile")


def test_sensitivity_rows_within_the_declared_tolerance():
    pub = data.published("stepfun_dsv3_tps_per_gpu")["value"]
    sens = pd.DataFrame(
        {
            "change": ["as modelled", "a", "b"],
            "Step-3 AFD": [1.0, 2.0, 3.0],
            "DeepSeek-V3 D": [pub * 1.5, pub * 1.2, pub * 1.1],
            "Step-3 D": [2.0, 1.0, 1.0],
        }
    )
    sens["DeepSeek-V3 error"] = sens["DeepSeek-V3 D"] / pub - 1
    sens["AFD above D"] = sens["Step-3 AFD"] > sens["Step-3 D"]
    assert chapter.dsv3_within_rule(sens).tolist() == [False, True, True]
    v = chapter.sensitivity_values(sens)
    assert (
        v["ch3_sens_flip"] == "a, b" and v["ch3_sens_close"] == "a, b" and v["ch3_sens_n"] == (2, chapter.INT)
    )
    assert "'a'" in v["ch3_sens_missing"]


def test_gain_verdicts_take_the_larger_model_and_the_range():
    ms_pub = data.published(claims.rule("ch3_val_megascale")["reference"]["published"])["value"]
    lo = data.published("distserve_chatbot_goodput_gain_low")["value"]
    gains = pd.DataFrame(
        [
            {
                "cell": "MegaScale-Infer: AFD over EP decode",
                "model": "A",
                "raw": 0.9,
                "simulated": 0.8,
                "tbt_low": 0.7,
                "tbt_high": 0.9,
                "baseline_alt": 0.6,
                "baseline_paper": 0.65,
                "published": ms_pub,
                "detail": "a",
            },
            {
                "cell": "MegaScale-Infer: AFD over EP decode",
                "model": "B",
                "raw": 1.0,
                "simulated": ms_pub,
                "tbt_low": 0.5,
                "tbt_high": ms_pub,
                "baseline_alt": 0.9,
                "baseline_paper": 0.7,
                "published": ms_pub,
                "detail": "b",
            },
            {
                "cell": "DistServe: PD goodput over vLLM",
                "model": "OPT-13B",
                "raw": lo * 0.5,
                "simulated": lo,
                "published": float("nan"),
                "published_text": "x",
                "detail": "d",
            },
        ]
    )
    gains["error"] = gains["simulated"] / gains["published"] - 1
    v = chapter.gain_verdicts(gains)
    assert v["ms"].computed == ms_pub and v["ms"].verdict == claims.REPRODUCED
    assert (
        "TBT SLO (s)",
        chapter.claims.rule("ch3_val_megascale")["sensitivity"][1]["low"],
        claims.NOT_REPRODUCED,
    ) in v["ms"].flips  # 0.7 at the low end
    # the EP-decode baseline on the cluster's GPUs (the setting before the 2026-12-03 amendment): 0.9
    assert ("EP-decode baseline GPUs", 64, claims.NOT_REPRODUCED) in v["ms"].flips
    # the baseline as the paper describes TensorRT-LLM: the larger model's gain 0.7, outside the band
    assert ("EP-decode baseline parallelism", "as the paper describes TensorRT-LLM",
            claims.NOT_REPRODUCED) in v["ms"].flips
    assert v["ds"].verdict == claims.REPRODUCED and v["ds"].flips == [
        ("efficiencies", "stated", claims.NOT_REPRODUCED)
    ]
    t = chapter.gains_table(gains.assign(setting="s", device="d"), v).data
    assert t["verdict"].tolist() == [v["ms"].label] * 2 + [v["ds"].label]
    assert _glued(chapter.gain_values(gains, v))["ch3_ms_model"] == "B"


# ---------------------------------------------------------------------- sweep, Pareto, glue_all


def test_sweep_values_count_cells_only_disaggregation_serves():
    sw = SWEEP.copy()
    sw.loc[
        (sw["model"] == "Qwen3-30B-A3B")
        & (sw["hardware"] == GPU)
        & (sw["ratio"] == 1.0)
        & (sw["mode"] == "C"),
        "feasible",
    ] = False
    v = chapter.sweep_values(sw, gpus=[GPU], models=["a", "b"], ratios=[1.0, 100.0], output_tokens=1000)
    assert v["ch3_cells"][0] == 8 and v["ch3_cells_only_disagg"][0] == 1 and v["ch3_cells_none"][0] == 0
    assert chapter.main_sets(SWEEP, [GPU]) == [GPU, study.NPU_SET]


def test_pareto_values_pick_the_best_mode_near_20ms_and_at_the_loosest():
    par = pd.DataFrame(
        [
            {"mode": m, "tpot_slo_s": t, "tps_device": v}
            for t, vals in [(0.01, (np.nan, 1.0)), (0.021, (2.0, 3.0)), (0.5, (5.0, 4.0))]
            for m, v in zip(("C", "PD"), vals)
        ]
    )
    v = _glued(chapter.pareto_values(par))
    assert v == {
        "ch3_par_tight_tpot": "21 ms",
        "ch3_par_tight_best": "PD",
        "ch3_par_loose_best": "C",
        "ch3_par_loose_tpot": "500 ms",
    }


def test_glue_all_glues_values_texts_and_verdicts_with_their_rules(monkeypatch):
    from analysis import report

    seen = {}
    monkeypatch.setattr(report, "glue", lambda name, value, fmt=None: seen.setdefault(name, (value, fmt)))
    v = claims.evaluate("ch3_attention_heavy", 0.6)
    chapter.glue_all({"a": (1.5, "{:.1f}"), "b": "text", "c": v})
    assert seen == {"a": (1.5, "{:.1f}"), "b": ("text", None), "c_rule": (v.rule, None), "c": (v.label, None)}


# -------------------------------------------------------------------------------------- figures


def test_heatmap_text_and_plan_segments():
    assert figures.heatmap_text(1.234, True, True) == "1.23"
    assert (
        figures.heatmap_text(np.nan, True, False) == "∞" and figures.heatmap_text(np.nan, False, False) == "–"
    )
    segs = figures.plan_segments(
        "PDAF",
        {"unit": "DAF", "device_share": 0.5, "n_a": 3, "n_f": 1, "tp": 2, "m": 2, "batch": 64},
        budget=16,
    )
    assert [(r, w) for r, w, _ in segs] == [("DA", 6.0), ("DF", 2.0)]
    assert figures.plan_segments(
        "PD", {"unit": "P", "device_share": 0.25, "size": 2, "tp": 2, "pbatch": 4}, 16
    ) == [("P", 4.0, "2×TP2 B=4")]


def test_every_figure_function_draws_from_small_results():
    import matplotlib.pyplot as plt

    test = pd.DataFrame(
        {
            "mode": ["agg", "disagg"],
            "silicon_tpot_ms": [10.0, 20.0],
            "pred_tpot_ms": [11.0, 19.0],
            "silicon_ttft_ms": [100.0, 300.0],
            "pred_ttft_ms": [120.0, 280.0],
        }
    )
    curve = pd.DataFrame(
        {"silicon_ttft_ms": [100.0, 400.0], "pred_ttft_ms": [90.0, 420.0]}, index=[8.0, 16.0]
    )
    bd = pd.DataFrame({"model": ["a", "b"], "attention_share": [0.2, 0.4], "best_disagg": [1.1, 1.3]})
    ab = pd.DataFrame(
        {
            "axis": ["KV heads"] * 2,
            "value": [1, 4],
            "ratio": [10.0, 10.0],
            "attention_share": [0.2, 0.5],
            "best_disagg": [1.0, 1.2],
        }
    )
    par = pd.DataFrame(
        [{"mode": m, "tpot_slo_s": t, "tps_device": 100.0 * t} for m in MODES for t in (0.01, 0.1)]
    )
    units = [{"unit": "C", "device_share": 1.0, "size": 2, "tp": 2, "batch": 16}]
    cell = pd.DataFrame(
        [{"mode": m, "feasible": m == "C", "reason": "no plan", "units": json.dumps(units)} for m in MODES]
    )
    figs = {
        "fig_disagg_validation": figures.fig_disagg_validation(test),
        "fig_disagg_queueing": figures.fig_disagg_queueing(curve),
        "fig_disagg_heatmap": figures.fig_disagg_heatmap(
            SWEEP, ["Llama-3.1-8B", "Qwen3-30B-A3B"], [1.0, 100.0], [GPU, study.NPU_SET]
        ),
        "fig_disagg_heatmap_other": figures.fig_disagg_heatmap_other(
            SWEEP, ["Llama-3.1-8B", "Qwen3-30B-A3B"], [1.0, 100.0], [GPU, study.NPU_SET]
        ),
        "fig_disagg_ablation": figures.fig_disagg_ablation(bd, ab, ["a", "b"], [10.0], "x", 0.5, 0.4),
        "fig_disagg_pareto": figures.fig_disagg_pareto(par, "t"),
        "fig_disagg_plans": figures.fig_disagg_plans(cell, 16, "t"),
    }
    assert {k for k in vars(figures) if k.startswith("fig_")} == set(figs)
    assert len(figs["fig_disagg_heatmap"].axes) == 2 * 2 * 2  # two hardware sets x four modes in two columns
    texts = [t.get_text() for t in figs["fig_disagg_heatmap"].axes[0].texts]
    assert texts == ["0.90", "1.40", "1.10", "1.60"]  # PD on the GPU, model x ratio
    # the evidence page's heatmap: the two modes the chapter's leaves out, one row per hardware set
    assert len(figs["fig_disagg_heatmap_other"].axes) == 2 * 2
    other = figs["fig_disagg_heatmap_other"].axes[:2]
    assert [a.get_title().split(" — ")[0] for a in other] == ["AF", "3-way"]
    for f in figs.values():
        assert isinstance(f, matplotlib.figure.Figure)
        plt.close(f)


# --------------------------------------------------------------------------------- the chapter


def _code_cells(text):
    return re.findall(r"```\{code-cell\} ipython3\n(.*?)\n```", text, re.S)


@pytest.mark.parametrize("page, n_figures", [(CHAPTER, 2), (EVIDENCE, 5)])
def test_the_chapter_defines_nothing_and_names_and_captions_every_figure(page, n_figures):
    text = page.read_text(encoding="utf-8")
    cells = _code_cells(text)
    assert cells
    for c in cells:
        assert not re.search(r"^\s*(def|class) |\blambda\b", c, re.M), c[:200]
    plotting = [c for c in cells if "figures.fig_" in c]
    named = re.findall(r"^    name: (fig-[\w-]+)$", text, re.M)
    assert len(plotting) == len(named) == len(set(named)) == n_figures
    for c in plotting:
        meta = c.split("\n---\n", 1)[0]
        name = re.search(r"name: (fig-[\w-]+)", meta).group(1)
        assert "caption:" in meta
        assert f"figures.{name.replace('-', '_')}(" in c, name  # the function named after its label


def test_cached_takes_a_function_and_its_keyword_arguments(tmp_path, monkeypatch):
    """The chapter caches package functions without a lambda: ``cache.cached(ns, fn, **kwargs)`` returns
    ``fn(**kwargs)``, memoised on the kwargs and on the code ``fn`` depends on."""
    from analysis import cache

    monkeypatch.setenv("KVBOOK_CACHE", str(tmp_path))
    monkeypatch.delenv("KVBOOK_NO_CACHE", raising=False)
    calls = []

    def share(model, input_tokens, output_tokens):
        calls.append(model)
        return study.attention_share(model, input_tokens, output_tokens)

    a = cache.cached("t", share, model="Llama-3.1-8B", input_tokens=1000, output_tokens=100)
    b = cache.cached("t", share, model="Llama-3.1-8B", input_tokens=1000, output_tokens=100)
    c = cache.cached("t", share, model="Llama-3.1-8B", input_tokens=8000, output_tokens=100)
    assert a == b == study.attention_share("Llama-3.1-8B", 1000, 100) and c > a
    assert calls == ["Llama-3.1-8B"] * 2  # the repeated call came from the disk
    assert "analysis.disagg.study" in cache.deps.function_modules(share)
    assert cache.cached("t", {"x": 1}, lambda: 7) == 7  # the (inputs, compute) form still works
    with pytest.raises(TypeError):
        cache.cached("t", {"x": 1}, model="a")


def test_pd_gain_at_slo_ends_runs_the_sweep_at_each_declared_end(monkeypatch):
    calls = []

    def fake_cached(namespace, fn, **kw):
        calls.append((namespace, fn, kw))
        return kw["tpot_slo_s"]

    monkeypatch.setattr(chapter.cache, "cached", fake_cached)
    inputs = {"models": ["m"], "npu_points": ["x"], "role_hardware": {}, "tpot_slo_s": 0.05, "gpus": ["g"]}
    out = chapter.pd_gain_at_slo_ends(inputs, eff="cal")
    assert out == chapter.tpot_slo_ends()  # one sweep per end, at that end's TPOT SLO
    assert all(ns == "disagg/pd_gain_slo" and fn is study.pd_gain_sweep for ns, fn, _ in calls)
    assert all(kw["eff"] == "cal" and "npu_points" not in kw and kw["models"] == ["m"] for *_, kw in calls)


def test_chapter_verdicts_in_the_ledger_order():
    v = chapter.chapter_verdicts({"a": 1, "b": 2, "c": 3}, {"s3": 4, "dsv3": 5, "order": 6, "order_dsv3": 7},
                                 {"ms": 8, "ds": 9})
    assert v == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    # the ledger's order is data/claims.yaml's: chapter 3's claims in the order the chapter lists them
    from analysis import claims
    ids = [c for c, r in claims.table().items() if r["chapter"] == "03_disagg"]
    assert ids.index("ch3_val_step3_order") + 1 == ids.index("ch3_val_step3_over_dsv3")


def test_stepfun_orderings_are_judged_from_the_cells():
    """The ordering StepFun measured (Step-3's AFD over DeepSeek-V3's EP decode) and the one it argues
    (over Step-3's own EP decode) read the three cells, each at the calibrated and stated efficiencies."""
    prod = pd.DataFrame({"model": ["Step-3", "DeepSeek-V3", "Step-3"], "mode": ["AFD", "D", "D"],
                         "simulated": [3000.0, 2000.0, 3500.0], "raw": [1500.0, 2000.0, 1000.0]})
    v = chapter.production_verdicts(prod.assign(published=[4039.0, 2324.0, float("nan")]))
    from analysis import claims
    assert v["order_dsv3"].verdict == claims.REPRODUCED  # 3,000 over 2,000
    assert v["order"].verdict == claims.NOT_REPRODUCED  # 3,000 under 3,500
    assert v["order_dsv3"].computed == {"Step-3 AFD": 3000.0, "DeepSeek-V3 EP decode": 2000.0}
    # declared after the result (an amendment of the first reading): under it, Step-3's own EP decode wins
    assert v["order_dsv3"].original_verdict == claims.NOT_REPRODUCED
    assert ("ordered against", "Step-3 EP decode", claims.NOT_REPRODUCED) in v["order_dsv3"].flips


def test_edge_table_counts_the_feasible_best_plans_per_mode_and_edge():
    """The evidence page's grid-edge table: a feasible plan counted once per kind of edge it sits on,
    infeasible plans left out, the modes in the search's order, the last row the plans per mode."""
    sweep = pd.DataFrame({"mode": ["PD", "C", "PD", "AF"], "feasible": [True, True, True, False],
                          "edges": ["D.batch,P.batch,budget", "C.batch", "", "A.batch"]})
    t = chapter.edge_table(sweep).set_index("grid edge")
    assert list(t.columns) == ["C", "PD"]  # the search's order (MODES), AF infeasible
    batch = chapter._edge_words("batch")
    assert t.loc[batch].to_dict() == {"C": 1, "PD": 1}  # PD's plan on two batch axes counts once
    assert t.loc["the device budget"].to_dict() == {"C": 0, "PD": 1}
    assert t.index[0] == batch and t.loc["feasible best plans (all)"].to_dict() == {"C": 1, "PD": 2}


def test_the_chapter_and_its_evidence_page_name_different_figures():
    names = [set(re.findall(r"^    name: (fig-[\w-]+)$", p.read_text(encoding="utf-8"), re.M))
             for p in (CHAPTER, EVIDENCE)]
    assert names[0] and names[1] and not names[0] & names[1]  # Sphinx labels are global


def test_duplicates_are_counted_once_and_grouped_in_the_skip_table():
    """A row that repeats another's measurement is neither predictable nor 'cannot be predicted': it is
    counted apart, and the skip-reason table groups every duplicate in one row, whatever row it repeats."""
    rows = pd.DataFrame({"skip_reason": ["", "", "duplicate of a (the same measurement listed twice)",
                                         "duplicate of b (the same measurement listed twice)", "no tp_size"],
                         "id": list("abcde")})
    val = {"rows": rows}
    t = chapter.skipped_reason_table(val).data.set_index("skip reason")["rows (count)"]
    assert t.to_dict() == {"duplicate of another row (the same measurement listed twice)": 2, "no tp_size": 1}
    assert chapter._duplicate(rows).tolist() == [False, False, True, True, False]
