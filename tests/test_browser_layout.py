"""What a reader sees of outputs, figures and tables, in a real browser (headless Chromium at 1280 px):

* no cell output is a bare Python string (a cell whose last expression returns ``'100%'``);
* every figure is legible at the rendered page width: no image in a cell output is shown at less than
  ``MIN_SCALE`` of its pixel width (a wide figure squeezed into the column shrinks its text with it);
* tables shown to readers (chapters 1, 2 and 4) have no pandas index column and a unit (or a count) in
  the header of every numeric column;
* the front page opens with its key results, verdict counts and the headline figure.

Skipped (with the reason) only when ``_build/html`` does not exist; a missing Chromium fails.
"""
from __future__ import annotations

import re
import urllib.parse

import pytest

from tests import browser_helpers as bh

PAGES = bh.toc_docnames()
TABLE_CHAPTERS = [d for d in bh.chapter_docnames() if re.match(r"book/0[1-5]_", d)]
MIN_SCALE = 0.7
# Pages whose figures may be reported as expected failures (figures named) while their chapter's issue
# narrows them; every other page fails outright. Chapters 3, 4 and 5 were narrowed in session 3
# (issues 12, 11/13/14, 16), so none is exempt now.
KNOWN_TOO_WIDE: dict[str, str] = {}

LAYOUT_JS = r"""
const done = arguments[arguments.length - 1];
const settle = () => {
  const art = document.querySelector('article') || document.body;
  const outs = [...art.querySelectorAll('.cell_output .output')].map(o => {
    const pre = o.querySelector('pre');
    return {text: pre ? pre.innerText.trim() : '', cls: o.className};
  });
  const imgs = [...art.querySelectorAll('.cell_output img, figure img')].map(im => ({
    src: im.getAttribute('src') || '', natural: im.naturalWidth, shown: im.getBoundingClientRect().width,
    fig: (im.closest('figure') || {}).id || ''}));
  const tables = [...art.querySelectorAll('.cell_output table')].map(t => ({
    bodyTh: t.querySelectorAll('tbody th').length,
    head: [...t.querySelectorAll('thead th')].map(th => th.innerText.trim()),
    rows: [...t.querySelectorAll('tbody tr')].slice(0, 50).map(
      tr => [...tr.querySelectorAll('td')].map(td => td.innerText.trim()))}));
  done({outs, imgs, tables, text: art.innerText.slice(0, 20000),
        firstFigure: (art.querySelector('figure') || {}).id || ''});
};
if (document.readyState === 'complete') setTimeout(settle, 300);
else window.addEventListener('load', () => setTimeout(settle, 300));
"""

BARE_STRING = re.compile(r"""^(['"]).*\1$""", re.S)
NUMBER = re.compile(r"^[-+−]?[\d,]*\.?\d+(e[-+]?\d+)?$", re.I)
UNIT_IN_HEADER = re.compile(r"\(.+\)|%|×|/|\bUSD\b|\bGB\b|\bTB\b|\bs\b|tokens|bytes", re.I)
COUNT_HEADERS = re.compile(r"layers|requests|instances|gpus|drives|blocks|count|rank|batch|devices|accesses",
                           re.I)


_SEEN: dict[str, dict] = {}


def layout(browser, base_url, docname):
    if docname not in _SEEN:
        browser.get(urllib.parse.urljoin(base_url, docname + ".html"))
        _SEEN[docname] = browser.execute_async_script(LAYOUT_JS)
    return _SEEN[docname]


@pytest.mark.parametrize("docname", PAGES)
def test_no_cell_output_is_a_bare_python_string(browser, base_url, docname):
    r = layout(browser, base_url, docname)
    bare = [o["text"][:80] for o in r["outs"] if o["text"] and BARE_STRING.match(o["text"])]
    assert not bare, f"{docname}: cell outputs that are a bare Python string (end the cell with ';' or " \
                     f"assign the value): {bare}"


@pytest.mark.parametrize("docname", PAGES)
def test_figures_are_not_shrunk_below_legibility(browser, base_url, docname):
    r = layout(browser, base_url, docname)
    small = [f"{im['fig'] or im['src'][-40:]}: shown at {im['shown']:.0f} of {im['natural']} px "
             f"({im['shown'] / im['natural']:.0%})"
             for im in r["imgs"] if im["natural"] > 0 and im["shown"] < MIN_SCALE * im["natural"]]
    if small and docname in KNOWN_TOO_WIDE:
        pytest.xfail(f"known too-wide figures ({KNOWN_TOO_WIDE[docname]}): " + "; ".join(small))
    assert not small, f"{docname}: figures shrunk below {MIN_SCALE:.0%} of their pixel width at 1280 px " \
                      f"(make them narrower or split them):\n  " + "\n  ".join(small)


@pytest.mark.parametrize("docname", TABLE_CHAPTERS)
def test_tables_have_units_and_no_index_column(browser, base_url, docname):
    r = layout(browser, base_url, docname)
    assert r["tables"], f"{docname}: no table found"
    problems = []
    for i, t in enumerate(r["tables"]):
        if t["bodyTh"]:
            problems.append(f"table {i + 1} ({t['head'][:3]}): shows the pandas index column")
        head = [h for h in t["head"] if h]
        for j, h in enumerate(head):
            col = [row[j] for row in t["rows"] if j < len(row) and row[j]]
            numeric = col and all(NUMBER.match(v.replace("\u2009", "")) for v in col)
            if numeric and not (UNIT_IN_HEADER.search(h) or COUNT_HEADERS.search(h)):
                problems.append(f"table {i + 1}: numeric column {h!r} has no unit in its header")
    assert not problems, f"{docname}:\n  " + "\n  ".join(problems)


def test_front_page_answers_first(browser, base_url):
    root = PAGES[0]
    r = layout(browser, base_url, root)
    text = r["text"]
    assert "The answers" in text and "Verdicts" in text, "the front page does not open with its answers"
    assert text.index("The answers") < text.index("About this book")
    assert r["firstFigure"] == "fig-headline", "the headline figure is not the front page's first figure"
    counts = re.findall(r"\d+ (?:reproduced|partly reproduced|not reproduced|not testable)", text)
    assert len(counts) >= 4, f"verdict counts not rendered on the front page: {counts}"
