"""Helpers for the browser tests (tests/test_browser.py): the built site's pages, a local HTTP server,
and a headless Chromium driven by Selenium through Debian's chromium-driver.

Chromium runs with every host except 127.0.0.1 unresolvable, so a page that needs the network (a
CDN script, a remote font or image) fails the same way on every machine, with or without network.
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import yaml

from analysis.params import EVIDENCE_SUFFIX

REPO = Path(__file__).resolve().parent.parent
SITE = REPO / "_build" / "html"
SHOTS = REPO / "_build" / "screenshots"
TOC = REPO / "_toc.yml"
CHAPTER_RE = re.compile(r"^book/\d\d_[^/]+$")

CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--disable-extensions", "--disable-default-apps", "--mute-audio",
    "--hide-scrollbars", "--window-size=1280,900", "--force-device-scale-factor=1", "--lang=en-US",
    # nothing but the local server resolves: a page that reaches outside fails everywhere alike
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]


# ---------------------------------------------------------------------------------------- the toc
def toc_entries(toc_file: Path = TOC) -> list[dict]:
    """Every page of ``_toc.yml`` in reading order: ``{"docname", "part"}`` (root first)."""
    toc = yaml.safe_load(toc_file.read_text())
    out = [{"docname": _docname(toc["root"]), "part": None}]

    def walk(items, part):
        for it in items or []:
            if "file" in it:
                out.append({"docname": _docname(it["file"]), "part": part})
            for key in ("sections", "chapters"):
                walk(it.get(key), part)
            if "parts" in it:
                for p in it["parts"]:
                    walk(p.get("chapters"), p.get("caption"))

    for p in toc.get("parts", []) or []:
        walk(p.get("chapters"), p.get("caption"))
    walk(toc.get("chapters"), None)
    walk(toc.get("sections"), None)
    return out


def _docname(f: str) -> str:
    return re.sub(r"\.(md|ipynb|rst)$", "", str(f)).strip("/")


def toc_docnames() -> list[str]:
    return [e["docname"] for e in toc_entries()]


def chapter_docnames() -> list[str]:
    """The numbered chapters (``book/NN_slug``) of the toc, without their evidence pages."""
    return [d for d in toc_docnames() if CHAPTER_RE.match(d) and not d.endswith(EVIDENCE_SUFFIX)]


def evidence_docnames() -> list[str]:
    """The chapters' evidence pages (``book/NN_slug_evidence``: full tables, secondary figures,
    sensitivity grids; each a child of its chapter in the toc)."""
    return [d for d in toc_docnames() if CHAPTER_RE.match(d) and d.endswith(EVIDENCE_SUFFIX)]


# -------------------------------------------------------------------------------------- the server
class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output to the test results
        pass


@contextlib.contextmanager
def serve(root: Path):
    """Serve ``root`` on 127.0.0.1 at a free port; yields the base URL (ending in '/')."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, name="book-http", daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=10)


# ------------------------------------------------------------------------------------- the browser
def find_binaries() -> tuple[str | None, str | None]:
    browser = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    return browser, driver


def start_chromium(profile_dir: Path):
    """A headless Chromium under Selenium, logging the console and the network."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = find_binaries()
    if not browser or not driver:
        raise RuntimeError(
            f"Chromium or chromedriver not found (chromium={browser}, chromedriver={driver}): "
            "install them with `bash .ci/install-browser.sh` (Debian packages chromium, chromium-driver); "
            "`make test` does this before pytest.")
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile_dir}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    service = Service(executable_path=driver, log_output=os.devnull)
    drv = webdriver.Chrome(options=opts, service=service)
    drv.set_page_load_timeout(60)
    drv.set_script_timeout(60)  # the page report waits up to 15 s for images and 15 s for MathJax
    return drv


def drain_logs(drv) -> tuple[list[dict], list[dict]]:
    """(console entries, performance entries) logged since the last call."""
    return drv.get_log("browser"), drv.get_log("performance")


def console_errors(entries: list[dict]) -> list[str]:
    return [e["message"] for e in entries if e.get("level") == "SEVERE"]


def failed_requests(perf_entries: list[dict]) -> list[str]:
    """Requests that failed or answered 4xx/5xx, as 'URL: reason' (cancelled ones aside)."""
    urls, bad = {}, []
    for e in perf_entries:
        msg = json.loads(e["message"])["message"]
        m, p = msg.get("method"), msg.get("params", {})
        if m == "Network.requestWillBeSent":
            urls[p["requestId"]] = p["request"]["url"]
        elif m == "Network.responseReceived":
            r = p["response"]
            if r.get("status", 0) >= 400:
                bad.append(f"{r['url']}: HTTP {r['status']}")
        elif m == "Network.loadingFailed" and not p.get("canceled"):
            bad.append(f"{urls.get(p['requestId'], p['requestId'])}: {p.get('errorText')}")
    return [b for b in bad if not b.startswith(("chrome://", "chrome-extension://", "about:"))]


def full_page_screenshot(drv, path: Path, width: int = 1280) -> None:
    """A PNG of the whole page (not just the window): the viewport is made as tall as the page."""
    import base64

    height = int(drv.execute_script(
        "return Math.max(document.documentElement.scrollHeight, document.body.scrollHeight);"))
    height = max(300, min(height, 30000))
    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    try:
        time.sleep(0.3)  # relayout at the new size
        shot = drv.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "fromSurface": True})
    finally:
        drv.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


# What the page shows a reader, gathered in the page itself after everything has loaded.
PAGE_REPORT_JS = r"""
const done = arguments[arguments.length - 1];
const main = document.querySelector('main') || document.body;
const article = document.querySelector('article.bd-article') || main;
function describe(el) {
  const fig = el.closest('figure');
  const cap = fig && fig.querySelector('figcaption');
  const id = (fig && fig.id) || el.id || '';
  return (id ? '#' + id + ' ' : '') + (cap ? '"' + cap.innerText.trim().slice(0, 80) + '"' : '');
}
function distinctColours(img) {
  try {
    const c = document.createElement('canvas');
    const w = Math.min(img.naturalWidth, 400), h = Math.min(img.naturalHeight, 400);
    c.width = w; c.height = h;
    const ctx = c.getContext('2d');
    ctx.drawImage(img, 0, 0, w, h);
    const d = ctx.getImageData(0, 0, w, h).data;
    const seen = new Set();
    for (let i = 0; i < d.length && seen.size < 50; i += 4 * 7) seen.add(d[i] + ',' + d[i+1] + ',' + d[i+2]);
    return seen.size;
  } catch (e) { return -1; }
}
async function run() {
  window.scrollTo(0, document.body.scrollHeight);
  const t0 = Date.now();
  const imgs = Array.from(document.images);
  while (Date.now() - t0 < 15000 && !imgs.every(i => i.complete)) await new Promise(r => setTimeout(r, 100));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    try {
      await Promise.race([MathJax.startup.promise, new Promise(r => setTimeout(r, 15000))]);
    } catch (e) {}
  }
  window.scrollTo(0, 0);
  const report = {};
  report.title = document.title;
  report.h1 = Array.from(article.querySelectorAll('h1')).map(h => h.innerText.replace(/#$/, '').trim());
  report.images = imgs.map(i => ({src: i.getAttribute('src'), alt: i.getAttribute('alt') || '',
    complete: i.complete, w: i.naturalWidth, h: i.naturalHeight, where: describe(i),
    colours: (i.complete && i.naturalWidth > 0) ? distinctColours(i) : 0,
    inArticle: article.contains(i)}));
  report.figures = Array.from(article.querySelectorAll('figure')).map(f => ({
    id: f.id || '', caption: (f.querySelector('figcaption') || {innerText: ''}).innerText.trim().slice(0, 80),
    nImages: f.querySelectorAll('img').length, text: f.innerText.slice(0, 200)}));
  report.glue = Array.from(article.querySelectorAll('.pasted-text, .pasted-inline')).map(g => ({
    // a glued value inside a collapsed <details> (the front page's verdict details) is hidden, not empty
    text: g.closest('details:not([open])') ? g.textContent : g.innerText, html: g.innerHTML.slice(0, 200),
    context: (g.closest('p, li, td, th') || g).innerText.trim().slice(0, 100)}));
  report.articleText = article.innerText;
  report.math = Array.from(article.querySelectorAll('.math')).map(m => ({
    rendered: !!m.querySelector('mjx-container'), tex: m.textContent.slice(0, 80)}));
  const nav = document.querySelector('nav.bd-docs-nav') || document.querySelector('.bd-sidebar-primary');
  report.sidebar = nav ? Array.from(nav.querySelectorAll('a.reference')).map(a => ({
    href: a.href, text: a.innerText.trim(), visible: a.getClientRects().length > 0})) : [];
  report.links = Array.from(document.querySelectorAll('a[href]')).map(a => ({href: a.href,
    text: a.innerText.trim().slice(0, 60)})).filter(l => l.href.startsWith(location.origin));
  report.downloads = Array.from(document.querySelectorAll('.dropdown-download-buttons a')).map(a => ({
    href: a.href, text: a.innerText.trim()}));
  // chapter shape: what comes before the first section heading, and what comes last
  const h2s = Array.from(article.querySelectorAll('section section > h2'));
  const first = h2s[0];
  const before = el => !first || (el.compareDocumentPosition(first) & Node.DOCUMENT_POSITION_FOLLOWING);
  const intro = Array.from(article.querySelectorAll('p, div.cell, table, ul, ol')).filter(before);
  report.introText = intro.map(e => e.innerText).join('\n');
  report.introHasParamCell = intro.some(e => e.matches('div.cell.tag_parameters'));
  const cells = Array.from(article.querySelectorAll('div.cell'));
  const last = cells[cells.length - 1];
  report.lastCellText = last ? last.innerText : '';
  report.afterLastCell = last ? Array.from(article.querySelectorAll('h1, h2, h3, h4, figure, img, p, table'))
      .filter(e => !last.contains(e) && (last.compareDocumentPosition(e) & Node.DOCUMENT_POSITION_FOLLOWING))
      .map(e => e.tagName + ': ' + e.innerText.trim().slice(0, 60)) : [];
  return report;
}
run().then(done, e => done({error: String(e)}));
"""


SEARCH_JS = r"""
const done = arguments[arguments.length - 1];
const t0 = Date.now();
(async () => {
  while (Date.now() - t0 < 20000) {
    const links = Array.from(document.querySelectorAll('#search-results ul.search li a'));
    const summary = document.querySelector('#search-results .search-summary, #search-results p');
    const status = (summary || {innerText: ''}).innerText;
    if (links.length || /did not match|found 0|no results|matched no/i.test(status))
      return {links: links.map(a => a.href), status};
    if (/Searching/i.test(status) || !status) { await new Promise(r => setTimeout(r, 100)); continue; }
    await new Promise(r => setTimeout(r, 100));
  }
  return {links: [], status: 'timed out waiting for search results'};
})().then(done, e => done({links: [], status: String(e)}));
"""
