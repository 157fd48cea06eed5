"""The book's external links in one place: the ``external-links`` directive (used in book/links.md).

While Sphinx reads the pages it records every external link (``http``/``https`` references) of
every page; the directive renders them all as one table: the link, the pages that use it, and the
date it was last checked with its result. Dates and results come from ``book/links_checked.json``,
which ``make linkcheck`` updates (Sphinx's linkcheck builder, then ``python _ext/links_table.py``);
a link never checked says so. The table is made from the pages themselves, so it cannot miss a link.
"""
from __future__ import annotations

import json
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

CHECKED_FILE = "book/links_checked.json"  # relative to the book's root (the Sphinx srcdir)
NOT_CHECKED = ("not checked yet", "—")


class external_links_table(nodes.General, nodes.Element):
    """Placeholder, replaced by the table once every page has been read."""


class ExternalLinksDirective(SphinxDirective):
    has_content = False

    def run(self):
        self.env.note_dependency(str(Path(self.env.srcdir) / CHECKED_FILE))
        return [external_links_table()]


def _resolved_links(app, docname) -> list[str]:
    """External links of a page as the reader gets it: after every transform, so that links made late
    (the bibliography's, by sphinxcontrib-bibtex) count too; those seen while reading are added."""
    urls = list(app.env.__dict__.get("kvbook_links", {}).get(docname, []))
    try:
        tree = app.env.get_and_resolve_doctree(docname, app.builder)
    except Exception:  # a page that cannot be resolved fails the build elsewhere, with its own error
        return urls
    for ref in tree.findall(nodes.reference):
        uri = ref.get("refuri", "")
        if uri.startswith(("http://", "https://")) and uri not in urls:
            urls.append(uri)
    return urls


def _record_links(app, doctree):
    env = app.env
    store = env.__dict__.setdefault("kvbook_links", {})
    urls = []
    for ref in doctree.findall(nodes.reference):
        uri = ref.get("refuri", "")
        if uri.startswith(("http://", "https://")) and uri not in urls:
            urls.append(uri)
    store[env.docname] = urls


def _purge(app, env, docname):
    env.__dict__.setdefault("kvbook_links", {}).pop(docname, None)


def _merge(app, env, docnames, other):
    env.__dict__.setdefault("kvbook_links", {}).update(
        {d: v for d, v in getattr(other, "kvbook_links", {}).items() if d in docnames})


def _env_updated(app, env):
    # the links page depends on every other page: re-render it on every build
    return [d for d in env.found_docs if _has_directive(env, d)]


def _has_directive(env, docname) -> bool:
    try:
        return ".. external-links::" in Path(env.doc2path(docname)).read_text(encoding="utf-8") or \
            "{external-links}" in Path(env.doc2path(docname)).read_text(encoding="utf-8")
    except OSError:
        return False


def checked_status(srcdir) -> dict:
    f = Path(srcdir) / CHECKED_FILE
    if not f.is_file():
        return {}
    return json.loads(f.read_text(encoding="utf-8"))


def _cell(*children):
    entry = nodes.entry()
    para = nodes.paragraph()
    for c in children:
        para += c
    entry += para
    return entry


def _resolve(app, doctree, fromdocname):
    placeholders = list(doctree.findall(external_links_table))
    if not placeholders:
        return
    env = app.env
    links: dict[str, list[str]] = {}
    for docname in sorted(env.found_docs):
        if docname == fromdocname:
            continue
        for url in _resolved_links(app, docname):
            links.setdefault(url, []).append(docname)
    status = checked_status(env.srcdir)

    table = nodes.table(classes=["external-links", "colwidths-given"])
    tgroup = nodes.tgroup(cols=4)
    table += tgroup
    for width in (40, 30, 14, 16):
        tgroup += nodes.colspec(colwidth=width)
    thead, tbody = nodes.thead(), nodes.tbody()
    tgroup += thead
    tgroup += tbody
    head = nodes.row()
    for h in ("link", "used in", "last checked", "result"):
        head += _cell(nodes.Text(h))
    thead += head
    for url in sorted(links):
        row = nodes.row()
        row += _cell(nodes.reference(url, url, refuri=url))
        used = []
        for i, d in enumerate(links[url]):
            if i:
                used.append(nodes.Text(", "))
            title = env.titles[d].astext() if d in env.titles else d
            if len(title) > 40:
                title = title[:38].rsplit(" ", 1)[0] + " …"
            used.append(nodes.reference(title, title, internal=True,
                                        refuri=app.builder.get_relative_uri(fromdocname, d)))
        row += _cell(*used)
        s = status.get(url) or {}
        row += _cell(nodes.Text(s.get("checked", NOT_CHECKED[0])))
        row += _cell(nodes.Text(s.get("result", NOT_CHECKED[1])))
        tbody += row
    for ph in placeholders:
        if links:
            ph.replace_self(table.deepcopy())
        else:
            ph.replace_self(nodes.paragraph(text="This book links to no other site."))


STATIC = Path(__file__).resolve().parent / "static"


def _add_static(app, config):
    if str(STATIC) not in [str(p) for p in config.html_static_path]:
        config.html_static_path.append(str(STATIC))


def setup(app):
    app.connect("config-inited", _add_static)
    app.add_css_file("kvbook.css")
    app.add_node(external_links_table)
    app.add_directive("external-links", ExternalLinksDirective)
    app.connect("doctree-read", _record_links)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-updated", _env_updated)
    app.connect("doctree-resolved", _resolve)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
