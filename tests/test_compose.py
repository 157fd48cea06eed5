"""Chapter 5's composition: consistency with chapters 2-3, monotonicity, clear errors."""
import math

import numpy as np
import pytest

from analysis import kv, params, specs
from analysis.compose import decide, fidelity, pipeline
from analysis.compose.fidelity import KVPolicy
from analysis.compose.pipeline import ComposeError, ReuseCurve, Scenario
from analysis.disagg import search
from analysis.tiering import tiers

# a synthetic reuse curve (no trace needed): hits grow linearly up to 20M tokens of capacity
REUSE = ReuseCurve(np.linspace(1e5, 2e7, 200), np.linspace(0.005, 1.0, 200), 10000.0, "synthetic")
QEVICT = KVPolicy(
    "qevict_recall", 0.5, hot_ratio=0.55, cold_ratio=0.6, recall_ratio_per_step=2e-4, kl=0.1, top1=0.8
)
KIVI = KVPolicy("kivi4", 0.5, hot_ratio=0.5, kl=0.01, top1=0.95)
BASE = Scenario(model="Llama-3.1-70B", gpu="H100-SXM5-80GB", input_tokens=16384, output_tokens=1000)


def _direct(mode, I, O, slo=(10.0, 0.1), gpu="H100-SXM5-80GB", model="Llama-3.1-70B"):
    from analysis.disagg import study

    p = search.best_plan(  # chapter 3's plan on its grid (overlap searched)
        mode, model, search.Workload(I, O), search.SLO(*slo), search.default_hardware(gpu), budget=64,
        grid=study.gpu_grid(),
    )
    g = tiers.gpu_usd_per_s(tiers.Deployment(gpu=gpu))
    return O / p.tokens_per_s_per_device * g / (I + O) * 1e6


@pytest.mark.parametrize("mode", ["C", "PD", "AF", "3-way", "PDAF"])
@pytest.mark.parametrize("I", [4096, 32768])
def test_everything_off_equals_the_other_chapters(mode, I):
    r = pipeline.evaluate(BASE.replace(input_tokens=I, mode=mode, layout="hbm", hit_rate=0.0), REUSE)
    assert r.feasible, r.reason
    assert r.tier_usd_per_mtok == 0 and r.cold_usd_per_mtok == 0 and r.prefill_ratio == 1.0
    assert r.usd_per_mtok == pytest.approx(_direct(mode, I, 1000), rel=1e-12)


def test_extra_tiers_without_reuse_only_add_their_own_cost():
    base = pipeline.evaluate(BASE, REUSE)
    for layout in ("dram", "cxl", "nvme", "qlc", "ai_ssd"):
        r = pipeline.evaluate(BASE.replace(layout=layout), REUSE)
        assert r.gpu_usd_per_mtok == pytest.approx(base.gpu_usd_per_mtok, rel=1e-12)
        assert r.tier_usd_per_mtok > 0
        assert r.usd_per_mtok == pytest.approx(base.usd_per_mtok + r.tier_usd_per_mtok, rel=1e-12)


def test_reuse_through_a_fast_tier_lowers_gpu_cost():
    r0 = pipeline.evaluate(BASE.replace(layout="nvme", mode="PD"), REUSE)
    r1 = pipeline.evaluate(BASE.replace(layout="nvme", mode="PD", hit_rate=0.6), REUSE)
    assert 0 < r1.realized_hit_rate <= 0.6 + 1e-12
    assert r1.prefill_ratio < 1 and r1.gpu_usd_per_mtok < r0.gpu_usd_per_mtok


PRICE_FIELDS = [
    "dram_usd_per_byte",
    "cxl_usd_per_byte",
    "nvme_usd_per_byte",
    "qlc_usd_per_byte",
    "ai_ssd_usd_per_byte",
]


@pytest.mark.parametrize("layout", ["dram", "cxl", "nvme", "qlc", "ai_ssd"])
@pytest.mark.parametrize("policy", [KVPolicy.full(), QEVICT])
def test_cost_non_decreasing_in_every_price(layout, policy):
    s = BASE.replace(layout=layout, policy=policy, hit_rate=0.6, mode="PD")
    for f in PRICE_FIELDS + ["gpu"]:
        costs = []
        for k in (0.0, 0.5, 1.0, 2.0, 8.0):
            if f == "gpu":
                rent = tiers.gpu_usd_per_s(tiers.Deployment(gpu=s.gpu))
                c = pipeline.evaluate(s.replace(gpu_rent_usd_per_s=max(rent * k, 1e-12)), REUSE).usd_per_mtok
            else:
                c = pipeline.evaluate(decide.tiers_scaled(s, **{f: k}), REUSE).usd_per_mtok
            costs.append(c)
        assert all(np.isfinite(costs)), (f, costs)
        assert np.all(np.diff(costs) >= -1e-12 * max(costs)), (layout, f, costs)


@pytest.mark.parametrize("mode", ["C", "PD"])
def test_cost_non_increasing_in_storage_bandwidth(mode):
    s = BASE.replace(layout="nvme", policy=QEVICT, hit_rate=0.8, mode=mode)
    costs = [
        pipeline.evaluate(decide.tiers_scaled(s, nvme_bw_override=bw * 1e9), REUSE).usd_per_mtok
        for bw in (0.5, 1, 2, 4, 8, 16, 32)
    ]
    assert np.all(np.diff(costs) <= 1e-12 * max(costs)), costs
    assert costs[-1] < costs[0]
    # the cpu-bounce path is never faster than gpu-direct
    b = pipeline.evaluate(
        decide.tiers_scaled(s, cpu_copy_cores=1).replace(
            tiers=s.tiers.replace(data_path="cpu_bounce", cpu_copy_cores=1)
        ),
        REUSE,
    ).usd_per_mtok
    assert b >= pipeline.evaluate(s, REUSE).usd_per_mtok - 1e-15


def test_decision_map_cheapest_is_monotone_in_ssd_price():
    opts = decide.options(["hbm", "dram", "nvme", "ai_ssd"], [KVPolicy.full(), KIVI, QEVICT], ["C", "PD"])
    cells, every = decide.decision_map(BASE, [4096, 16384], [0.0, 0.6], [0.25, 1.0, 4.0], opts, REUSE, 0.75)
    assert len(cells) == 12 and len(every) == 12 * len(opts)
    piv = cells.pivot_table(index=["context", "hit_rate"], columns="ssd_price_factor", values="usd_per_mtok")
    assert np.all(np.diff(piv.to_numpy(), axis=1) >= -1e-12)
    # the cheapest is never dearer than the HBM-only, full-cache, colocated baseline
    assert np.all(cells["usd_per_mtok"] <= cells["baseline_usd_per_mtok"] + 1e-15)
    assert set(decide.frontier_changes(cells).columns) == {"ssd_price_factor", "frontier", "where"}


def test_fidelity_floor_excludes_policies():
    bad = KVPolicy("snapkv", 0.25, hot_ratio=0.26, kl=2.0, top1=0.3)
    opts = decide.options(["hbm"], [KVPolicy.full(), bad], ["C"])
    df = decide.evaluate_options(BASE, opts, REUSE, 0.75)
    assert df.set_index("policy").loc[bad.label, "admissible"] == False  # noqa: E712
    assert decide.cheapest(df)["policy"] == "full cache"


def test_recall_policy_needs_an_off_device_tier_and_its_capacity():
    r = pipeline.evaluate(BASE.replace(policy=QEVICT, layout="hbm"), REUSE)
    assert not r.feasible and "off-HBM tier" in r.reason
    tiny = BASE.replace(policy=QEVICT, layout="dram", tiers=BASE.tiers.replace(local_dram_bytes=1e6))
    r = pipeline.evaluate(tiny, REUSE)
    assert not r.feasible and "exceed" in r.reason


def test_compressed_policy_raises_throughput():
    full = pipeline.evaluate(BASE.replace(input_tokens=65536), REUSE)
    comp = pipeline.evaluate(BASE.replace(input_tokens=65536, policy=KIVI), REUSE)
    assert comp.output_tokens_per_s_per_device > full.output_tokens_per_s_per_device


def test_transfer_overhead_leaves_colocated_unchanged_and_slows_pd():
    c1 = pipeline.evaluate(BASE, REUSE).usd_per_mtok
    c8 = pipeline.evaluate(BASE.replace(transfer_overhead=8.0), REUSE).usd_per_mtok
    assert c1 == pytest.approx(c8, rel=1e-12)
    p1 = pipeline.evaluate(BASE.replace(mode="PD"), REUSE)
    p8 = pipeline.evaluate(BASE.replace(mode="PD", transfer_overhead=64.0), REUSE)
    assert (not p8.feasible) or p8.usd_per_mtok >= p1.usd_per_mtok - 1e-15


def test_linear_share_shrinks_kv_per_token():
    m = specs.model("Llama-3.1-70B")
    for share in (0.25, 0.5, 0.75):
        m2 = decide.with_linear_share(m, share)
        assert kv.kv_bytes_per_token(m2) == pytest.approx(kv.kv_bytes_per_token(m) * (1 - share), rel=0.02)
    assert decide.with_linear_share(m, 0.0) is m
    with pytest.raises(ComposeError, match="share"):
        decide.with_linear_share(m, 1.0)


def test_kimi_linear_decodes_faster_than_its_all_mla_variant():
    kl = specs.model("Kimi-Linear-48B-A3B")
    a = decide.decode_throughput(kl, 131072 - 1000, 1000, "H100-SXM5-80GB", 0.1)
    b = decide.decode_throughput(kl.replace(n_linear_layers=0), 131072 - 1000, 1000, "H100-SXM5-80GB", 0.1)
    assert a["feasible"] and b["feasible"]
    assert a["tokens_per_s_per_device"] > b["tokens_per_s_per_device"]


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(layout="floppy"), "layout must be one of"),
        (dict(layout="pool"), "layout must be one of"),
        (dict(mode="4-way"), "mode must be one of C, PD, AF, 3-way, PDAF"),
        (dict(hit_rate=1.5), "hit_rate must be in"),
        (dict(transfer_overhead=0.5), "transfer_overhead must be >= 1"),
        (dict(input_tokens=0), "input_tokens must be"),
        (dict(ttft_slo_s=-1.0), "ttft_slo_s must be"),
        (dict(input_tokens=200000), "exceed Llama-3.1-70B's context window"),
    ],
)
def test_bad_scenarios_raise_clear_errors(change, match):
    with pytest.raises(ComposeError, match=match):
        pipeline.evaluate(BASE.replace(**change), REUSE)


def test_unknown_model_and_gpu_name_the_allowed_values():
    with pytest.raises(specs.UnknownNameError, match="Allowed"):
        pipeline.evaluate(BASE.replace(model="Llama-9"), REUSE)
    with pytest.raises(specs.UnknownNameError):
        pipeline.evaluate(BASE.replace(gpu="Z100"), REUSE)


def test_bad_options_and_policies():
    with pytest.raises(ComposeError, match="unknown layouts/modes"):
        decide.options(["hbm", "tape"], [KVPolicy.full()], ["C"])
    with pytest.raises(ValueError, match="hot_ratio"):
        KVPolicy("x", 0.5, hot_ratio=0.0)
    with pytest.raises(ValueError, match="top1"):
        KVPolicy("x", 0.5, hot_ratio=0.5, top1=1.5)
    pytest.importorskip("analysis.qevict.experiment", reason="chapter 4's package is not in this checkout")
    with pytest.raises(ValueError, match="unknown KV policies"):
        fidelity.measure(["lru"], [0.5])
    with pytest.raises(ValueError, match="budgets"):
        fidelity.measure(["kivi4"], [1.5])
    with pytest.raises(ValueError, match="budget"):  # chapter 4's own check, before any model run
        fidelity.measure(["kivi4"], [0.05], prefill_tokens=64)
    with pytest.raises(ValueError, match="documents"):
        fidelity.measure(["kivi4"], [0.5], documents=["nonsense"])


def test_reuse_curve_validation_and_scaling():
    with pytest.raises(ComposeError):
        ReuseCurve(np.array([1.0, 2.0]), np.array([0.5, 0.9]), 100.0)
    f1 = REUSE.at([1e6, 5e6, 1e9], 10000)
    assert np.all(np.diff(f1) >= 0) and f1[-1] == 1.0
    # twice as long prompts need twice the capacity for the same fraction
    assert REUSE.at(2e6, 20000) == pytest.approx(REUSE.at(1e6, 10000))


def test_from_summary_reduces_chapter4_rows_to_ratios():
    import pandas as pd

    rows = []
    for doc, scale in (("docs:a", 1.0), ("docs:b", 2.0)):
        rows.append(
            dict(
                document=doc,
                policy="full",
                budget=1.0,
                kl=0.0,
                top1=1.0,
                dppl=0.0,
                fits=True,
                bytes_full=1000 * scale,
                bytes_quantized=0,
                bytes_cold=0,
                recall_bytes=0,
                decode_steps=4,
            )
        )
        rows.append(
            dict(
                document=doc,
                policy="qevict_recall",
                budget=0.5,
                kl=0.2 * scale,
                top1=0.75,
                dppl=0.1,
                fits=True,
                bytes_full=400 * scale,
                bytes_quantized=100 * scale,
                bytes_cold=300 * scale,
                recall_bytes=40 * scale,
                decode_steps=4,
            )
        )
    full, q = fidelity.from_summary(pd.DataFrame(rows))
    assert full == KVPolicy.full()
    assert q.name == "qevict_recall" and q.budget == 0.5
    assert q.hot_ratio == pytest.approx(0.5) and q.cold_ratio == pytest.approx(0.3)
    assert q.recall_ratio_per_step == pytest.approx(0.01) and q.top1 == pytest.approx(0.75)
    assert q.kl == pytest.approx(0.3) and q.ppl_change == pytest.approx(0.1)
    with pytest.raises(ValueError, match="lacks columns"):
        fidelity.from_summary(pd.DataFrame(rows).drop(columns=["bytes_cold"]))
    with pytest.raises(ValueError, match="no full-cache stream"):
        fidelity.from_summary(pd.DataFrame(rows[1::2]))


def test_chapter_schema_rejects_bad_parameters():
    from analysis.compose.params import SCHEMA as sch
    with pytest.raises(params.ParameterError, match="layouts"):
        params.validate(sch, {"layouts": ["hbm", "pool"]}, partial=True)
    with pytest.raises(params.ParameterError, match="hit_rates"):
        params.validate(sch, {"hit_rates": [0.2, 1.2]}, partial=True)
    with pytest.raises(params.ParameterError, match="modes"):
        params.validate(sch, {"modes": ["4-way"]}, partial=True)
    with pytest.raises(params.ParameterError, match="kv_policies"):
        params.validate(sch, {"kv_policies": ["lru"]}, partial=True)


def test_fidelity_floor_needs_both_top1_and_perplexity():
    f = decide.FidelityFloor(0.9, 0.05)
    assert f.admits(KVPolicy.full())
    assert f.admits(KVPolicy("kivi4", 0.5, hot_ratio=0.5, top1=0.95, ppl_change=0.01))
    assert not f.admits(KVPolicy("kivi2", 0.5, hot_ratio=0.5, top1=0.95, ppl_change=0.2))
    assert not f.admits(KVPolicy("snapkv", 0.5, hot_ratio=0.5, top1=0.85, ppl_change=0.0))
    with pytest.raises(ComposeError, match="top1"):
        decide.FidelityFloor(1.5, 0.05)
    with pytest.raises(ComposeError, match="fidelity floor"):
        decide.evaluate_options(BASE, decide.options(["hbm"], [KVPolicy.full()], ["C"]), REUSE, "high")


def test_findings_and_sentences_never_print_nan():
    opts = decide.options(["hbm", "nvme"], [KVPolicy.full(), KIVI], ["C", "PD"])
    cells, _ = decide.decision_map(
        BASE, [4096, 16384], [0.0, 0.6], [1.0], opts, REUSE, decide.FidelityFloor()
    )
    F = decide.map_findings(cells)
    assert F["n_cells"] == 4 and 0 <= F["share_off_hbm"] <= 1
    assert "nan" not in F["hbm_max_hit_text"] and "nan" not in F["top_offhbm_layout"]
    df = decide.sweep(
        BASE.replace(hit_rate=0.6),
        [0.5, 4.0],
        lambda b, v: decide.tiers_scaled(b, nvme_usd_per_byte=v),
        opts,
        REUSE,
        decide.FidelityFloor(),
    )
    text = decide.describe_sweep(df)
    assert "cheapest option" in text and "nan" not in text
    none = decide.sweep(
        BASE, [1.0], lambda b, v: b.replace(tpot_slo_s=1e-6), opts, REUSE, decide.FidelityFloor()
    )
    assert decide.describe_sweep(none) == "no option is admissible at any value"
    assert math.isnan(decide.group_change(none, ["PD"]))


def test_colocated_hbm_holds_no_prefix_cache_but_a_prefill_instance_does():
    c = pipeline.evaluate(BASE.replace(mode="C", layout="hbm", hit_rate=0.6), REUSE)
    p = pipeline.evaluate(BASE.replace(mode="PD", layout="hbm", hit_rate=0.6), REUSE)
    assert c.realized_hit_rate == 0 and c.prefill_ratio == 1.0
    assert p.realized_hit_rate > 0


def test_plan_searched_with_overlap_falls_back_without_it_when_the_composition_fails():
    s = BASE.replace(layout="dram", policy=QEVICT, hit_rate=0.6, mode="PD")
    first = pipeline._evaluate(s, REUSE, True)  # chapter 3's best plan (overlap) holds a batch too big
    assert not first.feasible and "cold copies" in first.reason
    r = pipeline.evaluate(s, REUSE)
    assert r.feasible and not r.plan_overlap and r == pipeline._evaluate(s, REUSE, False)
    # with nothing that could fail after the plan, the overlap plan stands
    assert pipeline.evaluate(BASE.replace(layout="dram", hit_rate=0.6, mode="PD"), REUSE).plan_overlap


def test_committed_measurement_is_used_only_for_its_own_configuration(tmp_path, monkeypatch):
    """results/compose_measured_policies stands in for chapter 4's run only where it was computed with the
    same configuration (and model and code): another budget computes, and so does a missing artifact."""
    import pandas as pd

    from analysis.compose import configure
    from analysis.compose.params import SCHEMA as COMPOSE

    kw = configure.measurement_kwargs(COMPOSE.config(COMPOSE.defaults()))
    art, why = fidelity.usable_measurement(fidelity.measurement_config(**kw))
    assert art is not None, why  # the committed one is current (tests/test_artifacts.py checks it too)
    ran = []
    fake = type("E", (), {"summary": art.tables["summary"]})
    monkeypatch.setattr(fidelity.experiment, "run_experiment", lambda c, verbose=False: ran.append(c) or fake)
    got = fidelity.measure(**kw)
    assert not ran and got == fidelity.from_summary(art.tables["summary"])
    other = dict(kw, budgets=[0.3])
    _, why = fidelity.usable_measurement(fidelity.measurement_config(**other))
    assert "other params" in why
    fidelity.measure(**other)
    assert len(ran) == 1 and ran[0].policies.budgets == [0.3]
    monkeypatch.setenv("KVBOOK_RESULTS", str(tmp_path))
    assert "no committed compose_measured_policies" in fidelity.usable_measurement(ran[0])[1]
    assert isinstance(art.tables["summary"], pd.DataFrame)

