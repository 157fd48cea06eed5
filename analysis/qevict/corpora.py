"""Real long documents from the Python standard library, and RULER-style needle retrieval on them.

Document specs (strings):

* ``code:<module>``: the source file of a standard-library module (e.g. ``code:argparse``),
  a code-completion document;
* ``docs:<module>``: the module's docstrings (module, classes, functions; ``inspect.cleandoc``-ed,
  in source order), English prose with examples;
* ``code:<m1>+<m2>+...``, ``docs:<m1>+<m2>+...``: several modules joined (blank line between), for
  long documents (8K tokens for SmolLM2, 32K for Gemma 3; see :data:`LONG_DOCUMENTS`);
* ``needle:<m1>+<m2>+...``: the same with the docstrings of the modules named as haystack, and
  no fallback (a clear error if they are too short);
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
import functools
import gzip
import hashlib
import html
import inspect
import io
import platform
import re
import sysconfig
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np
import pandas as pd

from analysis import data

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
    if "+" in module:  # several modules named: their docstrings alone, no fallback
        mods = module.split("+")
        text = "\n".join(module_docstrings(m) for m in mods)
        ids = np.r_[_prefix(tokenizer), tokenizer.encode(text)].astype(np.int64)
        if len(ids) < need:
            raise ValueError(f"haystack {module!r} too short ({len(ids)} < {need} tokens); join more modules "
                             f"with '+'")
        return ids
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


# ----------------------------------------------------------------------------------------------
# Genres outside Python: text read from Debian packages registered in data/registry.yaml
# (url, sha256, licence; fetched and verified by analysis.data), unpacked here with the standard
# library (a .deb is an ar archive holding data.tar.xz):
#   lit:<book>[+<book>...]      literature: the World English Bible (sword-text-web, a SWORD zText
#                               module: zlib blocks, one per book, indexed by ot.bzs/nt.bzs), books by
#                               OSIS id (Gen, Exod, Job, ...), OSIS markup and footnotes stripped
#   encyc:<letter>[-<letter>]   encyclopaedic prose: FOLDOC (dict-foldoc, a dictd database), the entries
#                               whose headword starts with those letters, in the dictionary's order,
#                               "{cross-reference}" braces removed
#   man:<page>.<section>[+...]  structured text: Linux man pages (manpages, roff), rendered to plain
#                               text (requests and font escapes removed, fill mode joined into lines)
# ----------------------------------------------------------------------------------------------

DEBIAN_SOURCES = {"lit": "debian_sword_text_web", "encyc": "debian_dict_foldoc", "man": "debian_manpages"}
SWORD_MODULE = "usr/share/sword/modules/texts/ztext/engWEB2015eb"
FOLDOC_DICT = "usr/share/dictd/foldoc.dict.dz"
FOLDOC_INDEX = "usr/share/dictd/foldoc.index"
MAN_DIR = "usr/share/man"


def ar_members(blob: bytes) -> dict[str, bytes]:
    """Members of a Unix ``ar`` archive (the container of a .deb) by name."""
    if not blob.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive (a .deb starts with '!<arch>\\n')")
    out, pos = {}, 8
    while pos + 60 <= len(blob):
        head = blob[pos:pos + 60]
        if head[58:60] != b"`\n":
            raise ValueError(f"corrupt ar member header at byte {pos}")
        name = head[:16].decode("ascii").strip().rstrip("/")
        size = int(head[48:58].decode("ascii").strip())
        out[name] = blob[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
    return out


def deb_files(blob: bytes) -> dict[str, bytes]:
    """The regular files of a .deb's ``data.tar`` (xz, gzip or uncompressed) by path without the
    leading ``./``; links and directories are left out."""
    members = ar_members(blob)
    names = [n for n in members if n.startswith("data.tar")]
    if not names:
        raise ValueError(f"no data.tar member in the .deb (members: {', '.join(members)})")
    name = names[0]
    mode = {"data.tar.xz": "r:xz", "data.tar.gz": "r:gz", "data.tar": "r:"}.get(name)
    if mode is None:
        raise ValueError(f"{name}: unsupported compression (xz, gzip or none)")
    out = {}
    with tarfile.open(fileobj=io.BytesIO(members[name]), mode=mode) as tar:
        for m in tar.getmembers():
            if m.isfile():
                out[m.name.removeprefix("./")] = tar.extractfile(m).read()
    return out


def debian_entry(kind: str) -> dict:
    """Registry entry (data/registry.yaml) of the Debian package behind genre ``kind``."""
    return data.registry()[DEBIAN_SOURCES[kind]]


@functools.lru_cache(maxsize=None)
def _package_files(name: str) -> dict[str, bytes]:
    return deb_files(data.path(name).read_bytes())


def package_files(kind: str) -> dict[str, bytes]:
    """Files of the (verified, cached) package of genre ``kind``."""
    return _package_files(DEBIAN_SOURCES[kind])


def _source(kind: str, what: str) -> str:
    e = debian_entry(kind)
    return f"Debian {e['package']} {e['version']}: {what}"


# --- literature: SWORD zText ------------------------------------------------------------------

def ztext_blocks(bzs: bytes, bzz: bytes) -> list[str]:
    """The decompressed blocks of a SWORD zText testament: ``.bzs`` holds one (offset, size,
    uncompressed size) little-endian uint32 triple per block of ``.bzz`` (zlib streams)."""
    if len(bzs) % 12:
        raise ValueError(f"block index of {len(bzs)} bytes is not a whole number of 12-byte entries")
    out = []
    for off, size, usize in np.frombuffer(bzs, "<u4").reshape(-1, 3).tolist():
        raw = zlib.decompress(bzz[off:off + size]) if size else b""
        if len(raw) != usize:
            raise ValueError(f"zText block at {off}: {len(raw)} bytes, index says {usize}")
        out.append(raw.decode("utf-8"))
    return out


_BOOK_DIV = re.compile(r'<div\b[^>]*\bosisID="([^"]+)"[^>]*\bsID="([^"]+)"[^>]*\btype="book"[^>]*/>')


def books_of(blocks) -> dict[str, str]:
    """OSIS book id -> the book's OSIS markup: from the milestone that opens its book division
    (``<div osisID=.. sID=.. type="book"/>``) to the one that closes it (same ``eID``), else to the
    next book or the end of the block."""
    books = {}
    for blk in blocks:
        marks = list(_BOOK_DIV.finditer(blk))
        for m, nxt in zip(marks, marks[1:] + [None]):
            stop = nxt.start() if nxt else len(blk)
            end = re.search(rf'<div\b[^>]*\beID="{re.escape(m.group(2))}"[^>]*/>', blk[m.end():stop])
            books[m.group(1)] = blk[m.start():m.end() + end.start() if end else stop]
    return books


def osis_text(xml: str) -> str:
    """Plain text of OSIS markup: footnotes dropped, titles and chapters on lines of their own
    ("Chapter N"), paragraph divisions as blank lines, poetry lines as lines, other tags removed."""
    s = re.sub(r"<note\b.*?</note>", " ", xml, flags=re.S)  # its place: often the only space between words
    s = re.sub(r"<title\b[^>]*>(.*?)</title>", r"\n\n\1\n\n", s, flags=re.S)
    s = re.sub(r'<chapter\b[^>]*\bosisID="[^".]+\.(\d+)"[^>]*/>', r"\n\nChapter \1\n\n", s)
    s = re.sub(r'<div\b[^>]*\btype="x-p"[^>]*/>', "\n\n", s)
    s = re.sub(r"<l\b[^>]*\beID=[^>]*/>", "", s)  # a poetry line ends where the next starts
    s = re.sub(r"<lg\b[^>]*/>", "\n\n", s)  # stanzas
    s = re.sub(r"<(?:l|lb|item|list)\b[^>]*/?>|</(?:l|lg|item|list)>", "\n", s)
    s = re.sub(r'<milestone\b[^>]*type="x-usfm-[^"]*"[^>]*/>', "", s)
    s = re.sub(r"<[^>]+>", "", s)
    s = re.sub(r"[ \t]+(?=[.,;:!?)\]\u2019\u201d])", "", s)  # no space before closing punctuation
    return _tidy(html.unescape(s))


def _tidy(s: str) -> str:
    s = re.sub(r"[ \t]+", " ", s)
    s = re.sub(r" *\n *", "\n", s)
    s = re.sub(r"\n{3,}", "\n\n", s)
    return s.strip() + "\n"


@functools.lru_cache(maxsize=None)
def bible_books() -> dict[str, str]:
    """OSIS book id -> plain text, in canonical order (Old Testament with the deuterocanon, then New)."""
    files = package_files("lit")
    blocks = []
    for t in ("ot", "nt"):
        bzs, bzz = (files.get(f"{SWORD_MODULE}/{t}.{x}") for x in ("bzs", "bzz"))
        if bzs is None or bzz is None:
            raise ValueError(f"{DEBIAN_SOURCES['lit']}: no zText module at {SWORD_MODULE}/{t}.bzs")
        blocks += ztext_blocks(bzs, bzz)
    return {b: osis_text(x) for b, x in books_of(blocks).items()}


def bible_text(spec: str) -> tuple[str, str]:
    books = bible_books()
    names = spec.split("+")
    bad = [b for b in names if b not in books]
    if bad or not all(names):
        raise ValueError(f"no book {', '.join(map(repr, bad or ['']))} in the World English Bible; books "
                         f"(OSIS ids, join with '+'): {', '.join(books)}")
    return "\n\n".join(books[b] for b in names), _source("lit", f"World English Bible, {spec}")


# --- encyclopaedic prose: FOLDOC --------------------------------------------------------------

_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def dictd_number(s: str) -> int:
    """A dictd index number (base 64, digits A-Z a-z 0-9 + /)."""
    n = 0
    for c in s:
        if c not in _B64:
            raise ValueError(f"bad dictd index number {s!r}")
        n = n * 64 + _B64[c]
    return n


def dictd_entries(index: str, text: bytes) -> list[tuple[str, str]]:
    """(headword, entry text) of a dictd database, each entry once (aliases share an entry), in
    the order of the data file; the ``00-database-*`` header entries are left out."""
    spans = {}
    for ln in index.splitlines():
        parts = ln.split("\t")
        if len(parts) != 3:
            continue
        word, off, size = parts[0], dictd_number(parts[1]), dictd_number(parts[2])
        if word.startswith("00-database") or word.startswith("00database"):
            continue
        spans.setdefault((off, size), word)
    out = []
    for (off, size) in sorted(spans):
        entry = text[off:off + size].decode("utf-8", "replace")
        out.append((entry.split("\n", 1)[0].strip(), entry))
    return out


def foldoc_plain(entry: str) -> str:
    """An entry without FOLDOC's "{cross-reference}" braces, each line's indentation kept."""
    return re.sub(r"\n{3,}", "\n\n", entry.replace("{", "").replace("}", "")).strip("\n") + "\n"


@functools.lru_cache(maxsize=None)
def foldoc_entries() -> list[tuple[str, str]]:
    files = package_files("encyc")
    return dictd_entries(files[FOLDOC_INDEX].decode("utf-8"), gzip.decompress(files[FOLDOC_DICT]))


def encyclopaedia_text(spec: str) -> tuple[str, str]:
    m = re.fullmatch(r"([a-z])(?:-([a-z]))?", spec)
    if not m or (m.group(2) and m.group(2) < m.group(1)):
        raise ValueError(f"encyclopaedia document {spec!r} must be one letter or a range of letters a-z "
                         f"('encyc:c', 'encyc:m-n'): FOLDOC's entries whose headword starts with them")
    lo, hi = m.group(1), m.group(2) or m.group(1)
    chosen = [e for h, e in foldoc_entries() if h[:1].lower() and lo <= h[:1].lower() <= hi]
    if not chosen:
        raise ValueError(f"no FOLDOC entry starts with {spec!r}")
    return "\n".join(foldoc_plain(e) for e in chosen), _source("encyc", f"FOLDOC entries {spec}")


# --- man pages: roff ------------------------------------------------------------------------

ROFF_CHARS = {"em": "\u2014", "en": "\u2013", "aq": "'", "dq": '"', "bu": "\u2022", "rs": "\\", "lq": "\u201c",
              "rq": "\u201d", "oq": "\u2018", "cq": "\u2019", "co": "\u00a9", "rg": "\u00ae", "ga": "`",
              "ha": "^", "ti": "~", "mu": "\u00d7", "di": "\u00f7", "+-": "\u00b1", "->": "\u2192",
              "<-": "\u2190", "<=": "\u2264", ">=": "\u2265", "!=": "\u2260", "de": "\u00b0", "dg": "\u2020",
              "hy": "-", "lh": "<=", "rh": "=>", "sq": "\u25a1", "ua": "\u2191", "da": "\u2193", "pc": "\u00b7",
              "tm": "\u2122", "Fo": "\u00ab", "Fc": "\u00bb", "fo": "\u2039", "fc": "\u203a", "sh": "#",
              "at": "@", "ba": "|", "br": "|", "lB": "[", "rB": "]", "lC": "{", "rC": "}", "ss": "\u00df",
              "ae": "\u00e6", "oe": "\u0153", "ul": "_", "rn": "\u203e", "eu": "\u20ac", "Eu": "\u20ac"}
_ESC = re.compile(r"\\(?:\((..)|\[([^\]]*)\]|\*(?:\(..|\[[^\]]*\]|.)|f(?:\(..|\[[^\]]*\]|.)"
                   r"|s[-+]?\d|n(?:\(..|\[[^\]]*\]|.)|(.))", re.S)
_FONT_PAIRS = {"BR", "BI", "IR", "IB", "RB", "RI"}


def _roff_char(name: str) -> str:
    if name in ROFF_CHARS:
        return ROFF_CHARS[name]
    m = re.fullmatch(r"u([0-9A-Fa-f]{4,6})", name or "")
    return chr(int(m.group(1), 16)) if m else ""


def roff_escapes(s: str) -> str:
    """Text of a roff line: special characters named (``\\(em``, ``\\[u00E9]``), font, size, string and
    register escapes removed, ``\\-`` ``\\e`` ``\\&`` and the space escapes resolved."""
    def rep(m):
        if m.group(1) is not None:
            return _roff_char(m.group(1))
        if m.group(2) is not None:
            return _roff_char(m.group(2))
        c = m.group(3)
        if c is None:
            return ""  # \f, \s, \*, \n
        return {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "'": "'", "`": "`",
                ".": ".", '"': ""}.get(c, "")

    return _ESC.sub(rep, s)


def _roff_args(s: str) -> list[str]:
    out, cur, q, i = [], "", False, 0
    while i < len(s):
        c = s[i]
        if c == '"' and q and s[i + 1:i + 2] == '"':
            cur += '"'
            i += 2
            continue
        if c == '"':
            q = not q
        elif c in " \t" and not q:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    if cur:
        out.append(cur)
    return out


def roff_text(src: str) -> str:
    """Plain text of a man page in roff (the man macros): headings (``.SH``/``.SS``) and tagged
    paragraphs on lines of their own, fill-mode text joined into one line per paragraph, no-fill and
    example blocks (``.nf``, ``.EX``) and tables (``.TS``) kept line by line, comments, macro
    definitions and formatting requests dropped."""
    out, para = [], []
    fill, table, tfmt, skip_def, tag, tab = True, False, False, False, False, "\t"

    def flush(blank=True):
        if para:
            out.append(" ".join(para))
            para.clear()
        if blank and out and out[-1] != "":
            out.append("")

    for raw in src.splitlines():
        line = raw.rstrip()
        if skip_def:
            skip_def = line != ".."
            continue
        if line.startswith((".\\\"", "'\\\"", '.\\"', "\\\"")) or line == ".":
            continue
        line = re.sub(r'(?<!\\)\\".*', "", line)  # trailing comment
        if line.startswith((".", "'")) and not table:
            m = re.match(r"[.']\s*(\S+)\s*(.*)", line)
            if not m:
                continue
            req, rest = m.group(1), m.group(2)
            args = [roff_escapes(a) for a in _roff_args(rest)]
            if req in ("de", "de1", "am", "ig"):
                skip_def = True
            elif req == "TH":
                flush()
                out.append(f"{args[0]}({args[1]})" if len(args) > 1 else " ".join(args))
                out.append("")
            elif req in ("SH", "SS"):
                flush()
                out.append(" ".join(args))
            elif req in ("B", "I", "SM", "SB") or req in _FONT_PAIRS:
                txt = ("".join if req in _FONT_PAIRS else " ".join)(args)
                if fill:
                    para.append(txt)
                    if tag:  # a .TP tag is a line of its own
                        flush(blank=False)
                        tag = False
                else:
                    out.append(txt)
            elif req in ("PP", "P", "LP", "sp", "HP"):
                flush()
            elif req in ("br", "TP", "TQ"):
                flush(blank=False)
                tag = req != "br"
            elif req == "IP":
                flush(blank=False)
                if args:
                    para.append(args[0])
            elif req in ("nf", "EX"):
                flush()
                fill = False
            elif req in ("fi", "EE"):
                flush()
                fill = True
            elif req == "TS":
                flush()
                table, tfmt, tab = True, True, "\t"
            elif req in ("UR", "MT"):
                para.append(" ".join(args))
            elif req in ("UE", "ME"):
                if args:
                    para[-1:] = [(para[-1] if para else "") + "".join(args)]
            # every other request (.RS .RE .in .ad .na .nh .ft .ne .ds .nr .if .so ...) prints nothing
            continue
        if table:
            if line.startswith(".TE"):
                table = False
                flush()
                continue
            if tfmt:  # the options line (";"), then format lines up to one ending in "."
                m = re.search(r"\btab\s*\((.)\)", line)
                if m and line.rstrip().endswith(";"):
                    tab = m.group(1)
                tfmt = not line.rstrip().endswith(".")
                continue
            if line.startswith((".", "'")):
                continue
            line = line.replace("T{", "").replace("T}", "")
            out.append("  ".join(c.strip() for c in roff_escapes(line).split(tab)).strip())
            continue
        txt = roff_escapes(line)
        if fill:
            if txt.strip():
                para.append(txt.strip())
                if tag:
                    flush(blank=False)
                    tag = False
            else:
                flush()
        else:
            out.append(txt)
    flush()
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


@functools.lru_cache(maxsize=None)
def man_pages() -> dict[str, str]:
    """``<page>.<section>`` -> roff source of every man page of the package that is a page of its own
    (symbolic links and ``.so`` redirections left out), in order of section, then name."""
    out = {}
    for path, raw in package_files("man").items():
        m = re.fullmatch(rf"{MAN_DIR}/man([1-9])/(.+)\.\1\.gz", path)
        if not m:
            continue
        src = gzip.decompress(raw).decode("utf-8", "replace")
        if re.match(r"\s*\.so\s", src):
            continue
        out[f"{m.group(2)}.{m.group(1)}"] = src
    return dict(sorted(out.items(), key=lambda kv: (kv[0].rsplit(".", 1)[1], kv[0])))


def man_text(spec: str) -> tuple[str, str]:
    pages = man_pages()
    names = spec.split("+")
    bad = [p for p in names if p not in pages]
    if bad or not all(names):
        listing = ", ".join(pages)
        raise ValueError(f"no man page {', '.join(map(repr, bad or ['']))} in Debian's manpages package; "
                         f"pages (<name>.<section>, join with '+'): {listing}")
    return "\n\n".join(roff_text(pages[p]) for p in names), _source("man", f"man pages {spec}")


EXTRA_GENRES.update({"lit": bible_text, "encyc": encyclopaedia_text, "man": man_text})
GENRES = ("code", "docs", "needle") + tuple(EXTRA_GENRES)
GENRE_LABELS.update({"lit": "literature (World English Bible)", "encyc": "encyclopaedic prose (FOLDOC)",
                     "man": "man pages (roff)"})


PYTHON_SOURCES = {  # genre -> what of the running Python's standard library it reads
    "code": "source files of standard-library modules",
    "docs": "docstrings of standard-library modules",
    "needle": "docstrings of standard-library modules, with seeded needle sentences and questions",
    "ref": "the language reference (pydoc_data.topics)",
    "news": "IDLE's release notes (idlelib)",
    "tests": "unit tests of the standard library (Lib/test)",
}


def document_sources(specs):
    """Where a run's documents come from: one row per genre (in the order of first appearance in
    ``specs``) with its documents, source, package and version, and licence. Debian genres read
    their registry entry (data/registry.yaml; nothing is downloaded), the others name the running
    Python."""
    rows, seen = [], {}
    for s in dict.fromkeys(specs):  # each document once (runs on several models share them)
        kind, _ = parse_spec(s)
        seen[kind] = seen.get(kind, 0) + 1
    for kind, n in seen.items():
        if kind in DEBIAN_SOURCES:
            e = debian_entry(kind)
            src, pkg, lic = e["work"], f"Debian {e['package']} {e['version']}", e["licence"]
        else:
            src = PYTHON_SOURCES[kind]
            pkg, lic = f"CPython {platform.python_version()} standard library", "PSF-2.0"
        rows.append({"genre": GENRE_LABELS.get(kind, kind), "documents (count)": n, "source": src,
                     "package and version": pkg, "licence": lic})
    return pd.DataFrame(rows)
