"""AIConfigurator's estimator, this simulator and the measured runs side by side (issue 27, item 3).

AIConfigurator's predictions come from the committed artifact ``results/aic_side_by_side/``
(:mod:`.aic_run`, ``make aic-side-by-side``, run in its own environment); this module never imports
``aiconfigurator``. The simulator's predictions are those of :mod:`.validate` (calibrated on the train
split, the same rows the chapter reports). Errors are relative, ``predicted / measured - 1``, and each
predictor's median absolute error is taken on the *same* runs: the held-out runs that both predicted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..artifacts import Artifact, read_artifact
from . import aic_run

PREDICTORS = {"sim": "this simulator (calibrated)", "aic": "AIConfigurator"}
MODES = {"agg": "colocated", "disagg": "disaggregated"}


def load() -> Artifact:
    """The committed AIConfigurator predictions (with their provenance and stale flag)."""
    try:  # the name as a literal: analysis.deps then keys chapter 3 on this artifact's files alone
        return read_artifact("aic_side_by_side")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}. AIConfigurator's predictions are made by `make aic-side-by-side` "
                                f"(its own environment, .aic-venv) and committed under "
                                f"results/{aic_run.ARTIFACT}/") from None


def side_by_side(pred: pd.DataFrame, art: Artifact) -> pd.DataFrame:
    """One row per silicon run of the artifact: measured TTFT/TPOT, the simulator's (``pred``: the
    output of :func:`.validate.predict`, NaN where it cannot predict) and AIConfigurator's (NaN where
    it did not estimate), and the relative error of each."""
    rows = art.tables["rows"].copy()
    need = {"id", "mode", "status", "aic_ttft_ms", "aic_tpot_ms", "silicon_ttft_ms", "silicon_tpot_ms"}
    miss = need - set(rows.columns)
    if miss:
        raise ValueError(f"results/{art.name}/rows.csv lacks columns {sorted(miss)}: rerun "
                         f"`make aic-side-by-side`")
    if not pred["id"].is_unique:
        raise ValueError("the simulator's predictions repeat a run id; pass validate.predict's output")
    sim = pred.set_index("id")
    unknown = sorted(set(rows["id"]) - set(sim.index))
    if unknown:
        raise ValueError(f"{len(unknown)} runs of results/{art.name} are not in the silicon table the "
                         f"simulator read (e.g. {unknown[0]}): the artifact was computed on other data")
    out = pd.DataFrame({
        "id": rows["id"], "mode": rows["mode"],
        "system": rows["id"].map(sim["system"]), "backend": rows["id"].map(sim["backend"]),
        "model": rows["id"].map(sim["model_path"]), "split": rows["id"].map(sim["split"]),
        "isl": rows["id"].map(sim["isl"]), "osl": rows["id"].map(sim["osl"]),
        "concurrency": rows["id"].map(sim["concurrency"]),
        "aic_status": rows["status"].fillna(""),
        "aic_reason": rows.get("reason", pd.Series("", index=rows.index)).fillna(""),
        "sim_skip_reason": rows["id"].map(sim["skip_reason"]).fillna(""),
    })
    for m in ("ttft", "tpot"):
        meas = pd.to_numeric(rows[f"silicon_{m}_ms"], errors="coerce")
        out[f"measured_{m}_ms"] = meas
        out[f"sim_{m}_ms"] = rows["id"].map(sim[f"pred_{m}_ms"]).astype(float)
        aic = pd.to_numeric(rows[f"aic_{m}_ms"], errors="coerce")
        out[f"aic_{m}_ms"] = aic.where(out["aic_status"] == aic_run.STATUS_OK)
        for p in PREDICTORS:
            out[f"{p}_{m}_err"] = out[f"{p}_{m}_ms"] / meas - 1
    return out


def common(sbs: pd.DataFrame) -> pd.DataFrame:
    """The held-out (test-split) runs that both predictors predicted."""
    ok = np.ones(len(sbs), bool)
    for p in PREDICTORS:
        for m in ("ttft", "tpot"):
            ok &= np.isfinite(sbs[f"{p}_{m}_err"].to_numpy(float))
    return sbs[ok & (sbs["split"] == "test").to_numpy()]


def error_summary(sbs: pd.DataFrame) -> pd.DataFrame:
    """Per mode (colocated, disaggregated, all): the runs both predicted and each predictor's median
    absolute TTFT and TPOT error on them."""
    c = common(sbs)
    out = []
    for key, label in [*MODES.items(), ("all", "all")]:
        g = c if key == "all" else c[c["mode"] == key]
        rec = {"mode": label, "runs": len(g)}
        for m in ("ttft", "tpot"):
            for p in PREDICTORS:
                rec[f"{m}_{p}"] = float(g[f"{p}_{m}_err"].abs().median()) if len(g) else float("nan")
        out.append(rec)
    return pd.DataFrame(out)


def error_table(sbs: pd.DataFrame) -> pd.DataFrame:
    """:func:`error_summary` with readers' column names (errors as fractions; the chapter formats %)."""
    s = error_summary(sbs)
    names = {"runs": "runs both predicted"}
    for m in ("ttft", "tpot"):
        for p, who in (("sim", "simulator"), ("aic", "AIConfigurator")):
            names[f"{m}_{p}"] = f"{m.upper()} median |error|, {who}"
    return s.rename(columns=names)


def coverage(sbs: pd.DataFrame) -> pd.DataFrame:
    """What AIConfigurator did with each held-out run of the artifact: counts by mode and status, with
    the reason (exception and message; the first 160 characters) for the runs it could not estimate."""
    t = sbs[sbs["split"] == "test"].copy()
    # the machine's install path says nothing to a reader: from the package's own folder on
    reason = t["aic_reason"].str.replace(r"\S*/site-packages/", "", regex=True)
    reason = reason.str.replace(r"^beyond --max-(agg|disagg)$", r"outside the sample (the driver's --max-\1)",
                                regex=True)
    t["reason"] = reason.str.slice(0, 160)
    t.loc[t["aic_status"] == aic_run.STATUS_OK, "reason"] = ""
    g = (t.groupby(["mode", "aic_status", "reason"], dropna=False).size().rename("runs").reset_index()
         .sort_values(["mode", "runs"], ascending=[True, False]))
    g["mode"] = g["mode"].map(MODES).fillna(g["mode"])
    return g.rename(columns={"aic_status": "AIConfigurator"}).reset_index(drop=True)


def row_table(sbs: pd.DataFrame) -> pd.DataFrame:
    """The held-out runs both predicted, measured and predicted TTFT/TPOT side by side."""
    c = common(sbs)
    cols = {"id": "run", "mode": "mode", "system": "system", "backend": "backend", "model": "model",
            "concurrency": "clients",
            "measured_ttft_ms": "TTFT measured (ms)", "sim_ttft_ms": "TTFT simulator (ms)",
            "aic_ttft_ms": "TTFT AIConfigurator (ms)", "measured_tpot_ms": "TPOT measured (ms)",
            "sim_tpot_ms": "TPOT simulator (ms)", "aic_tpot_ms": "TPOT AIConfigurator (ms)"}
    return c[list(cols)].rename(columns=cols).assign(mode=lambda d: d["mode"].map(MODES))


def _fmt_err(x: float) -> str:
    return "n/a (no run both predicted)" if not np.isfinite(x) else f"{x:.0%}"


def values(sbs: pd.DataFrame, art: Artifact) -> dict:
    """Glue values: the artifact's AIConfigurator version, coverage counts and each predictor's median
    absolute error per mode, with a sentence saying which predictor is closer, written from them."""
    prov = art.provenance
    sysd = prov.get("systems_data", {})
    t = sbs[sbs["split"] == "test"]
    s = error_summary(sbs).set_index("mode")
    INT = "{:,.0f}"
    out = {
        "ch3_aic_sbs_version": f"{prov.get('aiconfigurator', '?')} (systems data of aiconfigurator-core "
                               f"{sysd.get('aiconfigurator_core', '?')})",
        "ch3_aic_sbs_rows": (len(t), INT),
        "ch3_aic_sbs_estimated": (int((t["aic_status"] == aic_run.STATUS_OK).sum()), INT),
        "ch3_aic_sbs_failed": (int((t["aic_status"] == aic_run.STATUS_FAILED).sum()), INT),
        "ch3_aic_sbs_no_fields": (int((t["aic_status"] == aic_run.STATUS_NO_FIELDS).sum()), INT),
        "ch3_aic_sbs_not_run": (int((t["aic_status"] == aic_run.STATUS_NOT_RUN).sum()), INT),
        "ch3_aic_sbs_attempted": (int(t["aic_status"].isin([aic_run.STATUS_OK, aic_run.STATUS_FAILED]).sum()),
                                  INT),
        "ch3_aic_sbs_cases": (int(prov.get("cases_run", 0)), INT),
        "ch3_aic_sbs_common": (int(s.loc["all", "runs"]), INT),
    }
    sentences = []
    for key, label in MODES.items():
        out[f"ch3_aic_sbs_{key}_runs"] = (int(s.loc[label, "runs"]), INT)
        parts = []
        for m in ("ttft", "tpot"):
            a, b = s.loc[label, f"{m}_sim"], s.loc[label, f"{m}_aic"]
            out[f"ch3_aic_sbs_{key}_{m}_sim"] = _fmt_err(a)
            out[f"ch3_aic_sbs_{key}_{m}_aic"] = _fmt_err(b)
            if np.isfinite(a) and np.isfinite(b):
                if round(a, 2) == round(b, 2):  # equal as shown (to the percent)
                    parts.append(f"on {m.upper()} both are off by {_fmt_err(a)}")
                elif a < b:
                    parts.append(f"on {m.upper()} the simulator is closer ({_fmt_err(a)} against "
                                 f"AIConfigurator's {_fmt_err(b)})")
                else:
                    parts.append(f"on {m.upper()} AIConfigurator is closer ({_fmt_err(b)} against the "
                                 f"simulator's {_fmt_err(a)})")
        n = int(s.loc[label, "runs"])
        sentences.append(f"{label} ({n:,} runs): " + ("; ".join(parts) if parts else "no run both predicted"))
    out["ch3_aic_sbs_reading"] = "; ".join(sentences)
    return out
