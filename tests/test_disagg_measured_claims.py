"""Chapter 3's claims (a)-(c) on the measured operator backend (issue 27 item 5): every plan of the
search reports the share of its time priced from measured kernel tables; the sweep with the roofline
backend is the sweep as before; NPU cells have no tables, so the measured sweep takes them from the
roofline sweep unchanged."""
import numpy as np
import pandas as pd
import pytest

from analysis import forward
from analysis.disagg import chapter, study
from analysis.disagg import search as S

GPU = "H100-SXM5-80GB"
NPUS = ["NPU-250T-64G", "NPU-1000T-64G"]
GRID = S.Grid(sizes=(1, 2, 4, 8), batches=(1, 16, 256), chunks=(1024, 4096), prefill_batches=(1, 4),
              utilisations=(0.85,), microbatches=(1, 2))
KW = dict(models=["Llama-3.1-8B"], ratios=[4.0], output_tokens=200, ttft_slo_s=2.0,
          ttft_slo_s_per_1k_input=0.5, tpot_slo_s=0.05, budget=8, precision="fp8", af_over_scaleup=True,
          enforce_context=False, jobs=1)


def _cell(hw, model="Llama-3.1-8B"):
    wl = S.Workload(800, 200)
    return pd.DataFrame(study.run_cell(model, GPU, hw, wl, S.SLO(3.0, 0.05), budget=8, precision="fp8",
                                       objective="device", grid=GRID, enforce_context=False))


def test_plan_measured_share_weights_each_unit_by_its_device_share():
    p = S.Plan("PD", True, units=[{"device_share": 0.25, "measured_share": 1.0},
                                  {"device_share": 0.75, "measured_share": 0.2}])
    assert p.measured_share == pytest.approx(0.25 + 0.75 * 0.2)
    assert np.isnan(S.Plan("PD", False).measured_share)
    # a unit without a record (the roofline before the ledger) counts as unmeasured
    assert S.Plan("C", True, units=[{"device_share": 1.0}]).measured_share == 0.0


@pytest.mark.slow
def test_measured_share_is_a_fraction_and_zero_without_tables():
    """Measured backend on a GPU with tables: every feasible plan's share in (0, 1] (GEMMs are
    measured, attention cores are not, so below 1); the roofline and an NPU (no tables): exactly 0."""
    roof = _cell(S.default_hardware(GPU))
    meas = _cell(study.measured_hardware(S.default_hardware(GPU), "fp8"))
    f = meas[meas["feasible"]]
    assert len(f) and ((f["measured_share"] > 0) & (f["measured_share"] < 1)).all()
    assert (roof[roof["feasible"]]["measured_share"] == 0).all()
    assert not np.allclose(meas["tps_device"], roof["tps_device"], equal_nan=True)  # the tables change prices
    npu = study.measured_hardware(S.default_hardware(NPUS), "fp8")
    assert npu == S.default_hardware(NPUS)  # no tables: the names stay, priced by the roofline


def test_measured_hardware_replaces_only_gpus_with_tables():
    hw = study.measured_hardware({"P": [GPU, NPUS[0]], "D": ["H800-SXM5-80GB"]}, "fp8")
    assert hw["P"][0]["backend"] == f"measured:{GPU}" and hw["P"][1] == NPUS[0]
    assert hw["D"][0]["backend"].startswith("measured:H800")
    with pytest.raises(S.SearchError, match="backend must be one of"):
        study.ratio_sweep(gpus=[GPU], npu_points=[], **KW, backend="tables")


@pytest.mark.slow
def test_the_roofline_sweep_is_the_sweep_as_before_and_npu_cells_are_the_same_measured(monkeypatch):
    """backend='roofline' (the default) prices as the search always did (measured share 0), and the
    measured backend leaves NPU cells exactly as the roofline prices them: chapter.measured_sweep may
    take them from the roofline sweep."""
    roof = study.ratio_sweep(gpus=[GPU], npu_points=NPUS, **KW)
    again = study.ratio_sweep(gpus=[GPU], npu_points=NPUS, **KW, backend="roofline")
    pd.testing.assert_frame_equal(roof, again)
    assert (roof["measured_share"].fillna(0) == 0).all()
    meas = study.ratio_sweep(gpus=[GPU], npu_points=NPUS, **KW, backend="measured")
    npu = roof["hardware"] != GPU
    pd.testing.assert_frame_equal(meas[npu.to_numpy()].reset_index(drop=True),
                                  roof[npu].reset_index(drop=True))
    g = meas[(meas["hardware"] == GPU) & meas["feasible"]]
    assert (g["measured_share"] > 0).all()
    # the chapter's measured sweep: GPU cells measured (its own cache entry), NPU cells the roofline's
    inputs = dict(models=KW["models"], gpus=[GPU], npu_points=NPUS, ratios=KW["ratios"],
                  output_tokens=KW["output_tokens"], ttft_slo_s=2.0, ttft_slo_s_per_1k_input=0.5,
                  tpot_slo_s=0.05, budget=8, precision="fp8", af_over_scaleup=True, enforce_context=False,
                  role_hardware=None)
    monkeypatch.setattr(chapter.cache, "cached", lambda namespace, fn, **kw: fn(**kw))  # no disk cache here
    got = chapter.measured_sweep(inputs, forward.Efficiency(), roof)
    key = ["hardware", "mode"]
    pd.testing.assert_frame_equal(got.sort_values(key).reset_index(drop=True),
                                  meas.sort_values(key).reset_index(drop=True), check_like=True)
