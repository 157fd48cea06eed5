"""Pages executed in parallel before Sphinx (analysis.execute): cached exactly as myst-nb would cache
them, failures returned and not cached, and a Sphinx build afterwards executes nothing."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import execute

PAGE = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# {title}

:::{{note}}
A colon fence, as the book's pages use.
:::

```{{code-cell}} ipython3
:tags: [hide-input]

{code}
```
"""


def _book(root: Path, pages: dict[str, str]) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "_config.yml").write_text(
        "title: t\nexecute:\n  execute_notebooks: cache\n  cache: _build/.jupyter_cache\n  timeout: 60\n"
        "parse:\n  myst_enable_extensions: [colon_fence, dollarmath]\n")
    names = list(pages)
    (root / "_toc.yml").write_text("format: jb-book\nroot: " + names[0] + "\nchapters:\n"
                                   + "".join(f"- file: {n}\n" for n in names[1:]))
    out = []
    for name, code in pages.items():
        p = root / f"{name}.md"
        p.write_text(PAGE.format(title=name, code=code))
        out.append(p)
    return out


def test_pages_are_cached_and_failures_are_not(tmp_path):
    root = tmp_path / "book"
    ok, bad, cwd = _book(root, {"ok": "x = 6 * 7\nprint(x)", "bad": "raise ValueError('broken page')",
                                "cwd": "import os\nprint(os.getcwd())"})
    jcache = root / "_build" / ".jupyter_cache"
    assert execute.pending([ok, bad, cwd], jcache, root) == [ok, bad, cwd]
    failed = execute.preexecute([ok, bad, cwd], jcache, jobs=2, root=root, log=lambda *a: None)
    assert list(failed) == [str(bad.resolve())]
    assert "broken page" in failed[str(bad.resolve())]
    # the pages that ran are now found by the cache lookup that myst-nb makes; the failed one is not
    assert execute.pending([ok, bad, cwd], jcache, root) == [bad]
    from jupyter_cache import get_cache

    cache = get_cache(str(jcache))
    _, nb = cache.merge_match_into_notebook(execute.read_page(ok, root))
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any("42" in o.get("text", "") for o in outputs)
    _, nb = cache.merge_match_into_notebook(execute.read_page(cwd, root))
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert text.strip() == str(root.resolve())  # run in the page's folder, as run_in_temp: false does
    # nothing left to do: a second call executes nothing
    assert execute.preexecute([ok, cwd], jcache, jobs=2, root=root, log=lambda *a: None) == {}


def test_each_executed_page_records_the_files_it_read(tmp_path):
    root = tmp_path / "book"
    read = "from analysis import data\n_ = data.registry()"
    reader, quiet, bad = _book(root, {"reader": read, "quiet": "x = 1", "bad": read + "\n1/0"})
    jcache, reads = root / "_build" / ".jupyter_cache", root / "_build" / "reads"
    failed = execute.preexecute([reader, quiet, bad], jcache, jobs=2, root=root, log=lambda *a: None,
                                reads_dir=reads, keys={"reader": "k1", "quiet": "k2"})
    assert list(failed) == [str(bad.resolve())]
    rec = json.loads(execute.reads_file(reads, reader).read_text())
    assert rec == {"page": "reader", "key": "k1", "reads": ["data/registry.yaml"]}
    assert json.loads(execute.reads_file(reads, quiet).read_text())["reads"] == []
    assert not execute.reads_file(reads, bad).exists()  # a failed page leaves no record
    assert sorted(p.name for p in reads.iterdir()) == ["quiet.json", "reader.json"]  # no temporary logs


def test_a_changed_code_cell_is_pending_again(tmp_path):
    root = tmp_path / "book"
    (page,) = _book(root, {"p": "y = 1"})
    jcache = root / "_build" / ".jupyter_cache"
    execute.preexecute([page], jcache, jobs=1, root=root, log=lambda *a: None)
    assert execute.pending([page], jcache, root) == []
    page.write_text(page.read_text().replace("y = 1", "y = 2"))
    assert execute.pending([page], jcache, root) == [page]


def test_bad_job_counts_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="at least 1"):
        execute.preexecute([], tmp_path / "c", jobs=0)
    monkeypatch.setenv("KVBOOK_BUILD_JOBS", "two")
    with pytest.raises(ValueError, match="whole number"):
        execute.default_jobs()
    monkeypatch.setenv("KVBOOK_BUILD_JOBS", "3")
    assert execute.default_jobs() == 3


@pytest.mark.slow
def test_sphinx_reads_the_preexecuted_pages_without_executing(tmp_path):
    """End to end: after preexecute, jupyter-book's own cache lookup finds every page (no execution)."""
    root = tmp_path / "book"
    pages = _book(root, {"intro": "print('front page')", "ch": "import time\nprint(sum(range(10)))"})
    jcache = root / "_build" / ".jupyter_cache"
    assert execute.preexecute(pages, jcache, jobs=2, root=root, log=lambda *a: None) == {}
    jb = Path(sys.executable).with_name("jupyter-book")
    r = subprocess.run([str(jb), "build", str(root), "-v"], capture_output=True, text=True, cwd=root)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    assert "Executing notebook" not in log, log[-3000:]
    assert log.count("Using cached notebook") == 2, log[-3000:]
    html = (root / "_build" / "html" / "ch.html").read_text()
    assert "45" in html
