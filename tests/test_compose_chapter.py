"""Chapter 5's glue rows, tables and sweeps (analysis.compose.chapter) and its figures by label
(analysis.compose.figures): each test fails when the term it names is removed."""

import dataclasses
import math

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from analysis.compose import chapter as cc  # noqa: E402
from analysis.compose import decide, figures  # noqa: E402
from analysis.compose.configure import base_scenario  # noqa: E402
from analysis.compose.fidelity import KVPolicy  # noqa: E402
from analysis.compose.params import SCHEMA  # noqa: E402
from analysis.compose.pipeline import ReuseCurve, Scenario  # noqa: E402

REUSE = ReuseCurve(np.linspace(1e5, 2e7, 200), np.linspace(0.005, 1.0, 200), 10000.0, "synthetic")
BASE = Scenario(model="Llama-3.1-70B", gpu="H100-SXM5-80GB", input_tokens=16384, output_tokens=1000)


def test_pct_and_range_rows():
    assert cc.pct_row("x", 0.25) == ("x", 0.25, "{:.0%}")
    assert cc.pct_row("x", math.nan)[2] == "n/a"
    found = pd.DataFrame({"share": [0.5, 0.2, 0.9]})
    assert cc.range_row("r", found, "share") == ("r", "20%–90%", None)
    assert cc.range_row("r", pd.DataFrame({"share": [np.nan, np.nan]}), "share")[1] == "n/a"


def test_findings_rows_glue_every_finding_and_its_range():
    found = pd.DataFrame({k: [0.5, 0.4] for k in cc.FINDINGS})
    rows = cc.findings_rows(dict.fromkeys(cc.FINDINGS, 0.5), found)
    names = [r[0] for r in rows]
    assert len(names) == 2 * len(cc.FINDINGS) and "ch5_top_policy_share_range" in names


def test_flip_rows_count_admissible_cells_and_the_most_flipping_range():
    cells = pd.DataFrame(
        {
            "usd_per_mtok": [1.0, 2.0, np.nan],
            "flips": [True, False, True],
            "layout_flips": [False, False, True],
            "flipped_by": ["GPU rent; tier prices", "", "tier prices"],
        }
    )
    g = {n: v for n, v, _ in cc.flip_rows(cells, 2)}
    assert (
        g["ch5_flip_share"] == 0.5 and g["ch5_flip_layout_share"] == 0.0
    )  # the cell with no option is left out
    assert g["ch5_flip_main"] == "tier prices"
    none = cells.assign(flips=False)
    assert {n: v for n, v, _ in cc.flip_rows(none, 2)}["ch5_flip_main"] == "none of them"


def test_frontier_summary_joins_the_crossings_per_price():
    cells = pd.DataFrame(
        {
            "ssd_price_factor": 1.0,
            "context": [4096, 4096, 8192, 8192],
            "hit_rate": [0.0, 0.6, 0.0, 0.6],
            "layout": ["hbm", "nvme", "nvme", "nvme"],
        }
    )
    s = cc.frontier_summary(cells)
    assert len(s) == 1 and s["where"].iloc[0].count(";") == 1  # two crossings of one frontier, joined
    assert cc.frontier_summary(cells.assign(layout="hbm"))["frontier"].iloc[0].startswith("none")


def test_lookup_reads_the_value_at_each_setting():
    f = cc.lookup({0.5: 1.0, 2.0: 3.0})
    assert f("any", 2.0) == 3.0
    with pytest.raises(KeyError):
        f("any", 1.0)


def test_interactive_maps_keep_only_the_interactive_prices():
    cells = pd.DataFrame({"ssd_price_factor": [1.0, 4.0], "flips": [False, True], "option": ["a", "b"]})
    every = pd.DataFrame({"ssd_price_factor": [1.0, 4.0, 4.0]})
    ic, ie = cc.interactive_maps(
        cells,
        every,
        [1.0, 2.0],
        pd.DataFrame({"ssd_price_factor": [2.0], "option": ["c"]}),
        pd.DataFrame({"ssd_price_factor": [2.0]}),
    )
    assert (
        list(ic["option"]) == ["a", "c"] and "flips" not in ic and list(ie["ssd_price_factor"]) == [1.0, 2.0]
    )


def test_kimi_display_in_gigabytes():
    k = pd.DataFrame({"KV per sequence": [2.5e9], "batch": [4], "devices": [8]})
    d = cc.kimi_display(k)
    assert d["KV per sequence"].iloc[0] == "2.5 GB" and "batch (sequences)" in d


def test_scenario_transformations_change_what_they_name():
    assert cc.ai_ssd_gain(BASE, 4.0).tiers.ai_ssd_bits == 4
    assert cc.transfer_overhead(BASE, 8).transfer_overhead == 8.0
    assert cc.nvme_bandwidth(BASE, 3.5) != BASE
    lin = cc.LinearShare("Llama-3.1-70B")(BASE, 0.75)
    assert lin.model != BASE.model


def test_sensitivity_sweeps_and_sentences():
    opts = decide.options(["hbm", "nvme"], [KVPolicy.full()], ["C", "PD"])
    sw = cc.sensitivity_sweeps(
        BASE.replace(hit_rate=0.6),
        "Llama-3.1-70B",
        opts,
        REUSE,
        decide.FidelityFloor(),
        price_factors=[0.5, 2.0],
        nvme_bw_gb_s=[3.5],
        ai_ssd_bits_grid=[16, 4],
        linear_shares=[0.0, 0.75],
        transfer_overheads=[1.0],
    )
    assert set(sw) == set(cc.SWEEP_GLUE)
    assert sorted(sw["bits"]["value"].unique()) == [1.0, 4.0]  # read gain 16 / bits
    assert set(sw["xfer"]["group"]) - {"best"} == {"C", "PD"}  # the transfer sweep is by mode
    rows = cc.sweep_rows(sw)
    assert [r[0] for r in rows] == list(cc.SWEEP_GLUE.values()) and all("nan" not in r[1] for r in rows)
    assert 0 < cc.linear_cost_reduction(sw["lin"]) < 1  # a smaller cache serves cheaper
    import matplotlib.pyplot as plt

    for f in (
        figures.fig_sens_devices(sw, decide.LAYOUT_LABELS),
        figures.fig_sens_arch_disagg(sw, decide.LAYOUT_LABELS),
    ):
        assert isinstance(f, matplotlib.figure.Figure)
    plt.close("all")


def _priced():
    full = KVPolicy.full().label
    rows = []
    for pricing, hit, step, feasible in ((cc.OLD_PRICING, 0.6, 1.0, True), (cc.NEW_PRICING, 0.4, 3.0, False)):
        for pol, s in ((full, 0.0), ("QEvict", step)):
            rows.append(
                {
                    "layout": "nvme",
                    "policy": pol,
                    "pricing": pricing,
                    "realised hit rate": hit,
                    "recall + writes ms / step": s,
                    "wear USD / M tok": 0.01 if pol != full else 0.0,
                    "feasible": feasible or pol == full,
                }
            )
    return pd.DataFrame(rows)


def test_pricing_rows_compare_the_two_pricings():
    g = {n: v for n, v, _ in cc.pricing_rows(_priced(), {"nvme": ("NVMe SSD",)})}
    assert g["ch5_ref_hit_old"] == 0.6 and g["ch5_ref_hit_new"] == 0.4
    assert g["ch5_recall_ratio_text"].startswith("from 3× to 3×")  # the full cache recalls nothing: left out
    assert g["ch5_pricing_lost_text"] == "QEvict on NVMe SSD no longer meet the SLOs"
    assert g["ch5_wear_max"] == 0.01


def test_fidelity_rows_long_runs_and_top_options():
    from types import SimpleNamespace

    pols = [SimpleNamespace(source="published", ok=True), SimpleNamespace(source="chapter 4", ok=False)]
    floor = SimpleNamespace(admits=lambda p: p.ok)
    g = {
        n: v
        for n, v, _ in cc.fidelity_rows(
            pols, floor, pols[:1], floor, pd.DataFrame({"x": [1]}), pd.DataFrame({"x": [1, 2, 3, 4]})
        )
    }
    assert (g["ch5_n_policies"], g["ch5_n_admissible_policies"], g["ch5_n_published_policies"]) == (2, 1, 1)
    assert g["ch5_n_admissible_other"] == 1 and g["ch5_source_moved_share"] == 0.25
    runs = [{"name": "r", "model": "m", "context_tokens": 8192.0, "stale": True}]
    assert cc.long_runs_text(runs) == "r (m, 8,192 tokens, stale)"
    assert cc.long_runs_text([], enabled=False) == "switched off by the parameters"
    at = pd.DataFrame(
        {
            "layout": ["nvme", "hbm"],
            "policy": "full",
            "mode": "C",
            "usd_per_mtok": [2.0, 1.0],
            "ttft_s": 1.0,
            "tpot_s": 0.05,
            "meets_slo": True,
            "fidelity_source": "-",
            "fidelity_ok": True,
            "realized_hit_rate": 0.5,
        }
    )
    t = cc.top_options_table(at, n=1)
    assert len(t) == 1 and t["USD / M tokens"].iloc[0] == "1.000" and t["TPOT (ms)"].iloc[0] == "50.0"


def test_flipped_table_and_interactive_map_cells():
    cells = pd.DataFrame(
        {
            "context": [4096, 8192],
            "hit_rate": 0.0,
            "ssd_price_factor": 1.0,
            "option": ["a", "b"],
            "flipped_by": ["GPU rent", ""],
            "flips": [True, False],
        }
    )
    t = cc.flipped_table(cells)
    assert list(t["cheapest option"]) == ["a"] and "prompt (tokens)" in t
    assert list(cc.flipped_table(cells.assign(flips=False)).columns) == ["cells that flip"]
    every = pd.DataFrame({"ssd_price_factor": [1.0]})
    ic, ie = cc.interactive_map_cells(BASE, [4096], [0.0], [1.0], [1.0], [], REUSE, None, cells, every)
    assert list(ic["option"]) == ["a", "b"] and len(ie) == 1  # no new price: the main map's cells only


CFG = SCHEMA.config()


def test_baseline_check_is_the_direct_cost_and_its_rows():
    b = cc.baseline_check(CFG.service, base_scenario(CFG), REUSE, 16384)
    assert b["pipeline"] > 0 and b["pipeline"] == pytest.approx(b["direct"], rel=1e-9)
    # two computations (the pipeline and chapter 3's plan x chapter 2's GPU cost) agree at another prompt too
    b2 = cc.baseline_check(CFG.service, base_scenario(CFG), REUSE, 32768)
    assert b2["pipeline"] == pytest.approx(b2["direct"], rel=1e-9) and b2["direct"] != b["direct"]
    assert list(cc.baseline_table(b)["USD per million tokens"]) == [b["pipeline"], b["direct"]]
    g = {n: (v, f) for n, v, f in cc.baseline_rows({"pipeline": 1.1, "direct": 1.0})}
    assert g["ch5_baseline_rel_diff"][0] == pytest.approx(0.1) and g["ch5_baseline_usd"] == (1.1, "${:.4f}")


def test_af_prefill_share_row_is_a_share_or_na():
    name, share, fmt = cc.af_prefill_share_row(CFG.service, 16384)
    assert name == "ch5_af_prefill_share" and 0 < share < 1 and fmt == "{:.0%}"
    tight = dataclasses.replace(CFG.service, ttft_slo_s=1e-6)
    assert cc.af_prefill_share_row(tight, 16384)[2].startswith("n/a")


def test_recall_rows_follow_the_parameters():
    base = base_scenario(CFG)
    g = {n: v for n, v, _ in cc.recall_rows(CFG.recall, CFG.reuse, base, REUSE)}
    # Llama-3.1-70B: one layer, one KV head, K and V of 128 bf16 elements per token
    assert g["ch5_unit_kib"] == CFG.recall.recall_unit_tokens * 2 * 128 * 2 / 1024
    assert g["ch5_route_n"] == 1 and g["ch5_route_unbounded"] == 1.0  # a plain curve: one ideal stack
    assert "prefetch one layer ahead" in g["ch5_prefetch_text"]
    off = dataclasses.replace(
        CFG.recall, recall_prefetch=False, recall_pricing="sequential", recall_unit_tokens=64
    )
    two = dataclasses.replace(CFG.reuse, routing_instances=2, routing_policy="random")
    g2 = {n: v for n, v, _ in cc.recall_rows(off, two, base, REUSE)}
    assert g2["ch5_unit_kib"] == 2 * g["ch5_unit_kib"] and "no prefetch" in g2["ch5_prefetch_text"]
    assert g2["ch5_route_n_why"] == "`routing_instances`" and g2["ch5_route_policy"] == "at random"
    assert g2["ch5_pricing_recall_mode"] != g["ch5_pricing_recall_mode"]


def test_pricing_map_rows_count_moved_cells_and_shares():
    old = {"share_off_hbm": 0.2, "share_compressed": 0.1}
    new = {"share_off_hbm": 0.5, "share_compressed": math.nan}
    g = {
        n: (v, f)
        for n, v, f in cc.pricing_map_rows(pd.DataFrame({"x": [1]}), pd.DataFrame({"x": range(4)}), old, new)
    }
    assert g["ch5_pricing_moved_share"][0] == 0.25 and g["ch5_pricing_moved_n"][0] == 1
    assert g["ch5_pricing_n_cells"][0] == 4
    assert g["ch5_old_share_off_hbm"][0] == 0.2 and g["ch5_new_share_off_hbm"][0] == 0.5
    assert g["ch5_new_share_compressed"][1] == "n/a"
    empty = cc.pricing_map_rows(pd.DataFrame(), pd.DataFrame(), old, new)
    assert empty[0][1] == 0.0  # no cell: no division by zero


def test_xfer_rows_change_of_the_cheapest_disaggregated_plan():
    sweep = pd.DataFrame(
        {"group": ["C", "PD", "C", "PD"], "value": [1.0, 1.0, 8.0, 8.0], "usd_per_mtok": [5.0, 1.0, 5.0, 1.1]}
    )
    (n, v, f), (n2, v2, f2) = cc.xfer_rows(sweep, ["C", "PD"], [1.0, 8.0])
    assert n == "ch5_xfer_disagg_change" and v == pytest.approx(0.1) and f == "{:+.1%}"
    assert (n2, v2) == ("ch5_xfer_max", 8.0)
    infeasible = sweep.assign(usd_per_mtok=[5.0, 1.0, 5.0, np.nan])
    assert cc.xfer_rows(infeasible, ["C", "PD"], [1.0, 8.0])[0][2] == "infeasible"
    assert cc.xfer_rows(sweep, ["C"], [1.0, 8.0])[0][2] == "n/a"  # no disaggregated mode


def test_kimi_decode_ratios_and_rows():
    k = cc.kimi_decode(131072, 1000, "H100-SXM5-80GB", 0.1, 64)
    t = k["table"]
    assert k["context"] == 131072 and len(t) == 2
    assert k["speedup"] == t["decode tokens/s per device"].iloc[0] / t["decode tokens/s per device"].iloc[1]
    assert k["tpot_ratio"] == t["TPOT of one sequence (s)"].iloc[1] / t["TPOT of one sequence (s)"].iloc[0]
    assert k["speedup"] > 1 and t["KV per sequence"].iloc[0] < t["KV per sequence"].iloc[1]
    assert set(k["at"]) == {1.0, *cc.KIMI_TPOT_ENDS} and k["at"][1.0] == k["speedup"]
    g = {n: (v, f) for n, v, f in cc.kimi_rows(k, 0.1)}
    assert g["ch5_kimi_tpot_slo"] == (100.0, "{:g} ms") and g["ch5_kimi_speedup"][1] == "{:.1f}×"
    assert g["ch5_kimi_published"][0] == 6.0
    assert cc.kimi_verdict(k).claim_id == "ch5_kimi_decode"
    nan = {**k, "speedup": math.nan, "tpot_ratio": math.nan}
    assert cc.kimi_rows(nan, 0.1)[2][2].startswith("n/a")


def test_share_verdicts_recompute_on_the_maps_at_the_declared_ends():
    """(issue 28) the ends are maps recomputed by decide.map_uncertainty (``found``) and the map judged
    with the other fidelity source, not slices of the default map (tests/test_claims_robustness.py)."""
    keys = ("share_off_hbm", "share_qevict", "share_compressed", "share_disagg")
    F = dict.fromkeys(keys, 0.9)
    found = pd.DataFrame([{"perturbation": p, **dict.fromkeys(keys, 0.0 if "× 2" in p else 0.9)}
                          for p in ("declared values", "GPU rent × 0.8", "GPU rent × 1.25",
                                    "off-HBM tier prices × 0.5", "off-HBM tier prices × 2")])
    vs = cc.share_verdicts(F, found, {"other": "chapter 4", "findings": F})
    assert [v.claim_id for v in vs] == [c for c, _ in cc.SHARE_CLAIMS]
    assert all(v.robustness == "fragile: not reproduced when off-HBM tier prices (x) = 2" for v in vs)


def test_arch_verdict_divides_by_the_linear_share():
    assert cc.arch_verdict(0.3, 0.75).computed == pytest.approx(0.4)
    assert math.isnan(cc.arch_verdict(0.3, 0.0).computed)


def test_map_setup_rows():
    assert cc.reference_price_factor([0.5, 1.0, 4.0]) == 1.0
    assert cc.reference_price_factor([0.5, 2.0, 4.0]) == 2.0
    assert cc.interactive_factors_row([2.0, 0.5]) == ("ch5_interactive_factors", "0.5, 2", None)
    assert cc.interactive_factors_row([])[1] == "none"
    assert (
        cc.fid_tokens_row(CFG.fidelity)[1]
        == CFG.fidelity.fidelity_prefill_tokens + CFG.fidelity.fidelity_decode_tokens + 1
    )


def test_old_pricing_map_compares_the_map_at_one_price():
    opts = decide.options(["hbm", "nvme"], [KVPolicy.full()], ["C"])
    floor = decide.FidelityFloor()
    cells, _ = decide.decision_map(BASE, [4096, 16384], [0.0, 0.6], [0.5, 1.0], opts, REUSE, floor)
    om = cc.old_pricing_map(BASE, REUSE, cells, [4096, 16384], [0.0, 0.6], 1.0, opts, floor)
    assert set(om["cells_new"]["ssd_price_factor"]) == {1.0} and len(om["cells_new"]) == 4
    assert om["seconds"] >= 0 and len(om["cells_old"]) == 4
    assert om["moved"].empty  # the same pricing on both sides: nothing moves
    assert om["F_new"] == decide.map_findings(om["cells_new"])
    assert om["F_old"]["n_cells"] == om["F_new"]["n_cells"]


def test_long_runs_row_when_switched_off():
    assert cc.long_runs_row(False) == ("ch5_long_runs", "switched off by the parameters", None)
    name, text, _ = cc.long_runs_row(True)
    assert name == "ch5_long_runs" and text


# ----------------------------------------------------------------------- chapter / evidence page split


def test_sensitivity_sweeps_compute_only_the_named_sweeps():
    opts = decide.options(["hbm", "nvme"], [KVPolicy.full()], ["C", "PD"])
    kw = dict(price_factors=[1.0], nvme_bw_gb_s=[3.5], ai_ssd_bits_grid=[16], linear_shares=[0.0, 0.75],
              transfer_overheads=[1.0])
    ref = BASE.replace(hit_rate=0.6)
    floor = decide.FidelityFloor()
    sw = cc.sensitivity_sweeps(ref, "Llama-3.1-70B", opts, REUSE, floor, sweeps=["lin", "xfer"], **kw)
    assert set(sw) == {"lin", "xfer"}  # the chapter's; the device sweeps are the evidence page's
    assert [r[0] for r in cc.sweep_rows(sw)] == ["ch5_sens_lin_text", "ch5_sens_xfer_text"]
    with pytest.raises(ValueError, match="unknown sensitivity sweep"):
        cc.sensitivity_sweeps(ref, "Llama-3.1-70B", opts, REUSE, floor, sweeps=["price"], **kw)


def test_map_with_flips_is_computed_once_and_read_back(monkeypatch, tmp_path):
    """Chapter 5 and its evidence page show the same map: the second call reads the on-disk cache."""
    monkeypatch.setenv("KVBOOK_CACHE", str(tmp_path))
    monkeypatch.delenv("KVBOOK_NO_CACHE", raising=False)
    from analysis import cache

    monkeypatch.setattr(cache, "code_hash", lambda code, compute=None: "code")  # slow; not what this tests
    calls = []
    real = decide.decision_map

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(decide, "decision_map", counted)
    opts = decide.options(["hbm", "nvme"], [KVPolicy.full()], ["C"])
    args = (BASE, [4096], [0.0, 0.6], [1.0], opts, REUSE, decide.FidelityFloor(), [0.8, 1.25], [0.5, 2.0])
    m = cc.map_with_flips(*args)
    first = len(calls)
    assert first == 3  # the map and the two tier-price ends (GPU rent, fidelity: re-judged, not re-priced)
    assert {"flips", "layout_flips", "flipped_by"} <= set(m["cells"]) and len(m["cells"]) == 2
    assert len(m["found"]) == 1 + len(decide.declared_perturbations([0.8, 1.25], [0.5, 2.0]))
    assert m["seconds"] >= 0 and m["seconds_with_flips"] >= m["seconds"] and len(m["every"]) == 4
    again = cc.map_with_flips(*args)
    assert len(calls) == first  # read back, not recomputed
    pd.testing.assert_frame_equal(again["cells"], m["cells"])
    cc.map_with_flips(BASE, [4096], [0.0], *args[3:])
    assert len(calls) > first  # another grid: another key


def test_decision_map_marks_flipping_cells_in_a_corner_and_keeps_the_text_clear():
    from matplotlib.patches import Polygon

    cells = pd.DataFrame({"context": [4096, 4096, 8192, 8192], "hit_rate": [0.0, 0.6, 0.0, 0.6],
                          "ssd_price_factor": 1.0, "layout": ["hbm", "nvme", "nvme", "nvme"],
                          "policy": "full cache", "mode": "C", "usd_per_mtok": 0.1,
                          "flips": [True, False, True, True]})
    fig = figures.fig_decision_map_answer(cells, ["hbm", "nvme"], 1.0)
    ax = fig.axes[0]
    marks = [p for p in ax.patches if isinstance(p, Polygon)]
    assert len(marks) == 3 and not [p for p in ax.patches if p.get_hatch()]  # no hatch over the text
    assert not [t for t in ax.texts if isinstance(t, matplotlib.text.Annotation)]  # no crowded frontier label
    assert any("flips" in t.get_text() for leg in fig.legends for t in leg.get_texts())
    import matplotlib.pyplot as plt

    plt.close("all")


def test_interactive_map_has_a_colour_legend():
    data = {"colors": ["#112233", "#445566"], "layout_labels": ["HBM only", "+ local DRAM & more"]}
    legend = figures.interactive_legend_html(data)
    assert "#112233" in legend and "#445566" in legend and "+ local DRAM &amp; more" in legend
    full = {**data, "factors": [1.0], "contexts": [4096], "hits": [0.0], "layouts": ["hbm", "dram"],
            "layout_short": ["HBM", "DRAM"], "maps": [], "bars": []}
    assert legend in figures.interactive_map_html(full, plotly_js="book")


def test_kv_policies_read_chapter_4s_runs_once_for_the_three_pages(monkeypatch, tmp_path):
    """Chapter 5, its evidence page and the front page need the same measured policies: cached whole."""
    from analysis import cache
    from analysis.compose import configure

    monkeypatch.setenv("KVBOOK_CACHE", str(tmp_path))
    monkeypatch.delenv("KVBOOK_NO_CACHE", raising=False)
    monkeypatch.setattr(cache, "code_hash", lambda code, compute=None: "code")  # slow; not what this tests
    calls = []

    def fake_measure(policies, budgets, **kw):
        calls.append((tuple(policies), tuple(budgets), kw.get("verbose", False)))
        return [KVPolicy.full()]

    monkeypatch.setattr(configure, "measure", fake_measure)
    cfg = SCHEMA.config(SCHEMA.validate({**SCHEMA.defaults(), "fidelity_long_context": False}))
    first = configure.kv_policies(cfg, source="chapter 4")
    again = configure.kv_policies(cfg, source="chapter 4")
    assert len(calls) == 1 and [p.name for p in again] == [p.name for p in first]  # read back (nan != nan)
    configure.kv_policies(cfg, verbose=True, source="chapter 4")
    assert len(calls) == 2 and calls[-1][2]  # verbose shows the runs: computed, not read back
    other = SCHEMA.config(SCHEMA.validate({**SCHEMA.defaults(), "fidelity_long_context": False,
                                           "kv_budgets": [0.5]}))
    configure.kv_policies(other, source="chapter 4")
    assert len(calls) == 3 and calls[-1][1] == (0.5,)  # other budgets: another key
