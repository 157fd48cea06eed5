"""Gemma 3 270M: perplexity of chapter 4's numpy model against an independent implementation,
Hugging Face transformers (PyTorch, CPU) loading the same GGUF with its own GGUF reader.

    python benchmarks/check_gemma_transformers.py [--tokens 1024] [--module argparse]

Not part of `make test`: on first use it creates its own virtual environment (.cache/venv-ref) and
installs pinned torch (CPU build) + transformers + gguf into it from PyPI.  The same token ids (BOS +
the first tokens of a standard-library module's source, our tokenizer) go through both models in
float32; our K/V are not rounded to fp16 here (``kv_fp16=False``), since transformers keeps them in
float32.  Pass: relative perplexity difference <= 1e-3.  Prints both perplexities, the difference,
and the perplexity with our default fp16 K/V, and exits non-zero on failure.  The result is
committed as the artifact ``results/qevict_gemma_reference/`` (provenance:
:mod:`analysis.artifacts`), which chapter 4 shows.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

REF_PACKAGES = ["torch==2.13.0+cpu", "transformers==4.57.6", "gguf==0.19.0", "numpy==2.4.6",
                "accelerate==1.12.0"]
TOLERANCE = 1e-3

CHILD = textwrap.dedent("""
    import json, sys, numpy as np, torch
    from transformers import AutoModelForCausalLM
    path, ids_file = sys.argv[1], sys.argv[2]
    ids = np.load(ids_file)
    m = AutoModelForCausalLM.from_pretrained(str(__import__("pathlib").Path(path).parent),
                                             gguf_file=__import__("pathlib").Path(path).name,
                                             dtype=torch.float32, attn_implementation="eager")
    m.eval()
    with torch.no_grad():
        lg = m(torch.tensor(ids[None], dtype=torch.long)).logits[0].double()
    lp = torch.log_softmax(lg, -1)
    nll = -lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    c = m.config
    print(json.dumps(dict(ppl=float(torch.exp(nll.mean())), config=str(c.to_dict().get("layer_types")),
                          sliding_window=c.sliding_window,
                          rope_local=getattr(c, "rope_local_base_freq", None))))
""")


def ref_python(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", *REF_PACKAGES], check=True)
    return py


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--module", default="argparse")
    a = ap.parse_args(argv)
    import time

    import pandas as pd

    from analysis.artifacts import code_hash, write_artifact
    from analysis.qevict import corpora
    from analysis.qevict.gemma_model import Gemma3Model, gemma_gguf_path
    from analysis.qevict.tokenizer import load_tokenizer

    t0 = time.perf_counter()
    # what the perplexities depend on: the model and tokenizer code, and the token ids (their sha256 is
    # recorded; tests/test_qevict_gemma.py checks that corpora + tokenizer still give the same ids)
    modules = ["analysis.qevict.gemma_model", "analysis.qevict.lmhead", "analysis.qevict.tokenizer",
               "analysis.qevict.ggufread", "analysis.qevict.gguf_model"]
    before = code_hash(modules)
    path = gemma_gguf_path()
    tok = load_tokenizer(path)
    ids = np.r_[tok.prefix, tok.encode(corpora.module_source(a.module))][: a.tokens].astype(np.int64)
    work = REPO / ".cache" / "ref"
    work.mkdir(parents=True, exist_ok=True)
    np.save(work / "ids.npy", ids)
    model = Gemma3Model.from_gguf(path, kv_fp16=False)
    tg = np.r_[ids[1:], -1]
    ours = float(np.exp(np.nanmean(model.prefill(ids, logits="nll", targets=tg)["nll"])))
    model.kv_fp16 = True
    ours16 = float(np.exp(np.nanmean(model.prefill(ids, logits="nll", targets=tg)["nll"])))
    py = ref_python(REPO / ".cache" / "venv-ref")
    (work / "child.py").write_text(CHILD)
    out = subprocess.run([str(py), str(work / "child.py"), path, str(work / "ids.npy")], check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    ref = json.loads(out.stdout.strip().splitlines()[-1])
    rel = abs(ours - ref["ppl"]) / ref["ppl"]
    print(f"tokens {len(ids)} of {a.module}.py (BOS first)")
    print(f"numpy (this repo), fp32 K/V    ppl {ours:.5f}")
    print(f"numpy (this repo), fp16 K/V    ppl {ours16:.5f}")
    print(f"transformers {REF_PACKAGES[1]}  ppl {ref['ppl']:.5f}   (layer types {ref['config']}, "
          f"sliding window {ref['sliding_window']}, local RoPE base {ref['rope_local']})")
    verdict = "PASS" if rel <= TOLERANCE else "FAIL"
    print(f"relative difference {rel:.2e}  (tolerance {TOLERANCE:g}): {verdict}")
    if code_hash(modules) == before:
        tbl = pd.DataFrame([dict(
            module=a.module, tokens=len(ids), ppl_numpy_fp32_kv=ours, ppl_numpy_fp16_kv=ours16,
            ppl_transformers=ref["ppl"], reference=REF_PACKAGES[1] + " + " + REF_PACKAGES[0],
            rel_diff=rel, tolerance=TOLERANCE, verdict=verdict)])
        cmd = f"python benchmarks/check_gemma_transformers.py --tokens {a.tokens} --module {a.module}"
        write_artifact("qevict_gemma_reference", {"perplexity": tbl}, modules=modules, command=cmd,
                       wall_seconds=time.perf_counter() - t0, params=dict(tokens=a.tokens, module=a.module),
                       extra=dict(tokens_sha256=hashlib.sha256(ids.tobytes()).hexdigest()))
    return 0 if rel <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
