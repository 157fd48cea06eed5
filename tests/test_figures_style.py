"""The book's figure rules (issue 30), checked on every chapter's figure functions drawn from small data
on the book's theme (``analysis.plots.setup``):

* no text under ``plots.MIN_TEXT_PX`` px as displayed in the book's content column at 1280 px
  (``plots.displayed_px`` applied to the PNG the inline backend saves: ``bbox_inches='tight'`` at the
  figure's dpi);
* at most ``plots.MAX_SERIES`` labelled series per panel;
* no two labelled series of a panel share colour, marker and line style;
* every legend off the data (it overlaps no axes);
* no two tick labels of an axis, and no two texts of a panel, overlap.

Each check fails when the term it guards is removed (``test_checks_catch_*``).
"""
from __future__ import annotations

import io
import struct

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from analysis import plots  # noqa: E402

# ------------------------------------------------------------------------------------------ the rule


def test_displayed_px_rule():
    # narrower than the column: shown at its own size, 1 pt = dpi / 72 px
    assert plots.displayed_px(9, 5.0, dpi=110, column_px=672) == pytest.approx(9 * 110 / 72)
    # wider: scaled to the column, independent of the dpi
    for dpi in (100, 110, 200):
        assert plots.displayed_px(9, 8.0, dpi=dpi, column_px=672) == pytest.approx(9 * 672 / (72 * 8.0))
    w = 7.5
    assert plots.displayed_px(plots.min_font_pt(w), w) == pytest.approx(plots.MIN_TEXT_PX)
    assert plots.displayed_px(plots.SMALL_PT, plots.max_width_in(plots.SMALL_PT)) == pytest.approx(
        plots.MIN_TEXT_PX)
    assert plots.max_width_in(5.0) == 0.0  # 5 pt is under 10 px even unscaled at 110 dpi
    assert plots.max_width_in(plots.SMALL_PT) > plots.BOOK_WIDTH_IN + 2 * plots.SAVE_PAD_IN
    assert plots.figsize(3, width_in=20)[0] < plots.max_width_in(plots.SMALL_PT)


def test_series_helpers():
    styles = [plots.series_style(i) for i in range(plots.MAX_SERIES)]
    assert len({to_hex(s["color"]) for s in styles}) == plots.MAX_SERIES
    assert len({s["marker"] for s in styles}) == plots.MAX_SERIES
    assert [len(c) for c in plots.chunks(range(13))] == [5, 4, 4]
    assert plots.chunks(range(6)) == [list(range(6))]
    assert plots.panel_grid(3, 2) == (2, 2) and plots.panel_grid(1, 2) == (1, 1)


# ------------------------------------------------------------------------------------------ the checks


def _png_width(fig) -> int:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches="tight")
    return struct.unpack(">I", buf.getvalue()[16:20])[0]


def drawn_texts(fig):
    """The non-empty texts drawn when the figure is saved as the book saves it, and the PNG's width."""
    drawn = []
    orig = Text.draw

    def draw(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)
        return orig(self, renderer)

    Text.draw = draw
    try:
        width = _png_width(fig)
    finally:
        Text.draw = orig
    return list(dict.fromkeys(drawn)), width


def small_texts(fig, drawn=None):
    texts, width_px = drawn_texts(fig) if drawn is None else drawn
    w_in = width_px / fig.dpi
    return [(t.get_text()[:30], round(plots.displayed_px(t.get_fontsize(), w_in, fig.dpi), 1))
            for t in texts if plots.displayed_px(t.get_fontsize(), w_in, fig.dpi) < plots.MIN_TEXT_PX - 1e-6]


def _series(ax):
    out = []
    for ln in ax.get_lines():
        if not ln.get_label().startswith("_"):
            out.append((ln.get_label(), to_hex(ln.get_color()), str(ln.get_marker()), ln.get_linestyle()))
    for c in ax.collections:
        if isinstance(c, PathCollection) and not c.get_label().startswith("_") and len(c.get_offsets()):
            fc = c.get_facecolor()
            colour = to_hex(fc[0]) if len(fc) else "none"
            path = c.get_paths()[0] if c.get_paths() else None
            shape = str(np.round(path.vertices, 2).tolist()) if path is not None else ""
            out.append((c.get_label(), colour, shape, "scatter"))
    return out


def crowded_panels(fig):
    return [(i, [s[0] for s in _series(ax)]) for i, ax in enumerate(fig.axes)
            if len(_series(ax)) > plots.MAX_SERIES]


def indistinct_series(fig):
    bad = []
    for ax in fig.axes:
        seen = {}
        for label, *key in _series(ax):
            if tuple(key) in seen and seen[tuple(key)] != label:
                bad.append((seen[tuple(key)], label))
            seen.setdefault(tuple(key), label)
    return bad


def legends_on_data(fig):
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    bad = []
    for leg in legends:
        lb = leg.get_window_extent(r).padded(-2)
        for ax in fig.axes:
            if ax.get_visible() and ax.axison and lb.overlaps(ax.bbox):
                bad.append([t.get_text() for t in leg.get_texts()][:3])
                break
    return bad


def overlapping_labels(fig, drawn=None):
    """Pairs of drawn texts that overlap: tick labels (major and minor) of one axis, texts of a panel."""
    drawn = set(drawn_texts(fig)[0]) if drawn is None else set(drawn)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    bad = []

    def check(texts):
        boxes = [(t.get_text(), t.get_window_extent(r).padded(-1)) for t in texts if t in drawn]
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                if boxes[i][1].overlaps(boxes[j][1]):
                    bad.append((boxes[i][0], boxes[j][0]))

    for ax in [a for ax in fig.axes for a in (ax, *ax.child_axes)]:  # secondary axes are child axes
        if not ax.axison:
            continue
        check(ax.get_xticklabels(which="both"))
        check(ax.get_yticklabels(which="both"))
        check(ax.texts)
    # no legend covers a text outside it (an axis label, a title, a tick label)
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    for leg in legends:
        lb = leg.get_window_extent(r).padded(-2)
        own = set(leg.get_texts()) | {leg.get_title()}
        for t in drawn - own:
            if lb.overlaps(t.get_window_extent(r).padded(-1)):
                bad.append(("legend", t.get_text()[:30]))
    return bad


def assert_book_style(fig, name):
    drawn = drawn_texts(fig)
    problems = {
        "text under 10 px at 1280 px": small_texts(fig, drawn),
        "panels with more than 6 series": crowded_panels(fig),
        "series alike in colour, marker and line style": indistinct_series(fig),
        "legends over the axes": legends_on_data(fig),
        "overlapping labels": overlapping_labels(fig, drawn[0]),
    }
    problems = {k: v for k, v in problems.items() if v}
    plt.close(fig)
    assert not problems, f"{name}: {problems}"


def test_checks_catch_what_they_guard():
    plots.setup()
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for i in range(8):
        ax.plot([0, 1], [i, i + 1], color="C0", marker="o", label=f"s{i}")
    ax.legend(loc="upper left")
    ax.text(0.5, 3, "tiny", fontsize=5)
    ax.text(0.5, 3, "tiny again", fontsize=5)
    assert small_texts(fig)
    assert crowded_panels(fig)
    assert indistinct_series(fig)
    assert legends_on_data(fig)
    assert overlapping_labels(fig)
    plt.close(fig)
    fig, ax = plots.subplots()
    for i in range(3):
        ax.plot([0, 1], [i, i + 1], label=f"s{i}", **plots.series_style(i))
    plots.legend_below(fig)
    assert not (small_texts(fig) or crowded_panels(fig) or indistinct_series(fig) or legends_on_data(fig)
                or overlapping_labels(fig))
    plt.close(fig)


# ------------------------------------------------------------------------------------------ chapter 1

CH1_MODELS = ["GPT-2 small", "GPT-2 XL", "SmolLM2-135M", "Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B",
              "Qwen3-235B-A22B", "DeepSeek-V3", "Kimi-K2", "Kimi-Linear-48B-A3B", "gpt-oss-120b", "GLM-4.6",
              "Llama-4-Scout"]


def _ch1_figures():
    from analysis import kv_chapter as ch
    from analysis import kv_figures as figs
    from analysis import specs

    models = [m for m in CH1_MODELS if _known(specs, m)]
    ctx = ch.context_grid(1 << 20)
    table = ch.footprint_table(models, "bf16", "bf16", 131072)
    return {"fig_kv_per_token": lambda: figs.fig_kv_per_token(table, "bf16"),
            "fig_kv_vs_context": lambda: figs.fig_kv_vs_context(models, ctx, "bf16", "H100-SXM5-80GB"),
            "fig_kv_vs_weights": lambda: figs.fig_kv_vs_weights(models, ctx, "bf16", "bf16")}


def _known(specs, name):
    try:
        specs.model(name)
        return True
    except Exception:
        return False


# ------------------------------------------------------------------------------------------ chapter 2


def _ch2_figures():
    from analysis.tiering import agents as A
    from analysis.tiering import chapter as C
    from analysis.tiering import figures as F
    from analysis.tiering import replay as R
    from analysis.tiering import tiers as T

    tr = C.load("mooncake_conversation", 400)
    hc, _ = C.timed_hit_curve(tr)
    d = T.Deployment()
    econ = R.Economics(T.gpu_usd_per_s(d), 5.0)
    rows, outcomes = R.compare(tr, hc, d, econ, ["hbm", "dram", "cxl", "pool", "nvme", "qlc", "ai_ssd"], 8)
    h = C.hit_curve(tr, hc, d, [0.1], ["lfu"])
    pp, front = C.pareto(tr, outcomes, d, econ)
    wr = C.write_table(tr, outcomes, econ)
    runs = ["lru+all", "s3fifo+all", "sieve+all", "arc+all", "wtinylfu+all", "belady+all", "lru+second_use"]
    ad = C.admission(tr, d, econ, runs, [0.05, 0.2], "nvme")
    pols = ["random", "round_robin", "prefix_affinity", "kv_aware"]
    ro = C.routing(tr, hc, d, "dram", [1, 2, 4], pols, [1.0, 4.0], 1.0, 2)
    grid = ["Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B", "Qwen3-235B-A22B", "DeepSeek-V3", "Kimi-K2",
            "Kimi-Linear-48B-A3B", "gpt-oss-120b", "GLM-4.6"]
    piv = C.requirement_pivot(grid[:4], ["A800-SXM4-80GB", "H800-SXM5-80GB", "H100-SXM5-80GB",
                                         "H200-SXM-141GB", "B200-SXM-180GB"], 8192, "bf16")
    prices = [25.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 400.0, 600.0, 800.0, 1000.0, 1500.0]
    rng = np.random.default_rng(0)
    delta = rng.normal(size=(6, len(prices)))
    torn = [{"input": f"input {k} (×0.5 / ×2)", "cost_low": 1.0 - k / 10, "cost_high": 1.2 + k / 10}
            for k in range(6)]
    return {"fig_hit_curve": lambda: F.fig_hit_curve(tr, hc, h),
            "fig_load_vs_recompute": lambda: F.fig_load_vs_recompute(grid, "H800-SXM5-80GB", 8, "bf16", d),
            "fig_load_heatmap": lambda: F.fig_load_heatmap(piv),
            "fig_data_path": lambda: F.fig_data_path(d, 16),
            "fig_small_reads": lambda: F.fig_small_reads(d, 16384, 0.8),
            "fig_pareto": lambda: F.fig_pareto(pp, front, 5.0),
            "fig_writes": lambda: F.fig_writes(wr),
            "fig_admission": lambda: F.fig_admission(ad["costs"]),
            "fig_routing": lambda: F.fig_routing(ro["rows"], pols, [1.0, 4.0]),
            "fig_breakeven": lambda: F.fig_breakeven(delta, prices, [1.0, 2.0, 4.0, 7.0, 10.0, 14.0]),
            "fig_endurance_map": lambda: F.fig_endurance_map(np.abs(delta), prices,
                                                             [0.1, 0.3, 0.58, 1.0, 3.0, 10.0]),
            "fig_tornado": lambda: F.fig_tornado(torn, 1.1, "nvme"),
            "fig_fig10": lambda: F.fig_fig10(C.fig10(["mooncake_conversation"], 400, d, 4, 0.05, 1.0, 2,
                                                     own=("mooncake_conversation", tr, hc))["table"]),
            "fig_vllm_offload": lambda: F.fig_vllm_offload(
                C.vllm_offload("Llama-3.1-8B", "H100-SXM5-80GB", 0.5, 8192)),
            "fig_agent_hit_curves": lambda: F.fig_agent_hit_curves(
                A.compare(("mooncake_conversation", tr, hc), d, econ, ["hbm", "dram", "nvme"]))}


# ------------------------------------------------------------------------------------------ chapter 3


def _ch3_figures():
    import json

    from analysis.disagg import figures, study
    from tests.test_disagg_chapter import GPU, MODES, SWEEP

    test = pd.DataFrame({"mode": ["agg", "disagg"] * 3, "silicon_tpot_ms": [10.0, 20.0, 12, 25, 30, 8],
                         "pred_tpot_ms": [11.0, 19.0, 13, 24, 28, 9],
                         "silicon_ttft_ms": [100.0, 300.0, 120, 250, 400, 90],
                         "pred_ttft_ms": [120.0, 280.0, 110, 260, 380, 95]})
    curve = pd.DataFrame({"silicon_ttft_ms": [100.0, 400.0], "pred_ttft_ms": [90.0, 420.0]},
                         index=[8.0, 16.0])
    models = [f"model-{k}" for k in range(7)]
    bd = pd.DataFrame({"model": models, "attention_share": np.linspace(0.1, 0.7, 7),
                       "best_disagg": np.linspace(0.9, 1.5, 7)})
    ab = pd.DataFrame({"axis": ["KV heads"] * 3 + ["active experts"] * 3, "value": [1, 4, 8, 2, 8, 32],
                       "ratio": [1.0, 10.0, 100.0] * 2, "attention_share": [0.2, 0.35, 0.5, 0.25, 0.45, 0.65],
                       "best_disagg": [1.0, 1.2, 1.5, 0.9, 1.1, 1.4]})
    par = pd.DataFrame([{"mode": m, "tpot_slo_s": t, "tps_device": 100.0 * t * (1 + k)}
                        for k, m in enumerate(MODES) for t in (0.01, 0.1)])
    plans = {"C": [{"unit": "C", "device_share": 1.0, "size": 16, "tp": 2, "batch": 16}],
             "PD": [{"unit": "P", "device_share": 0.25, "size": 4, "tp": 1, "pbatch": 4},
                    {"unit": "D", "device_share": 0.75, "size": 3, "tp": 4, "batch": 128}],
             "AF": [{"unit": "AF", "device_share": 1.0, "n_a": 2, "n_f": 6, "tp": 2, "m": 3, "batch": 64}]}
    cell = pd.DataFrame([{"mode": m, "feasible": m in plans, "reason": "no plan meets the TPOT SLO",
                          "units": json.dumps(plans.get(m, []))} for m in MODES])
    return {"fig_disagg_validation": lambda: figures.fig_disagg_validation(test),
            "fig_disagg_queueing": lambda: figures.fig_disagg_queueing(curve),
            "fig_disagg_heatmap": lambda: figures.fig_disagg_heatmap(
                SWEEP, ["Llama-3.1-8B", "Qwen3-30B-A3B"], [1.0, 100.0], [GPU, study.NPU_SET],
                modes=("PD", "PDAF")),
            "fig_disagg_heatmap_other": lambda: figures.fig_disagg_heatmap_other(
                SWEEP, ["Llama-3.1-8B", "Qwen3-30B-A3B"], [1.0, 100.0], [GPU, study.NPU_SET]),
            "fig_disagg_ablation": lambda: figures.fig_disagg_ablation(
                bd, ab, models, [1.0, 10.0, 100.0], "x", 0.5, 0.4),
            "fig_disagg_pareto": lambda: figures.fig_disagg_pareto(par, "a model, ratio 10, H100"),
            "fig_disagg_plans": lambda: figures.fig_disagg_plans(cell, 64, "a model, ratio 10, H100")}


# ------------------------------------------------------------------------------------------ chapter 4

CH4_POLICIES = ["full", "streaming", "h2o", "tova", "snapkv", "kivi2", "kivi4", "mikv", "qevict_dequant",
                "qevict_recall", "quest", "h2o_recall", "snapkv_recall"]


def _ch4_summary():
    from analysis.qevict.policies import POLICY_LABELS

    rows = []
    for d, doc in enumerate(("code:x", "prose:y", "needle:z")):
        for k, pol in enumerate(CH4_POLICIES):
            for b in (0.1, 0.2, 0.35, 0.5):
                kl = 0.0 if pol == "full" else (0.05 + 0.02 * k) * (1 - b) * (1 + 0.1 * d)
                rows.append(dict(document=doc, genre=doc.split(":")[0], policy=pol, label=POLICY_LABELS[pol],
                                 budget=b, kl=kl, dppl=kl, top1=1 - kl, fmm_quantized=kl / 2, fmm_evicted=kl,
                                 device_frac=b, recall_bytes_per_step=100.0 * k, pareto=k % 3 == 0,
                                 needle_acc=1.0 if doc.startswith("needle") else np.nan))
    return pd.DataFrame(rows)


def _ch4_figures():
    from analysis.qevict import figures as qfig
    from analysis.qevict.policies import POLICY_LABELS

    s = _ch4_summary()
    sp = s[s.policy != "full"]
    keys, order, pal, mk = qfig.policy_styles(CH4_POLICIES, plots.PALETTE, plots.MARKERS)
    ptab = sp.groupby(["policy", "label", "budget"], as_index=False)[
        ["kl", "device_frac", "recall_bytes_per_step"]].mean()
    ptab["pareto"] = ptab.index % 4 == 0
    rule = pd.DataFrame([dict(baseline=b, budget=f, ratio=0.8 + 0.1 * i, lo=0.6 + 0.1 * i, hi=1.0 + 0.1 * i,
                              outcome=["better", "not worse", "unclear", "worse"][i % 4])
                         for i, b in enumerate(["h2o", "snapkv", "kivi2", "mikv"]) for f in (0.2, 0.5)])
    drift = pd.DataFrame({"document": ["code:x", "prose:y", "needle:z"],
                          **{f"{k}_{v}": [0.2, 0.3, 0.4] for k in ("miss", "global_lir", "budget_lir")
                             for v in ("null_mean", "null_sd", "observed")}})
    lir = pd.DataFrame({"document": ["a"] * 24 + ["b"] * 24, "layer": list(range(24)) * 2,
                        "lir": np.linspace(0.1, 0.9, 48), "reactivated_mass": np.linspace(0.0, 0.3, 48)})
    gain = pd.DataFrame({"lir": [0.1, 0.11, 0.12, 0.5], "kl_gain": [0.2, 0.2, 0.21, -0.1]},
                        index=["code:x", "prose:y", "needle:z", "code:w"])
    ratios = qfig.genre_kl_ratios(s, "qevict_recall", ["h2o", "snapkv", "kivi2", "mikv"], {})
    tb = pd.DataFrame([dict(policy=p, label=POLICY_LABELS[p], budget=b, bytes_full_per_token=100 * b,
                            bytes_quantized_per_token=30.0,
                            bytes_cold_per_token=200.0 if "recall" in p else 0.0)
                       for p in CH4_POLICIES for b in (0.1, 0.2, 0.35, 0.5)])
    lt = s.groupby(["label", "budget"], as_index=False).kl.mean().rename(columns={"kl": "KL"})
    lt = pd.concat([lt.assign(run="run-a", model="Gemma", context_tokens=32768),
                    lt.assign(run="run-b", model="Qwen", context_tokens=65536)], ignore_index=True)
    attn = np.random.default_rng(0).random((64, 2, 1, 40))
    return {"fig_qevict_heatmap": lambda: qfig.fig_qevict_heatmap(attn, 256, 16, -1, "code:x"),
            "fig_qevict_lir": lambda: qfig.fig_qevict_lir(lir, 8, 0, plots.PALETTE[1]),
            "fig_qevict_drift_null": lambda: qfig.fig_qevict_drift_null(drift),
            "fig_qevict_fmm": lambda: qfig.fig_qevict_fmm(sp, order, pal, mk, 0),
            "fig_qevict_outcomes": lambda: qfig.fig_qevict_outcomes(s, order, pal, mk, 0),
            "fig_qevict_pareto": lambda: qfig.fig_qevict_pareto(ptab, pal, dict(zip(order, mk))),
            "fig_qevict_forest": lambda: qfig.fig_qevict_forest(rule, 3),
            "fig_qevict_main_forest": lambda: qfig.fig_qevict_main_forest(rule, 6),
            "fig_qevict_genres": lambda: qfig.fig_qevict_genres(ratios),
            "fig_qevict_lir_gain": lambda: qfig.fig_qevict_lir_gain(gain, plots.PALETTE[0]),
            "fig_qevict_tier_bytes": lambda: qfig.fig_qevict_tier_bytes(tb, order, plots.PALETTE),
            "fig_qevict_long_kl": lambda: qfig.fig_qevict_long_kl(lt, {**pal, POLICY_LABELS["full"]: "k"},
                                                                  dict(zip(order, mk)))}


# ------------------------------------------------------------------------------------------ chapter 5


def _ch5_figures():
    from analysis.compose import decide, figures

    layouts = list(decide.LAYOUT_LABELS)
    ctxs = [4096, 8192, 16384, 32768, 65536, 126976]
    hits = [0.0, 0.2, 0.4, 0.6, 0.8]
    rows = []
    for f in (0.5, 1.0, 2.0):
        for i, c in enumerate(ctxs):
            for j, h in enumerate(hits):
                rows.append(dict(ssd_price_factor=f, context=c, hit_rate=h, layout=layouts[(i + j) // 2 % 4],
                                 policy="qevict_dequant @ 35%", mode="PD", usd_per_mtok=0.1234,
                                 flips=(i + j) % 5 == 0))
    cells = pd.DataFrame(rows)

    def sweep(groups, values):
        out = [dict(group=g, value=v, usd_per_mtok=1.0 + 0.1 * k + 0.01 * v) for k, g in enumerate(groups)
               for v in values]
        out += [dict(group="best", value=v, usd_per_mtok=1.0 + 0.01 * v) for v in values]
        return pd.DataFrame(out)

    sw = {k: sweep(layouts, [0.5, 1.0, 2.0, 4.0]) for k in ("ai", "cxl", "bw", "bits", "lin")}
    sw["xfer"] = sweep(["C", "PD", "AF"], [1.0, 2.0, 4.0])
    return {"fig_decision_map_answer": lambda: figures.fig_decision_map_answer(cells, layouts, 1.0),
            "fig_decision_map": lambda: figures.fig_decision_map(cells, layouts),
            "fig_sens_devices": lambda: figures.fig_sens_devices(sw, decide.LAYOUT_LABELS),
            "fig_sens_arch_disagg": lambda: figures.fig_sens_arch_disagg(sw, decide.LAYOUT_LABELS)}


BUILDERS = {"analysis.kv_figures": _ch1_figures, "analysis.tiering.figures": _ch2_figures,
            "analysis.disagg.figures": _ch3_figures, "analysis.qevict.figures": _ch4_figures,
            "analysis.compose.figures": _ch5_figures}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def chapter_figures(request):
    plots.setup()
    return request.param, BUILDERS[request.param]()


def test_every_figure_function_is_checked(chapter_figures):
    import importlib

    module, figs = chapter_figures
    assert {k for k in vars(importlib.import_module(module)) if k.startswith("fig_")} == set(figs)


@pytest.mark.slow  # renders every figure of the book three times: 2-35 s per chapter
def test_every_figure_follows_the_book_style(chapter_figures):
    module, figs = chapter_figures
    failures = []
    for name, build in figs.items():
        try:
            assert_book_style(build(), name)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


def test_legend_helpers_place_legends_off_the_axes():
    plots.setup()
    fig, axes = plots.subplots(1, 2)
    for ax in axes:
        for i in range(4):
            ax.plot(range(5), np.arange(5) * (i + 1), label=f"series {i}", **plots.series_style(i))
    plots.legend_below(fig, ncol=4)
    assert not legends_on_data(fig)
    plt.close(fig)
    fig, ax = plots.subplots()
    plots.context_lines(ax, [0, 1], [[0, 1], [1, 0]])
    assert not _series(ax) and all(to_hex(ln.get_color()) == to_hex(plots.GREY) for ln in ax.get_lines())
    plt.close(fig)
