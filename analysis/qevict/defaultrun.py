"""Chapter 4's default run: what the chapter reads of it, computed now or read from its committed artifact.

The default run (six documents, 13 policies, 4 budgets on SmolLM2-135M) takes about 8 minutes of two
cores, most of the book build. At the chapter's default parameters it is read from
``results/qevict_default_run/`` (``make default-run`` writes it, with provenance: commit, code hash,
date, machine, command) when that artifact is **usable**: the same parameters, the same code
(:data:`MODULES`), the same model file and frozen settings, and every attention-dependent sensitivity end
the ledger's drift rule declares. Otherwise it is computed now (each document cached on disk by
:func:`analysis.qevict.runner.run_document_cached`), and :attr:`DefaultRun.source` says why. A reader's
rerun with other parameters is always computed.

:class:`DefaultRun` holds only what the chapter reads: the summary table (one row per document and
stream), the Global LIR and drift tables, the budget-relative LIR of the example document, the primary
drift metrics recomputed at each attention-dependent sensitivity end (:meth:`DefaultRun.at`, for
``analysis.claims.evaluate``), the weight-layout check and the frozen settings.
The full-cache attention itself is not kept: its derived tables are, a few hundred kilobytes in all.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .. import artifacts, claims
from . import tuning
from .experiment import MODULES as EXPERIMENT_MODULES
from .experiment import layout_check, run_experiment
from .gguf_model import gguf_path
from .longview import ATTENTION_ENDS, primary_metrics_from_attention
from .metrics import DRIFT_RULE, budget_lir, tier_bytes_table
from .params import SCHEMA, QEvictConfig
from .runner import file_sha256

NAME = "qevict_default_run"
ARTIFACTS_READ = ("qevict_default_run",)  # the artifacts this module reads (analysis.deps: the page keys)
COMMAND = "make default-run"
LAYOUT_MODULE, LAYOUT_TOKENS = "argparse", 1024  # the weight-layout check: perplexity of argparse.py's start
DRIFT_CLAIM = "ch4_drift"
# the code that computes every table of the artifact: the experiment's (experiment.MODULES, as chapter
# 5's measurement), the drift metrics at the sensitivity ends (longview, verdicts) and this module
MODULES = sorted(set(EXPERIMENT_MODULES) | {"analysis.qevict.longview", "analysis.qevict.verdicts",
                                            "analysis.qevict.defaultrun"})
# how a difference in each entry of key() reads in DefaultRun.source
KEY_LABELS = {"params": "other parameters", "model_sha256": "another model file",
              "tuned_sha256": "other frozen settings", "attention_ends": "other declared sensitivity ends"}


@dataclass
class DefaultRun:
    params: QEvictConfig
    summary: pd.DataFrame  # metrics.summarize_run per document, with genre and display labels
    lir: pd.DataFrame  # metrics.global_lir per document and layer
    drift: pd.DataFrame  # metrics.document_drift, one row per document
    budget_lir: pd.DataFrame  # metrics.budget_lir of the example document (drift.heatmap_document)
    ends: pd.DataFrame  # primary drift metrics per document at each attention-dependent sensitivity end
    layout: dict  # experiment.layout_check: perplexity with the right and the wrong Q/K layout
    tuned: dict | None = None  # the frozen settings used, or None (hand-set knobs)
    source: str = "computed now"  # where the numbers come from (artifact and its provenance, or why not)
    from_artifact: bool = False
    provenance: dict = field(default_factory=dict)

    def tier_bytes(self) -> pd.DataFrame:
        """Bytes held per tier (full, quantized, cold) per policy and budget (bridge to chapter 2)."""
        return tier_bytes_table(self.summary)

    def at(self, name: str, value) -> pd.DataFrame:
        """The per-document primary drift metrics at an attention-dependent sensitivity end
        (``longview.drift_primary_recompute``'s ``at``)."""
        return end_rows(self.ends, name, value)


def attention_ends(claim_id: str = DRIFT_CLAIM) -> list[tuple[str, float]]:
    """The (sensitivity, value) pairs at which the ledger's drift rule recomputes its metrics from the
    attention: the declared ends of its attention-dependent sensitivities and any amendment's original
    value among them."""
    c = claims.rule(claim_id)
    out = {(s["name"], float(v)) for s in c.get("sensitivity") or [] if s["name"] in ATTENTION_ENDS
           for v in claims.ends(s)}
    for a in claims.amendments(c):
        ov = a.get("original_value") or {}
        if ov.get("sensitivity") in ATTENTION_ENDS:
            out.add((ov["sensitivity"], float(ov["value"])))
    return sorted(out)


def ends_table(attentions, drift: pd.DataFrame, prefill_tokens: int, window_tokens: int, sink_windows: int,
               gap: int, tau: float, seed: int, pairs) -> pd.DataFrame:
    """The primary drift metrics (``longview.primary_metrics_from_attention``) of each document's full-cache
    attention (``attentions``, in the order of ``drift``'s rows) at each (sensitivity, value) of ``pairs``:
    one row per (pair, document), the pair in columns ``end`` and ``value``."""
    frames = []
    for name, value in pairs:
        if name not in ATTENTION_ENDS:
            raise KeyError(f"{name!r} is not an attention-dependent sensitivity "
                           f"({', '.join(ATTENTION_ENDS)})")
        kw = {ATTENTION_ENDS[name]: float(value) if ATTENTION_ENDS[name] == "budget" else int(value)}
        t = pd.DataFrame([primary_metrics_from_attention(a, prefill_tokens, window_tokens, sink_windows,
                                                         gap=gap, tau=tau, seed=seed, **kw)
                          for a in attentions])
        for col in ("model", "document"):
            if col in drift:
                t.insert(0, col, drift[col].to_numpy())
        t.insert(0, "value", float(value))
        t.insert(0, "end", name)
        frames.append(t)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["end", "value"])


def end_rows(ends: pd.DataFrame, name: str, value) -> pd.DataFrame:
    """The rows of :func:`ends_table` at one (sensitivity, value), without the pair's columns."""
    if name not in ATTENTION_ENDS:
        raise KeyError(f"{name!r} is not an attention-dependent sensitivity of the drift rule "
                       f"({', '.join(ATTENTION_ENDS)})")
    t = ends[(ends.end == name) & (ends.value == float(value))]
    if t.empty:
        have = sorted(set(zip(ends.end, ends.value)))
        raise KeyError(f"no drift metrics at {name} = {value} (there are {have}); a new sensitivity end "
                       f"needs the attention: `{COMMAND}` recomputes the default run's")
    return t.drop(columns=["end", "value"]).reset_index(drop=True)


def compute(c: QEvictConfig, *, verbose: bool = False) -> DefaultRun:
    """Run the experiment of ``c`` now (documents cached on disk) and derive what the chapter reads."""
    exp = run_experiment(c, verbose=verbose)
    w, k, dr = c.workload, c.policies, c.drift
    r0 = exp.results[dr.heatmap_document]
    bl = budget_lir(r0["attn_full"], w.prefill_tokens, k.window_tokens, DRIFT_RULE["budget"],
                    dr.lir_gap_steps, k.sink_windows)
    ends = ends_table([r["attn_full"] for r in exp.results], exp.drift, w.prefill_tokens, k.window_tokens,
                      k.sink_windows, dr.lir_gap_steps, dr.lir_tau, w.seed, attention_ends())
    lay = layout_check(LAYOUT_MODULE, LAYOUT_TOKENS)
    return DefaultRun(c, exp.summary, exp.lir, exp.drift, bl, ends, lay, exp.tuned)


def key(c: QEvictConfig) -> dict:
    """What the artifact must have been computed with to stand for a run of ``c``."""
    tuned = c.policies.tuned_settings
    return dict(params=json.loads(json.dumps(dataclasses.asdict(c))),
                model_sha256=file_sha256(gguf_path()),
                tuned_sha256=None if tuned == "none" else _sha256(_tuned_path(tuned)),
                attention_ends=[[n, v] for n, v in attention_ends()])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tuned_path(path: str) -> Path:
    p = Path(path)
    if not p.is_file() and not p.is_absolute():
        p = artifacts.REPO_ROOT / path
    return p


TABLES = ("summary", "lir", "drift", "budget_lir", "ends", "layout")


def write(run: DefaultRun, wall_seconds: float) -> Path:
    """The artifact ``results/qevict_default_run/`` of ``run`` (atomic, :func:`artifacts.write_artifact`)."""
    tables = dict(summary=run.summary, lir=run.lir, drift=run.drift, budget_lir=run.budget_lir, ends=run.ends,
                  layout=pd.DataFrame([run.layout]))
    notes = ("chapter 4's default run (analysis.qevict.defaultrun): the tables it reads, not the attention; "
             "documents whose runs the on-disk result cache (analysis.cache) held count in the wall time "
             "at what reading them took")
    return artifacts.write_artifact(NAME, tables, modules=MODULES, command=COMMAND, wall_seconds=wall_seconds,
                                    params=key(run.params), notes=notes)


def _from_artifact(c: QEvictConfig, art: artifacts.Artifact) -> DefaultRun:
    t = art.tables
    summary = t["summary"]
    lay = t["layout"].iloc[0].to_dict()
    layout = dict(right=float(lay["right"]), wrong=float(lay["wrong"]), tokens=int(lay["tokens"]),
                  module=str(lay["module"]))
    tuned = None if c.policies.tuned_settings == "none" else tuning.load(c.policies.tuned_settings)
    p = art.provenance
    return DefaultRun(c, summary, t["lir"], t["drift"], t["budget_lir"], t["ends"], layout, tuned,
                      source=art.describe(), from_artifact=True, provenance=p)


def usable(c: QEvictConfig) -> tuple[artifacts.Artifact | None, str]:
    """The committed artifact if it stands for a run of ``c``, else ``None`` and why not
    (:func:`analysis.artifacts.usable`)."""
    return artifacts.usable(NAME, key(c), TABLES, command=COMMAND, title="default run", labels=KEY_LABELS)


def default_run(c: QEvictConfig, *, verbose: bool = False) -> DefaultRun:
    """Chapter 4's run of ``c``: the committed artifact where it stands for it, else computed now."""
    if not isinstance(c, QEvictConfig):
        raise TypeError(f"default_run takes a QEvictConfig (SCHEMA.config(values)), got {type(c).__name__}")
    art, why = usable(c)
    if art is not None:
        return _from_artifact(c, art)
    run = compute(c, verbose=verbose)
    run.source = f"computed now: {why}"
    return run


def main(argv=None) -> int:
    """``make default-run``: compute the run at the chapter's default parameters and commit-ready write it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    c = SCHEMA.config(SCHEMA.defaults())
    t0 = time.perf_counter()
    run = compute(c, verbose=a.verbose)
    path = write(run, time.perf_counter() - t0)
    print(f"wrote {path} ({len(run.summary)} summary rows, {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
