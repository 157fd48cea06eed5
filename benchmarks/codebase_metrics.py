"""The codebase's shape, before and after a change: what issue 26's closing note reports.

    python benchmarks/codebase_metrics.py [--base da416ce] [--head HEAD]

Counts, from git (no work tree needed for the base): lines and modules of ``analysis/`` per subpackage;
imports at module level and inside functions; the ten longest functions (lines, with signature and
docstring); in the chapters' code cells (``book/*.md``): ``def`` and ``lambda`` and the lines of cells
whose input is hidden (``remove-input``, ``hide-input``, ``remove-cell``), of which those that are not
an import, a call, or a name bound to a call, an attribute, a subscript or a literal (a rough count of
computation written in a chapter). The default base, da416ce, is the commit issue 26 describes
(16,353 lines in 65 modules).
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HIDDEN = ("remove-input", "hide-input", "remove-cell")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def files(rev: str, under: str, suffix: str) -> dict[str, str]:
    names = [n for n in _git("ls-tree", "-r", "--name-only", rev, under).split("\n") if n.endswith(suffix)]
    return {n: _git("show", f"{rev}:{n}") for n in names}


def package_metrics(src: dict[str, str]) -> dict:
    lines, mods, local, top, funcs = Counter(), Counter(), 0, 0, []
    for name, text in src.items():
        parts = Path(name).parts
        sub = parts[1] if len(parts) > 2 else "(top level)"
        lines[sub] += len(text.splitlines())
        mods[sub] += 1
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.append((node.end_lineno - node.lineno + 1, f"{name}:{node.lineno} {node.name}"))
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        local += 1
        top += sum(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body)
    return dict(lines=lines, modules=mods, local_imports=local, module_imports=top,
                longest=sorted(funcs, reverse=True)[:10])


def _cells(text: str):
    for m in re.finditer(r"```\{code-cell\}[^\n]*\n(.*?)```", text, re.S):
        body = m.group(1)
        tags = re.search(r"^:tags:\s*\[(.*?)\]", body, re.M)
        code = "\n".join(ln for ln in body.splitlines() if not ln.startswith(":"))
        yield (tags.group(1) if tags else ""), code


def _is_plain(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, (ast.Call, ast.Constant, ast.Name, ast.Attribute))
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
        return isinstance(stmt.value, (ast.Call, ast.Name, ast.Attribute, ast.Subscript, ast.Constant,
                                       ast.Tuple, ast.List, ast.Dict))
    if isinstance(stmt, ast.For):  # a loop that only glues or displays
        return all(_is_plain(s) for s in stmt.body)
    return False


def chapter_metrics(src: dict[str, str]) -> dict:
    defs = lambdas = hidden = computing = 0
    for text in src.values():
        for tags, code in _cells(text):
            try:
                tree = ast.parse(code)
            except SyntaxError:  # a cell with IPython magics
                continue
            defs += sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree))
            lambdas += sum(isinstance(n, ast.Lambda) for n in ast.walk(tree))
            if any(t in tags for t in HIDDEN):
                kept = [ln for ln in code.splitlines() if ln.strip() and not ln.strip().startswith("#")]
                hidden += len(kept)
                computing += sum(s.end_lineno - s.lineno + 1 for s in tree.body if not _is_plain(s))
    return dict(defs=defs, lambdas=lambdas, hidden_lines=hidden, hidden_computing_lines=computing)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="da416ce")
    ap.add_argument("--head", default="HEAD")
    a = ap.parse_args(argv)
    res = {rev: (package_metrics(files(rev, "analysis", ".py")), chapter_metrics(files(rev, "book", ".md")))
           for rev in (a.base, a.head)}
    (pb, cb), (ph, ch) = res[a.base], res[a.head]
    print(f"analysis/ per subpackage: lines (modules), {a.base} -> {a.head}")
    for sub in sorted(set(pb["lines"]) | set(ph["lines"])):
        print(f"  {sub:14} {pb['lines'][sub]:6,} ({pb['modules'][sub]:2}) -> {ph['lines'][sub]:6,} "
              f"({ph['modules'][sub]:2})")
    print(f"  {'total':14} {sum(pb['lines'].values()):6,} ({sum(pb['modules'].values()):2}) -> "
          f"{sum(ph['lines'].values()):6,} ({sum(ph['modules'].values()):2})")
    for k in ("module_imports", "local_imports"):
        print(f"{k}: {pb[k]} -> {ph[k]}")
    for k in ("defs", "lambdas", "hidden_lines", "hidden_computing_lines"):
        print(f"chapters {k}: {cb[k]} -> {ch[k]}")
    print(f"ten longest functions at {a.head}:")
    for n, where in ph["longest"]:
        print(f"  {n:4} {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
