"""Tables, the claims ledger and page weight in a real browser (headless Chromium at 1280x900), issue 30:

* ``_static/kvbook-tables.js`` on a synthetic page (always): a long table of :func:`analysis.tables.show`
  shows one page of rows, filters and sorts numerically; a ledger-shaped table gets verdict badges, a
  robustness column and its rule in a details row that a button opens;
* on the built book (when ``_build/html`` exists): no page's HTML weighs over 2 MB and Plotly is served
  once from ``_static``; no chapter page shows more than 20 rows of a table at once; the ledger is one
  table of every claim with a badge per verdict, sorts and filters, and is at most three screens tall.

A missing Chromium fails, as in tests/test_browser.py.
"""
from __future__ import annotations

import re
import urllib.parse

import pandas as pd
import pytest

from analysis import tables
from tests import browser_helpers as bh

JS = bh.REPO / "_ext" / "static" / "kvbook-tables.js"
CSS = bh.REPO / "_ext" / "static" / "kvbook.css"
MAX_HTML_BYTES = 2_000_000
SCREEN = 900


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    drv = bh.start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield drv
    drv.quit()


LEDGER = """
<table class="table kvbook-ledger"><thead><tr><th>Chapter</th><th>Claim (source)</th>
<th>This book computes</th><th>Verdict</th><th>Rule (declared)</th></tr></thead><tbody>
<tr><td>1</td><td>claim one</td><td>3</td>
<td>reproduced (fragile: partly reproduced when x = 2); amended after the result (2026-12-01)</td>
<td>two-sided: within 1%</td></tr>
<tr><td>2</td><td>claim two</td><td>4</td><td>not reproduced (robust to y).</td><td>one-sided</td></tr>
<tr><td>3</td><td>claim three</td><td>5</td><td>consistent (no assumption declared).</td><td>bound</td></tr>
</tbody></table>"""


def _page(tmp_path, body: str) -> None:
    head = (f"<meta charset='utf-8'><title>tables</title><link rel='icon' href='data:,'>"
            f"<style>{CSS.read_text()}</style>")
    (tmp_path / "index.html").write_text(f"<!doctype html><html><head>{head}</head><body>{body}"
                                         f"<script>{JS.read_text()}</script></body></html>")


def _visible_rows(drv, sel):
    return drv.execute_script(
        "return [...document.querySelector(arguments[0]).tBodies[0].rows]"
        ".filter(r => r.getClientRects().length && !r.classList.contains('kvbook-detail'))"
        ".map(r => r.cells[0].innerText.trim());", sel)


def _type(drv, sel, text):
    drv.execute_script(
        "var f = document.querySelector(arguments[0]).kvbookControls.filter;"
        "f.value = arguments[1]; f.dispatchEvent(new Event('input'));", sel, text)


def test_the_script_and_the_formatter_agree_on_the_longest_plain_table():
    m = re.search(r"var MAX_PLAIN_ROWS = (\d+);", JS.read_text())
    assert m and int(m.group(1)) == tables.MAX_PLAIN_ROWS


def test_interactive_table_pages_filters_and_sorts(browser, tmp_path):
    df = pd.DataFrame({"n": [(i * 37) % 45 for i in range(45)], "name": [f"row {i}" for i in range(45)]})
    t = tables.show(df)
    assert t.interactive
    md = "".join(f"<tr><td>p{i}</td><td>{i}</td></tr>" for i in range(tables.MAX_PLAIN_ROWS + 5))
    md = f'<div class="cell_output"><table class="table"><thead><tr><th>parameter</th><th>default</th></tr>' \
         f"</thead><tbody>{md}</tbody></table></div>"
    _page(tmp_path, t._repr_html_() + md)
    with bh.serve(tmp_path) as url:
        browser.get(url + "index.html")
        sel = "table.kvbook-interactive"
        shown = _visible_rows(browser, sel)
        assert len(shown) == tables.PAGE_SIZE, shown
        browser.execute_script("document.querySelector(arguments[0]).kvbookControls.next.click();", sel)
        assert _visible_rows(browser, sel) != shown and len(_visible_rows(browser, sel)) == tables.PAGE_SIZE
        browser.execute_script("document.querySelector(arguments[0] + ' thead th').click();", sel)
        assert [int(v) for v in _visible_rows(browser, sel)] == list(range(tables.PAGE_SIZE))  # numeric order
        browser.execute_script("document.querySelector(arguments[0] + ' thead th').click();", sel)
        assert [int(v) for v in _visible_rows(browser, sel)] == list(range(44, 44 - tables.PAGE_SIZE, -1))
        _type(browser, sel, "row 4")  # row 4, row 40..44
        assert len(_visible_rows(browser, sel)) == 6
        # another long table of a cell's output (a parameters table printed as Markdown) is paginated too
        assert len(_visible_rows(browser, ".cell_output table")) == tables.PAGE_SIZE
        errors = bh.console_errors(browser.get_log("browser"))
        assert not errors, errors


def test_ledger_badges_robustness_and_rule_details(browser, tmp_path):
    _page(tmp_path, LEDGER)
    with bh.serve(tmp_path) as url:
        browser.get(url + "index.html")
        r = browser.execute_script("""
            var t = document.querySelector('table.kvbook-ledger');
            var seen = el => el.getClientRects().length > 0;
            return {head: [...t.tHead.rows[0].cells].filter(seen).map(c => c.innerText),
                    badges: [...t.querySelectorAll('.kv-badge')].map(b => b.className + ':' + b.innerText),
                    rob: [...t.tBodies[0].rows].filter(r => !r.classList.contains('kvbook-detail'))
                          .map(r => r.dataset.robustness),
                    details: [...t.querySelectorAll('tr.kvbook-detail')].filter(seen).length};
        """)
        assert [h.rstrip(" ↕") for h in r["head"]][:5] == ["Chapter", "Claim (source)", "This book computes",
                                                           "Verdict", "Robustness"]
        assert not any(h.startswith("Rule") for h in r["head"])  # the rule is in the details row
        assert "kv-badge kv-verdict-reproduced:reproduced" in r["badges"]
        assert "kv-badge kv-verdict-not-reproduced:not reproduced" in r["badges"]
        assert "kv-badge kv-mark kv-mark-amended:amended" in r["badges"]
        assert "kv-badge kv-mark kv-mark-fragile:fragile" in r["badges"]
        assert r["rob"] == ["fragile", "robust", "—"] and r["details"] == 0
        browser.execute_script("document.querySelector('button.kvbook-expand').click();")
        detail = browser.execute_script(
            "return [...document.querySelectorAll('tr.kvbook-detail')].filter(r => r.getClientRects().length)"
            ".map(r => r.innerText);")
        assert len(detail) == 1 and "two-sided: within 1%" in detail[0]
        assert "partly reproduced when x" in detail[0]
        browser.execute_script("document.querySelectorAll('table.kvbook-ledger thead th')[3].click();")
        assert _visible_rows(browser, "table.kvbook-ledger") == ["3", "2", "1"]  # consistent, not rep., rep.
        _type(browser, "table.kvbook-ledger", "not reproduced")
        assert _visible_rows(browser, "table.kvbook-ledger") == ["2"]


# ------------------------------------------------------------------------------------ the built book
def test_pages_weigh_under_two_megabytes(site):
    heavy = {str(p.relative_to(site)): p.stat().st_size for p in site.rglob("*.html")
             if p.stat().st_size > MAX_HTML_BYTES}
    assert not heavy, f"HTML pages over {MAX_HTML_BYTES:,} bytes: {heavy}"
    assert (site / "_static" / "plotly.min.js").is_file(), "Plotly is not served from _static"
    assert (site / "_static" / "kvbook-tables.js").is_file()


TABLE_ROWS_JS = r"""
const done = arguments[arguments.length - 1];
setTimeout(() => {
  const art = document.querySelector('article') || document.body;
  done([...art.querySelectorAll('.cell_output table')].map(t => ({
    head: [...t.querySelectorAll('thead th')].slice(0, 3).map(h => h.innerText.trim()),
    interactive: t.classList.contains('kvbook-interactive'),
    rows: t.tBodies[0] ? t.tBodies[0].rows.length : 0,
    visible: t.tBodies[0] ? [...t.tBodies[0].rows].filter(r => r.getClientRects().length).length : 0})));
}, 300);
"""


@pytest.mark.parametrize("docname", bh.chapter_docnames() + bh.evidence_docnames()
                         + [d for d in bh.toc_docnames() if d.startswith("book/appendix_")])
def test_chapter_tables_show_at_most_twenty_rows(browser, base_url, docname):
    browser.get(urllib.parse.urljoin(base_url, docname + ".html"))
    ts = browser.execute_async_script(TABLE_ROWS_JS)
    long_plain = [t for t in ts if not t["interactive"] and t["rows"] > tables.MAX_PLAIN_ROWS]
    too_many = [t for t in ts if t["visible"] > tables.MAX_PLAIN_ROWS]
    assert not long_plain and not too_many, \
        f"{docname}: tables showing more than {tables.MAX_PLAIN_ROWS} rows: {long_plain + too_many}"


def test_ledger_is_one_sortable_filterable_table(browser, base_url):
    browser.get(urllib.parse.urljoin(base_url, "book/claims.html"))
    r = browser.execute_script("""
        var ts = document.querySelectorAll('table.kvbook-ledger'), t = ts[0];
        var rows = [...t.tBodies[0].rows].filter(r => !r.classList.contains('kvbook-detail'));
        return {n: ts.length, rows: rows.length, verdicts: rows.map(r => r.dataset.verdict),
                badges: rows.filter(r => r.querySelector('.kv-badge[class*="kv-verdict-"]')).length,
                height: t.getBoundingClientRect().height};
    """)
    assert r["n"] == 1, "the ledger is not one table"
    assert r["rows"] >= 20 and r["badges"] == r["rows"], r  # a badge in every row (one per setting)
    known = {"reproduced", "consistent", "partly reproduced", "not reproduced", "not testable"}
    assert set(r["verdicts"]) <= known, set(r["verdicts"]) - known
    assert r["height"] <= 3 * SCREEN, f"the collapsed ledger is {r['height']:.0f} px tall"
    _type(browser, "table.kvbook-ledger", "not testable")
    shown = browser.execute_script(
        "return [...document.querySelector('table.kvbook-ledger').tBodies[0].rows]"
        ".filter(r => r.getClientRects().length && !r.classList.contains('kvbook-detail'))"
        ".map(r => [r.dataset.verdict, (r.innerText + ' ' + (r.dataset.search || '') + ' ' +"
        " ((r.nextElementSibling && r.nextElementSibling.classList.contains('kvbook-detail'))"
        " ? r.nextElementSibling.textContent : '')).toLowerCase()]);")
    # the filter is full-text: a row shows when its verdict, label or rule mentions the words (an amended
    # verdict's "under the original rule, not testable" included)
    assert any(v == "not testable" for v, _ in shown), shown
    assert all("not testable" in text for _, text in shown), [v for v, t in shown if "not testable" not in t]
    _type(browser, "table.kvbook-ledger", "")
    browser.execute_script("document.querySelectorAll('table.kvbook-ledger thead th')[3].click();")
    order = browser.execute_script(
        "return [...document.querySelector('table.kvbook-ledger').tBodies[0].rows]"
        ".filter(r => r.getClientRects().length && !r.classList.contains('kvbook-detail'))"
        ".map(r => r.dataset.verdict);")
    assert order == sorted(order), order


def test_map_loads_plotly_from_the_books_static_files(browser, tmp_path):
    """Chapter 5's map with ``plotly_js="book"`` draws from ``_static/plotly.min.js`` (as the build writes
    it), relative to the page's Sphinx content root, with no network and no error."""
    import importlib.util

    from analysis.compose import figures
    from tests.test_browser_interactive import LAYOUTS, _grid

    spec = importlib.util.spec_from_file_location("kvbook_html", bh.REPO / "_ext" / "kvbook_html.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    ext.write_plotly_js(tmp_path)
    cells, every = _grid()
    data = figures.interactive_data(cells, every, LAYOUTS)
    frag = figures.interactive_map_html(data, "kvmap", plotly_js="book")
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "page.html").write_text(
        "<!doctype html><html data-content_root='../'><head><meta charset='utf-8'><title>map</title>"
        f"<link rel='icon' href='data:,'></head><body>{frag}</body></html>")
    bh.drain_logs(browser)
    with bh.serve(tmp_path) as url:
        browser.get(url + "book/page.html")
        drawn = browser.execute_async_script(
            "var done = arguments[arguments.length - 1], t0 = Date.now();"
            "(function wait() { var e = document.getElementById('kvmap-map');"
            "  if ((e && e.data) || Date.now() - t0 > 20000) done(!!(e && e.data));"
            "  else setTimeout(wait, 100); })();")
        console, perf = bh.drain_logs(browser)
    assert drawn, "the map did not draw from _static/plotly.min.js"
    assert not bh.console_errors(console) and not bh.failed_requests(perf)
