"""Papermill parameter schemas and their validation (one schema per chapter).

A chapter's first code cell (tagged ``parameters``) sets every knob; the next cell calls
``params.check("NN_slug", globals())``, which validates them against the chapter's schema and fails
*before any work* with a :class:`ParameterError` naming each bad parameter and what is allowed.
``analysis.rerun`` validates ``-p`` values against the same schema before any notebook runs.

Schemas live next to the code they drive (``analysis.<subpackage>.params.PARAMS``) and are found
through :data:`CHAPTERS`; chapter 1's is ``analysis.kv_params.PARAMS``. This module imports no
other module of ``analysis`` (a chapter's schema is imported by name), so a chapter that imports it
does not depend on the other chapters' schemas (see :mod:`analysis.deps`).
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any


class ParameterError(ValueError):
    """One or more parameters are invalid; the message lists each with what is allowed."""


@dataclass(frozen=True)
class Param:
    """One parameter: ``kind`` is 'int', 'float', 'str', 'bool', 'list[int]', 'list[float]',
    'list[str]' or 'dict'. ``choices`` may be a callable returning the allowed values (e.g. model
    names), checked element-wise for lists. ``min``/``max`` bound numbers (element-wise for lists)."""

    default: Any
    kind: str
    help: str = ""
    choices: Any = None
    min: float | None = None
    max: float | None = None
    nonempty: bool = True

    def allowed(self) -> list | None:
        c = self.choices() if callable(self.choices) else self.choices
        return list(c) if c is not None else None

    def describe(self, full: bool = True) -> str:
        parts = [self.kind]
        if self.min is not None or self.max is not None:
            parts.append(f"in [{self.min if self.min is not None else '-inf'}, "
                         f"{self.max if self.max is not None else 'inf'}]")
        ch = self.allowed()
        if ch is not None:
            if full or len(ch) <= 10:
                parts.append(f"one of: {', '.join(map(str, ch))}")
            else:  # long lists (every model of data/models.csv) are summarised in the book
                parts.append(f"one of {len(ch)} values, e.g. {', '.join(map(str, ch[:4]))} "
                             f"(all: `--list-params`)")
        return "; ".join(parts)


def _check_scalar(name: str, kind: str, v, p: Param) -> tuple[Any, str | None]:
    if kind == "bool":
        if isinstance(v, bool):
            return v, None
        return v, f"{name}: expected true/false, got {type(v).__name__} {v!r}"
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                return v, f"{name}: expected an integer, got {type(v).__name__} {v!r}"
    elif kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return v, f"{name}: expected a number, got {type(v).__name__} {v!r}"
        v = float(v)
        if not math.isfinite(v):
            return v, f"{name}: expected a finite number, got {v!r}"
    elif kind == "str":
        if not isinstance(v, str):
            return v, f"{name}: expected a string, got {type(v).__name__} {v!r}"
    if kind in ("int", "float"):
        if p.min is not None and v < p.min:
            return v, f"{name}: {v!r} is below the minimum {p.min} ({p.help})"
        if p.max is not None and v > p.max:
            return v, f"{name}: {v!r} is above the maximum {p.max} ({p.help})"
    ch = p.allowed()
    if ch is not None and v not in ch:
        import difflib
        close = difflib.get_close_matches(str(v), [str(c) for c in ch], n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        return v, f"{name}: {v!r} is not allowed{hint}; allowed: {', '.join(map(str, ch))}"
    return v, None


def validate(schema: dict[str, Param], values: dict, *, partial: bool = False) -> dict:
    """Validate ``values`` against ``schema``; returns a complete, normalised dict.

    Unknown names, wrong types, values outside ``choices`` or bounds: all problems are collected and
    raised together in one :class:`ParameterError`. With ``partial=True`` missing names take their
    defaults (as for ``-p`` overrides)."""
    errors, out = [], {}
    for name in values:
        if name not in schema:
            import difflib
            close = difflib.get_close_matches(name, list(schema), n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            errors.append(f"{name}: unknown parameter{hint}; parameters: {', '.join(schema)}")
    for name, p in schema.items():
        if name in values:
            v = values[name]
        elif partial:
            v = p.default
        else:
            errors.append(f"{name}: missing (default {p.default!r})")
            continue
        if p.kind.startswith("list["):
            inner = p.kind[5:-1]
            if isinstance(v, tuple):
                v = list(v)
            if not isinstance(v, list):
                errors.append(f"{name}: expected a list of {inner}, got {type(v).__name__} {v!r}")
                continue
            if p.nonempty and not v:
                errors.append(f"{name}: must not be empty")
                continue
            norm = []
            for i, e in enumerate(v):
                e2, err = _check_scalar(f"{name}[{i}]", inner, e, p)
                if err:
                    errors.append(err)
                norm.append(e2)
            out[name] = norm
        elif p.kind == "dict":
            if not isinstance(v, dict):
                errors.append(f"{name}: expected a mapping, got {type(v).__name__} {v!r}")
            out[name] = v
        else:
            v2, err = _check_scalar(name, p.kind, v, p)
            if err:
                errors.append(err)
            out[name] = v2
    if errors:
        raise ParameterError("invalid parameters:\n  - " + "\n  - ".join(errors))
    return out


# ------------------------------------------------------------------------------ chapter registry

KV_DTYPES = ["fp32", "bf16", "fp16", "fp8", "int8", "fp4", "int4", "int2"]

# chapter file stem -> "module:attribute" of its schema (imported lazily)
CHAPTERS = {
    "01_kv_footprint": "analysis.kv_params:PARAMS",
    "02_ssd_offload": "analysis.tiering.params:PARAMS",
    "03_disagg": "analysis.disagg.params:PARAMS",
    "04_qevict": "analysis.qevict.params:PARAMS",
    "05_where_kv_lives": "analysis.compose.params:PARAMS",
}


def schema(chapter: str) -> dict[str, Param]:
    """The schema of a chapter, by file stem or path (``book/01_kv_footprint.md``)."""
    import os
    from pathlib import Path

    stem = Path(chapter).stem
    chapters = dict(CHAPTERS)
    # extra chapters (your own notebooks): KVBOOK_EXTRA_CHAPTERS="stem=module:attr,stem2=module:attr"
    for item in filter(None, os.environ.get("KVBOOK_EXTRA_CHAPTERS", "").split(",")):
        k, _, v = item.partition("=")
        chapters[k.strip()] = v.strip()
    if stem not in chapters:
        raise ParameterError(f"no parameter schema for chapter {chapter!r}; chapters: {', '.join(CHAPTERS)}")
    mod, attr = chapters[stem].split(":")
    return getattr(importlib.import_module(mod), attr)


def defaults(chapter: str) -> dict:
    return {k: p.default for k, p in schema(chapter).items()}


def injected_names(namespace: dict) -> list[str]:
    """Names assigned by the cell papermill injected into this kernel (``# Parameters``), read from
    IPython's input history (``In``) in ``namespace``; empty outside IPython or without papermill."""
    import ast

    history = namespace.get("In")
    if not isinstance(history, list):
        return []
    for src in reversed(history):
        if isinstance(src, str) and src.lstrip().startswith("# Parameters\n"):
            try:
                tree = ast.parse(src)
            except SyntaxError:
                return []
            return [t.id for node in tree.body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)]
    return []


def check(chapter: str, namespace: dict) -> dict:
    """Validate a chapter's parameters as they stand in ``namespace`` (the notebook's globals),
    write the normalised values back, and return them. A name injected by papermill
    (``papermill -p NAME VALUE``) that the schema does not know is an error, as with
    ``analysis.rerun``: it would otherwise be silently ignored."""
    sch = schema(chapter)
    unknown = [k for k in injected_names(namespace) if k not in sch]
    if unknown:
        validate(sch, {k: namespace.get(k) for k in unknown}, partial=True)  # raises, with close matches
    values = {k: namespace[k] for k in sch if k in namespace}
    missing = [k for k in sch if k not in namespace]
    if missing:
        raise ParameterError(f"parameters cell lacks {missing}; it must set every parameter of the schema")
    out = validate(sch, values)
    namespace.update(out)
    return out


def describe(chapter: str, full: bool = False) -> str:
    """A Markdown table of a chapter's parameters: summarised for the chapter's opening, complete
    (every allowed value) with ``full=True`` (``python -m analysis.rerun CHAPTER --list-params``)."""
    rows = ["| parameter | default | allowed | meaning |", "|---|---|---|---|"]
    for k, p in schema(chapter).items():
        rows.append(f"| `{k}` | `{p.default!r}` | {p.describe(full)} | {p.help} |")
    return "\n".join(rows)
