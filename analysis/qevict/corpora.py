"""Real long documents from the Python standard library, and RULER-style needle retrieval on them.

Document specs (strings):

* ``code:<module>``: the source file of a standard-library module (e.g. ``code:argparse``),
  a code-completion document;
* ``docs:<module>``: the module's docstrings (module, classes, functions; ``inspect.cleandoc``-ed,
  in source order), English prose with examples;
* ``code:<m1>+<m2>+...``, ``docs:<m1>+<m2>+...``: several modules joined (blank line between), for
  long documents (8K tokens for SmolLM2, 32K for Gemma 3; see :data:`LONG_DOCUMENTS`);
* ``needle:<module>``: multi-key needle-in-a-haystack retrieval (RULER's "multikey NIAH"): the
  module's docstrings (continued with those of :data:`HAYSTACK_FALLBACK` if too short) as haystack,
  ``n_needles`` sentences "The special magic number for <key> is <6 digits>." inserted at seeded
  line boundaries of the prefill, and at the end of the decoded part ``n_queries`` questions, each
  followed by its answer.  The answer digits are the retrieval targets.

The text is whatever ships with the running Python (``sysconfig.get_paths()["stdlib"]``); every
document records its sha256 and the Python version, and the content hash keys the result cache.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import platform
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np

HAYSTACK_FALLBACK = ("turtle", "_pydecimal", "typing", "difflib", "doctest", "logging", "statistics")
NEEDLE_KEYS = (
    "apple", "river", "candle", "falcon", "garden", "harbor", "island", "jacket", "kettle", "lantern",
    "marble", "needle", "orchid", "pepper", "quartz", "saddle", "tunnel", "velvet", "walnut", "yogurt",
    "anchor", "bridge", "copper", "desert", "engine", "forest", "glacier", "hammer", "ivory", "jungle",
)


# Long documents from what ships with Python: each well over 32K tokens with either tokenizer.
LONG_DOCUMENTS = {
    "code": "code:typing+inspect+argparse+pydoc",
    "docs": "docs:typing+_pydecimal+turtle+doctest+logging+statistics",
}


def _prefix(tokenizer) -> np.ndarray:
    """Tokens that start every document (Gemma: BOS; SmolLM2: none)."""
    return np.asarray(getattr(tokenizer, "prefix", np.zeros(0, np.int64)), np.int64)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def module_file(module: str) -> Path:
    """Source file of a pure-Python standard-library module (``unittest.case``, ``logging``)."""
    if not module or any(c in module for c in "/\\") or module.startswith("."):
        raise ValueError(f"bad module name {module!r}")
    base = stdlib_dir().joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    raise FileNotFoundError(f"no pure-Python source for standard-library module {module!r} under {stdlib_dir()}")


def module_source(module: str) -> str:
    return module_file(module).read_text(encoding="utf-8")


def module_docstrings(module: str) -> str:
    """Docstrings of the module, its classes and functions, in source order, separated by blank lines."""
    tree = ast.parse(module_source(module))
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    docs = []
    for n in nodes:
        d = ast.get_docstring(n, clean=True)
        if d:
            docs.append(inspect.cleandoc(d))
    return "\n\n".join(docs) + "\n"


@dataclass
class Document:
    spec: str
    tokens: np.ndarray
    kind: str
    sha256: str
    python: str = field(default_factory=platform.python_version)
    answers: list = field(default_factory=list)  # [(start, end)] token index ranges of answer targets
    meta: dict = field(default_factory=dict)

    def __len__(self):
        return len(self.tokens)


def parse_spec(spec: str) -> tuple[str, str]:
    kind, sep, module = spec.partition(":")
    if not sep or kind not in GENRES or not module:
        kinds = ", ".join(f"'{g}:<name>'" for g in GENRES)
        raise ValueError(f"document spec {spec!r} must be one of {kinds}")
    return kind, module


def _sha(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, np.int64).tobytes()).hexdigest()


def load_document(spec: str, tokenizer, n_tokens: int, *, prefill_tokens: int | None = None,
                  n_needles: int = 4, n_queries: int = 2, seed: int = 0) -> Document:
    """Build document ``spec`` with exactly ``n_tokens`` tokens (a clear error if too short).

    For needle documents ``prefill_tokens`` (where the needles go) is required; the questions and
    answers end the document."""
    kind, module = parse_spec(spec)
    if n_tokens < 2:
        raise ValueError("n_tokens must be >= 2")
    if kind in ("code", "docs"):
        mods = module.split("+")
        get = module_source if kind == "code" else module_docstrings
        text = "\n\n".join(get(m) for m in mods)
        ids = np.r_[_prefix(tokenizer), tokenizer.encode(text)].astype(np.int64)
        if len(ids) < n_tokens:
            raise ValueError(f"document {spec} has {len(ids)} tokens, fewer than the {n_tokens} needed; "
                             f"choose a longer module or join several with '+' (e.g. {LONG_DOCUMENTS[kind]})")
        ids = ids[:n_tokens]
        return Document(spec, ids, kind, _sha(ids), meta=dict(source=[str(module_file(m)) for m in mods]))
    if kind in EXTRA_GENRES:
        text, source = EXTRA_GENRES[kind](module)
        ids = np.r_[_prefix(tokenizer), tokenizer.encode(text)].astype(np.int64)
        if len(ids) < n_tokens:
            raise ValueError(f"{spec} has {len(ids)} tokens, fewer than the {n_tokens} needed; "
                             f"choose another {kind} document")
        ids = ids[:n_tokens]
        return Document(spec, ids, kind, _sha(ids), meta=dict(source=source))
    if prefill_tokens is None:
        raise ValueError("needle documents need prefill_tokens")
    return needle_document(spec, module, tokenizer, n_tokens, prefill_tokens, n_needles, n_queries, seed)


def _haystack_tokens(module: str, tokenizer, need: int) -> np.ndarray:
    parts = [np.r_[_prefix(tokenizer), tokenizer.encode(module_docstrings(module))].astype(np.int64)]
    total = len(parts[0])
    for m in HAYSTACK_FALLBACK:
        if total >= need:
            break
        if m == module:
            continue
        parts.append(tokenizer.encode("\n" + module_docstrings(m)))
        total += len(parts[-1])
    ids = np.concatenate(parts)
    if len(ids) < need:
        raise ValueError(f"haystack for {module!r} too short ({len(ids)} < {need} tokens, with the fallback "
                         f"modules {', '.join(HAYSTACK_FALLBACK)})")
    return ids


def needle_document(spec, module, tokenizer, n_tokens, prefill_tokens, n_needles, n_queries, seed) -> Document:
    if not 1 <= n_queries <= n_needles <= len(NEEDLE_KEYS):
        raise ValueError(f"need 1 <= n_queries ({n_queries}) <= n_needles ({n_needles}) <= {len(NEEDLE_KEYS)}")
    rng = np.random.default_rng([seed, int(hashlib.sha256(spec.encode()).hexdigest()[:8], 16)])
    keys = [str(k) for k in rng.choice(NEEDLE_KEYS, size=n_needles, replace=False)]
    values = ["".join(str(d) for d in rng.integers(0, 10, size=6)) for _ in keys]
    needles = [tokenizer.encode(f"The special magic number for {k} is {v}.\n") for k, v in zip(keys, values)]
    queried = [int(i) for i in rng.choice(n_needles, size=n_queries, replace=False)]
    q_parts, answers_rel = [], []
    off = 0
    for qi in queried:
        k, v = keys[qi], values[qi]
        pre = tokenizer.encode(f"\nQuestion: What is the special magic number for {k}?\n"
                               f"Answer: The special magic number for {k} is ")
        ans = tokenizer.encode(v)
        post = tokenizer.encode(".\n")
        q_parts += [pre, ans, post]
        answers_rel.append((off + len(pre), off + len(pre) + len(ans)))
        off += len(pre) + len(ans) + len(post)
    qblock = np.concatenate(q_parts)
    n_after = n_tokens - prefill_tokens - len(qblock)
    if n_after < 0:
        raise ValueError(f"{n_tokens - prefill_tokens} decoded tokens cannot hold the {len(qblock)} question tokens")
    n_needle_tok = sum(len(x) for x in needles)
    n_hay_prefill = prefill_tokens - n_needle_tok
    if n_hay_prefill < 64:
        raise ValueError("prefill too short for the needles")
    hay = _haystack_tokens(module, tokenizer, n_hay_prefill + n_after)
    pre_hay = hay[:n_hay_prefill]
    # insertion points: line boundaries (after a token that ends with a newline) in the first 90%
    nl = np.array([i + 1 for i in range(16, int(0.9 * n_hay_prefill))
                   if tokenizer.token_to_str(int(pre_hay[i])).endswith("\u010a")])
    if len(nl) < n_needles:
        nl = np.arange(16, int(0.9 * n_hay_prefill))
    cut = np.sort(rng.choice(nl, size=n_needles, replace=False))
    pieces, prev = [], 0
    depth = []
    for c, nd in zip(cut, needles):
        pieces.append(pre_hay[prev:c])
        depth.append(sum(len(p) for p in pieces))
        pieces.append(nd)
        prev = c
    pieces.append(pre_hay[prev:])
    prompt = np.concatenate(pieces)
    assert len(prompt) == prefill_tokens
    tokens = np.concatenate([prompt, hay[n_hay_prefill:n_hay_prefill + n_after], qblock]).astype(np.int64)
    assert len(tokens) == n_tokens
    base = prefill_tokens + n_after
    answers = [(base + a, base + b) for a, b in answers_rel]
    meta = dict(keys=keys, values=values, queried=[keys[i] for i in queried],
                needle_positions=depth, haystack=module)
    return Document(spec, tokens, "needle", _sha(tokens), answers=answers, meta=meta)


# ----------------------------------------------------------------------------------------------
# Further genres: what ships with Python, no download.
#   ref:<topic>    the Python language reference (pydoc_data.topics, the text of `help()`), from
#                  <topic> on through the following topics in alphabetical order: technical prose
#   news:<file>    IDLE's release notes (idlelib/NEWS.txt, NEWS2x.txt, HISTORY.txt, from <file> on):
#                  a changelog, terse list items with issue numbers and names
#   tests:<module> the unit tests of a module (Lib/test/test_<module>.py): code of another kind,
#                  repetitive calls, assertions and literals
# ----------------------------------------------------------------------------------------------

NEWS_FILES = ("NEWS", "NEWS2x", "HISTORY")


def reference_text(topic: str) -> tuple[str, str]:
    keys = sorted(topics)
    if topic not in topics:
        raise ValueError(f"no language-reference topic {topic!r}; topics include {', '.join(keys[:12])}, ...")
    return "\n\n".join(topics[k] for k in keys[keys.index(topic):]), f"pydoc_data.topics[{topic}:]"


def news_text(name: str) -> tuple[str, str]:
    if name not in NEWS_FILES:
        raise ValueError(f"news document must be one of {', '.join(NEWS_FILES)}, got {name!r}")
    files = [stdlib_dir() / "idlelib" / f"{n}.txt" for n in NEWS_FILES[NEWS_FILES.index(name):]]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"IDLE release notes not found: {', '.join(missing)} (is idlelib installed?)")
    return "\n\n".join(f.read_text(encoding="utf-8") for f in files), str(files[0])


def test_source(module: str) -> tuple[str, str]:
    if not module or any(c in module for c in "/\\."):
        raise ValueError(f"bad module name {module!r}")
    f = stdlib_dir() / "test" / f"test_{module}.py"
    if not f.is_file():
        raise FileNotFoundError(f"no unit tests {f} (the Python test suite may not be installed)")
    return f.read_text(encoding="utf-8"), str(f)


EXTRA_GENRES = {"ref": reference_text, "news": news_text, "tests": test_source}
GENRES = ("code", "docs", "needle") + tuple(EXTRA_GENRES)
GENRE_LABELS = {"code": "source code", "docs": "API prose (docstrings)", "needle": "needle retrieval",
                "ref": "language reference", "news": "release notes", "tests": "unit tests"}
