"""Chapter 3's claim settings and the helpers the chapter recomputes them with (issue 12): the
MegaScale-Infer cell's setting is the paper's, the AF pipeline's worked example is the search's own
step time, and claim (a)'s recomputation at the SLO ends agrees with the full sweep."""
import numpy as np
import pytest

from analysis import claims, data
from analysis import forward as F
from analysis.disagg import devices, study
from analysis.disagg import search as S
from analysis.forward import Efficiency, Precision


def test_megascale_setting_is_the_papers_own_evaluation():
    """The declared setting of the MegaScale-Infer cell is what data/published.csv transcribes from the
    paper's section 7.1 (median lengths, TBT SLO), and both of its models are configured."""
    c = claims.rule("ch3_val_megascale")
    st = c["setting"]
    assert st["input_tokens"] == data.published("megascale_infer_median_input_tokens")["value"]
    assert st["output_tokens"] == data.published("megascale_infer_median_output_tokens")["value"]
    assert st["tpot_slo_s"] == pytest.approx(data.published("megascale_infer_tbt_slo_s")["value"])
    assert c["reference"]["published"] == "megascale_infer_gain_vs_trtllm_mixtral_dbrx"
    from analysis import specs
    for m in st["model"]:
        assert specs.model(m).is_moe
    ends = {s["name"]: s for s in c["sensitivity"]}["TBT SLO (s)"]
    assert ends["low"] < ends["default"] == st["tpot_slo_s"] < ends["high"]


def test_claims_a_to_c_default_to_the_calibrated_efficiencies():
    for cid in ("ch3_pd_gain", "ch3_pdaf_consistent", "ch3_attention_heavy"):
        eff = {s["name"]: s for s in claims.rule(cid)["sensitivity"]}["efficiencies"]
        assert eff["default"] == "calibrated" and claims.ends(eff) == ["stated"]  # no end at the default
    slo = {s["name"]: s for s in claims.rule("ch3_pd_gain")["sensitivity"]}["TPOT SLO (s)"]
    assert slo["low"] < slo["default"] < slo["high"]


@pytest.mark.parametrize("model,m", [("Qwen3-235B-A22B", 3), ("Llama-3.1-8B", 1), ("DeepSeek-V3", 2)])
def test_pipeline_parts_rebuild_the_split_step(model, m):
    """L * (S - o (S - P)) + t_step from the parts the chapter shows, with P = max(m max(a, f, x),
    a + f + 2x) and S = m (a + f + 2x), equals the step time the search prices (one formula, not a
    second copy; o the declared overlap)."""
    s, prec, eff = F.shape(model), Precision.named("fp8"), Efficiency()
    d = devices.device("H800-SXM5-80GB", "fp8")
    kw = dict(tp=1.0, n_a=8.0, n_f=8.0, m=float(m), dec_seqs=256.0, dec_ctx=4096.0)
    a, f, x = S.split_layer_parts(s, prec, eff, d, d, **kw)
    whole = S._split_step(s, prec, eff, d, d, **kw)
    perfect, serial = max(m * max(a, f, x), a + f + 2 * x), m * (a + f + 2 * x)
    rebuilt = s.n_layers * (serial - eff.overlap * (serial - perfect)) + eff.step_overhead_s
    assert float(whole) == pytest.approx(rebuilt, rel=1e-12)
    assert a > 0 and f > 0 and x > 0


def test_pd_gain_at_an_slo_end_agrees_with_the_full_sweep():
    """study.pd_gain_sweep (modes C and PD only) gives claim (a)'s value of the full ratio sweep."""
    kw = dict(models=["Llama-3.1-8B"], gpus=["H100-SXM5-80GB"], ratios=[1.0, 30.0], output_tokens=200,
              ttft_slo_s=2.0, ttft_slo_s_per_1k_input=0.5, tpot_slo_s=0.03, budget=8, precision="fp8",
              af_over_scaleup=True, enforce_context=False)
    full = study.ratio_sweep(npu_points=[], **kw, jobs=1)
    want = study.claim_inputs(full, kw["gpus"], kw["output_tokens"], kw["precision"])["pd_gain"]
    got = study.pd_gain_sweep(**kw, jobs=1)
    assert np.isfinite(got) and got == pytest.approx(want, rel=1e-12)


def test_unknown_device_name_fails_at_once_with_the_closest_names():
    from analysis.specs import UnknownNameError

    with pytest.raises(UnknownNameError, match="Did you mean 'H100-SXM5-80GB'"):
        S.default_hardware("H100-SXM")
    with pytest.raises(UnknownNameError, match="NPU-250T-64G"):
        S.default_hardware(["H100-SXM5-80GB", "NPU-250T-64"])
    assert S.default_hardware("H100-SXM5-80GB")["D"] == ["H100-SXM5-80GB"]
