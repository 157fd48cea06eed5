"""Chapter 4 checked by a second implementation: NVIDIA's kvpress (0.5.5, on transformers and torch)
against this project's numpy runner, on the chapter's documents, the same token ids and the same GGUF.

``make crosscheck`` (not part of ``make install``) makes its own environment, ``.venv-crosscheck``
(``requirements-crosscheck.txt``: torch's CPU build, transformers, kvpress), and runs::

    python -m analysis.qevict.crosscheck [--documents ...] [--prefill-tokens 1024] [--decode-tokens 32]

The torch side runs in that environment (:mod:`analysis.qevict.kvpress_side`, as a child process);
this side runs in the main one, with the project's own runner (:func:`analysis.qevict.runner.run_document`),
and compares.  The result is the committed artifact ``results/qevict_kvpress_crosscheck/``, which
chapter 4 reads (without torch).

**The shared protocol.**  kvpress compresses once, at the end of the prefill, and never during
decoding; the project's policies re-decide whenever a window of ``window`` tokens closes.  The two
agree on what is compared when the decoding stays inside the first open window: ``P`` tokens of prefill
at full attention, one compression, then ``D <= window`` teacher-forced steps that every stream reads
after its compressed prefix (the project's first re-decision would come after step ``window``).  Every
stream keeps the same number of tokens per (layer, KV head) at the same precision (float16 K/V): the
number the project's eviction policies keep at that budget (sink windows plus ``floor`` of the
windows the budget holds), so the kvpress presses run at equal KV bytes; the project's quantizing
policies (KIVI, MiKV, QEvict) spend the same byte budget in their own tiers.  KL and top-1 agreement
are against each implementation's own full cache.

**What is compared.**  (1) StreamingLLM against ``StreamingLLMPress`` with ``n_sink`` = the sink
windows' tokens: the kept positions per (layer, KV head) and the next-token logits.  (2) SnapKV
against ``SnapKVPress`` with the same observation window and kernel: Jaccard of the kept positions
and the KL difference, the definitional differences (:data:`SNAPKV_DIFFERENCES`) named, and the
project's definition rebuilt inside kvpress (``WindowSnapKVPress`` of :mod:`.kvpress_side`) to show
the agreement once they are removed.  (3) Policies kvpress has and the project lacks
(``KnormPress``, ``ExpectedAttentionPress``) and kvpress's ``TOVAPress`` next to the project's
TOVA, QEvict and the other baselines.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..artifacts import code_hash, list_artifacts, read_artifact, write_artifact
from . import tuning
from .config import policy_config
from .corpora import load_document
from .gguf_model import gguf_path, load_model
from .kvcache import FULL
from .params import SCHEMA
from .policies import POLICIES, POLICY_LABELS, StreamingLLM
from .runner import run_document
from .tokenizer import load_tokenizer

ARTIFACT = "qevict_kvpress_crosscheck"
REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-crosscheck"
# what the artifact depends on (its stale flag): this module, the torch side, and the keyed modules
# of the numpy side it calls
MODULES = ["analysis.qevict.crosscheck", "analysis.qevict.kvpress_side", "analysis.qevict.runner",
           "analysis.qevict.policies", "analysis.qevict.kvcache", "analysis.qevict.kernels",
           "analysis.qevict.gguf_model", "analysis.qevict.corpora", "analysis.qevict.tokenizer",
           "analysis.qevict.quant", "analysis.qevict.tuning"]
# the numpy model and torch agree on the full cache to about this many logits (float32, other
# summation orders, dequantized the same Q4_1 weights); a matched pair of compressed caches must agree
# as closely (max |logit difference| over the vocabulary and the steps)
LOGIT_TOLERANCE = 5e-3

# kvpress presses run: (key, press class, settings from the project's PolicyConfig, label)
KVPRESS_STREAMS = (
    ("kvp_streaming", "StreamingLLMPress", "kvpress StreamingLLMPress"),
    ("kvp_snapkv", "SnapKVPress", "kvpress SnapKVPress"),
    ("kvp_snapkv_window", "WindowSnapKVPress", "kvpress scorer, the project's SnapKV definition"),
    ("kvp_tova", "TOVAPress", "kvpress TOVAPress"),
    ("kvp_knorm", "KnormPress", "kvpress KnormPress (not in the project)"),
    ("kvp_expected", "ExpectedAttentionPress", "kvpress ExpectedAttentionPress (not in the project)"),
)
# the project's policies run on the numpy side: the chapter's table's rows (the full cache runs first)
PROJECT_POLICIES = ("streaming", "h2o", "tova", "snapkv", "kivi2", "qevict_dequant", "qevict_recall")
# the project's policy each kvpress press is matched with (kept positions compared)
MATCHED = {"kvp_streaming": "streaming", "kvp_snapkv": "snapkv", "kvp_snapkv_window": "snapkv",
           "kvp_tova": "tova"}

SNAPKV_DIFFERENCES = (
    ("granularity", "whole windows of `window` tokens per (layer, KV head)", "single tokens per KV head",
     "WindowSnapKVPress scores every token with its window's sum"),
    ("pooling", "max-pooling over `snap_kernel` keys (zero padding)",
     "average pooling (avg_pool1d, zero padding counted)", "max-pooling"),
    ("pooled keys", "every prompt key, the observation window's own keys included", "the keys before the "
     "observation window only", "every key"),
    ("attention sinks", "the first `sink_windows` windows always kept", "none", "sink windows kept"),
    ("observation window", "the last ceil(obs / window) windows always kept", "the last `window_size` tokens "
     "always kept", "the project's"),
    ("per-head budget", "the same number of windows per (layer, KV head)", "the same number of tokens per "
     "(layer, KV head) (ScorerPress top-k)", "the same"),
)
STREAMING_DIFFERENCES = (
    ("granularity", "whole windows: the sink window and the most recent windows the budget holds",
     "n_sink tokens and the most recent tokens"),
    ("when", "re-decides each time a window closes during decoding", "once, at the end of the prefill"),
)


# ------------------------------------------------------------------------------ comparison functions
def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def kl_top1(ref_logits: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step: KL(ref || stream) of the next-token distributions (nats) and whether the argmaxes
    agree, as the project's runner computes them."""
    lr, ls = log_softmax(ref_logits), log_softmax(logits)
    kl = (np.exp(lr) * (lr - ls)).sum(-1)
    return kl, ref_logits.argmax(-1) == logits.argmax(-1)


def kept_from_tiers(tier: np.ndarray, window: int, full_code: int, n_closed: int) -> list:
    """Prompt positions held at full precision per (layer, KV head) from one stream's tiers
    (L, Hkv, NW) (only the ``n_closed`` prompt windows: later ones are the decoding's), as a nested
    list of sorted arrays."""
    tier = tier[..., :n_closed]
    L, H, _ = tier.shape
    tok = np.arange(window)
    return [[(np.flatnonzero(tier[li, h] == full_code)[:, None] * window + tok).ravel().astype(np.int64)
             for h in range(H)] for li in range(L)]


def jaccard(a, b) -> float:
    """Mean over (layer, KV head) of |A ∩ B| / |A ∪ B| of two kept-position sets per (layer, head)
    (nested lists or (L, H, n) arrays)."""
    out = []
    for ra, rb in zip(a, b):
        if len(ra) != len(rb):
            raise ValueError("the two kept sets have different numbers of KV heads")
        for x, y in zip(ra, rb):
            x, y = set(np.asarray(x).tolist()), set(np.asarray(y).tolist())
            u = len(x | y)
            out.append(len(x & y) / u if u else 1.0)
    if len(out) == 0 or len(a) != len(b):
        raise ValueError("the two kept sets must have the same layers")
    return float(np.mean(out))


def identical_share(a, b) -> float:
    """Share of (layer, KV head) whose kept positions are the same set."""
    same = [set(np.asarray(x).tolist()) == set(np.asarray(y).tolist())
            for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return float(np.mean(same))


def n_keep_tokens(frac: float, prefill_tokens: int, cfg) -> int:
    """Tokens per (layer, KV head) the project's eviction policies hold after the prefill at budget
    ``frac``: the sink windows plus the windows :meth:`~analysis.qevict.policies.Policy.capacity`
    holds (floored, as ``_EvictByPriority.target``)."""

    nc = prefill_tokens // cfg.window
    pol = StreamingLLM(frac, cfg, 1, 1, nc + 1)
    n = int(np.floor(pol.capacity(nc) + 1e-9))
    if n < 0:
        raise ValueError(f"budget {frac:.0%} cannot hold the sink and open windows")
    return (min(cfg.sink_windows, nc) + n) * cfg.window


def kvpress_specs(budgets, prefill_tokens: int, cfg) -> list:
    """The torch side's streams: the full cache, then every press of :data:`KVPRESS_STREAMS` at every
    budget, at the project's kept-token count, with the project's settings where a press has them."""
    kw = dict(
        StreamingLLMPress=dict(n_sink=cfg.sink_windows * cfg.window),
        SnapKVPress=dict(window_size=cfg.snap_obs_tokens, kernel_size=cfg.snap_kernel),
        WindowSnapKVPress=dict(obs=cfg.snap_obs_tokens, kernel=cfg.snap_kernel, window=cfg.window,
                               sink_windows=cfg.sink_windows),
        TOVAPress={}, KnormPress={}, ExpectedAttentionPress={},
    )
    out = [dict(key="full", press="full", n_keep=prefill_tokens, budget=1.0)]
    for i, f in enumerate(budgets):
        n = n_keep_tokens(f, prefill_tokens, cfg)
        for key, press, _ in KVPRESS_STREAMS:
            out.append(dict(key=f"{key}@{f:g}", press=press, n_keep=n, budget=float(f), kwargs=kw[press],
                            hook_check=i == 0 and key in MATCHED))
    return out


def compare_document(doc: str, res: dict, np_logits: np.ndarray, kv: dict, specs: list, cfg,
                     labels: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One document: (outcomes, agreement).  ``res``: the project's :func:`run_document` result
    (with ``tiers``); ``np_logits`` its logits (D, B, V); ``kv``: the torch side's arrays
    (``logits/<key>``, ``kept/<key>``); ``specs``: :func:`kvpress_specs`."""

    streams = res["streams"]
    rows, agree = [], []
    full_np = np_logits[:, 0]
    for i, (pol, frac) in enumerate(streams):
        kl, t1 = kl_top1(full_np, np_logits[:, i])
        rows.append(dict(document=doc, implementation="project (numpy)", policy=pol,
                         label=labels.get(pol, pol), budget=float(frac), kl=float(kl.mean()),
                         top1=float(t1.mean()), fits=bool(res["fits"][i])))
    full_kv = kv["logits/full"]
    for s in specs:
        kl, t1 = kl_top1(full_kv, kv[f"logits/{s['key']}"])
        base = s["key"].split("@")[0]
        rows.append(dict(document=doc, implementation="kvpress (torch)", policy=base,
                         label=labels.get(base, base), budget=float(s["budget"]), kl=float(kl.mean()),
                         top1=float(t1.mean()), fits=True))
    d_full = float(np.abs(full_np - full_kv).max())
    agree.append(dict(document=doc, pair="full cache", budget=1.0, kept_tokens=int(specs[0]["n_keep"]),
                      identical_heads=1.0, jaccard=1.0, max_logit_diff=d_full, kl_project=0.0,
                      kl_kvpress=0.0))
    idx = {s: i for i, s in enumerate(streams)}
    tiers0 = res["tiers"][0]
    for s in specs[1:]:
        base = s["key"].split("@")[0]
        if base not in MATCHED:
            continue
        i = idx[(MATCHED[base], float(s["budget"]))]
        ours = kept_from_tiers(tiers0[i], cfg.window, FULL, res["prefill_tokens"] // cfg.window)
        theirs = kv[f"kept/{s['key']}"]
        kl_o, _ = kl_top1(full_np, np_logits[:, i])
        kl_k, _ = kl_top1(full_kv, kv[f"logits/{s['key']}"])
        agree.append(dict(document=doc, pair=f"{MATCHED[base]} vs {base}", budget=float(s["budget"]),
                          kept_tokens=int(s["n_keep"]), identical_heads=identical_share(ours, theirs),
                          jaccard=jaccard(ours, theirs),
                          max_logit_diff=float(np.abs(np_logits[:, i] - kv[f"logits/{s['key']}"]).max()),
                          kl_project=float(kl_o.mean()), kl_kvpress=float(kl_k.mean())))
    return pd.DataFrame(rows), pd.DataFrame(agree)


def differences_table() -> pd.DataFrame:
    rows = [dict(policy="SnapKV", aspect=a, project=p, kvpress=k, project_definition_in_kvpress=w)
            for a, p, k, w in SNAPKV_DIFFERENCES]
    rows += [dict(policy="StreamingLLM", aspect=a, project=p, kvpress=k,
                  project_definition_in_kvpress="the protocol: window-multiple budgets, "
                  "no decoding re-decision")
             for a, p, k in STREAMING_DIFFERENCES]
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ what the chapter reads
def crosscheck_result():
    """The committed artifact (or None when it has not been computed)."""

    return read_artifact(ARTIFACT) if ARTIFACT in set(list_artifacts()) else None


def check_schema(art) -> None:
    """Raise if the artifact lacks a table or column the chapter reads."""
    need = dict(outcomes={"document", "implementation", "policy", "label", "budget", "kl", "top1"},
                agreement={"document", "pair", "budget", "kept_tokens", "identical_heads", "jaccard",
                           "max_logit_diff", "kl_project", "kl_kvpress"},
                differences={"policy", "aspect", "project", "kvpress"})
    for t, cols in need.items():
        if t not in art.tables:
            raise ValueError(f"results/{ARTIFACT} has no table {t!r}; rerun `make crosscheck`")
        miss = cols - set(art.tables[t].columns)
        if miss:
            raise ValueError(f"results/{ARTIFACT}/{t}.csv lacks {sorted(miss)}; rerun `make crosscheck`")


CHAPTER_ROWS = (("project (numpy)", "qevict_recall"), ("project (numpy)", "qevict_dequant"),
                ("project (numpy)", "kivi2"), ("project (numpy)", "h2o"), ("project (numpy)", "tova"),
                ("kvpress (torch)", "kvp_tova"), ("project (numpy)", "snapkv"),
                ("kvpress (torch)", "kvp_snapkv"), ("kvpress (torch)", "kvp_snapkv_window"),
                ("project (numpy)", "streaming"), ("kvpress (torch)", "kvp_streaming"),
                ("kvpress (torch)", "kvp_knorm"), ("kvpress (torch)", "kvp_expected"))


def chapter_table(art) -> pd.DataFrame:
    """Mean KL (nats) and top-1 agreement over the documents, one row per (implementation, policy),
    one column pair per budget, in :data:`CHAPTER_ROWS`' order."""
    check_schema(art)
    o = art.tables["outcomes"]
    o = o[o.policy != "full"]
    m = o.groupby(["implementation", "policy", "label", "budget"], as_index=False)[["kl", "top1"]].mean()
    keep = [r for r in CHAPTER_ROWS if ((m.implementation == r[0]) & (m.policy == r[1])).any()]
    out = []
    for impl, pol in keep:
        sub = m[(m.implementation == impl) & (m.policy == pol)]
        row = {"implementation": impl, "policy": sub.label.iloc[0]}
        for _, r in sub.sort_values("budget").iterrows():
            row[f"KL {r.budget:.0%}"] = r.kl
            row[f"top-1 {r.budget:.0%}"] = r.top1
        out.append(row)
    return pd.DataFrame(out)


def agreement_summary(art) -> dict:
    """The numbers the chapter's sentences glue: documents and budgets, the full-cache logit gap,
    StreamingLLM's identical kept sets and logit gap, SnapKV's Jaccard and KL difference (kvpress's
    definition and the project's inside kvpress)."""
    check_schema(art)
    a = art.tables["agreement"]
    o = art.tables["outcomes"]

    def pick(pair):
        s = a[a.pair == pair]
        if not len(s):
            raise ValueError(f"results/{ARTIFACT}: no rows for {pair!r}; rerun `make crosscheck`")
        return s

    st, sk = pick("streaming vs kvp_streaming"), pick("snapkv vs kvp_snapkv")
    sw = pick("snapkv vs kvp_snapkv_window")
    full = pick("full cache")
    return dict(
        documents=int(o.document.nunique()), budgets=sorted(float(b) for b in st.budget.unique()),
        full_logit_diff=float(full.max_logit_diff.max()),
        streaming_identical=float(st.identical_heads.mean()),
        streaming_logit_diff=float(st.max_logit_diff.max()),
        streaming_within_tol=bool((st.max_logit_diff <= LOGIT_TOLERANCE).all()),
        snapkv_jaccard=float(sk.jaccard.mean()), snapkv_jaccard_min=float(sk.jaccard.min()),
        snapkv_kl_diff=float((sk.kl_kvpress - sk.kl_project).mean()),
        snapkv_window_jaccard=float(sw.jaccard.mean()),
        snapkv_window_identical=float(sw.identical_heads.mean()),
        snapkv_window_logit_diff=float(sw.max_logit_diff.max()),
        tolerance=LOGIT_TOLERANCE,
    )


def _pct(x: float) -> str:
    return f"{x:.0%}" if x in (0.0, 1.0) else f"{x:.1%}"


def chapter_glue(art) -> list:
    """(glue key, text) for chapter 4's section on the crosscheck; ``art`` None: every text says the
    artifact has not been computed and how to compute it."""
    keys = ("ch4_xc_setup", "ch4_xc_full", "ch4_xc_streaming", "ch4_xc_snapkv", "ch4_xc_snapkv_window",
            "ch4_xc_differences", "ch4_xc_extra", "ch4_xc_provenance")
    if art is None:
        return [(k, "not computed (run `make crosscheck`)") for k in keys]
    s = agreement_summary(art)
    p = art.provenance["params"]
    diffs = art.tables["differences"]
    o = art.tables["outcomes"]
    m = (o[o.policy != "full"].groupby(["implementation", "policy", "label", "budget"], as_index=False)["kl"]
         .mean())
    lo = min(s["budgets"])
    at = m[m.budget == lo].set_index("policy")
    lab = dict(zip(m.policy, m.label))
    extra = [k for k in ("kvp_knorm", "kvp_expected") if k in at.index]
    ours = [k for k in ("qevict_recall", "h2o", "snapkv", "streaming") if k in at.index]
    best = ours[0] if ours else None
    extra_txt = "; ".join(f"{lab[k].split(' (')[0]} {at.loc[k, 'kl']:.3f}" for k in extra + ours)
    if best is not None and extra:
        better = [lab[k].split(" (")[0] for k in extra if at.loc[k, "kl"] < at.loc[best, "kl"]]
        extra_txt += (f" (mean KL in nats at the {lo:.0%} budget; " + (
            f"{' and '.join(better)} below {lab[best].split(' (')[0]}" if better
            else f"neither kvpress press below {lab[best].split(' (')[0]}") + ")")
    snap = diffs[diffs.policy == "SnapKV"]
    return [
        ("ch4_xc_setup", f"{s['documents']} documents (the default run's), {p['prefill_tokens']:,} prefill "
                         f"+ {p['decode_tokens']} decoded tokens, budgets "
                         + ", ".join(f"{b:.0%}" for b in s["budgets"])),
        ("ch4_xc_full", f"{s['full_logit_diff']:.1e}"),
        ("ch4_xc_streaming", f"the kept positions are identical in {_pct(s['streaming_identical'])} of "
                             "(layer, KV head, document, budget) and the next-token logits differ by at "
                             "most "
                             f"{s['streaming_logit_diff']:.1e} (tolerance {s['tolerance']:g}): "
                             + ("agreement" if s["streaming_within_tol"] and s["streaming_identical"] == 1
                                else "**disagreement**")),
        ("ch4_xc_snapkv", f"Jaccard {s['snapkv_jaccard']:.2f} of the kept positions (lowest "
                          f"{s['snapkv_jaccard_min']:.2f}), kvpress's KL minus the project's "
                          f"{s['snapkv_kl_diff']:+.4f} nats on average"),
        ("ch4_xc_snapkv_window", f"Jaccard {s['snapkv_window_jaccard']:.3f}, identical kept positions in "
                                 f"{_pct(s['snapkv_window_identical'])} of (layer, KV head, document, "
                                 "budget), "
                                 f"logits within {s['snapkv_window_logit_diff']:.1e}"),
        ("ch4_xc_differences", "; ".join(f"{r.aspect}: the project {r.project}, kvpress {r.kvpress}"
                                         for r in snap.itertuples())),
        ("ch4_xc_extra", extra_txt),
        ("ch4_xc_provenance", art.describe()),
    ]


# ------------------------------------------------------------------------------ the run
class _Recorder:
    """The numpy model, recording every decoding step's logits (D, B, V) for the comparison."""

    def __init__(self, model):
        self._m, self.logits = model, []

    def __getattr__(self, name):
        return getattr(self._m, name)

    def decode_step(self, *a, **k):
        out = self._m.decode_step(*a, **k)
        self.logits.append(np.asarray(out, np.float32).copy())
        return out


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the torch side): with other processes on
    the cores, the wall time overstates what the run needs."""
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime


def kvpress_python() -> Path:
    py = VENV / "bin" / "python"
    if not py.exists():
        raise FileNotFoundError(f"{py} not found: `make crosscheck` creates the crosscheck environment "
                                "from requirements-crosscheck.txt")
    return py


def main(argv=None) -> int:
    d = SCHEMA.defaults()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--documents", nargs="+", default=list(d["documents"]))
    ap.add_argument("--prefill-tokens", type=int, default=d["prefill_tokens"])
    ap.add_argument("--decode-tokens", type=int, default=d["window_tokens"])
    ap.add_argument("--budgets", type=float, nargs="+", default=list(d["budgets"]))
    ap.add_argument("--policies", nargs="+", default=list(PROJECT_POLICIES), choices=list(POLICIES),
                    help="the project's policies run on the numpy side")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print the comparison, write no artifact")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    before = code_hash(MODULES)
    c = SCHEMA.config(dict(d, documents=a.documents, prefill_tokens=a.prefill_tokens,
                           decode_tokens=a.decode_tokens, budgets=a.budgets))
    cfg = policy_config(c)
    P, D = a.prefill_tokens, a.decode_tokens
    if D > cfg.window:
        raise SystemExit(f"--decode-tokens {D} > window {cfg.window}: kvpress compresses only at the "
                         "prefill, so the comparison decodes inside the first open window (no re-decision)")
    tuned = tuning.load(d["tuned_settings"])
    missing = sorted(set(MATCHED.values()) - set(a.policies))
    if missing:
        raise SystemExit(f"--policies must include {missing}: kvpress's presses are matched with them")
    over = tuning.overrides(tuned, cfg, a.policies, a.budgets)
    tok = load_tokenizer()
    w = c.workload
    docs = {s: load_document(s, tok, P + D + 1, prefill_tokens=P, n_needles=w.n_needles,
                             n_queries=w.n_queries, seed=w.seed).tokens for s in a.documents}
    specs = kvpress_specs(a.budgets, P, cfg)
    labels = {**POLICY_LABELS, **{k: lab for k, _, lab in KVPRESS_STREAMS}}
    with tempfile.TemporaryDirectory(prefix="crosscheck-") as tmp:
        tmp = Path(tmp)
        jd = []
        for i, (s, ids) in enumerate(docs.items()):
            np.save(tmp / f"doc{i}.npy", ids)
            jd.append(dict(name=f"doc{i}", spec=s, ids=str(tmp / f"doc{i}.npy")))
        job = dict(gguf=gguf_path(), prefill_tokens=P, decode_tokens=D, streams=specs, documents=jd,
                   out_dir=str(tmp / "out"), threads=a.threads)
        (tmp / "job.json").write_text(json.dumps(job))
        t1 = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(a.threads)}
        subprocess.run([str(kvpress_python()), "-m", "analysis.qevict.kvpress_side", str(tmp / "job.json")],
                       check=True, env=env, cwd=REPO)
        t_kv = time.perf_counter() - t1
        timing = json.loads((tmp / "out" / "timing.json").read_text())
        model = load_model()
        outs, agrees, t_np = [], [], 0.0
        for j in jd:
            rec = _Recorder(model)
            t2 = time.perf_counter()
            res = run_document(rec, docs[j["spec"]], P, D, a.policies, a.budgets, cfg, record_tiers=True,
                               overrides=over)
            t_np += time.perf_counter() - t2
            kv = dict(np.load(tmp / "out" / f"{j['name']}.npz"))
            o, g = compare_document(j["spec"], res, np.stack(rec.logits), kv, specs, cfg, labels)
            outs.append(o)
            agrees.append(g)
            print(g.to_string(index=False), flush=True)
    outcomes, agreement = pd.concat(outs, ignore_index=True), pd.concat(agrees, ignore_index=True)
    st = agreement[agreement.pair == "streaming vs kvp_streaming"]
    ok = bool((st.identical_heads == 1).all() and (st.max_logit_diff <= LOGIT_TOLERANCE).all())
    print(f"StreamingLLM: kept sets identical in {st.identical_heads.mean():.1%} of "
          "(layer, head, document, budget); "
          f"max |logit difference| {st.max_logit_diff.max():.2e} (tolerance {LOGIT_TOLERANCE:g}): "
          f"{'PASS' if ok else 'FAIL'}")
    if a.no_write:
        return 0 if ok else 1
    if code_hash(MODULES) != before:
        print("the code changed during the run: no artifact written", file=sys.stderr)
        return 1
    cmd = "make crosscheck"
    if (a.documents, P, D, a.budgets, a.policies) != (list(d["documents"]), d["prefill_tokens"],
                                                      d["window_tokens"], list(d["budgets"]),
                                                      list(PROJECT_POLICIES)):
        cmd = ("python -m analysis.qevict.crosscheck --documents " + " ".join(a.documents)
               + f" --prefill-tokens {P} --decode-tokens {D} --budgets "
               + " ".join(f"{b:g}" for b in a.budgets) + " --policies " + " ".join(a.policies))
    write_artifact(ARTIFACT, dict(outcomes=outcomes, agreement=agreement, differences=differences_table()),
                   modules=MODULES, command=cmd, wall_seconds=time.perf_counter() - t0,
                   params=dict(documents=a.documents, prefill_tokens=P, decode_tokens=D, budgets=a.budgets,
                               policies=a.policies,
                               window=cfg.window, sink_windows=cfg.sink_windows,
                               snap_obs_tokens=cfg.snap_obs_tokens,
                               snap_kernel=cfg.snap_kernel, tuned_settings=d["tuned_settings"]),
                   extra=dict(versions=timing.get("versions", {}), seconds_kvpress=round(t_kv, 1),
                              seconds_numpy=round(t_np, 1), cpu_seconds=round(cpu_seconds(), 1),
                              logit_tolerance=LOGIT_TOLERANCE, streaming_pass=ok,
                              hook_check=timing.get("hook_check", {})))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
