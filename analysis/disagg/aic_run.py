"""AIConfigurator's own estimator on the measured silicon runs: the driver of ``make aic-side-by-side``.

Issue 27, item 3. The ``aiconfigurator`` package (:data:`PACKAGE_VERSION`, PyPI, Apache-2.0) is run in
its own virtual environment (``.aic-venv/``, pinned by ``requirements-aic.txt``), not the book's: its
dependencies (pandas 3, numpy 2.4, matplotlib, bokeh, plotly, ...) are not the book's pins. Its
predictions are committed as the artifact ``results/aic_side_by_side/`` (:mod:`analysis.artifacts`:
provenance, stale flag keyed on this module's source); the book reads that artifact and never imports
``aiconfigurator`` (this module imports it only inside :func:`run`).

How each run is estimated
-------------------------
Exactly as AIConfigurator's own accuracy tool does it (``tools/accuracy_regression_testing/
predict_silicon_sample.py`` of github.com/ai-dynamo/aiconfigurator, commit 095f58a, the commit of the
silicon table this book reads): one ``aiconfigurator.cli.api.cli_estimate`` call per row with the row's
model, system, mode (``agg``/``disagg``), backend, ISL, OSL, GEMM and MoE quantisation, and its
parallel sizes, batch sizes and worker counts as recorded (columns left empty are left to
AIConfigurator's defaults; the client concurrency is not an input of the estimator, which takes the
engine's ``batch_size``). Rows with the same arguments share one call (:func:`case_key`).

Two deliberate differences. First, the model configuration: ``cli_estimate`` reads the model's
``config.json`` from the configurations bundled with aiconfigurator-core, or else downloads it from
Hugging Face, which this machine cannot reach (``HuggingFaceDownloadError``). A model whose exact
name is not bundled is given the bundled configuration of the same architecture
(:data:`MODEL_ALIASES`; the quantisation comes from the row's explicit ``gemm_quant_mode`` and
``moe_quant_mode``, which every aliased quantised checkpoint has), recorded per row
(``aic_model_path``). Second, the performance-database version. 0.12.0 accepts only its queryable
version slots (``systems/query_versions.yaml``: ``current``/``next``) and rejects the framework
version a run was measured with (``... looks like an old-style raw version query``); its own tool,
on a database error, retries with the default. Every case here uses the default (the ``current``
slot of the system and backend), and the version it used is recorded per case (``db_version``)
beside the one the run was measured with (``backend_version``).

Which runs
----------
Disaggregated runs without prefill/decode batch sizes and worker counts cannot be estimated
(``cli_estimate`` requires them); they are listed with that reason, without a call. Of the others,
the runs of the *test* split of :mod:`.validate` (the same rule: the sha256 of the run's id with its
concurrency removed; ``tests/test_aic_side_by_side.py`` checks the two agree) are estimated, in a
fixed pseudo-random order (sha256 of the case key), at most ``--max-agg`` colocated and
``--max-disagg`` disaggregated cases and within ``--time-budget-s`` (AIConfigurator takes seconds per
case on the book's 2 shared cores); cases not reached are listed as ``not run``. A case that raises
is listed with its exception (``unsupported``), never dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import os
import re
import signal
import sys
import time
from importlib import metadata
from pathlib import Path

import pandas as pd
import yaml

from .. import artifacts, data

PACKAGE = "aiconfigurator"
PACKAGE_VERSION = "0.12.0"
ARTIFACT = "aic_side_by_side"
MODULES = ["analysis.disagg.aic_run"]
SOURCE_TOOL = ("github.com/ai-dynamo/aiconfigurator, tools/accuracy_regression_testing/"
               "predict_silicon_sample.py (commit 095f58a)")

# model path of a silicon run -> the bundled aiconfigurator-core model configuration of the same
# architecture (its name under aiconfigurator_core/model_configs/, '/' for '--')
MODEL_ALIASES = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",  # the same checkpoint, renamed by Meta
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",  # instruct tune: same architecture
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",  # FP8 from gemm_quant_mode
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",  # NVFP4 from gemm/moe_quant_mode
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",  # NVFP4 from gemm/moe_quant_mode
    "zhipuai/GLM-5": "zai-org/GLM-5",  # the organisation's new name on Hugging Face
}

PARALLEL_FIELDS = ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
AGG_FIELDS = ("batch_size", *PARALLEL_FIELDS)
DISAGG_FIELDS = tuple(f"{stage}_{f}" for stage in ("prefill", "decode")
                      for f in (*PARALLEL_FIELDS, "batch_size", "num_workers"))
REQUIRED_DISAGG_FIELDS = ("prefill_batch_size", "prefill_num_workers", "decode_batch_size",
                          "decode_num_workers")

STATUS_OK, STATUS_FAILED = "estimated", "unsupported"
STATUS_NOT_RUN, STATUS_NO_FIELDS = "not run", "no fields"


def group_of(run_id: str) -> str:
    """The run's id with its concurrency (``_c<N>_``) removed: one configuration's concurrency sweep."""
    return re.sub(r"_c\d+_", "_c_", str(run_id))


def split_of(run_id: str) -> str:
    """``train`` or ``test``: the rule of :func:`analysis.disagg.validate.load_rows`."""
    return "train" if int(hashlib.sha256(group_of(run_id).encode()).hexdigest(), 16) % 2 == 0 else "test"


def _int(v: str) -> int:
    return int(float(v))


def estimate_args(row: dict) -> dict:
    """The ``cli_estimate`` keyword arguments for one silicon row (values as read, strings)."""
    fields = AGG_FIELDS if row["mode"] == "agg" else DISAGG_FIELDS
    return dict(
        model_path=MODEL_ALIASES.get(row["model_path"], row["model_path"]), system_name=row["system"],
        mode=row["mode"],
        backend_name=row["backend"], backend_version=None, isl=_int(row["isl"]), osl=_int(row["osl"]),
        gemm_quant_mode=row["gemm_quant_mode"] or None, moe_quant_mode=row["moe_quant_mode"] or None,
        **{f: _int(row[f]) for f in fields if row.get(f)})


def missing_fields(row: dict) -> str:
    """'' or why ``cli_estimate`` cannot take the row at all."""
    if row["mode"] == "disagg":
        miss = [f for f in REQUIRED_DISAGG_FIELDS if not row.get(f)]
        if miss:
            return "disagg run without " + ", ".join(miss) + " (cli_estimate requires them)"
    return ""


def case_key(args: dict) -> str:
    return json.dumps(sorted(args.items()), default=str)


def _order(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_rows() -> pd.DataFrame:
    """The silicon runs (data registry ``aiconfigurator_silicon``), every value a string."""
    return pd.read_csv(data.path("aiconfigurator_silicon"), dtype=str, keep_default_na=False)


def plan_cases(df: pd.DataFrame, *, split: str = "test", max_agg: int, max_disagg: int) -> pd.DataFrame:
    """One line per row of ``split``: ``key`` (the estimator's arguments), ``status`` (``no fields``
    with ``reason``, or '' for a case to run) and ``rank`` (the order cases are run in; a case beyond
    ``max_agg``/``max_disagg`` of its mode is ``not run``)."""
    recs = []
    for r in df.to_dict("records"):
        if split_of(r["id"]) != split:
            continue
        why = missing_fields(r)
        key = "" if why else case_key(estimate_args(r))
        recs.append(dict(id=r["id"], mode=r["mode"], key=key, status=STATUS_NO_FIELDS if why else "",
                         reason=why))
    out = pd.DataFrame(recs)
    out["rank"] = -1
    for mode, cap in (("agg", max_agg), ("disagg", max_disagg)):
        keys = sorted(set(out.loc[(out["mode"] == mode) & (out["status"] == ""), "key"]), key=_order)
        chosen = {k: i for i, k in enumerate(keys[:cap])}
        m = (out["mode"] == mode) & (out["status"] == "")
        if not m.any():
            continue
        out.loc[m, "rank"] = out.loc[m, "key"].map(lambda k: chosen.get(k, -1)).astype(int)
        out.loc[m & (out["rank"] < 0), ["status", "reason"]] = [STATUS_NOT_RUN, f"beyond --max-{mode}"]
    return out


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _systems_data_version() -> dict:
    """The aiconfigurator-core systems data: its package version, the default query slots and the
    sha256 of the slot file."""
    import aiconfigurator_core  # optional heavy dependency (the .aic-venv environment only)

    qv = Path(aiconfigurator_core.__file__).parent / "systems" / "query_versions.yaml"
    slots = yaml.safe_load(qv.read_text())
    return {"aiconfigurator_core": metadata.version("aiconfigurator-core"),
            "query_versions_sha256": hashlib.sha256(qv.read_bytes()).hexdigest(),
            "default_slots": slots.get("defaults", {})}


def run(*, split="test", max_agg=200, max_disagg=200, time_budget_s=1800.0, case_timeout_s=180.0,
        log=sys.stderr, write=True):
    """Estimate the planned cases (:func:`plan_cases`) with ``cli_estimate`` and write the artifact."""
    from aiconfigurator.cli.api import cli_estimate  # optional heavy dependency (.aic-venv only)

    version = metadata.version(PACKAGE)
    if version != PACKAGE_VERSION:
        raise RuntimeError(f"aiconfigurator {version} installed, {PACKAGE_VERSION} expected: "
                           f"`make aic-side-by-side` installs requirements-aic.txt into .aic-venv")
    logging.getLogger().setLevel(logging.ERROR)
    df = read_rows()
    plan = plan_cases(df, split=split, max_agg=max_agg, max_disagg=max_disagg)
    todo = plan[plan["rank"] >= 0].drop_duplicates("key")
    todo = todo.assign(o=todo["key"].map(_order)).sort_values("o")  # agg and disagg interleaved
    t0 = time.time()
    results = {}
    signal.signal(signal.SIGALRM, _alarm)
    for i, key in enumerate(todo["key"]):
        if time.time() - t0 > time_budget_s:
            results[key] = dict(status=STATUS_NOT_RUN, reason=f"time budget {time_budget_s:.0f} s spent")
            continue
        args = dict(json.loads(key))
        t = time.time()
        try:
            signal.alarm(int(case_timeout_s))
            with contextlib.redirect_stdout(io.StringIO()):
                res = cli_estimate(**args)
            results[key] = dict(status=STATUS_OK, reason="", aic_ttft_ms=float(res.ttft),
                                aic_tpot_ms=float(res.tpot), db_version=str(res.backend_version))
        except _Timeout:
            results[key] = dict(status=STATUS_FAILED, reason=f"no answer within {case_timeout_s:.0f} s")
        except Exception as e:  # noqa: BLE001 - every failure is recorded with its message
            msg = " ".join(str(e).split())
            results[key] = dict(status=STATUS_FAILED, reason=f"{type(e).__name__}: {msg}"[:400])
        finally:
            signal.alarm(0)
        results[key]["seconds"] = round(time.time() - t, 2)
        r = results[key]
        print(f"[{i + 1}/{len(todo)} {time.time() - t0:.0f}s] {r['status']} {r.get('aic_ttft_ms', '')} "
              f"{r.get('aic_tpot_ms', '')} {r['reason'][:120]}", file=log, flush=True)
    rows = plan.drop(columns=["rank"]).copy()
    for col in ("aic_ttft_ms", "aic_tpot_ms", "db_version", "seconds"):
        rows[col] = rows["key"].map(lambda k, c=col: results.get(k, {}).get(c, ""))
    st = rows["key"].map(lambda k: results.get(k, {}).get("status", ""))
    rs = rows["key"].map(lambda k: results.get(k, {}).get("reason", ""))
    rows["status"] = st.where(st != "", rows["status"])
    rows["reason"] = rs.where(st != "", rows["reason"])
    meas = df.set_index("id")
    for col in ("system", "backend", "backend_version", "model_path", "isl", "osl", "silicon_ttft_ms",
                "silicon_tpot_ms"):
        rows[col] = rows["id"].map(meas[col])
    rows["aic_model_path"] = rows["model_path"].map(lambda m: MODEL_ALIASES.get(m, m))
    rows = rows[["id", "mode", "system", "backend", "backend_version", "model_path", "aic_model_path", "isl",
                 "osl", "status", "reason", "db_version", "aic_ttft_ms", "aic_tpot_ms", "silicon_ttft_ms",
                 "silicon_tpot_ms", "seconds", "key"]]
    wall = time.time() - t0
    params = dict(split=split, max_agg=max_agg, max_disagg=max_disagg, time_budget_s=time_budget_s,
                  case_timeout_s=case_timeout_s)
    extra = dict(aiconfigurator=version, systems_data=_systems_data_version(), estimator="cli_estimate",
                 protocol=SOURCE_TOOL, input=data.path("aiconfigurator_silicon").name,
                 cases_run=int(sum(r["status"] != STATUS_NOT_RUN for r in results.values())))
    if not write:
        return rows, extra
    cmd = ("make aic-side-by-side (.aic-venv/bin/python -m analysis.disagg.aic_run "
           + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in params.items()) + ")")
    return artifacts.write_artifact(ARTIFACT, {"rows": rows}, modules=MODULES, command=cmd,
                                    wall_seconds=wall, params=params, extra=extra,
                                    notes="AIConfigurator's estimator on the silicon runs; see "
                                          "analysis/disagg/aic_run.py for the protocol")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="test", choices=["test", "train"])
    ap.add_argument("--max-agg", type=int, default=200)
    ap.add_argument("--max-disagg", type=int, default=200)
    ap.add_argument("--time-budget-s", type=float, default=1800.0)
    ap.add_argument("--case-timeout-s", type=float, default=180.0)
    a = ap.parse_args(argv)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    out = run(split=a.split, max_agg=a.max_agg, max_disagg=a.max_disagg, time_budget_s=a.time_budget_s,
              case_timeout_s=a.case_timeout_s)
    print(out)


if __name__ == "__main__":
    main()
