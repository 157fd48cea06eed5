"""Every table a chapter shows, formatted for readers by one function: :func:`show`.

A chapter's cell ends with ``tables.show(df_or_styler, formats=..., units=...)``. The result renders as
an HTML table (no pandas index column) whose cells read as a person writes them:

* ``True``/``False`` as *yes*/*no*, missing values (``None``, NaN) as *—*, infinities as *∞*;
* a mapping (a dict, or a JSON object in a string) as ``key: value, ...``, a list as ``a, b, ...``;
* a number without a declared format with at most four significant digits, thousands separated and no
  padded zeros (``0.5``, ``14``, ``1,306``); a string's padded decimals are trimmed (``512.000
  sequences`` reads ``512 sequences``, ``$inf`` reads ``$∞``);
* a column's declared format (``formats={"col": "{:.1%}"}`` or a callable), or the format a pandas
  ``Styler`` already gives the column (``df.style.format(...)``, e.g. from a chapter module), is kept.

``units={"col": "GB/s"}`` writes the unit into the header (``col (GB/s)``). A table of more than
:data:`MAX_PLAIN_ROWS` rows, or of more than :data:`MAX_PLAIN_COLUMNS` columns, is *interactive*: the
book's ``_static/kvbook-tables.js`` (``_ext/static``) makes it sortable, filterable and paginated
(:data:`PAGE_SIZE` rows a page) in the built HTML, offline and without any library; without
JavaScript (a notebook) it is the full plain table. Numeric cells carry their raw value
(``data-sort``) so that sorting is numeric. Formatting is display only: glued values never pass here.
"""
from __future__ import annotations

import functools
import html
import json
import math
import numbers
import re
from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd
from pandas.io.formats.style import Styler
from pandas.io.formats.style_render import _default_formatter

MAX_PLAIN_ROWS = 20      # a longer table is interactive (paginated)
MAX_PLAIN_COLUMNS = 9    # a wider table is interactive too (its columns sortable, the page scrolls it)
PAGE_SIZE = 10           # rows a page of an interactive table
NA = "—"
NUM_CLASS = ' class="num"'

_PADDED = re.compile(r"(?<![\d.])(\d[\d,]*)\.0{2,}(?!\d)")            # 512.000 -> 512
_TRAILING = re.compile(r"(?<![\d.])(\d[\d,]*\.\d*?[1-9])0{2,}(?!\d)")  # 0.500000 -> 0.5
_INF = re.compile(r"(?<![A-Za-z])([-+−]?)inf(?![A-Za-z])", re.I)


def human_number(x: float) -> str:
    """A number with at most four significant digits, thousands separated, no padded zeros."""
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return NA
    x = float(x) if not isinstance(x, numbers.Integral) else x
    if isinstance(x, numbers.Integral):
        return f"{int(x):,}"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if x == 0:
        return "0"
    if x.is_integer() and abs(x) < 1e15:
        return f"{x:,.0f}"
    mag = math.floor(math.log10(abs(x)))
    if mag < -4:
        return f"{x:.3g}"
    s = f"{x:,.{max(0, 3 - mag)}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def human_text(s: str) -> str:
    """A string cell as a reader reads it: booleans, missing values, infinities, JSON and padded
    decimals rewritten (the rest unchanged)."""
    t = s.strip()
    if t in ("True", "False"):
        return "yes" if t == "True" else "no"
    if t in ("", "nan", "NaN", "None", "<NA>", "NaT"):
        return NA
    if t[:1] in "{[" and t[-1:] in "}]":
        try:
            return human(json.loads(t))
        except ValueError:
            pass
    out = _INF.sub(lambda m: ("−" if m.group(1) and m.group(1) in "-−" else "") + "∞", s)
    out = _PADDED.sub(r"\1", out)
    return _TRAILING.sub(r"\1", out)


def human(v) -> str:
    """Any cell value as text for readers (see the module's docstring)."""
    if v is None:
        return NA
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, numbers.Number):
        return human_number(v)
    if isinstance(v, Mapping):
        return ", ".join(f"{k}: {human(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple, set, np.ndarray)):
        return ", ".join(human(x) for x in v)
    if isinstance(v, pd.Timestamp):
        return v.strftime("%Y-%m-%d") if v == v.normalize() else v.strftime("%Y-%m-%d %H:%M")
    try:
        if pd.isna(v):
            return NA
    except (TypeError, ValueError):
        pass
    return human_text(str(v))


def _missing(v) -> bool:
    try:
        return v is None or bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _sort_key(v) -> str | None:
    """The raw value a numeric cell sorts by (``data-sort``); None for text."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        return None
    x = float(v)
    if math.isnan(x):
        return None
    return "Infinity" if x == math.inf else "-Infinity" if x == -math.inf else repr(x)


def _header(col, units: Mapping) -> str:
    name = " ".join(str(c) for c in col if str(c)) if isinstance(col, tuple) else str(col)
    unit = units.get(col) or units.get(name)
    return f"{name} ({unit})" if unit else name


def _is_default(func) -> bool:
    """pandas' own default cell formatter (``Styler`` sets one for every cell): not a declared format."""
    return (isinstance(func, functools.partial) and func.func is _default_formatter
            and func.keywords.get("precision") == pd.get_option("styler.format.precision"))


def _formatter(fmt) -> Callable:
    if callable(fmt):
        return fmt
    return lambda v: fmt.format(v)


class Table:
    """A formatted table: ``_repr_html_`` for the book, ``text`` rows for tests and plain output."""

    def __init__(self, columns: list[str], rows: list[list[str]], sort_keys: list[list[str | None]],
                 numeric: list[bool], *, caption: str | None = None, interactive: bool = False,
                 page_size: int = PAGE_SIZE):
        self.columns, self.rows, self.sort_keys, self.numeric = columns, rows, sort_keys, numeric
        self.caption, self.interactive, self.page_size = caption, interactive, page_size

    def frame(self) -> pd.DataFrame:
        """The displayed text as a DataFrame (what a reader sees, cell by cell)."""
        return pd.DataFrame(self.rows, columns=self.columns)

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return self.frame().to_string(index=False)

    def _repr_html_(self) -> str:
        cls = "kvbook-table" + (" kvbook-interactive" if self.interactive else "")
        out = [f'<div class="kvbook-table-wrap"><table class="{cls}" data-page-size="{self.page_size}">']
        if self.caption:
            out.append(f"<caption>{html.escape(self.caption)}</caption>")
        out.append("<thead><tr>")
        out += [f'<th scope="col"{NUM_CLASS if n else ""}>{html.escape(c)}</th>'
                for c, n in zip(self.columns, self.numeric)]
        out.append("</tr></thead><tbody>")
        for row, keys in zip(self.rows, self.sort_keys):
            out.append("<tr>")
            for text, key, n in zip(row, keys, self.numeric):
                attrs = (NUM_CLASS if n else "") + (f' data-sort="{key}"' if key is not None else "")
                out.append(f"<td{attrs}>{html.escape(text)}</td>")
            out.append("</tr>")
        out.append("</tbody></table></div>")
        return "".join(out)


def show(data: pd.DataFrame | Styler | None, *, formats: Mapping | None = None, units: Mapping | None = None,
         na: str = NA, caption: str | None = None, interactive: bool | None = None,
         max_rows: int = MAX_PLAIN_ROWS, page_size: int = PAGE_SIZE) -> Table | None:
    """``data`` (a DataFrame, or a pandas ``Styler`` whose explicit formats are kept) as a :class:`Table`.

    ``formats``: column -> format string (``"{:.1%}"``) or callable, applied to values that are neither
    missing nor infinite (those read ``na`` and ``∞``). ``units``: column -> unit written in its header.
    ``interactive``: None decides by size (more than ``max_rows`` rows or :data:`MAX_PLAIN_COLUMNS`
    columns). A column named in ``formats`` or ``units`` that the table lacks is an error. ``None`` shows
    nothing (returns None). A named index (``set_index("drive")``) becomes the first column (a Styler's
    formats then fall back to the human ones), unless the Styler hides it; an unnamed one is not shown.
    """
    if data is None:  # a chapter function with nothing to show (e.g. a sweep that was not run)
        return None
    if not isinstance(data, (pd.DataFrame, Styler)):
        raise TypeError(f"tables.show: a DataFrame or a Styler, not {type(data).__name__}")
    styler = data if isinstance(data, Styler) else None
    df = styler.data if styler is not None else data
    index_shown = styler is None or not all(getattr(styler, "hide_index_", [False]))
    if index_shown and any(n is not None for n in df.index.names):
        # a meaningful index becomes the first column (a Styler's formats shift with its columns)
        if styler is not None:
            styler = styler.data.reset_index().style  # its declared formats would point at other columns
        df = df.reset_index()
    formats, units = dict(formats or {}), dict(units or {})
    unknown = [c for c in list(formats) + list(units) if c not in df.columns]
    if unknown:
        raise KeyError(f"tables.show: columns not in the table: {unknown}")
    # a Styler's declared formats: (row, col) -> function, in pandas' _display_funcs (pandas is pinned;
    # tests/test_tables.py checks that a declared format is kept and the default one is not)
    set_funcs = {k: f for k, f in getattr(styler, "_display_funcs", {}).items() if not _is_default(f)}
    hidden_cols = set()
    if styler is not None and getattr(styler, "hidden_columns", None):
        hidden_cols = set(styler.hidden_columns)
    cols = [j for j in range(df.shape[1]) if j not in hidden_cols]
    fmt = {df.columns.get_loc(c): _formatter(f) for c, f in formats.items()}
    rows, keys = [], []
    for i in range(df.shape[0]):
        row, key = [], []
        for j in cols:
            v = df.iat[i, j]
            if isinstance(v, np.generic):
                v = v.item()
            if _missing(v) and not isinstance(v, (list, tuple, dict, np.ndarray)):
                text = na
            elif isinstance(v, float) and math.isinf(v):
                text = "∞" if v > 0 else "−∞"
            elif j in fmt:
                text = human_text(str(fmt[j](v)))
            elif (i, j) in set_funcs and isinstance(v, numbers.Number) and not isinstance(v, bool):
                text = human_text(str(set_funcs[(i, j)](v)))
            else:
                text = human(v)
            row.append(text)
            key.append(_sort_key(v))
        rows.append(row)
        keys.append(key)
    # numeric: every shown value of the column is a number (missing ones aside), right-aligned
    numeric = [any(k[n] is not None for k in keys)
               and all(k[n] is not None or r[n] == na for k, r in zip(keys, rows)) for n in range(len(cols))]
    columns = [_header(df.columns[j], units) for j in cols]
    if interactive is None:
        interactive = len(rows) > max_rows or len(cols) > MAX_PLAIN_COLUMNS
    return Table(columns, rows, keys, numeric, caption=caption, interactive=interactive, page_size=page_size)
