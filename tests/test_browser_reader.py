"""What a reader expects of the book beyond the browser checks (tests/test_browser.py), read from the
chapters' sources and the built site without a browser:

* one palette: every chapter applies the book's theme (``plots.setup()``) and takes its colours and
  colour maps from ``analysis.plots`` (colour-blind-safe ``colorblind`` palette, ``viridis``/``vlag``);
  no chapter picks its own colours (hex codes, named colours, matplotlib/seaborn palettes or maps),
  except neutral black/grey/white for reference lines;
* the external-links page lists every external link of the built book.
"""
from __future__ import annotations

import ast
import html.parser
import re

import pytest

from tests import browser_helpers as bh

CHAPTERS = bh.chapter_docnames()

NEUTRAL = {"k", "black", "grey", "gray", "white", "w", "none", "lightgrey", "lightgray", "darkgrey",
           "darkgray", "dimgray", "dimgrey", "silver", "gainsboro", "whitesmoke"}
COLOUR_KEYWORDS = {"color", "colors", "c", "facecolor", "facecolors", "edgecolor", "edgecolors",
                   "markerfacecolor", "markeredgecolor", "mfc", "mec", "ecolor", "fc", "ec"}
MAP_KEYWORDS = {"cmap", "palette"}
FORBIDDEN_CALLS = {("sns", "color_palette"), ("sns", "set_palette"), ("sns", "set_theme"), ("sns", "set"),
                   ("plt", "get_cmap"), ("plt", "set_cmap"), ("style", "use"), ("sns", "light_palette"),
                   ("sns", "dark_palette"), ("sns", "diverging_palette"), ("sns", "cubehelix_palette"),
                   ("sns", "husl_palette"), ("sns", "hls_palette"), ("sns", "mpl_palette")}
HEX = re.compile(r"^#(?:[0-9a-fA-F]{3}){1,2}(?:[0-9a-fA-F]{2})?$")


def _named_colours() -> set[str]:
    import matplotlib.colors as mcolors

    names = set(mcolors.CSS4_COLORS) | set(mcolors.XKCD_COLORS) | set(mcolors.TABLEAU_COLORS)
    return {n.lower() for n in names} - NEUTRAL


def _is_grey_level(s: str) -> bool:
    try:
        return 0.0 <= float(s) <= 1.0
    except ValueError:
        return False


def _mentions_plots(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "plots"
               for n in ast.walk(node))


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _literal_strings(node: ast.AST) -> list[str]:
    """The strings a value is literally made of (a constant, or one inside a list/tuple/dict/if-else
    literal); not strings used to compute it, such as a column name in ``d["ratio"]``."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [s for e in node.elts for s in _literal_strings(e)]
    if isinstance(node, ast.Dict):
        return [s for v in node.values for s in _literal_strings(v)]
    if isinstance(node, ast.IfExp):
        return _literal_strings(node.body) + _literal_strings(node.orelse)
    return []


def _parse_cell(code: str) -> ast.AST:
    return ast.parse("\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in code.splitlines()))


def names_from_plots(cells: list[str]) -> set[str]:
    """Variables a chapter builds from analysis.plots (``pal = dict(zip(order, plots.PALETTE))``)."""
    out = set()
    for code in cells:
        for node in ast.walk(_parse_cell(code)):
            if isinstance(node, ast.Assign) and _mentions_plots(node.value):
                out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return out


def colour_problems(code: str, named: set[str], from_plots: set[str] = frozenset()) -> list[str]:
    """Where a piece of chapter code chooses its own colours (empty when it uses analysis.plots);
    ``from_plots``: names the chapter assigned from analysis.plots, accepted as palettes/maps."""
    tree = _parse_cell(code)
    out = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            tail = tuple(name.split(".")[-2:])
            if tail in FORBIDDEN_CALLS:
                out.append(f"line {line}: {name}(...) sets a palette/theme of its own; use analysis.plots")
            for kw in node.keywords:
                if kw.arg in MAP_KEYWORDS and not _mentions_plots(kw.value) and not (
                        isinstance(kw.value, ast.Name) and kw.value.id in from_plots):
                    out.append(f"line {line}: {kw.arg}={ast.unparse(kw.value)} is not from analysis.plots "
                               f"(plots.SEQUENTIAL, plots.DIVERGING, plots.PALETTE)")
                if kw.arg in COLOUR_KEYWORDS:
                    for c in _literal_strings(kw.value):
                        if not (c.lower() in NEUTRAL or _is_grey_level(c)):
                            out.append(f"line {line}: {kw.arg}={c!r} is a colour of its own; use "
                                       "plots.PALETTE / plots.FAMILY_COLORS (or black/grey for references)")
        elif isinstance(node, ast.Attribute):
            name = _dotted(node)
            if re.search(r"(^|\.)(cm|colormaps)\.[A-Za-z]", name) or name.endswith(".colormaps"):
                out.append(f"line {line}: {name} picks a matplotlib colour map; "
                           "use plots.SEQUENTIAL/DIVERGING")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            s = node.value.strip()
            if HEX.match(s) or s.lower().startswith(("tab:", "xkcd:")) or s.lower() in named:
                out.append(f"line {line}: the colour {s!r} is not from analysis.plots")
    return sorted(set(out), key=out.index)


def _code_cells(docname: str) -> list[str]:
    import jupytext

    nb = jupytext.read(bh.REPO / f"{docname}.md")
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_colour_rule_catches_own_colours():
    """The checker itself: it must flag a chapter's own colours and accept the book's palette."""
    named = _named_colours()
    bad = ('ax.plot(x, y, color="tab:red")\n'
           'ax.scatter(x, y, c=["red" if v else "k" for v in w] or "blue")\n'
           'ax.bar(x, y, color="#1f77b4")\nsns.heatmap(d, cmap="RdBu")\n'
           'sns.set_palette("husl")\nc = plt.cm.viridis(0.3)\nMODE = {"P": "orange"}\n')
    problems = colour_problems(bad, named)
    assert len(problems) >= 7, problems
    good = ('plots.setup()\nax.plot(x, y, color=plots.PALETTE[0], ls="--")\nax.axhline(1, color="k")\n'
            'sns.heatmap(d, cmap=plots.SEQUENTIAL)\nax.imshow(a, cmap=plots.DIVERGING + "_r")\n'
            'ax.fill_between(x, y, color="grey", alpha=0.1)\nax.scatter(x, y, edgecolors="0.3")\n'
            'ax.scatter(x, y, c=[rc[r] for r in d["ratio"]])\n')
    assert colour_problems(good, named) == []
    cells = ["pal = dict(zip(order, plots.PALETTE * 2))\nmine = ['red', 'blue']",
             "sns.lineplot(d, palette=pal)", "sns.lineplot(d, palette=mine)"]
    from_plots = names_from_plots(cells)
    assert colour_problems(cells[1], named, from_plots) == []
    assert colour_problems(cells[2], named, from_plots), "a palette of the chapter's own passed"


@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_uses_the_books_palette(docname):
    named = _named_colours()
    cells = _code_cells(docname)
    from_plots = names_from_plots(cells)
    problems = []
    for i, src in enumerate(cells):
        problems += [f"code cell {i + 1}, {p}" for p in colour_problems(src, named, from_plots)]
    if not any(re.search(r"\bplots\.setup\(", src) for src in cells):
        problems.append("never calls plots.setup() (the book's theme and colour-blind palette)")
    assert not problems, f"{docname}.md:\n  " + "\n  ".join(problems)


# ------------------------------------------------------------------------------------------ links
class _Links(html.parser.HTMLParser):
    """External hrefs inside <article>, and those inside the external-links table."""

    def __init__(self):
        super().__init__()
        self.article = self.table = 0
        self.hrefs, self.table_hrefs = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "article":
            self.article += 1
        if tag == "table" and "external-links" in (a.get("class") or ""):
            self.table += 1
        if tag == "a" and self.article and (a.get("href") or "").startswith(("http://", "https://")):
            (self.table_hrefs if self.table else self.hrefs).append(a["href"])

    def handle_endtag(self, tag):
        if tag == "article":
            self.article -= 1
        if tag == "table" and self.table:
            self.table -= 1


def _parse(path):
    p = _Links()
    p.feed(path.read_text(encoding="utf-8", errors="replace"))
    return p


def test_links_page_lists_every_external_link():
    site = bh.SITE
    if not (site / "index.html").is_file():
        pytest.skip(f"{site} is absent: build the book first (python -m analysis.build)")
    pages = [d for d in bh.toc_docnames() if d != "book/links"]
    assert "book/links" in bh.toc_docnames(), "_toc.yml does not list book/links (the external links page)"
    used = {}
    for d in pages:
        for h in _parse(site / f"{d}.html").hrefs:
            used.setdefault(h, d)
    listed = set(_parse(site / "book" / "links.html").table_hrefs)
    missing = {u: d for u, d in used.items() if u not in listed}
    stale = listed - set(used)
    assert not missing, f"external links used but not in the links table of book/links.html: {missing}"
    assert not stale, f"links in the table that no page uses: {sorted(stale)}"


# --------------------------------------------------------------------------- time and memory table
def test_appendix_lists_time_and_memory_of_every_chapter():
    """The appendix's measured table (data/chapter_resources.csv) has a row for every chapter of the
    toc: its measured cold/warm time and peak memory, or an explicit 'not measured yet'."""
    site = bh.SITE
    if not (site / "index.html").is_file():
        pytest.skip(f"{site} is absent: build the book first (python -m analysis.build)")
    page = (site / "book" / "appendix_reproduce.html").read_text(encoding="utf-8")
    i = page.find('id="time-and-memory-per-chapter"')
    assert i >= 0, "appendix_reproduce.html has no section 'Time and memory per chapter'"
    section = re.sub(r"<[^>]+>", " ", page[i:])
    rows = {}
    for ch in (d.split("/")[-1] for d in CHAPTERS):
        measured = r"[\d,.]+ s\s+[\d.]+ [kMG]B\s+[\d,.]+ s\s+[\d.]+ [kMG]B"
        m = re.search(rf"{re.escape(ch)}\s+(not measured yet|{measured})", section)
        rows[ch] = m.group(1) if m else None
    missing = [ch for ch, r in rows.items() if r is None]
    assert not missing, ("chapters without a row (time and memory, or 'not measured yet') in the appendix: "
                         f"{missing}")


def test_linkcheck_report_is_recorded_honestly(tmp_path):
    """``make linkcheck``'s recorder (_ext/links_table.py): working/redirected/broken are recorded with
    the date; a link not reached because the machine has no network is not called broken."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("links_table", bh.REPO / "_ext" / "links_table.py")
    lt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lt)
    no_dns = ("HTTPSConnectionPool(host='arxiv.org', port=443): Max retries exceeded with url: /abs/1 "
              "(Caused by "
              "NameResolutionError(\"<urllib3.connection.HTTPSConnection object at 0x7f>: Failed to resolve "
              "'arxiv.org' ([Errno -2] Name or service not known)\"))")
    report = tmp_path / "output.json"
    report.write_text("\n".join(json.dumps(r) for r in [
        {"uri": "https://a.example/ok", "status": "working", "info": ""},
        {"uri": "https://a.example/moved", "status": "redirected", "info": "https://a.example/new"},
        {"uri": "https://a.example/gone", "status": "broken", "info": "404 Client Error: Not Found"},
        {"uri": "https://arxiv.org/abs/1", "status": "broken", "info": no_dns},
        {"uri": "local.html", "status": "unchecked", "info": ""},
    ]) + "\n")
    res = lt.linkcheck_results(report)
    assert set(res) == {"https://a.example/ok", "https://a.example/moved", "https://a.example/gone",
                        "https://arxiv.org/abs/1"}
    assert res["https://a.example/ok"]["result"] == "working"
    assert res["https://a.example/moved"]["result"] == "redirected to https://a.example/new"
    assert res["https://a.example/gone"]["status"] == "broken"
    assert res["https://arxiv.org/abs/1"]["status"] == "unreachable"
    assert all(re.match(r"\d{4}-\d\d-\d\d$", v["checked"]) for v in res.values())
