"""What a chapter (or a cached function) depends on, found statically: the key of every cache.

A chapter's output is a function of its code cells (which jupyter-cache hashes), of the modules of
``analysis`` it runs and of the files it reads. This module finds the last two without running
anything, with :mod:`ast`:

* **Modules**: the transitive closure, inside ``analysis/``, of the chapter's ``import`` statements
  (every ``import``/``from ... import`` of every module in the closure, including those inside
  functions; the parent packages of each, whose ``__init__`` runs on import; a chapter imports its
  parameter-schema module itself, ``from analysis.<subpackage>.params import SCHEMA``).
* **Files**: an in-repo file (``data/*.csv``, ``data/*.yaml``, top-level ``*.yml``, ``sweeps/*.yaml``
  and the committed results under ``results/``) is read by the closure when its name appears in a
  string literal (docstrings excepted) of the chapter or of a module of the closure
  (``data.table("hardware.csv")``, ``"data/models.csv line 3"``, ``"results/qevict_tuned.json"``), or
  through the loaders' functions: a call to ``published(...)`` reads ``data/published.csv``;
  ``path``/``registry``/``describe`` read ``data/registry.yaml`` (whose sha256 pins every external
  file); ``table(x)`` with a name that is not a literal reads every table; of
  :mod:`analysis.artifacts` (long runs committed with provenance, which chapters read instead of
  computing), ``read_artifact("name")`` (or ``usable("name", ...)``) reads every file of
  ``results/name/``, and ``read_artifact(x)`` with a name that is not a literal, or
  ``list_artifacts()``, every artifact's files, or only those of the artifacts whose names start
  with a prefix the module declares in a module-level ``ARTIFACTS_READ = ("prefix", ...)``
  (checked against what pages really read).
  ``analysis/data.py`` and ``analysis/artifacts.py`` (the loaders) and this module are not scanned
  for names: they name every file.

A key is the sha256 of the (path, content) of every dependency, so editing
``analysis/qevict/policies.py`` changes the keys of the chapters that import it (4 and 5) and of
nothing else, and ``data/chapter_resources.csv`` (rewritten by a benchmark) changes only the key of
the appendix page that displays it. Over-approximation is safe (a chapter re-executes for
nothing); missing a dependency is not, so ``tests/test_deps.py`` checks the static closure against
the modules that importing a chapter really loads, and the file list against the files a chapter
really reads when executed (``KVBOOK_TRACE_READS``, recorded by :mod:`analysis.data`).
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
import types
from pathlib import Path

PACKAGE = "analysis"
PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
DATA_DIR = REPO_ROOT / "data"
RESULTS_DIR = REPO_ROOT / "results"
KEY_VERSION = "deps-3"  # bump when the rules above change, so every key changes with them
# How results are stored and keyed, not what they are: a change to these modules (the result cache and
# this module) changes no result, so no key includes them (with them, every key of the book changed
# whenever the key machinery itself was edited, and the next build recomputed everything).
NOT_KEYED = {f"{PACKAGE}.cache", f"{PACKAGE}.deps"}

_NOT_SCANNED = {f"{PACKAGE}.data", f"{PACKAGE}.deps", f"{PACKAGE}.artifacts"}
# analysis.data functions -> the in-repo files a call reads (None: every table, see module docstring)
_LOADER_CALLS = {"published": ("data/published.csv",), "path": ("data/registry.yaml",),
                 "registry": ("data/registry.yaml",), "describe": ("data/registry.yaml",),
                 "candidates": ()}
_ARTIFACT_CALLS = ("read_artifact", "usable", "list_artifacts")  # artifacts: files under results/<name>/


# ------------------------------------------------------------------------------------- modules

def module_file(name: str) -> Path | None:
    """The source file of module ``analysis.x.y`` (``x/y.py`` or ``x/y/__init__.py``), or None."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    rel = Path(*name.split(".")[1:]) if name != PACKAGE else Path()
    cands = [PACKAGE_DIR / rel.with_suffix(".py")] if rel.parts else []
    cands.append(PACKAGE_DIR / rel / "__init__.py")
    for cand in cands:
        if cand.is_file():
            return cand
    return None


@functools.lru_cache(maxsize=512)
def _parse_cached(file: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(file).read_text(encoding="utf-8"), filename=file)


def _parse(file: Path) -> ast.Module:
    st = file.stat()
    return _parse_cached(str(file), st.st_mtime_ns, st.st_size)


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _resolve_from(node: ast.ImportFrom, current: str, is_pkg: bool) -> str | None:
    if not node.level:
        return node.module
    base = current.split(".") if is_pkg else current.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(tree: ast.AST, current: str = "__main__", is_pkg: bool = False) -> set[str]:
    """Modules of ``analysis`` imported anywhere in ``tree`` (at top level or inside functions)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(node, current, is_pkg)
            if not base:
                continue
            names = [base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"]
        else:
            continue
        for n in names:
            if module_file(n) is not None:
                out.update(p for p in _parents(n) if module_file(p) is not None)
    return out


def closure(roots) -> list[str]:
    """Sorted transitive closure of modules ``roots`` inside ``analysis`` (parents included)."""
    todo = [p for r in roots for p in _parents(r) if module_file(p) is not None]
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        f = module_file(m)
        st = f.stat()
        todo.extend(_module_imports(str(f), st.st_mtime_ns, st.st_size, m) - seen)
    return sorted(seen)


@functools.lru_cache(maxsize=1024)
def _module_imports(file: str, mtime_ns: int, size: int, module: str) -> frozenset:
    """:func:`imports_of` one module's source, once per process for that source."""
    return frozenset(imports_of(_parse(Path(file)), module, Path(file).name == "__init__.py"))


# --------------------------------------------------------------------------------------- files

def candidate_files() -> list[Path]:
    """In-repo files a chapter may read: ``data/*.csv|yaml``, the top-level ``*.yml``,
    ``sweeps/*.yaml`` and the committed results (``results/*.json|csv`` and the files of the
    artifacts ``results/<name>/``)."""
    files = [p for p in DATA_DIR.iterdir() if p.is_file() and p.suffix in (".csv", ".yaml", ".yml")]
    files += [p for p in REPO_ROOT.iterdir() if p.is_file() and p.suffix in (".yml", ".yaml")]
    sweeps = REPO_ROOT / "sweeps"
    if sweeps.is_dir():
        files += [p for p in sweeps.iterdir() if p.is_file() and p.suffix in (".yml", ".yaml")]
    if RESULTS_DIR.is_dir():
        files += [p for p in RESULTS_DIR.iterdir() if p.is_file() and p.suffix in (".json", ".csv")]
    return sorted(files + artifact_files())


def artifact_files(name: str | None = None) -> list[Path]:
    """Files of the committed artifact ``results/<name>/`` (every artifact's when ``name`` is None)."""
    if not RESULTS_DIR.is_dir():
        return []
    dirs = [RESULTS_DIR / name] if name else [p for p in RESULTS_DIR.iterdir() if p.is_dir()]
    return sorted(f for d in dirs if d.is_dir() and not d.name.endswith(".partial")
                  for f in d.iterdir() if f.is_file())


def _mention_pattern(file: Path) -> re.Pattern:
    return re.compile(r"(?<![\w.-])" + re.escape(file.name) + r"(?![\w-])")


def _data_aliases(tree: ast.AST, current: str, is_pkg: bool,
                  module: str = "data") -> tuple[set[str], dict[str, str]]:
    """Names bound to the module analysis.<module> (a loader: ``data``, ``artifacts``), and names
    imported from it (local -> function)."""
    mods, funcs = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == f"{PACKAGE}.{module}" and a.asname:
                    mods.add(a.asname)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(node, current, is_pkg)
            for a in node.names:
                if base == PACKAGE and a.name == module:
                    mods.add(a.asname or module)
                elif base == f"{PACKAGE}.{module}":
                    funcs[a.asname or a.name] = a.name
    return mods, funcs


def _loader_calls(tree: ast.AST, current: str, is_pkg: bool, module: str):
    """(function name, call node) of every call of a function of analysis.<module> in ``tree``."""
    mods, funcs = _data_aliases(tree, current, is_pkg, module)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id in mods:
            yield node.func.attr, node
        elif isinstance(node.func, ast.Name) and node.func.id in funcs:
            yield funcs[node.func.id], node


def files_read(tree: ast.AST, current: str = "__main__", is_pkg: bool = False) -> set[str]:
    """In-repo files (repo-relative) that the code of ``tree`` reads, by the rules of this module."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}  # prose about files reads nothing
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and id(n) not in docstrings]
    text = "\n".join(strings)
    out = set()
    cands = candidate_files()
    for f in cands:
        if _mention_pattern(f).search(text):
            out.add(f.relative_to(REPO_ROOT).as_posix())
    for fn, node in _loader_calls(tree, current, is_pkg, "data"):
        if fn in _LOADER_CALLS:
            out.update(_LOADER_CALLS[fn])
        elif fn == "table" and not (node.args and isinstance(node.args[0], ast.Constant)):
            out.update(f.relative_to(REPO_ROOT).as_posix() for f in cands if f.parent == DATA_DIR)
    declared = _artifacts_declared(tree)
    for fn, node in _loader_calls(tree, current, is_pkg, "artifacts"):
        if fn not in _ARTIFACT_CALLS:
            continue
        arg = node.args[0] if node.args else None
        if fn in ("read_artifact", "usable") and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            # the provenance is keyed even while absent, so computing the artifact changes the key
            out.add(f"results/{arg.value}/provenance.json")
            out.update(f.relative_to(REPO_ROOT).as_posix() for f in artifact_files(arg.value))
        else:
            out.update(f.relative_to(REPO_ROOT).as_posix() for f in artifact_files()
                       if declared is None or f.parent.name.startswith(declared))
    return out


def _artifacts_declared(tree: ast.AST) -> tuple[str, ...] | None:
    """The name prefixes of a module-level ``ARTIFACTS_READ = ("prefix", ...)`` (string literals), or
    None when the module declares none."""
    for node in getattr(tree, "body", []):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "ARTIFACTS_READ"
                and isinstance(node.value, ast.Tuple)
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts)):
            return tuple(e.value for e in node.value.elts)
    return None


# ------------------------------------------------------------------------------------ chapters

def chapter_tree(path: Path) -> ast.Module:
    """All code cells of a chapter (jupytext MyST ``.md`` or ``.ipynb``) as one module; IPython
    magics and shell lines are dropped."""
    import jupytext  # optional heavy dependency

    nb = jupytext.read(path)
    body = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        src = "\n".join(ln for ln in cell.source.splitlines() if not ln.lstrip().startswith(("%", "!")))
        try:
            body.extend(ast.parse(src).body)
        except SyntaxError as exc:
            raise SyntaxError(f"{path}: a code cell does not parse ({exc})") from exc
    return ast.Module(body=body, type_ignores=[])


def is_notebook(path: Path) -> bool:
    """A book page that executes: ``.ipynb``, or ``.md`` with a jupytext kernelspec."""
    path = Path(path)
    if path.suffix == ".ipynb":
        return True
    head = path.read_text(encoding="utf-8")[:2000]
    return head.startswith("---") and "kernelspec:" in head.split("\n---", 1)[0]


@functools.lru_cache(maxsize=64)
def _chapter_deps_cached(path: str, mtime_ns: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    tree = chapter_tree(Path(path))
    mods = closure(imports_of(tree))
    files = files_read(tree) | module_files_read(mods)
    return tuple(mods), tuple(sorted(files))


def chapter_deps(path) -> dict:
    """``{"modules": [...], "files": [...]}``: what the chapter at ``path`` runs and reads."""
    p = Path(path).resolve()
    mods, files = _chapter_deps_cached(str(p), p.stat().st_mtime_ns)
    return {"modules": list(mods), "files": list(files)}


def module_files_read(modules) -> set[str]:
    cands = tuple(candidate_files())
    out = set()
    for m in modules:
        if m in _NOT_SCANNED:
            continue  # the loader (and this module) name every file; their callers decide what is read
        f = module_file(m)
        st = f.stat()
        out |= _module_files_read(str(f), st.st_mtime_ns, st.st_size, m, cands)
    return out


@functools.lru_cache(maxsize=1024)
def _module_files_read(file: str, mtime_ns: int, size: int, module: str, cands: tuple) -> frozenset:
    """:func:`files_read` of one module, once per process for its source and the candidate files
    (what it reads depends on nothing else; a page's key scans ~30 modules, and pages share most)."""
    return frozenset(files_read(_parse(Path(file)), module, Path(file).name == "__init__.py"))


def module_deps(roots) -> dict:
    """``{"modules": [...], "files": [...]}`` of modules ``roots`` (for a cached function)."""
    mods = closure(roots)
    return {"modules": mods, "files": sorted(module_files_read(mods))}


# ----------------------------------------------------------------------------------------- keys

def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def fingerprint(deps: dict) -> dict[str, str]:
    """``{repo-relative path: sha256}`` of every module and file of ``deps`` (:data:`NOT_KEYED` left out)."""
    out = {}
    for m in deps["modules"]:
        if m in NOT_KEYED:
            continue
        f = module_file(m)
        out[f.relative_to(REPO_ROOT).as_posix()] = _file_hash(f)
    for rel in deps["files"]:
        out[rel] = _file_hash(REPO_ROOT / rel)
    return out


def digest(fp: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps([KEY_VERSION, sorted(fp.items())]).encode()).hexdigest()


def chapter_key(path) -> str:
    """The execution-cache key of a chapter: hash of its modules' source and the files it reads."""
    return digest(fingerprint(chapter_deps(path)))


def function_modules(fn) -> set[str]:
    """Modules of ``analysis`` a callable depends on: the module defining it, and every module (or
    object defined in one) that its code refers to by a global name or through its closure cells
    (nested functions and lambdas included). For a lambda in a notebook calling
    ``study.ratio_sweep``, that is ``analysis.disagg.study``."""
    out = set()

    def add_obj(obj):
        name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
        if isinstance(name, str) and module_file(name) is not None:
            out.add(name)

    while isinstance(fn, functools.partial):
        for v in (*fn.args, *fn.keywords.values()):
            add_obj(v)
        fn = fn.func
    add_obj(fn)
    code = getattr(fn, "__code__", None)
    glob = getattr(fn, "__globals__", {})
    codes = [code] if code is not None else []
    while codes:
        c = codes.pop()
        for n in c.co_names:
            if n in glob:
                add_obj(glob[n])
        codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        add_obj(v)
        if isinstance(v, types.FunctionType) and v is not fn:
            out |= function_modules(v)
    return out
