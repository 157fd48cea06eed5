"""Issue 27 item 2 with the measured backend: routed experts from AIConfigurator's MoE tables (per-expert
GEMMs from the GEMM table for shapes the MoE tables lack), the expert-parallel all-to-all from SGLang's
DeepEP low-latency tables by node count, both at the busiest device's load (moe_imbalance)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from analysis import forward as fw
from analysis import measured as M
from analysis.disagg import devices

FOLDER = "h100_sxm"
DSV3 = (7168, 2048, 8, 256)  # hidden, expert intermediate, top-k, routed experts


def _rows(kind, framework, key: dict):
    t = M.merged_table(FOLDER, kind, framework)
    p = t.path.parent.parent
    out = []
    for v in {t.key_versions[k] for k in t.key_versions}:
        df = pd.read_parquet(p / v / t.path.name)
        for c, val in key.items():
            df = df[df[c] == val]
        out.append(df.assign(_v=v))
    return t, pd.concat(out)


def test_moe_table_points_are_reproduced_and_the_newest_version_of_each_shape_is_used():
    key = {"moe_dtype": "fp8_block", "hidden_size": 7168, "inter_size": 2048, "topk": 8, "num_experts": 256,
           "distribution": "balanced", "moe_tp_size": 1}
    t, df = _rows("moe", M.DEFAULT_FRAMEWORK, key)
    v = t.key_versions[("fp8_block", *DSV3, "balanced", 1)]
    df = df[(df["_v"] == v) & (df["moe_ep_size"] < M.WIDE_EP_MIN)].groupby(["num_tokens", "moe_ep_size"])[
        "latency"].apply(lambda x: np.exp(np.mean(np.log(x)))).reset_index()
    sec, code = M.moe_seconds(FOLDER, df["num_tokens"], df["moe_ep_size"], *DSV3, "fp8")
    assert np.all(code == 0)
    np.testing.assert_allclose(sec, df["latency"] * 1e-3, rtol=1e-9)
    # a newer version folder that lacks the shape does not hide it (H100's newest holds four shapes)
    assert len(t.version.split(", ")) >= 2


def test_wide_ep_reads_sglangs_deepep_moe_table():
    """From EP 16 on, DeepSeek-V3's shape comes from SGLang's wide-EP generation table (DeepEP +
    DeepGEMM) where it has the point; TensorRT-LLM's table elsewhere (EP 8, or outside its tokens)."""
    t, df = _rows("moe_wideep", M.DEEPEP_FRAMEWORK, {"moe_dtype": "fp8_block", "hidden_size": 7168,
                                                      "distribution": "uniform", "moe_tp_size": 1})
    v = t.key_versions[("fp8_block", *DSV3, "uniform", 1)]
    df = df[(df["_v"] == v) & (df["moe_ep_size"] >= M.WIDE_EP_MIN)].groupby(["num_tokens", "moe_ep_size"])[
        "latency"].apply(lambda x: np.exp(np.mean(np.log(x)))).reset_index()
    sec, code = M.moe_seconds(FOLDER, df["num_tokens"], df["moe_ep_size"], *DSV3, "fp8")
    assert np.all(code == 0)
    np.testing.assert_allclose(sec, df["latency"] * 1e-3, rtol=1e-9)
    # at EP 128 and 16k tokens the DeepEP kernels take well under half of TensorRT-LLM's fused MoE
    trt = M.merged_table(FOLDER, "moe").grid(("fp8_block", *DSV3, "balanced", 1))
    t_trt, _ = M.interpolate(trt, (16384.0, 128.0))
    t_wide, _ = M.moe_seconds(FOLDER, 16384.0, 128.0, *DSV3, "fp8")
    assert float(t_wide) < 0.5 * float(t_trt)


def test_few_tokens_per_expert_are_inefficient():
    """The effect AFD designs exist for: at few tokens per expert a routed token costs far more than at
    many (the table's latency is nearly flat below a GEMM tile), beyond what the roofline's touched-
    expert weight reads give."""
    sec, code = M.moe_seconds(FOLDER, np.array([256.0, 16384.0]), 8.0, *DSV3, "fp8")
    assert np.all(code == 0)
    per_slot = sec / np.array([256.0, 16384.0])
    assert per_slot[0] > 10 * per_slot[1]  # 8 vs 512 tokens per expert at EP 8: over 10x per token


def test_imbalance_reads_the_table_at_the_busiest_devices_load():
    a, _ = M.moe_seconds(FOLDER, 1000.0, 16.0, *DSV3, "fp8", imbalance=2.0)
    b, _ = M.moe_seconds(FOLDER, 2000.0, 16.0, *DSV3, "fp8")
    assert float(a) == pytest.approx(float(b), rel=1e-12)
    c, _ = M.moe_seconds(FOLDER, 1000.0, 16.0, *DSV3, "fp8")
    assert float(a) > float(c)


def _moe_op(model, tokens, n, prec, eff=fw.Efficiency()):
    seen = []
    fw.register_backend("spy", lambda op, e: (seen.append(op) or fw.roofline_backend(op, e)), replace=True)
    try:
        fw.ffn_block(fw.shape(model), prec, eff, 1e15, 3e12, tokens=np.asarray(tokens, dtype=float), n=n,
                     backend="spy")
    finally:
        fw.unregister_backend("spy")
    return next(o for o in seen if o.kind == "moe")


def _price_moe_op(op, gpu="H100-SXM5-80GB", prec="fp8"):
    dev = devices.device(gpu, prec)
    with M.fallbacks() as fb:
        sec, share = fw.get_backend(M.backend_name(gpu))(fw.replace(op, peak=dev["flops"], bw=dev["bw"]),
                                                         fw.Efficiency())
    return sec, share, fb, dev


def test_moe_shapes_without_a_table_are_priced_by_transferred_efficiency_with_their_own_reason():
    """Step-3's experts (7168 x 5120, top-3 of 48) are not in the MoE tables: the routed experts are
    priced by efficiency transfer from the measured shapes (reason 16, recorded; not in the measured
    share), the rest by the roofline."""
    prec = fw.Precision.named("fp8")
    op = _moe_op("Step-3", [64.0, 8192.0], 16.0, prec)
    _, code = M.moe_seconds(FOLDER, op.shape["tokens"], 16.0, 7168, 5120, 3, 48, "fp8")
    assert np.all(code == 9)
    sec, share, fb, dev = _price_moe_op(op)
    assert np.all(share == 0)  # transferred: derived from the tables, not a measured point
    rec = fb.table()
    assert list(rec["reason"]) == [M.REASONS[M.TRANSFERRED]] and rec["evaluations"].sum() == 2
    routed, c = M.moe_transfer_seconds(FOLDER, op.shape["tokens"], 16.0, 7168, 5120, 3, 48, dev["flops"],
                                       dev["bw"], "fp8", op.shape["imbalance"], True)
    assert np.all(c == M.TRANSFERRED)
    eff = fw.Efficiency()
    rest = np.maximum(op.shape["rest_flops"] / (dev["flops"] * eff.compute),
                      op.shape["rest_bytes"] / (dev["bw"] * eff.bandwidth))
    np.testing.assert_allclose(sec, routed + rest, rtol=1e-9)


def test_beyond_every_measured_shapes_range_the_routed_experts_are_per_expert_gemms():
    """Token counts no measured shape reaches (the transfer grid ends at the tables' 16,384 tokens):
    one up- and one down-projection per touched expert from the GEMM table, counted as measured."""
    prec = fw.Precision.named("fp8")
    op = _moe_op("Step-3", [40000.0], 16.0, prec)
    sec, share, fb, _ = _price_moe_op(op)
    assert not fb.by_reason and np.all((share > 0.5) & (share < 1))
    T, e = op.shape["tokens"], op.shape["experts"]
    touched = e * (1 - (1 - 3 / 48) ** T)
    m = np.maximum(T * 3 * e / 48 * fw.Efficiency().moe_imbalance / touched, 1.0)
    up, _ = M.gemm_seconds(FOLDER, m, 2 * 5120, 7168, "fp8")
    down, _ = M.gemm_seconds(FOLDER, m, 7168, 5120, "fp8")
    np.testing.assert_allclose(sec * share, touched * (up + down), rtol=1e-9)


def test_a_measured_moe_shape_is_read_from_its_table_not_transferred():
    """DeepSeek-V3's shape is in H100's block-FP8 MoE table: its price is the table's (measured share
    above 0, no fallback recorded), and differs from its transferred (leave-one-out) price."""
    op = _moe_op("DeepSeek-V3", [64.0, 4096.0], 8.0, fw.Precision.named("fp8"))
    sec, share, fb, dev = _price_moe_op(op)
    assert not fb.by_reason and np.all(share > 0)
    table, c = M.moe_seconds(FOLDER, op.shape["tokens"], 8.0, *DSV3, "fp8", op.shape["imbalance"])
    assert np.all(c == M.MEASURED)
    np.testing.assert_allclose(sec * share, table, rtol=1e-9)
    moved, _ = M.moe_transfer_seconds(FOLDER, op.shape["tokens"], 8.0, *DSV3, dev["flops"], dev["bw"], "fp8",
                                      op.shape["imbalance"])
    assert not np.allclose(moved, table)


def test_the_transfer_leaves_the_priced_shape_out_and_follows_the_roofline_ratio():
    """A shape is priced only from the others (with one other shape left, from that one alone): at
    the same tokens per expert and EP size the price is the other shape's measured seconds times the
    ratio of the two rooflines."""
    h, i, k, E = DSV3
    dt, src = M.moe_sources(FOLDER, "fp8")
    other = (6144, 2048, 8, 256)  # the nearest measured shape (hidden 6144)
    assert dt == "fp8_block" and DSV3 in src and other in src
    g = M.transfer_grid(FOLDER, "fp8", h, i, k, E, True, 1e15, 3e12, sigma=1e-3)  # nearest shape only
    T, ep = 256.0, 8.0
    pred = float(M.interpolate(g, (np.array([T]), np.array([ep])))[0][0])  # a grid point: exact
    Ts = T * (k / E) / (other[2] / other[3])
    meas, c = M.interpolate(src[other], (np.array([Ts]), np.array([ep])))
    roof = M.moe_roofline_seconds(T, ep, h, i, k, E, 1e15, 3e12, 1.0)
    roof_o = M.moe_roofline_seconds(Ts, ep, *other, 1e15, 3e12, 1.0)
    assert c[0] == M.MEASURED and pred == pytest.approx(float(meas[0] * roof / roof_o), rel=1e-6)


def test_leave_one_shape_out_transfer_beats_the_per_expert_gemm_sum():
    """The check that chose the fallback (moe_transfer_validation): every measured shape priced from
    the others, against its table; the transfer's median and 90th-percentile errors are below the
    per-expert GEMM sum's, at decode and at prefill token counts."""
    df = M.moe_transfer_validation(folders=("h100_sxm",), dtypes=("fp8",),
                                   tokens={"decode": (64,), "prefill": (4096,)})
    assert len(df) and set(df["regime"]) == {"decode", "prefill"} and (df["dtype"] == "fp8_block").all()
    assert df[["hidden", "inter", "topk", "experts"]].drop_duplicates().shape[0] >= 10
    s = M.moe_transfer_summary(df)
    assert (s["priced_transfer"] == 1).all()
    assert (s["median_transfer"] < s["median_gemm"]).all() and (s["p90_transfer"] < s["p90_gemm"]).all()
    np.testing.assert_allclose(df["err_gemm"], (df["gemm_s"] / df["measured_s"] - 1).abs())


def test_deepep_all_to_all_by_node_count_and_imbalance():
    t, df = _rows("deepep_ll", M.DEEPEP_FRAMEWORK, {"hidden_size": 7168, "num_topk": 8, "num_experts": 256,
                                                    "node_num": 2})
    v = t.key_versions[(2, *DSV3[:1], 8, 256)]
    r = df[df["_v"] == v].iloc[3]
    sec, code = M.deepep_seconds(FOLDER, r["num_token"], 16.0, 7168, 8, 256)
    assert int(code) == 0
    assert float(sec) == pytest.approx((r["dispatch_avg_t_us"] + r["combine_avg_t_us"]) * 1e-6, rel=1e-9)
    more, _ = M.deepep_seconds(FOLDER, r["num_token"], 16.0, 7168, 8, 256, imbalance=1.5)
    assert float(more) > float(sec)
    # 18 nodes (EP144) were not measured: no table, roofline with the reason; one GPU: no operator
    _, c = M.deepep_seconds(FOLDER, np.array([64.0, 64.0]), np.array([144.0, 1.0]), 7168, 8, 256)
    assert list(c) == [13, M.NO_OP]
    _, c = M.deepep_seconds("gb200", 64.0, 16.0, 7168, 8, 256)
    assert int(c) == 14


def test_a_measured_plan_responds_to_imbalance_in_experts_and_all_to_all():
    s, prec = fw.shape("DeepSeek-V3"), fw.Precision.named("fp8")
    dev = {**devices.device("H100-SXM5-80GB", "fp8"), "backend": M.backend_name("H100-SXM5-80GB")}
    t = {}
    for imb in (1.0, 2.0):
        with fw.ledger() as led, M.fallbacks() as fb:
            fw.colocated_pass_time(s, prec, fw.Efficiency(moe_imbalance=imb), dev, tp=1.0, dp=32.0,
                                   dec_seqs=32 * 128.0, dec_ctx=4096.0)
        t[imb] = led.by_kind
        assert ("H100-SXM5-80GB", "moe") in fb.measured and ("H100-SXM5-80GB", "alltoall") in fb.measured
    assert t[2.0]["moe"] > 1.2 * t[1.0]["moe"] and t[2.0]["alltoall"] > 1.2 * t[1.0]["alltoall"]
    # H800: H100's expert tables, the all-to-all on H800's own links (roofline, reason recorded)
    d8 = {**devices.device("H800-SXM5-80GB", "fp8"), "backend": M.backend_name("H800-SXM5-80GB")}
    with M.fallbacks() as fb:
        fw.colocated_pass_time(s, prec, fw.Efficiency(), d8, tp=1.0, dp=32.0, dec_seqs=4096.0, dec_ctx=4096.0)
    assert any(k[1] == "alltoall" and "own links" in k[2] for k in fb.by_reason)
    assert ("H800-SXM5-80GB", "moe") in fb.measured


def test_transfer_roofline_equals_the_time_models_routed_expert_terms():
    """``measured.moe_roofline_seconds`` (the efficiency transfer's yardstick) restates the routed-expert
    FLOPs and bytes of ``forward.ffn_block``: the two must stay equal (balanced routing, experts divisible
    over the devices), or transferred prices drift from the model they are used in."""
    ops = []

    def capture(op, eff):
        ops.append(op)
        return fw.roofline_backend(op, eff)

    fw.register_backend("capture-moe", capture, replace=True)
    try:
        s = dataclasses.replace(fw.shape("DeepSeek-V3"), n_dense=0, n_shared=0)
        eff = dataclasses.replace(fw.Efficiency(), moe_imbalance=1.0)
        peak, bw = 1e15, 3e12
        for T, n in [(64.0, 8), (4096.0, 32), (256.0, 256)]:
            ops.clear()
            fw.ffn_block(s, fw.Precision(), eff, peak, bw, tokens=T, n=n, backend="capture-moe")
            op = next(o for o in ops if o.kind == "moe")
            flops = op.flops - op.shape["rest_flops"]
            byts = op.bytes_ - op.shape["rest_bytes"]
            mult = 3.0 if s.moe_gated else 2.0
            want = M.moe_roofline_seconds(T, n, s.h, s.moe_inter, s.k_active, s.n_experts, peak, bw,
                                          gated=s.moe_gated)
            assert s.expert_params == pytest.approx(mult * s.h * s.moe_inter, rel=1e-9)
            assert float(want) == pytest.approx(max(flops / peak, byts / bw), rel=1e-9)
    finally:
        fw.unregister_backend("capture-moe")
