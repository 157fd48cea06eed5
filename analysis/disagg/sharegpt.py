"""ShareGPT's per-request lengths for DistServe's cell, as a committed derived artifact.

DistServe samples ShareGPT for its chatbot workload with OPT models but publishes neither its sample
nor its lengths (only their distribution, its Figure 7). The vLLM paper's SOSP'23 artifact publishes
the (input, output) token counts of ShareGPT's first rounds under the OPT tokenizer: the data registry
entry ``sharegpt_opt_lengths`` (84,226 pairs, a pickle of int 2-tuples). That file is not in the
shared data mirror and CI reaches only package registries, so the book never reads it: this module
draws a seeded sample of the pairs whose prompt and output fit OPT's 2,048-token context together
(each at least one token, as the vLLM paper filtered them; their means are the paper's printed
161.31 / 337.99) and commits it as ``results/sharegpt_lengths/`` (table ``pairs``, its rows in the
drawn order) with :mod:`analysis.artifacts`' provenance: the source file's registry key, URL and
sha256, the filter, the seed, the command and the code hash (stale when this module changes).

    make sharegpt-lengths                        # = python -m analysis.disagg.sharegpt
    python -m analysis.disagg.sharegpt --n 4000 --seed 0 --max-context 2048

:func:`lengths` draws a replay's requests from the committed sample (``n`` of them with a seed,
without replacement: a uniform sample of a uniform sample); a tighter context than the sample's
filters it further; a wider one, or more requests than it holds, is an error that says how to derive
a larger sample.
"""
from __future__ import annotations

import argparse
import pickle
import pickletools
import sys
import time
import warnings

import numpy as np
import pandas as pd

from .. import artifacts, data

REGISTRY_KEY = "sharegpt_opt_lengths"
ARTIFACT = "sharegpt_lengths"
MODULES = ["analysis.disagg.sharegpt"]
N_SAMPLE = 4000          # pairs committed (DistServe's cell replays 600 a rate; tests draw up to this)
SEED = 0
MAX_CONTEXT = 2048.0     # OPT's context: prompt + output within it
COMMAND = "make sharegpt-lengths"
_PICKLE_CODE_OPS = {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "BUILD",
                    "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"}


class StaleLengthsWarning(UserWarning):
    """The committed length sample was derived by other code than this module's current source."""


def read_pairs(path) -> np.ndarray:
    """The (input, output) token counts of the registered length pickle at ``path``, as an ``(n, 2)``
    float array, read only after checking the pickle holds no opcode that runs code."""
    raw = open(path, "rb").read()
    try:
        ops = {op.name for op, _, _ in pickletools.genops(raw)}
    except Exception as e:
        raise data.DataError(f"{path} is not the ShareGPT length pickle ({e}); delete it and fetch it again "
                             f"(data/registry.yaml: {REGISTRY_KEY})") from e
    if ops & _PICKLE_CODE_OPS:  # never run code from a data file: plain lists and tuples of ints only
        raise data.DataError(f"{path} holds pickle opcodes that run code ({sorted(ops & _PICKLE_CODE_OPS)}); "
                             f"it is not the registered ShareGPT length file: delete it")
    a = np.asarray(pickle.loads(raw), dtype=float)
    if a.ndim != 2 or a.shape[1] != 2 or len(a) == 0 or not np.all(a >= 0):
        raise data.DataError(f"{path}: expected a list of (input, output) token counts, got shape {a.shape}")
    return a


def within(a: np.ndarray, max_context: float) -> np.ndarray:
    """The pairs of ``a`` whose prompt and output fit ``max_context`` tokens together, each >= 1 token."""
    return a[(a.sum(axis=1) <= max_context) & (a >= 1).all(axis=1)]


def derive(*, n: int = N_SAMPLE, seed: int = SEED, max_context: float = MAX_CONTEXT, source=None):
    """Draw ``n`` pairs with ``seed`` (without replacement) from the registered file's pairs within
    ``max_context`` tokens and write the artifact ``results/sharegpt_lengths/``. ``source``: a path
    to the file (default: the data registry's verified copy); its sha256 must be the registry's."""
    t0 = time.time()
    entry = data.registry()[REGISTRY_KEY]
    src = data.path(REGISTRY_KEY) if source is None else source
    got = data.sha256(src)
    if got != entry["sha256"]:
        raise data.DataError(f"{src}: sha256 {got}, the registry's {REGISTRY_KEY} is {entry['sha256']}; "
                             f"fetch the original from {entry['url']}")
    a = read_pairs(src)
    ok = within(a, max_context)
    if not 1 <= n <= len(ok):
        raise ValueError(f"n must be 1..{len(ok)} (pairs within {max_context:g} tokens), got {n}")
    pick = np.random.default_rng(seed).choice(len(ok), size=int(n), replace=False)
    pairs = pd.DataFrame({"input": ok[pick, 0].astype(int), "output": ok[pick, 1].astype(int)})
    return artifacts.write_artifact(
        ARTIFACT, {"pairs": pairs}, modules=MODULES, wall_seconds=time.time() - t0,
        command=f"{COMMAND} (python -m analysis.disagg.sharegpt --n {n} --seed {seed} "
                f"--max-context {max_context:g})",
        params={"n": int(n), "seed": int(seed), "max_context": float(max_context)},
        notes="a seeded sample of ShareGPT's (input, output) token counts under the OPT tokenizer; "
              "no text",
        extra={"source": {"registry_key": REGISTRY_KEY, "url": entry["url"], "sha256": got,
                          "pairs_in_file": int(len(a)), "pairs_within_context": int(len(ok)),
                          "means_within_context": [float(ok[:, 0].mean()), float(ok[:, 1].mean())]}})


def sample() -> artifacts.Artifact:
    """The committed sample (:class:`analysis.artifacts.Artifact`), with a clear error if it is missing."""
    try:
        art = artifacts.read_artifact("sharegpt_lengths")
    except FileNotFoundError as e:
        raise data.DataError(f"no committed ShareGPT length sample results/{ARTIFACT}/: derive it with "
                             f"`{COMMAND}` (reads the registry file {REGISTRY_KEY})") from e
    if "pairs" not in art.tables:
        raise data.DataError(f"results/{ARTIFACT}/ has no table pairs.csv: derive it again with `{COMMAND}`")
    return art


def lengths(n: int, *, max_context: float = MAX_CONTEXT, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (input, output) pairs drawn with ``seed`` without replacement from the committed sample's
    pairs within ``max_context`` tokens. A stale sample (derived by other code) warns
    (:class:`StaleLengthsWarning`); more requests than the sample holds, or a wider context than it
    was filtered to, is an error saying how to derive a larger one."""
    art = sample()
    a = art.tables["pairs"][["input", "output"]].to_numpy(dtype=float)
    ctx = float(art.provenance["params"]["max_context"])
    if art.stale:
        warnings.warn(f"results/{ARTIFACT} is stale ({'; '.join(art.stale_reasons)}): derive it again "
                      f"with `{COMMAND}`", StaleLengthsWarning, stacklevel=2)
    if max_context > ctx:
        raise ValueError(f"the committed ShareGPT sample holds pairs within {ctx:g} tokens, asked for "
                         f"{max_context:g}: derive a sample with `python -m analysis.disagg.sharegpt "
                         f"--max-context {max_context:g}`")
    a = within(a, max_context)
    if n < 1 or n > len(a):
        raise ValueError(f"n must be 1..{len(a)} requests (the committed ShareGPT sample's pairs within "
                         f"{max_context:g} tokens), got {n}; derive a larger sample with "
                         f"`python -m analysis.disagg.sharegpt --n N`")
    pick = np.random.default_rng(seed).choice(len(a), size=int(n), replace=False)
    return a[pick, 0].copy(), a[pick, 1].copy()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=N_SAMPLE, help=f"pairs to commit (default {N_SAMPLE})")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--max-context", type=float, default=MAX_CONTEXT)
    ap.add_argument("--source", help=f"the length pickle (default: the data registry's {REGISTRY_KEY})")
    a = ap.parse_args(argv)
    try:
        p = derive(n=a.n, seed=a.seed, max_context=a.max_context, source=a.source)
    except (data.DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
