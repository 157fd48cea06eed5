"""Chapter 4's long-context runs, too long for the book build, as committed artifacts.

Computed by :mod:`analysis.qevict.longrun_units` (``python -m analysis.qevict.longrun_units
sweeps/qevict_long.yaml``, = make long), which runs :func:`execute` one document at a time after
:func:`prepare` has checked the whole run.

Each entry of the YAML's ``runs`` is one artifact ``results/<name>/``: a ``summary`` table (one row
per document, policy and budget: the outcomes of :func:`analysis.qevict.metrics.summarize_run` plus
re-decisions and promotions per 1,000 decoding steps), a ``timings`` table, a ``drift`` table (one row
per document: the declared drift statistic, Global LIR and budget-relative LIR against the block-shuffled
null, :func:`analysis.qevict.metrics.document_drift`) and ``drift_ends`` (the statistic's relative
excess at the ends of the drift rule's sensitivities declared in data/claims.yaml that need the
attention itself), with provenance
(:mod:`analysis.artifacts`); with ``tuned_settings`` (default: chapter 4's ``results/qevict_tuned.json``;
``none`` for the hand-set knobs) QEvict and MiKV run with the settings frozen there, the evaluation
documents are checked to share no 32-token run with the tuning documents before any work, and a
``settings`` table records the settings each stream used and the file's sha256.  Models: ``smollm2``
(SmolLM2-135M, 8,192-token context) and ``gemma3-270m`` (Gemma 3 270M, 32,768; the policies manage its
global layers).  Bad input is rejected before any work: a context above the model's maximum, a document
too short, a budget the settings file did not tune, an evaluation document overlapping a tuning one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing as mp
import resource
from concurrent.futures import ProcessPoolExecutor

import numba
import pandas as pd

from analysis.claims import rule

from . import tuning
from .config import policy_config
from .corpora import load_document
from .gemma_model import gemma_gguf_path, load_gemma
from .gguf_model import gguf_path, load_model
from .metrics import document_drift, summarize_run
from .params import PARAMS
from .runner import _blas_threads, run_document
from .tokenizer import load_tokenizer
from .verdicts import drift_excess

MODELS = ("smollm2", "gemma3-270m")
MODULES = ["analysis.qevict.runner", "analysis.qevict.kvcache", "analysis.qevict.policies",
           "analysis.qevict.quant", "analysis.qevict.corpora", "analysis.qevict.tokenizer",
           "analysis.qevict.metrics",
           "analysis.qevict.longrun", "analysis.qevict.kernels", "analysis.qevict.verdicts",
           "analysis.qevict.config", "analysis.qevict.params", "analysis.qevict.tuning",
           "analysis.qevict.lmhead", "analysis.qevict.ggufread"]  # both models' output head and reader
# the drift rule's sensitivities that need each document's attention (the others act on the table)
DRIFT_ENDS = {"top share of windows": "budget", "shuffle block (steps)": "block"}
MODEL_MODULES = {"smollm2": "analysis.qevict.gguf_model", "gemma3-270m": "analysis.qevict.gemma_model"}
CONTEXT = {"smollm2": 8192, "gemma3-270m": 32768}


def load(model: str):
    """(model, tokenizer) by name."""
    if model == "smollm2":
        return load_model(), load_tokenizer(gguf_path())
    if model == "gemma3-270m":
        return load_gemma(), load_tokenizer(gemma_gguf_path())
    raise ValueError(f"unknown model {model!r}; models: {', '.join(MODELS)}")


def check_run(run: dict) -> dict:
    """Defaults and the checks that need no model (context length first)."""
    r = dict(run)
    for k in ("name", "model", "documents", "prefill_tokens", "decode_tokens"):
        if k not in r:
            raise ValueError(f"run {run.get('name', '?')!r}: missing {k!r}")
    if r["model"] not in MODELS:
        raise ValueError(f"run {r['name']!r}: unknown model {r['model']!r}; models: {', '.join(MODELS)}")
    for k, p in PARAMS.items():
        r.setdefault(k, p.default)
    P, D = int(r["prefill_tokens"]), int(r["decode_tokens"])
    ctx = CONTEXT[r["model"]]
    if P + D > ctx:
        raise ValueError(f"run {r['name']!r}: prefill + decode = {P + D:,} tokens exceed the {ctx:,}-token "
                         f"context of {r['model']}; lower prefill_tokens or decode_tokens")
    if P % r["window_tokens"]:
        raise ValueError(f"run {r['name']!r}: prefill_tokens {P} is not a multiple of window_tokens "
                         f"{r['window_tokens']}")
    return r


_JOB = {}  # the run being executed, shared with forked worker processes (one document each)


def _run_one(i: int):
    """Run document ``i`` of the run in ``_JOB``: (summary rows, timings row)."""
    r, model, tok, docs, pcfg, verbose = (_JOB[k] for k in ("r", "model", "tok", "docs", "pcfg", "verbose"))
    P, D, doc = int(r["prefill_tokens"]), int(r["decode_tokens"]), docs[i]
    if verbose:
        print(f"[{r['name']}] {doc.spec}: {P:,} + {D:,} tokens, {len(r['policies'])} policies x "
              f"{len(r['budgets'])} budgets", flush=True)
    spans = doc.answers if r.get("free_run") else ()
    res = run_document(model, doc.tokens, P, D, r["policies"], r["budgets"], pcfg, verbose=verbose,
                       free_run_spans=spans, overrides=_JOB.get("overrides"))
    s = summarize_run(res, doc.spec, doc.answers)
    s.insert(0, "model", r["model"])
    s["redecisions_per_1000"] = res["redecisions"] / D * 1000
    s["promotions_per_1000"] = s["promotions"] / D * 1000
    s["free_run"] = bool(len(spans))
    if len(spans):  # the generated answers, as text, per stream
        s["generated"] = ["|".join(tok.decode(res["argmax"][a - P - 1:b - P - 1, i]) for a, b in spans)
                          for i in range(len(res["streams"]))]
    # peak RSS of this process so far (ru_maxrss is in KiB; a worker may have run earlier documents)
    t = dict(model=r["model"], document=doc.spec, prefill_tokens=P, decode_tokens=D,
             streams=len(res["streams"]), seconds_prefill=res["seconds_prefill"],
             seconds_decode=res["seconds_decode"], seconds_per_step=res["seconds_decode"] / D,
             peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    dr, ends = drift_tables(res["attn_full"], doc, r)
    return s, t, dr, ends


def drift_tables(attn_full, doc, r: dict):
    """(one row of drift measurements, rows of the relative excess at the declared sensitivity ends)
    of one document, from the full cache's attention (chapter 4's drift rule, ``ch4_drift``)."""
    P, W = int(r["prefill_tokens"]), int(r["window_tokens"])
    sink, seed = int(r["sink_windows"]), int(r["seed"])
    d = document_drift(attn_full, P, W, gap=int(r["lir_gap_steps"]), tau=float(r["lir_tau"]),
                       sink_windows=sink, seed=seed)
    row = dict(model=r["model"], document=doc.spec, genre=doc.kind, **d)
    ends = []
    for sens in rule("ch4_drift").get("sensitivity") or []:
        kw = DRIFT_ENDS.get(sens["name"])
        if kw is None:
            continue
        for end in ("low", "high"):
            v = sens[end]
            ends.append(dict(model=r["model"], document=doc.spec, genre=doc.kind, sensitivity=sens["name"],
                             end=end, value=float(v), rel_excess=drift_excess(
                                 attn_full, P, W, sink, seed=seed, **{kw: type(sens["default"])(v)})))
    return row, ends


def _worker(i: int):
    numba.set_num_threads(1)  # the compiled attention kernel too: one thread per process
    with _blas_threads(1):  # one BLAS thread per process (prefill too): the processes share the cores
        return _run_one(i)


def prepare(run: dict) -> dict:
    """Everything checked before any work (:func:`check_run`; the model loaded, every document long
    enough, the tuned settings covering the budgets, no evaluation document overlapping a tuning one):
    {r (the checked run), model, tok, docs, pcfg, overrides, settings} for :func:`execute`."""
    r = check_run(run)
    model, tok = load(r["model"])
    P, D = int(r["prefill_tokens"]), int(r["decode_tokens"])
    pcfg = policy_config(dict(r, head_dim=model.cfg.head_dim))
    docs = [load_document(s, tok, P + D + 1, prefill_tokens=P, n_needles=r["n_needles"],
                          n_queries=r["n_queries"], seed=r["seed"])
            for s in r["documents"]]  # every document is checked before any run
    over, settings = frozen_settings(r, tok, pcfg, docs)
    return dict(r=r, model=model, tok=tok, docs=docs, pcfg=pcfg, overrides=over, settings=settings)


def execute(run: dict, *, verbose: bool = True, jobs: int = 1) -> dict:
    """Run one entry; returns {table name: DataFrame}.  ``jobs`` > 1: the documents run in that many
    forked processes at once (one BLAS thread each); the results do not depend on it."""
    job = prepare(run)
    docs, settings = job["docs"], job["settings"]
    _JOB.update(job, verbose=verbose)
    try:
        if jobs > 1 and len(docs) > 1:
            with ProcessPoolExecutor(min(jobs, len(docs)), mp_context=mp.get_context("fork")) as ex:
                out = list(ex.map(_worker, range(len(docs))))
        else:
            out = [_run_one(i) for i in range(len(docs))]
    finally:
        _JOB.clear()
    tables = dict(summary=pd.concat([o[0] for o in out], ignore_index=True),
                  timings=pd.DataFrame([o[1] for o in out]),
                  drift=pd.DataFrame([o[2] for o in out]),
                  drift_ends=pd.DataFrame([e for o in out for e in o[3]]))
    if settings is not None:
        tables["settings"] = settings
    return tables


def frozen_settings(r: dict, tok, pcfg, docs):
    """(overrides for :func:`run_document`, table of the settings used) from the run's
    ``tuned_settings`` file, or (None, None) for ``none``.  Fails before any run if a budget was not
    tuned or an evaluation document shares a 32-token run with a tuning document."""
    path = r.get("tuned_settings", "none")
    if path in (None, "none"):
        return None, None
    tuned = tuning.load(path)
    over = tuning.overrides(tuned, pcfg, r["policies"], r["budgets"])
    tP, tD = tuned["prefill_tokens"], tuned["decode_tokens"]
    nn, nq, seed = (PARAMS[k].default for k in ("n_needles", "n_queries", "seed"))  # as the search built them
    tdocs = {s: load_document(s, tok, tP + tD + 1, prefill_tokens=tP, n_needles=nn, n_queries=nq,
                              seed=seed).tokens for s in tuned["tuning_documents"]}
    tuning.check_disjoint(tdocs, {d.spec: d.tokens for d in docs})
    with open(path, "rb") as fh:
        sha = hashlib.sha256(fh.read()).hexdigest()
    def knobs(pol):  # a policy that takes another's settings (tuning.SHARES_SETTINGS) shows that one's knobs
        return tuned["tuned_knobs"].get(tuning.SHARES_SETTINGS.get(pol, pol), ())

    rows = [dict(policy=pol, budget=float(f), tuned_settings=str(path), tuned_sha256=sha,
                 settings_of=tuning.SHARES_SETTINGS.get(pol, pol),
                 **{k: v for k, v in dataclasses.asdict(c).items() if k in knobs(pol)})
            for (pol, f), c in sorted(over.items())]
    return over, pd.DataFrame(rows)
