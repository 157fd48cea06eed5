"""Small Sphinx extension for the rendered book (registered in ``_config.yml``, ``local_extensions``).

1. **A notebook download for every notebook page.** sphinx-book-theme's download menu offers the
   page's source (``.md``) and, when a page sets ``ipynb_source``, an ``.ipynb``. MyST-NB does not set
   it for jupytext chapters, so this extension converts each notebook page's source with jupytext
   into ``_sources/<docname>.ipynb`` of the HTML output and points the menu at it. The notebook is
   the chapter without outputs (what a reader reruns), with the chapter's kernelspec.
2. **No duplicated inline scripts.** sphinx-thebe and sphinx-togglebutton register their inline
   configuration scripts once per read, so a full build emits them twice and the browser throws
   ``Identifier 'THEBE_JS_URL' has already been declared``. Identical scripts are kept once.
3. **A valid colour mode.** Without ``default_mode`` pydata-sphinx-theme starts from mode ``""`` and
   logs a console error on every first visit; the book starts in light mode (prints well).
4. **MathJax served with the book.** Sphinx loads MathJax 3 from a CDN, so offline (and in CI) every
   formula stays raw TeX and the request fails. When the pinned ``django-static-mathjax`` package
   (MathJax 3.2.2, Apache-2.0; a plain copy of MathJax, no Django needed) is installed, the MathJax
   files the book needs are copied to ``_static/mathjax/`` and ``mathjax_path`` points there.
5. **Plotly served once.** Chapter 5's interactive map (``analysis.compose.figures.interactive_map_html``
   with ``plotly_js="book"``) loads ``_static/plotly.min.js`` instead of inlining 4.6 MB into the page;
   the file is written here from the pinned ``plotly`` package at build time (not committed).
6. **Interactive tables.** ``_static/kvbook-tables.js`` (``_ext/static``, a few KB, no library) makes the
   long and wide tables of ``analysis.tables.show`` and the claims ledger sortable, filterable and
   paginated, offline.
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

IPYNB_DIR = "_sources"


def _is_notebook_source(path: Path) -> bool:
    """A jupytext MyST notebook: front matter with a kernelspec (how MyST-NB decides, too)."""
    if path.suffix == ".ipynb":
        return True
    if path.suffix != ".md":
        return False
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---"):
        return False
    front = text.split("---", 2)[1]
    return "kernelspec:" in front


def _write_ipynb(src: Path, out: Path) -> None:
    import jupytext

    nb = jupytext.read(src)
    nb.metadata.pop("jupytext", None)  # a plain notebook: not paired with anything on the reader's disk
    out.parent.mkdir(parents=True, exist_ok=True)
    jupytext.write(nb, out, fmt="ipynb")


def _dedupe_scripts(context) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for s in scripts:
        attrs = getattr(s, "attributes", {}) or {}
        key = (str(getattr(s, "filename", s) or ""), tuple(sorted((k, str(v)) for k, v in attrs.items())))
        if key in seen:
            continue
        seen.add(key)
        kept.append(s)
    scripts[:] = kept  # in place: the builder's list, which later handlers still append to


def on_page_context_late(app, pagename, templatename, context, doctree):
    _dedupe_scripts(context)


def on_page_context(app, pagename, templatename, context, doctree):
    if not context.get("default_mode"):
        context["default_mode"] = "light"
    if app.builder.format != "html" or doctree is None or pagename not in app.env.all_docs:
        return
    src = Path(app.env.doc2path(pagename))
    if not _is_notebook_source(src):
        return
    rel = f"{pagename}.ipynb"
    if src.suffix != ".ipynb":
        _write_ipynb(src, Path(app.outdir) / IPYNB_DIR / rel)
    context["ipynb_source"] = rel


MATHJAX_ENTRY = "tex-mml-chtml.js"  # the combined component Sphinx uses from the CDN by default
MATHJAX_PARTS = (MATHJAX_ENTRY, "input", "output/chtml", "output/chtml.js", "ui", "a11y", "sre", "adaptors")


def mathjax_es5_dir() -> Path | None:
    """MathJax's ``es5`` folder from the installed ``django-static-mathjax`` package, if any."""
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "static" / "mathjax" / "es5"
        if (d / MATHJAX_ENTRY).is_file():
            return d
    return None


STATIC = Path(__file__).resolve().parent / "static"  # kvbook.css, kvbook-tables.js (kvbook_links adds it too)


def on_config_inited(app, config):
    if str(STATIC) not in [str(p) for p in config.html_static_path]:
        config.html_static_path.append(str(STATIC))
    if mathjax_es5_dir() is not None and "://" in (config.mathjax_path or "https://"):
        config.mathjax_path = f"mathjax/{MATHJAX_ENTRY}"


PLOTLY_JS = "plotly.min.js"  # the name analysis.compose.figures.interactive_map_html loads


def write_plotly_js(outdir: Path) -> Path | None:
    """``_static/plotly.min.js`` of the HTML output from the installed (pinned) ``plotly`` package."""
    if importlib.util.find_spec("plotly") is None:
        return None
    from plotly.offline import get_plotlyjs  # optional heavy dependency

    dest = Path(outdir) / "_static" / PLOTLY_JS
    dest.parent.mkdir(parents=True, exist_ok=True)
    js = get_plotlyjs()
    if not dest.is_file() or dest.read_text(encoding="utf-8") != js:
        dest.write_text(js, encoding="utf-8")
    return dest


def on_builder_inited(app):
    if app.builder.format == "html":
        write_plotly_js(Path(app.outdir))
    src = mathjax_es5_dir()
    if src is None or app.builder.format != "html":
        return
    dest = Path(app.outdir) / "_static" / "mathjax"
    for part in MATHJAX_PARTS:
        p = src / part
        if p.is_dir():
            shutil.copytree(p, dest / part, dirs_exist_ok=True)
        elif p.is_file():
            (dest / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest / part)
    lic = src.parent / "LICENSE"
    if lic.is_file():
        shutil.copy2(lic, dest / "LICENSE")


def setup(app):
    app.connect("config-inited", on_config_inited)
    app.connect("builder-inited", on_builder_inited)
    # before sphinx-book-theme's header buttons (priority 501), which read ipynb_source
    app.connect("html-page-context", on_page_context, priority=400)
    app.connect("html-page-context", on_page_context_late, priority=900)  # after every script is added
    app.add_js_file("kvbook-tables.js", loading_method="defer")  # from STATIC
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
