"""Chapter 5: every term of TTFT, TPOT and cost per token pinned by a closed form on small cases (deleting
or altering any term of :func:`analysis.compose.pipeline.evaluate` fails one of these), and the two
fidelity sources (published long-context results, chapter 4) with the AI SSD's in-drive quantization."""
import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from analysis import data, forward, kv
from analysis.compose import decide, fidelity, pipeline
from analysis.compose.fidelity import KVPolicy
from analysis.compose.pipeline import ReuseCurve, Scenario
from analysis.disagg import devices
from analysis.specs import model as _model
from analysis.tiering import tiers

REUSE = ReuseCurve(np.linspace(1e5, 2e7, 200), np.linspace(0.005, 1.0, 200), 10000.0, "synthetic")
QEVICT = KVPolicy("qevict_recall", 0.5, hot_ratio=0.55, cold_ratio=0.6, recall_ratio_per_step=2e-4, kl=0.1,
                  top1=0.8)
BASE = Scenario(model="Llama-3.1-70B", gpu="H100-SXM5-80GB", input_tokens=16384, output_tokens=1000)


def _plan(s, r=None):
    """Chapter 3's plan the pipeline used for result ``r`` (overlap searched unless it fell back)."""
    return pipeline.plan(s.mode, s.model, s.gpu, float(s.input_tokens), float(s.output_tokens), s.ttft_slo_s,
                         s.tpot_slo_s, s.budget_devices, s.policy.hot_ratio, s.transfer_overhead,
                         True if r is None else r.plan_overlap)


def _dep(s, tp, hbm_cache=True):
    d = s.tiers.replace(model=s.model, gpu=s.gpu, tp=int(tp), kv_dtype="bf16")
    return d if hbm_cache else d.replace(hbm_cache_fraction=0.0)


def _ratio(s, tl, u):
    """Prefill service time with the realised hits / without (closed form of chapter 2's rule), the
    prefill passes timed by the one time model on the plan unit ``u``'s own configuration as chapter 3
    priced it: its tensor-parallel degree, its (attention side's) data-parallel ranks, the prompts a
    prefill pool batches per pass and its micro-batches; chapter 3's device and efficiencies; the
    policy's on-device KV bytes."""
    I = float(s.input_tokens)
    edges = np.cumsum([t.capacity_tokens for t in tl])
    frac = REUSE.at(edges, I)
    per = s.hit_rate * np.diff(np.concatenate([[0.0], frac])) * I
    H = min(per.sum(), I - 1)
    n = u["size"] if "size" in u else u["n_a"]
    pool = "pbatch" in u
    seqs, m = (u["pbatch"], u.get("ovl", 1.0)) if pool else (1.0, 1.0)
    prec = forward.Precision(kv_bytes=2.0 * s.policy.hot_ratio)

    def pass_s(new, prefix):
        return float(forward.colocated_pass_time(
            forward.shape(s.model), prec, forward.Efficiency(), devices.device(s.gpu), tp=u["tp"],
            dp=n / u["tp"], microbatches=m, pre_seqs=seqs, pre_len=new, pre_prefix=prefix))

    c0, ch = pass_s(I, 0.0), pass_s(I - H, H)
    load = seqs * sum(h * t.bytes_per_token / t.bandwidth + t.latency_s for h, t in zip(per, tl)
                      if h > 0 and math.isfinite(t.bandwidth))
    return (max(ch, load) + min(ch, load) / _model(s.model).n_layers) / c0, H / I


def test_pd_with_reuse_recall_and_cold_copies_term_by_term():
    s = BASE.replace(mode="PD", layout="dram", policy=QEVICT, hit_rate=0.6)
    r = pipeline.evaluate(s, REUSE)
    assert r.feasible, r.reason
    p = _plan(s, r)
    up, ud = ({u["unit"]: u for u in p.units}[k] for k in ("P", "D"))
    I, O = float(s.input_tokens), float(s.output_tokens)
    tp_p = int(up["size"])
    tl = tiers.build_tiers("dram", _dep(s, tp_p))
    ratio, h = _ratio(s, tl, up)
    assert 0 < ratio < 1 and h > 0
    # TTFT: the plan's, scaled by the prefill ratio
    assert r.ttft_s == pytest.approx(p.ttft_s * ratio, rel=1e-12)
    assert r.prefill_ratio == pytest.approx(ratio, rel=1e-12)
    assert r.realized_hit_rate == pytest.approx(h, rel=1e-12)
    # TPOT: the decode unit's plus the recall of batch x recall bytes at the cold tier's bandwidth
    cold = tiers.build_tiers("dram", _dep(s, int(ud["size"])))[-1]
    kv_seq = kv.kv_bytes(s.model, I + O / 2, 1, "bf16")
    stored = cold.bytes_per_token / kv.kv_bytes_per_token_all_layers(s.model, "bf16")
    recall = ud["batch"] * QEVICT.recall_ratio_per_step * kv_seq * stored / cold.bandwidth
    assert recall > 1e-3 * ud["tpot"]  # large enough that dropping it fails below
    assert r.recall_s_per_step == pytest.approx(recall, rel=1e-12)
    tpot = ud["tpot"] + recall
    assert r.tpot_s == pytest.approx(tpot, rel=1e-12)
    # cost: device-seconds x GPU rate, the prefill instances' tiers, the cold copies for the decode time
    dev = up["dev_per_rate"] * ratio + ud["dev_per_rate"] * tpot / ud["tpot"]
    per_m = 1e6 / (I + O)
    gpu = dev * tiers.gpu_usd_per_s(_dep(s, tp_p)) * per_m
    tier = up["dev_per_rate"] * ratio / tp_p * sum(t.usd_per_s for t in tl) * per_m
    cold_usd = (cold.usd_per_s / (cold.capacity_tokens * cold.bytes_per_token) * QEVICT.cold_ratio * kv_seq
                * stored * O * tpot * per_m)
    assert gpu > 0 and tier > 1e-9 * gpu and cold_usd > 1e-9 * gpu
    assert r.gpu_usd_per_mtok == pytest.approx(gpu, rel=1e-12)
    assert r.tier_usd_per_mtok == pytest.approx(tier, rel=1e-12)
    assert r.cold_usd_per_mtok == pytest.approx(cold_usd, rel=1e-12)
    assert r.cold_write_usd_per_mtok == 0.0
    assert r.usd_per_mtok == pytest.approx(gpu + tier + cold_usd, rel=1e-13)
    assert r.output_tokens_per_s_per_device == pytest.approx(O / dev, rel=1e-12)


def test_colocated_prefill_share_scales_tpot_and_device_time():
    s = BASE.replace(mode="C", layout="dram", hit_rate=0.6)
    r = pipeline.evaluate(s, REUSE)
    p = _plan(s, r)
    u = p.units[0]
    I, O = float(s.input_tokens), float(s.output_tokens)
    tp = int(u["size"])
    tl = tiers.build_tiers("dram", _dep(s, tp, hbm_cache=False))  # no prefix cache in a colocated HBM
    ratio, _ = _ratio(s, tl, u)
    B, K, x, t = u["batch"], u["chunk"], u["interference"], u["tpot"]
    f = B * I / (O * K)
    share = f * (x - 1) * (t / (f * x + 1 - f)) / t
    factor = 1 - share + share * ratio
    assert 0 < share < 1 and factor < 1
    assert r.ttft_s == pytest.approx(p.ttft_s * ratio, rel=1e-12)
    assert r.tpot_s == pytest.approx(t * factor, rel=1e-12)
    per_m = 1e6 / (I + O)
    dev = u["dev_per_rate"] * factor
    assert r.gpu_usd_per_mtok == pytest.approx(dev * tiers.gpu_usd_per_s(_dep(s, tp)) * per_m, rel=1e-12)
    assert r.tier_usd_per_mtok == pytest.approx(dev / tp * sum(t.usd_per_s for t in tl) * per_m, rel=1e-12)


class _FlatRecall:
    """A recall model with a fixed time per step and a fixed write charge per request."""

    def __init__(self, s, usd):
        self.s, self.usd = s, usd

    def recall_s(self, tier, bytes_per_step, **context):
        return self.s

    def write_usd(self, tier, bytes_written):
        return self.usd


def test_recall_model_hook_prices_recalls_and_writes():
    s = BASE.replace(mode="PD", layout="dram", policy=QEVICT)
    ref = pipeline.evaluate(s, REUSE)
    ud = {u["unit"]: u for u in _plan(s, ref).units}["D"]
    r = pipeline.evaluate(s.replace(recall_model=_FlatRecall(0.002, 1e-4)), REUSE)
    assert r.recall_s_per_step == 0.002
    assert r.tpot_s == pytest.approx(ud["tpot"] + 0.002, rel=1e-12)
    # written once, charged by chapter 2's replacement rule: wear above the copies' share of the capex
    I, O = 16384.0, 1000.0
    cold = tiers.build_tiers("dram", _dep(s, int(ud["size"])))[-1]
    stored = cold.bytes_per_token / kv.kv_bytes_per_token_all_layers(s.model, "bf16")
    cold_bytes = QEVICT.cold_ratio * kv.kv_bytes(s.model, I + O / 2, 1, "bf16") * stored
    capex = cold.capex_usd_per_s / (cold.capacity_tokens * cold.bytes_per_token) * cold_bytes * O * r.tpot_s
    assert 0 < capex < 1e-4
    assert r.cold_write_usd_per_mtok == pytest.approx((1e-4 - capex) * 1e6 / (I + O), rel=1e-12)
    # wear below the amortisation is already paid by it
    r_small = pipeline.evaluate(s.replace(recall_model=_FlatRecall(0.002, 0.5 * capex)), REUSE)
    assert r_small.cold_write_usd_per_mtok == 0.0
    assert r.usd_per_mtok == pytest.approx(r.gpu_usd_per_mtok + r.tier_usd_per_mtok + r.cold_usd_per_mtok
                                           + r.cold_write_usd_per_mtok, rel=1e-13)
    # the default is the sequential-bandwidth model, exactly
    assert pipeline.evaluate(s.replace(recall_model=pipeline.SequentialRecall()), REUSE) == ref
    with pytest.raises(pipeline.ComposeError, match="recall_model"):
        pipeline.evaluate(s.replace(recall_model=object()), REUSE)


def test_plan_split_names_the_modes():
    p = _plan(BASE.replace(mode="PD"))
    units, up, ud = pipeline.prefill_decode_units("PD", p)
    assert up["unit"] == "P" and ud["unit"] == "D" and up is units["P"]
    units, up, ud = pipeline.prefill_decode_units("AF", _plan(BASE.replace(mode="AF")))
    assert up is ud and up["unit"] == "AF" and 0 < up["prefill_share"] < 1  # one unit runs both phases
    with pytest.raises(pipeline.ComposeError, match="does not separate"):
        pipeline.prefill_decode_units("4-way", p)
    old = dataclasses.replace(p, units=[{k: v for k, v in u.items() if k != "prefill_share"}
                                        for u in p.units])
    with pytest.raises(pipeline.ComposeError, match="do not separate prefill"):
        pipeline.prefill_decode_units("PD", old)


@pytest.mark.parametrize("mode", ["AF", "PDAF"])
def test_split_units_prefill_share_and_tiers_per_instance_second(mode):
    """AF: only the unit's prefill share of its time shrinks with the reuse ratio (as colocated serving);
    PDAF: the prefill unit's time does. The prefix tiers sit on the attention devices of the prefill unit
    and are paid per instance-second (device-seconds over the unit's attention + FFN devices)."""
    s = BASE.replace(mode=mode, layout="dram", hit_rate=0.6)
    r = pipeline.evaluate(s, REUSE)
    p = _plan(s, r)
    u = p.units[0]
    I, O = float(s.input_tokens), float(s.output_tokens)
    tp = int(u["n_a"])
    tl = tiers.build_tiers("dram", _dep(s, tp, hbm_cache=(mode != "AF")))
    ratio, _ = _ratio(s, tl, u)
    share = u["prefill_share"]
    factor = 1 - share + share * ratio
    assert (0 < share < 1) if mode == "AF" else share == 1.0
    assert r.ttft_s == pytest.approx(p.ttft_s * ratio, rel=1e-12)
    per_m = 1e6 / (I + O)
    dev = u["dev_per_rate"] * factor
    other = sum(v["dev_per_rate"] for v in p.units[1:])
    assert r.gpu_usd_per_mtok == pytest.approx((dev + other) * tiers.gpu_usd_per_s(_dep(s, tp)) * per_m,
                                               rel=1e-12)
    assert r.tier_usd_per_mtok == pytest.approx(dev / u["devices"] * sum(t.usd_per_s for t in tl) * per_m,
                                                rel=1e-12)
    if mode == "AF":
        assert r.tpot_s == pytest.approx(u["tpot"] * factor, rel=1e-12)


def test_transfer_overhead_divides_the_gpus_own_nic():
    from analysis.disagg import devices
    for gpu in ("A800-SXM4-80GB", "B300-SXM-288GB"):  # 100 and 800 Gbit/s NICs per GPU (not the default)
        nic = devices.device(gpu)["net"]
        assert nic != devices.DEFAULT_NET_BW
        assert all(h["net"] == nic / 2.0 for h in pipeline.hardware(gpu, 2.0)["P"])


# ------------------------------------------------------------------------------ fidelity sources

def _pub(key):
    return data.published(key)["value"]


def test_published_table_ratios_come_from_the_transcribed_rows():
    t = fidelity.published_table()
    assert set(t["policy"]) >= {"full", "kivi2", "kivi4", "snapkv"}
    assert np.allclose(t.loc[t["policy"] == "full", "ratio"], 1.0)
    models = ["Llama-2-7B", "Llama-2-13B", "Llama-2-7B-Chat", "Llama-2-13B-Chat", "Falcon-7B", "Mistral-7B"]
    want = [_pub(f"kvfid:longbench8:{m}:kivi2:0.125") / _pub(f"kvfid:longbench8:{m}:full:1") for m in models]
    got = fidelity.published_fidelity("kivi2", 0.5)
    assert got["budget"] == 0.125 and got["n"] == 6
    assert got["ratio_mean"] == pytest.approx(np.mean(want)) and got["ratio_min"] == pytest.approx(min(want))
    # the largest published budget at or below the policy's
    assert fidelity.published_fidelity("snapkv", 0.25)["budget"] == 0.16
    assert fidelity.published_fidelity("snapkv", 0.5)["budget"] == 0.32
    assert fidelity.published_fidelity("snapkv", 0.005) is None
    assert fidelity.published_fidelity("qevict_recall", 0.5) is None


def test_published_source_nearest_to_the_served_model_in_scale():
    assert fidelity.model_scale("Llama-3-70B-Instruct") == 70 and fidelity.model_scale("Falcon-7B") == 7
    with pytest.raises(ValueError, match="size"):
        fidelity.model_scale("Llama-Large")
    assert fidelity.served_scale("Llama-3.1-70B") == pytest.approx(70.6, rel=0.02)
    # at 70B only the 70B rows count: in each benchmark the largest published budget at or below 0.5
    lb = _pub("kvfid:longbench16:Llama-3-70B-Instruct:snapkv:0.2758") / \
        _pub("kvfid:longbench16:Llama-3-70B-Instruct:full:1")
    nh = _pub("kvfid:niah8k:Llama-3-70B-Instruct:snapkv:0.0156") / \
        _pub("kvfid:niah8k:Llama-3-70B-Instruct:full:1")
    got = fidelity.published_fidelity("snapkv", 0.5, scale=70.6)
    assert got["models"] == "Llama-3-70B-Instruct" and got["n"] == 2
    assert got["ratio_mean"] == pytest.approx((lb + nh) / 2)
    assert got["ratio_min"] == pytest.approx(min(lb, nh))
    # at 7B the Mistral rows (SnapKV's own table) are nearest
    got7 = fidelity.published_fidelity("snapkv", 0.5, scale=7.2)
    assert got7["models"] == "Mistral-7B-Instruct-v0.2" and got7["budget"] == 0.32
    # KIVI has no 70B rows: the nearest published scale is 13B
    assert fidelity.published_fidelity("kivi2", 0.5, scale=70.6)["models"] == "Llama-2-13B, Llama-2-13B-Chat"
    with pytest.raises(ValueError, match="scale"):
        fidelity.published_fidelity("snapkv", 0.5, scale=0.0)
    pol = fidelity.with_source([KVPolicy("snapkv", 0.5, top1=0.5)], "published", model="Llama-3.1-70B")[0]
    assert pol.score_ratio == pytest.approx((lb + nh) / 2) and "Llama-3-70B" in pol.evidence


def _run(name, model, ctx, pols):
    return {"name": name, "model": model, "context_tokens": ctx, "stale": [], "policies": pols}


def test_long_context_fidelity_takes_each_architectures_longest_run_and_the_worst_of_them():
    short = [KVPolicy.full(), KVPolicy("snapkv", 0.25, hot_ratio=0.3, cold_ratio=0.0, top1=0.99, kl=0.01),
             KVPolicy("kivi4", 0.25, hot_ratio=0.25, top1=0.98), QEVICT]
    runs = [_run("a_short", "m1", 2000, [KVPolicy("snapkv", 0.2, top1=0.5, kl=2.0, ppl_change=1.0)]),
            _run("a_long", "m1", 8000, [KVPolicy("snapkv", 0.2, top1=0.9, kl=0.1, ppl_change=0.02),
                                        KVPolicy("snapkv", 0.35, top1=0.99, kl=0.0, ppl_change=0.0)]),
            _run("b_long", "m2", 16000, [KVPolicy("snapkv", 0.1, top1=0.95, kl=0.3, ppl_change=0.01),
                                         KVPolicy("snapkv", 0.2, top1=0.8, kl=0.05, ppl_change=0.03)])]
    out = fidelity.with_long_context(short, runs)
    s = out[1]
    # m1: its longest run (a_long, not a_short) at budget 0.2 (largest <= 0.25); m2: b_long at 0.2;
    # then the worst of the two, value by value
    assert (s.top1, s.kl, s.ppl_change) == (0.8, 0.1, 0.03)
    assert (s.hot_ratio, s.budget) == (0.3, 0.25)  # bytes stay the policy's own
    assert "a_long" in s.evidence and "b_long" in s.evidence and "a_short" not in s.evidence
    assert out[2] == short[2] and out[0] == short[0] and out[3] == QEVICT  # not covered: unchanged
    assert fidelity.with_long_context(short, []) == short


def test_long_context_runs_read_the_committed_artifacts():
    from analysis.artifacts import list_artifacts, read_artifact

    names = [n for n in list_artifacts() if n.startswith("qevict_long_")]
    runs = fidelity.long_context_runs()
    assert [r["name"] for r in runs] == names
    for r in runs:
        s = read_artifact(r["name"]).tables["summary"]
        assert r["context_tokens"] == pytest.approx(s["context_tokens"].mean())
        assert r["policies"] == fidelity.from_summary(s)


def test_snapkv_rows_are_the_mean_of_their_transcribed_tasks():
    df = data.table("published.csv")
    rows = df[df["key"].str.startswith("kvfid:longbench16:Mistral")]
    assert len(rows) == 4
    for _, r in rows.iterrows():
        scores = [float(x) for x in r["notes"].split(": ", 1)[1].split(";")[0].split()]
        assert len(scores) == 16 and float(r["value"]) == pytest.approx(np.mean(scores), abs=1e-4)


def test_published_table_needs_a_full_cache_row_and_a_well_formed_key():
    import pandas as pd

    df = pd.DataFrame({"key": ["kvfid:b:m:kivi2:0.125"], "value": [40.0], "source": ["x"]})
    with pytest.raises(ValueError, match="without a full-cache row"):
        fidelity.published_table(df)
    with pytest.raises(ValueError, match="expected kvfid"):
        fidelity.published_table(pd.DataFrame({"key": ["kvfid:b:m"], "value": [1.0], "source": ["x"]}))


def test_with_source_uses_published_where_it_covers_else_chapter4():
    ch4 = [KVPolicy.full(), KVPolicy("snapkv", 0.25, hot_ratio=0.26, top1=0.5), QEVICT]
    pub = fidelity.with_source(ch4, "published")
    assert pub[0] == ch4[0] and pub[2] == QEVICT
    assert pub[1].source == "published" and pub[1].score_ratio == pytest.approx(
        fidelity.published_fidelity("snapkv", 0.25)["ratio_mean"])
    assert fidelity.with_source(ch4, "chapter 4") == ch4
    floor = decide.FidelityFloor(0.9, 0.05, 0.95)
    assert not floor.admits(ch4[1]) and floor.admits(pub[1])  # the map moves between the sources
    assert not decide.FidelityFloor(0.9, 0.05, 0.999).admits(pub[1])
    with pytest.raises(ValueError, match="source"):
        fidelity.with_source(ch4, "rumour")


def test_in_drive_quantization_is_a_policy_under_the_floor():
    kivi4_ch4 = [KVPolicy("kivi4", 0.5, hot_ratio=0.3, top1=0.97, ppl_change=0.01),
                 KVPolicy("kivi4", 0.25, hot_ratio=0.25, top1=0.8, ppl_change=0.2)]
    assert fidelity.in_drive_policy(16, []).source == "exact"
    p4 = fidelity.in_drive_policy(4, kivi4_ch4, "published")
    assert p4.source == "published" and p4.score_ratio == pytest.approx(
        fidelity.published_fidelity("kivi4", 0.25)["ratio_mean"])
    c4 = fidelity.in_drive_policy(4, kivi4_ch4, "chapter 4")
    assert c4.source == "chapter 4" and c4.top1 == 0.8  # the smallest measured budget: the least residual
    assert fidelity.in_drive_policy(8, kivi4_ch4, "published").source == "none"
    opts = decide.options(["dram", "ai_ssd"], [KVPolicy.full()], ["PD"])
    s = BASE.replace(hit_rate=0.6)
    for ind, ok in (({4: c4}, False), ({4: p4}, True), ({}, False)):
        df = decide.evaluate_options(s, opts, REUSE, decide.FidelityFloor(0.9, 0.05, 0.95, in_drive=ind))
        got = df.set_index("layout")["fidelity_ok"]
        assert bool(got["dram"]) and bool(got["ai_ssd"]) == ok, ind
    s16 = decide.tiers_scaled(s, ai_ssd_bits=16)
    exact = decide.evaluate_options(s16, opts, REUSE, decide.FidelityFloor())
    assert exact["fidelity_ok"].all()


# ------------------------------------------------------------------- uncertainty and rules of thumb

def test_map_uncertainty_marks_cells_that_flip_and_gives_ranges():
    opts = decide.options(["hbm", "dram", "nvme"], [KVPolicy.full()], ["C", "PD"])
    args = (BASE, [4096, 16384], [0.0, 0.6], [1.0], opts, REUSE, decide.FidelityFloor())
    cells, _ = decide.decision_map(*args)
    none, f0 = decide.map_uncertainty(*args, perturbations=[], cells=cells)
    assert not none["flips"].any() and len(f0) == 1
    # pricing the tiers 1000x dearer must flip every cell that chose a tier beyond HBM
    dear = decide.Perturbation("tier prices", "× 1000", lambda b, fl: (decide.tiers_scaled(
        b, **{k: 1000.0 for k in decide.TIER_PRICE_FIELDS}), fl))
    out, found = decide.map_uncertainty(*args, perturbations=[dear], cells=cells)
    off = cells["layout"] != "hbm"
    assert off.any() and (out.loc[off, "flips"]).all() and (out.loc[off, "layout_flips"]).all()
    assert (out.loc[off, "flipped_by"] == "× 1000").all()
    v, lo, hi = decide.finding_range(found, "share_off_hbm")
    assert v == decide.map_findings(cells)["share_off_hbm"] and lo == 0.0 and hi == v
    # the declared ranges: both ends of GPU rent and tier prices, and the published spread
    ps = decide.declared_perturbations((0.8, 1.25), (0.5, 2.0))
    assert [p.input for p in ps] == ["GPU rent"] * 2 + ["tier prices"] * 2 + ["published fidelity"]
    b, fl = ps[1].apply(BASE, decide.FidelityFloor())
    assert b.gpu_rent_usd_per_s == pytest.approx(1.25 * tiers.gpu_usd_per_s(tiers.Deployment(gpu=BASE.gpu)))
    assert ps[-1].apply(BASE, decide.FidelityFloor())[1].published_ratio == "min"


def test_published_spread_judges_the_worst_model():
    p = KVPolicy("kivi2", 0.5, hot_ratio=0.2, source="published", score_ratio=0.98, score_ratio_min=0.91)
    assert decide.FidelityFloor(min_score_ratio=0.95).admits(p)
    assert not decide.FidelityFloor(min_score_ratio=0.95, published_ratio="min").admits(p)


def test_rules_of_thumb_follow_the_cells():
    rows = []
    for f in (0.5, 1.0):
        for c in (4096, 65536):
            for h in (0.0, 0.4, 0.8):
                lay = "hbm" if h == 0 else ("nvme" if f < 1 or c > 8192 else "dram")
                rows.append({"ssd_price_factor": f, "context": c, "hit_rate": h, "layout": lay,
                             "policy": "kivi4 @ 50%", "mode": "PD" if c > 8192 else "C",
                             "option": f"{lay}|{c > 8192}", "usd_per_mtok": 1.0, "hbm_only_usd_per_mtok": 1.2,
                             "baseline_usd_per_mtok": 1.5, "colocated_usd_per_mtok": 1.1})
    R = decide.rules_of_thumb(pd.DataFrame(rows), 1.0)
    assert R["hbm"] == "Keep the KV cache in HBM alone only where requests share no prefix."
    assert R["tier"].startswith("From a reuse of 40% on")
    assert "kivi4 @ 50%" in R["policy"] and "100%" in R["policy"]
    assert R["mode"].startswith("Disaggregate from a prompt of 65,536 tokens")
    assert "33%" in R["ssd"]  # (4096, 40%) and (4096, 80%) of the 6 cells change with the SSD price


def test_fast_perturbations_equal_recomputing_the_map():
    kivi2 = KVPolicy("kivi2", 0.5, hot_ratio=0.2, source="published", score_ratio=0.98, score_ratio_min=0.91)
    opts = decide.options(["hbm", "dram", "ai_ssd"], [KVPolicy.full(), kivi2], ["C", "PD"])
    floor = decide.FidelityFloor(in_drive={4: kivi2.__class__("ai_ssd_int4", 0.25, source="published",
                                                               score_ratio=0.99, score_ratio_min=0.93)})
    args = (BASE, [4096, 16384], [0.0, 0.6], [0.5, 1.0], opts, REUSE, floor)
    cells, every = decide.decision_map(*args)
    for pt in decide.declared_perturbations((0.5, 3.0), (1.0,)):
        assert pt.reprice is not None or pt.input == "tier prices"
        if pt.reprice is None:
            continue
        fast = decide.cells_from_every(cells, pt.reprice(every, floor, opts))
        b, fl = pt.apply(BASE, floor)
        slow, _ = decide.decision_map(b, *args[1:6], fl)
        cols = ["option", "usd_per_mtok", "hbm_only_usd_per_mtok", "baseline_usd_per_mtok"]
        pd.testing.assert_frame_equal(fast[cols], slow[cols], rtol=1e-12)
    # the worst model's fidelity removes the published kivi2 (0.91 < 0.95) and the in-drive int4 (0.93)
    worst = decide.rejudge(every, floor.replace(published_ratio="min"), opts)
    assert not worst.loc[worst["policy"] == kivi2.label, "fidelity_ok"].any()
    assert not worst.loc[worst["layout"] == "ai_ssd", "fidelity_ok"].any()


def test_chapter_parameters_declare_the_floor_and_the_sources():
    from analysis import params
    from analysis.compose import configure as cconf
    from analysis.compose import params as cparams

    sch = cparams.SCHEMA
    p = sch.defaults()
    floor = cconf.fidelity_floor(sch.config(p), [])
    assert sorted(floor.in_drive) == [2, 4, 8, 16]
    assert floor.in_drive[4].source == "published" and floor.in_drive[2].source == "published"
    assert floor.in_drive[8].source == "none" and floor.in_drive[16].source == "exact"
    assert floor.min_score_ratio == p["fidelity_min_score_ratio"] and floor.top1 == p["fidelity_floor_top1"]
    assert cconf.fidelity_floor(sch.config(p), [], "chapter 4").in_drive[4].source == "none"  # no ch. 4 KIVI
    with pytest.raises(params.ParameterError, match="fidelity_source"):
        params.validate(sch, {"fidelity_source": "rumour"}, partial=True)
    with pytest.raises(params.ParameterError, match="gpu_rent_range"):
        params.validate(sch, {"gpu_rent_range": [0.0, 2.0]}, partial=True)


def test_mode_shares_and_the_cells_a_new_mode_changes():
    opts = decide.options(["hbm", "dram"], [KVPolicy.full()], ["C", "AF"])
    cells, every = decide.decision_map(BASE, [4096, 16384], [0.0, 0.6], [1.0], opts, REUSE,
                                       decide.FidelityFloor())
    sh = decide.mode_shares(cells, ["C", "AF"])
    assert list(sh.index) == ["C", "AF"] and sh.sum() == pytest.approx(1.0)
    ok = cells.dropna(subset=["usd_per_mtok"])
    assert sh["AF"] == pytest.approx((ok["mode"] == "AF").mean())
    # dropping a mode changes exactly the cells it won; keeping every mode changes none
    assert decide.cells_changed(cells, every, ["C", "AF"]) == 0.0
    for drop, keep in (("AF", ["C"]), ("C", ["AF"])):
        assert decide.cells_changed(cells, every, keep) == pytest.approx((ok["mode"] == drop).mean())
    assert decide.cells_changed(cells, every, ["AF"]) > 0  # colocated serving wins cells here
    # AF's premium: its cheapest option over the cell's cheapest, median over the cells
    ratios = []
    for _, g in every[every["admissible"]].groupby(["context", "hit_rate"]):
        ratios.append(g.loc[g["mode"] == "AF", "usd_per_mtok"].min() / g["usd_per_mtok"].min() - 1)
    assert decide.mode_premium(every, "AF") == pytest.approx(float(np.median(ratios)), rel=1e-12)
    assert decide.mode_premium(every, "C") == 0.0 and math.isnan(decide.mode_premium(every, "PD"))
    with pytest.raises(pipeline.ComposeError, match="not priced"):
        decide.cells_changed(cells, every, ["PD"])
