"""QEvict's and MiKV's settings chosen on tuning documents, then frozen.

A seeded random search over each policy's knobs, per budget, with the same number of candidates for
QEvict (full-precision share, middle-tier bits 2/3/4, score decay, promotion margin) and MiKV (the
same knobs without promotion).  Every candidate of both policies at every budget runs as one more
stream of one lockstep batch per tuning document (:func:`analysis.qevict.runner.run_document`'s
``extra_streams``); the score of a candidate is the geometric mean over the tuning documents of its
next-token KL from the full cache; the untuned defaults are always candidate 0, so the search can
only improve on them *on the tuning documents*.  The winners are written with their provenance to a
JSON file (``results/qevict_tuned.json``) that the chapter reads, and that the evaluation never
rewrites: the evaluation documents must share no 32-token run with the tuning documents
(:func:`check_disjoint`).

    python -m analysis.qevict.tuning --out results/qevict_tuned.json
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import itertools
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..artifacts import code_hash, trace_read
from .config import policy_config
from .corpora import load_document
from .gguf_model import load_model
from .params import SCHEMA
from .policies import PolicyConfig
from .runner import run_document_cached
from .tokenizer import load_tokenizer

SEARCH_SPACE = {
    "full_share": [0.25, 0.5, 0.75],
    "qbits": [2, 3, 4],
    "score_decay": [0.8, 0.9, 0.95, 0.99],
    "promote_margin": [0.0, 0.25, 1.0],
}
TUNED_KNOBS = {"qevict_recall": ("full_share", "qbits", "score_decay", "promote_margin"),
               "mikv": ("full_share", "qbits", "score_decay")}
SHARES_SETTINGS = {"qevict_dequant": "qevict_recall"}  # the same policy, promoted another way
TUNING_DOCUMENTS = ["code:tarfile", "docs:difflib", "needle:statistics", "ref:numbers", "news:NEWS2x",
                    "tests:typing"]
DEFAULT_PATH = "results/qevict_tuned.json"


def candidates(policy: str, n: int, seed: int, defaults: PolicyConfig) -> list[dict]:
    """``n`` settings of ``policy``'s knobs: its defaults first, then a seeded sample (without
    replacement) of the rest of the grid."""
    knobs = TUNED_KNOBS[policy]
    base = {k: getattr(defaults, k) for k in knobs}
    grid = [dict(zip(knobs, v)) for v in itertools.product(*(SEARCH_SPACE[k] for k in knobs))]
    grid = [g for g in grid if g != base]
    rng = np.random.default_rng([seed, int(hashlib.sha256(policy.encode()).hexdigest()[:8], 16)])
    pick = rng.choice(len(grid), size=min(n - 1, len(grid)), replace=False)
    return [base] + [grid[i] for i in sorted(pick)]


def _shingles(tokens, k: int) -> set:
    t = np.asarray(tokens, np.int64)
    if len(t) < k:
        return {t.tobytes()}
    v = np.lib.stride_tricks.sliding_window_view(t, k)
    return {r.tobytes() for r in v}


def check_disjoint(tuning_docs: dict, eval_docs: dict, k: int = 32) -> None:
    """Raise if an evaluation document shares a run of ``k`` tokens with a tuning document
    ({spec: tokens} each); names the pair."""
    tun = {s: _shingles(t, k) for s, t in tuning_docs.items()}
    for es, et in eval_docs.items():
        sh = _shingles(et, k)
        for ts, tsh in tun.items():
            if sh & tsh:
                raise ValueError(f"evaluation document {es!r} shares {k}-token runs with tuning document "
                                 f"{ts!r}; choose evaluation documents from other sources")


def search(params: dict, tuning_documents=TUNING_DOCUMENTS, n_candidates: int = 6, seed: int = 0,
           verbose: bool = False) -> dict:
    """Run the search with chapter 4's parameters ``params`` (lengths, budgets, window, defaults)."""
    model, tok = load_model(), load_tokenizer()
    base = policy_config(params)
    P, D, budgets = params["prefill_tokens"], params["decode_tokens"], [float(b) for b in params["budgets"]]
    cands = {p: candidates(p, n_candidates, seed, base) for p in TUNED_KNOBS}
    extra, keys = [], []
    for p, cs in cands.items():
        for f in budgets:
            for i, c in enumerate(cs):
                extra.append((p, f, dataclasses.replace(base, **c)))
                keys.append((p, f, i))
    rows, doc_sha = [], {}
    t0 = time.perf_counter()
    for spec in tuning_documents:
        doc = load_document(spec, tok, P + D + 1, prefill_tokens=P, n_needles=params["n_needles"],
                            n_queries=params["n_queries"], seed=params["seed"])
        doc_sha[spec] = doc.sha256
        res = run_document_cached(model, doc.tokens, P, D, ["full"], [], base, extra_streams=extra,
                                  verbose=verbose)
        kl = res["kl"].mean(0)
        for j, (p, f, i) in enumerate(keys):
            rows.append(dict(document=spec, policy=p, budget=f, candidate=i, kl=float(kl[j + 1]),
                             **cands[p][i]))
        if verbose:
            print(f"{spec}: {time.perf_counter() - t0:.0f} s", flush=True)
    t = pd.DataFrame(rows)
    t["log_kl"] = np.log(t.kl + 1e-6)
    score = t.groupby(["policy", "budget", "candidate"], as_index=False).log_kl.mean()
    best = score.loc[score.groupby(["policy", "budget"]).log_kl.idxmin()]
    settings = {p: {} for p in TUNED_KNOBS}
    for _, r in best.iterrows():
        settings[r.policy][f"{r.budget:g}"] = dict(cands[r.policy][int(r.candidate)],
                                                   geo_mean_kl=float(np.exp(r.log_kl)))
    return dict(settings=settings, search_space=SEARCH_SPACE, tuned_knobs=TUNED_KNOBS,
                tuning_documents=list(tuning_documents), n_candidates=n_candidates, seed=seed,
                prefill_tokens=P, decode_tokens=D, budgets=budgets,
                defaults={k: getattr(base, k) for k in SEARCH_SPACE},
                candidates={p: cs for p, cs in cands.items()}, table=t.to_dict(orient="records"),
                seconds=time.perf_counter() - t0, inputs=_inputs(doc_sha))


def _provenance(command: str) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except Exception:  # not a git checkout
        commit = "unknown"
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return dict(commit=commit, code_sha256=h.hexdigest(), code="analysis/qevict/*.py",
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                machine=f"{platform.node()} {platform.machine()} {platform.processor()}".strip(),
                python=platform.python_version(), command=command)


def write(result: dict, path: str | Path, command: str) -> Path:
    """Write the search result with provenance atomically (tmp file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = dict(result, provenance=_provenance(command))
    tmp = path.with_suffix(path.suffix + ".partial")
    tmp.write_text(json.dumps(out, indent=1, default=float))
    tmp.replace(path)
    return path


def load(path: str | Path = DEFAULT_PATH) -> dict:
    """The frozen settings; a relative path is looked up from the working directory, then from the
    repository root (chapters execute in book/)."""
    path = Path(path)
    if not path.is_file() and not path.is_absolute():
        root = Path(__file__).resolve().parents[2] / path
        path = root if root.is_file() else path
    if not path.is_file():
        raise FileNotFoundError(f"no tuned settings at {path}; run the search first: "
                                f"python -m analysis.qevict.tuning --out {path}")
    trace_read(path)
    return json.loads(path.read_text())


# What the frozen settings depend on: the policies' logic, the quantizer (hashed with
# analysis.artifacts.code_hash) and the tokens of the tuning documents (their sha256, which covers the
# corpus code, the tokenizer and the text that ships with Python).  The engine (kvcache.py, runner.py,
# gguf_model.py) is excluded: its rewrites are tested to give the same results.  corpora.py as a whole
# is not an input: a change that leaves the tuning documents' tokens alone (e.g. new documents) does not
# make the settings stale, one that changes them does.
DEPENDS_ON_MODULES = ("analysis.qevict.policies", "analysis.qevict.quant")
# the files the settings were keyed on before they recorded their inputs (git diff since the commit)
DEPENDS_ON = ("analysis/qevict/policies.py", "analysis/qevict/quant.py", "analysis/qevict/corpora.py")


def _inputs(doc_sha: dict) -> dict:
    return dict(modules=list(DEPENDS_ON_MODULES), code_hash=code_hash(DEPENDS_ON_MODULES),
                documents=dict(doc_sha))


def document_hashes(tuning_documents, prefill_tokens: int, decode_tokens: int) -> dict:
    """{spec: sha256 of its tokens} of the tuning documents as :func:`search` loads them now (chapter
    4's defaults for the needle count, questions and seed)."""
    p = {k: v.default for k, v in SCHEMA.items()}
    tok = load_tokenizer()
    P, D = int(prefill_tokens), int(decode_tokens)
    out = {}
    for spec in tuning_documents:
        try:
            out[spec] = load_document(spec, tok, P + D + 1, prefill_tokens=P, n_needles=p["n_needles"],
                                      n_queries=p["n_queries"], seed=p["seed"]).sha256
        except (ValueError, OSError) as e:  # a document that no longer loads is not the one searched on
            out[spec] = f"cannot be loaded: {e}"
    return out


def stale_reasons(tuned: dict) -> list[str] | None:
    """Why the frozen settings no longer match their inputs (empty: current; None: cannot tell):
    another search space or set of tuning documents than the recorded ones; policies.py or quant.py
    hashing differently from the recorded code hash (:func:`analysis.artifacts.code_hash`); a tuning
    document whose tokens differ from the recorded sha256.  Settings written before their inputs
    were recorded fall back to ``git diff`` of :data:`DEPENDS_ON` since the recorded commit."""
    out = []
    if tuned.get("search_space") != SEARCH_SPACE:
        out.append("the search space changed")
    if tuned.get("tuning_documents") != list(TUNING_DOCUMENTS):
        out.append("the tuning documents changed")
    inputs = tuned.get("inputs")
    if inputs is not None:
        missing = set(DEPENDS_ON_MODULES) - set(inputs.get("modules", []))
        if missing:
            out.append(f"the recorded inputs do not cover {', '.join(sorted(missing))}")
        elif code_hash(inputs["modules"]) != inputs.get("code_hash"):
            out.append(f"{', '.join(inputs['modules'])} changed since the search (code hash)")
        now = document_hashes(tuned["tuning_documents"], tuned["prefill_tokens"], tuned["decode_tokens"])
        rec = inputs.get("documents", {})
        out += [f"tuning document {s} has other tokens than those searched on" for s in now
                if now[s] != rec.get(s)]
        return out
    root = Path(__file__).resolve().parents[2]
    commit = tuned.get("provenance", {}).get("commit", "unknown")
    try:
        r = subprocess.run(["git", "diff", "--name-only", commit, "--", *DEPENDS_ON], cwd=root,
                           capture_output=True, text=True, check=True)
    except Exception:  # no git, or the commit is not in this clone
        return out or None
    out += [f"{f} changed since commit {commit[:10]}" for f in r.stdout.split()]
    return out


def overrides(tuned: dict, base: PolicyConfig, policies, budgets) -> dict:
    """{(policy, frac): PolicyConfig} with the frozen settings of every tuned policy at every budget;
    a clear error when a budget was not tuned."""
    out = {}
    for p in policies:
        src = SHARES_SETTINGS.get(p, p)
        if src not in tuned["settings"]:
            continue
        for f in budgets:
            s = tuned["settings"][src].get(f"{float(f):g}")
            if s is None:
                raise ValueError(f"budget {f} was not tuned (tuned: {', '.join(tuned['settings'][src])}); "
                                 "rerun the search with these budgets or use the tuned budgets")
            out[(p, float(f))] = dataclasses.replace(base, **{k: s[k] for k in TUNED_KNOBS[src]})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_PATH)
    ap.add_argument("--candidates", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefill", type=int, default=SCHEMA["prefill_tokens"].default)
    ap.add_argument("--decode", type=int, default=SCHEMA["decode_tokens"].default)
    ap.add_argument("--window", type=int, default=SCHEMA["window_tokens"].default)
    ap.add_argument("--documents", nargs="*", default=TUNING_DOCUMENTS)
    a = ap.parse_args(argv)
    p = {k: v.default for k, v in SCHEMA.items()}
    p.update(prefill_tokens=a.prefill, decode_tokens=a.decode, window_tokens=a.window,
             group_size=min(p["group_size"], a.window), snap_obs_tokens=min(p["snap_obs_tokens"], a.window))
    res = search(p, a.documents, a.candidates, a.seed, verbose=True)
    cmd = "python -m analysis.qevict.tuning " + " ".join(argv if argv is not None else sys.argv[1:])
    print(write(res, a.out, cmd.strip()))


if __name__ == "__main__":
    main()
