"""A recorded MoE split (AIConfigurator's moe_tp_size / moe_ep_size) priced as the engines move the
tokens (issue 27 item 4): no all-to-all where attention is not data-parallel (every device holds every
token), the all-to-all among expert-parallel groups under attention data parallelism, a gather and
reduce-scatter around tensor-split experts; tensor-split experts 1 / moe_tp as wide and without the
load-imbalance factor. The validation passes each run's recorded split."""
import functools

import numpy as np
import pytest

from analysis import forward as F
from analysis.disagg import validate as V
from analysis.forward import Efficiency, Precision

S = F.shape("DeepSeek-V3")
PREC = Precision(weight_bytes=1.0, kv_bytes=1.0, act_bytes=2.0, compute="fp8")
EFF = Efficiency()
LINK = 450e9


def _comm(**kw):
    return float(F.comm_time(S, PREC, EFF, LINK, tokens=8192.0, **kw))


def test_moe_split_reads_the_recorded_fields():
    got = F.moe_split(np.array([8.0, 8.0, 8.0, 16.0, 8.0]), np.array([8.0, 1.0, np.nan, 4.0, 2.0]),
                      np.array([1.0, 8.0, 4.0, 4.0, np.nan]))
    # recorded pair; recorded pair; tp from n / ep; recorded mixed pair; nothing usable -> experts spread
    np.testing.assert_array_equal(got, [8.0, 1.0, 2.0, 4.0, 1.0])


def test_no_all_to_all_without_attention_data_parallelism():
    """TP8 attention with experts spread (moe_ep 8) or split (moe_tp 8): the two all-reduces per layer
    only, as a dense model's TP8 layer; the default (no recorded split) still prices the all-to-all."""
    ar = float(F.allreduce_time(S, PREC, EFF, LINK, tokens=8192.0, n=8.0, per_layer=2))
    for moe_tp in (1.0, 8.0):
        assert _comm(tp=8.0, dp=1.0, moe_tp=moe_tp) == pytest.approx(ar, rel=1e-12)
    assert _comm(tp=8.0, dp=1.0) > 2 * ar


def test_expert_parallel_under_data_parallelism_keeps_the_all_to_all():
    assert _comm(tp=1.0, dp=8.0, moe_tp=1.0) == pytest.approx(_comm(tp=1.0, dp=8.0), rel=1e-12)
    assert _comm(tp=1.0, dp=8.0, moe_tp=1.0) > 0


def test_tensor_split_experts_under_data_parallelism_gather_and_scatter():
    """tp 1, dp 8, moe_tp 8: each device receives the other 7 ranks' 1,024 rows and reduce-scatters
    them back: 2 x 7 x 1,024 x h x 2 bytes over the link, plus two latencies, per MoE layer."""
    by = 2 * 7 * 1024 * S.h * 2.0
    per_layer = by / (LINK * EFF.link) + 2 * EFF.collective_latency_s
    assert _comm(tp=1.0, dp=8.0, moe_tp=8.0) == pytest.approx(S.n_moe * per_layer, rel=1e-9)


def test_tensor_split_experts_have_no_imbalance_and_narrow_gemms():
    """Compute-bound (bandwidth unlimited): the routed FLOPs per device are 2 T k P_e / 8 for moe_tp 8
    (every expert's eighth, all tokens, no imbalance) against the spread experts' 2 T k P_e / 8 x the
    imbalance factor."""
    kw = dict(tokens=8192.0, n=8.0)
    eff = Efficiency(moe_imbalance=1.5)
    spread = float(F.ffn_block(S, PREC, eff, 1e15, 1e30, moe_tp=1.0, **kw))
    split = float(F.ffn_block(S, PREC, eff, 1e15, 1e30, moe_tp=8.0, **kw))
    rest = 2.0 * 8192 * S.n_shared * S.expert_params / 8 + 2.0 * 8192 * S.h * S.n_experts / 8
    routed = 2.0 * 8192 * S.k_active * S.expert_params / 8
    dense = S.n_dense * 2.0 * 8192 * S.dense_params / 8  # DeepSeek-V3's first dense layers
    assert split == pytest.approx((dense + S.n_moe * (routed + rest)) / (1e15 * eff.compute), rel=1e-9)
    assert spread == pytest.approx((dense + S.n_moe * (1.5 * routed + rest)) / (1e15 * eff.compute), rel=1e-9)


def test_validation_prices_the_recorded_split():
    """A PD run whose prefill is TP8 with expert parallelism (moe_ep 8, attention not data-parallel)
    prices no all-to-all (before: the default split's all-to-all, also in the worst over-predicted run,
    H200 cfg303); one with attention data parallelism and expert parallelism does."""
    rows = V.load_rows()
    ok = (rows["skip_reason"] == "") & (rows["mode"] == "disagg")
    tep = rows[ok & (rows["prefill_tp_size"] == 8) & (rows["prefill_attention_dp_size"] == 1)
               & (rows["prefill_moe_ep_size"] == 8) & (rows["decode_attention_dp_size"] == 1)].head(1)
    dep = rows[ok & (rows["decode_attention_dp_size"] == 8) & (rows["decode_moe_ep_size"] == 8)].head(1)
    assert len(tep) == 1 and len(dep) == 1
    for one, expect in ((tep, False), (dep, True)):
        with F.ledger() as led:
            V.predict(one, V.Calibration())
        a2a = float(np.sum(led.by_kind.get("alltoall", 0.0)))
        assert (a2a > 0) is expect


# --- tensor-split experts' measured efficiency (AIConfigurator's MoE table; issue 27 item 4) -------------

def test_split_ratio_is_the_measured_tables_ratio():
    """moe_split_ratio reads the MoE table at (moe_tp, moe_ep) and at full expert parallelism for the
    same tokens: DeepSeek-V3 FP8 on eight H200s, split eight ways, is slower than spread (> 1) and
    equals the ratio of analysis.measured.moe_seconds at the two layouts."""
    from analysis import measured as M

    tok = np.array([64.0, 1024.0, 8192.0])
    args = (S.h, S.moe_inter, S.k_active, S.n_experts)
    got = M.moe_split_ratio("h200_sxm", tok, 8.0, 8.0, *args, "fp8")
    split, _ = M.moe_seconds("h200_sxm", tok, np.ones_like(tok), *args, "fp8", 1.0, moe_tp=8.0)
    spread, _ = M.moe_seconds("h200_sxm", tok, np.full_like(tok, 8.0), *args, "fp8", 1.0, moe_tp=1.0)
    np.testing.assert_allclose(got, split / spread, rtol=1e-9)
    assert np.all(got > 1.2)
    assert M.SPLIT_SUBSTITUTES[("h200_sxm", "fp8", args, 8.0, 8.0)][1] == args  # the shape itself
    np.testing.assert_array_equal(M.moe_split_ratio("h200_sxm", tok, 8.0, 1.0, *args, "fp8"), 1.0)


def test_split_ratio_of_an_unmeasured_shape_is_the_nearest_shapes_and_recorded():
    """A shape the table lacks reads the nearest measured shape's ratio at the same tokens per expert,
    and the substitution is recorded (never silently)."""
    from analysis import measured as M

    key = (7000, 2000, 8, 256)  # near DeepSeek-V3's (7168, 2048, 8, 256), not in the table
    got = M.moe_split_ratio("h200_sxm", [1024.0], 8.0, 8.0, *key, "fp8")
    ref = M.moe_split_ratio("h200_sxm", [1024.0], 8.0, 8.0, S.h, S.moe_inter, S.k_active, S.n_experts, "fp8")
    assert float(got[0]) == pytest.approx(float(ref[0]), rel=1e-9)
    used = M.SPLIT_SUBSTITUTES[("h200_sxm", "fp8", key, 8.0, 8.0)][1]
    assert used == (S.h, S.moe_inter, S.k_active, S.n_experts)


def test_tensor_split_experts_are_priced_at_the_measured_slowdown():
    """Compute-bound: with the GPU's measured slowdown, the routed FLOPs of tensor-split experts are scaled
    by the measured split/spread ratio (without it, the roofline prices the two layouts alike)."""
    from analysis import measured as M

    kw = dict(tokens=np.array([8192.0]), n=8.0, moe_tp=8.0)
    eff = Efficiency(moe_imbalance=1.0)
    plain = float(F.ffn_block(S, PREC, eff, 1e15, 1e30, **kw)[0])
    fn = functools.partial(M.moe_split_slowdown, silicon="h200_sxm", weight_bytes=PREC.weight_bytes)
    slow = float(F.ffn_block(S, PREC, eff, 1e15, 1e30, split_slowdown=fn, **kw)[0])
    r = float(M.moe_split_ratio("h200_sxm", [8192.0], 8.0, 8.0, S.h, S.moe_inter, S.k_active, S.n_experts,
                                "fp8")[0])
    routed = S.n_moe * 2.0 * 8192 * S.k_active * S.expert_params / 8 / (1e15 * eff.compute)
    assert slow - plain == pytest.approx((r - 1.0) * routed, rel=1e-9)
    # spread experts (moe_tp 1) are unchanged by it
    spread = dict(kw, moe_tp=1.0)
    assert float(F.ffn_block(S, PREC, eff, 1e15, 1e30, split_slowdown=fn, **spread)[0]) == pytest.approx(
        float(F.ffn_block(S, PREC, eff, 1e15, 1e30, **spread)[0]), rel=1e-12)


def test_validation_prices_tensor_split_runs_slower_than_the_plain_roofline():
    """The validation passes each run's GPU's measured slowdown: a run with tensor-split experts (moe_tp 8) is
    predicted slower than with the folder removed; a spread run (moe_tp 1) is not changed."""
    rows = V.load_rows()
    ok = rows["skip_reason"] == ""
    split = rows[ok & (rows["mode"] == "agg") & (rows["moe_tp_size"] == 8) & (rows["moe_ep_size"] == 1)
                 & (rows["model"] == "DeepSeek-V3") & (rows["system"] == "h200_sxm")].head(1)
    spread = rows[ok & (rows["mode"] == "agg") & (rows["moe_tp_size"] == 1) & (rows["moe_ep_size"] == 8)
                  & (rows["model"] == "DeepSeek-V3")].head(1)
    assert len(split) == 1 and len(spread) == 1
    for one, slower in ((split, True), (spread, False)):
        groups = V._prepare(one, 50e9)
        with_t = V.predict(one, V.Calibration(), _groups=groups)["pred_tpot_ms"].iloc[0]
        for G in groups:
            G["dev"].pop("moe_split_slowdown")
        without = V.predict(one, V.Calibration(), _groups=groups)["pred_tpot_ms"].iloc[0]
        assert bool(with_t > without * 1.01) is slower
        if not slower:
            assert with_t == pytest.approx(without, rel=1e-12)
