"""The import graph of ``analysis/`` has no cycle and no upward import (the layers of
``analysis/__init__.py``).

Every module is parsed with :mod:`ast`; every ``import`` counts, at module level or inside a
function, and so does a string constant that names a module of ``analysis`` exactly (``"analysis.x"``
or ``"analysis.x:attr"``: a module imported by name through :mod:`importlib`, such as a table of
chapter schemas). Importing a submodule is an edge to that submodule, not to its parent packages.

Layers, bottom to top (a module may import from its own layer and the layers below it):

1. ``data``: :mod:`analysis.data`, :mod:`analysis.specs`.
2. ``utilities`` (cross-cutting): report, plots, params, cache, deps, artifacts, claims, resources.
   They import only layer 1 and each other: no core model, no chapter, no tool. :mod:`analysis.params`
   (the schema registry every chapter imports) imports no module of ``analysis`` at all.
3. ``core models``: :mod:`analysis.kv`, :mod:`analysis.roofline`, :mod:`analysis.forward`,
   :mod:`analysis.measured`, :mod:`analysis.timing`, :mod:`analysis.traces`.
4. ``chapters``: one unit per chapter (chapter 1's top-level ``kv_*`` modules, :mod:`analysis.tiering`,
   :mod:`analysis.disagg`, :mod:`analysis.qevict`); a unit imports no other unit.
5. ``composition``: :mod:`analysis.compose` (chapter 5) imports the chapters' units.
6. ``tools``: :mod:`analysis.build`, :mod:`analysis.execute`, :mod:`analysis.rerun`,
   :mod:`analysis.chapters` (the table of chapter schemas by module name), :mod:`analysis.glued`: they
   may import anything below them.

A new module must be placed in :data:`LAYERS` (the test names any that is not).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import analysis

PACKAGE = Path(__file__).resolve().parent.parent / "analysis"

# (layer name, open, {module or package prefix: unit}); bottom first; a prefix ending in "*" matches
# every module whose name starts with the rest. Within a layer, modules of different
# units may import each other only where the layer is marked open.
LAYERS = [
    ("data", True, {"analysis.data": "data", "analysis.specs": "specs"}),
    ("utilities", True, {m: m for m in (
        "analysis.report", "analysis.tables", "analysis.plots", "analysis.params", "analysis.cache",
        "analysis.deps", "analysis.artifacts", "analysis.claims", "analysis.resources", "analysis.tasks")}),
    ("core models", True, {m: m for m in (
        "analysis.kv", "analysis.roofline", "analysis.forward", "analysis.measured", "analysis.timing",
        "analysis.traces")}),
    ("chapters", False, {
        "analysis.kv_*": "chapter 1",  # kv_params, kv_chapter, kv_figures (analysis.kv is a core model)
        "analysis.tiering": "chapter 2", "analysis.disagg": "chapter 3", "analysis.qevict": "chapter 4"}),
    ("composition", True, {"analysis.compose": "chapter 5"}),
    ("tools", True, {m: m for m in (
        "analysis.build", "analysis.execute", "analysis.rerun", "analysis.chapters", "analysis.glued",
        "analysis.derive_traces")}),
]
# modules that import no other module of ``analysis``
STANDALONE = {"analysis.params"}


def modules(root: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """{dotted name: (file, is package)} of every module below ``root`` (a package directory)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (f, is_pkg)
    return out


def _resolve(name: str, mods) -> str | None:
    """The longest prefix of ``name`` that is a module of ``mods``."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(source: str, name: str, is_pkg: bool, mods) -> set[str]:
    """Modules of ``mods`` that module ``name`` imports, anywhere in ``source`` (function-local
    imports and module names in strings included)."""
    pkg = name if is_pkg else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(_resolve(a.name, mods) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module
            for a in node.names:
                sub = f"{src}.{a.name}"
                out.add(sub if sub in mods else _resolve(src, mods))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            target = node.value.partition(":")[0]
            if target.startswith("analysis.") and target in mods:
                out.add(target)
    out.discard(None)
    out.discard(name)
    return out


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    mods = modules(root)
    return {m: imports(f.read_text(), m, is_pkg, mods) for m, (f, is_pkg) in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def place(module: str) -> tuple[int, str, bool] | None:
    """(layer index, unit, layer open) of ``module``; None when no layer lists it."""
    if module == "analysis":
        return (-1, "analysis", True)  # the package's __init__: a docstring only
    for i, (_, open_, units) in enumerate(LAYERS):
        for prefix, unit in units.items():
            if (module.startswith(prefix[:-1]) if prefix.endswith("*")
                    else module == prefix or module.startswith(prefix + ".")):
                return (i, unit, open_)
    return None


def violations(g: dict[str, set[str]]) -> list[str]:
    """Every import that goes up a layer, sideways between units of a closed layer, or out of a
    standalone module; and every module no layer lists."""
    out = []
    for m in sorted(g):
        pm = place(m)
        if pm is None:
            out.append(f"{m}: in no layer (add it to tests/test_layers.py LAYERS)")
            continue
        for t in sorted(g[m]):
            pt = place(t)
            if pt is None:
                continue  # reported as a module of its own
            if m in STANDALONE:
                out.append(f"{m} -> {t}: {m} imports no module of analysis")
            elif pt[0] > pm[0]:
                out.append(f"{m} -> {t}: upward ({LAYERS[pm[0]][0]} imports {LAYERS[pt[0]][0]})")
            elif pt[0] == pm[0] and pt[1] != pm[1] and not pm[2]:
                out.append(f"{m} -> {t}: sideways ({pm[1]} imports {pt[1]})")
    return out


@pytest.fixture(scope="module")
def real_graph():
    return graph()


def test_no_import_cycles(real_graph):
    assert cycles(real_graph) == []


def test_no_upward_imports(real_graph):
    assert violations(real_graph) == []


def test_graph_sees_every_kind_of_import(real_graph):
    # function-local and module-level imports, relative and absolute, and modules named in strings
    assert "analysis.specs" in real_graph["analysis.kv"]
    assert "analysis.tiering.cluster" in real_graph["analysis.tiering.replay"]
    assert "analysis.tiering.params" in real_graph["analysis.chapters"]  # a module named in a string


def test_parser_counts_local_relative_and_string_imports():
    mods = {m: None for m in ("analysis", "analysis.a", "analysis.b", "analysis.c", "analysis.pkg",
                              "analysis.pkg.x", "analysis.pkg.y", "analysis.d")}
    src = '''
"""Docstring naming analysis.d in prose is not an import."""
from . import a
from .pkg import x

def f():
    from .b import thing
    import analysis.pkg.y as y

TABLE = {"one": "analysis.c:ATTR"}
'''
    assert imports(src, "analysis.mod", False, mods) == {
        "analysis.a", "analysis.pkg.x", "analysis.b", "analysis.pkg.y", "analysis.c"}
    # inside a package, one dot is the package itself, two its parent
    assert imports("from .. import a\nfrom . import y\n", "analysis.pkg.x", False, mods) == {
        "analysis.a", "analysis.pkg.y"}
    assert imports("from . import y\n", "analysis.pkg", True, mods) == {"analysis.pkg.y"}


def test_checker_fails_on_a_cycle():
    g = {"analysis.kv": {"analysis.specs"}, "analysis.specs": {"analysis.data"},
         "analysis.data": {"analysis.kv"}, "analysis.report": set()}
    assert cycles(g) == [["analysis.data", "analysis.kv", "analysis.specs"]]
    assert cycles({"analysis.kv": {"analysis.specs"}, "analysis.specs": set()}) == []


@pytest.mark.parametrize("src, dst, why", [
    ("analysis.kv", "analysis.tiering.replay", "upward"),            # core model -> chapter
    ("analysis.specs", "analysis.kv", "upward"),                     # data -> core model
    ("analysis.cache", "analysis.qevict.runner", "upward"),          # utility -> chapter
    ("analysis.deps", "analysis.chapters", "upward"),                # utility -> tool
    ("analysis.tiering.replay", "analysis.compose.pipeline", "upward"),  # chapter -> composition
    ("analysis.tiering.replay", "analysis.disagg.search", "sideways"),   # chapter -> other chapter
    ("analysis.kv_params", "analysis.qevict.params", "sideways"),
    ("analysis.params", "analysis.specs", "imports no module"),      # the registry stays standalone
])
def test_checker_fails_on_an_upward_or_sideways_import(src, dst, why):
    g = {src: {dst}, dst: set()}
    v = violations(g)
    assert len(v) == 1 and why in v[0] and src in v[0] and dst in v[0]


@pytest.mark.parametrize("src, dst", [
    ("analysis.compose.pipeline", "analysis.tiering.replay"),  # composition -> chapter
    ("analysis.tiering.replay", "analysis.forward"),            # chapter -> core model
    ("analysis.tiering.replay", "analysis.tiering.cluster"),    # inside one chapter
    ("analysis.forward", "analysis.kv"),                        # inside the core layer
    ("analysis.qevict.runner", "analysis.cache"),               # chapter -> utility
    ("analysis.claims", "analysis.data"),                       # utility -> data
    ("analysis.rerun", "analysis.tiering.params"),              # tool -> chapter
])
def test_checker_accepts_downward_imports(src, dst):
    assert violations({src: {dst}, dst: set()}) == []


def test_checker_names_a_module_in_no_layer():
    v = violations({"analysis.newthing": set()})
    assert v and "in no layer" in v[0]


def test_package_docstring_lists_each_module_in_its_layer():
    """The layer picture of ``analysis/__init__.py`` is the one this test enforces."""
    paras = re.split(r"\n(?=\d\. \*\*)", analysis.__doc__.split("Layers, bottom to top")[1])[1:]
    assert len(paras) == len(LAYERS)
    mods = modules()
    for i, ((name, _, units), para) in enumerate(zip(LAYERS, paras), 1):
        assert para.startswith(f"{i}. **{name}**"), para[:40]
        for prefix in units:
            short = prefix.removeprefix("analysis.")
            if short.endswith("*"):
                assert f"``{short}``" in para, f"{prefix} is not in layer {name!r} of the docstring"
                continue
            if prefix not in mods:
                continue  # named for a module that may come (analysis.timing)
            shown = f":mod:`.{short}`" in para
            assert shown, f"{prefix} is not in layer {name!r} of analysis/__init__.py's docstring"


HEAVY = "# optional heavy dependency"


def local_imports(source: str) -> list[tuple[int, str]]:
    """(line, source line) of every import inside a function that is not marked :data:`HEAVY`."""
    lines = source.splitlines()
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                if HEAVY not in lines[child.lineno - 1]:
                    out.append((child.lineno, lines[child.lineno - 1].strip()))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(source), False)
    return out


def test_imports_sit_at_module_level():
    """A function-local import is kept only for an optional heavy dependency, marked so."""
    found = [f"{m}:{n}: {line}" for m, (f, _) in modules().items()
             for n, line in local_imports(f.read_text())]
    assert found == []


def test_local_import_check_sees_unmarked_imports():
    src = (f"import os\n\ndef f():\n    import json\n    import torch  {HEAVY}\n\n"
           "    def g():\n        from . import x\n")
    assert [n for n, _ in local_imports(src)] == [4, 8]


def test_design_document_is_short_enough_to_read():
    """Issue 26: docs/design.md is the current design in at most 250 lines; history goes to
    docs/decisions.md."""
    n = len((PACKAGE.parent / "docs" / "design.md").read_text(encoding="utf-8").splitlines())
    assert n <= 250, f"docs/design.md has {n} lines: move history to docs/decisions.md"
