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

from ..artifacts import code_hash, write_artifact
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
           "analysis.qevict.gguf_model", "analysis.qevict.ggufread", "analysis.qevict.lmhead",
           "analysis.qevict.corpora",
           "analysis.qevict.tokenizer", "analysis.qevict.quant", "analysis.qevict.tuning",
           "analysis.qevict.config", "analysis.qevict.params"]
# A matched pair of compressed caches agrees "within float tolerance" when its largest logit difference
# (over the vocabulary and the steps) is at most this many times the two full caches' own on the same
# document: compression adds no disagreement beyond the implementations' float32 arithmetic (other
# summation orders over 30 layers; the same dequantized Q4_1 weights). (A first, absolute tolerance of
# 5e-3 logits, set before any run, was below the full caches' own difference, about 1.5e-2.)
LOGIT_TOLERANCE_FACTOR = 2.0


def within_tolerance(pair_diff, full_diff) -> np.ndarray:
    """Whether a pair's max |logit difference| is within :data:`LOGIT_TOLERANCE_FACTOR` times the full
    caches' own (elementwise)."""
    return np.asarray(pair_diff) <= LOGIT_TOLERANCE_FACTOR * np.asarray(full_diff)

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
                      identical_heads=1.0, jaccard=1.0, max_logit_diff=d_full, full_logit_diff=d_full,
                      kl_project=0.0, kl_kvpress=0.0))
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
                          full_logit_diff=d_full, kl_project=float(kl_o.mean()),
                          kl_kvpress=float(kl_k.mean())))
    return pd.DataFrame(rows), pd.DataFrame(agree)


def differences_table() -> pd.DataFrame:
    rows = [dict(policy="SnapKV", aspect=a, project=p, kvpress=k, project_definition_in_kvpress=w)
            for a, p, k, w in SNAPKV_DIFFERENCES]
    rows += [dict(policy="StreamingLLM", aspect=a, project=p, kvpress=k,
                  project_definition_in_kvpress="the protocol: window-multiple budgets, "
                  "no decoding re-decision")
             for a, p, k in STREAMING_DIFFERENCES]
    return pd.DataFrame(rows)


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
    # the chapter's documents as the chapter builds them (its decode length: a needle document's
    # questions need it), of which the first P + D + 1 tokens are used
    n_doc = P + max(D, d["decode_tokens"]) + 1
    docs = {s: load_document(s, tok, n_doc, prefill_tokens=P, n_needles=w.n_needles, n_queries=w.n_queries,
                             seed=w.seed).tokens[: P + D + 1] for s in a.documents}
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
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(a.threads),
               "OMP_WAIT_POLICY": "PASSIVE"}  # idle OpenMP threads sleep instead of spinning
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
    ok = bool((st.identical_heads == 1).all()
              and within_tolerance(st.max_logit_diff, st.full_logit_diff).all())
    print(f"StreamingLLM: kept sets identical in {st.identical_heads.mean():.1%} of "
          "(layer, head, document, budget); "
          f"max |logit difference| {st.max_logit_diff.max():.2e}, "
          f"full caches' {st.full_logit_diff.max():.2e} "
          f"(tolerance {LOGIT_TOLERANCE_FACTOR:g}x): "
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
                              logit_tolerance_factor=LOGIT_TOLERANCE_FACTOR, streaming_pass=ok,
                              hook_check=timing.get("hook_check", {})))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
