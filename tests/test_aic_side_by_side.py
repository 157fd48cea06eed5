"""AIConfigurator side by side (issue 27 item 3): the driver's case planning (no aiconfigurator needed)
and the comparison of its committed predictions with the simulator's and the measured runs."""
import numpy as np
import pandas as pd
import pytest

from analysis.artifacts import Artifact
from analysis.disagg import aic_run as A
from analysis.disagg import side_by_side as SBS


def _agg_row(**kw):
    r = dict(id="m_h200_trtllm_agg_1024x128_c8_cfg1", mode="agg", model_path="Qwen/Qwen3-32B",
             system="h200_sxm", backend="trtllm", backend_version="1.0.0rc3", isl="1024", osl="128",
             gemm_quant_mode="fp8", moe_quant_mode="", batch_size="8.0", tp_size="2", pp_size="1",
             attention_dp_size="", moe_tp_size="", moe_ep_size="", prefill_batch_size="",
             prefill_num_workers="4", decode_batch_size="", decode_num_workers="")
    r.update(kw)
    return r


def test_estimate_args_follow_the_row():
    a = A.estimate_args(_agg_row())
    assert a["batch_size"] == 8 and a["tp_size"] == 2 and a["isl"] == 1024 and a["osl"] == 128
    assert "attention_dp_size" not in a  # an empty column is left to AIConfigurator's default
    assert "prefill_num_workers" not in a  # disagg fields are not passed for a colocated run
    assert a["backend_version"] is None and a["moe_quant_mode"] is None and a["gemm_quant_mode"] == "fp8"
    alias = A.estimate_args(_agg_row(model_path="meta-llama/Llama-3.1-70B"))
    assert alias["model_path"] == "meta-llama/Meta-Llama-3.1-70B"
    d = _agg_row(mode="disagg", prefill_batch_size="1", prefill_num_workers="2", decode_batch_size="64",
                 decode_num_workers="1", prefill_tp_size="4", decode_tp_size="8")
    da = A.estimate_args(d)
    assert da["prefill_tp_size"] == 4 and da["decode_tp_size"] == 8 and "batch_size" not in da
    assert A.missing_fields(d) == ""
    assert "decode_num_workers" in A.missing_fields({**d, "decode_num_workers": ""})
    assert A.missing_fields(_agg_row()) == ""


def test_split_rule_matches_the_validation():
    from analysis.disagg import validate as V

    rows = V.load_rows()
    assert (rows["id"].map(A.split_of) == rows["split"]).all()


def test_plan_caps_and_lists_every_run_of_the_split():
    rows = [_agg_row(id=f"x_agg_c{c}_cfg{k}", batch_size=str(c), tp_size=str(k))
            for c in (1, 2, 4, 8) for k in range(12)]
    rows += [_agg_row(id=f"y_disagg_c{c}_cfg{k}", mode="disagg") for c in (1, 2) for k in range(4)]
    df = pd.DataFrame(rows)
    plan = A.plan_cases(df, split="test", max_agg=5, max_disagg=3)
    test_ids = {r["id"] for r in rows if A.split_of(r["id"]) == "test"}
    assert set(plan["id"]) == test_ids and len(test_ids) < len(rows)
    agg = plan[plan["mode"] == "agg"]
    assert agg.loc[agg["rank"] >= 0, "key"].nunique() == 5
    assert (agg.loc[agg["rank"] < 0, "status"] == A.STATUS_NOT_RUN).all()
    dis = plan[plan["mode"] == "disagg"]  # no batch sizes / decode workers: listed, never called
    assert (dis["status"] == A.STATUS_NO_FIELDS).all() and (dis["rank"] < 0).all()
    again = A.plan_cases(df, split="test", max_agg=5, max_disagg=3)
    pd.testing.assert_frame_equal(plan, again)


def _fixture():
    ids = ["a1", "a2", "a3", "d1", "d2", "t1"]
    art_rows = pd.DataFrame(dict(
        id=ids, mode=["agg", "agg", "agg", "disagg", "disagg", "agg"],
        status=["estimated", "estimated", "unsupported", "estimated", "no fields", "estimated"],
        reason=["", "", "PerfDataNotAvailableError: MoE data missing at /x/site-packages/"
                "aiconfigurator_core/a", "", "disagg run without x", ""],
        aic_ttft_ms=[110.0, 300.0, np.nan, 500.0, np.nan, 100.0],
        aic_tpot_ms=[10.0, 12.0, np.nan, 20.0, np.nan, 10.0],
        silicon_ttft_ms=[100.0, 200.0, 100.0, 1000.0, 100.0, 100.0],
        silicon_tpot_ms=[10.0, 10.0, 10.0, 10.0, 10.0, 10.0]))
    pred = pd.DataFrame(dict(
        id=ids + ["other"], system="h200_sxm", backend="trtllm", model_path="m", isl=1024, osl=128,
        concurrency=8, split=["test"] * 5 + ["train", "test"], skip_reason="",
        pred_ttft_ms=[150.0, 220.0, 100.0, 900.0, np.nan, 100.0, 1.0],
        pred_tpot_ms=[11.0, 9.0, 10.0, 12.0, np.nan, 10.0, 1.0]))
    art = Artifact("aic_side_by_side", {"rows": art_rows}, {"aiconfigurator": "0.12.0",
                   "systems_data": {"aiconfigurator_core": "0.12.0"}}, [])
    return pred, art


def test_errors_are_taken_on_the_runs_both_predicted():
    pred, art = _fixture()
    sbs = SBS.side_by_side(pred, art)
    assert np.isnan(sbs.set_index("id").loc["a3", "aic_ttft_ms"])  # not estimated -> NaN, not 0
    c = SBS.common(sbs)
    assert list(c["id"]) == ["a1", "a2", "d1"]  # a3: no AIC; d2: neither; t1: training split
    s = SBS.error_summary(sbs).set_index("mode")
    assert s.loc["colocated", "runs"] == 2 and s.loc["disaggregated", "runs"] == 1
    assert s.loc["colocated", "ttft_sim"] == pytest.approx(np.median([0.5, 0.1]))
    assert s.loc["colocated", "ttft_aic"] == pytest.approx(np.median([0.1, 0.5]))
    assert s.loc["colocated", "tpot_aic"] == pytest.approx(np.median([0.0, 0.2]))
    assert s.loc["disaggregated", "ttft_aic"] == pytest.approx(0.5)
    assert s.loc["disaggregated", "tpot_sim"] == pytest.approx(0.2)
    assert s.loc["all", "runs"] == 3


def test_values_say_which_predictor_is_closer():
    pred, art = _fixture()
    v = SBS.values(SBS.side_by_side(pred, art), art)
    assert v["ch3_aic_sbs_disagg_ttft_sim"] == "10%" and v["ch3_aic_sbs_disagg_ttft_aic"] == "50%"
    assert "on TTFT the simulator is closer (10% against AIConfigurator's 50%)" in v["ch3_aic_sbs_reading"]
    assert "on TPOT the simulator is closer (20% against AIConfigurator's 100%)" in v["ch3_aic_sbs_reading"]
    reading = v["ch3_aic_sbs_reading"]
    assert "colocated (2 runs): on TTFT both are off by 30%; on TPOT both are off by 10%" in reading
    assert v["ch3_aic_sbs_failed"][0] == 1 and v["ch3_aic_sbs_no_fields"][0] == 1
    assert v["ch3_aic_sbs_attempted"][0] == 4
    assert v["ch3_aic_sbs_estimated"][0] == 3 and "0.12.0" in v["ch3_aic_sbs_version"]
    worse = pred.assign(pred_ttft_ms=np.where(pred["id"] == "d1", 3000.0, pred["pred_ttft_ms"]))
    r2 = SBS.values(SBS.side_by_side(worse, art), art)["ch3_aic_sbs_reading"]
    assert "on TTFT AIConfigurator is closer (50% against the simulator's 200%)" in r2
    cov = SBS.coverage(SBS.side_by_side(pred, art))
    assert "MoE data missing at aiconfigurator_core/a" in " ".join(cov["reason"]) and cov["runs"].sum() == 5


def test_bad_artifact_is_a_clear_error():
    pred, art = _fixture()
    bad = Artifact(art.name, {"rows": art.tables["rows"].drop(columns=["aic_tpot_ms"])}, {}, [])
    with pytest.raises(ValueError, match="aic-side-by-side"):
        SBS.side_by_side(pred, bad)
    with pytest.raises(ValueError, match="other data"):
        SBS.side_by_side(pred[pred["id"] != "a1"], art)


def test_the_chapter_reads_the_artifact_the_driver_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBOOK_RESULTS", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="make aic-side-by-side"):
        SBS.load()
    (tmp_path / A.ARTIFACT).mkdir()
    (tmp_path / A.ARTIFACT / "provenance.json").write_text('{"tables": {}, "modules": []}')
    assert SBS.load().name == A.ARTIFACT


def test_the_committed_artifact_is_complete_and_compares():
    from analysis.disagg import validate as V

    art = SBS.load()
    prov = art.provenance
    assert prov["aiconfigurator"] == A.PACKAGE_VERSION and prov["modules"] == A.MODULES
    assert prov["systems_data"]["aiconfigurator_core"] == A.PACKAGE_VERSION
    rows = art.tables["rows"]
    ok = rows["status"] == A.STATUS_OK
    assert ok.any() and (rows.loc[ok, ["aic_ttft_ms", "aic_tpot_ms"]] > 0).all().all()
    slots = {v["current"] for v in prov["systems_data"]["default_slots"].values()}
    assert set(rows.loc[ok, "db_version"].astype(str)) <= slots  # the current database, as documented
    assert (rows.loc[~ok, "reason"].fillna("") != "").all()  # every run not estimated says why
    assert set(rows["id"].map(A.split_of)) == {"test"}
    rs = V.load_rows()
    sbs = SBS.side_by_side(V.predict(rs, V.Calibration()), art)
    s = SBS.error_summary(sbs).set_index("mode")
    assert (s["runs"] > 0).all() and np.isfinite(s.drop(columns="runs").to_numpy()).all()
