"""Validation of the chapter-3 simulator against the measured silicon runs: no silent skips,
a grouped and deterministic split, finite predictions, and the calibration machinery."""
import numpy as np
import pandas as pd
import pytest

from analysis.disagg import validate as V


@pytest.fixture(scope="module")
def rows():
    return V.load_rows()


def test_every_row_is_predicted_or_listed(rows):
    p = V.predict(rows)
    ok = p["skip_reason"] == ""
    assert len(p) == 5221
    assert np.isfinite(p.loc[ok, "pred_ttft_ms"]).all() and (p.loc[ok, "pred_ttft_ms"] > 0).all()
    assert np.isfinite(p.loc[ok, "pred_tpot_ms"]).all() and (p.loc[ok, "pred_tpot_ms"] > 0).all()
    assert p.loc[~ok, "pred_ttft_ms"].isna().all()
    # the rows the book cannot predict all say why
    assert (p.loc[~ok, "skip_reason"].str.len() > 0).all()
    assert ok.sum() > 0.6 * len(p)
    assert (
        p.loc[p["model_path"] == "zhipuai/GLM-5", "skip_reason"].str.contains("not in data/models.csv")
    ).all()


def test_split_is_grouped_and_deterministic(rows):
    again = V.load_rows()
    assert (rows["split"] == again["split"]).all()
    per_group = rows.groupby("group")["split"].nunique()
    assert (per_group == 1).all()
    share = (rows["split"] == "train").mean()
    assert 0.35 < share < 0.65


def test_calibration_vector_round_trip():
    c = V.Calibration()
    v = c.vector()
    lo, hi = V.Calibration.bounds()
    assert len(v) == len(lo) == len(hi)
    c2 = V.Calibration.from_vector(v)
    assert np.allclose(c2.vector(), v)


def test_queueing_raises_ttft_with_concurrency(rows):
    """Closed-loop model: for one configuration, predicted TTFT grows with the client count."""
    p = V.predict(rows)
    ok = p[(p["skip_reason"] == "") & (p["mode"] == "agg")]
    grp = ok.groupby("group").filter(lambda g: g["concurrency"].nunique() >= 4)
    g = grp[grp["group"] == grp["group"].iloc[0]].sort_values("concurrency")
    assert np.all(np.diff(g["pred_ttft_ms"].to_numpy()) >= -1e-9)


def test_assumed_workers_is_a_separate_sensitivity():
    r = V.load_rows(assume_workers=True)
    assert (r["skip_reason"] == "").sum() > (V.load_rows()["skip_reason"] == "").sum()


def test_one_efficiency_pair_per_silicon_and_dropped_fields_fixed():
    """GB200 (GB300) takes the fitted efficiencies of B200 (B300), the same die; the step overhead is
    not fitted (fixed at 0) and the vector holds only the fitted constants."""
    lo, hi = V.Calibration.bounds()
    v = (lo + hi) / 2
    v[V.FIT_SYSTEMS.index("b200_sxm")] = 0.37
    c = V.Calibration.from_vector(v)
    assert c.compute["gb200"] == c.compute["b200_sxm"] == 0.37
    assert c.bandwidth["gb300"] == c.bandwidth["b300_sxm"]
    assert "gb200" not in V.FIT_SYSTEMS and len(v) == len(lo)
    assert c.step_overhead_s == {b: 0.0 for b in V.BACKENDS}
    assert "step_overhead_s" not in V.fitted_fields()


def test_at_bounds_names_the_pinned_constants():
    lo, hi = V.Calibration.bounds()
    v = (lo + hi) / 2
    c = V.Calibration.from_vector(v)
    assert V.at_bounds(c) == []
    v[V.FIT_SYSTEMS.index("b200_sxm") + len(V.FIT_SYSTEMS)] = hi[0]  # B200 bandwidth at 1.0
    i = len(v) - 2 * len(V.BACKENDS) + V.BACKENDS.index("sglang")  # SGLang's per-layer overhead at 0
    v[i] = 0.0
    assert V.at_bounds(V.Calibration.from_vector(v)) == ["bandwidth/b200_sxm", "layer_overhead_s/sglang"]


def test_measured_backend_reads_each_runs_own_tables(rows):
    """With ``backend="measured"`` each group of runs is priced by the kernel tables of its own GPU and
    serving framework, most of its operator time comes from them, and the predictions change; the
    roofline reads none. An unknown backend is an error naming the choices."""
    ok = rows[rows["skip_reason"] == ""]
    sub = ok.groupby(["system", "backend"]).head(3)
    groups = V._prepare(sub, 50e9, "measured")
    for G in groups:
        r = sub.loc[G["index"]]
        assert r["backend"].nunique() == 1 and r["system"].nunique() == 1
        name = G["dev"]["backend"]
        assert name.startswith(f"measured:{V.SYSTEM_MAP[r['system'].iloc[0]]}")
        assert ("@" in name) == (r["backend"].iloc[0] != "trtllm")  # trtllm: the default framework
    m = V.predict(sub, V.Calibration(), backend="measured")
    r = V.predict(sub, V.Calibration())
    assert (r["measured_share"] == 0).all()
    assert m["measured_share"].median() > 0.5 and (m["measured_share"] <= 1).all()
    assert not np.allclose(m["pred_tpot_ms"], r["pred_tpot_ms"])
    with pytest.raises(ValueError, match="roofline, measured"):
        V.predict(sub, backend="tables")


def test_relaxed_bounds_only_for_fitted_fields(rows):
    lo, hi = V.Calibration.bounds({"compute": (0.05, 3.0)})
    lo0, hi0 = V.Calibration.bounds()
    n = len(V.FIT_SYSTEMS)
    assert (hi[:n] == 3.0).all() and (hi[n:] == hi0[n:]).all() and (lo == lo0).all()
    with pytest.raises(ValueError, match="not fitted"):
        V.fit(rows, relax={"step_overhead_s": (0.0, 1.0)})


def test_measured_backend_keeps_weight_only_gemms_off_the_compute_dtype_table(rows):
    """Runs whose weights are stored in fewer bytes than their compute dtype (int4 weight-only) get the
    backend whose GEMMs fall back (the bf16 table would price another kernel); fp8 runs keep the tables."""
    ok = rows[rows["skip_reason"] == ""]
    w4 = ok[ok["moe_quant_mode"] == "int4_wo"].head(2)
    f8 = ok[ok["gemm_quant_mode"] == "fp8"].head(2)
    assert len(w4) and len(f8)
    assert all(G["dev"]["backend"].endswith("+weight-only") for G in V._prepare(w4, 50e9, "measured"))
    assert not any(G["dev"]["backend"].endswith("+weight-only") for G in V._prepare(f8, 50e9, "measured"))


def test_validation_without_sensitivities_keeps_the_calibrated_predictions():
    """``study.validation(sensitivities=False)`` drops only the uncalibrated and assumed-worker
    predictions: the same calibration and calibrated predictions as the full call."""
    from analysis.disagg import study

    full = study.validation(max_nfev=2)
    lean = study.validation(max_nfev=2, sensitivities=False)
    assert lean["uncalibrated"] is None and lean["assumed_workers"] is None
    assert full["uncalibrated"] is not None and full["assumed_workers"] is not None
    assert lean["calibration"] == full["calibration"]
    cols = ["pred_ttft_ms", "pred_tpot_ms"]
    assert lean["pred"][cols].equals(full["pred"][cols])


def test_a_measurement_listed_twice_is_predicted_once(rows):
    """The export lists some runs twice (the database dump and a CSV export; DeepSeek-R1's also as
    DeepSeek-V3's): every later copy is listed as a duplicate of a predictable row with the same setting and
    the same measured TTFT and TPOT, and no two predictable rows share them, so none is both trained on and
    held out."""
    ok = rows[rows["skip_reason"] == ""]
    key = [repr(k) for k in ok[list(V.DUPLICATE_KEY)].itertuples(index=False)]
    assert len(set(key)) == len(key)
    dup = rows[rows["skip_reason"].str.startswith("duplicate of ")]
    assert len(dup) > 100  # hundreds in the 2026 export
    by_id = ok.set_index("id")
    for _, r in dup.head(50).iterrows():
        kept = by_id.loc[r["skip_reason"].split()[2]]
        assert all((pd.isna(r[c]) and pd.isna(kept[c])) or r[c] == kept[c] for c in V.DUPLICATE_KEY)
    # the database dump's copy is the one kept where both are listed
    both = dup[dup["source_kind"] == "db"]
    kept_kind = by_id.loc[[s.split()[2] for s in both["skip_reason"]], "source_kind"]
    assert both.empty or not kept_kind.eq("export").any()
