"""Papermill parameter schemas, their validation and their typed configurations.

Each chapter has one :class:`Schema`: every parameter once, with type, default, range and help. The
schema lives in the chapter's subpackage (``analysis.<subpackage>.params.SCHEMA``; chapter 1's in
:mod:`analysis.kv_params`) and registers itself here when imported (:func:`register`): registration
goes downward, and this module imports no other module of ``analysis``.

A chapter's first code cell (tagged ``parameters``) sets every knob as a literal (papermill injects
overrides after it; ``tests/test_params_schema.py`` checks that the cell sets exactly the schema's
parameters with exactly its defaults). The next cell imports the schema and calls
``SCHEMA.check(globals())``, which validates the knobs and fails *before any work* with a
:class:`ParameterError` naming each bad parameter and what is allowed. ``SCHEMA.config(values)``
turns validated values into the typed configuration (frozen dataclasses grouped by concern) that the
library functions take. ``analysis.rerun`` finds a chapter's schema by its file stem through
:mod:`analysis.chapters` and validates ``-p`` values against it before any notebook runs.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import math
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


class ParameterError(ValueError):
    """One or more parameters are invalid; the message lists each with what is allowed."""


@dataclass(frozen=True)
class Param:
    """One parameter: ``kind`` is 'int', 'float', 'str', 'bool', 'list[int]', 'list[float]',
    'list[str]' or 'dict'. ``choices`` may be a callable returning the allowed values (e.g. model
    names read from ``data/``), checked element-wise for lists. ``min``/``max`` bound numbers
    (element-wise for lists)."""

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
        close = difflib.get_close_matches(str(v), [str(c) for c in ch], n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        return v, f"{name}: {v!r} is not allowed{hint}; allowed: {', '.join(map(str, ch))}"
    return v, None


def validate(schema: Mapping[str, Param], values: Mapping, *, partial: bool = False) -> dict:
    """Validate ``values`` against ``schema``; returns a complete, normalised dict.

    Unknown names, wrong types, values outside ``choices`` or bounds: all problems are collected and
    raised together in one :class:`ParameterError`. With ``partial=True`` missing names take their
    defaults (as for ``-p`` overrides). A :class:`Schema`'s cross-parameter checks run last."""
    errors, out = [], {}
    for name in values:
        if name not in schema:
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
    if isinstance(schema, Schema) and schema.consistency is not None:
        schema.consistency(out)
    return out


# ------------------------------------------------------------------------------ typed configurations

def group(cls, values: Mapping):
    """An instance of the frozen dataclass ``cls`` from ``values``: each field is the parameter of the
    same name (a configuration grouped by concern: workload, hardware, prices...)."""
    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})


def _config_layout(cls) -> dict[str, type | None]:
    """``{field: group class, or None for a parameter held directly}`` of a configuration class."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name] if dataclasses.is_dataclass(hints[f.name]) else None)
            for f in dataclasses.fields(cls)}


def config_names(cls) -> list[str]:
    """The parameter names a configuration class holds (through its groups), in field order."""
    out = []
    for name, sub in _config_layout(cls).items():
        out += [f.name for f in dataclasses.fields(sub)] if sub is not None else [name]
    return out


_KIND_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "dict": dict}


class Schema(Mapping):
    """A chapter's parameters (a read-only mapping name -> :class:`Param`, in the order of the
    chapter's parameters cell), its cross-parameter checks (``consistency(values)``, raising
    :class:`ParameterError`) and its typed configuration class ``config``: a frozen dataclass whose
    fields are frozen dataclasses grouping parameters by concern (or parameters themselves). The
    configuration must hold every parameter exactly once (checked here, at import); without one, a
    flat frozen dataclass named after the chapter is made from the schema."""

    def __init__(self, chapter: str, params: Mapping[str, Param], *, config: type | None = None,
                 consistency: Callable[[dict], None] | None = None):
        self.chapter = chapter
        self._params = dict(params)
        self.consistency = consistency
        if config is None:
            name = "Config_" + "".join(c if c.isalnum() else "_" for c in chapter)
            config = dataclasses.make_dataclass(
                name, [(k, _KIND_TYPES.get(p.kind, list)) for k, p in self._params.items()], frozen=True)
        names = config_names(config)
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup or set(names) != set(self._params):
            raise TypeError(f"{chapter}: configuration {config.__name__} must hold every parameter "
                            f"exactly once; "
                            f"missing {sorted(set(self._params) - set(names))}, "
                            f"unknown {sorted(set(names) - set(self._params))}, twice {dup}")
        self.config_class = config

    def __getitem__(self, name: str) -> Param:
        return self._params[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def __repr__(self) -> str:
        return f"Schema({self.chapter!r}, {len(self)} parameters)"

    def defaults(self) -> dict:
        return {k: p.default for k, p in self._params.items()}

    def validate(self, values: Mapping, *, partial: bool = False) -> dict:
        return validate(self, values, partial=partial)

    def config(self, values: Mapping | None = None):
        """The typed configuration of ``values`` (validated; missing names take their defaults)."""
        v = self.validate(dict(values or {}), partial=True)
        kw = {name: (group(sub, v) if sub is not None else v[name])
              for name, sub in _config_layout(self.config_class).items()}
        return self.config_class(**kw)

    def check(self, namespace: dict, defaults: bool = False) -> dict:
        """Validate a chapter's parameters as they stand in ``namespace`` (the notebook's globals),
        write the normalised values back, and return them. A name injected by papermill
        (``papermill -p NAME VALUE``) that the schema does not know is an error, as with
        ``analysis.rerun``: it would otherwise be silently ignored.

        ``defaults=True`` (a chapter's evidence page, whose parameters cell is empty: the chapter's
        cell is the one place its defaults are written) takes the schema's default for every
        parameter the namespace does not set; otherwise a missing parameter is an error."""
        unknown = [k for k in injected_names(namespace) if k not in self]
        if unknown:
            validate(self._params, {k: namespace.get(k) for k in unknown}, partial=True)  # raises
        if defaults:
            for k, p in self.items():
                namespace.setdefault(k, copy.deepcopy(p.default))
        missing = [k for k in self if k not in namespace]
        if missing:
            raise ParameterError(f"parameters cell lacks {missing}; it must set every parameter of the "
                                 f"schema")
        out = self.validate({k: namespace[k] for k in self})
        namespace.update(out)
        return out

    def rows(self, full: bool = False) -> list[dict]:
        """One row per parameter (``parameter``, ``default``, ``allowed``, ``meaning``): the table of
        the book's parameters appendix (``book/appendix_parameters.md``)."""
        return [{"parameter": k, "default": repr(p.default), "allowed": p.describe(full), "meaning": p.help}
                for k, p in self.items()]

    def describe(self, full: bool = False) -> str:
        """A Markdown table of the parameters: summarised for the chapter's opening, complete (every
        allowed value) with ``full=True`` (``python -m analysis.rerun CHAPTER --list-params``)."""
        rows = ["| parameter | default | allowed | meaning |", "|---|---|---|---|"]
        for k, p in self.items():
            rows.append(f"| `{k}` | `{p.default!r}` | {p.describe(full)} | {p.help} |")
        return "\n".join(rows)


# ------------------------------------------------------------------------------ chapter registry

KV_DTYPES = ["fp32", "bf16", "fp16", "fp8", "int8", "fp4", "int4", "int2"]

_REGISTRY: dict[str, Schema] = {}


def register(schema: Schema) -> Schema:
    """Register a chapter's schema (called by the chapter's schema module when it is imported)."""
    _REGISTRY[schema.chapter] = schema
    return schema


def registered() -> list[str]:
    return list(_REGISTRY)


EVIDENCE_SUFFIX = "_evidence"


def chapter_stem(page: str) -> str:
    """The chapter a page belongs to, by file stem: ``book/02_ssd_offload.md`` -> ``02_ssd_offload``; a
    chapter's evidence page (``book/02_ssd_offload_evidence.md``: its full tables, secondary figures and
    sensitivity grids, a child of the chapter in the table of contents) shares the chapter's schema, so
    it maps to the chapter too."""
    stem = page.replace("\\", "/").rsplit("/", 1)[-1]
    stem = stem[:-3] if stem.endswith((".md", ".py")) else stem[:-6] if stem.endswith(".ipynb") else stem
    return stem[: -len(EVIDENCE_SUFFIX)] if stem.endswith(EVIDENCE_SUFFIX) else stem


def schema(chapter: str | Schema) -> Schema:
    """The registered schema of a chapter, by file stem or path (``book/01_kv_footprint.md``). This
    module imports no chapter: import the chapter's schema module first, or use
    :func:`analysis.chapters.schema`, which finds it by name."""
    if isinstance(chapter, Schema):
        return chapter
    stem = chapter_stem(chapter)
    if stem not in _REGISTRY:
        raise ParameterError(f"no parameter schema registered for chapter {chapter!r} (registered: "
                             f"{', '.join(_REGISTRY) or 'none'}); import its schema module, or find it by "
                             f"name with analysis.chapters.schema({stem!r})")
    return _REGISTRY[stem]


def defaults(chapter: str | Schema) -> dict:
    return schema(chapter).defaults()


def check(chapter: str | Schema, namespace: dict) -> dict:
    """:meth:`Schema.check` of a registered chapter."""
    return schema(chapter).check(namespace)


def describe(chapter: str | Schema, full: bool = False) -> str:
    """:meth:`Schema.describe` of a registered chapter."""
    return schema(chapter).describe(full)


def injected_names(namespace: dict) -> list[str]:
    """Names assigned by the cell papermill injected into this kernel (``# Parameters``), read from
    IPython's input history (``In``) in ``namespace``; empty outside IPython or without papermill."""
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
