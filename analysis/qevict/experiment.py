"""Chapter 4's experiment: every document, every (policy, budget) stream, results cached on disk."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..cache import cached
from . import tuning
from .config import policy_config  # also read as experiment.policy_config (tests, chapter text)
from .corpora import load_document, module_source
from .gguf_model import LlamaModel, gguf_path, load_model
from .labels import with_display_labels
from .metrics import document_drift, global_lir, summarize_run, tier_bytes_table
from .params import QEvictConfig
from .runner import file_sha256, run_document_cached
from .tokenizer import load_tokenizer

# the code a run of run_experiment executes, the key of the committed artifacts it computes (chapter 4's
# default run adds its own modules, analysis.qevict.defaultrun; chapter 5's measurement uses it as it is)
MODULES = sorted(f"analysis.qevict.{m}" for m in (
    "experiment", "config", "params", "tuning", "corpora", "tokenizer", "gguf_model", "ggufread", "lmhead",
    "runner", "kvcache", "kernels", "policies", "quant", "metrics", "labels"))
DEFAULT_MODEL = "smollm2"  # the default run's model (gguf_model.load_model), as the long runs name it


@dataclass
class Experiment:
    params: QEvictConfig
    docs: list
    results: list
    summary: pd.DataFrame
    lir: pd.DataFrame
    seconds: float
    timings: list = field(default_factory=list)
    drift: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per document
    tuned: dict | None = None  # the frozen settings used, or None (hand-set knobs)

    def tier_bytes(self) -> pd.DataFrame:
        """Bytes held per tier (full, quantized, cold) per policy and budget (bridge to chapter 2)."""
        return tier_bytes_table(self.summary)


def summary_table(rows) -> pd.DataFrame:
    """The run's summary from the per-document tables of ``metrics.summarize_run``: their rows, the
    genre (the document spec's prefix), and display names in ``label`` (``analysis.qevict.labels``: a
    policy that evicted to fit its budget is named so)."""
    summary = pd.concat(rows, ignore_index=True)
    summary.insert(1, "genre", summary.document.str.split(":").str[0])
    return with_display_labels(summary)


def run_experiment(c: QEvictConfig, *, verbose: bool = False) -> Experiment:
    """Every document of configuration ``c`` (``analysis.qevict.params.SCHEMA.config(values)``:
    validated and cross-checked), every (policy, budget) stream, each cached on disk."""
    if not isinstance(c, QEvictConfig):
        raise TypeError(f"run_experiment takes a QEvictConfig (SCHEMA.config(values)), "
                        f"got {type(c).__name__}")
    w, k, dr = c.workload, c.policies, c.drift
    model = load_model()
    tok = load_tokenizer()
    pcfg = policy_config(c)
    P, D = w.prefill_tokens, w.decode_tokens
    tuned, over = None, None
    if k.tuned_settings != "none":
        tuned = tuning.load(k.tuned_settings)
        over = tuning.overrides(tuned, pcfg, k.policies, k.budgets)
    docs, results, rows, lirs, timings, drifts = [], [], [], [], [], []
    t0 = time.perf_counter()
    for spec in w.documents:
        doc = load_document(spec, tok, P + D + 1, prefill_tokens=P, n_needles=w.n_needles,
                            n_queries=w.n_queries, seed=w.seed)
        t1 = time.perf_counter()
        if verbose:
            print(f"{spec}: {len(doc)} tokens", flush=True)
        res = run_document_cached(model, doc.tokens, P, D, k.policies, k.budgets, pcfg, verbose=verbose,
                                  overrides=over)
        timings.append(dict(document=spec, seconds=time.perf_counter() - t1,
                            seconds_prefill=res["seconds_prefill"], seconds_decode=res["seconds_decode"]))
        docs.append(doc)
        results.append(res)
        rows.append(summarize_run(res, spec, doc.answers))
        lr = global_lir(res["attn_full"], P, k.window_tokens, dr.lir_gap_steps, dr.lir_tau, k.sink_windows)
        lr.insert(0, "document", spec)
        lirs.append(lr)
        drifts.append(
            dict(
                document=spec,
                genre=doc.kind,
                model=DEFAULT_MODEL,
                **document_drift(
                    res["attn_full"],
                    P,
                    k.window_tokens,
                    gap=dr.lir_gap_steps,
                    tau=dr.lir_tau,
                    sink_windows=k.sink_windows,
                    seed=w.seed,
                ),
            )
        )
    if tuned is not None:
        tdocs = {}
        for spec in tuned["tuning_documents"]:
            tP, tD = tuned["prefill_tokens"], tuned["decode_tokens"]
            tdocs[spec] = load_document(
                spec,
                tok,
                tP + tD + 1,
                prefill_tokens=tP,
                n_needles=w.n_needles,
                n_queries=w.n_queries,
                seed=w.seed,
            ).tokens
        tuning.check_disjoint(tdocs, {d.spec: d.tokens for d in docs})
    summary = summary_table(rows)
    return Experiment(
        c,
        docs,
        results,
        summary,
        pd.concat(lirs, ignore_index=True),
        time.perf_counter() - t0,
        timings,
        pd.DataFrame(drifts),
        tuned,
    )


def perplexity(model, tokens) -> float:
    tokens = np.asarray(tokens, dtype=np.int64)
    out = model.prefill(tokens, logits="nll", targets=np.r_[tokens[1:], -1])
    return float(np.exp(np.nanmean(out["nll"])))


def layout_check(module: str = "argparse", n_tokens: int = 1024) -> dict:
    """Perplexity of the first ``n_tokens`` tokens of a standard-library module's source with the
    Q/K rows un-permuted (right) and left in llama.cpp's interleaved order under rotate-half RoPE
    (wrong).  Cached on disk."""
    tok = load_tokenizer()
    ids = tok.encode(module_source(module))[:n_tokens]

    def compute():
        right = perplexity(load_model(), ids)
        wrong = perplexity(LlamaModel.from_gguf(gguf_path(), unpermute_qk=False), ids)
        return dict(right=right, wrong=wrong, tokens=len(ids), module=module)

    inputs = dict(
        module=module,
        n=int(n_tokens),
        tokens=hashlib.sha256(ids.tobytes()).hexdigest(),
        model=file_sha256(gguf_path()),
    )
    return cached("qevict_layout", inputs, compute)
