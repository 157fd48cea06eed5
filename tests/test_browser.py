"""The rendered book, checked the way a reader meets it: in a real browser (headless Chromium).

The built site (``_build/html``, made by ``python -m analysis.build``, which ``make test`` runs
first) is served on 127.0.0.1 and every page of ``_toc.yml`` is opened. A page fails when the
browser logs an error, a request fails, an image is missing, empty or blank, a figure has no image,
a glued value renders empty or as ``<Figure size ...>``, a formula stays raw TeX, the sidebar lacks
a page, or a link to the book itself leads to a missing page or anchor. Chapters must also open with
what they show and their parameters, end with how to rerun them and the versions they were built
with, and offer their ``.md`` and ``.ipynb`` for download.
The search page must find each chapter by a word of its title. A full-page screenshot of every page
is left in ``_build/screenshots/`` for a person to look at.

Skipped (with the reason) only when ``_build/html`` does not exist; a missing Chromium fails.
"""
from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests import browser_helpers as bh

PAGES = bh.toc_docnames()
CHAPTERS = bh.chapter_docnames()

@pytest.fixture(scope="module")
def screenshots(site):
    if bh.SHOTS.exists():
        shutil.rmtree(bh.SHOTS)
    bh.SHOTS.mkdir(parents=True)
    return bh.SHOTS

_REPORTS: dict[str, dict] = {}

def visit(browser, base_url, screenshots, docname: str) -> dict:
    """Open a page once (per test session) and gather what a reader would see, with the logs."""
    if docname in _REPORTS:
        return _REPORTS[docname]
    browser.get("about:blank")
    bh.drain_logs(browser)
    url = urllib.parse.urljoin(base_url, docname + ".html")
    t0 = time.perf_counter()
    browser.get(url)
    report = browser.execute_async_script(bh.PAGE_REPORT_JS)
    assert "error" not in report, f"{docname}: the page report script failed: {report.get('error')}"
    report["seconds"] = time.perf_counter() - t0
    shot = screenshots / (docname.replace("/", "__") + ".png")
    bh.full_page_screenshot(browser, shot)
    time.sleep(0.2)  # let late console messages arrive before draining
    console, perf = bh.drain_logs(browser)
    report["console_errors"] = bh.console_errors(console)
    report["failed_requests"] = bh.failed_requests(perf)
    report["url"] = url
    _REPORTS[docname] = report
    return report

def test_toc_pages_are_built(site):
    missing = [d for d in PAGES if not (site / f"{d}.html").is_file()]
    assert not missing, f"pages of _toc.yml with no HTML in {site}: {missing}"
    assert CHAPTERS, "_toc.yml lists no numbered chapter (book/NN_slug)"

@pytest.mark.parametrize("docname", PAGES)
def test_page_loads_cleanly(browser, base_url, screenshots, docname):
    r = visit(browser, base_url, screenshots, docname)
    problems = [f"console error: {m}" for m in r["console_errors"]]
    problems += [f"failed request: {m}" for m in r["failed_requests"]]
    if not r["h1"]:
        problems.append("no <h1> title in the article")
    assert not problems, f"{docname}.html:\n  " + "\n  ".join(problems)

@pytest.mark.parametrize("docname", PAGES)
def test_images_and_figures(browser, base_url, screenshots, docname):
    r = visit(browser, base_url, screenshots, docname)
    problems = []
    for im in r["images"]:
        name = f"<img src={im['src']!r}> {im['where']}".strip()
        if not im["complete"] or im["w"] == 0 or im["h"] == 0:
            problems.append(f"{name}: not loaded (naturalWidth={im['w']}, naturalHeight={im['h']})")
        elif im["inArticle"] and 0 <= im["colours"] <= 1:
            problems.append(f"{name}: blank ({im['colours']} colour)")
    for f in r["figures"]:
        name = f"figure #{f['id']} \"{f['caption']}\""
        if f["nImages"] == 0:
            problems.append(f"{name}: has no image (its output is {f['text']!r})")
        if "<Figure size" in f["text"] or "<matplotlib" in f["text"]:
            problems.append(f"{name}: shows the repr of a figure object instead of the figure")
    if "<Figure size" in r["articleText"]:
        i = r["articleText"].index("<Figure size")
        problems.append(f"the text shows a figure object's repr: {r['articleText'][max(0, i - 60):i + 60]!r}")
    assert not problems, f"{docname}.html:\n  " + "\n  ".join(problems)

@pytest.mark.parametrize("docname", PAGES)
def test_glued_values_render_as_text(browser, base_url, screenshots, docname):
    r = visit(browser, base_url, screenshots, docname)
    problems = []
    for g in r["glue"]:
        text = g["text"].strip()
        if not text:
            problems.append(f"empty glued value in: {g['context']!r}")
        elif text.startswith("<") and ("Figure" in text or "object at 0x" in text or "matplotlib" in text):
            problems.append(f"glued value renders as a Python repr {text!r} in: {g['context']!r}")
        elif text in {"nan", "NaN", "None", "inf", "-inf", "<NA>", "NaT"}:
            # Python's and pandas' spellings of missing values (case matters: "none" is an English word)
            problems.append(f"glued value is {text!r} in: {g['context']!r}")
    for m in r["math"]:
        if not m["rendered"]:
            problems.append(f"formula not rendered by MathJax (raw TeX shown): {m['tex']!r}")
    assert not problems, f"{docname}.html:\n  " + "\n  ".join(problems)

RAW_TABLE = re.compile(r"\|\s*:?(-{3,}|—+|–+):?\s*\|")  # a Markdown table's rule row, printed as text


@pytest.mark.parametrize("docname", PAGES)
def test_no_raw_markup(browser, base_url, screenshots, docname):
    """Markdown that reaches the reader unrendered: a table printed as pipes, a role as braces."""
    r = visit(browser, base_url, screenshots, docname)
    text, problems = r["articleText"], []
    for pat in ("{glue:", "{glue}", "{doc}", "{ref}", "{numref}", "{cite:"):
        if pat in text:
            i = text.index(pat)
            problems.append(f"an unrendered role {pat!r}: {text[max(0, i - 40):i + 60]!r}")
    m = RAW_TABLE.search(text)
    if m:
        problems.append(f"a Markdown table shown as raw text: {text[max(0, m.start() - 60):m.end() + 60]!r}")
    assert not problems, f"{docname}.html:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("docname", PAGES)
def test_sidebar_lists_every_page(browser, base_url, screenshots, docname):
    r = visit(browser, base_url, screenshots, docname)
    links = {urllib.parse.urldefrag(a["href"])[0]: a for a in r["sidebar"]}
    problems = []
    for d in PAGES[1:]:  # the root is the home link above the sidebar's parts
        u = urllib.parse.urljoin(base_url, d + ".html")
        if u not in links:
            problems.append(f"no sidebar link to {d}.html")
        elif not links[u]["visible"] or not links[u]["text"]:
            problems.append(f"sidebar link to {d}.html is hidden or has no text")
    assert not problems, f"{docname}.html:\n  " + "\n  ".join(problems)

@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_opens_with_what_it_shows_and_its_parameters(browser, base_url, screenshots, docname):
    r = visit(browser, base_url, screenshots, docname)
    intro = r["introText"]
    problems = []
    if not re.search(r"what (it|this chapter) (shows|does)", intro, re.I):
        problems.append("no 'What it shows' (or 'What it does') paragraph before the first section")
    if not re.search(r"parameters", intro, re.I):
        problems.append("no 'Parameters' paragraph before the first section")
    if not r["introHasParamCell"]:
        problems.append("the cell tagged 'parameters' is not shown before the first section")
    assert not problems, f"{docname}.html:\n  " + "\n  ".join(problems)

@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_ends_with_rerun_and_versions(browser, base_url, screenshots, docname):
    r = visit(browser, base_url, screenshots, docname)
    last, stem = r["lastCellText"], docname.split("/")[-1]
    problems = []
    if f"python -m analysis.rerun book/{stem}.md" not in last:
        problems.append(f"the last cell does not say how to rerun it "
                        f"(python -m analysis.rerun book/{stem}.md)")
    if not re.search(r"Built with.*python \d+\.\d+", last, re.S):
        problems.append("the last cell does not list the versions it was built with "
                        "('Built with python X.Y ...')")
    if r["afterLastCell"]:
        problems.append(f"content after the rerun footer: {r['afterLastCell'][:3]}")
    assert not problems, f"{docname}.html:\n  " + "\n  ".join(problems)

_TARGETS: dict[str, tuple[int, str]] = {}


def _target(url: str) -> tuple[int, str]:
    """(HTTP status, text) of a page of the local site, fetched once."""
    if url not in _TARGETS:
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:  # the local test server only
                _TARGETS[url] = (resp.status, resp.read().decode("utf-8", errors="replace"))
        except urllib.error.HTTPError as e:
            _TARGETS[url] = (e.code, "")
    return _TARGETS[url]


@pytest.mark.parametrize("docname", PAGES)
def test_internal_links_resolve(browser, base_url, screenshots, docname):
    """Every link to the book itself reaches a page that exists, and the anchor it names."""
    r = visit(browser, base_url, screenshots, docname)
    problems = []
    for link in r["links"]:
        url, frag = urllib.parse.urldefrag(link["href"])
        status, text = _target(url)
        if status != 200:
            problems.append(f"link {link['text']!r} -> {link['href']}: HTTP {status}")
        elif frag and url.endswith(".html") and not re.search(
                rf"""(id|name)=["']{re.escape(urllib.parse.unquote(frag))}["']""", text):
            problems.append(f"link {link['text']!r} -> {link['href']}: no anchor #{frag} in the page")
    assert not problems, f"{docname}.html:\n  " + "\n  ".join(sorted(set(problems)))


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:  # the local test server only
        assert resp.status == 200, f"{url}: HTTP {resp.status}"
        return resp.read()

@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_downloads_md_and_ipynb(browser, base_url, screenshots, docname):
    r = visit(browser, base_url, screenshots, docname)
    by_text = {d["text"]: d["href"] for d in r["downloads"]}
    assert ".md" in by_text and ".ipynb" in by_text, \
        f"{docname}.html: the download menu offers {sorted(by_text)}, not both .md and .ipynb"
    md = _fetch(by_text[".md"]).decode("utf-8")
    src = (bh.REPO / f"{docname}.md").read_text(encoding="utf-8")
    assert md == src, f"{docname}.html: the .md download differs from {docname}.md"
    raw = _fetch(by_text[".ipynb"]).decode("utf-8")
    import nbformat

    try:
        nbformat.validate(nbformat.reads(raw, as_version=4))
    except Exception as exc:  # nbformat.ValidationError, JSON errors
        pytest.fail(f"{docname}.ipynb: not a valid notebook: {exc}")
    nb = json.loads(raw)
    assert nb.get("nbformat") == 4, f"{docname}.ipynb: not an nbformat-4 notebook"
    assert nb["metadata"].get("kernelspec", {}).get("name"), f"{docname}.ipynb: no kernelspec"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert tagged, f"{docname}.ipynb: no code cell tagged 'parameters' (papermill needs it)"
    first_code = "".join(code[0]["source"]) if isinstance(code[0]["source"], list) else code[0]["source"]
    assert first_code.strip() and first_code.strip() in src, \
        f"{docname}.ipynb: its first code cell is not the chapter's"

def _title_word(title: str) -> str:
    """The longest word of a title (ties: the first), which a search for the chapter should find."""
    words = re.findall(r"[A-Za-z][A-Za-z-]{3,}", title)
    return max(words, key=len) if words else title

@pytest.mark.parametrize("docname", CHAPTERS)
def test_search_finds_chapter_by_a_title_word(browser, base_url, screenshots, docname):
    r = visit(browser, base_url, screenshots, docname)
    title = r["h1"][0]
    word = _title_word(title)
    browser.get("about:blank")
    bh.drain_logs(browser)
    browser.get(urllib.parse.urljoin(base_url, "search.html?q=" + urllib.parse.quote(word)))
    res = browser.execute_async_script(bh.SEARCH_JS)
    console, perf = bh.drain_logs(browser)
    target = urllib.parse.urljoin(base_url, docname + ".html")
    hits = [urllib.parse.urldefrag(h)[0].split("?")[0] for h in res["links"]]
    assert not bh.console_errors(console) and not bh.failed_requests(perf), \
        f"search.html: {bh.console_errors(console)} {bh.failed_requests(perf)}"
    assert target in hits, (f"searching for {word!r} (from the title {title!r}) does not list "
                            f"{docname}.html; results: {res['links'][:8]}, status: {res['status']!r}")

def test_screenshots_taken(browser, base_url, screenshots):
    for d in PAGES:
        visit(browser, base_url, screenshots, d)
    missing = [d for d in PAGES if not (screenshots / (d.replace("/", "__") + ".png")).is_file()]
    assert not missing, f"no screenshot of {missing}"
    small = [p.name for p in screenshots.glob("*.png") if p.stat().st_size < 5000]
    assert not small, f"screenshots too small to show a page: {small}"
