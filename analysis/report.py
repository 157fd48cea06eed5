"""Gluing computed values into the prose (myst-nb ``glue``), with the raw value kept for reruns.

``glue(name, value, fmt)`` displays ``fmt.format(value)`` as the text that ``{glue:text}`` /
``{glue}`` roles render in the book, and stores the raw value in the output metadata under
``kvbook`` so that :mod:`analysis.rerun` can put it, unformatted, into results tables.
"""
from __future__ import annotations

import base64
import html
import json
import math
import platform
from importlib import metadata

import numpy as np

GLUE_PREFIX = "application/papermill.record/"  # myst-nb's prefix for glued, non-displayed data


def _jsonable(value):
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def fmt_bytes(n: float, digits: int = 3) -> str:
    """Human-readable bytes in SI units (kB = 1e3 B): 327680 -> '328 kB'."""
    n = float(n)
    for unit, f in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= f:
            return f"{n / f:.{digits}g} {unit}"
    return f"{n:.{digits}g} B"


def format_value(value, fmt: str | None = None) -> str:
    if fmt is None:
        if isinstance(value, (bool, np.bool_)):
            return str(bool(value))
        if isinstance(value, (int, np.integer)):
            return f"{int(value):,}"
        if isinstance(value, (float, np.floating)):
            return f"{float(value):,.3g}"
        return str(value)
    if fmt == "bytes":
        return fmt_bytes(value)
    return fmt.format(value)


class GluedText(str):
    """The text :func:`glue` returns: a ``str`` that IPython does not echo as a cell's output, so a
    cell ending in ``glue(...)`` shows no bare ``'100%'`` under it."""

    def _ipython_display_(self):
        pass


def glue(name: str, value, fmt: str | None = None) -> str:
    """Glue ``value`` under ``name`` (not displayed in the cell); returns the displayed text (a
    :class:`GluedText`, which a cell does not echo)."""
    from IPython.display import display  # optional heavy dependency

    text = format_value(value, fmt)
    # myst-nb passes text/plain through ast.literal_eval before formatting ("4,456" would become the
    # tuple (4, 456)); storing the repr of the string makes literal_eval return the text unchanged.
    display({GLUE_PREFIX + "text/plain": repr(text)}, raw=True,
            metadata={"scrapbook": {"name": name, "mime_prefix": GLUE_PREFIX},
                      "kvbook": {"name": name, "value": _jsonable(value), "text": text}})
    return GluedText(text)


def glued_values(nb) -> dict:
    """Raw glued values of an executed notebook (``name -> value``), in glue order."""
    out = {}
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []) or []:
            md = o.get("metadata", {}) or {}
            if "kvbook" in md:
                out[md["kvbook"]["name"]] = md["kvbook"]["value"]
            elif "scrapbook" in md:
                data = o.get("data", {})
                prefix = md["scrapbook"].get("mime_prefix", "")
                out.setdefault(md["scrapbook"]["name"], data.get(prefix + "text/plain"))
    return out


def versions() -> dict:
    """Versions of Python and the packages the book is built with (for each chapter's footer)."""
    out = {"python": platform.python_version()}
    for pkg in ("numpy", "scipy", "pandas", "seaborn", "matplotlib", "jupyter-book", "myst-nb", "jupytext",
                "papermill", "kvbook-analysis"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def rerun_footer(chapter: str, sweep: str | None = None):
    """Markdown for the end of a chapter: how to rerun it and the versions it was built with."""
    from IPython.display import Markdown  # optional heavy dependency

    lines = ["**Rerun this chapter** with other parameters (papermill):", "",
             "```bash", f"python -m analysis.rerun book/{chapter}.md -p NAME VALUE ...",
             f"python -m analysis.rerun book/{chapter}.md --list-params"]
    if sweep:
        lines.append(f"python -m analysis.rerun --sweep sweeps/{sweep} --jobs 2")
    lines += ["```", "", "**Built with** " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "."]
    return Markdown("\n".join(lines))


def csv_download(df, filename: str, text: str | None = None):
    """An HTML link that downloads ``df`` as CSV (embedded as a data URI, so it works in the built book,
    in the notebook and offline); for tables too long to show (the page keeps the figure and links the
    full table as CSV)."""
    from IPython.display import HTML  # optional heavy dependency

    data = base64.b64encode(df.to_csv(index=False).encode()).decode()
    label = html.escape(text or f"Download the full table ({len(df)} rows) as CSV: {filename}")
    name = html.escape(filename)
    return HTML(f'<p><a download="{name}" href="data:text/csv;base64,{data}">{label}</a></p>')


# ------------------------------------------------------------------- sentences from values and verdicts
# A sentence that states a comparison or an outcome is written from the values it compares, so that the
# prose cannot say "meets" beside a number that misses, or "more" beside a saving (issue 30).

def compare_text(value: float, reference: float, fmt: str = "{:.0%}", *, relative: bool = True,
                 more: str = "more", less: str = "less", same: str = "the same as") -> str:
    """How ``value`` compares with ``reference``, as a phrase that ends where the reference's name goes:
    ``'65% more than'``, ``'12% less than'`` or ``'the same as'`` (when the difference formats as zero).
    ``relative``: the difference as a fraction of ``reference`` (``value / reference - 1``), else
    ``value - reference``; ``fmt`` formats its size. A NaN on either side says so."""
    value, reference = float(value), float(reference)
    if not (math.isfinite(value) and math.isfinite(reference)):
        return "not comparable (no value) with"
    if relative and reference == 0:
        raise ValueError("compare_text: a relative comparison needs a non-zero reference "
                         "(pass relative=False to compare differences)")
    diff = value / reference - 1.0 if relative else value - reference
    size = fmt.format(abs(diff))
    if diff == 0 or not any(ch.isdigit() and ch != "0" for ch in size):
        return same
    return f"{size} {more if diff > 0 else less} than"


def target_text(what: str, value: float, target: float, fmt: str = "{:.1%}", *, groups: dict | None = None,
                lower_is_better: bool = True, group_noun: str = "") -> str:
    """Whether ``value`` meets a ``target`` (at most it when ``lower_is_better``, else at least), with the
    numbers: ``'meets the TTFT target (29.2% ≤ 30.0%)'``. ``groups`` (name -> value, e.g. the error per
    mode) qualifies the outcome: the groups on the other side of the target are named with their values,
    ``'meets the TTFT target overall (29.2% ≤ 30.0%) but misses it on disaggregated runs (49.0%)'``; a
    group with no value (NaN) is left out. ``group_noun`` follows each group's name ('runs')."""
    def ok(v):
        return v <= target if lower_is_better else v >= target

    value, target = float(value), float(target)
    if not math.isfinite(value):
        return f"cannot be judged against the {what} target (no value)"
    sign = ("≤" if ok(value) else ">") if lower_is_better else ("≥" if ok(value) else "<")
    verb = "meets" if ok(value) else "misses"
    head = f"{verb} the {what} target"
    nums = f"({fmt.format(value)} {sign} {fmt.format(target)})"
    other = [(g, float(v)) for g, v in (groups or {}).items()
             if math.isfinite(float(v)) and ok(float(v)) != ok(value)]
    if not other:
        return f"{head} {nums}"
    noun = f" {group_noun}" if group_noun else ""
    names = ", ".join(f"{g}{noun} ({fmt.format(v)})" for g, v in other)
    return f"{head} overall {nums} but {'misses' if ok(value) else 'meets'} it on {names}"
