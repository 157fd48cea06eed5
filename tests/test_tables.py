"""analysis.tables.show: every table a reader sees, formatted by one function (issue 30), and the book's
page weight kept down (Plotly served once from ``_static``, not inlined into chapter 5)."""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import tables
from analysis.compose import figures

REPO = Path(__file__).resolve().parent.parent


def test_cells_read_as_a_person_writes_them():
    df = pd.DataFrame({"ok": [True, False, None], "rate": [0.5, np.inf, np.nan],
                       "plan": ['{"tp": 1.0, "pp": 2}', "512.000 sequences", "$inf"],
                       "n": [1306.0, 14.0, 0.500000], "cfg": [{"tp": 1.0}, [1, 2], "0.500000"]})
    t = tables.show(df).frame()
    assert list(t["ok"]) == ["yes", "no", "—"]
    assert list(t["rate"]) == ["0.5", "∞", "—"]
    assert list(t["plan"]) == ["tp: 1, pp: 2", "512 sequences", "$∞"]
    assert list(t["n"]) == ["1,306", "14", "0.5"]
    assert list(t["cfg"]) == ["tp: 1", "1, 2", "0.5"]
    raw = re.compile(r"\bTrue\b|\bFalse\b|\binf\b|\bnan\b|\{|\d\.\d*000")
    assert not [c for row in tables.show(df).rows for c in row if raw.search(c)]


def test_human_numbers():
    assert tables.human_number(1234.5678) == "1,235"
    assert tables.human_number(3.14159) == "3.142"
    assert tables.human_number(0.000012345) == "1.23e-05"
    assert tables.human_number(-2.5e9) == "-2,500,000,000"
    assert tables.human_number(7) == "7" and tables.human_number(0.0) == "0"


def test_declared_formats_are_kept_and_pandas_default_is_not():
    df = pd.DataFrame({"share": [0.123, 0.5], "x": [0.5, 2.0]})
    st = df.style.format({"share": "{:.1%}"}).hide(axis="index")
    t = tables.show(st).frame()
    assert list(t["share"]) == ["12.3%", "50.0%"]  # the Styler's declared format
    assert list(t["x"]) == ["0.5", "2"]  # not pandas' default "0.500000"
    assert list(tables.show(df, formats={"x": "{:.2f}x"}).frame()["x"]) == ["0.50x", "2x"]
    # infinities and missing values never reach a declared format ("$inf")
    money = pd.DataFrame({"usd": [1.5, np.inf, np.nan]}).style.format({"usd": "${:.2f}"})
    assert list(tables.show(money).frame()["usd"]) == ["$1.50", "∞", "—"]


def test_units_in_headers_and_unknown_columns_fail():
    df = pd.DataFrame({"bandwidth": [1.0], "drives": [2]})
    assert tables.show(df, units={"bandwidth": "GB/s"}).columns == ["bandwidth (GB/s)", "drives"]
    with pytest.raises(KeyError):
        tables.show(df, units={"bandwith": "GB/s"})
    with pytest.raises(KeyError):
        tables.show(df, formats={"nope": "{:g}"})


def test_index_column_and_html():
    named = pd.DataFrame({"v": [1.0, 2.0]}, index=pd.Index(["a", "b"], name="drive"))
    assert tables.show(named).columns == ["drive", "v"]
    assert tables.show(named.style.hide(axis="index")).columns == ["v"]
    assert tables.show(named.reset_index(drop=True).set_axis([7, 3])).columns == ["v"]  # unnamed: not shown
    html = tables.show(pd.DataFrame({"v": [3, 1]}))._repr_html_()
    assert "<tbody><tr><td" in html and "<tbody><tr><th" not in html  # no index column
    assert 'data-sort="3.0"' in html and 'class="num"' in html
    assert tables.show(None) is None
    with pytest.raises(TypeError):
        tables.show("a string")


def test_long_or_wide_tables_are_interactive():
    assert not tables.show(pd.DataFrame({"x": range(tables.MAX_PLAIN_ROWS)})).interactive
    long = tables.show(pd.DataFrame({"x": range(tables.MAX_PLAIN_ROWS + 1)}))
    assert long.interactive and "kvbook-interactive" in long._repr_html_()
    wide = pd.DataFrame({f"c{i}": [1] for i in range(tables.MAX_PLAIN_COLUMNS + 1)})
    assert tables.show(wide).interactive
    assert not tables.show(wide, interactive=False).interactive


def _chapter_code(path: Path) -> list[str]:
    import jupytext  # optional heavy dependency

    return [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]


def _clean(code: str) -> str:
    return "\n".join(line for line in code.split("\n") if not line.startswith(("%", "!")))


PAGES = sorted((REPO / "book").glob("0*.md")) + [REPO / "book" / "appendix_reproduce.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_shown_table_goes_through_tables_show(page):
    """A pandas Styler (``.style``) in a page's code is always inside ``tables.show(...)``, and a cell
    that ends with a table-returning call (``..._table(...)``, ``claims.frame(...)``) wraps it."""
    problems = []
    for code in _chapter_code(page):
        tree = ast.parse(_clean(code))
        inside = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "tables.show":
                inside |= {id(n) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "style" and id(node) not in inside:
                problems.append(ast.unparse(node)[:80])
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
            name = ast.unparse(last.value.func)
            if re.search(r"(_table|_list|_display|_summary|\.frame)$", name) and id(last.value) not in inside:
                problems.append(ast.unparse(last.value)[:80])
    assert not problems, f"{page.name}: tables shown without analysis.tables.show: {problems}"


def test_chapter_five_loads_plotly_from_the_book():
    data = {"factors": [1.0], "contexts": [4096], "hits": [0.5], "maps": [], "bars": [], "colors": ["#000"],
            "layout_labels": ["HBM only"]}
    book = figures.interactive_map_html(data, "m", plotly_js="book")
    inline = figures.interactive_map_html(data, "m")
    assert len(book) < 50_000 < 1_000_000 < len(inline)
    assert figures.PLOTLY_BOOK_PATH in book and "data-content_root" in book
    with pytest.raises(ValueError):
        figures.interactive_map_html(data, "m", plotly_js="cdn")
    assert 'plotly_js="book"' in (REPO / "book" / "05_where_kv_lives.md").read_text()


def test_build_writes_plotly_into_static(tmp_path):
    spec = importlib.util.spec_from_file_location("kvbook_html", REPO / "_ext" / "kvbook_html.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    out = ext.write_plotly_js(tmp_path)
    assert out == tmp_path / figures.PLOTLY_BOOK_PATH
    from plotly.offline import get_plotlyjs

    assert out.read_text(encoding="utf-8") == get_plotlyjs()
