"""KV policies as the composition sees them: on-device bytes, cold-tier bytes, recall traffic and
fidelity, all *measured* by chapter 4 (:func:`analysis.qevict.experiment.run_experiment`, every run
cached on disk) on SmolLM2-135M and short documents (chapter 4's corpora).

A :class:`KVPolicy` is one (policy, budget) stream of chapter 4, reduced to ratios against the
full cache of the same run, so that it can be applied to any model of chapter 1:

* ``hot_ratio``: bytes held on the device (full-precision + quantized windows, the open window
  included) / bytes of the full cache;
* ``cold_ratio``: exact copies of quantized windows kept off the device for recall / full cache;
* ``recall_ratio_per_step``: bytes recalled from the cold tier per decoding step / full cache;
* ``kl``, ``top1``, ``ppl_change``: mean next-token KL divergence to the full cache (nats),
  top-1 agreement with it, and relative change of perplexity on the document's true next tokens.

Assumption (stated in the chapter): these ratios and fidelities, measured on a 135M model at a
short context, carry over to the served model at the same budget fraction.

**Two sources of fidelity.** Chapter 4's measurement is one source; published long-context benchmark
results of the same policies on 7B-70B models are the other (``kvfid:`` rows of ``data/published.csv``,
:func:`published_table`). :func:`with_source` gives each policy its *published* fidelity where the
published rows cover it (same policy, a published budget at or below the policy's: a larger budget is
assumed never to score lower) and keeps chapter 4's otherwise; the floor
(:class:`~analysis.compose.decide.FidelityFloor`) then judges a published policy by its benchmark score
relative to the full cache of the same model and benchmark, a chapter-4 policy by top-1 agreement and
perplexity.

**The AI SSD's in-drive quantization is a KV policy** (:func:`in_drive_policy`): prefixes stored at
``b`` bits and loaded back into HBM are what the model attends to, so the ``ai_ssd`` layout carries the
fidelity of KIVI at ``b`` bits with no full-precision residual (published where covered, else chapter
4's KIVI-``b`` at its smallest measured budget); 16 bits is exact; a precision no source measured has no
fidelity evidence and cannot pass the floor.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .. import data, specs
from ..artifacts import list_artifacts, read_artifact, usable, write_artifact
from ..params import validate
from ..qevict import experiment
from ..qevict import params as qparams
from ..qevict.gguf_model import gguf_path
from ..qevict.policies import POLICIES
from ..qevict.runner import file_sha256

SOURCES = ("chapter 4", "published", "exact", "none")
# what the computed artifact names below read (analysis.deps keys the pages on these)
ARTIFACTS_READ = ("qevict_long_", "compose_measured_policies")


@dataclass(frozen=True)
class KVPolicy:
    name: str
    budget: float = 1.0
    hot_ratio: float = 1.0
    cold_ratio: float = 0.0
    recall_ratio_per_step: float = 0.0
    kl: float = 0.0
    top1: float = 1.0
    ppl_change: float = 0.0
    fits: bool = True
    source: str = "chapter 4"          # where kl / top1 / ppl_change or score_ratio come from
    score_ratio: float = math.nan      # published benchmark score / full cache's (mean over models)
    score_ratio_min: float = math.nan  # the lowest model's ratio (the published spread)
    evidence: str = ""                 # which benchmark / model / run / budget the fidelity comes from

    def __post_init__(self):
        for f in ("budget", "hot_ratio"):
            v = getattr(self, f)
            if not (math.isfinite(v) and 0 < v <= 1.0 + 1e-9):
                raise ValueError(f"KVPolicy {self.name!r}: {f} must be in (0, 1], got {v!r}")
        for f in ("cold_ratio", "recall_ratio_per_step", "kl"):
            v = getattr(self, f)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"KVPolicy {self.name!r}: {f} must be finite and >= 0, got {v!r}")
        if not 0 <= self.top1 <= 1:
            raise ValueError(f"KVPolicy {self.name!r}: top1 must be in [0, 1], got {self.top1!r}")
        if self.source not in SOURCES:
            raise ValueError(f"KVPolicy {self.name!r}: source must be one of {', '.join(SOURCES)}, "
                             f"got {self.source!r}")
        if self.source == "published" and not (math.isfinite(self.score_ratio) and self.score_ratio >= 0):
            raise ValueError(f"KVPolicy {self.name!r}: a published policy needs a finite score_ratio >= 0")

    @property
    def label(self) -> str:
        return "full cache" if self.name == "full" else f"{self.name} @ {self.budget:.0%}"

    @property
    def needs_cold_tier(self) -> bool:
        return self.cold_ratio > 0 or self.recall_ratio_per_step > 0

    @classmethod
    def full(cls) -> "KVPolicy":
        """The full cache (the baseline): everything on the device, exact."""
        return cls("full")


def measurement_config(policies, budgets, *, documents=("docs:typing",), prefill_tokens: int = 256,
                       decode_tokens: int = 32, **overrides):
    """Chapter 4's configuration (``QEvictConfig``) of a small run: the full cache and every policy at every
    budget on ``documents``; chapter 4's other parameters at their defaults unless overridden."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown KV policies {unknown}; chapter 4 has {', '.join(POLICIES)}")
    if not budgets or any(not 0 < b <= 1 for b in budgets):
        raise ValueError(f"budgets are fractions of the full cache in (0, 1], got {list(budgets)}")
    p = {k: v.default for k, v in qparams.PARAMS.items()}
    p["tuned_settings"] = "none"  # chapter 4's frozen settings cover its own budgets only
    p.update(documents=list(documents), prefill_tokens=int(prefill_tokens), decode_tokens=int(decode_tokens),
             policies=["full"] + [x for x in policies if x != "full"], budgets=[float(b) for b in budgets],
             heatmap_document=0, **overrides)
    return qparams.SCHEMA.config(qparams_validate(qparams, p))


def measure(policies, budgets, *, verbose: bool = False, **kw) -> list[KVPolicy]:
    """Chapter 4's experiment (:func:`analysis.qevict.experiment.run_experiment`, every run cached on disk)
    of :func:`measurement_config`, as :class:`KVPolicy` objects. Where the committed measurement
    (``results/compose_measured_policies``) stands for the same configuration, model and code it is read
    instead (``verbose`` always runs, to show the runs)."""
    c = measurement_config(policies, budgets, **kw)
    art = None if verbose else usable_measurement(c)[0]
    if art is not None:
        return from_summary(art.tables["summary"])
    summary = experiment.run_experiment(c, verbose=verbose).summary
    return from_summary(summary)


# Chapter 5's measurement at its default parameters (one document, 4 policies x 2 budgets: about 40 s of
# CPU, a live chapter-4 run in every clean build) is committed like chapter 4's default run.
MEASURED = "compose_measured_policies"
MEASURED_COMMAND = "make default-run"
MEASURED_MODULES = experiment.MODULES  # the code of a chapter-4 experiment (shared with its default run)


def measurement_key(c) -> dict:
    """What the committed measurement must have been computed with to stand for chapter 4's run ``c``."""
    return dict(params=json.loads(json.dumps(dataclasses.asdict(c))), model_sha256=file_sha256(gguf_path()))


def usable_measurement(c):
    """The committed measurement if it stands for chapter 4's run ``c`` (``artifacts.usable``); why not."""
    return usable(MEASURED, measurement_key(c), ("summary",), command=MEASURED_COMMAND)


def write_measurement(policies, budgets, **kw) -> Path:
    """Run :func:`measurement_config` now and write it as ``results/compose_measured_policies``."""
    c = measurement_config(policies, budgets, **kw)
    t0 = time.perf_counter()
    summary = experiment.run_experiment(c).summary
    notes = ("chapter 5's measurement of its KV policies (chapter 4's summary table); runs the on-disk "
             "result cache held count at what reading them took")
    return write_artifact(MEASURED, {"summary": summary}, modules=MEASURED_MODULES, command=MEASURED_COMMAND,
                          wall_seconds=time.perf_counter() - t0, params=measurement_key(c), notes=notes)


def qparams_validate(qparams, p: dict) -> dict:
    """Chapter 4's schema and cross-parameter checks (clear errors before any model run)."""
    out = validate(qparams.PARAMS, p)
    qparams.check_consistency(out)
    return out


def from_summary(summary: pd.DataFrame) -> list[KVPolicy]:
    """:class:`KVPolicy` of each (policy, budget) of chapter 4's summary table (one row per
    document and stream), averaged over documents; bytes relative to the full cache's."""
    need = {"document", "policy", "budget", "kl", "top1", "dppl", "fits", "bytes_full", "bytes_quantized",
            "bytes_cold", "recall_bytes", "decode_steps"}
    missing = need - set(summary.columns)
    if missing:
        raise ValueError(f"chapter 4's summary lacks columns {sorted(missing)}")
    ref = summary[summary["policy"] == "full"].set_index("document")
    if ref.empty:
        raise ValueError("chapter 4's summary has no full-cache stream to compare with")
    hot_ref = (ref["bytes_full"] + ref["bytes_quantized"]).astype(float)
    res = [KVPolicy.full()]
    for (pol, frac), g in summary[summary["policy"] != "full"].groupby(["policy", "budget"], sort=False):
        g = g.set_index("document")
        r = hot_ref.loc[g.index]
        res.append(KVPolicy(
            name=str(pol), budget=float(frac),
            hot_ratio=float(min(((g["bytes_full"] + g["bytes_quantized"]) / r).mean(), 1.0)),
            cold_ratio=float((g["bytes_cold"] / r).mean()),
            recall_ratio_per_step=float((g["recall_bytes"] / g["decode_steps"] / r).mean()),
            kl=max(float(g["kl"].mean()), 0.0), top1=float(g["top1"].mean()),
            ppl_change=float(g["dppl"].mean()),
            fits=bool(g["fits"].all())))
    return res


def table(policies: list[KVPolicy]) -> pd.DataFrame:
    """One row per policy: bytes, recalls, chapter 4's fidelity (blank for an exact policy or one
    without evidence), the published score ratio where the published source covers it."""
    def m(p, v):
        return v if p.source in ("chapter 4", "published") or p.name == "full" else math.nan

    return pd.DataFrame([{"policy": p.label, "name": p.name, "budget": p.budget,
                          "on-device bytes": p.hot_ratio, "cold-tier bytes": p.cold_ratio,
                          "recall / step": p.recall_ratio_per_step,
                          "KL (nats)": m(p, p.kl), "top-1 agreement": m(p, p.top1),
                          "perplexity change": m(p, p.ppl_change),
                          "within budget without extra eviction": p.fits, "fidelity source": p.source,
                          "published score ratio": p.score_ratio} for p in policies])


# ----------------------------------------------------------------------- the published source

PUBLISHED_PREFIX = "kvfid:"


def published_table(df: pd.DataFrame | None = None) -> pd.DataFrame:
    """The published long-context fidelity rows (``kvfid:<benchmark>:<model>:<policy>:<budget>`` keys of
    ``data/published.csv``), one per (benchmark, model, policy, budget), with ``ratio`` = score / the
    full cache's score on the same benchmark and model. A benchmark-model group without a full-cache
    row is an error (a ratio needs it)."""
    if df is None:
        df = data.table("published.csv")
    sub = df[df["key"].astype(str).str.startswith(PUBLISHED_PREFIX)]
    rows = []
    for _, r in sub.iterrows():
        parts = str(r["key"]).split(":")
        if len(parts) != 5:
            raise ValueError(f"published fidelity key {r['key']!r}: expected "
                             "kvfid:<benchmark>:<model>:<policy>:<budget>")
        _, bench, model, pol, budget = parts
        rows.append({"benchmark": bench, "model": model, "policy": pol, "budget": float(budget),
                     "score": float(r["value"]), "source": r["source"]})
    out = pd.DataFrame(rows, columns=["benchmark", "model", "policy", "budget", "score", "source"])
    if out.empty:
        return out.assign(ratio=pd.Series(dtype=float))
    full = out[out["policy"] == "full"].set_index(["benchmark", "model"])["score"]
    keys = list(zip(out["benchmark"], out["model"]))
    missing = sorted({f"{b}/{m}" for b, m in keys if (b, m) not in full.index})
    if missing:
        raise ValueError("published fidelity rows without a full-cache row to compare with: "
                         + ", ".join(missing))
    out["ratio"] = [s / full.loc[k] for s, k in zip(out["score"], keys)]
    return out


def model_scale(model: str) -> float:
    """Parameters (billions) of a published model, read from its name (``Llama-3-70B-Instruct`` -> 70);
    a name without ``<N>B`` is an error (a ``kvfid:`` row must name its model's size)."""
    m = re.search(r"(\d+(?:\.\d+)?)B(?![a-z])", str(model))
    if not m:
        raise ValueError(f"published fidelity model {model!r}: its name must carry its size "
                         "(e.g. 'Llama-3-70B')")
    return float(m.group(1))


def served_scale(model) -> float:
    """Parameters (billions) of a served model of chapter 1 (``data/models.csv``, published total)."""
    return float(specs.model(model).params_total_published) / 1e9


def published_fidelity(name: str, budget: float, table: pd.DataFrame | None = None,
                       scale: float | None = None) -> dict | None:
    """The published fidelity of policy ``name`` at on-device ``budget``; ``None`` when not covered.

    Rows: the policy's, at a published budget at or below ``budget`` (a policy given more memory is
    assumed never to score lower). With ``scale`` (the served model's parameters, billions), only the
    published model(s) nearest to it in scale (by |log ratio|) count; without it, every model.
    In each (benchmark, model) the rows of the largest such budget are kept; the result is their mean
    and lowest score ratio over (benchmark, model)."""
    t = published_table() if table is None else table
    rows = t[(t["policy"] == name) & (t["budget"] <= budget + 1e-9)]
    if rows.empty:
        return None
    if scale is not None:
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"served model scale must be > 0 billion parameters, got {scale!r}")
        dist = rows["model"].map(lambda m: abs(math.log(model_scale(m) / scale)))
        rows = rows[dist <= dist.min() + 1e-9]
    best = rows.groupby(["benchmark", "model"])["budget"].transform("max")
    rows = rows[rows["budget"] >= best - 1e-12]
    return {"budget": float(rows["budget"].max()), "ratio_mean": float(rows["ratio"].mean()),
            "ratio_min": float(rows["ratio"].min()),
            "n": len(rows), "models": ", ".join(sorted(set(rows["model"]))),
            "benchmarks": ", ".join(sorted(set(rows["benchmark"]))),
            "scale": float(np.mean([model_scale(m) for m in rows["model"]]))}


def _evidence(pub: dict) -> str:
    return f"{pub['benchmarks']} on {pub['models']} at budget <= {pub['budget']:.3g}"


def with_source(policies, source: str = "published", table: pd.DataFrame | None = None,
                model=None) -> list[KVPolicy]:
    """The policies with the fidelity the served model gets: ``'published'`` where the published rows
    cover a policy (else chapter 4's, unchanged); ``'chapter 4'`` returns them unchanged. With the
    served ``model`` (chapter 1's name), the published source nearest to it in scale
    (:func:`published_fidelity`)."""
    if source not in ("published", "chapter 4"):
        raise ValueError(f"fidelity source must be 'published' or 'chapter 4', got {source!r}")
    if source == "chapter 4":
        return list(policies)
    t = published_table() if table is None else table
    scale = None if model is None else served_scale(model)
    out = []
    for p in policies:
        pub = None if p.name == "full" else published_fidelity(p.name, p.budget, t, scale)
        out.append(p if pub is None else dataclasses.replace(
            p, source="published", score_ratio=pub["ratio_mean"], score_ratio_min=pub["ratio_min"],
            evidence=_evidence(pub)))
    return out


def in_drive_policy(bits: int, policies, source: str = "published",
                    table: pd.DataFrame | None = None, model=None) -> KVPolicy:
    """The AI SSD's in-drive quantization at ``bits`` as a KV policy (what the model attends to after a
    prefix comes back from the drive): exact at 16 bits; else KIVI-``bits`` with no full-precision
    residual, from the published rows (budget ``bits / 16``) when ``source`` is ``'published'`` and
    they cover it, else chapter 4's KIVI-``bits`` at its smallest measured budget among ``policies``;
    a policy with ``source='none'`` (no evidence, never admitted) when neither has it."""
    bits = int(bits)
    name = f"ai_ssd_int{bits}"
    if bits >= 16:
        return KVPolicy(name, 1.0, source="exact")
    kivi = f"kivi{bits}"
    if source == "published":
        t = published_table() if table is None else table
        pub = published_fidelity(kivi, bits / 16.0, t, None if model is None else served_scale(model))
        if pub is not None:
            return KVPolicy(name, bits / 16.0, hot_ratio=1.0, source="published",
                            score_ratio=pub["ratio_mean"], score_ratio_min=pub["ratio_min"],
                            evidence=_evidence(pub))
    measured = [p for p in policies if p.name == kivi and p.source == "chapter 4"]
    if measured:
        p = min(measured, key=lambda q: q.budget)
        return KVPolicy(name, p.budget, kl=p.kl, top1=p.top1, ppl_change=p.ppl_change, source="chapter 4",
                        evidence=p.evidence)
    return KVPolicy(name, bits / 16.0, source="none")


# ------------------------------------------------------------ chapter 4 at long context (artifacts)

def long_context_runs(names=None) -> list[dict]:
    """Chapter 4's committed long-context runs (``results/qevict_long_*``, read through
    :mod:`analysis.artifacts`; whichever exist, never assumed): one dict per run with its name, model,
    mean context (tokens), stale reasons and its policies (:func:`from_summary`)."""
    have = [n for n in list_artifacts() if n.startswith("qevict_long_")]
    if names is not None:
        have = [n for n in have if n in set(names)]
    runs = []
    for n in have:
        a = read_artifact(n)
        s = a.tables.get("summary")
        if s is None or s.empty:
            continue
        runs.append({"name": n, "model": str(s["model"].iloc[0]),
                     "context_tokens": float(s["context_tokens"].mean()), "stale": list(a.stale_reasons),
                     "policies": from_summary(s)})
    return runs


def with_long_context(policies, runs) -> list[KVPolicy]:
    """Chapter 4's fidelity at the longest context it has: for each chapter-4 policy, each model's
    (architecture's) longest run among ``runs`` (:func:`long_context_runs`) that measured the policy at a
    budget at or below the policy's (the largest such budget); over the models, the worst value of each
    fidelity (lowest top-1, largest KL and perplexity change). The bytes (on-device, cold, recalls) stay
    the policy's own: only fidelity moves. Policies no run covers keep their short-run fidelity."""
    out = []
    for p in policies:
        if p.name == "full" or p.source != "chapter 4":
            out.append(p)
            continue
        best = {}  # model -> (context, run, matching policy)
        for r in runs:
            cand = [q for q in r["policies"] if q.name == p.name and q.budget <= p.budget + 1e-9]
            if not cand:
                continue
            q = max(cand, key=lambda x: x.budget)
            if r["model"] not in best or r["context_tokens"] > best[r["model"]][0]:
                best[r["model"]] = (r["context_tokens"], r, q)
        if not best:
            out.append(p)
            continue
        got = list(best.values())
        ev = "; ".join(f"chapter 4, {r['name']} ({c:,.0f} tokens, budget {q.budget:g})"
                       + (" [stale]" if r["stale"] else "") for c, r, q in got)
        out.append(dataclasses.replace(
            p, kl=max(q.kl for _, _, q in got), top1=min(q.top1 for _, _, q in got),
            ppl_change=max(q.ppl_change for _, _, q in got), evidence=ev))
    return out
