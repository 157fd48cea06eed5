"""Which module holds each chapter's parameter schema: a table of names, imported by the tools.

The base layer (:mod:`analysis.params`) imports no chapter: a chapter's schema module registers its
:class:`~analysis.params.Schema` with :func:`analysis.params.register` when it is imported. The tools
that start from a chapter's *file* rather than its code (``python -m analysis.rerun CHAPTER
--list-params`` and ``-p`` validation, sweeps, :mod:`analysis.deps`) need to know which module that
is; this table says so, as strings, and :func:`schema` imports the module by name at call time. This
module imports only :mod:`analysis.params` (the registry) at import time.

Extra chapters (your own notebooks, the tests' fixture chapter): ``KVBOOK_EXTRA_CHAPTERS =
"stem=module[:attr],stem2=module2[:attr]"``; the module either registers its schema itself, or
``attr`` names its schema (a :class:`~analysis.params.Schema` or a plain mapping of
:class:`~analysis.params.Param`, registered here).
"""
from __future__ import annotations

import importlib
import os
from pathlib import PurePath

from . import params

# chapter file stem -> module that defines and registers its schema (``SCHEMA``)
CHAPTERS = {
    "01_kv_footprint": "analysis.kv_params",
    "02_ssd_offload": "analysis.tiering.params",
    "03_disagg": "analysis.disagg.params",
    "04_qevict": "analysis.qevict.params",
    "05_where_kv_lives": "analysis.compose.params",
}


def _extra() -> dict[str, str]:
    out = {}
    for item in filter(None, os.environ.get("KVBOOK_EXTRA_CHAPTERS", "").split(",")):
        k, _, v = item.partition("=")
        out[k.strip()] = v.strip()
    return out


def schema_module(chapter: str) -> str | None:
    """``module[:attr]`` of a chapter's schema (by file stem or path), or None."""
    stem = params.chapter_stem(PurePath(chapter).name)
    return {**CHAPTERS, **_extra()}.get(stem)


def stems() -> list[str]:
    return list({**CHAPTERS, **_extra()})


def schema(chapter: str):
    """The :class:`~analysis.params.Schema` of a chapter (by file stem or path), its module imported
    by name. A chapter's evidence page (``NN_slug_evidence``) has its chapter's schema."""
    stem = params.chapter_stem(PurePath(chapter).name)
    spec = schema_module(stem)
    if spec is None:
        raise params.ParameterError(f"no parameter schema for chapter {chapter!r}; chapters: "
                                    f"{', '.join(stems())}")
    mod, _, attr = spec.partition(":")
    m = importlib.import_module(mod)
    if stem not in params.registered():
        obj = getattr(m, attr or "SCHEMA")
        params.register(obj if isinstance(obj, params.Schema) else params.Schema(stem, obj))
    return params.schema(stem)
