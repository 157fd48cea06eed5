"""A book a reader finishes (issue 30, item 8), in a real browser (headless Chromium at 1280x900):

* **screens per page**: a page is at most ``MAX_SCREENS`` (15) screens of 900 px; chapters 2-5 wait for
  their restructure (issues 27/29/32) and are listed in ``SCREEN_CEILINGS`` with the height they had
  when the rule came in, which they must not exceed (and must leave the list once they fit);
* **figures legible as displayed**: every figure image is shown at the width that
  ``analysis.plots.displayed_px`` assumes (its natural width, or the book's content column when wider),
  so the figure-style rule of tests/test_figures_style.py (no text under 10 px) holds on the page;
* **a numbered caption on every figure**: every image of a page sits in a ``<figure>`` whose caption
  starts with its number ("Fig. N");
* **the front page's verdict badges**: ``_static/kvbook-tables.js`` turns each glued verdict of the
  answers table into the ledger's badge with its fragile / amended marks (on a synthetic page, always;
  on the built front page when ``_build/html`` exists), and the map marks borrowed evidence.

Table rows on chapter pages, the ledger's sorting and filtering and page weight are checked by
tests/test_browser_tables.py. A missing Chromium fails, as in tests/test_browser.py.
"""
from __future__ import annotations

import urllib.parse

import pytest

from analysis import plots
from analysis.compose import headline
from tests import browser_helpers as bh

SCREEN_W, SCREEN_H = 1280, 900
MAX_SCREENS = 15
# Chapters whose restructure to <= 15 screens waits on their content issues: the number of screens each
# had when this rule came in (whole screens, rounded up, of the book built on 2026-12-03 at 00:35 after
# commit 518e0c7, measured by this test's PAGE_JS: 41.3, 39.1, 55.0 and 32.1): a ceiling that must not
# grow. Remove a chapter from here when it fits in MAX_SCREENS.
RESTRUCTURE_WAITS = "restructure waits on issues 27/29/32"
SCREEN_CEILINGS: dict[str, tuple[int, str]] = {
}
# A chapter's evidence page (book/NN_slug_evidence: its full tables, secondary figures, sensitivity grids
# and calibration detail, a child of the chapter in the toc) is reference, read by section rather than
# front to back; its long tables are interactive (paginated). It still has a limit, so that it cannot
# become the old chapter again: 45 screens (set 2026-12-03, before any evidence page existed).
EVIDENCE_MAX_SCREENS = 45
JS = bh.REPO / "_ext" / "static" / "kvbook-tables.js"
CSS = bh.REPO / "_ext" / "static" / "kvbook.css"
WIDTH_SLACK_PX = 2  # sub-pixel layout


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    drv = bh.start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield drv
    drv.quit()


# ------------------------------------------------------------------------------- the limits' logic
def screens(height_px: float) -> float:
    return height_px / SCREEN_H


def screen_problem(docname: str, height_px: float, ceilings=SCREEN_CEILINGS) -> str | None:
    """Why a page of ``height_px`` breaks the screens rule, or None."""
    n = screens(height_px)
    if docname in ceilings:
        ceiling, reason = ceilings[docname]
        if n > ceiling:
            return f"{docname} is {n:.1f} screens, over its ceiling of {ceiling} ({reason}): it must not grow"
        if n <= MAX_SCREENS:
            return (f"{docname} is {n:.1f} screens, within {MAX_SCREENS}: remove it from SCREEN_CEILINGS "
                    "so the rule holds for it")
        return None
    limit = EVIDENCE_MAX_SCREENS if docname.endswith(bh.EVIDENCE_SUFFIX) else MAX_SCREENS
    if n > limit:
        return f"{docname} is {n:.1f} screens of {SCREEN_H} px at {SCREEN_W} px, over {limit}"
    return None


def image_problem(img: dict, column_px: float = plots.BOOK_CONTENT_PX) -> str | None:
    """Why a page's figure image breaks the display assumption of :func:`analysis.plots.displayed_px`, or
    None: it must be shown at its natural width, or at the content column's width when wider (never
    squeezed further, which would shrink its text below the style rule's 10 px), and in a <figure> whose
    caption is numbered."""
    name = img.get("fig") or img["src"][-50:]
    if not img["inFigure"]:
        return f"{name}: an image outside a <figure> (no number, no caption)"
    if not img["caption"].startswith("Fig."):
        return f"{name}: its caption is not numbered ('Fig. N ...'): {img['caption'][:60]!r}"
    if img["natural"] > 0 and img["shown"] < min(img["natural"], column_px) - WIDTH_SLACK_PX:
        return (f"{name}: shown {img['shown']:.0f} px wide, narrower than min(natural {img['natural']} px, "
                f"column {column_px} px): its text is smaller than tests/test_figures_style.py assumes")
    return None


def test_screen_rule_fails_a_long_page_and_a_grown_or_finished_chapter():
    assert screen_problem("book/intro", 15 * SCREEN_H) is None
    assert "over 15" in screen_problem("book/intro", 15 * SCREEN_H + 1)
    assert screen_problem("book/02_x_evidence", 30 * SCREEN_H) is None  # an evidence page: reference
    assert "over 45" in screen_problem("book/02_x_evidence", 45 * SCREEN_H + 1)
    ceilings = {"book/02_x": (35, "waits")}
    assert screen_problem("book/02_x", 34.8 * SCREEN_H, ceilings) is None
    assert "must not grow" in screen_problem("book/02_x", 35.2 * SCREEN_H, ceilings)
    assert "remove it from SCREEN_CEILINGS" in screen_problem("book/02_x", 12 * SCREEN_H, ceilings)


def test_only_the_waiting_chapters_have_a_ceiling():
    assert SCREEN_CEILINGS == {}, "every chapter fits: the ceilings are gone for good"
    assert set(SCREEN_CEILINGS) <= set(bh.chapter_docnames())
    assert all(reason == RESTRUCTURE_WAITS and c > MAX_SCREENS for c, reason in SCREEN_CEILINGS.values())


def test_image_rule_fails_a_squeezed_or_uncaptioned_figure():
    ok = {"src": "a.png", "fig": "fig-a", "inFigure": True, "caption": "Fig. 3 A caption.", "natural": 800,
          "shown": plots.BOOK_CONTENT_PX}
    assert image_problem(ok) is None
    assert image_problem({**ok, "natural": 500, "shown": 500}) is None
    assert "narrower" in image_problem({**ok, "shown": 600})
    assert "narrower" in image_problem({**ok, "natural": 500, "shown": 400})
    assert "not numbered" in image_problem({**ok, "caption": "A caption."})
    assert "outside a <figure>" in image_problem({**ok, "inFigure": False, "caption": ""})


# ------------------------------------------------------------------- the answers' badges (synthetic)
ANSWERS = """
<table class="table kvbook-answers"><thead><tr><th>Question</th><th>Answer</th><th>Verdict</th></tr></thead>
<tbody>
<tr><td>one</td><td>an answer</td><td><ul>
<li>claim a: <span class="pasted-text">reproduced (fragile: partly reproduced when x = 2); amended after the
result (2026-12-01): under the original rule, reproduced</span></li>
<li>claim b: <span class="pasted-text">not reproduced (robust to y)</span></li></ul></td></tr>
<tr><td>two</td><td>another <span class="pasted-text">28%</span></td><td><span class="pasted-text">partly
reproduced (fragile: reproduced when SSD price (x) = 0.5)</span></td></tr>
<tr><td>three</td><td>per setting</td><td><span class="pasted-text">conversation: not reproduced (fragile:
partly reproduced when x = 0; partly reproduced when x = inf); tool&amp;agent: not testable: the trace is not
here; synthetic: not reproduced (robust to x)</span></td></tr>
</tbody></table>"""


def test_answers_get_the_ledgers_badges_and_marks(browser, tmp_path):
    head = (f"<meta charset='utf-8'><title>answers</title><link rel='icon' href='data:,'>"
            f"<style>{CSS.read_text()}</style>")
    (tmp_path / "index.html").write_text(f"<!doctype html><html><head>{head}</head><body>{ANSWERS}"
                                         f"<script>{JS.read_text()}</script></body></html>")
    with bh.serve(tmp_path) as url:
        browser.get(url + "index.html")
        r = browser.execute_script(BADGES_JS)
        errors = bh.console_errors(browser.get_log("browser"))
    assert not errors, errors
    assert r["rows"] == [["kv-verdict-reproduced:reproduced", "kv-mark-fragile:fragile",
                          "kv-mark-amended:amended", "kv-verdict-not-reproduced:not reproduced"],
                         ["kv-verdict-partly-reproduced:partly reproduced", "kv-mark-fragile:fragile"],
                         # a verdict per setting: a badge per setting, the row's label the first one's
                         ["kv-verdict-not-reproduced:conversation: not reproduced",
                          "kv-verdict-not-testable:tool&agent: not testable",
                          "kv-verdict-not-reproduced:synthetic: not reproduced", "kv-mark-fragile:fragile"]]
    assert r["verdicts"] == ["reproduced|not reproduced", "partly reproduced", "not reproduced"]
    assert r["answerBadges"] == 0  # a number glued into the answer column is not a verdict
    assert r["detailsOpen"] == 0 and r["details"] == 4  # each verdict's full text, collapsed


BADGES_JS = r"""
const t = document.querySelector('table.kvbook-answers');
const rows = [...t.tBodies[0].rows];
return {
  rows: rows.map(tr => [...tr.cells[2].querySelectorAll('.kv-badge')].map(
      b => b.className.split(' ').filter(c => c !== 'kv-badge' && c !== 'kv-mark')[0] + ':' + b.innerText)),
  verdicts: rows.map(tr => tr.dataset.verdicts),
  answerBadges: t.querySelectorAll('tbody td:nth-child(2) .kv-badge').length,
  details: t.querySelectorAll('details.kv-verdict-details').length,
  detailsOpen: t.querySelectorAll('details.kv-verdict-details[open]').length,
};
"""


# ------------------------------------------------------------------------------------ the built book
PAGE_JS = r"""
const done = arguments[arguments.length - 1];
(async () => {
  const t0 = Date.now();
  const imgs = [...document.images];
  while (Date.now() - t0 < 15000 && !imgs.every(i => i.complete)) await new Promise(r => setTimeout(r, 100));
  await new Promise(r => setTimeout(r, 300));
  const art = document.querySelector('article.bd-article') || document.body;
  const height = Math.max(document.documentElement.scrollHeight, document.body.scrollHeight);
  const images = [...art.querySelectorAll('img')].map(im => {
    const f = im.closest('figure'), c = f && f.querySelector('figcaption');
    return {src: im.getAttribute('src') || '', natural: im.naturalWidth,
            shown: im.getBoundingClientRect().width, inFigure: !!f, fig: f ? f.id : '',
            caption: c ? c.innerText.trim() : ''};
  });
  return {height, images, width: window.innerWidth};
})().then(done, e => done({error: String(e)}));
"""

_SEEN: dict[str, dict] = {}


def page(browser, base_url, docname):
    if docname not in _SEEN:
        browser.get(urllib.parse.urljoin(base_url, docname + ".html"))
        r = browser.execute_async_script(PAGE_JS)
        assert "error" not in r, r
        _SEEN[docname] = r
    return _SEEN[docname]


@pytest.mark.parametrize("docname", bh.toc_docnames())
def test_page_fits_its_screens(browser, base_url, docname):
    r = page(browser, base_url, docname)
    assert r["width"] == SCREEN_W, f"the window is {r['width']} px wide, not {SCREEN_W}"
    problem = screen_problem(docname, r["height"])
    assert problem is None, problem


@pytest.mark.parametrize("docname", bh.toc_docnames())
def test_every_figure_is_numbered_captioned_and_shown_at_full_size(browser, base_url, docname):
    r = page(browser, base_url, docname)
    problems = [p for p in (image_problem(im) for im in r["images"]) if p]
    assert not problems, f"{docname}:\n  " + "\n  ".join(problems)


FRONT_JS = r"""
const t = document.querySelector('table.kvbook-answers');
if (!t) return {found: false};
const rows = [...t.tBodies[0].rows];
const known = new Set(['reproduced', 'consistent', 'partly reproduced', 'not reproduced', 'not testable']);
return {found: true, rows: rows.length,
        verdicts: rows.map(tr => (tr.dataset.verdicts || '').split('|').filter(Boolean)),
        unknown: rows.flatMap(tr => (tr.dataset.verdicts || '').split('|').filter(v => v && !known.has(v))),
        fragile: t.querySelectorAll('.kv-mark-fragile').length,
        caption: ((document.querySelector('#fig-headline figcaption') || {}).innerText || ''),
        text: (document.querySelector('article') || document.body).innerText};
"""


def test_front_page_answers_carry_verdict_badges_and_borrowed_evidence(browser, base_url):
    browser.get(urllib.parse.urljoin(base_url, bh.toc_docnames()[0] + ".html"))
    r = browser.execute_script(FRONT_JS)
    assert r["found"], "the front page has no answers table (list-table with :class: kvbook-answers)"
    assert r["rows"] >= 8 and all(r["verdicts"]), f"an answer without a verdict badge: {r['verdicts']}"
    assert not r["unknown"], f"verdicts that are not a label: {r['unknown']}"
    assert r["fragile"] >= 1, "no fragile verdict marked on the front page"
    # the map marks what it borrowed (published scores) and the page states the book's own measurement
    assert f"marked {headline.BORROWED_MARK}" in r["caption"], r["caption"][-200:]
    assert "Borrowed evidence in the map" in r["text"]
